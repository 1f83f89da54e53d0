//! Ternary kernels at every level this CPU supports against the scalar references, on random
//! matrices of awkward shapes (row counts that are not a multiple of the 16-row tile, code 3
//! present, zero and tiny activation blocks).

#![allow(clippy::needless_range_loop)] // index loops mirror the formulas being checked

use super::scalar::ternary_matmul_int8_model;
use super::ternary::Scales;
use super::*;
use crate::quant::TernaryRows;

/// Deterministic pseudo-random numbers (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

struct RandomRows {
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
}

impl RandomRows {
    /// Codes mostly in {0,1,2} with ~4 % code 3; f16-exact scales unless `f32_scales`.
    fn new(rows: usize, cols: usize, seed: u64, f32_scales: bool) -> Self {
        let mut rng = Rng(seed);
        let codes = (0..rows * cols)
            .map(|_| match rng.next() % 100 {
                0..=3 => 3,
                v => (v % 3) as u8,
            })
            .collect();
        let scales = (0..rows * cols / 64)
            .map(|_| {
                let s = 0.01 + 0.1 * rng.f32().abs();
                let s = if rng.next().is_multiple_of(5) { -s } else { s };
                if f32_scales {
                    s
                } else {
                    half::f16::from_f32(s).to_f32()
                }
            })
            .collect();
        RandomRows {
            rows,
            cols,
            codes,
            scales,
        }
    }

    /// One scale per `blocks` consecutive 64-column blocks of a row (as PQ2_0's 128-column and
    /// TQ2_0/TQ1_0's 256-column scales); the last group of a row may be shorter.
    fn grouped(mut self, blocks: usize) -> Self {
        let per_row = self.cols / 64;
        for row in self.scales.chunks_mut(per_row) {
            for b in 0..per_row {
                row[b] = row[b / blocks * blocks];
            }
        }
        self
    }

    fn weight(&self, r: usize, k: usize) -> f32 {
        self.scales[r * self.cols / 64 + k / 64] * (self.codes[r * self.cols + k] as f32 - 1.0)
    }
}

impl TernaryRows for RandomRows {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        codes.copy_from_slice(&self.codes[r * self.cols..(r + 1) * self.cols]);
        scales.copy_from_slice(&self.scales[r * self.cols / 64..(r + 1) * self.cols / 64]);
    }
}

/// Activations with per-block magnitudes from 1e-3 to 10, and one all-zero block.
fn activations(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut x: Vec<f32> = (0..n * cols)
        .map(|i| {
            let mag = [1e-3, 0.1, 1.0, 10.0][(i / 64) % 4];
            rng.f32() * mag
        })
        .collect();
    if n * cols >= 128 {
        x[64..128].fill(0.0);
    }
    x
}

const SHAPES_ROWS: [usize; 3] = [1, 17, 45];
const SHAPES_COLS: [usize; 4] = [64, 192, 576, 2048];
const SHAPES_N: [usize; 5] = [1, 3, 6, 8, 17];

#[test]
fn repack_round_trips_codes_and_scales() {
    for (rows, cols, f32s) in [(17, 192, false), (33, 64, true), (1, 576, false)] {
        let src = RandomRows::new(rows, cols, 7, f32s);
        let m = TernaryMatrix::from_rows(&src).unwrap();
        assert_eq!((m.rows(), m.cols()), (rows, cols));
        assert_eq!(matches!(m.scales, Scales::F16(_)), !f32s);
        let scale_bytes = if f32s { 4 } else { 2 };
        let tiles = rows.div_ceil(16);
        assert_eq!(m.bytes(), tiles * 16 * (cols / 4 + cols / 64 * scale_bytes));
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut row);
            for k in 0..cols {
                assert_eq!(row[k].to_bits(), src.weight(r, k).to_bits(), "r={r} k={k}");
            }
        }
    }
    // Scales shared by 2 or 4 blocks are stored once per group (the last group may be short).
    for (cols, group, shift) in [
        (576, 2, 1),
        (576, 4, 2),
        (192, 4, 2),
        (2048, 4, 2),
        (256, 2, 1),
    ] {
        let src = RandomRows::new(20, cols, 5, false).grouped(group);
        let m = TernaryMatrix::from_rows(&src).unwrap();
        assert_eq!(m.scale_shift(), shift, "{cols} columns, groups of {group}");
        let groups = (cols / 64).div_ceil(group);
        assert_eq!(m.bytes(), 2 * 16 * (cols / 4 + groups * 2));
        let mut row = vec![0f32; cols];
        for r in 0..20 {
            m.dequantize_row(r, &mut row);
            for k in 0..cols {
                assert_eq!(row[k].to_bits(), src.weight(r, k).to_bits(), "r={r} k={k}");
            }
        }
    }
}

