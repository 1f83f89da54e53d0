//! The OpenAI-compatible endpoints end to end, on the default model over loopback:
//! response shapes as OpenAI clients parse them, streaming framing, and that what the server
//! returns is the engine's real output (streamed = non-streamed, stops cut, prefixes reused).

mod common;

use common::{get, metric, post, Options, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

fn chat(body: Value) -> Value {
    let r = post(server().addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn models_health_and_metrics() {
    let addr = server().addr;
    let m = get(addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "default");
    assert_eq!(m["data"][0]["object"], "model");
    assert!(m["data"][0]["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(m["data"][0]["owned_by"], "trit");
    let h = common::request_raw(addr, "GET", "/health", b"", None);
    assert_eq!((h.status, h.json()), (200, json!({"status": "ok"})));
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    for name in [
        "prompt_tokens_total",
        "tokens_predicted_total",
        "predicted_tokens_seconds",
        "requests_processing",
        "requests_deferred",
        "kv_cache_usage_ratio",
        "kv_blocks_total",
        "kv_blocks_used",
        "kv_blocks_cached",
        "prefix_hits_total",
        "prompt_tokens_cached_total",
        "requests_cancelled_total",
        "n_decode_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE trit:{name} ")),
            "{name} missing"
        );
    }
    assert!(text.contains("trit:time_to_first_token_seconds_bucket{le=\"+Inf\"}"));
    // 64 MiB of 1.47 MB blocks (30 layers × 3 KV heads × 64 dims × 64 positions × K and V,
    // 2 bytes each in the default f16 cache; f32 would hold 22).
    assert!(text.contains("trit:kv_blocks_total 45\n"), "{text}");
}

#[test]
fn chat_streamed_equals_non_streamed_and_reuses_the_prefix() {
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let body = |stream: bool| {
        json!({"model": "default", "messages": messages, "max_tokens": 10, "temperature": 0,
               "stream": stream, "stream_options": {"include_usage": true}})
    };
    let whole = chat(body(false));
    assert_eq!(whole["object"], "chat.completion");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(whole["model"], "default");
    let choice = &whole["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty());
    let usage = &whole["usage"];
    assert_eq!(usage["completion_tokens"], 10);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + 10);

    let r = post(server().addr, "/v1/chat/completions", &body(true));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    for e in &events[..n - 1] {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["id"], events[0]["id"]);
        if let Some(t) = e["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
    }
    assert_eq!(streamed, content);
    assert_eq!(events[n - 3]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[n - 3]["choices"][0]["delta"], json!({}));
    // include_usage: a last chunk without choices. The prompt came (at least partly: other
    // tests share the server's slots) from the prefix cache this time.
    assert_eq!(events[n - 2]["choices"], json!([]));
    assert_eq!(events[n - 2]["usage"]["completion_tokens"], 10);
    assert_eq!(events[n - 2]["usage"]["prompt_tokens"], prompt_tokens);
    let cached = events[n - 2]["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0 && cached < prompt_tokens);
}

#[test]
fn completions_text_and_token_ids_stream_and_logprobs() {
    let addr = server().addr;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                      "logprobs": 2});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = r.json();
    assert_eq!(whole["object"], "text_completion");
    assert!(whole["id"].as_str().unwrap().starts_with("cmpl-"));
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let lp = &whole["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 8);
    assert_eq!(tokens.concat(), text);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        // Greedy: the chosen token is the most likely one.
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2);
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-6 && chosen <= 0.0);
    }

    let mut streamed = String::new();
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = post(addr, "/v1/completions", &stream).events();
    for e in &events[..events.len() - 1] {
        streamed.push_str(e["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(streamed, text);
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );

    // The same prompt as token ids gives the same text.
    let files = trit::format::open(&common::default_model_path()).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let ids = tok.encode("Once upon a time", false).unwrap();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["text"], text);
    let from_text_ids = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["Once upon a time"], "max_tokens": 8, "temperature": 0}),
    )
    .json();
    assert_eq!(from_text_ids["choices"][0]["text"], text);
    assert_eq!(from_text_ids["usage"]["prompt_tokens"], 4);
}

