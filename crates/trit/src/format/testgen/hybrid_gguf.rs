//! GGUF export of a generated hybrid model, laid out as llama.cpp's qwen35 converter writes
//! one (formats.md §8.4, llama.cpp `conversion/qwen.py`): value heads of the linear layers
//! reordered from grouped to tiled order (`attn_qkv` V rows, `attn_gate` rows, `ssm_alpha` /
//! `ssm_beta` rows, `ssm_a`, `ssm_dt`, the V channels of `ssm_conv1d`, `ssm_out` columns),
//! `ssm_a = −exp(A_log)`, conv kernels `[channels, kernel]`, norms F32, alpha/beta BF16.
//! A rotated preset also gets `prism.hadamard.*` metadata, with `gdn_v_grouped` set and
//! `ssm_out` columns left in grouped order, as Bonsai 2 files have them.

use super::hybrid::{block_for, gen_signs, HybridPreset};
use super::tokenizer_meta::LoadedTokenizer;
use super::{gen_norm, gen_ternary, gen_uniform, Kind, Plan};
use crate::format::gguf_write::GgufWriter;
use crate::quant::{ternary::encode_matrix, GgmlType};
use crate::Result;
use std::path::Path;

/// `order[p]` = the grouped value head stored at tiled position `p`.
fn tiled_order(k_heads: usize, v_heads: usize) -> Vec<usize> {
    let r = v_heads / k_heads;
    (0..v_heads)
        .map(|p| (p % k_heads) * r + p / k_heads)
        .collect()
}

