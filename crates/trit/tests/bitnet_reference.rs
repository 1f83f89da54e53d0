//! trit's BitNet b1.58 against mlx-lm's `bitnet` model and transformers' `BitNetForCausalLM`
//! (tools/ref_bitnet.py).
//!
//! The reference ran mlx-lm 0.32.2 (f32, CPU; its Metal-only BitLinear kernel replaced by the
//! same arithmetic in mlx ops, scales divided as `linear_class: bitlinear` says) on the
//! random-weight `tiny-bitnet` Hugging Face folder (3 layers, 4 q / 2 kv heads of 64, ffn 768,
//! Llama-3's 128,256-row bf16 embedding, packed uint8 projections + bf16 `weight_scale`) and
//! stored the last-position logits of a 12-token and a 300-token prompt (every 125th id and the
//! 32 largest) plus 24 greedy ids with their top-1/top-2 gaps. The model is regenerated here
//! from the same seed.
//!
//! transformers (its own unpacking and scale rule, CPU f32) read the same folder: with its
//! activation quantization off it equals mlx-lm to 9e-6; as shipped (W1.58A8) cosine 0.9996.
//!
//! - Exact kernels: logits within 1e-3 of both, greedy ids equal up to the first small-gap
//!   step.
//! - Fast kernels (int8 activations): cosine ≥ 0.999 against mlx-lm and transformers' W1.58A8,
//!   same top-1.
//! - The GGUF `bitnet` exports (TQ2_0, TQ1_0, Q2_0 with per-tensor `.scale` tensors) give the
//!   folder's logits (bit for bit on the exact path: the same weights).

mod common;

use common::ids;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trit::engine::Session;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::kernels::{best_level, set_level, KernelLevel};
use trit::model::{KvTypes, Model};

static LEVEL: Mutex<()> = Mutex::new(());
const PRESET: &str = "tiny-bitnet";

