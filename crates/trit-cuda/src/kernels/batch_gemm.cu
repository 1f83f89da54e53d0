// The ternary matrix product of a batched decode step: Y[t][r] (+)= W[r] · x[t] for a few token
// rows (B ≤ 64, one per sequence), the same arithmetic as the prefill GEMM (int8 mma.sync
// m16n8k32 of the weights' unsigned codes against the int8 activations, then the per-block
// correction d·(Σ code·q − Σq) scaled by the weight scale), laid out for small B.
//
// Why not the prefill GEMM: its block walks the whole row length with one barrier per 64
// columns and has rows/128 blocks per token tile, which for B ≤ 64 is 32..192 blocks on 132
// multiprocessors with one 2 KB stage in flight each: latency-bound at ~0.4 TB/s (8B shape,
// measured 15.9 ms per step at B = 1). Here a block owns a 32-row × 32-token output tile and
// its 8 warps split the row length (warp w takes 64-column blocks w, w + 8, ...), each warp
// loading its own weights straight into the mma fragments (no shared-memory staging, no
// barrier in the loop; the next block's weights are loaded while the current one is used);
// the 8 partial tiles are summed in shared memory at the end. Grid: (B / 32, rows / 32).
// Token tiles of 8 past the last token are skipped (B = 1 does one eighth of the mma work).
//
// Split-K (gridDim.z = S > 1, host: `small_split` in batch_gemm.rs): with few row tiles (8B o
// and down: 128 tiles for 132 multiprocessors) one block per multiprocessor keeps one weight
// load per warp in flight, and o + down measured 56 µs each on average at B = 32 (0.2 TB/s).
// Block z then takes the z-th of S contiguous ranges of 64-column blocks; each block writes
// its partial tile to `part`, and the last of the S blocks of a tile to arrive (a ticket per
// tile in `tickets`, reset by that block for the next launch) adds the S partials in order
// z = 0, 1, ... and writes y, so the result does not depend on which block finished first.
//
// WIDE (the `_wide` kernels): the same sums with the 64 columns of a block handed to the mma
// k-slots in another order — lane t takes columns 16t..16t+15 of every row and token, which a
// dot product over k allows as long as weights and activations agree. Each lane then loads
// one 32-bit word of codes per row (word t of the row's 16 bytes) and one 16-byte vector of
// activations per token tile, instead of 16 bytes per row and four 4-byte loads per tile.

#define SG_ROWS 32
#define SG_TOKS 32
#define SG_WARPS 8
// Blocks per multiprocessor the registers are capped for (about 100 registers uncapped: 2).
#ifndef SG_MIN_BLOCKS
#define SG_MIN_BLOCKS 2
#endif

// mma_u8s8, codes4 and a_fragments come from prefill.cu, load_scale from gemv.cu (compiled before this file).

