//! Int8 tensor-core GEMMs over the 2-bit ternary layout: the prefill's (`ternary_gemm` in
//! kernels/prefill.cu) and the batched decode's (`batch_gemm.rs`, the same arguments plus two
//! for its split-K).

use crate::device::{ptr, Arg, Gpu};
use crate::gemv::{OneShot, TernaryArgs};
use crate::repack::PackedTernary;
use trit::{Error, Result};

/// An int8 tensor-core GEMM kernel pair (f16 / f32 weight scales): the prefill's and the
/// batched decode's differ in their output tile and whether they take split-K arguments.
pub(crate) struct Int8Gemm {
    pub f16: &'static str,
    pub f32: &'static str,
    /// Tokens and rows of one block's output tile.
    pub tile_toks: usize,
    pub tile_rows: usize,
    /// The kernel takes split-K arguments (`part`, `tickets`; parts on `gridDim.z`).
    pub split_k: bool,
    /// Named in the error on a GPU without int8 tensor cores.
    pub what: &'static str,
    /// Bytes of dynamic shared memory per block (kernels in `DYNAMIC_SMEM_KERNELS`).
    pub dyn_smem: u32,
}

/// The prefill GEMM (`ternary_gemm` in prefill.cu): `GM_ROWS` = 128 rows × `GM_TOKS` = 64
/// tokens per block.
const PREFILL_GEMM: Int8Gemm = Int8Gemm {
    f16: "ternary_gemm_f16",
    f32: "ternary_gemm_f32",
    tile_toks: 64,
    tile_rows: 128,
    split_k: false,
    what: "the prefill GEMM",
    dyn_smem: 0,
};

/// A split-K launch (`split_k` kernels): `parts` ranges of the columns, partial tiles in
/// `part`, one ticket per output tile in `tickets` (device addresses; see batch_gemm.cu).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitK {
    pub parts: usize,
    pub part: u64,
    pub tickets: u64,
}

/// One part: the whole row length in each block.
pub(crate) const NO_SPLIT: SplitK = SplitK {
    parts: 1,
    part: 0,
    tickets: 0,
};

/// `Y (+)= X·Wᵀ` for `ntok` tokens with kernel `k`: `q`/`meta` hold each token's int8
/// activations (`cols` values, `cols / 64` pairs per token, token after token), `y` gets
/// `rows` values per token; `split`: the columns in parts (kernels that take it). Int8 tensor
/// cores: compute capability 8.0 or newer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_int8_gemm(
    gpu: &Gpu,
    k: &Int8Gemm,
    m: &TernaryArgs,
    ntok: usize,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
    split: SplitK,
) -> Result<()> {
    if gpu.compute_capability.0 < 8 {
        return Err(Error::Unsupported(format!(
            "CUDA: {} needs int8 tensor cores (compute capability 8.0+)",
            k.what
        )));
    }
    let grid = (
        ntok.div_ceil(k.tile_toks) as u32,
        m.rows.div_ceil(k.tile_rows) as u32,
        if k.split_k {
            split.parts.max(1) as u32
        } else {
            1
        },
    );
    let mut args = vec![
        Arg::Ptr(m.codes),
        Arg::Ptr(m.scales),
        Arg::I32(m.rows as i32),
        Arg::I32((m.cols / 64) as i32),
        Arg::I32(ntok as i32),
        Arg::Ptr(q),
        Arg::Ptr(meta),
        Arg::Ptr(y),
        Arg::I32(accumulate as i32),
    ];
    if k.split_k {
        args.extend([Arg::Ptr(split.part), Arg::Ptr(split.tickets)]);
    }
    gpu.launch_3d(
        if m.f16 { k.f16 } else { k.f32 },
        grid,
        256,
        k.dyn_smem,
        &args,
    )
}

/// The prefill GEMM for `ntok` tokens (see [`launch_int8_gemm`]).
pub fn launch_ternary_gemm(
    gpu: &Gpu,
    m: &TernaryArgs,
    ntok: usize,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    launch_int8_gemm(
        gpu,
        &PREFILL_GEMM,
        m,
        ntok,
        q,
        meta,
        y,
        accumulate,
        NO_SPLIT,
    )
}

/// Runs one prefill GEMM on the GPU for `q.len() / m.cols` tokens; returns `rows` values per
/// token (the GPU tests compare it with `repack::gemv_reference` of each token).
pub fn ternary_gemm_once(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
) -> Result<Vec<f32>> {
    if m.cols == 0 || !q.len().is_multiple_of(m.cols) || meta.len() * 64 != q.len() {
        return Err(Error::InvalidArgument(
            "activations are not whole rows of the matrix's width".into(),
        ));
    }
    let ntok = q.len() / m.cols;
    let s = &gpu.stream;
    let c = OneShot::upload(gpu, m, q, meta, m.rows * ntok)?;
    let (q, meta, y) = (ptr(&c.q, s), ptr(&c.meta, s), ptr(&c.y, s));
    let args = c.args(m, s);
    launch_int8_gemm(gpu, &PREFILL_GEMM, &args, ntok, q, meta, y, false, NO_SPLIT)?;
    c.result(gpu, "GEMM")
}
