//! Writes a deterministic random ternary model in several formats (assets.md §6).
//!
//! cargo run --release -p trit --example gen_model -- --preset tiny --seed 0 \
//!     --tokenizer .cache/qwen3 --out DIR --formats mlx,q2_0,pq2_0,ptq1_0,tq2_0,tq1_0,f16
//!
//! Writes DIR/mlx/, DIR/model-<fmt>.gguf and DIR/f16/. Without --tokenizer the files get a
//! placeholder vocabulary (enough for loader tests, not for text).

use std::path::PathBuf;
use std::time::Instant;
use trit::format::testgen::hybrid::{self, HybridPreset, HYBRID_PRESET_NAMES};
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets, PRESET_NAMES};

const USAGE: &str = "usage: gen_model --preset NAME --out DIR [--seed N] [--tokenizer DIR] \
                     [--formats mlx,q2_0,pq2_0,ptq1_0,tq2_0,tq1_0,f16] (hybrid presets: mlx and ternary GGUF types; bitnet presets: hf and ternary GGUF types)";

fn run() -> Result<(), String> {
    let mut preset = None;
    let mut out = None;
    let mut seed = 0u64;
    let mut tokenizer = TokenizerAssets::Placeholder;
    let mut formats = "mlx,q2_0,pq2_0,ptq1_0,tq2_0,tq1_0,f16".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--preset" => preset = Some(value()?),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--tokenizer" => tokenizer = TokenizerAssets::Dir(PathBuf::from(value()?)),
            "--formats" => formats = value()?,
            "-h" | "--help" => {
                println!(
                    "{USAGE}\npresets: {}, {}",
                    PRESET_NAMES.join(", "),
                    HYBRID_PRESET_NAMES.join(", ")
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    let name = preset.ok_or(USAGE)?;
    let out = out.ok_or(USAGE)?;
    let formats = formats
        .split(',')
        .filter(|s| !s.is_empty())
        .map(OutFormat::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if HYBRID_PRESET_NAMES.contains(&name.as_str()) {
        // Hybrid presets write their own set of files (see testgen::hybrid).
        let p = HybridPreset::by_name(&name).map_err(|e| e.to_string())?;
        let start = Instant::now();
        hybrid::generate(&p, seed, &out, &formats, &tokenizer).map_err(|e| e.to_string())?;
        eprintln!(
            "wrote hybrid preset {name} seed {seed} to {} in {:.2} s",
            out.display(),
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let preset = Preset::by_name(&name).map_err(|e| e.to_string())?;
    let start = Instant::now();
    generate(&preset, seed, &out, &formats, &tokenizer).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote preset {} seed {seed} ({} formats) to {} in {:.2} s",
        preset.name,
        formats.len(),
        out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gen_model: {e}");
        std::process::exit(1);
    }
}