#[test]
fn bad_sources_are_refused() {
    let err = TernaryMatrix::from_rows(&RandomRows::new(2, 100, 1, false)).err();
    assert!(matches!(err, Some(crate::Error::Unsupported(_))), "{err:?}");
    let err = TernaryMatrix::from_rows(&RandomRows::new(0, 64, 1, false)).err();
    assert!(err.is_some());
    let mut bad = RandomRows::new(20, 128, 1, false);
    bad.codes[19 * 128 + 77] = 4;
    let msg = TernaryMatrix::from_rows(&bad).err().unwrap().to_string();
    assert!(msg.contains("row 19") && msg.contains("column 77"), "{msg}");
}

#[test]
fn reference_level_is_exact_f32_math() {
    let pool = ThreadPool::new(2);
    for rows in SHAPES_ROWS {
        for cols in SHAPES_COLS {
            for n in [1, 3] {
                let src = RandomRows::new(rows, cols, (rows * cols + n) as u64, false);
                let m = TernaryMatrix::from_rows(&src).unwrap();
                let x = activations(n, cols, 11);
                let mut y = vec![f32::NAN; n * rows];
                m.matmul_at(KernelLevel::Reference, &pool, &x, n, &mut y);
                let mut yq = vec![f32::NAN; n * rows];
                let xq = ActQ8::quantize(&x, n, cols);
                m.matmul_q8_at(KernelLevel::Reference, &pool, &xq, &mut yq);
                assert_eq!(y, yq, "Reference matmul_q8 must use the exact activations");
                for t in 0..n {
                    for r in 0..rows {
                        let (mut e, mut mag) = (0f64, 0f64);
                        for k in 0..cols {
                            let p = src.weight(r, k) as f64 * x[t * cols + k] as f64;
                            e += p;
                            mag += p.abs();
                        }
                        // f32 accumulation of `cols` products: a few ulps of the magnitude.
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - e).abs() <= 1e-6 * mag + 1e-30,
                            "{rows}x{cols} t={t} r={r}"
                        );
                    }
                }
            }
        }
    }
}

