//! `CudaModel`: a llama/qwen3 model decoding on the GPU, one token per step, the whole step
//! (embedding → every layer → final norm → LM head) replayed from a CUDA graph.
//!
//! The graph reads the position from a device-side counter that its last kernel increments,
//! and the token from a device array indexed by that position; a decode step is a 4-byte
//! upload, one launch and the logits copied back. Prompts of more than one token go through
//! the batched prefill (`prefill.rs`) instead, unless it is switched off (then n graph
//! launches). Graphs are captured on first use per kind of step — the attention's grid (4, 8
//! or 16 blocks per head by the context's length: `decode_attention.rs`) and with or without
//! the LM head (prompt tokens whose logits nobody reads skip it).

use crate::buffers::Buffers;
use crate::decode_attention::{self, ATT_CHUNK, ATT_CLUSTER};
use crate::device::{ptr, Arg, Gpu};
use crate::gemv::{
    fused_fits, launch_matrix_gemv, launch_ternary_fused, FusedInput, FusedOpts, GemvInput,
    TernaryArgs,
};
use crate::graph::{copy_to_pinned, StepGraph};
use crate::launch;
pub use crate::options::{CudaOptions, FusedSet};
use crate::prefill::PrefillBuffers;
use crate::weights::{self, DevMatrix, DevWeights};
use cudarc::driver::CudaSlice;
use std::collections::HashMap;
use std::sync::Mutex;
use trit::format::config::{ModelConfig, RopeStyle};
use trit::format::ModelFiles;
use trit::model::{ExternalNet, KvCache, Logits, Model};
use trit::sample::RowLogits;
use trit::{Error, Result};

/// Which kernels a decode step takes (captured graphs are kept per kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StepKind {
    /// The kernel chain (`enqueue_layers`), its attention launched with `splits` blocks per
    /// head (`CudaModel::att_grid`).
    Chain { splits: usize },
    /// Attention + o in one kernel (`CudaModel::short_step`).
    Short,
}

/// Where a decode step's LM head writes its logits (graphs are kept per choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Head {
    /// No head: prompt tokens whose logits nobody reads.
    Skip,
    /// Into `Buffers::logits`, for kernels after the step (picks, top-k candidates).
    Device,
    /// Into `Buffers::mapped_logits`, page-locked host memory the head's stores reach over the
    /// bus while it runs, instead of a copy after it (`CudaOptions::head_to_host`).
    Host,
}

pub(crate) struct State {
    pub(crate) gpu: Gpu,
    pub(crate) w: DevWeights,
    pub(crate) b: Buffers,
    /// Chunk activations of the batched prefill, allocated on the first prompt.
    pub(crate) prefill: Option<PrefillBuffers>,
    /// Decode steps captured on first use, per kind and where their LM head writes.
    graphs: HashMap<(StepKind, Head), StepGraph>,
    /// The device counter's value when known (None after an error or a batched call).
    pub(crate) device_pos: Option<usize>,
    /// Slots and row buffers of the batched path (`batch.rs`), made on its first use.
    pub(crate) batch: Option<crate::batch::BatchState>,
    /// Candidate buffers of the single path's sampled steps (`topk.rs`), made on first use.
    pub(crate) top: Option<crate::topk::TopBuffers>,
    /// The greedy loop's buffers and graphs (`greedy.rs`), made on first use.
    pub(crate) greedy: Option<crate::greedy::GreedyBufs>,
}

