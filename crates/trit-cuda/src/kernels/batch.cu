// Kernels of the batched decode step: B sequences, one token each, every row at its own
// position in its own KV slot. The matrix products are the prefill's GEMM (B token rows); what
// differs from a prefill is that rows are not consecutive positions of one cache, so the
// position and the slot of each row come from `row_pos[r]` / `row_slot[r]`, and a slot's
// caches from `kv_tab[(slot * n_layers + layer) * 2 + {0: keys, 1: values}]` (device
// addresses of `[kv_head][ctx][head_dim]` f16 arrays).

__device__ __forceinline__ half_bits* slot_cache(const unsigned long long* kv_tab, int slot,
                                                  int layer, int n_layers, int values) {
    return (half_bits*)kv_tab[((size_t)slot * n_layers + layer) * 2 + values];
}

// QK-norm + RoPE of row r at position row_pos[r], one block per (head, row): q heads write the
// rotated, pre-scaled q to qr[r][h][hd]; kv heads append the rotated k and the v to the row's
// slot at its position.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
rope_append_rows(const float* __restrict__ qkv, const float* q_norm, const float* k_norm,
                 float eps, const float2* __restrict__ cos_sin, const int* row_pos,
                 const int* row_slot, const unsigned long long* kv_tab, int layer, int n_layers,
                 int n_heads, int n_kv, int hd, int adjacent, int ctx, float scale, float* qr) {
    __shared__ float scratch[32];
    __shared__ float tmp[MAX_HD], out[MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, r = blockIdx.y, pos = row_pos[r];
    const int width = (n_heads + 2 * n_kv) * hd;
    const float* row = qkv + (size_t)r * width;
    const float2* cs = cos_sin + (size_t)pos * (hd / 2);
    if (h < n_heads) {
        norm_rope(row + (size_t)h * hd, q_norm, eps, cs, hd, adjacent, scale, tmp, out, scratch);
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            qr[((size_t)r * n_heads + h) * hd + i] = out[i];
        return;
    }
    const int kvh = h - n_heads;
    norm_rope(row + (size_t)(n_heads + kvh) * hd, k_norm, eps, cs, hd, adjacent, 1.0f, tmp, out,
              scratch);
    const float* v = row + (size_t)(n_heads + n_kv + kvh) * hd;
    half_bits* kc = slot_cache(kv_tab, row_slot[r], layer, n_layers, 0);
    half_bits* vc = slot_cache(kv_tab, row_slot[r], layer, n_layers, 1);
    const size_t at = ((size_t)kvh * ctx + pos) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        kc[at + i] = f2h(out[i]);
        vc[at + i] = f2h(v[i]);
    }
}

// Attention of row r's query (head h) over its slot's positions 0..row_pos[r], one block of
// DEC_WARPS warps per (head, row): the decode kernel's rounds (attend_rounds, attention.cu) —
// each warp takes DEC_U positions at a time with all their loads issued first and the next
// round requested during the current one — then the warps' partials are merged in shared
// memory. (One position per step with its loads, dot and softmax in a chain cost ~1 µs per
// position at a 256-position context: the step's attention grew with the context.) The row's
// current position is in the cache already (rope_append_rows). Output att[r][h][hd] (f32;
// the caller quantizes it).
template <int E>
__device__ __forceinline__ void attn_rows(const float* __restrict__ qr, const int* row_pos,
                                          const int* row_slot,
                                          const unsigned long long* kv_tab, int layer,
                                          int n_layers, int n_heads, int n_kv, int ctx,
                                          float* __restrict__ att) {
    __shared__ float sm_m[DEC_WARPS], sm_l[DEC_WARPS];
    __shared__ float sm_o[DEC_WARPS][MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, r = blockIdx.y;
    const int end = row_pos[r] + 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = 32 * E;
    const int kvh = h / (n_heads / n_kv);
    const size_t kv_row = (size_t)kvh * ctx * hd;
    const half_bits* kc = slot_cache(kv_tab, row_slot[r], layer, n_layers, 0) + kv_row;
    const half_bits* vc = slot_cache(kv_tab, row_slot[r], layer, n_layers, 1) + kv_row;
    const int p0 = warp * DEC_U;
    float kk[DEC_U][E], vv[DEC_U][E];
    // pos = -1: no position is taken from shared memory instead of the cache.
    if (p0 < end) load_round<E>(kc, vc, hd, p0, end, -1, lane, kk, vv);
    float m, l, acc[E];
    attend_rounds<E>(qr + ((size_t)r * n_heads + h) * hd, nullptr, nullptr, kc, vc, hd, p0, end,
                     -1, false, lane, kk, vv, m, l, acc);
    float* out = att + ((size_t)r * n_heads + h) * hd;
    merge_warps<DEC_WARPS, E>(m, l, acc, sm_m, sm_l, sm_o, out, hd);
}

// One kernel per head size (E = head_dim / 32 values per lane).
#define ATTN_ROWS(E)                                                                          \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                 \
        attn_rows_e##E(const float* qr, const int* row_pos, const int* row_slot,              \
                       const unsigned long long* kv_tab, int layer, int n_layers, int n_heads, \
                       int n_kv, int ctx, float* att) {                                       \
        attn_rows<E>(qr, row_pos, row_slot, kv_tab, layer, n_layers, n_heads, n_kv, ctx, att); \
    }
ATTN_ROWS(1)
ATTN_ROWS(2)
ATTN_ROWS(3)
ATTN_ROWS(4)
ATTN_ROWS(5)
ATTN_ROWS(6)
ATTN_ROWS(7)
ATTN_ROWS(8)
