// The Gated DeltaNet mixer of a Qwen3.5 hybrid layer, one decode token (the CPU reference is
// trit's model/gated_delta.rs and kernels/delta_rule.rs): the causal depthwise conv with its
// rolling window, q/k L2 normalization, the per-head decay/update gate, the delta-rule step on
// the f32 state, and the gated RMSNorm of each value head.
//
// Per value head h (key head kh), state S (dv rows of dk values, row i = value dim i):
//   S ← g·S;  δ = β(v − S k);  S ← S + δ kᵀ;  o = S q.
// Rows are independent given q, k, g and β, so one warp updates one row (dk/32 values per
// lane kept in registers): the state is read once and written once per token.

// Most key dims per head (8 values per lane).
#define DN_MAX_DK 256
// Rows of one value head per thread block of deltanet_recur (4 warps, 4 rows each).
#define DN_ROWS 16

__device__ __forceinline__ float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float dn_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// out[c] = SiLU(Σ_j w[c][j] · in_j[c]) over the window (the K−1 kept inputs, oldest first,
// then x), then the window moves by one. One thread per channel: each touches only its own
// channel of the window, so no ordering between threads is needed.
extern "C" __global__ void deltanet_conv_silu(const float* __restrict__ x,
                                              float* __restrict__ window,
                                              const float* __restrict__ w, int channels,
                                              int kernel, float* __restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const float* wc = w + (size_t)c * kernel;
    const float xc = x[c];
    float acc = wc[kernel - 1] * xc;
    for (int j = 0; j < kernel - 1; j++) {
        const float in = window[(size_t)j * channels + c];
        acc += wc[j] * in;
        // Shift: slot j − 1 takes slot j (slot 0, the oldest, falls out).
        if (j > 0) window[(size_t)(j - 1) * channels + c] = in;
    }
    if (kernel > 1) window[(size_t)(kernel - 2) * channels + c] = xc;
    out[c] = acc * dn_sigmoid(acc);
}

// One delta-rule step. conv = [q (hk·dk) | k (hk·dk) | v (hv·dv)] after the conv;
// ab = [a (hv) | b (hv)] (decay and update-gate inputs). Grid (hv, ceil(dv / DN_ROWS)),
// 128 threads. `v_tiled`: value head h reads key head h mod hk (GGUF), else h / (hv / hk).
extern "C" __global__ void deltanet_recur(const float* __restrict__ conv,
                                          const float* __restrict__ ab,
                                          const float* __restrict__ a_neg,
                                          const float* __restrict__ dt_bias,
                                          float* __restrict__ state, int hk, int hv, int dk,
                                          int dv, int v_tiled, float* __restrict__ o) {
    __shared__ float qs[DN_MAX_DK];
    __shared__ float ks[DN_MAX_DK];
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int head = blockIdx.x;
    const int kh = v_tiled ? head % hk : head / (hv / hk);
    const int kw = hk * dk;
    float sq = 0.0f, sk = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        const float qv = conv[kh * dk + i], kv = conv[kw + kh * dk + i];
        qs[i] = qv;
        ks[i] = kv;
        sq += qv * qv;
        sk += kv * kv;
    }
    sq = block_sum(sq, scratch);
    sk = block_sum(sk, scratch);
    // mlx-lm's normalize_qk: the epsilon goes on the sum of squares; q also takes 1/√dk.
    const float iq = rsqrtf((float)dk) / sqrtf(sq + 1e-6f);
    const float ik = 1.0f / sqrtf(sk + 1e-6f);
    __syncthreads();
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        qs[i] *= iq;
        ks[i] *= ik;
    }
    __syncthreads();
    const float g = expf(a_neg[head] * dn_softplus(ab[head] + dt_bias[head]));
    const float beta = dn_sigmoid(ab[hv + head]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int per_lane = dk / 32;
    const float* v = conv + 2 * kw + (size_t)head * dv;
    const int row_end = min(dv, (int)(blockIdx.y + 1) * DN_ROWS);
    for (int i = blockIdx.y * DN_ROWS + warp; i < row_end; i += nw) {
        float* row = state + ((size_t)head * dv + i) * dk;
        float s[DN_MAX_DK / 32];
        float dot_k = 0.0f;
#pragma unroll
        for (int t = 0; t < DN_MAX_DK / 32; t++) {
            if (t < per_lane) {
                s[t] = g * row[lane + 32 * t];
                dot_k += s[t] * ks[lane + 32 * t];
            }
        }
        dot_k = warp_sum(dot_k);
        const float delta = beta * (v[i] - dot_k);
        float dot_q = 0.0f;
#pragma unroll
        for (int t = 0; t < DN_MAX_DK / 32; t++) {
            if (t < per_lane) {
                s[t] += delta * ks[lane + 32 * t];
                row[lane + 32 * t] = s[t];
                dot_q += s[t] * qs[lane + 32 * t];
            }
        }
        dot_q = warp_sum(dot_q);
        if (lane == 0) o[(size_t)head * dv + i] = dot_q;
    }
}

// Gated RMSNorm of each value head: out = RMSNorm(o)·w · SiLU(z). One block per head.
extern "C" __global__ void deltanet_gated_norm(const float* __restrict__ o,
                                               const float* __restrict__ z,
                                               const float* __restrict__ w, float eps, int dv,
                                               float* __restrict__ out) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const size_t base = (size_t)blockIdx.x * dv;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[base + i] * o[base + i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        const float zi = z[base + i];
        out[base + i] = o[base + i] * inv * w[i] * (zi * dn_sigmoid(zi));
    }
}
