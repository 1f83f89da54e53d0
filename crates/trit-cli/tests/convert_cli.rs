//! `trit convert` and `--adapter` through the binary: the JSON report, the exit status of
//! refused requests, and adapter errors on the commands that load a model.

use std::path::Path;
use std::process::Command;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::quant::GgmlType;

fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    c.env_remove("TRIT_MODEL").env_remove("TRIT_ADAPTER");
    c
}

/// The `tiny` shapes with a 512-row vocabulary, as PQ2_0 GGUF.
fn small_model(dir: &Path) -> std::path::PathBuf {
    let p = Preset {
        vocab: 512,
        bos: 500,
        eos: 501,
        pad: 500,
        ..Preset::by_name("tiny").unwrap()
    };
    let f = OutFormat::Gguf(GgmlType::PQ2_0);
    generate(&p, 0, dir, &[f], &TokenizerAssets::Placeholder).unwrap();
    dir.join(f.file_name())
}

#[test]
fn convert_prints_a_json_report_and_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let dst = dir.path().join("out.gguf");
    let out = trit()
        .args(["convert", "--to", "gguf-tq1", "--json"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["target"], "GGUF TQ1_0");
    assert_eq!(r["lossy"], false);
    let tensors = r["tensors"].as_array().unwrap();
    let ternary = tensors.iter().filter(|t| t["to"] == "TQ1_0").count();
    assert_eq!(ternary, 1 + 4 * 7, "embedding + 7 projections × 4 layers");
    assert!(tensors
        .iter()
        .all(|t| t["error"].is_null() || t["error"]["max_rel"] == 0.0));
    assert!(dst.exists());

    for (args, want) in [
        (vec!["--to", "gguf-q4"], "unknown target"),
        (vec!["--to", "mlx", "--adapter", "x"], "--quantize"),
    ] {
        let out = trit()
            .arg("convert")
            .args(&args)
            .arg(&src)
            .arg(dir.path().join("o"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && !err.contains("panicked"), "{err}");
    }
    // A folder with no config.json is not a full-precision model.
    let out = trit()
        .args(["convert", "--quantize", "--to", "mlx"])
        .arg(dir.path())
        .arg(dir.path().join("q"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
}

#[test]
fn a_missing_adapter_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let out = trit()
        .args([
            "run",
            "-n",
            "1",
            "--adapter",
            "/nonexistent/adapter",
            "--model",
        ])
        .arg(&src)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/adapter") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn run_applies_an_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate(
        &p,
        0,
        dir.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let adapter = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/lora/mlx_adapter");
    let run = |with_adapter: bool| {
        let mut c = trit();
        c.args(["run", "--raw", "--temp", "0", "-n", "4", "--model"])
            .arg(dir.path().join("mlx"));
        if with_adapter {
            c.arg("--adapter").arg(&adapter);
        }
        let out = c.arg("<t1> <t2> <t3>").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The placeholder vocabulary decodes to nothing; what matters is that both load and run
    // (the adapter's effect on logits is checked against mlx-lm in lora_reference.rs).
    for with_adapter in [false, true] {
        assert!(run(with_adapter).contains("Generation: 4 tokens"));
    }
}
