//! Checks through the engine's own code: the loader opens the files, the model builds from
//! them (config agrees with tensor shapes), the tokenizer loads and round-trips text, the chat
//! template renders. Each failure is the loader's own error, so doctor and `trit run` agree.

use super::file_checks::{check_checksums, check_gguf_file, check_safetensors_folder};
use super::Check;
use std::path::Path;
use trit::chat::ChatTemplate;
use trit::format::{ModelFiles, TokenizerSource};
use trit::tokenizer::Tokenizer;

/// Text the tokenizer must give back unchanged: ASCII, digits, accents, CJK, emoji.
const ROUND_TRIP: &[&str] = &[
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  indented\n\tand 1234 + 5678 = 6912",
    "naïve café, 日本語, emoji 🙂",
];

/// Every check for the model at `path` (a GGUF file or a model folder).
pub fn check_model(path: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    if !path.exists() {
        checks.push(Check::fail(
            "model",
            format!("{} does not exist", path.display()),
        ));
        return checks;
    }
    if path.is_dir() {
        checks.extend(check_safetensors_folder(path));
    } else {
        checks.extend(check_gguf_file(path));
    }
    checks.push(check_checksums(path));
    let files = match trit::format::open(path) {
        Ok(f) => {
            checks.push(Check::pass(
                "loader",
                format!(
                    "{} ({}), {:?}",
                    f.format_name,
                    f.weights.describe(),
                    f.config.arch
                ),
            ));
            Some(f)
        }
        Err(e) => {
            checks.push(Check::fail("loader", e.to_string()));
            None
        }
    };
    let tokenizer = check_tokenizer(path, files.as_ref(), &mut checks);
    check_template(files.as_ref(), tokenizer.as_ref(), &mut checks);
    match &files {
        Some(f) => checks.push(
            match trit::model::Model::load(f, trit::threadpool::default_threads()) {
                Ok(m) => {
                    drop(m);
                    let c = &f.config;
                    Check::pass(
                        "config vs tensors",
                        format!(
                            "{} layers, hidden {}, {} q / {} kv heads × {}, vocab {}: every tensor has the shape the config implies",
                            c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab
                        ),
                    )
                }
                Err(e) => Check::fail("config vs tensors", e.to_string()),
            },
        ),
        None => checks.push(Check::skip("config vs tensors", "the loader failed")),
    }
    checks
}

/// The tokenizer the loader would use; in a folder whose loader failed, `tokenizer.json`
/// directly, so a broken tokenizer is named even when something else is broken too.
fn check_tokenizer(
    path: &Path,
    files: Option<&ModelFiles>,
    checks: &mut Vec<Check>,
) -> Option<Tokenizer> {
    let source = match files {
        Some(f) => f.tokenizer.clone(),
        None if path.join("tokenizer.json").exists() => TokenizerSource::Json {
            tokenizer: path.join("tokenizer.json"),
            config: Some(path.join("tokenizer_config.json")).filter(|p| p.exists()),
        },
        None => {
            checks.push(Check::skip("tokenizer", "the loader failed"));
            return None;
        }
    };
    let tok = match Tokenizer::from_source(&source) {
        Ok(t) => t,
        Err(e) => {
            checks.push(Check::fail("tokenizer", e.to_string()));
            return None;
        }
    };
    let mut problems = Vec::new();
    let rows = files.map(|f| f.config.vocab);
    for s in ROUND_TRIP {
        match tok
            .encode(s, false)
            .and_then(|ids| Ok((tok.decode(&ids, false)?, ids)))
        {
            Ok((back, ids)) => {
                if back != *s {
                    problems.push(format!("{s:?} decodes back as {back:?}"));
                }
                if let Some(bad) = ids.iter().find(|&&i| rows.is_some_and(|r| i as usize >= r)) {
                    problems.push(format!(
                        "{s:?} encodes to id {bad}, past the embedding's {} rows",
                        rows.unwrap_or(0)
                    ));
                }
            }
            Err(e) => problems.push(format!("{s:?}: {e}")),
        }
    }
    checks.push(Check::from_problems(
        "tokenizer",
        format!(
            "{} tokens, {} strings round-trip",
            tok.vocab_size(),
            ROUND_TRIP.len()
        ),
        &problems,
    ));
    Some(tok)
}

fn check_template(files: Option<&ModelFiles>, tok: Option<&Tokenizer>, checks: &mut Vec<Check>) {
    let Some(files) = files else {
        checks.push(Check::skip("chat template", "the loader failed"));
        return;
    };
    let Some(src) = files.chat_template.as_ref() else {
        checks.push(Check::skip(
            "chat template",
            "none shipped (raw completion only)",
        ));
        return;
    };
    let bos = tok.and_then(Tokenizer::bos_token).unwrap_or_default();
    let eos = tok.and_then(Tokenizer::eos_token).unwrap_or_default();
    let user = "What is 2 + 2?";
    let messages = [
        serde_json::json!({"role": "system", "content": "You are terse."}),
        serde_json::json!({"role": "user", "content": user}),
    ];
    let rendered = ChatTemplate::new(src, &bos, &eos).and_then(|t| {
        t.set_fixed_time(Some(0));
        t.render(&messages, true, None, &serde_json::Map::new())
    });
    checks.push(match rendered {
        Ok(text) if text.contains(user) => Check::pass(
            "chat template",
            format!("renders a system + user turn ({} chars)", text.len()),
        ),
        Ok(text) => Check::fail(
            "chat template",
            format!("rendered text lacks the user message: {text:?}"),
        ),
        Err(e) => Check::fail("chat template", e.to_string()),
    });
}
