//! BitNet b1.58's sub-normed projections in the decode step: `o` reads RMSNorm(attention
//! output)·γ and `down` reads RMSNorm(relu(gate)²·up)·γ (`attn_sub_norm`, `ffn_sub_norm`).
//! The fused GEMV normalizes and quantizes its input in its prologue, so the sub-norm costs no
//! launch of its own; a matrix the fused GEMV cannot take gets the in-place norm and its int8
//! blocks first (`launch::sub_norm_quant`, as the prompt and batched paths always do).

use crate::device::ptr;
use crate::gemv::FusedInput;
use crate::launch;
use crate::model::{CudaModel, Input, State};
use crate::weights::DevMatrix;
use cudarc::driver::CudaSlice;
use trit::Result;

impl CudaModel {
    /// `y += m · (RMSNorm(x)·γ)` for the `n` values at `x` (left normalized in place where the
    /// separate norm runs).
    pub(crate) fn sub_normed_projection(
        &self,
        st: &State,
        m: &DevMatrix,
        x: u64,
        gamma: &CudaSlice<f32>,
        n: usize,
        y: u64,
    ) -> Result<()> {
        let s = &st.gpu.stream;
        let (gamma, eps) = (ptr(gamma, s), self.config.norm_eps);
        if let Some(args) = self.fused_args(st, m, true, false) {
            let input = FusedInput::Norm { x, gamma, eps };
            return self.fused_gemv(st, &args, input, y, true, false);
        }
        let (q, meta) = (ptr(&st.b.xq, s), ptr(&st.b.xm, s));
        launch::sub_norm_quant(&st.gpu, x, gamma, eps, n, (q, meta), 1, true)?;
        self.gemv(st, m, &Input { f32: x, q, meta }, y, true)
    }
}
