//! OpenAI's Responses API, `POST /v1/responses` — what OpenAI's SDKs now recommend over chat
//! completions (llama.cpp's server does not have it yet: ggml-org/llama.cpp#19138). Responses
//! are stored in memory unless `store: false` (`response_store.rs`), so `previous_response_id`
//! continues a conversation and `GET`/`DELETE /v1/responses/{id}` work; `conversation` (an id
//! from the Conversations API, `conversations.rs`) reads its items as the history and gets the
//! turn's input and output items appended. `input` (a string, or message items whose content
//! is a string or `input_text` / `output_text` parts) and `instructions` (a system message
//! first) go through the chat
//! template like `/v1/chat/completions`; `max_output_tokens`, `temperature`, `top_p`, `text.format`
//! (text, json_object, json_schema) and chat's sampling extensions (`top_k`, `min_p`, `seed`,
//! `stop`, penalties) apply. Function tools (`tools`, `tool_choice`; earlier calls and their
//! results as `function_call` / `function_call_output` input items) run through chat's
//! preparation (`chat::prepare`: the template's tools, forced calls) and parsing. The reply is a
//! `reasoning` item (a Qwen3 thinking block) when the model thought, its `message` item with its
//! `output_text`, and a `function_call` item per call; `status` is `incomplete` with reason
//! `max_output_tokens` when the budget or the context ended it. Streamed as the API's events
//! (`response.created` … `response.output_text.delta` / `response.function_call_arguments.delta`
//! … `response.completed`), each with its `sequence_number`.