// The mma work of one 64-column block `b` for every token tile of the block: A fragments `af`
// (2 m tiles × 2 k halves), their rows' scales `sr`, the tiles' activations and per-block
// pairs from global memory (WIDE: one 16-byte vector per lane and tile). NT > 0: exactly NT
// tiles, every tile's loads issued before the first mma (the addresses are clamped to the last
// token, so the loads need no guard; with a run-time count and a break between tiles the
// compiler cannot move a later tile's loads above the earlier tile's work, and at 32 rows
// each block waited for 4 round trips, now 1). NT = 0: `ntiles` tiles, one after the other.
template <bool WIDE, int NT = 0>
__device__ __forceinline__ void sg_tiles(const unsigned (&af)[2][2][4], const float (&sr)[2][2],
                                         int b, int tok0, int ntiles, int ntok, int nb, size_t K,
                                         const i8* __restrict__ xq,
                                         const float2* __restrict__ meta, int g, int t,
                                         float (&acc)[2][4][4]) {
    constexpr int N = NT > 0 ? NT : 4;
    unsigned bf[N][4];
    float2 m0[N], m1[N];
    auto load = [&](int ni) {
        const int tb = tok0 + ni * 8;
        // B fragment: token tb + g, bytes 4t.., 16+4t.., 32+4t.., 48+4t.. of this block.
        const unsigned* ap =
            (const unsigned*)(xq + (size_t)min(tb + g, ntok - 1) * K + (size_t)b * QBLOCK);
        if (WIDE) {
            const uint4 v = __ldg((const uint4*)ap + t);
            bf[ni][0] = v.x, bf[ni][1] = v.y, bf[ni][2] = v.z, bf[ni][3] = v.w;
        } else {
            bf[ni][0] = ap[t], bf[ni][1] = ap[4 + t], bf[ni][2] = ap[8 + t], bf[ni][3] = ap[12 + t];
        }
        // This lane's output tokens: tb + 2t and tb + 2t + 1.
        m0[ni] = meta[(size_t)min(tb + 2 * t, ntok - 1) * nb + b];
        m1[ni] = meta[(size_t)min(tb + 2 * t + 1, ntok - 1) * nb + b];
    };
    auto mma = [&](int ni) {
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            int c[4] = {0, 0, 0, 0};
            mma_u8s8(c, af[mi][0][0], af[mi][0][1], af[mi][0][2], af[mi][0][3], bf[ni][0],
                     bf[ni][1]);
            mma_u8s8(c, af[mi][1][0], af[mi][1][1], af[mi][1][2], af[mi][1][3], bf[ni][2],
                     bf[ni][3]);
            acc[mi][ni][0] += sr[mi][0] * (m0[ni].x * (float)c[0] - m0[ni].y);
            acc[mi][ni][1] += sr[mi][0] * (m1[ni].x * (float)c[1] - m1[ni].y);
            acc[mi][ni][2] += sr[mi][1] * (m0[ni].x * (float)c[2] - m0[ni].y);
            acc[mi][ni][3] += sr[mi][1] * (m1[ni].x * (float)c[3] - m1[ni].y);
        }
    };
    if constexpr (NT > 0) {
#pragma unroll
        for (int ni = 0; ni < N; ni++) load(ni);
#pragma unroll
        for (int ni = 0; ni < N; ni++) mma(ni);
    } else {
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            if (ni >= ntiles) break;
            load(ni);
            mma(ni);
        }
    }
}

// The end of a small-GEMM block: the warps' partial tiles (`acc`) summed in shared memory
// (`red`, 32 KB), split-K's partial tiles and ticket where gridDim.z > 1, then y written.
__device__ __forceinline__ void sg_finish(const float (&acc)[2][4][4], float (*red)[32][32],
                                          unsigned& ticket, int rows, int ntok, int row0,
                                          int tok0, float* __restrict__ y, int accumulate,
                                          float* __restrict__ part, unsigned* tickets) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) red[warp][(mi * 4 + ni) * 4 + c][lane] = acc[mi][ni][c];
    __syncthreads();
    const int splits = gridDim.z;
    const size_t tile = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (splits > 1) {
        // Partial tile z of this tile, then a ticket; only the last block goes on.
        float* mine = part + ((size_t)blockIdx.z * gridDim.x * gridDim.y + tile) * 1024;
        for (int o = threadIdx.x; o < 32 * 32; o += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int wi = 0; wi < SG_WARPS; wi++) s += red[wi][o >> 5][o & 31];
            mine[o] = s;
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) ticket = atomicAdd(&tickets[tile], 1u);
        __syncthreads();
        if (ticket != (unsigned)splits - 1) return;
        __threadfence();
        if (threadIdx.x == 0) tickets[tile] = 0;
    }
    // 1024 outputs, 4 per thread: accumulator k of lane l, summed over the warps (or the
    // split's partial tiles) in order.
    for (int o = threadIdx.x; o < 32 * 32; o += blockDim.x) {
        const int k = o >> 5, l = o & 31;
        const int mi = k >> 4, ni = (k >> 2) & 3, c = k & 3;
        const int r = row0 + mi * 16 + (l >> 2) + (c >= 2 ? 8 : 0);
        const int tk = tok0 + ni * 8 + 2 * (l & 3) + (c & 1);
        if (r >= rows || tk >= ntok) continue;
        float s = 0.0f;
        if (splits > 1) {
            for (int z = 0; z < splits; z++)
                s += __ldcg(part + ((size_t)z * gridDim.x * gridDim.y + tile) * 1024 + o);
        } else {
#pragma unroll
            for (int wi = 0; wi < SG_WARPS; wi++) s += red[wi][k][l];
        }
        float* out = y + (size_t)tk * rows + r;
        *out = accumulate ? *out + s : s;
    }
}

