//! Top-n-σ, locally typical sampling and XTC against llama.cpp's samplers
//! (tests/fixtures/sampling/truncation.json, tools/ref_truncation.py): on seeded logits rows
//! (flat to peaked), alone and chained with top-k, top-p and min-p in llama.cpp's order, the
//! same tokens are kept.

mod common;

use serde_json::Value;
use trit::sample::{DynamicTemperature, Mirostat, Penalties, Sampler, SamplingParams, Truncation};

#[test]
fn the_same_tokens_are_kept_as_by_llama_cpp() {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::repo_root().join("tests/fixtures/sampling/truncation.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let rows: Vec<Vec<f32>> = fixture["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let mut checked = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let c = &case["chain"];
        let get = |k: &str, off: f64| c.get(k).and_then(Value::as_f64).unwrap_or(off) as f32;
        let params = SamplingParams {
            temperature: 1.0,
            top_k: c.get("top_k").and_then(Value::as_u64).unwrap_or(0) as usize,
            top_p: get("top_p", 1.0),
            min_p: get("min_p", 0.0),
            penalties: Penalties::default(),
            seed: 3,
            logit_bias: Vec::new(),
            dry: None,
            mirostat: None,
            dynatemp: None,
            truncation: Truncation {
                top_n_sigma: get("top_n_sigma", -1.0),
                typical_p: get("typical_p", 1.0),
                xtc_probability: get("xtc_probability", 0.0),
                xtc_threshold: get("xtc_threshold", 0.1),
            },
        };
        let mut sampler = Sampler::new(params).unwrap();
        let mut row = rows[case["row"].as_u64().unwrap() as usize].clone();
        let mut kept: Vec<u32> = sampler.kept(&mut row).iter().map(|c| c.0).collect();
        kept.sort_unstable();
        let want: Vec<u32> = case["kept"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(kept, want, "{c} on row {}", case["row"]);
        checked += 1;
    }
    assert_eq!(checked, 32);

    // Dynamic temperature: the probabilities of the kept tokens.
    let mut compared = 0;
    for case in fixture["dynatemp"].as_array().unwrap() {
        let want = case["probs"].as_object().unwrap();
        if want.len() < 2 {
            continue; // llama.cpp leaves a lone candidate's stale probability
        }
        let c = &case["chain"];
        let f = |k: &str| c[k].as_f64().unwrap() as f32;
        let params = SamplingParams {
            temperature: f("temp"),
            top_k: c["top_k"].as_u64().unwrap() as usize,
            top_p: c.get("top_p").and_then(Value::as_f64).unwrap_or(1.0) as f32,
            min_p: 0.0,
            dynatemp: Some(DynamicTemperature {
                range: f("range"),
                exponent: f("exponent"),
            }),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params).unwrap();
        let mut row = rows[case["row"].as_u64().unwrap() as usize].clone();
        let kept = sampler.kept(&mut row);
        let probs = sampler.distribution(&kept);
        assert_eq!(kept.len(), want.len(), "{c}");
        for ((id, _), p) in kept.iter().zip(probs) {
            let w = want[&id.to_string()].as_f64().unwrap();
            assert!((p - w).abs() < 1e-5, "{c}: token {id} {p} vs {w}");
        }
        compared += 1;
    }
    assert!(compared >= 5, "{compared}");

    // Mirostat: the tokens kept at the first step (target 2τ), and at the second after the
    // target moved by the surprise of the token llama.cpp drew at the first.
    let mut steps = 0;
    for case in fixture["mirostat"].as_array().unwrap() {
        let c = &case["params"];
        let f = |k: &str| c[k].as_f64().unwrap() as f32;
        let m = Mirostat {
            version: c["version"].as_u64().unwrap() as u8,
            tau: f("tau"),
            eta: f("eta"),
        };
        let mut mu = 2.0 * m.tau;
        for (step, want) in case["steps"].as_array().unwrap().iter().enumerate() {
            let row = &rows[case["rows"][step].as_u64().unwrap() as usize];
            let mut cand: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l / f("temp")))
                .collect();
            cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            m.keep(&mut cand, mu, row.len());
            let mut kept: Vec<u32> = cand.iter().map(|c| c.0).collect();
            kept.sort_unstable();
            let ids: Vec<u32> = want["kept"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(kept, ids, "{c} step {step}");
            // The drawn token's probability among the kept ones moves the target.
            let drawn = want["drawn"].as_u64().unwrap() as u32;
            let max = cand[0].1;
            let z: f32 = cand.iter().map(|c| (c.1 - max).exp()).sum();
            let at = cand
                .iter()
                .position(|c| c.0 == drawn)
                .expect("drawn among the kept");
            mu = m.update(mu, (cand[at].1 - max).exp() / z);
            steps += 1;
        }
    }
    assert_eq!(steps, 24);
}
