//! `trit serve` as a child process: it binds loopback on the port asked for (0 = any free one,
//! reported on stderr), answers requests, and a port that is taken is a clear error.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The child, and its stderr kept open (a closed pipe would fail the server's later log lines).
struct Server(
    Child,
    #[allow(dead_code)] BufReader<std::process::ChildStderr>,
);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn request(addr: &str, head: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{head} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Starts `trit serve --port 0 -t 1 ARGS` on the default model; its address from stderr.
fn start(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trit"))
        .args(["serve", "--port", "0", "-t", "1"])
        .args(args)
        .env_remove("TRIT_MODEL")
        .env_remove("TRIT_API_KEY")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let server = Server(child, stderr);
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (server, addr)
}

#[test]
fn serves_on_loopback_and_reports_its_address() {
    let (server, addr) = start(&["--ctx", "128"]);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let health = request(&addr, "GET /health", "");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let page = request(&addr, "GET /", "");
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("<title>trit</title>"));
    let reply = request(
        &addr,
        "POST /v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 3}"#,
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(r#""completion_tokens":3"#), "{reply}");

    // The same port again cannot be bound: a clear error, not a panic.
    let port = addr.rsplit(':').next().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trit"))
        .args(["serve", "--port", port, "-t", "1", "--ctx", "128"])
        .env_remove("TRIT_MODEL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on"), "{err}");
    drop(server);
}

/// `serve --device cuda` is accepted by the command line and fails only where the GPU is
/// missing, with the reason (no driver, or a build without CUDA): never the old "not available
/// for serve" refusal, never a panic. Skipped on a machine with an NVIDIA device (it would
/// serve; the GPU machine's script exercises that).
#[test]
fn serve_on_cuda_without_a_gpu_names_what_is_missing() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA device");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_trit"))
        .args([
            "serve",
            "--device",
            "cuda",
            "--port",
            "0",
            "--ctx",
            "128",
            "--parallel",
            "32",
        ])
        .env_remove("TRIT_MODEL")
        .env_remove("TRIT_DEVICE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("driver") || err.contains("without CUDA support"),
        "{err}"
    );
    assert!(
        !err.contains("not available for serve") && !err.contains("panicked"),
        "{err}"
    );
}

/// `--context-shift [--keep N]`: a reply longer than the context is served; `--keep` alone or
/// below −1 is refused by the command line.
#[test]
fn context_shift_lets_a_reply_run_past_the_context() {
    let (server, addr) = start(&["--ctx", "48", "--context-shift", "--keep", "2"]);
    let reply = request(
        &addr,
        "POST /v1/completions",
        r#"{"prompt": "Hello", "max_tokens": 100, "temperature": 0, "ignore_eos": true}"#,
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(r#""completion_tokens":100"#), "{reply}");
    drop(server);
    common::assert_refused(&["serve", "--keep", "3"], "--context-shift");
    common::assert_refused(
        &["serve", "--model-draft", "/nonexistent/draft.gguf"],
        "loading the draft model",
    );
    common::assert_refused(&["serve", "--context-shift", "--keep", "-2"], "-2");
}

/// `--pooling`: `/v1/embeddings` pools as asked (the last token's state differs from the mean;
/// the vectors themselves are checked against llama.cpp in trit-server's tests); an unknown
/// kind is refused by the command line.
#[test]
fn pooling_chooses_how_embeddings_are_made() {
    let body = r#"{"input": "Ternary weights take three values."}"#;
    let vector = |args: &[&str]| -> Vec<f64> {
        let (server, addr) = start(args);
        let reply = request(&addr, "POST /v1/embeddings", body);
        drop(server);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        let json: serde_json::Value =
            serde_json::from_str(&reply[reply.find("\r\n\r\n").unwrap() + 4..]).unwrap();
        json["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (mean, last) = (vector(&[]), vector(&["--pooling", "last"]));
    assert_eq!(mean.len(), last.len());
    let dot: f64 = mean.iter().zip(&last).map(|(a, b)| a * b).sum();
    assert!(dot < 0.95, "mean and last pooling agree: {dot}");
    assert_eq!(vector(&["--pooling", "mean"]), mean);
    common::assert_refused(&["serve", "--pooling", "max"], "max");
}

/// `--model-draft`: the default model drafting for itself serves the reply it serves alone.
#[test]
fn a_draft_model_serves_the_same_reply() {
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}"#;
    let text = |reply: &str| {
        let at = reply.find(r#""text":"#).expect("a text field");
        reply[at..]
            .split('"')
            .nth(3)
            .unwrap_or_default()
            .to_string()
    };
    let (plain, addr) = start(&["--ctx", "128"]);
    let want = request(&addr, "POST /v1/completions", body);
    drop(plain);
    let draft = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/default/smollm2-135m-ternary-q2_0.gguf");
    let draft = draft.to_str().unwrap();
    let (drafting, addr) = start(&[
        "--ctx",
        "128",
        "--model-draft",
        draft,
        "--draft-max",
        "4",
        "--draft-p-min",
        "0",
    ]);
    let got = request(&addr, "POST /v1/completions", body);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert_eq!(text(&got), text(&want), "{got}\n{want}");
    let metrics = request(&addr, "GET /metrics", "");
    assert!(
        metrics.contains("trit:draft_tokens_accepted_total"),
        "{metrics}"
    );
    drop(drafting);
}

/// Sampler flags on `trit serve` are the defaults of requests that leave a field unset, as
/// llama-server's: `--temp 0 --dry-multiplier 0.8` makes a request without sampling fields a
/// greedy one under DRY (it leaves the loop its prompt sets up); a request's own fields win.
#[test]
fn sampler_flags_are_the_defaults_of_requests() {
    let (server, addr) = start(&["--temp", "0", "--dry-multiplier", "0.8"]);
    let prompt = "the cat sat on the mat and the cat sat on the mat and the cat sat on the";
    let text = |extra: &str| {
        let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 6{extra}}}"#);
        let reply = request(&addr, "POST /v1/completions", &body);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        let body = reply.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let by_default = text("");
    assert!(!by_default.starts_with(" mat"), "{by_default:?}");
    assert_eq!(text(""), by_default, "greedy by default");
    let off = text(r#", "dry_multiplier": 0"#);
    assert!(off.starts_with(" mat"), "{off:?}");
    drop(server);
    common::assert_refused(&["serve", "--typical", "0"], "typical_p");
}
