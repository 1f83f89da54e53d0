//! The `trit` binary on a BitNet b1.58 model (the random `tiny-bitnet` preset as its Hugging
//! Face packed folder and a TQ2_0 GGUF): `info` names the architecture, `run` renders the
//! built-in BitNet chat template (the files carry none) and generates, `chat` holds two turns
//! (on the folder: the placeholder vocabulary only encodes text through its tokenizer.json),
//! `bench` runs the GGUF.

use std::io::Write;
use std::process::{Command, Stdio};
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};

fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    c.env_remove("TRIT_MODEL");
    c
}

fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    format!("{stdout}\n{stderr}")
}

#[test]
fn info_run_and_chat() {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny-bitnet").unwrap();
    let formats = [OutFormat::Hf, OutFormat::parse("tq2_0").unwrap()];
    generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
    let (hf, gguf) = (dir.path().join("hf"), dir.path().join("model-tq2_0.gguf"));
    for m in [&hf, &gguf] {
        let info = ok(&trit().arg("info").arg(m).output().unwrap());
        assert!(info.contains("architecture:  bitnet"), "{info}");
        assert!(info.contains("4 q / 2 kv × 64"), "{info}");
        assert!(info.contains("built-in BitNet template"), "{info}");
    }
    // Chat mode (no --raw): the built-in template renders the turn; the system prompt adds
    // tokens to the prompt.
    let prompt_tokens = |system: Option<&str>| -> usize {
        let mut c = trit();
        c.args(["run", "--temp", "0", "-n", "4", "-t", "1", "-m"])
            .arg(&hf);
        if let Some(s) = system {
            c.args(["--system", s]);
        }
        let out = ok(&c.arg("<t5> <t9>").output().unwrap());
        assert!(out.contains("Generation: 4 tokens"), "{out}");
        let line = out.lines().find(|l| l.starts_with("Prompt: ")).unwrap();
        line["Prompt: ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let plain = prompt_tokens(None);
    let with_system = prompt_tokens(Some("<t1> <t2> <t3>"));
    assert!(with_system > plain, "{plain} vs {with_system}");

    let mut chat = trit()
        .args(["chat", "--temp", "0", "-n", "3", "-t", "1", "-v", "-m"])
        .arg(&hf)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin
        .as_mut()
        .unwrap()
        .write_all(b"<t1> <t2>\n<t3> <t4>\n/exit\n")
        .unwrap();
    let out = ok(&chat.wait_with_output().unwrap());
    let turns = out.lines().filter(|l| l.starts_with("[prompt: ")).count();
    assert_eq!(turns, 2, "{out}");

    let bench = trit()
        .args(["bench", "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-m"])
        .arg(&gguf)
        .output()
        .unwrap();
    let table = ok(&bench);
    assert!(table.contains("bitnet") && table.contains("tg4"), "{table}");
}
