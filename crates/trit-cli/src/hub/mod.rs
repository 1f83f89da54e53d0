//! Hugging Face Hub client: repository ids, the hub's environment variables, the standard cache
//! layout shared with Python tools (`cache`), the file listing (`api`) and resumable verified
//! downloads (`download`).

pub mod api;
pub mod cache;
pub mod download;
pub mod hashing;
pub mod resolve;

use anyhow::{bail, Result};
use std::path::PathBuf;

/// `owner/name`, as the hub spells repository ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoId {
    pub owner: String,
    pub name: String,
}

impl RepoId {
    /// Parses `owner/name`; `None` when the text does not have that shape.
    pub fn parse(s: &str) -> Option<RepoId> {
        let (owner, name) = s.split_once('/')?;
        let ok = |part: &str| {
            !part.is_empty()
                && !part.starts_with(['.', '-'])
                && !part.contains("--")
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (ok(owner) && ok(name)).then(|| RepoId {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }

    pub fn as_str(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// `REPO[:FILE]` as `trit pull` and `--model` accept it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    pub repo: RepoId,
    pub file: Option<String>,
}

impl RepoSpec {
    pub fn parse(s: &str) -> Option<RepoSpec> {
        let (repo, file) = match s.split_once(':') {
            Some((r, f)) if !f.is_empty() => (r, Some(f.to_string())),
            Some(_) => return None,
            None => (s, None),
        };
        Some(RepoSpec {
            repo: RepoId::parse(repo)?,
            file,
        })
    }

    /// Like `parse`, but an error that says what shape is expected.
    pub fn parse_or_explain(s: &str) -> Result<RepoSpec> {
        match Self::parse(s) {
            Some(r) => Ok(r),
            None => bail!(
                "'{s}' is not a hub repository: expected owner/name or owner/name:FILE \
                 (letters, digits, '-', '_', '.')"
            ),
        }
    }
}

fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// The hub's base URL: `HF_ENDPOINT`, else huggingface.co.
pub fn endpoint() -> String {
    env_nonempty("HF_ENDPOINT")
        .unwrap_or_else(|| "https://huggingface.co".to_string())
        .trim_end_matches('/')
        .to_string()
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (Python's rule).
fn hf_home() -> PathBuf {
    if let Some(h) = env_nonempty("HF_HOME") {
        return PathBuf::from(h);
    }
    let xdg = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    xdg.join("huggingface")
}

/// The cache root: `--cache-dir`, else `HF_HUB_CACHE`, else `$HF_HOME/hub`.
pub fn cache_root(explicit: Option<&PathBuf>) -> PathBuf {
    if let Some(p) = explicit {
        return p.clone();
    }
    env_nonempty("HF_HUB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// The access token: `HF_TOKEN`, else the file `huggingface-cli login` writes
/// (`HF_TOKEN_PATH`, default `$HF_HOME/token`).
pub fn token() -> Option<String> {
    if let Some(t) = env_nonempty("HF_TOKEN") {
        return Some(t.trim().to_string());
    }
    let path = env_nonempty("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// `HF_HUB_OFFLINE` set to a true value (Python accepts 1/true/yes/on).
pub fn offline_from_env() -> bool {
    env_nonempty("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Shell-style pattern match for `--include`: `*` any run of characters (including `/`, as
/// huggingface_hub's fnmatch does), `?` one character, everything else literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative matcher with one backtrack point for the last `*`: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_parse_and_reject_paths() {
        let r = RepoSpec::parse("prism-ml/Ternary-Bonsai-8B-mlx-2bit").unwrap();
        assert_eq!(r.repo.owner, "prism-ml");
        assert_eq!(r.file, None);
        let r = RepoSpec::parse("a/b:model-q2.gguf").unwrap();
        assert_eq!(r.file.as_deref(), Some("model-q2.gguf"));
        for bad in [
            "./x/y",
            "/abs/path",
            "a/b/c",
            "a",
            "a/",
            "../b",
            "a/b:",
            "a/b c",
        ] {
            assert!(RepoSpec::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn globs_match_like_fnmatch() {
        assert!(glob_match("*.json", "config.json"));
        assert!(glob_match("*.json", "sub/config.json"));
        assert!(!glob_match("*.json", "model.safetensors"));
        assert!(glob_match("model-?.gguf", "model-a.gguf"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }
}
