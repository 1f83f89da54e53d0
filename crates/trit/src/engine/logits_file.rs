//! llama-perplexity's log-probability file (`--kl-divergence-base`), so a base model's
//! distributions written by trit can be read by llama.cpp and the other way round.
//!
//! Layout (little-endian): the magic `_logits_`; `n_ctx`, `n_vocab`, `n_chunk` as i32; the
//! `n_chunk × n_ctx` evaluated token ids as i32; then, chunk after chunk, one record for each
//! scored position (`n_ctx − 1 − n_ctx/2` per chunk: the second half of the window, as
//! perplexity scores it). A record is `2·⌈n_vocab/2⌉ + 4` u16: two f32 (`scale`,
//! `min_log_prob`) and one u16 per token, `log p = scale · code + min_log_prob`, the codes
//! spanning the 16 nats below the row's maximum (anything lower is code 0).

use crate::{Error, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 values in one record of a vocabulary of `n_vocab` tokens.
pub fn record_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Positions of a window of `n_ctx` tokens that get a record.
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// What a file holds before its records.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitsHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// `n_chunk × n_ctx` token ids (the first of each window as the text has it; perplexity
    /// puts BOS there when the model adds one).
    pub tokens: Vec<u32>,
}

impl LogitsHeader {
    fn file_len(&self) -> u64 {
        let records = (self.n_chunk * scored_per_chunk(self.n_ctx)) as u64;
        20 + 4 * self.tokens.len() as u64 + 2 * records * record_len(self.n_vocab) as u64
    }
}

/// Encodes `logits` as a record (`out.len() == record_len(logits.len())`), as llama.cpp does:
/// the log-softmax in f32 from the row's maximum, codes rounded to nearest.
pub fn encode_row(logits: &[f32], out: &mut [u16]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let min = logits
        .iter()
        .fold(f32::INFINITY, |m, &x| m.min(x))
        .max(max - 16.0);
    let sum: f64 = logits.iter().map(|&x| (x - max).exp() as f64).sum();
    let log_sum = sum.ln() as f32;
    let scale = (max - min) / 65535.0;
    let min_log_prob = min - max - log_sum;
    let (head, codes) = out.split_at_mut(4);
    for (pair, v) in head.chunks_exact_mut(2).zip([scale, min_log_prob]) {
        let b = v.to_le_bytes();
        pair[0] = u16::from_le_bytes([b[0], b[1]]);
        pair[1] = u16::from_le_bytes([b[2], b[3]]);
    }
    codes.fill(0);
    if scale > 0.0 {
        let inv = 1.0 / scale;
        for (c, &x) in codes.iter_mut().zip(logits) {
            if x > min {
                *c = (inv * (x - min)).round().min(65535.0) as u16;
            }
        }
    }
}

/// A record read back: the log-probability of each token.
pub struct EncodedRow<'a> {
    pub scale: f32,
    pub min_log_prob: f32,
    pub codes: &'a [u16],
}

impl<'a> EncodedRow<'a> {
    pub fn new(record: &'a [u16], n_vocab: usize) -> EncodedRow<'a> {
        let f = |i: usize| {
            let (lo, hi) = (record[i].to_le_bytes(), record[i + 1].to_le_bytes());
            f32::from_le_bytes([lo[0], lo[1], hi[0], hi[1]])
        };
        EncodedRow {
            scale: f(0),
            min_log_prob: f(2),
            codes: &record[4..4 + n_vocab],
        }
    }

    pub fn log_prob(&self, token: usize) -> f32 {
        self.scale * self.codes[token] as f32 + self.min_log_prob
    }
}

/// Writes a file: the header at once, then records as they are computed.
pub struct LogitsWriter {
    path: String,
    out: BufWriter<File>,
    n_vocab: usize,
    record: Vec<u16>,
}

impl LogitsWriter {
    pub fn create(path: &Path, header: &LogitsHeader) -> Result<LogitsWriter> {
        let err = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(err)?);
        let mut head = MAGIC.to_vec();
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            head.extend((v as i32).to_le_bytes());
        }
        for &t in &header.tokens {
            head.extend((t as i32).to_le_bytes());
        }
        out.write_all(&head).map_err(err)?;
        Ok(LogitsWriter {
            path: path.display().to_string(),
            out,
            n_vocab: header.n_vocab,
            record: vec![0; record_len(header.n_vocab)],
        })
    }

    pub fn write_row(&mut self, logits: &[f32]) -> Result<()> {
        debug_assert_eq!(logits.len(), self.n_vocab);
        encode_row(logits, &mut self.record);
        let bytes: Vec<u8> = self.record.iter().flat_map(|c| c.to_le_bytes()).collect();
        let path = &self.path;
        self.out.write_all(&bytes).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })
    }

    pub fn finish(mut self) -> Result<()> {
        let path = &self.path;
        self.out.flush().map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })
    }
}

