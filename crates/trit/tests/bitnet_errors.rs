//! Broken BitNet files are refused with an error that names the problem, never a panic:
//! missing or mis-shaped sub-norms, a packed projection without its `weight_scale`, a zero
//! scale, code 3 in a packed byte, an unknown activation or linear class, a GGUF without a
//! sub-norm, an I2_S GGUF (microsoft/BitNet's type 36). Also: the `-bf16` layout (online
//! quantization of full-precision masters) loads, LoRA and conversion to MLX refuse BitNet, a
//! GGUF without a pre-tokenizer name reads as Llama-3.

use std::collections::BTreeMap;
use std::path::Path;
use trit::format::safetensors::{self, SafetensorsFile, TensorSpec};
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::Error;

fn gen(formats: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let formats: Vec<OutFormat> = formats
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    let p = Preset::by_name("tiny-bitnet").unwrap();
    generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
    dir
}

fn open_err(path: &Path) -> String {
    match trit::format::open(path) {
        Ok(files) => match trit::model::Model::load(&files, 1) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

/// Rewrites `dir/model.safetensors`: `edit` returns the new (dtype, shape, bytes) of a tensor,
/// or `None` to drop it.
type Edited = Option<(safetensors::TensorInfo, Vec<u8>)>;
fn rewrite(dir: &Path, mut edit: impl FnMut(&str, safetensors::TensorInfo, Vec<u8>) -> Edited) {
    let path = dir.join("model.safetensors");
    let (specs, data): (Vec<TensorSpec>, Vec<Vec<u8>>) = {
        let f = SafetensorsFile::open(&path).unwrap();
        f.header()
            .tensors
            .iter()
            .filter_map(|(name, info)| {
                let bytes = f.get(name).unwrap().1.to_vec();
                let (info, bytes) = edit(name, info.clone(), bytes)?;
                let spec = TensorSpec {
                    name: name.clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                };
                Some((spec, bytes))
            })
            .unzip()
    };
    safetensors::write(&path, &BTreeMap::new(), &specs, |i, out| {
        out.write_all(&data[i]).map_err(|e| Error::io("x", e))
    })
    .unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn folder_errors_name_the_tensor() {
    let check = |edit: &dyn Fn(&str, safetensors::TensorInfo, Vec<u8>) -> Edited, want: &[&str]| {
        let tmp = gen(&["hf"]);
        let dir = tmp.path().join("hf");
        rewrite(&dir, edit);
        let e = open_err(&dir);
        for w in want {
            assert!(e.contains(w), "'{w}' not in: {e}");
        }
    };
    // A missing sub-norm.
    check(
        &|n, i, b| (n != "model.layers.1.self_attn.attn_sub_norm.weight").then_some((i, b)),
        &["missing tensor", "blk.1.attn_sub_norm.weight"],
    );
    check(
        &|n, i, b| (n != "model.layers.2.mlp.ffn_sub_norm.weight").then_some((i, b)),
        &["blk.2.ffn_sub_norm.weight"],
    );
    // A sub-norm of the wrong width.
    check(
        &|n, mut i, mut b| {
            if n == "model.layers.0.mlp.ffn_sub_norm.weight" {
                i.shape = vec![256];
                b.truncate(512);
            }
            Some((i, b))
        },
        &["blk.0.ffn_sub_norm.weight", "[256]", "[768]"],
    );
    // A packed projection without its scale, with a zero scale, with code 3.
    check(
        &|n, i, b| (n != "model.layers.0.mlp.down_proj.weight_scale").then_some((i, b)),
        &[
            "model.layers.0.mlp.down_proj.weight_scale",
            "per-tensor scale",
        ],
    );
    check(
        &|n, i, b| {
            let zero = n == "model.layers.1.self_attn.k_proj.weight_scale";
            Some((i, if zero { vec![0, 0] } else { b }))
        },
        &["k_proj.weight_scale", "finite and non-zero"],
    );
    check(
        &|n, i, mut b| {
            if n == "model.layers.0.self_attn.q_proj.weight" {
                b[5] = 0xff;
            }
            Some((i, b))
        },
        &["q_proj.weight", "code 3"],
    );
    // A packed projection whose rows do not match the config (out/4 rows).
    check(
        &|n, mut i, mut b| {
            if n == "model.layers.0.mlp.up_proj.weight" {
                i.shape = vec![96, 256];
                b.truncate(96 * 256);
            }
            Some((i, b))
        },
        &["blk.0.ffn_up.weight", "[384, 256]", "[768, 256]"],
    );
}

#[test]
fn config_errors() {
    let tmp = gen(&["hf"]);
    let dir = tmp.path().join("hf");
    edit_config(&dir, |c| c["hidden_act"] = "gelu".into());
    let e = open_err(&dir);
    assert!(e.contains("hidden_act 'gelu'"), "{e}");
    edit_config(&dir, |c| {
        c["hidden_act"] = "relu2".into();
        c["quantization_config"]["linear_class"] = "fancylinear".into();
    });
    let e = open_err(&dir);
    assert!(e.contains("linear_class 'fancylinear'"), "{e}");
    edit_config(&dir, |c| {
        c["quantization_config"] = serde_json::json!({"bits": 2, "group_size": 128});
    });
    let e = open_err(&dir);
    assert!(e.contains("non-BitNet quantization block"), "{e}");
}

/// Replaces the bytes `from` (in the GGUF header) by `to` (same length).
fn patch(path: &Path, from: &[u8], to: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern in file");
    bytes[at..at + to.len()].copy_from_slice(to);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn gguf_errors() {
    let tmp = gen(&["tq2_0"]);
    let path = tmp.path().join("model-tq2_0.gguf");
    let pristine = std::fs::read(&path).unwrap();
    // Without its sub-norm (renamed away).
    patch(
        &path,
        b"blk.1.ffn_sub_norm.weight",
        b"blk.1.ffn_sub_xxxx.weight",
    );
    let e = open_err(&path);
    assert!(e.contains("blk.1.ffn_sub_norm.weight"), "{e}");
    // A tensor of type I2_S: name (u64 length + bytes), n_dims u32, dims u64 × 2, type u32.
    std::fs::write(&path, &pristine).unwrap();
    let name = b"blk.0.attn_q.weight";
    let mut bytes = pristine.clone();
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty = at + 4 + 16;
    assert_eq!(
        bytes[ty..ty + 4],
        35u32.to_le_bytes(),
        "TQ2_0 type id expected"
    );
    bytes[ty..ty + 4].copy_from_slice(&36u32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let e = open_err(&path);
    assert!(
        e.contains("I2_S") && e.contains("blk.0.attn_q.weight"),
        "{e}"
    );
    assert!(e.contains("--outtype tq2_0"), "{e}");
}

/// The `-bf16` layout: full-precision masters with `quantization_mode: online` are ternarized
/// per tensor by absmean at load (transformers' AutoBitLinear does it at every forward).
#[test]
fn online_masters_are_ternarized_at_load() {
    let tmp = gen(&["hf"]);
    let dir = tmp.path().join("hf");
    // Masters: the packed codes times a per-tensor value, plus small noise that absmean
    // rounding removes; stored as bf16 [out, in].
    rewrite(&dir, |n, mut i, b| {
        if n.ends_with("weight_scale") {
            return None;
        }
        if i.dtype == trit::format::Dtype::U8 {
            let (rows, cols) = (i.shape[0] * 4, i.shape[1]);
            let codes = trit::quant::bitnet::unpack_hf(&b, rows, cols, n).unwrap();
            let bytes: Vec<u8> = codes
                .iter()
                .enumerate()
                .flat_map(|(k, &c)| {
                    let noise = ((k * 7919) % 13) as f32 * 0.002 - 0.012;
                    half::bf16::from_f32((c as f32 - 1.0) * 0.05 + noise).to_le_bytes()
                })
                .collect();
            i.dtype = trit::format::Dtype::BF16;
            i.shape = vec![rows, cols];
            return Some((i, bytes));
        }
        Some((i, b))
    });
    edit_config(&dir, |c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "bitnet",
            "linear_class": "autobitlinear", "quantization_mode": "online"});
    });
    let files = trit::format::open(&dir).unwrap();
    assert!(files.weights.describe().contains("ternarized at load"));
    let view = files
        .weights
        .tensor("blk.0.attn_q.weight")
        .unwrap()
        .unwrap();
    assert_eq!(view.shape, vec![256, 256]);
    let s = trit::model::weights::tensor_scale(files.weights.as_ref(), "blk.0.attn_q.weight");
    // mean|W| of ±0.05 (about 2/3 of the weights) and the noise: well inside (0.02, 0.05).
    let s = s.unwrap();
    assert!(s > 0.02 && s < 0.05, "{s}");
    let model = trit::model::Model::load(&files, 1).unwrap();
    let mut cache = model.new_cache(16);
    let logits = model
        .forward(&[1, 2, 3], &mut cache, trit::model::Logits::Last)
        .unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn lora_and_mlx_convert_refuse_bitnet() {
    let tmp = gen(&["hf"]);
    let dir = tmp.path().join("hf");
    let out = tmp.path().join("out.gguf");
    let opts = trit::convert::ConvertOptions {
        target: trit::convert::Target::Mlx,
        allow_lossy: false,
    };
    let e = trit::convert::convert(&dir, &out, &opts, &mut |_, _, _| {}).unwrap_err();
    assert!(
        e.to_string().contains("bitnet model converts to GGUF only"),
        "{e}"
    );
    assert!(!out.exists());
    // LoRA side paths do not know the sub-norms: refused rather than silently wrong.
    let files = trit::format::open(&dir).unwrap();
    let mut model = trit::model::Model::load(&files, 1).unwrap();
    let adapter_dir = tmp.path().join("adapter");
    std::fs::create_dir_all(&adapter_dir).unwrap();
    std::fs::write(
        adapter_dir.join("adapter_config.json"),
        r#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}"#,
    )
    .unwrap();
    let prefix = "base_model.model.model.layers.0.self_attn.q_proj";
    let specs = [
        TensorSpec {
            name: format!("{prefix}.lora_A.weight"),
            dtype: trit::format::Dtype::F32,
            shape: vec![2, 256],
        },
        TensorSpec {
            name: format!("{prefix}.lora_B.weight"),
            dtype: trit::format::Dtype::F32,
            shape: vec![256, 2],
        },
    ];
    let path = adapter_dir.join("adapter_model.safetensors");
    safetensors::write(&path, &BTreeMap::new(), &specs, |_, out| {
        out.write_all(&[0u8; 2 * 256 * 4])
            .map_err(|e| Error::io("x", e))
    })
    .unwrap();
    {
        let adapter = trit::model::lora::LoraAdapter::load(&adapter_dir).unwrap();
        let e = model.set_adapter(&adapter).unwrap_err();
        assert!(e.to_string().contains("bitnet"), "{e}");
    }
}

/// A BitNet GGUF without `tokenizer.ggml.pre` / `add_bos_token` (microsoft/BitNet's 2B4T file
/// names neither) reads as Llama-3: llama3 pre-tokenizer rules, BOS added.
#[test]
fn gguf_without_pre_tokenizer_reads_as_llama3() {
    let tmp = gen(&["tq2_0"]);
    let path = tmp.path().join("model-tq2_0.gguf");
    patch(&path, b"tokenizer.ggml.pre", b"tokenizer.ggml.prX");
    patch(
        &path,
        b"tokenizer.ggml.add_bos_token",
        b"tokenizer.ggml.add_bos_tokeX",
    );
    let files = trit::format::open(&path).unwrap();
    assert!(files.config.add_bos);
    let trit::format::TokenizerSource::Gguf(file) = &files.tokenizer else {
        panic!("a GGUF vocabulary")
    };
    let vocab = trit::tokenizer::GgufVocab::from_gguf(file).unwrap();
    assert_eq!(vocab.pre.as_deref(), Some("llama-bpe"));
    assert!(vocab.add_bos);
}
