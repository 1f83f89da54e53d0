//! `allOf` of several schemas merged into one (`schema/all_of.rs`), `not` of values beside an
//! `enum`, and `not` of a type:
//! exactly the documents serde_json parses and a hand-written check of every member admits,
//! and constrained draws that always end in such a document.

use super::tests::{accepts, draw};
use super::JsonSchema;
use serde_json::{json, Map, Value};

/// OpenAPI-style composition: a base model by `$ref`, a member that adds and narrows
/// properties and closes the object, and a member that narrows an enum.
fn composed() -> Value {
    json!({
        "$defs": {"base": {"type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1}},
            "required": ["id"]}},
        "description": "an item",
        "allOf": [
            {"$ref": "#/$defs/base"},
            {"properties": {
                "id": {"maximum": 99},
                "name": {"type": "string", "maxLength": 4},
                "tag": {"enum": ["a", "b", "c"]}},
             "required": ["name"], "additionalProperties": false},
            {"properties": {"tag": {"enum": ["b", "c", "d"]}}}
        ]
    })
}

/// Every member of `composed`, checked by hand on a parsed value. Python's `jsonschema`
/// (Draft 2020-12) gives the same verdict on all 400 candidate objects (checked in session 20).
fn is_composed(v: &Value) -> bool {
    let Value::Object(o) = v else {
        return false;
    };
    let id = o
        .get("id")
        .and_then(Value::as_i64)
        .is_some_and(|n| (1..=99).contains(&n))
        && o.get("id").is_some_and(|v| v.is_i64() || v.is_u64());
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|s| s.chars().count() <= 4);
    let tag = o
        .get("tag")
        .is_none_or(|t| t == &json!("b") || t == &json!("c"));
    let only = o
        .keys()
        .all(|k| ["id", "name", "tag"].contains(&k.as_str()));
    id && name && tag && only
}

/// Objects of every subset of four keys with values from small pools, in two key orders.
fn candidates() -> Vec<String> {
    let pools: [(&str, &[Value]); 4] = [
        (
            "id",
            &[
                json!(0),
                json!(1),
                json!(50),
                json!(99),
                json!(100),
                json!(1.5),
                json!("1"),
            ],
        ),
        (
            "name",
            &[json!(""), json!("abcd"), json!("abcde"), json!(3)],
        ),
        ("tag", &[json!("a"), json!("b"), json!("c"), json!("d")]),
        ("x", &[json!(1)]),
    ];
    let mut out = Vec::new();
    for mask in 0u32..16 {
        let keys: Vec<usize> = (0..4).filter(|i| mask & (1 << i) != 0).collect();
        // Every combination of the chosen keys' values (mixed radix).
        let total: usize = keys.iter().map(|&k| pools[k].1.len()).product();
        for mut n in 0..total {
            let mut pairs = Vec::new();
            for &k in &keys {
                let vals = pools[k].1;
                pairs.push((pools[k].0, vals[n % vals.len()].clone()));
                n /= vals.len();
            }
            for reversed in [false, true] {
                let mut p = pairs.clone();
                if reversed {
                    p.reverse();
                }
                let body: Vec<String> = p.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                out.push(format!("{{{}}}", body.join(",")));
            }
        }
    }
    out
}

#[test]
fn a_composed_object_admits_exactly_what_every_member_admits() {
    let s = JsonSchema::compile(&composed()).unwrap();
    let cands = candidates();
    let mut admitted = 0;
    for c in &cands {
        let v: Value = serde_json::from_str(c).unwrap();
        let want = is_composed(&v);
        assert_eq!(accepts(&s, c.as_bytes()), want, "{c}");
        admitted += want as usize;
    }
    // Both outcomes occur, so the comparison says something.
    assert!(
        admitted > 10 && admitted < cands.len() / 4,
        "{admitted} of {}",
        cands.len()
    );
}

#[test]
fn draws_under_a_composed_schema_satisfy_every_member() {
    for (seed, out) in draw(JsonSchema::compile(&composed()).unwrap(), 40)
        .into_iter()
        .enumerate()
    {
        let v: Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", String::from_utf8_lossy(&out)));
        assert!(is_composed(&v), "seed {seed}: {v}");
    }
}

