//! `/v1/completions` with `echo` (and several prompts), as lm-evaluation-harness uses it to
//! score continuations: the prompt comes back first with each token's log-probability given the
//! tokens before it, which must be llama.cpp's (tests/fixtures/completions/echo_logprobs.json,
//! tools/ref_echo.py: llama.cpp's logits of every position of the default model).

mod common;

use common::{post, Options, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/completions/echo_logprobs.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn complete(body: Value) -> Value {
    let r = post(server().addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array().unwrap().iter().map(Value::as_f64).collect()
}

fn token_text(id: u64) -> String {
    let r = post(server().addr, "/detokenize", &json!({"tokens": [id]}));
    r.json()["content"].as_str().unwrap().to_string()
}

#[test]
fn echoed_prompt_log_probabilities_are_llama_cpps() {
    let f = fixture();
    let prompts = f["prompts"].as_array().unwrap();
    let ids: Vec<Value> = prompts.iter().map(|p| p["ids"].clone()).collect();
    // Several prompts in one request (lm-evaluation-harness batches them): one choice each.
    let v = complete(json!({"prompt": ids, "max_tokens": 0, "echo": true, "logprobs": 2}));
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), prompts.len());
    let (mut sum, mut worst, mut count, mut same_top) = (0.0, 0f64, 0, 0);
    for (i, (c, p)) in choices.iter().zip(prompts).enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], p["text"], "the prompt comes back as it is");
        assert_eq!(c["finish_reason"], "length");
        let lp = &c["logprobs"];
        let n = p["ids"].as_array().unwrap().len();
        assert_eq!(lp["tokens"].as_array().unwrap().len(), n);
        let got = floats(&lp["token_logprobs"]);
        assert_eq!(got[0], None, "the first token has nothing before it");
        let want = p["log_probs"].as_array().unwrap();
        for (g, w) in got[1..].iter().zip(want) {
            let d = (g.unwrap() - w.as_f64().unwrap()).abs();
            (sum, worst, count) = (sum + d, worst.max(d), count + 1);
        }
        let tops = lp["top_logprobs"].as_array().unwrap();
        assert!(tops[0].is_null());
        for (top, want) in tops[1..].iter().zip(p["top2"].as_array().unwrap()) {
            let top = top.as_object().unwrap();
            assert_eq!(top.len(), 2, "{top:?}");
            let best = top
                .iter()
                .max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap())
                .unwrap();
            same_top += (*best.0 == token_text(want[0].as_u64().unwrap())) as usize;
        }
        // Offsets walk the echoed text token by token.
        let offsets = lp["text_offset"].as_array().unwrap();
        let tokens = lp["tokens"].as_array().unwrap();
        let mut at = 0;
        for (o, t) in offsets.iter().zip(tokens) {
            assert_eq!(o.as_u64().unwrap() as usize, at);
            at += t.as_str().unwrap().len();
        }
        assert_eq!(at, p["text"].as_str().unwrap().len());
    }
    // trit's int8 kernels against llama.cpp's: the same numbers to a few hundredths of a nat.
    assert!(count > 30);
    assert!(
        sum / count as f64 <= 0.05 && worst < 0.15,
        "mean {} worst {worst}",
        sum / count as f64
    );
    assert!(
        same_top * 10 >= count * 9,
        "{same_top} of {count} top tokens agree"
    );
    assert_eq!(v["usage"]["completion_tokens"], 0);

    // Alone, each prompt gives the same numbers as in the batch.
    let one = complete(json!({"prompt": ids[1], "max_tokens": 0, "echo": true, "logprobs": 2}));
    assert_eq!(one["choices"][0]["logprobs"], choices[1]["logprobs"]);
}

/// lm-evaluation-harness's loglikelihood request: one token generated after the echoed prompt,
/// whose log-probabilities it slices off; the prompt's part equals the prompt-only reply, and
/// streamed the prompt comes first.
#[test]
fn echo_before_a_completion_as_lm_eval_asks() {
    let f = fixture();
    let p = &f["prompts"][2];
    let only =
        complete(json!({"prompt": [p["ids"]], "max_tokens": 0, "echo": true, "logprobs": 1}));
    let body = json!({"prompt": [p["ids"]], "max_tokens": 1, "echo": true, "logprobs": 1,
                      "temperature": 0, "seed": 1234});
    let v = complete(body.clone());
    let c = &v["choices"][0];
    let n = p["ids"].as_array().unwrap().len();
    let lps = floats(&c["logprobs"]["token_logprobs"]);
    assert_eq!(
        lps.len(),
        n + 1,
        "the prompt's tokens and the generated one"
    );
    assert_eq!(
        lps[..n],
        floats(&only["choices"][0]["logprobs"]["token_logprobs"])[..]
    );
    // Greedy: the generated token is the most likely one, as its top entry says.
    let top = c["logprobs"]["top_logprobs"][n].as_object().unwrap();
    assert_eq!(top.values().next().unwrap().as_f64(), lps[n]);
    let text = c["text"].as_str().unwrap();
    let prompt = p["text"].as_str().unwrap();
    assert!(
        text.starts_with(prompt) && text.len() > prompt.len(),
        "{text:?}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 1);

    // Streamed: the echoed prompt first, then the completion.
    let mut s = body;
    s["stream"] = json!(true);
    let events = post(server().addr, "/v1/completions", &s).events();
    assert_eq!(events[0]["choices"][0]["text"], prompt);
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| e["choices"][0]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(streamed, text);
    // A text prompt echoes the text itself.
    let t = complete(json!({"prompt": prompt, "max_tokens": 2, "echo": true, "temperature": 0}));
    assert!(t["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(prompt));
    assert!(t["choices"][0]["logprobs"].is_null());
}
