//! Writes trit's last-position logits for a list of token ids (little-endian f32), for the
//! reference scripts in tools/ that compare them with llama.cpp or mlx-lm.
//!
//! cargo run --release -p trit --example dump_logits -- MODEL OUT.f32 [--adapter DIR] ID...

use std::path::PathBuf;
use std::sync::Arc;
use trit::engine::Session;
use trit::model::Model;

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: dump_logits MODEL OUT.f32 [--adapter DIR] ID...";
    let model = PathBuf::from(args.next().ok_or(usage)?);
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let mut adapter = None;
    let mut ids = Vec::new();
    while let Some(a) = args.next() {
        if a == "--adapter" {
            adapter = Some(PathBuf::from(args.next().ok_or(usage)?));
        } else {
            ids.push(
                a.parse::<u32>()
                    .map_err(|e| format!("token id '{a}': {e}"))?,
            );
        }
    }
    let files = trit::format::open(&model).map_err(|e| e.to_string())?;
    let m = Model::load_with_adapter(&files, 2, adapter.as_deref()).map_err(|e| e.to_string())?;
    let logits = Session::new(Arc::new(m), ids.len() + 1)
        .prefill(&ids)
        .map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&out, bytes).map_err(|e| format!("{}: {e}", out.display()))
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
