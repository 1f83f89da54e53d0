// Kernels of a batched prefill: T prompt tokens per launch.
//
// ternary_gemm: Y[t][r] (+)= Σ_b s[r][b] · (d[t][b] · Σ_k code[r][64b+k] · q[t][64b+k] − d[t][b]·Σq)
// with int8 tensor cores: mma.sync m16n8k32 with the weights' unsigned codes (t + 1 ∈ {0,1,2})
// as A (u8) and the activations as B (s8), the same integer the GEMV's dp4a computes, and the
// same per-block correction, so it equals `repack::gemv_reference` token by token.
//
// The 2-bit layout (gemv.cu) maps straight onto the A fragment: for a 32-column half h of a
// 64-column block, a lane (group g = lane/4, t = lane%4) holds row g and g+8, columns
// 32h + 4t .. +3 and 32h + 16 + 4t .. +3; those are bytes of `(word >> 2t) & 0x03030303` of
// words 2h and 2h + 1 of the row's block. So weights stay packed in shared memory (16 bytes per
// row and block) and are unpacked by a shift and a mask in registers.
//
// Tile: a block of 8 warps computes 128 rows × 64 tokens; warp (wm, wn) its 32 rows × 32
// tokens (2 × 4 mma tiles). The columns stream through shared memory in stages of KS = 2
// blocks: the rows' words, the tokens' int8 values and (d, d·Σq) are copied with cp.async
// STAGES - 1 = 2 stages ahead of the one being multiplied, one barrier per stage. (The first
// version staged one block at a time through registers, one block ahead with a barrier per
// block: 9,780 vs 10,410 t/s pp512 on the 8B shape, H200.) Weight scales (2 or 4 bytes, too
// small for cp.async) go through registers one stage ahead. Rows and tokens past the ends are
// clamped on load and skipped on store; blocks past the end of a row skip the stage's work.
//
// Each output is converted and scaled once per 64-column block (I2F and two FFMA): that
// epilogue, not the tensor cores, is most of the issue slots. Replacing I2F by an integer add
// and an FP32 subtraction (exact for |c| < 2^22) measured 3 % slower; capping registers for
// three resident blocks per multiprocessor instead of two (a few spills) 20 % slower.

#define GM_ROWS 128
#define GM_TOKS 64
#define GM_THREADS 256

