//! `/metrics` in the Prometheus text format: llama.cpp's names under `trit:` (conventions.md
//! §2) from the scheduler's counters, plus request counts, the KV cache and a histogram of
//! time to first token measured here (submission → first token).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use trit::engine::SchedulerStats;

/// Upper bounds of the time-to-first-token buckets, seconds.
const TTFT_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Default)]
pub struct Metrics {
    pub requests_total: AtomicU64,
    /// Requests answered with a 4xx/5xx error.
    pub requests_failed_total: AtomicU64,
    ttft: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; TTFT_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Metrics {
    pub fn observe_ttft(&self, secs: f64) {
        if let Ok(mut h) = self.ttft.lock() {
            for (c, &b) in h.counts.iter_mut().zip(&TTFT_BUCKETS) {
                if secs <= b {
                    *c += 1;
                }
            }
            h.sum += secs;
            h.count += 1;
        }
    }

    pub fn render(&self, s: &SchedulerStats) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP trit:{name} {help}");
            let _ = writeln!(out, "# TYPE trit:{name} {kind}");
            let _ = writeln!(out, "trit:{name} {value}");
        };
        let per_sec = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            "requests_total",
            "counter",
            "HTTP generation requests received.",
            load(&self.requests_total),
        );
        metric(
            "requests_failed_total",
            "counter",
            "Requests answered with an error.",
            load(&self.requests_failed_total),
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens evaluated.",
            s.prompt_tokens_total as f64,
        );
        metric(
            "prompt_seconds_total",
            "counter",
            "Time spent on prompt steps.",
            s.prompt_seconds_total,
        );
        metric(
            "tokens_predicted_total",
            "counter",
            "Tokens generated.",
            s.tokens_predicted_total as f64,
        );
        metric(
            "tokens_predicted_seconds_total",
            "counter",
            "Time spent on steps that generated tokens.",
            s.tokens_predicted_seconds_total,
        );
        metric(
            "n_decode_total",
            "counter",
            "Batched forward calls.",
            s.n_decode_total as f64,
        );
        metric(
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            per_sec(s.prompt_tokens_total, s.prompt_seconds_total),
        );
        metric(
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput (all sequences together) in tokens/s.",
            per_sec(s.tokens_predicted_total, s.tokens_predicted_seconds_total),
        );
        metric(
            "requests_processing",
            "gauge",
            "Sequences being processed.",
            s.requests_processing as f64,
        );
        metric(
            "requests_deferred",
            "gauge",
            "Requests waiting for a slot.",
            s.requests_deferred as f64,
        );
        let b = &s.kv_blocks;
        metric(
            "kv_cache_tokens",
            "gauge",
            "Positions held by the running sequences.",
            s.kv_tokens as f64,
        );
        metric(
            "kv_blocks_total",
            "gauge",
            "KV blocks the memory budget allows.",
            b.total as f64,
        );
        metric(
            "kv_blocks_used",
            "gauge",
            "KV blocks referenced by running sequences.",
            b.used as f64,
        );
        metric(
            "kv_blocks_cached",
            "gauge",
            "KV blocks of earlier requests kept for prefix reuse (evictable).",
            b.cached as f64,
        );
        metric(
            "kv_block_tokens",
            "gauge",
            "Positions per KV block.",
            b.block_tokens as f64,
        );
        metric(
            "kv_cache_usage_ratio",
            "gauge",
            "KV blocks in use / budget.",
            if b.total > 0 {
                b.used as f64 / b.total as f64
            } else {
                0.0
            },
        );
        metric(
            "kv_cache_bytes",
            "gauge",
            "Bytes of KV blocks in use or cached.",
            ((b.used + b.cached) * b.block_bytes) as f64,
        );
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens served from cached KV blocks instead of evaluated (prefix hits).",
            s.prompt_tokens_cached_total as f64,
        );
        metric(
            "prefix_hits_total",
            "counter",
            "Requests that reused cached KV blocks.",
            s.prefix_hits_total as f64,
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Sequences ended because the client went away.",
            s.cancelled_total as f64,
        );
        metric(
            "draft_tokens_total",
            "counter",
            "Tokens the draft model proposed (speculative decoding).",
            s.draft_tokens_total as f64,
        );
        metric(
            "draft_tokens_accepted_total",
            "counter",
            "Proposed tokens the sampler accepted.",
            s.draft_tokens_accepted_total as f64,
        );

        let name = "trit:time_to_first_token_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from submission to the first generated token."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        if let Ok(h) = self.ttft.lock() {
            for (c, b) in h.counts.iter().zip(&TTFT_BUCKETS) {
                let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
            }
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "{name}_sum {}", h.sum);
            let _ = writeln!(out, "{name}_count {}", h.count);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe_ttft(0.07);
        m.observe_ttft(3.0);
        let text = m.render(&SchedulerStats::default());
        assert!(text.contains("trit:time_to_first_token_seconds_bucket{le=\"0.05\"} 0\n"));
        assert!(text.contains("trit:time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n"));
        assert!(text.contains("trit:time_to_first_token_seconds_bucket{le=\"5\"} 2\n"));
        assert!(text.contains("trit:time_to_first_token_seconds_count 2\n"));
    }
}
