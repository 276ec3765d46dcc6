// FlashAttention forward over one (query span, key span) block on Hopper's warpgroup MMA
// (`wgmma`, sm_90a), causal by absolute position and under the optional mask of common.cuh
// (row_start, global: wholly hidden key tiles skipped, partly hidden ones masked element by
// element). Same entry points and contract as forward.cu (fwd_final: fresh state, writes O and
// LSE; fwd_state: folds the block into a running state), which stays the kernel for other GPUs.
// Head dims 64 to 256: 80 and 96 run in the tiles of 128 (WG_DIM, wgmma.cuh), their extra
// columns zeros; S sums over the real columns only.
//
// One CTA = 128 query rows of one (batch, head): two warpgroups that compute (warpgroup w owns
// rows 64w..64w+63) and a third that only loads (one thread of it; the warpgroup gives its
// registers to the other two). Tiles of WF_BKV keys (128; 64 at head dims 192 and 256, whose O
// takes 96 or 128 registers a thread and whose five K and V stages would not fit shared memory
// at 128) stream in through its TMA loads, each stage
// with a barrier that says it is full and one on which both computing warpgroups say they are
// done with it (two stages of K, three of V: see below). There is no CTA-wide barrier in the
// loop, so one warpgroup can run up to a tile ahead of the other. Per tile j:
//   S = Q·Kᵀ     one m64n{WF_BKV}k16 wgmma per 16 head-dim columns, A = Q and B = K
//                from shared memory, both K-major;
//   online softmax in registers (base 2, scale·log2 e folded in), P packed to 16 bits as the
//                register A operand of the next product (accumulator layout = A layout);
//                at head dims 64, 192 and 256 O is rescaled lazily (LAZY_RESCALE);
//   O += P·V     one m64nDk16 wgmma per 16 keys (N = D, the head dim), B = V read MN-major.
// The products of P·V are issued one tile late, together with the next tile's S, in the
// warpgroup's ping-pong turn (wgmma.cuh; FlashAttention-3's schedule): the softmax of tile j then
// runs under this warpgroup's own P·V of tile j−1 and under the other warpgroup's products, and
// the tensor cores never wait for a softmax. The rescale of O by the new maximum waits for that
// P·V, so after tile j, O is the usual accumulator less P_j·V_j, which the next turn (or the one
// after the loop) adds. V of tile j−1 is still being read while tile j+1 loads, hence its third
// stage. After the loop fwd_final divides O by the rows' sums and writes it and the LSE; from
// head dim 128 O leaves through the warpgroup's rows of Q's tile in shared memory (O_STAGED).
// Tiles and wgmma helpers: wgmma.cuh.

#if FWD_WGMMA

#define WF_BQ 128
#define WF_BKV (WIDE_HEADS ? 64 : 128)
#define WF_THREADS 384  // two computing warpgroups and the loading one
// Hardware barriers besides 0 (__syncthreads') and the ping-pong turns' 1 and 2 (wgmma.cuh): a
// computing warpgroup's O is staged (3 and 4, one per warpgroup).
#define BAR_O_STAGED 3
// Whether O leaves fwd_final through shared memory in 16-byte vectors along whole rows (from
// head dim 128), or each thread stores its pairs of 4 bytes, a warp-wide store over 8 rows (8
// cache lines), as the backward's dK and dV did before kernels v31. Staged, the forward ran
// +1.7% at 8K for d128 and +1-2% for d192 and d256, level from 32K, and -1.2 to -1.8% for d64
// (bench/results/short-bwd-2026-12-04, call 4; why d64 loses was not measured); kept from 128
// on, +1.2% at 8K for d128 and +0.6% from 32K (bench/results/gqa-cta-2026-12-04, call 2).
#define O_STAGED (HEAD_DIM >= 128)

