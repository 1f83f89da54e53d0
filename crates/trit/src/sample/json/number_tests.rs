//! `minimum`/`maximum` on type `number` (`dec_range.rs`) and an integer's `multipleOf`
//! (`int_range.rs`): every short text the recognizer admits against serde_json's reading of it
//! and the bounds, prefixes that can still be completed, and random draws that stay in range.

use super::tests::{accepts, draw, strings_over};
use super::{JsonSchema, Recognizer};
use serde_json::{json, Value};

/// Every text of up to `n` bytes over a number's characters.
fn number_strings(n: usize) -> Vec<String> {
    strings_over("-0123456789.e", n)
}

/// `x` against the bounds, each as (value, exclusive).
fn within(x: f64, lo: Option<(f64, bool)>, hi: Option<(f64, bool)>) -> bool {
    lo.is_none_or(|(l, ex)| if ex { x > l } else { x >= l })
        && hi.is_none_or(|(h, ex)| if ex { x < h } else { x <= h })
}

#[test]
fn number_bounds_admit_exactly_the_decimals_in_range() {
    let strings = number_strings(4);
    let tails = number_strings(2);
    for (schema, lo, hi) in [
        (
            json!({"type": "number", "minimum": -2.5, "maximum": 12.25}),
            Some((-2.5, false)),
            Some((12.25, false)),
        ),
        (
            json!({"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 1}),
            Some((0.5, true)),
            Some((1.0, true)),
        ),
        (
            json!({"type": "number", "minimum": 10.5}),
            Some((10.5, false)),
            None,
        ),
        (
            json!({"type": ["number", "null"], "maximum": -0.25}),
            None,
            Some((-0.25, false)),
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        let small = lo.is_some() && hi.is_some();
        for text in &strings {
            // The whole text: a JSON number without an exponent (bounded numbers take none),
            // in range by serde_json's value (exact for texts this short).
            let want = !text.contains('e')
                && serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.as_f64())
                    .is_some_and(|x| within(x, lo, hi));
            assert_eq!(accepts(&s, text.as_bytes()), want, "{schema} on {text:?}");
            // As a prefix (up to 3 bytes): refused only when no continuation of up to 2 bytes
            // completes it; accepted only when one does (checked where both bounds keep
            // completions short).
            if text.len() > 3 {
                continue;
            }
            let mut r = Recognizer::new(&s);
            let fed = r.feed_all(text.as_bytes());
            let completes = tails
                .iter()
                .any(|tail| accepts(&s, format!("{text}{tail}").as_bytes()));
            if completes {
                assert!(fed, "{schema}: the prefix {text:?} was refused");
            } else if fed && small && (1..=2).contains(&text.len()) {
                panic!("{schema}: the prefix {text:?} was accepted but cannot be completed");
            }
        }
    }
}

#[test]
fn number_bounds_are_exact_at_many_decimals() {
    let s =
        JsonSchema::compile(&json!({"type": "number", "minimum": 0.1, "maximum": 0.3})).unwrap();
    for (text, ok) in [
        ("0.1", true),
        ("0.3", true),
        ("0.300000000000000000", true),
        ("0.300000000000000001", false),
        ("0.099999999999999999", false),
        ("0.2999999999999999999", false), // a 19th decimal: beyond the grid
        ("1e-1", false),                  // no exponent on bounded numbers
    ] {
        assert_eq!(accepts(&s, text.as_bytes()), ok, "{text}");
    }
    for (schema, word) in [
        (json!({"type": "number", "minimum": 1e-19}), "decimals"),
        (
            json!({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1}),
            "no number",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

#[test]
fn constrained_draws_under_number_bounds_stay_in_them() {
    let schema = json!({"type": "object", "properties": {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "offset": {"type": "number", "minimum": -0.75, "maximum": -0.5}},
        "required": ["temperature", "p", "offset"], "additionalProperties": false});
    for (seed, out) in draw(JsonSchema::compile(&schema).unwrap(), 30)
        .into_iter()
        .enumerate()
    {
        let v: Value = serde_json::from_slice(&out).unwrap();
        let t = v["temperature"].as_f64().unwrap();
        let p = v["p"].as_f64().unwrap();
        let o = v["offset"].as_f64().unwrap();
        assert!((0.0..=2.0).contains(&t), "seed {seed}: {v}");
        assert!(p > 0.0 && p < 1.0, "seed {seed}: {v}");
        assert!((-0.75..=-0.5).contains(&o), "seed {seed}: {v}");
    }
}

/// `text` is fed as a prefix exactly when one of `tails` completes it.
fn prefix_fed_exactly_when_completable(
    s: &JsonSchema,
    schema: &Value,
    text: &str,
    tails: &[String],
) {
    let mut r = Recognizer::new(s);
    let fed = r.feed_all(text.as_bytes());
    let completes = tails
        .iter()
        .any(|tail| accepts(s, format!("{text}{tail}").as_bytes()));
    assert_eq!(fed, completes, "{schema}: the prefix {text:?}");
}

#[test]
fn integer_multiples_admit_exactly_the_multiples_in_range() {
    let strings = strings_over("-0123456789", 4);
    let tails = strings_over("0123456789", 3);
    for (schema, lo, hi, step) in [
        (
            json!({"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 100}),
            -30,
            100,
            7,
        ),
        (
            json!({"type": "integer", "multipleOf": 25}),
            i64::MIN,
            i64::MAX,
            25,
        ),
        (
            json!({"type": ["integer", "null"], "multipleOf": 3, "exclusiveMinimum": 10}),
            11,
            i64::MAX,
            3,
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        for text in &strings {
            let want = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.as_i64())
                .is_some_and(|x| lo <= x && x <= hi && x % step == 0);
            assert_eq!(accepts(&s, text.as_bytes()), want, "{schema} on {text:?}");
            // Short prefixes (for these schemas a 3-digit continuation completes one whenever
            // any does).
            if text.len() <= 2 {
                prefix_fed_exactly_when_completable(&s, &schema, text, &tails);
            }
        }
    }
    for (schema, word) in [
        (json!({"type": "boolean", "multipleOf": 5}), "numbers only"),
        (
            json!({"type": "integer", "multipleOf": 0.5}),
            "positive integer",
        ),
        (
            json!({"type": "integer", "multipleOf": 0}),
            "positive integer",
        ),
        (
            json!({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}),
            "no multiple",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

#[test]
fn number_multiples_admit_exactly_the_multiples_on_the_grid() {
    let strings = number_strings(5);
    let tails = strings_over("0123456789.", 2);
    // (schema, bounds, divisor in hundredths: texts this short are exact in hundredths·f64).
    for (schema, lo, hi, step) in [
        (
            json!({"type": "number", "multipleOf": 0.25, "minimum": -1, "maximum": 3}),
            -1.0,
            3.0,
            25,
        ),
        (
            json!({"type": "number", "multipleOf": 0.01}),
            f64::MIN,
            f64::MAX,
            1,
        ),
        (
            json!({"type": ["number", "null"], "multipleOf": 1.5, "exclusiveMaximum": 10}),
            f64::MIN,
            9.99,
            150,
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        for text in &strings {
            let want = !text.contains('e')
                && serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.as_f64())
                    .is_some_and(|x| {
                        let cents = x * 100.0;
                        lo <= x
                            && x <= hi
                            && (cents - cents.round()).abs() < 1e-6
                            && cents.round() as i64 % step == 0
                    });
            assert_eq!(accepts(&s, text.as_bytes()), want, "{schema} on {text:?}");
            // Prefixes of up to 2 bytes (a 2-byte continuation completes one whenever any
            // does).
            if text.len() <= 2 {
                prefix_fed_exactly_when_completable(&s, &schema, text, &tails);
            }
        }
    }
    for (schema, word) in [
        (json!({"type": "number", "multipleOf": 1e-19}), "decimals"),
        (json!({"type": "number", "multipleOf": -2}), "positive"),
        (
            json!({"type": "number", "multipleOf": 0.5, "minimum": 0.1, "maximum": 0.4}),
            "no multiple",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}
