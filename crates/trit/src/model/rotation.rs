//! Applies Bonsai 2's Walsh–Hadamard rotated basis (formats.md §8) around the projections:
//! a rotated weight multiplies `H_B(s ⊙ x)`; the embedding row is un-rotated after the lookup
//! (`s ⊙ H_B(row)`). `Projector` rotates one input once per distinct rotation and reuses it for
//! every projection that reads that input (q/k/v, qkv + z, gate + up).

use super::weights::linear;
use crate::format::rotation::{InputRotation, RotationSpec};
use crate::format::WeightSource;
use crate::kernels::hadamard::fwht_blocks;
use crate::kernels::Linear;
use crate::threadpool::ThreadPool;
use crate::{Error, Result};
use std::sync::Arc;

/// A projection and the rotation of its input, if its weight is stored rotated.
pub struct RotatedLinear {
    pub lin: Linear,
    pub rot: Option<Arc<InputRotation>>,
}

/// The rotations of one loaded model (empty for unrotated files).
#[derive(Default)]
pub struct Rotations {
    spec: RotationSpec,
}

/// `x ← H_B(s ⊙ x)` for each row of `x` (rows of the rotation's width).
fn rotate_rows(rot: &InputRotation, x: &mut [f32]) {
    let n = rot.signs.len();
    for row in x.chunks_exact_mut(n) {
        for (v, s) in row.iter_mut().zip(&rot.signs) {
            *v *= s;
        }
        fwht_blocks(row, rot.block);
    }
}

impl Rotations {
    pub fn new(spec: Option<RotationSpec>) -> Self {
        Rotations {
            spec: spec.unwrap_or_default(),
        }
    }

    /// Loads a `rows × cols` projection with its rotation, checking the rotation fits.
    pub fn linear(
        &self,
        src: &dyn WeightSource,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<RotatedLinear> {
        let rot = self.spec.weights.get(name).cloned();
        if let Some(r) = &rot {
            check_fits(name, r, cols)?;
        }
        Ok(RotatedLinear {
            lin: linear(src, name, rows, cols)?,
            rot,
        })
    }

    /// Every rotated weight the file declares must be one the graph reads.
    pub fn check_all_used(&self, used: &dyn Fn(&str) -> bool) -> Result<()> {
        match self.spec.weights.keys().find(|k| !used(k)) {
            Some(k) => Err(Error::Format(format!(
                "the rotation metadata names '{k}', which this model does not have"
            ))),
            None => Ok(()),
        }
    }

    /// Checks the embedding's rotation against the hidden width.
    pub fn check_embedding(&self, hidden: usize) -> Result<()> {
        match &self.spec.embedding {
            Some(r) => check_fits("token_embd.weight", r, hidden),
            None => Ok(()),
        }
    }

    /// Turns a looked-up embedding row into the model's basis: `s ⊙ H_B(row)`.
    pub fn unrotate_embedding(&self, row: &mut [f32]) {
        let Some(r) = &self.spec.embedding else {
            return;
        };
        if self.spec.embedding_f16 {
            round_f16(row);
        }
        fwht_blocks(row, r.block);
        for (v, s) in row.iter_mut().zip(&r.signs) {
            *v *= s;
        }
        if self.spec.embedding_f16 {
            round_f16(row);
        }
    }

    /// Whether ssm_out's rotated columns are in grouped value-head order (GGUF `gdn_v_grouped`).
    pub fn ssm_out_grouped(&self) -> bool {
        self.spec.ssm_out_grouped
    }

    /// A tied head multiplies the embedding matrix, which is stored rotated too.
    pub fn rotate_for_tied_head(&self, x: &mut [f32]) {
        if let Some(r) = &self.spec.embedding {
            rotate_rows(r, x);
        }
    }
}

fn round_f16(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

fn check_fits(name: &str, r: &InputRotation, cols: usize) -> Result<()> {
    if r.signs.len() != cols || r.block == 0 || !cols.is_multiple_of(r.block) {
        return Err(Error::Format(format!(
            "'{name}': rotation with {} signs and block {} does not fit its input width {cols}",
            r.signs.len(),
            r.block
        )));
    }
    Ok(())
}

/// One input shared by several projections; rotated copies are made on first use.
pub struct Projector<'a> {
    pool: &'a ThreadPool,
    x: &'a [f32],
    n: usize,
    rotated: Vec<(Arc<InputRotation>, Vec<f32>)>,
}

impl<'a> Projector<'a> {
    pub fn new(pool: &'a ThreadPool, x: &'a [f32], n: usize) -> Self {
        Projector {
            pool,
            x,
            n,
            rotated: Vec::new(),
        }
    }

    /// `y = W · x`, or `W · H_B(s ⊙ x)` for a rotated weight.
    pub fn run(&mut self, l: &RotatedLinear, y: &mut [f32]) {
        let Some(rot) = &l.rot else {
            l.lin.forward(self.pool, self.x, self.n, y);
            return;
        };
        let i = match self.rotated.iter().position(|(r, _)| Arc::ptr_eq(r, rot)) {
            Some(i) => i,
            None => {
                let mut x = self.x.to_vec();
                rotate_rows(rot, &mut x);
                self.rotated.push((rot.clone(), x));
                self.rotated.len() - 1
            }
        };
        l.lin.forward(self.pool, &self.rotated[i].1, self.n, y);
    }
}
