//! Binary weights (1-bit Bonsai: ±d per group) load into the ternary kernels (binary is a subset
//! of ternary): GGUF `Q1_0` gives the logits of the same weights as F32 and holds its matrices
//! in ~2 bits per weight, not as dense f32; `trit convert` repacks it losslessly; an MLX 1-bit
//! pack reads as the same weights as a 2-bit pack of them.

use trit::convert::{convert, ConvertOptions, Target};
use trit::format::gguf::GgufFile;
use trit::format::gguf_write::GgufWriter;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::kernels::{set_level, KernelLevel};
use trit::model::{Logits, Model};
use trit::quant::{self, q1_0, GgmlType};

/// The tiny preset with a 2,048-token vocabulary (quick to generate and load).
fn small_vocab_tiny() -> Preset {
    Preset {
        vocab: 2048,
        bos: 2000,
        eos: 2001,
        pad: 2000,
        ..Preset::by_name("tiny").unwrap()
    }
}

/// The tiny generated model with every ternary matrix made binary (zeros become +1, one scale
/// per 128 columns), written twice: matrices as Q1_0 and as F32.
fn binary_twins(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let preset = small_vocab_tiny();
    let f = OutFormat::parse("q2_0").unwrap();
    generate(&preset, 11, dir, &[f], &TokenizerAssets::Placeholder).unwrap();
    let src = GgufFile::open(dir.join(f.file_name())).unwrap();
    let (mut bin, mut dense) = (GgufWriter::new(), GgufWriter::new());
    for (k, v) in src.metadata() {
        bin.add(k.clone(), v.clone()).unwrap();
        dense.add(k.clone(), v.clone()).unwrap();
    }
    for t in src.tensors() {
        let data = src.tensor_data(t);
        if !t.ty.is_ternary() {
            bin.add_tensor(t.name.clone(), &t.shape, t.ty, data.to_vec())
                .unwrap();
            dense
                .add_tensor(t.name.clone(), &t.shape, t.ty, data.to_vec())
                .unwrap();
            continue;
        }
        let n: usize = t.shape.iter().product();
        let mut w = vec![0f32; n];
        quant::dequantize(t.ty, data, n, &mut w).unwrap();
        for block in w.chunks_exact_mut(q1_0::BLOCK) {
            // The block's scale: its largest magnitude (every value of a Q2_0 slice is 0 or ±s).
            let d = block.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
            let d = half::f16::from_f32(d).to_f32();
            for x in block.iter_mut() {
                *x = if *x < 0.0 { -d } else { d };
            }
        }
        let bytes = q1_0::encode_row(&w).unwrap();
        bin.add_tensor(t.name.clone(), &t.shape, GgmlType::Q1_0, bytes)
            .unwrap();
        let f32s: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        dense
            .add_tensor(t.name.clone(), &t.shape, GgmlType::F32, f32s)
            .unwrap();
    }
    let (a, b) = (dir.join("binary.gguf"), dir.join("dense.gguf"));
    bin.write_file(&a).unwrap();
    dense.write_file(&b).unwrap();
    (a, b)
}

