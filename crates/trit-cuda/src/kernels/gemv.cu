// Matrix-vector products of the decode step.
//
// Ternary layout (see repack.rs): per row, one 16-byte word per 64 columns. u32 word j of a
// block covers columns 16j..16j+16; bits 2s..2s+2 of its byte k hold code (t + 1) of column
// 16j + 4s + k. So (word >> 2s) & 0x03030303 is four codes of four consecutive columns, the
// operand of one dp4a against the matching 4 int8 activations. Scales: one per row and block.
//
// A warp computes R rows: lane b takes blocks b, b+32, ... of all R rows, so every load of
// the warp is 512 contiguous bytes of one row (coalesced, 16 bytes per thread), R of them in
// flight per lane, and the activation block it loads is reused for the R rows.

__device__ __forceinline__ int dot_block_word(unsigned w, uint4 a, int acc) {
    acc = __dp4a((int)(w & 0x03030303u), (int)a.x, acc);
    acc = __dp4a((int)((w >> 2) & 0x03030303u), (int)a.y, acc);
    acc = __dp4a((int)((w >> 4) & 0x03030303u), (int)a.z, acc);
    acc = __dp4a((int)((w >> 6) & 0x03030303u), (int)a.w, acc);
    return acc;
}

__device__ __forceinline__ float load_scale(const half_bits* s, size_t i) { return h2f(__ldg(s + i)); }
__device__ __forceinline__ float load_scale(const float* s, size_t i) { return __ldg(s + i); }

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
            const size_t at = (size_t)min(g * R + i, rows - 1) * nb + b;
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
            const size_t at = (size_t)min(g * R + i, rows - 1) * nb + b;
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
template <int R, int SPLIT, typename S>
__device__ __forceinline__ void ternary_gemv(const uint4* __restrict__ codes,
                                             const S* __restrict__ scales, int rows, int nb,
                                             const uint4* __restrict__ xq,
                                             const float2* __restrict__ meta,
                                             float* __restrict__ y, int accumulate) {
    __shared__ float red[SPLIT][R];
    const int lane = threadIdx.x & 31, sub = threadIdx.x >> 5;
    const int groups = (rows + R - 1) / R;
    const int iters = (nb + 31) / 32;
    const int per = (iters + SPLIT - 1) / SPLIT;  // items of each warp per group
    int g = blockIdx.x, j = 0;
    pdl_launch_dependents();
    if (g >= groups) return;
    Item<R, S> cur, nxt;
    // Weights do not depend on the previous kernel: the first load is issued before waiting.
    load_item_weights<R, S>(cur, codes, scales, rows, nb, g, sub, lane);
    pdl_wait();
    load_item_acts<R, S>(cur, nb, xq, meta, sub, lane);
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
            int d = dot_block_word(cur.w[i].x, cur.a[0], 0);
            d = dot_block_word(cur.w[i].y, cur.a[1], d);
            d = dot_block_word(cur.w[i].z, cur.a[2], d);
            d = dot_block_word(cur.w[i].w, cur.a[3], d);
            acc[i] += cur.s[i] * (cur.m.x * (float)d - cur.m.y);
        }
        if (j == per - 1) {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float v = warp_sum(acc[i]);
                if (lane == 0) red[sub][i] = v;
                acc[i] = 0.0f;
            }
            __syncthreads();
            if (sub == 0 && lane < R) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < SPLIT; w++) v += red[w][lane];
                const int r = g * R + lane;
                if (r < rows) {
                    if (accumulate) y[r] += v; else y[r] = v;
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
        const float2* meta, float* y, int accumulate) {                                       \
        ternary_gemv<R, SPLIT, S>(codes, scales, rows, nb, xq, meta, y, accumulate);          \
    }
#define TERNARY_GEMV_SPLITS(R, SN, S) \
    TERNARY_GEMV(R, 1, SN, S) TERNARY_GEMV(R, 2, SN, S) TERNARY_GEMV(R, 4, SN, S)
TERNARY_GEMV_SPLITS(2, f16, half_bits)
TERNARY_GEMV_SPLITS(4, f16, half_bits)
TERNARY_GEMV_SPLITS(8, f16, half_bits)
TERNARY_GEMV_SPLITS(2, f32, float)
TERNARY_GEMV_SPLITS(4, f32, float)
TERNARY_GEMV_SPLITS(8, f32, float)

// Dense f32 rows times unquantized f32 activations (the CPU's exact path for dense matrices).
extern "C" __global__ void dense_gemv(const float* __restrict__ w, int rows, int cols,
                                      const float* __restrict__ x, float* __restrict__ y,
                                      int accumulate) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* wr = w + (size_t)row * cols;
    float acc = 0.0f;
    if ((cols & 3) == 0) {
        const float4* w4 = (const float4*)wr;
        const float4* x4 = (const float4*)x;
        for (int c = lane; c < cols / 4; c += 32) {
            float4 a = __ldg(w4 + c), b = __ldg(x4 + c);
            acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    } else {
        for (int c = lane; c < cols; c += 32) acc += __ldg(wr + c) * __ldg(x + c);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        if (accumulate) y[row] += acc; else y[row] = acc;
    }
}
