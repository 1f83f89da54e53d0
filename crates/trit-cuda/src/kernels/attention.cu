// Attention of one new token, one kernel per layer: per-head RMSNorm of q and k (Qwen3),
// rotary embedding from a cos/sin table the host computed with the CPU's code (NEOX or
// adjacent pairs, YaRN included), the new k and v appended to the f16 cache, and
// flash-decoding over the cache.
//
// Grid (n_heads, n_splits): the len = pos + 1 positions are cut into `used` ≤ n_splits splits
// of `chunk` positions (len / n_splits rounded up to a multiple of DEC_CHUNK, so a short
// context takes few blocks and a long one all of them); block (h, s) attends q head h over
// split s and writes a partial softmax (max, sum, unnormalized output). The last block of a head to finish (an atomic counter per head, reset
// by that block) merges the partials and writes the head's output, with its int8 blocks.
// Blocks whose split lies past the position exit at once; the geometry never changes with the
// length, so one captured graph serves every position.
//
// The current position's k and v are computed by every block of the last split that needs
// them (from the fresh qkv, in shared memory); only the group's first q head writes them to
// the cache, and no block reads the cache at the current position, so there is no race.
//
// Cache layout per layer: [kv_head][position][head_dim] f16.

// Threads of the prefill's attention kernels (prefill.cu).
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define MAX_HD 256
#define MAX_E (MAX_HD / 32)
// The decode kernel: DEC_WARPS warps per block, DEC_U positions per warp at a time, splits of
// a multiple of DEC_CHUNK positions.
#define DEC_THREADS 256
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_U 4
#define DEC_CHUNK (DEC_WARPS * DEC_U)

// The (cos, sin) of pair element t (< rot) in the position's table row `cs`: NEOX halves or
// adjacent pairs. Decode kernels load theirs before griddepcontrol.wait — the row depends only
// on the position, and a step's weights evict it from L2, so after the wait it was a memory
// round trip on the attention's chain of dependent loads.
__device__ __forceinline__ float2 rope_coef(const float2* cs, int t, int rot, int adjacent) {
    if (t >= rot) return make_float2(1.0f, 0.0f);
    const int half = rot / 2;
    return cs[adjacent ? t / 2 : (t < half ? t : t - half)];
}

// Rotation of pair element t (< rot, the rotated dims of a head) by NEOX halves or adjacent
// pairs, from the normalized values in `src`, with its coefficient c (rope_coef).
__device__ __forceinline__ float rope_with(const float* src, float2 c, int t, int rot,
                                           int adjacent) {
    int partner;
    bool first;
    if (adjacent) {
        first = (t % 2) == 0;
        partner = first ? t + 1 : t - 1;
    } else {
        const int half = rot / 2;
        first = t < half;
        partner = first ? t + half : t - half;
    }
    const float x0 = first ? src[t] : src[partner], x1 = first ? src[partner] : src[t];
    return first ? x0 * c.x - x1 * c.y : x0 * c.y + x1 * c.x;
}

__device__ __forceinline__ float rope_at(const float* src, const float2* cs, int t, int rot,
                                         int adjacent) {
    return rope_with(src, rope_coef(cs, t, rot, adjacent), t, rot, adjacent);
}

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
    for (int t = threadIdx.x; t < hd; t += blockDim.x)
        dst[t] = scale * rope_at(tmp, cs, t, hd, adjacent);
    __syncthreads();
}

// The q and k values a / b of thread t (element t of a head of hd, zeros past it) RMS-normalized
// with one block reduction for both sums of squares (when norm_q / norm_k; weights wq / wk loaded
// before the kernel's wait) and rotated over their first `rot` dims (NEOX halves or adjacent
// pairs, the thread's coefficient c = rope_coef, also loaded before the wait; the rest pass
// through), in place. qt / kt: shared staging for the rotation's partners.
// Every thread of the block calls it (the decode kernels' chain of barriers and dependent loads
// is most of their time at short contexts: one reduction, two barriers).
__device__ __forceinline__ void norm_rope_pair(float& a, float& b, bool norm_q, bool norm_k,
                                               float wq, float wk, float eps, float2 c,
                                               int hd, int rot, int adjacent, float* qt,
                                               float* kt, float2* scratch2) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const float sq = warp_sum(a * a), sk = warp_sum(b * b);
    if (lane == 0) scratch2[warp] = make_float2(sq, sk);
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    float2 ss = lane < nw ? scratch2[lane] : make_float2(0.0f, 0.0f);
    ss.x = warp_sum(ss.x);
    ss.y = warp_sum(ss.y);
    if (norm_q) a *= 1.0f / sqrtf(ss.x / (float)hd + eps) * wq;
    if (norm_k) b *= 1.0f / sqrtf(ss.y / (float)hd + eps) * wk;
    if (t < hd) {
        qt[t] = a;
        kt[t] = b;
    }
    __syncthreads();
    if (t < rot) {
        a = rope_with(qt, c, t, rot, adjacent);
        b = rope_with(kt, c, t, rot, adjacent);
    }
}

