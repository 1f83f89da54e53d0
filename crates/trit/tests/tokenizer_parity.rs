//! Tokenizer parity with the Python reference (`tools/ref_tokenizer.py` goldens) and with the
//! independent ids recorded in docs/assets.md (Python tokenizers for Qwen3, llama.cpp for
//! SmolLM2), over both construction paths: `tokenizer.json` and GGUF vocabulary.
//!
//! Needs the cache assets (tools/fetch_assets.sh; found via TRIT_CACHE or <repo>/.cache);
//! tests print a notice and return when an asset is absent.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{NormalizedString, Normalizer};
use trit::format::gguf::GgufFile;
use trit::format::gguf_write::GgufWriter;
use trit::format::TokenizerSource;
use trit::tokenizer::{token_type, GgufVocab, StreamDecoder, Tokenizer, TokenizerConfig};
use trit::Error;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache_file(rel: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache"));
    let path = cache.join(rel);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh or set TRIT_CACHE)",
            path.display()
        );
        None
    }
}

fn fixture(rel: &str) -> Value {
    let path = repo_root().join("tests/fixtures").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

fn cases(rel: &str) -> Vec<Case> {
    fixture(rel)["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_string(),
            ids: c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            decoded: c["decoded"].as_str().unwrap().to_string(),
            decoded_skip_special: c["decoded_skip_special"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn qwen3_json() -> Option<Tokenizer> {
    let path = cache_file("qwen3/tokenizer.json")?;
    Some(Tokenizer::from_json_file(path).unwrap())
}

fn nfc(text: &str) -> String {
    let mut n = NormalizedString::from(text);
    NFC.normalize(&mut n).unwrap();
    n.get().to_string()
}

/// Asserts encode/decode against every golden case.
fn check_goldens(tok: &Tokenizer, cases: &[Case], normalize_input: bool, what: &str) {
    assert!(cases.len() >= 15, "{what}: too few golden cases");
    for c in cases {
        let input = if normalize_input {
            nfc(&c.text)
        } else {
            c.text.clone()
        };
        let ids = tok.encode(&input, false).unwrap();
        assert_eq!(ids, c.ids, "{what}: ids of {:?}", c.text);
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            c.decoded,
            "{what}: decode of {:?}",
            c.text
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            c.decoded_skip_special,
            "{what}: decode(skip_special) of {:?}",
            c.text
        );
    }
}

/// Independent goldens from docs/assets.md §1 (Python tokenizers 0.23.3).
const QWEN3_ASSET_IDS: &[(&str, &[u32])] = &[
    ("Hello world", &[9707, 1879]),
    ("Hello, my dog is cute", &[9707, 11, 847, 5562, 374, 18838]),
    ("苹果发布M5芯片", &[104167, 90447, 44, 20, 105016]),
    (
        " Hello world\n\n  tabs\tand  spaces 12345 ☃ 🤖",
        &[
            21927, 1879, 271, 220, 22398, 52477, 220, 12621, 220, 16, 17, 18, 19, 20, 25125, 225,
            11162, 97, 244,
        ],
    ),
    (
        "<|im_start|>user\nHi<|im_end|>",
        &[151644, 872, 198, 13048, 151645],
    ),
];

/// Independent goldens from docs/assets.md §3 (llama.cpp's own GGUF tokenizer).
const SMOLLM2_ASSET_IDS: &[(&str, &[u32])] = &[
    ("The capital of France is", &[504, 3575, 282, 4649, 314]),
    ("Hello world", &[19556, 905]),
    (
        "苹果发布M5芯片",
        &[
            179, 229, 134, 43774, 12034, 235, 32947, 221, 61, 37, 179, 228, 124, 33913, 225,
        ],
    ),
];

#[test]
fn qwen3_tokenizer_json_matches_python_goldens() {
    let Some(tok) = qwen3_json() else { return };
    for (text, ids) in QWEN3_ASSET_IDS {
        assert_eq!(
            tok.encode(text, false).unwrap(),
            *ids,
            "assets.md ids of {text:?}"
        );
        assert_eq!(tok.decode(ids, false).unwrap(), *text);
    }
    check_goldens(
        &tok,
        &cases("tokenizer/qwen3_ids.json"),
        false,
        "qwen3 tokenizer.json",
    );
    assert_eq!(tok.vocab_size(), 151_669);
    // The Qwen3 post-processor adds nothing, with or without special tokens.
    assert_eq!(tok.encode("Hello world", true).unwrap(), [9707, 1879]);
}

#[test]
fn qwen3_special_tokens() {
    let Some(mut tok) = qwen3_json() else { return };
    let Some(cfg) = cache_file("qwen3/tokenizer_config.json") else {
        return;
    };
    tok.apply_config(&TokenizerConfig::from_json_file(cfg).unwrap())
        .unwrap();
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_id(), Some(151_645));
    let named = [
        ("<|endoftext|>", 151_643, true),
        ("<|im_start|>", 151_644, true),
        ("<|im_end|>", 151_645, true),
        ("<tool_call>", 151_657, false),
        ("</tool_response>", 151_666, false),
        ("<think>", 151_667, false),
        ("</think>", 151_668, false),
    ];
    for (text, id, special) in named {
        assert_eq!(tok.token_id(text), Some(id), "{text}");
        assert_eq!(tok.id_to_piece(id).as_deref(), Some(text));
        assert_eq!(tok.is_special(id), special, "{text}");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            [id],
            "{text} written in text"
        );
        assert_eq!(tok.token_bytes(id).unwrap(), text.as_bytes());
    }
    let ids = tok
        .encode(
            "<|im_start|>assistant\n<think>\nx\n</think>\n\nhi<|im_end|>",
            false,
        )
        .unwrap();
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "assistant\n<think>\nx\n</think>\n\nhi"
    );
    assert_eq!(tok.id_to_piece(13048).as_deref(), Some("Hi"));
    assert_eq!(tok.id_to_piece(220).as_deref(), Some("Ġ"));
    assert_eq!(tok.token_bytes(220).unwrap(), b" ");
    // Embedding rows beyond the vocabulary (Qwen3 has 151,936) have no token: decoded as nothing.
    assert_eq!(tok.id_to_piece(151_700), None);
    assert_eq!(
        tok.decode(&[9707, 151_700, 1879], false).unwrap(),
        "Hello world"
    );
    assert!(tok.set_eos(Some(151_700)).is_err());
}

