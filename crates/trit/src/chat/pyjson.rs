//! `tojson` as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! Unlike Jinja's own filter it does not HTML-escape, and its spacing is Python's
//! (`{"a": 1, "b": [1, 2]}`), which is what models saw in training. Tool schemas are
//! rendered with it, so every byte matters.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of `json.dumps` that templates pass.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline and `s` repeated per nesting level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

impl DumpOptions {
    /// Python's rule: with an indent the default item separator drops its trailing space.
    pub fn with_indent(mut self, indent: Option<String>) -> Self {
        if indent.is_some() {
            self.item_separator = ",".into();
        }
        self.indent = indent;
        self
    }
}

fn type_error(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: object of type {what} is not JSON serializable"),
    )
}

/// Serializes a template value like Python's `json.dumps`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &Value, opts: &DumpOptions, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v)?,
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, depth, '[', ']', &items, |out, item, depth| {
                write_value(out, item, opts, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                entries.push((map_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                opts,
                depth,
                '{',
                '}',
                &entries,
                |out, (k, item), depth| {
                    write_string(out, k, opts.ensure_ascii);
                    out.push_str(&opts.key_separator);
                    write_value(out, item, opts, depth)
                },
            )?;
        }
        ValueKind::Undefined => return Err(type_error("Undefined")),
        other => return Err(type_error(other)),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python converts str, int, float, bool and None keys to strings; anything else is an error.
fn map_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

fn write_number(out: &mut String, v: &Value) -> Result<(), Error> {
    if v.is_integer() {
        // Integers print their digits in both languages.
        out.push_str(&v.to_string());
    } else {
        let f = f64::try_from(v.clone())?;
        out.push_str(&python_float_repr(f));
    }
    Ok(())
}

/// `repr(float)` as `json.dumps` writes it: shortest round-trip digits, scientific notation
/// when the decimal exponent is below -4 or at least 16 (`1e-07`, `1e+16`), otherwise
/// positional with at least one decimal (`18.5`, `3.0`); non-finite values as JavaScript names.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.5e-7".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let m = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
        }
    } else {
        format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
    }
}

/// A JSON string as Python writes it: `"` `\` and control characters escaped (short forms for
/// \b \f \n \r \t), everything else literal unless `ensure_ascii`.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (18.5, "18.5"),
            (0.1, "0.1"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (1e22, "1e+22"),
            (123.456, "123.456"),
            (2.5e-310, "2.5e-310"),
            (f64::MAX, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f:e}");
        }
        assert_eq!(python_float_repr(f64::NAN), "NaN");
        assert_eq!(python_float_repr(f64::NEG_INFINITY), "-Infinity");
    }

    #[test]
    fn dumps_spacing_escaping_and_indent() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.0, null, true], "a": "é \"q\" <b>&\n\u{1}", "e": {}, "l": []
        }));
        let one_line = dumps(&v, &DumpOptions::default()).unwrap();
        assert_eq!(
            one_line,
            r#"{"b": [1, 2.0, null, true], "a": "é \"q\" <b>&\n\u0001", "e": {}, "l": []}"#
        );
        let opts = DumpOptions {
            ensure_ascii: true,
            sort_keys: true,
            ..Default::default()
        }
        .with_indent(Some("  ".into()));
        let pretty = dumps(&v, &opts).unwrap();
        assert_eq!(
            pretty,
            "{\n  \"a\": \"\\u00e9 \\\"q\\\" <b>&\\n\\u0001\",\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"e\": {},\n  \"l\": []\n}"
        );
        let emoji = dumps(
            &Value::from("🤖"),
            &DumpOptions {
                ensure_ascii: true,
                ..Default::default()
            },
        );
        assert_eq!(emoji.unwrap(), r#""\ud83e\udd16""#);
    }

    #[test]
    fn undefined_is_not_serializable() {
        assert!(dumps(&Value::UNDEFINED, &DumpOptions::default()).is_err());
    }
}
