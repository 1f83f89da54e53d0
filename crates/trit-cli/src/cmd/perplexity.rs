//! `trit perplexity --file TEXT`: llama-perplexity's convention and output lines; with
//! `--kl-divergence-base FILE` it also writes the base model's log-probabilities in
//! llama-perplexity's file format, and with `--kl-divergence` it compares a model with such a
//! file (written by trit or by llama.cpp) instead of reading a text.

use super::{load, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use trit::engine::kl_divergence::{Estimate, KlDivergence};
use trit::engine::logits_file::{scored_per_chunk, LogitsHeader, LogitsReader, LogitsWriter};
use trit::engine::perplexity::{score_windows, window_count, NllSums, Perplexity, WindowEvent};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Model path (positional form of --model: `trit perplexity MODEL -f FILE`).
    pub path: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (not with --kl-divergence, which reads the tokens from its file).
    #[arg(short, long)]
    pub file: Option<PathBuf>,
    /// Score from this position of each window on (default: ctx / 2, as llama-perplexity).
    #[arg(long)]
    pub stride: Option<usize>,
    /// Stop after this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// llama-perplexity's log-probability file: written (the base model's, with --file), or
    /// read with --kl-divergence.
    #[arg(long, alias = "save-all-logits", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare the model with the base whose log-probabilities --kl-divergence-base holds.
    #[arg(long, requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

pub fn run(mut a: PerplexityArgs) -> Result<()> {
    super::take_positional_model(a.path.take(), &mut a.model)?;
    if a.kl_divergence {
        return kl_divergence(a);
    }
    let Some(file) = &a.file else {
        bail!("give the text to score with --file (or --kl-divergence with its base file)");
    };
    let n_ctx = a.model.ctx.unwrap_or(512);
    a.model.ctx = Some(n_ctx);
    let first = a.stride.unwrap_or(n_ctx / 2);
    if a.kl_divergence_base.is_some() && first != n_ctx / 2 {
        bail!("--kl-divergence-base scores from ctx / 2 (llama-perplexity's file has no stride)");
    }
    let loaded = load(&a.model)?;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let cfg = &loaded.files.config;
    let bos = if cfg.add_bos { cfg.bos } else { None };
    let mut tokens = Vec::new();
    tokens.extend(bos);
    tokens.extend(loaded.tokenizer.encode(&text, false)?);
    let windows = window_count(tokens.len(), n_ctx, a.chunks);
    eprintln!(
        "perplexity: {} tokens, {windows} windows of {n_ctx}, scoring from position {first}",
        tokens.len(),
    );
    if windows == 0 {
        bail!(
            "the text has {} tokens, fewer than one window of {n_ctx}",
            tokens.len()
        );
    }
    // With --kl-divergence-base, every scored row also goes to the base file.
    let mut out = match &a.kl_divergence_base {
        Some(path) => Some(LogitsWriter::create(
            path,
            &LogitsHeader {
                n_ctx,
                n_vocab: loaded.model.config().vocab,
                n_chunk: windows,
                tokens: tokens[..windows * n_ctx].to_vec(),
            },
        )?),
        None => None,
    };
    let mut progress = progress_line();
    let (mut nll, mut per_chunk) = (NllSums::default(), Vec::new());
    score_windows(
        &loaded.model,
        &tokens,
        n_ctx,
        first,
        bos,
        a.chunks,
        &mut |e| {
            match e {
                WindowEvent::Row { logits, next } => {
                    nll.add(logits, next);
                    if let Some(out) = out.as_mut() {
                        out.write_row(logits)?;
                    }
                }
                WindowEvent::WindowDone { done, total } => {
                    per_chunk.push(nll.ppl());
                    progress(done, total);
                }
            }
            Ok(())
        },
    )?;
    eprintln!();
    if let (Some(out), Some(path)) = (out, &a.kl_divergence_base) {
        out.finish()?;
        eprintln!(
            "log-probabilities of {windows} windows written to {}",
            path.display()
        );
    }
    let r = nll.finish(per_chunk);
    eprintln!();
    print_perplexity(&r);
    Ok(())
}

fn print_perplexity(r: &Perplexity) {
    let chunks: Vec<String> = r
        .per_chunk
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
        .collect();
    println!("{}", chunks.join(","));
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.err);
}

fn progress_line() -> impl FnMut(usize, usize) {
    let t0 = std::time::Instant::now();
    move |done, total| {
        let secs = t0.elapsed().as_secs_f64();
        let eta = secs / done as f64 * (total - done) as f64;
        eprint!("\r[{done}/{total}] {secs:.1}s elapsed, ETA {eta:.1}s   ");
        let _ = std::io::stderr().flush();
    }
}

