//! Reader tests: files built by the writer or by hand, including deliberately broken ones.
use super::*;
use crate::format::gguf_write::{put_string, put_value, GgufWriter};

/// Hand-assembled file, so tests can write things the writer refuses to.
struct Raw {
    version: u32,
    kv: Vec<(String, Value)>,
    /// name, ne (innermost first), type id, offset
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    alignment: u64,
    data: Vec<u8>,
}

impl Raw {
    fn new() -> Raw {
        Raw {
            version: 3,
            kv: vec![],
            tensors: vec![],
            alignment: 32,
            data: vec![],
        }
    }
    fn tensor(mut self, name: &str, ne: &[u64], id: u32, offset: u64) -> Raw {
        self.tensors.push((name.into(), ne.to_vec(), id, offset));
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_string(&mut out, k.as_bytes());
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        for (name, ne, id, off) in &self.tensors {
            put_string(&mut out, name.as_bytes());
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            ne.iter()
                .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        out.resize(align_up(out.len() as u64, self.alignment) as usize, 0);
        out.extend_from_slice(&self.data);
        out
    }
    fn parse(&self) -> Result<GgufFile> {
        GgufFile::from_bytes("raw.gguf", self.bytes())
    }
}

fn err_text(r: Result<GgufFile>) -> String {
    match r {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e.to_string(),
    }
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("llama.context_length", 2048u32).unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a", "bc", "<s>"])
        .unwrap();
    w.add("flag", true).unwrap();
    // 8 f32 = 32 bytes: no padding after the last tensor, so every shorter file is truncated.
    let norm: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("q8", &[2, 32], GgmlType::Q8_0, vec![7; 68])
        .unwrap();
    w.add_tensor("output_norm.weight", &[8], GgmlType::F32, norm)
        .unwrap();
    w
}

#[test]
fn reads_what_the_writer_wrote() {
    let f = GgufFile::from_bytes("mem", sample_writer().to_bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_u64("llama.context_length"), Some(2048));
    assert_eq!(f.get("flag").and_then(Value::as_bool), Some(true));
    let toks = f
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_str_array()
        .unwrap();
    assert_eq!(toks, ["a", "bc", "<s>"]);
    assert_eq!(f.tensors().len(), 2);
    let q8 = f.tensor("q8").unwrap();
    assert_eq!(
        (q8.shape.clone(), q8.ne(), q8.ty, q8.size),
        (vec![2, 32], vec![32, 2], GgmlType::Q8_0, 68)
    );
    assert_eq!((q8.n_rows(), q8.row_len()), (2, 32));
    assert!(f.tensor_data(q8).iter().all(|&b| b == 7));
    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.offset, 96, "68 bytes padded to 32");
    assert_eq!(f.tensor_data(norm)[4..8], 1f32.to_le_bytes());
    assert_eq!(f.data_start() % 32, 0);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_writer().to_bytes();
    GgufFile::from_bytes("full", bytes.clone()).unwrap();
    for cut in 0..bytes.len() {
        let r = GgufFile::from_bytes("cut", bytes[..cut].to_vec());
        let msg = err_text(r);
        assert!(
            msg.contains("truncated") || msg.contains("past the end"),
            "cut {cut}: {msg}"
        );
    }
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = sample_writer().to_bytes();
    bytes[..4].copy_from_slice(b"GGML");
    assert!(err_text(GgufFile::from_bytes("m", bytes.clone())).contains("bad magic"));
    bytes[..4].copy_from_slice(b"GGUF");
    for v in [1u32, 4] {
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        let msg = err_text(GgufFile::from_bytes("m", bytes.clone()));
        assert!(
            msg.contains(&format!("unsupported GGUF version {v}")),
            "{msg}"
        );
    }
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::from_bytes("m", bytes).unwrap().version(), 2);
}

