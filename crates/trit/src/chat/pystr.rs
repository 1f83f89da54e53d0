//! How Jinja2 prints values: Python's `str()`. minijinja prints `none`, `["a"]` and `1e-7`
//! where Python prints `None`, `['a']` and `1e-07`; templates that print a list, a dict or a
//! missing field would otherwise render differently from transformers.

use minijinja::value::{Value, ValueKind};

use super::pyjson::python_float_repr;

/// `str(value)` for the kinds whose Python spelling differs from minijinja's; `None` for
/// kinds minijinja already prints like Python (strings, integers, undefined, objects).
pub fn python_str(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            write_repr(&mut out, value);
            Some(out)
        }
        ValueKind::Number if !value.is_integer() => {
            f64::try_from(value.clone()).ok().map(python_float_repr)
        }
        _ => None,
    }
}

/// `repr(value)`, as used for the items of printed containers.
fn write_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::String => write_str_repr(out, v.as_str().unwrap_or_default()),
        ValueKind::Number => match python_str(v) {
            Some(s) => out.push_str(&s),
            None => out.push_str(&v.to_string()),
        },
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &v.get_item(&key).unwrap_or(Value::UNDEFINED));
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Characters Python's `str.isprintable()` rejects (controls, separators other than the ASCII
/// space, common format characters); `repr` escapes them.
fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{A0}' | '\u{AD}' | '\u{1680}' | '\u{2000}'..='\u{200F}' | '\u{2028}'..='\u{202F}'
            | '\u{205F}'..='\u{2064}' | '\u{3000}' | '\u{FEFF}')
}

/// Python's string repr: single quotes unless the text has `'` and no `"`.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_unprintable(c) => {
                let n = c as u32;
                if n < 0x100 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_python_str() {
        // Expected strings are Python 3's str() of the same values.
        let v = Value::from_serialize(serde_json::json!([
            "a",
            "it's",
            "say \"hi\"",
            "both ' \"",
            "tab\t\u{1}\u{a0}é",
            null,
            true,
            2.5,
            1e-7,
            3
        ]));
        assert_eq!(
            python_str(&v).unwrap(),
            r#"['a', "it's", 'say "hi"', 'both \' "', 'tab\t\x01\xa0é', None, True, 2.5, 1e-07, 3]"#
        );
        let m = Value::from_serialize(serde_json::json!({"k": "v", "n": null}));
        assert_eq!(python_str(&m).unwrap(), "{'k': 'v', 'n': None}");
        assert_eq!(python_str(&Value::from(1.0)).unwrap(), "1.0");
        assert_eq!(python_str(&Value::from("plain")), None);
        assert_eq!(python_str(&Value::from(7)), None);
    }
}
