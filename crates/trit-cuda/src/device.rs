//! The GPU: driver and NVRTC loaded at run time, the kernels compiled once per source and
//! architecture (PTX cached on disk), and a launch helper that checks every call.

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use trit::{Error, Result};

/// Every kernel source, compiled as one program (`common.cuh` first: shared helpers).
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("gemv.cu", include_str!("kernels/gemv.cu")),
    ("gemv_dense.cu", include_str!("kernels/gemv_dense.cu")),
    ("gemv_stream.cu", include_str!("kernels/gemv_stream.cu")),
    (
        "decode_persist.cu",
        include_str!("kernels/decode_persist.cu"),
    ),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("prefill.cu", include_str!("kernels/prefill.cu")),
    ("flash_prefill.cu", include_str!("kernels/flash_prefill.cu")),
    ("batch.cu", include_str!("kernels/batch.cu")),
    ("batch_gemm.cu", include_str!("kernels/batch_gemm.cu")),
    ("deltanet.cu", include_str!("kernels/deltanet.cu")),
    (
        "hybrid_attention.cu",
        include_str!("kernels/hybrid_attention.cu"),
    ),
    ("hadamard.cu", include_str!("kernels/hadamard.cu")),
    ("topk.cu", include_str!("kernels/topk.cu")),
    // After topk.cu: its order_key.
    ("greedy.cu", include_str!("kernels/greedy.cu")),
    // The prompt path's chunk recurrence (hybrids).
    (
        "deltanet_chunk.cu",
        include_str!("kernels/deltanet_chunk.cu"),
    ),
    // The decode step's attention + o in one kernel at short contexts (`attention_o.rs`).
    ("attention_o.cu", include_str!("kernels/attention_o.cu")),
];

