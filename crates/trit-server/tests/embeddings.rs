//! `POST /v1/embeddings` over HTTP on the default model: the texts of llama.cpp's fixture
//! (`tools/ref_embeddings.py`) come back as its embeddings (cosine ≥ 0.999, each pooling
//! kind), tokenized as llama.cpp tokenized them (the usage counts its ids); token-id inputs,
//! base64 vectors and the refusals.

mod common;
use common::*;
use serde_json::{json, Value};
use trit::engine::Pooling;

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embeddings/default_model.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// The standard base64 alphabet decoded (what OpenAI's client does with base64 vectors).
fn unbase64(s: &str) -> Vec<u8> {
    let digit = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n = quad
            .iter()
            .map(|&c| if c == b'=' { 0 } else { digit(c) })
            .fold(0u32, |n, d| n << 6 | d);
        out.extend(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

#[test]
fn texts_come_back_as_llama_cpps_embeddings_for_each_pooling() {
    let fx = fixture();
    let texts: Vec<&str> = fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    let n_ids: usize = fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ids"].as_array().unwrap().len())
        .sum();
    for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
        let server = start(Options {
            pooling,
            ..Options::default()
        });
        let r = post(
            server.addr,
            "/v1/embeddings",
            &json!({"model": "default", "input": texts}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let body = r.json();
        assert_eq!(body["object"], "list");
        assert_eq!(body["usage"]["prompt_tokens"], n_ids);
        assert_eq!(body["usage"]["total_tokens"], n_ids);
        let data = body["data"].as_array().unwrap();
        assert_eq!(data.len(), texts.len());
        for (i, (d, e)) in data.iter().zip(fx["texts"].as_array().unwrap()).enumerate() {
            assert_eq!(
                (d["object"].as_str(), d["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            let c = cosine(&floats(&d["embedding"]), &floats(&e[pooling.name()]));
            assert!(c > 0.999, "{} text {i}: cosine {c}", pooling.name());
        }
    }
}

#[test]
fn token_ids_and_base64_give_the_same_vectors() {
    let fx = fixture();
    let entry = &fx["texts"][1];
    let server = start(Options::default());
    let by_text = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": entry["text"]}),
    )
    .json();
    let want = floats(&by_text["data"][0]["embedding"]);
    let by_ids = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": entry["ids"]}),
    )
    .json();
    assert_eq!(floats(&by_ids["data"][0]["embedding"]), want);
    let lists = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": [entry["ids"], [5, 6, 7]], "encoding_format": "base64"}),
    )
    .json();
    let bytes = unbase64(lists["data"][0]["embedding"].as_str().unwrap());
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, want);
    assert_eq!(
        lists["usage"]["prompt_tokens"],
        entry["ids"].as_array().unwrap().len() + 3
    );
    // The llama.cpp-style path without /v1 answers the same.
    let plain = post(server.addr, "/embeddings", &json!({"input": entry["text"]})).json();
    assert_eq!(floats(&plain["data"][0]["embedding"]), want);
}

#[test]
fn bad_embedding_requests_are_refused_with_the_reason() {
    let server = start(Options {
        n_ctx: 16,
        ..Options::default()
    });
    let refused = |body: Value, status: u16, words: &str| {
        let r = post(server.addr, "/v1/embeddings", &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(words), "{body}: {msg}");
    };
    refused(json!({"input": []}), 400, "no texts");
    refused(json!({"input": ""}), 400, "no tokens");
    refused(json!({"input": [[1, 2], []]}), 400, "input 1 has no tokens");
    refused(
        json!({"input": [1, 99999999]}),
        400,
        "outside the vocabulary",
    );
    refused(
        json!({"input": "x", "encoding_format": "hex"}),
        400,
        "encoding_format",
    );
    refused(json!({"input": "x", "dimensions": 7}), 400, "dimensions");
    refused(
        json!({"input": "x", "model": "other"}),
        404,
        "does not exist",
    );
    refused(json!({"input": "x", "pooling": "max"}), 400, "pooling");
    refused(json!({"input": 5}), 400, "input");
    refused(json!({"input": "word ".repeat(40)}), 400, "context");
}
