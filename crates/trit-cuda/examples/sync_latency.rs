//! What one dependent link of a decode chain costs on this GPU, by how the next kernel learns
//! that its input is ready:
//!
//!     sync_latency [--links 216] [--blocks 132] [--threads 256] [--mib 0,9] [--reps 100]
//!                  [--n 4096]
//!
//! A CUDA graph of `links` kernels, each reading the whole `n`-value vector its predecessor
//! wrote and writing its own (every block a slice), optionally after requesting `mib` MiB of
//! "weights" (a fresh range per link, so no L2 hits) before it waits — the shape of a decode
//! step's GEMV chain with the arithmetic taken out. Modes:
//! - `plain`: no programmatic dependent launch (each kernel starts after the previous ends);
//! - `pdl`: `griddepcontrol.launch_dependents` first, `griddepcontrol.wait` before the input;
//! - `flag`: launched the same way, but waits on a counter its predecessor's blocks bump
//!   (release/acquire at GPU scope) instead of `griddepcontrol.wait`; counters reset by a
//!   memset node at the graph's start.
//!
//! Prints µs per link for each mode and weight size. Timing only: no test asserts on it.

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, DevicePtr};
use cudarc::nvrtc::CompileOptions;
use std::time::Instant;
use trit_cuda::device::launch_ex;

