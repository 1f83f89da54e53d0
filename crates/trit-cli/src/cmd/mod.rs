//! Shared pieces of the subcommands: finding and loading the model, sampling flags.

pub mod bench;
pub mod chat;
pub mod convert;
pub mod doctor;
pub mod embed;
pub mod info;
pub mod perplexity;
pub mod pull;
pub mod run;
mod sampling;
pub mod serve;

pub use sampling::{SamplerArgs, SamplingArgs};

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trit::chat::ChatTemplate;
use trit::format::ModelFiles;
use trit::model::{KvType, KvTypes, Model};
use trit::tokenizer::Tokenizer;

/// Where the model comes from: `--model`, then `TRIT_MODEL`, then the repository's default.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF file, MLX 2-bit folder, unpacked FP16/BF16 safetensors folder, or a hub repository
    /// `owner/name[:FILE]` already in the Hugging Face cache (see `trit pull`).
    #[arg(short, long, env = "TRIT_MODEL")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: physical cores).
    #[arg(short = 't', long, env = "TRIT_ARG_THREADS")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, capped at 4096).
    #[arg(
        short = 'c',
        long = "ctx",
        alias = "ctx-size",
        env = "TRIT_ARG_CTX_SIZE"
    )]
    pub ctx: Option<usize>,
    /// Where the model runs: cpu, or cuda (an NVIDIA GPU; needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = Device::Cpu, env = "TRIT_DEVICE")]
    pub device: Device,
    /// LoRA adapter folder (mlx-lm `adapters.safetensors` or PEFT `adapter_model.safetensors`),
    /// applied in full precision beside the ternary weights.
    #[arg(long, env = "TRIT_ADAPTER")]
    pub adapter: Option<PathBuf>,
    #[command(flatten)]
    pub cache_types: CacheTypeArgs,
}

/// How the CPU KV cache stores keys and values (llama.cpp's `--cache-type-k/-v`, `-ctk/-ctv`).
#[derive(Args, Clone, Copy, Debug)]
pub struct CacheTypeArgs {
    /// KV cache type of keys: f16 (default: half the memory and cache reads of f32), f32
    /// (exact) or q8_0 (8-bit, about a quarter of f32). Also `-ctk`. CPU only (a GPU model
    /// keeps its own).
    #[arg(
        long = "cache-type-k",
        value_name = "TYPE",
        default_value = "f16",
        value_parser = parse_kv_type,
        env = "TRIT_ARG_CACHE_TYPE_K"
    )]
    pub k: KvType,
    /// KV cache type of values: f16 (default), f32 or q8_0. Also `-ctv`.
    #[arg(
        long = "cache-type-v",
        value_name = "TYPE",
        default_value = "f16",
        value_parser = parse_kv_type,
        env = "TRIT_ARG_CACHE_TYPE_V"
    )]
    pub v: KvType,
}

impl CacheTypeArgs {
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.k,
            v: self.v,
        }
    }
}

fn parse_kv_type(s: &str) -> std::result::Result<KvType, String> {
    KvType::parse(s).map_err(|e| e.to_string())
}

