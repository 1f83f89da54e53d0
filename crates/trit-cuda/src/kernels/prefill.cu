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
// tokens (2 × 4 mma tiles). Per 64-column block the block stages the 128 rows' words and
// scales and the 64 tokens' int8 values and (d, d·Σq) in shared memory (double-buffered, the
// next block's loads in flight while the current one is multiplied). Rows and tokens past the
// ends are clamped on load and skipped on store.

#define GM_ROWS 128
#define GM_TOKS 64
#define GM_THREADS 256
// Bytes per token row of the staged activations: 64 + 16 of padding, so the 8 tokens one mma
// reads fall in distinct banks.
#define GM_ASTRIDE 80

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

template <typename S>
__device__ __forceinline__ void ternary_gemm(const uint4* __restrict__ codes,
                                             const S* __restrict__ scales, int rows, int nb,
                                             int ntok, const i8* __restrict__ xq,
                                             const float2* __restrict__ meta,
                                             float* __restrict__ y, int accumulate) {
    __shared__ uint4 sw[2][GM_ROWS];
    __shared__ float ss[2][GM_ROWS];
    __shared__ float2 sm[2][GM_TOKS];
    __shared__ __align__(16) unsigned char sa[2][GM_TOKS * GM_ASTRIDE];
    pdl_launch_dependents();
    pdl_wait();
    const int tok0 = blockIdx.x * GM_TOKS, row0 = blockIdx.y * GM_ROWS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const size_t K = (size_t)nb * QBLOCK;

    // This thread's share of each stage: weights of row tid (tid < 128) or the meta of token
    // tid - 128 (128 <= tid < 192); and 16 activation bytes: token tid/4, part tid%4.
    const int lrow = min(row0 + tid, rows - 1);
    const int ltok = min(tok0 + (tid - GM_ROWS), ntok - 1);
    const int atok = tid >> 2, apart = tid & 3;
    const uint4* arow = (const uint4*)(xq + (size_t)min(tok0 + atok, ntok - 1) * K) + apart;
    uint4 pw = make_uint4(0, 0, 0, 0), pa;
    float ps = 0.0f;
    float2 pm = make_float2(0.0f, 0.0f);
    auto load = [&](int b) {
        if (tid < GM_ROWS) {
            pw = __ldg(codes + (size_t)lrow * nb + b);
            ps = load_scale(scales, (size_t)lrow * nb + b);
        } else if (tid < GM_ROWS + GM_TOKS) {
            pm = __ldg(meta + (size_t)ltok * nb + b);
        }
        pa = __ldg(arow + 4 * b);
    };
    auto store = [&](int buf) {
        if (tid < GM_ROWS) {
            sw[buf][tid] = pw;
            ss[buf][tid] = ps;
        } else if (tid < GM_ROWS + GM_TOKS) {
            sm[buf][tid - GM_ROWS] = pm;
        }
        *(uint4*)(sa[buf] + atok * GM_ASTRIDE + apart * 16) = pa;
    };

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

    load(0);
    store(0);
    __syncthreads();
    for (int b = 0; b < nb; b++) {
        const int buf = b & 1;
        if (b + 1 < nb) load(b + 1);
        unsigned af[2][2][4];  // [m tile][half][reg]
        float sr[2][2];        // [m tile][row g / g+8] weight scale
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int r = wm * 32 + mi * 16 + g;
            const uint4 w0 = sw[buf][r], w8 = sw[buf][r + 8];
            af[mi][0][0] = codes4(w0.x, t);
            af[mi][0][1] = codes4(w8.x, t);
            af[mi][0][2] = codes4(w0.y, t);
            af[mi][0][3] = codes4(w8.y, t);
            af[mi][1][0] = codes4(w0.z, t);
            af[mi][1][1] = codes4(w8.z, t);
            af[mi][1][2] = codes4(w0.w, t);
            af[mi][1][3] = codes4(w8.w, t);
            sr[mi][0] = ss[buf][r];
            sr[mi][1] = ss[buf][r + 8];
        }
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const int tl = wn * 32 + ni * 8;
            const unsigned* ap = (const unsigned*)(sa[buf] + (tl + g) * GM_ASTRIDE);
            const unsigned b00 = ap[t], b01 = ap[4 + t], b10 = ap[8 + t], b11 = ap[12 + t];
            // This lane's output tokens: tl + 2t and tl + 2t + 1.
            const float2 m0 = sm[buf][tl + 2 * t], m1 = sm[buf][tl + 2 * t + 1];
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
        if (b + 1 < nb) store(buf ^ 1);
        __syncthreads();
    }
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
    ternary_gemm<half_bits>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}
