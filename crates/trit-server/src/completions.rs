//! `POST /v1/completions`: a raw prompt (text or token ids), no chat template.

use crate::error::ApiError;
use crate::request::{decode, Common};
use crate::state::{token_text, AppState};
use crate::stream::{
    collect_all, combined, new_id, sse_choices, timings, unix_now, usage, ChunkFormatter,
};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use trit::engine::{SeqSummary, TokenLogprob};

/// A raw prompt: text (the model's BOS first where it wants one) or token ids.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

#[derive(Deserialize, Debug)]
struct CompletionFields {
    prompt: Prompt,
    /// Legacy: the number of alternatives to report (0..=5).
    logprobs: Option<i64>,
    #[serde(default)]
    echo: bool,
    suffix: Option<String>,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let common: Common = decode(body)?;
    let fields: CompletionFields = decode(body)?;
    if fields.echo {
        return Err(ApiError::invalid("echo is not supported"));
    }
    if fields.suffix.is_some() {
        return Err(ApiError::invalid("suffix is not supported"));
    }
    let top_logprobs = match fields.logprobs {
        None => None,
        Some(k) if (0..=5).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(format!(
                "logprobs must be between 0 and 5, got {k}"
            )))
        }
    };
    let ids = prompt_ids(&state, fields.prompt)?;
    respond(state, common, ids, top_logprobs).await
}

/// The token ids of a raw prompt; ids outside the vocabulary and several prompts are a 400.
pub fn prompt_ids(state: &AppState, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    let text = match prompt {
        Prompt::Text(t) => t,
        Prompt::Texts(mut v) if v.len() == 1 => v.pop().unwrap_or_default(),
        Prompt::Texts(_) => {
            return Err(ApiError::invalid(
                "prompt: only one prompt per request is supported",
            ))
        }
        Prompt::Ids(ids) => {
            let vocab = state.tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(format!(
                    "prompt: token id {bad} is outside the vocabulary ({vocab} tokens)"
                )));
            }
            return Ok(ids);
        }
    };
    let mut ids: Vec<u32> = state.config.bos.into_iter().collect();
    ids.extend(
        state
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::invalid(e.to_string()))?,
    );
    Ok(ids)
}

async fn respond(
    state: Arc<AppState>,
    common: Common,
    prompt: Vec<u32>,
    top_logprobs: Option<usize>,
) -> Result<Response, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt must not be empty"));
    }
    let job = common.job(&state, prompt, top_logprobs, None)?;
    let choices = state.start_choices(&job).await?;
    let chunks = Chunks {
        state: state.clone(),
        id: new_id("cmpl-"),
        created: unix_now(),
        logprobs: top_logprobs.is_some(),
        include_usage: job.include_usage,
        index: 0,
    };
    if job.stream {
        let formatters = choices.into_iter().enumerate().map(|(index, started)| {
            let formatter = Chunks {
                index,
                state: state.clone(),
                id: chunks.id.clone(),
                ..chunks
            };
            (started, formatter)
        });
        return Ok(sse_choices(formatters.collect()));
    }
    let collected = collect_all(choices).await?;
    let mut reply = chunks.chunk("", Value::Null, None);
    reply["choices"] = collected
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let lp = chunks.logprobs_json(&c.logprobs);
            json!({"index": index, "text": c.text, "logprobs": lp,
                   "finish_reason": c.summary.finish.as_str()})
        })
        .collect();
    let summaries: Vec<SeqSummary> = collected.into_iter().map(|c| c.summary).collect();
    let total = combined(&summaries);
    reply["usage"] = usage(&total);
    reply["timings"] = timings(&total);
    Ok(axum::Json(reply).into_response())
}

struct Chunks {
    state: Arc<AppState>,
    id: String,
    created: u64,
    logprobs: bool,
    include_usage: bool,
    /// The choice a stream's chunks belong to.
    index: usize,
}

impl Chunks {
    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.state.config.model_id,
            "choices": [{"index": self.index, "text": text, "logprobs": logprobs,
                         "finish_reason": finish}],
        })
    }

    /// The legacy completions shape: parallel lists per token.
    fn logprobs_json(&self, lps: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let mut offset = 0;
        let (mut tokens, mut values, mut tops, mut offsets) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for l in lps {
            let t = token_text(&self.state.tokenizer, l.token);
            offsets.push(offset);
            offset += t.len();
            tokens.push(t);
            values.push(l.logprob);
            let top: Map<String, Value> = l
                .top
                .iter()
                .map(|&(id, lp)| (token_text(&self.state.tokenizer, id), json!(lp)))
                .collect();
            tops.push(Value::Object(top));
        }
        json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
    }
}

impl ChunkFormatter for Chunks {
    fn start(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn piece(
        &mut self,
        _token: Option<u32>,
        text: &str,
        logprob: Option<&TokenLogprob>,
    ) -> Vec<Value> {
        if text.is_empty() && logprob.is_none() {
            return Vec::new();
        }
        let lp = self.logprobs_json(logprob.map(std::slice::from_ref).unwrap_or(&[]));
        vec![self.chunk(text, lp, None)]
    }

    fn done(&mut self, summary: &SeqSummary) -> Vec<Value> {
        vec![self.chunk("", Value::Null, Some(summary.finish.as_str()))]
    }

    fn usage_chunk(&self, summary: &SeqSummary) -> Option<Value> {
        self.include_usage.then(|| {
            let mut u = self.chunk("", Value::Null, None);
            u["choices"] = json!([]);
            u["usage"] = usage(summary);
            u
        })
    }
}
