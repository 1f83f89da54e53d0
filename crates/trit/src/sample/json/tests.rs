//! The recognizer against serde_json (the reference JSON parser): the same verdict on random
//! documents and their one-byte mutations; schemas enforced on random constrained draws.

use super::*;
use crate::sample::constraint::{Constrain, Follow};
use crate::sample::Sampler;
use crate::sample::SamplingParams;
use crate::sample::TokenTable;
use serde_json::{json, Value};
use std::sync::Arc;

/// xorshift64*: deterministic test inputs.
use crate::test_values::TestRng as Rand;

fn random_value(r: &mut Rand, depth: usize) -> Value {
    let strings = [
        "",
        "a",
        "héllo",
        "tab\there",
        "quote\"d",
        "back\\slash",
        "日本",
        "\u{1}",
        "😀",
    ];
    match r.below(if depth > 3 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(r.below(2) == 1),
        2 => json!((r.next_u64() % 2001) as i64 - 1000),
        3 => json!(((r.next_u64() % 100_000) as f64 - 50_000.0) / 7.0),
        4 => Value::String(strings[r.below(strings.len())].to_string()),
        5 => Value::Array(
            (0..r.below(4))
                .map(|_| random_value(r, depth + 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..r.below(4))
                .map(|i| {
                    (
                        format!("{}{i}", strings[r.below(strings.len())]),
                        random_value(r, depth + 1),
                    )
                })
                .collect(),
        ),
    }
}

pub(super) fn accepts(schema: &JsonSchema, text: &[u8]) -> bool {
    let mut r = Recognizer::new(schema);
    r.feed_all(text) && r.can_end()
}

fn any_value() -> JsonSchema {
    JsonSchema::compile(&json!({})).unwrap()
}

#[test]
fn valid_documents_are_accepted_compact_and_pretty() {
    let mut r = Rand(7);
    let any = any_value();
    let object = JsonSchema::any_object();
    for _ in 0..500 {
        let v = random_value(&mut r, 0);
        for text in [
            serde_json::to_vec(&v).unwrap(),
            serde_json::to_vec_pretty(&v).unwrap(),
        ] {
            assert!(accepts(&any, &text), "{}", String::from_utf8_lossy(&text));
            assert_eq!(
                accepts(&object, &text),
                v.is_object(),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }
}

#[test]
fn one_byte_mutations_get_serde_jsons_verdict() {
    let mut r = Rand(11);
    let any = any_value();
    let alphabet = b"{}[]\",:0123456789-+.eEtrufalsn \n\\u\x01\xc3\xa9x";
    let mut checked = 0;
    for _ in 0..3000 {
        let v = random_value(&mut r, 0);
        let mut text = serde_json::to_vec(&v).unwrap();
        let at = r.below(text.len() + 1);
        match r.below(3) {
            0 if at < text.len() => {
                text.remove(at);
            }
            1 => text.insert(at, alphabet[r.below(alphabet.len())]),
            _ if at < text.len() => text[at] = alphabet[r.below(alphabet.len())],
            _ => continue,
        }
        if long_exponent(&text) {
            continue; // refused on purpose (exponents of at most two digits)
        }
        let reference = serde_json::from_slice::<Value>(&text).is_ok();
        assert_eq!(
            accepts(&any, &text),
            reference,
            "{:?}",
            String::from_utf8_lossy(&text)
        );
        checked += 1;
    }
    assert!(checked > 2500);
}

/// Whether `text` has an `e`/`E` followed by three or more digits (after an optional sign).
fn long_exponent(text: &[u8]) -> bool {
    text.iter().enumerate().any(|(i, &c)| {
        let rest = &text[i + 1..];
        let rest = rest
            .strip_prefix(b"-")
            .or(rest.strip_prefix(b"+"))
            .unwrap_or(rest);
        (c == b'e' || c == b'E') && rest.iter().take_while(|d| d.is_ascii_digit()).count() >= 3
    })
}

#[test]
fn nothing_may_follow_a_complete_object_and_prefixes_cannot_end() {
    let object = JsonSchema::any_object();
    let mut r = Recognizer::new(&object);
    assert!(!r.can_end());
    assert!(r.feed_all(br#"{"a": [1, 2.5e3, "x"]"#));
    assert!(!r.can_end() && !r.is_done());
    assert!(r.feed(b'}'));
    assert!(r.is_done() && r.can_end());
    // Whitespace may trail (the constraint then asks for the end); no second value.
    assert!(r.clone_state_feed(b' ') && !r.clone_state_feed(b'{'));
    // A top-level number ends where the output ends.
    let num = JsonSchema::compile(&json!({"type": "number"})).unwrap();
    let mut r = Recognizer::new(&num);
    assert!(r.feed_all(b"-12.5"));
    assert!(r.can_end() && !r.is_done());
    assert!(!r.feed(b'.'));
}

impl Recognizer<'_> {
    fn clone_state_feed(&self, b: u8) -> bool {
        Recognizer::resume(self.schema(), self.state.clone()).feed(b)
    }
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer"},
            "role": {"enum": ["admin", "user", 3, null]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "boss": {"anyOf": [{"$ref": "#/$defs/ref"}, {"type": "null"}]},
            "score": {"type": ["number", "null"]}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false,
        "$defs": {"ref": {"type": "object", "properties": {"id": {"type": "integer"}},
                          "required": ["id"], "additionalProperties": false}}
    })
}

#[test]
fn a_schema_admits_exactly_its_documents() {
    let s = JsonSchema::compile(&person()).unwrap();
    let good = [
        r#"{"name":"Ann","age":41,"tags":["x"]}"#,
        r#"{"tags":["a","b","c"],"age":-3,"name":"日本語","role":"admin","boss":{"id":2}}"#,
        r#"{"name":"B","age":0,"tags":["t"],"role":3,"boss":null,"score":1.5e-3}"#,
        r#"{ "name" : "B" , "age" : 7 , "tags" : [ "t" ] , "role" : null, "score": null }"#,
    ];
    for g in good {
        assert!(accepts(&s, g.as_bytes()), "{g}");
    }
    let bad = [
        r#"{"name":"Ann","age":41}"#,           // required tags missing
        r#"{"name":"","age":41,"tags":["x"]}"#, // minLength
        r#"{"name":"abcdefghijklm","age":1,"tags":["x"]}"#, // maxLength 12
        r#"{"name":"A","age":4.5,"tags":["x"]}"#, // integer
        r#"{"name":"A","age":4,"tags":[]}"#,    // minItems
        r#"{"name":"A","age":4,"tags":["a","b","c","d"]}"#, // maxItems
        r#"{"name":"A","age":4,"tags":["x"],"role":"root"}"#, // enum
        r#"{"name":"A","age":4,"tags":["x"],"extra":1}"#, // additionalProperties
        r#"{"name":"A","age":4,"tags":["x"],"boss":{}}"#, // nested required
        r#"{"name":"A","age":4,"tags":["x"],"score":"1"}"#, // type union
        r#"["name"]"#,
    ];
    for b in bad {
        assert!(!accepts(&s, b.as_bytes()), "{b}");
    }
}

#[test]
fn unsupported_keywords_and_contradictions_are_refused_by_name() {
    for (schema, word) in [
        (json!({"type": "string", "pattern": "a(?=b)"}), "pattern"),
        (json!({"type": "string", "multipleOf": 3}), "multipleOf"),
        (json!({"type": "string", "minimum": 0}), "numbers only"),
        (
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}], "minLength": 2}),
            "beside an `anyOf`",
        ),
        (
            json!({"allOf": [{"prefixItems": [{"type": "integer"}]}, {"prefixItems": [{"type": "string"}]}]}),
            "different `prefixItems`",
        ),
        (
            json!({"type": "string", "allOf": [{"pattern": "^a+$"}, {"pattern": "^b"}]}),
            "admits no string",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": ["integer", "null"]}]}),
            "no common type",
        ),
        (
            json!({"allOf": [{"enum": [1, 2]}, {"const": 3}]}),
            "no value",
        ),
        (
            json!({"allOf": [
                {"properties": {"a": {}}, "additionalProperties": false},
                {"required": ["b"]}]}),
            "\"b\" is required",
        ),
        (
            json!({"$defs": {"t": {"allOf": [{"$ref": "#/$defs/t"}, {"type": "object"}]}},
                   "$ref": "#/$defs/t"}),
            "too deep",
        ),
        (
            json!({"allOf": [{"anyOf": [{"type": "string"}, {"type": "null"}]},
                             {"oneOf": [{"type": "string"}, {"type": "integer"}]}]}),
            "several `anyOf`",
        ),
        (
            json!({"type": "object", "anyOf": [{"type": "object"}, {"type": "object"}]}),
            "beside other keywords",
        ),
        (json!({"type": "object", "required": ["x"]}), "\"x\""),
        (
            json!({"$ref": "http://example.com/s.json"}),
            "only references",
        ),
        (json!({"type": "wat"}), "unknown type"),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
    // Annotations are not constraints.
    JsonSchema::compile(
        &json!({"title": "t", "description": "d", "type": "string", "format": "date"}),
    )
    .unwrap();
}

