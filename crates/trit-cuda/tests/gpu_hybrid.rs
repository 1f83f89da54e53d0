//! The Qwen3.5 hybrid (Gated DeltaNet + gated full attention) decoding on the GPU against the
//! CPU engine on the generated `tiny-qwen35` model: a GGUF file (llama.cpp's tiled value-head
//! order, `ssm_a` stored) and an MLX folder (grouped order, `A_log`); and its Hadamard-rotated
//! Bonsai 2 form `tiny-prism` (GGUF `prism.hadamard.*` with regrouped ssm_out columns, MLX
//! `prism_hadamard_qwen35` pack with f16-rounded embedding rows). The CPU path is the
//! reference: it is itself tested against mlx-lm (crates/trit/tests/qwen35_reference.rs and
//! prism_reference.rs). The GPU's Walsh–Hadamard transform is also checked alone against the
//! CPU's `kernels::hadamard::fwht_blocks` on the 27B's widths.
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
    preset_models("tiny-qwen35", dir, seed, formats)
}

/// Generates hybrid preset `name` in `formats` under `dir`; returns the paths.
fn preset_models(
    name: &str,
    dir: &Path,
    seed: u64,
    formats: &[&str],
) -> (HybridPreset, Vec<std::path::PathBuf>) {
    let p = HybridPreset::by_name(name).unwrap();
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
/// as Q2_0) and MLX (grouped value heads): a 40-token
/// prompt (longer than the conv window of 3, and than one round of the decode attention's 8
/// warps × 4 positions) then 8 decode steps, every step's logits compared;
/// each also with the down projection through the streaming GEMV, with the DeltaNet step
/// that computes its gates after its wait (the default computes them before), and with the
/// attention in the prep and decode kernels (the default: `hybrid_attn_step`, one block per
/// head up to 64 positions), and with it in splits of 32 positions (two, merged).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_qwen35_logits_match_the_cpu_in_gguf_and_mlx() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = tiny_models(dir.path(), 3, &["q2_0", "mlx"]);
    for path in &paths {
        for (how, stream_down, early, attn_step, min_chunk) in [
            ("", false, true, true, 64),
            (", down streamed", true, true, true, 64),
            (", DeltaNet step not early", false, false, true, 64),
            (
                ", attention in prep and decode kernels",
                false,
                true,
                false,
                64,
            ),
            (
                ", attention in splits of 32 positions",
                false,
                true,
                true,
                32,
            ),
        ] {
            let mut opts = CudaOptions::new(64);
            opts.stream_down = stream_down;
            opts.deltanet_early = early;
            opts.hybrid_attn_step = attn_step;
            opts.hybrid_att_min_chunk = min_chunk;
            let errs = compare_with(path, &prompt(40, p.vocab, 1), 8, &opts);
            check(&format!("tiny-qwen35 {}{how}", path.display()), errs);
        }
    }
}

