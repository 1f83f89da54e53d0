//! `trit pull REPO[:FILE]`: download a model from the Hugging Face Hub into the standard HF
//! cache (shared with Python tools), or, offline, report what the cache already holds.

use crate::hub::api::{Hub, RemoteFile};
use crate::hub::cache::RepoCache;
use crate::hub::download::{fetch_all, Fetched, Target};
use crate::hub::{self, glob_match, RepoSpec};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Repository `owner/name`, or `owner/name:FILE` for one file.
    pub repo: String,
    /// Branch, tag or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Only files matching this pattern (`*`, `?`; repeatable), e.g. `--include '*.gguf'`.
    #[arg(long)]
    pub include: Vec<String>,
    /// Cache root (default: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Use only the cache, no network (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Files downloaded at the same time.
    #[arg(short = 'j', long, default_value_t = 4)]
    pub jobs: usize,
    /// Extra attempts per file after an interrupted transfer (each resumes).
    #[arg(long, default_value_t = 3)]
    pub retries: usize,
    /// Print only the snapshot folder on success (no progress, no file list).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print one JSON object describing the result.
    #[arg(long)]
    pub json: bool,
}

/// What the selection keeps: the `:FILE`, else every file matching `--include` (all if none).
fn selected(spec: &RepoSpec, include: &[String], path: &str) -> bool {
    match &spec.file {
        Some(f) => f == path,
        None => include.is_empty() || include.iter().any(|g| glob_match(g, path)),
    }
}

pub fn run(a: PullArgs) -> Result<()> {
    let spec = RepoSpec::parse_or_explain(&a.repo)?;
    let root = hub::cache_root(a.cache_dir.as_ref());
    let cache = RepoCache::new(&root, &spec.repo);
    if a.offline || hub::offline_from_env() {
        return run_offline(&a, &spec, &cache);
    }
    let hub = Hub::new(hub::endpoint(), hub::token())?;
    let listing = hub.list(&spec.repo, &a.revision)?;
    cache.write_ref(&a.revision, &listing.commit)?;
    let files: Vec<RemoteFile> = listing
        .files
        .iter()
        .filter(|f| selected(&spec, &a.include, &f.path))
        .cloned()
        .collect();
    if files.is_empty() {
        let names: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
        bail!(
            "{}@{}: no file matches {} (the repository has: {})",
            spec.repo,
            a.revision,
            spec.file.as_deref().map_or_else(
                || format!("--include {}", a.include.join(" ")),
                |f| format!("'{f}'")
            ),
            names.join(", ")
        );
    }
    let target = Target {
        hub: &hub,
        repo: &spec.repo,
        commit: &listing.commit,
        cache: &cache,
        retries: a.retries,
    };
    let show_progress = !a.quiet && !a.json && std::io::stderr().is_terminal();
    let results = fetch_all(&target, &files, a.jobs, show_progress);
    let snapshot = cache.snapshot(&listing.commit);
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (f, r) in files.iter().zip(results) {
        match r {
            Ok(x) => ok.push(x),
            Err(e) => failed.push((f.path.clone(), format!("{e:#}"))),
        }
    }
    report(&a, &spec, &listing.commit, &snapshot, &ok, &failed);
    if !failed.is_empty() {
        let lines: Vec<String> = failed.iter().map(|(_, e)| format!("  {e}")).collect();
        bail!(
            "{} of {} files failed:\n{}",
            failed.len(),
            files.len(),
            lines.join("\n")
        );
    }
    Ok(())
}

fn report(
    a: &PullArgs,
    spec: &RepoSpec,
    commit: &str,
    snapshot: &std::path::Path,
    ok: &[Fetched],
    failed: &[(String, String)],
) {
    if a.json {
        let files: Vec<_> = ok
            .iter()
            .map(|f| {
                json!({"path": f.path, "size": f.size, "blob": f.etag, "verified": f.verified,
                       "status": f.outcome.name(), "resumed_from": match f.outcome {
                           crate::hub::download::Outcome::Resumed(n) => Some(n), _ => None }})
            })
            .collect();
        let failed: Vec<_> = failed
            .iter()
            .map(|(p, e)| json!({"path": p, "error": e}))
            .collect();
        let v = json!({"repo": spec.repo.as_str(), "revision": a.revision, "commit": commit,
                       "snapshot": snapshot, "files": files, "failed": failed});
        println!("{v}");
    } else if a.quiet {
        if failed.is_empty() {
            println!("{}", snapshot.display());
        }
    } else {
        for f in ok {
            println!(
                "✓ {} ({} bytes, {}, verified: {})",
                f.path,
                f.size,
                f.outcome.name(),
                f.verified
            );
        }
        for (p, _) in failed {
            println!("✗ {p}");
        }
        println!("{}@{} → {}", spec.repo, commit, snapshot.display());
    }
}

fn run_offline(a: &PullArgs, spec: &RepoSpec, cache: &RepoCache) -> Result<()> {
    let Some(commit) = cache.resolve_offline(&a.revision) else {
        bail!(
            "offline: {}@{} is not in the cache at {} (run `trit pull {}` with network access)",
            spec.repo,
            a.revision,
            cache.dir.display(),
            a.repo
        );
    };
    let snapshot = cache.snapshot(&commit);
    let all = cache.snapshot_files(&commit)?;
    let files: Vec<&String> = all
        .iter()
        .filter(|p| selected(spec, &a.include, p))
        .collect();
    let broken: Vec<&String> = files
        .iter()
        .copied()
        .filter(|p| !snapshot.join(p).exists())
        .collect();
    if files.is_empty() {
        bail!(
            "offline: the cached snapshot {} has no file matching the request",
            snapshot.display()
        );
    }
    if !broken.is_empty() {
        bail!(
            "offline: cached links without their blob (interrupted pull?): {}",
            broken
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if a.json {
        let list: Vec<_> = files
            .iter()
            .map(|p| {
                let size = std::fs::metadata(snapshot.join(p)).map_or(0, |m| m.len());
                json!({"path": p, "size": size, "status": "cached"})
            })
            .collect();
        let v = json!({"repo": spec.repo.as_str(), "revision": a.revision, "commit": commit,
                       "snapshot": snapshot, "offline": true, "files": list, "failed": []});
        println!("{v}");
    } else if a.quiet {
        println!("{}", snapshot.display());
    } else {
        for p in &files {
            println!("✓ {p} (cached)");
        }
        println!(
            "{}@{} → {} (offline)",
            spec.repo,
            commit,
            snapshot.display()
        );
    }
    Ok(())
}