// norm_rope_pair of the q head and, when `ksrc` is set, the k head, from and into shared
// memory (q scaled by `scale`), with the v head (`vsrc`, copied to `vdst`) loaded alongside.
// One element per thread (hd ≤ blockDim.x); its norm weights qn / kn and rotation coefficient
// c were loaded before the kernel's wait (`q_norm` / `k_norm` only say whether there are any).
__device__ void norm_rope_qk(const float* qsrc, const float* ksrc, const float* vsrc,
                             const float* q_norm, const float* k_norm, float qn, float kn,
                             float eps, float2 c, int hd, int adjacent, float scale,
                             float* qt, float* kt, float* qdst, float* kdst, float* vdst,
                             float2* scratch2) {
    const int i = threadIdx.x;
    float a = 0.0f, b = 0.0f;
    if (i < hd) {
        a = qsrc[i];
        if (ksrc != nullptr) {
            b = ksrc[i];
            vdst[i] = vsrc[i];
        }
    }
    norm_rope_pair(a, b, q_norm != nullptr, ksrc != nullptr && k_norm != nullptr, qn, kn, eps, c,
                   hd, hd, adjacent, qt, kt, scratch2);
    if (i < hd) {
        qdst[i] = scale * a;
        if (ksrc != nullptr) kdst[i] = b;
    }
    __syncthreads();
}

// Loads E consecutive f16 values (E·2 bytes, aligned to it when E is even) as floats.
template <int E>
__device__ __forceinline__ void load_halves(const half_bits* p, float* out) {
    if (E % 4 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            const uint2 v = *(const uint2*)(p + e);
            out[e] = h2f((half_bits)(v.x & 0xffff));
            out[e + 1] = h2f((half_bits)(v.x >> 16));
            out[e + 2] = h2f((half_bits)(v.y & 0xffff));
            out[e + 3] = h2f((half_bits)(v.y >> 16));
        }
    } else if (E % 2 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            const unsigned v = *(const unsigned*)(p + e);
            out[e] = h2f((half_bits)(v & 0xffff));
            out[e + 1] = h2f((half_bits)(v >> 16));
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; e++) out[e] = h2f(p[e]);
    }
}

// One round of a warp's cache reads: positions p0 .. p0 + DEC_U of head row `kv` (E values per
// lane; positions `stride` halves apart: head_dim in this file's layout, n_kv · head_dim in
// the hybrid's); zeros past `end` and at the current position `pos` (not in the cache yet:
// the caller puts it in from shared memory).
template <int E>
__device__ __forceinline__ void load_round(const half_bits* kc, const half_bits* vc, int stride,
                                           int p0, int end, int pos, int lane,
                                           float (&kk)[DEC_U][E], float (&vv)[DEC_U][E]) {
#pragma unroll
    for (int u = 0; u < DEC_U; u++) {
        const int p = p0 + u;
        if (p < end && p != pos) {
            load_halves<E>(kc + (size_t)p * stride + lane * E, kk[u]);
            load_halves<E>(vc + (size_t)p * stride + lane * E, vv[u]);
        } else {
#pragma unroll
            for (int e = 0; e < E; e++) kk[u][e] = vv[u][e] = 0.0f;
        }
    }
}

