//! The binary's saved sessions and long chats, on the committed default model:
//! `run --prompt-cache` (a second run reads its prompt from the file and writes the same
//! reply; `--prompt-cache-ro` never writes; a damaged file is a clear error), `chat`'s `/save`
//! and `/load` (a new process continues the conversation from its cache), and a chat that
//! outgrows its context dropping its oldest exchanges instead of refusing the next turn.

mod common;
use common::{output_with_stdin, trit};

use std::path::Path;
use std::process::Output;

fn run(cache: &Path, extra: &[&str]) -> Output {
    trit()
        .args(["run", "--temp", "0", "-n", "12", "--prompt-cache"])
        .arg(cache)
        .args(extra)
        .arg("Tell me about the sea.")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The reply between the `==========` lines.
fn reply(stdout: &str) -> &str {
    stdout.split("==========").nth(1).unwrap_or("")
}

/// `(read from the file, prompt tokens)` of the "Prompt cache:" line.
fn cache_line(stdout: &str) -> (usize, usize) {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Prompt cache: "))
        .unwrap_or_else(|| panic!("no prompt cache line: {stdout}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    (w[0].parse().unwrap(), w[2].parse().unwrap())
}

#[test]
fn a_second_run_reads_its_prompt_from_the_prompt_cache() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.bin");
    let ro = dir.path().join("never.bin");
    let first = ok(&run(&ro, &["--prompt-cache-ro"]));
    assert!(!ro.exists(), "--prompt-cache-ro writes nothing");
    assert_eq!(cache_line(&first).0, 0);
    assert_eq!(reply(&ok(&run(&file, &[]))), reply(&first));
    assert!(file.exists());
    let second = ok(&run(&file, &[]));
    let (read, total) = cache_line(&second);
    // Everything but the last prompt token (its logits start the reply).
    assert_eq!(read, total - 1, "{second}");
    assert!(reply(&second).split_whitespace().count() >= 3, "{second}");
    assert_eq!(reply(&second), reply(&first));

    // A damaged file: a clear error naming it, no panic, no reply.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let out = run(&file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("prompt.bin") && stderr.contains("checksum"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `trit chat --temp 0 -v EXTRA…` fed `input`; its standard output.
fn chat(extra: &[&str], input: &str) -> String {
    let mut cmd = trit();
    cmd.args(["chat", "--temp", "0", "-v"]).args(extra);
    ok(&output_with_stdin(&mut cmd, input.as_bytes()))
}

/// Cached prompt tokens of each turn's `-v` line.
fn reused(stdout: &str) -> Vec<usize> {
    stdout
        .lines()
        .filter_map(|l| l.split(" tokens (").nth(1))
        .map(|r| r.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn a_saved_chat_continues_in_a_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.bin");
    let f = file.to_str().unwrap();
    let one = chat(
        &["-n", "10"],
        &format!("Name a colour.\n/save {f}\n/exit\n"),
    );
    assert!(one.contains("(saved 2 messages"), "{one}");
    let two = chat(
        &["-n", "10"],
        &format!("/load {f}\nAnd another one?\n/load {f}.absent\n/exit\n"),
    );
    assert!(two.contains("(loaded 2 messages"), "{two}");
    // The whole first exchange came from the file.
    let r = reused(&two);
    assert_eq!(r.len(), 1, "{two}");
    assert!(r[0] > 20, "{two}");
    // The same turn in the first process's own cache reuses exactly as much.
    let same = chat(&["-n", "10"], "Name a colour.\nAnd another one?\n/exit\n");
    assert_eq!(reused(&same)[1], r[0], "{same}\n{two}");
    assert!(
        two.contains("could not load") && two.contains("chat.bin.absent"),
        "{two}"
    );
}

#[test]
fn a_long_chat_drops_its_oldest_exchanges() {
    // 160 positions: a few turns of ~40 tokens each fill it.
    let input = (1..=6)
        .map(|i| format!("Tell me fact number {i} about cats.\n"))
        .collect::<String>()
        + "/exit\n";
    let out = chat(&["-n", "24", "-c", "160"], &input);
    assert!(out.contains("outgrew the context of 160 tokens"), "{out}");
    assert!(!out.contains("exceeds the available context"), "{out}");
    // Every turn got a reply line with its speed.
    assert_eq!(reused(&out).len(), 6, "{out}");
}
