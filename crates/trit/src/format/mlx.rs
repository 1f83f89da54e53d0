//! MLX affine 2-bit folders (formats.md §3): `config.json` with a `quantization` (or
//! `quantization_config`) block, safetensors holding `<module>.weight` (u32 codes),
//! `<module>.scales` and `<module>.biases` per quantized module and plain norm weights.
//!
//! A module is quantized exactly when `<module>.scales` exists (mlx-lm's rule). The folder is
//! ternary when every group has `bias == -scale` bit for bit; otherwise it is a generic 2-bit
//! affine model, still exposed as `TensorData::Mlx` for a dequantizing path, or refused when
//! `OpenOptions::require_ternary` is set.

use super::folder::{is_vision, module_of, split_tensor_name, Entry, FolderSource};
use super::safetensors::SafetensorsSet;
use super::{Dtype, OpenOptions};
use crate::quant::{HalfKind, MlxTernary};
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// Quantization modes mlx knows that are not affine integer codes.
const NON_TERNARY_MODES: &[&str] = &["mxfp4", "nvfp4", "mxfp8"];

/// Group sizes whose scales line up with the kernels' 64-column scale blocks.
const GROUP_SIZES: &[usize] = &[64, 128];

/// The `quantization` block of an MLX `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    pub group_size: usize,
    pub bits: usize,
    pub mode: String,
    /// Per-module overrides: `Some((group_size, bits))`, or `None` for `"<path>": false`.
    pub overrides: BTreeMap<String, Option<(usize, usize)>>,
}

fn uint(obj: &Value, key: &str, what: &str) -> Result<usize> {
    match obj.get(key) {
        None => Err(Error::Config(format!(
            "config.json quantization{what}: missing key '{key}'"
        ))),
        Some(v) => v.as_u64().map(|n| n as usize).ok_or_else(|| {
            Error::Config(format!(
                "config.json quantization{what}: '{key}' should be an integer, found {v}"
            ))
        }),
    }
}

impl QuantConfig {
    pub fn parse(v: &Value) -> Result<QuantConfig> {
        let Value::Object(map) = v else {
            return Err(Error::Config(format!(
                "config.json: quantization should be an object, found {v}"
            )));
        };
        let mode = match map.get("mode") {
            None | Some(Value::Null) => "affine".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(Error::Config(format!(
                    "config.json quantization: 'mode' should be a string, found {other}"
                )))
            }
        };
        if mode != "affine" {
            let why = if NON_TERNARY_MODES.contains(&mode.as_str()) {
                "a floating-point quantization, not ternary"
            } else {
                "unknown"
            };
            return Err(Error::Unsupported(format!(
                "MLX quantization mode '{mode}' ({why}); trit reads affine 2-bit (ternary) MLX folders"
            )));
        }
        let group_size = uint(v, "group_size", "")?;
        let bits = uint(v, "bits", "")?;
        check_bits_group(bits, group_size, "the model")?;
        let mut overrides = BTreeMap::new();
        for (key, value) in map {
            match value {
                Value::Bool(false) => {
                    overrides.insert(key.clone(), None);
                }
                Value::Object(o) if o.contains_key("bits") || o.contains_key("group_size") => {
                    let what = format!(" override '{key}'");
                    let g = match o.get("group_size") {
                        Some(_) => uint(value, "group_size", &what)?,
                        None => group_size,
                    };
                    let b = match o.get("bits") {
                        Some(_) => uint(value, "bits", &what)?,
                        None => bits,
                    };
                    overrides.insert(key.clone(), Some((g, b)));
                }
                _ => {}
            }
        }
        Ok(QuantConfig {
            group_size,
            bits,
            mode,
            overrides,
        })
    }

    /// `(group_size, bits)` for a module, or `None` when an override disables quantization.
    pub fn for_module(&self, module: &str) -> Option<(usize, usize)> {
        match self.overrides.get(module) {
            Some(o) => *o,
            None => Some((self.group_size, self.bits)),
        }
    }
}

fn check_bits_group(bits: usize, group_size: usize, what: &str) -> Result<()> {
    if !matches!(bits, 1 | 2) {
        return Err(Error::Unsupported(format!(
            "MLX quantization of {what} uses {bits} bits; trit reads 2-bit (ternary) and 1-bit (binary) MLX folders only"
        )));
    }
    if !GROUP_SIZES.contains(&group_size) {
        return Err(Error::Unsupported(format!(
            "MLX quantization of {what} uses group_size {group_size}; trit supports {GROUP_SIZES:?}"
        )));
    }
    Ok(())
}

