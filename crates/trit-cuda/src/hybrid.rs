//! `CudaHybrid`: a Qwen3.5 hybrid model (Gated DeltaNet + gated full attention, the CPU's
//! `trit::model::qwen35`) decoding on the GPU one token per step, the step replayed from a
//! CUDA graph like the dense `CudaModel`'s (position and token read from device memory).
//!
//! Per-sequence state on the GPU: per DeltaNet layer the conv window (`(kernel − 1) ×
//! conv_dim` f32) and the delta-rule state (`v_heads × v_dim × k_dim` f32); per
//! full-attention layer an f16 KV cache. Prompts run token by token through the step (a
//! batched hybrid prefill is not written yet). The recurrent state cannot be cut back: a
//! forward that starts before where the last one ended (a chat turn reusing a prefix) zeroes
//! it and replays the sequence's earlier tokens up to there (kept on the host), without the LM
//! head.

use crate::device::{ptr, Arg, Gpu};
use crate::gemv::{launch_ternary, TernaryArgs};
use crate::graph::{copy_to_pinned, StepGraph};
use crate::hybrid_weights::{self, DevHybrid, DevMixer};
use crate::launch::{self, QuantOut};
use crate::model::{check_forward, poisoned, CudaOptions};
use crate::weights::DevMatrix;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use std::sync::Mutex;
use trit::format::config::{HybridConfig, ModelConfig, RopeStyle};
use trit::format::ModelFiles;
use trit::model::rope::Rope;
use trit::model::{ExternalNet, KvCache, Logits};
use trit::{Error, Result};

/// Rows of one value head per block of `deltanet_recur` (`DN_ROWS` in deltanet.cu).
const DN_ROWS: usize = 16;
/// Largest key and attention head sizes the kernels hold in registers (`DN_MAX_DK`,
/// `HA_MAX_HD`).
const MAX_HEAD: usize = 256;

/// Device buffers of one decode step and the sequence's state.
struct Buffers {
    toks: CudaSlice<i32>,
    step: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    xq: CudaSlice<i8>,
    xm: CudaSlice<f32>,
    /// A mixer's fused projection: q/k/v/z (DeltaNet) or q‖gate/k/v (full attention).
    proj: CudaSlice<f32>,
    ab: CudaSlice<f32>,
    conv_out: CudaSlice<f32>,
    /// DeltaNet output before its gated norm.
    o: CudaSlice<f32>,
    /// The mixer's output, the input of its out projection.
    mixed: CudaSlice<f32>,
    q: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    h: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    host_logits: PinnedHostSlice<f32>,
    /// Per position `rotary_dim / 2` (cos, sin) pairs.
    cos_sin: CudaSlice<f32>,
    conv_window: Vec<CudaSlice<f32>>,
    ssm: Vec<CudaSlice<f32>>,
    k_cache: Vec<CudaSlice<u16>>,
    v_cache: Vec<CudaSlice<u16>>,
}

struct State {
    gpu: Gpu,
    w: DevHybrid,
    b: Buffers,
    /// (with head, without head), captured on first use.
    graphs: Option<(StepGraph, StepGraph)>,
    /// The device position counter's value when known.
    device_pos: Option<usize>,
    /// Tokens the recurrent state has consumed (None after an error).
    seq_len: Option<usize>,
    /// The sequence's tokens up to the last successful forward, replayed after a rewind.
    history: Vec<u32>,
}

pub struct CudaHybrid {
    config: ModelConfig,
    hy: HybridConfig,
    ctx: usize,
    rows_per_warp: usize,
    max_split: usize,
    use_graph: bool,
    weight_bytes: usize,
    bytes_per_token: usize,
    device_name: String,
    state: Mutex<State>,
}

/// Shapes the kernels handle; anything else is refused at load with the reason.
fn check_shapes(c: &ModelConfig, hy: &HybridConfig) -> Result<()> {
    let unsupported = |what: String| Err(Error::Unsupported(format!("CUDA hybrid: {what}")));
    let (hd, rot) = (c.head_dim, hy.rotary_dim);
    if !hd.is_multiple_of(32) || hd > MAX_HEAD || rot > hd || !rot.is_multiple_of(2) {
        return unsupported(format!(
            "head_dim must be a multiple of 32 up to {MAX_HEAD} with an even rotary width at \
             most head_dim (got {hd}, rotary {rot})"
        ));
    }
    if !hy.k_dim.is_multiple_of(32) || hy.k_dim > MAX_HEAD || hy.v_dim == 0 {
        return unsupported(format!(
            "linear-attention key dims must be a multiple of 32 up to {MAX_HEAD} (got {})",
            hy.k_dim
        ));
    }
    if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(Error::Format(format!(
            "{} query heads are not a multiple of {} kv heads",
            c.n_heads, c.n_kv_heads
        )));
    }
    if hy.k_heads == 0 || !hy.v_heads.is_multiple_of(hy.k_heads) || hy.conv_kernel == 0 {
        return Err(Error::Format(format!(
            "{} value heads are not a multiple of {} key heads (conv kernel {})",
            hy.v_heads, hy.k_heads, hy.conv_kernel
        )));
    }
    let widths = [c.hidden, c.ffn, c.n_heads * hd, hy.value_width()];
    if widths.iter().any(|w| !w.is_multiple_of(64)) {
        return unsupported(format!(
            "hidden, ffn, attention and value widths must be multiples of 64 (got {widths:?})"
        ));
    }
    Ok(())
}

