//! Every layer of a dense decode step as one persistent kernel (`dense_step_mega` in
//! kernels/megastep.cu; `CudaOptions::mega`): one block per multiprocessor streams its share
//! of every layer's weights through a ring of shared-memory slots filled by bulk copies that
//! run ahead across phase and layer boundaries, with grid barriers between the phases.
//!
//! It takes the common shape of ternary Qwen3/Llama models (head dim 128, f16 scales, rows of
//! an even number of 64-column blocks up to 16,384 columns, q‖k‖v and gate‖up stacked) and the
//! single path's own cache; anything else takes the kernel chain.

use crate::device::{define_value, ptr, Arg, Gpu};
use crate::model::{CudaModel, State, StepKind};
use crate::weights::{DevBlock, DevMatrix, DevScales, DevWeights};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use trit::format::config::{Activation, ModelConfig, RopeStyle};
use trit::{Error, Result};

/// Steps enqueued with the kernel in this process (a captured graph counts once, at its
/// capture): how tests know the kernel ran rather than the chain.
static ENQUEUED: AtomicUsize = AtomicUsize::new(0);

pub fn enqueued() -> usize {
    ENQUEUED.load(Ordering::Relaxed)
}

/// Ring slots and bytes of codes per slot (kernels/megastep.cu MS_SLOTS, MS_SLOT_CODES; both
/// may be set for measurements through `TRIT_CUDA_DEFINES`, read here for the sizes).
const SLOTS: usize = 10;
const SLOT_CODES: usize = 16_384;
const THREADS: u32 = 512;
const HEAD_DIM: usize = 128;
/// sizeof(MsAtt): 8 head vectors, 2 × 16 warp values, 16 warp rows, 32 float2.
const ATT_BYTES: usize = 8 * HEAD_DIM * 4 + 2 * 16 * 4 + 16 * HEAD_DIM * 4 + 32 * 8;
/// Pointers per layer in the kernel's table (MsLayer).
const LAYER_PTRS: usize = 14;

/// The kernel's per-layer table (weights and the single path's caches) and launch shape.
pub(crate) struct MegaStep {
    table: CudaSlice<u64>,
    smem: u32,
    /// Most SwiGLU outputs one block computes (its gate/up sums in shared memory).
    gmax: usize,
    /// Phase timestamps of the last step (`TRIT_CUDA_MEGA_TRACE=1`), printed when dropped.
    trace: Option<(CudaSlice<u64>, usize)>,
    /// q‖k‖v rows written per head slot (`-DMS_HEAD_WAIT=1`; zero between steps).
    heads: CudaSlice<u32>,
}

/// Timestamps per layer and traced block (kernels/megastep.cu MS_STAMPS): the kernel's 14
/// (13 intervals named in PHASES), then 3 inside the attention (block 0).
const STAMPS: usize = 17;
const KERNEL_STAMPS: usize = 14;
const PHASES: [&str; KERNEL_STAMPS - 1] = [
    "q‖k‖v input",
    "q‖k‖v products",
    "barrier (first attention round)",
    "attention",
    "barrier",
    "o products",
    "barrier",
    "gate‖up input",
    "gate‖up products + SwiGLU",
    "barrier",
    "down input",
    "down products",
    "barrier",
];
/// The attention's parts (block 0): from its start (stamp 3) to stamps 14, 15, 16, then to
/// its end (stamp 4).
const ATTENTION: [&str; 4] = [
    "  q/k/v load, norms, rotation",
    "  rounds over the cache",
    "  merge of the warps",
    "  output and its int8 blocks",
];

impl Drop for MegaStep {
    fn drop(&mut self) {
        let Some((buf, layers)) = &self.trace else {
            return;
        };
        if *layers == 0 {
            return;
        }
        let Ok(t) = buf.stream().clone_dtoh(buf) else {
            return;
        };
        for (b, who) in ["block 0 (attends)", "last block"].iter().enumerate() {
            let span = |l: usize, i: usize| t[(b * layers + l) * STAMPS + i];
            let mean = |from: usize, to: usize| {
                (0..*layers)
                    .map(|l| span(l, to).saturating_sub(span(l, from)) as f64 / 1e3)
                    .sum::<f64>()
                    / *layers as f64
            };
            eprintln!("megastep trace, {who}: mean µs per layer over {layers} layers");
            for (i, name) in PHASES.iter().enumerate() {
                eprintln!("  {name:<34} {:8.2}", mean(i, i + 1));
                if b == 0 && i == 3 {
                    for (k, (from, to)) in [(3, 14), (14, 15), (15, 16), (16, 4)].iter().enumerate()
                    {
                        eprintln!("  {:<34} {:8.2}", ATTENTION[k], mean(*from, *to));
                    }
                }
            }
            let end = span(layers - 1, KERNEL_STAMPS - 2);
            let total = end.saturating_sub(span(0, 0)) as f64 / 1e3;
            eprintln!("  all layers (µs)                    {total:8.2}");
        }
    }
}

