//! Hyper-parameters of the Qwen3.5 hybrid architecture (models.md §3): which layers are
//! Gated DeltaNet ("linear attention") and which are gated full attention, the linear layers'
//! head shapes, the conv kernel and the partial-RoPE width. Read from a Hugging Face / MLX
//! `config.json` (text config nested under `text_config` or flat) or from GGUF `qwen35.*`
//! metadata, then checked against the tensors.

use super::gguf::{Array, Value as GgufValue};
use super::WeightSource;
use crate::{Error, Result};
use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// `true` for a Gated DeltaNet layer, `false` for a full-attention layer; one per layer.
    pub linear: Vec<bool>,
    /// Key heads (`Hk`) and value heads (`Hv`) of the linear layers; `Hv` is a multiple of `Hk`.
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// Causal depthwise conv1d kernel length.
    pub conv_kernel: usize,
    /// Leading dimensions of each full-attention head that RoPE rotates.
    pub rotary_dim: usize,
    /// Value heads stored in llama.cpp's "tiled" order (head `h` reads key head `h mod Hk`)
    /// instead of the Hugging Face / MLX "grouped" order (`h div (Hv/Hk)`); GGUF files.
    pub v_tiled: bool,
}

impl HybridConfig {
    /// Width of the fused q/k/v projection of a linear layer (= conv1d channels).
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    pub fn n_linear(&self) -> usize {
        self.linear.iter().filter(|&&l| l).count()
    }

    /// The key head value head `h` attends with.
    pub fn key_head_of(&self, h: usize) -> usize {
        if self.v_tiled {
            h % self.k_heads
        } else {
            h / (self.v_heads / self.k_heads)
        }
    }

    pub fn n_full(&self) -> usize {
        self.linear.len() - self.n_linear()
    }

    /// Layer `i` is full attention iff `(i + 1) mod interval == 0` (mlx-lm's rule).
    pub fn schedule_from_interval(n_layers: usize, interval: usize) -> Result<Vec<bool>> {
        if interval == 0 {
            return Err(Error::Config("full_attention_interval is 0".into()));
        }
        Ok((0..n_layers).map(|i| (i + 1) % interval != 0).collect())
    }

