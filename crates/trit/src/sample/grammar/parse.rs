//! GBNF text → rules: llama.cpp's grammar notation (`grammars/README.md` there).
//!
//! ```text
//! root   ::= item ("," ws item)*      # rules: name ::= alternatives, one per line
//! item   ::= [a-z]+ | "\"" [^"]* "\"" # literals, classes, negated classes, groups, refs
//! ws     ::= [ \t\n]{0,4}             # *, +, ?, {m}, {m,}, {m,n}; `.` is any character
//! ```
//!
//! A rule ends at the end of its line, except inside parentheses and after `|`. Repetitions
//! become rules of their own (`x*` → `R ::= x R | ε`, right recursive so a recognizer's stacks
//! do not grow with the count), as do parenthesized groups.

use super::{Elem, Rule};
use crate::{Error, Result};
use std::collections::HashMap;

/// Parses `text` into rules; `names` maps each defined (or referenced) name to its rule.
pub(super) fn parse(text: &str) -> Result<(Vec<Rule>, HashMap<String, usize>)> {
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
        rules: Vec::new(),
        names: HashMap::new(),
        defined: Vec::new(),
        current: String::new(),
        depth: 0,
    };
    p.space(true);
    while p.at < p.s.len() {
        p.rule()?;
        p.space(true);
    }
    let size: usize = p.rules.iter().flat_map(|r| &r.alts).map(Vec::len).sum();
    if size > MAX_ELEMENTS {
        return Err(p.err_plain(format!(
            "{size} elements once repetitions are written out (at most {MAX_ELEMENTS})"
        )));
    }
    for (name, &id) in &p.names {
        if !p.defined[id] {
            return Err(p.err_plain(format!("rule '{name}' is used but never defined")));
        }
    }
    Ok((p.rules, p.names))
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    rules: Vec<Rule>,
    names: HashMap<String, usize>,
    /// Per rule: defined by a `::=` (generated rules are defined when made).
    defined: Vec<bool>,
    /// The rule being defined (generated rules are named after it).
    current: String,
    /// Parentheses open around the current position.
    depth: usize,
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

