//! Page-locked host memory mapped into the GPU's address space (`cuMemHostAlloc` with
//! `DEVICEMAP`): kernels store into it directly over the bus, and the host reads it once the
//! kernels that write it are known to be done. The greedy loop's token ring (`greedy.rs`) and
//! the LM head's logits when they go straight to the host (`CudaOptions::head_to_host`).

use crate::device::{cuda_err, Gpu};
use cudarc::driver::{sys, CudaContext};
use std::marker::PhantomData;
use std::sync::Arc;
use trit::Result;

/// `len` values of `T` in mapped page-locked memory, zeroed at allocation.
pub(crate) struct MappedBuf<T: Copy> {
    host: *mut T,
    /// The same memory's device address, for kernel arguments.
    pub(crate) dev: u64,
    len: usize,
    /// The context that allocated it: kept alive, and current when it is freed.
    ctx: Arc<CudaContext>,
    _values: PhantomData<T>,
}

// SAFETY: the memory is read only after the kernels that write it are known to be done (an
// event or the stream waited for); it lives as long as this value.
unsafe impl<T: Copy> Send for MappedBuf<T> {}

impl<T: Copy> MappedBuf<T> {
    pub(crate) fn new(gpu: &Gpu, len: usize) -> Result<MappedBuf<T>> {
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the context", e))?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let mut host = std::ptr::null_mut();
        let mut dev = 0;
        // SAFETY: plain driver calls on out-pointers; the memory is freed in Drop.
        unsafe {
            let r = sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP);
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(cuda_err("allocating mapped host memory", r));
            }
            std::ptr::write_bytes(host as *mut u8, 0, bytes);
            let r = sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0);
            if r != sys::CUresult::CUDA_SUCCESS {
                sys::cuMemFreeHost(host);
                return Err(cuda_err("mapping host memory", r));
            }
        }
        Ok(MappedBuf {
            host: host.cast(),
            dev,
            len,
            ctx: gpu.ctx.clone(),
            _values: PhantomData,
        })
    }

    /// Entry `i`, as the last finished kernel wrote it.
    pub(crate) fn get(&self, i: usize) -> T {
        assert!(i < self.len, "mapped entry {i} of {}", self.len);
        // SAFETY: in bounds; the writer is done (see the Send note).
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }

    /// The first `n` values. Call only after the kernels that write them are done, and drop
    /// the slice before launching more: the GPU writes this memory behind the borrow checker.
    pub(crate) fn head(&self, n: usize) -> &[T] {
        assert!(n <= self.len, "{n} mapped values of {}", self.len);
        // SAFETY: in bounds and initialized (zeroed at allocation); no kernel writes it while
        // the caller holds the slice (above).
        unsafe { std::slice::from_raw_parts(self.host, n) }
    }
}

impl<T: Copy> Drop for MappedBuf<T> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new` in this context; no kernel writes it
        // any more (its owners wait for their steps before dropping it).
        unsafe {
            sys::cuMemFreeHost(self.host.cast());
        }
    }
}