/// A quantized module found in the folder.
struct Packed {
    module: String,
    canonical: String,
    entry: Entry,
    /// Why the module is not ternary (quant::MlxTernary's check), if it is not.
    non_ternary: Option<String>,
}

fn packed_module(
    files: &SafetensorsSet,
    q: &QuantConfig,
    module: &str,
    canonical: String,
) -> Result<Packed> {
    let (group_size, bits) = q.for_module(module).ok_or_else(|| {
        Error::Config(format!(
            "config.json quantization says \"{module}\": false, but '{module}.scales' exists"
        ))
    })?;
    check_bits_group(bits, group_size, &format!("'{module}'"))?;
    let name = |s: &str| format!("{module}.{s}");
    let (winfo, _) = files.get(&name("weight")).ok_or_else(|| {
        Error::Format(format!(
            "'{}' exists but '{}' does not",
            name("scales"),
            name("weight")
        ))
    })?;
    let (sinfo, scales) = files.get(&name("scales")).expect("checked by caller");
    let (binfo, biases) = files.get(&name("biases")).ok_or_else(|| {
        Error::Format(format!(
            "'{}' is missing beside the packed '{}' (affine MLX needs scales and biases)",
            name("biases"),
            name("weight")
        ))
    })?;
    if winfo.dtype != Dtype::U32 || winfo.shape.len() != 2 {
        return Err(Error::Format(format!(
            "'{}' should be U32 [out, in·bits/32] codes beside its scales, found {} {:?}",
            name("weight"),
            winfo.dtype.name(),
            winfo.shape
        )));
    }
    let (rows, cols) = (winfo.shape[0], winfo.shape[1] * 32 / bits);
    // (U32 [out, in·bits/32]: 16 codes per word at 2 bits, 32 at 1.)
    if !cols.is_multiple_of(group_size) {
        return Err(Error::ShapeMismatch {
            tensor: name("weight"),
            found: vec![rows, cols],
            expected: vec![rows, cols.div_ceil(group_size) * group_size],
        });
    }
    let groups = vec![rows, cols / group_size];
    let kind = match sinfo.dtype {
        Dtype::F16 => HalfKind::F16,
        Dtype::BF16 => HalfKind::BF16,
        other => {
            return Err(Error::Unsupported(format!(
                "'{}' is {}; MLX scales must be F16 or BF16",
                name("scales"),
                other.name()
            )))
        }
    };
    if sinfo.shape != groups {
        return Err(Error::Format(format!(
            "'{}' should be a float tensor of shape {groups:?} (codes are [{rows}, {cols}], group {group_size}), found {} {:?}",
            name("scales"),
            sinfo.dtype.name(),
            sinfo.shape
        )));
    }
    if binfo.dtype != sinfo.dtype || binfo.shape != sinfo.shape {
        return Err(Error::Format(format!(
            "'{}' ({} {:?}) does not match '{}' ({} {:?})",
            name("biases"),
            binfo.dtype.name(),
            binfo.shape,
            name("scales"),
            sinfo.dtype.name(),
            sinfo.shape
        )));
    }
    let (_, codes) = files.get(&name("weight")).expect("checked above");
    let view = MlxTernary::with_bits(codes, scales, biases, kind, rows, cols, group_size, bits)?;
    let non_ternary = view.check_ternary().err().map(|e| e.to_string());
    Ok(Packed {
        module: module.to_string(),
        canonical,
        entry: Entry::Mlx {
            module: module.to_string(),
            shape: vec![rows, cols],
            scale_dtype: sinfo.dtype,
            group_size,
            bits,
        },
        non_ternary,
    })
}

