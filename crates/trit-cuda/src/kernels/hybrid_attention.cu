// The gated full attention of a Qwen3.5 hybrid layer, one decode token (CPU reference:
// trit's model/qwen35.rs `full_attention`). It differs from the dense `attn_decode`: the q
// projection interleaves per head `head_dim` query values and `head_dim` gate values, RoPE
// (NeoX pairs) turns only the first `rot` dims of each head, and the output is multiplied by
// sigmoid(gate) before the o projection.
//
// The f16 cache is laid out [position][kv head][head_dim], like attn_decode's.

#define HA_MAX_HD 256

// proj = [q‖gate interleaved per head (2·nh·hd) | k (nkv·hd) | v (nkv·hd)].
// Blocks 0..nh: query head → RMSNorm(q_norm) + partial RoPE into q, gate copied out.
// Blocks nh..nh+nkv: kv head → RMSNorm(k_norm) + partial RoPE, k and v appended to the cache
// at the current position. blockDim.x = hd (a multiple of 32, at most HA_MAX_HD).
// cos_sin: per position rot/2 (cos, sin) pairs. ROWS (the `_rows` kernels, a prompt's
// chunk): gridDim.y tokens, block row y taking the token whose row is proj + y·proj_row,
// position step[y], q/gate row y. The decode step's kernels are compiled without the row
// offsets: with them the 27B decoded 1.3–2.6 % slower in two H200 runs (session 12), although
// they are zero there; without them, within 0.5 % of before (noise).
template <bool ROWS>
__device__ __forceinline__ void hybrid_attn_prep_impl(
    const float* __restrict__ proj, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_sin,
    const int* step, int nh, int nkv, int hd, int rot, half_bits* __restrict__ k_cache,
    half_bits* __restrict__ v_cache, float* __restrict__ q, float* __restrict__ gate,
    int proj_row) {
    __shared__ float buf[HA_MAX_HD];
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int row = ROWS ? blockIdx.y : 0;
    proj += (size_t)row * proj_row;
    q += (size_t)row * nh * hd;
    gate += (size_t)row * nh * hd;
    const int pos = step[row];
    const int t = threadIdx.x;
    const bool is_q = (int)blockIdx.x < nh;
    const int h = is_q ? blockIdx.x : blockIdx.x - nh;
    const float* src = is_q ? proj + (size_t)h * 2 * hd
                            : proj + (size_t)2 * nh * hd + (size_t)h * hd;
    const float* nw = is_q ? q_norm : k_norm;
    const float x = src[t];
    const float ss = block_sum(x * x, scratch);
    const float y = x * (1.0f / sqrtf(ss / (float)hd + eps)) * nw[t];
    buf[t] = y;
    __syncthreads();
    const int half = rot / 2;
    float r = y;
    if (t < half) {
        const float c = cos_sin[((size_t)pos * half + t) * 2], s = cos_sin[((size_t)pos * half + t) * 2 + 1];
        r = buf[t] * c - buf[t + half] * s;
    } else if (t < rot) {
        const int i = t - half;
        const float c = cos_sin[((size_t)pos * half + i) * 2], s = cos_sin[((size_t)pos * half + i) * 2 + 1];
        r = buf[i] * s + buf[t] * c;
    }
    if (is_q) {
        q[(size_t)h * hd + t] = r;
        gate[(size_t)h * hd + t] = src[hd + t];
    } else {
        const size_t at = ((size_t)pos * nkv + h) * hd + t;
        k_cache[at] = f2h(r);
        v_cache[at] = f2h(proj[(size_t)2 * nh * hd + (size_t)nkv * hd + (size_t)h * hd + t]);
    }
}

