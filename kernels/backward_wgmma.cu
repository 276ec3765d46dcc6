// FlashAttention backward over one (query span, key span) block on Hopper's warpgroup MMA
// (`wgmma`, sm_90a), causal by absolute position and under the optional mask of common.cuh
// (query tiles that see none of a CTA's keys skipped, partly hidden ones masked). Same contract
// as the mma.sync kernel in backward.cu (all three gradients accumulate in f32; dQ and dK carry
// the softmax scale), which stays the kernel for other GPUs. Head dims up to 128: 80 and 96
// run in the tiles of 128 (WG_DIM, wgmma.cuh), their extra columns zeros.
//
// One CTA = 128 key rows of one (batch, query head): two warpgroups that compute (warpgroup w
// owns keys 64w..64w+63) and a third that gives them its registers and splits in two warps: one
// loads the 64-row query tiles that can see the CTA's keys into two stages (Q and dO by TMA,
// LSE, D and row starts by cp.async, all onto the stage's "full" barrier; the computing
// warpgroups release a stage on its "empty" one), the other adds each tile's dQ, staged in
// shared memory, into global memory by TMA reductions (`cp.reduce.async.bulk.tensor`, one per 32
// columns). There is no CTA-wide barrier in the loop. Per query tile, with every product an
// m64n64k16 wgmma:
//  1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (A = K or V, B = Q or dO; both K-major in shared memory);
//  2. Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e), dSᵀ = Pᵀ∘(dPᵀ − D) in registers, and dSᵀ into
//     shared memory;
//  3. dV += Pᵀ·dO with Pᵀ as the register A operand (the accumulator layout of step 1 is the A
//     fragment layout) and dO read MN-major from the same tile as step 1; then the previous
//     tile's dQ = dS·K (A = dS MN-major from its dSᵀ buffer, B = K MN-major); then dK += dSᵀ·Q
//     (dSᵀ from registers, Q MN-major), which runs while that dQ goes to shared memory. In tiles
//     of 128 columns warpgroup w computes dQ's columns 64w..64w+63 over all 128 keys, so it
//     needs the other warpgroup's dSᵀ; at head dim 64 each warpgroup computes all columns over
//     its own 64 keys.
// The warpgroups issue steps 1 and 3 in ping-pong turns (wgmma.cuh, FlashAttention-3's schedule
// of the forward), so one's exponentials run under the other's products. dQ runs one tile late
// so that neither waits for the other's dSᵀ: the other warpgroup wrote the previous tile's
// before its own turn of step 3 on that tile, which came before this one. For dQ, per-thread
// vector atomics cost 7% of the backward's speed and per-row bulk reductions 2·32 serial issues
// in two warps (bench/notes/kernel-notes.md, v7 and v18). The loading and reducing warps alone,
// in place of loads and reductions issued by the computing warpgroups between CTA barriers,
// lost 1–2% at head dim 128 and 8% at 64; with the turns and the late dQ the backward gained
// 3–9% at 128, 7% at 96, and is level at 64 (v21).
// Compared with the per-warp mma.sync kernel, B operands are read from shared memory once per
// warpgroup instead of once per warp, which is what limited that kernel (81% shared-memory
// throughput, bench/notes/kernel-notes.md).
//
// The parameters are backward.cu's (the host launches either kernel the same way; the pointers
// to Q, dO and dQ go unused here), then the tensor maps that Q and dO are loaded and dQ is
// reduced through.
// Tiles and wgmma helpers: wgmma.cuh.

#if BWD_WGMMA