#[test]
fn unknown_type_names_tensor_and_id() {
    let mut raw = Raw::new().tensor("blk.0.ffn_up.weight", &[32, 1], 77, 0);
    raw.data = vec![0; 64];
    let e = raw.parse().unwrap_err();
    assert!(matches!(e, Error::UnknownTensorType { id: 77, .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("77") && msg.contains("blk.0.ffn_up.weight") && msg.contains("PQ2_0"),
        "{msg}"
    );
}

#[test]
fn data_past_end_names_the_tensor() {
    let mut raw = Raw::new()
        .tensor("a", &[8], 0, 0)
        .tensor("big", &[64], 0, 32);
    raw.data = vec![0; 32 + 100];
    let msg = err_text(raw.parse());
    assert!(
        msg.contains("'big'") && msg.contains("past the end"),
        "{msg}"
    );
    // Offset itself far beyond the file (aligned, so only the bounds check can catch it).
    let raw = Raw::new().tensor("far", &[8], 0, 1 << 40);
    let msg = err_text(raw.parse());
    assert!(
        msg.contains("'far'") && msg.contains("past the end"),
        "{msg}"
    );
}

#[test]
fn misaligned_offset() {
    let mut raw = Raw::new().tensor("w", &[4], 0, 4);
    raw.data = vec![0; 64];
    let msg = err_text(raw.parse());
    assert!(
        msg.contains("'w'") && msg.contains("not a multiple of the alignment 32"),
        "{msg}"
    );
}

#[test]
fn row_not_multiple_of_block() {
    let mut raw = Raw::new().tensor("w", &[33, 2], 8, 0);
    raw.data = vec![0; 256];
    let msg = err_text(raw.parse());
    assert!(
        msg.contains("'w'") && msg.contains("block size 32"),
        "{msg}"
    );
}

#[test]
fn element_count_overflow() {
    let raw = Raw::new().tensor("w", &[1 << 40, 1 << 40], 0, 0);
    let msg = err_text(raw.parse());
    assert!(msg.contains("'w'") && msg.contains("overflows"), "{msg}");
    let raw = Raw::new().tensor("neg", &[u64::MAX], 0, 0);
    assert!(err_text(raw.parse()).contains("negative"));
}

#[test]
fn absurd_counts_fail_before_allocating() {
    let mut bytes = Raw::new().bytes();
    bytes[8..16].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(err_text(GgufFile::from_bytes("m", bytes.clone())).contains("tensor count"));
    bytes[8..16].copy_from_slice(&0u64.to_le_bytes());
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_text(GgufFile::from_bytes("m", bytes)).contains("metadata count"));

    // Array and string lengths patched to huge values.
    let mut raw = Raw::new();
    raw.kv
        .push(("arr".into(), Value::Array(Array::U64(vec![1, 2]))));
    let mut bytes = raw.bytes();
    let count_at = 24 + 8 + 3 + 4 + 4;
    assert_eq!(bytes[count_at..count_at + 8], 2u64.to_le_bytes());
    bytes[count_at..count_at + 8].copy_from_slice(&(1u64 << 61).to_le_bytes());
    assert!(
        err_text(GgufFile::from_bytes("m", bytes.clone())).contains("element count of array 'arr'")
    );
    bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_text(GgufFile::from_bytes("m", bytes)).contains("length of key"));
}

#[test]
fn nested_arrays_and_all_value_types() {
    let mut raw = Raw::new();
    let nested = Array::Array(vec![
        Array::I32(vec![-1, 2]),
        Array::Array(vec![Array::String(vec!["x".into()])]),
        Array::Bool(vec![true, false]),
    ]);
    let vals = vec![
        Value::U8(1),
        Value::I8(-2),
        Value::U16(3),
        Value::I16(-4),
        Value::U32(5),
        Value::I32(-6),
        Value::F32(0.5),
        Value::Bool(false),
        Value::String("héllo".into()),
        Value::Array(nested.clone()),
        Value::U64(1 << 40),
        Value::I64(-(1 << 40)),
        Value::F64(0.25),
        Value::Array(Array::F64(vec![])),
    ];
    for (i, v) in vals.iter().enumerate() {
        raw.kv.push((format!("k{i}"), v.clone()));
    }
    let f = raw.parse().unwrap();
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(f.get(&format!("k{i}")), Some(v));
    }
    assert_eq!(f.get("k5").unwrap().as_u64(), None);
    assert_eq!(f.get("k5").unwrap().as_i64(), Some(-6));
    assert_eq!(f.get("k4").unwrap().as_f32(), Some(5.0));
    assert_eq!(f.get("k9").unwrap().type_name(), "array of array");
    assert_eq!(Value::from(vec![1u16, 2]).to_i64_vec(), Some(vec![1, 2]));
}

