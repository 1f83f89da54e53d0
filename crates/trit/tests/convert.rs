//! `trit convert`: every ternary format into every target, compared byte for byte with what the
//! independent test-model writers (`format::testgen`) produce for the same weights, so A→B→A is
//! bit-exact for every pair; logits unchanged; lossy conversions refused with their location
//! and, when allowed, reported with the error they introduce.

mod common;
mod convert_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use trit::convert::{convert, ConvertOptions, Target};
use trit::engine::Session;
use trit::format::gguf::GgufFile;
use trit::format::gguf_write::GgufWriter;
use trit::format::safetensors::SafetensorsSet;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::kernels::{set_level, KernelLevel};
use trit::model::Model;
use trit::quant::GgmlType;
use trit::tokenizer::Tokenizer;

const PROMPT: [u32; 9] = [260, 72, 101, 108, 108, 111, 259, 10, 260];
const SOURCES: [&str; 7] = ["mlx", "pq2_0", "ptq1_0", "tq2_0", "tq1_0", "q2_0", "f16"];
const TARGETS: [(&str, &str); 6] = [
    ("gguf-pq2", "pq2_0"),
    ("gguf-ptq1", "ptq1_0"),
    ("gguf-tq2", "tq2_0"),
    ("gguf-tq1", "tq1_0"),
    ("gguf-q2", "q2_0"),
    ("mlx", "mlx"),
];

/// The preset's shapes with a 1024-row vocabulary (fast to convert many times).
fn small(preset: &str) -> Preset {
    Preset {
        vocab: 1024,
        bos: 258,
        eos: 259,
        pad: 258,
        ..Preset::by_name(preset).unwrap()
    }
}

fn gen(preset: &str, dir: &Path) {
    let formats: Vec<OutFormat> = SOURCES
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    let tok = convert_support::small_tokenizer(dir);
    generate(&small(preset), 0, dir, &formats, &TokenizerAssets::Dir(tok)).unwrap();
}

fn path_of(dir: &Path, fmt: &str) -> PathBuf {
    dir.join(OutFormat::parse(fmt).unwrap().file_name())
}

fn quiet(_: usize, _: usize, _: &str) {}

fn run(
    input: &Path,
    output: &Path,
    target: &str,
    allow_lossy: bool,
) -> trit::Result<trit::convert::ConvertReport> {
    let opts = ConvertOptions {
        target: Target::parse(target).unwrap(),
        allow_lossy,
    };
    convert(input, output, &opts, &mut quiet)
}

/// Every tensor's bytes must equal the reference file's (GGUF: tensor data; MLX: safetensors).
fn assert_same_tensors(got: &Path, want: &Path, what: &str) {
    if want.is_dir() {
        let (g, w) = (
            SafetensorsSet::open_dir(got).unwrap(),
            SafetensorsSet::open_dir(want).unwrap(),
        );
        assert_eq!(g.names(), w.names(), "{what}: tensor names");
        for n in w.names() {
            let ((gi, gb), (wi, wb)) = (g.get(&n).unwrap(), w.get(&n).unwrap());
            assert_eq!((gi.dtype, &gi.shape), (wi.dtype, &wi.shape), "{what}: {n}");
            assert!(gb == wb, "{what}: bytes of {n} differ");
        }
    } else {
        let (g, w) = (GgufFile::open(got).unwrap(), GgufFile::open(want).unwrap());
        let names = |f: &GgufFile| {
            let mut v: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
            v.sort();
            v
        };
        assert_eq!(names(&g), names(&w), "{what}: tensor names");
        for wi in w.tensors() {
            let gi = g.tensor(&wi.name).unwrap();
            assert_eq!(
                (gi.ty, &gi.shape),
                (wi.ty, &wi.shape),
                "{what}: {}",
                wi.name
            );
            assert!(
                g.tensor_data(gi) == w.tensor_data(wi),
                "{what}: bytes of {} differ",
                wi.name
            );
        }
    }
}

fn logits(path: &Path) -> Vec<f32> {
    let files = trit::format::open(path).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    Session::new(model, 64).prefill(&PROMPT).unwrap()
}

