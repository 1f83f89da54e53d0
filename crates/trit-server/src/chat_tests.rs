use super::*;
use trit::engine::FinishReason;

fn default_tokenizer() -> Arc<Tokenizer> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let path = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .unwrap();
    let files = trit::format::open(&path).unwrap();
    Arc::new(Tokenizer::from_source(&files.tokenizer).unwrap())
}

fn chunks(tools: bool, include_usage: bool) -> ChatChunks {
    ChatChunks {
        ctx: ReplyContext {
            model_id: "m".into(),
            tokenizer: default_tokenizer(),
            id: "chatcmpl-1".into(),
            created: 1,
            tools,
            logprobs: false,
            index: 0,
        },
        reasoning: ReasoningStream::new(false),
        tool_stream: tools.then(ToolCallStream::default),
        include_usage,
        pending_logprobs: Vec::new(),
    }
}

fn summary() -> SeqSummary {
    SeqSummary {
        finish: FinishReason::Stop,
        prompt_tokens: 5,
        cached_tokens: 2,
        completion_tokens: 9,
        prompt_secs: 0.0,
        gen_secs: 0.0,
    }
}

#[test]
fn stream_separates_reasoning_content_and_tool_calls() {
    let mut c = chunks(true, true);
    let mut events = c.start();
    for piece in [
        "<think>\nLet me",
        " look.</th",
        "ink>\n\nChecking",
        " now.\n<tool_",
        "call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    ] {
        events.extend(c.piece(Some(1), piece, None));
    }
    events.extend(c.done(&summary()));
    events.extend(c.usage_chunk(&summary()));
    let delta = |e: &Value| e["choices"][0]["delta"].clone();
    assert_eq!(
        delta(&events[0]),
        json!({"role": "assistant", "content": ""})
    );
    let field = |name: &str| -> String {
        events
            .iter()
            .filter_map(|e| delta(e).get(name)?.as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(field("reasoning_content"), "Let me look.");
    assert_eq!(field("content"), "Checking now.\n");
    // The call streams: its name first, then argument fragments, one call per delta.
    let calls: Vec<Value> = events
        .iter()
        .filter_map(|e| Some(delta(e).get("tool_calls")?[0].clone()))
        .collect();
    assert!(calls.len() >= 2, "{calls:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "weather");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    let arguments: String = calls
        .iter()
        .map(|c| c["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Paris"})
    );
    let n = events.len();
    assert_eq!(events[n - 2]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(events[n - 2]["choices"][0]["delta"], json!({}));
    // llama.cpp's timings ride on the finishing chunk.
    assert_eq!(events[n - 2]["timings"]["cache_n"], 2);
    assert!(events[n - 2]["timings"]["predicted_per_second"].is_number());
    assert_eq!(events[n - 1]["choices"], json!([]));
    assert_eq!(events[n - 1]["usage"]["total_tokens"], 14);
    assert_eq!(
        events[n - 1]["usage"]["prompt_tokens_details"]["cached_tokens"],
        2
    );
}

/// The official `openai` Python client (installed by tools/fetch_assets.sh) accumulates a
/// streamed reply with two tool calls, one per dialect, cut into small pieces: it must end
/// with both calls whole (ids, names, JSON arguments), having seen argument fragments.
/// Skipped, with a notice, when the client is absent.
#[test]
fn official_client_accumulates_streamed_tool_calls() {
    // Found like tests/openai_client.rs: TRIT_OPENAI_PYTHON, else TRIT_CACHE or .cache.
    let python = std::env::var_os("TRIT_OPENAI_PYTHON").map_or_else(
        || {
            let cache = std::env::var_os("TRIT_CACHE").map_or_else(
                || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
                std::path::PathBuf::from,
            );
            cache.join("openai-client/bin/python")
        },
        std::path::PathBuf::from,
    );
    if !python.exists() {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh)",
            python.display()
        );
        return;
    }
    let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                 {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n\
                 <function=get_time>\n<parameter=zone>\nEurope/Paris\n</parameter>\n\
                 <parameter=precise>\ntrue\n</parameter>\n</function>\n</tool_call>";
    let mut c = chunks(true, false);
    let mut events = c.start();
    let chars: Vec<char> = reply.chars().collect();
    for piece in chars.chunks(5) {
        events.extend(c.piece(Some(1), &piece.iter().collect::<String>(), None));
    }
    events.extend(c.done(&summary()));
    let input: String = events.iter().map(|e| format!("{e}\n")).collect();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/openai_tool_stream_check.py");
    let mut child = std::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["content"], "Let me check.\n");
    assert_eq!(got["finish_reason"], "tool_calls");
    let calls = got["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{got}");
    let args = |i: usize| -> Value {
        serde_json::from_str(calls[i]["arguments"].as_str().unwrap()).unwrap()
    };
    assert_eq!(calls[0]["name"], "get_weather");
    assert_eq!(args(0), json!({"city": "Paris", "days": [1, 2]}));
    assert_eq!(calls[1]["name"], "get_time");
    assert_eq!(args(1), json!({"zone": "Europe/Paris", "precise": true}));
    assert!(calls
        .iter()
        .all(|c| c["id"].as_str().unwrap().starts_with("call_")));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    // Arguments arrived in fragments (more deltas than calls), each call closed once.
    assert!(got["argument_deltas"].as_u64().unwrap() > 4, "{got}");
    assert_eq!(got["arguments_done"], 2);
}

#[test]
fn without_tools_tags_stay_text_and_finish_is_the_engines() {
    let mut c = chunks(false, false);
    let mut events = c.piece(Some(1), "a <tool_call>{}</tool_call>", None);
    events.extend(c.done(&summary()));
    assert_eq!(
        events[0]["choices"][0]["delta"]["content"],
        "a <tool_call>{}</tool_call>"
    );
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[test]
fn messages_are_checked_and_text_parts_flattened() {
    let ok = normalize_messages(&[json!({"role": "developer", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})])
    .unwrap();
    assert_eq!(ok[0], json!({"role": "system", "content": "ab"}));
    let call = normalize_messages(&[json!({"role": "assistant", "content": null,
        "tool_calls": [{"id": "c", "type": "function"}]})])
    .unwrap();
    assert_eq!(call[0]["content"], "");
    assert!(normalize_messages(&[]).is_err());
    assert!(normalize_messages(&[json!({"role": "robot", "content": "x"})]).is_err());
    assert!(normalize_messages(&[json!({"role": "user", "content": 5})]).is_err());
    assert!(normalize_messages(&[json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]})])
    .is_err());
}

