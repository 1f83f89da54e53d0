//! Plain float tensors (F32, F16, BF16): little-endian element arrays, no blocks.
//!
//! Also the f16/bf16 scalar conversions every block format uses for its scales.

use half::{bf16, f16};

use crate::{Error, Result};

/// The 16-bit float kind of a scale tensor (MLX scales/biases follow the source model's dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfKind {
    F16,
    BF16,
}

impl HalfKind {
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            HalfKind::F16 => f16::from_bits(bits).to_f32(),
            HalfKind::BF16 => bf16::from_bits(bits).to_f32(),
        }
    }

    /// Exact conversion, or an error when `v` is not representable in this kind.
    pub fn from_f32_exact(self, v: f32) -> Result<u16> {
        let bits = match self {
            HalfKind::F16 => f16::from_f32(v).to_bits(),
            HalfKind::BF16 => bf16::from_f32(v).to_bits(),
        };
        if self.to_f32(bits).to_bits() == v.to_bits() || (v.is_nan() && self.to_f32(bits).is_nan())
        {
            Ok(bits)
        } else {
            Err(Error::InvalidArgument(format!(
                "value {v:e} is not exactly representable as {self:?}"
            )))
        }
    }
}

pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// f32 → f16 bits, refusing values that would be rounded (encoders must be lossless).
pub fn f16_exact(v: f32) -> Result<u16> {
    HalfKind::F16.from_f32_exact(v)
}

/// Reads the little-endian u16 at `bytes[at..at + 2]`.
pub(crate) fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

pub fn dequantize_f32(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * 4, "F32: byte length");
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub fn dequantize_f16(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * 2, "F16: byte length");
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_to_f32(read_u16(bytes, 2 * i));
    }
}

pub fn dequantize_bf16(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * 2, "BF16: byte length");
    for (i, o) in out.iter_mut().enumerate() {
        *o = bf16_to_f32(read_u16(bytes, 2 * i));
    }
}

pub fn encode_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Rounds to nearest f16 (lossy for values that are not f16; use `f16_exact` to check).
pub fn encode_f16(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

/// Rounds to nearest bf16.
pub fn encode_bf16(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_halves() {
        // f16: 0x3C00 = 1.0, 0xC000 = -2.0, 0x3555 ≈ 0.33325, 0x0001 = 2^-24 (smallest subnormal).
        let bytes = [0x00, 0x3C, 0x00, 0xC0, 0x55, 0x35, 0x01, 0x00];
        let mut out = [0.0; 4];
        dequantize_f16(&bytes, &mut out);
        assert_eq!(out, [1.0, -2.0, 0.333_251_95, 2f32.powi(-24)]);
        // bf16 is the top half of an f32: 0x3F80 = 1.0, 0x4049 = 3.140625.
        dequantize_bf16(&[0x80, 0x3F, 0x49, 0x40], &mut out[..2]);
        assert_eq!(out[..2], [1.0, 3.140625]);
        let mut f = [0.0; 2];
        dequantize_f32(&encode_f32(&[1.5, -0.0]), &mut f);
        assert_eq!(f[0], 1.5);
        assert!(f[1] == 0.0 && f[1].is_sign_negative());
    }

    #[test]
    fn exact_conversion_refuses_rounding() {
        assert_eq!(f16_exact(0.5).unwrap(), 0x3800);
        assert!(f16_exact(0.1).is_err());
        assert!(f16_exact(1e-9).is_err(), "below f16 subnormals");
        assert!(HalfKind::BF16.from_f32_exact(1.0 + 2f32.powi(-7)).is_ok());
        assert!(HalfKind::BF16.from_f32_exact(1.0 + 2f32.powi(-8)).is_err());
        assert_eq!(HalfKind::BF16.from_f32_exact(-2.0).unwrap(), 0xC000);
        assert_eq!(encode_f16(&[1.0]), vec![0x00, 0x3C]);
        assert_eq!(encode_bf16(&[1.0]), vec![0x80, 0x3F]);
    }
}
