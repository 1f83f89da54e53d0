//! `DenseMatrix`: f32 weights (any non-ternary tensor, dequantized at load) and their matrix
//! product. One generic kernel, compiled three times: portable, and under AVX2+FMA and AVX-512
//! target features so the same loops become fused multiply-adds on wide registers. Each weight
//! row is loaded once per group of 4 tokens.

use super::ops::reduce;
use super::{level, KernelLevel, OutPtr};
use crate::threadpool::ThreadPool;
use std::ops::Range;

/// Row-major f32 weights, `rows × cols`.
pub struct DenseMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl DenseMatrix {
    /// `data` holds `rows × cols` values, row-major.
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "DenseMatrix::new: {} values for {rows} × {cols}",
            data.len()
        );
        DenseMatrix { rows, cols, data }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// `y[t·rows + r] = Σ_k W[r][k] · x[t·cols + k]` for `t < n`.
    pub fn matmul(&self, pool: &ThreadPool, x: &[f32], n: usize, y: &mut [f32]) {
        self.matmul_at(level(), pool, x, n, y)
    }

    /// `matmul` at an explicit level (all levels compute in f32; they differ only in rounding).
    pub fn matmul_at(
        &self,
        level: KernelLevel,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) {
        assert!(
            x.len() >= n * self.cols,
            "matmul: x has {} values, need {n} × {}",
            x.len(),
            self.cols
        );
        assert!(
            y.len() >= n * self.rows,
            "matmul: y has {} values, need {n} × {}",
            y.len(),
            self.rows
        );
        if n == 0 || self.rows == 0 {
            return;
        }
        let level = level.or_supported();
        let out = OutPtr::new(y);
        super::for_each_chunk(pool, self.rows, self.cols * 4, &|rows| {
            match level {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `or_supported` checked the features.
                KernelLevel::Avx512 => unsafe { rows_avx512(self, rows, x, n, out) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `or_supported` checked the features.
                KernelLevel::Avx2 => unsafe { rows_avx2(self, rows, x, n, out) },
                _ => rows_generic::<false>(self, rows, x, n, out),
            }
        });
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(m: &DenseMatrix, rows: Range<usize>, x: &[f32], n: usize, out: OutPtr) {
    rows_generic::<true>(m, rows, x, n, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_avx512(m: &DenseMatrix, rows: Range<usize>, x: &[f32], n: usize, out: OutPtr) {
    rows_generic::<true>(m, rows, x, n, out)
}

#[inline(always)]
fn rows_generic<const FMA: bool>(
    m: &DenseMatrix,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    out: OutPtr,
) {
    let cols = m.cols;
    let xt = |t: usize| &x[t * cols..(t + 1) * cols];
    for r in rows {
        let w = m.row(r);
        let mut t = 0;
        while t + 4 <= n {
            let v = dots::<4, FMA>(w, [xt(t), xt(t + 1), xt(t + 2), xt(t + 3)]);
            for (dt, &vi) in v.iter().enumerate() {
                // SAFETY: rows are split disjointly between threads.
                unsafe { out.write((t + dt) * m.rows + r, &[vi]) };
            }
            t += 4;
        }
        while t < n {
            let v = dots::<1, FMA>(w, [xt(t)]);
            // SAFETY: as above.
            unsafe { out.write(t * m.rows + r, &v) };
            t += 1;
        }
    }
}

#[inline(always)]
fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `T` dot products of `w` with `xs[t]`, sharing each load of `w`.
#[inline(always)]
fn dots<const T: usize, const FMA: bool>(w: &[f32], xs: [&[f32]; T]) -> [f32; T] {
    const L: usize = 16;
    let mut acc = [[0f32; L]; T];
    let full = w.len() / L * L;
    for c in (0..full).step_by(L) {
        let wc: &[f32; L] = w[c..c + L].try_into().expect("chunk");
        for t in 0..T {
            let xc: &[f32; L] = xs[t][c..c + L].try_into().expect("chunk");
            for i in 0..L {
                acc[t][i] = mul_add::<FMA>(wc[i], xc[i], acc[t][i]);
            }
        }
    }
    std::array::from_fn(|t| {
        let tail: f32 = (full..w.len()).map(|k| w[k] * xs[t][k]).sum();
        reduce(acc[t]) + tail
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_matches_f64() {
        let pool = ThreadPool::new(2);
        for (rows, cols, n) in [(5, 3, 1), (33, 100, 3), (64, 2048, 6), (7, 16, 9)] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let m = DenseMatrix::new(rows, cols, w.clone());
            assert_eq!(m.bytes(), rows * cols * 4);
            for l in KernelLevel::available() {
                let mut y = vec![f32::NAN; n * rows];
                m.matmul_at(l, &pool, &x, n, &mut y);
                for t in 0..n {
                    for r in 0..rows {
                        let (mut e, mut mag) = (0f64, 0f64);
                        for k in 0..cols {
                            let p = w[r * cols + k] as f64 * x[t * cols + k] as f64;
                            e += p;
                            mag += p.abs();
                        }
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - e).abs() <= 1e-6 * mag + 1e-30,
                            "{l} {rows}x{cols} t={t} r={r}: {got} vs {e}"
                        );
                    }
                }
            }
        }
    }
}
