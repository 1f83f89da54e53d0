//! Continuous batching. One thread owns the model and up to `parallel` running sequences.
//! Every step it runs all of them through one batched forward — decoding sequences contribute
//! their last sampled token, new ones a chunk of their prompt — so the weights are read once
//! per step for everybody. Requests join between steps (otherwise they wait in a bounded
//! queue) and leave as soon as they finish or their listener goes away; a listener is asked
//! after every step, prompt chunks included, so a client that leaves is noticed within a step.
//!
//! KV memory is one [`BlockPool`] of fixed-size blocks under a budget. A request is admitted
//! when its worst case (prompt + max_tokens, capped by the context) fits next to the worst
//! cases of the running ones, so a running sequence never runs out of blocks; one that could
//! never fit gets an error. Full blocks are entered into the pool's prefix index as they fill
//! (a finished sequence's partial last block too), and a new prompt maps the cached blocks it
//! starts with instead of computing them, so a multi-turn chat re-sent as full history only
//! computes the new turn.
//!
//! A model on a device backend (the GPU) keeps each sequence's keys/values in one of a fixed
//! number of device slots: at most that many sequences run (`parallel` is capped by
//! [`Model::max_sequences`]; the rest wait in the queue). A cached host block cannot fill a
//! device slot ([`Model::shares_prefixes`]), so prefixes are reused by slot instead: a finished
//! sequence's slot is parked with its tokens, and a prompt starting with at least 16 of them
//! takes it over (`parked_slots.rs`); failing that, a backend that can copy between slots
//! ([`ExternalNet::copy_prefix`](crate::model::ExternalNet::copy_prefix)) copies the longest
//! such prefix a running sequence holds into the new sequence's slot; other prompts are
//! computed in full. A hybrid's slot holds its recurrent state only at its end, so it is taken
//! over only by a prompt that extends the whole parked sequence.
//!
//! A lone decoding sequence on a backend with a device loop (the GPU's dense models) is not
//! stepped token by token: the device picks its next tokens itself, up to 64 per loop, and the
//! loop ends at the next token when another request arrives (`scheduler/device_loop.rs`), so
//! one client decodes at `trit run`'s speed.
//!
//! With a draft model (`SchedulerConfig::draft`, CPU attention-only models) a lone decoding
//! sequence takes speculative steps instead (`scheduler/drafting.rs`); with a context shift
//! (`SchedulerConfig::context_shift`) a sequence that fills the context keeps a window of it and
//! goes on (`scheduler/context_shift.rs`).
//!
//! Hybrid models (Qwen3.5) also need the recurrent state of their Gated DeltaNet layers at the
//! position where reuse starts, and that state exists only where a copy was kept. A finished
//! hybrid sequence registers its blocks and saves two states in the pool
//! ([`BlockPool::save_state`]): one at its *turn start* — the prompt's last `<|im_start|>`, i.e.
//! before the generation prompt (without one, before the prompt's last token) — and one at its
//! end (prompt + reply). A new hybrid prompt resumes from the longest saved state that is an
//! exact prefix of it; otherwise it is computed from the start (attention blocks alone are of
//! no use without the state at the same position). Why the turn start: Qwen3.5's template
//! re-renders an earlier assistant turn as `<|im_start|>assistant\n` + answer, without the
//! `<think>…</think>` block the generation prompt and the reply contained, so a follow-up
//! turn sent as full history diverges right after the previous prompt's last `<|im_start|>`
//! and the end-of-reply state does not match; the turn-start state does, and only the
//! previous reply and the new turn are computed. The end state serves continuations that
//! repeat the reply's tokens exactly (completions, templates that keep past reasoning).

mod context_shift;
mod device_loop;
mod drafting;

pub use drafting::Draft;

