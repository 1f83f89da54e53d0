//! `trit doctor` without a model: what this machine is and what it can run. CPU model and
//! features with the kernel level trit picks (the kernels module's own detection), cores,
//! memory, the GPU section (a hook for the cuda feature), and which models fit with how much
//! context, from the real shapes in docs/models.md (weights + trit's KV bytes per token).

use serde_json::{json, Value};

/// A model trit runs, by the numbers that decide whether it fits.
struct KnownModel {
    name: &'static str,
    /// Bytes of weights in memory (the file size of the named format; weights are mapped).
    weight_bytes: u64,
    format: &'static str,
    /// Layers with a KV cache, KV heads, head dim.
    kv_layers: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Fixed per-sequence recurrent state (Gated DeltaNet), kept twice (one snapshot).
    state_bytes: u64,
    max_ctx: usize,
}

/// Shapes and sizes from docs/models.md §2, §3.1 and §6.
const MODELS: &[KnownModel] = &[
    KnownModel {
        name: "Ternary Bonsai 1.7B",
        weight_bytes: 460_000_000,
        format: "GGUF Q2_0 g128",
        kv_layers: 28,
        kv_heads: 8,
        head_dim: 128,
        state_bytes: 0,
        max_ctx: 32_768,
    },
    KnownModel {
        name: "Ternary Bonsai 4B",
        weight_bytes: 1_070_000_000,
        format: "GGUF Q2_0 g128",
        kv_layers: 36,
        kv_heads: 8,
        head_dim: 128,
        state_bytes: 0,
        max_ctx: 32_768,
    },
    KnownModel {
        name: "Ternary Bonsai 8B",
        weight_bytes: 2_180_000_000,
        format: "GGUF PQ2_0",
        kv_layers: 36,
        kv_heads: 8,
        head_dim: 128,
        state_bytes: 0,
        max_ctx: 65_536,
    },
    KnownModel {
        name: "Ternary Bonsai 2 27B",
        weight_bytes: 5_946_648_928,
        format: "GGUF PTQ1_0",
        kv_layers: 16,
        kv_heads: 4,
        head_dim: 256,
        // 48 linear layers × 48 heads × 128 × 128 × f32, plus ~3 MB of conv state.
        state_bytes: 48 * 48 * 128 * 128 * 4 + 3_000_000,
        max_ctx: 262_144,
    },
];

/// Memory kept free for the runtime, activations and the OS page cache's working set.
const HEADROOM_BYTES: u64 = 1 << 30;

fn meminfo_bytes(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The SIMD features that matter to trit's kernels, as this process detects them.
fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(if std::arch::is_x86_feature_detected!($f) { v.push($f); })*};
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avxvnni", "avx512f", "avx512bw");
        probe!("avx512vl", "avx512vnni", "avx512bf16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        v.push("neon");
    }
    v
}

/// The GPU section: without the `cuda` feature, why there is none.
#[cfg(not(feature = "cuda"))]
fn gpu_report() -> Value {
    json!({"available": false, "reason": "not built with the cuda feature"})
}

/// The GPU section: driver version, each GPU with its memory, and which known models fit
/// on it — dense and hybrid (the GPU keeps its KV cache in f16: half the CPU's bytes per
/// token; a hybrid's recurrent state once per sequence).
#[cfg(feature = "cuda")]
fn gpu_report() -> Value {
    match trit_cuda::device::probe() {
        Err(reason) => json!({"available": false, "reason": reason}),
        Ok((_, gpus)) if gpus.is_empty() => {
            json!({"available": false, "reason": "the NVIDIA driver sees no GPU"})
        }
        Ok((driver, gpus)) => {
            let gpus: Vec<Value> = gpus
                .iter()
                .map(|g| {
                    let fits: Vec<Value> = MODELS
                        .iter()
                        .map(|m| {
                            let ctx = fit_gpu(m, g.free_bytes as u64);
                            json!({"model": m.name, "format": m.format, "fits": ctx.is_some(),
                                   "context_that_fits": ctx})
                        })
                        .collect();
                    json!({"ordinal": g.ordinal, "name": g.name,
                           "compute_capability": format!("{}.{}", g.compute_capability.0,
                                                         g.compute_capability.1),
                           "total_bytes": g.total_bytes, "free_bytes": g.free_bytes,
                           "models": fits})
                })
                .collect();
            json!({"available": true,
                   "reason": format!("{} GPU(s), CUDA driver {}.{}", gpus.len(),
                                     driver / 1000, driver % 1000 / 10),
                   "devices": gpus})
        }
    }
}

