// q‖k‖v and the attention of the new token in one kernel, for decode steps at short contexts
// (qkv_attention.rs; positions below QA_MAX_POS).
//
// Why: in the kernel chain the attention is its own launch between q‖k‖v and o, and a launch
// costs a hop (the attention's blocks wait for the whole q‖k‖v grid to finish and flush) on
// top of its work. Skipping the launch measured +21 % on the 8B (BENCHMARKS "GPU, session
// 26"); here the attention's work moves into the q‖k‖v kernel's tail instead.
//
// The grid is n_kv parts of `blocks_per_head` blocks. Part h computes the q‖k‖v rows of kv head
// h — its gq = n_heads / n_kv q heads, its k head and its v head (KvHeadGroups) — with the
// streaming GEMV (gemv_stream.cu), then every block of the part arrives at the part's counter.
// The part's first gq / heads_per_owner blocks are owners: each waits until the whole part
// has arrived and attends heads_per_owner q heads over the cache. Every block is resident at
// once (one per multiprocessor, grid ≤ multiprocessors: qkv_attention.rs), so an owner's wait
// always ends; a give-up after 2 s traps rather than hangs.
//
// Before griddepcontrol.wait an owner copies its kv head's cached rows 0 .. pos − 1 into
// shared memory (final there for the reasons attention.cu's ATT_EARLY_ROUND gives), so the
// attention after the wait reads only shared memory and the fresh q/k/v rows.
//
// Counters (2·n_kv words, zero between launches): arrivals, then owners done; the last owner
// to finish zeroes both.
//
// Shared memory past the GEMV's ring (qa_smem_bytes in qkv_attention.rs):
//   K, V: QA_MAX_POS rows of hd f16 each, rows padded by 16 bytes (each quarter-warp's 16-byte
//   loads of 8 consecutive rows then hit distinct banks) | q: heads_per_owner × hd f32 (later
//   the outputs) | scores: heads_per_owner × QA_MAX_POS f32, before that the norm's values |
//   cos/sin of pos: hd / 2 float2 | q_norm, k_norm: hd f32 each | 1/Σ per head: 8 f32.

#define QA_MAX_POS 128
#define QA_MAX_HEADS 8

// Rows of kv head `kvh` of a q‖k‖v matrix (groups of 4 rows): its q heads, then its k head,
// then its v head.
struct KvHeadGroups {
    int q0, k0, v0;  // first matrix group of each part
    int nq, nk;      // groups of the q part, of the k part (= the v part)
    __device__ __forceinline__ int at(int g) const {
        return g < nq ? q0 + g : (g < nq + nk ? k0 + g - nq : v0 + g - nq - nk);
    }
};

__device__ __forceinline__ unsigned qa_load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long qa_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// The shared-memory areas of an owner's attention.
struct QaSmem {
    char* k;      // K rows (row stride `row` bytes)
    char* v;      // V rows
    float* q;     // hpo × hd: the rotated, scaled q heads; then the outputs
    float* s;     // hpo × QA_MAX_POS scores; before them, (hpo + 1) × hd normed values
    float2* cs;   // hd / 2
    float* qn;    // hd
    float* kn;    // hd
    float* inv;   // QA_MAX_HEADS
    int row;
};

// `rows`: QA_MAX_POS where the cached rows are staged, else 1 (the current position's); the K
// area holds at least 4,096 bytes (the values' partial sums of up to 16 warps).
__device__ __forceinline__ QaSmem qa_smem(char* base, int hd, int hpo, int rows) {
    QaSmem m;
    m.row = hd * 2 + 16;
    m.k = base;
    m.v = m.k + max(rows * m.row, 4096);
    m.q = (float*)(m.v + rows * m.row);
    m.s = m.q + hpo * hd;
    const int s_len = max(hpo * QA_MAX_POS, (hpo + 1) * hd);
    m.cs = (float2*)(m.s + s_len);
    m.qn = (float*)(m.cs + hd / 2);
    m.kn = m.qn + hd;
    m.inv = m.kn + hd;
    return m;
}

