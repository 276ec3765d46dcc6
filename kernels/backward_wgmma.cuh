// What the two wgmma backward kernels share: backward_wgmma.cu (head dims up to 128: a CTA of
// 128 keys, 64 for each computing warpgroup) and backward_wgmma_wide.cu (192 and 256: a CTA of
// 64 keys, whose two computing warpgroups split the work of every tile between them). Both have
// two computing warpgroups and a third whose first warp loads the query tiles and whose second
// adds dQ by TMA reductions; both take backward.cu's parameters (the host launches every
// backward kernel the same way; the pointers to Q, dO and dQ go unused), then the tensor maps
// that Q and dO are loaded and dQ is reduced through. Here: the CTA's shape and place, the
// hardware barriers both use, dQ's staging layout, the score products, the probabilities, dSᵀ's
// tile, the deterministic turns at the ends of a CTA, and dK's and dV's way out.
// Tiles and wgmma helpers: wgmma.cuh.

#if BWD_WGMMA

#define WG_BQ 64
// Keys per CTA: 64 per computing warpgroup; at head dims 192 and 256 the two share 64 (their
// dK and dV over a row of the head dim would not fit one warpgroup's registers).
#define WG_BKV (WIDE_HEADS ? 64 : 128)
// Two warpgroups compute; a third loads (its first warp) and adds dQ (its second).
#define WG_CONSUMERS 256
#define WG_THREADS 384
#define WG_LOADER (WG_CONSUMERS / 32)
#define WG_REDUCER (WG_LOADER + 1)
// Hardware barriers besides 0 (__syncthreads') and the ping-pong turns' 1 and 2 (wgmma.cuh):
// the computing warpgroups' own (3); those between them and the reducing warp: a query tile's
// dQ is staged (4: the narrow kernel's, where both warpgroups arrive; the wide kernel has one per
// warpgroup, BAR_DQ_FULL_OF) and a warpgroup's share has been read by the reductions (5 and 6,
// one per warpgroup, which waits); the deterministic GQA turn at dK and dV (7: the reducing
// warp has it; 12: the computing warpgroups have added, `kv_turns`). Each hand-over in one
// direction has a barrier of its own: a warp that arrives on a barrier and then waits on it
// again may count twice in one phase if the other side has not come yet, which hung the
// deterministic GQA backward once the computing warpgroups reached the turn later (kernels v31).
#define BAR_COMPUTE 3
#define BAR_DQ_FULL 4
#define BAR_DQ_EMPTY 5  // and 6
#define BAR_KV_TURN 7
#define BAR_KV_ADDED 12
#define DQ_HANDOFF (WG_CONSUMERS + 32)
#define DQ_RETURN (128 + 32)
// dQ leaves through shared memory in its TMA reductions' layout: boxes of 32 f32 columns × 64
// rows (8 KiB) in the 128-byte swizzle.
#define WG_DQ_BOX (WG_BQ * 128)

// The parameters of both kernels' entry point, bwd_block.
#define BWD_BLOCK_PARAMS                                                                       \
    const u16 *__restrict__ Q, const u16 *__restrict__ K, const u16 *__restrict__ V,          \
        const u16 *__restrict__ dO, const float *__restrict__ LSE,                            \
        const float *__restrict__ Dl, float *__restrict__ dQ, void *__restrict__ dK,          \
        void *__restrict__ dV, int kv_direct, int heads, int kv_heads, int q_len, int kv_len, \
        int q_start, int kv_start, Strides qs, Strides kvs, const int *__restrict__ row_start, \
        const int *__restrict__ row_end, int global, float scale, int *__restrict__ turns,    \
        const __grid_constant__ BwdMaps maps

// The tensor maps the host passes after the other parameters, back to back (the wgmma kernels'
// maps in blocks.rs): Q's and dO's for the loads, dQ's for the reductions.
struct BwdMaps {
    TensorMap q, dO, dQ;
};