use super::block_pool::{common_prefix, BlockPool, BlockStats};
use super::generate::{ContextShift, FinishReason, GenerateOptions};
use super::parked_slots::{ParkedSlots, MIN_REUSE};
use super::sequence::{Decoding, Step, TokenLogprob};
use crate::model::kv_cache::{BlockSource, BLOCK_TOKENS};
use crate::model::recurrent::RecurrentState;
use crate::model::{BatchSeq, KvCache, Logits, Model};
use crate::sample::{RowLogits, TOP_CANDIDATES};
use crate::tokenizer::Tokenizer;
use crate::Error;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Prompt tokens evaluated per step over all sequences, so decoding sequences keep their
/// pace while a long prompt is being read.
const PREFILL_BUDGET: usize = 512;

/// The token that opens a chat turn in ChatML templates (Qwen3.5's).
const TURN_START: &str = "<|im_start|>";

/// Where a hybrid sequence keeps a copy of its recurrent state while reading `prompt`: before
/// the last `turn_start` token (the generation prompt), else before the last prompt token.
/// 0: nowhere.
fn prompt_checkpoint(prompt: &[u32], turn_start: Option<u32>) -> usize {
    let turn = turn_start.and_then(|t| prompt.iter().rposition(|&x| x == t));
    match turn {
        Some(at) if at > 0 => at,
        _ => prompt.len().saturating_sub(1),
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Context size of every sequence, in tokens.
    pub n_ctx: usize,
    /// Sequences decoded together at most.
    pub parallel: usize,
    /// Requests allowed to wait beyond those; more are refused.
    pub max_queue: usize,
    /// Memory for all keys/values: running sequences and cached prefixes (at least one block).
    pub kv_cache_bytes: usize,
    /// llama.cpp's `--context-shift`: a sequence that fills the context keeps its first `keep`
    /// tokens (at most its prompt) and the newer half of the rest, reads them again and goes
    /// on, instead of ending (`scheduler/context_shift.rs`). None: it ends there.
    pub context_shift: Option<ContextShift>,
    /// Speculative decoding for a sequence that runs alone (`scheduler/drafting.rs`; checked
    /// with [`Draft::check`] by the caller).
    pub draft: Option<Draft>,
}

/// One generation request. Validation (context size, parameter ranges) is the caller's job;
/// what still fails here comes back as [`SeqEvent::Error`].
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Report log-probabilities with this many alternatives per token.
    pub top_logprobs: Option<usize>,
    /// Context shift: the prompt tokens this request keeps (llama.cpp's `n_keep`; capped at
    /// the prompt). None: the scheduler's [`SchedulerConfig::context_shift`] keep.
    pub keep: Option<usize>,
    /// Receives the events of the sequence; returning false (listener gone) cancels it.
    pub sink: Box<dyn FnMut(SeqEvent) -> bool + Send>,
}

