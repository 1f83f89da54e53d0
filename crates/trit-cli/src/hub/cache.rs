//! The Hugging Face cache layout, shared with Python's `huggingface_hub`:
//!
//! ```text
//! <root>/models--owner--name/
//!     blobs/<etag>                 file contents; etag = sha256 (LFS) or git blob sha1
//!     blobs/<etag>.incomplete      a download in progress (resumed with an HTTP Range)
//!     refs/<revision>              the commit hash a branch or tag pointed to
//!     snapshots/<commit>/<path>    relative symlink to ../../blobs/<etag>
//! ```

use super::hashing::is_hex_digest;
use super::RepoId;
use anyhow::{bail, Context, Result};
use std::path::{Component, Path, PathBuf};

/// One repository's folder inside a cache root.
#[derive(Clone, Debug)]
pub struct RepoCache {
    pub dir: PathBuf,
}

impl RepoCache {
    pub fn new(root: &Path, repo: &RepoId) -> RepoCache {
        RepoCache {
            dir: root.join(format!("models--{}--{}", repo.owner, repo.name)),
        }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    /// Takes the per-blob lock Python's huggingface_hub takes (`<root>/.locks/<repo
    /// folder>/<etag>.lock`, an advisory `flock`), so two downloads of one blob — by two
    /// `trit pull`s or by trit and Python — never write the same `.incomplete` at once.
    /// Released when the returned file is dropped.
    pub fn lock_blob(&self, etag: &str) -> Result<std::fs::File> {
        let root = self.dir.parent().unwrap_or(Path::new("."));
        let name = self.dir.file_name().unwrap_or_default();
        let dir = root.join(".locks").join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{etag}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(f)
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// Records that `revision` points at `commit` (skipped when the revision is the commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, commit).with_context(|| format!("writing {}", path.display()))
    }

    /// The commit a revision resolves to without the network: a full commit hash as is, a
    /// branch or tag through `refs/`.
    pub fn resolve_offline(&self, revision: &str) -> Option<String> {
        if is_hex_digest(revision, 40) && self.snapshot(revision).is_dir() {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.dir.join("refs").join(revision)).ok()?;
        let commit = text.trim().to_string();
        is_hex_digest(&commit, 40).then_some(commit)
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink, as Python
    /// does, so the cache can be moved and the blob is shared between snapshots.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        let rel = checked_relative(file)?;
        let link = self.snapshot(commit).join(rel);
        let parent = link.parent().expect("snapshot file has a parent");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        // One `..` per directory between the link and the repository folder.
        let depth = rel.components().count() - 1 + 2;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link).with_context(|| format!("replacing {}", link.display()))?;
        }
        make_symlink(&target, &link)?;
        Ok(link)
    }

    /// Every file of a snapshot (relative paths with `/`), sorted; dangling links included so
    /// the caller can report them.
    pub fn snapshot_files(&self, commit: &str) -> Result<Vec<String>> {
        let root = self.snapshot(commit);
        let mut out = Vec::new();
        walk(&root, &root, &mut out)?;
        out.sort();
        Ok(out)
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in entries {
        let e = e?;
        let path = e.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).expect("under root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// A repository file path must stay inside the snapshot: no absolute paths, no `..`.
pub fn checked_relative(file: &str) -> Result<&Path> {
    let p = Path::new(file);
    let ok = !file.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        bail!("refusing repository file name '{file}': it would leave the snapshot folder");
    }
    Ok(p)
}

#[cfg(unix)]
fn make_symlink(target: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} -> {}", link.display(), target.display()))
}

#[cfg(not(unix))]
fn make_symlink(target: &Path, link: &Path) -> Result<()> {
    // Without symlinks Python copies the blob into the snapshot; do the same.
    let blob = link.parent().unwrap().join(target);
    std::fs::copy(&blob, link)
        .map(|_| ())
        .with_context(|| format!("copying {} to {}", blob.display(), link.display()))
}

/// What a cached repository offers as a model: the file named after `:`, else the snapshot
/// folder when it holds `config.json`, else its only `.gguf` file.
pub fn model_in_snapshot(snapshot: &Path, file: Option<&str>, spec: &str) -> Result<PathBuf> {
    if let Some(f) = file {
        let p = snapshot.join(checked_relative(f)?);
        if !p.exists() {
            bail!(
                "{spec}: the cached snapshot {} has no file '{f}'; run `trit pull {spec}`",
                snapshot.display()
            );
        }
        return Ok(p);
    }
    if snapshot.join("config.json").exists() {
        return Ok(snapshot.to_path_buf());
    }
    let mut ggufs: Vec<String> = std::fs::read_dir(snapshot)
        .with_context(|| format!("reading {}", snapshot.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    ggufs.sort();
    match ggufs.len() {
        1 => Ok(snapshot.join(&ggufs[0])),
        0 => bail!(
            "{spec}: the cached snapshot {} has neither config.json nor a .gguf file",
            snapshot.display()
        ),
        _ => bail!(
            "{spec}: the cached snapshot has several GGUF files; pick one with {spec}:FILE \
             (one of: {})",
            ggufs.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_and_resolve_to_the_blob() {
        let root = tempfile::tempdir().unwrap();
        let repo = RepoId::parse("o/n").unwrap();
        let c = RepoCache::new(root.path(), &repo);
        std::fs::create_dir_all(c.dir.join("blobs")).unwrap();
        std::fs::write(c.blob("abc"), b"x").unwrap();
        let commit = "0".repeat(40);
        let link = c.link(&commit, "sub/dir/f.json", "abc").unwrap();
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../../../blobs/abc")
        );
        assert_eq!(std::fs::read(&link).unwrap(), b"x");
        c.write_ref("main", &commit).unwrap();
        assert_eq!(c.resolve_offline("main").as_deref(), Some(commit.as_str()));
        assert_eq!(c.snapshot_files(&commit).unwrap(), vec!["sub/dir/f.json"]);
        assert!(c.link(&commit, "../escape", "abc").is_err());
        assert!(c.link(&commit, "/abs", "abc").is_err());
    }

    #[test]
    fn a_snapshot_offers_its_folder_or_its_only_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path();
        assert!(model_in_snapshot(snap, None, "o/n").is_err());
        std::fs::write(snap.join("a-q2_0.gguf"), b"").unwrap();
        assert_eq!(
            model_in_snapshot(snap, None, "o/n").unwrap(),
            snap.join("a-q2_0.gguf")
        );
        std::fs::write(snap.join("a-tq1_0.gguf"), b"").unwrap();
        let e = model_in_snapshot(snap, None, "o/n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("o/n:FILE") && e.contains("a-q2_0.gguf, a-tq1_0.gguf"),
            "{e}"
        );
        assert_eq!(
            model_in_snapshot(snap, Some("a-tq1_0.gguf"), "o/n").unwrap(),
            snap.join("a-tq1_0.gguf")
        );
        assert!(model_in_snapshot(snap, Some("missing.gguf"), "o/n").is_err());
        std::fs::write(snap.join("config.json"), b"{}").unwrap();
        assert_eq!(model_in_snapshot(snap, None, "o/n").unwrap(), snap);
    }
}
