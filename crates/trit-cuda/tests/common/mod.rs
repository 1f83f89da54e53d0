//! Helpers shared by the GPU test files (each `tests/*.rs` is its own crate: `mod common;`).

#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use trit::kernels::{self, KernelLevel};
use trit::model::{Logits, Model};
use trit_cuda::{load_model, CudaOptions};

pub fn gpu_missing() -> bool {
    if !trit_cuda::device::driver_present() {
        eprintln!("skipped: no CUDA driver (libcuda.so) on this machine");
        return true;
    }
    false
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite GPU logits");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Pseudo-random prompt ids below `vocab`, different per seed.
pub fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// The kernel level is process-wide: tests that switch it take this lock.
pub static LEVEL: Mutex<()> = Mutex::new(());

/// Runs `tokens` as a prompt, then `steps` decode steps, on the GPU, on the CPU's int8 path and
/// on the CPU's exact f32 reference (`KernelLevel::Reference`), all fed the reference's argmax.
/// The GPU's odd steps go through `forward_read` (its page-locked row lent, as `trit bench`
/// reads it). Returns the worst relative logit error against the reference of (GPU, CPU int8).
pub fn compare(path: &Path, tokens: &[u32], steps: usize, ctx: usize) -> (f64, f64) {
    compare_with(path, tokens, steps, &CudaOptions::new(ctx))
}

/// `compare` with the GPU model loaded with `opts` (its context: `opts.ctx`).
pub fn compare_with(path: &Path, tokens: &[u32], steps: usize, opts: &CudaOptions) -> (f64, f64) {
    let ctx = opts.ctx;
    let _lock = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let files = trit::format::open(path).unwrap();
    let cpu = Model::load(&files, 2).unwrap();
    let gpu = load_model(&files, opts).unwrap();
    let fast = kernels::level();
    let (mut rc, mut cc, mut gc) = (cpu.new_cache(ctx), cpu.new_cache(ctx), gpu.new_cache(ctx));
    let mut feed = tokens.to_vec();
    let (mut worst_gpu, mut worst_cpu) = (0f64, 0f64);
    for step in 0..=steps {
        kernels::set_level(KernelLevel::Reference).unwrap();
        let want = cpu.forward(&feed, &mut rc, Logits::Last).unwrap();
        kernels::set_level(fast).unwrap();
        let int8 = cpu.forward(&feed, &mut cc, Logits::Last).unwrap();
        let got = if step % 2 == 1 {
            let mut lent = Vec::new();
            let mut read = |row: &[f32]| lent = row.to_vec();
            gpu.forward_read(&feed, &mut gc, Logits::Last, &mut read)
                .unwrap();
            lent
        } else {
            gpu.forward(&feed, &mut gc, Logits::Last).unwrap()
        };
        assert_eq!(got.len(), want.len(), "a whole row");
        worst_gpu = worst_gpu.max(rel_err(&got, &want));
        worst_cpu = worst_cpu.max(rel_err(&int8, &want));
        feed = vec![argmax(&want)];
    }
    assert_eq!(gc.len(), rc.len());
    (worst_gpu, worst_cpu)
}

/// Prints the worst errors of [`compare`] and asserts the GPU's is of the CPU int8 path's size
/// (at most twice it, plus 1e-3) and under `cap` (a wrong index or formula gives errors near 1).
pub fn check_errors(what: &str, (gpu, cpu): (f64, f64), cap: f64) {
    eprintln!("{what}: relative logit error vs f32 reference: gpu {gpu:.2e}, cpu int8 {cpu:.2e}");
    assert!(
        gpu <= 2.0 * cpu + 1e-3 && gpu < cap,
        "{what}: gpu {gpu} vs cpu int8 {cpu}"
    );
}

/// One product to check: a matrix in the GPU layout, int8 activations of several tokens (values,
/// then (d, d·Σq) per 64), and the expected `rows` outputs per token.
pub struct GemmCase {
    pub m: trit_cuda::repack::PackedTernary,
    pub q: Vec<i8>,
    pub meta: Vec<(f32, f32)>,
    pub want: Vec<f32>,
}

/// A GEMM's `ntok` tokens of `rows` outputs against the emulation: token 3 (all-zero
/// activations) exactly zero, the others within 1e-5 relative error.
pub fn check_gemm_tokens(got: &[f32], want: &[f32], rows: usize, ntok: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    for t in 0..ntok {
        let (g, w) = (
            &got[t * rows..(t + 1) * rows],
            &want[t * rows..(t + 1) * rows],
        );
        if t == 3 {
            assert!(g.iter().all(|v| *v == 0.0), "{what}: zero token");
            continue;
        }
        let err = rel_err(g, w);
        assert!(err < 1e-5, "{what}, {ntok} tokens, token {t}: {err}");
    }
}

/// A random Q2_0 matrix in the GPU layout and `ntok` tokens of int8 activations for it (each
/// token its own scale range; token 3 all zeros), with the CPU emulation of the kernels'
/// arithmetic per token (`repack::gemv_reference`).
pub fn gemm_case(rows: usize, cols: usize, ntok: usize, seed: u64) -> GemmCase {
    use trit::quant::ternary::{encode_matrix, GgmlTernary};
    use trit::quant::GgmlType;
    use trit_cuda::repack::{gemv_reference, pack, quantize_activations};
    let codes: Vec<u8> = prompt(rows * cols, 3, seed)
        .iter()
        .map(|&c| c as u8)
        .collect();
    let scales: Vec<f32> = prompt(rows * cols / 64, 1000, seed + 1)
        .iter()
        .map(|&v| half::f16::from_f32(0.01 + v as f32 * 1e-4).to_f32())
        .collect();
    let bytes = encode_matrix(GgmlType::Q2_0, rows, cols, &codes, &scales).unwrap();
    let m = pack(&[&GgmlTernary::new(GgmlType::Q2_0, &bytes, rows, cols).unwrap()]).unwrap();
    let (mut q, mut meta, mut want) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..ntok {
        let x: Vec<f32> = prompt(cols, 20001, seed + 2 + t as u64)
            .iter()
            .map(|&v| {
                if t == 3 {
                    0.0
                } else {
                    (v as f32 / 10000.0 - 1.0) * (1 + t % 5) as f32
                }
            })
            .collect();
        let (tq, tm) = quantize_activations(&x);
        want.extend(gemv_reference(&m, &tq, &tm));
        q.extend(tq);
        meta.extend(tm);
    }
    GemmCase { m, q, meta, want }
}

/// Greedy decoding of 16 tokens after `ids` on the CPU (int8 path) and the GPU, each device
/// feeding back its own argmax. The two int8 paths round differently, so where the CPU's best
/// two tokens are within 0.2 logits of each other the GPU may pick the other one; there the
/// runs part ways and the comparison stops (after at least 8 equal tokens).
pub fn greedy_tokens_agree(files: &trit::format::ModelFiles, ids: &[u32], ctx: usize) {
    let run = |m: &Model| -> (Vec<u32>, Vec<Vec<f32>>) {
        let mut c = m.new_cache(ctx);
        let mut logits = m.forward(ids, &mut c, Logits::Last).unwrap();
        let (mut out, mut all) = (Vec::new(), Vec::new());
        for _ in 0..16 {
            let t = argmax(&logits);
            out.push(t);
            all.push(logits.clone());
            logits = m.forward(&[t], &mut c, Logits::Last).unwrap();
        }
        (out, all)
    };
    let (cpu, cpu_logits) = run(&Model::load(files, 2).unwrap());
    let (gpu, _) = run(&load_model(files, &CudaOptions::new(ctx)).unwrap());
    eprintln!("greedy cpu {cpu:?}\ngreedy gpu {gpu:?}");
    let same = cpu.iter().zip(&gpu).take_while(|(a, b)| a == b).count();
    if same < cpu.len() {
        let l = &cpu_logits[same];
        let gap = l[cpu[same] as usize] - l[gpu[same] as usize];
        eprintln!("tokens differ at step {same}: cpu logit gap {gap}");
        assert!(same >= 8 && gap < 0.2, "step {same}: gap {gap}");
    }
}

/// The committed default model (run from the repository root or the crate).
pub fn default_model_path() -> PathBuf {
    [
        PathBuf::from("models/default/smollm2-135m-ternary-q2_0.gguf"),
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/default/smollm2-135m-ternary-q2_0.gguf"
        )),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("default model not found (run from the repository root)")
}