/// Key and value heads of 128 dims (the 27B's: 4 state values per lane) and attention heads of
/// 256 (the 27B's: `hybrid_attn_step` with 8 values per lane): tiny-qwen35 widened to them,
/// Q2_0, a 40-token prompt and 8 decode steps against the CPU, with the tiny model's
/// tolerance — by the pair of blocks per value head (on sm_90+: 64 rows each in one pass, the
/// gated norm's sum exchanged between them) and by one block per head (3 passes of 48 rows);
/// the attention also in splits of 32 positions, and after a 200-token prompt (several splits
/// of several rounds; added in session 32 after its last device run).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn key_heads_of_128_dims_match_the_cpu() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset {
        name: "tiny-qwen35-dk128",
        k_dim: 128,
        v_dim: 128,
        head_dim: 256,
        ..HybridPreset::by_name("tiny-qwen35").unwrap()
    };
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 11, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let path = dir.path().join(q2.file_name());
    // (pair, positions per attention split, prompt length): the 200-token prompt's steps take
    // 4 splits of 64 positions, 2 rounds of 32 each.
    for (pair, min_chunk, n) in [
        (true, 64, 40),
        (false, 64, 40),
        (true, 32, 40),
        (true, 64, 200),
    ] {
        let mut opts = CudaOptions::new(256);
        opts.deltanet_pair = pair;
        opts.hybrid_att_min_chunk = min_chunk;
        let errs = compare_with(&path, &prompt(n, p.vocab, 2), 8, &opts);
        check(
            &format!(
                "tiny-qwen35 with 128-dim heads, pair {pair}, attention splits of {min_chunk}, \
                 {n}-token prompt"
            ),
            errs,
        );
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

/// Sampled steps answered with candidates (`forward_top`, what `trit run` / `chat` use on a
/// hybrid): each step's candidates are the host reference's candidates of the same step's full
/// row, computed by a twin model fed the same tokens (its own recurrent state, the same
/// kernels, so the same numbers; one model serving both caches would replay the sequence for
/// each, and a replay takes the batched prompt path, whose products sum in another order).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sampled_steps_with_candidates_give_the_candidates_of_full_rows() {
    if gpu_missing() {
        return;
    }
    use trit::sample::{RowLogits, TopLogits, TOP_CANDIDATES};
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = tiny_models(dir.path(), 8, &["q2_0"]);
    let files = trit::format::open(&paths[0]).unwrap();
    let gpu = load_model(&files, &CudaOptions::new(64)).unwrap();
    let twin = load_model(&files, &CudaOptions::new(64)).unwrap();
    let k = TOP_CANDIDATES.min(p.vocab);
    let toks = prompt(6, p.vocab, 9);
    let (mut a, mut b) = (gpu.new_cache(64), twin.new_cache(64));
    let first = twin.forward(&toks, &mut b, Logits::Last).unwrap();
    gpu.forward(&toks, &mut a, Logits::Last).unwrap();
    let mut tok = argmax(&first);
    for step in 0..12 {
        let full = twin.forward(&[tok], &mut b, Logits::Last).unwrap();
        let want = TopLogits::from_row(&full, k).expect("finite logits");
        match gpu.forward_top(&[tok], &mut a, k).unwrap() {
            RowLogits::Top(got) => {
                assert_eq!(got.ids, want.ids, "step {step}");
                assert_eq!(got.logits, want.logits, "step {step}");
                assert!((got.log_z - want.log_z).abs() < 1e-9 * want.log_z.abs().max(1.0));
            }
            RowLogits::Full(_) => panic!("step {step}: a full row"),
        }
        tok = argmax(&full);
    }
    assert_eq!((a.len(), b.len()), (18, 18));
}

/// Logits::All returns every position's logits (each equal to the step-by-step ones), the
/// graph and the kernel-by-kernel launch agree, a restart at position 0 resets the recurrent
/// state (same logits again), a rewind into the middle (a chat turn reusing a prefix) replays
/// the prefix and gives the same logits as the first time, and a cache ahead of what the model
/// has seen is refused. The first 4 tokens go in one at a time: a replay with `Logits::All`
/// runs token by token, and a multi-token prompt would take the batched path, whose products
/// sum in another order (that path has its own test below).
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
    let one_by_one = |m: &trit::model::Model, c: &mut trit::model::KvCache, t: &[u32]| {
        for &id in t {
            m.forward(&[id], c, Logits::Last).unwrap();
        }
    };
    let mut c = gpu.new_cache(64);
    one_by_one(&gpu, &mut c, &toks[..4]);
    let all = gpu.forward(&toks[4..], &mut c, Logits::All).unwrap();
    assert_eq!(all.len(), 6 * v);

    let mut opts = CudaOptions::new(64);
    opts.graph = false;
    let eager = load_model(&files, &opts).unwrap();
    let mut e = eager.new_cache(64);
    one_by_one(&eager, &mut e, &toks[..4]);
    for (i, &t) in toks[4..].iter().enumerate() {
        let one = eager.forward(&[t], &mut e, Logits::Last).unwrap();
        let err = rel_err(&one, &all[i * v..(i + 1) * v]);
        assert!(err < 1e-6, "position {}: {err}", 4 + i);
    }

    // Back to the start: the state is zeroed and the same logits come again.
    c.truncate(0);
    one_by_one(&gpu, &mut c, &toks[..4]);
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

