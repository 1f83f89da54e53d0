//! Continuous batching. One thread owns the model and a fixed set of slots (one KV cache
//! each, `parallel` of them). Every step it runs all active sequences through one batched
//! forward — decoding sequences contribute their last sampled token, new ones a chunk of their
//! prompt — so the weights are read once per step for everybody. Requests join between steps
//! when a slot is free (otherwise they wait in a bounded queue) and leave as soon as they
//! finish or their listener goes away.
//!
//! A slot keeps its cache after its sequence ends, and a new request takes the free slot whose
//! cached tokens share the longest prefix with its prompt, so a multi-turn chat re-sent as full
//! history only computes the new turn. What a slot held is saved to a budgeted
//! [`PrefixStore`] before the slot is reused, so more conversations than slots stay warm.

use super::generate::{FinishReason, GenerateOptions};
use super::prefix_store::{common_prefix, PrefixStore};
use super::sequence::{Decoding, TokenLogprob};
use crate::model::{BatchSeq, KvCache, Logits, Model};
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

/// A slot's cached positions are saved to the prefix store before being overwritten only when
/// at least this many would be lost.
const SAVE_WHEN_LOSING: usize = 32;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Context size of every slot, in tokens.
    pub n_ctx: usize,
    /// Sequences decoded together at most (= slots).
    pub parallel: usize,
    /// Requests allowed to wait for a slot; more are refused.
    pub max_queue: usize,
    /// Memory for keys/values of earlier requests kept beyond the slots (0: slots only).
    pub prefix_cache_bytes: usize,
}

/// One generation request. Validation (context size, parameter ranges) is the caller's job;
/// what still fails here comes back as [`SeqEvent::Error`].
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Report log-probabilities with this many alternatives per token.
    pub top_logprobs: Option<usize>,
    /// Receives the events of the sequence; returning false (listener gone) cancels it.
    pub sink: Box<dyn FnMut(SeqEvent) -> bool + Send>,
}

