//! Shared helpers for integration tests: locating fetched assets (skip, don't fail, when a
//! fresh checkout has not run tools/fetch_assets.sh).

#![allow(dead_code)]

pub mod device_loop;

use std::path::PathBuf;

pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TRIT_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// The asset at `rel` inside the cache, or None with a printed notice.
pub fn asset(rel: &str) -> Option<PathBuf> {
    let p = cache_dir().join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh)",
            p.display()
        );
        None
    }
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The committed default model, opened.
pub fn default_model_files() -> trit::format::ModelFiles {
    let dir = repo_root().join("models/default");
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .expect("the default model is committed");
    trit::format::open(&path).unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    idx.truncate(k);
    idx
}

/// A JSON array of token ids (fixtures written by the tools/ reference scripts).
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

/// The logits after `prompt` and the `steps` greedy ids that follow it.
pub fn greedy_run(
    s: &mut trit::engine::Session,
    prompt: &[u32],
    steps: usize,
) -> (Vec<f32>, Vec<u32>) {
    let first = s.prefill(prompt).unwrap();
    let mut logits = first.clone();
    let mut out = Vec::new();
    for _ in 0..steps {
        let t = trit::sample::sampler::argmax(&logits);
        out.push(t);
        logits = s.step(t).unwrap();
    }
    (first, out)
}

/// Writes `(name, shape, values)` tensors as an F32 safetensors file (adapters and
/// full-precision models built by the tests).
pub fn write_f32_safetensors(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    use trit::format::safetensors::{self, TensorSpec};
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, s, _)| TensorSpec {
            name: n.clone(),
            dtype: trit::format::Dtype::F32,
            shape: s.clone(),
        })
        .collect();
    safetensors::write(path, &Default::default(), &specs, |i, out| {
        let bytes: Vec<u8> = tensors[i].2.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.write_all(&bytes).map_err(|e| trit::Error::io(path, e))
    })
    .unwrap();
}

/// The tiny random hybrid `tiny-qwen35` (8 layers: 6 Gated DeltaNet, 2 full attention) as an
/// MLX folder with the placeholder tokenizer, loaded; the folder lives as long as the TempDir.
pub fn tiny_hybrid() -> (
    tempfile::TempDir,
    std::sync::Arc<trit::model::Model>,
    std::sync::Arc<trit::tokenizer::Tokenizer>,
) {
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let preset = HybridPreset::by_name("tiny-qwen35").unwrap();
    generate(
        &preset,
        0,
        dir.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let files = trit::format::open(&dir.path().join("mlx")).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let model = trit::model::Model::load(&files, 2).unwrap();
    (dir, std::sync::Arc::new(model), std::sync::Arc::new(tok))
}

/// Hybrid preset `name` (e.g. `tiny-qwen35`, `tiny-prism`) written with `seed` as a Q2_0 GGUF
/// file and opened; the file lives as long as the TempDir.
pub fn hybrid_q2_0(
    name: &str,
    seed: u64,
) -> (
    tempfile::TempDir,
    trit::format::ModelFiles,
    trit::format::testgen::hybrid::HybridPreset,
) {
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name(name).unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    generate(&p, seed, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    (dir, files, p)
}

/// Greedy decoding of up to `max_tokens`, no stop strings or EOS (scheduler tests).
pub fn greedy(max_tokens: usize) -> trit::engine::GenerateOptions {
    trit::engine::GenerateOptions {
        max_tokens,
        sampling: trit::sample::SamplingParams::greedy(),
        stop: vec![],
        eos: vec![],
        constraint: None,
    }
}

/// A sequence's tokens and summary from its events (bounded wait; an error event panics).
pub fn collect(
    rx: &std::sync::mpsc::Receiver<trit::engine::SeqEvent>,
) -> (Vec<u32>, trit::engine::SeqSummary) {
    use trit::engine::SeqEvent;
    let mut tokens = Vec::new();
    loop {
        match rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap()
        {
            SeqEvent::Piece { token, .. } => tokens.extend(token),
            SeqEvent::Done(s) => return (tokens, s),
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

/// Submits a request to `s` whose events arrive on the returned channel.
pub fn submit(
    s: &trit::engine::Scheduler,
    prompt: &[u32],
    opts: trit::engine::GenerateOptions,
) -> std::sync::mpsc::Receiver<trit::engine::SeqEvent> {
    let (tx, rx) = std::sync::mpsc::channel();
    s.submit(trit::engine::SeqRequest {
        prompt: prompt.to_vec(),
        options: opts,
        top_logprobs: None,
        keep: None,
        sink: Box::new(move |e| tx.send(e).is_ok()),
    })
    .unwrap();
    rx
}
