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

// Gated RMSNorm of each value head: out = RMSNorm(o)·w · SiLU(z). One block per head. With
// `regroup` (a GGUF file with tiled value heads whose ssm_out columns stay grouped, formats.md
// §8.4) head h is written at its grouped place (h mod hk)·(hv / hk) + h / hk.
extern "C" __global__ void deltanet_gated_norm(const float* __restrict__ o,
                                               const float* __restrict__ z,
                                               const float* __restrict__ w, float eps, int dv,
                                               int hk, int regroup, float* __restrict__ out) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int head = blockIdx.x, hv = gridDim.x;
    const size_t base = (size_t)head * dv;
    const int at = regroup ? (head % hk) * (hv / hk) + head / hk : head;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[base + i] * o[base + i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        const float zi = z[base + i];
        out[(size_t)at * dv + i] = o[base + i] * inv * w[i] * (zi * dn_sigmoid(zi));
    }
}

// ---- The whole Gated DeltaNet mixer of one decode token in one kernel (after the q/k/v/z
// projection): what ssm_alpha/ssm_beta, deltanet_conv_silu, deltanet_recur,
// deltanet_gated_norm and the output's quantization do as five kernels. The kernel
// boundaries, not the work, set the time of those (a few µs each against ~6 MB of state per
// layer), so one block per value head does everything for its head:
//   1. RMSNorm of the residual x (each block sums the squares itself) and this head's decay and
//      update-gate inputs a, b (two dense f32 rows of ssm_alpha‖ssm_beta, the unrotated input);
//   2. the causal conv + SiLU of the channels it reads (q and k of its key head, its own v);
//   3. q/k L2 normalization, the delta-rule update of its dv state rows (one warp per row, several
//      rows in flight), o = S q;
//   4. the gated RMSNorm, written at the head's (possibly regrouped) place, and its int8 blocks
//      (q null: the host rotates or quantizes the output itself).
// The conv window is a ring of `kernel` slots (position p's input in slot p mod kernel) rather
// than the shifted kernel − 1 slots of deltanet_conv_silu: blocks read the slots of positions
// pos − kernel + 1 .. pos − 1 while the owner of a channel writes slot pos mod kernel, never one
// being read. A key head's q/k channels are written by one of the value heads that read them.

#define DN_MAX_DV 256
// ssm_alpha/ssm_beta values per thread held in registers from before griddepcontrol.wait by
// the hoisted variant (d up to 8192 with 512 threads); wider rows are read in the loop instead.
#define DN_AB_PER 16

// Rows i0.. of this warp's part of the head's state, loaded into s (zeros past dv).
template <int ROWS, int U>
__device__ __forceinline__ void dn_load_rows(float (*s)[U], const float* hs, int i0,
                                             int dv, int dk, int lane) {
    const int per_lane = dk / 32;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            s[r][u] = (u < per_lane && i0 + r < dv) ? hs[(size_t)(i0 + r) * dk + lane + 32 * u] : 0.0f;
        }
    }
}

