//! AVX2 small-M kernel (2..=16 rows, see `kernels/small_m.rs`). The prefill kernel unpacks
//! every code chunk again for each group of 4 rows (all its 16 ymm registers). Here each
//! block's codes are unpacked once into a 1 KiB buffer (16 column quads × 2 halves of 8 rows,
//! in L1) and every 4 rows (then 2, then 1) run `vpmaddubsw` straight from it, with the
//! activations broadcast from the panel (4 rows instead of 2: 8 streams of the 1.7B shape on a
//! 2-vCPU AVX2 EPYC, `batch_throughput`, 45–49 → 60–62 tok/s). Int16 partial sums over one block
//! cannot saturate (16 × 2 × 3 × 127 < 2^15, as in `avx2.rs`); the float accumulators of the
//! rows live in `res` (L1) and are updated once per block.
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
/// The CPU must support avx2, fma and f16c; this thread must own `tiles`' rows.
#[target_feature(enable = "avx2,fma,f16c")]
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
            match m.tile_scales(tile) {
                TileScales::F16(s) => {
                    group::<true>(m, codes, s.as_ptr().cast(), xq, g, nt, &mut res)
                }
                TileScales::F32(s) => {
                    group::<false>(m, codes, s.as_ptr().cast(), xq, g, nt, &mut res)
                }
            }
            for (dt, r) in res.iter().enumerate().take(nt) {
                m.store_tile(out, g * PANEL_ROWS + dt, tile, r);
            }
        }
    }
}

/// Scales of rows `8h .. 8h+8` of scale group `s` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_scales<const F16: bool>(scales: *const u8, s: usize, h: usize) -> __m256 {
    if F16 {
        _mm256_cvtph_ps(_mm_loadu_si128(scales.add(s * 32 + h * 16).cast()))
    } else {
        _mm256_loadu_ps(scales.add(s * 64 + h * 32).cast())
    }
}

/// `nt` rows of panel group `g` against one tile; results in `res[..nt]`.
#[inline]
#[allow(clippy::needless_range_loop)] // `h` picks both the code bytes and the buffer half
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const F16: bool>(
    m: &TernaryMatrix,
    codes: *const u8,
    scales: *const u8,
    xq: &ActQ8,
    g: usize,
    nt: usize,
    res: &mut [[f32; TILE_ROWS]; PANEL_ROWS],
) {
    let blocks = m.blocks();
    let p = &xq.panel;
    let qs = p.qs.as_ptr().add(g * blocks * PANEL_BLOCK_BYTES);
    let neg_sums = p.neg_sums.as_ptr().add(g * blocks * PANEL_ROWS);
    let d = p.d.as_ptr().add(g * blocks * PANEL_ROWS);
    let mask = _mm256_set1_epi8(0x03);
    let ones = _mm256_set1_epi16(1);
    for r in res.iter_mut().take(nt) {
        r.fill(0.0);
    }
    // Unpacked codes of one block: quad q (columns 4q..4q+4), half h (rows 8h..8h+8).
    let mut unpacked = [[_mm256_setzero_si256(); 2]; 16];
    for b in 0..blocks {
        let cb = codes.add(b * TILE_BLOCK_BYTES);
        let pf = cb.wrapping_add(PREFETCH_BYTES);
        for l in 0..TILE_BLOCK_BYTES / 64 {
            _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * l).cast());
        }
        for (c4, quads) in unpacked.chunks_exact_mut(4).enumerate() {
            for h in 0..2 {
                let w = _mm256_load_si256(cb.add(64 * c4 + 32 * h).cast());
                quads[0][h] = _mm256_and_si256(w, mask);
                quads[1][h] = _mm256_and_si256(_mm256_srli_epi16::<2>(w), mask);
                quads[2][h] = _mm256_and_si256(_mm256_srli_epi16::<4>(w), mask);
                quads[3][h] = _mm256_and_si256(_mm256_srli_epi16::<6>(w), mask);
            }
        }
        let xb = qs.add(b * PANEL_BLOCK_BYTES);
        let (sb, db) = (neg_sums.add(b * PANEL_ROWS), d.add(b * PANEL_ROWS));
        let ws = [
            load_scales::<F16>(scales, b >> m.scale_shift(), 0),
            load_scales::<F16>(scales, b >> m.scale_shift(), 1),
        ];
        let mut t = 0;
        while t < nt {
            if nt - t >= 4 {
                rows::<4>(&unpacked, xb, sb, db, t, ws, ones, res);
                t += 4;
            } else if nt - t >= 2 {
                rows::<2>(&unpacked, xb, sb, db, t, ws, ones, res);
                t += 2;
            } else {
                rows::<1>(&unpacked, xb, sb, db, t, ws, ones, res);
                t += 1;
            }
        }
    }
}

/// Rows `t0 .. t0 + W` of the group against one unpacked block; adds to `res`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const W: usize>(
    unpacked: &[[__m256i; 2]; 16],
    xb: *const i8,
    neg_sums: *const i32,
    d: *const f32,
    t0: usize,
    ws: [__m256; 2],
    ones: __m256i,
    res: &mut [[f32; TILE_ROWS]; PANEL_ROWS],
) {
    let mut acc = [[_mm256_setzero_si256(); 2]; W];
    for (q, cq) in unpacked.iter().enumerate() {
        for (w, a) in acc.iter_mut().enumerate() {
            let at = xb.add((q * PANEL_ROWS + t0 + w) * 4);
            let xv = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
            for h in 0..2 {
                a[h] = _mm256_add_epi16(a[h], _mm256_maddubs_epi16(cq[h], xv));
            }
        }
    }
    for (w, a) in acc.iter().enumerate() {
        let t = t0 + w;
        let neg_sum = _mm256_set1_epi32(*neg_sums.add(t));
        let dt = _mm256_set1_ps(*d.add(t));
        for h in 0..2 {
            let dot = _mm256_add_epi32(_mm256_madd_epi16(a[h], ones), neg_sum);
            let r = res[t].as_mut_ptr().add(8 * h);
            let f = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(dot),
                _mm256_mul_ps(ws[h], dt),
                _mm256_loadu_ps(r),
            );
            _mm256_storeu_ps(r, f);
        }
    }
}
