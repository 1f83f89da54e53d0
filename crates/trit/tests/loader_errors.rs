//! Loader tests over generated models: every format decodes to the same ternary values and
//! config, and every deliberately broken file or folder fails with a message naming the problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use trit::format::gguf::{GgufFile, Value};
use trit::format::gguf_write::GgufWriter;
use trit::format::safetensors::{self, SafetensorsFile, TensorSpec};
use trit::format::testgen::{
    gen_norm, gen_ternary, generate, Kind, OutFormat, Preset, TokenizerAssets,
};
use trit::format::{
    self, Arch, Dtype, ModelFiles, OpenOptions, RopeScaling, RopeStyle, TensorData, TensorView,
    TokenizerSource,
};
use trit::quant::{self, GgmlType, HalfKind, MlxTernary};
use trit::Error;

const ALL: &[&str] = &["mlx", "q2_0", "pq2_0", "ptq1_0", "tq2_0", "tq1_0", "f16"];

fn formats(names: &[&str]) -> Vec<OutFormat> {
    names.iter().map(|n| OutFormat::parse(n).unwrap()).collect()
}

/// A generated model in a temporary folder.
fn gen(preset: &str, names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name(preset).unwrap();
    generate(
        &p,
        3,
        dir.path(),
        &formats(names),
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    dir
}

/// One shared set of every format per preset (read-only tests).
fn shared(preset: &'static str) -> &'static Path {
    static TINY: OnceLock<tempfile::TempDir> = OnceLock::new();
    static YARN: OnceLock<tempfile::TempDir> = OnceLock::new();
    static LLAMA: OnceLock<tempfile::TempDir> = OnceLock::new();
    let cell = match preset {
        "tiny" => &TINY,
        "tiny-untied-yarn" => &YARN,
        _ => &LLAMA,
    };
    cell.get_or_init(|| gen(preset, ALL)).path()
}

fn open(path: &Path) -> ModelFiles {
    format::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn open_err(path: &Path) -> String {
    match format::open(path) {
        Ok(_) => panic!("{} opened but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Decodes rows `rows` of a tensor to f32 with the scalar reference decoders.
fn decode(view: &TensorView, rows: &[usize]) -> Vec<f32> {
    let cols = view.cols();
    let mut out = vec![0f32; rows.len() * cols];
    for (i, &r) in rows.iter().enumerate() {
        let dst = &mut out[i * cols..(i + 1) * cols];
        match view.data {
            TensorData::F32(b) => {
                quant::dequantize(GgmlType::F32, &b[r * cols * 4..][..cols * 4], cols, dst).unwrap()
            }
            TensorData::F16(b) => {
                quant::dequantize(GgmlType::F16, &b[r * cols * 2..][..cols * 2], cols, dst).unwrap()
            }
            TensorData::BF16(b) => {
                quant::dequantize(GgmlType::BF16, &b[r * cols * 2..][..cols * 2], cols, dst)
                    .unwrap()
            }
            TensorData::Ggml { ty, bytes } => {
                let rb = ty.row_bytes(cols);
                quant::dequantize(ty, &bytes[r * rb..(r + 1) * rb], cols, dst).unwrap()
            }
            TensorData::Mlx {
                codes,
                scales,
                biases,
                scale_dtype,
                group_size,
                bits,
            } => {
                assert_eq!((bits, scale_dtype), (2, Dtype::F16));
                let m = MlxTernary::new(
                    codes,
                    scales,
                    biases,
                    HalfKind::F16,
                    view.rows(),
                    cols,
                    group_size,
                )
                .unwrap();
                m.check_ternary().unwrap();
                m.dequantize_row(r, dst);
            }
        }
    }
    out
}

#[test]
fn every_format_decodes_to_the_generated_values() {
    for preset_name in ["tiny", "tiny-untied-yarn", "tiny-llama"] {
        let preset = Preset::by_name(preset_name).unwrap();
        let dir = shared(preset_name);
        let models: Vec<(String, ModelFiles)> = ALL
            .iter()
            .map(|f| {
                let name = OutFormat::parse(f).unwrap().file_name();
                (f.to_string(), open(&dir.join(name)))
            })
            .collect();
        for plan in preset.tensors() {
            // The embedding is large: check a spread of rows; everything else whole.
            let n_rows = plan.shape[0];
            let rows: Vec<usize> = if plan.shape.len() == 1 {
                vec![0]
            } else if n_rows > 4096 {
                (0..n_rows).step_by(997).chain([n_rows - 1]).collect()
            } else {
                (0..n_rows).collect()
            };
            let (truth, permuted) = match plan.kind {
                Kind::Norm => (
                    gen_norm(3, &plan).iter().map(|x| x.to_f32()).collect(),
                    None,
                ),
                Kind::Ternary { .. } => {
                    let t = gen_ternary(3, &plan);
                    let cols = t.cols;
                    let vals = |t: &trit::format::testgen::Ternary| -> Vec<f32> {
                        rows.iter()
                            .flat_map(|&r| (0..cols).map(move |c| (r, c)))
                            .map(|(r, c)| t.value(r, c))
                            .collect()
                    };
                    let heads = if plan.name.ends_with("attn_q.weight") {
                        Some(preset.n_heads)
                    } else if plan.name.ends_with("attn_k.weight") {
                        Some(preset.n_kv_heads)
                    } else {
                        None
                    };
                    (
                        vals(&t),
                        heads.map(|h| vals(&t.permute_for_adjacent_rope(h))),
                    )
                }
                Kind::Small { .. } | Kind::Param { .. } => {
                    unreachable!("dense presets have no {}", plan.name)
                }
            };
            for (fmt, m) in &models {
                let view = m.weights.require(&plan.name).unwrap();
                assert_eq!(view.shape, plan.shape, "{fmt} {}", plan.name);
                let got = decode(&view, &rows);
                // GGUF llama files hold Q/K permuted for adjacent-pair RoPE.
                let want = match (&permuted, m.config.rope_style) {
                    (Some(p), RopeStyle::Adjacent) => p,
                    _ => &truth,
                };
                assert!(got == *want, "{preset_name} {fmt}: {} differs", plan.name);
            }
        }
        // The configs agree except for the RoPE pairing of GGUF llama files.
        let base = &models[0].1.config;
        for (fmt, m) in &models {
            let mut c = m.config.clone();
            let want_style = if fmt != "mlx" && fmt != "f16" && preset.arch == Arch::Llama {
                RopeStyle::Adjacent
            } else {
                RopeStyle::Neox
            };
            assert_eq!(c.rope_style, want_style, "{fmt}");
            c.rope_style = base.rope_style;
            c.name = base.name.clone();
            // GGUF carries one EOS id; folders add generation_config.json's list.
            c.eos = base.eos.clone();
            assert_eq!(&c, base, "{preset_name} {fmt}");
        }
    }
}

#[test]
fn config_from_gguf_and_folder() {
    let dir = shared("tiny");
    let g = open(&dir.join("model-pq2_0.gguf"));
    let c = &g.config;
    assert_eq!(c.arch, Arch::Qwen3);
    assert_eq!((c.n_layers, c.hidden, c.ffn), (4, 256, 768));
    assert_eq!(
        (c.n_heads, c.n_kv_heads, c.head_dim, c.vocab),
        (4, 2, 64, 151_936)
    );
    assert_eq!((c.rope_theta, c.norm_eps, c.max_ctx), (1e6, 1e-6, 40_960));
    assert!(c.tied_embeddings && c.qk_norm && !c.add_bos);
    assert_eq!((c.bos, c.eos.clone()), (Some(151_643), vec![151_645]));
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert!(matches!(g.tokenizer, TokenizerSource::Gguf(_)));
    assert!(g.chat_template.as_deref().unwrap().contains("<|im_start|>"));
    assert_eq!(g.generation.temperature, Some(0.6));
    assert_eq!(g.generation.top_k, Some(20));
    assert_eq!(g.generation.source, "gguf general.sampling.*");
    assert_eq!(g.format_name, "GGUF");
    assert!(
        g.weights.describe().contains("PQ2_0"),
        "{}",
        g.weights.describe()
    );

    let m = open(&dir.join("mlx"));
    assert_eq!(m.config.eos, vec![151_645, 151_643]); // config.json + generation_config.json
    assert_eq!(m.generation.source, "generation_config.json");
    assert_eq!(m.generation.top_p, Some(0.95));
    assert_eq!(m.format_name, "MLX 2-bit");
    assert!(
        m.weights.describe().contains("all ternary"),
        "{}",
        m.weights.describe()
    );
    assert!(matches!(m.tokenizer, TokenizerSource::Json { ref config, .. } if config.is_some()));
    assert!(m.chat_template.is_some());
    assert!(m.weights.tensor("output.weight").unwrap().is_none());
    let names = m.weights.tensor_names();
    assert_eq!(names.len(), 1 + 4 * 11 + 1);
    assert!(
        names.iter().all(|n| g.weights.tensor(n).unwrap().is_some()),
        "same names"
    );

    let u = open(&dir.join("f16"));
    assert_eq!(u.format_name, "unpacked F16");
    let q = u.weights.require("blk.0.ffn_down.weight").unwrap();
    assert!(matches!(
        q.data,
        TensorData::Ggml {
            ty: GgmlType::PQ2_0,
            ..
        }
    ));
    let n = u.weights.require("blk.0.attn_norm.weight").unwrap();
    assert!(matches!(n.data, TensorData::F16(_)));
}

#[test]
fn yarn_and_untied_head_from_both_sources() {
    let dir = shared("tiny-untied-yarn");
    let want = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0 + 0.1 * 4f32.ln(),
    };
    for f in ["mlx", "model-tq2_0.gguf", "f16"] {
        let m = open(&dir.join(f));
        assert!(!m.config.tied_embeddings, "{f}");
        assert_eq!(m.config.rope_scaling.as_ref(), Some(&want), "{f}");
        let head = m.weights.require("output.weight").unwrap();
        assert_eq!(head.shape, vec![151_936, 256]);
    }
}

#[test]
fn qwen3_tokenizer_metadata_in_gguf() {
    let cache = std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    let tok_dir = cache.join("qwen3");
    if !tok_dir.join("tokenizer.json").exists() {
        eprintln!(
            "skipping: {} absent (run tools/fetch_assets.sh)",
            tok_dir.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    generate(
        &p,
        0,
        dir.path(),
        &formats(&["pq2_0", "mlx"]),
        &TokenizerAssets::Dir(tok_dir.clone()),
    )
    .unwrap();
    let f = GgufFile::open(dir.path().join("model-pq2_0.gguf")).unwrap();
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_str_array()
        .unwrap();
    assert_eq!(tokens.len(), 151_936);
    assert_eq!(tokens[151_645], "<|im_end|>");
    assert_eq!(tokens[9707], "Hello");
    assert_eq!(tokens[151_700], "[PAD151700]");
    let types = f
        .get("tokenizer.ggml.token_type")
        .unwrap()
        .as_i32_array()
        .unwrap();
    assert_eq!(
        (types[9707], types[151_645], types[151_667], types[151_700]),
        (1, 3, 4, 5)
    );
    let merges = f
        .get("tokenizer.ggml.merges")
        .unwrap()
        .as_str_array()
        .unwrap();
    assert_eq!(merges.len(), 151_387);
    assert_eq!(merges[0], "Ġ Ġ");
    assert_eq!(f.get_str("tokenizer.ggml.pre"), Some("qwen2"));
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tok_dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        f.get_str("tokenizer.chat_template"),
        cfg["chat_template"].as_str()
    );
    assert_eq!(
        std::fs::read(dir.path().join("mlx/tokenizer.json")).unwrap(),
        std::fs::read(tok_dir.join("tokenizer.json")).unwrap()
    );
}

// ---- broken inputs -------------------------------------------------------------------------

/// Rewrites a folder's `model.safetensors`: `edit` may drop a tensor (None) or change its bytes.
fn rewrite_safetensors(dir: &Path, mut edit: impl FnMut(&str, &mut Vec<u8>) -> bool) {
    let path = dir.join("model.safetensors");
    let (specs, data) = {
        let f = SafetensorsFile::open(&path).unwrap();
        let mut specs = Vec::new();
        let mut data = Vec::new();
        for (name, info) in &f.header().tensors {
            let mut bytes = f.get(name).unwrap().1.to_vec();
            if edit(name, &mut bytes) {
                specs.push(TensorSpec {
                    name: name.clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                });
                data.push(bytes);
            }
        }
        (specs, data)
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

/// Splits a folder's single safetensors file into two shards plus an index.
fn shard(dir: &Path) -> Vec<String> {
    let path = dir.join("model.safetensors");
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut weight_map = serde_json::Map::new();
    {
        let f = SafetensorsFile::open(&path).unwrap();
        let all: Vec<(&String, _)> = f.header().tensors.iter().collect();
        let half = all.len() / 2;
        for (i, part) in [&all[..half], &all[half..]].into_iter().enumerate() {
            let specs: Vec<TensorSpec> = part
                .iter()
                .map(|(n, info)| TensorSpec {
                    name: (*n).clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                })
                .collect();
            for s in &specs {
                weight_map.insert(s.name.clone(), names[i].into());
            }
            safetensors::write(&dir.join(names[i]), &BTreeMap::new(), &specs, |j, out| {
                out.write_all(f.get(&specs[j].name).unwrap().1)
                    .map_err(|e| Error::io("x", e))
            })
            .unwrap();
        }
    }
    std::fs::remove_file(&path).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn sharded_folder_reads_like_a_single_file() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    let single = open(&mlx);
    let rows: Vec<usize> = (0..768).collect();
    let before = decode(
        &single.weights.require("blk.3.ffn_up.weight").unwrap(),
        &rows,
    );
    drop(single);
    shard(&mlx);
    let m = open(&mlx);
    assert!(
        m.weights.describe().contains("2 safetensors file(s)"),
        "{}",
        m.weights.describe()
    );
    let after = decode(&m.weights.require("blk.3.ffn_up.weight").unwrap(), &rows);
    assert!(before == after);
}

#[test]
fn missing_shard_is_named() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    std::fs::rename(
        mlx.join("model.safetensors"),
        mlx.join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": {
        "model.norm.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}});
    std::fs::write(mlx.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = open_err(&mlx);
    assert!(
        e.contains("missing shard 'model-00002-of-00002.safetensors'"),
        "{e}"
    );
}

#[test]
fn truncated_safetensors() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    let path = mlx.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 2).unwrap();
    let e = open_err(&mlx);
    assert!(
        e.contains("extends past the end of the data section"),
        "{e}"
    );
    f.set_len(100).unwrap();
    let e = open_err(&mlx);
    assert!(
        e.contains("header length") && e.contains("exceeds the file"),
        "{e}"
    );
}

#[test]
fn header_offsets_past_eof() {
    let dir = gen("tiny", &["mlx"]);
    let path = dir.path().join("mlx/model.safetensors");
    let header = r#"{"model.norm.weight":{"dtype":"F16","shape":[256],"data_offsets":[0,512]},"lm_head.weight":{"dtype":"F16","shape":[4],"data_offsets":[100000,100008]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + 512, 0);
    std::fs::write(&path, bytes).unwrap();
    let e = open_err(&dir.path().join("mlx"));
    assert!(
        e.contains("'lm_head.weight' data [100000, 100008) extends past the end"),
        "{e}"
    );
}

#[test]
fn missing_scales_beside_packed_weight() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    rewrite_safetensors(&mlx, |n, _| {
        n != "model.layers.2.mlp.up_proj.scales" && n != "model.layers.2.mlp.up_proj.biases"
    });
    let e = open_err(&mlx);
    assert!(
        e.contains("'model.layers.2.mlp.up_proj.weight' is packed (U32")
            && e.contains("scales' is missing"),
        "{e}"
    );
}

#[test]
fn missing_biases_beside_packed_weight() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    rewrite_safetensors(&mlx, |n, _| n != "model.layers.0.self_attn.k_proj.biases");
    let e = open_err(&mlx);
    assert!(
        e.contains("'model.layers.0.self_attn.k_proj.biases' is missing"),
        "{e}"
    );
}

#[test]
fn non_ternary_biases_refused_when_ternary_required() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    // Group 1 of row 0 gets bias = +scale instead of -scale.
    rewrite_safetensors(&mlx, |n, b| {
        if n == "model.layers.1.mlp.down_proj.biases" {
            b[3] ^= 0x80;
        }
        true
    });
    let strict = OpenOptions {
        require_ternary: true,
    };
    let e = format::open_with(&mlx, strict)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("model.layers.1.mlp.down_proj")
            && e.contains("not ternary")
            && e.contains("row 0, group 1"),
        "{e}"
    );
    // Without the requirement it loads as a generic affine model and says so.
    let m = open(&mlx);
    assert!(
        m.weights.describe().contains("1 of 29 generic affine"),
        "{}",
        m.weights.describe()
    );
}

#[test]
fn unsupported_quantization_mode_and_bits() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    edit_config(&mlx, |c| {
        c["quantization"]["mode"] = "mxfp4".into();
    });
    let e = open_err(&mlx);
    assert!(
        e.contains("mode 'mxfp4'") && e.contains("not ternary"),
        "{e}"
    );
    edit_config(&mlx, |c| {
        c["quantization"] = serde_json::json!({"group_size": 64, "bits": 4});
    });
    let e = open_err(&mlx);
    assert!(e.contains("4 bits"), "{e}");
}

#[test]
fn missing_tensor() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    rewrite_safetensors(&mlx, |n, _| !n.starts_with("model.layers.1.mlp.up_proj."));
    let e = format::open(&mlx).err().expect("refused");
    assert!(
        matches!(&e, Error::MissingTensor(t) if t == "blk.1.ffn_up.weight"),
        "{e}"
    );
}

#[test]
fn config_contradicting_tensor_shape() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    edit_config(&mlx, |c| c["num_attention_heads"] = 8.into());
    match format::open(&mlx) {
        Err(Error::ShapeMismatch {
            tensor,
            found,
            expected,
        }) => {
            assert_eq!(tensor, "blk.0.attn_q.weight");
            assert_eq!((found, expected), (vec![256, 256], vec![512, 256]));
        }
        other => panic!("expected a shape mismatch, got {:?}", other.err()),
    }
    edit_config(&mlx, |c| {
        c["num_attention_heads"] = 4.into();
        c["num_hidden_layers"] = 3.into();
    });
    let e = open_err(&mlx);
    assert!(
        e.contains("3 layers") && e.contains("blk.3.attn_norm.weight"),
        "{e}"
    );
}