pub struct CudaModel {
    pub(crate) config: ModelConfig,
    pub(crate) ctx: usize,
    /// Prompts of several tokens take the batched prefill (else token by token).
    pub(crate) prefill: bool,
    /// `CudaOptions::prefill_chunk`.
    pub(crate) prefill_chunk: usize,
    n_splits: usize,
    att_min_chunk: usize,
    /// The decode attention's kernel (`attn_decode*`).
    att_kernel: &'static str,
    /// Where `CudaOptions::att_cluster` applies: the cluster-merge kernel, which steps of
    /// `ATT_CLUSTER` blocks per head take instead (`decode_attention::kernel`).
    att_cluster_kernel: Option<&'static str>,
    pub(crate) rows_per_warp: Option<usize>,
    pub(crate) max_split: usize,
    pub(crate) use_graph: bool,
    pub(crate) fused: FusedSet,
    pub(crate) persist_mlp: bool,
    /// `CudaOptions::attention_o` and `attention_o_max`.
    pub(crate) attention_o: bool,
    attention_o_max: usize,
    pub(crate) stream_down: bool,
    /// `CudaOptions::greedy_loop`.
    pub(crate) greedy_loop: bool,
    weight_bytes: usize,
    bytes_per_token: usize,
    device_name: String,
    /// Sequences the batched path holds at once (KV slots; `batch.rs`).
    pub(crate) max_seqs: usize,
    pub(crate) state: Mutex<State>,
}

/// Loads `files` onto the GPU as a `Model` that sessions, generation and the benchmark drive
/// like the CPU one.
pub fn load_model(files: &ModelFiles, opts: &CudaOptions) -> Result<Model> {
    if files.config.arch == trit::format::config::Arch::Qwen35 {
        let m = crate::hybrid::CudaHybrid::load(files, opts)?;
        return Ok(Model::from_external(Box::new(m)));
    }
    let m = CudaModel::load(files, opts)?;
    Ok(Model::from_external(Box::new(m)))
}