/// The matrix's codes and f16 scales where the kernel can stream it: ternary, f16 scales,
/// rows of an even number of blocks (bulk copies of whole 16-byte units).
fn streamable(m: &DevMatrix, s: &CudaStream) -> Option<(u64, u64)> {
    let DevMatrix::Ternary {
        cols,
        codes,
        scales: DevScales::F16(sc),
        ..
    } = m
    else {
        return None;
    };
    cols.is_multiple_of(128)
        .then(|| (ptr(codes, s), ptr(sc, s)))
}

impl MegaStep {
    /// The kernel's view of the model, or `None` where it cannot run it (its shapes, weight
    /// types, or shared memory).
    pub(crate) fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        w: &DevWeights,
        kv: &[(u64, u64)],
    ) -> Result<Option<MegaStep>> {
        let (d, nq, nkv) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let sms = gpu.sm_count as usize;
        let shapes_ok = c.head_dim == HEAD_DIM
            && c.ffn_act == Activation::Silu
            && !c.bitnet
            && c.n_kv_heads > 0
            && c.n_heads.is_multiple_of(c.n_kv_heads)
            && c.n_heads <= sms
            && c.ffn.is_multiple_of(128)
            && kv.len() == w.blocks.len();
        if !shapes_ok || gpu.compute_capability.0 < 9 {
            return Ok(None);
        }
        let s = &gpu.stream;
        let mut table = Vec::with_capacity(w.blocks.len() * LAYER_PTRS);
        for (blk, (kc, vc)) in w.blocks.iter().zip(kv) {
            let Some(layer) = layer_ptrs(blk, s) else {
                return Ok(None);
            };
            let dims_ok = blk.qkv.rows() == nq + 2 * nkv
                && blk.o.rows() == d
                && blk.gate_up.rows() == 2 * c.ffn
                && blk.down.rows() == d;
            if !dims_ok {
                return Ok(None);
            }
            table.extend_from_slice(&layer);
            table.extend_from_slice(&[*kc, *vc]);
        }
        let nb_max = d.max(nq).max(c.ffn) / 64;
        let slots = define_value("MS_SLOTS").unwrap_or(SLOTS);
        let slot_codes = define_value("MS_SLOT_CODES").unwrap_or(SLOT_CODES);
        let slot_bytes = slot_codes + slot_codes / 8;
        let gmax = 4 * (c.ffn / 4).div_ceil(sms);
        // A slot takes whole groups of 4 rows: 4 rows of 16-byte blocks of 64 columns.
        if 4 * nb_max * 16 > slot_codes {
            return Ok(None);
        }
        let smem = slots * slot_bytes + nb_max * 72 + 2 * gmax * 4 + ATT_BYTES;
        if smem > gpu.max_dyn_smem
            || gpu.resident_blocks_smem("dense_step_mega", THREADS, smem)? < 1
        {
            return Ok(None);
        }
        let traced = std::env::var("TRIT_CUDA_MEGA_TRACE").is_ok_and(|v| v == "1");
        let n = w.blocks.len();
        Ok(Some(MegaStep {
            table: gpu.upload(&table)?,
            smem: smem as u32,
            gmax,
            heads: gpu.zeros(c.n_heads + 2 * c.n_kv_heads)?,
            trace: if traced {
                Some((gpu.zeros(2 * n * STAMPS)?, n))
            } else {
                None
            },
        }))
    }

    /// Zeroes the per-head row counters (after an error a step may have stopped between its
    /// phases; the barrier counter is `Buffers::persist`, reset beside this).
    pub(crate) fn reset_counters(&mut self, s: &std::sync::Arc<CudaStream>) -> Result<()> {
        s.memset_zeros(&mut self.heads)
            .map_err(|e| crate::device::cuda_err("resetting counters", e))
    }

    /// Enqueues the layers of one step: `x` holds the token's embedding; on return (in
    /// stream order) it holds the last layer's output, the caches the step's keys and values.
    pub(crate) fn launch(&self, gpu: &Gpu, c: &ModelConfig, bufs: &MegaBuffers) -> Result<()> {
        let s = &gpu.stream;
        let args = [
            Arg::Ptr(ptr(&self.table, s)),
            Arg::I32(c.n_layers as i32),
            Arg::I32(c.hidden as i32),
            Arg::I32(c.n_heads as i32),
            Arg::I32(c.n_kv_heads as i32),
            Arg::I32(c.ffn as i32),
            Arg::F32(c.norm_eps),
            Arg::F32(1.0 / (HEAD_DIM as f32).sqrt()),
            Arg::I32(bufs.adjacent as i32),
            Arg::Ptr(bufs.cos_sin),
            Arg::Ptr(bufs.step),
            Arg::I32(bufs.ctx as i32),
            Arg::Ptr(bufs.x),
            Arg::Ptr(bufs.qkv),
            Arg::Ptr(bufs.att),
            Arg::Ptr(bufs.att_q),
            Arg::Ptr(bufs.att_meta),
            Arg::Ptr(bufs.h),
            Arg::Ptr(bufs.counter),
            Arg::I32(self.gmax as i32),
            Arg::Ptr(self.trace.as_ref().map_or(0, |(b, _)| ptr(b, s))),
            Arg::Ptr(ptr(&self.heads, s)),
        ];
        ENQUEUED.fetch_add(1, Ordering::Relaxed);
        gpu.launch_smem(
            "dense_step_mega",
            (gpu.sm_count, 1),
            THREADS,
            self.smem,
            &args,
        )
    }
}