// L2 requests for a warp's later rounds (positions p0 + DEC_CHUNK, p0 + 2·DEC_CHUNK, … below
// `end`, DEC_U at a time; rows `stride` halves apart, E values per lane) of keys and values, so
// those rounds wait for L2 instead of memory. Issued before the kernel's wait, like the first
// round's loads.
template <int E>
__device__ __forceinline__ void prefetch_rounds(const half_bits* kh, const half_bits* vh,
                                                int stride, int p0, int end, int lane) {
    // A row is 32·E halves: LINES cache lines of 128 bytes (one line when shorter).
    constexpr int LINES = E * 64 / 128 > 0 ? E * 64 / 128 : 1;
    for (int r0 = p0 + DEC_CHUNK; r0 < end; r0 += DEC_CHUNK)
        for (int i = lane; i < DEC_U * 2 * LINES; i += 32) {
            const int p = r0 + i / (2 * LINES);
            const half_bits* row = ((i / LINES) & 1) ? vh : kh;
            if (p < end) prefetch_l2(row + (size_t)p * stride + (i % LINES) * 64);
        }
}

// ATT_WARP_NORM (measurement, default 0; -DATT_WARP_NORM=1 for A/B, heads of an even E):
// warp_norm_rope instead of norm_rope_qk in the decode kernel, so no block barrier stands
// between the wait and each warp's round (session 34's trace: the q/k/v read and norm took
// ~1.5 µs after the wait, two barriers of it).
#ifndef ATT_WARP_NORM
#define ATT_WARP_NORM 0
#endif

// norm_rope_qk done by every warp on its own: lane l reads elements E·l … E·l + E − 1 of the
// q head (and, with `ksrc`, of the k and v heads), the sums of squares are warp sums, NEOX
// partners (16·E apart) come from lane l ^ 16 by shuffle and adjacent pairs sit in one lane
// (E even). Each lane writes its own elements of qs / kcur / vcur — the ones attend_rounds reads
// in that lane — so nothing waits for the other warps (every warp writes the same values).
// wq / wk / c: the lane's norm weights and rotation coefficients, loaded before the wait.
// norm_rope_qk's arithmetic, except that Σx² is summed in another order.
template <int E>
__device__ __forceinline__ void warp_norm_rope(const float* qsrc, const float* ksrc,
                                               const float* vsrc, bool norm_q, bool norm_k,
                                               const float (&wq)[E], const float (&wk)[E],
                                               const float2 (&c)[E], float eps, int hd,
                                               int adjacent, float scale, float* qs, float* kcur,
                                               float* vcur) {
    static_assert(E % 2 == 0, "adjacent pairs must sit in one lane");
    const int lane = threadIdx.x & 31;
    float a[E], b[E], v[E];
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int t = lane * E + e;
        a[e] = qsrc[t];
        b[e] = ksrc != nullptr ? ksrc[t] : 0.0f;
        v[e] = ksrc != nullptr ? vsrc[t] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
        sq += a[e] * a[e];
        sk += b[e] * b[e];
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float iq = 1.0f / sqrtf(sq / (float)hd + eps);
    const float ik = 1.0f / sqrtf(sk / (float)hd + eps);
#pragma unroll
    for (int e = 0; e < E; e++) {
        if (norm_q) a[e] *= iq * wq[e];
        if (norm_k && ksrc != nullptr) b[e] *= ik * wk[e];
    }
    if (adjacent) {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
            const float a0 = a[e], a1 = a[e + 1], b0 = b[e], b1 = b[e + 1];
            a[e] = a0 * c[e].x - a1 * c[e].y;
            a[e + 1] = a0 * c[e].y + a1 * c[e].x;
            b[e] = b0 * c[e].x - b1 * c[e].y;
            b[e + 1] = b0 * c[e].y + b1 * c[e].x;
        }
    } else {
        const bool first = lane < 16;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float pa = __shfl_xor_sync(0xffffffffu, a[e], 16);
            const float pb = __shfl_xor_sync(0xffffffffu, b[e], 16);
            a[e] = first ? a[e] * c[e].x - pa * c[e].y : pa * c[e].y + a[e] * c[e].x;
            b[e] = first ? b[e] * c[e].x - pb * c[e].y : pb * c[e].y + b[e] * c[e].x;
        }
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int t = lane * E + e;
        qs[t] = scale * a[e];
        if (ksrc != nullptr) {
            kcur[t] = b[e];
            vcur[t] = v[e];
        }
    }
}

// Head h's output (`o`, in shared memory, each value written by the thread that stores it)
// to `att`, and with `quant` its int8 blocks (a warp per 64 values).
__device__ __forceinline__ void write_head(const float* o, int h, int hd, float* att, i8* q,
                                           float2* meta, int quant) {
    for (int i = threadIdx.x; i < hd; i += blockDim.x) att[(size_t)h * hd + i] = o[i];
    if (!quant) return;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp < hd / QBLOCK) {
        const size_t gb = (size_t)h * (hd / QBLOCK) + warp;
        quant_block_warp(o[warp * QBLOCK + lane], o[warp * QBLOCK + lane + 32], q + gb * QBLOCK,
                         meta + gb);
    }
}

