//! Tool calls streamed as OpenAI clients expect them: as soon as a call's function name is
//! known, a delta with `index`, `id`, `type` and `function.name` (arguments empty), then the
//! arguments in fragments as the model writes them; plain text before (and between) calls
//! streams as content.
//!
//! Qwen3 (Hermes) JSON calls stream their `arguments` value as it is written (its raw JSON text,
//! cut where the value ends); Qwen3.5 XML calls stream one `"name": value` member per finished
//! `<parameter>`. A call whose name cannot be read before `</tool_call>` is parsed whole at its
//! end like a non-streaming reply (and stays content when it does not parse), so nothing the
//! model wrote is lost. The whole body is re-scanned on each piece: calls are short.

use crate::tools::{parse_tool_calls, xml_value, ParamTypes};
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// What the stream has ready to send.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolDelta {
    Content(String),
    /// One entry of a chunk's `delta.tool_calls`.
    Call(Value),
}

#[derive(Default)]
pub struct ToolCallStream {
    /// Outside a call: text not yet known to be content. Inside: the call's body so far.
    held: String,
    in_call: bool,
    /// Calls started so far (the next call's index).
    calls: usize,
    /// The call in progress, once its first delta went out.
    current: Option<Progress>,
    /// The request's tools' string parameters (how XML values are typed).
    types: ParamTypes,
}

/// How far the call in progress has been sent.
struct Progress {
    index: usize,
    /// JSON dialect: bytes of the arguments value sent. XML: parameters sent.
    sent: usize,
}

impl ToolCallStream {
    /// A stream for a request whose tools declare `types`.
    pub fn new(types: ParamTypes) -> ToolCallStream {
        ToolCallStream {
            types,
            ..ToolCallStream::default()
        }
    }