/// Config, tokenizer and chat template survive the trip.
fn assert_same_model_info(got: &Path, want: &Path, what: &str) {
    let (g, w) = (
        trit::format::open(got).unwrap(),
        trit::format::open(want).unwrap(),
    );
    let (mut gc, mut wc) = (g.config.clone(), w.config.clone());
    // Names and RoPE pair order follow the container (GGUF llama files are pre-permuted).
    gc.name.clear();
    wc.name.clear();
    gc.rope_style = wc.rope_style;
    assert_eq!(gc, wc, "{what}: config");
    assert_eq!(g.chat_template, w.chat_template, "{what}: chat template");
    assert_eq!(
        g.generation.temperature, w.generation.temperature,
        "{what}: sampling"
    );
    assert_eq!(g.generation.top_k, w.generation.top_k, "{what}: sampling");
    let (gt, wt) = (
        Tokenizer::from_source(&g.tokenizer).unwrap(),
        Tokenizer::from_source(&w.tokenizer).unwrap(),
    );
    let text = "<|im_start|>user\nHello the 12345 wörld!\n\n  ok<|im_end|>";
    assert_eq!(
        gt.encode(text, true).unwrap(),
        wt.encode(text, true).unwrap(),
        "{what}: tokens"
    );
}

fn check_pair(dir: &Path, out: &Path, src: &str, target: &str, reference: &str, preset: &str) {
    let what = format!("{preset}: {src} → {target}");
    let dst = out.join(format!("{src}-to-{reference}"));
    let report =
        run(&path_of(dir, src), &dst, target, false).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(!report.lossy, "{what}");
    let ternary = report.tensors.iter().filter(|t| t.error.is_some()).count();
    assert!(ternary >= 7 * 4, "{what}: {ternary} ternary tensors");
    assert_same_tensors(&dst, &path_of(dir, reference), &what);
    // Metadata follows the source (the reference writers differ in details such as how many
    // end-of-generation ids they keep).
    if src == "mlx" || (src == "pq2_0" && reference == "mlx") {
        assert_same_model_info(&dst, &path_of(dir, src), &what);
    }
}

#[test]
fn every_format_converts_to_every_target_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    gen("tiny", dir.path());
    let out = tempfile::tempdir().unwrap();
    for src in SOURCES {
        for (target, reference) in TARGETS {
            check_pair(dir.path(), out.path(), src, target, reference, "tiny");
        }
    }
}

/// Llama GGUF files hold Q/K rows permuted per head; crossing between GGUF and folders must
/// apply or undo llama.cpp's permutation, and the logits stay those of the source.
#[test]
fn llama_crosses_between_folder_and_gguf_order() {
    set_level(KernelLevel::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    gen("tiny-llama", dir.path());
    let out = tempfile::tempdir().unwrap();
    for (src, target, reference) in [
        ("mlx", "gguf-tq2", "tq2_0"),
        ("f16", "gguf-q2", "q2_0"),
        ("tq1_0", "mlx", "mlx"),
        ("pq2_0", "mlx", "mlx"),
    ] {
        check_pair(dir.path(), out.path(), src, target, reference, "tiny-llama");
    }
    let (a, b) = (
        logits(&out.path().join("tq1_0-to-mlx")),
        logits(&path_of(dir.path(), "tq1_0")),
    );
    let spread = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    // Same weights; the permuted rows only change the order of float sums in attention.
    assert!(common::max_abs_diff(&a, &b) < 1e-4 * spread.max(1.0));
}

/// A copy of `src` (a PQ2_0 GGUF) with `edit(tensor name, data)` applied to its tensor bytes.
fn edited_gguf(src: &Path, dst: &Path, edit: impl Fn(&str, &mut Vec<u8>)) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if k != "general.alignment" {
            w.add(k.clone(), v.clone()).unwrap();
        }
    }
    for t in f.tensors() {
        let mut data = f.tensor_data(t).to_vec();
        edit(&t.name, &mut data);
        w.add_tensor(t.name.clone(), &t.shape, t.ty, data).unwrap();
    }
    w.write_file(dst).unwrap();
}

