// The second half of a dense decode layer as ONE persistent kernel (prototype, not yet run on a
// GPU): o, gate‖up + SwiGLU and down, three streaming GEMV phases (gemv_stream.cu) separated by
// grid barriers, instead of three kernels plus a quantization kernel.
//
// Why: each decode kernel is short and latency-bound (BENCHMARKS "GPU, session 7": gate‖up
// reads its 28 MB at 39 % of the DRAM peak, o at 18 %); a kernel boundary costs the tail of one
// grid and the ramp of the next. Here the same blocks (one per multiprocessor) go on.
//
//   A. x += W_o · att          (int8 input from the attention kernel)
//   B. h = SwiGLU(W_gu · RMSNorm(x)·γ)   (every block normalizes and quantizes x itself)
//   C. x += W_down · h         (every block quantizes h itself)
//
// Rules (docs/STATUS.md, "persistent decode kernel"):
// - every block must be resident before any block waits at a barrier: the grid is at most one
//   block per multiprocessor with the shared memory of the widest phase, and the next kernel is
//   let in (griddepcontrol.launch_dependents) only in phase C, after the last barrier;
// - x and h written in one phase are read in the next through L2 (`L2` of the streaming GEMV:
//   fg_prologue and fg_store's residual read use ld.global.cg — L1 is not coherent);
// - the barrier counter is reset by the block whose final arrival makes 3 × gridDim.x, when no
//   block can still be spinning on it.
// - each warp requests its first items of the next phase (weights only) before it waits at a
//   barrier, into a ring placed past the widest phase's input, so DRAM works during the wait.

// Arrive at barrier `k` (1, 2, ...) of this launch and wait until every block has.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        const unsigned target = k * gridDim.x;
        unsigned seen;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
            if (seen >= target) break;
            __nanosleep(32);
        }
    }
    __syncthreads();
}

template <typename S>
__device__ __forceinline__ void mlp_persist(
    const uint4* o_codes, const S* o_scales, int d, int nb_o, const uint4* att_q,
    const float2* att_meta, const uint4* gu_codes, const S* gu_scales, int ffn, int nb_d,
    const float* gamma, float eps, const uint4* down_codes, const S* down_scales, int nb_ffn,
    float* x, float* h, unsigned* counter) {
    // One ring position for all phases, past the widest phase's input: a warp requests the
    // next phase's weights while its neighbours may still read this phase's slots and input.
    const int ring_at = stream_ring_at(max(max(nb_o, nb_d), nb_ffn));
    StreamWarp<4> a = stream_begin<4, 1, S>(o_codes, o_scales, d, nb_o, 0, ring_at);
    pdl_wait();
    const FgGamma none = fg_gamma(FG_IN_Q, 0, nullptr);
    stream_finish<4, 1, S, true>(a, o_codes, o_scales, d, nb_o, FG_IN_Q, nullptr, none, nullptr,
                                 0.0f, att_q, att_meta, x, 1, 0);
    StreamWarp<4> b = stream_begin<4, 1, S>(gu_codes, gu_scales, 2 * ffn, nb_d, 1, ring_at);
    const FgGamma gr = fg_gamma(FG_IN_NORM, nb_d, gamma);
    grid_barrier(counter, 1);
    stream_finish<4, 1, S, true>(b, gu_codes, gu_scales, 2 * ffn, nb_d, FG_IN_NORM, x, gr, gamma,
                                 eps, nullptr, nullptr, h, 0, 1);
    StreamWarp<4> c = stream_begin<4, 2, S>(down_codes, down_scales, d, nb_ffn, 0, ring_at);
    grid_barrier(counter, 2);
    pdl_launch_dependents();
    stream_finish<4, 2, S, true>(c, down_codes, down_scales, d, nb_ffn, FG_IN_F32, h, none,
                                 nullptr, 0.0f, nullptr, nullptr, x, 1, 0);
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(counter, 1u) == 3 * gridDim.x - 1) *counter = 0;
}

#define MLP_PERSIST(SN, S)                                                                      \
    extern "C" __global__ void mlp_persist_r4_##SN(                                            \
        const uint4* o_codes, const S* o_scales, int d, int nb_o, const uint4* att_q,          \
        const float2* att_meta, const uint4* gu_codes, const S* gu_scales, int ffn, int nb_d,   \
        const float* gamma, float eps, const uint4* down_codes, const S* down_scales,           \
        int nb_ffn, float* x, float* h, unsigned* counter) {                                   \
        mlp_persist<S>(o_codes, o_scales, d, nb_o, att_q, att_meta, gu_codes, gu_scales, ffn,   \
                       nb_d, gamma, eps, down_codes, down_scales, nb_ffn, x, h, counter);       \
    }
MLP_PERSIST(f16, half_bits)
MLP_PERSIST(f32, float)
