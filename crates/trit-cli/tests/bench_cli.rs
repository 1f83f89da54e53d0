//! `trit bench` output shape (never its speed): llama-bench's JSON fields and markdown header on
//! a tiny generated model, and clear errors for bad flags.

mod common;

use common::ok_stdout;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::quant::GgmlType;

fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    c.env_remove("TRIT_MODEL");
    c
}

/// Writes the `tiny` preset as TQ2_0 GGUF into `dir`; returns the file and its parameter count.
fn tiny_model(dir: &Path) -> (PathBuf, usize) {
    let preset = Preset::by_name("tiny").unwrap();
    let fmt = OutFormat::Gguf(GgmlType::TQ2_0);
    generate(&preset, 3, dir, &[fmt], &TokenizerAssets::Placeholder).unwrap();
    let params = preset
        .tensors()
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    (dir.join(fmt.file_name()), params)
}

#[test]
fn json_output_has_llama_bench_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (model, params) = tiny_model(dir.path());
    let out = trit()
        .args([
            "bench", "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&ok_stdout(&out)).expect("stdout is one JSON document");
    let rows = v.as_array().expect("a JSON array");
    assert_eq!(rows.len(), 2, "one pp and one tg test: {v}");
    let file_size = std::fs::metadata(&model).unwrap().len();
    for (row, (n_prompt, n_gen)) in rows.iter().zip([(8, 0), (0, 4)]) {
        assert_eq!(row["n_prompt"], n_prompt, "{row}");
        assert_eq!(row["n_gen"], n_gen, "{row}");
        assert_eq!(row["n_depth"], 0);
        assert_eq!(row["n_threads"], 1);
        assert_eq!(row["backends"], "CPU");
        assert_eq!(row["model_n_params"].as_u64(), Some(params as u64));
        let size = row["model_size"].as_u64().unwrap();
        assert!(
            size > 0 && size < file_size,
            "tensor bytes {size} vs file {file_size}"
        );
        let ty = row["model_type"].as_str().unwrap();
        assert!(ty.starts_with("qwen3 ") && ty.ends_with(" TQ2_0"), "{ty}");
        assert!(!row["build_commit"].as_str().unwrap().is_empty());
        assert!(row["test_time"].as_str().unwrap().ends_with('Z'));

        let samples_ts = row["samples_ts"].as_array().unwrap();
        let samples_ns = row["samples_ns"].as_array().unwrap();
        assert_eq!(
            (samples_ts.len(), samples_ns.len()),
            (1, 1),
            "-r 1 gives one sample"
        );
        let ts = samples_ts[0].as_f64().unwrap();
        let ns = samples_ns[0].as_f64().unwrap();
        assert!(ts > 0.0 && ns > 0.0);
        // t/s is tokens over time, and the mean of one sample is that sample.
        let tokens = (n_prompt + n_gen) as f64;
        assert!(
            (ts - tokens * 1e9 / ns).abs() <= 1e-6 * ts,
            "{ts} vs {ns} ns"
        );
        assert_eq!(row["avg_ts"].as_f64(), Some(ts));
        assert_eq!(row["stddev_ts"].as_f64(), Some(0.0));
        assert_eq!(row["avg_ns"].as_f64(), Some(ns));

        assert!(row["weights_bytes_per_token"].as_u64().unwrap() > 0);
        assert!(row["peak_rss_bytes"].as_u64().unwrap() > 0);
        assert!(row["kernel_level"].is_string());
    }
}

#[test]
fn markdown_table_matches_llama_bench_columns() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model(dir.path());
    let out = trit()
        .args([
            "bench", "-p", "8", "-n", "2", "-r", "2", "-t", "1", "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let text = ok_stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "| model                          |       size |     params | backend    | threads |            test |                  t/s |"
    );
    assert_eq!(
        lines[1],
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |"
    );
    assert!(
        lines[2].contains("|             pp8 |") && lines[2].contains(" ± "),
        "{text}"
    );
    assert!(lines[3].contains("|             tg2 |"), "{text}");
    assert!(lines[5].starts_with("build: "), "{text}");
    for extra in [
        "peak RSS:",
        "load time:",
        "weights read per token:",
        "kernel level:",
    ] {
        assert!(text.contains(extra), "missing '{extra}' in {text}");
    }
}

fn assert_clear_error(args: &[&str], expect: &str) {
    let out = trit().arg("bench").args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(expect),
        "{args:?}: expected '{expect}' in: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "no table on error");
}

#[test]
fn bad_flags_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    assert_clear_error(&[m, "--no-such-flag"], "--no-such-flag");
    assert_clear_error(&[m, "-p", "abc"], "-p: 'abc' is not a non-negative integer");
    assert_clear_error(&[m, "-r", "0"], "at least one repetition");
    assert_clear_error(&[m, "-p", "0", "-n", "0"], "nothing to measure");
    assert_clear_error(&[m, "-o", "xml"], "xml");
    assert_clear_error(&[m, "-g", "16"], "--format mlx");
    assert_clear_error(&["/nonexistent/model.gguf"], "/nonexistent/model.gguf");
}