#define WG_BKV 128
#define WG_BQ 64
// Two warpgroups compute; a third loads (its first warp) and adds dQ (its second).
#define WG_CONSUMERS 256
#define WG_THREADS 384
#define WG_LOADER (WG_CONSUMERS / 32)
#define WG_REDUCER (WG_LOADER + 1)
// Hardware barriers besides 0 (__syncthreads') and the ping-pong turns' 1 and 2 (wgmma.cuh):
// the computing warpgroups' own; those between them and the reducing warp, a query tile's dQ
// is staged (one for both warpgroups, which only arrive) and a warpgroup's share has been read
// by the reductions (one per warpgroup, which waits); and the deterministic GQA turn at dK and
// dV (`kv_turns`).
#define BAR_COMPUTE 3
#define BAR_DQ_FULL 4
#define BAR_DQ_EMPTY 5  // and 6
#define BAR_KV_TURN 7
#define DQ_HANDOFF (WG_CONSUMERS + 32)
#define DQ_RETURN (128 + 32)
// dQ leaves through shared memory in its TMA reductions' layout: boxes of 32 f32 columns × 64
// rows (8 KiB) in the 128-byte swizzle, WG_DIM / 32 of them a part. Tiles of 128 columns have
// one part (each warpgroup fills its 64 columns), head dim 64 one per warpgroup (each holds a
// sum over its own keys).
#define WG_DQ_PARTS (WG_DIM == 128 ? 1 : 2)
#define WG_DQ_BOX (WG_BQ * 128)
#define WG_DQ_PART (WG_DIM / 32 * WG_DQ_BOX)

// Byte offset of dQ's (row, col) within a part: box col / 32, rows of 128 bytes, their 16-byte
// chunks XORed by row % 8 (the swizzle of the host's map). A warp's 8 rows × 4 pairs of one
// store land on distinct banks.
__device__ __forceinline__ u32 sdq_offset(int row, int col) {
    return (u32)((col / 32) * WG_DQ_BOX + row * 128 + ((((col % 32) / 4) ^ (row % 8)) << 4) +
                 (col % 4) * 4);
}

// The reducing warp adds the dQ tile of query rows row0.. of (batch, head) staged at sdQ into
// dQ through its tensor map: its first lane issues one TMA reduction per 32 columns of each
// part, as one bulk group; rows past the end and padding columns fall outside the map and are
// not written. Deterministic, the two parts of head dim 64 would reach dQ in either order: the
// warp adds part 1 into part 0 first, and only part 0 is reduced; and the lane has waited for
// the CTA's turn (`wait_dq_turn`), after whose acquire fence_proxy_async_global orders the
// reductions.
__device__ __forceinline__ void add_dq_tile(const TensorMap* map, u32 sdQ, unsigned char* pdQ,
                                            int row0, int head, int batch) {
    const int lane = threadIdx.x % 32;
    constexpr bool summed = DETERMINISTIC && WG_DQ_PARTS == 2;
    if (summed) {
        // Loops kept rolled: this warp runs in 24 registers (wgmma.cuh, regs_release).
#pragma unroll 1
        for (int row = lane; row < WG_BQ; row += 32)
#pragma unroll 2
            for (int c = 0; c < HEAD_DIM; c += 4) {
                float4* mine = reinterpret_cast<float4*>(pdQ + sdq_offset(row, c));
                const float4 a = *mine;
                const float4 b =
                    *reinterpret_cast<const float4*>(pdQ + WG_DQ_PART + sdq_offset(row, c));
                *mine = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            }
        fence_async_smem();
        __syncwarp();  // part 0 complete
    }
    if (lane != 0) return;
    if (DETERMINISTIC) fence_proxy_async_global();  // after the turn's acquire
#pragma unroll
    for (int p = 0; p < (summed ? 1 : WG_DQ_PARTS); ++p)
#pragma unroll
        for (int c = 0; c < HEAD_DIM; c += 32)
            tma_reduce_add(sdQ + p * WG_DQ_PART + (c / 32) * WG_DQ_BOX, map, c, row0, head, batch);
    bulk_commit();
}

// acc = A·Bᵀ over the head dim for step 1 (Sᵀ or dPᵀ): A this warpgroup's 64 rows of K or V at
// a, B the query tile's Q or dO at b, both K-major; 16 columns a step, none over the padding,
// the step's offset within its column atom of 128 bytes.
__device__ __forceinline__ void head_dim_product(float* acc, u32 a, u32 b) {
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const u32 col = (kk % 4) * 32;
        wg_ss<0, 0>(acc, wg_desc(a + (kk / 4) * (WG_BKV * 128) + col),
                    wg_desc(b + (kk / 4) * (WG_BQ * 128) + col), kk > 0);
    }
}

