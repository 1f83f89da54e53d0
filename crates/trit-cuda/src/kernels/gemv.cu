// Matrix-vector products of the decode step.
//
// Block indices (row · blocks per row + block) are 32-bit in the decode GEMVs: a model's
// matrices have far fewer than 2^32 blocks (repack.rs checks), and the 64-bit index arithmetic
// per row and item was a visible share of these issue-bound kernels' instructions.
//
// Ternary layout (see repack.rs): per row, one 16-byte word per 64 columns. u32 word j of a
// block covers columns 16j..16j+16; bits 2s..2s+2 of its byte k hold code (t + 1) of column
// 16j + 4s + k. So (word >> 2s) & 0x03030303 is four codes of four consecutive columns, the
// operand of one dp4a against the matching 4 int8 activations. Scales: one per row and block.
//
// A warp computes R rows: lane b takes blocks b, b+32, ... of all R rows, so every load of
// the warp is 512 contiguous bytes of one row (coalesced, 16 bytes per thread), R of them in
// flight per lane, and the activation block it loads is reused for the R rows.

// dp4a of four unsigned bytes (masked codes, up to 0xc0) against four signed int8 activations.
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Per-class partial sums of a block row: class s (the codes at bits 2s of every byte) is
// masked in place, not shifted down, so its products come out 4^s times too large; the four
// sums are scaled back once per block (block_dot). 16 codes cost one mask and one dp4a instead
// of a shift, a mask and a dp4a — ncu showed the decode GEMVs bound by instruction issue.
struct ClassSums {
    int c[4];
};

__device__ __forceinline__ void class_sums_add(ClassSums& s, unsigned w, uint4 a) {
    s.c[0] = dp4a_us(w & 0x03030303u, (int)a.x, s.c[0]);
    s.c[1] = dp4a_us(w & 0x0c0c0c0cu, (int)a.y, s.c[1]);
    s.c[2] = dp4a_us(w & 0x30303030u, (int)a.z, s.c[2]);
    s.c[3] = dp4a_us(w & 0xc0c0c0c0u, (int)a.w, s.c[3]);
}

// The exact dot product: 64·c0 + 16·c1 + 4·c2 + c3 is 64 times it (c_s is 4^s times a sum).
__device__ __forceinline__ int block_dot(const ClassSums& s) {
    return (64 * s.c[0] + 16 * s.c[1] + 4 * s.c[2] + s.c[3]) >> 6;
}

// One block row's 16 bytes of codes against the block's 64 int8 activations (a[j]: columns
// 16j..16j+16).
__device__ __forceinline__ int dot_block(uint4 w, const uint4 (&a)[4]) {
    ClassSums s = {{0, 0, 0, 0}};
    class_sums_add(s, w.x, a[0]);
    class_sums_add(s, w.y, a[1]);
    class_sums_add(s, w.z, a[2]);
    class_sums_add(s, w.w, a[3]);
    return block_dot(s);
}

__device__ __forceinline__ float load_scale(const half_bits* s, size_t i) { return h2f(__ldg(s + i)); }
__device__ __forceinline__ float load_scale(const float* s, size_t i) { return __ldg(s + i); }

// The residual's pending sum (attention_o.cu): the products of the attention + o kernel meet
// as 64-bit fixed point in units of 2^-32 (integer atomics: the same sum in any order). Its
// two readers (FG_IN_NORM_PEND's prologue, the down GEMV's epilogue) convert it with this
// one function, so both see the same x + pend.
__device__ __forceinline__ long long pend_fixed(float y) { return __float2ll_rn(y * 4294967296.0f); }
__device__ __forceinline__ float pend_value(unsigned long long p) {
    return __ll2float_rn((long long)p) * 2.3283064365386963e-10f;
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// One work item of a warp: lane-step k of row group g (block b = 32k + lane of R rows).
template <int R, typename S>
struct Item {
    uint4 w[R];
    float s[R];
    uint4 a[4];
    float2 m;
};

// The weight half of an item (read-only: may run before pdl_wait).
template <int R, typename S>
__device__ __forceinline__ void load_item_weights(Item<R, S>& it, const uint4* __restrict__ codes,
                                                  const S* __restrict__ scales, int rows, int nb,
                                                  int g, int k, int lane) {
    const int b = 32 * k + lane;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (b < nb) {
            const unsigned at = (unsigned)min(g * R + i, rows - 1) * nb + b;
            it.w[i] = load_stream(codes + at);
            it.s[i] = load_scale(scales, at);
        } else {
            it.w[i] = make_uint4(0, 0, 0, 0);
            it.s[i] = 0.0f;
        }
    }
}