// ROWS: state rows of one warp in flight. HOIST: the order of the memory round trips, which
// sets this kernel's time (48 blocks on 132 multiprocessors: latency, not bandwidth): the a/b
// weight rows are loaded before griddepcontrol.wait (weights: nothing earlier writes them) and
// the warp's first state rows right after it, both in flight while the norm, the dots and the
// conv run. `deltanet_step` (ROWS 4, not hoisted) is the variant measured on the H200 (ncu,
// 27B widths: 15.1 µs against 33 µs for the five kernels it replaces); `deltanet_step_hoisted`
// (ROWS 8, hoisted; TRIT_CUDA_DN_STEP=2) compiles without spills (128 registers) and measured
// as fast on the 27B probe (BENCHMARKS "GPU, session 7"), not faster. EARLY
// (`deltanet_step_early`, the default, launched with 12 warps so that a block fits beside the
// streaming GEMV's on a multiprocessor): the gates and the L2 requests for the state and the
// window run before griddepcontrol.wait, which needs the q‖k‖v‖z GEMV before it to release its
// dependents only after its own wait (FG_LATE_TRIGGER); H200 27B: 241.6 against 233 tok/s.
// HELD (with EARLY; `deltanet_step_held`, the default for heads of up to DN_HELD_DK key dims):
// less after the wait. Each warp's first pass of state rows is loaded into registers before it
// (4 per lane: the specialization to 128 key dims is what frees them), the conv's sum over the
// window's earlier inputs is taken before it, and z (the gated norm's gate) is requested into
// shared memory right after it, so the gated norm waits for no load of its own. H200, 27B
// tg128: 276.1 / 273.6 against 268.3 / 270.4 (BENCHMARKS "GPU, session 14"). Staging the
// later passes through shared memory by cp.async measured +3 % more, but only with the
// multiprocessors' carveout at its maximum, which cost 2.7 % elsewhere; with the default
// carveout its 30 KB kept the block from starting beside the q‖k‖v‖z GEMV (−10 %).
#define DN_HELD_DK 128
// Session 29 (BENCHMARKS "GPU, session 29"): inside the decode graph (DN_TRACE, 27B widths)
// the part before the wait took ~20,000 cycles — longer than the q‖k‖v‖z GEMV it overlaps, so
// the wait found its input long ready — and the recurrence ~9,300. So the gates' weights are
// requested into L2 before anything waits and read as float4s, the gates' three sums and
// q/k's two take one barrier each, each warp's rows are reduced level by level together, and
// the next pass's rows are asked into L1. H200 tg128, 27B: 285.0 / 287.1 against 282.5 / 283.3
// tok/s for the order before (within the first-of-a-pair spread, never slower).
// Session 30 (BENCHMARKS "GPU, session 30"): the trace split the part before the wait into the
// requests (3.4–4.8k cycles: they wait for `step`), the gates (8.5–12k: the a/b rows from
// DRAM), the held rows (0.3–0.9k) and the conv's earlier inputs (2.3–3.3k); the GEMV ends
// ~17.4k cycles after this block starts. The recurrence takes both dot products from the old
// rows in one reduction (6.7–7.0k cycles against 7.1–7.6k; 27B-4l tg128 +0.6 %). The gates'
// sums taken after the wait (fused with q/k's) measured −2 to −4 %: the wait then finds the
// GEMV still running for 2–7k cycles, and the sums after it cost more than that.
// Sessions 30–31 (BENCHMARKS "GPU, session 31"): PAIR, two blocks per value head (27B 291 against
// 287.5 tok/s); then fewer barriers after the wait — q/k's norms summed by every warp itself,
// Σo² from each warp's sum with one barrier, the int8 blocks quantized from registers, the
// position loaded beside `halt` (295 against 290); the pair's Σo² swapped through st.async
// mailboxes: a cluster barrier's release waited for the state's global stores (the tail 2.8–4.1k
// → 1.6k cycles, tok/s equal); the recurrence's sums by halving exchange (297.5 against 292.6).
// Measured and not kept: the pair's gates split between its blocks through a mailbox (equal:
// the part before the wait, ~18k cycles, is set by loads queued behind the GEMV's, not by
// their number).

// The warp sums of N values per lane, every lane getting all N: the shuffles level by level
// for all values, so the N chains of five dependent shuffles overlap.
template <int N>
__device__ __forceinline__ void warp_sums(float (&v)[N]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
}

// c ? a : b as one selp: written as C, the compiler may turn a choice between two elements
// of a register array into a load at a computed index, which moves the array to local memory.
__device__ __forceinline__ float select_f32(bool c, float a, float b) {
    float r;
    asm("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\nselp.f32 %0, %2, %3, p;\n}"
        : "=f"(r)
        : "r"((unsigned)c), "f"(a), "f"(b));
    return r;
}