// Where a CTA works: its (batch·head, key tile) of the n_kt, its first key c0, the query tiles
// [t_begin, n_qt) that see its keys (all from the first on, without a mask), its head's dQ turns
// (deterministic mode), its operands (BwdHead) and its (head, batch) in the tensor maps.
struct BwdCta {
    CtaWork work;
    int n_kt, c0, t_begin, n_qt;
    int* dq_turn_row;
    BwdHead op;
    int head, batch;
};
// The CTA's place, from bwd_block's parameters (both kernels' prologue); false when no query of
// the block sees its keys, after taking the turns it owes (the CTA then has nothing to compute).
__device__ __forceinline__ bool bwd_cta(BwdCta* cta, const u16* Q, const u16* K, const u16* V,
                                        const u16* dO, const float* LSE, const float* Dl,
                                        float* dQ, void* dK, void* dV, int kv_direct, int heads,
                                        int kv_heads, int q_len, int kv_len, int q_start,
                                        int kv_start, Strides qs, Strides kvs,
                                        const int* row_start, const int* row_end, int global,
                                        int* turns) {
    const int n_kt = (kv_len + WG_BKV - 1) / WG_BKV;
    const CtaWork work = cta_work<BWD_KEY_MAJOR, DETERMINISTIC>(n_kt);
    const int c0 = work.tile * WG_BKV;
    int* const dq_turn_row = dq_turns(turns, work.bh, q_len, WG_BQ);
    const int2 seen = seeing_query_tiles<WG_BQ>(c0, min(c0 + WG_BKV, kv_len), q_len, q_start,
                                                kv_start, row_start, row_end, global);
    if (seen.x >= seen.y) {
        skip_turns<WG_BQ, WG_BKV>(
            dq_turn_row, kv_turns(turns, work.bh, heads, kv_heads, q_len, WG_BQ, n_kt, kv_direct),
            seen.x, work.tile, n_kt, q_len, q_start, kv_start, global,
            kv_turn(work.bh, heads, kv_heads));
        return false;
    }
    *cta = {work,
            n_kt,
            c0,
            seen.x,
            seen.y,
            dq_turn_row,
            bwd_head(Q, K, V, dO, LSE, Dl, dQ, dK, dV, kv_direct, work.bh, heads, kv_heads, q_len,
                     qs, kvs),
            work.bh % heads,
            bh_batch(work.bh, heads)};
    return true;
}

// Initialises the barriers (8 bytes each) of a ring of `stages` stages of query tiles: stage
// st's "full" at full + 8·st, whose phase ends with `arrivals` arrivals (one arming each TMA
// tile's bytes, one per loading lane for the vectors it copies), and its "empty" at
// empty + 8·st, whose phase ends when both computing warpgroups are done with it. Thread 0;
// fence_mbar_init and a CTA barrier follow.
__device__ __forceinline__ void init_ring(u32 full, u32 empty, int stages, int arrivals) {
    for (int st = 0; st < stages; ++st) {
        mbar_init(full + 8 * st, arrivals);
        mbar_init(empty + 8 * st, 2);
    }
}

// Byte offset of dQ's (row, col) within a staged tile: box col / 32, rows of 128 bytes, their
// 16-byte chunks XORed by row % 8 (the swizzle of the host's map). A warp's 8 rows × 4 pairs of
// one store land on distinct banks.
__device__ __forceinline__ u32 sdq_offset(int row, int col) {
    return (u32)((col / 32) * WG_DQ_BOX + row * 128 + ((((col % 32) / 4) ^ (row % 8)) << 4) +
                 (col % 4) * 4);
}

// acc = A·Bᵀ over the head dim for step 1 (Sᵀ or dPᵀ): A 64 rows of K or V at a (in a tile of
// WG_BKV rows), B the query tile's Q or dO at b, both K-major; 16 columns a step, none over the
// padding, the step's offset within its column atom of 128 bytes.
__device__ __forceinline__ void head_dim_product(float* acc, u32 a, u32 b) {
    const u64 da = wg_desc(a), db = wg_desc(b);
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
        wg_ss<0, 0>(acc, wg_desc_at(da, kmajor_step(kk, WG_BKV)),
                    wg_desc_at(db, kmajor_step(kk, WG_BQ)), kk > 0);
}