/// The Qwen3 vocabulary as a llama.cpp GGUF stores it: model vocab, then the added tokens
/// (special → CONTROL, others → USER_DEFINED), padded with `[PAD{id}]` UNUSED entries.
fn qwen3_as_gguf_vocab(json_path: &Path) -> GgufVocab {
    let j: Value = serde_json::from_slice(&std::fs::read(json_path).unwrap()).unwrap();
    let model_vocab = j["model"]["vocab"].as_object().unwrap();
    let n = 151_936;
    let mut tokens = vec![String::new(); n];
    let mut types = vec![token_type::UNUSED; n];
    for (piece, id) in model_vocab {
        let id = id.as_u64().unwrap() as usize;
        tokens[id] = piece.clone();
        types[id] = token_type::NORMAL;
    }
    for t in j["added_tokens"].as_array().unwrap() {
        let id = t["id"].as_u64().unwrap() as usize;
        tokens[id] = t["content"].as_str().unwrap().to_string();
        types[id] = if t["special"].as_bool().unwrap() {
            token_type::CONTROL
        } else {
            token_type::USER_DEFINED
        };
    }
    for (id, t) in tokens.iter_mut().enumerate() {
        if t.is_empty() {
            *t = format!("[PAD{id}]");
        }
    }
    let merges = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
            other => panic!("merge {other}"),
        })
        .collect();
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        token_types: types,
        merges,
        bos: Some(151_643),
        eos: Some(151_645),
        pad: Some(151_643),
        add_bos: false,
        ..Default::default()
    }
}

