//! Helpers shared by the GPU test files (each `tests/*.rs` is its own crate: `mod common;`).

#![allow(dead_code)] // each test crate uses its own subset

pub fn gpu_missing() -> bool {
    if !trit_cuda::device::driver_present() {
        eprintln!("skipped: no CUDA driver (libcuda.so) on this machine");
        return true;
    }
    false
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "non-finite GPU logits");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Pseudo-random prompt ids below `vocab`, different per seed.
pub fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
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
