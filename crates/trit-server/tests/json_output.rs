//! `response_format` enforced on the default model: the replies parse (serde_json) as
//! documents of the requested schema, streamed or not, greedy or sampled, on both endpoints;
//! schemas that cannot be enforced are refused by name.

mod common;

use common::{post, Options, TestServer};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| common::start(Options::default()))
}

/// Bounded (every string has a maxLength), so that any document ends within the token budget.
fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24},
            "population": {"type": "integer", "multipleOf": 1000},
            "capital": {"type": "boolean"},
            "kind": {"enum": ["town", "city", "village"]},
            "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
            "founded": {"type": "string", "format": "date"},
            "area_km2": {"type": "number", "exclusiveMinimum": 0, "maximum": 20000,
                         "multipleOf": 0.5}
        },
        "required": ["city", "country", "population", "capital", "kind", "code", "founded",
                     "area_km2"],
        "additionalProperties": false
    })
}

fn check_city(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    assert_eq!(o.len(), 8, "{v}");
    for k in [
        "city",
        "country",
        "population",
        "capital",
        "kind",
        "code",
        "founded",
        "area_km2",
    ] {
        assert!(keys.contains(&k), "{k} missing: {v}");
    }
    assert!(
        o["city"].as_str().is_some_and(|s| s.chars().count() <= 24),
        "{v}"
    );
    assert!(
        o["country"]
            .as_str()
            .is_some_and(|s| s.chars().count() <= 24),
        "{v}"
    );
    assert!(
        o["population"].as_i64().is_some_and(|p| p % 1000 == 0),
        "{v}"
    );
    let area = o["area_km2"].as_f64().unwrap();
    assert!(
        area > 0.0 && area <= 20000.0 && (2.0 * area).fract() == 0.0,
        "{v}"
    );
    assert!(o["capital"].is_boolean(), "{v}");
    assert!(
        ["town", "city", "village"].contains(&o["kind"].as_str().unwrap()),
        "{v}"
    );
    let code = o["code"].as_str().unwrap();
    assert!(
        code.len() == 2 && code.bytes().all(|b| b.is_ascii_uppercase()),
        "{v}"
    );
    // A date, as Python's date.fromisoformat reads one: YYYY-MM-DD.
    let day: Vec<&str> = o["founded"].as_str().unwrap().split('-').collect();
    assert!(
        day.len() == 3 && day[0].len() == 4 && day[1].len() == 2 && day[2].len() == 2,
        "{v}"
    );
    let (m, d): (u32, u32) = (day[1].parse().unwrap(), day[2].parse().unwrap());
    assert!((1..=12).contains(&m) && (1..=31).contains(&d), "{v}");
}

fn chat_body(format: Value, stream: bool, temperature: f32) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Describe Paris as JSON."}],
        "max_tokens": 200, "temperature": temperature, "seed": 5, "stream": stream,
        "response_format": format,
    })
}

/// The reply's content and finish reason, streamed or not.
fn reply(path: &str, body: &Value) -> (String, String) {
    common::reply(server().addr, path, body)
}

#[test]
fn a_json_schema_reply_is_a_document_of_that_schema() {
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "city", "schema": city_schema()}});
    let (whole, finish) = reply(
        "/v1/chat/completions",
        &chat_body(format.clone(), false, 0.0),
    );
    assert_eq!(finish, "stop", "{whole}");
    check_city(&serde_json::from_str(&whole).unwrap_or_else(|e| panic!("{e}: {whole}")));
    // Streamed: the same greedy document.
    let (streamed, finish) = reply(
        "/v1/chat/completions",
        &chat_body(format.clone(), true, 0.0),
    );
    assert_eq!(
        (streamed.as_str(), finish.as_str()),
        (whole.as_str(), "stop")
    );
    // Sampled: the draws that do not fit are redrawn under the mask.
    for seed in 0..3 {
        let mut body = chat_body(format.clone(), false, 1.0);
        body["seed"] = json!(seed);
        let (text, finish) = reply("/v1/chat/completions", &body);
        assert_eq!(finish, "stop", "{text}");
        check_city(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
    }
}

