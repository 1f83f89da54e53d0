//! AVX2 ternary kernel: the 16-row tile is two 8-row halves (bytes 0..32 and 32..64 of each
//! 64-byte chunk). `vpmaddubsw` multiplies codes (0..=3) by int8 activations into int16 pairs,
//! which are summed over a whole block in int16 (|sum| ≤ 16 · 2 · 3 · 127 = 12192, no
//! saturation) and widened once per block with `vpmaddwd` by 1.
#![cfg(target_arch = "x86_64")]

use super::act::ActQ8;
use super::ternary::{
    token_blocks, TernaryMatrix, TileScales, PREFETCH_BYTES, TILE_BLOCK_BYTES, TILE_ROWS,
};
use super::OutPtr;
use std::arch::x86_64::*;
use std::ops::Range;

/// Tokens sharing the unpacked codes: 4 tokens × 2 int16 accumulators, the two code vectors,
/// their unpacked pair, the mask and a broadcast fill the 16 ymm registers in the inner loop
/// (the f32 accumulators, touched once per 64-column block, may live in L1). 1.7B shape pp512 on
/// a 2-vCPU AVX2 EPYC: 76 tok/s against 48–58 with 2 tokens.
const GROUP: usize = 4;

/// Computes the rows of `tiles` for every token of `xq` and stores them through `out`.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; this thread must own `tiles`' rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn ternary_tiles(
    m: &TernaryMatrix,
    tiles: Range<usize>,
    xq: &ActQ8,
    out: OutPtr,
) {
    let mut res = [[0f32; TILE_ROWS]; GROUP];
    for tokens in token_blocks(xq.n, m.cols(), GROUP) {
        for tile in tiles.clone() {
            let codes = m.tile_codes(tile).as_ptr();
            let scales = m.tile_scales(tile);
            for t0 in tokens.clone().step_by(GROUP) {
                let nt = (tokens.end - t0).min(GROUP);
                match scales {
                    TileScales::F16(s) => {
                        group_of::<true>(m, codes, s.as_ptr().cast(), xq, t0, nt, &mut res)
                    }
                    TileScales::F32(s) => {
                        group_of::<false>(m, codes, s.as_ptr().cast(), xq, t0, nt, &mut res)
                    }
                }
                for (dt, r) in res.iter().enumerate().take(nt) {
                    m.store_tile(out, t0 + dt, tile, r);
                }
            }
        }
    }
}

/// [`group`] for the `nt` (1..=GROUP) tokens from `t0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_of<const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    t0: usize,
    nt: usize,
    res: &mut [[f32; TILE_ROWS]; GROUP],
) {
    match nt {
        1 => group::<1, F16>(m, codes, scales, xq, t0, res),
        2 => group::<2, F16>(m, codes, scales, xq, t0, res),
        3 => group::<3, F16>(m, codes, scales, xq, t0, res),
        _ => group::<4, F16>(m, codes, scales, xq, t0, res),
    }
}

/// Scales of rows `8h .. 8h+8` of block `b` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_scales<const F16: bool>(scales: *const u8, b: usize, h: usize) -> __m256 {
    if F16 {
        _mm256_cvtph_ps(_mm_loadu_si128(scales.add(b * 32 + h * 16).cast()))
    } else {
        _mm256_loadu_ps(scales.add(b * 64 + h * 32).cast())
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const T: usize, const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    t0: usize,
    res: &mut [[f32; TILE_ROWS]; GROUP],
) {
    let (cols, blocks) = (m.cols(), m.blocks());
    let mask = _mm256_set1_epi8(0x03);
    let ones = _mm256_set1_epi16(1);
    let x: [*const i8; T] = std::array::from_fn(|t| xq.qs.as_ptr().add((t0 + t) * cols));
    let mut facc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        let cb = codes.add(b * TILE_BLOCK_BYTES);
        // Software prefetch: the hardware prefetcher alone leaves decode ~30 % short of the
        // memory bandwidth (see `PREFETCH_BYTES`).
        let pf = cb.wrapping_add(PREFETCH_BYTES);
        for l in 0..TILE_BLOCK_BYTES / 64 {
            _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * l).cast());
        }
        let mut acc = [[_mm256_setzero_si256(); 2]; T];
        for p in 0..4 {
            let w = [
                _mm256_load_si256(cb.add(64 * p).cast()),
                _mm256_load_si256(cb.add(64 * p + 32).cast()),
            ];
            for s in 0..4 {
                let c = match s {
                    0 => [_mm256_and_si256(w[0], mask), _mm256_and_si256(w[1], mask)],
                    1 => [
                        _mm256_and_si256(_mm256_srli_epi16::<2>(w[0]), mask),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(w[1]), mask),
                    ],
                    2 => [
                        _mm256_and_si256(_mm256_srli_epi16::<4>(w[0]), mask),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(w[1]), mask),
                    ],
                    _ => [
                        _mm256_and_si256(_mm256_srli_epi16::<6>(w[0]), mask),
                        _mm256_and_si256(_mm256_srli_epi16::<6>(w[1]), mask),
                    ],
                };
                for t in 0..T {
                    let xv = bcast4(x[t].add(b * 64 + 16 * p + 4 * s));
                    for h in 0..2 {
                        acc[t][h] = _mm256_add_epi16(acc[t][h], _mm256_maddubs_epi16(c[h], xv));
                    }
                }
            }
        }
        for h in 0..2 {
            let ws = load_scales::<F16>(scales, b >> m.scale_shift(), h);
            for t in 0..T {
                let i = (t0 + t) * blocks + b;
                let dot = _mm256_madd_epi16(acc[t][h], ones);
                let dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(*xq.sums.get_unchecked(i)));
                let scale = _mm256_mul_ps(ws, _mm256_set1_ps(*xq.d.get_unchecked(i)));
                facc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, facc[t][h]);
            }
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(res[t].as_mut_ptr(), facc[t][0]);
        _mm256_storeu_ps(res[t].as_mut_ptr().add(8), facc[t][1]);
    }
}