    /// Parses the linear-attention keys of a (text) config. `head_dim` is the full-attention
    /// head size, needed for the partial-RoPE width.
    pub fn from_hf_json(c: &Value, n_layers: usize, head_dim: usize) -> Result<HybridConfig> {
        let get = |key: &str| -> Result<usize> {
            c.get(key)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "config.json: qwen3_5 needs an integer '{key}', found {}",
                        c.get(key).map_or("nothing".to_string(), |v| v.to_string())
                    ))
                })
        };
        if c.get("num_experts").and_then(Value::as_u64).unwrap_or(0) > 0 {
            return Err(Error::Unsupported(
                "Qwen3.5 mixture-of-experts checkpoints (num_experts > 0); trit runs the dense \
                 qwen3_5 hybrid"
                    .into(),
            ));
        }
        let interval = match c.get("full_attention_interval") {
            None | Some(Value::Null) => None,
            Some(_) => Some(get("full_attention_interval")?),
        };
        let linear = match (c.get("layer_types"), interval) {
            (Some(Value::Array(types)), _) => {
                let list = types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("linear_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(Error::Config(format!(
                            "config.json: layer_types entry {t} is neither \"linear_attention\" \
                             nor \"full_attention\""
                        ))),
                    })
                    .collect::<Result<Vec<bool>>>()?;
                if list.len() != n_layers {
                    return Err(Error::Config(format!(
                        "config.json: layer_types lists {} layers, num_hidden_layers is {n_layers}",
                        list.len()
                    )));
                }
                // mlx-lm builds the schedule from the interval alone: a disagreement would
                // make the two runtimes run different graphs on the same file.
                if let Some(iv) = interval {
                    if Self::schedule_from_interval(n_layers, iv)? != list {
                        return Err(Error::Config(format!(
                            "config.json: layer_types disagrees with full_attention_interval {iv}"
                        )));
                    }
                }
                list
            }
            (_, iv) => Self::schedule_from_interval(n_layers, iv.unwrap_or(4))?,
        };
        let factor = match c.get("rope_parameters") {
            Some(p) => {
                let kind = p
                    .get("type")
                    .or_else(|| p.get("rope_type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if kind != "default" {
                    return Err(Error::Unsupported(format!(
                        "qwen3_5 rope_parameters type '{kind}' (supported: default)"
                    )));
                }
                p.get("partial_rotary_factor").and_then(Value::as_f64)
            }
            None => None,
        };
        let factor = c
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .or(factor)
            .unwrap_or(0.25);
        let h = HybridConfig {
            linear,
            k_heads: get("linear_num_key_heads")?,
            v_heads: get("linear_num_value_heads")?,
            k_dim: get("linear_key_head_dim")?,
            v_dim: get("linear_value_head_dim")?,
            conv_kernel: get("linear_conv_kernel_dim")?,
            // mlx-lm: int(head_dim * partial_rotary_factor).
            rotary_dim: (head_dim as f64 * factor) as usize,
            v_tiled: false,
        };
        h.validate(head_dim)?;
        Ok(h)
    }

    /// Reads GGUF `{arch}.*` metadata as llama.cpp's qwen35 converter writes it: `usize_key`
    /// reads a required integer key (relative to `{arch}.`), `recurrent` is the optional
    /// `attention.recurrent_layers` array, `interval` the optional `full_attention_interval`.
    pub fn from_gguf(
        usize_key: &dyn Fn(&str) -> Result<usize>,
        recurrent: Option<&GgufValue>,
        interval: Option<usize>,
        head_dim: usize,
        arch: &str,
    ) -> Result<HybridConfig> {
        let n_layers = usize_key("block_count")?;
        let v_heads = usize_key("ssm.time_step_rank")?;
        let inner = usize_key("ssm.inner_size")?;
        if v_heads == 0 || !inner.is_multiple_of(v_heads) {
            return Err(Error::Config(format!(
                "{arch}.ssm.inner_size = {inner} is not a multiple of \
                 {arch}.ssm.time_step_rank = {v_heads}"
            )));
        }
        // Newer converters also write the schedule itself (from HF `layer_types`).
        let linear = match recurrent {
            None => Self::schedule_from_interval(n_layers, interval.unwrap_or(4))?,
            Some(v) => match v.as_array() {
                Some(Array::Bool(list)) if list.len() == n_layers => list.clone(),
                _ => {
                    return Err(Error::Config(format!(
                        "metadata '{arch}.attention.recurrent_layers' should be {n_layers} \
                         bools, found {}",
                        v.type_name()
                    )))
                }
            },
        };
        let h = HybridConfig {
            linear,
            k_heads: usize_key("ssm.group_count")?,
            v_heads,
            k_dim: usize_key("ssm.state_size")?,
            v_dim: inner / v_heads,
            conv_kernel: usize_key("ssm.conv_kernel")?,
            rotary_dim: usize_key("rope.dimension_count")?,
            // llama.cpp's converter reorders value heads for ggml's broadcast.
            v_tiled: true,
        };
        h.validate(head_dim)?;
        Ok(h)
    }

    pub fn validate(&self, head_dim: usize) -> Result<()> {
        if self.k_heads == 0 || self.v_heads == 0 || !self.v_heads.is_multiple_of(self.k_heads) {
            return Err(Error::Config(format!(
                "{} linear-attention value heads cannot be grouped over {} key heads",
                self.v_heads, self.k_heads
            )));
        }
        if self.k_dim == 0 || self.v_dim == 0 || self.conv_kernel == 0 {
            return Err(Error::Config(
                "linear attention head dims and conv kernel must be non-zero".into(),
            ));
        }
        if self.rotary_dim == 0 || self.rotary_dim > head_dim || !self.rotary_dim.is_multiple_of(2)
        {
            return Err(Error::Config(format!(
                "partial RoPE width {} must be even and within head_dim {head_dim}",
                self.rotary_dim
            )));
        }
        Ok(())
    }

    /// Checks every tensor of the hybrid graph against the config.
    pub fn check_tensors(
        &self,
        w: &dyn WeightSource,
        hidden: usize,
        ffn: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let (cd, vw, hv) = (self.conv_dim(), self.value_width(), self.v_heads);
        for (i, &linear) in self.linear.iter().enumerate() {
            let check = |suffix: &str, want: &[usize]| -> Result<()> {
                let name = format!("blk.{i}.{suffix}");
                let found = w.require(&name)?.shape;
                // MLX stores the depthwise conv kernel as [channels, kernel, 1].
                let squeezed: Vec<usize> = if found.len() == 3 && found[2] == 1 {
                    found[..2].to_vec()
                } else {
                    found.clone()
                };
                if squeezed == want {
                    Ok(())
                } else {
                    Err(Error::ShapeMismatch {
                        tensor: name,
                        found,
                        expected: want.to_vec(),
                    })
                }
            };
            check("attn_norm.weight", &[hidden])?;
            if linear {
                check("attn_qkv.weight", &[cd, hidden])?;
                check("attn_gate.weight", &[vw, hidden])?;
                check("ssm_alpha.weight", &[hv, hidden])?;
                check("ssm_beta.weight", &[hv, hidden])?;
                check("ssm_conv1d.weight", &[cd, self.conv_kernel])?;
                check("ssm_dt.bias", &[hv])?;
                if w.tensor(&format!("blk.{i}.ssm_a"))?.is_some() {
                    check("ssm_a", &[hv])?;
                } else {
                    check("ssm_a_log", &[hv])?;
                }
                check("ssm_norm.weight", &[self.v_dim])?;
                check("ssm_out.weight", &[hidden, vw])?;
            } else {
                let q = n_heads * head_dim;
                check("attn_q.weight", &[2 * q, hidden])?;
                check("attn_k.weight", &[n_kv_heads * head_dim, hidden])?;
                check("attn_v.weight", &[n_kv_heads * head_dim, hidden])?;
                check("attn_output.weight", &[hidden, q])?;
                check("attn_q_norm.weight", &[head_dim])?;
                check("attn_k_norm.weight", &[head_dim])?;
            }
            check(post_norm_name(w, i)?.as_str(), &[hidden])?;
            check("ffn_gate.weight", &[ffn, hidden])?;
            check("ffn_up.weight", &[ffn, hidden])?;
            check("ffn_down.weight", &[hidden, ffn])?;
        }
        Ok(())
    }
}

