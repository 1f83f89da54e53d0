//! End-to-end checks of the `trit` binary: errors are clear and exit non-zero, the default
//! model runs offline, and prompts longer than the context are refused before any compute.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn trit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trit"));
    c.env_remove("TRIT_MODEL");
    c
}

fn default_model() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
}

#[test]
fn missing_model_file_is_a_clear_error() {
    let out = trit()
        .args(["run", "--model", "/nonexistent/model.gguf", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn not_a_model_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("junk.gguf");
    std::fs::write(&p, b"this is not a gguf file at all").unwrap();
    let out = trit().args(["info"]).arg(&p).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("magic"), "{err}");
}

#[test]
fn prompt_longer_than_context_is_refused_with_llama_cpp_wording() {
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    let out = trit()
        .args(["run", "--raw", "-c", "16", "-n", "8", "--model"])
        .arg(&model)
        .arg("one two three four five six seven eight nine ten eleven twelve thirteen")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exceeds the available context size (16 tokens), try increasing it"),
        "{err}"
    );
    // Refused before any compute: no generated text, no speed line.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Generation:"));
}

#[test]
fn default_model_runs_offline_and_prints_speed() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let out = trit()
        .args(["run", "--temp", "0", "-n", "24", "Once upon a time"])
        .output()
        .unwrap();
    let stdout = common::ok_stdout(&out);
    // The reply between the ==== lines is English words, not byte soup.
    let text = stdout.split("==========").nth(1).unwrap_or("");
    let is_word = |w: &str| {
        w.chars()
            .all(|c| c.is_ascii_alphabetic() || c.is_ascii_punctuation())
    };
    let words = text.split_whitespace().filter(|w| is_word(w)).count();
    assert!(words >= 10, "{stdout}");
    assert!(
        stdout.contains("Prompt:") && stdout.contains("tokens-per-sec"),
        "{stdout}"
    );
    assert!(stdout.contains("Peak memory:"), "{stdout}");
}

#[test]
fn info_describes_the_default_model() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let out = trit().arg("info").output().unwrap();
    let stdout = common::ok_stdout(&out);
    assert!(stdout.contains("Llama"), "{stdout}");
    assert!(stdout.contains("Q2_0"), "{stdout}");
    assert!(stdout.contains("bits per weight"), "{stdout}");
}

#[test]
fn chat_keeps_the_cache_between_turns() {
    let model = std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"))
        .join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!("SKIPPED: SmolLM2 is absent (run tools/fetch_assets.sh)");
        return;
    }
    let chat = |extra: &[&std::ffi::OsStr]| {
        let mut cmd = trit();
        cmd.args(["chat", "--temp", "0", "-n", "16", "-v", "--model"])
            .arg(&model)
            .args(extra);
        let input = b"What is the capital of France?\nAnd of Italy?\n/reset\nHi\n/exit\n";
        let out = common::output_with_stdin(&mut cmd, input);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let stdout = chat(&[]);
    let reused: Vec<usize> = stdout
        .lines()
        .filter_map(|l| l.split(" tokens (").nth(1))
        .map(|r| r.split(' ').next().unwrap().parse().unwrap())
        .collect();
    // Turn 1: nothing cached; turn 2: the first turn is reused; after /reset: nothing again.
    assert_eq!(reused.len(), 3, "{stdout}");
    assert_eq!(reused[0], 0);
    assert!(reused[1] > 30, "{stdout}");
    assert_eq!(reused[2], 0, "{stdout}");
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(stdout.contains("(conversation cleared)"));
    // With the distilled default model drafting: the same replies, and a draft line per turn.
    let Some(draft) = default_model() else { return };
    let p_min = std::ffi::OsStr::new("--draft-p-min");
    let drafted = chat(&[
        "--draft-model".as_ref(),
        draft.as_os_str(),
        p_min,
        "0".as_ref(),
    ]);
    let replies = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.starts_with('['))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(replies(&drafted), replies(&stdout));
    let lines = drafted.lines().filter(|l| l.starts_with("[Draft:")).count();
    assert_eq!(lines, 3, "{drafted}");
}

