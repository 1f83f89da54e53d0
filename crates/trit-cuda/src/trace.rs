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

/// Forgets what was recorded so far (waits for the stream first).
pub fn reset() -> Result<()> {
    let guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let st = guard.as_ref().ok_or_else(|| {
        Error::Unsupported("no traced GPU (TRIT_CUDA_DEFINES=-DTRIT_TRACE)".into())
    })?;
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
    let st = guard.as_ref().ok_or_else(|| {
        Error::Unsupported("no traced GPU (TRIT_CUDA_DEFINES=-DTRIT_TRACE)".into())
    })?;
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
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let half = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let mut out = Vec::new();
    for slot in 0..SLOTS {
        let have = half(&counts, slot * 32 * 4) as usize;
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
