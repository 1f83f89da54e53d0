//! OpenAI's `POST /v1/embeddings` (llama.cpp's with `--embeddings --pooling`): each input (a
//! string, a list of them, a list of token ids or of such lists) becomes one L2-normalized
//! vector — the pooled final-normed hidden states of its tokens (`trit::engine::embed`, checked
//! against llama.cpp's embeddings of the default model). `encoding_format: "base64"` (what
//! OpenAI's Python client asks for by default) sends each vector as the base64 of its
//! little-endian f32 bytes. CPU models only; computed beside the scheduler's steps on the
//! model's thread pool, each input on a cache of its own.

use crate::error::ApiError;
use crate::request::decode;
use crate::state::AppState;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use trit::engine::embed;

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    input: Input,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    /// OpenAI's shortening of text-embedding-3 vectors: only the model's own width is served.
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let r: EmbeddingsRequest = decode(body)?;
    if let Some(m) = &r.model {
        if !state.accepts_model(m) {
            return Err(ApiError::not_found(format!(
                "The model `{m}` does not exist (this server serves `{}`)",
                state.config.model_id
            )));
        }
    }
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "encoding_format '{other}' (known: float, base64)"
            )))
        }
    };
    let width = state.model.config().hidden;
    if r.dimensions.is_some_and(|d| d != width) {
        return Err(ApiError::invalid(format!(
            "dimensions: this model's embeddings have {width} values; shortening is not offered"
        )));
    }
    let inputs = token_lists(&state, r.input)?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let pooling = state.config.pooling;
    let model = state.model.clone();
    let vectors = tokio::task::spawn_blocking(move || {
        inputs
            .iter()
            .map(|toks| embed(&model, toks, pooling))
            .collect::<trit::Result<Vec<_>>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("the embedding task failed: {e}")))?
    .map_err(|e| ApiError::from_engine(&e))?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64_encode(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": state.config.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// Every input as token ids: texts through the tokenizer (with the model's BOS, as its prompts
/// get it), ids checked against the vocabulary; none empty, none beyond the context.
fn token_lists(state: &AppState, input: Input) -> Result<Vec<Vec<u32>>, ApiError> {
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        let mut ids: Vec<u32> = state.config.bos.into_iter().collect();
        ids.extend(
            state
                .tokenizer
                .encode(text, false)
                .map_err(|e| ApiError::invalid(e.to_string()))?,
        );
        Ok(ids)
    };
    let lists = match input {
        Input::Text(t) => vec![encode(&t)?],
        Input::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Input::Tokens(ids) => vec![ids],
        Input::TokenLists(lists) => lists,
    };
    if lists.is_empty() {
        return Err(ApiError::invalid("input: no texts or token lists to embed"));
    }
    let vocab = state.tokenizer.vocab_size();
    for (i, ids) in lists.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::invalid(format!("input {i} has no tokens")));
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(format!(
                "input {i}: token id {bad} is outside the vocabulary ({vocab} tokens)"
            )));
        }
        if ids.len() > state.config.n_ctx {
            return Err(ApiError::exceeds_context(ids.len(), state.config.n_ctx));
        }
    }
    Ok(lists)
}

/// Standard base64 (RFC 4648 §4, padded).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_encode;

    #[test]
    fn base64_matches_rfc_4648s_test_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), coded);
        }
        assert_eq!(base64_encode(&[0xff, 0xfe, 0xfd]), "//79");
    }
}