impl CudaHybrid {
    pub fn load(files: &ModelFiles, opts: &CudaOptions) -> Result<CudaHybrid> {
        let cfg = files.config.clone();
        let hy = cfg
            .hybrid
            .clone()
            .ok_or_else(|| Error::Config("qwen35 model without its hybrid config".into()))?;
        if files.rotation.is_some() {
            return Err(Error::Unsupported(
                "Hadamard-rotated (prism) qwen35 packs on CUDA: not written yet; run them with \
                 --device cpu"
                    .into(),
            ));
        }
        let rows_per_warp = opts.rows_per_warp.unwrap_or(4);
        if ![1, 2, 4, 8].contains(&rows_per_warp) || ![1, 2, 4].contains(&opts.max_split) {
            return Err(Error::InvalidArgument(format!(
                "rows per warp must be 1, 2, 4 or 8 and the GEMV split 1, 2 or 4 (got {:?}, {})",
                opts.rows_per_warp, opts.max_split
            )));
        }
        if opts.ctx == 0 {
            return Err(Error::InvalidArgument(
                "CUDA context size must be at least 1".into(),
            ));
        }
        check_shapes(&cfg, &hy)?;
        let gpu = Gpu::open(opts.device)?;
        let w = hybrid_weights::load(&gpu, &cfg, &hy, files.weights.as_ref())?;
        let b = Buffers::new(&gpu, &cfg, &hy, opts.ctx)?;
        Ok(CudaHybrid {
            ctx: opts.ctx,
            rows_per_warp,
            max_split: opts.max_split,
            use_graph: opts.graph,
            weight_bytes: w.weight_bytes(),
            bytes_per_token: w.bytes_per_token(),
            device_name: gpu.name.clone(),
            config: cfg,
            hy,
            state: Mutex::new(State {
                gpu,
                w,
                b,
                graphs: None,
                device_pos: None,
                seq_len: Some(0),
                history: Vec::new(),
            }),
        })
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }
}

impl Buffers {
    fn new(gpu: &Gpu, c: &ModelConfig, hy: &HybridConfig, ctx: usize) -> Result<Buffers> {
        let (d, hd) = (c.hidden, c.head_dim);
        let (nq, nkv) = (c.n_heads * hd, c.n_kv_heads * hd);
        let (cd, vw) = (hy.conv_dim(), hy.value_width());
        let widest = d.max(nq).max(c.ffn).max(vw);
        // cos/sin from the CPU's own Rope over the rotated dims (NeoX pairs), per position.
        let rope = Rope::new(hy.rotary_dim, c.rope_theta, RopeStyle::Neox, None);
        let mut cs = Vec::with_capacity(ctx * hy.rotary_dim);
        for p in 0..ctx {
            let (cos, sin) = rope.angles(p);
            for (a, b) in cos.iter().zip(&sin) {
                cs.push(*a);
                cs.push(*b);
            }
        }
        let (n_lin, n_full) = (hy.n_linear(), hy.n_full());
        let kv = nkv * ctx;
        Ok(Buffers {
            toks: gpu.zeros(ctx)?,
            step: gpu.zeros(2)?,
            x: gpu.zeros(d)?,
            xn: gpu.zeros(d)?,
            xq: gpu.zeros(widest)?,
            xm: gpu.zeros(2 * widest / 64 + 2)?,
            proj: gpu.zeros((cd + vw).max(2 * nq + 2 * nkv))?,
            ab: gpu.zeros(2 * hy.v_heads)?,
            conv_out: gpu.zeros(cd)?,
            o: gpu.zeros(vw)?,
            mixed: gpu.zeros(vw.max(nq))?,
            q: gpu.zeros(nq)?,
            gate: gpu.zeros(nq)?,
            gu: gpu.zeros(2 * c.ffn)?,
            h: gpu.zeros(c.ffn)?,
            logits: gpu.zeros(c.vocab)?,
            // SAFETY: read only after the copy into it and a stream synchronize.
            host_logits: unsafe { gpu.ctx.alloc_pinned::<f32>(c.vocab) }
                .map_err(|e| crate::device::cuda_err("allocating pinned memory", e))?,
            cos_sin: gpu.upload(&cs)?,
            conv_window: (0..n_lin)
                .map(|_| gpu.zeros((hy.conv_kernel - 1).max(1) * cd))
                .collect::<Result<_>>()?,
            ssm: (0..n_lin)
                .map(|_| gpu.zeros(hy.v_heads * hy.v_dim * hy.k_dim))
                .collect::<Result<_>>()?,
            k_cache: (0..n_full).map(|_| gpu.zeros(kv)).collect::<Result<_>>()?,
            v_cache: (0..n_full).map(|_| gpu.zeros(kv)).collect::<Result<_>>()?,
        })
    }
}

