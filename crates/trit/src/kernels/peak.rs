//! Throughput of the int8 dot-product instructions the ternary kernels are built on, measured
//! on this CPU: the compute limit a prefill GEMM can approach (`trit bench --profile` and
//! `examples/int8_peak.rs` print it next to what the matmuls reach).
//!
//! Each probe runs a loop of independent instructions on register operands (12 accumulators,
//! more than latency × throughput on current cores), so it measures issue throughput only: no
//! loads, no dependency stalls. Results are multiply-adds per second (one `vpdpbusd zmm` = 64
//! u8×i8 products; the AVX2 pair `vpmaddubsw`+`vpmaddwd` on ymm = 32 products plus an add).

use std::time::Instant;

/// One measured instruction sequence.
#[derive(Clone, Debug)]
pub struct Peak {
    /// What was measured, e.g. `vpdpbusd zmm`.
    pub instruction: &'static str,
    /// Multiply-adds per instruction sequence.
    pub macs_per_op: u32,
    /// Sequences per second of one thread.
    pub ops_per_sec: f64,
}

impl Peak {
    /// Multiply-adds per second of one thread, in units of 10^9.
    pub fn gmacs(&self) -> f64 {
        self.ops_per_sec * self.macs_per_op as f64 / 1e9
    }
}

/// Sequences per loop iteration (independent accumulators).
const CHAINS: usize = 12;

/// Measures every int8 dot-product form this CPU has, on the calling thread (~50 ms each).
pub fn measure() -> Vec<Peak> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let iters = 4_000_000u64;
        if super::KernelLevel::Avx512.supported() {
            // SAFETY: avx512f/bw/vnni checked by `supported`.
            let s = time(|| unsafe { x86::dpbusd_zmm(iters) });
            out.push(peak("vpdpbusd zmm", 64, iters, s));
            if std::arch::is_x86_feature_detected!("avx512vl") {
                // SAFETY: avx512vl checked just above, vnni by `supported`.
                let s = time(|| unsafe { x86::dpbusd_ymm(iters) });
                out.push(peak("vpdpbusd ymm", 32, iters, s));
            }
        }
        if super::KernelLevel::Avx2.supported() {
            // SAFETY: avx2 checked by `supported`.
            let s = time(|| unsafe { x86::maddubs_madd_ymm(iters) });
            out.push(peak("vpmaddubsw+vpmaddwd ymm", 32, iters, s));
        }
    }
    out
}

/// The first (widest) form of `measure`, run on `threads` threads at once: the summed GMAC/s
/// (whether two threads double the peak says whether they are two cores or SMT siblings).
pub fn measure_threads(threads: usize) -> Option<(Peak, f64)> {
    let single = measure().into_iter().next()?;
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(measure)).collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok()?.into_iter().next())
            .map(|p| p.gmacs())
            .sum::<f64>()
    });
    Some((single, total))
}

/// Best of three timings (the machine is shared; the minimum is the least disturbed).
fn time(f: impl Fn() -> i32) -> f64 {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn peak(instruction: &'static str, macs_per_op: u32, iters: u64, secs: f64) -> Peak {
    Peak {
        instruction,
        macs_per_op,
        ops_per_sec: (iters * CHAINS as u64) as f64 / secs.max(1e-9),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// Folds the accumulators so none of them is dead code.
    macro_rules! fold {
        ($acc:expr, $add:ident, $ty:ty, $n:expr) => {{
            let mut s = $acc[0];
            for a in &$acc[1..] {
                s = $add(s, *a);
            }
            let lanes: [i32; $n] = std::mem::transmute::<$ty, [i32; $n]>(s);
            lanes.iter().fold(0i32, |x, &y| x.wrapping_add(y))
        }};
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dpbusd_zmm(iters: u64) -> i32 {
        let a = _mm512_set1_epi8(std::hint::black_box(3));
        let b = _mm512_set1_epi8(std::hint::black_box(-5));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        fold!(acc, _mm512_add_epi32, __m512i, 16)
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dpbusd_ymm(iters: u64) -> i32 {
        let a = _mm256_set1_epi8(std::hint::black_box(3));
        let b = _mm256_set1_epi8(std::hint::black_box(-5));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm256_dpbusd_epi32(*v, a, b);
            }
        }
        fold!(acc, _mm256_add_epi32, __m256i, 8)
    }

    /// The AVX2 kernel's inner step: u8×i8 pairs to i16, pairs of i16 to i32, accumulate.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn maddubs_madd_ymm(iters: u64) -> i32 {
        let a = _mm256_set1_epi8(std::hint::black_box(3));
        let b = _mm256_set1_epi8(std::hint::black_box(-5));
        let ones = _mm256_set1_epi16(1);
        let bs: [__m256i; CHAINS] =
            std::array::from_fn(|c| _mm256_add_epi8(b, _mm256_set1_epi8(c as i8)));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        let mut a = a;
        for _ in 0..iters {
            // An empty asm block the compiler must assume changes `a`: without it the product
            // of two loop-invariant operands would be hoisted out of the loop.
            std::arch::asm!("/* {0} */", inout(ymm_reg) a, options(nomem, nostack, preserves_flags));
            // A different operand per chain, or all chains would share one product.
            for (v, &bc) in acc.iter_mut().zip(&bs) {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, bc), ones);
                *v = _mm256_add_epi32(*v, p);
            }
        }
        fold!(acc, _mm256_add_epi32, __m256i, 8)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        // The probes' results are checked against the arithmetic they perform: 4 products
        // 3·(-5) per dword and iteration (2 per i16 pair, 2 pairs per dword for the AVX2 form).
        #[test]
        fn probes_compute_what_they_claim() {
            let iters = 10;
            if crate::kernels::KernelLevel::Avx512.supported() {
                let want = (CHAINS as i32) * 16 * 10 * 4 * (-15);
                assert_eq!(unsafe { dpbusd_zmm(iters) }, want);
                if std::arch::is_x86_feature_detected!("avx512vl") {
                    assert_eq!(unsafe { dpbusd_ymm(iters) }, want / 2);
                }
            }
            if crate::kernels::KernelLevel::Avx2.supported() {
                // Chain c multiplies 3 by (c - 5).
                let want: i32 = (0..CHAINS as i32).map(|c| 8 * 10 * 4 * 3 * (c - 5)).sum();
                assert_eq!(unsafe { maddubs_madd_ymm(iters) }, want);
            }
        }
    }
}
