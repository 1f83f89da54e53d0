// The Gated DeltaNet mixer over a chunk of prompt tokens (the hybrid prefill, hybrid/prefill.rs):
// three kernels per layer and chunk instead of one `deltanet_step` per token.
//
// 1. deltanet_gates_rows: g and β of every (token, value head) from RMSNorm(x_t)·γ in f32, the
//    same formula as deltanet_step's gates; one block per token.
// 2. deltanet_chunk: one block per value head walks the chunk's tokens in order with its head's
//    state in registers (each warp owns DNC_ROWS rows for the whole chunk), so the state is read
//    and written once per chunk, not once per token. The conv reads the chunk's projection rows
//    for positions inside the chunk and the window only for positions before it: a key head's
//    q/k channels are shared by several value heads' blocks, so nobody writes the window here.
// 3. deltanet_window_store: the window then takes the chunk's last inputs (positions end − K + 1
//    … end − 1, the ones the next token's conv reads), in the ring order deltanet_step uses.
//
// Shapes: dk ≤ 32·DNC_U, dv ≤ DNC_ROWS · 16 (512 threads); the host keeps the per-token kernel
// for anything wider.

#define DNC_ROWS 8
#define DNC_U 4

// gb[t·hv + h] = (g, β) of value head h at token t. x: the chunk's residual rows (d each).
extern "C" __global__ void deltanet_gates_rows(const float* __restrict__ x,
                                               const float* __restrict__ gamma, float eps, int d,
                                               const float* __restrict__ ab_w,
                                               const float* __restrict__ a_neg,
                                               const float* __restrict__ dt_bias, int hv,
                                               float2* __restrict__ gb) {
    __shared__ float scratch[32];
    pdl_launch_dependents();
    pdl_wait();
    const int tok = blockIdx.x, t = threadIdx.x, T = blockDim.x;
    const int lane = t & 31, warp = t >> 5, nw = T >> 5;
    x += (size_t)tok * d;
    float ss = 0.0f;
    for (int i = t; i < d; i += T) ss += x[i] * x[i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    // One warp per row of [a rows (hv) | b rows (hv)].
    for (int r = warp; r < 2 * hv; r += nw) {
        const float* w = ab_w + (size_t)r * d;
        float acc = 0.0f;
        for (int i = lane; i < d; i += 32) acc += w[i] * x[i] * gamma[i];
        acc = warp_sum(acc);
        if (lane == 0) {
            float* out = (float*)&gb[(size_t)tok * hv + (r % hv)];
            if (r < hv)
                out[0] = expf(a_neg[r] * dn_softplus(acc * inv + dt_bias[r]));
            else
                out[1] = dn_sigmoid(acc * inv);
        }
    }
}

// proj: the chunk's q‖k‖v‖z rows (`row` floats each: the cd conv channels, then z); out: the
// gated-RMSNorm rows (hv·dv each, a head at its grouped place when `regroup`).
extern "C" __global__ void __launch_bounds__(512)
deltanet_chunk(const float* __restrict__ proj, int row, const float2* __restrict__ gb,
               const float* __restrict__ window, const float* __restrict__ conv_w, int kernel,
               int start, int n, float* __restrict__ state, int hk, int dk, int dv, int v_tiled,
               const float* __restrict__ norm_w, float eps, int regroup,
               float* __restrict__ out) {
    __shared__ float qs[32 * DNC_U];
    __shared__ float ks[32 * DNC_U];
    __shared__ float vs[DNC_ROWS * 16];
    __shared__ float os[DNC_ROWS * 16];
    __shared__ float scratch[32];
    pdl_launch_dependents();
    const int head = blockIdx.x, hv = gridDim.x;
    const int t = threadIdx.x, T = blockDim.x;
    const int lane = t & 31, warp = t >> 5;
    const int kh = v_tiled ? head % hk : head / (hv / hk);
    const int kw = hk * dk, cd = 2 * kw + hv * dv;
    const int per_lane = dk / 32, i0 = warp * DNC_ROWS;
    const int at = regroup ? (head % hk) * (hv / hk) + head / hk : head;
    float* hs = state + (size_t)head * dv * dk;
    pdl_wait();
    float s[DNC_ROWS][DNC_U];
#pragma unroll
    for (int r = 0; r < DNC_ROWS; r++) {
#pragma unroll
        for (int u = 0; u < DNC_U; u++)
            s[r][u] = (u < per_lane && i0 + r < dv) ? hs[(size_t)(i0 + r) * dk + lane + 32 * u] : 0.0f;
    }
    for (int tok = 0; tok < n; tok++) {
        const int pos = start + tok;
        const float* cur = proj + (size_t)tok * row;
        const float2 gbt = gb[(size_t)tok * hv + head];
        // Conv + SiLU over the window, oldest input first (deltanet_step's order).
        for (int j = t; j < 2 * dk + dv; j += T) {
            int c;
            float* dst;
            if (j < dk) {
                c = kh * dk + j;
                dst = qs + j;
            } else if (j < 2 * dk) {
                c = kw + kh * dk + (j - dk);
                dst = ks + (j - dk);
            } else {
                c = 2 * kw + head * dv + (j - 2 * dk);
                dst = vs + (j - 2 * dk);
            }
            const float* wc = conv_w + (size_t)c * kernel;
            float acc = 0.0f;
            for (int i = 0; i < kernel - 1; i++) {
                const int p = pos - (kernel - 1) + i;
                if (p >= start)
                    acc += wc[i] * proj[(size_t)(p - start) * row + c];
                else if (p >= 0)
                    acc += wc[i] * window[(size_t)(p % kernel) * cd + c];
            }
            acc += wc[kernel - 1] * cur[c];
            *dst = acc * dn_sigmoid(acc);
        }
        __syncthreads();
        // L2-normalized q (also × 1/√dk) and k.
        float sq = 0.0f, sk = 0.0f;
        for (int i = t; i < dk; i += T) {
            sq += qs[i] * qs[i];
            sk += ks[i] * ks[i];
        }
        sq = block_sum(sq, scratch);
        sk = block_sum(sk, scratch);
        const float iq = rsqrtf((float)dk) / sqrtf(sq + 1e-6f);
        const float ik = 1.0f / sqrtf(sk + 1e-6f);
        float qv[DNC_U], kv[DNC_U];
#pragma unroll
        for (int u = 0; u < DNC_U; u++) {
            qv[u] = u < per_lane ? qs[lane + 32 * u] * iq : 0.0f;
            kv[u] = u < per_lane ? ks[lane + 32 * u] * ik : 0.0f;
        }
        // The delta rule on this warp's rows: S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q.
#pragma unroll
        for (int r = 0; r < DNC_ROWS; r++) {
            const int rw = i0 + r;
            float dot_k = 0.0f;
#pragma unroll
            for (int u = 0; u < DNC_U; u++) {
                s[r][u] *= gbt.x;
                dot_k += s[r][u] * kv[u];
            }
            dot_k = warp_sum(dot_k);
            const float delta = rw < dv ? gbt.y * (vs[rw] - dot_k) : 0.0f;
            float dot_q = 0.0f;
#pragma unroll
            for (int u = 0; u < DNC_U; u++) {
                s[r][u] += delta * kv[u];
                dot_q += s[r][u] * qv[u];
            }
            dot_q = warp_sum(dot_q);
            if (lane == 0 && rw < dv) os[rw] = dot_q;
        }
        __syncthreads();
        // Gated RMSNorm: RMSNorm(o)·w · SiLU(z), z the rows after the conv channels.
        float so = 0.0f;
        for (int i = t; i < dv; i += T) so += os[i] * os[i];
        so = block_sum(so, scratch);
        const float io = 1.0f / sqrtf(so / (float)dv + eps);
        const float* z = cur + cd + (size_t)head * dv;
        float* o = out + (size_t)tok * hv * dv + (size_t)at * dv;
        for (int i = t; i < dv; i += T) {
            const float zi = z[i];
            o[i] = os[i] * io * norm_w[i] * (zi * dn_sigmoid(zi));
        }
        // The next token's conv rewrites qs/ks/vs: everyone is past its reads of them (the
        // block sums above synchronized), and os is next written after two more syncs.
    }
#pragma unroll
    for (int r = 0; r < DNC_ROWS; r++) {
#pragma unroll
        for (int u = 0; u < DNC_U; u++)
            if (u < per_lane && i0 + r < dv) hs[(size_t)(i0 + r) * dk + lane + 32 * u] = s[r][u];
    }
}

// After a chunk of n tokens from `start`: ring slot p % kernel of the window takes the conv
// channels of position p for p = max(start, end − kernel + 1) … end − 1 (end = start + n).
extern "C" __global__ void deltanet_window_store(const float* __restrict__ proj, int row,
                                                 int start, int n, int cd, int kernel,
                                                 float* __restrict__ window) {
    pdl_launch_dependents();
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    const int end = start + n;
    for (int p = max(start, end - (kernel - 1)); p < end; p++)
        window[(size_t)(p % kernel) * cd + c] = proj[(size_t)(p - start) * row + c];
}
