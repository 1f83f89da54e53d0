//! The sequential 2-bit ternary codec shared by three block types (formats.md §5.1, §5.2):
//!
//! ```text
//! Q2_0 (id 42)              G = 64,  18 bytes
//! legacy Prism Q2_0 (id 42) G = 128, 34 bytes
//! PQ2_0 (id 142)            G = 128, 34 bytes
//!
//! offset 0 : f16 d                                   (scale FIRST)
//! offset 2 : u8  qs[G / 4]
//! q_e = (qs[e >> 2] >> (2·(e & 3))) & 3,   w_e = (q_e − 1) · d
//! ```
//!
//! Code 3 (= +2) is representable and decoded as such.

use super::float::{f16_exact, f16_to_f32, read_u16};
use crate::{Error, Result};

/// Bytes of a block holding `group` weights.
pub const fn block_bytes(group: usize) -> usize {
    2 + group / 4
}

/// Fills `codes` (its length is the group size) and returns the block's scale.
/// `SPREAD[b]` = the four 2-bit fields of `b`, lowest first.
const SPREAD: [[u8; 4]; 256] = {
    let mut t = [[0u8; 4]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [
            (b & 3) as u8,
            ((b >> 2) & 3) as u8,
            ((b >> 4) & 3) as u8,
            ((b >> 6) & 3) as u8,
        ];
        b += 1;
    }
    t
};

pub fn decode_block(block: &[u8], codes: &mut [u8]) -> f32 {
    let qs = &block[2..2 + codes.len() / 4];
    // Four codes per byte, lowest bits first; spread through a 256-entry table (one load and
    // one 4-byte store per byte: model loading decodes every weight once).
    for (four, &b) in codes.chunks_exact_mut(4).zip(qs) {
        four.copy_from_slice(&SPREAD[b as usize]);
    }
    f16_to_f32(read_u16(block, 0))
}

/// Writes one block of `codes.len()` codes (each 0..=3) with scale `d` (must be an f16 value).
pub fn encode_block(d: f32, codes: &[u8], block: &mut [u8]) -> Result<()> {
    block[..2].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    let qs = &mut block[2..2 + codes.len() / 4];
    qs.fill(0);
    for (e, &c) in codes.iter().enumerate() {
        if c > 3 {
            return Err(Error::InvalidArgument(format!(
                "2-bit code {c} out of range"
            )));
        }
        qs[e >> 2] |= c << (2 * (e & 3));
    }
    Ok(())
}

/// Decodes `out.len()` weights stored in blocks of `group` (64 or 128).
pub fn dequantize_row(group: usize, bytes: &[u8], out: &mut [f32]) {
    let bb = block_bytes(group);
    assert_eq!(
        bytes.len(),
        out.len() / group * bb,
        "Q2_0 g{group}: byte length"
    );
    let mut codes = vec![0u8; group];
    for (block, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(group)) {
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
    fn hand_made_g64_block() {
        // d = 0.5 (f16 0x3800). qs[0] = 0b11_10_01_00: elements 0..3 have codes 0, 1, 2, 3.
        // qs[15] = 0b00_00_10_10: elements 60, 61 code 2; 62, 63 code 0. Others 0x55 (code 1).
        let mut block = vec![0x00, 0x38, 0b1110_0100];
        block.resize(17, 0x55);
        block.push(0b0000_1010);
        assert_eq!(block.len(), block_bytes(64));
        let mut out = [9.0; 64];
        dequantize_row(64, &block, &mut out);
        assert_eq!(out[..4], [-0.5, 0.0, 0.5, 1.0]);
        assert_eq!(out[60..], [0.5, 0.5, -0.5, -0.5]);
        assert!(out[4..60].iter().all(|&w| w == 0.0));

        let mut codes = [1u8; 64];
        codes[..4].copy_from_slice(&[0, 1, 2, 3]);
        codes[60..].copy_from_slice(&[2, 2, 0, 0]);
        let mut enc = [0u8; 18];
        encode_block(0.5, &codes, &mut enc).unwrap();
        assert_eq!(enc.to_vec(), block);
    }

    #[test]
    fn hand_made_g128_block() {
        // d = -2.0 (0xC000; a negative scale flips signs). Element 127 = bits 6-7 of qs[31].
        let mut block = vec![0x00, 0xC0];
        block.resize(block_bytes(128), 0x55);
        block[2 + 31] = 0b0001_0101; // element 127 code 0 → +2.0
        block[2 + 8] = 0b0101_0110; // element 32 code 2 → -2.0
        let mut out = [0.0; 128];
        dequantize_row(128, &block, &mut out);
        assert_eq!((out[127], out[32], out[33]), (2.0, -2.0, -0.0));
        let mut codes = [0u8; 128];
        assert_eq!(decode_block(&block, &mut codes), -2.0);
        assert_eq!((codes[127], codes[32], codes[126]), (0, 2, 1));
    }

    #[test]
    fn encoder_rejects_bad_input() {
        let mut b = [0u8; 18];
        assert!(
            encode_block(0.3, &[1; 64], &mut b).is_err(),
            "0.3 is not an f16"
        );
        assert!(encode_block(1.0, &[4; 64], &mut b).is_err());
    }
}
