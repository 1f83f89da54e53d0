//! One ternary matrix in a format-free form (codes `t + 1` and one scale per 64 columns), read
//! from any ternary encoding trit loads, and re-blocked for a target group size with an exact
//! account of what the target can not hold.
//!
//! "Lossless" is judged on values, not on bytes: a 64-column slice whose codes are all zero has
//! no meaningful scale, so it never forces a conflict inside a larger target block (its stored
//! scale is the only thing that changes, and only where two formats disagree on it).

use crate::format::{TensorData, TensorView};
use crate::quant::{GgmlTernary, HalfKind, MlxTernary, TernaryRows};
use crate::{Error, Result};
use half::f16;
use rayon::prelude::*;

/// Columns per scale slice in `TernaryMatrix::scales64` (the smallest group of any format).
pub const SLICE: usize = 64;

/// A `rows × cols` ternary matrix: `w[r][c] = scales64[r][c / 64] · (codes[r][c] − 1)`.
#[derive(Clone, Debug, PartialEq)]
pub struct TernaryMatrix {
    pub rows: usize,
    pub cols: usize,
    /// `t + 1` per weight, row-major (3 = +2 is carried, never dropped silently).
    pub codes: Vec<u8>,
    /// One scale per 64 columns, row-major.
    pub scales64: Vec<f32>,
}

impl TernaryMatrix {
    fn from_rows(m: &dyn TernaryRows) -> TernaryMatrix {
        let (rows, cols) = (m.rows(), m.cols());
        let mut codes = vec![0u8; rows * cols];
        let mut scales64 = vec![0f32; rows * cols / SLICE];
        codes
            .par_chunks_mut(cols)
            .zip(scales64.par_chunks_mut(cols / SLICE))
            .enumerate()
            .for_each(|(r, (c, s))| m.row(r, c, s));
        TernaryMatrix {
            rows,
            cols,
            codes,
            scales64,
        }
    }

    /// Reads a packed ternary tensor (a GGUF ternary block type or an MLX 2-bit module).
    /// `Ok(None)` for every other encoding. An MLX 2-bit module that is affine but not ternary
    /// (`bias != -scale`) is an error: no ternary target can hold it.
    pub fn read_packed(view: &TensorView<'_>) -> Result<Option<TernaryMatrix>> {
        let named = |e: Error| Error::Format(format!("tensor '{}': {e}", view.name));
        let (rows, cols) = (view.rows(), view.cols());
        match view.data {
            TensorData::Ggml { ty, bytes } if ty.reads_as_ternary() => {
                let m = GgmlTernary::new(ty, bytes, rows, cols).map_err(named)?;
                Ok(Some(Self::from_rows(&m)))
            }
            TensorData::Mlx {
                codes,
                scales,
                biases,
                scale_dtype,
                group_size,
                bits: bits @ (1 | 2),
            } => {
                let kind = match scale_dtype {
                    crate::format::Dtype::F16 => HalfKind::F16,
                    crate::format::Dtype::BF16 => HalfKind::BF16,
                    other => {
                        return Err(named(Error::Unsupported(format!(
                            "MLX scales of dtype {}",
                            other.name()
                        ))))
                    }
                };
                let m = MlxTernary::with_bits(
                    codes, scales, biases, kind, rows, cols, group_size, bits,
                )
                .map_err(named)?;
                m.check_ternary().map_err(named)?;
                Ok(Some(Self::from_rows(&m)))
            }
            _ => Ok(None),
        }
    }

    /// The dense values `s · t` (exact in f32).
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let s = self.scales64[i / self.cols * (self.cols / SLICE) + i % self.cols / SLICE];
                s * (c as f32 - 1.0)
            })
            .collect()
    }

    /// Moves whole rows (codes and scales together): `out[new] = self[perm[new]]`.
    pub fn permute_rows(&self, perm: &[usize]) -> TernaryMatrix {
        let spr = self.cols / SLICE;
        let mut out = self.clone();
        for (new, &old) in perm.iter().enumerate() {
            out.codes[new * self.cols..(new + 1) * self.cols]
                .copy_from_slice(&self.codes[old * self.cols..(old + 1) * self.cols]);
            out.scales64[new * spr..(new + 1) * spr]
                .copy_from_slice(&self.scales64[old * spr..(old + 1) * spr]);
        }
        out
    }
}

/// Why a target block can not hold its source groups exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct LossyBlock {
    pub row: usize,
    pub block: usize,
    pub reason: String,
}

/// The error a lossy conversion introduced in one tensor, over its non-zero weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// Target blocks that could not be represented exactly.
    pub lossy_blocks: usize,
    pub blocks: usize,
    /// Largest and mean `|w' − w| / |w|` over the non-zero source weights.
    pub max_rel: f64,
    pub mean_rel: f64,
    /// `‖W' − W‖ / ‖W‖` (Frobenius).
    pub rel_fro: f64,
}