#[test]
fn hostile_structure() {
    let mut raw = Raw::new();
    raw.kv.push(("a".into(), Value::U8(1)));
    raw.kv.push(("a".into(), Value::U8(2)));
    assert!(err_text(raw.parse()).contains("duplicate metadata key 'a'"));

    let mut raw = Raw::new();
    raw.kv.push(("general.alignment".into(), Value::U32(24)));
    assert!(err_text(raw.parse()).contains("power of two"));

    let mut raw = Raw::new();
    raw.kv.push(("b".into(), Value::Bool(true)));
    let mut bytes = raw.bytes();
    let at = 24 + 8 + 1 + 4;
    bytes[at] = 5;
    assert!(err_text(GgufFile::from_bytes("m", bytes)).contains("bool byte is 5"));

    // 100 levels of nested arrays: refused, not a stack overflow.
    let mut deep = Array::U8(vec![]);
    for _ in 0..100 {
        deep = Array::Array(vec![deep]);
    }
    let mut raw = Raw::new();
    raw.kv.push(("deep".into(), Value::Array(deep)));
    assert!(err_text(raw.parse()).contains("nested deeper"));

    let mut raw = Raw::new().tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32);
    raw.data = vec![0; 64];
    assert!(err_text(raw.parse()).contains("duplicate tensor name 't'"));

    let mut raw = Raw::new().tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32);
    raw.data = vec![0; 64];
    assert!(err_text(raw.parse()).contains("'a'"));

    let mut raw = Raw::new().tensor("t", &[1, 1, 1, 1, 1], 0, 0);
    raw.data = vec![0; 32];
    assert!(err_text(raw.parse()).contains("5 dimensions"));
}

/// One 4096-wide ternary tensor with `rows` rows, written as id 42 with the given layout.
fn id42_file(layout: GgmlType, rows: usize, extra: usize) -> Raw {
    let size = layout.row_bytes(4096) * rows;
    let mut raw = Raw::new().tensor("blk.0.attn_q.weight", &[4096, rows as u64], 42, 0);
    raw.data = vec![0; align_up((size + extra) as u64, 32) as usize];
    raw
}

#[test]
fn id42_layout_from_byte_span() {
    let f = id42_file(GgmlType::Q2_0, 3, 0).parse().unwrap();
    let t = &f.tensors()[0];
    assert_eq!((t.ty, t.size), (GgmlType::Q2_0, 3 * 1152));
    let f = id42_file(GgmlType::Q2_0Legacy128, 3, 0).parse().unwrap();
    let t = &f.tensors()[0];
    assert_eq!((t.ty, t.size), (GgmlType::Q2_0Legacy128, 3 * 1088));

    // Span of 3·1088 + 100 bytes: too long for g128 (+ padding), too short for g64.
    let msg = err_text(id42_file(GgmlType::Q2_0Legacy128, 3, 100).parse());
    assert!(
        msg.contains("blk.0.attn_q.weight")
            && msg.contains("matches neither")
            && msg.contains("3456 bytes")
            && msg.contains("3264 bytes"),
        "{msg}"
    );

    // Written by our writer, with a following tensor bounding the span.
    for layout in [GgmlType::Q2_0, GgmlType::Q2_0Legacy128] {
        let mut w = GgufWriter::new();
        w.add_tensor("a", &[2, 4096], layout, vec![1; layout.row_bytes(4096) * 2])
            .unwrap();
        w.add_tensor("n", &[8], GgmlType::F32, vec![0; 32]).unwrap();
        let f = GgufFile::from_bytes("w", w.to_bytes()).unwrap();
        assert_eq!(f.tensor("a").unwrap().ty, layout);
    }
}

