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

/// A tensor's place in the output, decided before it is encoded.
pub struct Planned {
    /// Canonical (GGUF) name.
    pub name: String,
    /// Outermost first (`[out, in]`).
    pub shape: Vec<usize>,
    /// `None` for ternary tensors (the target's encoding), else the plain encoding.
    pub plain: Option<Layout>,
}

/// How a non-ternary tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Gguf(GgmlType),
    Mlx(Dtype),
}

/// Produces tensor `i`'s encoded data (called once per tensor, in order).
pub type Next<'a> = &'a mut dyn FnMut(usize) -> Result<OutData>;

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

/// The GGUF type of `data`, as written.
fn gguf_type(name: &str, data: &OutData) -> Result<GgmlType> {
    Ok(match data {
        OutData::Ggml { ty, .. } => *ty,
        OutData::Plain { dtype, .. } => match dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => {
                return Err(Error::Unsupported(format!(
                    "tensor '{name}': dtype {} has no GGUF type",
                    other.name()
                )))
            }
        },
        OutData::Mlx { .. } => unreachable!("MLX tensors are encoded for folders only"),
    })
}

/// Writes one GGUF file: `w`'s metadata, the tensors of `layout` (ternary ones as `ternary`),
/// their data from `next`. Written to `<path>.partial` and renamed when complete, so a refused
/// or failed conversion leaves no file behind.
pub fn write_gguf(
    w: &GgufWriter,
    layout: &[Planned],
    ternary: GgmlType,
    path: &Path,
    next: Next<'_>,
) -> Result<()> {
    let infos: Vec<(String, Vec<usize>, GgmlType)> = layout
        .iter()
        .map(|p| {
            let ty = match p.plain {
                Some(Layout::Gguf(ty)) => ty,
                _ => ternary,
            };
            (p.name.clone(), p.shape.clone(), ty)
        })
        .collect();
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let result = w.write_streaming(&partial, &infos, |i| {
        let data = next(i)?;
        let ty = gguf_type(&infos[i].0, &data)?;
        if ty != infos[i].2 {
            return Err(Error::Format(format!(
                "tensor '{}' was planned as {} but encoded as {}",
                infos[i].0,
                infos[i].2.name(),
                ty.name()
            )));
        }
        Ok(match data {
            OutData::Ggml { bytes, .. } | OutData::Plain { bytes, .. } => bytes,
            OutData::Mlx { .. } => unreachable!("checked by gguf_type"),
        })
    });
    match result {
        Ok(()) => std::fs::rename(&partial, path).map_err(|e| Error::io(path, e)),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
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

/// Writes `model.safetensors` of an MLX folder (`{"format": "mlx"}` metadata, as mlx-lm
/// does), encoding each tensor when its first part is written; removed again on failure.
pub fn write_mlx_weights(layout: &[Planned], dir: &Path, next: Next<'_>) -> Result<()> {
    let mut specs = Vec::new();
    // spec index → (tensor index, part: 0 = weight/codes, 1 = scales, 2 = biases)
    let mut owners = Vec::new();
    for (i, p) in layout.iter().enumerate() {
        let module = hf_module(&p.name)?;
        match p.plain {
            None => {
                let (rows, cols) = (p.shape[0], p.shape[1]);
                let groups = vec![rows, cols / 128];
                for (part, (suffix, dtype, shape)) in [
                    ("weight", Dtype::U32, vec![rows, cols / 16]),
                    ("scales", Dtype::F16, groups.clone()),
                    ("biases", Dtype::F16, groups),
                ]
                .into_iter()
                .enumerate()
                {
                    specs.push(TensorSpec {
                        name: format!("{module}.{suffix}"),
                        dtype,
                        shape,
                    });
                    owners.push((i, part));
                }
            }
            Some(Layout::Mlx(dtype)) => {
                specs.push(TensorSpec {
                    name: format!("{module}.weight"),
                    dtype,
                    shape: p.shape.clone(),
                });
                owners.push((i, 0));
            }
            Some(Layout::Gguf(ty)) => {
                return Err(Error::Unsupported(format!(
                    "tensor '{}': {} blocks can not be stored in an MLX folder",
                    p.name,
                    ty.name()
                )))
            }
        }
    }
    let path = dir.join("model.safetensors");
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    // The scales and biases of the ternary tensor being written, until their turn comes.
    let mut pending: Vec<Vec<u8>> = Vec::new();
    let result = safetensors::write(&path, &meta, &specs, |s, out| {
        let (i, part) = owners[s];
        let bytes = if part == 0 {
            match next(i)? {
                OutData::Mlx {
                    codes,
                    scales,
                    biases,
                } => {
                    pending = vec![biases, scales];
                    codes
                }
                OutData::Plain { bytes, .. } => bytes,
                OutData::Ggml { ty, .. } => {
                    return Err(Error::Unsupported(format!(
                        "tensor '{}': {} blocks can not be stored in an MLX folder",
                        layout[i].name,
                        ty.name()
                    )))
                }
            }
        } else {
            pending.pop().expect("scales and biases follow their codes")
        };
        if bytes.len() != specs[s].n_bytes() {
            return Err(Error::Format(format!(
                "tensor '{}' was planned as {} bytes but encoded as {}",
                specs[s].name,
                specs[s].n_bytes(),
                bytes.len()
            )));
        }
        out.write_all(&bytes).map_err(|e| Error::io(&path, e))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    result
}
