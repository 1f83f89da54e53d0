//! The `trit` binary on Qwen3.5 hybrid models (a Bonsai 2 rotated pack and its GGUF export):
//! info describes the layer mix and the rotation, run generates, chat reuses the recurrent
//! state between turns, bench measures.

use std::io::Write;
use std::process::{Command, Stdio};
use trit::format::testgen::hybrid::{generate, HybridPreset};
use trit::format::testgen::{OutFormat, TokenizerAssets};

fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    c.env_remove("TRIT_MODEL");
    c
}

fn models() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = HybridPreset::by_name("tiny-prism").unwrap();
    let formats = [OutFormat::Mlx, OutFormat::parse("pq2_0").unwrap()];
    generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
    dir
}

fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn info_run_chat_and_bench() {
    let dir = models();
    let (mlx, gguf) = (dir.path().join("mlx"), dir.path().join("model-pq2_0.gguf"));
    for m in [&mlx, &gguf] {
        let info = ok(&trit().arg("info").arg(m).output().unwrap());
        assert!(info.contains("Qwen35"), "{info}");
        assert!(info.contains("3 Gated DeltaNet layers"), "{info}");
        assert!(info.contains("Hadamard-rotated"), "{info}");
        assert!(info.contains("recurrent state"), "{info}");
    }
    // The placeholder vocabulary is word-level: "<tN>" words are tokens.
    let run = trit()
        .args(["run", "--raw", "--temp", "0", "-n", "6", "-t", "1", "-m"])
        .arg(&mlx)
        .arg("<t5> <t9> <t77>")
        .output()
        .unwrap();
    let text = ok(&run);
    assert!(!text.trim().is_empty(), "no output");

    let mut chat = trit()
        .args(["chat", "--temp", "0", "-n", "4", "-t", "1", "-v", "-m"])
        .arg(&mlx)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin
        .as_mut()
        .unwrap()
        .write_all(b"<t1> <t2>\n<t3> <t4>\n/reset\n<t5>\n/exit\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    let stdout = ok(&out);
    // "[prompt: N tokens (R reused from cache), …]" per turn.
    let turns: Vec<(usize, usize)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt: "))
        .map(|l| {
            let n = l.split(' ').next().unwrap().parse().unwrap();
            let r = l.split(" tokens (").nth(1).unwrap();
            (n, r.split(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    assert_eq!(turns.len(), 3, "{stdout}");
    assert_eq!(turns[0].1, 0);
    // Turn 2 resumes at least from the recurrent-state snapshot taken before turn 1's last
    // prompt token (the placeholder vocabulary does not re-encode the reply identically).
    assert!(turns[1].1 >= turns[0].0 - 1, "{stdout}");
    assert_eq!(turns[2].1, 0, "{stdout}");

    let bench = trit()
        .args(["bench", "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-m"])
        .arg(&gguf)
        .output()
        .unwrap();
    let table = ok(&bench);
    assert!(table.contains("qwen35") && table.contains("tg4"), "{table}");

    // At a depth every repetition starts from a state of exactly that many tokens: the
    // recurrent state cannot be cut back, so it is rebuilt untimed (the bench refuses to time
    // from any other length).
    let bench = trit()
        .args([
            "bench", "-p", "0", "-n", "4", "-d", "8", "-r", "2", "-t", "1", "-o", "json",
        ])
        .args(["-m"])
        .arg(&gguf)
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_str(&ok(&bench)).unwrap();
    let row = &rows[0];
    assert_eq!(
        (row["n_depth"].as_u64(), row["n_gen"].as_u64()),
        (Some(8), Some(4)),
        "{row}"
    );
    assert_eq!(
        row["samples_ns"].as_array().map(|s| s.len()),
        Some(2),
        "{row}"
    );
}