// The loading warp's part in a query tile's per-row vectors, once its cp.async copies of them
// (load_vec: rows lane, lane + 32 of each) have landed: it waits for its own copies and puts its
// rows of the LSE (at shared address lse, with FORM_LSE) into base 2, +∞ for a row that sees no
// key (LSE −∞: its probabilities come out 0), and of D (at d, with FORM_D) times the softmax
// scale, so that scores_grad's dSᵀ carries the scale and dQ and dK need no product of their own.
// Then it arrives on the stage's barrier `bar` (a release: these values and the row starts
// copied beside them are visible to the computing warpgroups that wait on it). In the computing
// warpgroups these were 48 and 32 instructions a thread and tile (v26,
// bench/HISTORY.md); the loading warp has the time to spare, though not the
// registers for generic pointers (24: with them it spilled).
template <bool FORM_LSE, bool FORM_D>
__device__ __forceinline__ void form_row_vectors(u32 lse, u32 d, float scale, u32 bar) {
    cp_wait_all();
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = lane; i < WG_BQ; i += 32) {
        if (FORM_LSE) {
            const float x = ld_shared_f32(lse + 4 * i);
            st_shared_f32(lse + 4 * i, x == NEG_INF ? POS_INF : x * LOG2E);
        }
        if (FORM_D) st_shared_f32(d + 4 * i, ld_shared_f32(d + 4 * i) * scale);
    }
    mbar_arrive(bar);
}

// Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e) in place for scores_to_probs, from the LSE staged in
// base 2 (form_row_vectors); with TEST_PAIRS, pairs of hidden keys (causal module) and rows or
// keys past the block are exactly 0. Rows with no visible key (staged +∞) give 0 too.
template <bool TEST_PAIRS>
__device__ __forceinline__ void exp_scores(float* s, const float* cL, int r0, int c0, int kl,
                                           int q_len, int kv_len, int q_start, int kv_start,
                                           int global, float scale_log2) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int qc = nt * 8 + 2 * t;
        const float2 lse2 = *reinterpret_cast<const float2*>(cL + qc);  // 8-byte aligned: qc even
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float p = exp2f(fmaf(s[nt * 4 + e], scale_log2, (e & 1) ? -lse2.y : -lse2.x));
            if (TEST_PAIRS) {
                const int kr = c0 + kl + (e >= 2 ? 8 : 0);
                const int qr = r0 + qc + (e & 1);
                if (qr >= q_len || kr >= kv_len ||
                    key_hidden(kv_start + kr, q_start + qr, 0, global))
                    p = 0.f;
            }
            s[nt * 4 + e] = p;
        }
    }
}

// Step 2's first half: this thread's Sᵀ (keys kl and kl + 8 of the CTA's tile at c0, in the
// accumulator layout, against query rows r0 + 8·nt + 2t (+ 1)) becomes Pᵀ in place, from the
// query tile's staged LSE (cL, base 2) and row starts (cR); pairs the mask hides, and rows or
// keys past the block, exactly 0.
__device__ __forceinline__ void scores_to_probs(float* s, const float* cL, const int* cR,
                                                const int* row_start, int r0, int c0, int kl,
                                                int q_len, int kv_len, int q_start,
                                                int kv_start, int global, float scale_log2) {
    const int t = threadIdx.x % 4;
    const int rs_last = staged_row_start(cR, row_start, min(WG_BQ, q_len - r0) - 1);
    const bool need_mask = (r0 + WG_BQ > q_len) || (c0 + WG_BKV > kv_len) ||
                           tile_partly_hidden<WG_BKV>(kv_start + c0, q_start + r0, rs_last,
                                                     global);
    // The masked module tests pairs in a pass of its own that sets hidden scores to −∞ (the loop
    // below then gives them P = 0 exactly), taken only by the tiles that need it: with the test
    // inside the softmax loop under a run-time flag, ptxas predicated it onto every tile of the
    // masked module, whose backward then ran 12.6% under the causal module's on a nearly causal
    // mask (16K, window 16383: 15.16 against 13.46 ms, bench/results/offload-256k-2026-12-01).
    // The causal module keeps its diagonal test in the loop: as a pass, its 128K backward ran
    // 23% slower (1035 against 842 ms, bench/results/masks-smem-2026-12-01/call3). The mma.sync
    // kernel keeps the test in its loop in both: as a pass it spilled at head dim 256.
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
    // The causal module's tiles on the diagonal or the edges test every pair; the others take a
    // copy of the loop without the test (one branch a tile, where a test per pair cost 32).
    if (!MASKED && need_mask)
        exp_scores<true>(s, cL, r0, c0, kl, q_len, kv_len, q_start, kv_start, global,
                         scale_log2);
    else
        exp_scores<false>(s, cL, r0, c0, kl, q_len, kv_len, q_start, kv_start, global,
                          scale_log2);
}

