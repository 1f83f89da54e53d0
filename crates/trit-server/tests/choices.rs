//! OpenAI's `n`: several choices of one prompt on the default model. Choice i is the reply a
//! lone request with the seed + i gives (so a seeded request repeats and sampled choices
//! differ); the prompt is read once and its full KV blocks are shared; streamed choices
//! interleave and add up to the whole reply's; usage counts the prompt once.

mod common;

use common::{metric, post, Options, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

/// A prompt of more than two KV blocks (64 tokens each) that no other test sends.
fn long_prompt(tag: &str) -> String {
    format!(
        "{tag}: {}Tell me a short story.",
        "The lighthouse keeper counted ships every night by the sea. ".repeat(12)
    )
}

fn ok(path: &str, body: &Value) -> Value {
    let r = post(server().addr, path, body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn chat_choices_are_the_seeded_replies_and_share_the_prompt() {
    let messages = json!([{"role": "user", "content": long_prompt("chat")}]);
    let body = |n: usize, seed: u64| {
        json!({"messages": messages, "n": n, "seed": seed, "temperature": 1.0,
               "max_tokens": 12})
    };
    let cached_before = metric(server().addr, "prompt_tokens_cached_total");
    let v = ok("/v1/chat/completions", &body(3, 40));
    let cached = metric(server().addr, "prompt_tokens_cached_total") - cached_before;
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    let texts: Vec<&str> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            assert!(c["finish_reason"].is_string(), "{c}");
            c["message"]["content"].as_str().unwrap()
        })
        .collect();
    // The two later choices mapped the prompt's full blocks instead of reading them.
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 128, "{v}");
    assert!(cached >= 2.0 * 128.0, "cached {cached} of {prompt_tokens}");
    // Each choice is what a lone request with the seed + i says.
    let mut completion_tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        let alone = ok("/v1/chat/completions", &body(1, 40 + i as u64));
        assert_eq!(
            alone["choices"][0]["message"]["content"], *text,
            "choice {i}"
        );
        assert_eq!(alone["usage"]["prompt_tokens"], prompt_tokens);
        completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    // The prompt counted once, every choice's tokens.
    assert_eq!(v["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64(),
        Some(prompt_tokens + completion_tokens)
    );
    // A seeded request repeats.
    assert_eq!(
        ok("/v1/chat/completions", &body(3, 40))["choices"],
        v["choices"]
    );

    // Streamed: every chunk names its choice; each choice's deltas add up to its text, its
    // finishing chunk comes once, and one usage chunk and one [DONE] end the stream.
    let mut b = body(3, 40);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let events = post(server().addr, "/v1/chat/completions", &b).events();
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let mut streamed = vec![String::new(); 3];
    let mut finishes = [0; 3];
    let mut usages = Vec::new();
    for e in &events[..events.len() - 1] {
        let Some(c) = e["choices"].as_array().unwrap().first() else {
            usages.push(e["usage"].clone());
            continue;
        };
        let i = c["index"].as_u64().unwrap() as usize;
        streamed[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        finishes[i] += c["finish_reason"].is_string() as usize;
    }
    assert_eq!(streamed, texts);
    assert_eq!(finishes, [1, 1, 1]);
    assert_eq!(usages.len(), 1);
    assert_eq!(usages[0]["completion_tokens"], completion_tokens);
    // One completion: every chunk carries its id.
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| e["id"] == events[0]["id"]));
}

#[test]
fn completion_choices_are_the_seeded_replies() {
    let prompt = long_prompt("completion");
    let body = |n: usize, seed: u64| {
        json!({"prompt": prompt, "n": n, "seed": seed, "temperature": 1.0, "max_tokens": 10,
               "logprobs": 1})
    };
    let v = ok("/v1/completions", &body(2, 9));
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let alone = ok("/v1/completions", &body(1, 9 + i as u64));
        assert_eq!(alone["choices"][0]["text"], c["text"], "choice {i}");
        assert_eq!(
            alone["choices"][0]["logprobs"]["tokens"],
            c["logprobs"]["tokens"]
        );
    }
    let mut b = body(2, 9);
    b["stream"] = json!(true);
    let events = post(server().addr, "/v1/completions", &b).events();
    let mut streamed = vec![String::new(); 2];
    for e in &events[..events.len() - 1] {
        let c = &e["choices"][0];
        streamed[c["index"].as_u64().unwrap() as usize].push_str(c["text"].as_str().unwrap());
    }
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, texts);
}
