//! An in-process `trit serve` on 127.0.0.1 with an ephemeral port, serving the default model,
//! and a minimal blocking HTTP/1.1 client (requests with `Connection: close`, chunked bodies
//! decoded) so tests need no client library.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use trit::chat::ChatTemplate;
use trit::model::Model;
use trit::sample::SamplingParams;
use trit::tokenizer::Tokenizer;
use trit_server::{AppState, ServerConfig};

pub const API_KEY: &str = "test-key";

pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Asks for a graceful shutdown (stop accepting, let replies in flight finish).
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Waits until the server has stopped.
    pub fn join(mut self) {
        self.begin_shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn default_model_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .expect("the default model is committed")
}

pub struct Options {
    pub n_ctx: usize,
    pub parallel: usize,
    pub max_queue: usize,
    pub body_limit: usize,
    pub kv_cache_bytes: usize,
    /// Another model than the default one.
    pub model: Option<PathBuf>,
    /// A chat template instead of the model's.
    pub chat_template: Option<String>,
    /// `--context-shift --keep N`.
    pub context_shift: Option<usize>,
    /// `--model-draft` with the model itself as its draft.
    pub self_draft: bool,
    /// `--pooling`.
    pub pooling: trit::engine::Pooling,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            n_ctx: 256,
            parallel: 4,
            max_queue: 16,
            body_limit: 64 << 10,
            kv_cache_bytes: 64 << 20,
            model: None,
            chat_template: None,
            context_shift: None,
            self_draft: false,
            pooling: trit::engine::Pooling::Mean,
        }
    }
}

/// Starts a server (model loaded with one thread: the test machine has few cores).
pub fn start(opts: Options) -> TestServer {
    let path = opts.model.clone().unwrap_or_else(default_model_path);
    let files = trit::format::open(&path).unwrap();
    let tokenizer = Tokenizer::from_source(&files.tokenizer).unwrap();
    let source = opts
        .chat_template
        .as_deref()
        .or(files.chat_template.as_deref());
    let template = source.map(|src| {
        ChatTemplate::new(
            src,
            &tokenizer.bos_token().unwrap_or_default(),
            &tokenizer.eos_token().unwrap_or_default(),
        )
        .unwrap()
    });
    let eos: Vec<u32> = tokenizer.token_id("<|im_end|>").into_iter().collect();
    let model = Arc::new(Model::load(&files, 1).unwrap());
    let config = ServerConfig {
        model_id: "default".into(),
        n_ctx: opts.n_ctx,
        defaults: SamplingParams::default(),
        eos,
        bos: None,
        api_key: Some(API_KEY.into()),
        body_limit: opts.body_limit,
        parallel: opts.parallel,
        max_queue: opts.max_queue,
        kv_cache_bytes: opts.kv_cache_bytes,
        context_shift: opts
            .context_shift
            .map(|keep| trit::engine::ContextShift { keep }),
        draft: opts.self_draft.then(|| trit::engine::Draft {
            model: model.clone(),
            options: trit::engine::DraftOptions { max: 4, p_min: 0.0 },
        }),
        pooling: opts.pooling,
    };
    let state = AppState::new(config, model, tokenizer, template).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            trit_server::serve(listener, state, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
    });
    TestServer {
        addr: addr_rx.recv().unwrap(),
        shutdown: Some(tx),
        thread: Some(thread),
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON payloads of an SSE body, `[DONE]` as a string.
    pub fn events(&self) -> Vec<Value> {
        let text = self.text();
        assert!(
            text.ends_with("\n\n"),
            "SSE body must end with a blank line"
        );
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let data = e
                    .strip_prefix("data: ")
                    .expect("every event is one data line");
                assert!(!data.contains('\n'), "one line per event");
                if data == "[DONE]" {
                    Value::String("[DONE]".into())
                } else {
                    serde_json::from_str(data).unwrap()
                }
            })
            .collect()
    }
}

/// Opens a connection and sends one request (with the API key unless `key` is None).
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    key: Option<&str>,
) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(k) = key {
        head += &format!("Authorization: Bearer {k}\r\n");
    }
    head += "\r\n";
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    BufReader::new(s)
}

/// Reads the status line and headers.
pub fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    (status, headers)
}

/// Reads one chunk of a chunked body (None at the end).
pub fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let size = usize::from_str_radix(line.trim(), 16).unwrap();
    let mut data = vec![0u8; size + 2];
    r.read_exact(&mut data).unwrap();
    data.truncate(size);
    (size > 0).then_some(data)
}

pub fn request_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    key: Option<&str>,
) -> Reply {
    let mut r = send(addr, method, path, body, key);
    let (status, headers) = read_head(&mut r);
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(&mut r) {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Reply {
        status,
        headers,
        body,
    }
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request_raw(
        addr,
        "POST",
        path,
        body.to_string().as_bytes(),
        Some(API_KEY),
    )
}

/// The text of a `/v1/completions` reply to `body` with `extra`'s fields added (a 200 asserted).
pub fn completion_text(addr: SocketAddr, body: &Value, extra: &Value) -> String {
    let mut b = body.clone();
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = post(addr, "/v1/completions", &b);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request_raw(addr, "GET", path, b"", Some(API_KEY))
}

/// A gauge or counter from /metrics.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = get(addr, "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("trit:{name} ")))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse()
        .unwrap()
}

/// Polls until `cond` holds (bounded: 60 s).
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..600 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The repository's `.cache` (test assets), `TRIT_CACHE` when set.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TRIT_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// A completion's or chat completion's text and finish reason (`stream: true` bodies read as
/// their events joined); the request must succeed.
pub fn reply(addr: SocketAddr, path: &str, body: &Value) -> (String, String) {
    let r = post(addr, path, body);
    assert_eq!(r.status, 200, "{}", r.text());
    let chat = path.contains("chat");
    if body["stream"] == true {
        let mut text = String::new();
        let mut finish = String::new();
        for e in r.events() {
            let c = &e["choices"][0];
            let piece = if chat {
                &c["delta"]["content"]
            } else {
                &c["text"]
            };
            text.push_str(piece.as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        return (text, finish);
    }
    let v = r.json();
    let c = &v["choices"][0];
    let text = if chat {
        &c["message"]["content"]
    } else {
        &c["text"]
    };
    (
        text.as_str().unwrap().to_string(),
        c["finish_reason"].as_str().unwrap().to_string(),
    )
}
