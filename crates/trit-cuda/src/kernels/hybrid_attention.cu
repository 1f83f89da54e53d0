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

// The decode step's gated attention in one kernel (what hybrid_attn_prep, hybrid_attn_decode
// and the o projection's quantize_vec do in three). Grid (query heads, splits): as attention.cu's
// attn_decode, the len = pos + 1 positions are cut into `used` splits of `chunk` positions (a
// multiple of DEC_CHUNK, at least min_chunk; blocks past them exit at once), and with more than
// one the last block of a head merges the partials (merge_splits). Each block of DEC_WARPS warps
// normalizes and turns its q head and its kv head's k (every block of a kv group computes the
// same k; the group's first, in the split holding the position, writes k and v to the cache),
// attends with attention.cu's rounds (each warp DEC_U consecutive positions at a time) and
// writes sigmoid(gate) ⊙ output, with its int8 blocks when `quant` (head_dim a multiple of
// QBLOCK). Before griddepcontrol.wait (while the q‖gate/k/v GEMV still runs) it reads the
// position, the norm weights and each warp's first round of cached keys and values, and asks
// L2 for the warp's later rounds: all final there (the position and the cached rows below it
// change only between steps: attention.cu's ATT_EARLY_ROUND says why). The current position's
// k and v come from shared memory, rounded to f16 as the cache holds them.
// HA_PREFETCH (default 1; -DHA_PREFETCH=0 for A/B): the L2 requests of the later rounds.
#ifndef HA_PREFETCH
#define HA_PREFETCH 1
#endif
// SLOTS (the batched step's rows, hybrid_attn_step_slots): block row y is a token of another
// sequence (the caller offsets the pointers), attended by one block per head (no splits).
template <int E, bool SLOTS>
__device__ __forceinline__ void hybrid_attn_step_impl(
    const float* __restrict__ proj, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const float2* __restrict__ cos_sin,
    const int* step, int nh, int nkv, int rot, half_bits* kc, half_bits* vc, float scale,
    float* part_o, float2* part_ml, unsigned* counters, int min_chunk,
    float* __restrict__ out, i8* q8, float2* meta, int quant) {
    constexpr int HD = 32 * E;
    __shared__ float2 scratch2[32];
    __shared__ float qt[HD], kt[HD], qs[HD], kcur[HD], vcur[HD];
    __shared__ float sm_m[DEC_WARPS], sm_l[DEC_WARPS];
    __shared__ float sm_o[DEC_WARPS][HD];
    __shared__ bool is_last;
    pdl_launch_dependents();
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int h = blockIdx.x, group = nh / nkv, kvh = h / group;
    const int s = SLOTS ? 0 : blockIdx.y, n_splits = SLOTS ? 1 : gridDim.y;
    const bool mine = t < HD;
    const float qn = mine ? q_norm[t] : 0.0f, kn = mine ? k_norm[t] : 0.0f;
    const int pos = step[0], len = pos + 1, stride = nkv * HD;
    const int chunk = max(min_chunk,
                          ((len + n_splits - 1) / n_splits + DEC_CHUNK - 1) / DEC_CHUNK * DEC_CHUNK);
    const int used = (len + chunk - 1) / chunk;
    if (s >= used) return;
    const int start = s * chunk, end = min(start + chunk, len);
    const half_bits* kh = kc + (size_t)kvh * HD;
    const half_bits* vh = vc + (size_t)kvh * HD;
    const int p0 = start + warp * DEC_U;
    float kk[DEC_U][E], vv[DEC_U][E];
    if (p0 < end) load_round<E>(kh, vh, stride, p0, end, pos, lane, kk, vv);
#if HA_PREFETCH
    prefetch_rounds<E>(kh, vh, stride, p0, min(end, pos), lane);
#endif
    const float2 rc = rope_coef(cos_sin + (size_t)pos * (rot / 2), t, rot, 0);
    pdl_wait();

    const float* qsrc = proj + (size_t)h * 2 * HD;
    const float* ksrc = proj + (size_t)2 * nh * HD + (size_t)kvh * HD;
    float a = 0.0f, b = 0.0f, gate = 0.0f, v = 0.0f;
    if (mine) {
        a = qsrc[t];
        gate = qsrc[HD + t];
        b = ksrc[t];
        v = ksrc[(size_t)nkv * HD + t];
    }
    norm_rope_pair(a, b, true, true, qn, kn, eps, rc, HD, rot, 0, qt, kt, scratch2);
    const bool has_current = end == len;
    if (mine) {
        const half_bits k16 = f2h(b), v16 = f2h(v);
        qs[t] = a * scale;
        kcur[t] = h2f(k16);
        vcur[t] = h2f(v16);
        if (has_current && h % group == 0) {
            const size_t at = (size_t)pos * stride + (size_t)kvh * HD + t;
            kc[at] = k16;
            vc[at] = v16;
        }
    }
    __syncthreads();

    float m, l, acc[E];
    attend_rounds<E>(qs, kcur, vcur, kh, vh, stride, p0, end, pos, has_current, lane, kk, vv, m,
                     l, acc);
    const float M = warps_share<DEC_WARPS>(m, l, acc, sm_m, sm_l, sm_o);
    // qt is free again (its last reads were before the barrier in warps_share); each value is
    // written and then read by thread t.
    if (used == 1) {
        const float L = warps_sum<DEC_WARPS>(sm_m, sm_l, M);
        if (mine) qt[t] = warps_value<DEC_WARPS>(sm_m, sm_o, M, t) / L;
    } else if (!merge_splits<DEC_WARPS>(sm_m, sm_l, sm_o, M, h, s, n_splits, used, HD, part_o,
                                        part_ml, counters, &is_last, qt)) {
        return;
    }
    if (mine) qt[t] /= 1.0f + expf(-gate);
    write_head(qt, h, HD, out, q8, meta, quant);
}