/// The norm before the MLP: GGUF qwen35 calls it `post_attention_norm`, the folder mapping
/// (shared with qwen3) `ffn_norm`. Returns the suffix present, relative to `blk.{i}.`.
pub fn post_norm_name(w: &dyn WeightSource, layer: usize) -> Result<String> {
    let gguf = "post_attention_norm.weight";
    if w.tensor(&format!("blk.{layer}.{gguf}"))?.is_some() {
        Ok(gguf.into())
    } else {
        Ok("ffn_norm.weight".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"linear_num_key_heads": 2, "linear_num_value_heads": 6,
               "linear_key_head_dim": 64, "linear_value_head_dim": 64,
               "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
               "rope_parameters": {"type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.25}})
    }

    #[test]
    fn schedule_from_interval_and_layer_types() {
        let h = HybridConfig::from_hf_json(&base(), 8, 256).unwrap();
        assert_eq!(
            h.linear,
            vec![true, true, true, false, true, true, true, false]
        );
        assert_eq!((h.rotary_dim, h.conv_dim(), h.n_full()), (64, 640, 2));
        let mut c = base();
        c["layer_types"] = json!(["linear_attention", "full_attention"]);
        c.as_object_mut().unwrap().remove("full_attention_interval");
        let h = HybridConfig::from_hf_json(&c, 2, 256).unwrap();
        assert_eq!(h.linear, vec![true, false]);
        c["full_attention_interval"] = json!(4);
        let e = HybridConfig::from_hf_json(&c, 2, 256).unwrap_err();
        assert!(e.to_string().contains("disagrees"), "{e}");
    }

    #[test]
    fn refuses_bad_shapes() {
        let mut c = base();
        c["linear_num_value_heads"] = json!(5);
        assert!(HybridConfig::from_hf_json(&c, 4, 256).is_err());
        let mut c = base();
        c.as_object_mut().unwrap().remove("linear_key_head_dim");
        let e = HybridConfig::from_hf_json(&c, 4, 256).unwrap_err();
        assert!(e.to_string().contains("linear_key_head_dim"), "{e}");
        let mut c = base();
        c["rope_parameters"]["type"] = json!("yarn");
        assert!(HybridConfig::from_hf_json(&c, 4, 256).is_err());
        let mut c = base();
        c["num_experts"] = json!(256);
        let e = HybridConfig::from_hf_json(&c, 4, 256).unwrap_err();
        assert!(e.to_string().contains("mixture-of-experts"), "{e}");
    }
}
