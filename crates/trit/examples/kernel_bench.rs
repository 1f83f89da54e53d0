//! Ternary kernel throughput.
//!
//! `cargo run --release -p trit --example kernel_bench -- [--threads N] [--level L] [--quick]`
//! (`--step [--rounds R] [--rows 1,8]`: only the 1.7B decode step, levels and row counts
//! alternating round by round; `--n N`: tokens of the multi-row column, default 64;
//! `--no-small-m`: 2..=16 rows through the prefill GEMM instead of the small-M kernels;
//! `--scale-group G`: one weight scale per G blocks of 64 columns (default 1);
//! `--cpu-time`: time on-CPU seconds of the calling thread, for `--threads 1` on a busy machine)
//!
//! Prints, per kernel level:
//! - decode (n = 1) GB/s of repacked weight bytes for 2048×2048, 6144×2048, 2048×6144 and
//!   151936×2048, both "hot" (one matrix repeated, cache-resident when small) and "cold" (a ring of
//!   copies larger than the last-level cache, as in a real decode step);
//! - prefill (n = 64) G ternary MAC/s for the same shapes;
//! - a full decode step of a Ternary-Bonsai-1.7B-shaped model (28 × q,k,v,o,gate,up,down + tied
//!   151936×2048 head): matmul-only tok/s and effective GB/s;
//! - a plain memory-read baseline with the same threads (the bandwidth ceiling).

use std::time::Instant;
use trit::kernels::{self, ActQ8, KernelLevel, TernaryMatrix};
use trit::quant::TernaryRows;
use trit::threadpool::{default_threads, ThreadPool};

struct Random {
    rows: usize,
    cols: usize,
    seed: u64,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl TernaryRows for Random {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        let mut s = mix(self.seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for c in codes.iter_mut() {
            s = mix(s.wrapping_add(1));
            *c = (s % 3) as u8;
        }
        // Multiples of 2^-10: exact in f16, like the scales of every real ternary file.
        let group = SCALE_GROUP.load(std::sync::atomic::Ordering::Relaxed);
        for (i, sc) in scales.iter_mut().enumerate() {
            *sc = (10 + (i / group + r) % 7) as f32 / 1024.0;
        }
    }
}

/// 64-column blocks per weight scale of the random matrices (`--scale-group`: 1 as Q2_0, 2 as
/// PQ2_0, 4 as TQ2_0/TQ1_0).
static SCALE_GROUP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

fn matrix(rows: usize, cols: usize, seed: u64) -> TernaryMatrix {
    TernaryMatrix::from_rows(&Random { rows, cols, seed }).expect("repack")
}

fn input(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((mix(i as u64) >> 40) as f32 / 16777216.0) - 0.5)
        .collect()
}

/// Whether `time_per_call` counts this thread's on-CPU time instead of wall time
/// (`--cpu-time`, meaningful with `--threads 1`: on a shared machine it leaves out the time
/// other processes held the core).
static CPU_TIME: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Seconds this thread has run on a CPU (Linux schedstat), or wall time with `--cpu-time` off.
fn now_s(wall: Instant) -> f64 {
    if CPU_TIME.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(ns) = std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            return ns as f64 / 1e9;
        }
    }
    wall.elapsed().as_secs_f64()
}

/// Runs `f` until `min_s` seconds have passed (after one warm-up call); seconds per call.
fn time_per_call(min_s: f64, mut f: impl FnMut()) -> f64 {
    f();
    let wall = Instant::now();
    let start = now_s(wall);
    let mut calls = 0u64;
    while now_s(wall) - start < min_s || calls < 3 {
        f();
        calls += 1;
    }
    (now_s(wall) - start) / calls as f64
}

