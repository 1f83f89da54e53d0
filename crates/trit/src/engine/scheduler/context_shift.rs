//! llama.cpp's context shift in the server (`trit serve --context-shift`): a sequence whose
//! cache is full and that has a token to feed keeps its first `keep` tokens and the newer half
//! of the rest ([`ContextShift::kept`]), and reads the kept tokens that left the cache again,
//! with the pending token last, as it read its prompt (chunks under the step's prompt budget,
//! batched with the others). The last row's logits then give the next token, so the model sees
//! exactly the kept window, as `generate_shifting` (`trit run --context-shift`) does. A cache
//! cut keeps its blocks before `keep` (shared prefix blocks stay shared); a hybrid's recurrent
//! state cannot be cut back, so it restarts and reads the whole window.

use super::{ContextShift, KvCache, Running, SeqRequest, Worker};

impl Worker {
    /// The shift a new sequence gets: the configured one, with the request's own keep if it
    /// gives one, capped at the prompt — where it can free room and the cache can be cut back
    /// (not a device backend's recurrent slot, whose state lives on the device).
    pub(super) fn shift_for(&self, req: &SeqRequest, cache: &KvCache) -> Option<ContextShift> {
        let s = self.context_shift?;
        let shift = ContextShift {
            keep: req.keep.unwrap_or(s.keep).min(req.prompt.len()),
        };
        let device_state = cache.has_recurrent() && cache.device_slot().is_some();
        (shift.frees_room(self.n_ctx) && !device_state).then_some(shift)
    }

    /// Shifts every sequence whose cache is full and whose next token has nowhere to go.
    pub(super) fn shift_full_sequences(&mut self) {
        let n_ctx = self.n_ctx;
        for r in &mut self.running {
            if let (Some(shift), Some(token)) = (r.shift, r.next) {
                if r.tokens.len() >= n_ctx {
                    shift_one(r, shift, token);
                }
            }
        }
    }
}

fn shift_one(r: &mut Running, shift: ContextShift, token: u32) {
    let kept = shift.kept(&r.tokens);
    r.cache.truncate(shift.keep);
    // A recurrent cache may keep fewer positions (none): read the rest.
    let from = r.cache.len();
    r.tokens.truncate(from);
    r.refeed = kept[from..].to_vec();
    r.refeed.push(token);
    r.next = None;
    // The prompt checkpoint's position is gone from this sequence.
    r.checkpoint_at = 0;
    r.checkpoint = None;
}