    /// Tool calls streamed so far (or started).
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Takes a piece of the reply's content; returns what can be sent now.
    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_call {
                match self.held.find(CLOSE) {
                    Some(end) => {
                        let body = self.held[..end].to_string();
                        self.held.drain(..end + CLOSE.len());
                        self.in_call = false;
                        self.end_call(&body, &mut out);
                    }
                    None => {
                        let body = self.held.clone();
                        self.advance_call(&body, &mut out);
                        return out;
                    }
                }
            } else if let Some(at) = self.held.find(OPEN) {
                let before: String = self.held.drain(..at + OPEN.len()).collect();
                let before = &before[..at];
                // Whitespace between calls is the model's layout, not content.
                if self.calls == 0 || !before.trim().is_empty() {
                    push_content(&mut out, before);
                }
                self.in_call = true;
            } else {
                // Hold back what could be the start of `<tool_call>` (and, after a call, the
                // whitespace that separates calls).
                let keep = (1..OPEN.len())
                    .rev()
                    .find(|&n| self.held.ends_with(&OPEN[..n]))
                    .unwrap_or(0);
                let cut = self.held.len() - keep;
                if self.calls > 0 && self.held[..cut].trim().is_empty() {
                    return out;
                }
                let ready: String = self.held.drain(..cut).collect();
                push_content(&mut out, &ready);
                return out;
            }
        }
    }

    /// At the end of the reply: what is left (an unfinished call is parsed whole).
    pub fn finish(&mut self) -> Vec<ToolDelta> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        if self.in_call {
            self.in_call = false;
            if self.current.is_some() {
                self.end_call(&rest, &mut out);
            } else {
                let (content, calls) = parse_tool_calls(&format!("{OPEN}{rest}"), &self.types);
                self.send_whole(content, calls, &mut out);
            }
        } else if self.calls == 0 || !rest.trim().is_empty() {
            push_content(&mut out, rest.trim_end());
        }
        out
    }

    /// Sends what the body written so far allows: the call's first delta once its name is
    /// known, then argument fragments.
    fn advance_call(&mut self, body: &str, out: &mut Vec<ToolDelta>) {
        let trimmed = body.trim_start();
        let skipped = body.len() - trimmed.len();
        if trimmed.starts_with("<function=") {
            let scan = scan_xml(trimmed, &self.types);
            let Some(name) = scan.name else { return };
            let p = self.start(name, out);
            for (i, (arg, value)) in scan.params.iter().enumerate().skip(p.sent) {
                let sep = if i == 0 { "{" } else { ", " };
                let fragment = format!("{sep}{}: {value}", json!(arg));
                out.push(ToolDelta::Call(
                    json!({"index": p.index, "function": {"arguments": fragment}}),
                ));
            }
            self.current.as_mut().expect("started").sent = scan.params.len();
        } else if trimmed.starts_with('{') {
            let scan = scan_json(trimmed);
            let (Some(name), Some(start)) = (scan.name, scan.args_start) else {
                return;
            };
            if trimmed[start..].starts_with('"') {
                return; // arguments as a JSON string: sent decoded at the end
            }
            let end = scan.args_end.unwrap_or(trimmed.len());
            let p = self.start(name, out);
            if end > start + p.sent {
                let fragment = &body[skipped + start + p.sent..skipped + end];
                out.push(ToolDelta::Call(
                    json!({"index": p.index, "function": {"arguments": fragment}}),
                ));
                self.current.as_mut().expect("started").sent = end - start;
            }
        }
    }

    /// The call's first delta, once; returns where the call stands.
    fn start(&mut self, name: String, out: &mut Vec<ToolDelta>) -> Progress {
        if let Some(p) = &self.current {
            return Progress {
                index: p.index,
                sent: p.sent,
            };
        }
        let index = self.calls;
        self.calls += 1;
        out.push(ToolDelta::Call(json!({
            "index": index,
            "id": crate::stream::new_id("call_"),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        })));
        self.current = Some(Progress { index, sent: 0 });
        Progress { index, sent: 0 }
    }

    /// `</tool_call>` (or the end of the reply) closed the call whose body is `body`.
    fn end_call(&mut self, body: &str, out: &mut Vec<ToolDelta>) {
        self.advance_call(body, out);
        let Some(p) = self.current.take() else {
            // The name never became readable: parse the call whole.
            let (content, calls) = parse_tool_calls(&format!("{OPEN}{body}{CLOSE}"), &self.types);
            return self.send_whole(content, calls, out);
        };
        let trimmed = body.trim_start();
        let rest = if trimmed.starts_with("<function=") {
            match p.sent {
                0 => "{}".to_string(),
                _ => "}".to_string(),
            }
        } else {
            // No arguments written at all: an empty object.
            match scan_json(trimmed).args_start {
                None => "{}".to_string(),
                Some(_) => String::new(),
            }
        };
        if !rest.is_empty() {
            out.push(ToolDelta::Call(
                json!({"index": p.index, "function": {"arguments": rest}}),
            ));
        }
    }

    /// A call parsed whole: its deltas at once, or its text as content.
    fn send_whole(
        &mut self,
        content: String,
        calls: Vec<crate::tools::ToolCall>,
        out: &mut Vec<ToolDelta>,
    ) {
        push_content(out, &content);
        for c in calls {
            let index = self.calls;
            self.calls += 1;
            out.push(ToolDelta::Call(
                c.to_json(&crate::stream::new_id("call_"), Some(index)),
            ));
        }
    }
}

fn push_content(out: &mut Vec<ToolDelta>, text: &str) {
    if !text.is_empty() {
        out.push(ToolDelta::Content(text.to_string()));
    }
}

/// What a (possibly unfinished) Hermes JSON call `{"name": ..., "arguments": ...}` shows.
#[derive(Default, Debug)]
struct JsonScan {
    name: Option<String>,
    /// Byte range of the arguments (or parameters) value; the end once the value is complete.
    args_start: Option<usize>,
    args_end: Option<usize>,
}