/// Reads a file: the header (checked against the file's length) at open, records in order.
pub struct LogitsReader {
    path: String,
    rows_read: usize,
    input: BufReader<File>,
    pub header: LogitsHeader,
    bytes: Vec<u8>,
    record: Vec<u16>,
}

impl LogitsReader {
    pub fn open(path: &Path) -> Result<LogitsReader> {
        let name = path.display().to_string();
        let io = |source| Error::Io {
            path: name.clone(),
            source,
        };
        let bad = |why: String| Error::Format(format!("{name}: {why}"));
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut input = BufReader::new(file);
        let mut head = [0u8; 20];
        if len < 20 || input.read_exact(&mut head).is_err() || &head[..8] != MAGIC {
            return Err(bad(
                "not a llama-perplexity log-probability file (no `_logits_` header)".into(),
            ));
        }
        let int = |i: usize| i32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        let (n_ctx, n_vocab, n_chunk) = (int(0), int(1), int(2));
        if n_ctx < 4 || n_vocab < 1 || n_chunk < 1 {
            return Err(bad(format!(
                "impossible header: context {n_ctx}, vocabulary {n_vocab}, {n_chunk} chunks"
            )));
        }
        let (n_ctx, n_vocab, n_chunk) = (n_ctx as usize, n_vocab as usize, n_chunk as usize);
        let mut header = LogitsHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: Vec::new(),
        };
        // Checked before reading anything sized by the header.
        let n_tokens = n_ctx as u64 * n_chunk as u64;
        let want = 20
            + 4 * n_tokens
            + 2 * n_chunk as u64 * scored_per_chunk(n_ctx) as u64 * record_len(n_vocab) as u64;
        if len != want {
            return Err(bad(format!(
                "{len} bytes, but a file of {n_chunk} chunks of {n_ctx} tokens over a vocabulary \
                 of {n_vocab} has {want} (truncated or not this format)"
            )));
        }
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        input.read_exact(&mut raw).map_err(io)?;
        header.tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect();
        if let Some(t) = header.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(bad(format!(
                "token id {} outside its vocabulary of {n_vocab}",
                *t as i32
            )));
        }
        debug_assert_eq!(header.file_len(), len);
        Ok(LogitsReader {
            path: name,
            rows_read: 0,
            input,
            bytes: vec![0; 2 * record_len(n_vocab)],
            record: vec![0; record_len(n_vocab)],
            header,
        })
    }

    /// The next record.
    pub fn next_row(&mut self) -> Result<EncodedRow<'_>> {
        let path = &self.path;
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        for (c, b) in self.record.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *c = u16::from_le_bytes([b[0], b[1]]);
        }
        self.rows_read += 1;
        let row = EncodedRow::new(&self.record, self.header.n_vocab);
        // A damaged record would turn every statistic into NaN; say where instead.
        if !(row.scale.is_finite() && row.scale >= 0.0 && row.min_log_prob.is_finite()) {
            return Err(Error::Format(format!(
                "{}: record {} is damaged (scale {}, offset {})",
                self.path, self.rows_read, row.scale, row.min_log_prob
            )));
        }
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_softmax(row: &[f32]) -> Vec<f64> {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let lse = row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln()
            + max;
        row.iter().map(|&x| x as f64 - lse).collect()
    }

    #[test]
    fn a_record_keeps_the_log_probabilities_within_half_a_step() {
        let row: Vec<f32> = crate::test_values::uniform(3, 999)
            .iter()
            .map(|u| u * 15.0 + 5.0)
            .collect();
        let mut rec = vec![0u16; record_len(row.len())];
        assert_eq!(rec.len(), 1004);
        encode_row(&row, &mut rec);
        let r = EncodedRow::new(&rec, row.len());
        let exact = log_softmax(&row);
        let top = exact.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        assert!((r.scale as f64 - 16.0 / 65535.0).abs() < 1e-9);
        for (i, &e) in exact.iter().enumerate() {
            if e > top - 16.0 {
                assert!((r.log_prob(i) as f64 - e).abs() < 2e-4, "{i}: {e}");
            } else {
                assert_eq!(r.codes[i], 0);
            }
        }
        // A flat row has no spread: every code 0 and the log-probability in min_log_prob.
        encode_row(&[2.0; 4], &mut rec[..8]);
        let r = EncodedRow::new(&rec[..8], 4);
        assert_eq!((r.scale, r.codes), (0.0, &[0u16; 4][..]));
        assert!((r.min_log_prob - -(4f32.ln())).abs() < 1e-6);
    }

    #[test]
    fn a_written_file_reads_back_and_a_damaged_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("trit-logits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.kld");
        let header = LogitsHeader {
            n_ctx: 8,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..16).map(|i| i % 5).collect(),
        };
        let mut w = LogitsWriter::create(&path, &header).unwrap();
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|i| vec![i as f32, 1.0, -2.0, 0.5, 3.0])
            .collect();
        for row in &rows {
            w.write_row(row).unwrap();
        }
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, header.file_len());
        assert_eq!(&bytes[..8], b"_logits_");
        let mut r = LogitsReader::open(&path).unwrap();
        assert_eq!(r.header, header);
        for row in &rows {
            let exact = log_softmax(row);
            let got = r.next_row().unwrap();
            for (i, e) in exact.iter().enumerate() {
                assert!((got.log_prob(i) as f64 - e).abs() < 2e-4);
            }
        }
        assert!(r.next_row().is_err(), "no seventh record");
        let refused = |b: &[u8]| {
            std::fs::write(&path, b).unwrap();
            LogitsReader::open(&path)
                .err()
                .expect("refused")
                .to_string()
        };
        assert!(refused(&bytes[..bytes.len() - 1]).contains("truncated"));
        assert!(refused(b"GGUF....").contains("no `_logits_` header"));
        let mut big = bytes.clone();
        big[12..16].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(refused(&big).contains("truncated"));
        let mut neg = bytes.clone();
        neg[8..12].copy_from_slice(&(-5i32).to_le_bytes());
        assert!(refused(&neg).contains("impossible header"));
        let mut tok = bytes.clone();
        tok[20..24].copy_from_slice(&9i32.to_le_bytes());
        assert!(refused(&tok).contains("outside its vocabulary"));
        // A record whose scale is not a number opens, and is refused when read.
        let mut nan = bytes.clone();
        let second = 20 + 4 * 16 + 2 * record_len(5);
        nan[second..second + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        std::fs::write(&path, &nan).unwrap();
        let mut r = LogitsReader::open(&path).unwrap();
        assert!(r.next_row().is_ok());
        let e = r.next_row().err().expect("refused").to_string();
        assert!(e.contains("record 2 is damaged"), "{e}");
        // Random damage: every copy opens and reads to an end or an error, never a panic.
        let mut rng = crate::test_values::TestRng(11);
        for i in 0..300 {
            let mut b = bytes.clone();
            match i % 3 {
                0 => b.truncate(rng.below(bytes.len())),
                _ => {
                    let at = rng.below(b.len());
                    b[at] = rng.next_u64() as u8;
                }
            }
            std::fs::write(&path, &b).unwrap();
            if let Ok(mut r) = LogitsReader::open(&path) {
                while let Ok(row) = r.next_row() {
                    assert!(row.scale.is_finite() && row.min_log_prob.is_finite());
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
