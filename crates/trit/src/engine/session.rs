//! A session owns one sequence's KV cache and remembers which tokens it holds, so a new
//! request evaluates only what follows the longest common prefix with the cache
//! (multi-turn chat re-sends the whole history; only the new turn is computed).

use crate::model::{DeviceLoopRun, DevicePick, KvCache, Logits, Model};
use crate::sample::RowLogits;
use crate::{Error, Result};
use std::sync::Arc;

/// Prompt tokens evaluated per forward call (bounds scratch memory for long prompts).
const PREFILL_CHUNK: usize = 512;

pub struct Session {
    model: Arc<Model>,
    cache: KvCache,
    tokens: Vec<u32>,
    last_evaluated: usize,
}

impl Session {
    pub fn new(model: Arc<Model>, n_ctx: usize) -> Self {
        let cache = model.new_cache(n_ctx);
        Session {
            model,
            cache,
            tokens: Vec::new(),
            last_evaluated: 0,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn n_ctx(&self) -> usize {
        self.cache.capacity()
    }

    /// Tokens whose keys/values the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Prompt tokens actually computed by the last `prefill` (the rest came from the cache).
    pub fn last_evaluated(&self) -> usize {
        self.last_evaluated
    }

    /// Whether the cache holds a recurrent state (hybrid models), which cannot be cut back to
    /// an arbitrary position.
    pub fn is_recurrent(&self) -> bool {
        self.cache.has_recurrent()
    }

    /// Drops the cached tokens after the first `len`: an attention-only cache keeps exactly
    /// `len` (the kept positions' keys and values stay valid); a hybrid model's cache rolls
    /// back to its snapshot (the prompt's last token but one) or to nothing when that lies
    /// beyond `len` — `tokens()` says what is left.
    pub fn truncate(&mut self, len: usize) {
        self.cache.truncate(len.min(self.tokens.len()));
        self.tokens.truncate(self.cache.len());
    }

    pub fn reset(&mut self) {
        self.cache.clear();
        self.tokens.clear();
    }

    /// Brings the cache to exactly `prompt` and returns the logits after its last token.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        if prompt.len() > self.n_ctx() {
            return Err(Error::ContextOverflow {
                n_prompt: prompt.len(),
                n_ctx: self.n_ctx(),
            });
        }
        let mut common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token must be evaluated to get its logits.
        common = common.min(prompt.len() - 1);
        // A hybrid model's recurrent state may only roll back to its snapshot (or to the
        // start): the cache says how much it kept.
        self.cache.truncate(common);
        let kept = self.cache.len();
        self.tokens.truncate(kept);
        self.last_evaluated = 0;
        let mut logits = Vec::new();
        // Recurrent caches snapshot before the prompt's last token: the next request usually
        // extends this prompt (chat) or repeats it (regenerate), and either resumes there.
        let body = if self.cache.has_recurrent() {
            prompt.len() - 1
        } else {
            prompt.len()
        };
        for chunk in prompt[kept..body.max(kept)].chunks(PREFILL_CHUNK) {
            logits = self.eval(chunk, Logits::Last)?;
        }
        if body < prompt.len() {
            self.cache.checkpoint();
            logits = self.eval(&prompt[body..], Logits::Last)?;
        }
        Ok(logits)
    }

    /// Appends one generated token and returns the next logits.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let logits = self.eval(&[token], Logits::Last)?;
        self.last_evaluated -= 1;
        Ok(logits)
    }

    /// [`step`](Self::step) for a sampler that needs only the `k` best candidates: a device
    /// backend may return just those (see [`Model::forward_top`]).
    pub fn step_top(&mut self, token: u32, k: usize) -> Result<RowLogits> {
        let row = self.run(&[token], |m, t, c| m.forward_top(t, c, k))?;
        self.last_evaluated -= 1;
        Ok(row)
    }

    /// Decoding on the device from `first` ([`Model::decode_on_device`]): at most `max_steps`
    /// tokens fed (and the context's room), each picked by `pick`; each produced token goes to
    /// `accept` with whether its pick drew from the generator (false: not fed, the run ends;
    /// always for a token of `stop`); the fed tokens join the books. `Ok(None)`: the model has
    /// no such loop, nothing ran.
    pub fn decode_on_device(
        &mut self,
        first: u32,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        let room = self.n_ctx().saturating_sub(self.cache.len()).min(max_steps);
        if room == 0 {
            return Ok(None);
        }
        let mut offered = Vec::new();
        let result = self.model.decode_on_device(
            first,
            &mut self.cache,
            room,
            pick,
            stop,
            &mut |t, drew| {
                offered.push(t);
                accept(t, drew)
            },
        );
        match result {
            Ok(Some(run)) => {
                let fed_after_first = run.fed.saturating_sub(1).min(offered.len());
                self.tokens.push(first);
                self.tokens.extend_from_slice(&offered[..fed_after_first]);
                debug_assert_eq!(self.tokens.len(), self.cache.len());
                Ok(Some(run))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.cache.truncate(self.tokens.len());
                Err(e)
            }
        }
    }

    /// Writes the tokens this session holds, their keys and values (and a hybrid model's
    /// recurrent state) to `path`, with the caller's `extra` data beside them (see
    /// [`state_file`](super::state_file)).
    pub fn save_state(&self, path: &std::path::Path, extra: serde_json::Value) -> Result<()> {
        super::state_file::save(self, path, extra)
    }

    /// Replaces this session's cache by one saved with [`save_state`](Self::save_state) by the
    /// same model (checked: shapes, cache types, and the first token's keys recomputed); the
    /// next prompt that starts with the saved tokens evaluates only the rest. On error the
    /// session is unchanged.
    pub fn load_state(&mut self, path: &std::path::Path) -> Result<super::LoadedState> {
        super::state_file::load(self, path)
    }

    pub(crate) fn state_parts(&self) -> (&KvCache, &[u32]) {
        (&self.cache, &self.tokens)
    }

    pub(crate) fn restore_state(&mut self, cache: KvCache, tokens: Vec<u32>) {
        debug_assert_eq!(cache.len(), tokens.len());
        self.cache = cache;
        self.tokens = tokens;
        self.last_evaluated = 0;
    }

    /// Evaluates tokens after the cache and returns logits for every one (perplexity).
    pub fn eval_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.eval(tokens, Logits::All)
    }

    fn eval(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.run(tokens, |m, t, c| m.forward(t, c, which))
    }

    /// Runs `forward` over `tokens` after the cache and keeps the books either way.
    fn run<T>(
        &mut self,
        tokens: &[u32],
        forward: impl FnOnce(&Model, &[u32], &mut KvCache) -> Result<T>,
    ) -> Result<T> {
        let result = forward(&self.model, tokens, &mut self.cache);
        match result {
            Ok(l) => {
                self.tokens.extend_from_slice(tokens);
                self.last_evaluated += tokens.len();
                Ok(l)
            }
            Err(e) => {
                // A failed forward may have appended part of a layer; drop it.
                self.cache.truncate(self.tokens.len());
                Err(e)
            }
        }
    }
}
