//! The whole-step kernel (`megastep.rs`, `TRIT_CUDA_MEGA=1`): every layer of a decode step in
//! one persistent kernel. Its logits against the CPU's exact reference (qwen3 with QK-norm and
//! llama, 2-bit and base-3 files), steps switching to the chain past `mega_max`, reproducible
//! runs that really differ from the chain's rounding, and the greedy device loop on it.
//!
//! Needs an NVIDIA GPU of compute capability 9.0 (bulk copies), so every test is `#[ignore]`:
//!     cargo test --release -p trit-cuda --test gpu_mega -- --ignored --test-threads 1

mod common;
use common::*;
use std::sync::Arc;
use trit::engine::{generate as generate_text, GenerateOptions, Session};
use trit::format::config::Arch;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;
use trit_cuda::{load_model, CudaOptions};

/// A model of the kernel's shape (head dim 128, widths of whole 128-column pairs of blocks)
/// small enough to generate in seconds: 3 layers, 4 query heads over 2 kv heads.
fn mega_preset(arch: Arch) -> Preset {
    Preset {
        name: "mega",
        arch,
        hidden: 512,
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 128,
        ffn: 1536,
        ..Preset::by_name(if arch == Arch::Llama {
            "tiny-llama"
        } else {
            "tiny"
        })
        .unwrap()
    }
}

fn mega_options(ctx: usize, max: usize) -> CudaOptions {
    let mut o = CudaOptions::new(ctx);
    o.mega = true;
    o.mega_max = max;
    o
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn mega_steps_match_the_cpu_and_hand_over_to_the_chain() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Qwen3, Arch::Llama] {
        let p = mega_preset(arch);
        let out = dir.path().join(format!("{arch:?}"));
        let fmts = [
            OutFormat::parse("q2_0").unwrap(),
            OutFormat::parse("tq1_0").unwrap(),
        ];
        generate(&p, 11, &out, &fmts, &TokenizerAssets::Placeholder).unwrap();
        for f in &fmts {
            let path = out.join(f.file_name());
            let before = trit_cuda::megastep::enqueued();
            // All 8 steps on the kernel, then from position 44 on the chain.
            for max in [256, 44] {
                let errs = compare_with(&path, &prompt(40, p.vocab, 3), 8, &mega_options(128, max));
                check_errors(
                    &format!("{arch:?} {} mega_max {max}", f.file_name()),
                    errs,
                    0.1,
                );
            }
            assert!(
                trit_cuda::megastep::enqueued() > before,
                "the kernel did not run"
            );
        }
    }
}

/// The kernel really runs (not the chain in its place), two runs give the same bits (no
/// atomics in any sum), and its rows are the chain's within rounding.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn mega_steps_run_and_are_reproducible() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = mega_preset(Arch::Qwen3);
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 5, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join("model-q2_0.gguf")).unwrap();
    let run = |mega: bool| -> Vec<Vec<f32>> {
        let mut opts = mega_options(128, 128);
        opts.mega = mega;
        greedy_rows(&files, &opts, prompt(20, p.vocab, 7), 6)
    };
    let before = trit_cuda::megastep::enqueued();
    let (a, b) = (run(true), run(true));
    assert!(
        trit_cuda::megastep::enqueued() > before,
        "the whole-step kernel did not run"
    );
    let chain = run(false);
    assert!(a == b, "two runs of the whole-step kernel differ");
    for (x, y) in a.iter().zip(&chain) {
        assert!(rel_err(x, y) < 2e-3, "mega vs chain: {}", rel_err(x, y));
    }
}

/// `generate` on the GPU's device loop (greedy picks on the GPU, the whole-step kernel's graph)
/// gives the tokens of host-driven steps on the same kernel.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn mega_device_loop_equals_host_steps() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = mega_preset(Arch::Qwen3);
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 9, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let path = dir.path().join("model-q2_0.gguf");
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let ids = prompt(10, p.vocab, 2);
    let opts = GenerateOptions {
        max_tokens: 40,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        eos: Vec::new(),
        json: None,
    };
    let run = |greedy_loop: bool| -> Vec<u32> {
        let mut o = mega_options(128, 128);
        o.greedy_loop = greedy_loop;
        let model = Arc::new(load_model(&files, &o).unwrap());
        let mut s = Session::new(model, 128);
        generate_text(&mut s, &tok, &ids, &opts, &mut |_| true)
            .unwrap()
            .tokens
    };
    let before = trit_cuda::megastep::enqueued();
    let (on_device, host) = (run(true), run(false));
    assert!(
        trit_cuda::megastep::enqueued() >= before + 2,
        "the kernel did not run in both"
    );
    assert!(!on_device.is_empty());
    assert_eq!(on_device, host);
}
