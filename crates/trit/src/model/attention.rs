//! Causal multi-head attention over the KV cache with grouped-query heads.
//!
//! Work is split into units of (KV head, block of up to `TOKENS_PER_UNIT` query tokens): the
//! query heads of a group and the tokens of a block share every key, so one unit is one
//! `kernels::attn::attend_rows` call, which streams the keys block by block with an online
//! softmax (no full score matrix, whatever the prompt length). Threads claim units one at a
//! time, heaviest (latest tokens, most keys) first, so the causal triangle's uneven work
//! stays balanced.

use super::kv_cache::KvCache;
use crate::format::config::ModelConfig;
use crate::kernels::attn::{attend_rows, AttnScratch, KvHead};
use crate::threadpool::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Query tokens per unit of work (with 2 query heads per KV head: 32 rows per key block).
const TOKENS_PER_UNIT: usize = 16;

/// Output rows computed by one thread: (unit index, its rows).
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
    let total = pos0 + n;
    let kv_all = KvHead {
        keys: cache.keys(layer, total),
        values: cache.values(layer, total),
        stride: nkv * hd,
        offset: 0,
    };
    let scale = 1.0 / (hd as f32).sqrt();
    let blocks = n.div_ceil(TOKENS_PER_UNIT);
    let units = blocks * nkv;
    // Unit u: query block `blocks - 1 - u / nkv` (last first), KV head `u % nkv`.
    let unit_rows = |u: usize| {
        let t0 = (blocks - 1 - u / nkv) * TOKENS_PER_UNIT;
        (t0, (n - t0).min(TOKENS_PER_UNIT), u % nkv)
    };
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Partial>> = (0..pool.n_threads())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    pool.run(&|tid, _| {
        let mut local = Vec::new();
        let mut scratch = AttnScratch::default();
        let (mut rows_q, mut visible) = (Vec::new(), Vec::new());
        loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= units {
                break;
            }
            let (t0, nt, g) = unit_rows(u);
            rows_q.clear();
            visible.clear();
            for t in t0..t0 + nt {
                let heads = &q[(t * nh + g * group) * hd..(t * nh + (g + 1) * group) * hd];
                rows_q.extend_from_slice(heads);
                visible.extend(std::iter::repeat_n(pos0 + t + 1, group));
            }
            let mut o = vec![0f32; rows_q.len()];
            let kv = KvHead {
                offset: g * hd,
                ..kv_all
            };
            attend_rows(&rows_q, &visible, kv, scale, &mut o, &mut scratch);
            local.push((u, o));
        }
        *results[tid].lock().unwrap() = local;
    });
    for r in results {
        for (u, o) in r.into_inner().unwrap() {
            let (t0, nt, g) = unit_rows(u);
            for (dt, rows) in o.chunks_exact(group * hd).take(nt).enumerate() {
                let t = t0 + dt;
                out[(t * nh + g * group) * hd..][..group * hd].copy_from_slice(rows);
            }
        }
    }
}