// Step 2's second half: dSᵀ = Pᵀ∘(dPᵀ − D), times the softmax scale, in place of this thread's
// dPᵀ (accumulator layout, query columns 8·nt + 2t and + 1), from its Pᵀ and the query tile's D
// staged times the scale (cD, form_row_vectors): Pᵀ∘(scale·dPᵀ − scale·D), a fused multiply-add
// where the difference was a subtraction, so the scale costs nothing here.
__device__ __forceinline__ void scores_grad(float* dp, const float* p, const float* cD,
                                            float scale) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const float2 d = *reinterpret_cast<const float2*>(cD + nt * 8 + 2 * t);  // 8-byte aligned
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dp[nt * 4 + e] = p[nt * 4 + e] * fmaf(dp[nt * 4 + e], scale, (e & 1) ? -d.y : -d.x);
    }
}

// Where this thread's pairs of a tile of dSᵀ go ([key][query], 64 queries of 16 bits: one
// 128-byte row a key in the 128-byte swizzle, the layout of wgmma's descriptors; the tile
// 1024-byte aligned): the pair of fragment register r of step kk, for key row kl (r even) or
// kl + 8 (r odd), lies at score_pair_at(score_pairs_base(tile, kl), kk, r). Its 16-byte chunk
// is (2kk + r / 2) ^ (kl % 8), so one base per thread and an XOR with a constant per pair
// (addresses held per pair cost the wide kernel's registers).
__device__ __forceinline__ u32 score_pairs_base(u32 tile, int kl) {
    return tile + kl * 128 + ((kl % 8) << 4) + 4 * (threadIdx.x % 4);
}
__device__ __forceinline__ u32 score_pair_at(u32 base, int kk, int r) {
    return (base ^ ((2 * kk + r / 2) << 4)) + (r & 1) * 1024;
}
// This thread's A fragments of dSᵀ (or any 64-query tile of scores) into the tile at `tile`.
__device__ __forceinline__ void store_score_fragments(u32 tile, const u32 (*x)[4], int kl) {
    const u32 base = score_pairs_base(tile, kl);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) st_shared_u32(score_pair_at(base, kk, r), x[kk][r]);
}

// Stages this thread's pairs of a dQ tile (NT accumulator tiles of 8 columns: wg_rs's layout,
// carrying the softmax scale from dSᵀ) in sdq_offset's layout, from `at` = dq_pairs_base of the
// tile's first column: rows 16·wi + g (+ 8), columns 8·nt + 2t from there. The pair's 16-byte
// chunk is (2·(nt % 4) + t / 2) ^ g = 2·(nt % 4) ^ (t / 2 ^ g): one base address and an XOR
// with a constant per store (sdq_offset's per pair held four more registers across the narrow
// kernel's loop, and its masked module spilled).
__device__ __forceinline__ u32 dq_pairs_base(u32 tile, int row) {
    const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
    return tile + row * 128 + (((t / 2) ^ g) << 4) + (t % 2) * 8;
}
template <int NT>
__device__ __forceinline__ void store_dq_pairs(u32 at, const float* acc) {
    // A 64-bit store is served a half warp (rows g = 0..3 or 4..7) at a time, and rows g and
    // g ^ 1 XOR their chunks within one pair: stored alike, they share banks (four wavefronts a
    // store instead of two). So at step k of a box, threads of odd rows store their tile k ^ 2:
    // the half warp's rows then cover the box's four pairs of chunks once.
    const bool odd = (threadIdx.x / 4) % 2;
    const u32 base = at ^ (odd ? 4 << 4 : 0);
#pragma unroll
    for (int b = 0; b < NT / 4; ++b) {
        float v[4][4];  // [step][pair element]: tile 4b + (step ^ 2·odd), by selects
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                v[k][e] = odd ? acc[(4 * b + (k ^ 2)) * 4 + e] : acc[(4 * b + k) * 4 + e];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k)
                st_shared_f32x2((base ^ ((2 * k) << 4)) + b * WG_DQ_BOX + i * 1024,
                                v[k][2 * i], v[k][2 * i + 1]);
    }
}

// Deterministic: this thread's dQ reductions have written dQ (not only read shared memory), and
// the writes are ordered before the CTA's next pass of a turn.
__device__ __forceinline__ void finish_dq_adds() {
    bulk_wait();
    fence_proxy_async_global();
    __threadfence();
}

