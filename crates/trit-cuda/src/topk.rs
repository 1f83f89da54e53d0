//! Rows of logits reduced on the GPU to what sampling needs (`kernels/topk.cu`): each row's
//! `k` best candidates and its log-normalizer, as [`TopLogits`], so the batched decode step
//! copies (2k + 2) words per sequence to the host instead of the vocabulary's logits.

use crate::device::{cuda_err, ptr, Arg, Gpu};
use crate::model::{check_forward, poisoned, Head, State};
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use trit::model::{ExternalNet, KvCache, Logits};
use trit::sample::{RowLogits, TopLogits};
use trit::{Error, Result};

/// Most candidates per row the kernel gives (its shared arrays; `TOPK_MAX` in topk.cu).
pub const MAX_CANDIDATES: usize = 256;

/// `TOPK_THREADS` in topk.cu.
const THREADS: u32 = 1024;

/// 32-bit words per row of the kernel's output.
pub(crate) fn words_per_row(k: usize) -> usize {
    2 * k + 2
}

/// Whether the kernel can give `k` candidates of `vocab`-entry rows.
pub(crate) fn supported(k: usize, vocab: usize) -> bool {
    (1..=MAX_CANDIDATES).contains(&k) && k <= vocab
}

/// Most slices a row is split into (row_top_parts' grid; at most `THREADS`, one per thread in
/// row_top_merge).
const MAX_PARTS: usize = 128;

/// Blocks of row_top_parts worth filling the GPU with (two per multiprocessor of an H100/H200).
const TARGET_BLOCKS: usize = 264;

/// How many slices each of `rows` rows of `vocab` entries is split into: enough blocks to fill
/// the GPU, each slice at least `k` entries (so it holds k candidates).
fn parts_for(rows: usize, vocab: usize, k: usize) -> usize {
    TARGET_BLOCKS
        .div_ceil(rows.max(1))
        .min(MAX_PARTS)
        .min(vocab / k.max(1))
        .max(1)
}

/// 32-bit words of row_top_parts' output for one slice (`part_words` in topk.cu).
fn part_words(k: usize) -> usize {
    2 * k + 4
}

/// Words of the slice scratch any `rows` ≤ `max_rows` and `k` ≤ `MAX_CANDIDATES` need.
fn scratch_words(max_rows: usize) -> usize {
    (1..=max_rows.max(1))
        .map(|r| r * parts_for(r, usize::MAX, 1))
        .max()
        .unwrap_or(1)
        * part_words(MAX_CANDIDATES)
}

