//! Speculative decoding in the server (`trit serve --model-draft`): while one sequence runs
//! alone and decodes, each step drafts up to `DraftOptions::max` tokens with the draft model
//! (its own cache per sequence, kept between steps like `run`'s draft session), the model
//! scores the pending token and the drafts in one pass, and the sequence's sampler walks the
//! rows: each draft it would have picked anyway is accepted, the first it would not is
//! replaced by its own pick and the rest of the cache is cut back — what `generate_speculative`
//! does, so the reply is the same as without a draft (same seed, same text). With several
//! sequences running the batched step serves them all (drafting each would multiply the passes
//! the batch shares). Attention-only models on the CPU: a recurrent state or a device slot
//! cannot be cut back after a rejected draft.

use super::{deliver, Running, Worker};
use crate::engine::speculative::{check_draft_models, draft_tokens, DraftOptions};
use crate::engine::Session;
use crate::model::kv_cache::BLOCK_TOKENS;
use crate::model::{Logits, Model};
use crate::Error;
use std::sync::Arc;
use std::time::Instant;

/// The draft model and how much it drafts per pass of the model.
#[derive(Clone)]
pub struct Draft {
    pub model: Arc<Model>,
    pub options: DraftOptions,
}

impl std::fmt::Debug for Draft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.model.config();
        f.debug_struct("Draft")
            .field("layers", &c.n_layers)
            .field("vocab", &c.vocab)
            .field("options", &self.options)
            .finish()
    }
}

impl Draft {
    /// Whether this draft can propose tokens for `target` in the scheduler: the same
    /// vocabulary, attention-only models, a target on the CPU.
    pub fn check(&self, target: &Model) -> crate::Result<()> {
        check_draft_models(target, &self.model)?;
        if !target.shares_prefixes() {
            return Err(Error::InvalidArgument(
                "speculative decoding in the server runs on the CPU (a GPU model keeps its \
                 keys/values in device slots)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// What one drafted step did, for the counters.
#[derive(Default)]
struct Tally {
    predicted: u64,
    cancelled: u64,
    drafted: u64,
    accepted: u64,
}

impl Worker {
    /// A drafted step for the only sequence where it can take one. False: nothing ran.
    pub(super) fn step_drafted(&mut self) -> bool {
        let Some(draft) = self.draft.clone() else {
            return false;
        };
        let n_ctx = self.n_ctx;
        let [r] = &mut self.running[..] else {
            return false;
        };
        let Some(first) = r.next else {
            return false;
        };
        if r.prompt_done < r.req.prompt.len()
            || !r.refeed.is_empty()
            || r.cache.has_recurrent()
            || r.cache.device_slot().is_some()
        {
            return false;
        }
        // As generate_speculative: the drafts and the pending token stay within the context
        // and the token budget.
        let room = n_ctx.saturating_sub(r.tokens.len() + 2);
        let budget = r.decoding.tokens_left().saturating_sub(1);
        let k = draft.options.max.min(room).min(budget);
        if k == 0 {
            return false;
        }
        let t0 = Instant::now();
        // One draft session for whichever sequence runs alone: its prefill reuses what the
        // previous one left in its cache (a chat's earlier turns).
        let session = self
            .draft_session
            .get_or_insert_with(|| Session::new(draft.model.clone(), n_ctx));
        let history: Vec<u32> = r.tokens.iter().copied().chain([first]).collect();
        let proposed = match draft_tokens(session, &history, k, draft.options.p_min) {
            Ok(p) => p,
            Err(e) => {
                self.fail_batch(&[vec![first]], e);
                return true;
            }
        };
        let feed: Vec<u32> = [first]
            .into_iter()
            .chain(proposed.iter().copied())
            .collect();
        let r = &mut self.running[0];
        let rows = match self.model.forward(&feed, &mut r.cache, Logits::All) {
            Ok(rows) => rows,
            Err(e) => {
                self.fail_batch(&[feed], e);
                return true;
            }
        };
        let (finish, tally) = self.walk_rows(&feed, rows);
        let secs = t0.elapsed().as_secs_f64();
        self.publish(|st| {
            st.n_decode_total += 1;
            st.tokens_predicted_total += tally.predicted;
            st.tokens_predicted_seconds_total += secs;
            st.cancelled_total += tally.cancelled;
            st.draft_tokens_total += tally.drafted;
            st.draft_tokens_accepted_total += tally.accepted;
        });
        if let Some(finish) = finish {
            let r = self.running.swap_remove(0);
            self.retire(r, finish);
        }
        true
    }

    /// The sampler over the scored rows of `feed` (the pending token, then the drafts): the
    /// sequence keeps the fed tokens up to the first row whose pick differs from the draft
    /// after it (or that finishes), and that pick is its next token.
    fn walk_rows(
        &mut self,
        feed: &[u32],
        mut rows: Vec<f32>,
    ) -> (Option<super::FinishReason>, Tally) {
        let vocab = self.model.config().vocab;
        let (tokenizer, n_ctx) = (&self.tokenizer, self.n_ctx);
        let r: &mut Running = &mut self.running[0];
        let base = r.tokens.len();
        let mut tally = Tally {
            drafted: feed.len() as u64 - 1,
            ..Tally::default()
        };
        let mut finish = None;
        let mut kept = feed.len();
        for i in 0..feed.len() {
            // The sampler works on the row in place (no copy), as generate_speculative's.
            let row = &mut rows[i * vocab..(i + 1) * vocab];
            let limit = r.limit(n_ctx);
            let step = r.decoding.step(row, tokenizer, base + i + 1, limit);
            tally.predicted += step.token.is_some() as u64;
            let (step, gone) = deliver(&mut *r.req.sink, &mut r.decoding, step, tokenizer);
            tally.cancelled += gone as u64;
            let drafted_next = feed.get(i + 1).copied();
            if step.finish.is_none() && step.token.is_some() && step.token == drafted_next {
                tally.accepted += 1;
                continue;
            }
            // The cache keeps the fed tokens up to this row's.
            kept = i + 1;
            r.next = step.token.filter(|_| step.finish.is_none());
            finish = step.finish;
            break;
        }
        r.cache.truncate(base + kept);
        r.tokens.extend_from_slice(&feed[..kept]);
        if self.share_prefixes && r.tokens.len() / BLOCK_TOKENS > base / BLOCK_TOKENS {
            // Blocks filled up: others may share them from now on.
            self.pool.register(&mut r.cache, &r.tokens, false);
        }
        (finish, tally)
    }
}
