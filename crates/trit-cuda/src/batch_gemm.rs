//! Launching the small-batch ternary GEMM of the batched decode step
//! (`kernels/batch_gemm.cu`), and a one-kernel entry point the GPU tests use to check it against
//! the CPU emulation of its arithmetic (`repack::gemv_reference`, token by token).

use crate::device::{ptr, Gpu};
use crate::gemm::{launch_int8_gemm, Int8Gemm, SplitK, NO_SPLIT};
use crate::gemv::{OneShot, TernaryArgs};
use crate::repack::PackedTernary;
use cudarc::driver::CudaSlice;
use trit::{Error, Result};

/// Which small-batch GEMM kernel: the 64 columns of a block in the mma's own k order, or
/// `Wide` (each lane's columns contiguous: fewer, wider loads; `WIDE` in batch_gemm.cu), or
/// `Ring` (`Wide` with the weights staged through shared memory in quads of 4 blocks; `RING`
/// in batch_gemm.cu). `Ring` needs rows of a multiple of 4 blocks (256 columns): other
/// matrices run `Wide`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallGemm {
    Plain,
    Wide,
    Ring,
}

impl SmallGemm {
    /// `Ring` (H200, session 17: 8B at 32 sequences 7,200 tok/s against `Wide`'s 5,967, at 8
    /// +24 %; 27B hybrid at 8 +31 %; BENCHMARKS.md "GPU, session 17"), or `Wide` / `Plain`
    /// with TRIT_CUDA_BATCH_GEMM=wide / plain.
    pub fn from_env() -> SmallGemm {
        match std::env::var("TRIT_CUDA_BATCH_GEMM").as_deref() {
            Ok("plain") => SmallGemm::Plain,
            Ok("wide") => SmallGemm::Wide,
            _ => SmallGemm::Ring,
        }
    }

    /// The kernel that runs a matrix of `nb` 64-column blocks per row.
    fn for_blocks(self, nb: usize) -> SmallGemm {
        match self {
            SmallGemm::Ring if !nb.is_multiple_of(4) => SmallGemm::Wide,
            k => k,
        }
    }

    /// `SG_ROWS` = 32 rows × `SG_TOKS` = 32 tokens per block (every kernel).
    fn kernels(self) -> &'static Int8Gemm {
        const PLAIN: Int8Gemm = Int8Gemm {
            f16: "ternary_gemm_small_f16",
            f32: "ternary_gemm_small_f32",
            tile_toks: 32,
            tile_rows: 32,
            split_k: true,
            what: "the batched decode GEMM",
            dyn_smem: 0,
        };
        const WIDE: Int8Gemm = Int8Gemm {
            f16: "ternary_gemm_small_wide_f16",
            f32: "ternary_gemm_small_wide_f32",
            tile_toks: 32,
            tile_rows: 32,
            split_k: true,
            what: "the batched decode GEMM",
            dyn_smem: 0,
        };
        const RING: Int8Gemm = Int8Gemm {
            f16: "ternary_gemm_small_ring_f16",
            f32: "ternary_gemm_small_ring_f32",
            dyn_smem: RING_SMEM,
            ..WIDE
        };
        match self {
            SmallGemm::Plain => &PLAIN,
            SmallGemm::Wide => &WIDE,
            SmallGemm::Ring => &RING,
        }
    }
}

/// Column parts of a small GEMM with `tiles` output tiles of `col_blocks` 64-column blocks
/// when `slots` blocks fit on the GPU at once: as many as fill the slots in one wave, each
/// warp still taking at least two column blocks, and `parts × tiles` within `room` partial
/// tiles; 1 (no split) where that gives fewer than 2. 8B at B = 32, 264 slots (132
/// multiprocessors × 2): o and down 2; q‖k‖v, gate‖up and the head 1.
pub fn small_split(tiles: usize, col_blocks: usize, slots: usize, room: usize) -> usize {
    let parts = (slots / tiles.max(1))
        .min(col_blocks / (2 * SG_WARPS))
        .min(room / tiles.max(1))
        .min(8);
    if parts < 2 {
        1
    } else {
        parts
    }
}

/// Warps of a small-GEMM block (`SG_WARPS` in batch_gemm.cu).
const SG_WARPS: usize = 8;

/// The ring kernels' dynamic shared memory, `SG_RING_SMEM` in batch_gemm.cu: per warp
/// `SG_RING` = 3 stages of 32 rows × 4 blocks of codes (2 KB) and their scales (512 bytes).
const RING_SMEM: u32 = (SG_WARPS * 3 * (2048 + 512)) as u32;

/// Partial tiles and per-tile tickets of split-K small GEMMs (see batch_gemm.cu), room for
/// four tiles per multiprocessor. One per batched path: its GEMMs run one after another.
pub(crate) struct SplitScratch {
    part: CudaSlice<f32>,
    tickets: CudaSlice<u32>,
    room: usize,
    /// Parts for every GEMM instead of [`small_split`]'s (`TRIT_CUDA_SPLIT=N`; 0 or 1: off).
    forced: Option<usize>,
}