#[test]
fn q1_0_runs_on_the_ternary_kernels_with_the_dense_models_logits() {
    set_level(KernelLevel::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (bin, dense) = binary_twins(dir.path());
    let load = |p: &std::path::Path| Model::load(&trit::format::open(p).unwrap(), 2).unwrap();
    let (b, d) = (load(&bin), load(&dense));
    // Dense f32 is 32 bits per weight; the ternary layout ~2 (plus scales).
    assert!(
        b.weight_bytes() * 8 < d.weight_bytes(),
        "{} vs {}",
        b.weight_bytes(),
        d.weight_bytes()
    );
    let tokens = [3u32, 17, 99, 512, 7, 1024, 5];
    let (mut cb, mut cd) = (b.new_cache(16), d.new_cache(16));
    let lb = b.forward(&tokens, &mut cb, Logits::All).unwrap();
    let ld = d.forward(&tokens, &mut cd, Logits::All).unwrap();
    let worst = lb
        .iter()
        .zip(&ld)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "largest relative difference {worst}");

    // `trit convert` repacks Q1_0 into a ternary type without loss (binary ⊂ ternary, one scale
    // per 128 either way): the PQ2_0 file computes the same logits as the Q1_0 one, exactly.
    let out = dir.path().join("repacked.gguf");
    let opts = ConvertOptions {
        target: Target::parse("pq2_0").unwrap(),
        allow_lossy: false,
    };
    let report = convert(&bin, &out, &opts, &mut |_, _, _| {}).unwrap();
    assert!(!report.lossy);
    assert!(
        report.tensors.iter().any(|t| t.from.contains("Q1_0")),
        "{report:?}"
    );
    let p = load(&out);
    let mut cp = p.new_cache(16);
    assert_eq!(p.forward(&tokens, &mut cp, Logits::All).unwrap(), lb);
}

/// The tiny generated MLX folder made binary (zeros become +1), written as a 2-bit pack (codes
/// 0/2, `bias = −scale`) and as a 1-bit pack (1-bit Bonsai's layout: one bit per weight,
/// `scale = 2s`, `bias = −s`): (2-bit folder, 1-bit folder).
fn binary_mlx_twins(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::collections::BTreeMap;
    use trit::format::safetensors::{self, SafetensorsFile, TensorSpec};
    use trit::format::Dtype;
    let preset = small_vocab_tiny();
    generate(
        &preset,
        13,
        dir,
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let src = dir.join("mlx");
    let file = SafetensorsFile::open(&src.join("model.safetensors")).unwrap();
    let half =
        |b: &[u8], i: usize| half::f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let mut out = Vec::new();
    for bits in [2usize, 1] {
        let folder = dir.join(format!("mlx{bits}"));
        std::fs::create_dir_all(&folder).unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|x| x == "json") {
                std::fs::copy(&p, folder.join(p.file_name().unwrap())).unwrap();
            }
        }
        let (mut specs, mut data) = (Vec::new(), Vec::new());
        for (name, info) in &file.header().tensors {
            let bytes = file.get(name).unwrap().1;
            let Some(module) = name
                .strip_suffix(".weight")
                .filter(|m| file.header().tensors.contains_key(&format!("{m}.scales")))
            else {
                if name.ends_with(".scales") || name.ends_with(".biases") {
                    continue;
                }
                specs.push(TensorSpec {
                    name: name.clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                });
                data.push(bytes.to_vec());
                continue;
            };
            let (rows, cols) = (info.shape[0], info.shape[1] * 16);
            let scales = file.get(&format!("{module}.scales")).unwrap().1;
            let groups = scales.len() / 2;
            // Binary: code 0 stays −s, codes 1 and 2 become +s.
            let bit = |k: usize| (bytes[k / 4] >> (2 * (k % 4))) & 3 != 0;
            let mut codes = vec![0u8; rows * cols * bits / 8];
            for k in 0..rows * cols {
                if bit(k) {
                    codes[k * bits / 8] |= if bits == 2 {
                        2 << (2 * (k % 4))
                    } else {
                        1 << (k % 8)
                    };
                }
            }
            let (mut sc, mut bi) = (Vec::new(), Vec::new());
            for g in 0..groups {
                let s = half(scales, g);
                let scale = if bits == 2 {
                    s
                } else {
                    half::f16::from_f32(2.0 * s.to_f32())
                };
                sc.extend_from_slice(&scale.to_bits().to_le_bytes());
                bi.extend_from_slice(&(-s).to_bits().to_le_bytes());
            }
            let sinfo = &file.header().tensors[&format!("{module}.scales")];
            specs.push(TensorSpec {
                name: name.clone(),
                dtype: Dtype::U32,
                shape: vec![rows, cols * bits / 32],
            });
            data.push(codes);
            for (suffix, bytes) in [("scales", sc), ("biases", bi)] {
                specs.push(TensorSpec {
                    name: format!("{module}.{suffix}"),
                    dtype: sinfo.dtype,
                    shape: sinfo.shape.clone(),
                });
                data.push(bytes);
            }
        }
        safetensors::write(
            &folder.join("model.safetensors"),
            &BTreeMap::new(),
            &specs,
            |i, w| w.write_all(&data[i]).map_err(|e| trit::Error::io("x", e)),
        )
        .unwrap();
        let config = folder.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        for key in ["quantization", "quantization_config"] {
            if let Some(q) = v.get_mut(key) {
                q["bits"] = serde_json::json!(bits);
            }
        }
        std::fs::write(&config, serde_json::to_vec(&v).unwrap()).unwrap();
        out.push(folder);
    }
    (out[0].clone(), out[1].clone())
}

