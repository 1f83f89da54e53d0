//! `trit perplexity` follows llama-perplexity's convention: on the same GGUF and text, the
//! final estimate must be within 1% of llama.cpp's (tests/fixtures/smollm2/reference.json).

use std::path::PathBuf;
use std::process::Command;

fn cache() -> PathBuf {
    std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"))
}

#[test]
fn perplexity_matches_llama_perplexity() {
    let model = cache().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = cache().join("texts/prideprejudice.txt");
    if !model.exists() || !text.exists() {
        eprintln!("SKIPPED: SmolLM2 or the Austen text is absent (run tools/fetch_assets.sh)");
        return;
    }
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/smollm2/reference.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    // The flash-attention-off run: trit's attention is plain f32 softmax attention.
    let expected = r["llama_perplexity_fa_off"]["final_ppl"].as_f64().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trit"))
        .args(["perplexity", "-c", "512", "--chunks", "4", "--model"])
        .arg(&model)
        .arg("--file")
        .arg(&text)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate in {stdout}"));
    let ppl: f64 = line["Final estimate: PPL = ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let rel = (ppl - expected).abs() / expected;
    assert!(
        rel < 0.01,
        "trit {ppl} vs llama-perplexity {expected} ({:.2}%)",
        rel * 100.0
    );
    assert!(stdout.starts_with("[1]"), "{stdout}");
}