fn fixture() -> Value {
    let path = common::repo_root().join(format!("tests/fixtures/bitnet/{PRESET}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The stored logits as (token id, value) pairs: every `sample_step`-th id and the top ids.
fn reference_logits(fx: &Value, prompt: &str) -> Vec<(usize, f32)> {
    let path = common::repo_root().join(format!("tests/fixtures/bitnet/{PRESET}.{prompt}.f32"));
    let r = &fx["prompts"][prompt];
    let step = r["sample_step"].as_u64().unwrap() as usize;
    let mut out: Vec<(usize, f32)> = std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .enumerate()
        .map(|(i, b)| (i * step, f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    let top = ids(&r["top_ids"]);
    let vals = r["top_logits"].as_array().unwrap();
    for (&id, v) in top.iter().zip(vals) {
        out.push((id as usize, v.as_f64().unwrap() as f32));
    }
    out
}

/// transformers' logits at every `sample_step`-th id (`kind`: `f32` with its activation
/// quantization off, `a8` as shipped).
fn transformers_logits(fx: &Value, prompt: &str, kind: &str) -> Vec<(usize, f32)> {
    let name = format!("tests/fixtures/bitnet/{PRESET}.{prompt}.transformers_{kind}.f32");
    let step = fx["prompts"][prompt]["sample_step"].as_u64().unwrap() as usize;
    std::fs::read(common::repo_root().join(name))
        .unwrap()
        .chunks_exact(4)
        .enumerate()
        .map(|(i, b)| (i * step, f32::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

fn pick(logits: &[f32], want: &[(usize, f32)]) -> (Vec<f32>, Vec<f32>) {
    want.iter().map(|&(i, v)| (logits[i], v)).unzip()
}

fn make_model(formats: &[OutFormat]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name(PRESET).unwrap();
    generate(&p, 0, dir.path(), formats, &TokenizerAssets::Placeholder).unwrap();
    dir
}

fn load(path: &Path, kv: KvTypes) -> Arc<Model> {
    let files = trit::format::open(path).unwrap();
    assert!(
        files.config.bitnet,
        "{} is not read as bitnet",
        path.display()
    );
    Arc::new(Model::load(&files, 2).unwrap().with_kv_types(kv).unwrap())
}

fn gaps(r: &Value) -> Vec<f64> {
    r["gap_top1_top2"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_f64().unwrap())
        .collect()
}

fn check_exact(model: &Arc<Model>, fx: &Value, what: &str) {
    for name in ["short", "long"] {
        let r = &fx["prompts"][name];
        let prompt = ids(&r["ids"]);
        let mut s = Session::new(model.clone(), 512);
        let (logits, out) = common::greedy_run(&mut s, &prompt, 24);
        let (got, want) = pick(&logits, &reference_logits(fx, name));
        let d = common::max_abs_diff(&got, &want);
        let cos = common::cosine(&got, &want);
        eprintln!(
            "{what} {name} ({} tokens): max |Δ| {d:.2e}, cosine {cos:.9}",
            prompt.len()
        );
        assert!(d < 1e-3, "{what} {name}: max |Δ| {d}");
        let (got, want) = pick(&logits, &transformers_logits(fx, name, "f32"));
        let d = common::max_abs_diff(&got, &want);
        assert!(d < 1e-3, "{what} {name}: max |Δ| {d} vs transformers (f32)");
        let comparable = gaps(r).iter().take_while(|&&g| g > 2e-3).count();
        assert!(
            comparable >= 4,
            "{what} {name}: {comparable} comparable steps"
        );
        assert_eq!(
            out[..comparable],
            ids(&r["greedy"])[..comparable],
            "{what} {name}: greedy ids differ within the first {comparable} steps"
        );
    }
}

#[test]
fn exact_path_matches_mlx_lm() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let fx = fixture();
    let tmp = make_model(&[OutFormat::Hf]);
    let model = load(&tmp.path().join("hf"), KvTypes::F32);
    check_exact(&model, &fx, "hf folder");
}

#[test]
fn fast_kernels_stay_close_to_mlx_lm() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let level = best_level();
    set_level(level).unwrap();
    let fx = fixture();
    let tmp = make_model(&[OutFormat::Hf]);
    let model = load(&tmp.path().join("hf"), KvTypes::default());
    for name in ["short", "long"] {
        let prompt = ids(&fx["prompts"][name]["ids"]);
        let logits = Session::new(model.clone(), 512).prefill(&prompt).unwrap();
        let (got, want) = pick(&logits, &reference_logits(&fx, name));
        let cos = common::cosine(&got, &want);
        let d = common::max_abs_diff(&got, &want);
        eprintln!("{name}: {level:?} kernels max |Δ| {d:.3}, cosine {cos:.6}");
        assert!(cos > 0.999, "{name}: cosine {cos}");
        // transformers as shipped quantizes activations per token (W1.58A8); trit's int8
        // kernels per 64 columns: both close to each other and to the f32 logits.
        let (got, want) = pick(&logits, &transformers_logits(&fx, name, "a8"));
        let cos = common::cosine(&got, &want);
        eprintln!("{name}: vs transformers W1.58A8 cosine {cos:.6}");
        assert!(cos > 0.999, "{name}: cosine {cos} vs transformers (A8)");
        assert_eq!(
            common::top_k(&logits, 1)[0],
            ids(&fx["prompts"][name]["top_ids"])[0],
            "{name}: argmax"
        );
    }
    set_level(KernelLevel::Reference).unwrap();
}

/// GGUF `bitnet` files of the same weights (unit block scales + `<name>.scale`, NeoX RoPE with
/// un-permuted Q/K) give the folder's logits exactly, in three block types.
#[test]
fn gguf_matches_the_folder() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let fx = fixture();
    let types = ["tq2_0", "tq1_0", "q2_0"];
    let mut formats = vec![OutFormat::Hf];
    formats.extend(types.iter().map(|t| OutFormat::parse(t).unwrap()));
    let tmp = make_model(&formats);
    let prompt = ids(&fx["prompts"]["short"]["ids"]);
    let folder = load(&tmp.path().join("hf"), KvTypes::F32);
    let want = Session::new(folder, 64).prefill(&prompt).unwrap();
    for f in &formats[1..] {
        let path: PathBuf = tmp.path().join(f.file_name());
        let files = trit::format::open(&path).unwrap();
        assert_eq!(files.config.arch_name(), "bitnet");
        let model = load(&path, KvTypes::F32);
        let got = Session::new(model.clone(), 64).prefill(&prompt).unwrap();
        let d = common::max_abs_diff(&got, &want);
        eprintln!("{}: max |Δ| vs the folder {d:.2e}", f.file_name());
        assert!(d < 1e-5, "{}: max |Δ| {d}", f.file_name());
    }
    // And the reference itself, through one GGUF (greedy included).
    let model = load(&tmp.path().join("model-tq1_0.gguf"), KvTypes::F32);
    check_exact(&model, &fx, "tq1_0 gguf");
}

/// trit's built-in BitNet template renders llama.cpp's `bitnet` chat format, and the Llama-3
/// tokenizer (2B4T's) encodes it as Hugging Face `tokenizers` does (tools/ref_bitnet_chat.py:
/// the text built by string concatenation, ids from `tokenizers`). Needs the fetched asset.
#[test]
fn chat_prompts_match_hf_tokenizers() {
    let Some(path) = common::asset("llama3/tokenizer.json") else {
        return;
    };
    let tok = trit::tokenizer::Tokenizer::from_json_file(&path).unwrap();
    let template = trit::chat::ChatTemplate::new(
        trit::chat::builtin::BITNET,
        "<|begin_of_text|>",
        "<|eot_id|>",
    )
    .unwrap();
    let path = common::repo_root().join("tests/fixtures/bitnet/chat.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let messages = case["messages"].as_array().unwrap();
        let text = template
            .render(messages, true, None, &Default::default())
            .unwrap();
        assert_eq!(text, case["text"].as_str().unwrap());
        assert_eq!(
            tok.encode(&text, false).unwrap(),
            ids(&case["ids"]),
            "{text}"
        );
    }
}

/// Two prompts in one batched pass (312 rows: the MLP's 256-token chunks straddle the two
/// sequences, each with its own cache) give the logits each gives alone.
#[test]
fn batched_prefill_equals_single_runs() {
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let fx = fixture();
    let tmp = make_model(&[OutFormat::Hf]);
    let model = load(&tmp.path().join("hf"), KvTypes::F32);
    let prompts: Vec<Vec<u32>> = ["short", "long"]
        .iter()
        .map(|n| ids(&fx["prompts"][*n]["ids"]))
        .collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| Session::new(model.clone(), 512).prefill(p).unwrap())
        .collect();
    let (mut c0, mut c1) = (model.new_cache(512), model.new_cache(512));
    let mut seqs = [
        trit::model::BatchSeq {
            tokens: &prompts[0],
            cache: &mut c0,
            logits: trit::model::Logits::Last,
        },
        trit::model::BatchSeq {
            tokens: &prompts[1],
            cache: &mut c1,
            logits: trit::model::Logits::Last,
        },
    ];
    let batched = model.forward_batch(&mut seqs).unwrap();
    for (b, a) in batched.iter().zip(&alone) {
        let d = common::max_abs_diff(b, a);
        assert!(d < 1e-4, "batched vs alone: max |Δ| {d}");
    }
}

/// `trit convert` of the folder to GGUF (TQ1_0, PQ2_0: unit block scales + the per-tensor
/// `.scale` tensors, Q/K unpermuted, `bitnet` metadata) and GGUF → GGUF give the folder's
/// logits exactly. The folder carries the real Llama-3 tokenizer (the converter writes only
/// byte-level BPE vocabularies), so this needs the fetched asset; the GGUF's vocabulary then
/// encodes a chat prompt as the folder's tokenizer.json does.
#[test]
fn converted_gguf_matches_the_folder() {
    use trit::convert::{convert, ConvertOptions, Target};
    use trit::quant::GgmlType;
    let _g = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    set_level(KernelLevel::Reference).unwrap();
    let Some(llama3) = common::asset("llama3/tokenizer.json") else {
        return;
    };
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let tok_dir = tmp.path().join("tok");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::copy(&llama3, tok_dir.join("tokenizer.json")).unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), "{}").unwrap();
    let p = Preset::by_name(PRESET).unwrap();
    let assets = TokenizerAssets::Dir(tok_dir);
    generate(&p, 0, tmp.path(), &[OutFormat::Hf], &assets).unwrap();
    let folder = tmp.path().join("hf");
    let prompt = ids(&fx["prompts"]["short"]["ids"]);
    let want = Session::new(load(&folder, KvTypes::F32), 64)
        .prefill(&prompt)
        .unwrap();
    let run = |from: &Path, to: &Path, ty: GgmlType| {
        let opts = ConvertOptions {
            target: Target::Gguf(ty),
            allow_lossy: false,
        };
        let report = convert(from, to, &opts, &mut |_, _, _| {}).unwrap();
        assert!(!report.lossy);
        let files = trit::format::open(to).unwrap();
        assert_eq!(files.config.arch_name(), "bitnet");
        assert!(files.chat_template.is_some());
        let got = Session::new(load(to, KvTypes::F32), 64)
            .prefill(&prompt)
            .unwrap();
        let d = common::max_abs_diff(&got, &want);
        assert!(d < 1e-5, "{}: max |Δ| {d}", to.display());
        let text = "<|begin_of_text|>User: Translate: 苹果发布M5芯片 🍎<|eot_id|>Assistant: ";
        let gguf_tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
        let json_tok = trit::tokenizer::Tokenizer::from_json_file(&llama3).unwrap();
        assert_eq!(
            gguf_tok.encode(text, false).unwrap(),
            json_tok.encode(text, false).unwrap()
        );
    };
    let tq1 = tmp.path().join("conv-tq1_0.gguf");
    run(&folder, &tq1, GgmlType::TQ1_0);
    run(
        &folder,
        &tmp.path().join("conv-pq2_0.gguf"),
        GgmlType::PQ2_0,
    );
    run(&tq1, &tmp.path().join("conv-q2_0.gguf"), GgmlType::Q2_0);
}
