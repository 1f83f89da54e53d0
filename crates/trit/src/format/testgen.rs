//! Deterministic random ternary models of real shapes (assets.md §6), written as an MLX 2-bit
//! folder, GGUF files in every ternary block type, and an unpacked F16 folder.
//!
//! Every tensor is a pure function of (preset, seed, canonical name): each row has its own
//! SplitMix64 stream seeded from (seed, CRC-32 of the name, row), so rows generate in parallel
//! and any tensor can be regenerated alone. Codes are uniform on {-1, 0, +1}; scales are one f16
//! per row per 256 inputs, `base · U(0.5, 1.5)` (`base = sqrt(1.5 / fan_in)` for projections,
//! 0.1 for the embedding), and each 256-scale serves all of its 64/128-groups so the same values
//! are exact in every format. Norm weights are f16 `1 + 0.1 · N(0, 1)`.

pub mod binary;
pub mod bitnet;
pub mod hybrid;
mod hybrid_gguf;
mod tokenizer_meta;
mod writers;

pub use tokenizer_meta::{LoadedTokenizer, TokenizerAssets};
pub use writers::{write_f16_folder, write_gguf, write_mlx_folder};

use super::config::Arch;
use crate::quant::GgmlType;
use crate::{Error, Result};
use half::f16;
use rayon::prelude::*;
use std::path::Path;

/// Inputs sharing one generated scale.
pub const SCALE_GROUP: usize = 256;

/// Shapes and hyper-parameters of a generated model.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub tied: bool,
    pub rope_theta: f32,
    pub norm_eps: f32,
    pub max_pos: usize,
    /// YaRN `(factor, original_max_position_embeddings)`.
    pub yarn: Option<(f32, usize)>,
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    /// BitNet b1.58 (`Arch::Llama` + sub-norms, relu² MLP, per-tensor scales, dense bf16
    /// embedding); written by `testgen::bitnet`.
    pub bitnet: bool,
}

pub const PRESET_NAMES: &[&str] = &[
    "tiny",
    "tiny-untied-yarn",
    "tiny-llama",
    "1.7b",
    "8b",
    "tiny-bitnet",
    "2b-bitnet",
];

