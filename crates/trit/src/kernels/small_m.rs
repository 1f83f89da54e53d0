//! Small-M ternary GEMM: 2..=`SMALL_M_MAX` activation rows (batched decode of several
//! sequences, short prefill chunks) against a `TernaryMatrix`.
//!
//! Why a separate path: one token is memory-bound (the matvec reads every weight byte for one
//! row), a long prefill is compute-bound with its activations streamed in L2-sized token
//! blocks. A handful of rows sits in between: every weight tile must be loaded and unpacked
//! **once** for all rows (weights dominate the memory traffic), and the kernel must run close
//! to the int8 dot-product peak because 8 rows already make it compute-bound on a small
//! machine. What differs from the prefill GEMM:
//! - the activations are re-laid out once per quantization into a *panel* (below) where the
//!   4-byte groups that one `vpdpbusd` broadcasts for the `PANEL_ROWS` rows are adjacent: a
//!   code chunk's 32 broadcasts for 8 rows come from 128 contiguous bytes addressed off one
//!   pointer (no per-row pointer arithmetic, 2 cache lines instead of 8), and the per-block
//!   sums and scales of the rows are adjacent too;
//! - the block sums initialize the integer accumulators (`−Σq`), so no correction is
//!   subtracted per row and block;
//! - all rows of a tile run against its unpacked codes before the next tile (no token
//!   blocking: the ≤ 16 rows of activations stay in L1).
//!
//! # Panel layout
//! Rows are taken in groups of `PANEL_ROWS`; a last partial group is padded with zero rows
//! (q = 0, Σq = 0, d = 0) whose results are never stored. For group `g`, block `b` (64
//! columns), column quad `k4` (columns `4·k4 .. 4·k4+4` of the block) and row `t` of the group,
//! the 4 int8 activations sit at byte `(((g·blocks + b)·16 + k4)·PANEL_ROWS + t)·4` of `qs`;
//! the row's block scale and negated block sum at `(g·blocks + b)·PANEL_ROWS + t` of `d` and
//! `neg_sums`.

use super::act::{ActQ8, ACT_BLOCK};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most rows that take the small-M path (more go to the prefill GEMM).
pub(crate) const SMALL_M_MAX: usize = 16;
/// Rows per panel group (the AVX-512 kernel's register block: 8 integer + 8 float accumulators).
pub(crate) const PANEL_ROWS: usize = 8;
/// Column quads per 64-column block.
const QUADS: usize = ACT_BLOCK / 4;

/// Activations of ≤ `SMALL_M_MAX` rows in the panel layout (see the module docs).
#[derive(Default)]
pub(crate) struct Panel {
    /// Rows it was built for (0 = not built).
    pub(crate) n: usize,
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    /// `−Σq` per row and block: the integer accumulators' initial value.
    pub(crate) neg_sums: Vec<i32>,
}

impl Panel {
    /// Groups of `PANEL_ROWS` rows.
    pub(crate) fn groups(&self) -> usize {
        self.n.div_ceil(PANEL_ROWS)
    }

    /// Rebuilds the panel from the row-major quantized activations of `xq` (when `xq` holds
    /// 2..=`SMALL_M_MAX` rows of a quantized width; otherwise marks it empty).
    pub(crate) fn build(&mut self, xq_n: usize, cols: usize, qs: &[i8], d: &[f32], sums: &[i32]) {
        self.n = 0;
        if !(2..=SMALL_M_MAX).contains(&xq_n) || qs.len() != xq_n * cols || cols == 0 {
            return;
        }
        let blocks = cols / ACT_BLOCK;
        let groups = xq_n.div_ceil(PANEL_ROWS);
        let per_group = blocks * PANEL_ROWS;
        self.qs.clear();
        self.qs.resize(groups * per_group * ACT_BLOCK, 0);
        self.d.clear();
        self.d.resize(groups * per_group, 0.0);
        self.neg_sums.clear();
        self.neg_sums.resize(groups * per_group, 0);
        for t in 0..xq_n {
            let (g, tg) = (t / PANEL_ROWS, t % PANEL_ROWS);
            for b in 0..blocks {
                let gb = g * blocks + b;
                let src = &qs[t * cols + b * ACT_BLOCK..][..ACT_BLOCK];
                for (k4, quad) in src.chunks_exact(4).enumerate() {
                    let at = ((gb * QUADS + k4) * PANEL_ROWS + tg) * 4;
                    self.qs[at..at + 4].copy_from_slice(quad);
                }
                self.d[gb * PANEL_ROWS + tg] = d[t * blocks + b];
                self.neg_sums[gb * PANEL_ROWS + tg] = -sums[t * blocks + b];
            }
        }
        self.n = xq_n;
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the small-M path off (`false`: 2..=16 rows go to the prefill GEMM) or back on, for
/// side-by-side benchmarks in one process (`examples/kernel_bench.rs --step --rows 1,8`).
#[doc(hidden)]
pub fn set_small_m_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether `xq` takes the small-M path (its panel is built).
pub(crate) fn applies(xq: &ActQ8) -> bool {
    xq.n >= 2 && xq.panel.n == xq.n && ENABLED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panel_holds_every_activation_once_at_its_documented_place() {
        for (n, cols) in [(2, 64), (8, 128), (11, 192), (16, 64)] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1 + i % 5) as f32)
                .collect();
            let a = ActQ8::quantize(&x, n, cols);
            assert!(applies(&a), "n = {n}");
            let p = &a.panel;
            let blocks = cols / 64;
            assert_eq!(p.groups(), n.div_ceil(PANEL_ROWS));
            for t in 0..p.groups() * PANEL_ROWS {
                let (g, tg) = (t / PANEL_ROWS, t % PANEL_ROWS);
                for b in 0..blocks {
                    let gb = g * blocks + b;
                    let (d, s) = (p.d[gb * PANEL_ROWS + tg], p.neg_sums[gb * PANEL_ROWS + tg]);
                    if t < n {
                        assert_eq!((d, -s), (a.d[t * blocks + b], a.sums[t * blocks + b]));
                    } else {
                        assert_eq!((d, s), (0.0, 0));
                    }
                    for k in 0..64 {
                        let at = ((gb * QUADS + k / 4) * PANEL_ROWS + tg) * 4 + k % 4;
                        let want = if t < n {
                            a.qs[t * cols + b * 64 + k]
                        } else {
                            0
                        };
                        assert_eq!(p.qs[at], want, "n={n} t={t} b={b} k={k}");
                    }
                }
            }
        }
        // One row, or more than SMALL_M_MAX rows: no panel.
        assert!(!applies(&ActQ8::quantize(&[0.5; 64], 1, 64)));
        assert!(!applies(&ActQ8::quantize(&[0.5; 17 * 64], 17, 64)));
    }
}
