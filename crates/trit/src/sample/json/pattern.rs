//! A string's `pattern` (and the `format`s that have one) as a DFA over the string's bytes.
//! JSON Schema patterns search (they match anywhere unless anchored), so the DFA is built for
//! `.*(?:PATTERN).*` and asked at the closing quote whether the whole content matched. While
//! the string grows, a byte is accepted only if the DFA can still reach a match through bytes
//! a string may hold unescaped (a pattern-constrained string takes no `\` escapes, so its raw
//! bytes are its characters). Unicode classes as Python's `re` (the validator tests use).

use crate::{Error, Result};
use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::syntax;
use regex_automata::{Anchored, Input, MatchKind};
use std::collections::{HashMap, VecDeque};

/// DFA states explored at most (a larger pattern is refused).
const MAX_STATES: usize = 20_000;

const LIVE: u8 = 1;
const ACCEPTS: u8 = 2;

/// One regular expression's DFA, built for `.*(?:PATTERN).*`, and its anchored start state;
/// `negated`: the string must *not* match it (a `not` of a pattern, a format or string values).
#[derive(Clone, Debug)]
struct Part {
    dfa: dense::DFA<Vec<u32>>,
    start: u32,
    negated: bool,
}

/// A negated part's state once its DFA died: the pattern can no longer match, so the part is
/// satisfied whatever follows.
const GONE: u32 = u32::MAX;

/// Every pattern of a string at once (a `pattern` beside an enforced `format`, or the
/// patterns of several `allOf` members, and those a `not` excludes): with one part a state is
/// that DFA's state; with several, or a negated one, a state is an id of the tuple of the
/// parts' states (`tuples`), explored as their product, so the string must match every pattern
/// and none of the negated ones.
#[derive(Clone, Debug)]
pub(crate) struct Pattern {
    parts: Vec<Part>,
    start: u32,
    /// Per reachable state: `LIVE` (a match is still reachable), `ACCEPTS` (the string may end).
    flags: HashMap<u32, u8>,
    /// With several parts: each product state's part states, and the way back.
    tuples: Vec<Vec<u32>>,
    index: HashMap<Vec<u32>, u32>,
}

/// Regular expressions of the `format`s enforced (others are annotations).
pub(crate) fn format_regex(format: &str) -> Option<String> {
    const DATE: &str = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
    const TIME: &str = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?";
    const OCTET: &str = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let body = match format {
        "date" => DATE.to_string(),
        "time" => TIME.to_string(),
        "date-time" => format!("{DATE}T{TIME}"),
        "uuid" => {
            r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".into()
        }
        "email" => r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+".into(),
        "ipv4" => format!(r"({OCTET}\.){{3}}{OCTET}"),
        _ => return None,
    };
    Some(format!("^{body}$"))
}

