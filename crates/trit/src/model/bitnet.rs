//! BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T; models.md §4).
//!
//! The llama block with two extra RMSNorms: `attn_sub_norm` on the concatenated attention
//! heads before `o_proj`, and `ffn_sub_norm` on `relu(gate)² ⊙ up` before `down_proj`.
//! Rotate-half RoPE (HF folders, and llama.cpp's bitnet GGUFs, whose converter does not permute
//! Q/K), grouped-query attention, tied embeddings in 2B4T.
//!
//! The ternary projections carry one scale per tensor; the loaders (`format::bitnet_hf`,
//! GGUF `<name>.scale`) fold it into the per-group scales of trit's ternary representation
//! (the same value in every group), so the int8 ternary kernels run them unchanged. The MLP
//! runs in f32 (relu² overflows f16, models.md §4); activations reach the kernels as trit's
//! usual int8 blocks of 64 (finer than BitNet's per-token absmax, W1.58A8).

use super::transformer::Transformer;
use crate::format::config::{Arch, ModelConfig};
use crate::format::WeightSource;
use crate::{Error, Result};

pub fn load(cfg: &ModelConfig, src: &dyn WeightSource) -> Result<Transformer> {
    if !cfg.bitnet || cfg.arch != Arch::Llama {
        return Err(Error::Config(format!(
            "bitnet::load on a {} model",
            cfg.arch_name()
        )));
    }
    Transformer::load(cfg, src, false)
}
