// A row of logits reduced to what the sampler needs (trit::sample::TopLogits): its k largest
// entries ordered by (logit descending, token id ascending) and ln Σ exp over the whole row,
// so a decode step copies (2k + 2) words per sequence to the host instead of the vocabulary's
// logits (151,936 floats).
//
// Two kernels, so that even one row spreads over the GPU (one block per row took ~100 µs
// for Qwen3's vocabulary, longer than copying the whole row):
//   row_top_parts: grid (parts, rows); block p takes the p-th of `parts` near-equal slices of
//     its row (each at least k entries) and writes the slice's k best entries (in the final
//     order), its maximum, a NaN/+inf flag and Σ exp(l − max) in f64.
//   row_top_merge: grid (rows); the k best of the parts' candidates (the row's k best are
//     among them: each is among its own slice's k best), and ln Σ exp from the parts' sums.
// Selection, in both: the k-th largest key by a 4-pass radix select over order-preserving
// 32-bit keys (8 bits per pass, a 256-bin shared histogram of the entries that match the
// digits so far), then the entries above it plus the lowest-id entries equal to it, then a
// rank sort of those k.
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


// Where a selection reads its n entries; entry i's key, logit bits and token id. Among equal
// keys, index order must be id order (the tie rule keeps the lowest ids, taken by index).
struct RowSource {  // a slice of one row of logits, ids from `lo`
    const float* row;
    int lo;
    __device__ __forceinline__ unsigned key(int i) const { return order_key(row[lo + i]); }
    __device__ __forceinline__ unsigned bits(int i) const { return __float_as_uint(row[lo + i]); }
    __device__ __forceinline__ unsigned id(int i) const { return (unsigned)(lo + i); }
};
struct PartsSource {  // the parts' candidates, part by part: slices are in id order, and
                      // each part's equal keys are in id order, so index order is id order
    const unsigned* parts;
    int k, words;
    __device__ __forceinline__ unsigned bits(int i) const { return parts[(i / k) * words + i % k]; }
    __device__ __forceinline__ unsigned key(int i) const { return order_key(__uint_as_float(bits(i))); }
    __device__ __forceinline__ unsigned id(int i) const { return parts[(i / k) * words + k + i % k]; }
};

struct SelectShared {
    unsigned hist[256];
    unsigned prefix, need, all_equal;
    unsigned keys[TOPK_MAX];
    int at[TOPK_MAX];  // source indices of the chosen entries
    int count, eq_seen;
    int warp_eq[32];
};

// The k best of the source's n entries (k ≤ n), written in order to o[0..k) (logit bits) and
// o[k..2k) (ids). Every thread of the block calls it.
template <typename Src>
__device__ void select_top(const Src& src, int n, int k, SelectShared& sh, unsigned* o) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    // Radix select of the k-th largest key: after pass p, `prefix` holds its top 8(p + 1)
    // bits and `need` how many entries with those bits still belong to the k largest.
    unsigned prefix = 0, mask = 0, need = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) sh.hist[i] = 0;
        __syncthreads();
        // Logits crowd into few bins in the first passes: one atomic per bin and warp.
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + tid;
            unsigned bin = 0xffffffffu;
            if (i < n) {
                const unsigned key = src.key(i);
                if ((key & mask) == prefix) bin = (key >> shift) & 255u;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin != 0xffffffffu && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], __popc(peers));
        }
        __syncthreads();
        // The digit: the first bin from the top at which the count of entries in higher bins
        // reaches `need`. One warp: lane l sums bins 255 − 8l down to 248 − 8l, a scan over
        // the lanes gives each lane the count above its bins, and the one lane where `need`
        // falls walks its 8 bins (one thread walking all 256 took ~4 µs per pass).
        if (warp == 0) {
            unsigned c[8], own = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = sh.hist[255 - 8 * lane - j];
                own += c[j];
            }
            unsigned incl = own;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += v;
            }
            unsigned above = incl - own;
            if (above < need && incl >= need) {
                for (int j = 0; j < 8; j++) {
                    if (above + c[j] >= need) {
                        sh.prefix = prefix | ((unsigned)(255 - 8 * lane - j) << shift);
                        sh.need = need - above;
                        sh.all_equal = c[j] == need - above;
                        break;
                    }
                    above += c[j];
                }
            }
        }
        __syncthreads();
        prefix = sh.prefix;
        need = sh.need;
        mask |= 255u << shift;
    }
    const unsigned kth = prefix;

    // The k entries: every key above the k-th, and `need` of those equal to it — all of them
    // when exactly that many are equal (no tie at the cut), else the lowest ids, taken chunk
    // by chunk in index order.
    if (tid == 0) {
        sh.count = 0;
        sh.eq_seen = 0;
    }
    __syncthreads();
    if (sh.all_equal) {
        for (int i = tid; i < n; i += blockDim.x) {
            const unsigned key = src.key(i);
            if (key >= kth) {
                const int at = atomicAdd(&sh.count, 1);
                sh.keys[at] = key;
                sh.at[at] = i;
            }
        }
    } else {
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + tid;
            const unsigned key = i < n ? src.key(i) : 0u;
            const bool eq = i < n && key == kth;
            if (i < n && key > kth) {
                const int at = atomicAdd(&sh.count, 1);
                sh.keys[at] = key;
                sh.at[at] = i;
            }
            const unsigned ballot = __ballot_sync(0xffffffffu, eq);
            if (lane == 0) sh.warp_eq[warp] = __popc(ballot);
            __syncthreads();
            int rank = sh.eq_seen + __popc(ballot & ((1u << lane) - 1u));
            for (int w = 0; w < warp; w++) rank += sh.warp_eq[w];
            if (eq && rank < (int)need) {
                const int at = atomicAdd(&sh.count, 1);
                sh.keys[at] = key;
                sh.at[at] = i;
            }
            __syncthreads();
            if (tid == 0) {
                for (int w = 0; w < nwarps; w++) sh.eq_seen += sh.warp_eq[w];
            }
            __syncthreads();
        }
    }
    __syncthreads();

    // Each of the k threads places its entry at its rank ((key, index) pairs are distinct,
    // and index order is id order among equal keys).
    if (tid < k) {
        const unsigned key = sh.keys[tid];
        const int at = sh.at[tid];
        int rank = 0;
        for (int j = 0; j < k; j++) {
            const unsigned kj = sh.keys[j];
            rank += kj > key || (kj == key && sh.at[j] < at);
        }
        o[rank] = src.bits(at);
        o[k + rank] = src.id(at);
    }
}

