// The whole decode step of a dense model's layers as ONE persistent kernel ("megastep").
//
// Why: the chain of ~6 kernels per layer is latency-bound — q‖k‖v and o move their bytes at
// ~1.3–1.4 TB/s on the 8B shape because their blocks cannot start loading weights before the
// previous kernel's blocks leave the multiprocessors. Here one block per multiprocessor runs
// every layer, and the weights a block will need are a fixed sequence known before the step
// starts: its share of q‖k‖v, o, gate, up and down of layer 0, then of layer 1, ... So a ring
// of shared-memory slots is kept full by bulk copies (cp.async.bulk, completing on one
// mbarrier per slot) running ahead of the computation, across phase and layer boundaries: the
// weights of the next phase land while the block waits at a grid barrier, computes attention
// or normalizes its input. DRAM keeps streaming; only the activations follow the chain.
//
// Per layer, with a grid barrier after each phase (the last layer's down has none):
//   Q. xs = int8(RMSNorm(x)·γ) (every block, from L2); qkv = W_qkv · xs (the block's rows)
//   A. blocks h < n_heads: head h's attention over the whole context (q/k norm, rotation, the
//      new k/v into the cache) → att and its int8 blocks
//   O. x += W_o · att (the block's rows)
//   G. xs = int8(RMSNorm(x)·γ'); h = silu(W_gate · xs) · (W_up · xs) (the block's outputs)
//   D. xs = int8(h); x += W_down · xs (the block's rows)
//
// Rows are shared out in groups of 4 (block b takes groups [b·G/N, (b+1)·G/N)); a block's rows
// of one matrix are contiguous in memory (repack.rs: codes then scales, row-major), so each
// ring slot is filled by two bulk copies: up to MS_SLOT_CODES bytes of whole rows' codes and
// their f16 scales. Within a slot, warp w computes the 4-row groups t ≡ w (mod MS_WARPS) of the
// phase's running group count, whole rows each (no reduction across warps: a row's sum is
// the same whatever the block count). A slot is refilled by the last warp to finish with it
// (a shared counter); every warp first waits for the slot's data, so no warp can run a whole
// ring ahead and count for the slot's next round early.
//
// Status (session 24, H200, 8B shape, BENCHMARKS "GPU, session 24"): correct, opt-in, and
// slower than the chain (tg128 ~622 against ~880). Streaming alone is not the problem (with
// everything but the copies skipped, MS_PROBE=15: 1,700 tok/s); the latency chain is: per
// layer ~3.7 µs for the barrier after q‖k‖v, 6.5 for the attention, ~2 for each other
// barrier, 1.5–2.7 for each input, and the ring (180 KB, ~7 µs of streaming) is drained by
// then, so gate‖up and down run at the stream's rate after it. TRIT_CUDA_MEGA_TRACE=1 prints
// this breakdown (megastep.rs).
//
// Rules (as decode_persist.cu's): every block is resident before any waits at a barrier (one
// block per multiprocessor, the next kernel let in only after the last barrier); data other
// blocks wrote in this launch is read through L2 (ld.global.cg: L1 is not coherent); the
// barrier counter is reset by the block whose final arrival completes the count.

#ifndef MS_SLOTS
#define MS_SLOTS 10
#endif
#ifndef MS_SLOT_CODES
#define MS_SLOT_CODES 16384
#endif
#define MS_SLOT_SCALES (MS_SLOT_CODES / 8)
#define MS_SLOT_BYTES (MS_SLOT_CODES + MS_SLOT_SCALES)
#define MS_THREADS 512
#define MS_WARPS (MS_THREADS / 32)
#define MS_HD 128
#define MS_SEGS 5
// Measurement only (TRIT_CUDA_DEFINES="-DMS_PROBE=N"; outputs are garbage): 1 skips the
// products (chunks are waited for and released), 2 the attention, 4 the grid barriers, 8 the
// input prologues, 16 the weights (no copies, no products).
#ifndef MS_PROBE
#define MS_PROBE 0
#endif
#ifndef MS_OLD_BARRIER
#define MS_OLD_BARRIER 0
#endif
// Warps of an attention block that share the positions (a round is 4 per warp). Each round
// waits for DRAM (the cache rows are long gone from L2 after a step's 2 GB of weights): on the
// H200's 8B trace, 16 warps took the rounds from 6.6 to 2.7 µs per layer (tg128 604 → 622).
#ifndef MS_ATT_WARPS
#define MS_ATT_WARPS 16
#endif
#ifndef MS_ATT_L2
#define MS_ATT_L2 0
#endif
// MS_HEAD_WAIT (measurement, not yet run): no grid barrier after q‖k‖v; each block counts
// the rows it wrote into per-head counters (q heads, then k and v heads), and an attention
// block waits only for its three heads' rows (ms_rows_done / ms_wait_rows).
#ifndef MS_HEAD_WAIT
#define MS_HEAD_WAIT 0
#endif

