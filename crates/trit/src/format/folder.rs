//! Hugging Face style model folders (MLX 2-bit and unpacked FP16/BF16): `config.json`,
//! safetensors weights, tokenizer files. Maps HF module paths to GGUF canonical names and
//! serves the tensors of either kind through one `WeightSource`.

use super::safetensors::SafetensorsSet;
use super::{
    mlx, prism_mlx, unpacked, Dtype, GenerationDefaults, ModelConfig, ModelFiles, OpenOptions,
    TensorData, TensorView, TokenizerSource, WeightSource,
};
use crate::quant::GgmlType;
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// HF per-layer module path suffix → canonical name suffix (qwen3 and llama share them).
const LAYER_MODULES: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    // BitNet b1.58's sub-norms (llama.cpp's names).
    ("self_attn.attn_sub_norm", "attn_sub_norm"),
    ("mlp.ffn_sub_norm", "ffn_sub_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    // Qwen3.5 Gated DeltaNet layers, under llama.cpp's qwen35 names.
    ("linear_attn.in_proj_qkv", "attn_qkv"),
    ("linear_attn.in_proj_z", "attn_gate"),
    ("linear_attn.in_proj_a", "ssm_alpha"),
    ("linear_attn.in_proj_b", "ssm_beta"),
    ("linear_attn.conv1d", "ssm_conv1d"),
    ("linear_attn.norm", "ssm_norm"),
    ("linear_attn.out_proj", "ssm_out"),
];

/// Bare parameters (no module of their own) of Gated DeltaNet layers → canonical tensor name
/// suffix. `A_log` keeps its own name: GGUF stores `ssm_a = -exp(A_log)` instead.
const LAYER_PARAMS: &[(&str, &str)] = &[
    ("linear_attn.A_log", "ssm_a_log"),
    ("linear_attn.dt_bias", "ssm_dt.bias"),
];

/// Vision-language packs keep the language model under a prefix; mlx-lm normalizes
/// `model.language_model.` and `language_model.model.` to its text model's `model.`.
pub(super) fn strip_language_model(name: &str) -> &str {
    for prefix in ["model.language_model.", "language_model.model."] {
        if let Some(rest) = name.strip_prefix(prefix) {
            // Both spellings address `model.<rest>` of the text model.
            let start = name.len() - rest.len() - "model.".len();
            return &name[start..];
        }
    }
    name.strip_prefix("language_model.").unwrap_or(name)
}

/// Vision-tower tensors of a vision-language checkpoint (mlx-lm drops them too).
pub(super) fn is_vision(name: &str) -> bool {
    let n = strip_language_model(name);
    n.starts_with("vision_tower.") || n.starts_with("model.visual.") || n.starts_with("visual.")
}

/// Tensors a text-only engine skips: the vision tower and multi-token-prediction heads.
pub(super) fn is_skipped_extra(name: &str) -> bool {
    let n = strip_language_model(name);
    is_vision(name) || n.starts_with("mtp.") || n.starts_with("model.mtp.")
}

/// `model.layers.3.linear_attn.A_log` → `blk.3.ssm_a_log`.
fn param_to_canonical(tensor: &str) -> Option<String> {
    let rest = strip_language_model(tensor).strip_prefix("model.layers.")?;
    let (layer, sub) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(_, c) = LAYER_PARAMS.iter().find(|(h, _)| *h == sub)?;
    Some(format!("blk.{layer}.{c}"))
}

const GLOBAL_MODULES: &[(&str, &str)] = &[
    ("model.embed_tokens", "token_embd"),
    ("model.norm", "output_norm"),
    ("lm_head", "output"),
];

/// `model.layers.3.self_attn.q_proj` → `blk.3.attn_q`; `None` for modules trit does not know.
pub fn hf_to_canonical(module: &str) -> Option<String> {
    let module = strip_language_model(module);
    if let Some(&(_, c)) = GLOBAL_MODULES.iter().find(|(h, _)| *h == module) {
        return Some(c.to_string());
    }
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, sub) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(_, c) = LAYER_MODULES.iter().find(|(h, _)| *h == sub)?;
    Some(format!("blk.{layer}.{c}"))
}