#[test]
fn stop_strings_cut_the_reply() {
    let base = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let text = post(server().addr, "/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    // Stop at the third word of the greedy reply.
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    assert!(words.len() > 3, "{text:?}");
    let prefix: String = words[..2].concat();
    let stop = words[2].trim_end().to_string();
    let mut body = base.clone();
    body["stop"] = json!([stop, "never-appears"]);
    let cut = post(server().addr, "/v1/completions", &body).json();
    assert_eq!(cut["choices"][0]["text"], prefix.as_str());
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
}

#[test]
fn chat_logprobs_seed_and_sampling_fields() {
    let body = json!({
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Name a color."}]}],
        "max_completion_tokens": 6, "temperature": 1.0, "top_p": 0.9, "top_k": 40,
        "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.5,
        "repeat_penalty": 1.1, "seed": 7, "logprobs": true, "top_logprobs": 3,
        "chat_template_kwargs": {"enable_thinking": false}
    });
    let a = chat(body.clone());
    let b = chat(body);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    let content = a["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        a["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            entry["token"].as_str().unwrap()
        );
    }
    assert!(metric(server().addr, "tokens_predicted_total") >= 12.0);
}

#[test]
fn tools_are_accepted_and_the_reply_is_well_formed() {
    let body = json!({
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto", "max_tokens": 6, "temperature": 0
    });
    let r = chat(body);
    let finish = r["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish));
    let msg = &r["choices"][0]["message"];
    assert!(msg["content"].is_string() || msg["tool_calls"].is_array());
}

/// llama.cpp's own `/completion`: the same text as `/v1/completions`, in llama.cpp's shape —
/// totals, `stop_type`, `n_probs` and `return_tokens` — streamed without `[DONE]`.
#[test]
fn llama_cpps_completion_endpoint_answers_in_its_shape() {
    let addr = server().addr;
    let oai = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}),
    )
    .json();
    let text = oai["choices"][0]["text"].as_str().unwrap().to_string();
    let body = json!({"prompt": "Once upon a time", "n_predict": 8, "temperature": 0,
                      "n_probs": 2, "return_tokens": true, "cache_prompt": true});
    let r = post(addr, "/completion", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"], text.as_str(), "{v}");
    assert_eq!(
        (v["stop"].clone(), v["stop_type"].clone()),
        (json!(true), json!("limit"))
    );
    assert_eq!(v["tokens_predicted"], 8);
    assert_eq!(v["tokens_evaluated"], oai["usage"]["prompt_tokens"]);
    assert!(v["timings"]["predicted_n"] == 8, "{v}");
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!((ids.len(), probs.len()), (8, 8));
    for (p, &id) in probs.iter().zip(&ids) {
        assert_eq!(p["id"], id);
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["id"], id, "{p}");
    }
    let pieces: String = probs.iter().map(|p| p["token"].as_str().unwrap()).collect();
    assert_eq!(pieces, text);

    // Streamed: one event per token, then the totals; no [DONE].
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = post(addr, "/completion", &stream).events();
    let (last, tokens) = events.split_last().unwrap();
    assert_eq!(tokens.len(), 8, "{events:?}");
    let streamed: String = tokens
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    assert!(tokens
        .iter()
        .all(|e| e["stop"] == false && e["tokens"].as_array().unwrap().len() == 1));
    assert_eq!(
        (last["stop"].clone(), last["tokens_predicted"].clone()),
        (json!(true), json!(8))
    );

    // A stop string ends it as a "word"; the string is not part of the content.
    let word: String = text.trim_start().chars().skip(3).take(3).collect();
    let stopped = post(
        addr,
        "/completion",
        &json!({"prompt": "Once upon a time", "n_predict": 8, "temperature": 0,
                "stop": [word]}),
    )
    .json();
    assert_eq!(stopped["stop_type"], "word", "{stopped}");
    assert!(!stopped["content"].as_str().unwrap().contains(&word));
    // An end-of-sequence token (made certain by a bias) ends it as "eos".
    let files = trit::format::open(&common::default_model_path()).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let eos = tok.token_id("<|im_end|>").unwrap();
    let ended = post(
        addr,
        "/completion",
        &json!({"prompt": "Once upon a time", "n_predict": 8, "logit_bias": [[eos, 100]]}),
    )
    .json();
    assert_eq!(
        (ended["stop_type"].clone(), ended["content"].clone()),
        (json!("eos"), json!(""))
    );
    // Refusals in llama.cpp's error envelope.
    for bad in [
        json!({"prompt": "x", "n_probs": 21}),
        json!({"prompt": ""}),
        json!({"n_predict": 2}),
    ] {
        let r = post(addr, "/completion", &bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.json()["error"]["message"].is_string());
    }
}