// The activation half (written by the previous kernel: after pdl_wait).
template <int R, typename S>
__device__ __forceinline__ void load_item_acts(Item<R, S>& it, int nb,
                                               const uint4* __restrict__ xq,
                                               const float2* __restrict__ meta, int k,
                                               int lane) {
    const int b = 32 * k + lane;
    if (b < nb) {
#pragma unroll
        for (int j = 0; j < 4; j++) it.a[j] = __ldg(xq + 4 * b + j);
        it.m = __ldg(meta + b);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) it.a[j] = make_uint4(0, 0, 0, 0);
        it.m = make_float2(0.0f, 0.0f);
    }
}

template <int R, typename S>
__device__ __forceinline__ void load_item(Item<R, S>& it, const uint4* __restrict__ codes,
                                          const S* __restrict__ scales, int rows, int nb,
                                          const uint4* __restrict__ xq,
                                          const float2* __restrict__ meta, int g, int k,
                                          int lane) {
    const int b = 32 * k + lane;
    if (b < nb) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            const unsigned at = (unsigned)min(g * R + i, rows - 1) * nb + b;
            it.w[i] = load_stream(codes + at);
            it.s[i] = load_scale(scales, at);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) it.a[j] = __ldg(xq + 4 * b + j);
        it.m = __ldg(meta + b);
    } else {
        // Lanes past the row's end add s · (...) = 0.
#pragma unroll
        for (int i = 0; i < R; i++) {
            it.w[i] = make_uint4(0, 0, 0, 0);
            it.s[i] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) it.a[j] = make_uint4(0, 0, 0, 0);
        it.m = make_float2(0.0f, 0.0f);
    }
}

// Persistent grid; a block of SPLIT warps computes one group of R rows at a time, its warps
// sharing the row's blocks (warp `sub` takes lane-steps k = sub, sub + SPLIT, ...), so long
// rows are read by several warps at once instead of one warp in sequence. Each warp walks its
// items (its steps of groups blockIdx.x, blockIdx.x + gridDim.x, ...) loading the next item
// before computing the current one, so R 16-byte weight loads per lane are always in flight.
// Warps' partial sums meet in shared memory at the end of each group.
#ifndef GEMV_L2_AHEAD
#define GEMV_L2_AHEAD 8
#endif
template <int R, int SPLIT, typename S>
__device__ __forceinline__ void ternary_gemv(const uint4* __restrict__ codes,
                                             const S* __restrict__ scales, int rows, int nb,
                                             const uint4* __restrict__ xq,
                                             const float2* __restrict__ meta,
                                             float* __restrict__ y, int accumulate,
                                             unsigned long long* __restrict__ pend) {
    __shared__ float red[SPLIT][R];
    const int lane = threadIdx.x & 31, sub = threadIdx.x >> 5;
    const int groups = (rows + R - 1) / R;
    const int iters = (nb + 31) / 32;
    const int per = (iters + SPLIT - 1) / SPLIT;  // items of each warp per group
    int g = blockIdx.x, j = 0;
    TRACE_SCOPE(2, codes);
    pdl_launch_dependents();
    if (g >= groups) return;
    Item<R, S> cur, nxt;
    // Weights do not depend on the previous kernel: the first load is issued before waiting.
    load_item_weights<R, S>(cur, codes, scales, rows, nb, g, sub, lane);
    // The weights of the warp's next GEMV_L2_AHEAD items are requested into L2 before the wait
    // too, so that after it each item's load is an L2 hit rather than a DRAM round trip (the
    // 27B's down has ~3.6 items per warp and kept one in flight). H200, session 10: 8B +3 %,
    // 1.7B +3 %, 27B +2 % with 8 (4 measured about equal); TRIT_CUDA_DEFINES=-DGEMV_L2_AHEAD=0
    // turns it off.
    if (GEMV_L2_AHEAD > 0) {
        int gg = g, jj = 0;
        for (int n = 0; n < GEMV_L2_AHEAD; n++) {
            if (++jj == per) {
                jj = 0;
                gg += gridDim.x;
            }
            if (gg >= groups) break;
            const int b = 32 * (sub + SPLIT * jj) + lane;
            if (b < nb) {
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const unsigned at = (unsigned)min(gg * R + i, rows - 1) * nb + b;
                    prefetch_l2(codes + at);
                    prefetch_l2(scales + at);
                }
            }
        }
    }
    pdl_wait();
    TRACE_WAITED();
    PROBE_SKIP(4);
    load_item_acts<R, S>(cur, nb, xq, meta, sub, lane);
    TRACE_MARK(0);
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
    while (true) {
        int j2 = j + 1, g2 = g;
        if (j2 == per) {
            j2 = 0;
            g2 = g + gridDim.x;
        }
        const bool more = g2 < groups;
        if (more) load_item<R, S>(nxt, codes, scales, rows, nb, xq, meta, g2, sub + SPLIT * j2, lane);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int d = dot_block(cur.w[i], cur.a);
            acc[i] += cur.s[i] * (cur.m.x * (float)d - cur.m.y);
        }
        if (j == per - 1) {
            const float t = warp_sum_rows<R>(acc);  // lane l: row l / (32 / R)
#pragma unroll
            for (int i = 0; i < R; i++) acc[i] = 0.0f;
            if (lane % (32 / R) == 0) red[sub][lane / (32 / R)] = t;
            __syncthreads();
            if (sub == 0 && lane < R) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < SPLIT; w++) v += red[w][lane];
                const int r = g * R + lane;
                if (r < rows) {
                    if (!accumulate) {
                        y[r] = v;
                    } else if (pend == nullptr) {
                        y[r] += v;
                    } else {
                        // The pending attention + o products join x here, once (pend_value).
                        y[r] = (y[r] + pend_value(__ldcg(pend + r))) + v;
                        pend[r] = 0;
                    }
                }
            }
            __syncthreads();
        }
        if (!more) break;
        cur = nxt;
        g = g2;
        j = j2;
    }
}

