//! Int8 activations for the ternary kernels: per token and per 64 columns one f32 scale
//! (`d = max|x| / 127`, symmetric so `q ∈ [-127, 127]`) and the block sum `Σq` that turns the
//! unsigned-code product into the signed one (`Σ t·q = Σ code·q − Σ q`).

use crate::threadpool::ThreadPool;

/// Columns per activation scale (equal to the weight scale group, so one float multiply per
/// block applies both).
pub(crate) const ACT_BLOCK: usize = 64;

/// `n` tokens × `cols` activations quantized to int8, plus the original f32 values (kept so the
/// `Reference` level stays exact when the caller shares one `ActQ8` between several matrices).
pub struct ActQ8 {
    pub(crate) n: usize,
    pub(crate) cols: usize,
    /// `n × cols` int8 values, token-major.
    pub(crate) qs: Vec<i8>,
    /// `n × cols/64` scales.
    pub(crate) d: Vec<f32>,
    /// `n × cols/64` sums of `qs` over each block.
    pub(crate) sums: Vec<i32>,
    /// The unquantized input (`n × cols`).
    pub(crate) exact: Vec<f32>,
    /// The same int8 rows in the small-M kernels' layout, built when 2..=16 rows are quantized.
    pub(crate) panel: super::small_m::Panel,
}

impl ActQ8 {
    /// No tokens; buffers grow on the first `quantize_*` call and are reused after it (a
    /// prefill quantizes ~100 activation matrices of several MiB: fresh allocations would page
    /// fault on every one).
    pub fn new() -> Self {
        ActQ8 {
            n: 0,
            cols: 0,
            qs: Vec::new(),
            d: Vec::new(),
            sums: Vec::new(),
            exact: Vec::new(),
            panel: Default::default(),
        }
    }

    /// Quantizes `x[t·cols + k]` for `t < n`. `cols` must be a multiple of 64 (as every
    /// `TernaryMatrix` has) and `x` must hold `n·cols` values.
    pub fn quantize(x: &[f32], n: usize, cols: usize) -> Self {
        let mut a = ActQ8::new();
        a.quantize_from(x, n, cols, true);
        a
    }

    /// Re-fills `self` with `x` quantized (as `quantize`). `keep_exact` also keeps a copy of
    /// `x` (needed only by dense matrices and the `Reference` level; see `Linear::needs_exact`).
    pub fn quantize_from(&mut self, x: &[f32], n: usize, cols: usize, keep_exact: bool) {
        self.quantize_from_on(None, x, n, cols, keep_exact)
    }

    /// `quantize_from`, rows split over `pool`'s threads when there are many.
    pub fn quantize_from_on(
        &mut self,
        pool: Option<&ThreadPool>,
        x: &[f32],
        n: usize,
        cols: usize,
        keep_exact: bool,
    ) {
        assert!(
            x.len() >= n * cols,
            "ActQ8::quantize: {} values for {n} × {cols}",
            x.len()
        );
        self.resize(n, cols, keep_exact);
        self.fill_rows(pool, &x[..n * cols], &|_, xr, r| {
            r.quantize_row(|b, out| out.copy_from_slice(&xr[b * ACT_BLOCK..][..ACT_BLOCK]))
        });
        self.build_panel();
    }

    /// Re-lays the quantized rows out for the small-M kernels (a no-op outside 2..=16 rows).
    fn build_panel(&mut self) {
        let (n, cols) = (self.n, self.cols);
        self.panel.build(n, cols, &self.qs, &self.d, &self.sums);
    }

