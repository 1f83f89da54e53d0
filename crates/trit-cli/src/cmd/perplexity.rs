//! `trit perplexity --file TEXT`: llama-perplexity's convention and output lines.

use super::{load, ModelArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use trit::engine::perplexity::perplexity;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Model path (positional form of --model: `trit perplexity MODEL -f FILE`).
    pub path: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short, long)]
    pub file: PathBuf,
    /// Score from this position of each window on (default: ctx / 2, as llama-perplexity).
    #[arg(long)]
    pub stride: Option<usize>,
    /// Stop after this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
}

pub fn run(mut a: PerplexityArgs) -> Result<()> {
    super::take_positional_model(a.path.take(), &mut a.model)?;
    let n_ctx = a.model.ctx.unwrap_or(512);
    a.model.ctx = Some(n_ctx);
    let loaded = load(&a.model)?;
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let cfg = &loaded.files.config;
    let bos = if cfg.add_bos { cfg.bos } else { None };
    let mut tokens = Vec::new();
    tokens.extend(bos);
    tokens.extend(loaded.tokenizer.encode(&text, false)?);
    let first = a.stride.unwrap_or(n_ctx / 2);
    eprintln!(
        "perplexity: {} tokens, {} windows of {n_ctx}, scoring from position {first}",
        tokens.len(),
        a.chunks
            .map_or(tokens.len() / n_ctx, |c| c.min(tokens.len() / n_ctx))
    );
    let t0 = std::time::Instant::now();
    let r = perplexity(
        &loaded.model,
        &tokens,
        n_ctx,
        first,
        bos,
        a.chunks,
        &mut |done, total| {
            let secs = t0.elapsed().as_secs_f64();
            let eta = secs / done as f64 * (total - done) as f64;
            eprint!(
                "\r[{done}/{total}] {:.1}s elapsed, ETA {:.1}s   ",
                secs, eta
            );
            let _ = std::io::stderr().flush();
        },
    )?;
    eprintln!();
    let chunks: Vec<String> = r
        .per_chunk
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
        .collect();
    println!("{}", chunks.join(","));
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.err);
    Ok(())
}