/// `--cache-type-k/-v` (and llama.cpp's `-ctk/-ctv`, and `TRIT_ARG_CACHE_TYPE_K/V`) choose how
/// the KV cache stores keys and values: f16 (the default) takes half the bytes of f32, q8_0
/// 36 bytes per 32 values, an unknown type is refused with the list of known ones, and runs
/// with f32 and q8_0 caches work.
#[test]
fn cache_types_are_chosen_like_llama_cpp() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let memory = |args: &[&str], env: Option<(&str, &str)>| {
        let mut c = trit();
        c.arg("info").args(args).args(["-c", "4096"]);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout
            .lines()
            .find(|l| l.starts_with("memory:"))
            .unwrap()
            .to_string()
    };
    // 30 layers × 192 × 4096 positions × (K + V); q8_0: 36 bytes per 32 values.
    assert!(memory(&[], None).contains("KV cache 90.00 MiB at 4096 tokens (K f16, V f16)"));
    let q8 = memory(&["-ctk", "q8_0", "-ctv", "q8_0"], None);
    assert!(
        q8.contains("KV cache 50.62 MiB at 4096 tokens (K q8_0, V q8_0)"),
        "{q8}"
    );
    let exact = memory(&["-ctk", "f32", "--cache-type-v=f32"], None);
    assert!(
        exact.contains("KV cache 180.00 MiB at 4096 tokens (K f32, V f32)"),
        "{exact}"
    );
    let mixed = memory(&["-ctv=f32"], Some(("TRIT_ARG_CACHE_TYPE_K", "F32")));
    assert!(mixed.contains("(K f32, V f32)"), "{mixed}");

    let out = trit().args(["run", "-ctk", "q4_0", "hi"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'q4_0'") && err.contains("f16, f32, q8_0"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    for t in ["f32", "q8_0"] {
        let out = trit()
            .args(["run", "--temp", "0", "-n", "8", "-ctk", t, "-ctv", t])
            .arg("Once upon a time")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{t}: {stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("tokens-per-sec"));
    }
}

