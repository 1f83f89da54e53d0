//! `POST /v1/chat/completions`: messages → the model's chat template → tokens → the
//! scheduler; the reply is split into `reasoning_content` (Qwen3 `<think>`), `content` and,
//! when tools were offered, `tool_calls`.

use crate::error::ApiError;
use crate::request::{decode, Common, Job};
use crate::state::{token_bytes, token_text, AppState};
use crate::stream::{
    collect_all, combined, new_id, sse_choices, timings, unix_now, usage, ChunkFormatter, Collected,
};
use crate::tool_stream::{ToolCallStream, ToolDelta};
use crate::tools::{parse_tool_calls, ParamTypes};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use trit::chat::ChatTemplate;
use trit::chat::{split_reasoning, ReasoningStream, ReplyPart};
use trit::engine::{SeqSummary, TokenLogprob};
use trit::sample::{JsonSchema, LazyRule, OutputRule};
use trit::tokenizer::Tokenizer;

#[derive(Deserialize, Debug, Default)]
pub(crate) struct ChatFields {
    pub(crate) messages: Vec<Value>,
    pub(crate) tools: Option<Vec<Value>>,
    pub(crate) tool_choice: Option<Value>,
    pub(crate) chat_template_kwargs: Option<Map<String, Value>>,
    /// OpenAI's `reasoning_effort` (the Responses API's `reasoning.effort`): `none` / `minimal`
    /// turn a hybrid-thinking template's thinking off, `low` / `medium` / `high` leave it on
    /// (`enable_thinking`, unless `chat_template_kwargs` set it).
    pub(crate) reasoning_effort: Option<String>,
    #[serde(default)]
    pub(crate) logprobs: bool,
    pub(crate) top_logprobs: Option<i64>,
    /// OpenAI's `parallel_tool_calls` (default true): `false` ends the reply after one call.
    pub(crate) parallel_tool_calls: Option<bool>,
}

/// A chat request made into a job: the prompt through the template (tools, forced calls and
/// thinking switches applied), and what formatting its reply needs.
pub(crate) struct Prepared {
    pub(crate) job: Job,
    /// The template's generation prompt opened a thinking block.
    pub(crate) starts_in_reasoning: bool,
    /// The request's tools (the reply is scanned for calls) and their string parameters.
    pub(crate) tools: bool,
    pub(crate) types: ParamTypes,
    pub(crate) top_logprobs: Option<usize>,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let common: Common = decode(body)?;
    let fields: ChatFields = decode(body)?;
    let Prepared {
        job,
        starts_in_reasoning,
        tools,
        types,
        top_logprobs,
    } = prepare(&state, &common, fields)?;
    let choices = state.start_choices(&job).await?;
    let ctx = ReplyContext {
        model_id: state.config.model_id.clone(),
        tokenizer: state.tokenizer.clone(),
        id: new_id("chatcmpl-"),
        created: unix_now(),
        tools,
        logprobs: top_logprobs.is_some(),
        index: 0,
    };
    if job.stream {
        let chunks = choices.into_iter().enumerate().map(|(index, started)| {
            let formatter = ChatChunks {
                reasoning: ReasoningStream::new(starts_in_reasoning),
                tool_stream: ctx.tools.then(|| ToolCallStream::new(types.clone())),
                include_usage: job.include_usage,
                pending_logprobs: Vec::new(),
                ctx: ReplyContext {
                    index,
                    ..ctx.clone()
                },
            };
            (started, formatter)
        });
        return Ok(sse_choices(chunks.collect(), job.n));
    }
    let collected = collect_all(choices).await?;
    let choices: Vec<Value> = collected
        .iter()
        .enumerate()
        .map(|(i, c)| ctx.choice_json(i, c, starts_in_reasoning, &types))
        .collect();
    let summaries: Vec<SeqSummary> = collected.into_iter().map(|c| c.summary).collect();
    let total = combined(&summaries, job.n);
    Ok(axum::Json(json!({
        "id": ctx.id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": state.config.model_id,
        "choices": choices,
        "usage": usage(&total),
        "timings": timings(&total),
    }))
    .into_response())
}

