//! Causal multi-head attention over the KV cache with grouped-query heads, for one sequence or
//! several batched sequences (each against its own cache) in one pool dispatch per layer.
//!
//! Work is split into units of (sequence, KV head, block of up to `TOKENS_PER_UNIT` query
//! tokens): the query heads of a group and the tokens of a block share every key, so one unit is
//! one `kernels::attn::attend_rows` call, which streams the keys block by block with an online
//! softmax (no full score matrix, whatever the prompt length). Threads claim units one at a
//! time, heaviest (most keys) first, so the causal triangle's uneven work stays balanced.
//! Keys and values are read in place through the cache's block table (paged, see `kv_cache`).

use super::kv_cache::KvCache;
use crate::format::config::ModelConfig;
use crate::kernels::attn::{attend_rows, AttnScratch, PagedKvHead};
use crate::threadpool::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Query tokens per unit of work (with 2 query heads per KV head: 32 rows per key block).
const TOKENS_PER_UNIT: usize = 16;

/// Output rows computed by one thread: (unit index, its rows).
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

/// One unit of work: sequence `seq`, query tokens `t0..t0 + nt`, KV head `g`.
#[derive(Clone, Copy)]
struct Unit {
    seq: usize,
    t0: usize,
    nt: usize,
    g: usize,
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
    let scale = 1.0 / (hd as f32).sqrt();
    // First output row of each sequence.
    let mut first_row = Vec::with_capacity(seqs.len() + 1);
    first_row.push(0);
    for s in seqs {
        first_row.push(first_row.last().unwrap() + s.n);
    }
    let mut units = Vec::new();
    for (seq, s) in seqs.iter().enumerate() {
        for t0 in (0..s.n).step_by(TOKENS_PER_UNIT) {
            let nt = (s.n - t0).min(TOKENS_PER_UNIT);
            units.extend((0..nkv).map(|g| Unit { seq, t0, nt, g }));
        }
    }
    // Heaviest first: the units whose last token sees the most keys.
    units.sort_by_key(|u| std::cmp::Reverse(seqs[u.seq].pos0 + u.t0 + u.nt));
    // Each sequence's key/value pages for this layer, looked up once for all its units.
    let pages: Vec<_> = seqs
        .iter()
        .map(|s| s.cache.pages(layer, s.pos0 + s.n))
        .collect();
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Partial>> = (0..pool.n_threads())
        .map(|_| Mutex::new(Vec::new()))
        .collect();
    pool.run(&|tid, _| {
        let mut local = Vec::new();
        let mut scratch = AttnScratch::default();
        let (mut rows_q, mut visible) = (Vec::new(), Vec::new());
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&u) = units.get(i) else { break };
            let s = &seqs[u.seq];
            rows_q.clear();
            visible.clear();
            for t in u.t0..u.t0 + u.nt {
                let heads = &s.q[(t * nh + u.g * group) * hd..(t * nh + (u.g + 1) * group) * hd];
                rows_q.extend_from_slice(heads);
                visible.extend(std::iter::repeat_n(s.pos0 + t + 1, group));
            }
            let mut o = vec![0f32; rows_q.len()];
            let (stride, offset) = s.cache.head_layout(u.g);
            let kv = PagedKvHead {
                key_pages: pages[u.seq].0.as_pages(),
                value_pages: pages[u.seq].1.as_pages(),
                stride,
                offset,
            };
            attend_rows(&rows_q, &visible, kv, scale, &mut o, &mut scratch);
            local.push((i, o));
        }
        *results[tid].lock().unwrap() = local;
    });
    for r in results {
        for (i, o) in r.into_inner().unwrap() {
            let u = units[i];
            let r0 = first_row[u.seq];
            for (dt, rows) in o.chunks_exact(group * hd).take(u.nt).enumerate() {
                let t = r0 + u.t0 + dt;
                out[(t * nh + u.g * group) * hd..][..group * hd].copy_from_slice(rows);
            }
        }
    }
}