/// Inverse of `hf_to_canonical` (module paths, without `.weight`).
pub fn canonical_to_hf(module: &str) -> Option<String> {
    if let Some(&(h, _)) = GLOBAL_MODULES.iter().find(|(_, c)| *c == module) {
        return Some(h.to_string());
    }
    let rest = module.strip_prefix("blk.")?;
    let (layer, sub) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(h, _) = LAYER_MODULES.iter().find(|(_, c)| *c == sub)?;
    Some(format!("model.layers.{layer}.{h}"))
}

/// How one canonical tensor is stored.
pub(super) enum Entry {
    /// A plain F32/F16/BF16 tensor under its HF name.
    Plain { hf: String, dtype: Dtype },
    /// An MLX affine-quantized module (`weight` codes, `scales`, `biases`).
    Mlx {
        module: String,
        shape: Vec<usize>,
        scale_dtype: Dtype,
        group_size: usize,
        bits: usize,
    },
    /// Converted at load (unpacked ternary weights re-packed as ggml blocks).
    Owned {
        shape: Vec<usize>,
        ty: GgmlType,
        bytes: Vec<u8>,
    },
}

/// The tensors of a folder under canonical names.
pub(super) struct FolderSource {
    pub files: SafetensorsSet,
    pub entries: BTreeMap<String, Entry>,
    pub description: String,
}

impl WeightSource for FolderSource {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let Some(entry) = self.entries.get(name) else {
            return Ok(None);
        };
        let get = |hf: &str| {
            self.files
                .get(hf)
                .ok_or_else(|| Error::MissingTensor(hf.to_string()))
        };
        let (shape, data) = match entry {
            Entry::Plain { hf, dtype } => {
                let (info, bytes) = get(hf)?;
                let data = match dtype {
                    Dtype::F32 => TensorData::F32(bytes),
                    Dtype::F16 => TensorData::F16(bytes),
                    _ => TensorData::BF16(bytes),
                };
                (info.shape.clone(), data)
            }
            Entry::Mlx {
                module,
                shape,
                scale_dtype,
                group_size,
                bits,
            } => (
                shape.clone(),
                TensorData::Mlx {
                    codes: get(&format!("{module}.weight"))?.1,
                    scales: get(&format!("{module}.scales"))?.1,
                    biases: get(&format!("{module}.biases"))?.1,
                    scale_dtype: *scale_dtype,
                    group_size: *group_size,
                    bits: *bits,
                },
            ),
            Entry::Owned { shape, ty, bytes } => {
                (shape.clone(), TensorData::Ggml { ty: *ty, bytes })
            }
        };
        Ok(Some(TensorView {
            name: name.to_string(),
            shape,
            data,
        }))
    }

    fn tensor_names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

/// Splits `model.layers.0.mlp.up_proj.scales` into the module and the suffix.
pub(super) fn split_tensor_name(name: &str) -> (&str, &str) {
    name.rsplit_once('.').unwrap_or((name, ""))
}

