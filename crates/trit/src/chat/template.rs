//! Renders a model's own Jinja chat template with minijinja, configured the way transformers'
//! `apply_chat_template` configures Jinja2, so prompts match what the model saw in training
//! byte for byte:
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline of the template dropped;
//! - Python string/dict methods (`startswith`, `split`, `items`, `get`, ...) via
//!   minijinja-contrib's pycompat, negative-step slicing (`messages[::-1]`);
//! - transformers' globals `raise_exception(msg)` and `strftime_now(fmt)`, and its `tojson`
//!   filter (Python `json.dumps` spacing, no HTML escaping);
//! - values printed as Python prints them (`None`, `True`, `['a', 'b']`, `1e-07`);
//! - the variables transformers passes: `messages`, `tools`, `documents`,
//!   `add_generation_prompt`, the special tokens, then the caller's kwargs
//!   (`enable_thinking`, ...); a message's reasoning is visible under `reasoning_content`,
//!   `thinking` and `reasoning`, whichever name the caller used;
//! - transformers' `{% generation %}` blocks (assistant-mask markers) render their body.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value as Json};

use super::pyjson::{self, DumpOptions};
use super::pystr;
use super::strftime;
use crate::{Error, Result};

const TEMPLATE_NAME: &str = "chat_template";
/// `clock` value meaning "use the system clock".
const SYSTEM_CLOCK: i64 = i64::MIN;
/// Names transformers gives to a message's reasoning, the first being the standard one.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
/// Variables the renderer sets itself; kwargs may not replace them (Python would raise
/// "got multiple values for keyword argument").
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template. `render` is `&self` and the type is `Send + Sync`.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Unix seconds returned by `strftime_now`, or `SYSTEM_CLOCK`.
    clock: Arc<AtomicI64>,
    /// The template shows tool calls in Qwen3.5's XML dialect (`<function=NAME>`) rather than
    /// as Hermes JSON.
    xml_tool_calls: bool,
    /// The Jinja text as given (a server's `/props` shows it).
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

fn template_error(e: minijinja::Error) -> Error {
    // Display gives the kind, the detail and the template line; add the causes (e.g. the
    // message of a `raise_exception`).
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    Error::Template(msg)
}

/// Instructions a render may run: Qwen3.5's template (tools, reasoning, vision branches) over
/// a 200-message conversation with 8 tools takes well under 1 % of it (a test checks), and a
/// runaway loop stops within about a second.
pub const FUEL: u64 = 50_000_000;

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the texts templates see as `bos_token`
    /// and `eos_token`; pass `""` for a token the model does not have (it is then undefined
    /// in the template, as transformers leaves out tokens that are `None`).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        Self::with_fuel(source, bos_token, eos_token, FUEL)
    }

    /// [`new`](Self::new) with `fuel` instructions per render instead of [`FUEL`] (tests).
    #[doc(hidden)]
    pub fn with_fuel(source: &str, bos_token: &str, eos_token: &str, fuel: u64) -> Result<Self> {
        let clock = Arc::new(AtomicI64::new(SYSTEM_CLOCK));
        let mut env = Environment::new();
        // A template comes with the model file: one that loops (almost) forever must end in
        // an error, not hang the process. Real chat templates take far less (see FUEL).
        env.set_fuel(Some(fuel));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, state, value| match pystr::python_str(value) {
            Some(text) => out
                .write_str(&text)
                .map_err(|_| minijinja::Error::new(ErrorKind::WriteFailure, "output failed")),
            None => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        let clock_fn = Arc::clone(&clock);
        env.add_function("strftime_now", move |fmt: &str| {
            strftime_now(clock_fn.load(Ordering::Relaxed), fmt)
        });
        let xml_tool_calls = source.contains("<function=");
        env.add_template_owned(TEMPLATE_NAME, replace_generation_tags(source))
            .map_err(|e| Error::Template(format!("cannot compile: {}", template_error(e))))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            clock,
            xml_tool_calls,
            source: source.to_string(),
        })
    }

    /// The Jinja text the template was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the model was taught tool calls as Qwen3.5's XML (`<function=NAME>`), not JSON.
    pub fn writes_xml_tool_calls(&self) -> bool {
        self.xml_tool_calls
    }

    /// Makes `strftime_now` report a fixed time (Unix seconds, UTC), or the system clock again
    /// with `None`. For reproducible prompts and tests.
    pub fn set_fixed_time(&self, unix_seconds: Option<i64>) {
        self.clock
            .store(unix_seconds.unwrap_or(SYSTEM_CLOCK), Ordering::Relaxed);
    }

    /// Renders a conversation. `messages` are OpenAI-style objects (`role`, `content`,
    /// optional `reasoning_content`, `tool_calls`, `tool_call_id`, ...); `tools` is the list of
    /// tool schemas; `kwargs` are extra template variables such as `enable_thinking`.
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        tools: Option<&Json>,
        kwargs: &Map<String, Json>,
    ) -> Result<String> {
        if let Some(key) = RESERVED.iter().find(|k| kwargs.contains_key(**k)) {
            return Err(Error::Template(format!(
                "kwarg '{key}' would replace a variable the renderer sets itself"
            )));
        }
        let messages: Vec<Json> = messages.iter().map(alias_reasoning).collect();
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        ctx.insert("messages".into(), Value::from_serialize(&messages));
        ctx.insert(
            "tools".into(),
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        for (name, text) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if !text.is_empty() {
                ctx.insert(name.into(), Value::from(text.as_str()));
            }
        }
        for (k, v) in kwargs {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        template.render(ctx).map_err(template_error)
    }
}

