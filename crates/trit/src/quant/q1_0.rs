//! `Q1_0` (id 41): 128 binary weights per 18-byte block (formats.md §5.6). Not ternary.
//!
//! ```text
//! offset 0 : f16 d
//! offset 2 : u8  qs[16]
//! b_e = (qs[e >> 3] >> (e & 7)) & 1,   w_e = b_e ? +d : −d
//! ```

use super::float::{f16_exact, f16_to_f32, read_u16};
use crate::{Error, Result};

pub const BLOCK: usize = 128;
pub const BYTES: usize = 18;

pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() / BLOCK * BYTES, "Q1_0: byte length");
    for (block, o) in bytes.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(read_u16(block, 0));
        for (e, w) in o.iter_mut().enumerate() {
            *w = if (block[2 + (e >> 3)] >> (e & 7)) & 1 == 1 {
                d
            } else {
                -d
            };
        }
    }
}

/// One block as ternary codes (`t + 1`: bit 1 → 2, bit 0 → 0) and its scale `d`.
pub fn decode_block(block: &[u8], codes: &mut [u8]) -> f32 {
    for (e, c) in codes[..BLOCK].iter_mut().enumerate() {
        *c = ((block[2 + (e >> 3)] >> (e & 7)) & 1) << 1;
    }
    f16_to_f32(read_u16(block, 0))
}

/// One block from its scale and 128 sign bits (`true` = +d).
pub fn encode_block(d: f32, bits: &[bool]) -> Result<[u8; BYTES]> {
    let mut b = [0u8; BYTES];
    b[..2].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    for (e, &bit) in bits[..BLOCK].iter().enumerate() {
        b[2 + (e >> 3)] |= u8::from(bit) << (e & 7);
    }
    Ok(b)
}

/// Lossless encoder from values: every block must be `±d` for one f16 `d ≥ 0`.
pub fn encode_row(values: &[f32]) -> Result<Vec<u8>> {
    if !values.len().is_multiple_of(BLOCK) {
        return Err(Error::InvalidArgument(format!(
            "Q1_0: row length {} is not a multiple of {BLOCK}",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len() / BLOCK * BYTES);
    for (i, x) in values.chunks_exact(BLOCK).enumerate() {
        let d = x[0].abs();
        if x.iter().any(|v| v.abs() != d) {
            return Err(Error::InvalidArgument(format!(
                "Q1_0: block {i} has values of different magnitudes (not binary)"
            )));
        }
        let bits: Vec<bool> = x.iter().map(|v| v.is_sign_positive()).collect();
        out.extend_from_slice(&encode_block(d, &bits)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_block() {
        // d = 0.25 (0x3400). qs[0] = 0b0000_0101 → e0 +, e1 −, e2 +; qs[15] = 0x80 → e127 +.
        let mut block = [0u8; BYTES];
        block[..3].copy_from_slice(&[0x00, 0x34, 0b0000_0101]);
        block[17] = 0x80;
        let mut out = [0.0; BLOCK];
        dequantize_row(&block, &mut out);
        assert_eq!(out[..4], [0.25, -0.25, 0.25, -0.25]);
        assert_eq!((out[126], out[127]), (-0.25, 0.25));
        assert_eq!(out.iter().filter(|&&w| w > 0.0).count(), 3);
        assert_eq!(encode_row(&out).unwrap(), block.to_vec());
        let mut bad = out;
        bad[9] = 0.5;
        assert!(encode_row(&bad)
            .unwrap_err()
            .to_string()
            .contains("block 0"));
    }
}
