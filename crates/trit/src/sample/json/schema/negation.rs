//! `not` of string constraints, as patterns the string must not match (`pattern.rs`'s negated
//! parts): `{"not": {"pattern": P}}`, `{"not": {"format": F}}` for an enforced format, either
//! with `"type": "string"` beside it inside the `not`, and `{"not": {"const"/"enum": …}}` of
//! string values where no `enum`/`const` stands beside the `not` (with one, the values are
//! taken out of it instead: `literals.rs`).

use super::{bad, literal_kind, only_annotations_beside, STRING};
use crate::sample::json::pattern::format_regex;
use crate::Result;
use serde_json::Value;

/// What a `not` of string keywords leaves.
pub(super) struct StringExclusion {
    /// The `not` holds `pattern`/`format` without `"type": "string"`: every non-string value
    /// satisfies those keywords, so their negation admits strings only.
    pub strings_only: bool,
    /// Searching patterns (JSON Schema's sense) the string must not match.
    pub patterns: Vec<String>,
}

/// The `not` forms of a pattern or a format; `None` for any other form.
pub(super) fn string_exclusion(not: &Value, at: &str) -> Result<Option<StringExclusion>> {
    let Value::Object(o) = not else {
        return Ok(None);
    };
    let (pattern, format) = (o.get("pattern"), o.get("format"));
    if pattern.is_none() && format.is_none()
        || !only_annotations_beside(o, &["pattern", "format", "type"])
    {
        return Ok(None);
    }
    let strings_only = match o.get("type") {
        None => true,
        Some(Value::String(t)) if t == "string" => false,
        Some(_) => return Ok(None),
    };
    let regex = match (pattern, format) {
        (Some(_), Some(_)) => {
            // not (P and F) is "not P or not F": no single pattern to exclude.
            return Err(bad(
                at,
                "`not` of a `pattern` and a `format` together is not supported",
            ));
        }
        (Some(Value::String(p)), None) => p.clone(),
        (Some(_), None) => return Err(bad(at, "`pattern` must be a string")),
        (None, Some(f)) => {
            let name = f.as_str().unwrap_or_default();
            format_regex(name).ok_or_else(|| {
                bad(
                    at,
                    format!("`not` of the format {f} (an annotation here, so it would exclude every string)"),
                )
            })?
        }
        (None, None) => unreachable!("checked above"),
    };
    Ok(Some(StringExclusion {
        strings_only,
        patterns: vec![regex],
    }))
}

/// The `not` of `values` (an `enum`/`const` with none beside it) for a node admitting `kinds`:
/// one anchored pattern excluding the string values. A value of another kind the node admits
/// cannot be taken out (there is no list of the node's values to take it from): refused.
pub(super) fn excluded_strings(values: &[Value], kinds: u8, at: &str) -> Result<Vec<String>> {
    let mut words = Vec::new();
    for v in values {
        match v {
            Value::String(s) => words.push(escape(s)),
            _ => {
                let text = serde_json::to_vec(v).map_err(|e| bad(at, e))?;
                if kinds & literal_kind(&text) != 0 {
                    return Err(bad(
                        at,
                        "`not` of non-string values (`enum`/`const`) is supported only beside an `enum` or `const`",
                    ));
                }
            }
        }
    }
    if words.is_empty() || kinds & STRING == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![format!("^(?:{})$", words.join("|"))])
}

/// `s` as a regular expression that matches exactly it.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