#define TERNARY_GEMV(R, SPLIT, SN, S)                                                         \
    extern "C" __global__ void ternary_gemv_r##R##_s##SPLIT##_##SN(                           \
        const uint4* codes, const S* scales, int rows, int nb, const uint4* xq,               \
        const float2* meta, float* y, int accumulate, unsigned long long* pend) {             \
        ternary_gemv<R, SPLIT, S>(codes, scales, rows, nb, xq, meta, y, accumulate, pend);    \
    }
#define TERNARY_GEMV_SPLITS(R, SN, S)                                          \
    TERNARY_GEMV(R, 1, SN, S) TERNARY_GEMV(R, 2, SN, S) TERNARY_GEMV(R, 3, SN, S) \
    TERNARY_GEMV(R, 4, SN, S)
TERNARY_GEMV_SPLITS(2, f16, half_bits)
TERNARY_GEMV_SPLITS(4, f16, half_bits)
TERNARY_GEMV_SPLITS(8, f16, half_bits)
TERNARY_GEMV_SPLITS(2, f32, float)
TERNARY_GEMV_SPLITS(4, f32, float)
TERNARY_GEMV_SPLITS(8, f32, float)

// ---- The fused decode GEMV: the input's preparation in the prologue, SwiGLU in the epilogue.
//
// One block of FG_WARPS warps per multiprocessor (103 registers per thread leave room for no
// second) first builds the int8 activations in shared memory: copied from the previous
// kernel's int8 blocks (FG_IN_Q), quantized from f32 values (FG_IN_F32: the SwiGLU output
// before the down projection), or RMS-normalized and quantized from the residual stream
// (FG_IN_NORM). Every block computes the norm's Σx² itself: 16–48 KB of L2 reads per block
// instead of a dependent kernel (its launch, ramp and drain). Which matrices use it is the
// host's choice (options.rs, FusedSet): on the 8B shape o and down are faster on ternary_gemv. The quantization is rms_norm_quant_v4's and quant_block_warp's
// (the CPU's ActQ8 formula). Then teams of SPLIT warps take row groups of R rows as
// ternary_gemv does, reading the activations from shared memory. In GLU mode the matrix is
// gate‖up stacked (2·half rows) and a group's R rows are R/2 gate rows and the R/2 up rows of
// the same outputs, so its epilogue writes silu(gate)·up (the weight layout is unchanged).
//
// Each warp keeps two items' weights in flight: it loads item n + 2 before computing item n
// (a warp of a small matrix has only 1–6 items, so the latency of each round trip, not the
// loop, sets the time; 8B with every matrix fused against main in the same run: 0.93x with
// one item in flight, 0.98x with two). Weights do not depend on the previous kernel: items 0 and 1 are loaded
// before griddepcontrol.wait, overlapping the prologue. (Prefetching further items into L2
// with prefetch.global.L2 instead measured slower: 522.6 with, 538.0 without.)
//
// Shared layout: 16-byte chunk j of block b sits at chunk fg_chunk(b, j), so the 32 lanes of a
// warp reading chunk j of 32 consecutive blocks hit distinct banks in each 8-lane phase.

