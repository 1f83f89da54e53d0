//! `DenseMatrix`: weights that are not ternary (dequantized at load; f16 and bf16 tensors kept
//! as they are) and their matrix product. One row/token loop over three dot-product kernels:
//! the portable one (`dots`, also the reference the others are tested against) and AVX2+FMA /
//! AVX-512 ones written with intrinsics — LLVM left the portable loop scalar (`vfmadd231ss`,
//! accumulators spilled to the stack) even under those target features. Each weight row is
//! loaded once per group of 4 tokens.
//!
//! Half-precision rows (f16/bf16 files: BitNet's tied 128k-row embedding and head, unpacked
//! reference models) are widened into an f32 row in cache before the same kernels: the
//! conversion is exact, so the products are bit-for-bit the f32 matrix's, while a decode step
//! streams half the bytes from memory.

use super::ops::reduce;
use super::{level, KernelLevel, OutPtr};
use crate::quant::float::HalfKind;
use crate::threadpool::ThreadPool;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use std::ops::Range;

/// How the values are held.
enum Store {
    F32(Vec<f32>),
    /// IEEE half or bfloat16 bit patterns.
    Half(Vec<u16>, HalfKind),
}

/// Row-major weights, `rows × cols`.
pub struct DenseMatrix {
    rows: usize,
    cols: usize,
    data: Store,
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
        DenseMatrix {
            rows,
            cols,
            data: Store::F32(data),
        }
    }

    /// `bits` holds `rows × cols` f16 or bf16 values, row-major, kept at 2 bytes each.
    pub fn from_half(rows: usize, cols: usize, bits: Vec<u16>, kind: HalfKind) -> Self {
        assert_eq!(
            bits.len(),
            rows * cols,
            "DenseMatrix::from_half: {} values for {rows} × {cols}",
            bits.len()
        );
        DenseMatrix {
            rows,
            cols,
            data: Store::Half(bits, kind),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> usize {
        match &self.data {
            Store::F32(v) => v.len() * 4,
            Store::Half(v, _) => v.len() * 2,
        }
    }

    /// The stored f16/bf16 bit patterns (row-major), or `None` for an f32 matrix: a GPU
    /// backend uploads them at 2 bytes a value.
    pub fn half_bits(&self) -> Option<(&[u16], HalfKind)> {
        match &self.data {
            Store::F32(_) => None,
            Store::Half(bits, kind) => Some((bits, *kind)),
        }
    }

    /// Row `r` as f32 (`out.len() == cols`), e.g. for embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let at = r * self.cols..(r + 1) * self.cols;
        match &self.data {
            Store::F32(v) => out.copy_from_slice(&v[at]),
            Store::Half(bits, kind) => widen(&bits[at], *kind, out),
        }
    }

    /// Row `r` for the product: the stored f32 slice, or the half row widened into `scratch`.
    /// Inlined into the kernels so the widening compiles with their target features.
    #[inline(always)]
    fn row_for<'a>(&'a self, r: usize, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        let at = r * self.cols..(r + 1) * self.cols;
        match &self.data {
            Store::F32(v) => &v[at],
            Store::Half(bits, kind) => {
                scratch.resize(self.cols, 0.0);
                widen(&bits[at], *kind, scratch);
                scratch
            }
        }
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
                _ => rows_generic::<PORTABLE>(self, rows, x, n, out),
            }
        });
    }
}