// Whether a row rescales O lazily: only once its maximum (base 2) has grown by more than
// RESCALE_SLACK, which it then moves to; until then P stays below 2^8, which bf16 and fp16 hold
// at their full precision and whose sums f32 holds without overflow at any length, and a warp
// whose rows all kept their maxima skips O's multiplies (FlashAttention-4's threshold). At head
// dims 192 and 256, where O takes 96 or 128 multiplies a thread and tile, the forward gained
// 5–7% (v28, bench/results/lse-scale-2026-12-04, call 3), and at 64 1.4%; at 128 it lost 1.4–3%
// (v27 and v28, calls 2 and 3) and at 96 it was level, so those tiles rescale every time a
// maximum moves.
#define LAZY_RESCALE (WIDE_HEADS || HEAD_DIM == 64)
#define RESCALE_SLACK 8.0f

// Issues O += P·V for one key tile (not committed): K = WF_BKV keys (steps of 16), N = head dim
// (V read MN-major from the tile at v, column atoms WF_BKV·128 bytes apart; none of its padding).
__device__ __forceinline__ void pv_products(float* o, const u32 (*pa)[4], u32 v) {
    wg_fence();
    const u64 dv = wg_desc(v, WF_BKV * 128);
#pragma unroll
    for (int kk = 0; kk < WF_BKV / 16; ++kk)
        wg_rs_n<HEAD_DIM>(o, pa[kk], wg_desc_at(dv, kk * 16 * 128));
}

