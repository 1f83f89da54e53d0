//! safetensors reader (mmap) and a streaming writer.
//!
//! Layout: u64 little-endian header length `N`, `N` bytes of JSON
//! (`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}}`), then the data;
//! offsets are relative to the end of the header. Every offset is checked against the file
//! size before any tensor byte is touched, so a truncated or corrupt file is a clear error.
//! Sharded models are read through `model.safetensors.index.json` (`weight_map`).

use super::Dtype;
use crate::{Error, Result};
use memmap2::Mmap;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Headers above this size are rejected as corrupt (real headers are a few MB at most).
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// One tensor's entry in the header. `start..end` are absolute byte offsets in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

/// The parsed header of one file.
#[derive(Clone, Debug, Default)]
pub struct Header {
    pub tensors: BTreeMap<String, TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

/// Parses and validates the header of a safetensors image of `file_len` bytes, given its
/// first bytes (at least the 8-byte length plus the JSON). `what` names the file in messages.
pub fn parse_header(what: &str, bytes: &[u8], file_len: u64) -> Result<Header> {
    let bad = |msg: String| Error::Format(format!("{what}: {msg}"));
    if file_len < 8 || bytes.len() < 8 {
        return Err(bad(format!(
            "truncated safetensors file: {file_len} bytes, the header length alone needs 8"
        )));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "implausible safetensors header length {n} bytes (limit {MAX_HEADER_BYTES}); not a safetensors file?"
        )));
    }
    if n > file_len - 8 {
        return Err(bad(format!(
            "safetensors header length {n} exceeds the file ({file_len} bytes); file truncated?"
        )));
    }
    let header_end = 8 + n as usize;
    if bytes.len() < header_end {
        return Err(bad("header bytes not available".into()));
    }
    let json: Value = serde_json::from_slice(&bytes[8..header_end])
        .map_err(|e| bad(format!("safetensors header is not valid JSON: {e}")))?;
    let Value::Object(entries) = json else {
        return Err(bad("safetensors header is not a JSON object".into()));
    };
    let data_len = (file_len - 8 - n) as usize;
    let mut header = Header::default();
    for (name, entry) in entries {
        if name == "__metadata__" {
            // mx.save_safetensors writes `null` when there is no metadata.
            if entry.is_null() {
                continue;
            }
            let Value::Object(meta) = entry else {
                return Err(bad("__metadata__ is not an object".into()));
            };
            for (k, v) in meta {
                let v = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                header.metadata.insert(k, v);
            }
            continue;
        }
        let info = parse_entry(&name, &entry, data_len).map_err(bad)?;
        header.tensors.insert(
            name,
            TensorInfo {
                start: info.start + header_end,
                end: info.end + header_end,
                ..info
            },
        );
    }
    check_overlaps(&header.tensors).map_err(bad)?;
    Ok(header)
}

/// Validates one header entry; offsets returned relative to the data section.
fn parse_entry(
    name: &str,
    entry: &Value,
    data_len: usize,
) -> std::result::Result<TensorInfo, String> {
    let dtype_str = entry
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("tensor '{name}' has no dtype"))?;
    let dtype = Dtype::from_safetensors(dtype_str)
        .ok_or_else(|| format!("tensor '{name}' has unsupported dtype '{dtype_str}'"))?;
    let shape = entry
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("tensor '{name}' has no shape"))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("tensor '{name}' has a shape that is not a list of sizes"))?;
    let offsets = entry
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| format!("tensor '{name}' has no valid data_offsets [begin, end]"))?;
    let (begin, end) = offsets;
    if begin > end {
        return Err(format!(
            "tensor '{name}' has data_offsets [{begin}, {end}] with begin > end"
        ));
    }
    if end > data_len as u64 {
        return Err(format!(
            "tensor '{name}' data [{begin}, {end}) extends past the end of the data section \
             ({data_len} bytes); file truncated or header corrupt"
        ));
    }
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor '{name}' shape {shape:?} overflows"))?;
    if (end - begin) as usize != expected {
        return Err(format!(
            "tensor '{name}' ({} {shape:?}) needs {expected} bytes but data_offsets span {}",
            dtype.name(),
            end - begin
        ));
    }
    Ok(TensorInfo {
        dtype,
        shape,
        start: begin as usize,
        end: end as usize,
    })
}

