//! Launching the ternary GEMV (`kernels/gemv.cu`): kernel variant and grid for a matrix; the
//! one-kernel entry points the GPU tests use are in `gemv/once.rs`.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::repack::{PackedScales, PackedTernary};
use crate::weights::{DevMatrix, DevScales};
use cudarc::driver::{CudaSlice, CudaStream};
use trit::format::config::Activation;
use trit::{Error, Result};

pub mod dense;
mod once;
pub(crate) use once::OneShot;
pub use once::{
    ternary_gemv_fused_once, ternary_gemv_once, ternary_gemv_stream_norm_once,
    ternary_gemv_stream_once,
};

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
    launch_ternary_pend(gpu, m, q, meta, y, accumulate, 0, r, max_split)
}

/// `launch_ternary`, and where `pend` is set (with `accumulate`): `y = (y + pend) + W·x`, then
/// `pend` zeroed — the attention + o kernel's pending sum joining the residual
/// (`attention_o.rs`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_ternary_pend(
    gpu: &Gpu,
    m: &TernaryArgs,
    q: u64,
    meta: u64,
    y: u64,
    accumulate: bool,
    pend: u64,
    r: usize,
    max_split: usize,
) -> Result<()> {
    let split = gemv_split((m.cols / 64).div_ceil(32), max_split);
    let kind = if m.f16 { "f16" } else { "f32" };
    let kernel = kernel_name(&format!("ternary_gemv_r{r}_s{split}_{kind}"))?;
    let threads = 32 * split as u32;
    let needed = m.rows.div_ceil(r) as u32;
    let mut per_sm = gpu.resident_blocks(kernel, threads)?;
    let (narrow, wide) = reg_warps_cap();
    if let Some(w) = if m.cols > m.rows { wide } else { narrow } {
        per_sm = per_sm.min((w / split as u32).max(1));
    }
    let resident = gpu.sm_count * per_sm;
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
            Arg::Ptr(pend),
        ],
    )
}

/// Warps of the register GEMV sharing one row group of `steps` 32-block lane-steps, at most
/// `TRIT_CUDA_REG_WARPS` (measurement knob, read once): `N` caps the register GEMV's grid at N
/// warps per multiprocessor, `N,M` caps matrices no wider than tall (o) at N and wider ones
/// (down) at M (0: no cap), so that the next kernel's blocks (a streaming GEMV of 13–17 warps)
/// can be resident beside it and fill their rings while it runs. Unset: as many as fit (the
/// default; capping every one at 8 / 12 / 16 measured slower in session 8, before the trace of
/// session 34 showed the streaming GEMVs' blocks becoming resident only as their predecessor
/// ends).
fn reg_warps_cap() -> (Option<u32>, Option<u32>) {
    static CAP: std::sync::OnceLock<(Option<u32>, Option<u32>)> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| parse_reg_warps(std::env::var("TRIT_CUDA_REG_WARPS").ok()))
}

fn parse_reg_warps(v: Option<String>) -> (Option<u32>, Option<u32>) {
    let Some(v) = v else { return (None, None) };
    let one = |p: &str| {
        p.trim()
            .parse::<u32>()
            .ok()
            .filter(|w| (1..=64).contains(w))
    };
    match v.split_once(',') {
        None => (one(&v), one(&v)),
        Some((a, b)) => (one(a), one(b)),
    }
}

