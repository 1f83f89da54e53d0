// Causal attention of a prefill chunk on the tensor cores (flash-attention style).
//
// One block of 4 warps takes 64 query tokens of one head; warp w its 16 rows. Keys and values
// stream through shared memory in tiles of BC positions (cp.async, double-buffered); per tile
// S = Q·Kᵀ and O += P·V are mma.sync m16n8k16 with f16 inputs and f32 accumulators, and the
// softmax is online (running max and sum per row, in the log2 domain). Q comes pre-scaled by
// 1/√hd from rope_append_batch, K and V from the f16 cache, P is rounded to f16 for the second
// product — noise far below the int8 quantization the output gets next.
//
// Fragment layouts (PTX ISA, m16n8k16 .f16): lane = 4g + t holds A rows g and g + 8, columns
// 2t, 2t + 1 and 2t + 8, 2t + 9; B columns g, rows 2t, 2t + 1 and 2t + 8, 2t + 9; C rows g and
// g + 8, columns 2t, 2t + 1. S's C fragments are exactly P's A fragments (two key n-tiles per
// 16-key chunk); V's B fragments come from `ldmatrix.trans` of the row-major tile.
// (cp.async helpers: prefill.cu, compiled before this file.)

#define FA_WARPS 4
#define FA_Q (16 * FA_WARPS)
#define FA_LOG2E 1.4426950408889634f

// Two floats to one f16x2 register: `lo` in the low half (the lower column index).
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2,
                                              unsigned& r3, const void* p) {
#if __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
#endif
}

