//! Random-weight Qwen3.5 hybrid models (Gated DeltaNet + gated full attention) written as a
//! plain qwen3_5 MLX 2-bit folder, laid out as mlx-lm saves a converted vision-language
//! checkpoint: nested `text_config`, tensors under `language_model.`, conv1d kernels as
//! `[channels, kernel, 1]`, effective (not offset) norm weights.
//!
//! Values follow the dense generator (`testgen.rs`): ternary projections with one f16 scale per
//! 256 inputs, norms `1 + 0.1·N(0, 1)`; the unquantized pieces are drawn uniformly: `ssm_alpha`
//! / `ssm_beta` rows ~U(±1.7/√hidden) and conv taps ~U(±0.5) rounded to bf16 (exact in every
//! float type), `A_log` ~U(0, ln 16) and `dt_bias` ~U(0.5, 1.5) in f32.

use super::tokenizer_meta::LoadedTokenizer;
use super::writers::{
    f16_bytes, io, push_mlx_ternary, write_file, write_safetensors, Part, MLX_GROUP,
};
use super::{gen_norm, gen_uniform, Kind, OutFormat, Plan, TokenizerAssets};
use crate::format::safetensors::TensorSpec;
use crate::format::{canonical_to_hf, Dtype};
use crate::{Error, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Shapes of a generated hybrid model.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridPreset {
    pub name: &'static str,
    pub hidden: usize,
    pub n_layers: usize,
    pub full_attention_interval: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub tied: bool,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    pub rope_theta: f32,
    pub partial_rotary_factor: f32,
    pub norm_eps: f32,
    pub max_pos: usize,
    /// Written as a Bonsai 2 `prism_hadamard_qwen35` pack (stored weights in the rotated basis).
    pub rotated: bool,
}

pub const HYBRID_PRESET_NAMES: &[&str] = &[
    "tiny-qwen35",
    "tiny-prism",
    "27b-qwen35",
    "27b-qwen35-4l",
    "27b-prism",
    "27b-prism-4l",
];

impl HybridPreset {
    pub fn by_name(name: &str) -> Result<HybridPreset> {
        // Real ratios at small widths: 3 value heads per key head (27B: 48 / 16), one kv head
        // per 4 query heads, RoPE on a quarter of each head, full attention every 4th layer.
        let tiny = HybridPreset {
            name: "tiny-qwen35",
            hidden: 256,
            n_layers: 8,
            full_attention_interval: 4,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 128,
            ffn: 512,
            vocab: 4096,
            tied: false,
            k_heads: 4,
            v_heads: 12,
            k_dim: 64,
            v_dim: 64,
            conv_kernel: 4,
            rope_theta: 1e7,
            partial_rotary_factor: 0.25,
            norm_eps: 1e-6,
            max_pos: 262_144,
            rotated: false,
        };
        Ok(match name {
            "tiny-qwen35" => tiny,
            // Rotation blocks start at 512 (formats.md §3.6), so every width is a multiple of
            // 512; tied head as in Bonsai 2 GGUF v2; attn_output left unrotated (block 0).
            "tiny-prism" => HybridPreset {
                name: "tiny-prism",
                hidden: 512,
                n_layers: 4,
                ffn: 1024,
                tied: true,
                v_dim: 128,
                rotated: true,
                ..tiny
            },
            // models.md §3.1.
            "27b-qwen35" => HybridPreset {
                name: "27b-qwen35",
                hidden: 5120,
                n_layers: 64,
                n_heads: 24,
                n_kv_heads: 4,
                head_dim: 256,
                ffn: 17408,
                vocab: 248_320,
                k_heads: 16,
                v_heads: 48,
                k_dim: 128,
                v_dim: 128,
                ..tiny
            },
            // The 27B's widths and vocabulary with 4 of its 64 layers (3 linear + 1 full):
            // a per-layer speed probe that fits in memory where the 7 GB model does not.
            "27b-qwen35-4l" => HybridPreset {
                name: "27b-qwen35-4l",
                n_layers: 4,
                ..Self::by_name("27b-qwen35")?
            },
            // Bonsai 2's layout at the 27B's widths (each a multiple of 512): every projection
            // input rotated, tied head; full and with 4 layers.
            "27b-prism" => HybridPreset {
                name: "27b-prism",
                tied: true,
                rotated: true,
                ..Self::by_name("27b-qwen35")?
            },
            "27b-prism-4l" => HybridPreset {
                name: "27b-prism-4l",
                n_layers: 4,
                ..Self::by_name("27b-prism")?
            },
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown hybrid preset '{other}' (known: {})",
                    HYBRID_PRESET_NAMES.join(", ")
                )))
            }
        })
    }

    pub fn is_linear(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_attention_interval)
    }

    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// Every tensor, canonical names (GGUF qwen35 spelling), embedding first.
    pub fn tensors(&self) -> Vec<Plan> {
        let h = self.hidden;
        let proj = |name: String, out: usize, inp: usize| Plan {
            name,
            shape: vec![out, inp],
            kind: Kind::Ternary {
                base: (1.5 / inp as f32).sqrt(),
            },
        };
        let plan = |name: String, shape: Vec<usize>, kind: Kind| Plan { name, shape, kind };
        let mut v = vec![plan(
            "token_embd.weight".into(),
            vec![self.vocab, h],
            Kind::Ternary { base: 0.1 },
        )];
        let ab = 1.7 / (h as f32).sqrt();
        let (vw, hv) = (self.v_heads * self.v_dim, self.v_heads);
        for i in 0..self.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            v.push(plan(n("attn_norm.weight"), vec![h], Kind::Norm));
            if self.is_linear(i) {
                v.push(proj(n("attn_qkv.weight"), self.conv_dim(), h));
                v.push(proj(n("attn_gate.weight"), vw, h));
                let small = Kind::Small { lo: -ab, hi: ab };
                v.push(plan(n("ssm_beta.weight"), vec![hv, h], small));
                v.push(plan(n("ssm_alpha.weight"), vec![hv, h], small));
                v.push(plan(
                    n("ssm_conv1d.weight"),
                    vec![self.conv_dim(), self.conv_kernel],
                    Kind::Small { lo: -0.5, hi: 0.5 },
                ));
                v.push(plan(
                    n("ssm_dt.bias"),
                    vec![hv],
                    Kind::Param { lo: 0.5, hi: 1.5 },
                ));
                v.push(plan(
                    n("ssm_a_log"),
                    vec![hv],
                    Kind::Param {
                        lo: 0.0,
                        hi: 16f32.ln(),
                    },
                ));
                v.push(plan(n("ssm_norm.weight"), vec![self.v_dim], Kind::Norm));
                v.push(proj(n("ssm_out.weight"), h, vw));
            } else {
                let q = self.n_heads * self.head_dim;
                let kv = self.n_kv_heads * self.head_dim;
                v.push(proj(n("attn_q.weight"), 2 * q, h));
                v.push(proj(n("attn_k.weight"), kv, h));
                v.push(proj(n("attn_v.weight"), kv, h));
                v.push(proj(n("attn_output.weight"), h, q));
                v.push(plan(
                    n("attn_q_norm.weight"),
                    vec![self.head_dim],
                    Kind::Norm,
                ));
                v.push(plan(
                    n("attn_k_norm.weight"),
                    vec![self.head_dim],
                    Kind::Norm,
                ));
            }
            v.push(plan(n("post_attention_norm.weight"), vec![h], Kind::Norm));
            v.push(proj(n("ffn_gate.weight"), self.ffn, h));
            v.push(proj(n("ffn_up.weight"), self.ffn, h));
            v.push(proj(n("ffn_down.weight"), h, self.ffn));
        }
        v.push(plan("output_norm.weight".into(), vec![h], Kind::Norm));
        if !self.tied {
            v.push(proj("output.weight".into(), self.vocab, h));
        }
        v
    }

    fn text_config(&self) -> Value {
        json!({
            "model_type": "qwen3_5_text",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.n_layers,
            "intermediate_size": self.ffn,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_pos,
            "rms_norm_eps": self.norm_eps,
            "tie_word_embeddings": self.tied,
            "full_attention_interval": self.full_attention_interval,
            "linear_num_key_heads": self.k_heads,
            "linear_num_value_heads": self.v_heads,
            "linear_key_head_dim": self.k_dim,
            "linear_value_head_dim": self.v_dim,
            "linear_conv_kernel_dim": self.conv_kernel,
            "attention_bias": false,
            "hidden_act": "silu",
            "rope_parameters": {
                "type": "default", "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": [11, 11, 10], "mrope_interleaved": true
            },
            "bos_token_id": 0,
            "eos_token_id": 1,
        })
    }

    /// The folder's `config.json`, as mlx-lm writes a converted Qwen3.5 checkpoint (plus the
    /// schema keys and module manifest of a rotated pack).
    pub fn config_json(&self) -> Value {
        let q = json!({"group_size": MLX_GROUP, "bits": 2, "mode": "affine"});
        let mut c = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": self.tied,
            "text_config": self.text_config(),
            "quantization": q,
            "quantization_config": q,
        });
        if self.rotated {
            let modules: Vec<Value> = self
                .tensors()
                .iter()
                .filter(|t| matches!(t.kind, Kind::Ternary { .. }))
                .map(|t| {
                    let hf = hf_tensor_name(&folder_canonical(&t.name));
                    let path = hf
                        .strip_prefix("language_model.")
                        .and_then(|m| m.strip_suffix(".weight"))
                        .expect("generated name");
                    json!({"path": path, "embedding": t.name == "token_embd.weight",
                           "dtype": "float16", "block": block_for(&t.name, t.shape[1])})
                })
                .collect();
            c["model_type"] = json!("prism_hadamard_qwen35");
            c["schema_version"] = json!(1);
            c["tensor_namespace"] = json!("mlx-lm-text");
            c["gdn_activation_layout"] = json!("grouped");
            c["modules"] = json!(modules);
        }
        c
    }
}