/// `max_split`: the most that leave no lane-step of a group empty (the 27B's down has 9 steps:
/// 4 warps would take 3 each, 12 slots for 9; 3 take exactly 9, and smaller blocks let every
/// row group be resident in one wave), else as many as there are steps, 4 or 2; 3 warps only
/// from 6 steps (3 steps on 2 warps, 4 slots, measured faster: 1.7B down). H200 tg128
/// (BENCHMARKS "GPU, session 18"): 8B 850 -> 884-889 tok/s (down: 6 steps on 3 warps instead of
/// 8 slots on 4), 27B hybrid 281.6 -> 285.5; 1.7B 1,754-1,762 against 1,717-1,727 with 3
/// warps at 3 steps too (`TRIT_CUDA_SPLIT3=all`). `TRIT_CUDA_SPLIT3=0` keeps the older choice.
fn gemv_split(steps: usize, max_split: usize) -> usize {
    // Fewest steps that take 3 warps (TRIT_CUDA_SPLIT3: 0 never, `all` from 3 steps).
    static THREE_FROM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let three_from = *THREE_FROM.get_or_init(|| match std::env::var("TRIT_CUDA_SPLIT3") {
        Ok(v) if v == "0" => usize::MAX,
        Ok(v) if v == "all" => 3,
        _ => 6,
    });
    let even = [4, 3, 2]
        .into_iter()
        .filter(|s| *s != 3 || steps >= three_from)
        .find(|s| *s <= max_split && steps.is_multiple_of(*s));
    even.unwrap_or_else(|| {
        [4, 2]
            .into_iter()
            .find(|s| *s <= max_split && steps >= *s)
            .unwrap_or(1)
    })
}

/// The activations a decode GEMV reads: f32 values for dense matrices, int8 blocks and their
/// `(d, d·Σq)` for ternary ones (device addresses).
#[derive(Clone, Copy, Debug)]
pub struct GemvInput {
    pub f32: u64,
    pub q: u64,
    pub meta: u64,
}

/// `y (+)= m·x` for a device matrix of either kind: the ternary GEMV (`r` rows per warp, at
/// most `max_split` warps per row group) or the dense f32 one.
#[allow(clippy::too_many_arguments)]
pub fn launch_matrix_gemv(
    gpu: &Gpu,
    m: &DevMatrix,
    x: GemvInput,
    y: u64,
    accumulate: bool,
    r: usize,
    max_split: usize,
) -> Result<()> {
    let s = &gpu.stream;
    match m {
        DevMatrix::Ternary { .. } => {
            let args = m.ternary_args(s).expect("a ternary matrix");
            launch_ternary(gpu, &args, x.q, x.meta, y, accumulate, r, max_split)
        }
        DevMatrix::Dense { .. } | DevMatrix::Half { .. } => {
            dense::launch_dense(gpu, m, x.f32, 1, y, accumulate)
        }
    }
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
    /// As `Norm`, of `x` plus the attention + o kernel's pending fixed-point sum `pend`
    /// (`attention_o.rs`).
    NormPend {
        x: u64,
        gamma: u64,
        eps: f32,
        pend: u64,
    },
    /// As `Norm`, rotated before the quantization (Bonsai 2: times the ±1 `signs`, then the
    /// Walsh–Hadamard transform per `block` values); the streaming GEMV only.
    NormRot {
        x: u64,
        gamma: u64,
        eps: f32,
        signs: u64,
        block: usize,
    },
}

impl FusedInput {
    /// Shared memory the streaming GEMV needs beyond its usual layout for an input of `cols`
    /// values: the f32 values a rotation transforms.
    fn extra_smem(&self, cols: usize) -> usize {
        match self {
            FusedInput::NormRot { .. } => 4 * cols,
            _ => 0,
        }
    }
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
    /// `W` is gate‖up stacked: `y[i] = act(gate_i·x)·(up_i·x)` for the `rows / 2` outputs.
    pub glu: bool,
    /// The gate's activation with `glu`: SiLU, or BitNet's relu² (`FG_RELU2`).
    pub act: Activation,
    /// Let the next kernel start only after this one's wait for its predecessor, so that the
    /// next may read this one's input before its own wait (`FG_LATE_TRIGGER` in gemv.cu).
    pub late_trigger: bool,
}

/// Whether the fused GEMV can run `m` (its input fits in shared memory; gate‖up has an even
/// number of rows).
pub fn fused_fits(m: &TernaryArgs, glu: bool) -> bool {
    m.cols.is_multiple_of(64)
        && m.cols > 0
        && m.cols <= FUSED_MAX_COLS
        && (!glu || m.rows.is_multiple_of(2))
}