// One layer's device addresses (megastep.rs writes them in this order).
struct MsLayer {
    const uint4* qkv_c;
    const half_bits* qkv_s;
    const uint4* o_c;
    const half_bits* o_s;
    const uint4* gu_c;
    const half_bits* gu_s;
    const uint4* down_c;
    const half_bits* down_s;
    const float* attn_norm;
    const float* q_norm;
    const float* k_norm;
    const float* ffn_norm;
    half_bits* kc;
    half_bits* vc;
};

// A block's rows of one matrix in one layer: rows [row0, row0 + rows) of `nb` blocks each,
// `rpc` rows per ring slot, `chunks` slots.
struct MsSeg {
    int row0, rows, nb, rpc, chunks;
};

// Segments in ring order: q‖k‖v, o, gate, up (rows ffn + …), down.
struct MsPlan {
    MsSeg seg[MS_SEGS];
    int per_layer, total;
};

// Groups [u0, u1) of `units` shared out over the grid.
__device__ __forceinline__ int2 ms_share(int units) {
    const long long b = blockIdx.x, n = gridDim.x;
    return make_int2((int)(b * units / n), (int)((b + 1) * units / n));
}

__device__ __forceinline__ MsSeg ms_seg(int row0, int rows, int nb) {
    MsSeg s;
    s.row0 = row0;
    s.rows = rows;
    s.nb = nb;
    s.rpc = max(4, MS_SLOT_CODES / (64 * nb) * 4);
    s.chunks = (rows + s.rpc - 1) / s.rpc;
    return s;
}

__device__ void ms_make_plan(MsPlan& p, int n_layers, int d, int nq, int nkv, int ffn) {
    const int2 q = ms_share((nq + 2 * nkv) / 4), o = ms_share(d / 4), g = ms_share(ffn / 4);
    p.seg[0] = ms_seg(4 * q.x, 4 * (q.y - q.x), d / 64);
    p.seg[1] = ms_seg(4 * o.x, 4 * (o.y - o.x), nq / 64);
    p.seg[2] = ms_seg(4 * g.x, 4 * (g.y - g.x), d / 64);
    p.seg[3] = ms_seg(ffn + 4 * g.x, 4 * (g.y - g.x), d / 64);
    p.seg[4] = ms_seg(4 * o.x, 4 * (o.y - o.x), ffn / 64);
    p.per_layer = 0;
    for (int s = 0; s < MS_SEGS; s++) p.per_layer += p.seg[s].chunks;
    p.total = p.per_layer * n_layers;
}

// Requests chunk c of the block's sequence into its ring slot (nothing past the end).
__device__ void ms_issue(const MsPlan& p, const MsLayer* __restrict__ layers, int c,
                         unsigned char* ring, unsigned long long* full) {
    if (c >= p.total) return;
    const int layer = c / p.per_layer;
    int j = c - layer * p.per_layer, s = 0;
    while (j >= p.seg[s].chunks) j -= p.seg[s++].chunks;
    const MsSeg& g = p.seg[s];
    const int row = g.row0 + j * g.rpc, n = min(g.rpc, g.row0 + g.rows - row);
    const int m = s < 2 ? s : s - (s >= 3);  // q‖k‖v, o, gate‖up (twice), down
    const unsigned long long* ptrs = (const unsigned long long*)(layers + layer);
    const uint4* codes = (const uint4*)__ldg(ptrs + 2 * m) + (size_t)row * g.nb;
    const half_bits* scales = (const half_bits*)__ldg(ptrs + 2 * m + 1) + (size_t)row * g.nb;
    const unsigned bc = (unsigned)(n * g.nb * 16), bs = (unsigned)(n * g.nb * 2);
    const int slot = c % MS_SLOTS;
    const unsigned bar = smem_addr(full + slot);
    const unsigned dst = smem_addr(ring + (size_t)slot * MS_SLOT_BYTES);
    // The warps' reads of the slot's previous chunk (generic proxy) before the copy's writes.
    async_proxy_fence();
    mbar_expect_tx(bar, bc + bs);
    bulk_copy(dst, codes, bc, bar);
    bulk_copy(dst + MS_SLOT_CODES, scales, bs, bar);
}

