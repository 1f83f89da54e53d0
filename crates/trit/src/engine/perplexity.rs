//! Perplexity in llama.cpp's `llama-perplexity` convention: the token stream is cut into
//! windows of `n_ctx` tokens, each evaluated from an empty cache (with BOS replacing the
//! first token when the model adds one), and only positions from `first` on are scored
//! (llama.cpp: `first = n_ctx / 2`), so every scored token sees at least `first` of context.

use super::session::Session;
use crate::model::Model;
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

pub fn perplexity(
    model: &Arc<Model>,
    tokens: &[u32],
    n_ctx: usize,
    first: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Perplexity> {
    if n_ctx < 2 || first >= n_ctx - 1 {
        return Err(Error::InvalidArgument(format!(
            "perplexity needs a context of at least 2 tokens and first ({first}) < ctx - 1 ({n_ctx})"
        )));
    }
    let mut chunks = tokens.len() / n_ctx;
    if let Some(m) = max_chunks {
        chunks = chunks.min(m);
    }
    if chunks == 0 {
        return Err(Error::InvalidArgument(format!(
            "the text has {} tokens, fewer than one window of {n_ctx}",
            tokens.len()
        )));
    }
    let vocab = model.config().vocab;
    let mut session = Session::new(model.clone(), n_ctx);
    let (mut sum, mut sum_sq, mut count) = (0f64, 0f64, 0usize);
    let mut per_chunk = Vec::new();
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
                let nll = -log_softmax_at(row, window[pos + 1] as usize);
                sum += nll;
                sum_sq += nll * nll;
                count += 1;
            }
        }
        per_chunk.push((sum / count as f64).exp());
        progress(c + 1, chunks);
    }
    let mean = sum / count as f64;
    let var = (sum_sq / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    let err = if count > 1 {
        ppl * (var / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        err,
        scored: count,
        per_chunk,
    })
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
