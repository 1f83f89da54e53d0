//! Damaged model files never panic, hang or allocate without bound: thousands of mutations of
//! small generated models (cut at many points, bytes of the headers overwritten, counts and
//! offsets set to huge values) are opened, loaded and run one token; each must end in an error
//! or a working model, never a panic. A count read from a file must be checked against the
//! file's size before anything is allocated for it, or a mutation here aborts the process.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::model::{Logits, Model};

/// xorshift64*: the mutations are the same on every run.
use trit::test_values::TestRng as Rng;

/// Opens, loads (tokenizer included) and runs one token of the model at `path`; Err for a refused file. Panics
/// propagate to the caller's `catch_unwind`.
fn try_model(path: &Path) -> Result<(), String> {
    let files = trit::format::open(path).map_err(|e| e.to_string())?;
    // The tokenizer too: GGUF files carry theirs as metadata arrays that trit converts.
    let tok =
        trit::tokenizer::Tokenizer::from_source(&files.tokenizer).map_err(|e| e.to_string())?;
    tok.encode("Hello, world", false)
        .map_err(|e| e.to_string())?;
    let model = Model::load(&files, 1).map_err(|e| e.to_string())?;
    let mut cache = model.new_cache(8);
    model
        .forward(&[1], &mut cache, Logits::Last)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs every mutation of `original` that `mutate` makes (written to `path`) on the model at
/// `model` (the file itself, or its folder), and fails with the list of mutations that
/// panicked. The unmutated file must load.
fn survive_all(
    model: &Path,
    path: &Path,
    original: &[u8],
    cases: usize,
    mut mutate: impl FnMut(&mut Rng, &mut Vec<u8>) -> String,
) {
    std::fs::write(path, original).unwrap();
    try_model(model).expect("the unmutated model loads");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut panicked = Vec::new();
    let (mut refused, mut loaded) = (0, 0);
    for _ in 0..cases {
        let mut bytes = original.to_vec();
        let what = mutate(&mut rng, &mut bytes);
        std::fs::write(path, &bytes).unwrap();
        match catch_unwind(AssertUnwindSafe(|| try_model(model))) {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => panicked.push(what),
        }
    }
    eprintln!(
        "{}: {refused} refused, {loaded} still loaded",
        path.display()
    );
    assert!(
        panicked.is_empty(),
        "{} mutations panicked, e.g. {:?}",
        panicked.len(),
        &panicked[..panicked.len().min(8)]
    );
    assert!(
        refused > 0,
        "no mutation was refused: the mutations do not reach the reader"
    );
    std::fs::write(path, original).unwrap();
}

/// Where a GGUF file's tensor data starts (everything before it is header).
fn gguf_header_len(path: &Path) -> usize {
    let f = trit::format::gguf::GgufFile::open(path).unwrap();
    f.data_start()
}

fn generated(format: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // The tiny preset with a small vocabulary: loads in about a millisecond, so thousands of
    // mutations stay cheap.
    let preset = Preset {
        vocab: 1024,
        bos: 1000,
        eos: 1001,
        pad: 1000,
        ..Preset::by_name("tiny").unwrap()
    };
    let f = OutFormat::parse(format).unwrap();
    generate(&preset, 5, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    dir
}

/// Little-endian values that break counts, lengths and offsets.
const HUGE: [u64; 6] = [
    u64::MAX,
    1 << 63,
    1 << 40,
    (1 << 32) + 7,
    0x7fff_ffff,
    0xffff_ffff,
];

#[test]
fn damaged_gguf_files_are_errors_not_panics() {
    for format in ["q2_0", "tq1_0"] {
        let dir = generated(format);
        let src = dir
            .path()
            .join(OutFormat::parse(format).unwrap().file_name());
        let original = std::fs::read(&src).unwrap();
        let header = gguf_header_len(&src).min(original.len());
        let path = dir.path().join("damaged.gguf");
        // Cut short: at every 97th byte of the header, then across the tensor data.
        survive_all(&path, &path, &original, 400, |rng, b| {
            let at = if rng.below(2) == 0 {
                rng.below(header)
            } else {
                rng.below(b.len())
            };
            b.truncate(at);
            format!("{format}: cut at {at}")
        });
        // One header byte overwritten.
        survive_all(&path, &path, &original, 1500, |rng, b| {
            let at = rng.below(header);
            let v = match rng.below(3) {
                0 => 0,
                1 => 0xff,
                _ => rng.next_u64() as u8,
            };
            b[at] = v;
            format!("{format}: byte {at} = {v:#x}")
        });
        // A 4- or 8-byte little-endian field of the header set to a huge value.
        survive_all(&path, &path, &original, 1500, |rng, b| {
            let at = rng.below(header.saturating_sub(8).max(1));
            let v = HUGE[rng.below(HUGE.len())];
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            format!("{format}: {width} bytes at {at} = {v:#x}")
        });
    }
}

/// Bonsai 2's form (a hybrid with rotation metadata: more keys, arrays of signs) as GGUF.
#[test]
fn damaged_hybrid_gguf_files_are_errors_not_panics() {
    use trit::format::testgen::hybrid::{generate, HybridPreset};
    let dir = tempfile::tempdir().unwrap();
    let f = OutFormat::parse("q2_0").unwrap();
    let preset = HybridPreset::by_name("tiny-prism").unwrap();
    generate(&preset, 5, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let src = dir.path().join(f.file_name());
    let original = std::fs::read(&src).unwrap();
    let header = gguf_header_len(&src).min(original.len());
    let path = dir.path().join("damaged.gguf");
    survive_all(&path, &path, &original, 800, |rng, b| {
        let at = rng.below(header.saturating_sub(8).max(1));
        if rng.below(2) == 0 {
            b[at] = rng.next_u64() as u8;
            format!("byte {at}")
        } else {
            let v = HUGE[rng.below(HUGE.len())];
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            format!("8 bytes at {at} = {v:#x}")
        }
    });
}

#[test]
fn damaged_safetensors_folders_are_errors_not_panics() {
    let dir = generated("mlx");
    let folder = dir.path().join("mlx");
    let file = folder.join("model.safetensors");
    let original = std::fs::read(&file).unwrap();
    let header = 8 + u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    // Digits of the JSON header (shapes, offsets) changed, bytes overwritten, the length
    // prefix set to huge values, the file cut short.
    let digits: Vec<usize> = (8..header)
        .filter(|&i| original[i].is_ascii_digit())
        .collect();
    survive_all(&folder, &file, &original, 1500, |rng, b| {
        match rng.below(4) {
            0 => {
                let at = digits[rng.below(digits.len())];
                let d = b'0' + rng.below(10) as u8;
                b[at] = d;
                format!("digit {at} = {}", d as char)
            }
            1 => {
                let at = rng.below(header);
                b[at] = rng.next_u64() as u8;
                format!("byte {at}")
            }
            2 => {
                let v = HUGE[rng.below(HUGE.len())];
                b[..8].copy_from_slice(&v.to_le_bytes());
                format!("header length {v:#x}")
            }
            _ => {
                let at = rng.below(b.len());
                b.truncate(at);
                format!("cut at {at}")
            }
        }
    });
    // config.json with numbers changed (sizes that contradict the tensors, zeros, huge ones).
    let config = folder.join("config.json");
    let text = std::fs::read(&config).unwrap();
    let digits: Vec<usize> = (0..text.len())
        .filter(|&i| text[i].is_ascii_digit())
        .collect();
    survive_all(&folder, &config, &text, 600, |rng, b| {
        let at = digits[rng.below(digits.len())];
        let d = if rng.below(4) == 0 {
            b"0".to_vec()
        } else {
            format!("{}", rng.below(10)).into_bytes()
        };
        b[at] = d[0];
        if rng.below(8) == 0 {
            // A much larger number: insert digits.
            b.splice(at..at, b"99999".iter().copied());
        }
        format!("config digit at {at}")
    });
}

/// The real byte-level BPE vocabulary of the committed default model (49,152 tokens, merges,
/// token types) with one field damaged at a time: building the tokenizer and encoding and
/// decoding text end in an error or a working tokenizer, never a panic.
#[test]
fn damaged_gguf_vocabularies_are_errors_not_panics() {
    use trit::tokenizer::{GgufVocab, Tokenizer};
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let Some(path) = std::fs::read_dir(&root).ok().and_then(|d| {
        d.filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "gguf"))
    }) else {
        eprintln!("SKIPPED: no default model");
        return;
    };
    let file = trit::format::gguf::GgufFile::open(&path).unwrap();
    let original = GgufVocab::from_gguf(&file).unwrap();
    let mut rng = Rng(7);
    let (mut panicked, mut refused) = (Vec::new(), 0);
    for case in 0..120 {
        let mut v = original.clone();
        let n = v.tokens.len();
        let what = match case % 10 {
            0 => {
                let i = rng.below(n);
                v.tokens[i].clear();
                format!("token {i} empty")
            }
            1 => {
                let i = rng.below(v.merges.len());
                v.merges[i] = v.merges[i].replace(' ', "");
                format!("merge {i} without its space")
            }
            2 => {
                let i = rng.below(v.merges.len());
                v.merges[i] = format!("{} \u{1}nowhere", v.merges[i]);
                format!("merge {i} of a missing token")
            }
            3 => {
                let cut = rng.below(n);
                v.tokens.truncate(cut);
                format!("tokens cut to {cut}")
            }
            4 => {
                let cut = rng.below(n);
                v.token_types.truncate(cut);
                format!("token types cut to {cut}")
            }
            5 => {
                let i = rng.below(v.token_types.len().max(1));
                if let Some(t) = v.token_types.get_mut(i) {
                    *t = [-1, 0, 2, 3, 6, 99, i32::MAX][rng.below(7)];
                }
                format!("token type {i} odd")
            }
            6 => {
                let id = [n as u32, u32::MAX, n as u32 + 5][rng.below(3)];
                v.bos = Some(id);
                v.eos = Some(id);
                v.add_bos = true;
                v.add_eos = true;
                format!("special ids {id}")
            }
            7 => {
                let (i, j) = (rng.below(n), rng.below(n));
                v.tokens[i] = v.tokens[j].clone();
                format!("token {i} = token {j}")
            }
            8 => {
                let i = rng.below(n);
                v.tokens[i] = "\u{0}\u{ffff}Ġ\u{10ffff}".into();
                format!("token {i} odd characters")
            }
            _ => {
                v.pre = Some(["", "nonsense", "qwen35", "llama-bpe"][rng.below(4)].into());
                format!("pre {:?}", v.pre)
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), trit::Error> {
            let tok = Tokenizer::from_gguf_vocab(v)?;
            let ids = tok.encode("Hello, wörld! 123 <|im_start|> ", true)?;
            tok.decode(&ids, false)?;
            tok.decode(&[0, 1, 2, n as u32 - 1], true)?;
            Ok(())
        }));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(_)) => refused += 1,
            Err(_) => panicked.push(what),
        }
    }
    eprintln!("vocabularies: {refused} refused of 120");
    assert!(panicked.is_empty(), "panicked: {panicked:?}");
}