/// `y (+)= W·x`, or SwiGLU of gate‖up, with the input prepared in the kernel's prologue: the
/// streaming kernel where it can run (see [`StreamConfig::get`]), else the register-pipelined
/// one.
pub fn launch_ternary_fused(
    gpu: &Gpu,
    m: &TernaryArgs,
    input: FusedInput,
    y: u64,
    o: FusedOpts,
) -> Result<()> {
    launch_ternary_fused_with(gpu, m, input, y, o, StreamConfig::get())
}

/// [`launch_ternary_fused`] with the streaming kernel's shape given (`None`: the
/// register-pipelined kernel).
pub fn launch_ternary_fused_with(
    gpu: &Gpu,
    m: &TernaryArgs,
    input: FusedInput,
    y: u64,
    o: FusedOpts,
    stream: Option<StreamConfig>,
) -> Result<()> {
    if !fused_fits(m, o.glu) || ![2, 4, 8].contains(&o.r) {
        return Err(Error::InvalidArgument(format!(
            "fused GEMV: {} × {} matrix (glu {}) with {} rows per warp is not supported",
            m.rows, m.cols, o.glu, o.r
        )));
    }
    let extra = input.extra_smem(m.cols);
    if let Some(cfg) = stream {
        if let Some(shape) = stream_plan(gpu, m, o.r, o.glu, extra, &cfg) {
            return launch_stream(gpu, m, input, y, o, shape);
        }
    }
    if let FusedInput::NormRot { .. } | FusedInput::NormPend { .. } = input {
        return Err(Error::InvalidArgument(format!(
            "fused GEMV: a rotated or pending-sum input needs the streaming kernel, which cannot \
             run the {} × {} matrix here",
            m.rows, m.cols
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
    let args = fused_kernel_args(m, input, y, o);
    gpu.launch(kernel, (needed.min(resident), 1), threads, &args)
}

/// Whether the streaming GEMV runs `m` (`r` rows per warp) with an input that needs no extra
/// shared memory (e.g. [`FusedInput::NormPend`]).
pub fn stream_runs(gpu: &Gpu, m: &TernaryArgs, r: usize, glu: bool) -> bool {
    fused_fits(m, glu)
        && StreamConfig::get().is_some_and(|cfg| stream_plan(gpu, m, r, glu, 0, &cfg).is_some())
}

/// Whether the streaming GEMV runs `m` (`r` rows per warp) with a rotated input
/// ([`FusedInput::NormRot`]): the decode step then rotates in its prologue.
pub fn stream_takes_rotated(gpu: &Gpu, m: &TernaryArgs, r: usize, glu: bool) -> bool {
    fused_fits(m, glu)
        && StreamConfig::get()
            .is_some_and(|cfg| stream_plan(gpu, m, r, glu, 4 * m.cols, &cfg).is_some())
}

/// The argument list shared by the fused and the streaming GEMV kernels.
fn fused_kernel_args(m: &TernaryArgs, input: FusedInput, y: u64, o: FusedOpts) -> [Arg; 15] {
    let (mode, x, gamma, eps, q, meta) = match input {
        FusedInput::Q { q, meta } => (0, 0, 0, 0.0, q, meta),
        FusedInput::F32 { x } => (1, x, 0, 0.0, 0, 0),
        FusedInput::Norm { x, gamma, eps } => (2, x, gamma, eps, 0, 0),
        FusedInput::NormRot { x, gamma, eps, .. } => (3, x, gamma, eps, 0, 0),
        // The prologue reads the pending sum through the q argument (unused by this mode).
        FusedInput::NormPend {
            x,
            gamma,
            eps,
            pend,
        } => (4, x, gamma, eps, pend, 0),
    };
    let (signs, block) = match input {
        FusedInput::NormRot { signs, block, .. } => (signs, block),
        _ => (0, 0),
    };
    [
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
        Arg::I32(
            o.glu as i32
                | (o.late_trigger as i32) << 1
                | ((o.glu && o.act == Activation::ReluSq) as i32) << 2,
        ),
        Arg::Ptr(signs),
        Arg::I32(block as i32),
    ]
}

/// Shared-memory slots per warp of the streaming GEMV (`STREAM_STAGES` in gemv_stream.cu)
/// unless `TRIT_CUDA_STREAM_STAGES` says otherwise.
pub const STREAM_STAGES: usize = 4;

/// `TRIT_CUDA_STREAM_STAGES` (2 to 8; read once per process): the streaming GEMV's slots per
/// warp, items in flight per warp one fewer. For measuring: more slots keep more bytes in
/// flight per warp but fit fewer warps beside each other in shared memory (the 8B took 4 over
/// 8 in session 6; the 27B's gate‖up, at 2.3–2.6 TB/s against the 8B's 2.9, was never swept).
/// The kernels get it as `-DSTREAM_STAGES` (device.rs), part of the PTX cache key.
pub fn stream_stages() -> usize {
    static ST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ST.get_or_init(|| parse_stream_stages(std::env::var("TRIT_CUDA_STREAM_STAGES").ok()))
}

/// The variable's value as slots per warp; unset or malformed: the default.
fn parse_stream_stages(v: Option<String>) -> usize {
    v.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (2..=8).contains(n))
        .unwrap_or(STREAM_STAGES)
}

/// Shape of the streaming GEMV (`kernels/gemv_stream.cu`): warps per block, warps that share
/// a row group, and blocks per multiprocessor. `warps` or `split` 0: chosen per matrix by
/// [`stream_shape`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamConfig {
    pub warps: u32,
    pub split: u32,
    pub blocks_per_sm: u32,
    /// Most warps per block the per-matrix choice considers: 4, 8, 12, 16, and any count above
    /// 16 up to this where it gives the busiest warp fewer items (`TRIT_CUDA_STREAM_MAX_WARPS`,
    /// 16 to 32; default 17). H200 tg128, one machine start: 8B 763/756 → 769/769 tok/s, 27B
    /// 271.9/268.8 → 273.4/271.0 (the LM heads and the 27B's gate‖up take 17).
    pub max_warps: u32,
}

impl StreamConfig {
    /// Per-matrix shapes, one block per multiprocessor. 8B tg128 on an H200 (same run, one
    /// fixed shape for every matrix, warps × slots): 669 tok/s with 16 × 4, 634 with 8 × 4
    /// and two blocks per multiprocessor, 600 with 8 × 8, 508 with 8 × 4; the
    /// register-pipelined kernel 596.
    pub const DEFAULT: StreamConfig = StreamConfig {
        warps: 0,
        split: 0,
        blocks_per_sm: 1,
        max_warps: 17,
    };

    /// `TRIT_CUDA_STREAM`: unset → the default, `0` → off (the register-pipelined fused
    /// kernel), or `warps[,blocks_per_sm[,split]]` (warps or split 0: per matrix).
    /// Read once per process.
    pub fn get() -> Option<StreamConfig> {
        static CFG: std::sync::OnceLock<Option<StreamConfig>> = std::sync::OnceLock::new();
        *CFG.get_or_init(|| {
            let cfg = match std::env::var("TRIT_CUDA_STREAM") {
                Err(_) => Some(StreamConfig::DEFAULT),
                Ok(v) => StreamConfig::parse(&v),
            };
            let max_warps = std::env::var("TRIT_CUDA_STREAM_MAX_WARPS")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|w| (16..=32).contains(w));
            cfg.map(|c| StreamConfig {
                max_warps: max_warps.unwrap_or(c.max_warps),
                ..c
            })
        })
    }

    /// Parses the variable's value; anything malformed keeps the default.
    pub fn parse(v: &str) -> Option<StreamConfig> {
        if v.trim() == "0" {
            return None;
        }
        let n: Vec<u32> = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
        if !(1..=3).contains(&n.len()) {
            return Some(StreamConfig::DEFAULT);
        }
        let c = StreamConfig {
            warps: n[0],
            blocks_per_sm: n.get(1).copied().unwrap_or(1),
            split: n.get(2).copied().unwrap_or(0),
            ..StreamConfig::DEFAULT
        };
        let ok =
            c.warps <= 32 && (1..=4).contains(&c.blocks_per_sm) && [0, 1, 2, 4].contains(&c.split);
        Some(if ok { c } else { StreamConfig::DEFAULT })
    }
}

/// Dynamic shared memory of one streaming-GEMV block (the layout in gemv_stream.cu: the
/// int8 input and its block scales, then per warp `STREAM_STAGES` slots of `r` rows' codes and
/// scale words).
pub fn stream_smem_bytes(nb: usize, r: usize, warps: u32) -> usize {
    let slot = r * 32 * 16 + r * 32 * 4;
    nb * 64 + nb.div_ceil(2) * 16 + warps as usize * stream_stages() * slot
}

/// One launch of the streaming GEMV: warps per block, warps per row group, blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamShape {
    pub warps: u32,
    pub split: u32,
    pub blocks: u32,
}

