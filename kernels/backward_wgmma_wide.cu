// FlashAttention backward on Hopper's warpgroup MMA for head dims 192 and 256: the contract and
// entry point of backward_wgmma.cu (what the two share: backward_wgmma.cuh), whose CTA does not
// fit these head dims: two warpgroups each holding dK and dV of their own 64 keys over the whole
// head dim would need 192 or 256 accumulator registers a thread for those alone, of the 240 a
// computing warpgroup has.
//
// One CTA = 64 key rows of one (batch, query head), which its two computing warpgroups share,
// splitting each 64-row query tile's work by role and by columns:
//  - warpgroup 0 (the scores): Sᵀ = K·Qᵀ, then Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e) under the
//    mask (backward_wgmma.cuh, scores_to_probs), which it hands to warpgroup 1 in shared memory
//    in f32: each thread's 32 values where the same thread of warpgroup 1 reads them (the two
//    hold the same pairs of the 64 × 64 tile), so dS is formed from P unrounded, as in the
//    other kernels;
//  - warpgroup 1 (the gradients of the scores): dPᵀ = V·dOᵀ at the same time, then, once Pᵀ
//    is there, dSᵀ = Pᵀ∘(dPᵀ − D) times the softmax scale, which it writes to shared memory as
//    a 16-bit tile;
//  - then each accumulates over its half of the head dim's columns: dV += Pᵀ·dO and
//    dK += dSᵀ·Q (Pᵀ and dSᵀ as register A operands, warpgroup 0 reading dSᵀ back from the
//    tile), and dQ = dS·K (dS read MN-major from the tile), whose share it stages for the
//    reducing warp; at 256 a tile late, where it fills a wait (WW_DQ_LATE).
// So each warpgroup issues two and a half of a tile's five 64 × 64 × head-dim products and holds
// dK and dV over half the columns (64 + 64 registers a thread at 256). The columns: at 256,
// warpgroup w has 128w..128w+127 (column atoms 2w and 2w+1); at 192, column atom w and half w of
// atom 2 (64 + 32 columns, each product within column atoms).
// The third warpgroup loads and reduces as in backward_wgmma.cu, except that Q and dO come in
// rings of their own: Q's with LSE and the row starts, released once both warpgroups are done
// with dK, and dO's with D, released once both are done with dV (the earlier). At head dim 256
// shared memory holds two Q tiles, one dO tile and one warpgroup's share of dQ (224 KiB with K,
// V, Pᵀ and two dSᵀ tiles), so dO's ring has one stage there and the two shares of dQ go through
// the staging tile in turns; at 192 every ring has two stages and each warpgroup a staging tile
// (218 KiB with one dSᵀ tile).

#if BWD_WGMMA && WIDE_HEADS

#define WW_HALF (HEAD_DIM / 2)                  // columns of a warpgroup's share
#define WW_N0 (HEAD_DIM == 256 ? 128 : 64)      // of its first piece: whole column atoms
#define WW_N1 (WW_HALF - WW_N0)                 // of its second: half an atom (192), or none
// The buffers and dQ's schedule come from the host (`WideBackward` in src/backend/cuda/
// launch.rs, which sizes shared memory from the same values, and says why each): WW_Q_STAGES and
// WW_DO_STAGES, the stages of Q's and dO's rings; WW_DQ_BUFFERS, the staged dQ shares (one per
// warpgroup, or one they take in turns); WW_DQ_LATE, whether each warpgroup computes a tile's
// share of dQ in the next tile, where it fills a wait (warpgroup 1's beside warpgroup 0's Sᵀ,
// 0's beside its dV while 1 forms dSᵀ); WW_DS_TILES, the dSᵀ tiles that needs.
#if !defined(WW_Q_STAGES) || !defined(WW_DO_STAGES) || !defined(WW_DQ_BUFFERS) || \
    !defined(WW_DQ_LATE) || !defined(WW_DS_TILES)
