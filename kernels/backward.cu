// FlashAttention-2 backward over one (query span, key span) block, causal by absolute position
// and under the optional mask of common.cuh (row_start, global): query tiles that see none of a
// CTA's keys are skipped, partly hidden tiles masked element by element.
//
// One CTA = BWD_BKV key rows of one (batch, query head), BWD_WARPS warps in groups of
// BWD_KSPLIT sharing 32 keys. The CTA walks the query tiles (BWD_BQ rows) that can see its keys,
// streaming Q, dO, LSE and D through a cp.async pipeline of BWD_QSTAGES stages (two: the next
// tile loads during this one; one, for head dim 256's shared memory: it loads during phase 3,
// which reads neither). Per tile, in three phases separated by barriers:
//  1. scores: warp (kb, part) computes, for its 32 keys × BWD_BQ/BWD_KSPLIT queries,
//       Sᵀ = K·Qᵀ,  Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e),  dPᵀ = V·dOᵀ,  dSᵀ = Pᵀ∘(dPᵀ − D),
//     and writes Pᵀ and dSᵀ (16-bit) to shared memory;
//  2. key gradients: warp (kb, part) owns 32 keys × 1/BWD_KSPLIT of the head dim of dV and dK
//     in f32 registers (whole 16-column tiles, so at head dim 80 the parts are 48 and 32):
//       dV += Pᵀ·dO,  dK += dSᵀ·Q;
//  3. query gradient: warp owns 32 queries × 2/BWD_WARPS of the head dim (whole 16-column
//     tiles) of dQ += dS·K for the tile, added to the f32 dQ accumulator with vector atomics
//     (other key tiles add to the same rows); above head dim 128 in passes of 16 columns, which
//     bounds the accumulator's registers (two-tile passes spilled at 192 on sm_90).
// Four warps per 32 keys (BWD_KSPLIT 4, head dims 192 and 256) halve the dK and dV registers
// per thread that two would need. With two, every matrix product runs on warp tiles of at least
// 32×32, so each fragment read from shared memory feeds two MMAs or more — shared-memory
// bandwidth, not the tensor cores, is what limits this kernel on Hopper. dK and dV are added
// (atomically: GQA heads share them) at the end, so all three gradients *accumulate*, which is exactly the block API's contract. The
// softmax scale is applied to dQ and dK on the way out.
//
// The host prepends BWD_WARPS (4 or 8), BWD_KSPLIT (2 or 4), BWD_QSTAGES (1 or 2) and BWD_WGMMA
// (1: backward_wgmma.cu replaces this kernel).

#if !BWD_WGMMA
#define BWD_THREADS (BWD_WARPS * 32)
#define BWD_BKV (BWD_WARPS / BWD_KSPLIT * 32)
#define BWD_BQ 64

