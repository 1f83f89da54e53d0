// A row of logits reduced to what the sampler needs (trit::sample::TopLogits): its k largest
// entries ordered by (logit descending, token id ascending) and ln Σ exp over the whole row,
// so a batched decode step copies (2k + 2) words per sequence to the host instead of the
// vocabulary's logits (151,936 floats). One block per row:
//   1. the row's maximum and a NaN/+inf flag, 2. Σ exp(l − max) in f64 (the host's
//   log_sum_exp sums in f64 too, so the log-probabilities agree to f64 rounding),
//   3. the k-th largest value by a 4-pass radix select over order-preserving 32-bit keys
//   (8 bits per pass, a 256-bin shared histogram of the entries that match the digits so far),
//   4. the entries above it plus the lowest-id entries equal to it, 5. a rank sort of those k.
// Output per row, (2k + 2) 32-bit words: k logit bit patterns, k ids, then ln Z as an f64
// (low word, high word); ln Z is NaN for a row holding a NaN or +inf (the host then takes
// the full row) and −inf for a row of −inf only.

#define TOPK_THREADS 1024
#define TOPK_MAX 256

// Larger float → larger key (total order: −0.0 below +0.0, as Rust's f32::total_cmp).
__device__ __forceinline__ unsigned order_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
row_top_candidates(const float* __restrict__ logits, int vocab, int k, unsigned* __restrict__ out) {
    __shared__ float s_max[32];
    __shared__ double s_sum[32];
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_need, s_all_equal;
    __shared__ unsigned s_keys[TOPK_MAX];
    __shared__ int s_ids[TOPK_MAX];
    __shared__ int s_count, s_eq_seen;
    __shared__ int s_warp_eq[32];
    pdl_launch_dependents();
    pdl_wait();
    const float* row = logits + (size_t)blockIdx.x * vocab;
    unsigned* o = out + (size_t)blockIdx.x * (2 * k + 2);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;

    // 1. Maximum over the entries that are not NaN/+inf; whether there are any such.
    float m = -INFINITY;
    int bad = 0;
    for (int i = tid; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (isnan(x) || x == INFINITY) bad = 1;
        else m = fmaxf(m, x);
    }
    bad = __syncthreads_or(bad);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) s_max[warp] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < nwarps; w++) m = fmaxf(m, s_max[w]);

    // 2. Σ exp(l − max) in f64 (nothing to sum when every entry is −inf).
    double sum = 0.0;
    if (m != -INFINITY && !bad) {
        for (int i = tid; i < vocab; i += blockDim.x) sum += exp((double)row[i] - (double)m);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;

    // 3. Radix select of the k-th largest key: after pass p, `prefix` holds its top 8(p + 1)
    // bits and `need` how many entries with those bits still belong to the k largest.
    unsigned prefix = 0, mask = 0, need = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        // Logits crowd into few bins in the first passes: one atomic per bin and warp.
        for (int base = 0; base < vocab; base += blockDim.x) {
            const int i = base + tid;
            unsigned bin = 0xffffffffu;
            if (i < vocab) {
                const unsigned key = order_key(row[i]);
                if ((key & mask) == prefix) bin = (key >> shift) & 255u;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin != 0xffffffffu && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        if (tid == 0) {
            unsigned above = 0;
            for (int d = 255; d >= 0; d--) {
                if (above + hist[d] >= need) {
                    s_prefix = prefix | ((unsigned)d << shift);
                    s_need = need - above;
                    s_all_equal = hist[d] == need - above;
                    break;
                }
                above += hist[d];
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
    }
    const unsigned kth = prefix;

    // 4. The k entries: every key above the k-th, and `need` of those equal to it — all of
    // them when exactly that many are equal (no tie at the cut), else the lowest ids, taken
    // chunk by chunk in index order.
    if (tid == 0) {
        s_count = 0;
        s_eq_seen = 0;
    }
    __syncthreads();
    if (s_all_equal) {
        for (int i = tid; i < vocab; i += blockDim.x) {
            const unsigned key = order_key(row[i]);
            if (key >= kth) {
                const int at = atomicAdd(&s_count, 1);
                s_keys[at] = key;
                s_ids[at] = i;
            }
        }
    } else {
        for (int base = 0; base < vocab; base += blockDim.x) {
            const int i = base + tid;
            const unsigned key = i < vocab ? order_key(row[i]) : 0u;
            const bool eq = i < vocab && key == kth;
            if (i < vocab && key > kth) {
                const int at = atomicAdd(&s_count, 1);
                s_keys[at] = key;
                s_ids[at] = i;
            }
            const unsigned ballot = __ballot_sync(0xffffffffu, eq);
            if (lane == 0) s_warp_eq[warp] = __popc(ballot);
            __syncthreads();
            int rank = s_eq_seen + __popc(ballot & ((1u << lane) - 1u));
            for (int w = 0; w < warp; w++) rank += s_warp_eq[w];
            if (eq && rank < (int)need) {
                const int at = atomicAdd(&s_count, 1);
                s_keys[at] = key;
                s_ids[at] = i;
            }
            __syncthreads();
            if (tid == 0) {
                for (int w = 0; w < nwarps; w++) s_eq_seen += s_warp_eq[w];
            }
            __syncthreads();
        }
    }
    __syncthreads();

    // 5. Each of the k threads places its entry at its rank (keys and ids are distinct pairs).
    if (tid < k) {
        const unsigned key = s_keys[tid];
        const int id = s_ids[tid];
        int rank = 0;
        for (int j = 0; j < k; j++) {
            const unsigned kj = s_keys[j];
            rank += kj > key || (kj == key && s_ids[j] < id);
        }
        o[rank] = __float_as_uint(row[id]);
        o[k + rank] = (unsigned)id;
    }
    if (tid == 0) {
        double total = 0.0;
        for (int w = 0; w < nwarps; w++) total += s_sum[w];
        const double log_z = bad ? __longlong_as_double(0x7ff8000000000000ll)
                                 : (double)m + log(total);
        const unsigned long long bits = (unsigned long long)__double_as_longlong(log_z);
        o[2 * k] = (unsigned)(bits & 0xffffffffull);
        o[2 * k + 1] = (unsigned)(bits >> 32);
    }
}
