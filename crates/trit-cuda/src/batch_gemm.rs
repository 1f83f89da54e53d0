//! Launching the small-batch ternary GEMM of the batched decode step
//! (`kernels/batch_gemm.cu`), and a one-kernel entry point the GPU tests use to check it against
//! the CPU emulation of its arithmetic (`repack::gemv_reference`, token by token).

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::gemv::TernaryArgs;
use crate::repack::{PackedScales, PackedTernary};
use trit::{Error, Result};

/// Output rows and tokens of one block (`SG_ROWS`, `SG_TOKS` in batch_gemm.cu).
const TILE_ROWS: usize = 32;
const TILE_TOKS: usize = 32;

/// `y (+)= W · x` for `ntok` token rows of int8 activations `q`/`meta` (device addresses).
pub(crate) fn launch_small_gemm(
    gpu: &Gpu,
    m: &TernaryArgs,
    ntok: usize,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    if gpu.compute_capability.0 < 8 {
        return Err(Error::Unsupported(
            "CUDA: the batched decode GEMM needs int8 tensor cores (compute capability 8.0+)"
                .into(),
        ));
    }
    let kernel = if m.f16 {
        "ternary_gemm_small_f16"
    } else {
        "ternary_gemm_small_f32"
    };
    gpu.launch(
        kernel,
        (
            ntok.div_ceil(TILE_TOKS) as u32,
            m.rows.div_ceil(TILE_ROWS) as u32,
        ),
        256,
        &[
            Arg::Ptr(m.codes),
            Arg::Ptr(m.scales),
            Arg::I32(m.rows as i32),
            Arg::I32((m.cols / 64) as i32),
            Arg::I32(ntok as i32),
            Arg::Ptr(q),
            Arg::Ptr(meta),
            Arg::Ptr(y),
            Arg::I32(accumulate as i32),
        ],
    )
}

/// Runs the small-batch GEMM once for `q.len() / m.cols` tokens, on top of `y0` (accumulating)
/// or into fresh memory (`None`); returns `rows` values per token.
pub fn small_gemm_once(
    gpu: &Gpu,
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
    let codes = gpu.upload(&m.codes)?;
    let scales = match &m.scales {
        PackedScales::F16(v) => crate::weights::DevScales::F16(gpu.upload(v)?),
        PackedScales::F32(v) => crate::weights::DevScales::F32(gpu.upload(v)?),
    };
    let q8: Vec<u8> = q.iter().map(|v| *v as u8).collect();
    let flat: Vec<f32> = meta.iter().flat_map(|(a, b)| [*a, *b]).collect();
    let (qd, md) = (gpu.upload(&q8)?, gpu.upload(&flat)?);
    // NaN-poisoned when not accumulating: an output the kernel skips fails the comparison.
    let yd = match y0 {
        Some(y) => gpu.upload(y)?,
        None => gpu.upload(&vec![f32::NAN; ntok * m.rows])?,
    };
    let args = TernaryArgs::new(m.rows, m.cols, &codes, &scales, s);
    launch_small_gemm(
        gpu,
        &args,
        ntok,
        ptr(&qd, s),
        ptr(&md, s),
        ptr(&yd, s),
        y0.is_some(),
    )?;
    gpu.sync()?;
    gpu.stream
        .clone_dtoh(&yd)
        .map_err(|e| cuda_err("copying the small GEMM result", e))
}