fn check_overlaps(tensors: &BTreeMap<String, TensorInfo>) -> std::result::Result<(), String> {
    let mut spans: Vec<(&String, &TensorInfo)> =
        tensors.iter().filter(|(_, t)| t.end > t.start).collect();
    spans.sort_by_key(|(_, t)| t.start);
    for pair in spans.windows(2) {
        let ((a, ta), (b, tb)) = (pair[0], pair[1]);
        if tb.start < ta.end {
            return Err(format!(
                "tensors '{a}' [{}, {}) and '{b}' [{}, {}) overlap",
                ta.start, ta.end, tb.start, tb.end
            ));
        }
    }
    Ok(())
}

/// One memory-mapped safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    header: Header,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let what = path.display().to_string();
        if len < 8 {
            return Err(Error::Format(format!(
                "{what}: truncated safetensors file: {len} bytes, the header length alone needs 8"
            )));
        }
        let mmap = map_file(&file, path)?;
        let header = parse_header(&what, &mmap, len)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            mmap,
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.header.metadata
    }

    /// The tensor's entry and bytes.
    pub fn get(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let info = self.header.tensors.get(name)?;
        Some((info, &self.mmap[info.start..info.end]))
    }
}

fn map_file(file: &File, path: &Path) -> Result<Mmap> {
    super::gguf::map_read_only(file).map_err(|e| Error::io(path, e))
}

/// All safetensors files of one model folder, with a name → file index.
pub struct SafetensorsSet {
    files: Vec<SafetensorsFile>,
    index: HashMap<String, usize>,
}

impl SafetensorsSet {
    /// Opens `model.safetensors.index.json` (every shard it names must exist) or, without an
    /// index, every `*.safetensors` file in the folder.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        if index_path.exists() {
            return Self::open_index(dir, &index_path);
        }
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(Error::Format(format!(
                "{}: no model.safetensors, no model.safetensors.index.json and no *.safetensors file",
                dir.display()
            )));
        }
        let mut set = SafetensorsSet {
            files: Vec::new(),
            index: HashMap::new(),
        };
        for p in paths {
            set.add(SafetensorsFile::open(&p)?)?;
        }
        Ok(set)
    }

    fn open_index(dir: &Path, index_path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index_path).map_err(|e| Error::io(index_path, e))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Format(format!("{}: invalid JSON: {e}", index_path.display())))?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                Error::Format(format!(
                    "{}: no \"weight_map\" object",
                    index_path.display()
                ))
            })?;
        let mut shards: Vec<&str> = Vec::new();
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                Error::Format(format!(
                    "{}: weight_map entry for '{tensor}' is not a file name",
                    index_path.display()
                ))
            })?;
            if !shards.contains(&shard) {
                shards.push(shard);
            }
        }
        shards.sort_unstable();
        let mut set = SafetensorsSet {
            files: Vec::new(),
            index: HashMap::new(),
        };
        for shard in &shards {
            let p = dir.join(shard);
            if !p.exists() {
                return Err(Error::Format(format!(
                    "missing shard '{shard}' listed in {}",
                    index_path.display()
                )));
            }
            set.add(SafetensorsFile::open(&p)?)?;
        }
        for (tensor, shard) in map {
            let shard = shard.as_str().unwrap_or_default();
            let i = shards.iter().position(|s| *s == shard).unwrap_or(0);
            match set.index.get(tensor.as_str()) {
                Some(&found) if found == i => {}
                _ => {
                    return Err(Error::Format(format!(
                        "{}: tensor '{tensor}' is mapped to shard '{shard}' but that shard does not contain it",
                        index_path.display()
                    )))
                }
            }
        }
        Ok(set)
    }

    fn add(&mut self, file: SafetensorsFile) -> Result<()> {
        let i = self.files.len();
        for name in file.header.tensors.keys() {
            if let Some(&prev) = self.index.get(name) {
                return Err(Error::Format(format!(
                    "tensor '{name}' appears in both {} and {}",
                    self.files[prev].path.display(),
                    file.path.display()
                )));
            }
            self.index.insert(name.clone(), i);
        }
        self.files.push(file);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        self.files[*self.index.get(name)?].get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.index.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }
}