#[test]
fn qwen3_gguf_vocab_path_matches_python_goldens() {
    let Some(path) = cache_file("qwen3/tokenizer.json") else {
        return;
    };
    let tok = Tokenizer::from_gguf_vocab(qwen3_as_gguf_vocab(&path)).unwrap();
    assert_eq!(tok.vocab_size(), 151_936);
    assert_eq!(tok.eos_id(), Some(151_645));
    assert!(tok.is_special(151_644) && !tok.is_special(151_667));
    for (text, ids) in QWEN3_ASSET_IDS {
        assert_eq!(
            tok.encode(text, false).unwrap(),
            *ids,
            "assets.md ids of {text:?}"
        );
        // add_bos is false for Qwen: nothing is added.
        assert_eq!(tok.encode(text, true).unwrap(), *ids);
    }
    // llama.cpp does not NFC-normalize BPE input (Qwen's tokenizer.json does): the goldens
    // hold for NFC input, and decomposed input tokenizes differently.
    check_goldens(
        &tok,
        &cases("tokenizer/qwen3_ids.json"),
        true,
        "qwen3 GGUF vocab",
    );
    let decomposed = "e\u{301}";
    assert_ne!(
        tok.encode(decomposed, false).unwrap(),
        tok.encode(&nfc(decomposed), false).unwrap()
    );
    assert_eq!(
        tok.decode(&tok.encode(decomposed, false).unwrap(), false)
            .unwrap(),
        decomposed
    );
    // Padding entries exist as pieces but decode like any normal piece.
    assert_eq!(tok.id_to_piece(151_700).as_deref(), Some("[PAD151700]"));
}

fn smollm2() -> Option<(Tokenizer, GgufVocab)> {
    let path = cache_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")?;
    let vocab = GgufVocab::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    Some((Tokenizer::from_gguf_vocab(vocab.clone()).unwrap(), vocab))
}

#[test]
fn smollm2_gguf_vocab_matches_llama_cpp_and_python_goldens() {
    let Some((tok, vocab)) = smollm2() else {
        return;
    };
    assert_eq!(vocab.pre.as_deref(), Some("smollm"));
    assert_eq!(vocab.merges.len(), 48_900);
    assert_eq!(
        (vocab.bos, vocab.eos, vocab.pad, vocab.unk),
        (Some(1), Some(2), Some(2), Some(0))
    );
    assert!(!vocab.add_bos && !vocab.add_eos);
    for (text, ids) in SMOLLM2_ASSET_IDS {
        assert_eq!(
            tok.encode(text, false).unwrap(),
            *ids,
            "llama.cpp ids of {text:?}"
        );
    }
    check_goldens(
        &tok,
        &cases("tokenizer/smollm2_ids.json"),
        false,
        "smollm2 GGUF vocab",
    );
    assert_eq!(tok.vocab_size(), 49_152);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    // add_bos_token is false in this GGUF.
    assert_eq!(tok.encode("Hello world", true).unwrap(), [19556, 905]);
    assert_eq!(tok.encode("<|im_start|>user", false).unwrap(), [1, 4093]);
    assert!(tok.is_special(1) && tok.is_special(16) && !tok.is_special(17));
}

#[test]
fn gguf_add_bos_and_eos_wrap_the_sequence() {
    let Some((_, mut vocab)) = smollm2() else {
        return;
    };
    vocab.add_bos = true;
    vocab.add_eos = true;
    let tok = Tokenizer::from_gguf_vocab(vocab).unwrap();
    assert_eq!(tok.encode("Hello world", true).unwrap(), [1, 19556, 905, 2]);
    assert_eq!(tok.encode("Hello world", false).unwrap(), [19556, 905]);
}

/// Streams `ids` one at a time; checks that no piece carries U+FFFD unless the full decode
/// does, and that the pieces add up to the full decode. Returns how many pushes were held back.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> usize {
    let full = tok.decode(ids, skip_special).unwrap();
    let mut stream = StreamDecoder::new().skip_special(skip_special);
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        match stream.push(tok, id) {
            Some(piece) => {
                assert!(
                    !piece.contains('\u{FFFD}') || full.contains('\u{FFFD}'),
                    "U+FFFD in piece {piece:?} of {full:?}"
                );
                out.push_str(&piece);
            }
            None => held += 1,
        }
    }
    out.push_str(&stream.flush(tok));
    assert_eq!(out, full, "stream of {ids:?}");
    assert!(!stream.has_pending());
    held
}