/// Kernels the decode step and the batched prefill launch (all must exist in the compiled
/// module).
pub const KERNELS: &[&str] = &[
    "mlp_persist_r4_f16",
    "mlp_persist_r4_f32",
    "ternary_gemv_r2_s1_f16",
    "ternary_gemv_r2_s2_f16",
    "ternary_gemv_r2_s3_f16",
    "ternary_gemv_r2_s4_f16",
    "ternary_gemv_r4_s1_f16",
    "ternary_gemv_r4_s2_f16",
    "ternary_gemv_r4_s3_f16",
    "ternary_gemv_r4_s4_f16",
    "ternary_gemv_r8_s1_f16",
    "ternary_gemv_r8_s2_f16",
    "ternary_gemv_r8_s3_f16",
    "ternary_gemv_r8_s4_f16",
    "ternary_gemv_r2_s1_f32",
    "ternary_gemv_r2_s2_f32",
    "ternary_gemv_r2_s3_f32",
    "ternary_gemv_r2_s4_f32",
    "ternary_gemv_r4_s1_f32",
    "ternary_gemv_r4_s2_f32",
    "ternary_gemv_r4_s3_f32",
    "ternary_gemv_r4_s4_f32",
    "ternary_gemv_r8_s1_f32",
    "ternary_gemv_r8_s2_f32",
    "ternary_gemv_r8_s3_f32",
    "ternary_gemv_r8_s4_f32",
    "dense_rows_f32",
    "dense_rows_f16",
    "dense_rows_bf16",
    "embed_ternary_f16",
    "embed_ternary_f32",
    "embed_dense",
    "embed_dense_f16",
    "embed_dense_bf16",
    "rms_norm_quant",
    "quantize_vec",
    "glu_quant",
    "glu_quant_v4",
    "advance_position",
    "attn_decode",
    "rms_norm_quant_v4",
    "ternary_gemm_f16",
    "ternary_gemm_f32",
    "rope_append_batch",
    "flash_prefill_e1",
    "flash_prefill_e2",
    "flash_prefill_e3",
    "flash_prefill_e4",
    "flash_prefill_e5",
    "flash_prefill_e6",
    "flash_prefill_e7",
    "flash_prefill_e8",
    "ternary_gemv_fused_r2_s1_f16",
    "ternary_gemv_fused_r2_s2_f16",
    "ternary_gemv_fused_r2_s4_f16",
    "ternary_gemv_fused_r4_s1_f16",
    "ternary_gemv_fused_r4_s2_f16",
    "ternary_gemv_fused_r4_s4_f16",
    "ternary_gemv_fused_r8_s1_f16",
    "ternary_gemv_fused_r8_s2_f16",
    "ternary_gemv_fused_r8_s4_f16",
    "ternary_gemv_fused_r2_s1_f32",
    "ternary_gemv_fused_r2_s2_f32",
    "ternary_gemv_fused_r2_s4_f32",
    "ternary_gemv_fused_r4_s1_f32",
    "ternary_gemv_fused_r4_s2_f32",
    "ternary_gemv_fused_r4_s4_f32",
    "ternary_gemv_fused_r8_s1_f32",
    "ternary_gemv_fused_r8_s2_f32",
    "ternary_gemv_fused_r8_s4_f32",
    "ternary_gemv_stream_r2_s1_f16",
    "ternary_gemv_stream_r2_s2_f16",
    "ternary_gemv_stream_r2_s4_f16",
    "ternary_gemv_stream_r4_s1_f16",
    "ternary_gemv_stream_r4_s2_f16",
    "ternary_gemv_stream_r4_s4_f16",
    "ternary_gemv_stream_r8_s1_f16",
    "ternary_gemv_stream_r8_s2_f16",
    "ternary_gemv_stream_r8_s4_f16",
    "ternary_gemv_stream_r2_s1_f32",
    "ternary_gemv_stream_r2_s2_f32",
    "ternary_gemv_stream_r2_s4_f32",
    "ternary_gemv_stream_r4_s1_f32",
    "ternary_gemv_stream_r4_s2_f32",
    "ternary_gemv_stream_r4_s4_f32",
    "ternary_gemv_stream_r8_s1_f32",
    "ternary_gemv_stream_r8_s2_f32",
    "ternary_gemv_stream_r8_s4_f32",
    "ternary_gemv_stream_rot_r2_s1_f16",
    "ternary_gemv_stream_rot_r2_s2_f16",
    "ternary_gemv_stream_rot_r2_s4_f16",
    "ternary_gemv_stream_rot_r4_s1_f16",
    "ternary_gemv_stream_rot_r4_s2_f16",
    "ternary_gemv_stream_rot_r4_s4_f16",
    "ternary_gemv_stream_rot_r8_s1_f16",
    "ternary_gemv_stream_rot_r8_s2_f16",
    "ternary_gemv_stream_rot_r8_s4_f16",
    "ternary_gemv_stream_rot_r2_s1_f32",
    "ternary_gemv_stream_rot_r2_s2_f32",
    "ternary_gemv_stream_rot_r2_s4_f32",
    "ternary_gemv_stream_rot_r4_s1_f32",
    "ternary_gemv_stream_rot_r4_s2_f32",
    "ternary_gemv_stream_rot_r4_s4_f32",
    "ternary_gemv_stream_rot_r8_s1_f32",
    "ternary_gemv_stream_rot_r8_s2_f32",
    "ternary_gemv_stream_rot_r8_s4_f32",
    "ternary_gemv_stream_pend_r4_s1_f16",
    "ternary_gemv_stream_pend_r4_s2_f16",
    "ternary_gemv_stream_pend_r4_s4_f16",
    "ternary_gemv_stream_pend_r4_s1_f32",
    "ternary_gemv_stream_pend_r4_s2_f32",
    "ternary_gemv_stream_pend_r4_s4_f32",
    "attn_decode_e1",
    "attn_decode_e2",
    "attn_decode_e3",
    "attn_decode_e4",
    "attn_decode_e5",
    "attn_decode_e6",
    "attn_decode_e7",
    "attn_o_decode_e2_f16",
    "attn_o_decode_e2_f32",
    "attn_o_decode_e4_f16",
    "attn_o_decode_e4_f32",
    "rope_append_rows",
    "attn_rows_e1",
    "attn_rows_e2",
    "attn_rows_e3",
    "attn_rows_e4",
    "attn_rows_e5",
    "attn_rows_e6",
    "attn_rows_e7",
    "attn_rows_e8",
    "ternary_gemm_small_f16",
    "ternary_gemm_small_f32",
    "deltanet_conv_silu",
    "deltanet_recur",
    "deltanet_gated_norm",
    "attn_decode_cl_e2",
    "attn_decode_cl_e4",
    "hybrid_attn_prep",
    "hybrid_attn_decode",
    "hybrid_attn_prep_rows",
    "hybrid_attn_decode_rows",
    "hybrid_attn_prep_slots",
    "hybrid_attn_decode_slots",
    "hybrid_attn_step_e4",
    "hybrid_attn_step",
    "hybrid_attn_step_e4_slots",
    "hybrid_attn_step_slots",
    "hadamard_quant",
    "deltanet_step",
    "deltanet_step_hoisted",
    "deltanet_step_early",
    "deltanet_step_held",
    "deltanet_step_pair",
    "deltanet_step_slots",
    "deltanet_gates_rows",
    "deltanet_chunk",
    "deltanet_window_store",
    "row_top_parts",
    "row_top_merge",
    "row_argmax",
    "sample_candidates",
    "take_argmax",
    "ternary_gemm_small_wide_f16",
    "ternary_gemm_small_wide_f32",
    "ternary_gemm_small_ring_f16",
    "ternary_gemm_small_ring_f32",
];

