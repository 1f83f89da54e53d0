//! Shared pieces of the `trit` binary's integration tests.

#![allow(dead_code)]

pub mod fake_hub;

use std::path::PathBuf;
use std::process::Command;

/// The `trit` binary with the hub and model variables of the calling shell removed.
pub fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    for k in [
        "TRIT_MODEL",
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_TOKEN_PATH",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
    ] {
        c.env_remove(k);
    }
    c
}

/// Runs `trit ARGS` (stdin empty) and asserts that it fails with `says` in its stderr, and
/// not by a panic.
pub fn assert_refused(args: &[&str], says: &str) {
    let out = trit()
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(says) && !err.contains("panicked"),
        "{args:?}: {err}"
    );
}

/// The stdout of a run that must have succeeded (its stderr in the failure message).
pub fn ok_stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "trit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The repository's `.cache` (fixtures, reference venv), `TRIT_CACHE` when set.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TRIT_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// A Python that imports `module`: the reference venv (`.cache/venv`), else one of the
/// client venvs tools/fetch_assets.sh makes; None with the reason printed.
pub fn venv_python_with(module: &str) -> Option<PathBuf> {
    let candidates =
        ["venv", "hub-client", "openai-client"].map(|v| cache_dir().join(v).join("bin/python"));
    let found = candidates.iter().find(|py| {
        py.exists()
            && Command::new(py)
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        eprintln!(
            "SKIPPED: no Python in {} imports {module} (run tools/fetch_assets.sh)",
            cache_dir().display()
        );
    }
    found.cloned()
}

/// Runs `cmd` with `input` on its standard input; its output (standard output and error
/// captured).
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}
