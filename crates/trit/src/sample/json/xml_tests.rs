//! Forced tool calls in Qwen3.5's XML dialect (`JsonSchema::xml_tool_call`): which texts the
//! recognizer admits, and random draws through the constraint read back by an independent
//! reader of the dialect (a string parameter's text as it is, any other as JSON) into
//! arguments that fit each tool's schema.

use super::tests::{accepts, draw};
use super::JsonSchema;
use serde_json::{json, Map, Value};

fn weather() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["c", "f"]},
        "hourly": {"type": "boolean"}},
        "required": ["city", "days"]})
}

fn tools() -> JsonSchema {
    let time = json!({"type": "object", "properties": {"zone": {"type": "string", "minLength": 1, "maxLength": 16},
        "format": {"enum": ["24h", "12h"]}}});
    let now = json!({"type": "object", "properties": {}});
    JsonSchema::xml_tool_call(&[
        ("get_weather".into(), weather()),
        ("get_time".into(), time),
        ("now".into(), now),
    ])
    .unwrap()
}

/// The call text for `name` with `params` (name, raw value text) in order.
fn call(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (p, v) in params {
        s += &format!("<parameter={p}>\n{v}\n</parameter>\n");
    }
    s + "</function>\n</tool_call>"
}

/// The parameters written as raw text: plain strings.
const RAW: [&str; 2] = ["city", "zone"];

/// Reads a call back: its name and arguments (a plain string parameter's text as it is, any
/// other parsed as JSON, as the server's reader does with declared types).
fn read(text: &str) -> (String, Map<String, Value>) {
    let body = text
        .strip_prefix("<tool_call>\n<function=")
        .and_then(|t| t.strip_suffix("</function>\n</tool_call>"))
        .unwrap_or_else(|| panic!("not one call: {text:?}"));
    let (name, mut rest) = body.split_once(">\n").expect("a name");
    let mut args = Map::new();
    while let Some(after) = rest.strip_prefix("<parameter=") {
        let (p, after) = after.split_once(">\n").expect("a parameter name");
        let (v, after) = after
            .split_once("\n</parameter>\n")
            .expect("a closed parameter");
        let v: Value = match RAW.contains(&p) {
            true => Value::String(v.to_string()),
            false => serde_json::from_str(v).unwrap_or_else(|e| panic!("{v:?}: {e}")),
        };
        assert!(
            args.insert(p.to_string(), v).is_none(),
            "{p} twice in {text:?}"
        );
        rest = after;
    }
    assert!(rest.is_empty(), "left over: {rest:?}");
    (name.to_string(), args)
}

#[test]
fn the_xml_dialect_admits_exactly_calls_that_fit_a_tool() {
    let s = tools();
    let ok = |t: String| assert!(accepts(&s, t.as_bytes()), "refused: {t:?}");
    let no = |t: String| assert!(!accepts(&s, t.as_bytes()), "admitted: {t:?}");
    ok(call("get_weather", &[("city", "Paris"), ("days", "3")]));
    ok(call(
        "get_weather",
        &[
            ("days", "14"),
            ("hourly", "true"),
            ("unit", "\"f\""),
            ("city", "Oslo, Norway"),
        ],
    ));
    ok(call("get_time", &[]));
    ok(call("get_time", &[("zone", "Europe/Paris")]));
    ok(call("now", &[]));
    // A required parameter missing; one twice; an undeclared one; a value of the wrong type
    // or out of its bounds; a string not written as JSON; an unknown tool.
    no(call("get_weather", &[("city", "Paris")]));
    no(call(
        "get_weather",
        &[("city", "A"), ("days", "3"), ("days", "4")],
    ));
    no(call(
        "get_weather",
        &[("city", "A"), ("days", "3"), ("when", "1")],
    ));
    no(call("get_weather", &[("city", "A"), ("days", "\"3\"")]));
    no(call("get_weather", &[("city", "A"), ("days", "15")]));
    no(call(
        "get_weather",
        &[("city", "A long city name"), ("days", "1")],
    ));
    // Raw strings: any text (quotes too, line breaks inside), but no control character, no
    // `</parameter>` inside, and within the length bounds.
    ok(call("get_weather", &[("city", "\"Rome\""), ("days", "3")]));
    ok(call("get_time", &[("zone", "a\nb <x> </param")]));
    ok(call("get_time", &[("zone", "\n")]));
    no(call("get_time", &[("zone", "")]));
    no(call("get_time", &[("zone", "a</parameter>b")]));
    no(call("get_time", &[("zone", "a\u{1}b")]));
    // Other strings stay JSON: an enum's values are quoted.
    ok(call("get_time", &[("format", "\"24h\"")]));
    no(call("get_time", &[("format", "24h")]));
    no(call("get_date", &[]));
    no(call("now", &[("x", "1")]));
    // The framing is exact: the line break after a name, the closing tag's lines.
    let t = call("get_time", &[("zone", "UTC")]);
    no(t.replace("<parameter=zone>\n", "<parameter=zone>"));
    no(t.replace("\n</parameter>", "</parameter>"));
    // Unfinished: no end before the closing text.
    no(t[..t.len() - 1].to_string());
}

#[test]
fn constrained_xml_draws_read_back_as_calls_that_fit_their_tool() {
    let mut names = std::collections::HashSet::new();
    for out in draw(tools(), 60) {
        let text = String::from_utf8(out).expect("UTF-8");
        let (name, args) = read(&text);
        match name.as_str() {
            "get_weather" => {
                let city = args["city"].as_str().unwrap_or_else(|| panic!("{text:?}"));
                assert!(city.chars().count() <= 12, "{text:?}");
                let days = args["days"].as_i64().unwrap_or_else(|| panic!("{text:?}"));
                assert!((1..=14).contains(&days), "{text:?}");
                if let Some(u) = args.get("unit") {
                    assert!(u == "c" || u == "f", "{text:?}");
                }
                if let Some(h) = args.get("hourly") {
                    assert!(h.is_boolean(), "{text:?}");
                }
                assert!(args.len() <= 4, "{text:?}");
            }
            "get_time" => {
                if let Some(z) = args.get("zone") {
                    let n = z.as_str().map(|z| z.chars().count());
                    assert!(n.is_some_and(|n| (1..=16).contains(&n)), "{text:?}");
                }
                if let Some(f) = args.get("format") {
                    assert!(f == "24h" || f == "12h", "{text:?}");
                }
                assert!(
                    args.keys().all(|k| k == "zone" || k == "format"),
                    "{text:?}"
                );
            }
            "now" => assert!(args.is_empty(), "{text:?}"),
            other => panic!("unknown tool {other} in {text:?}"),
        }
        names.insert(name);
    }
    assert_eq!(names.len(), 3, "every tool drawn at least once: {names:?}");
}

#[test]
fn the_xml_dialect_refuses_what_it_cannot_write() {
    let err = |tools: &[(String, Value)], needle: &str| {
        let e = JsonSchema::xml_tool_call(tools).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    let obj = json!({"type": "object", "properties": {}});
    err(&[("bad>name".into(), obj.clone())], "bad>name");
    err(&[("f".into(), json!({"type": "integer"}))], "object schema");
    err(
        &[(
            "f".into(),
            json!({"type": "object", "properties": {"a\"b": {"type": "string"}}}),
        )],
        "parameter",
    );
    err(&[], "1 to 64 tools");
}