extern "C" __global__ void __launch_bounds__(GM_THREADS)
ternary_gemm_f32(const uint4* codes, const float* scales, int rows, int nb, int ntok,
                 const i8* xq, const float2* meta, float* y, int accumulate) {
    ternary_gemm<float>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}

// ternary_gemm2: the same product and the same float steps per element as ternary_gemm, with
// a deeper pipeline. ternary_gemm waits on its global loads once per 64-column block (one
// block of look-ahead, a barrier per block), so a multiprocessor idles for most of each load's
// latency. Here a stage is G2_KS blocks, copied with cp.async straight into shared memory
// G2_STAGES - 1 stages ahead of the one being multiplied, one barrier per stage. Weight scales
// (2 or 4 bytes, too small for cp.async) go through registers one stage ahead. Same tile:
// 128 rows × 64 tokens per block of 8 warps, warp (wm, wn) 32 rows × 32 tokens.
#define G2_KS 2
#define G2_STAGES 3
// Bytes per token row of a stage's activations: G2_KS × 64 + 16 of padding, so the 8 tokens
// one mma reads (row stride 36 words) fall in distinct banks.
#define G2_ASTRIDE (G2_KS * QBLOCK + 16)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::); }
// All but the newest `G2_STAGES - 2` committed groups have landed.
__device__ __forceinline__ void cp_async_wait_stage() {
    asm volatile("cp.async.wait_group %0;" ::"n"(G2_STAGES - 2));
}

