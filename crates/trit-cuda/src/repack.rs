//! Host-side repacking of ternary weights into the GPU layout (see `kernels/gemv.cu`), from the
//! format-independent `TernaryRows` view the CPU loader also uses, plus the reference that
//! the kernels' arithmetic is tested against on the CPU.
//!
//! Layout: per row, one 16-byte block per 64 columns, as four u32 words; word `j` covers
//! columns `16j..16j+16` of the block and bits `2s..2s+2` of its byte `k` hold the code
//! (`t + 1`) of column `16j + 4s + k`. `(word >> 2s) & 0x03030303` is then four codes of four
//! consecutive columns, one `dp4a` operand against four int8 activations. Scales: one per row
//! and 64 columns, f16 when every scale of the matrix converts exactly (2.25 bits per weight),
//! else f32.

use half::f16;
use rayon::prelude::*;
use trit::quant::TernaryRows;
use trit::{Error, Result};

/// Columns per block (one 16-byte word, one scale).
pub const BLOCK: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub enum PackedScales {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

/// A ternary matrix in the GPU layout, still on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedTernary {
    pub rows: usize,
    pub cols: usize,
    /// `rows × cols/64 × 4` words.
    pub codes: Vec<u32>,
    /// `rows × cols/64` scales (f16: one zero more where that count is odd).
    pub scales: PackedScales,
}

/// Packs one block of 64 codes (each 0..=3) into its four words.
pub fn pack_block(codes: &[u8]) -> [u32; 4] {
    let mut w = [0u32; 4];
    for (c, &code) in codes.iter().enumerate().take(BLOCK) {
        let (j, s, k) = (c / 16, (c % 16) / 4, c % 4);
        w[j] |= ((code & 3) as u32) << (8 * k + 2 * s);
    }
    w
}

/// The code of column `c` (0..64) of a packed block.
pub fn block_code(w: &[u32; 4], c: usize) -> u8 {
    let (j, s, k) = (c / 16, (c % 16) / 4, c % 4);
    ((w[j] >> (8 * k + 2 * s)) & 3) as u8
}

/// Packs the rows of several matrices with the same column count, stacked in order (q, k and
/// v become one matrix, gate and up another, so each is one kernel launch).
pub fn pack(parts: &[&dyn TernaryRows]) -> Result<PackedTernary> {
    let cols = parts.first().map_or(0, |p| p.cols());
    if cols == 0 || !cols.is_multiple_of(BLOCK) || parts.iter().any(|p| p.cols() != cols) {
        return Err(Error::InvalidArgument(format!(
            "ternary matrices to stack need one column count, a multiple of {BLOCK} (got {:?})",
            parts.iter().map(|p| p.cols()).collect::<Vec<_>>()
        )));
    }
    let nb = cols / BLOCK;
    let rows: usize = parts.iter().map(|p| p.rows()).sum();
    // The decode kernels index blocks with 32-bit integers (gemv.cu).
    if rows * nb > i32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "a {rows} × {cols} ternary matrix has more blocks than the GPU kernels index"
        )));
    }
    let mut codes = vec![0u32; rows * nb * 4];
    let mut scales = vec![0f32; rows * nb];
    let mut r0 = 0;
    for p in parts {
        let n = p.rows();
        codes[r0 * nb * 4..(r0 + n) * nb * 4]
            .par_chunks_mut(nb * 4)
            .zip(scales[r0 * nb..(r0 + n) * nb].par_chunks_mut(nb))
            .enumerate()
            .for_each_init(
                || vec![0u8; cols],
                |buf, (r, (wrow, srow))| {
                    p.row(r, buf, srow);
                    for (b, w) in wrow.chunks_exact_mut(4).enumerate() {
                        w.copy_from_slice(&pack_block(&buf[b * BLOCK..(b + 1) * BLOCK]));
                    }
                },
            );
        r0 += n;
    }
    let exact = scales
        .par_iter()
        .all(|&s| f16::from_f32(s).to_f32().to_bits() == s.to_bits());
    let scales = if exact {
        // An even count (a zero pads an odd one): the streaming GEMV copies scales as aligned
        // 4-byte pairs and need not check for the last one.
        let mut half: Vec<u16> = scales.iter().map(|&s| f16::from_f32(s).to_bits()).collect();
        if half.len() % 2 == 1 {
            half.push(0);
        }
        PackedScales::F16(half)
    } else {
        PackedScales::F32(scales)
    };
    Ok(PackedTernary {
        rows,
        cols,
        codes,
        scales,
    })
}