#define HYBRID_ATTN_PREP(NAME, ROWS)                                                           \
    extern "C" __global__ void NAME(                                                           \
        const float* __restrict__ proj, const float* __restrict__ q_norm,                      \
        const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_sin,        \
        const int* step, int nh, int nkv, int hd, int rot, half_bits* __restrict__ k_cache,    \
        half_bits* __restrict__ v_cache, float* __restrict__ q, float* __restrict__ gate,      \
        int proj_row) {                                                                        \
        hybrid_attn_prep_impl<ROWS>(proj, q_norm, k_norm, eps, cos_sin, step, nh, nkv, hd, rot,  \
                                    k_cache, v_cache, q, gate, proj_row);                       \
    }
HYBRID_ATTN_PREP(hybrid_attn_prep, false)
HYBRID_ATTN_PREP(hybrid_attn_prep_rows, true)

// The batched decode step (hybrid/batch.rs): row y is one token of another sequence, whose
// caches are in its slot row_slot[y]: the slot table holds `stride` addresses per slot, this
// layer's key and value caches at `at` and `at + 1` (written by the host before the step, so
// read before the wait).
__device__ __forceinline__ const unsigned long long* ha_slot_entry(
    const unsigned long long* tab, int stride, int at, const int* row_slot) {
    return tab + (size_t)row_slot[blockIdx.y] * stride + at;
}
extern "C" __global__ void hybrid_attn_prep_slots(
    const float* __restrict__ proj, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_sin,
    const int* step, int nh, int nkv, int hd, int rot, const unsigned long long* tab,
    int stride, int at, const int* row_slot, float* __restrict__ q, float* __restrict__ gate,
    int proj_row) {
    const unsigned long long* e = ha_slot_entry(tab, stride, at, row_slot);
    hybrid_attn_prep_impl<true>(proj, q_norm, k_norm, eps, cos_sin, step, nh, nkv, hd, rot,
                                (half_bits*)e[0], (half_bits*)e[1], q, gate, proj_row);
}

