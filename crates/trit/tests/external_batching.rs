//! The scheduler over a device backend (`ExternalNet` with KV slots, like the GPU model): at
//! most `max_sequences` run together, the rest wait; no prefix reuse (a cached host block cannot
//! fill a device slot), so a request sharing a prefix with an earlier one computes it in full
//! and gets what it gets alone; every slot is back in its pool once the requests are done.
//!
//! The backend here is a stand-in that keeps each slot's keys/values in a CPU cache of the
//! default model, so its logits are the CPU engine's (tested against mlx-lm and llama.cpp).

mod common;
use common::{greedy, submit};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use trit::engine::{generate, Scheduler, SchedulerConfig, SeqEvent, SeqSummary, Session};
use trit::format::config::ModelConfig;
use trit::model::device_slot::SlotPool;
use trit::model::{BatchSeq, ExternalNet, KvCache, Logits, Model};
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
            c.truncate(s.cache.len());
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

fn collect(rx: &mpsc::Receiver<SeqEvent>) -> (Vec<u32>, SeqSummary) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SeqEvent::Piece { token, .. } => tokens.extend(token),
            SeqEvent::Done(s) => return (tokens, s),
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

#[test]
fn device_backend_runs_at_most_its_slots_without_prefix_reuse_and_returns_every_slot() {
    let (files, tok) = default_model();
    let ctx = 256;
    let pool = Arc::new(SlotPool::new(2));
    let net = Arc::new(SlotNet {
        inner: Model::load(&files, 2).unwrap(),
        pool: pool.clone(),
        slot_caches: Mutex::new((0..2).map(|_| None).collect()),
        ctx,
        widest: AtomicUsize::new(0),
        mapped_prefixes: AtomicUsize::new(0),
    });
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
    }
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
    // The first one alone, so its blocks would be cached for the others on the CPU.
    let (first, s0) = collect(&submit(&sched, &prompts[0], greedy(5)));
    let rxs: Vec<_> = prompts[1..]
        .iter()
        .map(|p| submit(&sched, p, greedy(5)))
        .collect();
    let mut got = vec![(first, s0)];
    got.extend(rxs.iter().map(collect));
    let cpu = Arc::new(Model::load(&files, 2).unwrap());
    for (p, (tokens, summary)) in prompts.iter().zip(&got) {
        assert_eq!(
            summary.cached_tokens, 0,
            "no prefix reuse on a device backend"
        );
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
    // Every retired sequence dropped its cache, and with it its slot.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.free_count() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.free_count(), 2);
    let st = sched.stats();
    assert_eq!(st.prefix_hits_total, 0);
    // The budget is the two slots' worst case (256 positions = 4 blocks, +1 each), not bytes.
    assert_eq!(st.kv_blocks.total, 2 * 5);
    assert_eq!((st.kv_blocks.used, st.kv_blocks.cached), (0, 0));
}
