//! Tool calls as the model writes them after any text, in either dialect:
//! Qwen3 (Hermes) JSON, `<tool_call>\n{"name": "...", "arguments": {...}}\n</tool_call>`, or
//! Qwen3.5 XML, `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
//! </function>\n</tool_call>` (values that parse as JSON are JSON, others strings).
//! They become OpenAI `tool_calls` (`arguments` as a JSON string). A block that does not parse
//! stays in the content, so nothing the model wrote is lost.

use serde_json::{json, Value};

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

/// Splits a reply into its text and its tool calls.
pub fn parse_tool_calls(text: &str) -> (String, Vec<ToolCall>) {
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
        match parse_one(body) {
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

fn parse_one(body: &str) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with("<function=") {
        return parse_xml(body);
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

/// A `<parameter>` value of the XML dialect: JSON when it parses as JSON, else a string.
pub fn xml_value(raw: &str) -> Value {
    // The template writes the value between newlines.
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    let raw = raw.strip_suffix('\n').unwrap_or(raw);
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.into()))
}

/// The Qwen3.5 XML dialect: `<function=NAME>` then `<parameter=ARG>VALUE</parameter>`s.
fn parse_xml(body: &str) -> Option<ToolCall> {
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
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
        args.insert(arg.trim().to_string(), xml_value(raw));
        rest = after;
    }
    Some(ToolCall {
        name: name.trim().to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qwen3_tool_calls_after_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>";
        let (content, calls) = parse_tool_calls(text);
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
        let (content, calls) = parse_tool_calls(text);
        assert_eq!(content, "");
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris, France", "days": 3}));
        let (_, calls) = parse_tool_calls("<tool_call><function=now></function></tool_call>");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("now", "{}")
        );
        // Unterminated parameter: kept as text.
        let broken = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>";
        assert_eq!(parse_tool_calls(broken).1, vec![]);
    }

    #[test]
    fn broken_or_absent_calls_stay_content() {
        assert_eq!(parse_tool_calls("plain"), ("plain".into(), vec![]));
        let (content, calls) = parse_tool_calls("a <tool_call>{not json</tool_call>");
        assert!(calls.is_empty());
        assert_eq!(content, "a <tool_call>{not json</tool_call>");
    }
}