// The block's shared state besides the dynamic arrays.
struct MsRing {
    unsigned char* ring;
    unsigned long long* full;
    unsigned* done;
    const MsLayer* layers;
    const MsPlan* plan;
};

// Consumes segment s's chunks, starting at chunk c0 of the sequence: each 4-row group is one
// warp's (the phase's running group count `item` decides which); out(local row, value) for
// every row, local to the segment. Returns the chunk after the segment's last.
template <typename Out>
__device__ __forceinline__ int ms_consume(const MsRing& r, int s, int c0, const uint4* xs,
                                          const float2* ms, int& item, Out out) {
    const MsSeg g = r.plan->seg[s];
    if (MS_PROBE & 16) return c0 + g.chunks;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = 0; j < g.chunks; j++) {
        const int c = c0 + j, slot = c % MS_SLOTS;
        mbar_wait(smem_addr(r.full + slot), (unsigned)(c / MS_SLOTS) & 1u);
        const int n = min(g.rpc, g.rows - j * g.rpc), groups = n / 4;
        const uint4* wc = (const uint4*)(r.ring + (size_t)slot * MS_SLOT_BYTES);
        const half_bits* wsc = (const half_bits*)(r.ring + (size_t)slot * MS_SLOT_BYTES + MS_SLOT_CODES);
        for (int gi = ((warp - item) % MS_WARPS + MS_WARPS) % MS_WARPS;
             !(MS_PROBE & 1) && gi < groups; gi += MS_WARPS) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int b = lane; b < g.nb; b += 32) {
                uint4 a[4];
#pragma unroll
                for (int k = 0; k < 4; k++) a[k] = xs[fg_chunk(b, k)];
                const float2 m = ms[b];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int at = (4 * gi + i) * g.nb + b;
                    const int dot = dot_block(wc[at], a);
                    acc[i] += h2f(wsc[at]) * (m.x * (float)dot - m.y);
                }
            }
            const float t = warp_sum_rows<4>(acc);  // lane l: row l / 8
            if ((lane & 7) == 0) out(j * g.rpc + 4 * gi + (lane >> 3), t);
        }
        item += groups;
        // The slot is free once every warp is done with it; the last one refills it.
        __syncwarp();
        if (lane == 0) {
            __threadfence_block();
            if (atomicAdd(r.done + slot, 1u) == MS_WARPS - 1) {
                r.done[slot] = 0;
                ms_issue(*r.plan, r.layers, c + MS_SLOTS, r.ring, r.full);
            }
        }
    }
    return c0 + g.chunks;
}

// The attention arrays (dynamic shared memory).
struct MsAtt {
    float qraw[MS_HD], kraw[MS_HD], vraw[MS_HD];
    float tmp[MS_HD], ktmp[MS_HD], qs[MS_HD], kcur[MS_HD], vcur[MS_HD];
    float sm_m[MS_WARPS], sm_l[MS_WARPS];
    float sm_o[MS_WARPS][MS_HD];
    float2 scratch2[32];
};

// Phase timestamps (TRIT_CUDA_MEGA_TRACE=1, megastep.rs prints them): %globaltimer as seen
// by thread 0 of block 0 (an attention block) and of the last block, MS_STAMPS per layer:
// 14 at the phases' ends (the kernel) and the last 3 inside the attention (ms_attend).
#define MS_STAMPS 17
__device__ __forceinline__ void ms_stamp(unsigned long long* trace, int li, int n_layers, int i) {
    if (trace == nullptr || threadIdx.x != 0) return;
    const int b = blockIdx.x == 0 ? 0 : blockIdx.x == gridDim.x - 1 ? 1 : -1;
    if (b < 0) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    trace[(b * n_layers + li) * MS_STAMPS + i] = t;
}

