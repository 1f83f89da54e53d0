//! Launches of the element kernels that the decode step (one row) and the batched prefill
//! (`rows` rows, one block row each) share, so both paths hand the kernels the same
//! arguments.

use crate::device::{ptr, Arg, Gpu};
use crate::weights::{DevMatrix, DevScales};
use trit::format::config::Activation;
use trit::quant::float::HalfKind;
use trit::Result;

/// Embedding rows of the tokens at `toks[step..step + rows]` into `out` (row after row).
pub(crate) fn embed(
    g: &Gpu,
    m: &DevMatrix,
    toks: u64,
    step: u64,
    out: u64,
    rows: u32,
) -> Result<()> {
    let s = &g.stream;
    let embed_dense = |g: &Gpu, kernel: &str, w: u64, cols: usize| {
        let args = [
            Arg::Ptr(w),
            Arg::I32(cols as i32),
            Arg::Ptr(toks),
            Arg::Ptr(step),
            Arg::Ptr(out),
        ];
        g.launch(kernel, (cols.div_ceil(256) as u32, rows), 256, &args)
    };
    match m {
        DevMatrix::Ternary {
            cols,
            codes,
            scales,
            ..
        } => {
            let (sp, k) = match scales {
                DevScales::F16(v) => (ptr(v, s), "embed_ternary_f16"),
                DevScales::F32(v) => (ptr(v, s), "embed_ternary_f32"),
            };
            g.launch(
                k,
                (cols.div_ceil(256) as u32, rows),
                256,
                &[
                    Arg::Ptr(ptr(codes, s)),
                    Arg::Ptr(sp),
                    Arg::I32((cols / 64) as i32),
                    Arg::Ptr(toks),
                    Arg::Ptr(step),
                    Arg::Ptr(out),
                ],
            )
        }
        DevMatrix::Dense { w, cols, .. } => embed_dense(g, "embed_dense", ptr(w, s), *cols),
        DevMatrix::Half { w, cols, kind, .. } => {
            let k = match kind {
                HalfKind::F16 => "embed_dense_f16",
                HalfKind::BF16 => "embed_dense_bf16",
            };
            embed_dense(g, k, ptr(w, s), *cols)
        }
    }
}

/// Where a quantized activation goes: f32 copy, int8 values, per-block scale/sum metadata.
#[derive(Clone, Copy)]
pub(crate) struct QuantOut {
    pub f32: u64,
    pub q: u64,
    pub meta: u64,
}

/// Whether `rms_norm_quant` takes the vectorized kernel for rows of `d` values: it keeps the
/// values in registers, so `out.f32` may be 0 there (only the int8 blocks are written).
pub(crate) fn norm_can_skip_f32(d: usize) -> bool {
    d.is_multiple_of(64) && d <= 8192
}

/// RMSNorm of `rows` rows of `d` values at `x` with weights `w`, quantized to int8 (`out.f32`
/// 0: no f32 copy, allowed where [`norm_can_skip_f32`]).
pub(crate) fn rms_norm_quant(
    g: &Gpu,
    x: u64,
    w: u64,
    eps: f32,
    d: usize,
    out: QuantOut,
    rows: u32,
) -> Result<()> {
    let vectorized = norm_can_skip_f32(d);
    if out.f32 == 0 && !vectorized {
        return Err(trit::Error::InvalidArgument(format!(
            "RMSNorm of {d}-wide rows needs an f32 output"
        )));
    }
    g.launch(
        if vectorized {
            "rms_norm_quant_v4"
        } else {
            "rms_norm_quant"
        },
        (1, rows),
        norm_threads(g, vectorized, rows),
        &[
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::F32(eps),
            Arg::I32(d as i32),
            Arg::Ptr(out.f32),
            Arg::Ptr(out.q),
            Arg::Ptr(out.meta),
        ],
    )
}

/// BitNet's sub-norm: RMSNorm of `rows` rows of `n` values at `x` with weights `w`, in place
/// (`f32_needed`: also the normalized f32 values, for a dense matrix or rows the vectorized
/// kernel does not take), quantized to int8 at `q`/`meta` for the next projection.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sub_norm_quant(
    g: &Gpu,
    x: u64,
    w: u64,
    eps: f32,
    n: usize,
    (q, meta): (u64, u64),
    rows: u32,
    f32_needed: bool,
) -> Result<()> {
    let f32 = if f32_needed || !norm_can_skip_f32(n) {
        x
    } else {
        0
    };
    rms_norm_quant(g, x, w, eps, n, QuantOut { f32, q, meta }, rows)
}

/// Threads per row of the norm kernels: 1024 while the rows fit on the GPU at once that way
/// (a decode step's few rows; one 1024-thread block per multiprocessor), else 256 for the
/// vectorized kernel (a prefill's 512 rows then all fit, each thread with several loads in
/// flight).
fn norm_threads(g: &Gpu, vectorized: bool, rows: u32) -> u32 {
    if vectorized && rows > g.sm_count {
        256
    } else {
        1024
    }
}

/// int8 quantization of `n` contiguous values at `x` (64-value blocks).
pub(crate) fn quantize_vec(g: &Gpu, x: u64, n: usize, q: u64, meta: u64) -> Result<()> {
    g.launch(
        "quantize_vec",
        ((n / 64).div_ceil(4) as u32, 1),
        128,
        &[Arg::Ptr(x), Arg::I32(n as i32), Arg::Ptr(q), Arg::Ptr(meta)],
    )
}

/// The gated product of `rows` rows of stacked gate‖up (`ffn` each) into `out` (f32 + int8):
/// `act(gate) ⊙ up` for the model's MLP activation (SwiGLU, or BitNet's relu²).
pub(crate) fn glu_quant(
    g: &Gpu,
    gu: u64,
    ffn: usize,
    act: Activation,
    out: QuantOut,
    rows: u32,
) -> Result<()> {
    let args = [
        Arg::Ptr(gu),
        Arg::I32(ffn as i32),
        Arg::I32(glu_act_code(act)),
        Arg::Ptr(out.f32),
        Arg::Ptr(out.q),
        Arg::Ptr(out.meta),
    ];
    if ffn.is_multiple_of(64) {
        // Four values per lane (`glu_quant_v4`), 256 lanes per block.
        let grid = ((ffn / 4).div_ceil(256) as u32, rows);
        return g.launch("glu_quant_v4", grid, 256, &args);
    }
    let grid = (ffn.div_ceil(64).div_ceil(4) as u32, rows);
    g.launch("glu_quant", grid, 128, &args)
}

/// The kernels' number for an activation (`glu_act` in common.cuh).
fn glu_act_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => 0,
        Activation::ReluSq => 1,
    }
}
