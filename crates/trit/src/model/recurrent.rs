//! Fixed-size per-sequence state of the Gated DeltaNet layers: the conv1d's last
//! `kernel − 1` inputs and the `Hv × Dv × Dk` delta-rule state, per linear layer.
//!
//! Unlike a KV cache it cannot be cut back to an earlier position, so `KvCache` keeps one
//! snapshot of it (see `KvCache::checkpoint`) for prefix reuse.

#[derive(Clone, Debug, PartialEq)]
pub struct LayerState {
    /// `(kernel − 1) × conv channels`, oldest input first.
    pub conv: Vec<f32>,
    /// `Hv × Dv × Dk`.
    pub ssm: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    pub layers: Vec<LayerState>,
}

impl RecurrentState {
    /// Zero state for `n_layers` linear layers.
    pub fn new(n_layers: usize, conv_len: usize, ssm_len: usize) -> Self {
        RecurrentState {
            layers: (0..n_layers)
                .map(|_| LayerState {
                    conv: vec![0.0; conv_len],
                    ssm: vec![0.0; ssm_len],
                })
                .collect(),
        }
    }

    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.conv.fill(0.0);
            l.ssm.fill(0.0);
        }
    }

    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.conv.len() + l.ssm.len()) * 4)
            .sum()
    }
}
