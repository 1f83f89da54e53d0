//! How far a model's next-token distributions are from a base model's, position by position
//! over the same text (llama-perplexity's `--kl-divergence`): the base's log-probabilities come
//! from its log-probability file (`logits_file`), so the base may have been run by llama.cpp.
//! The statistics are llama.cpp's: both perplexities and their correlation, the KL divergence
//! KL(base ‖ model) and its percentiles, the change Δp of the probability of the token that came
//! next, and how often both put the same token first.

use super::logits_file::EncodedRow;

/// A mean and its standard error.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub err: f64,
}

/// Running sums over the positions compared so far.
#[derive(Clone, Debug, Default)]
pub struct KlDivergence {
    count: usize,
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    same_top: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// Where the base's log-probabilities are too small to count (the file keeps the 16 nats below
/// each row's maximum).
const FLOOR: f32 = -16.0;

impl KlDivergence {
    /// Adds one position: the model's `logits`, the base's record for it, and `next`, the token
    /// the text has there.
    pub fn add(&mut self, logits: &[f32], base: &EncodedRow, next: usize) {
        let (mut max, mut top) = (f32::NEG_INFINITY, 0);
        for (i, &x) in logits.iter().enumerate() {
            if x > max {
                (max, top) = (x, i);
            }
        }
        let lse = max as f64
            + logits
                .iter()
                .map(|&x| ((x - max) as f64).exp())
                .sum::<f64>()
                .ln();
        let nll = lse - logits[next] as f64;
        let nll_base = -base.log_prob(next) as f64;
        let (mut kld, mut base_max, mut base_top) = (0f64, f32::NEG_INFINITY, 0);
        for (i, &x) in logits.iter().enumerate() {
            let lp_base = base.log_prob(i);
            if lp_base > base_max {
                (base_max, base_top) = (lp_base, i);
            }
            if lp_base > FLOOR {
                kld += (lp_base as f64).exp() * (lp_base as f64 - (x as f64 - lse));
            }
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.count += 1;
        self.sum_nll += nll;
        self.sum_nll2 += nll * nll;
        self.sum_nll_base += nll_base;
        self.sum_nll_base2 += nll_base * nll_base;
        self.sum_nll_nll_base += nll * nll_base;
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.sum_p_diff += p_diff;
        self.sum_p_diff2 += p_diff * p_diff;
        self.sum_p_diff4 += p_diff.powi(4);
        self.same_top += (top == base_top) as usize;
        self.kld_values.push(kld as f32);
        self.p_diff_values.push(p_diff as f32);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    fn mean(&self, sum: f64, sum2: f64) -> Estimate {
        if self.count == 0 {
            return Estimate::default();
        }
        let n = self.count as f64;
        let value = sum / n;
        let var = sum2 / n - value * value;
        let err = if var > 0.0 && self.count > 10 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Estimate { value, err }
    }

    /// Covariance of the mean negative log-likelihoods of model and base.
    fn nll_covariance(&self) -> f64 {
        if self.count < 10 {
            return 0.0;
        }
        let n = self.count as f64;
        (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1.0)
    }

    /// The model's perplexity.
    pub fn ppl(&self) -> Estimate {
        exp_of(self.mean(self.sum_nll, self.sum_nll2))
    }

    /// The base's perplexity (from its file).
    pub fn ppl_base(&self) -> Estimate {
        exp_of(self.mean(self.sum_nll_base, self.sum_nll_base2))
    }

    /// ln(PPL(model) / PPL(base)), its error taking the correlation into account.
    pub fn ln_ppl_ratio(&self) -> Estimate {
        let (a, b) = (
            self.mean(self.sum_nll, self.sum_nll2),
            self.mean(self.sum_nll_base, self.sum_nll_base2),
        );
        let var = a.err * a.err + b.err * b.err - 2.0 * self.nll_covariance();
        Estimate {
            value: a.value - b.value,
            err: var.max(0.0).sqrt(),
        }
    }

    /// PPL(model) / PPL(base).
    pub fn ppl_ratio(&self) -> Estimate {
        exp_of(self.ln_ppl_ratio())
    }

    /// PPL(model) − PPL(base).
    pub fn ppl_diff(&self) -> Estimate {
        let (q, b) = (self.ppl(), self.ppl_base());
        let cov = q.value * b.value * self.nll_covariance();
        Estimate {
            value: q.value - b.value,
            err: (q.err * q.err + b.err * b.err - 2.0 * cov).max(0.0).sqrt(),
        }
    }

    /// Correlation of the two models' per-position log-likelihoods' means.
    pub fn ln_ppl_correlation(&self) -> f64 {
        let (a, b) = (
            self.mean(self.sum_nll, self.sum_nll2),
            self.mean(self.sum_nll_base, self.sum_nll_base2),
        );
        self.nll_covariance() / (a.err * b.err)
    }

    /// Mean KL(base ‖ model) per position, in nats.
    pub fn kld(&self) -> Estimate {
        self.mean(self.sum_kld, self.sum_kld2)
    }

    /// Mean change of the next token's probability (model − base).
    pub fn p_diff(&self) -> Estimate {
        self.mean(self.sum_p_diff, self.sum_p_diff2)
    }

    /// Root mean square of that change.
    pub fn p_diff_rms(&self) -> Estimate {
        let mse = self.mean(self.sum_p_diff2, self.sum_p_diff4);
        let value = mse.value.sqrt();
        let err = if value > 0.0 {
            0.5 / value * mse.err
        } else {
            0.0
        };
        Estimate { value, err }
    }

    /// How often the model's most likely token is the base's.
    pub fn same_top(&self) -> Estimate {
        if self.count < 2 {
            return Estimate::default();
        }
        let p = self.same_top as f64 / self.count as f64;
        Estimate {
            value: p,
            err: (p * (1.0 - p) / (self.count - 1) as f64).sqrt(),
        }
    }

    /// The per-position KL divergences at each fraction (0 = the minimum, 1 = the maximum,
    /// 0.5 = the median), linearly interpolated between ranks.
    pub fn kld_quantiles(&self, fractions: &[f64]) -> Vec<f64> {
        quantiles(&self.kld_values, fractions)
    }

    /// The same for Δp.
    pub fn p_diff_quantiles(&self, fractions: &[f64]) -> Vec<f64> {
        quantiles(&self.p_diff_values, fractions)
    }
}

fn exp_of(log: Estimate) -> Estimate {
    let value = log.value.exp();
    Estimate {
        value,
        err: value * log.err,
    }
}

fn quantiles(values: &[f32], fractions: &[f64]) -> Vec<f64> {
    if values.is_empty() {
        return vec![0.0; fractions.len()];
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    fractions
        .iter()
        .map(|&f| {
            let at = f.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
            let (i, frac) = (at.floor() as usize, at.fract());
            let next = sorted[(i + 1).min(sorted.len() - 1)] as f64;
            (1.0 - frac) * sorted[i] as f64 + frac * next
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::logits_file::{encode_row, record_len};

    fn record(row: &[f32]) -> Vec<u16> {
        let mut r = vec![0; record_len(row.len())];
        encode_row(row, &mut r);
        r
    }

    /// KL(p ‖ q) of two small distributions by the definition.
    fn kl(p: &[f64], q: &[f64]) -> f64 {
        p.iter().zip(q).map(|(p, q)| p * (p / q).ln()).sum()
    }

    fn softmax(row: &[f32]) -> Vec<f64> {
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        row.iter().map(|&x| (x as f64).exp() / z).collect()
    }

    #[test]
    fn statistics_follow_their_definitions() {
        let base = [2.0f32, 1.0, 0.5, -1.0];
        let model = [1.5f32, 1.2, 0.4, -0.5];
        let rec = record(&base);
        let mut k = KlDivergence::default();
        k.add(&model, &EncodedRow::new(&rec, 4), 1);
        let (p, q) = (softmax(&base), softmax(&model));
        assert!((k.kld().value - kl(&p, &q)).abs() < 1e-4);
        assert!((k.ppl().value - 1.0 / q[1]).abs() < 1e-6);
        assert!((k.ppl_base().value - 1.0 / p[1]).abs() < 1e-3);
        assert!((k.p_diff().value - (q[1] - p[1])).abs() < 1e-4);
        assert_eq!(
            k.same_top(),
            Estimate::default(),
            "one position: no estimate"
        );
        // The same distribution: nothing between them, the same first token.
        let mut same = KlDivergence::default();
        for _ in 0..20 {
            same.add(&base, &EncodedRow::new(&rec, 4), 0);
        }
        assert!(same.kld().value.abs() < 1e-5);
        assert_eq!(same.same_top().value, 1.0);
        assert!(same.ln_ppl_ratio().value.abs() < 1e-4);
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v = [4.0f32, 1.0, 3.0, 2.0, 5.0];
        assert_eq!(
            quantiles(&v, &[0.0, 0.5, 1.0, 0.125, 2.0]),
            [1.0, 3.0, 5.0, 1.5, 5.0]
        );
        assert_eq!(quantiles(&[], &[0.5]), [0.0]);
    }
}
