//! A session's state on disk: the tokens its cache holds, their keys and values and, for a
//! hybrid model, the recurrent state — so a later process continues where this one stopped
//! instead of reading the prompt again (llama.cpp's `--prompt-cache`, mlx-lm's prompt cache
//! files, `trit chat`'s `/save` and `/load`).
//!
//! Layout (little-endian):
//!
//! ```text
//! b"TRITSTAT" | u32 version | u32 header length | header (JSON) | u32 token ids
//! | per cache block: keys' bytes, values' bytes (exact copies of the stored pages)
//! | recurrent state (per linear layer: conv then ssm, f32) | its snapshot, if the header has one
//! | u32 CRC-32 of every byte before it
//! ```
//!
//! The header says what the bytes are (cache shape and types, counts) and which model made
//! them. Every count is checked against the file's length before anything is read, the CRC
//! once everything is, so a truncated or damaged file is an error, never a wrong answer.
//!
//! Which model: a config matches between fine-tunes of one base (or a model with and without a
//! LoRA adapter), so the header's shape check is not enough. The first position's keys are a
//! fingerprint of the weights that costs one token's forward pass: loading recomputes them and
//! compares every layer's with the saved ones.

use super::session::Session;
use crate::model::kv_cache::{KvBlock, BLOCK_TOKENS};
use crate::model::recurrent::{LayerState, RecurrentState};
use crate::model::{KvCache, KvType, KvTypes, Logits, Model};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"TRITSTAT";
const VERSION: u32 = 1;
/// Larger headers are not ours (the JSON is a few hundred bytes plus the caller's `extra`).
const MAX_HEADER: usize = 64 << 20;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct ModelId {
    arch: String,
    name: String,
    n_layers: usize,
    hidden: usize,
    vocab: usize,
}

impl ModelId {
    fn of(model: &Model) -> Self {
        let c = model.config();
        ModelId {
            arch: c.arch_name().to_string(),
            name: c.name.clone(),
            n_layers: c.n_layers,
            hidden: c.hidden,
            vocab: c.vocab,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}, {} layers, hidden {}, vocabulary {})",
            self.name, self.arch, self.n_layers, self.hidden, self.vocab
        )
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct CacheLayout {
    n_layers: usize,
    row: usize,
    heads: usize,
    k: String,
    v: String,
    blocks: usize,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone, Copy)]
struct StateLayout {
    layers: usize,
    conv: usize,
    ssm: usize,
}

impl StateLayout {
    fn of(s: &RecurrentState) -> Result<Self> {
        let first = s.layers.first();
        let (conv, ssm) = first.map_or((0, 0), |l| (l.conv.len(), l.ssm.len()));
        if s.layers
            .iter()
            .any(|l| l.conv.len() != conv || l.ssm.len() != ssm)
        {
            return Err(Error::Unsupported(
                "saving a recurrent state whose layers differ in size".into(),
            ));
        }
        Ok(StateLayout {
            layers: s.layers.len(),
            conv,
            ssm,
        })
    }

    fn bytes(&self) -> usize {
        self.layers * (self.conv + self.ssm) * 4
    }
}

#[derive(Serialize, Deserialize, Debug)]
struct Header {
    model: ModelId,
    tokens: usize,
    cache: CacheLayout,
    recurrent: Option<StateLayout>,
    /// Position of the recurrent state's snapshot (saved after the current state).
    snapshot: Option<usize>,
    /// The caller's data (a chat's messages), returned by `load` as it was given.
    extra: Value,
}

/// What [`Session::load_state`] found besides the cache.
#[derive(Debug)]
pub struct LoadedState {
    /// Tokens the cache now holds.
    pub tokens: usize,
    /// The `extra` value given to [`Session::save_state`].
    pub extra: Value,
}

/// A writer that keeps the CRC of what went through it.
struct Crc<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Crc<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc.update(bytes);
        self.inner.write_all(bytes)
    }
}

/// The reading side of [`Crc`].
struct CrcRead<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> CrcRead<R> {
    fn take(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.crc.update(buf);
        Ok(())
    }

