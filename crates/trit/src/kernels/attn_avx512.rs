//! AVX-512 attention for the few query rows of a decode step (the 1–4 query heads of one
//! grouped-query group against one KV head), `attn::attend_rows_at`'s fast path when
//! `head_dim` is a multiple of 16.
//!
//! Why a separate kernel: the generic form transposes the query rows into lanes, so with 2
//! rows a 16-lane FMA carries 2 useful products and every key element is one broadcast. Here
//! the lanes run along the head dimension instead: a key is `head_dim / 16` loads, each
//! multiplied into every row's accumulator, and one horizontal sum per key and row gives the
//! score. The weighted sum of values loads each value chunk once for all rows. Keys and values
//! of one KV head sit one cache row apart (4 KiB on the 1.7B shape), each in its own 4 KiB
//! page where the hardware prefetchers stop, so both are prefetched in software ahead of use.
//!
//! Keys and values are read in their stored type (f32, or f16 widened exactly by `vcvtph2ps`
//! as they are loaded), so an f16 cache gives bit for bit what an f32 cache holding the same
//! (rounded) numbers gives — half the bytes from memory, the same arithmetic.
//!
//! Same online softmax as the generic form (per `KEY_BLOCK` page: scores, running max, the
//! exponentials of `ops::exp_approx`, running sum); only the summation order of the dot
//! products differs, so results agree to rounding (tested against a direct f64 softmax).
#![cfg(target_arch = "x86_64")]
// Register arrays indexed by row and chunk: index loops keep the accumulators in registers.
#![allow(clippy::needless_range_loop)]

use super::attn::{PagedKvHead, KEY_BLOCK};
use super::kv_type::{KvPages, Q8Page, Q8_BLOCK};
use super::ops::exp_approx;
use half::f16;
use std::arch::x86_64::*;

/// Most query rows per call.
pub(crate) const MAX_ROWS: usize = 4;
/// Keys prefetched ahead of the one being scored.
const PREFETCH_KEYS: usize = 16;

/// One page of keys or values in its stored type: 16 elements load as 16 f32 lanes.
trait Page: Copy {
    /// Elements `at..at + 16` widened to f32 (exactly as `KvPage::read` widens them).
    ///
    /// # Safety
    /// avx512f; the 16 elements are inside the page; `at` a multiple of 16.
    unsafe fn load16(self, at: usize) -> __m512;

    /// Asks for the cache lines of elements `at..at + n`.
    ///
    /// # Safety
    /// The elements are inside the page.
    unsafe fn prefetch(self, at: usize, n: usize);
}

/// Prefetches `bytes` bytes from `p` (whole cache lines).
#[inline(always)]
unsafe fn prefetch_bytes(p: *const u8, bytes: usize) {
    for l in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.add(l).cast());
    }
}

impl Page for &[f32] {
    #[inline(always)]
    unsafe fn load16(self, at: usize) -> __m512 {
        _mm512_loadu_ps(self.as_ptr().add(at))
    }
    #[inline(always)]
    unsafe fn prefetch(self, at: usize, n: usize) {
        prefetch_bytes(self.as_ptr().add(at).cast(), 4 * n)
    }
}

impl Page for &[f16] {
    #[inline(always)]
    unsafe fn load16(self, at: usize) -> __m512 {
        // `f16` is a transparent u16: 16 of them are one unaligned 256-bit load.
        _mm512_cvtph_ps(_mm256_loadu_si256(self.as_ptr().add(at).cast()))
    }
    #[inline(always)]
    unsafe fn prefetch(self, at: usize, n: usize) {
        prefetch_bytes(self.as_ptr().add(at).cast(), 2 * n)
    }
}

impl Page for Q8Page<'_> {
    #[inline(always)]
    unsafe fn load16(self, at: usize) -> __m512 {
        // 16 codes of one 32-element block (`at` is a multiple of 16): `q · d`, one rounding,
        // as `KvPage::read` computes it.
        let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(self.q.as_ptr().add(at).cast()));
        let d = _mm512_set1_ps(*self.d.get_unchecked(at / Q8_BLOCK));
        _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)
    }
    #[inline(always)]
    unsafe fn prefetch(self, at: usize, n: usize) {
        prefetch_bytes(self.q.as_ptr().add(at).cast(), n);
        prefetch_bytes(self.d.as_ptr().add(at / Q8_BLOCK).cast(), 4 * n / Q8_BLOCK);
    }
}