const SRC: &str = r#"
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void dep_launch() { asm volatile("griddepcontrol.launch_dependents;" :::); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// mode 0 plain, 1 pdl, 2 flag. `prev`/`mine`: counters (flag mode; prev null for the first).
extern "C" __global__ void link(const float* in, float* out, int n, const uint4* w,
                                long long wchunks, float* sink, int mode,
                                const unsigned* prev, unsigned* mine, unsigned expect) {
    if (mode != 0) dep_launch();
    // Weights: this block's share of the link's range, loaded before the wait.
    uint4 acc = make_uint4(0, 0, 0, 0);
    const long long per = wchunks / gridDim.x;
    const uint4* wb = w + per * blockIdx.x;
    // Eight loads in flight per thread before any is used.
    long long i = threadIdx.x;
    for (; i + 7 * blockDim.x < per; i += 8 * blockDim.x) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(wb + i + u * blockDim.x));
#pragma unroll
        for (int u = 0; u < 8; u++) { acc.x ^= v[u].x; acc.y ^= v[u].y; acc.z ^= v[u].z; acc.w ^= v[u].w; }
    }
    for (; i < per; i += blockDim.x) {
        const uint4 v = __ldg(wb + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if (mode == 1) dep_wait();
    if (mode == 2 && prev) {
        if (threadIdx.x == 0) while (ld_acquire(prev) < expect) {}
        __syncthreads();
    }
    __shared__ float part[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += __ldcg(in + i);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    // Each block writes its slice of the output: the sum scaled down so values stay finite.
    const int slice = (n + gridDim.x - 1) / gridDim.x;
    const float total = __shfl_sync(0xffffffffu, s, 0) * (1.0f / n);
    for (int i = slice * blockIdx.x + threadIdx.x; i < min(n, slice * (blockIdx.x + 1)); i += blockDim.x)
        __stcg(out + i, total + 1e-3f * i);
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[0] = 1.0f;
    if (mode == 2) {
        __syncthreads();
        if (threadIdx.x == 0) red_release(mine, 1);
    }
}
"#;

struct Opts {
    links: usize,
    blocks: u32,
    threads: u32,
    mib: Vec<f64>,
    reps: usize,
    n: usize,
    pattern: Vec<f64>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        links: 216,
        blocks: 132,
        threads: 256,
        mib: vec![0.0, 9.0],
        reps: 100,
        n: 4096,
        pattern: vec![],
    };
    let mut a = std::env::args().skip(1);
    while let Some(k) = a.next() {
        let v = a.next().ok_or(format!("{k} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{k} {v}: {e}");
        match k.as_str() {
            "--links" => o.links = v.parse().map_err(|e| bad(&e))?,
            "--blocks" => o.blocks = v.parse().map_err(|e| bad(&e))?,
            "--threads" => o.threads = v.parse().map_err(|e| bad(&e))?,
            "--reps" => o.reps = v.parse().map_err(|e| bad(&e))?,
            "--n" => o.n = v.parse().map_err(|e| bad(&e))?,
            "--pattern" => {
                o.pattern = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            "--mib" => {
                o.mib = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown option {k}")),
        }
    }
    Ok(o)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse()?;
    let ctx = CudaContext::new(0)?;
    // SAFETY: one stream, every operation on it.
    unsafe { ctx.disable_event_tracking() };
    let s = ctx.new_stream()?;
    let (major, minor) = ctx.compute_capability()?;
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        ..Default::default()
    };
    let module = ctx.load_module(cudarc::nvrtc::compile_ptx_with_opts(SRC, opts)?)?;
    let f = module.load_function("link")?;
    let n = o.n;
    // Per-link weight sizes: each --mib value for every link, then --pattern cycled.
    let mut configs: Vec<Vec<f64>> = o.mib.iter().map(|&m| vec![m]).collect();
    if !o.pattern.is_empty() {
        configs.push(o.pattern.clone());
    }
    let chunks_of = |cfg: &[f64], l: usize| (cfg[l % cfg.len()] * 1048576.0) as u64 / 16;
    let total = |cfg: &[f64]| (0..o.links).map(|l| chunks_of(cfg, l)).sum::<u64>();
    let most = configs.iter().map(|c| total(c)).max().unwrap_or(0).max(1);
    let wbuf = s.alloc_zeros::<u8>(most as usize * 16)?;
    let bufs = [s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?];
    let sink = s.alloc_zeros::<f32>(1)?;
    let mut counters = s.alloc_zeros::<u32>(o.links)?;
    let p = |b: &cudarc::driver::CudaSlice<f32>| b.device_ptr(&s).0;
    let (b0, b1, sinkp) = (p(&bufs[0]), p(&bufs[1]), sink.device_ptr(&s).0);
    let (wp, cp) = (wbuf.device_ptr(&s).0, counters.device_ptr(&s).0);
    println!(
        "{} links, {} blocks x {} threads, {} inputs, {} reps; µs per link",
        o.links, o.blocks, o.threads, n, o.reps
    );
    for cfg in &configs {
        let label = cfg
            .iter()
            .map(|m| format!("{m}"))
            .collect::<Vec<_>>()
            .join(",");
        for (mode, name) in [(0u64, "plain"), (1, "pdl"), (2, "flag")] {
            s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            if mode == 2 {
                s.memset_zeros(&mut counters)?;
            }
            let mut at = 0u64;
            for l in 0..o.links {
                let (src, dst) = if l % 2 == 0 { (b0, b1) } else { (b1, b0) };
                let prev = if l == 0 { 0 } else { cp + 4 * (l as u64 - 1) };
                let chunks = chunks_of(cfg, l);
                let mut args = [
                    src,
                    dst,
                    n as u64,
                    wp + at * 16,
                    chunks,
                    sinkp,
                    mode,
                    prev,
                    cp + 4 * l as u64,
                    o.blocks as u64,
                ];
                at += chunks;
                // SAFETY: one slot per parameter of `link`, in its order; live buffers.
                unsafe { launch_ex(&s, &f, (o.blocks, 1, 1), o.threads, 0, mode != 0, &mut args) }
                    .map_err(|r| format!("launch: {r:?}"))?;
            }
            let g = s
                .end_capture(sys::CUgraphInstantiate_flags(0))?
                .ok_or("empty graph")?;
            for _ in 0..3 {
                g.launch()?;
            }
            s.synchronize()?;
            let t = Instant::now();
            for _ in 0..o.reps {
                g.launch()?;
            }
            s.synchronize()?;
            let secs = t.elapsed().as_secs_f64() / o.reps as f64;
            let us = secs * 1e6 / o.links as f64;
            let gbs = total(cfg) as f64 * 16.0 / secs / 1e9;
            println!(
                "MiB {label:<24} {name:<5} {us:7.3} µs/link  {gbs:7.1} GB/s  {:8.1} µs/graph",
                secs * 1e6
            );
        }
    }
    Ok(())
}
