//! Token selection. Order follows llama.cpp's default chain: logit bias → penalties → DRY →
//! top-n-σ → top-k → typical → top-p → min-p (on untempered probabilities) → XTC → temperature
//! → draw. Temperature 0 is greedy (over what the truncation samplers keep, when any is on).
//! Mirostat, when on, replaces everything after the logit bias (as in llama.cpp).

use super::candidates::{top_k_indices, TopLogits};
use super::dry::Dry;
use super::dynatemp::DynamicTemperature;
use super::mirostat::Mirostat;
use super::processors::Penalties;
use super::rng::Rng;
use super::truncation::{top_n_sigma, typical, xtc, Truncation};
use crate::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    pub penalties: Penalties,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (−∞ bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// llama.cpp's DRY repetition penalty, after the other penalties (`None`: off).
    pub dry: Option<Dry>,
    /// Top-n-σ, locally typical sampling and XTC (all off by default).
    pub truncation: Truncation,
    /// llama.cpp's dynamic temperature (`None`: the fixed one).
    pub dynatemp: Option<DynamicTemperature>,
    /// Mirostat in place of the penalties and the truncation chain (`None`: off).
    pub mirostat: Option<Mirostat>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.8,
            min_p: 0.0,
            penalties: Penalties::default(),
            seed: 0,
            logit_bias: Vec::new(),
            dry: None,
            truncation: Truncation::default(),
            dynatemp: None,
            mirostat: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::InvalidArgument(what.to_string()));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.penalties.repetition > 0.0 && self.penalties.repetition.is_finite()) {
            return bad("repetition penalty must be > 0");
        }
        if self
            .logit_bias
            .iter()
            .any(|&(_, b)| b.is_nan() || b == f32::INFINITY)
        {
            return bad("a logit bias must be a number or −∞");
        }
        self.truncation.validate()?;
        if let Some(m) = &self.mirostat {
            if !(m.version == 1 || m.version == 2) {
                return bad("mirostat must be 0 (off), 1 or 2");
            }
            if !(m.tau.is_finite() && m.eta.is_finite() && m.tau > 0.0 && m.eta >= 0.0) {
                return bad("mirostat_tau must be > 0 and mirostat_eta ≥ 0");
            }
        }
        if let Some(d) = &self.dry {
            if !(d.multiplier >= 0.0 && d.multiplier.is_finite()) {
                return bad("dry_multiplier must be a finite number ≥ 0");
            }
            if !(d.base >= 1.0 && d.base.is_finite()) {
                return bad("dry_base must be a finite number ≥ 1");
            }
        }
        Ok(())
    }

    /// Whether [`Sampler::sample_top`] on a row's `k` best candidates picks exactly what
    /// [`Sampler::sample`] picks on the full row: greedy, or a top-k of at most `k` (top-p
    /// and min-p then work within the top-k set, temperature after them), and no penalties
    /// and no logit bias (they change logits of tokens that may lie outside the candidates).
    pub fn exact_on_top(&self, k: usize) -> bool {
        let no_penalties = (self.penalties.is_neutral() || self.penalties.last_n == 0)
            && self.logit_bias.is_empty()
            && !self.dry.as_ref().is_some_and(Dry::is_active)
            && self.truncation.is_neutral()
            && self.mirostat.is_none();
        let within = self.temperature <= 0.0
            || (self.top_k >= 1 && self.top_k <= k && self.dynatemp.is_none());
        no_penalties && k >= 1 && within
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Mirostat's running surprise target (2τ at the start).
    mu: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        let mu = params.mirostat.as_ref().map_or(0.0, |m| 2.0 * m.tau);
        Ok(Sampler { params, rng, mu })
    }

    /// A sampler whose generator continues from `state` (a device's stand-in draws as the
    /// host would).
    pub fn with_rng_state(params: SamplingParams, state: [u64; 4]) -> Result<Self> {
        params.validate()?;
        let mu = params.mirostat.as_ref().map_or(0.0, |m| 2.0 * m.tau);
        Ok(Sampler {
            params,
            rng: Rng::from_state(state),
            mu,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The generator's state, for a device that draws in its place (`DevicePick::Sample`).
    pub fn rng_state(&self) -> [u64; 4] {
        self.rng.state()
    }

    /// Advances the generator past one draw a device made in its place.
    pub fn skip_draw(&mut self) {
        self.rng.next_u64();
    }

    /// Picks the next token from `logits` (modified in place by the penalties), given the
    /// tokens seen so far in this sequence.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        for &(t, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        if p.mirostat.is_some() {
            return self.sample_mirostat(logits);
        }
        p.penalties.apply(logits, history);
        if let Some(d) = &p.dry {
            d.apply(logits, history);
        }
        if p.temperature <= 0.0 && p.truncation.is_neutral() {
            return argmax(logits);
        }
        let cand = self.kept(logits);
        if cand.is_empty() {
            return 0;
        }
        self.draw(cand)
    }

    /// The candidates a draw chooses among once the truncation samplers have run on `logits`
    /// (after bias and penalties): top-n-σ, top-k, typical, top-p, min-p and XTC, in
    /// llama.cpp's order; sorted best first.
    pub fn kept(&mut self, logits: &mut [f32]) -> Vec<(u32, f32)> {
        let p = &self.params;
        if p.truncation.top_n_sigma > 0.0 {
            top_n_sigma(logits, p.truncation.top_n_sigma);
        }
        // Candidates sorted by logit, descending (ties: lower id first, the order the GPU's
        // candidate kernel uses too); a top-k takes one pass over the row, no top-k sorts it.
        let cand: Vec<(u32, f32)> = if p.top_k == 0 {
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l))
                .collect();
            all.sort_by(by_rank);
            all
        } else {
            top_k_indices(logits, p.top_k, true)
                .into_iter()
                .map(|i| (i, logits[i as usize]))
                .filter(|c| c.1.is_finite())
                .collect()
        };
        self.truncate(cand)
    }

    /// Picks the next token from a row's best candidates alone (see [`TopLogits`]): the same
    /// token, and the same draws of the generator, as [`sample`](Self::sample) on the full row,
    /// provided [`SamplingParams::exact_on_top`] holds for `top.len()` (the caller's check;
    /// otherwise the tokens outside the candidates count as never drawn).
    pub fn sample_top(&mut self, top: &TopLogits) -> u32 {
        let p = &self.params;
        debug_assert!(p.exact_on_top(top.len()));
        if p.temperature <= 0.0 {
            return top.argmax();
        }
        let k = if p.top_k == 0 { top.len() } else { p.top_k };
        let cand: Vec<(u32, f32)> = top
            .ids
            .iter()
            .zip(&top.logits)
            .filter(|(_, l)| l.is_finite())
            .take(k)
            .map(|(&i, &l)| (i, l))
            .collect();
        if cand.is_empty() {
            return 0;
        }
        let cand = self.truncate(cand);
        self.draw(cand)
    }

    /// Typical, top-p, min-p and XTC over `cand` (sorted best first, top-k applied).
    fn truncate(&mut self, mut cand: Vec<(u32, f32)>) -> Vec<(u32, f32)> {
        if cand.is_empty() {
            return cand;
        }
        let p = &self.params;
        typical(&mut cand, p.truncation.typical_p);
        let probs = softmax(cand.iter().map(|c| c.1), 1.0);
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
        }
        cand.truncate(keep.max(1));
        let t = &p.truncation;
        if t.xtc_active() && cand.len() >= 2 {
            let threshold = t.xtc_threshold;
            if self.rng.next_f64() <= t.xtc_probability as f64 {
                xtc(&mut cand, threshold);
            }
        }
        cand
    }

    /// Temperature and the draw over `cand` (sorted best first, truncated); at temperature
    /// 0 the best of them.
    fn draw(&mut self, cand: Vec<(u32, f32)>) -> u32 {
        let p = &self.params;
        if cand.is_empty() {
            return 0;
        }
        if p.temperature <= 0.0 {
            return cand[0].0;
        }
        let probs = self.distribution(&cand);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, pr) in cand.iter().zip(&probs) {
            cum += pr;
            if r < cum {
                return c.0;
            }
        }
        cand.last().map(|c| c.0).unwrap_or(0)
    }
}