extern "C" __global__ void __launch_bounds__(BWD_THREADS, 8 / BWD_WARPS)
    bwd_block(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
              const u16* __restrict__ dO, const float* __restrict__ LSE,
              const float* __restrict__ Dl, float* __restrict__ dQ, void* __restrict__ dK,
              void* __restrict__ dV, int kv_direct, int heads, int kv_heads, int q_len,
              int kv_len, int q_start, int kv_start, Strides qs, Strides kvs,
              const int* __restrict__ row_start, const int* __restrict__ row_end, int global,
              float scale, int* __restrict__ turns) {
    constexpr int D = HEAD_DIM;
    constexpr int TILES16 = D / 16;                  // 16-column tiles of the head dim
    constexpr int QPW = BWD_BQ / BWD_KSPLIT;         // phase 1: queries per warp
    constexpr int KT = (TILES16 + BWD_KSPLIT - 1) / BWD_KSPLIT;  // phase 2: tiles per warp
    constexpr int HALF = KT * 16;                    // phase 2: head-dim columns per warp
    constexpr int QGROUPS = BWD_WARPS / 2;           // phase 3: warps across the head dim
    constexpr int QT = (TILES16 + QGROUPS - 1) / QGROUPS;  // phase 3: tiles per warp
    constexpr int QCOLS = QT * 16;                   // phase 3: dQ columns per warp
    constexpr int QCT = D > 128 ? 1 : QT;           // phase 3: tiles per pass
    // Whether every warp's columns lie inside the head dim (else the last parts are clipped).
    constexpr bool KEXACT = KT * BWD_KSPLIT == TILES16;
    constexpr bool QEXACT = QT * QGROUPS == TILES16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    const int n_kt = (kv_len + BWD_BKV - 1) / BWD_BKV;
    const CtaWork work = cta_work<BWD_KEY_MAJOR, DETERMINISTIC>(n_kt);
    const int c0 = work.tile * BWD_BKV;
    int* const dq_turn_row = dq_turns(turns, work.bh, q_len, BWD_BQ);  // this head's dQ turns

    // The query tiles that see these keys (all from the first on, without a mask).
    const int2 seen = seeing_query_tiles<BWD_BQ>(c0, min(c0 + BWD_BKV, kv_len), q_len, q_start,
                                                kv_start, row_start, row_end, global);
    const int t_begin = seen.x, n_qt = seen.y;
    if (t_begin >= n_qt) {
        skip_turns<BWD_BQ, BWD_BKV>(
            dq_turn_row, kv_turns(turns, work.bh, heads, kv_heads, q_len, BWD_BQ, n_kt, kv_direct),
            t_begin, work.tile, n_kt, q_len, q_start, kv_start, global,
            kv_turn(work.bh, heads, kv_heads));
        return;
    }

    const BwdHead op = bwd_head(Q, K, V, dO, LSE, Dl, dQ, dK, dV, kv_direct, work.bh, heads,
                                kv_heads, q_len, qs, kvs);

    constexpr u32 Q_STAGE = BWD_BQ * D * 2;
    const u32 sK = smem_addr(smem);
    const u32 sV = sK + BWD_BKV * D * 2;
    const u32 sQ = sV + BWD_BKV * D * 2;
    const u32 sdO = sQ + BWD_QSTAGES * Q_STAGE;
    const u32 sL = sdO + BWD_QSTAGES * Q_STAGE;
    const u32 sD = sL + BWD_QSTAGES * BWD_BQ * 4;
    const u32 sR = sD + BWD_QSTAGES * BWD_BQ * 4;  // the rows' mask starts
    const u32 sP = sR + BWD_QSTAGES * BWD_BQ * 4;  // Pᵀ  [key][query], 16-bit, swizzled
    const u32 sdS = sP + BWD_BKV * BWD_BQ * 2;  // dSᵀ [key][query]
    const float* fL = reinterpret_cast<const float*>(smem + (sL - sK));
    const float* fD = reinterpret_cast<const float*>(smem + (sD - sK));
    const int* iR = reinterpret_cast<const int*>(smem + (sR - sK));
    unsigned char* pP = smem + (sP - sK);
    unsigned char* pdS = smem + (sdS - sK);

    // Query tile qt's Q, dO, LSE, D and row starts into pipeline stage st.
    const auto load_query_tile = [&](int qt, int st) {
        const int r = qt * BWD_BQ;
        load_tile<BWD_BQ, BWD_THREADS>(sQ + st * Q_STAGE, op.Q, op.q_row, r, q_len);
        load_tile<BWD_BQ, BWD_THREADS>(sdO + st * Q_STAGE, op.dO, op.q_row, r, q_len);
        load_vec<BWD_BQ>(sL + st * BWD_BQ * 4, op.LSE, r, q_len);
        load_vec<BWD_BQ>(sD + st * BWD_BQ * 4, op.D, r, q_len);
        load_row_starts<BWD_BQ>(sR + st * BWD_BQ * 4, row_start, q_start, r, q_len);
    };
    load_tile<BWD_BKV, BWD_THREADS>(sK, op.K, op.kv_row, c0, kv_len);
    load_tile<BWD_BKV, BWD_THREADS>(sV, op.V, op.kv_row, c0, kv_len);
    load_query_tile(t_begin, 0);
    cp_commit();

    // Phases 1 and 2: this warp's 32 keys (kr0..) and its part (of BWD_KSPLIT) of the queries
    // (phase 1: qc0..) or of the head dim (phase 2: dc0..). Phase 3: 32 queries (qr0..) × QCOLS
    // columns (dq0..).
    const int kr0 = (warp / BWD_KSPLIT) * 32;
    const int part = warp % BWD_KSPLIT;
    const int qc0 = part * QPW;
    const int dc0 = part * HALF;
    const int qr0 = (warp / QGROUPS) * 32;
    const int dq0 = (warp % QGROUPS) * QCOLS;

    float dk[2][HALF / 8][4], dv[2][HALF / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < HALF / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[mt][nt][e] = dv[mt][nt][e] = 0.f;

    for (int qt = t_begin; qt < n_qt; ++qt) {
        cp_wait<0>();
        if (DETERMINISTIC && qt > t_begin) __threadfence();  // the last tile's dQ additions
        __syncthreads();  // tile qt landed; phases 2-3 of the last tile are done with sP, sdS
        if (DETERMINISTIC && qt > t_begin && threadIdx.x == 0)
            pass_add_turn(dq_turn_row + qt - 1);
        const int stage = BWD_QSTAGES == 2 ? (qt - t_begin) & 1 : 0;
        if (BWD_QSTAGES == 2) {
            if (qt + 1 < n_qt) load_query_tile(qt + 1, stage ^ 1);
            cp_commit();
        }
        const u32 cQ = sQ + stage * Q_STAGE, cdO = sdO + stage * Q_STAGE;
        const float* cL = fL + stage * BWD_BQ;
        const float* cD = fD + stage * BWD_BQ;
        const int* cR = iR + stage * BWD_BQ;
        const int r0 = qt * BWD_BQ;

        // ---- Phase 1: Sᵀ and dPᵀ for 32 keys × QPW queries.
        float s[2][QPW / 8][4], dp[2][QPW / 8][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < QPW / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = dp[mt][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 ka[2][4], va[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const u32 off = swz<D>(kr0 + mt * 16 + lane % 16, kk * 16 + (lane / 16) * 8);
                ldsm_x4(ka[mt], sK + off);
                ldsm_x4(va[mt], sV + off);
            }
#pragma unroll
            for (int nn = 0; nn < QPW / 16; ++nn) {
                const u32 off = swz<D>(qc0 + nn * 16 + lane % 8 + (lane / 16) * 8,
                                       kk * 16 + ((lane / 8) % 2) * 8);
                u32 qb[4], ob[4];
                ldsm_x4(qb, cQ + off);
                ldsm_x4(ob, cdO + off);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma(s[mt][2 * nn], ka[mt], qb[0], qb[1]);
                    mma(s[mt][2 * nn + 1], ka[mt], qb[2], qb[3]);
                    mma(dp[mt][2 * nn], va[mt], ob[0], ob[1]);
                    mma(dp[mt][2 * nn + 1], va[mt], ob[2], ob[3]);
                }
            }
        }

        // Pᵀ from the final LSE (masked pairs exactly 0), dSᵀ = Pᵀ∘(dPᵀ − D); both to smem.
        const int rs_last = staged_row_start(cR, row_start, min(BWD_BQ, q_len - r0) - 1);
        const bool need_mask = (r0 + BWD_BQ > q_len) || (c0 + BWD_BKV > kv_len) ||
                               tile_partly_hidden<BWD_BKV>(kv_start + c0, q_start + r0, rs_last,
                                                         global);
#pragma unroll
        for (int nt = 0; nt < QPW / 8; ++nt) {
            const int qc = qc0 + nt * 8 + 2 * t;
            float lse2[2], dd[2];
            int rq[2];  // where the mask starts the two query rows
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float lse = cL[qc + c];
                // A row with no visible key anywhere (LSE = −∞) has P = 0.
                lse2[c] = lse == NEG_INF ? POS_INF : lse * LOG2E;
                dd[c] = cD[qc + c];
                rq[c] = need_mask ? staged_row_start(cR, row_start, min(qc + c, q_len - 1 - r0))
                                  : 0;
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float p = exp2f(fmaf(s[mt][nt][e], scale_log2, -lse2[e & 1]));
                    if (need_mask) {
                        const int kr = c0 + kr0 + mt * 16 + g + (e >= 2 ? 8 : 0);
                        const int qr = r0 + qc + (e & 1);
                        if (qr >= q_len || kr >= kv_len ||
                            key_hidden(kv_start + kr, q_start + qr, rq[e & 1], global))
                            p = 0.f;
                    }
                    s[mt][nt][e] = p;
                    dp[mt][nt][e] = p * (dp[mt][nt][e] - dd[e & 1]);
                }
                const int kl = kr0 + mt * 16 + g;
                *reinterpret_cast<u32*>(pP + swz<BWD_BQ>(kl, qc)) = pack2(s[mt][nt][0], s[mt][nt][1]);
                *reinterpret_cast<u32*>(pP + swz<BWD_BQ>(kl + 8, qc)) =
                    pack2(s[mt][nt][2], s[mt][nt][3]);
                *reinterpret_cast<u32*>(pdS + swz<BWD_BQ>(kl, qc)) =
                    pack2(dp[mt][nt][0], dp[mt][nt][1]);
                *reinterpret_cast<u32*>(pdS + swz<BWD_BQ>(kl + 8, qc)) =
                    pack2(dp[mt][nt][2], dp[mt][nt][3]);
            }
        }
        wait_dq_turn<BWD_BQ, BWD_BKV>(dq_turn_row, qt, work.tile, n_kt, q_start, kv_start);
        __syncthreads();  // Pᵀ and dSᵀ complete (and, deterministic, this tile's dQ turn come)

        // ---- Phase 2: dV += Pᵀ·dO and dK += dSᵀ·Q for 32 keys × HALF columns (clipped to D).
#pragma unroll
        for (int kk = 0; kk < BWD_BQ / 16; ++kk) {
            u32 pa[2][4], da[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const u32 off = swz<BWD_BQ>(kr0 + mt * 16 + lane % 16, kk * 16 + (lane / 16) * 8);
                ldsm_x4(pa[mt], sP + off);
                ldsm_x4(da[mt], sdS + off);
            }
#pragma unroll
            for (int dn = 0; dn < HALF / 16; ++dn) {
                if (!KEXACT && dc0 + dn * 16 >= D) continue;
                const u32 off = swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                       dc0 + dn * 16 + (lane / 16) * 8);
                u32 ob[4], qb[4];
                ldsm_x4_t(ob, cdO + off);
                ldsm_x4_t(qb, cQ + off);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma(dv[mt][2 * dn], pa[mt], ob[0], ob[1]);
                    mma(dv[mt][2 * dn + 1], pa[mt], ob[2], ob[3]);
                    mma(dk[mt][2 * dn], da[mt], qb[0], qb[1]);
                    mma(dk[mt][2 * dn + 1], da[mt], qb[2], qb[3]);
                }
            }
        }

        if (BWD_QSTAGES == 1) {
            __syncthreads();  // phases 1-2 are done with this tile's Q, dO, LSE and D
            if (qt + 1 < n_qt) load_query_tile(qt + 1, 0);
            cp_commit();
        }

        // ---- Phase 3: dQ(tile) += scale · dS·K for 32 queries × QCOLS columns (clipped to
        // D), in passes of QCT 16-column tiles.
