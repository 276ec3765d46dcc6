// FlashAttention backward over one (query span, key span) block on Hopper's warpgroup MMA
// (`wgmma`, sm_90a), causal by absolute position and under the optional mask of common.cuh
// (query tiles that see none of a CTA's keys skipped, partly hidden ones masked). Same contract
// as the mma.sync kernel in backward.cu (all three gradients accumulate in f32; dQ and dK carry
// the softmax scale), which stays the kernel for other GPUs. Head dims up to 128: 80 and 96
// run in the tiles of 128 (WG_DIM, wgmma.cuh), their extra columns zeros; 192 and 256 have a
// kernel of their own, backward_wgmma_wide.cu. What the two share: backward_wgmma.cuh.
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
//  2. Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e), dSᵀ = Pᵀ∘(dPᵀ − D) times the softmax scale (so
//     that dQ and dK carry it) in registers, and dSᵀ into shared memory;
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
// in two warps (bench/HISTORY.md, v7 and v18). The loading and reducing warps alone,
// in place of loads and reductions issued by the computing warpgroups between CTA barriers,
// lost 1–2% at head dim 128 and 8% at 64; with the turns and the late dQ the backward gained
// 3–9% at 128, 7% at 96, and is level at 64 (v21).
// Compared with the per-warp mma.sync kernel, B operands are read from shared memory once per
// warpgroup instead of once per warp, which is what limited that kernel (81% shared-memory
// throughput, bench/HISTORY.md).

#if BWD_WGMMA && !WIDE_HEADS

// dQ's staged tile has WG_DIM / 32 boxes a part: tiles of 128 columns have one part (each
// warpgroup fills its 64 columns), head dim 64 one per warpgroup (each holds a sum over its own
// keys).
#define WG_DQ_PARTS (WG_DIM == 128 ? 1 : 2)
#define WG_DQ_PART (WG_DIM / 32 * WG_DQ_BOX)

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

// acc (dK or dV, D/2 accumulators) += A·B over a 64-query tile, A in registers (Pᵀ or dSᵀ, one
// fragment per 16-query step) and B the tile's Q or dO (descriptor b), MN-major: per step one
// product per column atom of the tile, the second over the D − 64 columns of the head dim it
// holds.
__device__ __forceinline__ void kv_grad_products(float* acc, const u32 (*a)[4], u64 b) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u64 step = wg_desc_at(b, kk * 16 * 128);
        wg_rs(acc, a[kk], step);
        if constexpr (WG_DIM == 128)
            wg_rs_n<HEAD_DIM - 64>(acc + 32, a[kk], wg_desc_at(step, WG_BQ * 128));
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) bwd_block(BWD_BLOCK_PARAMS) {
    constexpr int D = HEAD_DIM;
    constexpr int DH = WG_DIM / 64;             // column atoms of a tile row
    const int wg = warpgroup_index();           // warpgroup: keys 64·wg.., dQ columns 64·wg..
    const int wi = (threadIdx.x / 32) % 4;      // warp within the warpgroup: rows 16·wi..
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    BwdCta cta;
    if (!bwd_cta(&cta, Q, K, V, dO, LSE, Dl, dQ, dK, dV, kv_direct, heads, kv_heads, q_len,
                 kv_len, q_start, kv_start, qs, kvs, row_start, row_end, global, turns))
        return;
    const CtaWork work = cta.work;
    const int n_kt = cta.n_kt, c0 = cta.c0, t_begin = cta.t_begin, n_qt = cta.n_qt;
    int* const dq_turn_row = cta.dq_turn_row;
    const BwdHead op = cta.op;
    const int head = cta.head, batch = cta.batch;

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
        init_ring(full, empty, 2, 2 + 32);  // Q's and dO's tiles, every lane's vectors
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
            // speed at d96: bench/HISTORY.md, v18), its LSE, D and row starts by
            // cp.async from every lane, the first two then formed for the computing warpgroups
            // (form_row_vectors); into stage n % 2 once tile n − 2 is done with it.
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
                form_row_vectors<true, true>(sL + st * WG_BQ * 4, sD + st * WG_BQ * 4, scale, bar);
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
            reducer_finish(cta, turns, heads, kv_heads, q_len, q_start, kv_start, global,
                           kv_direct);
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
    const u64 dq_k = wg_desc(sK + dq_atom + dq_keys);
    auto dq_products = [&](float* acc, int n) {
        const u64 ds = wg_desc(sdS + (n % 3) * DS_TILE + dq_keys);
#pragma unroll
        for (int kk = 0; kk < DQ_KEYS / 16; ++kk)
            wg_ss<1, 1>(acc, wg_desc_at(ds, kk * 16 * 128), wg_desc_at(dq_k, kk * 16 * 128),
                        kk > 0);
    };
    // Stages this warpgroup's share of a tile's dQ for the reducing warp, once its reductions
    // have read the last tile's: columns dq_col.. of its part.
    const u32 dq_at = dq_pairs_base(sdQ + (DH == 2 ? 0 : wg) * WG_DQ_PART +
                                        (dq_col / 32) * WG_DQ_BOX,
                                    wi * 16 + g);
    auto stage_dq = [&](const float* acc) {
        named_sync(BAR_DQ_EMPTY + wg, DQ_RETURN);
        store_dq_pairs<8>(dq_at, acc);
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
        const int kl = wg * 64 + wi * 16 + g;  // this thread's key rows kl, kl + 8
        scores_to_probs(s, cL, cR, row_start, r0, c0, kl, q_len, kv_len, q_start, kv_start,
                        global, scale_log2);
        wg_wait<0>();  // dPᵀ
        fence_regs<32>(dp);
        scores_grad(dp, s, cD, scale);
        u32 pa[4][4], da[4][4];
        pack_fragments(pa, s);
        pack_fragments(da, dp);
        // dSᵀ into buffer n % 3, before this warpgroup's second turn: the other warpgroup's dQ
        // of this tile comes in its second turn after that (turns alternate), and the last
        // reader of the buffer, dQ of tile n − 3, finished before the other warpgroup's first
        // turn of tile n − 1 ended.
        store_score_fragments(sdS + (n % 3) * DS_TILE, da, kl);
        fence_async_smem();

        // ---- 3. dV += Pᵀ·dO (K = 64 queries; B = dO MN-major, one product per column atom,
        // the second only over the head dim's columns), the last tile's dQ, and dK += dSᵀ·Q
        // (B = Q MN-major), which runs while that dQ goes to shared memory.
        float acc[32];
        take_turn(wg);
        wg_fence();
        kv_grad_products(dv, pa, wg_desc(cdO));
        if (!first) dq_products(acc, n - 1);
        wg_commit();
        kv_grad_products(dk, da, wg_desc(cQ));
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

    // dK and dV through shared memory from K's tile on (f32: over V's and the query stages too).
    static_assert(2 * kv_stage_tile<false>() <= 2 * KV_TILE + 4 * Q_TILE, "dK, dV staging");
    const int kl = wg * 64 + wi * 16 + g;
    auto column = [&](int nt) { return nt * 8 + 2 * t; };
    kv_grads_out<D / 8>(dk, dv, kl, column, cta, turns, heads, kv_heads, q_len, kv_len);
}
#endif  // BWD_WGMMA && !WIDE_HEADS
