//! Constrained decoding to a GBNF grammar (llama.cpp's `--grammar`, `--grammar-file` and the
//! server's `grammar` field): the output must stay a prefix of a string the grammar's `root`
//! rule derives.
//!
//! The recognizer is a pushdown one, as llama.cpp's: the state is the set of stacks of
//! grammar positions that the text so far leaves possible, each stack's top the next element
//! to match (a character class); a code point keeps the stacks whose top takes it, each
//! advanced past it and expanded through rule references until a class (or nothing: the end)
//! is on top. Bytes of a code point split across tokens are held until it is complete, and
//! each partial one is checked against the classes that could still take it. Left-recursive
//! grammars, which would expand forever, are refused when parsed.

mod parse;
mod stack;

use stack::Stack;

use crate::{Error, Result};

/// One element of a sequence: a code point in (or, negated, outside) the inclusive ranges
/// (sorted), or a reference to a rule.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elem {
    Chars {
        ranges: Vec<(u32, u32)>,
        negated: bool,
    },
    Rule(usize),
}

impl Elem {
    fn takes(&self, c: u32) -> bool {
        match self {
            Elem::Chars { ranges, negated } => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) != *negated
            }
            Elem::Rule(_) => false,
        }
    }

    /// Whether some code point in `lo..=hi` is taken (a partial UTF-8 sequence's range).
    fn takes_any(&self, lo: u32, hi: u32) -> bool {
        let Elem::Chars { ranges, negated } = self else {
            return false;
        };
        if !negated {
            return ranges.iter().any(|&(a, b)| a <= hi && lo <= b);
        }
        // Negated: some point of lo..=hi outside every range. The ranges are sorted (parse).
        let mut next = lo;
        for &(a, b) in ranges {
            if a > next {
                break;
            }
            next = next.max(b.saturating_add(1));
            if next > hi {
                return false;
            }
        }
        next <= hi
    }
}

/// A rule: alternatives, each a sequence of elements (an empty one matches nothing).
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub(crate) name: String,
    pub(crate) alts: Vec<Vec<Elem>>,
}

/// A parsed grammar, ready to recognize text.
#[derive(Debug)]
pub struct Grammar {
    rules: Vec<Rule>,
    root: usize,
}

/// Where a stack stands: element `idx` of alternative `alt` of rule `rule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Pos {
    rule: u32,
    alt: u32,
    idx: u32,
}

/// The recognizer's state after some text: the possible stacks (innermost position last;
/// an empty stack: the text may end here), and a code point's leading bytes, if split.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GrammarState {
    stacks: Vec<Stack>,
    /// (bytes still to come, the value so far, the least value of its length).
    partial: Option<(u8, u32, u32)>,
}

impl Grammar {
    /// Parses GBNF text; the grammar starts at its `root` rule.
    pub fn parse(text: &str) -> Result<Grammar> {
        let (rules, names) = parse::parse(text)?;
        let root = *names.get("root").ok_or_else(|| {
            Error::InvalidArgument("grammar: no 'root' rule (the rule output starts at)".into())
        })?;
        let g = Grammar { rules, root };
        g.check_left_recursion()?;
        Ok(g)
    }

