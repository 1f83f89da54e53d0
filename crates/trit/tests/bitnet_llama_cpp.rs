//! trit's BitNet GGUF export read by llama.cpp (tools/ref_bitnet_llamacpp.py: llama-cpp-python
//! 0.3.36 on the tiny-bitnet TQ2_0 file), an independent check of the GGUF side — tensor names,
//! the per-tensor `.scale` tensors, NeoX RoPE, both sub-norms.
//!
//! llama.cpp's `bitnet` graph applies SiLU in the MLP where BitNet b1.58 uses relu² (reported
//! upstream, llama.cpp PR #25885). So trit reads the same file marked with llama.cpp's
//! `bitnet.hidden_activation = "silu"` and must give llama.cpp's logits (both take int8
//! activations: cosine bound), while the unmarked file — relu², trit's default for BitNet,
//! checked against mlx-lm and transformers in `bitnet_reference.rs` — must not.

mod common;

use common::ids;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trit::engine::Session;
use trit::format::gguf::GgufFile;
use trit::format::gguf_write::GgufWriter;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::model::Model;

const PRESET: &str = "tiny-bitnet";

fn fixture(name: &str) -> Value {
    let path = common::repo_root().join(format!("tests/fixtures/bitnet/{name}"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// llama.cpp's stored logits as (token id, value): every `sample_step`-th id and the top ids.
fn llama_cpp_logits(fx: &Value, prompt: &str) -> Vec<(usize, f32)> {
    let r = &fx["prompts"][prompt];
    let step = r["sample_step"].as_u64().unwrap() as usize;
    let name = format!("tests/fixtures/bitnet/{PRESET}.{prompt}.llama_cpp_tq2_0.f32");
    let mut out: Vec<(usize, f32)> = std::fs::read(common::repo_root().join(name))
        .unwrap()
        .chunks_exact(4)
        .enumerate()
        .map(|(i, b)| (i * step, f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    let vals = r["top_logits"].as_array().unwrap();
    for (&id, v) in ids(&r["top_ids"]).iter().zip(vals) {
        out.push((id as usize, v.as_f64().unwrap() as f32));
    }
    out
}

/// A copy of the GGUF at `src` with `<arch>.hidden_activation = act`.
fn with_activation(src: &Path, act: &str, to: PathBuf) -> PathBuf {
    let file = GgufFile::open(src).unwrap();
    let arch = file.get_str("general.architecture").unwrap().to_string();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add(k.clone(), v.clone()).unwrap();
    }
    w.add(format!("{arch}.hidden_activation"), act.to_string())
        .unwrap();
    for t in file.tensors() {
        w.add_tensor(t.name.clone(), &t.shape, t.ty, file.tensor_data(t).to_vec())
            .unwrap();
    }
    w.write_file(&to).unwrap();
    to
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn llama_cpp_reads_the_gguf_export_as_trit_does_up_to_its_activation() {
    let fx = fixture(&format!("{PRESET}.llama_cpp.json"));
    let prompts = fixture(&format!("{PRESET}.json"));
    let dir = tempfile::tempdir().unwrap();
    let f = OutFormat::parse("tq2_0").unwrap();
    let seed = fx["seed"].as_u64().unwrap();
    let preset = Preset::by_name(PRESET).unwrap();
    generate(
        &preset,
        seed,
        dir.path(),
        &[f],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let plain = dir.path().join(f.file_name());
    let silu = with_activation(&plain, "silu", dir.path().join("silu.gguf"));
    let load = |p: &Path| {
        let files = trit::format::open(p).unwrap();
        Arc::new(Model::load(&files, 2).unwrap())
    };
    let (relu2, silu) = (load(&plain), load(&silu));
    for name in ["short", "long"] {
        let prompt = ids(&prompts["prompts"][name]["ids"]);
        let want = llama_cpp_logits(&fx, name);
        let logits = |m: &Arc<Model>| {
            let all = Session::new(m.clone(), 512).prefill(&prompt).unwrap();
            want.iter().map(|&(i, _)| all[i]).collect::<Vec<f32>>()
        };
        let reference: Vec<f32> = want.iter().map(|&(_, v)| v).collect();
        let same = cosine(&logits(&silu), &reference);
        assert!(
            same > 0.999,
            "{name}: marked SiLU vs llama.cpp, cosine {same}"
        );
        let differs = cosine(&logits(&relu2), &reference);
        eprintln!("{name}: silu {same:.6} relu2 {differs:.6}");
        assert!(
            differs < 0.99,
            "{name}: relu² vs llama.cpp's SiLU, cosine {differs}"
        );
    }
}

#[test]
fn an_unknown_activation_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = OutFormat::parse("tq2_0").unwrap();
    let preset = Preset::by_name(PRESET).unwrap();
    generate(&preset, 1, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let gelu = with_activation(
        &dir.path().join(f.file_name()),
        "gelu",
        dir.path().join("gelu.gguf"),
    );
    let err = trit::format::open(&gelu)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("hidden_activation 'gelu'"), "{err}");
}
