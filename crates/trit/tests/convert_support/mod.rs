//! Helpers shared by the convert and quantize tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// GPT-2's byte → printable character map (byte-level BPE's alphabet).
fn byte_char(b: u8) -> char {
    let mut n = 0u32;
    for x in 0..=255u8 {
        let printable = matches!(x, 33..=126 | 161..=172 | 174..=255);
        if x == b {
            return if printable {
                x as char
            } else {
                char::from_u32(256 + n).unwrap()
            };
        }
        if !printable {
            n += 1;
        }
    }
    unreachable!()
}

/// A small byte-level BPE tokenizer with Qwen2's pre-tokenizer and ChatML specials (ids
/// 258..260), so test models can have a 1024-row vocabulary instead of Qwen3's 151,936.
pub fn small_tokenizer(dir: &Path) -> PathBuf {
    let tok_dir = dir.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).unwrap();
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), b.into());
    }
    vocab.insert("Ġt".into(), 256.into());
    vocab.insert("he".into(), 257.into());
    let special = |id: u32, s: &str| {
        serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(258, "<|endoftext|>"), special(259, "<|im_end|>"),
            special(260, "<|im_start|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": qwen2}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": ["Ġ t", "h e"]}
    });
    let config = serde_json::json!({
        "add_bos_token": false, "bos_token": null, "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    });
    std::fs::write(tok_dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    tok_dir
}