#[test]
fn open_maps_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    sample_writer().write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert!(f.source().ends_with("t.gguf"));
    let missing = GgufFile::open(dir.path().join("nope.gguf")).unwrap_err();
    assert!(missing.to_string().contains("nope.gguf"));
}

fn cache_dir() -> std::path::PathBuf {
    std::env::var_os("TRIT_CACHE")
        .map(Into::into)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache"))
}

#[test]
fn reads_smollm2_q4_1() {
    let path = cache_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not present", path.display());
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.architecture(), Some("llama"));
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.shape, vec![49152, 576]);
    let vocab = f
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_str_array()
        .unwrap();
    assert_eq!(vocab.len(), 49152);
    let mut types: Vec<&str> = f.tensors().iter().map(|t| t.ty.name()).collect();
    types.sort();
    types.dedup();
    eprintln!("SmolLM2 tensor types: {types:?}");
    // Every tensor's first row decodes to finite values; the final norm's gains are positive.
    for t in f.tensors() {
        let mut row = vec![0f32; t.row_len()];
        let rb = t.ty.row_bytes(t.row_len());
        crate::quant::dequantize(t.ty, &f.tensor_data(t)[..rb], t.row_len(), &mut row).unwrap();
        assert!(row.iter().all(|v| v.is_finite()), "{}", t.name);
    }
    let norm = f.tensor("output_norm.weight").unwrap();
    let mut g = vec![0f32; norm.n_elements()];
    crate::quant::dequantize(norm.ty, f.tensor_data(norm), g.len(), &mut g).unwrap();
    let mean = g.iter().sum::<f32>() / g.len() as f32;
    assert!(mean > 0.1 && mean < 10.0, "mean norm gain {mean}");
    let end = f
        .tensors()
        .iter()
        .map(|t| t.offset as usize + t.size)
        .max()
        .unwrap();
    assert!(f.data_start() + end <= f.file_len());
}

#[test]
fn id42_ambiguity_is_settled_per_file() {
    // 2 × 128 weights: g64 = 72 bytes, g128 = 68 bytes; both fit a 96-byte padded span.
    let mut w = GgufWriter::new();
    w.add_tensor("tiny", &[2, 128], GgmlType::Q2_0Legacy128, vec![0; 68])
        .unwrap();
    let f = GgufFile::from_bytes("w", w.to_bytes()).unwrap();
    assert_eq!(
        f.tensor("tiny").unwrap().ty,
        GgmlType::Q2_0,
        "tie goes to upstream"
    );

    // A large legacy tensor in the same file decides for the tiny one too.
    w.add_tensor(
        "big",
        &[2, 4096],
        GgmlType::Q2_0Legacy128,
        vec![0; 2 * 1088],
    )
    .unwrap();
    let f = GgufFile::from_bytes("w", w.to_bytes()).unwrap();
    assert_eq!(f.tensor("tiny").unwrap().ty, GgmlType::Q2_0Legacy128);
    assert_eq!(f.tensor("big").unwrap().ty, GgmlType::Q2_0Legacy128);

    // Two large tensors with different layouts cannot share one meaning of id 42.
    let mut w = GgufWriter::new();
    w.add_tensor("g64", &[2, 4096], GgmlType::Q2_0, vec![0; 2 * 1152])
        .unwrap();
    w.add_tensor(
        "g128",
        &[2, 4096],
        GgmlType::Q2_0Legacy128,
        vec![0; 2 * 1088],
    )
    .unwrap();
    let msg = err_text(GgufFile::from_bytes("w", w.to_bytes()));
    assert!(
        msg.contains("'g64'") && msg.contains("'g128'") && msg.contains("disagree"),
        "{msg}"
    );
}