impl SplitScratch {
    pub(crate) fn new(gpu: &Gpu) -> Result<SplitScratch> {
        let room = 4 * gpu.sm_count as usize;
        Ok(SplitScratch {
            part: gpu.zeros(room * 32 * 32)?,
            tickets: gpu.zeros(room)?,
            room,
            forced: std::env::var("TRIT_CUDA_SPLIT")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
        })
    }

    /// The split of `m` for `ntok` rows with kernel `k`: the forced parts, else
    /// [`small_split`]'s; clamped to what the scratch holds.
    fn split(&self, gpu: &Gpu, k: &Int8Gemm, m: &TernaryArgs, ntok: usize) -> Result<SplitK> {
        let tiles = ntok.div_ceil(32) * m.rows.div_ceil(32);
        let parts = match self.forced {
            Some(p) => p.clamp(1, (self.room / tiles.max(1)).max(1)),
            None => {
                let kernel = if m.f16 { k.f16 } else { k.f32 };
                let threads = 32 * SG_WARPS as u32;
                let blocks = gpu.resident_blocks_smem(kernel, threads, k.dyn_smem as usize)?;
                let slots = gpu.sm_count * blocks;
                small_split(tiles, m.cols / 64, slots as usize, self.room)
            }
        };
        if parts < 2 {
            return Ok(NO_SPLIT);
        }
        let s = &gpu.stream;
        Ok(SplitK {
            parts,
            part: ptr(&self.part, s),
            tickets: ptr(&self.tickets, s),
        })
    }
}

/// `y (+)= W · x` for `ntok` token rows of int8 activations `q`/`meta` (device addresses),
/// split-K where [`small_split`] says so.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_small_gemm(
    gpu: &Gpu,
    kernel: SmallGemm,
    m: &TernaryArgs,
    ntok: usize,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
    scratch: &SplitScratch,
) -> Result<()> {
    let k = kernel.for_blocks(m.cols / 64).kernels();
    let split = scratch.split(gpu, k, m, ntok)?;
    launch_int8_gemm(gpu, k, m, ntok, q, meta, y, accumulate, split)
}

/// Runs the small-batch GEMM once for `q.len() / m.cols` tokens, on top of `y0` (accumulating)
/// or into fresh memory (`None`), its columns in `parts` split-K parts (`None`: as the decode
/// step would choose); returns `rows` values per token.
pub fn small_gemm_once(
    gpu: &Gpu,
    kernel: SmallGemm,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    y0: Option<&[f32]>,
    parts: Option<usize>,
) -> Result<Vec<f32>> {
    if m.cols == 0 || !q.len().is_multiple_of(m.cols) || meta.len() * 64 != q.len() {
        return Err(Error::InvalidArgument(
            "activations are not whole rows of the matrix's width".into(),
        ));
    }
    let ntok = q.len() / m.cols;
    if y0.is_some_and(|y| y.len() != ntok * m.rows) {
        return Err(Error::InvalidArgument("y0 is not rows × tokens".into()));
    }
    let s = &gpu.stream;
    let c = match y0 {
        Some(y) => OneShot::upload_onto(gpu, m, q, meta, y)?,
        None => OneShot::upload(gpu, m, q, meta, ntok * m.rows)?,
    };
    let mut scratch = SplitScratch::new(gpu)?;
    scratch.forced = parts.or(scratch.forced);
    let (q, meta, y) = (ptr(&c.q, s), ptr(&c.meta, s), ptr(&c.y, s));
    let args = c.args(m, s);
    launch_small_gemm(gpu, kernel, &args, ntok, q, meta, y, y0.is_some(), &scratch)?;
    c.result(gpu, "small GEMM")
}

#[cfg(test)]
mod tests {
    use super::small_split;

    #[test]
    fn few_row_tiles_split_their_columns_many_do_not() {
        let room = 4 * 132;
        // 8B at 32 rows (one token tile), 2 blocks per multiprocessor: o and down, q‖k‖v,
        // gate‖up, the head.
        assert_eq!(small_split(128, 64, 264, room), 2);
        assert_eq!(small_split(128, 192, 264, room), 2);
        assert_eq!(small_split(192, 64, 264, room), 1);
        assert_eq!(small_split(768, 64, 264, room), 1);
        assert_eq!(small_split(4748, 64, 264, room), 1);
        // 3 blocks per multiprocessor: q‖k‖v splits too.
        assert_eq!(small_split(128, 192, 396, room), 3);
        assert_eq!(small_split(192, 64, 396, room), 2);
        // Short rows keep at least two column blocks per warp.
        assert_eq!(small_split(4, 40, 264, room), 2);
        assert_eq!(small_split(4, 20, 264, room), 1);
        // The scratch bounds the parts.
        assert_eq!(small_split(4, 4096, 264, 12), 3);
    }
}
