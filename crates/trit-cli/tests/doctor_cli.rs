//! `trit doctor` on a tiny random model split into two shards: a clean copy passes (with a
//! `checksums.txt` written by coreutils' `sha256sum`), and each planted fault — missing
//! shard, truncated shard, corrupted bytes against the checksums, a tensor range past the end
//! of its file, an unparseable tokenizer, a truncated GGUF — fails the check that names it,
//! with a non-zero exit. Also: hub metadata from `trit pull` as the checksum source, and the
//! machine report against `nproc`, /proc/meminfo and `TRIT_KERNEL`.

mod common;

use common::fake_hub::{FakeHub, Faults, HubFile, COMMIT};
use common::trit;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};

/// Reads a safetensors file: header entries and the data section.
fn read_safetensors(path: &Path) -> (serde_json::Map<String, Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

/// Writes a safetensors file from header entries (offsets already relative to `data`).
fn write_safetensors(path: &Path, header: &serde_json::Map<String, Value>, data: &[u8]) {
    let mut text = serde_json::to_vec(header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A fresh copy of the sharded test model in `dir` (each test plants its own fault). The model
/// is generated once per test run; copying is much cheaper than regenerating.
fn sharded_model(dir: &Path) -> Option<PathBuf> {
    // Kept under the target folder by a fixed name (reused by later runs, never piling up);
    // built in a temporary folder and renamed, so an interrupted run leaves nothing half made.
    static ORIGINAL: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let original = ORIGINAL
        .get_or_init(|| {
            let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doctor-sharded-tiny-v1");
            if !keep.join("model.safetensors.index.json").exists() {
                let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
                let model = generate_sharded_model(work.path())?;
                let _ = std::fs::remove_dir_all(&keep);
                std::fs::rename(model, &keep).unwrap();
            }
            Some(keep)
        })
        .as_ref()?;
    let copy = dir.join("model");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(original).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    Some(copy)
}

/// A tiny Qwen3-shaped MLX model with the real Qwen3 tokenizer, re-split into two shards
/// with a `model.safetensors.index.json`, as hub uploads are. None when the tokenizer asset
/// is missing.
fn generate_sharded_model(dir: &Path) -> Option<PathBuf> {
    let tok = common::cache_dir().join("qwen3");
    if !tok.join("tokenizer.json").exists() {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh)",
            tok.display()
        );
        return None;
    }
    let preset = Preset::by_name("tiny").unwrap();
    generate(
        &preset,
        3,
        dir,
        &[OutFormat::Mlx],
        &TokenizerAssets::Dir(tok),
    )
    .unwrap();
    let model = dir.join(OutFormat::Mlx.file_name());
    let single = model.join("model.safetensors");
    let (header, data) = read_safetensors(&single);
    let names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    let mut weight_map = BTreeMap::new();
    for (s, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let mut h = serde_json::Map::new();
        h.insert("__metadata__".into(), header["__metadata__"].clone());
        let mut bytes = Vec::new();
        for name in part {
            let e = &header[name.as_str()];
            let (b, end) = (
                e["data_offsets"][0].as_u64().unwrap(),
                e["data_offsets"][1].as_u64().unwrap(),
            );
            let start = bytes.len();
            bytes.extend_from_slice(&data[b as usize..end as usize]);
            let mut e = e.clone();
            e["data_offsets"] = json!([start, bytes.len()]);
            h.insert(name.to_string(), e);
            weight_map.insert(name.to_string(), SHARDS[s]);
        }
        write_safetensors(&model.join(SHARDS[s]), &h, &bytes);
    }
    std::fs::remove_file(&single).unwrap();
    let index = json!({"metadata": {"total_size": data.len()}, "weight_map": weight_map});
    std::fs::write(
        model.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    Some(model)
}

/// `sha256sum` (coreutils) over the model's files into `checksums.txt`.
fn write_checksums(model: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(model)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let out = Command::new("sha256sum")
        .current_dir(model)
        .args(&names)
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(model.join("checksums.txt"), out.stdout).unwrap();
}

fn doctor(model: &Path) -> (Output, Value) {
    let out = trit()
        .arg("doctor")
        .arg(model)
        .arg("--json")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out, report)
}

/// The status and detail of one named check.
fn check<'a>(report: &'a Value, name: &str) -> (&'a str, &'a str) {
    let c = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {report}"));
    (c["status"].as_str().unwrap(), c["detail"].as_str().unwrap())
}

