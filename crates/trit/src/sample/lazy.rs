//! Lazy constraints (llama.cpp's lazy grammars, which its server uses for tool calls): the
//! output is free until a trigger text appears; from the trigger's first byte it must follow a
//! language — a call of one of the request's tools, say — until that string is done, and then
//! it is free again (or, with `once`, only the end may follow). A trigger inside a quiet region
//! (a `<think>` … `</think>` block) does not count. A token that completes a trigger must also
//! fit the language with whatever bytes it carries after the trigger, so the output never holds
//! a trigger the language refuses to continue.

use super::constraint::{draw, ByteLanguage, Constrain, Follow, OutputRule};
use super::token_table::TokenTable;
use super::Sampler;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The longest trigger or quiet-region delimiter.
const MAX_PATTERN: usize = 32;
/// Triggers one rule may have.
const MAX_TRIGGERS: usize = 16;

/// Where a lazy constraint starts to bind, and what binds then.
#[derive(Clone, Debug)]
pub struct LazyRule {
    /// Any of these starts the language (each is a prefix of its strings).
    triggers: Vec<Vec<u8>>,
    rule: OutputRule,
    quiet: Option<(Vec<u8>, Vec<u8>)>,
    starts_quiet: bool,
    once: bool,
}

impl LazyRule {
    /// Free output until `trigger`; from its first byte the output follows `rule`, whose strings
    /// must start with the trigger.
    pub fn new(trigger: &str, rule: OutputRule) -> Result<LazyRule> {
        LazyRule::with_triggers(&[trigger], rule)
    }

    /// Free output until any of `triggers` (llama.cpp's `grammar_triggers` words).
    pub fn with_triggers(triggers: &[&str], rule: OutputRule) -> Result<LazyRule> {
        if triggers.is_empty() || triggers.len() > MAX_TRIGGERS {
            return Err(Error::InvalidArgument(format!(
                "a lazy rule needs 1 to {MAX_TRIGGERS} triggers, not {}",
                triggers.len()
            )));
        }
        for trigger in triggers {
            check_pattern("trigger", trigger)?;
            let starts = match &rule {
                OutputRule::Json(s) => starts_with(&**s, trigger.as_bytes()),
                OutputRule::Grammar(g) => starts_with(&**g, trigger.as_bytes()),
                OutputRule::Lazy(_) => {
                    return Err(Error::InvalidArgument(
                        "a lazy rule cannot hold another lazy rule".into(),
                    ))
                }
            };
            if !starts {
                return Err(Error::InvalidArgument(format!(
                    "the lazy rule's language does not start with its trigger {trigger:?}"
                )));
            }
        }
        Ok(LazyRule {
            triggers: triggers.iter().map(|t| t.as_bytes().to_vec()).collect(),
            rule,
            quiet: None,
            starts_quiet: false,
            once: false,
        })
    }

    /// Triggers between `open` and `close` do not count; `inside`: the output starts inside
    /// such a region (a template that opened the thinking block itself).
    pub fn quiet_between(mut self, open: &str, close: &str, inside: bool) -> Result<LazyRule> {
        check_pattern("quiet region's opening", open)?;
        check_pattern("quiet region's closing", close)?;
        self.quiet = Some((open.as_bytes().to_vec(), close.as_bytes().to_vec()));
        self.starts_quiet = inside;
        Ok(self)
    }

    /// `true`: after one string of the rule, only the end may follow.
    pub fn once(mut self, once: bool) -> LazyRule {
        self.once = once;
        self
    }

    /// The language that binds after the trigger.
    pub fn rule(&self) -> &OutputRule {
        &self.rule
    }
}

fn check_pattern(what: &str, p: &str) -> Result<()> {
    if p.is_empty() || p.len() > MAX_PATTERN {
        return Err(Error::InvalidArgument(format!(
            "a lazy rule's {what} must be 1 to {MAX_PATTERN} bytes, not {}",
            p.len()
        )));
    }
    Ok(())
}

fn starts_with<L: ByteLanguage>(lang: &L, prefix: &[u8]) -> bool {
    lang.feed_all(lang.start(), prefix).is_some()
}

/// The last bytes of free output (enough to see a pattern that spans tokens) and whether they
/// are inside a quiet region. Copied per token tried, so kept inline.
#[derive(Clone, Copy)]
struct Watch {
    recent: [u8; 2 * MAX_PATTERN],
    len: usize,
    quiet: bool,
}

impl Watch {
    fn new(quiet: bool) -> Watch {
        Watch {
            recent: [0; 2 * MAX_PATTERN],
            len: 0,
            quiet,
        }
    }

    fn push(&mut self, b: u8) {
        if self.len == self.recent.len() {
            // Shift once per MAX_PATTERN bytes; the last MAX_PATTERN are all a match needs.
            self.recent.copy_within(MAX_PATTERN.., 0);
            self.len = MAX_PATTERN;
        }
        self.recent[self.len] = b;
        self.len += 1;
    }