/// The step's buffers (device addresses): the rotation table and position, the residual
/// stream, q‖k‖v, the attention output (f32 and int8 blocks), the SwiGLU output, and a zeroed
/// `u32` for the barriers (left at zero).
pub(crate) struct MegaBuffers {
    pub adjacent: bool,
    pub cos_sin: u64,
    pub step: u64,
    pub ctx: usize,
    pub x: u64,
    pub qkv: u64,
    pub att: u64,
    pub att_q: u64,
    pub att_meta: u64,
    pub h: u64,
    pub counter: u64,
}

/// One layer's weight and norm addresses in MsLayer's order (without the caches).
fn layer_ptrs(b: &DevBlock, s: &CudaStream) -> Option<[u64; LAYER_PTRS - 2]> {
    let (qkv_c, qkv_s) = streamable(&b.qkv, s)?;
    let (o_c, o_s) = streamable(&b.o, s)?;
    let (gu_c, gu_s) = streamable(&b.gate_up, s)?;
    let (down_c, down_s) = streamable(&b.down, s)?;
    let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, |v| ptr(v, s));
    Some([
        qkv_c,
        qkv_s,
        o_c,
        o_s,
        gu_c,
        gu_s,
        down_c,
        down_s,
        ptr(&b.attn_norm, s),
        opt(&b.q_norm),
        opt(&b.k_norm),
        ptr(&b.ffn_norm, s),
    ])
}

impl CudaModel {
    /// How the single path runs the steps of positions `pos0..pos1`: the whole-step kernel
    /// where it is on, can run this model (its tables made here on first use) and the
    /// context stays below `mega_max`; else the attention + o kernel or the chain.
    pub(crate) fn step_kind(&self, st: &mut State, pos0: usize, pos1: usize) -> Result<StepKind> {
        if self.mega && pos1 <= self.mega_max {
            if st.mega.is_none() {
                let kv = Self::own_kv(st);
                st.mega = Some(MegaStep::new(&st.gpu, &self.config, &st.w, &kv)?);
            }
            if matches!(st.mega, Some(Some(_))) {
                return Ok(StepKind::Mega);
            }
        }
        Ok(if self.short_step(pos0) {
            StepKind::Short
        } else {
            StepKind::Chain
        })
    }

    /// Enqueues the kernel over every layer of the single path's step (`x` holds the token's
    /// embedding; the head follows in `enqueue_layers`).
    pub(crate) fn enqueue_mega(&self, st: &State) -> Result<()> {
        let Some(Some(m)) = &st.mega else {
            return Err(Error::Unsupported(
                "CUDA: the whole-step kernel was chosen for a model it cannot run".into(),
            ));
        };
        let (b, s) = (&st.b, &st.gpu.stream);
        let c = &self.config;
        let bufs = MegaBuffers {
            adjacent: c.rope_style == RopeStyle::Adjacent,
            cos_sin: ptr(&b.cos_sin, s),
            step: ptr(&b.step, s),
            ctx: self.ctx,
            x: ptr(&b.x, s),
            qkv: ptr(&b.qkv, s),
            att: ptr(&b.att, s),
            att_q: ptr(&b.xq, s),
            att_meta: ptr(&b.xm, s),
            h: ptr(&b.h, s),
            counter: ptr(&b.persist, s),
        };
        m.launch(&st.gpu, c, &bufs)
    }
}