#[test]
fn missing_config_key_and_unsupported_arch() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    edit_config(&mlx, |c| {
        c.as_object_mut().unwrap().remove("intermediate_size");
    });
    assert_eq!(
        open_err(&mlx),
        "config: config.json: missing key 'intermediate_size'"
    );
    edit_config(&mlx, |c| {
        c["intermediate_size"] = 768.into();
        c["model_type"] = "mamba".into();
    });
    let e = open_err(&mlx);
    assert!(
        e.contains("architecture 'mamba' (supported: llama, qwen3, qwen3_5"),
        "{e}"
    );
}

#[test]
fn unpacked_folder_with_non_ternary_group() {
    let dir = gen("tiny", &["f16"]);
    let f16 = dir.path().join("f16");
    // Row 2, column 200 (group 1) of the gate projection (256 wide) gets half its magnitude.
    rewrite_safetensors(&f16, |n, b| {
        if n == "model.layers.0.mlp.gate_proj.weight" {
            let i = 2 * (2 * 256 + 200);
            let v = half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
            let v = if v == 0.0 { 0.001 } else { v / 2.0 };
            b[i..i + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        true
    });
    let e = open_err(&f16);
    assert!(
        e.contains("'model.layers.0.mlp.gate_proj.weight' (blk.0.ffn_gate.weight) row 2 group 1 (columns 128..256) is not ternary"),
        "{e}"
    );
    assert!(e.contains("column 200"), "{e}");
}

/// Copies a GGUF through the writer, letting `edit` change its metadata.
fn rewrite_gguf(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&str, &Value) -> Option<Value>,
    extra: &[(&str, Value)],
) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if let Some(v) = edit(k, v) {
            w.add(k.clone(), v).unwrap();
        }
    }
    for (k, v) in extra {
        w.add(*k, v.clone()).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(t.name.clone(), &t.shape, t.ty, f.tensor_data(t).to_vec())
            .unwrap();
    }
    w.write_file(dst).unwrap();
}

