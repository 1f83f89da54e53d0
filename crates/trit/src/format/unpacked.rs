//! Unpacked FP16/BF16 folders (formats.md §10): plain Hugging Face safetensors holding the
//! dequantized ternary weights `s · t`. Every 2-D weight is checked group by group (128 inputs)
//! to hold exactly `{-s, 0, +s}` and re-packed losslessly as PQ2_0 blocks at load
//! (formats.md §9), so the model sees an ordinary ternary tensor; any other value is refused
//! with the tensor, row and group that broke the rule. Norm vectors stay plain.

use super::folder::{module_of, split_tensor_name, Entry, FolderSource};
use super::safetensors::SafetensorsSet;
use super::Dtype;
use crate::quant::GgmlType;
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Inputs per re-packed group (PQ2_0 block).
const GROUP: usize = 128;
/// PQ2_0 block: f16 scale then 32 bytes of 2-bit codes.
const BLOCK_BYTES: usize = 34;

/// Why a group is not ternary.
#[derive(Debug)]
struct Offence {
    group: usize,
    detail: String,
}

/// Float value of a magnitude bit pattern.
fn mag_value(mag: u32, dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F32 => f32::from_bits(mag),
        Dtype::BF16 => half::bf16::from_bits(mag as u16).to_f32(),
        _ => half::f16::from_bits(mag as u16).to_f32(),
    }
}

/// First non-finite magnitude pattern per dtype.
fn inf_bits(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::F32 => 0x7f80_0000,
        Dtype::BF16 => 0x7f80,
        _ => 0x7c00,
    }
}

/// Packs one row into PQ2_0 blocks, or names the first non-ternary group.
fn pack_row(src: &[u8], dtype: Dtype, out: &mut [u8]) -> std::result::Result<(), Offence> {
    match dtype {
        Dtype::F32 => pack_row_width::<4>(src, dtype, out),
        _ => pack_row_width::<2>(src, dtype, out),
    }
}

/// `pack_row` for elements of `W` bytes (monomorphized: this loop runs over every weight).
fn pack_row_width<const W: usize>(
    src: &[u8],
    dtype: Dtype,
    out: &mut [u8],
) -> std::result::Result<(), Offence> {
    let sign: u32 = 1 << (8 * W - 1);
    let mag_mask = sign - 1;
    let mut bits = [0u32; GROUP];
    for (g, block) in out.chunks_exact_mut(BLOCK_BYTES).enumerate() {
        let group = &src[g * GROUP * W..(g + 1) * GROUP * W];
        for (b, c) in bits.iter_mut().zip(group.chunks_exact(W)) {
            *b = if W == 4 {
                u32::from_le_bytes([c[0], c[1], c[2], c[3]])
            } else {
                u16::from_le_bytes([c[0], c[1]]) as u32
            };
        }
        // For IEEE formats, magnitude order equals the integer order of the magnitude bits.
        let s_bits = bits.iter().map(|b| b & mag_mask).max().unwrap_or(0);
        if s_bits >= inf_bits(dtype) {
            return Err(Offence {
                group: g,
                detail: "holds an infinity or NaN".into(),
            });
        }
        let s = mag_value(s_bits, dtype);
        let d = half::f16::from_f32(s);
        if d.to_f32() != s {
            return Err(Offence {
                group: g,
                detail: format!("scale {s} is not representable in f16"),
            });
        }
        block[..2].copy_from_slice(&d.to_le_bytes());
        for (byte, four) in block[2..].iter_mut().zip(bits.chunks_exact(4)) {
            let mut packed = 0u8;
            for (j, &b) in four.iter().enumerate() {
                let q: u8 = match (b & mag_mask, b & sign != 0) {
                    (0, _) => 1,
                    (m, _) if m != s_bits => {
                        return Err(non_ternary(g, &bits, s_bits, mag_mask, sign, dtype));
                    }
                    (_, true) => 0,
                    (_, false) => 2,
                };
                packed |= q << (2 * j);
            }
            *byte = packed;
        }
    }
    Ok(())
}

/// Describes the first element of group `g` whose magnitude is neither 0 nor the group's.
fn non_ternary(
    g: usize,
    bits: &[u32],
    s_bits: u32,
    mag_mask: u32,
    sign: u32,
    dtype: Dtype,
) -> Offence {
    let k = bits
        .iter()
        .position(|b| b & mag_mask != 0 && b & mag_mask != s_bits)
        .unwrap_or(0);
    Offence {
        group: g,
        detail: format!(
            "column {} is {}{} but the group's largest magnitude is {}; an unpacked ternary \
             group holds only -s, 0 and +s",
            g * GROUP + k,
            if bits[k] & sign != 0 { "-" } else { "" },
            mag_value(bits[k] & mag_mask, dtype),
            mag_value(s_bits, dtype)
        ),
    }
}

