//! Turns named tensor views from any file format into kernel-ready weights:
//! ternary formats are repacked into `TernaryMatrix`, f16/bf16 matrices are kept at 2 bytes a
//! value, everything else is dequantized to f32.

use crate::format::{Dtype, TensorData, TensorView, WeightSource};
use crate::kernels::{DenseMatrix, Linear, TernaryMatrix};
use crate::quant::float::HalfKind;
use crate::quant::{self, GgmlType, TernaryRows};
use crate::{Error, Result};

pub fn require<'a>(src: &'a dyn WeightSource, name: &str) -> Result<TensorView<'a>> {
    src.tensor(name)?
        .ok_or_else(|| Error::MissingTensor(name.to_string()))
}

fn check_shape(view: &TensorView<'_>, expected: &[usize]) -> Result<()> {
    if view.shape != expected {
        return Err(Error::ShapeMismatch {
            tensor: view.name.clone(),
            found: view.shape.clone(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

/// A `rows × cols` matrix (cols = input dimension). A scalar companion `<stem>.scale` (GGUF
/// BitNet files, llama.cpp's per-tensor scales; BitNet folders' `weight_scale`) multiplies
/// every weight: folded into the ternary scales, or into the dense values.
pub fn linear(src: &dyn WeightSource, name: &str, rows: usize, cols: usize) -> Result<Linear> {
    let view = require(src, name)?;
    check_shape(&view, &[rows, cols])?;
    let factor = tensor_scale(src, name)?;
    let linear = to_linear_scaled(&view, factor)?;
    src.release(name);
    Ok(linear)
}

/// The per-tensor scale of the matrix `name` (`x.weight` → `x.scale`), 1 when there is none.
pub fn tensor_scale(src: &dyn WeightSource, name: &str) -> Result<f32> {
    let Some(stem) = name.strip_suffix(".weight") else {
        return Ok(1.0);
    };
    let scale_name = format!("{stem}.scale");
    let Some(view) = src.tensor(&scale_name)? else {
        return Ok(1.0);
    };
    if view.n_elements() != 1 {
        return Err(Error::ShapeMismatch {
            tensor: scale_name,
            found: view.shape.clone(),
            expected: vec![1],
        });
    }
    let s = to_f32(&view)?[0];
    if !s.is_finite() || s == 0.0 {
        return Err(Error::Format(format!(
            "per-tensor scale '{scale_name}' is {s}; it must be finite and non-zero"
        )));
    }
    Ok(s)
}

pub fn to_linear(view: &TensorView<'_>) -> Result<Linear> {
    to_linear_scaled(view, 1.0)
}

/// `to_linear` with every weight multiplied by `factor`.
pub fn to_linear_scaled(view: &TensorView<'_>, factor: f32) -> Result<Linear> {
    let ternary = |src: &dyn TernaryRows| -> Result<Linear> {
        let m = if factor == 1.0 {
            TernaryMatrix::from_rows(src)?
        } else {
            TernaryMatrix::from_rows(&quant::bitnet::Scaled { inner: src, factor })?
        };
        Ok(Linear::Ternary(m))
    };
    let (rows, cols) = match view.shape.as_slice() {
        [r, c] => (*r, *c),
        s => {
            return Err(Error::Format(format!(
                "tensor '{}' should be 2-D, has shape {s:?}",
                view.name
            )))
        }
    };
    match &view.data {
        TensorData::Ggml { ty, bytes } if ty.reads_as_ternary() => {
            let src = quant::ternary::GgmlTernary::new(*ty, bytes, rows, cols)?;
            ternary(&src)
        }
        TensorData::Mlx {
            codes,
            scales,
            biases,
            scale_dtype,
            group_size,
            bits,
        } => {
            if !matches!(bits, 1 | 2) {
                return Err(Error::Unsupported(format!(
                    "tensor '{}' is MLX {bits}-bit; only 2-bit (ternary) and 1-bit (binary) are supported",
                    view.name
                )));
            }
            let half = match scale_dtype {
                Dtype::F16 => HalfKind::F16,
                Dtype::BF16 => HalfKind::BF16,
                other => {
                    return Err(Error::Unsupported(format!(
                        "tensor '{}' has MLX scales of type {}",
                        view.name,
                        other.name()
                    )))
                }
            };
            let src = quant::mlx2::MlxTernary::with_bits(
                codes,
                scales,
                biases,
                half,
                rows,
                cols,
                *group_size,
                *bits,
            )?;
            if src.check_ternary().is_ok() {
                ternary(&src)
            } else {
                // Generic 2-bit affine: run it dequantized rather than refuse.
                let mut data = vec![0f32; rows * cols];
                for (r, row) in data.chunks_exact_mut(cols).enumerate() {
                    src.dequantize_row(r, row);
                }
                Ok(dense(rows, cols, data, factor))
            }
        }
        _ => match half_matrix(&view.data, rows * cols).filter(|_| factor == 1.0) {
            Some((bits, kind)) => Ok(Linear::Dense(DenseMatrix::from_half(
                rows, cols, bits, kind,
            ))),
            None => Ok(dense(rows, cols, to_f32(view)?, factor)),
        },
    }
}

/// The bytes of an f16 or bf16 tensor of `n` values (`None` for other types or another size,
/// which `to_f32` reads or refuses).
fn half_bytes<'a>(data: &TensorData<'a>, n: usize) -> Option<(&'a [u8], HalfKind)> {
    let (bytes, kind) = match *data {
        TensorData::F16(b) => (b, HalfKind::F16),
        TensorData::BF16(b) => (b, HalfKind::BF16),
        TensorData::Ggml {
            ty: GgmlType::F16,
            bytes,
        } => (bytes, HalfKind::F16),
        TensorData::Ggml {
            ty: GgmlType::BF16,
            bytes,
        } => (bytes, HalfKind::BF16),
        _ => return None,
    };
    (bytes.len() == 2 * n).then_some((bytes, kind))
}

/// [`half_bytes`] as bit patterns.
fn half_matrix(data: &TensorData<'_>, n: usize) -> Option<(Vec<u16>, HalfKind)> {
    let (bytes, kind) = half_bytes(data, n)?;
    let bits = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Some((bits, kind))
}

fn dense(rows: usize, cols: usize, mut data: Vec<f32>, factor: f32) -> Linear {
    if factor != 1.0 {
        data.iter_mut().for_each(|v| *v *= factor);
    }
    Linear::Dense(DenseMatrix::new(rows, cols, data))
}

/// Bytes `view` takes once loaded (what `trit info` reports without loading): a matrix the
/// ternary kernels take is 2 bits per weight plus one scale per group of its type (64, 128 or
/// 256 columns; f16, or f32 for bf16 MLX scales), rows padded to whole tiles, as
/// `TernaryMatrix` stores it; anything else is dequantized to f32. (An MLX 2-bit module that is
/// affine but not ternary runs dequantized: counted as ternary here.)
pub fn loaded_bytes(view: &TensorView<'_>) -> usize {
    use crate::kernels::TILE_ROWS;
    let matrix = view.shape.len() == 2;
    let (group, scale_bytes) = match &view.data {
        TensorData::Ggml { ty, .. } if matrix && ty.reads_as_ternary() => (ty.block_size(), 2),
        TensorData::Mlx {
            bits: 1 | 2,
            group_size,
            scale_dtype,
            ..
        } if matrix => (*group_size, if *scale_dtype == Dtype::F16 { 2 } else { 4 }),
        // Half-precision matrices stay at 2 bytes a value (DenseMatrix::from_half).
        data if matrix && half_bytes(data, view.n_elements()).is_some() => {
            return view.n_elements() * 2
        }
        _ => return view.shape.iter().product::<usize>() * 4,
    };
    let (rows, cols) = (view.shape[0].div_ceil(TILE_ROWS) * TILE_ROWS, view.shape[1]);
    rows * cols / 4 + rows * (cols / group.min(256)) * scale_bytes
}

/// Dequantizes any non-packed tensor to f32 (norm weights, dense matrices).
pub fn to_f32(view: &TensorView<'_>) -> Result<Vec<f32>> {
    let n: usize = view.shape.iter().product();
    let mut out = vec![0f32; n];
    match &view.data {
        TensorData::F32(b) => quant::dequantize(GgmlType::F32, b, n, &mut out)?,
        TensorData::F16(b) => quant::dequantize(GgmlType::F16, b, n, &mut out)?,
        TensorData::BF16(b) => quant::dequantize(GgmlType::BF16, b, n, &mut out)?,
        TensorData::Ggml { ty, bytes } => quant::dequantize(*ty, bytes, n, &mut out)?,
        TensorData::Mlx { .. } => {
            return Err(Error::Unsupported(format!(
                "tensor '{}' is MLX-quantized where a plain vector is expected",
                view.name
            )))
        }
    }
    Ok(out)
}

/// A 1-D weight of length `n` (norms).
pub fn vector(src: &dyn WeightSource, name: &str, n: usize) -> Result<Vec<f32>> {
    let view = require(src, name)?;
    let len: usize = view.shape.iter().product();
    if len != n {
        return Err(Error::ShapeMismatch {
            tensor: name.to_string(),
            found: view.shape.clone(),
            expected: vec![n],
        });
    }
    to_f32(&view)
}
