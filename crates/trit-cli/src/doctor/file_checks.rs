//! Byte-level checks that need no model code: every shard the index lists is there and
//! complete, every tensor's byte range lies inside its file, and the files hash to what
//! `checksums.txt` or the hub said.
//!
//! The safetensors headers are read leniently here (the loader stops at the first problem;
//! doctor wants to name all of them and tell a truncated file from a bad header entry).

use super::Check;
use crate::hub::hashing::{git_blob_sha1_file, is_hex_digest, sha256_file_reporting};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// One safetensors file's header as written, offsets relative to the data section.
struct RawHeader {
    header_end: u64,
    /// name → (dtype, element count, begin, end)
    tensors: BTreeMap<String, (String, u64, u64, u64)>,
}

fn dtype_size(dtype: &str) -> Option<u64> {
    trit::format::Dtype::from_safetensors(dtype).map(|d| d.size() as u64)
}

fn read_raw_header(path: &Path) -> Result<RawHeader, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| format!("{len} bytes: too short for a safetensors header"))?;
    let n = u64::from_le_bytes(n);
    if n > 256 << 20 || n > len - 8 {
        return Err(format!(
            "header length {n} does not fit in the file ({len} bytes): truncated or not safetensors"
        ));
    }
    let mut text = vec![0u8; n as usize];
    f.read_exact(&mut text).map_err(|e| e.to_string())?;
    let json: Value =
        serde_json::from_slice(&text).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let obj = json.as_object().ok_or("header is not a JSON object")?;
    let mut tensors = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("?");
        let count: u64 = entry
            .get("shape")
            .and_then(Value::as_array)
            .map(|s| s.iter().map(|d| d.as_u64().unwrap_or(0)).product())
            .unwrap_or(0);
        let offs = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)))
            .ok_or_else(|| format!("tensor '{name}' has no data_offsets"))?;
        tensors.insert(name.clone(), (dtype.to_string(), count, offs.0, offs.1));
    }
    Ok(RawHeader {
        header_end: 8 + n,
        tensors,
    })
}

/// The safetensors files of a folder: the index's shards when there is an index.
fn safetensors_files(dir: &Path, checks: &mut Vec<Check>) -> Vec<PathBuf> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|it| {
                it.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        checks.push(if v.is_empty() {
            Check::fail("shards", "no *.safetensors file and no index")
        } else {
            Check::pass("shards", format!("{} file(s), no index", v.len()))
        });
        return v;
    }
    let parsed: Result<BTreeMap<String, String>, String> = std::fs::read_to_string(&index)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
        .and_then(|j| {
            let map = j
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or("no weight_map")?;
            Ok(map
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect())
        });
    let map = match parsed {
        Ok(m) => m,
        Err(e) => {
            checks.push(Check::fail(
                "shards",
                format!("model.safetensors.index.json: {e}"),
            ));
            return Vec::new();
        }
    };
    let mut shards: Vec<&String> = map.values().collect();
    shards.sort();
    shards.dedup();
    let missing: Vec<String> = shards
        .iter()
        .filter(|s| !dir.join(s.as_str()).is_file())
        .map(|s| format!("missing shard '{s}' listed by model.safetensors.index.json"))
        .collect();
    // A tensor the index maps to a shard that does not hold it is as bad as a missing shard.
    let mut misplaced = Vec::new();
    for (tensor, shard) in &map {
        if let Ok(h) = read_raw_header(&dir.join(shard)) {
            if !h.tensors.contains_key(tensor) {
                misplaced.push(format!("'{tensor}' is mapped to '{shard}', which lacks it"));
            }
        }
    }
    let problems: Vec<String> = missing.into_iter().chain(misplaced).collect();
    checks.push(Check::from_problems(
        "shards",
        format!(
            "all {} shard(s) listed by the index present, {} tensors mapped",
            shards.len(),
            map.len()
        ),
        &problems,
    ));
    shards
        .into_iter()
        .map(|s| dir.join(s))
        .filter(|p| p.is_file())
        .collect()
}

/// Completeness and tensor ranges of every safetensors file in a folder.
pub fn check_safetensors_folder(dir: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    let files = safetensors_files(dir, &mut checks);
    let mut incomplete = Vec::new();
    let mut outside = Vec::new();
    let mut n_tensors = 0usize;
    let mut total = 0u64;
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        total += len;
        let h = match read_raw_header(path) {
            Ok(h) => h,
            Err(e) => {
                incomplete.push(format!("{name}: {e}"));
                continue;
            }
        };
        let data_len = len - h.header_end;
        let needed = h.tensors.values().map(|t| t.3).max().unwrap_or(0);
        if needed > data_len {
            incomplete.push(format!(
                "{name}: truncated: {len} bytes on disk, its header needs {} ({} missing)",
                h.header_end + needed,
                needed - data_len
            ));
        }
        for (t, (dtype, count, begin, end)) in &h.tensors {
            n_tensors += 1;
            if begin > end || *end > data_len {
                outside.push(format!(
                    "{name}: tensor '{t}' bytes [{begin}, {end}) lie outside the file's {data_len} data bytes"
                ));
            } else if let Some(sz) = dtype_size(dtype) {
                if end - begin != count * sz {
                    outside.push(format!(
                        "{name}: tensor '{t}' spans {} bytes, its {dtype} shape needs {}",
                        end - begin,
                        count * sz
                    ));
                }
            } else {
                outside.push(format!("{name}: tensor '{t}' has unknown dtype '{dtype}'"));
            }
        }
    }
    if !files.is_empty() {
        checks.push(Check::from_problems(
            "files complete",
            format!("{} safetensors file(s), {total} bytes", files.len()),
            &incomplete,
        ));
        checks.push(Check::from_problems(
            "tensor ranges",
            format!("{n_tensors} tensors inside their files"),
            &outside,
        ));
    }
    checks
}

