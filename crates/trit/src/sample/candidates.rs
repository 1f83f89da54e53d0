//! A row of logits reduced to what sampling needs: its best candidates and the row's
//! log-normalizer. A GPU backend computes this on the device and copies a few hundred bytes
//! per sequence instead of the whole vocabulary (151,936 floats for Qwen3); the sampler and
//! the log-probabilities then work on the candidates ([`Sampler::sample_top`],
//! [`SamplingParams::exact_on_top`]) and give exactly what the full row gives.
//!
//! [`Sampler::sample_top`]: super::Sampler::sample_top
//! [`SamplingParams::exact_on_top`]: super::SamplingParams::exact_on_top

/// Candidates a device backend returns per row when asked for them. Covers the OpenAI API's
/// `top_logprobs` (at most 20) and the usual top-k settings; a larger top-k (or top-k 0, the
/// whole vocabulary) takes the full row.
pub const TOP_CANDIDATES: usize = 64;

/// The `k` largest logits of a row, largest first, ties broken by the lower token id (the
/// order the sampler uses), and ln Σ exp(logit) over the *whole* row, so log-probabilities of
/// the candidates are exact.
#[derive(Clone, Debug, PartialEq)]
pub struct TopLogits {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    /// `max + ln Σ exp(l − max)` over every entry of the row (finite).
    pub log_z: f64,
}

impl TopLogits {
    /// The reference computation on the host: `None` when the row's normalizer is not finite
    /// (a NaN or +∞ logit, or every logit −∞), where only the full row can say what to do.
    pub fn from_row(row: &[f32], k: usize) -> Option<TopLogits> {
        let log_z = log_sum_exp(row);
        if !log_z.is_finite() || k == 0 {
            return None;
        }
        let idx = top_k_indices(row, k, false);
        Some(TopLogits {
            logits: idx.iter().map(|&i| row[i as usize]).collect(),
            ids: idx,
            log_z,
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The full row's `argmax` (its first maximal entry): the lowest id among the candidates
    /// equal to the best one (equal as `==` compares, so −0.0 and +0.0 tie as in `argmax`).
    pub fn argmax(&self) -> u32 {
        let best = self.logits.first().copied().unwrap_or(f32::NEG_INFINITY);
        self.ids
            .iter()
            .zip(&self.logits)
            .filter(|(_, &l)| l == best)
            .map(|(&i, _)| i)
            .min()
            .unwrap_or(0)
    }

    /// Log-probability of candidate `i` under the full row.
    pub fn logprob(&self, i: usize) -> f32 {
        (self.logits[i] as f64 - self.log_z) as f32
    }

    /// Position of `token` among the candidates.
    pub fn position(&self, token: u32) -> Option<usize> {
        self.ids.iter().position(|&t| t == token)
    }
}

/// Indices of the `k` largest entries of `row` (only the finite ones when `finite_only`), in
/// rank order: larger value first by `f32::total_cmp`, then lower index. One pass that keeps
/// a small buffer of entries above a running floor, so a 151,936-entry row costs a scan
/// rather than a selection over all of it (the same result as sorting the whole row).
pub fn top_k_indices(row: &[f32], k: usize, finite_only: bool) -> Vec<u32> {
    let rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k == 0 {
        return Vec::new();
    }
    let cap = (4 * k).max(256);
    let mut buf: Vec<(u32, f32)> = Vec::with_capacity(cap);
    // Once set: the k-th best so far. A later entry has a higher index, so it ranks below
    // the k-th unless its value is strictly greater (in total order).
    let mut floor: Option<f32> = None;
    for (i, &l) in row.iter().enumerate() {
        if finite_only && !l.is_finite() {
            continue;
        }
        if let Some(f) = floor {
            // A plain comparison decides all but equal values and NaN, where the total
            // order (−0.0 below +0.0, NaN by sign) decides.
            let above = match l.partial_cmp(&f) {
                Some(o) if o != std::cmp::Ordering::Equal => o == std::cmp::Ordering::Greater,
                _ => l.total_cmp(&f) == std::cmp::Ordering::Greater,
            };
            if !above {
                continue;
            }
        }
        buf.push((i as u32, l));
        if buf.len() == cap {
            buf.select_nth_unstable_by(k - 1, rank);
            buf.truncate(k);
            floor = Some(buf[k - 1].1);
        }
    }
    if buf.len() > k {
        buf.select_nth_unstable_by(k - 1, rank);
        buf.truncate(k);
    }
    buf.sort_by(rank);
    buf.into_iter().map(|(i, _)| i).collect()
}

/// `max + ln Σ exp(l − max)` in f64, the log-softmax normalizer of a row.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    max + row
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// One row of a forward pass's output, as a backend returns it for sampling.
#[derive(Clone, Debug, PartialEq)]
pub enum RowLogits {
    /// Every logit of the row.
    Full(Vec<f32>),
    /// Its best candidates only (asked for, and the row's normalizer finite).
    Top(TopLogits),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::rng::Rng;

    /// Every entry ranked, the first k kept: what `top_k_indices` must equal.
    fn sorted_top(row: &[f32], k: usize, finite_only: bool) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| !finite_only || row[i as usize].is_finite())
            .collect();
        idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
        idx
    }

    #[test]
    fn one_pass_top_k_equals_ranking_the_whole_row() {
        let mut rng = Rng::new(5);
        for case in 0..40 {
            let n = [1, 7, 300, 3000, 20_000][case % 5];
            // Few distinct values (many ties, also at the cut), or increasing rows (the
            // floor moves often); −inf, ±0.0, NaN and +inf sprinkled in.
            let levels = [4.0, 50.0, 1e6][case % 3];
            let mut row: Vec<f32> = (0..n)
                .map(|i| match case % 4 {
                    3 => i as f32 * 0.5,
                    _ => (rng.next_f64() * levels).floor() as f32 - 2.0,
                })
                .collect();
            for j in (0..n).step_by(11) {
                row[j] = [f32::NEG_INFINITY, 0.0, -0.0, f32::NAN, f32::INFINITY][j % 5];
            }
            for k in [1, 2, 20, 64, 300, n + 5] {
                for finite_only in [true, false] {
                    assert_eq!(
                        top_k_indices(&row, k, finite_only),
                        sorted_top(&row, k, finite_only),
                        "case {case}, n {n}, k {k}, finite_only {finite_only}"
                    );
                }
            }
        }
    }

    #[test]
    fn top_of_a_row_is_sorted_with_ties_by_id_and_exact_log_z() {
        let row = [1.0f32, 5.0, 3.0, 5.0, -2.0, 3.0, f32::NEG_INFINITY];
        let t = TopLogits::from_row(&row, 4).unwrap();
        assert_eq!(t.ids, vec![1, 3, 2, 5]);
        assert_eq!(t.logits, vec![5.0, 5.0, 3.0, 3.0]);
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((t.log_z - z).abs() < 1e-12);
        assert_eq!(t.argmax(), 1);
        assert!((t.logprob(2) as f64 - (3.0 - z)).abs() < 1e-6);
        // k beyond the row: all of it.
        assert_eq!(TopLogits::from_row(&row, 100).unwrap().len(), row.len());
        // No finite normalizer: no candidates.
        assert!(TopLogits::from_row(&[1.0, f32::NAN], 1).is_none());
        assert!(TopLogits::from_row(&[1.0, f32::INFINITY], 1).is_none());
        assert!(TopLogits::from_row(&[f32::NEG_INFINITY; 3], 1).is_none());
    }
}
