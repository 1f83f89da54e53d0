//! `enum`/`const`: a node's literal values (the JSON text of each), their kinds, the values
//! kept where length, pattern or number keywords stand beside them, and those a `not` of values
//! takes away.

use super::{bad, empty, forks, only_annotations_beside, Compiler, JsonSchema, Node};
use super::{ARRAY, BOOL, INTEGER, MAX_ALTERNATIVES, NULL, NUMBER, OBJECT, STRING};
use crate::Result;
use serde_json::{Map, Value};

/// Keywords that constrain strings or numbers: beside `enum`/`const` they filter the values.
const SCALAR_KEYS: &[&str] = &[
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

impl Compiler<'_> {
    /// Keeps the `enum`/`const` values that also satisfy the keywords beside them (the
    /// recognizer reads a node's literals alone, so a `type`, `maxLength` or `minimum` there
    /// would otherwise go unenforced): values of a kind the node admits, and where string or
    /// number keywords stand beside them, each run through the node without its literals.
    pub(super) fn literals_within(
        &self,
        node: &mut Node,
        o: &Map<String, Value>,
        at: &str,
    ) -> Result<()> {
        let mut lits = node.literals.take().expect("checked by the caller");
        // `number` covers `integer`; a literal's kind is read from its first byte.
        lits.retain(|l| literal_kind(l) & node.kinds != 0);
        if lits.is_empty() {
            return Err(empty(
                at,
                "no value of `enum`/`const` has the type beside it",
            ));
        }
        // An integer-only node's numeric values need the digits read (1.5 is no integer).
        let fractions =
            node.kinds & NUMBER == 0 && lits.iter().any(|l| literal_kind(l) & INTEGER != 0);
        if !fractions && !SCALAR_KEYS.iter().any(|k| o.contains_key(*k)) {
            node.literals = Some(lits);
            return Ok(());
        }
        let mut nodes = self.nodes.clone();
        let mut check = node.clone();
        check.literals = None;
        nodes.push(check);
        let schema = JsonSchema {
            has_forks: forks(&nodes),
            root: nodes.len() - 1,
            nodes,
            patterns: self.patterns.clone(),
            openings: Vec::new(),
            closing: Vec::new(),
            xml: false,
        };
        let kept: Vec<Vec<u8>> = lits
            .into_iter()
            .filter(|l| {
                let mut r = crate::sample::json::Recognizer::new(&schema);
                r.feed_all(l) && r.can_end()
            })
            .collect();
        if kept.is_empty() {
            return Err(empty(
                at,
                "no value of `enum`/`const` satisfies the keywords beside it",
            ));
        }
        node.literals = Some(kept);
        Ok(())
    }
}

pub(super) fn literal_form(n: &Node) -> Option<Vec<Vec<u8>>> {
    if let Some(l) = &n.literals {
        return Some(l.clone());
    }
    if n.kinds & !(NULL | BOOL) != 0 {
        return None;
    }
    let mut out = Vec::new();
    if n.kinds & NULL != 0 {
        out.push(b"null".to_vec());
    }
    if n.kinds & BOOL != 0 {
        out.push(b"true".to_vec());
        out.push(b"false".to_vec());
    }
    Some(out)
}

/// The kind of a literal's compact serialization, from its first byte.
pub(super) fn literal_kind(l: &[u8]) -> u8 {
    match l.first() {
        Some(b'n') => NULL,
        Some(b't' | b'f') => BOOL,
        Some(b'"') => STRING,
        Some(b'{') => OBJECT,
        Some(b'[') => ARRAY,
        _ => NUMBER | INTEGER,
    }
}

/// `enum` or `const` as compact serializations.
pub(super) fn literals(o: &Map<String, Value>, at: &str) -> Result<Option<Vec<Vec<u8>>>> {
    let values: Vec<&Value> = match (o.get("enum"), o.get("const")) {
        (Some(_), Some(_)) => return Err(bad(at, "`enum` beside `const` is not supported")),
        (Some(Value::Array(v)), None) if !v.is_empty() => v.iter().collect(),
        (Some(_), None) => return Err(bad(at, "`enum` must be a non-empty array")),
        (None, Some(c)) => vec![c],
        (None, None) => return Ok(None),
    };
    if values.len() > MAX_ALTERNATIVES {
        return Err(bad(at, format!("more than {MAX_ALTERNATIVES} enum values")));
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    for v in values {
        let s = serde_json::to_vec(v).map_err(|e| bad(at, e))?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(Some(out))
}

/// The values a `{"not": {"enum": [...]}}` or `{"not": {"const": v}}` excludes; `None` for any
/// other form of `not`.
pub(super) fn excluded_values(not: &Value, at: &str) -> Result<Option<Vec<Value>>> {
    let Value::Object(o) = not else {
        return Ok(None);
    };
    if !(o.contains_key("enum") || o.contains_key("const"))
        || !only_annotations_beside(o, &["enum", "const"])
    {
        return Ok(None);
    }
    Ok(match (o.get("enum"), o.get("const")) {
        (Some(_), Some(_)) => return Err(bad(at, "`enum` beside `const` is not supported")),
        (Some(Value::Array(v)), None) => Some(v.clone()),
        (Some(_), None) => return Err(bad(at, "`enum` must be an array")),
        (None, c) => Some(c.into_iter().cloned().collect()),
    })
}

/// `lits` without the values equal to one of `values`, as JSON Schema compares them (numbers
/// by value: `2` and `2.0` are the same value).
pub(super) fn without_values(lits: Vec<Vec<u8>>, values: &[Value]) -> Vec<Vec<u8>> {
    lits.into_iter()
        .filter(|l| {
            let v: Value = serde_json::from_slice(l).expect("a literal is JSON text");
            !values.iter().any(|x| same_value(&v, x))
        })
        .collect()
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| same_value(p, q)))
        }
        _ => a == b,
    }
}
