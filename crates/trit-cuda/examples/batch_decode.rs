//! Aggregate decode speed of the GPU's batched path at several batch sizes, next to the
//! single-sequence path (CUDA graph) measured in the same process on the same model:
//!
//!     batch_decode MODEL [--batches 1,8,32] [--steps 128] [--prompt 16] [--rows full,top]
//!                        [--sample]
//!
//! Each sequence reads a `--prompt`-token prompt, then every timed step feeds one token to
//! every sequence (all B in one call) and brings each sequence's row back to the host, as the
//! server's scheduler does: `--rows full` copies the B rows of logits (`forward_batch`),
//! `--rows top` reduces them on the GPU to the 64 best candidates and the normalizer and
//! copies those (`forward_batch_top`, what the scheduler asks for when the sampler allows).
//! With `--sample` each step also samples every row on the host (the server's default
//! settings: temperature 0.7, top-k 20, top-p 0.8), as the scheduler does after the forward.
//! Tokens are pseudo-random (the speed does not depend on them). Prints one line per
//! configuration: tokens/s over all sequences and ms per step.

use std::time::Instant;
use trit::model::{BatchSeq, KvCache, Logits};
use trit::sample::{RowLogits, Sampler, SamplingParams, TOP_CANDIDATES};
use trit_cuda::{load_model, CudaOptions};

fn ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let (mut batches, mut steps, mut prompt) = (vec![1usize, 8, 32], 128usize, 16usize);
    let (mut modes, mut sample) = (vec!["full".to_string(), "top".to_string()], false);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--batches" => {
                batches = val()?
                    .split(',')
                    .map(|v| v.parse())
                    .collect::<Result<_, _>>()?
            }
            "--steps" => steps = val()?.parse()?,
            "--prompt" => prompt = val()?.parse()?,
            "--rows" => modes = val()?.split(',').map(str::to_string).collect(),
            "--sample" => sample = true,
            _ if path.is_none() => path = Some(a),
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    let path = path.ok_or("usage: batch_decode MODEL [--batches 1,8,32] [--steps N]")?;
    let files = trit::format::open(std::path::Path::new(&path))?;
    let vocab = files.config.vocab;
    let warm = 4;
    let ctx = prompt + warm + steps + 1;
    let model = load_model(&files, &CudaOptions::new(ctx))?;
    println!("model {path}, prompt {prompt}, {steps} timed steps");

    // The single-sequence path: prompt, then one token per step (the CUDA graph).
    let mut c = model.new_cache(ctx);
    model.forward(&ids(prompt, vocab, 1), &mut c, Logits::Last)?;
    let toks = ids(warm + steps, vocab, 2);
    for &t in &toks[..warm] {
        model.forward(&[t], &mut c, Logits::Last)?;
    }
    let mut single_sampler = Sampler::new(SamplingParams::default())?;
    let t0 = Instant::now();
    for &t in &toks[warm..] {
        let mut l = model.forward(&[t], &mut c, Logits::Last)?;
        if sample {
            single_sampler.sample(&mut l, &[]);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let single = steps as f64 / secs;
    println!(
        "single path (graph)   B=1   {single:8.1} tok/s  {:7.3} ms/step{}",
        1e3 * secs / steps as f64,
        if sample { " (with sampling)" } else { "" }
    );
    drop(c);

    if let Some(m) = modes.iter().find(|m| *m != "full" && *m != "top") {
        return Err(format!("--rows takes full and/or top, not {m}").into());
    }
    for (&b, mode) in batches
        .iter()
        .flat_map(|b| modes.iter().map(move |m| (b, m)))
    {
        let top = mode == "top";
        let mut samplers: Vec<Sampler> = (0..b)
            .map(|i| {
                Sampler::new(SamplingParams {
                    seed: i as u64,
                    ..SamplingParams::default()
                })
            })
            .collect::<Result<_, _>>()?;
        let mut caches: Vec<KvCache> = (0..b).map(|_| model.new_cache(ctx)).collect();
        let prompts: Vec<Vec<u32>> = (0..b).map(|i| ids(prompt, vocab, 10 + i as u64)).collect();
        let feeds: Vec<Vec<u32>> = (0..b)
            .map(|i| ids(warm + steps, vocab, 99 + i as u64))
            .collect();
        let mut run = |caches: &mut [KvCache], step: Option<usize>| -> trit::Result<()> {
            let mut batch: Vec<BatchSeq<'_>> = caches
                .iter_mut()
                .enumerate()
                .map(|(i, c)| BatchSeq {
                    tokens: match step {
                        None => &prompts[i][..],
                        Some(k) => &feeds[i][k..k + 1],
                    },
                    cache: c,
                    logits: Logits::Last,
                })
                .collect();
            let rows = if top && step.is_some() {
                model.forward_batch_top(&mut batch, TOP_CANDIDATES, &vec![true; b])?
            } else {
                let rows = model.forward_batch(&mut batch)?;
                rows.into_iter().map(RowLogits::Full).collect()
            };
            if sample {
                for (row, s) in rows.into_iter().zip(&mut samplers) {
                    match row {
                        RowLogits::Full(mut l) => s.sample(&mut l, &[]),
                        RowLogits::Top(t) => s.sample_top(&t),
                    };
                }
            }
            Ok(())
        };
        run(&mut caches, None)?;
        for k in 0..warm {
            run(&mut caches, Some(k))?;
        }
        let t0 = Instant::now();
        for k in warm..warm + steps {
            run(&mut caches, Some(k))?;
        }
        let secs = t0.elapsed().as_secs_f64();
        let agg = (b * steps) as f64 / secs;
        println!(
            "batched path, {mode:<4}  B={b:<3} {agg:8.1} tok/s  {:7.3} ms/step  {:5.2}x single{}",
            1e3 * secs / steps as f64,
            agg / single,
            if sample { " (with sampling)" } else { "" }
        );
    }
    Ok(())
}
