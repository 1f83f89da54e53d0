//! A dense decode layer's attention and o projection as one kernel (`attn_o_decode_*` in
//! kernels/attention_o.cu; `CudaOptions::attention_o`) at short contexts: one block per head
//! and slice of o's rows attends over the whole context and adds its head's share of W_o·att
//! into a pending fixed-point sum per row, so the step loses a latency link per layer. The
//! fused gate‖up then normalizes x + pending (`FusedInput::NormPend`), and the down GEMV adds
//! the pending sum into x and clears it (`launch_ternary_pend`): x itself is written once per
//! layer, in a fixed order, so steps stay bit-reproducible.

use crate::device::{ptr, Arg, Gpu};
use crate::gemv::{launch_ternary_pend, stream_runs, FusedInput, TernaryArgs};
use crate::launch;
use crate::model::{CudaModel, State, DEFAULT_ROWS_PER_WARP};
use crate::weights::DevBlock;
use cudarc::driver::CudaSlice;
use trit::format::config::RopeStyle;
use trit::Result;

/// Rows of o one block takes at most (`AO_ROWS` × the block's 256 threads).
const MAX_ROWS_PER_BLOCK: usize = 4 * 256;

/// The kernel's inputs besides o (device addresses, as the attention kernel takes them).
pub(crate) struct AttnO {
    pub qkv: u64,
    pub q_norm: u64,
    pub k_norm: u64,
    pub eps: f32,
    pub cos_sin: u64,
    pub step: u64,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub adjacent: bool,
    pub k_cache: u64,
    pub v_cache: u64,
    pub ctx: usize,
    pub scale: f32,
    /// The pending sums the products are added into (`u64` per residual row).
    pub pend: u64,
}

/// The kernel for heads of `head_dim` and o's scale type, where one exists.
fn kernel(head_dim: usize, f16: bool) -> Option<&'static str> {
    Some(match (head_dim, f16) {
        (64, true) => "attn_o_decode_e2_f16",
        (64, false) => "attn_o_decode_e2_f32",
        (128, true) => "attn_o_decode_e4_f16",
        (128, false) => "attn_o_decode_e4_f32",
        _ => return None,
    })
}

/// Slices of o's rows per head: enough blocks to cover the multiprocessors, and at most
/// `MAX_ROWS_PER_BLOCK` rows each.
fn splits(rows: usize, n_heads: usize, sm_count: usize) -> usize {
    rows.div_ceil(MAX_ROWS_PER_BLOCK)
        .max(sm_count / n_heads.max(1))
        .clamp(1, rows.max(1))
}

/// Whether the kernel runs this layer: heads 64 or 128 wide, o ternary over exactly the heads'
/// outputs.
fn fits(a: &AttnO, o: &TernaryArgs) -> bool {
    kernel(a.head_dim, o.f16).is_some() && o.cols == a.n_heads * a.head_dim
}

/// Launches the kernel (the caller checked `fits`).
fn launch_kernel(gpu: &Gpu, a: &AttnO, o: &TernaryArgs) -> Result<()> {
    let name = kernel(a.head_dim, o.f16).expect("checked by fits");
    let n_splits = splits(o.rows, a.n_heads, gpu.sm_count as usize);
    let per = o.rows.div_ceil(n_splits);
    gpu.launch(
        name,
        (a.n_heads as u32, n_splits as u32),
        256,
        &[
            Arg::Ptr(a.qkv),
            Arg::Ptr(a.q_norm),
            Arg::Ptr(a.k_norm),
            Arg::F32(a.eps),
            Arg::Ptr(a.cos_sin),
            Arg::Ptr(a.step),
            Arg::I32(a.n_heads as i32),
            Arg::I32(a.n_kv as i32),
            Arg::I32(a.adjacent as i32),
            Arg::Ptr(a.k_cache),
            Arg::Ptr(a.v_cache),
            Arg::I32(a.ctx as i32),
            Arg::F32(a.scale),
            Arg::Ptr(o.codes),
            Arg::Ptr(o.scales),
            Arg::I32(o.rows as i32),
            Arg::I32((o.cols / 64) as i32),
            Arg::I32(per as i32),
            Arg::Ptr(a.pend),
        ],
    )
}

impl CudaModel {
    /// Layer `li` after its q‖k‖v, where it fits the attention + o kernel: that kernel, the
    /// fused gate‖up + SwiGLU over x + pending, the quantization of h, and down adding
    /// pending and its products into x. False (nothing launched) where the layer does not fit
    /// (o or down not ternary, heads of another width, gate‖up not fused or not on the
    /// streaming kernel, down fused or streamed): the caller takes the separate kernels.
    pub(crate) fn attention_o_layer(
        &self,
        st: &State,
        blk: &DevBlock,
        li: usize,
        kv: &[(u64, u64)],
    ) -> Result<bool> {
        let c = &self.config;
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let plain_down = !self.stream_down
            && !self.persist_mlp
            && c.ffn.is_multiple_of(64)
            && self
                .fused_args(st, &blk.down, self.fused.down, false)
                .is_none();
        let (Some(o), Some(gate_up), Some(down), true) = (
            blk.o.ternary_args(s),
            self.fused_args(st, &blk.gate_up, self.fused.gate_up, true),
            blk.down.ternary_args(s),
            plain_down,
        ) else {
            return Ok(false);
        };
        let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, p);
        let hd = c.head_dim;
        let pend = ptr(&b.pend, s);
        let a = AttnO {
            qkv: p(&b.qkv),
            q_norm: opt(&blk.q_norm),
            k_norm: opt(&blk.k_norm),
            eps: c.norm_eps,
            cos_sin: p(&b.cos_sin),
            step: ptr(&b.step, s),
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: hd,
            adjacent: c.rope_style == RopeStyle::Adjacent,
            k_cache: kv[li].0,
            v_cache: kv[li].1,
            ctx: self.ctx,
            scale: 1.0 / (hd as f32).sqrt(),
            pend,
        };
        let r = self.rows_per_warp.unwrap_or(DEFAULT_ROWS_PER_WARP);
        // The pending-sum streaming kernels exist for 4 rows per warp (gemv_stream.cu).
        if r != 4 || !fits(&a, &o) || !stream_runs(g, &gate_up, r, true) {
            return Ok(false);
        }
        launch_kernel(g, &a, &o)?;
        let input = FusedInput::NormPend {
            x: p(&b.x),
            gamma: p(&blk.ffn_norm),
            eps: c.norm_eps,
            pend,
        };
        self.fused_gemv(st, &gate_up, input, p(&b.h), false, true)?;
        let (xq, xm) = (ptr(&b.xq, s), p(&b.xm));
        launch::quantize_vec(g, p(&b.h), c.ffn, xq, xm)?;
        launch_ternary_pend(g, &down, xq, xm, p(&b.x), true, pend, r, self.max_split)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_slices_cover_the_multiprocessors_within_the_block_limit() {
        // 8B: 32 heads × 4 slices of 1,024 rows; 1.7B: 16 × 8 of 256; 135M: 9 × 14 of 42.
        assert_eq!(splits(4096, 32, 132), 4);
        assert_eq!(splits(2048, 16, 132), 8);
        assert_eq!(splits(576, 9, 132), 14);
        // A wide o with few heads: the row limit decides.
        assert_eq!(splits(16384, 64, 132), 16);
        for (rows, heads) in [(4096, 32), (2048, 16), (576, 9), (16384, 64), (5, 2)] {
            let n = splits(rows, heads, 132);
            assert!(
                rows.div_ceil(n) <= MAX_ROWS_PER_BLOCK,
                "{rows} rows, {n} slices"
            );
        }
    }
}
