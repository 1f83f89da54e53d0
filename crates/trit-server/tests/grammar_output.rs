//! llama.cpp's `grammar` field (GBNF) enforced on the default model: replies, greedy or
//! sampled, streamed or not, on the OpenAI endpoints and llama.cpp's `/completion`, are strings
//! of the grammar — checked here by hand-written string tests and serde_json, not by the
//! recognizer that produced them; bad grammars and conflicting fields get a 400 with the reason.

mod common;

use common::{post, reply, Options, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

/// "yes" or "no", ", because ", 1–40 lowercase letters or spaces, ".".
const VERDICT: &str = r#"root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."  # one sentence"#;

fn check_verdict(text: &str) {
    let rest = text
        .strip_prefix("yes, because ")
        .or_else(|| text.strip_prefix("no, because "))
        .unwrap_or_else(|| panic!("no verdict: {text:?}"));
    let reason = rest
        .strip_suffix('.')
        .unwrap_or_else(|| panic!("no full stop: {text:?}"));
    assert!((1..=40).contains(&reason.len()), "{text:?}");
    assert!(
        reason.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()),
        "{text:?}"
    );
}

#[test]
fn completions_follow_the_grammar_greedy_sampled_and_streamed() {
    for (temperature, seed, stream) in [(0.0, 0, false), (1.0, 7, false), (1.2, 11, true)] {
        let body = json!({"prompt": "Is the sea salty? Answer:", "max_tokens": 80,
                          "temperature": temperature, "seed": seed, "stream": stream,
                          "grammar": VERDICT});
        let (text, finish) = reply(server().addr, "/v1/completions", &body);
        check_verdict(&text);
        // The grammar's end leaves only end-of-sequence: the reply stops, not at the limit.
        assert_eq!(finish, "stop", "{text:?}");
    }
}

#[test]
fn chat_replies_follow_the_grammar() {
    // A small JSON object: serde_json (not the recognizer) reads the reply.
    let grammar = r#"
        root ::= "{" ws "\"name\":" ws "\"" [A-Z] [a-z]{1,11} "\"" ws "," ws "\"age\":" ws age ws "}"
        age  ::= [1-9] [0-9]?
        ws   ::= [ ]?
    "#;
    for temperature in [0.0, 0.9] {
        let body = json!({"messages": [{"role": "user", "content": "Invent a person."}],
                          "max_tokens": 60, "temperature": temperature, "seed": 3,
                          "grammar": grammar});
        let (text, finish) = reply(server().addr, "/v1/chat/completions", &body);
        assert_eq!(finish, "stop", "{text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let name = v["name"].as_str().unwrap_or_else(|| panic!("{text:?}"));
        assert!(name.len() >= 2 && name.len() <= 12, "{text:?}");
        assert!(
            name.starts_with(|c: char| c.is_ascii_uppercase()),
            "{text:?}"
        );
        let age = v["age"].as_u64().unwrap_or_else(|| panic!("{text:?}"));
        assert!((1..=99).contains(&age), "{text:?}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{text:?}");
    }
}

#[test]
fn llama_cpp_completion_endpoint_takes_the_grammar() {
    let body = json!({"prompt": "Is fire cold? Answer:", "n_predict": 80, "temperature": 0,
                      "grammar": VERDICT});
    let r = post(server().addr, "/completion", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    check_verdict(r.json()["content"].as_str().unwrap());
}

#[test]
fn bad_grammars_and_conflicts_are_refused_with_the_reason() {
    let cases = [
        (json!("root ::= root \"a\""), "left-recursive"),
        (json!("root ::= \"a\"\nfoo ::= [z-a]"), "line 2"),
        (json!("start ::= \"a\""), "root"),
        (json!(["root ::= \"a\""]), "grammar must be a string"),
    ];
    for (grammar, word) in cases {
        for path in ["/v1/completions", "/completion"] {
            let body = json!({"prompt": "x", "max_tokens": 2, "grammar": grammar});
            let r = post(server().addr, path, &body);
            assert_eq!(r.status, 400, "{path} {grammar}: {}", r.text());
            assert!(r.text().contains(word), "{path} {grammar}: {}", r.text());
        }
    }
    let both = json!({"prompt": "x", "max_tokens": 2, "grammar": "root ::= \"a\"",
                      "response_format": {"type": "json_object"}});
    let r = post(server().addr, "/v1/completions", &both);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("not both"), "{}", r.text());
    // A chat reply under a grammar starts the reply: thinking first is refused.
    let think = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                       "grammar": "root ::= \"a\"",
                       "chat_template_kwargs": {"enable_thinking": true}});
    let r = post(server().addr, "/v1/chat/completions", &think);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("enable_thinking"), "{}", r.text());
    // A null grammar is no grammar.
    let null = json!({"prompt": "x", "max_tokens": 2, "grammar": null});
    assert_eq!(post(server().addr, "/v1/completions", &null).status, 200);
}

