//! Every kind of bad input gets a 4xx with an OpenAI/llama.cpp error object — never a 5xx,
//! a panic or a hang — and the server keeps serving afterwards.

mod common;

use common::{post, request_raw, Options, TestServer, API_KEY};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

fn chat_raw(body: &[u8]) -> common::Reply {
    request_raw(
        server().addr,
        "POST",
        "/v1/chat/completions",
        body,
        Some(API_KEY),
    )
}

/// Asserts the status and the envelope; returns the message.
fn expect_error(r: &common::Reply, status: u16, kind: &str) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let body = r.json();
    let e = &body["error"];
    assert_eq!(e["code"], status);
    assert_eq!(e["type"], kind);
    e["message"].as_str().unwrap().to_string()
}

fn hello(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn prompt_beyond_the_context_gets_llama_cpp_body_byte_for_byte() {
    // The test server's context is 256 tokens.
    let ids: Vec<u32> = (0..300).map(|i| 1000 + i).collect();
    for stream in [false, true] {
        let r = post(
            server().addr,
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 4, "stream": stream}),
        );
        assert_eq!(r.status, 400);
        assert_eq!(
            r.text(),
            r#"{"error":{"code":400,"message":"request (300 tokens) exceeds the available context size (256 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":300,"n_ctx":256}}"#
        );
    }
    // Through the chat template too, with the count of the rendered prompt.
    let long = "word ".repeat(400);
    let r = post(
        server().addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    let msg = expect_error(&r, 400, "exceed_context_size_error");
    let n = r.json()["error"]["n_prompt_tokens"].as_u64().unwrap();
    assert!(n > 400);
    assert_eq!(
        msg,
        format!("request ({n} tokens) exceeds the available context size (256 tokens), try increasing it")
    );
}

#[test]
fn malformed_json() {
    let r = chat_raw(br#"{"messages": [{"role": "user", "content": "Hi"}"#);
    let msg = expect_error(&r, 400, "invalid_request_error");
    assert!(msg.contains("not valid JSON"), "{msg}");
    expect_error(&chat_raw(b"[1, 2]"), 400, "invalid_request_error");
    expect_error(&chat_raw(b""), 400, "invalid_request_error");
}

#[test]
fn wrong_types_name_the_field() {
    for (field, value) in [
        ("temperature", json!("hot")),
        ("max_tokens", json!(1.5)),
        ("stream", json!("yes")),
        ("messages", json!("hello")),
        ("stop", json!(5)),
    ] {
        let mut body = hello(json!({}));
        body[field] = value;
        let r = post(server().addr, "/v1/chat/completions", &body);
        let msg = expect_error(&r, 400, "invalid_request_error");
        assert!(msg.contains(field), "{field}: {msg}");
    }
    let r = post(
        server().addr,
        "/v1/chat/completions",
        &json!({"max_tokens": 2}),
    );
    let msg = expect_error(&r, 400, "invalid_request_error");
    assert!(msg.contains("messages"), "{msg}");
}

#[test]
fn unknown_model() {
    let r = post(
        server().addr,
        "/v1/chat/completions",
        &hello(json!({"model": "gpt-4o"})),
    );
    let msg = expect_error(&r, 404, "not_found_error");
    assert!(msg.contains("gpt-4o"), "{msg}");
}

#[test]
fn bad_max_tokens() {
    for m in [json!(0), json!(-5), json!(1_000_000_000)] {
        for field in ["max_tokens", "max_completion_tokens"] {
            let r = post(
                server().addr,
                "/v1/chat/completions",
                &hello(json!({ field: m })),
            );
            expect_error(&r, 400, "invalid_request_error");
        }
    }
    let r = post(
        server().addr,
        "/v1/chat/completions",
        &hello(json!({"max_tokens": 1e30})),
    );
    expect_error(&r, 400, "invalid_request_error");
}

#[test]
fn invalid_utf8() {
    let mut body = br#"{"messages": [{"role": "user", "content": "caf"#.to_vec();
    body.extend([0xC3, 0x28]);
    body.extend(br#""}]}"#);
    let msg = expect_error(&chat_raw(&body), 400, "invalid_request_error");
    assert!(msg.contains("UTF-8"), "{msg}");
}

#[test]
fn out_of_range_sampling_parameters() {
    for extra in [
        json!({"temperature": -1}),
        json!({"temperature": 3}),
        json!({"top_p": 0}),
        json!({"min_p": 2}),
        json!({"top_k": -1}),
        json!({"presence_penalty": 5}),
        json!({"repetition_penalty": 0}),
        json!({"logprobs": true, "top_logprobs": 50}),
        json!({"top_logprobs": 2}),
    ] {
        let r = post(server().addr, "/v1/chat/completions", &hello(extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
    }
}

#[test]
fn unsupported_n_tool_choice_and_messages() {
    let cases = [
        hello(json!({"n": 0})),
        hello(json!({"n": 17})),
        hello(json!({"n": -1})),
        hello(json!({"tools": [], "tool_choice": "required"})),
        json!({"messages": []}),
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        json!({"messages": [{"content": "x"}]}),
    ];
    for body in cases {
        let r = post(server().addr, "/v1/chat/completions", &body);
        expect_error(&r, 400, "invalid_request_error");
    }
    let r = post(
        server().addr,
        "/v1/completions",
        &json!({"prompt": [999_999_999u32], "max_tokens": 2}),
    );
    expect_error(&r, 400, "invalid_request_error");
    let r = post(
        server().addr,
        "/v1/completions",
        &json!({"prompt": [], "max_tokens": 2}),
    );
    expect_error(&r, 400, "invalid_request_error");
    // max_tokens 0 is only for echo, which has nothing to stream then.
    for body in [
        json!({"prompt": "a", "max_tokens": 0}),
        json!({"prompt": "a", "max_tokens": 0, "echo": true, "stream": true}),
        json!({"prompt": vec!["a"; 65], "max_tokens": 1}),
        json!({"prompt": ["a", "b"], "max_tokens": 1, "n": 40}),
    ] {
        let r = post(server().addr, "/v1/completions", &body);
        expect_error(&r, 400, "invalid_request_error");
    }
    // llama.cpp's own endpoint answers one reply in its shape.
    let r = post(
        server().addr,
        "/completion",
        &json!({"prompt": "a", "n_predict": 2, "n": 2}),
    );
    let message = expect_error(&r, 400, "invalid_request_error");
    assert!(message.contains("/v1/completions"), "{message}");
}

#[test]
fn api_key_body_limit_and_unknown_routes() {
    let addr = server().addr;
    let body = hello(json!({})).to_string();
    let r = request_raw(addr, "POST", "/v1/chat/completions", body.as_bytes(), None);
    expect_error(&r, 401, "authentication_error");
    let r = request_raw(addr, "GET", "/v1/models", b"", Some("wrong"));
    expect_error(&r, 401, "authentication_error");
    assert_eq!(request_raw(addr, "GET", "/health", b"", None).status, 200);

    // The test server accepts 64 KiB.
    let big = hello(json!({"stop": "x".repeat(100 << 10)})).to_string();
    let r = chat_raw(big.as_bytes());
    expect_error(&r, 413, "invalid_request_error");

    let r = request_raw(addr, "GET", "/v2/nothing", b"", Some(API_KEY));
    expect_error(&r, 404, "not_found_error");

    // Still serving.
    assert_eq!(
        post(addr, "/v1/chat/completions", &hello(json!({}))).status,
        200
    );
}
