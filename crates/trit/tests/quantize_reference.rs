//! `trit convert --quantize` against the numpy reference of the absmean rule
//! (tests/fixtures/quantize/reference.json, written by tools/ref_quantize.py): same scales bit
//! for bit, same codes (CRC-32), same relative error, for groups of 128 (PQ2_0, MLX) and 256
//! (TQ2_0); a fused LoRA adapter moves the result towards W + ΔW; the output runs in trit.

mod common;
mod convert_support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trit::convert::quantize::{quantize, QuantizeOptions};
use trit::convert::{ConvertReport, Target, TernaryMatrix};
use trit::engine::Session;
use trit::model::lora::LoraAdapter;
use trit::model::Model;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The weight generator of tools/ref_quantize.py, bit for bit.
fn weight(tensor: u64, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| {
            let u = mix64((tensor << 32) | i as u64).wrapping_add(GOLDEN);
            let m = (u >> 40) as i64 - (1 << 23);
            let e = 30 + (i / cols % 4) as i32 - if u & 255 < 3 { 3 } else { 0 };
            (m as f64 * 2f64.powi(-e)) as f32
        })
        .collect()
}

fn fixture() -> Value {
    let p = common::repo_root().join("tests/fixtures/quantize/reference.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The fixture's full-precision model as a Hugging Face folder (F32 safetensors).
fn full_precision_model(dir: &Path, fx: &Value) -> PathBuf {
    let out = dir.join("fp32");
    std::fs::create_dir_all(&out).unwrap();
    let mut tensors = Vec::new();
    for (k, (name, t)) in fx["tensors"].as_object().unwrap().iter().enumerate() {
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let w = weight(k as u64, shape[0], shape[1]);
        let first4: Vec<f32> = t["w_first4"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(&w[..4], &first4[..], "{name}: generator differs from numpy");
        tensors.push((name.clone(), shape, w));
    }
    for (name, n) in [
        ("model.layers.0.input_layernorm.weight", 256),
        ("model.layers.0.post_attention_layernorm.weight", 256),
        ("model.layers.0.self_attn.q_norm.weight", 64),
        ("model.layers.0.self_attn.k_norm.weight", 64),
        ("model.norm.weight", 256),
    ] {
        tensors.push((name.to_string(), vec![n], vec![1.0; n]));
    }
    common::write_f32_safetensors(&out.join("model.safetensors"), &tensors);
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
        "num_hidden_layers": 1, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 512,
        "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true, "bos_token_id": 258, "eos_token_id": 259,
        "torch_dtype": "float32"
    });
    std::fs::write(out.join("config.json"), config.to_string()).unwrap();
    let tok = convert_support::small_tokenizer(dir);
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), out.join(f)).unwrap();
    }
    out
}

fn run(input: &Path, output: &Path, target: &str, adapter: Option<&LoraAdapter>) -> ConvertReport {
    let opts = QuantizeOptions {
        target: Target::parse(target).unwrap(),
        group: 128,
    };
    quantize(input, output, &opts, adapter, &mut |_, _, _| {}).unwrap()
}

/// The ternary tensors of a converted model, by canonical name.
fn ternary_tensors(path: &Path) -> BTreeMap<String, TernaryMatrix> {
    let files = trit::format::open(path).unwrap();
    let mut out = BTreeMap::new();
    for name in files.weights.tensor_names() {
        let view = files.weights.require(&name).unwrap();
        if let Some(m) = TernaryMatrix::read_packed(&view).unwrap() {
            out.insert(name, m);
        }
    }
    out
}

fn canonical(hf: &str) -> String {
    let module = hf.strip_suffix(".weight").unwrap();
    format!("{}.weight", trit::format::hf_to_canonical(module).unwrap())
}

