// The small kernels between the matrix products: embedding lookup, RMSNorm + int8
// quantization, SwiGLU + quantization, and the step's position counter.
//
// `step` is a device-side int pair {position, unused}: the captured graph reads the position
// from it (never from a kernel argument), so one graph serves every position.

// x = row `toks[pos]` of a ternary matrix (codes in the GEMV layout, see gemv.cu).
template <typename S>
__device__ __forceinline__ void embed_ternary(const unsigned* __restrict__ codes,
                                              const S* __restrict__ scales, int nb,
                                              const int* toks, const int* step, float* x,
                                              float scale_of_dummy) {
    (void)scale_of_dummy;
    const int tok = toks[step[0]];
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nb * QBLOCK) return;
    const int b = c / QBLOCK, in = c % QBLOCK;
    const int j = in / 16, s = (in % 16) / 4, k = in % 4;
    const unsigned w = codes[((size_t)tok * nb + b) * 4 + j];
    const int code = (w >> (8 * k + 2 * s)) & 3;
    float sc;
    if (sizeof(S) == 2) sc = h2f(((const half_bits*)scales)[(size_t)tok * nb + b]);
    else sc = ((const float*)scales)[(size_t)tok * nb + b];
    x[c] = sc * (float)(code - 1);
}

extern "C" __global__ void embed_ternary_f16(const unsigned* codes, const half_bits* scales,
                                             int nb, const int* toks, const int* step, float* x) {
    embed_ternary<half_bits>(codes, scales, nb, toks, step, x, 0.0f);
}
extern "C" __global__ void embed_ternary_f32(const unsigned* codes, const float* scales,
                                             int nb, const int* toks, const int* step, float* x) {
    embed_ternary<float>(codes, scales, nb, toks, step, x, 0.0f);
}

extern "C" __global__ void embed_dense(const float* w, int cols, const int* toks,
                                       const int* step, float* x) {
    const int tok = toks[step[0]];
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) x[c] = w[(size_t)tok * cols + c];
}

// xn = RMSNorm(x) · w; then, when d is a multiple of 64, its int8 blocks. One thread block.
extern "C" __global__ void rms_norm_quant(const float* __restrict__ x, const float* __restrict__ w,
                                          float eps, int d, float* __restrict__ xn, i8* q,
                                          float2* meta) {
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) xn[i] = x[i] * inv * w[i];
    __syncthreads();
    if (d % QBLOCK != 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int b = warp; b < d / QBLOCK; b += nw) {
        const float* v = xn + b * QBLOCK;
        quant_block_warp(v[lane], v[lane + 32], q + b * QBLOCK, meta + b);
    }
}

// Quantizes n values (n a multiple of 64): one warp per block.
extern "C" __global__ void quantize_vec(const float* __restrict__ x, int n, i8* q, float2* meta) {
    const int b = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n / QBLOCK) return;
    const float* v = x + b * QBLOCK;
    quant_block_warp(v[lane], v[lane + 32], q + b * QBLOCK, meta + b);
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// h = silu(gate) · up for gu = [gate (ffn) | up (ffn)], plus its int8 blocks when ffn is a
// multiple of 64. One warp per 64 values.
extern "C" __global__ void silu_mul_quant(const float* __restrict__ gu, int ffn,
                                          float* __restrict__ h, i8* q, float2* meta) {
    const int b = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    const int i0 = b * QBLOCK + lane, i1 = i0 + 32;
    if (b * QBLOCK >= ffn) return;
    const float a = i0 < ffn ? silu_mul(gu[i0], gu[ffn + i0]) : 0.0f;
    const float c = i1 < ffn ? silu_mul(gu[i1], gu[ffn + i1]) : 0.0f;
    if (i0 < ffn) h[i0] = a;
    if (i1 < ffn) h[i1] = c;
    if (ffn % QBLOCK == 0) quant_block_warp(a, c, q + b * QBLOCK, meta + b);
}

// The last kernel of a captured step: the next replay runs one position further.
extern "C" __global__ void advance_position(int* step) {
    if (threadIdx.x == 0 && blockIdx.x == 0) step[0] += 1;
}