    /// Refuses a rule that can reach itself again before matching any character: its
    /// expansion would never end.
    fn check_left_recursion(&self) -> Result<()> {
        let n = self.rules.len();
        // Rules that can match the empty string, to a fixed point.
        let mut nullable = vec![false; n];
        loop {
            let mut changed = false;
            for (i, r) in self.rules.iter().enumerate() {
                if !nullable[i]
                    && r.alts
                        .iter()
                        .any(|a| a.iter().all(|e| self.null(e, &nullable)))
                {
                    nullable[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        // Edges to the rules a rule may start with (past nullable elements).
        let first: Vec<Vec<usize>> = self
            .rules
            .iter()
            .map(|r| {
                let mut out = Vec::new();
                for alt in &r.alts {
                    for e in alt {
                        if let Elem::Rule(t) = e {
                            out.push(*t);
                        }
                        if !self.null(e, &nullable) {
                            break;
                        }
                    }
                }
                out
            })
            .collect();
        // Depth-first search for a cycle: 0 unseen, 1 on the path, 2 done.
        let mut mark = vec![0u8; n];
        for start in 0..n {
            if mark[start] != 0 {
                continue;
            }
            let mut path = vec![(start, 0usize)];
            mark[start] = 1;
            while let Some(&mut (r, ref mut i)) = path.last_mut() {
                if let Some(&t) = first[r].get(*i) {
                    *i += 1;
                    match mark[t] {
                        1 => {
                            return Err(Error::InvalidArgument(format!(
                                "grammar: rule '{}' is left-recursive (it can reach itself \
                                 before matching a character); rewrite it with repetition",
                                self.rules[t].name
                            )))
                        }
                        0 => {
                            mark[t] = 1;
                            path.push((t, 0));
                        }
                        _ => {}
                    }
                } else {
                    mark[r] = 2;
                    path.pop();
                }
            }
        }
        Ok(())
    }

    fn null(&self, e: &Elem, nullable: &[bool]) -> bool {
        matches!(e, Elem::Rule(t) if nullable[*t])
    }

    /// The state before any text.
    pub fn start(&self) -> GrammarState {
        let mut stacks = Vec::new();
        for alt in 0..self.rules[self.root].alts.len() {
            let pos = Pos {
                rule: self.root as u32,
                alt: alt as u32,
                idx: 0,
            };
            self.expand(Stack::one(pos), &mut stacks);
        }
        normalize(&mut stacks);
        GrammarState {
            stacks,
            partial: None,
        }
    }

    fn elem(&self, p: Pos) -> Option<&Elem> {
        self.rules[p.rule as usize].alts[p.alt as usize].get(p.idx as usize)
    }

    /// Pushes onto `out` every stack `stack` leads to with a character class (or nothing) on
    /// top. Each position on a stack has an element left; a finished alternative is popped,
    /// and a reference as its alternative's last element replaces the position (so right
    /// recursion does not grow the stack).
    fn expand(&self, stack: Stack, out: &mut Vec<Stack>) {
        // A work list, not recursion: a long chain of rules that each start with the next
        // must not exhaust the thread's stack.
        let mut work = vec![stack];
        while let Some(mut stack) = work.pop() {
            loop {
                let Some(top) = stack.last() else {
                    out.push(stack);
                    break;
                };
                match self.elem(top) {
                    None => {
                        stack.pop();
                    }
                    Some(Elem::Chars { .. }) => {
                        out.push(stack);
                        break;
                    }
                    Some(Elem::Rule(r)) => {
                        stack.pop();
                        self.push_next(&mut stack, top);
                        for alt in 0..self.rules[*r].alts.len() {
                            let mut s = stack.clone();
                            s.push(Pos {
                                rule: *r as u32,
                                alt: alt as u32,
                                idx: 0,
                            });
                            work.push(s);
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Pushes the position after `p`, unless `p` was its alternative's last element.
    fn push_next(&self, stack: &mut Stack, p: Pos) {
        let next = Pos {
            idx: p.idx + 1,
            ..p
        };
        if self.elem(next).is_some() {
            stack.push(next);
        }
    }

    /// Feeds one byte of output; `false` when no string of the grammar continues that way
    /// (the state is then unspecified).
    pub fn feed(&self, st: &mut GrammarState, b: u8) -> bool {
        match self.next(st, b) {
            Some(n) => {
                *st = n;
                true
            }
            None => false,
        }
    }

    /// The state after one more byte, or `None` when no string of the grammar continues that
    /// way. Reads `st` without copying it (a mask tries many bytes from one state).
    pub fn next(&self, st: &GrammarState, b: u8) -> Option<GrammarState> {
        // (bytes still to come, the value so far, the least value of the sequence's length:
        // shorter values written long are overlong, not UTF-8).
        let (need, value, least) = match st.partial {
            None => match b {
                0x00..=0x7f => (0, u32::from(b), 0),
                0xc2..=0xdf => (1, u32::from(b & 0x1f), 0x80),
                0xe0..=0xef => (2, u32::from(b & 0x0f), 0x800),
                0xf0..=0xf4 => (3, u32::from(b & 0x07), 0x10000),
                _ => return None,
            },
            Some((need, value, least)) => {
                if b & 0xc0 != 0x80 {
                    return None;
                }
                (need - 1, value << 6 | u32::from(b & 0x3f), least)
            }
        };
        if need > 0 {
            // The code points this prefix can still become.
            let shift = 6 * u32::from(need);
            let lo = (value << shift).max(least);
            let hi = ((value << shift) | ((1 << shift) - 1)).min(0x10ffff);
            let open = lo <= hi
                && st.stacks.iter().any(|s| {
                    s.last()
                        .and_then(|p| self.elem(p))
                        .is_some_and(|e| e.takes_any(lo, hi))
                });
            return open.then(|| GrammarState {
                stacks: st.stacks.clone(),
                partial: Some((need, value, least)),
            });
        }
        if value < least || char::from_u32(value).is_none() {
            return None;
        }
        let stacks = self.accept(&st.stacks, value);
        (!stacks.is_empty()).then_some(GrammarState {
            stacks,
            partial: None,
        })
    }

    /// The stacks after code point `c`.
    fn accept(&self, stacks: &[Stack], c: u32) -> Vec<Stack> {
        let mut next = Vec::new();
        for s in stacks {
            let Some(top) = s.last() else { continue };
            if !self.elem(top).is_some_and(|e| e.takes(c)) {
                continue;
            }
            let mut s = s.clone();
            s.pop();
            self.push_next(&mut s, top);
            self.expand(s, &mut next);
        }
        normalize(&mut next);
        next
    }

    /// Feeds every byte of `bytes`.
    pub fn feed_all(&self, st: &mut GrammarState, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(st, b))
    }

    /// The text so far is a complete string of the grammar.
    pub fn can_end(&self, st: &GrammarState) -> bool {
        st.partial.is_none() && st.stacks.iter().any(Stack::is_empty)
    }

    /// Nothing may follow: every possible parse is complete.
    pub fn is_done(&self, st: &GrammarState) -> bool {
        st.partial.is_none() && st.stacks.iter().all(Stack::is_empty)
    }
}

/// Sorted, without repeats: equal stacks are one possibility.
fn normalize(stacks: &mut Vec<Stack>) {
    stacks.sort_unstable();
    stacks.dedup();
}

#[cfg(test)]
mod cross_tests;
#[cfg(test)]
mod tests;