// out[h] = sigmoid(gate[h]) ⊙ softmax(scale · q_h Kᵀ) V over positions 0..=pos, query head h
// reading kv head h / (nh / nkv). One block of HA_WARPS warps per query head; each warp runs an
// online softmax over every HA_WARPS-th position (lane holds hd/32 dims), HA_UNROLL of its
// positions per round: their keys and values are all requested before the first score is
// computed, so a round costs one memory round trip, not HA_UNROLL (with 4 warps and one
// position per round, 27B's 24 heads took ~11 µs at 128 positions). Then the warps merge.
// ROWS: gridDim.y tokens, as in hybrid_attn_prep_rows: block row y attends for the token at
// step[y] with q/gate/out row y (all of a chunk's keys and values are appended before).
#define HA_WARPS 8
#define HA_UNROLL 4
template <bool ROWS>
__device__ __forceinline__ void hybrid_attn_decode_impl(
    const float* __restrict__ q, const float* __restrict__ gate,
    const half_bits* __restrict__ k_cache, const half_bits* __restrict__ v_cache,
    const int* step, int nh, int nkv, int hd, float scale, float* __restrict__ out) {
    __shared__ float m_s[HA_WARPS], l_s[HA_WARPS];
    __shared__ float acc_s[HA_WARPS][HA_MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int row = ROWS ? blockIdx.y : 0;
    q += (size_t)row * nh * hd;
    gate += (size_t)row * nh * hd;
    out += (size_t)row * nh * hd;
    const int n = step[row] + 1;
    const int h = blockIdx.x, g = h / (nh / nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int per_lane = hd / 32;
    float qr[HA_MAX_HD / 32], acc[HA_MAX_HD / 32];
#pragma unroll
    for (int t = 0; t < HA_MAX_HD / 32; t++) {
        qr[t] = t < per_lane ? q[(size_t)h * hd + lane + 32 * t] * scale : 0.0f;
        acc[t] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p0 = warp; p0 < n; p0 += nw * HA_UNROLL) {
        float kf[HA_UNROLL][HA_MAX_HD / 32], vf[HA_UNROLL][HA_MAX_HD / 32];
#pragma unroll
        for (int u = 0; u < HA_UNROLL; u++) {
            const int p = p0 + u * nw;
            const size_t at = ((size_t)(p < n ? p : p0) * nkv + g) * hd + lane;
#pragma unroll
            for (int t = 0; t < HA_MAX_HD / 32; t++) {
                kf[u][t] = t < per_lane ? h2f(k_cache[at + 32 * t]) : 0.0f;
                vf[u][t] = t < per_lane ? h2f(v_cache[at + 32 * t]) : 0.0f;
            }
        }
        float s[HA_UNROLL];
#pragma unroll
        for (int u = 0; u < HA_UNROLL; u++) {
            float d = 0.0f;
#pragma unroll
            for (int t = 0; t < HA_MAX_HD / 32; t++) d += qr[t] * kf[u][t];
            s[u] = warp_sum(d);
        }
        // Position p0 < n is in range, so the new maximum is finite.
        float m_new = m;
#pragma unroll
        for (int u = 0; u < HA_UNROLL; u++)
            if (p0 + u * nw < n) m_new = fmaxf(m_new, s[u]);
        const float corr = expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int t = 0; t < HA_MAX_HD / 32; t++) acc[t] *= corr;
#pragma unroll
        for (int u = 0; u < HA_UNROLL; u++) {
            const float e = p0 + u * nw < n ? expf(s[u] - m_new) : 0.0f;
            l += e;
#pragma unroll
            for (int t = 0; t < HA_MAX_HD / 32; t++) acc[t] += e * vf[u][t];
        }
        m = m_new;
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < HA_MAX_HD / 32; t++)
        if (t < per_lane) acc_s[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    // Position 0 belongs to warp 0, so the overall maximum is finite; a warp without positions
    // has l = 0 and weighs nothing.
    float mx = -INFINITY;
    for (int i = 0; i < nw; i++) mx = fmaxf(mx, m_s[i]);
    float total = 0.0f;
    for (int i = 0; i < nw; i++) total += l_s[i] > 0.0f ? expf(m_s[i] - mx) * l_s[i] : 0.0f;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float o = 0.0f;
        for (int i = 0; i < nw; i++)
            if (l_s[i] > 0.0f) o += expf(m_s[i] - mx) * acc_s[i][j];
        const float gj = gate[(size_t)h * hd + j];
        out[(size_t)h * hd + j] = o / total / (1.0f + expf(-gj));
    }
}

#define HYBRID_ATTN_DECODE(NAME, ROWS)                                                         \
    extern "C" __global__ void __launch_bounds__(32 * HA_WARPS)                                \
        NAME(const float* __restrict__ q, const float* __restrict__ gate,                      \
             const half_bits* __restrict__ k_cache, const half_bits* __restrict__ v_cache,     \
             const int* step, int nh, int nkv, int hd, float scale, float* __restrict__ out) { \
        hybrid_attn_decode_impl<ROWS>(q, gate, k_cache, v_cache, step, nh, nkv, hd, scale, out); \
    }
HYBRID_ATTN_DECODE(hybrid_attn_decode, false)
HYBRID_ATTN_DECODE(hybrid_attn_decode_rows, true)

// hybrid_attn_decode_rows over each row's own slot (as hybrid_attn_prep_slots).
extern "C" __global__ void __launch_bounds__(32 * HA_WARPS) hybrid_attn_decode_slots(
    const float* __restrict__ q, const float* __restrict__ gate, const unsigned long long* tab,
    int stride, int at, const int* row_slot, const int* step, int nh, int nkv, int hd,
    float scale, float* __restrict__ out) {
    const unsigned long long* e = ha_slot_entry(tab, stride, at, row_slot);
    hybrid_attn_decode_impl<true>(q, gate, (const half_bits*)e[0], (const half_bits*)e[1], step,
                                  nh, nkv, hd, scale, out);
}