    /// Re-fills `self` with `rms_norm(x_t)·w` quantized, for each of the `n` rows `x_t` of
    /// `x` (`cols = w.len()`): the normalized row is produced one block at a time and quantized
    /// while it is in registers, instead of being written out and read back. With `keep_exact`
    /// the normalized rows are kept too. Rows are split over `pool`'s threads when there are
    /// many.
    pub fn quantize_rms_norm(
        &mut self,
        pool: Option<&ThreadPool>,
        x: &[f32],
        w: &[f32],
        eps: f32,
        n: usize,
        keep_exact: bool,
    ) {
        let cols = w.len();
        assert!(
            x.len() >= n * cols,
            "ActQ8::quantize_rms_norm: {} values for {n} × {cols}",
            x.len()
        );
        self.resize(n, cols, keep_exact);
        self.fill_rows(pool, &x[..n * cols], &|_, xr, r| {
            let inv = 1.0 / (super::ops::dot(xr, xr) / cols as f32 + eps).sqrt();
            let norm = |b: usize, out: &mut [f32; ACT_BLOCK]| {
                let (xb, wb) = (&xr[b * ACT_BLOCK..][..ACT_BLOCK], &w[b * ACT_BLOCK..]);
                for ((o, &xi), &wi) in out.iter_mut().zip(xb).zip(wb) {
                    *o = xi * inv * wi;
                }
            };
            if r.qs.is_empty() {
                // Dense-only width (not a multiple of 64): just the normalized row.
                let e = r.exact.expect("resize keeps exact rows for such widths");
                super::ops::rms_norm(xr, w, eps, e);
            } else {
                r.quantize_row(norm);
            }
        });
        self.build_panel();
    }

    /// Re-fills `self` with `silu(gate_t)·up_t` quantized (SwiGLU, then the down projection's
    /// quantization) for the `n` rows of `cols` values of `gate` and `up`: each block is
    /// computed in registers and quantized at once, so the product is never written out and
    /// read back, and a batched step needs one pool dispatch for both. The values are exactly
    /// those of `ops::silu_mul` followed by `quantize_from_on`.
    pub fn quantize_silu_mul(
        &mut self,
        pool: Option<&ThreadPool>,
        gate: &[f32],
        up: &[f32],
        n: usize,
        cols: usize,
        keep_exact: bool,
    ) {
        assert!(
            gate.len() >= n * cols && up.len() >= n * cols,
            "ActQ8::quantize_silu_mul: {} and {} values for {n} × {cols}",
            gate.len(),
            up.len()
        );
        self.resize(n, cols, keep_exact);
        // The exponentials do not auto-vectorize inside the row loop: intrinsics where possible.
        #[cfg(target_arch = "x86_64")]
        let avx512 = wide_level() == WideLevel::Avx512;
        self.fill_rows(pool, &gate[..n * cols], &|t, gr, r| {
            let ur = &up[t * cols..(t + 1) * cols];
            let silu = |g: f32, u: f32| g / (1.0 + super::ops::exp_approx(-g)) * u;
            if r.qs.is_empty() {
                // Dense-only width (not a multiple of 64): just the product.
                let e = r.exact.expect("resize keeps exact rows for such widths");
                for ((o, &g), &u) in e.iter_mut().zip(gr).zip(ur) {
                    *o = silu(g, u);
                }
            } else {
                r.quantize_row(|b, out| {
                    let (gb, ub) = (&gr[b * ACT_BLOCK..][..ACT_BLOCK], &ur[b * ACT_BLOCK..]);
                    #[cfg(target_arch = "x86_64")]
                    if avx512 {
                        // SAFETY: `wide_level` checked avx512f.
                        return unsafe { super::act_avx512::silu_mul_block(gb, ub, out) };
                    }
                    for ((o, &g), &u) in out.iter_mut().zip(gb).zip(ub) {
                        *o = silu(g, u);
                    }
                });
            }
        });
        self.build_panel();
    }

    /// Runs `f(t, x_t, out_t)` on every input row `x_t` of `x` with the matching output rows, in chunks of
    /// `PAR_ROWS` rows claimed by `pool`'s threads when there are several chunks.
    fn fill_rows(
        &mut self,
        pool: Option<&ThreadPool>,
        x: &[f32],
        f: &(dyn Fn(usize, &[f32], RowOut) + Sync),
    ) {
        let (n, cols) = (self.n, self.cols);
        if n == 0 {
            return;
        }
        let bpr = self.d.len() / n;
        let qpr = self.qs.len() / n;
        let epr = self.exact.len() / n;
        let rows = super::PAR_ROWS;
        let mut items: Vec<Chunk> = Vec::with_capacity(n.div_ceil(rows));
        let mut exact_chunks = self.exact.chunks_mut((epr * rows).max(1));
        for (((xc, qc), dc), sc) in x
            .chunks(cols * rows)
            .zip(chunks_or_empty(&mut self.qs, qpr * rows, n.div_ceil(rows)))
            .zip(chunks_or_empty(&mut self.d, bpr * rows, n.div_ceil(rows)))
            .zip(chunks_or_empty(
                &mut self.sums,
                bpr * rows,
                n.div_ceil(rows),
            ))
        {
            let ec = if epr > 0 { exact_chunks.next() } else { None };
            items.push((items.len() * rows, xc, qc, dc, sc, ec));
        }
        let work = |(t0, xc, qc, dc, sc, mut ec): Chunk| {
            for t in 0..xc.len() / cols {
                let r = RowOut {
                    qs: qc.get_mut(t * qpr..(t + 1) * qpr).unwrap_or_default(),
                    d: dc.get_mut(t * bpr..(t + 1) * bpr).unwrap_or_default(),
                    sums: sc.get_mut(t * bpr..(t + 1) * bpr).unwrap_or_default(),
                    exact: ec.as_mut().map(|e| &mut e[t * epr..(t + 1) * epr]),
                };
                f(t0 + t, &xc[t * cols..(t + 1) * cols], r);
            }
        };
        match pool {
            Some(p) if n >= 2 * rows => super::par_items(p, items, &work),
            _ => items.into_iter().for_each(work),
        }
    }

