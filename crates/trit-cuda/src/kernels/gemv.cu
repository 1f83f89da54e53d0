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

template <int R, typename S>
__device__ __forceinline__ void ternary_gemv(const uint4* __restrict__ codes,
                                             const S* __restrict__ scales, int rows, int nb,
                                             const uint4* __restrict__ xq,
                                             const float2* __restrict__ meta,
                                             float* __restrict__ y, int accumulate) {
    const int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    const int r0 = warp * R;
    if (r0 >= rows) return;
    size_t base[R];
#pragma unroll
    for (int i = 0; i < R; i++) base[i] = (size_t)min(r0 + i, rows - 1) * nb;
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
    // Two blocks per lane per iteration, every load issued before the first use: 2·R
    // 16-byte weight loads in flight per lane (a 4096-column row is one iteration).
    for (int b0 = lane; b0 < nb; b0 += 64) {
        const int b1 = b0 + 32;
        const bool has1 = b1 < nb;
        uint4 w0[R], w1[R];
        float s0[R], s1[R];
#pragma unroll
        for (int i = 0; i < R; i++) w0[i] = load_stream(codes + base[i] + b0);
#pragma unroll
        for (int i = 0; i < R; i++)
            w1[i] = has1 ? load_stream(codes + base[i] + b1) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < R; i++) {
            s0[i] = load_scale(scales, base[i] + b0);
            s1[i] = has1 ? load_scale(scales, base[i] + b1) : 0.0f;
        }
        const uint4 z = make_uint4(0, 0, 0, 0);
        const uint4 a0 = __ldg(xq + 4 * b0), a1 = __ldg(xq + 4 * b0 + 1);
        const uint4 a2 = __ldg(xq + 4 * b0 + 2), a3 = __ldg(xq + 4 * b0 + 3);
        const uint4 c0 = has1 ? __ldg(xq + 4 * b1) : z, c1 = has1 ? __ldg(xq + 4 * b1 + 1) : z;
        const uint4 c2 = has1 ? __ldg(xq + 4 * b1 + 2) : z, c3 = has1 ? __ldg(xq + 4 * b1 + 3) : z;
        const float2 m0 = __ldg(meta + b0);
        const float2 m1 = has1 ? __ldg(meta + b1) : make_float2(0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < R; i++) {
            int d = dot_block_word(w0[i].x, a0, 0);
            d = dot_block_word(w0[i].y, a1, d);
            d = dot_block_word(w0[i].z, a2, d);
            d = dot_block_word(w0[i].w, a3, d);
            int e = dot_block_word(w1[i].x, c0, 0);
            e = dot_block_word(w1[i].y, c1, e);
            e = dot_block_word(w1[i].z, c2, e);
            e = dot_block_word(w1[i].w, c3, e);
            acc[i] += s0[i] * (m0.x * (float)d - m0.y) + s1[i] * (m1.x * (float)e - m1.y);
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        float v = warp_sum(acc[i]);
        if (lane == 0 && r0 + i < rows) {
            if (accumulate) y[r0 + i] += v; else y[r0 + i] = v;
        }
    }
}

#define TERNARY_GEMV(NAME, R, S)                                                               \
    extern "C" __global__ void NAME(const uint4* codes, const S* scales, int rows, int nb,    \
                                    const uint4* xq, const float2* meta, float* y,            \
                                    int accumulate) {                                         \
        ternary_gemv<R, S>(codes, scales, rows, nb, xq, meta, y, accumulate);                 \
    }
TERNARY_GEMV(ternary_gemv_r1_f16, 1, half_bits)
TERNARY_GEMV(ternary_gemv_r2_f16, 2, half_bits)
TERNARY_GEMV(ternary_gemv_r4_f16, 4, half_bits)
TERNARY_GEMV(ternary_gemv_r8_f16, 8, half_bits)
TERNARY_GEMV(ternary_gemv_r1_f32, 1, float)
TERNARY_GEMV(ternary_gemv_r2_f32, 2, float)
TERNARY_GEMV(ternary_gemv_r4_f32, 4, float)
TERNARY_GEMV(ternary_gemv_r8_f32, 8, float)

// Dense f32 rows times unquantized f32 activations (the CPU's exact path for dense matrices).
extern "C" __global__ void dense_gemv(const float* __restrict__ w, int rows, int cols,
                                      const float* __restrict__ x, float* __restrict__ y,
                                      int accumulate) {
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
