//! Carrying everything that is not a weight across a conversion: hyper-parameters, tokenizer,
//! chat template and sampling defaults, between GGUF metadata and the Hugging Face folder files
//! (`config.json`, `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`).

use crate::format::config::{Arch, ModelConfig, RopeScaling};
use crate::format::gguf::GgufFile;
use crate::format::gguf_write::GgufWriter;
use crate::format::testgen::TokenizerAssets;
use crate::format::{GenerationDefaults, ModelFiles};
use crate::tokenizer::{pre_name_for_regexes, Tokenizer};
use crate::{Error, Result};
use serde_json::{json, Value};
use std::path::Path;

/// GPT-2's split, which a `ByteLevel` pre-tokenizer with `use_regex: true` applies itself.
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// GGUF keys that describe the file rather than the model; the writer sets its own.
const FILE_KEYS: &[&str] = &["general.alignment", "general.file_type"];

/// GGUF → GGUF: every metadata pair except the file-layout ones, in the source's order.
pub(super) fn copy_gguf_metadata(src: &GgufFile, w: &mut GgufWriter) -> Result<()> {
    if let Ok(a) = u32::try_from(src.alignment()) {
        w.set_alignment(a)?;
    }
    for (k, v) in src.metadata() {
        if !FILE_KEYS.contains(&k.as_str()) {
            w.add(k.clone(), v.clone())?;
        }
    }
    Ok(())
}

/// YaRN magnitude correction (`0.1 ln s + 1`), which ggml applies inside its rope on top of
/// `rope.scaling.attn_factor`.
fn yarn_mscale(factor: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    }
}

/// The `Split` regexes of a `tokenizer.json` pre-tokenizer, in order.
fn split_regexes(pre: &Value, out: &mut Vec<String>) {
    match pre["type"].as_str() {
        Some("Sequence") => {
            for p in pre["pretokenizers"].as_array().into_iter().flatten() {
                split_regexes(p, out);
            }
        }
        Some("Split") => {
            if let Some(r) = pre["pattern"]["Regex"].as_str() {
                out.push(r.to_string());
            }
        }
        Some("ByteLevel") if pre["use_regex"].as_bool() != Some(false) => {
            out.push(GPT2_REGEX.to_string());
        }
        _ => {}
    }
}

/// Folder → GGUF: hyper-parameters from `config`, vocabulary from `tokenizer.json` (byte-level
/// BPE only, as llama.cpp's converter writes it), chat template and sampling defaults.
pub(super) fn gguf_metadata_from_folder(
    files: &ModelFiles,
    dir: &Path,
    w: &mut GgufWriter,
) -> Result<()> {
    let c = &files.config;
    let a = c.arch_name();
    let k = |s: &str| format!("{a}.{s}");
    w.add("general.architecture", a)?;
    w.add("general.name", c.name.as_str())?;
    w.add(k("block_count"), c.n_layers as u32)?;
    w.add(k("context_length"), c.max_ctx as u32)?;
    w.add(k("embedding_length"), c.hidden as u32)?;
    w.add(k("feed_forward_length"), c.ffn as u32)?;
    w.add(k("attention.head_count"), c.n_heads as u32)?;
    w.add(k("attention.head_count_kv"), c.n_kv_heads as u32)?;
    w.add(k("attention.key_length"), c.head_dim as u32)?;
    w.add(k("attention.value_length"), c.head_dim as u32)?;
    w.add(k("rope.dimension_count"), c.head_dim as u32)?;
    w.add(k("rope.freq_base"), c.rope_theta)?;
    w.add(k("attention.layer_norm_rms_epsilon"), c.norm_eps)?;
    w.add(k("vocab_size"), c.vocab as u32)?;
    if let Some(RopeScaling::Yarn {
        factor,
        original_max_position,
        beta_fast,
        beta_slow,
        attention_factor,
    }) = &c.rope_scaling
    {
        w.add(k("rope.scaling.type"), "yarn")?;
        w.add(k("rope.scaling.factor"), *factor)?;
        w.add(
            k("rope.scaling.original_context_length"),
            *original_max_position as u32,
        )?;
        w.add(k("rope.scaling.yarn_beta_fast"), *beta_fast)?;
        w.add(k("rope.scaling.yarn_beta_slow"), *beta_slow)?;
        w.add(
            k("rope.scaling.attn_factor"),
            attention_factor / yarn_mscale(*factor),
        )?;
    }
    add_sampling(w, &files.generation)?;

    let tok_path = dir.join("tokenizer.json");
    let tok_json: Value =
        serde_json::from_slice(&std::fs::read(&tok_path).map_err(|e| Error::io(&tok_path, e))?)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let mut regexes = Vec::new();
    split_regexes(&tok_json["pre_tokenizer"], &mut regexes);
    let pre = pre_name_for_regexes(&regexes).ok_or_else(|| {
        Error::Unsupported(format!(
            "{}: its pre-tokenizer ({regexes:?}) matches none of the llama.cpp pre-tokenizers \
             trit knows, so it can not be named in GGUF metadata",
            tok_path.display()
        ))
    })?;
    let tok = TokenizerAssets::Dir(dir.to_path_buf()).load(c.vocab)?;
    w.add("tokenizer.ggml.model", "gpt2")?;
    w.add("tokenizer.ggml.pre", pre)?;
    w.add("tokenizer.ggml.tokens", tok.tokens)?;
    w.add("tokenizer.ggml.token_type", tok.token_types)?;
    w.add("tokenizer.ggml.merges", tok.merges)?;
    if let Some(b) = c.bos {
        w.add("tokenizer.ggml.bos_token_id", b)?;
    }
    // GGUF has one slot per kind of end token; the reader folds all three back into the list.
    for (key, id) in ["eos", "eot", "eom"].iter().zip(&c.eos) {
        w.add(format!("tokenizer.ggml.{key}_token_id"), *id)?;
    }
    w.add("tokenizer.ggml.add_bos_token", c.add_bos)?;
    if let Some(t) = &files.chat_template {
        w.add("tokenizer.chat_template", t.as_str())?;
    }
    Ok(())
}

