//! What the dense, hybrid and batched decode steps share around their kernels: capturing a
//! step into a CUDA graph and replaying it, and copying logits back through a pinned buffer.

use crate::device::{cuda_err, Gpu};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream, DevicePtr, PinnedHostSlice};
use std::sync::Arc;
use trit::{Error, Result};

/// A captured step. Used only under its model's mutex.
pub(crate) struct StepGraph(CudaGraph);
// SAFETY: the graph's handles are plain driver objects; every use goes through a model's
// state, which that model's `Mutex` serializes.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Records the launches `enqueue` makes on `stream` (nothing runs); `what` names the step
    /// in errors.
    pub(crate) fn capture(
        stream: &Arc<CudaStream>,
        what: &str,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<StepGraph> {
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| cuda_err("starting graph capture", e))?;
        let enq = enqueue();
        // Capture must end even when enqueueing failed, or the stream stays in capture mode.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        enq?;
        match graph {
            Ok(Some(g)) => Ok(StepGraph(g)),
            Ok(None) => Err(Error::Unsupported(
                "CUDA: graph capture recorded nothing".into(),
            )),
            Err(e) => Err(cuda_err(&format!("capturing the {what}"), e)),
        }
    }

    pub(crate) fn launch(&self, what: &str) -> Result<()> {
        self.0
            .launch()
            .map_err(|e| cuda_err(&format!("launching the {what} graph"), e))
    }
}

/// A page-locked host buffer for `n` logits. Plain page-locked memory, not cudarc's
/// `alloc_pinned`: that one is write-combined, which the host reads uncached, and every step
/// reads its logits back from here.
pub(crate) fn alloc_host_logits(gpu: &Gpu, n: usize) -> Result<PinnedHostSlice<f32>> {
    // SAFETY: the buffer is read only after a copy into it and a stream synchronize
    // (copy_to_pinned).
    unsafe { gpu.ctx.alloc_pinned_with_flags::<f32>(n, 0) }
        .map_err(|e| cuda_err("allocating pinned memory", e))
}

/// Copies `src` into the start of the page-locked `host` buffer, waits for it, and returns the
/// copied values.
pub(crate) fn copy_to_pinned<'a>(
    gpu: &Gpu,
    src: &impl DevicePtr<f32>,
    host: &'a mut PinnedHostSlice<f32>,
) -> Result<&'a [f32]> {
    // cudarc keeps the errors of calls that return none (frees, event records) and reports
    // them at the next call: name them as such, not as this copy's.
    gpu.ctx
        .check_err()
        .map_err(|e| cuda_err("an earlier operation (reported before copying logits)", e))?;
    let n = src.len();
    if n > host.len() {
        return Err(Error::InvalidArgument(format!(
            "{n} logits for a pinned buffer of {}",
            host.len()
        )));
    }
    // The destination is the first `n` values: cudarc's device-to-host copy moves as many
    // bytes as the destination holds, so the whole pinned buffer would read past `src`.
    let dst = &mut host
        .as_mut_slice()
        .map_err(|e| cuda_err("waiting for pinned logits", e))?[..n];
    gpu.stream
        .memcpy_dtoh(src, dst)
        .map_err(|e| cuda_err("copying logits to the host", e))?;
    gpu.sync()?;
    host.as_slice()
        .map(|v| &v[..n])
        .map_err(|e| cuda_err("reading pinned logits", e))
}