/// A matrix re-blocked for a target: one scale per `group` columns and the codes to write.
pub struct Reblocked {
    pub group: usize,
    pub codes: Vec<u8>,
    /// One scale per target group (an f16 value), row-major.
    pub scales: Vec<f32>,
    /// The first block that was not exact (`None`: the conversion is lossless).
    pub first_lossy: Option<LossyBlock>,
    pub stats: ErrorStats,
}

impl Reblocked {
    /// The scales repeated per 64 columns (what `quant::ternary::encode_matrix` takes).
    pub fn scales64(&self) -> Vec<f32> {
        let per = self.group / SLICE;
        self.scales
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s, per))
            .collect()
    }
}

/// Re-blocks `m` into groups of `group` columns with one f16 scale each; `trits` says the
/// target stores base-3 digits (no code 3). Lossy blocks get the least-squares scale for their
/// codes (`Σ|w| / Σ|t|`), rounded to f16, and code 3 is clipped to +1; `first_lossy` and
/// `stats` describe what that cost.
pub fn reblock(m: &TernaryMatrix, group: usize, trits: bool) -> Result<Reblocked> {
    if group < SLICE || !group.is_multiple_of(SLICE) || !m.cols.is_multiple_of(group) {
        return Err(Error::Unsupported(format!(
            "width {} is not a multiple of the target group {group}",
            m.cols
        )));
    }
    let per = group / SLICE;
    let blocks_per_row = m.cols / group;
    struct RowOut {
        codes: Vec<u8>,
        scales: Vec<f32>,
        first: Option<LossyBlock>,
        lossy: usize,
        max_rel: f64,
        sum_rel: f64,
        nonzero: usize,
        err2: f64,
        norm2: f64,
    }
    let rows: Vec<RowOut> = (0..m.rows)
        .into_par_iter()
        .map(|r| {
            let codes_in = &m.codes[r * m.cols..(r + 1) * m.cols];
            let s_in = &m.scales64[r * (m.cols / SLICE)..(r + 1) * (m.cols / SLICE)];
            let mut o = RowOut {
                codes: codes_in.to_vec(),
                scales: Vec::with_capacity(blocks_per_row),
                first: None,
                lossy: 0,
                max_rel: 0.0,
                sum_rel: 0.0,
                nonzero: 0,
                err2: 0.0,
                norm2: 0.0,
            };
            for b in 0..blocks_per_row {
                let slices = b * per..(b + 1) * per;
                let used: Vec<usize> = slices
                    .clone()
                    .filter(|&j| codes_in[j * SLICE..(j + 1) * SLICE].iter().any(|&q| q != 1))
                    .collect();
                let code3 = trits && codes_in[b * group..(b + 1) * group].contains(&3);
                let first_s = used.first().map_or(s_in[b * per], |&j| s_in[j]);
                let mut reason = None;
                if let Some(&j) = used
                    .iter()
                    .find(|&&j| s_in[j].to_bits() != first_s.to_bits())
                {
                    reason = Some(format!(
                        "its {} slices of 64 columns have different scales ({:e} at column {}, \
                         {:e} at column {}) and the target keeps one scale per {group}",
                        per,
                        first_s,
                        used[0] * SLICE,
                        s_in[j],
                        j * SLICE
                    ));
                } else if f16::from_f32(first_s).to_f32().to_bits() != first_s.to_bits() {
                    reason = Some(format!("scale {first_s:e} is not an f16 value"));
                } else if code3 {
                    reason = Some(
                        "it holds code 3 (+2), which a base-3 format can not store".to_string(),
                    );
                }
                let scale = if reason.is_none() {
                    first_s
                } else {
                    o.lossy += 1;
                    if o.first.is_none() {
                        o.first = Some(LossyBlock {
                            row: r,
                            block: b,
                            reason: reason.clone().unwrap_or_default(),
                        });
                    }
                    // Least squares for fixed codes: s* = Σ s_j·|t| / Σ |t|.
                    let (mut num, mut den) = (0f64, 0f64);
                    for j in slices.clone() {
                        for &q in &codes_in[j * SLICE..(j + 1) * SLICE] {
                            let t = (q as f64 - 1.0).abs();
                            num += s_in[j] as f64 * t;
                            den += t;
                        }
                    }
                    let s = if den > 0.0 { num / den } else { first_s as f64 };
                    f16::from_f64(s).to_f32()
                };
                o.scales.push(scale);
                if reason.is_none() {
                    // Exact: codes unchanged, no error; only the tensor's norm and non-zero
                    // count (the denominators of the relative errors) need updating.
                    for j in slices {
                        let s = s_in[j] as f64;
                        for &q in &codes_in[j * SLICE..(j + 1) * SLICE] {
                            let t = q as f64 - 1.0;
                            o.norm2 += s * s * t * t;
                            o.nonzero += usize::from(q != 1 && s != 0.0);
                        }
                    }
                    continue;
                }
                for j in slices {
                    let span = j * SLICE..(j + 1) * SLICE;
                    for (out, &q) in o.codes[span.clone()].iter_mut().zip(&codes_in[span]) {
                        let q_out = if trits && q == 3 { 2 } else { q };
                        *out = q_out;
                        let w = s_in[j] as f64 * (q as f64 - 1.0);
                        let w2 = scale as f64 * (q_out as f64 - 1.0);
                        o.norm2 += w * w;
                        o.err2 += (w2 - w) * (w2 - w);
                        if w != 0.0 {
                            let rel = (w2 - w).abs() / w.abs();
                            o.nonzero += 1;
                            o.sum_rel += rel;
                            o.max_rel = o.max_rel.max(rel);
                        }
                    }
                }
            }
            o
        })
        .collect();
    let mut out = Reblocked {
        group,
        codes: Vec::with_capacity(m.codes.len()),
        scales: Vec::with_capacity(m.rows * blocks_per_row),
        first_lossy: None,
        stats: ErrorStats {
            blocks: m.rows * blocks_per_row,
            ..ErrorStats::default()
        },
    };
    let (mut sum_rel, mut nonzero, mut err2, mut norm2) = (0f64, 0usize, 0f64, 0f64);
    for r in rows {
        out.codes.extend_from_slice(&r.codes);
        out.scales.extend_from_slice(&r.scales);
        if out.first_lossy.is_none() {
            out.first_lossy = r.first;
        }
        out.stats.lossy_blocks += r.lossy;
        out.stats.max_rel = out.stats.max_rel.max(r.max_rel);
        sum_rel += r.sum_rel;
        nonzero += r.nonzero;
        err2 += r.err2;
        norm2 += r.norm2;
    }
    out.stats.mean_rel = if nonzero > 0 {
        sum_rel / nonzero as f64
    } else {
        0.0
    };
    out.stats.rel_fro = if norm2 > 0.0 {
        (err2 / norm2).sqrt()
    } else {
        0.0
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(scales64: Vec<f32>, cols: usize, code: impl Fn(usize) -> u8) -> TernaryMatrix {
        let rows = scales64.len() * SLICE / cols;
        TernaryMatrix {
            rows,
            cols,
            codes: (0..rows * cols).map(code).collect(),
            scales64,
        }
    }

    #[test]
    fn equal_scales_reblock_exactly_and_different_ones_are_located() {
        let m = matrix(vec![0.5, 0.5, 0.25, 0.25], 256, |i| {
            if i % 2 == 0 {
                0
            } else {
                2
            }
        });
        let r = reblock(&m, 128, true).unwrap();
        assert!(r.first_lossy.is_none());
        assert_eq!(r.scales, [0.5, 0.25]);
        assert_eq!(r.stats.max_rel, 0.0);
        let r = reblock(&m, 256, false).unwrap();
        let lossy = r.first_lossy.unwrap();
        assert_eq!((lossy.row, lossy.block), (0, 0));
        assert!(
            lossy.reason.contains("different scales"),
            "{}",
            lossy.reason
        );
        // Σ s|t| / Σ|t| with equal nonzero counts in both halves: the mean.
        assert_eq!(r.scales, [0.375]);
        assert!((r.stats.max_rel - 0.5).abs() < 1e-12, "{:?}", r.stats);
        assert!(r.stats.mean_rel > 0.3 && r.stats.mean_rel < 0.5);
    }

    #[test]
    fn all_zero_slices_do_not_conflict_and_code3_only_troubles_trits() {
        let m = matrix(vec![0.5, 9.0], 128, |i| if i < 64 { 2 } else { 1 });
        assert!(reblock(&m, 128, true).unwrap().first_lossy.is_none());
        let m = matrix(vec![0.5, 0.5], 128, |i| if i == 7 { 3 } else { 0 });
        assert!(reblock(&m, 128, false).unwrap().first_lossy.is_none());
        let r = reblock(&m, 128, true).unwrap();
        assert!(r.first_lossy.unwrap().reason.contains("code 3"));
        assert_eq!(r.codes[7], 2);
        let m = matrix(vec![0.1, 0.1], 128, |_| 2);
        assert!(reblock(&m, 128, false)
            .unwrap()
            .first_lossy
            .unwrap()
            .reason
            .contains("not an f16"));
    }
}
