//! Multi-turn chat reuses the KV cache: turn 2 re-sends the whole conversation, but only the
//! tokens after the longest common prefix are evaluated, and the result equals evaluating the
//! whole conversation from scratch.

mod common;

use serde_json::{json, Map, Value};
use std::sync::Arc;
use trit::chat::ChatTemplate;
use trit::engine::{generate, GenerateOptions, Session};
use trit::model::Model;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

#[test]
fn second_turn_evaluates_only_new_tokens() {
    let Some(path) = common::asset("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let files = trit::format::open(&path).unwrap();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let tpl = ChatTemplate::new(files.chat_template.as_deref().unwrap(), "", "").unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    let eos = vec![tok.token_id("<|im_end|>").unwrap()];
    let opts = GenerateOptions {
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        eos,
        constraint: None,
    };
    let render = |msgs: &[Value]| {
        tok.encode(&tpl.render(msgs, true, None, &Map::new()).unwrap(), false)
            .unwrap()
    };

    let mut session = Session::new(model.clone(), 1024);
    let mut msgs = vec![json!({"role": "user", "content": "What is the capital of France?"})];
    let p1 = render(&msgs);
    let g1 = generate(&mut session, &tok, &p1, &opts, &mut |_| true).unwrap();
    assert_eq!(g1.prompt_evaluated, p1.len());
    msgs.push(json!({"role": "assistant", "content": g1.text.trim()}));
    msgs.push(json!({"role": "user", "content": "And of Italy?"}));
    let p2 = render(&msgs);
    assert!(p2.len() > p1.len() + g1.tokens.len());

    let held = session.tokens().to_vec();
    let common = held.iter().zip(&p2).take_while(|(a, b)| a == b).count();
    // The cache holds the first prompt and the reply (minus its last token).
    assert!(
        common >= p1.len(),
        "common prefix {common} < first prompt {}",
        p1.len()
    );
    let reused_logits = session.prefill(&p2).unwrap();
    assert_eq!(session.last_evaluated(), p2.len() - common);
    assert!(
        session.last_evaluated() < 20,
        "evaluated {}",
        session.last_evaluated()
    );

    let mut fresh = Session::new(model, 1024);
    let fresh_logits = fresh.prefill(&p2).unwrap();
    assert_eq!(fresh.last_evaluated(), p2.len());
    let d = common::max_abs_diff(&reused_logits, &fresh_logits);
    assert!(d < 1e-2, "reused vs fresh logits differ by {d}");
    assert_eq!(
        common::top_k(&reused_logits, 1),
        common::top_k(&fresh_logits, 1)
    );
}