impl CudaModel {
    pub fn load(files: &ModelFiles, opts: &CudaOptions) -> Result<CudaModel> {
        let cfg = files.config.clone();
        if opts
            .rows_per_warp
            .is_some_and(|r| ![1, 2, 4, 8].contains(&r))
        {
            return Err(Error::InvalidArgument(format!(
                "rows per warp must be 1, 2, 4 or 8 (got {:?})",
                opts.rows_per_warp
            )));
        }
        if ![1, 2, 4].contains(&opts.max_split) {
            return Err(Error::InvalidArgument(format!(
                "GEMV split must be 1, 2 or 4 (got {})",
                opts.max_split
            )));
        }
        if opts.ctx == 0 {
            return Err(Error::InvalidArgument(
                "CUDA context size must be at least 1".into(),
            ));
        }
        if files.rotation.is_some() {
            return Err(Error::Unsupported(
                "Hadamard-rotated models on CUDA: not written yet".into(),
            ));
        }
        let hd = cfg.head_dim;
        if !hd.is_multiple_of(32) || hd > 256 || cfg.n_kv_heads == 0 {
            return Err(Error::Unsupported(format!(
                "CUDA attention needs head_dim a multiple of 32 up to 256 (got {hd})"
            )));
        }
        if !cfg.n_heads.is_multiple_of(cfg.n_kv_heads) {
            return Err(Error::Format(format!(
                "{} query heads are not a multiple of {} kv heads",
                cfg.n_heads, cfg.n_kv_heads
            )));
        }
        if !(1..=64).contains(&opts.att_splits) {
            return Err(Error::InvalidArgument(format!(
                "attention splits must be 1 to 64 (got {})",
                opts.att_splits
            )));
        }
        if opts.att_min_chunk == 0
            || !opts.att_min_chunk.is_multiple_of(ATT_CHUNK)
            || opts.att_min_chunk > 4096
        {
            return Err(Error::InvalidArgument(format!(
                "the fewest positions per attention split must be a multiple of {ATT_CHUNK} up \
                 to 4096 (got {})",
                opts.att_min_chunk
            )));
        }
        // The environment overrides the option (benchmarks switch it without a rebuild).
        let fused = match std::env::var("TRIT_CUDA_FUSED") {
            Ok(v) => FusedSet::parse(&v)?,
            Err(_) => opts.fused,
        };
        // BitNet's sub-norms before o and down (sub_norm.rs) are not in the persistent MLP or
        // attention + o, which stay off for it.
        let plain_blocks = !cfg.bitnet;
        let gpu = Gpu::open(opts.device)?;
        let w = weights::load(&gpu, &cfg, files.weights.as_ref())?;
        let n_splits = opts.ctx.div_ceil(ATT_CHUNK).min(opts.att_splits);
        let b = Buffers::new(&gpu, &cfg, opts.ctx, n_splits, opts.head_to_host)?;
        let (weight_bytes, bytes_per_token) = (w.weight_bytes(), w.bytes_per_token());
        Ok(CudaModel {
            ctx: opts.ctx,
            prefill: opts.prefill,
            prefill_chunk: opts.prefill_chunk,
            n_splits,
            att_min_chunk: opts.att_min_chunk,
            att_kernel: decode_attention::kernel(cfg.head_dim, false),
            att_cluster_kernel: (opts.att_cluster
                && matches!(cfg.head_dim, 64 | 128)
                && gpu.compute_capability.0 >= 9
                && n_splits >= ATT_CLUSTER)
                .then(|| decode_attention::kernel(cfg.head_dim, true)),
            rows_per_warp: opts.rows_per_warp,
            max_split: opts.max_split,
            use_graph: opts.graph,
            fused,
            persist_mlp: opts.persist_mlp && plain_blocks,
            attention_o: opts.attention_o && plain_blocks,
            attention_o_max: opts.attention_o_max,
            stream_down: opts.stream_down,
            greedy_loop: opts.greedy_loop,
            weight_bytes,
            bytes_per_token,
            device_name: gpu.name.clone(),
            // Per slot: keys and values of every layer for the full context, f16.
            max_seqs: crate::batch::max_seqs_for(
                &gpu,
                cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * opts.ctx * 2,
            ),
            config: cfg,
            state: Mutex::new(State {
                gpu,
                w,
                b,
                prefill: None,
                graphs: Default::default(),
                device_pos: None,
                batch: None,
                top: None,
                greedy: None,
            }),
        })
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// KV positions held on the GPU.
    pub fn ctx(&self) -> usize {
        self.ctx
    }
}

/// Where a matrix product reads its input: f32 values (dense matrices) and their int8 blocks
/// (ternary matrices).
pub(crate) struct Input {
    pub(crate) f32: u64,
    pub(crate) q: u64,
    pub(crate) meta: u64,
}

impl CudaModel {
    pub(crate) fn gemv(
        &self,
        st: &State,
        m: &DevMatrix,
        inp: &Input,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let x = GemvInput {
            f32: inp.f32,
            q: inp.q,
            meta: inp.meta,
        };
        let r = self.rows_per_warp.unwrap_or(DEFAULT_ROWS_PER_WARP);
        launch_matrix_gemv(&st.gpu, m, x, y, accumulate, r, self.max_split)
    }

    /// The fused GEMV's view of `m` when the decode step may use it for `m` (ternary, fits in
    /// shared memory, fused kernels on); `None`: the separate kernels.
    pub(crate) fn fused_args(
        &self,
        st: &State,
        m: &DevMatrix,
        which: bool,
        glu: bool,
    ) -> Option<TernaryArgs> {
        let r = self.rows_per_warp.unwrap_or(DEFAULT_ROWS_PER_WARP);
        if !which || ![2, 4, 8].contains(&r) {
            return None;
        }
        let a = m.ternary_args(&st.gpu.stream)?;
        fused_fits(&a, glu).then_some(a)
    }

    pub(crate) fn fused_gemv(
        &self,
        st: &State,
        m: &TernaryArgs,
        input: FusedInput,
        y: u64,
        accumulate: bool,
        glu: bool,
    ) -> Result<()> {
        let opts = FusedOpts {
            r: self.rows_per_warp.unwrap_or(DEFAULT_ROWS_PER_WARP),
            max_split: self.max_split,
            accumulate,
            glu,
            act: self.config.ffn_act,
            late_trigger: false,
        };
        launch_ternary_fused(&st.gpu, m, input, y, opts)
    }

