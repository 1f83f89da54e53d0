//! Writers for generated models: MLX 2-bit folder (loads in mlx-lm 0.32.2), GGUF in any
//! ternary block type, unpacked F16 folder. All three write the same values `s · t`.

use super::tokenizer_meta::LoadedTokenizer;
use super::{gen_norm, gen_ternary, Kind, Plan, Preset, Ternary, SCALE_GROUP};
use crate::format::canonical_to_hf;
use crate::format::config::Arch;
use crate::format::gguf_write::GgufWriter;
use crate::format::safetensors::{self, TensorSpec};
use crate::format::Dtype;
use crate::quant::{ternary::encode_matrix, GgmlType};
use crate::{Error, Result};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// MLX group size written by the generator.
pub(super) const MLX_GROUP: usize = 128;

fn hf_name(canonical: &str) -> String {
    let module = canonical.strip_suffix(".weight").unwrap_or(canonical);
    format!(
        "{}.weight",
        canonical_to_hf(module).expect("generator names are canonical")
    )
}

pub(super) fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(path, e)
}

pub(super) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(io(path))
}

pub(super) fn config_json(p: &Preset, quantized: bool) -> Value {
    let (model_type, class) = match p.arch {
        Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        Arch::Qwen35 => unreachable!("hybrid models are written by testgen::hybrid"),
    };
    let mut c = json!({
        "architectures": [class],
        "model_type": model_type,
        "hidden_size": p.hidden,
        "num_hidden_layers": p.n_layers,
        "intermediate_size": p.ffn,
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": p.n_kv_heads,
        "head_dim": p.head_dim,
        "vocab_size": p.vocab,
        "max_position_embeddings": p.max_pos,
        "rope_theta": p.rope_theta,
        "rms_norm_eps": p.norm_eps,
        "tie_word_embeddings": p.tied,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": p.bos,
        "eos_token_id": p.eos,
        "torch_dtype": "float16",
        "rope_scaling": null,
    });
    if let Some((factor, original)) = p.yarn {
        c["rope_scaling"] = json!({
            "type": "yarn", "rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": original
        });
    }
    if quantized {
        let q = json!({"group_size": MLX_GROUP, "bits": 2});
        c["quantization"] = q.clone();
        c["quantization_config"] = q;
    }
    c
}

/// config.json, generation_config.json and the tokenizer files of a folder.
fn write_folder_files(
    p: &Preset,
    dir: &Path,
    tok: &LoadedTokenizer,
    quantized: bool,
) -> Result<()> {
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).expect("json");
    write_file(
        &dir.join("config.json"),
        &pretty(&config_json(p, quantized)),
    )?;
    let generation = json!({
        "bos_token_id": p.bos, "eos_token_id": [p.eos, p.pad], "pad_token_id": p.pad,
        "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95
    });
    write_file(&dir.join("generation_config.json"), &pretty(&generation))?;
    write_file(&dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_file(
        &dir.join("tokenizer_config.json"),
        &tok.tokenizer_config_json,
    )
}

/// Packs codes LSB-first, four per byte (= u32 words of 16 codes, little-endian).
pub(super) fn pack_codes(t: &Ternary) -> Vec<u8> {
    let mut out = vec![0u8; t.codes.len() / 4];
    out.par_chunks_mut(1 << 16)
        .zip(t.codes.par_chunks(1 << 18))
        .for_each(|(o, c)| {
            for (byte, q) in o.iter_mut().zip(c.chunks_exact(4)) {
                *byte = q[0] | q[1] << 2 | q[2] << 4 | q[3] << 6;
            }
        });
    out
}

/// One f16 per 128-group (`negate` gives the biases `-s`), as little-endian bytes.
pub(super) fn group_scales(t: &Ternary, negate: bool) -> Vec<u8> {
    let per = SCALE_GROUP / MLX_GROUP;
    let flip = if negate { 0x8000 } else { 0 };
    t.scales
        .iter()
        .flat_map(|s| std::iter::repeat_n((s.to_bits() ^ flip).to_le_bytes(), per))
        .flatten()
        .collect()
}