/// 1-bit Bonsai's MLX pack reads as the same ternary weights as a 2-bit pack of the same
/// binary values (the 2-bit reader is the one checked against mlx-lm): identical logits.
#[test]
fn a_one_bit_mlx_pack_reads_as_its_binary_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (two, one) = binary_mlx_twins(dir.path());
    let load = |p: &std::path::Path| Model::load(&trit::format::open(p).unwrap(), 2).unwrap();
    let (a, b) = (load(&two), load(&one));
    assert_eq!(a.weight_bytes(), b.weight_bytes());
    let tokens = [3u32, 17, 99, 512, 7];
    let (mut ca, mut cb) = (a.new_cache(8), b.new_cache(8));
    assert_eq!(
        a.forward(&tokens, &mut ca, Logits::All).unwrap(),
        b.forward(&tokens, &mut cb, Logits::All).unwrap()
    );
}

/// `trit info`'s memory line (`model::weights::loaded_bytes` summed over a file's tensors,
/// without loading) is what the loaded model holds, for every format, base-3 and binary ones
/// included (their files are smaller than their 2-bit layout in memory). The estimate takes one
/// scale per group of the file's type; the loader keeps fewer where neighbouring groups share
/// one (as these generated models' do, per 256 columns), so the loaded matrices lie between the
/// estimate without its ternary scales and the estimate. (`weight_bytes` counts matrices only.)
#[test]
fn the_memory_estimate_matches_the_loaded_weights() {
    use trit::format::TensorData;
    let dir = tempfile::tempdir().unwrap();
    let formats = ["mlx", "q2_0", "pq2_0", "ptq1_0", "tq2_0", "tq1_0", "f16"];
    let outs: Vec<OutFormat> = formats
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    generate(
        &small_vocab_tiny(),
        3,
        dir.path(),
        &outs,
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let mut paths: Vec<std::path::PathBuf> = outs
        .iter()
        .map(|f| dir.path().join(f.file_name()))
        .collect();
    let twins = dir.path().join("twins");
    std::fs::create_dir_all(&twins).unwrap();
    paths.push(binary_twins(&twins).0);
    paths.push(binary_mlx_twins(&twins).1);
    for path in paths {
        let files = trit::format::open(&path).unwrap();
        let (mut estimate, mut scales) = (0, 0);
        for name in files.weights.tensor_names() {
            let view = files.weights.tensor(&name).unwrap().unwrap();
            if view.shape.len() != 2 {
                continue;
            }
            estimate += trit::model::weights::loaded_bytes(&view);
            let (rows, cols) = (view.shape[0].div_ceil(16) * 16, view.shape[1]);
            scales += match view.data {
                TensorData::Ggml { ty, .. } if ty.reads_as_ternary() => {
                    rows * cols / ty.block_size().min(256) * 2
                }
                TensorData::Mlx { group_size, .. } => rows * cols / group_size * 2,
                _ => 0,
            };
        }
        let loaded = Model::load(&files, 1).unwrap().weight_bytes();
        assert!(
            estimate - scales <= loaded && loaded <= estimate,
            "{}: estimate {estimate} ({scales} of scales), loaded {loaded}",
            path.display()
        );
    }
}
