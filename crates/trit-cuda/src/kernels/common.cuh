// Shared helpers of every trit kernel (prepended to each source by the loader).
typedef unsigned short half_bits;
typedef signed char i8;

// Columns per activation-quantization and weight-scale block (the CPU's ACT_BLOCK and BLOCK).
#define QBLOCK 64
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(half_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_bits f2h(float f) {
    half_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The warp sums of R values at once (R a power of two ≤ 32): each halving step sends half of
// the values still held to the partner lane and keeps the other half, so R = 4 sums take 6
// shuffles instead of 20. Returns, in lane l, the sum of v[l / (32 / R)] over the warp.
template <int R>
__device__ __forceinline__ float warp_sum_rows(float (&v)[R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = R, off = 16; n > 1; n /= 2, off /= 2) {
        const bool up = lane & off;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = up ? v[i + n / 2] : v[i];
            const float send = up ? v[i] : v[i + n / 2];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    float t = v[0];
#pragma unroll
    for (int off = 16 / R; off > 0; off /= 2) t += __shfl_xor_sync(0xffffffffu, t, off);
    return t;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole thread block (blockDim.x a multiple of 32, at most 1024).
// Asks L2 for the 128-byte line holding p (no register, nothing waits for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The block's maximum of v, in every thread (scratch: 32 floats of shared memory).
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    return warp_max(lane < nw ? scratch[lane] : -INFINITY);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    float t = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Quantizes one 64-value block held two per lane (`a` = value lane, `b` = value lane + 32) to
// int8 exactly like the CPU's ActQ8: d = max|x| / 127, q = round-half-even(x / d), and stores
// q plus (d, d·Σq) so the GEMV can apply Σ t·x = d·(Σ code·q − Σ q) with one correction.
__device__ __forceinline__ void quant_block_warp(float a, float b, i8* q, float2* meta) {
    const int lane = threadIdx.x & 31;
    float amax = warp_max(fmaxf(fabsf(a), fabsf(b)));
    int qa = 0, qb = 0;
    float d = 0.0f;
    if (amax > 0.0f && isfinite(amax)) {
        float inv = 127.0f / amax;
        qa = __float2int_rn(a * inv);
        qb = __float2int_rn(b * inv);
        d = amax / 127.0f;
    }
    q[lane] = (i8)qa;
    q[lane + 32] = (i8)qb;
    float s = warp_sum((float)(qa + qb));
    if (lane == 0) *meta = make_float2(d, d * s);
}

// SwiGLU of one gate/up pair (the CPU's silu(g)·u).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The gated product of one gate/up pair for the MLP's activation (launch.rs GluAct): 0 SwiGLU,
// 1 relu(g)²·u (BitNet b1.58; the CPU's gated_product).
__device__ __forceinline__ float glu_act(float g, float u, int act) {
    if (act == 1) {
        const float r = fmaxf(g, 0.0f);
        return r * r * u;
    }
    return silu_mul(g, u);
}

// Quantizes a 64-value block held as one float4 by each of 16 consecutive lanes (the vectorized
// norm kernels' layout), exactly like quant_block_warp: every lane of the 16 gets its four
// codes back and the block's (d, d·Σq) in `meta`. All 32 lanes of the warp must call it.
__device__ __forceinline__ char4 quant_block_float4(float4 o, float2& meta) {
    float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
#pragma unroll
    for (int off = 8; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    int q0 = 0, q1 = 0, q2 = 0, q3 = 0;
    float dq = 0.0f;
    if (amax > 0.0f && isfinite(amax)) {
        const float s = 127.0f / amax;
        q0 = __float2int_rn(o.x * s);
        q1 = __float2int_rn(o.y * s);
        q2 = __float2int_rn(o.z * s);
        q3 = __float2int_rn(o.w * s);
        dq = amax / 127.0f;
    }
    float sum = (float)(q0 + q1 + q2 + q3);
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    meta = make_float2(dq, dq * sum);
    return make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
}

// Measurement only (TRIT_CUDA_DEFINES="-DTRIT_PROBE_SKIP=N"): kernels of the kinds whose bits
// are set in N return right after waiting for their inputs, so a decode step's time without
// them shows what they really cost inside the captured graph (where PDL overlaps neighbours and
// a profiler's serialized durations mislead). 1 attention, 2 quantize, 4 register GEMV,
// 8 streaming GEMV. The outputs are then garbage: never for results.
#ifdef TRIT_PROBE_SKIP
#define PROBE_SKIP(KIND) \
    if (TRIT_PROBE_SKIP & (KIND)) return
#else
#define PROBE_SKIP(KIND)
#endif

// Programmatic dependent launch (Hopper): a kernel launched with the PDL attribute may start
// while its predecessor still runs. Each kernel calls pdl_launch_dependents() first (its
// successor may then be scheduled) and pdl_wait() before it touches anything a predecessor
// wrote or may still read; only read-only weights are loaded before the wait. Without the
// attribute (or before sm_90) both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Measurement only (TRIT_CUDA_DEFINES="-DTRIT_TRACE", device.rs `trace`): the traced kernels
// record, per thread block, the %globaltimer at their start, after their griddepcontrol.wait
// and at thread 0's return (and at up to TRACE_MARKS points, TRACE_MARK), with the kernel's kind, an id (a pointer argument that tells the
// layer's matrices apart), the block and its multiprocessor. Blocks spread their records over
// TRACE_SLOTS areas (one counter each, 128 bytes apart), so the atomics do not queue on one
// address. Without the define the macros are empty and nothing changes.
#ifdef TRIT_TRACE
#define TRACE_SLOTS 64
#define TRACE_MARKS 4
struct TraceRec {
    unsigned long long id, t0, tw, te, mark[TRACE_MARKS];
    unsigned kind, block, smid, pad;
};
extern "C" {
__device__ TraceRec* trit_trace_buf;
__device__ unsigned trit_trace_cap;
__device__ unsigned trit_trace_n[TRACE_SLOTS * 32];
}
__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The block's start and wait times and its marks, in shared memory so that no thread holds
// them.
__device__ __forceinline__ unsigned long long* trace_times() {
    __shared__ unsigned long long t[2 + TRACE_MARKS];
    return t;
}
// Thread 0's time at a point of the kernel (mark i < TRACE_MARKS; 0 where never reached).
__device__ __forceinline__ void trace_mark(int i) {
    if (threadIdx.x == 0) trace_times()[2 + i] = trace_now();
}
struct TraceBlock {
    const void* id;
    unsigned kind;
    __device__ __forceinline__ TraceBlock(unsigned k, const void* p) : id(p), kind(k) {
        if (threadIdx.x == 0) {
            trace_times()[0] = trace_now();
            for (int i = 1; i < 2 + TRACE_MARKS; i++) trace_times()[i] = 0;
        }
    }
    __device__ __forceinline__ void waited() {
        if (threadIdx.x == 0) trace_times()[1] = trace_now();
    }
    __device__ __forceinline__ ~TraceBlock() {
        if (threadIdx.x != 0 || trit_trace_buf == nullptr) return;
        // The end first: the record's atomic is an L2 round trip (~0.5 µs).
        const unsigned long long te = trace_now();
        const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        const unsigned slot = blk % TRACE_SLOTS;
        const unsigned i = atomicAdd(&trit_trace_n[slot * 32], 1u);
        if (i >= trit_trace_cap) return;
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        TraceRec r;
        r.id = (unsigned long long)id;
        r.t0 = trace_times()[0];
        r.tw = trace_times()[1];
        r.te = te;
        for (int k = 0; k < TRACE_MARKS; k++) r.mark[k] = trace_times()[2 + k];
        r.kind = kind;
        r.block = blk;
        r.smid = smid;
        r.pad = 0;
        trit_trace_buf[(size_t)slot * trit_trace_cap + i] = r;
    }
};
#define TRACE_SCOPE(KIND, ID) TraceBlock trit_trace_scope((KIND), (ID))
#define TRACE_WAITED() trit_trace_scope.waited()
#define TRACE_MARK(I) trace_mark(I)
#else
#define TRACE_SCOPE(KIND, ID)
#define TRACE_WAITED()
#define TRACE_MARK(I)
#endif

// cp.async (sm_80+): global → shared copies that hold no registers while in flight.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
// Copies the first `bytes` (0..16) of 16 and zero-fills the rest.
// `dst` a shared-memory address (smem_addr), so a caller writing several rows of one slot
// computes it once and adds constant offsets.
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
// The same for one 4-byte word (cp.async.ca: 4-byte copies go through L1).
__device__ __forceinline__ void cp_async4_zfill(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// All but the newest `N` committed groups have landed.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Butterfly stages h, 2h, ..., 2^(K-1)·h of the blockwise Walsh–Hadamard transform of
// buf[0..n) (blocks of `block` values, h a power of two below it): each thread takes groups of
// 2^K values spaced h apart inside one block, runs the stages on them in registers, and writes
// them back. Every pair (i, i + h·s) of stage h·s lies in one group and is combined as the
// one-stage-at-a-time loop combines it (a + b, a − b), so the result is bit-identical to it;
// the stages of a group need no barrier between them.
template <int K>
__device__ __forceinline__ void hr_pass(float* buf, int n, int block, int h) {
    constexpr int M = 1 << K;
    const int per = block / M;  // groups per block
    for (int p = threadIdx.x; p < n / M; p += blockDim.x) {
        const int blk = p / per, g = p - blk * per;
        const int base = blk * block + (g / h) * h * M + (g & (h - 1));
        float v[M];
#pragma unroll
        for (int j = 0; j < M; j++) v[j] = buf[base + j * h];
#pragma unroll
        for (int s = 1; s < M; s *= 2) {
#pragma unroll
            for (int j = 0; j < M; j++) {
                if (!(j & s)) {
                    const float a = v[j], b = v[j + s];
                    v[j] = a + b;
                    v[j + s] = a - b;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < M; j++) buf[base + j * h] = v[j];
    }
}

// Every butterfly stage of the transform of buf[0..n) in blocks of `block` (a power of two
// dividing n; the 1/√block scale is the caller's), up to three stages per pass and a barrier
// after each (a block of 1,024: 4 barriers instead of 10). The whole thread block calls it.
__device__ __forceinline__ void hr_transform(float* buf, int n, int block) {
    for (int h = 1; h < block;) {
        const int left = block / h;
        if (left >= 8) {
            hr_pass<3>(buf, n, block, h);
            h *= 8;
        } else if (left == 4) {
            hr_pass<2>(buf, n, block, h);
            h *= 4;
        } else {
            hr_pass<1>(buf, n, block, h);
            h *= 2;
        }
        __syncthreads();
    }
}

// ---- Dense matrices of kind KIND: 0 f32, 1 f16, 2 bf16 (gemv.cu dense_rows, embed_dense*).
__device__ __forceinline__ float bf2f(half_bits h) { return __uint_as_float((unsigned)h << 16); }

// The value at index i of a dense matrix of kind KIND.
template <int KIND>
__device__ __forceinline__ float dense_at(const void* w, size_t i) {
    if (KIND == 0) return __ldg((const float*)w + i);
    const half_bits h = __ldg((const half_bits*)w + i);
    return KIND == 1 ? h2f(h) : bf2f(h);
}

// Eight values from index i (a multiple of 8): two 16-byte loads of f32, one of halves.
template <int KIND>
__device__ __forceinline__ void dense_at8(const void* w, size_t i, float (&v)[8]) {
    if (KIND == 0) {
        const float4 a = __ldg((const float4*)((const float*)w + i));
        const float4 b = __ldg((const float4*)((const float*)w + i + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
        return;
    }
    const uint4 q = __ldg((const uint4*)((const half_bits*)w + i));
    const unsigned u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const half_bits lo = (half_bits)(u[k] & 0xffffu), hi = (half_bits)(u[k] >> 16);
        v[2 * k] = KIND == 1 ? h2f(lo) : bf2f(lo);
        v[2 * k + 1] = KIND == 1 ? h2f(hi) : bf2f(hi);
    }
}

// Thread block clusters (sm_90; the host launches cluster kernels only there: deltanet.cu's
// pair, attention.cu's ATT_CL merge): the block's rank in its cluster and the cluster barrier
// split into its arrive and wait halves.
__device__ __forceinline__ int cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return (int)r;
}
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// A one-shot mailbox for floats from the other block: `bar` an mbarrier that completes when
// the `bytes` have landed (`mailbox_open` before the cluster barrier that tells the other
// block it may send; `mailbox_send` writes into the other block's `var` and completes its
// `bar` with st.async, so the sender fences nothing: its earlier global stores need not be
// acknowledged first, as a release of the cluster barrier would make them).
__device__ __forceinline__ void mailbox_open(unsigned long long* bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mailbox_send(float* var, unsigned long long* bar, int peer, float v) {
#if __CUDA_ARCH__ >= 900
    unsigned rv, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rv) : "r"(smem_addr(var)), "r"(peer));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_addr(bar)), "r"(peer));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(rv), "r"(__float_as_uint(v)), "r"(rb) : "memory");
#endif
}
// Waits until every byte `mailbox_open` expects has landed.
__device__ __forceinline__ void mailbox_wait(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        "@!done bra wait;\n"
        "}\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ float mailbox_take(const float* var, unsigned long long* bar) {
    mailbox_wait(bar);
    return *(volatile const float*)var;
}
