//! Writers for generated BitNet b1.58 models (`tiny-bitnet`, `2b-bitnet`): the Hugging Face
//! folder microsoft/bitnet-b1.58-2B-4T ships (uint8 `[out/4, in]` projections, four output rows
//! per byte, bf16 `weight_scale` divided by, bf16 embedding and norms; loads in mlx-lm 0.32.2
//! and transformers) and GGUF `bitnet` files in any ternary block type.
//!
//! Codes come from `gen_ternary` (the same stream as every preset); each projection gets one
//! bf16 `weight_scale` `ws ≈ 1 / (base · U(0.5, 1.5))`, so its weights are `t / ws`. The GGUF
//! export stores unit block scales plus a scalar F32 `<name>.scale = 1/ws` (llama.cpp's
//! per-tensor scale tensors), so both files hold bit-identical weights; norms are bf16 values
//! (F32 in GGUF), the embedding is bf16 in both.

use super::tokenizer_meta::LoadedTokenizer;
use super::writers::{self, add_metadata, io, write_file};
use super::{gen_norm, gen_ternary, gen_uniform, Kind, OutFormat, Plan, Preset, SplitMix};
use crate::format::canonical_to_hf;
use crate::format::gguf_write::GgufWriter;
use crate::format::safetensors::{self, TensorSpec};
use crate::format::Dtype;
use crate::quant::{bitnet::pack_hf, ternary::encode_matrix, GgmlType};
use crate::{Error, Result};
use half::bf16;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The stored `weight_scale` of a projection (bf16; the weights are `t / ws`).
pub fn weight_scale(seed: u64, plan: &Plan) -> bf16 {
    let Kind::Ternary { base } = plan.kind else {
        panic!("weight_scale of {}", plan.name)
    };
    let mut rng = SplitMix::for_row(seed, &plan.name, usize::MAX);
    bf16::from_f32(1.0 / (base * (0.5 + rng.unit() as f32)))
}

/// A norm or embedding as the bf16 values both files hold.
fn plain_values(seed: u64, plan: &Plan) -> Vec<bf16> {
    match plan.kind {
        Kind::Norm => gen_norm(seed, plan)
            .iter()
            .map(|v| bf16::from_f32(v.to_f32()))
            .collect(),
        _ => gen_uniform(seed, plan)
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect(),
    }
}

fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn hf_module(canonical: &str) -> String {
    let module = canonical.strip_suffix(".weight").unwrap_or(canonical);
    canonical_to_hf(module).expect("generator names are canonical")
}

/// The llama folder's config.json with 2B4T's class, activation and quantization block.
fn config_json(p: &Preset) -> Value {
    let mut c = writers::config_json(p, false);
    c["architectures"] = json!(["BitNetForCausalLM"]);
    c["model_type"] = json!("bitnet");
    c["hidden_act"] = json!("relu2");
    c["torch_dtype"] = json!("bfloat16");
    c["quantization_config"] = json!({
        "quant_method": "bitnet",
        "linear_class": "bitlinear",
        "quantization_mode": "offline"
    });
    c
}