/// Validates a chat request and builds its job (shared by `/v1/chat/completions` and
/// `/v1/responses`).
pub(crate) fn prepare(
    state: &AppState,
    common: &Common,
    fields: ChatFields,
) -> Result<Prepared, ApiError> {
    let messages = normalize_messages(&fields.messages)?;
    let (tools, forced) = tool_choice(fields.tools.as_ref(), fields.tool_choice.as_ref())?;
    let top_logprobs = logprobs_request(fields.logprobs, fields.top_logprobs)?;
    let Some(template) = &state.template else {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions with a raw prompt",
        ));
    };
    let forced =
        match forced {
            Some(_) if common.is_constrained() => return Err(ApiError::invalid(
                "response_format or grammar together with a forced tool_choice is not supported",
            )),
            // The call in the dialect the model was taught: Qwen3.5's XML or Hermes JSON.
            Some(f) => Some(call_schema(template, &f).map_err(|e| ApiError::bad_value(&e))?),
            None => None,
        };
    // One call and the end, where the request says so.
    let once = fields.parallel_tool_calls == Some(false);
    let mut kwargs = fields.chat_template_kwargs.unwrap_or_default();
    let thinking = match fields.reasoning_effort.as_deref() {
        None => None,
        Some("none" | "minimal") => Some(false),
        Some("low" | "medium" | "high") => Some(true),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "reasoning effort must be none, minimal, low, medium or high, not {other:?}"
            )))
        }
    };
    if common.is_constrained() && tools.is_some() {
        return Err(ApiError::invalid(
            "response_format json_object/json_schema or grammar together with tools is not \
             supported",
        ));
    }
    // A constrained reply (a JSON document, a grammar's string or a forced tool call) starts
    // right away: no thinking block before it.
    let constrained = common.is_constrained() || forced.is_some();
    if constrained {
        if kwargs.get("enable_thinking") == Some(&Value::Bool(true)) {
            return Err(ApiError::invalid(
                "response_format json_object/json_schema, grammar and a forced tool_choice \
                 need enable_thinking false: the constrained output must start the reply",
            ));
        }
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    } else if let Some(t) = thinking {
        // A hint, so a constrained reply (which must start at once) ignores it.
        kwargs.entry("enable_thinking").or_insert(Value::Bool(t));
    }
    let tools_json = tools.map(|t| Value::Array(t.clone()));
    let text = template
        .render(&messages, true, tools_json.as_ref(), &kwargs)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let starts_in_reasoning = text.trim_end().ends_with("<think>");
    if starts_in_reasoning && constrained {
        return Err(ApiError::invalid(
            "response_format json_object/json_schema or a forced tool_choice: this chat \
             template always starts a thinking block, so the reply cannot start with them",
        ));
    }
    let prompt = state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let rule = match (forced, tools) {
        (Some(schema), _) => Some(OutputRule::Json(Arc::new(schema))),
        // tool_choice auto: any call the model starts must be whole and fit its tool.
        (None, Some(tools)) => call_watch(template, tools, starts_in_reasoning, once),
        (None, None) => None,
    };
    let job = common.job(state, prompt, top_logprobs, rule)?;
    Ok(Prepared {
        job,
        starts_in_reasoning,
        tools: tools.is_some(),
        types: tools.map_or_else(ParamTypes::default, |t| ParamTypes::from_tools(t)),
        top_logprobs,
    })
}

/// (name, parameters schema) of tools.
type Signatures = Vec<(String, Value)>;

/// One call of one of `tools`, in the dialect the model was taught: Qwen3.5's XML or Hermes
/// JSON.
fn call_schema(template: &ChatTemplate, tools: &Signatures) -> trit::Result<JsonSchema> {
    match template.writes_xml_tool_calls() {
        true => JsonSchema::xml_tool_call(tools),
        false => JsonSchema::tool_call(tools),
    }
}

/// With `tool_choice` auto, the reply is free until the model writes `<tool_call>` outside
/// its thinking block; from there the call is decoded under the tools' schema (a known name,
/// arguments that fit its parameters, the block closed), then the reply is free again — or,
/// with `parallel_tool_calls: false`, ends (llama.cpp's lazy tool-call grammar). Tools whose
/// parameters cannot be enforced (unnamed tools, schema keywords the decoder does not have)
/// leave the reply free, as before: `auto` never refuses a request the template can render.
fn call_watch(
    template: &ChatTemplate,
    tools: &[Value],
    starts_in_reasoning: bool,
    once: bool,
) -> Option<OutputRule> {
    let signatures = tools.iter().map(signature).collect::<Result<_, _>>().ok()?;
    let schema = call_schema(template, &signatures).ok()?;
    let rule = LazyRule::new("<tool_call>", OutputRule::Json(Arc::new(schema)))
        .and_then(|r| r.quiet_between("<think>", "</think>", starts_in_reasoning))
        .ok()?
        .once(once);
    Some(OutputRule::Lazy(Arc::new(rule)))
}

