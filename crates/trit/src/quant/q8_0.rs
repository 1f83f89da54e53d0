//! `Q8_0` (id 8): 32 weights per 34-byte block (formats.md §5.8).
//!
//! ```text
//! offset 0 : f16 d
//! offset 2 : i8  qs[32]          w_e = qs[e] · d
//! ```

use super::float::{f16_exact, f16_to_f32, read_u16};
use crate::Result;

pub const BLOCK: usize = 32;
pub const BYTES: usize = 34;

/// Decodes `out.len()` weights (a multiple of 32) from `bytes`.
pub fn dequantize_row(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() / BLOCK * BYTES, "Q8_0: byte length");
    for (block, o) in bytes.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(read_u16(block, 0));
        for (w, &q) in o.iter_mut().zip(&block[2..]) {
            *w = f32::from(q as i8) * d;
        }
    }
}

/// One block from its exact parts (`d` must be an f16 value).
pub fn encode_block(d: f32, qs: &[i8; BLOCK]) -> Result<[u8; BYTES]> {
    let mut b = [0u8; BYTES];
    b[..2].copy_from_slice(&f16_exact(d)?.to_le_bytes());
    for (o, &q) in b[2..].iter_mut().zip(qs) {
        *o = q as u8;
    }
    Ok(b)
}

/// The usual lossy quantizer (`d = max|x| / 127`, round to nearest), for test data and
/// activations; lossless only for values that already are `q · d` with an f16 `d`.
pub fn quantize_row(values: &[f32]) -> Vec<u8> {
    assert_eq!(values.len() % BLOCK, 0, "Q8_0: length");
    let mut out = Vec::with_capacity(values.len() / BLOCK * BYTES);
    for x in values.chunks_exact(BLOCK) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = half::f16::from_f32(amax / 127.0);
        let inv = if d.to_f32() == 0.0 {
            0.0
        } else {
            1.0 / d.to_f32()
        };
        out.extend_from_slice(&d.to_bits().to_le_bytes());
        out.extend(
            x.iter()
                .map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_block() {
        // d = 0.5 (f16 0x3800); qs = 0, 1, -1, 127, -128, then 2s.
        let mut block = vec![0x00, 0x38, 0x00, 0x01, 0xFF, 0x7F, 0x80];
        block.resize(BYTES, 0x02);
        let mut out = [0.0; BLOCK];
        dequantize_row(&block, &mut out);
        assert_eq!(out[..5], [0.0, 0.5, -0.5, 63.5, -64.0]);
        assert!(out[5..].iter().all(|&w| w == 1.0));
        let mut qs = [2i8; BLOCK];
        qs[..5].copy_from_slice(&[0, 1, -1, 127, -128]);
        assert_eq!(encode_block(0.5, &qs).unwrap().to_vec(), block);
        assert!(encode_block(0.1, &qs).is_err());
    }

    #[test]
    fn quantizer_is_exact_on_grid_values() {
        // max |x| = 127 · 0.25 → d = 0.25 exactly; every value is a multiple of d.
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 255) as f32 * 0.25 - 31.75)
            .collect();
        let mut back = vec![0.0; 64];
        dequantize_row(&quantize_row(&x), &mut back);
        assert_eq!(back, x);
    }
}
