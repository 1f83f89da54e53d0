// Attention of one new token, one kernel per layer: per-head RMSNorm of q and k (Qwen3),
// rotary embedding from a cos/sin table the host computed with the CPU's code (NEOX or
// adjacent pairs, YaRN included), the new k and v appended to the f16 cache, and
// flash-decoding over the cache.
//
// Grid (n_heads, n_splits): block (h, s) attends q head h over positions
// [s·ATT_SPLIT, (s+1)·ATT_SPLIT) ∩ [0, pos] and writes a partial softmax (max, sum,
// unnormalized output). The last block of a head to finish (an atomic counter per head, reset
// by that block) merges the partials and writes the head's output, with its int8 blocks.
// Blocks whose split lies past the position exit at once; the geometry never changes with the
// length, so one captured graph serves every position.
//
// The current position's k and v are computed by every block of the last split that needs
// them (from the fresh qkv, in shared memory); only the group's first q head writes them to
// the cache, and no block reads the cache at the current position, so there is no race.
//
// Cache layout per layer: [kv_head][position][head_dim] f16.

#define ATT_SPLIT 64
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define MAX_HD 256
#define MAX_E (MAX_HD / 32)

// RMSNorm (when `norm` is set) and rotation of the head vector `src` (hd floats) into `dst`
// (shared memory), scaled by `scale`. All threads of the block take part.
__device__ void norm_rope(const float* src, const float* norm, float eps, const float2* cs,
                          int hd, int adjacent, float scale, float* tmp, float* dst,
                          float* scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float v = src[i];
        tmp[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = norm != nullptr ? 1.0f / sqrtf(ss / (float)hd + eps) : 1.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        if (norm != nullptr) tmp[i] *= inv * norm[i];
    }
    __syncthreads();
    const int half = hd / 2;
    for (int t = threadIdx.x; t < hd; t += blockDim.x) {
        int i, partner;
        bool first;
        if (adjacent) {
            i = t / 2;
            first = (t % 2) == 0;
            partner = first ? t + 1 : t - 1;
        } else {
            first = t < half;
            i = first ? t : t - half;
            partner = first ? t + half : t - half;
        }
        const float2 c = cs[i];
        const float x0 = first ? tmp[t] : tmp[partner], x1 = first ? tmp[partner] : tmp[t];
        dst[t] = scale * (first ? x0 * c.x - x1 * c.y : x0 * c.y + x1 * c.x);
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attn_decode(const float* __restrict__ qkv, const float* q_norm, const float* k_norm, float eps,
            const float2* __restrict__ cos_sin, const int* step, int n_heads, int n_kv, int hd,
            int adjacent, half_bits* kc, half_bits* vc, int ctx, float scale, float* part_o,
            float2* part_ml, unsigned* counters, float* att, i8* q, float2* meta, int quant) {
    __shared__ float scratch[32];
    __shared__ float tmp[MAX_HD];
    __shared__ float qs[MAX_HD], kcur[MAX_HD], vcur[MAX_HD];
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_o[ATT_WARPS][MAX_HD];
    __shared__ bool is_last;
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, s = blockIdx.y, n_splits = gridDim.y;
    const int pos = step[0], len = pos + 1;
    const int used = min((len + ATT_SPLIT - 1) / ATT_SPLIT, n_splits);
    if (s >= used) return;
    const int start = s * ATT_SPLIT, end = min(start + ATT_SPLIT, len);
    const int group = n_heads / n_kv, kvh = h / group;
    const float2* cs = cos_sin + (size_t)pos * (hd / 2);
    const size_t kv_row = (size_t)kvh * ctx * hd;

    norm_rope(qkv + (size_t)h * hd, q_norm, eps, cs, hd, adjacent, scale, tmp, qs, scratch);
    const bool has_current = end == len;
    if (has_current) {
        norm_rope(qkv + (size_t)(n_heads + kvh) * hd, k_norm, eps, cs, hd, adjacent, 1.0f, tmp,
                  kcur, scratch);
        const float* v = qkv + (size_t)(n_heads + n_kv + kvh) * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vcur[i] = v[i];
        __syncthreads();
        if (h % group == 0) {
            for (int i = threadIdx.x; i < hd; i += blockDim.x) {
                kc[kv_row + (size_t)pos * hd + i] = f2h(kcur[i]);
                vc[kv_row + (size_t)pos * hd + i] = f2h(vcur[i]);
            }
        }
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int E = hd / 32;
    float qv[MAX_E], acc[MAX_E];
#pragma unroll
    for (int e = 0; e < MAX_E; e++) {
        qv[e] = e < E ? qs[lane * E + e] : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = start + warp; p < end; p += ATT_WARPS) {
        float kv_k[MAX_E], kv_v[MAX_E];
        if (p == pos) {
#pragma unroll
            for (int e = 0; e < MAX_E; e++) {
                kv_k[e] = e < E ? kcur[lane * E + e] : 0.0f;
                kv_v[e] = e < E ? vcur[lane * E + e] : 0.0f;
            }
        } else {
            const half_bits* kp = kc + kv_row + (size_t)p * hd + lane * E;
            const half_bits* vp = vc + kv_row + (size_t)p * hd + lane * E;
#pragma unroll
            for (int e = 0; e < MAX_E; e++) {
                kv_k[e] = e < E ? h2f(kp[e]) : 0.0f;
                kv_v[e] = e < E ? h2f(vp[e]) : 0.0f;
            }
        }
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < MAX_E; e++) dot += qv[e] * kv_k[e];
        dot = warp_sum(dot);
        const float m_new = fmaxf(m, dot);
        const float corr = expf(m - m_new), pe = expf(dot - m_new);
        l = l * corr + pe;
#pragma unroll
        for (int e = 0; e < MAX_E; e++) acc[e] = acc[e] * corr + pe * kv_v[e];
        m = m_new;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < MAX_E; e++)
        if (e < E) sm_o[warp][lane * E + e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
    const size_t slot = (size_t)h * n_splits + s;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm_m[w] > -INFINITY) o += sm_o[w][i] * expf(sm_m[w] - M);
        part_o[slot * hd + i] = o;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm_m[w] > -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
        part_ml[slot] = make_float2(M, L);
    }

    // The last block of head h to get here merges the head's partials.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(&counters[h], 1u);
        is_last = done == (unsigned)(used - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const size_t first = (size_t)h * n_splits;
    float MM = -INFINITY;
    for (int t = 0; t < used; t++) MM = fmaxf(MM, __ldcg(&part_ml[first + t].x));
    float LL = 0.0f;
    for (int t = 0; t < used; t++) {
        const float2 ml = __ldcg(&part_ml[first + t]);
        LL += ml.y * expf(ml.x - MM);
    }
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t < used; t++)
            o += __ldcg(&part_o[(first + t) * hd + i]) * expf(__ldcg(&part_ml[first + t].x) - MM);
        o /= LL;
        tmp[i] = o;
        att[(size_t)h * hd + i] = o;
    }
    if (threadIdx.x == 0) counters[h] = 0;
    if (!quant) return;
    __syncthreads();
    if (warp < hd / QBLOCK) {
        const size_t gb = (size_t)h * (hd / QBLOCK) + warp;
        quant_block_warp(tmp[warp * QBLOCK + lane], tmp[warp * QBLOCK + lane + 32],
                         q + gb * QBLOCK, meta + gb);
    }
}
