// A row of logits reduced to what the sampler needs (trit::sample::TopLogits): its k largest
// entries ordered by (logit descending, token id ascending) and ln Σ exp over the whole row,
// so a batched decode step copies (2k + 2) words per sequence to the host instead of the
// vocabulary's logits (151,936 floats).
//
// Two kernels. row_top_partial: block (row, part) takes one of `parts` equal slices of the
// row (a few slices per row, so a batch of rows fills the GPU) and finds
//   1. the slice's maximum and whether it holds a NaN or +inf,
//   2. Σ exp(l − max) over the slice in f64 (the host's log_sum_exp sums in f64 too),
//   3. its k-th largest value, by a 4-pass radix select over order-preserving 32-bit keys
//      (8 bits per pass, a 256-bin shared histogram of the entries matching the digits so far),
//   4. the entries above it plus the lowest-id entries equal to it.
// row_top_merge: one block per row ranks the parts' k candidates each (the row's k best are
// among them) and combines the parts' sums into ln Z.
// Output per row, (2k + 2) 32-bit words: k logit bit patterns, k ids, then ln Z as an f64
// (low word, high word); ln Z is NaN for a row holding a NaN or +inf (the host then takes
// the full row) and −inf for a row of −inf only.

#define TOPK_THREADS 1024
#define TOPK_MAX 256
// Words of one part's record: k logits, k ids, the slice's max (f32 bits), its NaN/+inf
// flag, Σ exp(l − max) as an f64.
#define TOPK_PART_EXTRA 4

