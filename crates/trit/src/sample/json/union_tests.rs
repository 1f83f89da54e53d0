//! `anyOf`/`oneOf` branches a value's first byte cannot tell apart (two object models, a string
//! enum beside a string pattern), read along every branch at once (`recognizer/forks.rs`):
//! exactly the documents serde_json parses and a hand-written check of the schema admits, and
//! constrained draws that always end in such a document.

use super::tests::{accepts, draw};
use super::{JsonSchema, Recognizer};
use serde_json::{json, Value};

/// Cat or dog (objects told apart by `kind`, which may come after the other property), or a
/// string that is "ab", "cd" or a run of `a`s.
fn pets() -> Value {
    json!({
        "$defs": {
            "cat": {"type": "object", "properties": {
                "kind": {"const": "cat"},
                "lives": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["kind", "lives"], "additionalProperties": false},
            "dog": {"type": "object", "properties": {
                "kind": {"const": "dog"},
                "name": {"type": "string", "maxLength": 3}},
                "required": ["kind"], "additionalProperties": false}
        },
        "oneOf": [
            {"$ref": "#/$defs/cat"},
            {"$ref": "#/$defs/dog"},
            {"enum": ["ab", "cd"]},
            {"type": "string", "pattern": "^a+$"}
        ],
        "discriminator": {"propertyName": "kind"}
    })
}

/// The schema of `pets`, checked by hand on a parsed value.
fn is_pet(v: &Value) -> bool {
    let only = |o: &serde_json::Map<String, Value>, keys: &[&str]| {
        o.keys().all(|k| keys.contains(&k.as_str()))
    };
    match v {
        Value::Object(o) => {
            let cat = only(o, &["kind", "lives"])
                && o.get("kind") == Some(&json!("cat"))
                && o.get("lives")
                    .and_then(Value::as_i64)
                    .is_some_and(|n| (0..=9).contains(&n));
            let dog = only(o, &["kind", "name"])
                && o.get("kind") == Some(&json!("dog"))
                && o.get("name")
                    .is_none_or(|n| n.as_str().is_some_and(|s| s.chars().count() <= 3));
            cat || dog
        }
        Value::String(s) => {
            s == "ab" || s == "cd" || (!s.is_empty() && s.chars().all(|c| c == 'a'))
        }
        _ => false,
    }
}

/// Objects of up to three of the properties with values from a small pool, in every order,
/// and strings near the branches.
fn candidates() -> Vec<String> {
    let keys = ["kind", "lives", "name", "x"];
    let values = [
        json!("cat"),
        json!("dog"),
        json!("bird"),
        json!(0),
        json!(9),
        json!(10),
        json!(-1),
        json!("rex"),
        json!("fido"),
        json!(null),
    ];
    let mut out = Vec::new();
    let pairs: Vec<(usize, usize)> = (0..keys.len())
        .flat_map(|k| (0..values.len()).map(move |v| (k, v)))
        .collect();
    for &a in &pairs {
        out.push(format!("{{\"{}\":{}}}", keys[a.0], values[a.1]));
        for &b in &pairs {
            if b.0 == a.0 {
                continue;
            }
            out.push(format!(
                "{{\"{}\":{},\"{}\":{}}}",
                keys[a.0], values[a.1], keys[b.0], values[b.1]
            ));
        }
    }
    for s in ["", "a", "aaa", "ab", "abc", "cd", "c", "b", "ba"] {
        out.push(format!("\"{s}\""));
    }
    out.extend(["{}".into(), "null".into(), "[]".into(), "3".into()]);
    out
}

#[test]
fn overlapping_branches_admit_exactly_the_documents_of_some_branch() {
    let schema = pets();
    let s = JsonSchema::compile(&schema).unwrap();
    let (mut yes, mut no) = (0, 0);
    for text in candidates() {
        let v: Value = serde_json::from_str(&text).unwrap();
        let want = is_pet(&v);
        assert_eq!(accepts(&s, text.as_bytes()), want, "{text}");
        if want {
            yes += 1;
        } else {
            no += 1;
        }
        // Every prefix of a document the schema admits is fed (no reading lost on the way).
        if want {
            for cut in 0..text.len() {
                let mut r = Recognizer::new(&s);
                assert!(r.feed_all(&text.as_bytes()[..cut]), "{text} at {cut}");
            }
        }
    }
    assert!(
        yes >= 12 && no > 100,
        "both kinds of candidates: {yes} admitted, {no} refused"
    );
}

#[test]
fn constrained_draws_under_overlapping_branches_end_in_a_document_of_one() {
    for out in draw(JsonSchema::compile(&pets()).unwrap(), 40) {
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(is_pet(&v), "{}", String::from_utf8_lossy(&out));
    }
    // Inside an array, one fork per item.
    let list = json!({"type": "array", "items": {"oneOf": pets()["oneOf"].clone()},
                      "maxItems": 3, "$defs": pets()["$defs"].clone()});
    let s = JsonSchema::compile(&list).unwrap();
    assert!(accepts(
        &s,
        br#"[{"lives":3,"kind":"cat"},"aa",{"kind":"dog"}]"#
    ));
    assert!(!accepts(&s, br#"[{"lives":3,"kind":"dog"}]"#));
    for out in draw(s, 30) {
        let v: Value = serde_json::from_slice(&out).unwrap();
        let items = v.as_array().expect("an array");
        assert!(items.len() <= 3 && items.iter().all(is_pet), "{v}");
    }
}

#[test]
fn a_recursive_reference_may_be_a_branch() {
    let expr = json!({
        "$defs": {"expr": {"anyOf": [
            {"type": "object", "properties": {"num": {"type": "integer"}},
             "required": ["num"], "additionalProperties": false},
            {"type": "object", "properties": {
                "add": {"type": "array", "items": {"$ref": "#/$defs/expr"}, "maxItems": 2}},
             "required": ["add"], "additionalProperties": false}
        ]}},
        "$ref": "#/$defs/expr"
    });
    let s = JsonSchema::compile(&expr).unwrap();
    assert!(accepts(&s, br#"{"add":[{"num":1},{"add":[{"num":2}]}]}"#));
    assert!(!accepts(&s, br#"{"add":[{"num":"x"}]}"#));
    assert!(!accepts(&s, br#"{"num":1,"add":[]}"#));
    fn valid(v: &Value) -> bool {
        let o = v.as_object().expect("an object");
        match (o.get("num"), o.get("add")) {
            (Some(n), None) => n.is_i64(),
            (None, Some(Value::Array(a))) => a.len() <= 2 && a.iter().all(valid),
            _ => false,
        }
    }
    for out in draw(s, 30) {
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(valid(&v), "{v}");
    }
}

#[test]
fn a_bounded_number_beside_an_integer_branch_admits_either() {
    let s = JsonSchema::compile(&json!({"anyOf": [
        {"type": "number", "minimum": 0, "maximum": 1},
        {"type": "integer", "minimum": -5, "maximum": 5}
    ]}))
    .unwrap();
    for (text, want) in [
        ("0.5", true),
        ("-3", true),
        ("5", true),
        ("1.0", true),
        ("-0.5", false),
        ("6", false),
        ("1.5", false),
        ("-6", false),
    ] {
        assert_eq!(accepts(&s, text.as_bytes()), want, "{text}");
    }
}

#[test]
fn overlapping_branches_beside_other_constraints_are_refused() {
    let e = JsonSchema::compile(&json!({
        "type": "object",
        "anyOf": [{"type": "object"}, {"type": "object", "required": ["a"],
                                        "properties": {"a": {}}}]
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("beside other keywords"), "{e}");
}