/// A tool's name and parameters schema (an object of anything when it has none).
fn signature(t: &Value) -> Result<(String, Value), ApiError> {
    let f = &t["function"];
    let name = f["name"]
        .as_str()
        .ok_or_else(|| ApiError::invalid("tools: every function needs a name"))?;
    let params = match &f["parameters"] {
        Value::Null => serde_json::json!({"type": "object"}),
        p => p.clone(),
    };
    Ok((name.to_string(), params))
}

/// The tools the template sees and, for `tool_choice` `required` or a named function, the
/// (name, parameters) of the tools the reply must call one of.
fn tool_choice<'a>(
    tools: Option<&'a Vec<Value>>,
    choice: Option<&Value>,
) -> Result<(Option<&'a Vec<Value>>, Option<Signatures>), ApiError> {
    let Some(tools) = tools else {
        return match choice {
            None | Some(Value::Null) => Ok((None, None)),
            Some(Value::String(c)) if c == "none" || c == "auto" => Ok((None, None)),
            Some(_) => Err(ApiError::invalid("tool_choice needs tools")),
        };
    };
    match choice {
        None | Some(Value::Null) => Ok((Some(tools), None)),
        Some(Value::String(c)) if c == "auto" => Ok((Some(tools), None)),
        Some(Value::String(c)) if c == "none" => Ok((None, None)),
        Some(Value::String(c)) if c == "required" => {
            let all = tools.iter().map(signature).collect::<Result<_, _>>()?;
            Ok((Some(tools), Some(all)))
        }
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("tool_choice: function.name is missing"))?;
            let tool = tools
                .iter()
                .find(|t| t["function"]["name"] == name)
                .ok_or_else(|| {
                    ApiError::invalid(format!("tool_choice: no tool named {name:?} in tools"))
                })?;
            Ok((Some(tools), Some(vec![signature(tool)?])))
        }
        Some(other) => Err(ApiError::invalid(format!(
            "tool_choice {other} is not supported: \"auto\", \"none\", \"required\" or \
             {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
        ))),
    }
}

/// `logprobs: true` (+ optional `top_logprobs` 0..=20) → how many alternatives to report.
fn logprobs_request(logprobs: bool, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    match (logprobs, top) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs requires logprobs to be true",
        )),
        (true, None) => Ok(Some(0)),
        (true, Some(k)) if (0..=20).contains(&k) => Ok(Some(k as usize)),
        (true, Some(k)) => Err(ApiError::invalid(format!(
            "top_logprobs must be between 0 and 20, got {k}"
        ))),
    }
}

/// Checks message shapes and flattens content parts into text (templates expect strings).
pub(crate) fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid(format!(
                "messages[{i}] must be an object"
            )));
        };
        match obj.get("role").and_then(Value::as_str) {
            Some("system" | "developer" | "user" | "assistant" | "tool") => {}
            _ => {
                return Err(ApiError::invalid(format!(
                    "messages[{i}].role must be one of system, developer, user, assistant, tool"
                )))
            }
        }
        let mut m = obj.clone();
        if m.get("role").and_then(Value::as_str) == Some("developer") {
            m.insert("role".into(), json!("system"));
        }
        match m.get("content") {
            // An assistant turn with only tool calls has no content; templates that concatenate
            // strings need one, and the ones that check the type treat "" as absent.
            None | Some(Value::Null) => {
                m.insert("content".into(), json!(""));
            }
            Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "messages[{i}].content: only text parts are supported"
                            )))
                        }
                    }
                }
                m.insert("content".into(), json!(text));
            }
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "messages[{i}].content must be a string or a list of text parts"
                )))
            }
        }
        out.push(Value::Object(m));
    }
    Ok(out)
}

fn finish_reason(s: &SeqSummary, calls: usize) -> &'static str {
    if calls == 0 {
        s.finish.as_str()
    } else {
        "tool_calls"
    }
}

#[derive(Clone)]
struct ReplyContext {
    model_id: String,
    tokenizer: Arc<Tokenizer>,
    id: String,
    created: u64,
    tools: bool,
    logprobs: bool,
    /// The choice a stream's chunks belong to.
    index: usize,
}

