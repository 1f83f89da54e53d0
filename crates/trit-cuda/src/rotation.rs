//! Bonsai 2's Walsh–Hadamard rotated basis on the GPU (formats.md §8; the CPU applies it in
//! `trit::model::rotation`): the file's rotations uploaded once (identical ones shared, as the
//! CPU's `RotationSpec` shares them), and the launch of `hadamard_quant` (kernels/hadamard.cu),
//! which prepares a rotated input — copy, RMSNorm or SwiGLU, then `H_B(s ⊙ x)` — and
//! quantizes it for the ternary GEMV in one kernel.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use cudarc::driver::CudaSlice;
use std::sync::Arc;
use trit::format::rotation::{InputRotation, RotationSpec};
use trit::{Error, Result};

/// Largest Hadamard block the kernel holds in shared memory (`HR_MAX_BLOCK`).
pub const MAX_BLOCK: usize = 8192;
/// Threads of one `hadamard_quant` block.
const THREADS: u32 = 256;

/// One rotation on the device: block size and ±1 signs (one per input column).
pub struct DevRotation {
    pub block: usize,
    pub signs: CudaSlice<f32>,
}

/// What the rotated values are made from (`HR_*` in hadamard.cu).
#[derive(Clone, Copy, Debug)]
pub enum RotSource {
    /// `n` f32 values at `x`.
    Copy { x: u64 },
    /// RMSNorm of the `n` values at `x` with weights `gamma`.
    Norm { x: u64, gamma: u64, eps: f32 },
    /// SwiGLU of gate‖up at `x` (`2n` values): `silu(gate) · up`.
    Glu { x: u64 },
    /// The embedding's inverse rotation `s ⊙ H_B(x)` (f16-rounded before and after when asked),
    /// written to `RotOut::rotated`.
    Embed { x: u64, round_f16: bool },
}

/// Where the results go (0: not wanted).
#[derive(Clone, Copy, Debug, Default)]
pub struct RotOut {
    /// The prepared values before the rotation (what unrotated projections of the input read).
    pub prepared: u64,
    /// The rotated f32 values.
    pub rotated: u64,
    /// int8 blocks of the rotated values and their per-64 `(d, d·Σq)`.
    pub q: u64,
    pub meta: u64,
}

/// Checks a rotation the kernel can run for an input of `cols` values (the loaders have
/// already checked it fits the file; this adds the kernel's own limits).
pub fn check(name: &str, r: &InputRotation, cols: usize) -> Result<()> {
    if r.signs.len() != cols || r.block == 0 || !cols.is_multiple_of(r.block) {
        return Err(Error::Format(format!(
            "'{name}': rotation with {} signs and block {} does not fit its input width {cols}",
            r.signs.len(),
            r.block
        )));
    }
    if !r.block.is_power_of_two() || !(64..=MAX_BLOCK).contains(&r.block) {
        return Err(Error::Unsupported(format!(
            "CUDA: '{name}' has Hadamard block {}; the GPU kernel runs powers of two from 64 to \
             {MAX_BLOCK}",
            r.block
        )));
    }
    Ok(())
}

/// The model's rotations on the device, one per distinct `InputRotation`.
#[derive(Default)]
pub struct DevRotations {
    list: Vec<(Arc<InputRotation>, DevRotation)>,
    /// Names of the weights whose rotation was asked for (to find declared but unused ones).
    used: Vec<String>,
}

impl DevRotations {
    /// The rotation of weight `name` (`cols` inputs) in `spec`, uploaded on first use; `None`
    /// for an unrotated weight.
    pub fn of(
        &mut self,
        gpu: &Gpu,
        spec: Option<&RotationSpec>,
        name: &str,
        cols: usize,
    ) -> Result<Option<usize>> {
        let Some(r) = spec.and_then(|s| s.weights.get(name)) else {
            return Ok(None);
        };
        self.used.push(name.to_string());
        self.add(gpu, name, r, cols).map(Some)
    }

    /// The rotation all of `names` share (projections stacked into one matrix read one
    /// rotated input); an error where they differ.
    pub fn shared(
        &mut self,
        gpu: &Gpu,
        spec: Option<&RotationSpec>,
        names: &[&str],
        cols: usize,
    ) -> Result<Option<usize>> {
        let each: Vec<Option<usize>> = names
            .iter()
            .map(|n| self.of(gpu, spec, n, cols))
            .collect::<Result<_>>()?;
        if each.iter().any(|r| *r != each[0]) {
            return Err(Error::Unsupported(format!(
                "CUDA: {names:?} read the same input with different rotations; the GPU stacks \
                 them into one matrix (run this file with --device cpu)"
            )));
        }
        Ok(each[0])
    }

    /// The embedding's rotation (also the tied head's), checked against the hidden width.
    pub fn embedding(
        &mut self,
        gpu: &Gpu,
        spec: Option<&RotationSpec>,
        hidden: usize,
    ) -> Result<Option<usize>> {
        match spec.and_then(|s| s.embedding.as_ref()) {
            Some(r) => self.add(gpu, "token_embd.weight", r, hidden).map(Some),
            None => Ok(None),
        }
    }

    fn add(&mut self, gpu: &Gpu, name: &str, r: &Arc<InputRotation>, cols: usize) -> Result<usize> {
        check(name, r, cols)?;
        if let Some(i) = self.list.iter().position(|(a, _)| **a == **r) {
            return Ok(i);
        }
        let dev = DevRotation {
            block: r.block,
            signs: gpu.upload(&r.signs)?,
        };
        self.list.push((r.clone(), dev));
        Ok(self.list.len() - 1)
    }