// The owner's work after its part has arrived: q heads h0 .. h0 + hpo and the kv head's k/v
// from qkv (the part's blocks wrote them: read through L2), RMSNorm + rotation into shared
// memory, the new k/v into the cache (owner 0 only) and into the staged rows at pos, scores,
// softmax, the weighted sum of values, and the outputs (f32 + int8 blocks).
template <bool STAGED>
__device__ __forceinline__ void qa_attend(const QaSmem& m, const float* qkv, int h0, int hpo, int kvh,
                          int n_heads, int n_kv, int hd, int adjacent, float eps, float scale,
                          bool has_qn, bool has_kn, int pos, bool write_cache, const half_bits* kh,
                          const half_bits* vh, half_bits* kc_row, half_bits* vc_row,
                          float* att, i8* q8, float2* meta) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int len = pos + 1;
    // Row p of K / V: staged in shared memory, or the cache's (the current one always shared).
    char* const kcur = m.k + (STAGED ? pos * m.row : 0);
    char* const vcur = m.v + (STAGED ? pos * m.row : 0);
    auto krow_at = [&](int p) -> const char* {
        if constexpr (STAGED) return m.k + p * m.row;
        return p == pos ? kcur : (const char*)(kh + (size_t)p * hd);
    };
    auto vrow_at = [&](int p) -> const char* {
        if constexpr (STAGED) return m.v + p * m.row;
        return p == pos ? vcur : (const char*)(vh + (size_t)p * hd);
    };
    float* normed = m.s;  // (hpo + 1) × hd, free until the scores
    // One warp per vector: the hpo q heads, the k head (normed and rotated), the v head.
    for (int vi = warp; vi < hpo + 2; vi += warps) {
        const bool is_v = vi == hpo + 1, is_k = vi == hpo;
        const float* src = qkv + (size_t)(is_v ? n_heads + n_kv + kvh
                                              : (is_k ? n_heads + kvh : h0 + vi)) * hd;
        if (is_v) {
            half_bits* dst = (half_bits*)vcur;
            for (int t = lane; t < hd; t += 32) {
                const half_bits v = f2h(__ldcg(src + t));
                dst[t] = v;
                if (write_cache) vc_row[t] = v;
            }
            continue;
        }
        float ss = 0.0f;
        for (int t = lane; t < hd; t += 32) {
            const float v = __ldcg(src + t);
            normed[vi * hd + t] = v;
            ss += v * v;
        }
        ss = warp_sum(ss);
        const bool norm = is_k ? has_kn : has_qn;
        const float inv = norm ? 1.0f / sqrtf(ss / (float)hd + eps) : 1.0f;
        const float* w = is_k ? m.kn : m.qn;
        for (int t = lane; t < hd; t += 32)
            if (norm) normed[vi * hd + t] *= inv * w[t];
        __syncwarp();
        for (int t = lane; t < hd; t += 32) {
            const float r = rope_at(normed + vi * hd, m.cs, t, hd, adjacent);
            if (is_k) {
                const half_bits k = f2h(r);
                ((half_bits*)kcur)[t] = k;
                if (write_cache) kc_row[t] = k;
            } else {
                m.q[vi * hd + t] = scale * r;
            }
        }
    }
    __syncthreads();
    // Scores: a task is (32 positions, one head); lane p takes position 32c + p whole.
    const int chunks = (len + 31) / 32;
    for (int task = warp; task < chunks * hpo; task += warps) {
        const int c = task / hpo, j = task % hpo, p = c * 32 + lane;
        if (p >= len) continue;
        const uint4* krow = (const uint4*)krow_at(p);
        const float4* q4 = (const float4*)(m.q + j * hd);
        float dot = 0.0f;
        for (int d8 = 0; d8 < hd / 8; d8++) {
            const uint4 kw = krow[d8];
            const float4 qa = q4[2 * d8], qb = q4[2 * d8 + 1];
            dot += qa.x * h2f((half_bits)(kw.x & 0xffff)) + qa.y * h2f((half_bits)(kw.x >> 16)) +
                   qa.z * h2f((half_bits)(kw.y & 0xffff)) + qa.w * h2f((half_bits)(kw.y >> 16)) +
                   qb.x * h2f((half_bits)(kw.z & 0xffff)) + qb.y * h2f((half_bits)(kw.z >> 16)) +
                   qb.z * h2f((half_bits)(kw.w & 0xffff)) + qb.w * h2f((half_bits)(kw.w >> 16));
        }
        m.s[j * QA_MAX_POS + p] = dot;
    }
    __syncthreads();
    // Softmax numerators in place, 1/Σ per head.
    for (int j = warp; j < hpo; j += warps) {
        float* s = m.s + j * QA_MAX_POS;
        float mx = -INFINITY;
        for (int p = lane; p < len; p += 32) mx = fmaxf(mx, s[p]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int p = lane; p < len; p += 32) {
            const float e = expf(s[p] - mx);
            s[p] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) m.inv[j] = 1.0f / sum;
    }
    __syncthreads();
    // Values: a thread per (head, pair of dims, slice of positions); the slices' partial sums
    // meet in the K rows' space (the scores no longer need it).
    const int pairs = hpo * hd / 2, slices = max(1, (int)blockDim.x / pairs);
    float2* part = (float2*)m.k;
    for (int t = tid; t < pairs * slices; t += blockDim.x) {
        const int pair = t % pairs, sl = t / pairs;
        const int j = pair / (hd / 2), dp = pair % (hd / 2);
        const float* s = m.s + j * QA_MAX_POS;
        float2 acc = make_float2(0.0f, 0.0f);
        for (int p = sl; p < len; p += slices) {
            const unsigned vw = ((const unsigned*)vrow_at(p))[dp];
            const float e = s[p];
            acc.x += e * h2f((half_bits)(vw & 0xffff));
            acc.y += e * h2f((half_bits)(vw >> 16));
        }
        part[sl * pairs + pair] = acc;
    }
    __syncthreads();
    for (int pair = tid; pair < pairs; pair += blockDim.x) {
        float2 o = make_float2(0.0f, 0.0f);
        for (int sl = 0; sl < slices; sl++) {
            const float2 a = part[sl * pairs + pair];
            o.x += a.x;
            o.y += a.y;
        }
        const int j = pair / (hd / 2), dp = pair % (hd / 2);
        const float inv = m.inv[j];
        m.q[j * hd + 2 * dp] = o.x * inv;
        m.q[j * hd + 2 * dp + 1] = o.y * inv;
    }
    __syncthreads();
    for (int i = tid; i < hpo * hd; i += blockDim.x) att[(size_t)h0 * hd + i] = m.q[i];
    // int8 blocks of 64 values, a warp each.
    const int blocks = hpo * hd / QBLOCK;
    for (int b = warp; b < blocks; b += warps) {
        const size_t gb = (size_t)h0 * (hd / QBLOCK) + b;
        quant_block_warp(m.q[b * QBLOCK + lane], m.q[b * QBLOCK + lane + 32], q8 + gb * QBLOCK,
                         meta + gb);
    }
}

