//! `trit serve [MODEL]`: the OpenAI-compatible server (crate `trit-server`).

use super::run::DraftArgs;
use super::{eos_ids, load, ModelArgs, SamplerArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use trit_server::{AppState, ServerConfig};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model path (positional form of --model).
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Speculative decoding while one request runs alone (the same replies; several running
    /// requests share batched steps instead). CPU, attention-only models.
    #[command(flatten)]
    pub draft: DraftArgs,
    /// How requests that leave a sampling field unset are sampled (the model's
    /// recommendation where neither says).
    #[command(flatten)]
    pub samplers: SamplerArgs,
    /// Address to listen on; only this machine can connect unless you change it.
    #[arg(long, default_value = "127.0.0.1", env = "TRIT_ARG_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8080, env = "TRIT_ARG_PORT")]
    pub port: u16,
    /// Sequences decoded together at most (continuous batching). With --device cuda each one
    /// holds a GPU KV slot for the full context (at most TRIT_CUDA_MAX_SEQS, default 64).
    #[arg(long, alias = "np", default_value_t = 4, env = "TRIT_ARG_N_PARALLEL")]
    pub parallel: usize,
    /// Requests allowed to wait for a place among the --parallel sequences; beyond that, 503 +
    /// Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, env = "TRIT_API_KEY")]
    pub api_key: Option<String>,
    /// Model name reported by /v1/models (default: the file or folder name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Largest request body in MiB.
    #[arg(long, default_value_t = 16)]
    pub body_limit_mib: usize,
    /// Memory (MiB) for all keys/values: the KV blocks of running sequences and those of
    /// earlier requests kept for prefix reuse (evicted least recently used first). Allocated as
    /// used. Default: room for --parallel sequences at the full context, plus 512 MiB.
    #[arg(long)]
    pub kv_cache_mib: Option<usize>,
    /// When a reply fills the context, keep the first --keep tokens of its prompt and the
    /// newer half of the rest, read them again and go on (llama.cpp's --context-shift).
    /// max_tokens may then exceed the context; unset, a reply runs until its end of sequence.
    #[arg(long)]
    pub context_shift: bool,
    /// Tokens from the start of each prompt that a context shift keeps (at most the prompt);
    /// -1: the whole prompt. llama.cpp's --keep.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, requires = "context_shift",
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub keep: i64,
    /// How /v1/embeddings makes one vector of a text's final hidden states: mean, last (the
    /// last token's) or cls (the first token's); L2-normalized. llama.cpp's --pooling.
    #[arg(long, default_value = "mean", value_parser = parse_pooling)]
    pub pooling: trit::engine::Pooling,
}

fn parse_pooling(s: &str) -> std::result::Result<trit::engine::Pooling, String> {
    trit::engine::Pooling::parse(s).map_err(|e| e.to_string())
}

/// Memory kept for cached prefixes beyond the running sequences' worst case, by default.
const PREFIX_CACHE_MIB: usize = 512;

pub fn run(mut a: ServeArgs) -> Result<()> {
    super::take_positional_model(a.path.take(), &mut a.model)?;
    anyhow::ensure!(a.parallel >= 1, "--parallel must be at least 1");
    let loaded = load(&a.model)?;
    let on_gpu = a.model.device == super::Device::Cuda;
    let slots = loaded.model.max_sequences();
    if a.parallel > slots {
        eprintln!(
            "trit serve: warning: --parallel {} is more than the {slots} sequences the GPU holds \
             at once (its free memory at this --ctx, or TRIT_CUDA_MAX_SEQS); running {slots} \
             together, the rest wait in the queue",
            a.parallel
        );
        a.parallel = slots;
    }
    let model_id = a.alias.clone().unwrap_or_else(|| {
        let p = &loaded.files.path;
        p.file_stem()
            .or(p.file_name())
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    });
    let c = &loaded.files.config;
    // Bytes of one block as the cache stores it (`--cache-type-k/-v`): f16 blocks are half
    // the size, so the default budget and `--kv-cache-mib` hold twice the positions.
    let block = trit::model::kv_cache::KvBlock::bytes_for(trit::model::kv_cache::KvShape {
        n_layers: c.kv_layers(),
        row: c.n_kv_heads * c.head_dim,
        types: loaded.model.kv_types(),
    });
    // A sequence's worst case: its context in blocks, plus one for a copy-on-write.
    let per_sequence = (loaded.n_ctx.div_ceil(trit::model::kv_cache::BLOCK_TOKENS) + 1) * block;
    let kv_cache_bytes = match a.kv_cache_mib {
        Some(mib) => mib << 20,
        None => a.parallel * per_sequence + (PREFIX_CACHE_MIB << 20),
    };
    if on_gpu && a.kv_cache_mib.is_some() {
        eprintln!(
            "trit serve: warning: --kv-cache-mib is ignored with --device cuda (keys/values live \
             in one GPU slot per --parallel sequence)"
        );
    }
    if !on_gpu && kv_cache_bytes < per_sequence {
        eprintln!(
            "trit serve: warning: --kv-cache-mib {} holds less than one sequence at the full \
             context ({} MiB); requests must set max_tokens low enough to fit",
            kv_cache_bytes >> 20,
            per_sequence.div_ceil(1 << 20)
        );
    }
    let draft = match a.draft.model(&a.model)? {
        Some(model) => {
            let d = trit::engine::Draft {
                model,
                options: a.draft.options(),
            };
            d.check(&loaded.model)?;
            Some(d)
        }
        None => None,
    };
    // Sampler flags are the defaults of requests that leave a field unset (llama-server's).
    let defaults = a.samplers.params(&loaded, 0, Vec::new())?;
    let config = ServerConfig {
        model_id: model_id.clone(),
        n_ctx: loaded.n_ctx,
        defaults,
        eos: eos_ids(&loaded),
        bos: loaded
            .files
            .config
            .bos
            .filter(|_| loaded.files.config.add_bos),
        api_key: a.api_key.clone(),
        body_limit: a.body_limit_mib.max(1) << 20,
        parallel: a.parallel,
        max_queue: a.max_queue,
        kv_cache_bytes,
        context_shift: a.context_shift.then(|| trit::engine::ContextShift {
            keep: usize::try_from(a.keep).unwrap_or(usize::MAX),
        }),
        draft,
        pooling: a.pooling,
    };
    let state = AppState::new(
        config,
        loaded.model.clone(),
        loaded.tokenizer,
        loaded.template,
    )
    .context("starting the scheduler")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let kv = if on_gpu {
            "keys/values in GPU slots, no prefix reuse".to_string()
        } else {
            let t = loaded.model.kv_types();
            format!(
                "KV cache {} MiB (K {}, V {}) in blocks of {} tokens",
                kv_cache_bytes >> 20,
                t.k,
                t.v,
                trit::model::kv_cache::BLOCK_TOKENS
            )
        };
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let at = listener.local_addr()?;
        eprintln!(
            "trit serve: {model_id} on http://{at} (ctx {} per sequence, {} in parallel, {kv})",
            loaded.n_ctx, a.parallel,
        );
        eprintln!("trit serve: chat in a browser at http://{at}/");
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("trit serve: shutting down after the replies in flight");
        };
        trit_server::serve(listener, state, shutdown).await?;
        Ok(())
    })
}