/// llama.cpp's lazy grammars (`grammar_lazy` + `grammar_triggers`): the text is free until a
/// trigger word, the grammar binds from it to the end of its string, and then the text is free
/// again. The default model continues a run of tool calls (newline first, then `<tool_call>`);
/// with a lazy grammar that wants an upper-case name after the trigger, the newline stays and
/// every call it starts has such a name; a plain grammar binds from the first token.
#[test]
fn a_lazy_grammar_binds_from_its_trigger() {
    let examples: Vec<String> = ["Paris", "Rome", "Oslo"]
        .iter()
        .map(|c| {
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{c}\"}}}}\n\
                 </tool_call>"
            )
        })
        .collect();
    let prompt = examples.join("\n");
    let grammar = r#"root ::= "<tool_call>\n{\"name\": \"" [A-Z]{2,8} "\"}""#;
    let body = json!({"prompt": prompt, "max_tokens": 40, "temperature": 0});
    let text = |extra: Value| common::completion_text(server().addr, &body, &extra);
    let free = text(json!({}));
    assert!(free.starts_with("\n<tool_call>"), "{free:?}");
    let trigger = json!([{"type": 1, "value": "<tool_call>"}]);
    let lazy = text(json!({"grammar": grammar, "grammar_lazy": true, "grammar_triggers": trigger}));
    assert!(lazy.starts_with('\n'), "free before the trigger: {lazy:?}");
    let calls: Vec<&str> = lazy.split("<tool_call>").skip(1).collect();
    assert!(!calls.is_empty(), "{lazy:?}");
    for (i, call) in calls.iter().enumerate() {
        let Some(name) = call.strip_prefix("\n{\"name\": \"") else {
            assert!(
                i + 1 == calls.len(),
                "only the last may be cut short: {lazy:?}"
            );
            continue;
        };
        let upper = name.bytes().take_while(u8::is_ascii_uppercase).count();
        let cut = i + 1 == calls.len() && !name.contains('"');
        assert!(
            cut || ((2..=8).contains(&upper) && name[upper..].starts_with("\"}")),
            "{lazy:?}"
        );
    }
    // A plain grammar binds from the first token: no newline, one string and the end.
    let plain = text(json!({"grammar": grammar}));
    assert!(
        plain.starts_with("<tool_call>\n{\"name\": \"") && plain.ends_with("\"}"),
        "{plain:?}"
    );
    for (extra, word) in [
        (json!({"grammar_lazy": true}), "grammar_triggers"),
        (
            json!({"grammar_lazy": true, "grammar_triggers": [{"type": 2, "value": "<.*"}]}),
            "pattern",
        ),
        (
            json!({"grammar_lazy": true, "grammar_triggers": [{"type": 1, "value": "Next"}]}),
            "Next",
        ),
    ] {
        let mut b = json!({"prompt": "Hi", "max_tokens": 4, "grammar": grammar});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = post(server().addr, "/v1/completions", &b);
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains(word), "{}", r.text());
    }
}
