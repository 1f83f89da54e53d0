//! Speculative decoding gives exactly what the target model gives alone — greedy and sampled
//! (same seed), with penalties, stop strings and the token budget — while the draft's tokens
//! cut the number of target passes. Target: SmolLM2-135M-Instruct Q4_1 (PyPI-fetched asset);
//! draft: the ternary default model distilled from it (same vocabulary).

mod common;

use std::sync::Arc;
use trit::engine::{
    check_draft, generate, generate_speculative, DraftOptions, GenerateOptions, Session,
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

#[test]
fn drafted_generation_equals_the_targets_own() {
    let Some(target_path) = common::asset("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") else {
        eprintln!("skipped: SmolLM2 Q4_1 asset missing (tools/fetch_assets.sh)");
        return;
    };
    let (target, tok) = load(&target_path);
    let (draft, _) = load(&default_model());
    let eos = vec![tok.token_id("<|im_end|>").unwrap()];
    let prompt = tok
        .encode("<|im_start|>user\nWrite a short story about a robot who paints.<|im_end|>\n<|im_start|>assistant\n", false)
        .unwrap();
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
            json: None,
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
