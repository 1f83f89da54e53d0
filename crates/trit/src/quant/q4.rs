//! `Q4_0` (id 2) and `Q4_1` (id 3): 32 weights per block (formats.md §5.8).
//!
//! ```text
//! Q4_0, 18 bytes: f16 d; u8 qs[16]            w = (nib − 8) · d
//! Q4_1, 20 bytes: f16 d; f16 m; u8 qs[16]     w = nib · d + m
//! nib_e = qs[e] & 15 for e < 16,  qs[e − 16] >> 4 for e ≥ 16
//! ```

use super::float::{f16_exact, f16_to_f32, read_u16};
use crate::Result;

pub const BLOCK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;

fn nibble(qs: &[u8], e: usize) -> u8 {
    if e < 16 {
        qs[e] & 15
    } else {
        qs[e - 16] >> 4
    }
}

fn pack_nibbles(nibs: &[u8; BLOCK], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = (nibs[j] & 15) | (nibs[j + 16] << 4);
    }
}

pub fn dequantize_row_q4_0(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        bytes.len(),
        out.len() / BLOCK * Q4_0_BYTES,
        "Q4_0: byte length"
    );
    for (block, o) in bytes
        .chunks_exact(Q4_0_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_to_f32(read_u16(block, 0));
        for (e, w) in o.iter_mut().enumerate() {
            *w = (f32::from(nibble(&block[2..], e)) - 8.0) * d;
        }
    }
}

pub fn dequantize_row_q4_1(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        bytes.len(),
        out.len() / BLOCK * Q4_1_BYTES,
        "Q4_1: byte length"
    );
    for (block, o) in bytes
        .chunks_exact(Q4_1_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_to_f32(read_u16(block, 0));
        let m = f16_to_f32(read_u16(block, 2));
        for (e, w) in o.iter_mut().enumerate() {
            *w = f32::from(nibble(&block[4..], e)) * d + m;
        }
    }
}

/// Q4_0 block from exact parts: `nibs[e]` in 0..16 (value `nib − 8`), `d` an f16 value.
pub fn encode_q4_0(d: f32, nibs: &[u8; BLOCK]) -> Result<[u8; Q4_0_BYTES]> {
    let mut b = [0u8; Q4_0_BYTES];
    b[..2].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    pack_nibbles(nibs, &mut b[2..]);
    Ok(b)
}

/// Q4_1 block from exact parts.
pub fn encode_q4_1(d: f32, m: f32, nibs: &[u8; BLOCK]) -> Result<[u8; Q4_1_BYTES]> {
    let mut b = [0u8; Q4_1_BYTES];
    b[..2].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    b[2..4].copy_from_slice(&f16_exact(m)?.to_le_bytes());
    pack_nibbles(nibs, &mut b[4..]);
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_q4_0() {
        // d = 2.0 (0x4000). qs[0] = 0x9F: e0 = 15 → +14, e16 = 9 → +2. qs[1] = 0x08: e1 = 0, e17 = -16.
        let mut block = vec![0x00, 0x40, 0x9F, 0x08];
        block.resize(Q4_0_BYTES, 0x88); // the rest: nibble 8 → 0
        let mut out = [9.0; BLOCK];
        dequantize_row_q4_0(&block, &mut out);
        assert_eq!((out[0], out[16], out[1], out[17]), (14.0, 2.0, 0.0, -16.0));
        assert!(out
            .iter()
            .enumerate()
            .all(|(e, &w)| [0, 1, 16, 17].contains(&e) || w == 0.0));
        let mut nibs = [8u8; BLOCK];
        (nibs[0], nibs[16], nibs[1], nibs[17]) = (15, 9, 8, 0);
        assert_eq!(encode_q4_0(2.0, &nibs).unwrap().to_vec(), block);
    }

    #[test]
    fn hand_made_q4_1() {
        // d = 0.5 (0x3800), m = -1.0 (0xBC00). qs[3] = 0x2F: e3 = 15 → 6.5, e19 = 2 → 0.0.
        let mut block = vec![0x00, 0x38, 0x00, 0xBC, 0, 0, 0, 0x2F];
        block.resize(Q4_1_BYTES, 0);
        let mut out = [0.0; BLOCK];
        dequantize_row_q4_1(&block, &mut out);
        assert_eq!((out[3], out[19], out[0]), (6.5, 0.0, -1.0));
        let mut nibs = [0u8; BLOCK];
        (nibs[3], nibs[19]) = (15, 2);
        assert_eq!(encode_q4_1(0.5, -1.0, &nibs).unwrap().to_vec(), block);
    }
}
