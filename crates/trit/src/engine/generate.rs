//! The generation loop: prefill (with prefix reuse), then sample → stream → step until an
//! EOS token, a stop string, `max_tokens`, or the end of the context.

use super::sequence::{Decoding, Step};
use super::session::Session;
use crate::model::DevicePick;
use crate::sample::{ConstrainedOutput, RowLogits, SamplingParams, TOP_CANDIDATES};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops before any of these strings; they are not part of the output.
    pub stop: Vec<String>,
    /// Tokens that end generation (not emitted).
    pub eos: Vec<u32>,
    /// Constrained decoding: the output must be a JSON document of a schema, or a string of a
    /// GBNF grammar.
    pub constraint: Option<ConstrainedOutput>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS token or stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Cancelled => "length",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens computed (the others were reused from the session's cache).
    pub prompt_evaluated: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
    /// Context shifts during generation ([`ContextShift`]) and the tokens they read again.
    pub shifts: usize,
    pub shift_tokens: usize,
}

impl Generation {
    /// Prefills `prompt` and starts the record; returns the logits after it.
    pub(crate) fn after_prefill(session: &mut Session, prompt: &[u32]) -> Result<(Vec<f32>, Self)> {
        let t0 = Instant::now();
        let logits = session.prefill(prompt)?;
        let out = Generation {
            text: String::new(),
            tokens: Vec::new(),
            finish: FinishReason::Length,
            prompt_tokens: prompt.len(),
            prompt_evaluated: session.last_evaluated(),
            prompt_secs: t0.elapsed().as_secs_f64(),
            gen_secs: 0.0,
            shifts: 0,
            shift_tokens: 0,
        };
        Ok((logits, out))
    }

    /// Records a step: its token and text, passed on to `on_text` (which may cancel). Returns
    /// whether generation has finished.
    pub(crate) fn record(
        &mut self,
        mut step: Step,
        decoding: &mut Decoding,
        tokenizer: &Tokenizer,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> bool {
        self.tokens.extend(step.token);
        if !step.text.is_empty() {
            self.text.push_str(&step.text);
            if !on_text(&step.text) && step.finish.is_none() {
                step = decoding.cancel(tokenizer);
                self.text.push_str(&step.text);
                on_text(&step.text);
            }
        }
        match step.finish {
            Some(f) => {
                self.finish = f;
                true
            }
            None => false,
        }
    }

    pub fn prompt_tps(&self) -> f64 {
        self.prompt_evaluated as f64 / self.prompt_secs.max(1e-9)
    }

    /// Decode speed over the steps after the first token (whose time is the prefill's).
    pub fn gen_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.gen_secs.max(1e-9)
    }
}

/// Refuses a request that cannot fit before any compute (llama.cpp's wording).
pub fn check_context(prompt: usize, max_tokens: usize, n_ctx: usize) -> Result<()> {
    if prompt + max_tokens > n_ctx || prompt >= n_ctx {
        return Err(Error::ContextOverflow {
            n_prompt: prompt + max_tokens,
            n_ctx,
        });
    }
    Ok(())
}

/// llama.cpp's context shift (`--context-shift`, `--keep`): when a generation fills the
/// context, the first `keep` tokens stay, the older half of the rest is dropped, and the kept
/// tokens are read again (the first `keep` positions straight from the cache) before
/// generation goes on. The model then sees exactly the kept tokens, as a fresh request with
/// them would (llama.cpp instead re-rotates the cached keys in place: cheaper, the same up to
/// rounding); a hybrid's recurrent state is rebuilt the same way, which llama.cpp refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextShift {
    pub keep: usize,
}

impl ContextShift {
    /// What a full sequence keeps: its first `keep` tokens, then the newer half of the rest
    /// (llama.cpp's `n_discard = (n_past - n_keep) / 2`).
    pub fn kept(&self, tokens: &[u32]) -> Vec<u32> {
        let keep = self.keep.min(tokens.len());
        let discard = (tokens.len() - keep) / 2;
        let mut kept = tokens[..keep].to_vec();
        kept.extend_from_slice(&tokens[keep + discard..]);
        kept
    }

    /// Whether a shift frees room in a context of `n_ctx` (at least one token must go, and the
    /// kept ones plus the next must fit).
    pub fn frees_room(&self, n_ctx: usize) -> bool {
        self.keep + 2 <= n_ctx
    }

    /// Refuses a shift that could free no room in a context of `n_ctx`.
    fn check(&self, n_ctx: usize) -> Result<()> {
        if !self.frees_room(n_ctx) {
            return Err(Error::InvalidArgument(format!(
                "context shift: keeping {} tokens leaves no room in a context of {n_ctx}",
                self.keep
            )));
        }
        Ok(())
    }
}

/// Generates after `prompt`. `on_text` receives text pieces as they become final (complete
/// UTF-8 characters, never part of a stop string) and returns false to cancel.
pub fn generate(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    generate_shifting(session, tokenizer, prompt, opts, None, on_text)
}