fn add_sampling(w: &mut GgufWriter, g: &GenerationDefaults) -> Result<()> {
    let f = [
        ("temp", g.temperature),
        ("top_p", g.top_p),
        ("min_p", g.min_p),
        ("penalty_repeat", g.repetition_penalty),
    ];
    for (key, v) in f {
        if let Some(v) = v {
            w.add(format!("general.sampling.{key}"), v)?;
        }
    }
    if let Some(k) = g.top_k {
        w.add("general.sampling.top_k", k as i32)?;
    }
    Ok(())
}

/// A Hugging Face `config.json` for a dense model (mlx-lm's keys), with the MLX 2-bit
/// `quantization` block when `quantized`.
pub(super) fn config_json(c: &ModelConfig, quantized: bool) -> Result<Value> {
    let (model_type, class) = match c.arch {
        Arch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
        Arch::Llama => ("llama", "LlamaForCausalLM"),
        Arch::Qwen35 => {
            return Err(Error::Unsupported(
                "writing a qwen35 hybrid as a Hugging Face folder (convert it between GGUF \
                 types instead)"
                    .into(),
            ))
        }
    };
    let mut v = json!({
        "architectures": [class],
        "model_type": model_type,
        "_name_or_path": c.name,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.n_layers,
        "intermediate_size": c.ffn,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.max_ctx,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.norm_eps,
        "tie_word_embeddings": c.tied_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": c.bos,
        "eos_token_id": if c.eos.len() == 1 { json!(c.eos[0]) } else { json!(c.eos) },
        "torch_dtype": "float16",
        "rope_scaling": null,
    });
    if let Some(RopeScaling::Yarn {
        factor,
        original_max_position,
        beta_fast,
        beta_slow,
        attention_factor,
    }) = &c.rope_scaling
    {
        v["rope_scaling"] = json!({
            "type": "yarn", "rope_type": "yarn", "factor": factor,
            "original_max_position_embeddings": original_max_position,
            "beta_fast": beta_fast, "beta_slow": beta_slow,
            "attention_factor": attention_factor,
        });
    }
    if quantized {
        let q = json!({"group_size": 128, "bits": 2});
        v["quantization"] = q.clone();
        v["quantization_config"] = q;
    }
    Ok(v)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(v).expect("serializable JSON");
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// GGUF → folder: `config.json`, `generation_config.json` and a `tokenizer.json` /
/// `tokenizer_config.json` pair rebuilt from the GGUF vocabulary.
pub(super) fn folder_files_from_gguf(files: &ModelFiles, out: &Path) -> Result<()> {
    let c = &files.config;
    write_json(&out.join("config.json"), &config_json(c, true)?)?;
    let g = &files.generation;
    let mut gen = json!({ "bos_token_id": c.bos, "eos_token_id": c.eos });
    for (k, v) in [
        ("temperature", g.temperature),
        ("top_p", g.top_p),
        ("min_p", g.min_p),
        ("repetition_penalty", g.repetition_penalty),
    ] {
        if let Some(v) = v {
            gen[k] = json!(v);
        }
    }
    if let Some(k) = g.top_k {
        gen["top_k"] = json!(k);
    }
    write_json(&out.join("generation_config.json"), &gen)?;
    let tok = Tokenizer::from_source(&files.tokenizer)?;
    let text = tok
        .inner()
        .to_string(true)
        .map_err(|e| Error::Tokenizer(format!("serializing tokenizer.json: {e}")))?;
    let path = out.join("tokenizer.json");
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    let mut tc = json!({
        "add_bos_token": c.add_bos,
        "bos_token": tok.bos_token(),
        "eos_token": tok.eos_token(),
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(t) = &files.chat_template {
        tc["chat_template"] = json!(t);
    }
    write_json(&out.join("tokenizer_config.json"), &tc)
}

/// Folder → folder: every side file (tokenizer, templates, generation config) copied as is, and
/// `config.json` with its quantization block set for an MLX 2-bit target.
pub(super) fn copy_folder_files(src: &Path, out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(src).map_err(|e| Error::io(src, e))?;
    for e in entries {
        let e = e.map_err(|e| Error::io(src, e))?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let skip = name == "config.json"
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || !path.is_file();
        if !skip {
            let to = out.join(&name);
            std::fs::copy(&path, &to).map_err(|e| Error::io(&to, e))?;
        }
    }
    let cfg_path = src.join("config.json");
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?)
            .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
    let q = json!({"group_size": 128, "bits": 2});
    cfg["quantization"] = q.clone();
    cfg["quantization_config"] = q;
    write_json(&out.join("config.json"), &cfg)
}
