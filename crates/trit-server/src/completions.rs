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
use trit::engine::perplexity::prompt_logprobs;
use trit::engine::{SeqSummary, TokenLogprob};

/// A raw prompt: text (the model's BOS first where it wants one) or token ids; or several,
/// each with its own choices.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// Prompts one request may hold.
const MAX_PROMPTS: usize = 64;

#[derive(Deserialize, Debug)]
struct CompletionFields {
    prompt: Prompt,
    /// Legacy: the number of alternatives to report (0..=5).
    logprobs: Option<i64>,
    /// The prompt comes back before the completion (with its tokens' log-probabilities when
    /// `logprobs` is set: how lm-evaluation-harness scores continuations).
    #[serde(default)]
    echo: bool,
    suffix: Option<String>,
}

/// One prompt: the ids the model reads, and the text and tokens `echo` gives back.
pub struct PromptIds {
    pub ids: Vec<u32>,
    /// The prompt as the request gave it (ids: their decoded text).
    text: String,
    /// Leading ids the server added (the model's BOS before a text prompt), which `echo`
    /// leaves out.
    added: usize,
}

pub async fn handle(state: Arc<AppState>, body: &[u8]) -> Result<Response, ApiError> {
    let mut common: Common = decode(body)?;
    let fields: CompletionFields = decode(body)?;
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
    let prompts = prompt_list(&state, fields.prompt)?;
    // `echo` with nothing to generate: the prompt and its log-probabilities only.
    let prompt_only = fields.echo && common.max_tokens == Some(0);
    if prompt_only {
        if common.stream {
            return Err(ApiError::invalid(
                "max_tokens 0 with echo has nothing to stream; send it without stream",
            ));
        }
        common.max_tokens = Some(1); // validated like any request, never started
    }
    let mut jobs = Vec::with_capacity(prompts.len());
    for p in &prompts {
        jobs.push(common.job(&state, p.ids.clone(), top_logprobs, None)?);
    }
    let n = jobs[0].n;
    if prompts.len() * n > MAX_PROMPTS {
        return Err(ApiError::invalid(format!(
            "{} prompts × n = {n} choices: at most {MAX_PROMPTS} per request",
            prompts.len()
        )));
    }
    let chunks = Chunks {
        state: state.clone(),
        id: new_id("cmpl-"),
        created: unix_now(),
        logprobs: top_logprobs.is_some(),
        include_usage: jobs[0].include_usage,
        index: 0,
        echo: None,
    };
    let echoes = match fields.echo {
        true => echoes(&chunks, &prompts, top_logprobs).await?,
        false => vec![None; prompts.len()],
    };
    if prompt_only {
        return Ok(axum::Json(chunks.echo_only(&prompts, &echoes, n)).into_response());
    }
    let groups = futures_util::future::try_join_all(jobs.iter().map(|j| state.start_choices(j)));
    let groups = groups.await?;
    if jobs[0].stream {
        let mut formatters = Vec::new();
        for (p, (group, echo)) in groups.into_iter().zip(echoes).enumerate() {
            for (j, started) in group.into_iter().enumerate() {
                let formatter = Chunks {
                    index: p * n + j,
                    state: state.clone(),
                    id: chunks.id.clone(),
                    echo: echo.clone(),
                    ..chunks
                };
                formatters.push((started, formatter));
            }
        }
        return Ok(sse_choices(formatters, n));
    }
    let mut choices = Vec::new();
    let mut summaries = Vec::new();
    for (p, (group, echo)) in groups.into_iter().zip(&echoes).enumerate() {
        for (j, c) in collect_all(group).await?.into_iter().enumerate() {
            let mut lp = chunks.logprobs_json(&c.logprobs);
            let mut text = c.text;
            if let Some((prompt, prompt_lp)) = echo {
                text.insert_str(0, prompt);
                lp = joined_logprobs(prompt_lp, lp, prompt.len());
            }
            choices.push(json!({"index": p * n + j, "text": text, "logprobs": lp,
                                "finish_reason": c.summary.finish.as_str()}));
            summaries.push(c.summary);
        }
    }
    let total = combined(&summaries, n);
    let mut reply = chunks.chunk("", Value::Null, None);
    reply["choices"] = Value::Array(choices);
    reply["usage"] = usage(&total);
    reply["timings"] = timings(&total);
    Ok(axum::Json(reply).into_response())
}

/// The token ids of a single raw prompt (llama.cpp's `/completion`); several are a 400.
pub fn prompt_ids(state: &AppState, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    let mut list = prompt_list(state, prompt)?;
    if list.len() != 1 {
        return Err(ApiError::invalid(
            "prompt: only one prompt per request is supported",
        ));
    }
    Ok(list.pop().map(|p| p.ids).unwrap_or_default())
}

