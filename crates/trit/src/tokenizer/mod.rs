//! Text ↔ token ids. Wraps Hugging Face `tokenizers` (with the `fancy-regex` backend, which
//! runs the look-ahead in Qwen's and Llama-3's split regexes) and adds what the engine needs
//! around it: tokenizers rebuilt from GGUF metadata ([`GgufVocab`]), BOS/EOS bookkeeping,
//! raw token bytes, and an incremental UTF-8-safe decoder ([`StreamDecoder`]).
//!
//! Conventions, all as in Python `tokenizers` (the reference for our goldens):
//! - `encode` always recognizes added tokens written in the text (`<|im_start|>`, `<think>`);
//!   `add_special` only controls whether the model's BOS/EOS are added around the text.
//! - `decode` drops ids that have no token (e.g. padding rows of an embedding larger than the
//!   vocabulary) and, with `skip_special`, special tokens.

mod byte_level;
mod gguf_vocab;
mod hf_config;
mod pretokenize;
mod source;
mod stream;

use std::collections::HashSet;
use std::path::Path;

use tokenizers::DecoderWrapper;

pub use gguf_vocab::{token_type, GgufVocab};
pub use hf_config::TokenizerConfig;
pub use pretokenize::{pre_name_for_regexes, PreTokenizerSpec};
pub use stream::StreamDecoder;

use crate::{Error, Result};

/// A loaded tokenizer. Cheap to share (`&Tokenizer` is `Sync`); cloning copies the vocabulary.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// One more than the highest id that has a token.
    vocab_size: usize,
    /// Decoder is plain byte-level: token bytes can be computed per token (fast streaming).
    byte_level: bool,
    special: HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// BOS/EOS that `encode(.., true)` adds itself (GGUF path; `tokenizer.json` files do it
    /// through their own post-processor).
    add_bos: bool,
    add_eos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("byte_level", &self.byte_level)
            .field("special_tokens", &self.special.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_bytes(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: {}", path.display(), strip_prefix(&e))))
    }

    /// Parses the contents of a Hugging Face `tokenizer.json`.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer.json: {e}")))?;
        // A prompt is never cut or padded behind the caller's back (context overflow is an
        // explicit error elsewhere).
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        inner.with_padding(None);
        Ok(Self::wrap(inner, None, false, false))
    }

    /// Rebuilds the tokenizer of a GGUF file from its `tokenizer.ggml.*` metadata.
    pub fn from_gguf_vocab(v: GgufVocab) -> Result<Self> {
        let inner = gguf_vocab::build(&v)?;
        let mut tok = Self::wrap(inner, Some(v.tokens.len()), v.add_bos, v.add_eos);
        tok.bos = v.bos;
        tok.eos = v.eos;
        Ok(tok)
    }

    fn wrap(
        inner: tokenizers::Tokenizer,
        vocab_size: Option<usize>,
        add_bos: bool,
        add_eos: bool,
    ) -> Self {
        let added = inner.get_added_tokens_decoder();
        let special: HashSet<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let vocab_size = vocab_size.unwrap_or_else(|| {
            let highest = inner.get_vocab(true).into_values().max();
            highest.map_or(0, |id| id as usize + 1)
        });
        let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        Tokenizer {
            inner,
            vocab_size,
            byte_level,
            special,
            bos: None,
            eos: None,
            add_bos,
            add_eos,
        }
    }

    /// Sets BOS/EOS from a `tokenizer_config.json` (a `tokenizer.json` does not name them).
    /// The config's `add_bos_token`/`add_eos_token` are not applied: the `tokenizer.json`
    /// post-processor already decides what `encode(.., true)` adds.
    pub fn apply_config(&mut self, config: &TokenizerConfig) -> Result<()> {
        let resolve = |name: &Option<String>, what: &str| -> Result<Option<u32>> {
            match name {
                None => Ok(None),
                Some(s) => self.token_id(s).map(Some).ok_or_else(|| {
                    Error::Tokenizer(format!("{what} token {s:?} is not in the vocabulary"))
                }),
            }
        };
        let bos = resolve(&config.bos_token, "bos")?;
        let eos = resolve(&config.eos_token, "eos")?;
        self.bos = bos;
        self.eos = eos;
        Ok(())
    }

    /// Overrides the BOS id (`None`: the model has none).
    pub fn set_bos(&mut self, id: Option<u32>) -> Result<()> {
        self.bos = self.check_id(id, "bos")?;
        Ok(())
    }

    /// Overrides the EOS id (e.g. from `generation_config.json`).
    pub fn set_eos(&mut self, id: Option<u32>) -> Result<()> {
        self.eos = self.check_id(id, "eos")?;
        Ok(())
    }

    fn check_id(&self, id: Option<u32>, what: &str) -> Result<Option<u32>> {
        match id {
            Some(i) if self.inner.id_to_token(i).is_none() => Err(Error::Tokenizer(format!(
                "{what} id {i} has no token (vocabulary size {})",
                self.vocab_size
            ))),
            _ => Ok(id),
        }
    }

    /// Text → ids. Added tokens written in `text` (`<|im_start|>`) become their ids;
    /// `add_special` adds the BOS/EOS the model's tokenizer adds to a sequence.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        let ids = enc.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        out.extend_from_slice(ids);
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Ids → text. Invalid UTF-8 (a sequence cut in the middle of a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    /// One more than the highest token id (151,669 for Qwen3's `tokenizer.json`; the model's
    /// embedding may have more rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token written exactly as in the vocabulary (`"<|im_end|>"`, `"Ġthe"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary spelling of an id (`"Ġthe"` in byte-level vocabularies).
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The raw bytes a token stands for (for byte-level vocabularies, the bytes behind the
    /// GPT-2 alphabet; otherwise the UTF-8 of the token decoded alone). May be part of a
    /// character.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        if self.byte_level {
            Some(byte_level::piece_to_bytes(&piece))
        } else {
            self.decode(&[id], false).ok().map(String::into_bytes)
        }
    }

    /// Whether `id` is a special (control) token, e.g. `<|im_end|>`; Qwen's `<think>` is not.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Whether the decoder is plain byte-level (Qwen, Llama-3, SmolLM2, all GGUF vocabularies).
    pub fn is_byte_level(&self) -> bool {
        self.byte_level
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The text of the BOS token (`bos_token` in chat templates).
    pub fn bos_token(&self) -> Option<String> {
        self.bos.and_then(|id| self.id_to_piece(id))
    }

    /// The text of the EOS token (`eos_token` in chat templates).
    pub fn eos_token(&self) -> Option<String> {
        self.eos.and_then(|id| self.id_to_piece(id))
    }

    /// The wrapped Hugging Face tokenizer, for anything not covered here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Drops the "tokenizer: " prefix of a nested error so messages do not repeat it.
fn strip_prefix(e: &Error) -> String {
    match e {
        Error::Tokenizer(m) => m.clone(),
        other => other.to_string(),
    }
}
