//! The second half of a dense decode layer as one persistent kernel (`mlp_persist_*` in
//! kernels/decode_persist.cu; prototype, `CudaOptions::persist_mlp`): o, gate‖up + SwiGLU and
//! down as three phases of the streaming GEMV separated by grid barriers.

use crate::device::{ptr, Arg, Gpu};
use crate::gemv::{stream_smem_bytes, TernaryArgs};
use crate::model::State;
use crate::weights;
use trit::{Error, Result};

/// Warps per block of the persistent kernel (the streaming GEMV's widest shape).
const WARPS: u32 = 16;

/// The matrices and buffers of one layer's persistent MLP half (device addresses).
pub(crate) struct MlpPersist<'a> {
    pub o: &'a TernaryArgs,
    pub gate_up: &'a TernaryArgs,
    pub down: &'a TernaryArgs,
    /// The attention output's int8 blocks and their `(d, d·Σq)`.
    pub att_q: u64,
    pub att_meta: u64,
    pub gamma: u64,
    pub eps: f32,
    /// The residual stream (updated twice) and the SwiGLU output.
    pub x: u64,
    pub h: u64,
    /// A zeroed `u32` the kernel uses for its barriers and leaves at zero.
    pub counter: u64,
}

impl MlpPersist<'_> {
    /// Whether the kernel can run these matrices: ternary with the same scale type, rows per
    /// GEMV within shared memory, gate‖up of an even row count.
    pub(crate) fn fits(&self, gpu: &Gpu) -> bool {
        let same = self.o.f16 == self.gate_up.f16 && self.o.f16 == self.down.f16;
        let widths = [self.o.cols, self.gate_up.cols, self.down.cols];
        same && widths.iter().all(|c| c.is_multiple_of(64) && *c > 0)
            && self.gate_up.rows.is_multiple_of(2)
            && self.o.rows == self.down.rows
            && self.gate_up.cols == self.o.rows
            && self.down.cols == self.gate_up.rows / 2
            && self.smem() + 4096 <= gpu.max_dyn_smem
    }

    fn smem(&self) -> usize {
        let nb = [self.o.cols, self.gate_up.cols, self.down.cols]
            .into_iter()
            .max()
            .unwrap_or(0)
            / 64;
        stream_smem_bytes(nb, 4, WARPS)
    }

    /// Launches the kernel: one block per multiprocessor (every block must be resident for the
    /// grid barriers; refused where the shared memory allows none).
    pub(crate) fn launch(&self, gpu: &Gpu) -> Result<()> {
        let kernel = if self.o.f16 {
            "mlp_persist_r4_f16"
        } else {
            "mlp_persist_r4_f32"
        };
        let smem = self.smem();
        if gpu.resident_blocks_smem(kernel, 32 * WARPS, smem)? < 1 {
            return Err(Error::Unsupported(format!(
                "{kernel}: {smem} bytes of shared memory leave no block resident"
            )));
        }
        let nb = |m: &TernaryArgs| Arg::I32((m.cols / 64) as i32);
        let args = [
            Arg::Ptr(self.o.codes),
            Arg::Ptr(self.o.scales),
            Arg::I32(self.o.rows as i32),
            nb(self.o),
            Arg::Ptr(self.att_q),
            Arg::Ptr(self.att_meta),
            Arg::Ptr(self.gate_up.codes),
            Arg::Ptr(self.gate_up.scales),
            Arg::I32((self.gate_up.rows / 2) as i32),
            nb(self.gate_up),
            Arg::Ptr(self.gamma),
            Arg::F32(self.eps),
            Arg::Ptr(self.down.codes),
            Arg::Ptr(self.down.scales),
            nb(self.down),
            Arg::Ptr(self.x),
            Arg::Ptr(self.h),
            Arg::Ptr(self.counter),
        ];
        gpu.launch_smem(kernel, (gpu.sm_count, 1), 32 * WARPS, smem as u32, &args)
    }
}

impl crate::model::CudaModel {
    /// o, gate‖up and down of `blk` as one persistent kernel, where it runs them (all three
    /// ternary, one scale type, shared memory enough); false: the caller takes the chain.
    pub(crate) fn mlp_persist(&self, st: &State, blk: &weights::DevBlock) -> Result<bool> {
        let s = &st.gpu.stream;
        let (Some(o), Some(gate_up), Some(down)) = (
            blk.o.ternary_args(s),
            blk.gate_up.ternary_args(s),
            blk.down.ternary_args(s),
        ) else {
            return Ok(false);
        };
        let b = &st.b;
        let job = crate::persist::MlpPersist {
            o: &o,
            gate_up: &gate_up,
            down: &down,
            att_q: ptr(&b.xq, s),
            att_meta: ptr(&b.xm, s),
            gamma: ptr(&blk.ffn_norm, s),
            eps: self.config.norm_eps,
            x: ptr(&b.x, s),
            h: ptr(&b.h, s),
            counter: ptr(&b.persist, s),
        };
        if !job.fits(&st.gpu) {
            return Ok(false);
        }
        job.launch(&st.gpu)?;
        Ok(true)
    }
}
