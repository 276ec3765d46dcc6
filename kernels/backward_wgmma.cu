// FlashAttention backward over one (query span, key span) block on Hopper's warpgroup MMA
// (`wgmma`, sm_90a), causal by absolute position and under the optional mask of common.cuh
// (query tiles that see none of a CTA's keys skipped, partly hidden ones masked). Same contract
// as the mma.sync kernel in backward.cu (all three gradients accumulate in f32; dQ and dK carry
// the softmax scale), which stays the kernel for other GPUs. Head dims up to 128: 80 and 96
// run in the tiles of 128 (WG_DIM, wgmma.cuh), their extra columns zeros.
//
// One CTA = 128 key rows of one (batch, query head) and two warpgroups; warpgroup w owns keys
// 64w..64w+63. The CTA walks the 64-row query tiles that can see its keys, which stream through
// two stages: Q and dO by TMA (one thread, on a barrier per stage), LSE and D by cp.async. Per
// query tile, with every product an m64n64k16 wgmma:
//  1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (A = K or V, B = Q or dO; both K-major in shared memory);
//  2. Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e), dSᵀ = Pᵀ∘(dPᵀ − D) in registers;
//  3. dV += Pᵀ·dO with Pᵀ as the register A operand (the accumulator layout of step 1 is the A
//     fragment layout) and dO read MN-major from the same tile as step 1; it runs while dSᵀ goes
//     to shared memory and the warpgroups meet at the barrier that completes it;
//  4. dQ(tile) = dS·K (A = dS MN-major from the dSᵀ tile, B = K MN-major), then dK += dSᵀ·Q
//     (dSᵀ from registers, Q MN-major), which runs while dQ goes to shared memory: no step
//     waits for an empty tensor pipe after step 1. In tiles of 128 columns warpgroup w computes
//     dQ's columns 64w..64w+63 over all 128 keys; at head dim 64 each warpgroup computes all
//     columns over its own 64 keys. At the start of the next tile the first thread of each
//     warpgroup issues the TMA reductions (`cp.reduce.async.bulk.tensor`, one per 32 of the
//     columns its warpgroup stored) that add the staged tile to dQ in the background;
//     per-thread vector atomics here cost 7% of the backward's speed, one bulk reduction per
//     row 2·32 serial issues in two warps, which the others waited for at their next wgmma and
//     the dSᵀ barrier, and one thread issuing all of a tile's reductions 2% at head dim 128 and
//     8% at 64 (bench/notes/kernel-notes.md, v7, v18 and v19).
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
#define WG_THREADS 256
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

