//! The scheduler's lone sequence on the GPU's device loop over its batched slot
//! (`trit::engine::scheduler` `device_loop.rs`, `greedy.rs`): the same tokens as the
//! scheduler stepping a twin model (the loop switched off) through batched calls, greedy and sampled, with the loop
//! really running on the slot; a request arriving while a loop runs ends it, joins the batch,
//! and both replies equal their solo runs; with `--context-shift` replies run past the context
//! (alone and two at once) with the stepped twin's tokens.
//!
//! Needs an NVIDIA GPU, so every test is `#[ignore]`. Run on a GPU machine:
//!     cargo test --release -p trit-cuda --test gpu_serve_loop -- --ignored --test-threads 1

mod common;
use common::*;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use trit::engine::{
    ContextShift, FinishReason, GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest,
};
use trit::format::ModelFiles;
use trit::model::Model;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;
use trit_cuda::greedy::slot_loops;
use trit_cuda::{CudaModel, CudaOptions};

/// A scheduler over the GPU model; `looping`: with its device loop (else `greedy_loop` is off,
/// so the scheduler takes batched steps — the reference).
fn scheduler(files: &ModelFiles, looping: bool, tok: &Arc<Tokenizer>, ctx: usize) -> Scheduler {
    scheduler_shifting(files, looping, tok, ctx, None)
}

/// The same with `trit serve --context-shift --keep N`'s setting.
fn scheduler_shifting(
    files: &ModelFiles,
    looping: bool,
    tok: &Arc<Tokenizer>,
    ctx: usize,
    context_shift: Option<ContextShift>,
) -> Scheduler {
    let mut opts = CudaOptions::new(ctx);
    opts.greedy_loop = looping;
    let gpu = CudaModel::load(files, &opts).unwrap();
    let config = SchedulerConfig {
        n_ctx: ctx,
        parallel: 4,
        max_queue: 8,
        kv_cache_bytes: 64 << 20,
        context_shift,
        draft: None,
    };
    Scheduler::start(
        Arc::new(Model::from_external(Box::new(gpu))),
        tok.clone(),
        config,
    )
    .unwrap()
}

fn submit(s: &Scheduler, prompt: &[u32], opts: &GenerateOptions) -> mpsc::Receiver<SeqEvent> {
    let (tx, rx) = mpsc::channel();
    s.submit(SeqRequest {
        prompt: prompt.to_vec(),
        options: opts.clone(),
        top_logprobs: None,
        keep: None,
        sink: Box::new(move |e| tx.send(e).is_ok()),
    })
    .unwrap();
    rx
}

/// The reply's tokens and finish; `on_piece` sees the count of tokens so far after each.
fn reply(
    rx: &mpsc::Receiver<SeqEvent>,
    mut on_piece: impl FnMut(usize),
) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            SeqEvent::Piece { token, .. } => {
                tokens.extend(token);
                on_piece(tokens.len());
            }
            SeqEvent::Done(s) => {
                assert_eq!(s.completion_tokens, tokens.len());
                return (tokens, s.finish);
            }
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

fn options(max_tokens: usize, temperature: f32, seed: u64) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_k: 40,
            top_p: 0.95,
            seed,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        eos: Vec::new(),
        constraint: None,
    }
}