/// Enqueues the reduction of `rows` rows of `vocab` logits at device address `logits` into
/// `out` (`rows × words_per_row(k)` words), through `scratch` (`scratch_words` of the rows).
fn launch(
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
    let parts = parts_for(rows, vocab, k);
    gpu.launch(
        "row_top_parts",
        (parts as u32, rows as u32),
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
    pub(crate) dev: CudaSlice<u32>,
    /// The slices' candidates (row_top_parts → row_top_merge).
    scratch: CudaSlice<u32>,
    max_rows: usize,
    pub(crate) host: PinnedHostSlice<u32>,
}

impl TopBuffers {
    pub(crate) fn new(gpu: &Gpu, rows: usize) -> Result<TopBuffers> {
        let n = rows * words_per_row(MAX_CANDIDATES);
        Ok(TopBuffers {
            dev: gpu.zeros(n)?,
            scratch: gpu.zeros(scratch_words(rows))?,
            max_rows: rows,
            // Plain page-locked memory, read by the host (not write-combined).
            // SAFETY: read only after the copy into it and a stream synchronize.
            host: unsafe { gpu.ctx.alloc_pinned_with_flags::<u32>(n, 0) }
                .map_err(|e| cuda_err("allocating pinned memory", e))?,
        })
    }

    /// Enqueues the kernel over one row of `vocab` logits at `logits`, its `k` candidates left
    /// on the device (the greedy loop's sampler reads them); returns their address.
    pub(crate) fn enqueue_one(
        &self,
        gpu: &Gpu,
        logits: u64,
        vocab: usize,
        k: usize,
    ) -> Result<u64> {
        let s = &gpu.stream;
        let out = ptr(&self.dev, s);
        launch(gpu, logits, 1, vocab, k, ptr(&self.scratch, s), out)?;
        Ok(out)
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
        let n = rows * w;
        if n > self.host.len() || rows > self.max_rows {
            return Err(Error::InvalidArgument(format!(
                "candidates of {rows} rows for buffers of {} words",
                self.host.len()
            )));
        }
        // Errors cudarc kept from calls that return none, named as such.
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
        // Into the first `n` words: cudarc copies as many bytes as the destination holds.
        let dst = &mut self
            .host
            .as_mut_slice()
            .map_err(|e| cuda_err("waiting for pinned candidates", e))?[..n];
        gpu.stream
            .memcpy_dtoh(&self.dev.slice(0..n), dst)
            .map_err(|e| cuda_err("copying candidates to the host", e))?;
        gpu.sync()?;
        let words = self
            .host
            .as_slice()
            .map_err(|e| cuda_err("reading pinned candidates", e))?;
        Ok(words[..n].chunks(w).map(|r| unpack(r, k)).collect())
    }
}

/// The candidates of the one row of `vocab` logits at `logits` (the buffers made on first
/// use): what a single-sequence model's sampled step returns; `None` where only the full row
/// can answer. Waits for the result.
pub(crate) fn one_row(
    bufs: &mut Option<TopBuffers>,
    gpu: &Gpu,
    logits: u64,
    vocab: usize,
    k: usize,
) -> Result<Option<TopLogits>> {
    if bufs.is_none() {
        *bufs = Some(TopBuffers::new(gpu, 1)?);
    }
    let top = bufs.as_mut().expect("made above");
    Ok(top.run(gpu, logits, 1, vocab, k)?.pop().flatten())
}

impl crate::model::CudaModel {
    /// `ExternalNet::forward_top` on the single-sequence path: one decode step (the captured
    /// graph), then the candidate kernel over its logits, so a sampled step copies
    /// `2k + 2` words instead of the vocabulary and the host samples from `k` values. A prompt,
    /// a `k` the kernel cannot give or a row without a finite normalizer come back in full.
    pub(crate) fn forward_top_gpu(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        k: usize,
    ) -> Result<RowLogits> {
        let vocab = self.config.vocab;
        if tokens.len() != 1 || !supported(k, vocab) {
            return Ok(RowLogits::Full(ExternalNet::forward(
                self,
                tokens,
                cache,
                Logits::Last,
            )?));
        }
        check_forward(tokens, cache, vocab, self.ctx)?;
        let mut guard = self.state.lock().map_err(|_| poisoned())?;
        let st: &mut State = &mut guard;
        let pos0 = cache.len();
        self.upload_inputs(st, tokens, pos0)?;
        self.run_step(st, Head::Device, pos0)?;
        let logits = ptr(&st.b.logits, &st.gpu.stream);
        let row = match one_row(&mut st.top, &st.gpu, logits, vocab, k)? {
            Some(t) => RowLogits::Top(t),
            None => RowLogits::Full(self.read_logits(st)?),
        };
        st.device_pos = Some(pos0 + 1);
        cache.advance(1);
        Ok(row)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_hold_k_entries_fill_the_gpu_and_fit_the_scratch() {
        for rows in [1, 2, 7, 32, 64, 130, 300] {
            let room = scratch_words(rows);
            for (vocab, k) in [
                (151_936, 64),
                (151_936, 256),
                (248_320, 1),
                (1_000, 255),
                (70, 70),
            ] {
                let parts = parts_for(rows, vocab, k);
                assert!((1..=MAX_PARTS).contains(&parts), "{rows} {vocab} {k}");
                // Slice p is [p·vocab/parts, (p+1)·vocab/parts): the smallest has ⌊vocab/parts⌋.
                assert!(vocab / parts >= k, "{rows} rows, {vocab}/{parts} < {k}");
                if vocab / k >= MAX_PARTS {
                    assert!(
                        rows * parts >= TARGET_BLOCKS.min(rows * MAX_PARTS),
                        "{rows} {parts}"
                    );
                }
                assert!(rows * parts * part_words(k) <= room, "{rows} {vocab} {k}");
            }
        }
        assert_eq!(parts_for(1, 151_936, 64), MAX_PARTS);
        assert_eq!(parts_for(1, 70, 70), 1);
    }
}