template <typename S, bool WIDE>
__device__ __forceinline__ void small_gemm(const uint4* __restrict__ codes,
                                           const S* __restrict__ scales, int rows, int nb,
                                           int ntok, const i8* __restrict__ xq,
                                           const float2* __restrict__ meta,
                                           float* __restrict__ y, int accumulate,
                                           float* __restrict__ part, unsigned* tickets) {
    // Partial tiles, [warp][accumulator][lane] (lane fastest: conflict-free both ways).
    __shared__ float red[SG_WARPS][32][32];
    __shared__ unsigned ticket;
    pdl_launch_dependents();
    const int tok0 = blockIdx.x * SG_TOKS, row0 = blockIdx.y * SG_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const size_t K = (size_t)nb * QBLOCK;
    // This block's range of 64-column blocks (all of them without split-K).
    const int kb_end = (int)((long long)nb * (blockIdx.z + 1) / gridDim.z);
    // This lane's weight rows: g, g + 8, g + 16, g + 24 of the tile (clamped on load).
    int wr[4];
#pragma unroll
    for (int i = 0; i < 4; i++) wr[i] = min(row0 + 8 * i + g, rows - 1);
    // Token tiles of 8 that hold at least one token (uniform over the block).
    const int ntiles = min(4, (ntok - tok0 + 7) / 8);
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

    uint4 w[4];
    float sc[4];
    auto load_w = [&](int b) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (WIDE) w[i].x = __ldg((const unsigned*)(codes + (size_t)wr[i] * nb + b) + t);
            else w[i] = __ldg(codes + (size_t)wr[i] * nb + b);
            sc[i] = load_scale(scales, (size_t)wr[i] * nb + b);
        }
    };
    int b = (int)((long long)nb * blockIdx.z / gridDim.z) + warp;
    if (b < kb_end) load_w(b);
    // Weights are read-only: loaded before the wait; activations only after it.
    pdl_wait();
    for (; b < kb_end; b += SG_WARPS) {
        unsigned af[2][2][4];  // [m tile][half][reg]
        float sr[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const uint4 w0 = w[2 * mi], w8 = w[2 * mi + 1];
            if (WIDE) {
                // Word t holds columns 16t..16t+15: byte j, field f = column 16t + 4f + j.
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    af[mi][h][0] = codes4(w0.x, 2 * h);
                    af[mi][h][1] = codes4(w8.x, 2 * h);
                    af[mi][h][2] = codes4(w0.x, 2 * h + 1);
                    af[mi][h][3] = codes4(w8.x, 2 * h + 1);
                }
                sr[mi][0] = sc[2 * mi];
                sr[mi][1] = sc[2 * mi + 1];
                continue;
            }
            a_fragments(w0, w8, t, af[mi]);
            sr[mi][0] = sc[2 * mi];
            sr[mi][1] = sc[2 * mi + 1];
        }
        if (b + SG_WARPS < kb_end) load_w(b + SG_WARPS);
        sg_tiles<WIDE>(af, sr, b, tok0, ntiles, ntok, nb, K, xq, meta, g, t, acc);
    }
    sg_finish(acc, red, ticket, rows, ntok, row0, tok0, y, accumulate, part, tickets);
}


