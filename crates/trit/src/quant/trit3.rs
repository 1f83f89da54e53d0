//! The base-3 trit codec of `PTQ1_0` and `TQ1_0` (formats.md §6) and their staged element order.
//!
//! A byte holds five trits `t0..t4` (each 0..=2, `t0` most significant) as the fixed-point
//! fraction `b ≈ 256 · v / 243`, `v = 81·t0 + 27·t1 + 9·t2 + 3·t3 + t4`. Trit `n` is the integer
//! part of `3 · frac(b · 3^n / 256)`:
//!
//! ```text
//! t_n = ( ((b · 3^n) mod 256) · 3 ) >> 8
//! ```
//!
//! The encoder must round **up** (`b = ceil(256 v / 243)`): with a floor, 242 of the 243 patterns
//! decode wrongly. Four-trit bytes (`qh`) are encoded as five trits with `t4 = 0`.
//!
//! Staged order: the `qs` bytes are consumed in stages of `c` bytes (e.g. 32, then 16); a stage
//! holds elements `e0 + n·c + m` as trit `n` of byte `m`. The `qh` bytes then hold the last
//! elements as `e0 + n·len(qh) + m`, four trits each.

use crate::{Error, Result};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0..5) of byte `b`, in 0..=2 (the ternary code `t + 1`).
pub fn decode_trit(b: u8, n: usize) -> u8 {
    let x = b.wrapping_mul(POW3[n]);
    ((u16::from(x) * 3) >> 8) as u8
}

/// Packs up to five trits (missing trailing ones are 0) with the ceiling rounding.
pub fn encode_trits(trits: &[u8]) -> u8 {
    debug_assert!(trits.len() <= 5 && trits.iter().all(|&t| t <= 2));
    let v = (0..5).fold(0u32, |v, n| {
        v * 3 + u32::from(trits.get(n).copied().unwrap_or(0))
    });
    (256 * v).div_ceil(243) as u8
}

/// Element index ranges of a staged layout, visited in storage order: calls
/// `f(element, byte_index_in_qs_or_qh, trit, is_qh)`.
fn for_each_position(
    qs_len: usize,
    qh_len: usize,
    stages: &[usize],
    mut f: impl FnMut(usize, usize, usize, bool),
) {
    let mut e0 = 0;
    let mut pos = 0;
    for &c in stages {
        while qs_len - pos >= c {
            for n in 0..5 {
                for m in 0..c {
                    f(e0 + n * c + m, pos + m, n, false);
                }
            }
            e0 += 5 * c;
            pos += c;
        }
    }
    debug_assert_eq!(pos, qs_len, "stages must consume every qs byte");
    for n in 0..4 {
        for m in 0..qh_len {
            f(e0 + n * qh_len + m, m, n, true);
        }
    }
}

/// Decodes `codes.len() = 5·len(qs) + 4·len(qh)` codes.
pub fn decode_staged(qs: &[u8], qh: &[u8], stages: &[usize], codes: &mut [u8]) {
    debug_assert_eq!(codes.len(), 5 * qs.len() + 4 * qh.len());
    // The same visiting order as `for_each_position`, written out so that each (stage, trit)
    // run is a contiguous byte-to-code map the compiler vectorizes (loading a model decodes
    // every weight once).
    let (mut e0, mut pos) = (0, 0);
    for &c in stages {
        while qs.len() - pos >= c {
            let bytes = &qs[pos..pos + c];
            for (n, run) in codes[e0..e0 + 5 * c].chunks_exact_mut(c).enumerate() {
                for (code, &b) in run.iter_mut().zip(bytes) {
                    *code = decode_trit(b, n);
                }
            }
            e0 += 5 * c;
            pos += c;
        }
    }
    debug_assert_eq!(pos, qs.len(), "stages must consume every qs byte");
    if !qh.is_empty() {
        for (n, run) in codes[e0..e0 + 4 * qh.len()]
            .chunks_exact_mut(qh.len())
            .enumerate()
        {
            for (code, &b) in run.iter_mut().zip(qh) {
                *code = decode_trit(b, n);
            }
        }
    }
}

