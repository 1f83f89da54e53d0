//! Host cost of sampling from a full row of logits (what a device backend's full-row fall-back
//! and the single-sequence path pay per token), side by side in one run:
//!
//!     sample_speed [--vocab 151936] [--k 20] [--reps 500]
//!
//! Prints the time per row of (1) the top-k selection as the sampler did it before (collect
//! the finite entries, select over all of them, sort the k), (2) `top_k_indices` (one pass
//! with a small buffer above a running floor), which must give the same ids, and (3) a whole
//! `Sampler::sample` with the default settings (temperature 0.7, top-k, top-p 0.8).

use std::time::Instant;
use trit::sample::candidates::top_k_indices;
use trit::sample::{rng::Rng, Sampler, SamplingParams};

fn select_over_all(row: &[f32], k: usize) -> Vec<u32> {
    let rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut cand: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let k = k.min(cand.len());
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, rank);
        cand.truncate(k);
    }
    cand.sort_by(rank);
    cand.into_iter().map(|c| c.0).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut vocab, mut k, mut reps) = (151_936usize, 20usize, 500usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v: usize = args.next().ok_or(format!("{a} needs a value"))?.parse()?;
        match a.as_str() {
            "--vocab" => vocab = v,
            "--k" => k = v,
            "--reps" => reps = v,
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    let mut rng = Rng::new(1);
    let row: Vec<f32> = (0..vocab)
        .map(|_| (rng.next_f64() * 30.0 - 15.0) as f32)
        .collect();
    let time = |f: &mut dyn FnMut() -> u32| {
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..reps {
            acc += f() as u64;
        }
        (1e3 * t.elapsed().as_secs_f64() / reps as f64, acc)
    };
    if select_over_all(&row, k) != top_k_indices(&row, k, true) {
        return Err("the two selections differ".into());
    }
    let (old, _) = time(&mut || select_over_all(&row, k)[0]);
    let (new, _) = time(&mut || top_k_indices(&row, k, true)[0]);
    let params = SamplingParams {
        top_k: k,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(params)?;
    let (whole, _) = time(&mut || s.sample(&mut row.clone(), &[]));
    println!(
        "vocab {vocab}, top-k {k}: select over all {old:.3} ms, one pass {new:.3} ms ({:.1}x), \
         whole sample {whole:.3} ms",
        old / new
    );
    Ok(())
}
