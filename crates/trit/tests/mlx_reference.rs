//! trit against mlx-lm and llama.cpp on random ternary models of small real-like shapes.
//!
//! tools/ref_models.py ran mlx-lm 0.32.2 (f32) on the MLX folders and llama.cpp on the GGUF
//! exports of the same weights; tests/fixtures/ref/ holds their logits and greedy ids. The
//! models are regenerated here from the same deterministic generator (format::testgen).
//!
//! What is compared:
//! - Reference kernel level (exact f32 math): all 151,936 last-position logits within 1e-3 of
//!   mlx-lm's (max abs diff; logits are O(5)) and cosine ≥ 0.999999; the 32 greedy ids equal
//!   mlx-lm's up to the first step where mlx-lm's own top-1/top-2 gap is below 2e-3.
//! - Fast kernels (int8 activations): cosine ≥ 0.999 and max abs diff ≤ 0.25 against mlx-lm,
//!   the same order of error llama.cpp's TQ2_0 path shows (it quantizes activations too).
//! - llama.cpp on TQ2_0 / TQ1_0 / Q2_0: trit's logits at llama.cpp's 1024 sampled ids and its
//!   top-50 correlate ≥ 0.998 with llama.cpp's.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trit::engine::Session;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::kernels::{best_level, set_level, KernelLevel};
use trit::model::{KvTypes, Model};

/// The kernel level is process-global: tests that set it run one at a time.
static LEVEL: Mutex<()> = Mutex::new(());

const PRESETS: [&str; 3] = ["tiny", "tiny-untied-yarn", "tiny-llama"];

fn fixture(preset: &str) -> (Value, Vec<f32>) {
    let dir = common::repo_root().join("tests/fixtures/ref");
    let json = std::fs::read_to_string(dir.join(format!("{preset}.json"))).unwrap();
    let bytes = std::fs::read(dir.join(format!("{preset}.mlx_logits.f32"))).unwrap();
    let logits = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (serde_json::from_str(&json).unwrap(), logits)
}

use common::ids;

fn make_models(preset: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let formats: Vec<OutFormat> = ["mlx", "tq2_0", "tq1_0", "q2_0"]
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    let p = Preset::by_name(preset).unwrap();
    generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
    let path = dir.path().to_path_buf();
    (dir, path)
}

/// Last-position logits of `prompt` and `steps` greedy ids, keys/values stored as `kv`.
fn run(path: &Path, prompt: &[u32], steps: usize, kv: KvTypes) -> (Vec<f32>, Vec<u32>) {
    let files = trit::format::open(path).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap().with_kv_types(kv).unwrap());
    common::greedy_run(&mut Session::new(model, 128), prompt, steps)
}

#[test]
fn exact_path_matches_mlx_lm() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    for preset in PRESETS {
        let (fx, mlx_logits) = fixture(preset);
        let (_tmp, dir) = make_models(preset);
        let prompt = ids(&fx["prompt_ids"]);
        // mlx-lm computed in f32: the exact path keeps keys/values in f32 too.
        let (logits, greedy) = run(&dir.join("mlx"), &prompt, 32, KvTypes::F32);
        assert_eq!(logits.len(), mlx_logits.len());
        let d = common::max_abs_diff(&logits, &mlx_logits);
        let cos = common::cosine(&logits, &mlx_logits);
        eprintln!("{preset}: exact path vs mlx-lm max |Δ| {d:.2e}, cosine {cos:.9}");
        assert!(d < 1e-3, "{preset}: max |Δ| {d}");
        assert!(cos > 0.999_999, "{preset}: cosine {cos}");

        let mlx_greedy = ids(&fx["mlx"]["greedy32"]["ids"]);
        let gaps: Vec<f64> = fx["mlx"]["greedy32"]["gap_top1_top2"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        let comparable = gaps.iter().take_while(|&&g| g > 2e-3).count();
        assert!(comparable >= 1, "{preset}: no comparable step");
        assert_eq!(
            greedy[..comparable],
            mlx_greedy[..comparable],
            "{preset}: greedy ids differ within the first {comparable} steps"
        );
    }
}

#[test]
fn fast_kernels_stay_close_to_mlx_lm() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let level = best_level();
    set_level(level).unwrap();
    for preset in PRESETS {
        let (fx, mlx_logits) = fixture(preset);
        let (_tmp, dir) = make_models(preset);
        let prompt = ids(&fx["prompt_ids"]);
        // The default f16 cache: its rounding is far inside this tolerance.
        let (logits, _) = run(&dir.join("mlx"), &prompt, 0, KvTypes::default());
        let d = common::max_abs_diff(&logits, &mlx_logits);
        let cos = common::cosine(&logits, &mlx_logits);
        eprintln!("{preset}: {level:?} kernels vs mlx-lm max |Δ| {d:.3}, cosine {cos:.6}");
        assert!(cos > 0.999, "{preset}: cosine {cos}");
        assert!(d < 0.25, "{preset}: max |Δ| {d}");
    }
    set_level(KernelLevel::Reference).unwrap();
}