    /// Sizes the buffers for `n × cols`. A width that is not a multiple of 64 can only feed a
    /// dense matrix: then only the exact rows are kept (and `keep_exact` must be set).
    fn resize(&mut self, n: usize, cols: usize, keep_exact: bool) {
        assert!(
            cols.is_multiple_of(ACT_BLOCK) || keep_exact,
            "ActQ8: cols = {cols} is not a multiple of {ACT_BLOCK}"
        );
        let blocks = if cols.is_multiple_of(ACT_BLOCK) {
            n * cols / ACT_BLOCK
        } else {
            0
        };
        self.n = n;
        self.cols = cols;
        self.qs.resize(blocks * ACT_BLOCK, 0);
        self.d.resize(blocks, 0.0);
        self.sums.resize(blocks, 0);
        self.exact.clear();
        if keep_exact {
            self.exact.resize(n * cols, 0.0);
        }
    }

    /// The unquantized rows, if they were kept (`keep_exact`).
    pub fn exact(&self) -> Option<&[f32]> {
        (self.exact.len() == self.n * self.cols).then_some(&self.exact[..])
    }

    /// Number of tokens.
    pub fn n(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The dequantized value `d·q` at token `t`, column `k`.
    #[cfg(test)]
    pub(crate) fn dequantized(&self, t: usize, k: usize) -> f32 {
        self.d[(t * self.cols + k) / ACT_BLOCK] * self.qs[t * self.cols + k] as f32
    }
}

impl Default for ActQ8 {
    fn default() -> Self {
        ActQ8::new()
    }
}

/// Row chunk of the work of `fill_rows`: its first row, input rows, and the matching rows of
/// `qs`, `d`, `sums` and (if kept) `exact`.
type Chunk<'a> = (
    usize,
    &'a [f32],
    &'a mut [i8],
    &'a mut [f32],
    &'a mut [i32],
    Option<&'a mut [f32]>,
);

/// `count` chunks of `len` elements of `v`, or `count` empty slices when `v` is empty (widths
/// that are not quantized).
fn chunks_or_empty<T>(v: &mut [T], len: usize, count: usize) -> Vec<&mut [T]> {
    if v.is_empty() {
        (0..count).map(|_| <&mut [T]>::default()).collect()
    } else {
        v.chunks_mut(len).collect()
    }
}

/// The outputs of one token row.
struct RowOut<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    sums: &'a mut [i32],
    exact: Option<&'a mut [f32]>,
}

