//! MLX affine 2-bit (Ternary Bonsai `*-mlx-2bit` folders, formats.md §3), and 1-bit (1-bit
//! Bonsai's MLX packs: `bits = 1`, element k at bit k of the little-endian words,
//! `scale = 2s`, `bias = −s`, so codes 0/1 decode to −s/+s — read as ternary −1/+1).
//!
//! ```text
//! <path>.weight  uint32 [out, in/16]     16 codes per word, element k at bits 2·(k mod 16), LSB-first
//!                                        (as little-endian bytes: byte k/4, bits 2·(k mod 4))
//! <path>.scales  f16/bf16 [out, in/G]    one per group of G (128 for Bonsai)
//! <path>.biases  f16/bf16 [out, in/G]
//! w = scale · q + bias                   (generic affine 2-bit)
//! ternary iff bias == −scale bit for bit in every group: codes 0/1/2 → −s/0/+s
//! ```

use super::float::{read_u16, HalfKind};
use super::TernaryRows;
use crate::{Error, Result};

/// Generic affine decode of one row: `codes` holds `out.len() / 4` bytes, `scales`/`biases` one
/// value per `group` weights.
pub fn dequantize_row(codes: &[u8], scales: &[f32], biases: &[f32], group: usize, out: &mut [f32]) {
    assert_eq!(codes.len() * 4, out.len(), "MLX 2-bit: code bytes");
    assert_eq!(scales.len() * group, out.len(), "MLX 2-bit: scales");
    assert_eq!(biases.len(), scales.len(), "MLX 2-bit: biases");
    for (k, w) in out.iter_mut().enumerate() {
        let q = (codes[k / 4] >> (2 * (k % 4))) & 3;
        *w = scales[k / group] * f32::from(q) + biases[k / group];
    }
}

/// The three tensors of one quantized module, `rows × cols` (cols = input width).
#[derive(Clone, Copy, Debug)]
pub struct MlxTernary<'a> {
    /// The uint32 words as little-endian bytes (`rows · cols / 4`).
    pub codes: &'a [u8],
    /// `rows · cols / group_size` values of `scale_dtype`, little-endian.
    pub scales: &'a [u8],
    pub biases: &'a [u8],
    pub scale_dtype: HalfKind,
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
    /// Bits per code: 2 (ternary packs) or 1 (binary packs).
    pub bits: usize,
}

impl<'a> MlxTernary<'a> {
    /// A 2-bit module; checks sizes, not ternarity (see `check_ternary`).
    pub fn new(
        codes: &'a [u8],
        scales: &'a [u8],
        biases: &'a [u8],
        scale_dtype: HalfKind,
        rows: usize,
        cols: usize,
        group_size: usize,
    ) -> Result<Self> {
        Self::with_bits(
            codes,
            scales,
            biases,
            scale_dtype,
            rows,
            cols,
            group_size,
            2,
        )
    }

