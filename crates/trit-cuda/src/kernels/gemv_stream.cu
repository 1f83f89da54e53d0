// The streaming decode GEMV: the fused GEMV (gemv.cu: input prologue, SwiGLU epilogue) with
// its weights staged through shared memory by cp.async instead of registers.
//
// Why: a decode GEMV gives each warp only 2–13 items (an item: R rows × 32 blocks of 64
// columns, 16 bytes of codes per row and lane), and the register-pipelined kernels keep at
// most two of them in flight, so a warp waits about one memory round trip per item or two,
// and a block asks for nothing until its last register slot frees. Here each warp owns a ring
// of ST = STREAM_STAGES shared-memory slots of one item each (codes and scales): ST − 1 items
// are requested before griddepcontrol.wait (weights never depend on the previous kernel, so
// they load while it finishes), then one more per item computed. In flight per block: ST − 1
// items per warp, holding no registers. Requesting fewer before the wait (the rest after the
// prologue, so x's loads queue behind fewer weight requests) was slower: H200 8B tg128 with
// 2 / 1 / 0 of the 3 before the wait 887–889 / 880–881 / 850–851 against 892 (session 34).
//
// Teams of SPLIT warps take row groups: team t of the grid takes groups t, t + (all teams),
// ..., and its warps share each group's lane-steps (long rows of a matrix with few groups are
// read by several warps at once, so every multiprocessor gets work); their partial sums meet
// in shared memory at the group's end. With SPLIT = 1 warps are independent.
//
// A lane reads only what it copied itself, so a slot needs no warp barrier: the lane's
// cp.async.wait_group orders its own copies before its reads.
//
// Dynamic shared memory (host: stream_smem_bytes in gemv.rs):
//   xs: 4·nb 16-byte chunks | ms: nb (d, d·Σq), padded to 16 bytes | ring: [warp][ST] slots
//   | with FG_IN_NORM_ROT, the 64·nb f32 values being rotated.
// Any row length works; the host checks 16-byte aligned codes and 4-byte aligned scales.

// One slot: R·32 chunks of codes (lane l's 16 bytes of row i at chunk 32i + l), then R·32
// 4-byte scale words (lane l's at word 32i + l: an f32 scale, or the aligned pair of f16
// scales that holds it).
template <int R>
struct StreamSlot {
    static constexpr int CODE_CHUNKS = R * 32;
    static constexpr int CHUNKS = CODE_CHUNKS + R * 32 * 4 / 16;
};

// The 4-byte scale word holding scale `at` (f16 scales are padded to an even count, so the
// aligned pair always exists; repack.rs).
__device__ __forceinline__ void issue_scale(unsigned dst, const half_bits* s, unsigned at, bool in) {
    // As 32-bit words (the pair's index at / 2): one shift and one wide multiply-add for the
    // address, where `s + (at & ~1)` took a mask, a wide multiply and a 64-bit add per row.
    cp_async4_zfill(dst, (const unsigned*)s + (at >> 1), in ? 4 : 0);
}
__device__ __forceinline__ void issue_scale(unsigned dst, const float* s, unsigned at, bool in) {
    cp_async4_zfill(dst, s + at, in ? 4 : 0);
}
// Scale of the word: `odd` says which half of an f16 pair.
__device__ __forceinline__ float slot_scale(const unsigned* w, const half_bits*, unsigned odd) {
    return h2f((half_bits)(odd ? (*w >> 16) : (*w & 0xffffu)));
}
__device__ __forceinline__ float slot_scale(const unsigned* w, const float*, unsigned) {
    return __uint_as_float(*w);
}

// The first block index (row · nb) of each row of a group, computed once per group rather
// than per item: the streaming GEMV is issue-bound, and this address arithmetic was a fifth of
// its instructions.
template <int R>
struct RowBases {
    unsigned at[R];
    __device__ __forceinline__ void set(int g, int rows, int half, int glu, int nb) {
#pragma unroll
        for (int i = 0; i < R; i++) at[i] = fg_row<R>(g, i, rows, half, glu) * nb;
    }
};