/// The largest context that fits on a GPU with `free` bytes beside the weights, one
/// sequence's recurrent state (hybrids) and 512 MiB of activations.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn fit_gpu(m: &KnownModel, free: u64) -> Option<usize> {
    // The GPU keeps keys and values in f16.
    let kv_per_token = trit::model::KvCache::bytes_for(
        m.kv_layers,
        m.kv_heads * m.head_dim,
        trit::model::KvTypes::F16,
        1,
    ) as u64;
    // Base-3 files are repacked to 2 bits per weight on the GPU as on the CPU (1.28x the file).
    let weights = match m.format.contains("TQ1_0") {
        true => m.weight_bytes * 128 / 100,
        false => m.weight_bytes,
    };
    let fixed = weights + m.state_bytes + (512 << 20);
    let ctx = (free.checked_sub(fixed)? / kv_per_token).min(m.max_ctx as u64) as usize;
    (ctx >= 512).then_some(ctx)
}

/// The largest context (capped at the model's) that fits beside the weights, or None.
fn fit(m: &KnownModel, available: u64) -> (u64, Option<usize>) {
    // With the default cache types (`--cache-type-k/-v`).
    let kv_per_token = trit::model::KvCache::bytes_for(
        m.kv_layers,
        m.kv_heads * m.head_dim,
        trit::model::KvTypes::default(),
        1,
    ) as u64;
    let fixed = m.weight_bytes + 2 * m.state_bytes + HEADROOM_BYTES;
    if available <= fixed {
        return (kv_per_token, None);
    }
    let ctx = ((available - fixed) / kv_per_token).min(m.max_ctx as u64) as usize;
    (kv_per_token, (ctx >= 512).then_some(ctx))
}

/// Everything the machine report says, as JSON (the text form is printed from it).
pub fn report() -> Value {
    let level = trit::kernels::best_level();
    let available_levels: Vec<&str> = trit::kernels::KernelLevel::available()
        .iter()
        .map(|l| l.name())
        .collect();
    let total = meminfo_bytes("MemTotal:");
    let avail = meminfo_bytes("MemAvailable:");
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let models: Vec<Value> = MODELS
        .iter()
        .map(|m| {
            let (kv, ctx) = fit(m, avail.unwrap_or(0));
            json!({"model": m.name, "format": m.format, "weight_bytes": m.weight_bytes,
                   "kv_bytes_per_token": kv, "state_bytes": m.state_bytes,
                   "max_context": m.max_ctx, "fits": ctx.is_some(), "context_that_fits": ctx})
        })
        .collect();
    json!({
        "cpu": {"model": cpu_model(), "arch": std::env::consts::ARCH, "features": cpu_features(),
                "kernel_level": level.name(), "kernel_levels_available": available_levels,
                "amx": "never used (it crashes on some machines that advertise it)"},
        "cores": {"logical": logical, "threads_trit_uses": trit::threadpool::default_threads()},
        "memory": {"total_bytes": total, "available_bytes": avail},
        "gpu": gpu_report(),
        "models": models,
        "assumptions": format!("weights mapped at file size, KV cache as trit stores it, \
                                {} GiB kept free", HEADROOM_BYTES >> 30),
    })
}

fn gb(b: u64) -> String {
    format!("{:.1} GB", b as f64 / 1e9)
}