    /// A module of `bits`-bit codes (1 or 2).
    #[allow(clippy::too_many_arguments)]
    pub fn with_bits(
        codes: &'a [u8],
        scales: &'a [u8],
        biases: &'a [u8],
        scale_dtype: HalfKind,
        rows: usize,
        cols: usize,
        group_size: usize,
        bits: usize,
    ) -> Result<Self> {
        if !matches!(bits, 1 | 2) {
            return Err(Error::Unsupported(format!(
                "MLX {bits}-bit codes; trit reads 2-bit (ternary) and 1-bit (binary) packs"
            )));
        }
        if group_size == 0 || !group_size.is_multiple_of(64) || !cols.is_multiple_of(group_size) {
            return Err(Error::Unsupported(format!(
                "MLX 2-bit group size {group_size} with width {cols} (need a multiple of 64 \
                 dividing the width)"
            )));
        }
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| Error::Format(format!("MLX 2-bit shape {rows}×{cols} overflows")))?;
        let groups = n / group_size;
        let code_bytes = n * bits / 8;
        if codes.len() != code_bytes || scales.len() != 2 * groups || biases.len() != 2 * groups {
            return Err(Error::Format(format!(
                "MLX {bits}-bit {rows}×{cols} (group {group_size}) needs {} code bytes and {groups} \
                 scales/biases; got {} bytes, {} and {} values",
                code_bytes,
                codes.len(),
                scales.len() / 2,
                biases.len() / 2
            )));
        }
        Ok(MlxTernary {
            codes,
            scales,
            biases,
            scale_dtype,
            rows,
            cols,
            group_size,
            bits,
        })
    }

    fn scale_bits(&self, g: usize) -> u16 {
        read_u16(self.scales, 2 * g)
    }

    fn bias_bits(&self, g: usize) -> u16 {
        read_u16(self.biases, 2 * g)
    }

    /// Ok when every group has `bias == −scale` bit for bit (sign flip), the condition under
    /// which the codes are ternary. Otherwise names the first offending group.
    /// For 1-bit codes the condition is `scale == −2·bias` (codes 0/1 → −s/+s).
    pub fn check_ternary(&self) -> Result<()> {
        let per_row = self.cols / self.group_size;
        for g in 0..self.rows * per_row {
            let (s, b) = (self.scale_bits(g), self.bias_bits(g));
            if self.bits == 1 {
                let (sf, bf) = (self.scale_dtype.to_f32(s), self.scale_dtype.to_f32(b));
                if sf != -2.0 * bf {
                    return Err(Error::Unsupported(format!(
                        "not a binary MLX tensor: row {}, group {} has scale {sf} and bias {bf} \
                         (a 1-bit ±s pack needs scale == -2·bias)",
                        g / per_row,
                        g % per_row,
                    )));
                }
                continue;
            }
            if b != s ^ 0x8000 {
                return Err(Error::Unsupported(format!(
                    "not a ternary MLX tensor: row {}, group {} has scale {} and bias {} \
                     (ternary needs bias == -scale); a generic 2-bit model needs the affine path",
                    g / per_row,
                    g % per_row,
                    self.scale_dtype.to_f32(s),
                    self.scale_dtype.to_f32(b)
                )));
            }
        }
        Ok(())
    }

    /// True when some code is 3 (with `bias == −scale` that decodes to `+2·s`).
    pub fn has_code3(&self) -> bool {
        // A byte holds four codes; a code is 3 when both of its bits are set.
        self.bits == 2 && self.codes.iter().any(|&b| b & (b >> 1) & 0x55 != 0)
    }

    /// Generic affine dequantization of row `r` (valid whether or not the tensor is ternary).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let per_row = self.cols / self.group_size;
        let groups = r * per_row..(r + 1) * per_row;
        let scales: Vec<f32> = groups
            .clone()
            .map(|g| self.scale_dtype.to_f32(self.scale_bits(g)))
            .collect();
        let biases: Vec<f32> = groups
            .map(|g| self.scale_dtype.to_f32(self.bias_bits(g)))
            .collect();
        let row_bytes = self.cols * self.bits / 8;
        let codes = &self.codes[r * row_bytes..(r + 1) * row_bytes];
        if self.bits == 2 {
            dequantize_row(codes, &scales, &biases, self.group_size, out);
            return;
        }
        for (k, w) in out[..self.cols].iter_mut().enumerate() {
            let q = (codes[k / 8] >> (k % 8)) & 1;
            *w = scales[k / self.group_size] * f32::from(q) + biases[k / self.group_size];
        }
    }
}

impl TernaryRows for MlxTernary<'_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    /// Codes are the stored 2-bit values (= t + 1 when `check_ternary` passed), or for 1-bit
    /// packs 2·bit (t = ±1) with the group's scale −bias (= s); the scale of a group is repeated
    /// for each of its 64-column slices.
    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        let row_bytes = self.cols * self.bits / 8;
        let bytes = &self.codes[r * row_bytes..(r + 1) * row_bytes];
        for (k, c) in codes[..self.cols].iter_mut().enumerate() {
            *c = if self.bits == 2 {
                (bytes[k / 4] >> (2 * (k % 4))) & 3
            } else {
                ((bytes[k / 8] >> (k % 8)) & 1) << 1
            };
        }
        let per_row = self.cols / self.group_size;
        let slices = self.group_size / 64;
        for g in 0..per_row {
            let at = r * per_row + g;
            let s = if self.bits == 2 {
                self.scale_dtype.to_f32(self.scale_bits(at))
            } else {
                -self.scale_dtype.to_f32(self.bias_bits(at))
            };
            scales[g * slices..(g + 1) * slices].fill(s);
        }
    }
}