// Warp w's first round of cached keys and values for head h (positions 4w … 4w + 3 below
// pos): final before this step, so the caller requests them before the barrier that ends
// the q‖k‖v phase, and they load while the block waits there.
__device__ __forceinline__ void ms_first_round(const MsLayer& L, int h, int n_heads, int n_kv,
                                               int pos, int ctx, float (&kk)[DEC_U][4],
                                               float (&vv)[DEC_U][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p0 = warp * DEC_U;
    const size_t kv_row = (size_t)(h / (n_heads / n_kv)) * ctx * MS_HD;
    if (warp < MS_ATT_WARPS && p0 < pos + 1)
        load_round<4>(L.kc + kv_row, L.vc + kv_row, MS_HD, p0, pos + 1, pos, lane, kk, vv);
    // MS_ATT_L2 (measurement, not yet run): the later rounds' rows are asked into L2 as well,
    // so each round after the first waits for L2 rather than DRAM (no effect on results).
    if (MS_ATT_L2) {
        const int first = MS_ATT_WARPS * DEC_U, lines = 2 * (MS_HD * 2 / 128);  // K and V
        for (int i = threadIdx.x; i < (pos - first) * lines; i += blockDim.x) {
            const int p = first + i / lines, part = i % lines;
            const half_bits* base = part < lines / 2 ? L.kc : L.vc;
            prefetch_l2(base + kv_row + (size_t)p * MS_HD + (part % (lines / 2)) * 64);
        }
    }
}

// Head h's attention over positions 0..pos (the whole context in this block; attention.cu's
// helpers), its output and int8 blocks to att / att_q / att_meta. kk / vv: ms_first_round's.
__device__ __forceinline__ void ms_attend(MsAtt& A, const MsLayer& L, const float* qkv, int h, int n_heads,
                          int n_kv, float eps, float scale, int adjacent, const float2* cos_sin,
                          int pos, int ctx, float* att, i8* att_q, float2* att_meta,
                          float (&kk)[DEC_U][4], float (&vv)[DEC_U][4],
                          unsigned long long* trace, int li, int n_layers) {
    const int hd = MS_HD, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int group = n_heads / n_kv, kvh = h / group, len = pos + 1;
    if (tid < hd) {
        A.qraw[tid] = __ldcg(qkv + (size_t)h * hd + tid);
        A.kraw[tid] = __ldcg(qkv + (size_t)(n_heads + kvh) * hd + tid);
        A.vraw[tid] = __ldcg(qkv + (size_t)(n_heads + n_kv + kvh) * hd + tid);
    }
    const float qn = L.q_norm != nullptr && tid < hd ? __ldg(L.q_norm + tid) : 1.0f;
    const float kn = L.k_norm != nullptr && tid < hd ? __ldg(L.k_norm + tid) : 1.0f;
    const size_t kv_row = (size_t)kvh * ctx * hd;
    const half_bits* kh = L.kc + kv_row;
    const half_bits* vh = L.vc + kv_row;
    const int p0 = warp * DEC_U;
    __syncthreads();
    norm_rope_qk(A.qraw, A.kraw, A.vraw, L.q_norm, L.k_norm, qn, kn, eps,
                 cos_sin + (size_t)pos * (hd / 2), hd, adjacent, scale, A.tmp, A.ktmp, A.qs,
                 A.kcur, A.vcur, A.scratch2);
    if (h % group == 0 && tid < hd) {
        L.kc[kv_row + (size_t)pos * hd + tid] = f2h(A.kcur[tid]);
        L.vc[kv_row + (size_t)pos * hd + tid] = f2h(A.vcur[tid]);
    }
    float m = -INFINITY, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ms_stamp(trace, li, n_layers, MS_STAMPS - 3);
    if (warp < MS_ATT_WARPS)
        attend_rounds<4, MS_ATT_WARPS>(A.qs, A.kcur, A.vcur, kh, vh, hd, p0, len, pos, true, lane, kk, vv, m, l,
                         acc);
    ms_stamp(trace, li, n_layers, MS_STAMPS - 2);
    const float M = warps_share<MS_ATT_WARPS>(m, l, acc, A.sm_m, A.sm_l, A.sm_o);
    warps_normalize<MS_ATT_WARPS>(A.sm_m, A.sm_l, A.sm_o, M, A.tmp, hd);
    ms_stamp(trace, li, n_layers, MS_STAMPS - 1);
    write_head(A.tmp, h, hd, att, att_q, att_meta, 1);
}

// The int8 blocks another phase wrote (att_q / att_meta) into xs / ms.
__device__ __forceinline__ void ms_load_q(const uint4* q, const float2* meta, int nb, uint4* xs,
                                          float2* ms) {
    for (int c = threadIdx.x; c < 4 * nb; c += blockDim.x) xs[fg_chunk(c >> 2, c & 3)] = __ldcg(q + c);
    for (int b = threadIdx.x; b < nb; b += blockDim.x) ms[b] = __ldcg(meta + b);
}

// Barrier k (1, 2, ...) of the launch across the grid: the block's threads meet, thread 0
// adds its arrival with release semantics (ordering the block's writes, which the meeting
// ordered before it) and polls with acquire loads until every block has arrived, then the
// block meets again. Cheaper than decode_persist.cu's grid_barrier (a full fence, then a
// plain atomic, and sleeps between polls); MS_OLD_BARRIER=1 takes that one for comparison,
// MS_PROBE & 4 only the block's meeting.
__device__ __forceinline__ void ms_barrier(unsigned* counter, unsigned k) {
    if (MS_PROBE & 4) {
        __syncthreads();
        return;
    }
#if MS_OLD_BARRIER
    grid_barrier(counter, k);
#else
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        const unsigned target = k * gridDim.x;
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
#endif
}

// After the block's q‖k‖v rows [row0, row0 + rows) are written (the block has met since):
// thread 0 adds, per head slot of MS_HD rows they overlap, how many it wrote (release).
__device__ __forceinline__ void ms_rows_done(unsigned* heads, int row0, int rows) {
    __syncthreads();
    if (threadIdx.x != 0 || rows == 0) return;
    for (int h = row0 / MS_HD; h * MS_HD < row0 + rows; h++) {
        const int lo = max(row0, h * MS_HD), hi = min(row0 + rows, (h + 1) * MS_HD);
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(heads + h), "r"(hi - lo)
                     : "memory");
    }
}