/// `out_r = softmax(scale · q_r · K[..visible[r]]ᵀ) · V[..visible[r]]` for the `rows =
/// visible.len()` ≤ `MAX_ROWS` rows of `q` (`rows × hd`); `qs` is scratch.
///
/// # Safety
/// The CPU must support avx512f. `hd` must be a multiple of 16, every `visible[r]` in
/// `1..=` the keys `kv` holds (checked by the caller).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn attend_few(
    q: &[f32],
    visible: &[usize],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    qs: &mut Vec<f32>,
) {
    // Every pair of stored types, each its own instantiation.
    macro_rules! pairs {
        ($($k:ident $v:ident),*) => {
            match (kv.key_pages, kv.value_pages) {
                $((KvPages::$k(k), KvPages::$v(v)) => typed(q, visible, k, v, kv, scale, out, qs),)*
            }
        };
    }
    pairs!(
        F16 F16, F32 F32, Q8_0 Q8_0,
        F16 F32, F32 F16, F16 Q8_0, Q8_0 F16, F32 Q8_0, Q8_0 F32
    )
}

/// `attend_few` for keys stored as `K` and values as `V`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn typed<K: Page, V: Page>(
    q: &[f32],
    visible: &[usize],
    key_pages: &[K],
    value_pages: &[V],
    kv: PagedKvHead,
    scale: f32,
    out: &mut [f32],
    qs: &mut Vec<f32>,
) {
    let pages = Pages {
        keys: key_pages,
        values: value_pages,
        stride: kv.stride,
        offset: kv.offset,
    };
    match visible.len() {
        1 => attend::<1, K, V>(q, visible, pages, scale, out, qs),
        2 => attend::<2, K, V>(q, visible, pages, scale, out, qs),
        3 => attend::<3, K, V>(q, visible, pages, scale, out, qs),
        _ => attend::<4, K, V>(q, visible, pages, scale, out, qs),
    }
}

/// `PagedKvHead` with its element types known.
#[derive(Clone, Copy)]
struct Pages<'a, K, V> {
    keys: &'a [K],
    values: &'a [V],
    stride: usize,
    offset: usize,
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn attend<const R: usize, K: Page, V: Page>(
    q: &[f32],
    visible: &[usize],
    kv: Pages<K, V>,
    scale: f32,
    out: &mut [f32],
    qs: &mut Vec<f32>,
) {
    let hd = q.len() / R;
    let chunks = hd / 16;
    let most = visible.iter().copied().max().unwrap_or(0);
    qs.clear();
    qs.extend(q.iter().map(|v| v * scale));
    let qp = qs.as_ptr();
    let (stride, offset) = (kv.stride, kv.offset);
    let prefetch_key = |j: usize| {
        kv.keys[j / KEY_BLOCK].prefetch((j % KEY_BLOCK) * stride + offset, hd);
    };
    for j in 0..PREFETCH_KEYS.min(most) {
        prefetch_key(j);
    }
    let mut max = [f32::NEG_INFINITY; R];
    let mut sum = [0f32; R];
    out.fill(0.0);
    let mut s = [[0f32; KEY_BLOCK]; R];
    for j0 in (0..most).step_by(KEY_BLOCK) {
        let kb = (most - j0).min(KEY_BLOCK);
        let keys = kv.keys[j0 / KEY_BLOCK];
        let values = kv.values[j0 / KEY_BLOCK];
        for j in 0..kb {
            if j0 + j + PREFETCH_KEYS < most {
                prefetch_key(j0 + j + PREFETCH_KEYS);
            }
            values.prefetch(offset + j * stride, hd);
            let k = offset + j * stride;
            // Two accumulators per row halve the FMA chain.
            let mut a0 = [_mm512_setzero_ps(); R];
            let mut a1 = [_mm512_setzero_ps(); R];
            for c in (0..chunks - 1).step_by(2) {
                let (k0, k1) = (keys.load16(k + 16 * c), keys.load16(k + 16 * c + 16));
                for r in 0..R {
                    let qr = qp.add(r * hd + 16 * c);
                    a0[r] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(qr), a0[r]);
                    a1[r] = _mm512_fmadd_ps(k1, _mm512_loadu_ps(qr.add(16)), a1[r]);
                }
            }
            if chunks % 2 == 1 {
                let c = chunks - 1;
                let kc = keys.load16(k + 16 * c);
                for r in 0..R {
                    let qc = _mm512_loadu_ps(qp.add(r * hd + 16 * c));
                    a0[r] = _mm512_fmadd_ps(kc, qc, a0[r]);
                }
            }
            for r in 0..R {
                s[r][j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r]));
            }
        }
        // Causal mask, running max, exponentials, running sums: per row over the block, 16
        // scores per register.
        let mut carry = [0f32; R];
        for r in 0..R {
            let seen = visible[r].saturating_sub(j0).min(kb);
            let sr = s[r].as_mut_ptr();
            let lanes = |j: usize| -> __mmask16 {
                let n = seen.saturating_sub(j).min(16);
                ((1u32 << n) - 1) as __mmask16
            };
            let mut block_max = _mm512_set1_ps(f32::NEG_INFINITY);
            for j in (0..kb).step_by(16) {
                let v = _mm512_loadu_ps(sr.add(j));
                block_max = _mm512_mask_max_ps(block_max, lanes(j), block_max, v);
            }
            let new_max = max[r].max(_mm512_reduce_max_ps(block_max));
            // A row sees at least its first key, so `new_max` is finite from the first block on.
            carry[r] = exp_approx(max[r] - new_max);
            let (m, mut block_sum) = (_mm512_set1_ps(new_max), _mm512_setzero_ps());
            for j in (0..kb).step_by(16) {
                let v = _mm512_loadu_ps(sr.add(j));
                let p = _mm512_maskz_mov_ps(lanes(j), exp16(_mm512_sub_ps(v, m)));
                _mm512_storeu_ps(sr.add(j), p);
                block_sum = _mm512_add_ps(block_sum, p);
            }
            sum[r] = sum[r] * carry[r] + _mm512_reduce_add_ps(block_sum);
            max[r] = new_max;
        }
        // o_r = carry_r · o_r + Σ_j p_rj · V_j, C 16-float chunks per pass (R × C accumulator
        // registers), each value chunk loaded once for all rows.
        let mut c0 = 0;
        let wide = if R <= 2 { 8 } else { 4 };
        while c0 + wide <= chunks {
            if R <= 2 {
                add_values::<R, 8, V>(out, hd, c0, &carry, &s, values, offset, stride, kb);
            } else {
                add_values::<R, 4, V>(out, hd, c0, &carry, &s, values, offset, stride, kb);
            }
            c0 += wide;
        }
        for c in c0..chunks {
            add_values::<R, 1, V>(out, hd, c, &carry, &s, values, offset, stride, kb);
        }
    }
    for (o, &sm) in out.chunks_exact_mut(hd).zip(&sum) {
        let inv = 1.0 / sm;
        o.iter_mut().for_each(|v| *v *= inv);
    }
}

