//! Speculative decoding: a small draft model with the same vocabulary proposes a few tokens
//! greedily, the target model scores them all in one forward pass, and the target's own
//! sampler walks the scored rows: each draft token it would have picked anyway is accepted,
//! the first one it would not is replaced by its own pick and the rest are dropped. Every
//! emitted token is drawn from the target's row at that position with one draw of its
//! generator, so the output is what [`generate`](super::generate) gives with the target alone
//! (same seed, same text) — only the number of target passes changes. Attention-only models
//! (the caches are cut back after a rejection; a recurrent state cannot be).

use super::generate::{check_context, GenerateOptions, Generation};
use super::sequence::Decoding;
use super::session::Session;
use crate::model::Model;
use crate::sample::sampler::argmax;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::time::Instant;

/// How the draft did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Draft tokens the target scored.
    pub drafted: usize,
    /// Of those, the ones the target's sampler picked too.
    pub accepted: usize,
    /// Target forward passes after the prompt.
    pub target_passes: usize,
}

impl DraftStats {
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Checks that `draft` can propose tokens for `target`.
pub fn check_draft(target: &Session, draft: &Session) -> Result<()> {
    check_draft_models(target.model(), draft.model())
}

/// Checks that `draft` can propose tokens for `target`: the same vocabulary, attention-only
/// models (`run`'s sessions and the server's scheduler both ask).
pub fn check_draft_models(target: &Model, draft: &Model) -> Result<()> {
    let (t, d) = (target.config(), draft.config());
    if t.vocab != d.vocab {
        return Err(Error::InvalidArgument(format!(
            "the draft model's vocabulary ({} tokens) differs from the target's ({})",
            d.vocab, t.vocab
        )));
    }
    if t.hybrid.is_some() || d.hybrid.is_some() {
        return Err(Error::InvalidArgument(
            "speculative decoding needs attention-only models (a hybrid's recurrent state \
             cannot be cut back after a rejected draft)"
                .into(),
        ));
    }
    Ok(())
}

/// How much drafting to do per target pass.
#[derive(Clone, Copy, Debug)]
pub struct DraftOptions {
    /// Draft tokens at most.
    pub max: usize,
    /// The draft stops proposing once its own best token is less likely than this (llama.cpp's
    /// `--draft-p-min`): unlikely guesses cost target work and are rarely accepted.
    pub p_min: f32,
}

/// [`generate`](super::generate) with `draft` proposing tokens for each target pass.
pub fn generate_speculative(
    target: &mut Session,
    draft: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    draft_opts: DraftOptions,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Generation, DraftStats)> {
    check_draft(target, draft)?;
    check_context(prompt.len(), opts.max_tokens, target.n_ctx())?;
    let n_ctx = target.n_ctx().min(draft.n_ctx());
    let vocab = target.model().config().vocab;
    let mut decoding = Decoding::new(prompt, opts)?;
    let mut stats = DraftStats::default();
    let (mut rows, mut out) = Generation::after_prefill(target, prompt)?;
    let t1 = Instant::now();
    // `rows` holds the target's logits for the positions after `base` cached tokens; the
    // first `proposed.len()` of them are followed by the draft's tokens.
    let mut proposed: Vec<u32> = Vec::new();
    'decode: loop {
        let base = target.tokens().len() - proposed.len();
        let mut next = None;
        for i in 0..=proposed.len() {
            let row = &mut rows[i * vocab..(i + 1) * vocab];
            let step = decoding.step(row, tokenizer, base + i, n_ctx);
            let token = step.token;
            if out.record(step, &mut decoding, tokenizer, on_text) {
                // As after plain generation: the cache holds what was fed before this row.
                target.truncate(base + i);
                break 'decode;
            }
            let tok = token.expect("a step that did not finish has a token");
            if i < proposed.len() && tok == proposed[i] {
                stats.accepted += 1;
                continue;
            }
            // The target picked otherwise (or the draft was used up): the cache keeps the
            // accepted draft tokens only.
            target.truncate(base + i);
            next = Some(tok);
            break;
        }
        let tok = next.expect("the loop above ends with a token or finishes");
        // Draft up to n_draft tokens after `tok`, within the context and the token budget.
        let history: Vec<u32> = target.tokens().iter().copied().chain([tok]).collect();
        let room = n_ctx.saturating_sub(history.len() + 1);
        let budget = opts.max_tokens.saturating_sub(decoding.generated());
        let k = draft_opts.max.min(room).min(budget.saturating_sub(1));
        proposed = if k > 0 {
            draft_tokens(draft, &history, k, draft_opts.p_min)?
        } else {
            Vec::new()
        };
        stats.drafted += proposed.len();
        let feed: Vec<u32> = [tok].into_iter().chain(proposed.iter().copied()).collect();
        rows = target.eval_all(&feed)?;
        stats.target_passes += 1;
    }
    out.gen_secs = t1.elapsed().as_secs_f64();
    Ok((out, stats))
}

/// Up to `k` tokens the draft proposes after `history` (greedily; it stops once its best
/// token's probability is below `p_min`). The draft's cache keeps what it shares with
/// `history` from its previous call.
pub(crate) fn draft_tokens(
    draft: &mut Session,
    history: &[u32],
    k: usize,
    p_min: f32,
) -> Result<Vec<u32>> {
    let mut proposed = Vec::with_capacity(k);
    let mut logits = draft.prefill(history)?;
    for j in 0..k {
        let d = argmax(&logits);
        if top_probability(&logits, d) < p_min {
            break;
        }
        proposed.push(d);
        if j + 1 < k {
            logits = draft.step(d)?;
        }
    }
    Ok(proposed)
}

/// The softmax probability of `best` (the row's largest logit).
fn top_probability(logits: &[f32], best: u32) -> f32 {
    let m = logits[best as usize];
    let z: f32 = logits.iter().map(|&l| (l - m).exp()).sum();
    1.0 / z
}
