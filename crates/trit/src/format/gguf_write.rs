//! GGUF v3 writer: metadata of every value type and tensors given as raw block bytes.
//!
//! Used by tests (files built in memory), `trit convert` and exports. Tensors are laid out in
//! insertion order, each padded to the alignment (32 unless `set_alignment` says otherwise), which
//! is also what llama.cpp and gguf-py write.

use std::path::Path;

use super::gguf::{value_type, Array, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::GgmlType;
use crate::{Error, Result};

struct PendingTensor {
    name: String,
    shape: Vec<usize>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then serializes them in one go.
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Writes `general.alignment` and pads to it (must be a power of two).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "GGUF alignment {alignment} is not a power of two"
            )));
        }
        self.alignment = u64::from(alignment);
        self.metadata.retain(|(k, _)| k != "general.alignment");
        self.metadata
            .push(("general.alignment".into(), Value::U32(alignment)));
        Ok(())
    }

    /// Adds a metadata pair; keys must be unique (use `set_alignment` for `general.alignment`).
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<()> {
        let key = key.into();
        if key == "general.alignment" {
            return Err(Error::InvalidArgument(
                "use GgufWriter::set_alignment for general.alignment".into(),
            ));
        }
        if self.metadata.iter().any(|(k, _)| *k == key) {
            return Err(Error::InvalidArgument(format!(
                "duplicate metadata key '{key}'"
            )));
        }
        self.metadata.push((key, value.into()));
        Ok(())
    }

    /// Adds a tensor; `shape` is outermost first (`[out, in]`), `data` its encoded bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<()> {
        let name = name.into();
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(Error::InvalidArgument(format!(
                "duplicate tensor name '{name}'"
            )));
        }
        if shape.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "tensor '{name}' has {} dimensions (GGUF allows {MAX_DIMS})",
                shape.len()
            )));
        }
        let row = shape.last().copied().unwrap_or(1);
        if row % ty.block_size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "tensor '{name}': row length {row} is not a multiple of the {} block size {}",
                ty.name(),
                ty.block_size()
            )));
        }
        let rows: usize = shape.iter().rev().skip(1).product();
        let expected = ty.row_bytes(row) * rows;
        if data.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "tensor '{name}' ({} {shape:?}) needs {expected} bytes, got {}",
                ty.name(),
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            shape: shape.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k.as_bytes());
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut out, t.name.as_bytes());
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = pad(offset + t.data.len() as u64, self.alignment);
        }
        for t in &self.tensors {
            out.resize(pad(out.len() as u64, self.alignment) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out.resize(pad(out.len() as u64, self.alignment) as usize, 0);
        out
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|e| Error::io(path, e))
    }
}

fn pad(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// GGUF string: u64 length, then the bytes (no terminator).
pub(crate) fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// A value's payload (its type id is written by the caller).
pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s.as_bytes()),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Array: element type (u32), count (u64), elements.
pub(crate) fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type_id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each_le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => each_le!(v),
        Array::I16(v) => each_le!(v),
        Array::U32(v) => each_le!(v),
        Array::I32(v) => each_le!(v),
        Array::F32(v) => each_le!(v),
        Array::U64(v) => each_le!(v),
        Array::I64(v) => each_le!(v),
        Array::F64(v) => each_le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s.as_bytes())),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
    debug_assert!(a.elem_type_id() <= value_type::F64);
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$variant(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value { Value::Array(Array::$variant(x)) }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(String::from).collect()))
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}