/// [`generate`], with a [`ContextShift`] when the context fills instead of finishing there
/// (`max_tokens` may then exceed the context).
pub fn generate_shifting(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    shift: Option<ContextShift>,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    let n_ctx = session.n_ctx();
    match shift {
        None => check_context(prompt.len(), opts.max_tokens, n_ctx)?,
        Some(s) => {
            check_context(prompt.len(), 0, n_ctx)?;
            s.check(n_ctx)?;
        }
    }
    // Where the sampler sees the sequence's end: the context's, or none when it shifts.
    let limit = if shift.is_some() { usize::MAX } else { n_ctx };
    let mut decoding = Decoding::new(prompt, opts)?;
    let (logits, mut out) = Generation::after_prefill(session, prompt)?;
    let mut row = RowLogits::Full(logits);
    let t1 = Instant::now();
    loop {
        let step = decoding.step_row(
            std::mem::replace(&mut row, RowLogits::Full(Vec::new())),
            tokenizer,
            session.tokens().len(),
            limit,
        );
        let token = step.token;
        if out.record(step, &mut decoding, tokenizer, on_text) {
            break;
        }
        let Some(mut tok) = token else { break };
        // A device backend may pick the next tokens itself (greedy, or the sampler's rule on
        // the best candidates): then the host only reads them. Its run ends at the context's
        // end with the last token pending.
        if let Some(pick) = decoding.device_pick() {
            match on_device(
                session,
                tokenizer,
                tok,
                &pick,
                limit,
                &mut decoding,
                &mut out,
                on_text,
            )? {
                DeviceRun::Finished => break,
                DeviceRun::Feed(t) => tok = t,
            }
        }
        if let Some(s) = shift.filter(|_| session.tokens().len() >= n_ctx) {
            let kept = s.kept(session.tokens());
            session.prefill(&kept)?;
            out.shifts += 1;
            out.shift_tokens += session.last_evaluated();
        }
        // A sampler that needs only the best candidates gets only those from a device backend
        // (the GPU reduces the row; a few hundred bytes cross instead of the vocabulary).
        row = if decoding.exact_on_top(TOP_CANDIDATES) {
            session.step_top(tok, TOP_CANDIDATES)?
        } else {
            RowLogits::Full(session.step(tok)?)
        };
    }
    out.gen_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// How a run of the device loop ended.
enum DeviceRun {
    /// The sequence finished (or the run did nothing left to do).
    Finished,
    /// This token still has to be fed: the model has no device loop, or its step budget ran
    /// out after the token was recorded.
    Feed(u32),
}

/// Feeds `first` and the tokens after it through the model's device loop where it has one
/// ([`Session::decode_on_device`]), recording each produced token as the host's sampler would
/// (same stops, same text, the generator advanced by the device's draws). `limit`: where the
/// sequence ends (the context's end, or nowhere when the context shifts).
#[allow(clippy::too_many_arguments)]
fn on_device(
    session: &mut Session,
    tokenizer: &Tokenizer,
    first: u32,
    pick: &DevicePick,
    limit: usize,
    decoding: &mut Decoding,
    out: &mut Generation,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<DeviceRun> {
    let base = session.tokens().len();
    // Steps up to the length limit (so none runs past it), EOS ids for the device to act on.
    let (left, stop) = (decoding.tokens_left(), decoding.eos().to_vec());
    let mut finished = false;
    let mut offered = 0;
    let run = session.decode_on_device(first, left, pick, &stop, &mut |t, drew| {
        offered += 1;
        // The cache then holds `first` and the tokens offered before `t`.
        let step = decoding.step_token(t, drew, tokenizer, base + offered, limit);
        finished = out.record(step, decoding, tokenizer, on_text);
        !finished
    })?;
    Ok(match run {
        None => DeviceRun::Feed(first),
        Some(_) if finished => DeviceRun::Finished,
        Some(r) => r.pending.map_or(DeviceRun::Finished, DeviceRun::Feed),
    })
}

/// Holds back streamed text that could be the start of a stop string.
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub(crate) fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Returns (text safe to emit, whether a stop string was found).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let ready = self.held[..at].to_string();
            self.held.clear();
            return (ready, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in self.held.char_indices() {
                let suffix = &self.held[i..];
                if s.starts_with(suffix) {
                    keep = keep.max(suffix.len());
                    break;
                }
            }
        }
        let cut = self.held.len() - keep;
        let ready = self.held[..cut].to_string();
        self.held.drain(..cut);
        (ready, false)
    }

    pub(crate) fn take_held(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_prefixes_and_cuts_at_stop() {
        let mut m = StopMatcher::new(&["</s>".to_string(), "\n\n".to_string()]);
        assert_eq!(m.push("Hello <"), ("Hello ".to_string(), false));
        assert_eq!(m.push("/"), (String::new(), false));
        assert_eq!(m.push("b> x"), ("</b> x".to_string(), false));
        assert_eq!(m.push(" end</"), (" end".to_string(), false));
        assert_eq!(m.push("s> more"), (String::new(), true));
        let mut m = StopMatcher::new(&["\n\n".to_string()]);
        assert_eq!(m.push("a\n"), ("a".to_string(), false));
        assert_eq!(m.push("\nb"), (String::new(), true));
    }

    #[test]
    fn context_check_uses_llama_cpp_wording() {
        assert!(check_context(10, 20, 30).is_ok());
        let e = check_context(9000, 214, 8192).unwrap_err();
        assert_eq!(
            e.to_string(),
            "request (9214 tokens) exceeds the available context size (8192 tokens), try increasing it"
        );
        assert!(check_context(30, 0, 30).is_err());
    }
}
