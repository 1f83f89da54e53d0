//! Tool calls as the model writes them after any text, in either dialect:
//! Qwen3 (Hermes) JSON, `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`, or
//! Qwen3.5 XML, `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
//! </function>\n</tool_call>`. Qwen3.5's template writes string arguments as they are and
//! others as JSON, so an XML value is typed by the tool's declared parameter: a string
//! parameter keeps its text (`75001` stays "75001"; a JSON string literal, as a forced call
//! writes it, is unquoted), any other is JSON when it parses as JSON, else a string.
//! They become OpenAI `tool_calls` (`arguments` as a JSON string). A block that does not parse
//! stays in the content, so nothing the model wrote is lost.

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// JSON text of the arguments object.
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's `tool_calls[]` entry (`index` added for streaming deltas).
    pub fn to_json(&self, id: &str, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

/// The parameters of a request's tools declared as strings only (`"type": "string"`), by tool.
#[derive(Default, Clone, Debug)]
pub struct ParamTypes(HashMap<String, HashSet<String>>);

impl ParamTypes {
    /// From OpenAI `tools` entries (`{"type": "function", "function": {"name", "parameters"}}`).
    pub fn from_tools(tools: &[Value]) -> ParamTypes {
        let mut map = HashMap::new();
        for t in tools {
            let f = &t["function"];
            let Some(name) = f["name"].as_str() else {
                continue;
            };
            let strings = f["parameters"]["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, schema)| match &schema["type"] {
                    Value::String(t) => t == "string",
                    Value::Array(ts) => ts.len() == 1 && ts[0] == "string",
                    _ => false,
                })
                .map(|(p, _)| p.clone())
                .collect();
            map.insert(name.to_string(), strings);
        }
        ParamTypes(map)
    }

    /// Whether parameter `param` of tool `tool` is declared a string.
    pub fn is_string(&self, tool: &str, param: &str) -> bool {
        self.0.get(tool).is_some_and(|p| p.contains(param))
    }
}

/// Splits a reply into its text and its tool calls.
pub fn parse_tool_calls(text: &str, types: &ParamTypes) -> (String, Vec<ToolCall>) {
    let Some(first) = text.find(OPEN) else {
        return (text.to_string(), Vec::new());
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    let mut leftover = String::new();
    while let Some(start) = rest.find(OPEN) {
        leftover.push_str(&rest[..start]);
        let body_start = start + OPEN.len();
        let (body, next) = match rest[body_start..].find(CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        match parse_one(body, types) {
            Some(call) => calls.push(call),
            None => leftover.push_str(&rest[start..rest.len() - next.len()]),
        }
        rest = next;
    }
    leftover.push_str(rest);
    let mut content = text[..first].to_string();
    if !leftover.trim().is_empty() {
        content.push_str(&leftover);
    }
    (content.trim_end().to_string(), calls)
}

fn parse_one(body: &str, types: &ParamTypes) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with("<function=") {
        return parse_xml(body, types);
    }
    let v: Value = serde_json::from_str(body).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// A `<parameter>` value of the XML dialect. Of a parameter declared a string: its text, or
/// the string a JSON string literal holds; of any other: JSON when it parses as JSON, else a
/// string.
pub fn xml_value(raw: &str, string_param: bool) -> Value {
    // The template writes the value between newlines.
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    let raw = raw.strip_suffix('\n').unwrap_or(raw);
    match serde_json::from_str(raw) {
        Ok(Value::String(s)) => Value::String(s),
        Ok(v) if !string_param => v,
        _ => Value::String(raw.into()),
    }
}

/// The Qwen3.5 XML dialect: `<function=NAME>` then `<parameter=ARG>VALUE</parameter>`s.
fn parse_xml(body: &str, types: &ParamTypes) -> Option<ToolCall> {
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    rest = rest.trim_start().strip_suffix("</function>")?;
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let after = rest.strip_prefix("<parameter=")?;
        let (arg, after) = after.split_once('>')?;
        let (raw, after) = after.split_once("</parameter>")?;
        let arg = arg.trim();
        args.insert(arg.to_string(), xml_value(raw, types.is_string(name, arg)));
        rest = after;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> ParamTypes {
        ParamTypes::default()
    }

    #[test]
    fn xml_values_take_the_type_their_parameter_declares() {
        let tools = [
            json!({"type": "function", "function": {"name": "ship", "parameters": {
            "type": "object", "properties": {
                "zip": {"type": "string"}, "note": {"type": ["string"]},
                "count": {"type": "integer"}, "opts": {"type": "object"}, "any": {}}}}}),
        ];
        let types = ParamTypes::from_tools(&tools);
        let text = "<tool_call>\n<function=ship>\n<parameter=zip>\n75001\n</parameter>\n\
            <parameter=note>\n\"Fragile\"\n</parameter>\n<parameter=count>\n3\n</parameter>\n\
            <parameter=opts>\n{\"fast\": true}\n</parameter>\n<parameter=any>\ntrue\n\
            </parameter>\n</function>\n</tool_call>";
        let (_, calls) = parse_tool_calls(text, &types);
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        // A string parameter keeps its digits as text; a JSON string literal (how a forced
        // call writes strings) is unquoted; the others are JSON.
        assert_eq!(
            args,
            json!({"zip": "75001", "note": "Fragile", "count": 3, "opts": {"fast": true},
                   "any": true})
        );
        // Without declared types (another tool, or none): JSON when it parses.
        let (_, calls) = parse_tool_calls(text, &none());
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["zip"], json!(75001));
        assert_eq!(xml_value("\nnot json\n", false), json!("not json"));
        assert_eq!(xml_value("\n[1, 2\n", true), json!("[1, 2"));
    }

    #[test]
    fn parses_qwen3_tool_calls_after_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>";
        let (content, calls) = parse_tool_calls(text, &ParamTypes::default());
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(calls[1].arguments, "{}");
    }

    #[test]
    fn parses_qwen3_5_xml_tool_calls() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, France\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let (content, calls) = parse_tool_calls(text, &ParamTypes::default());
        assert_eq!(content, "");
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris, France", "days": 3}));
        let (_, calls) =
            parse_tool_calls("<tool_call><function=now></function></tool_call>", &none());
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("now", "{}")
        );
        // Unterminated parameter: kept as text.
        let broken = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>";
        assert_eq!(parse_tool_calls(broken, &none()).1, vec![]);
    }

    #[test]
    fn broken_or_absent_calls_stay_content() {
        assert_eq!(parse_tool_calls("plain", &none()), ("plain".into(), vec![]));
        let (content, calls) = parse_tool_calls("a <tool_call>{not json</tool_call>", &none());
        assert!(calls.is_empty());
        assert_eq!(content, "a <tool_call>{not json</tool_call>");
    }
}