#[test]
fn generation_stops_at_the_end_of_the_context_with_length() {
    // The test server's context is 256 tokens; without max_tokens the reply may fill it.
    let ids: Vec<u32> = (0..250).map(|i| 2000 + i).collect();
    let r = post(
        server().addr,
        "/v1/completions",
        &json!({"prompt": ids, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        generated <= 6,
        "{generated} tokens after 250 in a 256 context"
    );
    if generated == 6 {
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    // A max_tokens beyond the room left: the context end stops it (the last sampled token
    // is returned without being stored, so 256 - 250 + 1).
    let r = post(
        server().addr,
        "/v1/completions",
        &json!({"prompt": ids, "temperature": 0, "max_tokens": 100}),
    );
    let v = r.json();
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        generated <= 7,
        "{generated} tokens after 250 in a 256 context"
    );
    if generated == 7 {
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
}

/// A Qwen3 chat template (a random tiny Qwen3 model with the Qwen3 tokenizer from the asset
/// cache): the `enable_thinking` switch reaches the template, which then pre-fills an empty
/// `<think></think>` block.
#[test]
fn enable_thinking_false_reaches_the_qwen3_template() {
    use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
    let cache = std::env::var_os("TRIT_CACHE").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
        std::path::PathBuf::from,
    );
    let qwen3 = cache.join("qwen3");
    if !qwen3.join("tokenizer.json").exists() {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh)",
            qwen3.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let format = OutFormat::parse("q2_0").unwrap();
    let preset = Preset::by_name("tiny").unwrap();
    generate(
        &preset,
        0,
        dir.path(),
        &[format],
        &TokenizerAssets::Dir(qwen3),
    )
    .unwrap();
    let server = common::start(Options {
        model: Some(dir.path().join(format.file_name())),
        parallel: 1,
        ..Options::default()
    });
    let prompt_tokens = |thinking: bool| {
        let r = post(
            server.addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                    "chat_template_kwargs": {"enable_thinking": thinking}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    // "<think>\n\n</think>\n\n" adds a few tokens to the prompt.
    let (on, off) = (prompt_tokens(true), prompt_tokens(false));
    assert!(off > on && off - on <= 6, "thinking on {on}, off {off}");
    // OpenAI's reasoning effort switches it the same way (chat's `reasoning_effort`, the
    // Responses API's `reasoning.effort`); an explicit kwarg wins.
    let tokens = |path: &str, body: Value| {
        let r = post(server.addr, path, &body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        let u = &r.json()["usage"];
        u["prompt_tokens"]
            .as_u64()
            .or(u["input_tokens"].as_u64())
            .unwrap()
    };
    let chat = |effort: &str| {
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
               "reasoning_effort": effort})
    };
    assert_eq!(tokens("/v1/chat/completions", chat("minimal")), off);
    assert_eq!(tokens("/v1/chat/completions", chat("none")), off);
    assert_eq!(tokens("/v1/chat/completions", chat("high")), on);
    let mut explicit = chat("minimal");
    explicit["chat_template_kwargs"] = json!({"enable_thinking": true});
    assert_eq!(tokens("/v1/chat/completions", explicit), on);
    let respond = |effort: &str| json!({"input": "Hi", "max_output_tokens": 1, "reasoning": {"effort": effort}});
    assert_eq!(tokens("/v1/responses", respond("minimal")), off);
    assert_eq!(tokens("/v1/responses", respond("medium")), on);
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let addr = server().addr;
    let files = trit::format::open(&common::default_model_path()).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let first_token = |bias: Value| {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0,
                    "logprobs": 1, "logit_bias": bias}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["logprobs"]["tokens"][0]
            .as_str()
            .unwrap()
            .to_string()
    };
    let greedy = first_token(json!({}));
    let id = tok.encode(&greedy, false).unwrap();
    assert_eq!(id.len(), 1, "{greedy:?}");
    // -100 bans (OpenAI), as does llama.cpp's false and its [[id, bias]] list form.
    for ban in [json!({id[0].to_string(): -100}), json!([[id[0], false]])] {
        assert_ne!(first_token(ban.clone()), greedy, "{ban}");
    }
    let dragon = tok.encode(" dragon", false).unwrap();
    assert_eq!(
        first_token(json!({dragon[0].to_string(): 100})),
        tok.decode(&dragon[..1], false).unwrap()
    );
    for bad in [
        json!({"abc": 1}),
        json!({"5": 200}),
        json!({"99999999": 1}),
        json!("x"),
    ] {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 1, "logit_bias": bad}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains("logit_bias"), "{}", r.text());
    }
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let addr = server().addr;
    let text = "Héllo, wörld! 日本 😀";
    let r = post(addr, "/tokenize", &json!({"content": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<u64> = r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let files = trit::format::open(&common::default_model_path()).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let expected: Vec<u64> = tok
        .encode(text, false)
        .unwrap()
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(ids, expected);
    let back = post(addr, "/detokenize", &json!({ "tokens": ids }));
    assert_eq!(back.json()["content"], text);
    // With pieces: their bytes (text, or a byte array where a piece splits a character) join up
    // to the text.
    let r = post(
        addr,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    );
    let mut bytes = Vec::new();
    for t in r.json()["tokens"].as_array().unwrap() {
        assert!(t["id"].is_u64());
        match &t["piece"] {
            Value::String(s) => bytes.extend(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().unwrap() as u8)),
            other => panic!("{other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    let bad = post(addr, "/detokenize", &json!({"tokens": [99_999_999]}));
    assert_eq!(bad.status, 400, "{}", bad.text());
}

#[test]
fn ignore_eos_and_n_predict_and_refused_samplers() {
    let addr = server().addr;
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Say hi."}],
                           "max_tokens": 60, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let plain = chat(body(json!({})));
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    let long = chat(body(json!({"ignore_eos": true})));
    assert_eq!(long["choices"][0]["finish_reason"], "length", "{long}");
    assert_eq!(long["usage"]["completion_tokens"], 60);
    // llama.cpp's n_predict: -1 is "until the end", a number caps like max_tokens.
    let mut b = body(json!({"n_predict": 3}));
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(chat(b)["usage"]["completion_tokens"], 3);
    let mut b = body(json!({"n_predict": -1}));
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(chat(b)["choices"][0]["finish_reason"], "stop");
    // llama.cpp's typical, top-n-σ and XTC samplers (tests/truncation_samplers.rs holds them
    // to llama.cpp's); at temperature 0 the best token XTC leaves.
    for extra in [
        json!({"typical_p": 0.9, "temperature": 0.8, "seed": 1}),
        json!({"top_n_sigma": 1.5, "temperature": 0.8, "seed": 1}),
        json!({"xtc_probability": 0.5, "xtc_threshold": 0.1, "temperature": 0.8, "seed": 1}),
        json!({"dynatemp_range": 0.5, "dynatemp_exponent": 1.5, "temperature": 0.8}),
        json!({"mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2, "temperature": 0.8}),
        json!({"mirostat": 1, "temperature": 0.8, "seed": 3}),
    ] {
        assert!(chat(body(extra))["choices"][0]["finish_reason"].is_string());
    }
    // Neutral values of samplers this server lacks pass; active ones are named.
    chat(body(
        json!({"typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0}),
    ));
    for (extra, name) in [
        (json!({"mirostat": 3}), "mirostat"),
        (json!({"typical_p": 0.0}), "typical_p"),
        (json!({"tfs_z": 0.5}), "tfs_z"),
        (json!({"dynatemp_range": -1.0}), "dynatemp_range"),
        (json!({"dry_multiplier": 0.8, "dry_base": 0.5}), "dry_base"),
        (
            json!({"dry_multiplier": 0.8, "dry_penalty_last_n": -2}),
            "dry_penalty_last_n",
        ),
        (json!({"xtc_probability": 1.5}), "xtc_probability"),
        (json!({"n_predict": 4}), "n_predict"),
    ] {
        let r = post(addr, "/v1/chat/completions", &body(extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert!(r.text().contains(name), "{}", r.text());
    }
}

/// llama.cpp's DRY fields: a greedy reply that would go on repeating its prompt's loop takes
/// another token once the token extending the loop is penalized (`tests/dry_sampler.rs` holds
/// the penalties to llama.cpp's).
#[test]
fn dry_breaks_a_loop_the_greedy_reply_would_repeat() {
    let prompt = "the cat sat on the mat and the cat sat on the mat and the cat sat on the";
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
    let reply = |extra: Value| common::completion_text(server().addr, &body, &extra);
    let free = reply(json!({}));
    assert!(free.starts_with(" mat"), "the loop goes on: {free:?}");
    let dry = reply(json!({"dry_multiplier": 0.8}));
    assert!(!dry.starts_with(" mat"), "{dry:?}");
    // Off at multiplier 0, and breakers of the request's own are taken.
    assert_eq!(reply(json!({"dry_multiplier": 0.0})), free);
    let custom = reply(json!({"dry_multiplier": 0.8, "dry_sequence_breakers": ["mat"]}));
    assert!(
        custom.starts_with(" mat"),
        "\"mat\" breaks every repeat: {custom:?}"
    );
}

/// llama.cpp's `GET /props` and `POST /apply-template`: the served settings and template, and
/// a conversation rendered exactly as a chat request renders it.
#[test]
fn props_and_apply_template_show_what_the_server_runs() {
    let addr = server().addr;
    let files = trit::format::open(&common::default_model_path()).unwrap();
    let source = files
        .chat_template
        .clone()
        .expect("the default model has a template");
    let p = get(addr, "/props").json();
    assert_eq!(p["default_generation_settings"]["n_ctx"], 256, "{p}");
    assert_eq!(p["total_slots"], 4, "{p}");
    assert_eq!(p["chat_template"], source.as_str());
    assert!(p["eos_tokens"]
        .as_array()
        .unwrap()
        .contains(&json!("<|im_end|>")));
    let params = &p["default_generation_settings"]["params"];
    assert!(
        params["temperature"].is_number() && params["top_p"].is_number(),
        "{p}"
    );

    let messages = json!([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hi there"}]);
    let r = post(addr, "/apply-template", &json!({ "messages": messages }));
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt = r.json()["prompt"].as_str().unwrap().to_string();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let template = trit::chat::ChatTemplate::new(
        &source,
        &tok.bos_token().unwrap_or_default(),
        &tok.eos_token().unwrap_or_default(),
    )
    .unwrap();
    let no_kwargs = serde_json::Map::new();
    let msgs = messages.as_array().unwrap();
    let want = template.render(msgs, true, None, &no_kwargs).unwrap();
    assert_eq!(prompt, want);
    assert!(prompt.contains("Hi there") && prompt.ends_with("<|im_start|>assistant\n"));
    let r = post(
        addr,
        "/apply-template",
        &json!({"messages": messages, "add_generation_prompt": false}),
    );
    let open = r.json()["prompt"].as_str().unwrap().to_string();
    assert_eq!(
        open,
        template.render(msgs, false, None, &no_kwargs).unwrap()
    );
    assert!(!open.ends_with("<|im_start|>assistant\n"), "{open:?}");
    for bad in [json!({"messages": []}), json!({"prompt": "x"})] {
        let r = post(addr, "/apply-template", &bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
}