// Words per part in row_top_parts' output: k logit bits, k ids, max (f32 bits), the NaN/+inf
// flag, Σ exp(l − max) (f64, low word then high word).
__device__ __forceinline__ int part_words(int k) { return 2 * k + 4; }

__device__ __forceinline__ void put_f64(unsigned* o, double v) {
    const unsigned long long bits = (unsigned long long)__double_as_longlong(v);
    o[0] = (unsigned)(bits & 0xffffffffull);
    o[1] = (unsigned)(bits >> 32);
}
__device__ __forceinline__ double get_f64(const unsigned* o) {
    return __longlong_as_double((long long)((unsigned long long)o[0] | (unsigned long long)o[1] << 32));
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
row_top_parts(const float* __restrict__ logits, int vocab, int k, int parts, unsigned* __restrict__ out) {
    __shared__ float s_max[32];
    __shared__ double s_sum[32];
    __shared__ SelectShared sh;
    pdl_launch_dependents();
    pdl_wait();
    const int p = blockIdx.x, r = blockIdx.y;
    const int lo = (int)((long long)p * vocab / parts), hi = (int)((long long)(p + 1) * vocab / parts);
    const float* row = logits + (size_t)r * vocab;
    unsigned* o = out + ((size_t)r * parts + p) * part_words(k);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;

    // The slice's maximum over the entries that are not NaN/+inf; whether there are any such.
    float m = -INFINITY;
    int bad = 0;
    for (int i = lo + tid; i < hi; i += blockDim.x) {
        const float x = row[i];
        if (isnan(x) || x == INFINITY) bad = 1;
        else m = fmaxf(m, x);
    }
    bad = __syncthreads_or(bad);
    m = block_max(m, s_max);

    // Σ exp(l − max) in f64 (the host's log_sum_exp sums in f64 too; nothing to sum when
    // every entry is −inf).
    double sum = 0.0;
    if (m != -INFINITY && !bad) {
        for (int i = lo + tid; i < hi; i += blockDim.x) sum += exp((double)row[i] - (double)m);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;

    select_top(RowSource{row, lo}, hi - lo, k, sh, o);
    if (tid == 0) {  // s_sum is complete: select_top synchronized the block since
        double total = 0.0;
        for (int w = 0; w < nwarps; w++) total += s_sum[w];
        o[2 * k] = __float_as_uint(m);
        o[2 * k + 1] = (unsigned)bad;
        put_f64(o + 2 * k + 2, total);
    }
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
row_top_merge(const unsigned* __restrict__ part_out, int k, int parts, unsigned* __restrict__ out) {
    __shared__ SelectShared sh;
    pdl_launch_dependents();
    pdl_wait();
    const int r = blockIdx.x, words = part_words(k);
    const unsigned* in = part_out + (size_t)r * parts * words;
    unsigned* o = out + (size_t)r * (2 * k + 2);
    // ln Σ exp over the row from the parts' maxima and sums: thread p reads part p.
    __shared__ float s_max[32];
    __shared__ double s_sum[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const float mp = tid < parts ? __uint_as_float(in[tid * words + 2 * k]) : -INFINITY;
    const int bad = __syncthreads_or(tid < parts && in[tid * words + 2 * k + 1]);
    const float m = block_max(mp, s_max);
    double sum = 0.0;
    if (m != -INFINITY && !bad && mp != -INFINITY)
        sum = get_f64(in + tid * words + 2 * k + 2) * exp((double)mp - (double)m);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_sum[warp] = sum;
    select_top(PartsSource{in, k, words}, parts * k, k, sh, o);
    if (tid == 0) {  // s_sum is complete: select_top synchronized the block since
        double total = 0.0;
        for (int w = 0; w < nwarps; w++) total += s_sum[w];
        put_f64(o + 2 * k, bad ? __longlong_as_double(0x7ff8000000000000ll) : (double)m + log(total));
    }
}