// A warp's attention over positions p0, p0 + ROUND, ... (DEC_U at a time) below `end`: the
// running maximum m, normalizer l and unnormalized output acc (E values per lane) of q (`qs`)
// against the cache rows of its kv head (`kh`, `vh`), the current position's k and v taken
// from shared memory. kk / vv hold the first round's cache reads, requested by the caller;
// cache positions are `stride` halves apart (load_round).
template <int E>
__device__ __forceinline__ void attend_rounds(const float* qs, const float* kcur,
                                              const float* vcur, const half_bits* kh,
                                              const half_bits* vh, int stride, int p0, int end,
                                              int pos, bool has_current, int lane,
                                              float (&kk)[DEC_U][E], float (&vv)[DEC_U][E],
                                              float& m, float& l, float (&acc)[E]) {
    constexpr bool PIPE = E <= 4;
    constexpr int ROUND = DEC_WARPS * DEC_U;
    float qv[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        qv[e] = qs[lane * E + e];
        acc[e] = 0.0f;
    }
    m = -INFINITY;
    l = 0.0f;
    while (p0 < end) {
        if (has_current && pos >= p0 && pos < p0 + DEC_U) {
#pragma unroll
            for (int u = 0; u < DEC_U; u++)
                if (p0 + u == pos) {
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        kk[u][e] = kcur[lane * E + e];
                        vv[u][e] = vcur[lane * E + e];
                    }
                }
        }
        const int p1 = p0 + ROUND;
        float nk[DEC_U][E], nv[DEC_U][E];
        if (PIPE && p1 < end) load_round<E>(kh, vh, stride, p1, end, pos, lane, nk, nv);
        float dots[DEC_U];
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) dot += qv[e] * kk[u][e];
            dots[u] = warp_sum(dot);
        }
        // One rescale per round (the round's maximum first), so the round's exponentials are
        // independent of each other instead of a chain of DEC_U dependent updates.
        float mx = m;
#pragma unroll
        for (int u = 0; u < DEC_U; u++)
            if (p0 + u < end) mx = fmaxf(mx, dots[u]);  // p0 < end: mx is finite
        const float corr = expf(m - mx);
        l *= corr;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] *= corr;
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            if (p0 + u >= end) break;  // uniform over the warp
            const float pe = expf(dots[u] - mx);
            l += pe;
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] += pe * vv[u][e];
        }
        m = mx;
        if (p1 >= end) break;
        if (PIPE) {
#pragma unroll
            for (int u = 0; u < DEC_U; u++)
#pragma unroll
                for (int e = 0; e < E; e++) {
                    kk[u][e] = nk[u][e];
                    vv[u][e] = nv[u][e];
                }
        } else {
            load_round<E>(kh, vh, stride, p1, end, pos, lane, kk, vv);
        }
        p0 = p1;
    }
}

// The partial softmax of each of the block's NW warps (max m, sum l, unnormalized acc with E
// values per lane) into shared memory (sm_m, sm_l: NW floats; sm_o: NW rows of at least
// head_dim); returns the block's max M once every warp's is there. The whole block calls it.
template <int NW, int E, int W>
__device__ __forceinline__ float warps_share(float m, float l, const float (&acc)[E],
                                             float* sm_m, float* sm_l, float (*sm_o)[W]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; e++) sm_o[warp][lane * E + e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < NW; w++) M = fmaxf(M, sm_m[w]);
    return M;
}

// The warps' sums rescaled to the block's max M and added.
template <int NW>
__device__ __forceinline__ float warps_sum(const float* sm_m, const float* sm_l, float M) {
    float L = 0.0f;
    for (int w = 0; w < NW; w++)
        if (sm_m[w] > -INFINITY) L = fmaf(sm_l[w], expf(sm_m[w] - M), L);
    return L;
}

// Value i of the warps' outputs rescaled to the block's max M and added (not normalized).
template <int NW, int W>
__device__ __forceinline__ float warps_value(const float* sm_m, const float (*sm_o)[W], float M,
                                             int i) {
    float o = 0.0f;
    for (int w = 0; w < NW; w++)
        if (sm_m[w] > -INFINITY) o = fmaf(sm_o[w][i], expf(sm_m[w] - M), o);
    return o;
}