pub(super) fn f16_bytes(v: &[half::f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[derive(Clone, Copy)]
pub(super) enum Part {
    Codes,
    Scales,
    Biases,
    Plain,
}

/// Streams the tensors of `plans` into one safetensors file, generating each plan once.
pub(super) fn write_safetensors(
    path: &Path,
    metadata: BTreeMap<String, String>,
    plans: &[Plan],
    specs: &[TensorSpec],
    owners: &[(usize, Part)],
    seed: u64,
    mut plain: impl FnMut(&Plan, Option<&Ternary>) -> Vec<u8>,
) -> Result<()> {
    let mut cache: Option<(usize, Ternary)> = None;
    safetensors::write(path, &metadata, specs, |i, out| {
        let (pi, part) = owners[i];
        let plan = &plans[pi];
        let ternary = match plan.kind {
            Kind::Ternary { .. } => {
                if !matches!(&cache, Some((c, _)) if *c == pi) {
                    cache = Some((pi, gen_ternary(seed, plan)));
                }
                cache.as_ref().map(|(_, t)| t)
            }
            _ => None,
        };
        let bytes = match (part, ternary) {
            (Part::Codes, Some(t)) => pack_codes(t),
            (Part::Scales, Some(t)) => group_scales(t, false),
            (Part::Biases, Some(t)) => group_scales(t, true),
            _ => plain(plan, ternary),
        };
        out.write_all(&bytes).map_err(io(path))
    })
}

/// MLX 2-bit folder: `weight` u32 codes, `scales = s`, `biases = -s`, norms f16.
/// The three tensors of one MLX 2-bit module (`weight` codes, `scales`, `biases`), owned by
/// plan `plan_index`.
pub(super) fn push_mlx_ternary(
    module: &str,
    rows: usize,
    cols: usize,
    plan_index: usize,
    specs: &mut Vec<TensorSpec>,
    owners: &mut Vec<(usize, Part)>,
) {
    let groups = vec![rows, cols / MLX_GROUP];
    for (suffix, dtype, shape, part) in [
        ("weight", Dtype::U32, vec![rows, cols / 16], Part::Codes),
        ("scales", Dtype::F16, groups.clone(), Part::Scales),
        ("biases", Dtype::F16, groups, Part::Biases),
    ] {
        specs.push(TensorSpec {
            name: format!("{module}.{suffix}"),
            dtype,
            shape,
        });
        owners.push((plan_index, part));
    }
}

pub fn write_mlx_folder(p: &Preset, seed: u64, dir: &Path, tok: &LoadedTokenizer) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let plans = p.tensors();
    let mut specs = Vec::new();
    let mut owners = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let hf = hf_name(&plan.name);
        let module = hf.strip_suffix(".weight").expect("weight");
        match plan.kind {
            Kind::Ternary { .. } => {
                let (rows, cols) = (plan.shape[0], plan.shape[1]);
                push_mlx_ternary(module, rows, cols, i, &mut specs, &mut owners);
            }
            _ => {
                specs.push(TensorSpec {
                    name: hf,
                    dtype: Dtype::F16,
                    shape: plan.shape.clone(),
                });
                owners.push((i, Part::Plain));
            }
        }
    }
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    write_safetensors(
        &dir.join("model.safetensors"),
        meta,
        &plans,
        &specs,
        &owners,
        seed,
        |plan, _| f16_bytes(&gen_norm(seed, plan)),
    )?;
    write_folder_files(p, dir, tok, true)
}

/// Unpacked folder: every weight as plain F16 `s · t`.
pub fn write_f16_folder(p: &Preset, seed: u64, dir: &Path, tok: &LoadedTokenizer) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let plans = p.tensors();
    let specs: Vec<TensorSpec> = plans
        .iter()
        .map(|plan| TensorSpec {
            name: hf_name(&plan.name),
            dtype: Dtype::F16,
            shape: plan.shape.clone(),
        })
        .collect();
    let owners: Vec<(usize, Part)> = (0..plans.len()).map(|i| (i, Part::Plain)).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(
        &dir.join("model.safetensors"),
        meta,
        &plans,
        &specs,
        &owners,
        seed,
        |plan, ternary| match ternary {
            None => f16_bytes(&gen_norm(seed, plan)),
            Some(t) => dense_f16(t),
        },
    )?;
    write_folder_files(p, dir, tok, false)
}

/// `s · t` as f16 bytes: ±s by a sign flip, zero as +0.
fn dense_f16(t: &Ternary) -> Vec<u8> {
    let mut out = vec![0u8; t.codes.len() * 2];
    out.par_chunks_mut(t.cols * 2)
        .enumerate()
        .for_each(|(r, row)| {
            for c in 0..t.cols {
                let s = t.scale(r, c).to_bits();
                let v: u16 = match t.codes[r * t.cols + c] {
                    0 => s | 0x8000,
                    1 => 0,
                    _ => s,
                };
                row[2 * c..2 * c + 2].copy_from_slice(&v.to_le_bytes());
            }
        });
    out
}

