//! A lone decoding sequence on a backend with a device loop (the GPU): the device picks the
//! next tokens itself ([`Model::decode_on_device`](crate::model::Model::decode_on_device)),
//! several steps in flight, and the scheduler only reads them — what `trit run` does, so one
//! client of `trit serve` decodes at `trit run`'s speed. A request arriving meanwhile ends the
//! loop at the next token, and the sequences then share batched steps as usual.

use super::{deliver, Running, Worker};
use crate::Error;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Most tokens one loop feeds: the scheduler's gauges are published between loops. An
/// arriving request or a cancelled listener ends a loop at once.
const DEVICE_LOOP_STEPS: usize = 64;

/// What one loop produced, for the counters.
#[derive(Default)]
struct LoopTally {
    predicted: u64,
    cancelled: u64,
}

impl Worker {
    /// Runs the only sequence's next tokens on the device where it can (decoding, a rule the
    /// device applies, a backend with a loop for its slot). False: nothing ran, the batched
    /// step follows.
    pub(super) fn step_on_device(&mut self) -> bool {
        let [r] = &mut self.running[..] else {
            return false;
        };
        let Some(first) = r.next else {
            return false;
        };
        if r.prompt_done < r.req.prompt.len() || r.cache.has_recurrent() {
            return false;
        }
        let Some(pick) = r.decoding.device_pick() else {
            return false;
        };
        let room = self.n_ctx.saturating_sub(r.cache.len());
        let steps = r.decoding.tokens_left().min(DEVICE_LOOP_STEPS).min(room);
        if steps == 0 {
            return false;
        }
        let t0 = Instant::now();
        let base = r.tokens.len();
        let eos = r.decoding.eos().to_vec();
        // Requests in the channel, not yet in the queue, are the ones that can still join.
        let (waiting, queued) = (&self.waiting, self.queue.len());
        let (tokenizer, limit) = (&self.tokenizer, r.limit(self.n_ctx));
        let mut offered: Vec<u32> = Vec::new();
        let mut tally = LoopTally::default();
        let mut finish = None;
        // A token recorded and refused because a request arrived: fed by the batched step.
        let mut resume = None;
        let Running {
            req,
            decoding,
            cache,
            ..
        } = r;
        let result =
            self.model
                .decode_on_device(first, cache, steps, &pick, &eos, &mut |t, drew| {
                    offered.push(t);
                    // The cache then holds `first` and the tokens offered before `t`.
                    let step = decoding.step_token(t, drew, tokenizer, base + offered.len(), limit);
                    tally.predicted += step.token.is_some() as u64;
                    let (step, gone) = deliver(&mut *req.sink, decoding, step, tokenizer);
                    tally.cancelled += gone as u64;
                    if step.finish.is_some() {
                        finish = step.finish;
                        return false;
                    }
                    if waiting.load(Ordering::SeqCst) > queued {
                        resume = Some(t);
                        return false;
                    }
                    true
                });
        let run = match result {
            Ok(Some(run)) => run,
            Ok(None) => return false,
            Err(e) => {
                self.fail_batch(&[vec![first]], e);
                return true;
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let r = &mut self.running[0];
        let fed_after_first = run.fed.saturating_sub(1).min(offered.len());
        r.tokens.push(first);
        r.tokens.extend_from_slice(&offered[..fed_after_first]);
        debug_assert_eq!(r.tokens.len(), r.cache.len());
        r.next = match finish {
            Some(_) => None,
            None => run.pending.or(resume),
        };
        self.publish(|st| {
            st.n_decode_total += run.fed as u64;
            st.tokens_predicted_total += tally.predicted;
            st.tokens_predicted_seconds_total += secs;
            st.cancelled_total += tally.cancelled;
        });
        if let Some(finish) = finish {
            let r = self.running.swap_remove(0);
            self.retire(r, finish);
        } else if self.running[0].next.is_none() {
            // A backend's loop that ended with nothing to feed and no reason: an error, not a
            // sequence that waits forever.
            let e = Error::Unsupported("the device loop stopped without its next token".into());
            self.fail_batch(&[vec![first]], e);
        }
        true
    }
}