/// Rewrites llama.cpp's multi-letter short flags `-ctk`/`-ctv` (clap reads `-ctk` as `-c tk`)
/// to their long forms, up to a `--` separator.
pub fn llama_short_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut rest = false;
    args.into_iter()
        .map(|a| {
            if rest {
                return a;
            }
            let Some(s) = a.to_str() else { return a };
            rest = s == "--";
            for (short, long) in [("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")] {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|v| v.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

/// Where a model runs. Never falls back from one to the other silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

/// Loads the model on `device`; a GPU model keeps keys/values for `n_ctx` positions on the GPU.
pub fn load_model(
    files: &ModelFiles,
    threads: usize,
    device: Device,
    n_ctx: usize,
    adapter: Option<&std::path::Path>,
) -> Result<Model> {
    match (device, adapter) {
        (Device::Cpu, _) => Ok(
            Model::load_with_adapter(files, threads, adapter).with_context(|| match adapter {
                Some(a) => format!("loading adapter {}", a.display()),
                None => "loading the model".into(),
            })?,
        ),
        (Device::Cuda, Some(_)) => bail!(
            "--adapter with --device cuda: LoRA side paths run on the CPU only; use --device cpu \
             or fuse the adapter with `trit convert --quantize --adapter`"
        ),
        (Device::Cuda, None) => cuda_model(files, n_ctx),
    }
}

#[cfg(feature = "cuda")]
fn cuda_model(files: &ModelFiles, n_ctx: usize) -> Result<Model> {
    let opts = trit_cuda::CudaOptions::new(n_ctx);
    Ok(trit_cuda::load_model(files, &opts)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_model(_files: &ModelFiles, _n_ctx: usize) -> Result<Model> {
    bail!(
        "--device cuda: this trit was built without CUDA support. Rebuild it with \
         `cargo build --release -p trit-cli --features cuda` (no CUDA toolkit needed to build; \
         running needs an NVIDIA GPU and its driver)"
    )
}

pub struct Loaded {
    pub files: ModelFiles,
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub n_ctx: usize,
}

/// The model shipped in the repository (`models/default/*.gguf`), looked up next to the
/// working directory, the executable, and the source tree this binary was built from.
pub fn default_model() -> Option<PathBuf> {
    let mut roots = vec![PathBuf::from(".")];
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    roots.push(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")));
    for root in roots {
        let dir = root.join("models/default");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut ggufs: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
                .collect();
            ggufs.sort();
            if let Some(p) = ggufs.into_iter().next() {
                return Some(p);
            }
        }
    }
    None
}

/// `run`'s and `embed`'s two arguments as (model, text): `MODEL TEXT`, `TEXT`, or with -f
/// (`from_file`) `MODEL`. A lone argument that names a model (a file, a folder or a cached hub
/// repository) is refused rather than read as the text.
pub fn model_then_text(
    (first, second): (&Option<String>, &Option<String>),
    from_file: bool,
    cmd: &str,
) -> Result<(Option<PathBuf>, Option<String>)> {
    match (first, second, from_file) {
        (Some(model), Some(text), false) => Ok((Some(model.into()), Some(text.clone()))),
        (Some(_), Some(_), true) => {
            bail!("the text comes from -f: give only the model as an argument")
        }
        (Some(model), None, true) => Ok((Some(model.into()), None)),
        (Some(one), None, false) => {
            if crate::hub::resolve::names_a_model(one) {
                bail!(
                    "'{one}' is a model, not a prompt: give the text after it \
                     (trit {cmd} {one} \"...\"), or -f FILE"
                );
            }
            Ok((None, Some(one.clone())))
        }
        _ => Ok((None, None)),
    }
}

/// A subcommand's positional model (`trit chat MODEL`) in place of `--model`: it wins over
/// `TRIT_MODEL`, and giving both it and a different `--model` is an error.
pub fn take_positional_model(path: Option<PathBuf>, args: &mut ModelArgs) -> Result<()> {
    let Some(p) = path else { return Ok(()) };
    let from_env = std::env::var_os("TRIT_MODEL").map(PathBuf::from);
    if let Some(m) = &args.model {
        if *m != p && Some(m) != from_env.as_ref() {
            bail!(
                "give the model once: {} as an argument and {} with --model",
                p.display(),
                m.display()
            );
        }
    }
    args.model = Some(p);
    Ok(())
}

pub fn resolve_model(arg: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return crate::hub::resolve::model_argument(p);
    }
    match default_model() {
        Some(p) => Ok(p),
        None => bail!(
            "no model given and no default model found.\n\
             Pass one with --model PATH (a .gguf file or an MLX/safetensors folder) or set TRIT_MODEL.\n\
             The repository ships one in models/default/ (run from a clone of trit)."
        ),
    }
}

pub fn load(args: &ModelArgs) -> Result<Loaded> {
    let path = resolve_model(&args.model)?;
    let files = trit::format::open(&path).with_context(|| format!("loading {}", path.display()))?;
    let tokenizer = trit::tokenizer::Tokenizer::from_source(&files.tokenizer)?;
    let template = match &files.chat_template {
        Some(src) => Some(ChatTemplate::new(
            src,
            &tokenizer.bos_token().unwrap_or_default(),
            &tokenizer.eos_token().unwrap_or_default(),
        )?),
        None => None,
    };
    let threads = args
        .threads
        .unwrap_or_else(trit::threadpool::default_threads);
    let n_ctx = args.ctx.unwrap_or(files.config.max_ctx.min(4096));
    if n_ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    let model = Arc::new(
        load_model(&files, threads, args.device, n_ctx, args.adapter.as_deref())?
            .with_kv_types(args.cache_types.types())?,
    );
    Ok(Loaded {
        files,
        model,
        tokenizer,
        template,
        n_ctx,
    })
}

/// Stop tokens: the config's EOS ids plus the tokenizer's end-of-turn tokens.
pub fn eos_ids(loaded: &Loaded) -> Vec<u32> {
    let mut ids = loaded.files.config.eos.clone();
    for t in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|eot_id|>",
        "<|end_of_text|>",
    ] {
        if let Some(id) = loaded.tokenizer.token_id(t) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

pub fn print_speed(g: &trit::engine::Generation) {
    println!(
        "Prompt: {} tokens, {:.3} tokens-per-sec",
        g.prompt_evaluated,
        g.prompt_tps()
    );
    println!(
        "Generation: {} tokens, {:.3} tokens-per-sec",
        g.tokens.len(),
        g.gen_tps()
    );
    if let Some(b) = trit::engine::stats::peak_rss_bytes() {
        println!("Peak memory: {:.3} GB", b as f64 / 1e9);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_short_cache_type_flags_become_long_ones() {
        let args = [
            "trit", "run", "-ctk", "f32", "-ctv=f16", "-c", "64", "--", "-ctk",
        ];
        let got = llama_short_flags(args.iter().map(|s| s.into()));
        let want = [
            "trit",
            "run",
            "--cache-type-k",
            "f32",
            "--cache-type-v=f16",
            "-c",
            "64",
            "--",
            "-ctk",
        ];
        assert_eq!(
            got,
            want.iter()
                .map(std::ffi::OsString::from)
                .collect::<Vec<_>>()
        );
    }
}