/// Encodes a generated matrix into `ty` blocks, in parallel over row chunks.
pub fn encode_ternary(t: &Ternary, ty: GgmlType) -> Result<Vec<u8>> {
    const CHUNK: usize = 64;
    let scales64 = t.scales64();
    let per_row = t.cols / 64;
    let parts: Vec<Vec<u8>> = (0..t.rows.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let (r0, r1) = (c * CHUNK, ((c + 1) * CHUNK).min(t.rows));
            encode_matrix(
                ty,
                r1 - r0,
                t.cols,
                &t.codes[r0 * t.cols..r1 * t.cols],
                &scales64[r0 * per_row..r1 * per_row],
            )
        })
        .collect::<Result<_>>()?;
    Ok(parts.concat())
}

pub(super) fn add_metadata(w: &mut GgufWriter, p: &Preset, tok: &LoadedTokenizer) -> Result<()> {
    let a = if p.bitnet { "bitnet" } else { p.arch.name() };
    let k = |s: &str| format!("{a}.{s}");
    w.add("general.architecture", a)?;
    w.add("general.name", format!("trit-random-{}", p.name))?;
    w.add(k("block_count"), p.n_layers as u32)?;
    w.add(k("context_length"), p.max_pos as u32)?;
    w.add(k("embedding_length"), p.hidden as u32)?;
    w.add(k("feed_forward_length"), p.ffn as u32)?;
    w.add(k("attention.head_count"), p.n_heads as u32)?;
    w.add(k("attention.head_count_kv"), p.n_kv_heads as u32)?;
    w.add(k("attention.key_length"), p.head_dim as u32)?;
    w.add(k("attention.value_length"), p.head_dim as u32)?;
    w.add(k("rope.dimension_count"), p.head_dim as u32)?;
    w.add(k("rope.freq_base"), p.rope_theta)?;
    w.add(k("attention.layer_norm_rms_epsilon"), p.norm_eps)?;
    w.add(k("vocab_size"), p.vocab as u32)?;
    if let Some((factor, original)) = p.yarn {
        w.add(k("rope.scaling.type"), "yarn")?;
        w.add(k("rope.scaling.factor"), factor)?;
        w.add(k("rope.scaling.original_context_length"), original as u32)?;
    }
    w.add("general.sampling.temp", 0.6f32)?;
    w.add("general.sampling.top_k", 20i32)?;
    w.add("general.sampling.top_p", 0.95f32)?;
    w.add("tokenizer.ggml.model", "gpt2")?;
    w.add(
        "tokenizer.ggml.pre",
        if p.bitnet { "llama-bpe" } else { "qwen2" },
    )?;
    w.add("tokenizer.ggml.tokens", tok.tokens.clone())?;
    w.add("tokenizer.ggml.token_type", tok.token_types.clone())?;
    w.add("tokenizer.ggml.merges", tok.merges.clone())?;
    w.add("tokenizer.ggml.eos_token_id", p.eos)?;
    w.add("tokenizer.ggml.padding_token_id", p.pad)?;
    w.add("tokenizer.ggml.bos_token_id", p.bos)?;
    // Llama-3 (BitNet) adds <|begin_of_text|>; BitNet ships no template (trit's built-in one).
    w.add("tokenizer.ggml.add_bos_token", p.bitnet)?;
    if let (Some(t), false) = (&tok.chat_template, p.bitnet) {
        w.add("tokenizer.chat_template", t.as_str())?;
    }
    Ok(())
}

/// GGUF export with every matrix in `ty` and F32 norms. For `llama` the Q/K rows are permuted
/// per head as llama.cpp's converter does, so readers use adjacent-pair RoPE on them.
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
        let (ty_out, bytes) = match plan.kind {
            Kind::Norm | Kind::Small { .. } | Kind::Param { .. } => {
                let v: Vec<u8> = gen_norm(seed, &plan)
                    .iter()
                    .flat_map(|x| x.to_f32().to_le_bytes())
                    .collect();
                (GgmlType::F32, v)
            }
            Kind::Ternary { .. } => {
                let mut t = gen_ternary(seed, &plan);
                if p.arch == Arch::Llama {
                    if plan.name.ends_with(".attn_q.weight") {
                        t = t.permute_for_adjacent_rope(p.n_heads);
                    } else if plan.name.ends_with(".attn_k.weight") {
                        t = t.permute_for_adjacent_rope(p.n_kv_heads);
                    }
                }
                (ty, encode_ternary(&t, ty)?)
            }
        };
        w.add_tensor(plan.name.clone(), &plan.shape, ty_out, bytes)?;
    }
    w.write_file(path)
}