#define FG_WARPS 16
#define FG_MAX_COLS 16384
#define FG_IN_Q 0
#define FG_IN_F32 1
#define FG_IN_NORM 2
// FG_IN_NORM, then Bonsai 2's rotation (signs, blockwise Walsh–Hadamard transform) before the
// quantization: the streaming GEMV only (fg_prologue_rot).
#define FG_IN_NORM_ROT 3
// FG_IN_NORM of x + pend (the attention + o kernel's pending sum, attention_o.cu), the pend
// pointer passed in the q argument.
#define FG_IN_NORM_PEND 4
// Bit 1 of the fused GEMVs' flags argument (bit 0: gate‖up): the next kernel is let start only
// after this one's griddepcontrol.wait, so everything written before this kernel (its input x
// among it) is final wherever the next one runs — which may then read it before its own wait.
#define FG_LATE_TRIGGER 2
// Bit 2: gate‖up's activation is relu² (BitNet b1.58), not SiLU. The kernels turn the flags
// into glu = 0 (no gate‖up), 1 (SwiGLU) or 2 (relu²): glu_act's code plus one.
#define FG_RELU2 4
__device__ __forceinline__ int fg_glu(int flags) {
    return (flags & 1) ? ((flags & FG_RELU2) ? 2 : 1) : 0;
}

__device__ __forceinline__ int fg_chunk(int b, int j) { return 4 * b + (j ^ ((b >> 1) & 3)); }

// Barrier of one team of `warps` warps (ids 1..15; 0 is __syncthreads').
__device__ __forceinline__ void team_barrier(int team, int warps) {
    asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "r"(32 * warps) : "memory");
}

// The R sums of the SPLIT warps of one team, added in a fixed order through shared memory
// `red` (one row per warp of the block); every lane of the team gets them in v.
template <int R, int SPLIT>
__device__ __forceinline__ void team_sum(float* v, float (*red)[R], int warp, int team,
                                         int lane) {
    if (SPLIT == 1) return;
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < R; i++) red[warp][i] = v[i];
    }
    team_barrier(team, SPLIT);
#pragma unroll
    for (int i = 0; i < R; i++) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT; w++) t += red[team * SPLIT + w][i];
        v[i] = t;
    }
    team_barrier(team, SPLIT);
}

// team_sum for sums spread over lanes (warp_sum_rows: lane l holds row l / (32 / R)): the
// team's total of the lane's row, added in a fixed order.
template <int R, int SPLIT>
__device__ __forceinline__ float team_sum_rows(float t, float (*red)[R], int warp, int team,
                                               int lane) {
    if (SPLIT == 1) return t;
    constexpr int L = 32 / R;
    if (lane % L == 0) red[warp][lane / L] = t;
    team_barrier(team, SPLIT);
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < SPLIT; w++) s += red[team * SPLIT + w][lane / L];
    team_barrier(team, SPLIT);
    return s;
}

// fg_store for sums spread over lanes (lane l holds row l / (32 / R) of group g).
template <int R, bool L2 = false>
__device__ __forceinline__ void fg_store_rows(float t, int g, int rows, int half, int glu,
                                              float* __restrict__ y, int accumulate, int lane) {
    constexpr int L = 32 / R;
    const int i = lane / L;
    if (!glu) {
        const int r = g * R + i;
        if (lane % L == 0 && r < rows) {
            if (!accumulate) y[r] = t;
            else if (L2) y[r] = __ldcg(y + r) + t;
            else y[r] += t;
        }
        return;
    }
    constexpr int H = R / 2;
    const float up = __shfl_down_sync(0xffffffffu, t, H * L);  // row i + H
    const int r = g * H + i;
    if (lane % L == 0 && i < H && r < half) y[r] = glu_act(t, up, glu - 1);
}

