//! `CudaHybrid`: a Qwen3.5 hybrid model (Gated DeltaNet + gated full attention, the CPU's
//! `trit::model::qwen35`) decoding on the GPU one token per step, the step replayed from a
//! CUDA graph like the dense `CudaModel`'s (position and token read from device memory).
//!
//! Per-sequence state on the GPU: per DeltaNet layer the conv window (`kernel × conv_dim`
//! f32) and the delta-rule state (`v_heads × v_dim × k_dim` f32); per
//! full-attention layer an f16 KV cache. Prompts of several tokens run in chunks through
//! `hybrid/prefill.rs` (batched GEMMs, the chunk's recurrence per value head). The recurrent
//! state cannot be cut back: a forward that starts before where the last one ended (a chat turn
//! reusing a prefix) zeroes it and replays the sequence's earlier tokens up to there (kept on
//! the host), without the LM head. The step's kernel sequence is `step.rs`; Hadamard-rotated
//! (Bonsai 2) files run with their rotations applied on the GPU (`rotation.rs`). Several
//! sequences (the server's continuous batching) decode together through `batch.rs`, each in
//! its own slot; generation loops on the device through `device_loop.rs`.

use crate::device::{ptr, Gpu};
use crate::graph::{alloc_host_logits, copy_to_pinned, StepGraph};
use crate::greedy::{GreedyBufs, LoopArgs};
use crate::hybrid_weights::{self, DevHybrid};
use crate::model::{check_forward, poisoned, CudaOptions, FusedSet};
use crate::topk::TopBuffers;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use std::collections::HashMap;
use std::sync::Mutex;
use trit::format::config::{HybridConfig, ModelConfig, RopeStyle};
use trit::format::ModelFiles;
use trit::model::rope::Rope;
use trit::model::{DeviceLoopRun, DevicePick, ExternalNet, KvCache, Logits};
use trit::sample::RowLogits;
use trit::{Error, Result};

mod batch;
mod device_loop;
mod prefill;
mod step;

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
    /// A rotated input's f32 values (dense matrices read them).
    xr: CudaSlice<f32>,
    /// The unrotated normed input's int8 blocks where a rotated layer also has ternary
    /// `ssm_alpha`/`ssm_beta` (the shared `xq` holds the rotated ones).
    xq2: CudaSlice<i8>,
    xm2: CudaSlice<f32>,
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
    /// Set by the greedy loop at an end-of-sequence token: the DeltaNet step then leaves the
    /// recurrent state alone (zero outside the loop).
    halt: CudaSlice<i32>,
    /// Per position `rotary_dim / 2` (cos, sin) pairs.
    cos_sin: CudaSlice<f32>,
    /// The single path's sequence.
    seq: SeqBufs,
    /// `hybrid_attn_step`'s split partials (outputs, max/sum pairs) and per-head counters.
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

/// One sequence's state on the GPU: the single path's (`Buffers::seq`) or a batched slot's
/// (`batch.rs`).
pub(crate) struct SeqBufs {
    /// Per DeltaNet layer `kernel` slots of `conv_dim` inputs: `deltanet_step` keeps them as a
    /// ring indexed by position, the separate `deltanet_conv_silu` uses the first `kernel − 1`
    /// as a shifted window.
    conv_window: Vec<CudaSlice<f32>>,
    ssm: Vec<CudaSlice<f32>>,
    /// Per full-attention layer `[position][kv_head][head_dim]` f16.
    k_cache: Vec<CudaSlice<u16>>,
    v_cache: Vec<CudaSlice<u16>>,
}

impl SeqBufs {
    /// Bytes of one sequence's state: per DeltaNet layer its conv window and delta-rule state
    /// (f32), per full-attention layer its keys and values (f16) — what `new` allocates.
    fn bytes(c: &ModelConfig, hy: &HybridConfig, ctx: usize) -> usize {
        let linear = hy.conv_kernel.max(1) * hy.conv_dim() + hy.v_heads * hy.v_dim * hy.k_dim;
        let full = 2 * c.n_kv_heads * c.head_dim * ctx;
        hy.n_linear() * linear * 4 + hy.n_full() * full * 2
    }