__device__ __forceinline__ void mma_u8s8(int (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ unsigned codes4(unsigned w, int t) { return (w >> (2 * t)) & 0x03030303u; }

// The A operands of one m16 × k64 tile for lane-in-group t: rows g (words w0) and g + 8 (w8),
// k halves 0–31 (words x, y) and 32–63 (z, w).
__device__ __forceinline__ void a_fragments(const uint4& w0, const uint4& w8, int t,
                                            unsigned (&a)[2][4]) {
    a[0][0] = codes4(w0.x, t);
    a[0][1] = codes4(w8.x, t);
    a[0][2] = codes4(w0.y, t);
    a[0][3] = codes4(w8.y, t);
    a[1][0] = codes4(w0.z, t);
    a[1][1] = codes4(w8.z, t);
    a[1][2] = codes4(w0.w, t);
    a[1][3] = codes4(w8.w, t);
}

// (cp.async helpers: common.cuh.)
template <typename S, int KS, int STAGES>
__device__ __forceinline__ void ternary_gemm(const uint4* __restrict__ codes,
                                              const S* __restrict__ scales, int rows, int nb,
                                              int ntok, const i8* __restrict__ xq,
                                              const float2* __restrict__ meta,
                                              float* __restrict__ y, int accumulate) {
    __shared__ uint4 sw[STAGES][KS][GM_ROWS];
    __shared__ float ss[STAGES][KS][GM_ROWS];
    __shared__ float2 sm[STAGES][KS][GM_TOKS];
    // Bytes per token row of a stage's activations: KS × 64 + 16 of padding, so the 8 tokens
    // one mma reads (row stride 36 words) fall in distinct banks.
    constexpr int ASTRIDE = KS * QBLOCK + 16;
    __shared__ __align__(16) unsigned char sa[STAGES][GM_TOKS * ASTRIDE];
    pdl_launch_dependents();
    pdl_wait();
    const int tok0 = blockIdx.x * GM_TOKS, row0 = blockIdx.y * GM_ROWS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const size_t K = (size_t)nb * QBLOCK;
    const int nst = (nb + KS - 1) / KS;

    // Copies of one stage: weights (row, block) = (tid / KS, tid % KS) for tid < 128·KS;
    // activations in 16-byte pieces p = tid + 256·i (token p / (4·KS), block (p / 4) % KS);
    // meta (token, block) = (tid / KS, tid % KS) for tid < 64·KS. Sources and destinations
    // are fixed per thread up to the stage's offset, so they are computed once here; rows and
    // tokens past the ends are clamped (loaded, never stored).
    constexpr int APIECES = GM_TOKS * KS * 4 / GM_THREADS;
    static_assert(GM_TOKS * KS * 4 % GM_THREADS == 0, "whole activation pieces per thread");
    const int wkb = tid % KS;
    const bool wcopy = tid < GM_ROWS * KS, mcopy = tid < GM_TOKS * KS;
    const uint4* wsrc = codes + (size_t)min(row0 + tid / KS, rows - 1) * nb + wkb;
    const float2* msrc = meta + (size_t)min(tok0 + tid / KS, ntok - 1) * nb + wkb;
    const i8* asrc[APIECES];
    int adst[APIECES], akb[APIECES];
#pragma unroll
    for (int i = 0; i < APIECES; i++) {
        const int p = tid + GM_THREADS * i, tk = p / (KS * 4);
        akb[i] = (p / 4) % KS;
        adst[i] = tk * ASTRIDE + akb[i] * QBLOCK + (p % 4) * 16;
        asrc[i] = xq + (size_t)min(tok0 + tk, ntok - 1) * K + akb[i] * QBLOCK + (p % 4) * 16;
    }
    auto issue = [&](int st) {
        const int buf = st % STAGES, b0 = st * KS;
        // Every block of the stage exists except, at most, in the last stage.
        const bool full = b0 + KS <= nb;
        if (wcopy && (full || b0 + wkb < nb))
            cp_async16(&sw[buf][wkb][tid / KS], wsrc + b0);
#pragma unroll
        for (int i = 0; i < APIECES; i++)
            if (full || b0 + akb[i] < nb)
                cp_async16(sa[buf] + adst[i], asrc[i] + (size_t)b0 * QBLOCK);
        if (mcopy && (full || b0 + wkb < nb)) cp_async8(&sm[buf][wkb][tid / KS], msrc + b0);
        cp_async_commit();
    };
    // Weight scales of row tid (tid < 128), one stage ahead in registers.
    float psc[KS];
    auto load_scales = [&](int st) {
        if (tid < GM_ROWS) {
            const size_t base = (size_t)min(row0 + tid, rows - 1) * nb;
#pragma unroll
            for (int kb = 0; kb < KS; kb++) {
                const int b = st * KS + kb;
                psc[kb] = b < nb ? load_scale(scales, base + b) : 0.0f;
            }
        }
    };

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nst) issue(st);
        else cp_async_commit();  // empty group: keeps the count of groups per stage fixed
    }
    load_scales(0);
    for (int st = 0; st < nst; st++) {
        const int buf = st % STAGES;
        // ss[buf] was last read in stage st - STAGES, before the barriers of the stages since.
        if (tid < GM_ROWS) {
#pragma unroll
            for (int kb = 0; kb < KS; kb++) ss[buf][kb][tid] = psc[kb];
        }
        cp_async_wait_group<STAGES - 2>();
        __syncthreads();
        if (st + 1 < nst) load_scales(st + 1);
        // The buffer of stage st + STAGES - 1 was read in stage st - 1, finished by every
        // thread at the barrier above.
        if (st + STAGES - 1 < nst) issue(st + STAGES - 1);
        else cp_async_commit();
#pragma unroll
        for (int kb = 0; kb < KS; kb++) {
            if (st * KS + kb >= nb) break;
            unsigned af[2][2][4];
            float sr[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int r = wm * 32 + mi * 16 + g;
                const uint4 w0 = sw[buf][kb][r], w8 = sw[buf][kb][r + 8];
                a_fragments(w0, w8, t, af[mi]);
                sr[mi][0] = ss[buf][kb][r];
                sr[mi][1] = ss[buf][kb][r + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int tl = wn * 32 + ni * 8;
                const unsigned* ap =
                    (const unsigned*)(sa[buf] + (tl + g) * ASTRIDE + kb * QBLOCK);
                const unsigned b00 = ap[t], b01 = ap[4 + t], b10 = ap[8 + t], b11 = ap[12 + t];
                const float2 m0 = sm[buf][kb][tl + 2 * t], m1 = sm[buf][kb][tl + 2 * t + 1];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    int c[4] = {0, 0, 0, 0};
                    mma_u8s8(c, af[mi][0][0], af[mi][0][1], af[mi][0][2], af[mi][0][3], b00, b01);
                    mma_u8s8(c, af[mi][1][0], af[mi][1][1], af[mi][1][2], af[mi][1][3], b10, b11);
                    acc[mi][ni][0] += sr[mi][0] * (m0.x * (float)c[0] - m0.y);
                    acc[mi][ni][1] += sr[mi][0] * (m1.x * (float)c[1] - m1.y);
                    acc[mi][ni][2] += sr[mi][1] * (m0.x * (float)c[2] - m0.y);
                    acc[mi][ni][3] += sr[mi][1] * (m1.x * (float)c[3] - m1.y);
                }
            }
        }
    }
    cp_async_wait_all();
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = row0 + wm * 32 + mi * 16 + g + (c >= 2 ? 8 : 0);
                const int tk = tok0 + wn * 32 + ni * 8 + 2 * t + (c & 1);
                if (r < rows && tk < ntok) {
                    float* o = y + (size_t)tk * rows + r;
                    *o = accumulate ? *o + acc[mi][ni][c] : acc[mi][ni][c];
                }
            }
}