#[test]
fn scalar_members_intersect_types_bounds_and_enums() {
    // Integers in (1, 5], from three members and the keywords beside them.
    let ints = json!({
        "allOf": [
            {"type": ["integer", "string"]},
            {"type": "number", "minimum": 0, "maximum": 10},
            {"maximum": 5}
        ],
        "exclusiveMinimum": 1
    });
    let s = JsonSchema::compile(&ints).unwrap();
    for (doc, ok) in [
        ("2", true),
        ("5", true),
        ("1", false),
        ("6", false),
        ("2.5", false),
        ("\"3\"", false),
        ("null", false),
    ] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
    // A string enum narrowed by a const of another member, and a length bound.
    let word = json!({"allOf": [
        {"enum": ["ab", "abc", "abcd"]},
        {"type": "string", "maxLength": 3},
        {"anyOf": [{"const": "abc"}, {"const": "abcd"}]}
    ]});
    let s = JsonSchema::compile(&word).unwrap();
    for (doc, ok) in [("\"abc\"", true), ("\"ab\"", false), ("\"abcd\"", false)] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
    // `format` beside a one-schema `allOf` is enforced (it was refused before merges).
    let date =
        JsonSchema::compile(&json!({"allOf": [{"type": "string"}], "format": "date"})).unwrap();
    assert!(accepts(&date, b"\"2026-12-02\""));
    assert!(!accepts(&date, b"\"tomorrow\""));
}

