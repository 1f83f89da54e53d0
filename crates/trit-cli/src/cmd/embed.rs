//! `trit embed "text"`: sentence embeddings on the command line (llama.cpp's
//! `llama-embedding`): each text's final-normed hidden states pooled (`--pooling`) and
//! L2-normalized, as `trit serve`'s `/v1/embeddings` returns them. One line of values per
//! text, or OpenAI's JSON with `--json`; with several texts, their cosine similarities on
//! standard error.

use super::{load, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use trit::engine::{embed, Pooling};

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// The model (the positional form of --model: `trit embed MODEL "text"`); given alone,
    /// the text, or with -f the model.
    #[arg(value_name = "MODEL")]
    pub first: Option<String>,
    /// The text to embed; `-` reads standard input (one text per line).
    #[arg(value_name = "TEXT")]
    pub second: Option<String>,
    /// Embed each non-empty line of this file.
    #[arg(short, long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// How one vector is made of a text's hidden states: mean, last or cls (llama.cpp's
    /// --pooling).
    #[arg(long, default_value = "mean", value_parser = parse_pooling)]
    pub pooling: Pooling,
    /// Print OpenAI's `/v1/embeddings` reply instead of one line of values per text.
    #[arg(long)]
    pub json: bool,
}

fn parse_pooling(s: &str) -> std::result::Result<Pooling, String> {
    Pooling::parse(s).map_err(|e| e.to_string())
}

/// The texts: the argument, or the lines of the file / standard input.
fn texts(text: &Option<String>, a: &EmbedArgs) -> Result<Vec<String>> {
    let lines = |s: String| -> Vec<String> {
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let texts = match (text, &a.file) {
        (_, Some(f)) => {
            lines(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
        }
        (Some(t), None) if t == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading standard input")?;
            lines(s)
        }
        (Some(t), None) => vec![t.clone()],
        (None, None) => bail!("no text: give it as an argument, -f FILE, or - for standard input"),
    };
    if texts.is_empty() || texts.iter().all(|t| t.trim().is_empty()) {
        bail!("nothing to embed: the text is empty");
    }
    Ok(texts)
}

pub fn run(mut a: EmbedArgs) -> Result<()> {
    let (model, text) = super::model_then_text((&a.first, &a.second), a.file.is_some(), "embed")?;
    let texts = texts(&text, &a)?;
    super::take_positional_model(model, &mut a.model)?;
    let loaded = load(&a.model)?;
    let cfg = &loaded.files.config;
    let bos = cfg.bos.filter(|_| cfg.add_bos);
    let mut vectors = Vec::with_capacity(texts.len());
    let mut n_tokens = 0;
    for (i, t) in texts.iter().enumerate() {
        let mut ids: Vec<u32> = bos.into_iter().collect();
        ids.extend(loaded.tokenizer.encode(t, false)?);
        if ids.len() > loaded.n_ctx {
            bail!(
                "text {} has {} tokens, more than the context ({}); raise --ctx",
                i + 1,
                ids.len(),
                loaded.n_ctx
            );
        }
        n_tokens += ids.len();
        vectors.push(
            embed(&loaded.model, &ids, a.pooling).with_context(|| format!("text {}", i + 1))?,
        );
    }
    if a.json {
        let data: Vec<_> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
            .collect();
        let reply = json!({
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        });
        println!("{reply}");
    } else {
        for v in &vectors {
            let line: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
            println!("{}", line.join(" "));
        }
    }
    if vectors.len() > 1 {
        eprintln!("cosine similarity matrix:");
        for a in &vectors {
            let row: Vec<String> = vectors
                .iter()
                .map(|b| format!("{:6.3}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()))
                .collect();
            eprintln!("{}", row.join(" "));
        }
    }
    Ok(())
}
