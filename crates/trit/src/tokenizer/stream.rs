//! Incremental detokenization for streaming output.
//!
//! One token is often only part of a character: byte-level vocabularies split a CJK character
//! or an emoji over two or three tokens. Decoding token by token would print U+FFFD for the
//! fragments. [`StreamDecoder`] emits text only once it ends on a complete character, and the
//! concatenation of everything it emits (plus [`StreamDecoder::flush`]) equals
//! `Tokenizer::decode` of the whole sequence.

use super::Tokenizer;

/// Turns a stream of token ids into text pieces that always end on a character boundary.
///
/// ```ignore
/// let mut stream = StreamDecoder::new();
/// for id in generated { if let Some(text) = stream.push(&tok, id) { print!("{text}") } }
/// print!("{}", stream.flush(&tok));
/// ```
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    skip_special: bool,
    /// Byte-level tokenizers: raw bytes not yet emitted (an incomplete UTF-8 sequence).
    pending: Vec<u8>,
    /// Other decoders: the ids being decoded (the first `context_len` were emitted before),
    /// the part of their decoding already emitted, and their latest decoding.
    window: Vec<u32>,
    context_len: usize,
    emitted: String,
    latest: String,
}

const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}

impl StreamDecoder {
    /// A decoder that leaves out special tokens (`<|im_end|>`), as `decode(.., true)` does.
    /// Qwen's `<think>`/`</think>` are not special and are kept.
    pub fn new() -> Self {
        StreamDecoder {
            skip_special: true,
            pending: Vec::new(),
            window: Vec::new(),
            context_len: 0,
            emitted: String::new(),
            latest: String::new(),
        }
    }

    /// `false`: also print special tokens, as `decode(.., false)` does.
    pub fn skip_special(mut self, skip: bool) -> Self {
        self.skip_special = skip;
        self
    }

    /// Feeds one generated id; returns the text that became complete, if any. Ids without a
    /// token (padding rows beyond the vocabulary) contribute nothing, as in `decode`.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        if tok.is_byte_level() {
            self.push_bytes(tok, id)
        } else {
            self.push_generic(tok, id)
        }
    }

    /// Returns whatever is still held back (an incomplete character becomes U+FFFD, as in
    /// `decode`; empty if nothing is) and resets the decoder for a new sequence.
    pub fn flush(&mut self, _tok: &Tokenizer) -> String {
        let rest = if !self.pending.is_empty() {
            String::from_utf8_lossy(&self.pending).into_owned()
        } else {
            self.latest
                .get(self.emitted.len()..)
                .unwrap_or_default()
                .to_string()
        };
        *self = StreamDecoder::new().skip_special(self.skip_special);
        rest
    }

    /// Whether text is being held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.latest.len() > self.emitted.len()
    }

    fn push_bytes(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        if self.skip_special && tok.is_special(id) {
            return None;
        }
        self.pending.extend_from_slice(&tok.token_bytes(id)?);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` marks a UTF-8 boundary, so this cannot fail.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // A truncated character at the end: wait for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                        // Bytes that can never become valid: U+FFFD now, as a lossy decode does.
                        Some(n) => {
                            out.push(REPLACEMENT);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        (!out.is_empty()).then_some(out)
    }

    /// Decoders other than byte-level (e.g. SentencePiece-style `▁` + byte fallback) may
    /// change earlier text depending on later tokens (leading-space stripping), so decode a
    /// window of ids and emit what it adds. The window starts with the ids of the previous
    /// emission (context that decodes cleanly), followed by the ids not yet emitted.
    fn push_generic(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        self.window.push(id);
        let text = tok.decode(&self.window, self.skip_special).ok()?;
        if text.ends_with(REPLACEMENT) || text.len() <= self.emitted.len() {
            self.latest = text;
            return None;
        }
        let new = match text.strip_prefix(self.emitted.as_str()) {
            Some(new) => new.to_string(),
            // The decoder rewrote text already emitted; emitting the new tail is the best
            // that can be done without retracting output.
            None => text
                .char_indices()
                .find(|&(i, _)| i >= self.emitted.len())
                .map(|(i, _)| text[i..].to_string())
                .unwrap_or_default(),
        };
        // The ids of this emission become the context of the next one.
        self.window = self.window.split_off(self.context_len);
        self.context_len = self.window.len();
        self.emitted = tok.decode(&self.window, self.skip_special).ok()?;
        self.latest = self.emitted.clone();
        Some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SentencePiece-style tokenizer (`▁` for spaces, `<0xNN>` byte fallback, first space
    /// stripped by the decoder): exercises the generic windowed path.
    fn sentencepiece_like() -> Tokenizer {
        let json = r#"{
          "version": "1.0", "truncation": null, "padding": null,
          "added_tokens": [{"id": 0, "content": "</s>", "single_word": false, "lstrip": false,
                            "rstrip": false, "normalized": false, "special": true}],
          "normalizer": null, "pre_tokenizer": null, "post_processor": null,
          "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "dropout": null, "unk_token": null,
                    "continuing_subword_prefix": null, "end_of_word_suffix": null,
                    "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
                    "vocab": {"</s>": 0, "▁Hello": 1, "▁world": 2, "<0xE4>": 3, "<0xBD>": 4,
                              "<0xA0>": 5, "!": 6},
                    "merges": []}
        }"#;
        Tokenizer::from_json_bytes(json.as_bytes()).unwrap()
    }

    #[test]
    fn generic_path_keeps_spaces_and_waits_for_whole_characters() {
        let tok = sentencepiece_like();
        assert!(!tok.is_byte_level());
        let ids = [1, 2, 3, 4, 5, 6, 0, 1];
        assert_eq!(tok.decode(&ids, true).unwrap(), "Hello world你! Hello");
        let mut s = StreamDecoder::new();
        let got: Vec<Option<String>> = ids.iter().map(|&id| s.push(&tok, id)).collect();
        let want = [
            Some("Hello"),
            Some(" world"),
            None,
            None,
            Some("你"),
            Some("!"),
            None,
            Some(" Hello"),
        ];
        assert_eq!(got, want.map(|w| w.map(String::from)));
        assert_eq!(s.flush(&tok), "");
        // An incomplete character at the end is flushed as U+FFFD, like decode.
        assert_eq!(s.push(&tok, 3), None);
        assert_eq!(s.flush(&tok), "\u{FFFD}");
    }
}
