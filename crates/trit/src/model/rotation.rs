//! Applies Bonsai 2's Walsh–Hadamard rotated basis (formats.md §8) around the projections:
//! a rotated weight multiplies `H_B(s ⊙ x)`; the embedding row is un-rotated after the lookup
//! (`s ⊙ H_B(row)`). `Projector` rotates one input once per distinct rotation and reuses it for
//! every projection that reads that input (q/k/v, qkv + z, gate + up).

use super::weights::linear;
use crate::format::rotation::{InputRotation, RotationSpec};
use crate::format::WeightSource;
use crate::kernels::hadamard::fwht_blocks;
use crate::kernels::{ActQ8, Linear};
use crate::profile::{self, Op};
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

    /// Whether the file declares no rotation at all (the model runs in its trained basis).
    pub fn is_empty(&self) -> bool {
        self.spec.weights.is_empty() && self.spec.embedding.is_none()
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

/// Whether two projections read the same rotation of their input (or both the plain input).
fn same_rotation(a: &Option<Arc<InputRotation>>, b: &Option<Arc<InputRotation>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Products of several projections with one input `x` (`n` rows): each distinct input
/// rotation is applied once, and each (rotated) input is quantized to int8 once, on the pool's
/// threads, then shared by every projection that reads it.
pub struct Projector<'a> {
    pool: &'a ThreadPool,
    x: &'a [f32],
    n: usize,
    /// Per input rotation (`None`: the input itself): the quantized rows.
    inputs: Vec<(Option<Arc<InputRotation>>, ActQ8)>,
}

impl<'a> Projector<'a> {
    pub fn new(pool: &'a ThreadPool, x: &'a [f32], n: usize) -> Self {
        Projector {
            pool,
            x,
            n,
            inputs: Vec::new(),
        }
    }

    /// `y = W · x`, or `W · H_B(s ⊙ x)` for a rotated weight; timed as `op` when profiling.
    pub fn run(&mut self, op: Op, l: &RotatedLinear, y: &mut [f32]) {
        self.run_fused(op, [(l, y)]);
    }

    /// [`run`](Self::run) of projections sharing one input rotation (q/k/v, gate/up) in one
    /// pool dispatch; results are those of separate runs. Parts with different rotations run
    /// one after the other.
    pub fn run_fused<const N: usize>(
        &mut self,
        op: Op,
        mut parts: [(&RotatedLinear, &mut [f32]); N],
    ) {
        if parts
            .iter()
            .any(|(l, _)| !same_rotation(&l.rot, &parts[0].0.rot))
        {
            for (l, y) in parts {
                self.run(op, l, y);
            }
            return;
        }
        let exact = parts.iter().any(|(l, _)| l.lin.needs_exact());
        let i = self.quantized(&parts[0].0.rot, parts[0].0.lin.cols(), exact);
        let xq = &self.inputs[i].1;
        let work: usize = parts.iter().map(|(l, _)| l.lin.rows() * l.lin.cols()).sum();
        let _p = profile::start(op, (work * self.n) as u64);
        let mut lins: Vec<(&Linear, &mut [f32])> =
            parts.iter_mut().map(|(l, y)| (&l.lin, &mut **y)).collect();
        Linear::forward_q8_fused(self.pool, xq, &mut lins);
    }

    /// The index in `inputs` of the input rotated by `rot` and quantized (`cols` wide, with its
    /// exact rows when `exact`), made on first use.
    fn quantized(&mut self, rot: &Option<Arc<InputRotation>>, cols: usize, exact: bool) -> usize {
        let found = self
            .inputs
            .iter()
            .position(|(r, q)| same_rotation(r, rot) && (!exact || q.exact().is_some()));
        if let Some(i) = found {
            return i;
        }
        let _p = profile::start(Op::ActQuant, 0);
        let mut xq = ActQ8::new();
        match rot {
            Some(r) => {
                let mut x = self.x.to_vec();
                rotate_rows(r, &mut x);
                xq.quantize_from_on(Some(self.pool), &x, self.n, cols, exact);
            }
            None => xq.quantize_from_on(Some(self.pool), self.x, self.n, cols, exact),
        }
        self.inputs.push((rot.clone(), xq));
        self.inputs.len() - 1
    }
}