/// Canonical module name of an HF tensor, or an error for tensors trit cannot place.
/// `Ok(None)` for tensors that carry nothing a model needs (`rotary_emb.inv_freq`).
pub(super) fn module_of(tensor: &str) -> Result<Option<(String, String)>> {
    let (module, suffix) = split_tensor_name(tensor);
    if module.ends_with("rotary_emb") && suffix == "inv_freq" || is_skipped_extra(tensor) {
        return Ok(None);
    }
    if let Some(c) = param_to_canonical(tensor) {
        return Ok(Some((tensor.to_string(), c)));
    }
    if suffix == "signs" {
        return Err(Error::Unsupported(format!(
            "tensor '{tensor}': Hadamard sign vectors belong to a rotated Bonsai 2 pack \
             (model_type prism_hadamard_qwen35), which this loader does not read; refusing \
             to run the model without its rotation"
        )));
    }
    match hf_to_canonical(module) {
        Some(c) => Ok(Some((module.to_string(), c))),
        None => Err(Error::Unsupported(format!(
            "tensor '{tensor}' is not part of a llama/qwen3/qwen3_5/bitnet model"
        ))),
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Config(format!("{}: invalid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

pub(super) fn open_folder(dir: &Path, options: OpenOptions) -> Result<ModelFiles> {
    let config_path = dir.join("config.json");
    let config_json = read_json(&config_path)?.ok_or_else(|| {
        Error::Config(format!(
            "{}: no config.json (expected an MLX or Hugging Face model folder)",
            dir.display()
        ))
    })?;
    let generation_json = read_json(&dir.join("generation_config.json"))?;
    let tokenizer_config_path = dir.join("tokenizer_config.json");
    let tokenizer_config = read_json(&tokenizer_config_path)?;
    let files = SafetensorsSet::open_dir(dir)?;
    let has_lm_head =
        files.contains("lm_head.weight") || files.contains("language_model.lm_head.weight");
    let fallback_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut config = ModelConfig::from_hf_json(
        &config_json,
        generation_json.as_ref(),
        tokenizer_config.as_ref(),
        !has_lm_head,
        &fallback_name,
    )?;
    // mlx-lm drops a stored lm_head when the config ties the embeddings; do the same.
    let skip_lm_head = config.tied_embeddings && has_lm_head;
    let quantization = config_json
        .get("quantization")
        .or_else(|| config_json.get("quantization_config"))
        .filter(|q| !q.is_null());
    let model_type = config_json.get("model_type").and_then(Value::as_str);
    let rotation = if model_type == Some(prism_mlx::MODEL_TYPE) {
        Some(prism_mlx::read(&config_json, &files)?)
    } else {
        None
    };
    let bitnet = match quantization {
        Some(q) => super::bitnet_hf::BitNetQuant::parse(q)?,
        None => None,
    };
    if config.bitnet != bitnet.is_some() && quantization.is_some() {
        return Err(Error::Config(format!(
            "{}: model_type {} with a {} quantization block",
            dir.display(),
            config.arch_name(),
            if bitnet.is_some() {
                "BitNet"
            } else {
                "non-BitNet"
            }
        )));
    }
    let (source, format_name) = match (quantization, bitnet) {
        (Some(_), Some(b)) => {
            let s = super::bitnet_hf::build(files, &b, skip_lm_head)?;
            let name = if b.online {
                "BitNet BF16 masters (ternarized at load)"
            } else {
                "BitNet packed 2-bit"
            };
            (s, name.to_string())
        }
        (Some(q), None) => {
            let q = mlx::QuantConfig::parse(q)?;
            let s = mlx::build(files, &q, skip_lm_head, rotation.is_some(), options)?;
            let name = match &rotation {
                Some(r) => format!("MLX {}-bit Bonsai 2 pack ({})", q.bits, r.describe()),
                None => format!("MLX {}-bit", q.bits),
            };
            (s, name)
        }
        (None, _) if rotation.is_some() => {
            return Err(Error::Format(format!(
                "{}: a {} pack without a quantization block",
                dir.display(),
                prism_mlx::MODEL_TYPE
            )))
        }
        (None, _) => {
            let (s, dtype) = unpacked::build(files, skip_lm_head)?;
            (s, format!("unpacked {}", dtype.name()))
        }
    };
    config.check_tensors(&source)?;

    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.exists() {
        return Err(Error::Tokenizer(format!(
            "{}: no tokenizer.json in the model folder",
            dir.display()
        )));
    }
    let tokenizer = TokenizerSource::Json {
        tokenizer: tokenizer_path,
        config: tokenizer_config
            .as_ref()
            .map(|_| tokenizer_config_path.clone()),
    };
    let chat_template = chat_template(dir, tokenizer_config.as_ref())?;
    let generation = generation_defaults(generation_json.as_ref());
    Ok(ModelFiles {
        config,
        weights: Box::new(source),
        tokenizer,
        chat_template,
        generation,
        path: dir.to_path_buf(),
        format_name,
        rotation,
    })
}

/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of which
/// "default" is used), else a `chat_template.jinja` file beside it.
pub(crate) fn chat_template(
    dir: &Path,
    tokenizer_config: Option<&Value>,
) -> Result<Option<String>> {
    match tokenizer_config.and_then(|t| t.get("chat_template")) {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let default = list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"));
            if let Some(t) = default.or(list.first()) {
                if let Some(s) = t.get("template").and_then(Value::as_str) {
                    return Ok(Some(s.to_string()));
                }
            }
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&jinja, e)),
    }
}

pub(crate) fn generation_defaults(g: Option<&Value>) -> GenerationDefaults {
    let Some(g) = g else {
        return GenerationDefaults {
            source: "none".into(),
            ..Default::default()
        };
    };
    let f = |k: &str| g.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let d = GenerationDefaults {
        temperature: f("temperature"),
        top_k: g.get("top_k").and_then(Value::as_u64).map(|v| v as usize),
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
        source: String::new(),
    };
    let any = d.temperature.is_some()
        || d.top_k.is_some()
        || d.top_p.is_some()
        || d.min_p.is_some()
        || d.repetition_penalty.is_some();
    GenerationDefaults {
        source: if any {
            "generation_config.json"
        } else {
            "none"
        }
        .into(),
        ..d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_names_both_ways() {
        let pairs = [
            ("model.embed_tokens", "token_embd"),
            ("model.layers.0.self_attn.q_proj", "blk.0.attn_q"),
            ("model.layers.12.self_attn.o_proj", "blk.12.attn_output"),
            ("model.layers.3.self_attn.k_norm", "blk.3.attn_k_norm"),
            ("model.layers.3.input_layernorm", "blk.3.attn_norm"),
            ("model.layers.3.post_attention_layernorm", "blk.3.ffn_norm"),
            ("model.layers.7.mlp.down_proj", "blk.7.ffn_down"),
            ("model.norm", "output_norm"),
            ("lm_head", "output"),
        ];
        for (hf, c) in pairs {
            assert_eq!(hf_to_canonical(hf).as_deref(), Some(c));
            assert_eq!(canonical_to_hf(c).as_deref(), Some(hf));
        }
        assert_eq!(hf_to_canonical("model.layers.x.mlp.up_proj"), None);
        assert_eq!(hf_to_canonical("model.layers.0.mlp.experts"), None);
        assert!(module_of("model.layers.0.self_attn.rotary_emb.inv_freq")
            .unwrap()
            .is_none());
        assert!(module_of("vision_tower.blocks.0.weight").unwrap().is_none());
        assert!(module_of("model.visual.blocks.0.attn.qkv.weight")
            .unwrap()
            .is_none());
        assert!(module_of("model.layers.0.mlp.experts.weight").is_err());
        let hybrid = [
            (
                "language_model.model.layers.0.linear_attn.in_proj_qkv",
                "blk.0.attn_qkv",
            ),
            (
                "model.language_model.layers.2.linear_attn.out_proj",
                "blk.2.ssm_out",
            ),
            ("model.layers.1.linear_attn.in_proj_a", "blk.1.ssm_alpha"),
            ("language_model.lm_head", "output"),
        ];
        for (hf, c) in hybrid {
            assert_eq!(hf_to_canonical(hf).as_deref(), Some(c), "{hf}");
        }
        let (_, c) = module_of("language_model.model.layers.4.linear_attn.A_log")
            .unwrap()
            .unwrap();
        assert_eq!(c, "blk.4.ssm_a_log");
        assert!(module_of("model.layers.0.mlp.up_proj.signs")
            .unwrap_err()
            .to_string()
            .contains("rotation"));
    }

    #[test]
    fn generation_defaults_source() {
        let g = serde_json::json!({"temperature": 0.6, "top_k": 20, "top_p": 0.95});
        let d = generation_defaults(Some(&g));
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_k, Some(20));
        assert_eq!(d.source, "generation_config.json");
        assert_eq!(generation_defaults(None).source, "none");
    }
}
