//! The causal attention of a prefill chunk (`kernels/flash_prefill.cu`, tensor cores, 64
//! queries per block): kernel choice by head size, and a one-shot launcher the GPU tests check
//! it with against an f64 reference. (It replaced a CUDA-core kernel with 8 queries per block
//! and a warp reduction per key: 487 → 26 µs per layer at pp512 on the 8B shape, H200.)

use crate::device::{cuda_err, ptr, Arg, Gpu};
use trit::{Error, Result};

/// Query tokens per block (`FA_Q` in flash_prefill.cu).
pub(crate) const FLASH_QT: usize = 64;

/// The kernel for `hd`-wide heads (a multiple of 32 up to 256, checked at load).
pub(crate) fn attn_prefill_kernel(hd: usize) -> &'static str {
    const NAMES: [&str; 8] = [
        "flash_prefill_e1",
        "flash_prefill_e2",
        "flash_prefill_e3",
        "flash_prefill_e4",
        "flash_prefill_e5",
        "flash_prefill_e6",
        "flash_prefill_e7",
        "flash_prefill_e8",
    ];
    NAMES[(hd / 32).clamp(1, 8) - 1]
}

/// Shapes of one attention launch: `ntok` queries at positions `pos0..`, keys `0..pos0+ntok`
/// of a cache of `ctx` positions per KV head.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub hd: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub ctx: usize,
    pub pos0: usize,
    pub ntok: usize,
}

/// The outputs of [`prefill_attention_once`].
pub struct AttnOutput {
    /// `ntok × n_heads × hd` values.
    pub att: Vec<f32>,
    /// Their int8 blocks (values, then (d, d·Σq) per 64) when `hd` is a multiple of 64 (the
    /// kernel quantizes its output for the next product then).
    pub quantized: Option<(Vec<i8>, Vec<(f32, f32)>)>,
}

/// Runs one prefill attention on the GPU: `q` holds `ntok × n_heads × hd` pre-scaled queries,
/// `k`/`v` the f16 bits of `n_kv × ctx × hd` cache entries.
pub fn prefill_attention_once(
    gpu: &Gpu,
    sh: AttnShape,
    q: &[f32],
    k: &[u16],
    v: &[u16],
) -> Result<AttnOutput> {
    let cache = sh.n_kv * sh.ctx * sh.hd;
    if !sh.hd.is_multiple_of(32)
        || sh.hd > 256
        || sh.n_kv == 0
        || !sh.n_heads.is_multiple_of(sh.n_kv)
        || sh.pos0 + sh.ntok > sh.ctx
        || q.len() != sh.ntok * sh.n_heads * sh.hd
        || k.len() != cache
        || v.len() != cache
    {
        return Err(Error::InvalidArgument(format!(
            "attention inputs do not match {sh:?}"
        )));
    }
    let s = &gpu.stream;
    let (dq, dk, dv) = (gpu.upload(q)?, gpu.upload(k)?, gpu.upload(v)?);
    let step = gpu.upload(&[sh.pos0 as i32, 0])?;
    let out = gpu.upload(&vec![f32::NAN; q.len()])?;
    let quant = sh.hd.is_multiple_of(64);
    let xq = gpu.upload(&vec![0u8; q.len()])?;
    let xm = gpu.upload(&vec![f32::NAN; q.len() / 64 * 2])?;
    gpu.launch(
        attn_prefill_kernel(sh.hd),
        (sh.n_heads as u32, sh.ntok.div_ceil(FLASH_QT) as u32),
        128,
        &[
            Arg::Ptr(ptr(&dq, s)),
            Arg::Ptr(ptr(&dk, s)),
            Arg::Ptr(ptr(&dv, s)),
            Arg::Ptr(ptr(&step, s)),
            Arg::I32(sh.ntok as i32),
            Arg::I32(sh.n_heads as i32),
            Arg::I32(sh.n_kv as i32),
            Arg::I32(sh.ctx as i32),
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&xq, s)),
            Arg::Ptr(ptr(&xm, s)),
            Arg::I32(quant as i32),
        ],
    )?;
    gpu.sync()?;
    let copy = |e| cuda_err("copying the attention result", e);
    let att = s.clone_dtoh(&out).map_err(copy)?;
    let quantized = if quant {
        let q8 = s.clone_dtoh(&xq).map_err(copy)?;
        let m = s.clone_dtoh(&xm).map_err(copy)?;
        Some((
            q8.into_iter().map(|b| b as i8).collect(),
            m.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
        ))
    } else {
        None
    };
    Ok(AttnOutput { att, quantized })
}