// Larger float → larger key (total order: −0.0 below +0.0, as Rust's f32::total_cmp).
__device__ __forceinline__ unsigned order_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
row_top_partial(const float* __restrict__ logits, int vocab, int k, int parts,
                unsigned* __restrict__ scratch) {
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
    const int part_len = (vocab + parts - 1) / parts;
    const int lo = blockIdx.y * part_len, hi = min(vocab, lo + part_len);
    const float* row = logits + (size_t)blockIdx.x * vocab;
    unsigned* o = scratch + ((size_t)blockIdx.x * parts + blockIdx.y) * (2 * k + TOPK_PART_EXTRA);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;

    // 1 and 2 in one pass: a running maximum and a sum rescaled when the maximum grows.
    float m = -INFINITY;
    double sum = 0.0;
    int bad = 0;
    for (int i = lo + tid; i < hi; i += blockDim.x) {
        const float x = row[i];
        if (isnan(x) || x == INFINITY) {
            bad = 1;
        } else if (x > m) {
            sum = sum * exp((double)m - (double)x) + 1.0;
            m = x;
        } else if (x != -INFINITY) {
            sum += exp((double)x - (double)m);
        }
    }
    bad = __syncthreads_or(bad);
    float wm = m;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, off));
    if (lane == 0) s_max[warp] = wm;
    __syncthreads();
    float bm = -INFINITY;
    for (int w = 0; w < nwarps; w++) bm = fmaxf(bm, s_max[w]);
    // This thread's sum relative to the block's maximum (nothing when all is −inf).
    sum = m == -INFINITY ? 0.0 : sum * exp((double)m - (double)bm);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;

    // 3. Radix select of the k-th largest key: after pass p, `prefix` holds its top 8(p + 1)
    // bits and `need` how many entries with those bits still belong to the k largest.
    unsigned prefix = 0, mask = 0, need = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int base = lo; base < hi; base += blockDim.x) {
            const int i = base + tid;
            unsigned bin = 0xffffffffu;
            if (i < hi) {
                const unsigned key = order_key(row[i]);
                if ((key & mask) == prefix) bin = (key >> shift) & 255u;
            }
            // Logits crowd into few bins in the first passes: one atomic per bin and warp.
            if (__any_sync(0xffffffffu, bin != 0xffffffffu)) {
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin != 0xffffffffu && lane == __ffs(peers) - 1)
                    atomicAdd(&hist[bin], __popc(peers));
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Bins from the top, 8 per lane: the lane whose bins cross `need` finds the digit.
            unsigned mine = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) mine += hist[255 - 8 * lane - j];
            unsigned incl = mine;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += v;
            }
            unsigned above = incl - mine;
            if (above < need && incl >= need) {
                for (int j = 0; j < 8; j++) {
                    const int d = 255 - 8 * lane - j;
                    if (above + hist[d] >= need) {
                        s_prefix = prefix | ((unsigned)d << shift);
                        s_need = need - above;
                        s_all_equal = hist[d] == need - above;
                        break;
                    }
                    above += hist[d];
                }
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
        for (int i = lo + tid; i < hi; i += blockDim.x) {
            const unsigned key = order_key(row[i]);
            if (key >= kth) {
                const int at = atomicAdd(&s_count, 1);
                s_keys[at] = key;
                s_ids[at] = i;
            }
        }
    } else {
        for (int base = lo; base < hi; base += blockDim.x) {
            const int i = base + tid;
            const unsigned key = i < hi ? order_key(row[i]) : 0u;
            const bool eq = i < hi && key == kth;
            if (i < hi && key > kth) {
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
    if (tid < k) {
        o[tid] = __float_as_uint(row[s_ids[tid]]);
        o[k + tid] = (unsigned)s_ids[tid];
    }
    if (tid == 0) {
        double total = 0.0;
        for (int w = 0; w < nwarps; w++) total += s_sum[w];
        const unsigned long long bits = (unsigned long long)__double_as_longlong(total);
        o[2 * k] = __float_as_uint(bm);
        o[2 * k + 1] = (unsigned)bad;
        o[2 * k + 2] = (unsigned)(bits & 0xffffffffull);
        o[2 * k + 3] = (unsigned)(bits >> 32);
    }
}

// Block per row: parts × k candidates (at most TOPK_THREADS), each placed at its rank among
// all of them by (key descending, id ascending); the first k are the row's.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
row_top_merge(const unsigned* __restrict__ scratch, int k, int parts, unsigned* __restrict__ out) {
    __shared__ unsigned s_keys[TOPK_THREADS];
    __shared__ int s_ids[TOPK_THREADS];
    pdl_launch_dependents();
    pdl_wait();
    const int rec = 2 * k + TOPK_PART_EXTRA, n = parts * k, tid = threadIdx.x;
    const unsigned* in = scratch + (size_t)blockIdx.x * parts * rec;
    unsigned* o = out + (size_t)blockIdx.x * (2 * k + 2);
    unsigned key = 0, bits = 0;
    int id = 0;
    if (tid < n) {
        const unsigned* r = in + (size_t)(tid / k) * rec;
        bits = r[tid % k];
        id = (int)r[k + tid % k];
        key = order_key(__uint_as_float(bits));
        s_keys[tid] = key;
        s_ids[tid] = id;
    }
    __syncthreads();
    if (tid < n) {
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const unsigned kj = s_keys[j];
            rank += kj > key || (kj == key && s_ids[j] < id);
        }
        if (rank < k) {
            o[rank] = bits;
            o[k + rank] = (unsigned)id;
        }
    }
    if (tid == 0) {
        float m = -INFINITY;
        int bad = 0;
        for (int p = 0; p < parts; p++) {
            m = fmaxf(m, __uint_as_float(in[(size_t)p * rec + 2 * k]));
            bad |= (int)in[(size_t)p * rec + 2 * k + 1];
        }
        double total = 0.0;
        for (int p = 0; p < parts; p++) {
            const unsigned* r = in + (size_t)p * rec + 2 * k;
            const double s = __longlong_as_double((long long)((unsigned long long)r[2] |
                                                              (unsigned long long)r[3] << 32));
            const float pm = __uint_as_float(r[0]);
            if (pm != -INFINITY) total += s * exp((double)pm - (double)m);
        }
        const double log_z = bad ? __longlong_as_double(0x7ff8000000000000ll)
                                 : (double)m + log(total);
        const unsigned long long lz = (unsigned long long)__double_as_longlong(log_z);
        o[2 * k] = (unsigned)(lz & 0xffffffffull);
        o[2 * k + 1] = (unsigned)(lz >> 32);
    }
}
