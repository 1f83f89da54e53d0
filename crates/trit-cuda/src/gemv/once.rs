//! One-kernel runs of the ternary GEMVs for the GPU tests: a matrix and its int8 activations
//! uploaded, one kernel launched, the result copied back, to check each kernel against the CPU
//! emulation of its arithmetic (`repack::gemv_reference`) on shapes the test models do not
//! reach.

use super::*;

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

/// Runs the register-pipelined fused GEMV once on int8 activations `q` (per-64 `(d, d·Σq)`
/// in `meta`): `W·x`, or with `glu` the SwiGLU of `m`'s first `rows / 2` and last `rows / 2`
/// rows. The GPU tests compare it with `repack::gemv_reference`.
pub fn ternary_gemv_fused_once(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    r: usize,
    max_split: usize,
    glu: bool,
) -> Result<Vec<f32>> {
    fused_once_with(gpu, m, q, meta, r, max_split, glu, None, None)
}

/// [`ternary_gemv_fused_once`] through the streaming kernel of shape `cfg`; an error where it
/// cannot run `m`.
pub fn ternary_gemv_stream_once(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    r: usize,
    glu: bool,
    cfg: StreamConfig,
) -> Result<Vec<f32>> {
    fused_once_with(gpu, m, q, meta, r, 1, glu, Some(cfg), None)
}

/// [`ternary_gemv_stream_once`] on the residual stream `x` instead: the kernel's prologue
/// RMS-normalizes it with `gamma` and quantizes it (the decode step's q‖k‖v and gate‖up);
/// with `rot` = (signs, block) it rotates the normalized values before quantizing them
/// (Bonsai 2).
#[allow(clippy::too_many_arguments)]
pub fn ternary_gemv_stream_norm_once(
    gpu: &Gpu,
    m: &PackedTernary,
    x: &[f32],
    gamma: &[f32],
    eps: f32,
    rot: Option<(&[f32], usize)>,
    r: usize,
    glu: bool,
    cfg: StreamConfig,
) -> Result<Vec<f32>> {
    if x.len() != m.cols || gamma.len() != m.cols || rot.is_some_and(|r| r.0.len() != m.cols) {
        return Err(Error::InvalidArgument(
            "input length differs from the matrix".into(),
        ));
    }
    let (xd, gd) = (gpu.upload(x)?, gpu.upload(gamma)?);
    let sd = gpu.upload(rot.map_or(&[0.0f32][..], |r| r.0))?;
    let s = &gpu.stream;
    let input = match rot {
        Some((_, block)) => FusedInput::NormRot {
            x: ptr(&xd, s),
            gamma: ptr(&gd, s),
            eps,
            signs: ptr(&sd, s),
            block,
        },
        None => FusedInput::Norm {
            x: ptr(&xd, s),
            gamma: ptr(&gd, s),
            eps,
        },
    };
    let none = (vec![0i8; m.cols], vec![(0.0, 0.0); m.blocks()]);
    fused_once_with(gpu, m, &none.0, &none.1, r, 1, glu, Some(cfg), Some(input))
}

/// One fused GEMV on int8 `q`/`meta`, or on `input` where given.
#[allow(clippy::too_many_arguments)]
fn fused_once_with(
    gpu: &Gpu,
    m: &PackedTernary,
    q: &[i8],
    meta: &[(f32, f32)],
    r: usize,
    max_split: usize,
    glu: bool,
    stream: Option<StreamConfig>,
    input: Option<FusedInput>,
) -> Result<Vec<f32>> {
    if q.len() != m.cols || meta.len() != m.blocks() {
        return Err(Error::InvalidArgument(
            "activation length differs from the matrix".into(),
        ));
    }
    let s = &gpu.stream;
    let outputs = if glu { m.rows / 2 } else { m.rows };
    let c = OneShot::upload(gpu, m, q, meta, outputs)?;
    let input = input.unwrap_or(FusedInput::Q {
        q: ptr(&c.q, s),
        meta: ptr(&c.meta, s),
    });
    let opts = FusedOpts {
        r,
        max_split,
        accumulate: false,
        glu,
        act: trit::format::config::Activation::Silu,
        late_trigger: false,
    };
    let args = c.args(m, s);
    if let Some(cfg) = &stream {
        if stream_plan(gpu, &args, r, glu, input.extra_smem(m.cols), cfg).is_none() {
            return Err(Error::InvalidArgument(format!(
                "the streaming GEMV cannot run a {} × {} matrix with {cfg:?}",
                m.rows, m.cols
            )));
        }
    }
    launch_ternary_fused_with(gpu, &args, input, ptr(&c.y, s), opts, stream)?;
    c.result(gpu, "fused GEMV")
}