    fn new(gpu: &Gpu, c: &ModelConfig, hy: &HybridConfig, ctx: usize) -> Result<SeqBufs> {
        let (n_lin, n_full) = (hy.n_linear(), hy.n_full());
        let kv = c.n_kv_heads * c.head_dim * ctx;
        Ok(SeqBufs {
            conv_window: (0..n_lin)
                .map(|_| gpu.zeros(hy.conv_kernel.max(1) * hy.conv_dim()))
                .collect::<Result<_>>()?,
            ssm: (0..n_lin)
                .map(|_| gpu.zeros(hy.v_heads * hy.v_dim * hy.k_dim))
                .collect::<Result<_>>()?,
            k_cache: (0..n_full).map(|_| gpu.zeros(kv)).collect::<Result<_>>()?,
            v_cache: (0..n_full).map(|_| gpu.zeros(kv)).collect::<Result<_>>()?,
        })
    }

    /// Zeroes every conv window and delta-rule state (a sequence starting at position 0; the
    /// KV caches are written before they are read).
    fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        let s = gpu.stream.clone();
        for buf in self.conv_window.iter_mut().chain(self.ssm.iter_mut()) {
            s.memset_zeros(buf)
                .map_err(|e| crate::device::cuda_err("resetting the recurrent state", e))?;
        }
        Ok(())
    }
}

struct State {
    gpu: Gpu,
    w: DevHybrid,
    b: Buffers,
    /// Decode steps captured on first use, per attention grid and whether they end with the
    /// LM head.
    graphs: HashMap<(u32, bool), StepGraph>,
    /// The device position counter's value when known.
    device_pos: Option<usize>,
    /// Tokens the recurrent state has consumed (None after an error).
    seq_len: Option<usize>,
    /// The sequence's tokens up to the last successful forward, replayed after a rewind.
    history: Vec<u32>,
    /// Candidate buffers of sampled steps (`ExternalNet::forward_top`), made on first use.
    top: Option<TopBuffers>,
    /// Chunk activations of the batched prompt path (and the batched step's rows), allocated
    /// on first use.
    prefill: Option<prefill::HybridPrefill>,
    /// The batched path's slots and buffers, made by its first call.
    batch: Option<batch::HybridBatch>,
    /// The greedy loop's buffers and graphs (`greedy.rs`), made on first use.
    greedy: Option<GreedyBufs>,
}

