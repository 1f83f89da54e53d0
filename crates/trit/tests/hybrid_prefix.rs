//! Prefix reuse for hybrid (Qwen3.5) models through the serving scheduler: a follow-up request
//! resumes from a saved recurrent state plus the cached attention blocks, evaluates only the
//! tokens after the saved position, and produces what a fresh single-sequence run produces.
//!
//! Exact kernels: the scheduler and a session split a prompt into different forward calls, and
//! int8 activations can flip a near-tie of this random model's logits.

mod common;
use common::greedy;

use std::sync::mpsc;
use std::sync::Arc;
use trit::engine::{generate, Scheduler, SchedulerConfig, SeqRequest, SeqSummary, Session};
use trit::kernels::{set_level, KernelLevel};
use trit::model::Model;
use trit::tokenizer::Tokenizer;

/// The placeholder tokenizer has no `<|im_start|>`: `<t5>` plays the turn-start token.
const TURN: u32 = 5;
const END: u32 = 6;

/// The tiny hybrid, run with the exact kernels.
fn tiny_hybrid() -> (tempfile::TempDir, Arc<Model>, Arc<Tokenizer>) {
    set_level(KernelLevel::Reference).unwrap();
    common::tiny_hybrid()
}

fn scheduler(model: &Arc<Model>, tok: &Arc<Tokenizer>, kv_bytes: usize) -> Scheduler {
    let config = SchedulerConfig {
        n_ctx: 512,
        parallel: 2,
        max_queue: 4,
        kv_cache_bytes: kv_bytes,
        context_shift: None,
        draft: None,
    };
    Scheduler::start_with_turn_start(model.clone(), tok.clone(), config, Some(TURN)).unwrap()
}

/// Runs `prompt` to completion: (tokens, summary).
fn run(s: &Scheduler, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, SeqSummary) {
    let (tx, rx) = mpsc::channel();
    s.submit(SeqRequest {
        prompt: prompt.to_vec(),
        options: greedy(max_tokens),
        top_logprobs: None,
        keep: None,
        sink: Box::new(move |e| tx.send(e).is_ok()),
    })
    .unwrap();
    common::collect(&rx)
}

fn alone(model: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut session = Session::new(model.clone(), 512);
    generate(&mut session, tok, prompt, &greedy(n), &mut |_| true)
        .unwrap()
        .tokens
}

/// A ChatML-shaped turn: TURN, role, body…, END.
fn turn(role: u32, body: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut t = vec![TURN, role];
    t.extend(body);
    t.push(END);
    t
}

/// System + user turns (longer than one 64-position block) and a generation prompt of
/// TURN, assistant, "think" — as Qwen3.5 renders it with thinking on.
fn first_prompt() -> (Vec<u32>, usize) {
    let mut p = turn(7, (100..170).map(|i| i % 4000));
    p.extend(turn(8, (300..340).map(|i| i % 4000)));
    let turn_start = p.len();
    p.extend([TURN, 9, 10]);
    (p, turn_start)
}

