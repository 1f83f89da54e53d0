//! GGUF `prism.hadamard.*` metadata (formats.md §8.3): which tensors of a Bonsai 2 file are
//! stored in the rotated basis, with one block size and one sign vector per input width.
//! Every key is checked the way PrismML's loader checks it; a file with the keys is either
//! applied completely or refused with a message naming the key — stock runtimes that skip
//! the keys load such files and print garbage.

use super::gguf::{Array, GgufFile, Value};
use super::rotation::{InputRotation, RotationSpec};
use crate::{Error, Result};
use std::collections::BTreeMap;

const PREFIX: &str = "prism.hadamard.";
const TRANSFORM: &str = "normalized-sylvester-walsh-hadamard";
const AXIS: &str = "input-last-dimension";
/// Tensor kinds the fork allows in `weight_names` (`blk.N.<kind>.weight`, or `output.weight`).
const FOLDABLE: &[&str] = &[
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_gate",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
    "ffn_gate_up_exps",
    "ssm_out",
];
const ARCHS: &[&str] = &[
    "llama",
    "qwen3",
    "qwen3moe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "dspark",
];

fn bad(file: &GgufFile, key: &str, msg: impl std::fmt::Display) -> Error {
    Error::Format(format!(
        "{}: metadata '{PREFIX}{key}': {msg}",
        file.source()
    ))
}

fn ints(file: &GgufFile, key: &str) -> Result<Vec<i64>> {
    let v = file
        .get(&format!("{PREFIX}{key}"))
        .ok_or_else(|| bad(file, key, "missing"))?;
    let out: Option<Vec<i64>> = match v.as_array() {
        Some(Array::I32(a)) => Some(a.iter().map(|&x| x as i64).collect()),
        Some(Array::U32(a)) => Some(a.iter().map(|&x| x as i64).collect()),
        Some(Array::I8(a)) => Some(a.iter().map(|&x| x as i64).collect()),
        Some(Array::I16(a)) => Some(a.iter().map(|&x| x as i64).collect()),
        Some(Array::I64(a)) => Some(a.clone()),
        Some(Array::U64(a)) => Some(a.iter().map(|&x| x as i64).collect()),
        Some(Array::F32(a)) if a.iter().all(|x| x.fract() == 0.0) => {
            Some(a.iter().map(|&x| x as i64).collect())
        }
        _ => None,
    };
    out.ok_or_else(|| {
        bad(
            file,
            key,
            format!("should be an integer array, is {}", v.type_name()),
        )
    })
}

fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>> {
    let v = file
        .get(&format!("{PREFIX}{key}"))
        .ok_or_else(|| bad(file, key, "missing"))?;
    v.as_str_array().map(<[String]>::to_vec).ok_or_else(|| {
        bad(
            file,
            key,
            format!("should be a string array, is {}", v.type_name()),
        )
    })
}

fn string(file: &GgufFile, key: &str) -> Result<String> {
    let v = file
        .get(&format!("{PREFIX}{key}"))
        .ok_or_else(|| bad(file, key, "missing"))?;
    v.as_str().map(str::to_string).ok_or_else(|| {
        bad(
            file,
            key,
            format!("should be a string, is {}", v.type_name()),
        )
    })
}

fn is_foldable(name: &str) -> bool {
    if name == "output.weight" {
        return true;
    }
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    match rest.split_once('.') {
        Some((layer, kind)) => {
            layer.parse::<usize>().is_ok()
                && kind
                    .strip_suffix(".weight")
                    .is_some_and(|k| FOLDABLE.contains(&k))
        }
        None => false,
    }
}

