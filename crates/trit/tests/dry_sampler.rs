//! The DRY repetition penalty against llama.cpp's sampler (tests/fixtures/sampling/dry.json,
//! tools/ref_dry.py): on the default model's vocabulary, for each history and set of sequence
//! breakers (strings, which each side turns into token sequences itself), the same tokens are
//! penalized by the same amounts.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use trit::sample::{Breakers, Dry};
use trit::tokenizer::Tokenizer;

#[test]
fn dry_penalties_are_llama_cpps() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("tests/fixtures/sampling/dry.json"))
            .unwrap(),
    )
    .unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    let mut penalized = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let history: Vec<u32> = case["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            tok.encode(text, false).unwrap(),
            history,
            "tokenization of {text:?}"
        );
        let strings: Vec<String> = case["breakers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect();
        let dry = Dry {
            multiplier: case["multiplier"].as_f64().unwrap() as f32,
            base: case["base"].as_f64().unwrap() as f32,
            allowed_length: case["allowed_length"].as_u64().unwrap() as usize,
            last_n: case["last_n"].as_u64().unwrap() as usize,
            breakers: Arc::new(Breakers::new(&tok, &strings)),
        };
        let mut logits = vec![0.0f32; tok.vocab_size()];
        dry.apply(&mut logits, &history);
        let got: BTreeMap<u32, f32> = logits
            .iter()
            .enumerate()
            .filter(|(_, &l)| l != 0.0)
            .map(|(i, &l)| (i as u32, -l))
            .collect();
        let want: BTreeMap<u32, f32> = case["penalties"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap() as f32))
            .collect();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{text:?}"
        );
        for (t, w) in &want {
            assert!(
                (got[t] - w).abs() <= 1e-4 * w.max(1.0),
                "{text:?}: token {t} {} vs {w}",
                got[t]
            );
        }
        penalized += want.len();
    }
    assert!(penalized >= 10, "the fixture penalizes {penalized} tokens");
}
