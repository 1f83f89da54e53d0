// Bonsai 2's Walsh–Hadamard rotated basis on the GPU (formats.md §8; the CPU reference is
// trit's kernels/hadamard.rs `fwht_blocks` and model/rotation.rs). A rotated weight multiplies
// H_B(s ⊙ x): the activation is prepared (copied, RMS-normalized, or the SwiGLU of gate‖up),
// multiplied by its ±1 signs, transformed per block of B values, and quantized to the int8
// blocks the ternary GEMV reads — one kernel where the unrotated path has its norm or
// quantization kernel (where the unrotated path normalizes inside a fused GEMV's prologue or
// the DeltaNet kernel quantizes its own output, it is one launch more).
//
// One thread block per Hadamard block and row (B a power of two, 64..8192, held in shared
// memory): log2 B butterfly stages (a + b, a − b: the scalar CPU loop's operations on the same
// pairs, so the transform itself is bit-identical; up to three stages per barrier, hr_pass in
// common.cuh), one scale by 1/√B, then each warp quantizes 64-value blocks as quant_block_warp
// does (the CPU's ActQ8). The 64-value quantization blocks lie
// inside one Hadamard block because B is a multiple of 64.

#define HR_MAX_BLOCK 8192
// Values per thread whose γ and sign are loaded before griddepcontrol.wait (a 1024 block over
// 256 threads has 4).
#define HR_PRE 4
// What the rotated values are made from (`mode`).
#define HR_COPY 0   // x
#define HR_NORM 1   // RMSNorm(x) · gamma over all n values (each block sums the squares itself)
#define HR_GLU 2    // silu(x[i]) · x[n + i] (x = gate‖up)
#define HR_EMBED 3  // the embedding's inverse: s ⊙ H_B(x), optionally rounded to f16 around it

__device__ __forceinline__ float hr_round16(float v) { return h2f(f2h(v)); }

// xn (may be null): the prepared values before the rotation (the RMSNorm output, read by the
// unrotated projections of the same input). xr (may be null): the rotated f32 values (dense
// matrices read those; HR_EMBED writes its result there, xr may be x). q/meta (may be null):
// the rotated values' int8 blocks and their (d, d·Σq).
extern "C" __global__ void hadamard_quant(const float* x, const float* __restrict__ gamma,
                                          float eps, int n, int mode,
                                          const float* __restrict__ signs, int block,
                                          int round_f16, float* xn, float* xr, i8* q,
                                          float2* meta) {
    __shared__ float buf[HR_MAX_BLOCK];
    __shared__ float scratch[32];
    pdl_launch_dependents();
    const int t = threadIdx.x, T = blockDim.x;
    const int base = blockIdx.x * block;
    // γ and the signs are weights: those of this thread's first HR_PRE values are loaded
    // before the wait for the previous kernel (a DRAM round trip less after it).
    float pre_g[HR_PRE], pre_s[HR_PRE];
#pragma unroll
    for (int k = 0; k < HR_PRE; k++) {
        const int i = t + k * T;
        pre_g[k] = mode == HR_NORM && i < block ? gamma[base + i] : 0.0f;
        pre_s[k] = i < block ? signs[base + i] : 0.0f;
    }
    pdl_wait();
    // gridDim.y rows (a prompt's chunk; a decode step launches one): row y reads its input
    // at x + y·n (y·2n for HR_GLU's gate‖up rows) and writes at y·n values.
    const size_t row = blockIdx.y, rn = row * (size_t)n;
    x += mode == HR_GLU ? 2 * rn : rn;
    if (xn != nullptr) xn += rn;
    if (xr != nullptr) xr += rn;
    if (q != nullptr) q += rn;
    if (meta != nullptr) meta += rn / QBLOCK;
    float inv = 1.0f;
    if (mode == HR_NORM) {
        float ss = 0.0f;
        // Unrolled so that several loads are in flight (the sum's order is unchanged).
#pragma unroll 8
        for (int i = t; i < n; i += T) ss += x[i] * x[i];
        ss = block_sum(ss, scratch);
        inv = 1.0f / sqrtf(ss / (float)n + eps);
    }
    auto prepare = [&](int i, float gm, float sg) {
        const int g = base + i;
        float v;
        if (mode == HR_NORM) {
            v = x[g] * inv * gm;
        } else if (mode == HR_GLU) {
            v = silu_mul(x[g], x[n + g]);
        } else {
            v = x[g];
        }
        if (mode == HR_EMBED) {
            buf[i] = round_f16 ? hr_round16(v) : v;
        } else {
            if (xn != nullptr) xn[g] = v;
            buf[i] = v * sg;
        }
    };
#pragma unroll
    for (int k = 0; k < HR_PRE; k++)
        if (t + k * T < block) prepare(t + k * T, pre_g[k], pre_s[k]);
#pragma unroll 4
    for (int i = t + HR_PRE * T; i < block; i += T)
        prepare(i, mode == HR_NORM ? gamma[base + i] : 0.0f, signs[base + i]);
    __syncthreads();
    hr_transform(buf, block, block);
    const float scale = 1.0f / sqrtf((float)block);
    auto finish = [&](int i, float sg) {
        float v = buf[i] * scale;
        if (mode == HR_EMBED) {
            v *= sg;
            if (round_f16) v = hr_round16(v);
        }
        if (xr != nullptr) xr[base + i] = v;
        buf[i] = v;
    };
#pragma unroll
    for (int k = 0; k < HR_PRE; k++)
        if (t + k * T < block) finish(t + k * T, pre_s[k]);
    for (int i = t + HR_PRE * T; i < block; i += T) finish(i, signs[base + i]);
    if (q == nullptr) return;
    __syncthreads();
    const int lane = t & 31, warp = t >> 5, nw = T >> 5;
    for (int j = warp; j < block / QBLOCK; j += nw) {
        quant_block_warp(buf[QBLOCK * j + lane], buf[QBLOCK * j + lane + 32],
                         q + base + QBLOCK * j, meta + base / QBLOCK + j);
    }
}
