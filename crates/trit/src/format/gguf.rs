//! GGUF v2/v3 reader over a memory map.
//!
//! Layout (formats.md §4): magic `"GGUF"`, version u32, tensor count i64, KV count i64, the KV
//! pairs, the tensor infos, padding to `general.alignment`, then the data section. Every count,
//! length, offset and size is checked against the file length *before* anything is allocated or
//! sliced, so a corrupt or truncated file gives an `Error::Format` naming the problem instead of a
//! panic or a huge allocation.
//!
//! Id 42 is ambiguous (upstream Q2_0 g64 vs legacy Prism g128); it is resolved here from the
//! tensors' byte spans, so `TensorInfo::ty` is always the real layout.

use std::collections::HashMap;
use std::path::Path;

use crate::quant::GgmlType;
use crate::{Error, Result};

mod value;
pub use value::{Array, Value};

#[cfg(test)]
mod tests;

/// microsoft/BitNet's I2_S type id (upstream 36 is a removed type), refused with a pointer to
/// the formats trit reads (formats.md §5.7).
const I2_S_ID: u32 = 36;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are refused (keeps recursion bounded on hostile input).
const MAX_ARRAY_DEPTH: usize = 8;

/// Metadata value type ids (gguf.h `gguf_type`).
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}
/// One tensor's header entry, already validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Outermost first (PyTorch order): a weight of `out × in` is `[out, in]`; GGUF's `ne` reversed.
    pub shape: Vec<usize>,
    /// Resolved layout: id 42 is `Q2_0` or `Q2_0Legacy128` depending on the byte span found.
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of the tensor's data.
    pub size: usize,
}

impl TensorInfo {
    /// GGUF `ne` order: innermost (contiguous) dimension first.
    pub fn ne(&self) -> Vec<usize> {
        self.shape.iter().rev().copied().collect()
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Length of the contiguous (input) dimension; 1 for a scalar.
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows (product of all outer dimensions).
    pub fn n_rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }
}

/// The file's bytes: a read-only map for real files, a vector for in-memory data (tests, writer).
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the map until asked for.
pub struct GgufFile {
    source: String,
    storage: Storage,
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("source", &self.source)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let map = map_read_only(&file).map_err(|e| Error::io(path, e))?;
        Self::parse(path.display().to_string(), Storage::Mapped(map))
    }

    /// Parses a file held in memory; `source` names it in error messages.
    pub fn from_bytes(source: impl Into<String>, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(source.into(), Storage::Owned(bytes))
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(Value::as_f32)
    }

    /// `general.architecture` (e.g. "qwen3", "llama").
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes. `info` must come from this file's `tensors()` (its range was checked
    /// at open; an info from another file may panic).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_start + info.offset as usize;
        &self.storage.bytes()[start..start + info.size]
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    pub fn file_len(&self) -> usize {
        self.storage.bytes().len()
    }

    fn parse(source: String, storage: Storage) -> Result<GgufFile> {
        let header = parse_header(&source, storage.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            source,
            storage,
            version: header.version,
            metadata: header.metadata,
            key_index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_start: header.data_start,
        })
    }
}

impl GgufFile {
    /// Tells the OS the tensor's pages are no longer needed (after the engine copied them into
    /// its own layout), so the mapped file does not double the resident memory. The mapping
    /// stays valid: a later read faults the pages back in from the file.
    pub fn release_tensor(&self, info: &TensorInfo) {
        if let Storage::Mapped(m) = &self.storage {
            let start = self.data_start + info.offset as usize;
            release_pages(m, start, info.size);
        }
    }
}

#[allow(unsafe_code)]
fn release_pages(map: &memmap2::Mmap, start: usize, len: usize) {
    let page = 4096;
    let first = start.div_ceil(page) * page;
    let end = (start + len) / page * page;
    if end > first {
        // SAFETY: a private read-only file mapping; MADV_DONTNEED only drops clean pages, which
        // are re-read from the unchanged file if touched again, so no memory the program can
        // observe changes. Failure is harmless (the pages just stay resident).
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
        };
    }
}

