//! Continuous batching: a batched forward gives every sequence the logits it would get alone,
//! and the scheduler (several sequences decoding together, prefix reuse between requests,
//! cancellation) produces what the single-sequence generation loop produces.

mod common;
use common::{greedy, submit};

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use trit::engine::{
    generate, FinishReason, Scheduler, SchedulerConfig, SeqEvent, SeqRequest, SeqSummary, Session,
};
use trit::model::{BatchSeq, Logits, Model};
use trit::tokenizer::Tokenizer;

/// The kernel level is process-wide: the hybrid test switches to the exact kernels, so every
/// test in this file holds this lock while it runs.
static LEVEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn level_lock() -> std::sync::MutexGuard<'static, ()> {
    LEVEL.lock().unwrap_or_else(|e| e.into_inner())
}

fn default_model() -> (Arc<Model>, Arc<Tokenizer>) {
    let dir = common::repo_root().join("models/default");
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .expect("the default model is committed");
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    (Arc::new(Model::load(&files, 2).unwrap()), Arc::new(tok))
}

#[test]
fn batched_logits_equal_single_sequence_logits() {
    let _level = level_lock();
    let (model, _) = default_model();
    // Longer than one 64-position KV block, so attention reads across a block boundary.
    let history: Vec<u32> = (0..70u32).map(|i| 1 + (i * 37 + 504) % 4000).collect();
    let prompt_b: Vec<u32> = vec![1, 1073, 2386, 253, 1012, 28, 411];
    let next_a: Vec<u32> = vec![1345];
    let prompt_c: Vec<u32> = vec![42];

    // Alone: A continues after its history, B and C start from empty caches.
    let mut alone = Vec::new();
    let mut cache_a = model.new_cache(128);
    model.forward(&history, &mut cache_a, Logits::Last).unwrap();
    alone.push(model.forward(&next_a, &mut cache_a, Logits::Last).unwrap());
    let mut cache_b = model.new_cache(128);
    alone.push(model.forward(&prompt_b, &mut cache_b, Logits::All).unwrap());
    let mut cache_c = model.new_cache(128);
    alone.push(
        model
            .forward(&prompt_c, &mut cache_c, Logits::Last)
            .unwrap(),
    );

    // Together, in one call.
    let mut ca = model.new_cache(128);
    model.forward(&history, &mut ca, Logits::Last).unwrap();
    let (mut cb, mut cc) = (model.new_cache(128), model.new_cache(128));
    let together = model
        .forward_batch(&mut [
            BatchSeq {
                tokens: &next_a,
                cache: &mut ca,
                logits: Logits::Last,
            },
            BatchSeq {
                tokens: &prompt_b,
                cache: &mut cb,
                logits: Logits::All,
            },
            BatchSeq {
                tokens: &prompt_c,
                cache: &mut cc,
                logits: Logits::Last,
            },
        ])
        .unwrap();
    let vocab = model.config().vocab;
    assert_eq!(together.len(), 3);
    assert_eq!(together[1].len(), prompt_b.len() * vocab);
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(a.len(), b.len());
        let diff = common::max_abs_diff(a, b);
        assert!(diff < 1e-4, "batched logits differ by {diff}");
    }
    assert_eq!((ca.len(), cb.len(), cc.len()), (history.len() + 1, 7, 1));

    // A bad sequence refuses the whole batch before anything is computed.
    let bad = vec![vocab as u32];
    let err = model.forward_batch(&mut [
        BatchSeq {
            tokens: &next_a,
            cache: &mut ca,
            logits: Logits::Last,
        },
        BatchSeq {
            tokens: &bad,
            cache: &mut cb,
            logits: Logits::Last,
        },
    ]);
    assert!(err.is_err());
    assert_eq!((ca.len(), cb.len()), (history.len() + 1, 7));
}

