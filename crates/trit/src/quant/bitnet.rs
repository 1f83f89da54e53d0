//! BitNet b1.58 weight encodings (formats.md §5.7).
//!
//! Hugging Face packed layout (microsoft/bitnet-b1.58-2B-4T, transformers' `BitLinear`): a
//! `[out/4, in]` uint8 tensor holding four **output rows** per byte: row `p + i·out/4` of the
//! matrix is bits `2i..2i+2` of byte row `p`, value `code − 1`. One scalar `weight_scale` per
//! tensor, divided by (`linear_class` bitlinear) or multiplied by (autobitlinear).
//!
//! Full-precision masters (the `-bf16` repo, `quantization_mode: online`) are ternarized per
//! tensor by absmean, as BitNet's `WeightQuant` does: `s = mean|W|`, `t = clamp(round(W/s))`.

use super::TernaryRows;
use crate::{Error, Result};

/// Codes (`t + 1`, row-major `rows × cols`) of a packed HF BitNet weight `[rows/4, cols]`.
/// Errors on a code 3 (no ternary value) or a byte count that does not match.
pub fn unpack_hf(packed: &[u8], rows: usize, cols: usize, name: &str) -> Result<Vec<u8>> {
    if !rows.is_multiple_of(4) || packed.len() != rows / 4 * cols {
        return Err(Error::Format(format!(
            "BitNet packed weight '{name}': {} bytes for {rows} × {cols} (need {} rows, a \
             multiple of 4, packed as [{}, {cols}] uint8)",
            packed.len(),
            rows,
            rows / 4
        )));
    }
    let quarter = rows / 4;
    let mut codes = vec![0u8; rows * cols];
    for (p, src) in packed.chunks_exact(cols).enumerate() {
        for i in 0..4 {
            let r = p + i * quarter;
            let dst = &mut codes[r * cols..(r + 1) * cols];
            for (d, &b) in dst.iter_mut().zip(src) {
                *d = (b >> (2 * i)) & 3;
            }
        }
    }
    if let Some(k) = codes.iter().position(|&c| c == 3) {
        let (r, c) = (k / cols, k % cols);
        return Err(Error::Format(format!(
            "BitNet packed weight '{name}': row {r} column {c} holds code 3 (+2), which is not \
             ternary"
        )));
    }
    Ok(codes)
}

/// Packs codes (`rows × cols`, each 0..=2) into the HF layout `[rows/4, cols]` (the test
/// generator's writer; inverse of [`unpack_hf`]).
pub fn pack_hf(codes: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    assert!(rows.is_multiple_of(4) && codes.len() == rows * cols);
    let quarter = rows / 4;
    let mut out = vec![0u8; quarter * cols];
    for (p, dst) in out.chunks_exact_mut(cols).enumerate() {
        for i in 0..4 {
            let r = p + i * quarter;
            for (d, &c) in dst.iter_mut().zip(&codes[r * cols..(r + 1) * cols]) {
                *d |= (c & 3) << (2 * i);
            }
        }
    }
    out
}

/// Absmean ternarization of a full-precision matrix: codes `t + 1` and the tensor's scale
/// `mean|W|` (at least 1e-5, as BitNet's `WeightQuant` clamps it).
pub fn ternarize_absmean(w: &[f32]) -> (Vec<u8>, f32) {
    let mean = (w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len().max(1) as f64) as f32;
    let s = mean.max(1e-5);
    let codes = w
        .iter()
        .map(|&v| ((v / s).round_ties_even().clamp(-1.0, 1.0) + 1.0) as u8)
        .collect();
    (codes, s)
}

/// A ternary matrix with every scale multiplied by one per-tensor factor (BitNet's
/// `weight_scale`, GGUF `<name>.scale`). `T` is a borrowed or boxed `TernaryRows`.
pub struct Scaled<T> {
    pub inner: T,
    pub factor: f32,
}

impl<T: TernaryRows> TernaryRows for Scaled<T> {
    fn rows(&self) -> usize {
        self.inner.rows()
    }

    fn cols(&self) -> usize {
        self.inner.cols()
    }

    fn row(&self, r: usize, codes: &mut [u8], scales: &mut [f32]) {
        self.inner.row(r, codes, scales);
        for s in scales.iter_mut() {
            *s *= self.factor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_layout_puts_four_output_rows_in_one_byte() {
        // 8 rows × 2 columns: row r holds code r % 3 in column 0 and (r + 1) % 3 in column 1.
        let (rows, cols) = (8, 2);
        let codes: Vec<u8> = (0..rows)
            .flat_map(|r| [(r % 3) as u8, ((r + 1) % 3) as u8])
            .collect();
        let packed = pack_hf(&codes, rows, cols);
        assert_eq!(packed.len(), 4);
        // Byte (p=0, col 0) holds rows 0, 2, 4, 6 in bits 0-1, 2-3, 4-5, 6-7.
        assert_eq!(packed[0], (2 << 2) | (1 << 4)); // rows 0, 2, 4, 6 hold codes 0, 2, 1, 0
        assert_eq!(unpack_hf(&packed, rows, cols, "w").unwrap(), codes);
        let e = unpack_hf(&[3, 0, 0, 0], rows, cols, "w").unwrap_err();
        assert!(e.to_string().contains("row 0 column 0 holds code 3"), "{e}");
        let e = unpack_hf(&packed[..3], rows, cols, "w").unwrap_err();
        assert!(e.to_string().contains("3 bytes for 8 × 2"), "{e}");
    }

    #[test]
    fn absmean_matches_bitnet_weight_quant() {
        let w = [0.3f32, -0.1, 0.05, -0.9, 0.0, 0.45];
        let (codes, s) = ternarize_absmean(&w);
        assert!((s - 0.3).abs() < 1e-6);
        // 0.3/0.3 = 1, -0.1/0.3 → 0, 0.05 → 0, -3 → -1, 0 → 0, 1.5 → 2 → clamp 1.
        assert_eq!(codes, vec![2, 1, 1, 0, 1, 2]);
        assert_eq!(ternarize_absmean(&[0.0; 4]).1, 1e-5);
    }
}
