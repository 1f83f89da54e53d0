//! The GPU's batched path (several sequences per forward, each in its own KV slot) against the
//! GPU's single-sequence path and the CPU engine: every sequence of a batch, at its own depth,
//! gets the logits it gets alone; slots come back when caches are dropped and a reused slot
//! carries nothing over; 32 sequences decode together. The CPU path is the reference (tested
//! against mlx-lm and llama.cpp in crates/trit/tests).
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]`. Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_batch -- --ignored --test-threads 1

mod common;
use common::*;
use std::path::{Path, PathBuf};
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::model::{BatchSeq, ExternalNet, KvCache, Logits, Model};
use trit_cuda::batch_gemm::SmallGemm;
use trit_cuda::{load_model, CudaModel, CudaOptions};

fn tiny_model(dir: &Path, preset: &str) -> PathBuf {
    let p = Preset::by_name(preset).unwrap();
    generate(
        &p,
        3,
        dir,
        &[OutFormat::parse("q2_0").unwrap()],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    dir.join("model-q2_0.gguf")
}

/// What one sequence feeds: a prompt, then one token per decode step.
struct Script {
    prompt: Vec<u32>,
    steps: Vec<u32>,
}

fn scripts(n: usize, vocab: usize, steps: usize) -> Vec<Script> {
    // Prompt lengths from 1 to 90: different depths, some across a 64-position boundary.
    (0..n)
        .map(|i| Script {
            prompt: prompt(1 + (i * 37) % 90, vocab, 100 + i as u64),
            steps: prompt(steps, vocab, 500 + i as u64),
        })
        .collect()
}

/// Every sequence alone, one after another (prompt, then each step): logits per call.
fn run_alone(m: &Model, ss: &[Script], ctx: usize) -> Vec<Vec<Vec<f32>>> {
    ss.iter()
        .map(|s| {
            let mut c = m.new_cache(ctx);
            let mut out = vec![m.forward(&s.prompt, &mut c, Logits::Last).unwrap()];
            for &t in &s.steps {
                out.push(m.forward(&[t], &mut c, Logits::Last).unwrap());
            }
            out
        })
        .collect()
}

/// Every sequence together: all prompts in one batched call, then every step as one call.
fn run_batched(
    forward_batch: impl Fn(&mut [BatchSeq<'_>]) -> Vec<Vec<f32>>,
    caches: &mut [KvCache],
    ss: &[Script],
) -> Vec<Vec<Vec<f32>>> {
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); ss.len()];
    for step in 0..=ss[0].steps.len() {
        let feeds: Vec<Vec<u32>> = ss
            .iter()
            .map(|s| match step {
                0 => s.prompt.clone(),
                k => vec![s.steps[k - 1]],
            })
            .collect();
        let mut batch: Vec<BatchSeq<'_>> = caches
            .iter_mut()
            .zip(&feeds)
            .map(|(c, f)| BatchSeq {
                tokens: f,
                cache: c,
                logits: Logits::Last,
            })
            .collect();
        for (i, l) in forward_batch(&mut batch).into_iter().enumerate() {
            out[i].push(l);
        }
    }
    out
}

/// Worst relative error of `got` against `want`, call by call.
fn worst(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>]) -> f64 {
    let mut w = 0f64;
    for (g, r) in got.iter().zip(want) {
        assert_eq!(g.len(), r.len());
        for (a, b) in g.iter().zip(r) {
            w = w.max(rel_err(a, b));
        }
    }
    w
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn batched_sequences_at_different_depths_match_each_alone_and_the_cpu() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny", "tiny-llama", "tiny-bitnet"] {
        let path = tiny_model(&dir.path().join(preset), preset);
        let files = trit::format::open(&path).unwrap();
        let ctx = 128;
        let gpu = load_model(&files, &CudaOptions::new(ctx)).unwrap();
        let cpu = Model::load(&files, 2).unwrap();
        let vocab = files.config.vocab;
        let ss = scripts(6, vocab, 5);
        let alone = run_alone(&gpu, &ss, ctx);
        let mut caches: Vec<KvCache> = (0..ss.len()).map(|_| gpu.new_cache(ctx)).collect();
        let batched = run_batched(|b| gpu.forward_batch(b).unwrap(), &mut caches, &ss);
        for (c, s) in caches.iter().zip(&ss) {
            assert_eq!(c.len(), s.prompt.len() + s.steps.len());
        }
        let mut cpu_caches: Vec<KvCache> = (0..ss.len()).map(|_| cpu.new_cache(ctx)).collect();
        let on_cpu = run_batched(|b| cpu.forward_batch(b).unwrap(), &mut cpu_caches, &ss);
        let vs_single = worst(&batched, &alone);
        let vs_cpu = worst(&batched, &on_cpu);
        let single_vs_cpu = worst(&alone, &on_cpu);
        eprintln!(
            "{preset}: batched vs single GPU {vs_single:.2e}, batched vs CPU {vs_cpu:.2e} \
             (single GPU vs CPU {single_vs_cpu:.2e})"
        );
        // The same int8 products (GEMM vs GEMV compute the same integers) and the same f16
        // cache; the float summation order differs, and on these random tiny models a flipped
        // int8 rounding of an activation grows through the layers to ~2e-2 (the prefill and
        // token-by-token paths differ as much). A wrong row, slot or position gives ~1.
        assert!(vs_single < 0.1, "{preset}: batched vs single {vs_single}");
        // Against the CPU: as close as the single GPU path is.
        assert!(
            vs_cpu <= 2.0 * single_vs_cpu + 1e-3 && vs_cpu < 0.1,
            "{preset}: batched vs cpu {vs_cpu} (single {single_vs_cpu})"
        );
    }
}

/// The "tiny" preset on the GPU with `slots` sequence slots, its files, and its context.
fn tiny_with_slots(
    dir: &std::path::Path,
    slots: usize,
) -> (trit::format::ModelFiles, CudaModel, usize) {
    let files = trit::format::open(&tiny_model(dir, "tiny")).unwrap();
    let ctx = 128;
    let m = CudaModel::load(&files, &CudaOptions::new(ctx))
        .unwrap()
        .with_max_sequences(slots);
    (files, m, ctx)
}

/// One sequence through the batched path; the last position's logits.
fn run_one(m: &CudaModel, c: &mut KvCache, toks: &[u32]) -> trit::Result<Vec<f32>> {
    let mut b = [BatchSeq {
        tokens: toks,
        cache: c,
        logits: Logits::Last,
    }];
    Ok(m.forward_batch(&mut b)?.remove(0))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn slots_return_when_caches_drop_and_a_reused_slot_starts_clean() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (files, m, ctx) = tiny_with_slots(dir.path(), 2);
    let vocab = files.config.vocab;
    let run = |c: &mut KvCache, toks: &[u32]| run_one(&m, c, toks);
    let short = prompt(5, vocab, 1);
    let mut fresh = KvCache::new(files.config.n_layers, 0, ctx);
    let want = run(&mut fresh, &short).unwrap();
    assert_eq!(m.free_slots(), 1);
    drop(fresh);
    assert_eq!(m.free_slots(), 2);
    // Fill both slots deep, then drop them: a new sequence reuses slot 0 and must see none of
    // the 100 positions left there.
    let long = prompt(100, vocab, 2);
    let (mut a, mut b) = (
        KvCache::new(files.config.n_layers, 0, ctx),
        KvCache::new(files.config.n_layers, 0, ctx),
    );
    run(&mut a, &long).unwrap();
    run(&mut b, &long).unwrap();
    assert_eq!(m.free_slots(), 0);
    // A third sequence while both are owned: a clear error, no slot taken.
    let mut c = KvCache::new(files.config.n_layers, 0, ctx);
    let err = run(&mut c, &short).unwrap_err().to_string();
    assert!(err.contains("slots are in use"), "{err}");
    assert!(c.device_slot().is_none() && c.is_empty());
    drop(a);
    assert_eq!(m.free_slots(), 1);
    let again = run(&mut c, &short).unwrap();
    assert_eq!(c.device_slot().map(|s| s.index()), Some(0));
    assert!(rel_err(&again, &want) < 1e-6, "{}", rel_err(&again, &want));
    drop((b, c));
    assert_eq!(m.free_slots(), 2);
    // A cache already filled by the single-sequence path cannot join a batch.
    let gpu = Model::from_external(Box::new(m));
    let mut single = gpu.new_cache(ctx);
    gpu.forward(&short, &mut single, Logits::Last).unwrap();
    let mut batch = [BatchSeq {
        tokens: &short[..1],
        cache: &mut single,
        logits: Logits::Last,
    }];
    assert!(gpu.forward_batch(&mut batch).is_err());
    // More sequences than slots in one call: refused before any work.
    let mut cs: Vec<KvCache> = (0..3).map(|_| gpu.new_cache(ctx)).collect();
    let mut batch: Vec<BatchSeq<'_>> = cs
        .iter_mut()
        .map(|c| BatchSeq {
            tokens: &short,
            cache: c,
            logits: Logits::Last,
        })
        .collect();
    assert!(gpu.forward_batch(&mut batch).is_err());
}

/// `copy_prefix` (the scheduler's prefix sharing between sequences that run at the same time):
/// a new cache gets a free slot holding a running sequence's first 24 positions, and the rest
/// of its prompt continues from there as it does after computing those 24 itself (the same
/// kernels: the rows of a prompt chunk do not depend on each other); the source keeps decoding
/// as a twin that never lent its slot, and no slot is left behind.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_copied_prefix_continues_like_a_computed_one() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (files, m, ctx) = tiny_with_slots(dir.path(), 3);
    let vocab = files.config.vocab;
    let run = |c: &mut KvCache, toks: &[u32]| run_one(&m, c, toks);
    let new = || KvCache::new(files.config.n_layers, 0, ctx);
    let a_prompt = prompt(40, vocab, 5);
    let mut b_prompt = a_prompt[..24].to_vec();
    b_prompt.extend(prompt(9, vocab, 6));
    let mut a = new();
    run(&mut a, &a_prompt).unwrap();
    // The reference: the first 24 computed, then the rest.
    let mut computed = new();
    run(&mut computed, &b_prompt[..24]).unwrap();
    let want = run(&mut computed, &b_prompt[24..]).unwrap();
    drop(computed);
    let mut b = new();
    assert!(m.copy_prefix(&a, &mut b, 24).unwrap(), "a slot was free");
    assert_eq!(b.len(), 24);
    assert_ne!(
        b.device_slot().map(|s| s.index()),
        a.device_slot().map(|s| s.index())
    );
    let got = run(&mut b, &b_prompt[24..]).unwrap();
    let err = rel_err(&got, &want);
    assert!(err < 1e-4, "continued from the copy: {err}");
    drop(b);
    // The source is untouched: its next step equals a twin's that never lent its slot.
    let next = argmax(&want);
    let a_next = run(&mut a, &[next]).unwrap();
    let mut twin = new();
    run(&mut twin, &a_prompt).unwrap();
    let twin_next = run(&mut twin, &[next]).unwrap();
    assert!(
        rel_err(&a_next, &twin_next) < 1e-6,
        "{}",
        rel_err(&a_next, &twin_next)
    );
    // Nothing to copy from a cache without a slot, nor into one that holds positions.
    let (plain, mut target) = (new(), new());
    assert!(!m.copy_prefix(&plain, &mut target, 4).unwrap());
    assert!(!m.copy_prefix(&a, &mut twin, 4).unwrap());
    drop((a, twin, plain, target));
    assert_eq!(m.free_slots(), 3);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn thirty_two_sequences_decode_together_on_the_default_model() {
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let ctx = 160;
    let gpu = load_model(&files, &CudaOptions::new(ctx)).unwrap();
    let cpu = Model::load(&files, 2).unwrap();
    let ss = scripts(32, files.config.vocab, 8);
    let alone = run_alone(&gpu, &ss, ctx);
    let mut caches: Vec<KvCache> = (0..32).map(|_| gpu.new_cache(ctx)).collect();
    let batched = run_batched(|b| gpu.forward_batch(b).unwrap(), &mut caches, &ss);
    let mut cpu_caches: Vec<KvCache> = (0..32).map(|_| cpu.new_cache(ctx)).collect();
    let on_cpu = run_batched(|b| cpu.forward_batch(b).unwrap(), &mut cpu_caches, &ss);
    let (vs_single, vs_cpu, single_vs_cpu) = (
        worst(&batched, &alone),
        worst(&batched, &on_cpu),
        worst(&alone, &on_cpu),
    );
    eprintln!(
        "32 sequences: batched vs single GPU {vs_single:.2e}, batched vs CPU {vs_cpu:.2e} \
         (single GPU vs CPU {single_vs_cpu:.2e})"
    );
    // A real model amplifies rounding far less than the random tiny ones (GPU vs CPU 7e-3).
    assert!(vs_single < 3e-2, "batched vs single {vs_single}");
    assert!(
        vs_cpu <= 2.0 * single_vs_cpu + 1e-3 && vs_cpu < 0.1,
        "batched vs cpu {vs_cpu} (single {single_vs_cpu})"
    );
}

/// The decode step's small-batch GEMM against the CPU emulation of its arithmetic
/// (`repack::gemv_reference`, token by token) on ragged shapes: rows not a multiple of the
/// 32-row tile, 1 to 65 tokens (partial 8-token tiles, a second 32-token tile), row lengths
/// not a multiple of the 8 warps' 64-column share, a zero token; then accumulating onto y;
/// the ring kernel's quads of 4 blocks split over fewer quads than warps.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn small_batch_gemm_matches_its_cpu_emulation_on_ragged_shapes() {
    if gpu_missing() {
        return;
    }
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    for kernel in [SmallGemm::Plain, SmallGemm::Wide, SmallGemm::Ring] {
        // (Ring runs rows of a multiple of 4 blocks — 1280, 4096, 768 columns — and Wide for
        // the others.)
        for (i, (rows, cols, ntok)) in [
            (37, 8256, 1),
            (200, 128, 7),
            (130, 640, 33),
            (64, 4096, 65),
            (300, 192, 12),
            (70, 1280, 9),
            (33, 768, 40),
            (96, 12288, 32),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 300 + 10 * i as u64;
            let GemmCase { m, q, meta, want } = gemm_case(rows, cols, ntok, seed);
            use trit_cuda::batch_gemm::small_gemm_once;
            let y0: Vec<f32> = (0..ntok * rows).map(|k| (k % 7) as f32 - 3.0).collect();
            // Whole rows per block, split-K in 3 ragged parts, and the decode step's choice.
            for parts in [Some(1), Some(3), None] {
                let what = format!("{kernel:?} {rows}x{cols}, parts {parts:?}");
                let got = small_gemm_once(&gpu, kernel, &m, &q, &meta, None, parts).unwrap();
                check_gemm_tokens(&got, &want, rows, ntok, &what);
                // Accumulating: y0 + W·x. (Reusing the tickets across launches is covered by
                // the batched decode tests: every step's GEMMs share one scratch.)
                let acc = small_gemm_once(&gpu, kernel, &m, &q, &meta, Some(&y0), parts);
                let sum: Vec<f32> = got.iter().zip(&y0).map(|(a, b)| a + b).collect();
                assert!(rel_err(&acc.unwrap(), &sum) < 1e-6, "{what}: accumulate");
            }
        }
    }
    eprintln!("small-batch GEMMs (plain, wide, ring) equal their CPU emulation on 8 ragged shapes");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn one_or_two_decoding_rows_run_the_single_path_on_their_slots() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_model(dir.path(), "tiny");
    let files = trit::format::open(&path).unwrap();
    let ctx = 128;
    let gpu = load_model(&files, &CudaOptions::new(ctx)).unwrap();
    let cpu = Model::load(&files, 2).unwrap();
    let vocab = files.config.vocab;
    let a = &scripts(1, vocab, 8)[0];
    let b_prompt = prompt(30, vocab, 9);
    let alone = &run_alone(&gpu, std::slice::from_ref(a), ctx)[0];
    let step = |feeds: &mut [(&mut KvCache, &[u32])], top: bool| -> Vec<trit::sample::RowLogits> {
        let want_top = vec![top; feeds.len()];
        let mut batch: Vec<BatchSeq<'_>> = feeds
            .iter_mut()
            .map(|(c, t)| BatchSeq {
                tokens: t,
                cache: c,
                logits: Logits::Last,
            })
            .collect();
        gpu.forward_batch_top(&mut batch, 64, &want_top).unwrap()
    };
    let full = |r: &trit::sample::RowLogits| match r {
        trit::sample::RowLogits::Full(v) => v.clone(),
        trit::sample::RowLogits::Top(_) => panic!("candidates where the full row was asked for"),
    };
    let mut ca = gpu.new_cache(ctx);
    let mut got = vec![full(&step(&mut [(&mut ca, &a.prompt)], false)[0])];
    // Steps 1–3 alone (step 2 asks for candidates), step 4 beside B's prompt, step 5 beside
    // B's first step and C's prompt: one or two decoding rows each time, so the single path's
    // kernels over A's slot — the very logits of A alone.
    for (i, t) in a.steps[..3].iter().enumerate() {
        let r = step(&mut [(&mut ca, std::slice::from_ref(t))], i == 1);
        match &r[0] {
            trit::sample::RowLogits::Top(top) => {
                let want = trit::sample::TopLogits::from_row(&alone[i + 1], 64).unwrap();
                assert_eq!(top.ids, want.ids, "candidates of the lone row");
                got.push(alone[i + 1].clone());
            }
            row => got.push(full(row)),
        }
    }
    let (mut cb, mut cc) = (gpu.new_cache(ctx), gpu.new_cache(ctx));
    let c_prompt = prompt(7, vocab, 10);
    let r = step(
        &mut [(&mut ca, &a.steps[3..4]), (&mut cb, &b_prompt)],
        false,
    );
    got.push(full(&r[0]));
    let bt = [a.steps[0]];
    let r = step(
        &mut [
            (&mut ca, &a.steps[4..5]),
            (&mut cb, &bt),
            (&mut cc, &c_prompt),
        ],
        false,
    );
    got.push(full(&r[0]));
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            g, &alone[i],
            "call {i}: the lone row's logits differ from A alone"
        );
    }
    // Three decoding rows: the batched kernels; then B and C leave and A is alone again.
    for t in &a.steps[5..7] {
        let r = step(
            &mut [
                (&mut ca, std::slice::from_ref(t)),
                (&mut cb, &bt),
                (&mut cc, &bt),
            ],
            false,
        );
        got.push(full(&r[0]));
    }
    drop((cb, cc));
    for t in &a.steps[7..] {
        got.push(full(
            &step(&mut [(&mut ca, std::slice::from_ref(t))], false)[0],
        ));
    }
    assert_eq!(ca.len(), a.prompt.len() + a.steps.len());
    let on_cpu = &run_alone(&cpu, std::slice::from_ref(a), ctx)[0];
    let vs_cpu = worst(std::slice::from_ref(&got), std::slice::from_ref(on_cpu));
    let alone_vs_cpu = worst(std::slice::from_ref(alone), std::slice::from_ref(on_cpu));
    eprintln!("lone rows on a slot vs CPU {vs_cpu:.2e} (A alone vs CPU {alone_vs_cpu:.2e})");
    assert!(
        vs_cpu <= 2.0 * alone_vs_cpu + 1e-3 && vs_cpu < 0.1,
        "{vs_cpu} against the CPU (alone {alone_vs_cpu})"
    );
}