impl Sampler {
    /// Mirostat's step (after the logit bias, as llama.cpp's chain): temperature, the tokens
    /// the target allows, a draw among them, the target moved by the drawn token's surprise.
    fn sample_mirostat(&mut self, logits: &[f32]) -> u32 {
        let Some(m) = self.params.mirostat.clone() else {
            return argmax(logits);
        };
        let t = self.params.temperature;
        if t <= 0.0 {
            // llama.cpp's temperature 0 leaves the best token alone: certain, 0 bits.
            self.mu = m.update(self.mu, 1.0);
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        cand.sort_by(by_rank);
        m.keep(&mut cand, self.mu, logits.len());
        if cand.is_empty() {
            return 0;
        }
        let probs = softmax(cand.iter().map(|c| c.1), 1.0);
        let r = self.rng.next_f64();
        let mut pick = cand.len() - 1;
        let mut cum = 0.0;
        for (i, pr) in probs.iter().enumerate() {
            cum += pr;
            if r < cum {
                pick = i;
                break;
            }
        }
        self.mu = m.update(self.mu, probs[pick] as f32);
        cand[pick].0
    }

    /// Mirostat's current surprise target.
    pub fn mirostat_mu(&self) -> f32 {
        self.mu
    }

    /// The probabilities the draw uses over `cand` (the kept candidates, best first): the
    /// softmax at the step's temperature (dynamic when asked; at 0, all on the best).
    pub fn distribution(&self, cand: &[(u32, f32)]) -> Vec<f64> {
        let p = &self.params;
        let t = match &p.dynatemp {
            Some(d) => d.temperature(p.temperature, &cand.iter().map(|c| c.1).collect::<Vec<_>>()),
            None => p.temperature,
        };
        if t <= 0.0 {
            let mut one = vec![0.0; cand.len()];
            if let Some(first) = one.first_mut() {
                *first = 1.0;
            }
            return one;
        }
        softmax(cand.iter().map(|c| c.1), t)
    }
}

/// Candidate order: larger logit first, then lower token id.
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax(logits: impl Iterator<Item = f32> + Clone, temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.map(|l| ((l as f64 - max) / t).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::TopLogits;

    fn params(t: f32, k: usize, p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p,
            penalties: Penalties::default(),
            seed: 42,
            logit_bias: Vec::new(),
            dry: None,
            mirostat: None,
            dynatemp: None,
            truncation: Default::default(),
        }
    }

    fn histogram(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(p).unwrap();
        let mut h = vec![0; logits.len()];
        for _ in 0..n {
            h[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        h
    }

    #[test]
    fn mirostat_draws_within_its_target_and_moves_it() {
        let m = Mirostat {
            version: 2,
            tau: 3.0,
            eta: 0.1,
        };
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            mirostat: Some(m.clone()),
            ..SamplingParams::default()
        })
        .unwrap();
        assert_eq!(s.mirostat_mu(), 6.0, "2τ at the start");
        let logits: Vec<f32> = (0..64).map(|i| -(i as f32) * 0.3).collect();
        for _ in 0..50 {
            let mu = s.mirostat_mu();
            let mut allowed: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            m.keep(&mut allowed, mu, logits.len());
            let t = s.sample(&mut logits.clone(), &[]);
            assert!(
                allowed.iter().any(|c| c.0 == t),
                "{t} outside {}",
                allowed.len()
            );
            assert_ne!(s.mirostat_mu(), mu);
        }
    }

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.9, -1.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_support() {
        let logits = [1.0, 2.0, 3.0, 2.5];
        assert_eq!(
            histogram(params(1.0, 1, 1.0, 0.0), &logits, 200),
            vec![0, 0, 200, 0]
        );
        let h = histogram(params(1.0, 2, 1.0, 0.0), &logits, 2000);
        assert_eq!(h[0] + h[1], 0);
        assert!(h[2] > h[3] && h[3] > 300, "{h:?}");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities ≈ [0.64, 0.24, 0.09, 0.03]
        let logits = [3.0, 2.0, 1.0, 0.0];
        let h = histogram(params(1.0, 0, 0.7, 0.0), &logits, 2000);
        assert!(h[2] == 0 && h[3] == 0 && h[1] > 0, "{h:?}");
        let h = histogram(params(1.0, 0, 1.0, 0.2), &logits, 2000);
        assert!(h[2] == 0 && h[3] == 0 && h[1] > 0, "{h:?}");
    }

    #[test]
    fn distribution_follows_temperature_and_seed_reproduces() {
        let logits = [0.0, (3f32).ln()]; // p = 0.25 / 0.75 at T = 1
        let h = histogram(params(1.0, 0, 1.0, 0.0), &logits, 8000);
        let f = h[1] as f64 / 8000.0;
        assert!((f - 0.75).abs() < 0.03, "{f}");
        let hot = histogram(params(100.0, 0, 1.0, 0.0), &logits, 8000);
        assert!((hot[1] as f64 / 8000.0 - 0.5).abs() < 0.04);
        assert_eq!(
            histogram(params(1.0, 0, 1.0, 0.0), &logits, 500),
            histogram(params(1.0, 0, 1.0, 0.0), &logits, 500)
        );
    }

    /// Rows with many ties (logits on a coarse grid), a few −∞, one dominant spike or flat.
    fn test_rows() -> Vec<Vec<f32>> {
        let mut rng = Rng::new(99);
        let mut rows = Vec::new();
        for case in 0..12 {
            let n = 300 + 17 * case;
            let mut row: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() * 40.0).floor() as f32 * 0.25 - 5.0)
                .collect();
            if case % 3 == 0 {
                row[7] = f32::NEG_INFINITY;
                row[n - 1] = f32::NEG_INFINITY;
            }
            if case % 4 == 1 {
                row[n / 2] = 30.0;
            }
            if case == 5 {
                row.iter_mut().for_each(|l| *l = 1.5);
            }
            rows.push(row);
        }
        rows
    }

    #[test]
    fn candidates_sample_exactly_what_the_full_row_samples() {
        let k = crate::sample::TOP_CANDIDATES;
        let settings = [
            params(0.0, 0, 1.0, 0.0),
            params(0.7, 20, 0.8, 0.0),
            params(1.0, 1, 1.0, 0.0),
            params(1.3, k, 1.0, 0.0),
            params(0.5, 40, 0.95, 0.05),
            params(2.0, 7, 0.3, 0.5),
        ];
        for (si, p) in settings.iter().enumerate() {
            assert!(p.exact_on_top(k), "setting {si}");
            for (ri, row) in test_rows().iter().enumerate() {
                let top = TopLogits::from_row(row, k).unwrap();
                let mut full = Sampler::new(SamplingParams {
                    seed: ri as u64,
                    ..p.clone()
                })
                .unwrap();
                let mut cand = Sampler::new(SamplingParams {
                    seed: ri as u64,
                    ..p.clone()
                })
                .unwrap();
                for draw in 0..50 {
                    let want = full.sample(&mut row.clone(), &[1, 2, 3]);
                    assert_eq!(
                        cand.sample_top(&top),
                        want,
                        "setting {si}, row {ri}, draw {draw}"
                    );
                }
            }
        }
    }

    #[test]
    fn settings_the_candidates_cannot_honour_ask_for_the_full_row() {
        let k = crate::sample::TOP_CANDIDATES;
        // Whole-vocabulary sampling, or a top-k wider than the candidates.
        assert!(!params(1.0, 0, 1.0, 0.0).exact_on_top(k));
        assert!(!params(1.0, 0, 0.9, 0.1).exact_on_top(k));
        assert!(!params(1.0, k + 1, 1.0, 0.0).exact_on_top(k));
        assert!(params(1.0, k, 1.0, 0.0).exact_on_top(k));
        // Penalties change logits of tokens that may lie outside the candidates, greedy too.
        let mut p = params(0.0, 0, 1.0, 0.0);
        p.penalties.repetition = 1.1;
        assert!(!p.exact_on_top(k));
        p.penalties = Penalties {
            presence: 0.5,
            ..Penalties::default()
        };
        assert!(!p.exact_on_top(k));
        // ...unless they look at no tokens at all.
        p.penalties.last_n = 0;
        assert!(p.exact_on_top(k));
        assert!(!params(0.0, 0, 1.0, 0.0).exact_on_top(0));
        // Why penalties fall back: a negative presence penalty lifts a token from outside the
        // raw row's 2 best candidates to the top.
        let row = [5.0f32, 4.0, 3.0, 1.0];
        let mut boost = params(0.0, 0, 1.0, 0.0);
        boost.penalties = Penalties {
            presence: -10.0,
            ..Penalties::default()
        };
        let top = TopLogits::from_row(&row, 2).unwrap();
        let full = Sampler::new(boost.clone())
            .unwrap()
            .sample(&mut row.to_vec(), &[3]);
        assert_eq!(full, 3);
        assert!(top.position(full).is_none());
    }

    #[test]
    fn invalid_params_are_refused() {
        assert!(Sampler::new(params(-1.0, 0, 1.0, 0.0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 0.0, 0.0)).is_err());
        assert!(Sampler::new(params(1.0, 0, 1.0, 2.0)).is_err());
    }

    #[test]
    fn logit_bias_comes_first_and_disables_the_candidate_shortcut() {
        let logits = [1.0f32, 3.0, 2.0, 0.5];
        let mut p = params(0.0, 0, 1.0, 0.0);
        p.logit_bias = vec![(1, f32::NEG_INFINITY)];
        assert_eq!(
            Sampler::new(p.clone())
                .unwrap()
                .sample(&mut logits.clone(), &[]),
            2
        );
        p.logit_bias = vec![(3, 2.6)];
        assert_eq!(
            Sampler::new(p.clone())
                .unwrap()
                .sample(&mut logits.clone(), &[]),
            3
        );
        // A bias can lift a token from outside any candidate set.
        assert!(!p.exact_on_top(2));
        // Sampled: a banned token is never drawn.
        let mut banned = params(1.0, 0, 1.0, 0.0);
        banned.logit_bias = vec![(1, f32::NEG_INFINITY)];
        assert_eq!(histogram(banned.clone(), &logits, 2000)[1], 0);
        banned.logit_bias = vec![(1, f32::NAN)];
        assert!(Sampler::new(banned).is_err());
    }
}