/// Hadamard block of a generated rotated weight: 512 (one block for the whole model, as a
/// GGUF file requires), except `attn_output`, left unrotated so the pack mixes both kinds.
pub fn block_for(name: &str, width: usize) -> usize {
    if name.ends_with("attn_output.weight") || !width.is_multiple_of(512) {
        return 0;
    }
    512
}

/// The ±1 sign vector of a rotated input of `width` (one per width, as in GGUF files, so
/// projections sharing an input share the rotation).
pub fn gen_signs(seed: u64, width: usize) -> Vec<f32> {
    let plan = Plan {
        name: format!("hadamard.signs.{width}"),
        shape: vec![width],
        kind: Kind::Param { lo: -1.0, hi: 1.0 },
    };
    gen_uniform(seed, &plan)
        .iter()
        .map(|&v| if v < 0.0 { -1.0 } else { 1.0 })
        .collect()
}

/// `blk.3.ssm_a_log` → `language_model.model.layers.3.linear_attn.A_log` (tensor names).
fn hf_tensor_name(canonical: &str) -> String {
    let params = [
        (".ssm_a_log", "linear_attn.A_log"),
        (".ssm_dt.bias", "linear_attn.dt_bias"),
    ];
    for (suffix, hf) in params {
        if let Some(block) = canonical.strip_suffix(suffix) {
            let layer = block.strip_prefix("blk.").expect("layer tensor");
            return format!("language_model.model.layers.{layer}.{hf}");
        }
    }
    let module = canonical.strip_suffix(".weight").expect("weight tensor");
    let hf = canonical_to_hf(module).expect("generator names are canonical");
    // mlx-lm's qwen3_5 keeps the text model under `language_model.`; the folder loader maps
    // ssm_norm/post_attention_norm through the qwen3 names.
    format!("language_model.{hf}.weight")
}

