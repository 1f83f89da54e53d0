//! The decoding state of one sequence, step by step: logits in → sampled token, text that
//! became final (complete characters, never part of a stop string), and whether it is done.
//! Both the single-sequence [`generate`](super::generate) loop and the batching
//! [`Scheduler`](super::Scheduler) drive it, so stop conditions and streaming text behave the
//! same in `trit run` and `trit serve`.

use super::generate::{FinishReason, GenerateOptions, StopMatcher};
use crate::model::DevicePick;
use crate::sample::candidates::{log_sum_exp, top_k_indices};
use crate::sample::{constraint_for, OutputConstraint, RowLogits, Sampler};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::Result;

/// Log-probability of a sampled token under the model (before penalties and temperature, as
/// OpenAI reports them) and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// `(token, logprob)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What one step produced.
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// The sampled token, `None` when it was an end-of-sequence token (not part of the output).
    pub token: Option<u32>,
    /// Text that became final with this step (may be empty; at the end, includes held text).
    pub text: String,
    pub logprob: Option<TokenLogprob>,
    /// Set when the sequence has finished; then the token must not be fed back.
    pub finish: Option<FinishReason>,
}

pub struct Decoding {
    sampler: Sampler,
    history: Vec<u32>,
    decoder: StreamDecoder,
    stops: StopMatcher,
    eos: Vec<u32>,
    max_tokens: usize,
    top_logprobs: Option<usize>,
    generated: usize,
    finish: Option<FinishReason>,
    /// Constrained decoding (`GenerateOptions::constraint`).
    constraint: Option<OutputConstraint>,
}

impl Decoding {
    pub fn new(prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
        Ok(Decoding {
            sampler: Sampler::new(opts.sampling.clone())?,
            history: prompt.to_vec(),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(&opts.stop),
            eos: opts.eos.clone(),
            max_tokens: opts.max_tokens,
            top_logprobs: None,
            generated: 0,
            finish: None,
            constraint: opts
                .constraint
                .as_ref()
                .map(|c| constraint_for(c, opts.eos.clone())),
        })
    }