/// Maps a file read-only (the one place the loaders map files; see its safety note).
#[allow(unsafe_code)]
pub(crate) fn map_read_only(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is only read. A file truncated or rewritten by another process while mapped
    // is undefined behaviour in Rust terms; every mmap-based model loader shares this caveat, and
    // model files are not modified in place while an engine has them open.
    unsafe { memmap2::Mmap::map(file) }
}

struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_start: usize,
}

/// Bounds-checked little-endian reader; every failure names what was being read and where.
struct Cursor<'a> {
    source: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Format(format!("{}: GGUF: {msg}", self.source))
    }

    fn take(&mut self, n: usize, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format_args!(
                "file truncated: {what} at offset {} needs {n} bytes, only {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn std::fmt::Display) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &dyn std::fmt::Display) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &dyn std::fmt::Display) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &dyn std::fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &dyn std::fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be non-negative and small enough that `count` items of at least
    /// `min_item_bytes` each fit in the rest of the file (rejects absurd counts before allocating).
    fn count(&mut self, min_item_bytes: usize, what: &dyn std::fmt::Display) -> Result<usize> {
        let raw = self.u64(what)?;
        let fits = (self.remaining() / min_item_bytes.max(1)) as u64;
        if raw > fits {
            return Err(self.err(format_args!(
                "{what} is {} but the {} remaining bytes hold at most {fits} \
                 (file truncated or corrupt)",
                raw as i64,
                self.remaining()
            )));
        }
        Ok(raw as usize)
    }

    fn string(&mut self, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        let len = self.count(1, &format_args!("length of {what}"))?;
        self.take(len, what)
    }

    /// A key or tensor name: must be UTF-8.
    fn name(&mut self, what: &dyn std::fmt::Display) -> Result<String> {
        let at = self.pos;
        let raw = self.string(what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| self.err(format_args!("{what} at offset {at} is not valid UTF-8")))
    }
}

fn parse_header(source: &str, bytes: &[u8]) -> Result<Header> {
    let mut c = Cursor {
        source,
        bytes,
        pos: 0,
    };
    let magic = c.array::<4>(&"magic")?;
    if &magic != GGUF_MAGIC {
        return Err(c.err(format_args!(
            "not a GGUF file: bad magic {:?} (expected \"GGUF\")",
            String::from_utf8_lossy(&magic)
        )));
    }
    let version = c.u32(&"version")?;
    if version != 2 && version != 3 {
        return Err(c.err(format_args!(
            "unsupported GGUF version {version} (trit reads versions 2 and 3)"
        )));
    }
    // Smallest tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
    let n_tensors = c.count(24, &"tensor count")?;
    // Smallest KV pair: key length (8) + value type (4) + a one-byte value.
    let n_kv = c.count(13, &"metadata count")?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut seen = std::collections::HashSet::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.name(&format_args!("key of metadata entry {i}"))?;
        let ty = c.u32(&format_args!("value type of '{key}'"))?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(c.err(format_args!("duplicate metadata key '{key}'")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(c.err(format_args!(
                "general.alignment must be a non-zero power of two u32, found {v:?}"
            )))
        }
    };

    let mut raw_tensors = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut c, i)?;
        if !names.insert(t.name.clone()) {
            return Err(c.err(format_args!("duplicate tensor name '{}'", t.name)));
        }
        raw_tensors.push(t);
    }

    let data_start = align_up(c.pos as u64, alignment);
    let file_len = bytes.len() as u64;
    if n_tensors > 0 && data_start > file_len {
        return Err(c.err(format_args!(
            "file truncated: data section would start at {data_start}, file has {file_len} bytes"
        )));
    }
    let data_len = file_len.saturating_sub(data_start);
    let tensors = place_tensors(&c, raw_tensors, alignment, data_len)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start: data_start as usize,
    })
}

fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<Value> {
    use value_type::*;
    let what = format_args!("value of '{key}'");
    Ok(match ty {
        U8 => Value::U8(c.u8(&what)?),
        I8 => Value::I8(c.u8(&what)? as i8),
        U16 => Value::U16(c.u16(&what)?),
        I16 => Value::I16(c.u16(&what)? as i16),
        U32 => Value::U32(c.u32(&what)?),
        I32 => Value::I32(c.u32(&what)? as i32),
        F32 => Value::F32(f32::from_bits(c.u32(&what)?)),
        U64 => Value::U64(c.u64(&what)?),
        I64 => Value::I64(c.u64(&what)? as i64),
        F64 => Value::F64(f64::from_bits(c.u64(&what)?)),
        BOOL => Value::Bool(read_bool(c, key)?),
        // Values keep invalid UTF-8 as replacement characters rather than refusing the whole file.
        STRING => Value::String(String::from_utf8_lossy(c.string(&what)?).into_owned()),
        ARRAY => Value::Array(read_array(c, key, depth)?),
        other => {
            return Err(c.err(format_args!(
                "metadata '{key}' has unknown value type {other}"
            )))
        }
    })
}

fn read_bool(c: &mut Cursor, key: &str) -> Result<bool> {
    match c.u8(&format_args!("value of '{key}'"))? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(c.err(format_args!(
            "metadata '{key}': bool byte is {b}, expected 0 or 1"
        ))),
    }
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array> {
    use value_type::*;
    if depth >= MAX_ARRAY_DEPTH {
        return Err(c.err(format_args!(
            "metadata '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"
        )));
    }
    let elem = c.u32(&format_args!("element type of array '{key}'"))?;
    let min_elem = match elem {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 | STRING => 8,
        ARRAY => 12,
        other => {
            return Err(c.err(format_args!(
                "metadata '{key}': array has unknown element type {other}"
            )))
        }
    };
    let what = format_args!("element count of array '{key}'");
    let n = c.count(min_elem, &what)?;
    let item = format_args!("elements of array '{key}'");
    // Fixed-size elements: bounds were checked by `count`, so the whole run is taken at once.
    fn fixed<'a, const N: usize, T>(
        c: &mut Cursor<'a>,
        n: usize,
        what: &dyn std::fmt::Display,
        f: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        let raw = c.take(n * N, what)?;
        Ok(raw
            .chunks_exact(N)
            .map(|b| f(b.try_into().expect("chunk of N")))
            .collect())
    }
    Ok(match elem {
        U8 => Array::U8(c.take(n, &item)?.to_vec()),
        I8 => Array::I8(c.take(n, &item)?.iter().map(|&b| b as i8).collect()),
        U16 => Array::U16(fixed(c, n, &item, u16::from_le_bytes)?),
        I16 => Array::I16(fixed(c, n, &item, i16::from_le_bytes)?),
        U32 => Array::U32(fixed(c, n, &item, u32::from_le_bytes)?),
        I32 => Array::I32(fixed(c, n, &item, i32::from_le_bytes)?),
        F32 => Array::F32(fixed(c, n, &item, f32::from_le_bytes)?),
        U64 => Array::U64(fixed(c, n, &item, u64::from_le_bytes)?),
        I64 => Array::I64(fixed(c, n, &item, i64::from_le_bytes)?),
        F64 => Array::F64(fixed(c, n, &item, f64::from_le_bytes)?),
        BOOL => Array::Bool((0..n).map(|_| read_bool(c, key)).collect::<Result<_>>()?),
        STRING => Array::String(
            (0..n)
                .map(|i| {
                    let s = c.string(&format_args!("string {i} of array '{key}'"))?;
                    Ok(String::from_utf8_lossy(s).into_owned())
                })
                .collect::<Result<_>>()?,
        ),
        _ => Array::Array(
            (0..n)
                .map(|_| read_array(c, key, depth + 1))
                .collect::<Result<_>>()?,
        ),
    })
}

/// A tensor info as written, before its type (id 42) and data range are resolved.
struct RawTensor {
    name: String,
    ne: Vec<u64>,
    type_id: u32,
    offset: u64,
}