template <bool STATE>
__device__ __forceinline__ void fwd_wg_body(const TensorMap* tmQ, const TensorMap* tmK,
                                            const TensorMap* tmV, u16* __restrict__ O,
                                            float* __restrict__ LSE, float* __restrict__ Mst,
                                            float* __restrict__ Lst, float* __restrict__ ACC,
                                            int heads, int kv_heads, int q_len, int kv_len,
                                            int q_start, int kv_start, Strides qs, Strides kvs,
                                            const int* __restrict__ row_start, int global,
                                            float scale_log2) {
    constexpr int D = HEAD_DIM;
    constexpr int HALVES = WF_BKV / 64;  // S's accumulators: one set of 32 per 64 keys
    const int wg = warpgroup_index(), wi = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    // Heaviest query tiles (most visible keys) first, so the tail of the grid is short.
    const int n_q_tiles = (q_len + WF_BQ - 1) / WF_BQ;
    const CtaWork work = cta_work<FWD_KEY_MAJOR, true>(n_q_tiles);
    const int r0 = work.tile * WF_BQ;
    const KvTiles tiles = visible_kv_tiles<WF_BQ, WF_BKV>(r0, q_len, kv_len, q_start, kv_start,
                                                          row_start, global);
    const int n_tiles = tiles.n;
    if (STATE && n_tiles == 0) return;  // the block adds nothing to these rows

    // (Q, K and V come in through their tensor maps, which carry their strides.)
    const HeadRows hr = head_rows(work.bh, heads, kv_heads, q_len, qs, kvs);
    const int b = bh_batch(work.bh, heads), h = work.bh % heads;
    const int kvh = bh_kv_head(work.bh, heads, kv_heads);

    constexpr u32 Q_TILE = WF_BQ * WG_DIM * 2, TILE = WF_BKV * WG_DIM * 2;  // TILE: K's, V's
    unsigned char* gen;
    const u32 sQ = smem_base1024(&gen);
    const u32 sK = sQ + Q_TILE;     // two stages: tile j in stage j % 2
    const u32 sV = sK + 2 * TILE;   // three stages: tile j in stage j % 3
    // Barriers (8 bytes each): Q full, K's stages full, V's full, K's empty, V's empty. The
    // n-th load into a stage ends phase n of its full barrier and the n-th release phase n of
    // its empty one; a wait names the phase's parity.
    const u32 barQ = sV + 3 * TILE, barK = barQ + 8, barV = barK + 16;
    const u32 freeK = barV + 24, freeV = freeK + 16;
    if (threadIdx.x == 0) {
        for (int b = 0; b < 6; ++b) mbar_init(barQ + 8 * b, 1);
        for (int b = 0; b < 5; ++b) mbar_init(freeK + 8 * b, 2);  // one arrival per warpgroup
        fence_mbar_init();
    }
    __syncthreads();
    if (wg == 2) {  // the loading warpgroup
        regs_release<24>();
        if (threadIdx.x == 256 && n_tiles > 0) {
            tma_tile<WF_BQ>(sQ, tmQ, r0, h, b, barQ);
            for (int n = 0; n < n_tiles; ++n) {
                if (n >= 2) stage_wait<2>(freeK, n - 2);  // tile n−2 is done with the stage
                const int row = tiles.at(n) * WF_BKV;
                tma_tile<WF_BKV>(sK + (n & 1) * TILE, tmK, row, kvh, b, stage_bar<2>(barK, n));
                if (n >= 3) stage_wait<3>(freeV, n - 3);  // tile n−3 is done with the stage
                tma_tile<WF_BKV>(sV + (n % 3) * TILE, tmV, row, kvh, b, stage_bar<3>(barV, n));
            }
        }
        return;
    }
    regs_claim<240>();
    const bool releaser = threadIdx.x % 128 == 0;  // arrives for its warpgroup

    // This thread's rows: wrow + g and wrow + g + 8; accumulator element 4·nt + e is
    // row + 8·(e ≥ 2), column 8·nt + 2t + (e & 1) (of O; of S, with halves of 64 keys).
    const int wrow = wg * 64 + wi * 16;
    // Where the mask starts this thread's rows (rs) and the warp's last row (rs_warp).
    int rs[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
        rs[i] = row_start_at(row_start, q_start + min(r0 + wrow + g + 8 * i, q_len - 1));
    const int rs_warp = row_start_at(row_start, q_start + min(r0 + wrow + 16, q_len) - 1);
    float o[D / 2];
    float m[2], l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = r0 + wrow + g + 8 * i;
        const bool ok = STATE && row < q_len;
        const size_t srow = hr.stat + row;
        m[i] = ok ? Mst[srow] * LOG2E : NEG_INF;
        l[i] = (ok && t == 0) ? Lst[srow] : 0.f;  // one lane per row carries the stored sum
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            float2 a = make_float2(0.f, 0.f);
            if (ok) a = *reinterpret_cast<const float2*>(ACC + srow * D + nt * 8 + 2 * t);
            o[nt * 4 + 2 * i] = a.x;
            o[nt * 4 + 2 * i + 1] = a.y;
        }
    }

    const u64 dq = wg_desc(sQ + wg * 64 * 128);  // this warpgroup's 64 rows of Q
    u32 pa[WF_BKV / 16][4];  // P of the previous tile as A fragments, one per 16 keys
    pingpong_start(wg);
    // One tile. The first has no previous P·V and is a separate inlined copy (`first` is a
    // constant at each call): ptxas turns a commit after a conditional wgmma into an extra group,
    // which the wait<1> below would then wait past.
    auto tile = [&](const int j, const bool first) {
        if (first) mbar_wait(barQ, 0);
        stage_wait<2>(barK, j);
        if (!first) stage_wait<3>(barV, j - 1);
        const u32 cK = sK + (j & 1) * TILE;

        // In this warpgroup's turn: S = Q·Kᵀ for 64 rows × WF_BKV keys (one m64n{WF_BKV}k16
        // per 16 head-dim columns), then O += P·V of the previous tile.
        float s[HALVES][32];
        const u64 dk = wg_desc(cK);
        take_turn(wg);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wg_ss_n<WF_BKV, 0, 0>(s[0], wg_desc_at(dq, kmajor_step(kk, WF_BQ)),
                                  wg_desc_at(dk, kmajor_step(kk, WF_BKV)), kk > 0);
        wg_commit();
        if (!first) {
            pv_products(o, pa, sV + ((j - 1) % 3) * TILE);
            wg_commit();
        }
        pass_turn(wg);
        if (first)  // S (P·V may still run)
            wg_wait<0>();
        else
            wg_wait<1>();
        fence_regs<32 * HALVES>(s[0]);
        if (releaser) mbar_arrive(stage_bar<2>(freeK, j));

        const int c0 = tiles.at(j) * WF_BKV;
        const bool need_mask = (c0 + WF_BKV > kv_len) ||
                               tile_partly_hidden<WF_BKV>(kv_start + c0, q_start + r0 + wrow,
                                                          rs_warp, global);
        if (need_mask) {
#pragma unroll
            for (int hf = 0; hf < HALVES; ++hf)
#pragma unroll
                for (int e = 0; e < 32; ++e) {
                    const int hi = (e % 4) >= 2 ? 1 : 0;
                    const int row = r0 + wrow + g + 8 * hi;
                    const int c = c0 + hf * 64 + (e / 4) * 8 + 2 * t + (e & 1);
                    if (c >= kv_len || key_hidden(kv_start + c, q_start + row, rs[hi], global))
                        s[hf][e] = NEG_INF;
                }
        }

        // Each row's new maximum (base 2, scaled). Under LAZY_RESCALE a row moves to it only
        // when it grew by more than RESCALE_SLACK, else keeps its old one, with which its P and
        // sum stay consistent; the decision is the row's own, so its exponentials wait for
        // nothing but its maximum, and O's multiplies are skipped warp by warp, once no row of
        // the warp grew (a vote they wait for anyway).
        float alpha[2];
        bool grew = false;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float mx = NEG_INF;
#pragma unroll
            for (int hf = 0; hf < HALVES; ++hf)
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
                    mx = fmaxf(mx, fmaxf(s[hf][nt * 4 + 2 * i], s[hf][nt * 4 + 2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float m_new = fmaxf(m[i], mx * scale_log2);
            // (−∞ + slack is −∞: a row's first visible key grows its maximum.)
            const bool grow = !LAZY_RESCALE || m_new > m[i] + RESCALE_SLACK;
            grew |= grow;
            const float m_to = grow ? m_new : m[i];
            // No visible key yet: keep exponents finite (avoid −∞ − (−∞)).
            const float m_use = m_to == NEG_INF ? 0.f : m_to;
            alpha[i] = exp2f(m[i] - m_use);  // exactly 1 where the row kept its maximum
            m[i] = m_to;
            float sum = 0.f;
#pragma unroll
            for (int hf = 0; hf < HALVES; ++hf)
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& x = s[hf][nt * 4 + 2 * i + c];
                        x = exp2f(fmaf(x, scale_log2, -m_use));
                        sum += x;
                    }
            l[i] = l[i] * alpha[i] + sum;
        }
        const bool rescale = !LAZY_RESCALE || __any_sync(0xffffffff, grew);

        // The previous tile's P·V is done: O, the P registers and its V stage are free.
        wg_wait<0>();
        fence_regs<D / 2>(o);
        fence_regs<WF_BKV / 4>(&pa[0][0]);
        if (releaser && !first) mbar_arrive(stage_bar<3>(freeV, j - 1));
        if (rescale) {
#pragma unroll
            for (int e = 0; e < D / 2; ++e) o[e] *= alpha[(e % 4) / 2];
        }
#pragma unroll
        for (int hf = 0; hf < HALVES; ++hf) pack_fragments(pa + 4 * hf, s[hf]);
    };
    if (n_tiles > 0) tile(0, true);
    for (int j = 1; j < n_tiles; ++j) tile(j, false);
    if (n_tiles > 0) {  // the last tile's P·V
        stage_wait<3>(barV, n_tiles - 1);
        pv_products(o, pa, sV + ((n_tiles - 1) % 3) * TILE);
        wg_commit();
        wg_wait<0>();
        fence_regs<D / 2>(o);
    }
    pingpong_end(wg);

    float inv[2];  // 1 / the row's sum (fwd_final)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float lt = l[i];
        lt += __shfl_xor_sync(0xffffffff, lt, 1);
        lt += __shfl_xor_sync(0xffffffff, lt, 2);
        inv[i] = lt > 0.f ? 1.f / lt : 0.f;
        const int row = r0 + wrow + g + 8 * i;
        if (row >= q_len) continue;
        const size_t srow = hr.stat + row;
        if (STATE) {
            if (t == 0) {
                Mst[srow] = m[i] * LN2;
                Lst[srow] = lt;
            }
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt)
                *reinterpret_cast<float2*>(ACC + srow * D + nt * 8 + 2 * t) =
                    make_float2(o[nt * 4 + 2 * i], o[nt * 4 + 2 * i + 1]);
        } else {
            if (t == 0) LSE[srow] = lt > 0.f ? (m[i] + __log2f(lt)) * LN2 : NEG_INF;
            if (!O_STAGED) {
#pragma unroll
                for (int nt = 0; nt < D / 8; ++nt)
                    *reinterpret_cast<u32*>(O + hr.q + row * hr.q_row + nt * 8 + 2 * t) =
                        pack2(o[nt * 4 + 2 * i] * inv[i], o[nt * 4 + 2 * i + 1] * inv[i]);
            }
        }
    }
    if (!STATE && O_STAGED) {
        // O leaves through this warpgroup's rows of Q's tile, which only its own products read
        // (all complete): staged as the TMA boxes hold Q (64 columns a box, 128-byte rows, 16-byte
        // chunks XORed by row % 8: a warp's 8 rows × 4 pairs on distinct banks), then written in
        // 16-byte vectors along whole rows.
        const u32 mine = smem_base1024_again() + wg * 64 * 128;  // sQ, read afresh
        auto at = [&](int row, int chunk) {
            return mine + (chunk / 8) * (WF_BQ * 128) + row * 128 +
                   (((chunk % 8) ^ (row % 8)) << 4);
        };
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int row = wi * 16 + g + 8 * i;
                st_shared_u32(at(row, nt) + 4 * t,
                              pack2(o[nt * 4 + 2 * i] * inv[i], o[nt * 4 + 2 * i + 1] * inv[i]));
            }
        named_sync(BAR_O_STAGED + wg, 128);
        constexpr int CHUNKS = D / 8;  // of a row
        static_assert(64 * CHUNKS % 128 == 0, "whole passes");
        const int rows = min(64, q_len - (r0 + wg * 64));
        u16* const out = O + hr.q + (size_t)(r0 + wg * 64) * hr.q_row;
