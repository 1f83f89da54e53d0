//! CPU math: ternary and dense matrix products, activation quantization, elementwise ops, and the
//! persistent thread pool. The only place in the crate with `unsafe` (SIMD intrinsics, the pool's
//! lifetime erasure, disjoint writes from several threads into one output).
//!
//! # Ternary weight layout (`TernaryMatrix`)
//!
//! Rows are grouped into **tiles of 16 rows**; columns into **blocks of 64** (the scale group of
//! `TernaryRows`). For each tile the codes of all blocks are stored contiguously (one sequential
//! stream per tile), 256 bytes per block, followed in a separate array by 16 scales per block.
//! Within a block, byte `64·p + 4·j + i` (chunk `p` in 0..4, row `j` in 0..16, `i` in 0..4) holds
//! four 2-bit codes `q = t + 1`; its bit pair `s` (bits `2s..2s+2`) is the code of row `j`,
//! column `16·p + 4·s + i` of the block.
//!
//! Why this layout:
//! - One 64-byte load is 16 rows × 4 columns × 4 bit-pairs. Masking (or shifting) out bit pair
//!   `s` leaves a vector whose dword `j` holds row `j`'s codes for the 4 consecutive columns
//!   `16p+4s .. 16p+4s+4`, which is exactly the operand shape of `vpdpbusd` (u8×i8, 4 products
//!   summed into a dword) against those 4 activation bytes broadcast to every dword. Each dword
//!   lane accumulates one row, so a block ends with 16 row sums in one register: no horizontal
//!   reductions, no shuffles, and the 16 scales of the block apply with one vector multiply.
//! - Decode (one token) masks in place instead of shifting: `w & (3 << 2s)` is `4^s · q`, which
//!   still fits an unsigned byte; four accumulators (one per `s`) are recombined once per block
//!   with exact arithmetic shifts. That removes 12 of the 28 bit operations per block.
//! - Prefill shifts each bit pair down once and reuses the unpacked codes for up to 8 tokens
//!   (tile reuse): the weight tile (≤ 24 KiB for 6144 columns) stays in L1 across token groups
//!   and every weight byte is read from memory once per call.
//! - 2..=16 activation rows (batched decode) take the small-M path (`small_m.rs`): the rows are
//!   re-laid out once per quantization so one pointer feeds every row's broadcasts, and each
//!   block is unpacked once for all rows (AVX-512, AVX2 and portable variants).
//! - AVX2 uses the same bytes as two 8-row halves (`vpmaddubsw` + `vpmaddwd`, int16 partials
//!   summed over a whole block: 16 × 2 × 3 × 127 < 2^15, so no saturation); the portable kernel
//!   unpacks a block to bytes and uses plain integer loops that LLVM vectorizes (NEON included).
//! - Rows past the end of the matrix (last tile) hold code 1 (t = 0) with scale 0; their outputs
//!   are never written.
//! - Scales are stored as f16 when every scale of the matrix is exactly representable (all
//!   current ternary formats: 2.25 bits per weight in total), otherwise as f32, so dequantized
//!   weights are always exact.
//!
//! # Threading
//!
//! Matmuls split their row tiles into chunks (≤ 256 KiB of weights, ≥ 4 per thread) that the
//! persistent pool's threads claim with one atomic add each: every weight byte is read once per
//! call, each tile is computed entirely by one thread (results do not depend on the thread
//! count), and a thread that the OS deschedules delays only the chunk it holds. Within a chunk
//! the SIMD kernels prefetch 8 KiB ahead of the block being multiplied, which takes decode from
//! ~70 % to ~100 % of the measured memory bandwidth (see `ternary::PREFETCH_BYTES`). Small-M
//! matmuls (compute-bound) claim shrinking chunks instead (`for_each_chunk_guided`), and the
//! matrices that share one input (q/k/v, gate/up) can run as one job over all their tiles
//! (`Linear::forward_q8_fused`), so a batched decode step waits for the slower thread once per
//! group rather than once per matrix.
//!
//! # Integer arithmetic
//!
//! Activations are quantized per token and per 64 columns to int8 (`ActQ8`: scale `d = max|x| /
//! 127`, `x ≈ d·q`) with the block sum `Σq` precomputed. With weight `s·t`, `t = code − 1`:
//! `Σ t·x ≈ s·d·(Σ code·q − Σ q)`, so the kernels multiply the unsigned codes directly and apply
//! one correction per block. `KernelLevel::Reference` instead computes in f32 with the exact
//! dequantized weights and unquantized activations (ground truth for model tests).

