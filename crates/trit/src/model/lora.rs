//! LoRA adapters: `y = W·x + scale · B·(A·x)`, the low-rank path computed in f32 beside the
//! ternary matmul (the ternary weights stay untouched), or fused into full-precision weights
//! before `trit convert --quantize`.
//!
//! Two folder layouts are read:
//! - mlx-lm (`mlx_lm/tuner/utils.py`, `tuner/lora.py`): `adapter_config.json` with
//!   `lora_parameters {rank, scale, dropout, keys?}`, `num_layers` (the last N blocks),
//!   `fine_tune_type`; `adapters.safetensors` with `<module>.lora_a` `[in, r]` and
//!   `<module>.lora_b` `[r, out]`; the layer computes `y + scale · (x @ lora_a) @ lora_b`.
//! - PEFT: `adapter_config.json` with `r`, `lora_alpha`, `target_modules`, `use_rslora`;
//!   `adapter_model.safetensors` with `base_model.model.<module>.lora_A.weight` `[r, in]` and
//!   `.lora_B.weight` `[out, r]`; scale `lora_alpha / r` (`/ sqrt(r)` with rsLoRA).
//!
//! Dropout is a training-time operation and is ignored.

use crate::format::config::{HybridConfig, ModelConfig};
use crate::format::folder::{canonical_to_hf, hf_to_canonical};
use crate::format::safetensors::SafetensorsFile;
use crate::format::Dtype;
use crate::quant::float;
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// One adapted projection: `A` is `[rank, in]`, `B` is `[out, rank]`, both row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub out_dim: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub scale: f32,
}

impl LoraPair {
    /// `out[t] += scale · B·(A·x[t])` for `n` rows of `x` (`in_dim` each) and `out`
    /// (`out_dim` each).
    pub fn add_to(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let mut z = vec![0f32; self.rank];
        for t in 0..n {
            let xr = &x[t * self.in_dim..(t + 1) * self.in_dim];
            for (zi, ar) in z.iter_mut().zip(self.a.chunks_exact(self.in_dim)) {
                *zi = self.scale * ar.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
            }
            let yr = &mut out[t * self.out_dim..(t + 1) * self.out_dim];
            for (y, br) in yr.iter_mut().zip(self.b.chunks_exact(self.rank)) {
                *y += br.iter().zip(&z).map(|(b, z)| b * z).sum::<f32>();
            }
        }
    }

    /// `scale · B·A` as a dense `[out, in]` matrix (for fusing).
    pub fn delta(&self) -> Vec<f32> {
        let mut d = vec![0f32; self.out_dim * self.in_dim];
        for (o, row) in d.chunks_exact_mut(self.in_dim).enumerate() {
            for k in 0..self.rank {
                let b = self.scale * self.b[o * self.rank + k];
                let a = &self.a[k * self.in_dim..(k + 1) * self.in_dim];
                row.iter_mut().zip(a).for_each(|(r, a)| *r += b * a);
            }
        }
        d
    }
}

/// A loaded adapter: one pair per adapted weight, under canonical names
/// (`blk.3.attn_q.weight`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraAdapter {
    pub pairs: BTreeMap<String, LoraPair>,
    /// `"mlx-lm"` or `"PEFT"`, for messages.
    pub layout: &'static str,
    /// mlx-lm's `num_layers`: only the last N blocks may be adapted (`None`: any block).
    pub num_layers: Option<usize>,
}

/// Projections an adapter may target, HF module suffix → canonical suffix.
const TARGETS: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    // Qwen3.5 hybrids' Gated DeltaNet layers (their full-attention layers take the four above;
    // q_proj's rows there hold each head's query and gate values).
    ("linear_attn.in_proj_qkv", "attn_qkv"),
    ("linear_attn.in_proj_z", "attn_gate"),
    ("linear_attn.in_proj_a", "ssm_alpha"),
    ("linear_attn.in_proj_b", "ssm_beta"),
    ("linear_attn.out_proj", "ssm_out"),
];

