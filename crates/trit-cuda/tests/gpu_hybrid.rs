//! The Qwen3.5 hybrid (Gated DeltaNet + gated full attention) decoding on the GPU against the
//! CPU engine on the generated `tiny-qwen35` model: a GGUF file (llama.cpp's tiled value-head
//! order, `ssm_a` stored) and an MLX folder (grouped order, `A_log`). The CPU path is the
//! reference: it is itself tested against mlx-lm (crates/trit/tests/qwen35_reference.rs).
//!
//! Needs an NVIDIA GPU, so the GPU tests are `#[ignore]` (CI has none). Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_hybrid -- --ignored --test-threads 1
//! Without a driver each test prints why it is skipped.

mod common;
use common::*;
use std::path::Path;
use trit::format::testgen::hybrid::{generate, HybridPreset};
use trit::format::testgen::{OutFormat, TokenizerAssets};
use trit::model::Logits;
use trit_cuda::{load_model, CudaOptions};

/// Generates tiny-qwen35 in `formats` under `dir`; returns the paths.
fn tiny_models(dir: &Path, seed: u64, formats: &[&str]) -> (HybridPreset, Vec<std::path::PathBuf>) {
    let p = HybridPreset::by_name("tiny-qwen35").unwrap();
    let fmts: Vec<OutFormat> = formats
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    generate(&p, seed, dir, &fmts, &TokenizerAssets::Placeholder).unwrap();
    let paths = fmts.iter().map(|f| dir.join(f.file_name())).collect();
    (p, paths)
}

/// The GPU quantizes activations to int8 like the CPU's fast path (not bit-identically: other
/// summation order, an f16 KV cache), so its error against the exact reference must be of the
/// CPU int8 path's size: at most twice it, plus 1e-3. A wrong index or formula gives errors
/// near 1. (On tiny-qwen35 the int8 paths drift far more than on dense models — measured on the
/// H200: CPU int8 1.43e-1, GPU 1.46e-1 — so the absolute cap is 0.5, not the dense tests' 0.1.)
fn check(what: &str, errs: (f64, f64)) {
    check_errors(what, errs, 0.5);
}

/// GGUF Q2_0 (tiled value heads; the generator writes the hybrid preset's per-64 scales only
/// as Q2_0) and MLX (grouped value heads): a 12-token
/// prompt (longer than the conv window of 3) then 8 decode steps, every step's logits compared.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_qwen35_logits_match_the_cpu_in_gguf_and_mlx() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = tiny_models(dir.path(), 3, &["q2_0", "mlx"]);
    for path in &paths {
        let errs = compare(path, &prompt(12, p.vocab, 1), 8, 64);
        check(&format!("tiny-qwen35 {}", path.display()), errs);
    }
}

/// 16 greedy tokens, each device feeding back its own argmax, equal on a prompt. The two int8
/// paths round differently, so where the CPU's best two tokens are within 0.2 logits of each
/// other the GPU may pick the other one; there the runs part ways and the comparison stops.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_qwen35_greedy_tokens_match_the_cpu() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = tiny_models(dir.path(), 5, &["q2_0"]);
    let files = trit::format::open(&paths[0]).unwrap();
    let ids = prompt(9, p.vocab, 4);
    greedy_tokens_agree(&files, &ids, 64);
}

/// Logits::All returns every position's logits (each equal to the step-by-step ones), the
/// graph and the kernel-by-kernel launch agree, a restart at position 0 resets the recurrent
/// state (same logits again), a rewind into the middle (a chat turn reusing a prefix) replays
/// the prefix and gives the same logits as the first time, and a cache ahead of what the model
/// has seen is refused.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn all_logits_restart_and_rewind() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = tiny_models(dir.path(), 7, &["q2_0"]);
    let files = trit::format::open(&paths[0]).unwrap();
    let gpu = load_model(&files, &CudaOptions::new(64)).unwrap();
    let toks = prompt(10, p.vocab, 6);
    let v = p.vocab;
    let mut c = gpu.new_cache(64);
    gpu.forward(&toks[..4], &mut c, Logits::Last).unwrap();
    let all = gpu.forward(&toks[4..], &mut c, Logits::All).unwrap();
    assert_eq!(all.len(), 6 * v);

    let mut opts = CudaOptions::new(64);
    opts.graph = false;
    let eager = load_model(&files, &opts).unwrap();
    let mut e = eager.new_cache(64);
    eager.forward(&toks[..4], &mut e, Logits::Last).unwrap();
    for (i, &t) in toks[4..].iter().enumerate() {
        let one = eager.forward(&[t], &mut e, Logits::Last).unwrap();
        let err = rel_err(&one, &all[i * v..(i + 1) * v]);
        assert!(err < 1e-6, "position {}: {err}", 4 + i);
    }

    // Back to the start: the state is zeroed and the same logits come again.
    c.truncate(0);
    gpu.forward(&toks[..4], &mut c, Logits::Last).unwrap();
    let again = gpu.forward(&toks[4..], &mut c, Logits::All).unwrap();
    assert!(rel_err(&again, &all) < 1e-6);

    // Into the middle: the first 5 tokens are replayed, positions 5.. come out as before.
    c.truncate(5);
    let tail = gpu.forward(&toks[5..], &mut c, Logits::All).unwrap();
    assert!(rel_err(&tail, &all[v..]) < 1e-6);
    assert_eq!(c.len(), 10);

    // A fresh model handed a cache that claims 3 positions it never ran: refused.
    let fresh = load_model(&files, &CudaOptions::new(64)).unwrap();
    let mut ahead = fresh.new_cache(64);
    ahead.advance(3);
    let err = fresh
        .forward(&toks[..1], &mut ahead, Logits::Last)
        .unwrap_err();
    assert!(err.to_string().contains("one sequence at a time"), "{err}");
}

/// Hadamard-rotated packs are refused with the reason before any GPU work (runs everywhere).
#[test]
fn rotated_hybrid_packs_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    generate(&p, 1, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    assert!(
        files.rotation.is_some(),
        "tiny-prism GGUF without its rotation"
    );
    let err = load_model(&files, &CudaOptions::new(16))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("rotated"), "{err}");
}
