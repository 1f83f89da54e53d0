//! Batched decoding of hybrid models, for the server's continuous batching: each sequence's
//! state (conv windows, delta-rule states, KV caches) lives in a GPU *slot* owned by its
//! `KvCache` (as the dense model's, `crate::batch`), allocated on first use and kept.
//!
//! One `forward_batch` call: each prompt runs through the batched prompt path (`prefill.rs`)
//! with its slot's state swapped in for the single path's; then every sequence that feeds one
//! token runs as ONE step over B rows — the matrix products are the dense batched step's
//! small-batch int8 GEMMs over the B rows (each weight read once for all), the DeltaNet step
//! and the gated attention are one launch each over all rows (`deltanet_step_slots`,
//! `hybrid_attn_*_slots`: row y finds its slot's state through a table of addresses), and the
//! LM head is one GEMM over the rows (a dense head: one GEMV per row). The step is captured as
//! a CUDA graph per row count (tokens, positions and slots are read from device memory). One
//! or two rows instead replay the single path's step, captured per slot: for so few rows the
//! GEMV kernels beat the GEMM tiles (as for dense models). A slot's recurrent state cannot be
//! cut back: a sequence continues where its slot stands, or starts at position 0.
//!
//! H200, 27B shape (BENCHMARKS.md "GPU, session 16"): B = 16 4.0x the single path, B = 32
//! 5.3x, B = 64 5.7x; the small-batch GEMMs take most of the step (MLP ~110 µs per layer at
//! 8 rows against ~29 µs on the single path's GEMVs).

use super::{CudaHybrid, SeqBufs, State};
use crate::batch::{single_rows_max, use_small_gemm};
use crate::batch_gemm::{launch_small_gemm, SmallGemm, SplitScratch};
use crate::batch_rows::{self, Row};
use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::graph::{alloc_host_logits, StepGraph};
use crate::hybrid_weights::{DevFullAttention, DevMixer};
use crate::topk::{self, TopBuffers};
use crate::weights::DevMatrix;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Instant;
use trit::model::{BatchSeq, Logits};
use trit::sample::RowLogits;
use trit::{Error, Result};

/// One slot: a sequence's state and how many tokens of it that state has consumed.
struct Slot {
    seq: SeqBufs,
    /// `None` after a call that failed part-way: only a sequence starting at position 0 may
    /// use the slot again.
    len: Option<usize>,
}

/// The batched path's GPU state (inside the model's `State`, under its mutex).
pub(super) struct HybridBatch {
    pool: trit::model::device_slot::SlotPool,
    slots: Vec<Option<Slot>>,
    /// The step's tokens, row after row, and a zero the embedding kernel adds to the row.
    toks: CudaSlice<i32>,
    zero: CudaSlice<i32>,
    logits: CudaSlice<f32>,
    host_logits: PinnedHostSlice<f32>,
    top: TopBuffers,
    /// Partial tiles of the split-K GEMMs.
    split: SplitScratch,
    /// Per slot `stride` state addresses (0 for a slot not allocated yet): per DeltaNet layer
    /// its conv window and delta-rule state, then per full-attention layer its key and value
    /// caches; the step's kernels find each row's through `row_slot`.
    tab: CudaSlice<u64>,
    tab_host: Vec<u64>,
    stride: usize,
    row_slot: CudaSlice<i32>,
    /// Batched steps captured per number of rows (tokens, positions and slots are read from
    /// device memory, so one graph serves every step of that size).
    graphs: HashMap<usize, StepGraph>,
    /// The single path's step (with the head) captured per slot.
    single: HashMap<usize, StepGraph>,
}

impl HybridBatch {
    fn new(gpu: &Gpu, vocab: usize, max_seqs: usize, stride: usize) -> Result<HybridBatch> {
        let tab_host = vec![0u64; max_seqs * stride];
        Ok(HybridBatch {
            tab: gpu.upload(&tab_host)?,
            tab_host,
            stride,
            row_slot: gpu.zeros(max_seqs)?,
            pool: trit::model::device_slot::SlotPool::new(max_seqs),
            slots: (0..max_seqs).map(|_| None).collect(),
            toks: gpu.zeros(max_seqs)?,
            zero: gpu.zeros(2)?,
            logits: gpu.zeros(max_seqs * vocab)?,
            host_logits: alloc_host_logits(gpu, max_seqs * vocab)?,
            top: TopBuffers::new(gpu, max_seqs)?,
            split: SplitScratch::new(gpu)?,
            graphs: HashMap::new(),
            single: HashMap::new(),
        })
    }