template <int E>
__device__ __forceinline__ void flash_prefill(const float* __restrict__ qr,
                                              const half_bits* __restrict__ kc,
                                              const half_bits* __restrict__ vc, const int* step,
                                              int ntok, int n_heads, int n_kv, int ctx,
                                              float* __restrict__ att, i8* __restrict__ xq,
                                              float2* __restrict__ xm, int quant) {
    constexpr int HD = 32 * E;
    constexpr int KCH = HD / 16;               // k-chunks of Q·Kᵀ
    constexpr int NT = HD / 8;                 // output n-tiles
    constexpr int BC = E <= 4 ? 32 : 16;       // keys per tile (shared memory under 48 KB)
    constexpr int STRIDE = HD + 8;             // halves per staged row: 16 bytes of padding
    constexpr int CH = HD / 8;                 // 16-byte pieces per row
    __shared__ __align__(16) half_bits sk[2][BC * STRIDE];
    __shared__ __align__(16) half_bits sv[2][BC * STRIDE];
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, t0 = blockIdx.y * FA_Q;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nq = min(FA_Q, ntok - t0);
    const int base = step[0] + t0;             // position of the block's first query
    const int end = base + nq;                 // keys 0..end-1
    const int kvh = h / (n_heads / n_kv);
    const half_bits* kbase = kc + (size_t)kvh * ctx * HD;
    const half_bits* vbase = vc + (size_t)kvh * ctx * HD;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int qpos0 = base + r0, qpos1 = base + r1;
    const int warp_last = base + warp * 16 + 15;  // the warp's last query position

    unsigned qa[KCH][4];
    {
        const float* q0 = qr + ((size_t)(t0 + min(r0, nq - 1)) * n_heads + h) * HD;
        const float* q1 = qr + ((size_t)(t0 + min(r1, nq - 1)) * n_heads + h) * HD;
#pragma unroll
        for (int k = 0; k < KCH; k++) {
            const float2 a = *(const float2*)(q0 + 16 * k + 2 * t);
            const float2 b = *(const float2*)(q1 + 16 * k + 2 * t);
            const float2 c = *(const float2*)(q0 + 16 * k + 8 + 2 * t);
            const float2 d = *(const float2*)(q1 + 16 * k + 8 + 2 * t);
            qa[k][0] = pack_f16x2(a.x, a.y);
            qa[k][1] = pack_f16x2(b.x, b.y);
            qa[k][2] = pack_f16x2(c.x, c.y);
            qa[k][3] = pack_f16x2(d.x, d.y);
        }
    }
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    // Rows past the last key are clamped to it (finite values; masked out below).
    auto load_tile = [&](int tile, int buf) {
        for (int c = threadIdx.x; c < BC * CH; c += FA_WARPS * 32) {
            const int r = c / CH, part = c % CH;
            const size_t key = (size_t)min(tile * BC + r, end - 1);
            cp_async16(&sk[buf][r * STRIDE + part * 8], kbase + key * HD + part * 8);
            cp_async16(&sv[buf][r * STRIDE + part * 8], vbase + key * HD + part * 8);
        }
        cp_async_commit();
    };
    const int ntile = (end + BC - 1) / BC;
    load_tile(0, 0);
    for (int tile = 0; tile < ntile; tile++) {
        const int buf = tile & 1;
        if (tile + 1 < ntile) load_tile(tile + 1, buf ^ 1);
        else cp_async_commit();
        cp_async_wait_group<1>();
        __syncthreads();
        const int kb0 = tile * BC;
        if (kb0 <= warp_last) {  // else every key of the tile is after all of the warp's rows
            float s[BC / 8][4];
#pragma unroll
            for (int j = 0; j < BC / 8; j++) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
                const half_bits* kr = &sk[buf][(8 * j + g) * STRIDE + 2 * t];
#pragma unroll
                for (int k = 0; k < KCH; k++) {
                    const unsigned b0 = *(const unsigned*)(kr + 16 * k);
                    const unsigned b1 = *(const unsigned*)(kr + 16 * k + 8);
                    mma_f16(s[j], qa[k], b0, b1);
                }
            }
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < BC / 8; j++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int key = kb0 + 8 * j + 2 * t + (c & 1);
                    const int qp = c < 2 ? qpos0 : qpos1;
                    s[j][c] = key > qp ? -INFINITY : s[j][c] * FA_LOG2E;
                }
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
#pragma unroll
            for (int x = 1; x <= 2; x <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
            }
            // Key 0 is in tile 0 and before every query, so the new maxima are finite.
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            const float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
            m0 = n0;
            m1 = n1;
            l0 *= c0;
            l1 *= c1;
#pragma unroll
            for (int j = 0; j < BC / 8; j++) {
                s[j][0] = exp2f(s[j][0] - m0);
                s[j][1] = exp2f(s[j][1] - m0);
                s[j][2] = exp2f(s[j][2] - m1);
                s[j][3] = exp2f(s[j][3] - m1);
                l0 += s[j][0] + s[j][1];
                l1 += s[j][2] + s[j][3];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                o[j][0] *= c0;
                o[j][1] *= c0;
                o[j][2] *= c1;
                o[j][3] *= c1;
            }
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                const unsigned pa[4] = {
                    pack_f16x2(s[2 * kk][0], s[2 * kk][1]),
                    pack_f16x2(s[2 * kk][2], s[2 * kk][3]),
                    pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                    pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
                };
                // ldmatrix: lanes 8i..8i+7 address rows of matrix i = (keys +8 if i odd,
                // columns +8 if i >= 2).
                const int mi = lane >> 3;
                const half_bits* vr =
                    &sv[buf][(16 * kk + (lane & 7) + (mi & 1) * 8) * STRIDE + (mi >> 1) * 8];
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_trans(b0, b1, b2, b3, vr + 8 * j);
                    mma_f16(o[j], pa, b0, b1);
                    mma_f16(o[j + 1], pa, b2, b3);
                }
            }
        }
        __syncthreads();  // the next iteration's copy overwrites this buffer
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        o[j][0] *= i0;
        o[j][1] *= i0;
        o[j][2] *= i1;
        o[j][3] *= i1;
        const int col = 8 * j + 2 * t;
        if (r0 < nq)
            *(float2*)(att + ((size_t)(t0 + r0) * n_heads + h) * HD + col) =
                make_float2(o[j][0], o[j][1]);
        if (r1 < nq)
            *(float2*)(att + ((size_t)(t0 + r1) * n_heads + h) * HD + col) =
                make_float2(o[j][2], o[j][3]);
    }
    // The o projection's int8 input, as quantize_vec would make it from `att` (the caller asks
    // for it only when heads are whole 64-column blocks): a row's block is its quad's 4 lanes ×
    // 8 n-tiles × 2 columns, so the block maximum and Σq are quad reductions.
    if (quant) {
#pragma unroll
        for (int bb = 0; bb < HD / QBLOCK; bb++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int r = half ? r1 : r0;
                float amax = 0.0f;
#pragma unroll
                for (int j = 8 * bb; j < 8 * bb + 8; j++)
                    amax = fmaxf(amax, fmaxf(fabsf(o[j][2 * half]), fabsf(o[j][2 * half + 1])));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const bool live = amax > 0.0f && isfinite(amax);
                const float inv = live ? 127.0f / amax : 0.0f;
                const size_t base = ((size_t)(t0 + r) * n_heads + h) * HD + bb * QBLOCK;
                float sum = 0.0f;
#pragma unroll
                for (int j = 8 * bb; j < 8 * bb + 8; j++) {
                    const int qa = live ? __float2int_rn(o[j][2 * half] * inv) : 0;
                    const int qb = live ? __float2int_rn(o[j][2 * half + 1] * inv) : 0;
                    sum += (float)(qa + qb);
                    if (r < nq) {
                        const int col = 8 * (j - 8 * bb) + 2 * t;
                        xq[base + col] = (i8)qa;
                        xq[base + col + 1] = (i8)qb;
                    }
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const float d = live ? amax / 127.0f : 0.0f;
                if (r < nq && t == 0) xm[base / QBLOCK] = make_float2(d, d * sum);
            }
        }
    }
}

// One kernel per head size (hd = 32·E).
#define FLASH_PREFILL(E)                                                                      \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32)                               \
        flash_prefill_e##E(const float* qr, const half_bits* kc, const half_bits* vc,         \
                           const int* step, int ntok, int n_heads, int n_kv, int ctx,         \
                           float* att, i8* xq, float2* xm, int quant) {                       \
        flash_prefill<E>(qr, kc, vc, step, ntok, n_heads, n_kv, ctx, att, xq, xm, quant);     \
    }
FLASH_PREFILL(1)
FLASH_PREFILL(2)
FLASH_PREFILL(3)
FLASH_PREFILL(4)
FLASH_PREFILL(5)
FLASH_PREFILL(6)
FLASH_PREFILL(7)
FLASH_PREFILL(8)
