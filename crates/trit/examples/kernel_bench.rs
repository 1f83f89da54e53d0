//! Ternary kernel throughput.
//!
//! `cargo run --release -p trit --example kernel_bench -- [--threads N] [--level L] [--quick]`
//! (`--step [--rounds R]`: only the 1.7B decode step, levels alternating round by round)
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
        for (i, sc) in scales.iter_mut().enumerate() {
            *sc = (10 + (i + r) % 7) as f32 / 1024.0;
        }
    }
}

fn matrix(rows: usize, cols: usize, seed: u64) -> TernaryMatrix {
    TernaryMatrix::from_rows(&Random { rows, cols, seed }).expect("repack")
}

fn input(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((mix(i as u64) >> 40) as f32 / 16777216.0) - 0.5)
        .collect()
}

/// Runs `f` until `min_s` seconds have passed (after one warm-up call); seconds per call.
fn time_per_call(min_s: f64, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed().as_secs_f64() < min_s || calls < 3 {
        f();
        calls += 1;
    }
    start.elapsed().as_secs_f64() / calls as f64
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
    let pool = ThreadPool::new(threads);
    println!("threads: {threads}, best level: {}", kernels::best_level());
    if args.iter().any(|a| a == "--step") {
        let rounds = arg("--rounds").and_then(|v| v.parse().ok()).unwrap_or(5);
        return step_bench(&pool, &levels, &matrix(151936, 2048, 3), rounds);
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
            "{:>14} {:>10} {:>10} {:>12} {:>14}",
            "shape", "hot GB/s", "cold GB/s", "decode µs", "n=64 GMAC/s"
        );
        for ((&(r, c), m), ring) in shapes.iter().zip(&mats).zip(&rings) {
            let x1 = input(1, c);
            let xq1 = ActQ8::quantize(&x1, 1, c);
            let mut y = vec![0f32; 64 * r];
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
            let x64 = input(64, c);
            let xq64 = ActQ8::quantize(&x64, 64, c);
            let pmin = if r * c > 100_000_000 {
                min_s.min(0.5)
            } else {
                min_s
            };
            let pre = time_per_call(pmin, || m.matmul_q8_at(level, &pool, &xq64, &mut y));
            println!(
                "{:>14} {:>10.1} {:>10.1} {:>12.1} {:>14.1}",
                format!("{r}x{c}"),
                m.bytes() as f64 / hot / 1e9,
                m.bytes() as f64 / cold / 1e9,
                cold * 1e6,
                (64 * r * c) as f64 / pre / 1e9
            );
        }
    }

    if quick {
        return;
    }
    step_bench(&pool, &levels, &matrix(151936, 2048, 3), 5);
}

/// One decode step of the 1.7B shape, matmuls only (activation quantization included). Levels
/// alternate round by round so background load hits them alike; best and median are printed.
fn step_bench(pool: &ThreadPool, levels: &[KernelLevel], head: &TernaryMatrix, rounds: usize) {
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
    let x = input(1, 6144);
    let mut y = vec![0f32; 151936];
    let mut times = vec![Vec::new(); levels.len()];
    for _ in 0..rounds {
        for (li, &level) in levels.iter().enumerate() {
            let t = time_per_call(1.0, || {
                for layer in &layers {
                    for m in layer {
                        m.matmul_at(level, pool, &x[..m.cols()], 1, &mut y);
                    }
                }
                head.matmul_at(level, pool, &x[..2048], 1, &mut y);
            });
            times[li].push(t);
        }
    }
    for (li, &level) in levels.iter().enumerate() {
        let mut t = times[li].clone();
        t.sort_by(f64::total_cmp);
        let (best, med) = (t[0], t[t.len() / 2]);
        println!(
            "1.7B decode step, {level}: best {:.2} ms = {:.1} tok/s = {:.1} GB/s; median {:.2} ms = {:.1} tok/s ({:.0} MB of weights, matmuls only)",
            best * 1e3,
            1.0 / best,
            total as f64 / best / 1e9,
            med * 1e3,
            1.0 / med,
            total as f64 / 1e6
        );
    }
}