fn setup() -> (ModelFiles, Arc<Tokenizer>, Vec<Vec<u32>>) {
    let files = trit::format::open(&default_model_path()).unwrap();
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap());
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
    ]
    .iter()
    .map(|t| tok.encode(t, false).unwrap())
    .collect();
    (files, tok, prompts)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_lone_sequence_decodes_on_the_device_loop_with_the_batched_steps_tokens() {
    if gpu_missing() {
        return;
    }
    let ctx = 160;
    let (files, tok, prompts) = setup();
    let stepped = scheduler(&files, false, &tok, ctx);
    let looping = scheduler(&files, true, &tok, ctx);
    // Greedy, sampled, and a reply longer than one loop (64 tokens) that meets the context.
    let cases = [
        (&prompts[0], options(40, 0.0, 0)),
        (&prompts[1], options(40, 0.8, 7)),
        (&prompts[2], options(400, 0.0, 0)),
    ];
    for (i, (prompt, opts)) in cases.iter().enumerate() {
        let want = reply(&submit(&stepped, prompt, opts), |_| {});
        let loops = slot_loops();
        let got = reply(&submit(&looping, prompt, opts), |_| {});
        assert!(
            slot_loops() > loops,
            "the device loop did not run on the slot"
        );
        assert_eq!(got, want, "temperature {}", opts.sampling.temperature);
        eprintln!("{} tokens equal ({:?})", got.0.len(), got.1);
        if i == 2 {
            // The long reply ends where the context does (a token that cannot be fed back).
            assert_eq!(got.1, FinishReason::Length);
            assert_eq!(got.0.len(), ctx - prompt.len() + 1);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_request_arriving_during_a_loop_joins_the_batch() {
    if gpu_missing() {
        return;
    }
    let ctx = 160;
    let (files, tok, prompts) = setup();
    let (a, b) = (options(60, 0.0, 0), options(20, 0.7, 3));
    let stepped = scheduler(&files, false, &tok, ctx);
    let want_a = reply(&submit(&stepped, &prompts[0], &a), |_| {});
    let want_b = reply(&submit(&stepped, &prompts[1], &b), |_| {});
    drop(stepped);
    let looping = scheduler(&files, true, &tok, ctx);
    let loops = slot_loops();
    let rx_a = submit(&looping, &prompts[0], &a);
    let mut rx_b = None;
    // The second request arrives after A's fifth token: A's loop ends, both step together.
    let got_a = reply(&rx_a, |n| {
        if n == 5 {
            rx_b = Some(submit(&looping, &prompts[1], &b));
        }
    });
    let got_b = reply(&rx_b.expect("submitted"), |_| {});
    assert_eq!(got_a, want_a);
    assert_eq!(got_b, want_b);
    // A's first loop, and another once B finished (A decoded alone again).
    assert!(slot_loops() >= loops + 2, "{} loops", slot_loops() - loops);
}

/// `trit serve --device cuda --context-shift`: a reply of 150 tokens in a context of 64 (four
/// shifts), alone and beside another one. The looping model's lone reply runs device loops
/// between the shifts; every reply equals what the twin stepping batched calls gives (one or
/// two decoding rows run the single step's kernels on their slots, kept windows are read again
/// through the prompt path), and the two at once equal their solo runs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn replies_shift_past_the_context_like_the_stepped_twin() {
    if gpu_missing() {
        return;
    }
    let ctx = 64;
    let (files, tok, prompts) = setup();
    let shift = || Some(ContextShift { keep: 4 });
    let (a, b) = (options(150, 0.0, 0), options(150, 0.8, 5));
    let stepped = scheduler_shifting(&files, false, &tok, ctx, shift());
    let want_a = reply(&submit(&stepped, &prompts[0], &a), |_| {});
    let want_b = reply(&submit(&stepped, &prompts[1], &b), |_| {});
    drop(stepped);
    for (tokens, finish) in [&want_a, &want_b] {
        assert_eq!((tokens.len(), *finish), (150, FinishReason::Length));
    }
    let looping = scheduler_shifting(&files, true, &tok, ctx, shift());
    let loops = slot_loops();
    assert_eq!(reply(&submit(&looping, &prompts[0], &a), |_| {}), want_a);
    assert!(slot_loops() >= loops + 2, "{} loops", slot_loops() - loops);
    let (rx_a, rx_b) = (
        submit(&looping, &prompts[0], &a),
        submit(&looping, &prompts[1], &b),
    );
    assert_eq!(reply(&rx_a, |_| {}), want_a);
    assert_eq!(reply(&rx_b, |_| {}), want_b);
}