// acc (dK or dV, D/2 accumulators) += A·B for one 16-query step, A in registers (Pᵀ or dSᵀ)
// and B the step's 16 rows of Q or dO at b, MN-major: one product per column atom of the tile,
// the second over the D − 64 columns of the head dim it holds.
__device__ __forceinline__ void kv_grad_products(float* acc, const u32* a, u32 b) {
    wg_rs(acc, a, wg_desc(b));
    if constexpr (WG_DIM == 128) wg_rs_n<HEAD_DIM - 64>(acc + 32, a, wg_desc(b + WG_BQ * 128));
}

// Deterministic: this thread's dQ reductions have written dQ (not only read shared memory), and
// the writes are ordered before the CTA's next pass of a turn.
__device__ __forceinline__ void finish_dq_adds() {
    bulk_wait();
    fence_proxy_async_global();
    __threadfence();
}

// The tensor maps the host passes after the other parameters, back to back (the wgmma kernels'
// maps in blocks.rs): Q's and dO's for the loads, dQ's for the reductions.
struct BwdMaps {
    TensorMap q, dO, dQ;
};

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
    bwd_block(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
              const u16* __restrict__ dO, const float* __restrict__ LSE,
              const float* __restrict__ Dl, float* __restrict__ dQ, void* __restrict__ dK,
              void* __restrict__ dV, int kv_direct, int heads, int kv_heads, int q_len,
              int kv_len, int q_start, int kv_start, Strides qs, Strides kvs,
              const int* __restrict__ row_start, const int* __restrict__ row_end, int global,
              float scale, int* __restrict__ turns, const __grid_constant__ BwdMaps maps) {
    constexpr int D = HEAD_DIM;
    constexpr int DH = WG_DIM / 64;             // column atoms of a tile row
    const int wg = threadIdx.x / 128;           // warpgroup: keys 64·wg.., dQ columns 64·wg..
    const int wi = (threadIdx.x / 32) % 4;      // warp within the warpgroup: rows 16·wi..
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    const int n_kt = (kv_len + WG_BKV - 1) / WG_BKV;
    const CtaWork work = cta_work<BWD_KEY_MAJOR, DETERMINISTIC>(n_kt);
    const int c0 = work.tile * WG_BKV;
    int* const dq_turn_row = dq_turns(turns, work.bh, q_len, WG_BQ);  // this head's dQ turns

    // The query tiles that see these keys (all from the first on, without a mask).
    const int2 seen = seeing_query_tiles<WG_BQ>(c0, min(c0 + WG_BKV, kv_len), q_len, q_start,
                                                kv_start, row_start, row_end, global);
    const int t_begin = seen.x, n_qt = seen.y;
    if (t_begin >= n_qt) {
        skip_turns<WG_BQ, WG_BKV>(
            dq_turn_row, kv_turns(turns, work.bh, heads, kv_heads, q_len, WG_BQ, n_kt, kv_direct),
            t_begin, work.tile, n_kt, q_len, q_start, kv_start, global,
            kv_turn(work.bh, heads, kv_heads));
        return;
    }

    const BwdHead op = bwd_head(Q, K, V, dO, LSE, Dl, dQ, dK, dV, kv_direct, work.bh, heads,
                                kv_heads, q_len, qs, kvs);
    const int head = work.bh % heads, batch = bh_batch(work.bh, heads);  // in the tensor maps

    constexpr u32 KV_TILE = WG_BKV * WG_DIM * 2, Q_TILE = WG_BQ * WG_DIM * 2;
    constexpr u32 KV_ATOM = WG_BKV * 128;  // one column atom of K or V, bytes
    constexpr u32 DS_TILE = WG_BKV * WG_BQ * 2;
    unsigned char* gen;
    const u32 base = smem_base1024(&gen);
    const u32 sK = base;
    const u32 sV = sK + KV_TILE;
    const u32 sQ = sV + KV_TILE;            // two stages
    const u32 sdO = sQ + 2 * Q_TILE;        // two stages
    const u32 sdS = sdO + 2 * Q_TILE;       // three of dSᵀ [key][query], 128-byte rows
    const u32 sdQ = sdS + 3 * DS_TILE;      // a tile's dQ, WG_DQ_PARTS parts
    const u32 sL = sdQ + WG_DQ_PARTS * WG_DQ_PART;  // two stages of LSE, then two of D
    const u32 sD = sL + 2 * WG_BQ * 4;
    const u32 sR = sD + 2 * WG_BQ * 4;      // two stages of the rows' mask starts
    // Barriers (8 bytes each), per stage: "full" (its Q, dO, LSE, D and row starts have
    // landed: two arrivals arming the tiles' bytes, one per loading lane for the vectors) and
    // "empty" (both computing warpgroups are done with it). Tile n uses stage n % 2.
    const u32 full = sR + 2 * WG_BQ * 4, empty = full + 16;
    const float* fL = reinterpret_cast<const float*>(gen + (sL - base));
    const float* fD = reinterpret_cast<const float*>(gen + (sD - base));
    const int* iR = reinterpret_cast<const int*>(gen + (sR - base));
    unsigned char* pdQ = gen + (sdQ - base);

    if (threadIdx.x == 0) {
        for (int st = 0; st < 2; ++st) {
            mbar_init(full + 8 * st, 2 + 32);
            mbar_init(empty + 8 * st, 2);
        }
        fence_mbar_init();
    }
    __syncthreads();  // the barriers, for every thread; the last CTA-wide barrier

    // The third warpgroup keeps few registers (wgmma.cuh, regs_release) and splits in two
    // warps that run ahead of the computing ones, so that neither a load nor dQ's reductions
    // wait for the tile that needs them, and the computing warpgroups meet no CTA barrier.
    if (wg == 2) {
        regs_release<24>();
        const int warp = threadIdx.x / 32;
        if (warp == WG_LOADER) {
            // Tile n's Q and dO by TMA (its first lane: rows past the end and padding columns
            // land as zeros; in place of 16 cp.async per thread and tile, 1.12× the backward's
            // speed at d96: bench/notes/kernel-notes.md, v18), its LSE, D and row starts by
            // cp.async from every lane; into stage n % 2 once tile n − 2 is done with it.
            for (int n = 0; t_begin + n < n_qt; ++n) {
                const int st = n & 1, row0 = (t_begin + n) * WG_BQ;
                if (n >= 2) stage_wait<2>(empty, n - 2);
                const u32 bar = stage_bar<2>(full, n);
                if (lane == 0) {
                    tma_tile<WG_BQ>(sQ + st * Q_TILE, &maps.q, row0, head, batch, bar);
                    tma_tile<WG_BQ>(sdO + st * Q_TILE, &maps.dO, row0, head, batch, bar);
                }
                load_vec<WG_BQ>(sL + st * WG_BQ * 4, op.LSE, row0, q_len, lane, 32);
                load_vec<WG_BQ>(sD + st * WG_BQ * 4, op.D, row0, q_len, lane, 32);
                load_row_starts<WG_BQ>(sR + st * WG_BQ * 4, row_start, q_start, row0, q_len,
                                       lane, 32);
                cp_async_arrive(bar);
            }
        } else if (warp == WG_REDUCER) {
            // Each tile's dQ as the computing warpgroups stage it: sdQ is free again once the
            // reductions have read it (the first tile finds it free), so that they run under
            // the next tile's products. Deterministic, in the CTA's turn at each query tile,
            // then at the tiles after the last it sees.
            constexpr int R = WG_REDUCER * 32;  // this warp's first thread: the adder
            // sdQ is free for both computing warpgroups' next shares.
            auto sdq_read = [] {
                for (int w = 0; w < 2; ++w) named_arrive(BAR_DQ_EMPTY + w, DQ_RETURN);
            };
            sdq_read();
            for (int qt = t_begin; qt < n_qt; ++qt) {
                named_sync(BAR_DQ_FULL, DQ_HANDOFF);
                wait_dq_turn<WG_BQ, WG_BKV, R>(dq_turn_row, qt, work.tile, n_kt, q_start,
                                               kv_start);
                add_dq_tile(&maps.dQ, sdQ, pdQ, qt * WG_BQ, head, batch);
                if (lane == 0) {
                    if (DETERMINISTIC) {
                        finish_dq_adds();
                        pass_add_turn(dq_turn_row + qt);
                    } else {
                        bulk_wait_read();
                    }
                }
                __syncwarp();
                if (qt + 1 < n_qt) sdq_read();
            }
            if (lane == 0 && !DETERMINISTIC) bulk_wait();  // sdQ stays until it is read
            pass_unseen_dq_turns<WG_BQ, WG_BKV, R>(dq_turn_row, n_qt, work.tile, n_kt, q_len,
                                                   q_start, kv_start, global);
            // Deterministic GQA: the CTA's turn at its group's shared dK and dV, taken here
            // (the computing warpgroups add once it comes, and fence before they arrive),
            // since a thread of theirs spinning for it spilled 740 bytes of their registers.
            int* const kv = kv_turns(turns, work.bh, heads, kv_heads, q_len, WG_BQ, n_kt,
                                     kv_direct);
            if (kv) {
                if (lane == 0) wait_add_turn(kv + work.tile, kv_turn(work.bh, heads, kv_heads));
                __syncwarp();
                named_arrive(BAR_KV_TURN, DQ_HANDOFF);
                named_sync(BAR_KV_TURN, DQ_HANDOFF);
                if (lane == 0) pass_add_turn(kv + work.tile);
            }
        }
        return;
    }
    regs_claim<240>();

    load_tile<WG_BKV, WG_CONSUMERS, true, WG_DIM>(sK, op.K, op.kv_row, c0, kv_len);
    load_tile<WG_BKV, WG_CONSUMERS, true, WG_DIM>(sV, op.V, op.kv_row, c0, kv_len);
    cp_commit();

    // dK and dV for this warpgroup's 64 keys (accumulator layout over the head dim: its first
    // column atom, then the rest, D − 64 columns, where the tile has a second).
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    const u32 k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;
    cp_wait<0>();
    fence_async_smem();
    named_sync(BAR_COMPUTE, WG_CONSUMERS);  // K and V landed

    // dQ of tile n (query rows of tile t_begin + n) = dS·K from dSᵀ buffer n % 3, not
    // committed. In tiles of 128 columns warpgroup w takes columns 64w..64w+63 over all 128
    // keys; at head dim 64 all 64 columns over its own 64 keys (both add to dQ).
    constexpr int DQ_KEYS = DH == 2 ? WG_BKV : 64;
    const u32 dq_keys = DH == 2 ? 0 : wg * 64 * 128;  // first key row, bytes
    const u32 dq_atom = DH == 2 ? wg * KV_ATOM : 0;
    const int dq_col = DH == 2 ? wg * 64 : 0;
    auto dq_products = [&](float* acc, int n) {
        const u32 ds = sdS + (n % 3) * DS_TILE;
#pragma unroll
        for (int kk = 0; kk < DQ_KEYS / 16; ++kk)
            wg_ss<1, 1>(acc, wg_desc(ds + dq_keys + kk * 16 * 128),
                        wg_desc(sK + dq_atom + dq_keys + kk * 16 * 128), kk > 0);
    };
    // Stages this warpgroup's share of a tile's dQ for the reducing warp, once its reductions
    // have read the last tile's. This thread's pairs: rows wi·16 + g (+ 8), columns dq_col +
    // 8·nt + 2t, whose 16-byte chunk in the swizzle is (2·(nt % 4) + t / 2) ^ g = 2·(nt % 4) ^
    // (t / 2 ^ g): one base address and an XOR with a constant per store (sdq_offset's hoisted
    // per nt held four more registers across the loop, and the masked module spilled).
    auto stage_dq = [&](const float* acc) {
        const u32 dq_at = sdQ + (DH == 2 ? 0 : wg) * WG_DQ_PART + (dq_col / 32) * WG_DQ_BOX +
                          (wi * 16 + g) * 128 + (((t / 2) ^ g) << 4) + (t % 2) * 8;
        named_sync(BAR_DQ_EMPTY + wg, DQ_RETURN);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                st_shared_f32x2((dq_at ^ ((2 * (nt % 4)) << 4)) + (nt / 4) * WG_DQ_BOX + i * 1024,
                                acc[nt * 4 + 2 * i] * scale, acc[nt * 4 + 2 * i + 1] * scale);
        fence_async_smem();
        named_arrive(BAR_DQ_FULL, DQ_HANDOFF);
    };

    // One query tile n in two ping-pong turns (wgmma.cuh): Sᵀ and dPᵀ in the first; dV, the
    // last tile's dQ and dK in the second. `first` is a constant at each call (tile 0 has no
    // dQ before it), as in the forward: ptxas turns a commit after a conditional wgmma into an
    // extra group.
    auto tile = [&](const int n, const bool first) {
        const int stage = n & 1;
        stage_wait<2>(full, n);  // tile n's Q, dO, LSE, D and row starts
        const u32 cQ = sQ + stage * Q_TILE, cdO = sdO + stage * Q_TILE;
        const float* cL = fL + stage * WG_BQ;
        const float* cD = fD + stage * WG_BQ;
        const int* cR = iR + stage * WG_BQ;
        const int r0 = (t_begin + n) * WG_BQ;

        // ---- 1. Sᵀ and dPᵀ: 64 keys × 64 queries, K = head dim (steps of 16, none over the
        // padding), in two groups: Pᵀ's exponentials (step 2) run while dPᵀ's products do.
        float s[32], dp[32];
        take_turn(wg);
        wg_fence();
        head_dim_product(s, k_rows, cQ);
        wg_commit();
        head_dim_product(dp, v_rows, cdO);
        wg_commit();
        pass_turn(wg);
        wg_wait<1>();  // Sᵀ (dPᵀ may run on)
        fence_regs<32>(s);

        // ---- 2. Pᵀ (masked pairs exactly 0) and dSᵀ, packed as A fragments.
        const int rs_last = staged_row_start(cR, row_start, min(WG_BQ, q_len - r0) - 1);
        const bool need_mask = (r0 + WG_BQ > q_len) || (c0 + WG_BKV > kv_len) ||
                               tile_partly_hidden<WG_BKV>(kv_start + c0, q_start + r0, rs_last,
                                                         global);
        const int kl = wg * 64 + wi * 16 + g;  // this thread's key rows kl, kl + 8
        // The masked module tests pairs in a pass of its own that sets hidden scores to −∞
        // (the loop below then gives them P = 0 exactly), taken only by the tiles that need it:
        // with the test inside the softmax loop under a run-time flag, ptxas predicated it onto
        // every tile of the masked module, whose backward then ran 12.6% under the causal
        // module's on a nearly causal mask (16K, window 16383: 15.16 against 13.46 ms,
        // bench/results/offload-256k-2026-12-01). The causal module keeps its diagonal test in
        // the loop: as a pass, its 128K backward ran 23% slower (1035 against 842 ms,
        // bench/results/masks-smem-2026-12-01/call3). The mma.sync kernel keeps the test in its
        // loop in both: as a pass it spilled at head dim 256.
        if (MASKED && need_mask) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int kr = c0 + kl + (e >= 2 ? 8 : 0);
                    const int qr = r0 + nt * 8 + 2 * t + (e & 1);
                    const int rs = staged_row_start(cR, row_start, min(qr, q_len - 1) - r0);
                    if (qr >= q_len || kr >= kv_len ||
                        key_hidden(kv_start + kr, q_start + qr, rs, global))
                        s[nt * 4 + e] = NEG_INF;
                }
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const int qc = nt * 8 + 2 * t;
            float lse2[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float lse = cL[qc + c];
                lse2[c] = lse == NEG_INF ? POS_INF : lse * LOG2E;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = exp2f(fmaf(s[nt * 4 + e], scale_log2, -lse2[e & 1]));
                if (!MASKED && need_mask) {  // the causal module: the diagonal and the edges
                    const int kr = c0 + kl + (e >= 2 ? 8 : 0);
                    const int qr = r0 + qc + (e & 1);
                    if (qr >= q_len || kr >= kv_len ||
                        key_hidden(kv_start + kr, q_start + qr, 0, global))
                        p = 0.f;
                }
                s[nt * 4 + e] = p;
            }
        }
        wg_wait<0>();  // dPᵀ
        fence_regs<32>(dp);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp[nt * 4 + e] = s[nt * 4 + e] * (dp[nt * 4 + e] - cD[nt * 8 + 2 * t + (e & 1)]);
        u32 pa[4][4], da[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int n0 = 8 * kk, n1 = 8 * kk + 4;  // accumulator tiles 2kk and 2kk+1
            pa[kk][0] = pack2(s[n0], s[n0 + 1]);
            pa[kk][1] = pack2(s[n0 + 2], s[n0 + 3]);
            pa[kk][2] = pack2(s[n1], s[n1 + 1]);
            pa[kk][3] = pack2(s[n1 + 2], s[n1 + 3]);
            da[kk][0] = pack2(dp[n0], dp[n0 + 1]);
            da[kk][1] = pack2(dp[n0 + 2], dp[n0 + 3]);
            da[kk][2] = pack2(dp[n1], dp[n1 + 1]);
            da[kk][3] = pack2(dp[n1 + 2], dp[n1 + 3]);
        }
        // dSᵀ into buffer n % 3, before this warpgroup's second turn: the other warpgroup's dQ
        // of this tile comes in its second turn after that (turns alternate), and the last
        // reader of the buffer, dQ of tile n − 3, finished before the other warpgroup's first
        // turn of tile n − 1 ended.
        const u32 cdS = sdS + (n % 3) * DS_TILE;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int q = kk * 16 + half * 8 + 2 * t;
                st_shared_u32(cdS + swz128(WG_BKV, kl, q), da[kk][2 * half]);
                st_shared_u32(cdS + swz128(WG_BKV, kl + 8, q), da[kk][2 * half + 1]);
            }
        fence_async_smem();

        // ---- 3. dV += Pᵀ·dO (K = 64 queries; B = dO MN-major, one product per column atom,
        // the second only over the head dim's columns), the last tile's dQ, and dK += dSᵀ·Q
        // (B = Q MN-major), which runs while that dQ goes to shared memory.
        float acc[32];
        take_turn(wg);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            kv_grad_products(dv, pa[kk], cdO + kk * 16 * 128);
        if (!first) dq_products(acc, n - 1);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) kv_grad_products(dk, da[kk], cQ + kk * 16 * 128);
        wg_commit();
        pass_turn(wg);
        wg_wait<1>();  // dV and dQ done (groups complete in order); dK may run on
        fence_regs<D / 2>(dv);
        fence_regs<16>(&pa[0][0]);
        if (!first) {
            fence_regs<32>(acc);
            stage_dq(acc);
        }
        wg_wait<0>();
        fence_regs<D / 2>(dk);
        fence_regs<16>(&da[0][0]);
        if (threadIdx.x % 128 == 0) mbar_arrive(stage_bar<2>(empty, n));  // for its warpgroup
    };
    const int tiles = n_qt - t_begin;
    pingpong_start(wg);
    tile(0, true);
    for (int n = 1; n < tiles; ++n) tile(n, false);
    {  // the last tile's dQ, in a turn of its own
        float acc[32];
        take_turn(wg);
        wg_fence();
        dq_products(acc, tiles - 1);
        wg_commit();
        pass_turn(wg);
        wg_wait<0>();
        fence_regs<32>(acc);
        stage_dq(acc);
    }
    pingpong_end(wg);

    const bool kv_turns_taken =
        kv_turns(turns, work.bh, heads, kv_heads, q_len, WG_BQ, n_kt, kv_direct) != nullptr;
    if (kv_turns_taken) named_sync(BAR_KV_TURN, DQ_HANDOFF);  // the reducing warp has the turn
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int kr = c0 + wg * 64 + wi * 16 + g + 8 * i;
        if (kr < kv_len) {
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                const size_t o = (size_t)kr * op.kv_row + nt * 8 + 2 * t;
                const int e = nt * 4 + 2 * i;
                put_kv_grad(op.dK, op.kv_direct, o, dk[e] * scale, dk[e + 1] * scale);
                put_kv_grad(op.dV, op.kv_direct, o, dv[e], dv[e + 1]);
            }
        }
    }
    if (kv_turns_taken) {
        __threadfence();
        named_arrive(BAR_KV_TURN, DQ_HANDOFF);  // it passes the turn on
    }
}
#endif  // BWD_WGMMA
