//! Resumable, verified downloads into the cache, a few files at a time.
//!
//! Each file streams into `blobs/<etag>.incomplete`; a later attempt (a retry in the same run
//! or the next `trit pull`) continues it with `Range: bytes=<len>-`. Only when the size and the
//! hash the hub listed both match is the file renamed to `blobs/<etag>` and linked into the
//! snapshot; a mismatch deletes the bad bytes so the next run starts clean.

use super::api::{status_message, Hub, RemoteFile};
use super::cache::RepoCache;
use super::hashing::{git_blob_sha1_file, is_hex_digest, sha256_file};
use super::RepoId;
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fs::OpenOptions;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// How a file got into the cache in this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The blob was already cached (by trit or by Python).
    Cached,
    Downloaded,
    /// Continued from an `.incomplete` file of this many bytes.
    Resumed(u64),
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Cached => "cached",
            Outcome::Downloaded => "downloaded",
            Outcome::Resumed(_) => "resumed",
        }
    }
}

/// One file that is now in the snapshot.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub path: String,
    pub size: u64,
    /// The blob name (the hub's ETag: sha256 for LFS files, git sha1 otherwise).
    pub etag: String,
    /// What was checked: `"sha256"`, `"git-sha1"`, `"size"` or `"none"`.
    pub verified: &'static str,
    pub outcome: Outcome,
}

/// Where a download goes and how it reports.
pub struct Target<'a> {
    pub hub: &'a Hub,
    pub repo: &'a RepoId,
    pub commit: &'a str,
    pub cache: &'a RepoCache,
    /// Extra attempts after an interrupted transfer, each resuming where the last stopped.
    pub retries: usize,
}