impl Preset {
    pub fn by_name(name: &str) -> Result<Preset> {
        let tiny = Preset {
            name: "tiny",
            arch: Arch::Qwen3,
            hidden: 256,
            n_layers: 4,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            ffn: 768,
            vocab: 151_936,
            tied: true,
            rope_theta: 1e6,
            norm_eps: 1e-6,
            max_pos: 40_960,
            yarn: None,
            bos: 151_643,
            eos: 151_645,
            pad: 151_643,
            bitnet: false,
        };
        // Llama-3 vocabulary and ids (assets.md §2), models.md §4's hyper-parameters.
        let bitnet = Preset {
            name: "2b-bitnet",
            arch: Arch::Llama,
            hidden: 2560,
            n_layers: 30,
            n_heads: 20,
            n_kv_heads: 5,
            head_dim: 128,
            ffn: 6912,
            vocab: 128_256,
            tied: true,
            rope_theta: 500_000.0,
            norm_eps: 1e-5,
            max_pos: 4096,
            yarn: None,
            bos: 128_000,
            eos: 128_009,
            pad: 128_001,
            bitnet: true,
        };
        Ok(match name {
            "2b-bitnet" => bitnet,
            "tiny-bitnet" => Preset {
                name: "tiny-bitnet",
                hidden: 256,
                n_layers: 3,
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 64,
                ffn: 768,
                ..bitnet
            },
            "tiny" => tiny,
            "tiny-untied-yarn" => Preset {
                name: "tiny-untied-yarn",
                tied: false,
                yarn: Some((4.0, 4096)),
                ..tiny
            },
            "tiny-llama" => Preset {
                name: "tiny-llama",
                arch: Arch::Llama,
                rope_theta: 100_000.0,
                norm_eps: 1e-5,
                ..tiny
            },
            "1.7b" => Preset {
                name: "1.7b",
                hidden: 2048,
                n_layers: 28,
                n_heads: 16,
                n_kv_heads: 8,
                head_dim: 128,
                ffn: 6144,
                ..tiny
            },
            "8b" => Preset {
                name: "8b",
                hidden: 4096,
                n_layers: 36,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 128,
                ffn: 12288,
                tied: false,
                ..tiny
            },
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown preset '{other}' (known: {})",
                    PRESET_NAMES.join(", ")
                )))
            }
        })
    }

    pub fn qk_norm(&self) -> bool {
        self.arch == Arch::Qwen3
    }

    /// Every tensor of the model, canonical names, embedding first.
    pub fn tensors(&self) -> Vec<Plan> {
        let (h, q, kv, f, hd) = (
            self.hidden,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
            self.ffn,
            self.head_dim,
        );
        let proj = |name: String, out: usize, inp: usize| Plan {
            name,
            shape: vec![out, inp],
            kind: Kind::Ternary {
                base: (1.5 / inp as f32).sqrt(),
            },
        };
        let norm = |name: String, n: usize| Plan {
            name,
            shape: vec![n],
            kind: Kind::Norm,
        };
        // BitNet keeps its embedding in bf16 (a uniform bf16 matrix here).
        let embed_kind = if self.bitnet {
            Kind::Small { lo: -0.1, hi: 0.1 }
        } else {
            Kind::Ternary { base: 0.1 }
        };
        let mut v = vec![Plan {
            name: "token_embd.weight".into(),
            shape: vec![self.vocab, h],
            kind: embed_kind,
        }];
        for i in 0..self.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            v.push(norm(n("attn_norm"), h));
            v.push(proj(n("attn_q"), q, h));
            v.push(proj(n("attn_k"), kv, h));
            v.push(proj(n("attn_v"), kv, h));
            v.push(proj(n("attn_output"), h, q));
            if self.qk_norm() {
                v.push(norm(n("attn_q_norm"), hd));
                v.push(norm(n("attn_k_norm"), hd));
            }
            if self.bitnet {
                v.push(norm(n("attn_sub_norm"), q));
            }
            v.push(norm(n("ffn_norm"), h));
            v.push(proj(n("ffn_gate"), f, h));
            v.push(proj(n("ffn_up"), f, h));
            if self.bitnet {
                v.push(norm(n("ffn_sub_norm"), f));
            }
            v.push(proj(n("ffn_down"), h, f));
        }
        v.push(norm("output_norm.weight".into(), h));
        if !self.tied {
            v.push(proj("output.weight".into(), self.vocab, h));
        }
        v
    }
}

/// One tensor to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Ternary {
        base: f32,
    },
    Norm,
    /// Uniform on `[lo, hi)`, rounded to bf16 so the value is exact in f16, bf16 and f32
    /// (small unquantized matrices such as the hybrid's `ssm_alpha`/`ssm_beta`).
    Small {
        lo: f32,
        hi: f32,
    },
    /// Uniform on `[lo, hi)` in f32 (per-head parameters kept in full precision).
    Param {
        lo: f32,
        hi: f32,
    },
}

/// A generated ternary matrix: codes `t + 1` (one byte each, row-major) and one f16 scale per
/// row per 256 inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Ternary {
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f16>,
}

impl Ternary {
    /// The scale of row `r`, column `c`.
    pub fn scale(&self, r: usize, c: usize) -> f16 {
        self.scales[r * (self.cols / SCALE_GROUP) + c / SCALE_GROUP]
    }

