//! `trit bench --profile`: the engine's per-op counters (`trit::profile`) over the timed
//! repetitions of one test, printed as a table of where the time goes.

use std::io::Write;
use trit::kernels::peak::{self, Peak};
use trit::profile::{self, OpTotals};

/// Counters of one test's timed repetitions.
pub struct TestProfile {
    pub name: String,
    /// Tokens processed per repetition.
    pub tokens: usize,
    pub reps: usize,
    /// Wall time of all repetitions.
    pub total_ns: u64,
    pub ops: Vec<OpTotals>,
    pub threads: usize,
    /// This CPU's int8 dot-product peak: one thread, and the sum over `threads` at once.
    pub peak: Option<(Peak, f64)>,
}

/// Starts counting for one test (clears what earlier tests left).
pub fn begin() {
    profile::reset();
    profile::set_enabled(true);
}

/// Stops counting, collects the totals and measures the int8 peak on `threads` threads.
pub fn end(name: String, tokens: usize, reps: usize, total_ns: u64, threads: usize) -> TestProfile {
    profile::set_enabled(false);
    TestProfile {
        name,
        tokens,
        reps,
        total_ns,
        ops: profile::snapshot(),
        threads,
        peak: peak::measure_threads(threads),
    }
}

/// One table row: name, time per token (µs), share of the wall time, calls per token,
/// throughput (matmuls: GMAC/s; 64-wide int8 dot products per second = GMAC/s ÷ 64).
struct Row<'a> {
    name: &'a str,
    ns: u64,
    calls: Option<f64>,
    gmacs: Option<f64>,
}

fn line(out: &mut dyn Write, r: Row, total_ns: u64, per_tok: f64) -> std::io::Result<()> {
    let us = r.ns as f64 / 1e3 / per_tok;
    let share = 100.0 * r.ns as f64 / total_ns.max(1) as f64;
    let calls = r.calls.map_or(String::new(), |c| format!("{c:.1}"));
    let rate = r.gmacs.map_or(String::new(), |g| format!("{g:.1}"));
    let name = r.name;
    writeln!(
        out,
        "| {name:<20} | {us:>11.1} | {share:>5.1} % | {calls:>9} | {rate:>7} |"
    )
}

/// Prints the table of one test to `out`. Time no probe covers (pool wake-ups between ops,
/// allocation, the bench loop) is the "unaccounted" row.
pub fn print(out: &mut dyn Write, p: &TestProfile) -> std::io::Result<()> {
    let per_tok = (p.tokens * p.reps).max(1) as f64;
    let total = p.total_ns;
    writeln!(out)?;
    writeln!(
        out,
        "profile of {} ({} timed runs, {:.1} tok/s with the probes on):",
        p.name,
        p.reps,
        per_tok * 1e9 / total.max(1) as f64
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| op                   |    µs/token |   share | calls/tok |  GMAC/s |"
    )?;
    writeln!(
        out,
        "| -------------------- | ----------: | ------: | --------: | ------: |"
    )?;
    let (mut covered, mut mm_ns, mut mm_work) = (0u64, 0u64, 0u64);
    for t in p.ops.iter().filter(|t| t.calls > 0) {
        covered += t.nanos;
        if t.op.is_matmul() {
            mm_ns += t.nanos;
            mm_work += t.work;
        }
        let r = Row {
            name: t.op.name(),
            ns: t.nanos,
            calls: Some(t.calls as f64 / per_tok),
            gmacs: t
                .op
                .is_matmul()
                .then(|| t.work as f64 / t.nanos.max(1) as f64),
        };
        line(out, r, total, per_tok)?;
    }
    let rows = [
        Row {
            name: "unaccounted",
            ns: total.saturating_sub(covered),
            calls: None,
            gmacs: None,
        },
        Row {
            name: "all matmuls",
            ns: mm_ns,
            calls: None,
            gmacs: Some(mm_work as f64 / mm_ns.max(1) as f64),
        },
        Row {
            name: "total",
            ns: total,
            calls: None,
            gmacs: None,
        },
    ];
    for r in rows {
        line(out, r, total, per_tok)?;
    }
    if let Some((pk, all)) = &p.peak {
        let reached = mm_work as f64 / mm_ns.max(1) as f64;
        writeln!(
            out,
            "\nint8 dot-product peak ({}, register operands only): {:.0} GMAC/s per thread, \
             {all:.0} GMAC/s on {} threads at once; the matmuls above reach {:.0} % of it",
            pk.instruction,
            pk.gmacs(),
            p.threads,
            100.0 * reached / all.max(1e-9)
        )?;
    }
    Ok(())
}
