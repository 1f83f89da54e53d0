//! llama.cpp's own `POST /completion`: a raw prompt (text or token ids) and the sampling fields
//! every endpoint shares (`n_predict`, `temperature`, `top_k`, `stop`, `seed`, `json_schema`, …),
//! answered in llama.cpp's shape — `content`, `stop`, `tokens_predicted`, `tokens_evaluated`,
//! `tokens_cached`, `stop_type`, `timings`, with `n_probs` the `completion_probabilities`
//! and with `return_tokens` the ids; streamed as `data: {"content": …, "stop": false}` events
//! and a last one with `"stop": true` and the totals (no `[DONE]`: llama.cpp's own stream has
//! none). `cache_prompt` is accepted (the prefix cache is always on).

use crate::completions::{prompt_ids, Prompt};
use crate::error::ApiError;
use crate::request::{decode, Common};
use crate::state::{token_text, AppState};
use crate::stream::{collect, sse_response, timings, ChunkFormatter};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use trit::engine::{FinishReason, SeqSummary, TokenLogprob};

/// Most alternatives `n_probs` may ask for.
const MAX_PROBS: i64 = 20;

#[derive(Deserialize, Debug)]
struct NativeFields {
    prompt: Prompt,
    n_probs: Option<i64>,
    #[serde(default)]
    return_tokens: bool,
    #[serde(rename = "cache_prompt")]
    _cache_prompt: Option<bool>,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let common: Common = decode(body)?;
    let fields: NativeFields = decode(body)?;
    let top = match fields.n_probs {
        None | Some(0) => None,
        Some(k) if (1..=MAX_PROBS).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(format!(
                "n_probs must be between 0 and {MAX_PROBS}, got {k}"
            )))
        }
    };
    let prompt = prompt_ids(&state, fields.prompt)?;
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt must not be empty"));
    }
    let job = common.job(&state, prompt, top, None)?;
    if job.n != 1 {
        return Err(ApiError::invalid(
            "n is not supported on /completion (one reply, in llama.cpp's shape); \
             /v1/completions takes it",
        ));
    }
    let started = state.start(&job).await?;
    let mut f = Native {
        state: state.clone(),
        probs: top.is_some(),
        return_tokens: fields.return_tokens,
        eos: false,
    };
    if job.stream {
        return Ok(sse_response(started, f));
    }
    let c = collect(started).await?;
    f.eos = c.eos;
    let mut reply = f.event(&c.text, &c.tokens, &c.logprobs);
    f.finish(&mut reply, &c.summary);
    Ok(axum::Json(reply).into_response())
}

struct Native {
    state: Arc<AppState>,
    probs: bool,
    return_tokens: bool,
    /// An end-of-sequence token ended the reply (`stop_type` "eos", else "word").
    eos: bool,
}

impl Native {
    /// One event (or the whole reply's body): its text, ids and probabilities.
    fn event(&self, text: &str, tokens: &[u32], lps: &[TokenLogprob]) -> Value {
        let mut v = json!({"index": 0, "content": text, "stop": false, "id_slot": -1});
        if self.return_tokens {
            v["tokens"] = json!(tokens);
        }
        if self.probs {
            v["completion_probabilities"] = lps.iter().map(|l| self.prob(l)).collect();
        }
        v
    }

    fn prob(&self, l: &TokenLogprob) -> Value {
        let entry = |id: u32, lp: f32| {
            let text = token_text(&self.state.tokenizer, id);
            json!({"id": id, "token": text, "bytes": text.as_bytes(), "logprob": lp})
        };
        let mut v = entry(l.token, l.logprob);
        v["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
        v
    }

    /// The last event's fields: the totals and why it stopped.
    fn finish(&self, v: &mut Value, s: &SeqSummary) {
        let stop_type = match s.finish {
            FinishReason::Stop if self.eos => "eos",
            FinishReason::Stop => "word",
            FinishReason::Length => "limit",
            FinishReason::Cancelled => "none",
        };
        v["stop"] = json!(true);
        v["model"] = json!(self.state.config.model_id);
        v["tokens_predicted"] = json!(s.completion_tokens);
        v["tokens_evaluated"] = json!(s.prompt_tokens);
        v["tokens_cached"] = json!(s.cached_tokens);
        v["truncated"] = json!(false);
        v["stop_type"] = json!(stop_type);
        v["timings"] = timings(s);
    }
}

impl ChunkFormatter for Native {
    fn start(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn piece(
        &mut self,
        token: Option<u32>,
        text: &str,
        logprob: Option<&TokenLogprob>,
    ) -> Vec<Value> {
        let Some(t) = token else {
            self.eos = true;
            return Vec::new();
        };
        let lps = logprob.map(std::slice::from_ref).unwrap_or(&[]);
        vec![self.event(text, &[t], lps)]
    }

    fn done(&mut self, summary: &SeqSummary) -> Vec<Value> {
        let mut v = self.event("", &[], &[]);
        self.finish(&mut v, summary);
        vec![v]
    }

    fn done_marker(&self) -> bool {
        false
    }
}