#[test]
fn merged_properties_meet_in_an_all_of_of_their_schemas() {
    // `p` is a string of 2 to 3 characters: minLength from one member, maxLength from another.
    let mut props = Map::new();
    props.insert("p".into(), json!({"type": "string", "minLength": 2}));
    let schema = json!({"type": "object", "allOf": [
        {"properties": props, "required": ["p"]},
        {"properties": {"p": {"maxLength": 3}}}
    ]});
    let s = JsonSchema::compile(&schema).unwrap();
    for (doc, ok) in [
        (r#"{"p":"ab"}"#, true),
        (r#"{"p":"abc","q":1}"#, true),
        (r#"{"p":"a"}"#, false),
        (r#"{"p":"abcd"}"#, false),
        (r#"{"q":"ab"}"#, false),
    ] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
}

#[test]
fn enum_values_outside_the_keywords_beside_them_are_dropped() {
    // The recognizer reads a node's literals alone: the bounds beside them filter the list.
    let words = JsonSchema::compile(&json!({"enum": ["a", "abcd"], "maxLength": 3})).unwrap();
    let numbers =
        JsonSchema::compile(&json!({"enum": [7, 70, 7.5], "maximum": 9, "multipleOf": 1})).unwrap();
    for (s, doc, ok) in [
        (&words, "\"a\"", true),
        (&words, "\"abcd\"", false),
        (&numbers, "7", true),
        (&numbers, "70", false),
        (&numbers, "7.5", false),
    ] {
        assert_eq!(accepts(s, doc.as_bytes()), ok, "{doc}");
    }
    let e = JsonSchema::compile(&json!({"const": "abcd", "maxLength": 3}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("admits no value"), "{e}");
}

#[test]
fn a_union_branch_that_admits_nothing_is_dropped() {
    let s = JsonSchema::compile(&json!({"anyOf": [
        {"type": "string", "enum": ["abcd"], "maxLength": 3},
        {"type": "integer", "minimum": 1}
    ]}))
    .unwrap();
    for (doc, ok) in [("5", true), ("0", false), ("\"abcd\"", false)] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
    let e = JsonSchema::compile(&json!({"oneOf": [{"const": "ab", "minLength": 3}]}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no branch"), "{e}");
}

#[test]
fn not_of_a_type_removes_that_type() {
    // "Any value but null", and "a number or a string, but not a string".
    let s = JsonSchema::compile(&json!({"not": {"type": "null"}})).unwrap();
    for (doc, ok) in [("null", false), ("1", true), ("\"x\"", true), ("[]", true)] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
    let s = JsonSchema::compile(&json!({"type": ["number", "string"], "not": {"type": "string"}}))
        .unwrap();
    for (doc, ok) in [("1.5", true), ("\"x\"", false), ("true", false)] {
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{doc}");
    }
    for (schema, word) in [
        (json!({"not": {"const": 1}}), "only beside an `enum`"),
        (json!({"not": {"minimum": 1}}), "only around a `type`"),
        (json!({"not": {"type": "integer"}}), "`integer` alone"),
        (
            json!({"type": "string", "not": {"type": "string"}}),
            "admits no value",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

/// Members' `additionalProperties` against the other members' properties: a property one
/// member names is an additional one for every member that does not, so it takes that member's
/// `additionalProperties` too; names no member lists take all of them. The verdicts are Python
/// `jsonschema`'s (Draft 2020-12) on the same documents.
#[test]
fn schema_valued_additional_properties_apply_to_other_members_properties() {
    let cases = [
        (
            json!({"allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}},
                 "additionalProperties": {"type": "string"}},
                {"properties": {"b": {"type": "string", "maxLength": 2}}, "required": ["b"]}]}),
            &[
                r#"{"b":"xy"}"#,
                r#"{"a":1,"b":"x"}"#,
                r#"{"b":"x","c":"s"}"#,
            ][..],
            &[
                r#"{"b":"xyz"}"#,
                r#"{"b":1}"#,
                r#"{"a":"1","b":"x"}"#,
                r#"{"b":"x","c":1}"#,
                "{}",
            ][..],
        ),
        (
            json!({"allOf": [
                {"type": "object", "additionalProperties": {"type": "integer"}},
                {"additionalProperties": {"minimum": 3}}]}),
            &[r#"{"x":3}"#, "{}", r#"{"x":4,"y":10}"#][..],
            &[r#"{"x":2}"#, r#"{"x":3.5}"#, r#"{"x":"s"}"#][..],
        ),
        (
            json!({"allOf": [
                {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": false},
                {"properties": {"a": {"type": "integer"}},
                 "additionalProperties": {"type": "boolean"}}]}),
            &[r#"{"a":1,"b":true}"#, "{}", r#"{"b":false}"#][..],
            &[r#"{"a":1,"b":1}"#, r#"{"c":true}"#, r#"{"a":"x"}"#][..],
        ),
    ];
    for (schema, yes, no) in cases {
        let s = JsonSchema::compile(&schema).unwrap();
        for d in yes {
            assert!(accepts(&s, d.as_bytes()), "{schema}: {d}");
        }
        for d in no {
            assert!(!accepts(&s, d.as_bytes()), "{schema}: {d}");
        }
    }
}

#[test]
fn not_of_values_removes_them_from_an_enum() {
    // (schema, documents admitted, documents refused)
    for (schema, yes, no) in [
        (
            json!({"enum": ["a", "b", "c"], "not": {"const": "b"}}),
            &["\"a\"", "\"c\""][..],
            &["\"b\"", "\"d\""][..],
        ),
        // Numbers compare by value, as JSON Schema says: 2.0 is 2.
        (
            json!({"enum": [1, 2.0, 3, "3"], "not": {"enum": [2, 3.0]}}),
            &["1", "\"3\""][..],
            &["2.0", "3", "2"][..],
        ),
        // The same through an `allOf` (the members merge into one node first).
        (
            json!({"allOf": [{"enum": ["a", "b", "c"]}, {"not": {"const": "b"}}]}),
            &["\"a\"", "\"c\""][..],
            &["\"b\""][..],
        ),
        (
            json!({"const": {"k": [1, 2]}, "not": {"enum": [{"k": [1]}]}}),
            &["{\"k\":[1,2]}"][..],
            &["{\"k\":[1]}"][..],
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        for d in yes {
            assert!(accepts(&s, d.as_bytes()), "{schema}: {d}");
        }
        for d in no {
            assert!(!accepts(&s, d.as_bytes()), "{schema}: {d}");
        }
    }
    for (schema, word) in [
        (
            json!({"enum": ["x", 2], "not": {"enum": ["x", 2.0]}}),
            "excludes every value",
        ),
        (
            json!({"type": "integer", "not": {"const": 3}}),
            "only beside an `enum`",
        ),
        (
            json!({"enum": [1], "not": {"enum": [1], "const": 1}}),
            "`enum` beside `const`",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

#[test]
fn enum_values_of_a_type_the_node_excludes_are_dropped() {
    // (schema, whether `1` stays admitted)
    for (schema, one) in [
        (json!({"type": "string", "enum": ["a", 1]}), false),
        (
            json!({"type": "string", "anyOf": [{"const": "a"}, {"const": 1}]}),
            false,
        ),
        (
            json!({"allOf": [{"enum": ["a", 1, 2.5]}, {"type": ["string", "integer"]}]}),
            true,
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        assert!(accepts(&s, b"\"a\""), "{schema}");
        assert_eq!(accepts(&s, b"1"), one, "{schema}");
        assert!(!accepts(&s, b"2.5"), "{schema}");
    }
    let e = JsonSchema::compile(&json!({"type": "integer", "enum": [1.5]}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("admits no value"), "{e}");
}

/// `not` of a string's pattern, format or values: the strings that do not match are admitted
/// (with `"type": "string"` inside the `not`, every non-string too; without it, `not` of a
/// string keyword admits strings only, as every non-string satisfies the keyword). The verdicts
/// on these documents are Python `jsonschema`'s (Draft 2020-12), checked in session 22.
#[test]
fn not_of_a_pattern_a_format_or_string_values_excludes_those_strings() {
    use super::tests::strings_over;
    let re = |p: &str| regex::Regex::new(p).unwrap();
    // (schema, which strings over "abc" it admits)
    type Rule = Box<dyn Fn(&str) -> bool>;
    let (a, b) = (re("^a"), re("b"));
    let cases: Vec<(Value, Rule)> = vec![
        (
            json!({"type": "string", "not": {"pattern": "^a"}}),
            Box::new(move |s| !a.is_match(s)),
        ),
        (
            json!({"not": {"pattern": "b"}}),
            Box::new(move |s| !b.is_match(s)),
        ),
        (
            json!({"type": "string", "not": {"enum": ["a", "ab"]}}),
            Box::new(|s| s != "a" && s != "ab"),
        ),
        (json!({"not": {"const": "c"}}), Box::new(|s| s != "c")),
    ];
    for (schema, admits) in &cases {
        let s = JsonSchema::compile(schema).unwrap();
        for text in strings_over("abc", 4) {
            let doc = format!("\"{text}\"");
            assert_eq!(
                accepts(&s, doc.as_bytes()),
                admits(&text),
                "{schema}: {doc}"
            );
        }
        // Draws of bounded strings (an unbounded one rarely closes within the draw's steps).
        let mut bounded = schema.clone();
        bounded["maxLength"] = json!(6);
        for doc in draw(JsonSchema::compile(&bounded).unwrap(), 12) {
            let v: Value = serde_json::from_slice(&doc).unwrap();
            if let Some(t) = v.as_str() {
                assert!(admits(t), "{schema}: drew {v}");
            }
        }
    }
    // Other kinds: a `not` of a string keyword alone admits strings only; with the type inside
    // the `not`, or of values, the other kinds stay.
    for (schema, doc, ok) in [
        (json!({"not": {"pattern": "b"}}), "1", false),
        (json!({"not": {"pattern": "b"}}), "null", false),
        (
            json!({"not": {"type": "string", "pattern": "b"}}),
            "1",
            true,
        ),
        (
            json!({"not": {"type": "string", "pattern": "b"}}),
            "\"ab\"",
            false,
        ),
        (
            json!({"not": {"type": "string", "pattern": "b"}}),
            "\"ac\"",
            true,
        ),
        (json!({"not": {"const": "c"}}), "[1]", true),
        (
            json!({"type": "string", "not": {"format": "uuid"}}),
            "\"abc\"",
            true,
        ),
        (
            json!({"type": "string", "not": {"format": "uuid"}}),
            "\"123e4567-e89b-12d3-a456-426614174000\"",
            false,
        ),
        (
            json!({"type": "string", "format": "date", "not": {"pattern": "^2024"}}),
            "\"2023-05-01\"",
            true,
        ),
        (
            json!({"type": "string", "format": "date", "not": {"pattern": "^2024"}}),
            "\"2024-05-01\"",
            false,
        ),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        assert_eq!(accepts(&s, doc.as_bytes()), ok, "{schema}: {doc}");
    }
    for (schema, word) in [
        (
            json!({"not": {"pattern": "a", "format": "date"}}),
            "together",
        ),
        (json!({"not": {"format": "hostname"}}), "annotation"),
        (json!({"not": {"const": 1}}), "only beside an `enum`"),
        (
            json!({"type": "string", "not": {"pattern": ""}}),
            "admits no string",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

/// `allOf` members with different `multipleOf`s: the multiples of their least common multiple
/// (in decimal: 0.5 and 0.3 give 1.5). Verdicts are Python `jsonschema`'s, checked in session 22.
#[test]
fn different_multiples_meet_at_their_least_common_multiple() {
    let ints = JsonSchema::compile(
        &json!({"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]}),
    )
    .unwrap();
    for (doc, ok) in [
        ("12", true),
        ("0", true),
        ("-36", true),
        ("6", false),
        ("4", false),
        ("18", false),
    ] {
        assert_eq!(accepts(&ints, doc.as_bytes()), ok, "{doc}");
    }
    let decs = JsonSchema::compile(
        &json!({"allOf": [{"type": "number", "multipleOf": 0.5}, {"multipleOf": 0.3}, {"maximum": 5}]}),
    )
    .unwrap();
    for (doc, ok) in [
        ("1.5", true),
        ("3", true),
        ("4.5", true),
        ("0", true),
        ("0.5", false),
        ("0.3", false),
        ("0.6", false),
        ("6", false),
    ] {
        assert_eq!(accepts(&decs, doc.as_bytes()), ok, "{doc}");
    }
    for doc in draw(decs, 10) {
        let x: f64 = serde_json::from_slice(&doc).unwrap();
        assert!(
            ((x / 1.5).round() * 1.5 - x).abs() < 1e-9 && x <= 5.0,
            "{x}"
        );
    }
    for schema in [
        json!({"allOf": [{"multipleOf": 0}, {"multipleOf": 3}]}),
        json!({"allOf": [{"multipleOf": 999_999_999_937u64}, {"multipleOf": 999_999_999_989u64}]}),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains("least common multiple"), "{schema}: {e}");
    }
}