fn failed(report: &Value) -> Vec<&str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| c["check"].as_str().unwrap())
        .collect()
}

#[test]
fn clean_sharded_model_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    write_checksums(&model);
    let (out, report) = doctor(&model);
    assert!(out.status.success(), "{report}");
    assert_eq!(report["ok"], true);
    for name in [
        "shards",
        "files complete",
        "tensor ranges",
        "checksums",
        "loader",
        "tokenizer",
        "chat template",
        "config vs tensors",
    ] {
        assert_eq!(check(&report, name).0, "pass", "{name}: {report}");
    }
    assert!(check(&report, "shards").1.contains("all 2 shard(s)"));
    // Text output: one ✓ line per check; --quiet prints nothing when all pass.
    let text = trit().arg("doctor").arg(&model).output().unwrap();
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("✓ ")).count(),
        8,
        "{stdout}"
    );
    let quiet = trit()
        .arg("doctor")
        .arg(&model)
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(quiet.status.success() && quiet.stdout.is_empty());
}

#[test]
fn missing_shard_is_an_error_not_a_downgrade() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    std::fs::remove_file(model.join(SHARDS[1])).unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "shards");
    assert_eq!(status, "fail");
    assert!(
        detail.contains(&format!("missing shard '{}'", SHARDS[1])),
        "{detail}"
    );
    // The loader refuses too: a model with half its tensors never runs.
    assert_eq!(check(&report, "loader").0, "fail");
    // And `trit run` says the same.
    let run = trit()
        .args(["run", "-n", "1", "--model"])
        .arg(&model)
        .arg("hi")
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("missing shard"));
}

#[test]
fn truncated_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    let shard = model.join(SHARDS[0]);
    let len = std::fs::metadata(&shard).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap();
    f.set_len(len - 1000).unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "files complete");
    assert_eq!(status, "fail");
    assert!(
        detail.contains(SHARDS[0])
            && detail.contains("truncated")
            && detail.contains("1000 missing"),
        "{detail}"
    );
    assert_eq!(check(&report, "shards").0, "pass");
}

#[test]
fn corrupted_bytes_fail_the_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    write_checksums(&model);
    // One flipped byte inside tensor data: structure intact, only the hash can tell.
    let shard = model.join(SHARDS[1]);
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x55;
    std::fs::write(&shard, bytes).unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    assert_eq!(failed(&report), ["checksums"], "{report}");
    assert!(check(&report, "checksums").1.contains(SHARDS[1]));
    // A wrong line in checksums.txt is caught the same way.
    write_checksums(&model);
    let list = std::fs::read_to_string(model.join("checksums.txt")).unwrap();
    let bad = list.replacen(&list[..4], "0000", 1);
    std::fs::write(model.join("checksums.txt"), bad).unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    assert_eq!(failed(&report), ["checksums"], "{report}");
}

#[test]
fn tensor_range_outside_its_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    let shard = model.join(SHARDS[1]);
    let (mut header, data) = read_safetensors(&shard);
    let victim = header
        .keys()
        .find(|k| *k != "__metadata__")
        .unwrap()
        .clone();
    let b = header[&victim]["data_offsets"][0].as_u64().unwrap();
    let end = header[&victim]["data_offsets"][1].as_u64().unwrap();
    let past = data.len() as u64 + 4096;
    header[&victim]["data_offsets"] = json!([past - (end - b), past]);
    write_safetensors(&shard, &header, &data);
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "tensor ranges");
    assert_eq!(status, "fail");
    assert!(
        detail.contains(&format!("'{victim}'")) && detail.contains("outside"),
        "{detail}"
    );
}

#[test]
fn broken_tokenizer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    std::fs::write(
        model.join("tokenizer.json"),
        b"{\"version\": \"1.0\", \"model\": ",
    )
    .unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "tokenizer");
    assert_eq!(status, "fail");
    assert!(detail.contains("tokenizer.json"), "{detail}");
    assert_eq!(check(&report, "tensor ranges").0, "pass");
}

#[test]
fn config_disagreeing_with_the_tensors_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    let path = model.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["intermediate_size"] = json!(1024);
    std::fs::write(&path, config.to_string()).unwrap();
    let (out, report) = doctor(&model);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "loader");
    assert_eq!(status, "fail");
    assert!(
        detail.contains("ffn_gate") && detail.contains("1024"),
        "{detail}"
    );
    assert_eq!(check(&report, "tensor ranges").0, "pass");
}

