//! Per-operation time counters for `trit bench --profile`: where a forward pass spends its time
//! (each matmul kind, activation quantization, norms, RoPE, attention, SwiGLU).
//!
//! Off by default. When off, a probe is one relaxed atomic load and a not-taken branch (no clock
//! read), so the counters stay compiled into the release engine at no measurable cost. When on,
//! each probe reads the monotonic clock twice and adds to global atomic counters; probes sit
//! around whole operations (~15 per layer), never inside kernels.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The operations the forward pass is split into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    MatQ,
    MatK,
    MatV,
    MatO,
    MatGate,
    MatUp,
    MatDown,
    /// A hybrid's DeltaNet input projections other than q/k/v (z, and the decay and update
    /// gates' a/b rows).
    MatGates,
    MatHead,
    /// Int8 quantization of activations for the ternary kernels (fused with RMSNorm where the
    /// norm feeds a matmul).
    ActQuant,
    /// RMSNorm not fused with quantization (QK norms, final norm).
    Norm,
    Rope,
    /// Scores, softmax and the weighted sum of values, plus the KV-cache append.
    Attention,
    SwiGlu,
    /// Embedding lookup and residual adds.
    Residual,
    /// A hybrid's DeltaNet mixer between its projections: causal conv, q/k normalization, the
    /// delta rule over the recurrent state and the gated RMSNorm.
    DeltaRule,
}

impl Op {
    pub const ALL: [Op; 16] = [
        Op::MatQ,
        Op::MatK,
        Op::MatV,
        Op::MatO,
        Op::MatGate,
        Op::MatUp,
        Op::MatDown,
        Op::MatGates,
        Op::MatHead,
        Op::ActQuant,
        Op::Norm,
        Op::Rope,
        Op::Attention,
        Op::SwiGlu,
        Op::Residual,
        Op::DeltaRule,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::MatQ => "matmul q",
            Op::MatK => "matmul k",
            Op::MatV => "matmul v",
            Op::MatO => "matmul o",
            Op::MatGate => "matmul gate",
            Op::MatUp => "matmul up",
            Op::MatDown => "matmul down",
            Op::MatGates => "matmul z, a/b",
            Op::MatHead => "matmul head",
            Op::ActQuant => "rmsnorm+act quant",
            Op::Norm => "rmsnorm (qk, final)",
            Op::Rope => "rope",
            Op::Attention => "attention",
            Op::SwiGlu => "swiglu",
            Op::Residual => "embed+residual",
            Op::DeltaRule => "delta rule + conv",
        }
    }

    /// Whether the op is a weight matrix product (its `work` counts multiply-adds).
    pub fn is_matmul(self) -> bool {
        (self as usize) <= Op::MatHead as usize
    }
}

const N_OPS: usize = Op::ALL.len();

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; N_OPS] = [const { AtomicU64::new(0) }; N_OPS];
static CALLS: [AtomicU64; N_OPS] = [const { AtomicU64::new(0) }; N_OPS];
static WORK: [AtomicU64; N_OPS] = [const { AtomicU64::new(0) }; N_OPS];

/// Turns the counters on or off for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Zeroes every counter.
pub fn reset() {
    for i in 0..N_OPS {
        NANOS[i].store(0, Ordering::Relaxed);
        CALLS[i].store(0, Ordering::Relaxed);
        WORK[i].store(0, Ordering::Relaxed);
    }
}

/// Accumulated totals of one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpTotals {
    pub op: Op,
    pub nanos: u64,
    pub calls: u64,
    /// Multiply-adds for matmuls, 0 otherwise.
    pub work: u64,
}

/// The totals of every op since the last `reset`, in `Op::ALL` order.
pub fn snapshot() -> Vec<OpTotals> {
    Op::ALL
        .iter()
        .enumerate()
        .map(|(i, &op)| OpTotals {
            op,
            nanos: NANOS[i].load(Ordering::Relaxed),
            calls: CALLS[i].load(Ordering::Relaxed),
            work: WORK[i].load(Ordering::Relaxed),
        })
        .collect()
}

/// A running probe: adds the time since `start` to its op when dropped (nothing when off).
#[must_use = "the probe measures until it is dropped"]
pub struct Probe(Option<(Op, Instant, u64)>);

/// Starts timing `op`; `work` is the op's multiply-add count (0 for non-matmuls).
#[inline]
pub fn start(op: Op, work: u64) -> Probe {
    if ENABLED.load(Ordering::Relaxed) {
        Probe(Some((op, Instant::now(), work)))
    } else {
        Probe(None)
    }
}

impl Drop for Probe {
    #[inline]
    fn drop(&mut self) {
        if let Some((op, t0, work)) = self.0.take() {
            let i = op as usize;
            NANOS[i].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            CALLS[i].fetch_add(1, Ordering::Relaxed);
            WORK[i].fetch_add(work, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the global counters, so parallel tests cannot interleave with it.
    #[test]
    fn probes_count_only_while_enabled() {
        set_enabled(false);
        reset();
        drop(start(Op::Rope, 0));
        assert!(snapshot().iter().all(|t| t.calls == 0 && t.nanos == 0));
        set_enabled(true);
        {
            let _p = start(Op::MatUp, 1000);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(start(Op::MatUp, 24));
        set_enabled(false);
        // `>=`: a model test running in parallel may add its own probes while this one is on.
        let up = snapshot()[Op::MatUp as usize];
        assert_eq!(up.op, Op::MatUp);
        assert!(up.calls >= 2 && up.work >= 1024, "{up:?}");
        assert!(up.nanos >= 2_000_000, "{} ns", up.nanos);
        assert!(Op::MatHead.is_matmul() && !Op::ActQuant.is_matmul());
    }
}
