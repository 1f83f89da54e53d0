//! Context shift (`generate_shifting`, `trit run --context-shift`): a generation that fills
//! the context keeps its first `keep` tokens and the newer half of the rest, reads them again,
//! and goes on. Every produced token must be the pick a fresh model makes after exactly the
//! window the engine kept — for the dense default model and for the tiny hybrid, whose
//! recurrent state has to be rebuilt from the kept tokens. The server's scheduler shifts the
//! same way (`SchedulerConfig::context_shift`), with several sequences in one batch.

mod common;
use common::collect;
use common::greedy;

use std::sync::Arc;
use trit::engine::{
    generate, generate_shifting, ContextShift, FinishReason, Scheduler, SchedulerConfig, Session,
};
use trit::kernels::{best_level, set_level, KernelLevel};
use trit::model::{Logits, Model};
use trit::tokenizer::Tokenizer;

/// The kernel level is process-wide: tests that set it take turns.
static LEVEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Greedy generation of `n` tokens after `prompt` in a context of `n_ctx`, shifting with
/// `keep`; then a replay that feeds each window the engine must have seen to a fresh cache and
/// checks the engine's token is that window's greedy pick (or within 1e-3 of it: a fresh
/// prompt pass and the engine's incremental steps may sum in other orders).
fn check_shifting(model: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n_ctx: usize, keep: usize) {
    let n = n_ctx + 2 * (n_ctx - keep);
    let mut session = Session::new(model.clone(), n_ctx);
    let shift = ContextShift { keep };
    let g = generate_shifting(
        &mut session,
        tok,
        prompt,
        &greedy(n),
        Some(shift),
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(g.tokens.len(), n, "generation went past the context");
    assert_eq!(g.finish, FinishReason::Length);
    // Each shift frees half of what follows the kept tokens.
    assert!(g.shifts >= 3, "{} shifts", g.shifts);
    assert!(g.shift_tokens > 0);
    assert!(session.tokens().len() <= n_ctx);
    assert_eq!(&session.tokens()[..keep], &prompt[..keep], "the kept start");

    let end = assert_kept_windows(model, prompt, &g.tokens, n_ctx, shift);
    assert_eq!(end, session.tokens(), "same final window");
}

/// Replays a shifting generation: feeds each window the engine must have seen to a fresh
/// cache and checks that the engine's token is that window's greedy pick (or within 1e-3 of
/// it: a fresh prompt pass and the engine's incremental steps may sum in other orders).
/// Returns the final window (the tokens the engine's cache must hold).
fn assert_kept_windows(
    model: &Arc<Model>,
    prompt: &[u32],
    tokens: &[u32],
    n_ctx: usize,
    shift: ContextShift,
) -> Vec<u32> {
    let mut window = prompt.to_vec();
    for (i, &t) in tokens.iter().enumerate() {
        let mut cache = model.new_cache(n_ctx);
        let row = model.forward(&window, &mut cache, Logits::Last).unwrap();
        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!(
            row[t as usize] >= best - 1e-3,
            "token {i} ({t}) is not the greedy pick after its {}-token window",
            window.len()
        );
        if window.len() >= n_ctx {
            window = shift.kept(&window);
            assert!(window.len() < n_ctx && window.len() > shift.keep);
        }
        window.push(t);
    }
    window.pop();
    window
}

#[test]
fn the_kept_window_is_llama_cpps() {
    // n_discard = (n_past - n_keep) / 2: 10 tokens keeping 2 drop the next 4.
    let tokens: Vec<u32> = (0..10).collect();
    assert_eq!(ContextShift { keep: 2 }.kept(&tokens), [0, 1, 6, 7, 8, 9]);
    assert_eq!(ContextShift { keep: 0 }.kept(&tokens[..5]), [2, 3, 4]);
    assert_eq!(ContextShift { keep: 9 }.kept(&tokens), tokens[..]);
}

#[test]
fn a_dense_model_generates_past_its_context_from_the_kept_windows() {
    // The fast kernels (the reference ones take a minute here): a prompt pass and incremental
    // steps quantize each row's activations alike, so only summation order differs.
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(best_level()).unwrap();
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    let prompt = tok
        .encode("The old lighthouse keeper said that", false)
        .unwrap();
    check_shifting(&model, &tok, &prompt, 24, prompt.len());
    check_shifting(&model, &tok, &prompt, 20, 0);
}

#[test]
fn a_hybrid_rebuilds_its_recurrent_state_from_the_kept_windows() {
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let (_dir, model, tok) = common::tiny_hybrid();
    let prompt: Vec<u32> = (0..10).map(|i| 40 + 7 * i).collect();
    check_shifting(&model, &tok, &prompt, 24, 4);
}

#[test]
fn shifting_is_refused_where_it_could_free_nothing_and_off_by_default() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    let prompt = tok.encode("Once upon a time", false).unwrap();
    let mut session = Session::new(model.clone(), 16);
    // Keeping 15 of 16 positions leaves no room for a shift.
    let err = generate_shifting(
        &mut session,
        &tok,
        &prompt,
        &greedy(100),
        Some(ContextShift { keep: 15 }),
        &mut |_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no room"), "{err}");
    // A prompt that does not fit is refused with or without shifting.
    let long: Vec<u32> = prompt.iter().cycle().take(16).copied().collect();
    let shift = Some(ContextShift { keep: 0 });
    assert!(
        generate_shifting(&mut session, &tok, &long, &greedy(4), shift, &mut |_| true).is_err()
    );
    // Without a shift, generation ends at the context's end (or is refused up front).
    assert!(generate(&mut session, &tok, &prompt, &greedy(100), &mut |_| true).is_err());
    let g = generate(
        &mut session,
        &tok,
        &prompt,
        &greedy(16 - prompt.len()),
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(g.shifts, 0);
    assert_eq!(g.finish, FinishReason::Length);
    assert!(session.tokens().len() <= 16);
}

/// A scheduler over `model` in a context of `n_ctx`, shifting with `keep` (capped per prompt).
fn shifting_scheduler(model: &Arc<Model>, tok: &Tokenizer, n_ctx: usize, keep: usize) -> Scheduler {
    let config = SchedulerConfig {
        n_ctx,
        parallel: 4,
        max_queue: 4,
        kv_cache_bytes: 64 << 20,
        context_shift: Some(ContextShift { keep }),
        draft: None,
    };
    Scheduler::start(model.clone(), Arc::new(tok.clone()), config).unwrap()
}

#[test]
fn the_scheduler_shifts_full_sequences_in_a_batch_like_generate() {
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(best_level()).unwrap();
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    let (n_ctx, keep) = (24, 3);
    let s = shifting_scheduler(&model, &tok, n_ctx, keep);
    let a = tok
        .encode("The old lighthouse keeper said that", false)
        .unwrap();
    let b = tok.encode("Once upon a time", false).unwrap();
    // Two sequences decoding together, each shifting several times at its own moments (their
    // prompts differ in length); more tokens than the context holds.
    let n = n_ctx + 2 * (n_ctx - keep);
    let (ra, rb) = (
        common::submit(&s, &a, greedy(n)),
        common::submit(&s, &b, greedy(n)),
    );
    for (prompt, rx) in [(&a, &ra), (&b, &rb)] {
        let (tokens, summary) = collect(rx);
        assert_eq!(tokens.len(), n, "the reply went past the context");
        assert_eq!(summary.finish, FinishReason::Length);
        assert_eq!(summary.completion_tokens, n);
        assert_kept_windows(&model, prompt, &tokens, n_ctx, ContextShift { keep });
    }
    // Again, its prompt's first block from the prefix cache the shifted sequences left.
    let (again, _) = collect(&common::submit(&s, &b, greedy(n)));
    assert_kept_windows(&model, &b, &again, n_ctx, ContextShift { keep });
    // A request's own keep (llama.cpp's n_keep) instead of the scheduler's.
    let (tx, rx) = std::sync::mpsc::channel();
    s.submit(trit::engine::SeqRequest {
        prompt: a.clone(),
        options: greedy(n),
        top_logprobs: None,
        keep: Some(1),
        sink: Box::new(move |e| tx.send(e).is_ok()),
    })
    .unwrap();
    let (own, _) = collect(&rx);
    assert_kept_windows(&model, &a, &own, n_ctx, ContextShift { keep: 1 });
    // A keep larger than the prompt is capped at the prompt.
    let s2 = shifting_scheduler(&model, &tok, n_ctx, 1000);
    let (capped, _) = collect(&common::submit(&s2, &b, greedy(n)));
    assert_eq!(capped.len(), n);
    let whole = ContextShift { keep: b.len() };
    assert_kept_windows(&model, &b, &capped, n_ctx, whole);
}

#[test]
fn the_scheduler_rebuilds_a_hybrids_state_when_it_shifts() {
    let _level = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let (_dir, model, tok) = common::tiny_hybrid();
    let prompt: Vec<u32> = (0..10).map(|i| 40 + 7 * i).collect();
    let (n_ctx, keep) = (24, 4);
    let s = shifting_scheduler(&model, &tok, n_ctx, keep);
    let n = n_ctx + 2 * (n_ctx - keep);
    let (tokens, summary) = collect(&common::submit(&s, &prompt, greedy(n)));
    assert_eq!((tokens.len(), summary.finish), (n, FinishReason::Length));
    assert_kept_windows(&model, &prompt, &tokens, n_ctx, ContextShift { keep });
}

#[test]
fn the_scheduler_ends_at_the_context_where_a_shift_frees_nothing() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    // The whole 15-token prompt kept in a context of 16: no room, so no shift.
    let prompt: Vec<u32> = (0..15).map(|i| 100 + 13 * i).collect();
    let s = shifting_scheduler(&model, &tok, 16, 1000);
    let (tokens, summary) = collect(&common::submit(&s, &prompt, greedy(40)));
    // As without a shift: the token that fills the context, and the one sampled after it.
    assert_eq!((tokens.len(), summary.finish), (2, FinishReason::Length));
    let plain = Scheduler::start(
        model.clone(),
        Arc::new(tok.clone()),
        SchedulerConfig {
            context_shift: None,
            draft: None,
            ..s.config().clone()
        },
    )
    .unwrap();
    let (same, _) = collect(&common::submit(&plain, &prompt, greedy(40)));
    assert_eq!(tokens, same);
}
