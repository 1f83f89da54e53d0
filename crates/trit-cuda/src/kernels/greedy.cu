// Greedy decoding without the host in the loop (greedy.rs): a step's argmax becomes the next
// step's token on the device, so consecutive steps run back to back — no logits copy, no host
// wake-up, no launch between them.
//
//   row_argmax:  the best entry of the row as one 64-bit key, order_key(logit) << 32 | ~id, so
//     the largest logit wins and among equal ones the lowest id — the host's `argmax` (first
//     strictly larger entry). −0.0 counts as +0.0 (the host's `>` sees them equal). NaN entries
//     are skipped, as the host's `>` skips them, and flagged: the host then stops with an error
//     instead of continuing from garbage.
//   take_argmax: one thread turns the key into the token at position + 1 (the next step's
//     input), reports it with its flags to page-locked host memory at index position + 1,
//     clears the key and flag for the next step and advances the position (it replaces the
//     step's advance_position). A token among the caller's stop ids sets `halt`, which a
//     hybrid's DeltaNet step checks: the steps queued past the end of a reply then leave the
//     recurrent state where the reply ended.
//
// order_key is topk.cu's.

#define ARGMAX_THREADS 256

__device__ __forceinline__ unsigned long long argmax_key(float l, unsigned id) {
    if (l == 0.0f) l = 0.0f;  // −0.0 → +0.0
    return ((unsigned long long)order_key(l) << 32) | (0xFFFFFFFFu - id);
}

__device__ __forceinline__ unsigned long long max_u64(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

// Grid: enough blocks of ARGMAX_THREADS threads to give each thread about one float4 of the
// row. `best` must hold 0 and `nan_seen` 0 before the first step (take_argmax leaves them so).
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
row_argmax(const float* __restrict__ logits, int n, unsigned long long* best, unsigned* nan_seen) {
    TRACE_SCOPE(7, logits);
    pdl_launch_dependents();
    pdl_wait();
    TRACE_WAITED();
    unsigned long long key = 0;
    bool nan = false;
    const int stride = gridDim.x * blockDim.x;
    const int n4 = n / 4;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = ((const float4*)logits)[i];
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (e[j] != e[j]) {
                nan = true;
            } else {
                key = max_u64(key, argmax_key(e[j], 4 * i + j));
            }
        }
    }
    for (int i = 4 * n4 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float l = logits[i];
        if (l != l) {
            nan = true;
        } else {
            key = max_u64(key, argmax_key(l, i));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) key = max_u64(key, __shfl_xor_sync(0xFFFFFFFFu, key, o));
    __shared__ unsigned long long warp_best[ARGMAX_THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = key;
    if (__any_sync(0xFFFFFFFFu, nan) && lane == 0) atomicOr(nan_seen, 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; ++w) key = max_u64(key, warp_best[w]);
        if (key != 0) atomicMax(best, key);
    }
}

// Sampling in the host's place (`DevicePick::Sample`): trit's Sampler::sample_top on one row's
// candidates from row_top_merge (`top`: k logit bit patterns in rank order, k ids, ln Z as an
// f64), in the same f64 arithmetic and the same order — the finite candidates; their softmax
// at temperature 1 cut by top-p (the first whose cumulative probability reaches top_p) and
// min-p (those at least min_p times the best's); the softmax of the kept ones at the
// temperature; one draw of the xoshiro256** generator in `rng` (trit::sample::rng); the first
// candidate whose cumulative probability exceeds the draw. The exponentials are computed by all
// lanes, the sums in order by lane 0 (CUDA's exp is within one ulp of the host's, so a token
// can differ only where a draw falls within ~1e-16 of a boundary). The choice goes to `best`
// as a key take_argmax reads; `flags_word` gets bit 0 for a row whose normalizer is not
// finite (NaN or +inf logits) and bit 3 when the generator was drawn from. One warp.
#define SAMPLE_MAX 256

__device__ __forceinline__ unsigned long long rotl64(unsigned long long x, int k) {
    return (x << k) | (x >> (64 - k));
}