/// Kernels (name prefixes) that take dynamic shared memory beyond the default 48 KB.
const DYNAMIC_SMEM_KERNELS: &[&str] = &[
    "ternary_gemv_stream_",
    "mlp_persist_",
    "ternary_gemm_small_ring_",
];
/// Bytes of the opt-in shared memory left for those kernels' static arrays (the streaming
/// GEMV's are at most 1,152: its scratch and the split reduction of 32 warps × 8 rows).
const STATIC_SMEM_ROOM: usize = 4096;

/// The program text NVRTC compiles.
pub fn program_source() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("// ---- {name}\n{text}\n"));
    }
    s
}

pub fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Unsupported(format!("CUDA: {what} failed: {e:?}"))
}

/// Whether the CUDA driver library can be loaded on this machine (no panic when it cannot).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the kernel program for `arch` (e.g. "compute_90") with NVRTC. Public so a test can
/// check every kernel compiles on a machine that has NVRTC but no GPU.
pub fn compile(arch: &str) -> Result<String> {
    compile_with(arch, &extra_defines())
}

/// [`compile`] with the given `-DNAME=VALUE` options instead of `TRIT_CUDA_DEFINES`'s.
pub fn compile_with(arch: &str, defines: &[String]) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::Unsupported(
            "CUDA: the NVRTC library (libnvrtc.so) was not found; install the CUDA toolkit or \
             the nvidia-cuda-nvrtc package and put its lib folder on LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    options.extend(defines.iter().cloned());
    let opts = CompileOptions {
        options,
        name: Some("trit_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(program_source(), opts)
        .map_err(|e| Error::Unsupported(format!("CUDA: compiling the kernels failed: {e}")))?;
    Ok(ptx.to_src())
}

/// `TRIT_CUDA_DEFINES="-DNAME=VALUE ..."`: compile-time tunables of the kernels (e.g.
/// `-DSG_MIN_BLOCKS=3`), for measuring variants without a rebuild. Part of the cache key.
/// Also the tunables whose value the host must know too (the streaming GEMV's slots per warp
/// size its shared memory).
fn extra_defines() -> Vec<String> {
    let mut d: Vec<String> = std::env::var("TRIT_CUDA_DEFINES")
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let st = crate::gemv::stream_stages();
    if st != crate::gemv::STREAM_STAGES {
        d.push(format!("-DSTREAM_STAGES={st}"));
    }
    d
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TRIT_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("trit").join("cuda"))
}

/// PTX for `arch`, from the disk cache (keyed by a hash of the source and the architecture)
/// or compiled now and stored there. A cache that cannot be written is not an error.
fn ptx_for(arch: &str) -> Result<String> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    program_source().hash(&mut h);
    arch.hash(&mut h);
    extra_defines().hash(&mut h);
    let file = cache_dir().map(|d| d.join(format!("kernels-{arch}-{:016x}.ptx", h.finish())));
    if let Some(f) = &file {
        if let Ok(text) = std::fs::read_to_string(f) {
            return Ok(text);
        }
    }
    let ptx = compile(arch)?;
    if let Some(f) = &file {
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    Ok(ptx)
}

/// One kernel argument, kept alive in a list until the launch has read it.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub sm_count: u32,
    /// Compute capability (major, minor); the prefill GEMM's int8 tensor-core
    /// instructions need 8.0 or newer.
    pub compute_capability: (i32, i32),
    /// Launch with programmatic dependent launch (sm_90+, unless TRIT_CUDA_PDL=0).
    pub pdl: bool,
    /// Most dynamic shared memory one block may use (the opt-in limit; set on the kernels
    /// that take dynamic shared memory).
    pub max_dyn_smem: usize,
    funcs: HashMap<&'static str, CudaFunction>,
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels. Errors (never panics) without a driver.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        if !driver_present() {
            return Err(Error::Unsupported(
                "CUDA: no NVIDIA driver library (libcuda.so) was found on this machine; \
                 --device cuda needs an NVIDIA GPU and its driver"
                    .into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err("opening the device", e))?;
        // One stream, no cross-stream events: cudarc's per-buffer event tracking would
        // record events inside graph capture.
        // SAFETY: every launch and copy of this backend goes to the one stream below.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| cuda_err("creating a stream", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| cuda_err("reading the compute capability", e))?;
        if major < 7 {
            return Err(Error::Unsupported(format!(
                "CUDA: compute capability {major}.{minor} is too old (7.0 or newer needed)"
            )));
        }
        let name = ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let sm_count =
            ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| cuda_err("reading the multiprocessor count", e))? as u32;
        let arch = format!("compute_{major}{minor}");
        let ptx = ptx_for(&arch)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| cuda_err("loading the kernel module", e))?;
        if crate::trace::enabled() {
            crate::trace::install(&module, &stream)?;
        }
        let max_dyn_smem = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| cuda_err("reading the shared memory limit", e))?;
        let mut funcs = HashMap::new();
        for name in KERNELS.iter() {
            let f = module
                .load_function(name)
                .map_err(|e| cuda_err(&format!("finding kernel {name}"), e))?;
            if DYNAMIC_SMEM_KERNELS.iter().any(|p| name.starts_with(p)) {
                // Room for the kernel's static shared memory next to the dynamic part.
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_dyn_smem - STATIC_SMEM_ROOM as i32,
                )
                .map_err(|e| cuda_err(&format!("allowing shared memory for {name}"), e))?;
            }
            funcs.insert(*name, f);
        }
        let pdl = major >= 9 && std::env::var("TRIT_CUDA_PDL").map_or(true, |v| v != "0");
        Ok(Gpu {
            ctx,
            stream,
            name,
            sm_count,
            compute_capability: (major, minor),
            pdl,
            max_dyn_smem: (max_dyn_smem - STATIC_SMEM_ROOM as i32).max(0) as usize,
            funcs,
        })
    }

    /// Blocks of `threads` threads of `kernel` that fit on one multiprocessor at once (sizes
    /// the persistent GEMV grid so every block is resident).
    pub fn resident_blocks(&self, kernel: &str, threads: u32) -> Result<u32> {
        self.resident_blocks_smem(kernel, threads, 0)
    }

    /// [`resident_blocks`](Self::resident_blocks) with `smem` bytes of dynamic shared memory.
    pub fn resident_blocks_smem(&self, kernel: &str, threads: u32, smem: usize) -> Result<u32> {
        let f = self
            .funcs
            .get(kernel)
            .ok_or_else(|| Error::Unsupported(format!("CUDA: no kernel named {kernel}")))?;
        f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_err(|e| cuda_err("reading kernel occupancy", e))
            .map(|n| n.max(1))
    }

    /// Launches `kernel` on the stream; the launch's own error is returned (asynchronous
    /// faults surface at the next synchronize, which every caller checks).
    pub fn launch(&self, kernel: &str, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        self.launch_smem(kernel, grid, block, 0, args)
    }

    /// [`launch`](Self::launch) with `smem` bytes of dynamic shared memory (kernels listed in
    /// `DYNAMIC_SMEM_KERNELS` may take up to `max_dyn_smem`).
    pub fn launch_smem(
        &self,
        kernel: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_grid(kernel, (grid.0, grid.1, 1), block, smem, args)
    }

    /// [`launch_smem`](Self::launch_smem) on a three-dimensional grid.
    pub fn launch_3d(
        &self,
        kernel: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_grid(kernel, grid, block, smem, args)
    }

    fn launch_grid(
        &self,
        kernel: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let grid = (grid.0.max(1), grid.1.max(1), grid.2.max(1));
        let f = self
            .funcs
            .get(kernel)
            .ok_or_else(|| Error::Unsupported(format!("CUDA: no kernel named {kernel}")))?;
        if self.pdl {
            return self.launch_pdl(kernel, f, grid, block, smem, args);
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the argument lists are written against the kernel signatures in
        // kernels/*.cu, and every pointer is a live allocation of the sizes those kernels index.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err(&format!("launching {kernel}"), e))?;
        Ok(())
    }

    /// `cuLaunchKernelEx` with the programmatic-stream-serialization attribute: the kernel may
    /// start before the previous one on the stream ends; it synchronizes itself with
    /// `griddepcontrol.wait` (see common.cuh). Kept in graphs as programmatic edges.
    fn launch_pdl(
        &self,
        kernel: &str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        // One 8-byte slot per argument; 4-byte values sit in the low bytes (x86-64 and aarch64
        // are little-endian), which is where the driver reads a 4-byte parameter from.
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) => *p,
                Arg::I32(v) => *v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the context", e))?;
        // SAFETY: the argument lists are written against the kernel signatures in kernels/*.cu
        // (one slot per parameter, in order), every pointer a live allocation of the sizes
        // those kernels index.
        unsafe { launch_ex(&self.stream, f, grid, block, smem, true, &mut slots) }
            .map_err(|r| cuda_err(&format!("launching {kernel}"), r))
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(data)
            .map_err(|e| cuda_err("copying to the device", e))
    }

    pub fn zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(|e| cuda_err("allocating device memory", e))
    }

    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("running the kernels", e))
    }
}