fn memory_read_gbs(pool: &ThreadPool, min_s: f64) -> f64 {
    let buf: Vec<u64> = (0..(256usize << 20) / 8).map(|i| i as u64).collect();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let t = time_per_call(min_s, || {
        pool.run(&|i, n| {
            let part = &buf[buf.len() * i / n..buf.len() * (i + 1) / n];
            let mut acc = [0u64; 8];
            for c in part.chunks_exact(8) {
                for k in 0..8 {
                    acc[k] ^= c[k];
                }
            }
            sink.fetch_xor(
                acc.iter().fold(0, |a, &b| a ^ b),
                std::sync::atomic::Ordering::Relaxed,
            );
        })
    });
    (buf.len() * 8) as f64 / t / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let threads = arg("--threads")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(default_threads);
    let quick = args.iter().any(|a| a == "--quick");
    let levels: Vec<KernelLevel> = match arg("--level") {
        Some(l) => vec![KernelLevel::parse(&l).expect("unknown level")],
        None => KernelLevel::available()
            .into_iter()
            .filter(|&l| l != KernelLevel::Reference)
            .collect(),
    };
    let min_s = if quick { 0.3 } else { 1.0 };
    let multi: usize = arg("--n").map(|v| v.parse().expect("--n")).unwrap_or(64);
    let pool = ThreadPool::new(threads);
    if let Some(g) = arg("--scale-group") {
        let g: usize = g.parse().expect("--scale-group");
        SCALE_GROUP.store(g.max(1), std::sync::atomic::Ordering::Relaxed);
    }
    if args.iter().any(|a| a == "--cpu-time") {
        CPU_TIME.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if args.iter().any(|a| a == "--no-small-m") {
        // The shape table's multi-row column through the prefill GEMM instead.
        kernels::set_small_m_enabled(false);
    }
    println!("threads: {threads}, best level: {}", kernels::best_level());
    if args.iter().any(|a| a == "--step") {
        let rounds = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(5);
        let rows: Vec<usize> = arg("--rows")
            .map(|v| v.split(',').map(|r| r.parse().expect("--rows")).collect())
            .unwrap_or_else(|| vec![1]);
        return step_bench(&pool, &levels, &matrix(151936, 2048, 3), rounds, &rows);
    }
    println!(
        "memory read baseline: {:.1} GB/s",
        memory_read_gbs(&pool, min_s)
    );

    let shapes: Vec<(usize, usize)> = match arg("--shapes") {
        // e.g. `--shapes 512x2048,2048x2048`
        Some(list) => list
            .split(',')
            .map(|s| {
                let (r, c) = s.split_once('x').expect("RxC");
                (r.parse().expect("rows"), c.parse().expect("cols"))
            })
            .collect(),
        None => vec![(2048, 2048), (6144, 2048), (2048, 6144), (151936, 2048)],
    };
    let mats: Vec<TernaryMatrix> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(r, c))| matrix(r, c, i as u64))
        .collect();
    // Rings of copies larger than the last-level cache (>= 160 MB each; the head is one copy).
    let rings: Vec<Vec<TernaryMatrix>> = shapes
        .iter()
        .zip(&mats)
        .enumerate()
        .map(|(i, (&(r, c), m))| {
            let copies = (160_000_000usize).div_ceil(m.bytes()).max(1);
            let copies = if copies == 1 { 0 } else { copies };
            (0..copies)
                .map(|k| matrix(r, c, (i * 100 + k) as u64))
                .collect()
        })
        .collect();

    for &level in &levels {
        println!("\n== level {level} ==");
        println!(
            "{:>14} {:>10} {:>10} {:>12} {:>14} {:>14}",
            "shape",
            "hot GB/s",
            "cold GB/s",
            "decode µs",
            format!("n={multi} GMAC/s"),
            "cold GMAC/s"
        );
        for ((&(r, c), m), ring) in shapes.iter().zip(&mats).zip(&rings) {
            let x1 = input(1, c);
            let xq1 = ActQ8::quantize(&x1, 1, c);
            let mut y = vec![0f32; multi.max(1) * r];
            let hot = time_per_call(min_s, || m.matmul_q8_at(level, &pool, &xq1, &mut y));
            let cold = if ring.is_empty() {
                hot
            } else {
                let mut k = 0;
                time_per_call(min_s, || {
                    ring[k % ring.len()].matmul_q8_at(level, &pool, &xq1, &mut y);
                    k += 1;
                })
            };
            let x64 = input(multi, c);
            let xq64 = ActQ8::quantize(&x64, multi, c);
            let pmin = if r * c > 100_000_000 {
                min_s.min(0.5)
            } else {
                min_s
            };
            let pre = time_per_call(pmin, || m.matmul_q8_at(level, &pool, &xq64, &mut y));
            let pre_cold = if ring.is_empty() {
                pre
            } else {
                let mut k = 0;
                time_per_call(pmin, || {
                    ring[k % ring.len()].matmul_q8_at(level, &pool, &xq64, &mut y);
                    k += 1;
                })
            };
            println!(
                "{:>14} {:>10.1} {:>10.1} {:>12.1} {:>14.1} {:>14.1}",
                format!("{r}x{c}"),
                m.bytes() as f64 / hot / 1e9,
                m.bytes() as f64 / cold / 1e9,
                cold * 1e6,
                (multi * r * c) as f64 / pre / 1e9,
                (multi * r * c) as f64 / pre_cold / 1e9
            );
        }
    }

    if quick {
        return;
    }
    step_bench(&pool, &levels, &matrix(151936, 2048, 3), 5, &[1]);
}

