//! The official `openai` Python client (PyPI, installed by tools/fetch_assets.sh into
//! .cache/openai-client) drives the server: tools/openai_client_check.py asserts on what the
//! client sees. Skipped, with a notice, when that environment is absent.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn client_python() -> Option<PathBuf> {
    let p = match std::env::var_os("TRIT_OPENAI_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("TRIT_CACHE").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
                PathBuf::from,
            );
            cache.join("openai-client/bin/python")
        }
    };
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh)",
            p.display()
        );
        None
    }
}

#[test]
fn official_openai_client_round_trip() {
    let Some(python) = client_python() else {
        return;
    };
    let server = common::start(common::Options::default());
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/openai_client_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{}/v1", server.addr))
        .arg(common::API_KEY)
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("OK"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
}
