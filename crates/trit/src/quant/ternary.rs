//! `GgmlTernary`: the `TernaryRows` view of a GGUF ternary tensor, and the matching encoder from
//! (codes, one scale per 64 columns) to any ternary block type.
//!
//! Group sizes: Q2_0 64; legacy Q2_0, PQ2_0, PTQ1_0 128; TQ1_0, TQ2_0 256. A larger group's scale is
//! repeated for each of its 64-column slices on decode; on encode all slices of a group must share
//! one scale (otherwise the conversion would be lossy and is refused).

use super::{ptq1_0, q1_0, q2_0, tq1_0, tq2_0, GgmlType, TernaryRows};
use crate::{Error, Result};

/// Fills `codes` (`ty.block_size()` of them) from one block and returns its scale.
pub fn decode_block(ty: GgmlType, block: &[u8], codes: &mut [u8]) -> f32 {
    match ty {
        GgmlType::Q2_0 | GgmlType::Q2_0Legacy128 | GgmlType::PQ2_0 => {
            q2_0::decode_block(block, codes)
        }
        GgmlType::PTQ1_0 => ptq1_0::decode_block(block, codes),
        GgmlType::TQ1_0 => tq1_0::decode_block(block, codes),
        GgmlType::TQ2_0 => tq2_0::decode_block(block, codes),
        GgmlType::Q1_0 => q1_0::decode_block(block, codes),
        other => unreachable!("{} is not ternary", other.name()),
    }
}

/// Writes one block of `ty` from its scale (an f16 value) and `ty.block_size()` codes.
pub fn encode_block(ty: GgmlType, scale: f32, codes: &[u8], block: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::Q2_0 | GgmlType::Q2_0Legacy128 | GgmlType::PQ2_0 => {
            q2_0::encode_block(scale, codes, block)
        }
        GgmlType::PTQ1_0 => ptq1_0::encode_block(scale, codes, block),
        GgmlType::TQ1_0 => tq1_0::encode_block(scale, codes, block),
        GgmlType::TQ2_0 => tq2_0::encode_block(scale, codes, block),
        other => Err(Error::InvalidArgument(format!(
            "{} is not a ternary type",
            other.name()
        ))),
    }
}

/// Encodes a `rows × cols` ternary matrix given as codes (`t + 1`, row-major) and one scale per
/// 64 columns (`rows · cols/64`, row-major) into `ty`'s blocks. Errors when the result would not
/// decode to exactly the input: groups with unequal scales, scales that are not f16 values, or
/// code 3 in a trit format.
pub fn encode_matrix(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    codes: &[u8],
    scales64: &[f32],
) -> Result<Vec<u8>> {
    if !ty.is_ternary() {
        return Err(Error::InvalidArgument(format!(
            "{} is not a ternary type",
            ty.name()
        )));
    }
    let g = ty.block_size();
    if !cols.is_multiple_of(g) || codes.len() != rows * cols || scales64.len() != rows * (cols / 64)
    {
        return Err(Error::InvalidArgument(format!(
            "ternary {rows}×{cols} as {}: need cols % {g} == 0, {} codes and {} scales \
             (got {} and {})",
            ty.name(),
            rows * cols,
            rows * (cols / 64),
            codes.len(),
            scales64.len()
        )));
    }
    let per = g / 64;
    let mut out = vec![0u8; ty.row_bytes(cols) * rows];
    for (b, block) in out.chunks_exact_mut(ty.type_size()).enumerate() {
        let slices = &scales64[b * per..(b + 1) * per];
        if slices.iter().any(|s| s.to_bits() != slices[0].to_bits()) {
            let (r, c) = (b / (cols / g), b % (cols / g) * g);
            return Err(Error::InvalidArgument(format!(
                "row {r}, columns {c}..{}: scales {slices:?} differ, so {} (group {g}) would be lossy",
                c + g,
                ty.name()
            )));
        }
        encode_block(ty, slices[0], &codes[b * g..(b + 1) * g], block).map_err(|e| {
            Error::InvalidArgument(format!(
                "{} block {b} (row {}): {e}",
                ty.name(),
                b / (cols / g)
            ))
        })?;
    }
    Ok(out)
}

