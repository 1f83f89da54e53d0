//! Launching the ternary GEMV (`kernels/gemv.cu`): kernel variant and grid for a matrix, and a
//! one-kernel entry point the GPU tests use to check the kernel against the CPU emulation of
//! its arithmetic (`repack::gemv_reference`) on shapes the test models do not reach.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::repack::{PackedScales, PackedTernary};
use trit::{Error, Result};

/// Device addresses and shape of a ternary matrix.
pub struct TernaryArgs {
    pub rows: usize,
    pub cols: usize,
    pub codes: u64,
    pub scales: u64,
    /// Scales are f16 (else f32).
    pub f16: bool,
}

/// `y (+)= W·x` for int8 activations `q`/`meta` (device addresses). `r`: rows per warp;
/// `max_split`: most warps that share one row group (long rows are split between them).
#[allow(clippy::too_many_arguments)]
pub fn launch_ternary(
    gpu: &Gpu,
    m: &TernaryArgs,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
    r: usize,
    max_split: usize,
) -> Result<()> {
    // Warps sharing one row group: as many as the row has 32-block lane-steps, at most
    // `max_split`.
    let steps = (m.cols / 64).div_ceil(32);
    let split = [4, 2]
        .into_iter()
        .find(|s| *s <= max_split && steps >= *s)
        .unwrap_or(1);
    let kind = if m.f16 { "f16" } else { "f32" };
    let kernel = kernel_name(&format!("ternary_gemv_r{r}_s{split}_{kind}"))?;
    let threads = 32 * split as u32;
    let needed = m.rows.div_ceil(r) as u32;
    let resident = gpu.sm_count * gpu.resident_blocks(kernel, threads)?;
    gpu.launch(
        kernel,
        (needed.min(resident), 1),
        threads,
        &[
            Arg::Ptr(m.codes),
            Arg::Ptr(m.scales),
            Arg::I32(m.rows as i32),
            Arg::I32((m.cols / 64) as i32),
            Arg::Ptr(q),
            Arg::Ptr(meta),
            Arg::Ptr(y),
            Arg::I32(accumulate as i32),
        ],
    )
}

/// The kernel names are static strings in `device::KERNELS`; map a formatted name onto them.
fn kernel_name(name: &str) -> Result<&'static str> {
    crate::device::KERNELS
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| Error::InvalidArgument(format!("no GEMV kernel {name}")))
}

/// Runs one ternary GEMV on the GPU: `m` times int8 activations `q` with per-64 `(d, d·Σq)`.
pub fn ternary_gemv_once(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    r: usize,
    max_split: usize,
) -> Result<Vec<f32>> {
    if q.len() != m.cols || meta.len() != m.blocks() {
        return Err(Error::InvalidArgument(
            "activation length differs from the matrix".into(),
        ));
    }
    let s = &gpu.stream;
    let codes = gpu.upload(&m.codes)?;
    let (scales16, scales32) = match &m.scales {
        PackedScales::F16(v) => (Some(gpu.upload(v)?), None),
        PackedScales::F32(v) => (None, Some(gpu.upload(v)?)),
    };
    let q8: Vec<u8> = q.iter().map(|v| *v as u8).collect();
    let qd = gpu.upload(&q8)?;
    let flat: Vec<f32> = meta.iter().flat_map(|(a, b)| [*a, *b]).collect();
    let md = gpu.upload(&flat)?;
    // Poisoned output: a row the kernel skips stays NaN and fails the comparison.
    let y = gpu.upload(&vec![f32::NAN; m.rows])?;
    let args = TernaryArgs {
        rows: m.rows,
        cols: m.cols,
        codes: ptr(&codes, s),
        scales: scales16
            .as_ref()
            .map(|v| ptr(v, s))
            .or(scales32.as_ref().map(|v| ptr(v, s)))
            .unwrap_or(0),
        f16: scales16.is_some(),
    };
    launch_ternary(
        gpu,
        &args,
        ptr(&qd, s),
        ptr(&md, s),
        ptr(&y, s),
        false,
        r,
        max_split,
    )?;
    gpu.sync()?;
    s.clone_dtoh(&y)
        .map_err(|e| cuda_err("copying the GEMV result", e))
}
