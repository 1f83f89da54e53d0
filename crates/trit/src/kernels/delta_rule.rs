//! The gated delta rule of one value head (Qwen3.5 Gated DeltaNet; the math and the chunked
//! form are described in `model/gated_delta.rs`), compiled three times like `dense.rs`:
//! portable, and under AVX2+FMA and AVX-512 target features so the same row loops (`y += a·x`
//! and short dot products over `Dk`/`Dv`/chunk-length rows) become wide vector code. The
//! portable instance is the reference the SIMD instances are tested against.

use super::{level, KernelLevel};

/// One value head's inputs for `T` tokens, each contiguous: `q`, `k` are `T × Dk` (already
/// normalized and scaled), `v` is `T × Dv`, `log_g` and `beta` have `T` entries.
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub log_g: &'a [f32],
    pub beta: &'a [f32],
}

/// Tokens per chunk of the chunked recurrence.
pub const CHUNK: usize = 64;

/// Token-by-token recurrence; `state` is `Dv × Dk`, writes `T × Dv` outputs.
pub fn recur_steps(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32]) {
    dispatch(level(), state, x, out, false)
}

/// The chunked recurrence (chunks of `CHUNK` tokens); same contract as `recur_steps`.
pub fn recur_chunked(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32]) {
    dispatch(level(), state, x, out, true)
}

fn dispatch(l: KernelLevel, state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], chunked: bool) {
    match l.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` checked the CPU features.
        KernelLevel::Avx512 => unsafe { run_avx512(state, x, out, chunked) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        KernelLevel::Avx2 => unsafe { run_avx2(state, x, out, chunked) },
        _ => run(state, x, out, chunked),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], chunked: bool) {
    run(state, x, out, chunked)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn run_avx512(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], chunked: bool) {
    run(state, x, out, chunked)
}

#[inline(always)]
fn run(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], chunked: bool) {
    let n_tok = x.beta.len();
    if n_tok == 0 {
        return;
    }
    let dk = x.q.len() / n_tok;
    let dv = state.len() / dk;
    if !chunked {
        steps(state, x, out, dk, dv);
        return;
    }
    let mut t0 = 0;
    while t0 < n_tok {
        let n = CHUNK.min(n_tok - t0);
        let part = HeadInputs {
            q: &x.q[t0 * dk..(t0 + n) * dk],
            k: &x.k[t0 * dk..(t0 + n) * dk],
            v: &x.v[t0 * dv..(t0 + n) * dv],
            log_g: &x.log_g[t0..t0 + n],
            beta: &x.beta[t0..t0 + n],
        };
        chunk(state, &part, &mut out[t0 * dv..(t0 + n) * dv], dk, dv);
        t0 += n;
    }
}

/// `Σ a[i]·b[i]` with 16 independent partial sums (vectorizes without reassociation).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += xa[i] * xb[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a·x`.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[inline(always)]
fn steps(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], dk: usize, dv: usize) {
    for t in 0..x.beta.len() {
        let (q, k) = (&x.q[t * dk..(t + 1) * dk], &x.k[t * dk..(t + 1) * dk]);
        let (g, beta) = (x.log_g[t].exp(), x.beta[t]);
        for i in 0..dv {
            let row = &mut state[i * dk..(i + 1) * dk];
            for s in row.iter_mut() {
                *s *= g;
            }
            let delta = beta * (x.v[t * dv + i] - dot(row, k));
            axpy(delta, k, row);
            out[t * dv + i] = dot(row, q);
        }
    }
}