pub struct CudaHybrid {
    config: ModelConfig,
    hy: HybridConfig,
    ctx: usize,
    /// Prompts of several tokens take the batched path (`CudaOptions::prefill`) in chunks of
    /// at most `prefill_chunk`.
    prefill: bool,
    prefill_chunk: usize,
    rows_per_warp: usize,
    max_split: usize,
    use_graph: bool,
    /// Matrices whose input preparation runs in the fused GEMV's prologue.
    fused: FusedSet,
    /// `CudaOptions::stream_down`.
    pub(crate) stream_down: bool,
    /// `CudaOptions::greedy_loop`.
    greedy_loop: bool,
    /// The kernel that runs the DeltaNet mixer in one launch where it can (`None`: five).
    dn_step: Option<&'static str>,
    /// `deltanet_step_early` behind the fused q‖k‖v‖z GEMV (`CudaOptions::deltanet_early`):
    /// the gates and the state's L2 requests before griddepcontrol.wait.
    pub(crate) dn_early: bool,
    /// `CudaOptions::deltanet_held`: `deltanet_step_held` where the early variant runs.
    pub(crate) dn_held: bool,
    /// `CudaOptions::deltanet_pair` on a GPU with thread block clusters (sm_90+).
    pub(crate) dn_pair: bool,
    /// `CudaOptions::deltanet_chunk`.
    dn_chunk: bool,
    /// `hybrid_attn_step*` for this head size (`CudaOptions::hybrid_attn_step`; `None`: the
    /// prep and decode kernels).
    attn_step: Option<step::AttnStep>,
    /// `CudaOptions::rotation_in_prologue`.
    rot_prologue: bool,
    /// Sequences one batched call may carry (slots): 1 where the batched step cannot run.
    max_seqs: usize,
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
        // The fused GEMV (now the streaming kernel, gemv_stream.cu) takes the dense default
        // set, q/k/v/z, gate‖up and the head: 27B tg128 on an H200, same run, 211.2 t/s
        // against 199.9 with the separate norm kernels. (The register-pipelined fused kernel
        // had been slower there: 1,400 against 1,710 t/s on 27b-qwen35-4l.)
        let fused = match std::env::var("TRIT_CUDA_FUSED") {
            Ok(v) => FusedSet::parse(&v)?,
            Err(_) => opts.fused,
        };
        // `0`: the five separate DeltaNet kernels; `1`: the one-kernel mixer started like any
        // kernel; `2`: its hoisted variant (as fast, BENCHMARKS "GPU, session 7"); else the
        // one-kernel mixer, early where `opts.deltanet_early` (behind the fused GEMV).
        let dn_step = match std::env::var("TRIT_CUDA_DN_STEP").as_deref() {
            Ok("0") => None,
            Ok("2") => Some("deltanet_step_hoisted"),
            _ => Some("deltanet_step"),
        };
        let gpu = Gpu::open(opts.device)?;
        let w = hybrid_weights::load(
            &gpu,
            &cfg,
            &hy,
            files.weights.as_ref(),
            files.rotation.as_ref(),
        )?;
        let attn_step = step::AttnStep::new(opts, cfg.head_dim)?;
        let splits = attn_step.map_or(1, |a| a.splits as usize);
        let b = Buffers::new(&gpu, &cfg, &hy, opts.ctx, splits)?;
        let mut model = CudaHybrid {
            ctx: opts.ctx,
            prefill: opts.prefill,
            prefill_chunk: opts.prefill_chunk,
            rows_per_warp,
            max_split: opts.max_split,
            use_graph: opts.graph,
            fused,
            stream_down: opts.stream_down,
            greedy_loop: opts.greedy_loop,
            dn_step,
            dn_early: opts.deltanet_early,
            dn_held: opts.deltanet_held,
            dn_pair: opts.deltanet_pair && gpu.compute_capability.0 >= 9,
            dn_chunk: opts.deltanet_chunk,
            attn_step,
            rot_prologue: opts.rotation_in_prologue,
            max_seqs: 1,
            weight_bytes: w.weight_bytes(),
            bytes_per_token: w.bytes_per_token(),
            device_name: gpu.name.clone(),
            config: cfg,
            hy,
            state: Mutex::new(State {
                gpu,
                w,
                b,
                graphs: HashMap::new(),
                device_pos: None,
                top: None,
                prefill: None,
                batch: None,
                greedy: None,
                seq_len: Some(0),
                history: Vec::new(),
            }),
        };
        // Slots as for dense models (TRIT_CUDA_MAX_SEQS, else as many as fit); one where the
        // batched step cannot run this model.
        let batchable = {
            let st = model.state.lock().map_err(|_| poisoned())?;
            model.batchable(&st)
        };
        if batchable {
            let per_slot = SeqBufs::bytes(&model.config, &model.hy, model.ctx);
            let st = model.state.get_mut().unwrap_or_else(|e| e.into_inner());
            model.max_seqs = crate::batch::max_seqs_for(&st.gpu, per_slot);
        }
        Ok(model)
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }
}