use crate::chat::{prepare, ChatFields, Prepared};
use crate::error::ApiError;
use crate::request::{decode, Common, OneOrMany};
use crate::response_store::{reply_messages, Stored};
use crate::state::AppState;
use crate::stream::{collect, new_id, sse_response, unix_now, ChunkFormatter};
use crate::tool_stream::{ToolCallStream, ToolDelta};
use crate::tools::parse_tool_calls;
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
    tool_choice: Option<Value>,
    /// `false`: one function call at most, then the response ends.
    parallel_tool_calls: Option<bool>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    store: Option<bool>,
    #[serde(default)]
    background: bool,
    top_logprobs: Option<i64>,
    metadata: Option<Map<String, Value>>,
    /// `{effort, summary}`: the effort switches thinking as chat's `reasoning_effort` does.
    reasoning: Option<Value>,
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
    let conversation = conversation_id(r.conversation.as_ref())?;
    if conversation.is_some() && r.previous_response_id.is_some() {
        return Err(ApiError::invalid(
            "conversation and previous_response_id cannot be used together",
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
    // This request's instructions only (OpenAI does not carry earlier ones over), then the
    // stored conversation, then the new input.
    let mut messages = Vec::new();
    if let Some(i) = &r.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    if let Some(prev) = &r.previous_response_id {
        messages.extend(state.responses.conversation(prev)?);
    }
    if let Some(id) = &conversation {
        messages.extend(state.conversations.messages(id)?);
    }
    let input = input_messages(&r.input)?;
    messages.extend(input.iter().cloned());
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
    let fields = ChatFields {
        messages,
        tools: chat_tools(r.tools.as_deref())?,
        tool_choice: chat_tool_choice(r.tool_choice.as_ref()),
        reasoning_effort: reasoning_effort(r.reasoning.as_ref())?,
        parallel_tool_calls: r.parallel_tool_calls,
        ..ChatFields::default()
    };
    let Prepared {
        job,
        starts_in_reasoning,
        tools,
        types,
        ..
    } = prepare(&state, &common, fields)?;
    let started = state.start(&job).await?;
    let id = new_id("resp_");
    let shell = Shell {
        id: id.clone(),
        created_at: unix_now(),
        model: state.config.model_id.clone(),
        request: &r,
        conversation: conversation.clone(),
    }
    .json();
    let store = r.store.unwrap_or(true);
    let save = (store || conversation.is_some()).then(|| Save {
        state: state.clone(),
        id,
        store,
        previous: r.previous_response_id.clone(),
        conversation,
        input,
        items: input_items(&r.input),
    });
    if job.stream {
        let events = ResponseEvents {
            shell,
            save,
            reasoning: ReasoningStream::new(starts_in_reasoning),
            tool_stream: tools.then(|| ToolCallStream::new(types)),
            open: None,
            items: Vec::new(),
            sequence: 0,
        };
        return Ok(sse_response(started, events));
    }
    let c = collect(started).await?;
    let split = split_reasoning(&c.text, starts_in_reasoning);
    let (content, calls) = if tools {
        parse_tool_calls(&split.content, &types)
    } else {
        (split.content, Vec::new())
    };
    let mut output = Vec::new();
    if let Some(r) = split.reasoning {
        output.push(reasoning_item(&new_id("rs_"), &r, "completed"));
    }
    if !content.is_empty() || calls.is_empty() {
        output.push(message_item(&new_id("msg_"), &content, "completed"));
    }
    for call in &calls {
        let (id, call_id) = (new_id("fc_"), new_id("call_"));
        output.push(function_call_item(
            &id,
            &call_id,
            &call.name,
            &call.arguments,
            "completed",
        ));
    }
    let response = finished(shell, output, &c.summary);
    if let Some(s) = save {
        s.keep(&response);
    }
    Ok(axum::Json(response).into_response())
}

/// What keeping a finished response needs: storing it (`store` unset or true) and appending
/// its turn to its conversation (`conversation`).
struct Save {
    state: Arc<AppState>,
    id: String,
    store: bool,
    previous: Option<String>,
    conversation: Option<String>,
    /// This request's input as chat messages.
    input: Vec<Value>,
    /// And as the API's items (`GET /v1/responses/{id}/input_items`).
    items: Vec<Value>,
}

impl Save {
    fn keep(self, response: &Value) {
        let output = response["output"].as_array().map_or(&[][..], Vec::as_slice);
        if let Some(conv) = &self.conversation {
            let mut turn = self.items.clone();
            turn.extend(output.iter().cloned());
            // The conversation may have gone while the reply ran: the reply still stands.
            if let Err(e) = self.state.conversations.append(conv, turn) {
                eprintln!(
                    "response {}: not added to conversation {conv}: {}",
                    self.id,
                    e.body()["message"]
                );
            }
        }
        if self.store {
            let mut messages = self.input;
            messages.extend(reply_messages(output));
            let stored = Stored::new(response.clone(), self.previous, messages, self.items);
            self.state.responses.put(self.id, stored);
        }
    }
}

/// `conversation`: a conversation's id, or an object with it.
fn conversation_id(c: Option<&Value>) -> Result<Option<String>, ApiError> {
    match c {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(Value::Object(o)) => match o.get("id") {
            Some(Value::String(id)) => Ok(Some(id.clone())),
            _ => Err(ApiError::invalid("conversation.id must be a string")),
        },
        Some(_) => Err(ApiError::invalid(
            "conversation must be a conversation id or an object with one",
        )),
    }
}

/// The (already validated) input as the API lists it: a string as a user message item, every
/// item with a type (`message` where it had none), a message's string content as a text part,
/// and an id (`msg_…`, `fc_…`, `fco_…`).
pub(crate) fn input_items(input: &Value) -> Vec<Value> {
    match input {
        Value::String(s) => vec![json!({
            "type": "message", "id": new_id("msg_"), "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": s}],
        })],
        Value::Array(items) => items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                if item.get("type").is_none() {
                    item["type"] = json!("message");
                }
                // A message's text as the API lists it: one text part.
                if let (Some("message"), Some(Value::String(text))) =
                    (item["type"].as_str(), item.get("content"))
                {
                    let kind = if item["role"] == "assistant" {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    item["content"] = json!([{"type": kind, "text": text}]);
                }
                if item["type"] == "message" && item.get("status").is_none() {
                    item["status"] = json!("completed");
                }
                if item.get("id").is_none() {
                    let prefix = match item["type"].as_str() {
                        Some("function_call") => "fc_",
                        Some("function_call_output") => "fco_",
                        _ => "msg_",
                    };
                    item["id"] = json!(new_id(prefix));
                }
                item
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The input as chat messages: a string is one user message; items are `{role, content}`
/// messages (with or without `type: "message"`) whose content is a string or text parts.
pub(crate) fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
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
            let text = |key: &str| -> Result<String, ApiError> {
                match item.get(key) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    _ => Err(ApiError::invalid(format!(
                        "input[{i}].{key} must be a string"
                    ))),
                }
            };
            match kind {
                "message" => {}
                // The model's earlier call and its result: chat's assistant tool call and tool
                // message.
                "function_call" => {
                    return Ok(
                        json!({"role": "assistant", "content": null, "tool_calls": [{
                            "id": text("call_id")?, "type": "function",
                            "function": {"name": text("name")?, "arguments": text("arguments")?},
                        }]}),
                    )
                }
                "function_call_output" => {
                    return Ok(json!({"role": "tool", "tool_call_id": text("call_id")?,
                                     "content": text("output")?}))
                }
                _ => {
                    return Err(ApiError::invalid(format!(
                        "input[{i}]: items of type '{kind}' are not supported (messages, \
                         function_call and function_call_output)"
                    )))
                }
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

/// `reasoning.effort` (a string, or null for none given).
fn reasoning_effort(reasoning: Option<&Value>) -> Result<Option<String>, ApiError> {
    match reasoning.map(|r| &r["effort"]) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => Ok(Some(e.clone())),
        Some(_) => Err(ApiError::invalid("reasoning.effort must be a string")),
    }
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

/// Responses' function tools (`{type, name, description, parameters}`) as chat's
/// (`{type, function: {...}}`); other tool types (web search, files…) are refused.
fn chat_tools(tools: Option<&[Value]>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    tools
        .iter()
        .map(|t| match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut f = t.as_object().cloned().unwrap_or_default();
                f.remove("type");
                f.remove("strict");
                Ok(json!({"type": "function", "function": f}))
            }
            other => Err(ApiError::invalid(format!(
                "tools: only function tools are supported (got {})",
                other.unwrap_or("no type")
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Responses' `tool_choice` (`auto`, `none`, `required`, `{type: function, name}`) as chat's.
fn chat_tool_choice(choice: Option<&Value>) -> Option<Value> {
    match choice {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Some(json!({"type": "function", "function": {"name": o.get("name")}}))
        }
        other => other.cloned(),
    }
}

fn function_call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

/// The response object's fields known before the reply (`output` empty, `in_progress`).
struct Shell<'a> {
    id: String,
    created_at: u64,
    model: String,
    request: &'a ResponsesRequest,
    /// The conversation's id (`conversation_id` of the request's field).
    conversation: Option<String>,
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
            "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": r.previous_response_id,
            "conversation": self.conversation.as_ref().map(|id| json!({"id": id})),
            "reasoning": {
                "effort": r.reasoning.as_ref().map_or(Value::Null, |v| v["effort"].clone()),
                "summary": null,
            },
            "store": r.store.unwrap_or(true),
            "temperature": r.temperature,
            "text": {"format": format},
            "tool_choice": r.tool_choice.clone().unwrap_or(json!("auto")),
            "tools": r.tools.clone().unwrap_or_default(),
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

/// What kind of output item is being streamed.
#[derive(Clone, PartialEq)]
enum Kind {
    Reasoning,
    Message,
    Call { call_id: String, name: String },
}

/// The output item being streamed: its kind, id and text (a call's arguments) so far.
struct OpenItem {
    kind: Kind,
    id: String,
    text: String,
}

/// Streaming: the response's events, items opened and closed as the reply moves from thinking
/// to its message and its function calls (`ToolCallStream`, as chat streams them).
struct ResponseEvents {
    shell: Value,
    /// Stores the response once it is done (`store` unset or true).
    save: Option<Save>,
    reasoning: ReasoningStream,
    tool_stream: Option<ToolCallStream>,
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

    fn open(&mut self, kind: Kind) -> Vec<Value> {
        let (id, item) = match &kind {
            Kind::Reasoning => {
                let id = new_id("rs_");
                let item = reasoning_item(&id, "", "in_progress");
                (id, item)
            }
            Kind::Message => {
                let id = new_id("msg_");
                let item = message_item(&id, "", "in_progress");
                (id, item)
            }
            Kind::Call { call_id, name } => {
                let id = new_id("fc_");
                let item = function_call_item(&id, call_id, name, "", "in_progress");
                (id, item)
            }
        };
        let index = self.items.len();
        let mut out = vec![self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        )];
        if kind == Kind::Message {
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": text_part("")}),
            ));
        }
        self.open = Some(OpenItem {
            kind,
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
        let at = json!({"item_id": id, "output_index": index});
        let with = |mut v: Value, extra: Value| {
            if let (Some(v), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(e.clone());
            }
            v
        };
        let mut out = Vec::new();
        let done = match &item.kind {
            Kind::Reasoning => {
                let f = with(at, json!({"content_index": 0, "text": text}));
                out.push(self.event("response.reasoning_text.done", f));
                reasoning_item(id, text, "completed")
            }
            Kind::Message => {
                let f = with(
                    at.clone(),
                    json!({"content_index": 0, "text": text, "logprobs": []}),
                );
                out.push(self.event("response.output_text.done", f));
                let f = with(at, json!({"content_index": 0, "part": text_part(text)}));
                out.push(self.event("response.content_part.done", f));
                message_item(id, text, "completed")
            }
            Kind::Call { call_id, name } => {
                let f = with(at, json!({"name": name, "arguments": text}));
                out.push(self.event("response.function_call_arguments.done", f));
                function_call_item(id, call_id, name, text, "completed")
            }
        };
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        ));
        self.items.push(done);
        out
    }

    /// `text` added to an item of `kind`, opening it (and closing the one before) if needed.
    fn push_text(&mut self, kind: Kind, text: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if text.is_empty() {
            return out;
        }
        let same = match (&self.open, &kind) {
            (Some(o), Kind::Call { .. }) => matches!(o.kind, Kind::Call { .. }),
            (Some(o), k) => &o.kind == k,
            (None, _) => false,
        };
        if !same {
            out.extend(self.close());
            out.extend(self.open(kind.clone()));
        }
        let index = self.items.len();
        let open = self.open.as_mut().expect("opened above");
        open.text.push_str(text);
        let id = open.id.clone();
        let (name, extra) = match kind {
            Kind::Reasoning => ("response.reasoning_text.delta", json!({"content_index": 0})),
            Kind::Message => (
                "response.output_text.delta",
                json!({"content_index": 0, "logprobs": []}),
            ),
            Kind::Call { .. } => ("response.function_call_arguments.delta", json!({})),
        };
        let mut f = json!({"item_id": id, "output_index": index, "delta": text});
        if let (Some(f), Some(e)) = (f.as_object_mut(), extra.as_object()) {
            f.extend(e.clone());
        }
        out.push(self.event(name, f));
        out
    }

    /// One of the tool-call stream's deltas: content text, or a call (a new one when it names
    /// its function) and its argument fragments.
    fn tool_delta(&mut self, d: ToolDelta) -> Vec<Value> {
        match d {
            ToolDelta::Content(t) => self.push_text(Kind::Message, &t),
            ToolDelta::Call(v) => {
                let mut out = Vec::new();
                let f = &v["function"];
                if let Some(name) = f["name"].as_str() {
                    out.extend(self.close());
                    let call_id = v["id"]
                        .as_str()
                        .map_or_else(|| new_id("call_"), str::to_string);
                    out.extend(self.open(Kind::Call {
                        call_id,
                        name: name.to_string(),
                    }));
                }
                if let Some(args) = f["arguments"].as_str() {
                    let kind = match &self.open {
                        Some(
                            o @ OpenItem {
                                kind: Kind::Call { .. },
                                ..
                            },
                        ) => o.kind.clone(),
                        _ => return out,
                    };
                    out.extend(self.push_text(kind, args));
                }
                out
            }
        }
    }

    fn parts(&mut self, parts: Vec<(ReplyPart, String)>) -> Vec<Value> {
        let mut out = Vec::new();
        for (part, text) in parts {
            match (part, self.tool_stream.as_mut()) {
                (ReplyPart::Reasoning, _) => out.extend(self.push_text(Kind::Reasoning, &text)),
                (ReplyPart::Content, Some(t)) => {
                    for d in t.push(&text) {
                        out.extend(self.tool_delta(d));
                    }
                }
                (ReplyPart::Content, None) => out.extend(self.push_text(Kind::Message, &text)),
            }
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
        if let Some(mut t) = self.tool_stream.take() {
            for d in t.finish() {
                out.extend(self.tool_delta(d));
            }
        }
        out.extend(self.close());
        // A reply without a message or a call still has its (empty) message.
        if !self
            .items
            .iter()
            .any(|i| i["type"] == "message" || i["type"] == "function_call")
        {
            out.extend(self.open(Kind::Message));
            out.extend(self.close());
        }
        let response = finished(self.shell.clone(), std::mem::take(&mut self.items), summary);
        if let Some(s) = self.save.take() {
            s.keep(&response);
        }
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
