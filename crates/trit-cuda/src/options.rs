//! How a GPU model is loaded and which kernels its decode step takes: `CudaOptions` (with the
//! `TRIT_CUDA_*` environment overrides) and `FusedSet`.

use trit::{Error, Result};

/// Most splits (blocks) per head: the kernel spreads the current length over at most this
/// many, so short contexts launch few busy blocks and long ones stay parallel.
const ATT_MAX_SPLITS: usize = 16;
/// Fewest positions per split: a context of up to this many is attended by one block per
/// head, which normalizes in place instead of merging partial results through memory (the
/// merge's fence, counter and reloads cost more than the positions at short lengths).
/// 8B tg128 (H200): 659 tok/s with 32, 650 with 128, 638 with 256.
const ATT_MIN_CHUNK: usize = 32;
/// Fewest positions per split of a hybrid's decode attention (`hybrid_attn_step`). H200, 27B
/// tg32 (`-d D`), 64 against 128: 300.0 / 295.5 tok/s at depth 256, 290.3 / 292.4 at 1,024,
/// 255.5 / 255.8 at 4,096; tg128 from an empty cache 303.6, 301.7 / 303.6, 302.6.
const HA_MIN_CHUNK: usize = 64;
/// Positions below which the decode step attends with one block per head inside the
/// attention + o kernel (`CudaOptions::attention_o_max`).
const ATT_O_MAX: usize = 128;

/// Options of `CudaModel::load`.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub device: usize,
    /// KV-cache positions allocated on the GPU (the longest context a session may use).
    pub ctx: usize,
    /// Replay the step from a CUDA graph (else launch kernel by kernel; for debugging).
    pub graph: bool,
    /// Rows each warp of the ternary GEMV computes (2, 4 or 8); `None`: the default (4).
    pub rows_per_warp: Option<usize>,
    /// Most warps that share one row group of the ternary GEMV (1, 2 or 4).
    pub max_split: usize,
    /// Run prompts of several tokens through the batched prefill (compute capability 8.0+).
    pub prefill: bool,
    /// Most prompt tokens one prefill pass carries through a layer (bounds its activation
    /// buffers; default 512).
    pub prefill_chunk: usize,
    /// The matrices the decode step runs through the fused GEMV (RMSNorm, quantization and
    /// SwiGLU inside the matrix product instead of kernels of their own) where they are
    /// ternary and fit; the others take the separate kernels.
    pub fused: FusedSet,
    /// Most flash-decoding splits per head (1 to 64).
    pub att_splits: usize,
    /// Fewest positions per flash-decoding split (a multiple of 32, at most 4096).
    pub att_min_chunk: usize,
    /// Prototype: o, gate‖up and down of each decode layer as one persistent kernel
    /// (`persist.rs`; `TRIT_CUDA_PERSIST=1`).
    pub persist_mlp: bool,
    /// The down projection through the streaming GEMV over the int8 SwiGLU output (all its
    /// first weights requested before the wait) instead of the register-pipelined kernel
    /// (`TRIT_CUDA_STREAM_DOWN=1`).
    pub stream_down: bool,
    /// Hybrids: the DeltaNet mixer's gates and state requests before its wait for the
    /// q‖k‖v‖z GEMV (`deltanet_step_early`, `TRIT_CUDA_DN_STEP=3`; off with `=0|1|2`). H200, 27B
    /// tg128: 241.6 / 241.6 tok/s against 233.2 / 232.0.
    pub deltanet_early: bool,
    /// With `deltanet_early`, for heads of up to 128 key dims: `deltanet_step_held`, which
    /// also loads its first state rows and the conv's earlier inputs before the wait (`=4`;
    /// `TRIT_CUDA_DN_STEP=3` keeps `deltanet_step_early`). H200, 27B tg128: 276.1 / 273.6
    /// tok/s against 268.3 / 270.4.
    pub deltanet_held: bool,
    /// With `deltanet_held`, on sm_90+ and for value heads a multiple of 128 wide:
    /// `deltanet_step_pair`, two blocks per value head in a thread block cluster, each
    /// updating half of the state rows in one pass (`TRIT_CUDA_DN_PAIR=0`: one block per head).
    /// H200, 27B tg128: 291.3 / 290.0 against 287.4 / 287.7 tok/s (session 31, one start).
    pub deltanet_pair: bool,
    /// Hybrid prompts: each chunk's DeltaNet recurrence in one kernel per layer
    /// (`deltanet_chunk`, the state in registers across the chunk's tokens) instead of one
    /// `deltanet_step` per token (`TRIT_CUDA_DN_CHUNK=0`).
    pub deltanet_chunk: bool,
    /// Hybrids with heads of 128 or 256 dims: the decode step's gated attention as one kernel
    /// (`hybrid_attn_step`: q/k norms, RoPE, cache append, attention, gate and the o
    /// projection's int8 input) instead of `hybrid_attn_prep`, `hybrid_attn_decode` and a
    /// quantize launch (`TRIT_CUDA_HA_STEP=0`).
    pub hybrid_attn_step: bool,
    /// Fewest positions per split of `hybrid_attn_step` (a multiple of 32; up to `att_splits`
    /// splits per head): contexts up to this long take one block per head
    /// (`TRIT_CUDA_HA_MIN_CHUNK=N`).
    pub hybrid_att_min_chunk: usize,
    /// With `hybrid_attn_step`, the batched step's rows through `hybrid_attn_step*_slots` too
    /// (one block per head and row) instead of the prep and decode kernels
    /// (`TRIT_CUDA_HA_SLOTS=0` for those). H200, 27B shape (4 layers), 8 sequences of 1,024
    /// prompt tokens, 32 steps: TG 9,000–9,234 tok/s against 8,545–8,639.
    pub hybrid_attn_slots: bool,
    /// Bonsai 2: a rotated input of a fused projection (q‖k‖v‖z, q‖gate/k/v, gate‖up, head) is
    /// normalized and rotated in the streaming GEMV's prologue instead of by a `hadamard_quant`
    /// launch before it (`TRIT_CUDA_ROT_FUSE=0`).
    pub rotation_in_prologue: bool,
    /// A dense decode step's attention and o projection as one kernel per layer at positions
    /// below `attention_o_max` (`attention_o.rs`: one block per head and slice of o's rows;
    /// `TRIT_CUDA_ATT_O=1`). Only where o is ternary, heads are 64 or 128 wide and the MLP
    /// takes the default kernels (fused gate‖up on the streaming kernel, register-GEMV down).
    /// Off by default: H200 tg128 from an empty cache 8B +3.5 %, 1.7B +18 %, but from 128
    /// cached positions on it is slower than the split attention (BENCHMARKS "GPU, session
    /// 13"), and chats soon pass that.
    pub attention_o: bool,
    /// Positions below which the decode step takes the attention + o kernel
    /// (`TRIT_CUDA_ATT_O_MAX=N`): one block per head attends the whole context, which longer
    /// contexts outgrow.
    pub attention_o_max: usize,
    /// Dense decode attention with heads of 64 or 128 on sm_90+: steps of up to 128 positions
    /// (4 blocks per head) merge a head's splits inside a thread block cluster through
    /// shared-memory mailboxes (`attn_decode_cl_*`; `TRIT_CUDA_ATT_CLUSTER=0` for the global
    /// merge). H200 8B tg128 +2.3 to +3.4 %, greedy +2.5 %; with 8 or 16 blocks per head the
    /// cluster launch was slower (−8 % at 225–256 positions), so longer steps keep the plain
    /// kernel.
    pub att_cluster: bool,
    /// Generation picks each token on the GPU (argmax, or the sampler's rule on the top-k
    /// candidates) and feeds it to the next step without the host (`greedy.rs`;
    /// `TRIT_CUDA_GREEDY=0` leaves every pick to the host). H200 tg128 greedy: 8B 907–913 tok/s
    /// against 887 for the host's loop, 1.7B 1,840–1,851 against 1,742–1,760; sampled 8B 864
    /// against 839–849.
    pub greedy_loop: bool,
    /// The host's decode steps (dense models) have the LM head store the logits straight into
    /// mapped page-locked host memory, so they cross the bus while the head runs instead of in
    /// a copy after it (~600 KB for a 152k vocabulary); steps whose logits stay on the GPU
    /// (device picks, top-k) keep the device buffer. `TRIT_CUDA_HEAD_HOST=1`; a measurement
    /// knob, off until measured.
    pub head_to_host: bool,
}

