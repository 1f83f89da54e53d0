//! AVX-512 VNNI ternary kernel (`vpdpbusd`: u8 codes × i8 activations, 4 products per dword).
//! Layout and arithmetic are described in `kernels/mod.rs`; each dword lane of an accumulator
//! is one of the tile's 16 rows.
#![cfg(target_arch = "x86_64")]

use super::act::ActQ8;
use super::ternary::{
    token_blocks, TernaryMatrix, TileScales, PREFETCH_BYTES, TILE_BLOCK_BYTES, TILE_ROWS,
};
use super::OutPtr;
use std::arch::x86_64::*;
use std::ops::Range;

/// Tokens sharing one unpacked weight tile in prefill (8 int + 8 float accumulators, 4 code
/// registers and constants fit the 32 zmm registers).
const GROUP: usize = 8;

/// Computes the rows of `tiles` for every token of `xq` and stores them through `out`.
///
/// # Safety
/// The CPU must support avx512f, avx512bw and avx512vnni; this thread must own `tiles`' rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
            if xq.n == 1 {
                match scales {
                    TileScales::F16(s) => {
                        decode::<true>(m, codes, s.as_ptr().cast(), xq, &mut res[0])
                    }
                    TileScales::F32(s) => {
                        decode::<false>(m, codes, s.as_ptr().cast(), xq, &mut res[0])
                    }
                }
                m.store_tile(out, 0, tile, &res[0]);
                continue;
            }
            for t0 in tokens.clone().step_by(GROUP) {
                let nt = (tokens.end - t0).min(GROUP);
                match scales {
                    TileScales::F16(s) => {
                        group_dyn::<true>(nt, m, codes, s.as_ptr().cast(), xq, t0, &mut res)
                    }
                    TileScales::F32(s) => {
                        group_dyn::<false>(nt, m, codes, s.as_ptr().cast(), xq, t0, &mut res)
                    }
                }
                for (dt, r) in res.iter().enumerate().take(nt) {
                    m.store_tile(out, t0 + dt, tile, r);
                }
            }
        }
    }
}

/// The 16 weight scales of scale group `g` as f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_scales<const F16: bool>(scales: *const u8, g: usize) -> __m512 {
    if F16 {
        _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(g * 32).cast()))
    } else {
        _mm512_loadu_ps(scales.add(g * 64).cast())
    }
}

/// The 4 activation bytes at `p`, broadcast to every dword (folds into `vpdpbusd`'s `{1to16}`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// One token: masks each bit pair in place (`w & (3 << 2s)` = `4^s · code`) into its own
/// accumulator and recombines the four with exact shifts once per block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn decode<const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    res: &mut [f32; TILE_ROWS],
) {
    let blocks = m.blocks();
    let x = xq.qs.as_ptr();
    let mask0 = _mm512_set1_epi8(0x03);
    let mask1 = _mm512_set1_epi8(0x0c);
    let mask2 = _mm512_set1_epi8(0x30);
    let mask3 = _mm512_set1_epi8(0xc0u8 as i8);
    let mut facc = _mm512_setzero_ps();
    for b in 0..blocks {
        let cb = codes.add(b * TILE_BLOCK_BYTES);
        prefetch_ahead(cb);
        let xb = x.add(b * 64);
        let mut a0 = _mm512_setzero_si512();
        let mut a1 = _mm512_setzero_si512();
        let mut a2 = _mm512_setzero_si512();
        let mut a3 = _mm512_setzero_si512();
        for p in 0..4 {
            let w = _mm512_load_si512(cb.add(64 * p).cast());
            let xp = xb.add(16 * p);
            a0 = _mm512_dpbusd_epi32(a0, _mm512_and_si512(w, mask0), bcast4(xp));
            a1 = _mm512_dpbusd_epi32(a1, _mm512_and_si512(w, mask1), bcast4(xp.add(4)));
            a2 = _mm512_dpbusd_epi32(a2, _mm512_and_si512(w, mask2), bcast4(xp.add(8)));
            a3 = _mm512_dpbusd_epi32(a3, _mm512_and_si512(w, mask3), bcast4(xp.add(12)));
        }
        // a_s = 4^s · Σ_s exactly, so each arithmetic shift below is an exact division.
        let hi = _mm512_srai_epi32::<2>(_mm512_add_epi32(a2, _mm512_srai_epi32::<2>(a3)));
        let mid = _mm512_srai_epi32::<2>(_mm512_add_epi32(a1, hi));
        let dot = _mm512_add_epi32(a0, mid);
        let dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(*xq.sums.get_unchecked(b)));
        let scale = _mm512_mul_ps(
            load_scales::<F16>(scales, b >> m.scale_shift()),
            _mm512_set1_ps(*xq.d.get_unchecked(b)),
        );
        facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, facc);
    }
    _mm512_storeu_ps(res.as_mut_ptr(), facc);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group_dyn<const F16: bool>(
    nt: usize,
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    t0: usize,
    res: &mut [[f32; TILE_ROWS]; GROUP],
) {
    match nt {
        1 => group::<1, F16>(m, codes, scales, xq, t0, res),
        2 => group::<2, F16>(m, codes, scales, xq, t0, res),
        3 => group::<3, F16>(m, codes, scales, xq, t0, res),
        4 => group::<4, F16>(m, codes, scales, xq, t0, res),
        5 => group::<5, F16>(m, codes, scales, xq, t0, res),
        6 => group::<6, F16>(m, codes, scales, xq, t0, res),
        7 => group::<7, F16>(m, codes, scales, xq, t0, res),
        _ => group::<8, F16>(m, codes, scales, xq, t0, res),
    }
}

/// `T` tokens: each bit pair is shifted down once and multiplied against all `T` tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group<const T: usize, const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    t0: usize,
    res: &mut [[f32; TILE_ROWS]; GROUP],
) {
    let (cols, blocks) = (m.cols(), m.blocks());
    let mask = _mm512_set1_epi8(0x03);
    let x: [*const i8; T] = std::array::from_fn(|t| xq.qs.as_ptr().add((t0 + t) * cols));
    let mut facc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        let cb = codes.add(b * TILE_BLOCK_BYTES);
        prefetch_ahead(cb);
        let mut acc = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            let w = _mm512_load_si512(cb.add(64 * p).cast());
            let c = [
                _mm512_and_si512(w, mask),
                _mm512_and_si512(_mm512_srli_epi16::<2>(w), mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask),
                _mm512_and_si512(_mm512_srli_epi16::<6>(w), mask),
            ];
            for (s, cs) in c.iter().enumerate() {
                for t in 0..T {
                    let xv = bcast4(x[t].add(b * 64 + 16 * p + 4 * s));
                    acc[t] = _mm512_dpbusd_epi32(acc[t], *cs, xv);
                }
            }
        }
        let ws = load_scales::<F16>(scales, b >> m.scale_shift());
        for t in 0..T {
            let i = (t0 + t) * blocks + b;
            let dot = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(*xq.sums.get_unchecked(i)));
            let scale = _mm512_mul_ps(ws, _mm512_set1_ps(*xq.d.get_unchecked(i)));
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, facc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(res[t].as_mut_ptr(), facc[t]);
    }
}

/// Prefetches the block `PREFETCH_BYTES` ahead of `cb` (past the tile end it is the next tile,
/// which this thread usually reads next; a prefetch never faults).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn prefetch_ahead(cb: *const u8) {
    let pf = cb.wrapping_add(PREFETCH_BYTES);
    for l in 0..TILE_BLOCK_BYTES / 64 {
        _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * l).cast());
    }
}
