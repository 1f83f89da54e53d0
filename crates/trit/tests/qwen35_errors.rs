//! Rotated (Bonsai 2) and hybrid files that must be refused with a clear message instead of
//! running without their rotation: each test breaks one thing in a generated `tiny-prism`
//! pack (formats.md §3.6, §8, §11).

use serde_json::Value;
use std::path::{Path, PathBuf};
use trit::format::gguf::{GgufFile, Value as GgufValue};
use trit::format::gguf_write::GgufWriter;
use trit::format::testgen::hybrid::{generate, HybridPreset};
use trit::format::testgen::{OutFormat, TokenizerAssets};
use trit::model::Model;

fn pack() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    generate(
        &p,
        0,
        dir.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
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

/// Copies a GGUF file with metadata edited (`edit` returns the new value, or None to drop).
fn rewrite_gguf(src: &Path, dst: &Path, edit: impl Fn(&str, &GgufValue) -> Option<GgufValue>) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if let Some(v) = edit(k, v) {
            w.add(k.clone(), v).unwrap();
        }
    }
    for t in f.tensors() {
        w.add_tensor(t.name.clone(), &t.shape, t.ty, f.tensor_data(t).to_vec())
            .unwrap();
    }
    w.write_file(dst).unwrap();
}

#[test]
fn broken_rotation_metadata_in_gguf_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 0, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(q2.file_name());
    Model::load(&trit::format::open(&src).unwrap(), 1).unwrap();
    let dst = dir.path().join("broken.gguf");
    type Edit = fn(&str, &GgufValue) -> Option<GgufValue>;
    let key = |k: &str| format!("prism.hadamard.{k}");
    let cases: [(Edit, String); 7] = [
        (
            |k, v| (k != "prism.hadamard.block_size").then(|| v.clone()),
            key("block_size"),
        ),
        (
            |k, v| {
                Some(if k == "prism.hadamard.block_size" {
                    384u32.into()
                } else {
                    v.clone()
                })
            },
            key("block_size"),
        ),
        (
            |k, v| {
                Some(if k == "prism.hadamard.transform" {
                    "dct".into()
                } else {
                    v.clone()
                })
            },
            key("transform"),
        ),
        (
            |k, v| {
                Some(match (k, v.as_i32_array()) {
                    ("prism.hadamard.sign_values", Some(a)) => a[1..].to_vec().into(),
                    _ => v.clone(),
                })
            },
            key("sign_values"),
        ),
        (
            |k, v| {
                Some(match (k, v.as_i32_array()) {
                    ("prism.hadamard.sign_values", Some(a)) => {
                        let mut a = a.to_vec();
                        a[7] = 0;
                        a.into()
                    }
                    _ => v.clone(),
                })
            },
            key("sign_values"),
        ),
        (
            |k, v| {
                Some(match (k, v.as_str_array()) {
                    ("prism.hadamard.weight_names", Some(a)) => {
                        let mut a = a.to_vec();
                        a.push("blk.0.ssm_alpha.weight".into());
                        a.into()
                    }
                    _ => v.clone(),
                })
            },
            key("weight_names"),
        ),
        (
            |k, v| (k != "prism.hadamard.sign_widths").then(|| v.clone()),
            key("sign_widths"),
        ),
    ];
    for (edit, want) in cases {
        rewrite_gguf(&src, &dst, edit);
        let e = load_err(&dst);
        assert!(e.contains(&want), "expected '{want}' in: {e}");
    }
}

#[test]
fn rotated_q2_0_file_without_its_rotation_is_not_silently_fine() {
    // Stock llama.cpp reads a Bonsai 2 Q2_0 file by skipping prism.hadamard.*; trit applies
    // the keys. Without them the same tensors give different logits: the rotation matters
    // and is not being ignored.
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 0, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(q2.file_name());
    let dst = dir.path().join("stripped.gguf");
    rewrite_gguf(&src, &dst, |k, v| {
        (!k.starts_with("prism.hadamard.")).then(|| v.clone())
    });
    let run = |path: &Path| {
        let files = trit::format::open(path).unwrap();
        let model = std::sync::Arc::new(Model::load(&files, 1).unwrap());
        trit::engine::Session::new(model, 64)
            .prefill(&[5, 17, 300, 2])
            .unwrap()
    };
    let (with, without) = (run(&src), run(&dst));
    let d = with
        .iter()
        .zip(&without)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d > 0.5, "rotation made no difference ({d})");
    assert!(trit::format::open(&src)
        .unwrap()
        .format_name
        .contains("Hadamard-rotated"));
}