#[derive(Debug)]
pub enum SeqEvent {
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
    /// Positions held by all slot caches (active and kept for reuse) and their total capacity.
    pub kv_tokens: usize,
    pub kv_capacity: usize,
    pub kv_bytes: usize,
    /// Prompt tokens served from kept keys/values instead of being evaluated.
    pub prompt_tokens_cached_total: u64,
    /// Sequences kept in the prefix store, and their bytes.
    pub prefix_cache_entries: usize,
    pub prefix_cache_bytes: usize,
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
        let (tx, rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(Mutex::new(SchedulerStats {
            kv_capacity: config.parallel.max(1) * config.n_ctx,
            ..Default::default()
        }));
        let slots = (0..config.parallel.max(1))
            .map(|_| Slot {
                cache: model.new_cache(config.n_ctx),
                tokens: Vec::new(),
                last_used: 0,
                seq: None,
            })
            .collect();
        let worker = Worker {
            store: PrefixStore::new(config.prefix_cache_bytes),
            model,
            tokenizer,
            rx,
            queue: VecDeque::new(),
            slots,
            waiting: waiting.clone(),
            stats: stats.clone(),
            n_ctx: config.n_ctx,
            tick: 0,
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

struct Slot {
    cache: KvCache,
    /// The tokens whose keys/values `cache` holds.
    tokens: Vec<u32>,
    last_used: u64,
    seq: Option<Running>,
}

struct Running {
    req: SeqRequest,
    decoding: Decoding,
    /// Prompt tokens already in the cache (reused or evaluated).
    prompt_done: usize,
    cached_tokens: usize,
    /// The sampled token to feed next step.
    next: Option<u32>,
    started: Instant,
    prompt_secs: f64,
}

struct Worker {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    rx: Receiver<SeqRequest>,
    /// Received but not yet in a slot.
    queue: VecDeque<SeqRequest>,
    slots: Vec<Slot>,
    store: PrefixStore,
    /// Submitted and not yet admitted (shared with `submit`).
    waiting: Arc<AtomicUsize>,
    stats: Arc<Mutex<SchedulerStats>>,
    n_ctx: usize,
    tick: u64,
}

impl Worker {
    fn run(mut self) {
        loop {
            let idle = self.slots.iter().all(|s| s.seq.is_none());
            if idle && self.queue.is_empty() {
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
            if self.slots.iter().any(|s| s.seq.is_some()) {
                self.step();
            }
        }
    }

    /// Moves waiting requests into free slots, each into the one with the longest shared prefix.
    fn admit(&mut self) {
        while !self.queue.is_empty() {
            let Some(slot) = self.best_free_slot(&self.queue[0].prompt) else {
                return;
            };
            let Some(mut req) = self.queue.pop_front() else {
                return;
            };
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            let n = req.prompt.len();
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
            let common = self.reuse_prefix(slot, &req.prompt);
            self.publish(|st| st.prompt_tokens_cached_total += common as u64);
            let s = &mut self.slots[slot];
            s.seq = Some(Running {
                req,
                decoding,
                prompt_done: common,
                cached_tokens: common,
                next: None,
                started: Instant::now(),
                prompt_secs: 0.0,
            });
        }
    }

    /// Brings `slot`'s cache to the longest prefix of `prompt` that is known: what the slot
    /// holds, or a longer one from the prefix store. What the slot held beyond that goes to
    /// the store. Returns the number of positions kept.
    fn reuse_prefix(&mut self, slot: usize, prompt: &[u32]) -> usize {
        let s = &mut self.slots[slot];
        let in_slot = common_prefix(&s.tokens, prompt);
        // A follow-up turn drops only the last few cached tokens (the template re-renders the
        // end of the reply); saving is for a slot that another conversation is taking over.
        let lost = if s.tokens.len() - in_slot >= SAVE_WHEN_LOSING {
            self.store.snapshot(&self.model, &s.tokens, &s.cache)
        } else {
            None
        };
        // The last prompt token is always evaluated: its logits give the first token.
        let last = prompt.len() - 1;
        let mut common = in_slot.min(last);
        match self.store.best(prompt) {
            Some((entry, stored)) if stored.min(last) > common => {
                s.tokens = self.store.restore(entry, stored.min(last), &mut s.cache);
                common = s.tokens.len();
            }
            _ => {
                s.cache.truncate(common);
                // A hybrid model's recurrent state may roll back further than asked.
                common = s.cache.len();
                s.tokens.truncate(common);
            }
        }
        // Kept only now, so that it cannot evict the entry just restored.
        if let Some(snapshot) = lost {
            self.store.insert(snapshot);
        }
        common
    }

    fn best_free_slot(&self, prompt: &[u32]) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.seq.is_none())
            // Longest shared prefix first, then least recently used.
            .max_by_key(|(_, s)| (common_prefix(&s.tokens, prompt), u64::MAX - s.last_used))
            .map(|(i, _)| i)
    }

    /// One batched forward over every active sequence, then sampling and events.
    fn step(&mut self) {
        let t0 = Instant::now();
        // What each slot feeds this step (empty: not part of the batch).
        let mut budget = PREFILL_BUDGET;
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let feed = match &s.seq {
                None => Vec::new(),
                Some(r) if r.prompt_done < r.req.prompt.len() => {
                    let take = (r.req.prompt.len() - r.prompt_done).min(budget);
                    budget -= take;
                    r.req.prompt[r.prompt_done..r.prompt_done + take].to_vec()
                }
                Some(r) => r.next.into_iter().collect(),
            };
            feeds.push(feed);
        }
        let mut batch: Vec<BatchSeq<'_>> = self
            .slots
            .iter_mut()
            .zip(&feeds)
            .filter(|(_, f)| !f.is_empty())
            .map(|(s, f)| BatchSeq {
                tokens: f,
                cache: &mut s.cache,
                logits: Logits::Last,
            })
            .collect();
        if batch.is_empty() {
            return;
        }
        let result = self.model.forward_batch(&mut batch);
        drop(batch);
        let secs = t0.elapsed().as_secs_f64();
        let mut outputs = match result {
            Ok(o) => o.into_iter(),
            Err(e) => {
                self.fail_batch(&feeds, e);
                return;
            }
        };
        self.tick += 1;
        let (mut prompt_rows, mut predicted) = (0u64, 0u64);
        for (i, feed) in feeds.iter().enumerate() {
            if feed.is_empty() {
                continue;
            }
            let mut logits = outputs.next().unwrap_or_default();
            let s = &mut self.slots[i];
            s.tokens.extend_from_slice(feed);
            s.last_used = self.tick;
            let Some(r) = s.seq.as_mut() else { continue };
            if r.prompt_done < r.req.prompt.len() {
                r.prompt_done += feed.len();
                prompt_rows += feed.len() as u64;
                if r.prompt_done < r.req.prompt.len() {
                    continue; // more prompt to read next step
                }
                r.prompt_secs = r.started.elapsed().as_secs_f64();
            }
            let mut step =
                r.decoding
                    .step(&mut logits, &self.tokenizer, s.tokens.len(), self.n_ctx);
            predicted += step.token.is_some() as u64;
            let listening = (r.req.sink)(SeqEvent::Piece {
                token: step.token,
                text: std::mem::take(&mut step.text),
                logprob: step.logprob.take(),
            });
            if !listening && step.finish.is_none() {
                step = r.decoding.cancel(&self.tokenizer);
            }
            r.next = step.token;
            if let Some(finish) = step.finish {
                if let Some(r) = s.seq.take() {
                    finish_sequence(r, finish);
                }
            }
        }
        self.publish(|st| {
            st.n_decode_total += 1;
            st.prompt_tokens_total += prompt_rows;
            st.tokens_predicted_total += predicted;
            if prompt_rows > 0 {
                st.prompt_seconds_total += secs;
            }
            if predicted > 0 {
                st.tokens_predicted_seconds_total += secs;
            }
        });
    }

    /// A failed forward (should not happen for validated requests): every sequence in it gets
    /// the error, and the caches forget the rows that were appended.
    fn fail_batch(&mut self, feeds: &[Vec<u32>], e: Error) {
        let msg = e.to_string();
        for (s, feed) in self.slots.iter_mut().zip(feeds) {
            if feed.is_empty() {
                continue;
            }
            s.cache.truncate(s.tokens.len());
            if let Some(mut r) = s.seq.take() {
                (r.req.sink)(SeqEvent::Error(Error::InvalidArgument(msg.clone())));
            }
        }
    }

    /// Updates the shared statistics (gauges from the slots, counters through `f`).
    fn publish(&self, f: impl FnOnce(&mut SchedulerStats)) {
        if let Ok(mut st) = self.stats.lock() {
            f(&mut st);
            st.requests_processing = self.slots.iter().filter(|s| s.seq.is_some()).count();
            st.kv_tokens = self.slots.iter().map(|s| s.cache.len()).sum();
            st.kv_bytes = self.slots.iter().map(|s| s.cache.bytes()).sum();
            st.prefix_cache_entries = self.store.len();
            st.prefix_cache_bytes = self.store.bytes();
        }
    }
}

fn finish_sequence(mut r: Running, finish: FinishReason) {
    let summary = SeqSummary {
        finish,
        prompt_tokens: r.req.prompt.len(),
        cached_tokens: r.cached_tokens,
        completion_tokens: r.decoding.generated(),
        prompt_secs: r.prompt_secs,
        gen_secs: (r.started.elapsed().as_secs_f64() - r.prompt_secs).max(0.0),
    };
    (r.req.sink)(SeqEvent::Done(summary));
}