/// `trit ARGS…`'s standard output, which must succeed.
fn stdout_of<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = trit().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `trit run -q --temp 0 -n 100 EXTRA… PROMPT`, its output parsed as JSON.
fn json_reply(extra: &[&str], prompt: &str) -> serde_json::Value {
    let mut args = vec!["run", "-q", "--temp", "0", "-n", "100"];
    args.extend(extra);
    args.push(prompt);
    let out = stdout_of(&args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn json_schema_output_parses_and_bad_schemas_are_named() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("painter.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
            "year": {"type": "integer"}}, "required": ["name", "year"],
            "additionalProperties": false}"#,
    )
    .unwrap();
    let arg = format!("@{}", schema.display());
    let prompt = "Name a famous painter and the year they were born, as JSON.";
    let v = json_reply(&["--json-schema", &arg], prompt);
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 2, "{v}");
    let name = o["name"].as_str().unwrap();
    assert!(name.chars().count() <= 20 && o["year"].is_i64(), "{v}");
    // --json: any object.
    assert!(json_reply(&["--json"], "Describe Paris.").is_object());
    let bad = r#"{"type": "object", "minProperties": 2}"#;
    let out = trit()
        .args(["run", "--json-schema", bad, "hi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("`minProperties`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn grammar_output_follows_the_grammar_and_bad_grammars_are_named() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    // Three capitalized words separated by ", ", from a file; then inline, sampled.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("list.gbnf");
    std::fs::write(
        &file,
        "root ::= item (\", \" item){2}\nitem ::= [A-Z] [a-z]{1,12}\n",
    )
    .unwrap();
    let out = stdout_of(&[
        "run",
        "-q",
        "--temp",
        "0",
        "-n",
        "60",
        "--grammar-file",
        file.to_str().unwrap(),
        "Name three fruits.",
    ]);
    // `run` ends its output with a line break of its own.
    let items: Vec<&str> = out.trim_end_matches('\n').split(", ").collect();
    assert_eq!(items.len(), 3, "{out:?}");
    for w in items {
        assert!(w.len() >= 2 && w.len() <= 13, "{out:?}");
        assert!(w.starts_with(|c: char| c.is_ascii_uppercase()), "{out:?}");
        assert!(w[1..].bytes().all(|b| b.is_ascii_lowercase()), "{out:?}");
    }
    // `chat`: every turn's reply.
    let mut cmd = trit();
    cmd.args(["chat", "--temp", "0", "-n", "60", "--grammar-file"])
        .arg(&file)
        .arg("-m")
        .arg(default_model().unwrap());
    let input = b"Name three fruits.\nAnd three colors.\n/exit\n";
    let out = common::output_with_stdin(&mut cmd, input);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The banner, then one line per reply.
    let replies: Vec<&str> = stdout.lines().skip(1).filter(|l| !l.is_empty()).collect();
    assert_eq!(replies.len(), 2, "{stdout}");
    for r in replies {
        assert_eq!(r.split(", ").count(), 3, "{stdout}");
        assert!(r
            .split(", ")
            .all(|w| w.starts_with(|c: char| c.is_ascii_uppercase())));
    }
    let out = stdout_of(&[
        "run",
        "-q",
        "--temp",
        "1",
        "--seed",
        "4",
        "-n",
        "40",
        "--grammar",
        r#"root ::= [0-9]{1,3} " + " [0-9]{1,3}"#,
        "Write a sum.",
    ]);
    let (a, b) = out
        .trim_end_matches('\n')
        .split_once(" + ")
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        a.parse::<u16>().is_ok() && b.parse::<u16>().is_ok(),
        "{out:?}"
    );
    for (args, word) in [
        (
            vec!["--grammar", "root ::= [a-"],
            "unterminated character class",
        ),
        (vec!["--grammar", "root ::= \"a\"", "--json"], "not both"),
        (
            vec!["--grammar-file", "/nonexistent/g.gbnf"],
            "reading the grammar",
        ),
    ] {
        let out = trit().arg("run").args(&args).arg("hi").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(word),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn logit_bias_flag_forces_a_token_and_bad_values_are_named() {
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    let files = trit::format::open(&model).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let dragon = tok.encode(" dragon", false).unwrap()[0];
    let bias = format!("{dragon}+100");
    let text = stdout_of(&[
        "run",
        "-q",
        "--raw",
        "--temp",
        "0",
        "-n",
        "1",
        "-l",
        &bias,
        "Once upon a time",
    ]);
    assert_eq!(
        text.trim_end_matches('\n'),
        tok.decode(&[dragon], false).unwrap()
    );
    for bad in ["abc+1", "12", "12+x", "12+inf"] {
        let out = trit().args(["run", "-l", bad, "hi"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("logit-bias"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_draft_model_changes_the_passes_not_the_text() {
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--temp", "0", "-n", "40"];
        args.extend(extra);
        args.push("Once upon a time");
        stdout_of(&args)
    };
    let text = |s: &str| s.split("==========").nth(1).unwrap_or("").to_string();
    let plain = run(&[]);
    // The model as its own draft: every proposed token is the model's own greedy pick.
    let m = model.to_str().unwrap();
    let drafted = run(&["--draft-model", m, "--draft-p-min", "0", "--draft-max", "4"]);
    assert_eq!(text(&drafted), text(&plain));
    let line = drafted
        .lines()
        .find(|l| l.starts_with("Draft:"))
        .expect(&drafted);
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // "Draft: A of D drafted tokens accepted (P %), N passes of the model for T tokens"
    assert!(nums[0] == nums[1] && nums[1] > 20, "{line}");
    assert!(nums[nums.len() - 2] < 40 / 2, "{line}");
    let out = trit()
        .args(["run", "--draft-model", "/nonexistent/draft.gguf", "hi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("draft"), "{err}");
}

/// `run -f FILE` and `run -` (standard input) read the same prompt as the argument; a missing
/// file or an empty prompt is a clear error.
#[test]
fn the_prompt_comes_from_an_argument_a_file_or_standard_input() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let prompt = "Name three fruits.";
    let base = ["run", "-q", "--temp", "0", "-n", "12"];
    let from_arg = stdout_of(&[&base[..], &[prompt]].concat());
    assert!(!from_arg.trim().is_empty());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(stdout_of(&[&base[..], &["-f", f]].concat()), from_arg);
    let out = common::output_with_stdin(trit().args(base).arg("-"), prompt.as_bytes());
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), from_arg);
    for (args, says) in [
        (
            vec!["run", "-f", "/nonexistent/p.txt"],
            "/nonexistent/p.txt",
        ),
        (vec!["run", "-"], "empty"),
    ] {
        common::assert_refused(&args, says);
    }
}

/// The count on the line of stdout that starts with `label` ("Generation: 60 tokens, …").
fn count_after(stdout: &str, label: &str) -> usize {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in {stdout}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn minus_one_runs_to_the_context_end_and_a_context_shift_goes_past_it() {
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    // The end tokens banned (the ones `run` stops at), so only the length limits end the text.
    let files = trit::format::open(&model).unwrap();
    let tok = trit::tokenizer::Tokenizer::from_source(&files.tokenizer).unwrap();
    let mut ends = files.config.eos.clone();
    ends.extend(
        ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| tok.token_id(t)),
    );
    let bans: Vec<String> = ends.iter().map(|id| format!("{id}-inf")).collect();
    let mut base = vec!["run", "--raw", "--temp", "0", "-c", "64"];
    for b in &bans {
        base.extend(["-l", b.as_str()]);
    }
    let prompt = "Once upon a time";
    let to_end = stdout_of(&[&base[..], &["-n", "-1", prompt]].concat());
    let p = count_after(&to_end, "Prompt: ");
    assert_eq!(p + count_after(&to_end, "Generation: "), 64, "{to_end}");
    assert!(!to_end.contains("Context shifts"));
    // An explicit -n beyond the context is refused without a shift, generated with one.
    let err = trit()
        .args([&base[..], &["-n", "150", prompt]].concat())
        .output()
        .unwrap();
    assert!(!err.status.success());
    let shifted = stdout_of(&[&base[..], &["-n", "150", "--context-shift", prompt]].concat());
    assert_eq!(count_after(&shifted, "Generation: "), 150, "{shifted}");
    assert!(count_after(&shifted, "Context shifts: ") >= 2, "{shifted}");
    // Kept windows start with the prompt: the first 60 tokens equal the unshifted run's.
    let kept = stdout_of(
        &[
            &base[..],
            &["-n", "100", "--context-shift", "--keep", "-1", prompt],
        ]
        .concat(),
    );
    let text = |s: &str| s.split("==========").nth(1).unwrap().trim().to_string();
    assert!(text(&kept).starts_with(&text(&to_end)), "{kept}\n{to_end}");
    for (args, says) in [
        (vec!["run", "-n", "-3", "x"], "-1"),
        (vec!["run", "--keep", "3", "x"], "--context-shift"),
        (vec!["run", "--context-shift", "--keep", "-2", "x"], "-2"),
        (vec!["run", "-l", "4000000+1", "x"], "not a token id"),
    ] {
        common::assert_refused(&args, says);
    }
}

/// `trit run MODEL "prompt"`, `trit embed MODEL "text"`, `trit chat MODEL` and `trit perplexity
/// MODEL -f FILE` take the model as their first argument (what `--model` does); a lone model file is not read as a
/// prompt, and a model given twice differently is refused.
#[test]
fn the_model_may_come_first_as_an_argument() {
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    let m = model.to_str().unwrap();
    let reply = |args: &[&str]| common::ok_stdout(&trit().args(args).output().unwrap());
    let (prompt, greedy) = ("Once upon a time", ["--temp", "0", "-n", "8", "-q"]);
    let positional = reply(&[&["run", m, prompt][..], &greedy].concat());
    let flagged = reply(&[&["run", "--model", m, prompt][..], &greedy].concat());
    assert!(!positional.trim().is_empty());
    assert_eq!(
        positional, flagged,
        "the same model and prompt, the same greedy text"
    );
    common::assert_refused(&["run", m], "is a model, not a prompt");
    common::assert_refused(
        &["run", "--model", m, "other.gguf", prompt],
        "give the model once",
    );

    // A hub repository in the local cache is a model too; a text shaped like one is a prompt.
    let hub = tempfile::tempdir().unwrap();
    let repo = hub.path().join("models--acme--tiny");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(
        repo.join("refs/main"),
        "0123456789abcdef0123456789abcdef01234567",
    )
    .unwrap();
    let alone = |text: &str| {
        trit()
            .env("HF_HUB_CACHE", hub.path())
            .args(["run", "--temp", "0", "-n", "2", "-q", text])
            .output()
            .unwrap()
    };
    let out = alone("acme/tiny");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a model, not a prompt"), "{err}");
    common::ok_stdout(&alone("and/or"));

    assert_eq!(
        reply(&["embed", m, prompt]),
        reply(&["embed", "-m", m, prompt])
    );

    let mut chat = trit();
    chat.args(["chat", "--temp", "0", "-n", "4", m]);
    let out = common::output_with_stdin(&mut chat, b"Hi\n/exit\n");
    assert!(!common::ok_stdout(&out).trim().is_empty());

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The cat sat on the mat. ".repeat(40)).unwrap();
    let text = text.to_str().unwrap();
    let ppl = reply(&["perplexity", "-c", "64", "--chunks", "1", m, "-f", text]);
    assert!(ppl.contains("Final estimate: PPL"), "{ppl}");
}

/// Output into a pipe the reader closed (`trit embed … | head -c 10`) ends the process quietly
/// (SIGPIPE, as a C tool), never with a panic about a broken pipe.
#[cfg(unix)]
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let Some(model) = default_model() else {
        eprintln!("skipped: no default model in models/default");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lines = dir.path().join("lines.txt");
    // ~5 KB of values per line: far more than a pipe buffer holds.
    let text: String = (0..40).map(|i| format!("line {i} of the text\n")).collect();
    std::fs::write(&lines, text).unwrap();
    let mut child = trit()
        .args(["embed", "-t", "1"])
        .arg(&model)
        .arg("-f")
        .arg(&lines)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here: every later write of the child fails.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc_sigpipe()),
        "{:?}: {stderr}",
        out.status
    );
}

/// SIGPIPE's number on Linux and the BSDs.
#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13
}

/// `--dry-multiplier` (llama.cpp's DRY flags): the greedy raw continuation of a looping prompt
/// repeats the loop; with DRY it takes another token.
#[test]
fn dry_flags_break_a_repeating_loop() {
    if default_model().is_none() {
        eprintln!("skipped: no default model in models/default");
        return;
    }
    let prompt = "the cat sat on the mat and the cat sat on the mat and the cat sat on the";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-q", "--raw", "--temp", "0", "-n", "6"];
        args.extend_from_slice(extra);
        args.push(prompt);
        stdout_of(&args)
    };
    assert!(run(&[]).starts_with(" mat"));
    let dry = run(&["--dry-multiplier", "0.8", "--dry-penalty-last-n", "-1"]);
    assert!(!dry.starts_with(" mat"), "{dry:?}");
    let none = run(&["--dry-multiplier", "0.8", "--dry-sequence-breaker", "mat"]);
    assert!(none.starts_with(" mat"), "{none:?}");
}
