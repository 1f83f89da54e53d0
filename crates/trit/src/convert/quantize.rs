//! `trit convert --quantize`: a full-precision Hugging Face model (safetensors F32/F16/BF16)
//! to ternary by per-group absmean scaling, BitNet b1.58's rule:
//!
//! `s = mean |w|` over each group of `group` consecutive inputs of a row (rounded to f16, the
//! scale every ternary format stores), `t = clip(round(w / s), -1, 1)` (round half to even).
//!
//! This is post-training quantization: without quantization-aware training a model loses much
//! of its quality (the per-tensor relative error is reported so the user sees how much). Only
//! the projections inside the transformer blocks are ternarized; the embedding, the LM head and
//! the norms keep their precision. A LoRA adapter, when given, is fused into the full-precision
//! weights first (`W + scale · B·A`).

use super::ternary::{ErrorStats, TernaryMatrix, SLICE};
use super::{ConvertOptions, ConvertReport, Progress, Target};
use crate::format::config::ModelConfig;
use crate::format::folder::{chat_template, generation_defaults, hf_to_canonical, read_json};
use crate::format::safetensors::SafetensorsSet;
use crate::format::{Dtype, ModelFiles, TensorData, TensorView, TokenizerSource, WeightSource};
use crate::model::lora::LoraAdapter;
use crate::{Error, Result};
use half::f16;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Default inputs per scale (the group of every Bonsai model and of PQ2_0/PTQ1_0/MLX).
pub const DEFAULT_GROUP: usize = 128;

#[derive(Clone, Copy, Debug)]
pub struct QuantizeOptions {
    pub target: Target,
    /// Inputs per absmean scale; raised to the target's group when that is larger (TQ: 256).
    pub group: usize,
}

fn is_projection(name: &str) -> bool {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(_, sub)| sub.strip_suffix(".weight"))
        .is_some_and(|sub| crate::format::PROJECTIONS.contains(&sub))
}

/// Absmean ternarization of a `rows × cols` matrix with one scale per `group` inputs. Returns
/// the ternary matrix and the error against `w` (over non-zero weights, and Frobenius).
pub fn absmean(
    name: &str,
    w: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<(TernaryMatrix, ErrorStats)> {
    if group == 0 || !group.is_multiple_of(SLICE) || !cols.is_multiple_of(group) {
        return Err(Error::Unsupported(format!(
            "tensor '{name}': width {cols} is not a multiple of the quantization group {group} \
             (a multiple of {SLICE})"
        )));
    }
    let gpr = cols / group;
    let mut codes = vec![1u8; rows * cols];
    let mut scales = vec![0f32; rows * gpr];
    let bad = codes
        .par_chunks_mut(cols)
        .zip(scales.par_chunks_mut(gpr))
        .enumerate()
        .find_map_any(|(r, (codes, scales))| {
            for (g, s_out) in scales.iter_mut().enumerate() {
                let span = r * cols + g * group..r * cols + (g + 1) * group;
                let vals = &w[span];
                let mean = vals.iter().map(|&v| (v as f64).abs()).sum::<f64>() / group as f64;
                let s = f16::from_f64(mean).to_f32();
                if !s.is_finite() || !mean.is_finite() {
                    return Some(format!(
                        "row {r}, group {g}: mean |w| = {mean:e} does not fit an f16 scale"
                    ));
                }
                *s_out = s;
                if s == 0.0 {
                    continue;
                }
                let s64 = s as f64;
                for (c, &v) in codes[g * group..(g + 1) * group].iter_mut().zip(vals) {
                    let t = (v as f64 / s64).round_ties_even().clamp(-1.0, 1.0);
                    *c = (t + 1.0) as u8;
                }
            }
            None
        });
    if let Some(msg) = bad {
        return Err(Error::Unsupported(format!("tensor '{name}': {msg}")));
    }
    let per = group / SLICE;
    let m = TernaryMatrix {
        rows,
        cols,
        codes,
        scales64: scales
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s, per))
            .collect(),
    };
    let q = m.dequantize();
    let (mut err2, mut norm2, mut sum_rel, mut max_rel, mut nonzero) = (0f64, 0f64, 0f64, 0f64, 0);
    for (&a, &b) in w.iter().zip(&q) {
        let (a, b) = (a as f64, b as f64);
        err2 += (a - b) * (a - b);
        norm2 += a * a;
        if a != 0.0 {
            let rel = (a - b).abs() / a.abs();
            sum_rel += rel;
            max_rel = f64::max(max_rel, rel);
            nonzero += 1;
        }
    }
    let stats = ErrorStats {
        lossy_blocks: 0,
        blocks: rows * gpr,
        max_rel,
        mean_rel: if nonzero > 0 {
            sum_rel / nonzero as f64
        } else {
            0.0
        },
        rel_fro: if norm2 > 0.0 {
            (err2 / norm2).sqrt()
        } else {
            0.0
        },
    };
    Ok((m, stats))
}

/// The plain tensors of a full-precision folder under canonical names.
struct FullPrecision {
    files: SafetensorsSet,
    /// canonical → (HF tensor name, dtype)
    entries: BTreeMap<String, (String, Dtype)>,
}

impl WeightSource for FullPrecision {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let Some((hf, dtype)) = self.entries.get(name) else {
            return Ok(None);
        };
        let (info, bytes) = self
            .files
            .get(hf)
            .ok_or_else(|| Error::MissingTensor(hf.clone()))?;
        let data = match dtype {
            Dtype::F32 => TensorData::F32(bytes),
            Dtype::F16 => TensorData::F16(bytes),
            _ => TensorData::BF16(bytes),
        };
        Ok(Some(TensorView {
            name: name.to_string(),
            shape: info.shape.clone(),
            data,
        }))
    }

    fn tensor_names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn describe(&self) -> String {
        "full-precision safetensors".into()
    }
}