/// Collects a sequence's tokens and summary (bounded wait).
fn collect(rx: &mpsc::Receiver<SeqEvent>) -> (Vec<u32>, String, SeqSummary) {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SeqEvent::Piece { token, text: t, .. } => {
                tokens.extend(token);
                text.push_str(&t);
            }
            SeqEvent::Done(s) => return (tokens, text, s),
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

#[test]
fn scheduler_decodes_together_like_alone_and_reuses_prefixes() {
    let _level = level_lock();
    let (model, tok) = default_model();
    let p1 = tok.encode("The capital of France is", false).unwrap();
    let p2 = tok
        .encode("Once upon a time, in a land far away,", false)
        .unwrap();
    let mut expected = Vec::new();
    for p in [&p1, &p2] {
        let mut session = Session::new(model.clone(), 256);
        let g = generate(&mut session, &tok, p, &greedy(10), &mut |_| true).unwrap();
        expected.push((g.tokens, g.text));
    }

    let sched = Scheduler::start(
        model.clone(),
        tok.clone(),
        SchedulerConfig {
            n_ctx: 256,
            parallel: 2,
            max_queue: 4,
            kv_cache_bytes: 64 << 20,
            context_shift: None,
            draft: None,
        },
    )
    .unwrap();
    let (r1, r2) = (
        submit(&sched, &p1, greedy(10)),
        submit(&sched, &p2, greedy(10)),
    );
    let (t1, text1, s1) = collect(&r1);
    let (t2, text2, s2) = collect(&r2);
    assert_eq!((t1.clone(), text1), expected[0]);
    assert_eq!((t2, text2), expected[1]);
    assert_eq!(s1.finish, FinishReason::Length);
    assert_eq!((s1.prompt_tokens, s1.completion_tokens), (p1.len(), 10));
    assert_eq!(s2.cached_tokens, 0);
    assert!(
        sched.stats().n_decode_total < 20 + 2,
        "sequences were not batched"
    );

    // A follow-up that extends the first conversation reuses its keys/values.
    let mut p3 = p1.clone();
    p3.extend(&t1);
    p3.extend(tok.encode(" And the capital of Italy is", false).unwrap());
    let (_, _, s3) = collect(&submit(&sched, &p3, greedy(3)));
    assert_eq!(s3.cached_tokens, p1.len() + t1.len() - 1);

    // A listener that goes away cancels its sequence and frees the slot.
    let (tx, rx) = mpsc::channel();
    sched
        .submit(SeqRequest {
            prompt: p2.clone(),
            options: greedy(200),
            top_logprobs: None,
            keep: None,
            sink: Box::new(move |e| !matches!(e, SeqEvent::Piece { .. }) || tx.send(()).is_ok()),
        })
        .unwrap();
    rx.recv_timeout(Duration::from_secs(120)).unwrap();
    drop(rx);
    let mut freed = false;
    for _ in 0..600 {
        if sched.stats().requests_processing == 0 {
            freed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(freed, "the cancelled sequence still runs");
    assert!(sched.stats().tokens_predicted_total < 10 + 10 + 3 + 200);
    assert_eq!(sched.stats().kv_blocks.used, 0, "its blocks are not in use");
}

fn scheduler_with_budget(model: &Arc<Model>, tok: &Arc<Tokenizer>, bytes: usize) -> Scheduler {
    Scheduler::start(
        model.clone(),
        tok.clone(),
        SchedulerConfig {
            n_ctx: 256,
            parallel: 2,
            max_queue: 4,
            kv_cache_bytes: bytes,
            context_shift: None,
            draft: None,
        },
    )
    .unwrap()
}

/// Bytes of one KV block of the default model (30 layers, 3 KV heads × 64, 64 positions) in
/// the default cache types: keys and values in f16, 2 bytes each.
const BLOCK_BYTES: usize = 30 * 64 * 3 * 64 * (2 + 2);

/// `n` token ids of ordinary text (a prompt longer than a few KV blocks).
fn text_tokens(tok: &Tokenizer, seed: &str, n: usize) -> Vec<u32> {
    let mut t = tok.encode(&seed.repeat(n / 4 + 1), false).unwrap();
    t.truncate(n);
    assert_eq!(t.len(), n);
    t
}

fn alone(model: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut session = Session::new(model.clone(), 256);
    generate(&mut session, tok, prompt, &greedy(n), &mut |_| true)
        .unwrap()
        .tokens
}

/// Two requests with a common 128-token prefix, running together after a first request left
/// it cached: both map the same two blocks (counted once in use), and both produce what a
/// fresh single-sequence run produces.
#[test]
fn requests_with_a_common_prefix_share_kv_blocks() {
    let _level = level_lock();
    let (model, tok) = default_model();
    let common_part = text_tokens(&tok, "The old lighthouse keeper climbed the stairs. ", 128);
    let with = |suffix: &str| {
        let mut p = common_part.clone();
        p.extend(tok.encode(suffix, false).unwrap());
        p
    };
    let (a, b, c) = (
        with(" First"),
        with(" Then the storm"),
        with(" Later, at dawn,"),
    );
    let sched = scheduler_with_budget(&model, &tok, 64 << 20);
    let (ta, _, sa) = collect(&submit(&sched, &a, greedy(4)));
    assert_eq!(sa.cached_tokens, 0);
    assert_eq!(ta, alone(&model, &tok, &a, 4));

    // B's listener holds the scheduler at C's first token, so the test reads the pool while
    // both run (C joins B in the same step or one later; B decodes 12 tokens).
    let (seen_tx, seen_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let rb = submit(&sched, &b, greedy(12));
    let (tx, rc) = mpsc::channel();
    let mut paused = false;
    sched
        .submit(SeqRequest {
            prompt: c.clone(),
            options: greedy(6),
            top_logprobs: None,
            keep: None,
            sink: Box::new(move |e| {
                if matches!(e, SeqEvent::Piece { .. }) && !paused {
                    paused = true;
                    let _ = seen_tx.send(());
                    let _ = go_rx.recv_timeout(Duration::from_secs(60));
                }
                tx.send(e).is_ok()
            }),
        })
        .unwrap();
    seen_rx.recv_timeout(Duration::from_secs(120)).unwrap();
    let st = sched.stats();
    assert_eq!(st.requests_processing, 2, "B still runs");
    let own = |p: &[u32]| p.len().div_ceil(64);
    // Each needs its own tail block(s); the two prefix blocks are shared, not duplicated.
    assert!(
        st.kv_blocks.used <= own(&b) + own(&c) - 2 + 1,
        "blocks in use: {:?}",
        st.kv_blocks
    );
    go_tx.send(()).unwrap();
    let (tb, _, sb) = collect(&rb);
    let (tc, _, sc) = collect(&rc);
    assert_eq!((sb.cached_tokens, sc.cached_tokens), (128, 128));
    assert_eq!(tb, alone(&model, &tok, &b, 12));
    assert_eq!(tc, alone(&model, &tok, &c, 6));
    // Nothing is in use once they are done; their blocks stay cached for reuse.
    let st = sched.stats();
    assert_eq!(st.kv_blocks.used, 0);
    assert!(st.kv_blocks.cached >= 2);
    assert!(st.prefix_hits_total >= 2);
}

/// A budget of 4 blocks (one 150-token request's worst case): every request still gets the
/// output it gets alone, cached blocks of older prompts are evicted to make room, and a
/// prompt whose blocks were evicted is simply recomputed.
#[test]
fn a_tiny_kv_budget_evicts_old_prefixes_and_stays_correct() {
    let _level = level_lock();
    let (model, tok) = default_model();
    let sched = scheduler_with_budget(&model, &tok, 4 * BLOCK_BYTES);
    assert_eq!(sched.stats().kv_blocks.total, 4);
    let prompts: Vec<Vec<u32>> = [
        "The old lighthouse keeper climbed the stairs every night. ",
        "Prices of wheat rose sharply after the dry summer of that year. ",
        "Software engineers often argue about tabs and spaces in code. ",
    ]
    .iter()
    .map(|s| text_tokens(&tok, s, 150))
    .collect();
    for p in &prompts {
        let (t, _, s) = collect(&submit(&sched, p, greedy(4)));
        assert_eq!(s.cached_tokens, 0);
        assert_eq!(t, alone(&model, &tok, p, 4));
        let st = sched.stats().kv_blocks;
        assert_eq!(st.used, 0);
        assert!(st.cached <= 4);
    }
    // Two at once: the second waits until the first's blocks are back (the budget holds one
    // worst case), then both give what they give alone.
    let (r0, r1) = (
        submit(&sched, &prompts[0], greedy(4)),
        submit(&sched, &prompts[1], greedy(4)),
    );
    assert_eq!(collect(&r0).0, alone(&model, &tok, &prompts[0], 4));
    assert_eq!(collect(&r1).0, alone(&model, &tok, &prompts[1], 4));
    for p in &prompts[2..] {
        collect(&submit(&sched, p, greedy(4)));
    }
    // The most recent prompt is still cached, the first was evicted.
    let (t, _, s) = collect(&submit(&sched, &prompts[2], greedy(3)));
    assert!(s.cached_tokens >= 128, "{}", s.cached_tokens);
    assert_eq!(t, alone(&model, &tok, &prompts[2], 3));
    let (t, _, s) = collect(&submit(&sched, &prompts[0], greedy(3)));
    assert_eq!(s.cached_tokens, 0);
    assert_eq!(t, alone(&model, &tok, &prompts[0], 3));
    // A request whose worst case exceeds the whole budget is refused with a clear error.
    let rx = submit(&sched, &prompts[1], greedy(240));
    match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
        SeqEvent::Error(e) => assert!(e.to_string().contains("KV cache budget"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A listener that goes away while its long prompt is still being read cancels the sequence
/// after the prompt chunk in progress: the rest of the prompt is never evaluated and its blocks
/// are no longer in use.
#[test]
fn a_listener_leaving_during_the_prompt_cancels_within_a_step() {
    let _level = level_lock();
    let (model, tok) = default_model();
    let sched = Scheduler::start(
        model.clone(),
        tok.clone(),
        SchedulerConfig {
            n_ctx: 2048,
            parallel: 2,
            max_queue: 4,
            kv_cache_bytes: 128 << 20,
            context_shift: None,
            draft: None,
        },
    )
    .unwrap();
    // 1,500 tokens: three 512-token prompt steps.
    let prompt = text_tokens(&tok, "A long document about the history of bridges. ", 1500);
    let (tx, rx) = mpsc::channel();
    let mut events = 0;
    sched
        .submit(SeqRequest {
            prompt,
            options: greedy(4),
            top_logprobs: None,
            keep: None,
            sink: Box::new(move |e| {
                events += 1;
                // Gone after the admission check and the first prompt chunk's event.
                let stay = events < 2;
                let _ = tx.send(e);
                stay
            }),
        })
        .unwrap();
    let mut done = None;
    while let Ok(e) = rx.recv_timeout(Duration::from_secs(120)) {
        if let SeqEvent::Done(s) = e {
            done = Some(s);
            break;
        }
    }
    let s = done.expect("a summary");
    assert_eq!(s.finish, FinishReason::Cancelled);
    assert_eq!(s.completion_tokens, 0);
    let st = sched.stats();
    assert_eq!(
        st.prompt_tokens_total, 512,
        "one prompt step ran, not three"
    );
    assert_eq!(st.kv_blocks.used, 0);
    assert_eq!(st.requests_processing, 0);
    assert_eq!(st.cancelled_total, 1);
}

/// A hybrid (Qwen3.5) model through the scheduler: its sequences run one after another inside
/// a step, and a follow-up whose prompt diverges inside the cached part must roll the
/// recurrent state back (not reuse keys/values past the divergence) — so every reply must
/// equal what a fresh single-sequence run produces. Exact kernels: the scheduler and a session
/// split a prompt into different forward calls, and int8 activations can flip a near-tie of
/// this random model's logits.
#[test]
fn scheduler_runs_hybrid_models_like_alone() {
    use trit::kernels::{best_level, set_level, KernelLevel};
    let _level = level_lock();
    set_level(KernelLevel::Reference).unwrap();
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            set_level(best_level()).unwrap();
        }
    }
    let _restore = Restore;
    let (_dir, model, tok) = common::tiny_hybrid();
    let p1: Vec<u32> = (10..30).collect();
    let p2: Vec<u32> = (40..52).collect();
    // Shares p1's first 12 tokens, then diverges inside what the slot holds.
    let p3: Vec<u32> = (10..22).chain(60..70).collect();
    let alone = |p: &[u32]| {
        let mut session = Session::new(model.clone(), 128);
        generate(&mut session, &tok, p, &greedy(8), &mut |_| true)
            .unwrap()
            .tokens
    };
    let expected: Vec<Vec<u32>> = [&p1, &p2, &p3].iter().map(|p| alone(p)).collect();
    let sched = Scheduler::start(
        model.clone(),
        tok.clone(),
        SchedulerConfig {
            n_ctx: 128,
            parallel: 2,
            max_queue: 4,
            kv_cache_bytes: 16 << 20,
            context_shift: None,
            draft: None,
        },
    )
    .unwrap();
    let (r1, r2) = (
        submit(&sched, &p1, greedy(8)),
        submit(&sched, &p2, greedy(8)),
    );
    assert_eq!(collect(&r1).0, expected[0]);
    assert_eq!(collect(&r2).0, expected[1]);
    assert_eq!(collect(&submit(&sched, &p3, greedy(8))).0, expected[2]);
}
