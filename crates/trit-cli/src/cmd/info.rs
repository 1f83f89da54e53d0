//! `trit info MODEL`: what a model file is and what it needs.

use super::{resolve_model, ModelArgs};
use anyhow::Result;
use clap::Args;
use std::collections::BTreeMap;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Model path (positional form of --model).
    pub path: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

fn gib(b: usize) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

pub fn run(mut a: InfoArgs) -> Result<()> {
    super::take_positional_model(a.path.take(), &mut a.model)?;
    let path = resolve_model(&a.model.model)?;
    let files = trit::format::open(&path)?;
    let c = &files.config;
    println!("file:          {} ({})", path.display(), files.format_name);
    println!("weights:       {}", files.weights.describe());
    println!("name:          {}", c.name);
    if c.bitnet {
        println!(
            "architecture:  bitnet (BitNet b1.58: llama block + attn/ffn sub-norms, {:?} MLP, \
             per-tensor weight scales)",
            c.ffn_act
        );
    } else {
        println!("architecture:  {:?}", c.arch);
    }
    println!(
        "shape:         {} layers, hidden {}, ffn {}, heads {} q / {} kv × {}, vocab {}",
        c.n_layers, c.hidden, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab
    );
    println!(
        "rope:          θ {} ({:?}){}",
        c.rope_theta,
        c.rope_style,
        if c.rope_scaling.is_some() {
            ", YaRN"
        } else {
            ""
        }
    );
    println!(
        "context:       {} tokens; tied embeddings: {}",
        c.max_ctx, c.tied_embeddings
    );
    if let Some(h) = &c.hybrid {
        println!(
            "hybrid:        {} Gated DeltaNet layers ({} key / {} value heads × {}/{}, conv {}) \
             + {} gated full-attention layers (RoPE on {} of {} dims)",
            h.n_linear(),
            h.k_heads,
            h.v_heads,
            h.k_dim,
            h.v_dim,
            h.conv_kernel,
            h.n_full(),
            h.rotary_dim,
            c.head_dim
        );
    }

    let mut by_type: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    // File bytes, and bytes once loaded (ternary and binary types repacked to 2 bits per weight
    // plus scales, everything else f32).
    let (mut params, mut bytes, mut in_memory) = (0usize, 0usize, 0usize);
    for name in files.weights.tensor_names() {
        let Some(view) = files.weights.tensor(&name)? else {
            continue;
        };
        let n: usize = view.shape.iter().product();
        let (ty, b) = (view.data.kind_name(), view.data.stored_bytes());
        let e = by_type.entry(ty).or_default();
        e.0 += 1;
        e.1 += n;
        e.2 += b;
        params += n;
        bytes += b;
        in_memory += trit::model::weights::loaded_bytes(&view);
    }
    println!(
        "parameters:    {:.2} M ({:.3} bits per weight, {} of weights)",
        params as f64 / 1e6,
        bytes as f64 * 8.0 / params.max(1) as f64,
        gib(bytes)
    );
    println!("tensor types:");
    for (ty, (count, n, b)) in &by_type {
        println!(
            "  {ty:<18} {count:>4} tensors {:>10.2} M weights {:>12}  {:.3} bpw",
            *n as f64 / 1e6,
            gib(*b),
            *b as f64 * 8.0 / (*n).max(1) as f64
        );
    }
    let ctx = a.model.ctx.unwrap_or(c.max_ctx.min(4096));
    let types = a.model.cache_types.types();
    let kv = trit::model::KvCache::bytes_for(c.kv_layers(), c.n_kv_heads * c.head_dim, types, ctx);
    let state = c.state_bytes();
    let state_note = if state > 0 {
        format!(" + recurrent state {} (+ one snapshot)", gib(state))
    } else {
        String::new()
    };
    println!(
        "memory:        weights {} (loaded; {} on disk) + KV cache {} at {ctx} tokens (K {}, V {}){state_note} = {}",
        gib(in_memory),
        gib(bytes),
        gib(kv),
        types.k,
        types.v,
        gib(in_memory + kv + 2 * state)
    );
    let g = &files.generation;
    println!(
        "sampling:      temp {:?} top_k {:?} top_p {:?} min_p {:?} (from {})",
        g.temperature, g.top_k, g.top_p, g.min_p, g.source
    );
    println!(
        "chat template: {}",
        match files.chat_template.as_deref() {
            Some(trit::chat::builtin::BITNET) => "yes (trit's built-in BitNet template)",
            Some(_) => "yes",
            None => "no",
        }
    );
    Ok(())
}
