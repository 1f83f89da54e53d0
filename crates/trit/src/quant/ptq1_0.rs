//! `PTQ1_0` (id 143, PrismML fork): 128 ternary weights per 28-byte block (formats.md §5.3).
//!
//! ```text
//! offset 0  : u8  qs[24]    5 trits per byte, stages {32, 16, 8} → one 16-byte, one 8-byte stage
//! offset 24 : u8  qh[2]     4 trits per byte
//! offset 26 : f16 d         (scale LAST)
//! e in 0..79    : trit e/16        of qs[e % 16]
//! e in 80..119  : trit (e−80)/8    of qs[16 + (e−80) % 8]
//! e in 120..127 : trit (e−120)/2   of qh[(e−120) % 2]
//! w_e = (t_e − 1) · d           (trit codec: trit3.rs)
//! ```

use super::float::{f16_exact, f16_to_f32, read_u16};
use super::trit3;
use crate::Result;

pub const BLOCK: usize = 128;
pub const BYTES: usize = 28;
const STAGES: [usize; 3] = [32, 16, 8];

/// Fills 128 codes (0..=2) and returns the scale.
pub fn decode_block(block: &[u8], codes: &mut [u8]) -> f32 {
    trit3::decode_staged(&block[..24], &block[24..26], &STAGES, &mut codes[..BLOCK]);
    f16_to_f32(read_u16(block, 26))
}

/// Encodes 128 codes (0..=2; code 3 is an error) with scale `d` (an f16 value).
pub fn encode_block(d: f32, codes: &[u8], block: &mut [u8]) -> Result<()> {
    let bits = f16_exact(d)?;
    let (qs, rest) = block[..BYTES].split_at_mut(24);
    let (qh, dd) = rest.split_at_mut(2);
    trit3::encode_staged(&codes[..BLOCK], &STAGES, qs, qh)?;
    dd.copy_from_slice(&bits.to_le_bytes());
    Ok(())
}

pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        bytes.len(),
        out.len() / BLOCK * BYTES,
        "PTQ1_0: byte length"
    );
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
        // Every qs byte 128 = five "1" trits (zeros), every qh byte 127 = four "1" trits; d = 2.0.
        let mut block = [128u8; BYTES];
        block[24..26].copy_from_slice(&[127, 127]);
        block[26..].copy_from_slice(&[0x00, 0x40]);
        block[0] = 109; // trits (1,0,2,1,1) → elements 0, 16, 32, 48, 64
        block[16] = 229; // trits (2,2,0,0,1) → elements 80, 88, 96, 104, 112
        block[25] = 76; // trits (0,2,2,0)   → elements 121, 123, 125, 127
        let mut out = [9.0; BLOCK];
        dequantize_row(&block, &mut out);
        let expect = [
            (16, -2.0),
            (32, 2.0),
            (80, 2.0),
            (88, 2.0),
            (96, -2.0),
            (104, -2.0),
            (121, -2.0),
            (123, 2.0),
            (125, 2.0),
            (127, -2.0),
        ];
        for (e, w) in out.iter().enumerate() {
            let want = expect.iter().find(|p| p.0 == e).map_or(0.0, |p| p.1);
            assert_eq!(*w, want, "element {e}");
        }
        let mut codes = [0u8; BLOCK];
        assert_eq!(decode_block(&block, &mut codes), 2.0);
        let mut enc = [0u8; BYTES];
        encode_block(2.0, &codes, &mut enc).unwrap();
        assert_eq!(enc, block);
    }
}