/// The batched prompt path (chunks of 16 tokens, so the 40-token prompt takes three and the
/// replay of 31 tokens after a rewind two) against the CPU and against this GPU's
/// token-by-token path (`prefill = false`), in GGUF and MLX, with the DeltaNet recurrence as
/// one kernel per chunk and as one `deltanet_step` per token: the prompt's last logits, 8
/// decode steps after it, and the rewind. The paths share the per-token mixer kernels and the
/// int8 quantization; only the matrix products (tensor-core GEMM over rows against the decode
/// GEMV) and the norms' summation order differ, so they must agree at least as closely as the
/// CPU's int8 path agrees with the f32 reference (a wrong row or position gives errors near 1).
/// The rotated tiny-prism (Bonsai 2's layout: every projection input through `hadamard_quant`
/// over the chunk's rows, the embedding's inverse rotation too) runs the same checks. The
/// prompt's logits must differ from the token path's in some bit: equal ones would mean the
/// batched path did not run at all.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn batched_prompts_match_the_cpu_and_the_token_path() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, mut paths) = tiny_models(&dir.path().join("plain"), 12, &["q2_0", "mlx"]);
    let (_, rotated) = preset_models(
        "tiny-prism",
        &dir.path().join("prism"),
        14,
        &["q2_0", "mlx"],
    );
    paths.extend(rotated);
    for (path, dn_chunk) in paths.iter().flat_map(|p| [(p, true), (p, false)]) {
        let files = trit::format::open(path).unwrap();
        let toks = prompt(40, files.config.vocab, 13);
        let mut opts = CudaOptions::new(64);
        opts.prefill_chunk = 16;
        opts.deltanet_chunk = dn_chunk;
        let (gpu_err, cpu_int8_err) = compare_with(path, &toks, 8, &opts);
        let what = format!("{} (chunk recurrence: {dn_chunk})", path.display());
        check(&format!("batched prompt {what}"), (gpu_err, cpu_int8_err));

        let batched = load_model(&files, &opts).unwrap();
        opts.prefill = false;
        let stepwise = load_model(&files, &opts).unwrap();
        let (mut a, mut b) = (batched.new_cache(64), stepwise.new_cache(64));
        let mut la = batched.forward(&toks, &mut a, Logits::Last).unwrap();
        let mut lb = stepwise.forward(&toks, &mut b, Logits::Last).unwrap();
        assert!(la != lb, "{what}: the prompt did not take the batched path");
        let mut worst = rel_err(&la, &lb);
        for _ in 0..8 {
            let t = argmax(&lb);
            la = batched.forward(&[t], &mut a, Logits::Last).unwrap();
            lb = stepwise.forward(&[t], &mut b, Logits::Last).unwrap();
            worst = worst.max(rel_err(&la, &lb));
        }
        // A rewind to position 30 replays 30 tokens plus the new one through the chunks.
        a.truncate(30);
        b.truncate(30);
        let ra = batched
            .forward(&toks[30..31], &mut a, Logits::Last)
            .unwrap();
        let rb = stepwise
            .forward(&toks[30..31], &mut b, Logits::Last)
            .unwrap();
        worst = worst.max(rel_err(&ra, &rb));
        eprintln!(
            "{}: batched vs token path, worst relative error {worst:.2e}",
            path.display()
        );
        assert!(
            worst <= cpu_int8_err + 1e-3,
            "{}: {worst} (cpu int8 {cpu_int8_err})",
            path.display()
        );
    }
}

/// The rotated tiny-prism in both containers: GGUF (one block and sign vector per width,
/// ssm_out's columns in grouped order under tiled value heads, tied head) and the MLX pack
/// (per-module signs, embedding rows rounded to f16 around the inverse rotation). Same prompt,
/// steps and error rule as the unrotated model.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_prism_logits_match_the_cpu_in_gguf_and_mlx() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = preset_models("tiny-prism", dir.path(), 3, &["q2_0", "mlx"]);
    for path in &paths {
        let files = trit::format::open(path).unwrap();
        assert!(
            files.rotation.is_some(),
            "{} without its rotation",
            path.display()
        );
        // Rotated inputs of the fused projections normalized and rotated in the streaming
        // GEMV's prologue (the default), and by a separate `hadamard_quant` launch.
        for in_prologue in [true, false] {
            let mut opts = CudaOptions::new(64);
            opts.rotation_in_prologue = in_prologue;
            let errs = compare_with(path, &prompt(12, p.vocab, 1), 8, &opts);
            let what = format!(
                "{} (rotation in the prologue: {in_prologue})",
                path.display()
            );
            check(&format!("tiny-prism {what}"), errs);
        }
        // The two paths sum Σx² in different orders: bit-equal logits would mean the prologue
        // path never ran.
        let toks = prompt(12, p.vocab, 1);
        let logits = |in_prologue: bool| {
            let mut opts = CudaOptions::new(64);
            opts.rotation_in_prologue = in_prologue;
            let model = load_model(&files, &opts).unwrap();
            let mut cache = model.new_cache(64);
            // Decode steps after the prompt: the prompt itself takes the batched path.
            let mut l = model.forward(&toks, &mut cache, Logits::Last).unwrap();
            for _ in 0..2 {
                l = model
                    .forward(&[argmax(&l)], &mut cache, Logits::Last)
                    .unwrap();
            }
            l
        };
        assert!(
            logits(true) != logits(false),
            "{}: the rotation never ran in the GEMV's prologue",
            path.display()
        );
    }
}