/// Which matrices of the decode step take the fused GEMV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedSet {
    /// RMSNorm + q‖k‖v.
    pub qkv: bool,
    /// The attention output's projection (its int8 input comes from the attention kernel).
    pub o: bool,
    /// RMSNorm + gate‖up + SwiGLU.
    pub gate_up: bool,
    /// Quantization of the SwiGLU output + down.
    pub down: bool,
    /// Final RMSNorm + LM head.
    pub head: bool,
}

impl FusedSet {
    /// Every matrix (`TRIT_CUDA_FUSED=1`).
    pub const ALL: FusedSet = FusedSet {
        qkv: true,
        o: true,
        gate_up: true,
        down: true,
        head: true,
    };
    /// The norms fused into q‖k‖v, gate‖up (with SwiGLU) and the LM head; o and down run the
    /// separate-kernel GEMV. H200, tg128 in one run: 8B 592.2 tok/s against 544.9 with every
    /// matrix fused and 593.5 with none; 1.7B 1,182.9 against 1,173.4 and 1,068.5. (Fusing
    /// down, whose block each re-quantizes the 12,288-wide SwiGLU output, cost the most.)
    pub const DEFAULT: FusedSet = FusedSet {
        qkv: true,
        o: false,
        gate_up: true,
        down: false,
        head: true,
    };
    /// The separate kernels everywhere (`TRIT_CUDA_FUSED=0`).
    pub const NONE: FusedSet = FusedSet {
        qkv: false,
        o: false,
        gate_up: false,
        down: false,
        head: false,
    };

