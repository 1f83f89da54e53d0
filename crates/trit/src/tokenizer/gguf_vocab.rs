//! Byte-level BPE tokenizers rebuilt from GGUF metadata (`tokenizer.ggml.*`), for files that
//! carry no `tokenizer.json` (SmolLM2, Bonsai GGUFs, our own exports).

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::AddedToken;

use super::pretokenize::PreTokenizerSpec;
use crate::{Error, Result};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    /// Special tokens such as `<|im_start|>`: matched in text, skipped by `decode(.., true)`.
    pub const CONTROL: i32 = 3;
    /// Added tokens such as Qwen's `<think>`: matched in text, always decoded.
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer part of a GGUF file's metadata; the GGUF loader fills it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`; only `"gpt2"` (byte-level BPE) is supported.
    pub model: String,
    /// `tokenizer.ggml.pre`: `"qwen2"`, `"qwen35"`, `"smollm"`, `"llama-bpe"`, `"gpt-2"`, ...;
    /// `None` when the key is absent (llama.cpp's `default` split).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, in byte-level spelling (`Ġthe`); the index is the id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (see [`token_type`]); empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (Llama-3's `<|eot_id|>`), another end-of-generation token.
    pub eot: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; when the key is absent use [`GgufVocab::default_add_bos`].
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: bool,
}

impl GgufVocab {
    /// llama.cpp's choice of `add_bos` for a vocabulary whose GGUF has no `add_bos_token` key.
    pub fn default_add_bos(pre: Option<&str>) -> bool {
        PreTokenizerSpec::for_pre(pre)
            .map(|s| s.default_add_bos)
            .unwrap_or(false)
    }

    /// Checks the cross-field invariants the builder relies on.
    fn validate(&self) -> Result<()> {
        if self.model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "GGUF tokenizer.ggml.model '{}' (trit supports byte-level BPE, 'gpt2')",
                self.model
            )));
        }
        if self.tokens.is_empty() {
            return Err(Error::Tokenizer(
                "GGUF tokenizer.ggml.tokens is empty".into(),
            ));
        }
        if u32::try_from(self.tokens.len()).is_err() {
            return Err(Error::Tokenizer(
                "GGUF vocabulary has more than 2^32 tokens".into(),
            ));
        }
        if !self.token_types.is_empty() && self.token_types.len() != self.tokens.len() {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer.ggml.token_type has {} entries for {} tokens",
                self.token_types.len(),
                self.tokens.len()
            )));
        }
        let named = [
            ("bos", self.bos),
            ("eos", self.eos),
            ("eot", self.eot),
            ("pad", self.pad),
            ("unk", self.unk),
        ];
        for (name, id) in named {
            if let Some(id) = id {
                if id as usize >= self.tokens.len() {
                    return Err(Error::Tokenizer(format!(
                        "GGUF {name} token id {id} is outside the vocabulary of {} tokens",
                        self.tokens.len()
                    )));
                }
            }
        }
        if self.add_bos && self.bos.is_none() {
            return Err(Error::Tokenizer(
                "GGUF asks to add BOS but has no tokenizer.ggml.bos_token_id".into(),
            ));
        }
        if self.add_eos && self.eos.is_none() {
            return Err(Error::Tokenizer(
                "GGUF asks to add EOS but has no tokenizer.ggml.eos_token_id".into(),
            ));
        }
        Ok(())
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(token_type::NORMAL)
    }

    fn parse_merges(&self) -> Result<Vec<(String, String)>> {
        self.merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                // Byte-level pieces never contain a literal space (it is spelled 'Ġ').
                let mut parts = m.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                        Ok((a.to_string(), b.to_string()))
                    }
                    _ => Err(Error::Tokenizer(format!(
                        "GGUF merge #{i} {m:?} is not two tokens separated by one space"
                    ))),
                }
            })
            .collect()
    }
}

/// Builds the Hugging Face tokenizer equivalent to llama.cpp's tokenizer for this vocabulary.
/// No normalizer is applied: llama.cpp does not normalize BPE input (Qwen's `tokenizer.json`
/// applies NFC, which only matters for text in decomposed form).
pub(super) fn build(v: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    v.validate()?;
    let spec = PreTokenizerSpec::for_pre(v.pre.as_deref())?;

    // For duplicated pieces the last id wins, as in llama.cpp's token-to-id map.
    let vocab: tokenizers::models::bpe::Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    let merges = v.parse_merges()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| Error::Tokenizer(format!("GGUF vocabulary/merges: {e}")))?;

    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(spec.build()?));
    tok.with_decoder(Some(ByteLevelDecoder::default()));

    // Tokens that text can name directly. `normalized(false)`: matched on the raw text.
    let added: Vec<AddedToken> = v
        .tokens
        .iter()
        .enumerate()
        .filter_map(|(id, t)| {
            let special = match v.token_type(id) {
                token_type::CONTROL | token_type::UNKNOWN => true,
                token_type::USER_DEFINED => false,
                _ => return None,
            };
            (!t.is_empty()).then(|| AddedToken::from(t.clone(), special).normalized(false))
        })
        .collect();
    // `add_tokens` reuses the id the piece already has in the BPE vocabulary.
    tok.add_tokens(&added);
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> GgufVocab {
        GgufVocab {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens: ["a", "b", "ab", "Ġ", "Ġab", "<|end|>"]
                .map(String::from)
                .to_vec(),
            token_types: vec![1, 1, 1, 1, 1, 3],
            merges: vec!["a b".into(), "Ġ ab".into()],
            eos: Some(5),
            ..Default::default()
        }
    }

    #[test]
    fn builds_and_merges() {
        let tok = build(&tiny()).unwrap();
        let ids = tok
            .encode("ab ab<|end|>", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, [2, 4, 5]);
    }

    #[test]
    fn rejects_inconsistent_metadata() {
        let mut v = tiny();
        v.model = "llama".into();
        assert!(matches!(build(&v), Err(Error::Unsupported(_))));

        let mut v = tiny();
        v.token_types.pop();
        assert!(build(&v).unwrap_err().to_string().contains("token_type"));

        let mut v = tiny();
        v.eos = Some(6);
        assert!(build(&v)
            .unwrap_err()
            .to_string()
            .contains("eos token id 6"));

        let mut v = tiny();
        v.merges.push("ab".into());
        assert!(build(&v).unwrap_err().to_string().contains("merge #2"));

        let mut v = tiny();
        v.merges.push("a zz".into());
        assert!(build(&v).is_err(), "merge of an unknown piece must fail");

        let mut v = tiny();
        v.tokens.clear();
        v.token_types.clear();
        v.eos = None;
        assert!(build(&v).unwrap_err().to_string().contains("empty"));

        let mut v = tiny();
        v.add_bos = true;
        assert!(build(&v).unwrap_err().to_string().contains("BOS"));
    }
}