// The reducing warp after its last query tile: its reductions have read their shared tile
// (deterministic, they have finished: finish_dq_adds; otherwise their writes complete with the
// grid, as a TMA store's do), then it takes the deterministic turns the CTA still owes: dQ's at
// query tiles it does not see (global keys), and its GQA group's at dK and dV, which it takes
// for the computing warpgroups (they add once it comes and fence before they arrive,
// `kv_turn_begin`/`kv_turn_end`), since a thread of theirs spinning for it spilled 740 bytes of
// their registers.
__device__ __forceinline__ void reducer_finish(const BwdCta& cta, int* turns, int heads,
                                               int kv_heads, int q_len, int q_start,
                                               int kv_start, int global, int kv_direct) {
    constexpr int R = WG_REDUCER * 32;  // this warp's first thread: the adder
    const int lane = threadIdx.x % 32;
    if (lane == 0 && !DETERMINISTIC) bulk_wait_read();  // the writes finish with the grid
    pass_unseen_dq_turns<WG_BQ, WG_BKV, R>(cta.dq_turn_row, cta.n_qt, cta.work.tile, cta.n_kt,
                                           q_len, q_start, kv_start, global);
    int* const kv = kv_turns(turns, cta.work.bh, heads, kv_heads, q_len, WG_BQ, cta.n_kt,
                             kv_direct);
    if (kv) {
        if (lane == 0) wait_add_turn(kv + cta.work.tile, kv_turn(cta.work.bh, heads, kv_heads));
        __syncwarp();
        named_arrive(BAR_KV_TURN, DQ_HANDOFF);
        named_sync(BAR_KV_ADDED, DQ_HANDOFF);
        if (lane == 0) pass_add_turn(kv + cta.work.tile);
    }
}
// The computing warpgroups' side of that turn, around their additions to dK and dV: whether
// they take part (deterministic GQA), and if so the reducing warp has the turn.
__device__ __forceinline__ bool kv_turn_begin(const BwdCta& cta, int* turns, int heads,
                                              int kv_heads, int q_len, int kv_direct) {
    const bool taken = kv_turns(turns, cta.work.bh, heads, kv_heads, q_len, WG_BQ, cta.n_kt,
                                kv_direct) != nullptr;
    if (taken) named_sync(BAR_KV_TURN, DQ_HANDOFF);
    return taken;
}
// Their additions are made visible and the reducing warp passes the turn on.
__device__ __forceinline__ void kv_turn_end(bool taken) {
    if (taken) {
        __threadfence();
        named_arrive(BAR_KV_ADDED, DQ_HANDOFF);
    }
}

// ---- dK and dV out of the CTA, through shared memory. Stored from the accumulators, each
// warp-wide store wrote 4 bytes into each of 8 rows (8 cache lines a store, 64 stores a thread
// for the two gradients): ~10K cycles a CTA, the length of two query tiles, where a CTA at 8K
// runs 65 (bench/results/short-bwd-2026-12-04, call 1). Staged first, the tile leaves in 16-byte
// vectors, a warp's 32 of them covering whole rows: stored in 16 bits (`kv_direct`), or added
// into the f32 accumulator of a GQA group by vector reductions.

