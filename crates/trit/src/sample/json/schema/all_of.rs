//! `allOf` of several schemas (OpenAPI-style composition: a `$ref` to a base model plus the
//! properties one schema adds) merged into one schema before it is compiled, so that a value
//! satisfies the merge exactly when it satisfies every member.
//!
//! What merges: `type` (intersected; `integer` within `number`), `properties` (a property named
//! by several members takes the `allOf` of its schemas), `required` (union),
//! `additionalProperties` (a property one member names is an additional one for each member
//! that does not: it also takes that member's `additionalProperties` — dropped where it is
//! `false` —, and the merge's own is the `allOf` of all of them),
//! lower bounds (the largest), upper bounds (the smallest), `enum`/`const` (intersected),
//! `items` (the `allOf` of both), `pattern`s (all kept: the string must match each), and
//! `multipleOf` (their least common multiple, in decimal), and keywords equal in every member
//! that has them (`prefixItems`, `format`, …). At most one member may hold `anyOf`/`oneOf`; the
//! other members' keywords then go into each of its branches. Any other difference (two
//! `prefixItems`, …) is refused with its place, never merged in part.

use super::{bad, empty, kinds_of, resolve, ANNOTATIONS, MORE_PATTERNS};
use super::{ARRAY, BOOL, INTEGER, NULL, NUMBER, OBJECT, STRING};
use crate::Result;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// How deep members may nest `allOf` and `$ref` inside each other (recursion is refused).
const MAX_DEPTH: usize = 16;

/// The one schema equivalent to the `allOf` in `o` and the keywords beside it.
pub(super) fn merge_all_of(root: &Value, o: &Map<String, Value>, at: &str) -> Result<Value> {
    let mut parts = Vec::new();
    collect(root, o, at, 0, &mut parts)?;
    let mut merged = Merged::default();
    for (part, at) in &parts {
        merged.add(part, at)?;
    }
    merged.finish(at)
}

/// The members' own keywords (annotations dropped, `format` kept), `$ref`s and nested
/// `allOf`s flattened, with where each came from.
fn collect(
    root: &Value,
    o: &Map<String, Value>,
    at: &str,
    depth: usize,
    parts: &mut Vec<(Map<String, Value>, String)>,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(bad(at, "`allOf` nested too deep (or recursive)"));
    }
    if let Some(r) = o.get("$ref") {
        if o.keys()
            .any(|k| k != "$ref" && !ANNOTATIONS.contains(&k.as_str()))
        {
            return Err(bad(at, "`$ref` beside other keywords is not supported"));
        }
        let r = r
            .as_str()
            .ok_or_else(|| bad(at, "`$ref` must be a string"))?;
        return member(root, resolve(root, r, at)?, r, depth + 1, parts);
    }
    let mut own = Map::new();
    for (k, v) in o {
        if k == "allOf" {
            let all = v
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| bad(at, "`allOf` must be a non-empty array"))?;
            for (i, m) in all.iter().enumerate() {
                member(root, m, &format!("{at}/allOf/{i}"), depth + 1, parts)?;
            }
        } else if k == "format" || !ANNOTATIONS.contains(&k.as_str()) {
            own.insert(k.clone(), v.clone());
        }
    }
    if !own.is_empty() {
        parts.push((own, at.to_string()));
    }
    Ok(())
}

fn member(
    root: &Value,
    v: &Value,
    at: &str,
    depth: usize,
    parts: &mut Vec<(Map<String, Value>, String)>,
) -> Result<()> {
    match v {
        Value::Bool(true) => Ok(()),
        Value::Bool(false) => Err(bad(at, "`false` admits no value")),
        Value::Object(o) => collect(root, o, at, depth, parts),
        _ => Err(bad(at, "a schema must be an object or a boolean")),
    }
}

/// The merge so far.
#[derive(Default)]
struct Merged {
    out: Map<String, Value>,
    /// Each member with an `additionalProperties` other than `true`: the property names it
    /// lists and that `additionalProperties` (`false` or a schema).
    extra: Vec<(BTreeSet<String>, Value)>,
}

/// The `type` value naming the kinds in `k` (bit flags of `kinds_of`; `number` covers
/// `integer`).
fn type_names(k: u8) -> Value {
    let names: Vec<&str> = [
        (NULL, "null"),
        (BOOL, "boolean"),
        (OBJECT, "object"),
        (ARRAY, "array"),
        (STRING, "string"),
        (NUMBER, "number"),
        (INTEGER, "integer"),
    ]
    .into_iter()
    .filter(|&(bit, name)| k & bit != 0 && (name != "integer" || k & NUMBER == 0))
    .map(|(_, name)| name)
    .collect();
    json!(names)
}

