//! q‖k‖v and the decode attention in one kernel at short contexts (`qkv_attend_*` in
//! kernels/qkv_attention.cu; `CudaOptions::qkv_attention`): the grid's blocks each compute the
//! q‖k‖v rows of one kv head with the streaming GEMV, and a kv head's first blocks then attend
//! its q heads over the cache they copied into shared memory while the previous kernel ran. The
//! step loses the attention's launch — the link between q‖k‖v and o — below
//! [`QKV_ATT_MAX_POS`] positions; from there the separate attention kernel splits the context.

use crate::device::{ptr, Arg};
use crate::gemv::{fused_fits, stream_stages, TernaryArgs};
use crate::model::{CudaModel, State};
use crate::weights::DevBlock;
use cudarc::driver::CudaSlice;
use trit::format::config::{ModelConfig, RopeStyle};
use trit::Result;

/// Positions the kernel attends at most (`QA_MAX_POS`): its owners hold that many cached rows
/// in shared memory.
pub(crate) const QKV_ATT_MAX_POS: usize = 128;
/// Most q heads one owner block attends (`QA_MAX_HEADS`).
const MAX_HEADS_PER_OWNER: usize = 8;
/// Fewest and most warps per block (the attention's vectors, scores and values spread over
/// them; one block per multiprocessor).
const MIN_WARPS: usize = 4;
const MAX_WARPS: usize = 16;

/// One launch of the kernel for a model's q‖k‖v.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QkvAttPlan {
    pub warps: usize,
    pub blocks_per_head: usize,
    pub heads_per_owner: usize,
    /// The streaming GEMV's ring slots per warp: no warp has more items than that.
    pub ring_slots: usize,
    pub smem: usize,
}

/// Bytes of the attention's shared memory past the GEMV's ring (`qa_smem` in the kernel).
/// `staged`: the cached rows are copied there (else only the current position's row).
fn attention_smem_bytes(hd: usize, hpo: usize, staged: bool) -> usize {
    let rows = if staged { QKV_ATT_MAX_POS } else { 1 };
    let row = 2 * hd + 16;
    let kv_rows = (rows * row).max(4096) + rows * row;
    let scores = (hpo * QKV_ATT_MAX_POS).max((hpo + 1) * hd);
    kv_rows + 4 * (hpo * hd + scores + hd + 2 * hd + MAX_HEADS_PER_OWNER)
}

/// The attention's head counts and width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
}

impl Heads {
    pub(crate) fn of(c: &ModelConfig) -> Heads {
        Heads {
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            hd: c.head_dim,
        }
    }
}

/// The launch shape for the q‖k‖v `m` of heads `c` (`cols / 64` blocks per row) on `sms` multiprocessors
/// with `max_smem` bytes of dynamic shared memory, each owner attending `hpo` q heads (0: all
/// of its kv head's); `None` where the kernel cannot take the model (heads wider than 128 or
/// not a multiple of 64, rows not q‖k‖v, too few multiprocessors for a block per kv head and
/// owner, or shared memory).
pub(crate) fn plan(
    c: Heads,
    m: &TernaryArgs,
    sms: usize,
    max_smem: usize,
    (hpo, staged): (usize, bool),
) -> Option<QkvAttPlan> {
    let hd = c.hd;
    if hd == 0 || !hd.is_multiple_of(64) || hd > 128 || c.n_kv == 0 {
        return None;
    }
    if !c.n_heads.is_multiple_of(c.n_kv)
        || m.rows != (c.n_heads + 2 * c.n_kv) * hd
        || !fused_fits(m, false)
        || !m.codes.is_multiple_of(16)
        || !m.scales.is_multiple_of(4)
    {
        return None;
    }
    let gq = c.n_heads / c.n_kv;
    let hpo = if hpo == 0 {
        gq.min(MAX_HEADS_PER_OWNER)
    } else {
        hpo
    };
    if hpo > MAX_HEADS_PER_OWNER || !gq.is_multiple_of(hpo) {
        return None;
    }
    let owners = gq / hpo;
    // Row groups (4 rows) per kv head, spread over at most sms / n_kv blocks.
    let groups = (gq + 2) * hd / 4;
    let most_blocks = sms / c.n_kv;
    if most_blocks < owners.max(1) {
        return None;
    }
    let warps = groups.div_ceil(most_blocks).clamp(MIN_WARPS, MAX_WARPS);
    let blocks_per_head = groups.div_ceil(warps).clamp(owners, most_blocks);
    // Ring slots: a warp's items (one group's lane-steps per group it takes), at most the
    // stages; the ring then takes only what its warps use.
    let nb = m.cols / 64;
    let items = groups.div_ceil(blocks_per_head * warps) * nb.div_ceil(32);
    let ring_slots = items.clamp(1, stream_stages());
    let ring = warps * ring_slots * (4 * 32 * 16 + 4 * 32 * 4);
    let smem = nb * 64 + nb.div_ceil(2) * 16 + ring + attention_smem_bytes(hd, hpo, staged);
    (smem <= max_smem).then_some(QkvAttPlan {
        warps,
        blocks_per_head,
        heads_per_owner: hpo,
        ring_slots,
        smem,
    })
}

