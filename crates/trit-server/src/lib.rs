//! `trit serve`: an OpenAI-compatible HTTP server (conventions.md §1–2).
//!
//! Handlers validate and translate requests (`request`, `chat`, `completions`), hand a job to
//! the engine's continuous-batching [`Scheduler`](trit::engine::Scheduler) through
//! [`AppState::start`], and turn its events into a JSON reply or SSE chunks (`stream`).
//! Every failure a client can cause is a 4xx in llama.cpp's error envelope (`error`).

pub mod bounded_map;
pub mod chat;
pub mod completions;
pub mod conversations;
pub mod embeddings;
pub mod error;
pub mod metrics;
pub mod native;
pub mod props;
pub mod request;
pub mod response_store;
pub mod responses;
pub mod state;
pub mod stream;
pub mod tokenize;
pub mod tool_stream;
pub mod tools;

pub use error::ApiError;
pub use state::{AppState, ServerConfig};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use trit::chat::ChatTemplate;
use trit::engine::{Scheduler, SchedulerConfig};
use trit::model::Model;
use trit::tokenizer::Tokenizer;

impl AppState {
    /// Starts the scheduler thread for `model` and bundles what the handlers need.
    pub fn new(
        config: ServerConfig,
        model: Arc<Model>,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
    ) -> std::io::Result<Arc<Self>> {
        let tokenizer = Arc::new(tokenizer);
        let scheduler = Scheduler::start(
            model.clone(),
            tokenizer.clone(),
            SchedulerConfig {
                n_ctx: config.n_ctx,
                parallel: config.parallel,
                max_queue: config.max_queue,
                kv_cache_bytes: config.kv_cache_bytes,
                context_shift: config.context_shift,
                draft: config.draft.clone(),
            },
        )?;
        Ok(Arc::new(AppState {
            config,
            tokenizer,
            template,
            scheduler,
            model,
            metrics: Default::default(),
            started: stream::unix_now(),
            token_table: Default::default(),
            dry_breakers: Default::default(),
            responses: Default::default(),
            conversations: Default::default(),
        }))
    }
}

/// The routes, with the API key check and the body size limit.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/completion", post(native_completion))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/responses", post(responses))
        .route(
            "/v1/responses/{id}",
            get(response_store::get_response).delete(response_store::delete_response),
        )
        .route(
            "/responses/{id}",
            get(response_store::get_response).delete(response_store::delete_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(response_store::input_items),
        )
        .route(
            "/responses/{id}/input_items",
            get(response_store::input_items),
        )
        .route("/v1/embeddings", post(embeddings))
        .route("/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/props", get(props))
        .route("/apply-template", post(apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/", get(ui))
        .merge(conversation_routes("/v1"))
        .merge(conversation_routes(""))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The Conversations API's routes under `prefix` (`conversations.rs`).
fn conversation_routes(prefix: &str) -> Router<Arc<AppState>> {
    use conversations as c;
    let at = |path: &str| format!("{prefix}/conversations{path}");
    Router::new()
        .route(&at(""), post(c::create))
        .route(&at("/{id}"), get(c::get).post(c::update).delete(c::delete))
        .route(&at("/{id}/items"), get(c::list_items).post(c::add_items))
        .route(
            &at("/{id}/items/{item_id}"),
            get(c::get_item).delete(c::delete_item),
        )
}

/// Serves on `listener` until `shutdown` resolves, then lets in-flight replies finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn require_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // The health check and the chat page (static; it asks for the key itself) are open.
        let open = matches!(req.uri().path(), "/health" | "/");
        if !open && given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

type Body = Result<Bytes, BytesRejection>;

async fn chat_completions(State(state): State<Arc<AppState>>, body: Body) -> Response {
    generation(state, body, |s, b| async move { chat::handle(s, &b).await }).await
}

async fn completions(State(state): State<Arc<AppState>>, body: Body) -> Response {
    generation(state, body, |s, b| async move {
        completions::handle(s, &b).await
    })
    .await
}

async fn native_completion(State(state): State<Arc<AppState>>, body: Body) -> Response {
    generation(
        state,
        body,
        |s, b| async move { native::handle(s, &b).await },
    )
    .await
}

/// A generating endpoint: its body read under the size limit, its answer (or error) counted.
async fn generation<F, Fut>(state: Arc<AppState>, body: Body, handle: F) -> Response
where
    F: FnOnce(Arc<AppState>, Bytes) -> Fut,
    Fut: Future<Output = Result<Response, ApiError>>,
{
    let result = match read_body(&state, body) {
        Ok(bytes) => handle(state.clone(), bytes).await,
        Err(e) => Err(e),
    };
    counted(&state, result)
}

async fn responses(State(state): State<Arc<AppState>>, body: Body) -> Response {
    generation(
        state,
        body,
        |s, b| async move { responses::handle(s, &b).await },
    )
    .await
}

async fn embeddings(State(state): State<Arc<AppState>>, body: Body) -> Response {
    generation(state, body, |s, b| async move {
        embeddings::handle(s, &b).await
    })
    .await
}

async fn tokenize(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let result = read_body(&state, body).and_then(|b| tokenize::tokenize(&state, &b));
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn props(State(state): State<Arc<AppState>>) -> Response {
    props::props(&state)
}

async fn apply_template(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let result = read_body(&state, body).and_then(|b| props::apply_template(&state, &b));
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn detokenize(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let result = read_body(&state, body).and_then(|b| tokenize::detokenize(&state, &b));
    result.unwrap_or_else(IntoResponse::into_response)
}

fn read_body(state: &AppState, body: Body) -> Result<Bytes, ApiError> {
    body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(state.config.body_limit),
        _ => ApiError::invalid(format!("could not read the request body: {e}")),
    })
}

fn counted(state: &AppState, result: Result<Response, ApiError>) -> Response {
    state.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
    match result {
        Ok(r) => r,
        Err(e) => {
            state
                .metrics
                .requests_failed_total
                .fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_id,
            "object": "model",
            "created": state.started,
            "owned_by": "trit",
            "meta": {"n_ctx": state.config.n_ctx},
        }],
    }))
    .into_response()
}

/// The chat page (`ui.html`): one self-contained file, no requests beyond this server's API.
async fn ui() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("ui.html"),
    )
        .into_response()
}

/// The model is loaded before the server listens, so a reachable server is ready.
async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(&state.scheduler.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found(req: Request) -> Response {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
    .into_response()
}