template <typename S>
__device__ __forceinline__ void qkv_attend_impl(
    const uint4* __restrict__ codes, const S* __restrict__ scales, int nb,
    const float* __restrict__ x, const float* __restrict__ gamma, float eps, float* qkv,
    const float* q_norm, const float* k_norm, const float2* __restrict__ cos_sin,
    const int* step, int n_heads, int n_kv, int hd, int adjacent, half_bits* kc,
    half_bits* vc, int ctx, float scale, unsigned* counters, float* att, i8* q8, float2* meta,
    int blocks_per_head, int hpo, int stage, int ring_slots) {
    extern __shared__ uint4 dyn[];
    pdl_launch_dependents();
    const int gq = n_heads / n_kv, kvh = blockIdx.x / blocks_per_head;
    const int part = blockIdx.x % blocks_per_head, owners = gq / hpo;
    const bool owner = part < owners;
    const int rows = (n_heads + 2 * n_kv) * hd;
    KvHeadGroups map;
    map.nq = gq * hd / 4;
    map.nk = hd / 4;
    map.q0 = kvh * map.nq;
    map.k0 = n_heads * hd / 4 + kvh * map.nk;
    map.v0 = (n_heads + n_kv) * hd / 4 + kvh * map.nk;
    StreamWarp<4, KvHeadGroups> w = stream_begin_mapped<4, 1, S>(
        codes, scales, rows, nb, 0, stream_ring_at(nb), map, map.nq + 2 * map.nk, part,
        blocks_per_head, ring_slots);
    const FgGamma gr = fg_gamma(FG_IN_NORM, nb, gamma);
    const int ring_end = stream_ring_at(nb) + (blockDim.x >> 5) * ring_slots * StreamSlot<4>::CHUNKS;
    const bool staged = stage == 1;
    const QaSmem m = qa_smem((char*)(dyn + ring_end), hd, hpo, staged ? QA_MAX_POS : 1);
    const int pos = step[0];
    if (pos >= QA_MAX_POS) __trap();  // the host takes the kernel chain from there
    const size_t kv_row = (size_t)kvh * ctx * hd;
    if (owner) {
        // The cached rows before pos (into shared memory, or with stage 0 into L2 by the kv
        // head's first block), and the step's constants; all final before the wait.
        const int per_row = hd / 8;
#if !defined(QA_PROBE) || QA_PROBE != 3
        if (staged) {
            for (int i = threadIdx.x; i < 2 * pos * per_row; i += blockDim.x) {
                const int kv = i / (pos * per_row), r = (i / per_row) % pos, c = i % per_row;
                const half_bits* src = (kv ? vc : kc) + kv_row + (size_t)r * hd + c * 8;
                cp_async16((kv ? m.v : m.k) + r * m.row + c * 16, src);
            }
        } else if (stage == 0 && part == 0) {
            // 128-byte lines: hd / 64 per row.
            const int lines = hd / 64;
            for (int i = threadIdx.x; i < 2 * pos * lines; i += blockDim.x) {
                const int kv = i / (pos * lines), r = (i / lines) % pos, c = i % lines;
                const half_bits* src = (kv ? vc : kc) + kv_row + (size_t)r * hd + c * 64;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
            }
        }
#endif
        cp_async_commit();
        const float2* cs = cos_sin + (size_t)pos * (hd / 2);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            if (i < hd / 2) m.cs[i] = cs[i];
            m.qn[i] = q_norm != nullptr ? q_norm[i] : 1.0f;
            m.kn[i] = k_norm != nullptr ? k_norm[i] : 1.0f;
        }
    }
    pdl_wait();
    stream_finish<4, 1, S, false, false, false, KvHeadGroups>(
        w, codes, scales, rows, nb, FG_IN_NORM, x, gr, gamma, eps, nullptr, nullptr, qkv, 0, 0);
    __threadfence();
    __syncthreads();
    unsigned* arrived = counters + kvh;
    unsigned* done = counters + n_kv + kvh;
    if (threadIdx.x == 0) atomicAdd(arrived, 1u);
    if (!owner) return;