/// A GGUF file's tensor infos against its size (the reader validates them as it parses).
pub fn check_gguf_file(path: &Path) -> Vec<Check> {
    match trit::format::gguf::GgufFile::open(path) {
        Ok(g) => {
            let len = g.file_len() as u64;
            let start = g.data_start() as u64;
            let problems: Vec<String> = g
                .tensors()
                .iter()
                .filter(|t| start + t.offset + t.size as u64 > len)
                .map(|t| format!("tensor '{}' ends past the file's {len} bytes", t.name))
                .collect();
            vec![Check::from_problems(
                "tensor ranges",
                format!(
                    "{} tensors inside the {len}-byte GGUF file",
                    g.tensors().len()
                ),
                &problems,
            )]
        }
        Err(e) => vec![Check::fail("tensor ranges", e.to_string())],
    }
}

/// sha256 of one file with a progress bar on stderr when doctor shows progress.
fn sha256_file(path: &Path) -> std::io::Result<String> {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let bar = if super::show_progress() && len > 64 << 20 {
        let b = indicatif::ProgressBar::new(len);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "sha256 {msg:30!} [{bar:30}] {bytes}/{total_bytes}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b.set_message(
            path.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let r = sha256_file_reporting(path, &mut |n| bar.set_position(n));
    bar.finish_and_clear();
    r
}

/// Parses `sha256sum` output: `<hex>  <name>` or `<hex> *<name>`.
fn parse_checksums(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_end();
            let (hash, rest) = l.split_once(' ')?;
            let name = rest.trim_start_matches([' ', '*']);
            (is_hex_digest(hash, 64) && !name.is_empty())
                .then(|| (hash.to_ascii_lowercase(), name.to_string()))
        })
        .collect()
}

/// What the hub said a file hashes to, read from the cache: a snapshot entry links to
/// `blobs/<etag>`, and the ETag is the sha256 (LFS) or the git blob sha1.
fn hub_hash(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    let etag = target.file_name()?.to_str()?.to_string();
    let in_blobs = target.parent()?.file_name()? == "blobs";
    (in_blobs && (is_hex_digest(&etag, 64) || is_hex_digest(&etag, 40))).then_some(etag)
}

/// sha256 against `checksums.txt` beside the model, else against the hub metadata the HF
/// cache records; skipped when neither exists.
pub fn check_checksums(model: &Path) -> Check {
    let dir = if model.is_dir() {
        model.to_path_buf()
    } else {
        model.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let list = dir.join("checksums.txt");
    if let Ok(text) = std::fs::read_to_string(&list) {
        let entries = parse_checksums(&text);
        if entries.is_empty() {
            return Check::fail("checksums", "checksums.txt has no `<sha256>  <file>` line");
        }
        let mut problems = Vec::new();
        for (want, name) in &entries {
            let p = dir.join(name);
            match sha256_file(&p) {
                Ok(have) if &have == want => {}
                Ok(have) => {
                    problems.push(format!("{name}: sha256 {have}, checksums.txt says {want}"))
                }
                Err(e) => problems.push(format!("{name}: {e}")),
            }
        }
        return Check::from_problems(
            "checksums",
            format!("{} file(s) match checksums.txt (sha256)", entries.len()),
            &problems,
        );
    }
    let files: Vec<PathBuf> = if model.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(model)
            .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    } else {
        vec![model.to_path_buf()]
    };
    let mut checked = 0;
    let mut problems = Vec::new();
    for p in &files {
        let Some(want) = hub_hash(p) else { continue };
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let (kind, have) = if want.len() == 64 {
            ("sha256", sha256_file(p))
        } else {
            ("git blob sha1", git_blob_sha1_file(p))
        };
        checked += 1;
        match have {
            Ok(h) if h == want => {}
            Ok(h) => problems.push(format!("{name}: {kind} {h}, the hub listed {want}")),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if checked == 0 {
        return Check::skip(
            "checksums",
            "no checksums.txt and no hub metadata (not a `trit pull` snapshot)",
        );
    }
    Check::from_problems(
        "checksums",
        format!("{checked} file(s) match the hashes the hub listed (HF cache)"),
        &problems,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256sum_lines_parse_in_text_and_binary_mode() {
        let h = "a".repeat(64);
        let text = format!("{h}  model.safetensors\n{h} *config.json\nnot a line\n");
        assert_eq!(
            parse_checksums(&text),
            vec![
                (h.clone(), "model.safetensors".to_string()),
                (h, "config.json".to_string())
            ]
        );
    }
}