/// `--kl-divergence`: the windows of the base file's tokens through this model, each scored
/// position compared with the base's record; llama-perplexity's table and statistics.
fn kl_divergence(mut a: PerplexityArgs) -> Result<()> {
    let path = a.kl_divergence_base.clone().expect("clap requires it");
    if a.file.is_some() {
        bail!(
            "--kl-divergence reads its tokens from {}; drop --file",
            path.display()
        );
    }
    if a.stride.is_some() {
        bail!("--kl-divergence scores from ctx / 2, as its base file does; drop --stride");
    }
    let mut base = LogitsReader::open(&path)?;
    let n_ctx = base.header.n_ctx;
    match a.model.ctx {
        Some(c) if c != n_ctx => {
            bail!(
                "{} was computed with a context of {n_ctx}; run with -c {n_ctx}",
                path.display()
            )
        }
        _ => a.model.ctx = Some(n_ctx),
    }
    let loaded = load(&a.model)?;
    let vocab = loaded.model.config().vocab;
    if base.header.n_vocab != vocab {
        bail!(
            "{} holds a vocabulary of {} tokens; this model has {vocab}: they cannot be compared",
            path.display(),
            base.header.n_vocab
        );
    }
    let cfg = &loaded.files.config;
    let bos = if cfg.add_bos { cfg.bos } else { None };
    let tokens = base.header.tokens.clone();
    let windows = window_count(tokens.len(), n_ctx, a.chunks);
    eprintln!(
        "kl-divergence: {windows} windows of {n_ctx} from {} ({} positions each)",
        path.display(),
        scored_per_chunk(n_ctx)
    );
    println!(
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    );
    let mut k = KlDivergence::default();
    score_windows(
        &loaded.model,
        &tokens,
        n_ctx,
        n_ctx / 2,
        bos,
        a.chunks,
        &mut |e| {
            match e {
                WindowEvent::Row { logits, next } => {
                    k.add(logits, &base.next_row()?, next as usize)
                }
                WindowEvent::WindowDone { done, .. } => {
                    let pm = |e: Estimate, w: usize, p: usize| {
                        format!("{:w$.p$} ± {:w$.p$}", e.value, e.err)
                    };
                    let pct =
                        |e: Estimate| format!("{:6.3} ± {:6.3} %", 100.0 * e.value, 100.0 * e.err);
                    println!(
                        "{done:4}    {}    {}    {}    {}    {}",
                        pm(k.ppl(), 9, 4),
                        pm(k.ln_ppl_ratio(), 10, 5),
                        pm(k.kld(), 10, 5),
                        pct(k.p_diff_rms()),
                        pct(k.same_top())
                    );
                }
            }
            Ok(())
        },
    )?;
    println!();
    print_statistics(&k);
    Ok(())
}

/// The quantile rows llama-perplexity prints, largest first.
const QUANTILES: [(&str, f64); 13] = [
    ("Maximum", 1.0),
    ("99.9%  ", 0.999),
    ("99.0%  ", 0.99),
    ("95.0%  ", 0.95),
    ("90.0%  ", 0.9),
    ("75.0%  ", 0.75),
    ("Median ", 0.5),
    ("25.0%  ", 0.25),
    ("10.0%  ", 0.1),
    (" 5.0%  ", 0.05),
    (" 1.0%  ", 0.01),
    (" 0.1%  ", 0.001),
    ("Minimum", 0.0),
];

fn print_statistics(k: &KlDivergence) {
    let pm = |e: Estimate| format!("{:10.6} ± {:10.6}", e.value, e.err);
    println!("====== Perplexity statistics ======");
    println!("Mean PPL(Q)                   : {}", pm(k.ppl()));
    println!("Mean PPL(base)                : {}", pm(k.ppl_base()));
    println!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * k.ln_ppl_correlation()
    );
    println!("Mean ln(PPL(Q)/PPL(base))     : {}", pm(k.ln_ppl_ratio()));
    println!("Mean PPL(Q)/PPL(base)         : {}", pm(k.ppl_ratio()));
    println!("Mean PPL(Q)-PPL(base)         : {}", pm(k.ppl_diff()));
    println!();
    println!("====== KL divergence statistics ======");
    println!("Mean    KLD: {}", pm(k.kld()));
    // llama-perplexity's rows; the KL divergence leaves out the quartiles.
    let quartile = |f: f64| f == 0.75 || f == 0.25;
    let kld_rows: Vec<(&str, f64)> = QUANTILES.into_iter().filter(|r| !quartile(r.1)).collect();
    let fractions: Vec<f64> = kld_rows.iter().map(|r| r.1).collect();
    for ((label, _), v) in kld_rows.iter().zip(k.kld_quantiles(&fractions)) {
        println!("{label} KLD: {v:10.6}");
    }
    println!();
    println!("====== Token probability statistics ======");
    let p = k.p_diff();
    println!(
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * p.value,
        100.0 * p.err
    );
    let fractions = QUANTILES.map(|r| r.1);
    for ((label, _), v) in QUANTILES.iter().zip(k.p_diff_quantiles(&fractions)) {
        println!("{label} Δp: {:6.3}%", 100.0 * v);
    }
    let rms = k.p_diff_rms();
    println!(
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * rms.value,
        100.0 * rms.err
    );
    let top = k.same_top();
    println!(
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * top.value,
        100.0 * top.err
    );
}