/// `cuLaunchKernelEx` of `f` on `stream` with one 8-byte slot per kernel parameter (4-byte
/// values in the low bytes), with the programmatic-stream-serialization attribute when `pdl`.
/// Shared by [`Gpu`]'s launches and the measurement examples.
///
/// # Safety
/// `slots` must hold one value per parameter of `f`, in order, and every pointer among them a
/// live device allocation of the sizes the kernel indexes; the stream's context must be
/// current on this thread.
pub unsafe fn launch_ex(
    stream: &CudaStream,
    f: &CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    pdl: bool,
    slots: &mut [u64],
) -> std::result::Result<(), cudarc::driver::sys::CUresult> {
    use cudarc::driver::sys;
    let mut params: Vec<*mut std::ffi::c_void> = slots
        .iter_mut()
        .map(|v| v as *mut u64 as *mut std::ffi::c_void)
        .collect();
    // SAFETY: a zeroed attribute is a valid value of this plain C struct.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(pdl),
    };
    // SAFETY: `params` points at one live slot per kernel parameter (the caller's promise);
    // config and attr outlive the call.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    Ok(())
}

/// The raw device address of a buffer (kernel arguments, graph capture).
pub fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

/// What `trit doctor` reports about one GPU: found without compiling any kernel.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: usize,
    pub free_bytes: usize,
}

/// The driver version (e.g. 13000 for CUDA 13.0) and every visible GPU, or the reason
/// there is none. Never panics: a missing driver library is an `Err` with a sentence.
pub fn probe() -> std::result::Result<(i32, Vec<GpuInfo>), String> {
    if !driver_present() {
        return Err("no NVIDIA driver library (libcuda.so) on this machine".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let mut version = 0i32;
    // SAFETY: the driver library is present (checked above) and initialised by
    // device_count; the call writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    let mut gpus = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("opening GPU {ordinal}: {e:?}"))?;
        let (free_bytes, total_bytes) = ctx
            .mem_get_info()
            .map_err(|e| format!("reading GPU {ordinal}'s memory: {e:?}"))?;
        gpus.push(GpuInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into()),
            compute_capability: ctx.compute_capability().unwrap_or((0, 0)),
            total_bytes,
            free_bytes,
        });
    }
    Ok((version, gpus))
}