/// The lazy call rule `call_watch` builds: free inside the thinking block the template
/// opened, bound to the tools' schema after `<tool_call>` outside it, and (parallel calls
/// off) only the end after one call.
#[test]
fn calls_bind_outside_the_thinking_block_only() {
    use trit::sample::{constraint_for, ConstrainedOutput, Sampler, SamplingParams, TokenTable};
    let words = [
        "<tool_call>",
        "x",
        "</think>",
        "\n",
        "{\"name\": \"f\", \"arguments\": {}}",
        "\n</tool_call>",
    ];
    let eos = words.len() as u32;
    let mut bytes: Vec<Option<Vec<u8>>> =
        words.iter().map(|w| Some(w.as_bytes().to_vec())).collect();
    bytes.push(None);
    let table = Arc::new(TokenTable::from_bytes(bytes));
    let template = ChatTemplate::new("{{ messages }}", "", "").unwrap();
    let tools = [json!({"type": "function", "function": {"name": "f"}})];
    let rule = call_watch(&template, &tools, true, true).expect("a rule");
    let mut c = constraint_for(&ConstrainedOutput { rule, table }, vec![eos]);
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    // The greedy pick of a row where `best` leads and every other token is far behind.
    let mut pick = |c: &trit::sample::OutputConstraint, best: u32| {
        let mut row = vec![0.0f32; words.len() + 1];
        row[best as usize] = 10.0;
        c.sample(&mut sampler, &mut row, &[]).unwrap()
    };
    // Thinking: "<tool_call>" then "x" is plain text.
    for tok in [0, 1, 2] {
        assert_eq!(pick(&c, tok), tok);
        c.advance(tok);
    }
    // After the block: a call, bound to its schema ("x" cannot follow; "\n" must).
    assert_eq!(pick(&c, 0), 0);
    c.advance(0);
    assert_eq!(pick(&c, 1), 3);
    for tok in [3, 4, 5] {
        c.advance(tok);
    }
    // One call only: the end, whatever the row says.
    assert_eq!(pick(&c, 1), eos);
}
