//! Hugging Face BitNet b1.58 folders (`model_type: bitnet`, `quantization_config.quant_method:
//! bitnet`; formats.md §5.7).
//!
//! - `quantization_mode: offline` (microsoft/bitnet-b1.58-2B-4T): each projection is a uint8
//!   `[out/4, in]` `weight` (four output rows per byte, `quant::bitnet::unpack_hf`) plus a scalar
//!   `weight_scale`. transformers' `BitLinear` (the default `linear_class`) divides by it, its
//!   `AutoBitLinear` multiplies; mlx-lm's `bitnet_quantize` follows the same rule.
//! - `quantization_mode: online` (the `-bf16` repo): the projections are full-precision
//!   masters that transformers ternarizes at every forward (absmean, one scale per tensor);
//!   trit ternarizes them the same way, once, at load.
//!
//! Either way a projection is exposed as a ternary GGUF block tensor with unit scales plus a
//! scalar `<name>.scale` tensor holding the per-tensor factor (GGUF's convention, which
//! `model::weights::linear` folds into the group scales). Embedding, LM head and norms stay
//! plain.

use super::folder::{module_of, split_tensor_name, Entry, FolderSource};
use super::safetensors::SafetensorsSet;
use super::{Dtype, TensorData};
use crate::quant::{self, ternary::encode_matrix, GgmlType};
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// A `quantization_config` with `quant_method: bitnet`.
#[derive(Clone, Debug, PartialEq)]
pub struct BitNetQuant {
    /// `weight_scale` divides the weights (`linear_class` bitlinear, the default).
    pub divide: bool,
    /// Full-precision masters ternarized at load (`quantization_mode: online`).
    pub online: bool,
    /// HF module paths left in full precision.
    pub not_converted: Vec<String>,
}

impl BitNetQuant {
    /// `Ok(None)` when `q` is not a BitNet quantization block.
    pub fn parse(q: &Value) -> Result<Option<BitNetQuant>> {
        if q.get("quant_method").and_then(Value::as_str) != Some("bitnet") {
            return Ok(None);
        }
        let text = |key: &str, default: &str| -> Result<String> {
            match q.get(key) {
                None | Some(Value::Null) => Ok(default.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(Error::Config(format!(
                    "config.json quantization_config: '{key}' should be a string, found {other}"
                ))),
            }
        };
        let divide = match text("linear_class", "bitlinear")?.as_str() {
            "bitlinear" => true,
            "autobitlinear" => false,
            other => {
                return Err(Error::Unsupported(format!(
                    "BitNet linear_class '{other}' (known: bitlinear, autobitlinear)"
                )))
            }
        };
        let online = match text("quantization_mode", "offline")?.as_str() {
            "offline" => false,
            "online" => true,
            other => {
                return Err(Error::Unsupported(format!(
                    "BitNet quantization_mode '{other}' (known: offline, online)"
                )))
            }
        };
        if q.get("use_rms_norm").and_then(Value::as_bool) == Some(true) {
            // AutoBitLinear's optional extra RMSNorm before every projection.
            return Err(Error::Unsupported(
                "BitNet quantization_config use_rms_norm: true (an extra norm inside every \
                 projection; 2B4T does not use it)"
                    .into(),
            ));
        }
        let not_converted = match q.get("modules_to_not_convert") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    Error::Config(
                        "config.json quantization_config: modules_to_not_convert should be a \
                         list of module names"
                            .into(),
                    )
                })?,
            Some(other) => {
                return Err(Error::Config(format!(
                    "config.json quantization_config: modules_to_not_convert should be a list, \
                     found {other}"
                )))
            }
        };
        Ok(Some(BitNetQuant {
            divide,
            online,
            not_converted,
        }))
    }
}

/// The widest ternary block type whose group divides `cols` (scales are all 1, so any is
/// exact; wider groups are smaller and what `trit info` reports).
fn block_type(cols: usize) -> Option<GgmlType> {
    [GgmlType::TQ2_0, GgmlType::PQ2_0, GgmlType::Q2_0]
        .into_iter()
        .find(|t| cols.is_multiple_of(t.block_size()))
}

fn float_values(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let n = bytes.len() / dtype.size().max(1);
    let data = match dtype {
        Dtype::F32 => TensorData::F32(bytes),
        Dtype::F16 => TensorData::F16(bytes),
        Dtype::BF16 => TensorData::BF16(bytes),
        other => {
            return Err(Error::Format(format!(
                "'{name}' is {}; expected F32, F16 or BF16",
                other.name()
            )))
        }
    };
    crate::model::weights::to_f32(&super::TensorView {
        name: name.to_string(),
        shape: vec![n],
        data,
    })
}