/// A tensor to be written: name, dtype and shape (its bytes come from a callback).
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn n_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Writes a safetensors file, streaming tensor data: `fill(i, out)` must write exactly the
/// bytes of `specs[i]`. The header is padded with spaces to a multiple of 8 bytes, as the
/// reference implementation does.
pub fn write(
    path: &Path,
    metadata: &BTreeMap<String, String>,
    specs: &[TensorSpec],
    mut fill: impl FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(meta));
    }
    let mut offset = 0usize;
    for s in specs {
        let n = s.n_bytes();
        header.insert(
            s.name.clone(),
            serde_json::json!({
                "dtype": s.dtype.name(),
                "shape": s.shape,
                "data_offsets": [offset, offset + n],
            }),
        );
        offset += n;
    }
    let mut json = serde_json::to_vec(&Value::Object(header)).expect("JSON of strings");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let io = |e| Error::io(path, e);
    out.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&json).map_err(io)?;
    for (i, s) in specs.iter().enumerate() {
        let mut counted = CountingWriter {
            inner: &mut out,
            n: 0,
        };
        fill(i, &mut counted)?;
        if counted.n != s.n_bytes() {
            return Err(Error::InvalidArgument(format!(
                "safetensors writer: tensor '{}' got {} bytes, its shape needs {}",
                s.name,
                counted.n,
                s.n_bytes()
            )));
        }
    }
    out.flush().map_err(io)?;
    Ok(())
}

struct CountingWriter<'w> {
    inner: &'w mut dyn Write,
    n: usize,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(header: &str, data_len: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data_len, 0);
        v
    }

    fn parse(header: &str, data_len: usize) -> Result<Header> {
        let img = image(header, data_len);
        parse_header("t", &img, img.len() as u64)
    }

    #[test]
    fn parses_entries_and_metadata() {
        let h = parse(
            r#"{"__metadata__":{"format":"mlx"},"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"U32","shape":[1],"data_offsets":[12,16]}}"#,
            16,
        )
        .unwrap();
        assert_eq!(h.metadata["format"], "mlx");
        let a = &h.tensors["a"];
        assert_eq!((a.dtype, a.shape.clone()), (Dtype::F16, vec![2, 3]));
        let base = 8 + h.tensors.len(); // not meaningful; check relative layout instead
        let _ = base;
        assert_eq!(h.tensors["b"].start - a.start, 12);
        assert_eq!(a.end - a.start, 12);
    }

    #[test]
    fn rejects_bad_headers() {
        let e = |h: &str, n: usize| parse(h, n).unwrap_err().to_string();
        assert!(e(
            r#"{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}"#,
            4
        )
        .contains("extends past the end"));
        assert!(e(
            r#"{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,6]}}"#,
            8
        )
        .contains("needs 8 bytes"));
        assert!(e(
            r#"{"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#,
            8
        )
        .contains("unsupported dtype 'F8_E4M3'"));
        assert!(e(
            r#"{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[4],"data_offsets":[4,12]}}"#,
            12
        )
        .contains("overlap"));
        assert!(e("{not json", 0).contains("not valid JSON"));
        // Header length larger than the file.
        let mut img = image("{}", 0);
        img[..8].copy_from_slice(&1000u64.to_le_bytes());
        let msg = parse_header("t", &img, img.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("exceeds the file"), "{msg}");
        img[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = parse_header("t", &img, img.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("implausible"), "{msg}");
        let msg = parse_header("t", &[1, 2], 2).unwrap_err().to_string();
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn write_then_read_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let specs = vec![
            TensorSpec {
                name: "w".into(),
                dtype: Dtype::U32,
                shape: vec![2, 2],
            },
            TensorSpec {
                name: "n".into(),
                dtype: Dtype::F16,
                shape: vec![3],
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
        write(&path, &meta, &specs, |i, out| {
            let bytes: Vec<u8> = (0..specs[i].n_bytes() as u8)
                .map(|b| b + 10 * i as u8)
                .collect();
            out.write_all(&bytes).map_err(|e| Error::io("x", e))
        })
        .unwrap();
        let f = SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.metadata()["format"], "mlx");
        let (info, bytes) = f.get("n").unwrap();
        assert_eq!(info.shape, vec![3]);
        assert_eq!(bytes, &[10, 11, 12, 13, 14, 15]);
        assert_eq!(f.get("w").unwrap().1.len(), 16);
        // Wrong byte count from the callback is refused.
        let err = write(&path, &meta, &specs, |_, out| {
            out.write_all(&[0]).map_err(|e| Error::io("x", e))
        })
        .unwrap_err();
        assert!(err.to_string().contains("got 1 bytes"));
    }
}
