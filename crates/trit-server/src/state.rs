//! What every handler shares: the configuration, the tokenizer and chat template, the
//! scheduler that owns the model, and the server-side metrics. `start` is the narrow boundary
//! to the engine: a validated job in, a stream of sequence events out.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request::Job;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use trit::chat::ChatTemplate;
use trit::engine::{Scheduler, SeqEvent, SeqRequest, SubmitError};
use trit::sample::dry::DEFAULT_BREAKERS;
use trit::sample::{Breakers, SamplingParams, TokenTable};
use trit::tokenizer::Tokenizer;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and requests may give as `model`.
    pub model_id: String,
    pub n_ctx: usize,
    /// Sampling values used when a request leaves a field unset (the model's defaults).
    pub defaults: SamplingParams,
    /// Tokens that end a sequence.
    pub eos: Vec<u32>,
    /// Prepended to raw `/v1/completions` prompts when the model wants a BOS token.
    pub bos: Option<u32>,
    /// Required as `Authorization: Bearer <key>` on every endpoint but `/health`.
    pub api_key: Option<String>,
    /// Largest accepted request body, bytes.
    pub body_limit: usize,
    /// Sequences decoded together at most.
    pub parallel: usize,
    /// Requests allowed to wait beyond those; more get 503.
    pub max_queue: usize,
    /// Memory for all keys/values (running sequences and cached prefixes), in KV blocks.
    pub kv_cache_bytes: usize,
    /// llama.cpp's `--context-shift` (`keep`: tokens of each prompt kept, at most the prompt):
    /// a reply that fills the context goes on from a kept window; `max_tokens` may then exceed
    /// the context, and unset means until the end of the sequence.
    pub context_shift: Option<trit::engine::ContextShift>,
    /// Speculative decoding while one request runs alone (llama.cpp's `--model-draft`).
    pub draft: Option<trit::engine::Draft>,
    /// How `/v1/embeddings` pools a text's hidden states (llama.cpp's `--pooling`).
    pub pooling: trit::engine::Pooling,
}

pub struct AppState {
    pub config: ServerConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub scheduler: Scheduler,
    /// The scheduler's model, shared for `/v1/embeddings` (its thread pool takes one caller at
    /// a time, so an embedding runs between the scheduler's steps).
    pub model: Arc<trit::model::Model>,
    pub metrics: Metrics,
    /// Unix seconds at start (`created` of the model object).
    pub started: u64,
    /// Every token's bytes for constrained decoding, made on the first request that asks.
    pub token_table: OnceLock<Arc<TokenTable>>,
    /// llama.cpp's default DRY sequence breakers in this vocabulary, made on first use.
    pub dry_breakers: OnceLock<Arc<Breakers>>,
    /// `/v1/responses`' stored responses (`previous_response_id`, `GET`/`DELETE` by id).
    pub responses: crate::response_store::ResponseStore,
    /// The Conversations API's conversations (`conversations.rs`; `conversation` on
    /// `/v1/responses`).
    pub conversations: crate::conversations::ConversationStore,
}

/// A submitted job whose first event (other than prompt progress) has arrived (so an error before the first token can
/// still be an ordinary HTTP error response).
pub struct Started {
    pub first: SeqEvent,
    pub events: UnboundedReceiver<SeqEvent>,
    pub submitted: Instant,
}

impl AppState {
    /// Model names a request may use: the served id, or its file name with the extension.
    pub fn accepts_model(&self, name: &str) -> bool {
        let id = &self.config.model_id;
        name == id || name.strip_suffix(".gguf") == Some(id)
    }

    /// The vocabulary's bytes for `response_format` (built once, on first use).
    pub fn token_table(&self) -> Arc<TokenTable> {
        self.token_table
            .get_or_init(|| Arc::new(TokenTable::new(&self.tokenizer)))
            .clone()
    }

    /// DRY's default sequence breakers as token sequences (built once, on first use).
    pub fn default_dry_breakers(&self) -> Arc<Breakers> {
        self.dry_breakers
            .get_or_init(|| {
                let strings = DEFAULT_BREAKERS.map(String::from);
                Arc::new(Breakers::new(&self.tokenizer, &strings))
            })
            .clone()
    }

    /// Submits `job` and waits for its first event (error or first token).
    pub async fn start(&self, job: &Job) -> Result<Started, ApiError> {
        let (tx, mut events) = unbounded_channel();
        let submitted = Instant::now();
        self.scheduler
            .submit(SeqRequest {
                prompt: job.prompt.clone(),
                options: job.options.clone(),
                top_logprobs: job.top_logprobs,
                keep: job.keep,
                sink: Box::new(move |e| tx.send(e).is_ok()),
            })
            .map_err(|e| match e {
                SubmitError::QueueFull => ApiError::busy(),
                SubmitError::Stopped => ApiError::internal("the scheduler has stopped"),
            })?;
        // Prompt progress is not part of the reply; the first token (or error) is.
        let first = loop {
            match events.recv().await {
                Some(SeqEvent::Prompt { .. }) => continue,
                Some(e) => break e,
                None => return Err(ApiError::internal("the scheduler dropped the request")),
            }
        };
        if let SeqEvent::Error(e) = &first {
            return Err(ApiError::from_engine(e));
        }
        self.metrics.observe_ttft(submitted.elapsed().as_secs_f64());
        Ok(Started {
            first,
            events,
            submitted,
        })
    }
}

impl AppState {
    /// Starts the job's `n` choices: the first alone — its prompt's full KV blocks enter the
    /// prefix index as they fill — then the others together, which map those blocks instead of
    /// reading the prompt again. Choice i samples with the job's seed + i, so sampled choices
    /// differ and a seeded request repeats. If one cannot start, the started ones are dropped
    /// (cancelled) and the error returned.
    pub async fn start_choices(&self, job: &Job) -> Result<Vec<Started>, ApiError> {
        let mut all = vec![self.start(job).await?];
        let rest = (1..job.n).map(|i| {
            let mut choice = job.clone();
            let seed = &mut choice.options.sampling.seed;
            *seed = seed.wrapping_add(i as u64);
            async move { self.start(&choice).await }
        });
        all.extend(futures_util::future::try_join_all(rest).await?);
        Ok(all)
    }
}

/// Text of one token for logprobs (special tokens included, as OpenAI shows them).
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    match tokenizer.token_bytes(id) {
        Some(b) => String::from_utf8_lossy(&b).into_owned(),
        None => tokenizer.decode(&[id], false).unwrap_or_default(),
    }
}

pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    tokenizer
        .token_bytes(id)
        .unwrap_or_else(|| token_text(tokenizer, id).into_bytes())
}
