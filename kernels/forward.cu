// FlashAttention-2 forward over one (query span, key span) block with the causal mask by
// absolute position (key position <= query position) and, when row_start is given, the
// document / window / global-token mask of common.cuh: wholly hidden key tiles are skipped,
// partly hidden ones masked element by element, the rest take the unmasked path.
//
// One CTA = FWD_BQ query rows of one (batch, head); FWD_WARPS warps own 16·FWD_MT rows each
// (FWD_MT m16 tiles: more rows per warp reuse each K/V fragment more, at the price of registers).
// Q's A fragments stay in registers (FWD_QREG = 1) or are re-read from shared memory per tile
// (0, fewer registers). K/V tiles of FWD_BKV rows stream through a two-stage cp.async
// pipeline in swizzled shared memory. Scores S = Q·Kᵀ and O += P·V use mma.m16n8k16 with f32
// accumulators; the online softmax runs in registers in base 2 (scale·log2 e folded in).
//
// Two entry points share the body:
//  - fwd_final: fresh state, writes O (input dtype) and LSE (f32, natural log) — the whole-
//    sequence fast path and any block computed in one go;
//  - fwd_state: reads and writes a running state (m natural-log units, l, unnormalised acc; all
//    f32) so blocks can be folded in one after another.

// The host prepends FWD_WARPS, FWD_MT, FWD_QREG and FWD_WGMMA (1: forward_wgmma.cu replaces
// these kernels).

#if !FWD_WGMMA
#define FWD_THREADS (FWD_WARPS * 32)
#define FWD_BQ (FWD_WARPS * 16 * FWD_MT)
#define FWD_BKV 64
#define FWD_MIN_BLOCKS (FWD_WARPS <= 4 ? 2 : 1)

