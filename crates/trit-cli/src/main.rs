//! `trit`: run ternary language models locally.

mod cmd;
mod doctor;
mod hub;

use clap::{Parser, Subcommand};

/// What `trit --help` says the binary runs on: a build with the `cuda` feature also drives
/// NVIDIA GPUs (`--device cuda`).
#[cfg(feature = "cuda")]
const ABOUT: &str = "Run ternary (1.58-bit) language models on your CPU or NVIDIA GPU";
#[cfg(not(feature = "cuda"))]
const ABOUT: &str = "Run ternary (1.58-bit) language models on your CPU";

#[derive(Parser)]
#[command(name = "trit", version, about = ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a reply to one prompt.
    Run(cmd::run::RunArgs),
    /// Multi-turn chat that keeps the KV cache between turns.
    Chat(cmd::chat::ChatArgs),
    /// Describe a model file: architecture, tensor types, sizes, memory needs.
    Info(cmd::info::InfoArgs),
    /// Perplexity of a text file (llama-perplexity convention).
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Sentence embeddings: pooled, normalized final hidden states (llama-embedding).
    Embed(cmd::embed::EmbedArgs),
    /// Throughput benchmark (llama-bench's pp/tg tests and table; --format mlx for mlx_lm's).
    Bench(cmd::bench::BenchArgs),
    /// OpenAI-compatible HTTP server with continuous batching and prefix reuse.
    Serve(cmd::serve::ServeArgs),
    /// Download a model from the Hugging Face Hub into the shared HF cache.
    Pull(cmd::pull::PullArgs),
    /// Check a model download for missing/truncated/corrupt files, or report this machine.
    Doctor(cmd::doctor::DoctorArgs),
    /// Repack between ternary formats losslessly, or ternarize a full-precision model.
    Convert(cmd::convert::ConvertArgs),
}

/// Output into a closed pipe (`trit embed … | head`) ends the process quietly, as it does a C
/// tool's: Rust ignores SIGPIPE, so the next print would panic on EPIPE instead. The server
/// keeps it ignored (a client that hangs up must not end it).
#[cfg(unix)]
fn quiet_on_closed_pipe() {
    // SAFETY: restoring a signal's default disposition at startup, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    let cli = Cli::parse_from(cmd::llama_short_flags(std::env::args_os()));
    #[cfg(unix)]
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Convert(a) => cmd::convert::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
