//! Dense matrices (f32, or f16/bf16 kept at 2 bytes) on the GPU: the `dense_rows_*` kernels
//! (gemv.cu) for one row (the decode step's products) or many (a prompt chunk, a batch), and a
//! one-kernel run for the GPU tests.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::weights::DevMatrix;
use trit::quant::float::HalfKind;
use trit::{Error, Result};

/// `y[t] (+)= m·x[t]` for `ntok` consecutive f32 rows of `x` (and of `y`) through a dense
/// (f32/f16/bf16) matrix: each weight is read once per 8 rows (`dense_rows_*` in gemv.cu).
pub fn launch_dense(
    gpu: &Gpu,
    m: &DevMatrix,
    x: u64,
    ntok: usize,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    const TILE: usize = 8; // DENSE_TILE
    let s = &gpu.stream;
    let (kernel, w, rows, cols) = match m {
        DevMatrix::Dense { rows, cols, w } => ("dense_rows_f32", ptr(w, s), *rows, *cols),
        DevMatrix::Half {
            rows,
            cols,
            w,
            kind,
        } => {
            let k = match kind {
                HalfKind::F16 => "dense_rows_f16",
                HalfKind::BF16 => "dense_rows_bf16",
            };
            (k, ptr(w, s), *rows, *cols)
        }
        DevMatrix::Ternary { .. } => {
            return Err(Error::InvalidArgument(
                "launch_dense on a ternary matrix".into(),
            ))
        }
    };
    gpu.launch(
        kernel,
        (rows.div_ceil(4) as u32, ntok.div_ceil(TILE) as u32),
        128,
        &[
            Arg::Ptr(w),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::Ptr(x),
            Arg::I32(ntok as i32),
            Arg::Ptr(y),
            Arg::I32(accumulate as i32),
        ],
    )
}

/// `m · x[t]` for the `x.len() / cols` rows of `x`, computed by one `dense_rows_*` launch and
/// copied back (GPU tests: the kernels against an f64 reference on ragged shapes).
pub fn dense_rows_once(gpu: &Gpu, m: &DevMatrix, x: &[f32]) -> Result<Vec<f32>> {
    let cols = m.cols();
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return Err(Error::InvalidArgument(
            "activations are not whole rows of the matrix's width".into(),
        ));
    }
    let ntok = x.len() / cols;
    let s = &gpu.stream;
    let xd = gpu.upload(x)?;
    let y = gpu.upload(&vec![f32::NAN; m.rows() * ntok])?;
    launch_dense(gpu, m, ptr(&xd, s), ntok, ptr(&y, s), false)?;
    s.clone_dtoh(&y)
        .map_err(|e| cuda_err("reading the dense product", e))
}