impl PackedTernary {
    pub fn blocks(&self) -> usize {
        self.cols / BLOCK
    }

    pub fn scale(&self, r: usize, b: usize) -> f32 {
        let i = r * self.blocks() + b;
        match &self.scales {
            PackedScales::F16(s) => f16::from_bits(s[i]).to_f32(),
            PackedScales::F32(s) => s[i],
        }
    }

    /// Codes of row `r` (reference decoder of the layout).
    pub fn row_codes(&self, r: usize) -> Vec<u8> {
        let nb = self.blocks();
        let mut out = Vec::with_capacity(self.cols);
        for b in 0..nb {
            let at = (r * nb + b) * 4;
            let w: [u32; 4] = self.codes[at..at + 4].try_into().expect("4 words");
            out.extend((0..BLOCK).map(|c| block_code(&w, c)));
        }
        out
    }

    /// Row `r` as f32 weights `s · (code − 1)`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        for (c, code) in self.row_codes(r).into_iter().enumerate() {
            out[c] = self.scale(r, c / BLOCK) * (code as f32 - 1.0);
        }
    }

    /// Bytes the GPU holds (codes + scales).
    pub fn bytes(&self) -> usize {
        let n = self.rows * self.blocks();
        n * 16
            + n * match self.scales {
                PackedScales::F16(_) => 2,
                PackedScales::F32(_) => 4,
            }
    }
}

/// Int8 activations as the kernels get them: per 64 values, `q`, `d = max|x|/127` and `d·Σq`
/// (round half to even, as `quant_block_warp` and the CPU's ActQ8 do).
pub fn quantize_activations(x: &[f32]) -> (Vec<i8>, Vec<(f32, f32)>) {
    let mut q = vec![0i8; x.len()];
    let mut meta = Vec::with_capacity(x.len() / BLOCK);
    for (xb, qb) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 || !amax.is_finite() {
            meta.push((0.0, 0.0));
            continue;
        }
        let inv = 127.0 / amax;
        let mut sum = 0i32;
        for (v, o) in xb.iter().zip(qb.iter_mut()) {
            let r = (v * inv).round_ties_even() as i32;
            *o = r as i8;
            sum += r;
        }
        let d = amax / 127.0;
        meta.push((d, d * sum as f32));
    }
    (q, meta)
}

