//! Output of `trit bench`: llama-bench's markdown table, JSON, JSONL and CSV with its field
//! names (so scripts written for llama-bench parse ours), and mlx_lm.benchmark's trial lines.
//! trit's own facts (peak RSS, load time, bytes per token, kernel level, bandwidth) follow the
//! table as plain lines, or are extra fields/columns after llama-bench's.

use super::membw::Bandwidth;
use super::{Measured, RunInfo};
use serde_json::{json, Map, Value};
use std::time::{SystemTime, UNIX_EPOCH};

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Sample standard deviation (n − 1), 0 for fewer than two samples (as llama-bench).
fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// `436.00 MiB` below 1 GiB, else `1.23 GiB`.
fn size_text(bytes: usize) -> String {
    let b = bytes as f64;
    if b < (1u64 << 30) as f64 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    }
}

/// `42.04 M` below 10^9, else `1.72 B`.
fn params_text(n: usize) -> String {
    let n = n as f64;
    if n < 1e9 {
        format!("{:.2} M", n / 1e6)
    } else {
        format!("{:.2} B", n / 1e9)
    }
}

/// Build identification: `TRIT_BUILD_COMMIT` at compile time, else the git HEAD of the source
/// tree this binary was built from, else "unknown"; the number is the commit count.
fn build_info() -> (String, u64) {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !s.is_empty()).then_some(s)
    };
    let commit = option_env!("TRIT_BUILD_COMMIT")
        .map(str::to_string)
        .or_else(|| git(&["rev-parse", "--short=7", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let number = git(&["rev-list", "--count", "HEAD"])
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (commit, number)
}

fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// `2026-11-30T21:09:34Z` (UTC), llama-bench's `test_time`.
fn iso_time(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Bytes read per generated token of a test: the weights plus, on average over its tokens, the
/// KV cache already held.
fn bytes_per_token(info: &RunInfo, m: &Measured) -> f64 {
    let avg_depth = m.test.n_depth as f64 + m.test.n_prompt as f64 + m.test.n_gen as f64 / 2.0;
    info.weight_bytes_per_token as f64 + info.kv_bytes_per_position as f64 * avg_depth
}

/// `(ceiling t/s, fraction reached)` of a generation-only test when bandwidth was measured.
fn ceiling(info: &RunInfo, m: &Measured) -> Option<(f64, f64)> {
    let bw = info.membw.as_ref()?;
    if m.test.n_gen == 0 || m.test.n_prompt > 0 {
        return None;
    }
    let c = bw.best_gbs() * 1e9 / bytes_per_token(info, m);
    Some((c, mean(&m.samples_ts()) / c))
}

/// Markdown rows are printed as each test finishes (like llama-bench), the header first.
#[derive(Default)]
pub struct Markdown {
    header_done: bool,
}

/// (header, width); negative width = left-aligned, as llama-bench's table.
const COLUMNS: [(&str, i32); 7] = [
    ("model", -30),
    ("size", 10),
    ("params", 10),
    ("backend", -10),
    ("threads", 7),
    ("test", 15),
    ("t/s", 20),
];

fn md_line(cells: &[String]) -> String {
    let mut s = String::from("|");
    for ((_, w), c) in COLUMNS.iter().zip(cells) {
        let n = w.unsigned_abs() as usize;
        s += &if *w < 0 {
            format!(" {c:<n$} |")
        } else {
            format!(" {c:>n$} |")
        };
    }
    s
}

impl Markdown {
    pub fn row(&mut self, info: &RunInfo, m: &Measured) {
        if !self.header_done {
            let names: Vec<String> = COLUMNS.iter().map(|(n, _)| n.to_string()).collect();
            println!("{}", md_line(&names));
            let mut sep = String::from("|");
            for (_, w) in COLUMNS {
                let n = w.unsigned_abs() as usize;
                sep += &if w < 0 {
                    format!(" {} |", "-".repeat(n))
                } else {
                    format!(" {}: |", "-".repeat(n - 1))
                };
            }
            println!("{sep}");
            self.header_done = true;
        }
        let ts = m.samples_ts();
        let cells = [
            info.model_type.clone(),
            size_text(info.model_size),
            params_text(info.model_n_params),
            backend(info).to_string(),
            m.test.n_threads.to_string(),
            m.test.name(),
            format!("{:.2} ± {:.2}", mean(&ts), stddev(&ts)),
        ];
        println!("{}", md_line(&cells));
    }

    /// The build line and trit's extra facts.
    pub fn finish(&self, info: &RunInfo, results: &[Measured]) {
        let (commit, number) = build_info();
        println!();
        println!("build: {commit} ({number})");
        if let Some(rss) = info.peak_rss {
            println!(
                "peak RSS: {} (weights {}, largest KV cache {})",
                size_text(rss as usize),
                size_text(info.model_size),
                size_text(
                    results
                        .iter()
                        .map(|m| m.test.n_depth + m.test.n_prompt + m.test.n_gen)
                        .max()
                        .unwrap_or(0)
                        * info.kv_bytes_per_position
                )
            );
        }
        println!("load time: {:.3} s", info.load_secs);
        println!(
            "weights read per token: {} ({:.3} GB), KV cache {:.1} KiB per cached position",
            size_text(info.weight_bytes_per_token),
            info.weight_bytes_per_token as f64 / 1e9,
            info.kv_bytes_per_position as f64 / 1024.0
        );
        println!("kernel level: {}", info.kernel_level);
        if let Some(bw) = &info.membw {
            membw_summary(bw);
            for m in results {
                if let Some((c, f)) = ceiling(info, m) {
                    println!(
                        "decode ceiling {}: {:.2} t/s ({:.3} GB per token at {:.2} GB/s); reached {:.2} t/s = {:.1} % of it",
                        m.test.name(),
                        c,
                        bytes_per_token(info, m) / 1e9,
                        bw.best_gbs(),
                        c * f,
                        100.0 * f
                    );
                }
            }
        }
    }
}

fn membw_summary(bw: &Bandwidth) {
    println!(
        "memory read bandwidth ({} threads, {} buffer, {} passes, {}): best {:.2} GB/s, median {:.2} GB/s (other method: best {:.2} GB/s)",
        bw.threads,
        size_text(bw.buffer_bytes),
        bw.passes_gbs.len(),
        bw.method,
        bw.best_gbs(),
        bw.median_gbs(),
        bw.other_best_gbs
    );
}

/// Bandwidth lines after an mlx-style report (`tps` = the measured generation speed).
pub fn membw_lines(bw: &Bandwidth, bytes_per_token: f64, tps: Option<f64>) {
    membw_summary(bw);
    let c = bw.best_gbs() * 1e9 / bytes_per_token;
    match tps {
        Some(t) => println!(
            "decode ceiling: {c:.2} t/s ({:.3} GB per token); reached {t:.2} t/s = {:.1} % of it",
            bytes_per_token / 1e9,
            100.0 * t / c
        ),
        None => println!("decode ceiling: {c:.2} t/s"),
    }
}

/// One result as llama-bench's JSON object (same field names and order for the fields that
/// apply to a CPU engine), then trit's extras.
fn record(
    info: &RunInfo,
    m: &Measured,
    commit: &str,
    number: u64,
    cpu: &str,
) -> Map<String, Value> {
    let ts = m.samples_ts();
    let ns: Vec<f64> = m.samples_ns.iter().map(|&v| v as f64).collect();
    let v = json!({
        "build_commit": commit,
        "build_number": number,
        "cpu_info": cpu,
        "gpu_info": "",
        "backends": backend(info),
        "model_filename": info.model_filename,
        "model_type": info.model_type,
        "model_size": info.model_size,
        "model_n_params": info.model_n_params,
        "n_batch": info.ubatch,
        "n_ubatch": info.ubatch,
        "n_threads": m.test.n_threads,
        "type_k": info.kv_types.k.name(),
        "type_v": info.kv_types.v.name(),
        "n_gpu_layers": 0,
        "n_prompt": m.test.n_prompt,
        "n_gen": m.test.n_gen,
        "n_depth": m.test.n_depth,
        "test_time": iso_time(m.test_time),
        "avg_ns": mean(&ns).round() as u64,
        "stddev_ns": stddev(&ns).round() as u64,
        "avg_ts": mean(&ts),
        "stddev_ts": stddev(&ts),
        "samples_ns": m.samples_ns,
        "samples_ts": ts,
        "kernel_level": info.kernel_level,
        "load_time_s": info.load_secs,
        "peak_rss_bytes": info.peak_rss,
        "weights_bytes_per_token": info.weight_bytes_per_token,
        "kv_bytes_per_position": info.kv_bytes_per_position,
    });
    let Value::Object(mut map) = v else {
        unreachable!("json! of an object literal")
    };
    if let Some(bw) = &info.membw {
        map.insert("membw_best_gbs".into(), json!(bw.best_gbs()));
        map.insert("membw_median_gbs".into(), json!(bw.median_gbs()));
        let (c, f) =
            ceiling(info, m).map_or((Value::Null, Value::Null), |(c, f)| (json!(c), json!(f)));
        map.insert("decode_ceiling_ts".into(), c);
        map.insert("ceiling_fraction".into(), f);
    }
    map
}

fn records(info: &RunInfo, results: &[Measured]) -> Vec<Map<String, Value>> {
    let (commit, number) = build_info();
    let cpu = cpu_info();
    results
        .iter()
        .map(|m| record(info, m, &commit, number, &cpu))
        .collect()
}

/// `-o json` (one array) or `-o jsonl` (one object per line).
pub fn json(info: &RunInfo, results: &[Measured], lines: bool) {
    let recs = records(info, results);
    if lines {
        for r in recs {
            println!("{}", Value::Object(r));
        }
    } else {
        let arr = Value::Array(recs.into_iter().map(Value::Object).collect());
        println!(
            "{}",
            serde_json::to_string_pretty(&arr).expect("JSON of plain values")
        );
    }
}

/// `-o csv`: every value quoted, the sample arrays left out (as llama-bench).
pub fn csv(info: &RunInfo, results: &[Measured]) {
    let recs = records(info, results);
    let Some(first) = recs.first() else { return };
    let keys: Vec<&String> = first
        .keys()
        .filter(|k| !k.starts_with("samples_"))
        .collect();
    println!(
        "{}",
        keys.iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    for r in &recs {
        let cells: Vec<String> = keys
            .iter()
            .map(|k| {
                let text = match &r[k.as_str()] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    Value::Bool(b) => u8::from(*b).to_string(),
                    other => other.to_string(),
                };
                format!("\"{}\"", text.replace('"', "\"\""))
            })
            .collect();
        println!("{}", cells.join(","));
    }
}

/// One mlx_lm.benchmark trial.
pub struct MlxTrial {
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub peak_memory_gb: f64,
    pub total_time: f64,
}

pub fn mlx_trial_line(i: usize, t: &MlxTrial) {
    println!(
        "Trial {i}:  prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}, total_time={:.3}",
        t.prompt_tps, t.generation_tps, t.peak_memory_gb, t.total_time
    );
}

pub fn mlx_averages(trials: &[MlxTrial]) {
    let avg = |f: fn(&MlxTrial) -> f64| mean(&trials.iter().map(f).collect::<Vec<_>>());
    println!(
        "Averages: prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
        avg(|t| t.prompt_tps),
        avg(|t| t.generation_tps),
        avg(|t| t.peak_memory_gb)
    );
}

/// llama-bench's backend column.
fn backend(info: &RunInfo) -> &'static str {
    if info.kernel_level == "cuda" {
        "CUDA"
    } else {
        "CPU"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stddev_is_the_sample_one() {
        assert_eq!(stddev(&[5.0]), 0.0);
        // Sample variance of 1, 2, 3, 4 = 5/3.
        assert!((stddev(&[1.0, 2.0, 3.0, 4.0]) - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn sizes_switch_units_like_llama_bench() {
        assert_eq!(size_text(10_850_048), "10.35 MiB");
        assert_eq!(size_text(3 << 30), "3.00 GiB");
        assert_eq!(params_text(42_044_160), "42.04 M");
        assert_eq!(params_text(1_720_000_000), "1.72 B");
    }

    #[test]
    fn iso_time_is_utc_civil_time() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_796_073_774);
        assert_eq!(iso_time(t), "2026-11-30T21:22:54Z");
        assert_eq!(iso_time(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn markdown_cells_align_like_llama_bench() {
        let cells: Vec<String> = [
            "qwen3 1.7B PQ2_0",
            "436.00 MiB",
            "1.72 B",
            "CPU",
            "2",
            "pp512",
            "1.00 ± 0.10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            md_line(&cells),
            "| qwen3 1.7B PQ2_0               | 436.00 MiB |     1.72 B | CPU        |       2 |           pp512 |          1.00 ± 0.10 |"
        );
    }
}
