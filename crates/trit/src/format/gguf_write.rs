//! GGUF v3 writer: metadata of every value type and tensors given as raw block bytes.
//!
//! Used by tests (files built in memory), `trit convert` and exports. Tensors are laid out in
//! insertion order, each padded to the alignment (32 unless `set_alignment` says otherwise), which
//! is also what llama.cpp and gguf-py write.

use std::path::Path;

use super::gguf::{value_type, Array, Value, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::{self, GgmlType};
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

    /// Adds a ternary `rows × cols` weight (shape `[rows, cols]`) given as codes `t + 1`
    /// (row-major) and one scale per 64 columns, encoded as `ty` (any ternary type). Refuses
    /// lossy cases: a 128/256 group whose 64-column scales differ, a scale that is not an f16
    /// value, code 3 in a trit format (PTQ1_0, TQ1_0).
    pub fn add_ternary(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        codes: &[u8],
        scales64: &[f32],
    ) -> Result<()> {
        let name = name.into();
        let data = quant::ternary::encode_matrix(ty, rows, cols, codes, scales64)
            .map_err(|e| Error::InvalidArgument(format!("tensor '{name}': {e}")))?;
        self.add_tensor(name, &[rows, cols], ty, data)
    }

    /// Adds an F32 tensor (norm weights, biases).
    pub fn add_f32(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<()> {
        self.add_tensor(name, shape, GgmlType::F32, quant::float::encode_f32(values))
    }

    /// Adds an F16 tensor; values are rounded to the nearest f16.
    pub fn add_f16(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<()> {
        self.add_tensor(name, shape, GgmlType::F16, quant::float::encode_f16(values))
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

    /// Writes the metadata and then `tensors` (name, shape outermost first, type) whose bytes
    /// `fill(i)` produces one at a time, so a converter holds one tensor, not the whole file.
    /// `fill` must return exactly the tensor's size. The writer itself must hold no tensors.
    pub fn write_streaming(
        &self,
        path: impl AsRef<Path>,
        tensors: &[(String, Vec<usize>, GgmlType)],
        mut fill: impl FnMut(usize) -> Result<Vec<u8>>,
    ) -> Result<()> {
        use std::io::Write;
        let path = path.as_ref();
        if !self.tensors.is_empty() {
            return Err(Error::InvalidArgument(
                "write_streaming: the writer already holds tensors".into(),
            ));
        }
        let size = |shape: &[usize], ty: GgmlType| {
            let row = shape.last().copied().unwrap_or(1);
            let rows: usize = shape.iter().rev().skip(1).product();
            ty.row_bytes(row) * rows
        };
        let mut head = Vec::new();
        head.extend_from_slice(GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut head, k.as_bytes());
            head.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for (name, shape, ty) in tensors {
            if shape.len() > MAX_DIMS || shape.last().copied().unwrap_or(1) % ty.block_size() != 0 {
                return Err(Error::InvalidArgument(format!(
                    "tensor '{name}': shape {shape:?} does not fit {}",
                    ty.name()
                )));
            }
            put_string(&mut head, name.as_bytes());
            head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            head.extend_from_slice(&ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = pad(offset + size(shape, *ty) as u64, self.alignment);
        }
        let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        let mut out = std::io::BufWriter::new(file);
        let io = |e| Error::io(path, e);
        let mut at = head.len() as u64;
        out.write_all(&head).map_err(io)?;
        let zeros = vec![0u8; self.alignment as usize];
        let pad_to = |out: &mut std::io::BufWriter<std::fs::File>, at: &mut u64| {
            let n = (pad(*at, self.alignment) - *at) as usize;
            *at += n as u64;
            out.write_all(&zeros[..n])
        };
        for (i, (name, shape, ty)) in tensors.iter().enumerate() {
            pad_to(&mut out, &mut at).map_err(io)?;
            let bytes = fill(i)?;
            if bytes.len() != size(shape, *ty) {
                return Err(Error::InvalidArgument(format!(
                    "tensor '{name}' ({} {shape:?}) needs {} bytes, got {}",
                    ty.name(),
                    size(shape, *ty),
                    bytes.len()
                )));
            }
            out.write_all(&bytes).map_err(io)?;
            at += bytes.len() as u64;
        }
        pad_to(&mut out, &mut at).map_err(io)?;
        out.flush().map_err(io)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::GgufFile;
    use crate::quant::{GgmlTernary, TernaryRows};

    fn codes_and_scales(rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
        let codes = (0..rows * cols)
            .map(|i| ((i * 7 + i / 5) % 3) as u8)
            .collect();
        // One scale per 256 columns (repeated per 64) so every ternary type holds it exactly.
        let scales = (0..rows * cols / 64)
            .map(|i| 0.25 * (1 + i / 4) as f32)
            .collect();
        (codes, scales)
    }

    #[test]
    fn round_trip_metadata_and_every_tensor_type() {
        let mut w = GgufWriter::new();
        w.set_alignment(64).unwrap();
        w.add("general.architecture", "qwen3").unwrap();
        w.add("qwen3.block_count", 2u32).unwrap();
        w.add("general.sampling.temp", 0.7f32).unwrap();
        w.add("big", u64::MAX).unwrap();
        w.add("neg", -5i64).unwrap();
        w.add("pi", std::f64::consts::PI).unwrap();
        w.add("merges", vec!["a b", "c d"]).unwrap();
        w.add("ids", vec![-1i32, 0, 7]).unwrap();
        w.add(
            "nested",
            Array::Array(vec![Array::U8(vec![1]), Array::F32(vec![2.5])]),
        )
        .unwrap();
        assert!(w.add("neg", 1u8).is_err(), "duplicate key");

        let (rows, cols) = (3, 256);
        let (codes, scales) = codes_and_scales(rows, cols);
        let ternary = GgmlType::TERNARY;
        // One file per id-42 layout (a file holds one meaning of id 42).
        for (i, &ty) in ternary.iter().enumerate() {
            if ty == GgmlType::Q2_0Legacy128 {
                continue;
            }
            w.add_ternary(format!("t{i}"), ty, rows, cols, &codes, &scales)
                .unwrap();
        }
        w.add_f32("norm", &[4], &[1.0, -2.0, 0.5, 3.0]).unwrap();
        w.add_f16("half", &[2, 2], &[1.0, 0.1, -4.0, 65504.0])
            .unwrap();
        w.add_tensor("q8", &[1, 32], GgmlType::Q8_0, vec![0; 34])
            .unwrap();
        assert!(w
            .add_tensor("q8", &[1, 32], GgmlType::Q8_0, vec![0; 34])
            .is_err());
        assert!(w
            .add_tensor("bad", &[1, 32], GgmlType::Q8_0, vec![0; 33])
            .is_err());

        let f = GgufFile::from_bytes("rt", w.to_bytes()).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.architecture(), Some("qwen3"));
        assert_eq!(f.get_u64("qwen3.block_count"), Some(2));
        assert_eq!(f.get_f32("general.sampling.temp"), Some(0.7));
        assert_eq!(f.get_u64("big"), Some(u64::MAX));
        assert_eq!(f.get("neg").unwrap().as_i64(), Some(-5));
        assert_eq!(f.get("pi").unwrap().as_f64(), Some(std::f64::consts::PI));
        assert_eq!(
            f.get("merges").unwrap().as_str_array().unwrap(),
            ["a b", "c d"]
        );
        assert_eq!(f.get("ids").unwrap().as_i32_array().unwrap(), [-1, 0, 7]);
        assert_eq!(
            f.get("nested").unwrap().as_array(),
            Some(&Array::Array(vec![
                Array::U8(vec![1]),
                Array::F32(vec![2.5])
            ]))
        );
        for t in f.tensors() {
            assert_eq!(t.offset % 64, 0, "{}", t.name);
        }
        for (i, &ty) in ternary.iter().enumerate() {
            let Some(info) = f.tensor(&format!("t{i}")) else {
                continue;
            };
            assert_eq!((info.ty, info.shape.clone()), (ty, vec![rows, cols]));
            let view = GgmlTernary::new(info.ty, f.tensor_data(info), rows, cols).unwrap();
            let (mut c, mut s) = (vec![0u8; cols], vec![0f32; cols / 64]);
            for r in 0..rows {
                view.row(r, &mut c, &mut s);
                assert_eq!(c, codes[r * cols..(r + 1) * cols], "{} row {r}", ty.name());
                assert_eq!(s, scales[r * 4..(r + 1) * 4], "{} row {r}", ty.name());
            }
        }
        let mut out = [0.0; 4];
        let norm = f.tensor("norm").unwrap();
        quant::dequantize(norm.ty, f.tensor_data(norm), 4, &mut out).unwrap();
        assert_eq!(out, [1.0, -2.0, 0.5, 3.0]);
        let h = f.tensor("half").unwrap();
        quant::dequantize(h.ty, f.tensor_data(h), 4, &mut out).unwrap();
        assert_eq!(out, [1.0, half::f16::from_f32(0.1).to_f32(), -4.0, 65504.0]);
    }

    #[test]
    /// 4096 weights: g64 and g128 sizes differ by 64 bytes, more than the padding, so the span
    /// is unambiguous (tiny tensors are covered in the reader's tests).
    fn legacy_g128_round_trips_as_legacy() {
        let (codes, scales) = codes_and_scales(4, 1024);
        let mut w = GgufWriter::new();
        w.add_ternary("w", GgmlType::Q2_0Legacy128, 4, 1024, &codes, &scales)
            .unwrap();
        let f = GgufFile::from_bytes("legacy", w.to_bytes()).unwrap();
        let info = f.tensor("w").unwrap();
        assert_eq!((info.ty, info.size), (GgmlType::Q2_0Legacy128, 4 * 8 * 34));
    }

    #[test]
    fn convenience_encoders_refuse_lossy_input() {
        let (codes, mut scales) = codes_and_scales(1, 256);
        scales[1] = 8.0;
        let mut w = GgufWriter::new();
        w.add_ternary("ok", GgmlType::Q2_0, 1, 256, &codes, &scales)
            .unwrap();
        let msg = w
            .add_ternary("tq", GgmlType::TQ2_0, 1, 256, &codes, &scales)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'tq'") && msg.contains("lossy"), "{msg}");
        assert!(w
            .add_ternary("f", GgmlType::F32, 1, 256, &codes, &scales)
            .is_err());
        assert!(w.set_alignment(48).is_err());
        assert!(w.add("general.alignment", 64u32).is_err());
    }

    #[test]
    fn streaming_writes_the_same_bytes() {
        let (codes, scales) = codes_and_scales(3, 256);
        let mut meta = GgufWriter::new();
        meta.add("general.architecture", "qwen3").unwrap();
        let mut whole = GgufWriter::new();
        whole.add("general.architecture", "qwen3").unwrap();
        whole
            .add_ternary("t", GgmlType::TQ1_0, 3, 256, &codes, &scales)
            .unwrap();
        whole.add_f32("n", &[3], &[1.0, 2.0, 3.0]).unwrap();
        let t = quant::ternary::encode_matrix(GgmlType::TQ1_0, 3, 256, &codes, &scales).unwrap();
        let n = quant::float::encode_f32(&[1.0, 2.0, 3.0]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.gguf");
        let infos = [
            ("t".to_string(), vec![3, 256], GgmlType::TQ1_0),
            ("n".to_string(), vec![3], GgmlType::F32),
        ];
        meta.write_streaming(&path, &infos, |i| Ok([&t, &n][i].clone()))
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), whole.to_bytes());
        let short = meta.write_streaming(&path, &infos, |_| Ok(vec![0; 3]));
        assert!(short.unwrap_err().to_string().contains("needs"));
    }

    #[test]
    fn writes_a_file_the_reader_maps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = GgufWriter::new();
        w.add("general.architecture", "llama").unwrap();
        w.add_f32("output_norm.weight", &[3], &[1.0, 2.0, 3.0])
            .unwrap();
        w.write_file(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let t = f.tensor("output_norm.weight").unwrap();
        assert_eq!(f.tensor_data(t), quant::float::encode_f32(&[1.0, 2.0, 3.0]));
        assert_eq!(std::fs::metadata(&path).unwrap().len() % 32, 0);
    }
}
