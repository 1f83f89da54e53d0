//! Rotated (Bonsai 2) and hybrid files that must be refused with a clear message instead of
//! running without their rotation: each test breaks one thing in a generated `tiny-prism`
//! pack (formats.md §3.6, §8, §11).

use serde_json::Value;
use std::path::{Path, PathBuf};
use trit::format::testgen::hybrid::{generate, HybridPreset};
use trit::format::testgen::TokenizerAssets;
use trit::model::Model;

fn pack() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    generate(&p, 0, dir.path(), &TokenizerAssets::Placeholder).unwrap();
    let path = dir.path().join("mlx");
    (dir, path)
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Opens and loads; the error text of whichever step refuses.
fn load_err(dir: &Path) -> String {
    let files = match trit::format::open(dir) {
        Ok(f) => f,
        Err(e) => return e.to_string(),
    };
    match Model::load(&files, 1) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites the bytes of tensor `name` in the folder's safetensors file.
fn edit_tensor(dir: &Path, name: &str, edit: impl FnOnce(&mut [u8])) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = &header[name]["data_offsets"];
    let (a, b) = (
        off[0].as_u64().unwrap() as usize,
        off[1].as_u64().unwrap() as usize,
    );
    edit(&mut bytes[8 + n + a..8 + n + b]);
    std::fs::write(&path, bytes).unwrap();
}

/// Renames a tensor in the header (same length, so offsets stay valid).
fn rename_tensor(dir: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let renamed = header.replace(&format!("\"{from}\""), &format!("\"{to}\""));
    assert_ne!(header, renamed, "{from} not in the header");
    bytes[8..8 + n].copy_from_slice(renamed.as_bytes());
    std::fs::write(&path, bytes).unwrap();
}

const QKV: &str = "language_model.model.layers.0.linear_attn.in_proj_qkv";

#[test]
fn the_generated_pack_loads() {
    let (_t, dir) = pack();
    let files = trit::format::open(&dir).unwrap();
    assert!(
        files.format_name.contains("Hadamard-rotated"),
        "{}",
        files.format_name
    );
    Model::load(&files, 1).unwrap();
}

#[test]
fn rotated_pack_read_as_plain_qwen3_5_is_refused() {
    let (_t, dir) = pack();
    edit_config(&dir, |c| c["model_type"] = "qwen3_5".into());
    let e = load_err(&dir);
    assert!(e.contains("signs") && e.contains("rotation"), "{e}");
}

#[test]
fn broken_manifests_are_refused() {
    type Edit = fn(&mut Value);
    let cases: [(Edit, &str); 7] = [
        (
            |c| {
                c.as_object_mut().unwrap().remove("modules");
            },
            "manifest",
        ),
        (|c| c["modules"][1]["block"] = 256.into(), "block 256"),
        (|c| c["modules"][1]["block"] = 2048.into(), "not a multiple"),
        (|c| c["modules"][1]["block"] = 0.into(), "no rotated module"),
        (
            |c| c["quantization"]["group_size"] = 64.into(),
            "quantization must be",
        ),
        (
            |c| c["tensor_namespace"] = "mlx-vlm-qwen3_5".into(),
            "tensor_namespace",
        ),
        (|c| c["modules"][0]["embedding"] = false.into(), "embedding"),
    ];
    for (edit, want) in cases {
        let (_t, dir) = pack();
        edit_config(&dir, edit);
        let e = load_err(&dir);
        assert!(e.contains(want), "expected '{want}' in: {e}");
    }
}

#[test]
fn bad_sign_vectors_are_refused() {
    let (_t, dir) = pack();
    edit_tensor(&dir, &format!("{QKV}.signs"), |b| {
        b[..4].copy_from_slice(&0.5f32.to_le_bytes())
    });
    let e = load_err(&dir);
    assert!(
        e.contains("exactly -1 or +1") && e.contains("in_proj_qkv"),
        "{e}"
    );

    let (_t, dir) = pack();
    rename_tensor(&dir, &format!("{QKV}.signs"), &format!("{QKV}.signz"));
    let e = load_err(&dir);
    assert!(e.contains("missing Hadamard sign vector"), "{e}");
}

#[test]
fn rotation_of_a_weight_the_graph_does_not_rotate_is_refused() {
    let (_t, dir) = pack();
    // ssm_alpha (in_proj_a) is never rotated in Bonsai 2; a manifest that says otherwise
    // contradicts the graph.
    edit_config(&dir, |c| {
        let path = "model.layers.0.linear_attn.in_proj_a";
        c["modules"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"path": path, "embedding": false,
                                     "dtype": "float16", "block": 512}));
    });
    let e = load_err(&dir);
    assert!(e.contains("in_proj_a"), "{e}");
}