// The warp sums of N values per lane (N a power of two, 2..32), each landing in some lanes
// only: at each of the first log2 N levels a lane keeps one half of its values and sends the
// other, so the shuffles are N/2 + N/4 + … + 1 + (5 − log2 N) instead of 5·N. Returns this
// lane's sum: that of value lane >> (5 − log2 N). (One template per level, so that every
// loop has a constant count and v is indexed by constants: in registers.)
template <int N>
__device__ __forceinline__ void scatter_levels(float* v, int lane, int o) {
    if constexpr (N > 1) {
        const bool upper = lane & o;
#pragma unroll
        for (int k = 0; k < N / 2; k++) {
            const float send = select_f32(upper, v[k], v[k + N / 2]);
            const float keep = select_f32(upper, v[k + N / 2], v[k]);
            v[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        scatter_levels<N / 2>(v, lane, o >> 1);
    }
}
template <int N>
__device__ __forceinline__ float warp_sums_scattered(float (&v)[N]) {
    constexpr int LEVELS = N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : N == 16 ? 4 : 5;
    static_assert(N == 1 << LEVELS, "N a power of two up to 32");
    scatter_levels<N>(v, threadIdx.x & 31, 16);
    float r = v[0];
#pragma unroll
    for (int l = LEVELS; l < 5; l++) r += __shfl_xor_sync(0xffffffffu, r, 16 >> l);
    return r;
}

// The block's sums of N values per thread with one barrier (`red`: N × 32 floats of shared
// memory used by this call only); every thread gets them in v.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N], float (*red)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    warp_sums<N>(v);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < N; k++) red[k][warp] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; k++) {
        float t = 0.0f;
        for (int w = 0; w < nw; w++) t += red[k][w];
        v[k] = t;
    }
}