fn read_tensor_info(c: &mut Cursor, i: usize) -> Result<RawTensor> {
    let name = c.name(&format_args!("name of tensor {i}"))?;
    let n_dims = c.u32(&format_args!("n_dims of tensor '{name}'"))? as usize;
    if n_dims > MAX_DIMS {
        return Err(c.err(format_args!(
            "tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})"
        )));
    }
    let mut ne = Vec::with_capacity(n_dims);
    for d in 0..n_dims {
        let v = c.u64(&format_args!("ne[{d}] of tensor '{name}'"))?;
        if v > i64::MAX as u64 {
            return Err(c.err(format_args!(
                "tensor '{name}' has negative ne[{d}] = {}",
                v as i64
            )));
        }
        ne.push(v);
    }
    let type_id = c.u32(&format_args!("type of tensor '{name}'"))?;
    let offset = c.u64(&format_args!("offset of tensor '{name}'"))?;
    Ok(RawTensor {
        name,
        ne,
        type_id,
        offset,
    })
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).saturating_mul(a)
}

/// Byte size of a tensor of layout `ty`, or None when ne[0] is not a multiple of the block size.
fn tensor_bytes(ne: &[u64], ty: GgmlType) -> Option<u64> {
    let bs = ty.block_size() as u64;
    let ne0 = ne.first().copied().unwrap_or(1);
    if ne0 % bs != 0 {
        return None;
    }
    Some(ne0 / bs * ty.type_size() as u64)
}