#[test]
fn truncated_gguf_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let preset = Preset::by_name("tiny").unwrap();
    let fmt = OutFormat::parse("q2_0").unwrap();
    generate(
        &preset,
        5,
        dir.path(),
        &[fmt],
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let gguf = dir.path().join(fmt.file_name());
    let (_, report) = doctor(&gguf);
    assert_eq!(check(&report, "tensor ranges").0, "pass", "{report}");
    let len = std::fs::metadata(&gguf).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&gguf)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let (out, report) = doctor(&gguf);
    assert!(!out.status.success());
    let (status, detail) = check(&report, "tensor ranges");
    assert_eq!(status, "fail");
    assert!(detail.contains("past the end of the file"), "{detail}");
}

/// A `trit pull` snapshot carries the hub's hashes in its blob names: doctor checks them
/// when there is no checksums.txt, through `owner/name`.
#[test]
fn pulled_model_is_checked_against_the_hub_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = sharded_model(dir.path()) else {
        return;
    };
    let files: Vec<HubFile> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            HubFile::new(
                &name,
                std::fs::read(&p).unwrap(),
                name.ends_with(".safetensors"),
            )
        })
        .collect();
    let hub = FakeHub::start("acme/tiny", files.clone(), Faults::default());
    let cache = tempfile::tempdir().unwrap();
    let pulled = trit()
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", cache.path())
        .args(["pull", "acme/tiny", "--quiet"])
        .output()
        .unwrap();
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let run = || {
        let out = trit()
            .env("HF_HUB_CACHE", cache.path())
            .args(["doctor", "acme/tiny", "--json"])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out, report)
    };
    let (out, report) = run();
    assert!(out.status.success(), "{report}");
    let (status, detail) = check(&report, "checksums");
    assert_eq!(status, "pass");
    assert!(
        detail.contains(&format!("{} file(s)", files.len())) && detail.contains("hub"),
        "{detail}"
    );
    // Bytes changed in the cache after the download: the blob no longer hashes to its name.
    let weights = files.iter().find(|f| f.path == SHARDS[0]).unwrap();
    let blob = cache
        .path()
        .join("models--acme--tiny/blobs")
        .join(weights.etag());
    let mut bytes = std::fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let (out, report) = run();
    assert!(!out.status.success());
    assert_eq!(failed(&report), ["checksums"], "{report}");
    assert!(report["model"]
        .as_str()
        .unwrap()
        .ends_with(&format!("snapshots/{COMMIT}")));
}

#[test]
fn machine_report_matches_the_system() {
    let out = trit()
        .args(["doctor", "--json"])
        .env_remove("TRIT_KERNEL")
        .output()
        .unwrap();
    assert!(out.status.success());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let nproc = Command::new("nproc").arg("--all").output().unwrap();
    let nproc: u64 = String::from_utf8_lossy(&nproc.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(r["cores"]["logical"].as_u64().unwrap() <= nproc);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(r["memory"]["total_bytes"].as_u64().unwrap(), kb * 1024);
    // Without the cuda feature the reason says so; with it (CI builds it), a machine
    // without a driver says that, and one with a GPU lists it.
    let gpu = &r["gpu"];
    if gpu["available"] == true {
        assert!(!gpu["devices"].as_array().unwrap().is_empty());
    } else {
        let reason = gpu["reason"].as_str().unwrap();
        assert!(
            reason == "not built with the cuda feature" || reason.contains("driver"),
            "{reason}"
        );
    }
    let levels = r["cpu"]["kernel_levels_available"].as_array().unwrap();
    assert!(levels.contains(&r["cpu"]["kernel_level"]));
    // The level comes from the kernels' own selection, so TRIT_KERNEL moves it.
    let out = trit()
        .args(["doctor", "--json"])
        .env("TRIT_KERNEL", "portable")
        .output()
        .unwrap();
    let r2: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r2["cpu"]["kernel_level"], "portable");
    // Every model row is consistent: a context that fits is positive and within the model's.
    for m in r["models"].as_array().unwrap() {
        if let Some(c) = m["context_that_fits"].as_u64() {
            assert!(c > 0 && c <= m["max_context"].as_u64().unwrap(), "{m}");
        }
    }
}
