//! Errors in llama.cpp's server envelope (conventions.md §1.2):
//! `{"error": {"code": <http>, "message": "...", "type": "..."}}`, plus `n_prompt_tokens` and
//! `n_ctx` for a prompt beyond the context, byte for byte as llama.cpp, because clients parse it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Extra fields of the error object (`n_prompt_tokens`, `n_ctx`).
    pub extra: Vec<(&'static str, Value)>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: Vec::new(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Invalid API Key",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 503 with `Retry-After`: every slot is busy and the queue is full.
    pub fn busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the server is busy: every slot is taken and the queue is full; retry later",
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// llama.cpp's context-overflow error.
    pub fn exceeds_context(n_prompt: usize, n_ctx: usize) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "exceed_context_size_error",
            trit::Error::ContextOverflow { n_prompt, n_ctx }.to_string(),
        );
        e.extra = vec![
            ("n_prompt_tokens", json!(n_prompt)),
            ("n_ctx", json!(n_ctx)),
        ];
        e
    }

    /// An engine error: what the caller sent (context, arguments, template) is a 400.
    /// A 400 for a request value the engine refused, worded as the engine's message alone
    /// (without its "invalid argument: " prefix).
    pub fn bad_value(e: &trit::Error) -> Self {
        let msg = e.to_string();
        Self::invalid(msg.strip_prefix("invalid argument: ").unwrap_or(&msg))
    }

    pub fn from_engine(e: &trit::Error) -> Self {
        match e {
            trit::Error::ContextOverflow { n_prompt, n_ctx } => {
                Self::exceeds_context(*n_prompt, *n_ctx)
            }
            trit::Error::InvalidArgument(_)
            | trit::Error::Template(_)
            | trit::Error::Tokenizer(_)
            | trit::Error::Unsupported(_) => Self::invalid(e.to_string()),
            other => Self::internal(other.to_string()),
        }
    }

    /// The JSON body (also sent as an SSE event when streaming already started).
    pub fn body(&self) -> Value {
        let mut obj = serde_json::Map::new();
        obj.insert("code".into(), json!(self.status.as_u16()));
        obj.insert("message".into(), json!(self.message));
        obj.insert("type".into(), json!(self.kind));
        for (k, v) in &self.extra {
            obj.insert((*k).into(), v.clone());
        }
        json!({ "error": obj })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_overflow_body_is_llama_cpp_byte_for_byte() {
        let body = ApiError::exceeds_context(9214, 8192).body().to_string();
        assert_eq!(
            body,
            r#"{"error":{"code":400,"message":"request (9214 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9214,"n_ctx":8192}}"#
        );
    }
}
