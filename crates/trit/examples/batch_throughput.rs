//! Aggregate decode throughput of N sequences decoding together (continuous batching) vs one,
//! measured two ways: raw batched forward steps (`Model::forward_batch`, one token per
//! sequence per step, like llama-batched-bench's S_TG), and end to end through the
//! `Scheduler` that `trit serve` uses (sampling, stop checks and events included).
//!
//! cargo run --release -p trit --example batch_throughput -- MODEL [-t THREADS] [--streams 1,8]
//!     [-n STEPS] [-d DEPTH] [-r REPS] [--profile] [-ctk f16|f32] [-ctv f16|f32]
//!
//! `-ctk`/`-ctv`: how the KV cache stores keys/values (default f16, as `trit`).
//! `--profile`: one more round per stream count with the per-op counters on, printed as ms per
//! step. The machine's load average and CPU pressure are printed before and after the runs.
//!
//! Token ids are random (seeded); each sequence first holds DEPTH tokens (untimed). The stream
//! counts are measured in turn, REPS rounds, so background load hits all of them alike; the
//! table shows the median and the best round (a shared machine only ever slows a run down).
//! The last columns time the raw steps by the calling thread's on-CPU time instead of wall
//! time: on a machine shared with other busy processes that is close to what the threads would
//! reach on cores of their own (see `raw_forward`).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use trit::engine::{GenerateOptions, Scheduler, SchedulerConfig, SeqEvent, SeqRequest};
use trit::model::{BatchSeq, KvType, KvTypes, Logits, Model};
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;

struct Args {
    model: String,
    threads: usize,
    streams: Vec<usize>,
    steps: usize,
    depth: usize,
    reps: usize,
    profile: bool,
    kv: KvTypes,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        model: String::new(),
        threads: trit::threadpool::default_threads(),
        streams: vec![1, 8],
        steps: 32,
        depth: 64,
        reps: 3,
        profile: false,
        kv: KvTypes::default(),
    };
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-t" => a.threads = value()?.parse().map_err(|e| format!("-t: {e}"))?,
            "-n" => a.steps = value()?.parse().map_err(|e| format!("-n: {e}"))?,
            "-d" => a.depth = value()?.parse().map_err(|e| format!("-d: {e}"))?,
            "--profile" => a.profile = true,
            "-r" => a.reps = value()?.parse().map_err(|e| format!("-r: {e}"))?,
            "-ctk" => a.kv.k = KvType::parse(&value()?).map_err(|e| e.to_string())?,
            "-ctv" => a.kv.v = KvType::parse(&value()?).map_err(|e| e.to_string())?,
            "--streams" => {
                a.streams = value()?
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--streams: {e}")))
                    .collect::<Result<_, _>>()?
            }
            _ if a.model.is_empty() => a.model = arg,
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    if a.model.is_empty() || a.streams.contains(&0) || a.depth == 0 || a.reps == 0 {
        return Err("usage: batch_throughput MODEL [-t N] [--streams 1,8] [-n STEPS] [-d DEPTH>0] [-r REPS]".into());
    }
    Ok(a)
}

fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// On-CPU seconds of the calling thread so far (Linux schedstat; 0 elsewhere).
fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0) as f64
        / 1e9
}

/// Tokens/s of all sequences together over `steps` batched single-token steps, by wall time
/// and by the calling thread's on-CPU time. The calling thread runs its share of every
/// parallel job plus everything serial, and waits (spinning, then parked) only for the pool,
/// so on cores of its own its on-CPU time is the wall time; on a machine shared with other
/// busy processes it leaves out the time they held the core.
/// With `profile`, the per-op counters cover exactly the timed steps.
fn raw_forward(
    model: &Model,
    streams: usize,
    steps: usize,
    depth: usize,
    profile: bool,
) -> (f64, f64) {
    let vocab = model.config().vocab;
    let mut caches: Vec<_> = (0..streams)
        .map(|_| model.new_cache(depth + steps + 1))
        .collect();
    for (i, c) in caches.iter_mut().enumerate() {
        model
            .forward(&random_tokens(i as u64, depth, vocab), c, Logits::Last)
            .unwrap();
    }
    let feeds: Vec<Vec<u32>> = (0..streams)
        .map(|i| random_tokens(100 + i as u64, steps + 1, vocab))
        .collect();
    let mut step = |s: usize| {
        let mut batch: Vec<BatchSeq<'_>> = caches
            .iter_mut()
            .zip(&feeds)
            .map(|(cache, f)| BatchSeq {
                tokens: &f[s..s + 1],
                cache,
                logits: Logits::Last,
            })
            .collect();
        model.forward_batch(&mut batch).unwrap();
    };
    step(0); // warm-up
    if profile {
        trit::profile::reset();
        trit::profile::set_enabled(true);
    }
    let (t0, cpu0) = (Instant::now(), thread_cpu_s());
    for s in 1..=steps {
        step(s);
    }
    trit::profile::set_enabled(false);
    let tokens = (streams * steps) as f64;
    let cpu = thread_cpu_s() - cpu0;
    (tokens / t0.elapsed().as_secs_f64(), tokens / cpu.max(1e-9))
}

