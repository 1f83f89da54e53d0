// The dense decode GEMV (gemv.cu's ternary kernels' neighbour for matrices kept in f32, f16 or
// bf16). Compiled after gemv.cu in one program (device.rs SOURCES).

// Dense matrices (f32, or f16/bf16 kept at 2 bytes: BitNet's tied 128k-row embedding and
// head; the CPU's exact path for dense matrices): y[t][r] (+)= Σ_c w[r][c] · x[t][c] for ntok
// rows of x. One warp per matrix row and up to DENSE_TILE tokens per block row (gridDim.y =
// ⌈ntok / DENSE_TILE⌉), so a batch of rows reads each weight once per tile instead of once per
// token.
#define DENSE_TILE 8

template <int KIND>
__device__ __forceinline__ void dense_rows(const void* __restrict__ w, int rows, int cols,
                                           const float* __restrict__ x, int ntok,
                                           float* __restrict__ y, int accumulate) {
    pdl_launch_dependents();
    pdl_wait();
    const int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t0 = blockIdx.y * DENSE_TILE, nt = min(DENSE_TILE, ntok - t0);
    x += (size_t)t0 * cols;
    const size_t base = (size_t)row * cols;
    float acc[DENSE_TILE];
#pragma unroll
    for (int t = 0; t < DENSE_TILE; t++) acc[t] = 0.0f;
    if ((cols & 7) == 0) {
#pragma unroll 2
        for (int c = lane * 8; c < cols; c += 256) {
            float v[8];
            dense_at8<KIND>(w, base + c, v);
#pragma unroll
            for (int t = 0; t < DENSE_TILE; t++) {
                if (t >= nt) break;
                const float4* xt = (const float4*)(x + (size_t)t * cols + c);
                const float4 a = __ldg(xt), b = __ldg(xt + 1);
                acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x +
                          v[5] * b.y + v[6] * b.z + v[7] * b.w;
            }
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            const float wv = dense_at<KIND>(w, base + c);
#pragma unroll
            for (int t = 0; t < DENSE_TILE; t++) {
                if (t >= nt) break;
                acc[t] += wv * __ldg(x + (size_t)t * cols + c);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < DENSE_TILE; t++) {
        if (t >= nt) break;  // uniform over the warp
        const float sum = warp_sum(acc[t]);
        if (lane == 0) {
            float* out = y + (size_t)(t0 + t) * rows + row;
            *out = accumulate ? *out + sum : sum;
        }
    }
}

#define DENSE_ROWS(NAME, KIND)                                                                  \
    extern "C" __global__ void NAME(const void* w, int rows, int cols, const float* x, int ntok, \
                                    float* y, int accumulate) {                                 \
        dense_rows<KIND>(w, rows, cols, x, ntok, y, accumulate);                                \
    }
DENSE_ROWS(dense_rows_f32, 0)
DENSE_ROWS(dense_rows_f16, 1)
DENSE_ROWS(dense_rows_bf16, 2)