impl CudaModel {
    /// Layer `li`'s q‖k‖v and attention by `qkv_attend` (its outputs where the attention
    /// kernel leaves them: f32 in `att`, int8 blocks in xq / xm). False (nothing launched)
    /// where the kernel cannot take the layer: the caller runs the separate kernels.
    pub(crate) fn qkv_attention_layer(
        &self,
        st: &State,
        blk: &DevBlock,
        li: usize,
        kv: &[(u64, u64)],
    ) -> Result<bool> {
        let c = &self.config;
        let (g, b, s) = (&st.gpu, &st.b, &st.gpu.stream);
        let Some(m) = blk.qkv.ternary_args(s) else {
            return Ok(false);
        };
        let Some(hpo) = self.qkv_attention else {
            return Ok(false);
        };
        if self.rows_per_warp.is_some_and(|r| r != 4) {
            return Ok(false);
        }
        let Some(plan) = plan(
            Heads::of(c),
            &m,
            g.sm_count as usize,
            g.max_dyn_smem,
            (hpo, self.qkv_attention_stage == 1),
        ) else {
            return Ok(false);
        };
        let p = |x: &CudaSlice<f32>| ptr(x, s);
        let opt = |v: &Option<CudaSlice<f32>>| v.as_ref().map_or(0, p);
        let kernel = if m.f16 {
            "qkv_attend_f16"
        } else {
            "qkv_attend_f32"
        };
        let hd = c.head_dim;
        // This kernel's counters follow the attention kernel's n_heads (Buffers::counters).
        let counters = ptr(&b.counters, s) + 4 * c.n_heads as u64;
        let args = [
            Arg::Ptr(m.codes),
            Arg::Ptr(m.scales),
            Arg::I32((m.cols / 64) as i32),
            Arg::Ptr(p(&b.x)),
            Arg::Ptr(p(&blk.attn_norm)),
            Arg::F32(c.norm_eps),
            Arg::Ptr(p(&b.qkv)),
            Arg::Ptr(opt(&blk.q_norm)),
            Arg::Ptr(opt(&blk.k_norm)),
            Arg::Ptr(p(&b.cos_sin)),
            Arg::Ptr(ptr(&b.step, s)),
            Arg::I32(c.n_heads as i32),
            Arg::I32(c.n_kv_heads as i32),
            Arg::I32(hd as i32),
            Arg::I32((c.rope_style == RopeStyle::Adjacent) as i32),
            Arg::Ptr(kv[li].0),
            Arg::Ptr(kv[li].1),
            Arg::I32(self.ctx as i32),
            Arg::F32(1.0 / (hd as f32).sqrt()),
            Arg::Ptr(counters),
            Arg::Ptr(p(&b.att)),
            Arg::Ptr(ptr(&b.xq, s)),
            Arg::Ptr(p(&b.xm)),
            Arg::I32(plan.blocks_per_head as i32),
            Arg::I32(plan.heads_per_owner as i32),
            Arg::I32(self.qkv_attention_stage as i32),
            Arg::I32(plan.ring_slots as i32),
        ];
        let grid = (plan.blocks_per_head * c.n_kv_heads) as u32;
        g.launch_smem(
            kernel,
            (grid, 1),
            32 * plan.warps as u32,
            plan.smem as u32,
            &args,
        )?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n_heads: usize, n_kv: usize, hd: usize) -> Heads {
        Heads { n_heads, n_kv, hd }
    }

    fn qkv(c: &Heads) -> TernaryArgs {
        TernaryArgs {
            rows: (c.n_heads + 2 * c.n_kv) * c.hd,
            cols: c.n_heads * c.hd,
            codes: 0,
            scales: 0,
            f16: true,
        }
    }

    const SMEM: usize = 227 * 1024 - 4096;

    #[test]
    fn the_8b_and_1_7b_shapes_take_a_block_per_multiprocessor_group_of_their_kv_head() {
        // 8B: 8 kv heads of 4 q heads, 192 groups per kv head: 16 blocks of 12 warps.
        let c = config(32, 8, 128);
        let p = plan(c, &qkv(&c), 132, SMEM, (0, true)).unwrap();
        assert_eq!((p.warps, p.blocks_per_head, p.heads_per_owner), (12, 16, 4));
        // One group of 2 lane-steps per warp: 2 ring slots.
        assert_eq!(p.ring_slots, 2);
        assert!(p.smem <= SMEM);
        // 1.7B: 2 q heads per kv head, 128 groups: 16 blocks of 8 warps.
        let c = config(16, 8, 128);
        let p = plan(c, &qkv(&c), 132, SMEM, (1, true)).unwrap();
        assert_eq!((p.warps, p.blocks_per_head, p.heads_per_owner), (8, 16, 1));
        assert_eq!(p.ring_slots, 1);
        // Small models: at least 4 warps, and every owner has a block.
        let c = config(4, 2, 64);
        let p = plan(c, &qkv(&c), 132, SMEM, (1, true)).unwrap();
        assert_eq!(p.warps, 4);
        assert!(p.blocks_per_head >= 2 && p.blocks_per_head * 2 <= 132);
    }

    #[test]
    fn shapes_the_kernel_cannot_take_are_refused() {
        let c = config(32, 8, 128);
        let m = qkv(&c);
        // Owners of 3 heads do not divide 4; 16 heads per owner are more than it holds.
        assert!(plan(c, &m, 132, SMEM, (3, true)).is_none());
        assert!(plan(c, &m, 132, SMEM, (16, true)).is_none());
        // Too few multiprocessors for a block per kv head; too little shared memory.
        assert!(plan(c, &m, 4, SMEM, (0, true)).is_none());
        assert!(plan(c, &m, 132, 64 * 1024, (0, true)).is_none());
        // Heads of 256 or 96 values; a matrix that is not q‖k‖v.
        let wide = config(8, 2, 256);
        assert!(plan(wide, &qkv(&wide), 132, SMEM, (0, true)).is_none());
        let odd = config(8, 2, 96);
        assert!(plan(odd, &qkv(&odd), 132, SMEM, (0, true)).is_none());
        let mut other = m;
        other.rows += 4;
        assert!(plan(c, &other, 132, SMEM, (0, true)).is_none());
    }
}
