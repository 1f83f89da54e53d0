//! Int8 activations for the ternary kernels: per token and per 64 columns one f32 scale
//! (`d = max|x| / 127`, symmetric so `q ∈ [-127, 127]`) and the block sum `Σq` that turns the
//! unsigned-code product into the signed one (`Σ t·q = Σ code·q − Σ q`).

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
}

impl ActQ8 {
    /// Quantizes `x[t·cols + k]` for `t < n`. `cols` must be a multiple of 64 (as every
    /// `TernaryMatrix` has) and `x` must hold `n·cols` values.
    pub fn quantize(x: &[f32], n: usize, cols: usize) -> Self {
        assert!(
            cols.is_multiple_of(ACT_BLOCK),
            "ActQ8::quantize: cols = {cols} is not a multiple of {ACT_BLOCK}"
        );
        assert!(
            x.len() >= n * cols,
            "ActQ8::quantize: {} values for {n} × {cols}",
            x.len()
        );
        let x = &x[..n * cols];
        let blocks = n * cols / ACT_BLOCK;
        let mut qs = vec![0i8; n * cols];
        let mut d = vec![0f32; blocks];
        let mut sums = vec![0i32; blocks];
        for (((xb, qb), db), sb) in x
            .chunks_exact(ACT_BLOCK)
            .zip(qs.chunks_exact_mut(ACT_BLOCK))
            .zip(d.iter_mut())
            .zip(sums.iter_mut())
        {
            (*db, *sb) = quantize_block(xb, qb);
        }
        ActQ8 {
            n,
            cols,
            qs,
            d,
            sums,
            exact: x.to_vec(),
        }
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

/// Quantizes one block; returns (scale, Σq).
fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
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
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer (ties to even) for |v| < 2^22
    // with plain float adds, which vectorize (`f32::round` is a libm call without SSE4.1).
    const MAGIC: f32 = 12_582_912.0;
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        let v = ((xi * inv + MAGIC) - MAGIC) as i32;
        *qi = v as i8;
        sum += v;
    }
    (amax / 127.0, sum)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index loops mirror the formulas being checked
mod tests {
    use super::*;

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