    /// Enters slot `i`'s state addresses in the table (device copy too).
    fn enter_slot(&mut self, gpu: &Gpu, i: usize) -> Result<()> {
        let s = &gpu.stream;
        let seq = &self.slots[i].as_ref().expect("allocated by the caller").seq;
        let n_lin = seq.ssm.len();
        let row = &mut self.tab_host[i * self.stride..(i + 1) * self.stride];
        for (l, (w, h)) in seq.conv_window.iter().zip(&seq.ssm).enumerate() {
            row[2 * l] = ptr(w, s);
            row[2 * l + 1] = ptr(h, s);
        }
        for (l, (k, v)) in seq.k_cache.iter().zip(&seq.v_cache).enumerate() {
            row[2 * (n_lin + l)] = ptr(k, s);
            row[2 * (n_lin + l) + 1] = ptr(v, s);
        }
        s.memcpy_htod(&self.tab_host, &mut self.tab)
            .map_err(|e| cuda_err("uploading the slot table", e))
    }

    fn slot_mut(&mut self, slot: usize) -> &mut Slot {
        self.slots[slot].as_mut().expect("allocated on attach")
    }
}

impl CudaHybrid {
    /// Whether several sequences can run together: every layer one the batched prompt path
    /// covers (its row kernels run the batched step), and int8 tensor cores.
    pub(super) fn batchable(&self, st: &State) -> bool {
        self.use_prefill(st, 2)
    }

    /// `ExternalNet::forward_batch_top` (see the module documentation): rows of one token with
    /// `want_top` set come back as their `k` best candidates where the kernel can give them.
    pub(super) fn forward_batch_rows(
        &self,
        seqs: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<RowLogits>> {
        let c = &self.config;
        batch_rows::check_seqs(seqs, want_top, c.vocab, self.ctx)?;
        let mut guard = self.state.lock().map_err(|_| crate::model::poisoned())?;
        let st: &mut State = &mut guard;
        if !self.batchable(st) {
            return Err(Error::Unsupported(
                "CUDA: batched decoding of this hybrid model (it has layers only the \
                 token-by-token path runs, or the GPU lacks int8 tensor cores)"
                    .into(),
            ));
        }
        // Prompts and single rows move the single path's position counter and scratch.
        st.device_pos = None;
        if st.batch.is_none() {
            let stride = 2 * (self.hy.n_linear() + self.hy.n_full());
            st.batch = Some(HybridBatch::new(&st.gpu, c.vocab, self.max_seqs, stride)?);
        }
        self.attach_slots(st, seqs)?;
        let mut out: Vec<RowLogits> = vec![RowLogits::Full(Vec::new()); seqs.len()];
        let (rows, row_of) = batch_rows::split_rows(seqs, want_top);
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.tokens.len() != 1) {
            let slot = s.cache.device_slot().expect("attached above").index();
            let pos = s.cache.len();
            out[i] = RowLogits::Full(self.slot_prompt(st, slot, s.tokens, pos, s.logits)?);
        }
        if !rows.is_empty() {
            let logits = if rows.len() <= single_rows_max() {
                let mut v = Vec::new();
                for row in &rows {
                    v.push(self.decode_row_single(st, row, k)?);
                }
                v
            } else {
                self.decode_rows(st, &rows, k)?
            };
            for (l, i) in logits.into_iter().zip(row_of) {
                out[i] = l;
            }
        }
        let batch = st.batch.as_mut().expect("created above");
        for s in seqs.iter_mut() {
            let slot = s.cache.device_slot().expect("attached above").index();
            batch.slot_mut(slot).len = Some(s.cache.len() + s.tokens.len());
            s.cache.advance(s.tokens.len());
        }
        Ok(out)
    }