/// The file's rotation, or `None` when it has no `prism.hadamard.*` keys (an unrotated model).
pub fn read(file: &GgufFile) -> Result<Option<RotationSpec>> {
    if !file.metadata().iter().any(|(k, _)| k.starts_with(PREFIX)) {
        return Ok(None);
    }
    let arch = file.get_str("general.architecture").unwrap_or_default();
    if !ARCHS.contains(&arch) {
        return Err(bad(
            file,
            "*",
            format!("not defined for architecture '{arch}'"),
        ));
    }
    let version = file.get_u64(&format!("{PREFIX}version"));
    if !matches!(version, Some(1 | 2)) {
        return Err(bad(file, "version", format!("{version:?}; known: 1, 2")));
    }
    if string(file, "transform")? != TRANSFORM {
        return Err(bad(
            file,
            "transform",
            format!("only '{TRANSFORM}' is defined"),
        ));
    }
    if string(file, "axis")? != AXIS {
        return Err(bad(file, "axis", format!("only '{AXIS}' is defined")));
    }
    let block = file
        .get_u64(&format!("{PREFIX}block_size"))
        .map(|b| b as usize)
        .filter(|b| b.is_power_of_two())
        .ok_or_else(|| bad(file, "block_size", "missing or not a power of two"))?;
    let names = strings(file, "weight_names")?;
    let inverse = strings(file, "inverse_weight_names")?;
    if let Some(n) = inverse.iter().find(|n| *n != "token_embd.weight") {
        return Err(bad(
            file,
            "inverse_weight_names",
            format!("'{n}' (only token_embd.weight)"),
        ));
    }
    if version == Some(2) && file.tensor("output.weight").is_some() {
        return Err(bad(
            file,
            "version",
            "version 2 requires a tied output (no output.weight)",
        ));
    }
    // Sign vectors by input width.
    let mode = string(file, "sign_mode")?;
    let mut signs: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    let explicit = match mode.as_str() {
        "identity" => false,
        "explicit" => true,
        other => {
            return Err(bad(
                file,
                "sign_mode",
                format!("'{other}' (identity or explicit)"),
            ))
        }
    };
    if explicit {
        let widths = ints(file, "sign_widths")?;
        let values = ints(file, "sign_values")?;
        let total: i64 = widths.iter().sum();
        if widths.iter().any(|&w| w <= 0) || total != values.len() as i64 {
            return Err(bad(
                file,
                "sign_values",
                format!("{} values for widths {widths:?}", values.len()),
            ));
        }
        if let Some(v) = values.iter().find(|&&v| v != 1 && v != -1) {
            return Err(bad(
                file,
                "sign_values",
                format!("holds {v}; signs are -1 or +1"),
            ));
        }
        let mut at = 0;
        for &w in &widths {
            let w = w as usize;
            let vals = values[at..at + w].iter().map(|&v| v as f32).collect();
            if signs.insert(w, vals).is_some() {
                return Err(bad(file, "sign_widths", format!("width {w} listed twice")));
            }
            at += w;
        }
    }
    let rotation_for = |name: &str| -> Result<InputRotation> {
        let info = file.tensor(name).ok_or_else(|| {
            bad(
                file,
                "weight_names",
                format!("names '{name}', not in the file"),
            )
        })?;
        let width = *info.shape.last().unwrap_or(&0);
        if width == 0 || !width.is_multiple_of(block) {
            return Err(bad(
                file,
                "block_size",
                format!("{block} does not divide the input width {width} of '{name}'"),
            ));
        }
        let s = if explicit {
            signs.get(&width).cloned().ok_or_else(|| {
                bad(
                    file,
                    "sign_widths",
                    format!("no sign vector of width {width} ('{name}')"),
                )
            })?
        } else {
            vec![1.0; width]
        };
        Ok(InputRotation { block, signs: s })
    };
    let mut spec = RotationSpec {
        ssm_out_grouped: file
            .get(&format!("{PREFIX}gdn_v_grouped"))
            .map(|v: &Value| {
                v.as_bool()
                    .ok_or_else(|| bad(file, "gdn_v_grouped", "should be a bool"))
            })
            .transpose()?
            .unwrap_or(false),
        ..Default::default()
    };
    for name in &names {
        if !is_foldable(name) {
            return Err(bad(
                file,
                "weight_names",
                format!("'{name}' is not a foldable weight"),
            ));
        }
        let rot = rotation_for(name)?;
        spec.insert(name.clone(), rot);
    }
    if inverse.iter().any(|n| n == "token_embd.weight") {
        spec.embedding = Some(std::sync::Arc::new(rotation_for("token_embd.weight")?));
    }
    Ok(Some(spec))
}