/// Builds the weight source of an MLX folder.
pub(super) fn build(
    files: SafetensorsSet,
    q: &QuantConfig,
    skip_lm_head: bool,
    rotated_pack: bool,
    options: OpenOptions,
) -> Result<FolderSource> {
    let mut entries = BTreeMap::new();
    let mut packed = Vec::new();
    let mut vision = 0;
    for tensor in files.names() {
        // A rotated pack's sign vectors were read (and checked) with its manifest.
        if rotated_pack && tensor.ends_with(".signs") {
            continue;
        }
        if is_vision(&tensor) {
            vision += 1;
            continue;
        }
        let Some((module, canonical)) = module_of(&tensor)? else {
            continue;
        };
        if skip_lm_head && canonical == "output" {
            continue;
        }
        let (_, suffix) = split_tensor_name(&tensor);
        let quantized = files.contains(&format!("{module}.scales"));
        match suffix {
            "A_log" | "dt_bias" => {
                let (info, _) = files.get(&tensor).expect("listed");
                if !info.dtype.is_float() {
                    return Err(Error::Format(format!(
                        "'{tensor}' should be a float vector, found {} {:?}",
                        info.dtype.name(),
                        info.shape
                    )));
                }
                entries.insert(
                    canonical,
                    Entry::Plain {
                        hf: tensor.clone(),
                        dtype: info.dtype,
                    },
                );
            }
            "weight" if quantized => {}
            "scales" => packed.push(packed_module(&files, q, &module, canonical)?),
            "biases" if quantized => {}
            "biases" => {
                return Err(Error::Format(format!(
                    "'{tensor}' exists but '{module}.scales' does not"
                )))
            }
            "weight" => {
                let (info, _) = files.get(&tensor).expect("listed");
                if !info.dtype.is_float() {
                    return Err(Error::Format(format!(
                        "'{tensor}' is packed ({} {:?}) but '{module}.scales' is missing",
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
                return Err(Error::Unsupported(format!(
                    "tensor '{tensor}': llama/qwen3/qwen3_5 modules have no '{suffix}'"
                )))
            }
        }
    }
    let n_packed = packed.len();
    let generic: Vec<&Packed> = packed.iter().filter(|p| p.non_ternary.is_some()).collect();
    if let (Some(p), true) = (generic.first(), options.require_ternary) {
        let why = p.non_ternary.as_deref().unwrap_or_default();
        return Err(Error::Unsupported(format!(
            "'{}' ({}.weight) is generic 2-bit affine, not ternary: {why}",
            p.module, p.canonical
        )));
    }
    let ternary_note = match generic.first() {
        None => "all ternary (biases == -scales)".to_string(),
        Some(p) => format!(
            "{} of {n_packed} generic affine, not ternary (first: {})",
            generic.len(),
            p.canonical
        ),
    };
    for p in packed {
        entries.insert(format!("{}.weight", p.canonical), p.entry);
    }
    let vision_note = if vision > 0 {
        format!("; {vision} vision-tower tensors skipped (images are not supported yet, text only)")
    } else {
        String::new()
    };
    let description = format!(
        "MLX affine {}-bit g{} folder, {} safetensors file(s), {n_packed} packed tensors: {ternary_note}{vision_note}",
        q.bits,
        q.group_size,
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
    fn parses_quantization_blocks() {
        let q = QuantConfig::parse(&json!({"group_size": 128, "bits": 2})).unwrap();
        assert_eq!((q.group_size, q.bits, q.mode.as_str()), (128, 2, "affine"));
        let q = QuantConfig::parse(&json!({
            "group_size": 128, "bits": 2, "mode": "affine",
            "lm_head": false, "model.embed_tokens": {"group_size": 64, "bits": 2}
        }))
        .unwrap();
        assert_eq!(q.for_module("lm_head"), None);
        assert_eq!(q.for_module("model.embed_tokens"), Some((64, 2)));
        assert_eq!(q.for_module("model.layers.0.mlp.up_proj"), Some((128, 2)));
    }

    #[test]
    fn refuses_unsupported_quantization() {
        let err = |v| QuantConfig::parse(&v).unwrap_err().to_string();
        let e = err(json!({"group_size": 32, "bits": 4, "mode": "mxfp4"}));
        assert!(
            e.contains("mode 'mxfp4'") && e.contains("not ternary"),
            "{e}"
        );
        let e = err(json!({"group_size": 64, "bits": 4}));
        assert!(e.contains("4 bits"), "{e}");
        let e = err(json!({"group_size": 32, "bits": 2}));
        assert!(e.contains("group_size 32"), "{e}");
        let e = err(json!({"bits": 2}));
        assert!(e.contains("missing key 'group_size'"), "{e}");
    }
}