// One head's output from its warps' shared partials (warps_share's M): normalized, into
// out[0..hd) (shared or global memory).
template <int NW, int W>
__device__ __forceinline__ void warps_normalize(const float* sm_m, const float* sm_l,
                                                const float (*sm_o)[W], float M, float* out,
                                                int hd) {
    const float L = warps_sum<NW>(sm_m, sm_l, M);
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        out[i] = warps_value<NW>(sm_m, sm_o, M, i) / L;
}

// warps_share, then warps_normalize: a block that attended the whole context.
template <int NW, int E, int W>
__device__ __forceinline__ void merge_warps(float m, float l, const float (&acc)[E], float* sm_m,
                                            float* sm_l, float (*sm_o)[W], float* out, int hd) {
    const float M = warps_share<NW>(m, l, acc, sm_m, sm_l, sm_o);
    warps_normalize<NW>(sm_m, sm_l, sm_o, M, out, hd);
}

// Split s (of `used`, n_splits slots per head) of head h: its warps' partial softmax (shared,
// block max M) to part_o / part_ml; the last block of the head to get here (an atomic counter
// per head, which that block resets) merges the head's partials into `out` (hd floats, shared
// memory, each written by the thread that will store it) and returns true; the others false.
// The whole block calls it; `is_last` is a shared flag.
template <int NW, int W>
__device__ __forceinline__ bool merge_splits(const float* sm_m, const float* sm_l,
                                             const float (*sm_o)[W], float M, int h, int s,
                                             int n_splits, int used, int hd, float* part_o,
                                             float2* part_ml, unsigned* counters, bool* is_last,
                                             float* out) {
    const size_t slot = (size_t)h * n_splits + s;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        part_o[slot * hd + i] = warps_value<NW>(sm_m, sm_o, M, i);
    if (threadIdx.x == 0) part_ml[slot] = make_float2(M, warps_sum<NW>(sm_m, sm_l, M));

    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned done = atomicAdd(&counters[h], 1u);
        *is_last = done == (unsigned)(used - 1);
    }
    __syncthreads();
    if (!*is_last) return false;
    __threadfence();
    const size_t first = (size_t)h * n_splits;
    float MM = -INFINITY;
    for (int t = 0; t < used; t++) MM = fmaxf(MM, __ldcg(&part_ml[first + t].x));
    // Explicit fmaf (here, in warps_sum / warps_value and in cluster_merge): both merges give
    // the same bits, so a step's output does not depend on which kernel its grid took.
    float LL = 0.0f;
    for (int t = 0; t < used; t++) {
        const float2 ml = __ldcg(&part_ml[first + t]);
        LL = fmaf(ml.y, expf(ml.x - MM), LL);
    }
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t < used; t++) {
            const float e = expf(__ldcg(&part_ml[first + t].x) - MM);
            o = fmaf(__ldcg(&part_o[(first + t) * hd + i]), e, o);
        }
        out[i] = o / LL;
    }
    if (threadIdx.x == 0) counters[h] = 0;
    return true;
}

// E = head_dim / 32 values per lane. Each warp takes DEC_U consecutive positions at a time (a
// round) and issues all their K and V loads before the first dot product, so a warp waits for
// memory once per round, not once per position — and its first round is requested before the
// q/k/v prologue, the next one during the current (E ≤ 4), so at most one wait is exposed.
//
// ATT_EARLY_ROUND (default 1; TRIT_CUDA_DEFINES=-DATT_EARLY_ROUND=0 for A/B): the position and
// that first round are read before griddepcontrol.wait, while the q‖k‖v GEMV still runs. Both
// are final there: the position counter changes only between replays (the host's upload, or
// advance_position, the step's last kernel, which writes after everything before it has
// completed), and the round reads cached positions before the current one, written by earlier
// steps (the current position comes from kcur/vcur, never from the cache). Replays of the
// step's graph run one after the other on the stream; without graphs (TRIT_CUDA_GRAPH=0) the
// kernels that wrote them are a whole step of launches earlier: a launch starts only once
// every block of its predecessor has started, so one of them could still run only if the
// hundreds of launches since all had their blocks resident at once.
#ifndef ATT_EARLY_ROUND
#define ATT_EARLY_ROUND 1
#endif
// ATT_PREFETCH (default 1; -DATT_PREFETCH=0 for A/B): with the first round, L2 requests for
// the split's later rounds (prefetch_rounds). A split holds one round up to 512 positions (16
// splits of 32); beyond, H200 8B tg32 from depth 2,048 512–514 tok/s against 479–484 without,
// from 8,192 293–294 against 256–257.
#ifndef ATT_PREFETCH
#define ATT_PREFETCH 1
#endif
// Splits per thread block cluster of the cluster-merge kernels (attn_decode_cl_*, sm_90+).
#define ATT_CL 4

