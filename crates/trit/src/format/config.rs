//! `ModelConfig`: the hyper-parameters of a dense Llama/Qwen3 model, read from GGUF metadata or
//! from a Hugging Face `config.json` (+ `generation_config.json`, `tokenizer_config.json`),
//! then checked against the tensors so that a config contradicting the weights is refused at
//! load instead of producing wrong logits.

pub use super::config_arch::{Activation, Arch, Family};
pub use super::config_hybrid::{post_norm_name, HybridConfig};
use super::gguf::{GgufFile, Value as GgufValue};
use super::WeightSource;
use crate::{Error, Result};
use serde_json::Value;

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate-half: pairs `(i, i + head_dim/2)`. HF/MLX folders of every arch, GGUF qwen3.
    Neox,
    /// Adjacent pairs `(2i, 2i+1)`. GGUF `llama` files, whose converter permuted the Q/K rows.
    Adjacent,
}

/// RoPE context extension.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// YaRN (NTK-by-parts). Frequencies with fewer than `beta_slow` rotations over
    /// `original_max_position` are interpolated by `1/factor`, those with more than `beta_fast`
    /// are kept, linear ramp in between; cos and sin are multiplied by `attention_factor`
    /// (mlx-lm: `(0.1·mscale·ln factor + 1) / (0.1·mscale_all_dim·ln factor + 1)`, mscale
    /// defaulting to 1 and mscale_all_dim to 0; an explicit HF `attention_factor` wins).
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Rows of the token embedding (taken from the tensor, not the tokenizer).
    pub vocab: usize,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: Option<RopeScaling>,
    pub norm_eps: f32,
    pub max_ctx: usize,
    pub tied_embeddings: bool,
    pub qk_norm: bool,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub add_bos: bool,
    pub name: String,
    /// Layer schedule and linear-attention shapes; `Some` exactly for `Arch::Qwen35`.
    pub hybrid: Option<HybridConfig>,
    /// BitNet b1.58 (with `Arch::Llama`): `attn_sub_norm` on the attention output before
    /// `o_proj`, `ffn_sub_norm` on `act(gate) ⊙ up` before `down_proj`.
    pub bitnet: bool,
    /// The MLP's gate activation (SiLU, or relu² for BitNet).
    pub ffn_act: Activation,
}

/// The MLP's activation of a GGUF file: `<arch>.hidden_activation` where the file names it
/// (llama.cpp's key), else relu² for BitNet — the b1.58 models' activation, which the 2B4T
/// files do not record (llama.cpp's `bitnet` graph applies SiLU to them: reported in its PR
/// #25885 and microsoft/BitNet #588) — and SiLU for the others. A file that asks for SiLU runs as llama.cpp runs
/// it (the older 1bitLLM BitNet checkpoints).
fn gguf_activation(key: Option<String>, bitnet: bool) -> Result<Activation> {
    match key.as_deref() {
        None if bitnet => Ok(Activation::ReluSq),
        None | Some("silu") => Ok(Activation::Silu),
        Some("relu2") if bitnet => Ok(Activation::ReluSq),
        Some(other) => Err(Error::Unsupported(format!(
            "hidden_activation '{other}' (supported: silu{})",
            if bitnet { ", relu2" } else { "" }
        ))),
    }
}

/// YaRN magnitude correction, mlx-lm's `yarn_get_mscale`.
fn yarn_mscale(factor: f32, mscale: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// Typed access to a JSON config with messages that name the file and key.
struct Json<'a> {
    file: &'a str,
    v: &'a Value,
}