/// `o_r[16·c0 .. 16·(c0 + C)] = carry_r · o_r + Σ_{j < kb} p_rj · V_j` over that slice.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn add_values<const R: usize, const C: usize, V: Page>(
    out: &mut [f32],
    hd: usize,
    c0: usize,
    carry: &[f32; R],
    p: &[[f32; KEY_BLOCK]; R],
    values: V,
    offset: usize,
    stride: usize,
    kb: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for r in 0..R {
        let cr = _mm512_set1_ps(carry[r]);
        for (c, a) in acc[r].iter_mut().enumerate() {
            *a = _mm512_mul_ps(
                _mm512_loadu_ps(out.as_ptr().add(r * hd + 16 * (c0 + c))),
                cr,
            );
        }
    }
    for j in 0..kb {
        let v = offset + j * stride + 16 * c0;
        let pj: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(p[r][j]));
        for c in 0..C {
            let vc = values.load16(v + 16 * c);
            for r in 0..R {
                acc[r][c] = _mm512_fmadd_ps(pj[r], vc, acc[r][c]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (c, v) in a.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(r * hd + 16 * (c0 + c)), *v);
        }
    }
}

/// `ops::exp_approx` on 16 lanes, the same operations in the same order (so the same values):
/// `x = n·ln2 + r`, a degree-6 polynomial for `e^r`, `2^n` built in the exponent bits; inputs
/// below -87 give 0.
#[inline(always)]
pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
    let underflow = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let magic = _mm512_set1_ps(12_582_912.0);
    let shifted = _mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        magic,
    );
    let n = _mm512_sub_ps(shifted, magic);
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693_359_4))),
        _mm512_mul_ps(n, _mm512_set1_ps(-2.121_944_4e-4)),
    );
    let step = |p: __m512, c: f32| _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    let p = _mm512_set1_ps(1.987_569_1e-4);
    let p = step(p, 1.398_199_9e-3);
    let p = step(p, 8.333_452e-3);
    let p = step(p, 4.166_579_6e-2);
    let p = step(p, 1.666_666_5e-1);
    let p = step(p, 0.5);
    let er = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
        _mm512_set1_ps(1.0),
    );
    let ni = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B40_0000));
    let two_n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        ni,
        _mm512_set1_epi32(127),
    )));
    _mm512_maskz_mov_ps(!underflow, _mm512_mul_ps(er, two_n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp16_equals_the_scalar_exp_approx() {
        if !super::super::KernelLevel::Avx512.supported() {
            return;
        }
        let xs: Vec<f32> = (0..4000)
            .map(|i| -100.0 + i as f32 * 0.047)
            .chain([0.0, -87.0, -87.5, 88.0, 1000.0, f32::NEG_INFINITY])
            .collect();
        for c in xs.chunks(16) {
            let mut x = [0f32; 16];
            x[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 16];
            // SAFETY: avx512f checked above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(x.as_ptr()))) };
            for (g, &v) in got.iter().zip(&x) {
                assert_eq!(g.to_bits(), exp_approx(v).to_bits(), "exp({v})");
            }
        }
    }
}
