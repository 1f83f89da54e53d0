//! Llama architecture (SmolLM2; BitNet b1.58 adds sub-norms, see `bitnet.rs`).
//!
//! Same block as Qwen3 without the per-head q/k norms. GGUF llama files store the Q and K
//! rows permuted (llama.cpp's converter), which makes adjacent-pair RoPE correct for them;
//! HF/MLX folders keep the original rows and use rotate-half. The loader records which one
//! applies in `ModelConfig::rope_style`, so this file needs no special case.

use super::transformer::Transformer;
use crate::format::config::ModelConfig;
use crate::format::WeightSource;
use crate::Result;

pub fn load(cfg: &ModelConfig, src: &dyn WeightSource) -> Result<Transformer> {
    Transformer::load(cfg, src, false)
}
