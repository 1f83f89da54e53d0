//! Mirostat (llama.cpp's `--mirostat 1|2`): instead of the truncation chain, each step keeps
//! the tokens whose surprise fits a running target `mu` (starting at 2τ), draws among them, and
//! moves `mu` by `eta · (τ − surprise of the drawn token)`, so the text's surprise stays near τ
//! bits per token. Version 2 keeps the tokens with `−log2 p ≤ mu`; version 1 estimates the
//! distribution's Zipf exponent from its 100 best tokens and keeps the top `k` that target
//! implies. As in llama.cpp only the logit bias and the temperature come before it (no
//! penalties, no top-k/top-p). f32 as llama.cpp's; checked against its samplers
//! (`tools/ref_truncation.py`).

/// llama.cpp's `m` for version 1: the tokens the Zipf exponent is estimated from.
const ZIPF_TOKENS: usize = 100;

#[derive(Clone, Debug, PartialEq)]
pub struct Mirostat {
    /// 1 or 2.
    pub version: u8,
    /// The target surprise, bits per token (llama.cpp's default 5).
    pub tau: f32,
    /// The learning rate of `mu` (default 0.1).
    pub eta: f32,
}

/// Probabilities of `cand` (sorted best first), in f32.
fn softmax(cand: &[(u32, f32)]) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

impl Mirostat {
    /// Cuts `cand` (all candidates, tempered, sorted best first) to those the target `mu`
    /// allows (at least one); `n_vocab` is the vocabulary's size (version 1's estimate).
    pub fn keep(&self, cand: &mut Vec<(u32, f32)>, mu: f32, n_vocab: usize) {
        if cand.is_empty() {
            return;
        }
        let probs = softmax(cand);
        let keep = if self.version == 1 {
            let (mut sum_tb, mut sum_tt) = (0.0f32, 0.0f32);
            for i in 0..(ZIPF_TOKENS - 1).min(cand.len() - 1) {
                let t = ((i + 2) as f32 / (i + 1) as f32).ln();
                let b = (probs[i] / probs[i + 1]).ln();
                sum_tb += t * b;
                sum_tt += t * t;
            }
            let s_hat = sum_tb / sum_tt;
            let eps = s_hat - 1.0;
            let k = ((eps * 2f32.powf(mu)) / (1.0 - (n_vocab as f32).powf(-eps))).powf(1.0 / s_hat);
            // NaN or below 1 (a flat or one-token row): at least the best one.
            (k as usize).max(1)
        } else {
            probs
                .iter()
                .take_while(|&&p| -p.log2() <= mu)
                .count()
                .max(1)
        };
        cand.truncate(keep);
    }

    /// `mu` after drawing a token of probability `p` among the kept ones.
    pub fn update(&self, mu: f32, p: f32) -> f32 {
        mu - self.eta * (-p.log2() - self.tau)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_2_keeps_the_tokens_within_the_target_surprise() {
        let m = Mirostat {
            version: 2,
            tau: 5.0,
            eta: 0.1,
        };
        // Probabilities 1/2, 1/4, 1/8, 1/8: surprises 1, 2, 3, 3 bits.
        let l = [0.0f32, -(2f32.ln()), -(4f32.ln()), -(4f32.ln())];
        let row: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
        let mut c = row.clone();
        m.keep(&mut c, 2.5, 4);
        assert_eq!(c.len(), 2);
        let mut c = row.clone();
        m.keep(&mut c, 0.5, 4);
        assert_eq!(c.len(), 1, "never empty");
        // Surprise 1 bit below τ = 5: the target rises by eta · 4.
        assert!((m.update(10.0, 0.5) - 10.4).abs() < 1e-6);
    }
}
