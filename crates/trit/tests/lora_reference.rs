//! LoRA adapters against mlx-lm: the random `tiny` model with the random mlx-lm adapter in
//! `tests/fixtures/lora/mlx_adapter` (written by tools/ref_lora.py, which also recorded mlx-lm's
//! logits with the adapter loaded), the same adapter rewritten in PEFT's layout (plain and
//! rsLoRA scaling), and the errors for adapters that do not fit.

mod common;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trit::engine::Session;
use trit::format::safetensors::SafetensorsFile;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::format::Dtype;
use trit::kernels::{best_level, set_level, KernelLevel};
use trit::model::lora::LoraAdapter;
use trit::model::{KvTypes, Model};

/// Named f32 tensors with their shapes, as written into a safetensors file.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn fixtures() -> PathBuf {
    common::repo_root().join("tests/fixtures/lora")
}

fn tiny_mlx() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate(
        &p,
        0,
        dir.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let path = dir.path().join("mlx");
    (dir, path)
}

fn logits(model: &Path, adapter: Option<&Path>, prompt: &[u32]) -> trit::Result<Vec<f32>> {
    let files = trit::format::open(model)?;
    // mlx-lm computed in f32: keys/values stay exact too.
    let m = Model::load_with_adapter(&files, 2, adapter)?.with_kv_types(KvTypes::F32)?;
    Session::new(Arc::new(m), 64).prefill(prompt)
}

/// Every `lora_a`/`lora_b` of the mlx-lm fixture as f32 with its shape.
fn mlx_tensors() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let f = SafetensorsFile::open(&fixtures().join("mlx_adapter/adapters.safetensors")).unwrap();
    let mut out = BTreeMap::new();
    for name in f.header().tensors.keys() {
        let (info, bytes) = f.get(name).unwrap();
        assert_eq!(info.dtype, Dtype::F16);
        let v = bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        out.insert(name.clone(), (info.shape.clone(), v));
    }
    out
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// The fixture adapter in PEFT's layout: `lora_A.weight` = `lora_a`ᵀ `[r, in]`,
/// `lora_B.weight` = `lora_b`ᵀ `[out, r]`, scale from `lora_alpha` (and `use_rslora`).
fn peft_copy(dir: &Path, rslora: bool) -> PathBuf {
    let out = dir.join(if rslora { "peft-rslora" } else { "peft" });
    std::fs::create_dir_all(&out).unwrap();
    let mut tensors = Vec::new();
    for (name, (shape, v)) in mlx_tensors() {
        let (module, leaf) = name.rsplit_once('.').unwrap();
        let peft_leaf = if leaf == "lora_a" { "lora_A" } else { "lora_B" };
        tensors.push((
            format!("base_model.model.{module}.{peft_leaf}.weight"),
            vec![shape[1], shape[0]],
            transpose(&v, shape[0], shape[1]),
        ));
    }
    common::write_f32_safetensors(&out.join("adapter_model.safetensors"), &tensors);
    // scale 8 = alpha / r = 32 / 4, or alpha / sqrt(r) = 16 / 2 with rsLoRA.
    let config = json!({
        "peft_type": "LORA", "r": 4, "lora_alpha": if rslora { 16 } else { 32 },
        "use_rslora": rslora, "bias": "none", "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        "base_model_name_or_path": "trit-random-tiny"
    });
    std::fs::write(out.join("adapter_config.json"), config.to_string()).unwrap();
    out
}

#[test]
fn adapter_logits_match_mlx_lm_in_both_layouts() {
    set_level(KernelLevel::Reference).unwrap();
    let fx: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("tiny.json")).unwrap()).unwrap();
    let prompt = common::ids(&fx["prompt_ids"]);
    let (_dir, model) = tiny_mlx();
    let adapter = fixtures().join("mlx_adapter");
    let ours = logits(&model, Some(&adapter), &prompt).unwrap();
    let step = fx["sampled_indices"]["step"].as_u64().unwrap() as usize;
    let sampled: Vec<f32> = fx["sampled_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let ours_sampled: Vec<f32> = (0..sampled.len()).map(|i| ours[i * step]).collect();
    let d = common::max_abs_diff(&ours_sampled, &sampled);
    // The tolerance of the exact-path mlx-lm comparison (tests/mlx_reference.rs).
    assert!(d < 1e-3, "sampled logits: max |Δ| {d} vs mlx-lm");
    let top_ids = common::ids(&fx["top20"]["ids"]);
    for (i, (&id, want)) in top_ids
        .iter()
        .zip(fx["top20"]["logits"].as_array().unwrap())
        .enumerate()
    {
        let want = want.as_f64().unwrap() as f32;
        assert!((ours[id as usize] - want).abs() < 1e-3, "top {i}: id {id}");
    }
    assert_eq!(common::top_k(&ours, 1)[0], top_ids[0]);
    // The adapter matters: without it the logits are far from mlx-lm's adapted ones.
    let base = logits(&model, None, &prompt).unwrap();
    let base_sampled: Vec<f32> = (0..sampled.len()).map(|i| base[i * step]).collect();
    assert!(common::max_abs_diff(&base_sampled, &sampled) > 0.1);

    // The int8 fast kernels with the f32 side path stay as close to mlx-lm as without it.
    set_level(best_level()).unwrap();
    let fast = logits(&model, Some(&adapter), &prompt).unwrap();
    set_level(KernelLevel::Reference).unwrap();
    let fast_sampled: Vec<f32> = (0..sampled.len()).map(|i| fast[i * step]).collect();
    assert!(common::cosine(&fast_sampled, &sampled) > 0.999);
    assert!(common::max_abs_diff(&fast_sampled, &sampled) < 0.25);

    let dir = tempfile::tempdir().unwrap();
    for rslora in [false, true] {
        let peft = peft_copy(dir.path(), rslora);
        let a = LoraAdapter::load(&peft).unwrap();
        assert_eq!((a.layout, a.pairs.len()), ("PEFT", 10));
        let p = logits(&model, Some(&peft), &prompt).unwrap();
        assert!(
            common::max_abs_diff(&p, &ours) < 1e-5,
            "PEFT (rslora {rslora})"
        );
    }
}