    /// `1` (all), `0` (none) or a comma-separated list of `qkv`, `o`, `gate_up`, `down`, `head`.
    pub fn parse(v: &str) -> Result<FusedSet> {
        match v.trim() {
            "1" | "" => return Ok(FusedSet::ALL),
            "0" => return Ok(FusedSet::NONE),
            _ => {}
        }
        let mut set = FusedSet::NONE;
        for name in v.split(',').map(str::trim) {
            let slot = match name {
                "qkv" => &mut set.qkv,
                "o" => &mut set.o,
                "gate_up" => &mut set.gate_up,
                "down" => &mut set.down,
                "head" => &mut set.head,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "TRIT_CUDA_FUSED: unknown matrix {other:?} (1, 0 or a list of qkv, o, \
                         gate_up, down, head)"
                    )))
                }
            };
            *slot = true;
        }
        Ok(set)
    }
}

impl CudaOptions {
    /// Defaults, overridable by TRIT_CUDA_GRAPH=0, TRIT_CUDA_ROWS_PER_WARP=2|4|8,
    /// TRIT_CUDA_MAX_SPLIT=1|2|4, TRIT_CUDA_PDL=0, TRIT_CUDA_PREFILL=0,
    /// TRIT_CUDA_FUSED=0|1|list, TRIT_CUDA_ATT_SPLITS=N, TRIT_CUDA_ATT_MIN_CHUNK=N and
    /// TRIT_CUDA_DEVICE=N. An unreadable
    /// TRIT_CUDA_FUSED is reported by `CudaModel::load`.
    pub fn new(ctx: usize) -> Self {
        let env = |k: &str| std::env::var(k).ok();
        CudaOptions {
            device: env("TRIT_CUDA_DEVICE")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            ctx,
            graph: env("TRIT_CUDA_GRAPH").is_none_or(|v| v != "0"),
            rows_per_warp: env("TRIT_CUDA_ROWS_PER_WARP").and_then(|v| v.parse().ok()),
            max_split: env("TRIT_CUDA_MAX_SPLIT")
                .and_then(|v| v.parse().ok())
                .unwrap_or(4),
            prefill: env("TRIT_CUDA_PREFILL").is_none_or(|v| v != "0"),
            prefill_chunk: 512,
            fused: FusedSet::DEFAULT,
            att_splits: env("TRIT_CUDA_ATT_SPLITS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(ATT_MAX_SPLITS),
            att_min_chunk: env("TRIT_CUDA_ATT_MIN_CHUNK")
                .and_then(|v| v.parse().ok())
                .unwrap_or(ATT_MIN_CHUNK),
            persist_mlp: env("TRIT_CUDA_PERSIST").is_some_and(|v| v == "1"),
            stream_down: env("TRIT_CUDA_STREAM_DOWN").is_some_and(|v| v == "1"),
            deltanet_early: env("TRIT_CUDA_DN_STEP").is_none_or(|v| v == "3" || v == "4"),
            deltanet_held: env("TRIT_CUDA_DN_STEP").is_none_or(|v| v == "4"),
            deltanet_pair: env("TRIT_CUDA_DN_PAIR").is_none_or(|v| v != "0"),
            deltanet_chunk: env("TRIT_CUDA_DN_CHUNK").is_none_or(|v| v != "0"),
            hybrid_attn_step: env("TRIT_CUDA_HA_STEP").is_none_or(|v| v != "0"),
            hybrid_attn_slots: env("TRIT_CUDA_HA_SLOTS").is_none_or(|v| v != "0"),
            hybrid_att_min_chunk: env("TRIT_CUDA_HA_MIN_CHUNK")
                .and_then(|v| v.parse().ok())
                .unwrap_or(HA_MIN_CHUNK),
            rotation_in_prologue: env("TRIT_CUDA_ROT_FUSE").is_none_or(|v| v != "0"),
            attention_o: env("TRIT_CUDA_ATT_O").is_some_and(|v| v == "1"),
            attention_o_max: env("TRIT_CUDA_ATT_O_MAX")
                .and_then(|v| v.parse().ok())
                .unwrap_or(ATT_O_MAX),
            greedy_loop: env("TRIT_CUDA_GREEDY").is_none_or(|v| v != "0"),
            att_cluster: env("TRIT_CUDA_ATT_CLUSTER").is_none_or(|v| v != "0"),
            head_to_host: env("TRIT_CUDA_HEAD_HOST").is_some_and(|v| v == "1"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FusedSet;

    #[test]
    fn fused_set_parses_all_none_and_lists_and_rejects_unknown_names() {
        assert_eq!(FusedSet::parse("1").unwrap(), FusedSet::ALL);
        assert_eq!(FusedSet::parse("0").unwrap(), FusedSet::NONE);
        let some = FusedSet::parse("qkv, gate_up,head").unwrap();
        assert!(some.qkv && some.gate_up && some.head && !some.o && !some.down);
        let err = FusedSet::parse("qkv,ffn").unwrap_err().to_string();
        assert!(err.contains("ffn"), "{err}");
    }
}