/// A transfer that stopped part way: worth retrying, the partial file is kept.
#[derive(Debug)]
struct Interrupted(String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// Downloads `files` with `jobs` worker threads; one result per file, in input order.
pub fn fetch_all(
    target: &Target,
    files: &[RemoteFile],
    jobs: usize,
    show_progress: bool,
) -> Vec<Result<Fetched>> {
    let multi = MultiProgress::with_draw_target(if show_progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Fetched>>>> =
        Mutex::new((0..files.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, files.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(file) = files.get(i) else { break };
                let bar = multi.add(new_bar(file));
                let r = fetch_with_retries(target, file, &bar);
                bar.finish_and_clear();
                multi.remove(&bar);
                results.lock().expect("no panics while holding")[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .expect("workers joined")
        .into_iter()
        .map(|r| r.expect("every file visited"))
        .collect()
}

fn new_bar(file: &RemoteFile) -> ProgressBar {
    let bar = ProgressBar::new(file.size.unwrap_or(0));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(file.path.clone());
    bar
}

fn fetch_with_retries(target: &Target, file: &RemoteFile, bar: &ProgressBar) -> Result<Fetched> {
    let mut attempt = 0;
    loop {
        match fetch_one(target, file, bar) {
            Err(e) if e.downcast_ref::<Interrupted>().is_some() && attempt < target.retries => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(200 * attempt as u64));
            }
            other => return other,
        }
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn fetch_one(target: &Target, file: &RemoteFile, bar: &ProgressBar) -> Result<Fetched> {
    let cache = target.cache;
    let blobs = cache.dir.join("blobs");
    std::fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    // Without a listed hash the blob is named after the sha256 of what arrives.
    let listed_etag = file.etag().map(str::to_string);
    // Unknown ETag: the partial file and its lock are named after the path instead.
    let key = match &listed_etag {
        Some(e) => e.clone(),
        None => format!("trit-unlisted-{}", file.path.replace(['/', '\\'], "--")),
    };
    let partial = cache.incomplete(&key);
    let _lock = cache.lock_blob(&key)?;
    if let Some(e) = &listed_etag {
        let blob = cache.blob(e);
        if blob.exists() && file.size.is_none_or(|s| file_len(&blob) == s) {
            cache.link(target.commit, &file.path, e)?;
            return Ok(Fetched {
                path: file.path.clone(),
                size: file_len(&blob),
                etag: e.clone(),
                verified: "none",
                outcome: Outcome::Cached,
            });
        }
    }
    let mut have = file_len(&partial);
    if file.size.is_some_and(|s| have > s) {
        have = 0;
    }
    let mut outcome = if have > 0 {
        Outcome::Resumed(have)
    } else {
        Outcome::Downloaded
    };
    let mut served_etag = None;
    if file.size != Some(have) || have == 0 {
        let served = transfer(target, file, &partial, have, bar)?;
        if !served.resumed {
            outcome = Outcome::Downloaded;
        }
        served_etag = served.etag;
    }
    // Without hashes in the listing, the ETag the hub served is the hash to check and the
    // blob's name (as in Python); only without either is the blob named by its sha256.
    let mut expected = file.clone();
    if listed_etag.is_none() {
        match &served_etag {
            Some(e) if is_hex_digest(e, 64) => expected.sha256 = Some(e.clone()),
            Some(e) if is_hex_digest(e, 40) => expected.git_sha1 = Some(e.clone()),
            _ => {}
        }
    }
    let verified = verify(&expected, &partial)?;
    let etag = match listed_etag.or_else(|| expected.etag().map(str::to_string)) {
        Some(e) => e,
        None => sha256_file(&partial).context("hashing the download")?,
    };
    let blob = cache.blob(&etag);
    std::fs::rename(&partial, &blob)
        .with_context(|| format!("moving {} to {}", partial.display(), blob.display()))?;
    cache.link(target.commit, &file.path, &etag)?;
    Ok(Fetched {
        path: file.path.clone(),
        size: file_len(&blob),
        etag,
        verified,
        outcome,
    })
}

/// What the server said about a transfer.
struct Served {
    /// It continued at the requested byte (false: it sent the whole file again).
    resumed: bool,
    /// `X-Linked-Etag`, else `ETag`, without quotes or the weak marker.
    etag: Option<String>,
}

fn normalize_etag(v: &str) -> String {
    v.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase()
}

/// Streams the file into `partial` from byte `from`.
fn transfer(
    target: &Target,
    file: &RemoteFile,
    partial: &Path,
    from: u64,
    bar: &ProgressBar,
) -> Result<Served> {
    let url = target
        .hub
        .resolve_url(target.repo, target.commit, &file.path);
    let mut req = target.hub.get(&url);
    if from > 0 {
        req = req.header("Range", format!("bytes={from}-"));
    }
    let resp = req
        .call()
        .map_err(|e| anyhow!(Interrupted(format!("{}: request failed: {e}", file.path))))?;
    let status = resp.status().as_u16();
    let resumed = status == 206;
    let etag = ["x-linked-etag", "etag"].iter().find_map(|h| {
        let v = resp.headers().get(*h)?.to_str().ok()?;
        Some(normalize_etag(v))
    });
    let mut offset = match status {
        206 => {
            let range = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let first = range
                .strip_prefix("bytes ")
                .and_then(|r| r.split('-').next())
                .and_then(|n| n.parse::<u64>().ok());
            if first != Some(from) {
                bail!(
                    "{}: asked to resume at byte {from}, the server answered Content-Range \
                     '{range}'",
                    file.path
                );
            }
            from
        }
        // The server ignored the range: start over.
        200 => 0,
        416 => {
            // Our partial file is no prefix of the remote one: drop it, retry from zero.
            let _ = std::fs::remove_file(partial);
            return Err(anyhow!(Interrupted(format!(
                "{}: the server refused to resume at byte {from}; the partial download was \
                 discarded",
                file.path
            ))));
        }
        _ => bail!(
            "{}",
            status_message(status, target.repo, target.commit, &url)
        ),
    };
    if file.size.is_none() {
        if let Some(total) = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        {
            bar.set_length(offset + total);
        }
    }
    let out = OpenOptions::new()
        .create(true)
        .write(true)
        .append(offset > 0)
        .truncate(offset == 0)
        .open(partial)
        .with_context(|| format!("opening {}", partial.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, out);
    bar.set_position(offset);
    let mut body = resp.into_body();
    let mut reader = body.as_reader();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.flush().ok();
                return Err(anyhow!(Interrupted(format!(
                    "{}: transfer interrupted after {offset} bytes ({e}); the partial file is \
                     kept, run the same command again to resume",
                    file.path
                ))));
            }
        };
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", partial.display()))?;
        offset += n as u64;
        bar.set_position(offset);
    }
    out.flush()
        .with_context(|| format!("writing {}", partial.display()))?;
    if let Some(size) = file.size {
        if offset < size {
            return Err(anyhow!(Interrupted(format!(
                "{}: connection closed after {offset} of {size} bytes; the partial file is \
                 kept, run the same command again to resume",
                file.path
            ))));
        }
    }
    Ok(Served { resumed, etag })
}

/// Checks the completed download against the listing; deletes it on a mismatch.
fn verify(file: &RemoteFile, partial: &Path) -> Result<&'static str> {
    let fail = |what: String| -> Result<&'static str> {
        let _ = std::fs::remove_file(partial);
        bail!(
            "{}: {what}; the bad download was deleted and no snapshot link was made \
             (run the command again; if it persists the hub's copy or a proxy is corrupting it)",
            file.path
        )
    };
    let got = file_len(partial);
    if let Some(size) = file.size {
        if got != size {
            return fail(format!(
                "size mismatch: the hub lists {size} bytes, got {got}"
            ));
        }
    }
    if let Some(want) = &file.sha256 {
        let have = sha256_file(partial).context("hashing the download")?;
        if &have != want {
            return fail(format!(
                "sha256 mismatch: the hub lists {want}, the download hashes to {have}"
            ));
        }
        return Ok("sha256");
    }
    if let Some(want) = &file.git_sha1 {
        let have = git_blob_sha1_file(partial).context("hashing the download")?;
        if &have != want {
            return fail(format!(
                "git blob sha1 mismatch: the hub lists {want}, the download hashes to {have}"
            ));
        }
        return Ok("git-sha1");
    }
    Ok(if file.size.is_some() { "size" } else { "none" })
}
