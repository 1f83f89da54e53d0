//! The Gated DeltaNet pieces of a Qwen3.5 linear-attention layer (models.md §3.3), on plain
//! f32 slices: the causal depthwise conv with its rolling state, q/k normalization, the
//! per-head decay/gate, the delta-rule recurrence (one token at a time for decode, chunked for
//! prefill) and the gated RMSNorm.
//!
//! Recurrence per value head, state `S` (`Dv × Dk`, row `i` is value dim `i`):
//! `S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q`.
//!
//! Chunked form: within a chunk with cumulative log-decay `L_t = Σ_{i≤t} ln g_i` the state is
//! `S_t = e^{L_t} S₀ + Σ_{i≤t} e^{L_t−L_i} δ_i k_iᵀ`, so the δ's solve a unit lower-triangular
//! system `δ_t = β_t (v_t − e^{L_t} S₀k_t − Σ_{i<t} e^{L_t−L_i} (k_i·k_t) δ_i)`, outputs are
//! `o_t = e^{L_t} S₀q_t + Σ_{i≤t} e^{L_t−L_i} (k_i·q_t) δ_i` and the state moves once per chunk.
//! S₀ is read once and written once per chunk instead of four passes per token, and every
//! exponent is ≤ 0 (no overflow however long the chunk). Both recurrences live in
//! `kernels/delta_rule.rs` (compiled per SIMD level); this file keeps the elementwise parts.

use crate::kernels::ops::dot;

/// `ln(1 + e^x)` without overflow (mlx's `softplus`).
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// Causal depthwise conv1d (no bias) then SiLU, in place over `x` (`T × channels`).
/// `state` holds the previous `kernel − 1` inputs (oldest first) and is advanced by `T`;
/// `w` is `channels × kernel`, tap `kernel − 1` multiplying the current input.
pub fn causal_conv_silu(x: &mut [f32], state: &mut [f32], w: &[f32], channels: usize) {
    let kernel = w.len() / channels;
    let keep = kernel - 1;
    debug_assert_eq!(state.len(), keep * channels);
    let t_len = x.len() / channels;
    // The inputs in time order: the kept ones, then this call's.
    let mut inputs = Vec::with_capacity((keep + t_len) * channels);
    inputs.extend_from_slice(state);
    inputs.extend_from_slice(x);
    for t in 0..t_len {
        let out = &mut x[t * channels..(t + 1) * channels];
        for (c, o) in out.iter_mut().enumerate() {
            let taps = &w[c * kernel..(c + 1) * kernel];
            let mut acc = 0f32;
            for (j, &wj) in taps.iter().enumerate() {
                acc += wj * inputs[(t + j) * channels + c];
            }
            *o = silu(acc);
        }
    }
    let total = keep + t_len;
    state.copy_from_slice(&inputs[(total - keep) * channels..]);
}

/// `x ← x / sqrt(Σx² + 1e-6) · scale` (mlx-lm's `normalize_qk`: the epsilon is added to the
/// sum of squares, not the mean).
pub fn l2_normalize(x: &mut [f32], scale: f32) {
    let inv = scale / (dot(x, x) + 1e-6).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Gated RMSNorm of one value head: `RMSNorm(o)·w · SiLU(z)`, in place on `o`.
pub fn gated_rms_norm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let inv = 1.0 / (dot(o, o) / o.len() as f32 + eps).sqrt();
    for ((v, &zi), &wi) in o.iter_mut().zip(z).zip(w) {
        *v = *v * inv * wi * silu(zi);
    }
}

pub use crate::kernels::delta_rule::{recur_chunked, recur_steps, HeadInputs, CHUNK};

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_values::uniform as values;

    fn inputs(t: usize, dk: usize, dv: usize) -> Inputs {
        let mut q = values(1, t * dk);
        let mut k = values(2, t * dk);
        for (qt, kt) in q.chunks_mut(dk).zip(k.chunks_mut(dk)) {
            l2_normalize(qt, 1.0 / (dk as f32).sqrt());
            l2_normalize(kt, 1.0);
        }
        let v = values(3, t * dv);
        // Decays between e^-3 and 1 (strong and weak forgetting), β in (0, 1).
        let log_g: Vec<f32> = values(4, t).iter().map(|x| -1.5 * (x + 1.0)).collect();
        let beta: Vec<f32> = values(5, t).iter().map(|&x| sigmoid(2.0 * x)).collect();
        (q, k, v, log_g, beta)
    }

    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    #[test]
    fn chunked_equals_token_by_token() {
        let (dk, dv) = (32, 24);
        for t in [1, 7, CHUNK, CHUNK + 1, 3 * CHUNK + 5] {
            let (q, k, v, log_g, beta) = inputs(t, dk, dv);
            let x = HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                log_g: &log_g,
                beta: &beta,
            };
            let s0 = values(6, dv * dk);
            let (mut s_a, mut s_b) = (s0.clone(), s0);
            let (mut o_a, mut o_b) = (vec![0f32; t * dv], vec![0f32; t * dv]);
            recur_steps(&mut s_a, &x, &mut o_a);
            recur_chunked(&mut s_b, &x, &mut o_b);
            let d_o = o_a
                .iter()
                .zip(&o_b)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let d_s = s_a
                .iter()
                .zip(&s_b)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                d_o < 1e-4 && d_s < 1e-4,
                "T={t}: outputs {d_o}, state {d_s}"
            );
        }
    }

    #[test]
    fn recurrence_matches_the_definition_by_hand() {
        // Dk = Dv = 1: S ← g S; δ = β(v − S k); S ← S + δ k; o = S q.
        let (q, k, v, lg, b) = (
            [0.5f32, 2.0],
            [1.0f32, -1.0],
            [3.0f32, 1.0],
            [0.5f32.ln(), 0.0],
            [0.5f32, 1.0],
        );
        let x = HeadInputs {
            q: &q,
            k: &k,
            v: &v,
            log_g: &lg,
            beta: &b,
        };
        let mut s = [2.0f32];
        let mut o = [0f32; 2];
        recur_steps(&mut s, &x, &mut o);
        // t0: S = 1; δ = 0.5·(3 − 1) = 1; S = 2; o = 1. t1: S = 2; δ = 1 − (−2) = 3; S = −1; o = −2.
        assert_eq!(o, [1.0, -2.0]);
        assert_eq!(s, [-1.0]);
    }

    #[test]
    fn conv_state_carries_across_calls() {
        let (c, kernel, t) = (3, 4, 9);
        let w = values(7, c * kernel);
        let x = values(8, t * c);
        let mut whole = x.clone();
        let mut state = vec![0f32; (kernel - 1) * c];
        causal_conv_silu(&mut whole, &mut state, &w, c);
        let mut split = x.clone();
        let mut state2 = vec![0f32; (kernel - 1) * c];
        let (a, b) = split.split_at_mut(2 * c);
        causal_conv_silu(a, &mut state2, &w, c);
        causal_conv_silu(b, &mut state2, &w, c);
        assert_eq!(whole, split);
        assert_eq!(state, state2);
        // First output of channel 0 only sees the current input (zero history).
        assert!((whole[0] - silu(w[kernel - 1] * x[0])).abs() < 1e-7);
    }
}
