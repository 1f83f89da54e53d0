//! `POST /v1/responses` (OpenAI's Responses API) on the default model: the reply is what
//! `/v1/chat/completions` gives for the same messages (same prompt through the template, greedy),
//! in the Responses shape; its stream is the API's event sequence and adds up to the same
//! text; a template that opens a thinking block gives a `reasoning` item; JSON formats decode;
//! a forced function tool gives a `function_call` item (whole and streamed) and a call's
//! result goes back in as input items; stored responses continue a conversation with
//! `previous_response_id` exactly as chat does with the whole history, and are read and deleted
//! by id; conversations hold the history of the responses sent in them; what the server
//! cannot do is refused.

mod common;
use common::*;
use serde_json::{json, Value};

/// `output_text` of a response's message item(s).
fn output_text(resp: &Value) -> String {
    resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

/// A response's text and prompt tokens are the chat completion's.
fn assert_same_as_chat(resp: &Value, chat: &Value) {
    assert_eq!(output_text(resp), chat["choices"][0]["message"]["content"]);
    assert_eq!(
        resp["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
}

fn chat_reply(server: &TestServer, messages: Value, max: u32) -> Value {
    let r = post(
        server.addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": max, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn a_response_is_the_chat_reply_in_the_responses_shape() {
    let server = start(Options::default());
    let chat = chat_reply(
        &server,
        json!([{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "What is the capital of France?"}]),
        12,
    );
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"model": "default", "instructions": "Be brief.",
                "input": "What is the capital of France?", "max_output_tokens": 12,
                "temperature": 0, "metadata": {"k": "v"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let resp = r.json();
    assert_eq!(resp["object"], "response");
    assert!(resp["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(output_text(&resp), chat["choices"][0]["message"]["content"]);
    assert_eq!(
        resp["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    assert_eq!(
        resp["usage"]["output_tokens"],
        chat["usage"]["completion_tokens"]
    );
    assert_eq!(resp["metadata"]["k"], "v");
    let finish = chat["choices"][0]["finish_reason"].as_str().unwrap();
    match finish {
        "length" => {
            assert_eq!(resp["status"], "incomplete");
            assert_eq!(resp["incomplete_details"]["reason"], "max_output_tokens");
        }
        _ => assert_eq!(resp["status"], "completed"),
    }
    let item = &resp["output"][0];
    assert_eq!(
        (item["type"].as_str(), item["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");

    // Message items with text parts (a developer message is a system one) = chat's messages.
    let chat = chat_reply(
        &server,
        json!([{"role": "system", "content": "Answer in French."},
               {"role": "user", "content": "Hello"},
               {"role": "assistant", "content": "Bonjour"},
               {"role": "user", "content": "Thanks"}]),
        8,
    );
    let resp = post(
        server.addr,
        "/v1/responses",
        &json!({"temperature": 0, "max_output_tokens": 8, "input": [
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Bonjour"}]},
            {"role": "user", "content": "Thanks"}]}),
    )
    .json();
    assert_eq!(output_text(&resp), chat["choices"][0]["message"]["content"]);
}

#[test]
fn the_stream_is_the_apis_event_sequence_and_adds_up_to_the_reply() {
    let server = start(Options::default());
    let body = json!({"input": "Once upon a time", "max_output_tokens": 10, "temperature": 0});
    let whole = post(server.addr, "/v1/responses", &body).json();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(server.addr, "/v1/responses", &streamed);
    assert_eq!(r.status, 200);
    let events = r.events();
    assert!(
        !events.contains(&json!("[DONE]")),
        "no [DONE] in the Responses stream"
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    want.push(if whole["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    });
    assert_eq!(kinds, want);
    assert!(deltas > 0);
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, output_text(&whole));
    let last = &events.last().unwrap()["response"];
    assert_eq!(output_text(last), text);
    assert_eq!(
        last["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(done["text"], text);
}

/// A template whose generation prompt opens `<think>` (as Qwen3's does): what the model writes
/// is reasoning until `</think>`, which the random default model never closes — so the whole
/// reply is a `reasoning` item and the message is empty, whole and streamed.
#[test]
fn a_thinking_block_becomes_a_reasoning_item() {
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                    {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\
                    {% endif %}";
    let server = start(Options {
        chat_template: Some(template.into()),
        ..Options::default()
    });
    let body = json!({"input": "Hi", "max_output_tokens": 6, "temperature": 0});
    let resp = post(server.addr, "/v1/responses", &body).json();
    let out = resp["output"].as_array().unwrap();
    assert_eq!(out.len(), 2, "{resp}");
    assert_eq!(out[0]["type"], "reasoning");
    let thought = out[0]["content"][0]["text"].as_str().unwrap();
    assert!(!thought.is_empty());
    assert_eq!(output_text(&resp), "");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = post(server.addr, "/v1/responses", &streamed).events();
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, thought);
    let added: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["item"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(added, ["reasoning", "message"]);
}

/// Greedy: a sampled reply may spend its budget on the whitespace a JSON document allows.
#[test]
fn a_json_schema_format_gives_a_document_of_that_schema() {
    let server = start(Options::default());
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                        "required": ["n"], "additionalProperties": false});
    let resp = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "A number:", "max_output_tokens": 60, "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "num", "schema": schema}}}),
    )
    .json();
    assert_eq!(resp["status"], "completed", "{resp}");
    let doc: Value = serde_json::from_str(&output_text(&resp)).unwrap();
    assert!(doc["n"].is_i64(), "{doc}");
    assert_eq!(resp["text"]["format"]["type"], "json_schema");
}

#[test]
fn what_the_server_cannot_do_is_refused() {
    let server = start(Options::default());
    let refused = |body: Value, status: u16, words: &str| {
        let r = post(server.addr, "/v1/responses", &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(words), "{body}: {msg}");
    };
    let web = json!({"type": "web_search"});
    refused(
        json!({"input": "x", "tools": [web]}),
        400,
        "only function tools",
    );
    refused(
        json!({"input": "x", "previous_response_id": "resp_1"}),
        404,
        "no stored response 'resp_1'",
    );
    refused(
        json!({"input": "x", "reasoning": {"effort": "extreme"}}),
        400,
        "reasoning effort",
    );
    refused(
        json!({"input": "x", "conversation": "conv_1"}),
        404,
        "no conversation 'conv_1'",
    );
    refused(
        json!({"input": "x", "conversation": 5}),
        400,
        "conversation must be",
    );
    refused(json!({"input": 5}), 400, "input");
    refused(json!({"input": []}), 400, "input");
    refused(
        json!({"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]}),
        400,
        "input[0].output",
    );
    refused(
        json!({"input": [{"type": "file_search_call"}]}),
        400,
        "file_search_call",
    );
    refused(
        json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        400,
        "text parts",
    );
    refused(
        json!({"input": "x", "text": {"format": {"type": "grammar"}}}),
        400,
        "text.format",
    );
    refused(
        json!({"input": "x", "model": "other"}),
        404,
        "does not exist",
    );
    refused(
        json!({"input": "x", "top_logprobs": 3}),
        400,
        "top_logprobs",
    );
    refused(
        json!({"input": [{"role": "wizard", "content": "x"}]}),
        400,
        "role",
    );
}

/// tool_choice auto with `parallel_tool_calls: false`: the call the model starts on its own
/// (it copies the user's example) fits the tool, and the response ends after it, echoing the
/// field.
#[test]
fn a_call_the_model_starts_fits_its_tool_and_may_be_the_only_one() {
    let server = start(Options::default());
    let weather = json!({"type": "function", "name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}});
    let example = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \
                   \"unit\": \"c\"}}\n</tool_call>\n";
    let body = json!({"input": format!("Write tool calls like these:\n{example}{example}"),
                      "tools": [weather], "parallel_tool_calls": false,
                      "max_output_tokens": 120, "temperature": 0});
    let resp = post(server.addr, "/v1/responses", &body).json();
    assert_eq!(resp["parallel_tool_calls"], false, "{resp}");
    assert_eq!(resp["status"], "completed", "{resp}");
    let output = resp["output"].as_array().unwrap();
    let calls: Vec<&Value> = output
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{resp}");
    assert_eq!(calls[0]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].is_string() && (args["unit"] == "c" || args["unit"] == "f"),
        "{args}"
    );
}

/// A function tool forced by `tool_choice`: a `function_call` item whose arguments fit the
/// tool's parameters, whole and streamed (argument deltas adding up to the same call); the call
/// and its output sent back as input items answer as chat does with the same assistant tool
/// call and tool message.
#[test]
fn a_forced_function_tool_becomes_a_function_call_item() {
    let server = start(Options::default());
    let weather = json!({"type": "function", "name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}});
    let body = |stream: bool| {
        json!({"input": "Weather in Paris?", "tools": [weather],
               "tool_choice": {"type": "function", "name": "get_weather"},
               "max_output_tokens": 120, "temperature": 0, "stream": stream})
    };
    let resp = post(server.addr, "/v1/responses", &body(false)).json();
    let calls: Vec<&Value> = resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{resp}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].is_string() && (args["unit"] == "c" || args["unit"] == "f"),
        "{args}"
    );
    assert_eq!(resp["tools"][0]["name"], "get_weather");

    let events = post(server.addr, "/v1/responses", &body(true)).events();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    // As chat streams a call: the arguments' JSON text as the model wrote it (the whole reply
    // re-serializes it), so the two parse to the same value.
    let streamed_args: Value = serde_json::from_str(&streamed).unwrap();
    assert_eq!(streamed_args, args);
    let done = events
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done["name"], "get_weather");
    assert_eq!(done["arguments"].as_str(), Some(streamed.as_str()));
    let last = &events.last().unwrap()["response"];
    let n_calls = last["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .count();
    assert_eq!(n_calls, 1, "{last}");

    // The call and its result as input items = chat's assistant tool call + tool message.
    let args = r#"{"city": "Paris", "unit": "c"}"#;
    let chat = post(
        server.addr,
        "/v1/chat/completions",
        &json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
              "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}],
            "max_tokens": 10, "temperature": 0}),
    )
    .json();
    let resp = post(
        server.addr,
        "/v1/responses",
        &json!({"input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"}],
            "max_output_tokens": 10, "temperature": 0}),
    )
    .json();
    assert_eq!(
        output_text(&resp),
        chat["choices"][0]["message"]["content"],
        "{resp}"
    );
    assert_eq!(
        resp["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
}

/// Stored responses: a turn sent with `previous_response_id` replies as chat completions does
/// with the whole conversation (earlier input and reply included, this turn's instructions
/// only), its prompt mostly found in the prefix cache; streamed turns are stored too; `GET`
/// returns a response as it was, `DELETE` removes it, and a chain whose link is gone, or a
/// response sent with `store: false`, cannot be continued.
#[test]
fn stored_responses_continue_a_conversation() {
    let server = start(Options::default());
    let ask = |body: Value| -> Value {
        let r = post(server.addr, "/v1/responses", &body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        r.json()
    };
    let first = ask(
        json!({"input": "My name is Ada.", "instructions": "Be brief.",
                           "max_output_tokens": 8, "temperature": 0}),
    );
    assert_eq!(first["store"], true);
    let id1 = first["id"].as_str().unwrap();
    let second = ask(
        json!({"input": "What is my name?", "previous_response_id": id1,
                            "instructions": "Answer in English.", "max_output_tokens": 8,
                            "temperature": 0}),
    );
    assert_eq!(second["previous_response_id"], id1);
    let chat = chat_reply(
        &server,
        json!([{"role": "system", "content": "Answer in English."},
               {"role": "user", "content": "My name is Ada."},
               {"role": "assistant", "content": output_text(&first)},
               {"role": "user", "content": "What is my name?"}]),
        8,
    );
    assert_same_as_chat(&second, &chat);

    // Its input, as the API lists it (a string is a user message item).
    let items = get(
        server.addr,
        &format!(
            "/v1/responses/{}/input_items",
            second["id"].as_str().unwrap()
        ),
    );
    assert_eq!(items.status, 200, "{}", items.text());
    let items = items.json();
    assert_eq!(items["object"], "list");
    let data = items["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{items}");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(data[0]["content"][0]["text"], "What is my name?");
    assert_eq!(items["first_id"], data[0]["id"]);

    // A third turn, streamed: stored as its final event shows it, and continued in turn.
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "And again?", "previous_response_id": second["id"],
                "max_output_tokens": 6, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200);
    let third = r.events().last().unwrap()["response"].clone();
    let id3 = third["id"].as_str().unwrap();
    let got = get(server.addr, &format!("/v1/responses/{id3}"));
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), third);
    let fourth = ask(json!({"input": "Thanks.", "previous_response_id": id3,
                            "max_output_tokens": 4, "temperature": 0}));
    let cached = fourth["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0,
        "the conversation's prefix was not reused: {fourth}"
    );

    // Deleted: gone by id, and the chain through it cannot be continued.
    let del = request_raw(
        server.addr,
        "DELETE",
        &format!("/v1/responses/{id1}"),
        b"",
        Some(API_KEY),
    );
    assert_eq!(del.status, 200, "{}", del.text());
    assert_eq!(del.json()["deleted"], true);
    assert_eq!(
        get(server.addr, &format!("/v1/responses/{id1}")).status,
        404
    );
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": id3, "max_output_tokens": 2}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(id1) && msg.contains("earlier"), "{msg}");

    // store: false keeps nothing.
    let unstored = ask(json!({"input": "x", "store": false, "max_output_tokens": 2}));
    assert_eq!(unstored["store"], false);
    let id = unstored["id"].as_str().unwrap();
    assert_eq!(get(server.addr, &format!("/v1/responses/{id}")).status, 404);
}

/// Conversations (OpenAI's Conversations API): a response sent with `conversation` replies as
/// chat completions does with the conversation's items as history, and its turn (input, then
/// output items) is appended; items are listed, added, read and deleted by id; the
/// conversation's metadata is updated; a deleted conversation is gone; `conversation` with
/// `previous_response_id` is refused.
#[test]
fn conversations_hold_the_history_of_responses() {
    let server = start(Options::default());
    let send = |method: &str, path: &str, body: Option<Value>| -> (u16, Value) {
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let r = request_raw(server.addr, method, path, bytes.as_bytes(), Some(API_KEY));
        let v = if r.text().is_empty() {
            Value::Null
        } else {
            r.json()
        };
        (r.status, v)
    };
    let (status, conv) = send(
        "POST",
        "/v1/conversations",
        Some(
            json!({"items": [{"role": "user", "content": "My name is Ada."}],
                    "metadata": {"topic": "names"}}),
        ),
    );
    assert_eq!(status, 200, "{conv}");
    assert_eq!(conv["object"], "conversation");
    assert_eq!(conv["metadata"]["topic"], "names");
    let cid = conv["id"].as_str().unwrap().to_string();
    assert!(cid.starts_with("conv_"));

    // A first response in it: the item above is its history.
    let ask = |body: Value| -> Value {
        let r = post(server.addr, "/v1/responses", &body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        r.json()
    };
    let first = ask(
        json!({"input": "Hello.", "conversation": cid, "max_output_tokens": 8,
                           "temperature": 0}),
    );
    assert_eq!(first["conversation"]["id"], cid.as_str());
    let chat = chat_reply(
        &server,
        json!([{"role": "user", "content": "My name is Ada."},
               {"role": "user", "content": "Hello."}]),
        8,
    );
    assert_same_as_chat(&first, &chat);

    // A second, streamed, with the object form: the history now holds the first turn.
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "What is my name?", "conversation": {"id": cid},
                "max_output_tokens": 8, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let second = r.events().last().unwrap()["response"].clone();
    let chat = chat_reply(
        &server,
        json!([{"role": "user", "content": "My name is Ada."},
               {"role": "user", "content": "Hello."},
               {"role": "assistant", "content": output_text(&first)},
               {"role": "user", "content": "What is my name?"}]),
        8,
    );
    assert_same_as_chat(&second, &chat);

    // Its items: the first item, then each turn's input and output, in order.
    let (status, items) = send(
        "GET",
        &format!("/v1/conversations/{cid}/items?order=asc"),
        None,
    );
    assert_eq!(status, 200, "{items}");
    let data = items["data"].as_array().unwrap();
    let texts: Vec<String> = data
        .iter()
        .map(|i| {
            i["content"]
                .as_array()
                .map(|p| p.iter().map(|p| p["text"].as_str().unwrap_or("")).collect())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(data.len(), 5, "{items}");
    assert_eq!(texts[0], "My name is Ada.");
    assert_eq!(texts[1], "Hello.");
    assert_eq!(texts[2], output_text(&first));
    assert_eq!(texts[3], "What is my name?");
    assert_eq!(data[4]["role"], "assistant");
    // Newest first by default, a page at a time.
    let (_, page) = send(
        "GET",
        &format!("/v1/conversations/{cid}/items?limit=2"),
        None,
    );
    assert_eq!(page["data"][0]["id"], data[4]["id"]);
    assert_eq!(page["has_more"], true);

    // Items added, read and deleted by id.
    let (status, added) = send(
        "POST",
        &format!("/conversations/{cid}/items"),
        Some(json!({"items": [{"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": "Noted."}]}]})),
    );
    assert_eq!(status, 200, "{added}");
    let item_id = added["data"][0]["id"].as_str().unwrap().to_string();
    let (status, item) = send(
        "GET",
        &format!("/v1/conversations/{cid}/items/{item_id}"),
        None,
    );
    assert_eq!(
        (status, item["content"][0]["text"].clone()),
        (200, json!("Noted."))
    );
    let (status, after) = send(
        "DELETE",
        &format!("/v1/conversations/{cid}/items/{item_id}"),
        None,
    );
    assert_eq!((status, after["id"].clone()), (200, json!(cid)));
    let (status, _) = send(
        "GET",
        &format!("/v1/conversations/{cid}/items/{item_id}"),
        None,
    );
    assert_eq!(status, 404);
    let (status, bad) = send(
        "POST",
        &format!("/v1/conversations/{cid}/items"),
        Some(json!({"items": [{"type": "image", "url": "x"}]})),
    );
    assert_eq!(status, 400, "{bad}");

    // Metadata replaced; the conversation read back.
    let (status, upd) = send(
        "POST",
        &format!("/v1/conversations/{cid}"),
        Some(json!({"metadata": {"topic": "greetings"}})),
    );
    assert_eq!(
        (status, upd["metadata"]["topic"].clone()),
        (200, json!("greetings"))
    );
    let (_, got) = send("GET", &format!("/v1/conversations/{cid}"), None);
    assert_eq!(got, upd);

    // A conversation made without a body starts empty.
    let (status, bare) = send("POST", "/conversations", None);
    assert_eq!(status, 200, "{bare}");
    let bare_id = bare["id"].as_str().unwrap();
    let (_, none) = send("GET", &format!("/v1/conversations/{bare_id}/items"), None);
    assert_eq!(none["data"], json!([]), "{none}");

    // Not with previous_response_id; deleted, it is gone and cannot be continued.
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "x", "conversation": cid, "previous_response_id": first["id"]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let (status, del) = send("DELETE", &format!("/v1/conversations/{cid}"), None);
    assert_eq!((status, del["deleted"].clone()), (200, json!(true)));
    assert_eq!(
        send("GET", &format!("/v1/conversations/{cid}"), None).0,
        404
    );
    let r = post(
        server.addr,
        "/v1/responses",
        &json!({"input": "x", "conversation": cid, "max_output_tokens": 2}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains(&cid), "{}", r.text());
}
