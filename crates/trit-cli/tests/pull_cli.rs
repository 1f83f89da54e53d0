//! `trit pull` against a fake hub on loopback: the standard HF cache layout (checked by
//! Python's `huggingface_hub` when the reference venv has it), resuming an interrupted
//! transfer with a Range request, refusing corrupted bytes, the token, offline mode, and
//! `--model owner/name` resolving through the cache.

mod common;

use common::fake_hub::{FakeHub, Faults, HubFile, COMMIT};
use common::trit;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const REPO: &str = "acme/tiny-model";

/// Deterministic pseudo-random bytes (a file too big to arrive in one read).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn repo_files() -> Vec<HubFile> {
    vec![
        HubFile::new("config.json", br#"{"model_type":"qwen3"}"#.to_vec(), false),
        HubFile::new("model.safetensors", noise(3 << 20, 1), true),
        HubFile::new("tokenizer.json", br#"{"version":"1.0"}"#.to_vec(), false),
        HubFile::new("sub/extra.gguf", noise(70_000, 2), true),
    ]
}

fn pull(hub: &FakeHub, cache: &Path, extra: &[&str]) -> Output {
    pull_env(hub, cache, &[], extra)
}

/// `trit pull REPO extra…` against the fake hub, with extra environment variables.
fn pull_env(hub: &FakeHub, cache: &Path, env: &[(&str, &str)], extra: &[&str]) -> Output {
    trit()
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", cache)
        .envs(env.iter().copied())
        .arg("pull")
        .arg(REPO)
        .args(extra)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn repo_dir(cache: &Path) -> PathBuf {
    cache.join("models--acme--tiny-model")
}

/// Every file of the repository is a relative link from the snapshot to its blob, named by
/// the hub's ETag, with the served bytes.
fn assert_layout(cache: &Path, files: &[HubFile]) {
    let dir = repo_dir(cache);
    assert_eq!(
        std::fs::read_to_string(dir.join("refs/main")).unwrap(),
        COMMIT
    );
    for f in files {
        let blob = dir.join("blobs").join(f.etag());
        assert_eq!(std::fs::read(&blob).unwrap(), f.bytes, "{}", f.path);
        let link = dir.join("snapshots").join(COMMIT).join(&f.path);
        let target = std::fs::read_link(&link).unwrap();
        let ups = f.path.matches('/').count() + 2;
        let want: PathBuf = std::iter::repeat_n("..", ups)
            .collect::<PathBuf>()
            .join("blobs")
            .join(f.etag());
        assert_eq!(target, want, "{}", f.path);
        assert!(target.is_relative());
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn pull_fills_the_standard_cache_layout_and_sends_the_token() {
    let files = repo_files();
    let faults = Faults {
        token: Some("hf_secret".into()),
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let cache = tempfile::tempdir().unwrap();

    // Without the token the hub answers 401 and the error says what to do.
    let out = pull(&hub, cache.path(), &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("HF_TOKEN"), "{}", text(&out));

    let out = pull_env(
        &hub,
        cache.path(),
        &[("HF_TOKEN", "hf_secret")],
        &["--json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_layout(cache.path(), &files);
    // The per-blob locks sit where Python keeps them, so both tools exclude each other.
    for f in &files {
        let lock = cache
            .path()
            .join(".locks/models--acme--tiny-model")
            .join(format!("{}.lock", f.etag()));
        assert!(lock.exists(), "{}", lock.display());
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["commit"], COMMIT);
    assert_eq!(report["files"].as_array().unwrap().len(), files.len());
    for f in report["files"].as_array().unwrap() {
        let want = if f["path"].as_str().unwrap().ends_with(".json") {
            "git-sha1"
        } else {
            "sha256"
        };
        assert_eq!(f["verified"], want, "{f}");
        assert_eq!(f["status"], "downloaded");
    }
    // The listing asks for blob metadata, every request after the 401 carried the token.
    let seen = hub.requests();
    assert!(seen
        .iter()
        .any(|s| s.target == format!("/api/models/{REPO}/revision/main?blobs=true")));
    let authorized = seen
        .iter()
        .filter(|s| s.headers.get("authorization").map(String::as_str) == Some("Bearer hf_secret"))
        .count();
    assert_eq!(authorized, 1 + files.len(), "{seen:?}");
    // Files come from the listed commit, not from a moving branch.
    assert!(hub
        .downloads_of("config.json")
        .iter()
        .all(|s| s.target.contains(&format!("/resolve/{COMMIT}/"))));

    // A second pull finds every blob cached and downloads nothing.
    let before = hub.requests().len();
    let out = pull_env(&hub, cache.path(), &[("HF_TOKEN", "hf_secret")], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(hub.requests().len(), before + 1, "only the listing");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cached"));
}

#[test]
fn interrupted_transfer_resumes_with_a_range_request() {
    let files = repo_files();
    let cut = 1_000_000;
    let faults = Faults {
        drop_after: [("model.safetensors".to_string(), cut)].into(),
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults.clone());
    let cache = tempfile::tempdir().unwrap();
    let weights = &files[1];

    // No retries: the run fails, naming the file, and keeps the partial download.
    let out = pull(
        &hub,
        cache.path(),
        &["--retries", "0", "--include", "*.safetensors"],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("model.safetensors") && text(&out).contains("resume"),
        "{}",
        text(&out)
    );
    let partial = repo_dir(cache.path())
        .join("blobs")
        .join(format!("{}.incomplete", weights.etag()));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), cut as u64);
    assert!(!repo_dir(cache.path())
        .join("snapshots")
        .join(COMMIT)
        .join("model.safetensors")
        .exists());

    // The next run continues from the first missing byte and finishes.
    let out = pull(&hub, cache.path(), &["--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let gets = hub.downloads_of("model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].headers.get("range"), None);
    assert_eq!(
        gets[1].headers.get("range").map(String::as_str),
        Some(format!("bytes={cut}-").as_str())
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "model.safetensors")
        .unwrap();
    assert_eq!(entry["status"], "resumed");
    assert_eq!(entry["resumed_from"], cut);
    assert_layout(cache.path(), &files);

    // With the default retries one run recovers by itself, again through a Range request.
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let cache = tempfile::tempdir().unwrap();
    let out = pull(&hub, cache.path(), &["--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    let gets = hub.downloads_of("model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert!(gets[1].headers.contains_key("range"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        repo_dir(cache.path())
            .join("snapshots")
            .join(COMMIT)
            .to_string_lossy()
    );
    assert_layout(cache.path(), &files);
}

/// The real hub answers LFS downloads with a redirect to a CDN host: the token must not
/// follow it, and a resumed transfer must keep its Range through it.
#[test]
fn lfs_redirect_to_another_host_drops_the_token_and_keeps_the_range() {
    let files = repo_files();
    let cut = 500_000;
    let faults = Faults {
        token: Some("hf_secret".into()),
        redirect_lfs: true,
        drop_after: [("model.safetensors".to_string(), cut)].into(),
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let cache = tempfile::tempdir().unwrap();
    let out = pull_env(&hub, cache.path(), &[("HF_TOKEN", "hf_secret")], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_layout(cache.path(), &files);
    let seen = hub.downloads_of("model.safetensors");
    let (hub_side, cdn): (Vec<_>, Vec<_>) =
        seen.iter().partition(|s| s.target.contains("/resolve/"));
    assert_eq!((hub_side.len(), cdn.len()), (2, 2), "{seen:?}");
    assert!(hub_side
        .iter()
        .all(|s| s.headers.contains_key("authorization")));
    assert!(
        cdn.iter().all(|s| !s.headers.contains_key("authorization")),
        "{cdn:?}"
    );
    assert_eq!(
        cdn[0].headers.get("host").map(String::as_str),
        Some(&*hub.endpoint.replace("http://127.0.0.1", "localhost"))
    );
    assert_eq!(
        cdn[1].headers.get("range").map(String::as_str),
        Some(format!("bytes={cut}-").as_str())
    );
}

/// A server that stops sending without closing: the read times out
/// (`HF_HUB_DOWNLOAD_TIMEOUT`) and the retry resumes, instead of hanging.
#[test]
fn stalled_transfer_times_out_and_resumes() {
    let files = repo_files();
    let at = 200_000;
    let faults = Faults {
        stall_after: [("model.safetensors".to_string(), at)].into(),
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let cache = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = pull_env(
        &hub,
        cache.path(),
        &[("HF_HUB_DOWNLOAD_TIMEOUT", "0.5")],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    // Finished before the server's stall ended: the timeout, not the server, ended the read.
    assert!(started.elapsed() < common::fake_hub::STALL);
    let gets = hub.downloads_of("model.safetensors");
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(
        gets[1].headers.get("range").map(String::as_str),
        Some(format!("bytes={at}-").as_str())
    );
    assert_layout(cache.path(), &files);
}

/// A listing without sizes or hashes: the download's ETag (X-Linked-Etag for LFS files)
/// names the blob, as in Python, and is still checked against the bytes.
#[test]
fn without_hashes_in_the_listing_the_served_etag_names_and_checks_the_blob() {
    let files = repo_files();
    let faults = Faults {
        bare_listing: true,
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults.clone());
    let cache = tempfile::tempdir().unwrap();
    let out = pull(&hub, cache.path(), &["--json"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_layout(cache.path(), &files);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verified: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["verified"].as_str().unwrap())
        .collect();
    assert_eq!(verified, ["git-sha1", "sha256", "git-sha1", "sha256"]);

    let hub = FakeHub::start(
        REPO,
        files.clone(),
        Faults {
            corrupt: ["model.safetensors".to_string()].into(),
            ..faults
        },
    );
    let cache = tempfile::tempdir().unwrap();
    let out = pull(&hub, cache.path(), &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("sha256 mismatch"), "{}", text(&out));
}

#[test]
fn corrupted_download_is_deleted_and_never_linked() {
    let files = repo_files();
    let faults = Faults {
        corrupt: ["model.safetensors".to_string(), "config.json".to_string()].into(),
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let cache = tempfile::tempdir().unwrap();
    let out = pull(&hub, cache.path(), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("sha256 mismatch"), "{t}");
    assert!(t.contains("git blob sha1 mismatch"), "{t}");
    assert!(t.contains(&files[1].sha256()), "{t}");
    assert!(t.contains("2 of 4 files failed"), "{t}");
    let dir = repo_dir(cache.path());
    for f in [&files[0], &files[1]] {
        assert!(!dir.join("blobs").join(f.etag()).exists());
        assert!(!dir
            .join("blobs")
            .join(format!("{}.incomplete", f.etag()))
            .exists());
        assert!(
            std::fs::symlink_metadata(dir.join("snapshots").join(COMMIT).join(&f.path)).is_err()
        );
    }
    // The intact files are in place.
    assert_layout(cache.path(), &files[2..]);
}

#[test]
fn offline_mode_reads_the_cache_and_never_the_network() {
    let files = repo_files();
    let cache = tempfile::tempdir().unwrap();
    let endpoint;
    {
        let hub = FakeHub::start(REPO, files.clone(), Faults::default());
        endpoint = hub.endpoint.clone();
        let out = pull(&hub, cache.path(), &["--include", "*.json"]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(hub.downloads_of("model.safetensors").len(), 0);
    }
    // The hub is gone: both spellings of offline succeed from the cache alone.
    for (flag, env) in [(Some("--offline"), None), (None, Some("1"))] {
        let mut c = trit();
        c.env("HF_ENDPOINT", &endpoint)
            .env("HF_HUB_CACHE", cache.path())
            .args(["pull", REPO, "--json"]);
        if let Some(f) = flag {
            c.arg(f);
        }
        if let Some(v) = env {
            c.env("HF_HUB_OFFLINE", v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["offline"], true);
        let names: Vec<&str> = report["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["config.json", "tokenizer.json"]);
    }
    // Asking offline for a file that was not pulled, or for another repository, fails clearly.
    let out = trit()
        .env("HF_HUB_CACHE", cache.path())
        .args(["pull", &format!("{REPO}:model.safetensors"), "--offline"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("no file matching"), "{}", text(&out));
    let out = trit()
        .env("HF_HUB_CACHE", cache.path())
        .args(["pull", "acme/other", "--offline"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("not in the cache"), "{}", text(&out));
}

/// A real (tiny, random) model pulled from the fake hub loads through `--model owner/name`.
#[test]
fn model_argument_resolves_through_the_cache() {
    use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
    let work = tempfile::tempdir().unwrap();
    let preset = Preset::by_name("tiny").unwrap();
    generate(
        &preset,
        7,
        work.path(),
        &[OutFormat::Mlx],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let mlx = work.path().join(OutFormat::Mlx.file_name());
    let mut files = Vec::new();
    for e in std::fs::read_dir(&mlx).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let lfs = name.ends_with(".safetensors");
        files.push(HubFile::new(&name, std::fs::read(&p).unwrap(), lfs));
    }
    let hub = FakeHub::start(REPO, files, Faults::default());
    let cache = tempfile::tempdir().unwrap();
    let info = |model: &str| {
        trit()
            .env("HF_HUB_CACHE", cache.path())
            .args(["info", "--model", model])
            .output()
            .unwrap()
    };
    // Not cached yet: no network, and the error names the command that fetches it.
    let out = info(REPO);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("trit pull {REPO}")),
        "{}",
        text(&out)
    );
    assert!(hub.requests().is_empty());

    let out = pull(&hub, cache.path(), &["--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = info(REPO);
    assert!(out.status.success(), "{}", text(&out));
    let snapshot = repo_dir(cache.path()).join("snapshots").join(COMMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&*snapshot.to_string_lossy()), "{stdout}");
    assert!(stdout.contains("MLX"), "{stdout}");
    // An existing relative path of the same shape still wins over the cache.
    std::fs::create_dir_all(work.path().join(REPO)).unwrap();
    let out = trit()
        .current_dir(work.path())
        .env("HF_HUB_CACHE", cache.path())
        .args(["info", "--model", REPO])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!text(&out).contains("snapshots"), "{}", text(&out));
}

/// Python's `huggingface_hub` reads trit's cache offline, and a cache Python filled from the
/// same fake hub is byte-for-byte the layout trit writes (same blobs, same links).
#[test]
fn python_huggingface_hub_shares_the_cache() {
    let Some(py) = common::venv_python_with("huggingface_hub") else {
        return;
    };
    let files = repo_files();
    // LFS files redirect to a "CDN" host name, as on the real hub.
    let faults = Faults {
        redirect_lfs: true,
        ..Faults::default()
    };
    let hub = FakeHub::start(REPO, files.clone(), faults);
    let ours = tempfile::tempdir().unwrap();
    let out = pull(&hub, ours.path(), &[]);
    assert!(out.status.success(), "{}", text(&out));

    let script = r#"
import json, os, sys
from huggingface_hub import snapshot_download, hf_hub_download, scan_cache_dir
repo = sys.argv[1]
if sys.argv[2] == "read":
    snap = snapshot_download(repo, local_files_only=True)
    cfg = hf_hub_download(repo, "sub/extra.gguf", local_files_only=True)
    info = scan_cache_dir()
    r = [r for r in info.repos if r.repo_id == repo][0]
    print(json.dumps({"snapshot": snap, "file": cfg, "warnings": [str(w) for w in info.warnings],
                      "nb_files": r.nb_files, "size": r.size_on_disk,
                      "refs": sorted(r.refs)}))
else:
    print(json.dumps({"snapshot": snapshot_download(repo)}))
"#;
    let python = |cache: &Path, mode: &str, offline: bool| -> serde_json::Value {
        let mut c = Command::new(&py);
        c.env("HF_HUB_CACHE", cache)
            .env("HF_ENDPOINT", &hub.endpoint)
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_XET", "1")
            .env_remove("HF_TOKEN")
            .args(["-c", script, REPO, mode]);
        if offline {
            c.env("HF_HUB_OFFLINE", "1");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    };
    let snapshot = repo_dir(ours.path()).join("snapshots").join(COMMIT);
    let read = python(ours.path(), "read", true);
    assert_eq!(read["snapshot"], snapshot.to_string_lossy().as_ref());
    assert_eq!(
        read["file"],
        snapshot.join("sub/extra.gguf").to_string_lossy().as_ref()
    );
    assert_eq!(read["warnings"], serde_json::json!([]));
    assert_eq!(read["nb_files"], files.len());
    let total: usize = files.iter().map(|f| f.bytes.len()).sum();
    assert_eq!(read["size"], total);
    assert_eq!(read["refs"], serde_json::json!(["main"]));

    // Python downloads the same repository from the fake hub into its own cache.
    let theirs = tempfile::tempdir().unwrap();
    python(theirs.path(), "download", false);
    let tree = |root: &Path| -> Vec<(String, Option<PathBuf>)> {
        let mut v = Vec::new();
        let mut stack = vec![repo_dir(root)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p
                    .strip_prefix(repo_dir(root))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                if meta.is_dir() {
                    stack.push(p);
                } else if !rel.starts_with("trees/") {
                    // huggingface_hub 2.x also caches its tree listing in `trees/<commit>.json`,
                    // an optional speed-up of its own that the cache does not need.
                    v.push((rel, std::fs::read_link(&p).ok()));
                }
            }
        }
        v.sort();
        v
    };
    assert_eq!(tree(ours.path()), tree(theirs.path()));
    // And trit reads Python's cache offline.
    let out = trit()
        .env("HF_HUB_CACHE", theirs.path())
        .args(["pull", REPO, "--offline", "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// While Python's huggingface_hub holds a blob's download lock, trit waits for it: the blob
/// neither appears nor starts downloading until Python lets go.
#[test]
fn trit_waits_for_a_blob_lock_held_by_python() {
    let Some(py) = common::venv_python_with("filelock") else {
        return;
    };
    let files = repo_files();
    let weights = files[1].clone();
    let hub = FakeHub::start(REPO, files.clone(), Faults::default());
    let cache = tempfile::tempdir().unwrap();
    let lock = cache
        .path()
        .join(".locks/models--acme--tiny-model")
        .join(format!("{}.lock", weights.etag()));
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    // The lock class huggingface_hub uses (filelock's FileLock, flock on Unix).
    let script = r#"
import os, sys, time
from filelock import FileLock
lock, blob = sys.argv[1], sys.argv[2]
with FileLock(lock):
    print("locked", flush=True)
    sys.stdin.readline()          # trit has been started
    time.sleep(1.0)
    print("present" if os.path.exists(blob) or os.path.exists(blob + ".incomplete") else "absent", flush=True)
"#;
    let blob = repo_dir(cache.path()).join("blobs").join(weights.etag());
    let mut holder = Command::new(&py)
        .args(["-c", script])
        .arg(&lock)
        .arg(&blob)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let pull = trit()
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", cache.path())
        .args(["pull", REPO])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    holder.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "absent");
    assert!(holder.wait().unwrap().success());
    let done = pull.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", text(&done));
    assert_layout(cache.path(), &files);
}

/// HTTPS end to end: `tools/fake_hub.py` serves TLS with a certificate made here by the
/// `openssl` tool; trit (rustls) refuses it against the built-in Mozilla roots and accepts it
/// when `SSL_CERT_FILE` names it.
#[test]
fn https_verifies_the_certificate_and_honours_ssl_cert_file() {
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if !have("openssl") || !have("python3") {
        eprintln!("SKIPPED: needs the openssl and python3 tools");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, cert, key) = (d.join("ca.pem"), d.join("cert.pem"), d.join("key.pem"));
    // A throwaway CA and a leaf certificate for 127.0.0.1 signed by it.
    std::fs::write(
        d.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &["-days", "1", "-subj", "/CN=trit test CA"],
        ]
        .concat(),
        [&["req"][..], &ec, &["-subj", "/CN=127.0.0.1"]].concat(),
        vec![
            "x509",
            "-req",
            "-days",
            "1",
            "-extfile",
            "leaf.ext",
            "-CAcreateserial",
        ],
    ];
    let outputs: [&[&str]; 3] = [
        &["-keyout", "ca.key", "-out", "ca.pem"],
        &["-keyout", "key.pem", "-out", "leaf.csr"],
        &[
            "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-out", "cert.pem",
        ],
    ];
    for (args, out) in steps.iter().zip(outputs) {
        let made = Command::new("openssl")
            .current_dir(d)
            .args(args)
            .args(out)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", text(&made));
    }
    let repo_dir_src = dir.path().join("repo");
    std::fs::create_dir_all(repo_dir_src.join("sub")).unwrap();
    let files = repo_files();
    for f in &files {
        std::fs::write(repo_dir_src.join(&f.path), &f.bytes).unwrap();
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fake_hub.py");
    let mut server = Command::new("python3")
        .arg(script)
        .arg(&repo_dir_src)
        .arg(REPO)
        .args(["--port", "0", "--tls"])
        .arg(&cert)
        .arg(&key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let endpoint = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{line}");
    let cache = tempfile::tempdir().unwrap();
    let pull_https = |ca: Option<&Path>| {
        let mut c = trit();
        c.env("HF_ENDPOINT", &endpoint)
            .env("HF_HUB_CACHE", cache.path())
            .args(["pull", REPO]);
        if let Some(ca) = ca {
            c.env("SSL_CERT_FILE", ca);
        }
        c.output().unwrap()
    };
    let refused = pull_https(None);
    let accepted = pull_https(Some(&ca));
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused).to_lowercase().contains("certificate")
            || text(&refused).contains("UnknownIssuer"),
        "{}",
        text(&refused)
    );
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert_layout(cache.path(), &files);
}