/// The launch shape for a matrix of `groups` row groups and `steps` lane-steps per row on
/// `sms` multiprocessors: among the allowed warps and splits whose shared memory fits, those
/// that keep at least 90 % of the multiprocessors busy, then the fewest items for the busiest
/// warp (its chain of memory round trips sets the time), then 4, 8, 12 or 16 warps over the
/// counts above 16, then the smaller split (fewer barriers), then more warps.
///
/// Why counts above 16: teams take groups round-robin, so when the groups are not a multiple
/// of all teams some warps hold one group more. The 27B's gate‖up (8,704 groups of 3 steps) on
/// 132 × 16 warps leaves blocks 0–15 five groups per warp (15 items) and the rest four; with 17
/// warps every warp has at most four (12 items).
pub fn stream_shape(
    groups: usize,
    steps: usize,
    sms: u32,
    cfg: &StreamConfig,
    fits: impl Fn(u32) -> bool,
) -> Option<StreamShape> {
    let warp_options: Vec<u32> = if cfg.warps > 0 {
        vec![cfg.warps]
    } else {
        [4, 8, 12]
            .into_iter()
            .chain(16..=cfg.max_warps.max(16))
            .collect()
    };
    let split_options: Vec<u32> = if cfg.split > 0 {
        vec![cfg.split]
    } else {
        vec![1, 2, 4]
    };
    let slots = sms * cfg.blocks_per_sm;
    // (busy, fewer items, at most 16 warps, smaller split, more warps): larger is better.
    type Rank = (bool, usize, bool, u32, u32);
    let mut best: Option<(Rank, StreamShape)> = None;
    for &warps in &warp_options {
        for &split in &split_options {
            let teams = warps / split;
            if teams == 0
                || warps % split != 0
                || (split > 1 && teams > 15)
                || split as usize > steps.max(1)
                || !fits(warps)
            {
                continue;
            }
            let blocks = (groups.div_ceil(teams as usize) as u32).min(slots).max(1);
            let all_teams = blocks as usize * teams as usize;
            let items = groups.div_ceil(all_teams) * steps.div_ceil(split as usize);
            let busy = blocks * 10 >= slots * 9;
            let shape = StreamShape {
                warps,
                split,
                blocks,
            };
            let key: Rank = (
                busy,
                usize::MAX - items,
                warps <= 16,
                u32::MAX - split,
                warps,
            );
            if best.as_ref().is_none_or(|b| key > b.0) {
                best = Some((key, shape));
            }
        }
    }
    best.map(|b| b.1)
}