/// Where a matrix product reads its input: f32 values (dense matrices) and their int8 blocks.
#[derive(Clone, Copy)]
struct Input {
    f32: u64,
    q: u64,
    meta: u64,
}

impl CudaHybrid {
    fn gemv(&self, st: &State, m: &DevMatrix, inp: Input, y: u64, accumulate: bool) -> Result<()> {
        let s = &st.gpu.stream;
        match m {
            DevMatrix::Ternary {
                rows,
                cols,
                codes,
                scales,
            } => {
                let args = TernaryArgs::new(*rows, *cols, codes, scales, s);
                launch_ternary(
                    &st.gpu,
                    &args,
                    inp.q,
                    inp.meta,
                    y,
                    accumulate,
                    self.rows_per_warp,
                    self.max_split,
                )
            }
            DevMatrix::Dense { rows, cols, w } => st.gpu.launch(
                "dense_gemv",
                (rows.div_ceil(4) as u32, 1),
                128,
                &[
                    Arg::Ptr(ptr(w, s)),
                    Arg::I32(*rows as i32),
                    Arg::I32(*cols as i32),
                    Arg::Ptr(inp.f32),
                    Arg::Ptr(y),
                    Arg::I32(accumulate as i32),
                ],
            ),
        }
    }

    /// Enqueues one decode step (position and token from device memory).
    fn enqueue_step(&self, st: &State, with_head: bool) -> Result<()> {
        let (c, hy) = (&self.config, &self.hy);
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let (d, hd) = (c.hidden, c.head_dim);
        let (nh, nkv) = (c.n_heads, c.n_kv_heads);
        let (cd, vw) = (hy.conv_dim(), hy.value_width());
        let step = ptr(&b.step, s);
        let (xq, xm) = (ptr(&b.xq, s), p(&b.xm));
        let quant = |f32: u64| Input {
            f32,
            q: xq,
            meta: xm,
        };
        let normed = quant(p(&b.xn));
        let norm = |w: &CudaSlice<f32>| -> Result<()> {
            let out = QuantOut {
                f32: p(&b.xn),
                q: xq,
                meta: xm,
            };
            launch::rms_norm_quant(g, p(&b.x), p(w), c.norm_eps, d, out, 1)
        };
        launch::embed(g, &st.w.embed, ptr(&b.toks, s), step, p(&b.x), 1)?;
        for layer in &st.w.layers {
            norm(&layer.attn_norm)?;
            match &layer.mixer {
                DevMixer::Linear(m) => {
                    self.gemv(st, &m.qkvz, normed, p(&b.proj), false)?;
                    self.gemv(st, &m.ab, normed, p(&b.ab), false)?;
                    g.launch(
                        "deltanet_conv_silu",
                        (cd.div_ceil(256) as u32, 1),
                        256,
                        &[
                            Arg::Ptr(p(&b.proj)),
                            Arg::Ptr(p(&b.conv_window[m.slot])),
                            Arg::Ptr(p(&m.conv)),
                            Arg::I32(cd as i32),
                            Arg::I32(hy.conv_kernel as i32),
                            Arg::Ptr(p(&b.conv_out)),
                        ],
                    )?;
                    g.launch(
                        "deltanet_recur",
                        (hy.v_heads as u32, hy.v_dim.div_ceil(DN_ROWS) as u32),
                        128,
                        &[
                            Arg::Ptr(p(&b.conv_out)),
                            Arg::Ptr(p(&b.ab)),
                            Arg::Ptr(p(&m.a_neg)),
                            Arg::Ptr(p(&m.dt_bias)),
                            Arg::Ptr(p(&b.ssm[m.slot])),
                            Arg::I32(hy.k_heads as i32),
                            Arg::I32(hy.v_heads as i32),
                            Arg::I32(hy.k_dim as i32),
                            Arg::I32(hy.v_dim as i32),
                            Arg::I32(hy.v_tiled as i32),
                            Arg::Ptr(p(&b.o)),
                        ],
                    )?;
                    g.launch(
                        "deltanet_gated_norm",
                        (hy.v_heads as u32, 1),
                        128,
                        &[
                            Arg::Ptr(p(&b.o)),
                            // z: the rows after the conv channels.
                            Arg::Ptr(p(&b.proj) + 4 * cd as u64),
                            Arg::Ptr(p(&m.norm)),
                            Arg::F32(c.norm_eps),
                            Arg::I32(hy.v_dim as i32),
                            Arg::Ptr(p(&b.mixed)),
                        ],
                    )?;
                    launch::quantize_vec(g, p(&b.mixed), vw, xq, xm)?;
                    self.gemv(st, &m.out, quant(p(&b.mixed)), p(&b.x), true)?;
                }
                DevMixer::Full(m) => {
                    self.gemv(st, &m.qkv, normed, p(&b.proj), false)?;
                    g.launch(
                        "hybrid_attn_prep",
                        ((nh + nkv) as u32, 1),
                        hd as u32,
                        &[
                            Arg::Ptr(p(&b.proj)),
                            Arg::Ptr(p(&m.q_norm)),
                            Arg::Ptr(p(&m.k_norm)),
                            Arg::F32(c.norm_eps),
                            Arg::Ptr(p(&b.cos_sin)),
                            Arg::Ptr(step),
                            Arg::I32(nh as i32),
                            Arg::I32(nkv as i32),
                            Arg::I32(hd as i32),
                            Arg::I32(hy.rotary_dim as i32),
                            Arg::Ptr(ptr(&b.k_cache[m.slot], s)),
                            Arg::Ptr(ptr(&b.v_cache[m.slot], s)),
                            Arg::Ptr(p(&b.q)),
                            Arg::Ptr(p(&b.gate)),
                        ],
                    )?;
                    g.launch(
                        "hybrid_attn_decode",
                        (nh as u32, 1),
                        128,
                        &[
                            Arg::Ptr(p(&b.q)),
                            Arg::Ptr(p(&b.gate)),
                            Arg::Ptr(ptr(&b.k_cache[m.slot], s)),
                            Arg::Ptr(ptr(&b.v_cache[m.slot], s)),
                            Arg::Ptr(step),
                            Arg::I32(nh as i32),
                            Arg::I32(nkv as i32),
                            Arg::I32(hd as i32),
                            Arg::F32(1.0 / (hd as f32).sqrt()),
                            Arg::Ptr(p(&b.mixed)),
                        ],
                    )?;
                    launch::quantize_vec(g, p(&b.mixed), nh * hd, xq, xm)?;
                    self.gemv(st, &m.o, quant(p(&b.mixed)), p(&b.x), true)?;
                }
            }
            norm(&layer.post_norm)?;
            self.gemv(st, &layer.gate_up, normed, p(&b.gu), false)?;
            let h_out = QuantOut {
                f32: p(&b.h),
                q: xq,
                meta: xm,
            };
            launch::silu_mul_quant(g, p(&b.gu), c.ffn, h_out, 1)?;
            self.gemv(st, &layer.down, quant(p(&b.h)), p(&b.x), true)?;
        }
        if with_head {
            norm(&st.w.final_norm)?;
            self.gemv(st, st.w.head(), normed, p(&b.logits), false)?;
        }
        g.launch("advance_position", (1, 1), 32, &[Arg::Ptr(step)])
    }

