//! Encoded tensors of a conversion and the two containers they go into: one GGUF file, or an
//! MLX 2-bit folder (`model.safetensors` + the side files `meta` writes).

use crate::format::canonical_to_hf;
use crate::format::gguf_write::GgufWriter;
use crate::format::safetensors::{self, TensorSpec};
use crate::format::Dtype;
use crate::quant::GgmlType;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// One tensor ready to be written, under its canonical (GGUF) name.
pub struct OutTensor {
    pub name: String,
    /// Outermost first (`[out, in]`).
    pub shape: Vec<usize>,
    pub data: OutData,
}

pub enum OutData {
    /// A ggml block type (ternary or not).
    Ggml { ty: GgmlType, bytes: Vec<u8> },
    /// Plain little-endian floats.
    Plain { dtype: Dtype, bytes: Vec<u8> },
    /// MLX 2-bit module: u32 code words, f16 scales and biases (`-scale`), group 128.
    Mlx {
        codes: Vec<u8>,
        scales: Vec<u8>,
        biases: Vec<u8>,
    },
}

impl OutData {
    pub fn kind_name(&self) -> String {
        match self {
            OutData::Ggml { ty, .. } => ty.name().to_string(),
            OutData::Plain { dtype, .. } => dtype.name().to_string(),
            OutData::Mlx { .. } => "MLX 2-bit g128".to_string(),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            OutData::Ggml { bytes, .. } | OutData::Plain { bytes, .. } => bytes.len(),
            OutData::Mlx {
                codes,
                scales,
                biases,
            } => codes.len() + scales.len() + biases.len(),
        }
    }
}

/// Adds the tensors to a writer that already holds the metadata, then writes the file.
pub fn write_gguf(mut w: GgufWriter, tensors: Vec<OutTensor>, path: &Path) -> Result<()> {
    for t in tensors {
        let (ty, bytes) = match t.data {
            OutData::Ggml { ty, bytes } => (ty, bytes),
            OutData::Plain { dtype, bytes } => {
                let ty = match dtype {
                    Dtype::F32 => GgmlType::F32,
                    Dtype::F16 => GgmlType::F16,
                    Dtype::BF16 => GgmlType::BF16,
                    other => {
                        return Err(Error::Unsupported(format!(
                            "tensor '{}': dtype {} has no GGUF type",
                            t.name,
                            other.name()
                        )))
                    }
                };
                (ty, bytes)
            }
            OutData::Mlx { .. } => unreachable!("MLX tensors are encoded for folders only"),
        };
        w.add_tensor(t.name, &t.shape, ty, bytes)?;
    }
    w.write_file(path)
}

/// The Hugging Face tensor name of a canonical weight (`blk.0.attn_q.weight` →
/// `model.layers.0.self_attn.q_proj.weight`), without the `.weight`.
pub fn hf_module(canonical: &str) -> Result<String> {
    canonical
        .strip_suffix(".weight")
        .and_then(canonical_to_hf)
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor '{canonical}' has no Hugging Face module name trit knows, so it can \
                 not be written into an MLX folder"
            ))
        })
}

/// Writes `model.safetensors` of an MLX folder (`{"format": "mlx"}` metadata, as mlx-lm does).
pub fn write_mlx_weights(tensors: &[OutTensor], dir: &Path) -> Result<()> {
    let mut specs = Vec::new();
    let mut parts: Vec<&[u8]> = Vec::new();
    for t in tensors {
        let module = hf_module(&t.name)?;
        match &t.data {
            OutData::Mlx {
                codes,
                scales,
                biases,
            } => {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                let groups = vec![rows, cols / 128];
                for (suffix, dtype, shape, bytes) in [
                    ("weight", Dtype::U32, vec![rows, cols / 16], codes),
                    ("scales", Dtype::F16, groups.clone(), scales),
                    ("biases", Dtype::F16, groups, biases),
                ] {
                    specs.push(TensorSpec {
                        name: format!("{module}.{suffix}"),
                        dtype,
                        shape,
                    });
                    parts.push(bytes);
                }
            }
            OutData::Plain { dtype, bytes } => {
                specs.push(TensorSpec {
                    name: format!("{module}.weight"),
                    dtype: *dtype,
                    shape: t.shape.clone(),
                });
                parts.push(bytes);
            }
            OutData::Ggml { ty, .. } => {
                return Err(Error::Unsupported(format!(
                    "tensor '{}': {} blocks can not be stored in an MLX folder",
                    t.name,
                    ty.name()
                )))
            }
        }
    }
    let path = dir.join("model.safetensors");
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    safetensors::write(&path, &meta, &specs, |i, out| {
        out.write_all(parts[i]).map_err(|e| Error::io(&path, e))
    })
}
