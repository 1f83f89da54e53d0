//! `trit convert IN OUT --to FORMAT`: lossless repacks between ternary formats (refusing lossy
//! ones unless `--allow-lossy`), or `--quantize` a full-precision model (optionally with a LoRA
//! adapter fused in first). A progress bar on stderr when it is a terminal; `--json` prints
//! the report as one JSON object on stdout.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use trit::convert::quantize::{quantize, QuantizeOptions, DEFAULT_GROUP};
use trit::convert::{convert, ConvertOptions, ConvertReport, Target};
use trit::model::lora::LoraAdapter;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source: a .gguf file, an MLX 2-bit folder, an unpacked FP16/BF16 folder (or, with
    /// --quantize, a full-precision Hugging Face safetensors folder).
    pub input: PathBuf,
    /// Destination: a .gguf file for gguf-* targets, a folder for mlx.
    pub output: PathBuf,
    /// Target format: gguf-pq2, gguf-ptq1, gguf-tq2, gguf-tq1, gguf-q2 or mlx.
    #[arg(long)]
    pub to: String,
    /// Convert even when the target can not hold the source exactly, and report the error.
    #[arg(long)]
    pub allow_lossy: bool,
    /// Ternarize a full-precision model by per-group absmean (post-training quantization:
    /// expect a large quality loss without quantization-aware training).
    #[arg(long)]
    pub quantize: bool,
    /// Inputs per scale for --quantize (raised to the target's group: 256 for TQ formats).
    #[arg(long, default_value_t = DEFAULT_GROUP)]
    pub group: usize,
    /// With --quantize: a LoRA adapter folder fused into the weights before ternarizing.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// No progress bar and no summary (errors still go to stderr).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let target = Target::parse(&a.to)?;
    if a.adapter.is_some() && !a.quantize {
        anyhow::bail!(
            "--adapter in convert fuses an adapter while quantizing (--quantize); to run a \
             ternary model with an adapter, pass --adapter to run/chat/perplexity/serve"
        );
    }
    let bar = (!a.quiet && !a.json && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} tensors {msg}")
                .expect("valid template"),
        );
        b
    });
    let mut progress = |done: usize, total: usize, name: &str| {
        if let Some(b) = &bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
            b.set_message(name.to_string());
        }
    };
    let start = std::time::Instant::now();
    let report = if a.quantize {
        let adapter = match &a.adapter {
            Some(p) => Some(
                LoraAdapter::load(p).with_context(|| format!("loading adapter {}", p.display()))?,
            ),
            None => None,
        };
        let opts = QuantizeOptions {
            target,
            group: a.group,
        };
        quantize(&a.input, &a.output, &opts, adapter.as_ref(), &mut progress)
    } else {
        let opts = ConvertOptions {
            target,
            allow_lossy: a.allow_lossy,
        };
        convert(&a.input, &a.output, &opts, &mut progress)
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report.with_context(|| format!("converting {}", a.input.display()))?;
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{}", report_json(&report, &a, secs));
    } else if !a.quiet {
        print_summary(&report, &a, secs);
    }
    Ok(())
}

fn report_json(r: &ConvertReport, a: &ConvertArgs, secs: f64) -> serde_json::Value {
    let tensors: Vec<_> = r
        .tensors
        .iter()
        .map(|t| {
            let mut v = json!({"name": t.name, "shape": t.shape, "from": t.from, "to": t.to});
            if let Some(e) = &t.error {
                v["error"] = json!({
                    "lossy_blocks": e.lossy_blocks, "blocks": e.blocks,
                    "max_rel": e.max_rel, "mean_rel": e.mean_rel, "rel_fro": e.rel_fro,
                });
            }
            v
        })
        .collect();
    json!({
        "input": a.input, "output": a.output, "source_format": r.source_format,
        "target": r.target, "quantized": a.quantize, "lossy": r.lossy,
        "bytes_written": r.bytes_written, "seconds": secs, "tensors": tensors,
    })
}

fn print_summary(r: &ConvertReport, a: &ConvertArgs, secs: f64) {
    let ternary = r.tensors.iter().filter(|t| t.error.is_some()).count();
    eprintln!(
        "{} ({}) → {} ({}): {} tensors, {} ternary, {:.1} MB in {secs:.1} s",
        a.input.display(),
        r.source_format,
        a.output.display(),
        r.target,
        r.tensors.len(),
        ternary,
        r.bytes_written as f64 / 1e6
    );
    let changed: Vec<_> = r
        .tensors
        .iter()
        .filter(|t| {
            t.error
                .as_ref()
                .is_some_and(|e| a.quantize || e.lossy_blocks > 0)
        })
        .collect();
    if changed.is_empty() {
        eprintln!("lossless: every tensor decodes to exactly the source values");
        return;
    }
    if a.quantize {
        eprintln!(
            "post-training absmean quantization (expect quality loss without QAT); \
             relative error per tensor:"
        );
    } else {
        eprintln!("LOSSY conversion (--allow-lossy); error introduced per tensor:");
    }
    let first = if a.quantize { "groups" } else { "lossy blocks" };
    eprintln!(
        "  {:<32} {:>12} {:>10} {:>10} {:>10}",
        "tensor", first, "max rel", "mean rel", "‖ΔW‖/‖W‖"
    );
    for t in changed {
        let e = t.error.as_ref().expect("filtered");
        let count = if a.quantize {
            e.blocks.to_string()
        } else {
            format!("{}/{}", e.lossy_blocks, e.blocks)
        };
        eprintln!(
            "  {:<32} {:>12} {:>10.4} {:>10.4} {:>10.4}",
            t.name, count, e.max_rel, e.mean_rel, e.rel_fro
        );
    }
}