/// Resolves types and sizes, checks alignment, bounds and overlaps, and disambiguates id 42.
fn place_tensors(
    c: &Cursor,
    raw: Vec<RawTensor>,
    alignment: u64,
    data_len: u64,
) -> Result<Vec<TensorInfo>> {
    // Outer-dimension product, checked for overflow (the inner one is folded into row bytes).
    let mut rows = Vec::with_capacity(raw.len());
    for t in &raw {
        let mut n: u64 = 1;
        for &d in &t.ne {
            n = n
                .checked_mul(d)
                .filter(|&n| usize::try_from(n).is_ok())
                .ok_or_else(|| {
                    c.err(format_args!(
                        "tensor '{}': element count of ne {:?} overflows",
                        t.name, t.ne
                    ))
                })?;
        }
        rows.push(t.ne.iter().skip(1).product::<u64>());
        if t.type_id == I2_S_ID {
            return Err(Error::Unsupported(format!(
                "tensor '{}' has type I2_S (id 36, microsoft/BitNet's fork; its block layout \
                 depends on the platform that wrote it). trit does not read I2_S: run the \
                 Hugging Face folder (microsoft/bitnet-b1.58-2B-4T) directly, or convert the \
                 -bf16 model with llama.cpp's convert_hf_to_gguf.py --outtype tq2_0 (or tq1_0)",
                t.name
            )));
        }
        if GgmlType::from_id(t.type_id).is_none() {
            return Err(Error::UnknownTensorType {
                tensor: t.name.clone(),
                id: t.type_id,
                known: GgmlType::known_list(),
            });
        }
        if t.offset % alignment != 0 {
            return Err(c.err(format_args!(
                "tensor '{}' offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            )));
        }
    }

    // Byte span available to each tensor: up to the next tensor's offset or the end of data.
    let mut order: Vec<usize> = (0..raw.len()).collect();
    order.sort_by_key(|&i| raw[i].offset);
    let mut span = vec![0u64; raw.len()];
    for (k, &i) in order.iter().enumerate() {
        let end = order.get(k + 1).map_or(data_len, |&j| raw[j].offset);
        span[i] = end.saturating_sub(raw[i].offset);
    }

    let size_of = |i: usize, ty: GgmlType| -> Result<Option<u64>> {
        let Some(row) = tensor_bytes(&raw[i].ne, ty) else {
            return Ok(None);
        };
        row.checked_mul(rows[i]).map(Some).ok_or_else(|| {
            c.err(format_args!(
                "tensor '{}': byte size overflows",
                raw[i].name
            ))
        })
    };

    let q2_layout = resolve_id42(c, &raw, &span, alignment, &size_of)?;

    let mut out = Vec::with_capacity(raw.len());
    for (i, t) in raw.iter().enumerate() {
        let ty = match GgmlType::from_id(t.type_id) {
            Some(GgmlType::Q2_0) => q2_layout.unwrap_or(GgmlType::Q2_0),
            Some(ty) => ty,
            None => unreachable!("checked above"),
        };
        let Some(size) = size_of(i, ty)? else {
            return Err(c.err(format_args!(
                "tensor '{}' ({}): ne[0] = {} is not a multiple of the block size {}",
                t.name,
                ty.name(),
                t.ne.first().copied().unwrap_or(1),
                ty.block_size()
            )));
        };
        let in_bounds = matches!(t.offset.checked_add(size), Some(e) if e <= data_len);
        if !in_bounds {
            return Err(c.err(format_args!(
                "tensor '{}' data (offset {}, {size} bytes) runs past the end of the file \
                 (data section holds {data_len} bytes)",
                t.name, t.offset
            )));
        }
        if size > span[i] {
            return Err(c.err(format_args!(
                "tensor '{}' data (offset {}, {size} bytes) overlaps the next tensor",
                t.name, t.offset
            )));
        }
        out.push(TensorInfo {
            shape: t.ne.iter().rev().map(|&d| d as usize).collect(),
            name: t.name.clone(),
            ty,
            offset: t.offset,
            size: size as usize,
        });
    }
    Ok(out)
}

/// Id 42 holds either upstream Q2_0 (g64) or legacy Prism g128. A layout fits a tensor when its
/// size is at most the tensor's span and the rest is less than one alignment of padding. The
/// layout must fit every id-42 tensor of the file; when both fit all of them (only possible for
/// tiny tensors), the upstream meaning wins.
fn resolve_id42(
    c: &Cursor,
    raw: &[RawTensor],
    span: &[u64],
    alignment: u64,
    size_of: &dyn Fn(usize, GgmlType) -> Result<Option<u64>>,
) -> Result<Option<GgmlType>> {
    let mut g64_ok = true;
    let mut g128_ok = true;
    let mut first_g64: Option<&str> = None;
    let mut first_g128: Option<&str> = None;
    let mut any = false;
    for (i, t) in raw.iter().enumerate().filter(|(_, t)| t.type_id == 42) {
        any = true;
        let fits = |ty| -> Result<bool> {
            Ok(size_of(i, ty)?.is_some_and(|s| s <= span[i] && span[i] - s < alignment))
        };
        let (a, b) = (fits(GgmlType::Q2_0)?, fits(GgmlType::Q2_0Legacy128)?);
        if !a && !b {
            let show = |ty| match size_of(i, ty) {
                Ok(Some(s)) => format!("{s} bytes"),
                _ => "impossible for this width".to_string(),
            };
            return Err(c.err(format_args!(
                "tensor '{}' has type id 42 but its byte span ({} bytes) matches neither \
                 Q2_0 g64 ({}) nor legacy Q2_0 g128 ({})",
                t.name,
                span[i],
                show(GgmlType::Q2_0),
                show(GgmlType::Q2_0Legacy128)
            )));
        }
        if a && !b {
            first_g64.get_or_insert(&t.name);
        }
        if b && !a {
            first_g128.get_or_insert(&t.name);
        }
        g64_ok &= a;
        g128_ok &= b;
    }
    if !any {
        return Ok(None);
    }
    match (g64_ok, g128_ok) {
        (true, _) => Ok(Some(GgmlType::Q2_0)),
        (false, true) => Ok(Some(GgmlType::Q2_0Legacy128)),
        (false, false) => Err(c.err(format_args!(
            "id-42 tensors disagree on their layout: '{}' is Q2_0 g64 but '{}' is legacy g128",
            first_g64.unwrap_or("?"),
            first_g128.unwrap_or("?")
        ))),
    }
}