// L2: read x through L2 only (ld.global.cg) — a persistent kernel's earlier phase may have left
// stale lines of x in this block's L1 (decode_persist.cu); the separate kernels read it plainly.
template <bool L2 = false>
__device__ __forceinline__ float4 fg_load_x(const float4* p) {
    return L2 ? __ldcg(p) : *p;
}

// Float4s of x and γ per thread the prologue keeps in registers (rows up to 64·FG_REGS·
// blockDim.x values; wider ones load the rest in a loop). 4 covers q‖k‖v of the 8B shape at
// 384 threads and every 27B row at 512; a tunable (TRIT_CUDA_DEFINES="-DFG_REGS=2") because
// the registers it costs (stream kernel 56 → 72) leave less room for the next kernel's early
// blocks.
#ifndef FG_REGS
#define FG_REGS 4
#endif

// This thread's RMSNorm weights, loaded before the kernel waits for its input (weights never
// depend on the previous kernel), so the prologue's chain — load x, block sum, scale, quantize —
// has no γ round trip in it. Zeros where unused.
struct FgGamma {
    float4 g[FG_REGS];
};

__device__ __forceinline__ FgGamma fg_gamma(int mode, int nb, const float* __restrict__ gamma) {
    const int t = threadIdx.x, T = blockDim.x, n4 = nb * 16;
    FgGamma r;
#pragma unroll
    for (int k = 0; k < FG_REGS; k++) {
        const int c = k * T + t;
        const bool norm = mode == FG_IN_NORM || mode == FG_IN_NORM_ROT || mode == FG_IN_NORM_PEND;
        r.g[k] = norm && c < n4 ? ((const float4*)gamma)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    return r;
}

// The block's int8 input and its (d, d·Σq) per 64 values, into xs / ms (blockDim.x threads, a
// multiple of 16): x RMS-normalized with γ (FG_IN_NORM) or as it is (FG_IN_F32), quantized per
// 64 values; or the int8 blocks copied (FG_IN_Q). x is read once:
// the first FG_REGS float4s per thread stay in registers between the sum of squares and the
// quantization. 16 consecutive threads hold one 64-value block; every trip count is uniform.
// x's float4 c, plus (PEND, where `pend` is set) the pending sum's four values.
template <bool L2, bool PEND>
__device__ __forceinline__ float4 fg_load_xp(const float4* __restrict__ x4,
                                             const ulonglong2* __restrict__ pend, int c) {
    float4 v = fg_load_x<L2>(x4 + c);
    if (PEND && pend != nullptr) {
        const ulonglong2 a = __ldcg(pend + 2 * c), b = __ldcg(pend + 2 * c + 1);
        v = make_float4(v.x + pend_value(a.x), v.y + pend_value(a.y), v.z + pend_value(b.x),
                        v.w + pend_value(b.y));
    }
    return v;
}

// The prologue's first FG_REGS float4s of x (plus the pending sum, fg_load_xp) per thread
// into xv, zeros past the row's n4; with `norm` (the same in every thread: block_sum's
// barriers) the row's 1/rms over all of it, else 1.
template <bool L2, bool PEND>
__device__ __forceinline__ float fg_load_rms(const float4* __restrict__ x4,
                                             const ulonglong2* __restrict__ pend, int n4,
                                             bool norm, float eps, float4 (&xv)[FG_REGS],
                                             float* scratch) {
    const int t = threadIdx.x, T = blockDim.x;
    auto sq = [](float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; };
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < FG_REGS; k++) {
        const int c = k * T + t;
        xv[k] = c < n4 ? fg_load_xp<L2, PEND>(x4, pend, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += sq(xv[k]);
    }
    if (!norm) return 1.0f;
    for (int c = FG_REGS * T + t; c < n4; c += T) ss += sq(fg_load_xp<L2, PEND>(x4, pend, c));
    ss = block_sum(ss, scratch);
    return 1.0f / sqrtf(ss / (float)(n4 * 4) + eps);
}

// PEND: the kernel takes FG_IN_NORM_PEND inputs (compiled only into the `_pend_` streaming
// kernels: the pending sum's loads cost the others 14 registers).
template <bool L2 = false, bool PEND = false>
__device__ __forceinline__ void fg_prologue(int mode, int nb, const float* __restrict__ x,
                                            const FgGamma& gr, const float* __restrict__ gamma,
                                            float eps, const uint4* __restrict__ q,
                                            const float2* __restrict__ meta, uint4* xs,
                                            float2* ms, float* scratch) {
    const int t = threadIdx.x, T = blockDim.x;
    if (mode == FG_IN_Q) {
        for (int c = t; c < 4 * nb; c += T) xs[fg_chunk(c >> 2, c & 3)] = q[c];
        for (int b = t; b < nb; b += T) ms[b] = meta[b];
        return;
    }
    const int n4 = nb * 16;
    const float4* x4 = (const float4*)x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const bool norm = mode == FG_IN_NORM || (PEND && mode == FG_IN_NORM_PEND);
    const ulonglong2* pend = PEND && mode == FG_IN_NORM_PEND ? (const ulonglong2*)q : nullptr;
    float4 xv[FG_REGS];
    const float inv = fg_load_rms<L2, PEND>(x4, pend, n4, norm, eps, xv, scratch);
    auto emit = [&](int c, float4 v, float4 g) {
        float4 o = zero;
        if (c < n4)
            o = norm ? make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w)
                     : v;
        float2 bm;
        const char4 packed = quant_block_float4(o, bm);
        if (c < n4) {
            const int b = c >> 4;
            char4* dst = (char4*)(xs + fg_chunk(b, (c >> 2) & 3));
            dst[c & 3] = packed;
            if ((c & 15) == 0) ms[b] = bm;
        }
    };
#pragma unroll
    for (int k = 0; k < FG_REGS; k++)
        if (k * T < n4) emit(k * T + t, xv[k], gr.g[k]);
    for (int c0 = FG_REGS * T; c0 < n4; c0 += T) {
        const int c = c0 + t;
        const bool in = c < n4;
        emit(c, in ? fg_load_xp<L2, PEND>(x4, pend, c) : zero,
             in && norm ? ((const float4*)gamma)[c] : zero);
    }
}

