//! `anyOf`/`oneOf`: branches a value's first byte tells apart merged into one node, the
//! others kept as a fork node that the recognizer reads along every branch.

use super::{bad, empty, literal_form, literal_kind, Compiler, Node, ADMITS_NOTHING};
use super::{ARRAY, INTEGER, MAX_ALTERNATIVES, NUMBER, OBJECT, STRING};
use crate::Result;
use serde_json::Value;

impl Compiler<'_> {
    /// `anyOf`/`oneOf`: merged into one node where a value's first byte tells the branches
    /// apart (different JSON types, or literal values only), else a fork node read along each
    /// branch (`Node::branches`).
    pub(super) fn union(&mut self, alts: &Value, at: &str) -> Result<Node> {
        let alts = alts
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| bad(at, "`anyOf`/`oneOf` must be a non-empty array"))?;
        let mut indices = Vec::new();
        for (i, alt) in alts.iter().enumerate() {
            // A branch that admits no value is dropped, with whatever it had compiled.
            let (nodes, patterns, refs) =
                (self.nodes.len(), self.patterns.len(), self.refs.clone());
            match self.node(alt, &format!("{at}/anyOf/{i}")) {
                Ok(n) => indices.push(n),
                Err(e) if e.to_string().contains(ADMITS_NOTHING) => {
                    self.nodes.truncate(nodes);
                    self.patterns.truncate(patterns);
                    self.refs = refs;
                    self.building.retain(|&b| b < nodes);
                }
                Err(e) => return Err(e),
            }
        }
        if indices.is_empty() {
            return Err(empty(at, "no branch of the `anyOf`/`oneOf` admits one"));
        }
        // A branch still being built (a recursive `$ref`) cannot be copied into a merge.
        if !indices.iter().any(|n| self.building.contains(n)) {
            let branches: Vec<Node> = indices.iter().map(|&n| self.nodes[n].clone()).collect();
            if let Some(merged) = merge(branches, at)? {
                return Ok(merged);
            }
        }
        if indices.len() > MAX_ALTERNATIVES {
            return Err(bad(at, format!("more than {MAX_ALTERNATIVES} branches")));
        }
        let mut fork = Node::any();
        fork.kinds = indices.iter().fold(0, |k, &n| k | self.nodes[n].kinds);
        fork.branches = indices;
        Ok(fork)
    }
}

/// The branches as one node, where a value's first byte tells them apart; `None` where it
/// does not (the caller forks).
fn merge(branches: Vec<Node>, at: &str) -> Result<Option<Node>> {
    if branches.iter().any(|n| !n.branches.is_empty()) {
        return Ok(None);
    }
    let mut out = Node::any();
    if branches.iter().any(|n| n.literals.is_some()) {
        let mut all: Vec<Vec<u8>> = Vec::new();
        for n in &branches {
            let Some(l) = literal_form(n) else {
                return Ok(None);
            };
            all.extend(
                l.into_iter()
                    .filter(|l| !all.contains(l))
                    .collect::<Vec<_>>(),
            );
        }
        if all.len() > MAX_ALTERNATIVES {
            return Err(bad(
                at,
                format!("more than {MAX_ALTERNATIVES} literal values"),
            ));
        }
        out.kinds = all.iter().fold(0, |k, l| k | literal_kind(l));
        out.literals = Some(all);
        return Ok(Some(out));
    }
    out.kinds = 0;
    for n in branches {
        // Integer and number overlap harmlessly (a number admits every integer).
        if out.kinds & n.kinds & !(INTEGER | NUMBER) != 0 {
            return Ok(None);
        }
        if n.kinds & OBJECT != 0 {
            out.object = n.object;
        }
        if n.kinds & ARRAY != 0 {
            out.array = n.array;
        }
        if n.kinds & STRING != 0 {
            out.min_len = n.min_len;
            out.max_len = n.max_len;
            out.pattern = n.pattern;
        }
        if n.kinds & (INTEGER | NUMBER) != 0 {
            let bounded = n.int_range.is_some() || n.dec_range.is_some();
            if out.kinds & (INTEGER | NUMBER) != 0
                && (bounded || out.int_range.is_some() || out.dec_range.is_some())
            {
                return Ok(None);
            }
            out.int_range = n.int_range;
            out.dec_range = n.dec_range;
        }
        out.kinds |= n.kinds;
    }
    Ok(Some(out))
}