fn scan_json(s: &str) -> JsonScan {
    let mut scan = JsonScan::default();
    let b = s.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = ws(0);
    if b.get(i) != Some(&b'{') {
        return scan;
    }
    i += 1;
    loop {
        i = ws(i);
        match b.get(i) {
            Some(b'"') => {}
            _ => return scan, // `}`, end of text, or not a key
        }
        let Some(key_end) = value_end(b, i) else {
            return scan;
        };
        let key: String = serde_json::from_str(&s[i..key_end]).unwrap_or_default();
        i = ws(key_end);
        if b.get(i) != Some(&b':') {
            return scan;
        }
        i = ws(i + 1);
        if i >= b.len() {
            return scan;
        }
        let end = value_end(b, i);
        match key.as_str() {
            "name" => {
                if let Some(e) = end {
                    scan.name = serde_json::from_str(&s[i..e]).ok();
                }
            }
            "arguments" | "parameters" if scan.args_start.is_none() => {
                scan.args_start = Some(i);
                scan.args_end = end;
            }
            _ => {}
        }
        let Some(e) = end else { return scan };
        i = ws(e);
        match b.get(i) {
            Some(b',') => i += 1,
            _ => return scan,
        }
    }
}

/// End (exclusive) of the JSON value starting at `i`, if it is complete in `b`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b[i] {
        b'"' => {
            let mut j = i + 1;
            while j < b.len() {
                match b[j] {
                    b'\\' => j += 2,
                    b'"' => return Some(j + 1),
                    _ => j += 1,
                }
            }
            None
        }
        b'{' | b'[' => {
            let (mut depth, mut j, mut in_str) = (0usize, i, false);
            while j < b.len() {
                let c = b[j];
                if in_str {
                    match c {
                        b'\\' => j += 1,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match c {
                        b'"' => in_str = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                }
                j += 1;
            }
            None
        }
        _ => {
            // A number, true, false or null ends at a delimiter (never at the end of the text:
            // more digits may follow).
            let j = (i..b.len())
                .find(|&j| matches!(b[j], b',' | b'}' | b']') || b[j].is_ascii_whitespace())?;
            Some(j)
        }
    }
}

/// What a (possibly unfinished) Qwen3.5 XML call shows: the name once `<function=NAME>` is
/// complete, and the finished parameters as (name, JSON value text).
#[derive(Default)]
struct XmlScan {
    name: Option<String>,
    params: Vec<(String, String)>,
}