    /// The weight `s · t` (exact in f32).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        self.scale(r, c).to_f32() * (self.codes[r * self.cols + c] as f32 - 1.0)
    }

    /// One f32 scale per 64 columns (the `TernaryRows` convention), row-major.
    pub fn scales64(&self) -> Vec<f32> {
        let per = SCALE_GROUP / 64;
        self.scales
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.to_f32(), per))
            .collect()
    }

    /// Reorders the rows of each head as llama.cpp's converter does for GGUF `llama` Q/K, so
    /// that adjacent-pair RoPE on the file equals rotate-half RoPE on the original: within a
    /// head of `head_dim` rows, new row `2i + j` is old row `j · head_dim/2 + i`.
    pub fn permute_for_adjacent_rope(&self, n_heads: usize) -> Ternary {
        let hd = self.rows / n_heads;
        let half = hd / 2;
        let spr = self.cols / SCALE_GROUP;
        let mut out = Ternary {
            rows: self.rows,
            cols: self.cols,
            codes: vec![0; self.codes.len()],
            scales: vec![f16::ZERO; self.scales.len()],
        };
        for new in 0..self.rows {
            let (h, k) = (new / hd, new % hd);
            let old = h * hd + (k % 2) * half + k / 2;
            out.codes[new * self.cols..(new + 1) * self.cols]
                .copy_from_slice(&self.codes[old * self.cols..(old + 1) * self.cols]);
            out.scales[new * spr..(new + 1) * spr]
                .copy_from_slice(&self.scales[old * spr..(old + 1) * spr]);
        }
        out
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64: tiny, fast, statistically solid for test data, and trivially seekable per row.
struct SplitMix(u64);

impl SplitMix {
    fn for_row(seed: u64, name: &str, row: usize) -> SplitMix {
        let crc = crc32fast::hash(name.as_bytes()) as u64;
        SplitMix(mix64(mix64(mix64(seed) ^ crc) ^ row as u64))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Trits drawn from one 64-bit word (each multiply-by-3 step consumes log2(3) bits).
const TRITS_PER_WORD: usize = 20;

/// Fills a row with codes in {0, 1, 2} and its scales.
fn gen_row(mut rng: SplitMix, base: f32, codes: &mut [u8], scales: &mut [f16]) {
    for s in scales.iter_mut() {
        *s = f16::from_f32(base * (0.5 + rng.unit() as f32));
    }
    for chunk in codes.chunks_mut(TRITS_PER_WORD) {
        let mut v = rng.next_u64();
        for c in chunk {
            let p = (v as u128) * 3;
            *c = (p >> 64) as u8;
            v = p as u64;
        }
    }
}

/// Generates a ternary matrix (`plan.kind` must be `Ternary`).
pub fn gen_ternary(seed: u64, plan: &Plan) -> Ternary {
    let Kind::Ternary { base } = plan.kind else {
        panic!("gen_ternary on norm tensor {}", plan.name)
    };
    let (rows, cols) = (plan.shape[0], plan.shape[1]);
    assert!(
        cols.is_multiple_of(SCALE_GROUP),
        "{}: cols {cols}",
        plan.name
    );
    let spr = cols / SCALE_GROUP;
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![f16::ZERO; rows * spr];
    codes
        .par_chunks_mut(cols)
        .zip(scales.par_chunks_mut(spr))
        .enumerate()
        .for_each(|(r, (c, s))| gen_row(SplitMix::for_row(seed, &plan.name, r), base, c, s));
    Ternary {
        rows,
        cols,
        codes,
        scales,
    }
}

/// Generates a norm weight: f16 `1 + 0.1 · N(0, 1)` (Box–Muller).
pub fn gen_norm(seed: u64, plan: &Plan) -> Vec<f16> {
    let mut rng = SplitMix::for_row(seed, &plan.name, 0);
    (0..plan.shape[0])
        .map(|_| {
            let u1 = 1.0 - rng.unit();
            let u2 = rng.unit();
            let n = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            f16::from_f64(1.0 + 0.1 * n)
        })
        .collect()
}

/// Generates a `Small` or `Param` tensor (row-major, `plan.shape` elements).
pub fn gen_uniform(seed: u64, plan: &Plan) -> Vec<f32> {
    let (lo, hi, round) = match plan.kind {
        Kind::Small { lo, hi } => (lo, hi, true),
        Kind::Param { lo, hi } => (lo, hi, false),
        _ => panic!("gen_uniform on {}", plan.name),
    };
    let mut rng = SplitMix::for_row(seed, &plan.name, 0);
    let n: usize = plan.shape.iter().product();
    (0..n)
        .map(|_| {
            let v = lo + (hi - lo) * rng.unit() as f32;
            if round {
                half::bf16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect()
}

/// An output format of `generate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutFormat {
    Mlx,
    /// A Hugging Face BitNet folder (packed uint8 projections + `weight_scale`).
    Hf,
    Gguf(GgmlType),
    F16,
}

impl OutFormat {
    pub fn parse(s: &str) -> Result<OutFormat> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "mlx" => OutFormat::Mlx,
            "hf" => OutFormat::Hf,
            "f16" => OutFormat::F16,
            "q2_0" => OutFormat::Gguf(GgmlType::Q2_0),
            "pq2_0" => OutFormat::Gguf(GgmlType::PQ2_0),
            "ptq1_0" => OutFormat::Gguf(GgmlType::PTQ1_0),
            "tq1_0" => OutFormat::Gguf(GgmlType::TQ1_0),
            "tq2_0" => OutFormat::Gguf(GgmlType::TQ2_0),
            other => {
                return Err(Error::InvalidArgument(format!(
                "unknown format '{other}' (known: mlx, hf, q2_0, pq2_0, ptq1_0, tq2_0, tq1_0, f16)"
            )))
            }
        })
    }

    /// Where `generate` writes it inside the output folder.
    pub fn file_name(self) -> String {
        match self {
            OutFormat::Mlx => "mlx".into(),
            OutFormat::Hf => "hf".into(),
            OutFormat::F16 => "f16".into(),
            OutFormat::Gguf(ty) => format!("model-{}.gguf", ty.name().to_ascii_lowercase()),
        }
    }
}

/// Writes every requested format of one model into `out`: `out/mlx/`, `out/model-<fmt>.gguf`,
/// `out/f16/`.
pub fn generate(
    preset: &Preset,
    seed: u64,
    out: &Path,
    formats: &[OutFormat],
    tokenizer: &TokenizerAssets,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let tok = tokenizer.load(preset.vocab)?;
    if preset.bitnet {
        return bitnet::generate(preset, seed, out, formats, &tok);
    }
    for &f in formats {
        let path = out.join(f.file_name());
        match f {
            OutFormat::Hf => {
                return Err(Error::InvalidArgument(format!(
                    "format hf is the BitNet folder layout; preset {} is not a bitnet preset",
                    preset.name
                )))
            }
            OutFormat::Mlx => write_mlx_folder(preset, seed, &path, &tok)?,
            OutFormat::F16 => write_f16_folder(preset, seed, &path, &tok)?,
            OutFormat::Gguf(ty) => write_gguf(preset, seed, &path, ty, &tok)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_balanced() {
        let p = Preset::by_name("tiny").unwrap();
        let plan = &p.tensors()[2]; // blk.0.attn_q
        assert_eq!(plan.name, "blk.0.attn_q.weight");
        let a = gen_ternary(7, plan);
        assert_eq!(a, gen_ternary(7, plan));
        assert_ne!(a.codes, gen_ternary(8, plan).codes);
        let mut counts = [0usize; 4];
        a.codes.iter().for_each(|&c| counts[c as usize] += 1);
        let n = a.codes.len() as f64;
        assert_eq!(counts[3], 0);
        for &c in &counts[..3] {
            assert!((c as f64 / n - 1.0 / 3.0).abs() < 0.01, "{counts:?}");
        }
        let base = (1.5f32 / 256.0).sqrt();
        for s in &a.scales {
            let s = s.to_f32();
            assert!(s >= 0.5 * base * 0.999 && s <= 1.5 * base * 1.001, "{s}");
        }
        let norm = gen_norm(7, &p.tensors()[1]);
        let mean = norm.iter().map(|x| x.to_f32()).sum::<f32>() / norm.len() as f32;
        assert!((mean - 1.0).abs() < 0.03, "{mean}");
    }

    #[test]
    fn presets_have_real_parameter_counts() {
        let billions = |name| -> f64 {
            let n: usize = Preset::by_name(name)
                .unwrap()
                .tensors()
                .iter()
                .map(|t| t.shape.iter().product::<usize>())
                .sum();
            n as f64 / 1e9
        };
        // models.md §2: 1.7B has 1.7206 B parameters, 8B has 8.19 B.
        assert_eq!((billions("1.7b") * 1e4).round(), 17_206.0);
        assert_eq!((billions("8b") * 1e2).round(), 819.0);
        assert!(Preset::by_name("3b").is_err());
        // BitNet b1.58 2B4T: 2,412,820,480 parameters (its bf16 release's count).
        let n: usize = Preset::by_name("2b-bitnet")
            .unwrap()
            .tensors()
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum();
        assert_eq!(n, 2_412_820_480);
    }

    #[test]
    fn permutation_matches_llama_converter() {
        // One head of 4 rows: converter order is rows [0, 2, 1, 3].
        let t = Ternary {
            rows: 4,
            cols: 256,
            codes: (0..4).flat_map(|r| vec![r as u8; 256]).collect(),
            scales: (0..4).map(|r| f16::from_f32(r as f32)).collect(),
        };
        let p = t.permute_for_adjacent_rope(1);
        let firsts: Vec<u8> = (0..4).map(|r| p.codes[r * 256]).collect();
        assert_eq!(firsts, vec![0, 2, 1, 3]);
        assert_eq!(p.scale(1, 0).to_f32(), 2.0);
    }
}
