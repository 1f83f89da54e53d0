//! The device buffers of a dense model's single decode path: the step's activations, the
//! attention's split partials and counters, the logits (and their page-locked host copy), the
//! rotation table and the KV cache.

use crate::device::Gpu;
use crate::graph::alloc_host_logits;
use crate::mapped::MappedBuf;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use trit::format::config::ModelConfig;
use trit::model::rope::Rope;
use trit::Result;

/// Device buffers of one decode step, and the KV cache.
pub(crate) struct Buffers {
    pub(crate) toks: CudaSlice<i32>,
    pub(crate) step: CudaSlice<i32>,
    pub(crate) x: CudaSlice<f32>,
    pub(crate) xn: CudaSlice<f32>,
    pub(crate) xq: CudaSlice<i8>,
    pub(crate) xm: CudaSlice<f32>,
    pub(crate) qkv: CudaSlice<f32>,
    pub(crate) att: CudaSlice<f32>,
    pub(crate) gu: CudaSlice<f32>,
    pub(crate) h: CudaSlice<f32>,
    pub(crate) part_o: CudaSlice<f32>,
    pub(crate) part_ml: CudaSlice<f32>,
    /// Per head: splits of the current step done (the last one merges; reset to 0 by it).
    pub(crate) counters: CudaSlice<u32>,
    /// Barrier counter of the persistent MLP kernel (`persist.rs`).
    pub(crate) persist: CudaSlice<u32>,
    /// The attention + o kernel's pending sum per residual row (fixed point; zero between
    /// layers: the down GEMV adds it into x and clears it; `attention_o.rs`).
    pub(crate) pend: CudaSlice<u64>,
    pub(crate) logits: CudaSlice<f32>,
    /// Page-locked copy target (a pageable copy of 600 KB costs tens of microseconds more).
    pub(crate) host_logits: PinnedHostSlice<f32>,
    /// Where the host's decode steps have the LM head write instead, when the model loaded
    /// with `CudaOptions::head_to_host` (`model::Head::Host`).
    pub(crate) mapped_logits: Option<MappedBuf<f32>>,
    pub(crate) cos_sin: CudaSlice<f32>,
    pub(crate) k_cache: Vec<CudaSlice<u16>>,
    pub(crate) v_cache: Vec<CudaSlice<u16>>,
}

impl Buffers {
    pub(crate) fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        ctx: usize,
        n_splits: usize,
        head_to_host: bool,
    ) -> Result<Buffers> {
        let (d, hd) = (c.hidden, c.head_dim);
        let (nq, nkv) = (c.n_heads * hd, c.n_kv_heads * hd);
        let widest = d.max(nq).max(c.ffn);
        // cos/sin of every position, from the CPU's own Rope (YaRN and its factor included).
        let rope = Rope::new(hd, c.rope_theta, c.rope_style, c.rope_scaling.as_ref());
        let cs = rope_table(&rope, ctx);
        let kv = nkv * ctx;
        Ok(Buffers {
            toks: gpu.zeros(ctx)?,
            step: gpu.zeros(2)?,
            x: gpu.zeros(d)?,
            xn: gpu.zeros(d)?,
            xq: gpu.zeros(widest)?,
            xm: gpu.zeros(2 * widest / 64 + 2)?,
            qkv: gpu.zeros(nq + 2 * nkv)?,
            att: gpu.zeros(nq)?,
            gu: gpu.zeros(2 * c.ffn)?,
            h: gpu.zeros(c.ffn)?,
            part_o: gpu.zeros(c.n_heads * n_splits * hd)?,
            part_ml: gpu.zeros(2 * c.n_heads * n_splits)?,
            counters: gpu.zeros(c.n_heads)?,
            persist: gpu.zeros(1)?,
            pend: gpu.zeros(d)?,
            logits: gpu.zeros(c.vocab)?,
            host_logits: alloc_host_logits(gpu, c.vocab)?,
            mapped_logits: if head_to_host {
                Some(MappedBuf::new(gpu, c.vocab)?)
            } else {
                None
            },
            cos_sin: gpu.upload(&cs)?,
            k_cache: (0..c.n_layers)
                .map(|_| gpu.zeros(kv))
                .collect::<Result<_>>()?,
            v_cache: (0..c.n_layers)
                .map(|_| gpu.zeros(kv))
                .collect::<Result<_>>()?,
        })
    }
}

/// `(cos, sin)` pairs of every rotated pair of dimensions for positions `0..ctx`, from the CPU's
/// own `Rope`: the table the decode kernels index by position.
pub(crate) fn rope_table(rope: &Rope, ctx: usize) -> Vec<f32> {
    let mut cs = Vec::new();
    for p in 0..ctx {
        let (cos, sin) = rope.angles(p);
        for (a, b) in cos.iter().zip(&sin) {
            cs.push(*a);
            cs.push(*b);
        }
    }
    cs
}