// The cluster merge of attn_decode_cl_* (CL): when 2 to ATT_CL splits cover the context, all
// of them are blocks of the head's first cluster; each split but the first sends its partial
// (block max M, sum, M-scaled values) into the first's mailbox (st.async onto its mbarrier,
// opened with (used − 1)·(hd + 2)·4 bytes before the kernel's wait) and exits, and the first
// merges them with its own into `out` (shared; each value written by the thread that stores
// it) — no global partials, fences or counter (merge_splits). Returns true in that block.
template <int NW, int W>
__device__ __forceinline__ bool cluster_merge(const float* sm_m, const float* sm_l,
                                              const float (*sm_o)[W], float M, int s, int used,
                                              int hd, float (*cl_o)[MAX_HD], float2* cl_ml,
                                              unsigned long long* bar, float* out) {
    if (s != 0) {
        cluster_wait();  // the first split's mailbox is open
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            mailbox_send(&cl_o[s - 1][i], bar, 0, warps_value<NW>(sm_m, sm_o, M, i));
        if (threadIdx.x == 0) {
            mailbox_send(&cl_ml[s - 1].x, bar, 0, M);
            mailbox_send(&cl_ml[s - 1].y, bar, 0, warps_sum<NW>(sm_m, sm_l, M));
        }
        return false;
    }
    const float own = warps_sum<NW>(sm_m, sm_l, M);
    mailbox_wait(bar);
    float MM = M;
    for (int r = 0; r < used - 1; r++) MM = fmaxf(MM, cl_ml[r].x);
    // merge_splits' arithmetic in its order (split 0 first), so both give the same bits.
    const float c0 = expf(M - MM);
    float LL = fmaf(own, c0, 0.0f);
    for (int r = 0; r < used - 1; r++) LL = fmaf(cl_ml[r].y, expf(cl_ml[r].x - MM), LL);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = fmaf(warps_value<NW>(sm_m, sm_o, M, i), c0, 0.0f);
        for (int r = 0; r < used - 1; r++) o = fmaf(cl_o[r][i], expf(cl_ml[r].x - MM), o);
        out[i] = o / LL;
    }
    return true;
}