#error "the wide backward's buffers are defined by the host (WideBackward::defines)"
#endif
#define WW_DQ_SHARE (WW_HALF / 32 * WG_DQ_BOX)  // bytes of one staged share
// Hardware barriers besides backward_wgmma.cuh's: Pᵀ is in shared memory (warpgroup 0 arrives,
// 1 waits), dSᵀ is (1 arrives, 0 waits), and warpgroup w's share of dQ is staged (10 + w: it
// arrives, the reducing warp waits). BAR_DQ_EMPTY + w: the staging tile may take w's share.
#define BAR_P_READY 8
#define BAR_DS_READY 9
#define BAR_DQ_FULL_OF 10  // and 11

// The descriptor of piece p (0 or 1) of warpgroup wg's columns in the MN-major tile at `tile`,
// whose column atoms are `atom` bytes apart: piece 0 is whole atoms (two at 256, `atom` apart
// in one product), piece 1 half of the third (192).
__device__ __forceinline__ u64 piece_desc(u32 tile, int wg, int p, u32 atom) {
    return p == 0 ? wg_desc(tile + (HEAD_DIM == 256 ? 2 * wg : wg) * atom, atom)
                  : wg_desc(tile + 2 * atom + wg * 64);
}
// Where warpgroup w's share of a query tile's dQ is staged, in the staging tiles at sdQ: its own
// tile, or the one both take in turns.
__device__ __forceinline__ u32 dq_share_tile(u32 sdQ, int w) {
    return sdQ + (WW_DQ_BUFFERS == 2 ? w : 0) * WW_DQ_SHARE;
}
// The head-dim column of warpgroup wg's accumulator column c (0 <= c < WW_HALF).
__device__ __forceinline__ int owned_column(int wg, int c) {
    return c < WW_N0 ? (HEAD_DIM == 256 ? 128 : 64) * wg + c : 128 + 32 * wg + (c - WW_N0);
}

// acc (dK or dV over warpgroup wg's columns, WW_HALF / 2 accumulators: its first piece, then
// its second) += A·B over a 64-query tile: A in registers (Pᵀ or dSᵀ, one fragment per 16-query
// step), B the tile's Q or dO at b, MN-major.
__device__ __forceinline__ void share_products(float* acc, const u32 (*a)[4], u32 b, int wg) {
    constexpr u32 ATOM = WG_BQ * 128;
    const u64 b0 = piece_desc(b, wg, 0, ATOM), b1 = piece_desc(b, wg, 1, ATOM);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        wg_rs_n<WW_N0>(acc, a[kk], wg_desc_at(b0, kk * 16 * 128));
        if constexpr (WW_N1 > 0)
            wg_rs_n<WW_N1>(acc + WW_N0 / 2, a[kk], wg_desc_at(b1, kk * 16 * 128));
    }
}

// dQ over warpgroup wg's columns (WW_HALF / 2 accumulators) = dS·K, not committed: K = the
// CTA's 64 keys in steps of 16, A = dS read MN-major from the dSᵀ tile at ds, B = the K tile at
// k, MN-major.
__device__ __forceinline__ void dq_share_products(float* acc, u32 ds, u32 k, int wg) {
    constexpr u32 ATOM = WG_BKV * 128;
    const u64 a0 = wg_desc(ds), b0 = piece_desc(k, wg, 0, ATOM), b1 = piece_desc(k, wg, 1, ATOM);
#pragma unroll
    for (int kk = 0; kk < WG_BKV / 16; ++kk) {
        const u64 a = wg_desc_at(a0, kk * 16 * 128);
        wg_ss_n<WW_N0, 1, 1>(acc, a, wg_desc_at(b0, kk * 16 * 128), kk > 0);
        if constexpr (WW_N1 > 0)
            wg_ss_n<WW_N1, 1, 1>(acc + WW_N0 / 2, a, wg_desc_at(b1, kk * 16 * 128), kk > 0);
    }
}

