//! Malformed requests never break the server: hundreds of mutations of valid requests (values
//! swapped for other types, huge numbers, long or empty strings, deep nesting, keys removed,
//! bodies cut short or with a byte changed) sent to every JSON endpoint get a 2xx or a 4xx in
//! llama.cpp's error envelope — never a 5xx, a dropped connection or a hang — and the server
//! still answers afterwards.

mod common;
use common::{get, request_raw, start, Options, API_KEY};

use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// xorshift64*: the same mutations on every run.
use trit::test_values::TestRng as Rng;

/// Valid requests of every kind the server takes (short generations).
fn seeds() -> Vec<(&'static str, Value)> {
    let tool = json!({"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}});
    vec![
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0.5,
            "top_p": 0.9, "top_k": 20, "stop": ["\n"], "seed": 1, "stream": false}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Weather?"}],
            "max_tokens": 4, "tools": [tool], "tool_choice": "required"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "JSON"}],
            "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema":
            {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer",
            "minimum": 0}, "b": {"enum": ["x", "y"]}}, "required": ["a"]}}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2, "logprobs": true, "top_logprobs": 2, "logit_bias": {"5": -100},
            "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Once upon", "max_tokens": 3,
            "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 2, "n_predict": 2}),
        ),
        (
            "/completion",
            json!({"prompt": "Once upon", "n_predict": 3, "n_probs": 2, "return_tokens": true,
            "cache_prompt": true, "stream": true}),
        ),
        (
            "/tokenize",
            json!({"content": "Hello world", "add_special": true, "with_pieces": true}),
        ),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
        (
            "/v1/embeddings",
            json!({"input": ["Hello world", "Bye"], "encoding_format": "base64"}),
        ),
        ("/v1/embeddings", json!({"input": [[1, 2, 3], [4]]})),
        (
            "/v1/responses",
            json!({"instructions": "Be brief.", "input": [{"role": "user", "content":
            [{"type": "input_text", "text": "Hi"}]}], "max_output_tokens": 3, "temperature": 0.5,
            "text": {"format": {"type": "text"}}, "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"input": "Hi", "max_output_tokens": 3, "top_p": 0.9, "metadata": {"a": "b"}}),
        ),
        (
            "/v1/conversations",
            json!({"items": [{"type": "message", "role": "user", "content": "Hi"},
            {"type": "function_call_output", "call_id": "c", "output": "x"}],
            "metadata": {"a": "b"}}),
        ),
        (
            "/apply-template",
            json!({"messages": [{"role": "user", "content": "Hi"}],
            "add_generation_prompt": true}),
        ),
    ]
}

/// Replacement values: other types, extremes, empty and large.
fn odd_value(r: &mut Rng) -> Value {
    let deep = (0..200).fold(json!(1), |v, _| json!([v]));
    let choices = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-9223372036854775808i64),
        json!(18446744073709551615u64),
        json!(0.5),
        json!(""),
        json!("x".repeat(5000)),
        json!("\u{0}\u{ffff}"),
        json!([]),
        json!([null]),
        json!({}),
        json!({"role": "tool"}),
        json!(true),
        deep,
    ];
    choices[r.below(choices.len())].clone()
}

/// Every JSON location (object members and array elements) of `v`, as paths.
fn paths(v: &Value, at: Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let mut p = at.clone();
                p.push(json!(k));
                out.push(p.clone());
                paths(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let mut p = at.clone();
                p.push(json!(i));
                out.push(p.clone());
                paths(x, p, out);
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[Value]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k {
        Value::String(k) => &mut v[k.as_str()],
        _ => &mut v[k.as_u64().unwrap() as usize],
    })
}

/// One mutation of `seed` as the bytes to send, and what was done.
fn mutate(r: &mut Rng, seed: &Value) -> (Vec<u8>, String) {
    let mut v = seed.clone();
    let mut all = Vec::new();
    paths(&v, Vec::new(), &mut all);
    let p = all[r.below(all.len())].clone();
    match r.below(5) {
        0 | 1 => {
            let x = odd_value(r);
            let what = format!("{p:?} = {}", &x.to_string()[..x.to_string().len().min(40)]);
            *at_mut(&mut v, &p) = x;
            (serde_json::to_vec(&v).unwrap(), what)
        }
        2 => {
            let (last, parent) = p.split_last().unwrap();
            match (at_mut(&mut v, parent), last) {
                (Value::Object(o), Value::String(k)) => {
                    o.remove(k);
                }
                (Value::Array(a), i) => {
                    a.remove(i.as_u64().unwrap() as usize);
                }
                _ => {}
            }
            (serde_json::to_vec(&v).unwrap(), format!("{p:?} removed"))
        }
        3 => {
            let bytes = serde_json::to_vec(&v).unwrap();
            let cut = r.below(bytes.len());
            (bytes[..cut].to_vec(), format!("cut at {cut}"))
        }
        _ => {
            let mut bytes = serde_json::to_vec(&v).unwrap();
            let at = r.below(bytes.len());
            bytes[at] = r.next_u64() as u8;
            (bytes, format!("byte {at} changed"))
        }
    }
}

#[test]
fn mutated_requests_get_4xx_or_answers_never_a_broken_server() {
    let server = start(Options::default());
    let mut r = Rng(0x5eed);
    let mut broken = Vec::new();
    let mut statuses = std::collections::BTreeMap::new();
    for (path, seed) in seeds() {
        for _ in 0..45 {
            let (body, what) = mutate(&mut r, &seed);
            let reply = catch_unwind(AssertUnwindSafe(|| {
                request_raw(server.addr, "POST", path, &body, Some(API_KEY))
            }));
            match reply {
                Err(_) => broken.push(format!("{path} {what}: no reply")),
                Ok(rep) => {
                    *statuses.entry(rep.status).or_insert(0) += 1;
                    let ok = (200..300).contains(&rep.status)
                        || ((400..500).contains(&rep.status)
                            && serde_json::from_slice::<Value>(&rep.body)
                                .is_ok_and(|e| e["error"]["message"].is_string()));
                    if !ok {
                        broken.push(format!("{path} {what}: {} {}", rep.status, rep.text()));
                    }
                }
            }
        }
    }
    eprintln!("statuses: {statuses:?}");
    assert!(broken.is_empty(), "{} broken: {broken:#?}", broken.len());
    assert!(
        statuses.keys().any(|s| *s >= 400),
        "no mutation was refused"
    );
    assert_eq!(get(server.addr, "/health").status, 200);
}