    fn ends_with(&self, p: &[u8]) -> bool {
        self.recent[..self.len].ends_with(p)
    }

    /// Reads `bytes` of free output; returns the offset just past a trigger that ends inside
    /// them and which one it is (the bytes after it are not read).
    fn read(&mut self, rule: &LazyRule, bytes: &[u8]) -> Option<(usize, usize)> {
        for (i, &b) in bytes.iter().enumerate() {
            self.push(b);
            match &rule.quiet {
                Some((_, close)) if self.quiet && self.ends_with(close) => self.quiet = false,
                Some(_) if self.quiet => {}
                Some((open, _)) if self.ends_with(open) => self.quiet = true,
                _ => {
                    if let Some(t) = rule.triggers.iter().position(|t| self.ends_with(t)) {
                        return Some((i + 1, t));
                    }
                }
            }
        }
        None
    }
}

#[derive(Clone, Copy)]
enum Phase {
    /// Anything may come; watching for the trigger.
    Free(Watch),
    /// Inside a string of the language.
    Bound,
    /// A `once` rule's string is done: only the end.
    Over,
}

/// What a token does to free output.
enum Read<S> {
    /// No trigger ends in it.
    Free,
    /// A trigger does, and the language goes on from this state.
    Bound(S),
    /// A trigger does, and the language refuses the bytes after it.
    Refused,
}

/// One sequence's lazy constraint.
pub struct Lazy<L: ByteLanguage> {
    rule: Arc<LazyRule>,
    follow: Follow<L>,
    phase: Phase,
}

impl<L: ByteLanguage> Lazy<L> {
    /// `lang`: the rule's language; `eos`: the tokens that end the output.
    pub fn new(rule: Arc<LazyRule>, lang: Arc<L>, table: Arc<TokenTable>, eos: Vec<u32>) -> Self {
        let phase = Phase::Free(Watch::new(rule.starts_quiet));
        Lazy {
            rule,
            follow: Follow::new(lang, table, eos),
            phase,
        }
    }

    fn read(&self, watch: &mut Watch, bytes: &[u8]) -> Read<L::State> {
        let Some((end, which)) = watch.read(&self.rule, bytes) else {
            return Read::Free;
        };
        let mut text = self.rule.triggers[which].clone();
        text.extend_from_slice(&bytes[end..]);
        match self.follow.state_after(&text) {
            Some(st) => Read::Bound(st),
            None => Read::Refused,
        }
    }

    /// Whether `tok` may come next.
    pub fn allows(&self, tok: u32) -> bool {
        let eos = self.follow.eos().contains(&tok);
        match self.phase {
            Phase::Over => eos,
            Phase::Bound => self.follow.allows(tok),
            Phase::Free(mut watch) => match self.follow.table().get(tok) {
                // Tokens without bytes (the end, special tokens) cannot write a trigger.
                _ if eos => true,
                None => true,
                Some(bytes) => !matches!(self.read(&mut watch, bytes), Read::Refused),
            },
        }
    }

    /// Sets every token that may not come next to −∞; returns how many may. In free output
    /// only tokens that would complete a trigger the language refuses are masked; this runs
    /// only when the sampler drew one.
    pub fn mask(&self, logits: &mut [f32]) -> usize {
        if let Phase::Bound = self.phase {
            return self.follow.mask(logits);
        }
        let mut allowed = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if self.allows(id as u32) {
                allowed += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        allowed
    }

    /// Leaves the language's string once it is done.
    fn after_bound(&mut self) {
        if self.follow.is_done() {
            self.phase = if self.rule.once {
                Phase::Over
            } else {
                Phase::Free(Watch::new(false))
            };
        }
    }
}

impl<L: ByteLanguage> Constrain for Lazy<L> {
    fn is_complete(&self) -> bool {
        match self.phase {
            Phase::Bound => self.follow.is_complete(),
            Phase::Free(_) | Phase::Over => true,
        }
    }

    fn sample(&self, sampler: &mut Sampler, logits: &mut [f32], history: &[u32]) -> Option<u32> {
        if let Phase::Over = self.phase {
            return self.follow.eos().first().copied();
        }
        draw(
            |t| self.allows(t),
            |row| self.mask(row),
            sampler,
            logits,
            history,
        )
    }

    fn advance(&mut self, tok: u32) {
        match self.phase {
            Phase::Over => {}
            Phase::Bound => {
                self.follow.advance(tok);
                self.after_bound();
            }
            Phase::Free(mut watch) => {
                let Some(bytes) = self.follow.table().get(tok) else {
                    return;
                };
                match self.read(&mut watch, bytes) {
                    Read::Free => self.phase = Phase::Free(watch),
                    Read::Bound(st) => {
                        self.follow.resume(st);
                        self.phase = Phase::Bound;
                        self.after_bound();
                    }
                    // Only a token the constraint refused lands here (callers advance by
                    // allowed ones): the output stays free after it.
                    Read::Refused => self.phase = Phase::Free(Watch::new(false)),
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "lazy_tests.rs"]
mod tests;
