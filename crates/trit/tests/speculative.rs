//! Speculative decoding gives exactly what the target model gives alone — greedy and sampled
//! (same seed), with penalties, stop strings and the token budget — while the draft's tokens
//! cut the number of target passes. Target: SmolLM2-135M-Instruct Q4_1 (PyPI-fetched asset);
//! draft: the ternary default model distilled from it (same vocabulary). The server's
//! scheduler drafts for a sequence that runs alone, with the same replies as without a draft.

mod common;

use common::collect;
use std::sync::Arc;
use trit::engine::{
    check_draft, generate, generate_speculative, Draft, DraftOptions, GenerateOptions, Scheduler,
    SchedulerConfig, Session,
};
use trit::model::Model;
use trit::sample::{Penalties, SamplingParams};
use trit::tokenizer::Tokenizer;

fn load(path: &std::path::Path) -> (Arc<Model>, Tokenizer) {
    let files = trit::format::open(path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    (Arc::new(Model::load(&files, 2).unwrap()), tok)
}

fn default_model() -> std::path::PathBuf {
    common::repo_root().join("models/default/smollm2-135m-ternary-q2_0.gguf")
}

/// The target (SmolLM2 Q4_1, None with a notice when its asset is missing), its tokenizer, the
/// draft (the default model), the end-of-sequence ids and a chat prompt.
#[allow(clippy::type_complexity)]
fn pair() -> Option<(Arc<Model>, Tokenizer, Arc<Model>, Vec<u32>, Vec<u32>)> {
    let Some(target_path) = common::asset("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") else {
        eprintln!("skipped: SmolLM2 Q4_1 asset missing (tools/fetch_assets.sh)");
        return None;
    };
    let (target, tok) = load(&target_path);
    let (draft, _) = load(&default_model());
    let eos = vec![tok.token_id("<|im_end|>").unwrap()];
    let prompt = tok
        .encode("<|im_start|>user\nWrite a short story about a robot who paints.<|im_end|>\n<|im_start|>assistant\n", false)
        .unwrap();
    Some((target, tok, draft, eos, prompt))
}

#[test]
fn drafted_generation_equals_the_targets_own() {
    let Some((target, tok, draft, eos, prompt)) = pair() else {
        return;
    };
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        penalties: Penalties {
            repetition: 1.1,
            ..Penalties::default()
        },
        seed: 11,
        logit_bias: Vec::new(),
        dry: None,
        mirostat: None,
        dynatemp: None,
        truncation: Default::default(),
    };
    let cases = [
        (SamplingParams::greedy(), vec![], 48),
        (sampled, vec![], 48),
        // A stop string and a budget that cut a verified run short.
        (SamplingParams::greedy(), vec!["robot".to_string()], 48),
        (SamplingParams::greedy(), vec![], 7),
    ];
    let mut accepted = 0;
    for (sampling, stop, max_tokens) in cases {
        let opts = GenerateOptions {
            max_tokens,
            sampling,
            stop,
            eos: eos.clone(),
            constraint: None,
        };
        let mut plain = Session::new(target.clone(), 512);
        let want = generate(&mut plain, &tok, &prompt, &opts, &mut |_| true).unwrap();
        // p_min 0: every draft token is proposed, so rejections (and cache cuts) happen.
        for p_min in [0.0, 0.5] {
            let mut t = Session::new(target.clone(), 512);
            let mut d = Session::new(draft.clone(), 512);
            let mut streamed = String::new();
            let draft_opts = DraftOptions { max: 5, p_min };
            let (got, stats) =
                generate_speculative(&mut t, &mut d, &tok, &prompt, &opts, draft_opts, &mut |s| {
                    streamed.push_str(s);
                    true
                })
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{opts:?} p_min {p_min}");
            assert_eq!(
                (got.text.as_str(), got.finish),
                (want.text.as_str(), want.finish)
            );
            assert_eq!(streamed, got.text);
            assert!(stats.accepted <= stats.drafted, "{stats:?}");
            // Each pass yields its accepted tokens plus one of its own.
            assert!(
                stats.target_passes + 1 >= got.tokens.len() - stats.accepted,
                "{stats:?}"
            );
            // The target's cache holds exactly the prompt and the tokens fed back.
            assert!(t.tokens().starts_with(&prompt));
            assert!(t.tokens().len() <= prompt.len() + got.tokens.len());
            accepted += stats.accepted;
        }
    }
    assert!(
        accepted > 20,
        "the distilled draft should agree sometimes ({accepted})"
    );
}