/// The tokenizer config without a chat template (BitNet ships none; trit uses its own).
fn tokenizer_config(tok: &LoadedTokenizer) -> Result<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(&tok.tokenizer_config_json)
        .map_err(|e| Error::Tokenizer(format!("tokenizer_config.json: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.remove("chat_template");
    }
    Ok(serde_json::to_vec_pretty(&v).expect("json"))
}

/// The Hugging Face folder of 2B4T's layout.
pub fn write_hf_folder(p: &Preset, seed: u64, dir: &Path, tok: &LoadedTokenizer) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let plans = p.tensors();
    // (plan, is the scale) for each spec.
    let mut specs = Vec::new();
    let mut owners = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let module = hf_module(&plan.name);
        match plan.kind {
            Kind::Ternary { .. } => {
                let (rows, cols) = (plan.shape[0], plan.shape[1]);
                specs.push(TensorSpec {
                    name: format!("{module}.weight"),
                    dtype: Dtype::U8,
                    shape: vec![rows / 4, cols],
                });
                owners.push((i, false));
                specs.push(TensorSpec {
                    name: format!("{module}.weight_scale"),
                    dtype: Dtype::BF16,
                    shape: vec![1],
                });
                owners.push((i, true));
            }
            _ => {
                specs.push(TensorSpec {
                    name: format!("{module}.weight"),
                    dtype: Dtype::BF16,
                    shape: plan.shape.clone(),
                });
                owners.push((i, false));
            }
        }
    }
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let path = dir.join("model.safetensors");
    safetensors::write(&path, &meta, &specs, |k, out| {
        let (i, is_scale) = owners[k];
        let plan = &plans[i];
        let bytes = match (plan.kind, is_scale) {
            (Kind::Ternary { .. }, true) => weight_scale(seed, plan).to_le_bytes().to_vec(),
            (Kind::Ternary { .. }, false) => {
                let t = gen_ternary(seed, plan);
                pack_hf(&t.codes, t.rows, t.cols)
            }
            _ => bf16_bytes(&plain_values(seed, plan)),
        };
        out.write_all(&bytes).map_err(io(&path))
    })?;
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).expect("json");
    write_file(&dir.join("config.json"), &pretty(&config_json(p)))?;
    let generation = json!({
        "bos_token_id": p.bos, "eos_token_id": [p.eos, p.pad],
        "do_sample": true, "temperature": 0.6, "top_p": 0.9
    });
    write_file(&dir.join("generation_config.json"), &pretty(&generation))?;
    write_file(&dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_file(&dir.join("tokenizer_config.json"), &tokenizer_config(tok)?)
}

/// A GGUF `bitnet` file: projections as `ty` blocks of unit scale + F32 `<name>.scale`,
/// norms F32, embedding BF16. No Q/K permutation (llama.cpp's BitNet converter has none).
pub fn write_gguf(
    p: &Preset,
    seed: u64,
    path: &Path,
    ty: GgmlType,
    tok: &LoadedTokenizer,
) -> Result<()> {
    let mut w = GgufWriter::new();
    add_metadata(&mut w, p, tok)?;
    for plan in p.tensors() {
        match plan.kind {
            Kind::Ternary { .. } => {
                let t = gen_ternary(seed, &plan);
                let ones = vec![1.0f32; t.rows * t.cols / 64];
                let bytes = encode_matrix(ty, t.rows, t.cols, &t.codes, &ones)?;
                w.add_tensor(plan.name.clone(), &plan.shape, ty, bytes)?;
                let factor = 1.0 / weight_scale(seed, &plan).to_f32();
                let stem = plan.name.strip_suffix(".weight").expect("weight");
                w.add_tensor(
                    format!("{stem}.scale"),
                    &[1],
                    GgmlType::F32,
                    factor.to_le_bytes().to_vec(),
                )?;
            }
            Kind::Norm => {
                let v: Vec<u8> = plain_values(seed, &plan)
                    .iter()
                    .flat_map(|x| x.to_f32().to_le_bytes())
                    .collect();
                w.add_tensor(plan.name.clone(), &plan.shape, GgmlType::F32, v)?;
            }
            _ => {
                let v = bf16_bytes(&plain_values(seed, &plan));
                w.add_tensor(plan.name.clone(), &plan.shape, GgmlType::BF16, v)?;
            }
        }
    }
    w.write_file(path)
}

/// Writes the requested formats of a bitnet preset: `hf` and ternary GGUF types.
pub(super) fn generate(
    p: &Preset,
    seed: u64,
    out: &Path,
    formats: &[OutFormat],
    tok: &LoadedTokenizer,
) -> Result<()> {
    for &f in formats {
        let path = out.join(f.file_name());
        match f {
            OutFormat::Hf => write_hf_folder(p, seed, &path, tok)?,
            OutFormat::Gguf(ty) => write_gguf(p, seed, &path, ty, tok)?,
            OutFormat::Mlx | OutFormat::F16 => {
                return Err(Error::InvalidArgument(format!(
                    "preset {} writes the formats hf and ternary GGUF types (not mlx/f16)",
                    p.name
                )))
            }
        }
    }
    Ok(())
}
