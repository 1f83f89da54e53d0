//! Launching the ternary GEMV (`kernels/gemv.cu`): kernel variant and grid for a matrix, and a
//! one-kernel entry point the GPU tests use to check the kernel against the CPU emulation of
//! its arithmetic (`repack::gemv_reference`) on shapes the test models do not reach.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::repack::{PackedScales, PackedTernary};
use crate::weights::DevScales;
use cudarc::driver::{CudaSlice, CudaStream};
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

impl TernaryArgs {
    /// The arguments of a matrix resident on the GPU.
    pub fn new(
        rows: usize,
        cols: usize,
        codes: &CudaSlice<u32>,
        scales: &DevScales,
        s: &CudaStream,
    ) -> Self {
        let (scales, f16) = match scales {
            DevScales::F16(v) => (ptr(v, s), true),
            DevScales::F32(v) => (ptr(v, s), false),
        };
        TernaryArgs {
            rows,
            cols,
            codes: ptr(codes, s),
            scales,
            f16,
        }
    }
}

/// One test case uploaded for a single kernel run: the packed matrix, the int8 activations
/// with their per-64 `(d, d·Σq)`, and a NaN-poisoned output (a value the kernel skips stays
/// NaN and fails the comparison) or given starting values (to test accumulation).
pub(crate) struct OneShot {
    codes: CudaSlice<u32>,
    scales: DevScales,
    pub(crate) q: CudaSlice<u8>,
    pub(crate) meta: CudaSlice<f32>,
    pub(crate) y: CudaSlice<f32>,
}

impl OneShot {
    pub(crate) fn upload(
        gpu: &Gpu,
        m: &PackedTernary,
        q: &[i8],
        meta: &[(f32, f32)],
        outputs: usize,
    ) -> Result<Self> {
        Self::upload_onto(gpu, m, q, meta, &vec![f32::NAN; outputs])
    }

    /// [`upload`](Self::upload) with the output starting as `y0`.
    pub(crate) fn upload_onto(
        gpu: &Gpu,
        m: &PackedTernary,
        q: &[i8],
        meta: &[(f32, f32)],
        y0: &[f32],
    ) -> Result<Self> {
        let q8: Vec<u8> = q.iter().map(|v| *v as u8).collect();
        let flat: Vec<f32> = meta.iter().flat_map(|(a, b)| [*a, *b]).collect();
        Ok(OneShot {
            codes: gpu.upload(&m.codes)?,
            scales: match &m.scales {
                PackedScales::F16(v) => DevScales::F16(gpu.upload(v)?),
                PackedScales::F32(v) => DevScales::F32(gpu.upload(v)?),
            },
            q: gpu.upload(&q8)?,
            meta: gpu.upload(&flat)?,
            y: gpu.upload(y0)?,
        })
    }

    pub(crate) fn args(&self, m: &PackedTernary, s: &CudaStream) -> TernaryArgs {
        TernaryArgs::new(m.rows, m.cols, &self.codes, &self.scales, s)
    }