impl Merged {
    fn add(&mut self, part: &Map<String, Value>, at: &str) -> Result<()> {
        for (k, v) in part {
            match k.as_str() {
                "type" => {
                    let mut kinds = kinds_of(v, at)?;
                    if let Some(old) = self.out.get("type") {
                        kinds &= kinds_of(old, at)?;
                    }
                    if kinds == 0 {
                        return Err(empty(at, "the `allOf` members have no common type"));
                    }
                    self.out.insert(k.clone(), type_names(kinds));
                }
                "properties" => {
                    let props = v
                        .as_object()
                        .ok_or_else(|| bad(at, "`properties` must be an object"))?;
                    let out = self.out.entry("properties").or_insert_with(|| json!({}));
                    let out = out.as_object_mut().expect("made as an object");
                    for (name, s) in props {
                        let s = match out.get(name) {
                            Some(old) if old != s => json!({"allOf": [old, s]}),
                            _ => s.clone(),
                        };
                        out.insert(name.clone(), s);
                    }
                }
                "required" => {
                    let req = v
                        .as_array()
                        .ok_or_else(|| bad(at, "`required` must be an array"))?;
                    let out = self.out.entry("required").or_insert_with(|| json!([]));
                    let out = out.as_array_mut().expect("made as an array");
                    for r in req {
                        if !out.contains(r) {
                            out.push(r.clone());
                        }
                    }
                }
                "additionalProperties" => {
                    if !matches!(v, Value::Bool(_) | Value::Object(_)) {
                        return Err(bad(at, "`additionalProperties` must be a schema"));
                    }
                    if *v != Value::Bool(true) {
                        let names = part
                            .get("properties")
                            .and_then(Value::as_object)
                            .map(|p| p.keys().cloned().collect())
                            .unwrap_or_default();
                        self.extra.push((names, v.clone()));
                    }
                }
                "minimum" | "exclusiveMinimum" | "minLength" | "minItems" => {
                    self.bound(k, v, at, |new, old| new > old)?
                }
                "maximum" | "exclusiveMaximum" | "maxLength" | "maxItems" => {
                    self.bound(k, v, at, |new, old| new < old)?
                }
                "enum" | "const" => {
                    let values = match v {
                        Value::Array(a) if k == "enum" => a.clone(),
                        _ if k == "enum" => return Err(bad(at, "`enum` must be an array")),
                        c => vec![c.clone()],
                    };
                    let kept: Vec<Value> = match self.out.get("enum").and_then(Value::as_array) {
                        Some(old) => values.into_iter().filter(|x| old.contains(x)).collect(),
                        None => values,
                    };
                    if kept.is_empty() {
                        return Err(bad(
                            at,
                            "no value is in every `allOf` member's `enum`/`const`",
                        ));
                    }
                    self.out.insert("enum".into(), Value::Array(kept));
                }
                // Patterns of different members: the string must match each (all kept).
                "pattern" => match self.out.get(k) {
                    Some(old) if old != v => {
                        let more = self
                            .out
                            .entry(MORE_PATTERNS)
                            .or_insert_with(|| Value::Array(Vec::new()));
                        if let Value::Array(a) = more {
                            if !a.contains(v) {
                                a.push(v.clone());
                            }
                        }
                    }
                    _ => {
                        self.out.insert(k.clone(), v.clone());
                    }
                },
                "items" => {
                    let s = match self.out.get(k) {
                        Some(old) if old != v => json!({"allOf": [old, v]}),
                        _ => v.clone(),
                    };
                    self.out.insert(k.clone(), s);
                }
                // A multiple of both divisors is a multiple of their least common multiple.
                "multipleOf" => {
                    let m = match self.out.get(k) {
                        Some(old) if old != v => common_multiple(old, v).ok_or_else(|| {
                            bad(
                                at,
                                "`allOf` members' `multipleOf`s must be positive numbers whose least common multiple has at most 18 digits",
                            )
                        })?,
                        _ => v.clone(),
                    };
                    self.out.insert(k.clone(), m);
                }
                "anyOf" | "oneOf" => {
                    if self.out.contains_key("anyOf") || self.out.contains_key("oneOf") {
                        return Err(bad(
                            at,
                            "`allOf` members with several `anyOf`/`oneOf` are not supported",
                        ));
                    }
                    self.out.insert(k.clone(), v.clone());
                }
                _ => match self.out.get(k) {
                    Some(old) if old != v => {
                        return Err(bad(
                            at,
                            format!("`allOf` members with different `{k}` are not supported"),
                        ))
                    }
                    _ => {
                        self.out.insert(k.clone(), v.clone());
                    }
                },
            }
        }
        Ok(())
    }