fn scan_xml(s: &str, types: &ParamTypes) -> XmlScan {
    let mut scan = XmlScan::default();
    let Some(rest) = s.strip_prefix("<function=") else {
        return scan;
    };
    let Some((name, mut rest)) = rest.split_once('>') else {
        return scan;
    };
    let name = name.trim();
    scan.name = Some(name.to_string());
    loop {
        rest = rest.trim_start();
        let Some(after) = rest.strip_prefix("<parameter=") else {
            return scan;
        };
        let Some((arg, after)) = after.split_once('>') else {
            return scan;
        };
        let Some((raw, after)) = after.split_once("</parameter>") else {
            return scan;
        };
        let arg = arg.trim();
        let value = xml_value(raw, types.is_string(name, arg));
        scan.params.push((arg.to_string(), value.to_string()));
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returns (content, [(name, arguments)]) as a client accumulates them, and
    /// checks the delta shapes on the way.
    fn run(pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let mut s = ToolCallStream::default();
        let mut deltas = Vec::new();
        for p in pieces {
            deltas.extend(s.push(p));
        }
        deltas.extend(s.finish());
        let (mut content, mut calls) = (String::new(), Vec::<(String, String)>::new());
        for d in deltas {
            match d {
                ToolDelta::Content(t) => content.push_str(&t),
                ToolDelta::Call(v) => {
                    let i = v["index"].as_u64().unwrap() as usize;
                    if i == calls.len() {
                        assert!(v["id"].as_str().unwrap().starts_with("call_"), "{v}");
                        assert_eq!(v["type"], "function");
                        calls.push((
                            v["function"]["name"].as_str().unwrap().into(),
                            String::new(),
                        ));
                    } else {
                        assert!(v.get("id").is_none(), "only the first delta has an id: {v}");
                    }
                    calls[i]
                        .1
                        .push_str(v["function"]["arguments"].as_str().unwrap());
                }
            }
        }
        assert_eq!(s.calls(), calls.len());
        (content, calls)
    }

    fn args(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn json_call_streams_name_first_then_argument_fragments() {
        let mut s = ToolCallStream::default();
        assert_eq!(
            s.push("Sure.\n<tool"),
            vec![ToolDelta::Content("Sure.\n".into())]
        );
        assert_eq!(s.push("_call>\n{\"name\": \"get_wea"), vec![]);
        let d = s.push("ther\", \"arguments\": {\"ci");
        assert_eq!(d.len(), 2, "{d:?}");
        let ToolDelta::Call(first) = &d[0] else {
            panic!()
        };
        assert_eq!(
            first["function"],
            json!({"name": "get_weather", "arguments": ""})
        );
        assert_eq!(
            d[1],
            ToolDelta::Call(json!({"index": 0, "function": {"arguments": "{\"ci"}}))
        );
        let d = s.push("ty\": \"Paris\"}}\n</tool_call>");
        assert_eq!(
            d,
            vec![ToolDelta::Call(
                json!({"index": 0, "function": {"arguments": "ty\": \"Paris\"}"}})
            )]
        );
        assert_eq!(s.finish(), vec![]);

        let (content, calls) = run(&[
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>\n",
            "<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>",
        ]);
        assert_eq!(content, "");
        assert_eq!(calls[0].0, "a");
        assert_eq!(args(&calls[0].1), json!({"x": [1, "}"]}));
        assert_eq!((calls[1].0.as_str(), args(&calls[1].1)), ("b", json!({})));
    }

    #[test]
    fn every_split_of_a_reply_accumulates_to_the_same_calls() {
        let reply = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"a \\\"b\\\"\", \"n\": 12}}\n</tool_call>\n<tool_call>\n<function=g>\n<parameter=city>\nParis, France\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        for cut in 1..reply.len() {
            if !reply.is_char_boundary(cut) {
                continue;
            }
            let (content, calls) = run(&[&reply[..cut], &reply[cut..]]);
            assert_eq!(content, "Checking.\n", "cut {cut}");
            assert_eq!(calls.len(), 2, "cut {cut}");
            assert_eq!(
                args(&calls[0].1),
                json!({"q": "a \"b\"", "n": 12}),
                "cut {cut}"
            );
            assert_eq!(calls[1].0, "g");
            assert_eq!(
                args(&calls[1].1),
                json!({"city": "Paris, France", "days": 3}),
                "cut {cut}"
            );
        }
        // One character at a time, too.
        let chars: Vec<String> = reply.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&pieces).1.len(), 2);
    }

    #[test]
    fn unreadable_calls_stay_content_and_string_arguments_are_decoded() {
        let (content, calls) = run(&["a <tool_call>{not json</tool_call>"]);
        assert!(calls.is_empty());
        assert_eq!(content, "a <tool_call>{not json</tool_call>");
        let (_, calls) =
            run(&["<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>"]);
        assert_eq!(args(&calls[0].1), json!({"k": 1}));
        // Cut off before the closing tag (max_tokens): what was sent stands, closed at the end.
        let (_, calls) = run(&["<tool_call>\n<function=h>\n<parameter=x>\n1\n</parameter>\n"]);
        assert_eq!(
            (calls[0].0.as_str(), args(&calls[0].1)),
            ("h", json!({"x": 1}))
        );
        let (content, calls) = run(&["plain <b", "<"]);
        assert_eq!((content.as_str(), calls.len()), ("plain <b<", 0));
    }
}