// Adds the dQ tile of query rows row0.. of (batch, head) staged at sdQ into dQ through its
// tensor map: the first thread of each warpgroup issues one TMA reduction per 32 of the columns
// its warpgroup stored (64; part wg at head dim 64), as one bulk group; rows past the end and
// padding columns fall outside the map and are not written. Deterministic, the two parts of
// head dim 64 would reach dQ in either order: the first 64 threads add part 1 of their row into
// part 0 first, and thread 0 reduces that alone.
__device__ __forceinline__ void add_dq_tile(const TensorMap* map, u32 sdQ, unsigned char* pdQ,
                                            int row0, int head, int batch) {
    const bool summed = DETERMINISTIC && WG_DQ_PARTS == 2;
    if (summed) {
        if (threadIdx.x >= WG_BQ) return;
        const int row = threadIdx.x;
#pragma unroll
        for (int c = 0; c < HEAD_DIM; c += 4) {
            float4* mine = reinterpret_cast<float4*>(pdQ + sdq_offset(row, c));
            const float4 a = *mine;
            const float4 b =
                *reinterpret_cast<const float4*>(pdQ + WG_DQ_PART + sdq_offset(row, c));
            *mine = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
        fence_async_smem();
        named_sync(1, WG_BQ);  // the first two warps: part 0 complete
    }
    if (threadIdx.x % 128 != 0 || (summed && threadIdx.x != 0)) return;
    if (DETERMINISTIC) fence_proxy_async_global();  // after the turn's acquire
    const int wg = threadIdx.x / 128;
    const int col0 = WG_DQ_PARTS == 1 ? 64 * wg : 0;  // the first of its warpgroup's columns
    const u32 part = sdQ + (WG_DQ_PARTS == 1 ? 0 : wg) * WG_DQ_PART;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = col0 + 32 * i;
        if (c < HEAD_DIM) tma_reduce_add(part + (c / 32) * WG_DQ_BOX, map, c, row0, head, batch);
    }
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
    unsigned char* gen;
    const u32 base = smem_base1024(&gen);
    const u32 sK = base;
    const u32 sV = sK + KV_TILE;
    const u32 sQ = sV + KV_TILE;            // two stages
    const u32 sdO = sQ + 2 * Q_TILE;        // two stages
    const u32 sdS = sdO + 2 * Q_TILE;       // dSᵀ [key][query], 128-byte rows
    const u32 sdQ = sdS + WG_BKV * WG_BQ * 2;  // the last tile's dQ, WG_DQ_PARTS parts
    const u32 sL = sdQ + WG_DQ_PARTS * WG_DQ_PART;  // two stages of LSE, then two of D
    const u32 sD = sL + 2 * WG_BQ * 4;
    const u32 sR = sD + 2 * WG_BQ * 4;      // two stages of the rows' mask starts
    const u32 barQ = sR + 2 * WG_BQ * 4;    // per stage: its Q and dO tiles have landed
    const float* fL = reinterpret_cast<const float*>(gen + (sL - base));
    const float* fD = reinterpret_cast<const float*>(gen + (sD - base));
    const int* iR = reinterpret_cast<const int*>(gen + (sR - base));
    unsigned char* pdS = gen + (sdS - base);
    unsigned char* pdQ = gen + (sdQ - base);

    // Thread 0 loads a query tile's Q and dO into a stage by TMA (two arrivals on its barrier,
    // each arming its tile's bytes; rows past the end and padding columns land as zeros), in
    // place of 16 cp.async per thread and tile: 1.12× the backward's speed at d96, whose copies
    // included zero fills, and level at 64 and 128 (bench/notes/kernel-notes.md, v18).
    auto load_query_tile = [&](int st, int row0) {
        if (threadIdx.x != 0) return;
        tma_tile<WG_BQ>(sQ + st * Q_TILE, &maps.q, row0, head, batch, barQ + 8 * st);
        tma_tile<WG_BQ>(sdO + st * Q_TILE, &maps.dO, row0, head, batch, barQ + 8 * st);
    };
    if (threadIdx.x == 0) {
        mbar_init(barQ, 2);
        mbar_init(barQ + 8, 2);
        fence_mbar_init();  // the loop's first barrier shows them to the other threads
    }
    load_query_tile(0, t_begin * WG_BQ);
    load_tile<WG_BKV, WG_THREADS, true, WG_DIM>(sK, op.K, op.kv_row, c0, kv_len);
    load_tile<WG_BKV, WG_THREADS, true, WG_DIM>(sV, op.V, op.kv_row, c0, kv_len);
    load_vec<WG_BQ>(sL, op.LSE, t_begin * WG_BQ, q_len);
    load_vec<WG_BQ>(sD, op.D, t_begin * WG_BQ, q_len);
    load_row_starts<WG_BQ>(sR, row_start, q_start, t_begin * WG_BQ, q_len);
    cp_commit();

    // dK and dV for this warpgroup's 64 keys (accumulator layout over the head dim: its first
    // column atom, then the rest, D − 64 columns, where the tile has a second).
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    const u32 k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;

    for (int qt = t_begin; qt < n_qt; ++qt) {
        cp_wait<0>();
        fence_async_smem();
        if (DETERMINISTIC && qt > t_begin)
            wait_dq_turn<WG_BQ, WG_BKV>(dq_turn_row, qt - 1, work.tile, n_kt, q_start, kv_start);
        __syncthreads();  // tile qt's vectors landed; the last tile's wgmmas are done with sdS and
                          // its stage
        stage_wait<2>(barQ, qt - t_begin);  // tile qt's Q and dO
        if (qt > t_begin) add_dq_tile(&maps.dQ, sdQ, pdQ, (qt - 1) * WG_BQ, head, batch);
        const int stage = (qt - t_begin) & 1;
        if (qt + 1 < n_qt) {
            const int ns = stage ^ 1;
            const int nr = (qt + 1) * WG_BQ;
            load_query_tile(ns, nr);
            load_vec<WG_BQ>(sL + ns * WG_BQ * 4, op.LSE, nr, q_len);
            load_vec<WG_BQ>(sD + ns * WG_BQ * 4, op.D, nr, q_len);
            load_row_starts<WG_BQ>(sR + ns * WG_BQ * 4, row_start, q_start, nr, q_len);
        }
        cp_commit();
        const u32 cQ = sQ + stage * Q_TILE, cdO = sdO + stage * Q_TILE;
        const float* cL = fL + stage * WG_BQ;
        const float* cD = fD + stage * WG_BQ;
        const int* cR = iR + stage * WG_BQ;
        const int r0 = qt * WG_BQ;

        // ---- 1. Sᵀ and dPᵀ: 64 keys × 64 queries, K = head dim (steps of 16, none over the
        // padding), in two groups: Pᵀ's exponentials (step 2) run while dPᵀ's products do.
        float s[32], dp[32];
        wg_fence();
        head_dim_product(s, k_rows, cQ);
        wg_commit();
        head_dim_product(dp, v_rows, cdO);
        wg_commit();
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

        // ---- 3. dV += Pᵀ·dO (K = 64 queries; B = dO MN-major, one product per column atom,
        // the second only over the head dim's columns). It runs while dSᵀ goes to shared memory
        // and the warpgroups meet at the barrier.
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            kv_grad_products(dv, pa[kk], cdO + kk * 16 * 128);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int q = kk * 16 + half * 8 + 2 * t;
                *reinterpret_cast<u32*>(pdS + swz128(WG_BKV, kl, q)) = da[kk][2 * half];
                *reinterpret_cast<u32*>(pdS + swz128(WG_BKV, kl + 8, q)) = da[kk][2 * half + 1];
            }
        fence_async_smem();
        if (DETERMINISTIC)
            finish_dq_adds();
        else
            bulk_wait_read();  // the last tile's dQ has left sdQ
        __syncthreads();       // dSᵀ complete (both warpgroups); sdQ free
        if (DETERMINISTIC && qt > t_begin && threadIdx.x == 0)
            pass_add_turn(dq_turn_row + qt - 1);

        // ---- 4. dQ(tile) = dS·K, then dK += dSᵀ·Q (B = Q MN-major), which runs while dQ goes
        // to shared memory. dQ in tiles of 128 columns: warpgroup w takes columns 64w..64w+63
        // over all 128 keys; head dim 64: all 64 columns over its own 64 keys (both add to dQ).
        constexpr int DQ_KEYS = DH == 2 ? WG_BKV : 64;
        const u32 dq_keys = DH == 2 ? 0 : wg * 64 * 128;  // first key row, bytes
        const u32 dq_atom = DH == 2 ? wg * KV_ATOM : 0;
        const int dq_col = DH == 2 ? wg * 64 : 0;
        float acc[32];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < DQ_KEYS / 16; ++kk)
            wg_ss<1, 1>(acc, wg_desc(sdS + dq_keys + kk * 16 * 128),
                        wg_desc(sK + dq_atom + dq_keys + kk * 16 * 128), kk > 0);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) kv_grad_products(dk, da[kk], cQ + kk * 16 * 128);
        wg_commit();
        wg_wait<1>();  // dV and dQ done (groups complete in order); dK may run on
        fence_regs<32>(acc);
        // This thread's pairs: rows wi·16 + g (+ 8), columns dq_col + 8·nt + 2t, whose 16-byte
        // chunk in the swizzle is (2·(nt % 4) + t / 2) ^ g = 2·(nt % 4) ^ (t / 2 ^ g): one base
        // address and an XOR with a constant per store (sdq_offset's hoisted per nt held four
        // more registers across the loop, and the masked module spilled).
        const u32 dq_at = sdQ + (DH == 2 ? 0 : wg) * WG_DQ_PART + (dq_col / 32) * WG_DQ_BOX +
                          (wi * 16 + g) * 128 + (((t / 2) ^ g) << 4) + (t % 2) * 8;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                st_shared_f32x2((dq_at ^ ((2 * (nt % 4)) << 4)) + (nt / 4) * WG_DQ_BOX + i * 1024,
                                acc[nt * 4 + 2 * i] * scale, acc[nt * 4 + 2 * i + 1] * scale);
        wg_wait<0>();
        fence_regs<D / 2>(dv);
        fence_regs<D / 2>(dk);
        fence_regs<16>(&pa[0][0]);
        fence_regs<16>(&da[0][0]);
        fence_async_smem();
    }
    wait_dq_turn<WG_BQ, WG_BKV>(dq_turn_row, n_qt - 1, work.tile, n_kt, q_start, kv_start);
    __syncthreads();
    add_dq_tile(&maps.dQ, sdQ, pdQ, (n_qt - 1) * WG_BQ, head, batch);
    if (DETERMINISTIC) {
        finish_dq_adds();
        __syncthreads();
        pass_last_dq_turns<WG_BQ, WG_BKV>(dq_turn_row, n_qt - 1, work.tile, n_kt, q_len, q_start,
                                          kv_start, global);
    } else {
        bulk_wait();
    }

    int* const kv_turn_row =
        kv_turns(turns, work.bh, heads, kv_heads, q_len, WG_BQ, n_kt, kv_direct);
    wait_kv_turn(kv_turn_row, work.tile, kv_turn(work.bh, heads, kv_heads));
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
    pass_kv_turn(kv_turn_row, work.tile);
}
#endif  // BWD_WGMMA