/// pydantic's `Union[Landmark, Person]` with a discriminator: two object models the first
/// byte cannot tell apart, read along both; each reply is a document of exactly one.
#[test]
fn a_union_of_two_models_gives_a_document_of_one() {
    let schema = json!({
        "$defs": {
            "Landmark": {"type": "object", "title": "Landmark", "properties": {
                "kind": {"const": "landmark"},
                "name": {"type": "string", "maxLength": 24},
                "year": {"type": "integer", "minimum": 1000, "maximum": 2030}},
                "required": ["kind", "name", "year"], "additionalProperties": false},
            "Person": {"type": "object", "title": "Person", "properties": {
                "kind": {"const": "person"},
                "name": {"type": "string", "maxLength": 24},
                "born": {"type": "integer", "minimum": 1000, "maximum": 2030}},
                "required": ["kind", "name"], "additionalProperties": false}
        },
        "oneOf": [{"$ref": "#/$defs/Landmark"}, {"$ref": "#/$defs/Person"}],
        "discriminator": {"propertyName": "kind",
                          "mapping": {"landmark": "#/$defs/Landmark", "person": "#/$defs/Person"}}
    });
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v.as_object().expect("an object");
        let name = o["name"].as_str().expect("a name");
        assert!(name.chars().count() <= 24, "{text}");
        let year = |k: &str| {
            o.get(k)
                .is_none_or(|y| y.as_i64().is_some_and(|y| (1000..=2030).contains(&y)))
        };
        match o["kind"].as_str() {
            Some("landmark") => {
                assert!(
                    o.len() == 3 && o.contains_key("year") && year("year"),
                    "{text}"
                )
            }
            Some("person") => assert!(
                o.keys()
                    .all(|k| ["kind", "name", "born"].contains(&k.as_str()))
                    && year("born"),
                "{text}"
            ),
            _ => panic!("neither model: {text}"),
        }
    };
    let format = json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}});
    for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.0, 2), (1.0, 3)] {
        let mut body = chat_body(format.clone(), false, temperature);
        body["seed"] = json!(seed);
        let (text, finish) = reply("/v1/chat/completions", &body);
        assert_eq!(finish, "stop", "{text}");
        check(&text);
    }
}

#[test]
fn without_a_format_the_same_prompt_is_not_json() {
    // So the documents above are the constraint's doing, not the model's habit.
    let mut body = chat_body(json!({"type": "text"}), false, 0.0);
    body["max_tokens"] = json!(40);
    let (text, _) = reply("/v1/chat/completions", &body);
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
}

#[test]
fn json_object_replies_and_completions_are_objects() {
    let format = json!({"type": "json_object"});
    let mut body = chat_body(format.clone(), false, 0.0);
    body["max_tokens"] = json!(200);
    let (text, finish) = reply("/v1/chat/completions", &body);
    match finish.as_str() {
        "stop" => assert!(
            serde_json::from_str::<Value>(&text).unwrap().is_object(),
            "{text}"
        ),
        _ => assert!(text.starts_with('{'), "{text}"),
    }
    // The completions endpoint, with llama.cpp's `schema` beside json_object.
    let body = json!({"prompt": "The city of Paris, as JSON:", "max_tokens": 200, "temperature": 0,
                      "response_format": {"type": "json_object", "schema": city_schema()}});
    let (text, finish) = reply("/v1/completions", &body);
    assert_eq!(finish, "stop", "{text}");
    check_city(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
}

#[test]
fn formats_that_cannot_be_enforced_are_refused_by_name() {
    let hello = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (extra, word) in [
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "object", "minProperties": 2}}}}),
            "minProperties",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "tools": [{"type": "function",
                   "function": {"name": "f", "parameters": {"type": "object"}}}]}),
            "tools",
        ),
        (
            json!({"response_format": {"type": "json_object"},
                   "chat_template_kwargs": {"enable_thinking": true}}),
            "enable_thinking",
        ),
    ] {
        let r = post(server().addr, "/v1/chat/completions", &hello(extra.clone()));
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(word), "{extra}: {msg}");
    }
}

