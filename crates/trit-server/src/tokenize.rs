//! llama.cpp's `POST /tokenize` and `POST /detokenize`: the served model's tokenizer over
//! HTTP, so clients can count and split prompts exactly as the server will.

use crate::error::ApiError;
use crate::request::decode;
use crate::state::{token_bytes, AppState};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct TokenizeRequest {
    content: String,
    /// Prepend the model's BOS token where its prompts get one.
    #[serde(default)]
    add_special: bool,
    /// `[{"id", "piece"}]` instead of bare ids; a piece that is not valid UTF-8 on its own
    /// comes as its bytes.
    #[serde(default)]
    with_pieces: bool,
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

pub fn tokenize(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let r: TokenizeRequest = decode(body)?;
    let mut ids: Vec<u32> = Vec::new();
    if r.add_special {
        ids.extend(state.config.bos);
    }
    ids.extend(
        state
            .tokenizer
            .encode(&r.content, false)
            .map_err(|e| ApiError::invalid(e.to_string()))?,
    );
    let tokens: Vec<Value> = if r.with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = token_bytes(&state.tokenizer, id);
                let piece = match String::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

pub fn detokenize(state: &AppState, body: &[u8]) -> Result<Response, ApiError> {
    let r: DetokenizeRequest = decode(body)?;
    let vocab = state.tokenizer.vocab_size();
    if let Some(bad) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(format!(
            "tokens: token id {bad} is outside the vocabulary ({vocab} tokens)"
        )));
    }
    let content = state
        .tokenizer
        .decode(&r.tokens, false)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(Json(json!({ "content": content })).into_response())
}
