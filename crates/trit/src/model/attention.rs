//! Causal multi-head attention over the KV cache with grouped-query heads.
//! Work is split over (sequence, token, head) triples across the pool — one dispatch per layer
//! even when several sequences are batched; each triple keeps its own score row, so no full
//! score matrix is materialized.

use super::kv_cache::KvCache;
use crate::format::config::ModelConfig;
use crate::kernels::ops;
use crate::threadpool::ThreadPool;
use std::sync::Mutex;

/// Output rows computed by one thread: (row·head index over all sequences, head_dim values).
type Partial = Vec<(usize, Vec<f32>)>;

/// One sequence's part of a batched attention call: `q` holds `n × n_heads × head_dim`
/// rotated queries for positions `pos0..pos0+n`, whose keys and values are already appended
/// to `cache` for the layer.
pub struct AttendSeq<'a> {
    pub q: &'a [f32],
    pub cache: &'a KvCache,
    pub pos0: usize,
    pub n: usize,
}

/// `q` holds `n × n_heads × head_dim` rotated queries for positions `pos0..pos0+n`, whose keys
/// and values are already appended to `cache` for `layer`. Writes `n × n_heads × head_dim`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &ThreadPool,
    c: &ModelConfig,
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos0: usize,
    n: usize,
    out: &mut [f32],
) {
    attend_batch(pool, c, layer, &[AttendSeq { q, cache, pos0, n }], out);
}

/// Attention for several sequences at once; `out` receives their rows in order.
pub fn attend_batch(
    pool: &ThreadPool,
    c: &ModelConfig,
    layer: usize,
    seqs: &[AttendSeq<'_>],
    out: &mut [f32],
) {
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    let group = nh / nkv;
    let row = nkv * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    // First output row of each sequence, and the longest key range any of them reads.
    let mut first_row = Vec::with_capacity(seqs.len() + 1);
    first_row.push(0);
    for s in seqs {
        first_row.push(first_row.last().unwrap() + s.n);
    }
    let pairs = first_row.last().unwrap() * nh;
    let longest = seqs.iter().map(|s| s.pos0 + s.n).max().unwrap_or(0);
    let results: Vec<Mutex<Partial>> = (0..pool.n_threads())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    pool.run(&|tid, nt| {
        let mut local = Vec::new();
        let mut scores = vec![0f32; longest];
        let (start, end) = (pairs * tid / nt, pairs * (tid + 1) / nt);
        let mut si = 0;
        for p in start..end {
            let (r, h) = (p / nh, p % nh);
            while first_row[si + 1] <= r {
                si += 1;
            }
            let s = &seqs[si];
            let t = r - first_row[si];
            let total = s.pos0 + s.n;
            let qh = &s.q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let mut acc = vec![0f32; hd];
            ops::attend_head(
                qh,
                s.cache.keys(layer, total),
                s.cache.values(layer, total),
                row,
                (h / group) * hd,
                s.pos0 + t + 1,
                scale,
                &mut scores,
                &mut acc,
            );
            local.push((p, acc));
        }
        *results[tid].lock().unwrap() = local;
    });
    for r in results {
        for (p, v) in r.into_inner().unwrap() {
            out[p * hd..(p + 1) * hd].copy_from_slice(&v);
        }
    }
}