// Requests the item at lane-step k of the group whose rows are `rb` into `slot`; each lane
// copies only what it will read itself (its 16 bytes of codes and its scale word per row), so
// no lane waits for another. Blocks past the row's end are zero-filled and not computed.
template <int R, typename S>
__device__ __forceinline__ void stream_issue(uint4* slot, const uint4* __restrict__ codes,
                                             const S* __restrict__ scales,
                                             const RowBases<R>& rb, int nb, int k, int lane) {
    const int b = 32 * k + lane;
    const bool in = b < nb;
    const unsigned bc = min(b, nb - 1);
    // Shared addresses computed once: row i's are constant offsets from them.
    const unsigned dc = smem_addr(slot + lane);
    const unsigned ds = smem_addr((unsigned*)(slot + StreamSlot<R>::CODE_CHUNKS) + lane);
#pragma unroll
    for (int i = 0; i < R; i++) {
        const unsigned at = rb.at[i] + bc;
        cp_async16_zfill(dc + i * 32 * 16, codes + at, in ? 16 : 0);
        issue_scale(ds + i * 32 * 4, scales, at, in);
    }
}

// Slots per warp: 4 measured best on the 8B shape (8 slots: 602 against 669 tok/s tg128; with
// more slots fewer warps fit in shared memory). The host sets it with TRIT_CUDA_STREAM_STAGES
// (gemv.rs stream_stages), which also sizes the ring's shared memory.
#ifndef STREAM_STAGES
#define STREAM_STAGES 4
#endif

// Where the ring starts in dynamic shared memory (16-byte chunks) for rows of up to nb blocks.
__device__ __forceinline__ int stream_ring_at(int nb) { return 4 * nb + (nb + 1) / 2; }

// The items one warp takes of one matrix, and how far its requests have got. Team t of the
// grid takes groups t, t + (all teams), ...; warp `sub` of a team takes lane-steps sub,
// sub + SPLIT, ... of each (a step past the row's end is an empty item, so all warps of a team
// agree on the count).
template <int R>
struct StreamWarp {
    int g0, per, stride, mine;  // first group, lane-steps per group, group stride, items
    int gi, ji;                 // the next item to request
    RowBases<R> ri, r0;         // rows of group gi and of group g0
    uint4* ring;

    // Requests the next item (group gi, lane-step sub + SPLIT·ji) into ring slot `s`.
    template <int SPLIT, typename S>
    __device__ __forceinline__ void issue_next(int s, const uint4* __restrict__ codes,
                                               const S* __restrict__ scales, int rows, int nb,
                                               int glu, int sub, int lane) {
        stream_issue<R, S>(ring + s * StreamSlot<R>::CHUNKS, codes, scales, ri, nb,
                           sub + SPLIT * ji, lane);
        if (++ji == per) {
            ji = 0;
            gi += stride;
            ri.set(gi, rows, rows / 2, glu, nb);
        }
    }
};