#[test]
fn broken_gguf_files() {
    let src = shared("tiny").join("model-q2_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("x.gguf");

    rewrite_gguf(
        &src,
        &dst,
        |k, v| {
            Some(if k == "general.architecture" {
                "qwen3moe".into()
            } else {
                v.clone()
            })
        },
        &[],
    );
    let e = open_err(&dst);
    assert!(
        e.contains("architecture 'qwen3moe' (supported: llama, qwen3, qwen3_5"),
        "{e}"
    );

    rewrite_gguf(
        &src,
        &dst,
        |k, v| (k != "qwen3.embedding_length").then(|| v.clone()),
        &[],
    );
    let e = open_err(&dst);
    assert!(
        e.contains("missing metadata key 'qwen3.embedding_length'"),
        "{e}"
    );

    rewrite_gguf(
        &src,
        &dst,
        |k, v| {
            Some(if k == "qwen3.feed_forward_length" {
                1024u32.into()
            } else {
                v.clone()
            })
        },
        &[],
    );
    let e = format::open(&dst).err().expect("refused");
    assert!(
        matches!(&e, Error::ShapeMismatch { tensor, expected, .. } if tensor == "blk.0.ffn_gate.weight" && expected == &vec![1024, 256]),
        "{e}"
    );

    rewrite_gguf(
        &src,
        &dst,
        |_, v| Some(v.clone()),
        &[("prism.hadamard.block_size", 1024u32.into())],
    );
    let e = open_err(&dst);
    assert!(
        // Incomplete rotation metadata is refused, naming the first key that is wrong.
        e.contains("prism.hadamard.version"),
        "{e}"
    );

    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&dst, &bytes[..bytes.len() - 5000]).unwrap();
    let e = open_err(&dst);
    assert!(e.contains("x.gguf"), "{e}");

    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"not a model at all").unwrap();
    let e = open_err(&junk);
    assert!(e.contains("not a GGUF file"), "{e}");
}

#[test]
fn signs_tensor_is_refused() {
    let dir = gen("tiny", &["mlx"]);
    let mlx = dir.path().join("mlx");
    let path = mlx.join("model.safetensors");
    let (specs, data) = {
        let f = SafetensorsFile::open(&path).unwrap();
        let mut specs: Vec<TensorSpec> = Vec::new();
        let mut data: Vec<Vec<u8>> = Vec::new();
        for (name, info) in &f.header().tensors {
            specs.push(TensorSpec {
                name: name.clone(),
                dtype: info.dtype,
                shape: info.shape.clone(),
            });
            data.push(f.get(name).unwrap().1.to_vec());
        }
        specs.push(TensorSpec {
            name: "model.layers.0.mlp.up_proj.signs".into(),
            dtype: Dtype::F32,
            shape: vec![256],
        });
        data.push(vec![0; 1024]);
        (specs, data)
    };
    safetensors::write(&path, &BTreeMap::new(), &specs, |i, out| {
        out.write_all(&data[i]).map_err(|e| Error::io("x", e))
    })
    .unwrap();
    let e = open_err(&mlx);
    assert!(e.contains("signs") && e.contains("rotation"), "{e}");
}
