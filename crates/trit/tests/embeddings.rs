//! Embeddings (`engine::embed`, `Model::hidden_states`) of the default model against
//! llama.cpp's (`tools/ref_embeddings.py`: llama-cpp-python 0.3.36, `embedding=True`, each
//! pooling type, L2-normalized), on the token ids llama.cpp read. Both run int8 activations
//! (their own blocks), so the bound is a cosine (0.9997–0.9999 measured); the pooling kinds and texts are far apart
//! (cosines 0.25–0.69 between them in the fixture), so a wrong row, norm or pooling fails.

mod common;
use common::*;
use serde_json::Value;
use trit::engine::{embed, Pooling};
use trit::model::{Logits, Model};

fn fixture() -> Value {
    let path = repo_root().join("tests/fixtures/embeddings/default_model.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(entry: &Value) -> Vec<u32> {
    entry["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn pooled_hidden_states_match_llama_cpps_embeddings() {
    let model = Model::load(&default_model_files(), 2).unwrap();
    let fx = fixture();
    for entry in fx["texts"].as_array().unwrap() {
        let toks = ids(entry);
        for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
            let got = embed(&model, &toks, pooling).unwrap();
            let want = floats(&entry[pooling.name()]);
            assert_eq!(got.len(), want.len());
            let norm: f64 = got.iter().map(|&x| x as f64 * x as f64).sum();
            assert!((norm - 1.0).abs() < 1e-5, "not unit length: {norm}");
            let c = cosine(&got, &want);
            eprintln!("{} tokens, {}: cosine {c:.5}", toks.len(), pooling.name());
            assert!(
                c > 0.999,
                "{:?} {}: cosine {c}",
                entry["text"],
                pooling.name()
            );
        }
    }
}

/// The hidden states are the head's input: the last row through the tied head gives the
/// logits `forward` returns, and every row of `Logits::All` is the row of a shorter run.
#[test]
fn hidden_states_are_what_the_head_reads() {
    let files = default_model_files();
    let model = Model::load(&files, 2).unwrap();
    let toks = ids(&fixture()["texts"][0]);
    let d = model.config().hidden;
    let all = model
        .hidden_states(&toks, &mut model.new_cache(toks.len()), Logits::All)
        .unwrap();
    assert_eq!(all.len(), toks.len() * d);
    let last = model
        .hidden_states(&toks, &mut model.new_cache(toks.len()), Logits::Last)
        .unwrap();
    assert_eq!(last, all[(toks.len() - 1) * d..]);
    let first = model
        .hidden_states(&toks[..1], &mut model.new_cache(1), Logits::Last)
        .unwrap();
    assert!(max_abs_diff(&first, &all[..d]) < 1e-4);
    // Through the tied embedding (the default model's head) in f64: the forward's logits.
    let logits = model
        .forward(&toks, &mut model.new_cache(toks.len()), Logits::Last)
        .unwrap();
    let head = trit::model::weights::linear(
        files.weights.as_ref(),
        "token_embd.weight",
        model.config().vocab,
        d,
    )
    .unwrap();
    let mut row = vec![0f32; d];
    let mut through = Vec::with_capacity(model.config().vocab);
    for r in 0..model.config().vocab {
        head.dequantize_row(r, &mut row);
        through.push(row.iter().zip(&last).map(|(a, b)| a * b).sum::<f32>());
    }
    // The forward quantizes the head's input to int8; the exact product is that close.
    let c = cosine(&through, &logits);
    assert!(c > 0.999, "cosine {c}");
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b]));
    assert_eq!(argmax(&through), argmax(&logits));
}

#[test]
fn empty_input_and_unknown_pooling_are_refused() {
    let model = Model::load(&default_model_files(), 1).unwrap();
    assert!(embed(&model, &[], Pooling::Mean).is_err());
    assert!(Pooling::parse("max").is_err());
    assert_eq!(Pooling::parse("last").unwrap(), Pooling::Last);
}

/// A Qwen3.5 hybrid's hidden states (DeltaNet + gated attention layers) are its head's input
/// too: the last row through the head gives `forward`'s logits, `Last` is `All`'s last row.
#[test]
fn a_hybrids_hidden_states_are_what_its_head_reads() {
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-qwen35").unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    generate(&p, 4, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    let model = Model::load(&files, 2).unwrap();
    let (d, vocab) = (model.config().hidden, model.config().vocab);
    let toks: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let all = model
        .hidden_states(&toks, &mut model.new_cache(16), Logits::All)
        .unwrap();
    let last = model
        .hidden_states(&toks, &mut model.new_cache(16), Logits::Last)
        .unwrap();
    assert_eq!(all.len(), toks.len() * d);
    assert!(max_abs_diff(&last, &all[(toks.len() - 1) * d..]) < 1e-5);
    let logits = model
        .forward(&toks, &mut model.new_cache(16), Logits::Last)
        .unwrap();
    let name = if files.config.tied_embeddings {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let head = trit::model::weights::linear(files.weights.as_ref(), name, vocab, d).unwrap();
    let mut row = vec![0f32; d];
    let through: Vec<f32> = (0..vocab)
        .map(|r| {
            head.dequantize_row(r, &mut row);
            row.iter().zip(&last).map(|(a, b)| a * b).sum()
        })
        .collect();
    let c = cosine(&through, &logits);
    assert!(c > 0.999, "cosine {c}");
}