impl Parser<'_> {
    fn err_plain(&self, msg: String) -> Error {
        Error::InvalidArgument(format!("grammar: {msg}"))
    }

    /// An error at the current position, with its line and column.
    fn err(&self, msg: &str) -> Error {
        let before = &self.s[..self.at.min(self.s.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        self.err_plain(format!("{msg} at line {line}, column {col}"))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    /// Skips spaces, tabs and comments, and line breaks when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' => self.at += 1,
                b'\r' | b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String> {
        let start = self.at;
        while self.peek().is_some_and(is_word) {
            self.at += 1;
        }
        if start == self.at {
            return Err(self.err("expected a rule name"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// The rule id of `name`, made (undefined) on first mention.
    fn id_of(&mut self, name: &str) -> usize {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        let id = self.new_rule(name.to_string(), false);
        self.names.insert(name.to_string(), id);
        id
    }

    fn new_rule(&mut self, name: String, defined: bool) -> usize {
        self.rules.push(Rule {
            name,
            alts: Vec::new(),
        });
        self.defined.push(defined);
        self.rules.len() - 1
    }

    /// A rule of the grammar's own, named after the rule being defined.
    fn generated(&mut self, alts: Vec<Vec<Elem>>) -> usize {
        let name = format!("{}-{}", self.current, self.rules.len());
        let id = self.new_rule(name, true);
        self.rules[id].alts = alts;
        id
    }

    fn rule(&mut self) -> Result<()> {
        let name = self.name()?;
        self.space(false);
        if !self.s[self.at..].starts_with(b"::=") {
            return Err(self.err(&format!("expected '::=' after '{name}'")));
        }
        self.at += 3;
        self.space(true);
        let id = self.id_of(&name);
        if self.defined[id] {
            return Err(self.err(&format!("rule '{name}' is defined twice")));
        }
        self.defined[id] = true;
        self.current = name;
        let alts = self.alternatives(false)?;
        self.rules[id].alts = alts;
        match self.peek() {
            None | Some(b'\n') | Some(b'\r') => Ok(()),
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Elem>>> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.at += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Elem>> {
        let mut seq: Vec<Elem> = Vec::new();
        loop {
            // The start of the last item, for a repetition operator to take.
            let last = seq.len();
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    while self.peek() != Some(b'"') {
                        if self.peek().is_none() {
                            return Err(self.err("unterminated string literal"));
                        }
                        let c = self.char_or_escape()?;
                        seq.push(Elem::Chars {
                            ranges: vec![(c, c)],
                            negated: false,
                        });
                    }
                    // A repetition after it takes the whole literal (every element from
                    // `last`).
                    self.at += 1;
                }
                Some(b'[') => {
                    self.at += 1;
                    seq.push(self.class()?);
                }
                Some(b'.') => {
                    self.at += 1;
                    seq.push(Elem::Chars {
                        ranges: Vec::new(),
                        negated: true,
                    });
                }
                Some(b'(') => {
                    self.at += 1;
                    self.space(true);
                    self.depth += 1;
                    if self.depth > MAX_NESTING {
                        return Err(self.err(&format!("groups nested deeper than {MAX_NESTING}")));
                    }
                    let alts = self.alternatives(true)?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.err("expected ')'"));
                    }
                    self.at += 1;
                    let id = self.generated(alts);
                    seq.push(Elem::Rule(id));
                }
                Some(b) if is_word(b) => {
                    let name = self.name()?;
                    let id = self.id_of(&name);
                    seq.push(Elem::Rule(id));
                }
                Some(b'<') => {
                    return Err(self.err("token references (<...>) are not supported"));
                }
                Some(b'*' | b'+' | b'?' | b'{') => {
                    return Err(self.err("a repetition operator without an item before it"));
                }
                _ => break,
            }
            self.space(nested);
            while self.at_repetition() {
                let (min, max) = self.repetition()?;
                let item = seq.split_off(last);
                self.repeat(&mut seq, item, min, max);
                self.space(nested);
            }
        }
        Ok(seq)
    }

    fn at_repetition(&self) -> bool {
        matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{'))
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}` as (min, max); max `None` is unbounded.
    fn repetition(&mut self) -> Result<(usize, Option<usize>)> {
        let b = self.peek().expect("at a repetition");
        self.at += 1;
        Ok(match b {
            b'*' => (0, None),
            b'+' => (1, None),
            b'?' => (0, Some(1)),
            _ => {
                self.space(true);
                let min = self.number()?;
                self.space(true);
                let max = if self.peek() == Some(b',') {
                    self.at += 1;
                    self.space(true);
                    if self.peek() == Some(b'}') {
                        None
                    } else {
                        Some(self.number()?)
                    }
                } else {
                    Some(min)
                };
                self.space(true);
                if self.peek() != Some(b'}') {
                    return Err(self.err("expected '}'"));
                }
                self.at += 1;
                if max.is_some_and(|m| m < min) {
                    return Err(self.err(&format!("repetition {{{min},{max:?}}}: max < min")));
                }
                if max.unwrap_or(min) > MAX_REPEAT {
                    return Err(self.err(&format!("repetitions above {MAX_REPEAT}")));
                }
                (min, max)
            }
        })
    }

    fn number(&mut self) -> Result<usize> {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        std::str::from_utf8(&self.s[start..self.at])
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| self.err("expected a number"))
    }

    /// Appends `item` repeated `min` times, then up to `max − min` more (unbounded: any).
    fn repeat(&mut self, seq: &mut Vec<Elem>, item: Vec<Elem>, min: usize, max: Option<usize>) {
        for _ in 0..min {
            seq.extend(item.iter().cloned());
        }
        match max {
            None => {
                // R ::= item R | ε
                let id = self.generated(Vec::new());
                let mut again = item;
                again.push(Elem::Rule(id));
                self.rules[id].alts = vec![again, Vec::new()];
                seq.push(Elem::Rule(id));
            }
            Some(max) if max > min => {
                // Nested optionals, innermost first: R_k ::= item R_{k+1} | ε.
                let mut inner: Option<usize> = None;
                for _ in min..max {
                    let mut one = item.clone();
                    one.extend(inner.map(Elem::Rule));
                    inner = Some(self.generated(vec![one, Vec::new()]));
                }
                seq.extend(inner.map(Elem::Rule));
            }
            Some(_) => {}
        }
    }

    /// A `[...]` class (after its `[`): code points and ranges, `^` first to negate.
    fn class(&mut self) -> Result<Elem> {
        let negated = self.peek() == Some(b'^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        while self.peek() != Some(b']') {
            if self.peek().is_none() {
                return Err(self.err("unterminated character class"));
            }
            let lo = self.char_or_escape()?;
            let hi = if self.peek() == Some(b'-')
                && self.s.get(self.at + 1).is_some_and(|&b| b != b']')
            {
                self.at += 1;
                self.char_or_escape()?
            } else {
                lo
            };
            if hi < lo {
                return Err(self.err("a character range that runs backwards"));
            }
            ranges.push((lo, hi));
        }
        self.at += 1;
        // Sorted, so a negated class's gaps can be walked in order (`Elem::takes_any`).
        ranges.sort_unstable();
        Ok(Elem::Chars { ranges, negated })
    }

    /// A code point of the text, or an escape: `\n \r \t \\ \" \[ \] \- \xHH \uHHHH
    /// \UHHHHHHHH`.
    fn char_or_escape(&mut self) -> Result<u32> {
        if self.peek() != Some(b'\\') {
            return self.utf8_char();
        }
        self.at += 1;
        let b = self
            .peek()
            .ok_or_else(|| self.err("an escape at the end"))?;
        self.at += 1;
        let digits = match b {
            b'n' => return Ok(u32::from(b'\n')),
            b'r' => return Ok(u32::from(b'\r')),
            b't' => return Ok(u32::from(b'\t')),
            b'0' => return Ok(0),
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' | b'/' | b'\'' => return Ok(u32::from(b)),
            b'x' => 2,
            b'u' => 4,
            b'U' => 8,
            _ => return Err(self.err(&format!("unknown escape '\\{}'", b as char))),
        };
        let end = self.at + digits;
        let hex = self
            .s
            .get(self.at..end)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .filter(|&c| char::from_u32(c).is_some())
            .ok_or_else(|| self.err("a bad hexadecimal escape"))?;
        self.at = end;
        Ok(hex)
    }

    fn utf8_char(&mut self) -> Result<u32> {
        let rest = &self.s[self.at..self.s.len().min(self.at + 4)];
        let text = match std::str::from_utf8(rest) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or(""),
        };
        let c = text
            .chars()
            .next()
            .ok_or_else(|| self.err("invalid UTF-8"))?;
        self.at += c.len_utf8();
        Ok(c as u32)
    }
}

/// The largest bound of a `{m,n}` repetition (each repetition is a copy of its item).
const MAX_REPEAT: usize = 10_000;
/// The most elements a grammar may have with its repetitions written out.
const MAX_ELEMENTS: usize = 1_000_000;
/// The deepest nesting of parentheses (the parser recurses into each group).
const MAX_NESTING: usize = 256;
