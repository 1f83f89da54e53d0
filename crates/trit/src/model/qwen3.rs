//! Qwen3 dense architecture (Ternary Bonsai 1.7B / 4B / 8B).
//!
//! Llama's block plus a learned RMSNorm over each query and key head (before RoPE),
//! rotate-half RoPE over the whole head, explicit `head_dim`, tied or untied head, and
//! optional YaRN scaling from the config.

use super::transformer::Transformer;
use crate::format::config::ModelConfig;
use crate::format::WeightSource;
use crate::Result;

pub fn load(cfg: &ModelConfig, src: &dyn WeightSource) -> Result<Transformer> {
    Transformer::load(cfg, src, true)
}