#[inline(always)]
fn chunk(state: &mut [f32], x: &HeadInputs<'_>, out: &mut [f32], dk: usize, dv: usize) {
    let n = x.beta.len();
    // Cumulative log-decay, accumulated in f64 so long chunks do not drift.
    let mut cum = vec![0f32; n];
    let mut acc = 0f64;
    for (c, &lg) in cum.iter_mut().zip(x.log_g) {
        acc += lg as f64;
        *c = acc as f32;
    }
    let key = |t: usize| &x.k[t * dk..(t + 1) * dk];
    let query = |t: usize| &x.q[t * dk..(t + 1) * dk];
    // Decayed Gram matrices (lower triangle): kk[t][i] = e^{L_t−L_i} k_i·k_t (i < t),
    // qk[t][i] = e^{L_t−L_i} k_i·q_t (i ≤ t).
    let mut kk = vec![0f32; n * n];
    let mut qk = vec![0f32; n * n];
    for t in 0..n {
        for i in 0..=t {
            let decay = (cum[t] - cum[i]).exp();
            if i < t {
                kk[t * n + i] = decay * dot(key(i), key(t));
            }
            qk[t * n + i] = decay * dot(key(i), query(t));
        }
    }
    // S₀k_t and S₀q_t for every token, one pass over the state rows.
    let mut sk = vec![0f32; n * dv];
    let mut sq = vec![0f32; n * dv];
    for r in 0..dv {
        let row = &state[r * dk..(r + 1) * dk];
        for t in 0..n {
            sk[t * dv + r] = dot(row, key(t));
            sq[t * dv + r] = dot(row, query(t));
        }
    }
    // δ by forward substitution (rows of `delta` are tokens).
    let mut delta = vec![0f32; n * dv];
    for t in 0..n {
        let (done, rest) = delta.split_at_mut(t * dv);
        let d = &mut rest[..dv];
        let g = cum[t].exp();
        for (r, dr) in d.iter_mut().enumerate() {
            *dr = x.v[t * dv + r] - g * sk[t * dv + r];
        }
        for i in 0..t {
            axpy(-kk[t * n + i], &done[i * dv..(i + 1) * dv], d);
        }
        for dr in d.iter_mut() {
            *dr *= x.beta[t];
        }
    }
    for t in 0..n {
        let o = &mut out[t * dv..(t + 1) * dv];
        let g = cum[t].exp();
        for (or, &s) in o.iter_mut().zip(&sq[t * dv..(t + 1) * dv]) {
            *or = g * s;
        }
        for i in 0..=t {
            axpy(qk[t * n + i], &delta[i * dv..(i + 1) * dv], o);
        }
    }
    // S ← e^{L_last} S₀ + Σ_i e^{L_last−L_i} δ_i k_iᵀ.
    let last = cum[n - 1];
    let g_all = last.exp();
    let weights: Vec<f32> = cum.iter().map(|&c| (last - c).exp()).collect();
    for r in 0..dv {
        let row = &mut state[r * dk..(r + 1) * dk];
        for s in row.iter_mut() {
            *s *= g_all;
        }
        for i in 0..n {
            axpy(weights[i] * delta[i * dv + r], key(i), row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_values::uniform as values;

    #[test]
    fn every_level_matches_the_portable_kernel() {
        let (t, dk, dv) = (CHUNK + 9, 32, 48);
        let (q, k, v) = (values(1, t * dk), values(2, t * dk), values(3, t * dv));
        let log_g: Vec<f32> = values(4, t).iter().map(|x| -0.5 * (x + 1.0)).collect();
        let beta: Vec<f32> = values(5, t).iter().map(|x| 0.5 + 0.4 * x).collect();
        let x = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            log_g: &log_g,
            beta: &beta,
        };
        let s0 = values(6, dv * dk);
        for chunked in [false, true] {
            let (mut s_ref, mut o_ref) = (s0.clone(), vec![0f32; t * dv]);
            run(&mut s_ref, &x, &mut o_ref, chunked);
            for l in KernelLevel::available() {
                let (mut s, mut o) = (s0.clone(), vec![0f32; t * dv]);
                dispatch(l, &mut s, &x, &mut o, chunked);
                let diff = |a: &[f32], b: &[f32]| {
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max)
                };
                assert!(diff(&o, &o_ref) < 1e-4, "{l} chunked={chunked} outputs");
                assert!(diff(&s, &s_ref) < 1e-4, "{l} chunked={chunked} state");
            }
        }
    }
}