// Bytes of one staged element (16-bit, or f32 for GQA's accumulators) and of one staged tile:
// WG_BKV key rows of WG_DIM columns.
template <bool DIRECT>
constexpr int KV_ELEM = DIRECT ? 2 : 4;
template <bool DIRECT>
__host__ __device__ constexpr u32 kv_stage_tile() {
    return WG_BKV * WG_DIM * KV_ELEM<DIRECT>;
}
// Byte offset of 16-byte chunk `chunk` of staged row `row`: rows of WG_DIM elements (a multiple
// of 128 bytes), the chunks XORed by row % 8 (16-bit) or 2·(row % 8) (32-bit, where a
// half-warp's pairs span two chunks a row), so that a warp's pairs (8 rows × 4 pairs) and a
// quarter-warp's reads of 8 chunks of a row fall on distinct banks.
template <bool DIRECT>
__device__ __forceinline__ u32 kv_stage_offset(int row, int chunk) {
    const int swizzle = DIRECT ? row % 8 : (row % 8) << 1;
    return (u32)(row * (WG_DIM * KV_ELEM<DIRECT>) + ((chunk ^ swizzle) << 4));
}
// Stages the pair (x, y) of key row `row`, columns col and col + 1 (col even).
template <bool DIRECT>
__device__ __forceinline__ void stage_kv_pair(u32 tile, int row, int col, float x, float y) {
    constexpr int PER_CHUNK = 16 / KV_ELEM<DIRECT>;
    const u32 at = tile + kv_stage_offset<DIRECT>(row, col / PER_CHUNK) +
                   (col % PER_CHUNK) * KV_ELEM<DIRECT>;
    if (DIRECT)
        st_shared_u32(at, pack2(x, y));
    else
        st_shared_f32x2(at, x, y);
}
// The computing threads write (16-bit) or add (f32) the staged rows [0, rows) into g, the head's
// dK or dV, row r at element first + r·kv_row: the head dim's chunks of each row, one vector a
// thread, consecutive threads along a row.
template <bool DIRECT>
__device__ __forceinline__ void kv_grad_out(u32 tile, void* g, size_t first, int kv_row,
                                            int rows) {
    constexpr int PER_CHUNK = 16 / KV_ELEM<DIRECT>;
    constexpr int CHUNKS = HEAD_DIM / PER_CHUNK;  // of a row, over the head dim
    staged_rows_out<WG_BKV, CHUNKS, WG_CONSUMERS>(
        threadIdx.x, rows,
        [&](int row, int c) { return tile + kv_stage_offset<DIRECT>(row, c); },
        [&](int row, int c, uint4 v) {
            const size_t o = first + (size_t)row * kv_row + c * PER_CHUNK;
            if (DIRECT)
                *reinterpret_cast<uint4*>(reinterpret_cast<u16*>(g) + o) = v;
            else
                red_add4(reinterpret_cast<float*>(g) + o, v);
        });
}
// The end of both kernels' computing warpgroups, once their last products have completed: this
// thread's NT column groups of dK and dV (accumulator element 4·nt + 2i + {0, 1}: key row
// kl + 8i of the CTA, columns column(nt)..+1) staged from the base of shared memory on (K's
// tile in both kernels; free, since both warpgroups are done with K, V and the query stages the
// staging overlays, all below the dSᵀ tiles), then out, in the deterministic GQA turn where
// there is one (kv_turn_begin/kv_turn_end, above). In 16 bits or in f32 (DIRECT: kv_grads_out).
template <bool DIRECT, int NT, class Column>
__device__ __forceinline__ void kv_grads_out_as(const float* dk, const float* dv, int kl,
                                                Column column, const BwdCta& cta, int* turns,
                                                int heads, int kv_heads, int q_len, int kv_len) {
    const u32 sdK = smem_base1024_again(), sdV = sdK + kv_stage_tile<DIRECT>();
    named_sync(BAR_COMPUTE, WG_CONSUMERS);  // both warpgroups' products have read the tiles
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int e = nt * 4 + 2 * i;
            stage_kv_pair<DIRECT>(sdK, kl + 8 * i, column(nt), dk[e], dk[e + 1]);
            stage_kv_pair<DIRECT>(sdV, kl + 8 * i, column(nt), dv[e], dv[e + 1]);
        }
    named_sync(BAR_COMPUTE, WG_CONSUMERS);  // staged
    const bool taken = kv_turn_begin(cta, turns, heads, kv_heads, q_len, cta.op.kv_direct);
    const int rows = min(WG_BKV, kv_len - cta.c0);
    const size_t first = (size_t)cta.c0 * cta.op.kv_row;
    kv_grad_out<DIRECT>(sdK, cta.op.dK, first, cta.op.kv_row, rows);  // dSᵀ had the scale
    kv_grad_out<DIRECT>(sdV, cta.op.dV, first, cta.op.kv_row, rows);
    kv_turn_end(taken);
}
template <int NT, class Column>
__device__ __forceinline__ void kv_grads_out(const float* dk, const float* dv, int kl,
                                             Column column, const BwdCta& cta, int* turns,
                                             int heads, int kv_heads, int q_len, int kv_len) {
    if (cta.op.kv_direct)
        kv_grads_out_as<true, NT>(dk, dv, kl, column, cta, turns, heads, kv_heads, q_len, kv_len);
    else
        kv_grads_out_as<false, NT>(dk, dv, kl, column, cta, turns, heads, kv_heads, q_len, kv_len);
}

#endif  // BWD_WGMMA
