//! `TQ2_0` (id 35, upstream): 256 ternary weights per 66-byte block (formats.md §5.5).
//!
//! ```text
//! offset 0  : u8  qs[64]
//! offset 64 : f16 d          (scale LAST)
//! element e = 128·c + 32·l + m  ←  q = (qs[32·c + m] >> (2·l)) & 3     c ∈ 0..2, l ∈ 0..4, m ∈ 0..32
//! w_e = (q − 1) · d
//! ```
//!
//! Byte `m` of each 32-byte half carries elements m, m+32, m+64, m+96 (column interleave).

use super::float::{f16_exact, f16_to_f32, read_u16};
use crate::{Error, Result};

pub const BLOCK: usize = 256;
pub const BYTES: usize = 66;

/// Fills 256 codes (0..=3) and returns the scale.
pub fn decode_block(block: &[u8], codes: &mut [u8]) -> f32 {
    // Element e = 128·c + 32·l + m sits in bits 2l of byte 32·c + m. Looping in that order
    // keeps the inner loop a contiguous shift-and-mask, which the compiler vectorizes
    // (model loading decodes every weight once).
    for (c, half) in codes[..BLOCK].chunks_exact_mut(128).enumerate() {
        let bytes = &block[32 * c..32 * c + 32];
        for (l, run) in half.chunks_exact_mut(32).enumerate() {
            for (code, &b) in run.iter_mut().zip(bytes) {
                *code = (b >> (2 * l)) & 3;
            }
        }
    }
    f16_to_f32(read_u16(block, 64))
}

/// Encodes 256 codes (0..=3) with scale `d` (an f16 value).
pub fn encode_block(d: f32, codes: &[u8], block: &mut [u8]) -> Result<()> {
    block[64..66].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    block[..64].fill(0);
    for (e, &q) in codes[..BLOCK].iter().enumerate() {
        if q > 3 {
            return Err(Error::InvalidArgument(format!(
                "2-bit code {q} out of range"
            )));
        }
        let (c, l, m) = (e / 128, (e / 32) % 4, e % 32);
        block[32 * c + m] |= q << (2 * l);
    }
    Ok(())
}

pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() / BLOCK * BYTES, "TQ2_0: byte length");
    let mut codes = [0u8; BLOCK];
    for (block, o) in bytes.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = decode_block(block, &mut codes);
        for (w, &q) in o.iter_mut().zip(&codes) {
            *w = (f32::from(q) - 1.0) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_block() {
        // d = 0.5. qs[5] = 0b10_01_00_10: elements 5, 37, 69, 101 get codes 2, 0, 1, 2.
        // qs[63] = 0b00_11_01_10: elements 159, 191, 223, 255 get codes 2, 1, 3, 0.
        let mut block = [0x55u8; BYTES];
        block[64..].copy_from_slice(&[0x00, 0x38]);
        block[5] = 0b1001_0010;
        block[63] = 0b0011_0110;
        let mut out = [9.0; BLOCK];
        dequantize_row(&block, &mut out);
        let expect = [
            (5, 0.5),
            (37, -0.5),
            (101, 0.5),
            (159, 0.5),
            (223, 1.0),
            (255, -0.5),
        ];
        for (e, w) in out.iter().enumerate() {
            let want = expect.iter().find(|p| p.0 == e).map_or(0.0, |p| p.1);
            assert_eq!(*w, want, "element {e}");
        }
        let mut codes = [0u8; BLOCK];
        decode_block(&block, &mut codes);
        let mut enc = [0u8; BYTES];
        encode_block(0.5, &codes, &mut enc).unwrap();
        assert_eq!(enc, block);
    }
}
