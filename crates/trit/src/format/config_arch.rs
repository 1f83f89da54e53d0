//! Architecture names: `Arch` (the network family), `Family` (an architecture name resolved to
//! the network that runs it: BitNet b1.58 is the llama decoder with sub-norms) and the MLP's
//! `Activation`.

use crate::{Error, Result};

/// Supported architectures (GGUF `general.architecture` / HF `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen3,
    /// Qwen3.5 hybrid: Gated DeltaNet + gated full attention (`ModelConfig::hybrid`).
    Qwen35,
}

impl Arch {
    pub const SUPPORTED: &'static str =
        "llama, qwen3, qwen3_5 (GGUF qwen35), bitnet (GGUF bitnet, bitnet-b1.58)";

    /// The architecture of a GGUF `general.architecture` / HF `model_type`. BitNet b1.58 is
    /// the llama block with two sub-norms and a squared-ReLU MLP: it runs on the dense
    /// decoder as `Arch::Llama` with `ModelConfig::bitnet` set (see [`Family::of`]).
    pub fn from_name(name: &str) -> Result<Arch> {
        Family::of(name).map(|f| f.arch)
    }

    fn from_plain_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen3_5" | "qwen3_5_text" | "qwen35" => Ok(Arch::Qwen35),
            "qwen3_next" => Err(Error::Unsupported(
                "architecture 'qwen3_next': its checkpoints fuse q/k/v/z and b/a into \
                 interleaved projections and use mixture-of-experts MLPs; trit runs the \
                 dense qwen3_5 hybrid layout"
                    .into(),
            )),
            other => Err(Error::Unsupported(format!(
                "architecture '{other}' (supported: {})",
                Self::SUPPORTED
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen35 => "qwen35",
        }
    }
}

/// An architecture name resolved to the network that runs it: BitNet b1.58 is `Arch::Llama`
/// plus its two sub-norms and squared-ReLU MLP. (It is not an `Arch` variant of its own so that
/// code matching on `Arch` elsewhere, the GPU crate's loader among it, keeps compiling; that
/// loader refuses BitNet through `ModelConfig::bitnet`, checked by the CLI before it is called.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    pub arch: Arch,
    pub bitnet: bool,
}

impl Family {
    pub fn of(name: &str) -> Result<Family> {
        match name {
            // HF `model_type` "bitnet" (BitNetForCausalLM); GGUF "bitnet" (llama.cpp) and
            // "bitnet-b1.58" (microsoft/BitNet's fork, the 2B4T GGUF).
            "bitnet" | "bitnet-b1.58" => Ok(Family {
                arch: Arch::Llama,
                bitnet: true,
            }),
            "bitnet-25" => Err(Error::Unsupported(
                "architecture 'bitnet-25' (microsoft/BitNet's fork): its block differs from \
                 BitNet b1.58; trit runs bitnet / bitnet-b1.58"
                    .into(),
            )),
            other => Ok(Family {
                arch: Arch::from_plain_name(other)?,
                bitnet: false,
            }),
        }
    }
}

/// The MLP's gate activation: `down(act(gate) ⊙ up)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (llama, qwen3).
    Silu,
    /// `relu(x)²` (BitNet b1.58, HF `hidden_act: relu2`).
    ReluSq,
}

impl Activation {
    /// An HF `hidden_act` value.
    pub fn from_hf(name: &str) -> Result<Activation> {
        match name {
            "silu" | "swish" => Ok(Activation::Silu),
            "relu2" => Ok(Activation::ReluSq),
            other => Err(Error::Unsupported(format!(
                "config.json hidden_act '{other}' (supported: silu, relu2)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::config::ModelConfig;
    use serde_json::json;

    #[test]
    fn bitnet_names_and_config() {
        for name in ["bitnet", "bitnet-b1.58"] {
            let f = Family::of(name).unwrap();
            assert_eq!((f.arch, f.bitnet), (Arch::Llama, true), "{name}");
        }
        assert!(!Family::of("llama").unwrap().bitnet);
        assert!(Family::of("bitnet-25")
            .unwrap_err()
            .to_string()
            .contains("bitnet-25"));
        assert!(Arch::from_name("gpt2")
            .unwrap_err()
            .to_string()
            .contains("bitnet"));
        let j = json!({
            "model_type": "bitnet", "hidden_size": 2560, "num_hidden_layers": 30,
            "intermediate_size": 6912, "num_attention_heads": 20, "num_key_value_heads": 5,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "rope_theta": 500000.0,
            "hidden_act": "relu2", "tie_word_embeddings": true, "vocab_size": 128256
        });
        let c = ModelConfig::from_hf_json(&j, None, None, true, "b").unwrap();
        assert!(c.bitnet && !c.qk_norm);
        assert_eq!(
            (c.arch, c.arch_name(), c.ffn_act),
            (Arch::Llama, "bitnet", Activation::ReluSq)
        );
        assert_eq!((c.head_dim, c.n_kv_heads), (128, 5));
        let mut silu = j.clone();
        silu["hidden_act"] = json!("silu");
        let c = ModelConfig::from_hf_json(&silu, None, None, true, "b").unwrap();
        assert_eq!(c.ffn_act, Activation::Silu);
        let mut none = j.clone();
        none.as_object_mut().unwrap().remove("hidden_act");
        let c = ModelConfig::from_hf_json(&none, None, None, true, "b").unwrap();
        assert_eq!(c.ffn_act, Activation::ReluSq);
        // A llama config keeps SwiGLU whatever hidden_act says.
        let mut llama = j;
        llama["model_type"] = json!("llama");
        let c = ModelConfig::from_hf_json(&llama, None, None, true, "l").unwrap();
        assert_eq!((c.bitnet, c.ffn_act), (false, Activation::Silu));
    }
}