#pragma unroll
        for (int pass = 0; pass < (QT + QCT - 1) / QCT; ++pass) {
            const int pc0 = dq0 + pass * QCT * 16;  // this pass's first column
            float acc[2][2 * QCT][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2 * QCT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BWD_BKV / 16; ++kk) {
                u32 a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    ldsm_x4_t(a[mt], sdS + swz<BWD_BQ>(kk * 16 + lane % 8 + (lane / 16) * 8,
                                                      qr0 + mt * 16 + ((lane / 8) % 2) * 8));
#pragma unroll
                for (int dn = 0; dn < QCT; ++dn) {
                    if (pass * QCT + dn >= QT || (!QEXACT && pc0 + dn * 16 >= D)) continue;
                    u32 bf[4];
                    ldsm_x4_t(bf, sK + swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                              pc0 + dn * 16 + (lane / 16) * 8));
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma(acc[mt][2 * dn], a[mt], bf[0], bf[1]);
                        mma(acc[mt][2 * dn + 1], a[mt], bf[2], bf[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int qr = r0 + qr0 + mt * 16 + g + 8 * i;
                    if (qr < q_len) {
#pragma unroll
                        for (int nt = 0; nt < 2 * QCT; ++nt) {
                            if (pass * QCT + nt / 2 >= QT || (!QEXACT && pc0 + nt * 8 >= D))
                                continue;
                            red_add2(op.dQ + (size_t)qr * op.q_row + pc0 + nt * 8 + 2 * t,
                                     acc[mt][nt][2 * i] * scale, acc[mt][nt][2 * i + 1] * scale);
                        }
                    }
                }
        }
    }
    if (DETERMINISTIC) {
        __threadfence();
        __syncthreads();
        pass_last_dq_turns<BWD_BQ, BWD_BKV>(dq_turn_row, n_qt - 1, work.tile, n_kt, q_len, q_start,
                                            kv_start, global);
    }

    int* const kv_turn_row =
        kv_turns(turns, work.bh, heads, kv_heads, q_len, BWD_BQ, n_kt, kv_direct);
    wait_kv_turn(kv_turn_row, work.tile, kv_turn(work.bh, heads, kv_heads));
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int kr = c0 + kr0 + mt * 16 + g + 8 * i;
            if (kr < kv_len) {
#pragma unroll
                for (int nt = 0; nt < HALF / 8; ++nt) {
                    if (!KEXACT && dc0 + nt * 8 >= D) continue;
                    const size_t o = (size_t)kr * op.kv_row + dc0 + nt * 8 + 2 * t;
                    put_kv_grad(op.dK, op.kv_direct, o, dk[mt][nt][2 * i] * scale,
                                dk[mt][nt][2 * i + 1] * scale);
                    put_kv_grad(op.dV, op.kv_direct, o, dv[mt][nt][2 * i], dv[mt][nt][2 * i + 1]);
                }
            }
        }
    pass_kv_turn(kv_turn_row, work.tile);
}
#endif  // !BWD_WGMMA