mod act;
mod act_avx512;
pub mod attn;
mod attn_avx512;
mod avx2;
mod avx2_small;
mod avx512;
mod avx512_small;
pub mod delta_rule;
mod dense;
mod dense_half;
pub mod hadamard;
pub mod kv_type;
pub mod ops;
pub mod peak;
pub(crate) mod pool;
mod portable;
pub mod scalar;
mod small_m;
mod ternary;
#[cfg(test)]
mod ternary_tests;

pub use act::ActQ8;
pub use dense::DenseMatrix;
#[doc(hidden)]
pub use small_m::set_small_m_enabled;
pub use ternary::TernaryMatrix;
pub(crate) use ternary::TILE_ROWS;

use crate::threadpool::ThreadPool;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which implementation the matrix products use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelLevel {
    /// Exact f32 math on dequantized weights and unquantized activations.
    Reference,
    /// Int8 activations, plain integer loops (any CPU; auto-vectorized).
    Portable,
    /// Int8 activations, AVX2 `vpmaddubsw`/`vpmaddwd` (needs avx2, fma, f16c).
    Avx2,
    /// Int8 activations, AVX-512 VNNI `vpdpbusd` (needs avx512f, avx512bw, avx512vnni).
    Avx512,
}

impl KernelLevel {
    pub const ALL: [KernelLevel; 4] = [
        KernelLevel::Reference,
        KernelLevel::Portable,
        KernelLevel::Avx2,
        KernelLevel::Avx512,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelLevel::Reference => "reference",
            KernelLevel::Portable => "portable",
            KernelLevel::Avx2 => "avx2",
            KernelLevel::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Option<KernelLevel> {
        KernelLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run the level (AMX is never used, whatever CPUID says).
    pub fn supported(self) -> bool {
        match self {
            KernelLevel::Reference | KernelLevel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            KernelLevel::Avx2 | KernelLevel::Avx512 => false,
        }
    }

    /// The supported levels, slowest first.
    pub fn available() -> Vec<KernelLevel> {
        KernelLevel::ALL
            .into_iter()
            .filter(|l| l.supported())
            .collect()
    }

    fn to_u8(self) -> u8 {
        match self {
            KernelLevel::Reference => 0,
            KernelLevel::Portable => 1,
            KernelLevel::Avx2 => 2,
            KernelLevel::Avx512 => 3,
        }
    }

    fn from_u8(v: u8) -> KernelLevel {
        match v {
            0 => KernelLevel::Reference,
            1 => KernelLevel::Portable,
            2 => KernelLevel::Avx2,
            _ => KernelLevel::Avx512,
        }
    }

    /// `self` if supported, else the fastest supported level (used when a caller passes an
    /// explicit level, so an unsupported one can never reach unsupported instructions).
    pub(crate) fn or_supported(self) -> KernelLevel {
        if self.supported() {
            self
        } else {
            detected_best()
        }
    }
}

impl std::fmt::Display for KernelLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn detected_best() -> KernelLevel {
    if KernelLevel::Avx512.supported() {
        KernelLevel::Avx512
    } else if KernelLevel::Avx2.supported() {
        KernelLevel::Avx2
    } else {
        KernelLevel::Portable
    }
}

/// The fastest level this CPU supports, unless `TRIT_KERNEL=reference|portable|avx2|avx512`
/// asks for another (an unknown or unsupported value prints a warning and is ignored).
pub fn best_level() -> KernelLevel {
    let best = detected_best();
    match std::env::var("TRIT_KERNEL") {
        Ok(v) if !v.trim().is_empty() => match KernelLevel::parse(&v) {
            Some(l) if l.supported() => l,
            Some(l) => {
                eprintln!("trit: TRIT_KERNEL={v}: this CPU does not support {l}; using {best}");
                best
            }
            None => {
                eprintln!(
                    "trit: TRIT_KERNEL={v} is not one of reference, portable, avx2, avx512; using {best}"
                );
                best
            }
        },
        _ => best,
    }
}

const LEVEL_UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(LEVEL_UNSET);

/// The level used by `matmul`/`forward` (initialized from `best_level()` on first use).
pub fn level() -> KernelLevel {
    let v = LEVEL.load(Ordering::Relaxed);
    if v != LEVEL_UNSET {
        return KernelLevel::from_u8(v);
    }
    let l = best_level();
    LEVEL.store(l.to_u8(), Ordering::Relaxed);
    l
}

/// Selects the level for the whole process; fails if this CPU cannot run it.
pub fn set_level(l: KernelLevel) -> crate::Result<()> {
    if !l.supported() {
        return Err(crate::Error::Unsupported(format!(
            "kernel level {l} needs CPU features this machine lacks (available: {})",
            KernelLevel::available()
                .iter()
                .map(|l| l.name())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    LEVEL.store(l.to_u8(), Ordering::Relaxed);
    Ok(())
}

/// A linear layer's weights in whichever form the kernels have for them.
pub enum Linear {
    Ternary(TernaryMatrix),
    Dense(DenseMatrix),
}

impl Linear {
    pub fn rows(&self) -> usize {
        match self {
            Linear::Ternary(m) => m.rows(),
            Linear::Dense(m) => m.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Linear::Ternary(m) => m.cols(),
            Linear::Dense(m) => m.cols(),
        }
    }

    /// Bytes of weight storage.
    pub fn bytes(&self) -> usize {
        match self {
            Linear::Ternary(m) => m.bytes(),
            Linear::Dense(m) => m.bytes(),
        }
    }

    /// `y[t·rows + r] = Σ_k W[r][k] · x[t·cols + k]` for `t < n`.
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], n: usize, y: &mut [f32]) {
        match self {
            Linear::Ternary(m) => m.matmul(pool, x, n, y),
            Linear::Dense(m) => m.matmul(pool, x, n, y),
        }
    }

    /// `forward` on activations quantized once by the caller (one quantization shared by the
    /// q/k/v or gate/up matrices). `xq` must hold the exact rows when `needs_exact()`.
    pub fn forward_q8(&self, pool: &ThreadPool, xq: &ActQ8, y: &mut [f32]) {
        match self {
            Linear::Ternary(m) => m.matmul_q8(pool, xq, y),
            Linear::Dense(m) => {
                let x = xq
                    .exact()
                    .expect("a dense matrix needs activations quantized with keep_exact");
                m.matmul(pool, x, xq.n(), y)
            }
        }
    }

    /// `forward_q8` of several layers of one input width on the same activations (q/k/v,
    /// gate/up): one pool dispatch when all are ternary (see `TernaryMatrix::matmul_q8_fused`),
    /// otherwise one call each. Results are identical to separate `forward_q8` calls.
    pub fn forward_q8_fused(pool: &ThreadPool, xq: &ActQ8, parts: &mut [(&Linear, &mut [f32])]) {
        let mut ternary: Vec<(&TernaryMatrix, &mut [f32])> = Vec::with_capacity(parts.len());
        for (l, y) in parts.iter_mut() {
            match l {
                Linear::Ternary(m) => ternary.push((m, &mut **y)),
                Linear::Dense(_) => l.forward_q8(pool, xq, y),
            }
        }
        TernaryMatrix::matmul_q8_fused(pool, xq, &mut ternary);
    }

    /// Whether `forward_q8` reads the unquantized activations (dense weights, or the exact
    /// `Reference` level).
    pub fn needs_exact(&self) -> bool {
        match self {
            Linear::Ternary(_) => level() == KernelLevel::Reference,
            Linear::Dense(_) => true,
        }
    }

    /// Row `r` as f32 (`out.len() == cols`), e.g. for embedding lookups.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            Linear::Ternary(m) => m.dequantize_row(r, out),
            Linear::Dense(m) => m.dequantize_row(r, out),
        }
    }
}

/// Raw output pointer shared by the threads of one matmul. Each thread writes a disjoint set of
/// rows, for every token.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: used only to write disjoint elements from several threads while the owning `&mut [f32]`
// is borrowed by the matmul call that spawned them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub(crate) fn new(y: &mut [f32]) -> Self {
        OutPtr {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        }
    }

