//! Causal multi-head attention over the KV cache with grouped-query heads.
//! Work is split over (token, head) pairs across the pool; each pair keeps its own score
//! row, so no full score matrix is materialized.

use super::kv_cache::KvCache;
use crate::format::config::ModelConfig;
use crate::kernels::ops;
use crate::threadpool::ThreadPool;
use std::sync::Mutex;

/// Output rows computed by one thread: (token·head index, head_dim values).
type Partial = Vec<(usize, Vec<f32>)>;

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
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    let group = nh / nkv;
    let row = nkv * hd;
    let total = pos0 + n;
    let keys = cache.keys(layer, total);
    let values = cache.values(layer, total);
    let scale = 1.0 / (hd as f32).sqrt();
    let pairs = n * nh;
    let results: Vec<Mutex<Partial>> = (0..pool.n_threads())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    pool.run(&|tid, nt| {
        let mut local = Vec::new();
        let mut scores = vec![0f32; total];
        let (start, end) = (pairs * tid / nt, pairs * (tid + 1) / nt);
        for p in start..end {
            let (t, h) = (p / nh, p % nh);
            let qh = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let mut acc = vec![0f32; hd];
            let offset = (h / group) * hd;
            let visible = pos0 + t + 1;
            ops::attend_head(
                qh,
                keys,
                values,
                row,
                offset,
                visible,
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