/// Encodes codes (each 0..=2; code 3 has no trit) into `qs` and `qh`.
pub fn encode_staged(codes: &[u8], stages: &[usize], qs: &mut [u8], qh: &mut [u8]) -> Result<()> {
    if let Some(e) = codes.iter().position(|&c| c > 2) {
        return Err(Error::InvalidArgument(format!(
            "code {} at element {e} cannot be stored as a trit (only -1, 0, +1)",
            codes[e]
        )));
    }
    let mut qs_trits = vec![[0u8; 5]; qs.len()];
    let mut qh_trits = vec![[0u8; 5]; qh.len()];
    for_each_position(qs.len(), qh.len(), stages, |e, i, n, is_qh| {
        let t = if is_qh {
            &mut qh_trits[i]
        } else {
            &mut qs_trits[i]
        };
        t[n] = codes[e];
    });
    for (b, t) in qs.iter_mut().zip(&qs_trits) {
        *b = encode_trits(t);
    }
    for (b, t) in qh.iter_mut().zip(&qh_trits) {
        *b = encode_trits(&t[..4]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_bytes() {
        // (1,0,2,1,1): v = 81 + 18 + 3 + 1 = 103, 256·103/243 = 108.5 → 109.
        assert_eq!(encode_trits(&[1, 0, 2, 1, 1]), 109);
        assert_eq!(
            (0..5).map(|n| decode_trit(109, n)).collect::<Vec<_>>(),
            [1, 0, 2, 1, 1]
        );
        // All ones: v = 121 → 127.47 → 128. Four ones (qh): v = 120 → 126.4 → 127.
        assert_eq!(encode_trits(&[1; 5]), 128);
        assert_eq!(encode_trits(&[1; 4]), 127);
        // Extremes: v = 0 → 0, v = 242 → 254.9 → 255.
        assert_eq!(encode_trits(&[0; 5]), 0);
        assert_eq!(encode_trits(&[2; 5]), 255);
    }

    #[test]
    fn ceiling_round_trips_all_patterns_and_floor_does_not() {
        let mut floor_ok = 0;
        for v in 0..243u32 {
            let trits: Vec<u8> = (0..5).map(|n| (v / 3u32.pow(4 - n) % 3) as u8).collect();
            let b = encode_trits(&trits);
            assert_eq!(
                (0..5).map(|n| decode_trit(b, n)).collect::<Vec<_>>(),
                trits,
                "v = {v}"
            );
            let floor = (256 * v / 243) as u8;
            floor_ok += usize::from((0..5).all(|n| decode_trit(floor, n) == trits[n]));
        }
        assert_eq!(floor_ok, 1, "only v = 0 survives a floor");
    }

    #[test]
    fn staged_order_of_a_24_plus_2_byte_block() {
        // PTQ1_0 geometry: one 16-byte stage, one 8-byte stage, 2 qh bytes.
        let mut codes = vec![1u8; 128];
        for (e, c) in [(16, 0), (32, 2), (80, 2), (88, 0), (121, 0), (127, 2)] {
            codes[e] = c;
        }
        let (mut qs, mut qh) = ([0u8; 24], [0u8; 2]);
        encode_staged(&codes, &[32, 16, 8], &mut qs, &mut qh).unwrap();
        // Byte 0 carries elements 0, 16, 32, 48, 64 = (1, 0, 2, 1, 1) → 109.
        assert_eq!(qs[0], 109);
        // Byte 16 carries 80, 88, 96, 104, 112 = (2, 0, 1, 1, 1): v = 162 + 9 + 3 + 1 = 175 → 184.4 → 185.
        assert_eq!(qs[16], 185);
        // qh[1] carries 121, 123, 125, 127 = (0, 1, 1, 2): v = 3·(9 + 3 + 2) = 42 → 44.2 → 45.
        assert_eq!(qh[1], 45);
        let mut back = vec![0u8; 128];
        decode_staged(&qs, &qh, &[32, 16, 8], &mut back);
        assert_eq!(back, codes);
        codes[5] = 3;
        let err = encode_staged(&codes, &[32, 16, 8], &mut qs, &mut qh).unwrap_err();
        assert!(err.to_string().contains("element 5"));
    }
}