#[test]
fn a_hybrid_follow_up_computes_only_what_follows_a_saved_state() {
    let (_dir, model, tok) = tiny_hybrid();
    let sched = scheduler(&model, &tok, 64 << 20);
    let (p1, turn_start) = first_prompt();
    let (r1, s1) = run(&sched, &p1, 8);
    assert_eq!(s1.cached_tokens, 0);
    assert_eq!(r1, alone(&model, &tok, &p1, 8));
    let st = sched.stats().kv_blocks;
    assert_eq!(st.states, 2, "turn-start and end states: {st:?}");
    assert_eq!(st.used, 0);

    // The chat's next turn as the template re-renders it: the earlier assistant turn without
    // its thinking marker, then a new user turn. Only the part after the previous prompt's
    // turn start is evaluated.
    let mut p2 = p1[..turn_start].to_vec();
    p2.extend(turn(9, r1.iter().copied()));
    p2.extend(turn(8, 500..520));
    p2.extend([TURN, 9, 10]);
    let (r2, s2) = run(&sched, &p2, 8);
    assert_eq!(s2.cached_tokens, turn_start);
    assert_eq!(r2, alone(&model, &tok, &p2, 8));

    // A continuation of the exact tokens (prompt + reply; the last sampled token was never fed)
    // resumes at the end of the first sequence.
    let mut p3 = p1.clone();
    p3.extend(&r1);
    p3.extend([11, 12, 13]);
    let (r3, s3) = run(&sched, &p3, 6);
    assert_eq!(s3.cached_tokens, p1.len() + r1.len() - 1);
    assert_eq!(r3, alone(&model, &tok, &p3, 6));

    // Sharing only part of a saved prefix: no state there, so everything is computed.
    let mut p4 = p1[..100].to_vec();
    p4.extend([20, 21, 22]);
    let (r4, s4) = run(&sched, &p4, 6);
    assert_eq!(s4.cached_tokens, 0);
    assert_eq!(r4, alone(&model, &tok, &p4, 6));

    // The same prompt again resumes at its turn start.
    let (r5, s5) = run(&sched, &p2, 8);
    assert_eq!(s5.cached_tokens, p2.len() - 3);
    assert_eq!(r5, r2);
    let st = sched.stats();
    assert_eq!(st.kv_blocks.used, 0);
    assert!(st.prefix_hits_total >= 3);
}

/// Saved states count against the KV budget: a budget smaller than one state keeps none (and
/// every request is computed in full); a budget with room for one state keeps the most recent
/// and evicts the older one with LRU order; outputs never change.
#[test]
fn hybrid_states_fit_the_kv_budget_and_are_evicted() {
    let (_dir, model, tok) = tiny_hybrid();
    let (p1, turn_start) = first_prompt();
    let expected = alone(&model, &tok, &p1, 8);
    // Units of one state, read from a roomy scheduler.
    let probe = scheduler(&model, &tok, 64 << 20);
    run(&probe, &p1, 8);
    let st = probe.stats().kv_blocks;
    let (block, units) = (st.block_bytes, st.state_blocks / st.states);
    assert!(units > 4, "a state is bigger than a few blocks: {st:?}");
    drop(probe);

    // Room for a request's blocks but not for a state.
    let small = scheduler(&model, &tok, (units - 1) * block);
    for _ in 0..2 {
        let (r, s) = run(&small, &p1, 8);
        assert_eq!(r, expected);
        assert_eq!(s.cached_tokens, 0);
        let st = small.stats().kv_blocks;
        assert_eq!((st.states, st.state_blocks, st.used), (0, 0, 0));
        assert!(st.cached <= st.total);
    }

    // Room for one state next to the blocks: the turn-start state (saved last) stays, so the
    // regenerated prompt resumes there.
    let one = scheduler(&model, &tok, (units + 6) * block);
    let (r, _) = run(&one, &p1, 8);
    assert_eq!(r, expected);
    let st = one.stats().kv_blocks;
    assert_eq!(st.states, 1, "{st:?}");
    assert!(st.state_blocks + st.cached <= st.total, "{st:?}");
    let (r, s) = run(&one, &p1, 8);
    assert_eq!(r, expected);
    assert_eq!(s.cached_tokens, turn_start);
    // Another conversation takes the budget; the old state goes, results stay exact.
    let other: Vec<u32> = turn(8, 1000..1150);
    let (r, s) = run(&one, &other, 8);
    assert_eq!(s.cached_tokens, 0);
    assert_eq!(r, alone(&model, &tok, &other, 8));
    let (r, s) = run(&one, &p1, 8);
    assert_eq!(r, expected);
    assert_eq!(s.cached_tokens, 0, "p1's state was evicted");
    let st = one.stats().kv_blocks;
    assert!(st.states <= 1 && st.state_blocks + st.cached <= st.total);
    assert_eq!(st.used, 0);
}
