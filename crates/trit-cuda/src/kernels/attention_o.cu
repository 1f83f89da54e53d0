// Attention of one new token and the o projection in ONE kernel (`CudaOptions::attention_o`):
// the decode step's attention and o links become one, at contexts short enough for one block
// per head.
//
// Why: at short contexts the attention kernel and the o GEMV are latency links of ~6 and ~5 µs
// each per 8B layer (BENCHMARKS "GPU, session 8"), for little work: a few rounds of cache
// reads and 4 MB of weights. Here block (h, s) attends q head h over the whole context (one
// block per head: no splits, no merge), quantizes the head's output to int8 in shared memory,
// and multiplies it by the head's columns of W_o for the rows of slice s. Its W_o codes and
// scales, and its first round of cache reads (positions before the current one, written by
// earlier steps), are loaded before griddepcontrol.wait.
//
// The heads' products meet in `pend`, one 64-bit fixed-point sum per row (units of 2^-32,
// added with integer atomics: the same sum in any order, so the step stays bit-reproducible
// where float atomics would not). The residual x itself is not touched: the next kernel (the
// fused gate‖up, FG_IN_NORM_PEND) normalizes x + pend, and the down GEMV's epilogue adds pend
// into x and zeroes it (`pend_value` in gemv.cu, the one conversion both use).
//
// Grid (n_heads, o_splits), DEC_THREADS threads; rows per slice ≤ AO_ROWS · DEC_THREADS;
// head_dim = 32·E with E even (whole 64-value blocks per head).

#define AO_ROWS 4

