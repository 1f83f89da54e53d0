//! Pre-tokenizers for GGUF byte-level vocabularies, chosen by `tokenizer.ggml.pre` the way
//! llama.cpp chooses them. llama.cpp applies a list of regexes in turn: each one splits every
//! piece left by the previous one into its matches and the gaps between them. A sequence of
//! Hugging Face `Split(regex, Isolated)` pre-tokenizers does exactly that, followed by the
//! byte-level mapping (no prefix space, no further regex).
//!
//! Only the pre-tokenizers of the model families trit targets (and their aliases) are listed;
//! any other name is refused, as llama.cpp refuses names it does not know, because a wrong
//! split silently produces token ids the model was never trained on.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::{Error, Result};

/// GPT-2's split: contractions, letters, numbers, other symbols (each with an optional leading
/// space), whitespace not followed by a word, then any whitespace. llama.cpp spells it without
/// the final `|\s+`; the two are equivalent because llama.cpp keeps unmatched gaps as pieces.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama-3 (`cl100k`-style): case-insensitive contractions, letters with one leading non-letter,
/// numbers in groups of 1-3 digits, symbols with trailing newlines, newline runs, whitespace.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2/Qwen3: the Llama-3 split with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5: the Qwen2 split with combining marks (`\p{M}`) kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` value tokenizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// The family name, for messages (`"qwen2"`, `"llama3"`, ...).
    pub family: &'static str,
    /// Regexes applied one after the other, as llama.cpp applies them.
    pub regexes: &'static [&'static str],
    /// A pre-token found whole in the vocabulary is emitted without running merges (Llama-3).
    pub ignore_merges: bool,
    /// Whether llama.cpp adds BOS for this family when the GGUF has no `add_bos_token` key.
    pub default_add_bos: bool,
}

const fn spec(
    family: &'static str,
    regexes: &'static [&'static str],
    ignore_merges: bool,
    default_add_bos: bool,
) -> PreTokenizerSpec {
    PreTokenizerSpec {
        family,
        regexes,
        ignore_merges,
        default_add_bos,
    }
}

/// `(names, spec)`; the names are llama.cpp's spellings of `tokenizer.ggml.pre`.
const KNOWN: &[(&[&str], PreTokenizerSpec)] = &[
    (
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"],
        spec("llama3", &[LLAMA3], true, true),
    ),
    (
        &["dbrx", "smaug-bpe"],
        spec("llama3", &[LLAMA3], false, false),
    ),
    (
        &["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"],
        spec("qwen2", &[QWEN2], false, false),
    ),
    (&["qwen35"], spec("qwen35", &[QWEN35], false, false)),
    (
        &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        // Every digit on its own, then GPT-2's split.
        spec("smollm", &[r"\p{N}", GPT2], false, false),
    ),
    (
        // "gpt2" is not a llama.cpp name ("gpt-2" is) but some converters write it.
        &["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"],
        spec("gpt2", &[GPT2], false, false),
    ),
    (
        // llama.cpp's fallback when a BPE GGUF names no pre-tokenizer.
        &["default"],
        spec(
            "default",
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
    ),
];

/// The `tokenizer.ggml.pre` name whose regexes equal a Hugging Face tokenizer's `Split`
/// patterns (in order), for writing GGUF metadata from a `tokenizer.json`. HF spells the
/// contractions case-insensitively (`(?i:'s|…)`); llama.cpp's spelling is expanded first.
pub fn pre_name_for_regexes(regexes: &[String]) -> Option<&'static str> {
    const HF_CONTRACTIONS: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    const EXPANDED: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
    let canon: Vec<String> = regexes
        .iter()
        .map(|r| r.replace(HF_CONTRACTIONS, EXPANDED))
        .collect();
    KNOWN
        .iter()
        .find(|(_, spec)| {
            spec.regexes
                .iter()
                .copied()
                .eq(canon.iter().map(String::as_str))
        })
        .map(|(names, _)| names[0])
}

impl PreTokenizerSpec {
    /// The spec for a `tokenizer.ggml.pre` value; `None` (key absent) means llama.cpp's default.
    pub fn for_pre(pre: Option<&str>) -> Result<PreTokenizerSpec> {
        let name = pre.unwrap_or("default");
        KNOWN
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|(_, spec)| *spec)
            .ok_or_else(|| {
                let known: Vec<&str> = KNOWN.iter().flat_map(|(n, _)| n.iter().copied()).collect();
                Error::Unsupported(format!(
                    "GGUF tokenizer.ggml.pre '{name}' (trit knows: {})",
                    known.join(", ")
                ))
            })
    }

    /// The Hugging Face pre-tokenizer implementing this spec.
    pub fn build(&self) -> Result<PreTokenizerWrapper> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(self.regexes.len() + 1);
        for re in self.regexes {
            let split = Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex {re:?}: {e}")))?;
            steps.push(split.into());
        }
        // Bytes → GPT-2 alphabet only; the splitting was done above.
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let pt = PreTokenizerSpec::for_pre(Some(pre))
            .unwrap()
            .build()
            .unwrap();
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn digits_follow_the_family() {
        assert_eq!(
            pieces("qwen2", "x 12345"),
            ["x", " ", "1", "2", "3", "4", "5"]
        );
        assert_eq!(pieces("llama-bpe", "x 12345"), ["x", " ", "123", "45"]);
        assert_eq!(
            pieces("smollm", "x 12345"),
            ["x", " ", "1", "2", "3", "4", "5"]
        );
        assert_eq!(pieces("gpt2", "x 12345"), ["x", " 12345"]);
        assert_eq!(pieces("default", "x 12345"), ["x", " ", "123", "45"]);
    }

    #[test]
    fn whitespace_lookahead_keeps_last_space_with_the_word() {
        // `\s+(?!\S)` needs look-ahead (fancy-regex): "   b" → "  " + " b".
        assert_eq!(pieces("gpt2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(
            pieces("qwen2", "a   b\n\n c"),
            ["a", "  ", " b", "\n\n", " c"]
        );
        assert_eq!(pieces("qwen2", "I'M ok"), ["I", "'M", " ok"]);
    }

    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        assert_eq!(pieces("qwen2", "e\u{301}x"), ["e", "\u{301}x"]);
        assert_eq!(pieces("qwen35", "e\u{301}x"), ["e\u{301}x"]);
    }

    #[test]
    fn unknown_pre_is_refused_with_the_known_list() {
        let err = PreTokenizerSpec::for_pre(Some("mystery"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'mystery'") && err.contains("qwen2"), "{err}");
        assert_eq!(PreTokenizerSpec::for_pre(None).unwrap().family, "default");
    }
}
