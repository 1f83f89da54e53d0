//! Batched decoding: several sequences in one forward pass, for the server's continuous
//! batching. Each sequence's keys and values live in a GPU *slot* (f16 caches of every layer
//! for the model's full context), owned by its `KvCache` through a
//! [`DeviceSlot`](trit::model::device_slot::DeviceSlot) that returns the slot when the cache
//! is dropped. Slot memory is allocated when a slot is first used and kept for reuse, so memory
//! follows the concurrency actually reached, up to `max_seqs` slots.
//!
//! One `forward_batch` call: the prompt rows of each sequence go through the batched prefill
//! (`prefill.rs`) writing into that sequence's slot; then every sequence that feeds one token
//! runs as ONE step — B embedding rows, batched RMSNorm + int8 quantization, a tensor-core
//! GEMM over the B token rows (every weight read once for all; `batch_gemm.rs`), RoPE + KV
//! append at each row's (slot, position), attention of each row over its own slot
//! (`kernels/batch.cu`), and the LM head for the B rows, replayed from a CUDA graph per batch
//! size. One or two decoding rows instead replay the single-sequence step on their slots
//! (`decode_row_single`): for so few rows the GEMV kernels are faster than the GEMM tiles.

use crate::batch_gemm::{launch_small_gemm, SmallGemm, SplitScratch};
use crate::batch_rows::{self, Row};
use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::graph::{alloc_host_logits, StepGraph};
use crate::launch;
use crate::model::{CudaModel, Head, Input, State, StepKind};
use crate::prefill::KvTarget;
use crate::topk::{self, TopBuffers};
use crate::weights::DevMatrix;
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use std::collections::HashMap;
use std::time::Instant;
use trit::format::config::{ModelConfig, RopeStyle};
use trit::model::device_slot::SlotPool;
use trit::model::{BatchSeq, KvCache, Logits};
use trit::sample::RowLogits;
use trit::{Error, Result};

/// Sequences one batched call carries at most, unless TRIT_CUDA_MAX_SEQS says otherwise: one
/// GEMM token tile (64 rows), so a step's matrix products read the weights once.
const DEFAULT_MAX_SEQS: usize = 64;

/// Whether decode steps replay a CUDA graph per batch size (TRIT_CUDA_BATCH_GRAPH=0: launch
/// kernel by kernel).
fn use_graph() -> bool {
    std::env::var("TRIT_CUDA_BATCH_GRAPH").map_or(true, |v| v != "0")
}

/// Most decoding rows a step runs as single-path steps, one after another, each on its slot
/// (TRIT_CUDA_BATCH_SINGLE=N; 0: always the batched kernels). H200, 8B: the batched kernels
/// take ~3.2 ms for 1, 2 or 4 rows, the single path 1.37 ms per row, so a server with one or
/// two clients decodes at the single path's speed (B=1: 314 → 728 tok/s).
pub(crate) fn single_rows_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("TRIT_CUDA_BATCH_SINGLE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2)
    })
}

/// Ternary GEMM of the decode step: the small-batch kernel (`SmallGemm::from_env`: the ring
/// variant; =wide, =plain the earlier ones), or with TRIT_CUDA_BATCH_GEMM=prefill the
/// prefill's (for comparison).
pub(crate) fn use_small_gemm() -> bool {
    std::env::var("TRIT_CUDA_BATCH_GEMM").map_or(true, |v| v != "prefill")
}

/// GPU memory kept free beside the slots of a model just loaded: the batched step's
/// activations and logits, the prompt path's chunk buffers (~150 MB for the 27B shape at 512
/// tokens), captured graphs and the driver's own.
const SLOT_RESERVE: usize = 2 << 30;

