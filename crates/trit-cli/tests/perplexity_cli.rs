//! `trit perplexity` follows llama-perplexity's convention: on the same GGUF and text, the
//! final estimate must be within 1% of llama.cpp's (tests/fixtures/smollm2/reference.json).

mod common;

use std::path::PathBuf;
use std::process::Command;

fn cache() -> PathBuf {
    std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"))
}

#[test]
fn perplexity_matches_llama_perplexity() {
    let model = cache().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = cache().join("texts/prideprejudice.txt");
    if !model.exists() || !text.exists() {
        eprintln!("SKIPPED: SmolLM2 or the Austen text is absent (run tools/fetch_assets.sh)");
        return;
    }
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/smollm2/reference.json");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    // The flash-attention-off run: trit's attention is plain f32 softmax attention.
    let expected = r["llama_perplexity_fa_off"]["final_ppl"].as_f64().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trit"))
        .args(["perplexity", "-c", "512", "--chunks", "4", "--model"])
        .arg(&model)
        .arg("--file")
        .arg(&text)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate in {stdout}"));
    let ppl: f64 = line["Final estimate: PPL = ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let rel = (ppl - expected).abs() / expected;
    assert!(
        rel < 0.01,
        "trit {ppl} vs llama-perplexity {expected} ({:.2}%)",
        rel * 100.0
    );
    assert!(stdout.starts_with("[1]"), "{stdout}");
}

/// A number after `label` on a line of `out` (llama-perplexity's statistics lines).
fn stat(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in {out}"));
    line[label.len()..]
        .trim_start_matches([' ', ':'])
        .split([' ', '%'])
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

fn run_trit(args: &[&std::ffi::OsStr]) -> String {
    common::ok_stdout(&common::trit().args(args).output().unwrap())
}

/// `--kl-divergence-base` / `--kl-divergence` against llama-perplexity's
/// (tests/fixtures/smollm2/kl_divergence.json, tools/ref_kld.py): the base file trit writes for
/// SmolLM2 Q4_1 has llama.cpp's header and tokens and its log-probabilities (the format llama.cpp
/// read back when the fixture was made), and the default model's KL divergence from it is
/// llama.cpp's.
#[test]
fn kl_divergence_matches_llama_perplexity() {
    let base_model = cache().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let text = cache().join("texts/prideprejudice.txt");
    if !base_model.exists() || !text.exists() {
        eprintln!("SKIPPED: SmolLM2 or the Austen text is absent (run tools/fetch_assets.sh)");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/fixtures/smollm2/kl_divergence.json")).unwrap(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("trit-kld-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.kld");
    let (ctx, chunks) = (r["ctx"].to_string(), r["chunks"].to_string());
    let out = run_trit(&[
        "perplexity".as_ref(),
        base_model.as_os_str(),
        "-f".as_ref(),
        text.as_os_str(),
        "-c".as_ref(),
        ctx.as_ref(),
        "--chunks".as_ref(),
        chunks.as_ref(),
        "--kl-divergence-base".as_ref(),
        base.as_os_str(),
    ]);
    let ppl = stat(&out, "Final estimate: PPL =");
    let want = r["base_ppl"].as_f64().unwrap();
    assert!(
        (ppl / want - 1.0).abs() < 0.01,
        "PPL {ppl} vs llama.cpp {want}"
    );

    // The file: llama.cpp's header and tokens, its log-probabilities.
    let mut file = trit::engine::logits_file::LogitsReader::open(&base).unwrap();
    let h = &r["header"];
    assert_eq!(
        (file.header.n_ctx, file.header.n_vocab, file.header.n_chunk),
        (
            h["n_ctx"].as_u64().unwrap() as usize,
            h["n_vocab"].as_u64().unwrap() as usize,
            h["n_chunk"].as_u64().unwrap() as usize
        )
    );
    let tokens: Vec<u32> = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(file.header.tokens, tokens);
    let ids: Vec<usize> = r["sample_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as usize)
        .collect();
    let (mut worst, mut sum, mut count) = (0f32, 0f32, 0);
    for rec in r["records"].as_array().unwrap() {
        let row = file.next_row().unwrap();
        let next = rec["next"].as_u64().unwrap() as usize;
        let mut pairs = vec![(next, rec["next_log_prob"].as_f64().unwrap() as f32)];
        let sample = rec["sample_log_probs"].as_array().unwrap();
        pairs.extend(
            ids.iter()
                .zip(sample)
                .map(|(&i, v)| (i, v.as_f64().unwrap() as f32)),
        );
        for (i, want) in pairs {
            // Where both keep the value (the file floors the 16 nats below each row's top).
            if want > -10.0 {
                let d = (row.log_prob(i) - want).abs();
                (worst, sum, count) = (worst.max(d), sum + d, count + 1);
            }
        }
    }
    assert!(file.next_row().is_err(), "as many records as llama.cpp's");
    // The two engines' int8 activation paths differ a little (perplexity within 0.5 %); a
    // misread layout or scale would be off by nats.
    assert!(count > 500, "{count} values compared");
    let mean = sum / count as f32;
    assert!(
        mean < 0.1 && worst < 1.0,
        "log-probabilities differ from llama.cpp's by {mean} on average, {worst} at most"
    );

    // The default model against that file: llama.cpp's statistics (against its own file).
    let model = root.join(r["model"].as_str().unwrap());
    let out = run_trit(&[
        "perplexity".as_ref(),
        model.as_os_str(),
        "--kl-divergence-base".as_ref(),
        base.as_os_str(),
        "--kl-divergence".as_ref(),
    ]);
    let l = &r["llama_cpp"];
    let close = |label: &str, key: &str, rel: f64| {
        let (got, want) = (stat(&out, label), l[key].as_f64().unwrap());
        assert!(
            (got - want).abs() <= rel * want.abs(),
            "{label} {got} vs llama.cpp {want}\n{out}"
        );
    };
    close("Mean PPL(Q)", "ppl_q", 0.01);
    close("Mean PPL(base)", "ppl_base", 0.01);
    close("Mean    KLD:", "kld", 0.03);
    close("Median  KLD:", "kld_median", 0.05);
    close("RMS Δp    :", "p_diff_rms", 0.05);
    let (top, want) = (stat(&out, "Same top p:"), l["same_top"].as_f64().unwrap());
    assert!(
        (top - want).abs() < 2.0,
        "same top {top}% vs llama.cpp {want}%"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
