//! Portable integer kernel: unpacks one tile-block (16 rows × 64 columns) to bytes, then plain
//! i8 × i8 → i32 dot products that LLVM vectorizes for the target (SSE2 `pmaddwd`, NEON
//! `smlal`, or `sdot` where the target has dotprod; codes 0..=3 are valid as i8). The unpacked
//! block and its 16 scales are reused for up to 8 tokens (all of them on the small-M path), and
//! the per-row float work is a 16-lane loop.

use super::act::ActQ8;
use super::small_m::SMALL_M_MAX;
use super::ternary::{token_blocks, TernaryMatrix, BLOCK, TILE_BLOCK_BYTES, TILE_ROWS};
use super::OutPtr;
use std::ops::Range;

/// Computes the rows of `tiles` for every token of `xq` and stores them through `out`; each
/// unpacked block is shared by up to 8 tokens.
pub(crate) fn ternary_tiles(m: &TernaryMatrix, tiles: Range<usize>, xq: &ActQ8, out: OutPtr) {
    tiles_grouped::<8>(m, tiles, xq, out)
}

/// The small-M path (2..=`SMALL_M_MAX` rows, see `kernels/small_m.rs`): every block is
/// unpacked once for all rows.
pub(crate) fn small_m_tiles(m: &TernaryMatrix, tiles: Range<usize>, xq: &ActQ8, out: OutPtr) {
    tiles_grouped::<SMALL_M_MAX>(m, tiles, xq, out)
}

/// `GROUP` tokens share one unpacked block.
fn tiles_grouped<const GROUP: usize>(
    m: &TernaryMatrix,
    tiles: Range<usize>,
    xq: &ActQ8,
    out: OutPtr,
) {
    let (cols, blocks) = (m.cols(), m.blocks());
    let mut unpacked = [[0i8; BLOCK]; TILE_ROWS];
    for tokens in token_blocks(xq.n, m.cols(), GROUP) {
        for tile in tiles.clone() {
            let codes = m.tile_codes(tile);
            let scales = m.tile_scales(tile);
            for t0 in tokens.clone().step_by(GROUP) {
                let nt = (tokens.end - t0).min(GROUP);
                let mut acc = [[0f32; TILE_ROWS]; GROUP];
                for b in 0..blocks {
                    unpack_block(
                        &codes[b * TILE_BLOCK_BYTES..][..TILE_BLOCK_BYTES],
                        &mut unpacked,
                    );
                    let ws: [f32; TILE_ROWS] =
                        std::array::from_fn(|j| scales.get((b >> m.scale_shift()) * TILE_ROWS + j));
                    for (dt, acc_t) in acc.iter_mut().enumerate().take(nt) {
                        let t = t0 + dt;
                        let q: &[i8; BLOCK] = xq.qs[t * cols + b * BLOCK..][..BLOCK]
                            .try_into()
                            .expect("64 activations");
                        let d = xq.d[t * blocks + b];
                        let sum = xq.sums[t * blocks + b];
                        let dots: [i32; TILE_ROWS] =
                            std::array::from_fn(|j| dot_i8(&unpacked[j], q));
                        for j in 0..TILE_ROWS {
                            acc_t[j] += (dots[j] - sum) as f32 * (ws[j] * d);
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
}

/// `out[j][k]` = code of row `j`, column `k` of the block (layout in `kernels/mod.rs`). Works on
/// 32-bit words: the word at byte `4j` of chunk `p`, shifted by `2s` and masked with 0x03030303,
/// is exactly row `j`'s codes for columns `16p+4s .. 16p+4s+4`, in byte order.
#[inline]
fn unpack_block(cb: &[u8], out: &mut [[i8; BLOCK]; TILE_ROWS]) {
    for p in 0..4 {
        let chunk = &cb[64 * p..64 * (p + 1)];
        for (j, row) in out.iter_mut().enumerate() {
            let w = u32::from_le_bytes(chunk[4 * j..4 * j + 4].try_into().expect("4 bytes"));
            for s in 0..4 {
                let codes = (w >> (2 * s)) & 0x0303_0303;
                row[16 * p + 4 * s..16 * p + 4 * s + 4]
                    .copy_from_slice(&codes.to_le_bytes().map(|c| c as i8));
            }
        }
    }
}

#[inline]
fn dot_i8(a: &[i8; BLOCK], b: &[i8; BLOCK]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}
