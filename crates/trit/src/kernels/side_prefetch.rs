//! Prefetching memory that a later phase will read while a compute-bound phase runs.
//!
//! Why: in a batched decode step the small-M matmuls are bound by int8 arithmetic, leaving
//! memory bandwidth idle, while attention right after them is bound by reading every
//! sequence's keys and values (f32, 229 KB per cached token on the 1.7B shape: 130 MB per step
//! for 8 sequences at 70 tokens, from DRAM since it exceeds the last-level cache). The MLP of
//! layer `l` can pull layer `l + 1`'s cache rows towards the cores while it computes, so that
//! attention finds them in cache. Threads issue the prefetches as they claim matmul chunks, a
//! share proportional to the chunk's size, so the extra traffic is spread over the whole call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns side prefetching off (`advance` does nothing) or back on, for side-by-side
/// benchmarks (`examples/batch_throughput.rs --no-kv-prefetch`).
#[doc(hidden)]
pub fn set_side_prefetch_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

const LINE_FLOATS: usize = 16;

/// Regions to prefetch, walked once in order by all threads together.
pub struct SidePrefetch<'a> {
    regions: Vec<&'a [f32]>,
    /// First line of each region in the walk, and the total.
    first_line: Vec<usize>,
    next: AtomicUsize,
}

impl<'a> SidePrefetch<'a> {
    pub fn new(regions: Vec<&'a [f32]>) -> Self {
        let mut first_line = Vec::with_capacity(regions.len() + 1);
        first_line.push(0);
        for r in &regions {
            first_line.push(first_line.last().unwrap() + r.len().div_ceil(LINE_FLOATS));
        }
        SidePrefetch {
            regions,
            first_line,
            next: AtomicUsize::new(0),
        }
    }

    /// Cache lines of all regions.
    pub fn lines(&self) -> usize {
        *self.first_line.last().unwrap()
    }

    /// Cache lines not yet claimed by `advance`.
    pub fn remaining(&self) -> usize {
        self.lines()
            .saturating_sub(self.next.load(Ordering::Relaxed))
    }

    /// Claims the next `lines` lines of the walk (fewer at its end) and prefetches them.
    pub(crate) fn advance(&self, lines: usize) {
        if lines == 0 || !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        let total = self.lines();
        let start = self.next.fetch_add(lines, Ordering::Relaxed).min(total);
        let end = (start + lines).min(total);
        if start >= end {
            return;
        }
        // The region holding `start`, then line by line across region ends.
        let mut ri = self.first_line.partition_point(|&f| f <= start) - 1;
        let mut line = start;
        while line < end {
            while line >= self.first_line[ri + 1] {
                ri += 1;
            }
            let at = (line - self.first_line[ri]) * LINE_FLOATS;
            prefetch(&self.regions[ri][at..]);
            line += 1;
        }
    }
}

#[inline(always)]
fn prefetch(p: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint never faults; the address is inside `p`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.as_ptr().cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_covers_every_line_once_across_regions() {
        let (a, b, c) = (vec![0f32; 40], vec![0f32; 16], vec![0f32; 1]);
        let s = SidePrefetch::new(vec![&a, &b, &c, &[]]);
        // 3 + 1 + 1 lines.
        assert_eq!(s.lines(), 5);
        s.advance(2);
        assert_eq!(s.remaining(), 3);
        s.advance(10);
        assert_eq!(s.remaining(), 0);
        s.advance(1);
        assert_eq!(s.remaining(), 0);
        assert_eq!(SidePrefetch::new(vec![]).lines(), 0);
    }
}