impl Buffers {
    fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        hy: &HybridConfig,
        ctx: usize,
        att_splits: usize,
    ) -> Result<Buffers> {
        let (d, hd) = (c.hidden, c.head_dim);
        let (nq, nkv) = (c.n_heads * hd, c.n_kv_heads * hd);
        let (cd, vw) = (hy.conv_dim(), hy.value_width());
        let widest = d.max(nq).max(c.ffn).max(vw);
        // cos/sin from the CPU's own Rope over the rotated dims (NeoX pairs), per position.
        let rope = Rope::new(hy.rotary_dim, c.rope_theta, RopeStyle::Neox, None);
        let cs = crate::buffers::rope_table(&rope, ctx);
        Ok(Buffers {
            toks: gpu.zeros(ctx)?,
            step: gpu.zeros(2)?,
            x: gpu.zeros(d)?,
            xn: gpu.zeros(d)?,
            xq: gpu.zeros(widest)?,
            xm: gpu.zeros(2 * widest / 64 + 2)?,
            xr: gpu.zeros(widest)?,
            xq2: gpu.zeros(d)?,
            xm2: gpu.zeros(2 * d / 64 + 2)?,
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
            host_logits: alloc_host_logits(gpu, c.vocab)?,
            halt: gpu.zeros(1)?,
            cos_sin: gpu.upload(&cs)?,
            seq: SeqBufs::new(gpu, c, hy, ctx)?,
            part_o: gpu.zeros(c.n_heads * att_splits * hd)?,
            part_ml: gpu.zeros(2 * c.n_heads * att_splits)?,
            counters: gpu.zeros(c.n_heads)?,
        })
    }
}

/// Puts `tokens` at positions `start..` of the step's token array and, where the device
/// counter may stand elsewhere, sets it to `start`; the counter is unknown afterwards.
fn upload_feed(st: &mut State, tokens: &[u32], start: usize) -> Result<()> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let s = st.gpu.stream.clone();
    let mut view = st.b.toks.slice_mut(start..start + ids.len());
    s.memcpy_htod(&ids, &mut view)
        .map_err(|e| crate::device::cuda_err("uploading token ids", e))?;
    if st.device_pos != Some(start) {
        s.memcpy_htod(&[start as i32, 0], &mut st.b.step)
            .map_err(|e| crate::device::cuda_err("setting the position", e))?;
        // After an error a step may have stopped between a head's splits.
        s.memset_zeros(&mut st.b.counters)
            .map_err(|e| crate::device::cuda_err("resetting counters", e))?;
    }
    st.device_pos = None;
    Ok(())
}

impl CudaHybrid {
    /// Runs the decode step of the token at `pos` (the device counter's value).
    fn run_step(&self, st: &mut State, with_head: bool, pos: usize) -> Result<()> {
        if !self.use_graph {
            return self.enqueue_step(st, with_head, pos + 1);
        }
        // One graph per attention grid: the grid of this position's, covering it.
        let key = (self.att_grid(pos + 1), with_head);
        if !st.graphs.contains_key(&key) {
            let g = StepGraph::capture(&st.gpu.stream, "hybrid decode graph", || {
                self.enqueue_step(st, with_head, pos + 1)
            })?;
            st.graphs.insert(key, g);
        }
        st.graphs[&key].launch("hybrid decode")
    }

    /// Runs `tokens` from `pos0`; lends the logits `which` asks for to `read` (the last row
    /// straight from its page-locked copy; `None`: the last token's row stays on the device,
    /// for the candidate kernel).
    fn forward_locked(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Option<Logits>,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        // Continuing where the state is: just the new tokens. Anywhere else (a rewind, a
        // restart, after an error): zero the state and replay the sequence's own earlier
        // tokens up to pos0 without the LM head (the recurrent state cannot be cut back).
        let (start, feed) = if st.seq_len == Some(pos0) {
            (pos0, tokens.to_vec())
        } else {
            if pos0 > st.history.len() {
                return Err(Error::InvalidArgument(format!(
                    "CUDA hybrid: a cache at position {pos0}, but this GPU model's single path \
                     has run only {} tokens of its sequence (it serves one sequence at a time; \
                     several go through forward_batch)",
                    st.history.len()
                )));
            }
            st.b.seq.reset(&st.gpu)?;
            let mut f = st.history[..pos0].to_vec();
            f.extend_from_slice(tokens);
            (0, f)
        };
        let skip = feed.len() - tokens.len();
        st.seq_len = None;
        upload_feed(st, &feed, start)?;
        let mut all = Vec::new();
        if which != Some(Logits::All) && self.use_prefill(st, feed.len()) {
            // The prompt in chunks; the head only for its last token.
            self.prefill_prompt(st, start, feed.len())?;
        } else {
            for i in 0..feed.len() {
                let mine = i >= skip;
                let want = mine && (which == Some(Logits::All) || i + 1 == feed.len());
                self.run_step(st, want, start + i)?;
                if mine && which == Some(Logits::All) {
                    all.extend(self.read_logits(st)?);
                }
            }
        }
        // The last row's copy is queued behind the steps (copy_to_pinned waits for both).
        match which {
            Some(Logits::Last) => read(copy_to_pinned(
                &st.gpu,
                &st.b.logits,
                &mut st.b.host_logits,
            )?),
            Some(Logits::All) => read(&all),
            None => {}
        }
        self.finish_forward(st, tokens, pos0)
    }