/// Copies the mlx-lm fixture adapter into `dir/name`, with `edit` applied to its config and
/// `tensors` replacing the safetensors file when given.
fn variant(dir: &Path, name: &str, edit: impl Fn(&mut Value), tensors: Option<Tensors>) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let src = fixtures().join("mlx_adapter");
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("adapter_config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(out.join("adapter_config.json"), cfg.to_string()).unwrap();
    match tensors {
        Some(t) => common::write_f32_safetensors(&out.join("adapters.safetensors"), &t),
        None => {
            std::fs::copy(
                src.join("adapters.safetensors"),
                out.join("adapters.safetensors"),
            )
            .unwrap();
        }
    }
    out
}

fn load_err(model: &Path, adapter: &Path) -> String {
    logits(model, Some(adapter), &[1, 2])
        .unwrap_err()
        .to_string()
}

#[test]
fn adapters_that_do_not_fit_are_refused_clearly() {
    let (_dir, model) = tiny_mlx();
    let dir = tempfile::tempdir().unwrap();
    let msg = load_err(&model, &dir.path().join("missing"));
    assert!(msg.contains("not a folder"), "{msg}");
    std::fs::create_dir_all(dir.path().join("empty")).unwrap();
    let msg = load_err(&model, &dir.path().join("empty"));
    assert!(msg.contains("adapter_config.json"), "{msg}");

    let all = mlx_tensors();
    let as_list = |m: &BTreeMap<String, (Vec<usize>, Vec<f32>)>| {
        m.iter()
            .map(|(n, (s, v))| (n.clone(), s.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    // Trained for a wider model: q_proj's A expects 512 inputs.
    let mut wide = all.clone();
    wide.insert(
        "model.layers.2.self_attn.q_proj.lora_a".into(),
        (vec![512, 4], vec![0.0; 2048]),
    );
    let msg = load_err(
        &model,
        &variant(dir.path(), "wide", |_| {}, Some(as_list(&wide))),
    );
    assert!(
        msg.contains("blk.2.attn_q.weight") && msg.contains("512"),
        "{msg}"
    );
    // For a deeper model (layers 6 and 7 of a 4-layer model).
    let mut deep = BTreeMap::new();
    for (n, t) in &all {
        deep.insert(
            n.replace("layers.3.", "layers.7.")
                .replace("layers.2.", "layers.6."),
            t.clone(),
        );
    }
    let msg = load_err(
        &model,
        &variant(dir.path(), "deep", |_| {}, Some(as_list(&deep))),
    );
    assert!(msg.contains("layer 6") && msg.contains("4 layers"), "{msg}");
    // Layers 0 and 1 while num_layers = 2 adapts the last two (2 and 3) of 4.
    let mut early = BTreeMap::new();
    for (n, t) in &all {
        early.insert(
            n.replace("layers.3.", "layers.1.")
                .replace("layers.2.", "layers.0."),
            t.clone(),
        );
    }
    let msg = load_err(
        &model,
        &variant(dir.path(), "early", |_| {}, Some(as_list(&early))),
    );
    assert!(
        msg.contains("layer 0") && msg.contains("layers 2..4"),
        "{msg}"
    );
    // A module trit does not know, and a leaf that is not a LoRA matrix.
    let mut odd = all.clone();
    odd.insert(
        "model.layers.2.mlp.fc9.lora_a".into(),
        (vec![256, 4], vec![0.0; 1024]),
    );
    let msg = load_err(
        &model,
        &variant(dir.path(), "odd", |_| {}, Some(as_list(&odd))),
    );
    assert!(msg.contains("mlp.fc9"), "{msg}");
    let mut leaf = all.clone();
    leaf.insert(
        "model.layers.2.mlp.up_proj.magnitude".into(),
        (vec![768], vec![1.0; 768]),
    );
    let msg = load_err(
        &model,
        &variant(dir.path(), "leaf", |_| {}, Some(as_list(&leaf))),
    );
    assert!(msg.contains("not a LoRA matrix"), "{msg}");
    // Config contradicting the tensors, and unsupported kinds.
    let rank = variant(
        dir.path(),
        "rank",
        |c| c["lora_parameters"]["rank"] = json!(8),
        None,
    );
    assert!(load_err(&model, &rank).contains("rank 8"));
    let keys = variant(
        dir.path(),
        "keys",
        |c| c["lora_parameters"]["keys"] = json!(["self_attn.q_proj"]),
        None,
    );
    assert!(load_err(&model, &keys).contains("keys"));
    let layers = variant(dir.path(), "layers", |c| c["num_layers"] = json!(1), None);
    assert!(load_err(&model, &layers).contains("num_layers = 1"));
    let dora = variant(
        dir.path(),
        "dora",
        |c| c["fine_tune_type"] = json!("dora"),
        None,
    );
    assert!(load_err(&model, &dora).contains("dora"));
    let no_scale = variant(
        dir.path(),
        "noscale",
        |c| {
            c["lora_parameters"]
                .as_object_mut()
                .unwrap()
                .remove("scale");
        },
        None,
    );
    assert!(load_err(&model, &no_scale).contains("scale"));
}