#[derive(Debug)]
pub enum SeqEvent {
    /// A chunk of the prompt was read: `done` of `total` prompt tokens are in the cache. Also
    /// how the scheduler learns that a listener has gone while there is nothing else to say.
    Prompt {
        done: usize,
        total: usize,
    },
    /// One sampled token (`None`: end of sequence) and the text that became final with it.
    Piece {
        token: Option<u32>,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done(SeqSummary),
    Error(Error),
}

#[derive(Clone, Debug)]
pub struct SeqSummary {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys/values were reused from an earlier request.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
}

/// Counters and gauges for `/metrics` (llama.cpp's set, plus the KV cache).
#[derive(Clone, Debug, Default)]
pub struct SchedulerStats {
    pub prompt_tokens_total: u64,
    pub prompt_seconds_total: f64,
    pub tokens_predicted_total: u64,
    /// Wall time of the steps that produced tokens: tokens / this = aggregate decode speed.
    pub tokens_predicted_seconds_total: f64,
    /// Batched forward calls.
    pub n_decode_total: u64,
    pub requests_processing: usize,
    pub requests_deferred: usize,
    /// Positions held by the running sequences.
    pub kv_tokens: usize,
    /// KV blocks: the budget, in use by sequences, cached for prefix reuse.
    pub kv_blocks: BlockStats,
    /// Prompt tokens served from cached blocks instead of being evaluated.
    pub prompt_tokens_cached_total: u64,
    /// Requests that had cached blocks to reuse.
    pub prefix_hits_total: u64,
    /// Sequences ended because their listener went away.
    pub cancelled_total: u64,
    /// Speculative decoding: tokens the draft proposed, and those the sampler accepted.
    pub draft_tokens_total: u64,
    pub draft_tokens_accepted_total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_queue` requests are already waiting.
    QueueFull,
    /// The scheduler thread is gone.
    Stopped,
}

pub struct Scheduler {
    tx: Sender<SeqRequest>,
    waiting: Arc<AtomicUsize>,
    stats: Arc<Mutex<SchedulerStats>>,
    config: SchedulerConfig,
}

impl Scheduler {
    /// Spawns the scheduler thread (the only failure: the OS refuses a thread).
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: SchedulerConfig,
    ) -> std::io::Result<Self> {
        let turn_start = tokenizer.token_id(TURN_START);
        Self::start_with_turn_start(model, tokenizer, config, turn_start)
    }

    /// As [`start`](Self::start), with the token that opens a chat turn given explicitly
    /// (hybrid models save their recurrent state before its last occurrence in a prompt; see
    /// the module documentation). `start` uses the tokenizer's `<|im_start|>`.
    pub fn start_with_turn_start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: SchedulerConfig,
        turn_start: Option<u32>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let shape = model.new_cache(0);
        let slots = model.max_sequences().max(1);
        let parallel = config.parallel.clamp(1, slots);
        let share_prefixes = model.shares_prefixes();
        let hybrid = model.config().hybrid.is_some();
        let pool = if share_prefixes {
            BlockPool::new(shape.shape(), config.kv_cache_bytes)
        } else {
            // A device backend's keys/values are in its slots, each for the full context: the
            // budget is every slot's worst case, running or parked (counted in positions, no
            // bytes here).
            let per_sequence = BlockPool::blocks_for(config.n_ctx) + 1;
            BlockPool::with_max_blocks(shape.shape(), slots * per_sequence)
        };
        let stats = Arc::new(Mutex::new(SchedulerStats {
            kv_blocks: pool.stats(),
            ..Default::default()
        }));
        let worker = Worker {
            model,
            tokenizer,
            rx,
            queue: VecDeque::new(),
            running: Vec::new(),
            pool,
            reserved_blocks: 0,
            parallel,
            share_prefixes,
            // A hybrid's recurrent state exists only at the end position: its slot can only
            // continue a prompt that extends it whole.
            parked: ParkedSlots::new(slots, slots, hybrid),
            waiting: waiting.clone(),
            stats: stats.clone(),
            n_ctx: config.n_ctx,
            turn_start,
            context_shift: config.context_shift,
            draft: config.draft.clone(),
            draft_session: None,
        };
        std::thread::Builder::new()
            .name("trit-scheduler".into())
            .spawn(move || worker.run())?;
        Ok(Scheduler {
            tx,
            waiting,
            stats,
            config,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a request; its events go to its sink from the scheduler thread.
    pub fn submit(&self, req: SeqRequest) -> Result<(), SubmitError> {
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.config.max_queue + self.config.parallel {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        self.tx.send(req).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }

    pub fn stats(&self) -> SchedulerStats {
        let mut s = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        s.requests_deferred = self.waiting.load(Ordering::SeqCst);
        s
    }
}

struct Running {
    req: SeqRequest,
    decoding: Decoding,
    cache: KvCache,
    /// The tokens whose keys/values `cache` holds.
    tokens: Vec<u32>,
    /// Blocks set aside for this sequence's worst case.
    quota: usize,
    /// Prompt tokens already in the cache (reused or evaluated).
    prompt_done: usize,
    cached_tokens: usize,
    /// The sampled token to feed next step.
    next: Option<u32>,
    started: Instant,
    prompt_secs: f64,
    /// Hybrid models: the prompt position whose recurrent state is kept (0: none), and the
    /// copy once the prompt has been read that far.
    checkpoint_at: usize,
    checkpoint: Option<RecurrentState>,
    /// Where the context fills: shift with this (keep capped at the prompt), or end.
    shift: Option<ContextShift>,
    /// After a shift: the kept tokens not in the cache, then the pending token, read like a
    /// prompt; the last one's logits give the next token.
    refeed: Vec<u32>,
}

impl Running {
    /// Where the sampler sees the sequence's end: the context's, or none when it shifts.
    fn limit(&self, n_ctx: usize) -> usize {
        if self.shift.is_some() {
            usize::MAX
        } else {
            n_ctx
        }
    }
}

struct Worker {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    rx: Receiver<SeqRequest>,
    /// Received but not yet running.
    queue: VecDeque<SeqRequest>,
    running: Vec<Running>,
    pool: Arc<BlockPool>,
    /// Sum of the running sequences' quotas (never above the pool's budget).
    reserved_blocks: usize,
    parallel: usize,
    /// Whether prompts may map cached blocks of earlier requests (not on a device backend).
    share_prefixes: bool,
    /// A device backend's finished sequences, kept with their slots for prefix reuse.
    parked: ParkedSlots,
    /// Submitted and not yet admitted (shared with `submit`).
    waiting: Arc<AtomicUsize>,
    stats: Arc<Mutex<SchedulerStats>>,
    n_ctx: usize,
    turn_start: Option<u32>,
    context_shift: Option<ContextShift>,
    draft: Option<Draft>,
    /// The draft model's session, shared by the sequences that run alone one after another.
    draft_session: Option<super::Session>,
}

impl Worker {
    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.queue.is_empty() {
                match self.rx.recv() {
                    Ok(r) => self.queue.push_back(r),
                    Err(_) => return, // every Scheduler handle is gone
                }
            }
            while let Ok(r) = self.rx.try_recv() {
                self.queue.push_back(r);
            }
            self.admit();
            self.publish(|_| {});
            if !self.running.is_empty() {
                self.step();
            } else if !self.queue.is_empty() {
                // Nothing runs, yet the head of the queue does not fit: cannot happen (a
                // request larger than the whole budget is refused), but never spin on it.
                let mut req = self.queue.pop_front().expect("not empty");
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                (req.sink)(SeqEvent::Error(Error::InvalidArgument(
                    "the KV cache budget cannot hold this request".into(),
                )));
            }
        }
    }

    /// Starts waiting requests in order while there is a free place and their worst case fits.
    fn admit(&mut self) {
        while self.running.len() < self.parallel {
            let Some(head) = self.queue.front() else {
                return;
            };
            let n = head.prompt.len();
            let worst = n.saturating_add(head.options.max_tokens).min(self.n_ctx);
            // One block more for the copy made when writing into a shared block.
            let quota = BlockPool::blocks_for(worst) + 1;
            let fits = self.reserved_blocks + quota <= self.pool.max_blocks();
            let too_big = quota > self.pool.max_blocks();
            if !fits && !too_big {
                return; // waits for running sequences to finish
            }
            let mut req = self.queue.pop_front().expect("not empty");
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if n == 0 {
                (req.sink)(SeqEvent::Error(Error::InvalidArgument(
                    "empty prompt".into(),
                )));
                continue;
            }
            if n >= self.n_ctx {
                (req.sink)(SeqEvent::Error(Error::ContextOverflow {
                    n_prompt: n,
                    n_ctx: self.n_ctx,
                }));
                continue;
            }
            if too_big {
                (req.sink)(SeqEvent::Error(Error::InvalidArgument(format!(
                    "the request needs up to {worst} tokens of KV cache ({quota} blocks of \
                     {BLOCK_TOKENS}) but the KV cache budget holds {} blocks; lower max_tokens \
                     or raise the KV cache size",
                    self.pool.max_blocks()
                ))));
                continue;
            }
            let decoding = match Decoding::new(&req.prompt, &req.options) {
                Ok(d) => match req.top_logprobs {
                    Some(k) => d.with_logprobs(k),
                    None => d,
                },
                Err(e) => {
                    (req.sink)(SeqEvent::Error(e));
                    continue;
                }
            };
            let pool: Arc<dyn BlockSource> = self.pool.clone();
            let mut cache = self.model.new_cache(self.n_ctx).with_source(pool);
            let mut common = 0;
            let (mut checkpoint_at, mut checkpoint) = (0, None);
            // The last prompt token is always evaluated: its logits give the first token.
            if !self.share_prefixes {
                match self.parked.adopt(&req.prompt, n - 1) {
                    Some((parked, len)) => {
                        cache = parked;
                        common = len;
                    }
                    // Starting without a slot: the backend must find one free.
                    None => {
                        self.parked.make_room(self.running.len());
                        if !cache.has_recurrent() {
                            common = self.copy_running_prefix(&req.prompt, n - 1, &mut cache);
                        }
                    }
                }
            } else if !cache.has_recurrent() {
                let (blocks, n) = self.pool.lookup(&req.prompt, n - 1);
                if n > 0 {
                    cache.map_prefix(blocks, n);
                    common = n;
                }
            } else {
                let at = prompt_checkpoint(&req.prompt, self.turn_start);
                if let Some((blocks, len, state)) = self.pool.lookup_state(&req.prompt, n - 1) {
                    cache.resume(blocks, len, &state);
                    common = len;
                    if len == at {
                        // Resuming at this prompt's own checkpoint (a regenerated reply): the
                        // state is saved again at the end, as recent as the new ones.
                        checkpoint = Some(state);
                    }
                }
                if at >= common && at > 0 {
                    checkpoint_at = at;
                }
            }
            if !(req.sink)(SeqEvent::Prompt {
                done: common,
                total: n,
            }) {
                continue; // the listener left while the request was queued
            }
            let shift = self.shift_for(&req, &cache);
            self.reserved_blocks += quota;
            self.publish(|st| {
                st.prompt_tokens_cached_total += common as u64;
                st.prefix_hits_total += (common > 0) as u64;
            });
            self.running.push(Running {
                tokens: req.prompt[..common].to_vec(),
                req,
                decoding,
                cache,
                quota,
                prompt_done: common,
                cached_tokens: common,
                next: None,
                started: Instant::now(),
                prompt_secs: 0.0,
                checkpoint_at,
                checkpoint,
                shift,
                refeed: Vec::new(),
            });
        }
    }

    /// Device backends: the longest prefix of `prompt` (at most `limit` tokens, at least
    /// `MIN_REUSE`) that a running sequence holds, copied into a new slot of `cache`; the
    /// tokens copied (0: none — no such sequence, or the backend did not copy, and the prompt
    /// is computed in full).
    fn copy_running_prefix(&self, prompt: &[u32], limit: usize, cache: &mut KvCache) -> usize {
        let best = self
            .running
            .iter()
            .filter(|r| r.cache.device_slot().is_some())
            .map(|r| (r, common_prefix(&r.tokens, prompt).min(limit)))
            .max_by_key(|&(_, n)| n);
        match best {
            Some((r, n)) if n >= MIN_REUSE => {
                match self.model.copy_device_prefix(&r.cache, cache, n) {
                    Ok(true) => n,
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    /// One batched forward over every running sequence, then sampling and events.
    fn step(&mut self) {
        self.shift_full_sequences();
        if self.step_drafted() || self.step_on_device() {
            return;
        }
        let t0 = Instant::now();
        // What each sequence feeds this step (empty: not part of the batch).
        let mut budget = PREFILL_BUDGET;
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(self.running.len());
        for r in &self.running {
            let feed = if r.prompt_done < r.req.prompt.len() {
                let mut take = (r.req.prompt.len() - r.prompt_done).min(budget);
                if r.prompt_done < r.checkpoint_at {
                    // The chunk ends at the checkpoint, so the state there can be copied.
                    take = take.min(r.checkpoint_at - r.prompt_done);
                }
                budget -= take;
                r.req.prompt[r.prompt_done..r.prompt_done + take].to_vec()
            } else if !r.refeed.is_empty() {
                // At least one token a step, so a shifted sequence never stalls.
                let take = r.refeed.len().min(budget.max(1));
                budget = budget.saturating_sub(take);
                r.refeed[..take].to_vec()
            } else {
                r.next.into_iter().collect()
            };
            feeds.push(feed);
        }
        // A decoding sequence whose sampler needs only the best candidates gets only those
        // from a device backend (a few hundred bytes instead of the vocabulary's logits).
        let want_top: Vec<bool> = self
            .running
            .iter()
            .zip(&feeds)
            .filter(|(_, f)| !f.is_empty())
            .map(|(r, _)| {
                r.prompt_done >= r.req.prompt.len() && r.decoding.exact_on_top(TOP_CANDIDATES)
            })
            .collect();
        let mut batch: Vec<BatchSeq<'_>> = self
            .running
            .iter_mut()
            .zip(&feeds)
            .filter(|(_, f)| !f.is_empty())
            .map(|(r, f)| BatchSeq {
                tokens: f,
                cache: &mut r.cache,
                logits: Logits::Last,
            })
            .collect();
        if batch.is_empty() {
            return;
        }
        let result = self
            .model
            .forward_batch_top(&mut batch, TOP_CANDIDATES, &want_top);
        drop(batch);
        let secs = t0.elapsed().as_secs_f64();
        let mut outputs = match result {
            Ok(o) => o.into_iter(),
            Err(e) => {
                self.fail_batch(&feeds, e);
                return;
            }
        };
        let (mut prompt_rows, mut predicted, mut cancelled) = (0u64, 0u64, 0u64);
        let mut finished = Vec::new();
        for (i, feed) in feeds.iter().enumerate() {
            let r = &mut self.running[i];
            if feed.is_empty() {
                // Waiting for its turn at the prompt budget: only check the listener.
                let (done, total) = (r.prompt_done, r.req.prompt.len());
                if !(r.req.sink)(SeqEvent::Prompt { done, total }) {
                    cancelled += 1;
                    finished.push((i, FinishReason::Cancelled));
                }
                continue;
            }
            let row = outputs.next().unwrap_or(RowLogits::Full(Vec::new()));
            r.tokens.extend_from_slice(feed);
            if r.checkpoint_at > 0 && r.tokens.len() == r.checkpoint_at {
                r.checkpoint = r.cache.recurrent().cloned();
            }
            if self.share_prefixes
                && !r.cache.has_recurrent()
                && r.tokens.len() / BLOCK_TOKENS > (r.tokens.len() - feed.len()) / BLOCK_TOKENS
            {
                // A block filled up: others may share it from now on.
                self.pool.register(&mut r.cache, &r.tokens, false);
            }
            if r.prompt_done < r.req.prompt.len() {
                r.prompt_done += feed.len();
                prompt_rows += feed.len() as u64;
                if r.prompt_done < r.req.prompt.len() {
                    // More prompt to read next step; is anybody still waiting for it?
                    let total = r.req.prompt.len();
                    if !(r.req.sink)(SeqEvent::Prompt {
                        done: r.prompt_done,
                        total,
                    }) {
                        cancelled += 1;
                        finished.push((i, FinishReason::Cancelled));
                    }
                    continue;
                }
                r.prompt_secs = r.started.elapsed().as_secs_f64();
            } else if !r.refeed.is_empty() {
                r.refeed.drain(..feed.len());
                if !r.refeed.is_empty() {
                    continue; // more of the kept window to read
                }
                // Read: the row holds the pending token's logits.
            }
            let limit = r.limit(self.n_ctx);
            let step = r
                .decoding
                .step_row(row, &self.tokenizer, r.tokens.len(), limit);
            predicted += step.token.is_some() as u64;
            let (step, gone) = deliver(&mut *r.req.sink, &mut r.decoding, step, &self.tokenizer);
            cancelled += gone as u64;
            r.next = step.token;
            if let Some(finish) = step.finish {
                finished.push((i, finish));
            }
        }
        // Counters first: a listener told "done" (in `retire`) must already see this step
        // counted, or a reader of the stats right after the summary sees stale totals.
        self.publish(|st| {
            st.n_decode_total += 1;
            st.prompt_tokens_total += prompt_rows;
            st.tokens_predicted_total += predicted;
            st.cancelled_total += cancelled;
            if prompt_rows > 0 {
                st.prompt_seconds_total += secs;
            }
            if predicted > 0 {
                st.tokens_predicted_seconds_total += secs;
            }
        });
        // Highest index first, so the indices still point at the same sequences.
        for (i, finish) in finished.into_iter().rev() {
            let r = self.running.swap_remove(i);
            self.retire(r, finish);
        }
    }

    /// Ends a sequence: its blocks go to the prefix index (so a follow-up can reuse them) or
    /// back to the pool, its quota is released and its listener gets the summary.
    fn retire(&mut self, mut r: Running, finish: FinishReason) {
        if self.share_prefixes {
            self.pool.register(&mut r.cache, &r.tokens, true);
        }
        if let Some(end) = r.cache.recurrent() {
            // Hybrid: the blocks are useful only with the state at the same position. The
            // turn-start state goes last, so under a tight budget it is the one that stays
            // (every chat follow-up can use it).
            self.pool.save_state(&r.tokens, end);
            if let Some(state) = &r.checkpoint {
                self.pool.save_state(&r.tokens[..r.checkpoint_at], state);
            }
        }
        self.reserved_blocks -= r.quota;
        let Running {
            req,
            decoding,
            cache,
            tokens,
            cached_tokens,
            started,
            prompt_secs,
            ..
        } = r;
        if !self.share_prefixes {
            self.parked.park(cache, tokens);
        } else {
            drop(cache);
        }
        // The gauges include this sequence's release before its listener hears it is done.
        self.publish(|_| {});
        finish_sequence(req, &decoding, cached_tokens, started, prompt_secs, finish);
    }

    /// A failed forward (should not happen for validated requests): every sequence in it gets
    /// the error and ends.
    fn fail_batch(&mut self, feeds: &[Vec<u32>], e: Error) {
        let msg = e.to_string();
        for i in (0..feeds.len()).rev() {
            if feeds[i].is_empty() {
                continue;
            }
            let mut r = self.running.swap_remove(i);
            r.cache.truncate(r.tokens.len());
            self.reserved_blocks -= r.quota;
            (r.req.sink)(SeqEvent::Error(Error::InvalidArgument(msg.clone())));
        }
    }

    /// Updates the shared statistics (gauges from the sequences and the pool, counters
    /// through `f`).
    fn publish(&self, f: impl FnOnce(&mut SchedulerStats)) {
        let blocks = self.pool.stats();
        if let Ok(mut st) = self.stats.lock() {
            f(&mut st);
            st.requests_processing = self.running.len();
            st.kv_tokens = self.running.iter().map(|r| r.cache.len()).sum();
            st.kv_blocks = blocks;
        }
    }
}

/// Hands a sampled step to its sequence's listener. A listener that has gone cancels the
/// sequence: the step returned then finishes it, and the flag says so.
fn deliver(
    sink: &mut (dyn FnMut(SeqEvent) -> bool + Send),
    decoding: &mut Decoding,
    mut step: Step,
    tokenizer: &Tokenizer,
) -> (Step, bool) {
    let listening = sink(SeqEvent::Piece {
        token: step.token,
        text: std::mem::take(&mut step.text),
        logprob: step.logprob.take(),
    });
    if !listening && step.finish.is_none() {
        return (decoding.cancel(tokenizer), true);
    }
    (step, false)
}

fn finish_sequence(
    mut req: SeqRequest,
    decoding: &Decoding,
    cached_tokens: usize,
    started: Instant,
    prompt_secs: f64,
    finish: FinishReason,
) {
    let summary = SeqSummary {
        finish,
        prompt_tokens: req.prompt.len(),
        cached_tokens,
        completion_tokens: decoding.generated(),
        prompt_secs,
        gen_secs: (started.elapsed().as_secs_f64() - prompt_secs).max(0.0),
    };
    (req.sink)(SeqEvent::Done(summary));
}