impl Json<'_> {
    fn missing(&self, key: &str) -> Error {
        Error::Config(format!("{}: missing key '{key}'", self.file))
    }
    fn wrong(&self, key: &str, want: &str) -> Error {
        Error::Config(format!(
            "{}: key '{key}' should be {want}, found {}",
            self.file, self.v[key]
        ))
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.wrong(key, "a non-negative integer")),
        }
    }
    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(|n| Some(n as f32))
                .ok_or_else(|| self.wrong(key, "a number")),
        }
    }
    fn f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "true or false")),
        }
    }
    /// An id or a list of ids (HF writes either for `eos_token_id`).
    fn ids(&self, key: &str) -> Result<Vec<u32>> {
        let as_id = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(as_id)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.wrong(key, "a token id or a list of token ids")),
            Some(x) => as_id(x)
                .map(|id| vec![id])
                .ok_or_else(|| self.wrong(key, "a token id or a list of token ids")),
        }
    }
}

fn push_unique(v: &mut Vec<u32>, ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        if !v.contains(&id) {
            v.push(id);
        }
    }
}

impl ModelConfig {
    /// Reads a Hugging Face `config.json`, with the optional `generation_config.json` (extra EOS
    /// ids) and `tokenizer_config.json` (`add_bos_token`). `vocab` is the declared `vocab_size`
    /// (0 if absent) until `check_tensors` replaces it with the embedding's row count.
    /// `tied_embeddings` defaults to `default_tied` when the key is absent.
    pub fn from_hf_json(
        config: &Value,
        generation: Option<&Value>,
        tokenizer_config: Option<&Value>,
        default_tied: bool,
        fallback_name: &str,
    ) -> Result<ModelConfig> {
        let top = Json {
            file: "config.json",
            v: config,
        };
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| top.missing("model_type"))?;
        let family = match model_type {
            // The rotated Bonsai 2 pack is a qwen3_5 text model plus a rotation manifest,
            // which the folder loader reads (formats.md §3.6).
            "prism_hadamard_qwen35" => Family {
                arch: Arch::Qwen35,
                bitnet: false,
            },
            other => Family::of(other)?,
        };
        let arch = family.arch;
        // Vision-language configs nest the language model under `text_config`; its keys win
        // over the top level's (mlx-lm reads the text config alone).
        let merged = merge_text_config(config);
        let config = &merged;
        let j = Json {
            file: "config.json",
            v: config,
        };
        let hidden = j.usize("hidden_size")?;
        let n_heads = j.usize("num_attention_heads")?;
        if n_heads == 0 {
            return Err(Error::Config(
                "config.json: num_attention_heads is 0".into(),
            ));
        }
        let n_kv_heads = j.opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
        let head_dim = j.opt_usize("head_dim")?.unwrap_or(hidden / n_heads);
        let max_ctx = j.usize("max_position_embeddings")?;
        // Newer transformers nest the base under `rope_parameters`.
        let rope_theta = match j.opt_f32("rope_theta")? {
            Some(t) => t,
            None => match config.get("rope_parameters") {
                Some(p) => Json {
                    file: "config.json rope_parameters",
                    v: p,
                }
                .opt_f32("rope_theta")?
                .unwrap_or(10_000.0),
                None => 10_000.0,
            },
        };
        let rope_scaling = match config.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(rs) => parse_hf_rope_scaling(rs)?,
        };
        let mut eos = j.ids("eos_token_id")?;
        let mut bos = j.ids("bos_token_id")?.first().copied();
        if let Some(g) = generation {
            let g = Json {
                file: "generation_config.json",
                v: g,
            };
            push_unique(&mut eos, g.ids("eos_token_id")?);
            bos = bos.or(g.ids("bos_token_id")?.first().copied());
        }
        let add_bos = match tokenizer_config {
            Some(t) => Json {
                file: "tokenizer_config.json",
                v: t,
            }
            .opt_bool("add_bos_token")?
            .unwrap_or(false),
            None => false,
        };
        let name = config
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(fallback_name)
            .to_string();
        Ok(ModelConfig {
            arch,
            n_layers: j.usize("num_hidden_layers")?,
            hidden,
            ffn: j.usize("intermediate_size")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: j.opt_usize("vocab_size")?.unwrap_or(0),
            rope_theta,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            norm_eps: j.f32("rms_norm_eps")?,
            max_ctx,
            tied_embeddings: j.opt_bool("tie_word_embeddings")?.unwrap_or(default_tied),
            qk_norm: arch != Arch::Llama,
            bos,
            eos,
            add_bos,
            name,
            bitnet: family.bitnet,
            // Llama/Qwen configs keep their SwiGLU whatever `hidden_act` says (as before);
            // BitNet's `hidden_act` decides (relu2 in 2B4T, its default).
            ffn_act: match config.get("hidden_act") {
                _ if !family.bitnet => Activation::Silu,
                None | Some(Value::Null) => Activation::ReluSq,
                Some(Value::String(a)) => Activation::from_hf(a)?,
                Some(_) => return Err(top.wrong("hidden_act", "a string")),
            },
            hybrid: match arch {
                Arch::Qwen35 => Some(HybridConfig::from_hf_json(
                    config,
                    j.usize("num_hidden_layers")?,
                    head_dim,
                )?),
                _ => None,
            },
        })
    }

    /// Reads the hyper-parameters from GGUF metadata (`{arch}.*`, `tokenizer.ggml.*`). `vocab`
    /// is `{arch}.vocab_size` when present (else 0) until `check_tensors`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let m = Meta(file);
        let arch_name = m.str("general.architecture")?;
        let family = Family::of(&arch_name)?;
        let arch = family.arch;
        let k = |s: &str| format!("{arch_name}.{s}");
        let hidden = m.usize(&k("embedding_length"))?;
        let n_heads = m.usize(&k("attention.head_count"))?;
        if n_heads == 0 {
            return Err(Error::Config(format!("{} is 0", k("attention.head_count"))));
        }
        let n_kv_heads = m
            .opt_usize(&k("attention.head_count_kv"))?
            .unwrap_or(n_heads);
        let head_dim = m
            .opt_usize(&k("attention.key_length"))?
            .unwrap_or(hidden / n_heads);
        if let Some(v) = m.opt_usize(&k("attention.value_length"))? {
            if v != head_dim {
                return Err(Error::Unsupported(format!(
                    "{} = {v} differs from the key length {head_dim}",
                    k("attention.value_length")
                )));
            }
        }
        let hybrid = if arch == Arch::Qwen35 {
            let usize_key = |key: &str| m.usize(&k(key));
            let recurrent = m.get(&k("attention.recurrent_layers"));
            let interval = m.opt_usize(&k("full_attention_interval"))?;
            Some(HybridConfig::from_gguf(
                &usize_key, recurrent, interval, head_dim, &arch_name,
            )?)
        } else {
            None
        };
        if let (None, Some(r)) = (&hybrid, m.opt_usize(&k("rope.dimension_count"))?) {
            if r != head_dim {
                return Err(Error::Unsupported(format!(
                    "partial RoPE: {} = {r} but head_dim is {head_dim}",
                    k("rope.dimension_count")
                )));
            }
        }
        let rope_scaling = match m.opt_str(&k("rope.scaling.type"))?.as_deref() {
            None | Some("none") => None,
            Some("yarn") => {
                let factor = m.f32(&k("rope.scaling.factor"))?;
                // ggml multiplies its attn_factor by (1 + 0.1 ln factor) inside the YaRN rope.
                let attn = m.opt_f32(&k("rope.scaling.attn_factor"))?.unwrap_or(1.0);
                Some(RopeScaling::Yarn {
                    factor,
                    original_max_position: m.usize(&k("rope.scaling.original_context_length"))?,
                    beta_fast: m
                        .opt_f32(&k("rope.scaling.yarn_beta_fast"))?
                        .unwrap_or(32.0),
                    beta_slow: m.opt_f32(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                    attention_factor: attn * yarn_mscale(factor, 1.0),
                })
            }
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{} '{other}' (supported: yarn)",
                    k("rope.scaling.type")
                )))
            }
        };
        let id = |key: &str| -> Result<Option<u32>> { Ok(m.opt_usize(key)?.map(|v| v as u32)) };
        let mut eos = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            push_unique(&mut eos, id(key)?);
        }
        let add_bos = match m.opt_bool("tokenizer.ggml.add_bos_token")? {
            Some(b) => b,
            // BitNet 2B4T (Llama-3 vocabulary) starts every sequence with <|begin_of_text|>.
            None if family.bitnet => true,
            // llama.cpp's default: SentencePiece vocabularies add BOS, BPE ones do not.
            None => m.opt_str("tokenizer.ggml.model")?.as_deref() == Some("llama"),
        };
        let name = match m.opt_str("general.name")? {
            Some(n) => n,
            None => std::path::Path::new(file.source())
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        Ok(ModelConfig {
            arch,
            n_layers: m.usize(&k("block_count"))?,
            hidden,
            ffn: m.usize(&k("feed_forward_length"))?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: m.opt_usize(&k("vocab_size"))?.unwrap_or(0),
            rope_theta: m.opt_f32(&k("rope.freq_base"))?.unwrap_or(10_000.0),
            // llama.cpp's converter permutes llama's Q/K rows for adjacent pairs; its BitNet
            // converters do not, and its bitnet graphs use NeoX RoPE.
            rope_style: match arch {
                Arch::Llama if !family.bitnet => RopeStyle::Adjacent,
                _ => RopeStyle::Neox,
            },
            rope_scaling,
            norm_eps: m.f32(&k("attention.layer_norm_rms_epsilon"))?,
            max_ctx: m.usize(&k("context_length"))?,
            tied_embeddings: file.tensor("output.weight").is_none(),
            qk_norm: arch != Arch::Llama,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos,
            add_bos,
            name,
            hybrid,
            bitnet: family.bitnet,
            ffn_act: gguf_activation(m.opt_str(&k("hidden_activation"))?, family.bitnet)?,
        })
    }

    /// The architecture as users know it (`bitnet` for BitNet b1.58, else `Arch::name`).
    pub fn arch_name(&self) -> &'static str {
        if self.bitnet {
            "bitnet"
        } else {
            self.arch.name()
        }
    }

    /// Layers that keep keys and values (every layer, or a hybrid's full-attention layers).
    pub fn kv_layers(&self) -> usize {
        self.hybrid.as_ref().map_or(self.n_layers, |h| h.n_full())
    }

    /// Fixed per-sequence bytes besides the KV cache (a hybrid's recurrent state, f32).
    pub fn state_bytes(&self) -> usize {
        self.hybrid.as_ref().map_or(0, |h| {
            h.n_linear() * ((h.conv_kernel - 1) * h.conv_dim() + h.v_heads * h.v_dim * h.k_dim) * 4
        })
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Checks every tensor the graph uses against the config and takes `vocab` from the
    /// embedding. A declared vocabulary size (non-zero `vocab` on entry) must match it.
    pub fn check_tensors(&mut self, w: &dyn WeightSource) -> Result<()> {
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(Error::Config(format!(
                "{} query heads cannot be grouped over {} key/value heads",
                self.n_heads, self.n_kv_heads
            )));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "head_dim {} must be even and non-zero for RoPE",
                self.head_dim
            )));
        }
        let embd = shape_of(w, "token_embd.weight")?;
        let rows = embd.first().copied().unwrap_or(0);
        let declared = if self.vocab != 0 { self.vocab } else { rows };
        expect(&embd, &[declared, self.hidden], "token_embd.weight")?;
        self.vocab = rows;
        let (h, q, kv, f, hd) = (
            self.hidden,
            self.q_dim(),
            self.kv_dim(),
            self.ffn,
            self.head_dim,
        );
        if let Some(hy) = &self.hybrid {
            hy.check_tensors(w, h, f, self.n_heads, self.n_kv_heads, hd)?;
        }
        // The hybrid's layers were checked above; the dense layout applies to the others.
        let dense_layers = if self.hybrid.is_some() {
            0
        } else {
            self.n_layers
        };
        for i in 0..dense_layers {
            let check = |suffix: &str, want: &[usize]| -> Result<()> {
                let name = format!("blk.{i}.{suffix}.weight");
                expect(&shape_of(w, &name)?, want, &name)
            };
            check("attn_norm", &[h])?;
            check("attn_q", &[q, h])?;
            check("attn_k", &[kv, h])?;
            check("attn_v", &[kv, h])?;
            check("attn_output", &[h, q])?;
            check("ffn_norm", &[h])?;
            check("ffn_gate", &[f, h])?;
            check("ffn_up", &[f, h])?;
            check("ffn_down", &[h, f])?;
            if self.qk_norm {
                check("attn_q_norm", &[hd])?;
                check("attn_k_norm", &[hd])?;
            }
            if self.bitnet {
                check("attn_sub_norm", &[q])?;
                check("ffn_sub_norm", &[f])?;
            }
        }
        // Every layer of either kind has an input norm.
        let extra = format!("blk.{}.attn_norm.weight", self.n_layers);
        if w.tensor(&extra)?.is_some() {
            return Err(Error::Config(format!(
                "config says {} layers but the weights contain '{extra}'",
                self.n_layers
            )));
        }
        expect(
            &shape_of(w, "output_norm.weight")?,
            &[h],
            "output_norm.weight",
        )?;
        match (self.tied_embeddings, w.tensor("output.weight")?) {
            (false, None) => return Err(Error::MissingTensor("output.weight".into())),
            (false, Some(t)) => expect(&t.shape, &[self.vocab, h], "output.weight")?,
            (true, Some(_)) => {
                return Err(Error::Config(
                    "embeddings are tied but the weights contain a separate 'output.weight'".into(),
                ))
            }
            (true, None) => {}
        }
        Ok(())
    }
}