// Plans the warp's items of a rows × (64·nb) matrix and requests the first ST − 1 of them into
// its ring (at `ring_at` chunks, then ST slots per warp). Only weights are read, so this may
// run before the input exists: before griddepcontrol.wait, or — in a persistent kernel —
// before the grid barrier that ends the previous phase. Every round commits one group, empty
// or not, so "all but the newest ST − 1 groups have landed" always means "the current item
// has".
template <int R, int SPLIT, typename S>
__device__ __forceinline__ StreamWarp<R> stream_begin(const uint4* __restrict__ codes,
                                                      const S* __restrict__ scales, int rows,
                                                      int nb, int glu, int ring_at) {
    constexpr int ST = STREAM_STAGES;
    extern __shared__ uint4 dyn[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int team = warp / SPLIT, sub = warp % SPLIT, teams = warps / SPLIT;
    const int half = rows / 2;
    const int groups = glu ? (half + R / 2 - 1) / (R / 2) : (rows + R - 1) / R;
    StreamWarp<R> w;
    w.ring = dyn + ring_at + warp * ST * StreamSlot<R>::CHUNKS;
    w.per = ((nb + 31) / 32 + SPLIT - 1) / SPLIT;
    w.stride = gridDim.x * teams;
    w.g0 = blockIdx.x * teams + team;
    w.mine = w.g0 < groups ? ((groups - 1 - w.g0) / w.stride + 1) * w.per : 0;
    w.gi = w.g0;
    w.ji = 0;
    w.ri.set(w.gi, rows, half, glu, nb);
    w.r0 = w.ri;
#pragma unroll
    for (int n = 0; n < ST - 1; n++) {
        if (n < w.mine) w.template issue_next<SPLIT, S>(n, codes, scales, rows, nb, glu, sub, lane);
        cp_async_commit();
    }
    return w;
}

// The rest once the input exists: every block builds the int8 input (fg_prologue), then each
// warp computes its items, requesting one more per item. L2: x and the residual are read
// through L2 (a persistent caller's other blocks wrote them in its previous phase).
template <int R, int SPLIT, typename S, bool L2, bool ROT = false, bool PEND = false>
__device__ __forceinline__ void stream_finish(
    StreamWarp<R>& w, const uint4* __restrict__ codes, const S* __restrict__ scales, int rows,
    int nb, int mode, const float* __restrict__ x, const FgGamma& gr,
    const float* __restrict__ gamma, float eps,
    const uint4* __restrict__ q, const float2* __restrict__ meta, float* __restrict__ y,
    int accumulate, int glu, FgRot rot = FgRot{nullptr, 0}) {
    constexpr int ST = STREAM_STAGES;
    extern __shared__ uint4 dyn[];
    __shared__ float scratch[32];
    __shared__ float red[SPLIT > 1 ? 32 : 1][R];
    uint4* xs = dyn;
    float2* ms = (float2*)(dyn + 4 * nb);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int team = warp / SPLIT, sub = warp % SPLIT;
    const int half = rows / 2;
    if (ROT) {
        // The f32 values being rotated: past the ring (host: FusedInput::extra_smem).
        const int ring_end = stream_ring_at(nb) + (blockDim.x >> 5) * ST * StreamSlot<R>::CHUNKS;
        fg_prologue_rot<L2>(nb, x, gr, gamma, eps, rot, (float*)(dyn + ring_end), xs, ms,
                            scratch);
    } else {
        fg_prologue<L2, PEND>(mode, nb, x, gr, gamma, eps, q, meta, xs, ms, scratch);
    }
    __syncthreads();
    TRACE_MARK(0);
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
    int g = w.g0, j = 0;
    RowBases<R> rc = w.r0;  // rows of group g
    // Which half of its f16 pair a lane's scale is: (row base + b) mod 2, and b = 32k + lane
    // has the lane's parity, so it stays for the whole group.
    unsigned odd[R];
#pragma unroll
    for (int i = 0; i < R; i++) odd[i] = (rc.at[i] + lane) & 1;
    for (int n = 0; n < w.mine; n++) {
        if (n + ST - 1 < w.mine)
            w.template issue_next<SPLIT, S>((n + ST - 1) % ST, codes, scales, rows, nb, glu, sub,
                                            lane);
        cp_async_commit();
        cp_async_wait_group<ST - 1>();
        const uint4* slot = w.ring + (n % ST) * StreamSlot<R>::CHUNKS;
        const unsigned* sc = (const unsigned*)(slot + StreamSlot<R>::CODE_CHUNKS);
        const int b = 32 * (sub + SPLIT * j) + lane;
        if (b < nb) {
            uint4 c[R];
#pragma unroll
            for (int i = 0; i < R; i++) c[i] = slot[i * 32 + lane];
            int d[R];
            fg_block_dots<R>(c, xs, b, d);
            const float2 m = ms[b];
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[i] += slot_scale(sc + i * 32 + lane, scales, odd[i]) * (m.x * (float)d[i] - m.y);
        }
        if (++j == w.per) {
            float t = warp_sum_rows<R>(acc);
#pragma unroll
            for (int i = 0; i < R; i++) acc[i] = 0.0f;
            t = team_sum_rows<R, SPLIT>(t, red, warp, team, lane);
            if (sub == 0) fg_store_rows<R, L2>(t, g, rows, half, glu, y, accumulate, lane);
            j = 0;
            g += w.stride;
            rc.set(g, rows, half, glu, nb);
#pragma unroll
            for (int i = 0; i < R; i++) odd[i] = (rc.at[i] + lane) & 1;
        }
    }
}

// One matrix as one kernel: the first weights are requested before griddepcontrol.wait, so
// they load while the previous kernel finishes.
template <int R, int SPLIT, typename S, bool ROT, bool PEND>
__device__ __forceinline__ void ternary_gemv_stream(
    const uint4* __restrict__ codes, const S* __restrict__ scales, int rows, int nb, int mode,
    const float* __restrict__ x, const float* __restrict__ gamma, float eps,
    const uint4* __restrict__ q, const float2* __restrict__ meta, float* __restrict__ y,
    int accumulate, int flags, FgRot rot) {
    // flags: bit 0 gate‖up, bit 1 FG_LATE_TRIGGER, bit 2 FG_RELU2.
    TRACE_SCOPE(1, codes);
    const int glu = fg_glu(flags), late = flags & FG_LATE_TRIGGER;
    if (!late) pdl_launch_dependents();
    StreamWarp<R> w = stream_begin<R, SPLIT, S>(codes, scales, rows, nb, glu, stream_ring_at(nb));
    const FgGamma gr = fg_gamma(mode, nb, gamma);
    pdl_wait();
    TRACE_WAITED();
    if (late) pdl_launch_dependents();
#ifdef TRIT_PROBE_SKIP
    if (TRIT_PROBE_SKIP & 8) cp_async_wait_all();  // no copy may outlive the block
#endif
    PROBE_SKIP(8);
    stream_finish<R, SPLIT, S, false, ROT, PEND>(w, codes, scales, rows, nb, mode, x, gr, gamma,
                                                 eps, q, meta, y, accumulate, glu, rot);
}

// The `_rot_` kernels take FG_IN_NORM_ROT inputs only, the `_pend_` ones FG_IN_NORM_PEND
// (attention_o.cu) besides the plain modes; the others every other mode. Separate because the
// rotating prologue raised the kernel's registers from 66 to 86 (ptxas, sm_90), and the
// pending sum's loads to 80, which would keep the next kernel's early blocks off a
// multiprocessor (README, PDL). The `_rot_` kernels themselves take 80: beside one of 17
// warps, `deltanet_step_early`'s 12 warps of 64 registers no longer fit (43,520 + 24,576 >
// 65,536), so behind a rotated q‖k‖v‖z it starts only when the GEMV's block ends.
#define TERNARY_GEMV_STREAM_KIND(NAME, R, SPLIT, SN, S, ROT, PEND)                             \
    extern "C" __global__ void NAME##_r##R##_s##SPLIT##_##SN(                                  \
        const uint4* codes, const S* scales, int rows, int nb, int mode, const float* x,        \
        const float* gamma, float eps, const uint4* q, const float2* meta, float* y,            \
        int accumulate, int glu, const float* signs, int rot_block) {                          \
        ternary_gemv_stream<R, SPLIT, S, ROT, PEND>(codes, scales, rows, nb, mode, x, gamma,    \
                                                    eps, q, meta, y, accumulate, glu,          \
                                                    FgRot{signs, rot_block});                  \
    }
