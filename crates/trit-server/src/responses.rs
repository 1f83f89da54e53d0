//! OpenAI's Responses API, `POST /v1/responses` — what OpenAI's SDKs now recommend over chat
//! completions (llama.cpp's server does not have it yet: ggml-org/llama.cpp#19138). Stateless:
//! `store` is accepted and nothing is stored, so `previous_response_id` and `conversation` are
//! refused. `input` (a string, or message items whose content is a string or `input_text` /
//! `output_text` parts) and `instructions` (a system message first) go through the chat
//! template like `/v1/chat/completions`; `max_output_tokens`, `temperature`, `top_p`, `text.format`
//! (text, json_object, json_schema) and chat's sampling extensions (`top_k`, `min_p`, `seed`,
//! `stop`, penalties) apply. The reply is a `reasoning` item (a Qwen3 thinking block) when the
//! model thought, then one `message` item with its `output_text`; `status` is `incomplete` with
//! reason `max_output_tokens` when the budget or the context ended it. Streamed as the API's
//! events (`response.created` … `response.output_text.delta` … `response.completed`), each
//! with its `sequence_number`. Function tools are refused with a pointer to chat completions.

use crate::chat::normalize_messages;
use crate::error::ApiError;
use crate::request::{decode, Common, OneOrMany};
use crate::state::AppState;
use crate::stream::{collect, new_id, sse_response, unix_now, ChunkFormatter};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use trit::chat::{split_reasoning, ReasoningStream, ReplyPart};
use trit::engine::{FinishReason, SeqSummary, TokenLogprob};

#[derive(Deserialize, Debug)]
struct ResponsesRequest {
    model: Option<String>,
    input: Value,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default)]
    stream: bool,
    text: Option<Value>,
    tools: Option<Vec<Value>>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    #[serde(default)]
    background: bool,
    top_logprobs: Option<i64>,
    metadata: Option<Map<String, Value>>,
    // Chat's sampling extensions (llama.cpp clients send them everywhere).
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    repetition_penalty: Option<f32>,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let r: ResponsesRequest = decode(body)?;
    if r.previous_response_id.is_some() || r.conversation.is_some() {
        return Err(ApiError::invalid(
            "previous_response_id / conversation: this server stores no responses; send the \
             whole conversation as input items",
        ));
    }
    if r.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid(
            "tools on /v1/responses are not supported yet; use /v1/chat/completions for tool calls",
        ));
    }
    if r.background {
        return Err(ApiError::invalid("background responses are not supported"));
    }
    if r.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid(
            "top_logprobs on /v1/responses is not supported; use /v1/chat/completions",
        ));
    }
    let Some(template) = &state.template else {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions with a raw prompt",
        ));
    };
    let mut messages = Vec::new();
    if let Some(i) = &r.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(input_messages(&r.input)?);
    let messages = normalize_messages(&messages)?;
    let common = Common {
        model: r.model.clone(),
        max_tokens: r.max_output_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        min_p: r.min_p,
        seed: r.seed,
        stop: r.stop.clone(),
        presence_penalty: r.presence_penalty,
        frequency_penalty: r.frequency_penalty,
        repetition_penalty: r.repetition_penalty,
        stream: r.stream,
        response_format: response_format(r.text.as_ref())?,
        ..Common::default()
    };
    // A JSON document starts the reply: no thinking block before it (as chat does).
    let mut kwargs = Map::new();
    if common.wants_json() {
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    let text = template
        .render(&messages, true, None, &kwargs)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let starts_in_reasoning = text.trim_end().ends_with("<think>");
    let prompt = state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let job = common.job(&state, prompt, None, None)?;
    let started = state.start(&job).await?;
    let shell = Shell {
        id: new_id("resp_"),
        created_at: unix_now(),
        model: state.config.model_id.clone(),
        request: &r,
    }
    .json();
    if job.stream {
        let events = ResponseEvents {
            shell,
            reasoning: ReasoningStream::new(starts_in_reasoning),
            open: None,
            items: Vec::new(),
            sequence: 0,
        };
        return Ok(sse_response(started, events));
    }
    let c = collect(started).await?;
    let split = split_reasoning(&c.text, starts_in_reasoning);
    let mut output = Vec::new();
    if let Some(r) = split.reasoning {
        output.push(reasoning_item(&new_id("rs_"), &r, "completed"));
    }
    output.push(message_item(&new_id("msg_"), &split.content, "completed"));
    Ok(axum::Json(finished(shell, output, &c.summary)).into_response())
}

/// The input as chat messages: a string is one user message; items are `{role, content}`
/// messages (with or without `type: "message"`) whose content is a string or text parts.
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::invalid(
                "input must be a string or a non-empty list of message items",
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let kind = item
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("message");
            if kind != "message" {
                return Err(ApiError::invalid(format!(
                    "input[{i}]: items of type '{kind}' are not supported (messages only)"
                )));
            }
            let role = item.get("role").cloned().unwrap_or(Value::Null);
            let content = match item.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (
                                Some("input_text" | "output_text" | "text"),
                                Some(Value::String(t)),
                            ) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(format!(
                                    "input[{i}].content: only text parts are supported"
                                )))
                            }
                        }
                    }
                    text
                }
                _ => {
                    return Err(ApiError::invalid(format!(
                        "input[{i}].content must be a string or a list of text parts"
                    )))
                }
            };
            Ok(json!({"role": role, "content": content}))
        })
        .collect()
}

