//! Per-block kernel timestamps for measurements (never for results): with
//! `TRIT_CUDA_DEFINES="-DTRIT_TRACE"` the decode chain's kernels record, per thread block, the
//! `%globaltimer` at their start, after their `griddepcontrol.wait` and at their end
//! (`TRACE_SCOPE` in kernels/common.cuh). [`reset`] before the steps to look at, [`take`]
//! after them; `examples/trace_step.rs` writes them out for `scripts/trace_report.py`.

use cudarc::driver::{CudaModule, CudaSlice, CudaStream, DevicePtr};
use std::sync::{Arc, Mutex};
use trit::{Error, Result};

/// Record areas (kernels/common.cuh TRACE_SLOTS) and records per area.
const SLOTS: usize = 64;
const CAP: usize = 16384;
/// Marks per record (TRACE_MARKS) and bytes of one `TraceRec`.
pub const MARKS: usize = 4;
const REC: usize = 32 + 8 * MARKS + 16;

/// One thread block of one traced kernel.
#[derive(Clone, Copy, Debug)]
pub struct TraceRecord {
    /// Which kernel: 1 streaming GEMV, 2 register GEMV, 3 fused register GEMV, 4 attention,
    /// 5 quantize, 6 advance_position, 7 row_argmax.
    pub kind: u32,
    /// A pointer argument of the launch (weights, cache, input), telling layers apart.
    pub id: u64,
    pub block: u32,
    pub smid: u32,
    /// Nanoseconds (`%globaltimer`): start, after the wait (0 if the block returned before
    /// it), end of thread 0.
    pub start: u64,
    pub waited: u64,
    pub end: u64,
    /// Thread 0's time at the kernel's TRACE_MARK points (0 where not reached).
    pub marks: [u64; MARKS],
}

struct State {
    module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    crate::device::cuda_err(what, e)
}

/// Whether the kernels are compiled with the trace (the define is set).
pub(crate) fn enabled() -> bool {
    std::env::var("TRIT_CUDA_DEFINES")
        .is_ok_and(|d| d.split_whitespace().any(|w| w == "-DTRIT_TRACE"))
}

/// Points the module's trace globals at a fresh buffer (called when the kernels are loaded).
pub(crate) fn install(module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
    let buf = stream
        .alloc_zeros::<u8>(SLOTS * CAP * REC)
        .map_err(|e| err("allocating the trace buffer", e))?;
    let ptr = buf.device_ptr(stream).0;
    let mut g = module
        .get_global("trit_trace_buf", stream)
        .map_err(|e| err("finding trit_trace_buf", e))?;
    stream
        .memcpy_htod(&ptr.to_le_bytes(), &mut g)
        .map_err(|e| err("setting trit_trace_buf", e))?;
    let mut c = module
        .get_global("trit_trace_cap", stream)
        .map_err(|e| err("finding trit_trace_cap", e))?;
    stream
        .memcpy_htod(&(CAP as u32).to_le_bytes(), &mut c)
        .map_err(|e| err("setting trit_trace_cap", e))?;
    *STATE.lock().unwrap_or_else(|p| p.into_inner()) = Some(State {
        module: module.clone(),
        stream: stream.clone(),
        buf,
    });
    reset()
}

/// The installed trace, or the error that says how to get one.
fn traced(guard: &Option<State>) -> Result<&State> {
    guard
        .as_ref()
        .ok_or_else(|| Error::Unsupported("no traced GPU (TRIT_CUDA_DEFINES=-DTRIT_TRACE)".into()))
}

/// Forgets what was recorded so far (waits for the stream first).
pub fn reset() -> Result<()> {
    let guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let st = traced(&guard)?;
    st.stream
        .synchronize()
        .map_err(|e| err("waiting for the GPU", e))?;
    let mut n = st
        .module
        .get_global("trit_trace_n", &st.stream)
        .map_err(|e| err("finding trit_trace_n", e))?;
    st.stream
        .memset_zeros(&mut n)
        .map_err(|e| err("clearing trit_trace_n", e))?;
    st.stream
        .synchronize()
        .map_err(|e| err("waiting for the GPU", e))
}

