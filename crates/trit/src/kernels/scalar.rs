//! Scalar references: the ground truth every SIMD kernel is tested against.
//!
//! - `ternary_matmul_f32` is `KernelLevel::Reference`: exact dequantized weights times f32
//!   activations with f32 accumulation.
//! - `ternary_matmul_int8_model` states what the integer kernels compute, exactly: the int8
//!   activations of `ActQ8`, integer block sums, one scale product per block (in f64, so only
//!   the kernels' own float rounding separates them from it).

use super::act::ActQ8;
use super::ternary::TernaryMatrix;
use super::{ops, OutPtr};
use crate::threadpool::ThreadPool;

/// `y[t·rows + r] = Σ_k W[r][k] · x[t·cols + k]` with f32 weights from `dequantize_row`.
pub fn ternary_matmul_f32(
    m: &TernaryMatrix,
    pool: &ThreadPool,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let (rows, cols) = (m.rows(), m.cols());
    assert!(
        x.len() >= n * cols && y.len() >= n * rows,
        "ternary_matmul_f32: sizes"
    );
    let out = OutPtr::new(y);
    super::for_each_chunk(pool, rows, cols, &|range| {
        let mut w = vec![0f32; cols];
        for r in range {
            m.dequantize_row(r, &mut w);
            for t in 0..n {
                let v = ops::dot(&w, &x[t * cols..(t + 1) * cols]);
                // SAFETY: rows are split disjointly between the threads.
                unsafe { out.write(t * rows + r, &[v]) };
            }
        }
    });
}

/// The integer kernels' result in f64: `Σ_b s_w·d_x·(Σ code·q − Σ q)` (`n × rows`).
pub fn ternary_matmul_int8_model(m: &TernaryMatrix, xq: &ActQ8) -> Vec<f64> {
    let (rows, cols) = (m.rows(), m.cols());
    let blocks = cols / 64;
    let mut codes = vec![0u8; cols];
    let mut scales = vec![0f32; blocks];
    let mut y = vec![0f64; xq.n * rows];
    for r in 0..rows {
        m.row_codes(r, &mut codes, &mut scales);
        for t in 0..xq.n {
            let mut acc = 0f64;
            for b in 0..blocks {
                let cb = &codes[b * 64..(b + 1) * 64];
                let qb = &xq.qs[t * cols + b * 64..][..64];
                let dot_tq: i64 = cb
                    .iter()
                    .zip(qb)
                    .map(|(&c, &q)| (c as i64 - 1) * q as i64)
                    .sum();
                acc += scales[b] as f64 * xq.d[t * blocks + b] as f64 * dot_tq as f64;
            }
            y[t * rows + r] = acc;
        }
    }
    y
}