    /// Enqueues one decode step (the position and token come from device memory).
    /// Per layer, the device addresses of the single path's own keys and values.
    pub(crate) fn own_kv(st: &State) -> Vec<(u64, u64)> {
        let s = &st.gpu.stream;
        st.b.k_cache
            .iter()
            .zip(&st.b.v_cache)
            .map(|(k, v)| (ptr(k, s), ptr(v, s)))
            .collect()
    }

    /// Enqueues one decode step of the token at `toks[step]`, its keys and values appended
    /// to the caches at `kv` (per layer, `[kv_head][ctx][head_dim]` f16: the single path's own,
    /// or a batch slot's).
    pub(crate) fn enqueue_step(
        &self,
        st: &State,
        head: Head,
        kv: &[(u64, u64)],
        kind: StepKind,
    ) -> Result<()> {
        self.enqueue_layers(st, head, kv, kind)?;
        let step = ptr(&st.b.step, &st.gpu.stream);
        st.gpu
            .launch("advance_position", (1, 1), 32, &[Arg::Ptr(step)])
    }

    /// `enqueue_step` up to the logits: the caller ends the step (advances the position).
    pub(crate) fn enqueue_layers(
        &self,
        st: &State,
        head: Head,
        kv: &[(u64, u64)],
        kind: StepKind,
    ) -> Result<()> {
        let (short, att_splits) = match kind {
            StepKind::Short => (true, self.n_splits),
            StepKind::Chain { splits } => (false, splits),
        };
        let c = &self.config;
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let (d, hd) = (c.hidden, c.head_dim);
        let nq = c.n_heads * hd;
        let step = ptr(&b.step, s);
        let toks = ptr(&b.toks, s);
        let (xq, xm) = (ptr(&b.xq, s), p(&b.xm));
        // Embedding row of the token at the current position.
        launch::embed(g, &st.w.embed, toks, step, p(&b.x), 1)?;
        let qout = launch::QuantOut {
            f32: p(&b.xn),
            q: xq,
            meta: xm,
        };
        let norm = |w: &CudaSlice<f32>, x: u64| -> Result<()> {
            launch::rms_norm_quant(g, x, p(w), c.norm_eps, d, qout, 1)
        };
        let normed = Input {
            f32: p(&b.xn),
            q: xq,
            meta: xm,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let normed_x = |gamma: &CudaSlice<f32>| FusedInput::Norm {
            x: p(&b.x),
            gamma: p(gamma),
            eps: c.norm_eps,
        };
        for (li, blk) in st.w.blocks.iter().enumerate() {
            if let Some(m) = self.fused_args(st, &blk.qkv, self.fused.qkv, false) {
                self.fused_gemv(st, &m, normed_x(&blk.attn_norm), p(&b.qkv), false, false)?;
            } else {
                norm(&blk.attn_norm, p(&b.x))?;
                self.gemv(st, &blk.qkv, &normed, p(&b.qkv), false)?;
            }
            let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, p);
            if short && self.attention_o_layer(st, blk, li, kv)? {
                continue;
            }
            let fused_quant = hd.is_multiple_of(64);
            g.launch(
                match self.att_cluster_kernel {
                    Some(k) if att_splits == ATT_CLUSTER => k,
                    _ => self.att_kernel,
                },
                (c.n_heads as u32, att_splits as u32),
                256,
                &[
                    Arg::Ptr(p(&b.qkv)),
                    Arg::Ptr(opt(&blk.q_norm)),
                    Arg::Ptr(opt(&blk.k_norm)),
                    Arg::F32(c.norm_eps),
                    Arg::Ptr(p(&b.cos_sin)),
                    Arg::Ptr(step),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(c.n_kv_heads as i32),
                    Arg::I32(hd as i32),
                    Arg::I32((c.rope_style == RopeStyle::Adjacent) as i32),
                    Arg::Ptr(kv[li].0),
                    Arg::Ptr(kv[li].1),
                    Arg::I32(self.ctx as i32),
                    Arg::F32(scale),
                    Arg::Ptr(p(&b.part_o)),
                    Arg::Ptr(p(&b.part_ml)),
                    Arg::Ptr(ptr(&b.counters, s)),
                    Arg::Ptr(p(&b.att)),
                    Arg::Ptr(xq),
                    Arg::Ptr(xm),
                    Arg::I32(fused_quant as i32),
                    Arg::I32(self.att_min_chunk as i32),
                ],
            )?;
            if !fused_quant && nq.is_multiple_of(64) {
                launch::quantize_vec(g, p(&b.att), nq, xq, xm)?;
            }
            if self.persist_mlp && nq.is_multiple_of(64) && self.mlp_persist(st, blk)? {
                continue;
            }
            let att_in = Input {
                f32: p(&b.att),
                q: xq,
                meta: xm,
            };
            match (
                &blk.attn_sub_norm,
                self.fused_args(st, &blk.o, self.fused.o, false),
            ) {
                (Some(w), _) => {
                    self.sub_normed_projection(st, &blk.o, p(&b.att), w, nq, p(&b.x))?
                }
                (None, Some(m)) if nq.is_multiple_of(64) => {
                    let input = FusedInput::Q { q: xq, meta: xm };
                    self.fused_gemv(st, &m, input, p(&b.x), true, false)?;
                }
                _ => self.gemv(st, &blk.o, &att_in, p(&b.x), true)?,
            }
            // h = silu(gate)·up (f32), with its int8 blocks only where the down GEMV reads them.
            let h_quantized = match self.fused_args(st, &blk.gate_up, self.fused.gate_up, true) {
                Some(m) => {
                    self.fused_gemv(st, &m, normed_x(&blk.ffn_norm), p(&b.h), false, true)?;
                    false
                }
                None => {
                    norm(&blk.ffn_norm, p(&b.x))?;
                    self.gemv(st, &blk.gate_up, &normed, p(&b.gu), false)?;
                    let h_out = launch::QuantOut {
                        f32: p(&b.h),
                        q: xq,
                        meta: xm,
                    };
                    launch::glu_quant(g, p(&b.gu), c.ffn, c.ffn_act, h_out, 1)?;
                    true
                }
            };
            if let Some(w) = &blk.ffn_sub_norm {
                self.sub_normed_projection(st, &blk.down, p(&b.h), w, c.ffn, p(&b.x))?;
                continue;
            }
            match self.fused_args(st, &blk.down, self.fused.down, false) {
                Some(m) => {
                    let input = FusedInput::F32 { x: p(&b.h) };
                    self.fused_gemv(st, &m, input, p(&b.x), true, false)?;
                }
                None => {
                    if !h_quantized && c.ffn.is_multiple_of(64) {
                        launch::quantize_vec(g, p(&b.h), c.ffn, xq, xm)?;
                    }
                    let streamed = self.stream_down && c.ffn.is_multiple_of(64);
                    if let Some(m) = self.fused_args(st, &blk.down, streamed, false) {
                        let input = FusedInput::Q { q: xq, meta: xm };
                        self.fused_gemv(st, &m, input, p(&b.x), true, false)?;
                        continue;
                    }
                    let h_in = Input {
                        f32: p(&b.h),
                        q: xq,
                        meta: xm,
                    };
                    self.gemv(st, &blk.down, &h_in, p(&b.x), true)?;
                }
            }
        }
        let logits = match (head, &b.mapped_logits) {
            (Head::Skip, _) => return Ok(()),
            (Head::Host, Some(m)) => m.dev,
            (Head::Host, None) => {
                return Err(Error::Unsupported(
                    "logits to mapped host memory without the buffer (head_to_host off)".into(),
                ))
            }
            (Head::Device, _) => p(&b.logits),
        };
        if let Some(m) = self.fused_args(st, st.w.head(), self.fused.head, false) {
            let input = normed_x(&st.w.final_norm);
            self.fused_gemv(st, &m, input, logits, false, false)
        } else {
            norm(&st.w.final_norm, p(&b.x))?;
            self.gemv(st, st.w.head(), &normed, logits, false)
        }
    }