/// Reorders `heads` consecutive blocks of `width` items, starting at `start`.
fn permute_blocks<T: Copy>(v: &mut [T], start: usize, width: usize, order: &[usize]) {
    let old = v[start..start + order.len() * width].to_vec();
    for (p, &h) in order.iter().enumerate() {
        v[start + p * width..start + (p + 1) * width]
            .copy_from_slice(&old[h * width..(h + 1) * width]);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn metadata(w: &mut GgufWriter, p: &HybridPreset, tok: &LoadedTokenizer) -> Result<()> {
    let k = |s: &str| format!("qwen35.{s}");
    w.add("general.architecture", "qwen35")?;
    w.add("general.name", format!("trit-random-{}", p.name))?;
    w.add(k("block_count"), p.n_layers as u32)?;
    w.add(k("context_length"), p.max_pos as u32)?;
    w.add(k("embedding_length"), p.hidden as u32)?;
    w.add(k("feed_forward_length"), p.ffn as u32)?;
    w.add(k("attention.head_count"), p.n_heads as u32)?;
    w.add(k("attention.head_count_kv"), p.n_kv_heads as u32)?;
    w.add(k("attention.key_length"), p.head_dim as u32)?;
    w.add(k("attention.value_length"), p.head_dim as u32)?;
    w.add(k("attention.layer_norm_rms_epsilon"), p.norm_eps)?;
    let rotary = (p.head_dim as f32 * p.partial_rotary_factor) as u32;
    w.add(k("rope.dimension_count"), rotary)?;
    w.add(k("rope.dimension_sections"), vec![11i32, 11, 10, 0])?;
    w.add(k("rope.freq_base"), p.rope_theta)?;
    w.add(
        k("full_attention_interval"),
        p.full_attention_interval as u32,
    )?;
    if p.rotated {
        // Newer converters also write the schedule (from HF `layer_types`); one preset with
        // and one without covers both ways of reading it.
        let linear: Vec<bool> = (0..p.n_layers).map(|i| p.is_linear(i)).collect();
        w.add(k("attention.recurrent_layers"), linear)?;
    }
    w.add(k("ssm.conv_kernel"), p.conv_kernel as u32)?;
    w.add(k("ssm.state_size"), p.k_dim as u32)?;
    w.add(k("ssm.group_count"), p.k_heads as u32)?;
    w.add(k("ssm.time_step_rank"), p.v_heads as u32)?;
    w.add(k("ssm.inner_size"), (p.v_heads * p.v_dim) as u32)?;
    w.add(k("vocab_size"), p.vocab as u32)?;
    w.add("tokenizer.ggml.model", "gpt2")?;
    w.add("tokenizer.ggml.pre", "qwen2")?;
    w.add("tokenizer.ggml.tokens", tok.tokens.clone())?;
    w.add("tokenizer.ggml.token_type", tok.token_types.clone())?;
    w.add("tokenizer.ggml.merges", tok.merges.clone())?;
    w.add("tokenizer.ggml.bos_token_id", 0u32)?;
    w.add("tokenizer.ggml.eos_token_id", 1u32)?;
    w.add("tokenizer.ggml.add_bos_token", false)?;
    if let Some(t) = &tok.chat_template {
        w.add("tokenizer.chat_template", t.as_str())?;
    }
    Ok(())
}

/// `prism.hadamard.*` for a rotated preset: one block, explicit signs by width.
fn rotation_metadata(w: &mut GgufWriter, p: &HybridPreset, seed: u64) -> Result<()> {
    let k = |s: &str| format!("prism.hadamard.{s}");
    let mut names = Vec::new();
    let mut widths: Vec<usize> = Vec::new();
    let mut block = 0;
    for t in p.tensors() {
        if !matches!(t.kind, Kind::Ternary { .. }) {
            continue;
        }
        let b = block_for(&t.name, t.shape[1]);
        if b == 0 {
            continue;
        }
        assert!(block == 0 || block == b, "one block size per GGUF file");
        block = b;
        if !widths.contains(&t.shape[1]) {
            widths.push(t.shape[1]);
        }
        if t.name != "token_embd.weight" {
            names.push(t.name.clone());
        }
    }
    let values: Vec<i32> = widths
        .iter()
        .flat_map(|&wd| gen_signs(seed, wd))
        .map(|s| s as i32)
        .collect();
    w.add(k("version"), if p.tied { 2u32 } else { 1u32 })?;
    w.add(k("block_size"), block as u32)?;
    w.add(k("transform"), "normalized-sylvester-walsh-hadamard")?;
    w.add(k("axis"), "input-last-dimension")?;
    w.add(k("sign_mode"), "explicit")?;
    w.add(
        k("sign_widths"),
        widths.iter().map(|&x| x as i32).collect::<Vec<_>>(),
    )?;
    w.add(k("sign_values"), values)?;
    w.add(k("weight_names"), names)?;
    w.add(
        k("inverse_weight_names"),
        vec!["token_embd.weight".to_string()],
    )?;
    w.add(k("gdn_v_grouped"), true)
}

/// One tensor as (GGUF name, shape, type, bytes), value heads in tiled order.
fn tensor(
    p: &HybridPreset,
    seed: u64,
    plan: &Plan,
    ty: GgmlType,
    order: &[usize],
) -> Result<(String, Vec<usize>, GgmlType, Vec<u8>)> {
    let (kw, dv) = (p.k_heads * p.k_dim, p.v_dim);
    let has = |s: &str| plan.name.ends_with(s);
    match plan.kind {
        Kind::Ternary { .. } => {
            let t = gen_ternary(seed, plan);
            let (rows, cols) = (t.rows, t.cols);
            let mut codes = t.codes.clone();
            let mut scales = t.scales64();
            let spr = cols / 64;
            if has(".attn_qkv.weight") || has(".attn_gate.weight") {
                let first = if has(".attn_qkv.weight") { 2 * kw } else { 0 };
                permute_blocks(&mut codes, first * cols, dv * cols, order);
                permute_blocks(&mut scales, first * spr, dv * spr, order);
            } else if has(".ssm_out.weight") && !p.rotated {
                for r in 0..rows {
                    permute_blocks(&mut codes[r * cols..(r + 1) * cols], 0, dv, order);
                    permute_blocks(&mut scales[r * spr..(r + 1) * spr], 0, dv / 64, order);
                }
            }
            let bytes = encode_matrix(ty, rows, cols, &codes, &scales)?;
            Ok((plan.name.clone(), plan.shape.clone(), ty, bytes))
        }
        Kind::Norm => {
            let v: Vec<f32> = gen_norm(seed, plan).iter().map(|x| x.to_f32()).collect();
            Ok((
                plan.name.clone(),
                plan.shape.clone(),
                GgmlType::F32,
                f32_bytes(&v),
            ))
        }
        Kind::Small { .. } => {
            let mut v = gen_uniform(seed, plan);
            let row = plan.shape[1];
            if has(".ssm_conv1d.weight") {
                permute_blocks(&mut v, 2 * kw * row, dv * row, order);
                return Ok((
                    plan.name.clone(),
                    plan.shape.clone(),
                    GgmlType::F32,
                    f32_bytes(&v),
                ));
            }
            permute_blocks(&mut v, 0, row, order);
            let bytes = v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect();
            Ok((plan.name.clone(), plan.shape.clone(), GgmlType::BF16, bytes))
        }
        Kind::Param { .. } => {
            let mut v = gen_uniform(seed, plan);
            permute_blocks(&mut v, 0, 1, order);
            let name = match plan.name.strip_suffix("_log") {
                Some(a) => {
                    v.iter_mut().for_each(|x| *x = -x.exp());
                    a.to_string()
                }
                None => plan.name.clone(),
            };
            Ok((name, plan.shape.clone(), GgmlType::F32, f32_bytes(&v)))
        }
    }
}

/// Writes the model as one GGUF file with every ternary matrix in `ty`.
pub fn write_gguf(
    p: &HybridPreset,
    seed: u64,
    path: &Path,
    ty: GgmlType,
    tok: &LoadedTokenizer,
) -> Result<()> {
    let mut w = GgufWriter::new();
    metadata(&mut w, p, tok)?;
    if p.rotated {
        rotation_metadata(&mut w, p, seed)?;
    }
    let order = tiled_order(p.k_heads, p.v_heads);
    for plan in p.tensors() {
        let (name, shape, t, bytes) = tensor(p, seed, &plan, ty, &order)?;
        w.add_tensor(name, &shape, t, bytes)?;
    }
    w.write_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_order_matches_the_converter() {
        // 2 key heads, 3 value heads each: grouped [G0v0 G0v1 G0v2 G1v0 G1v1 G1v2] becomes
        // tiled [G0v0 G1v0 G0v1 G1v1 G0v2 G1v2].
        assert_eq!(tiled_order(2, 6), vec![0, 3, 1, 4, 2, 5]);
        let mut v: Vec<u32> = (0..12).collect();
        permute_blocks(&mut v, 0, 2, &tiled_order(2, 6));
        assert_eq!(v, vec![0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
    }
}