#define TERNARY_GEMV_STREAM(R, SPLIT, SN, S)                                    \
    TERNARY_GEMV_STREAM_KIND(ternary_gemv_stream, R, SPLIT, SN, S, false, false) \
    TERNARY_GEMV_STREAM_KIND(ternary_gemv_stream_rot, R, SPLIT, SN, S, true, false)
#define TERNARY_GEMV_STREAM_ALL(R, SN, S) \
    TERNARY_GEMV_STREAM(R, 1, SN, S) TERNARY_GEMV_STREAM(R, 2, SN, S) TERNARY_GEMV_STREAM(R, 4, SN, S)
TERNARY_GEMV_STREAM_ALL(2, f16, half_bits)
TERNARY_GEMV_STREAM_ALL(4, f16, half_bits)
TERNARY_GEMV_STREAM_ALL(8, f16, half_bits)
TERNARY_GEMV_STREAM_ALL(2, f32, float)
TERNARY_GEMV_STREAM_ALL(4, f32, float)
TERNARY_GEMV_STREAM_ALL(8, f32, float)
// The `_pend_` kernels for 4 rows per warp only (the default; attention_o.rs checks it): each
// kernel kind costs NVRTC time at first start.
#define TERNARY_GEMV_STREAM_PEND(SPLIT, SN, S) \
    TERNARY_GEMV_STREAM_KIND(ternary_gemv_stream_pend, 4, SPLIT, SN, S, false, true)
TERNARY_GEMV_STREAM_PEND(1, f16, half_bits)
TERNARY_GEMV_STREAM_PEND(2, f16, half_bits)
TERNARY_GEMV_STREAM_PEND(4, f16, half_bits)
TERNARY_GEMV_STREAM_PEND(1, f32, float)
TERNARY_GEMV_STREAM_PEND(2, f32, float)
TERNARY_GEMV_STREAM_PEND(4, f32, float)