#[test]
fn llama_cpp_json_schema_field_is_enforced() {
    let body = json!({"prompt": "The city of Paris, as JSON:", "max_tokens": 200, "temperature": 0,
                      "json_schema": city_schema()});
    let (text, finish) = reply("/v1/completions", &body);
    assert_eq!(finish, "stop", "{text}");
    check_city(&serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
         "parameters": {"type": "object", "properties": {
             "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
             "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Local time",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
             "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn check_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().unwrap();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    let o = args.as_object().unwrap();
    match name {
        "get_weather" => {
            assert_eq!(o.len(), 2, "{call}");
            assert!(
                o["city"].as_str().is_some_and(|c| c.chars().count() <= 20),
                "{call}"
            );
            assert!(o["unit"] == "c" || o["unit"] == "f", "{call}");
        }
        "get_time" => {
            assert_eq!(o.len(), 1, "{call}");
            assert!(
                o["zone"].as_str().is_some_and(|z| z.chars().count() <= 12),
                "{call}"
            );
        }
        other => panic!("called {other}"),
    }
}

#[test]
fn a_forced_tool_choice_calls_a_tool_with_fitting_arguments() {
    forced_tool_choice_calls_a_fitting_tool(
        server(),
        "{\"name\": \"get_weather\", \"arguments\": ",
    );
}

/// A Qwen3.5-style template (tool calls shown in the XML dialect, `<function=NAME>`) on the
/// default model: a forced tool call is written in that dialect and read back the same.
/// A Qwen3.5-style template on the default model: tool calls shown in the XML dialect.
fn xml_server() -> &'static TestServer {
    static XML: OnceLock<TestServer> = OnceLock::new();
    let template = "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} \
        {{ t.function.name }}{% endfor %}. Call one as <tool_call>\n<function=NAME>\n\
        <parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n\
        {% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\
        <|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n\
        {% endif %}";
    XML.get_or_init(|| {
        common::start(Options {
            chat_template: Some(template.into()),
            ..Options::default()
        })
    })
}

#[test]
fn a_forced_tool_choice_in_the_xml_dialect_calls_a_tool_with_fitting_arguments() {
    forced_tool_choice_calls_a_fitting_tool(xml_server(), "<function=get_weather>\n<parameter=");
}

/// tool_choice auto: the reply is free, but a call the model starts is decoded under the
/// tools' schema. Free, the default model copies a user's example calls into malformed ones (a
/// doubled `<tool_call>`, pretty-printed JSON left open); here every call it writes parses and
/// fits its tool, in both dialects, whole and streamed, and `parallel_tool_calls: false` ends
/// the reply after the first.
#[test]
fn calls_the_model_starts_on_its_own_fit_their_tools() {
    // The JSON dialect's reply goes on after its first call and makes more.
    auto_tool_calls_fit(server(), "<tool_call>\n{\"name\": \"get_", 2);
    auto_tool_calls_fit(xml_server(), "<tool_call>\n<function=get_", 1);
}

/// Two calls in the JSON dialect, for the model to copy.
fn examples() -> String {
    let mut examples = String::new();
    for city in ["Paris", "Rome"] {
        examples.push_str(&format!(
            "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\", \
             \"unit\": \"c\"}}}}\n</tool_call>\n"
        ));
    }
    examples
}

fn auto_tool_calls_fit(server: &TestServer, dialect: &str, min_calls: usize) {
    let examples = examples();
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user",
                                   "content": format!("Write tool calls like these:\n{examples}")}],
                           "tools": tools(), "max_tokens": 120, "temperature": 0,
                           "logprobs": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let text = |v: &Value| -> String {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap_or_else(|| panic!("no logprobs: {v}"))
            .iter()
            .map(|t| t["token"].as_str().unwrap())
            .collect()
    };
    let v = post(server.addr, "/v1/chat/completions", &body(json!({}))).json();
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let written = text(&v);
    assert!(calls.len() >= min_calls, "{written:?} → {v}");
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    // Each call the model opened and closed is one of the reply's calls.
    assert!(written.starts_with(dialect), "{written:?}");
    assert_eq!(
        written.matches("</tool_call>").count(),
        calls.len(),
        "{written:?}"
    );
    calls.iter().for_each(check_call);
    // Streamed: the deltas add up to the same calls.
    let mut b = body(json!({"stream": true}));
    b.as_object_mut().unwrap().remove("logprobs");
    let mut streamed: Vec<(String, String)> = Vec::new();
    for e in post(server.addr, "/v1/chat/completions", &b).events() {
        for d in e["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == streamed.len() {
                streamed.push(Default::default());
            }
            streamed[i]
                .0
                .push_str(d["function"]["name"].as_str().unwrap_or(""));
            streamed[i]
                .1
                .push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(streamed.len(), calls.len());
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    for ((name, args), call) in streamed.iter().zip(&calls) {
        assert_eq!(name, call["function"]["name"].as_str().unwrap());
        assert_eq!(
            parse(args),
            parse(call["function"]["arguments"].as_str().unwrap())
        );
    }
    // One call, then the end.
    let v = post(
        server.addr,
        "/v1/chat/completions",
        &body(json!({"parallel_tool_calls": false})),
    )
    .json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    check_call(&calls[0]);
    // Nothing after the call but the end token (which `logprobs` lists).
    let written = text(&v);
    let (_, after) = written.split_once("</tool_call>").unwrap();
    assert!(after.is_empty() || after == "<|im_end|>", "{written:?}");
}

/// Forced calls, named and `required`, whole and streamed; the model's text (its tokens, from
/// `logprobs`) holds `dialect`.
fn forced_tool_choice_calls_a_fitting_tool(server: &TestServer, dialect: &str) {
    let body = |choice: Value, stream: bool| {
        json!({"messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
               "tools": tools(), "tool_choice": choice, "max_tokens": 120, "temperature": 0,
               "stream": stream})
    };
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, want) in [(named, Some("get_weather")), (json!("required"), None)] {
        let r = post(
            server.addr,
            "/v1/chat/completions",
            &body(choice.clone(), false),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        check_call(&calls[0]);
        if let Some(w) = want {
            assert_eq!(calls[0]["function"]["name"], w);
            // The text the model wrote, token by token.
            let mut b = body(choice.clone(), false);
            b["logprobs"] = json!(true);
            let r = post(server.addr, "/v1/chat/completions", &b).json();
            let text: String = r["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap_or_else(|| panic!("no logprobs: {r}"))
                .iter()
                .map(|t| t["token"].as_str().unwrap())
                .collect();
            assert!(text.contains(dialect), "{text:?}");
        }
        // Streamed: the deltas add up to the same call.
        let r = post(
            server.addr,
            "/v1/chat/completions",
            &body(choice.clone(), true),
        );
        let (mut name, mut args) = (String::new(), String::new());
        for e in r.events() {
            for d in e["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                name.push_str(d["function"]["name"].as_str().unwrap_or(""));
                args.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(name, calls[0]["function"]["name"].as_str().unwrap());
        // (streamed as the model wrote them; the whole reply re-serializes them compactly)
        let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert_eq!(
            parse(&args),
            parse(calls[0]["function"]["arguments"].as_str().unwrap())
        );
    }
    for (choice, word) in [
        (
            json!({"type": "function", "function": {"name": "nope"}}),
            "nope",
        ),
        (json!("sometimes"), "tool_choice"),
    ] {
        let r = post(server.addr, "/v1/chat/completions", &body(choice, false));
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains(word), "{}", r.text());
    }
    let no_tools = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                          "tool_choice": "required"});
    let r = post(server.addr, "/v1/chat/completions", &no_tools);
    assert_eq!(r.status, 400, "{}", r.text());
}
