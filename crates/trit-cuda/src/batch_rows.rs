//! What the dense (`batch.rs`) and hybrid (`hybrid/batch.rs`) batched paths share around
//! their steps: checking a call's sequences, giving each its slot, and bringing the decode
//! rows' logits back — as candidates where a row asks for them, else in full.

use crate::device::Gpu;
use crate::graph::copy_to_pinned;
use crate::topk::{self, TopBuffers};
use cudarc::driver::{CudaSlice, PinnedHostSlice};
use rayon::prelude::*;
use trit::model::device_slot::SlotPool;
use trit::model::{BatchSeq, KvCache};
use trit::sample::RowLogits;
use trit::{Error, Result};

/// One sequence of a batched decode step.
pub(crate) struct Row {
    pub slot: usize,
    pub pos: usize,
    pub token: u32,
    /// Whether its best candidates will do instead of its logits.
    pub want_top: bool,
}

/// The checks of a batched call: one candidate flag per sequence (or none), valid tokens, and
/// contexts the model was loaded for.
pub(crate) fn check_seqs(
    seqs: &[BatchSeq<'_>],
    want_top: &[bool],
    vocab: usize,
    ctx: usize,
) -> Result<()> {
    if !want_top.is_empty() && want_top.len() != seqs.len() {
        return Err(Error::InvalidArgument(format!(
            "{} candidate flags for {} sequences",
            want_top.len(),
            seqs.len()
        )));
    }
    for s in seqs {
        trit::model::check_input(s.tokens, s.cache, vocab)?;
        if s.cache.capacity() > ctx {
            return Err(Error::InvalidArgument(format!(
                "a {}-token context on a GPU model loaded for {ctx} positions (load it with a \
                 larger --ctx)",
                s.cache.capacity()
            )));
        }
    }
    Ok(())
}

/// Rows answered in full (a call that asked for no candidates) as plain logits.
pub(crate) fn full_rows(rows: Vec<RowLogits>) -> Vec<Vec<f32>> {
    rows.into_iter()
        .map(|r| match r {
            RowLogits::Full(l) => l,
            RowLogits::Top(_) => unreachable!("no candidates were asked for"),
        })
        .collect()
}

/// The decode rows of a call (its sequences that feed one token, each already in its slot)
/// and their places in `seqs`; the other sequences are prompts.
pub(crate) fn split_rows(seqs: &[BatchSeq<'_>], want_top: &[bool]) -> (Vec<Row>, Vec<usize>) {
    let mut rows = Vec::new();
    let mut row_of = Vec::new();
    for (i, s) in seqs.iter().enumerate() {
        if s.tokens.len() == 1 {
            rows.push(Row {
                slot: s.cache.device_slot().expect("attached before").index(),
                pos: s.cache.len(),
                token: s.tokens[0],
                want_top: want_top.get(i).copied().unwrap_or(false),
            });
            row_of.push(i);
        }
    }
    (rows, row_of)
}

/// The slot `cache` owns in `pool`, taken now for a new (empty) cache; `held` names what a
/// slot holds, for the errors.
pub(crate) fn attach(pool: &SlotPool, cache: &mut KvCache, held: &str) -> Result<usize> {
    match cache.device_slot() {
        Some(slot) if pool.owns(slot) => {}
        Some(_) => {
            return Err(Error::InvalidArgument(format!(
                "a cache whose {held} live on another GPU model"
            )))
        }
        None if !cache.is_empty() => {
            return Err(Error::InvalidArgument(format!(
                "a cache filled by the single-sequence GPU path cannot join a batch (its {held} \
                 are not in a batch slot)"
            )))
        }
        None => {
            let slot = pool.take().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "all {} GPU sequence slots are in use",
                    pool.capacity()
                ))
            })?;
            cache.set_device_slot(slot);
        }
    }
    Ok(cache.device_slot().expect("set above").index())
}

/// The answers of a step's `rows`, whose logits are `logits` (row after row): each row that
/// asks, its `k` best candidates (one kernel over every row, microseconds) unless its
/// normalizer is not finite; every other row in full — one copy of the span of rows that
/// holds them, then one owned vector per row (the sampler takes it), copied out of the pinned
/// buffer on several threads (B × vocab floats is milliseconds on one core).
pub(crate) fn gather(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    host: &mut PinnedHostSlice<f32>,
    top: &mut TopBuffers,
    rows: &[Row],
    k: usize,
    vocab: usize,
) -> Result<Vec<RowLogits>> {
    let n = rows.len();
    let mut out: Vec<Option<RowLogits>> = vec![None; n];
    if rows.iter().any(|r| r.want_top) && topk::supported(k, vocab) {
        let at = crate::device::ptr(logits, &gpu.stream);
        let tops = top.run(gpu, at, n, vocab, k)?;
        for ((o, r), t) in out.iter_mut().zip(rows).zip(tops) {
            if r.want_top {
                *o = t.map(RowLogits::Top);
            }
        }
    }
    let missing: Vec<usize> = (0..n).filter(|&i| out[i].is_none()).collect();
    if let (Some(&lo), Some(&hi)) = (missing.first(), missing.last()) {
        let span = logits.slice(lo * vocab..(hi + 1) * vocab);
        let v = copy_to_pinned(gpu, &span, host)
            .map_err(|e| Error::Unsupported(format!("rows {lo}..={hi} of {n} in full: {e}")))?;
        let full: Vec<Vec<f32>> = missing
            .par_iter()
            .map(|&i| v[(i - lo) * vocab..(i - lo + 1) * vocab].to_vec())
            .collect();
        for (i, r) in missing.into_iter().zip(full) {
            out[i] = Some(RowLogits::Full(r));
        }
    }
    Ok(out
        .into_iter()
        .map(|o| o.expect("every row answered above"))
        .collect())
}