// Until head slots q (q head), k and v hold all MS_HD rows of layer li (acquire), then the block
// meets.
__device__ __forceinline__ void ms_wait_rows(const unsigned* heads, int q, int k, int v, int li) {
    if (threadIdx.x == 0) {
        const unsigned target = (unsigned)(li + 1) * MS_HD;
        const int slots[3] = {q, k, v};
        for (int j = 0; j < 3; j++) {
            unsigned seen;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(heads + slots[j])
                             : "memory");
            } while (seen < target);
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(MS_THREADS, 1)
    dense_step_mega(const MsLayer* __restrict__ layers, int n_layers, int d, int n_heads,
                    int n_kv, int ffn, float eps, float scale, int adjacent,
                    const float2* __restrict__ cos_sin, const int* step, int ctx, float* x,
                    float* qkv, float* att, i8* att_q, float2* att_meta, float* h,
                    unsigned* counter, int gmax, unsigned long long* trace, unsigned* heads) {
    extern __shared__ uint4 dyn[];
    __shared__ unsigned long long full[MS_SLOTS];
    __shared__ unsigned done[MS_SLOTS];
    __shared__ MsPlan plan;
    __shared__ float scratch[32];
    const int hd = MS_HD, nq = n_heads * hd, nkv = n_kv * hd;
    const int nb_max = max(max(d, nq), ffn) / 64;
    unsigned char* ring = (unsigned char*)dyn;
    uint4* xs = (uint4*)(ring + (size_t)MS_SLOTS * MS_SLOT_BYTES);
    float2* ms = (float2*)(xs + 4 * nb_max);
    float* gsum = (float*)(ms + nb_max);
    MsAtt& A = *(MsAtt*)(gsum + 2 * gmax);
    const MsRing r = {ring, full, done, layers, &plan};

    // The first MS_SLOTS chunks: weights only, so before the wait for the previous kernel.
    if (threadIdx.x == 0) {
        ms_make_plan(plan, n_layers, d, nq, nkv, ffn);
        for (int s = 0; s < MS_SLOTS; s++) {
            mbar_init(smem_addr(full + s));
            done[s] = 0;
        }
        mbar_init_fence();
        for (int c = 0; c < MS_SLOTS && !(MS_PROBE & 16); c++) ms_issue(plan, layers, c, ring, full);
    }
    __syncthreads();
    pdl_wait();
    const int pos = step[0];
    unsigned k = 0;  // barriers passed
    int c = 0;       // the next chunk of the sequence
    for (int li = 0; li < n_layers; li++) {
        const MsLayer& L = layers[li];
        int item = 0;
        // Q: q‖k‖v of RMSNorm(x).
        {
ms_stamp(trace, li, n_layers, 0);
            const MsSeg& g = plan.seg[0];
            const FgGamma gr = fg_gamma(FG_IN_NORM, d / 64, L.attn_norm);
            if (!(MS_PROBE & 8)) fg_prologue<true, false>(FG_IN_NORM, d / 64, x, gr, L.attn_norm, eps, nullptr,
                                     nullptr, xs, ms, scratch);
            __syncthreads();
            ms_stamp(trace, li, n_layers, 1);
            const int row0 = g.row0;
            c = ms_consume(r, 0, c, xs, ms, item, [&](int i, float v) { qkv[row0 + i] = v; });
            ms_stamp(trace, li, n_layers, 2);
        }
        // A: attention, one block per q head.
        const bool attends = !(MS_PROBE & 2) && (int)blockIdx.x < n_heads;
        float kk[DEC_U][4], vv[DEC_U][4];
        if (attends) ms_first_round(L, blockIdx.x, n_heads, n_kv, pos, ctx, kk, vv);
        if (MS_HEAD_WAIT) {
            ms_rows_done(heads, plan.seg[0].row0, plan.seg[0].rows);
            if (attends) {
                const int kvh = blockIdx.x / (n_heads / n_kv);
                ms_wait_rows(heads, blockIdx.x, n_heads + kvh, n_heads + n_kv + kvh, li);
            }
        } else {
            ms_barrier(counter, ++k);
        }
        ms_stamp(trace, li, n_layers, 3);
        if (attends)
            ms_attend(A, L, qkv, blockIdx.x, n_heads, n_kv, eps, scale, adjacent, cos_sin, pos,
                      ctx, att, att_q, att_meta, kk, vv, trace, li, n_layers);
        ms_stamp(trace, li, n_layers, 4);
        ms_barrier(counter, ++k);
        ms_stamp(trace, li, n_layers, 5);
        // O: x += W_o · att.
        {
            if (!(MS_PROBE & 8)) ms_load_q((const uint4*)att_q, att_meta, nq / 64, xs, ms);
            __syncthreads();
            const int row0 = plan.seg[1].row0;
            item = 0;
            c = ms_consume(r, 1, c, xs, ms, item, [&](int i, float v) {
                x[row0 + i] = __ldcg(x + row0 + i) + v;
            });
            ms_stamp(trace, li, n_layers, 6);
            ms_barrier(counter, ++k);
            ms_stamp(trace, li, n_layers, 7);
        }
        // G: h = silu(gate) · up of RMSNorm(x).
        {
            const FgGamma gr = fg_gamma(FG_IN_NORM, d / 64, L.ffn_norm);
            if (!(MS_PROBE & 8)) fg_prologue<true, false>(FG_IN_NORM, d / 64, x, gr, L.ffn_norm, eps, nullptr,
                                     nullptr, xs, ms, scratch);
            __syncthreads();
            ms_stamp(trace, li, n_layers, 8);
            const int n = plan.seg[2].rows, o0 = plan.seg[2].row0;
            item = 0;
            c = ms_consume(r, 2, c, xs, ms, item, [&](int i, float v) { gsum[i] = v; });
            c = ms_consume(r, 3, c, xs, ms, item, [&](int i, float v) { gsum[n + i] = v; });
            __syncthreads();
            for (int i = threadIdx.x; i < n; i += blockDim.x) h[o0 + i] = silu_mul(gsum[i], gsum[n + i]);
            ms_stamp(trace, li, n_layers, 9);
            ms_barrier(counter, ++k);
            ms_stamp(trace, li, n_layers, 10);
        }
        // D: x += W_down · int8(h).
        {
            const FgGamma none = fg_gamma(FG_IN_F32, ffn / 64, nullptr);
            if (!(MS_PROBE & 8)) fg_prologue<true, false>(FG_IN_F32, ffn / 64, h, none, nullptr, 0.0f, nullptr,
                                     nullptr, xs, ms, scratch);
            __syncthreads();
            ms_stamp(trace, li, n_layers, 11);
            const int row0 = plan.seg[4].row0;
            item = 0;
            c = ms_consume(r, 4, c, xs, ms, item, [&](int i, float v) {
                x[row0 + i] = __ldcg(x + row0 + i) + v;
            });
            ms_stamp(trace, li, n_layers, 12);
            if (li + 1 < n_layers) ms_barrier(counter, ++k);
            ms_stamp(trace, li, n_layers, 13);
        }
    }
    pdl_launch_dependents();
    __syncthreads();
    const unsigned arrivals = MS_PROBE & 4 ? 1 : k + 1;
    if (threadIdx.x == 0 && atomicAdd(counter, 1u) == arrivals * gridDim.x - 1) {
        // Every block is past its last wait: the counters start the next step at zero.
        *counter = 0;
        if (MS_HEAD_WAIT)
            for (int h = 0; h < n_heads + 2 * n_kv; h++) heads[h] = 0;
    }
}