// The rotation of an FG_IN_NORM_ROT input: ±1 signs per input value and the Hadamard block.
struct FgRot {
    const float* signs;
    int block;
};

// fg_prologue for FG_IN_NORM_ROT: x RMS-normalized with γ, times the signs, transformed per
// block of rot.block values in `fbuf` (nb·64 floats of shared memory; hr_transform, the
// separate hadamard_quant's stages), scaled by 1/√block, then quantized per 64 values as
// fg_prologue quantizes. The products are hadamard_quant's in its order; only Σx² is summed in
// another (fg_prologue's) order. blockDim.x a multiple of 16; every trip count uniform.
template <bool L2 = false>
__device__ __forceinline__ void fg_prologue_rot(int nb, const float* __restrict__ x,
                                                const FgGamma& gr,
                                                const float* __restrict__ gamma, float eps,
                                                FgRot rot, float* fbuf, uint4* xs, float2* ms,
                                                float* scratch) {
    const int t = threadIdx.x, T = blockDim.x;
    const int n4 = nb * 16;
    const float4* x4 = (const float4*)x;
    const float4* s4 = (const float4*)rot.signs;
    float4* f4 = (float4*)fbuf;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 xv[FG_REGS];
    const float inv = fg_load_rms<L2, false>(x4, nullptr, n4, true, eps, xv, scratch);
    auto put = [&](int c, float4 v, float4 g) {
        const float4 sg = s4[c];
        f4[c] = make_float4(v.x * inv * g.x * sg.x, v.y * inv * g.y * sg.y,
                            v.z * inv * g.z * sg.z, v.w * inv * g.w * sg.w);
    };
#pragma unroll
    for (int k = 0; k < FG_REGS; k++)
        if (k * T + t < n4) put(k * T + t, xv[k], gr.g[k]);
    for (int c = FG_REGS * T + t; c < n4; c += T)
        put(c, fg_load_x<L2>(x4 + c), ((const float4*)gamma)[c]);
    __syncthreads();
    hr_transform(fbuf, nb * QBLOCK, rot.block);
    const float scale = 1.0f / sqrtf((float)rot.block);
    for (int c0 = 0; c0 < n4; c0 += T) {
        const int c = c0 + t;
        const bool in = c < n4;
        float4 o = zero;
        if (in) {
            const float4 v = f4[c];
            o = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
        }
        float2 bm;
        const char4 packed = quant_block_float4(o, bm);
        if (in) {
            const int b = c >> 4;
            char4* dst = (char4*)(xs + fg_chunk(b, (c >> 2) & 3));
            dst[c & 3] = packed;
            if ((c & 15) == 0) ms[b] = bm;
        }
    }
}