template <bool STATE>
__device__ __forceinline__ void fwd_body(const u16* __restrict__ Q, const u16* __restrict__ K,
                                         const u16* __restrict__ V, u16* __restrict__ O,
                                         float* __restrict__ LSE, float* __restrict__ Mst,
                                         float* __restrict__ Lst, float* __restrict__ ACC,
                                         int heads, int kv_heads, int q_len, int kv_len,
                                         int q_start, int kv_start, Strides qs, Strides kvs,
                                         const int* __restrict__ row_start, int global,
                                         float scale_log2) {
    constexpr int D = HEAD_DIM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    // Heaviest query tiles (most visible keys) first, so the tail of the grid is short.
    const int n_q_tiles = (q_len + FWD_BQ - 1) / FWD_BQ;
    const CtaWork work = cta_work<FWD_KEY_MAJOR, true>(n_q_tiles);
    const int r0 = work.tile * FWD_BQ;
    const KvTiles tiles = visible_kv_tiles<FWD_BQ, FWD_BKV>(r0, q_len, kv_len, q_start, kv_start,
                                                            row_start, global);
    const int n_tiles = tiles.n;
    if (STATE && n_tiles == 0) return;  // the block adds nothing to these rows

    const HeadRows hr = head_rows(work.bh, heads, kv_heads, q_len, qs, kvs);
    const u16* Qh = Q + hr.q;
    const u16* Kh = K + hr.kv;
    const u16* Vh = V + hr.kv;

    const u32 sQ = smem_addr(smem);
    const u32 sK = sQ + FWD_BQ * D * 2;
    const u32 sV = sK + 2 * FWD_BKV * D * 2;
    constexpr u32 KV_STAGE = FWD_BKV * D * 2;

    load_tile<FWD_BQ, FWD_THREADS>(sQ, Qh, hr.q_row, r0, q_len);
    cp_commit();
    if (n_tiles > 0) {
        load_tile<FWD_BKV, FWD_THREADS>(sK, Kh, hr.kv_row, tiles.at(0) * FWD_BKV, kv_len);
        load_tile<FWD_BKV, FWD_THREADS>(sV, Vh, hr.kv_row, tiles.at(0) * FWD_BKV, kv_len);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();

    const int wrow = warp * 16 * FWD_MT;  // first row of this warp within the tile
    // Where the mask starts this thread's rows (rs) and the warp's last row (rs_warp).
    int rs[FWD_MT][2];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i)
            rs[mt][i] = row_start_at(row_start,
                                     q_start + min(r0 + wrow + mt * 16 + g + 8 * i, q_len - 1));
    const int rs_warp = row_start_at(row_start, q_start + min(r0 + wrow + 16 * FWD_MT, q_len) - 1);
#if FWD_QREG
    u32 qf[FWD_MT][D / 16][4];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            ldsm_x4(qf[mt][kk], sQ + swz<D>(wrow + mt * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#endif

    float o[FWD_MT][D / 8][4];
    float m[FWD_MT][2], l[FWD_MT][2];
    // This thread's rows: wrow + mt·16 + g + 8·i.
#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int row = r0 + wrow + mt * 16 + g + 8 * i;
            const bool ok = STATE && row < q_len;
            const size_t srow = hr.stat + row;
            m[mt][i] = ok ? Mst[srow] * LOG2E : NEG_INF;
            l[mt][i] = (ok && t == 0) ? Lst[srow] : 0.f;  // one lane per row carries the stored sum
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                if (ok) {
                    const float2 a =
                        *reinterpret_cast<const float2*>(ACC + srow * D + nt * 8 + 2 * t);
                    o[mt][nt][2 * i] = a.x;
                    o[mt][nt][2 * i + 1] = a.y;
                } else {
                    o[mt][nt][2 * i] = 0.f;
                    o[mt][nt][2 * i + 1] = 0.f;
                }
            }
        }

    for (int j = 0; j < n_tiles; ++j) {
        cp_wait<0>();
        __syncthreads();  // tile j landed; everyone is done with tile j-1's stage
        if (j + 1 < n_tiles) {
            const u32 st = ((j + 1) & 1) * KV_STAGE;
            const int next = tiles.at(j + 1) * FWD_BKV;
            load_tile<FWD_BKV, FWD_THREADS>(sK + st, Kh, hr.kv_row, next, kv_len);
            load_tile<FWD_BKV, FWD_THREADS>(sV + st, Vh, hr.kv_row, next, kv_len);
        }
        cp_commit();
        const u32 cK = sK + (j & 1) * KV_STAGE, cV = sV + (j & 1) * KV_STAGE;

        float s[FWD_MT][FWD_BKV / 8][4];
#pragma unroll
        for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < FWD_BKV / 8; ++nt)
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 qk[FWD_MT][4];
#pragma unroll
            for (int mt = 0; mt < FWD_MT; ++mt) {
#if FWD_QREG
#pragma unroll
                for (int e = 0; e < 4; ++e) qk[mt][e] = qf[mt][kk][e];
#else
                ldsm_x4(qk[mt], sQ + swz<D>(wrow + mt * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#endif
            }
#pragma unroll
            for (int nn = 0; nn < FWD_BKV / 16; ++nn) {
                u32 bf[4];
                ldsm_x4(bf, cK + swz<D>(nn * 16 + lane % 8 + (lane / 16) * 8,
                                        kk * 16 + ((lane / 8) % 2) * 8));
#pragma unroll
                for (int mt = 0; mt < FWD_MT; ++mt) {
                    mma(s[mt][2 * nn], qk[mt], bf[0], bf[1]);
                    mma(s[mt][2 * nn + 1], qk[mt], bf[2], bf[3]);
                }
            }
        }

        const int c0 = tiles.at(j) * FWD_BKV;
        const bool need_mask = (c0 + FWD_BKV > kv_len) ||
                               tile_partly_hidden<FWD_BKV>(kv_start + c0, q_start + r0 + wrow,
                                                           rs_warp, global);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < FWD_BKV / 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = r0 + wrow + mt * 16 + g + (e >= 2 ? 8 : 0);
                        const int c = c0 + nt * 8 + 2 * t + (e & 1);
                        if (c >= kv_len || key_hidden(kv_start + c, q_start + row,
                                                      rs[mt][e >= 2 ? 1 : 0], global))
                            s[mt][nt][e] = NEG_INF;
                    }
        }

#pragma unroll
        for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mx = NEG_INF;