    /// Gives every sequence a slot of this model (allocated on its first use) and checks the
    /// slot's state stands where the sequence continues; a sequence at position 0 starts from
    /// a zeroed state. Each slot's state is marked unknown until the call succeeds.
    fn attach_slots(&self, st: &mut State, seqs: &mut [BatchSeq<'_>]) -> Result<()> {
        let (c, hy) = (&self.config, &self.hy);
        let batch = st.batch.as_mut().expect("created by the caller");
        for s in seqs.iter_mut() {
            let i = batch_rows::attach(&batch.pool, s.cache, "state")?;
            if batch.slots[i].is_none() {
                batch.slots[i] = Some(Slot {
                    seq: SeqBufs::new(&st.gpu, c, hy, self.ctx)?,
                    len: None,
                });
                batch.enter_slot(&st.gpu, i)?;
            }
            let slot = batch.slot_mut(i);
            let pos = s.cache.len();
            if pos == 0 {
                slot.seq.reset(&st.gpu)?;
            } else if slot.len != Some(pos) {
                return Err(Error::InvalidArgument(format!(
                    "CUDA hybrid: a sequence continues at position {pos}, but its slot's \
                     recurrent state is {} (it cannot be cut back)",
                    slot.len
                        .map_or("unknown after a failed call".to_string(), |n| format!(
                            "at position {n}"
                        ))
                )));
            }
            slot.len = None;
        }
        Ok(())
    }

    /// Swaps slot `slot`'s state with the single path's (the prompt path and the single step
    /// read the single path's `Buffers::seq`).
    fn swap_in(st: &mut State, slot: usize) {
        let batch = st.batch.as_mut().expect("created by forward_batch_rows");
        let s = batch.slots[slot].as_mut().expect("allocated on attach");
        std::mem::swap(&mut st.b.seq, &mut s.seq);
    }

    /// A prompt of `tokens` at `pos0` of the sequence in `slot`: the batched prompt path (or
    /// the token path where it cannot run, or for every row's logits) on the slot's state.
    fn slot_prompt(
        &self,
        st: &mut State,
        slot: usize,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
    ) -> Result<Vec<f32>> {
        Self::swap_in(st, slot);
        let out = self.prompt_on_swapped(st, tokens, pos0, which);
        Self::swap_in(st, slot);
        out
    }

    fn prompt_on_swapped(
        &self,
        st: &mut State,
        tokens: &[u32],
        pos0: usize,
        which: Logits,
    ) -> Result<Vec<f32>> {
        let n = tokens.len();
        self.upload_single(st, tokens, pos0)?;
        let mut out = Vec::new();
        if which == Logits::Last && self.use_prefill(st, n) {
            self.prefill_prompt(st, pos0, n)?;
            out = self.read_logits(st)?;
        } else {
            // Kernel by kernel: the single path's graphs hold its own state's addresses.
            for i in 0..n {
                let want = which == Logits::All || i + 1 == n;
                self.enqueue_step(st, want, pos0 + i + 1)?;
                if want {
                    out.extend(self.read_logits(st)?);
                }
            }
        }
        st.gpu.sync()?;
        Ok(out)
    }

    /// `tokens` into the single path's token buffer at `pos0`, and its position counter.
    fn upload_single(&self, st: &mut State, tokens: &[u32], pos0: usize) -> Result<()> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let s = st.gpu.stream.clone();
        let mut view = st.b.toks.slice_mut(pos0..pos0 + ids.len());
        s.memcpy_htod(&ids, &mut view)
            .map_err(|e| cuda_err("uploading token ids", e))?;
        s.memcpy_htod(&[pos0 as i32, 0], &mut st.b.step)
            .map_err(|e| cuda_err("setting the position", e))
    }

    /// One decode row as the single path's step on the row's slot (its graph captured per
    /// slot): the same kernels as a lone sequence's step.
    fn decode_row_single(&self, st: &mut State, row: &Row, k: usize) -> Result<RowLogits> {
        self.upload_single(st, &[row.token], row.pos)?;
        let have = st
            .batch
            .as_ref()
            .is_some_and(|b| b.single.contains_key(&row.slot));
        if self.use_graph && !have {
            Self::swap_in(st, row.slot);
            // Captured once per slot: the attention's grid covers the whole context.
            let g = StepGraph::capture(&st.gpu.stream, "hybrid slot step", || {
                self.enqueue_step(st, true, self.ctx)
            });
            Self::swap_in(st, row.slot);
            let batch = st.batch.as_mut().expect("created by forward_batch_rows");
            batch.single.insert(row.slot, g?);
        }
        if self.use_graph {
            let batch = st.batch.as_ref().expect("created by forward_batch_rows");
            batch.single[&row.slot].launch("hybrid slot step")?;
        } else {
            Self::swap_in(st, row.slot);
            let r = self.enqueue_step(st, true, row.pos + 1);
            Self::swap_in(st, row.slot);
            r?;
        }
        let vocab = self.config.vocab;
        if row.want_top && topk::supported(k, vocab) {
            let logits = ptr(&st.b.logits, &st.gpu.stream);
            if let Some(t) = topk::one_row(&mut st.top, &st.gpu, logits, vocab, k)? {
                return Ok(RowLogits::Top(t));
            }
        }
        Ok(RowLogits::Full(self.read_logits(st)?))
    }

