// FlashAttention-2 backward over one (query span, key span) block, causal by absolute position.
//
// One CTA = BWD_BKV key rows of one (batch, query head); BWD_WARPS warps own 16 key rows each and
// keep that slice of dK and dV in f32 registers. The CTA walks the query tiles (BWD_BQ rows) that
// can see its keys, streaming Q, dO, LSE and D through a two-stage cp.async pipeline. Per tile:
//   Sᵀ = K·Qᵀ,  Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e),  dV += Pᵀ·dO,
//   dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ − D),  dK += dSᵀ·Q,
// then dSᵀ goes to shared memory and the warps compute dQ += dS·K for the tile, added to the f32
// dQ accumulator with vector atomics (other key tiles add to the same rows). dK and dV are added
// (atomically: GQA heads share them) at the end. All three gradients therefore *accumulate*,
// which is exactly the block API's contract. The softmax scale is applied to dQ and dK on the
// way out.
//
// The host prepends BWD_WARPS (4 or 8).

#define BWD_THREADS (BWD_WARPS * 32)
#define BWD_BKV (BWD_WARPS * 16)
#define BWD_BQ 64

extern "C" __global__ void __launch_bounds__(BWD_THREADS, 8 / BWD_WARPS)
    bwd_block(const u16* __restrict__ Q, const u16* __restrict__ K, const u16* __restrict__ V,
              const u16* __restrict__ dO, const float* __restrict__ LSE,
              const float* __restrict__ Dl, float* __restrict__ dQ, float* __restrict__ dK,
              float* __restrict__ dV, int heads, int kv_heads, int q_len, int kv_len, int q_start,
              int kv_start, float scale) {
    constexpr int D = HEAD_DIM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    const int bh = blockIdx.x;
    const int b = bh / heads, h = bh % heads;
    const int kvh = b * kv_heads + h / (heads / kv_heads);
    const int c0 = blockIdx.y * BWD_BKV;

    // First query row that sees key c0; tiles before it see none of this CTA's keys.
    const int first_row = max(kv_start + c0 - q_start, 0);
    const int t_begin = first_row / BWD_BQ;
    const int n_qt = (q_len + BWD_BQ - 1) / BWD_BQ;
    if (t_begin >= n_qt) return;

    const u16* Qh = Q + (size_t)bh * q_len * D;
    const u16* dOh = dO + (size_t)bh * q_len * D;
    const float* Lh = LSE + (size_t)bh * q_len;
    const float* Dh = Dl + (size_t)bh * q_len;
    float* dQh = dQ + (size_t)bh * q_len * D;
    const u16* Kh = K + (size_t)kvh * kv_len * D;
    const u16* Vh = V + (size_t)kvh * kv_len * D;

    constexpr u32 Q_STAGE = BWD_BQ * D * 2;
    const u32 sK = smem_addr(smem);
    const u32 sV = sK + BWD_BKV * D * 2;
    const u32 sQ = sV + BWD_BKV * D * 2;
    const u32 sdO = sQ + 2 * Q_STAGE;
    const u32 sL = sdO + 2 * Q_STAGE;
    const u32 sD = sL + 2 * BWD_BQ * 4;
    const u32 sdS = sD + 2 * BWD_BQ * 4;
    const float* fL = reinterpret_cast<const float*>(smem + (sL - sK));
    const float* fD = reinterpret_cast<const float*>(smem + (sD - sK));

    load_tile<BWD_BKV, BWD_THREADS>(sK, Kh, c0, kv_len);
    load_tile<BWD_BKV, BWD_THREADS>(sV, Vh, c0, kv_len);
    load_tile<BWD_BQ, BWD_THREADS>(sQ, Qh, t_begin * BWD_BQ, q_len);
    load_tile<BWD_BQ, BWD_THREADS>(sdO, dOh, t_begin * BWD_BQ, q_len);
    load_vec<BWD_BQ>(sL, Lh, t_begin * BWD_BQ, q_len);
    load_vec<BWD_BQ>(sD, Dh, t_begin * BWD_BQ, q_len);
    cp_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.f;

    const int krow = warp * 16 + g;  // this thread's key rows (local to the tile): krow, krow + 8

    for (int qt = t_begin; qt < n_qt; ++qt) {
        cp_wait<0>();
        __syncthreads();
        const int stage = (qt - t_begin) & 1;
        if (qt + 1 < n_qt) {
            const int ns = stage ^ 1;
            const int nr = (qt + 1) * BWD_BQ;
            load_tile<BWD_BQ, BWD_THREADS>(sQ + ns * Q_STAGE, Qh, nr, q_len);
            load_tile<BWD_BQ, BWD_THREADS>(sdO + ns * Q_STAGE, dOh, nr, q_len);
            load_vec<BWD_BQ>(sL + ns * BWD_BQ * 4, Lh, nr, q_len);
            load_vec<BWD_BQ>(sD + ns * BWD_BQ * 4, Dh, nr, q_len);
        }
        cp_commit();
        const u32 cQ = sQ + stage * Q_STAGE, cdO = sdO + stage * Q_STAGE;
        const float* cL = fL + stage * BWD_BQ;
        const float* cD = fD + stage * BWD_BQ;
        const int r0 = qt * BWD_BQ;

        // Sᵀ = K·Qᵀ for this warp's 16 keys × BWD_BQ queries.
        float s[BWD_BQ / 8][4];
#pragma unroll
        for (int nt = 0; nt < BWD_BQ / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 ka[4];
            ldsm_x4(ka, sK + swz<D>(warp * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#pragma unroll
            for (int nn = 0; nn < BWD_BQ / 16; ++nn) {
                u32 bf[4];
                ldsm_x4(bf, cQ + swz<D>(nn * 16 + lane % 8 + (lane / 16) * 8,
                                        kk * 16 + ((lane / 8) % 2) * 8));
                mma(s[2 * nn], ka, bf[0], bf[1]);
                mma(s[2 * nn + 1], ka, bf[2], bf[3]);
            }
        }

        // Pᵀ from the final LSE; masked (future, or out-of-range) pairs get exactly 0.
        const bool need_mask = (q_start + r0 < kv_start + c0 + BWD_BKV - 1) ||
                               (r0 + BWD_BQ > q_len) || (c0 + BWD_BKV > kv_len);
#pragma unroll
        for (int nt = 0; nt < BWD_BQ / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qc = nt * 8 + 2 * t + (e & 1);
                const float lse = cL[qc];
                // A row with no visible key anywhere (LSE = −∞) has P = 0.
                const float lse2 = lse == NEG_INF ? POS_INF : lse * LOG2E;
                float p = exp2f(fmaf(s[nt][e], scale_log2, -lse2));
                if (need_mask) {
                    const int kr = c0 + krow + (e >= 2 ? 8 : 0);
                    const int qr = r0 + qc;
                    if (qr >= q_len || kr >= kv_len || kv_start + kr > q_start + qr) p = 0.f;
                }
                s[nt][e] = p;
            }

        // dV += Pᵀ·dO.
#pragma unroll
        for (int kk = 0; kk < BWD_BQ / 16; ++kk) {
            const u32 pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                               pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                u32 bf[4];
                ldsm_x4_t(bf, cdO + swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                           dn * 16 + (lane / 16) * 8));
                mma(dv[2 * dn], pa, bf[0], bf[1]);
                mma(dv[2 * dn + 1], pa, bf[2], bf[3]);
            }
        }

        // dPᵀ = V·dOᵀ.
        float dp[BWD_BQ / 8][4];
#pragma unroll
        for (int nt = 0; nt < BWD_BQ / 8; ++nt) dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 va[4];
            ldsm_x4(va, sV + swz<D>(warp * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#pragma unroll
            for (int nn = 0; nn < BWD_BQ / 16; ++nn) {
                u32 bf[4];
                ldsm_x4(bf, cdO + swz<D>(nn * 16 + lane % 8 + (lane / 16) * 8,
                                         kk * 16 + ((lane / 8) % 2) * 8));
                mma(dp[2 * nn], va, bf[0], bf[1]);
                mma(dp[2 * nn + 1], va, bf[2], bf[3]);
            }
        }

        // dSᵀ = Pᵀ∘(dPᵀ − D), kept in s; also staged in shared memory ([key][query]) for dQ.
        unsigned char* dS_bytes = smem + (sdS - sK);
#pragma unroll
        for (int nt = 0; nt < BWD_BQ / 8; ++nt) {
            const int qc = nt * 8 + 2 * t;
            const float d0 = cD[qc], d1 = cD[qc + 1];
            s[nt][0] *= dp[nt][0] - d0;
            s[nt][1] *= dp[nt][1] - d1;
            s[nt][2] *= dp[nt][2] - d0;
            s[nt][3] *= dp[nt][3] - d1;
            *reinterpret_cast<u32*>(dS_bytes + swz<BWD_BQ>(krow, qc)) = pack2(s[nt][0], s[nt][1]);
            *reinterpret_cast<u32*>(dS_bytes + swz<BWD_BQ>(krow + 8, qc)) =
                pack2(s[nt][2], s[nt][3]);
        }

        // dK += dSᵀ·Q (scaled at the end).
#pragma unroll
        for (int kk = 0; kk < BWD_BQ / 16; ++kk) {
            const u32 da[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                               pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                u32 bf[4];
                ldsm_x4_t(bf, cQ + swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                          dn * 16 + (lane / 16) * 8));
                mma(dk[2 * dn], da, bf[0], bf[1]);
                mma(dk[2 * dn + 1], da, bf[2], bf[3]);
            }
        }

        __syncthreads();  // dS tile complete

        // dQ(tile) += scale · dS·K: warp → 16 query rows × a slice of the head dim.
        constexpr int PARTS = BWD_WARPS / 4;
        constexpr int COLS = D / PARTS;
        const int mq = (warp % 4) * 16;
        constexpr int CH = COLS < 32 ? COLS : 32;  // columns per pass: 32 keeps W=8 free of spills
        const int col_base = (warp / 4) * COLS;
#pragma unroll
        for (int cc = 0; cc < COLS; cc += CH) {
            float acc[CH / 8][4];
#pragma unroll
            for (int nt = 0; nt < CH / 8; ++nt)
                acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BWD_BKV / 16; ++kk) {
                u32 a[4];
                ldsm_x4_t(a, sdS + swz<BWD_BQ>(kk * 16 + lane % 8 + (lane / 16) * 8,
                                               mq + ((lane / 8) % 2) * 8));
#pragma unroll
                for (int dn = 0; dn < CH / 16; ++dn) {
                    u32 bf[4];
                    ldsm_x4_t(bf, sK + swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                              col_base + cc + dn * 16 + (lane / 16) * 8));
                    mma(acc[2 * dn], a, bf[0], bf[1]);
                    mma(acc[2 * dn + 1], a, bf[2], bf[3]);
                }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int qr = r0 + mq + g + 8 * i;
                if (qr < q_len) {
#pragma unroll
                    for (int nt = 0; nt < CH / 8; ++nt)
                        red_add2(dQh + (size_t)qr * D + col_base + cc + nt * 8 + 2 * t,
                                 acc[nt][2 * i] * scale, acc[nt][2 * i + 1] * scale);
                }
            }
        }
    }

    float* dKh = dK + (size_t)kvh * kv_len * D;
    float* dVh = dV + (size_t)kvh * kv_len * D;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int kr = c0 + krow + 8 * i;
        if (kr < kv_len) {
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                red_add2(dKh + (size_t)kr * D + nt * 8 + 2 * t, dk[nt][2 * i] * scale,
                         dk[nt][2 * i + 1] * scale);
                red_add2(dVh + (size_t)kr * D + nt * 8 + 2 * t, dv[nt][2 * i], dv[nt][2 * i + 1]);
            }
        }
    }
}
