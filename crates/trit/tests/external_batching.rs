//! The scheduler over a device backend (`ExternalNet` with KV slots, like the GPU model): at
//! most `max_sequences` run together, the rest wait; no host block is mapped into a slot, but a
//! finished sequence's slot is reused by a later prompt that starts with its tokens (a chat
//! follow-up re-sent as full history computes only the new part), a running one's prefix is
//! copied into a new sequence's slot where the backend can, and every request gets what it
//! gets alone; every slot is back in its pool once the scheduler is gone.
//!
//! The backend here is a stand-in that keeps each slot's keys/values in a CPU cache of the
//! default model, so its logits are the CPU engine's (tested against mlx-lm and llama.cpp).

mod common;
use common::collect;
use common::{greedy, submit};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use trit::engine::{
    generate, GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest, SeqSummary,
    Session, TokenLogprob,
};
use trit::format::config::ModelConfig;
use trit::model::device_slot::SlotPool;
use trit::model::{BatchSeq, ExternalNet, KvCache, Logits, Model};
use trit::sample::{Penalties, RowLogits, SamplingParams, TopLogits};
use trit::tokenizer::Tokenizer;

/// A "device" with `slots` KV slots, each a CPU cache of `inner`.
struct SlotNet {
    inner: Model,
    pool: Arc<SlotPool>,
    slot_caches: Mutex<Vec<Option<KvCache>>>,
    ctx: usize,
    /// Most sequences seen in one call.
    widest: AtomicUsize,
    /// Calls where a sequence arrived without a slot but with positions already in its cache
    /// (a prefix mapped from the host block pool: wrong for a device backend).
    mapped_prefixes: AtomicUsize,
    /// Answer `forward_batch_top` with candidates (the host reference `TopLogits::from_row`)
    /// where asked, as the GPU does; otherwise every row in full (the trait's default).
    candidates: bool,
    /// Decode rows asked for as candidates / in full.
    top_rows: AtomicUsize,
    full_rows: AtomicUsize,
    /// Answer `copy_prefix` (else the trait's default: not supported), and the tokens each
    /// slot's cache holds, which a copy recomputes (on a GPU: a device-to-device copy).
    copies_prefixes: bool,
    slot_tokens: Mutex<Vec<Vec<u32>>>,
    copies: AtomicUsize,
}