/// transformers copies a message's reasoning under every name templates read:
/// `{"thinking": r, **message, "reasoning_content": r}` (same key order as Python's dict).
fn alias_reasoning(message: &Json) -> Json {
    let Some(obj) = message.as_object() else {
        return message.clone();
    };
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()));
    let Some(r) = reasoning else {
        return message.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    for (k, v) in obj {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), r.clone());
    Json::Object(out)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii = match kwargs.get::<Option<Value>>("ensure_ascii")? {
        Some(v) => v.is_true(),
        None => ensure_ascii.is_some_and(|v| v.is_true()),
    };
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => {
            let n = i64::try_from(v)?;
            Some(" ".repeat(n.max(0) as usize))
        }
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer, a string or none",
                ))
            }
        },
    };
    let mut opts = DumpOptions {
        ensure_ascii,
        sort_keys: kwargs
            .get::<Option<Value>>("sort_keys")?
            .is_some_and(|v| v.is_true()),
        ..Default::default()
    }
    .with_indent(indent);
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    opts.item_separator = item.as_str().unwrap_or_default().to_string();
                    opts.key_separator = key.as_str().unwrap_or_default().to_string();
                }
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(pyjson::dumps(value, &opts)?))
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

fn strftime_now(clock: i64, fmt: &str) -> std::result::Result<String, minijinja::Error> {
    let unix = if clock == SYSTEM_CLOCK {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    } else {
        clock
    };
    strftime::format_utc(unix, fmt).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}"))
    })
}

/// Rewrites transformers' `{% generation %}…{% endgeneration %}` (an extension marking the
/// assistant's tokens) as `{% if true %}…{% endif %}`, keeping whitespace-control markers so
/// trimming is unchanged.
fn replace_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = split_marker_front(inner);
        let (body, trail) = split_marker_back(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_marker_front(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some('-' | '+') => s.split_at(1),
        _ => ("", s),
    }
}

fn split_marker_back(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-' | '+') => {
            let (body, marker) = s.split_at(s.len() - 1);
            (body, marker)
        }
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
        assert_send_sync::<crate::tokenizer::Tokenizer>();
        assert_send_sync::<crate::tokenizer::StreamDecoder>();
    }

    #[test]
    fn the_tool_call_dialect_is_read_off_the_template() {
        let xml =
            "{% for t in tools %}<tool_call>\n<function={{ t.name }}>\n</function>{% endfor %}";
        let hermes = "{% for t in tools %}<tool_call>\n{\"name\": {{ t.name }}}{% endfor %}";
        assert!(ChatTemplate::new(xml, "", "")
            .unwrap()
            .writes_xml_tool_calls());
        assert!(!ChatTemplate::new(hermes, "", "")
            .unwrap()
            .writes_xml_tool_calls());
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            replace_generation_tags(
                "a{%- generation -%}b{% endgeneration %}c{% if x %}{% endif %}"
            ),
            "a{%- if true -%}b{% endif %}c{% if x %}{% endif %}"
        );
        assert_eq!(
            replace_generation_tags("{% unterminated"),
            "{% unterminated"
        );
    }

    #[test]
    fn reasoning_alias_keeps_python_key_order() {
        let m = serde_json::json!({"role": "assistant", "content": "x", "reasoning": "r"});
        let keys: Vec<String> = alias_reasoning(&m)
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "content",
                "reasoning",
                "reasoning_content"
            ]
        );
        let plain = serde_json::json!({"role": "user", "content": "x", "reasoning_content": null});
        assert_eq!(alias_reasoning(&plain), plain);
    }
}