/// 16 greedy tokens of the rotated model equal on CPU and GPU (rule as for tiny-qwen35).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_prism_greedy_tokens_match_the_cpu() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, paths) = preset_models("tiny-prism", dir.path(), 5, &["q2_0", "mlx"]);
    for path in &paths {
        let files = trit::format::open(path).unwrap();
        greedy_tokens_agree(&files, &prompt(9, p.vocab, 4), 64);
    }
}

/// Values in [−scale, scale), different per seed.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    prompt(n, 20001, seed)
        .iter()
        .map(|&v| (v as f32 / 10000.0 - 1.0) * scale)
        .collect()
}

/// The GPU's `H_B(s ⊙ x)` against the CPU's (`s ⊙ x`, then `fwht_blocks`) on the 27B's rotated
/// widths (hidden 5120, attention/ssm_out input 6144, ffn_down input 17408, block 1024) and
/// the other block sizes Bonsai 2 packs use (512, 4096, 8192): the butterflies are the CPU's
/// operations in its order, so the values agree to rounding; the int8 blocks equal the CPU's
/// quantization of the CPU's values (a code may differ by one where a value sits at a rounding
/// tie). The embedding's inverse `s ⊙ H_B(x)`, with and without the MLX pack's f16 rounding,
/// against `Rotations::unrotate_embedding`.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn hadamard_transform_matches_the_cpu() {
    use trit::format::rotation::{InputRotation, RotationSpec};
    use trit::kernels::hadamard::fwht_blocks;
    use trit::model::rotation::Rotations;
    use trit_cuda::device::Gpu;
    use trit_cuda::repack::quantize_activations;
    use trit_cuda::rotation::rotate_once;
    if gpu_missing() {
        return;
    }
    let gpu = Gpu::open(0).unwrap();
    let cases = [
        (5120, 1024),
        (6144, 1024),
        (17408, 1024),
        (1024, 512),
        (8192, 4096),
        (16384, 8192),
    ];
    for (i, &(n, block)) in cases.iter().enumerate() {
        let seed = 100 + i as u64;
        let x = values(n, seed, 3.0);
        let signs: Vec<f32> = prompt(n, 2, seed + 50)
            .iter()
            .map(|&b| if b == 0 { -1.0 } else { 1.0 })
            .collect();
        let rot = InputRotation { block, signs };
        let mut want: Vec<f32> = x.iter().zip(&rot.signs).map(|(a, s)| a * s).collect();
        fwht_blocks(&mut want, block);
        let got = rotate_once(&gpu, &x, &rot, false, false).unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .values
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 1e-6 * scale,
            "{n}/{block}: values differ by {worst}"
        );
        let (q, meta) = quantize_activations(&want);
        let off = got.q.iter().zip(&q).filter(|(a, b)| a != b).count();
        let far = got
            .q
            .iter()
            .zip(&q)
            .any(|(a, b)| (*a as i32 - *b as i32).abs() > 1);
        assert!(
            !far && off <= n / 1000,
            "{n}/{block}: {off} int8 codes differ"
        );
        for (j, (g, c)) in got.meta.iter().zip(&meta).enumerate() {
            assert!(
                (g.0 - c.0).abs() <= 1e-6 * c.0.abs(),
                "{n}/{block}: scale {j}"
            );
            assert!(
                (g.1 - c.1).abs() <= 2.0 * c.0.abs() + 1e-6 * c.1.abs(),
                "{n}/{block}: sum {j}"
            );
        }

        for round_f16 in [false, true] {
            let spec = RotationSpec {
                embedding: Some(std::sync::Arc::new(rot.clone())),
                embedding_f16: round_f16,
                ..RotationSpec::default()
            };
            let mut want = x.clone();
            Rotations::new(Some(spec)).unrotate_embedding(&mut want);
            let got = rotate_once(&gpu, &x, &rot, true, round_f16).unwrap();
            let worst = got
                .values
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            // f16 rounding of values equal to rounding may still land one f16 step apart.
            let tol = if round_f16 {
                1e-3 * scale
            } else {
                1e-6 * scale
            };
            assert!(
                worst <= tol,
                "{n}/{block} embedding (f16 {round_f16}): {worst}"
            );
        }
    }
}