    /// Also report log-probabilities: of the sampled token and of the `top` most likely ones.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.top_logprobs = Some(top);
        self
    }

    /// Tokens generated so far (end-of-sequence tokens excluded).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Tokens this sequence may still produce before its length limit.
    pub fn tokens_left(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated)
    }

    /// End-of-sequence tokens: they end the sequence whenever they are produced.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Whether this sequence's next token can be sampled from a row's `k` best candidates
    /// (see [`Sampler::sample_top`](crate::sample::Sampler::sample_top)) with exactly the
    /// result of the full row, log-probabilities included.
    pub fn exact_on_top(&self, k: usize) -> bool {
        self.sampler.params().exact_on_top(k)
            && self.top_logprobs.is_none_or(|t| t <= k)
            && self.constraint.is_none()
    }

    /// How a device may pick this sequence's next tokens itself, where nothing but the rule
    /// reads the rows (no penalties, no logit bias, no constraint, no log-probabilities): the
    /// argmax when greedy, else the sampler's rule on the `top_k` best candidates from the
    /// generator's current state ([`step_token`](Self::step_token) records the tokens).
    pub fn device_pick(&self) -> Option<DevicePick> {
        if self.constraint.is_some() || self.top_logprobs.is_some() {
            return None;
        }
        let p = self.sampler.params();
        if p.temperature <= 0.0 {
            return self.exact_on_top(1).then_some(DevicePick::Argmax);
        }
        self.exact_on_top(p.top_k).then(|| DevicePick::Sample {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            rng: self.sampler.rng_state(),
        })
    }

    /// [`step`](Self::step) for a token the model's device picked by
    /// [`device_pick`](Self::device_pick)'s rule; `drew`: the pick took one draw of the
    /// generator, which the host's generator skips so that both stay in step.
    pub fn step_token(
        &mut self,
        tok: u32,
        drew: bool,
        tokenizer: &Tokenizer,
        cached: usize,
        n_ctx: usize,
    ) -> Step {
        if let Some(step) = self.finished_already(tokenizer) {
            return step;
        }
        if drew {
            self.sampler.skip_draw();
        }
        self.emit(tok, None, tokenizer, cached, n_ctx)
    }

    /// Samples from `logits` (the model's output after the last fed token; modified in place).
    /// `cached` is how many positions the sequence's cache holds and `n_ctx` its capacity: a
    /// token that could not be fed back ends the sequence with `Length`.
    pub fn step(
        &mut self,
        logits: &mut [f32],
        tokenizer: &Tokenizer,
        cached: usize,
        n_ctx: usize,
    ) -> Step {
        if let Some(step) = self.finished_already(tokenizer) {
            return step;
        }
        let logprob_source = self.top_logprobs.map(|_| logits.to_vec());
        let tok = match &self.constraint {
            None => self.sampler.sample(logits, &self.history),
            Some(c) => match c.sample(&mut self.sampler, logits, &self.history) {
                Some(t) => t,
                // No token can continue the document (or end it): stop here.
                None => return self.end(Step::default(), FinishReason::Stop, tokenizer),
            },
        };
        let logprob = match (self.top_logprobs, logprob_source) {
            (Some(top), Some(raw)) => Some(token_logprob(&raw, tok, top)),
            _ => None,
        };
        self.emit(tok, logprob, tokenizer, cached, n_ctx)
    }

    /// [`step`](Self::step) for a row as a backend returned it: the full logits, or its best
    /// candidates (which the caller asks for only where [`exact_on_top`](Self::exact_on_top)
    /// holds).
    pub fn step_row(
        &mut self,
        row: RowLogits,
        tokenizer: &Tokenizer,
        cached: usize,
        n_ctx: usize,
    ) -> Step {
        let top = match row {
            RowLogits::Full(mut logits) => return self.step(&mut logits, tokenizer, cached, n_ctx),
            RowLogits::Top(top) => top,
        };
        if let Some(step) = self.finished_already(tokenizer) {
            return step;
        }
        debug_assert!(self.exact_on_top(top.len()));
        let tok = self.sampler.sample_top(&top);
        let logprob = self.top_logprobs.map(|n| {
            let lp = top
                .position(tok)
                .map_or(f32::NEG_INFINITY, |i| top.logprob(i));
            TokenLogprob {
                token: tok,
                logprob: lp,
                top: (0..n.min(top.len()))
                    .map(|i| (top.ids[i], top.logprob(i)))
                    .collect(),
            }
        });
        self.emit(tok, logprob, tokenizer, cached, n_ctx)
    }

    /// The step of a sequence that has already ended, or that may produce nothing.
    fn finished_already(&mut self, tokenizer: &Tokenizer) -> Option<Step> {
        if self.finish.is_some() {
            return Some(Step {
                finish: self.finish,
                ..Step::default()
            });
        }
        if self.max_tokens == 0 {
            return Some(self.end(Step::default(), FinishReason::Length, tokenizer));
        }
        None
    }

    /// Records the sampled token `tok`: end of sequence, streamed text, stop strings, length.
    fn emit(
        &mut self,
        tok: u32,
        logprob: Option<TokenLogprob>,
        tokenizer: &Tokenizer,
        cached: usize,
        n_ctx: usize,
    ) -> Step {
        let mut step = Step {
            logprob,
            ..Step::default()
        };
        if self.eos.contains(&tok) {
            return self.end(step, FinishReason::Stop, tokenizer);
        }
        step.token = Some(tok);
        if let Some(c) = &mut self.constraint {
            c.advance(tok);
        }
        self.generated += 1;
        self.history.push(tok);
        if let Some(piece) = self.decoder.push(tokenizer, tok) {
            let (ready, hit) = self.stops.push(&piece);
            step.text = ready;
            if hit {
                // The stop string and anything held back are dropped.
                self.finish = Some(FinishReason::Stop);
                step.finish = self.finish;
                return step;
            }
        }
        if self.generated >= self.max_tokens || cached + 1 > n_ctx {
            return self.end(step, FinishReason::Length, tokenizer);
        }
        step
    }

    /// Ends the sequence from outside (client gone); returns the text still held back.
    pub fn cancel(&mut self, tokenizer: &Tokenizer) -> Step {
        self.end(Step::default(), FinishReason::Cancelled, tokenizer)
    }

    fn end(&mut self, mut step: Step, reason: FinishReason, tokenizer: &Tokenizer) -> Step {
        // Text held back as a possible stop-string prefix, or bytes of an unfinished character.
        step.text.push_str(&self.stops.take_held());
        step.text.push_str(&self.decoder.flush(tokenizer));
        self.finish = Some(reason);
        step.finish = Some(reason);
        step
    }
}

/// Log-softmax of `logits` at `token`, plus the `top` largest entries (ties: lower id first,
/// the order of [`TopLogits`](crate::sample::TopLogits)).
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let log_z = log_sum_exp(logits);
    let lp = |i: usize| (logits[i] as f64 - log_z) as f32;
    let best = top_k_indices(logits, top, false);
    TokenLogprob {
        token,
        logprob: lp(token as usize),
        top: best.into_iter().map(|t| (t, lp(t as usize))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax_and_top_is_sorted() {
        let logits = [0.0f32, (3f32).ln(), -50.0];
        let l = token_logprob(&logits, 0, 2);
        // p = 0.25 / 0.75 / ~0
        assert!((l.logprob - 0.25f32.ln()).abs() < 1e-5, "{l:?}");
        assert_eq!(l.top.len(), 2);
        assert_eq!(l.top[0].0, 1);
        assert!((l.top[0].1 - 0.75f32.ln()).abs() < 1e-5);
        assert_eq!(l.top[1].0, 0);
        assert!(token_logprob(&logits, 2, 0).top.is_empty());
    }
}