/// Opens a Hugging Face folder of F32/F16/BF16 weights without the ternary check.
fn open_full_precision(dir: &Path) -> Result<ModelFiles> {
    let config_path = dir.join("config.json");
    let config_json = read_json(&config_path)?
        .ok_or_else(|| Error::Config(format!("{}: no config.json", dir.display())))?;
    if config_json
        .get("quantization")
        .is_some_and(|q| !q.is_null())
    {
        return Err(Error::Unsupported(format!(
            "{}: already quantized (config.json has a quantization block); --quantize takes a \
             full-precision model, a plain repack needs no --quantize",
            dir.display()
        )));
    }
    let generation = read_json(&dir.join("generation_config.json"))?;
    let tok_cfg_path = dir.join("tokenizer_config.json");
    let tok_cfg = read_json(&tok_cfg_path)?;
    let files = SafetensorsSet::open_dir(dir)?;
    let has_lm_head = files.contains("lm_head.weight");
    let mut config = ModelConfig::from_hf_json(
        &config_json,
        generation.as_ref(),
        tok_cfg.as_ref(),
        !has_lm_head,
        &dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    )?;
    let mut entries = BTreeMap::new();
    for hf in files.names() {
        let (info, _) = files.get(&hf).expect("listed");
        let module = hf.strip_suffix(".weight").ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor '{hf}': trit knows only '.weight' tensors here"
            ))
        })?;
        if module == "lm_head" && config.tied_embeddings {
            continue;
        }
        let canonical = hf_to_canonical(module)
            .ok_or_else(|| Error::Unsupported(format!("tensor '{hf}': not a module trit knows")))?;
        if !info.dtype.is_float() {
            return Err(Error::Unsupported(format!(
                "tensor '{hf}' has dtype {}; --quantize takes F32/F16/BF16 weights",
                info.dtype.name()
            )));
        }
        entries.insert(format!("{canonical}.weight"), (hf.clone(), info.dtype));
    }
    let source = FullPrecision { files, entries };
    config.check_tensors(&source)?;
    let tokenizer_path = dir.join("tokenizer.json");
    Ok(ModelFiles {
        chat_template: chat_template(dir, tok_cfg.as_ref())?,
        generation: generation_defaults(generation.as_ref()),
        config,
        weights: Box::new(source),
        tokenizer: TokenizerSource::Json {
            tokenizer: tokenizer_path,
            config: tok_cfg.as_ref().map(|_| tok_cfg_path.clone()),
        },
        path: dir.to_path_buf(),
        format_name: "full-precision safetensors".into(),
        rotation: None,
    })
}

/// Ternarizes the full-precision model at `input` (after fusing `adapter`) into `output`.
pub fn quantize(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    adapter: Option<&LoraAdapter>,
    progress: Progress<'_>,
) -> Result<ConvertReport> {
    let files = open_full_precision(input)?;
    if let Some(a) = adapter {
        a.check(&files.config)?;
    }
    let (target_group, _) = opts.target.group();
    let group = opts.group.max(target_group);
    if !group.is_multiple_of(target_group) {
        return Err(Error::InvalidArgument(format!(
            "quantization group {group} is not a multiple of {}'s group {target_group}",
            opts.target.name()
        )));
    }
    let run = |name: &str, view: &TensorView<'_>| -> Result<(TernaryMatrix, ErrorStats)> {
        let mut w = super::dense_values(view)?;
        if let Some(delta) = adapter.and_then(|a| a.delta(name)) {
            w.iter_mut().zip(&delta).for_each(|(x, d)| *x += d);
        }
        absmean(name, &w, view.rows(), view.cols(), group)
    };
    let quantizer = super::Quantizer {
        applies: &is_projection,
        run: &run,
    };
    let convert_opts = ConvertOptions {
        target: opts.target,
        allow_lossy: false,
    };
    super::convert_files(
        &files,
        input,
        output,
        &convert_opts,
        Some(&quantizer),
        progress,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absmean_follows_the_bitnet_rule() {
        // One group of 64: mean |w| = 0.5 → codes by round(w / 0.5) clipped to ±1.
        let mut w = vec![0.48625f32; 64];
        w[0] = -2.0; // clipped to -1
        w[1] = 0.2; // 0.4 → 0
        w[2] = 0.25; // 0.5 → 0 (half to even)
        w[3] = 0.375; // 0.75 → 1
                      // Σ|w| = 2.825 + 60 · 0.48625 ≈ 32: the mean rounds to the f16 scale 0.5.
        let (m, stats) = absmean("w", &w, 1, 64, 64).unwrap();
        assert_eq!(m.scales64, [0.5]);
        assert_eq!(&m.codes[..4], &[0, 1, 1, 2]);
        assert!(stats.rel_fro > 0.0 && stats.max_rel >= 0.5);
        assert!(absmean("w", &w, 1, 64, 128).is_err());
        let zeros = absmean("z", &[0.0; 64], 1, 64, 64).unwrap().0;
        assert_eq!(zeros.codes, vec![1; 64]);
        assert!(absmean("big", &[1e6; 64], 1, 64, 64)
            .unwrap_err()
            .to_string()
            .contains("f16"));
    }

    #[test]
    fn only_block_projections_are_ternarized() {
        assert!(is_projection("blk.3.ffn_down.weight"));
        assert!(!is_projection("blk.3.attn_norm.weight"));
        assert!(!is_projection("token_embd.weight"));
        assert!(!is_projection("output.weight"));
    }
}