    /// Waits for the step(s) and records the sequence as `tokens` appended at `pos0`.
    fn finish_forward(&self, st: &mut State, tokens: &[u32], pos0: usize) -> Result<()> {
        st.gpu.sync()?;
        st.device_pos = Some(pos0 + tokens.len());
        st.seq_len = Some(pos0 + tokens.len());
        st.history.truncate(pos0);
        st.history.extend_from_slice(tokens);
        Ok(())
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

    fn hidden_states(&self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.hidden_states_gpu(tokens, which)
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
        self.forward_locked(&mut st, tokens, pos0, Some(which), read)?;
        cache.advance(tokens.len());
        Ok(())
    }

    /// One sampled step answered with the row's `k` best candidates (the candidate kernel on
    /// the device's logits), as the dense model's single path does; a prompt, an unsupported
    /// `k` or a non-finite normalizer come back in full.
    fn forward_top(&self, tokens: &[u32], cache: &mut KvCache, k: usize) -> Result<RowLogits> {
        let vocab = self.config.vocab;
        if tokens.len() != 1 || !crate::topk::supported(k, vocab) {
            return Ok(RowLogits::Full(self.forward(
                tokens,
                cache,
                Logits::Last,
            )?));
        }
        check_forward(tokens, cache, vocab, self.ctx)?;
        let mut guard = self.state.lock().map_err(|_| poisoned())?;
        let st: &mut State = &mut guard;
        let pos0 = cache.len();
        self.forward_locked(st, tokens, pos0, None, &mut |_| {})?;
        let logits = ptr(&st.b.logits, &st.gpu.stream);
        let row = match crate::topk::one_row(&mut st.top, &st.gpu, logits, vocab, k)? {
            Some(t) => RowLogits::Top(t),
            None => RowLogits::Full(self.read_logits(st)?),
        };
        cache.advance(1);
        Ok(row)
    }

    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        check_forward(&[first], cache, self.config.vocab, self.ctx)?;
        let pos0 = cache.len();
        let max_steps = max_steps.min(self.ctx - pos0);
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        let args = LoopArgs {
            first,
            pos0,
            max_steps,
            pick,
            stop,
        };
        let run = self.greedy_locked(&mut st, &args, accept)?;
        if let Some(r) = run {
            cache.advance(r.fed);
        }
        Ok(run)
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
        if self.max_seqs <= 1 {
            // The single path, as the trait's default does.
            return match seqs {
                [s] => Ok(vec![self.forward(s.tokens, s.cache, s.logits)?]),
                _ => Err(Error::Unsupported(
                    "batched decoding of this hybrid model on the GPU (one sequence at a time)"
                        .into(),
                )),
            };
        }
        let rows = self.forward_batch_rows(seqs, 0, &[])?;
        Ok(crate::batch_rows::full_rows(rows))
    }

    fn forward_batch_top(
        &self,
        seqs: &mut [trit::model::BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<RowLogits>> {
        if self.max_seqs <= 1 {
            let rows = self.forward_batch(seqs)?;
            return Ok(rows.into_iter().map(RowLogits::Full).collect());
        }
        self.forward_batch_rows(seqs, k, want_top)
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