    /// Every rotated weight the file declares must be one the GPU model read with its
    /// rotation (as the CPU loader checks): otherwise the file and this reader disagree.
    pub fn check_all_used(&self, spec: Option<&RotationSpec>) -> Result<()> {
        let Some(spec) = spec else { return Ok(()) };
        match spec.weights.keys().find(|k| !self.used.contains(k)) {
            Some(k) => Err(Error::Format(format!(
                "the rotation metadata names '{k}', which this model does not have"
            ))),
            None => Ok(()),
        }
    }

    pub fn get(&self, i: usize) -> &DevRotation {
        &self.list[i].1
    }
}

/// Launches `hadamard_quant` over `n` values (a multiple of the rotation's block).
pub fn launch_rotate(
    gpu: &Gpu,
    r: &DevRotation,
    n: usize,
    src: RotSource,
    out: RotOut,
) -> Result<()> {
    launch_rotate_rows(gpu, r, n, 1, src, out)
}

/// [`launch_rotate`] over `rows` consecutive rows of `n` values (`2n` for [`RotSource::Glu`]),
/// every output row `n` values after the previous one (its int8 blocks' `(d, d·Σq)` `n / 64`
/// pairs after).
pub fn launch_rotate_rows(
    gpu: &Gpu,
    r: &DevRotation,
    n: usize,
    rows: usize,
    src: RotSource,
    out: RotOut,
) -> Result<()> {
    if r.block == 0 || !n.is_multiple_of(r.block) {
        return Err(Error::InvalidArgument(format!(
            "Hadamard block {} does not divide {n} values",
            r.block
        )));
    }
    let (mode, x, gamma, eps, round) = match src {
        RotSource::Copy { x } => (0, x, 0, 0.0, false),
        RotSource::Norm { x, gamma, eps } => (1, x, gamma, eps, false),
        RotSource::Glu { x } => (2, x, 0, 0.0, false),
        RotSource::Embed { x, round_f16 } => (3, x, 0, 0.0, round_f16),
    };
    let s = &gpu.stream;
    gpu.launch(
        "hadamard_quant",
        ((n / r.block) as u32, rows as u32),
        THREADS,
        &[
            Arg::Ptr(x),
            Arg::Ptr(gamma),
            Arg::F32(eps),
            Arg::I32(n as i32),
            Arg::I32(mode),
            Arg::Ptr(ptr(&r.signs, s)),
            Arg::I32(r.block as i32),
            Arg::I32(round as i32),
            Arg::Ptr(out.prepared),
            Arg::Ptr(out.rotated),
            Arg::Ptr(out.q),
            Arg::Ptr(out.meta),
        ],
    )
}

/// What [`rotate_once`] returns: the rotated f32 values and their int8 blocks.
pub struct Rotated {
    pub values: Vec<f32>,
    pub q: Vec<i8>,
    pub meta: Vec<(f32, f32)>,
}

/// Runs `hadamard_quant` once on `x` (the GPU tests compare it with the CPU's
/// `fwht_blocks`): `H_B(s ⊙ x)` and its int8 blocks, or with `embed` the embedding's inverse
/// `s ⊙ H_B(x)` (no int8 blocks then).
pub fn rotate_once(
    gpu: &Gpu,
    x: &[f32],
    rot: &InputRotation,
    embed: bool,
    round_f16: bool,
) -> Result<Rotated> {
    check("test input", rot, x.len())?;
    let s = &gpu.stream;
    let n = x.len();
    let r = DevRotation {
        block: rot.block,
        signs: gpu.upload(&rot.signs)?,
    };
    let dx = gpu.upload(x)?;
    let xr = gpu.upload(&vec![f32::NAN; n])?;
    let q = gpu.zeros::<i8>(n)?;
    let meta = gpu.zeros::<f32>(2 * (n / 64))?;
    let (src, out) = if embed {
        (
            RotSource::Embed {
                x: ptr(&dx, s),
                round_f16,
            },
            RotOut {
                rotated: ptr(&xr, s),
                ..RotOut::default()
            },
        )
    } else {
        (
            RotSource::Copy { x: ptr(&dx, s) },
            RotOut {
                prepared: 0,
                rotated: ptr(&xr, s),
                q: ptr(&q, s),
                meta: ptr(&meta, s),
            },
        )
    };
    launch_rotate(gpu, &r, n, src, out)?;
    gpu.sync()?;
    let back = |what: &str, e| cuda_err(&format!("copying the rotated {what}"), e);
    let values = s.clone_dtoh(&xr).map_err(|e| back("values", e))?;
    let q = s.clone_dtoh(&q).map_err(|e| back("int8 blocks", e))?;
    let m = s.clone_dtoh(&meta).map_err(|e| back("scales", e))?;
    Ok(Rotated {
        values,
        q,
        meta: m.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rot(block: usize, n: usize) -> InputRotation {
        InputRotation {
            block,
            signs: vec![1.0; n],
        }
    }

    #[test]
    fn rotations_the_kernel_cannot_run_are_refused_with_the_reason() {
        check("w", &rot(1024, 5120), 5120).unwrap();
        check("w", &rot(8192, 16384), 16384).unwrap();
        let refused = |r: InputRotation, cols: usize, needle: &str| {
            let e = check("blk.0.ffn_down.weight", &r, cols)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle) && e.contains("ffn_down"), "{e}");
        };
        refused(rot(16384, 16384), 16384, "powers of two from 64");
        refused(rot(96, 192), 192, "powers of two from 64");
        refused(rot(32, 64), 64, "powers of two from 64");
        refused(rot(1024, 5120), 6144, "does not fit");
        refused(rot(1024, 1536), 1536, "does not fit");
        refused(rot(0, 512), 512, "does not fit");
    }
}