#if defined(QA_PROBE) && QA_PROBE >= 2
    return;  // measurement only: no wait, no attention (outputs garbage)
#endif
    if (threadIdx.x == 0) {
        const unsigned long long t0 = qa_clock_ns();
        while (qa_load_acquire(arrived) < (unsigned)blocks_per_head) {
            if (qa_clock_ns() - t0 > 2000000000ull) __trap();
            __nanosleep(20);
        }
        if (atomicAdd(done, 1u) == (unsigned)owners - 1) {
            *arrived = 0;
            *done = 0;
        }
    }
    cp_async_wait_all();
    __syncthreads();
#if defined(QA_PROBE) && QA_PROBE == 1
    return;  // measurement only: the wait without the attention (outputs garbage)
#endif
    const int h0 = kvh * gq + part * hpo;
    half_bits* kc_row = kc + kv_row + (size_t)pos * hd;
    half_bits* vc_row = vc + kv_row + (size_t)pos * hd;
    if (staged)
        qa_attend<true>(m, qkv, h0, hpo, kvh, n_heads, n_kv, hd, adjacent, eps, scale,
                        q_norm != nullptr, k_norm != nullptr, pos, part == 0, kc + kv_row,
                        vc + kv_row, kc_row, vc_row, att, q8, meta);
    else
        qa_attend<false>(m, qkv, h0, hpo, kvh, n_heads, n_kv, hd, adjacent, eps, scale,
                         q_norm != nullptr, k_norm != nullptr, pos, part == 0, kc + kv_row,
                         vc + kv_row, kc_row, vc_row, att, q8, meta);
}

#ifdef QA_MAXNREG
#define QA_BOUNDS __maxnreg__(QA_MAXNREG)
#else
#define QA_BOUNDS
#endif
#define QKV_ATTEND(SN, S)                                                                       \
    extern "C" __global__ void QA_BOUNDS qkv_attend_##SN(                                                \
        const uint4* codes, const S* scales, int nb, const float* x, const float* gamma,       \
        float eps, float* qkv, const float* q_norm, const float* k_norm,                        \
        const float2* cos_sin, const int* step, int n_heads, int n_kv, int hd, int adjacent,   \
        half_bits* kc, half_bits* vc, int ctx, float scale, unsigned* counters, float* att,    \
        i8* q8, float2* meta, int blocks_per_head, int hpo, int stage, int ring_slots) {       \
        qkv_attend_impl<S>(codes, scales, nb, x, gamma, eps, qkv, q_norm, k_norm, cos_sin,     \
                           step, n_heads, n_kv, hd, adjacent, kc, vc, ctx, scale, counters,    \
                           att, q8, meta, blocks_per_head, hpo, stage, ring_slots);            \
    }
QKV_ATTEND(f16, half_bits)
QKV_ATTEND(f32, float)
