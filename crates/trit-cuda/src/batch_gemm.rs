//! Launching the small-batch ternary GEMM of the batched decode step
//! (`kernels/batch_gemm.cu`), and a one-kernel entry point the GPU tests use to check it against
//! the CPU emulation of its arithmetic (`repack::gemv_reference`, token by token).

use crate::device::{ptr, Gpu};
use crate::gemv::{launch_int8_gemm, Int8Gemm, OneShot, TernaryArgs};
use crate::repack::PackedTernary;
use trit::{Error, Result};

/// Which small-batch GEMM kernel: the 64 columns of a block in the mma's own k order, or
/// `Wide` (each lane's columns contiguous: fewer, wider loads; `WIDE` in batch_gemm.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallGemm {
    Plain,
    Wide,
}

impl SmallGemm {
    /// `Wide` (measured faster at 32 and 64 sequences on the H200, BENCHMARKS.md "GPU batched
    /// decode, session 6"), or `Plain` with TRIT_CUDA_BATCH_GEMM=plain.
    pub fn from_env() -> SmallGemm {
        match std::env::var("TRIT_CUDA_BATCH_GEMM").as_deref() {
            Ok("plain") => SmallGemm::Plain,
            _ => SmallGemm::Wide,
        }
    }

    /// `SG_ROWS` = 32 rows × `SG_TOKS` = 32 tokens per block (both kernels).
    fn kernels(self) -> &'static Int8Gemm {
        const PLAIN: Int8Gemm = Int8Gemm {
            f16: "ternary_gemm_small_f16",
            f32: "ternary_gemm_small_f32",
            tile_toks: 32,
            tile_rows: 32,
            what: "the batched decode GEMM",
        };
        const WIDE: Int8Gemm = Int8Gemm {
            f16: "ternary_gemm_small_wide_f16",
            f32: "ternary_gemm_small_wide_f32",
            tile_toks: 32,
            tile_rows: 32,
            what: "the batched decode GEMM",
        };
        match self {
            SmallGemm::Plain => &PLAIN,
            SmallGemm::Wide => &WIDE,
        }
    }
}

/// `y (+)= W · x` for `ntok` token rows of int8 activations `q`/`meta` (device addresses).
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
) -> Result<()> {
    launch_int8_gemm(gpu, kernel.kernels(), m, ntok, q, meta, y, accumulate)
}

/// Runs the small-batch GEMM once for `q.len() / m.cols` tokens, on top of `y0` (accumulating)
/// or into fresh memory (`None`); returns `rows` values per token.
pub fn small_gemm_once(
    gpu: &Gpu,
    kernel: SmallGemm,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    y0: Option<&[f32]>,
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
    launch_small_gemm(
        gpu,
        kernel,
        &c.args(m, s),
        ntok,
        ptr(&c.q, s),
        ptr(&c.meta, s),
        ptr(&c.y, s),
        y0.is_some(),
    )?;
    c.result(gpu, "small GEMM")
}