/// The ternary GEMV kernel's arithmetic on the CPU, word by word as the GPU does it (dp4a of
/// masked code words against int8 activations, one correction per block): the reference the
/// layout and the formula are tested against.
pub fn gemv_reference(m: &PackedTernary, q: &[i8], meta: &[(f32, f32)]) -> Vec<f32> {
    let nb = m.blocks();
    let dp4a = |a: u32, b: &[i8]| -> i32 {
        (0..4)
            .map(|k| ((a >> (8 * k)) & 0xff) as i32 * b[k] as i32)
            .sum()
    };
    (0..m.rows)
        .map(|r| {
            let mut acc = 0f32;
            for (b, &(d, dsum)) in meta.iter().enumerate().take(nb) {
                let mut dot = 0i32;
                for j in 0..4 {
                    let w = m.codes[(r * nb + b) * 4 + j];
                    for s in 0..4 {
                        let col = b * BLOCK + 16 * j + 4 * s;
                        dot += dp4a((w >> (2 * s)) & 0x0303_0303, &q[col..col + 4]);
                    }
                }
                acc += m.scale(r, b) * (d * dot as f32 - dsum);
            }
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use trit::quant::ternary::{encode_matrix, GgmlTernary};
    use trit::quant::GgmlType;

    /// Deterministic pseudo-random values (xorshift), different for every seed.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// A random ternary matrix encoded as `ty` (scales shared per group of `ty`).
    fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut next = rng(seed);
        let codes: Vec<u8> = (0..rows * cols).map(|_| (next() % 3) as u8).collect();
        let g = ty.block_size() / BLOCK;
        let mut scales = vec![0f32; rows * cols / BLOCK];
        for grp in scales.chunks_mut(g) {
            let s = f16::from_f32(0.01 + (next() % 1000) as f32 * 1e-4).to_f32();
            grp.fill(s);
        }
        encode_matrix(ty, rows, cols, &codes, &scales).unwrap()
    }

    #[test]
    fn packed_rows_decode_to_the_reference_decoder_for_every_format() {
        for (i, ty) in GgmlType::TERNARY.into_iter().enumerate() {
            let (rows, cols) = (7, 512);
            let bytes = random_matrix(ty, rows, cols, i as u64 + 1);
            let src = GgmlTernary::new(ty, &bytes, rows, cols).unwrap();
            let packed = pack(&[&src]).unwrap();
            assert!(
                matches!(packed.scales, PackedScales::F16(_)),
                "{}",
                ty.name()
            );
            let mut want = vec![0f32; cols];
            let mut got = vec![0f32; cols];
            for r in 0..rows {
                trit::quant::dequantize(
                    ty,
                    &bytes[r * ty.row_bytes(cols)..][..ty.row_bytes(cols)],
                    cols,
                    &mut want,
                )
                .unwrap();
                packed.dequantize_row(r, &mut got);
                assert_eq!(got, want, "{} row {r}", ty.name());
            }
        }
    }

    #[test]
    fn stacking_keeps_row_order_and_refuses_mixed_widths() {
        let a = random_matrix(GgmlType::Q2_0, 3, 128, 5);
        let b = random_matrix(GgmlType::Q2_0, 2, 128, 6);
        let (sa, sb) = (
            GgmlTernary::new(GgmlType::Q2_0, &a, 3, 128).unwrap(),
            GgmlTernary::new(GgmlType::Q2_0, &b, 2, 128).unwrap(),
        );
        let both = pack(&[&sa, &sb]).unwrap();
        assert_eq!(both.rows, 5);
        assert_eq!(both.row_codes(3), pack(&[&sb]).unwrap().row_codes(0));
        let c = random_matrix(GgmlType::Q2_0, 2, 256, 7);
        let sc = GgmlTernary::new(GgmlType::Q2_0, &c, 2, 256).unwrap();
        assert!(pack(&[&sa, &sc]).is_err());
    }

    #[test]
    fn kernel_arithmetic_matches_f64_dot_products() {
        let (rows, cols) = (9, 768);
        let bytes = random_matrix(GgmlType::TQ2_0, rows, cols, 11);
        let src = GgmlTernary::new(GgmlType::TQ2_0, &bytes, rows, cols).unwrap();
        let packed = pack(&[&src]).unwrap();
        let mut next = rng(99);
        let x: Vec<f32> = (0..cols)
            .map(|_| (next() % 20001) as f32 / 10000.0 - 1.0)
            .collect();
        let (q, meta) = quantize_activations(&x);
        let got = gemv_reference(&packed, &q, &meta);
        let mut w = vec![0f32; cols];
        for (r, g) in got.iter().enumerate() {
            packed.dequantize_row(r, &mut w);
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norm: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            // int8 activations: about 1/254 relative error per value, far less in a sum.
            assert!(
                (*g as f64 - exact).abs() <= 4e-3 * norm,
                "row {r}: {g} vs {exact}"
            );
        }
    }

    #[test]
    fn scales_that_are_not_half_values_stay_f32() {
        struct Odd;
        impl TernaryRows for Odd {
            fn rows(&self) -> usize {
                2
            }
            fn cols(&self) -> usize {
                64
            }
            fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
                codes.fill(2);
                scales[0] = 0.1 + r as f32;
            }
        }
        let p = pack(&[&Odd]).unwrap();
        assert_eq!(p.scales, PackedScales::F32(vec![0.1, 1.1]));
        assert_eq!(p.row_codes(1), vec![2u8; 64]);
        assert_eq!(p.bytes(), 2 * (16 + 4));
    }
}