/// The human-readable machine report.
pub fn print(r: &Value) {
    let cpu = &r["cpu"];
    println!(
        "CPU:     {} ({})",
        cpu["model"].as_str().unwrap_or("?"),
        cpu["arch"].as_str().unwrap_or("?")
    );
    let feats: Vec<&str> = cpu["features"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).collect());
    println!("         features: {}", feats.join(" "));
    let levels: Vec<&str> = cpu["kernel_levels_available"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).collect());
    println!(
        "Kernels: {} (available: {}; override with TRIT_KERNEL)",
        cpu["kernel_level"].as_str().unwrap_or("?"),
        levels.join(", ")
    );
    println!(
        "Cores:   {} logical, trit uses {} threads",
        r["cores"]["logical"], r["cores"]["threads_trit_uses"]
    );
    let mem = &r["memory"];
    match (mem["total_bytes"].as_u64(), mem["available_bytes"].as_u64()) {
        (Some(t), Some(a)) => println!("Memory:  {} total, {} available", gb(t), gb(a)),
        _ => println!("Memory:  unknown (no /proc/meminfo)"),
    }
    println!(
        "GPU:     {}",
        r["gpu"]["reason"].as_str().unwrap_or("available")
    );
    for g in r["gpu"]["devices"].as_array().into_iter().flatten() {
        println!(
            "  [{}] {} (compute {}), {} total, {} free",
            g["ordinal"],
            g["name"].as_str().unwrap_or("?"),
            g["compute_capability"].as_str().unwrap_or("?"),
            gb(g["total_bytes"].as_u64().unwrap_or(0)),
            gb(g["free_bytes"].as_u64().unwrap_or(0))
        );
        for m in g["models"].as_array().into_iter().flatten() {
            let fits = match m["context_that_fits"].as_u64() {
                Some(c) => format!("✓ up to {c} tokens"),
                None => "✗ does not fit".into(),
            };
            println!("      {:<22} {fits}", m["model"].as_str().unwrap_or("?"));
        }
    }
    println!(
        "Models that fit in available memory ({}):",
        r["assumptions"].as_str().unwrap_or("")
    );
    for m in r["models"].as_array().into_iter().flatten() {
        let ctx = match m["context_that_fits"].as_u64() {
            Some(c) if c == m["max_context"].as_u64().unwrap_or(0) => {
                format!("✓ full context {c} tokens")
            }
            Some(c) => format!("✓ up to {c} tokens of {}", m["max_context"]),
            None => "✗ does not fit".to_string(),
        };
        println!(
            "  {:<22} {:<16} weights {:>8}, KV {:>4} KiB/token  {ctx}",
            m["model"].as_str().unwrap_or("?"),
            m["format"].as_str().unwrap_or("?"),
            gb(m["weight_bytes"].as_u64().unwrap_or(0)),
            m["kv_bytes_per_token"].as_u64().unwrap_or(0) / 1024
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_follow_the_model_shapes() {
        // trit keeps K and V per KV layer; models.md gives 112 KiB (1.7B) and 144 KiB (8B) at
        // f16, so trit's per-token bytes are those times its element size over 2.
        let elem =
            trit::model::KvCache::bytes_for(1, 1, trit::model::KvTypes::default(), 1) as u64 / 2;
        let (kv17, _) = fit(&MODELS[0], 0);
        let (kv8, _) = fit(&MODELS[2], 0);
        assert_eq!(kv17, 112 * 1024 / 2 * elem);
        assert_eq!(kv8, 144 * 1024 / 2 * elem);
        // 8 GB free: the 8B model fits with a context between zero and its maximum.
        let (_, ctx) = fit(&MODELS[2], 8_000_000_000);
        let ctx = ctx.unwrap();
        assert!(ctx > 4096 && ctx <= 65_536, "{ctx}");
        assert_eq!(fit(&MODELS[3], 4_000_000_000).1, None);
    }

    #[test]
    fn gpu_fits_count_hybrid_state_and_repacked_base3_weights() {
        let bonsai27 = &MODELS[3];
        assert!(bonsai27.state_bytes > 0 && bonsai27.format.contains("PTQ1_0"));
        // 8 GB: the 2-bit repack (~7.6 GB) plus the state does not leave 512 positions.
        assert_eq!(fit_gpu(bonsai27, 8_000_000_000), None);
        // 24 GB: it fits, with 16 layers × 4 KV heads × 256 × 2 × f16 = 64 KiB per position.
        let ctx = fit_gpu(bonsai27, 24_000_000_000).expect("fits in 24 GB");
        let free = 24_000_000_000 - bonsai27.weight_bytes * 128 / 100 - bonsai27.state_bytes;
        let want = (free - (512 << 20)) / (64 * 1024);
        assert_eq!(ctx as u64, want.min(bonsai27.max_ctx as u64));
        // A dense model's context is capped at its maximum on a large GPU.
        assert_eq!(
            fit_gpu(&MODELS[0], 140_000_000_000),
            Some(MODELS[0].max_ctx)
        );
    }
}
