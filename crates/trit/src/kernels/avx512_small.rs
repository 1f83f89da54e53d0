//! AVX-512 VNNI small-M kernel (2..=16 rows, see `kernels/small_m.rs`): each code chunk is
//! unpacked once (3 shifts, 4 masks) and multiplied against up to 8 rows whose 4-byte
//! activation groups come from the panel at fixed offsets of one pointer. 8 integer + 8 float
//! accumulators, the unpacked code registers and constants fit the 32 zmm registers.
#![cfg(target_arch = "x86_64")]

use super::act::ActQ8;
use super::small_m::PANEL_ROWS;
use super::ternary::{TernaryMatrix, TileScales, PREFETCH_BYTES, TILE_BLOCK_BYTES, TILE_ROWS};
use super::OutPtr;
use std::arch::x86_64::*;
use std::ops::Range;

/// Panel bytes of one group × one block (16 quads × 8 rows × 4 bytes).
const PANEL_BLOCK_BYTES: usize = 16 * PANEL_ROWS * 4;

/// Computes the rows of `tiles` for every row of `xq` (whose panel is built) and stores them.
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
    let panel = &xq.panel;
    let mut res = [[0f32; TILE_ROWS]; PANEL_ROWS];
    for tile in tiles {
        let codes = m.tile_codes(tile).as_ptr();
        for g in 0..panel.groups() {
            let nt = (xq.n - g * PANEL_ROWS).min(PANEL_ROWS);
            let args = (m, codes, xq, g, &mut res);
            match m.tile_scales(tile) {
                TileScales::F16(s) => rows_dyn::<true>(nt, s.as_ptr().cast(), args),
                TileScales::F32(s) => rows_dyn::<false>(nt, s.as_ptr().cast(), args),
            }
            for (dt, r) in res.iter().enumerate().take(nt) {
                m.store_tile(out, g * PANEL_ROWS + dt, tile, r);
            }
        }
    }
}

type Args<'a> = (
    &'a TernaryMatrix,
    *const u8,
    &'a ActQ8,
    usize,
    &'a mut [[f32; TILE_ROWS]; PANEL_ROWS],
);

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows_dyn<const F16: bool>(nt: usize, scales: *const u8, a: Args<'_>) {
    let (m, codes, xq, g, res) = a;
    match nt {
        1 => rows::<1, F16>(m, codes, scales, xq, g, res),
        2 => rows::<2, F16>(m, codes, scales, xq, g, res),
        3 => rows::<3, F16>(m, codes, scales, xq, g, res),
        4 => rows::<4, F16>(m, codes, scales, xq, g, res),
        5 => rows::<5, F16>(m, codes, scales, xq, g, res),
        6 => rows::<6, F16>(m, codes, scales, xq, g, res),
        7 => rows::<7, F16>(m, codes, scales, xq, g, res),
        _ => rows::<8, F16>(m, codes, scales, xq, g, res),
    }
}

/// The 16 weight scales of scale group `s` as f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_scales<const F16: bool>(scales: *const u8, s: usize) -> __m512 {
    if F16 {
        _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(s * 32).cast()))
    } else {
        _mm512_loadu_ps(scales.add(s * 64).cast())
    }
}

/// `T` rows of panel group `g` against one tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows<const T: usize, const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    g: usize,
    res: &mut [[f32; TILE_ROWS]; PANEL_ROWS],
) {
    let blocks = m.blocks();
    let p = &xq.panel;
    let qs = p.qs.as_ptr().add(g * blocks * PANEL_BLOCK_BYTES);
    let neg_sums = p.neg_sums.as_ptr().add(g * blocks * PANEL_ROWS);
    let d = p.d.as_ptr().add(g * blocks * PANEL_ROWS);
    let mask = _mm512_set1_epi8(0x03);
    let mut facc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        let cb = codes.add(b * TILE_BLOCK_BYTES);
        let pf = cb.wrapping_add(PREFETCH_BYTES);
        for l in 0..TILE_BLOCK_BYTES / 64 {
            _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * l).cast());
        }
        let xb = qs.add(b * PANEL_BLOCK_BYTES);
        let (sb, db) = (neg_sums.add(b * PANEL_ROWS), d.add(b * PANEL_ROWS));
        // Σ (code − 1)·q = Σ code·q − Σ q: start from −Σq. Two accumulators per row (even and
        // odd bit pairs) make 2·T independent `vpdpbusd` chains: with T = 8, one chain per row
        // would leave the unit waiting on the instruction's latency about a tenth of the time.
        // Integer sums, so the split does not change any result.
        let mut acc: [__m512i; T] = std::array::from_fn(|t| _mm512_set1_epi32(*sb.add(t)));
        let mut acc2 = [_mm512_setzero_si512(); T];
        for c4 in 0..4 {
            let w = _mm512_load_si512(cb.add(64 * c4).cast());
            let c = [
                _mm512_and_si512(w, mask),
                _mm512_and_si512(_mm512_srli_epi16::<2>(w), mask),
                _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask),
                _mm512_and_si512(_mm512_srli_epi16::<6>(w), mask),
            ];
            for (s, cs) in c.iter().enumerate() {
                // Quad 4·c4 + s of the block: the 4-byte groups of rows 0..T are adjacent.
                let xq4 = xb.add((4 * c4 + s) * PANEL_ROWS * 4);
                let accs = if s % 2 == 0 { &mut acc } else { &mut acc2 };
                for (t, a) in accs.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32(std::ptr::read_unaligned(xq4.add(4 * t).cast()));
                    *a = _mm512_dpbusd_epi32(*a, *cs, xv);
                }
            }
        }
        for (a, a2) in acc.iter_mut().zip(&acc2) {
            *a = _mm512_add_epi32(*a, *a2);
        }
        // The float steps exactly as the matvec and prefill kernels take them (exact integer
        // dot, then `fma(dot, s_w·d, acc)` per block): a row's result does not depend on how
        // many rows share the call, so a sequence decodes the same alone or in any batch.
        // (Summing `d·dot` over a weight-scale group first saved ~3 % but broke that.)
        let ws = load_scales::<F16>(scales, b >> m.scale_shift());
        for (t, (a, f)) in acc.iter().zip(facc.iter_mut()).enumerate() {
            let scale = _mm512_mul_ps(ws, _mm512_set1_ps(*db.add(t)));
            *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*a), scale, *f);
        }
    }
    for (f, r) in facc.iter().zip(res.iter_mut()) {
        _mm512_storeu_ps(r.as_mut_ptr(), *f);
    }
}
