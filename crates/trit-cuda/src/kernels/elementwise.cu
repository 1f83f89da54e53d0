// The small kernels between the matrix products: embedding lookup, RMSNorm + int8
// quantization, SwiGLU + quantization, and the step's position counter.
//
// `step` is a device-side int pair {position, unused}: the captured graph reads the position
// from it (never from a kernel argument), so one graph serves every position.

__device__ __forceinline__ float load_scale_any(const half_bits* s, size_t i) { return h2f(s[i]); }
__device__ __forceinline__ float load_scale_any(const float* s, size_t i) { return s[i]; }

// x = row `toks[pos]` of a ternary matrix (codes in the GEMV layout, see gemv.cu). A prefill
// launches gridDim.y = T: block row y embeds the token at pos + y into row y of x.
template <typename S>
__device__ __forceinline__ void embed_ternary(const unsigned* __restrict__ codes,
                                              const S* __restrict__ scales, int nb,
                                              const int* toks, const int* step, float* x) {
    pdl_launch_dependents();
    pdl_wait();
    const int tok = toks[step[0] + blockIdx.y];
    x += (size_t)blockIdx.y * nb * QBLOCK;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nb * QBLOCK) return;
    const int b = c / QBLOCK, in = c % QBLOCK;
    const int j = in / 16, s = (in % 16) / 4, k = in % 4;
    const unsigned w = codes[((size_t)tok * nb + b) * 4 + j];
    const int code = (w >> (8 * k + 2 * s)) & 3;
    x[c] = load_scale_any(scales, (size_t)tok * nb + b) * (float)(code - 1);
}

extern "C" __global__ void embed_ternary_f16(const unsigned* codes, const half_bits* scales,
                                             int nb, const int* toks, const int* step, float* x) {
    embed_ternary<half_bits>(codes, scales, nb, toks, step, x);
}
extern "C" __global__ void embed_ternary_f32(const unsigned* codes, const float* scales,
                                             int nb, const int* toks, const int* step, float* x) {
    embed_ternary<float>(codes, scales, nb, toks, step, x);
}

// The embedding row of each token of a dense matrix of kind KIND (launch.rs embed).
#define EMBED_DENSE(NAME, KIND)                                                                 \
    extern "C" __global__ void NAME(const void* w, int cols, const int* toks, const int* step,  \
                                    float* x) {                                                  \
        pdl_launch_dependents();                                                                 \
        pdl_wait();                                                                              \
        const int tok = toks[step[0] + blockIdx.y];                                              \
        x += (size_t)blockIdx.y * cols;                                                          \
        const int c = blockIdx.x * blockDim.x + threadIdx.x;                                     \
        if (c < cols) x[c] = dense_at<KIND>(w, (size_t)tok * cols + c);                          \
    }
EMBED_DENSE(embed_dense, 0)
EMBED_DENSE(embed_dense_f16, 1)
EMBED_DENSE(embed_dense_bf16, 2)

// xn = RMSNorm(x) · w; then, when d is a multiple of 64, its int8 blocks. One thread block per
// row: a prefill launches gridDim.y = T rows of d values each. xn may be x (BitNet's sub-norms
// normalize the attention output and h in place): each value is read before the thread that
// read it writes it, so x and xn are not `__restrict__`.
extern "C" __global__ void rms_norm_quant(const float* x, const float* __restrict__ w,
                                          float eps, int d, float* xn, i8* q,
                                          float2* meta) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    x += (size_t)blockIdx.y * d;
    xn += (size_t)blockIdx.y * d;
    q += (size_t)blockIdx.y * d;
    meta += (size_t)blockIdx.y * (d / QBLOCK);
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

// The same with four values per thread kept in registers (d a multiple of 64, at most 8192,
// blockDim.x a multiple of 32 with d / blockDim.x ≤ 32): one reduction, no re-read; a
// 64-value block is 16 consecutive threads. One row takes 1024 threads; many rows (a
// prefill) take 256 each, so the whole prompt's rows fit on the GPU at once and each thread
// has several loads in flight. xn may be x (all of a row is in registers before any write).
#define NORM_V4_MAX 8
extern "C" __global__ void rms_norm_quant_v4(const float* x, const float* __restrict__ w,
                                             float eps, int d, float* xn, i8* q, float2* meta) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    x += (size_t)blockIdx.y * d;
    if (xn != nullptr) xn += (size_t)blockIdx.y * d;  // null: only the int8 blocks are wanted
    q += (size_t)blockIdx.y * d;
    meta += (size_t)blockIdx.y * (d / QBLOCK);
    const int n4 = d / 4, nt = blockDim.x;
    float4 v[NORM_V4_MAX];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_V4_MAX; j++) {
        const int c = threadIdx.x + j * nt;
        v[j] = c < n4 ? ((const float4*)x)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
    for (int j = 0; j < NORM_V4_MAX; j++) {
        const int c = threadIdx.x + j * nt;
        if (j * nt >= n4) break;  // uniform over the block
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c < n4) {
            const float4 g = ((const float4*)w)[c];
            o = make_float4(v[j].x * inv * g.x, v[j].y * inv * g.y, v[j].z * inv * g.z,
                            v[j].w * inv * g.w);
            if (xn != nullptr) ((float4*)xn)[c] = o;
        }
        float2 bm;
        const char4 packed = quant_block_float4(o, bm);
        if (c < n4) {
            ((char4*)q)[c] = packed;
            if ((c & 15) == 0) meta[c / 16] = bm;
        }
    }
}