/// The records since the last [`reset`] (waits for the stream first).
pub fn take() -> Result<Vec<TraceRecord>> {
    let guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let st = traced(&guard)?;
    let n = st
        .module
        .get_global("trit_trace_n", &st.stream)
        .map_err(|e| err("finding trit_trace_n", e))?;
    let counts = st
        .stream
        .clone_dtoh(&n)
        .map_err(|e| err("reading trit_trace_n", e))?;
    let bytes = st
        .stream
        .clone_dtoh(&st.buf)
        .map_err(|e| err("reading the trace", e))?;
    parse(&counts, &bytes)
}

/// The records of a read-back buffer (`bytes`: SLOTS areas of CAP records of REC bytes, laid out
/// as kernels/common.cuh's TraceRec) and its per-area counters (`counts`: one u32 per 128
/// bytes), ordered by start.
fn parse(counts: &[u8], bytes: &[u8]) -> Result<Vec<TraceRecord>> {
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let half = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let mut out = Vec::new();
    for slot in 0..SLOTS {
        let have = half(counts, slot * 32 * 4) as usize;
        if have > CAP {
            return Err(Error::Unsupported(format!(
                "trace area {slot} overflowed ({have} records for {CAP}): trace fewer steps"
            )));
        }
        for i in 0..have {
            let r = &bytes[(slot * CAP + i) * REC..][..REC];
            out.push(TraceRecord {
                id: word(r, 0),
                start: word(r, 8),
                waited: word(r, 16),
                end: word(r, 24),
                marks: std::array::from_fn(|k| word(r, 32 + 8 * k)),
                kind: half(r, 32 + 8 * MARKS),
                block: half(r, 36 + 8 * MARKS),
                smid: half(r, 40 + 8 * MARKS),
            });
        }
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(buf: &mut [u8], at: usize, vals: [u64; 4 + MARKS], small: [u32; 3]) {
        let r = &mut buf[at * REC..][..REC];
        for (k, v) in vals.iter().enumerate() {
            r[8 * k..8 * k + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (k, v) in small.iter().enumerate() {
            let o = 8 * (4 + MARKS) + 4 * k;
            r[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
    }

    #[test]
    fn records_are_read_from_every_area_in_start_order() {
        let mut counts = vec![0u8; SLOTS * 32 * 4];
        let mut bytes = vec![0u8; SLOTS * CAP * REC];
        counts[0] = 1;
        counts[5 * 128] = 2;
        record(
            &mut bytes,
            0,
            [0xab, 300, 310, 900, 320, 0, 0, 0],
            [4, 0, 17],
        );
        record(
            &mut bytes,
            5 * CAP,
            [0xcd, 200, 210, 800, 0, 0, 0, 0],
            [1, 5, 3],
        );
        record(
            &mut bytes,
            5 * CAP + 1,
            [0xcd, 100, 0, 150, 0, 0, 0, 0],
            [1, 69, 4],
        );
        let r = parse(&counts, &bytes).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            r.iter().map(|r| r.start).collect::<Vec<_>>(),
            [100, 200, 300]
        );
        let a = r[2];
        assert_eq!((a.kind, a.id, a.block, a.smid), (4, 0xab, 0, 17));
        assert_eq!((a.waited, a.end, a.marks[0]), (310, 900, 320));
        assert_eq!((r[0].block, r[0].smid, r[0].waited), (69, 4, 0));
    }

    #[test]
    fn the_layout_matches_the_kernels() {
        let src = include_str!("kernels/common.cuh");
        assert!(src.contains(&format!("#define TRACE_SLOTS {SLOTS}\n")));
        assert!(src.contains(&format!("#define TRACE_MARKS {MARKS}\n")));
        // id, t0, tw, te, marks, then kind, block, smid, pad.
        assert!(src.contains("unsigned long long id, t0, tw, te, mark[TRACE_MARKS];"));
        assert!(src.contains("unsigned kind, block, smid, pad;"));
        assert_eq!(REC, 8 * (4 + MARKS) + 4 * 4);
    }

    #[test]
    fn an_overflowed_area_is_an_error() {
        let mut counts = vec![0u8; SLOTS * 32 * 4];
        counts[3 * 128..3 * 128 + 4].copy_from_slice(&(CAP as u32 + 1).to_le_bytes());
        let bytes = vec![0u8; SLOTS * CAP * REC];
        let e = parse(&counts, &bytes).unwrap_err().to_string();
        assert!(e.contains("overflowed"), "{e}");
    }
}
