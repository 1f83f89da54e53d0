//! The parts of a Hugging Face `tokenizer_config.json` the engine needs: which tokens are
//! BOS/EOS, and the chat template.

use serde_json::Value;

use crate::{Error, Result};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// The template named `default` when the config holds several.
    pub chat_template: Option<String>,
}

impl TokenizerConfig {
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer_config.json: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::Tokenizer("tokenizer_config.json is not a JSON object".into()))?;
        Ok(TokenizerConfig {
            bos_token: token_name(obj.get("bos_token"), "bos_token")?,
            eos_token: token_name(obj.get("eos_token"), "eos_token")?,
            pad_token: token_name(obj.get("pad_token"), "pad_token")?,
            add_bos_token: obj.get("add_bos_token").and_then(Value::as_bool),
            add_eos_token: obj.get("add_eos_token").and_then(Value::as_bool),
            chat_template: chat_template(obj.get("chat_template"))?,
        })
    }

    pub fn from_json_file(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_bytes(&bytes).map_err(|e| match e {
            Error::Tokenizer(m) => Error::Tokenizer(format!("{}: {m}", path.display())),
            other => other,
        })
    }
}

/// A special token is written either as its text or as an `AddedToken` object.
fn token_name(v: Option<&Value>, key: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(Error::Tokenizer(format!(
                "tokenizer_config.json: {key} object has no string 'content'"
            ))),
        },
        Some(other) => Err(Error::Tokenizer(format!(
            "tokenizer_config.json: {key} must be a string, got {other}"
        ))),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is used.
fn chat_template(v: Option<&Value>) -> Result<Option<String>> {
    let bad = || {
        Error::Tokenizer(
            "tokenizer_config.json: chat_template must be a string or a list of {name, template}"
                .into(),
        )
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let mut first = None;
            for item in list {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(bad)?;
                let template = item
                    .get("template")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?;
                if name == "default" {
                    return Ok(Some(template.to_string()));
                }
                first.get_or_insert_with(|| template.to_string());
            }
            Ok(first)
        }
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_strings_objects_and_template_lists() {
        let c = TokenizerConfig::from_json_bytes(
            br#"{"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true},
                 "pad_token": "<pad>", "add_bos_token": false,
                 "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .unwrap();
        assert_eq!(c.bos_token, None);
        assert_eq!(c.eos_token.as_deref(), Some("<|im_end|>"));
        assert_eq!(c.pad_token.as_deref(), Some("<pad>"));
        assert_eq!(c.add_bos_token, Some(false));
        assert_eq!(c.chat_template.as_deref(), Some("D"));
    }

    #[test]
    fn rejects_malformed_configs() {
        assert!(TokenizerConfig::from_json_bytes(b"{").is_err());
        assert!(TokenizerConfig::from_json_bytes(b"[1]").is_err());
        assert!(TokenizerConfig::from_json_bytes(br#"{"eos_token": 5}"#).is_err());
        assert!(TokenizerConfig::from_json_bytes(br#"{"chat_template": [{"x": 1}]}"#).is_err());
    }
}
