//! Dot products of half-precision weight rows (f16 / bf16 bits) with f32 activations, for
//! `DenseMatrix` rows kept at 2 bytes a value. Each 8 or 16 weights are widened in registers
//! right after their load (bf16: zero-extend and shift into the top half of an f32; f16:
//! `vcvtph2ps`), then dense.rs's own kernel bodies run (`dots_avx2_by` / `dots_avx512_by`: the
//! same accumulators, column steps, tail and final sums), so a product equals the f32 matrix's
//! bit for bit (tested there against the widened f32 matrix) while memory supplies half the
//! bytes.
//! The portable level widens a row into a scratch row and runs the f32 reference instead.

#![cfg(target_arch = "x86_64")]

use super::dense::{dots_avx2_by, dots_avx512_by};
use crate::quant::float::HalfKind;
use std::arch::x86_64::*;

/// `T` dot products of one half-precision row with `xs[t]`. Safety: the CPU has the kernel's
/// features (see [`kernels`]) and every `xs[t]` holds at least `w.len()` values.
pub(super) type HalfDots<const T: usize> = unsafe fn(&[u16], [&[f32]; T]) -> [f32; T];

/// The kernels for rows of `kind` at AVX-512 (`wide`) or AVX2, where this CPU runs them (f16
/// needs F16C at AVX2; AVX-512F converts f16 itself). `None`: widen the row instead.
pub(super) fn kernels(wide: bool, kind: HalfKind) -> Option<(HalfDots<4>, HalfDots<1>)> {
    Some(match (wide, kind) {
        (true, HalfKind::BF16) => (dots_avx512::<4, true>, dots_avx512::<1, true>),
        (true, HalfKind::F16) => (dots_avx512::<4, false>, dots_avx512::<1, false>),
        (false, HalfKind::BF16) => (dots_avx2_bf16::<4>, dots_avx2_bf16::<1>),
        (false, HalfKind::F16) if std::is_x86_feature_detected!("f16c") => {
            (dots_avx2_f16::<4>, dots_avx2_f16::<1>)
        }
        (false, HalfKind::F16) => return None,
    })
}

/// One weight as f32 (the scalar tails).
#[inline(always)]
fn widen1<const BF16: bool>(b: u16) -> f32 {
    if BF16 {
        f32::from_bits((b as u32) << 16)
    } else {
        half::f16::from_bits(b).to_f32()
    }
}

/// 16 weights at `p` as f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16<const BF16: bool>(p: *const u16) -> __m512 {
    let h = _mm256_loadu_si256(p as *const __m256i);
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    } else {
        _mm512_cvtph_ps(h)
    }
}

/// dense.rs `dots_avx512` over half-precision weights (its arithmetic: `dots_avx512_by`).
///
/// # Safety
/// The CPU must support avx512f and fma; every `xs[t]` holds at least `w.len()` values.
#[target_feature(enable = "avx512f,fma")]
unsafe fn dots_avx512<const T: usize, const BF16: bool>(w: &[u16], xs: [&[f32]; T]) -> [f32; T] {
    let wp = w.as_ptr();
    dots_avx512_by(
        w.len(),
        xs,
        |c| load16::<BF16>(wp.add(c)),
        |k| widen1::<BF16>(w[k]),
    )
}

/// 8 bf16 weights at `p` as f32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load8_bf16(p: *const u16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// 8 f16 weights at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8_f16(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// dense.rs `dots_avx2` over bf16 weights (its arithmetic: `dots_avx2_by`).
///
/// # Safety
/// The CPU must support avx2 and fma; every `xs[t]` holds at least `w.len()` values.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2_bf16<const T: usize>(w: &[u16], xs: [&[f32]; T]) -> [f32; T] {
    let wp = w.as_ptr();
    dots_avx2_by(
        w.len(),
        xs,
        |c| load8_bf16(wp.add(c)),
        |k| widen1::<true>(w[k]),
    )
}

/// dense.rs `dots_avx2` over f16 weights.
///
/// # Safety
/// The CPU must support avx2, fma and f16c; every `xs[t]` holds at least `w.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2_f16<const T: usize>(w: &[u16], xs: [&[f32]; T]) -> [f32; T] {
    let wp = w.as_ptr();
    dots_avx2_by(
        w.len(),
        xs,
        |c| load8_f16(wp.add(c)),
        |k| widen1::<false>(w[k]),
    )
}