impl RowOut<'_> {
    /// Quantizes the row whose block `b` `block(b, out)` writes into `out`. The same code
    /// compiled with AVX-512 or AVX2 enabled when the CPU has it, `block` included (the crate's
    /// baseline is SSE2, where the norm, SwiGLU and quantization loops run 4 lanes wide at
    /// best): a batched decode step quantizes ~85 activation matrices of 8 rows.
    fn quantize_row(self, block: impl Fn(usize, &mut [f32; ACT_BLOCK])) {
        #[cfg(target_arch = "x86_64")]
        match wide_level() {
            // SAFETY: `wide_level` checked the features.
            WideLevel::Avx512 => return unsafe { self.quantize_row_avx512(block) },
            // SAFETY: as above.
            WideLevel::Avx2 => return unsafe { self.quantize_row_avx2(block) },
            WideLevel::None => {}
        }
        self.quantize_row_generic(block)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    unsafe fn quantize_row_avx512(self, block: impl Fn(usize, &mut [f32; ACT_BLOCK])) {
        let mut vals = [0f32; ACT_BLOCK];
        let mut exact = self.exact;
        for (b, ((qb, d), s)) in self
            .qs
            .chunks_exact_mut(ACT_BLOCK)
            .zip(self.d.iter_mut())
            .zip(self.sums.iter_mut())
            .enumerate()
        {
            block(b, &mut vals);
            (*d, *s) = super::act_avx512::quantize_block(&vals, qb);
            if let Some(e) = exact.as_mut() {
                e[b * ACT_BLOCK..][..ACT_BLOCK].copy_from_slice(&vals);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn quantize_row_avx2(self, block: impl Fn(usize, &mut [f32; ACT_BLOCK])) {
        self.quantize_row_generic(block)
    }

    #[inline(always)]
    fn quantize_row_generic(self, block: impl Fn(usize, &mut [f32; ACT_BLOCK])) {
        let mut vals = [0f32; ACT_BLOCK];
        let mut exact = self.exact;
        for (b, ((qb, d), s)) in self
            .qs
            .chunks_exact_mut(ACT_BLOCK)
            .zip(self.d.iter_mut())
            .zip(self.sums.iter_mut())
            .enumerate()
        {
            block(b, &mut vals);
            (*d, *s) = quantize_block_generic(&vals, qb);
            if let Some(e) = exact.as_mut() {
                e[b * ACT_BLOCK..][..ACT_BLOCK].copy_from_slice(&vals);
            }
        }
    }
}

/// Which wide build of the quantization loops this CPU and the kernel level allow.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WideLevel {
    Avx512,
    Avx2,
    None,
}

#[cfg(target_arch = "x86_64")]
fn wide_level() -> WideLevel {
    match super::level() {
        super::KernelLevel::Avx512 if super::KernelLevel::Avx2.supported() => WideLevel::Avx512,
        super::KernelLevel::Avx512 | super::KernelLevel::Avx2 => WideLevel::Avx2,
        // `Reference` keeps the wide build too: only `Portable` promises plain loops.
        super::KernelLevel::Reference if super::KernelLevel::Avx2.supported() => WideLevel::Avx2,
        _ => WideLevel::None,
    }
}

/// Quantizes one block; returns (scale, Σq). The same code compiled with AVX-512 or AVX2 when
/// the CPU has it, with the same results (tests compare the builds).
#[cfg(test)]
fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    match wide_level() {
        // SAFETY: `wide_level` checked the features.
        WideLevel::Avx512 => return unsafe { quantize_block_avx512(x, q) },
        // SAFETY: as above.
        WideLevel::Avx2 => return unsafe { quantize_block_avx2(x, q) },
        WideLevel::None => {}
    }
    quantize_block_generic(x, q)
}

#[cfg(all(test, target_arch = "x86_64"))]
unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    super::act_avx512::quantize_block(x.try_into().expect("one block"), q)
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    quantize_block_generic(x, q)
}

#[inline(always)]
fn quantize_block_generic(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    // Lane-wise maximum (vectorizes; `f32::max` folds would not, because of NaN semantics);
    // `poison` turns NaN for any NaN or infinite input (v·0).
    let mut lanes = [0f32; 16];
    let mut poison = [0f32; 16];
    for c in x.chunks_exact(16) {
        for ((m, p), &v) in lanes.iter_mut().zip(poison.iter_mut()).zip(c) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
            *p += v * 0.0;
        }
    }
    let amax = lanes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    let finite = poison.iter().sum::<f32>() == 0.0;
    if amax == 0.0 || !finite {
        // All zero, or a NaN/infinite input: q = 0 keeps the sums consistent, and a non-finite
        // input makes the scale NaN so the result is visibly NaN instead of silently wrong.
        q.fill(0);
        return (if finite { 0.0 } else { f32::NAN }, 0);
    }
    let inv = 127.0 / amax;
    // Adding 1.5·2^23 rounds to the nearest integer (ties to even) for |v| < 2^22 and leaves
    // it in the low mantissa bits: one float add and one integer subtract, which vectorize
    // (`f32::round` is a libm call without SSE4.1, and `as i32` adds saturation checks).
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        let v = (xi * inv + MAGIC).to_bits() as i32 - MAGIC_BITS;
        *qi = v as i8;
        sum += v;
    }
    (amax / 127.0, sum)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index loops mirror the formulas being checked
