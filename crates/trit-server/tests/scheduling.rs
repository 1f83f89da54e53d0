//! Scheduling through HTTP: a client that disconnects mid-stream, or while its long prompt is
//! read for a plain reply, cancels its sequence (freeing its place and KV blocks), a full queue
//! answers 503 with Retry-After, a multi-turn chat re-sent as full history only evaluates
//! the new turn, `--context-shift` lets a reply run past the context, and `--model-draft`
//! drafts for a lone request without changing its reply.

mod common;

use common::{metric, post, read_chunk, read_head, send, Options, API_KEY};
use serde_json::json;

#[test]
fn disconnect_cancels_and_full_queue_is_503() {
    // One slot, no queue beyond it; room for a stream far longer than the test takes.
    let server = common::start(Options {
        parallel: 1,
        max_queue: 0,
        n_ctx: 2048,
        kv_cache_bytes: 128 << 20,
        ..Options::default()
    });
    let addr = server.addr;
    let long = json!({"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0,
                      "stream": true});
    let mut first = send(
        addr,
        "POST",
        "/v1/completions",
        long.to_string().as_bytes(),
        Some(API_KEY),
    );
    let (status, _) = read_head(&mut first);
    assert_eq!(status, 200);
    let chunk = read_chunk(&mut first).unwrap();
    assert!(chunk.starts_with(b"data: {"));

    // A second request waits for the slot ...
    let waiting = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
        )
    });
    assert!(common::wait_until(
        || metric(addr, "requests_deferred") == 1.0
    ));
    // ... and a third finds the queue full.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "unavailable_error");
    assert_eq!(r.header("retry-after"), Some("1"));

    // The first client goes away: its sequence stops and the waiting request gets the slot.
    drop(first);
    let done = waiting.join().unwrap();
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["usage"]["completion_tokens"], 3);
    assert!(common::wait_until(
        || metric(addr, "requests_processing") == 0.0
    ));
    let predicted = metric(addr, "tokens_predicted_total");
    assert!(
        predicted < 2000.0,
        "the cancelled stream ran on: {predicted} tokens"
    );
}

#[test]
fn second_turn_with_full_history_evaluates_only_the_new_tokens() {
    let server = common::start(Options {
        parallel: 2,
        ..Options::default()
    });
    let mut messages = vec![json!({"role": "user", "content": "Tell me about Paris."})];
    let turn = |messages: &Vec<serde_json::Value>| {
        let r = post(
            server.addr,
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 12, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let first = turn(&messages);
    let reply = first["choices"][0]["message"]["content"].as_str().unwrap();
    let p1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "And Rome?"}));
    let second = turn(&messages);
    let p2 = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let evaluated = second["timings"]["prompt_n"].as_u64().unwrap();
    assert!(cached >= p1, "cached {cached} < first prompt {p1}");
    assert_eq!(evaluated, p2 - cached);
    assert!(evaluated < 20, "evaluated {evaluated} of {p2}");
}