#pragma unroll
        for (int pass = 0; pass < 64 * CHUNKS / 128; ++pass) {
            const int k = pass * 128 + threadIdx.x % 128;
            const int row = k / CHUNKS, c = k % CHUNKS;
            if (row >= rows) break;
            *reinterpret_cast<uint4*>(out + (size_t)row * hr.q_row + c * 8) =
                ld_shared_u32x4(at(row, c));
        }
    }
}

// The entry points take forward.cu's arguments (Q, K and V as pointers and their strides, for a
// host that launches either kernel the same way: O is written under Q's), then the tensor maps
// the TMA loads read Q, K and V through.
extern "C" __global__ void __launch_bounds__(WF_THREADS, 1)
    fwd_final(const u16*, const u16*, const u16*, u16* O, float* LSE, int heads, int kv_heads,
              int q_len, int kv_len, int q_start, int kv_start, Strides qs, Strides kvs,
              const int* row_start, int global, float scale_log2,
              const __grid_constant__ TensorMap tmQ, const __grid_constant__ TensorMap tmK,
              const __grid_constant__ TensorMap tmV) {
    fwd_wg_body<false>(&tmQ, &tmK, &tmV, O, LSE, nullptr, nullptr, nullptr, heads, kv_heads,
                       q_len, kv_len, q_start, kv_start, qs, kvs, row_start, global, scale_log2);
}

extern "C" __global__ void __launch_bounds__(WF_THREADS, 1)
    fwd_state(const u16*, const u16*, const u16*, float* M, float* L, float* ACC, int heads,
              int kv_heads, int q_len, int kv_len, int q_start, int kv_start, Strides qs,
              Strides kvs, const int* row_start, int global, float scale_log2,
              const __grid_constant__ TensorMap tmQ, const __grid_constant__ TensorMap tmK,
              const __grid_constant__ TensorMap tmV) {
    fwd_wg_body<true>(&tmQ, &tmK, &tmV, nullptr, nullptr, M, L, ACC, heads, kv_heads, q_len,
                      kv_len, q_start, kv_start, qs, kvs, row_start, global, scale_log2);
}
#endif  // FWD_WGMMA
