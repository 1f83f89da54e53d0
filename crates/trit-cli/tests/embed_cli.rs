//! `trit embed` (llama-embedding's job): one line of values per text or OpenAI's JSON, the
//! vectors llama.cpp gives for the same texts (its fixture, `tools/ref_embeddings.py`), the
//! similarity matrix for several texts, and refusals.

mod common;
use common::{assert_refused, trit};
use serde_json::Value;

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embeddings/default_model.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[test]
fn texts_of_a_file_become_llama_cpps_vectors_one_line_each() {
    let fx = fixture();
    let entries = fx["texts"].as_array().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("texts.txt");
    // The fixture's texts without line breaks inside (the file holds one text per line).
    let single: Vec<&Value> = entries
        .iter()
        .filter(|e| !e["text"].as_str().unwrap().contains('\n'))
        .collect();
    let lines: Vec<&str> = single.iter().map(|e| e["text"].as_str().unwrap()).collect();
    std::fs::write(&file, format!("{}\n\n", lines.join("\n"))).unwrap();
    for pooling in ["mean", "last"] {
        let out = trit()
            .args(["embed", "-t", "1", "--pooling", pooling, "-f"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let rows: Vec<Vec<f64>> = stdout
            .lines()
            .map(|l| l.split(' ').map(|v| v.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), single.len());
        for (row, e) in rows.iter().zip(&single) {
            let want: Vec<f64> = e[pooling]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let c = cosine(row, &want);
            assert!(c > 0.999, "{pooling}: cosine {c}");
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("cosine similarity matrix"), "{stderr}");
    }
}

#[test]
fn json_output_is_openais_reply_and_bad_input_is_refused() {
    let out = trit()
        .args(["embed", "-t", "1", "--json", "Ternary weights"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v: Vec<f64> = reply["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!((v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);
    assert!(reply["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_refused(&["embed", ""], "empty");
    assert_refused(&["embed", "x", "--pooling", "max"], "max");
    assert_refused(
        &["embed", "-c", "4", "one two three four five six seven"],
        "context",
    );
}