    /// Writes `vals` to `y[start..start + vals.len()]`.
    ///
    /// # Safety
    /// No other thread may access these elements during the matmul.
    #[inline]
    pub(crate) unsafe fn write(&self, start: usize, vals: &[f32]) {
        assert!(start + vals.len() <= self.len, "matmul output out of range");
        std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.add(start), vals.len());
    }
}

/// Runs `f` on chunks of `0..total` claimed dynamically by the pool's threads (each index is
/// visited exactly once). Dynamic claiming keeps a descheduled thread (shared or oversubscribed
/// machines) from stalling the whole call: it delays only the chunk it holds. `unit_bytes` is
/// the memory one index streams; chunks aim at ≤ 256 KiB and ≥ 4 chunks per thread.
pub(crate) fn for_each_chunk(
    pool: &ThreadPool,
    total: usize,
    unit_bytes: usize,
    f: &(dyn Fn(std::ops::Range<usize>) + Sync),
) {
    let threads = pool.n_threads();
    if threads == 1 {
        return f(0..total);
    }
    let by_bytes = (256 * 1024 / unit_bytes.max(1)).max(1);
    let by_count = (total / (4 * threads)).max(1);
    let chunk = by_bytes.min(by_count);
    let next = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= total {
            break;
        }
        f(start..(start + chunk).min(total));
    });
}

