//! The scheduler's lone sequence on a backend's device loop (`engine/scheduler/device_loop.rs`,
//! what `trit serve --device cuda` does with one client): every token, the text, the finish
//! reason and the counts equal the same requests served through batched steps — greedy,
//! sampled, stop strings, end-of-sequence ids, the context's end, a loop budget below the
//! caller's — while the stand-in device runs steps past every refused token, as the GPU's
//! queued graphs do. A request arriving during a loop ends it and joins the batch; a listener
//! that leaves ends its sequence within the loop.
//!
//! The stand-in keeps each slot's keys/values in a CPU cache of the default model and computes
//! every step with the CPU engine's `forward`, batched or looped alike, so any bookkeeping
//! slip (a token fed twice or not at all, a cache length off by one) changes the tokens.

mod common;
use common::device_loop::run_ahead;
use common::{greedy, submit};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use trit::engine::{
    ContextShift, FinishReason, GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest,
    SeqSummary,
};
use trit::format::config::ModelConfig;
use trit::model::device_slot::SlotPool;
use trit::model::{BatchSeq, DeviceLoopRun, DevicePick, ExternalNet, KvCache, Logits, Model};
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

/// Steps the stand-in computes ahead of the token it offers (the GPU: three graphs).
const AHEAD: usize = 3;

struct LoopNet {
    inner: Model,
    slots: Mutex<Vec<Option<KvCache>>>,
    ctx: usize,
    /// Whether it has a device loop (else the scheduler takes batched steps only).
    looping: bool,
    /// Most steps one loop may feed (below the caller's: the pending-token path).
    budget: usize,
    /// What the test reads while the scheduler owns the net.
    seen: Arc<Seen>,
}

struct Seen {
    pool: SlotPool,
    loops: AtomicUsize,
    /// Steps computed past a refused token and dropped, over all loops.
    dropped: AtomicUsize,
    /// Most sequences in one batched call.
    widest: AtomicUsize,
}

impl LoopNet {
    fn new(inner: Model, ctx: usize, looping: bool, budget: usize) -> LoopNet {
        LoopNet {
            inner,
            slots: Mutex::new(vec![None, None]),
            ctx,
            looping,
            budget,
            seen: Arc::new(Seen {
                pool: SlotPool::new(2),
                loops: AtomicUsize::new(0),
                dropped: AtomicUsize::new(0),
                widest: AtomicUsize::new(0),
            }),
        }
    }

    /// The slot's cache cut back to the caller's length (a loop may have run ahead of it).
    fn slot_cache<'a>(slots: &'a mut [Option<KvCache>], cache: &KvCache) -> &'a mut KvCache {
        let own = slots[cache.device_slot().expect("a slot").index()]
            .as_mut()
            .expect("a cache per owned slot");
        own.truncate(cache.len());
        assert_eq!(
            own.len(),
            cache.len(),
            "the caller's cache is ahead of the slot's"
        );
        own
    }
}