mod tests {
    use super::*;
    use crate::threadpool::ThreadPool;

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let cols = 192;
        let n = 3;
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1 + i % 5) as f32)
            .collect();
        let a = ActQ8::quantize(&x, n, cols);
        assert_eq!(a.n(), n);
        for t in 0..n {
            for b in 0..cols / 64 {
                let blk = &x[t * cols + b * 64..][..64];
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = a.d[t * 3 + b];
                assert!((d - amax / 127.0).abs() <= 1e-7 * amax);
                let mut s = 0;
                for k in 0..64 {
                    let q = a.qs[t * cols + b * 64 + k];
                    assert!((-127..=127).contains(&q));
                    s += q as i32;
                    let err = (a.dequantized(t, b * 64 + k) - blk[k]).abs();
                    assert!(err <= 0.5 * d * 1.0001, "err {err} step {d}");
                }
                assert_eq!(a.sums[t * 3 + b], s);
            }
        }
    }

    #[test]
    fn fused_rms_norm_quantization_equals_norm_then_quantize() {
        // 40 rows: more than one parallel chunk of PAR_ROWS rows.
        let (n, cols) = (40, 320);
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1 + i % 7) as f32)
            .collect();
        let w: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 11) as f32 * 0.1).collect();
        let mut normed = vec![0f32; n * cols];
        for (xr, or) in x.chunks_exact(cols).zip(normed.chunks_exact_mut(cols)) {
            crate::kernels::ops::rms_norm(xr, &w, 1e-6, or);
        }
        let want = ActQ8::quantize(&normed, n, cols);
        // Reused buffers: quantize something larger first, then the fused form.
        let mut a = ActQ8::quantize(&vec![1.0; 4 * 384], 4, 384);
        let pool = ThreadPool::new(2);
        a.quantize_rms_norm(Some(&pool), &x, &w, 1e-6, n, true);
        assert_eq!((a.n, a.cols), (n, cols));
        assert_eq!(a.exact(), Some(&normed[..]));
        assert_eq!(a.qs, want.qs);
        assert_eq!(a.d, want.d);
        assert_eq!(a.sums, want.sums);
        a.quantize_rms_norm(None, &x, &w, 1e-6, n, false);
        assert_eq!(a.exact(), None);
        assert_eq!(a.qs, want.qs);
        // A width that is not a multiple of 64 (dense matrices only): exact rows, no codes.
        a.quantize_rms_norm(Some(&pool), &x[..40 * 72], &w[..72], 1e-6, 40, true);
        assert!(a.qs.is_empty());
        assert_eq!(
            &a.exact().unwrap()[..72],
            &normed_row(&x[..72], &w[..72])[..]
        );
        a.quantize_from_on(Some(&pool), &x, n, cols, true);
        let plain = ActQ8::quantize(&x, n, cols);
        assert_eq!((&a.qs, &a.d, &a.sums), (&plain.qs, &plain.d, &plain.sums));
        assert_eq!(a.exact(), Some(&x[..]));
    }

    #[test]
    fn fused_swiglu_quantization_equals_silu_mul_then_quantize() {
        let pool = ThreadPool::new(2);
        let val = |i: usize, k: usize| ((i * k % 1013) as f32 / 1013.0 - 0.5) * (1 + i % 7) as f32;
        // 1 row (matvec), 8 rows (small-M panel, two parallel chunks), 40 rows (prefill); and a
        // dense-only width.
        for (n, cols) in [(1, 192), (8, 192), (40, 320), (8, 72)] {
            // Some gates past the exponential's clamps (±87), where e^-g saturates.
            let gate: Vec<f32> = (0..n * cols)
                .map(|i| match i % 97 {
                    0 => 100.0,
                    1 => -95.0,
                    _ => 6.0 * val(i, 7919),
                })
                .collect();
            let up: Vec<f32> = (0..n * cols).map(|i| val(i, 104_729)).collect();
            let mut product = gate.clone();
            crate::kernels::ops::silu_mul(&mut product, &up);
            let mut want = ActQ8::new();
            want.quantize_from(&product, n, cols, true);
            let mut a = ActQ8::quantize(&vec![1.0; 4 * 384], 4, 384);
            a.quantize_silu_mul(Some(&pool), &gate, &up, n, cols, true);
            assert_eq!((a.n, a.cols), (n, cols));
            assert_eq!(a.exact(), Some(&product[..]), "{n} × {cols}");
            assert_eq!((&a.qs, &a.d, &a.sums), (&want.qs, &want.d, &want.sums));
            // The small-M panel (built for 2..=16 rows only; stale buffers otherwise).
            assert_eq!(a.panel.n, want.panel.n);
            if want.panel.n > 0 {
                let panel = |x: &ActQ8| {
                    (
                        x.panel.qs.clone(),
                        x.panel.d.clone(),
                        x.panel.neg_sums.clone(),
                    )
                };
                assert_eq!(panel(&a), panel(&want));
            }
        }
    }

    fn normed_row(x: &[f32], w: &[f32]) -> Vec<f32> {
        let mut o = vec![0f32; x.len()];
        crate::kernels::ops::rms_norm(x, w, 1e-6, &mut o);
        o
    }

    #[test]
    fn simd_builds_of_the_block_quantizer_match_the_generic_one() {
        let mut x: Vec<f32> = (0..64 * 50)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * [1e-3, 1.0, 300.0][i % 3])
            .collect();
        // Special blocks: all zero, ±infinity, NaN, subnormals, exact rounding ties (x·127/amax
        // = k + 0.5), a single nonzero value.
        let mut special = vec![0f32; 64 * 7];
        special[64 + 3] = f32::INFINITY;
        special[64 + 9] = f32::NEG_INFINITY;
        special[128 + 17] = f32::NAN;
        for k in 0..64 {
            special[192 + k] = (k as f32 - 30.0) * 1e-41;
            special[256 + k] = if k == 0 { 127.0 } else { k as f32 + 0.5 };
        }
        special[320 + 63] = -2.5;
        special[384..448].copy_from_slice(&x[..64]);
        x.extend(special);
        type Build = fn(&[f32], &mut [i8]) -> (f32, i32);
        let builds: Vec<(&str, Build)> = vec![
            ("dispatched", quantize_block),
            #[cfg(target_arch = "x86_64")]
            ("avx2", |x, q| {
                assert!(crate::kernels::KernelLevel::Avx2.supported());
                // SAFETY: checked just above.
                unsafe { quantize_block_avx2(x, q) }
            }),
            #[cfg(target_arch = "x86_64")]
            ("avx512", |x, q| {
                assert!(crate::kernels::KernelLevel::Avx512.supported());
                // SAFETY: checked just above.
                unsafe { quantize_block_avx512(x, q) }
            }),
        ];
        for (name, build) in builds {
            #[cfg(target_arch = "x86_64")]
            if (name == "avx2" && !crate::kernels::KernelLevel::Avx2.supported())
                || (name == "avx512" && !crate::kernels::KernelLevel::Avx512.supported())
            {
                continue;
            }
            for (bi, xb) in x.chunks_exact(64).enumerate() {
                let (mut a, mut b) = ([0i8; 64], [0i8; 64]);
                let ra = quantize_block_generic(xb, &mut a);
                let rb = build(xb, &mut b);
                assert_eq!(
                    (ra.0.to_bits(), ra.1, a),
                    (rb.0.to_bits(), rb.1, b),
                    "{name} block {bi}"
                );
                if bi >= 50 {
                    // Special blocks: only the agreement above (127 / amax overflows for the
                    // subnormal one, in every build alike).
                    continue;
                }
                // Rounded to nearest: within half a step of x / d.
                for (k, &qk) in a.iter().enumerate() {
                    let exact = xb[k] as f64 / ra.0 as f64;
                    assert!(
                        (qk as f64 - exact).abs() <= 0.5 + 1e-4,
                        "{k}: {qk} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn zero_and_nonfinite_blocks() {
        let mut x = vec![0f32; 192];
        x[70] = f32::INFINITY;
        x[130] = f32::NAN;
        x[131] = 5.0;
        let a = ActQ8::quantize(&x, 1, 192);
        assert_eq!(a.d[0], 0.0);
        assert!(a.qs[..64].iter().all(|&q| q == 0));
        assert!(a.d[1].is_nan());
        assert!(a.d[2].is_nan());
    }
}