/// One decode step of the 1.7B shape for `rows` tokens at once (1 = decode, 8 = eight batched
/// sequences), matmuls only with activations quantized once per input like the model does.
/// Levels and row counts alternate round by round so background load hits them alike; best
/// and median are printed.
fn step_bench(
    pool: &ThreadPool,
    levels: &[KernelLevel],
    head: &TernaryMatrix,
    rounds: usize,
    rows: &[usize],
) {
    println!("\nbuilding a 1.7B-shaped model (28 layers + tied head)...");
    let layer_shapes = [
        (2048, 2048),
        (1024, 2048),
        (1024, 2048),
        (2048, 2048),
        (6144, 2048),
        (6144, 2048),
        (2048, 6144),
    ];
    let layers: Vec<Vec<TernaryMatrix>> = (0..28)
        .map(|l| {
            layer_shapes
                .iter()
                .enumerate()
                .map(|(k, &(r, c))| matrix(r, c, 1000 + (l * 10 + k) as u64))
                .collect()
        })
        .collect();
    let total: usize = layers.iter().flatten().map(|m| m.bytes()).sum::<usize>() + head.bytes();
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let mut y = vec![0f32; 151936 * max_rows];
    let inputs: Vec<(ActQ8, ActQ8)> = rows
        .iter()
        .map(|&n| {
            (
                ActQ8::quantize(&input(n, 2048), n, 2048),
                ActQ8::quantize(&input(n, 6144), n, 6144),
            )
        })
        .collect();
    // Multi-row cases twice: small-M path on and off (the prefill GEMM), side by side.
    let cases: Vec<(KernelLevel, usize, bool)> = levels
        .iter()
        .flat_map(|&l| {
            (0..rows.len()).flat_map(move |i| {
                let offs: &[bool] = if rows[i] > 1 { &[true, false] } else { &[true] };
                offs.iter().map(move |&on| (l, i, on))
            })
        })
        .collect();
    let mut times = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (ci, &(level, ri, small)) in cases.iter().enumerate() {
            kernels::set_small_m_enabled(small);
            let (x2, x6) = &inputs[ri];
            let t = time_per_call(1.0, || {
                for layer in &layers {
                    for m in layer {
                        let xq = if m.cols() == 2048 { x2 } else { x6 };
                        m.matmul_q8_at(level, pool, xq, &mut y);
                    }
                }
                head.matmul_q8_at(level, pool, x2, &mut y);
            });
            times[ci].push(t);
        }
    }
    kernels::set_small_m_enabled(true);
    for (ci, &(level, ri, small)) in cases.iter().enumerate() {
        let n = rows[ri];
        let path = match (n, small) {
            (1, _) => "matvec",
            (_, true) => "small-M",
            _ => "prefill GEMM",
        };
        let mut t = times[ci].clone();
        t.sort_by(f64::total_cmp);
        let (best, med) = (t[0], t[t.len() / 2]);
        println!(
            "1.7B step, {n} row(s), {level} {path}: best {:.2} ms = {:.1} tok/s = {:.1} GB/s; median {:.2} ms = {:.1} tok/s ({:.0} MB of weights, matmuls only)",
            best * 1e3,
            n as f64 / best,
            total as f64 / best / 1e9,
            med * 1e3,
            n as f64 / med,
            total as f64 / 1e6
        );
    }
}