impl Pattern {
    /// The strings that match every one of `must` and none of `must_not` (at least one
    /// pattern in all).
    pub(crate) fn new(must: &[String], must_not: &[String], at: &str) -> Result<Pattern> {
        let bad = |what: String| Error::InvalidArgument(format!("json schema at {at}: {what}"));
        let mut parts = Vec::new();
        // A positive part keeps the string valid UTF-8 (its DFA dies on a byte that cannot
        // continue it), so a negated part's death means its pattern can no longer match, never
        // an invalid byte: with only negated patterns, the empty pattern (any string) is added.
        let any = [String::new()];
        let must = if must.is_empty() { &any[..] } else { must };
        let wanted = must.iter().map(|p| (p, false));
        for (pattern, negated) in wanted.chain(must_not.iter().map(|p| (p, true))) {
            let wrapped = format!("(?s:.*?)(?:{pattern})(?s:.*)");
            let dfa = dense::Builder::new()
                .configure(
                    dense::Config::new()
                        .match_kind(MatchKind::All)
                        .start_kind(StartKind::Anchored)
                        .dfa_size_limit(Some(16 << 20))
                        .determinize_size_limit(Some(16 << 20)),
                )
                .syntax(syntax::Config::new().utf8(true).unicode(true))
                .build(&wrapped)
                .map_err(|e| bad(format!("pattern {pattern:?} is not supported: {e}")))?;
            let start = dfa
                .start_state_forward(&Input::new("").anchored(Anchored::Yes))
                .map_err(|e| bad(format!("pattern {pattern:?}: {e}")))?;
            parts.push(Part {
                dfa,
                start: start.as_u32(),
                negated,
            });
        }
        assert!(!parts.is_empty(), "Pattern::new without patterns");
        let product = parts.len() > 1 || parts[0].negated;
        let mut p = Pattern {
            start: parts[0].start,
            parts,
            flags: HashMap::new(),
            tuples: Vec::new(),
            index: HashMap::new(),
        };
        if product {
            let starts: Vec<u32> = p.parts.iter().map(|q| q.start).collect();
            p.start = p.intern(starts);
        }
        let not: Vec<String> = must_not.iter().map(|p| format!("not \"{p}\"")).collect();
        let what = must
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| format!("\"{p}\""))
            .chain(not)
            .collect::<Vec<_>>()
            .join(" and ");
        p.explore()
            .map_err(|e| bad(format!("pattern {what}: {e}")))?;
        if !p.is_live(p.start) {
            return Err(bad(format!(
                "pattern {what} admits no string without escapes"
            )));
        }
        Ok(p)
    }

    /// The id of a tuple of part states (product states only).
    fn intern(&mut self, t: Vec<u32>) -> u32 {
        if let Some(&id) = self.index.get(&t) {
            return id;
        }
        let id = self.tuples.len() as u32;
        self.tuples.push(t.clone());
        self.index.insert(t, id);
        id
    }

    /// The state after raw byte `b` from `s`, if no part dies there (interning new product
    /// states while exploring).
    fn step(&mut self, s: u32, b: u8) -> Option<u32> {
        if self.tuples.is_empty() {
            let d = &self.parts[0].dfa;
            let next = d.next_state(Self::id(s), b);
            return (!d.is_dead_state(next) && !d.is_quit_state(next)).then(|| next.as_u32());
        }
        let t = self.next_tuple(s, b)?;
        Some(self.intern(t))
    }

    fn next_tuple(&self, s: u32, b: u8) -> Option<Vec<u32>> {
        let mut t = Vec::with_capacity(self.parts.len());
        for (q, &ps) in self.parts.iter().zip(&self.tuples[s as usize]) {
            if ps == GONE {
                t.push(GONE);
                continue;
            }
            let next = q.dfa.next_state(Self::id(ps), b);
            if q.dfa.is_dead_state(next) {
                if !q.negated {
                    return None;
                }
                t.push(GONE);
                continue;
            }
            if q.dfa.is_quit_state(next) {
                return None;
            }
            t.push(next.as_u32());
        }
        Some(t)
    }

    /// Whether every part is satisfied when the string ends in state `s` (a pattern matched, a
    /// negated one did not).
    fn matches_at_end(&self, s: u32) -> bool {
        let end = |q: &Part, ps: u32| {
            if ps == GONE {
                return true;
            }
            q.dfa.is_match_state(q.dfa.next_eoi_state(Self::id(ps))) != q.negated
        };
        if self.tuples.is_empty() {
            return end(&self.parts[0], s);
        }
        self.parts
            .iter()
            .zip(&self.tuples[s as usize])
            .all(|(q, &ps)| end(q, ps))
    }

    fn id(s: u32) -> StateID {
        StateID::new(s as usize).expect("a state of this DFA")
    }

    /// Visits every state reachable through unescaped string bytes, then marks those from
    /// which an accepting one is reachable.
    fn explore(&mut self) -> std::result::Result<(), String> {
        let mut preds: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut seen: HashMap<u32, u8> = HashMap::new();
        let mut queue = VecDeque::from([self.start]);
        seen.insert(self.start, 0);
        while let Some(s) = queue.pop_front() {
            if self.matches_at_end(s) {
                seen.insert(s, ACCEPTS);
            }
            for b in 0..=255u8 {
                if !raw_string_byte(b) {
                    continue;
                }
                let Some(n) = self.step(s, b) else {
                    continue;
                };
                preds.entry(n).or_default().push(s);
                if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(n) {
                    e.insert(0);
                    queue.push_back(n);
                }
            }
            if seen.len() > MAX_STATES {
                return Err("its automaton is too large".into());
            }
        }
        // Backwards from the accepting states.
        let mut flags = seen;
        let mut queue: VecDeque<u32> = flags
            .iter()
            .filter(|(_, &f)| f & ACCEPTS != 0)
            .map(|(&s, _)| s)
            .collect();
        for s in &queue {
            *flags.get_mut(s).expect("seen") |= LIVE;
        }
        while let Some(s) = queue.pop_front() {
            for &p in preds.get(&s).map(Vec::as_slice).unwrap_or(&[]) {
                let f = flags.get_mut(&p).expect("seen");
                if *f & LIVE == 0 {
                    *f |= LIVE;
                    queue.push_back(p);
                }
            }
        }
        self.flags = flags;
        Ok(())
    }

    pub(crate) fn start(&self) -> u32 {
        self.start
    }

    fn is_live(&self, s: u32) -> bool {
        self.flags.get(&s).is_some_and(|f| f & LIVE != 0)
    }

    /// The state after `b`, if a match is still reachable from it.
    pub(crate) fn next(&self, s: u32, b: u8) -> Option<u32> {
        if !raw_string_byte(b) {
            return None;
        }
        let n = if self.tuples.is_empty() {
            self.parts[0].dfa.next_state(Self::id(s), b).as_u32()
        } else {
            // Every live product state was interned while exploring.
            *self.index.get(&self.next_tuple(s, b)?)?
        };
        self.is_live(n).then_some(n)
    }

    /// Whether the string may end here.
    pub(crate) fn accepts(&self, s: u32) -> bool {
        self.flags.get(&s).is_some_and(|f| f & ACCEPTS != 0)
    }
}

/// Bytes a JSON string holds as they are: no quote, backslash or control character.
fn raw_string_byte(b: u8) -> bool {
    b >= 0x20 && b != b'"' && b != b'\\'
}
