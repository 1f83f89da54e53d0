//! Perplexity in llama.cpp's `llama-perplexity` convention: the token stream is cut into
//! windows of `n_ctx` tokens, each evaluated from an empty cache (with BOS replacing the
//! first token when the model adds one), and only positions from `first` on are scored
//! (llama.cpp: `first = n_ctx / 2`), so every scored token sees at least `first` of context.

use super::sequence::{token_logprob, TokenLogprob};
use super::session::Session;
use crate::model::{Logits, Model};
use crate::{Error, Result};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct Perplexity {
    pub ppl: f64,
    /// llama.cpp's ± (standard error of the mean NLL, propagated to the perplexity).
    pub err: f64,
    pub scored: usize,
    /// Cumulative perplexity after each window, as llama-perplexity prints them.
    pub per_chunk: Vec<f64>,
}

/// Logits are computed in slices of this many tokens to bound memory with large vocabularies.
const SLICE: usize = 128;

/// What [`score_windows`] reports, in order.
pub enum WindowEvent<'a> {
    /// A scored position: its logits and the token the text has next.
    Row { logits: &'a [f32], next: u32 },
    /// Window `done` of `total` is finished.
    WindowDone { done: usize, total: usize },
}

/// Windows of `tokens` that `perplexity` evaluates: `n_ctx` each, at most `max_chunks`.
pub fn window_count(tokens: usize, n_ctx: usize, max_chunks: Option<usize>) -> usize {
    let chunks = tokens / n_ctx.max(1);
    max_chunks.map_or(chunks, |m| chunks.min(m))
}

/// Evaluates the windows and reports each scored position's logits (window by window,
/// position by position) to `on_event`, which may stop the run with an error.
pub fn score_windows(
    model: &Arc<Model>,
    tokens: &[u32],
    n_ctx: usize,
    first: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
    on_event: &mut dyn FnMut(WindowEvent) -> Result<()>,
) -> Result<()> {
    if n_ctx < 2 || first >= n_ctx - 1 {
        return Err(Error::InvalidArgument(format!(
            "perplexity needs a context of at least 2 tokens and first ({first}) < ctx - 1 ({n_ctx})"
        )));
    }
    let chunks = window_count(tokens.len(), n_ctx, max_chunks);
    if chunks == 0 {
        return Err(Error::InvalidArgument(format!(
            "the text has {} tokens, fewer than one window of {n_ctx}",
            tokens.len()
        )));
    }
    let vocab = model.config().vocab;
    let mut session = Session::new(model.clone(), n_ctx);
    for c in 0..chunks {
        let mut window = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        session.reset();
        for (s, slice) in window.chunks(SLICE).enumerate() {
            let logits = session.eval_all(slice)?;
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                let pos = s * SLICE + i;
                if pos < first || pos + 1 >= n_ctx {
                    continue;
                }
                on_event(WindowEvent::Row {
                    logits: row,
                    next: window[pos + 1],
                })?;
            }
        }
        on_event(WindowEvent::WindowDone {
            done: c + 1,
            total: chunks,
        })?;
    }
    Ok(())
}

pub fn perplexity(
    model: &Arc<Model>,
    tokens: &[u32],
    n_ctx: usize,
    first: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Perplexity> {
    let mut nll = NllSums::default();
    let mut per_chunk = Vec::new();
    score_windows(model, tokens, n_ctx, first, bos, max_chunks, &mut |e| {
        match e {
            WindowEvent::Row { logits, next } => nll.add(logits, next),
            WindowEvent::WindowDone { done, total } => {
                per_chunk.push(nll.ppl());
                progress(done, total);
            }
        }
        Ok(())
    })?;
    Ok(nll.finish(per_chunk))
}

/// Negative log-likelihoods of the scored tokens, summed.
#[derive(Default)]
pub struct NllSums {
    sum: f64,
    sum_sq: f64,
    count: usize,
}

impl NllSums {
    pub fn add(&mut self, logits: &[f32], next: u32) {
        let nll = -log_softmax_at(logits, next as usize);
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }

    /// The perplexity so far.
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    pub fn finish(self, per_chunk: Vec<f64>) -> Perplexity {
        let count = self.count;
        let mean = self.sum / count as f64;
        let var = (self.sum_sq / count as f64 - mean * mean).max(0.0);
        let ppl = mean.exp();
        let err = if count > 1 {
            ppl * (var / (count - 1) as f64).sqrt()
        } else {
            0.0
        };
        Perplexity {
            ppl,
            err,
            scored: count,
            per_chunk,
        }
    }
}

/// The log-probability of each of `tokens` after the first, given those before it, with the
/// `top` most likely tokens at its position — what a completion with `echo` reports for its
/// prompt (and lm-evaluation-harness sums into log-likelihoods). Computed on a cache of its
/// own, `SLICE` rows of logits at a time.
pub fn prompt_logprobs(model: &Model, tokens: &[u32], top: usize) -> Result<Vec<TokenLogprob>> {
    if model.runs_on_device() {
        return Err(Error::Unsupported(
            "log-probabilities of a prompt are computed on the CPU; this model runs on a \
             device"
                .into(),
        ));
    }
    let vocab = model.config().vocab;
    let mut cache = model.new_cache(tokens.len());
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(1));
    for (s, slice) in tokens.chunks(SLICE).enumerate() {
        let logits = model.forward(slice, &mut cache, Logits::All)?;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            if let Some(&next) = tokens.get(s * SLICE + i + 1) {
                out.push(token_logprob(row, next, top));
            }
        }
    }
    Ok(out)
}

fn log_softmax_at(row: &[f32], target: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row[target] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_matches_definition() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        assert!((log_softmax_at(&row, 2) - (3.0 - z.ln())).abs() < 1e-12);
    }
}