/// `--npl`: llama-batched-bench's table, one row per sequence count, its columns consistent
/// (N_KV = B · (PP + TG), T = T_PP + T_TG); flags it does not combine with are clear errors.
#[test]
fn npl_prints_the_batched_bench_table() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let out = trit()
        .args(["bench", m, "--npl", "1,3", "-p", "8", "-n", "4", "-t", "1"])
        .output()
        .unwrap();
    let text = ok_stdout(&out);
    assert!(text.contains("N_KV") && text.contains("S_TG t/s"), "{text}");
    let rows: Vec<Vec<f64>> = text
        .lines()
        .filter(|l| {
            let first = l.trim_start_matches('|').trim_start();
            l.starts_with('|') && first.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(|l| {
            l.split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(|c| c.parse::<f64>().unwrap_or_else(|_| panic!("{c} in {l}")))
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    for (row, b) in rows.iter().zip([1.0, 3.0]) {
        let [pp, tg, rb, n_kv, t_pp, _, t_tg, _, t, _] = row[..] else {
            panic!("10 columns: {row:?}")
        };
        assert_eq!((pp, tg, rb), (8.0, 4.0, b));
        assert_eq!(n_kv, b * 12.0);
        assert!((t - (t_pp + t_tg)).abs() <= 0.0015, "{row:?}");
    }
    assert_clear_error(&[m, "--npl", "1,0"], "at least 1");
    assert_clear_error(
        &[m, "--npl", "2", "--format", "mlx"],
        "--npl is not an mlx flag",
    );
    assert_clear_error(
        &[m, "--npl", "2", "-d", "8"],
        "--npl measures -p and -n only",
    );
    assert_clear_error(&[m, "--npl", "2", "-o", "json"], "markdown");
}

/// `--format mlx` prints mlx_lm.benchmark's lines: the warmup, the settings, one line per trial
/// and the averages, each with its four fields.
#[test]
fn mlx_format_prints_mlx_lm_benchmark_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model(dir.path());
    let out = trit()
        .args([
            "bench", "--format", "mlx", "-p", "8", "-g", "4", "-n", "2", "-t", "1",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let text = ok_stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[0], "Running warmup..", "{text}");
    assert_eq!(
        lines[1], "Timing with prompt_tokens=8, generation_tokens=4, batch_size=1.",
        "{text}"
    );
    for (line, prefix) in lines[2..].iter().zip(["Trial 1:", "Trial 2:", "Averages:"]) {
        assert!(line.starts_with(prefix), "{text}");
        for field in ["prompt_tps=", "generation_tps=", "peak_memory="] {
            assert!(line.contains(field), "{line}");
        }
    }
}