    pub(crate) fn capture(
        &self,
        st: &State,
        head: Head,
        kv: &[(u64, u64)],
        kind: StepKind,
    ) -> Result<StepGraph> {
        StepGraph::capture(&st.gpu.stream, "decode graph", || {
            self.enqueue_step(st, head, kv, kind)
        })
    }

    /// Whether the step of the token at `pos` takes the attention + o kernel (a context short
    /// enough for one block per head; `CudaOptions::attention_o_max`).
    pub(crate) fn short_step(&self, pos: usize) -> bool {
        self.attention_o && pos < self.attention_o_max
    }

    /// The kernels of the step of the token at `pos`.
    pub(crate) fn step_kind(&self, pos: usize) -> StepKind {
        if self.short_step(pos) {
            StepKind::Short
        } else {
            StepKind::Chain {
                splits: self.att_grid(pos + 1),
            }
        }
    }

    /// Blocks per head of the decode attention for steps whose context reaches at most `len`
    /// positions (`decode_attention::grid`).
    pub(crate) fn att_grid(&self, len: usize) -> usize {
        decode_attention::grid(len, self.att_min_chunk, self.n_splits)
    }

    /// Runs the decode step of the token at `pos` (the device counter's value).
    pub(crate) fn run_step(&self, st: &mut State, head: Head, pos: usize) -> Result<()> {
        let kv = Self::own_kv(st);
        let kind = self.step_kind(pos);
        if !self.use_graph {
            return self.enqueue_step(st, head, &kv, kind);
        }
        let key = (kind, head);
        if !st.graphs.contains_key(&key) {
            let graph = self.capture(st, head, &kv, kind)?;
            st.graphs.insert(key, graph);
        }
        st.graphs[&key].launch("decode")
    }