/// One projection as (unit-scale ternary blocks, per-tensor factor).
fn projection(
    files: &SafetensorsSet,
    module: &str,
    canonical: &str,
    q: &BitNetQuant,
) -> Result<(Vec<usize>, GgmlType, Vec<u8>, f32)> {
    let weight = format!("{module}.weight");
    let (info, bytes) = files.get(&weight).expect("listed");
    let (codes, rows, cols, factor) = if q.online {
        if !info.dtype.is_float() || info.shape.len() != 2 {
            return Err(Error::Format(format!(
                "'{weight}' is {} {:?}; quantization_mode online expects full-precision \
                 [out, in] masters",
                info.dtype.name(),
                info.shape
            )));
        }
        let w = float_values(&weight, info.dtype, bytes)?;
        let (codes, s) = quant::bitnet::ternarize_absmean(&w);
        (codes, info.shape[0], info.shape[1], s)
    } else {
        if info.dtype != Dtype::U8 || info.shape.len() != 2 {
            return Err(Error::Format(format!(
                "'{weight}' is {} {:?}; a packed BitNet projection is uint8 [out/4, in] \
                 (quantization_mode offline)",
                info.dtype.name(),
                info.shape
            )));
        }
        let scale_name = format!("{module}.weight_scale");
        let (si, sb) = files.get(&scale_name).ok_or_else(|| {
            Error::MissingTensor(format!("{scale_name} (the per-tensor scale of '{weight}')"))
        })?;
        let s = float_values(&scale_name, si.dtype, sb)?;
        if s.len() != 1 {
            return Err(Error::ShapeMismatch {
                tensor: scale_name,
                found: si.shape.clone(),
                expected: vec![1],
            });
        }
        let s = s[0];
        if !s.is_finite() || s == 0.0 {
            return Err(Error::Format(format!(
                "'{scale_name}' is {s}; it must be finite and non-zero"
            )));
        }
        let (rows, cols) = (info.shape[0] * 4, info.shape[1]);
        let codes = quant::bitnet::unpack_hf(bytes, rows, cols, &weight)?;
        (codes, rows, cols, if q.divide { 1.0 / s } else { s })
    };
    let ty = block_type(cols).ok_or_else(|| {
        Error::Unsupported(format!(
            "'{weight}' ({canonical}) has {cols} inputs; the ternary kernels need a multiple of 64"
        ))
    })?;
    let ones = vec![1.0f32; rows * cols / 64];
    let bytes = encode_matrix(ty, rows, cols, &codes, &ones)?;
    Ok((vec![rows, cols], ty, bytes, factor))
}

/// Builds the weight source of a BitNet folder.
pub(super) fn build(
    files: SafetensorsSet,
    q: &BitNetQuant,
    skip_lm_head: bool,
) -> Result<FolderSource> {
    let mut entries = BTreeMap::new();
    let mut n_ternary = 0;
    for tensor in files.names() {
        let Some((module, canonical)) = module_of(&tensor)? else {
            continue;
        };
        if skip_lm_head && canonical == "output" {
            continue;
        }
        let (_, suffix) = split_tensor_name(&tensor);
        let kind = canonical.rsplit('.').next().unwrap_or("");
        let quantized =
            crate::format::PROJECTIONS.contains(&kind) && !q.not_converted.contains(&module);
        match suffix {
            "weight_scale" if quantized && !q.online => continue, // read with its weight
            "weight" if quantized => {
                let (shape, ty, bytes, factor) = projection(&files, &module, &canonical, q)?;
                entries.insert(
                    format!("{canonical}.weight"),
                    Entry::Owned { shape, ty, bytes },
                );
                entries.insert(
                    format!("{canonical}.scale"),
                    Entry::Owned {
                        shape: vec![1],
                        ty: GgmlType::F32,
                        bytes: factor.to_le_bytes().to_vec(),
                    },
                );
                n_ternary += 1;
            }
            "weight" => {
                let (info, _) = files.get(&tensor).expect("listed");
                if !info.dtype.is_float() {
                    return Err(Error::Format(format!(
                        "'{tensor}' is {} {:?}; only the attention and MLP projections of a \
                         BitNet folder are packed",
                        info.dtype.name(),
                        info.shape
                    )));
                }
                entries.insert(
                    format!("{canonical}.weight"),
                    Entry::Plain {
                        hf: tensor.clone(),
                        dtype: info.dtype,
                    },
                );
            }
            _ => {
                return Err(Error::Format(format!(
                    "tensor '{tensor}' is not part of a BitNet b1.58 folder (expected \
                     '<module>.weight', and '<module>.weight_scale' beside packed projections)"
                )))
            }
        }
    }
    let how = if q.online {
        "full-precision masters ternarized at load (absmean per tensor, quantization_mode online)"
            .to_string()
    } else {
        format!(
            "packed uint8 (4 rows per byte) + weight_scale ({})",
            if q.divide {
                "divided: linear_class bitlinear"
            } else {
                "multiplied: linear_class autobitlinear"
            }
        )
    };
    let description = format!(
        "BitNet folder, {} safetensors file(s): {n_ternary} ternary matrices, {how}; per-tensor \
         scales folded into the group scales",
        files.files().len()
    );
    Ok(FolderSource {
        files,
        entries,
        description,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_the_quantization_block() {
        let q = BitNetQuant::parse(&json!({"quant_method": "bitnet"}))
            .unwrap()
            .unwrap();
        assert!(q.divide && !q.online);
        let q = BitNetQuant::parse(&json!({"quant_method": "bitnet",
            "linear_class": "autobitlinear", "quantization_mode": "online"}))
        .unwrap()
        .unwrap();
        assert!(!q.divide && q.online);
        assert_eq!(BitNetQuant::parse(&json!({"bits": 2})).unwrap(), None);
        let e = BitNetQuant::parse(&json!({"quant_method": "bitnet", "linear_class": "x"}))
            .unwrap_err();
        assert!(e.to_string().contains("linear_class 'x'"), "{e}");
        let e = BitNetQuant::parse(&json!({"quant_method": "bitnet", "use_rms_norm": true}))
            .unwrap_err();
        assert!(e.to_string().contains("use_rms_norm"), "{e}");
        assert_eq!(block_type(2560), Some(GgmlType::TQ2_0));
        assert_eq!(block_type(6912), Some(GgmlType::TQ2_0));
        assert_eq!(block_type(192), Some(GgmlType::Q2_0));
        assert_eq!(block_type(100), None);
    }
}
