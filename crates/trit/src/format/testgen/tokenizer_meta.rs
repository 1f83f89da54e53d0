//! Tokenizer files for generated models: copied from a Hugging Face tokenizer folder (the Qwen3
//! files in `.cache/qwen3`) and converted to GGUF `tokenizer.ggml.*` metadata the way
//! llama.cpp's converter does for Qwen2/Qwen3 (model `gpt2`, pre `qwen2`, padded vocabulary),
//! or a small placeholder when no tokenizer folder is given (loader tests need no real vocab).

use crate::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where the generated model's tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerAssets {
    /// A folder with `tokenizer.json` and `tokenizer_config.json`.
    Dir(PathBuf),
    /// A minimal word-level tokenizer with placeholder tokens (not meant for text).
    Placeholder,
}

/// GGUF token types (llama.cpp `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

const PLACEHOLDER_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Loaded tokenizer assets, ready to be written into folders and GGUF metadata.
pub struct LoadedTokenizer {
    /// Raw `tokenizer.json` and `tokenizer_config.json` bytes for folders.
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config_json: Vec<u8>,
    /// GGUF vocabulary, padded to the embedding rows.
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub chat_template: Option<String>,
}

impl TokenizerAssets {
    /// Loads the assets for a model with `rows` embedding rows.
    pub fn load(&self, rows: usize) -> Result<LoadedTokenizer> {
        match self {
            TokenizerAssets::Dir(dir) => load_dir(dir, rows),
            TokenizerAssets::Placeholder => Ok(placeholder(rows)),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Tokenizer(format!("{}: invalid JSON: {e}", path.display())))
}

fn load_dir(dir: &Path, rows: usize) -> Result<LoadedTokenizer> {
    let tok_path = dir.join("tokenizer.json");
    let cfg_path = dir.join("tokenizer_config.json");
    let tokenizer_json = read(&tok_path)?;
    let tokenizer_config_json = read(&cfg_path)?;
    let tok = parse(&tok_path, &tokenizer_json)?;
    let cfg = parse(&cfg_path, &tokenizer_config_json)?;
    let bad = |what: &str| Error::Tokenizer(format!("{}: {what}", tok_path.display()));

    let mut tokens: Vec<Option<String>> = vec![None; rows];
    let mut token_types = vec![UNUSED; rows];
    let mut place = |id: u64, text: &str, ty: i32| -> Result<()> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(&format!(
                "token id {id} does not fit the {rows} embedding rows"
            ))
        })?;
        *slot = Some(text.to_string());
        token_types[id as usize] = ty;
        Ok(())
    };
    let vocab = tok["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("no model.vocab object (only BPE tokenizers are supported)"))?;
    for (text, id) in vocab {
        place(
            id.as_u64().ok_or_else(|| bad("non-integer id in vocab"))?,
            text,
            NORMAL,
        )?;
    }
    for t in tok["added_tokens"].as_array().into_iter().flatten() {
        let id = t["id"]
            .as_u64()
            .ok_or_else(|| bad("added token without id"))?;
        let text = t["content"]
            .as_str()
            .ok_or_else(|| bad("added token without content"))?;
        let ty = if t["special"].as_bool() == Some(true) {
            CONTROL
        } else {
            USER_DEFINED
        };
        place(id, text, ty)?;
    }
    let tokens = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    let merges = tok["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("no model.merges list"))?
        .iter()
        .map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Array(pair) if pair.len() == 2 => {
                Some(format!("{} {}", pair[0].as_str()?, pair[1].as_str()?))
            }
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("a merge is neither \"a b\" nor [a, b]"))?;
    Ok(LoadedTokenizer {
        tokenizer_json,
        tokenizer_config_json,
        tokens,
        token_types,
        merges,
        chat_template: cfg["chat_template"].as_str().map(str::to_string),
    })
}

fn placeholder(rows: usize) -> LoadedTokenizer {
    let tokens: Vec<String> = (0..rows).map(|i| format!("<t{i}>")).collect();
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .take(256)
        .enumerate()
        .map(|(i, t)| (t.clone(), Value::from(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<t0>"}
    });
    let config = serde_json::json!({
        "add_bos_token": false, "chat_template": PLACEHOLDER_TEMPLATE
    });
    LoadedTokenizer {
        tokenizer_json: serde_json::to_vec(&tokenizer).expect("json"),
        tokenizer_config_json: serde_json::to_vec(&config).expect("json"),
        token_types: vec![NORMAL; rows],
        tokens,
        merges: Vec::new(),
        chat_template: Some(PLACEHOLDER_TEMPLATE.to_string()),
    }
}