/// The streaming GEMV's launch shape for `m` where it can run it: cp.async (sm_80+), aligned
/// buffers, and a block's shared memory within the limit.
fn stream_plan(
    gpu: &Gpu,
    m: &TernaryArgs,
    r: usize,
    glu: bool,
    extra_smem: usize,
    cfg: &StreamConfig,
) -> Option<StreamShape> {
    if gpu.compute_capability.0 < 8 || !m.codes.is_multiple_of(16) || !m.scales.is_multiple_of(4) {
        return None;
    }
    let nb = m.cols / 64;
    let groups = if glu {
        (m.rows / 2).div_ceil(r / 2)
    } else {
        m.rows.div_ceil(r)
    };
    stream_shape(groups, nb.div_ceil(32), gpu.sm_count, cfg, |w| {
        stream_smem_bytes(nb, r, w) + extra_smem <= gpu.max_dyn_smem
    })
}

fn launch_stream(
    gpu: &Gpu,
    m: &TernaryArgs,
    input: FusedInput,
    y: u64,
    o: FusedOpts,
    shape: StreamShape,
) -> Result<()> {
    let kind = if m.f16 { "f16" } else { "f32" };
    let rot = match input {
        FusedInput::NormRot { .. } => "rot_",
        FusedInput::NormPend { .. } => "pend_",
        _ => "",
    };
    let kernel = kernel_name(&format!(
        "ternary_gemv_stream_{rot}r{}_s{}_{kind}",
        o.r, shape.split
    ))?;
    let nb = m.cols / 64;
    let smem = stream_smem_bytes(nb, o.r, shape.warps) + input.extra_smem(m.cols);
    let args = fused_kernel_args(m, input, y, o);
    gpu.launch_smem(
        kernel,
        (shape.blocks, 1),
        32 * shape.warps,
        smem as u32,
        &args,
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

#[cfg(test)]
mod tests {
    use super::{
        parse_reg_warps, parse_stream_stages, stream_shape, StreamConfig, StreamShape,
        STREAM_STAGES,
    };

    #[test]
    fn register_warp_caps_take_1_to_64_for_all_or_per_width() {
        assert_eq!(parse_reg_warps(Some("8".into())), (Some(8), Some(8)));
        assert_eq!(parse_reg_warps(Some(" 12 ".into())), (Some(12), Some(12)));
        assert_eq!(parse_reg_warps(Some("4,0".into())), (Some(4), None));
        assert_eq!(parse_reg_warps(Some("0,6".into())), (None, Some(6)));
        for bad in ["0", "65", "-1", "x", ""] {
            assert_eq!(parse_reg_warps(Some(bad.into())), (None, None), "{bad:?}");
        }
        assert_eq!(parse_reg_warps(None), (None, None));
    }

    #[test]
    fn stream_stages_take_2_to_8_and_keep_the_default_otherwise() {
        assert_eq!(parse_stream_stages(Some("6".into())), 6);
        assert_eq!(parse_stream_stages(Some(" 2 ".into())), 2);
        for bad in ["1", "9", "x", ""] {
            assert_eq!(
                parse_stream_stages(Some(bad.into())),
                STREAM_STAGES,
                "{bad}"
            );
        }
        assert_eq!(parse_stream_stages(None), STREAM_STAGES);
    }

    fn shape(groups: usize, steps: usize) -> StreamShape {
        stream_shape(groups, steps, 132, &StreamConfig::DEFAULT, |_| true).unwrap()
    }

    #[test]
    fn stream_shapes_keep_the_multiprocessors_busy_with_the_fewest_items_per_warp() {
        // 8B gate‖up (6,144 SwiGLU groups of R = 4, 2 lane-steps): 16 independent warps.
        let s = shape(6144, 2);
        assert_eq!((s.warps, s.split, s.blocks), (16, 1, 132));
        // 8B down (1,024 groups, 6 lane-steps): pairs of warps per group fill 128 blocks.
        let s = shape(1024, 6);
        assert_eq!((s.warps, s.split, s.blocks), (16, 2, 128));
        // 8B q‖k‖v (1,536 groups, 2 steps): 16 warps alone would leave 36 SMs idle.
        let s = shape(1536, 2);
        assert_eq!((s.warps, s.split, s.blocks), (12, 1, 128));
        // One lane-step: no split; small matrices take small blocks to reach every SM.
        let s = shape(1024, 1);
        assert_eq!((s.warps, s.split, s.blocks), (8, 1, 128));
        // A matrix too small to fill the GPU still gets one shape, of at least one block.
        let s = shape(3, 1);
        assert!(s.blocks >= 1 && s.split == 1);
    }

    #[test]
    fn stream_shapes_respect_splits_barriers_and_shared_memory() {
        for groups in [1, 7, 100, 1000, 40000] {
            for steps in 1..=8 {
                let s = shape(groups, steps);
                assert!(s.split as usize <= steps, "{groups} {steps}: {s:?}");
                assert!(s.split == 1 || s.warps / s.split <= 15);
                assert!(s.blocks <= 132);
            }
        }
        // Only 4 warps fit: the choice obeys; nothing fits: no shape.
        let s = stream_shape(6144, 2, 132, &StreamConfig::DEFAULT, |w| w <= 4).unwrap();
        assert_eq!(s.warps, 4);
        assert!(stream_shape(6144, 2, 132, &StreamConfig::DEFAULT, |_| false).is_none());
        // A forced shape is kept.
        let forced = StreamConfig {
            warps: 8,
            split: 2,
            ..StreamConfig::DEFAULT
        };
        let s = stream_shape(6144, 2, 132, &forced, |_| true).unwrap();
        assert_eq!((s.warps, s.split), (8, 2));
    }

    #[test]
    fn a_seventeenth_warp_is_taken_only_where_it_cuts_the_busiest_warps_items() {
        // 27B gate‖up (8,704 groups, 3 lane-steps): 16 warps leave 5 groups to blocks 0–15's
        // warps; 17 give every warp at most 4.
        let s = shape(8704, 3);
        assert_eq!((s.warps, s.split, s.blocks), (17, 1, 132));
        // An LM head (37,984 groups, 2 steps): 34 items instead of 36.
        assert_eq!(shape(37984, 2).warps, 17);
        // Where 16 warps give as few items, they stay (8B and 1.7B gate‖up).
        assert_eq!(shape(6144, 2).warps, 16);
        assert_eq!(shape(3072, 1).warps, 16);
        // Shared memory still bounds the count; 16 as the most restores 4/8/12/16.
        let s = stream_shape(8704, 3, 132, &StreamConfig::DEFAULT, |w| w <= 16).unwrap();
        assert_eq!(s.warps, 16);
        let old = StreamConfig {
            max_warps: 16,
            ..StreamConfig::DEFAULT
        };
        assert_eq!(
            stream_shape(8704, 3, 132, &old, |_| true).unwrap().warps,
            16
        );
    }

    #[test]
    fn stream_config_parses_off_shapes_and_falls_back_on_garbage() {
        assert_eq!(StreamConfig::parse("0"), None);
        let c = StreamConfig::parse("16,2,4").unwrap();
        assert_eq!((c.warps, c.blocks_per_sm, c.split), (16, 2, 4));
        assert_eq!(StreamConfig::parse("16,1,3"), Some(StreamConfig::DEFAULT));
        assert_eq!(StreamConfig::parse("x"), Some(StreamConfig::DEFAULT));
    }
}

#[cfg(test)]
mod split_tests {
    use super::gemv_split;

    #[test]
    fn row_groups_take_warps_that_leave_no_lane_step_empty() {
        // The 27B's down (272 blocks: 9 steps), the 8B's (192: 6), the 27B's out (96: 3).
        assert_eq!(gemv_split(9, 4), 3);
        assert_eq!(gemv_split(6, 4), 3);
        // 3 steps on 2 warps (4 slots) measured faster than on 3 (1.7B down).
        assert_eq!(gemv_split(3, 4), 2);
        assert_eq!(gemv_split(8, 4), 4);
        assert_eq!(gemv_split(2, 4), 2);
        // No even split: as many warps as steps, 4 or 2; never more than asked.
        assert_eq!(gemv_split(5, 4), 4);
        assert_eq!(gemv_split(1, 4), 1);
        assert_eq!(gemv_split(9, 2), 2);
        assert_eq!(gemv_split(6, 1), 1);
    }
}
