//! llama.cpp's other truncation samplers, each cutting the candidates a draw may pick:
//! top-n-σ (tokens more than n standard deviations of the row's logits below its maximum are
//! dropped, before top-k), locally typical sampling (the tokens whose surprise −ln p is
//! closest to the distribution's entropy, up to a probability mass, after top-k) and XTC
//! ("exclude top choices": with some probability, every token at or above a probability
//! threshold but the least likely of them is dropped, after min-p). Arithmetic in f32 as
//! llama.cpp's; checked against its samplers (`tools/ref_truncation.py`,
//! `tests/fixtures/sampling/truncation.json`).

use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct Truncation {
    /// ≤ 0 disables (llama.cpp's `top_n_sigma`, default −1).
    pub top_n_sigma: f32,
    /// ≥ 1 disables (`typical_p`).
    pub typical_p: f32,
    /// 0 disables (`xtc_probability`): the chance that XTC acts on a step.
    pub xtc_probability: f32,
    /// `xtc_threshold`; above 0.5 XTC never acts.
    pub xtc_threshold: f32,
}

impl Default for Truncation {
    fn default() -> Self {
        Truncation {
            top_n_sigma: -1.0,
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
        }
    }
}

impl Truncation {
    pub fn is_neutral(&self) -> bool {
        self.top_n_sigma <= 0.0 && self.typical_p >= 1.0 && !self.xtc_active()
    }

    pub fn xtc_active(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::InvalidArgument(what.to_string()));
        if self.top_n_sigma.is_nan() || self.top_n_sigma.is_infinite() {
            return bad("top_n_sigma must be a finite number");
        }
        if !(self.typical_p > 0.0 && self.typical_p.is_finite()) {
            return bad("typical_p must be a number > 0 (1 disables it)");
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return bad("xtc_probability must be in [0, 1]");
        }
        if !(self.xtc_threshold >= 0.0 && self.xtc_threshold.is_finite()) {
            return bad("xtc_threshold must be a finite number ≥ 0");
        }
        Ok(())
    }
}

/// Top-n-σ on a whole row: logits below `max − n·σ` (σ the population standard deviation of
/// the finite logits) become −∞.
pub fn top_n_sigma(logits: &mut [f32], n: f32) {
    let finite = logits.iter().filter(|l| l.is_finite());
    let count = finite.clone().count();
    if n <= 0.0 || count <= 1 {
        return;
    }
    let max = finite.clone().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let mean = finite.clone().sum::<f32>() / count as f32;
    let var = finite.map(|&l| (l - mean) * (l - mean)).sum::<f32>() / count as f32;
    let floor = max - n * var.sqrt();
    for l in logits.iter_mut() {
        if *l < floor {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Probabilities of `cand` (any order), in f32.
fn softmax(cand: &[(u32, f32)]) -> Vec<f32> {
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    let e: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// Locally typical sampling: keeps the tokens in order of |−ln p − H| until their mass
/// exceeds `p`. `cand` comes and leaves sorted best first.
pub fn typical(cand: &mut Vec<(u32, f32)>, p: f32) {
    if p >= 1.0 || cand.is_empty() {
        return;
    }
    let probs = softmax(cand);
    let entropy: f32 = probs.iter().map(|&q| -q * q.ln()).sum();
    let mut order: Vec<usize> = (0..cand.len()).collect();
    let score = |i: usize| (-probs[i].ln() - entropy).abs();
    order.sort_by(|&a, &b| score(a).total_cmp(&score(b)));
    let mut mass = 0.0f32;
    let mut keep = order.len();
    for (i, &j) in order.iter().enumerate() {
        mass += probs[j];
        if mass > p {
            keep = i + 1;
            break;
        }
    }
    let mut kept: Vec<(u32, f32)> = order[..keep].iter().map(|&j| cand[j]).collect();
    kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    *cand = kept;
}

/// XTC's cut (the caller has drawn that it acts): of the leading tokens whose probability is at
/// least `threshold`, all but the last go, when there are two or more. `cand` sorted best first.
pub fn xtc(cand: &mut Vec<(u32, f32)>, threshold: f32) {
    if cand.len() < 2 {
        return;
    }
    let probs = softmax(cand);
    let above = probs.iter().take_while(|&&q| q >= threshold).count();
    if above >= 2 {
        cand.drain(..above - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(logits: &[f32]) -> Vec<(u32, f32)> {
        let mut c: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1));
        c
    }

    #[test]
    fn xtc_keeps_the_least_likely_of_the_top_choices() {
        // Probabilities ≈ 0.53, 0.20, 0.20, 0.07: three at or above 0.1.
        let mut c = ranked(&[2.0, 1.0, 1.0, 0.0]);
        xtc(&mut c, 0.1);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), [2, 3]);
        // One above the threshold: nothing to exclude.
        let mut c = ranked(&[5.0, 1.0, 1.0]);
        xtc(&mut c, 0.1);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn typical_keeps_tokens_near_the_entropy() {
        // One likely token among 40 unlikely ones (p 0.33 and 0.017 each, entropy 3.1 nats):
        // the unlikely ones' surprise (4.1) is nearer the entropy than the likely one's (1.1),
        // so they fill the mass first and the likely one is left out.
        let mut row = vec![0.0; 41];
        row[0] = 3.0;
        let mut c = ranked(&row);
        typical(&mut c, 0.5);
        assert_eq!(c.len(), 31, "{c:?}");
        assert!(!c.iter().any(|c| c.0 == 0), "{c:?}");
        let mut all = ranked(&[1.0, 0.5]);
        typical(&mut all, 1.0);
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn top_n_sigma_cuts_below_the_spread() {
        let mut l = vec![0.0, 0.0, 0.0, 10.0, 9.5];
        top_n_sigma(&mut l, 1.0);
        assert_eq!(l.iter().filter(|x| x.is_finite()).count(), 2, "{l:?}");
    }
}