/// Writes a ternary matrix (codes `t + 1` row-major, one scale per group) as MLX 2-bit tensors:
/// returns (code bytes, scales, biases) with `bias = −scale`. Scales must be exact in `kind`.
pub fn encode_ternary(
    rows: usize,
    cols: usize,
    group_size: usize,
    codes: &[u8],
    scales: &[f32],
    kind: HalfKind,
) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    if group_size == 0
        || !cols.is_multiple_of(group_size)
        || codes.len() != rows * cols
        || scales.len() != rows * cols / group_size
    {
        return Err(Error::InvalidArgument(format!(
            "MLX 2-bit {rows}×{cols} group {group_size}: got {} codes and {} scales",
            codes.len(),
            scales.len()
        )));
    }
    let mut packed = vec![0u8; rows * cols / 4];
    for (k, &c) in codes.iter().enumerate() {
        if c > 3 {
            return Err(Error::InvalidArgument(format!(
                "2-bit code {c} at element {k}"
            )));
        }
        packed[k / 4] |= c << (2 * (k % 4));
    }
    let (mut s_out, mut b_out) = (
        Vec::with_capacity(2 * scales.len()),
        Vec::with_capacity(2 * scales.len()),
    );
    for &s in scales {
        let bits = kind.from_f32_exact(s)?;
        s_out.extend_from_slice(&bits.to_le_bytes());
        b_out.extend_from_slice(&(bits ^ 0x8000).to_le_bytes());
    }
    Ok((packed, s_out, b_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_row() {
        // One row of 128: word 0 = 0x0000_00E4 → elements 0..3 have codes 0, 1, 2, 3; word 7's top
        // byte 0b10_00_00_00 → element 127 code 2. Other codes 0 (bytes 0x00).
        let mut codes = [0u8; 32];
        codes[0] = 0xE4;
        codes[31] = 0b1000_0000;
        // Ternary: scale 0.5 (f16 0x3800), bias -0.5 (0xB800).
        let m = MlxTernary::new(
            &codes,
            &[0x00, 0x38],
            &[0x00, 0xB8],
            HalfKind::F16,
            1,
            128,
            128,
        )
        .unwrap();
        m.check_ternary().unwrap();
        assert!(m.has_code3());
        let mut out = [0.0; 128];
        m.dequantize_row(0, &mut out);
        assert_eq!(out[..4], [-0.5, 0.0, 0.5, 1.0]);
        assert_eq!((out[4], out[126], out[127]), (-0.5, -0.5, 0.5));
        let (mut c, mut s) = ([9u8; 128], [0.0f32; 2]);
        m.row(0, &mut c, &mut s);
        assert_eq!(
            (c[..4].to_vec(), c[127], s),
            (vec![0, 1, 2, 3], 2, [0.5, 0.5])
        );

        // Generic affine (bf16 scale 0.25 = 0x3E80, bias 1.0 = 0x3F80): 1.0, 1.25, 1.5, 1.75.
        let g = MlxTernary::new(
            &codes,
            &[0x80, 0x3E],
            &[0x80, 0x3F],
            HalfKind::BF16,
            1,
            128,
            128,
        )
        .unwrap();
        g.dequantize_row(0, &mut out);
        assert_eq!(out[..4], [1.0, 1.25, 1.5, 1.75]);
        let msg = g.check_ternary().unwrap_err().to_string();
        assert!(
            msg.contains("row 0, group 0") && msg.contains("bias == -scale"),
            "{msg}"
        );
    }

    #[test]
    fn one_bit_packs_read_as_plus_minus_s() {
        // 128 weights, bit k of the little-endian words: bits 0 and 127 set.
        let mut codes = [0u8; 16];
        codes[0] = 1;
        codes[15] = 0x80;
        // scale 2s = 1.0 (0x3C00), bias -s = -0.5 (0xB800).
        let m = MlxTernary::with_bits(
            &codes,
            &[0x00, 0x3C],
            &[0x00, 0xB8],
            HalfKind::F16,
            1,
            128,
            128,
            1,
        )
        .unwrap();
        m.check_ternary().unwrap();
        assert!(!m.has_code3());
        let mut out = [0.0; 128];
        m.dequantize_row(0, &mut out);
        assert_eq!((out[0], out[1], out[126], out[127]), (0.5, -0.5, -0.5, 0.5));
        let (mut c, mut s) = ([9u8; 128], [0.0f32; 2]);
        m.row(0, &mut c, &mut s);
        assert_eq!((c[0], c[1], c[127], s), (2, 0, 2, [0.5, 0.5]));
        // bias -0.25 with scale 1.0 is affine, not ±s.
        let bad = MlxTernary::with_bits(
            &codes,
            &[0x00, 0x3C],
            &[0x00, 0xB4],
            HalfKind::F16,
            1,
            128,
            128,
            1,
        )
        .unwrap();
        assert!(bad
            .check_ternary()
            .unwrap_err()
            .to_string()
            .contains("scale == -2·bias"));
        assert!(
            MlxTernary::with_bits(&codes, &[0, 0], &[0, 0], HalfKind::F16, 1, 128, 128, 3).is_err()
        );
    }

    #[test]
    fn check_names_the_bad_group() {
        let codes = [0x55u8; 2 * 256 / 4];
        let scales: Vec<u8> = [1.0f32, 2.0, 0.5, 0.25]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let mut biases: Vec<u8> = scales
            .chunks(2)
            .flat_map(|b| (u16::from_le_bytes([b[0], b[1]]) ^ 0x8000).to_le_bytes())
            .collect();
        let m = MlxTernary::new(&codes, &scales, &biases, HalfKind::F16, 2, 256, 128).unwrap();
        m.check_ternary().unwrap();
        assert!(!m.has_code3());
        biases[6] ^= 1; // row 1, group 1: bias off by one ulp
        let m = MlxTernary::new(&codes, &scales, &biases, HalfKind::F16, 2, 256, 128).unwrap();
        assert!(m
            .check_ternary()
            .unwrap_err()
            .to_string()
            .contains("row 1, group 1"));
        assert!(MlxTernary::new(&codes, &scales, &biases, HalfKind::F16, 2, 256, 32).is_err());
        assert!(
            MlxTernary::new(&codes[1..], &scales, &biases, HalfKind::F16, 2, 256, 128).is_err()
        );
    }
}