/// The size of the load test: `TRIT_LOAD_CLIENTS` × `TRIT_LOAD_REQUESTS` (small by default
/// to keep CI fast; the 16 × 200 is a run with those set).
fn load_size() -> (usize, usize) {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (var("TRIT_LOAD_CLIENTS", 6), var("TRIT_LOAD_REQUESTS", 8))
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A bounded load test on loopback: concurrent clients mixing non-streaming, streaming and
/// abandoned streams. No 5xx, every reply well formed, and at the end nothing is running.
#[test]
fn mixed_concurrent_load_leaves_nothing_behind() {
    let (clients, requests) = load_size();
    let server = common::start(Options {
        parallel: 4,
        max_queue: 64,
        ..Options::default()
    });
    let addr = server.addr;
    let rss_before = rss_kib();
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            std::thread::spawn(move || {
                for r in 0..requests {
                    let prompt = format!("Client {c} asks question {r}:");
                    match (c + r) % 3 {
                        0 => {
                            let reply = post(
                                addr,
                                "/v1/completions",
                                &json!({"prompt": prompt, "max_tokens": 4, "seed": r}),
                            );
                            assert_eq!(reply.status, 200, "{}", reply.text());
                            assert!(
                                reply.json()["usage"]["completion_tokens"].as_u64().unwrap() <= 4
                            );
                        }
                        1 => {
                            let body = json!({"messages": [{"role": "user", "content": prompt}],
                                              "max_tokens": 4, "stream": true});
                            let reply = post(addr, "/v1/chat/completions", &body);
                            assert_eq!(reply.status, 200, "{}", reply.text());
                            let events = reply.events();
                            assert_eq!(events.last().unwrap(), "[DONE]");
                        }
                        _ => {
                            // Read the first chunk of a long stream, then hang up.
                            let body = json!({"prompt": prompt, "max_tokens": 200, "stream": true});
                            let mut conn = send(
                                addr,
                                "POST",
                                "/v1/completions",
                                body.to_string().as_bytes(),
                                Some(API_KEY),
                            );
                            let (status, _) = read_head(&mut conn);
                            assert_eq!(status, 200);
                            assert!(read_chunk(&mut conn).is_some());
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert!(common::wait_until(|| metric(addr, "requests_processing")
        == 0.0
        && metric(addr, "requests_deferred") == 0.0));
    assert_eq!(metric(addr, "requests_total"), (clients * requests) as f64);
    assert_eq!(metric(addr, "requests_failed_total"), 0.0);
    // Abandoned streams were cancelled rather than run to 200 tokens each.
    let abandoned = (0..clients)
        .flat_map(|c| (0..requests).map(move |r| (c + r) % 3))
        .filter(|&kind| kind == 2)
        .count() as f64;
    assert!(metric(addr, "tokens_predicted_total") < abandoned * 200.0);
    // Every KV block is free again (cached ones are reusable, not in use).
    assert_eq!(metric(addr, "kv_blocks_used"), 0.0);
    assert_eq!(metric(addr, "kv_cache_tokens"), 0.0);
    assert!(metric(addr, "kv_blocks_cached") <= metric(addr, "kv_blocks_total"));
    // Reported, not asserted (the allocator decides when memory goes back).
    eprintln!(
        "load {clients}x{requests}: RSS {:?} KiB before, {:?} KiB after; KV blocks {} used, {} \
         cached of {}; {} prefix hits; {} cancelled",
        rss_before,
        rss_kib(),
        metric(addr, "kv_blocks_used"),
        metric(addr, "kv_blocks_cached"),
        metric(addr, "kv_blocks_total"),
        metric(addr, "prefix_hits_total"),
        metric(addr, "requests_cancelled_total"),
    );
}

/// A non-streaming request with a long prompt (six 512-token prompt steps) whose client hangs
/// up after the first step: the sequence is cancelled at the next step, the rest of the prompt
/// is never evaluated and no KV block stays in use.
#[test]
fn disconnect_during_a_long_prompt_cancels_it() {
    let server = common::start(Options {
        parallel: 2,
        n_ctx: 4096,
        kv_cache_bytes: 256 << 20,
        ..Options::default()
    });
    let addr = server.addr;
    let prompt = "The committee reviewed every bridge in the district, one by one. ".repeat(220);
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0});
    let conn = send(
        addr,
        "POST",
        "/v1/completions",
        body.to_string().as_bytes(),
        Some(API_KEY),
    );
    assert!(common::wait_until(
        || metric(addr, "prompt_tokens_total") >= 512.0
    ));
    let seen = metric(addr, "prompt_tokens_total");
    drop(conn);
    assert!(common::wait_until(
        || metric(addr, "requests_processing") == 0.0
    ));
    // At most the step in progress when the client left, and the one that noticed it.
    let evaluated = metric(addr, "prompt_tokens_total");
    assert!(
        evaluated <= seen + 1024.0 && evaluated < 3000.0,
        "{evaluated} prompt tokens evaluated of ~3,000 ({seen} when the client left)"
    );
    assert_eq!(metric(addr, "requests_cancelled_total"), 1.0);
    assert_eq!(metric(addr, "kv_blocks_used"), 0.0);
    assert_eq!(metric(addr, "tokens_predicted_total"), 0.0);
}

#[test]
fn graceful_shutdown_lets_a_stream_in_flight_finish() {
    let mut server = common::start(Options::default());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
                      "stream": true});
    let mut conn = send(
        server.addr,
        "POST",
        "/v1/completions",
        body.to_string().as_bytes(),
        Some(API_KEY),
    );
    assert_eq!(read_head(&mut conn).0, 200);
    let mut text = String::from_utf8(read_chunk(&mut conn).unwrap()).unwrap();
    server.begin_shutdown();
    while let Some(chunk) = read_chunk(&mut conn) {
        text.push_str(&String::from_utf8(chunk).unwrap());
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""));
    server.join();
}

#[test]
fn with_context_shift_a_reply_runs_past_the_context() {
    let ids: Vec<u32> = (0..20).map(|i| 2000 + 7 * i).collect();
    let body = json!({"prompt": ids, "max_tokens": 150, "temperature": 0, "ignore_eos": true});
    // Without it, a max_tokens beyond the context is refused up front.
    let plain = common::start(Options {
        n_ctx: 64,
        parallel: 1,
        ..Options::default()
    });
    let r = post(plain.addr, "/v1/completions", &body);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("larger than the context"), "{}", r.text());
    drop(plain);
    let shifting = common::start(Options {
        n_ctx: 64,
        parallel: 1,
        context_shift: Some(4),
        ..Options::default()
    });
    let r = post(shifting.addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 150, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // llama.cpp's n_keep per request (-1: the whole prompt); below -1 is refused.
    let native = json!({"prompt": ids, "n_predict": 150, "temperature": 0, "ignore_eos": true,
                        "n_keep": -1});
    let r = post(shifting.addr, "/completion", &native);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["tokens_predicted"], 150);
    let mut bad = native.clone();
    bad["n_keep"] = json!(-2);
    assert_eq!(post(shifting.addr, "/completion", &bad).status, 400);
}

#[test]
fn a_drafting_server_replies_as_a_plain_one() {
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
    let plain = common::start(Options {
        parallel: 1,
        ..Options::default()
    });
    let want = post(plain.addr, "/v1/completions", &body).json();
    drop(plain);
    let drafting = common::start(Options {
        parallel: 1,
        self_draft: true,
        ..Options::default()
    });
    let got = post(drafting.addr, "/v1/completions", &body).json();
    assert_eq!(
        got["choices"][0]["text"], want["choices"][0]["text"],
        "{got}"
    );
    assert_eq!(got["usage"]["completion_tokens"], 24);
    // The model drafting for itself agrees with its greedy proposals (up to near ties between
    // its one-token and its scoring passes).
    let drafted = metric(drafting.addr, "draft_tokens_total");
    let accepted = metric(drafting.addr, "draft_tokens_accepted_total");
    assert!(
        drafted >= 10.0 && accepted >= 0.8 * drafted,
        "{drafted} {accepted}"
    );
}
