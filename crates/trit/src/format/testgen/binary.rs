//! Binary (1-bit Bonsai) twins of the generated tiny model, for the tests that check binary
//! weights on the CPU (`crates/trit/tests/binary_weights.rs`) and on the GPU (trit-cuda's
//! `gpu_vs_cpu`): every ternary matrix made binary (zeros become +s), written in a binary
//! format and in a format the engine already reads for the same values.

use super::{generate, OutFormat, Preset, TokenizerAssets};
use crate::format::gguf::GgufFile;
use crate::format::gguf_write::GgufWriter;
use crate::format::safetensors::{self, SafetensorsFile, TensorSpec};
use crate::format::Dtype;
use crate::quant::{self, q1_0, GgmlType};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The tiny preset with a 2,048-token vocabulary (quick to generate and load).
pub fn small_vocab_tiny() -> Result<Preset> {
    Ok(Preset {
        vocab: 2048,
        bos: 2000,
        eos: 2001,
        pad: 2000,
        ..Preset::by_name("tiny")?
    })
}

fn bad(what: &str) -> Error {
    Error::InvalidArgument(format!("binary twins: {what}"))
}

/// The tiny model (seed 11) with its matrices binary (one scale per 128 columns), written
/// twice into `dir`: as GGUF Q1_0 and as F32. Returns (Q1_0 file, F32 file).
pub fn q1_0_twins(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let f = OutFormat::parse("q2_0")?;
    generate(
        &small_vocab_tiny()?,
        11,
        dir,
        &[f],
        &TokenizerAssets::Placeholder,
    )?;
    let src = GgufFile::open(dir.join(f.file_name()))?;
    let (mut bin, mut dense) = (GgufWriter::new(), GgufWriter::new());
    for (k, v) in src.metadata() {
        bin.add(k.clone(), v.clone())?;
        dense.add(k.clone(), v.clone())?;
    }
    for t in src.tensors() {
        let data = src.tensor_data(t);
        if !t.ty.is_ternary() {
            bin.add_tensor(t.name.clone(), &t.shape, t.ty, data.to_vec())?;
            dense.add_tensor(t.name.clone(), &t.shape, t.ty, data.to_vec())?;
            continue;
        }
        let n: usize = t.shape.iter().product();
        let mut w = vec![0f32; n];
        quant::dequantize(t.ty, data, n, &mut w)?;
        for block in w.chunks_exact_mut(q1_0::BLOCK) {
            // The block's scale: its largest magnitude (every value of a Q2_0 slice is 0 or ±s).
            let d = block.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
            let d = half::f16::from_f32(d).to_f32();
            for x in block.iter_mut() {
                *x = if *x < 0.0 { -d } else { d };
            }
        }
        bin.add_tensor(
            t.name.clone(),
            &t.shape,
            GgmlType::Q1_0,
            q1_0::encode_row(&w)?,
        )?;
        let f32s: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        dense.add_tensor(t.name.clone(), &t.shape, GgmlType::F32, f32s)?;
    }
    let (a, b) = (dir.join("binary.gguf"), dir.join("dense.gguf"));
    bin.write_file(&a)?;
    dense.write_file(&b)?;
    Ok((a, b))
}

/// The tiny generated MLX folder (seed 13) made binary, written as a 2-bit pack (codes 0/2,
/// `bias = −scale`) and as a 1-bit pack (1-bit Bonsai's layout: one bit per weight,
/// `scale = 2s`, `bias = −s`). Returns (2-bit folder, 1-bit folder).
pub fn mlx_1bit_twins(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    generate(
        &small_vocab_tiny()?,
        13,
        dir,
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )?;
    let src = dir.join("mlx");
    let file = SafetensorsFile::open(&src.join("model.safetensors"))?;
    let half =
        |b: &[u8], i: usize| half::f16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let missing = |name: &str| bad(&format!("no tensor {name}"));
    let mut out = Vec::new();
    for bits in [2usize, 1] {
        let folder = dir.join(format!("mlx{bits}"));
        std::fs::create_dir_all(&folder).map_err(|e| Error::io(&folder, e))?;
        for f in std::fs::read_dir(&src).map_err(|e| Error::io(&src, e))? {
            let p = f.map_err(|e| Error::io(&src, e))?.path();
            if p.extension().is_some_and(|x| x == "json") {
                let to = folder.join(p.file_name().ok_or_else(|| bad("file name"))?);
                std::fs::copy(&p, &to).map_err(|e| Error::io(&to, e))?;
            }
        }
        let (mut specs, mut data) = (Vec::new(), Vec::new());
        for (name, info) in &file.header().tensors {
            let bytes = file.get(name).ok_or_else(|| missing(name))?.1;
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
            let scales_name = format!("{module}.scales");
            let scales = file
                .get(&scales_name)
                .ok_or_else(|| missing(&scales_name))?
                .1;
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
            let sinfo = &file.header().tensors[&scales_name];
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
        let path = folder.join("model.safetensors");
        safetensors::write(&path, &BTreeMap::new(), &specs, |i, w| {
            w.write_all(&data[i]).map_err(|e| Error::io(&path, e))
        })?;
        let config = folder.join("config.json");
        let text = std::fs::read(&config).map_err(|e| Error::io(&config, e))?;
        let mut v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| bad(&format!("config.json: {e}")))?;
        for key in ["quantization", "quantization_config"] {
            if let Some(q) = v.get_mut(key) {
                q["bits"] = serde_json::json!(bits);
            }
        }
        let text = serde_json::to_vec(&v).map_err(|e| bad(&e.to_string()))?;
        std::fs::write(&config, text).map_err(|e| Error::io(&config, e))?;
        out.push(folder);
    }
    Ok((out[0].clone(), out[1].clone()))
}