// Row of the matrix behind slot i of row group g (clamped: a partial group re-reads a valid
// row and its result is not stored).
template <int R>
__device__ __forceinline__ unsigned fg_row(int g, int i, int rows, int half, int glu) {
    if (!glu) return min(g * R + i, rows - 1);
    constexpr int H = R / 2;
    return i < H ? min(g * H + i, half - 1) : half + min(g * H + i - H, half - 1);
}

template <int R, typename S>
struct WItem {
    uint4 w[R];
    float s[R];
};

template <int R, typename S>
__device__ __forceinline__ void fg_load(WItem<R, S>& it, const uint4* __restrict__ codes,
                                        const S* __restrict__ scales, int rows, int half,
                                        int glu, int nb, int g, int k, int lane) {
    const int b = 32 * k + lane;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (b < nb) {
            const unsigned at = fg_row<R>(g, i, rows, half, glu) * nb + b;
            it.w[i] = load_stream(codes + at);
            it.s[i] = load_scale(scales, at);
        } else {
            it.w[i] = make_uint4(0, 0, 0, 0);
            it.s[i] = 0.0f;
        }
    }
}

// Stores the R sums of group g (every lane holds all of them).
template <int R, bool L2 = false>
__device__ __forceinline__ void fg_store(const float* v, int g, int rows, int half, int glu,
                                         float* __restrict__ y, int accumulate, int lane) {
    if (!glu) {
        float val = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++)
            if (lane == i) val = v[i];
        const int r = g * R + lane;
        // With L2 the residual is read through L2 (see fg_load_x).
        if (lane < R && r < rows) {
            if (!accumulate) y[r] = val;
            else if (L2) y[r] = __ldcg(y + r) + val;
            else y[r] += val;
        }
        return;
    }
    constexpr int H = R / 2;
    float gate = 0.0f, up = 0.0f;
#pragma unroll
    for (int i = 0; i < H; i++)
        if (lane == i) {
            gate = v[i];
            up = v[i + H];
        }
    const int r = g * H + lane;
    if (lane < H && r < half) y[r] = glu_act(gate, up, glu - 1);
}

// Word c of a block's 16 bytes (c a compile-time constant after unrolling).
__device__ __forceinline__ unsigned word_of(const uint4& w, int c) {
    return c == 0 ? w.x : c == 1 ? w.y : c == 2 ? w.z : w.w;
}

// The R integer dot products of block b: row i's 16 bytes of codes `w[i]` against the block's
// int8 activations in shared memory (fg_chunk layout), each chunk loaded once for all R rows.
template <int R>
__device__ __forceinline__ void fg_block_dots(const uint4 (&w)[R], const uint4* xs, int b,
                                              int (&d)[R]) {
    ClassSums s[R];
#pragma unroll
    for (int i = 0; i < R; i++) s[i] = ClassSums{{0, 0, 0, 0}};
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const uint4 a = xs[fg_chunk(b, c)];
#pragma unroll
        for (int i = 0; i < R; i++) class_sums_add(s[i], word_of(w[i], c), a);
    }
#pragma unroll
    for (int i = 0; i < R; i++) d[i] = block_dot(s[i]);
}