template <int E, bool CL = false>
__device__ __forceinline__ void attn_decode_impl(
    const float* __restrict__ qkv, const float* q_norm, const float* k_norm, float eps,
    const float2* __restrict__ cos_sin, const int* step, int n_heads, int n_kv, int hd,
    int adjacent, half_bits* kc, half_bits* vc, int ctx, float scale, float* part_o,
    float2* part_ml, unsigned* counters, float* att, i8* q, float2* meta, int quant,
    int min_chunk) {
    __shared__ float2 scratch2[32];
    __shared__ float tmp[MAX_HD], ktmp[MAX_HD];
    __shared__ float qs[MAX_HD], kcur[MAX_HD], vcur[MAX_HD];
    __shared__ float sm_m[DEC_WARPS], sm_l[DEC_WARPS];
    __shared__ float sm_o[DEC_WARPS][MAX_HD];
    __shared__ bool is_last;
    // CL: the mailbox of the head's first split (cluster_merge).
    __shared__ unsigned long long cl_bar;
    __shared__ float cl_o[CL ? ATT_CL - 1 : 1][MAX_HD];
    __shared__ float2 cl_ml[CL ? ATT_CL - 1 : 1];
    static_assert(MAX_HD <= DEC_THREADS, "norm_rope_qk takes one element per thread");
    TRACE_SCOPE(4, kc);
    pdl_launch_dependents();
    // Weights: loaded before the wait, off the chain that follows it.
    const int tid = threadIdx.x;
    const float qn = q_norm != nullptr && tid < hd ? q_norm[tid] : 1.0f;
    const float kn = k_norm != nullptr && tid < hd ? k_norm[tid] : 1.0f;
#if !ATT_EARLY_ROUND
    pdl_wait();
    TRACE_WAITED();
    PROBE_SKIP(1);
#endif
    const int h = blockIdx.x, s = blockIdx.y, n_splits = gridDim.y;
    const int pos = step[0], len = pos + 1;
    // Positions per split: len spread over the grid's splits, a multiple of DEC_CHUNK, and
    // at least min_chunk (a short context in one block skips the merge through memory).
    const int chunk = max(min_chunk,
                          ((len + n_splits - 1) / n_splits + DEC_CHUNK - 1) / DEC_CHUNK * DEC_CHUNK);
    const int used = (len + chunk - 1) / chunk;
    // CL with 2..ATT_CL splits: they are the first cluster's blocks (s < ATT_CL); the first
    // opens its mailbox, and every block of that cluster arrives on the cluster barrier that
    // tells the others it is open.
    const bool cl_merge = CL && used > 1 && used <= ATT_CL;
    if (cl_merge && s < ATT_CL) {
        if (s == 0 && threadIdx.x == 0)
            mailbox_open(&cl_bar, (unsigned)((used - 1) * (hd + 2) * 4));
        __syncwarp();
        cluster_arrive();
    }
    if (s >= used) return;
    const int start = s * chunk, end = min(start + chunk, len);
    const int group = n_heads / n_kv, kvh = h / group;
    const float2* cs = cos_sin + (size_t)pos * (hd / 2);
    const size_t kv_row = (size_t)kvh * ctx * hd;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // The warp's first round of cache reads is requested before the q/k/v prologue, so it
    // loads during that chain of dependent loads and barriers; with E ≤ 4 each later round is
    // requested one round ahead (more would cost registers; attend_rounds).
    const half_bits* kh = kc + kv_row;
    const half_bits* vh = vc + kv_row;
    int p0 = start + warp * DEC_U;
    float kk[DEC_U][E], vv[DEC_U][E];
    if (p0 < end) load_round<E>(kh, vh, hd, p0, end, pos, lane, kk, vv);
#if ATT_PREFETCH
    prefetch_rounds<E>(kh, vh, hd, p0, min(end, pos), lane);
#endif
    constexpr bool WARP_NORM = ATT_WARP_NORM && E % 2 == 0;
    const float2 rc = rope_coef(cs, threadIdx.x, hd, adjacent);
    // WARP_NORM: the lane's E norm weights and rotation coefficients (E·lane + e).
    float wqv[WARP_NORM ? E : 1], wkv[WARP_NORM ? E : 1];
    float2 rcv[WARP_NORM ? E : 1];
    if (WARP_NORM) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int t = lane * E + e;
            wqv[e] = q_norm != nullptr ? q_norm[t] : 1.0f;
            wkv[e] = k_norm != nullptr ? k_norm[t] : 1.0f;
            rcv[e] = rope_coef(cs, t, hd, adjacent);
        }
    }
#if ATT_EARLY_ROUND
    pdl_wait();
    TRACE_WAITED();
    PROBE_SKIP(1);