impl ExternalNet for LoopNet {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn forward(&self, _: &[u32], _: &mut KvCache, _: Logits) -> trit::Result<Vec<f32>> {
        Err(trit::Error::Unsupported(
            "the scheduler uses forward_batch".into(),
        ))
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
    fn max_sequences(&self) -> usize {
        self.seen.pool.capacity()
    }
    fn forward_batch(&self, seqs: &mut [BatchSeq<'_>]) -> trit::Result<Vec<Vec<f32>>> {
        self.seen.widest.fetch_max(seqs.len(), Ordering::SeqCst);
        let mut slots = self.slots.lock().unwrap();
        let mut rows = Vec::new();
        for s in seqs.iter_mut() {
            if s.cache.device_slot().is_none() {
                let slot = self.seen.pool.take().expect("at most max_sequences run");
                slots[slot.index()] = Some(self.inner.new_cache(self.ctx));
                s.cache.set_device_slot(slot);
            }
            assert_eq!(s.logits, Logits::Last);
            let own = Self::slot_cache(&mut slots, s.cache);
            rows.push(self.inner.forward(s.tokens, own, Logits::Last)?);
            s.cache.advance(s.tokens.len());
        }
        Ok(rows)
    }
    fn loops_on_slots(&self) -> bool {
        self.looping
    }
    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        _stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> trit::Result<Option<DeviceLoopRun>> {
        if !self.looping {
            return Ok(None);
        }
        self.seen.loops.fetch_add(1, Ordering::SeqCst);
        let mut slots = self.slots.lock().unwrap();
        let own = Self::slot_cache(&mut slots, cache);
        let max_steps = max_steps.min(self.budget);
        let (run, dropped) = run_ahead(
            &self.inner,
            own,
            cache,
            first,
            max_steps,
            AHEAD,
            pick,
            accept,
        )?;
        self.seen.dropped.fetch_add(dropped, Ordering::SeqCst);
        Ok(Some(run))
    }
}

fn schedule(net: LoopNet, tok: &Arc<Tokenizer>) -> Scheduler {
    schedule_shifting(net, tok, None)
}

fn schedule_shifting(
    net: LoopNet,
    tok: &Arc<Tokenizer>,
    context_shift: Option<ContextShift>,
) -> Scheduler {
    let config = SchedulerConfig {
        n_ctx: net.ctx,
        parallel: 2,
        max_queue: 8,
        kv_cache_bytes: 64 << 20,
        context_shift,
        draft: None,
    };
    let model = Arc::new(Model::from_external(Box::new(net)));
    Scheduler::start(model, tok.clone(), config).unwrap()
}

/// What a reply came to: tokens, text, summary.
#[derive(Debug)]
struct Reply {
    tokens: Vec<u32>,
    text: String,
    summary: SeqSummary,
}

impl PartialEq for Reply {
    fn eq(&self, o: &Reply) -> bool {
        let (a, b) = (&self.summary, &o.summary);
        self.tokens == o.tokens
            && self.text == o.text
            && a.finish == b.finish
            && a.completion_tokens == b.completion_tokens
            && a.prompt_tokens == b.prompt_tokens
    }
}

/// Collects a reply; `on_piece` sees the number of tokens after each piece.
fn collect(rx: &mpsc::Receiver<SeqEvent>, mut on_piece: impl FnMut(usize)) -> Reply {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SeqEvent::Piece { token, text: t, .. } => {
                tokens.extend(token);
                text.push_str(&t);
                on_piece(tokens.len());
            }
            SeqEvent::Done(summary) => {
                return Reply {
                    tokens,
                    text,
                    summary,
                }
            }
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

fn setup() -> (trit::format::ModelFiles, Arc<Tokenizer>) {
    let files = common::default_model_files();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    (files, tok)
}

/// Once a scheduler is gone (its thread ends soon after), every slot is back in the pool.
fn slots_come_back(net: &Seen) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while net.pool.free_count() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(net.pool.free_count(), 2, "every slot back in its pool");
}

fn sampled(max_tokens: usize, seed: u64) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed,
            ..SamplingParams::default()
        },
        ..greedy(max_tokens)
    }
}

#[test]
fn a_lone_sequence_on_the_device_loop_gets_what_batched_steps_give() {
    let (files, tok) = setup();
    let ctx = 96;
    let prompt = tok.encode("The old lighthouse keeper", false).unwrap();
    let stepped = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, false, usize::MAX);
    let reference = schedule(stepped, &tok);
    let plain = collect(&submit(&reference, &prompt, greedy(30)), |_| {});
    assert!(plain.tokens.len() == 30 && !plain.text.is_empty());
    // A stop string from the middle of the greedy reply, and an end-of-sequence id from it.
    let stop_at = plain
        .text
        .char_indices()
        .nth(plain.text.chars().count() / 2)
        .unwrap()
        .0;
    let stop: String = plain.text[stop_at..].chars().take(3).collect();
    let mut with_stop = greedy(30);
    with_stop.stop = vec![stop.clone()];
    let mut with_eos = sampled(30, 4);
    with_eos.eos = vec![plain.tokens[12]];
    let cases = [
        ("greedy", greedy(30)),
        ("sampled", sampled(30, 7)),
        ("stop string", with_stop),
        ("eos id", with_eos),
        // Past the context's end (and longer than one loop budget below).
        ("context end", sampled(500, 9)),
    ];
    for budget in [usize::MAX, 5] {
        let net = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, true, budget);
        let seen = net.seen.clone();
        let looping = schedule(net, &tok);
        for (what, opts) in &cases {
            let want = collect(&submit(&reference, &prompt, opts.clone()), |_| {});
            let loops = seen.loops.load(Ordering::SeqCst);
            let got = collect(&submit(&looping, &prompt, opts.clone()), |_| {});
            assert_eq!(got, want, "{what}, loop budget {budget}");
            assert!(
                seen.loops.load(Ordering::SeqCst) > loops,
                "{what}: no device loop ran"
            );
            match *what {
                "stop string" => assert_eq!(got.summary.finish, FinishReason::Stop),
                "context end" => {
                    assert_eq!(got.summary.finish, FinishReason::Length);
                    assert_eq!(got.tokens.len(), ctx - prompt.len() + 1);
                }
                _ => {}
            }
        }
        // Stops and the eos id refused tokens the device had already run past.
        assert!(seen.dropped.load(Ordering::SeqCst) > 0);
        drop(looping);
        slots_come_back(&seen);
    }
}