#[test]
fn stream_decoder_never_splits_characters() {
    let Some(tok) = qwen3_json() else { return };
    let mut held_total = 0;
    for c in cases("tokenizer/qwen3_ids.json") {
        held_total += check_stream(&tok, &c.ids, false);
        check_stream(&tok, &c.ids, true);
    }
    // " 🤖" is three tokens: " " + F0 9F, then A4, then 96. The space is emitted at once,
    // the emoji only when its last byte arrives.
    let robot = tok.encode(" 🤖", false).unwrap();
    assert_eq!(robot, [11162, 97, 244]);
    let mut s = StreamDecoder::new();
    assert_eq!(s.push(&tok, robot[0]).as_deref(), Some(" "));
    assert!(s.has_pending());
    assert_eq!(s.push(&tok, robot[1]), None);
    assert_eq!(s.push(&tok, robot[2]).as_deref(), Some("🤖"));
    assert!(!s.has_pending());
    assert!(held_total > 5, "the goldens contain split characters");
    // Flushing an incomplete character gives U+FFFD, like decode; so does a stray
    // continuation byte, at once.
    assert_eq!(s.push(&tok, robot[1]).as_deref(), Some("\u{FFFD}"));
    assert_eq!(s.push(&tok, robot[0]).as_deref(), Some(" "));
    assert_eq!(s.flush(&tok), "\u{FFFD}");
    assert_eq!(s.flush(&tok), "");

    if let Some((smol, _)) = smollm2() {
        for c in cases("tokenizer/smollm2_ids.json") {
            check_stream(&smol, &c.ids, false);
        }
        // 苹果发布M5芯片 is 15 byte-level pieces for 8 characters in SmolLM2.
        let ids = smol.encode("苹果发布M5芯片", false).unwrap();
        assert_eq!(ids.len(), 15);
        assert!(check_stream(&smol, &ids, false) >= 15 - 8);
    }
}

#[test]
fn stream_decoder_on_random_ids_equals_decode() {
    let Some(tok) = qwen3_json() else { return };
    // Deterministic pseudo-random ids over the whole embedding range, including specials,
    // byte fragments that never complete, and rows without a token.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..200 {
        let len = 1 + (next() % 40) as usize;
        let ids: Vec<u32> = (0..len)
            .map(|_| match next() % 4 {
                0 => (next() % 256) as u32,          // mostly single bytes
                1 => 151_640 + (next() % 40) as u32, // specials and unassigned rows
                _ => (next() % 151_936) as u32,
            })
            .collect();
        check_stream(&tok, &ids, round % 2 == 0);
    }
}

#[test]
fn decode_round_trips_goldens() {
    let Some(tok) = qwen3_json() else { return };
    for c in cases("tokenizer/qwen3_ids.json") {
        let ids = tok.encode(&c.text, false).unwrap();
        // NFC is the only lossy step: decode gives the normalized text.
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            nfc(&c.text),
            "{:?}",
            c.text
        );
        // Concatenating raw token bytes is the same as decoding.
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| tok.token_bytes(i).unwrap())
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), nfc(&c.text));
    }
}