/// Which dot-product kernel `rows_generic` runs.
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(m: &DenseMatrix, rows: Range<usize>, x: &[f32], n: usize, out: OutPtr) {
    rows_generic::<AVX2>(m, rows, x, n, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_avx512(m: &DenseMatrix, rows: Range<usize>, x: &[f32], n: usize, out: OutPtr) {
    rows_generic::<AVX512>(m, rows, x, n, out)
}

/// `T` dot products of `w` with `xs[t]` by the kernel `K`.
#[inline(always)]
fn dots_by<const K: u8, const T: usize>(w: &[f32], xs: [&[f32]; T]) -> [f32; T] {
    match K {
        // SAFETY: K = AVX2 / AVX512 only inside rows_avx2 / rows_avx512, which the dispatch
        // calls after checking the features; every xs[t] is as long as w.
        #[cfg(target_arch = "x86_64")]
        AVX2 => unsafe { dots_avx2::<T>(w, xs) },
        #[cfg(target_arch = "x86_64")]
        AVX512 => unsafe { dots_avx512::<T>(w, xs) },
        _ => dots::<T>(w, xs),
    }
}

#[inline(always)]
fn rows_generic<const K: u8>(
    m: &DenseMatrix,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    out: OutPtr,
) {
    let cols = m.cols;
    let xt = |t: usize| &x[t * cols..(t + 1) * cols];
    // Half-precision rows go to the kernels that widen in registers, where the level has them.
    #[cfg(target_arch = "x86_64")]
    if let (Store::Half(bits, kind), AVX2 | AVX512) = (&m.data, K) {
        if let Some((dot4, dot1)) = super::dense_half::kernels(K == AVX512, *kind) {
            for r in rows {
                let w = &bits[r * cols..(r + 1) * cols];
                // SAFETY: K is this level's, checked by the dispatch (`kernels` checks the rest);
                // every token row is `cols` long.
                each_token(
                    m.rows,
                    r,
                    n,
                    out,
                    &xt,
                    |xs| unsafe { dot4(w, xs) },
                    |xs| unsafe { dot1(w, xs) },
                );
            }
            return;
        }
    }
    let mut scratch = Vec::new();
    for r in rows {
        let w = m.row_for(r, &mut scratch);
        each_token(
            m.rows,
            r,
            n,
            out,
            &xt,
            |xs| dots_by::<K, 4>(w, xs),
            |xs| dots_by::<K, 1>(w, xs),
        );
    }
}

/// Row `r`'s products with every token: four tokens per `dot4` (one pass over the weights),
/// then one at a time.
#[inline(always)]
fn each_token<'x>(
    rows: usize,
    r: usize,
    n: usize,
    out: OutPtr,
    xt: &impl Fn(usize) -> &'x [f32],
    dot4: impl Fn([&'x [f32]; 4]) -> [f32; 4],
    dot1: impl Fn([&'x [f32]; 1]) -> [f32; 1],
) {
    let mut t = 0;
    while t + 4 <= n {
        let v = dot4([xt(t), xt(t + 1), xt(t + 2), xt(t + 3)]);
        for (dt, &vi) in v.iter().enumerate() {
            // SAFETY: rows are split disjointly between threads.
            unsafe { out.write((t + dt) * rows + r, &[vi]) };
        }
        t += 4;
    }
    while t < n {
        let v = dot1([xt(t)]);
        // SAFETY: as above.
        unsafe { out.write(t * rows + r, &v) };
        t += 1;
    }
}

/// [`dots`] on 8-wide registers: two accumulators per token (16 columns a step) so the fused
/// multiply-adds of a token do not wait on each other, then 8 columns, then the scalar tail.
///
/// # Safety
/// The CPU must support avx2 and fma; every `xs[t]` holds at least `w.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const T: usize>(w: &[f32], xs: [&[f32]; T]) -> [f32; T] {
    let wp = w.as_ptr();
    dots_avx2_by(
        w.len(),
        xs,
        |c| std::arch::x86_64::_mm256_loadu_ps(wp.add(c)),
        |k| w[k],
    )
}

/// The AVX2 kernel's arithmetic for any weight storage: `load(c)` gives weights c..c + 8 as
/// f32, `at(k)` weight k (the tail). Shared by f32 and half-precision rows (dense_half.rs), so
/// both compute the same sums in the same order. Inlined into callers with avx2 and fma.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn dots_avx2_by<const T: usize>(
    n: usize,
    xs: [&[f32]; T],
    load: impl Fn(usize) -> std::arch::x86_64::__m256,
    at: impl Fn(usize) -> f32,
) -> [f32; T] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    let mut c = 0;
    while c + 16 <= n {
        let (w0, w1) = (load(c), load(c + 8));
        for t in 0..T {
            let xp = xs[t].as_ptr().add(c);
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), acc[t][1]);
        }
        c += 16;
    }
    if c + 8 <= n {
        let w0 = load(c);
        for t in 0..T {
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[t].as_ptr().add(c)), acc[t][0]);
        }
        c += 8;
    }
    std::array::from_fn(|t| {
        let v = _mm256_add_ps(acc[t][0], acc[t][1]);
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        let tail: f32 = (c..n).map(|k| at(k) * xs[t][k]).sum();
        lanes.iter().sum::<f32>() + tail
    })
}

/// [`dots_avx2`] on 16-wide registers.
///
/// # Safety
/// The CPU must support avx512f and fma; every `xs[t]` holds at least `w.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn dots_avx512<const T: usize>(w: &[f32], xs: [&[f32]; T]) -> [f32; T] {
    let wp = w.as_ptr();
    dots_avx512_by(
        w.len(),
        xs,
        |c| std::arch::x86_64::_mm512_loadu_ps(wp.add(c)),
        |k| w[k],
    )
}

