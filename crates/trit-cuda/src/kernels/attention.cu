// Attention of one new token: per-head RMSNorm of q and k (Qwen3), rotary embedding from a
// cos/sin table computed on the host with the CPU's code (NEOX or adjacent pairs, YaRN
// included), the new k and v appended to the f16 cache, then flash-decoding: the cache is cut
// into splits of ATT_SPLIT positions, each (head, split) block produces a partial softmax
// (max, sum, unnormalized output), and a combine kernel merges the splits of each head.
//
// Cache layout per layer: [kv_head][position][head_dim] f16. The position comes from the
// device-side step counter, so the launch geometry never changes with the length.

#define ATT_SPLIT 256
#define ATT_WARPS 4
#define MAX_E 8  // head_dim / 32 at most (head_dim ≤ 256)

// One block per head (q heads, then k heads, then v heads), head_dim threads.
extern "C" __global__ void qk_norm_rope_store(float* qkv, const float* q_norm, const float* k_norm,
                                              float eps, const float2* cos_sin, const int* step,
                                              int n_heads, int n_kv, int hd, int adjacent,
                                              half_bits* kc, half_bits* vc, int ctx) {
    __shared__ float scratch[32];
    __shared__ float vals[1024];
    const int head = blockIdx.x, t = threadIdx.x;
    const int pos = step[0];
    const bool is_q = head < n_heads, is_k = !is_q && head < n_heads + n_kv;
    float* vec = qkv + (size_t)head * hd;
    float v = vec[t];
    if (!is_q && !is_k) {
        const int kvh = head - n_heads - n_kv;
        vc[((size_t)kvh * ctx + pos) * hd + t] = f2h(v);
        return;
    }
    const float* nw = is_q ? q_norm : k_norm;
    if (nw != nullptr) {
        float ss = block_sum(v * v, scratch);
        v = v * (1.0f / sqrtf(ss / (float)hd + eps)) * nw[t];
    }
    vals[t] = v;
    __syncthreads();
    const int half = hd / 2;
    int i, partner;
    bool first;
    if (adjacent) {
        i = t / 2; first = (t % 2) == 0; partner = first ? t + 1 : t - 1;
    } else {
        first = t < half; i = first ? t : t - half; partner = first ? t + half : t - half;
    }
    const float2 cs = cos_sin[(size_t)pos * half + i];
    const float x0 = first ? v : vals[partner], x1 = first ? vals[partner] : v;
    const float r = first ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
    if (is_q) {
        vec[t] = r;
    } else {
        const int kvh = head - n_heads;
        kc[((size_t)kvh * ctx + pos) * hd + t] = f2h(r);
    }
}

// grid (n_heads, n_splits), ATT_WARPS warps. Each warp walks positions start+warp, +ATT_WARPS..
// with an online softmax; lanes hold E = hd/32 consecutive elements.
extern "C" __global__ void attn_partial(const float* __restrict__ q, const half_bits* __restrict__ kc,
                                        const half_bits* __restrict__ vc, const int* step,
                                        int n_heads, int n_kv, int hd, int ctx, float scale,
                                        float* part_o, float2* part_ml) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_o[ATT_WARPS][32 * MAX_E];
    const int h = blockIdx.x, s = blockIdx.y, n_splits = gridDim.y;
    const int len = step[0] + 1;
    const int start = s * ATT_SPLIT;
    if (start >= len) return;
    const int end = min(start + ATT_SPLIT, len);
    const int kvh = h / (n_heads / n_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int E = hd / 32;
    float qv[MAX_E], acc[MAX_E];
#pragma unroll
    for (int e = 0; e < MAX_E; e++) {
        qv[e] = e < E ? q[(size_t)h * hd + lane * E + e] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const half_bits* kbase = kc + (size_t)kvh * ctx * hd + lane * E;
    const half_bits* vbase = vc + (size_t)kvh * ctx * hd + lane * E;
    for (int p = start + warp; p < end; p += ATT_WARPS) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < MAX_E; e++)
            if (e < E) dot += qv[e] * h2f(kbase[(size_t)p * hd + e]);
        dot = warp_sum(dot);
        const float m_new = fmaxf(m, dot);
        const float corr = expf(m - m_new), pe = expf(dot - m_new);
        l = l * corr + pe;
#pragma unroll
        for (int e = 0; e < MAX_E; e++)
            if (e < E) acc[e] = acc[e] * corr + pe * h2f(vbase[(size_t)p * hd + e]);
        m = m_new;
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
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
}

// One block per head, hd threads: merges the head's splits into att[h·hd ..]; with `quant`
// (hd a multiple of 64) also its int8 blocks.
extern "C" __global__ void attn_combine(const float* __restrict__ part_o,
                                        const float2* __restrict__ part_ml, const int* step,
                                        int hd, int n_splits, float* att, i8* q, float2* meta,
                                        int quant) {
    __shared__ float vals[1024];
    const int h = blockIdx.x, t = threadIdx.x;
    const int len = step[0] + 1;
    const int used = min((len + ATT_SPLIT - 1) / ATT_SPLIT, n_splits);
    const size_t first = (size_t)h * n_splits;
    float M = -INFINITY;
    for (int s = 0; s < used; s++) M = fmaxf(M, part_ml[first + s].x);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < used; s++) {
        const float2 ml = part_ml[first + s];
        const float w = expf(ml.x - M);
        L += ml.y * w;
        o += part_o[(first + s) * hd + t] * w;
    }
    o /= L;
    att[(size_t)h * hd + t] = o;
    if (!quant) return;
    vals[t] = o;
    __syncthreads();
    const int lane = t & 31, warp = t >> 5;
    if (warp < hd / QBLOCK) {
        const int b = warp;
        const size_t gb = (size_t)h * (hd / QBLOCK) + b;
        quant_block_warp(vals[b * QBLOCK + lane], vals[b * QBLOCK + lane + 32], q + gb * QBLOCK,
                         meta + gb);
    }
}
