//! `TernaryMatrix`: ternary weights repacked at load into the tile layout described in
//! `kernels/mod.rs`, and the level dispatch of its matrix products.

use super::act::ActQ8;
use super::{level, KernelLevel, OutPtr};
use crate::quant::TernaryRows;
use crate::threadpool::ThreadPool;
use crate::{Error, Result};
use rayon::prelude::*;
use std::ops::Range;

/// Rows per tile (one per dword lane of a 512-bit register).
pub(crate) const TILE_ROWS: usize = 16;
/// Columns per scale block.
pub(crate) const BLOCK: usize = 64;
/// Code bytes of one tile × one block.
pub(crate) const TILE_BLOCK_BYTES: usize = TILE_ROWS * BLOCK / 4;

/// How far ahead of the block being multiplied the SIMD kernels prefetch codes. Measured on a
/// 2-core Zen 5 VM over a 113 MB ring of 1.7B-shaped matrices (decode): none 25 / 30 GB/s (1 / 2
/// threads), 4 KiB 28 / 41, 8 KiB 29 / 41, 16 KiB 29 / 40 against a ~42 GB/s read bandwidth.
pub(crate) const PREFETCH_BYTES: usize = 8192;
/// Smallest chunk of tiles a thread claims in a small-M matmul (compute-bound: 2 tiles of a
/// 2048-column matrix are ~1 µs of work for 8 rows, so the threads end within ~1 µs).
const SMALL_M_MIN_TILES: usize = 2;

/// Activation bytes per token block of a prefill matmul (see `token_blocks`). Measured as CPU
/// time of 1-thread pp512 runs on the 1.7B shape (the machine was shared, so wall time was
/// useless): all tokens per tile 12.04 / 12.08 s, 256 KiB blocks 11.62 / 11.55 s, 64 KiB 11.44 s
/// (each run: load + 4 prefills).
const TOKEN_BLOCK_BYTES: usize = 64 * 1024;

/// Prefill loop order: the tokens are taken in blocks whose int8 activations (≤ 64 KiB) stay
/// in L2 while every tile of the thread's chunk (≤ 256 KiB of weights, also in L2) is multiplied
/// against them. Looping over all tokens per tile instead streams the whole activation matrix
/// (3 MiB for 512 × 6144) from L3 once per 16-row tile. Blocks hold a multiple of `group`
/// tokens.
pub(crate) fn token_blocks(
    n: usize,
    cols: usize,
    group: usize,
) -> impl Iterator<Item = Range<usize>> {
    let per_block = (TOKEN_BLOCK_BYTES / cols.max(1) / group).max(1) * group;
    (0..n)
        .step_by(per_block)
        .map(move |t| t..(t + per_block).min(n))
}

/// One cache line; a `Vec<Line>` is a 64-byte aligned byte buffer (aligned vector loads).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

/// Weight scales of all tiles (`tiles × groups × 16`, tile-major then scale group; a group is
/// `2^scale_shift` blocks of 64 columns).
pub(crate) enum Scales {
    /// IEEE half bits; used when every scale converts exactly.
    F16(Vec<u16>),
    F32(Vec<f32>),
}

/// Scales of one tile (`blocks × 16`).
#[derive(Clone, Copy)]
pub(crate) enum TileScales<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
}

impl TileScales<'_> {
    #[inline]
    pub(crate) fn get(&self, i: usize) -> f32 {
        match self {
            TileScales::F16(s) => half::f16::from_bits(s[i]).to_f32(),
            TileScales::F32(s) => s[i],
        }
    }
}

/// Ternary weights `W[r][k] = s(r, k/64) · (code − 1)` in the kernels' tile layout.
pub struct TernaryMatrix {
    rows: usize,
    cols: usize,
    tiles: usize,
    blocks: usize,
    /// Blocks per scale group = `1 << scale_shift` (0, 1 or 2: groups of 64, 128 or 256
    /// columns). Files with 128- or 256-column scales (PQ2_0, TQ2_0, TQ1_0) keep one scale per
    /// group instead of repeating it per block: 2.125 / 2.0625 instead of 2.25 bits per weight,
    /// so the repacked model is no larger than a 2-bit file and decode reads fewer bytes.
    scale_shift: u32,
    codes: Vec<Line>,
    pub(crate) scales: Scales,
}