impl ReplyContext {
    /// Choice `index` of a whole reply: the message (reasoning, content, tool calls), its
    /// log-probabilities and finish reason.
    fn choice_json(
        &self,
        index: usize,
        c: &Collected,
        starts_in_reasoning: bool,
        types: &ParamTypes,
    ) -> Value {
        let split = split_reasoning(&c.text, starts_in_reasoning);
        let (content, calls) = if self.tools {
            parse_tool_calls(&split.content, types)
        } else {
            (split.content, Vec::new())
        };
        let mut message = json!({"role": "assistant", "content": content});
        if content.is_empty() && !calls.is_empty() {
            message["content"] = Value::Null;
        }
        if let Some(r) = split.reasoning {
            message["reasoning_content"] = json!(r);
        }
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls
                .iter()
                .map(|c| c.to_json(&new_id("call_"), None))
                .collect::<Vec<_>>());
        }
        let logprobs = match self.logprobs {
            true => self.logprobs_json(&c.logprobs),
            false => Value::Null,
        };
        json!({
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(&c.summary, calls.len()),
        })
    }

    fn logprobs_json(&self, lps: &[TokenLogprob]) -> Value {
        let entry = |id: u32, lp: f32| {
            json!({
                "token": token_text(&self.tokenizer, id),
                "logprob": lp,
                "bytes": token_bytes(&self.tokenizer, id),
            })
        };
        let content: Vec<Value> = lps
            .iter()
            .map(|l| {
                let mut e = entry(l.token, l.logprob);
                e["top_logprobs"] = l.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
                e
            })
            .collect();
        json!({ "content": content })
    }

    fn chunk(&self, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model_id,
            "choices": [{"index": self.index, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish}],
        })
    }
}

/// Streaming: role delta, then reasoning/content deltas and tool-call deltas (name first, then
/// argument fragments, see `tool_stream`), finish chunk.
struct ChatChunks {
    ctx: ReplyContext,
    reasoning: ReasoningStream,
    tool_stream: Option<ToolCallStream>,
    include_usage: bool,
    /// Log-probabilities of tokens whose text has not been sent yet.
    pending_logprobs: Vec<TokenLogprob>,
}

impl ChatChunks {
    fn parts(&mut self, parts: Vec<(ReplyPart, String)>) -> Vec<Value> {
        let mut out = Vec::new();
        for (part, text) in parts {
            let deltas = match part {
                ReplyPart::Reasoning => vec![json!({"reasoning_content": text})],
                ReplyPart::Content => match &mut self.tool_stream {
                    Some(t) => t.push(&text).into_iter().map(delta_json).collect(),
                    None if text.is_empty() => Vec::new(),
                    None => vec![json!({"content": text})],
                },
            };
            for delta in deltas {
                let lp = if self.ctx.logprobs {
                    self.ctx
                        .logprobs_json(&std::mem::take(&mut self.pending_logprobs))
                } else {
                    Value::Null
                };
                out.push(self.ctx.chunk(delta, lp, None));
            }
        }
        out
    }
}

impl ChunkFormatter for ChatChunks {
    fn start(&mut self) -> Vec<Value> {
        vec![self.ctx.chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
            None,
        )]
    }

    fn piece(
        &mut self,
        _token: Option<u32>,
        text: &str,
        logprob: Option<&TokenLogprob>,
    ) -> Vec<Value> {
        self.pending_logprobs.extend(logprob.cloned());
        let parts = self.reasoning.push(text);
        self.parts(parts)
    }

    fn done(&mut self, summary: &SeqSummary) -> Vec<Value> {
        let tail = self.reasoning.finish();
        let mut out = self.parts(tail.into_iter().collect());
        let mut calls = 0;
        if let Some(t) = &mut self.tool_stream {
            for d in t.finish() {
                out.push(self.ctx.chunk(delta_json(d), Value::Null, None));
            }
            calls = t.calls();
        }
        // llama.cpp's `timings` ride on the last chunk, as its server sends them.
        let mut last = self
            .ctx
            .chunk(json!({}), Value::Null, Some(finish_reason(summary, calls)));
        last["timings"] = timings(summary);
        out.push(last);
        out
    }

    fn usage_chunk(&self, summary: &SeqSummary) -> Option<Value> {
        self.include_usage.then(|| {
            json!({
                "id": self.ctx.id,
                "object": "chat.completion.chunk",
                "created": self.ctx.created,
                "model": self.ctx.model_id,
                "choices": [],
                "usage": usage(summary),
            })
        })
    }
}

/// A chunk's `delta` for what the tool-call stream has ready.
fn delta_json(d: ToolDelta) -> Value {
    match d {
        ToolDelta::Content(text) => json!({"content": text}),
        ToolDelta::Call(call) => json!({"tool_calls": [call]}),
    }
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;