    fn u32(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.take(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

fn state_f32s(s: &RecurrentState) -> impl Iterator<Item = &[f32]> {
    s.layers
        .iter()
        .flat_map(|l| [l.conv.as_slice(), l.ssm.as_slice()])
}

/// Refuses a model whose caches cannot be saved: a GPU model's keys and values live on the
/// device (the CLI checks before it computes anything).
pub fn check_savable(model: &Model) -> Result<()> {
    if model.shares_prefixes() {
        return Ok(());
    }
    Err(Error::Unsupported(
        "saved sessions of a GPU model: its keys and values live on the device \
         (save and load sessions with --device cpu)"
            .into(),
    ))
}

/// Writes `session`'s state to `path` (through a temporary file beside it, renamed at the
/// end, so an interrupted save never leaves a damaged file under the name).
pub(crate) fn save(session: &Session, path: &Path, extra: Value) -> Result<()> {
    let (cache, tokens) = session.state_parts();
    check_savable(session.model())?;
    let shape = cache.shape();
    let blocks = tokens.len().div_ceil(BLOCK_TOKENS);
    let recurrent = cache.recurrent().map(StateLayout::of).transpose()?;
    let snapshot = cache.snapshot().filter(|(p, _)| *p <= tokens.len());
    let header = Header {
        model: ModelId::of(session.model()),
        tokens: tokens.len(),
        cache: CacheLayout {
            n_layers: shape.n_layers,
            row: shape.row,
            heads: cache.heads(),
            k: shape.types.k.name().to_string(),
            v: shape.types.v.name().to_string(),
            blocks,
        },
        recurrent,
        snapshot: snapshot.map(|(p, _)| p),
        extra,
    };
    let json = serde_json::to_vec(&header).map_err(|e| Error::Format(e.to_string()))?;
    let tmp = path.with_extension("tmp-save");
    let io = |e| Error::io(path, e);
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut w = Crc {
        inner: BufWriter::new(file),
        crc: crc32fast::Hasher::new(),
    };
    let written = (|| -> std::io::Result<()> {
        w.put(MAGIC)?;
        w.put(&VERSION.to_le_bytes())?;
        w.put(&(json.len() as u32).to_le_bytes())?;
        w.put(&json)?;
        for t in tokens {
            w.put(&t.to_le_bytes())?;
        }
        for b in &cache.blocks()[..blocks] {
            for values in [false, true] {
                for part in b.store(values).byte_parts() {
                    w.put(part)?;
                }
            }
        }
        let states = cache
            .recurrent()
            .into_iter()
            .chain(snapshot.map(|(_, s)| s));
        for s in states {
            for xs in state_f32s(s) {
                w.put(bytemuck::cast_slice(xs))?;
            }
        }
        let crc = w.crc.clone().finalize();
        w.inner.write_all(&crc.to_le_bytes())?;
        w.inner.flush()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    drop(w);
    std::fs::rename(&tmp, path).map_err(io)
}

fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Format(format!(
        "{}: not a usable saved session: {what}",
        path.display()
    ))
}

/// The file's header: checked magic, version and size.
fn read_header<R: Read>(
    r: &mut CrcRead<R>,
    path: &Path,
    file_len: usize,
) -> Result<(Header, usize)> {
    let truncated = |e| truncated(path, e);
    let mut magic = [0u8; 8];
    r.take(&mut magic).map_err(truncated)?;
    if &magic != MAGIC {
        return Err(bad(
            path,
            "it does not start with TRITSTAT (not a trit session file)",
        ));
    }
    let version = r.u32().map_err(truncated)?;
    if version != VERSION {
        return Err(bad(
            path,
            format!("format version {version}; this trit reads {VERSION}"),
        ));
    }
    let hlen = r.u32().map_err(truncated)? as usize;
    if hlen > MAX_HEADER || 16 + hlen > file_len {
        return Err(bad(
            path,
            format!("header of {hlen} bytes in a file of {file_len}"),
        ));
    }
    let mut json = vec![0u8; hlen];
    r.take(&mut json).map_err(truncated)?;
    let h = serde_json::from_slice(&json).map_err(|e| bad(path, format!("its header: {e}")))?;
    Ok((h, hlen))
}

fn truncated(path: &Path, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => bad(path, "the file ends early (truncated?)"),
        _ => Error::io(path, e),
    }
}

fn open(path: &Path) -> Result<(CrcRead<BufReader<std::fs::File>>, usize)> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let r = CrcRead {
        inner: BufReader::new(file),
        crc: crc32fast::Hasher::new(),
    };
    Ok((r, file_len))
}

/// The `extra` value a saved session was given, read from its header alone (the rest of the
/// file is checked by [`load`]).
pub fn read_extra(path: &Path) -> Result<Value> {
    let (mut r, file_len) = open(path)?;
    Ok(read_header(&mut r, path, file_len)?.0.extra)
}

/// Reads a state saved by [`save`] into `session` (replacing what it held) after checking that
/// it belongs to `session`'s model and fits its context.
pub(crate) fn load(session: &mut Session, path: &Path) -> Result<LoadedState> {
    let (mut r, file_len) = open(path)?;
    let (h, hlen) = read_header(&mut r, path, file_len)?;
    let truncated = |e| truncated(path, e);

    let model = session.model();
    check_savable(model)?;
    let ours = ModelId::of(model);
    if h.model != ours {
        return Err(Error::InvalidArgument(format!(
            "{} was saved with the model {}, not {}",
            path.display(),
            h.model.describe(),
            ours.describe()
        )));
    }
    let mut fresh = model.new_cache(session.n_ctx());
    let shape = fresh.shape();
    let types = KvTypes {
        k: KvType::parse(&h.cache.k)?,
        v: KvType::parse(&h.cache.v)?,
    };
    if types != shape.types {
        return Err(Error::InvalidArgument(format!(
            "{} holds keys/values as {}/{}; this session stores {}/{} \
             (use the same --cache-type-k/-v as when it was saved)",
            path.display(),
            types.k,
            types.v,
            shape.types.k,
            shape.types.v
        )));
    }
    let c = &h.cache;
    if (c.n_layers, c.row, c.heads) != (shape.n_layers, shape.row, fresh.heads()) {
        return Err(bad(path, "its cache shape is not this model's"));
    }
    if h.tokens > session.n_ctx() {
        return Err(Error::ContextOverflow {
            n_prompt: h.tokens,
            n_ctx: session.n_ctx(),
        });
    }
    if c.blocks != h.tokens.div_ceil(BLOCK_TOKENS) {
        return Err(bad(
            path,
            format!("{} blocks for {} tokens", c.blocks, h.tokens),
        ));
    }
    let ours_state = fresh.recurrent().map(StateLayout::of).transpose()?;
    if h.recurrent != ours_state {
        return Err(bad(path, "its recurrent state is not this model's"));
    }
    if h.snapshot.is_some_and(|p| p > h.tokens) || (h.snapshot.is_some() && h.recurrent.is_none()) {
        return Err(bad(
            path,
            "its recurrent-state snapshot does not fit its tokens",
        ));
    }
    let states = h.recurrent.map_or(0, |s| s.bytes()) * (1 + h.snapshot.is_some() as usize);
    let expected = 16 + hlen + 4 * h.tokens + c.blocks * KvBlock::bytes_for(shape) + states + 4;
    if expected != file_len {
        return Err(bad(
            path,
            format!("{file_len} bytes where its header describes {expected} (truncated?)"),
        ));
    }

    let mut tokens = vec![0u32; h.tokens];
    let mut word = [0u8; 4];
    for t in &mut tokens {
        r.take(&mut word).map_err(truncated)?;
        *t = u32::from_le_bytes(word);
    }
    let mut blocks = Vec::with_capacity(c.blocks);
    for _ in 0..c.blocks {
        let mut b = KvBlock::new(shape);
        for values in [false, true] {
            for part in b.store_mut(values).byte_parts_mut() {
                r.take(part).map_err(truncated)?;
            }
        }
        blocks.push(b);
    }
    let mut read_state = |layout: StateLayout| -> Result<RecurrentState> {
        let mut s = RecurrentState::new(layout.layers, layout.conv, layout.ssm);
        for LayerState { conv, ssm } in &mut s.layers {
            r.take(bytemuck::cast_slice_mut(conv)).map_err(truncated)?;
            r.take(bytemuck::cast_slice_mut(ssm)).map_err(truncated)?;
        }
        Ok(s)
    };
    let recurrent = h.recurrent.map(&mut read_state).transpose()?;
    let snapshot = match (h.snapshot, h.recurrent) {
        (Some(p), Some(layout)) => Some((p, read_state(layout)?)),
        _ => None,
    };
    let crc = r.crc.clone().finalize();
    let mut stored = [0u8; 4];
    r.inner.read_exact(&mut stored).map_err(truncated)?;
    if u32::from_le_bytes(stored) != crc {
        return Err(bad(
            path,
            "its checksum does not match (the file is damaged)",
        ));
    }
    let vocab = model.config().vocab;
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(
            path,
            format!("token id {t} outside the vocabulary ({vocab})"),
        ));
    }
    fresh.restore(blocks, h.tokens, recurrent, snapshot);
    if let Some(&first) = tokens.first() {
        check_first_keys(model, &fresh, first, path)?;
    }
    session.restore_state(fresh, tokens);
    Ok(LoadedState {
        tokens: h.tokens,
        extra: h.extra,
    })
}