#[test]
fn a_hybrid_or_foreign_draft_is_refused() {
    let (_dir, hybrid, _) = common::tiny_hybrid();
    let (dense, _) = load(&default_model());
    let t = Session::new(dense, 64);
    let d = Session::new(hybrid, 64);
    let e = check_draft(&t, &d).unwrap_err().to_string();
    assert!(e.contains("vocabulary") || e.contains("recurrent"), "{e}");
}

/// A scheduler over `target`, drafting with `draft` when given.
fn scheduler(target: &Arc<Model>, tok: &Tokenizer, draft: Option<Draft>) -> Scheduler {
    let config = SchedulerConfig {
        n_ctx: 512,
        parallel: 2,
        max_queue: 4,
        kv_cache_bytes: 64 << 20,
        context_shift: None,
        draft,
    };
    Scheduler::start(target.clone(), Arc::new(tok.clone()), config).unwrap()
}

#[test]
fn the_scheduler_drafts_for_a_lone_sequence_with_the_same_replies() {
    let Some((target, tok, draft_model, eos, prompt)) = pair() else {
        return;
    };
    let draft = Draft {
        model: draft_model,
        options: DraftOptions { max: 5, p_min: 0.0 },
    };
    draft.check(&target).unwrap();
    let plain = scheduler(&target, &tok, None);
    let drafted = scheduler(&target, &tok, Some(draft));
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        penalties: Penalties {
            repetition: 1.1,
            ..Penalties::default()
        },
        seed: 5,
        ..SamplingParams::default()
    };
    let opts = |sampling: SamplingParams, stop: Vec<String>, max_tokens| GenerateOptions {
        max_tokens,
        sampling,
        stop,
        eos: eos.clone(),
        constraint: None,
    };
    let cases = [
        opts(SamplingParams::greedy(), vec![], 40),
        opts(sampled, vec![], 40),
        opts(SamplingParams::greedy(), vec!["robot".to_string()], 40),
        opts(SamplingParams::greedy(), vec![], 6),
    ];
    for o in &cases {
        let want = collect(&common::submit(&plain, &prompt, o.clone()));
        let got = collect(&common::submit(&drafted, &prompt, o.clone()));
        assert_eq!(got.0, want.0, "{o:?}");
        assert_eq!(
            (got.1.finish, got.1.completion_tokens),
            (want.1.finish, want.1.completion_tokens)
        );
    }
    let (p, d) = (plain.stats(), drafted.stats());
    assert!(d.draft_tokens_accepted_total > 10, "{d:?}");
    assert!(d.draft_tokens_accepted_total <= d.draft_tokens_total);
    assert_eq!(p.draft_tokens_total, 0);
    assert!(
        d.n_decode_total < p.n_decode_total,
        "fewer passes: {d:?} {p:?}"
    );
    assert_eq!(d.tokens_predicted_total, p.tokens_predicted_total);
    // Two at once share batched steps (no drafting), with the same replies.
    let other = tok.encode("Once upon a time", false).unwrap();
    let (ra, rb) = (
        common::submit(&drafted, &prompt, cases[1].clone()),
        common::submit(&drafted, &other, cases[0].clone()),
    );
    assert_eq!(
        collect(&ra).0,
        collect(&common::submit(&plain, &prompt, cases[1].clone())).0
    );
    assert_eq!(
        collect(&rb).0,
        collect(&common::submit(&plain, &other, cases[0].clone())).0
    );
}

#[test]
fn the_scheduler_refuses_a_draft_it_cannot_use() {
    let (_dir, hybrid, _) = common::tiny_hybrid();
    let (dense, _) = load(&default_model());
    let options = DraftOptions { max: 4, p_min: 0.5 };
    let e = Draft {
        model: hybrid.clone(),
        options,
    }
    .check(&dense)
    .unwrap_err()
    .to_string();
    assert!(e.contains("vocabulary") || e.contains("recurrent"), "{e}");
    let e = Draft {
        model: hybrid.clone(),
        options,
    }
    .check(&hybrid)
    .unwrap_err()
    .to_string();
    assert!(e.contains("recurrent"), "{e}");
    Draft {
        model: dense.clone(),
        options,
    }
    .check(&dense)
    .unwrap();
}
