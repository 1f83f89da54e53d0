//! GPU logits against the CPU engine's on the generated test models (every ternary format, MLX,
//! dense f16, llama, qwen3 and bitnet, tied and untied heads, YaRN) and on the repository's default
//! model; greedy tokens equal for a short run. The CPU path is the reference: it is itself
//! tested against mlx-lm and llama.cpp (crates/trit/tests).
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]` (CI has none). Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_vs_cpu -- --ignored --test-threads 1
//! (or the carried test binary with `--ignored --test-threads 1`). Without a driver each test
//! prints why it is skipped.

mod common;
use common::*;
use std::path::PathBuf;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::model::{Logits, Model};
use trit_cuda::{load_model, CudaOptions, FusedSet};

/// The GPU quantizes activations to int8 like the CPU's fast path (not bit-identically: other
/// summation order, an f16 KV cache), so its error against the exact reference must be of the
/// CPU int8 path's size: at most twice it, plus 1e-3. A wrong index or formula gives errors
/// near 1.
fn check(what: &str, errs: (f64, f64)) {
    check_errors(what, errs, 0.1);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn generated_models_match_the_cpu_in_every_format() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 4] = [
        (
            "tiny",
            &["q2_0", "pq2_0", "ptq1_0", "tq1_0", "tq2_0", "mlx", "f16"],
        ),
        ("tiny-untied-yarn", &["q2_0", "tq2_0"]),
        ("tiny-llama", &["q2_0", "tq1_0"]),
        // BitNet b1.58: sub-norms before o and down, relu², per-tensor scales (the HF folder's
        // weight_scale, GGUF <name>.scale).
        ("tiny-bitnet", &["hf", "tq2_0"]),
    ];
    for (preset, formats) in cases {
        let p = Preset::by_name(preset).unwrap();
        let out = dir.path().join(preset);
        let fmts: Vec<OutFormat> = formats
            .iter()
            .map(|f| OutFormat::parse(f).unwrap())
            .collect();
        generate(&p, 3, &out, &fmts, &TokenizerAssets::Placeholder).unwrap();
        for f in &fmts {
            let path = out.join(f.file_name());
            let errs = compare(&path, &prompt(12, p.vocab, 1), 6, 64);
            check(&format!("{preset} {}", f.file_name()), errs);
        }
    }
}

/// 1-bit Bonsai's files (GGUF Q1_0, MLX 1-bit packs) load into the GPU's ternary layout
/// (`weights.rs`, binary ⊂ ternary) and compute the CPU's logits.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn binary_weight_files_match_the_cpu() {
    use trit::format::testgen::binary::{mlx_1bit_twins, q1_0_twins, small_vocab_tiny};
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vocab = small_vocab_tiny().unwrap().vocab;
    let (q1, _) = q1_0_twins(&dir.path().join("gguf")).unwrap();
    let (_, one_bit) = mlx_1bit_twins(&dir.path().join("mlx")).unwrap();
    for path in [q1, one_bit] {
        let errs = compare(&path, &prompt(12, vocab, 1), 6, 64);
        check(&path.display().to_string(), errs);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn long_prompt_crosses_attention_splits_and_all_logits_match() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate(
        &p,
        5,
        dir.path(),
        &[OutFormat::parse("q2_0").unwrap()],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let path = dir.path().join("model-q2_0.gguf");
    // 600 positions: the decode steps spread them over 10 flash-decoding splits of 64.
    check(
        "tiny q2_0, 600-token prompt",
        compare(&path, &prompt(600, p.vocab, 2), 4, 640),
    );

    // Logits::All: every position's logits, after a prefix already in the cache.
    let files = trit::format::open(&path).unwrap();
    let cpu = Model::load(&files, 2).unwrap();
    let gpu = load_model(&files, &CudaOptions::new(64)).unwrap();
    let (mut cc, mut gc) = (cpu.new_cache(64), gpu.new_cache(64));
    let toks = prompt(9, p.vocab, 3);
    cpu.forward(&toks[..4], &mut cc, Logits::Last).unwrap();
    gpu.forward(&toks[..4], &mut gc, Logits::Last).unwrap();
    let want = cpu.forward(&toks[4..], &mut cc, Logits::All).unwrap();
    let got = gpu.forward(&toks[4..], &mut gc, Logits::All).unwrap();
    assert_eq!(got.len(), 5 * p.vocab);
    for (i, (g, w)) in got.chunks(p.vocab).zip(want.chunks(p.vocab)).enumerate() {
        let e = rel_err(g, w);
        assert!(e < 0.1, "position {i}: {e}");
    }
    // Rewinding (a shorter cache) recomputes from there: same logits as the first time.
    gc.truncate(4);
    let again = gpu.forward(&toks[4..], &mut gc, Logits::All).unwrap();
    // Between two runs of the same GPU model on the same input only rounding may differ.
    assert!(rel_err(&again, &got) < 1e-6);
    // A context beyond what the GPU allocated is refused, not overrun.
    let mut big = gpu.new_cache(65);
    assert!(gpu.forward(&toks, &mut big, Logits::Last).is_err());
}

fn default_model() -> Option<PathBuf> {
    let candidates = [
        std::env::var("TRIT_TEST_MODEL").ok().map(PathBuf::from),
        Some(PathBuf::from(
            "models/default/smollm2-135m-ternary-q2_0.gguf",
        )),
        Some(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/default/smollm2-135m-ternary-q2_0.gguf"
        ))),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn default_model_logits_and_greedy_tokens_match_the_cpu() {
    if gpu_missing() {
        return;
    }
    let Some(path) = default_model() else {
        panic!("default model not found (run from the repository root or set TRIT_TEST_MODEL)");
    };
    let files = trit::format::open(&path).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let ids = tok.encode("The capital of France is", true).unwrap();
    check("default model", compare(&path, &ids, 8, 256));
    greedy_tokens_agree(&files, &ids, 256);
}

/// Prompts through the batched prefill (chunks of 512, attention tiles of 8 queries) against
/// the CPU: one token (the decode path), a partial tile, whole tiles, and 600 tokens that cross
/// the chunk boundary; llama (adjacent RoPE, no QK-norm) and the dense f16 path too.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn prefill_matches_the_cpu_at_several_prompt_lengths() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (preset, formats) in [
        ("tiny", &["q2_0", "f16"][..]),
        ("tiny-llama", &["tq1_0"][..]),
        ("tiny-bitnet", &["hf"][..]),
    ] {
        let p = Preset::by_name(preset).unwrap();
        let out = dir.path().join(preset);
        let fmts: Vec<OutFormat> = formats
            .iter()
            .map(|f| OutFormat::parse(f).unwrap())
            .collect();
        generate(&p, 11, &out, &fmts, &TokenizerAssets::Placeholder).unwrap();
        for f in &fmts {
            let path = out.join(f.file_name());
            for n in [1, 7, 64, 600] {
                let errs = compare(&path, &prompt(n, p.vocab, 20 + n as u64), 2, 640);
                check(&format!("{preset} {} prompt of {n}", f.file_name()), errs);
            }
        }
    }
}

/// The batched prefill and the token-by-token decode graph on the same GPU give the same
/// logits for every position (Logits::All after a prefix in the cache). Not bit-identical: other
/// summation orders, and the decode step attends to the current token's k/v in f32 where the
/// prefill reads them back from the f16 cache; on the tiny random model an int8 rounding that
/// flips re-draws the quantization noise, so the two int8 paths differ by about that noise
/// (2.4e-2 measured at the first position on the H200; each is within the CPU int8 path's
/// error of the f32 reference, see the test above). A wrong position, mask or index gives
/// errors near 1.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn prefill_equals_the_token_by_token_path_on_the_gpu() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate(
        &p,
        12,
        dir.path(),
        &[OutFormat::parse("q2_0").unwrap()],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let files = trit::format::open(&dir.path().join("model-q2_0.gguf")).unwrap();
    let batched = load_model(&files, &CudaOptions::new(128)).unwrap();
    let mut opts = CudaOptions::new(128);
    opts.prefill = false;
    let stepwise = load_model(&files, &opts).unwrap();
    let toks = prompt(75, p.vocab, 13);
    let (mut bc, mut sc) = (batched.new_cache(128), stepwise.new_cache(128));
    batched.forward(&toks[..5], &mut bc, Logits::Last).unwrap();
    stepwise.forward(&toks[..5], &mut sc, Logits::Last).unwrap();
    let got = batched.forward(&toks[5..], &mut bc, Logits::All).unwrap();
    let want = stepwise.forward(&toks[5..], &mut sc, Logits::All).unwrap();
    assert_eq!(got.len(), 70 * p.vocab);
    for (i, (g, w)) in got.chunks(p.vocab).zip(want.chunks(p.vocab)).enumerate() {
        let e = rel_err(g, w);
        assert!(e < 0.1, "position {i}: {e}");
    }
    // Decoding after a batched prompt continues from the right position.
    let next = batched.forward(&[toks[0]], &mut bc, Logits::Last).unwrap();
    let next_ref = stepwise.forward(&[toks[0]], &mut sc, Logits::Last).unwrap();
    assert!(rel_err(&next, &next_ref) < 0.1);
}

/// Embeddings on the GPU (`ExternalNet::hidden_states`: the prompt path on scratch keys and
/// values, the final norm in f32) are the CPU's for each pooling, across prompt chunks (16
/// tokens each here), and a sequence decoding on the GPU goes on with the logits it has
/// without one in between.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn hidden_states_match_the_cpu_and_leave_the_sequence_alone() {
    use trit::engine::{embed, Pooling};
    if gpu_missing() {
        return;
    }
    let files = trit::format::open(&default_model_path()).unwrap();
    let vocab = files.config.vocab;
    let cpu = Model::load(&files, 2).unwrap();
    let mut opts = CudaOptions::new(256);
    opts.prefill_chunk = 16;
    let gpu = load_model(&files, &opts).unwrap();
    let toks = prompt(40, vocab, 9);
    for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
        let (g, c) = (
            embed(&gpu, &toks, pooling).unwrap(),
            embed(&cpu, &toks, pooling).unwrap(),
        );
        let dot: f64 = g.iter().zip(&c).map(|(a, b)| *a as f64 * *b as f64).sum();
        eprintln!("{pooling:?}: cosine {dot:.6}");
        assert!(dot > 0.999, "{pooling:?}: cosine {dot}");
    }
    embedding_leaves_the_sequence_alone(&gpu, &toks, "the default model");
}

/// The dense kernels (f32, f16, bf16 rows: BitNet's bf16 embedding and head, f16 checkpoints,
/// dequantized Q8_0/Q4_x matrices) against an f64 reference: widths that are and are not a
/// multiple of 8 (the vector and the scalar loop), 1 to 17 tokens (partial 8-token tiles), rows
/// not a multiple of the 4 per block. A value the kernel skips stays NaN and fails.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dense_kernels_match_an_f64_reference_for_every_kind() {
    use trit::quant::float::HalfKind;
    use trit_cuda::weights::DevMatrix;
    if gpu_missing() {
        return;
    }
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let values = |n: usize, seed: u64| -> Vec<f32> {
        prompt(n, 20001, seed)
            .iter()
            .map(|&v| v as f32 / 10000.0 - 1.0)
            .collect()
    };
    for (i, (rows, cols, ntok)) in [(37, 2560, 1), (130, 264, 9), (5, 70, 17), (64, 8, 3)]
        .into_iter()
        .enumerate()
    {
        let (w, x) = (
            values(rows * cols, 7 + i as u64),
            values(cols * ntok, 70 + i as u64),
        );
        for kind in [None, Some(HalfKind::F16), Some(HalfKind::BF16)] {
            // The weights as the kernel sees them (rounded to the kind), and its matrix.
            let (seen, m): (Vec<f32>, DevMatrix) = match kind {
                None => (
                    w.clone(),
                    DevMatrix::Dense {
                        rows,
                        cols,
                        w: gpu.upload(&w).unwrap(),
                    },
                ),
                Some(k) => {
                    let bits: Vec<u16> = w
                        .iter()
                        .map(|&v| match k {
                            HalfKind::F16 => half::f16::from_f32(v).to_bits(),
                            HalfKind::BF16 => half::bf16::from_f32(v).to_bits(),
                        })
                        .collect();
                    let seen = bits
                        .iter()
                        .map(|&b| match k {
                            HalfKind::F16 => half::f16::from_bits(b).to_f32(),
                            HalfKind::BF16 => half::bf16::from_bits(b).to_f32(),
                        })
                        .collect();
                    let w = gpu.upload(&bits).unwrap();
                    (
                        seen,
                        DevMatrix::Half {
                            rows,
                            cols,
                            w,
                            kind: k,
                        },
                    )
                }
            };
            let got = trit_cuda::gemv::dense::dense_rows_once(&gpu, &m, &x).unwrap();
            assert_eq!(got.len(), rows * ntok);
            for t in 0..ntok {
                for r in 0..rows {
                    let (wr, xt) = (&seen[r * cols..][..cols], &x[t * cols..][..cols]);
                    let want: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let size: f64 = wr.iter().zip(xt).map(|(&a, &b)| (a * b).abs() as f64).sum();
                    let g = got[t * rows + r] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + size),
                        "{kind:?} {rows}x{cols} token {t} row {r}: {g} against {want}"
                    );
                }
            }
        }
    }
}

/// The prefill attention kernel (tensor cores, f16 inputs) against an f64 causal softmax
/// attention, for every key-tile size (hd 64 and 128: 32-key tiles; 160 and 256:
/// 16-key tiles), GQA, queries that start after earlier cache entries (a second chunk) and
/// query counts that end inside a 64-query block; and its fused int8 quantization.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn prefill_attention_kernels_match_an_f64_reference() {
    if gpu_missing() {
        return;
    }
    use trit_cuda::flash::{prefill_attention_once, AttnShape};
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let shapes = [
        (64, 4, 2, 0, 7),
        (128, 8, 2, 100, 130),
        (128, 4, 4, 0, 64),
        (160, 2, 1, 5, 65),
        (256, 4, 2, 33, 70),
    ];
    for (i, (hd, n_heads, n_kv, pos0, ntok)) in shapes.into_iter().enumerate() {
        let ctx = pos0 + ntok + 3;
        let sh = AttnShape {
            hd,
            n_heads,
            n_kv,
            ctx,
            pos0,
            ntok,
        };
        let unit = |seed: u64, n: usize, scale: f32| -> Vec<f32> {
            prompt(n, 20001, seed)
                .iter()
                .map(|&v| (v as f32 / 10000.0 - 1.0) * scale)
                .collect()
        };
        // Queries pre-scaled by 1/√hd as rope_append_batch leaves them; keys spread wide
        // enough that the softmax is far from uniform.
        let q = unit(7 + i as u64, ntok * n_heads * hd, 3.0 / (hd as f32).sqrt());
        let to_f16 = |v: Vec<f32>| -> Vec<u16> {
            v.iter()
                .map(|x| half::f16::from_f32(*x).to_bits())
                .collect()
        };
        let k = to_f16(unit(8 + i as u64, n_kv * ctx * hd, 2.0));
        let v = to_f16(unit(9 + i as u64, n_kv * ctx * hd, 1.0));
        let kf = |j: usize| half::f16::from_bits(k[j]).to_f64();
        let vf = |j: usize| half::f16::from_bits(v[j]).to_f64();
        let mut want = vec![0f32; q.len()];
        for t in 0..ntok {
            for h in 0..n_heads {
                let kvh = h / (n_heads / n_kv);
                let qrow = &q[(t * n_heads + h) * hd..][..hd];
                let keys = pos0 + t + 1;
                let logits: Vec<f64> = (0..keys)
                    .map(|p| {
                        let base = (kvh * ctx + p) * hd;
                        (0..hd).map(|e| qrow[e] as f64 * kf(base + e)).sum()
                    })
                    .collect();
                let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                for e in 0..hd {
                    let o: f64 = (0..keys).map(|p| w[p] * vf((kvh * ctx + p) * hd + e)).sum();
                    want[(t * n_heads + h) * hd + e] = (o / sum) as f32;
                }
            }
        }
        // f16 rounding of q and of the softmax weights: measured 2.2–3.2e-4 on the H200.
        let out = prefill_attention_once(&gpu, sh, &q, &k, &v).unwrap();
        let err = rel_err(&out.att, &want);
        eprintln!("attention {sh:?}: relative error {err:.2e}");
        assert!(err < 2e-3, "{sh:?}: {err}");
        // Heads of whole 64-column blocks: the fused quantization equals the CPU's of the
        // same values exactly.
        assert_eq!(out.quantized.is_some(), hd % 64 == 0);
        if let Some((q8, meta)) = out.quantized {
            let (want_q, want_meta) = trit_cuda::repack::quantize_activations(&out.att);
            assert!(q8 == want_q, "{sh:?}: int8 values differ");
            assert!(meta == want_meta, "{sh:?}: block scales differ");
        }
    }
}

/// Every way the decode step can run its matrices (all through the fused GEMV, none, and the
/// default mix; attention and o in one kernel or apart, and switching between them mid-run)
/// against the CPU: a 40-token prompt, then decode steps across two attention splits of 32
/// positions (the merge through memory, or on sm_90+ through a cluster's shared memory), on
/// qwen3 (QK-norm) and llama; and the separate attention with 128 positions per split (one
/// block per head normalizes alone).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fused_and_separate_decode_kernels_match_the_cpu() {
    const CLUSTER: &str = "attention splits merged in a cluster";
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny", "tiny-llama"] {
        let p = Preset::by_name(preset).unwrap();
        let out = dir.path().join(preset);
        let q2 = OutFormat::parse("q2_0").unwrap();
        generate(&p, 4, &out, &[q2], &TokenizerAssets::Placeholder).unwrap();
        let path = out.join("model-q2_0.gguf");
        let default = CudaOptions::new(128).fused;
        // att_o: positions below which the attention + o kernel runs (0: never; 44: the
        // first 4 decode steps, then the separate kernels).
        for (name, set, min_chunk, persist, stream_down, att_o) in [
            ("all fused", FusedSet::ALL, 32, false, false, 256),
            ("none fused", FusedSet::NONE, 32, false, false, 256),
            (
                "default (attention + o in one kernel)",
                default,
                32,
                false,
                false,
                256,
            ),
            (
                "attention + o, then apart from position 44",
                default,
                32,
                false,
                false,
                44,
            ),
            ("attention and o apart", default, 32, false, false, 0),
            (
                "attention and o apart, one attention split",
                default,
                128,
                false,
                false,
                0,
            ),
            ("persistent o + gate‖up + down", default, 32, true, false, 0),
            ("down streamed over int8", default, 32, false, true, 0),
            // sm_90+: the two splits merged through the cluster's mailboxes.
            (CLUSTER, default, 32, false, false, 0),
        ] {
            let mut opts = CudaOptions::new(128);
            opts.fused = set;
            opts.att_min_chunk = min_chunk;
            opts.persist_mlp = persist;
            opts.stream_down = stream_down;
            opts.attention_o = att_o > 0;
            opts.attention_o_max = att_o;
            opts.att_cluster = name == CLUSTER;
            let errs = compare_with(&path, &prompt(40, p.vocab, 3), 8, &opts);
            check(&format!("{preset} q2_0, {name}"), errs);
        }
    }
}

/// The attention + o kernel (the default at short contexts) keeps decode steps bit-reproducible
/// (the heads' products meet in integer sums), and really runs: its logits differ in some bit
/// from the separate kernels', whose float sums round otherwise. (Both are checked against the
/// CPU in `fused_and_separate_decode_kernels_match_the_cpu`.)
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attention_o_steps_are_reproducible_and_differ_from_the_separate_kernels() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 5, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join("model-q2_0.gguf")).unwrap();
    let run = |att_o: bool| -> Vec<Vec<f32>> {
        let mut opts = CudaOptions::new(128);
        opts.attention_o = att_o;
        greedy_rows(&files, &opts, prompt(20, p.vocab, 7), 6)
    };
    let (a, b, apart) = (run(true), run(true), run(false));
    assert!(a == b, "two runs with the attention + o kernel differ");
    // Row 0 is the prompt's (the batched prefill in both); the decode steps must differ.
    assert!(
        a[1..].iter().zip(&apart[1..]).any(|(x, y)| x != y),
        "the attention + o kernel did not run: logits bit-equal to the separate kernels'"
    );
}

/// Steps of up to 128 positions merge a head's splits inside a thread block cluster (sm_90+),
/// longer ones through global memory; both merges round alike, so a step's logits do not depend
/// on which kernel its grid took (the device loop's grid covers its last position, host steps
/// take each position's own: `gpu_greedy` compares their tokens and caches bit for bit).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cluster_and_global_split_merges_give_the_same_bits() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 9, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join("model-q2_0.gguf")).unwrap();
    let run = |cluster: bool| -> Vec<Vec<f32>> {
        let mut opts = CudaOptions::new(256);
        opts.att_cluster = cluster;
        // From 40 positions (two splits) across 64 (three) and 96 (four).
        greedy_rows(&files, &opts, prompt(40, p.vocab, 11), 64)
    };
    let (cluster, global) = (run(true), run(false));
    assert_eq!(cluster.len(), global.len());
    for (i, (a, b)) in cluster.iter().zip(&global).enumerate() {
        assert!(
            a == b,
            "row {i}: the cluster merge's logits differ from the global merge's"
        );
    }
}