// RING (the `_ring` kernels; rows of a multiple of 4 blocks, host: batch_gemm.rs): the WIDE
// arithmetic with the weights staged through shared memory. ncu of the WIDE kernel at 8 and
// 32 rows (8B shape): L1 throughput 60–75 % with DRAM at 6–19 % — each weight load reads 16
// bytes of each of 8 rows (8 cache lines per 128 bytes) and each scale load 2 bytes of each of
// 8 rows, so L1 wavefronts, not DRAM, set the pace (3 weight loads in flight per warp instead
// of one measured slower). Here a warp takes quads of 4 consecutive blocks (256 columns): each
// lane copies one 16-byte block of one row by cp.async, 4 lanes covering 64 contiguous bytes
// of a row (4 times fewer lines per byte), and one lane copies a row's 4 scales in one 8- or
// 16-byte copy; the mma fragments are then read from shared memory (conflict-free: chunk j of
// row r sits at chunk 4r + (j ^ ((r >> 1) & 3))). Each warp keeps SG_RING - 1 quads in flight
// in its own ring of SG_RING stages, with no barrier in the loop.
// (A fixed 3: the host's RING_SMEM in batch_gemm.rs is its shared-memory size.)
#define SG_RING 3
#define SG_STAGE_CODES (32 * 4 * 16)
// One stage: the codes, then 4 scales per row (f32 room).
#define SG_STAGE (SG_STAGE_CODES + 32 * 16)
// Dynamic shared memory of a ring block (batch_gemm.rs RING_SMEM), also the reduction's 32 KB.
#define SG_RING_SMEM (SG_WARPS * SG_RING * SG_STAGE)

// The scale of row r (of the tile) and block j of a ring stage.
template <typename S>
__device__ __forceinline__ float ring_scale(const unsigned char* st, int r, int j) {
    const S* sp = (const S*)(st + SG_STAGE_CODES) + 4 * r + j;
    if constexpr (sizeof(S) == 2) return h2f(*sp);
    else return *sp;
}

// NT: the block's token tiles, 1–4 (the kernel picks the instance: sg_tiles wants a constant).
template <typename S, int NT>
__device__ __forceinline__ void small_gemm_ring(const uint4* __restrict__ codes,
                                                const S* __restrict__ scales, int rows, int nb,
                                                int ntok, const i8* __restrict__ xq,
                                                const float2* __restrict__ meta,
                                                float* __restrict__ y, int accumulate,
                                                float* __restrict__ part, unsigned* tickets) {
    extern __shared__ __align__(16) unsigned char sg_smem[];
    __shared__ unsigned ticket;
    static_assert(SG_RING >= 2, "a ring of at least 2 stages");
    static_assert(SG_RING_SMEM >= SG_WARPS * 32 * 32 * 4, "the ring holds the reduction");
    pdl_launch_dependents();
    const int tok0 = blockIdx.x * SG_TOKS, row0 = blockIdx.y * SG_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const size_t K = (size_t)nb * QBLOCK;
    const int nq = nb >> 2;
    const int q_end = (int)((long long)nq * (blockIdx.z + 1) / gridDim.z);
    const int q0 = (int)((long long)nq * blockIdx.z / gridDim.z) + warp;
    const int ntiles = min(4, (ntok - tok0 + 7) / 8);
    unsigned char* ring = sg_smem + (size_t)warp * SG_RING * SG_STAGE;
    // Rows 8i + g (i = 0..3) of the tile have their chunks swizzled by sw (same for every i).
    const int sw = (g >> 1) & 3;
    // This lane's copies: block t of each quad of rows 8i + g, and the scales of row `lane`.
    const uint4* csrc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) csrc[i] = codes + (size_t)min(row0 + 8 * i + g, rows - 1) * nb + t;
    const S* ssrc = scales + (size_t)min(row0 + lane, rows - 1) * nb;
    auto issue = [&](int stage, int q) {
        unsigned char* st = ring + stage * SG_STAGE;
#pragma unroll
        for (int i = 0; i < 4; i++) cp_async16(st + ((8 * i + g) * 4 + (t ^ sw)) * 16, csrc[i] + 4 * q);
        if (sizeof(S) == 2) cp_async8(st + SG_STAGE_CODES + lane * 8, ssrc + 4 * q);
        else cp_async16(st + SG_STAGE_CODES + lane * 16, ssrc + 4 * q);
    };
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
    // Weights are read-only: the first SG_RING - 1 quads are requested before the wait. One
    // group per quad, empty past the end, so that wait_group counts quads.
