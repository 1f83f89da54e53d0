//! Rows of logits reduced on the GPU to what sampling needs (`kernels/topk.cu`): each row's
//! `k` best candidates and its log-normalizer, as [`TopLogits`], so the batched decode step
//! copies (2k + 2) words per sequence to the host instead of the vocabulary's logits.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use trit::sample::TopLogits;
use trit::{Error, Result};

/// Most candidates per row the kernel gives (its shared arrays; `TOPK_MAX` in topk.cu).
pub const MAX_CANDIDATES: usize = 256;

/// `TOPK_THREADS` in topk.cu (also the most candidates the merge kernel ranks).
const THREADS: u32 = 1024;

/// Most slices a row is split into (each slice one block of the first kernel).
const MAX_PARTS: usize = 8;

/// Words of one slice's record in the scratch buffer (`TOPK_PART_EXTRA` = 4 in topk.cu).
fn part_words(k: usize) -> usize {
    2 * k + 4
}

/// Slices per row: enough blocks for a batch of rows to fill the GPU, each slice long enough
/// to hold k entries (≥ 16,384 when there are several) and parts × k within one merge block.
fn parts_for(k: usize, vocab: usize) -> usize {
    (vocab / 16_384).clamp(1, MAX_PARTS.min(THREADS as usize / k))
}

/// 32-bit words per row of the kernel's output.
pub(crate) fn words_per_row(k: usize) -> usize {
    2 * k + 2
}

/// Whether the kernel can give `k` candidates of `vocab`-entry rows.
pub(crate) fn supported(k: usize, vocab: usize) -> bool {
    (1..=MAX_CANDIDATES).contains(&k) && k <= vocab
}

/// Enqueues the reduction of `rows` rows of `vocab` logits at device address `logits` into
/// `out` (`rows × words_per_row(k)` words), through `scratch` (`rows × MAX_PARTS ×
/// part_words(MAX_CANDIDATES)` words).
pub(crate) fn launch(
    gpu: &Gpu,
    logits: u64,
    rows: usize,
    vocab: usize,
    k: usize,
    scratch: u64,
    out: u64,
) -> Result<()> {
    if !supported(k, vocab) {
        return Err(Error::InvalidArgument(format!(
            "{k} candidates of a {vocab}-entry row (1 to {MAX_CANDIDATES}, at most the row)"
        )));
    }
    let parts = parts_for(k, vocab);
    gpu.launch(
        "row_top_partial",
        (rows as u32, parts as u32),
        THREADS,
        &[
            Arg::Ptr(logits),
            Arg::I32(vocab as i32),
            Arg::I32(k as i32),
            Arg::I32(parts as i32),
            Arg::Ptr(scratch),
        ],
    )?;
    gpu.launch(
        "row_top_merge",
        (rows as u32, 1),
        THREADS,
        &[
            Arg::Ptr(scratch),
            Arg::I32(k as i32),
            Arg::I32(parts as i32),
            Arg::Ptr(out),
        ],
    )
}

/// One row of the kernel's output; `None` where the row's normalizer is not finite (a NaN or
/// +inf logit, or nothing but −inf), which only the full row can answer.
pub(crate) fn unpack(words: &[u32], k: usize) -> Option<TopLogits> {
    let bits = words[2 * k] as u64 | (words[2 * k + 1] as u64) << 32;
    let log_z = f64::from_bits(bits);
    if !log_z.is_finite() {
        return None;
    }
    Some(TopLogits {
        logits: words[..k].iter().map(|&w| f32::from_bits(w)).collect(),
        ids: words[k..2 * k].to_vec(),
        log_z,
    })
}

/// Device and pinned host buffers of the kernel's output for up to `rows` rows.
pub(crate) struct TopBuffers {
    scratch: CudaSlice<u32>,
    pub(crate) dev: CudaSlice<u32>,
    pub(crate) host: PinnedHostSlice<u32>,
}

impl TopBuffers {
    pub(crate) fn new(gpu: &Gpu, rows: usize) -> Result<TopBuffers> {
        let n = rows * words_per_row(MAX_CANDIDATES);
        Ok(TopBuffers {
            scratch: gpu.zeros(rows * MAX_PARTS * part_words(MAX_CANDIDATES))?,
            dev: gpu.zeros(n)?,
            // Plain page-locked memory, read by the host (not write-combined).
            // SAFETY: read only after the copy into it and a stream synchronize.
            host: unsafe { gpu.ctx.alloc_pinned_with_flags::<u32>(n, 0) }
                .map_err(|e| cuda_err("allocating pinned memory", e))?,
        })
    }

    /// Enqueues the kernel over `rows` rows at `logits`, copies the result to the host and
    /// waits: each row's candidates, `None` for a row without a finite normalizer.
    pub(crate) fn run(
        &mut self,
        gpu: &Gpu,
        logits: u64,
        rows: usize,
        vocab: usize,
        k: usize,
    ) -> Result<Vec<Option<TopLogits>>> {
        let w = words_per_row(k);
        gpu.ctx.check_err().map_err(|e| {
            cuda_err(
                "an earlier operation (reported before the candidate kernel)",
                e,
            )
        })?;
        let s = &gpu.stream;
        launch(
            gpu,
            logits,
            rows,
            vocab,
            k,
            ptr(&self.scratch, s),
            ptr(&self.dev, s),
        )?;
        gpu.stream
            .memcpy_dtoh(&self.dev.slice(0..rows * w), &mut self.host)
            .map_err(|e| cuda_err("copying candidates to the host", e))?;
        gpu.sync()?;
        let words = self
            .host
            .as_slice()
            .map_err(|e| cuda_err("reading pinned candidates", e))?;
        Ok(words[..rows * w].chunks(w).map(|r| unpack(r, k)).collect())
    }
}

/// The kernel once over `logits` (rows of `vocab` entries), for the tests.
pub fn top_candidates_once(
    gpu: &Gpu,
    logits: &[f32],
    vocab: usize,
    k: usize,
) -> Result<Vec<Option<TopLogits>>> {
    if vocab == 0 || !logits.len().is_multiple_of(vocab) {
        return Err(Error::InvalidArgument(
            "logits are not whole rows of the vocabulary".into(),
        ));
    }
    let rows = logits.len() / vocab;
    let dev = gpu.upload(logits)?;
    let mut bufs = TopBuffers::new(gpu, rows)?;
    bufs.run(gpu, ptr(&dev, &gpu.stream), rows, vocab, k)
}
