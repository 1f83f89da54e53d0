//! Rotary position embeddings: NEOX (rotate-half, pairs `(i, i + d/2)`, Qwen3 and HF llama)
//! and adjacent pairs `(2i, 2i + 1)` (GGUF llama files, whose Q/K rows are pre-permuted).
//! YaRN scaling follows the HF / mlx-lm definition: blended inverse frequencies plus an
//! attention factor applied to the rotated vectors.

use crate::format::config::{RopeScaling, RopeStyle};

pub struct Rope {
    style: RopeStyle,
    inv_freq: Vec<f64>,
    /// Multiplies q and k (YaRN's attention factor); 1.0 otherwise.
    mscale: f32,
}

impl Rope {
    pub fn new(
        head_dim: usize,
        theta: f32,
        style: RopeStyle,
        scaling: Option<&RopeScaling>,
    ) -> Self {
        let half = head_dim / 2;
        let base = theta as f64;
        let extra: Vec<f64> = (0..half)
            .map(|i| 1.0 / base.powf(2.0 * i as f64 / head_dim as f64))
            .collect();
        let (inv_freq, mscale) = match scaling {
            Some(s) => yarn(&extra, head_dim, base, s),
            None => (extra, 1.0),
        };
        Rope {
            style,
            inv_freq,
            mscale,
        }
    }

    /// cos and sin of every rotation angle at `pos` (computed once per token, shared by all
    /// heads and layers), with YaRN's attention factor folded in.
    pub fn angles(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|&f| {
                let (s, c) = (pos as f64 * f).sin_cos();
                (c as f32 * self.mscale, s as f32 * self.mscale)
            })
            .unzip()
    }

    /// Rotates one head vector in place with the angles of its position.
    pub fn apply_angles(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = cos.len();
        for i in 0..half {
            let (a, b) = match self.style {
                RopeStyle::Neox => (i, i + half),
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * cos[i] - x1 * sin[i];
            x[b] = x0 * sin[i] + x1 * cos[i];
        }
    }

    /// Rotates one head vector in place at position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let (cos, sin) = self.angles(pos);
        self.apply_angles(x, &cos, &sin);
    }
}

fn yarn(extra: &[f64], dim: usize, base: f64, s: &RopeScaling) -> (Vec<f64>, f32) {
    let RopeScaling::Yarn {
        factor,
        original_max_position,
        beta_fast,
        beta_slow,
        attention_factor,
    } = *s;
    let factor = factor as f64;
    let max_pos = original_max_position as f64;
    let correction_dim = |rotations: f64| {
        dim as f64 * (max_pos / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let low = correction_dim(beta_fast as f64).floor().max(0.0);
    let mut high = correction_dim(beta_slow as f64)
        .ceil()
        .min(dim as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    let inv: Vec<f64> = extra
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolate = 1.0 - ramp;
            (e / factor) * (1.0 - extrapolate) + e * extrapolate
        })
        .collect();
    // The loader resolves the attention factor (HF value or mlx-lm's mscale formula).
    let mscale = attention_factor;
    (inv, mscale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let r = Rope::new(8, 10000.0, RopeStyle::Neox, None);
        let mut x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let orig = x;
        r.apply(&mut x, 0);
        assert_eq!(x, orig);
        r.apply(&mut x, 17);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn adjacent_equals_neox_on_permuted_vector() {
        // GGUF llama permutes rows so that adjacent-pair rope on the permuted head equals
        // rotate-half rope on the original: perm maps original index to stored index.
        let d = 8;
        let neox = Rope::new(d, 10000.0, RopeStyle::Neox, None);
        let adj = Rope::new(d, 10000.0, RopeStyle::Adjacent, None);
        let orig: Vec<f32> = (0..d).map(|i| i as f32 * 0.37 - 1.0).collect();
        let stored_of = |i: usize| {
            if i < d / 2 {
                2 * i
            } else {
                2 * (i - d / 2) + 1
            }
        };
        let mut permuted = vec![0.0; d];
        for i in 0..d {
            permuted[stored_of(i)] = orig[i];
        }
        let mut a = orig.clone();
        neox.apply(&mut a, 5);
        adj.apply(&mut permuted, 5);
        for i in 0..d {
            assert!((a[i] - permuted[stored_of(i)]).abs() < 1e-5);
        }
    }
}