impl ExternalNet for SlotNet {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn forward(&self, _: &[u32], _: &mut KvCache, _: Logits) -> trit::Result<Vec<f32>> {
        Err(trit::Error::Unsupported(
            "the scheduler must use forward_batch".into(),
        ))
    }

    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }

    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }

    fn max_sequences(&self) -> usize {
        self.pool.capacity()
    }

    fn copy_prefix(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> trit::Result<bool> {
        if !self.copies_prefixes {
            return Ok(false);
        }
        self.copy(src, dst, n)
    }

    fn forward_batch(&self, seqs: &mut [BatchSeq<'_>]) -> trit::Result<Vec<Vec<f32>>> {
        self.widest.fetch_max(seqs.len(), Ordering::SeqCst);
        let mut slots = self.slot_caches.lock().unwrap();
        let mut taken = Vec::new();
        for s in seqs.iter_mut() {
            if s.cache.device_slot().is_none() {
                if !s.cache.is_empty() {
                    self.mapped_prefixes.fetch_add(1, Ordering::SeqCst);
                    return Err(trit::Error::InvalidArgument("no slot for a prefix".into()));
                }
                let slot = self
                    .pool
                    .take()
                    .expect("the scheduler admits at most max_sequences");
                // A fresh owner: whatever the slot held before is stale.
                slots[slot.index()] = Some(self.inner.new_cache(self.ctx));
                s.cache.set_device_slot(slot);
            }
            let i = s.cache.device_slot().unwrap().index();
            let mut c = slots[i].take().expect("a cache per owned slot");
            if c.len() != s.cache.len() && self.inner.config().hybrid.is_some() {
                // As the GPU's hybrid: a slot's recurrent state cannot be cut back.
                slots[i] = Some(c);
                return Err(trit::Error::InvalidArgument(
                    "a hybrid slot cut back".into(),
                ));
            }
            c.truncate(s.cache.len());
            let mut held = self.slot_tokens.lock().unwrap();
            held[i].truncate(s.cache.len());
            held[i].extend_from_slice(s.tokens);
            taken.push((i, c));
        }
        let mut batch: Vec<BatchSeq<'_>> = seqs
            .iter()
            .zip(taken.iter_mut())
            .map(|(s, (_, c))| BatchSeq {
                tokens: s.tokens,
                cache: c,
                logits: s.logits,
            })
            .collect();
        let out = self.inner.forward_batch(&mut batch)?;
        drop(batch);
        for (s, (i, c)) in seqs.iter_mut().zip(taken) {
            s.cache.advance(s.tokens.len());
            slots[i] = Some(c);
        }
        Ok(out)
    }

    fn forward_batch_top(
        &self,
        seqs: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> trit::Result<Vec<RowLogits>> {
        for (s, &w) in seqs.iter().zip(want_top) {
            if s.tokens.len() == 1 {
                let n = if w { &self.top_rows } else { &self.full_rows };
                n.fetch_add(1, Ordering::SeqCst);
            }
        }
        let rows = self.forward_batch(seqs)?;
        Ok(rows
            .into_iter()
            .zip(want_top)
            .map(|(row, &w)| match TopLogits::from_row(&row, k) {
                Some(top) if w && self.candidates => RowLogits::Top(top),
                _ => RowLogits::Full(row),
            })
            .collect())
    }
}

impl SlotNet {
    /// `copy_prefix` of a running sequence's first `n` positions into a new slot for `dst`.
    fn copy(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> trit::Result<bool> {
        let Some(from) = src.device_slot().map(|s| s.index()) else {
            return Ok(false);
        };
        let Some(slot) = self.pool.take() else {
            return Ok(false);
        };
        let tokens = self.slot_tokens.lock().unwrap()[from][..n].to_vec();
        let mut c = self.inner.new_cache(self.ctx);
        self.inner.forward(&tokens, &mut c, Logits::Last)?;
        self.slot_caches.lock().unwrap()[slot.index()] = Some(c);
        self.slot_tokens.lock().unwrap()[slot.index()] = tokens;
        dst.set_device_slot(slot);
        dst.advance(n);
        self.copies.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    fn new(inner: Model, slots: usize, ctx: usize, candidates: bool) -> SlotNet {
        SlotNet {
            inner,
            pool: Arc::new(SlotPool::new(slots)),
            slot_caches: Mutex::new((0..slots).map(|_| None).collect()),
            ctx,
            widest: AtomicUsize::new(0),
            mapped_prefixes: AtomicUsize::new(0),
            candidates,
            top_rows: AtomicUsize::new(0),
            full_rows: AtomicUsize::new(0),
            copies_prefixes: false,
            slot_tokens: Mutex::new(vec![Vec::new(); slots]),
            copies: AtomicUsize::new(0),
        }
    }
}

/// A shared handle on a `SlotNet`, as the scheduler's model (the test keeps the other).
struct Shared(Arc<SlotNet>);

impl ExternalNet for Shared {
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn forward(&self, t: &[u32], c: &mut KvCache, w: Logits) -> trit::Result<Vec<f32>> {
        self.0.forward(t, c, w)
    }
    fn weight_bytes(&self) -> usize {
        self.0.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.0.bytes_per_token()
    }
    fn max_sequences(&self) -> usize {
        self.0.max_sequences()
    }
    fn forward_batch(&self, s: &mut [BatchSeq<'_>]) -> trit::Result<Vec<Vec<f32>>> {
        self.0.forward_batch(s)
    }
    fn copy_prefix(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> trit::Result<bool> {
        self.0.copy_prefix(src, dst, n)
    }
    fn forward_batch_top(
        &self,
        s: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> trit::Result<Vec<RowLogits>> {
        self.0.forward_batch_top(s, k, want_top)
    }
}

fn default_model() -> (trit::format::ModelFiles, Arc<Tokenizer>) {
    let dir = common::repo_root().join("models/default");
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .expect("the default model is committed");
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    (files, Arc::new(tok))
}

/// A device model stores keys and values in f16: asking it for another type is an error, not
/// a silently ignored flag.
#[test]
fn device_models_refuse_kv_cache_types_they_do_not_store() {
    let (files, _) = default_model();
    let net = Arc::new(SlotNet::new(Model::load(&files, 2).unwrap(), 1, 64, true));
    let model = Model::from_external(Box::new(Shared(net)));
    let model = model.with_kv_types(trit::model::KvTypes::F16).unwrap();
    assert_eq!(model.kv_types(), trit::model::KvTypes::F16);
    let err = model
        .with_kv_types(trit::model::KvTypes::F32)
        .err()
        .expect("f32 keys/values on a device model")
        .to_string();
    assert!(err.contains("f16"), "{err}");
}

/// Embeddings need the hidden states, which a device model keeps on the device: refused with
/// the reason (the server answers 400 with it), not computed from something else.
#[test]
fn device_models_refuse_hidden_states_by_name() {
    let (files, _) = default_model();
    let net = Arc::new(SlotNet::new(Model::load(&files, 2).unwrap(), 1, 64, true));
    let model = Model::from_external(Box::new(Shared(net)));
    let err = trit::engine::embed(&model, &[1, 2, 3], trit::engine::Pooling::Mean)
        .expect_err("no hidden states from a device model")
        .to_string();
    assert!(err.contains("GPU model"), "{err}");
}

/// A scheduler over the stand-in device backend `net` (64 MiB of cache blocks).
fn schedule(
    net: &Arc<SlotNet>,
    tok: &Arc<Tokenizer>,
    ctx: usize,
    parallel: usize,
    max_queue: usize,
) -> Scheduler {
    let model = Arc::new(Model::from_external(Box::new(Shared(net.clone()))));
    let config = SchedulerConfig {
        n_ctx: ctx,
        parallel,
        max_queue,
        kv_cache_bytes: 64 << 20,
        context_shift: None,
        draft: None,
    };
    Scheduler::start(model, tok.clone(), config).unwrap()
}

#[test]
fn device_backend_runs_at_most_its_slots_reuses_finished_slots_and_returns_every_slot() {
    let (files, tok) = default_model();
    let ctx = 256;
    let net = Arc::new(SlotNet::new(Model::load(&files, 2).unwrap(), 2, ctx, true));
    let pool = net.pool.clone();
    let model = Arc::new(Model::from_external(Box::new(Shared(net.clone()))));
    assert_eq!(model.max_sequences(), 2);
    assert!(!model.shares_prefixes());
    let sched = Scheduler::start(
        model,
        tok.clone(),
        SchedulerConfig {
            n_ctx: ctx,
            // More than the backend holds: capped at its 2 slots, the rest queue.
            parallel: 4,
            max_queue: 8,
            kv_cache_bytes: 64 << 20,
            context_shift: None,
            draft: None,
        },
    )
    .unwrap();
    let head = tok
        .encode(
            &"The old lighthouse keeper climbed the stairs. ".repeat(12),
            false,
        )
        .unwrap();
    let with = |s: &str| {
        let mut p = head.clone();
        p.extend(tok.encode(s, false).unwrap());
        p
    };
    let prompts = [
        with(" First"),
        with(" Then the storm"),
        tok.encode("The capital of France is", false).unwrap(),
        with(" Later, at dawn,"),
    ];
    assert!(head.len() > 64, "the common prefix spans a whole KV block");
    // The first one alone: when the others come, its slot is parked with its tokens.
    let (first, s0) = collect(&submit(&sched, &prompts[0], greedy(5)));
    assert_eq!(s0.cached_tokens, 0);
    let rxs: Vec<_> = prompts[1..]
        .iter()
        .map(|p| submit(&sched, p, greedy(5)))
        .collect();
    let mut got = vec![(first, s0)];
    got.extend(rxs.iter().map(collect));
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    // The second takes over the first one's slot (admitted first, with that slot the only one
    // parked) and computes only what follows the common head; the third shares nothing; the
    // fourth may find the second's slot parked or not, depending on which finishes first.
    assert_eq!(got[1].1.cached_tokens, head.len());
    assert_eq!(got[2].1.cached_tokens, 0);
    assert!([0, head.len()].contains(&got[3].1.cached_tokens));
    for (p, (tokens, _)) in prompts.iter().zip(&got) {
        let mut session = Session::new(cpu.clone(), ctx);
        let alone = generate(&mut session, &tok, p, &greedy(5), &mut |_| true)
            .unwrap()
            .tokens;
        assert_eq!(tokens, &alone);
    }
    assert_eq!(net.mapped_prefixes.load(Ordering::SeqCst), 0);
    let widest = net.widest.load(Ordering::SeqCst);
    assert!(widest <= 2, "{widest} sequences in one call");
    assert_eq!(widest, 2, "the three queued requests ran two at a time");
    let st = sched.stats();
    assert!(st.prefix_hits_total >= 1);
    // The budget is the two slots' worst case (256 positions = 4 blocks, +1 each), not bytes.
    assert_eq!(st.kv_blocks.total, 2 * 5);
    assert_eq!(st.kv_blocks.cached, 0);
    assert_eq!(st.requests_processing, 0);
    // Parked caches keep their slots while the scheduler lives; once it is gone, every slot
    // is back in the pool.
    drop(sched);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.free_count() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.free_count(), 2);
}

/// Sequences that run at the same time share a prompt's beginning through a slot-to-slot
/// copy (the backend's `copy_prefix`): the second of two requests with a common head, admitted
/// while the first still decodes, gets the head copied from the first one's slot and computes
/// only the rest; both reply what they reply alone, and every slot comes back.
#[test]
fn a_running_sequences_prefix_is_copied_into_a_new_sequences_slot() {
    let (files, tok) = default_model();
    let ctx = 256;
    let mut net = SlotNet::new(Model::load(&files, 2).unwrap(), 2, ctx, false);
    net.copies_prefixes = true;
    let net = Arc::new(net);
    let pool = net.pool.clone();
    let sched = schedule(&net, &tok, ctx, 2, 4);
    let head = tok
        .encode(
            &"The old lighthouse keeper climbed the stairs. ".repeat(8),
            false,
        )
        .unwrap();
    let with = |s: &str| {
        let mut p = head.clone();
        p.extend(tok.encode(s, false).unwrap());
        p
    };
    let (a, b) = (with(" First"), with(" Then the storm"));
    let rx_a = submit(&sched, &a, greedy(48));
    // A's first token: its prompt is in its slot, and 47 more steps keep it running.
    let mut a_tokens = Vec::new();
    while a_tokens.is_empty() {
        match rx_a.recv_timeout(Duration::from_secs(120)).unwrap() {
            SeqEvent::Piece { token, .. } => a_tokens.extend(token),
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Done(_) => panic!("the first request finished before the second came"),
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
    let (b_tokens, b_sum) = collect(&submit(&sched, &b, greedy(5)));
    let (rest, a_sum) = collect(&rx_a);
    a_tokens.extend(rest);
    assert_eq!(a_sum.cached_tokens, 0);
    assert_eq!(
        b_sum.cached_tokens,
        head.len(),
        "the common head copied from the running sequence"
    );
    assert_eq!(net.copies.load(Ordering::SeqCst), 1);
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    for (p, tokens, n) in [(&a, &a_tokens, 48), (&b, &b_tokens, 5)] {
        let mut session = Session::new(cpu.clone(), ctx);
        let alone = generate(&mut session, &tok, p, &greedy(n), &mut |_| true)
            .unwrap()
            .tokens;
        assert_eq!(tokens, &alone);
    }
    assert!(sched.stats().prefix_hits_total >= 1);
    drop(sched);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.free_count() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.free_count(), 2);
}

/// What one request produced: its tokens and their log-probabilities.
type Reply = (Vec<u32>, Vec<TokenLogprob>);

/// Submits `prompt` asking for the `top` best log-probabilities of every token.
fn submit_top(
    sched: &Scheduler,
    prompt: &[u32],
    options: GenerateOptions,
    top: usize,
) -> mpsc::Receiver<SeqEvent> {
    let (tx, rx) = mpsc::channel();
    sched
        .submit(SeqRequest {
            prompt: prompt.to_vec(),
            options,
            top_logprobs: Some(top),
            keep: None,
            sink: Box::new(move |e| tx.send(e).is_ok()),
        })
        .unwrap();
    rx
}

/// Runs `requests` (options, top_logprobs) together through a scheduler over a `SlotNet`
/// that answers with candidates or not; returns each reply and the net.
fn serve(
    files: &trit::format::ModelFiles,
    tok: &Arc<Tokenizer>,
    prompts: &[Vec<u32>],
    requests: &[(GenerateOptions, usize)],
    candidates: bool,
) -> (Vec<Reply>, Arc<SlotNet>) {
    let ctx = 128;
    let net = Arc::new(SlotNet::new(
        Model::load(files, 2).unwrap(),
        4,
        ctx,
        candidates,
    ));
    let sched = schedule(&net, tok, ctx, 4, 8);
    let rxs: Vec<_> = prompts
        .iter()
        .zip(requests)
        .map(|(p, (opts, top))| submit_top(&sched, p, opts.clone(), *top))
        .collect();
    let replies = rxs
        .iter()
        .map(|rx| {
            let (mut tokens, mut lps) = (Vec::new(), Vec::new());
            loop {
                match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                    SeqEvent::Piece { token, logprob, .. } => {
                        tokens.extend(token);
                        lps.extend(logprob);
                    }
                    SeqEvent::Done(_) => break (tokens, lps),
                    SeqEvent::Prompt { .. } => {}
                    SeqEvent::Error(e) => panic!("unexpected error {e}"),
                }
            }
        })
        .collect();
    (replies, net)
}

/// A device backend that returns each decode row's best candidates instead of its logits
/// gives every sequence the same tokens and log-probabilities as full rows: greedy and seeded
/// sampling with top-k/top-p/min-p/temperature from the candidates, and the settings the
/// candidates cannot honour (top-k 0, penalties) asked for in full.
#[test]
fn candidate_rows_give_the_tokens_and_logprobs_of_full_rows() {
    let (files, tok) = default_model();
    let sampled = |t: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64| GenerateOptions {
        max_tokens: 10,
        sampling: SamplingParams {
            temperature: t,
            top_k,
            top_p,
            min_p,
            penalties: Penalties::default(),
            seed,
            logit_bias: Vec::new(),
            dry: None,
            mirostat: None,
            dynatemp: None,
            truncation: Default::default(),
        },
        stop: vec![],
        eos: vec![],
        constraint: None,
    };
    let mut penalized = sampled(0.0, 0, 1.0, 0.0, 0);
    penalized.sampling.penalties.repetition = 1.3;
    let requests = [
        (greedy(10), 5),
        (sampled(0.8, 40, 0.9, 0.02, 7), 3),
        (sampled(1.2, 20, 1.0, 0.0, 11), 20),
        (sampled(1.0, 0, 0.95, 0.0, 3), 2),
        (penalized, 1),
    ];
    let texts = [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
        "The ocean is",
        "One, two, three,",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    let (full, full_net) = serve(&files, &tok, &prompts, &requests, false);
    let (top, top_net) = serve(&files, &tok, &prompts, &requests, true);
    for (i, (f, t)) in full.iter().zip(&top).enumerate() {
        assert_eq!(f.0.len(), 10, "request {i} ran to max_tokens");
        assert_eq!(f, t, "request {i}: candidates vs full rows");
        assert_eq!(t.1.len(), 10);
        assert!(t.1.iter().all(|l| l.top.len() == requests[i].1));
    }
    // The first three asked for candidates for each token after the first (which comes from
    // the prompt's rows), the other two never (top-k 0, penalties): they asked for full rows
    // (a step where no sequence wants candidates skips `forward_batch_top` altogether).
    let decode_rows = 3 * 9;
    assert_eq!(top_net.top_rows.load(Ordering::SeqCst), decode_rows);
    assert!(top_net.full_rows.load(Ordering::SeqCst) > 0);
    assert_eq!(full_net.top_rows.load(Ordering::SeqCst), decode_rows);
}

/// A device backend without slots (the GPU's single-sequence path): one sequence's keys and
/// values in a CPU cache of the model inside, `forward_top` answered with the row's best
/// candidates, as the GPU's candidate kernel does.
struct TopNet {
    inner: Model,
    cache: Mutex<KvCache>,
    /// Rows answered with candidates / in full (the test keeps the other handles).
    top_rows: Arc<AtomicUsize>,
    full_rows: Arc<AtomicUsize>,
}

impl TopNet {
    /// The inner model's forward at the sequence's position (the caller's cache holds positions
    /// only, like a device backend's).
    fn run(&self, t: &[u32], c: &mut KvCache, w: Logits) -> trit::Result<Vec<f32>> {
        let mut inner = self.cache.lock().unwrap();
        inner.truncate(c.len());
        let out = self.inner.forward(t, &mut inner, w)?;
        c.advance(t.len());
        Ok(out)
    }
}

impl ExternalNet for TopNet {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn forward(&self, t: &[u32], c: &mut KvCache, w: Logits) -> trit::Result<Vec<f32>> {
        self.full_rows.fetch_add(1, Ordering::SeqCst);
        self.run(t, c, w)
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
    fn forward_top(
        &self,
        t: &[u32],
        c: &mut KvCache,
        k: usize,
    ) -> trit::Result<trit::sample::RowLogits> {
        let row = self.run(t, c, Logits::Last)?;
        self.top_rows.fetch_add(1, Ordering::SeqCst);
        Ok(match TopLogits::from_row(&row, k) {
            Some(top) => trit::sample::RowLogits::Top(top),
            None => trit::sample::RowLogits::Full(row),
        })
    }
}

/// `generate` on a backend that answers sampled steps with candidates gives the same tokens and
/// text as the CPU model's full rows — greedy, seeded top-k/top-p sampling — and asks for
/// candidates for every token after the first (which comes from the prompt's full row); a
/// sampler that needs the whole row (top-k 0, penalties) never asks.
#[test]
fn generation_from_candidate_rows_equals_generation_from_full_rows() {
    let (files, tok) = default_model();
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    let inner = Model::load(&files, 2).unwrap();
    let (top_rows, full_rows) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let device = Arc::new(Model::from_external(Box::new(TopNet {
        cache: Mutex::new(inner.new_cache(128)),
        inner,
        top_rows: top_rows.clone(),
        full_rows: full_rows.clone(),
    })));
    let sampled = |top_k: usize, repetition: f32| GenerateOptions {
        max_tokens: 12,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k,
            top_p: 0.95,
            min_p: 0.0,
            penalties: Penalties {
                repetition,
                ..Penalties::default()
            },
            seed: 42,
            logit_bias: Vec::new(),
            dry: None,
            mirostat: None,
            dynatemp: None,
            truncation: Default::default(),
        },
        stop: vec![],
        eos: vec![],
        constraint: None,
    };
    let prompt = tok
        .encode("Once upon a time, in a quiet village,", false)
        .unwrap();
    for (opts, candidates) in [
        (greedy(12), true),
        (sampled(40, 1.0), true),
        (sampled(0, 1.0), false),
        (sampled(40, 1.3), false),
    ] {
        let (top0, full0) = (
            top_rows.load(Ordering::SeqCst),
            full_rows.load(Ordering::SeqCst),
        );
        let run = |m: &Arc<Model>| {
            let mut session = Session::new(m.clone(), 128);
            generate(&mut session, &tok, &prompt, &opts, &mut |_| true).unwrap()
        };
        let (want, got) = (run(&cpu), run(&device));
        assert_eq!(got.tokens, want.tokens, "{:?}", opts.sampling);
        assert_eq!(got.text, want.text);
        assert_eq!(got.tokens.len(), 12);
        let tops = top_rows.load(Ordering::SeqCst) - top0;
        let fulls = full_rows.load(Ordering::SeqCst) - full0;
        if candidates {
            // The prompt in full, then one candidate row per fed-back token.
            assert_eq!((fulls, tops), (1, 11), "{:?}", opts.sampling);
        } else {
            assert_eq!((fulls, tops), (12, 0), "{:?}", opts.sampling);
        }
    }
}

/// A hybrid on a device backend: its state exists only at a sequence's end, so a finished
/// sequence's slot is parked and taken over by a prompt that extends all of its tokens (a chat
/// follow-up re-sent as full history computes only the new turn), and never for a partial match
/// (the stand-in refuses a cut-back slot, as the GPU does). The reused state must give the
/// distribution the whole prompt gives alone on the CPU engine. (Compared as log-probabilities:
/// the random tiny hybrid has near ties, and the batched rows and the chunked prompt sum in
/// another order than a session's steps, so greedy tokens may part after a few steps.)
#[test]
fn a_hybrids_parked_slot_continues_a_prompt_that_extends_it_whole() {
    use trit::format::testgen::hybrid::{generate as generate_hybrid, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let preset = HybridPreset::by_name("tiny-qwen35").unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    generate_hybrid(&preset, 5, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    let ctx = 128;
    let net = Arc::new(SlotNet::new(Model::load(&files, 2).unwrap(), 2, ctx, true));
    let sched = schedule(&net, &tok, ctx, 2, 8);
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    let ids = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7919 + seed * 104_729) % 4000 + 10)
            .collect()
    };
    // The first token's 8 best log-probabilities from the scheduler, and those of a session
    // that reaches `prompt` the same way: `steps` tokens of it generated one at a time after
    // `before` of it as a prompt (the reused history), the rest as the next prompt.
    let check_first = |prompt: &[u32], before: usize, steps: usize| -> SeqSummary {
        let rx = submit_top(&sched, prompt, greedy(1), 8);
        let (mut top, mut summary) = (Vec::new(), None);
        while summary.is_none() {
            match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                SeqEvent::Piece { logprob, .. } => top.extend(logprob.map(|l| l.top)),
                SeqEvent::Done(s) => summary = Some(s),
                SeqEvent::Prompt { .. } => {}
                SeqEvent::Error(e) => panic!("unexpected error {e}"),
            }
        }
        let mut session = Session::new(cpu.clone(), ctx);
        if before > 0 {
            session.prefill(&prompt[..before]).unwrap();
            for &t in &prompt[before..before + steps] {
                session.step(t).unwrap();
            }
        }
        let logits = session.prefill(prompt).unwrap();
        // How far the CPU's own two ways to these logits lie apart (the whole prompt at once
        // against history + steps + rest): the chunked delta rule and the steps round
        // differently, and int8 activations carry that on. On an AVX2 machine this was 0.03,
        // on AVX-512 below 1e-3; a wrong or stale state is off by far more.
        let whole = Session::new(cpu.clone(), ctx).prefill(prompt).unwrap();
        let spread = whole
            .iter()
            .zip(&logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let tol = (2.0 * spread).max(1e-3);
        let max = logits.iter().fold(f32::MIN, |a, &b| a.max(b));
        let log_z = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
        let top = &top[0];
        assert_eq!(top.len(), 8);
        for &(id, lp) in top {
            let want = logits[id as usize] - log_z;
            assert!(
                (lp - want).abs() < tol,
                "token {id}: {lp} against {want} alone (the CPU's two ways differ by {spread})"
            );
        }
        summary.unwrap()
    };
    let first = ids(30, 1);
    let (reply, s0) = collect(&submit(&sched, &first, greedy(6)));
    assert_eq!(s0.cached_tokens, 0);
    // The follow-up: the first prompt, its reply, a new turn. The parked slot holds the prompt
    // and the reply tokens that were fed back (all but the last).
    let mut follow = first.clone();
    follow.extend(&reply);
    follow.extend(ids(8, 2));
    // The reply's last token is sampled but never fed back, so the history holds the rest.
    let s1 = check_first(&follow, first.len(), reply.len() - 1);
    let history = first.len() + reply.len();
    assert_eq!(
        s1.cached_tokens,
        history - 1,
        "of a {history}-token history"
    );
    // Sharing only the first 20 tokens with a parked history: computed from the start.
    let mut partial = first[..20].to_vec();
    partial.extend(ids(15, 3));
    assert_eq!(check_first(&partial, 0, 0).cached_tokens, 0);
    assert!(sched.stats().prefix_hits_total >= 1);
    assert_eq!(check_first(&first, 0, 0).cached_tokens, 0);
}