#[test]
fn malformed_tokenizer_files_are_errors() {
    let garbage: [&[u8]; 5] = [
        b"",
        b"not json",
        b"{}",
        br#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}"#,
        br#"{"version": "1.0", "model": {"type": "Nope"}}"#,
    ];
    for bytes in garbage {
        match Tokenizer::from_json_bytes(bytes) {
            Err(Error::Tokenizer(msg)) => assert!(!msg.is_empty()),
            other => panic!(
                "{:?}: expected a tokenizer error, got {other:?}",
                String::from_utf8_lossy(bytes)
            ),
        }
    }
    match Tokenizer::from_json_file("/nonexistent/tokenizer.json") {
        Err(Error::Io { path, .. }) => assert!(path.contains("nonexistent")),
        other => panic!("{other:?}"),
    }
    if let Some(path) = cache_file("qwen3/tokenizer.json") {
        let bytes = std::fs::read(&path).unwrap();
        let err = Tokenizer::from_json_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(matches!(err, Error::Tokenizer(_)), "{err}");
    }
    let bad = GgufVocab {
        model: "gpt2".into(),
        pre: Some("not-a-pre".into()),
        tokens: vec!["a".into()],
        ..Default::default()
    };
    assert!(matches!(
        Tokenizer::from_gguf_vocab(bad),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn qwen3_token_counts_of_whole_books_match_assets_md() {
    let Some(tok) = qwen3_json() else { return };
    // docs/assets.md §1: Pride and Prejudice 161,035 tokens, KJV 996,887 (whole file, no
    // special tokens).
    for (rel, want) in [
        ("texts/prideprejudice.txt", 161_035),
        ("texts/kjv.txt", 996_887),
    ] {
        let Some(path) = cache_file(rel) else {
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        let start = std::time::Instant::now();
        let ids = tok.encode(&text, false).unwrap();
        eprintln!("{rel}: {} tokens in {:.2?}", ids.len(), start.elapsed());
        assert_eq!(ids.len(), want, "{rel}");
    }
}

#[test]
fn from_source_loads_json_folders_and_gguf_files() {
    if let (Some(tok), Some(cfg)) = (
        cache_file("qwen3/tokenizer.json"),
        cache_file("qwen3/tokenizer_config.json"),
    ) {
        let src = TokenizerSource::Json {
            tokenizer: tok,
            config: Some(cfg),
        };
        let t = Tokenizer::from_source(&src).unwrap();
        assert_eq!(t.eos_id(), Some(151_645));
        assert_eq!(t.eos_token().as_deref(), Some("<|im_end|>"));
        assert_eq!(t.bos_token(), None);
    }
    if let Some(path) = cache_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") {
        let src = TokenizerSource::Gguf(Arc::new(GgufFile::open(path).unwrap()));
        let t = Tokenizer::from_source(&src).unwrap();
        assert_eq!(
            t.encode("The capital of France is", false).unwrap(),
            [504, 3575, 282, 4649, 314]
        );
        assert_eq!(t.bos_token().as_deref(), Some("<|im_start|>"));
        assert_eq!(t.eos_token().as_deref(), Some("<|im_end|>"));
    }
}

/// A GGUF holding only tokenizer metadata (no tensors), from our own writer.
fn gguf_with(keys: impl FnOnce(&mut GgufWriter)) -> trit::Result<GgufFile> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    keys(&mut w);
    GgufFile::from_bytes("test.gguf", w.to_bytes())
}

#[test]
fn gguf_metadata_is_validated() {
    let ok = gguf_with(|w| {
        w.add("tokenizer.ggml.model", "gpt2").unwrap();
        w.add("tokenizer.ggml.pre", "llama-bpe").unwrap();
        w.add("tokenizer.ggml.tokens", vec!["a", "b", "ab", "<|begin|>"])
            .unwrap();
        w.add("tokenizer.ggml.token_type", vec![1i32, 1, 1, 3])
            .unwrap();
        w.add("tokenizer.ggml.merges", vec!["a b"]).unwrap();
        w.add("tokenizer.ggml.bos_token_id", 3u32).unwrap();
    })
    .unwrap();
    let v = GgufVocab::from_gguf(&ok).unwrap();
    // No add_bos_token key: llama.cpp adds BOS for Llama-3 vocabularies.
    assert!(v.add_bos);
    let t = Tokenizer::from_gguf_vocab(v).unwrap();
    assert_eq!(t.encode("abab", true).unwrap(), [3, 2, 2]);

    let no_vocab = gguf_with(|_| {}).unwrap();
    let err = GgufVocab::from_gguf(&no_vocab).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.model") && err.contains("test.gguf"),
        "{err}"
    );

    let wrong_type = gguf_with(|w| {
        w.add("tokenizer.ggml.model", "gpt2").unwrap();
        w.add("tokenizer.ggml.tokens", vec![1u32, 2]).unwrap();
    })
    .unwrap();
    let err = GgufVocab::from_gguf(&wrong_type).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");

    let bad_id = gguf_with(|w| {
        w.add("tokenizer.ggml.model", "gpt2").unwrap();
        w.add("tokenizer.ggml.tokens", vec!["a"]).unwrap();
        w.add("tokenizer.ggml.eos_token_id", "two").unwrap();
    })
    .unwrap();
    let err = GgufVocab::from_gguf(&bad_id).unwrap_err().to_string();
    assert!(err.contains("eos_token_id"), "{err}");

    let spm = gguf_with(|w| {
        w.add("tokenizer.ggml.model", "llama").unwrap();
        w.add("tokenizer.ggml.tokens", vec!["a"]).unwrap();
    })
    .unwrap();
    let src = TokenizerSource::Gguf(Arc::new(spm));
    assert!(matches!(
        Tokenizer::from_source(&src),
        Err(Error::Unsupported(_))
    ));
}
