//! LoRA adapters on a Qwen3.5 hybrid against mlx-lm: the random `tiny-qwen35` model with the
//! random mlx-lm adapter in `tests/fixtures/lora/qwen35_adapter` (tools/ref_lora_qwen35.py:
//! rank 4 on every projection of two Gated DeltaNet blocks and one full-attention block; mlx-lm's
//! `load_adapters` checked its names and shapes and recorded the prompt's logits and 4 greedy
//! steps). The same adapter on the model's Q2_0 GGUF (llama.cpp's tiled value-head order, so
//! the adapter's value-head rows are moved to match) gives the same logits. Adapters that do
//! not fit a hybrid are refused by name.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trit::engine::Session;
use trit::format::testgen::hybrid::{generate, HybridPreset};
use trit::format::testgen::{OutFormat, TokenizerAssets};
use trit::kernels::{best_level, set_level, KernelLevel};
use trit::model::{KvTypes, Model};

static LEVEL: Mutex<()> = Mutex::new(());

fn fixtures() -> PathBuf {
    common::repo_root().join("tests/fixtures/lora")
}

/// mlx-lm's rows: the prompt's last logits, then one per greedy step.
fn reference_rows(vocab: usize) -> Vec<Vec<f32>> {
    std::fs::read(fixtures().join("qwen35_steps.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect::<Vec<_>>()
        .chunks_exact(vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

/// `preset` written as each of `formats` into a temporary folder.
fn model_files(preset: &str, formats: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let formats: Vec<OutFormat> = formats
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    let p = HybridPreset::by_name(preset).unwrap();
    generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
    dir
}

fn load(path: &Path, adapter: Option<&Path>) -> trit::Result<Arc<Model>> {
    let files = trit::format::open(path)?;
    // mlx-lm computed in f32: keys and values stay exact too.
    let m = Model::load_with_adapter(&files, 2, adapter)?.with_kv_types(KvTypes::F32)?;
    Ok(Arc::new(m))
}

/// The prompt's logits and `steps` greedy steps' logits, with the picks.
fn run(model: Arc<Model>, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut s = Session::new(model, 64);
    let mut rows = vec![s.prefill(prompt).unwrap()];
    let mut picks = Vec::new();
    for _ in 0..steps {
        let t = common::top_k(rows.last().unwrap(), 1)[0];
        picks.push(t);
        rows.push(s.step(t).unwrap());
    }
    (rows, picks)
}

#[test]
fn hybrid_adapter_logits_match_mlx_lm_in_mlx_and_gguf_files() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let fx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("tiny-qwen35.json")).unwrap())
            .unwrap();
    let prompt = common::ids(&fx["prompt_ids"]);
    let greedy = common::ids(&fx["greedy"]);
    let want = reference_rows(fx["vocab"].as_u64().unwrap() as usize);
    assert_eq!(want.len(), greedy.len() + 1);
    let dir = model_files("tiny-qwen35", &["mlx", "q2_0"]);
    let adapter = fixtures().join("qwen35_adapter");
    let mlx = dir.path().join("mlx");
    let gguf = dir
        .path()
        .join(OutFormat::parse("q2_0").unwrap().file_name());
    for path in [&mlx, &gguf] {
        let (rows, picks) = run(load(path, Some(&adapter)).unwrap(), &prompt, greedy.len());
        assert_eq!(picks, greedy, "{}", path.display());
        for (i, (got, want)) in rows.iter().zip(&want).enumerate() {
            let d = common::max_abs_diff(got, want);
            // The tolerance of the exact-path mlx-lm comparisons (qwen35_reference.rs).
            assert!(
                d < 1e-3,
                "{} row {i}: max |Δ| {d} vs mlx-lm",
                path.display()
            );
        }
    }
    // The adapter matters: without it the prompt's logits are far from mlx-lm's adapted ones.
    let (base, _) = run(load(&mlx, None).unwrap(), &prompt, 0);
    assert!(common::max_abs_diff(&base[0], &want[0]) > 0.1);
    // The int8 fast kernels with the f32 side paths: as close to mlx-lm as the fast kernels
    // are without an adapter (qwen35_reference.rs: cosine > 0.99 through the recurrent state;
    // 0.996 / 0.992 / 0.985 here without the adapter against the exact kernels, 0.997 / 0.995
    // / 0.994 with it against mlx-lm).
    set_level(best_level()).unwrap();
    let (fast, _) = run(load(&mlx, Some(&adapter)).unwrap(), &prompt, 2);
    set_level(KernelLevel::Reference).unwrap();
    for (got, want) in fast.iter().zip(&want) {
        let c = common::cosine(got, want);
        assert!(c > 0.99, "fast kernels: cosine {c}");
    }
}

/// The fixture adapter `name` with `renames` (`from` → `to`, in order) applied to its tensor
/// names, written under `dir`; a tensor whose name contains a `from` with an empty `to` is
/// left out.
fn renamed_adapter(dir: &Path, name: &str, renames: &[(&str, &str)]) -> PathBuf {
    let src = fixtures().join(name);
    let out = dir.join(format!("{name}-renamed"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(
        src.join("adapter_config.json"),
        out.join("adapter_config.json"),
    )
    .unwrap();
    let f = trit::format::safetensors::SafetensorsFile::open(&src.join("adapters.safetensors"))
        .unwrap();
    let mut tensors = Vec::new();
    for name in f.header().tensors.keys() {
        let (info, bytes) = f.get(name).unwrap();
        let v = bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        if renames
            .iter()
            .any(|(from, to)| to.is_empty() && name.contains(from))
        {
            continue;
        }
        let renamed = renames
            .iter()
            .fold(name.clone(), |n, (from, to)| n.replace(from, to));
        tensors.push((renamed, info.shape.clone(), v));
    }
    common::write_f32_safetensors(&out.join("adapters.safetensors"), &tensors);
    out
}

#[test]
fn adapters_that_do_not_fit_a_hybrid_are_refused() {
    let dir = model_files("tiny-qwen35", &["mlx"]);
    let mlx = dir.path().join("mlx");
    let err = |adapter: &Path| match load(&mlx, Some(adapter)) {
        Ok(_) => panic!("{} was accepted", adapter.display()),
        Err(e) => e.to_string(),
    };
    // Layer 6's DeltaNet matrices moved to layer 7, a full-attention layer.
    let tmp = tempfile::tempdir().unwrap();
    let moved = renamed_adapter(tmp.path(), "qwen35_adapter", &[("layers.6.", "layers.7.")]);
    let e = err(&moved);
    assert!(
        e.contains("layer 7") && e.contains("full-attention layer"),
        "{e}"
    );
    // The dense `tiny` model's adapter (layers 2 and 3; its num_layers = 2 alone refuses it
    // here): moved to layers 6 and 7, its attention lands on a DeltaNet layer; on layer 7
    // alone (full attention), its o_proj is narrower than the hybrid's (4 heads of 128).
    let e = err(&fixtures().join("mlx_adapter"));
    assert!(e.contains("num_layers = 2"), "{e}");
    let dense = [("layers.2.", "layers.6."), ("layers.3.", "layers.7.")];
    let e = err(&renamed_adapter(tmp.path(), "mlx_adapter", &dense));
    assert!(
        e.contains("layer 6 of this model has no attn_output projection (a Gated DeltaNet"),
        "{e}"
    );
    let one = [("layers.2.", ""), ("layers.3.", "layers.7.")];
    let one = renamed_adapter(&tmp.path().join("one"), "mlx_adapter", &one);
    let e = err(&one);
    assert!(
        e.contains("'blk.7.attn_output.weight' maps 256 → 256") && e.contains("maps 512 → 256"),
        "{e}"
    );
    // Bonsai 2's rotated layout: the adapter's basis is not the model's.
    let prism = model_files("tiny-prism", &["mlx"]);
    let e = match load(
        &prism.path().join("mlx"),
        Some(&fixtures().join("qwen35_adapter")),
    ) {
        Ok(_) => panic!("a rotated model took the adapter"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("Hadamard-rotated"), "{e}");
}
