//! Turning a started sequence into an HTTP reply: collected whole (non-streaming) or as
//! Server-Sent Events, each `data: <json>` plus a blank line, ending with `data: [DONE]`.
//! The SSE body (or the handler future of a plain reply) owns the event receiver: when the
//! client goes away it is dropped, the receiver with it, and the scheduler cancels the
//! sequence at its next event — the next token, or the next prompt chunk while it reads the
//! prompt.

use crate::error::ApiError;
use crate::state::Started;
use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use trit::engine::{SeqEvent, SeqSummary, TokenLogprob};

/// A whole reply.
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// The sampled tokens (the end-of-sequence token not among them).
    pub tokens: Vec<u32>,
    /// Whether an end-of-sequence token ended it.
    pub eos: bool,
    pub summary: SeqSummary,
}

/// Waits for the end of the sequence.
pub async fn collect(started: Started) -> Result<Collected, ApiError> {
    let Started {
        first, mut events, ..
    } = started;
    let mut out = Collected {
        text: String::new(),
        logprobs: Vec::new(),
        tokens: Vec::new(),
        eos: false,
        summary: SeqSummary {
            finish: trit::engine::FinishReason::Stop,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            prompt_secs: 0.0,
            gen_secs: 0.0,
        },
    };
    let mut next = Some(first);
    while let Some(event) = next {
        match event {
            SeqEvent::Piece {
                token,
                text,
                logprob,
            } => {
                out.text.push_str(&text);
                out.logprobs.extend(logprob);
                match token {
                    Some(t) => out.tokens.push(t),
                    None => out.eos = true,
                }
            }
            SeqEvent::Done(s) => {
                out.summary = s;
                return Ok(out);
            }
            SeqEvent::Prompt { .. } => {}
            SeqEvent::Error(e) => return Err(ApiError::from_engine(&e)),
        }
        next = events.recv().await;
    }
    Err(ApiError::internal("the sequence ended without a result"))
}

/// Formats sequence events as the JSON payloads of SSE events.
pub trait ChunkFormatter: Send + 'static {
    /// Payloads sent before the first token (the role delta of chat).
    fn start(&mut self) -> Vec<Value>;
    /// One sampled token (`None`: the end-of-sequence token, not emitted) and its text.
    fn piece(
        &mut self,
        token: Option<u32>,
        text: &str,
        logprob: Option<&TokenLogprob>,
    ) -> Vec<Value>;
    /// The final chunks of one choice (its finish reason).
    fn done(&mut self, summary: &SeqSummary) -> Vec<Value>;
    /// The usage chunk sent once every choice is done, where the request asked for one
    /// (`summary`: the choices' [`combined`] totals).
    fn usage_chunk(&self, _summary: &SeqSummary) -> Option<Value> {
        None
    }
    /// Whether the stream ends with OpenAI's `data: [DONE]` (llama.cpp's own endpoint has none).
    fn done_marker(&self) -> bool {
        true
    }
}

/// One choice's events, tagged with its index.
type ChoiceEvents = stream::BoxStream<'static, (usize, SeqEvent)>;

struct SseState<F> {
    per_prompt: usize,
    /// One per choice, in choice order.
    formatters: Vec<F>,
    /// The choices' first events, sent after the start chunks.
    firsts: Option<Vec<SeqEvent>>,
    events: stream::SelectAll<ChoiceEvents>,
    summaries: Vec<Option<SeqSummary>>,
    pending: VecDeque<String>,
    finished: bool,
}

fn frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl<F: ChunkFormatter> SseState<F> {
    fn handle(&mut self, i: usize, event: SeqEvent) {
        match event {
            SeqEvent::Piece {
                token,
                text,
                logprob,
            } => {
                for v in self.formatters[i].piece(token, &text, logprob.as_ref()) {
                    self.pending.push_back(frame(&v));
                }
            }
            SeqEvent::Done(s) => {
                for v in self.formatters[i].done(&s) {
                    self.pending.push_back(frame(&v));
                }
                self.summaries[i] = Some(s);
                let all: Option<Vec<SeqSummary>> = self.summaries.iter().cloned().collect();
                if let Some(all) = all {
                    if let Some(u) =
                        self.formatters[0].usage_chunk(&combined(&all, self.per_prompt))
                    {
                        self.pending.push_back(frame(&u));
                    }
                    if self.formatters[0].done_marker() {
                        self.pending.push_back("data: [DONE]\n\n".into());
                    }
                    self.finished = true;
                }
            }
            SeqEvent::Error(e) => {
                self.pending
                    .push_back(frame(&ApiError::from_engine(&e).body()));
                self.finished = true;
            }
            SeqEvent::Prompt { .. } => {}
        }
    }
}