    fn capture(&self, st: &State, with_head: bool) -> Result<StepGraph> {
        StepGraph::capture(&st.gpu.stream, "hybrid decode graph", || {
            self.enqueue_step(st, with_head)
        })
    }

    fn run_step(&self, st: &mut State, with_head: bool) -> Result<()> {
        if !self.use_graph {
            return self.enqueue_step(st, with_head);
        }
        if st.graphs.is_none() {
            let with = self.capture(st, true)?;
            let without = self.capture(st, false)?;
            st.graphs = Some((with, without));
        }
        let (with, without) = st.graphs.as_ref().expect("captured above");
        let g = if with_head { with } else { without };
        g.launch("hybrid decode")
    }

    /// Zeroes every conv window and delta-rule state (a sequence starting at position 0).
    fn reset_state(st: &mut State) -> Result<()> {
        let s = st.gpu.stream.clone();
        for buf in st.b.conv_window.iter_mut().chain(st.b.ssm.iter_mut()) {
            s.memset_zeros(buf)
                .map_err(|e| crate::device::cuda_err("resetting the recurrent state", e))?;
        }
        Ok(())
    }

    fn forward_locked(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
    ) -> Result<Vec<f32>> {
        // Continuing where the state is: just the new tokens. Anywhere else (a rewind, a
        // restart, after an error): zero the state and replay the sequence's own earlier
        // tokens up to pos0 without the LM head (the recurrent state cannot be cut back).
        let (start, feed) = if st.seq_len == Some(pos0) {
            (pos0, tokens.to_vec())
        } else {
            if pos0 > st.history.len() {
                return Err(Error::InvalidArgument(format!(
                    "CUDA hybrid: a cache at position {pos0}, but this GPU model has run only                      {} tokens of the sequence (it serves one sequence at a time)",
                    st.history.len()
                )));
            }
            Self::reset_state(st)?;
            let mut f = st.history[..pos0].to_vec();
            f.extend_from_slice(tokens);
            (0, f)
        };
        let skip = feed.len() - tokens.len();
        st.seq_len = None;
        let ids: Vec<i32> = feed.iter().map(|&t| t as i32).collect();
        {
            let s = st.gpu.stream.clone();
            let mut view = st.b.toks.slice_mut(start..start + ids.len());
            s.memcpy_htod(&ids, &mut view)
                .map_err(|e| crate::device::cuda_err("uploading token ids", e))?;
            if st.device_pos != Some(start) {
                s.memcpy_htod(&[start as i32, 0], &mut st.b.step)
                    .map_err(|e| crate::device::cuda_err("setting the position", e))?;
            }
        }
        st.device_pos = None;
        let mut out = Vec::new();
        for i in 0..feed.len() {
            let mine = i >= skip;
            let want = mine && (which == Logits::All || i + 1 == feed.len());
            self.run_step(st, want)?;
            if mine && which == Logits::All {
                out.extend(self.read_logits(st)?);
            }
        }
        if which == Logits::Last {
            out = self.read_logits(st)?;
        }
        st.gpu.sync()?;
        st.device_pos = Some(pos0 + tokens.len());
        st.seq_len = Some(pos0 + tokens.len());
        st.history.truncate(pos0);
        st.history.extend_from_slice(tokens);
        Ok(out)
    }