/// The canonical name the folder mapping knows for a generated tensor (the generator uses
/// GGUF's `post_attention_norm`, the HF mapping calls that norm `ffn_norm`).
fn folder_canonical(name: &str) -> String {
    name.replace(".post_attention_norm.", ".ffn_norm.")
}

/// Writes the plain qwen3_5 MLX 2-bit folder.
pub fn write_mlx_folder(
    p: &HybridPreset,
    seed: u64,
    dir: &Path,
    tok: &LoadedTokenizer,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let plans = p.tensors();
    let mut specs = Vec::new();
    let mut owners = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let hf = hf_tensor_name(&folder_canonical(&plan.name));
        match plan.kind {
            Kind::Ternary { .. } => {
                let module = hf.strip_suffix(".weight").expect("weight");
                let (rows, cols) = (plan.shape[0], plan.shape[1]);
                push_mlx_ternary(module, rows, cols, i, &mut specs, &mut owners);
                if p.rotated && block_for(&plan.name, cols) != 0 {
                    specs.push(TensorSpec {
                        name: format!("{module}.signs"),
                        dtype: Dtype::F32,
                        shape: vec![cols],
                    });
                    owners.push((i, Part::Plain));
                }
            }
            kind => {
                let mut shape = plan.shape.clone();
                if plan.name.ends_with("ssm_conv1d.weight") {
                    shape.push(1); // MLX Conv1d weight: [out, kernel, in / groups]
                }
                let dtype = match kind {
                    Kind::Param { .. } => Dtype::F32,
                    _ => Dtype::F16,
                };
                specs.push(TensorSpec {
                    name: hf,
                    dtype,
                    shape,
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
        |plan, ternary| match ternary {
            // The only plain part of a packed tensor is its sign vector.
            Some(t) => gen_signs(seed, t.cols)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            None => plain_bytes(seed, plan),
        },
    )?;
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).expect("json");
    write_file(&dir.join("config.json"), &pretty(&p.config_json()))?;
    write_file(&dir.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_file(
        &dir.join("tokenizer_config.json"),
        &tok.tokenizer_config_json,
    )
}

/// Bytes of an unquantized tensor as the MLX folder stores it.
fn plain_bytes(seed: u64, plan: &Plan) -> Vec<u8> {
    match plan.kind {
        Kind::Norm => f16_bytes(&gen_norm(seed, plan)),
        Kind::Small { .. } => {
            let v: Vec<half::f16> = gen_uniform(seed, plan)
                .iter()
                .map(|&x| half::f16::from_f32(x))
                .collect();
            f16_bytes(&v)
        }
        Kind::Param { .. } => gen_uniform(seed, plan)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        Kind::Ternary { .. } => unreachable!("packed separately"),
    }
}

/// Writes the requested formats into `out`: `out/mlx/` and `out/model-<type>.gguf` (ternary
/// GGUF types only).
pub fn generate(
    p: &HybridPreset,
    seed: u64,
    out: &Path,
    formats: &[OutFormat],
    tokenizer: &TokenizerAssets,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let tok = tokenizer.load(p.vocab)?;
    for &f in formats {
        let path = out.join(f.file_name());
        match f {
            OutFormat::Mlx => write_mlx_folder(p, seed, &path, &tok)?,
            OutFormat::Gguf(ty) => super::hybrid_gguf::write_gguf(p, seed, &path, ty, &tok)?,
            OutFormat::F16 | OutFormat::Hf => {
                return Err(Error::InvalidArgument(
                    "hybrid presets are written as MLX folders and GGUF files only".into(),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_folder_mapping() {
        assert_eq!(
            hf_tensor_name("blk.3.ssm_a_log"),
            "language_model.model.layers.3.linear_attn.A_log"
        );
        assert_eq!(
            hf_tensor_name("blk.0.attn_qkv.weight"),
            "language_model.model.layers.0.linear_attn.in_proj_qkv.weight"
        );
        let p = HybridPreset::by_name("tiny-qwen35").unwrap();
        assert_eq!(
            (0..8).filter(|&i| !p.is_linear(i)).collect::<Vec<_>>(),
            vec![3, 7]
        );
    }

    #[test]
    fn big_preset_has_the_27b_parameter_count() {
        // models.md §3.1: 26,895,998,464 parameters in the 27B GGUF (without vision / MTP).
        let p = HybridPreset::by_name("27b-qwen35").unwrap();
        let n: usize = p
            .tensors()
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum();
        assert_eq!(n, 26_895_998_464);
    }

    #[test]
    fn prism_presets_are_the_27b_rotated_with_a_tied_head() {
        let (plain, rotated) = (
            HybridPreset::by_name("27b-qwen35").unwrap(),
            HybridPreset::by_name("27b-prism").unwrap(),
        );
        assert!(rotated.rotated && rotated.tied && !plain.rotated);
        assert_eq!(
            (
                rotated.hidden,
                rotated.ffn,
                rotated.v_heads,
                rotated.n_layers
            ),
            (plain.hidden, plain.ffn, plain.v_heads, plain.n_layers)
        );
        // Tied: the 27B without its separate output matrix.
        let count = |p: &HybridPreset| -> usize {
            p.tensors()
                .iter()
                .map(|t| t.shape.iter().product::<usize>())
                .sum()
        };
        assert_eq!(count(&plain) - count(&rotated), plain.vocab * plain.hidden);
        // Every rotated input width holds whole 512-value blocks.
        for w in [rotated.hidden, rotated.ffn, rotated.v_heads * rotated.v_dim] {
            assert_eq!(block_for("blk.0.ffn_down.weight", w), 512, "width {w}");
        }
        let four = HybridPreset::by_name("27b-prism-4l").unwrap();
        assert!(four.rotated && four.tied && four.n_layers == 4);
    }
}