fn check_against_numpy(m: &TernaryMatrix, want: &Value, name: &str, group: usize) {
    let per = group / 64;
    let scales: Vec<u64> = m
        .scales64
        .iter()
        .step_by(per)
        .map(|s| half::f16::from_f32(*s).to_bits() as u64)
        .collect();
    let want_scales: Vec<u64> = want["scales_f16_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(scales, want_scales, "{name} g{group}: scales");
    let counts: Vec<u64> = (0..3)
        .map(|c| m.codes.iter().filter(|&&q| q == c).count() as u64)
        .collect();
    let want_counts: Vec<u64> = want["code_counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(counts, want_counts, "{name} g{group}: code counts");
    assert_eq!(
        crc32fast::hash(&m.codes) as u64,
        want["codes_crc32"].as_u64().unwrap(),
        "{name} g{group}: codes"
    );
}

#[test]
fn codes_and_scales_match_the_numpy_reference() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = full_precision_model(dir.path(), &fx);
    for (target, group) in [("gguf-pq2", 128), ("mlx", 128), ("gguf-tq2", 256)] {
        let out = dir.path().join(format!("q-{target}"));
        let report = run(&model, &out, target, None);
        let got = ternary_tensors(&out);
        let mut checked = 0;
        for (hf, t) in fx["tensors"].as_object().unwrap() {
            let name = canonical(hf);
            let Some(want) = t.get(format!("g{group}")) else {
                // The embedding keeps its precision.
                assert!(!got.contains_key(&name), "{name} was ternarized");
                continue;
            };
            check_against_numpy(&got[&name], want, &name, group);
            let r = report.tensors.iter().find(|r| r.name == name).unwrap();
            let e = r.error.as_ref().unwrap();
            let want_rel = want["rel_fro"].as_f64().unwrap();
            assert!(
                (e.rel_fro - want_rel).abs() < 1e-9,
                "{name}: {} vs {want_rel}",
                e.rel_fro
            );
            checked += 1;
        }
        assert_eq!(checked, 7, "{target}");
        // The quantized model runs.
        let files = trit::format::open(&out).unwrap();
        let m = Arc::new(Model::load(&files, 2).unwrap());
        let logits = Session::new(m, 16).prefill(&[260, 72, 101, 259]).unwrap();
        assert!(logits.iter().all(|x| x.is_finite()) && logits.len() == 512);
    }
}

/// A PEFT adapter on q_proj and down_proj of the fixture model with `b` as every B entry.
fn peft_adapter(dir: &Path, b_value: impl Fn(usize) -> f32) -> PathBuf {
    let out = dir.join("adapter");
    std::fs::create_dir_all(&out).unwrap();
    let mut tensors = Vec::new();
    for module in ["self_attn.q_proj", "mlp.down_proj"] {
        let stem = format!("base_model.model.model.layers.0.{module}");
        let a = weight(100, 2, 256).iter().map(|x| x * 1e3).collect();
        tensors.push((format!("{stem}.lora_A.weight"), vec![2, 256], a));
        tensors.push((
            format!("{stem}.lora_B.weight"),
            vec![256, 2],
            (0..512).map(&b_value).collect(),
        ));
    }
    common::write_f32_safetensors(&out.join("adapter_model.safetensors"), &tensors);
    let cfg = json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "down_proj"]});
    std::fs::write(out.join("adapter_config.json"), cfg.to_string()).unwrap();
    out
}

#[test]
fn a_fused_adapter_moves_the_quantized_weights_towards_w_plus_delta() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let model = full_precision_model(dir.path(), &fx);
    let plain = ternary_tensors(&{
        let p = dir.path().join("plain.gguf");
        run(&model, &p, "gguf-pq2", None);
        p
    });
    // B = 0: the adapter is a no-op.
    let zero = LoraAdapter::load(&peft_adapter(&dir.path().join("z"), |_| 0.0)).unwrap();
    let p = dir.path().join("zero.gguf");
    run(&model, &p, "gguf-pq2", Some(&zero));
    assert_eq!(ternary_tensors(&p), plain);

    let adapter = LoraAdapter::load(&peft_adapter(&dir.path().join("a"), |i| {
        if i % 3 == 0 {
            0.004
        } else {
            -0.002
        }
    }))
    .unwrap();
    let p = dir.path().join("fused.gguf");
    run(&model, &p, "gguf-pq2", Some(&adapter));
    let fused = ternary_tensors(&p);
    for (k, (hf, t)) in fx["tensors"].as_object().unwrap().iter().enumerate() {
        let name = canonical(hf);
        let Some(m) = fused.get(&name) else { continue };
        let Some(delta) = adapter.delta(&name) else {
            assert_eq!(m, &plain[&name], "{name}: not adapted, must not change");
            continue;
        };
        assert_ne!(m, &plain[&name], "{name}");
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let w = weight(k as u64, shape[0], shape[1]);
        let target: Vec<f32> = w.iter().zip(&delta).map(|(a, b)| a + b).collect();
        let dist = |q: &TernaryMatrix| -> f64 {
            q.dequantize()
                .iter()
                .zip(&target)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum()
        };
        assert!(dist(m) < dist(&plain[&name]), "{name}");
    }
}

#[test]
fn quantize_refuses_what_it_can_not_take() {
    let dir = tempfile::tempdir().unwrap();
    let p = trit::format::testgen::Preset::by_name("tiny").unwrap();
    let p = trit::format::testgen::Preset { vocab: 512, ..p };
    trit::format::testgen::generate(
        &p,
        0,
        dir.path(),
        &[trit::format::testgen::OutFormat::Mlx],
        &trit::format::testgen::TokenizerAssets::Placeholder,
    )
    .unwrap();
    let opts = QuantizeOptions {
        target: Target::Mlx,
        group: 128,
    };
    let msg = quantize(
        &dir.path().join("mlx"),
        &dir.path().join("o"),
        &opts,
        None,
        &mut |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("already quantized"), "{msg}");
    let fx = fixture();
    let model = full_precision_model(dir.path(), &fx);
    let opts = QuantizeOptions {
        target: Target::Mlx,
        group: 320,
    };
    let msg = quantize(
        &model,
        &dir.path().join("o2"),
        &opts,
        None,
        &mut |_, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("320"), "{msg}");
}