    fn read_logits(&self, st: &mut State) -> Result<Vec<f32>> {
        let b = &mut st.b;
        Ok(copy_to_pinned(&st.gpu, &b.logits, &mut b.host_logits)?.to_vec())
    }
}

impl ExternalNet for CudaHybrid {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Vec<f32>> {
        check_forward(tokens, cache, self.config.vocab, self.ctx)?;
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        let pos0 = cache.len();
        let out = self.forward_locked(&mut st, tokens, pos0, which)?;
        cache.advance(tokens.len());
        Ok(out)
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};

    /// The generated tiny hybrid's config, as the loader reads it.
    fn tiny_config() -> (ModelConfig, HybridConfig) {
        let dir = tempfile::tempdir().unwrap();
        let p = HybridPreset::by_name("tiny-qwen35").unwrap();
        let f = OutFormat::parse("q2_0").unwrap();
        generate(&p, 1, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
        let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
        let hy = files.config.hybrid.clone().unwrap();
        (files.config, hy)
    }

    #[test]
    fn shapes_the_kernels_cannot_run_are_refused_with_the_reason() {
        let (c, hy) = tiny_config();
        check_shapes(&c, &hy).unwrap();
        let refused = |c: &ModelConfig, hy: &HybridConfig, needle: &str| {
            let e = check_shapes(c, hy).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        };
        refused(
            &ModelConfig {
                head_dim: 320,
                ..c.clone()
            },
            &hy,
            "head_dim",
        );
        refused(
            &c,
            &HybridConfig {
                rotary_dim: 33,
                ..hy.clone()
            },
            "rotary",
        );
        refused(
            &c,
            &HybridConfig {
                k_dim: 48,
                ..hy.clone()
            },
            "key dims",
        );
        refused(
            &c,
            &HybridConfig {
                v_heads: 10,
                ..hy.clone()
            },
            "key heads",
        );
        refused(
            &ModelConfig {
                n_kv_heads: 3,
                ..c.clone()
            },
            &hy,
            "kv heads",
        );
        refused(
            &ModelConfig {
                ffn: 520,
                ..c.clone()
            },
            &hy,
            "multiples of 64",
        );
    }
}