// hybrid_attn_step_e4 (head_dim 128) and hybrid_attn_step (256, the 27B's).
#define HYBRID_ATTN_STEP(NAME, E)                                                              \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) NAME(                            \
        const float* __restrict__ proj, const float* __restrict__ q_norm,                      \
        const float* __restrict__ k_norm, float eps, const float2* __restrict__ cos_sin,       \
        const int* step, int nh, int nkv, int rot, half_bits* kc, half_bits* vc, float scale,  \
        float* part_o, float2* part_ml, unsigned* counters, int min_chunk,                     \
        float* __restrict__ out, i8* q8, float2* meta, int quant) {                            \
        hybrid_attn_step_impl<E, false>(proj, q_norm, k_norm, eps, cos_sin, step, nh, nkv, rot, \
                                        kc, vc, scale, part_o, part_ml, counters, min_chunk,  \
                                        out, q8, meta, quant);                                \
    }
HYBRID_ATTN_STEP(hybrid_attn_step_e4, 4)
HYBRID_ATTN_STEP(hybrid_attn_step, 8)

// The batched decode step's rows (hybrid/batch.rs; what hybrid_attn_prep_slots and
// hybrid_attn_decode_slots do in two): grid (query heads, rows), row y the token whose
// q‖gate/k/v row is proj + y·proj_row, at position pos[y], in slot row_slot[y]'s caches; its
// output row out + y·nh·head_dim (quantized by the caller).
#define HYBRID_ATTN_STEP_SLOTS(NAME, E)                                                        \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) NAME(                            \
        const float* __restrict__ proj, const float* __restrict__ q_norm,                      \
        const float* __restrict__ k_norm, float eps, const float2* __restrict__ cos_sin,       \
        const int* pos, int nh, int nkv, int rot, const unsigned long long* tab, int stride,   \
        int at, const int* row_slot, float scale, float* __restrict__ out, int proj_row) {     \
        const int y = blockIdx.y;                                                              \
        const unsigned long long* e = ha_slot_entry(tab, stride, at, row_slot);                \
        hybrid_attn_step_impl<E, true>(proj + (size_t)y * proj_row, q_norm, k_norm, eps,       \
                                       cos_sin, pos + y, nh, nkv, rot, (half_bits*)e[0],       \
                                       (half_bits*)e[1], scale, nullptr, nullptr, nullptr, 0,  \
                                       out + (size_t)y * nh * 32 * E, nullptr, nullptr, 0);    \
    }
HYBRID_ATTN_STEP_SLOTS(hybrid_attn_step_e4_slots, 4)
HYBRID_ATTN_STEP_SLOTS(hybrid_attn_step_slots, 8)