// Measurement only (TRIT_CUDA_DEFINES="-DDN_TRACE=P"): at position P the first and last
// block's thread 0 prints the SM cycles of each phase (start → before the wait → after it →
// conv → q/k norms → recurrence → end).
#ifdef DN_TRACE
#define DN_MARK(i) (dn_tt[i] = clock64())
#else
#define DN_MARK(i)
#endif
// PAIR (with EARLY and HELD; `deltanet_step_pair`, launched as clusters of two blocks per
// value head): each block of the pair updates half of the head's state rows, so with 6 rows per
// warp all of them are held in registers before the wait and the recurrence is one pass; the
// pair swaps the halves' sums of squares for the gated norm through mailboxes in shared memory.
template <int ROWS, bool HOIST, bool EARLY, bool HELD = false, bool PAIR = false>
__device__ __forceinline__ void deltanet_step_impl(
    const float* __restrict__ x, const float* __restrict__ gamma, float eps, int d,
    const float* __restrict__ ab_w, const float* __restrict__ proj, float* __restrict__ window,
    const float* __restrict__ conv_w, int kernel, const int* __restrict__ step,
    const float* __restrict__ a_neg, const float* __restrict__ dt_bias,
    float* __restrict__ state, int hk, int dk, int dv, int v_tiled,
    const float* __restrict__ norm_w, int regroup, float* __restrict__ out, i8* q,
    float2* meta, const int* halt) {
    __shared__ float qs[DN_MAX_DK];
    __shared__ float ks[DN_MAX_DK];
    __shared__ float vs[DN_MAX_DV];
    __shared__ float os[DN_MAX_DV];
    __shared__ float scratch[32];
    __shared__ float zs[HELD ? DN_MAX_DV : 1];
    __shared__ float red_gates[3][32];
    // Each warp's Σo² over its rows (up to 16 warps).
    __shared__ float red_o[16];
    __shared__ float peer_so;                // PAIR: the other block's Σo²,
    __shared__ unsigned long long peer_bar;  // complete once it has landed
#ifdef DN_TRACE
    long long dn_tt[10];
#endif
    DN_MARK(0);
    pdl_launch_dependents();
    const int head = PAIR ? blockIdx.x >> 1 : blockIdx.x, hv = PAIR ? gridDim.x >> 1 : gridDim.x;
    const int t = threadIdx.x, T = blockDim.x;
    const int rank = PAIR ? cluster_rank() : 0;
    // This block's state rows.
    const int row_lo = PAIR ? rank * (dv / 2) : 0, row_hi = PAIR ? row_lo + dv / 2 : dv;
    const int lane = t & 31, warp = t >> 5, nw = T >> 5;
    const int kh = v_tiled ? head % hk : head / (hv / hk);
    const int kw = hk * dk, cd = 2 * kw + hv * dv;
    const float* wa = ab_w + (size_t)head * d;
    const float* wb = ab_w + (size_t)(hv + head) * d;
    float* hs = state + (size_t)head * dv * dk;
    const bool by_float4 = (d & 3) == 0;
    int pos = 0;
    if (EARLY) {
        // What this part reads that no position picks is requested first (harmless if the
        // step is halted), and the position is loaded beside `halt`: one round trip for both.
        if (by_float4) {
            for (int i = t * 32; i < d; i += T * 32) {
                prefetch_l2(wa + i);
                prefetch_l2(wb + i);
            }
        }
        for (int i = row_lo * dk + t * 32; i < row_hi * dk; i += T * 32) prefetch_l2(hs + i);
        pos = step[0];
    }
    // The greedy loop's steps past an end-of-sequence token leave the state as it is (greedy.cu
    // sets `halt`; those steps' outputs are dropped). Read before the wait: only the last
    // kernel of a step's graph writes it, and a graph starts once the previous one has ended.
    if (halt != nullptr && *halt) return;
    // PAIR: the mailbox for the other half's Σo² is opened and the cluster barrier's arrival
    // made now (both blocks of a pair read the same halt); its wait comes after
    // griddepcontrol.wait, long after the other block has arrived.
    if (PAIR) {
        if (t == 0) mailbox_open(&peer_bar, 4);
        cluster_arrive();
    }
    const bool held = HOIST && d <= DN_AB_PER * T;
    float pa[HOIST ? DN_AB_PER : 1], pb[HOIST ? DN_AB_PER : 1];
    if (HOIST) {
#pragma unroll
        for (int k = 0; k < DN_AB_PER; k++) {
            const int i = t + k * T;
            pa[k] = held && i < d ? wa[i] : 0.0f;
            pb[k] = held && i < d ? wb[i] : 0.0f;
        }
    }
    float g = 0.0f, beta = 0.0f;
    // State values per lane and row: the host launches HELD only for heads of up to
    // DN_HELD_DK key dims (step.rs).
    constexpr int U = HELD ? DN_HELD_DK / 32 : DN_MAX_DK / 32;
    float s[ROWS][U];
    // The conv channel of thread slot j: q, then k of the key head, then the head's own v.
    auto channel = [&](int j) {
        return j < dk ? kh * dk + j : j < 2 * dk ? kw + kh * dk + (j - dk) : 2 * kw + head * dv + (j - 2 * dk);
    };
    // 1. a and b of this head from RMSNorm(x)·gamma: Σ w·x·gamma, scaled by the norm's 1/rms.
    auto gates = [&]() {
        float ss = 0.0f, sa = 0.0f, sb = 0.0f;
        if (held) {
#pragma unroll
            for (int k = 0; k < (HOIST ? DN_AB_PER : 1); k++) {
                const int i = t + k * T;
                if (i < d) {
                    const float xi = x[i], xg = xi * gamma[i];
                    ss += xi * xi;
                    sa += pa[k] * xg;
                    sb += pb[k] * xg;
                }
            }
        } else {
#pragma unroll 4
            for (int i = t; i < d; i += T) {
                const float xi = x[i], xg = xi * gamma[i];
                ss += xi * xi;
                sa += wa[i] * xg;
                sb += wb[i] * xg;
            }
        }
        ss = block_sum(ss, scratch);
        sa = block_sum(sa, scratch);
        sb = block_sum(sb, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
        g = expf(a_neg[head] * dn_softplus(sa * inv + dt_bias[head]));
        beta = dn_sigmoid(sb * inv);
    };
    // The same sums as float4s (d a multiple of 4; rows 16-byte aligned then) and one block
    // reduction; its weights were requested into L2 first.
    auto gates_fast = [&]() {
        float v[3] = {0.0f, 0.0f, 0.0f};  // Σx², Σ wa·x·γ, Σ wb·x·γ
        const float4 *x4 = (const float4*)x, *g4 = (const float4*)gamma;
        const float4 *a4 = (const float4*)wa, *b4 = (const float4*)wb;
#pragma unroll 2
        for (int i = t; i < d / 4; i += T) {
            const float4 xi = x4[i], gi = g4[i], ai = a4[i], bi = b4[i];
            const float4 xg = make_float4(xi.x * gi.x, xi.y * gi.y, xi.z * gi.z, xi.w * gi.w);
            v[0] += xi.x * xi.x + xi.y * xi.y + xi.z * xi.z + xi.w * xi.w;
            v[1] += ai.x * xg.x + ai.y * xg.y + ai.z * xg.z + ai.w * xg.w;
            v[2] += bi.x * xg.x + bi.y * xg.y + bi.z * xg.z + bi.w * xg.w;
        }
        block_sums<3>(v, red_gates);
        const float inv = 1.0f / sqrtf(v[0] / (float)d + eps);
        g = expf(a_neg[head] * dn_softplus(v[1] * inv + dt_bias[head]));
        beta = dn_sigmoid(v[2] * inv);
    };
    float conv_pre = 0.0f;  // HELD: thread t's channel's sum over the earlier inputs
    float win[3] = {0.0f, 0.0f, 0.0f};  // HELD: those inputs (positions before 0 stay 0)
    if (EARLY) {
        // Launched by a q‖k‖v‖z GEMV that lets its dependents start only after its own wait,
        // so x (and everything before it) is final here: the gates, the position and L2
        // requests for this head's state and its window slots all run while that GEMV does.
        // Everything this part reads was requested before the gates' chain of loads and sums
        // waits on any of it.
        if (!by_float4) gates();
        // HELD, conv kernels of up to 4 taps: thread t's channel's earlier inputs are loaded
        // now, in flight beside the gates' loads, and its weights requested into L2 (8 rows
        // of 4 taps per 128-byte line), so that the conv's sum after the gates waits for no
        // DRAM round trip.
        const bool win_held = HELD && kernel <= 4 && t < 2 * dk + dv;
        if (win_held) {
            const int c = channel(t);
#pragma unroll
            for (int i = 0; i < 3; i++) {
                const int p = pos - (kernel - 1) + i;
                if (i < kernel - 1 && p >= 0) win[i] = window[(size_t)(p % kernel) * cd + c];
            }
            if ((t & 7) == 0) prefetch_l2(conv_w + (size_t)c * kernel);
        }
        for (int j = win_held ? t + T : t; j < 2 * dk + dv; j += T) {
            const int c = channel(j);
            for (int i = 0; i < kernel - 1; i++) {
                const int p = pos - (kernel - 1) + i;
                if (p >= 0) prefetch_l2(window + (size_t)(p % kernel) * cd + c);
            }
        }
        DN_MARK(7);
        if (by_float4) gates_fast();
        DN_MARK(8);
        if (HELD) {
            dn_load_rows<ROWS, U>(s, hs, row_lo + warp * ROWS, row_hi, dk, lane);
            DN_MARK(9);
            if (t < 2 * dk + dv) {
                const int c = channel(t);
                const float* wc = conv_w + (size_t)c * kernel;
                if (win_held) {
#pragma unroll
                    for (int i = 0; i < 3; i++)
                        if (i < kernel - 1) conv_pre += wc[i] * win[i];
                } else {
                    for (int i = 0; i < kernel - 1; i++) {
                        const int p = pos - (kernel - 1) + i;
                        if (p >= 0) conv_pre += wc[i] * window[(size_t)(p % kernel) * cd + c];
                    }
                }
            }
        }
        DN_MARK(1);
        pdl_wait();
        if (PAIR) cluster_wait();  // the other block has opened its mailbox
        DN_MARK(2);
        if (HELD) {
            const float* z = proj + cd + (size_t)head * dv;
            if (t < dv) cp_async4_zfill(smem_addr(zs + t), z + t, 4);
            cp_async_commit();
        }
    } else {
        pdl_wait();
        pos = step[0];
    }
    if (HOIST) dn_load_rows<ROWS, U>(s, hs, warp * ROWS, dv, dk, lane);
    if (!EARLY) gates();

    // 2. Conv + SiLU over the window, oldest input first (the CPU's order).
    const bool owns_qk = v_tiled ? head < hk : head % (hv / hk) == 0;
    for (int j = t; j < 2 * dk + dv; j += T) {
        int c;
        float* dst;
        if (j < dk) {
            c = kh * dk + j;
            dst = qs + j;
        } else if (j < 2 * dk) {
            c = kw + kh * dk + (j - dk);
            dst = ks + (j - dk);
        } else {
            c = 2 * kw + head * dv + (j - 2 * dk);
            dst = vs + (j - 2 * dk);
        }
        const float* wc = conv_w + (size_t)c * kernel;
        float acc = 0.0f;
        if (HELD && j == t) {
            acc = conv_pre;
        } else {
            for (int i = 0; i < kernel - 1; i++) {
                const int p = pos - (kernel - 1) + i;
                if (p >= 0) acc += wc[i] * window[(size_t)(p % kernel) * cd + c];
            }
        }
        const float xc = proj[c];
        acc += wc[kernel - 1] * xc;
        const bool writes = j >= 2 * dk ? j - 2 * dk >= row_lo && j - 2 * dk < row_hi : owns_qk && rank == 0;
        if (writes) window[(size_t)(pos % kernel) * cd + c] = xc;
        *dst = acc * dn_sigmoid(acc);
    }
    __syncthreads();
    DN_MARK(3);

    // 3. L2-normalized q (also × 1/√dk) and k, then the delta rule. Every warp takes the
    // norms' sums itself (no barrier after the conv's) and applies them as scalars: qs and ks
    // stay as the conv left them.
    const int per_lane = dk / 32;
    float qk[3] = {0.0f, 0.0f, 0.0f};  // Σq², Σk², Σq·k
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (u < per_lane) {
            const float qu = qs[lane + 32 * u], ku = ks[lane + 32 * u];
            qk[0] += qu * qu;
            qk[1] += ku * ku;
            qk[2] += qu * ku;
        }
    }
    warp_sums<3>(qk);
    const float iq = rsqrtf((float)dk) / sqrtf(qk[0] + 1e-6f);
    const float ik = 1.0f / sqrtf(qk[1] + 1e-6f);
    const float kq = qk[2] * iq * ik;  // k·q of the normalized vectors
    DN_MARK(4);
    for (int i0 = row_lo + warp * ROWS; i0 < row_hi; i0 += nw * ROWS) {
        if (!(HOIST || HELD) || i0 != row_lo + warp * ROWS)
            dn_load_rows<ROWS, U>(s, hs, i0, row_hi, dk, lane);
        // The next pass's rows into L1 now (they are in L2 already), so its loads do not
        // wait a round trip: ROWS · dk floats, one 128-byte line per lane.
        const int next = i0 + nw * ROWS, lines = ROWS * dk / 32;
        if (next < row_hi && lane < lines) {
            const int r = lane / (dk / 32), part = lane % (dk / 32);
            if (next + r < row_hi)
                asm volatile("prefetch.global.L1 [%0];" ::"l"(hs + (size_t)(next + r) * dk +
                                                              32 * part));
        }
        // Both dot products from the old row, in one reduction: with S' = g·S + δ kᵀ,
        // S'·k needs only S·k (δ = β(v − g·S·k)) and o = S'·q = g·(S·q) + δ (k·q). The
        // reduction leaves each sum in a group of lanes; S·k goes to all lanes by one shuffle
        // per row, and the lanes holding a row's S·q write its o.
        constexpr int NV = 2 * ROWS <= 8 ? 8 : 16, SH = NV == 8 ? 2 : 1;
        static_assert(2 * ROWS <= 16, "rows per warp");
        float dots[NV];  // S·k of each row, then S·q, then zeros
#pragma unroll
        for (int r = 2 * ROWS; r < NV; r++) dots[r] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            dots[r] = 0.0f;
            dots[ROWS + r] = 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u < per_lane) {
                    dots[r] += s[r][u] * ks[lane + 32 * u];
                    dots[ROWS + r] += s[r][u] * qs[lane + 32 * u];
                }
            }
        }
        const float mine = warp_sums_scattered<NV>(dots);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int row = i0 + r;
            const float sk = __shfl_sync(0xffffffffu, mine, r << SH);
            // k̂ = ik·k and q̂ = iq·q: S·k̂ = ik·(S·k), and the update δ k̂ᵀ = (δ·ik) kᵀ.
            const float delta = row < row_hi ? beta * (vs[row] - g * ik * sk) : 0.0f;
            const float dk_row = delta * ik;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (u < per_lane && row < row_hi)
                    hs[(size_t)row * dk + lane + 32 * u] = g * s[r][u] + dk_row * ks[lane + 32 * u];
            }
            if (lane == (ROWS + r) << SH && row < row_hi) os[row] = g * iq * mine + delta * kq;
        }
    }
    // 4. Gated RMSNorm: out = RMSNorm(o)·w · SiLU(z), z the rows after the conv channels.
    // Σo² from each warp's sum with one barrier, which also makes os (and z) visible to every
    // warp (PAIR: then the halves' sums are swapped through the mailboxes).
    // (Lane r reads back the o of the warp's row r, which another lane of the warp wrote —
    // hence the warp's barrier —, so that no register is held through the recurrence.)
    __syncwarp();
    float o_part = 0.0f;
    for (int i = row_lo + warp * ROWS + lane; lane < ROWS && i < row_hi; i += nw * ROWS)
        o_part += os[i] * os[i];
    o_part = warp_sum(o_part);
    if (HELD) cp_async_wait_all();  // z (each thread waits for its own copy)
    if (lane == 0) red_o[warp] = o_part;
    __syncthreads();
    float so = 0.0f;
    for (int w = 0; w < nw; w++) so += red_o[w];
    if (PAIR) {
        if (t == 0) mailbox_send(&peer_so, &peer_bar, rank ^ 1, so);
        so += mailbox_take(&peer_so, &peer_bar);
    }
    DN_MARK(5);
    const float io = 1.0f / sqrtf(so / (float)dv + eps);
    const int at = regroup ? (head % hk) * (hv / hk) + head / hk : head;
    const float* z = proj + cd + (size_t)head * dv;
    auto gated = [&](int i) {
        const float zi = HELD ? zs[i] : z[i];
        return os[i] * io * norm_w[i] * (zi * dn_sigmoid(zi));
    };
    if (q == nullptr) {
        for (int i = row_lo + t; i < row_hi; i += T) out[(size_t)at * dv + i] = gated(i);
        return;
    }
    // With int8 blocks (the host passes q only for dv, and PAIR for dv / 2, a multiple of
    // QBLOCK) one warp per block: its two values per lane quantized from registers.
    for (int j = row_lo / QBLOCK + warp; j < row_hi / QBLOCK; j += nw) {
        const int i = QBLOCK * j + lane;
        const float a = gated(i), b = gated(i + 32);
        out[(size_t)at * dv + i] = a;
        out[(size_t)at * dv + i + 32] = b;
        quant_block_warp(a, b, q + (size_t)at * dv + QBLOCK * j, meta + ((size_t)at * dv) / QBLOCK + j);
    }