/// The ceiling for comparison: tokens/s of forward calls that give ONE sequence `rows` new
/// tokens each (a prefill chunk: same matmul shapes as `rows` batched sequences, one head row).
fn one_sequence_rows(model: &Model, rows: usize, steps: usize, depth: usize) -> f64 {
    let vocab = model.config().vocab;
    let mut cache = model.new_cache(depth + (steps + 1) * rows);
    model
        .forward(&random_tokens(1, depth, vocab), &mut cache, Logits::Last)
        .unwrap();
    let feed = random_tokens(2, (steps + 1) * rows, vocab);
    let mut chunks = feed.chunks(rows);
    model
        .forward(chunks.next().unwrap(), &mut cache, Logits::Last)
        .unwrap();
    let t0 = Instant::now();
    for c in chunks {
        model.forward(c, &mut cache, Logits::Last).unwrap();
    }
    (steps * rows) as f64 / t0.elapsed().as_secs_f64()
}

/// Tokens/s through the scheduler: `streams` requests submitted at once, timed from the
/// first generated token of the last one to start until all are done.
fn scheduler(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    streams: usize,
    steps: usize,
    depth: usize,
) -> f64 {
    let vocab = model.config().vocab;
    let sched = Scheduler::start(
        model,
        tok,
        SchedulerConfig {
            n_ctx: depth + steps + 8,
            parallel: streams,
            max_queue: 0,
            kv_cache_bytes: 8 << 30, // a cap; blocks are allocated as used
            context_shift: None,
            draft: None,
        },
    )
    .expect("starting the scheduler");
    let (tx, rx) = mpsc::channel::<(usize, Instant, bool)>();
    for i in 0..streams {
        let tx = tx.clone();
        sched
            .submit(SeqRequest {
                prompt: random_tokens(i as u64, depth, vocab),
                options: GenerateOptions {
                    max_tokens: steps,
                    sampling: SamplingParams::greedy(),
                    stop: vec![],
                    eos: vec![],
                    constraint: None,
                },
                top_logprobs: None,
                keep: None,
                sink: Box::new(move |e| {
                    if matches!(e, SeqEvent::Prompt { .. }) {
                        return true; // prompt progress, not a token
                    }
                    let done = matches!(e, SeqEvent::Done(_));
                    tx.send((i, Instant::now(), done)).is_ok()
                }),
            })
            .unwrap();
    }
    drop(tx);
    // Only the steady state counts: from when every stream has its first token (the prompts
    // are read) to the end, the tokens produced in between.
    let events: Vec<(usize, Instant, bool)> = rx.iter().collect();
    let mut first = vec![None; streams];
    for &(i, at, done) in &events {
        if !done && first[i].is_none() {
            first[i] = Some(at);
        }
    }
    let start = first
        .iter()
        .flatten()
        .max()
        .copied()
        .unwrap_or_else(Instant::now);
    let end = events.iter().map(|e| e.1).max().unwrap_or(start);
    let tokens = events
        .iter()
        .filter(|&&(_, at, done)| !done && at > start)
        .count();
    tokens as f64 / (end - start).as_secs_f64().max(1e-9)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let files = trit::format::open(std::path::Path::new(&a.model))?;
    let tok = Arc::new(Tokenizer::from_source(&files.tokenizer)?);
    let model = Arc::new(Model::load(&files, a.threads)?.with_kv_types(a.kv)?);
    println!(
        "model {}, {} threads, depth {}, {} steps, {} rounds, KV cache K {} V {}",
        a.model, a.threads, a.depth, a.steps, a.reps, a.kv.k, a.kv.v
    );
    println!("before: {}", machine_load());
    // samples[i] = (raw, scheduler) tokens/s of each round for streams[i].
    let mut samples = vec![Vec::new(); a.streams.len()];
    for _ in 0..a.reps {
        for (i, &n) in a.streams.iter().enumerate() {
            let (raw, raw_cpu) = raw_forward(&model, n, a.steps, a.depth, false);
            let sch = scheduler(model.clone(), tok.clone(), n, a.steps, a.depth);
            let rows = one_sequence_rows(&model, n, a.steps, a.depth);
            samples[i].push((raw, sch, rows, raw_cpu));
        }
    }
    let stat = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    println!("| streams | forward_batch t/s median (best) | × vs first | scheduler t/s median (best) | × vs first | one sequence, same rows per call t/s | forward_batch t/s per on-CPU s of the calling thread median (best) | × vs first |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut base = None;
    for (n, s) in a.streams.iter().zip(&samples) {
        let raw = stat(&s.iter().map(|x| x.0).collect::<Vec<_>>());
        let sch = stat(&s.iter().map(|x| x.1).collect::<Vec<_>>());
        let rows = stat(&s.iter().map(|x| x.2).collect::<Vec<_>>());
        let cpu = stat(&s.iter().map(|x| x.3).collect::<Vec<_>>());
        let (b_raw, b_sch, b_cpu) = *base.get_or_insert((raw.0, sch.0, cpu.0));
        println!(
            "| {n} | {:.2} ({:.2}) | {:.2} | {:.2} ({:.2}) | {:.2} | {:.2} | {:.2} ({:.2}) | {:.2} |",
            raw.0,
            raw.1,
            raw.0 / b_raw,
            sch.0,
            sch.1,
            sch.0 / b_sch,
            rows.0,
            cpu.0,
            cpu.1,
            cpu.0 / b_cpu
        );
    }
    // Each round measures every stream count back to back, so per-round ratios share the
    // machine's state of that moment: their spread shows how much the load moved the result.
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        if a.streams.len() > 1 {
            let ratios: Vec<f64> = first.iter().zip(last).map(|(f, l)| l.0 / f.0).collect();
            let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "forward_batch {} vs {} streams, per round: {} (median {:.2})",
                a.streams[a.streams.len() - 1],
                a.streams[0],
                shown.join(", "),
                stat(&ratios).0
            );
        }
    }
    println!("after: {}", machine_load());
    if a.profile {
        profile_steps(&model, &a);
    }
    Ok(())
}

