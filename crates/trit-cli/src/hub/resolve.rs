//! `--model owner/name[:FILE]`: a hub repository id where a model path is expected resolves
//! through the local HF cache only. Running a model never touches the network; when the
//! repository is not cached the error says which `trit pull` fetches it.

use super::cache::{model_in_snapshot, RepoCache};
use super::RepoSpec;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Whether `arg` names a model: an existing `.gguf` file or folder, or an `owner/name[:FILE]`
/// repository already in the local HF cache (a text that merely looks like one is not).
pub fn names_a_model(arg: &str) -> bool {
    let p = Path::new(arg);
    if p.is_dir() || (p.is_file() && p.extension().is_some_and(|x| x == "gguf")) {
        return true;
    }
    RepoSpec::parse(arg).is_some_and(|spec| {
        RepoCache::new(&super::cache_root(None), &spec.repo)
            .resolve_offline("main")
            .is_some()
    })
}

/// An existing path is used as is; otherwise `owner/name[:FILE]` is looked up in the cache
/// (revision `main`); anything else is returned unchanged so the loader names the missing file.
pub fn model_argument(arg: &Path) -> Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(text) = arg.to_str() else {
        return Ok(arg.to_path_buf());
    };
    let Some(spec) = RepoSpec::parse(text) else {
        return Ok(arg.to_path_buf());
    };
    let root = super::cache_root(None);
    let cache = RepoCache::new(&root, &spec.repo);
    let Some(commit) = cache.resolve_offline("main") else {
        bail!(
            "'{text}' is neither a file nor a folder, and the hub repository {} is not in the \
             Hugging Face cache ({}).\nDownload it first with: trit pull {text}",
            spec.repo,
            root.display()
        );
    };
    model_in_snapshot(&cache.snapshot(&commit), spec.file.as_deref(), text)
}