/// Typed GGUF metadata access with messages naming the key and the type found.
struct Meta<'a>(&'a GgufFile);

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.0.get(key)
    }
    fn wrong(&self, key: &str, want: &str, v: &GgufValue) -> Error {
        Error::Config(format!(
            "{}: metadata '{key}' should be {want}, found {}",
            self.0.source(),
            v.type_name()
        ))
    }
    fn missing(&self, key: &str) -> Error {
        Error::Config(format!("{}: missing metadata key '{key}'", self.0.source()))
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_usize()
                    .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
            })
            .transpose()
    }
    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| v.as_f32().ok_or_else(|| self.wrong(key, "a number", v)))
            .transpose()
    }
    fn f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "a bool", v)))
            .transpose()
    }
    fn opt_str(&self, key: &str) -> Result<Option<String>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.wrong(key, "a string", v))
            })
            .transpose()
    }
    fn str(&self, key: &str) -> Result<String> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }
}

fn shape_of(w: &dyn WeightSource, name: &str) -> Result<Vec<usize>> {
    Ok(w.require(name)?.shape)
}

fn expect(found: &[usize], want: &[usize], name: &str) -> Result<()> {
    if found == want {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            tensor: name.to_string(),
            found: found.to_vec(),
            expected: want.to_vec(),
        })
    }
}