/// The SSE response for a started sequence.
pub fn sse_response<F: ChunkFormatter>(started: Started, formatter: F) -> Response {
    sse_choices(vec![(started, formatter)], 1)
}

/// The SSE response for a request's choices (OpenAI's `n`), each formatted by its own
/// formatter (which tags its chunks with its index); their events interleave as they come,
/// and the usage chunk and `[DONE]` follow the last choice's end (consecutive groups of
/// `per_prompt` choices share a prompt: see [`combined`]). Dropping the body (the client left)
/// drops every choice's receiver, which cancels them all.
pub fn sse_choices<F: ChunkFormatter>(choices: Vec<(Started, F)>, per_prompt: usize) -> Response {
    let n = choices.len();
    let mut formatters = Vec::with_capacity(n);
    let mut firsts = Vec::with_capacity(n);
    let mut streams: Vec<ChoiceEvents> = Vec::with_capacity(n);
    for (i, (started, formatter)) in choices.into_iter().enumerate() {
        formatters.push(formatter);
        firsts.push(started.first);
        streams.push(Box::pin(stream::unfold(
            started.events,
            move |mut rx| async move { rx.recv().await.map(|e| ((i, e), rx)) },
        )));
    }
    let state = SseState {
        per_prompt,
        formatters,
        firsts: Some(firsts),
        events: stream::select_all(streams),
        summaries: vec![None; n],
        pending: VecDeque::new(),
        finished: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(f) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(f), st));
            }
            if st.finished {
                return None;
            }
            if let Some(firsts) = st.firsts.take() {
                for f in &mut st.formatters {
                    for v in f.start() {
                        st.pending.push_back(frame(&v));
                    }
                }
                for (i, e) in firsts.into_iter().enumerate() {
                    st.handle(i, e);
                }
                continue;
            }
            match st.events.next().await {
                Some((i, e)) => st.handle(i, e),
                None => {
                    let err = ApiError::internal("the sequence ended without a result");
                    st.pending.push_back(frame(&err.body()));
                    st.finished = true;
                }
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Several choices' totals as OpenAI counts them: each prompt once (the first choice of its
/// group of `per_prompt`, which read it; the others mapped its blocks), every choice's
/// generated tokens.
pub fn combined(summaries: &[SeqSummary], per_prompt: usize) -> SeqSummary {
    let mut total = SeqSummary {
        finish: summaries[0].finish,
        prompt_tokens: 0,
        cached_tokens: 0,
        completion_tokens: 0,
        prompt_secs: 0.0,
        gen_secs: 0.0,
    };
    for group in summaries.chunks(per_prompt.max(1)) {
        total.prompt_tokens += group[0].prompt_tokens;
        total.cached_tokens += group[0].cached_tokens;
        total.prompt_secs += group[0].prompt_secs;
    }
    for s in summaries {
        total.completion_tokens += s.completion_tokens;
        total.gen_secs = total.gen_secs.max(s.gen_secs);
    }
    total
}

/// Waits for the end of every choice.
pub async fn collect_all(choices: Vec<Started>) -> Result<Vec<Collected>, ApiError> {
    futures_util::future::try_join_all(choices.into_iter().map(collect)).await
}

/// OpenAI's `usage`, with the prompt tokens served from the prefix cache.
pub fn usage(s: &SeqSummary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// llama.cpp's `timings`.
pub fn timings(s: &SeqSummary) -> Value {
    let prompt_n = s.prompt_tokens - s.cached_tokens;
    let per_sec = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    json!({
        "cache_n": s.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": s.prompt_secs * 1e3,
        "prompt_per_second": per_sec(prompt_n, s.prompt_secs),
        "predicted_n": s.completion_tokens,
        "predicted_ms": s.gen_secs * 1e3,
        "predicted_per_second": per_sec(s.completion_tokens, s.gen_secs),
    })
}

/// Unique-enough ids: `prefix` + time + a process-wide counter.
pub fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}{:x}{:04x}",
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