extern "C" __global__ void sample_candidates(const unsigned* top, int k, float temperature,
                                             float top_p, float min_p, unsigned long long* rng,
                                             unsigned long long* best, unsigned* flags_word) {
    pdl_launch_dependents();
    pdl_wait();
    __shared__ float l[SAMPLE_MAX];
    __shared__ double e[SAMPLE_MAX];
    __shared__ int n_finite, keep;
    const int lane = threadIdx.x;
    const double log_z = __hiloint2double((int)top[2 * k + 1], (int)top[2 * k]);
    if (!isfinite(log_z)) {
        if (lane == 0) {
            *best = 1ull << 32;
            atomicOr(flags_word, 1u);
        }
        return;
    }
    for (int i = lane; i < k; i += 32) l[i] = __uint_as_float(top[i]);
    __syncwarp();
    if (lane == 0) {
        int n = 0;
        while (n < k && isfinite(l[n])) ++n;  // rank order: −inf entries come last
        n_finite = n;
    }
    __syncwarp();
    const int n = n_finite;
    if (n == 0) {  // nothing to draw from: the host returns token 0 without a draw
        if (lane == 0) *best = (1ull << 32) | 0xFFFFFFFFull;
        return;
    }
    const double top_l = (double)l[0];
    for (int i = lane; i < n; i += 32) e[i] = exp((double)l[i] - top_l);
    __syncwarp();
    if (lane == 0) {
        double sum = 0.0;
        for (int i = 0; i < n; ++i) sum += e[i];
        int kept = n;
        if (top_p < 1.0f) {
            double cum = 0.0;
            for (int i = 0; i < n; ++i) {
                cum += e[i] / sum;
                if (cum >= (double)top_p) {
                    kept = i + 1;
                    break;
                }
            }
        }
        if (min_p > 0.0f) {
            const double floor = (e[0] / sum) * (double)min_p;
            int above = 0;
            while (above < n && e[above] / sum >= floor) ++above;
            kept = min(kept, max(above, 1));
        }
        keep = max(kept, 1);
    }
    __syncwarp();
    const int m = keep;
    const double t = (double)temperature;
    for (int i = lane; i < m; i += 32) e[i] = exp(((double)l[i] - top_l) / t);
    __syncwarp();
    if (lane == 0) {
        double sum = 0.0;
        for (int i = 0; i < m; ++i) sum += e[i];
        // xoshiro256**: next_u64, then (x >> 11) · 2^-53.
        unsigned long long s0 = rng[0], s1 = rng[1], s2 = rng[2], s3 = rng[3];
        const unsigned long long r = rotl64(s1 * 5, 7) * 9;
        const unsigned long long sh = s1 << 17;
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= sh;
        s3 = rotl64(s3, 45);
        rng[0] = s0;
        rng[1] = s1;
        rng[2] = s2;
        rng[3] = s3;
        const double u = (double)(r >> 11) * (1.0 / 9007199254740992.0);
        int pick = m - 1;
        double cum = 0.0;
        for (int i = 0; i < m; ++i) {
            cum += e[i] / sum;
            if (u < cum) {
                pick = i;
                break;
            }
        }
        const unsigned id = top[k + pick];
        *best = (1ull << 32) | (0xFFFFFFFFull - id);
        atomicOr(flags_word, 8u);
    }
}

// One thread. `toks` holds n_toks positions (the next token is dropped past its end, where no
// step can run); `ring` is mapped page-locked memory of n_toks + 1 entries: the token in the
// low word, the flags in the high one (bit 0: a NaN in the row, bit 1: no entry at all, bit 2:
// the token is one of the `stop` ids — stop[0] of them, from stop[1] — and `halt` was set: a
// hybrid's later steps leave its recurrent state alone, see deltanet.cu; bit 3: the sampler
// drew from its generator). `nan_seen` is the pick's flags word (bits 0 and 3).
extern "C" __global__ void take_argmax(int* step, int* toks, int n_toks, unsigned long long* best,
                                       unsigned* nan_seen, unsigned long long* ring,
                                       const int* stop, int* halt) {
    pdl_launch_dependents();
    pdl_wait();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int pos = step[0];
    const unsigned long long key = *best;
    const unsigned tok = key == 0 ? 0u : 0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull);
    bool stops = false;
    for (int i = 1; i <= stop[0]; ++i) stops |= (unsigned)stop[i] == tok;
    if (stops && *halt == 0) *halt = 1;
    const unsigned flags = (*nan_seen & 1u) | (key == 0 ? 2u : 0u) | (stops ? 4u : 0u) |
                           (*nan_seen & 8u);
    if (pos + 1 < n_toks) toks[pos + 1] = (int)tok;
    if (pos + 1 <= n_toks) ring[pos + 1] = ((unsigned long long)flags << 32) | tok;
    *best = 0;
    *nan_seen = 0;
    step[0] = pos + 1;
}