extern "C" __global__ void __launch_bounds__(GM_THREADS)
ternary_gemm_f16(const uint4* codes, const half_bits* scales, int rows, int nb, int ntok,
                 const i8* xq, const float2* meta, float* y, int accumulate) {
    ternary_gemm<half_bits, 2, 3>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}
extern "C" __global__ void __launch_bounds__(GM_THREADS)
ternary_gemm_f32(const uint4* codes, const float* scales, int rows, int nb, int ntok,
                 const i8* xq, const float2* meta, float* y, int accumulate) {
    ternary_gemm<float, 2, 3>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}
// QK-norm + RoPE of T tokens at positions pos..pos+T-1 (pos = step[0]); one warp per (head,
// token), four heads per block, block (x, t) = heads 4x..4x+3 of token t: warps of q heads
// write the rotated, pre-scaled q to qr[t][h][hd]; warps of kv heads append the rotated k and
// the v to the f16 cache at position pos + t. Each lane holds whole rotation pairs (j, j +
// hd/2), or (2j, 2j + 1) with `adjacent`, for j = lane, lane + 32, ..., so the norm is one warp
// sum and the rotation needs no shared memory. (The first version used a 128-thread block per
// head and token, three barriers each: 27.6 µs per 8B layer at pp512.)
#define ROPE_MAX_PAIRS (MAX_HD / 64)
extern "C" __global__ void __launch_bounds__(128)
rope_append_batch(const float* __restrict__ qkv, const float* q_norm, const float* k_norm,
                  float eps, const float2* __restrict__ cos_sin, const int* step, int n_heads,
                  int n_kv, int hd, int adjacent, half_bits* kc, half_bits* vc, int ctx,
                  float scale, float* qr) {
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int h = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (h >= n_heads + n_kv) return;  // no barrier below: whole warps leave
    const int tk = blockIdx.y, pos = step[0] + tk, half = hd / 2;
    const float* row = qkv + (size_t)tk * (n_heads + 2 * n_kv) * hd;
    const float* src = row + (size_t)h * hd;  // k head kvh is head n_heads + kvh of the row
    const float2* cs = cos_sin + (size_t)pos * half;
    const bool is_q = h < n_heads;
    const float* norm = is_q ? q_norm : k_norm;
    float a[ROPE_MAX_PAIRS], b[ROPE_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < ROPE_MAX_PAIRS; i++) {
        const int j = lane + 32 * i;
        a[i] = b[i] = 0.0f;
        if (j < half) {
            a[i] = src[adjacent ? 2 * j : j];
            b[i] = src[adjacent ? 2 * j + 1 : j + half];
            ss += a[i] * a[i] + b[i] * b[i];
        }
    }
    ss = warp_sum(ss);
    const float inv = norm != nullptr ? 1.0f / sqrtf(ss / (float)hd + eps) : 1.0f;
    const float sc = is_q ? scale : 1.0f;
    const int kvh = h - n_heads;
    const size_t at = ((size_t)kvh * ctx + pos) * hd;
    float* qdst = qr + ((size_t)tk * n_heads + h) * hd;
#pragma unroll
    for (int i = 0; i < ROPE_MAX_PAIRS; i++) {
        const int j = lane + 32 * i;
        if (j >= half) break;
        const int i0 = adjacent ? 2 * j : j, i1 = adjacent ? 2 * j + 1 : j + half;
        float x0 = a[i], x1 = b[i];
        if (norm != nullptr) {
            x0 *= inv * norm[i0];
            x1 *= inv * norm[i1];
        }
        const float2 c = cs[j];
        const float r0 = sc * (x0 * c.x - x1 * c.y), r1 = sc * (x0 * c.y + x1 * c.x);
        if (is_q) {
            qdst[i0] = r0;
            qdst[i1] = r1;
        } else {
            kc[at + i0] = f2h(r0);
            kc[at + i1] = f2h(r1);
        }
    }
    if (!is_q) {
        const float* v = row + (size_t)(n_heads + n_kv + kvh) * hd;
        for (int i = lane; i < hd; i += 32) vc[at + i] = f2h(v[i]);
    }
}