    /// One step of `rows` (one token each) as B rows through the GEMMs.
    fn decode_rows(&self, st: &mut State, rows: &[Row], k: usize) -> Result<Vec<RowLogits>> {
        let (n, vocab) = (rows.len(), self.config.vocab);
        let most = self.ensure_rows(st)?;
        if n > most {
            return Err(Error::InvalidArgument(format!(
                "{n} rows for a batched step of at most {most}"
            )));
        }
        {
            let s = st.gpu.stream.clone();
            let up = |what: &str, v: Vec<i32>, dst: &mut CudaSlice<i32>| -> Result<()> {
                let mut view = dst.slice_mut(0..v.len());
                s.memcpy_htod(&v, &mut view).map_err(|e| cuda_err(what, e))
            };
            let toks = rows.iter().map(|r| r.token as i32).collect();
            let batch = st.batch.as_mut().expect("created by forward_batch_rows");
            up("uploading tokens", toks, &mut batch.toks)?;
            let slots = rows.iter().map(|r| r.slot as i32).collect();
            up("uploading slots", slots, &mut batch.row_slot)?;
            let pos = rows.iter().map(|r| r.pos as i32).collect();
            let pb = st.prefill.as_mut().expect("made by ensure_rows");
            up("uploading positions", pos, &mut pb.pos)?;
        }
        if timing() {
            let phases = Phases::new(true);
            self.enqueue_rows(st, n, &phases)?;
            phases.print(n);
        } else if self.use_graph {
            if !st.batch.as_ref().is_some_and(|b| b.graphs.contains_key(&n)) {
                let g = StepGraph::capture(&st.gpu.stream, "hybrid batched step", || {
                    self.enqueue_rows(st, n, &Phases::new(false))
                })?;
                let batch = st.batch.as_mut().expect("created by forward_batch_rows");
                batch.graphs.insert(n, g);
            }
            let batch = st.batch.as_ref().expect("created by forward_batch_rows");
            batch.graphs[&n].launch("hybrid batched step")?;
        } else {
            self.enqueue_rows(st, n, &Phases::new(false))?;
        }
        let batch = st.batch.as_mut().expect("created by forward_batch_rows");
        let (logits, host) = (&batch.logits, &mut batch.host_logits);
        batch_rows::gather(&st.gpu, logits, host, &mut batch.top, rows, k, vocab)
    }

