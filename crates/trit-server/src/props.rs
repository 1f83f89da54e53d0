//! llama.cpp's `GET /props` (what the server runs with: context, slots, sampling defaults,
//! chat template) and `POST /apply-template` (a conversation rendered by the chat template
//! into the prompt the server would give the model), for clients and UIs built for llama.cpp's
//! server and for checking what a template makes of a conversation.

use crate::chat::normalize_messages;
use crate::error::ApiError;
use crate::request::decode;
use crate::state::{token_text, AppState};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

pub fn props(state: &AppState) -> Response {
    let c = &state.config;
    let d = &c.defaults;
    let eos: Vec<Value> = c
        .eos
        .iter()
        .map(|&t| json!(token_text(&state.tokenizer, t)))
        .collect();
    Json(json!({
        "default_generation_settings": {
            "n_ctx": c.n_ctx,
            "params": {
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.penalties.repetition,
                "repeat_last_n": d.penalties.last_n,
                "presence_penalty": d.penalties.presence,
                "frequency_penalty": d.penalties.frequency,
                "seed": d.seed,
            },
        },
        "total_slots": c.parallel,
        "model_alias": c.model_id,
        "chat_template": state.template.as_ref().map_or("", |t| t.source()),
        "eos_tokens": eos,
        "modalities": {"vision": false, "audio": false},
        "build_info": concat!("trit ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

#[derive(Deserialize)]
struct ApplyTemplate {
    messages: Vec<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
    /// Whether the prompt ends with the assistant's turn opened (as a chat request does).
    #[serde(default = "yes")]
    add_generation_prompt: bool,
}

fn yes() -> bool {
    true
}

pub fn apply_template(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let r: ApplyTemplate = decode(body)?;
    let Some(template) = &state.template else {
        return Err(ApiError::invalid("this model has no chat template"));
    };
    let messages = normalize_messages(&r.messages)?;
    let tools = r.tools.map(Value::Array);
    let kwargs = r.chat_template_kwargs.unwrap_or_default();
    let prompt = template
        .render(&messages, r.add_generation_prompt, tools.as_ref(), &kwargs)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(Json(json!({ "prompt": prompt })).into_response())
}
