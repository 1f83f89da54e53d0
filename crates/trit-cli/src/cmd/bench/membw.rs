//! `--membw`: this machine's memory read bandwidth with a given number of threads, on the same
//! kind of persistent pool the kernels run on.
//!
//! Decode at batch 1 reads every weight once per token, so `bandwidth / bytes per token` is the
//! ceiling a decoder can approach. The buffer (1 GiB by default) is far larger than any cache,
//! every page is written first (an untouched allocation maps to one shared zero page and would
//! read from cache), and each thread streams its contiguous share with independent accumulators
//! so enough memory requests are in flight. Several passes; best and median reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use trit::kernels::DenseMatrix;
use trit::threadpool::ThreadPool;

#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub threads: usize,
    pub buffer_bytes: usize,
    /// GB/s (10^9 bytes) of each pass of the faster method.
    pub passes_gbs: Vec<f64>,
    /// The faster method, in words.
    pub method: String,
    /// Best GB/s of the other method (a cross-check).
    pub other_best_gbs: f64,
}

impl Bandwidth {
    pub fn best_gbs(&self) -> f64 {
        self.passes_gbs.iter().copied().fold(0.0, f64::max)
    }

    pub fn median_gbs(&self) -> f64 {
        let mut v = self.passes_gbs.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            0.0
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
}

/// Independent accumulators per thread: 16 × 8 bytes = two 64-byte cache lines per iteration,
/// so loads of consecutive lines are not serialized behind one dependency chain.
const LANES: usize = 16;

fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; LANES];
    let mut chunks = words.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |s, &w| s.wrapping_add(w));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

fn part(total: usize, i: usize, n: usize) -> std::ops::Range<usize> {
    (total * i / n)..(total * (i + 1) / n)
}

/// Columns of the matrix streamed by the wide-load measurement: a 64 KiB row, so the vector it
/// multiplies stays in L2 while the matrix streams from memory.
const MATRIX_COLS: usize = 16_384;

/// Measures `passes` full reads of a `bytes` buffer with `threads` threads, two ways, and keeps
/// the faster: the engine's own f32 matrix-vector product (`DenseMatrix` at the current kernel
/// level, i.e. 512-bit loads and FMAs on AVX-512), and a plain 64-bit sum in safe Rust (which
/// the compiler vectorizes only to the baseline ISA's 128-bit loads). On this project's Zen 5
/// VM the 128-bit loop read ~20 % less than 512-bit loads, so a ceiling from it alone would
/// flatter every engine measured against it.
pub fn measure(threads: usize, bytes: usize, passes: usize) -> Bandwidth {
    let threads = threads.max(1);
    let pool = ThreadPool::new(threads);
    let wide = measure_matvec(&pool, bytes, passes);
    let plain = measure_sum(&pool, bytes, passes);
    let best = |v: &Vec<f64>| v.iter().copied().fold(0.0, f64::max);
    let ((buffer_bytes, passes_gbs), other, method) = if best(&wide.1) >= best(&plain.1) {
        let level = trit::kernels::level();
        (
            wide,
            plain,
            format!("f32 matrix-vector product, {level} kernel"),
        )
    } else {
        (plain, wide, "u64 sum".to_string())
    };
    Bandwidth {
        threads,
        buffer_bytes,
        passes_gbs,
        method,
        other_best_gbs: best(&other.1),
    }
}

/// Fills `v` on `threads` threads (writing every page, so none is the shared zero page).
fn fill<T: Send>(v: &mut [T], threads: usize, f: impl Fn(usize) -> T + Sync) {
    let chunk = v.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|s| {
        for (ci, c) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (j, w) in c.iter_mut().enumerate() {
                    *w = f(ci * chunk + j);
                }
            });
        }
    });
}

fn time_passes(passes: usize, bytes: usize, mut pass: impl FnMut()) -> Vec<f64> {
    // One untimed pass wakes the workers and settles the clocks.
    pass();
    (0..passes)
        .map(|_| {
            let t0 = Instant::now();
            pass();
            bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
        })
        .collect()
}

fn measure_matvec(pool: &ThreadPool, bytes: usize, passes: usize) -> (usize, Vec<f64>) {
    let rows = (bytes / 4 / MATRIX_COLS).max(pool.n_threads());
    let mut data = vec![0f32; rows * MATRIX_COLS];
    fill(&mut data, pool.n_threads(), |i| (i % 7) as f32 * 0.125);
    let m = DenseMatrix::new(rows, MATRIX_COLS, data);
    let x = vec![0.5f32; MATRIX_COLS];
    let mut y = vec![0f32; rows];
    let gbs = time_passes(passes, m.bytes(), || m.matmul(pool, &x, 1, &mut y));
    std::hint::black_box(&y);
    (m.bytes(), gbs)
}

fn measure_sum(pool: &ThreadPool, bytes: usize, passes: usize) -> (usize, Vec<f64>) {
    let threads = pool.n_threads();
    let words = (bytes / 8).max(LANES * threads);
    let mut buf = vec![0u64; words];
    fill(&mut buf, threads, |i| i as u64 | 1);
    let sinks: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    let read = |i: usize, n: usize| {
        let s = sum_words(&buf[part(words, i, n)]);
        sinks[i].fetch_add(s, Ordering::Relaxed);
    };
    let gbs = time_passes(passes, words * 8, || pool.run(&read));
    // The sums must be observed, or the reads could be optimized away.
    let check = sinks
        .iter()
        .fold(0u64, |s, a| s ^ a.load(Ordering::Relaxed));
    std::hint::black_box(check);
    (words * 8, gbs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_covers_every_word_including_the_tail() {
        let v: Vec<u64> = (1..=37).collect();
        assert_eq!(sum_words(&v), 37 * 38 / 2);
        assert_eq!(sum_words(&[]), 0);
    }

    #[test]
    fn median_and_best() {
        let b = Bandwidth {
            threads: 1,
            buffer_bytes: 0,
            passes_gbs: vec![3.0, 1.0, 2.0, 10.0],
            method: String::new(),
            other_best_gbs: 0.0,
        };
        assert_eq!(b.best_gbs(), 10.0);
        assert_eq!(b.median_gbs(), 2.5);
    }
}
