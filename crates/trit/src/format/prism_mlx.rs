//! The Bonsai 2 MLX pack (`model_type: prism_hadamard_qwen35`, formats.md §3.6): a qwen3_5
//! 2-bit folder whose `config.json` also carries a manifest of packed modules with their
//! Hadamard block size, and a `<module>.signs` f32 tensor per rotated module. Checked the way
//! mlx-lm's `prism_hadamard_qwen35.py` checks it; anything inconsistent is an error, since a
//! pack read without its rotation runs but prints garbage.

use super::folder::{hf_to_canonical, strip_language_model};
use super::rotation::{InputRotation, RotationSpec};
use super::safetensors::SafetensorsSet;
use super::Dtype;
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeSet;

pub const MODEL_TYPE: &str = "prism_hadamard_qwen35";
/// Block sizes the pack format allows (0 = not rotated).
const BLOCKS: &[usize] = &[0, 512, 1024, 2048, 4096, 8192];

fn bad(msg: String) -> Error {
    Error::Format(format!("{MODEL_TYPE} pack: {msg}"))
}

/// Checks the pack's schema keys and reads its rotations from the manifest and sign tensors.
pub fn read(config: &Value, files: &SafetensorsSet) -> Result<RotationSpec> {
    let schema = config.get("schema_version").and_then(Value::as_u64);
    let namespace = config.get("tensor_namespace").and_then(Value::as_str);
    let expected = match schema {
        Some(1) => "mlx-lm-text",
        Some(2) => "mlx-vlm-qwen3_5",
        _ => {
            return Err(bad(format!(
                "unsupported schema_version {} (known: 1, 2)",
                config.get("schema_version").unwrap_or(&Value::Null)
            )))
        }
    };
    if namespace != Some(expected) {
        return Err(bad(format!(
            "tensor_namespace {namespace:?} does not match schema {} (expected \"{expected}\")",
            schema.unwrap_or(0)
        )));
    }
    let layout = config.get("gdn_activation_layout").and_then(Value::as_str);
    if layout.unwrap_or("grouped") != "grouped" {
        return Err(bad(format!(
            "gdn_activation_layout {layout:?}; packs must use \"grouped\""
        )));
    }
    let q = config.get("quantization");
    let exact = serde_json::json!({"bits": 2, "group_size": 128, "mode": "affine"});
    if q != Some(&exact) {
        return Err(bad(format!(
            "quantization must be exactly {exact}, found {}",
            q.unwrap_or(&Value::Null)
        )));
    }
    let modules = match config.get("modules") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        _ => {
            return Err(bad(
                "the packed module manifest ('modules') is missing".into()
            ))
        }
    };
    let mut spec = RotationSpec {
        embedding_f16: true,
        ..Default::default()
    };
    let mut seen = BTreeSet::new();
    let mut signs_used = BTreeSet::new();
    for record in modules {
        let path = record
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("manifest record without a path: {record}")))?;
        if !seen.insert(path.to_string()) {
            return Err(bad(format!("module '{path}' is listed twice")));
        }
        let block = record
            .get("block")
            .and_then(Value::as_u64)
            .map(|b| b as usize)
            .filter(|b| BLOCKS.contains(b))
            .ok_or_else(|| {
                bad(format!(
                    "'{path}': block {} is not one of {BLOCKS:?}",
                    record.get("block").unwrap_or(&Value::Null)
                ))
            })?;
        if record.get("dtype").and_then(Value::as_str) != Some("float16") {
            return Err(bad(format!(
                "'{path}': activation dtype must be \"float16\""
            )));
        }
        let embedding = record.get("embedding").and_then(Value::as_bool);
        let canonical = hf_to_canonical(path)
            .ok_or_else(|| bad(format!("'{path}' is not a module of a qwen3_5 text model")))?;
        if embedding != Some(canonical == "token_embd") {
            return Err(bad(format!(
                "'{path}': \"embedding\" is {embedding:?} but the module is {}an embedding",
                if canonical == "token_embd" {
                    ""
                } else {
                    "not "
                }
            )));
        }
        let module = find_module(files, path)?;
        if files.contains(&format!("{module}.bias")) {
            return Err(bad(format!(
                "'{path}' has a bias, which packs do not allow"
            )));
        }
        let (winfo, _) = files.get(&format!("{module}.weight")).expect("found");
        let width = winfo.shape.get(1).copied().unwrap_or(0) * 16;
        if block == 0 {
            continue;
        }
        if !width.is_multiple_of(128) || !width.is_multiple_of(block) {
            return Err(bad(format!(
                "'{path}': input width {width} is not a multiple of 128 and of block {block}"
            )));
        }
        let signs_name = format!("{module}.signs");
        let signs = read_signs(files, &signs_name, width)?;
        signs_used.insert(signs_name);
        let rot = InputRotation { block, signs };
        if canonical == "token_embd" {
            spec.embedding = Some(std::sync::Arc::new(rot));
        } else {
            spec.insert(format!("{canonical}.weight"), rot);
        }
    }
    // A sign vector the manifest does not claim means the two disagree about the rotation.
    if let Some(extra) = files
        .names()
        .into_iter()
        .find(|n| n.ends_with(".signs") && !signs_used.contains(n))
    {
        return Err(bad(format!(
            "'{extra}' has no rotated module in the manifest (block 0 or unlisted)"
        )));
    }
    Ok(spec)
}

/// The module's name as stored in the file (the manifest path is relative to the language
/// model; files may or may not carry the `language_model.` prefix).
fn find_module(files: &SafetensorsSet, path: &str) -> Result<String> {
    let candidates = [
        format!("language_model.{path}"),
        path.to_string(),
        format!("model.language_model.{}", path.trim_start_matches("model.")),
    ];
    candidates
        .into_iter()
        .find(|m| files.contains(&format!("{m}.scales")) && strip_language_model(m) == path)
        .ok_or_else(|| {
            bad(format!(
                "manifest module '{path}' has no packed weight/scales"
            ))
        })
}

fn read_signs(files: &SafetensorsSet, name: &str, width: usize) -> Result<Vec<f32>> {
    let (info, bytes) = files
        .get(name)
        .ok_or_else(|| bad(format!("missing Hadamard sign vector '{name}'")))?;
    if info.dtype != Dtype::F32 || info.shape != [width] {
        return Err(bad(format!(
            "'{name}' should be F32 [{width}], found {} {:?}",
            info.dtype.name(),
            info.shape
        )));
    }
    let signs: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    if let Some(v) = signs.iter().find(|&&v| v != 1.0 && v != -1.0) {
        return Err(bad(format!(
            "'{name}' holds {v}; Hadamard signs must be exactly -1 or +1"
        )));
    }
    Ok(signs)
}