template <typename S>
__device__ __forceinline__ void ternary_gemm2(const uint4* __restrict__ codes,
                                              const S* __restrict__ scales, int rows, int nb,
                                              int ntok, const i8* __restrict__ xq,
                                              const float2* __restrict__ meta,
                                              float* __restrict__ y, int accumulate) {
    __shared__ uint4 sw[G2_STAGES][G2_KS][GM_ROWS];
    __shared__ float ss[G2_STAGES][G2_KS][GM_ROWS];
    __shared__ float2 sm[G2_STAGES][G2_KS][GM_TOKS];
    __shared__ __align__(16) unsigned char sa[G2_STAGES][GM_TOKS * G2_ASTRIDE];
    pdl_launch_dependents();
    pdl_wait();
    const int tok0 = blockIdx.x * GM_TOKS, row0 = blockIdx.y * GM_ROWS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const size_t K = (size_t)nb * QBLOCK;
    const int nst = (nb + G2_KS - 1) / G2_KS;

    // Copies of one stage: weights (row, block) = (tid / G2_KS, tid % G2_KS) while
    // tid < 128·G2_KS; activations in 16-byte pieces, token p / (4·G2_KS); meta (token,
    // block) for tid < 64·G2_KS. Rows and tokens past the ends are clamped (never stored).
    auto issue = [&](int st) {
        const int buf = st % G2_STAGES, b0 = st * G2_KS;
        if (tid < GM_ROWS * G2_KS) {
            const int r = tid / G2_KS, kb = tid % G2_KS;
            if (b0 + kb < nb)
                cp_async16(&sw[buf][kb][r], codes + (size_t)min(row0 + r, rows - 1) * nb + b0 + kb);
        }
        for (int p = tid; p < GM_TOKS * G2_KS * 4; p += GM_THREADS) {
            const int tk = p / (G2_KS * 4), kb = (p / 4) % G2_KS, piece = p % 4;
            if (b0 + kb < nb)
                cp_async16(sa[buf] + tk * G2_ASTRIDE + kb * QBLOCK + piece * 16,
                           xq + (size_t)min(tok0 + tk, ntok - 1) * K + (size_t)(b0 + kb) * QBLOCK +
                               piece * 16);
        }
        if (tid < GM_TOKS * G2_KS) {
            const int tk = tid / G2_KS, kb = tid % G2_KS;
            if (b0 + kb < nb)
                cp_async8(&sm[buf][kb][tk], meta + (size_t)min(tok0 + tk, ntok - 1) * nb + b0 + kb);
        }
        cp_async_commit();
    };
    // Weight scales of row tid (tid < 128), one stage ahead in registers.
    float psc[G2_KS];
    auto load_scales = [&](int st) {
        if (tid < GM_ROWS) {
            const size_t base = (size_t)min(row0 + tid, rows - 1) * nb;
#pragma unroll
            for (int kb = 0; kb < G2_KS; kb++) {
                const int b = st * G2_KS + kb;
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
    for (int st = 0; st < G2_STAGES - 1; st++) {
        if (st < nst) issue(st);
        else cp_async_commit();  // empty group: keeps the count of groups per stage fixed
    }
    load_scales(0);
    for (int st = 0; st < nst; st++) {
        const int buf = st % G2_STAGES;
        // ss[buf] was last read in stage st - G2_STAGES, before the last two barriers.
        if (tid < GM_ROWS) {
#pragma unroll
            for (int kb = 0; kb < G2_KS; kb++) ss[buf][kb][tid] = psc[kb];
        }
        cp_async_wait_stage();
        __syncthreads();
        if (st + 1 < nst) load_scales(st + 1);
        // The buffer of stage st + G2_STAGES - 1 was read in stage st - 1, finished by every
        // thread at the barrier above.
        if (st + G2_STAGES - 1 < nst) issue(st + G2_STAGES - 1);
        else cp_async_commit();
#pragma unroll
        for (int kb = 0; kb < G2_KS; kb++) {
            if (st * G2_KS + kb >= nb) break;
            unsigned af[2][2][4];
            float sr[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int r = wm * 32 + mi * 16 + g;
                const uint4 w0 = sw[buf][kb][r], w8 = sw[buf][kb][r + 8];
                af[mi][0][0] = codes4(w0.x, t);
                af[mi][0][1] = codes4(w8.x, t);
                af[mi][0][2] = codes4(w0.y, t);
                af[mi][0][3] = codes4(w8.y, t);
                af[mi][1][0] = codes4(w0.z, t);
                af[mi][1][1] = codes4(w8.z, t);
                af[mi][1][2] = codes4(w0.w, t);
                af[mi][1][3] = codes4(w8.w, t);
                sr[mi][0] = ss[buf][kb][r];
                sr[mi][1] = ss[buf][kb][r + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int tl = wn * 32 + ni * 8;
                const unsigned* ap =
                    (const unsigned*)(sa[buf] + (tl + g) * G2_ASTRIDE + kb * QBLOCK);
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
ternary_gemm2_f16(const uint4* codes, const half_bits* scales, int rows, int nb, int ntok,
                  const i8* xq, const float2* meta, float* y, int accumulate) {
    ternary_gemm2<half_bits>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}
extern "C" __global__ void __launch_bounds__(GM_THREADS)
ternary_gemm2_f32(const uint4* codes, const float* scales, int rows, int nb, int ntok,
                  const i8* xq, const float2* meta, float* y, int accumulate) {
    ternary_gemm2<float>(codes, scales, rows, nb, ntok, xq, meta, y, accumulate);
}

// QK-norm + RoPE of T tokens at positions pos..pos+T-1 (pos = step[0]), one block per (head,
// token): blocks of q heads write the rotated, pre-scaled q to qr[t][h][hd]; blocks of kv heads
// append the rotated k and the v to the f16 cache at position pos + t.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
rope_append_batch(const float* __restrict__ qkv, const float* q_norm, const float* k_norm,
                  float eps, const float2* __restrict__ cos_sin, const int* step, int n_heads,
                  int n_kv, int hd, int adjacent, half_bits* kc, half_bits* vc, int ctx,
                  float scale, float* qr) {
    __shared__ float scratch[32];
    __shared__ float tmp[MAX_HD], out[MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, tk = blockIdx.y, pos = step[0] + tk;
    const int width = (n_heads + 2 * n_kv) * hd;
    const float* row = qkv + (size_t)tk * width;
    const float2* cs = cos_sin + (size_t)pos * (hd / 2);
    if (h < n_heads) {
        norm_rope(row + (size_t)h * hd, q_norm, eps, cs, hd, adjacent, scale, tmp, out, scratch);
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            qr[((size_t)tk * n_heads + h) * hd + i] = out[i];
        return;
    }
    const int kvh = h - n_heads;
    norm_rope(row + (size_t)(n_heads + kvh) * hd, k_norm, eps, cs, hd, adjacent, 1.0f, tmp, out,
              scratch);
    const float* v = row + (size_t)(n_heads + n_kv + kvh) * hd;
    const size_t at = ((size_t)kvh * ctx + pos) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        kc[at + i] = f2h(out[i]);
        vc[at + i] = f2h(v[i]);
    }
}

// Causal attention of T query tokens over the cache (positions 0..pos+t for token t). Block
// (h, tile) takes q head h for ATT_QT consecutive tokens: each warp walks every fourth key
// position once for all ATT_QT queries (a key is read once per tile, not once per query),
// keeping an online softmax per query; the warps' partials are merged in shared memory. The
// output goes to att[t][h][hd] (f32; the caller quantizes it).
#define ATT_QT 8

template <int E>
__device__ __forceinline__ void attn_prefill(const float* __restrict__ qr,
                                             const half_bits* __restrict__ kc,
                                             const half_bits* __restrict__ vc, const int* step,
                                             int ntok, int n_heads, int n_kv, int ctx,
                                             float* __restrict__ att) {
    __shared__ float sm_m[ATT_WARPS][ATT_QT], sm_l[ATT_WARPS][ATT_QT];
    __shared__ float sm_o[ATT_WARPS][MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, t0 = blockIdx.y * ATT_QT;
    const int nq = min(ATT_QT, ntok - t0);
    const int pos0 = step[0] + t0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = 32 * E;
    const int kvh = h / (n_heads / n_kv);
    const size_t kv_row = (size_t)kvh * ctx * hd;
    float qv[ATT_QT][E], acc[ATT_QT][E], m[ATT_QT], l[ATT_QT];
#pragma unroll
    for (int i = 0; i < ATT_QT; i++) {
        const int ti = t0 + min(i, nq - 1);
        const float* q = qr + ((size_t)ti * n_heads + h) * hd + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) {
            qv[i][e] = q[e];
            acc[i][e] = 0.0f;
        }
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    const int end = pos0 + nq;  // keys 0..end-1; query i sees keys 0..pos0+i
    for (int p = warp; p < end; p += ATT_WARPS) {
        float kk[E], vv[E];
        const half_bits* kp = kc + kv_row + (size_t)p * hd + lane * E;
        const half_bits* vp = vc + kv_row + (size_t)p * hd + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) {
            kk[e] = h2f(kp[e]);
            vv[e] = h2f(vp[e]);
        }
#pragma unroll
        for (int i = 0; i < ATT_QT; i++) {
            if (i >= nq || p > pos0 + i) continue;  // uniform over the warp
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) dot += qv[i][e] * kk[e];
            dot = warp_sum(dot);
            const float mn = fmaxf(m[i], dot);
            const float corr = expf(m[i] - mn), pe = expf(dot - mn);
            l[i] = l[i] * corr + pe;
#pragma unroll
            for (int e = 0; e < E; e++) acc[i][e] = acc[i][e] * corr + pe * vv[e];
            m[i] = mn;
        }
    }
    // Merge the warps' partials, one query at a time.
#pragma unroll
    for (int i = 0; i < ATT_QT; i++) {
        if (i >= nq) break;
        __syncthreads();
        if (lane == 0) {
            sm_m[warp][i] = m[i];
            sm_l[warp][i] = l[i];
        }
#pragma unroll
        for (int e = 0; e < E; e++) sm_o[warp][lane * E + e] = acc[i][e];
        __syncthreads();
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w][i]);
        float L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm_m[w][i] > -INFINITY) L += sm_l[w][i] * expf(sm_m[w][i] - M);
        for (int k = threadIdx.x; k < hd; k += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++)
                if (sm_m[w][i] > -INFINITY) o += sm_o[w][k] * expf(sm_m[w][i] - M);
            att[((size_t)(t0 + i) * n_heads + h) * hd + k] = o / L;
        }
    }
}

// One kernel per head size (E = head_dim / 32 values per lane), so the per-query registers
// are exactly sized.
#define ATTN_PREFILL(E)                                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                 \
        attn_prefill_e##E(const float* qr, const half_bits* kc, const half_bits* vc,          \
                          const int* step, int ntok, int n_heads, int n_kv, int ctx,          \
                          float* att) {                                                       \
        attn_prefill<E>(qr, kc, vc, step, ntok, n_heads, n_kv, ctx, att);                     \
    }
ATTN_PREFILL(1)
ATTN_PREFILL(2)
ATTN_PREFILL(3)
ATTN_PREFILL(4)
ATTN_PREFILL(5)
ATTN_PREFILL(6)
ATTN_PREFILL(7)
ATTN_PREFILL(8)
