//! Context shift (`generate_shifting`, `trit run --context-shift`): a generation that fills
//! the context keeps its first `keep` tokens and the newer half of the rest, reads them again,
//! and goes on. Every produced token must be the pick a fresh model makes after exactly the
//! window the engine kept — for the dense default model and for the tiny hybrid, whose
//! recurrent state has to be rebuilt from the kept tokens.

mod common;
use common::greedy;

use std::sync::Arc;
use trit::engine::{generate, generate_shifting, ContextShift, FinishReason, Session};
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

    let mut window = prompt.to_vec();
    for (i, &t) in g.tokens.iter().enumerate() {
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
            assert!(window.len() < n_ctx && window.len() > keep);
        }
        window.push(t);
    }
    assert_eq!(
        window[..window.len() - 1],
        session.tokens()[..],
        "same final window"
    );
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