impl TernaryMatrix {
    /// Repacks `src` (in parallel). Fails if `cols` is not a positive multiple of 64, the matrix
    /// is empty, or the source yields a code above 3.
    pub fn from_rows(src: &dyn TernaryRows) -> Result<Self> {
        let (rows, cols) = (src.rows(), src.cols());
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(Error::Unsupported(format!(
                "ternary matrix with {cols} columns: the kernels need a positive multiple of {BLOCK}"
            )));
        }
        if rows == 0 {
            return Err(Error::InvalidArgument(
                "ternary matrix with 0 rows".to_string(),
            ));
        }
        let blocks = cols / BLOCK;
        let tiles = rows.div_ceil(TILE_ROWS);
        let tile_lines = blocks * TILE_BLOCK_BYTES / 64;
        let tile_scales = blocks * TILE_ROWS;
        let mut codes = vec![Line([0; 64]); tiles * tile_lines];
        let mut scales = vec![0f32; tiles * tile_scales];
        codes
            .par_chunks_mut(tile_lines)
            .zip(scales.par_chunks_mut(tile_scales))
            .enumerate()
            .try_for_each_init(
                || (vec![0u8; cols], vec![0f32; blocks]),
                |(row_codes, row_scales), (tile, (tile_codes, tile_sc))| {
                    pack_tile(src, tile, row_codes, row_scales, tile_codes, tile_sc)
                },
            )?;
        let scale_shift = widest_scale_group(&scales, blocks);
        let scales = compact_scales(scales, blocks, scale_shift);
        let all_f16 = scales
            .par_iter()
            .all(|&s| half::f16::from_f32(s).to_f32().to_bits() == s.to_bits());
        let scales = if all_f16 {
            Scales::F16(
                scales
                    .par_iter()
                    .map(|&s| half::f16::from_f32(s).to_bits())
                    .collect(),
            )
        } else {
            Scales::F32(scales)
        };
        Ok(TernaryMatrix {
            rows,
            cols,
            tiles,
            blocks,
            scale_shift,
            codes,
            scales,
        })
    }

    /// log2 of the blocks per scale group (see the field).
    #[inline]
    pub(crate) fn scale_shift(&self) -> u32 {
        self.scale_shift
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of repacked storage (codes + scales, padding rows included).
    pub fn bytes(&self) -> usize {
        self.codes.len() * 64
            + match &self.scales {
                Scales::F16(s) => s.len() * 2,
                Scales::F32(s) => s.len() * 4,
            }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Code bytes of tile `t` (`blocks × 256`, 64-byte aligned).
    pub(crate) fn tile_codes(&self, t: usize) -> &[u8] {
        let len = self.blocks * TILE_BLOCK_BYTES;
        let lines = &self.codes[t * len / 64..(t + 1) * len / 64];
        // SAFETY: `Line` is a plain 64-byte array with no padding; the slice covers `len` bytes.
        unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), len) }
    }

    pub(crate) fn tile_scales(&self, t: usize) -> TileScales<'_> {
        let len = self.blocks.div_ceil(1 << self.scale_shift) * TILE_ROWS;
        match &self.scales {
            Scales::F16(s) => TileScales::F16(&s[t * len..(t + 1) * len]),
            Scales::F32(s) => TileScales::F32(&s[t * len..(t + 1) * len]),
        }
    }

    /// Row `r` as exact f32 weights `s·t`. `out.len()` must equal `cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        let mut codes = [0u8; BLOCK];
        for (b, out_b) in out.chunks_exact_mut(BLOCK).enumerate() {
            let s = self.block_codes(r, b, &mut codes);
            for (o, &c) in out_b.iter_mut().zip(&codes) {
                *o = s * (c as f32 - 1.0);
            }
        }
    }

    /// Row `r` back as codes (`cols`) and scales (`cols / 64`), as `TernaryRows` gave them.
    pub(crate) fn row_codes(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        for (b, (cb, s)) in codes
            .chunks_exact_mut(BLOCK)
            .zip(scales.iter_mut())
            .enumerate()
        {
            *s = self.block_codes(r, b, cb.try_into().expect("64 codes"));
        }
    }

    /// Unpacks the codes of row `r`, block `b`; returns the block's scale.
    fn block_codes(&self, r: usize, b: usize, out: &mut [u8; BLOCK]) -> f32 {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        let (tile, j) = (r / TILE_ROWS, r % TILE_ROWS);
        let cb = &self.tile_codes(tile)[b * TILE_BLOCK_BYTES..][..TILE_BLOCK_BYTES];
        for p in 0..4 {
            for i in 0..4 {
                let byte = cb[64 * p + 4 * j + i];
                for sh in 0..4 {
                    out[16 * p + 4 * sh + i] = (byte >> (2 * sh)) & 3;
                }
            }
        }
        self.tile_scales(tile)
            .get((b >> self.scale_shift) * TILE_ROWS + j)
    }

    /// `y[t·rows + r] = Σ_k W[r][k] · x[t·cols + k]` for `t < n`, at the global `level()`.
    pub fn matmul(&self, pool: &ThreadPool, x: &[f32], n: usize, y: &mut [f32]) {
        self.matmul_at(level(), pool, x, n, y)
    }

    /// Same as `matmul` with activations quantized once by the caller (shared by q/k/v).
    pub fn matmul_q8(&self, pool: &ThreadPool, xq: &ActQ8, y: &mut [f32]) {
        self.matmul_q8_at(level(), pool, xq, y)
    }

    /// `matmul` at an explicit level (an unsupported level falls back to the best supported).
    pub fn matmul_at(
        &self,
        level: KernelLevel,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) {
        assert!(
            x.len() >= n * self.cols,
            "matmul: x has {} values, need {n} × {}",
            x.len(),
            self.cols
        );
        assert!(
            y.len() >= n * self.rows,
            "matmul: y has {} values, need {n} × {}",
            y.len(),
            self.rows
        );
        if n == 0 {
            return;
        }
        match level.or_supported() {
            KernelLevel::Reference => super::scalar::ternary_matmul_f32(self, pool, x, n, y),
            l => self.matmul_q8_at(l, pool, &ActQ8::quantize(x, n, self.cols), y),
        }
    }

    /// `matmul_q8` at an explicit level. At `Reference` the exact f32 activations kept in `xq`
    /// are used.
    pub fn matmul_q8_at(&self, level: KernelLevel, pool: &ThreadPool, xq: &ActQ8, y: &mut [f32]) {
        assert_eq!(xq.cols, self.cols, "matmul_q8: activation width");
        let n = xq.n;
        assert!(
            y.len() >= n * self.rows,
            "matmul: y has {} values, need {n} × {}",
            y.len(),
            self.rows
        );
        if n == 0 {
            return;
        }
        let level = level.or_supported();
        if level == KernelLevel::Reference {
            let exact = xq.exact().expect(
                "matmul_q8 at the reference level needs activations quantized with keep_exact",
            );
            return super::scalar::ternary_matmul_f32(self, pool, exact, n, y);
        }
        let out = OutPtr::new(y);
        let small = super::small_m::applies(xq);
        let run = |tiles: Range<usize>| self.run_tiles(level, small, tiles, xq, out);
        if small {
            super::for_each_chunk_guided(pool, self.tiles, SMALL_M_MIN_TILES, &run);
        } else {
            super::for_each_chunk(pool, self.tiles, self.tile_bytes(), &run);
        }
    }

    /// Several matrices of one width applied to the same activations (q/k/v, gate/up) in one
    /// pool dispatch: their tiles form one index space the threads claim chunks from, so a
    /// decode step waits for the slowest thread once per group instead of once per matrix.
    /// Each tile is still computed whole by one thread with the kernel `matmul_q8` would use,
    /// so every output is bit-identical to separate calls.
    pub fn matmul_q8_fused(
        pool: &ThreadPool,
        xq: &ActQ8,
        parts: &mut [(&TernaryMatrix, &mut [f32])],
    ) {
        let level = level().or_supported();
        if level == KernelLevel::Reference || parts.len() < 2 {
            for (m, y) in parts.iter_mut() {
                m.matmul_q8_at(level, pool, xq, y);
            }
            return;
        }
        let mut first_tile = Vec::with_capacity(parts.len() + 1);
        first_tile.push(0);
        for (m, y) in parts.iter() {
            assert_eq!(xq.cols, m.cols, "matmul_q8_fused: activation width");
            assert!(
                y.len() >= xq.n * m.rows,
                "matmul_q8_fused: output of {} for {} × {}",
                y.len(),
                xq.n,
                m.rows
            );
            first_tile.push(first_tile.last().unwrap() + m.tiles);
        }
        if xq.n == 0 {
            return;
        }
        let outs: Vec<(&TernaryMatrix, OutPtr)> = parts
            .iter_mut()
            .map(|(m, y)| (*m, OutPtr::new(y)))
            .collect();
        let small = super::small_m::applies(xq);
        let total = *first_tile.last().unwrap();
        let run = |tiles: Range<usize>| {
            // The matrices whose tiles the chunk covers, each with its local tile range.
            for (i, &(m, out)) in outs.iter().enumerate() {
                let (lo, hi) = (
                    tiles.start.max(first_tile[i]),
                    tiles.end.min(first_tile[i + 1]),
                );
                if lo < hi {
                    m.run_tiles(
                        level,
                        small,
                        lo - first_tile[i]..hi - first_tile[i],
                        xq,
                        out,
                    );
                }
            }
        };
        if small {
            super::for_each_chunk_guided(pool, total, SMALL_M_MIN_TILES, &run);
        } else {
            super::for_each_chunk(pool, total, parts[0].0.tile_bytes(), &run);
        }
    }

    /// Bytes of codes and scales of one tile.
    fn tile_bytes(&self) -> usize {
        self.blocks * (TILE_BLOCK_BYTES + TILE_ROWS * 2)
    }

    /// The kernel of `level` on `tiles`: one row: the matvec of each level; 2..=16 rows with
    /// their panel built (`small`): the small-M kernels (`kernels/small_m.rs`); more: the
    /// prefill GEMM.
    fn run_tiles(
        &self,
        level: KernelLevel,
        small: bool,
        tiles: Range<usize>,
        xq: &ActQ8,
        out: OutPtr,
    ) {
        match level {
            KernelLevel::Portable if small => super::portable::small_m_tiles(self, tiles, xq, out),
            KernelLevel::Portable => super::portable::ternary_tiles(self, tiles, xq, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` checked avx2, fma and f16c.
            KernelLevel::Avx2 if small => unsafe {
                super::avx2_small::ternary_tiles(self, tiles, xq, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` checked avx2, fma and f16c.
            KernelLevel::Avx2 => unsafe { super::avx2::ternary_tiles(self, tiles, xq, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` checked avx512f, avx512bw and avx512vnni.
            KernelLevel::Avx512 if small => unsafe {
                super::avx512_small::ternary_tiles(self, tiles, xq, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` checked avx512f, avx512bw and avx512vnni.
            KernelLevel::Avx512 => unsafe { super::avx512::ternary_tiles(self, tiles, xq, out) },
            _ => super::portable::ternary_tiles(self, tiles, xq, out),
        }
    }

    /// Writes the results of one tile for token `t` (rows past the matrix end are dropped).
    ///
    /// # Safety
    /// The caller must be the only thread writing this tile's rows.
    #[inline]
    pub(crate) unsafe fn store_tile(
        &self,
        out: OutPtr,
        t: usize,
        tile: usize,
        vals: &[f32; TILE_ROWS],
    ) {
        let r0 = tile * TILE_ROWS;
        let valid = (self.rows - r0).min(TILE_ROWS);
        out.write(t * self.rows + r0, &vals[..valid]);
    }
}

/// The largest `s` in 0..=2 such that, in every tile, each block's 16 scales equal those of
/// the first block of its group of `2^s` blocks.
fn widest_scale_group(scales: &[f32], blocks: usize) -> u32 {
    let per_tile = blocks * TILE_ROWS;
    for s in [2u32, 1] {
        let same = scales.par_chunks(per_tile).all(|tile| {
            (0..blocks).all(|b| {
                let first = (b >> s) << s;
                let (a, f) = (&tile[b * TILE_ROWS..], &tile[first * TILE_ROWS..]);
                // Bit equality: -0.0 and 0.0 must stay distinct for exact dequantization.
                (0..TILE_ROWS).all(|j| a[j].to_bits() == f[j].to_bits())
            })
        });
        if same {
            return s;
        }
    }
    0
}

/// Keeps the scales of the first block of each group of `2^shift` blocks.
fn compact_scales(scales: Vec<f32>, blocks: usize, shift: u32) -> Vec<f32> {
    if shift == 0 {
        return scales;
    }
    let step = 1 << shift;
    scales
        .chunks(blocks * TILE_ROWS)
        .flat_map(|tile| {
            tile.chunks(TILE_ROWS)
                .step_by(step)
                .flat_map(|g| g.iter().copied())
        })
        .collect()
}

/// Reads the 16 rows of `tile` from `src` and packs them (see the layout in `kernels/mod.rs`).
fn pack_tile(
    src: &dyn TernaryRows,
    tile: usize,
    row_codes: &mut [u8],
    row_scales: &mut [f32],
    tile_codes: &mut [Line],
    tile_scales: &mut [f32],
) -> Result<()> {
    let blocks = row_scales.len();
    for j in 0..TILE_ROWS {
        let r = tile * TILE_ROWS + j;
        if r < src.rows() {
            row_codes.fill(0);
            src.row(r, row_codes, row_scales);
            // An OR over the row (vectorized) first; the position only when something is wrong.
            let bad = row_codes.iter().fold(0u8, |acc, &c| acc | (c & !3));
            if let Some(k) = (bad != 0)
                .then(|| row_codes.iter().position(|&c| c > 3))
                .flatten()
            {
                return Err(Error::Format(format!(
                    "ternary source gave code {} at row {r}, column {k} (codes must be 0..=3)",
                    row_codes[k]
                )));
            }
        } else {
            // Padding row: t = 0 and scale 0, so it contributes nothing and is never stored.
            row_codes.fill(1);
            row_scales.fill(0.0);
        }
        for b in 0..blocks {
            tile_scales[b * TILE_ROWS + j] = row_scales[b];
            let rc = &row_codes[b * BLOCK..][..BLOCK];
            let lines = &mut tile_codes[b * 4..][..4];
            for (p, line) in lines.iter_mut().enumerate() {
                // Byte i of the row's 4 bytes in this line holds codes 16p + 4s + i at bits 2s.
                // Codes are ≤ 3, so four codes shifted by 0/2/4/6 inside a u32 never carry into
                // the next byte: one word operation packs all four bytes.
                let word = |s: usize| {
                    let q = &rc[16 * p + 4 * s..][..4];
                    u32::from_le_bytes([q[0], q[1], q[2], q[3]])
                };
                let packed = word(0) | word(1) << 2 | word(2) << 4 | word(3) << 6;
                line.0[4 * j..4 * j + 4].copy_from_slice(&packed.to_le_bytes());
            }
        }
    }
    Ok(())
}