#endif

    const bool has_current = end == len;
    if constexpr (WARP_NORM) {
        warp_norm_rope<E>(qkv + (size_t)h * hd,
                          has_current ? qkv + (size_t)(n_heads + kvh) * hd : nullptr,
                          qkv + (size_t)(n_heads + n_kv + kvh) * hd, q_norm != nullptr,
                          k_norm != nullptr, wqv, wkv, rcv, eps, hd, adjacent, scale, qs, kcur,
                          vcur);
        TRACE_MARK(0);
        if (has_current && h % group == 0 && warp == 0) {
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int t = lane * E + e;
                kc[kv_row + (size_t)pos * hd + t] = f2h(kcur[t]);
                vc[kv_row + (size_t)pos * hd + t] = f2h(vcur[t]);
            }
        }
    } else {
        norm_rope_qk(qkv + (size_t)h * hd,
                     has_current ? qkv + (size_t)(n_heads + kvh) * hd : nullptr,
                     qkv + (size_t)(n_heads + n_kv + kvh) * hd, q_norm, k_norm, qn, kn, eps, rc,
                     hd, adjacent, scale, tmp, ktmp, qs, kcur, vcur, scratch2);
        TRACE_MARK(0);
        if (has_current && h % group == 0) {
            for (int i = threadIdx.x; i < hd; i += blockDim.x) {
                kc[kv_row + (size_t)pos * hd + i] = f2h(kcur[i]);
                vc[kv_row + (size_t)pos * hd + i] = f2h(vcur[i]);
            }
        }
    }

    float m, l, acc[E];
    attend_rounds<E>(qs, kcur, vcur, kh, vh, hd, p0, end, pos, has_current, lane, kk, vv, m, l,
                     acc);
    TRACE_MARK(1);
    const float M = warps_share<DEC_WARPS>(m, l, acc, sm_m, sm_l, sm_o);
    TRACE_MARK(2);
    if (used == 1) {
        // The whole context was this block's: normalize here.
        warps_normalize<DEC_WARPS>(sm_m, sm_l, sm_o, M, tmp, hd);
        write_head(tmp, h, hd, att, q, meta, quant);
        return;
    }
    if (cl_merge) {
        if (!cluster_merge<DEC_WARPS>(sm_m, sm_l, sm_o, M, s, used, hd, cl_o, cl_ml, &cl_bar,
                                      tmp)) {
            TRACE_MARK(3);
            return;
        }
    } else if (!merge_splits<DEC_WARPS>(sm_m, sm_l, sm_o, M, h, s, n_splits, used, hd, part_o,
                                        part_ml, counters, &is_last, tmp)) {
        return;
    }
    TRACE_MARK(3);
    write_head(tmp, h, hd, att, q, meta, quant);
}

// attn_decode_e1 … e7 for head_dim 32 … 224; attn_decode for 256.
#define ATTN_DECODE(NAME, E)                                                                    \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) NAME(                             \
        const float* qkv, const float* q_norm, const float* k_norm, float eps,                  \
        const float2* cos_sin, const int* step, int n_heads, int n_kv, int hd, int adjacent,    \
        half_bits* kc, half_bits* vc, int ctx, float scale, float* part_o, float2* part_ml,     \
        unsigned* counters, float* att, i8* q, float2* meta, int quant, int min_chunk) {        \
        attn_decode_impl<E>(qkv, q_norm, k_norm, eps, cos_sin, step, n_heads, n_kv, hd,        \
                            adjacent, kc, vc, ctx, scale, part_o, part_ml, counters, att, q,   \
                            meta, quant, min_chunk);                                           \
    }
ATTN_DECODE(attn_decode_e1, 1)
ATTN_DECODE(attn_decode_e2, 2)
ATTN_DECODE(attn_decode_e3, 3)
ATTN_DECODE(attn_decode_e4, 4)
ATTN_DECODE(attn_decode_e5, 5)
ATTN_DECODE(attn_decode_e6, 6)
ATTN_DECODE(attn_decode_e7, 7)
ATTN_DECODE(attn_decode, 8)

// attn_decode_cl_e2 / _e4 (head_dim 64, 128): the cluster merge (ATT_CL splits per cluster;
// the host launches them on sm_90+ for steps of ATT_CL blocks per head, contexts up to 128
// positions; TRIT_CUDA_ATT_CLUSTER=0 keeps attn_decode_e2 / _e4 there). With 8 or 16 blocks
// per head the cluster launch measured slower (H200 8B, 225–256 positions: −8 %).
#if __CUDA_ARCH__ >= 900
#define ATT_CL_DIMS __cluster_dims__(1, ATT_CL, 1)
#else
#define ATT_CL_DIMS
#endif
#define ATTN_DECODE_CL(NAME, E)                                                                 \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) ATT_CL_DIMS NAME(                 \
        const float* qkv, const float* q_norm, const float* k_norm, float eps,                  \
        const float2* cos_sin, const int* step, int n_heads, int n_kv, int hd, int adjacent,    \
        half_bits* kc, half_bits* vc, int ctx, float scale, float* part_o, float2* part_ml,     \
        unsigned* counters, float* att, i8* q, float2* meta, int quant, int min_chunk) {        \
        attn_decode_impl<E, true>(qkv, q_norm, k_norm, eps, cos_sin, step, n_heads, n_kv, hd,  \
                                  adjacent, kc, vc, ctx, scale, part_o, part_ml, counters,     \
                                  att, q, meta, quant, min_chunk);                             \
    }
ATTN_DECODE_CL(attn_decode_cl_e2, 2)
ATTN_DECODE_CL(attn_decode_cl_e4, 4)