/// `text.format` as chat's `response_format` (None for plain text).
fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("response")),
                "schema": format.get("schema").cloned().unwrap_or(Value::Null),
                "strict": format.get("strict").cloned().unwrap_or(Value::Null),
            },
        }))),
        _ => Err(ApiError::invalid(
            "text.format.type must be text, json_object or json_schema",
        )),
    }
}

/// The response object's fields known before the reply (`output` empty, `in_progress`).
struct Shell<'a> {
    id: String,
    created_at: u64,
    model: String,
    request: &'a ResponsesRequest,
}

impl Shell<'_> {
    fn json(&self) -> Value {
        let r = self.request;
        let format = match r.text.as_ref().and_then(|t| t.get("format")) {
            Some(f) => f.clone(),
            None => json!({"type": "text"}),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "in_progress",
            "error": null,
            "incomplete_details": null,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": [],
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null},
            "store": false,
            "temperature": r.temperature,
            "text": {"format": format},
            "tool_choice": "auto",
            "tools": [],
            "top_p": r.top_p,
            "truncation": "disabled",
            "usage": null,
            "metadata": r.metadata.clone().unwrap_or_default(),
        })
    }
}

/// The finished response: its items, status and usage.
fn finished(mut shell: Value, output: Vec<Value>, s: &SeqSummary) -> Value {
    let incomplete = s.finish == FinishReason::Length;
    shell["status"] = json!(if incomplete {
        "incomplete"
    } else {
        "completed"
    });
    if incomplete {
        shell["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    shell["output"] = Value::Array(output);
    shell["usage"] = json!({
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": {"cached_tokens": s.cached_tokens},
        "output_tokens": s.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    });
    shell
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": id, "status": status, "role": "assistant",
        "content": if status == "in_progress" { json!([]) } else { json!([text_part(text)]) },
    })
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "reasoning_text", "text": text}])
    };
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": content})
}

/// The output item being streamed: its kind, id and text so far.
struct OpenItem {
    part: ReplyPart,
    id: String,
    text: String,
}

/// Streaming: the response's events, items opened and closed as the reply moves from thinking
/// to its message.
struct ResponseEvents {
    shell: Value,
    reasoning: ReasoningStream,
    open: Option<OpenItem>,
    items: Vec<Value>,
    sequence: u64,
}

impl ResponseEvents {
    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        fields
    }

    fn open(&mut self, part: ReplyPart) -> Vec<Value> {
        let (id, item) = match part {
            ReplyPart::Reasoning => {
                let id = new_id("rs_");
                let item = reasoning_item(&id, "", "in_progress");
                (id, item)
            }
            ReplyPart::Content => {
                let id = new_id("msg_");
                let item = message_item(&id, "", "in_progress");
                (id, item)
            }
        };
        let index = self.items.len();
        let mut out = vec![self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        )];
        if part == ReplyPart::Content {
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": text_part("")}),
            ));
        }
        self.open = Some(OpenItem {
            part,
            id,
            text: String::new(),
        });
        out
    }

    fn close(&mut self) -> Vec<Value> {
        let Some(item) = self.open.take() else {
            return Vec::new();
        };
        let index = self.items.len();
        let (id, text) = (&item.id, &item.text);
        let mut out = Vec::new();
        let done = match item.part {
            ReplyPart::Reasoning => {
                out.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text}),
                ));
                reasoning_item(id, text, "completed")
            }
            ReplyPart::Content => {
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text, "logprobs": []}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": text_part(text)}),
                ));
                message_item(id, text, "completed")
            }
        };
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        ));
        self.items.push(done);
        out
    }

    fn parts(&mut self, parts: Vec<(ReplyPart, String)>) -> Vec<Value> {
        let mut out = Vec::new();
        for (part, text) in parts {
            if text.is_empty() {
                continue;
            }
            if self.open.as_ref().map(|o| o.part) != Some(part) {
                out.extend(self.close());
                out.extend(self.open(part));
            }
            let index = self.items.len();
            let open = self.open.as_mut().expect("opened above");
            open.text.push_str(&text);
            let id = open.id.clone();
            let kind = match part {
                ReplyPart::Reasoning => "response.reasoning_text.delta",
                ReplyPart::Content => "response.output_text.delta",
            };
            out.push(self.event(
                kind,
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "delta": text, "logprobs": []}),
            ));
        }
        out
    }
}

impl ChunkFormatter for ResponseEvents {
    fn start(&mut self) -> Vec<Value> {
        let shell = self.shell.clone();
        vec![
            self.event("response.created", json!({"response": shell.clone()})),
            self.event("response.in_progress", json!({"response": shell})),
        ]
    }

    fn piece(&mut self, _: Option<u32>, text: &str, _: Option<&TokenLogprob>) -> Vec<Value> {
        let parts = self.reasoning.push(text);
        self.parts(parts)
    }

    fn done(&mut self, summary: &SeqSummary) -> Vec<Value> {
        let tail = self.reasoning.finish();
        let mut out = self.parts(tail.into_iter().collect());
        // Every response has its message, empty if the model wrote nothing after thinking.
        if self.open.as_ref().map(|o| o.part) != Some(ReplyPart::Content) {
            out.extend(self.close());
            out.extend(self.open(ReplyPart::Content));
        }
        out.extend(self.close());
        let response = finished(self.shell.clone(), std::mem::take(&mut self.items), summary);
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({"response": response})));
        out
    }

    fn done_marker(&self) -> bool {
        false
    }
}
