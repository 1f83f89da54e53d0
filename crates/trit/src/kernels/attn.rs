//! Attention of a block of query rows against one KV head, one block of keys at a time with an
//! online softmax (running max and sum per row), so no score matrix larger than
//! `rows × KEY_BLOCK` ever exists, whatever the context length.
//!
//! Why this shape: the rows of one call share their keys (the query heads of a grouped-query
//! group, for several consecutive tokens). Sixteen rows are transposed once into `hd × 16`, so
//! one lane holds one row: the scores of 8 keys are 8 independent broadcast-FMA chains (no
//! horizontal reductions), and masking, the running max, the exponentials (`ops::exp_approx`)
//! and the running sums are 16-lane element-wise loops. The weighted sum of values keeps 64
//! output dimensions in registers per row. All of it is plain Rust the compiler vectorizes
//! (NEON too); on x86 the same code is compiled again with AVX-512 (or AVX2+FMA) enabled and
//! picked at run time.
//!
//! On AVX-512 with `head_dim` a multiple of 16 every call takes `attn_avx512` instead (lanes
//! along `head_dim`, rows in groups of 4: a decode step's 1–4 grouped heads fill the lanes,
//! and a row rounds the same whatever rows share its call).
//!
//! Keys and values are read through pages of `KEY_BLOCK` positions (the paged KV cache's
//! blocks): one key block of the loop is exactly one page, so the paging costs one slice
//! lookup per 64 keys and nothing inside the inner loops.

use super::kv_type::{KvPage, KvPages};
use super::ops::exp_approx;

/// Keys per block (the scores of a block: 64 × 16 floats, 4 KiB).
pub const KEY_BLOCK: usize = 64;
/// Query rows computed together, one per lane of a 512-bit register.
const ROWS: usize = 16;
/// Rows of the narrow form used when a call has at most this many (decode).
const NARROW_ROWS: usize = 4;

/// One KV head inside one page of the cache: key `j` of the page is
/// `keys[j·stride + offset ..][..hd]` (values alike).
#[derive(Clone, Copy)]
struct KvHead<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    stride: usize,
    offset: usize,
}

/// One KV head across the pages of a cache: key `j` is key `j % KEY_BLOCK` of page
/// `j / KEY_BLOCK`, each page laid out as `[position][stride]` with the head at `offset`.
/// Keys and values are in their stored types (`kv_type`); the kernels widen them to f32.
#[derive(Clone, Copy)]
pub struct PagedKvHead<'a> {
    pub key_pages: KvPages<'a>,
    pub value_pages: KvPages<'a>,
    pub stride: usize,
    pub offset: usize,
}

impl<'a> PagedKvHead<'a> {
    /// Page `p` as f32 for the generic kernel: borrowed when both are stored as f32, else
    /// the `kb` keys and values of this head widened into `keys`/`values` (contiguous, so
    /// stride `hd`, offset 0). Widening is exact, so either way the kernel sees the same
    /// numbers.
    fn f32_page<'s>(
        &self,
        p: usize,
        kb: usize,
        hd: usize,
        keys: &'s mut Vec<f32>,
        values: &'s mut Vec<f32>,
    ) -> KvHead<'s>
    where
        'a: 's,
    {
        if let (KvPages::F32(k), KvPages::F32(v)) = (self.key_pages, self.value_pages) {
            return KvHead {
                keys: k[p],
                values: v[p],
                stride: self.stride,
                offset: self.offset,
            };
        }
        for (pages, buf) in [
            (self.key_pages, &mut *keys),
            (self.value_pages, &mut *values),
        ] {
            let page = pages.page(p);
            buf.resize(kb * hd, 0.0);
            for (j, row) in buf.chunks_exact_mut(hd).enumerate() {
                page.read(j * self.stride + self.offset, row);
            }
        }
        KvHead {
            keys,
            values,
            stride: hd,
            offset: 0,
        }
    }

    /// Whether the pages hold `n` keys of `hd` floats.
    fn holds(&self, n: usize, hd: usize) -> bool {
        let pages = n.div_ceil(KEY_BLOCK);
        self.key_pages.len() >= pages
            && self.value_pages.len() >= pages
            && (0..pages).all(|p| {
                let keys = (n - p * KEY_BLOCK).min(KEY_BLOCK);
                let need = (keys - 1) * self.stride + self.offset + hd;
                self.key_pages.page(p).len() >= need && self.value_pages.page(p).len() >= need
            })
    }
}