/// What one sequence of the batched test feeds per call (empty: not in that call).
struct Feeds {
    calls: Vec<Vec<u32>>,
}

/// The server's continuous batching on the hybrid: four sequences in one call (prompts of 40,
/// 23 and 9 tokens and a one-token one, which joins the batched step at position 0), then
/// steps of four rows (the batched GEMM step; the LM head as one GEMM over the rows, or with
/// TRIT_CUDA_HEAD_PER_ROW=1 one GEMV per row; with one GEMM, the attention of the rows by
/// `hybrid_attn_step*_slots`, with one GEMV per row by its prep and decode kernels), two of two
/// rows (the single step on each
/// row's slot), and a sequence that ends while a new one takes its slot (its state zeroed).
/// Every call's logits must be those of the same sequence run alone through the single path,
/// within the CPU int8 path's error against the f32 reference; a continuation the slot's state
/// does not stand at is refused.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn batched_sequences_match_each_alone() {
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, mut paths) = tiny_models(&dir.path().join("plain"), 21, &["q2_0"]);
    let (_, rotated) = preset_models("tiny-prism", &dir.path().join("prism"), 22, &["q2_0"]);
    paths.extend(rotated);
    for (path, head_rows) in paths.iter().flat_map(|p| [(p, false), (p, true)]) {
        std::env::set_var("TRIT_CUDA_HEAD_PER_ROW", if head_rows { "1" } else { "0" });
        let files = trit::format::open(path).unwrap();
        let vocab = files.config.vocab;
        let what = format!(
            "{} (head per row, and the rows' attention by prep + decode: {head_rows})",
            path.display()
        );
        let mut opts = CudaOptions::new(96);
        opts.prefill_chunk = 16;
        opts.hybrid_attn_slots = !head_rows;
        let (_, cpu_int8_err) = compare_with(path, &prompt(40, vocab, 23), 2, &opts);
        let batched = load_model(&files, &opts).unwrap();
        assert!(
            batched.max_sequences() >= 4,
            "{what}: {}",
            batched.max_sequences()
        );
        // Calls 0..13: A, B, C, D start at call 0; C ends after call 6; E starts at call 9.
        let tok = |seed: u64, n: usize| prompt(n, vocab, seed);
        let mut seqs: Vec<Feeds> = Vec::new();
        for (i, (start, first, end)) in
            [(0, 40, 13), (0, 23, 13), (0, 1, 7), (0, 9, 13), (9, 12, 13)]
                .into_iter()
                .enumerate()
        {
            let calls = (0..13)
                .map(|c| match c {
                    c if c < start || c >= end => Vec::new(),
                    c if c == start => tok(100 + i as u64, first),
                    // Calls 7 and 8: only A and B (two rows: the single step per slot).
                    7 | 8 if i >= 2 => Vec::new(),
                    c => tok(1000 + 10 * i as u64 + c as u64, 1),
                })
                .collect();
            seqs.push(Feeds { calls });
        }
        // D and E pause at calls 7 and 8 too (the filter above); E starts at 9.
        let mut caches: Vec<Option<trit::model::KvCache>> = (0..seqs.len()).map(|_| None).collect();
        let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); seqs.len()];
        for call in 0..13 {
            let live: Vec<usize> = (0..seqs.len())
                .filter(|&i| !seqs[i].calls[call].is_empty())
                .collect();
            for (i, c) in caches.iter_mut().enumerate() {
                let started = seqs[i].calls[..call].iter().any(|f| !f.is_empty());
                let ended = started && seqs[i].calls[call..].iter().all(|f| f.is_empty());
                if ended {
                    *c = None; // The slot goes back to the pool.
                } else if c.is_none() && live.contains(&i) {
                    *c = Some(batched.new_cache(96));
                }
            }
            let mut refs: Vec<&mut trit::model::KvCache> = Vec::new();
            let mut order = Vec::new();
            for (i, c) in caches.iter_mut().enumerate() {
                if let (Some(c), true) = (c.as_mut(), live.contains(&i)) {
                    refs.push(c);
                    order.push(i);
                }
            }
            let mut batch: Vec<trit::model::BatchSeq<'_>> = refs
                .into_iter()
                .zip(&order)
                .map(|(c, &i)| trit::model::BatchSeq {
                    tokens: &seqs[i].calls[call],
                    cache: c,
                    logits: Logits::Last,
                })
                .collect();
            let out = batched.forward_batch(&mut batch).unwrap();
            for (l, &i) in out.into_iter().zip(&order) {
                assert_eq!(l.len(), vocab, "{what}: call {call}");
                got[i].push(l);
            }
        }
        // Each sequence alone through the single path, call by call.
        let alone = load_model(&files, &opts).unwrap();
        let mut worst = 0f64;
        let mut identical = 0;
        for (i, s) in seqs.iter().enumerate() {
            let mut c = alone.new_cache(96);
            let feeds: Vec<&Vec<u32>> = s.calls.iter().filter(|f| !f.is_empty()).collect();
            assert_eq!(feeds.len(), got[i].len());
            for (f, g) in feeds.into_iter().zip(&got[i]) {
                let want = alone.forward(f, &mut c, Logits::Last).unwrap();
                worst = worst.max(rel_err(g, &want));
                identical += usize::from(*g == want);
            }
        }
        let total: usize = got.iter().map(|g| g.len()).sum();
        eprintln!("{what}: batched vs alone, worst relative error {worst:.2e}, {identical} of {total} rows identical");
        assert!(
            worst <= cpu_int8_err + 1e-3,
            "{what}: {worst} (cpu int8 {cpu_int8_err})"
        );
        assert!(identical < total, "{what}: no row took the batched step");
        // A sequence cut back cannot continue: its slot's state is further on.
        let mut c = batched.new_cache(96);
        let p = prompt(20, vocab, 7);
        let mut b = [trit::model::BatchSeq {
            tokens: &p,
            cache: &mut c,
            logits: Logits::Last,
        }];
        batched.forward_batch(&mut b).unwrap();
        c.truncate(10);
        let one = [p[10]];
        let mut b = [trit::model::BatchSeq {
            tokens: &one,
            cache: &mut c,
            logits: Logits::Last,
        }];
        let e = batched.forward_batch(&mut b).unwrap_err().to_string();
        assert!(e.contains("cannot be cut back"), "{what}: {e}");
    }
    std::env::remove_var("TRIT_CUDA_HEAD_PER_ROW");
}

