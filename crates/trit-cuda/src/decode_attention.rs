//! The decode attention's launch (attention.cu's `attn_decode*`): which kernel a head width
//! takes, and how many blocks per head a step launches (the hybrid's `hybrid_attn_step` too).

/// Flash-decoding splits are multiples of this many positions (`DEC_CHUNK` in attention.cu).
pub(crate) const ATT_CHUNK: usize = 32;

/// Splits per thread block cluster of `attn_decode_cl_*` (`ATT_CL` in attention.cu).
pub(crate) const ATT_CLUSTER: usize = 4;

/// The decode attention kernel for `hd`-wide heads (a multiple of 32 up to 256, checked at
/// load; `hd / 32` values per lane); `cluster`: the cluster-merge form, which exists for heads
/// of 64 and 128 (the caller checks sm_90+ and a grid of whole clusters).
pub(crate) fn kernel(hd: usize, cluster: bool) -> &'static str {
    const NAMES: [&str; 8] = [
        "attn_decode_e1",
        "attn_decode_e2",
        "attn_decode_e3",
        "attn_decode_e4",
        "attn_decode_e5",
        "attn_decode_e6",
        "attn_decode_e7",
        "attn_decode",
    ];
    match hd {
        64 if cluster => "attn_decode_cl_e2",
        128 if cluster => "attn_decode_cl_e4",
        _ => NAMES[(hd / 32).clamp(1, 8) - 1],
    }
}

/// Blocks per head for steps whose context reaches at most `len` positions: the fewest of 4,
/// 8, 16, … (up to `max`, the buffers' splits) that give each split of `min_chunk` positions a
/// block. The kernel sizes its splits from the grid (`splits_used`), so they are the ones `max`
/// blocks would make, without the blocks that would exit at once (H200 8B tg128: 868 tok/s
/// with 4 against ~856 with 16).
pub(crate) fn grid(len: usize, min_chunk: usize, max: usize) -> usize {
    let wanted = len.div_ceil(min_chunk).next_power_of_two();
    wanted.max(ATT_CLUSTER).min(max)
}

/// The splits attention.cu's decode kernel makes of `len` positions on `grid` blocks per head
/// (its `chunk` / `used`), as (positions per split, splits used).
#[cfg(test)]
fn splits_used(len: usize, grid: usize, min_chunk: usize) -> (usize, usize) {
    let chunk = min_chunk.max(len.div_ceil(grid).div_ceil(ATT_CHUNK) * ATT_CHUNK);
    (chunk, len.div_ceil(chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smaller_grid_makes_the_splits_of_the_full_one() {
        for (min_chunk, max) in [(32, 16), (64, 16), (32, 64), (32, 6), (128, 3)] {
            for len in 1..=4096 {
                let g = grid(len, min_chunk, max);
                assert!(
                    g <= max && (g >= ATT_CLUSTER.min(max)),
                    "len {len}: grid {g}"
                );
                assert_eq!(
                    splits_used(len, g, min_chunk),
                    splits_used(len, max, min_chunk),
                    "len {len}, min_chunk {min_chunk}, max {max}: grid {g}"
                );
                // Half of it would leave some split of min_chunk positions without a block.
                if g > ATT_CLUSTER && g < max {
                    assert!(
                        g / 2 * min_chunk < len,
                        "len {len}: grid {g} is not the fewest"
                    );
                }
            }
        }
        assert_eq!(grid(128, 32, 16), 4);
        assert_eq!(grid(129, 32, 16), 8);
        assert_eq!(grid(100_000, 32, 16), 16);
    }

    /// The names here repeat device.rs's list (NVRTC compiles that list): each one the host may
    /// launch must be in it.
    #[test]
    fn every_kernel_named_is_compiled() {
        for hd in (32..=256).step_by(32) {
            for cluster in [false, true] {
                let k = kernel(hd, cluster);
                assert!(crate::device::KERNELS.contains(&k), "{k} is not in KERNELS");
            }
        }
    }

    #[test]
    fn kernel_names_follow_the_head_width() {
        assert_eq!(kernel(128, false), "attn_decode_e4");
        assert_eq!(kernel(128, true), "attn_decode_cl_e4");
        assert_eq!(kernel(64, true), "attn_decode_cl_e2");
        assert_eq!(kernel(256, false), "attn_decode");
        assert_eq!(kernel(96, true), "attn_decode_e3");
    }
}