template <int E, typename S>
__device__ __forceinline__ void attn_o_decode_impl(
    const float* __restrict__ qkv, const float* q_norm, const float* k_norm, float eps,
    const float2* __restrict__ cos_sin, const int* step, int n_heads, int n_kv, int adjacent,
    half_bits* kc, half_bits* vc, int ctx, float scale, const uint4* __restrict__ o_codes,
    const S* __restrict__ o_scales, int o_rows, int o_nb, int o_per,
    unsigned long long* pend) {
    constexpr int HD = 32 * E, NBH = HD / QBLOCK;
    static_assert(HD % QBLOCK == 0 && HD <= DEC_THREADS, "whole 64-value blocks per head");
    __shared__ float2 scratch2[32];
    __shared__ float tmp[HD], ktmp[HD], qs[HD], kcur[HD], vcur[HD];
    __shared__ float sm_m[DEC_WARPS], sm_l[DEC_WARPS];
    __shared__ float sm_o[DEC_WARPS][HD];
    __shared__ __align__(16) i8 oq[HD];
    __shared__ float2 om[NBH];
    pdl_launch_dependents();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x;
    const int group = n_heads / n_kv, kvh = h / group;

    // Before the wait: weights (the head's W_o columns for this slice's rows, the norms) and
    // the position, which the previous step's last kernel wrote.
    const float qn = q_norm != nullptr && tid < HD ? q_norm[tid] : 1.0f;
    const float kn = k_norm != nullptr && tid < HD ? k_norm[tid] : 1.0f;
    const int row0 = blockIdx.y * o_per, row1 = min(row0 + o_per, o_rows);
    uint4 ow[AO_ROWS][NBH];
    float osc[AO_ROWS][NBH];
#pragma unroll
    for (int i = 0; i < AO_ROWS; i++) {
        const int row = row0 + tid + i * DEC_THREADS;
#pragma unroll
        for (int j = 0; j < NBH; j++) {
            const bool in = row < row1;
            const unsigned at = (unsigned)(in ? row : 0) * o_nb + h * NBH + j;
            ow[i][j] = in ? load_stream(o_codes + at) : make_uint4(0, 0, 0, 0);
            osc[i][j] = in ? load_scale(o_scales, at) : 0.0f;
        }
    }
    const int pos = step[0], len = pos + 1;
    const size_t kv_row = (size_t)kvh * ctx * HD;
    const half_bits* kh = kc + kv_row;
    const half_bits* vh = vc + kv_row;
    int p0 = warp * DEC_U;
    float kk[DEC_U][E], vv[DEC_U][E];
    // Positions below pos only (load_round skips the current one): earlier steps wrote them.
    if (p0 < len) load_round<E>(kh, vh, HD, p0, len, pos, lane, kk, vv);
    const float2 rc = rope_coef(cos_sin + (size_t)pos * (HD / 2), tid, HD, adjacent);
    pdl_wait();

    norm_rope_qk(qkv + (size_t)h * HD, qkv + (size_t)(n_heads + kvh) * HD,
                 qkv + (size_t)(n_heads + n_kv + kvh) * HD, q_norm, k_norm, qn, kn, eps, rc, HD,
                 adjacent, scale, tmp, ktmp, qs, kcur, vcur, scratch2);
    if (blockIdx.y == 0 && h % group == 0) {
        for (int i = tid; i < HD; i += blockDim.x) {
            kc[kv_row + (size_t)pos * HD + i] = f2h(kcur[i]);
            vc[kv_row + (size_t)pos * HD + i] = f2h(vcur[i]);
        }
    }
    float m, l, acc[E];
    attend_rounds<E>(qs, kcur, vcur, kh, vh, HD, p0, len, pos, true, lane, kk, vv, m, l, acc);
    merge_warps<DEC_WARPS, E>(m, l, acc, sm_m, sm_l, sm_o, tmp, HD);
    __syncthreads();
    if (warp < NBH)
        quant_block_warp(tmp[warp * QBLOCK + lane], tmp[warp * QBLOCK + lane + 32],
                         oq + warp * QBLOCK, om + warp);
    __syncthreads();

    // pend[row] += Σ_j scale · (d_j · Σ code·q − d_j · Σ q) over the head's blocks j.
    uint4 a[NBH][4];
    float2 mj[NBH];
#pragma unroll
    for (int j = 0; j < NBH; j++) {
#pragma unroll
        for (int k = 0; k < 4; k++) a[j][k] = ((const uint4*)oq)[4 * j + k];
        mj[j] = om[j];
    }
#pragma unroll
    for (int i = 0; i < AO_ROWS; i++) {
        const int row = row0 + tid + i * DEC_THREADS;
        if (row >= row1) break;
        float y = 0.0f;
#pragma unroll
        for (int j = 0; j < NBH; j++)
            y += osc[i][j] * (mj[j].x * (float)dot_block(ow[i][j], a[j]) - mj[j].y);
        atomicAdd(pend + row, (unsigned long long)pend_fixed(y));
    }
}

// attn_o_decode_e{2,4}_{f16,f32}: head_dim 64 or 128, f16 or f32 W_o scales.
#define ATTN_O_DECODE(NAME, E, S)                                                              \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) NAME(                         \
        const float* qkv, const float* q_norm, const float* k_norm, float eps,                 \
        const float2* cos_sin, const int* step, int n_heads, int n_kv, int adjacent,           \
        half_bits* kc, half_bits* vc, int ctx, float scale, const uint4* o_codes,              \
        const S* o_scales, int o_rows, int o_nb, int o_per, unsigned long long* pend) {        \
        attn_o_decode_impl<E, S>(qkv, q_norm, k_norm, eps, cos_sin, step, n_heads, n_kv,       \
                                 adjacent, kc, vc, ctx, scale, o_codes, o_scales, o_rows, o_nb, \
                                 o_per, pend);                                                 \
    }
ATTN_O_DECODE(attn_o_decode_e2_f16, 2, half_bits)
ATTN_O_DECODE(attn_o_decode_e2_f32, 2, float)
ATTN_O_DECODE(attn_o_decode_e4_f16, 4, half_bits)
ATTN_O_DECODE(attn_o_decode_e4_f32, 4, float)