/// Embeddings of a hybrid on the GPU (`ExternalNet::hidden_states`: the prompt path on a
/// scratch recurrent state and KV cache, the final norm in f32) are the CPU's for each pooling,
/// across prompt chunks (16 tokens each here), plain and rotated (tiny-prism): as close to the
/// CPU's exact (f32) path as its int8 path is (the tiny hybrids' int8 paths drift: `check`;
/// on the H200 1 − cosine of the mean 1.22e-2 against the CPU int8 path's 1.20e-2);
/// and a sequence decoding on the GPU goes on with the logits it has without one in between.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn hidden_states_match_the_cpu_and_leave_the_sequence_alone() {
    use trit::engine::{embed, Pooling};
    if gpu_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (p, plain) = tiny_models(&dir.path().join("plain"), 6, &["q2_0"]);
    let (_, rotated) = preset_models("tiny-prism", &dir.path().join("prism"), 7, &["q2_0"]);
    for path in [&plain[0], &rotated[0]] {
        let files = trit::format::open(path).unwrap();
        let cpu = trit::model::Model::load(&files, 2).unwrap();
        let mut opts = CudaOptions::new(64);
        opts.prefill_chunk = 16;
        let gpu = load_model(&files, &opts).unwrap();
        let toks = prompt(40, p.vocab, 9);
        let cosine = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
        };
        for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
            let g = embed(&gpu, &toks, pooling).unwrap();
            let (exact, int8) = {
                let _lock = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
                let fast = trit::kernels::level();
                trit::kernels::set_level(trit::kernels::KernelLevel::Reference).unwrap();
                let exact = embed(&cpu, &toks, pooling).unwrap();
                trit::kernels::set_level(fast).unwrap();
                (exact, embed(&cpu, &toks, pooling).unwrap())
            };
            let (gpu_off, cpu_off) = (1.0 - cosine(&g, &exact), 1.0 - cosine(&int8, &exact));
            eprintln!(
                "{} {pooling:?}: 1 - cosine vs f32: gpu {gpu_off:.2e}, cpu int8 {cpu_off:.2e}",
                path.display()
            );
            assert!(
                gpu_off <= 2.0 * cpu_off + 1e-4 && gpu_off < 0.05,
                "{} {pooling:?}: gpu {gpu_off} cpu int8 {cpu_off}",
                path.display()
            );
        }
        embedding_leaves_the_sequence_alone(&gpu, &toks, &path.display().to_string());
    }
}