/// Re-packs a `[rows, cols]` ternary tensor as PQ2_0 bytes.
fn repack(
    tensor: &str,
    canonical: &str,
    bytes: &[u8],
    shape: &[usize],
    dtype: Dtype,
) -> Result<Vec<u8>> {
    let (rows, cols) = (shape[0], shape[1]);
    if !cols.is_multiple_of(GROUP) {
        return Err(Error::ShapeMismatch {
            tensor: tensor.to_string(),
            found: shape.to_vec(),
            expected: vec![rows, cols.div_ceil(GROUP) * GROUP],
        });
    }
    let row_out = cols / GROUP * BLOCK_BYTES;
    let row_in = cols * dtype.size();
    let mut out = vec![0u8; rows * row_out];
    if row_out == 0 {
        return Ok(out);
    }
    let first_bad = out
        .par_chunks_mut(row_out)
        .enumerate()
        .filter_map(|(r, chunk)| {
            pack_row(&bytes[r * row_in..(r + 1) * row_in], dtype, chunk)
                .err()
                .map(|o| (r, o))
        })
        .min_by_key(|(r, o)| (*r, o.group));
    match first_bad {
        None => Ok(out),
        Some((r, o)) => Err(Error::Unsupported(format!(
            "unpacked weight '{tensor}' ({canonical}) row {r} group {} (columns {}..{}) is not ternary: {}",
            o.group,
            o.group * GROUP,
            (o.group + 1) * GROUP,
            o.detail
        ))),
    }
}

/// Builds the weight source of an unpacked folder; returns it with the weights' dtype.
pub(super) fn build(files: SafetensorsSet, skip_lm_head: bool) -> Result<(FolderSource, Dtype)> {
    let mut entries = BTreeMap::new();
    let mut matrix_dtype = None;
    for tensor in files.names() {
        let Some((module, canonical)) = module_of(&tensor)? else {
            continue;
        };
        if skip_lm_head && canonical == "output" {
            continue;
        }
        let (_, suffix) = split_tensor_name(&tensor);
        if suffix != "weight" {
            return Err(Error::Format(format!(
                "tensor '{tensor}' found, but config.json has no quantization block \
                 (an unpacked folder holds plain weights only)"
            )));
        }
        let (info, bytes) = files.get(&tensor).expect("listed");
        if !info.dtype.is_float() {
            return Err(Error::Format(format!(
                "'{tensor}' is {} {:?}: a packed weight needs a quantization block and '{module}.scales' in config.json/weights",
                info.dtype.name(),
                info.shape
            )));
        }
        let name = format!("{canonical}.weight");
        let entry = match info.shape.len() {
            1 => Entry::Plain {
                hf: tensor.clone(),
                dtype: info.dtype,
            },
            2 => {
                matrix_dtype.get_or_insert(info.dtype);
                Entry::Owned {
                    shape: info.shape.clone(),
                    ty: GgmlType::PQ2_0,
                    bytes: repack(&tensor, &name, bytes, &info.shape, info.dtype)?,
                }
            }
            n => {
                return Err(Error::Format(format!(
                    "'{tensor}' has {n} dimensions {:?}; expected a matrix or a vector",
                    info.shape
                )))
            }
        };
        entries.insert(name, entry);
    }
    let dtype = matrix_dtype.unwrap_or(Dtype::F16);
    let n_matrices = entries
        .values()
        .filter(|e| matches!(e, Entry::Owned { .. }))
        .count();
    let description = format!(
        "unpacked {} folder, {} safetensors file(s): {n_matrices} ternary matrices verified and re-packed as PQ2_0 at load",
        dtype.name(),
        files.files().len()
    );
    Ok((
        FolderSource {
            files,
            entries,
            description,
        },
        dtype,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn packs_ternary_rows_as_pq2_0() {
        let s = 0.375f32;
        let row: Vec<f32> = (0..256).map(|k| [s, 0.0, -s, -0.0][k % 4]).collect();
        let out = repack("t", "c", &f16_bytes(&row), &[1, 256], Dtype::F16).unwrap();
        assert_eq!(out.len(), 2 * BLOCK_BYTES);
        for block in out.chunks(BLOCK_BYTES) {
            assert_eq!(half::f16::from_le_bytes([block[0], block[1]]).to_f32(), s);
            // Codes per element: +s → 2, 0 → 1, -s → 0, -0 → 1; LSB-first in each byte.
            assert!(block[2..].iter().all(|&b| b == 2 | (1 << 2) | (1 << 6)));
        }
    }

    #[test]
    fn names_the_first_non_ternary_group() {
        let mut row: Vec<f32> = (0..2 * 256)
            .map(|k| if k % 3 == 0 { 0.5 } else { 0.0 })
            .collect();
        row[256 + 130] = 0.25; // row 1, group 1
        let e = repack(
            "w",
            "blk.0.attn_q.weight",
            &f16_bytes(&row),
            &[2, 256],
            Dtype::F16,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("'w' (blk.0.attn_q.weight) row 1 group 1"), "{e}");
        assert!(e.contains("column 130 is 0.25"), "{e}");
        let e = repack("w", "c", &f16_bytes(&[1.0; 100]), &[1, 100], Dtype::F16).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }));
    }

    #[test]
    fn bf16_scales_must_fit_f16() {
        let tiny = half::bf16::from_f32(1e-30);
        let bytes: Vec<u8> = (0..128).flat_map(|_| tiny.to_le_bytes()).collect();
        let e = repack("w", "c", &bytes, &[1, 128], Dtype::BF16).unwrap_err();
        assert!(e.to_string().contains("not representable in f16"), "{e}");
        let ok = half::bf16::from_f32(0.0625);
        let bytes: Vec<u8> = (0..128).flat_map(|_| ok.to_le_bytes()).collect();
        assert!(repack("w", "c", &bytes, &[1, 128], Dtype::BF16).is_ok());
    }
}