#[test]
fn a_recursive_schema_nests() {
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"], "additionalProperties": false}},
        "$ref": "#/$defs/node"
    });
    let s = JsonSchema::compile(&tree).unwrap();
    assert!(accepts(
        &s,
        br#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]}"#
    ));
    assert!(!accepts(&s, br#"{"v":1,"kids":[{"w":2}]}"#));
}

/// pydantic wraps a described field of a model type in a one-schema `allOf`; the field is that
/// model's schema, recursion included, and the wrapper's annotations constrain nothing.
#[test]
fn a_one_schema_all_of_is_that_schema() {
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer"},
            "first": {"allOf": [{"$ref": "#/$defs/node"}], "description": "a child",
                      "default": null}},
            "required": ["v"], "additionalProperties": false}},
        "type": "object",
        "properties": {"root": {"allOf": [{"$ref": "#/$defs/node"}], "title": "Root"}},
        "required": ["root"], "additionalProperties": false
    });
    let s = JsonSchema::compile(&tree).unwrap();
    assert!(accepts(
        &s,
        br#"{"root":{"v":1,"first":{"v":2,"first":{"v":3}}}}"#
    ));
    assert!(!accepts(&s, br#"{"root":{"v":1,"first":{"w":2}}}"#));
    assert!(!accepts(&s, br#"{"root":{"first":{"v":2}}}"#));
    // A wrapper as a `$defs` target is its schema too.
    let wrapped = json!({
        "$defs": {"id": {"allOf": [{"type": "integer", "minimum": 0}]}},
        "type": "array", "items": {"$ref": "#/$defs/id"}
    });
    let s = JsonSchema::compile(&wrapped).unwrap();
    assert!(accepts(&s, b"[0,7]") && !accepts(&s, b"[-1]") && !accepts(&s, br#"["a"]"#));
}

/// A byte-level vocabulary: every single byte, a few multi-byte tokens, and an EOS.
fn byte_vocab() -> (Arc<TokenTable>, u32) {
    let mut t: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    for s in [
        "{\"", "\":", "\",\"", "true", "null", "admin", "name", "age", "tags", "\"]", "},",
    ] {
        t.push(Some(s.as_bytes().to_vec()));
    }
    let eos = t.len() as u32;
    t.push(None);
    (Arc::new(TokenTable::from_bytes(t)), eos)
}

/// Random logits, drawn through the constraint until it ends, `n` times: each output parses
/// (serde_json) and passes `check`.
fn draw_documents(schema: JsonSchema, n: u64, check: impl Fn(&Value)) {
    for (seed, out) in draw(schema, n).into_iter().enumerate() {
        let v: Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", String::from_utf8_lossy(&out)));
        check(&v);
    }
}

/// `n` outputs drawn under `schema` from random logits (bytes that close things favoured
/// after 60 steps, so that outputs end); each must end within 4,000 tokens.
pub(super) fn draw(schema: JsonSchema, n: u64) -> Vec<Vec<u8>> {
    let (table, eos) = byte_vocab();
    let schema = Arc::new(schema);
    let mut r = Rand(3);
    let mut outs = Vec::new();
    for seed in 0..n {
        let mut c = Follow::new(schema.clone(), table.clone(), vec![eos]);
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
            ..SamplingParams::default()
        })
        .unwrap();
        let mut out = Vec::new();
        let mut ended = false;
        for step in 0..4000 {
            let mut logits: Vec<f32> = (0..=eos).map(|_| (r.below(1000) as f32) / 250.0).collect();
            // Later on, favour the bytes that close things so that documents end.
            if step > 60 {
                for b in [b'}', b']', b'"', b'0', b'n', b'<', b'/'] {
                    logits[b as usize] += 8.0;
                }
                logits[eos as usize] += 8.0;
            }
            let tok = c
                .sample(&mut sampler, &mut logits, &[])
                .expect("a token fits");
            if tok == eos {
                ended = true;
                break;
            }
            assert!(c.allows(tok));
            out.extend_from_slice(table.get(tok).unwrap());
            c.advance(tok);
        }
        assert!(ended, "seed {seed}: {}", String::from_utf8_lossy(&out));
        outs.push(out);
    }
    outs
}

#[test]
fn constrained_random_draws_always_finish_with_a_valid_document() {
    draw_documents(JsonSchema::compile(&person()).unwrap(), 40, check_person);
    draw_documents(JsonSchema::any_object(), 20, |v| {
        assert!(v.is_object(), "{v}")
    });
    // Recursion, arrays of literals and numbers.
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "number"},
            "tags": {"type": "array", "items": {"enum": ["a", 1, true]}, "maxItems": 4},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"], "additionalProperties": false}},
        "$ref": "#/$defs/node"
    });
    fn check_node(v: &Value) {
        let o = v.as_object().unwrap_or_else(|| panic!("{v}"));
        assert!(o["v"].is_number(), "{v}");
        assert!(
            o.keys()
                .all(|k| ["v", "tags", "kids"].contains(&k.as_str())),
            "{v}"
        );
        if let Some(t) = o.get("tags") {
            let t = t.as_array().unwrap();
            assert!(t.len() <= 4, "{v}");
            assert!(
                t.iter()
                    .all(|x| [json!("a"), json!(1), json!(true)].contains(x)),
                "{v}"
            );
        }
        for k in o.get("kids").map_or(&vec![], |k| k.as_array().unwrap()) {
            check_node(k);
        }
    }
    draw_documents(JsonSchema::compile(&tree).unwrap(), 30, check_node);
}

fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    let name = o["name"].as_str().unwrap();
    assert!((1..=12).contains(&name.chars().count()), "{v}");
    assert!(o["age"].is_i64(), "{v}");
    let tags = o["tags"].as_array().unwrap();
    assert!(
        (1..=3).contains(&tags.len()) && tags.iter().all(Value::is_string),
        "{v}"
    );
    for k in o.keys() {
        assert!(
            ["name", "age", "role", "tags", "boss", "score"].contains(&k.as_str()),
            "{v}"
        );
    }
    if let Some(role) = o.get("role") {
        assert!(
            [json!("admin"), json!("user"), json!(3), Value::Null].contains(role),
            "{v}"
        );
    }
    if let Some(b) = o.get("boss") {
        assert!(
            b.is_null() || (b["id"].is_i64() && b.as_object().unwrap().len() == 1),
            "{v}"
        );
    }
    if let Some(s) = o.get("score") {
        assert!(s.is_null() || s.is_number(), "{v}");
    }
}

#[test]
fn the_mask_keeps_exactly_the_tokens_that_fit() {
    let (table, eos) = byte_vocab();
    let schema = Arc::new(JsonSchema::compile(&person()).unwrap());
    let mut c = Follow::new(schema, table.clone(), vec![eos]);
    for &b in br#"{"na"# {
        c.advance(b as u32);
    }
    let mut logits = vec![0.0f32; eos as usize + 1];
    let n = c.mask(&mut logits);
    let kept: Vec<u32> = (0..=eos)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    assert_eq!(kept, vec![b'm' as u32]);
    assert_eq!(n, 1);
    assert!(!c.allows(eos));
}