#[test]
fn a_vision_tower_is_skipped_with_a_note() {
    use trit::format::safetensors::{write, SafetensorsFile, TensorSpec};
    use trit::format::Dtype;
    let (_t, dir) = pack();
    let path = dir.join("model.safetensors");
    let src = SafetensorsFile::open(&path).unwrap();
    let mut specs: Vec<TensorSpec> = src
        .header()
        .tensors
        .iter()
        .map(|(name, info)| TensorSpec {
            name: name.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
        })
        .collect();
    for name in [
        "vision_tower.blocks.0.attn.qkv.weight",
        "model.visual.merger.mlp.0.bias",
    ] {
        specs.push(TensorSpec {
            name: name.into(),
            dtype: Dtype::F16,
            shape: vec![4, 8],
        });
    }
    let copy = dir.join("with-vision.safetensors");
    write(&copy, src.metadata(), &specs, |i, out| {
        let bytes = match src.get(&specs[i].name) {
            Some((_, b)) => b.to_vec(),
            None => vec![0u8; specs[i].n_bytes()],
        };
        out.write_all(&bytes).map_err(|e| trit::Error::io(&copy, e))
    })
    .unwrap();
    drop(src);
    std::fs::rename(&copy, &path).unwrap();
    let files = trit::format::open(&dir).unwrap();
    let note = files.weights.describe();
    assert!(
        note.contains("2 vision-tower tensors skipped") && note.contains("images"),
        "{note}"
    );
    Model::load(&files, 1).unwrap();
}

#[test]
fn rotation_on_a_dense_model_is_refused_not_ignored() {
    use trit::format::testgen::{generate as generate_dense, Preset};
    let dir = tempfile::tempdir().unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate_dense(&p, 0, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(q2.file_name());
    let dst = dir.path().join("rotated-qwen3.gguf");
    // Well-formed rotation metadata (the fork defines it for qwen3 too), which the dense
    // decoder does not apply: loading must fail rather than run the unrotated graph.
    let f = GgufFile::open(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add(k.clone(), v.clone()).unwrap();
    }
    let k = |s: &str| format!("prism.hadamard.{s}");
    w.add(k("version"), 1u32).unwrap();
    w.add(k("block_size"), 256u32).unwrap();
    w.add(k("transform"), "normalized-sylvester-walsh-hadamard")
        .unwrap();
    w.add(k("axis"), "input-last-dimension").unwrap();
    w.add(k("sign_mode"), "identity").unwrap();
    w.add(k("weight_names"), vec!["blk.0.attn_q.weight".to_string()])
        .unwrap();
    w.add(
        k("inverse_weight_names"),
        vec!["token_embd.weight".to_string()],
    )
    .unwrap();
    for t in f.tensors() {
        w.add_tensor(t.name.clone(), &t.shape, t.ty, f.tensor_data(t).to_vec())
            .unwrap();
    }
    w.write_file(&dst).unwrap();
    let e = load_err(&dst);
    assert!(e.contains("Hadamard-rotated qwen3"), "{e}");
}

/// A GGUF `ssm_a` (the decay rates, one per value head) of the wrong length is refused at load
/// with the tensor's name.
#[test]
fn decay_rates_of_the_wrong_length_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-qwen35").unwrap();
    let q2 = OutFormat::parse("q2_0").unwrap();
    generate(&p, 0, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(q2.file_name());
    let f = GgufFile::open(&src).unwrap();
    let a = f
        .tensors()
        .iter()
        .find(|t| t.name == "blk.0.ssm_a")
        .expect("the generated GGUF stores blk.0.ssm_a");
    assert!(a.shape.iter().product::<usize>() > 1);
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add(k.clone(), v.clone()).unwrap();
    }
    for t in f.tensors() {
        let data = f.tensor_data(t).to_vec();
        if t.name == "blk.0.ssm_a" {
            // One value fewer (F32: 4 bytes each).
            let n = t.shape.iter().product::<usize>() - 1;
            w.add_tensor(t.name.clone(), &[n], t.ty, data[..4 * n].to_vec())
                .unwrap();
        } else {
            w.add_tensor(t.name.clone(), &t.shape, t.ty, data).unwrap();
        }
    }
    let dst = dir.path().join("short_ssm_a.gguf");
    w.write_file(&dst).unwrap();
    let e = load_err(&dst);
    assert!(e.contains("blk.0.ssm_a"), "{e}");
}
