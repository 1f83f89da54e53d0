// The gated full attention of a Qwen3.5 hybrid layer, one decode token (CPU reference:
// trit's model/qwen35.rs `full_attention`). It differs from the dense `attn_decode`: the q
// projection interleaves per head `head_dim` query values and `head_dim` gate values, RoPE
// (NeoX pairs) turns only the first `rot` dims of each head, and the output is multiplied by
// sigmoid(gate) before the o projection.
//
// The f16 cache is laid out [position][kv head][head_dim], like attn_decode's.

#define HA_MAX_HD 256

// proj = [q‖gate interleaved per head (2·nh·hd) | k (nkv·hd) | v (nkv·hd)].
// Blocks 0..nh: query head → RMSNorm(q_norm) + partial RoPE into q, gate copied out.
// Blocks nh..nh+nkv: kv head → RMSNorm(k_norm) + partial RoPE, k and v appended to the cache
// at the current position. blockDim.x = hd (a multiple of 32, at most HA_MAX_HD).
// cos_sin: per position rot/2 (cos, sin) pairs.
extern "C" __global__ void hybrid_attn_prep(const float* __restrict__ proj,
                                            const float* __restrict__ q_norm,
                                            const float* __restrict__ k_norm, float eps,
                                            const float* __restrict__ cos_sin, const int* step,
                                            int nh, int nkv, int hd, int rot,
                                            half_bits* __restrict__ k_cache,
                                            half_bits* __restrict__ v_cache,
                                            float* __restrict__ q, float* __restrict__ gate) {
    __shared__ float buf[HA_MAX_HD];
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int pos = step[0];
    const int t = threadIdx.x;
    const bool is_q = (int)blockIdx.x < nh;
    const int h = is_q ? blockIdx.x : blockIdx.x - nh;
    const float* src = is_q ? proj + (size_t)h * 2 * hd
                            : proj + (size_t)2 * nh * hd + (size_t)h * hd;
    const float* nw = is_q ? q_norm : k_norm;
    const float x = src[t];
    const float ss = block_sum(x * x, scratch);
    const float y = x * (1.0f / sqrtf(ss / (float)hd + eps)) * nw[t];
    buf[t] = y;
    __syncthreads();
    const int half = rot / 2;
    float r = y;
    if (t < half) {
        const float c = cos_sin[((size_t)pos * half + t) * 2], s = cos_sin[((size_t)pos * half + t) * 2 + 1];
        r = buf[t] * c - buf[t + half] * s;
    } else if (t < rot) {
        const int i = t - half;
        const float c = cos_sin[((size_t)pos * half + i) * 2], s = cos_sin[((size_t)pos * half + i) * 2 + 1];
        r = buf[i] * s + buf[t] * c;
    }
    if (is_q) {
        q[(size_t)h * hd + t] = r;
        gate[(size_t)h * hd + t] = src[hd + t];
    } else {
        const size_t at = ((size_t)pos * nkv + h) * hd + t;
        k_cache[at] = f2h(r);
        v_cache[at] = f2h(proj[(size_t)2 * nh * hd + (size_t)nkv * hd + (size_t)h * hd + t]);
    }
}

// out[h] = sigmoid(gate[h]) ⊙ softmax(scale · q_h Kᵀ) V over positions 0..=pos, query head h
// reading kv head h / (nh / nkv). One block of 4 warps per query head; each warp runs an
// online softmax over every 4th position (lane holds hd/32 dims), then the warps merge.
extern "C" __global__ void hybrid_attn_decode(const float* __restrict__ q,
                                              const float* __restrict__ gate,
                                              const half_bits* __restrict__ k_cache,
                                              const half_bits* __restrict__ v_cache,
                                              const int* step, int nh, int nkv, int hd,
                                              float scale, float* __restrict__ out) {
    __shared__ float m_s[4], l_s[4];
    __shared__ float acc_s[4][HA_MAX_HD];
    pdl_launch_dependents();
    pdl_wait();
    const int n = step[0] + 1;
    const int h = blockIdx.x, g = h / (nh / nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_lane = hd / 32;
    float qr[HA_MAX_HD / 32], acc[HA_MAX_HD / 32];
#pragma unroll
    for (int t = 0; t < HA_MAX_HD / 32; t++) {
        qr[t] = t < per_lane ? q[(size_t)h * hd + lane + 32 * t] * scale : 0.0f;
        acc[t] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = warp; p < n; p += 4) {
        const half_bits* kp = k_cache + ((size_t)p * nkv + g) * hd;
        const half_bits* vp = v_cache + ((size_t)p * nkv + g) * hd;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < HA_MAX_HD / 32; t++)
            if (t < per_lane) s += qr[t] * h2f(kp[lane + 32 * t]);
        s = warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int t = 0; t < HA_MAX_HD / 32; t++)
            if (t < per_lane) acc[t] = acc[t] * corr + e * h2f(vp[lane + 32 * t]);
        m = m_new;
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < HA_MAX_HD / 32; t++)
        if (t < per_lane) acc_s[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    // Position 0 belongs to warp 0, so the overall maximum is finite.
    const float mx = fmaxf(fmaxf(m_s[0], m_s[1]), fmaxf(m_s[2], m_s[3]));
    float w[4], total = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[i] = l_s[i] > 0.0f ? expf(m_s[i] - mx) : 0.0f;
        total += w[i] * l_s[i];
    }
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) o += w[i] * acc_s[i][j];
        const float gj = gate[(size_t)h * hd + j];
        out[(size_t)h * hd + j] = o / total / (1.0f + expf(-gj));
    }
}
