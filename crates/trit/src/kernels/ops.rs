//! Elementwise and reduction ops on f32 rows. Plain loops shaped so LLVM vectorizes them:
//! reductions keep 16 independent partial sums (a float sum is not reassociated otherwise).

/// Independent partial sums in reductions.
const LANES: usize = 16;

/// `out = x / sqrt(mean(x²) + eps) * w` for one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        w.len() == x.len() && out.len() == x.len(),
        "rms_norm: lengths {} / {} / {}",
        x.len(),
        w.len(),
        out.len()
    );
    if x.is_empty() {
        return;
    }
    let mean_sq = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

/// `gate[i] = silu(gate[i]) · up[i]` with `silu(g) = g / (1 + e^-g)`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: lengths");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

/// `silu_mul` on rows of `width` elements, split over `pool`'s threads for long prompts.
pub fn silu_mul_on(
    pool: &crate::threadpool::ThreadPool,
    gate: &mut [f32],
    up: &[f32],
    width: usize,
) {
    assert_eq!(gate.len(), up.len(), "silu_mul: lengths");
    let chunk = width.max(1) * super::PAR_ROWS;
    if gate.len() < 2 * chunk {
        return silu_mul(gate, up);
    }
    let items: Vec<_> = gate.chunks_mut(chunk).zip(up.chunks(chunk)).collect();
    super::par_items(pool, items, &|(g, u)| silu_mul(g, u));
}

/// `e^x` within 2 ulp for `x` in [-87, 88], written without branches or calls so that loops
/// over it vectorize (`f32::exp` is a libm call per element). Inputs below -87 give e^-87
/// (~1.6e-38, where the callers only need "negligible"), above 88 give e^88; NaN stays NaN.
///
/// Method: `x = n·ln2 + r` with `n` the nearest integer to `x/ln2` (ln2 split in two parts so
/// `r` is exact), `e^r` by a degree-6 polynomial on |r| ≤ ln2/2 (the classic minimax
/// coefficients of single-precision expf), and `2^n` built directly in the exponent bits.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let underflow = x < -87.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + MAGIC;
    let n = shifted - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // The integer n sits in the low bits of `shifted`'s mantissa (offset by 0x4B40_0000).
    let ni = shifted.to_bits() as i32 - 0x4B40_0000;
    let two_n = f32::from_bits(((ni + 127) << 23) as u32);
    // A select, not a branch: still vectorizes.
    if underflow {
        0.0
    } else {
        er * two_n
    }
}

/// Numerically stable softmax in place (an empty slice is left alone).
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = exp_approx(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `Σ a[i]·b[i]`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths");
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (xa, xb) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            acc[i] += xa[i] * xb[i];
        }
    }
    let mut tail = 0f32;
    for (&xa, &xb) in ca.remainder().iter().zip(cb.remainder()) {
        tail += xa * xb;
    }
    reduce(acc) + tail
}

/// `y += a·x`.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths");
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// `y += x`.
pub fn add_inplace(y: &mut [f32], x: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_inplace: lengths");
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += xi;
    }
}

/// Pairwise sum of the partial sums (keeps rounding error small and the order fixed).
#[inline]
pub(crate) fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0)
                    * 4.0
                    - 2.0
            })
            .collect()
    }

    #[test]
    fn dot_matches_f64_on_awkward_lengths() {
        for n in [0, 1, 15, 16, 17, 100, 2048] {
            let (a, b) = (data(n, 1), data(n, 2));
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum();
            assert!(
                (dot(&a, &b) as f64 - exact).abs() <= 1e-6 * mag + 1e-30,
                "n={n}"
            );
        }
    }

    #[test]
    fn rms_norm_normalizes() {
        let x = data(300, 3);
        let w = data(300, 4);
        let mut out = vec![0f32; 300];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 300.0;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for i in 0..300 {
            let e = x[i] as f64 * inv * w[i] as f64;
            assert!((out[i] as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()));
        }
        // A zero row stays finite thanks to eps.
        let z = vec![0f32; 8];
        let mut o = vec![1f32; 8];
        rms_norm(&z, &z, 1e-6, &mut o);
        assert!(o.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn silu_softmax_axpy_add() {
        let mut g = vec![-3.0f32, 0.0, 2.0];
        silu_mul(&mut g, &[2.0, 5.0, 0.5]);
        let silu = |v: f64| v / (1.0 + (-v).exp());
        assert!((g[0] as f64 - silu(-3.0) * 2.0).abs() < 1e-6);
        assert_eq!(g[1], 0.0);
        assert!((g[2] as f64 - silu(2.0) * 0.5).abs() < 1e-6);

        let mut s = vec![1000.0f32, 1001.0, 999.0, f32::NEG_INFINITY];
        softmax_inplace(&mut s);
        let e = [(-1f64).exp(), 1.0, (-2f64).exp()];
        let z: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((s[i] as f64 - e[i] / z).abs() < 1e-6);
        }
        assert_eq!(s[3], 0.0);

        let pool = crate::threadpool::ThreadPool::new(2);
        let mut g: Vec<f32> = (0..50 * 24).map(|i| (i % 13) as f32 - 6.0).collect();
        let u: Vec<f32> = (0..50 * 24).map(|i| (i % 7) as f32 * 0.5).collect();
        let mut want = g.clone();
        silu_mul(&mut want, &u);
        silu_mul_on(&pool, &mut g, &u, 24);
        assert_eq!(g, want);

        let mut y = vec![1.0f32, 2.0];
        axpy(0.5, &[2.0, -4.0], &mut y);
        assert_eq!(y, [2.0, 0.0]);
        add_inplace(&mut y, &[1.0, 1.0]);
        assert_eq!(y, [3.0, 1.0]);
    }
}

#[cfg(test)]
mod exp_tests {
    use super::exp_approx;

    #[test]
    fn exp_approx_is_within_two_ulp_of_exp() {
        let mut worst = 0f64;
        for i in 0..=1_750_000 {
            let x = -87.0 + i as f32 * 1e-4;
            let want = (x as f64).exp();
            let err = ((exp_approx(x) as f64 - want) / want).abs();
            worst = worst.max(err);
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert_eq!(exp_approx(0.0), 1.0);
        assert!(exp_approx(f32::NAN).is_nan());
        assert_eq!(exp_approx(-87.5), 0.0);
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert!(exp_approx(1000.0).is_finite());
    }
}