#pragma unroll
    for (int k = 0; k < SG_RING - 1; k++) {
        if (q0 + k * SG_WARPS < q_end) issue(k, q0 + k * SG_WARPS);
        cp_async_commit();
    }
    pdl_wait();
    int stage = 0;
    for (int q = q0; q < q_end; q += SG_WARPS) {
        cp_async_wait_group<SG_RING - 2>();
        __syncwarp();
        // The stage read last round is free (every lane is past the barrier): refill it.
        const int qa = q + (SG_RING - 1) * SG_WARPS;
        const int sa = stage == 0 ? SG_RING - 1 : stage - 1;
        if (qa < q_end) issue(sa, qa);
        cp_async_commit();
        const unsigned char* st = ring + stage * SG_STAGE;
        // Not unrolled: 4 blocks' fragments at once do not fit beside 4 tiles' accumulators.
#pragma unroll 1
        for (int j = 0; j < 4; j++) {
            // Word t of block j of rows g, g + 8, g + 16, g + 24.
            unsigned wv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                wv[i] = *(const unsigned*)(st + ((8 * i + g) * 4 + (j ^ sw)) * 16 + 4 * t);
            unsigned af[2][2][4];
            float sr[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    af[mi][h][0] = codes4(wv[2 * mi], 2 * h);
                    af[mi][h][1] = codes4(wv[2 * mi + 1], 2 * h);
                    af[mi][h][2] = codes4(wv[2 * mi], 2 * h + 1);
                    af[mi][h][3] = codes4(wv[2 * mi + 1], 2 * h + 1);
                }
                // Scales read per block, not held for the quad (registers).
                sr[mi][0] = ring_scale<S>(st, 16 * mi + g, j);
                sr[mi][1] = ring_scale<S>(st, 16 * mi + 8 + g, j);
            }
            sg_tiles<true, NT>(af, sr, 4 * q + j, tok0, ntiles, ntok, nb,
                                                K, xq, meta, g, t, acc);
        }
        stage = stage == SG_RING - 1 ? 0 : stage + 1;
    }
    // Every warp's copies have landed (the trailing groups are empty) and every warp is done
    // with its ring before the reduction reuses the memory.
    cp_async_wait_all();
    __syncthreads();
    sg_finish(acc, (float(*)[32][32])sg_smem, ticket, rows, ntok, row0, tok0, y, accumulate,
              part, tickets);
}

#define SMALL_GEMM(NAME, S, WIDE)                                                              \
    extern "C" __global__ void __launch_bounds__(SG_WARPS * 32, SG_MIN_BLOCKS)                 \
        NAME(const uint4* codes, const S* scales, int rows, int nb, int ntok, const i8* xq,     \
             const float2* meta, float* y, int accumulate, float* part, unsigned* tickets) {    \
        small_gemm<S, WIDE>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate, part,      \
                            tickets);                                                          \
    }
SMALL_GEMM(ternary_gemm_small_f16, half_bits, false)
SMALL_GEMM(ternary_gemm_small_f32, float, false)
SMALL_GEMM(ternary_gemm_small_wide_f16, half_bits, true)
SMALL_GEMM(ternary_gemm_small_wide_f32, float, true)

#define SMALL_GEMM_RING(NAME, S)                                                                \
    extern "C" __global__ void __launch_bounds__(SG_WARPS * 32, SG_MIN_BLOCKS)                 \
        NAME(const uint4* codes, const S* scales, int rows, int nb, int ntok, const i8* xq,     \
             const float2* meta, float* y, int accumulate, float* part, unsigned* tickets) {    \
        const int nt = min(4, (ntok - (int)blockIdx.x * SG_TOKS + 7) / 8);                      \
        if (nt == 1)                                                                            \
            small_gemm_ring<S, 1>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate, part, \
                                  tickets);                                                     \
        else if (nt == 2)                                                                       \
            small_gemm_ring<S, 2>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate, part, \
                                  tickets);                                                     \
        else if (nt == 3)                                                                       \
            small_gemm_ring<S, 3>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate, part, \
                                  tickets);                                                     \
        else                                                                                    \
            small_gemm_ring<S, 4>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate, part, \
                                  tickets);                                                     \
    }
SMALL_GEMM_RING(ternary_gemm_small_ring_f16, half_bits)
SMALL_GEMM_RING(ternary_gemm_small_ring_f32, float)