/// Asks for the cache lines of `hd` elements from element `at` of `page` ahead of use. A KV
/// head's keys (and values) sit one cache row (4 KiB on the 1.7B shape in f32) apart, each in
/// its own 4 KiB page, where the hardware prefetchers stop; decode, with its few query rows per
/// key, is bound by how fast these scattered rows arrive from memory.
#[inline(always)]
fn prefetch_row(page: KvPage, at: usize, hd: usize) {
    let (p, size) = page.addr(at);
    #[cfg(target_arch = "x86_64")]
    for line in (0..hd * size).step_by(64) {
        // SAFETY: a prefetch hint never faults; the address is inside the page's row.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.add(line).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, size, hd);
}

/// Keys prefetched ahead of the scores being computed.
const PREFETCH_KEYS: usize = 16;

/// Splits contiguous `[position][stride]` rows into the pages `PagedKvHead` reads.
pub fn pages_of<T>(rows: &[T], stride: usize) -> Vec<&[T]> {
    rows.chunks(KEY_BLOCK * stride).collect()
}

/// Reusable buffers of `attend_rows` (grow on demand).
#[derive(Default)]
pub struct AttnScratch {
    qt: Vec<f32>,
    values: Vec<f32>,
    /// A page's keys and values widened to f32 (generic kernel, f16 cache).
    wide_keys: Vec<f32>,
    wide_values: Vec<f32>,
}

/// `attend_rows_at` at the global kernel level.
pub fn attend_rows(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    attend_rows_at(super::level(), q, visible, kv, scale, out, scratch)
}

/// For each row `r` of `q` (`rows × hd`, with `hd = q.len() / visible.len()`):
/// `out_r = softmax(scale · q_r · K[..visible[r]]ᵀ) · V[..visible[r]]`. Every `visible[r]` must
/// be at least 1 and at most the number of keys in `kv`.
/// `level` picks the instruction set the same code is compiled for (`Reference` and
/// `Portable` run the generic build).
pub fn attend_rows_at(
    level: super::KernelLevel,
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let rows = visible.len();
    assert!(
        rows > 0 && q.len().is_multiple_of(rows),
        "attend_rows: q shape"
    );
    let hd = q.len() / rows;
    assert_eq!(out.len(), q.len(), "attend_rows: output shape");
    let most = visible.iter().copied().max().unwrap_or(0);
    assert!(
        visible.iter().all(|&v| v >= 1) && (most == 0 || kv.holds(most, hd)),
        "attend_rows: visible keys outside the cache"
    );
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // Every call at this level, prefill too, in groups of up to 4 rows: a row's result
        // must not depend on how many rows share the call (a prompt's last token computed in a
        // long prefill, or alone after a prefix-cache hit, must give the same logits), and the
        // generic form rounds differently.
        super::KernelLevel::Avx512 if hd.is_multiple_of(16) => {
            let group = super::attn_avx512::MAX_ROWS;
            for ((qg, vg), og) in q
                .chunks(group * hd)
                .zip(visible.chunks(group))
                .zip(out.chunks_mut(group * hd))
            {
                // SAFETY: `or_supported` checked avx512f; the shapes were checked above.
                unsafe { super::attn_avx512::attend_few(qg, vg, kv, scale, og, &mut scratch.qt) }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` checked avx512f; the guard checks avx2 and fma.
        super::KernelLevel::Avx512 if super::KernelLevel::Avx2.supported() => unsafe {
            attend_avx512(q, visible, kv, scale, out, scratch)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` checked avx2 and fma.
        super::KernelLevel::Avx2 => unsafe { attend_avx2(q, visible, kv, scale, out, scratch) },
        _ => attend_generic::<false>(q, visible, kv, scale, out, scratch),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn attend_avx512(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    attend_generic::<true>(q, visible, kv, scale, out, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    attend_generic::<true>(q, visible, kv, scale, out, scratch)
}

/// `a·b + c`, fused when the caller is compiled with FMA (a libm call otherwise, hence the
/// switch).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Scores of the `ROWS` (pre-scaled, transposed) query rows `qt` (`hd × ROWS`) against 8
/// keys starting at `j`: `s[c][r] = q_r · K[j + c]`. Keys past `last` repeat `last` (their
/// scores are masked by the caller). 8 independent accumulators of `ROWS` lanes keep both FMA
/// pipes busy; each key element is one broadcast.
#[inline(always)]
fn scores_8_keys<const FMA: bool, const R: usize>(
    qt: &[f32],
    kv: KvHead,
    hd: usize,
    j: usize,
    last: usize,
) -> [[f32; R]; 8] {
    let key = |c: usize| &kv.keys[(j + c).min(last) * kv.stride + kv.offset..][..hd];
    let k: [&[f32]; 8] = std::array::from_fn(key);
    let mut acc = [[0f32; R]; 8];
    for i in 0..hd {
        let qi: &[f32; R] = qt[i * R..][..R].try_into().unwrap();
        for c in 0..8 {
            let kc = k[c][i];
            for r in 0..R {
                acc[c][r] = madd::<FMA>(kc, qi[r], acc[c][r]);
            }
        }
    }
    acc
}

/// `o += Σ_j p[j] · V[j0 + j]` over the `p.len()` keys, 64 output dimensions at a time held in
/// registers (two accumulator sets over alternate keys), the tail of `hd` element by element.
#[inline(always)]
fn add_weighted_values<const FMA: bool>(o: &mut [f32], p: &[f32], kv: KvHead, j0: usize) {
    const W: usize = 64;
    let hd = o.len();
    let value = |j: usize| &kv.values[(j0 + j) * kv.stride + kv.offset..][..hd];
    let full = hd / W * W;
    for c in (0..full).step_by(W) {
        let mut a: [f32; W] = o[c..c + W].try_into().unwrap();
        let mut b = [0f32; W];
        let mut pairs = p.chunks_exact(2);
        for (i, pp) in (&mut pairs).enumerate() {
            let v0: &[f32; W] = value(2 * i)[c..c + W].try_into().unwrap();
            let v1: &[f32; W] = value(2 * i + 1)[c..c + W].try_into().unwrap();
            for d in 0..W {
                a[d] = madd::<FMA>(pp[0], v0[d], a[d]);
                b[d] = madd::<FMA>(pp[1], v1[d], b[d]);
            }
        }
        if let [pl] = pairs.remainder() {
            let v: &[f32; W] = value(p.len() - 1)[c..c + W].try_into().unwrap();
            for d in 0..W {
                a[d] = madd::<FMA>(*pl, v[d], a[d]);
            }
        }
        for d in 0..W {
            o[c + d] = a[d] + b[d];
        }
    }
    if full < hd {
        for (j, &pj) in p.iter().enumerate() {
            for (ov, &vv) in o[full..].iter_mut().zip(&value(j)[full..]) {
                *ov = madd::<FMA>(pj, vv, *ov);
            }
        }
    }
}

#[inline(always)]
fn attend_generic<const FMA: bool>(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let hd = q.len() / visible.len();
    if visible.len() <= NARROW_ROWS {
        // A decode step has only the few query heads of one KV head: 4 lanes instead of 16
        // avoid computing 12 padding rows.
        return attend_group::<FMA, NARROW_ROWS>(q, visible, kv, scale, out, scratch);
    }
    for ((qg, vg), og) in q
        .chunks(ROWS * hd)
        .zip(visible.chunks(ROWS))
        .zip(out.chunks_mut(ROWS * hd))
    {
        attend_group::<FMA, ROWS>(qg, vg, kv, scale, og, scratch);
    }
}

/// Up to `R` rows (`ROWS`, or `NARROW_ROWS` in decode): queries transposed once into `hd × R`
/// (lane r = row r), scores of a
/// key block as `[key][row]`, so masking, the running max, the exponentials and the running
/// sums are all plain `R`-lane vector operations.
#[inline(always)]
fn attend_group<const FMA: bool, const R: usize>(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) {
    let rows = visible.len();
    let hd = q.len() / rows;
    let most = visible.iter().copied().max().unwrap_or(0);
    // Padding rows see nothing: all their scores are masked and they are never written.
    let mut vis = [0usize; R];
    vis[..rows].copy_from_slice(visible);
    let AttnScratch {
        qt,
        values: value_copy,
        wide_keys,
        wide_values,
    } = scratch;
    qt.clear();
    qt.resize(hd * R, 0.0);
    for r in 0..rows {
        for i in 0..hd {
            qt[i * R + r] = q[r * hd + i] * scale;
        }
    }
    let mut max = [f32::NEG_INFINITY; R];
    let mut sum = [0f32; R];
    out.fill(0.0);
    let mut s = [[0f32; R]; KEY_BLOCK];
    let (stride, offset) = (kv.stride, kv.offset);
    for j0 in (0..most).step_by(KEY_BLOCK) {
        let kb = (most - j0).min(KEY_BLOCK);
        let pi = j0 / KEY_BLOCK;
        if j0 == 0 {
            for j in 0..PREFETCH_KEYS.min(most) {
                prefetch_row(kv.key_pages.page(0), j * stride + offset, hd);
            }
        }
        // This key block is one page: indices below are relative to its first key. A cache
        // in f16 is widened here, a page at a time (the prefetches below still go to the
        // stored pages).
        let page = kv.f32_page(pi, kb, hd, wide_keys, wide_values);
        let widened = !matches!(
            (kv.key_pages, kv.value_pages),
            (KvPages::F32(_), KvPages::F32(_))
        );
        for c0 in (0..kb).step_by(8) {
            for c in 0..8 {
                let ahead = j0 + c0 + PREFETCH_KEYS + c;
                if ahead < most {
                    let at = (ahead % KEY_BLOCK) * stride + offset;
                    prefetch_row(kv.key_pages.page(ahead / KEY_BLOCK), at, hd);
                }
                if c0 + c < kb {
                    prefetch_row(kv.value_pages.page(pi), (c0 + c) * stride + offset, hd);
                }
            }
            let block = scores_8_keys::<FMA, R>(qt, page, hd, c0, kb - 1);
            for (c, sc) in block.iter().enumerate() {
                if c0 + c < KEY_BLOCK {
                    s[c0 + c] = *sc;
                }
            }
        }
        let mut new_max = max;
        for (j, sj) in s.iter_mut().enumerate() {
            for r in 0..R {
                // Causal mask, and the keys past the block end.
                let seen = j < kb && j0 + j < vis[r];
                sj[r] = if seen { sj[r] } else { f32::NEG_INFINITY };
                new_max[r] = if sj[r] > new_max[r] {
                    sj[r]
                } else {
                    new_max[r]
                };
            }
        }
        let mut carry = [0f32; R];
        for r in 0..R {
            // exp(-inf) = 0 while a row has seen nothing; `-inf - -inf` (a row that still
            // sees nothing) is NaN, hence the select.
            let d = max[r] - new_max[r];
            carry[r] = if d.is_nan() { 0.0 } else { exp_approx(d) };
        }
        let mut block_sum = [0f32; R];
        for sj in s.iter_mut() {
            for r in 0..R {
                let d = sj[r] - new_max[r];
                sj[r] = if d.is_nan() { 0.0 } else { exp_approx(d) };
                block_sum[r] += sj[r];
            }
        }
        for r in 0..R {
            sum[r] = sum[r] * carry[r] + block_sum[r];
        }
        max = new_max;
        // The block's values, copied contiguous: in the cache they sit one row (often 4 KiB) apart,
        // so 64 of them map to the same few L1 sets and evict each other while 16 rows reread
        // them; contiguous, the 64 × hd floats stay in L1. With a decode step's few rows each
        // value is read only a few times, and the copy would cost as much as the reads.
        // A widened page is contiguous already.
        let (block_values, vj0) = if R > NARROW_ROWS && !widened {
            value_copy.clear();
            for j in 0..kb {
                let v = &page.values[j * page.stride + page.offset..][..hd];
                value_copy.extend_from_slice(v);
            }
            let contiguous = KvHead {
                keys: &[],
                values: value_copy,
                stride: hd,
                offset: 0,
            };
            (contiguous, 0)
        } else {
            (page, 0)
        };
        let mut p = [0f32; KEY_BLOCK];
        for r in 0..rows {
            if vis[r] <= j0 {
                continue;
            }
            let nk = (vis[r] - j0).min(kb);
            for (pj, sj) in p.iter_mut().zip(&s) {
                *pj = sj[r];
            }
            let o = &mut out[r * hd..(r + 1) * hd];
            if carry[r] != 1.0 {
                o.iter_mut().for_each(|v| *v *= carry[r]);
            }
            add_weighted_values::<FMA>(o, &p[..nk], block_values, vj0);
        }
    }
    for (o, &sm) in out.chunks_exact_mut(hd).zip(&sum) {
        let inv = 1.0 / sm;
        o.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::kv_type::{store_q8, KvPageList, KvType, Q8Page, Q8_BLOCK};
    use crate::kernels::KernelLevel;
    use half::f16;

    /// `n` values in [-2, 2).
    fn data(n: usize, seed: u64) -> Vec<f32> {
        crate::test_values::uniform(seed, n)
            .into_iter()
            .map(|x| 2.0 * x)
            .collect()
    }

    /// Keys or values stored as `t`: the pages, and the f32 numbers they hold.
    struct Stored {
        f16: Vec<f16>,
        q: Vec<i8>,
        d: Vec<f32>,
        f32: Vec<f32>,
        kind: KvType,
    }

    impl Stored {
        /// `x` stored as `kind` (q8_0: in consecutive blocks of 32, so heads must start and
        /// end on block boundaries).
        fn new(x: &[f32], kind: KvType) -> Self {
            let f16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let (mut q, mut d) = (vec![0i8; x.len()], vec![0f32; x.len() / Q8_BLOCK]);
            if kind == KvType::Q8_0 {
                store_q8(&mut q, &mut d, x);
            }
            let f32 = match kind {
                KvType::F16 => f16.iter().map(|v| v.to_f32()).collect(),
                KvType::F32 => x.to_vec(),
                KvType::Q8_0 => (0..x.len())
                    .map(|i| q[i] as f32 * d[i / Q8_BLOCK])
                    .collect(),
            };
            Stored {
                f16,
                q,
                d,
                f32,
                kind,
            }
        }

        fn pages(&self, stride: usize) -> KvPageList<'_> {
            match self.kind {
                KvType::F16 => KvPageList::F16(pages_of(&self.f16, stride)),
                KvType::F32 => KvPageList::F32(pages_of(&self.f32, stride)),
                KvType::Q8_0 => KvPageList::Q8_0(
                    pages_of(&self.q, stride)
                        .into_iter()
                        .zip(pages_of(&self.d, stride / Q8_BLOCK))
                        .map(|(q, d)| Q8Page { q, d })
                        .collect(),
                ),
            }
        }
    }

    /// Direct f64 softmax average, one row at a time.
    fn reference(q: &[f32], visible: &[usize], kv: KvHead, scale: f32) -> Vec<f64> {
        let hd = q.len() / visible.len();
        let mut out = Vec::new();
        for (r, &vis) in visible.iter().enumerate() {
            let qr = &q[r * hd..(r + 1) * hd];
            let s: Vec<f64> = (0..vis)
                .map(|j| {
                    let k = &kv.keys[j * kv.stride + kv.offset..][..hd];
                    qr.iter()
                        .zip(k)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for i in 0..hd {
                out.push(
                    (0..vis)
                        .map(|j| {
                            (s[j] - m).exp() / z * kv.values[j * kv.stride + kv.offset + i] as f64
                        })
                        .sum(),
                );
            }
        }
        out
    }

    /// (keys, values) type pairs a cache can have.
    const TYPES: [(KvType, KvType); 6] = [
        (KvType::F32, KvType::F32),
        (KvType::F16, KvType::F16),
        (KvType::F32, KvType::F16),
        (KvType::F16, KvType::F32),
        (KvType::Q8_0, KvType::Q8_0),
        (KvType::Q8_0, KvType::F16),
    ];

    /// Whether q8_0 pages can hold heads of this layout (whole blocks of 32 per head row).
    fn fits(kt: KvType, vt: KvType, hd: usize, stride: usize, offset: usize) -> bool {
        let q8 = kt == KvType::Q8_0 || vt == KvType::Q8_0;
        !q8 || [hd, stride, offset]
            .iter()
            .all(|x| x.is_multiple_of(Q8_BLOCK))
    }

    /// A row's output is bit-identical whether it is computed alone or with other rows (a
    /// prompt's last token in a long prefill vs alone after a prefix-cache hit), at every level
    /// and for every stored type.
    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows_of_the_call() {
        let (hd, n, stride, offset) = (128, 150, 512, 128);
        let keys = data(n * stride, 71);
        let values = data(n * stride, 72);
        // 2 heads × 10 tokens of a causal prefill ending at 150 keys.
        let visible: Vec<usize> = (0..20).map(|r| 141 + r / 2).collect();
        let q: Vec<f32> = data(visible.len() * hd, 73)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        for (kt, vt) in TYPES {
            let (ks, vs) = (Stored::new(&keys, kt), Stored::new(&values, vt));
            let (key_pages, value_pages) = (ks.pages(stride), vs.pages(stride));
            let kv = PagedKvHead {
                key_pages: key_pages.as_pages(),
                value_pages: value_pages.as_pages(),
                stride,
                offset,
            };
            for &l in &KernelLevel::available() {
                let mut scratch = AttnScratch::default();
                let mut all = vec![f32::NAN; q.len()];
                attend_rows_at(l, &q, &visible, kv, 0.09, &mut all, &mut scratch);
                for (r, &vis) in visible.iter().enumerate() {
                    for take in [1, 2, 3, 5] {
                        let r0 = r.min(visible.len() - take);
                        let (qs, vs) = (&q[r0 * hd..(r0 + take) * hd], &visible[r0..r0 + take]);
                        let mut some = vec![f32::NAN; take * hd];
                        attend_rows_at(l, qs, vs, kv, 0.09, &mut some, &mut scratch);
                        let got = &some[(r - r0) * hd..][..hd];
                        let want = &all[r * hd..][..hd];
                        assert!(
                            got.iter()
                                .zip(want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{l} {kt}/{vt}: row {r} (sees {vis}) in a call of {take} rows from {r0}"
                        );
                    }
                }
            }
        }
    }

    /// Against a direct f64 softmax over the numbers the cache holds (f16 caches: the rounded
    /// ones), on shapes that exercise every path; and an f16 cache gives bit for bit what an
    /// f32 cache holding the same rounded numbers gives (widening is exact, the arithmetic is
    /// the same).
    #[test]
    fn matches_a_direct_softmax_on_awkward_shapes_at_every_level() {
        // (head dim, keys in cache, stride, offset, visible per row)
        let cases: &[(usize, usize, usize, usize, &[usize])] = &[
            (8, 5, 24, 8, &[5]),
            (128, 200, 256, 128, &[1, 63, 64, 65, 130, 200]),
            (64, 700, 64, 0, &[700, 700, 3, 129]),
            (72, 64, 144, 72, &[64, 64]),
            // Decode-like calls (the narrow 4-row form): 4 rows, long context.
            (128, 1000, 1024, 384, &[1000, 1000, 1000, 1000]),
            (64, 3, 64, 0, &[3, 2, 1]),
            // The AVX-512 decode kernel's shapes: 1–4 rows, head dims of 1, 3 and 8 chunks of
            // 16, rows that see different numbers of keys across pages.
            (128, 150, 1024, 256, &[150, 149]),
            (48, 70, 96, 48, &[70, 1, 65]),
            (16, 9, 16, 0, &[9]),
            (128, 200, 256, 0, &[200, 64, 65, 129]),
        ];
        for &l in &KernelLevel::available() {
            for (ci, &(hd, n, stride, offset, visible)) in cases.iter().enumerate() {
                let keys = data(n * stride, 10 + ci as u64);
                let values = data(n * stride, 20 + ci as u64);
                // Large query norms make the scores span a wide range (tests the running max).
                let q: Vec<f32> = data(visible.len() * hd, 30 + ci as u64)
                    .iter()
                    .map(|v| v * 3.0)
                    .collect();
                let scale = 1.0 / (hd as f32).sqrt();
                for (kt, vt) in TYPES {
                    if !fits(kt, vt, hd, stride, offset) {
                        continue;
                    }
                    let (ks, vs) = (Stored::new(&keys, kt), Stored::new(&values, vt));
                    let (key_pages, value_pages) = (ks.pages(stride), vs.pages(stride));
                    let paged = PagedKvHead {
                        key_pages: key_pages.as_pages(),
                        value_pages: value_pages.as_pages(),
                        stride,
                        offset,
                    };
                    let mut out = vec![f32::NAN; q.len()];
                    let mut scratch = AttnScratch::default();
                    attend_rows_at(l, &q, visible, paged, scale, &mut out, &mut scratch);
                    let held = KvHead {
                        keys: &ks.f32,
                        values: &vs.f32,
                        stride,
                        offset,
                    };
                    let want = reference(&q, visible, held, scale);
                    for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (o as f64 - w).abs() < 2e-5,
                            "{l} {kt}/{vt} case {ci} [{i}]: {o} vs {w}"
                        );
                    }
                    if kt != KvType::F32 && vt == kt {
                        // The f32 kernel on the same rounded numbers.
                        let (kw, vw) = (pages_of(&ks.f32, stride), pages_of(&vs.f32, stride));
                        let wide = PagedKvHead {
                            key_pages: KvPages::F32(&kw),
                            value_pages: KvPages::F32(&vw),
                            stride,
                            offset,
                        };
                        let mut same = vec![f32::NAN; q.len()];
                        attend_rows_at(l, &q, visible, wide, scale, &mut same, &mut scratch);
                        assert!(
                            out.iter()
                                .zip(&same)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{l} case {ci}: {kt} pages differ from f32 pages of the same numbers"
                        );
                    }
                }
            }
        }
    }
}