/// `for_each_chunk` for compute-bound work (small-M matmuls): each claim takes a
/// `1 / (2·threads)` share of what is left, but at least `min_chunk`, so chunks start large
/// (few claims) and shrink as the work runs out, and the threads finish within about one small
/// chunk of each other. With fixed chunks of ~10 µs (the memory-bound sizing above) a decode
/// step of 8 sequences lost about half a chunk per matmul, ~200 times per step.
pub(crate) fn for_each_chunk_guided(
    pool: &ThreadPool,
    total: usize,
    min_chunk: usize,
    f: &(dyn Fn(std::ops::Range<usize>) + Sync),
) {
    let threads = pool.n_threads();
    if threads == 1 {
        return f(0..total);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let mut start = next.load(Ordering::Relaxed);
        let end = loop {
            if start >= total {
                return;
            }
            let take = ((total - start) / (2 * threads)).max(min_chunk.max(1));
            let end = (start + take).min(total);
            match next.compare_exchange_weak(start, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break end,
                Err(now) => start = now,
            }
        };
        f(start..end);
    });
}

/// Runs `f` once on every item of `items` (disjoint pieces of work, e.g. mutable row chunks of
/// several buffers), the pool's threads claiming items one at a time. Safe code: each item is
/// moved out of its own slot by the one thread that claimed it.
pub fn par_items<C: Send>(pool: &ThreadPool, items: Vec<C>, f: &(dyn Fn(C) + Sync)) {
    if pool.n_threads() == 1 || items.len() < 2 {
        return items.into_iter().for_each(f);
    }
    let slots: Vec<std::sync::Mutex<Option<C>>> = items
        .into_iter()
        .map(|c| std::sync::Mutex::new(Some(c)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = slots.get(i) else { break };
        if let Some(c) = slot.lock().unwrap().take() {
            f(c);
        }
    });
}

/// Token rows per parallel piece of the element-wise ops (activation quantization, SwiGLU);
/// fewer than two pieces run on one thread. 4 rows (8–24 K elements on the 1.7B shape) keep a
/// batched decode step of 8 sequences on both cores: with 16, its 113 quantizations and 28
/// SwiGLUs per step ran on one thread while the other spun.
pub(crate) const PAR_ROWS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_items_visits_every_item_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let mut v = vec![0u32; 1000];
            let items: Vec<&mut [u32]> = v.chunks_mut(7).collect();
            par_items(&pool, items, &|c| c.iter_mut().for_each(|x| *x += 1));
            assert!(v.iter().all(|&x| x == 1), "{threads} threads");
        }
    }

    #[test]
    fn level_names_round_trip_and_detection_is_consistent() {
        for l in KernelLevel::ALL {
            assert_eq!(KernelLevel::parse(l.name()), Some(l));
            assert_eq!(KernelLevel::from_u8(l.to_u8()), l);
        }
        assert_eq!(KernelLevel::parse("AVX512 "), Some(KernelLevel::Avx512));
        assert_eq!(KernelLevel::parse("amx"), None);
        assert!(best_level().supported());
        assert!(level().supported());
        // Setting the current level again must succeed (other tests rely on the global level,
        // so this test does not change it).
        set_level(level()).unwrap();
        for l in KernelLevel::ALL {
            if !l.supported() {
                assert!(set_level(l).is_err(), "{l} is unsupported yet accepted");
            }
        }
    }

    #[test]
    fn chunks_cover_everything_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for (total, unit) in [
                (0, 1),
                (1, 1),
                (7, 100_000),
                (64, 9216),
                (9496, 9216),
                (5000, 1),
            ] {
                let seen: Vec<AtomicU8> = (0..total).map(|_| AtomicU8::new(0)).collect();
                for_each_chunk(&pool, total, unit, &|r| {
                    for i in r {
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    seen.iter().all(|v| v.load(Ordering::Relaxed) == 1),
                    "{total} with {threads} threads"
                );
            }
        }
    }
}