    pub(crate) fn result(&self, gpu: &Gpu, what: &str) -> Result<Vec<f32>> {
        gpu.sync()?;
        gpu.stream
            .clone_dtoh(&self.y)
            .map_err(|e| cuda_err(&format!("copying the {what} result"), e))
    }
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

/// Widest input the fused GEMV holds in shared memory (`FG_MAX_COLS` in gemv.cu).
pub const FUSED_MAX_COLS: usize = 16384;
/// Warps of one fused-GEMV block (`FG_WARPS`).
const FUSED_WARPS: usize = 16;

/// What the fused GEMV (`ternary_gemv_fused_*` in gemv.cu) makes its int8 activations from.
#[derive(Clone, Copy, Debug)]
pub enum FusedInput {
    /// int8 blocks and their per-64 `(d, d·Σq)` written by the previous kernel.
    Q { q: u64, meta: u64 },
    /// f32 values, quantized in the prologue.
    F32 { x: u64 },
    /// The residual stream: RMSNorm with weights `gamma`, then quantized, in the prologue.
    Norm { x: u64, gamma: u64, eps: f32 },
}

/// Launch options of the fused GEMV.
#[derive(Clone, Copy, Debug)]
pub struct FusedOpts {
    /// Rows per warp (2, 4 or 8).
    pub r: usize,
    /// Most warps that share one row group (1, 2 or 4).
    pub max_split: usize,
    /// `y += W·x` instead of `y = W·x` (not with `glu`).
    pub accumulate: bool,
    /// `W` is gate‖up stacked: `y[i] = silu(gate_i·x)·(up_i·x)` for the `rows / 2` outputs.
    pub glu: bool,
}

/// Whether the fused GEMV can run `m` (its input fits in shared memory; gate‖up has an even
/// number of rows).
pub fn fused_fits(m: &TernaryArgs, glu: bool) -> bool {
    m.cols.is_multiple_of(64)
        && m.cols > 0
        && m.cols <= FUSED_MAX_COLS
        && (!glu || m.rows.is_multiple_of(2))
}

/// `y (+)= W·x`, or SwiGLU of gate‖up, with the input prepared in the kernel's prologue.
pub fn launch_ternary_fused(
    gpu: &Gpu,
    m: &TernaryArgs,
    input: FusedInput,
    y: u64,
    o: FusedOpts,
) -> Result<()> {
    if !fused_fits(m, o.glu) || ![2, 4, 8].contains(&o.r) {
        return Err(Error::InvalidArgument(format!(
            "fused GEMV: {} × {} matrix (glu {}) with {} rows per warp is not supported",
            m.rows, m.cols, o.glu, o.r
        )));
    }
    let steps = (m.cols / 64).div_ceil(32);
    let split = [4, 2]
        .into_iter()
        .find(|s| *s <= o.max_split && steps >= *s)
        .unwrap_or(1);
    let kind = if m.f16 { "f16" } else { "f32" };
    let kernel = kernel_name(&format!("ternary_gemv_fused_r{}_s{split}_{kind}", o.r))?;
    let threads = 32 * FUSED_WARPS as u32;
    let outputs_per_group = if o.glu { o.r / 2 } else { o.r };
    let groups = (if o.glu { m.rows / 2 } else { m.rows }).div_ceil(outputs_per_group);
    let teams = FUSED_WARPS / split;
    let needed = groups.div_ceil(teams) as u32;
    // At most two blocks per multiprocessor (one where the registers allow no more): each
    // block re-reads the whole input.
    let resident = gpu.sm_count * gpu.resident_blocks(kernel, threads)?.min(2);
    let (mode, x, gamma, eps, q, meta) = match input {
        FusedInput::Q { q, meta } => (0, 0, 0, 0.0, q, meta),
        FusedInput::F32 { x } => (1, x, 0, 0.0, 0, 0),
        FusedInput::Norm { x, gamma, eps } => (2, x, gamma, eps, 0, 0),
    };
    gpu.launch(
        kernel,
        (needed.min(resident), 1),
        threads,
        &[
            Arg::Ptr(m.codes),
            Arg::Ptr(m.scales),
            Arg::I32(m.rows as i32),
            Arg::I32((m.cols / 64) as i32),
            Arg::I32(mode),
            Arg::Ptr(x),
            Arg::Ptr(gamma),
            Arg::F32(eps),
            Arg::Ptr(q),
            Arg::Ptr(meta),
            Arg::Ptr(y),
            Arg::I32((o.accumulate && !o.glu) as i32),
            Arg::I32(o.glu as i32),
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
    let c = OneShot::upload(gpu, m, q, meta, m.rows)?;
    launch_ternary(
        gpu,
        &c.args(m, s),
        ptr(&c.q, s),
        ptr(&c.meta, s),
        ptr(&c.y, s),
        false,
        r,
        max_split,
    )?;
    c.result(gpu, "GEMV")
}

/// Runs the fused GEMV once on int8 activations `q` (per-64 `(d, d·Σq)` in `meta`): `W·x`,
/// or with `glu` the SwiGLU of `m`'s first `rows / 2` and last `rows / 2` rows. The GPU tests
/// compare it with `repack::gemv_reference`.
pub fn ternary_gemv_fused_once(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    r: usize,
    max_split: usize,
    glu: bool,
) -> Result<Vec<f32>> {
    if q.len() != m.cols || meta.len() != m.blocks() {
        return Err(Error::InvalidArgument(
            "activation length differs from the matrix".into(),
        ));
    }
    let s = &gpu.stream;
    let outputs = if glu { m.rows / 2 } else { m.rows };
    let c = OneShot::upload(gpu, m, q, meta, outputs)?;
    let input = FusedInput::Q {
        q: ptr(&c.q, s),
        meta: ptr(&c.meta, s),
    };
    let opts = FusedOpts {
        r,
        max_split,
        accumulate: false,
        glu,
    };
    launch_ternary_fused(gpu, &c.args(m, s), input, ptr(&c.y, s), opts)?;
    c.result(gpu, "fused GEMV")
}

/// An int8 tensor-core GEMM kernel pair (f16 / f32 weight scales): the prefill's and the
/// batched decode's take the same arguments and differ in their output tile.
pub(crate) struct Int8Gemm {
    pub f16: &'static str,
    pub f32: &'static str,
    /// Tokens and rows of one block's output tile.
    pub tile_toks: usize,
    pub tile_rows: usize,
    /// Named in the error on a GPU without int8 tensor cores.
    pub what: &'static str,
}

/// The prefill GEMM (`ternary_gemm` in prefill.cu): `GM_ROWS` = 128 rows × `GM_TOKS` = 64
/// tokens per block.
const PREFILL_GEMM: Int8Gemm = Int8Gemm {
    f16: "ternary_gemm_f16",
    f32: "ternary_gemm_f32",
    tile_toks: 64,
    tile_rows: 128,
    what: "the prefill GEMM",
};

/// `Y (+)= X·Wᵀ` for `ntok` tokens with kernel `k`: `q`/`meta` hold each token's int8
/// activations (`cols` values, `cols / 64` pairs per token, token after token), `y` gets
/// `rows` values per token. Int8 tensor cores: compute capability 8.0 or newer.
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
) -> Result<()> {
    if gpu.compute_capability.0 < 8 {
        return Err(Error::Unsupported(format!(
            "CUDA: {} needs int8 tensor cores (compute capability 8.0+)",
            k.what
        )));
    }
    gpu.launch(
        if m.f16 { k.f16 } else { k.f32 },
        (
            ntok.div_ceil(k.tile_toks) as u32,
            m.rows.div_ceil(k.tile_rows) as u32,
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
    launch_int8_gemm(gpu, &PREFILL_GEMM, m, ntok, q, meta, y, accumulate)
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
    launch_ternary_gemm(
        gpu,
        &c.args(m, s),
        ntok,
        ptr(&c.q, s),
        ptr(&c.meta, s),
        ptr(&c.y, s),
        false,
    )?;
    c.result(gpu, "GEMM")
}
