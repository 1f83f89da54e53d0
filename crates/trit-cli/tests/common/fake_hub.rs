//! A Hugging Face Hub stand-in on loopback for `trit pull` tests: serves one repository's
//! listing (`/api/models/{repo}/revision/{rev}`) and files (`/{repo}/resolve/{rev}/{file}`)
//! with the headers the real hub sends (ETag, X-Repo-Commit, X-Linked-Etag/-Size for LFS
//! files), honours `Range: bytes=N-`, records every request, and can plant faults: a
//! connection dropped part way through a file (first request only), corrupted bytes, a
//! required token. One thread per connection, `Connection: close`; the server stops when
//! dropped.

#![allow(dead_code)]

use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One served file. `lfs` files are listed with `lfs.sha256`, the others by git blob sha1.
#[derive(Clone)]
pub struct HubFile {
    pub path: String,
    pub bytes: Vec<u8>,
    pub lfs: bool,
}

impl HubFile {
    pub fn new(path: &str, bytes: Vec<u8>, lfs: bool) -> HubFile {
        HubFile {
            path: path.to_string(),
            bytes,
            lfs,
        }
    }

    pub fn sha256(&self) -> String {
        hex(&Sha256::digest(&self.bytes))
    }

    pub fn git_sha1(&self) -> String {
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()).as_bytes());
        h.update(&self.bytes);
        hex(&h.finalize())
    }

    /// The ETag the hub serves and the cache names the blob after.
    pub fn etag(&self) -> String {
        if self.lfs {
            self.sha256()
        } else {
            self.git_sha1()
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Faults to plant.
#[derive(Clone, Default)]
pub struct Faults {
    /// File path → bytes sent before the connection is cut, on its first download only.
    pub drop_after: HashMap<String, usize>,
    /// Files whose served bytes differ from the listed hash (one byte flipped).
    pub corrupt: HashSet<String>,
    /// Every request must carry `Authorization: Bearer <token>`, else 401.
    pub token: Option<String>,
    /// LFS files answer `302` to `http://localhost:{port}/cdn/{file}` — another host name
    /// for the same server, like the real hub's CDN — which needs no token.
    pub redirect_lfs: bool,
    /// File path → bytes sent before the server goes silent for `STALL`, with the
    /// connection open, on its first download only.
    pub stall_after: HashMap<String, usize>,
    /// The model-info listing gives only file names (no size, blobId or lfs), so the client
    /// must rely on the ETag headers of the downloads.
    pub bare_listing: bool,
}

/// How long a planted stall holds the connection (bounded, so the test always ends).
pub const STALL: std::time::Duration = std::time::Duration::from_secs(8);

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: HashMap<String, String>,
}

struct State {
    port: u16,
    repo: String,
    files: Vec<HubFile>,
    faults: Faults,
    dropped: HashSet<String>,
    seen: Vec<Seen>,
}

pub struct FakeHub {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

impl FakeHub {
    pub fn start(repo: &str, files: Vec<HubFile>, faults: Faults) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            port,
            repo: repo.to_string(),
            files,
            faults,
            dropped: HashSet::new(),
            seen: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &st);
                });
            }
        });
        FakeHub {
            endpoint: format!("http://127.0.0.1:{port}"),
            state,
            stop,
            port,
            thread: Some(thread),
        }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Requests for one repository file.
    pub fn downloads_of(&self, file: &str) -> Vec<Seen> {
        let suffix = format!("/{file}");
        self.requests()
            .into_iter()
            .filter(|s| {
                (s.target.contains("/resolve/") || s.target.starts_with("/cdn/"))
                    && s.target.ends_with(&suffix)
            })
            .collect()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn listing(st: &State) -> String {
    let siblings: Vec<serde_json::Value> = st
        .files
        .iter()
        .map(|f| {
            if st.faults.bare_listing {
                return serde_json::json!({"rfilename": f.path});
            }
            let mut v = serde_json::json!({"rfilename": f.path, "size": f.bytes.len(),
                                           "blobId": f.git_sha1()});
            if f.lfs {
                v["lfs"] = serde_json::json!({"sha256": f.sha256(), "size": f.bytes.len(),
                                              "pointerSize": 134});
            }
            v
        })
        .collect();
    serde_json::json!({"id": st.repo, "modelId": st.repo, "sha": COMMIT, "private": false,
                       "siblings": siblings})
    .to_string()
}

/// `GET /api/models/{repo}/tree/{rev}?recursive=true` (what Python's `snapshot_download`
/// lists with): one page, entries `{type, path, size, oid, lfs: {oid, size, pointerSize}}`.
fn tree(st: &State) -> String {
    let entries: Vec<serde_json::Value> = st
        .files
        .iter()
        .map(|f| {
            let mut v = serde_json::json!({"type": "file", "path": f.path,
                                           "size": f.bytes.len(), "oid": f.git_sha1()});
            if f.lfs {
                v["lfs"] = serde_json::json!({"oid": f.sha256(), "size": f.bytes.len(),
                                              "pointerSize": 134});
            }
            v
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
    let _ = conn.flush();
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut st = state.lock().unwrap();
    st.seen.push(Seen {
        method: method.clone(),
        target: target.clone(),
        headers: headers.clone(),
    });
    let path = target.split('?').next().unwrap_or("").to_string();
    let on_cdn = path.starts_with("/cdn/");
    if let (Some(t), false) = (&st.faults.token, on_cdn) {
        if headers.get("authorization") != Some(&format!("Bearer {t}")) {
            drop(st);
            respond(
                &mut conn,
                "401 Unauthorized",
                &[],
                b"{\"error\":\"unauthorized\"}",
            );
            return Ok(());
        }
    }
    let api_prefix = format!("/api/models/{}/revision/", st.repo);
    if path.starts_with(&api_prefix) {
        let body = listing(&st);
        drop(st);
        let h = vec![
            ("Content-Type".into(), "application/json".into()),
            ("Content-Length".into(), body.len().to_string()),
        ];
        respond(&mut conn, "200 OK", &h, body.as_bytes());
        return Ok(());
    }
    if path.starts_with(&format!("/api/models/{}/tree/", st.repo)) {
        let body = tree(&st);
        drop(st);
        let h = vec![
            ("Content-Type".into(), "application/json".into()),
            ("Content-Length".into(), body.len().to_string()),
        ];
        respond(&mut conn, "200 OK", &h, body.as_bytes());
        return Ok(());
    }
    let resolve_prefix = format!("/{}/resolve/", st.repo);
    let file_path = match (
        path.strip_prefix(&resolve_prefix),
        path.strip_prefix("/cdn/"),
    ) {
        (Some(rest), _) => rest.split_once('/').map(|(_, f)| f).unwrap_or(""),
        (None, Some(f)) => f,
        (None, None) => "",
    }
    .replace("%20", " ");
    let Some(file) = st.files.iter().find(|f| f.path == file_path).cloned() else {
        drop(st);
        respond(
            &mut conn,
            "404 Not Found",
            &[("Content-Length".into(), "0".into())],
            b"",
        );
        return Ok(());
    };
    if file.lfs && st.faults.redirect_lfs && !on_cdn {
        let location = format!("http://localhost:{}/cdn/{}", st.port, file.path);
        drop(st);
        let h = vec![
            ("Location".to_string(), location),
            ("X-Repo-Commit".to_string(), COMMIT.to_string()),
            ("X-Linked-Etag".to_string(), format!("\"{}\"", file.etag())),
            ("X-Linked-Size".to_string(), file.bytes.len().to_string()),
            ("Content-Length".to_string(), "0".to_string()),
        ];
        respond(&mut conn, "302 Found", &h, b"");
        return Ok(());
    }
    let mut bytes = file.bytes.clone();
    if st.faults.corrupt.contains(&file.path) && !bytes.is_empty() {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
    }
    let planted_cut = st.faults.drop_after.get(&file.path).copied();
    let planted_stall = st.faults.stall_after.get(&file.path).copied();
    let first = method == "GET" && st.dropped.insert(file.path.clone());
    let cut = planted_cut.filter(|_| first);
    let stall = planted_stall.filter(|_| first);
    drop(st);
    let total = bytes.len();
    let mut h = vec![
        ("X-Repo-Commit".to_string(), COMMIT.to_string()),
        ("ETag".to_string(), format!("\"{}\"", file.etag())),
        ("Accept-Ranges".to_string(), "bytes".to_string()),
    ];
    if file.lfs {
        h.push(("X-Linked-Etag".into(), format!("\"{}\"", file.etag())));
        h.push(("X-Linked-Size".into(), total.to_string()));
    }
    let start = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let (status, body) = match start {
        Some(s) if s < total => {
            h.push((
                "Content-Range".into(),
                format!("bytes {s}-{}/{total}", total - 1),
            ));
            ("206 Partial Content", &bytes[s..])
        }
        Some(_) => {
            h.push(("Content-Range".into(), format!("bytes */{total}")));
            h.push(("Content-Length".into(), "0".into()));
            respond(&mut conn, "416 Range Not Satisfiable", &h, b"");
            return Ok(());
        }
        None => ("200 OK", &bytes[..]),
    };
    h.push(("Content-Length".into(), body.len().to_string()));
    if method == "HEAD" {
        respond(&mut conn, status, &h, b"");
    } else if let Some(n) = stall {
        respond(&mut conn, status, &h, &body[..n.min(body.len())]);
        std::thread::sleep(STALL);
        let _ = conn.shutdown(std::net::Shutdown::Both);
    } else if let Some(n) = cut {
        // Headers promise the whole body; the connection ends after `n` bytes.
        respond(&mut conn, status, &h, &body[..n.min(body.len())]);
        let _ = conn.shutdown(std::net::Shutdown::Both);
    } else {
        respond(&mut conn, status, &h, body);
    }
    let _ = reader.read(&mut [0u8; 0]);
    Ok(())
}
