//! Continuous batching: a batched forward gives every sequence the logits it would get alone,
//! and the scheduler (several sequences decoding together, prefix reuse between requests,
//! cancellation) produces what the single-sequence generation loop produces.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use trit::engine::{
    generate, FinishReason, GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest,
    SeqSummary, Session,
};
use trit::model::{BatchSeq, Logits, Model};
use trit::sample::SamplingParams;
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
    let history: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314];
    let prompt_b: Vec<u32> = vec![1, 1073, 2386, 253, 1012, 28, 411];
    let next_a: Vec<u32> = vec![1345];
    let prompt_c: Vec<u32> = vec![42];

    // Alone: A continues after its history, B and C start from empty caches.
    let mut alone = Vec::new();
    let mut cache_a = model.new_cache(64);
    model.forward(&history, &mut cache_a, Logits::Last).unwrap();
    alone.push(model.forward(&next_a, &mut cache_a, Logits::Last).unwrap());
    let mut cache_b = model.new_cache(64);
    alone.push(model.forward(&prompt_b, &mut cache_b, Logits::All).unwrap());
    let mut cache_c = model.new_cache(64);
    alone.push(
        model
            .forward(&prompt_c, &mut cache_c, Logits::Last)
            .unwrap(),
    );

    // Together, in one call.
    let mut ca = model.new_cache(64);
    model.forward(&history, &mut ca, Logits::Last).unwrap();
    let (mut cb, mut cc) = (model.new_cache(64), model.new_cache(64));
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
    assert_eq!((ca.len(), cb.len(), cc.len()), (7, 7, 1));

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
    assert_eq!((ca.len(), cb.len()), (7, 7));
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        eos: vec![],
    }
}

/// Submits a request whose events arrive on the returned channel.
fn submit(s: &Scheduler, prompt: &[u32], opts: GenerateOptions) -> mpsc::Receiver<SeqEvent> {
    let (tx, rx) = mpsc::channel();
    s.submit(SeqRequest {
        prompt: prompt.to_vec(),
        options: opts,
        top_logprobs: None,
        sink: Box::new(move |e| tx.send(e).is_ok()),
    })
    .unwrap();
    rx
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
            prefix_cache_bytes: 0,
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
            sink: Box::new(move |e| matches!(e, SeqEvent::Piece { .. }) && tx.send(()).is_ok()),
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
}

fn scheduler_with_store(model: &Arc<Model>, tok: &Arc<Tokenizer>, bytes: usize) -> Scheduler {
    Scheduler::start(
        model.clone(),
        tok.clone(),
        SchedulerConfig {
            n_ctx: 256,
            parallel: 1,
            max_queue: 4,
            prefix_cache_bytes: bytes,
        },
    )
    .unwrap()
}

#[test]
fn prefix_store_keeps_conversations_beyond_the_slots_under_a_budget() {
    let _level = level_lock();
    let (model, tok) = default_model();
    let text = |s: &str| tok.encode(&s.repeat(4), false).unwrap();
    let a = text("The old lighthouse keeper climbed the stairs every night. ");
    let b = text("Prices of wheat rose sharply after the dry summer of that year. ");
    let c = text("Software engineers often argue about tabs and spaces in code. ");
    assert!(a.len() >= 40 && b.len() >= 40 && c.len() >= 40);
    let follow = |p: &[u32]| {
        let mut f = p.to_vec();
        f.extend(tok.encode(" And then?", false).unwrap());
        f
    };

    // One slot: B takes the slot from A, yet A's follow-up reuses A's keys/values.
    let sched = scheduler_with_store(&model, &tok, 64 << 20);
    collect(&submit(&sched, &a, greedy(4)));
    collect(&submit(&sched, &b, greedy(4)));
    let entry_bytes = sched.stats().prefix_cache_bytes;
    assert_eq!(sched.stats().prefix_cache_entries, 1);
    let (tokens, text_out, s) = collect(&submit(&sched, &follow(&a), greedy(6)));
    assert_eq!(s.cached_tokens, a.len());
    // Same reply as a cold evaluation of the whole prompt.
    let mut session = Session::new(model.clone(), 256);
    let cold = generate(&mut session, &tok, &follow(&a), &greedy(6), &mut |_| true).unwrap();
    assert_eq!((tokens, text_out), (cold.tokens, cold.text));

    // Room for one entry: the least recently used one goes.
    let sched = scheduler_with_store(&model, &tok, entry_bytes * 3 / 2);
    for p in [&a, &b, &c] {
        collect(&submit(&sched, p, greedy(4)));
    }
    assert_eq!(sched.stats().prefix_cache_entries, 1);
    assert!(sched.stats().prefix_cache_bytes <= entry_bytes * 3 / 2);
    let (_, _, s) = collect(&submit(&sched, &follow(&b), greedy(2)));
    assert_eq!(s.cached_tokens, b.len(), "B was kept");
    let (_, _, s) = collect(&submit(&sched, &follow(&a), greedy(2)));
    assert_eq!(s.cached_tokens, 0, "A was evicted");

    // No budget: only what the slot holds.
    let sched = scheduler_with_store(&model, &tok, 0);
    collect(&submit(&sched, &a, greedy(4)));
    collect(&submit(&sched, &b, greedy(4)));
    let (_, _, s) = collect(&submit(&sched, &follow(&a), greedy(2)));
    assert_eq!(s.cached_tokens, 0);
    assert_eq!(sched.stats().prefix_cache_entries, 0);
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
    use trit::format::testgen::hybrid::{generate as gen_model, HybridPreset};
    use trit::format::testgen::{OutFormat, TokenizerAssets};
    let dir = tempfile::tempdir().unwrap();
    let preset = HybridPreset::by_name("tiny-qwen35").unwrap();
    gen_model(
        &preset,
        0,
        dir.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let files = trit::format::open(&dir.path().join("mlx")).unwrap();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    let model = Arc::new(Model::load(&files, 2).unwrap());
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
            prefix_cache_bytes: 1 << 20,
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
