//! `trit bench --format mlx`: mlx_lm.benchmark's trials and lines.

use super::{argmax, load, membw, report, single, thread_counts, Bench, BenchArgs};
use anyhow::{bail, Result};
use std::time::Instant;
use trit::model::Logits;

/// mlx_lm.benchmark: each trial prefills the prompt from an empty cache, then generates
/// `-g` tokens one at a time feeding back the argmax (its sampler at temperature 0).
pub(super) fn run_mlx(a: &BenchArgs, path: &std::path::Path) -> Result<()> {
    if a.output.is_some() || !a.pg.is_empty() || a.n_depth != "0" {
        bail!("-o, --pg and -d are llama-bench flags; --format mlx takes -p, -g, -b, -n");
    }
    let prompt = single("-p", a.n_prompt.as_deref().unwrap_or("512"))?;
    let gen = a.generation_tokens.unwrap_or(1024);
    let trials = match &a.n_gen {
        Some(s) => single("-n", s)?,
        None => a.repetitions.unwrap_or(5),
    };
    let batch = a.batch_size.unwrap_or(1);
    if batch != 1 {
        bail!("-b {batch}: only batch size 1 is supported");
    }
    if prompt == 0 || gen == 0 || trials == 0 {
        bail!("-p, -g and -n must be at least 1 in --format mlx");
    }
    let threads = thread_counts(a)?;
    let [n_threads] = threads[..] else {
        bail!("--format mlx takes one thread count");
    };
    let mut lb = load(path, n_threads, a, prompt + gen)?;
    if prompt + gen > lb.max_ctx {
        bail!(
            "-p {prompt} + -g {gen} exceeds the model's context of {} tokens",
            lb.max_ctx
        );
    }
    let trial = |b: &mut Bench| -> Result<report::MlxTrial> {
        let mut cache = b.model.new_cache(prompt + gen);
        let start = Instant::now();
        let mut logits = b.prefill(&mut cache, prompt)?;
        let prompt_secs = start.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 0..gen {
            let next = argmax(&logits);
            logits = b.model.forward(&[next], &mut cache, Logits::Last)?;
        }
        let gen_secs = t1.elapsed().as_secs_f64();
        Ok(report::MlxTrial {
            prompt_tps: prompt as f64 / prompt_secs,
            generation_tps: gen as f64 / gen_secs,
            peak_memory_gb: trit::engine::stats::peak_rss_bytes().unwrap_or(0) as f64 / 1e9,
            total_time: start.elapsed().as_secs_f64(),
        })
    };
    println!("Running warmup..");
    trial(&mut lb.bench)?;
    println!("Timing with prompt_tokens={prompt}, generation_tokens={gen}, batch_size={batch}.");
    let mut trials_out = Vec::new();
    for i in 0..trials {
        let t = trial(&mut lb.bench)?;
        report::mlx_trial_line(i + 1, &t);
        trials_out.push(t);
    }
    report::mlx_averages(&trials_out);
    if a.membw {
        let bw = membw::measure(n_threads, a.membw_mib << 20, a.membw_passes);
        let avg_gen = trials_out.iter().map(|t| t.generation_tps).sum::<f64>() / trials as f64;
        // Average KV depth of a generated token in these trials.
        let kv = lb.kv_bytes_per_position as f64 * (prompt as f64 + gen as f64 / 2.0);
        let per_token = lb.bench.model.bytes_per_token() as f64 + kv;
        report::membw_lines(&bw, per_token, Some(avg_gen));
    }
    Ok(())
}