#ifdef DN_TRACE
    __syncthreads();
    DN_MARK(6);
    if (t == 0 && (head == 0 || head == hv - 1) && pos == DN_TRACE)
        printf("dn_trace head %d: prewait %lld (prefetch %lld gates %lld rows %lld conv_pre %lld) "
               "wait %lld conv %lld norms %lld recur %lld tail %lld\n",
               head, dn_tt[1] - dn_tt[0], dn_tt[7] - dn_tt[0], dn_tt[8] - dn_tt[7],
               dn_tt[9] - dn_tt[8], dn_tt[1] - dn_tt[9], dn_tt[2] - dn_tt[1],
               dn_tt[3] - dn_tt[2], dn_tt[4] - dn_tt[3], dn_tt[5] - dn_tt[4],
               dn_tt[6] - dn_tt[5]);
#endif
}

#define DELTANET_STEP(NAME, ROWS, HOIST, EARLY, HELD, BOUNDS, PAIR)                               \
    extern "C" __global__ void BOUNDS NAME(                                                      \
        const float* x, const float* gamma, float eps, int d, const float* ab_w,                  \
        const float* proj, float* window, const float* conv_w, int kernel, const int* step,      \
        const float* a_neg, const float* dt_bias, float* state, int hk, int dk, int dv,          \
        int v_tiled, const float* norm_w, int regroup, float* out, i8* q, float2* meta,          \
        const int* halt) {                                                                        \
        deltanet_step_impl<ROWS, HOIST, EARLY, HELD, PAIR>(x, gamma, eps, d, ab_w, proj, window,       \
                                                     conv_w, kernel, step, a_neg, dt_bias, state, \
                                                     hk, dk, dv, v_tiled, norm_w, regroup, out, q, \
                                                     meta, halt);                                 \
    }