    /// Where the host's steps have their LM head write: mapped host memory where the model
    /// has it (`CudaOptions::head_to_host`), else the device buffer copied back after.
    fn host_head(st: &State) -> Head {
        if st.b.mapped_logits.is_some() {
            Head::Host
        } else {
            Head::Device
        }
    }

    /// Runs `tokens` from `pos0` and lends the logits `which` asks for to `read`: the last
    /// row straight from the page-locked buffer it was copied (or written) into (`host_row`).
    fn forward_locked(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        self.upload_inputs(st, tokens, pos0)?;
        if self.use_prefill(st, tokens.len()) {
            // The prefill moves the device position itself; the next decode step re-uploads it.
            read(&self.prefill_locked(st, tokens, pos0, which)?);
            return Ok(());
        }
        let mut all = Vec::new();
        for i in 0..tokens.len() {
            let want = which == Logits::All || i + 1 == tokens.len();
            let head = if want {
                Self::host_head(st)
            } else {
                Head::Skip
            };
            self.run_step(st, head, pos0 + i)?;
            if which == Logits::All {
                all.extend_from_slice(host_row(&st.gpu, &mut st.b, self.config.vocab)?);
            }
        }
        let last = match which {
            Logits::All => None,
            Logits::Last => Some(host_row(&st.gpu, &mut st.b, self.config.vocab)?),
        };
        st.device_pos = Some(pos0 + tokens.len());
        read(last.unwrap_or(&all));
        Ok(())
    }

    /// The token ids at their positions and, where the device counter may differ, the
    /// position; the counter is unknown until the caller's steps are done.
    pub(crate) fn upload_inputs(&self, st: &mut State, tokens: &[u32], pos0: usize) -> Result<()> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let s = st.gpu.stream.clone();
        let mut view = st.b.toks.slice_mut(pos0..pos0 + ids.len());
        s.memcpy_htod(&ids, &mut view)
            .map_err(|e| crate::device::cuda_err("uploading token ids", e))?;
        if st.device_pos != Some(pos0) {
            s.memcpy_htod(&[pos0 as i32, 0], &mut st.b.step)
                .map_err(|e| crate::device::cuda_err("setting the position", e))?;
            // After an error a step may have stopped between a head's splits.
            s.memset_zeros(&mut st.b.counters)
                .map_err(|e| crate::device::cuda_err("resetting counters", e))?;
            s.memset_zeros(&mut st.b.persist)
                .map_err(|e| crate::device::cuda_err("resetting counters", e))?;
        }
        st.device_pos = None;
        Ok(())
    }

