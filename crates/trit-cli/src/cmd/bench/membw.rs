//! `--membw`: this machine's memory read bandwidth with a given number of threads, the same kind
//! of persistent pool the kernels run on.
//!
//! Decode at batch 1 reads every weight once per token, so `bandwidth / bytes per token` is the
//! ceiling a decoder can approach. The buffer (1 GiB by default) is far larger than any cache,
//! every page is written first (an untouched allocation maps to one shared zero page and would
//! read from cache), and each thread sums its contiguous half with many independent 64-bit
//! accumulators, which the compiler turns into wide vector loads and adds with enough memory
//! requests in flight to saturate the memory system. Several passes; best and median reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use trit::threadpool::ThreadPool;

#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub threads: usize,
    pub buffer_bytes: usize,
    /// GB/s (10^9 bytes) of each pass.
    pub passes_gbs: Vec<f64>,
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
    let tail = chunks.remainder().iter().fold(0u64, |s, &w| s.wrapping_add(w));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

fn part(total: usize, i: usize, n: usize) -> std::ops::Range<usize> {
    (total * i / n)..(total * (i + 1) / n)
}

/// Measures `passes` full reads of a `bytes` buffer with `threads` threads.
pub fn measure(threads: usize, bytes: usize, passes: usize) -> Bandwidth {
    let threads = threads.max(1);
    let words = (bytes / 8).max(LANES * threads);
    let mut buf = vec![0u64; words];
    // Write every page, in parallel (also faults the pages in before timing).
    std::thread::scope(|s| {
        let chunk = words.div_ceil(threads);
        for (ci, c) in buf.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (j, w) in c.iter_mut().enumerate() {
                    *w = (ci * chunk + j) as u64 | 1;
                }
            });
        }
    });
    let pool = ThreadPool::new(threads);
    let sinks: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    let read = |i: usize, n: usize| {
        let s = sum_words(&buf[part(words, i, n)]);
        sinks[i].fetch_add(s, Ordering::Relaxed);
    };
    // One untimed pass wakes the workers and settles the clocks.
    pool.run(&read);
    let passes_gbs = (0..passes)
        .map(|_| {
            let t0 = Instant::now();
            pool.run(&read);
            (words * 8) as f64 / t0.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    // The sums must be observed, or the reads could be optimized away.
    let check = sinks.iter().fold(0u64, |s, a| s ^ a.load(Ordering::Relaxed));
    std::hint::black_box(check);
    Bandwidth {
        threads,
        buffer_bytes: words * 8,
        passes_gbs,
    }
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
        };
        assert_eq!(b.best_gbs(), 10.0);
        assert_eq!(b.median_gbs(), 2.5);
    }
}