/// Largest relative difference (‖saved − recomputed‖ / ‖recomputed‖ over one layer's keys of the
/// first position) accepted as "the same weights": storage rounding (f16: ~1e-3, q8_0: ~1e-2)
/// and the prompt kernels' summation order stay far below it; another fine-tune does not.
fn key_tolerance(t: KvType) -> f32 {
    match t {
        KvType::Q8_0 => 0.05,
        _ => 0.01,
    }
}

/// Recomputes the first position's keys with `model` and compares them with `saved`'s.
fn check_first_keys(model: &Model, saved: &KvCache, first: u32, path: &Path) -> Result<()> {
    let mut probe = model.new_cache(1);
    model.forward(&[first], &mut probe, Logits::Last)?;
    let tol = key_tolerance(saved.types().k);
    for layer in 0..saved.n_layers() {
        let (a, b) = (saved.key_row(layer, 0), probe.key_row(layer, 0));
        let diff: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
        let norm: f32 = b.iter().map(|y| y * y).sum();
        let rel = (diff / norm.max(f32::MIN_POSITIVE)).sqrt();
        // NaN (keys that overflowed) counts as a mismatch.
        if rel.is_nan() || rel > tol {
            return Err(Error::InvalidArgument(format!(
                "{} was saved with other weights than this model's (the first token's keys \
                 differ by {:.1} % at layer {layer}): another fine-tune or adapter?",
                path.display(),
                100.0 * rel
            )));
        }
    }
    Ok(())
}
