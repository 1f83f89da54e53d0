//! The GPU's GEMV and GEMM kernels against CPU emulations of their arithmetic: the fused
//! register GEMV for every variant, the streaming GEMV (plain, SwiGLU, its RMSNorm and Bonsai 2
//! rotation prologues) and the prefill's tensor-core GEMM on ragged shapes.
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]` (CI has none). Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_kernels -- --ignored --test-threads 1
//! (or the carried test binary with `--ignored --test-threads 1`). Without a driver each test
//! prints why it is skipped.

mod common;
use common::*;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_kernel_matches_its_cpu_emulation_for_every_variant() {
    if gpu_missing() {
        return;
    }
    use trit::quant::ternary::{encode_matrix, GgmlTernary};
    use trit::quant::GgmlType;
    use trit_cuda::repack::{gemv_reference, pack, quantize_activations};
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    // 8256 columns: 129 blocks, 5 lane-steps (so 1, 2 and 4 warps per row group all run, with
    // a partial last step); 37 rows: the last group of every R is partial.
    let (rows, cols) = (37, 8256);
    let codes: Vec<u8> = prompt(rows * cols, 3, 7).iter().map(|&c| c as u8).collect();
    let scales: Vec<f32> = prompt(rows * cols / 64, 1000, 8)
        .iter()
        .map(|&v| half::f16::from_f32(0.01 + v as f32 * 1e-4).to_f32())
        .collect();
    let bytes = encode_matrix(GgmlType::Q2_0, rows, cols, &codes, &scales).unwrap();
    let m = pack(&[&GgmlTernary::new(GgmlType::Q2_0, &bytes, rows, cols).unwrap()]).unwrap();
    let x: Vec<f32> = prompt(cols, 20001, 9)
        .iter()
        .map(|&v| v as f32 / 10000.0 - 1.0)
        .collect();
    let (q, meta) = quantize_activations(&x);
    let want = gemv_reference(&m, &q, &meta);
    for r in [2, 4, 8] {
        for split in [1, 2, 4] {
            let got = trit_cuda::gemv::ternary_gemv_once(&gpu, &m, &q, &meta, r, split).unwrap();
            let err = rel_err(&got, &want);
            assert!(err < 1e-5, "R={r} split={split}: {err}");
            let fused =
                trit_cuda::gemv::ternary_gemv_fused_once(&gpu, &m, &q, &meta, r, split, false)
                    .unwrap();
            let err = rel_err(&fused, &want);
            assert!(err < 1e-5, "fused R={r} split={split}: {err}");
        }
    }
    // 181 blocks: 6 lane-steps, the last partial, which 3 warps per row group share.
    let m3 = random_q2_0(37, 11584, (21, 22));
    let x3: Vec<f32> = prompt(11584, 20001, 23)
        .iter()
        .map(|&v| v as f32 / 10000.0 - 1.0)
        .collect();
    let (q3, meta3) = quantize_activations(&x3);
    let want3 = gemv_reference(&m3, &q3, &meta3);
    for r in [2, 4, 8] {
        let got = trit_cuda::gemv::ternary_gemv_once(&gpu, &m3, &q3, &meta3, r, 4).unwrap();
        let err = rel_err(&got, &want3);
        assert!(err < 1e-5, "R={r}, 3 warps: {err}");
    }
    // The fused SwiGLU epilogue: 74 rows = gate (37) ‖ up (37), so every R/2 leaves a partial
    // last group; silu(gate)·up from the emulated products.
    let (rows2, glu_cols) = (74, 8256);
    let codes2: Vec<u8> = prompt(rows2 * glu_cols, 3, 17)
        .iter()
        .map(|&c| c as u8)
        .collect();
    let scales2: Vec<f32> = prompt(rows2 * glu_cols / 64, 1000, 18)
        .iter()
        .map(|&v| half::f16::from_f32(0.01 + v as f32 * 1e-4).to_f32())
        .collect();
    let bytes2 = encode_matrix(GgmlType::Q2_0, rows2, glu_cols, &codes2, &scales2).unwrap();
    let gu = pack(&[&GgmlTernary::new(GgmlType::Q2_0, &bytes2, rows2, glu_cols).unwrap()]).unwrap();
    let both = gemv_reference(&gu, &q, &meta);
    let want_h: Vec<f32> = (0..rows2 / 2)
        .map(|i| {
            let g = both[i];
            g / (1.0 + (-g).exp()) * both[rows2 / 2 + i]
        })
        .collect();
    for r in [2, 4, 8] {
        for split in [1, 4] {
            let got =
                trit_cuda::gemv::ternary_gemv_fused_once(&gpu, &gu, &q, &meta, r, split, true)
                    .unwrap();
            let err = rel_err(&got, &want_h);
            assert!(err < 1e-5, "fused SwiGLU R={r} split={split}: {err}");
        }
    }
}

/// A random Q2_0 matrix repacked for the GPU (f16 scales), from the seeds of its codes and
/// scales.
fn random_q2_0(rows: usize, cols: usize, seeds: (u64, u64)) -> trit_cuda::repack::PackedTernary {
    use trit::quant::ternary::{encode_matrix, GgmlTernary};
    use trit::quant::GgmlType;
    let codes: Vec<u8> = prompt(rows * cols, 3, seeds.0)
        .iter()
        .map(|&c| c as u8)
        .collect();
    let scales: Vec<f32> = prompt(rows * cols / 64, 1000, seeds.1)
        .iter()
        .map(|&v| half::f16::from_f32(0.01 + v as f32 * 1e-4).to_f32())
        .collect();
    let bytes = encode_matrix(GgmlType::Q2_0, rows, cols, &codes, &scales).unwrap();
    trit_cuda::repack::pack(&[&GgmlTernary::new(GgmlType::Q2_0, &bytes, rows, cols).unwrap()])
        .unwrap()
}

/// The reference GEMV's rows, or with `glu` the SwiGLU of its two halves.
fn reference_outputs(
    m: &trit_cuda::repack::PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    glu: bool,
) -> Vec<f32> {
    let both = trit_cuda::repack::gemv_reference(m, q, meta);
    if !glu {
        return both;
    }
    let half = m.rows / 2;
    (0..half)
        .map(|i| both[i] / (1.0 + (-both[i]).exp()) * both[half + i])
        .collect()
}

/// The streaming GEMV (weights staged in shared memory by cp.async) against the CPU emulation
/// for every rows-per-warp, with warp counts that leave groups unevenly spread
/// and 1, 2 or 4 warps per row group (the last two with empty items past the row's end): 129
/// blocks per row (a partial last lane-step), 37 rows (partial groups, and an odd
/// scale count, so the last f16 scale pair is half past the end), f16 and f32 scales, plain
/// and SwiGLU.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn streaming_gemv_matches_its_cpu_emulation() {
    if gpu_missing() {
        return;
    }
    use trit_cuda::gemv::{stream_smem_bytes, ternary_gemv_stream_once, StreamConfig};
    use trit_cuda::repack::{quantize_activations, PackedScales};
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let cols = 8256;
    let x: Vec<f32> = prompt(cols, 20001, 9)
        .iter()
        .map(|&v| v as f32 / 10000.0 - 1.0)
        .collect();
    let (q, meta) = quantize_activations(&x);
    for (rows, glu) in [(37, false), (74, true)] {
        let f16 = random_q2_0(rows, cols, (27, 28));
        assert!(matches!(f16.scales, PackedScales::F16(_)));
        // The same codes with scales an f16 cannot hold.
        let mut f32 = f16.clone();
        let scales: Vec<f32> = (0..rows)
            .flat_map(|r| (0..cols / 64).map(move |b| (r, b)))
            .map(|(r, b)| f16.scale(r, b) * 1.000_123)
            .collect();
        f32.scales = PackedScales::F32(scales);
        for m in [&f16, &f32] {
            let want = reference_outputs(m, &q, &meta, glu);
            for r in [2, 4, 8] {
                for (warps, split) in [(3, 1), (8, 1), (8, 2), (12, 4), (17, 1)] {
                    let cfg = StreamConfig {
                        warps,
                        split,
                        blocks_per_sm: 1,
                        ..StreamConfig::DEFAULT
                    };
                    if stream_smem_bytes(cols / 64, r, warps) > gpu.max_dyn_smem {
                        continue;
                    }
                    let got = ternary_gemv_stream_once(&gpu, m, &q, &meta, r, glu, cfg).unwrap();
                    let err = rel_err(&got, &want);
                    assert!(err < 1e-5, "{cfg:?} R={r} glu={glu}: {err}");
                }
            }
        }
    }
}

/// A residual row of `cols` values in [−2, 2), its RMSNorm weights in [0.5, 1.5) (from the
/// seeds) and 1 / RMS(x) computed in f64: what the streaming GEMV's prologue normalizes.
fn residual_row(cols: usize, eps: f32, seeds: (u64, u64)) -> (Vec<f32>, Vec<f32>, f32) {
    let x: Vec<f32> = prompt(cols, 20001, seeds.0)
        .iter()
        .map(|&v| v as f32 / 5000.0 - 2.0)
        .collect();
    let gamma: Vec<f32> = prompt(cols, 1001, seeds.1)
        .iter()
        .map(|&v| 0.5 + v as f32 / 1000.0)
        .collect();
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
    (x, gamma, (1.0 / (ms + eps as f64).sqrt()) as f32)
}

/// The streaming shapes (warps, warps per row group) of `pairs`, one block per multiprocessor
/// and 4 rows per warp, whose shared memory (plus `extra` bytes) fits for `cols` columns.
fn shapes_that_fit(
    gpu: &trit_cuda::device::Gpu,
    cols: usize,
    extra: usize,
    pairs: &[(u32, u32)],
) -> Vec<trit_cuda::gemv::StreamConfig> {
    use trit_cuda::gemv::{stream_smem_bytes, StreamConfig};
    pairs
        .iter()
        .filter(|&&(warps, _)| stream_smem_bytes(cols / 64, 4, warps) + extra <= gpu.max_dyn_smem)
        .map(|&(warps, split)| StreamConfig {
            warps,
            split,
            blocks_per_sm: 1,
            ..StreamConfig::DEFAULT
        })
        .collect()
}

/// The streaming GEMV's prologue on the residual stream (q‖k‖v, gate‖up): RMSNorm with γ, int8
/// quantization, then the product — against the CPU doing the same in f64 + the reference
/// GEMV. 8,256 columns: wider than the values a block keeps in registers at 3 and 16 warps,
/// so the loop over the rest runs too.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn streaming_gemv_normalizes_its_input_like_the_cpu() {
    if gpu_missing() {
        return;
    }
    use trit_cuda::gemv::ternary_gemv_stream_norm_once;
    use trit_cuda::repack::quantize_activations;
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let (cols, eps) = (8256, 1e-6f32);
    let (x, gamma, inv) = residual_row(cols, eps, (31, 32));
    let normed: Vec<f32> = x.iter().zip(&gamma).map(|(&v, &g)| v * inv * g).collect();
    let (q, meta) = quantize_activations(&normed);
    for (rows, glu) in [(37, false), (74, true)] {
        let m = random_q2_0(rows, cols, (33, 34));
        let want = reference_outputs(&m, &q, &meta, glu);
        for cfg in shapes_that_fit(&gpu, cols, 0, &[(3, 1), (16, 1), (12, 4), (17, 1)]) {
            let got = ternary_gemv_stream_norm_once(&gpu, &m, &x, &gamma, eps, None, 4, glu, cfg)
                .unwrap();
            // The block sum's order differs from the CPU's, which may move a value across an
            // int8 rounding boundary: a few codes one apart, not a wrong γ or block.
            let err = rel_err(&got, &want);
            assert!(err < 2e-3, "{cfg:?} glu={glu}: {err}");
        }
    }
}

/// The streaming GEMV's prologue with Bonsai 2's rotation (FG_IN_NORM_ROT): RMSNorm with γ,
/// the ±1 signs, the Walsh–Hadamard transform per block, int8, then the product — against the
/// CPU's `fwht_blocks_scalar` on the same normalized values and the reference GEMV. 5,120
/// columns in blocks of 1,024 (the 27B's) and of 512; 3 warps leave most values to the
/// prologue's loop, 16 keep them in registers.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn streaming_gemv_rotates_its_input_like_the_cpu() {
    if gpu_missing() {
        return;
    }
    use trit::kernels::hadamard::fwht_blocks_scalar;
    use trit_cuda::gemv::ternary_gemv_stream_norm_once;
    use trit_cuda::repack::quantize_activations;
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    let (cols, eps) = (5120, 1e-6f32);
    let (x, gamma, inv) = residual_row(cols, eps, (41, 42));
    let signs: Vec<f32> = prompt(cols, 2, 43)
        .iter()
        .map(|&v| if v == 0 { -1.0 } else { 1.0 })
        .collect();
    for block in [1024, 512] {
        let mut rotated: Vec<f32> = x
            .iter()
            .zip(&gamma)
            .zip(&signs)
            .map(|((&v, &g), &s)| v * inv * g * s)
            .collect();
        fwht_blocks_scalar(&mut rotated, block);
        let (q, meta) = quantize_activations(&rotated);
        for (rows, glu) in [(37, false), (74, true)] {
            let m = random_q2_0(rows, cols, (44, 45));
            let want = reference_outputs(&m, &q, &meta, glu);
            for cfg in shapes_that_fit(&gpu, cols, 4 * cols, &[(3, 1), (16, 1), (17, 1)]) {
                let rot = Some((&signs[..], block));
                let got =
                    ternary_gemv_stream_norm_once(&gpu, &m, &x, &gamma, eps, rot, 4, glu, cfg)
                        .unwrap();
                // Σx² is summed in another order than the CPU's (see the test above).
                let err = rel_err(&got, &want);
                assert!(err < 2e-3, "block {block} {cfg:?} glu={glu}: {err}");
            }
        }
    }
}

/// The prefill GEMM equals the CPU emulation of the GEMV's arithmetic token by token, on
/// ragged shapes: token counts not a multiple of the 64-token tile, rows not a multiple of
/// the 128-row tile, rows shorter than one tile, column blocks not a multiple of a pipeline
/// stage (8256 = 129 blocks).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_kernel_matches_its_cpu_emulation_on_ragged_shapes() {
    if gpu_missing() {
        return;
    }
    let gpu = trit_cuda::device::Gpu::open(0).unwrap();
    for (i, (rows, cols, ntok)) in [
        (37, 8256, 1),
        (200, 128, 7),
        (130, 640, 65),
        (300, 192, 130),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 100 + 10 * i as u64;
        let GemmCase { m, q, meta, want } = gemm_case(rows, cols, ntok, seed);
        {
            let got = trit_cuda::gemm::ternary_gemm_once(&gpu, &m, &q, &meta).unwrap();
            check_gemm_tokens(&got, &want, rows, ntok, &format!("{rows}x{cols}"));
        }
    }
}