#pragma unroll
                for (int nt = 0; nt < FWD_BKV / 8; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                const float m_new = fmaxf(m[mt][i], mx * scale_log2);
                // No visible key yet: keep exponents finite (avoid −∞ − (−∞)).
                const float m_use = m_new == NEG_INF ? 0.f : m_new;
                const float alpha = exp2f(m[mt][i] - m_use);
                m[mt][i] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < FWD_BKV / 8; ++nt) {
                    s[mt][nt][2 * i] = exp2f(fmaf(s[mt][nt][2 * i], scale_log2, -m_use));
                    s[mt][nt][2 * i + 1] = exp2f(fmaf(s[mt][nt][2 * i + 1], scale_log2, -m_use));
                    sum += s[mt][nt][2 * i] + s[mt][nt][2 * i + 1];
                }
                l[mt][i] = l[mt][i] * alpha + sum;
#pragma unroll
                for (int nt = 0; nt < D / 8; ++nt) {
                    o[mt][nt][2 * i] *= alpha;
                    o[mt][nt][2 * i + 1] *= alpha;
                }
            }

#pragma unroll
        for (int kk = 0; kk < FWD_BKV / 16; ++kk) {
            u32 pa[FWD_MT][4];
#pragma unroll
            for (int mt = 0; mt < FWD_MT; ++mt) {
                pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                u32 bf[4];
                ldsm_x4_t(bf, cV + swz<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                          dn * 16 + (lane / 16) * 8));
#pragma unroll
                for (int mt = 0; mt < FWD_MT; ++mt) {
                    mma(o[mt][2 * dn], pa[mt], bf[0], bf[1]);
                    mma(o[mt][2 * dn + 1], pa[mt], bf[2], bf[3]);
                }
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < FWD_MT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float lt = l[mt][i];
            lt += __shfl_xor_sync(0xffffffff, lt, 1);
            lt += __shfl_xor_sync(0xffffffff, lt, 2);
            const int row = r0 + wrow + mt * 16 + g + 8 * i;
            if (row >= q_len) continue;
            const size_t srow = hr.stat + row;
            if (STATE) {
                if (t == 0) {
                    Mst[srow] = m[mt][i] * LN2;
                    Lst[srow] = lt;
                }
#pragma unroll
                for (int nt = 0; nt < D / 8; ++nt)
                    *reinterpret_cast<float2*>(ACC + srow * D + nt * 8 + 2 * t) =
                        make_float2(o[mt][nt][2 * i], o[mt][nt][2 * i + 1]);
            } else {
                const float inv = lt > 0.f ? 1.f / lt : 0.f;
                if (t == 0) LSE[srow] = lt > 0.f ? (m[mt][i] + __log2f(lt)) * LN2 : NEG_INF;
#pragma unroll
                for (int nt = 0; nt < D / 8; ++nt)
                    *reinterpret_cast<u32*>(O + hr.q + row * hr.q_row + nt * 8 + 2 * t) =
                        pack2(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
            }
        }
}

extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_MIN_BLOCKS)
    fwd_final(const u16* Q, const u16* K, const u16* V, u16* O, float* LSE, int heads,
              int kv_heads, int q_len, int kv_len, int q_start, int kv_start, Strides qs,
              Strides kvs, const int* row_start, int global, float scale_log2) {
    fwd_body<false>(Q, K, V, O, LSE, nullptr, nullptr, nullptr, heads, kv_heads, q_len, kv_len,
                    q_start, kv_start, qs, kvs, row_start, global, scale_log2);
}

extern "C" __global__ void __launch_bounds__(FWD_THREADS, FWD_MIN_BLOCKS)
    fwd_state(const u16* Q, const u16* K, const u16* V, float* M, float* L, float* ACC, int heads,
              int kv_heads, int q_len, int kv_len, int q_start, int kv_start, Strides qs,
              Strides kvs, const int* row_start, int global, float scale_log2) {
    fwd_body<true>(Q, K, V, nullptr, nullptr, M, L, ACC, heads, kv_heads, q_len, kv_len, q_start,
                   kv_start, qs, kvs, row_start, global, scale_log2);
}
#endif  // !FWD_WGMMA