#[test]
fn agrees_with_llama_cpp_on_its_formats() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(best_level()).unwrap();
    for preset in PRESETS {
        let (fx, _) = fixture(preset);
        let (_tmp, dir) = make_models(preset);
        let prompt = ids(&fx["prompt_ids"]);
        for (ty, file) in [
            ("TQ2_0", "model-tq2_0.gguf"),
            ("TQ1_0", "model-tq1_0.gguf"),
            ("Q2_0", "model-q2_0.gguf"),
        ] {
            let r = &fx["llama_cpp"][ty];
            // llama.cpp's default cache type, f16, like ours.
            let (logits, _) = run(&dir.join(file), &prompt, 0, KvTypes::default());
            // llama.cpp's logits at ids 0, 148, 296, … (every 148th id).
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for (k, v) in r["sampled_logits"].as_array().unwrap().iter().enumerate() {
                ours.push(logits[k * 148]);
                theirs.push(v.as_f64().unwrap() as f32);
            }
            for (i, v) in ids(&r["top50"]["ids"])
                .iter()
                .zip(r["top50"]["logits"].as_array().unwrap())
            {
                ours.push(logits[*i as usize]);
                theirs.push(v.as_f64().unwrap() as f32);
            }
            let corr = pearson(&ours, &theirs);
            let d = common::max_abs_diff(&ours, &theirs);
            eprintln!("{preset} {ty}: vs llama.cpp corr {corr:.5}, max |Δ| {d:.3}");
            assert!(corr > 0.998, "{preset} {ty}: correlation {corr}");
        }
    }
    set_level(KernelLevel::Reference).unwrap();
}

fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (
        a.iter().map(|&x| x as f64).sum::<f64>() / n,
        b.iter().map(|&x| x as f64).sum::<f64>() / n,
    );
    let cov: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - ma) * (y as f64 - mb))
        .sum();
    let va: f64 = a.iter().map(|&x| (x as f64 - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|&x| (x as f64 - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// The default f16 KV cache on the exact kernels stays within 1e-2 of mlx-lm's f32 logits
/// (the f32 cache: 1e-3, `exact_path_matches_mlx_lm`) with the same greedy ids wherever mlx-lm's
/// own top-two gap exceeds 2e-2.
#[test]
fn f16_kv_cache_stays_close_to_mlx_lm() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    for preset in PRESETS {
        let (fx, mlx_logits) = fixture(preset);
        let (_tmp, dir) = make_models(preset);
        let prompt = ids(&fx["prompt_ids"]);
        let (logits, greedy) = run(&dir.join("mlx"), &prompt, 32, KvTypes::F16);
        let d = common::max_abs_diff(&logits, &mlx_logits);
        let cos = common::cosine(&logits, &mlx_logits);
        eprintln!("{preset}: f16 KV vs mlx-lm max |Δ| {d:.2e}, cosine {cos:.9}");
        assert!(d < 1e-2, "{preset}: max |Δ| {d}");
        assert!(cos > 0.999_99, "{preset}: cosine {cos}");
        let gaps = fx["mlx"]["greedy32"]["gap_top1_top2"].as_array().unwrap();
        let comparable = gaps
            .iter()
            .take_while(|g| g.as_f64().unwrap() > 2e-2)
            .count();
        let mlx_greedy = ids(&fx["mlx"]["greedy32"]["ids"]);
        assert_eq!(greedy[..comparable], mlx_greedy[..comparable], "{preset}");
    }
}

/// q8_0 keys/values need head rows of whole 32-value blocks: a model whose head dimension is
/// 80 is refused with an error that says so (no panic), and runs with f16 ones.
#[test]
fn q8_kv_cache_refuses_heads_it_cannot_block() {
    let dir = tempfile::tempdir().unwrap();
    let p = trit::format::testgen::Preset {
        n_heads: 16,
        n_kv_heads: 2,
        head_dim: 80,
        ..Preset::by_name("tiny").unwrap()
    };
    let mlx = OutFormat::parse("mlx").unwrap();
    generate(&p, 0, dir.path(), &[mlx], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join("mlx")).unwrap();
    let q8 = trit::model::KvTypes::Q8_0;
    let err = Model::load(&files, 1)
        .unwrap()
        .with_kv_types(q8)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("q8_0") && err.contains("head dimension 80"),
        "{err}"
    );
    let model = Model::load(&files, 1)
        .unwrap()
        .with_kv_types(KvTypes::F16)
        .unwrap();
    let logits = Session::new(Arc::new(model), 16)
        .prefill(&[1, 2, 3])
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
}
