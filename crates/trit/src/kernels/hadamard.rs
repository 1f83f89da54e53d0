//! Normalized Sylvester Walsh–Hadamard transform, in place over consecutive blocks
//! (formats.md §8.1): `H[r][c] = (−1)^popcount(r & c) / √B`. `log2 B` butterfly stages, then
//! one scale by `1/√B`: O(B log B) per block instead of the O(B²) matrix product. The
//! transform is symmetric and orthogonal, hence its own inverse.
//!
//! AVX2 version: stages with a stride ≥ 8 are whole-register add/sub pairs; the three stages
//! inside a register (strides 1, 2, 4) are a lane permute plus an add, a subtract and a blend.

/// Transforms each `block`-sized chunk of `x` in place. `block` must be a power of two that
/// divides `x.len()` (the loaders check this and report it as a file error).
pub fn fwht_blocks(x: &mut [f32], block: usize) {
    assert!(
        block.is_power_of_two() && x.len().is_multiple_of(block),
        "fwht_blocks: block {block} over {} values",
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if block >= 8 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is available (checked just above).
        unsafe { avx2::fwht_blocks(x, block) };
        return;
    }
    fwht_blocks_scalar(x, block);
}

/// Portable reference (also used for blocks smaller than one register).
pub fn fwht_blocks_scalar(x: &mut [f32], block: usize) {
    let scale = 1.0 / (block as f32).sqrt();
    for chunk in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for start in (0..block).step_by(2 * h) {
                for j in start..start + h {
                    let (a, b) = (chunk[j], chunk[j + h]);
                    chunk[j] = a + b;
                    chunk[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for v in chunk.iter_mut() {
            *v *= scale;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2; `block` ≥ 8, a power of two dividing `x.len()`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn fwht_blocks(x: &mut [f32], block: usize) {
        let scale = _mm256_set1_ps(1.0 / (block as f32).sqrt());
        for chunk in x.chunks_exact_mut(block) {
            let p = chunk.as_mut_ptr();
            // Strides 1, 2, 4 (and the scale when the block is a single register).
            for i in (0..block).step_by(8) {
                let mut v = _mm256_loadu_ps(p.add(i));
                let sw = _mm256_permute_ps::<0b10_11_00_01>(v);
                v = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v));
                let sw = _mm256_permute_ps::<0b01_00_11_10>(v);
                v = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v));
                let sw = _mm256_permute2f128_ps::<1>(v, v);
                v = _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v));
                if block == 8 {
                    v = _mm256_mul_ps(v, scale);
                }
                _mm256_storeu_ps(p.add(i), v);
            }
            let mut h = 8;
            while h < block {
                let last = 2 * h == block;
                for start in (0..block).step_by(2 * h) {
                    for j in (start..start + h).step_by(8) {
                        let a = _mm256_loadu_ps(p.add(j));
                        let b = _mm256_loadu_ps(p.add(j + h));
                        let (mut s, mut d) = (_mm256_add_ps(a, b), _mm256_sub_ps(a, b));
                        if last {
                            s = _mm256_mul_ps(s, scale);
                            d = _mm256_mul_ps(d, scale);
                        }
                        _mm256_storeu_ps(p.add(j), s);
                        _mm256_storeu_ps(p.add(j + h), d);
                    }
                }
                h *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + 13) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// The definition: a dense product with `(−1)^popcount(r & c) / √B`.
    fn dense(x: &[f32], block: usize) -> Vec<f32> {
        let scale = 1.0 / (block as f64).sqrt();
        let mut out = vec![0f32; x.len()];
        for (xc, oc) in x.chunks(block).zip(out.chunks_mut(block)) {
            for (r, o) in oc.iter_mut().enumerate() {
                let s: f64 = (0..block)
                    .map(|c| {
                        let sign = if (r & c).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * xc[c] as f64
                    })
                    .sum();
                *o = (s * scale) as f32;
            }
        }
        out
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn matches_the_dense_hadamard_product() {
        for block in [1, 2, 4, 8, 16, 64, 512] {
            let x = values(3 * block);
            let want = dense(&x, block);
            let mut scalar = x.clone();
            fwht_blocks_scalar(&mut scalar, block);
            assert!(max_diff(&scalar, &want) < 1e-5, "scalar block {block}");
            let mut fast = x.clone();
            fwht_blocks(&mut fast, block);
            assert!(max_diff(&fast, &want) < 1e-5, "dispatch block {block}");
        }
    }

    #[test]
    fn simd_matches_scalar_and_round_trips() {
        for block in [8, 32, 1024, 4096] {
            let x = values(2 * block);
            let mut a = x.clone();
            let mut b = x.clone();
            fwht_blocks_scalar(&mut a, block);
            fwht_blocks(&mut b, block);
            assert!(max_diff(&a, &b) < 1e-5, "block {block}");
            // Its own inverse.
            fwht_blocks(&mut b, block);
            assert!(max_diff(&b, &x) < 1e-5, "round trip block {block}");
        }
    }
}
