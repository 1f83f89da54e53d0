//! `trit bench --npl 1,8,32`: llama.cpp's `llama-batched-bench` table — what a server gets
//! from running several sequences together. For each B: B sequences each read a `-p`-token
//! prompt of random ids (one batched call for all of them), then generate `-n` tokens
//! together, each step one batched call of B rows (greedy). Columns as llama-batched-bench's:
//! PP, TG, B, N_KV (B · (PP + TG) positions), then time and tokens/s of the prompts, of the
//! generation and of both. The generation steps ask for each row's best candidates, as the
//! server's sampler does: a GPU then copies a few hundred bytes per row instead of the whole
//! vocabulary (llama-batched-bench copies every logit; the CPU returns full rows anyway).

use super::{argmax, parse_list, single, thread_counts, BenchArgs, Output, TokenRng};
use anyhow::{bail, Result};
use std::time::Instant;
use trit::model::{BatchSeq, KvCache, Logits, Model};
use trit::sample::{RowLogits, TOP_CANDIDATES};

/// One row of the table.
pub struct BatchedRow {
    pub pp: usize,
    pub tg: usize,
    pub b: usize,
    pub t_pp: f64,
    pub t_tg: f64,
}

impl BatchedRow {
    pub fn n_kv(&self) -> usize {
        self.b * (self.pp + self.tg)
    }
}

/// One batched call's sequences: each cache with its tokens, the last row's logits wanted.
fn last_rows<'a>(caches: &'a mut [KvCache], feeds: &'a [Vec<u32>]) -> Vec<BatchSeq<'a>> {
    caches
        .iter_mut()
        .zip(feeds)
        .map(|(cache, tokens)| BatchSeq {
            tokens,
            cache,
            logits: Logits::Last,
        })
        .collect()
}

/// B sequences: their prompts in one call, then `tg` steps of B rows.
fn measure(
    model: &Model,
    rng: &mut TokenRng,
    pp: usize,
    tg: usize,
    b: usize,
) -> Result<BatchedRow> {
    let vocab = model.config().vocab;
    let mut caches: Vec<KvCache> = (0..b).map(|_| model.new_cache(pp + tg)).collect();
    let prompts: Vec<Vec<u32>> = (0..b).map(|_| rng.tokens(pp, vocab)).collect();
    let t0 = Instant::now();
    let rows = model.forward_batch(&mut last_rows(&mut caches, &prompts))?;
    let mut next: Vec<u32> = rows.iter().map(|l| argmax(l)).collect();
    let t_pp = t0.elapsed().as_secs_f64();
    let want_top = vec![true; b];
    let t1 = Instant::now();
    for _ in 0..tg {
        let feeds: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
        next = model
            .forward_batch_top(
                &mut last_rows(&mut caches, &feeds),
                TOP_CANDIDATES,
                &want_top,
            )?
            .iter()
            .map(|row| match row {
                RowLogits::Full(l) => argmax(l),
                RowLogits::Top(t) => t.argmax(),
            })
            .collect();
    }
    let t_tg = t1.elapsed().as_secs_f64();
    Ok(BatchedRow {
        pp,
        tg,
        b,
        t_pp,
        t_tg,
    })
}

pub fn run(a: &BenchArgs, path: &std::path::Path, npl: &str) -> Result<()> {
    if !a.pg.is_empty() || a.n_depth != "0" || a.generation_tokens.is_some() {
        bail!("--npl measures -p and -n only (not --pg, -d or -g)");
    }
    if !matches!(a.output, None | Some(Output::Md)) {
        bail!("--npl prints a markdown table only (-o md)");
    }
    let npl = parse_list("--npl", npl)?;
    if npl.contains(&0) {
        bail!("--npl: every sequence count must be at least 1");
    }
    let pp = single("-p", a.n_prompt.as_deref().unwrap_or("128"))?;
    let tg = single("-n", a.n_gen.as_deref().unwrap_or("128"))?;
    if pp == 0 {
        bail!("--npl needs a prompt of at least 1 token (-p)");
    }
    let threads = thread_counts(a)?;
    let [n_threads] = threads[..] else {
        bail!("--npl takes one thread count");
    };
    let lb = super::load(path, n_threads, a, pp + tg)?;
    if pp + tg > lb.max_ctx {
        bail!(
            "-p {pp} + -n {tg} exceeds the model's context of {} tokens",
            lb.max_ctx
        );
    }
    let most = lb.bench.model.max_sequences();
    if let Some(&b) = npl.iter().find(|&&b| b > most) {
        bail!("--npl {b}: this model runs at most {most} sequences together");
    }
    let model = &lb.bench.model;
    let mut rng = TokenRng(a.seed);
    if !a.no_warmup {
        measure(model, &mut rng, pp, tg.min(4), npl[0])?;
    }
    println!(
        "model: {} ({}), {} threads, {}",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        ),
        lb.info_model_type,
        n_threads,
        match a.device {
            crate::cmd::Device::Cpu => "CPU",
            crate::cmd::Device::Cuda => "CUDA",
        }
    );
    println!();
    print_header();
    for &b in &npl {
        print_row(&measure(model, &mut rng, pp, tg, b)?);
    }
    Ok(())
}

fn print_header() {
    println!(
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
    );
    println!(
        "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
    );
}

fn print_row(r: &BatchedRow) {
    let rate = |n: usize, t: f64| if t > 0.0 { n as f64 / t } else { 0.0 };
    let t = r.t_pp + r.t_tg;
    println!(
        "| {:5} | {:6} | {:4} | {:6} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {:8.3} | {:8.2} |",
        r.pp,
        r.tg,
        r.b,
        r.n_kv(),
        r.t_pp,
        rate(r.b * r.pp, r.t_pp),
        r.t_tg,
        rate(r.b * r.tg, r.t_tg),
        t,
        rate(r.n_kv(), t)
    );
}