#[test]
fn whitespace_runs_hold_one_line_break() {
    let any = any_value();
    assert!(accepts(&any, b"{\r\n  \"a\": [\n    1,\n    2\n  ]\n}"));
    assert!(!accepts(&any, b"{\n\n\"a\": 1}"));
    assert!(!accepts(&any, b"{\"a\":\n\r1}"));
    let spaces = format!("{{{}\"a\": 1}}", " ".repeat(33));
    assert!(!accepts(&any, spaces.as_bytes()));
    // Inside strings whitespace is content.
    assert!(accepts(
        &any,
        b"{\"a\": \"x                                    y\"}"
    ));
}

#[test]
fn a_forced_tool_call_names_a_tool_and_fits_its_parameters() {
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"type": "string"}},
        "required": ["zone"], "additionalProperties": false});
    let s = JsonSchema::tool_call(&[("get_weather".into(), weather), ("get_time".into(), time)])
        .unwrap();
    let call = |name: &str, args: &str| {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
    };
    assert!(accepts(
        &s,
        call("get_weather", r#"{"city": "Paris", "unit": "c"}"#).as_bytes()
    ));
    assert!(accepts(
        &s,
        call("get_time", r#"{"zone":"UTC"}"#).as_bytes()
    ));
    // Each tool's own parameters: get_time has no city, get_weather needs one.
    assert!(!accepts(
        &s,
        call("get_time", r#"{"city": "Paris"}"#).as_bytes()
    ));
    assert!(!accepts(
        &s,
        call("get_weather", r#"{"unit": "c"}"#).as_bytes()
    ));
    assert!(!accepts(&s, call("get_date", r#"{}"#).as_bytes()));
    // Unfinished: cannot end before the closing tag.
    let full = call("get_time", r#"{"zone":"UTC"}"#);
    assert!(!accepts(&s, &full.as_bytes()[..full.len() - 1]));
    // The parameters' unsupported keywords are named.
    let e = JsonSchema::tool_call(&[("f".into(), json!({"type": "object", "minProperties": 2}))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("minProperties") && e.contains("\"f\""), "{e}");
}

#[test]
fn patterns_search_as_the_regex_crate_does() {
    let patterns = [
        r"^[A-Z]{2}-[0-9]{3}$",
        r"ab+c",
        r"^(red|green|blue)$",
        r"^\d+(\.\d+)?$",
        r"^\w+@\w+\.com$",
        r"x$",
        r"^é.",
    ];
    let mut r = Rand(5);
    let alphabet: Vec<char> = "abcxAZ09-.@_ é日".chars().collect();
    let mut corpus: Vec<String> = [
        "AB-123",
        "ab-123",
        "AB-1234",
        "xxabbbcxx",
        "ac",
        "red",
        "redd",
        "3.14",
        "3.",
        "me@site.com",
        "x",
        "yx",
        "xy",
        "éa",
        "é",
        "ée日",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for _ in 0..400 {
        corpus.push(
            (0..r.below(7))
                .map(|_| alphabet[r.below(alphabet.len())])
                .collect(),
        );
    }
    for p in patterns {
        let s = JsonSchema::compile(&json!({"type": "string", "pattern": p})).unwrap();
        let reference = regex::Regex::new(p).unwrap();
        for text in &corpus {
            let doc = serde_json::to_string(text).unwrap();
            assert_eq!(
                accepts(&s, doc.as_bytes()),
                reference.is_match(text),
                "{p} on {text:?}"
            );
        }
    }
}

#[test]
fn formats_with_a_shape_are_enforced_and_others_stay_annotations() {
    let check = |format: &str, good: &[&str], bad: &[&str]| {
        let s = JsonSchema::compile(&json!({"type": "string", "format": format})).unwrap();
        for g in good {
            assert!(accepts(&s, format!("\"{g}\"").as_bytes()), "{format}: {g}");
        }
        for b in bad {
            assert!(!accepts(&s, format!("\"{b}\"").as_bytes()), "{format}: {b}");
        }
    };
    check(
        "date",
        &["2024-02-29", "1999-12-31"],
        &["2024-13-01", "24-01-01", "2024-01-32"],
    );
    check(
        "date-time",
        &[
            "2024-02-29T12:30:00Z",
            "2024-02-29T23:59:59.123+05:30",
            "2024-02-29T12:30:00",
        ],
        &["2024-02-29 12:30:00", "2024-02-29T24:00:00Z"],
    );
    check(
        "uuid",
        &["123e4567-e89b-12d3-a456-426614174000"],
        &["123e4567e89b12d3a456426614174000"],
    );
    check("email", &["a.b@example.org"], &["not an email", "a@b"]);
    check("ipv4", &["192.168.0.1"], &["256.1.1.1", "1.2.3"]);
    // An annotation-only format admits any string.
    check("uri", &["anything at all"], &[]);
    for (schema, word) in [
        (json!({"type": "string", "pattern": "a(?=b)"}), "pattern"),
        (
            json!({"type": "string", "pattern": "^\"$"}),
            "without escapes",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

/// A string under several patterns — an `allOf` of members with different `pattern`s, or a
/// `pattern` beside an enforced `format` — must match each: every text over a small alphabet
/// gets the verdict of the regex crate's searches, and constrained draws match them all.
#[test]
fn several_patterns_must_all_match() {
    // (schema, its patterns, whether random draws end: a pattern like `b$` leaves the draws'
    // closing bytes no way out, so only bounded ones are drawn)
    let schemas = [
        (
            json!({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}, {"pattern": "ab"}]}),
            vec!["^a", "b$", "ab"],
            false,
        ),
        (
            json!({"type": "string", "allOf": [{"pattern": "a.c"}, {"pattern": "^[abc]{3,4}$"}]}),
            vec!["a.c", "^[abc]{3,4}$"],
            true,
        ),
    ];
    for (schema, res, drawn) in &schemas {
        let s = JsonSchema::compile(schema).unwrap();
        let res: Vec<regex::Regex> = res.iter().map(|r| regex::Regex::new(r).unwrap()).collect();
        for text in strings_over("abc", 5) {
            let want = res.iter().all(|r| r.is_match(&text));
            let doc = format!("\"{text}\"");
            assert_eq!(accepts(&s, doc.as_bytes()), want, "{schema}: {text:?}");
        }
        if *drawn {
            draw_documents(s, 20, |v| {
                let t = v.as_str().unwrap();
                assert!(res.iter().all(|r| r.is_match(t)), "{schema}: {v}");
            });
        }
    }
    // A pattern beside an enforced format: a date in 2024.
    let s = JsonSchema::compile(&json!({"type": "string", "format": "date", "pattern": "^2024"}))
        .unwrap();
    for (d, ok) in [
        ("2024-02-29", true),
        ("2023-02-28", false),
        ("2024-13-01", false),
    ] {
        assert_eq!(accepts(&s, format!("\"{d}\"").as_bytes()), ok, "{d}");
    }
}

#[test]
fn constrained_draws_under_patterns_match_them() {
    let schema = json!({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "day": {"type": "string", "format": "date"},
        "tag": {"type": "string", "pattern": "^a+b$"}},
        "required": ["code", "day", "tag"], "additionalProperties": false});
    let code = regex::Regex::new("^[A-Z]{2}-[0-9]{3}$").unwrap();
    let day = regex::Regex::new(r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$").unwrap();
    let tag = regex::Regex::new("^a+b$").unwrap();
    draw_documents(JsonSchema::compile(&schema).unwrap(), 30, |v| {
        assert!(code.is_match(v["code"].as_str().unwrap()), "{v}");
        assert!(day.is_match(v["day"].as_str().unwrap()), "{v}");
        assert!(tag.is_match(v["tag"].as_str().unwrap()), "{v}");
    });
}

/// Every text of up to `n` characters from `alphabet`.
pub(super) fn strings_over(alphabet: &str, n: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut frontier = vec![String::new()];
    for _ in 0..n {
        let mut next = Vec::new();
        for s in &frontier {
            for c in alphabet.chars() {
                next.push(format!("{s}{c}"));
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

fn digit_strings(n: usize) -> Vec<String> {
    strings_over("-0123456789", n)
}

#[test]
fn integer_bounds_admit_exactly_the_integers_in_range() {
    let strings = digit_strings(3);
    for (schema, lo, hi) in [
        (json!({"type": "integer"}), i64::MIN, i64::MAX),
        (
            json!({"type": "integer", "minimum": 0, "maximum": 150}),
            0i64,
            150i64,
        ),
        (
            json!({"type": "integer", "minimum": -42, "maximum": -7}),
            -42,
            -7,
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 9.5, "exclusiveMaximum": 120}),
            10,
            119,
        ),
        (json!({"type": "integer", "minimum": 100}), 100, i64::MAX),
        (json!({"type": "integer", "maximum": -100}), i64::MIN, -100),
    ] {
        let s = JsonSchema::compile(&schema).unwrap();
        for text in &strings {
            // The whole text: serde_json's verdict and the range.
            let want = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.as_i64())
                .is_some_and(|v| (lo..=hi).contains(&v));
            assert_eq!(accepts(&s, text.as_bytes()), want, "{schema} on {text:?}");
            // As a prefix: accepted exactly when some continuation of up to 3 bytes is a
            // document of the schema (or, for the ranges without a small bound, a longer one).
            let mut r = Recognizer::new(&s);
            let fed = r.feed_all(text.as_bytes());
            let completes = strings
                .iter()
                .any(|tail| accepts(&s, format!("{text}{tail}").as_bytes()));
            if completes {
                assert!(fed, "{schema}: the prefix {text:?} was refused");
            } else if fed && hi - lo < 10_000 && lo.abs() < 10_000 && hi.abs() < 10_000 {
                panic!("{schema}: the prefix {text:?} was accepted but cannot be completed");
            }
        }
    }
    for (schema, word) in [
        (json!({"type": "boolean", "maximum": 0}), "numbers only"),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 4}),
            "no integer",
        ),
    ] {
        let e = JsonSchema::compile(&schema).unwrap_err().to_string();
        assert!(e.contains(word), "{schema}: {e}");
    }
}

#[test]
fn constrained_draws_under_integer_bounds_stay_in_them() {
    let schema = json!({"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "delta": {"type": "integer", "minimum": -5, "maximum": 5},
        "big": {"type": "integer", "exclusiveMinimum": 1000}},
        "required": ["age", "delta", "big"], "additionalProperties": false});
    draw_documents(JsonSchema::compile(&schema).unwrap(), 30, |v| {
        assert!((0..=150).contains(&v["age"].as_i64().unwrap()), "{v}");
        assert!((-5..=5).contains(&v["delta"].as_i64().unwrap()), "{v}");
        assert!(v["big"].as_i64().unwrap() > 1000, "{v}");
    });
}

#[test]
fn tuples_type_each_position() {
    // pydantic's Tuple[int, str, bool] and a tuple with a typed rest.
    let exact = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"},
        {"type": "boolean"}], "minItems": 3, "maxItems": 3});
    let rest = json!({"type": "array", "prefixItems": [{"type": "string"}],
        "items": {"type": "integer", "minimum": 0}});
    let closed = json!({"type": "array", "prefixItems": [{"type": "null"}], "items": false});
    let s = JsonSchema::compile(&exact).unwrap();
    assert!(accepts(&s, br#"[1, "a", true]"#));
    for bad in [r#"["a", 1, true]"#, r#"[1, "a"]"#, r#"[1, "a", true, 2]"#] {
        assert!(!accepts(&s, bad.as_bytes()), "{bad}");
    }
    let s = JsonSchema::compile(&rest).unwrap();
    assert!(accepts(&s, br#"["a", 1, 2, 3]"#) && accepts(&s, br#"[]"#) && accepts(&s, br#"["a"]"#));
    assert!(
        !accepts(&s, br#"[1]"#) && !accepts(&s, br#"["a", -1]"#) && !accepts(&s, br#"["a", "b"]"#)
    );
    let s = JsonSchema::compile(&closed).unwrap();
    assert!(accepts(&s, b"[null]") && accepts(&s, b"[]") && !accepts(&s, b"[null, null]"));
    draw_documents(JsonSchema::compile(&exact).unwrap(), 20, |v| {
        let t = v.as_array().unwrap();
        assert!(
            t.len() == 3 && t[0].is_i64() && t[1].is_string() && t[2].is_boolean(),
            "{v}"
        );
    });
}

#[test]
fn a_property_is_written_once() {
    // Readers keep a repeated name's last value; the schema may not admit it.
    let open = JsonSchema::compile(&json!({"type": "object", "properties": {
        "age": {"type": "integer"}}}))
    .unwrap();
    assert!(accepts(&open, br#"{"age": 1, "other": "x"}"#));
    assert!(!accepts(&open, br#"{"age": 1, "age": "x"}"#));
    // A longer name that starts like a used one is another property.
    assert!(accepts(&open, br#"{"age": 1, "ages": "x"}"#));
    let closed = JsonSchema::compile(&json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": false}))
    .unwrap();
    assert!(!accepts(&closed, br#"{"a": 1, "a": 2}"#));
    assert!(accepts(&closed, br#"{"b": 1, "a": 2}"#));
}