    /// Keeps the tighter of two numeric bounds (`tighter(new, old)`).
    fn bound(&mut self, k: &str, v: &Value, at: &str, tighter: fn(f64, f64) -> bool) -> Result<()> {
        let new = v
            .as_f64()
            .ok_or_else(|| bad(at, format!("`{k}` must be a number")))?;
        let keep_old = self
            .out
            .get(k)
            .and_then(Value::as_f64)
            .is_some_and(|old| !tighter(new, old));
        if !keep_old {
            self.out.insert(k.to_string(), v.clone());
        }
        Ok(())
    }

    /// Properties against the members' `additionalProperties`: a property one member names is
    /// an additional one for every member that does not, so it also takes that member's
    /// `additionalProperties` (and is dropped where that is `false`); names no member lists take
    /// every member's.
    fn merge_extra(&mut self, at: &str) -> Result<()> {
        if self.extra.is_empty() {
            return Ok(());
        }
        let closed = |(_, v): &(BTreeSet<String>, Value)| *v == Value::Bool(false);
        if let Some(props) = self
            .out
            .get_mut("properties")
            .and_then(Value::as_object_mut)
        {
            props.retain(|name, _| !self.extra.iter().any(|e| closed(e) && !e.0.contains(name)));
            for (name, s) in props.iter_mut() {
                for (names, extra) in &self.extra {
                    if !names.contains(name) {
                        *s = json!({"allOf": [s.clone(), extra]});
                    }
                }
            }
        }
        let required: Vec<String> = self
            .out
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let listed = |r: &String| {
            self.out
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key(r))
        };
        let all_closed = self.extra.iter().any(closed);
        if let Some(r) = required.iter().find(|r| all_closed && !listed(r)) {
            return Err(bad(
                at,
                format!("property {r:?} is required but an `allOf` member with `additionalProperties: false` does not allow it"),
            ));
        }
        let rest: Vec<Value> = self.extra.iter().map(|(_, v)| v.clone()).collect();
        let additional = if all_closed {
            json!(false)
        } else if rest.len() == 1 {
            rest[0].clone()
        } else {
            json!({"allOf": rest})
        };
        self.out.insert("additionalProperties".into(), additional);
        Ok(())
    }

    fn finish(mut self, at: &str) -> Result<Value> {
        self.merge_extra(at)?;
        // A union beside other keywords: those keywords go into every branch —
        // A ∧ (B1 ∨ B2) = (A ∧ B1) ∨ (A ∧ B2), and "exactly one Bi" likewise for `oneOf`.
        let union = ["anyOf", "oneOf"]
            .into_iter()
            .find(|k| self.out.contains_key(*k));
        if let Some(k) = union.filter(|_| self.out.len() > 1) {
            let branches = self.out.remove(k).expect("found above");
            let branches = branches
                .as_array()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| bad(at, format!("`{k}` must be a non-empty array")))?;
            let rest = Value::Object(std::mem::take(&mut self.out));
            let each: Vec<Value> = branches
                .iter()
                .map(|b| json!({"allOf": [rest, b]}))
                .collect();
            self.out.insert(k.to_string(), Value::Array(each));
        }
        Ok(Value::Object(self.out))
    }
}

/// A positive JSON number as `n · 10^e` (`n` an integer), from its text; `None` for anything
/// else or more than 38 digits.
fn decimal(v: &Value) -> Option<(u128, i32)> {
    let text = v.as_number()?.to_string();
    let (mantissa, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (text.as_str(), 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let n: u128 = format!("{int}{frac}").parse().ok()?;
    (n > 0).then_some((n, exp - frac.len() as i32))
}

/// The least common multiple of two positive numbers, as a JSON number with at most 18 digits.
fn common_multiple(a: &Value, b: &Value) -> Option<Value> {
    let ((na, ea), (nb, eb)) = (decimal(a)?, decimal(b)?);
    let e = ea.min(eb);
    let scale = |n: u128, from: i32| n.checked_mul(10u128.checked_pow((from - e) as u32)?);
    let (x, y) = (scale(na, ea)?, scale(nb, eb)?);
    let gcd = |mut p: u128, mut q: u128| {
        while q != 0 {
            (p, q) = (q, p % q);
        }
        p
    };
    let l = (x / gcd(x, y)).checked_mul(y)?;
    let digits = l.to_string();
    if digits.len() > 18 {
        return None;
    }
    let text = if e >= 0 {
        format!("{digits}{}", "0".repeat(e as usize))
    } else {
        let frac = (-e) as usize;
        let padded = format!("{digits:0>width$}", width = frac + 1);
        let (int, fr) = padded.split_at(padded.len() - frac);
        format!("{int}.{fr}")
    };
    serde_json::from_str(&text).ok()
}