// Quantizes n values (n a multiple of 64): one warp per block.
extern "C" __global__ void quantize_vec(const float* __restrict__ x, int n, i8* q, float2* meta) {
    TRACE_SCOPE(5, x);
    pdl_launch_dependents();
    pdl_wait();
    TRACE_WAITED();
    PROBE_SKIP(2);
    const int b = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= n / QBLOCK) return;
    const float* v = x + b * QBLOCK;
    quant_block_warp(v[lane], v[lane + 32], q + b * QBLOCK, meta + b);
}

// h = act(gate) · up for gu = [gate (ffn) | up (ffn)] (glu_act: SwiGLU or relu²), plus its
// int8 blocks when ffn is a multiple of 64. One warp per 64 values.
extern "C" __global__ void glu_quant(const float* __restrict__ gu, int ffn, int act,
                                     float* __restrict__ h, i8* q, float2* meta) {
    pdl_launch_dependents();
    pdl_wait();
    // Row blockIdx.y of a prefill's T rows (ffn a multiple of 64 there).
    gu += (size_t)blockIdx.y * 2 * ffn;
    if (h != nullptr) h += (size_t)blockIdx.y * ffn;  // null: only the int8 blocks are wanted
    q += (size_t)blockIdx.y * ffn;
    meta += (size_t)blockIdx.y * (ffn / QBLOCK);
    const int b = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    const int i0 = b * QBLOCK + lane, i1 = i0 + 32;
    if (b * QBLOCK >= ffn) return;
    const float a = i0 < ffn ? glu_act(gu[i0], gu[ffn + i0], act) : 0.0f;
    const float c = i1 < ffn ? glu_act(gu[i1], gu[ffn + i1], act) : 0.0f;
    if (h != nullptr && i0 < ffn) h[i0] = a;
    if (h != nullptr && i1 < ffn) h[i1] = c;
    if (ffn % QBLOCK == 0) quant_block_warp(a, c, q + b * QBLOCK, meta + b);
}

// The same for ffn a multiple of 64, four values per lane (float4 loads of gate and up): a
// 64-value block is 16 consecutive lanes (quant_block_float4, the same codes as
// quant_block_warp). Block (x, y): values 1024x .. 1024x + 1023 of row y.
extern "C" __global__ void glu_quant_v4(const float* __restrict__ gu, int ffn, int act,
                                        float* __restrict__ h, i8* q, float2* meta) {
    pdl_launch_dependents();
    pdl_wait();
    gu += (size_t)blockIdx.y * 2 * ffn;
    if (h != nullptr) h += (size_t)blockIdx.y * ffn;
    q += (size_t)blockIdx.y * ffn;
    meta += (size_t)blockIdx.y * (ffn / QBLOCK);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // float4 index in the row
    if ((c & ~31) * 4 >= ffn) return;                      // whole warps leave
    const bool in = c * 4 < ffn;
    const float4 g = in ? ((const float4*)gu)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 u = in ? ((const float4*)(gu + ffn))[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 o = make_float4(glu_act(g.x, u.x, act), glu_act(g.y, u.y, act),
                                 glu_act(g.z, u.z, act), glu_act(g.w, u.w, act));
    float2 bm;
    const char4 packed = quant_block_float4(o, bm);
    if (!in) return;
    if (h != nullptr) ((float4*)h)[c] = o;
    ((char4*)q)[c] = packed;
    if ((c & 15) == 0) meta[c / 16] = bm;
}

// The last kernel of a captured step: the next replay runs one position further.
extern "C" __global__ void advance_position(int* step) {
    TRACE_SCOPE(6, step);
    pdl_launch_dependents();
    pdl_wait();
    TRACE_WAITED();
    if (threadIdx.x == 0 && blockIdx.x == 0) step[0] += 1;
}