/// Every integer level against (a) the exact integer model (only f32 rounding may differ) and
/// (b) the exact f32 product, within the int8 quantization bound `Σ_k |w_k| · d_x / 2` (rounding
/// to nearest moves each activation by at most half a step).
#[test]
fn integer_levels_match_the_int8_model_and_the_quantization_bound() {
    let pool = ThreadPool::new(2);
    let levels: Vec<_> = KernelLevel::available()
        .into_iter()
        .filter(|&l| l != KernelLevel::Reference)
        .collect();
    eprintln!("integer levels tested on this CPU: {levels:?}");
    assert!(levels.contains(&KernelLevel::Portable));
    for rows in SHAPES_ROWS {
        for cols in SHAPES_COLS {
            for n in SHAPES_N {
                let seed = (rows * 1000 + cols * 10 + n) as u64;
                let group = 1 << (seed % 3);
                let src = RandomRows::new(rows, cols, seed, seed.is_multiple_of(2)).grouped(group);
                assert!(src.codes.contains(&3));
                let m = TernaryMatrix::from_rows(&src).unwrap();
                let x = activations(n, cols, seed + 1);
                let xq = ActQ8::quantize(&x, n, cols);
                let model = ternary_matmul_int8_model(&m, &xq);
                let blocks = cols / 64;
                for &l in &levels {
                    let mut y = vec![f32::NAN; n * rows];
                    m.matmul_at(l, &pool, &x, n, &mut y);
                    let mut yq = vec![f32::NAN; n * rows];
                    m.matmul_q8_at(l, &pool, &xq, &mut yq);
                    assert_eq!(y, yq, "{l}: matmul and matmul_q8 differ");
                    for t in 0..n {
                        for r in 0..rows {
                            let got = y[t * rows + r] as f64;
                            // (a) model: per-block terms summed in f32 (blocks + a few roundings).
                            let mut mag = 0f64;
                            let mut exact = 0f64;
                            let mut qbound = 0f64;
                            for k in 0..cols {
                                let w = src.weight(r, k) as f64;
                                mag += (w * xq.dequantized(t, k) as f64).abs();
                                exact += w * x[t * cols + k] as f64;
                                qbound += w.abs() * xq.d[t * blocks + k / 64] as f64 / 2.0;
                            }
                            let want = model[t * rows + r];
                            let tol = (blocks as f64 + 4.0) * 1.2e-7 * mag + 1e-30;
                            assert!(
                                (got - want).abs() <= tol,
                                "{l} {rows}x{cols} n={n} t={t} r={r}: {got} vs model {want} (tol {tol})"
                            );
                            // (b) quantization bound against the exact product.
                            let tol = qbound * 1.0001 + 2.0 * tol;
                            assert!(
                                (got - exact).abs() <= tol,
                                "{l} {rows}x{cols} n={n} t={t} r={r}: {got} vs exact {exact} (bound {tol})"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let src = RandomRows::new(100, 576, 3, false);
    let m = TernaryMatrix::from_rows(&src).unwrap();
    let x = activations(5, 576, 4);
    for l in KernelLevel::available() {
        let mut base = vec![0f32; 500];
        m.matmul_at(l, &ThreadPool::new(1), &x, 5, &mut base);
        for threads in [2, 3, 8] {
            let mut y = vec![0f32; 500];
            m.matmul_at(l, &ThreadPool::new(threads), &x, 5, &mut y);
            assert_eq!(base, y, "{l} with {threads} threads");
        }
    }
}

#[test]
fn linear_dispatches_to_both_kinds() {
    let pool = ThreadPool::new(2);
    let src = RandomRows::new(3, 64, 9, false);
    let tm = TernaryMatrix::from_rows(&src).unwrap();
    let mut dense = vec![0f32; 3 * 64];
    for r in 0..3 {
        tm.dequantize_row(r, &mut dense[r * 64..(r + 1) * 64]);
    }
    let t = Linear::Ternary(tm);
    let d = Linear::Dense(DenseMatrix::new(3, 64, dense.clone()));
    assert_eq!((t.rows(), t.cols(), d.rows(), d.cols()), (3, 64, 3, 64));
    let mut row = vec![0f32; 64];
    t.dequantize_row(2, &mut row);
    assert_eq!(row, dense[128..]);
    d.dequantize_row(2, &mut row);
    assert_eq!(row, dense[128..]);
    let x = activations(2, 64, 5);
    let (mut yt, mut yd) = (vec![0f32; 6], vec![0f32; 6]);
    t.forward(&pool, &x, 2, &mut yt);
    d.forward(&pool, &x, 2, &mut yd);
    for (a, b) in yt.iter().zip(&yd) {
        // Both within int8 error of each other at any level (|x| ≤ 10, 64 terms, |w| ≤ 0.22).
        assert!((a - b).abs() <= 64.0 * 0.22 * 10.0 / 127.0, "{a} vs {b}");
    }
}

/// Prefills long and wide enough to take several token blocks (`ternary::token_blocks`: 8
/// tokens per block at 6144 columns, and a last partial group) give the int8 model's results
/// at every level.
#[test]
fn several_token_blocks_match_the_int8_model() {
    let pool = ThreadPool::new(2);
    let (rows, cols, n) = (20, 6144, 29);
    let src = RandomRows::new(rows, cols, 11, false).grouped(2);
    let m = TernaryMatrix::from_rows(&src).unwrap();
    let x = activations(n, cols, 12);
    let xq = ActQ8::quantize(&x, n, cols);
    let model = ternary_matmul_int8_model(&m, &xq);
    for l in KernelLevel::available() {
        if l == KernelLevel::Reference {
            continue;
        }
        let mut y = vec![f32::NAN; n * rows];
        m.matmul_q8_at(l, &pool, &xq, &mut y);
        for t in 0..n {
            for r in 0..rows {
                let mag: f64 = (0..cols)
                    .map(|k| (src.weight(r, k) as f64 * xq.dequantized(t, k) as f64).abs())
                    .sum();
                let (got, want) = (y[t * rows + r] as f64, model[t * rows + r]);
                let tol = (cols as f64 / 64.0 + 4.0) * 1.2e-7 * mag + 1e-30;
                assert!(
                    (got - want).abs() <= tol,
                    "{l} t={t} r={r}: {got} vs {want}"
                );
            }
        }
    }
}

/// Small-M shapes (2..=16 rows: `kernels/small_m.rs`) at every integer level, with values
/// chosen so that every float step is exact: unit weight scales, integer activations in
/// [-127, 127] with ±127 in every block (so d = 1 and q = x). The kernels' outputs must then
/// equal the integer dot products `Σ (code − 1)·q` exactly — as the int8 model computes them —
/// for every row count, including partial 8-row groups and rows past the tile.
#[test]
fn small_m_kernels_give_the_exact_integer_dot_products() {
    let pool = ThreadPool::new(2);
    for (rows, cols) in [(17, 192), (40, 576)] {
        let mut src = RandomRows::new(rows, cols, rows as u64, false);
        src.scales
            .iter_mut()
            .for_each(|s| *s = if *s < 0.0 { -1.0 } else { 1.0 });
        let m = TernaryMatrix::from_rows(&src).unwrap();
        for n in [2, 3, 7, 8, 9, 16] {
            let mut rng = Rng((n * cols) as u64);
            let mut x: Vec<f32> = (0..n * cols)
                .map(|_| (rng.next() % 255) as f32 - 127.0)
                .collect();
            for (i, blk) in x.chunks_exact_mut(64).enumerate() {
                blk[i % 64] = if i % 3 == 0 { -127.0 } else { 127.0 };
            }
            let xq = ActQ8::quantize(&x, n, cols);
            assert!(super::small_m::applies(&xq));
            assert!(xq.d.iter().all(|&d| d == 1.0));
            // The integer dot products, from the source rows directly.
            let want: Vec<f32> = (0..n * rows)
                .map(|i| {
                    let (t, r) = (i / rows, i % rows);
                    (0..cols)
                        .map(|k| src.weight(r, k) as f64 * x[t * cols + k] as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            let model: Vec<f32> = ternary_matmul_int8_model(&m, &xq)
                .iter()
                .map(|&v| v as f32)
                .collect();
            assert_eq!(model, want, "int8 model {rows}x{cols} n={n}");
            for l in KernelLevel::available() {
                if l == KernelLevel::Reference {
                    continue;
                }
                let mut y = vec![f32::NAN; n * rows];
                m.matmul_q8_at(l, &pool, &xq, &mut y);
                assert_eq!(y, want, "{l} {rows}x{cols} n={n}");
            }
        }
    }
}

/// Batch invariance: at every level, each row's result is bit-identical whether it is
/// multiplied alone (matvec), with 2..=16 other rows (small-M) or in a long prefill (GEMM), so a
/// sequence decodes the same tokens alone or batched with any others (sampling included).
#[test]
fn a_rows_result_does_not_depend_on_the_other_rows_of_the_call() {
    let pool = ThreadPool::new(2);
    for group in [1, 4] {
        let (rows, cols) = (33, 512);
        let src = RandomRows::new(rows, cols, 21 + group as u64, false).grouped(group);
        let m = TernaryMatrix::from_rows(&src).unwrap();
        let x = activations(20, cols, 22);
        for l in KernelLevel::available() {
            if l == KernelLevel::Reference {
                continue;
            }
            let alone: Vec<Vec<f32>> = (0..20)
                .map(|t| {
                    let mut y = vec![f32::NAN; rows];
                    m.matmul_at(l, &pool, &x[t * cols..(t + 1) * cols], 1, &mut y);
                    y
                })
                .collect();
            for n in [2, 8, 11, 16, 20] {
                let mut y = vec![f32::NAN; n * rows];
                m.matmul_at(l, &pool, &x[..n * cols], n, &mut y);
                for t in 0..n {
                    assert_eq!(
                        y[t * rows..(t + 1) * rows],
                        alone[t][..],
                        "{l} group {group}: row {t} of {n}"
                    );
                }
            }
        }
    }
}

/// q/k/v- and gate/up-style fused calls (one dispatch over the tiles of several matrices) give
/// bit-identical results to separate calls, for the matvec, small-M and prefill shapes, any
/// thread count, and matrices whose last tile is partial; a dense member runs on its own.
#[test]
fn fused_matmuls_equal_separate_calls() {
    let cols = 192;
    let mats: Vec<TernaryMatrix> = [40, 16, 7]
        .iter()
        .enumerate()
        .map(|(i, &rows)| {
            TernaryMatrix::from_rows(&RandomRows::new(rows, cols, 40 + i as u64, false)).unwrap()
        })
        .collect();
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [1, 2, 8, 13, 20] {
            let xq = ActQ8::quantize(&activations(n, cols, 50 + n as u64), n, cols);
            let separate: Vec<Vec<f32>> = mats
                .iter()
                .map(|m| {
                    let mut y = vec![f32::NAN; n * m.rows()];
                    m.matmul_q8(&pool, &xq, &mut y);
                    y
                })
                .collect();
            let mut outs: Vec<Vec<f32>> =
                mats.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
            let mut parts: Vec<(&TernaryMatrix, &mut [f32])> = mats
                .iter()
                .zip(outs.iter_mut())
                .map(|(m, y)| (m, &mut y[..]))
                .collect();
            TernaryMatrix::matmul_q8_fused(&pool, &xq, &mut parts);
            assert_eq!(outs, separate, "{threads} threads, n = {n}");
        }
    }
    // Through `Linear`, with a dense layer among the ternary ones.
    let pool = ThreadPool::new(2);
    let n = 8;
    let xq = {
        let mut a = ActQ8::new();
        a.quantize_from(&activations(n, cols, 60), n, cols, true);
        a
    };
    let dense_w: Vec<f32> = activations(5, cols, 61);
    let layers = [
        Linear::Ternary(TernaryMatrix::from_rows(&RandomRows::new(33, cols, 62, false)).unwrap()),
        Linear::Dense(DenseMatrix::new(5, cols, dense_w)),
        Linear::Ternary(TernaryMatrix::from_rows(&RandomRows::new(9, cols, 63, false)).unwrap()),
    ];
    let separate: Vec<Vec<f32>> = layers
        .iter()
        .map(|l| {
            let mut y = vec![f32::NAN; n * l.rows()];
            l.forward_q8(&pool, &xq, &mut y);
            y
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = layers
        .iter()
        .map(|l| vec![f32::NAN; n * l.rows()])
        .collect();
    let mut parts: Vec<(&Linear, &mut [f32])> = layers
        .iter()
        .zip(outs.iter_mut())
        .map(|(l, y)| (l, &mut y[..]))
        .collect();
    Linear::forward_q8_fused(&pool, &xq, &mut parts);
    assert_eq!(outs, separate);
}
