//! Which weights of a Bonsai 2 file are stored in the Walsh–Hadamard rotated basis
//! (formats.md §8), as found by the loaders: the MLX pack's manifest and `.signs` tensors or
//! GGUF `prism.hadamard.*` metadata. The model applies it (`model::rotation`).

use std::collections::BTreeMap;
use std::sync::Arc;

/// Block size and ±1 sign vector of one rotated input (`y = W · H_B(s ⊙ x)`).
#[derive(Clone, Debug, PartialEq)]
pub struct InputRotation {
    pub block: usize,
    pub signs: Vec<f32>,
}

/// Rotations by canonical weight name. Identical rotations share one `Arc`, so the model
/// transforms an input once for every projection that reads it with the same rotation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RotationSpec {
    pub weights: BTreeMap<String, Arc<InputRotation>>,
    /// Rotation of the token embedding ("latent" rows: `h = s ⊙ H_B(row)` after the lookup).
    pub embedding: Option<Arc<InputRotation>>,
    /// Round the un-rotated embedding row to f16, as mlx-lm's pack does.
    pub embedding_f16: bool,
    /// GGUF `prism.hadamard.gdn_v_grouped`: `ssm_out` columns stay in grouped order in a file
    /// whose other linear-attention tensors are tiled.
    pub ssm_out_grouped: bool,
}

impl RotationSpec {
    /// Adds a rotation, reusing an existing identical one.
    pub fn insert(&mut self, weight: String, rot: InputRotation) -> Arc<InputRotation> {
        let shared = self
            .weights
            .values()
            .chain(self.embedding.iter())
            .find(|r| ***r == rot)
            .cloned()
            .unwrap_or_else(|| Arc::new(rot));
        self.weights.insert(weight, shared.clone());
        shared
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty() && self.embedding.is_none()
    }

    /// Distinct block sizes, for `trit info`.
    pub fn describe(&self) -> String {
        let mut blocks: Vec<usize> = self
            .weights
            .values()
            .chain(self.embedding.iter())
            .map(|r| r.block)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        format!(
            "Hadamard-rotated: {} weights{}, block {:?}",
            self.weights.len(),
            if self.embedding.is_some() {
                " + embedding"
            } else {
                ""
            },
            blocks
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rotations_are_shared() {
        let mut spec = RotationSpec::default();
        let rot = |block, s: f32| InputRotation {
            block,
            signs: vec![s; 1024],
        };
        let q = spec.insert("blk.0.attn_q.weight".into(), rot(512, 1.0));
        let k = spec.insert("blk.0.attn_k.weight".into(), rot(512, 1.0));
        let other_block = spec.insert("blk.0.attn_v.weight".into(), rot(1024, 1.0));
        let other_signs = spec.insert("blk.0.ffn_up.weight".into(), rot(512, -1.0));
        assert!(Arc::ptr_eq(&q, &k));
        assert!(!Arc::ptr_eq(&q, &other_block) && !Arc::ptr_eq(&q, &other_signs));
        assert_eq!(
            spec.describe(),
            "Hadamard-rotated: 4 weights, block [512, 1024]"
        );
    }
}