/// A GGUF ternary tensor of `rows × cols` (cols = input width) as `TernaryRows`.
#[derive(Clone, Copy, Debug)]
pub struct GgmlTernary<'a> {
    pub ty: GgmlType,
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> GgmlTernary<'a> {
    /// Checks the type (ternary, or binary Q1_0), the width against the group size, and the
    /// byte length.
    pub fn new(ty: GgmlType, bytes: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        if !ty.reads_as_ternary() {
            return Err(Error::Unsupported(format!(
                "{} is not a ternary type",
                ty.name()
            )));
        }
        if !cols.is_multiple_of(ty.block_size()) {
            return Err(Error::Format(format!(
                "{} tensor width {cols} is not a multiple of its group size {}",
                ty.name(),
                ty.block_size()
            )));
        }
        let want = rows.checked_mul(ty.row_bytes(cols));
        if want != Some(bytes.len()) {
            return Err(Error::Format(format!(
                "{} tensor {rows}×{cols} needs {want:?} bytes, got {}",
                ty.name(),
                bytes.len()
            )));
        }
        Ok(GgmlTernary {
            ty,
            bytes,
            rows,
            cols,
        })
    }
}

impl TernaryRows for GgmlTernary<'_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        let (g, rb) = (self.ty.block_size(), self.ty.row_bytes(self.cols));
        let row = &self.bytes[r * rb..(r + 1) * rb];
        for (i, block) in row.chunks_exact(self.ty.type_size()).enumerate() {
            let s = decode_block(self.ty, block, &mut codes[i * g..(i + 1) * g]);
            scales[i * g / 64..(i + 1) * g / 64].fill(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::mlx2::{self, MlxTernary};
    use crate::quant::HalfKind;

    /// A random ternary matrix whose scales are shared per 256 columns, so every format holds it.
    fn random_matrix(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let codes = (0..rows * cols).map(|_| (next() % 3) as u8).collect();
        let scales256: Vec<f32> = (0..rows * cols / 256)
            .map(|_| half::f16::from_bits((next() % 0x3C00) as u16 + 0x0400).to_f32())
            .collect();
        let scales = (0..rows * cols / 64).map(|i| scales256[i / 4]).collect();
        (codes, scales)
    }

    fn read_all(m: &dyn TernaryRows) -> (Vec<u8>, Vec<f32>) {
        let (rows, cols) = (m.rows(), m.cols());
        let (mut codes, mut scales) = (vec![9u8; rows * cols], vec![f32::NAN; rows * cols / 64]);
        for r in 0..rows {
            m.row(
                r,
                &mut codes[r * cols..(r + 1) * cols],
                &mut scales[r * cols / 64..(r + 1) * cols / 64],
            );
        }
        (codes, scales)
    }

    /// Binary Q1_0 reads as ternary codes 0 (−d) and 2 (+d) with its block's scale.
    #[test]
    fn q1_0_reads_as_ternary_rows() {
        let (rows, cols) = (2, 256);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let d = [0.5f32, 0.25, 1.5, 2.0][i / 128];
                if (i * 7) % 3 == 0 {
                    -d
                } else {
                    d
                }
            })
            .collect();
        let bytes: Vec<u8> = values
            .chunks_exact(cols)
            .flat_map(|r| crate::quant::q1_0::encode_row(r).unwrap())
            .collect();
        let view = GgmlTernary::new(GgmlType::Q1_0, &bytes, rows, cols).unwrap();
        let (codes, scales) = read_all(&view);
        for (i, (&c, &v)) in codes.iter().zip(&values).enumerate() {
            assert_eq!((c as f32 - 1.0) * scales[i / 64], v, "weight {i}");
        }
        assert!(encode_matrix(GgmlType::Q1_0, rows, cols, &codes, &scales).is_err());
    }

    #[test]
    fn every_ternary_format_gives_the_same_rows() {
        let (rows, cols) = (5, 512);
        let (codes, scales) = random_matrix(rows, cols, 0x9E37_79B9_7F4A_7C15);
        for ty in GgmlType::TERNARY {
            let bytes = encode_matrix(ty, rows, cols, &codes, &scales).unwrap();
            assert_eq!(bytes.len(), rows * ty.row_bytes(cols));
            let view = GgmlTernary::new(ty, &bytes, rows, cols).unwrap();
            assert_eq!(
                read_all(&view),
                (codes.clone(), scales.clone()),
                "{}",
                ty.name()
            );
            // The scalar dequantizer agrees with codes × scales.
            let mut w = vec![0.0; rows * cols];
            crate::quant::dequantize(ty, &bytes, rows * cols, &mut w).unwrap();
            for (i, &v) in w.iter().enumerate() {
                assert_eq!(
                    v,
                    (f32::from(codes[i]) - 1.0) * scales[i / 64],
                    "{} at {i}",
                    ty.name()
                );
            }
        }
        for kind in [HalfKind::F16, HalfKind::BF16] {
            let scales_g: Vec<f32> = scales.iter().step_by(2).copied().collect();
            let scales_g: Vec<f32> = match kind {
                HalfKind::F16 => scales_g,
                // bf16 cannot hold every f16 mantissa: use bf16-exact scales for this kind.
                HalfKind::BF16 => scales_g
                    .iter()
                    .map(|&s| half::bf16::from_f32(s).to_f32())
                    .collect(),
            };
            let (w, s, b) = mlx2::encode_ternary(rows, cols, 128, &codes, &scales_g, kind).unwrap();
            let view = MlxTernary::new(&w, &s, &b, kind, rows, cols, 128).unwrap();
            view.check_ternary().unwrap();
            let want: Vec<f32> = (0..scales.len()).map(|i| scales_g[i / 2]).collect();
            assert_eq!(read_all(&view), (codes.clone(), want), "MLX {kind:?}");
        }
    }

    #[test]
    fn lossy_conversions_are_refused() {
        let (rows, cols) = (2, 256);
        let (codes, mut scales) = random_matrix(rows, cols, 7);
        scales[5] *= 2.0; // row 1, columns 64..128 now differ from their neighbours
        encode_matrix(GgmlType::Q2_0, rows, cols, &codes, &scales).unwrap();
        for ty in [
            GgmlType::PQ2_0,
            GgmlType::PTQ1_0,
            GgmlType::TQ1_0,
            GgmlType::TQ2_0,
        ] {
            let msg = encode_matrix(ty, rows, cols, &codes, &scales)
                .unwrap_err()
                .to_string();
            assert!(msg.contains("row 1") && msg.contains("lossy"), "{msg}");
        }
        let (mut codes, scales) = random_matrix(rows, cols, 8);
        codes[300] = 3;
        encode_matrix(GgmlType::PQ2_0, rows, cols, &codes, &scales).unwrap();
        let msg = encode_matrix(GgmlType::PTQ1_0, rows, cols, &codes, &scales)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("row 1") && msg.contains("code 3"), "{msg}");
        let bad_scale = vec![0.1f32; rows * cols / 64];
        assert!(encode_matrix(GgmlType::Q2_0, rows, cols, &codes, &bad_scale).is_err());
    }

    #[test]
    fn view_validates_its_input() {
        assert!(GgmlTernary::new(GgmlType::Q8_0, &[], 0, 0).is_err());
        assert!(GgmlTernary::new(GgmlType::PQ2_0, &[0; 34], 1, 64).is_err());
        assert!(GgmlTernary::new(GgmlType::PQ2_0, &[0; 33], 1, 128).is_err());
        assert!(GgmlTernary::new(GgmlType::PQ2_0, &[0; 34], 1, 128).is_ok());
        let mut out = [0.0; 64];
        let dq = |ty, bytes: &[u8], n, out: &mut [f32]| crate::quant::dequantize(ty, bytes, n, out);
        assert!(dq(GgmlType::Q8_0, &[0; 33], 32, &mut out).is_err());
        assert!(dq(GgmlType::Q8_0, &[0; 34], 33, &mut out).is_err());
        assert!(dq(GgmlType::Q2_0, &[0; 18], 64, &mut out[..63]).is_err());
        assert!(dq(GgmlType::Q2_0, &[0; 18], 64, &mut out).is_ok());
    }
}