/// The prompts of a request; ids outside the vocabulary, empty prompts and more than
/// `MAX_PROMPTS` are a 400.
fn prompt_list(state: &AppState, prompt: Prompt) -> Result<Vec<PromptIds>, ApiError> {
    let (texts, id_lists) = match prompt {
        Prompt::Text(t) => (vec![t], Vec::new()),
        Prompt::Texts(v) => (v, Vec::new()),
        Prompt::Ids(ids) => (Vec::new(), vec![ids]),
        Prompt::IdLists(v) => (Vec::new(), v),
    };
    if texts.len() + id_lists.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(format!(
            "prompt: at most {MAX_PROMPTS} prompts per request"
        )));
    }
    let vocab = state.tokenizer.vocab_size();
    let mut out = Vec::new();
    for text in texts {
        let mut ids: Vec<u32> = state.config.bos.into_iter().collect();
        let added = ids.len();
        ids.extend(
            state
                .tokenizer
                .encode(&text, false)
                .map_err(|e| ApiError::invalid(e.to_string()))?,
        );
        out.push(PromptIds { ids, text, added });
    }
    for ids in id_lists {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(format!(
                "prompt: token id {bad} is outside the vocabulary ({vocab} tokens)"
            )));
        }
        let text = ids
            .iter()
            .map(|&t| token_text(&state.tokenizer, t))
            .collect();
        out.push(PromptIds {
            ids,
            text,
            added: 0,
        });
    }
    if out.is_empty() || out.iter().any(|p| p.ids.len() == p.added) {
        return Err(ApiError::invalid("prompt must not be empty"));
    }
    Ok(out)
}

/// What `echo` puts before each prompt's completions: its text and, with `logprobs`, its
/// tokens' log-probabilities (the first token has none), computed on the model's thread pool
/// beside the scheduler, as embeddings are.
async fn echoes(
    chunks: &Chunks,
    prompts: &[PromptIds],
    top: Option<usize>,
) -> Result<Vec<Option<(String, Value)>>, ApiError> {
    let Some(top) = top else {
        return Ok(prompts
            .iter()
            .map(|p| Some((p.text.clone(), Value::Null)))
            .collect());
    };
    let model = chunks.state.model.clone();
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let scored = tokio::task::spawn_blocking(move || {
        ids.iter()
            .map(|ids| prompt_logprobs(&model, ids, top))
            .collect::<trit::Result<Vec<_>>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("the prompt scoring task failed: {e}")))?
    .map_err(|e| ApiError::invalid(format!("echo with logprobs: {e}")))?;
    Ok(prompts
        .iter()
        .zip(scored)
        .map(|(p, lps)| {
            // Position i's entry scores ids[i + 1]; the first echoed token has none.
            let first = p.ids[p.added];
            let lps = &lps[p.added..];
            Some((p.text.clone(), chunks.prompt_logprobs_json(first, lps)))
        })
        .collect())
}

/// `prompt`'s log-probabilities followed by the completion's, its offsets moved past the
/// prompt's `shift` bytes.
fn joined_logprobs(prompt: &Value, completion: Value, shift: usize) -> Value {
    if prompt.is_null() {
        return completion;
    }
    let mut out = prompt.clone();
    for key in ["tokens", "token_logprobs", "top_logprobs"] {
        if let (Some(a), Some(b)) = (out[key].as_array_mut(), completion[key].as_array()) {
            a.extend(b.iter().cloned());
        }
    }
    if let (Some(a), Some(b)) = (
        out["text_offset"].as_array_mut(),
        completion["text_offset"].as_array(),
    ) {
        a.extend(
            b.iter()
                .map(|o| json!(o.as_u64().unwrap_or(0) + shift as u64)),
        );
    }
    out
}

struct Chunks {
    state: Arc<AppState>,
    id: String,
    created: u64,
    logprobs: bool,
    include_usage: bool,
    /// The choice a stream's chunks belong to.
    index: usize,
    /// What `echo` sends first: the prompt's text and log-probabilities.
    echo: Option<(String, Value)>,
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

    /// The reply of `echo` with `max_tokens: 0`: each prompt (n times), nothing generated.
    fn echo_only(
        &self,
        prompts: &[PromptIds],
        echoes: &[Option<(String, Value)>],
        n: usize,
    ) -> Value {
        let mut reply = self.chunk("", Value::Null, None);
        let mut choices = Vec::new();
        for (p, echo) in echoes.iter().enumerate() {
            let (text, lp) = echo.clone().unwrap_or_default();
            for j in 0..n {
                choices.push(json!({"index": p * n + j, "text": text, "logprobs": lp,
                                    "finish_reason": "length"}));
            }
        }
        let prompt_tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
        reply["choices"] = Value::Array(choices);
        reply["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                "total_tokens": prompt_tokens});
        reply
    }

    /// The legacy shape for a prompt: `first` without a log-probability, then `lps` (each
    /// entry scoring the token after the previous one).
    fn prompt_logprobs_json(&self, first: u32, lps: &[TokenLogprob]) -> Value {
        let first_text = token_text(&self.state.tokenizer, first);
        let shift = first_text.len();
        let head = json!({"tokens": [first_text], "token_logprobs": [null],
                          "top_logprobs": [null], "text_offset": [0]});
        joined_logprobs(&head, self.logprobs_json(lps), shift)
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
        match self.echo.take() {
            Some((text, lp)) => vec![self.chunk(&text, lp, None)],
            None => Vec::new(),
        }
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