/// `max_seqs` of a model just loaded whose slots take `per_slot` bytes each:
/// TRIT_CUDA_MAX_SEQS when set, else as many as the GPU's free memory holds (`slots_that_fit`):
/// slots are allocated as sequences first use them, and one that could not be would fail
/// every sequence of that step.
pub(crate) fn max_seqs_for(gpu: &Gpu, per_slot: usize) -> usize {
    let set = std::env::var("TRIT_CUDA_MAX_SEQS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n >= 1);
    set.unwrap_or_else(|| {
        let free = gpu.ctx.mem_get_info().map_or(usize::MAX, |(free, _)| free);
        slots_that_fit(free, per_slot)
    })
}

/// Slots of `per_slot` bytes that `free` bytes hold beside `SLOT_RESERVE`: at least 1 (the
/// single path's), at most `DEFAULT_MAX_SEQS`.
pub(crate) fn slots_that_fit(free: usize, per_slot: usize) -> usize {
    (free.saturating_sub(SLOT_RESERVE) / per_slot.max(1)).clamp(1, DEFAULT_MAX_SEQS)
}

/// Keys and values of one slot: per layer `[kv_head][ctx][head_dim]` f16.
struct SlotKv {
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

/// Activations of one batched decode step, `rows` rows each.
struct RowBuffers {
    toks: CudaSlice<i32>,
    /// Always {0, 0}: the embedding kernel reads `toks[step[0] + row]`.
    step: CudaSlice<i32>,
    row_pos: CudaSlice<i32>,
    row_slot: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    xq: CudaSlice<i8>,
    xm: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    qr: CudaSlice<f32>,
    att: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    h: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    host_logits: PinnedHostSlice<f32>,
}

/// The batched path's GPU state (inside the model's `State`, under its mutex).
pub(crate) struct BatchState {
    slots: SlotPool,
    kv: Vec<Option<SlotKv>>,
    /// `[slot][layer][keys, values]` device addresses (0 for a slot not allocated yet).
    tab: CudaSlice<u64>,
    tab_host: Vec<u64>,
    bufs: RowBuffers,
    /// The rows' best candidates (`forward_batch_top`), on the device and on the host.
    top: TopBuffers,
    /// Partial tiles of the split-K GEMMs.
    split: SplitScratch,
    /// Decode steps captured per number of rows (the row count is a launch argument; the
    /// tokens, positions, slots and slot table are read from device memory, so one graph
    /// serves every step of that size).
    graphs: HashMap<usize, StepGraph>,
    /// The single path's decode step (with the LM head) captured per slot, whose cache
    /// addresses it holds, and per kind (`CudaModel::short_step`): a step of one row runs it
    /// (`decode_row_single`).
    single: HashMap<(usize, StepKind), StepGraph>,
}

impl BatchState {
    fn new(gpu: &Gpu, c: &ModelConfig, max_seqs: usize) -> Result<BatchState> {
        let (d, hd) = (c.hidden, c.head_dim);
        let (nq, nkv) = (c.n_heads * hd, c.n_kv_heads * hd);
        let widest = d.max(nq).max(c.ffn);
        let n = max_seqs;
        let tab_host = vec![0u64; max_seqs * c.n_layers * 2];
        Ok(BatchState {
            slots: SlotPool::new(max_seqs),
            kv: (0..max_seqs).map(|_| None).collect(),
            tab: gpu.upload(&tab_host)?,
            tab_host,
            graphs: HashMap::new(),
            single: HashMap::new(),
            top: TopBuffers::new(gpu, max_seqs)?,
            split: SplitScratch::new(gpu)?,
            bufs: RowBuffers {
                toks: gpu.zeros(n)?,
                step: gpu.zeros(2)?,
                row_pos: gpu.zeros(n)?,
                row_slot: gpu.zeros(n)?,
                x: gpu.zeros(n * d)?,
                xn: gpu.zeros(n * d)?,
                xq: gpu.zeros(n * widest)?,
                xm: gpu.zeros(n * (2 * widest / 64 + 2))?,
                qkv: gpu.zeros(n * (nq + 2 * nkv))?,
                qr: gpu.zeros(n * nq)?,
                att: gpu.zeros(n * nq)?,
                gu: gpu.zeros(n * 2 * c.ffn)?,
                h: gpu.zeros(n * c.ffn)?,
                logits: gpu.zeros(n * c.vocab)?,
                host_logits: alloc_host_logits(gpu, n * c.vocab)?,
            },
        })
    }

    /// Allocates the caches of `slot` if this is its first use, and enters them in the table.
    fn ensure_slot(&mut self, gpu: &Gpu, c: &ModelConfig, ctx: usize, slot: usize) -> Result<()> {
        if self.kv[slot].is_some() {
            return Ok(());
        }
        let n = c.n_kv_heads * c.head_dim * ctx;
        let alloc =
            || -> Result<Vec<CudaSlice<u16>>> { (0..c.n_layers).map(|_| gpu.zeros(n)).collect() };
        let kv = SlotKv {
            k: alloc()?,
            v: alloc()?,
        };
        let s = &gpu.stream;
        for li in 0..c.n_layers {
            let at = (slot * c.n_layers + li) * 2;
            self.tab_host[at] = ptr(&kv.k[li], s);
            self.tab_host[at + 1] = ptr(&kv.v[li], s);
        }
        s.memcpy_htod(&self.tab_host, &mut self.tab)
            .map_err(|e| cuda_err("uploading the slot table", e))?;
        self.kv[slot] = Some(kv);
        Ok(())
    }

    /// Whether `slot` is one of this batch's (a cache may own a slot of another model's).
    pub(crate) fn owns(&self, slot: &trit::model::device_slot::DeviceSlot) -> bool {
        self.slots.owns(slot) && self.kv.get(slot.index()).is_some_and(|k| k.is_some())
    }

    /// Per layer, the addresses of `slot`'s keys and values (as `CudaModel::own_kv`).
    pub(crate) fn slot_kv(
        &self,
        gpu: &Gpu,
        slot: &trit::model::device_slot::DeviceSlot,
        ctx: usize,
    ) -> Vec<(u64, u64)> {
        let t = self.target(gpu, slot.index(), ctx);
        t.k.into_iter().zip(t.v).collect()
    }

    fn target(&self, gpu: &Gpu, slot: usize, ctx: usize) -> KvTarget {
        let kv = self.kv[slot].as_ref().expect("allocated by ensure_slot");
        let s = &gpu.stream;
        KvTarget {
            k: kv.k.iter().map(|c| ptr(c, s)).collect(),
            v: kv.v.iter().map(|c| ptr(c, s)).collect(),
            ctx,
        }
    }
}

impl CudaModel {
    /// `ExternalNet::copy_prefix`: a free slot for `dst` (a new, empty cache) holding the first
    /// `n` positions of `src`'s slot — per layer and kv head, `n · head_dim` keys and as many
    /// values copied device to device. False where there is nothing to copy from (no batched
    /// slot of this model), or no slot is free.
    pub(crate) fn copy_prefix_gpu(
        &self,
        src: &KvCache,
        dst: &mut KvCache,
        n: usize,
    ) -> Result<bool> {
        let Some(from) = src.device_slot() else {
            return Ok(false);
        };
        if dst.device_slot().is_some() || !dst.is_empty() || n == 0 || n > src.len() {
            return Ok(false);
        }
        let mut guard = self.state.lock().map_err(|_| crate::model::poisoned())?;
        let st: &mut State = &mut guard;
        let Some(batch) = st.batch.as_mut() else {
            return Ok(false);
        };
        if !batch.slots.owns(from) {
            return Ok(false);
        }
        let Some(slot) = batch.slots.take() else {
            return Ok(false);
        };
        let c = &self.config;
        batch.ensure_slot(&st.gpu, c, self.ctx, slot.index())?;
        let (a, b) = (from.index(), slot.index());
        // Two distinct slots of the same table: one borrowed to read, the other to write.
        let (lo, hi) = batch.kv.split_at_mut(a.max(b));
        let (src_kv, dst_kv) = if a < b {
            (&lo[a], &mut hi[0])
        } else {
            (&hi[0], &mut lo[b])
        };
        let (Some(src_kv), Some(dst_kv)) = (src_kv.as_ref(), dst_kv.as_mut()) else {
            return Err(Error::InvalidArgument(
                "a batched slot without its caches".into(),
            ));
        };
        let (hd, ctx, s) = (c.head_dim, self.ctx, &st.gpu.stream);
        for li in 0..c.n_layers {
            for kvh in 0..c.n_kv_heads {
                let span = kvh * ctx * hd..kvh * ctx * hd + n * hd;
                for (from, to) in [
                    (&src_kv.k[li], &mut dst_kv.k[li]),
                    (&src_kv.v[li], &mut dst_kv.v[li]),
                ] {
                    let mut view = to.slice_mut(span.clone());
                    s.memcpy_dtod(&from.slice(span.clone()), &mut view)
                        .map_err(|e| cuda_err("copying a cached prefix between slots", e))?;
                }
            }
        }
        dst.set_device_slot(slot);
        dst.advance(n);
        Ok(true)
    }
}

impl CudaModel {
    /// Slots that sequences may own at once (= the most sequences per batched call).
    pub fn max_sequences(&self) -> usize {
        self.max_seqs
    }

    /// Sets the number of slots (before the first batched call, which allocates them; at
    /// least 1). The default: TRIT_CUDA_MAX_SEQS, else as many as the GPU's free memory
    /// held after loading (`max_seqs_for`), at most 64.
    pub fn with_max_sequences(mut self, n: usize) -> Self {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.batch.is_none() {
            self.max_seqs = n.max(1);
        }
        self
    }

    /// Slots not owned by any cache (all of them before the first batched call).
    pub fn free_slots(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.batch
            .as_ref()
            .map_or(self.max_seqs, |b| b.slots.free_count())
    }

    /// `ExternalNet::forward_batch` on the GPU (see the module documentation).
    pub(crate) fn forward_batch_gpu(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(batch_rows::full_rows(self.forward_batch_rows(
            seqs,
            0,
            &[],
        )?))
    }

    /// `ExternalNet::forward_batch_top` on the GPU: decode rows with `want_top` set come back
    /// as their `k` best candidates (reduced on the device, `topk.rs`) unless their
    /// normalizer is not finite; every other row in full. An empty `want_top`: all in full.
    pub(crate) fn forward_batch_rows(
        &self,
        seqs: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<RowLogits>> {
        let c = &self.config;
        batch_rows::check_seqs(seqs, want_top, c.vocab, self.ctx)?;
        let mut guard = self
            .state
            .lock()
            .map_err(|_| Error::Unsupported("CUDA: an earlier step panicked".into()))?;
        let st: &mut State = &mut guard;
        if st.gpu.compute_capability.0 < 8 {
            return Err(Error::Unsupported(
                "CUDA: batched decoding needs int8 tensor cores (compute capability 8.0+)".into(),
            ));
        }
        // The prefill below moves the single-sequence position counter.
        st.device_pos = None;
        if st.batch.is_none() {
            st.batch = Some(BatchState::new(&st.gpu, c, self.max_seqs)?);
        }
        // Every sequence gets (or already owns) a slot of this model.
        for s in seqs.iter_mut() {
            let batch = st.batch.as_mut().expect("created above");
            let slot = batch_rows::attach(&batch.slots, s.cache, "keys/values")?;
            batch.ensure_slot(&st.gpu, c, self.ctx, slot)?;
        }
        let mut out: Vec<RowLogits> = vec![RowLogits::Full(Vec::new()); seqs.len()];
        let (rows, row_of) = batch_rows::split_rows(seqs, want_top);
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.tokens.len() != 1) {
            let slot = s.cache.device_slot().expect("attached above").index();
            let pos = s.cache.len();
            // A prompt: the batched prefill, keys/values into the slot.
            let ids: Vec<i32> = s.tokens.iter().map(|&t| t as i32).collect();
            {
                let stream = st.gpu.stream.clone();
                let mut view = st.b.toks.slice_mut(pos..pos + ids.len());
                stream
                    .memcpy_htod(&ids, &mut view)
                    .map_err(|e| cuda_err("uploading token ids", e))?;
            }
            let kv = st
                .batch
                .as_ref()
                .expect("created above")
                .target(&st.gpu, slot, self.ctx);
            out[i] = RowLogits::Full(self.prefill_into(st, s.tokens, pos, s.logits, &kv)?);
        }
        if !rows.is_empty() {
            let logits = self.decode_rows(st, &rows, k)?;
            for (l, i) in logits.into_iter().zip(row_of) {
                out[i] = l;
            }
        }
        for s in seqs.iter_mut() {
            s.cache.advance(s.tokens.len());
        }
        // `Logits::All` of a one-token feed is its one row, like `Last`.
        debug_assert!(seqs.iter().zip(&out).all(|(s, o)| match o {
            RowLogits::Full(o) =>
                o.len() % c.vocab == 0 && (s.logits == Logits::All || o.len() == c.vocab),
            RowLogits::Top(t) => s.tokens.len() == 1 && t.len() == k,
        }));
        Ok(out)
    }

    /// One decode step for `rows` (one token each); returns each row's logits, or its `k`
    /// best candidates where the row asks for them. With TRIT_CUDA_BATCH_TIMING=1 it prints
    /// where the step's time goes (synchronizing between the phases, so for looking only, not
    /// for measuring the total).
    fn decode_rows(&self, st: &mut State, rows: &[Row], k: usize) -> Result<Vec<RowLogits>> {
        let c = &self.config;
        let n = rows.len();
        if n <= single_rows_max() {
            return rows
                .iter()
                .map(|row| self.decode_row_single(st, row, k))
                .collect();
        }
        let timing = std::env::var("TRIT_CUDA_BATCH_TIMING").is_ok_and(|v| v == "1");
        let t0 = Instant::now();
        {
            let b = &mut st
                .batch
                .as_mut()
                .expect("created by forward_batch_gpu")
                .bufs;
            let s = st.gpu.stream.clone();
            let up = |what: &str, v: Vec<i32>, dst: &mut CudaSlice<i32>| -> Result<()> {
                let mut view = dst.slice_mut(0..v.len());
                s.memcpy_htod(&v, &mut view).map_err(|e| cuda_err(what, e))
            };
            up(
                "uploading tokens",
                rows.iter().map(|r| r.token as i32).collect(),
                &mut b.toks,
            )?;
            up(
                "uploading positions",
                rows.iter().map(|r| r.pos as i32).collect(),
                &mut b.row_pos,
            )?;
            up(
                "uploading slots",
                rows.iter().map(|r| r.slot as i32).collect(),
                &mut b.row_slot,
            )?;
        }
        if timing {
            st.gpu.sync()?;
        }
        let t1 = Instant::now();
        self.run_rows(st, n)?;
        let t2 = Instant::now();
        if timing {
            st.gpu.sync()?;
        }
        let t3 = Instant::now();
        let batch = st.batch.as_mut().expect("created by forward_batch_gpu");
        let b = &mut batch.bufs;
        let out = batch_rows::gather(
            &st.gpu,
            &b.logits,
            &mut b.host_logits,
            &mut batch.top,
            rows,
            k,
            c.vocab,
        )?;
        if timing {
            let ms = |a: Instant, b: Instant| 1e3 * (b - a).as_secs_f64();
            eprintln!(
                "batched step, {n} rows: uploads {:.3} ms, enqueue {:.3} ms, GPU {:.3} ms, \
                 rows to host (candidates and full) {:.3} ms",
                ms(t0, t1),
                ms(t1, t2),
                ms(t2, t3),
                ms(t3, Instant::now())
            );
        }
        Ok(out)
    }

    /// One decode row as the single path's step (its graph, captured per slot) over the row's
    /// slot: the GEMV kernels read each weight once for one row, where the batched GEMM's
    /// tiles cost more than twice as long (up to `single_rows_max` rows). The same kernels as
    /// a lone sequence's step, so the row's logits equal what the single path gives for the
    /// same cache.
    fn decode_row_single(&self, st: &mut State, row: &Row, k: usize) -> Result<RowLogits> {
        let batch = st.batch.as_ref().expect("created by forward_batch_gpu");
        // The kernels the single path takes at this position, so the row's logits are its.
        let key = (row.slot, self.step_kind(row.pos));
        // The slot's cache addresses, only where a step is recorded or enqueued from them.
        let kv = (!self.use_graph || !batch.single.contains_key(&key)).then(|| {
            let t = batch.target(&st.gpu, row.slot, self.ctx);
            t.k.into_iter().zip(t.v).collect::<Vec<(u64, u64)>>()
        });
        // The position counter belongs to no sequence now (forward_batch_rows cleared it),
        // so this uploads it too; after the step it is this slot's, so it stays unclaimed.
        self.upload_inputs(st, &[row.token], row.pos)?;
        match (self.use_graph, kv) {
            (true, Some(kv)) => {
                let graph = self.capture(st, Head::Device, &kv, key.1)?;
                graph.launch("decode")?;
                let batch = st.batch.as_mut().expect("created by forward_batch_gpu");
                batch.single.insert(key, graph);
            }
            (true, None) => {
                let batch = st.batch.as_ref().expect("created by forward_batch_gpu");
                batch.single[&key].launch("decode")?;
            }
            (false, kv) => {
                self.enqueue_step(st, Head::Device, &kv.expect("made without a graph"), key.1)?
            }
        }
        st.device_pos = None;
        let vocab = self.config.vocab;
        if row.want_top && topk::supported(k, vocab) {
            let logits = ptr(&st.b.logits, &st.gpu.stream);
            if let Some(t) = topk::one_row(&mut st.top, &st.gpu, logits, vocab, k)? {
                return Ok(RowLogits::Top(t));
            }
        }
        Ok(RowLogits::Full(self.read_logits(st)?))
    }

    /// Runs the step for `n` rows: its graph (captured on first use), or kernel by kernel.
    fn run_rows(&self, st: &mut State, n: usize) -> Result<()> {
        if !use_graph() {
            return self.enqueue_rows(st, n);
        }
        let captured = st.batch.as_ref().is_some_and(|b| b.graphs.contains_key(&n));
        if !captured {
            let s = st.gpu.stream.clone();
            let graph = StepGraph::capture(&s, "batched decode step", || self.enqueue_rows(st, n))?;
            let batch = st.batch.as_mut().expect("created by forward_batch_gpu");
            batch.graphs.insert(n, graph);
        }
        let batch = st.batch.as_ref().expect("created by forward_batch_gpu");
        batch.graphs[&n].launch("batched decode")
    }

    /// `y (+)= m · rows` for the `n` rows of a decode step: the small-batch GEMM for ternary
    /// matrices, the prefill's per-token product for dense ones.
    fn rows_matmul(
        &self,
        st: &State,
        m: &DevMatrix,
        inp: &Input,
        n: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        match m.ternary_args(&st.gpu.stream) {
            Some(args) if use_small_gemm() => {
                let kernel = SmallGemm::from_env();
                let split = &st.batch.as_ref().expect("made by forward_batch_gpu").split;
                let (q, meta) = (inp.q, inp.meta);
                launch_small_gemm(&st.gpu, kernel, &args, n, q, meta, y, accumulate, split)
            }
            _ => self.matmul(st, m, inp, n, y, accumulate),
        }
    }

    /// Enqueues every layer and the LM head for the first `n` rows of the row buffers.
    fn enqueue_rows(&self, st: &State, n: usize) -> Result<()> {
        let c = &self.config;
        let batch = st.batch.as_ref().expect("created by forward_batch_gpu");
        let (g, b, s) = (&st.gpu, &batch.bufs, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let (d, hd) = (c.hidden, c.head_dim);
        let nq = c.n_heads * hd;
        let (xq, xm) = (ptr(&b.xq, s), p(&b.xm));
        let (row_pos, row_slot, tab) =
            (ptr(&b.row_pos, s), ptr(&b.row_slot, s), ptr(&batch.tab, s));
        let nt = n as u32;
        launch::embed(
            g,
            &st.w.embed,
            ptr(&b.toks, s),
            ptr(&b.step, s),
            p(&b.x),
            nt,
        )?;
        let qout = launch::QuantOut {
            f32: p(&b.xn),
            q: xq,
            meta: xm,
        };
        let norm = |w: &CudaSlice<f32>| -> Result<()> {
            launch::rms_norm_quant(g, p(&b.x), p(w), c.norm_eps, d, qout, nt)
        };
        let normed = Input {
            f32: p(&b.xn),
            q: xq,
            meta: xm,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let attn = attn_rows_kernel(hd);
        for (li, blk) in st.w.blocks.iter().enumerate() {
            norm(&blk.attn_norm)?;
            self.rows_matmul(st, &blk.qkv, &normed, n, p(&b.qkv), false)?;
            let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, p);
            g.launch(
                "rope_append_rows",
                ((c.n_heads + c.n_kv_heads) as u32, nt),
                128,
                &[
                    Arg::Ptr(p(&b.qkv)),
                    Arg::Ptr(opt(&blk.q_norm)),
                    Arg::Ptr(opt(&blk.k_norm)),
                    Arg::F32(c.norm_eps),
                    Arg::Ptr(p(&st.b.cos_sin)),
                    Arg::Ptr(row_pos),
                    Arg::Ptr(row_slot),
                    Arg::Ptr(tab),
                    Arg::I32(li as i32),
                    Arg::I32(c.n_layers as i32),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(c.n_kv_heads as i32),
                    Arg::I32(hd as i32),
                    Arg::I32((c.rope_style == RopeStyle::Adjacent) as i32),
                    Arg::I32(self.ctx as i32),
                    Arg::F32(scale),
                    Arg::Ptr(p(&b.qr)),
                ],
            )?;
            g.launch(
                attn,
                (c.n_heads as u32, nt),
                256,
                &[
                    Arg::Ptr(p(&b.qr)),
                    Arg::Ptr(row_pos),
                    Arg::Ptr(row_slot),
                    Arg::Ptr(tab),
                    Arg::I32(li as i32),
                    Arg::I32(c.n_layers as i32),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(c.n_kv_heads as i32),
                    Arg::I32(self.ctx as i32),
                    Arg::Ptr(p(&b.att)),
                ],
            )?;
            if nq.is_multiple_of(64) {
                // The rows are contiguous, so their blocks are one flat vector.
                launch::quantize_vec(g, p(&b.att), n * nq, xq, xm)?;
            }
            if let Some(w) = &blk.attn_sub_norm {
                let dense = blk.o.is_dense();
                launch::sub_norm_quant(g, p(&b.att), p(w), c.norm_eps, nq, (xq, xm), nt, dense)?;
            }
            let att_in = Input {
                f32: p(&b.att),
                q: xq,
                meta: xm,
            };
            self.rows_matmul(st, &blk.o, &att_in, n, p(&b.x), true)?;
            norm(&blk.ffn_norm)?;
            self.rows_matmul(st, &blk.gate_up, &normed, n, p(&b.gu), false)?;
            let h_out = launch::QuantOut {
                f32: p(&b.h),
                q: xq,
                meta: xm,
            };
            launch::glu_quant(g, p(&b.gu), c.ffn, c.ffn_act, h_out, nt)?;
            if let Some(w) = &blk.ffn_sub_norm {
                let dense = blk.down.is_dense();
                launch::sub_norm_quant(g, p(&b.h), p(w), c.norm_eps, c.ffn, (xq, xm), nt, dense)?;
            }
            let h_in = Input {
                f32: p(&b.h),
                q: xq,
                meta: xm,
            };
            self.rows_matmul(st, &blk.down, &h_in, n, p(&b.x), true)?;
        }
        norm(&st.w.final_norm)?;
        self.rows_matmul(st, st.w.head(), &normed, n, p(&b.logits), false)
    }
}

/// The attention kernel for `hd`-wide heads (a multiple of 32 up to 256, checked at load).
fn attn_rows_kernel(hd: usize) -> &'static str {
    const NAMES: [&str; 8] = [
        "attn_rows_e1",
        "attn_rows_e2",
        "attn_rows_e3",
        "attn_rows_e4",
        "attn_rows_e5",
        "attn_rows_e6",
        "attn_rows_e7",
        "attn_rows_e8",
    ];
    NAMES[(hd / 32).clamp(1, 8) - 1]
}

#[cfg(test)]
mod tests {
    use super::slots_that_fit;

    #[test]
    fn slots_are_what_free_memory_holds_beside_the_reserve() {
        let gib = 1usize << 30;
        // 8B shape at 4,096 positions: 576 MiB per slot, 32 of them in 18 GiB.
        let slot = 36 * 2 * 8 * 128 * 4096 * 2;
        assert_eq!(slots_that_fit(20 * gib, slot), 32);
        assert_eq!(slots_that_fit(20 * gib - 1, slot), 31);
        assert_eq!(slots_that_fit(130 * gib, slot), 64);
        // Not even one slot beside the reserve: still the single path's one.
        assert_eq!(slots_that_fit(gib, slot), 1);
        assert_eq!(slots_that_fit(0, 0), 1);
    }
}