#[test]
fn a_shifting_sequence_runs_on_the_device_loop_between_its_shifts() {
    // The loop stops at the context's end with its token pending; the batched step shifts
    // (the slot's cache is cut back to the kept start) and reads the kept window, then the
    // next loop goes on: the same tokens as batched steps throughout.
    let (files, tok) = setup();
    let (ctx, shift) = (48, Some(ContextShift { keep: 2 }));
    let prompt = tok.encode("The old lighthouse keeper", false).unwrap();
    let stepped = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, false, usize::MAX);
    let reference = schedule_shifting(stepped, &tok, shift);
    let net = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, true, usize::MAX);
    let seen = net.seen.clone();
    let looping = schedule_shifting(net, &tok, shift);
    for (what, opts) in [("greedy", greedy(150)), ("sampled", sampled(150, 3))] {
        let want = collect(&submit(&reference, &prompt, opts.clone()), |_| {});
        assert_eq!(want.tokens.len(), 150, "{what}: past the context");
        let loops = seen.loops.load(Ordering::SeqCst);
        let got = collect(&submit(&looping, &prompt, opts), |_| {});
        assert_eq!(got, want, "{what}");
        // At least one loop per context's worth of tokens.
        assert!(
            seen.loops.load(Ordering::SeqCst) >= loops + 150 / ctx,
            "{what}"
        );
    }
    drop(looping);
    slots_come_back(&seen);
}

#[test]
fn a_request_arriving_during_a_loop_joins_and_a_leaving_listener_ends_its_loop() {
    let (files, tok) = setup();
    let ctx = 160;
    let a = tok.encode("Once upon a time", false).unwrap();
    let b = tok.encode("The capital of France is", false).unwrap();
    let stepped = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, false, usize::MAX);
    let reference = schedule(stepped, &tok);
    let want_a = collect(&submit(&reference, &a, greedy(60)), |_| {});
    let want_b = collect(&submit(&reference, &b, sampled(20, 3)), |_| {});
    let net = LoopNet::new(Model::load(&files, 2).unwrap(), ctx, true, usize::MAX);
    let seen = net.seen.clone();
    let looping = schedule(net, &tok);
    let rx_a = submit(&looping, &a, greedy(60));
    let mut rx_b = None;
    // B arrives after A's fifth token: A's loop ends there, both take batched steps, and A
    // loops again once B is done.
    let got_a = collect(&rx_a, |n| {
        if n == 5 {
            rx_b = Some(submit(&looping, &b, sampled(20, 3)));
        }
    });
    let got_b = collect(&rx_b.expect("submitted"), |_| {});
    assert_eq!(got_a, want_a);
    assert_eq!(got_b, want_b);
    // B joined A's steps (without the yield, A's loop would have run to its end first).
    assert_eq!(seen.widest.load(Ordering::SeqCst), 2);
    assert!(seen.loops.load(Ordering::SeqCst) >= 2);
    // A listener gone after 3 tokens: the loop stops at once, the sequence ends cancelled.
    let (tx, rx) = mpsc::channel();
    let mut pieces = 0;
    looping
        .submit(SeqRequest {
            prompt: a.clone(),
            options: greedy(60),
            top_logprobs: None,
            keep: None,
            sink: Box::new(move |e| {
                pieces += matches!(e, SeqEvent::Piece { .. }) as usize;
                let _ = tx.send(e);
                pieces < 3
            }),
        })
        .unwrap();
    let gone = collect(&rx, |_| {});
    assert_eq!(gone.summary.finish, FinishReason::Cancelled);
    assert_eq!(gone.tokens[..], want_a.tokens[..gone.tokens.len()]);
    assert!(
        gone.tokens.len() <= 3,
        "{} tokens after the listener left",
        gone.tokens.len()
    );
    assert_eq!(looping.stats().cancelled_total, 1);
    drop(looping);
    slots_come_back(&seen);
}

/// A backend that loops on slots still gets only single-sequence caches for everything else:
/// `forward_read` of a cache in a slot is refused (the single path would compute it over its
/// own keys/values, not the slot's).
#[test]
fn only_the_device_loop_reaches_a_backend_with_a_slotted_cache() {
    let (files, tok) = setup();
    let net = LoopNet::new(Model::load(&files, 2).unwrap(), 64, true, usize::MAX);
    let seen = net.seen.clone();
    let model = Model::from_external(Box::new(net));
    let prompt = tok.encode("The capital of France is", false).unwrap();
    let mut cache = model.new_cache(64);
    let mut batch = [BatchSeq {
        tokens: &prompt,
        cache: &mut cache,
        logits: Logits::Last,
    }];
    model.forward_batch(&mut batch).unwrap();
    assert!(cache.device_slot().is_some());
    let err = model
        .forward_read(&[prompt[0]], &mut cache, Logits::Last, &mut |_| {})
        .expect_err("a slotted cache through forward_read")
        .to_string();
    assert!(err.contains("batched device slot"), "{err}");
    let loops = seen.loops.load(Ordering::SeqCst);
    let run = model
        .decode_on_device(
            prompt[0],
            &mut cache,
            3,
            &DevicePick::Argmax,
            &[],
            &mut |_, _| true,
        )
        .unwrap();
    assert_eq!(run.map(|r| r.fed), Some(3));
    assert_eq!(seen.loops.load(Ordering::SeqCst), loops + 1);
}