/// The top-level keys of a config overlaid with its `text_config` (when there is one).
fn merge_text_config(config: &Value) -> Value {
    match (config, config.get("text_config")) {
        (Value::Object(top), Some(Value::Object(text))) => {
            let mut m = top.clone();
            m.remove("text_config");
            m.remove("vision_config");
            for (k, v) in text {
                if k != "model_type" {
                    m.insert(k.clone(), v.clone());
                }
            }
            Value::Object(m)
        }
        _ => config.clone(),
    }
}

/// HF `rope_scaling` (`type` or `rope_type`). `null`/`"default"` means none.
fn parse_hf_rope_scaling(rs: &Value) -> Result<Option<RopeScaling>> {
    let j = Json {
        file: "config.json rope_scaling",
        v: rs,
    };
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(Value::as_str)
        .ok_or_else(|| j.missing("type"))?;
    match kind {
        "default" => Ok(None),
        "yarn" => {
            let factor = j.f32("factor")?;
            // HF falls back to max_position_embeddings and mlx-lm to 4096: refuse to guess.
            let original_max_position = j.usize("original_max_position_embeddings")?;
            let attention_factor = match j.opt_f32("attention_factor")? {
                Some(a) => a,
                None => {
                    let mscale = j.opt_f32("mscale")?.unwrap_or(1.0);
                    let all_dim = j.opt_f32("mscale_all_dim")?.unwrap_or(0.0);
                    yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
                }
            };
            Ok(Some(RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast: j.opt_f32("beta_fast")?.unwrap_or(32.0),
                beta_slow: j.opt_f32("beta_slow")?.unwrap_or(1.0),
                attention_factor,
            }))
        }
        other => Err(Error::Unsupported(format!(
            "rope_scaling type '{other}' (supported: yarn)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen3_json() -> Value {
        json!({
            "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4,
            "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "vocab_size": 151936, "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
            "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151645
        })
    }

    #[test]
    fn parses_qwen3_config_json() {
        let gen = json!({"eos_token_id": [151645, 151643], "temperature": 0.6});
        let tok = json!({"add_bos_token": false});
        let c =
            ModelConfig::from_hf_json(&qwen3_json(), Some(&gen), Some(&tok), false, "x").unwrap();
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!((c.n_layers, c.hidden, c.ffn), (4, 256, 768));
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (4, 2, 64));
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.rope_style, RopeStyle::Neox);
        assert!(c.qk_norm && c.tied_embeddings && !c.add_bos);
        assert_eq!(c.bos, Some(151643));
        assert_eq!(c.eos, vec![151645, 151643]);
        assert_eq!(c.max_ctx, 40960);
        assert_eq!(c.rope_scaling, None);
        assert_eq!(c.name, "x");
    }

    #[test]
    fn parses_yarn() {
        let mut j = qwen3_json();
        j["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 4096});
        let c = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap();
        let Some(RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            attention_factor,
        }) = c.rope_scaling
        else {
            panic!("no yarn")
        };
        assert_eq!((factor, original_max_position), (4.0, 4096));
        assert_eq!((beta_fast, beta_slow), (32.0, 1.0));
        assert!((attention_factor - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-6);
        // The explicit HF attention_factor wins.
        j["rope_scaling"]["attention_factor"] = json!(1.5);
        let c = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap();
        assert!(
            matches!(c.rope_scaling, Some(RopeScaling::Yarn { attention_factor, .. }) if attention_factor == 1.5)
        );
        // Missing original length is refused rather than guessed.
        j["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        let e = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap_err();
        assert!(
            e.to_string().contains("original_max_position_embeddings"),
            "{e}"
        );
        j["rope_scaling"] = json!({"type": "dynamic", "factor": 2.0});
        let e = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap_err();
        assert!(e.to_string().contains("'dynamic'"), "{e}");
    }

    #[test]
    fn reports_missing_and_unsupported() {
        let mut j = qwen3_json();
        j.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: config.json: missing key 'hidden_size'"
        );
        let mut j = qwen3_json();
        j["model_type"] = json!("gpt2");
        let e = ModelConfig::from_hf_json(&j, None, None, false, "x").unwrap_err();
        assert!(e.to_string().contains("'gpt2'") && e.to_string().contains("llama, qwen3"));
        let mut j = qwen3_json();
        j["eos_token_id"] = json!("x");
        assert!(ModelConfig::from_hf_json(&j, None, None, false, "x").is_err());
    }

    #[test]
    fn llama_defaults() {
        let j = json!({
            "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
            "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "rope_theta": 100000.0
        });
        let c = ModelConfig::from_hf_json(&j, None, None, true, "smol").unwrap();
        assert_eq!((c.arch, c.head_dim, c.qk_norm), (Arch::Llama, 64, false));
        assert!(c.tied_embeddings);
        assert_eq!((c.bos, c.eos.len()), (None, 0));
    }
}
