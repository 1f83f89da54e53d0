//! From what `format::open` found (a `tokenizer.json` folder or a GGUF file) to a
//! [`Tokenizer`].

use crate::format::gguf::{GgufFile, Value};
use crate::format::TokenizerSource;
use crate::{Error, Result};

use super::{GgufVocab, Tokenizer, TokenizerConfig};

impl GgufVocab {
    /// Reads `tokenizer.ggml.*` from a GGUF file. A missing `add_bos_token` key means
    /// llama.cpp's default for the pre-tokenizer ([`GgufVocab::default_add_bos`]).
    pub fn from_gguf(file: &GgufFile) -> Result<GgufVocab> {
        let src = file.source();
        let bad = |key: &str, what: &str| Error::Tokenizer(format!("{src}: {key} {what}"));
        let model = file
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| {
                bad(
                    "tokenizer.ggml.model",
                    "is missing (no vocabulary in this GGUF)",
                )
            })?
            .to_string();
        let pre = optional(file, "tokenizer.ggml.pre", |v| {
            v.as_str().map(str::to_string)
        })?;
        // microsoft/BitNet's 2B4T GGUF names no pre-tokenizer; its vocabulary is Llama-3's,
        // which Hugging Face splits with the llama3 rules (llama.cpp falls back to "default").
        let bitnet = matches!(
            file.get_str("general.architecture"),
            Some("bitnet" | "bitnet-b1.58")
        );
        let pre = match pre {
            None if bitnet && model == "gpt2" => Some("llama-bpe".to_string()),
            p => p,
        };
        let strings = |key: &str, required: bool| -> Result<Vec<String>> {
            match file.get(key) {
                None if !required => Ok(Vec::new()),
                None => Err(bad(key, "is missing")),
                Some(v) => v.as_str_array().map(<[String]>::to_vec).ok_or_else(|| {
                    bad(
                        key,
                        &format!("must be a string array, not {}", v.type_name()),
                    )
                }),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens", true)?;
        let merges = strings("tokenizer.ggml.merges", false)?;
        let token_types = match file.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(v) => v
                .to_i64_vec()
                .and_then(|xs| xs.into_iter().map(|x| i32::try_from(x).ok()).collect())
                .ok_or_else(|| bad("tokenizer.ggml.token_type", "must be an integer array"))?,
        };
        let id = |key: &str| {
            optional(file, key, |v| {
                v.as_u64().and_then(|x| u32::try_from(x).ok())
            })
        };
        let flag = |key: &str| optional(file, key, Value::as_bool);
        let add_bos = flag("tokenizer.ggml.add_bos_token")?
            .unwrap_or_else(|| GgufVocab::default_add_bos(pre.as_deref()));
        Ok(GgufVocab {
            model,
            tokens,
            token_types,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            add_bos,
            add_eos: flag("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            pre,
        })
    }
}

/// A key that may be absent but, when present, must convert.
fn optional<T>(
    file: &GgufFile,
    key: &str,
    conv: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => conv(v).map(Some).ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: {key} has an unexpected type {}",
                file.source(),
                v.type_name()
            ))
        }),
    }
}

impl Tokenizer {
    /// Loads the tokenizer `format::open` located: a `tokenizer.json` (with BOS/EOS from its
    /// `tokenizer_config.json` when there is one) or the vocabulary inside a GGUF file.
    pub fn from_source(source: &TokenizerSource) -> Result<Tokenizer> {
        match source {
            TokenizerSource::Json { tokenizer, config } => {
                let mut tok = Tokenizer::from_json_file(tokenizer)?;
                if let Some(cfg) = config {
                    tok.apply_config(&TokenizerConfig::from_json_file(cfg)?)?;
                }
                Ok(tok)
            }
            TokenizerSource::Gguf(file) => Tokenizer::from_gguf_vocab(GgufVocab::from_gguf(file)?)
                .map_err(|e| match e {
                    Error::Tokenizer(m) => Error::Tokenizer(format!("{}: {m}", file.source())),
                    other => other,
                }),
        }
    }
}