DELTANET_STEP(deltanet_step, 4, false, false, false, __launch_bounds__(512), false)
DELTANET_STEP(deltanet_step_hoisted, 8, true, false, false, __launch_bounds__(512), false)
DELTANET_STEP(deltanet_step_early, 4, false, true, false, __launch_bounds__(512), false)
// At most 64 registers, so that 12 warps fit beside a streaming GEMV block (ptxas for sm_90:
// 64, 8 bytes of spills; the pair 12; `scripts/ptx_regs.py deltanet.cu deltanet_step`).
DELTANET_STEP(deltanet_step_held, 4, false, true, true, __maxnreg__(64), false)
#if __CUDA_ARCH__ >= 900
#define DN_PAIR_BOUNDS __maxnreg__(64) __cluster_dims__(2, 1, 1)
#else
#define DN_PAIR_BOUNDS __maxnreg__(64)
#endif
DELTANET_STEP(deltanet_step_pair, 6, false, true, true, DN_PAIR_BOUNDS, true)

// The batched decode step (hybrid/batch.rs): row blockIdx.y is one token of another sequence
// (residual, projection, position and output rows at their strides); its conv window and
// delta-rule state are in its slot row_slot[y]: the slot table holds `stride` addresses per
// slot, this layer's window and state at `at` and `at + 1` (written by the host before the
// step). Its gated-norm output has no int8 blocks (the step quantizes all rows at once).
extern "C" __global__ void __launch_bounds__(512) deltanet_step_slots(
    const float* x, const float* gamma, float eps, int d, const float* ab_w, const float* proj,
    int proj_row, const unsigned long long* tab, int stride, int at, const int* row_slot,
    const float* conv_w, int kernel, const int* step, const float* a_neg,
    const float* dt_bias, int hk, int dk, int dv, int v_tiled, const float* norm_w,
    int regroup, float* out) {
    const int r = blockIdx.y;
    const unsigned long long* e = tab + (size_t)row_slot[r] * stride + at;
    deltanet_step_impl<4, false, false, false>(
        x + (size_t)r * d, gamma, eps, d, ab_w, proj + (size_t)r * proj_row, (float*)e[0],
        conv_w, kernel, step + r, a_neg, dt_bias, (float*)e[1], hk, dk, dv, v_tiled, norm_w,
        regroup, out + (size_t)r * gridDim.x * dv, nullptr, nullptr, nullptr);
}