/// The logits of the prompt `feed` and of the greedy steps after it (`rows` in all), on a GPU
/// model of `files` loaded with `opts` (a fresh cache of `opts.ctx`).
pub fn greedy_rows(
    files: &trit::format::ModelFiles,
    opts: &CudaOptions,
    mut feed: Vec<u32>,
    rows: usize,
) -> Vec<Vec<f32>> {
    let gpu = load_model(files, opts).unwrap();
    let mut cache = gpu.new_cache(opts.ctx);
    (0..rows)
        .map(|_| {
            let logits = gpu.forward(&feed, &mut cache, Logits::Last).unwrap();
            feed = vec![argmax(&logits)];
            logits
        })
        .collect()
}

/// Asserts that an embedding computed between two decode steps leaves a device model's running
/// sequence alone: 8 prompt tokens and one step, then the next step's logits equal (within
/// 1e-6) with and without an embedding of `toks` in between.
pub fn embedding_leaves_the_sequence_alone(model: &Model, toks: &[u32], what: &str) {
    use trit::engine::{embed, Pooling};
    let vocab = model.config().vocab;
    let (a, next) = (prompt(8, vocab, 3), prompt(2, vocab, 4));
    let run = |between: bool| -> Vec<f32> {
        let mut cache = model.new_cache(64);
        model.forward(&a, &mut cache, Logits::Last).unwrap();
        model.forward(&next[..1], &mut cache, Logits::Last).unwrap();
        if between {
            embed(model, toks, Pooling::Mean).unwrap();
        }
        model.forward(&next[1..], &mut cache, Logits::Last).unwrap()
    };
    let (plain, interrupted) = (run(false), run(true));
    assert!(rel_err(&interrupted, &plain) < 1e-6, "{what}");
}