template <int R, int SPLIT, typename S>
__device__ __forceinline__ void ternary_gemv_fused(
    const uint4* __restrict__ codes, const S* __restrict__ scales, int rows, int nb, int mode,
    const float* __restrict__ x, const float* __restrict__ gamma, float eps,
    const uint4* __restrict__ q, const float2* __restrict__ meta, float* __restrict__ y,
    int accumulate, int flags) {
    const int glu = fg_glu(flags), late = flags & FG_LATE_TRIGGER;
    __shared__ uint4 xs[FG_MAX_COLS / 16];
    __shared__ float2 ms[FG_MAX_COLS / QBLOCK];
    __shared__ float scratch[32];
    __shared__ float red[FG_WARPS][R];
    constexpr int TEAMS = FG_WARPS / SPLIT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int team = warp / SPLIT, sub = warp % SPLIT;
    const int half = rows / 2;
    const int groups = glu ? (half + R / 2 - 1) / (R / 2) : (rows + R - 1) / R;
    const int iters = (nb + 31) / 32;
    const int per = (iters + SPLIT - 1) / SPLIT;  // items of each warp per group
    const int stride = gridDim.x * TEAMS;
    const int g0 = blockIdx.x * TEAMS + team;
    const int mine = g0 < groups ? ((groups - 1 - g0) / stride + 1) * per : 0;
    TRACE_SCOPE(3, codes);
    if (!late) pdl_launch_dependents();
    // Item n of the warp is lane-step sub + SPLIT·(n % per) of group g0 + (n / per)·stride;
    // (gl, jl) is the next item to load.
    int gl = g0, jl = 0;
    auto advance = [&](int& gg, int& jj) {
        if (++jj == per) {
            jj = 0;
            gg += stride;
        }
    };
    WItem<R, S> cur, nx1, nx2;
    if (mine > 0) {
        fg_load<R, S>(cur, codes, scales, rows, half, glu, nb, gl, sub + SPLIT * jl, lane);
        advance(gl, jl);
    }
    if (mine > 1) {
        fg_load<R, S>(nx1, codes, scales, rows, half, glu, nb, gl, sub + SPLIT * jl, lane);
        advance(gl, jl);
    }
    const FgGamma gr = fg_gamma(mode, nb, gamma);
    pdl_wait();
    TRACE_WAITED();
    if (late) pdl_launch_dependents();
    fg_prologue(mode, nb, x, gr, gamma, eps, q, meta, xs, ms, scratch);
    __syncthreads();
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
    int g = g0, j = 0;
    for (int n = 0; n < mine; n++) {
        if (n + 2 < mine) {
            fg_load<R, S>(nx2, codes, scales, rows, half, glu, nb, gl, sub + SPLIT * jl, lane);
            advance(gl, jl);
        }
        const int b = 32 * (sub + SPLIT * j) + lane;
        if (b < nb) {
            int d[R];
            fg_block_dots<R>(cur.w, xs, b, d);
            const float2 m = ms[b];
#pragma unroll
            for (int i = 0; i < R; i++) acc[i] += cur.s[i] * (m.x * (float)d[i] - m.y);
        }
        if (j == per - 1) {
            float v[R];
#pragma unroll
            for (int i = 0; i < R; i++) {
                v[i] = warp_sum(acc[i]);
                acc[i] = 0.0f;
            }
            team_sum<R, SPLIT>(v, red, warp, team, lane);
            if (sub == 0) fg_store<R>(v, g, rows, half, glu, y, accumulate, lane);
        }
        cur = nx1;
        nx1 = nx2;
        advance(g, j);
    }
}

// Blocks of 8 warps, two per multiprocessor (one of this kernel and, through programmatic
// dependent launch, one of the next, which could then load its first weights early), measured
// 370 tok/s on 8B against 545 for one block of 16 warps; two blocks of 8 warps of this
// kernel, 523.
#define TERNARY_GEMV_FUSED(R, SPLIT, SN, S)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * FG_WARPS, 1)                             \
        ternary_gemv_fused_r##R##_s##SPLIT##_##SN(                                             \
            const uint4* codes, const S* scales, int rows, int nb, int mode, const float* x,    \
            const float* gamma, float eps, const uint4* q, const float2* meta, float* y,        \
            int accumulate, int glu, const float* signs, int rot_block) {                      \
        /* signs, rot_block: the streaming kernel's FG_IN_NORM_ROT (same argument list). */     \
        ternary_gemv_fused<R, SPLIT, S>(codes, scales, rows, nb, mode, x, gamma, eps, q, meta,  \
                                        y, accumulate, glu);                                   \
    }
#define TERNARY_GEMV_FUSED_SPLITS(R, SN, S) \
    TERNARY_GEMV_FUSED(R, 1, SN, S) TERNARY_GEMV_FUSED(R, 2, SN, S) TERNARY_GEMV_FUSED(R, 4, SN, S)
TERNARY_GEMV_FUSED_SPLITS(2, f16, half_bits)
TERNARY_GEMV_FUSED_SPLITS(4, f16, half_bits)
TERNARY_GEMV_FUSED_SPLITS(8, f16, half_bits)
TERNARY_GEMV_FUSED_SPLITS(2, f32, float)
TERNARY_GEMV_FUSED_SPLITS(4, f32, float)
TERNARY_GEMV_FUSED_SPLITS(8, f32, float)
