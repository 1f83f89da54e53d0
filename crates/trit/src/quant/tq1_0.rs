//! `TQ1_0` (id 34, upstream): 256 ternary weights per 54-byte block (formats.md §5.4).
//!
//! ```text
//! offset 0  : u8  qs[48]    5 trits per byte: one 32-byte stage, one 16-byte stage
//! offset 48 : u8  qh[4]     4 trits per byte
//! offset 52 : f16 d         (scale LAST)
//! e in 0..159   : trit e/32          of qs[e % 32]
//! e in 160..239 : trit (e−160)/16    of qs[32 + (e−160) % 16]
//! e in 240..255 : trit (e−240)/4     of qh[(e−240) % 4]
//! w_e = (t_e − 1) · d           (trit codec: trit3.rs)
//! ```

use super::float::{f16_exact, f16_to_f32, read_u16};
use super::trit3;
use crate::Result;

pub const BLOCK: usize = 256;
pub const BYTES: usize = 54;
const STAGES: [usize; 2] = [32, 16];

/// Fills 256 codes (0..=2) and returns the scale.
pub fn decode_block(block: &[u8], codes: &mut [u8]) -> f32 {
    trit3::decode_staged(&block[..48], &block[48..52], &STAGES, &mut codes[..BLOCK]);
    f16_to_f32(read_u16(block, 52))
}

/// Encodes 256 codes (0..=2) with scale `d` (an f16 value).
pub fn encode_block(d: f32, codes: &[u8], block: &mut [u8]) -> Result<()> {
    let bits = f16_exact(d)?;
    let (qs, rest) = block[..BYTES].split_at_mut(48);
    let (qh, dd) = rest.split_at_mut(4);
    trit3::encode_staged(&codes[..BLOCK], &STAGES, qs, qh)?;
    dd.copy_from_slice(&bits.to_le_bytes());
    Ok(())
}

pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() / BLOCK * BYTES, "TQ1_0: byte length");
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
        // qs bytes 128 and qh bytes 127 decode to all-"1" trits (zero weights); d = 0.5.
        let mut block = [128u8; BYTES];
        block[48..52].fill(127);
        block[52..].copy_from_slice(&[0x00, 0x38]);
        block[0] = 109; // (1,0,2,1,1) → elements 0, 32, 64, 96, 128
        block[32] = 229; // (2,2,0,0,1) → elements 160, 176, 192, 208, 224
        block[51] = 76; // (0,2,2,0)   → elements 243, 247, 251, 255
        let mut out = [9.0; BLOCK];
        dequantize_row(&block, &mut out);
        let expect = [
            (32, -0.5),
            (64, 0.5),
            (160, 0.5),
            (176, 0.5),
            (192, -0.5),
            (208, -0.5),
            (243, -0.5),
            (247, 0.5),
            (251, 0.5),
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