fn read_config(dir: &Path) -> Result<Value> {
    let path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::Config(format!(
            "{}: no readable adapter_config.json ({e}); an adapter folder holds \
             adapter_config.json plus adapters.safetensors (mlx-lm) or \
             adapter_model.safetensors (PEFT)",
            dir.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}

/// A float tensor of the adapter file as f32, with its shape.
fn tensor_f32(file: &SafetensorsFile, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let (info, bytes) = file
        .get(name)
        .ok_or_else(|| Error::MissingTensor(format!("{name} (adapter)")))?;
    let mut out = vec![0f32; info.shape.iter().product()];
    match info.dtype {
        Dtype::F32 => float::dequantize_f32(bytes, &mut out),
        Dtype::F16 => float::dequantize_f16(bytes, &mut out),
        Dtype::BF16 => float::dequantize_bf16(bytes, &mut out),
        other => {
            return Err(Error::Format(format!(
                "adapter tensor '{name}' has dtype {}; LoRA matrices are F32/F16/BF16",
                other.name()
            )))
        }
    }
    Ok((info.shape.clone(), out))
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// `model.layers.3.self_attn.q_proj` → (3, `blk.3.attn_q.weight`), or an error naming the key.
fn module_target(module: &str, file: &str) -> Result<(usize, String)> {
    let unknown = || {
        Error::Unsupported(format!(
            "{file}: adapter tensor for '{module}', which is not a projection trit can adapt \
             (known: {})",
            TARGETS
                .iter()
                .map(|(h, _)| *h)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let canonical = hf_to_canonical(module).ok_or_else(unknown)?;
    let rest = canonical.strip_prefix("blk.").ok_or_else(unknown)?;
    let (layer, sub) = rest.split_once('.').ok_or_else(unknown)?;
    if !TARGETS.iter().any(|(_, c)| *c == sub) {
        return Err(unknown());
    }
    Ok((
        layer.parse().map_err(|_| unknown())?,
        format!("{canonical}.weight"),
    ))
}

fn num(cfg: &Value, key: &str, file: &str) -> Result<f64> {
    cfg.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| Error::Config(format!("{file}: missing or non-numeric '{key}'")))
}

/// `(out, in)` of projection `sub` (a canonical suffix) in `layer` of the model, or `None`
/// where that layer has no such projection (a Gated DeltaNet projection on a full-attention
/// layer, or on a model without them).
fn projection_shape(cfg: &ModelConfig, layer: usize, sub: &str) -> Option<(usize, usize)> {
    let (d, f) = (cfg.hidden, cfg.ffn);
    let (q, kv) = (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
    let linear = cfg.hybrid.as_ref().filter(|h| h.linear[layer]);
    Some(match (sub, linear) {
        ("ffn_gate" | "ffn_up", _) => (f, d),
        ("ffn_down", _) => (d, f),
        ("attn_qkv", Some(h)) => (h.conv_dim(), d),
        ("attn_gate", Some(h)) => (h.value_width(), d),
        ("ssm_alpha" | "ssm_beta", Some(h)) => (h.v_heads, d),
        ("ssm_out", Some(h)) => (d, h.value_width()),
        (_, Some(_)) => return None,
        // A hybrid's full-attention q_proj carries each head's gate values beside its query.
        ("attn_q", None) if cfg.hybrid.is_some() => (2 * q, d),
        ("attn_q", None) => (q, d),
        ("attn_k" | "attn_v", None) => (kv, d),
        ("attn_output", None) => (d, q),
        _ => return None,
    })
}

fn layer_kind(cfg: &ModelConfig, layer: usize) -> &'static str {
    match &cfg.hybrid {
        Some(h) if h.linear[layer] => "a Gated DeltaNet layer",
        Some(_) => "a full-attention layer",
        None => "a transformer block",
    }
}

impl LoraAdapter {
    /// Reads an mlx-lm or PEFT adapter folder.
    pub fn load(dir: &Path) -> Result<LoraAdapter> {
        if !dir.is_dir() {
            return Err(Error::Config(format!(
                "adapter {}: not a folder (an adapter is a folder with adapter_config.json)",
                dir.display()
            )));
        }
        let cfg = read_config(dir)?;
        if dir.join("adapters.safetensors").exists() {
            Self::load_mlx(dir, &cfg)
        } else if dir.join("adapter_model.safetensors").exists() {
            Self::load_peft(dir, &cfg)
        } else {
            Err(Error::Config(format!(
                "adapter {}: neither adapters.safetensors (mlx-lm) nor \
                 adapter_model.safetensors (PEFT) is there",
                dir.display()
            )))
        }
    }

    fn load_mlx(dir: &Path, cfg: &Value) -> Result<LoraAdapter> {
        let f = "adapter_config.json";
        match cfg
            .get("fine_tune_type")
            .and_then(Value::as_str)
            .unwrap_or("lora")
        {
            "lora" => {}
            other => {
                return Err(Error::Unsupported(format!(
                    "{f}: fine_tune_type '{other}' (trit applies plain LoRA adapters)"
                )))
            }
        }
        let params = cfg
            .get("lora_parameters")
            .ok_or_else(|| Error::Config(format!("{f}: missing 'lora_parameters'")))?;
        let rank = num(params, "rank", f)? as usize;
        let scale = num(params, "scale", f)? as f32;
        let keys: Option<Vec<String>> = params.get("keys").and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect()
        });
        let num_layers = cfg.get("num_layers").and_then(Value::as_i64);
        let path = dir.join("adapters.safetensors");
        let file = SafetensorsFile::open(&path)?;
        let fname = path.display().to_string();
        let mut modules: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        for name in file.header().tensors.keys() {
            let (module, leaf) = name.rsplit_once('.').unwrap_or((name, ""));
            let slot = modules.entry(module.to_string()).or_default();
            match leaf {
                "lora_a" => slot.0 = Some(name.clone()),
                "lora_b" => slot.1 = Some(name.clone()),
                _ => {
                    return Err(Error::Unsupported(format!(
                        "{fname}: tensor '{name}' is not a LoRA matrix (lora_a / lora_b)"
                    )))
                }
            }
        }
        let mut pairs = BTreeMap::new();
        for (module, (a, b)) in modules {
            let (layer, canonical) = module_target(&module, &fname)?;
            if let Some(keys) = &keys {
                // mlx-lm's keys are paths inside a block (`self_attn.q_proj`), whatever prefix
                // the model puts before its layers (`language_model.model.layers.N.`).
                let hf = canonical_to_hf(canonical.trim_end_matches(".weight")).unwrap_or_default();
                let rel = hf.splitn(4, '.').nth(3).unwrap_or("");
                if !keys.iter().any(|k| k == rel) {
                    return Err(Error::Config(format!(
                        "{fname}: '{module}' is not among the adapter's keys {keys:?}"
                    )));
                }
            }
            let missing = |leaf: &str| Error::MissingTensor(format!("{module}.{leaf} ({fname})"));
            let (sa, a) = tensor_f32(&file, &a.ok_or_else(|| missing("lora_a"))?)?;
            let (sb, b) = tensor_f32(&file, &b.ok_or_else(|| missing("lora_b"))?)?;
            if sa.len() != 2 || sb.len() != 2 || sa[1] != rank || sb[0] != rank {
                return Err(Error::Format(format!(
                    "{fname}: '{module}' has lora_a {sa:?} and lora_b {sb:?}; rank {rank} needs \
                     [in, {rank}] and [{rank}, out]"
                )));
            }
            pairs.insert(
                canonical,
                (
                    layer,
                    LoraPair {
                        rank,
                        in_dim: sa[0],
                        out_dim: sb[1],
                        a: transpose(&a, sa[0], rank),
                        b: transpose(&b, rank, sb[1]),
                        scale,
                    },
                ),
            );
        }
        Self::finish(pairs, num_layers, "mlx-lm", &fname)
    }

    fn load_peft(dir: &Path, cfg: &Value) -> Result<LoraAdapter> {
        let f = "adapter_config.json (PEFT)";
        if let Some(t) = cfg.get("peft_type").and_then(Value::as_str) {
            if t != "LORA" {
                return Err(Error::Unsupported(format!(
                    "{f}: peft_type '{t}' (LORA only)"
                )));
            }
        }
        for flag in ["use_dora", "fan_in_fan_out"] {
            if cfg.get(flag).and_then(Value::as_bool) == Some(true) {
                return Err(Error::Unsupported(format!(
                    "{f}: '{flag}: true' is not supported"
                )));
            }
        }
        if let Some(b) = cfg.get("bias").and_then(Value::as_str) {
            if b != "none" {
                return Err(Error::Unsupported(format!(
                    "{f}: bias '{b}' (trit applies bias-free adapters)"
                )));
            }
        }
        let r = num(cfg, "r", f)?;
        let alpha = num(cfg, "lora_alpha", f)?;
        let rslora = cfg.get("use_rslora").and_then(Value::as_bool) == Some(true);
        let scale = (if rslora { alpha / r.sqrt() } else { alpha / r }) as f32;
        let rank = r as usize;
        let path = dir.join("adapter_model.safetensors");
        let file = SafetensorsFile::open(&path)?;
        let fname = path.display().to_string();
        let mut pairs = BTreeMap::new();
        for name in file.header().tensors.keys() {
            let Some(module) = name.strip_suffix(".lora_A.weight") else {
                if name.ends_with(".lora_B.weight") {
                    continue;
                }
                return Err(Error::Unsupported(format!(
                    "{fname}: tensor '{name}' is not a LoRA matrix (lora_A / lora_B)"
                )));
            };
            let hf = module.strip_prefix("base_model.model.").unwrap_or(module);
            let (layer, canonical) = module_target(hf, &fname)?;
            let (sa, a) = tensor_f32(&file, name)?;
            let (sb, b) = tensor_f32(&file, &format!("{module}.lora_B.weight"))?;
            if sa.len() != 2 || sb.len() != 2 || sa[0] != rank || sb[1] != rank {
                return Err(Error::Format(format!(
                    "{fname}: '{hf}' has lora_A {sa:?} and lora_B {sb:?}; r = {rank} needs \
                     [{rank}, in] and [out, {rank}]"
                )));
            }
            let pair = LoraPair {
                rank,
                in_dim: sa[1],
                out_dim: sb[0],
                a,
                b,
                scale,
            };
            pairs.insert(canonical, (layer, pair));
        }
        Self::finish(pairs, None, "PEFT", &fname)
    }

    fn finish(
        pairs: BTreeMap<String, (usize, LoraPair)>,
        num_layers: Option<i64>,
        layout: &'static str,
        fname: &str,
    ) -> Result<LoraAdapter> {
        if pairs.is_empty() {
            return Err(Error::Format(format!("{fname}: no LoRA matrices")));
        }
        let max_layer = pairs.values().map(|(l, _)| *l).max().unwrap_or(0);
        let min_layer = pairs.values().map(|(l, _)| *l).min().unwrap_or(0);
        // mlx-lm adapts `model.layers[-num_layers:]`; matrices outside would be refused there.
        if let Some(n) = num_layers.filter(|&n| n > 0) {
            if (max_layer as i64) - (min_layer as i64) + 1 > n {
                return Err(Error::Config(format!(
                    "{fname}: matrices span layers {min_layer}..={max_layer} but \
                     adapter_config.json says num_layers = {n} (the last {n} layers)"
                )));
            }
        }
        Ok(LoraAdapter {
            pairs: pairs.into_iter().map(|(k, (_, p))| (k, p)).collect(),
            layout,
            num_layers: num_layers.filter(|&n| n > 0).map(|n| n as usize),
        })
    }

    /// Checks every pair against the model: the layer exists and the shapes match the
    /// projection's `[out, in]`.
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        for (name, p) in &self.pairs {
            let rest = name.strip_prefix("blk.").unwrap_or(name);
            let (layer, sub) = rest.split_once('.').unwrap_or((rest, ""));
            let layer: usize = layer.parse().unwrap_or(usize::MAX);
            if layer >= cfg.n_layers {
                return Err(Error::Config(format!(
                    "{} adapter: '{name}' is for layer {layer} but the model has {} layers",
                    self.layout, cfg.n_layers
                )));
            }
            if let Some(n) = self.num_layers.filter(|&n| n < cfg.n_layers) {
                if layer < cfg.n_layers - n {
                    return Err(Error::Config(format!(
                        "{} adapter: '{name}' is for layer {layer}, but num_layers = {n} adapts \
                         only layers {}..{} of this model (mlx-lm would refuse it too)",
                        self.layout,
                        cfg.n_layers - n,
                        cfg.n_layers
                    )));
                }
            }
            let sub = sub.strip_suffix(".weight").unwrap_or(sub);
            let (out, inp) = projection_shape(cfg, layer, sub).ok_or_else(|| {
                Error::Config(format!(
                    "{} adapter: '{name}': layer {layer} of this model has no {sub} projection \
                     ({}; an adapter trained for another model?)",
                    self.layout,
                    layer_kind(cfg, layer)
                ))
            })?;
            if (p.out_dim, p.in_dim) != (out, inp) {
                return Err(Error::Config(format!(
                    "{} adapter: '{name}' maps {} → {} but the model's projection maps {inp} → \
                     {out} (an adapter trained for another model?)",
                    self.layout, p.in_dim, p.out_dim
                )));
            }
        }
        Ok(())
    }

    /// This adapter for a hybrid whose value heads are stored in llama.cpp's tiled order
    /// (GGUF; `HybridConfig::v_tiled`): adapters are trained on Hugging Face's grouped order,
    /// so each value head's rows of in_proj_qkv's value part, in_proj_z, in_proj_a and
    /// in_proj_b (`B`), and its columns of out_proj (`A`), move to where the file keeps it.
    pub(crate) fn to_tiled_value_heads(&self, h: &HybridConfig) -> LoraAdapter {
        let per_key = h.v_heads / h.k_heads;
        // Tiled head t is grouped head (t mod Hk)·(Hv/Hk) + t div Hk.
        let grouped = |t: usize| (t % h.k_heads) * per_key + t / h.k_heads;
        // Moves blocks of `width` values, one per value head, from `at` on in each of `lines`
        // lines of `len` values.
        let regroup = |v: &[f32], lines: usize, len: usize, at: usize, width: usize| {
            let mut out = v.to_vec();
            for line in 0..lines {
                let base = line * len + at;
                for t in 0..h.v_heads {
                    let (dst, src) = (base + t * width, base + grouped(t) * width);
                    out[dst..dst + width].copy_from_slice(&v[src..src + width]);
                }
            }
            out
        };
        let mut pairs = self.pairs.clone();
        for (name, p) in pairs.iter_mut() {
            let sub = name.rsplit('.').nth(1).unwrap_or("");
            let (rank, in_dim, b_len) = (p.rank, p.in_dim, p.b.len());
            // B is [out, rank] (a head's rows are `v_dim · rank` consecutive values); A is
            // [rank, in], each of its `rank` lines holding every value head's columns.
            let (m, lines, len, at, width) = match sub {
                "attn_qkv" => (&mut p.b, 1, b_len, 2 * h.key_width() * rank, h.v_dim * rank),
                "attn_gate" => (&mut p.b, 1, b_len, 0, h.v_dim * rank),
                "ssm_alpha" | "ssm_beta" => (&mut p.b, 1, b_len, 0, rank),
                "ssm_out" => (&mut p.a, rank, in_dim, 0, h.v_dim),
                _ => continue,
            };
            *m = regroup(m, lines, len, at, width);
        }
        LoraAdapter {
            pairs,
            layout: self.layout,
            num_layers: self.num_layers,
        }
    }

    /// The pair of projection `sub` (canonical suffix) in `layer`, if the adapter has one.
    pub(crate) fn pair(&self, layer: usize, sub: &str) -> Option<&LoraPair> {
        self.pairs.get(&format!("blk.{layer}.{sub}.weight"))
    }

    /// `scale · B·A` for a canonical weight name, if the adapter touches it.
    pub fn delta(&self, name: &str) -> Option<Vec<f32>> {
        self.pairs.get(name).map(LoraPair::delta)
    }

    /// The pairs of one block, by projection.
    pub(crate) fn block(&self, layer: usize) -> Option<BlockLora> {
        let get = |sub: &str| {
            self.pairs
                .get(&format!("blk.{layer}.{sub}.weight"))
                .cloned()
        };
        let b = BlockLora {
            q: get("attn_q"),
            k: get("attn_k"),
            v: get("attn_v"),
            o: get("attn_output"),
            gate: get("ffn_gate"),
            up: get("ffn_up"),
            down: get("ffn_down"),
        };
        let any = [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
            .iter()
            .any(|p| p.is_some());
        any.then_some(b)
    }
}

/// The side paths of one transformer block.
pub(crate) struct BlockLora {
    q: Option<LoraPair>,
    k: Option<LoraPair>,
    v: Option<LoraPair>,
    o: Option<LoraPair>,
    gate: Option<LoraPair>,
    up: Option<LoraPair>,
    down: Option<LoraPair>,
}

/// `x · rsqrt(mean(x²) + eps) · w` per row: the full-precision input of a normed projection.
fn rms_normed(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        row.iter_mut().zip(w).for_each(|(v, g)| *v *= inv * g);
    }
    out
}

impl BlockLora {
    /// Adds the side paths of projections that read `RMSNorm(x)` (q/k/v, or gate/up),
    /// normalizing `x` once, in f32, only when one of them is adapted.
    fn add_normed(
        x: &[f32],
        norm: &[f32],
        eps: f32,
        pairs: &[Option<&LoraPair>],
        outs: &mut [&mut [f32]],
    ) {
        if pairs.iter().all(Option::is_none) {
            return;
        }
        let xn = rms_normed(x, norm, eps);
        let rows = xn.len() / norm.len();
        for (p, out) in pairs.iter().zip(outs.iter_mut()) {
            if let Some(p) = p {
                p.add_to(&xn, rows, out);
            }
        }
    }

    /// q, k, v from `RMSNorm(x)` (`x` holds the block's input rows).
    pub(crate) fn attn_in(&self, x: &[f32], norm: &[f32], eps: f32, qkv: [&mut [f32]; 3]) {
        let pairs = [self.q.as_ref(), self.k.as_ref(), self.v.as_ref()];
        Self::add_normed(x, norm, eps, &pairs, &mut { qkv });
    }

    /// gate, up from `RMSNorm(x)`.
    pub(crate) fn mlp_in(&self, x: &[f32], norm: &[f32], eps: f32, gu: [&mut [f32]; 2]) {
        let pairs = [self.gate.as_ref(), self.up.as_ref()];
        Self::add_normed(x, norm, eps, &pairs, &mut { gu });
    }

    /// The output projection from the attention result.
    pub(crate) fn o_from(&self, att: &[f32], h: &mut [f32]) {
        if let Some(p) = &self.o {
            p.add_to(att, att.len() / p.in_dim, h);
        }
    }

    /// The down projection from the gated MLP activation.
    pub(crate) fn down_from(&self, act: &[f32], h: &mut [f32]) {
        if let Some(p) = &self.down {
            p.add_to(act, act.len() / p.in_dim, h);
        }
    }
}