    /// The logits a step wrote into `Buffers::logits` (the device's), waiting for them.
    pub(crate) fn read_logits(&self, st: &mut State) -> Result<Vec<f32>> {
        let b = &mut st.b;
        Ok(copy_to_pinned(&st.gpu, &b.logits, &mut b.host_logits)?.to_vec())
    }
}

/// The logits of the host's last step, waiting for it: where its head wrote them (mapped
/// host memory, `Head::Host`), or copied behind it into the page-locked buffer.
fn host_row<'a>(gpu: &Gpu, b: &'a mut Buffers, vocab: usize) -> Result<&'a [f32]> {
    match &b.mapped_logits {
        Some(m) => {
            gpu.sync()?;
            Ok(m.head(vocab))
        }
        None => copy_to_pinned(gpu, &b.logits, &mut b.host_logits),
    }
}

/// Rows per warp of the ternary GEMV when not forced: 4. Measured on the H200, 8B shape,
/// tg128 with one value for every matrix: R=1 370, R=2 398, R=4 454, R=8 438 tok/s (first
/// persistent kernel); choosing R=1 for the 4096/6144-row matrices to get more warps (and R=4
/// for the rest) gave 513 against 557 for R=4 everywhere: with one row per warp the int8
/// activations are re-read from L1 once per row and that traffic, not DRAM, limits.
pub(crate) const DEFAULT_ROWS_PER_WARP: usize = 4;

/// The checks every GPU model makes before a forward pass: token ids inside the vocabulary, a
/// cache no longer than the positions allocated on the GPU.
pub(crate) fn check_forward(
    tokens: &[u32],
    cache: &KvCache,
    vocab: usize,
    ctx: usize,
) -> Result<()> {
    trit::model::check_input(tokens, cache, vocab)?;
    if cache.capacity() > ctx {
        return Err(Error::InvalidArgument(format!(
            "a {}-token context on a GPU model loaded for {} positions (load it with a \
             larger --ctx)",
            cache.capacity(),
            ctx
        )));
    }
    Ok(())
}

/// The error of a model whose state lock was poisoned by a panic in an earlier step.
pub(crate) fn poisoned() -> Error {
    Error::Unsupported("CUDA: an earlier step panicked".into())
}

impl ExternalNet for CudaModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Vec<f32>> {
        // The lent row, copied out.
        let mut out = Vec::new();
        self.forward_read(tokens, cache, which, &mut |v| out = v.to_vec())?;
        Ok(out)
    }

    fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        check_forward(tokens, cache, self.config.vocab, self.ctx)?;
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        let pos0 = cache.len();
        self.forward_locked(&mut st, tokens, pos0, which, read)?;
        cache.advance(tokens.len());
        Ok(())
    }

    fn forward_top(&self, tokens: &[u32], cache: &mut KvCache, k: usize) -> Result<RowLogits> {
        self.forward_top_gpu(tokens, cache, k)
    }

    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &trit::model::DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<trit::model::DeviceLoopRun>> {
        self.decode_on_device_gpu(first, cache, max_steps, pick, stop, accept)
    }

    fn loops_on_slots(&self) -> bool {
        true
    }

    fn hidden_states(&self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.hidden_states_gpu(tokens, which)
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    fn max_sequences(&self) -> usize {
        self.max_seqs
    }

    fn forward_batch(&self, seqs: &mut [trit::model::BatchSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_gpu(seqs)
    }

    fn copy_prefix(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> Result<bool> {
        self.copy_prefix_gpu(src, dst, n)
    }

    fn forward_batch_top(
        &self,
        seqs: &mut [trit::model::BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<trit::sample::RowLogits>> {
        self.forward_batch_rows(seqs, k, want_top)
    }
}