// This thread's A fragments of the dSᵀ tile at `tile` (written by the other warpgroup with
// store_score_fragments for the same key rows kl, kl + 8).
__device__ __forceinline__ void load_score_fragments(u32 (*x)[4], u32 tile, int kl) {
    const u32 base = score_pairs_base(tile, kl);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) x[kk][r] = ld_shared_u32(score_pair_at(base, kk, r));
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) bwd_block(BWD_BLOCK_PARAMS) {
    const int wg = warpgroup_index();       // 0: the scores, 1: their gradients; 2: loads, dQ
    const int me = threadIdx.x % 128;       // thread within the warpgroup
    const int wi = me / 32;                 // warp within the warpgroup: rows 16·wi..
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    BwdCta cta;
    if (!bwd_cta(&cta, Q, K, V, dO, LSE, Dl, dQ, dK, dV, kv_direct, heads, kv_heads, q_len,
                 kv_len, q_start, kv_start, qs, kvs, row_start, row_end, global, turns))
        return;
    const BwdHead op = cta.op;
    const int head = cta.head, batch = cta.batch;

    constexpr u32 KV_TILE = WG_BKV * HEAD_DIM * 2, Q_TILE = WG_BQ * HEAD_DIM * 2;
    constexpr u32 P_TILE = WG_BKV * WG_BQ * 4, DS_TILE = WG_BKV * WG_BQ * 2;
    constexpr u32 VEC = WG_BQ * 4;  // one tile's LSE, D or row starts
    unsigned char* gen;
    const u32 base = smem_base1024(&gen);
    const u32 sK = base;
    const u32 sV = sK + KV_TILE;
    const u32 sQ = sV + KV_TILE;                    // WW_Q_STAGES stages
    const u32 sdO = sQ + WW_Q_STAGES * Q_TILE;      // WW_DO_STAGES stages
    const u32 sP = sdO + WW_DO_STAGES * Q_TILE;     // Pᵀ, f32, thread by thread
    const u32 sdS = sP + P_TILE;                    // WW_DS_TILES of dSᵀ [key][query]
    const u32 sdQ = sdS + WW_DS_TILES * DS_TILE;    // WW_DQ_BUFFERS staged shares of dQ
    const u32 sL = sdQ + WW_DQ_BUFFERS * WW_DQ_SHARE;  // LSE and row starts: Q's stages
    const u32 sR = sL + WW_Q_STAGES * VEC;
    const u32 sD = sR + WW_Q_STAGES * VEC;          // D: dO's stages
    // Barriers (8 bytes each), per stage of each ring: "full" (its tile has landed: one arrival
    // arming the bytes, one per loading lane for the vectors) and "empty" (both computing
    // warpgroups are done with it). Tile n uses stage n % stages of each ring.
    const u32 q_full = sD + WW_DO_STAGES * VEC, q_empty = q_full + 8 * WW_Q_STAGES;
    const u32 do_full = q_empty + 8 * WW_Q_STAGES, do_empty = do_full + 8 * WW_DO_STAGES;
    const float* fL = reinterpret_cast<const float*>(gen + (sL - base));
    const int* iR = reinterpret_cast<const int*>(gen + (sR - base));
    const float* fD = reinterpret_cast<const float*>(gen + (sD - base));

    if (threadIdx.x == 0) {
        init_ring(q_full, q_empty, WW_Q_STAGES, 1 + 32);  // a TMA tile, every lane's vectors
        init_ring(do_full, do_empty, WW_DO_STAGES, 1 + 32);
        fence_mbar_init();
    }
    __syncthreads();  // the barriers, for every thread; the last CTA-wide barrier

    if (wg == 2) {
        regs_release<24>();
        const int warp = threadIdx.x / 32;
        if (warp == WG_LOADER) {
            // Tile n's Q (TMA) with its LSE and row starts (cp.async, every lane) into Q's stage
            // once tile n − WW_Q_STAGES is done with it, then its dO with D likewise.
            for (int n = 0; cta.t_begin + n < cta.n_qt; ++n) {
                const int row0 = (cta.t_begin + n) * WG_BQ;
                const int qst = n % WW_Q_STAGES, dst = n % WW_DO_STAGES;
                if (n >= WW_Q_STAGES) stage_wait<WW_Q_STAGES>(q_empty, n - WW_Q_STAGES);
                const u32 qbar = stage_bar<WW_Q_STAGES>(q_full, n);
                if (lane == 0) tma_tile<WG_BQ>(sQ + qst * Q_TILE, &maps.q, row0, head, batch, qbar);
                load_vec<WG_BQ>(sL + qst * VEC, op.LSE, row0, q_len, lane, 32);
                load_row_starts<WG_BQ>(sR + qst * VEC, row_start, q_start, row0, q_len, lane, 32);
                form_row_vectors<true, false>(sL + qst * VEC, 0, scale, qbar);
                if (n >= WW_DO_STAGES) stage_wait<WW_DO_STAGES>(do_empty, n - WW_DO_STAGES);
                const u32 dbar = stage_bar<WW_DO_STAGES>(do_full, n);
                if (lane == 0)
                    tma_tile<WG_BQ>(sdO + dst * Q_TILE, &maps.dO, row0, head, batch, dbar);
                load_vec<WG_BQ>(sD + dst * VEC, op.D, row0, q_len, lane, 32);
                form_row_vectors<false, true>(0, sD + dst * VEC, scale, dbar);
            }
        } else if (warp == WG_REDUCER) {
            // Each query tile's dQ, a warpgroup's share at a time in the order they are staged
            // (with the late dQ 1's first: it stages at the start of the next tile, 0 in its
            // middle); a share's staging tile is free again once its reductions have read it.
            // Deterministic, in the CTA's turn at each query tile, held over both shares.
            constexpr int R = WG_REDUCER * 32;  // this warp's first thread: the adder
            constexpr int FIRST = WW_DQ_LATE ? 1 : 0;
            const auto free_share = [](int w) { named_arrive(BAR_DQ_EMPTY + w, DQ_RETURN); };
            free_share(FIRST);
            if (WW_DQ_BUFFERS == 2) free_share(1 - FIRST);
            for (int qt = cta.t_begin; qt < cta.n_qt; ++qt)
                for (int k = 0; k < 2; ++k) {
                    const int w = k == 0 ? FIRST : 1 - FIRST;
                    named_sync(BAR_DQ_FULL_OF + w, DQ_RETURN);
                    if (k == 0)
                        wait_dq_turn<WG_BQ, WG_BKV, R>(cta.dq_turn_row, qt, cta.work.tile,
                                                       cta.n_kt, q_start, kv_start);
                    if (lane == 0) {
                        // After the turn's acquire (deterministic), the reductions.
                        if (DETERMINISTIC && k == 0) fence_proxy_async_global();
#pragma unroll
                        for (int b = 0; b < WW_HALF / 32; ++b)
                            tma_reduce_add(dq_share_tile(sdQ, w) + b * WG_DQ_BOX, &maps.dQ,
                                           owned_column(w, 32 * b), qt * WG_BQ, head, batch);
                        bulk_commit();
                        if (DETERMINISTIC && k == 1) {
                            finish_dq_adds();
                            pass_add_turn(cta.dq_turn_row + qt);
                        } else {
                            bulk_wait_read();
                        }
                    }
                    __syncwarp();
                    // The share that may be staged next: this warpgroup's next one (a tile
                    // each), or the other warpgroup's (one tile, in turns).
                    if (WW_DQ_BUFFERS == 2) {
                        if (qt + 1 < cta.n_qt) free_share(w);
                    } else if (k == 0 || qt + 1 < cta.n_qt) {
                        free_share(1 - w);
                    }
                }
            reducer_finish(cta, turns, heads, kv_heads, q_len, q_start, kv_start, global,
                           kv_direct);
        }
        return;
    }
    regs_claim<240>();

    load_tile<WG_BKV, WG_CONSUMERS, true, WG_DIM>(sK, op.K, op.kv_row, cta.c0, kv_len);
    load_tile<WG_BKV, WG_CONSUMERS, true, WG_DIM>(sV, op.V, op.kv_row, cta.c0, kv_len);
    cp_commit();
    // dK and dV over this warpgroup's columns, for the CTA's 64 keys.
    float dk[WW_HALF / 2], dv[WW_HALF / 2];
#pragma unroll
    for (int i = 0; i < WW_HALF / 2; ++i) dk[i] = dv[i] = 0.f;
    cp_wait<0>();
    fence_async_smem();
    named_sync(BAR_COMPUTE, WG_CONSUMERS);  // K and V landed

    // This thread's rows of every 64 × 64 product: key rows kl and kl + 8 of Sᵀ, dPᵀ, dK and
    // dV; query rows kl and kl + 8 of dQ. Its pairs of Pᵀ in sP: pair i at p_at + i·1024.
    const int kl = wi * 16 + g;
    const u32 p_at = sP + me * 8;
    // Stages this warpgroup's share of a query tile's dQ once the staging tile is free for it.
    const u32 dq_at = dq_pairs_base(dq_share_tile(sdQ, wg), kl);
    auto stage_dq = [&](const float* acc) {
        named_sync(BAR_DQ_EMPTY + wg, DQ_RETURN);
        store_dq_pairs<WW_HALF / 8>(dq_at, acc);
        fence_async_smem();
        named_arrive(BAR_DQ_FULL_OF + wg, DQ_RETURN);
    };

    // Tile n's dSᵀ tile: the late dQ reads tile n − 1's while tile n's is written.
    const auto ds_tile = [&](int n) { return sdS + (n % WW_DS_TILES) * DS_TILE; };
    // dQ of tile n (query rows of tile t_begin + n) over this warpgroup's columns, from its dSᵀ
    // tile, into acc (not committed); and the same issued, waited for and staged.
    auto dq_products = [&](float* acc, int n) { dq_share_products(acc, ds_tile(n), sK, wg); };
    auto dq_share = [&](int n) {
        float acc[WW_HALF / 2];
        wg_fence();
        dq_products(acc, n);
        wg_commit();
        wg_wait<0>();
        fence_regs<WW_HALF / 2>(acc);
        stage_dq(acc);
    };
    // One query tile n; `first` is a constant at each call (tile 0 has no dQ before it): a
    // wgmma under a run-time condition made ptxas serialise the pipeline (C7520) and spill.
    auto tile = [&](const int n, const bool first) {
        const int qst = n % WW_Q_STAGES, dst = n % WW_DO_STAGES;
        const u32 cQ = sQ + qst * Q_TILE, cdO = sdO + dst * Q_TILE;
        const u32 cdS = ds_tile(n);
        const bool late = WW_DQ_LATE && !first;  // this tile computes the last one's dQ
        if (wg == 0) {
            // Sᵀ, then Pᵀ for warpgroup 1 (f32) and for dV (16-bit fragments).
            stage_wait<WW_Q_STAGES>(q_full, n);
            float s[32];
            wg_fence();
            head_dim_product(s, sK, cQ);
            wg_commit();
            wg_wait<0>();
            fence_regs<32>(s);
            scores_to_probs(s, fL + qst * WG_BQ, iR + qst * WG_BQ, row_start,
                            (cta.t_begin + n) * WG_BQ, cta.c0, kl, q_len, kv_len, q_start,
                            kv_start, global, scale_log2);
#pragma unroll
            for (int i = 0; i < 16; ++i) st_shared_f32x2(p_at + i * 1024, s[2 * i], s[2 * i + 1]);
            named_arrive(BAR_P_READY, WG_CONSUMERS);
            u32 pa[4][4];
            pack_fragments(pa, s);
            // dV += Pᵀ·dO (and the late dQ) while warpgroup 1 forms dSᵀ.
            stage_wait<WW_DO_STAGES>(do_full, n);
            float acc[WW_HALF / 2];
            wg_fence();
            share_products(dv, pa, cdO, 0);
            if (late) dq_products(acc, n - 1);
            wg_commit();
            wg_wait<0>();
            fence_regs<WW_HALF / 2>(dv);
            fence_regs<16>(&pa[0][0]);
            if (me == 0) mbar_arrive(stage_bar<WW_DO_STAGES>(do_empty, n));
            if (late) {
                fence_regs<WW_HALF / 2>(acc);
                stage_dq(acc);
            }
            // dK += dSᵀ·Q over this warpgroup's columns.
            named_sync(BAR_DS_READY, WG_CONSUMERS);
            u32 da[4][4];
            load_score_fragments(da, cdS, kl);
            wg_fence();
            share_products(dk, da, cQ, 0);
            wg_commit();
            wg_wait<0>();
            fence_regs<16>(&da[0][0]);
        } else {
            // (The late dQ beside warpgroup 0's Sᵀ,) dPᵀ, then dSᵀ from warpgroup 0's Pᵀ.
            if (late) dq_share(n - 1);
            stage_wait<WW_DO_STAGES>(do_full, n);
            float dp[32];
            wg_fence();
            head_dim_product(dp, sV, cdO);
            wg_commit();
            wg_wait<0>();
            fence_regs<32>(dp);
            named_sync(BAR_P_READY, WG_CONSUMERS);
            float p[32];
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const float2 x = ld_shared_f32x2(p_at + i * 1024);
                p[2 * i] = x.x;
                p[2 * i + 1] = x.y;
            }
            scores_grad(dp, p, fD + dst * WG_BQ, scale);
            u32 pa[4][4], da[4][4];
            pack_fragments(pa, p);
            pack_fragments(da, dp);
            store_score_fragments(cdS, da, kl);
            fence_async_smem();
            named_arrive(BAR_DS_READY, WG_CONSUMERS);
            // dV and dK over this warpgroup's columns.
            stage_wait<WW_Q_STAGES>(q_full, n);
            wg_fence();
            share_products(dv, pa, cdO, 1);
            share_products(dk, da, cQ, 1);
            wg_commit();
            wg_wait<0>();
            fence_regs<WW_HALF / 2>(dv);
            fence_regs<16>(&pa[0][0]);
            fence_regs<16>(&da[0][0]);
            if (me == 0) mbar_arrive(stage_bar<WW_DO_STAGES>(do_empty, n));
        }
        fence_regs<WW_HALF / 2>(dk);
        if (me == 0) mbar_arrive(stage_bar<WW_Q_STAGES>(q_empty, n));
        if (!WW_DQ_LATE) dq_share(n);  // dQ after dK and dV
    };
    const int tiles = cta.n_qt - cta.t_begin;
    if (WW_DQ_LATE) {
        tile(0, true);
        for (int n = 1; n < tiles; ++n) tile(n, false);
        dq_share(tiles - 1);
    } else {
        for (int n = 0; n < tiles; ++n) tile(n, false);  // one copy: `first` changes nothing
    }

    // dK and dV through shared memory from K's tile on (f32: over V's and the stages too).
    static_assert(2 * kv_stage_tile<false>() <= 2 * KV_TILE + WW_Q_STAGES * Q_TILE +
                                                    WW_DO_STAGES * Q_TILE + P_TILE,
                  "dK, dV staging");
    auto column = [&](int nt) { return owned_column(wg, nt * 8 + 2 * t); };
    kv_grads_out<WW_HALF / 8>(dk, dv, kl, column, cta, turns, heads, kv_heads, q_len, kv_len);
}
#endif  // BWD_WGMMA && WIDE_HEADS