/// Load average and CPU pressure (Linux), to judge how much other processes disturbed a run.
fn machine_load() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let load = read("/proc/loadavg");
    let psi = read("/proc/pressure/cpu");
    let some = psi.lines().next().unwrap_or("").trim();
    format!("loadavg {} | cpu pressure {some}", load.trim())
}

/// `--profile`: where one batched step's time goes, per op: wall ms per step summed over the
/// probes of the timed steps (the probes sit on the calling thread, so a parallel op counts
/// its wall time, waiting for the other threads included).
fn profile_steps(model: &Model, a: &Args) {
    use trit::profile::{self, Op};
    let mut per = Vec::new();
    for &n in &a.streams {
        let (tps, _) = raw_forward(model, n, a.steps, a.depth, true);
        per.push((n, tps, profile::snapshot()));
    }
    println!("\nper-op wall ms per step, profile on (one extra round):");
    print!("| op |");
    for (n, _, _) in &per {
        print!(" {n} streams |");
    }
    println!();
    println!("| --- |{}", " ---: |".repeat(per.len()));
    let ms = |nanos: u64| nanos as f64 / 1e6 / a.steps as f64;
    for (i, op) in Op::ALL.iter().enumerate() {
        if per.iter().all(|(_, _, snap)| snap[i].calls == 0) {
            continue;
        }
        // The transformer times q/k/v and gate/up as one fused dispatch each, under q and gate.
        let name = match op {
            Op::MatQ => "matmul q+k+v",
            Op::MatGate => "matmul gate+up",
            _ => op.name(),
        };
        print!("| {name} |");
        for (_, _, snap) in &per {
            print!(" {:.3} |", ms(snap[i].nanos));
        }
        println!();
    }
    print!("| sum of ops |");
    for (_, _, snap) in &per {
        print!(" {:.3} |", ms(snap.iter().map(|t| t.nanos).sum()));
    }
    println!();
    print!("| whole step |");
    for (n, tps, _) in &per {
        print!(" {:.3} |", 1e3 * *n as f64 / tps);
    }
    println!();
}
