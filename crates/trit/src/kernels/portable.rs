//! Portable integer kernel: unpacks one tile-block (16 rows × 64 columns) to bytes, then plain
//! u8 × i8 → i32 dot products that LLVM vectorizes for the target (SSE2 `pmaddwd`, NEON
//! `smlal`/`sdot`). The unpacked block is reused for up to `GROUP` tokens.

use super::act::ActQ8;
use super::ternary::{TernaryMatrix, BLOCK, TILE_BLOCK_BYTES, TILE_ROWS};
use super::OutPtr;
use std::ops::Range;

/// Tokens sharing one unpacked block.
const GROUP: usize = 8;

/// Computes the rows of `tiles` for every token of `xq` and stores them through `out`.
pub(crate) fn ternary_tiles(m: &TernaryMatrix, tiles: Range<usize>, xq: &ActQ8, out: OutPtr) {
    let (cols, blocks) = (m.cols(), m.blocks());
    let mut unpacked = [[0u8; BLOCK]; TILE_ROWS];
    for tile in tiles {
        let codes = m.tile_codes(tile);
        let scales = m.tile_scales(tile);
        for t0 in (0..xq.n).step_by(GROUP) {
            let nt = (xq.n - t0).min(GROUP);
            let mut acc = [[0f32; TILE_ROWS]; GROUP];
            for b in 0..blocks {
                unpack_block(
                    &codes[b * TILE_BLOCK_BYTES..][..TILE_BLOCK_BYTES],
                    &mut unpacked,
                );
                for (dt, acc_t) in acc.iter_mut().enumerate().take(nt) {
                    let t = t0 + dt;
                    let q: &[i8; BLOCK] = xq.qs[t * cols + b * BLOCK..][..BLOCK]
                        .try_into()
                        .expect("64 activations");
                    let d = xq.d[t * blocks + b];
                    let sum = xq.sums[t * blocks + b];
                    for (j, a) in acc_t.iter_mut().enumerate() {
                        let dot = dot_u8_i8(&unpacked[j], q) - sum;
                        *a += dot as f32 * (scales.get(b * TILE_ROWS + j) * d);
                    }
                }
            }
            for (dt, acc_t) in acc.iter().enumerate().take(nt) {
                // SAFETY: this thread owns `tile`'s rows.
                unsafe { m.store_tile(out, t0 + dt, tile, acc_t) };
            }
        }
    }
}

/// `out[j][k]` = code of row `j`, column `k` of the block (layout in `kernels/mod.rs`).
#[inline]
fn unpack_block(cb: &[u8], out: &mut [[u8; BLOCK]; TILE_ROWS]) {
    for p in 0..4 {
        for (j, row) in out.iter_mut().enumerate() {
            for i in 0..4 {
                let byte = cb[64 * p + 4 * j + i];
                for s in 0..4 {
                    row[16 * p + 4 * s + i] = (byte >> (2 * s)) & 3;
                }
            }
        }
    }
}

#[inline]
fn dot_u8_i8(a: &[u8; BLOCK], b: &[i8; BLOCK]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}