#[test]
fn lossy_conversions_are_refused_with_their_location_or_reported() {
    set_level(KernelLevel::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pq2 = OutFormat::Gguf(GgmlType::PQ2_0);
    generate(
        &small("tiny"),
        0,
        dir.path(),
        &[pq2],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let src = dir.path().join(pq2.file_name());
    // Row 5 of blk.1.attn_q (256 wide): double the scale of PQ2_0 block 1 (columns 128..256),
    // the second half of TQ block 0; and put a code 3 into blk.2.ffn_up row 0, block 0.
    let name = "blk.1.attn_q.weight";
    let edited = dir.path().join("edited.gguf");
    edited_gguf(&src, &edited, |n, data| {
        if n == name {
            let at = (5 * 2 + 1) * 34;
            let d = half::f16::from_le_bytes([data[at], data[at + 1]]);
            data[at..at + 2].copy_from_slice(&half::f16::from_f32(d.to_f32() * 2.0).to_le_bytes());
        }
        if n == "blk.2.ffn_up.weight" {
            data[2] |= 3;
        }
    });
    let out = dir.path().join("out.gguf");
    let msg = run(&edited, &out, "gguf-tq2", false)
        .unwrap_err()
        .to_string();
    for want in [
        name,
        "row 5",
        "block 0",
        "columns 0..256",
        "different scales",
        "--allow-lossy",
    ] {
        assert!(msg.contains(want), "missing '{want}' in: {msg}");
    }
    assert!(!out.exists(), "nothing is written on refusal");
    assert!(!dir.path().join("out.gguf.partial").exists());
    // PQ2_0 and MLX keep 128-groups and code 3: lossless.
    assert!(!run(&edited, &out, "gguf-q2", false).unwrap().lossy);
    let msg = run(&edited, &out, "gguf-ptq1", false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("blk.2.ffn_up.weight") && msg.contains("code 3"),
        "{msg}"
    );

    let report = run(&edited, &out, "gguf-tq2", true).unwrap();
    assert!(report.lossy);
    for t in &report.tensors {
        let Some(e) = &t.error else { continue };
        if t.name == name {
            assert_eq!(e.lossy_blocks, 1, "{e:?}");
            // The block's two halves had scales s and 2s with about equal non-zero counts:
            // one shared scale near 1.5 s is off by ~1/3 on every non-zero weight there.
            assert!(e.max_rel > 0.2 && e.max_rel < 0.6, "{e:?}");
            assert!(e.mean_rel > 0.0 && e.mean_rel < 0.01, "{e:?}");
        } else {
            assert_eq!(e.lossy_blocks, 0, "{}", t.name);
            assert_eq!(e.max_rel, 0.0, "{}", t.name);
        }
    }
    // The written file decodes to the report's shared scale, and the untouched tensors stay exact.
    let before = GgufFile::open(&src).unwrap();
    let tq2 = dir.path().join("tq2.gguf");
    run(&src, &tq2, "gguf-tq2", false).unwrap();
    let (a, b) = (GgufFile::open(&out).unwrap(), GgufFile::open(&tq2).unwrap());
    let other = "blk.0.ffn_down.weight";
    assert!(a.tensor_data(a.tensor(other).unwrap()) == b.tensor_data(b.tensor(other).unwrap()));
    assert!(a.tensor_data(a.tensor(name).unwrap()) != b.tensor_data(b.tensor(name).unwrap()));
    assert!(before.tensor(name).is_some());
}

#[test]
fn bad_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let msg = run(&missing, &dir.path().join("o.gguf"), "gguf-tq2", false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("nope.gguf"), "{msg}");
    assert!(Target::parse("gguf-q4_0")
        .unwrap_err()
        .to_string()
        .contains("gguf-pq2"));
    let pq2 = OutFormat::Gguf(GgmlType::PQ2_0);
    generate(
        &small("tiny"),
        0,
        dir.path(),
        &[pq2],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let src = dir.path().join(pq2.file_name());
    let msg = run(&src, &src, "gguf-tq2", false).unwrap_err().to_string();
    assert!(msg.contains("input path"), "{msg}");
}

/// Qwen3.5 hybrids (Gated DeltaNet + gated attention) re-pack between GGUF block types with
/// every extra tensor (conv, A, dt, α/β) carried as is; folders are refused with the reason.
/// The generator's GGUF reorders `ssm_out`'s input columns into llama.cpp's V-head order,
/// which splits its 256-scale groups: only Q2_0 (g64) holds it exactly, so a 128-group target
/// is a real lossy case.
#[test]
fn hybrid_gguf_converts_between_block_types_only() {
    use trit::format::testgen::hybrid::{generate as gen_hybrid, HybridPreset};
    set_level(KernelLevel::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-qwen35").unwrap();
    let q2 = OutFormat::Gguf(GgmlType::Q2_0);
    gen_hybrid(&p, 0, dir.path(), &[q2], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(q2.file_name());
    let out = dir.path().join("converted.gguf");
    assert!(!run(&src, &out, "gguf-q2", false).unwrap().lossy);
    assert_same_tensors(&out, &src, "tiny-qwen35 Q2_0 → Q2_0");
    let msg = run(&src, &out, "gguf-pq2", false).unwrap_err().to_string();
    assert!(
        msg.contains("ssm_out") && msg.contains("different scales"),
        "{msg}"
    );
    let report = run(&src, &out, "gguf-pq2", true).unwrap();
    assert!(report.lossy);
    let files = trit::format::open(&out).unwrap();
    let m = Arc::new(Model::load(&files, 2).unwrap());
    let l = Session::new(m, 16).prefill(&[1, 2, 3]).unwrap();
    assert!(l.iter().all(|x| x.is_finite()));
    let msg = run(&src, &dir.path().join("mlx"), "mlx", false)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("qwen35") && msg.contains("GGUF block types only"),
        "{msg}"
    );
}