    /// Enqueues the batched step of `n` rows (tokens in the batch's `toks`, positions in the
    /// chunk's `pos`, slots in `row_slot`), their logits into the batch's `logits`.
    fn enqueue_rows(&self, st: &State, n: usize, t: &Phases) -> Result<()> {
        let (c, hy, g, s) = (&self.config, &self.hy, &st.gpu, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("made by ensure_rows");
        let batch = st.batch.as_ref().expect("created by forward_batch_rows");
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let nq = c.n_heads * c.head_dim;
        let (vw, dn_row) = (hy.value_width(), hy.conv_dim() + hy.value_width());
        let (pos, tab, row_slot) = (ptr(&pb.pos, s), ptr(&batch.tab, s), ptr(&batch.row_slot, s));
        let stride = Arg::I32(batch.stride as i32);
        self.embed_rows(st, ptr(&batch.toks, s), ptr(&batch.zero, s), n)?;
        t.mark(st, "embedding")?;
        for layer in &st.w.layers {
            match &layer.mixer {
                DevMixer::Linear(m) => {
                    self.norm_rows(st, &layer.attn_norm, m.rot_in, n)?;
                    t.mark(st, "norms")?;
                    self.rows_gemm(st, &m.qkvz, n, p(&pb.proj), false)?;
                    t.mark(st, "GEMM q/k/v/z")?;
                    let DevMatrix::Dense { w: ab, .. } = &m.ab else {
                        unreachable!("batchable checked one_kernel_mixer: dense a/b rows")
                    };
                    g.launch(
                        "deltanet_step_slots",
                        (hy.v_heads as u32, n as u32),
                        512,
                        &[
                            Arg::Ptr(p(&pb.x)),
                            Arg::Ptr(p(&layer.attn_norm)),
                            Arg::F32(c.norm_eps),
                            Arg::I32(c.hidden as i32),
                            Arg::Ptr(p(ab)),
                            Arg::Ptr(p(&pb.proj)),
                            Arg::I32(dn_row as i32),
                            Arg::Ptr(tab),
                            stride,
                            Arg::I32(2 * m.slot as i32),
                            Arg::Ptr(row_slot),
                            Arg::Ptr(p(&m.conv)),
                            Arg::I32(hy.conv_kernel as i32),
                            Arg::Ptr(pos),
                            Arg::Ptr(p(&m.a_neg)),
                            Arg::Ptr(p(&m.dt_bias)),
                            Arg::I32(hy.k_heads as i32),
                            Arg::I32(hy.k_dim as i32),
                            Arg::I32(hy.v_dim as i32),
                            Arg::I32(hy.v_tiled as i32),
                            Arg::Ptr(p(&m.norm)),
                            Arg::I32(st.w.regroup as i32),
                            Arg::Ptr(p(&pb.mixed)),
                        ],
                    )?;
                    t.mark(st, "DeltaNet steps")?;
                    self.quantize_rows(st, p(&pb.mixed), vw, m.rot_out, n)?;
                    t.mark(st, "norms")?;
                    self.rows_gemm(st, &m.out, n, p(&pb.x), true)?;
                    t.mark(st, "GEMM out/o")?;
                }
                DevMixer::Full(m) => {
                    self.norm_rows(st, &layer.attn_norm, m.rot_in, n)?;
                    t.mark(st, "norms")?;
                    self.rows_gemm(st, &m.qkv, n, p(&pb.proj), false)?;
                    t.mark(st, "GEMM q/k/v/z")?;
                    let at = Arg::I32((2 * (hy.n_linear() + m.slot)) as i32);
                    self.attention_slots(st, m, n, at)?;
                    t.mark(st, "attention")?;
                    self.quantize_rows(st, p(&pb.mixed), nq, m.rot_out, n)?;
                    t.mark(st, "norms")?;
                    self.rows_gemm(st, &m.o, n, p(&pb.x), true)?;
                    t.mark(st, "GEMM out/o")?;
                }
            }
            self.mlp_rows(st, layer, n, true)?;
            t.mark(st, "MLP")?;
        }
        let head = st.w.head();
        let logits = ptr(&batch.logits, s);
        if !head.is_dense() && !head_per_row() {
            self.norm_rows(st, &st.w.final_norm, st.w.rot_head, n)?;
            self.rows_gemm(st, head, n, logits, false)?;
            return t.mark(st, "head");
        }
        for r in 0..n {
            let x = p(&pb.x) + (4 * r * c.hidden) as u64;
            self.enqueue_head_at(st, x, logits + (4 * r * c.vocab) as u64)?;
        }
        t.mark(st, "head")
    }

    /// The gated attention of the step's `n` rows: `hybrid_attn_step*_slots` where
    /// `CudaOptions::hybrid_attn_slots` asks for it, else `hybrid_attn_prep_slots` +
    /// `hybrid_attn_decode_slots`; `at`: the layer's caches' place in the slot table.
    fn attention_slots(&self, st: &State, m: &DevFullAttention, n: usize, at: Arg) -> Result<()> {
        let (c, hy, g, s) = (&self.config, &self.hy, &st.gpu, &st.gpu.stream);
        let pb = st.prefill.as_ref().expect("made by ensure_rows");
        let batch = st.batch.as_ref().expect("created by forward_batch_rows");
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let (nq, nh, nkv, hd) = (c.n_heads * c.head_dim, c.n_heads, c.n_kv_heads, c.head_dim);
        let qkv_row = Arg::I32((2 * nq + 2 * nkv * hd) as i32);
        let (pos, tab, row_slot) = (ptr(&pb.pos, s), ptr(&batch.tab, s), ptr(&batch.row_slot, s));
        let (stride, rot) = (
            Arg::I32(batch.stride as i32),
            Arg::I32(hy.rotary_dim as i32),
        );
        let scale = Arg::F32(1.0 / (hd as f32).sqrt());
        let first = self.attn_lead_args(st, m, p(&pb.proj), pos);
        if let Some(kernel) = self.attn_step.and_then(|a| a.slots_kernel) {
            let rest = [rot, Arg::Ptr(tab), stride, at, Arg::Ptr(row_slot), scale];
            let args = [&first[..], &rest, &[Arg::Ptr(p(&pb.mixed)), qkv_row]].concat();
            // DEC_THREADS per block.
            return g.launch(kernel, (nh as u32, n as u32), 256, &args);
        }
        let rest = [
            Arg::I32(hd as i32),
            rot,
            Arg::Ptr(tab),
            stride,
            at,
            Arg::Ptr(row_slot),
        ];
        let out = [Arg::Ptr(p(&pb.q)), Arg::Ptr(p(&pb.gate)), qkv_row];
        g.launch(
            "hybrid_attn_prep_slots",
            ((nh + nkv) as u32, n as u32),
            hd as u32,
            &[&first[..], &rest, &out].concat(),
        )?;
        g.launch(
            "hybrid_attn_decode_slots",
            (nh as u32, n as u32),
            256, // HA_WARPS warps
            &[
                Arg::Ptr(p(&pb.q)),
                Arg::Ptr(p(&pb.gate)),
                Arg::Ptr(tab),
                stride,
                at,
                Arg::Ptr(row_slot),
                Arg::Ptr(pos),
                Arg::I32(nh as i32),
                Arg::I32(nkv as i32),
                Arg::I32(hd as i32),
                scale,
                Arg::Ptr(p(&pb.mixed)),
            ],
        )?;
        Ok(())
    }
}

impl CudaHybrid {
    /// `y (+)= m · rows` over the step's `n` int8 rows: the dense batched step's small-batch
    /// GEMM (split-K where its tiles do not fill the GPU), or with TRIT_CUDA_BATCH_GEMM=prefill
    /// the prompt path's.
    pub(super) fn rows_gemm(
        &self,
        st: &State,
        m: &DevMatrix,
        n: usize,
        y: u64,
        acc: bool,
    ) -> Result<()> {
        if !use_small_gemm() {
            return self.gemm(st, m, n, y, acc);
        }
        let s = &st.gpu.stream;
        let pb = st.prefill.as_ref().expect("made by ensure_rows");
        let batch = st.batch.as_ref().expect("created by forward_batch_rows");
        let args = m.ternary_args(s).expect("batchable checked: ternary");
        let (q, meta) = (ptr(&pb.xq, s), ptr(&pb.xm, s));
        let kernel = SmallGemm::from_env();
        launch_small_gemm(&st.gpu, kernel, &args, n, q, meta, y, acc, &batch.split)
    }
}

/// TRIT_CUDA_HEAD_PER_ROW=1: the batched step's LM head as one GEMV per row even where it is
/// ternary (what a dense head always takes; for tests).
fn head_per_row() -> bool {
    std::env::var("TRIT_CUDA_HEAD_PER_ROW").is_ok_and(|v| v == "1")
}

/// TRIT_CUDA_BATCH_TIMING=1: the batched step runs kernel by kernel, synchronizing after each
/// group of kernels, and prints where its time went (for looking, not for measuring totals).
fn timing() -> bool {
    // Read once: this is asked on every batched step.
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRIT_CUDA_BATCH_TIMING").is_ok_and(|v| v == "1"))
}

/// Time per group of kernels of one step (`timing`).
struct Phases {
    on: bool,
    last: Cell<Instant>,
    spent: RefCell<Vec<(&'static str, f64)>>,
}

impl Phases {
    fn new(on: bool) -> Phases {
        Phases {
            on,
            last: Cell::new(Instant::now()),
            spent: RefCell::new(Vec::new()),
        }
    }

    /// Waits for the GPU and books the time since the last mark under `what`.
    fn mark(&self, st: &State, what: &'static str) -> Result<()> {
        if !self.on {
            return Ok(());
        }
        st.gpu.sync()?;
        let now = Instant::now();
        let ms = 1e3 * (now - self.last.replace(now)).as_secs_f64();
        let mut spent = self.spent.borrow_mut();
        match spent.iter_mut().find(|(w, _)| *w == what) {
            Some((_, t)) => *t += ms,
            None => spent.push((what, ms)),
        }
        Ok(())
    }

    fn print(&self, rows: usize) {
        let spent = self.spent.borrow();
        let total: f64 = spent.iter().map(|(_, t)| t).sum();
        let parts: Vec<String> = spent.iter().map(|(w, t)| format!("{w} {t:.3}")).collect();
        eprintln!(
            "hybrid batched step, {rows} rows, {total:.3} ms: {}",
            parts.join(", ")
        );
    }
}