/// [`dots_avx2_by`] on 16-wide registers (callers with avx512f and fma).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn dots_avx512_by<const T: usize>(
    n: usize,
    xs: [&[f32]; T],
    load: impl Fn(usize) -> std::arch::x86_64::__m512,
    at: impl Fn(usize) -> f32,
) -> [f32; T] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    let mut c = 0;
    while c + 32 <= n {
        let (w0, w1) = (load(c), load(c + 16));
        for t in 0..T {
            let xp = xs[t].as_ptr().add(c);
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), acc[t][1]);
        }
        c += 32;
    }
    if c + 16 <= n {
        let w0 = load(c);
        for t in 0..T {
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xs[t].as_ptr().add(c)), acc[t][0]);
        }
        c += 16;
    }
    std::array::from_fn(|t| {
        let tail: f32 = (c..n).map(|k| at(k) * xs[t][k]).sum();
        _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1])) + tail
    })
}

/// Exact f32 values of half-precision bits (`out.len() == bits.len()`): bf16 is the top half
/// of an f32 (a shift LLVM vectorizes), f16 goes through `half` (F16C where the CPU has it).
#[inline(always)]
fn widen(bits: &[u16], kind: HalfKind, out: &mut [f32]) {
    match kind {
        HalfKind::BF16 => {
            for (o, &b) in out.iter_mut().zip(bits) {
                *o = f32::from_bits((b as u32) << 16);
            }
        }
        HalfKind::F16 => bits
            .reinterpret_cast::<half::f16>()
            .convert_to_f32_slice(out),
    }
}

/// `T` dot products of `w` with `xs[t]`, sharing each load of `w` (portable; the reference).
#[inline(always)]
fn dots<const T: usize>(w: &[f32], xs: [&[f32]; T]) -> [f32; T] {
    const L: usize = 16;
    let mut acc = [[0f32; L]; T];
    let full = w.len() / L * L;
    for c in (0..full).step_by(L) {
        let wc: &[f32; L] = w[c..c + L].try_into().expect("chunk");
        for t in 0..T {
            let xc: &[f32; L] = xs[t][c..c + L].try_into().expect("chunk");
            for i in 0..L {
                acc[t][i] += wc[i] * xc[i];
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
        // Columns: all tail (3), whole 8/16/32-column steps (16, 24, 48, 2048) and partial
        // ones with a scalar tail (47, 100); tokens: groups of 4 and single ones.
        let shapes = [
            (5, 3, 1),
            (33, 100, 3),
            (64, 2048, 6),
            (7, 16, 9),
            (4, 24, 4),
            (3, 47, 5),
            (2, 48, 1),
        ];
        for (rows, cols, n) in shapes {
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

    /// f16 and bf16 storage: half the bytes, rows widened exactly, so every level's products
    /// equal bit for bit those of the f32 matrix of the same values (the same kernels).
    #[test]
    fn half_storage_matches_the_f32_matrix_bit_for_bit() {
        let pool = ThreadPool::new(2);
        for kind in [HalfKind::F16, HalfKind::BF16] {
            for (rows, cols, n) in [(9, 100, 1), (33, 256, 5), (4, 3, 4)] {
                let bits: Vec<u16> = (0..rows * cols)
                    .map(|i| {
                        let v = ((i * 37 % 101) as f32 - 50.0) / 37.0;
                        match kind {
                            HalfKind::F16 => half::f16::from_f32(v).to_bits(),
                            HalfKind::BF16 => half::bf16::from_f32(v).to_bits(),
                        }
                    })
                    .collect();
                let values: Vec<f32> = bits.iter().map(|&b| kind.to_f32(b)).collect();
                let half = DenseMatrix::from_half(rows, cols, bits, kind);
                let full = DenseMatrix::new(rows, cols, values.clone());
                assert_eq!(half.bytes() * 2, full.bytes());
                let mut row = vec![0f32; cols];
                half.dequantize_row(rows - 1, &mut row);
                assert_eq!(row, values[(rows - 1) * cols..]);
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                    .collect();
                for l in KernelLevel::available() {
                    let (mut a, mut b) = (vec![0f32; n * rows], vec![1f32; n * rows]);
                    half.matmul_at(l, &pool, &x, n, &mut a);
                    full.matmul_at(l, &pool, &x, n, &mut b);
                    let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{kind:?} {l} {rows}x{cols} n={n}");
                }
            }
        }
    }
}
