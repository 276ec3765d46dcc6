// Shared helpers for the attention kernels: tensor-core MMA, ldmatrix, cp.async, the shared-
// memory swizzles and the head and tile arithmetic; the 16-bit conversions are in half.cuh,
// which comes first. Header-free on purpose, like half.cuh.
//
// The host prepends `#define HEAD_DIM ...` and `#define DTYPE_BF16` or `#define DTYPE_F16`.
// 16-bit inputs are carried as raw `unsigned short`; f32 statistics and accumulators as float.

// Dynamic shared memory of every kernel (sized at launch).
extern __shared__ __align__(128) unsigned char smem[];

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// c += a · b for one m16n8k16 tile: a is 16×16 (4 registers), b is 16×8 (2 registers), c f32.
__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte async copy global → shared; `bytes` = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
// Waits for every cp.async this thread has issued, committed to a group or not.
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Vector atomic add of two adjacent f32 (sm_90): the gradient accumulators.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}
// Four adjacent f32 (`p` 16-byte aligned, sm_90 only: the wgmma backward's dK and dV), the
// 16 bytes as they were staged.
__device__ __forceinline__ void red_add4(float* p, uint4 v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(__uint_as_float(v.x)),
                 "f"(__uint_as_float(v.y)), "f"(__uint_as_float(v.z)), "f"(__uint_as_float(v.w))
                 : "memory");
}

// Byte offset of element (row, col) in a row-major tile of 16-bit values with ROW_ELEMS per
// row, its 16-byte chunks XOR-swizzled by row so that ldmatrix's 8 rows (from a multiple of 8)
// hit 8 different bank groups. The XOR by row % 8 moves a chunk within its group of 8, so it is
// used for the whole groups; rows of 80 or 96 elements (10, 12 chunks) end in a partial group
// of TAIL = 2 or 4 chunks, a row's stride then being TAIL bank groups mod 8: rows r and
// r + 8/TAIL land on the same groups, so the tail's chunks are XORed by (row / (8/TAIL)) % TAIL,
// which separates them (conflict-free for every chunk, by count; still a permutation of the
// row).
template <int ROW_ELEMS>
__device__ __forceinline__ u32 swz(int row, int col) {
    constexpr int WHOLE = (ROW_ELEMS / 8) & ~7;  // chunks in whole groups of 8
    constexpr int TAIL = ROW_ELEMS / 8 - WHOLE;  // chunks in the partial group
    static_assert(TAIL == 0 || TAIL == 2 || TAIL == 4,
                  "swz: rows must be a multiple of 16 elements, and not 112 + 64·k");
    constexpr int TAIL_SHIFT = TAIL == 4 ? 1 : 2;  // log2(8 / TAIL)
    return (u32)(row * ROW_ELEMS * 2 +
                 (((TAIL == 0 || (col >> 3) < WHOLE)
                       ? ((col >> 3) ^ (row & 7))
                       : ((col >> 3) ^ ((row >> TAIL_SHIFT) & (TAIL - 1))))
                  << 4) +
                 (col & 7) * 2);
}

// Byte offset of element (row, col) in the layout wgmma's descriptors describe (the 128-byte
// swizzle): a tile of `rows` rows × HEAD_DIM columns is HEAD_DIM/64 "column atoms" of `rows`
// rows × 128 bytes each, the 16-byte chunk c of row r stored at chunk c ^ (r % 8). Every atom
// must start on a 1024-byte boundary.
__device__ __forceinline__ u32 swz128(int rows, int row, int col) {
    return (u32)((col >> 6) * rows * 128 + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) +
                 (col & 7) * 2);
}

// Copies rows [row0, row0 + ROWS) of a matrix of rows_total rows × HEAD_DIM, rows `stride`
// elements apart (HEAD_DIM head-major, heads·HEAD_DIM sequence-major: `Strides`), into a
// swizzled shared tile with cp.async, in the mma.sync kernels' layout (`swz`) or, with ATOMS, in
// the wgmma kernels' (`swz128`); rows past `rows_total` become zeros (never garbage: P·V with
// P = 0 must stay finite). A tile COLS wide (the wgmma kernels' WG_DIM, wgmma.cuh) has its
// columns past HEAD_DIM zero-filled the same way, so products over them add nothing.
//
// Where THREADS is a multiple of the row's 16-byte chunks and the rows between one thread's
// chunks (STEP) a multiple of 8, each thread copies one column chunk of every STEP-th row: the
// swizzle of all of a thread's chunks is that of its first row, and every copy after the first
// is the first one's addresses plus a constant step, so the loop compiles to bare cp.async
// instructions and one address add each. (Indexing chunks by a strided `i` instead cost as many
// instructions per tile as the forward's softmax: bench/HISTORY.md, v7.) Other
// shapes (head dims 80, 96, 192; 256 with 4 warps) take that strided loop.
template <int ROWS, int THREADS, bool ATOMS = false, int COLS = HEAD_DIM>
__device__ __forceinline__ void load_tile(u32 dst, const u16* base, int stride, int row0,
                                          int rows_total) {
    static_assert(ATOMS ? COLS >= HEAD_DIM && COLS % 64 == 0 : COLS == HEAD_DIM,
                  "only the wgmma tiles (ATOMS) are padded, to whole column atoms");
    constexpr int CHUNKS = COLS / 8;              // 16-byte chunks per row
    constexpr int STEP = THREADS / CHUNKS;        // rows between one thread's chunks
    constexpr int ROW_BYTES = ATOMS ? 128 : COLS * 2;  // within one column atom
    if constexpr (THREADS % CHUNKS == 0 && STEP % 8 == 0) {
        constexpr int ITERS = (ROWS + STEP - 1) / STEP;
        const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
        const u32 at = dst + (ATOMS ? swz128(ROWS, r, c * 8) : swz<HEAD_DIM>(r, c * 8));
        const u16* src = base + (size_t)(row0 + r) * stride + c * 8;
        const size_t step = (size_t)STEP * stride;
        // (ROWS % STEP != 0: the last pass covers only the first rows of the split.)
        if (COLS > HEAD_DIM && c * 8 >= HEAD_DIM) {  // padding columns: zeros
#pragma unroll
            for (int k = 0; k < ITERS; ++k)
                if (ROWS % STEP == 0 || r + k * STEP < ROWS)
                    cp_async16(at + k * STEP * ROW_BYTES, base, 0);
        } else if (row0 + ROWS <= rows_total) {
#pragma unroll
            for (int k = 0; k < ITERS; ++k)
                if (ROWS % STEP == 0 || r + k * STEP < ROWS)
                    cp_async16(at + k * STEP * ROW_BYTES, src + k * step, 16);
        } else {
#pragma unroll
            for (int k = 0; k < ITERS; ++k) {
                const bool ok = row0 + r + k * STEP < rows_total;
                if (ROWS % STEP == 0 || r + k * STEP < ROWS)
                    cp_async16(at + k * STEP * ROW_BYTES, ok ? src + k * step : base,
                               ok ? 16 : 0);
            }
        }
    } else {
        constexpr int ITERS = (ROWS * CHUNKS + THREADS - 1) / THREADS;
        // Not unrolled: unrolled, ptxas keeps every copy's address live across the tile loop,
        // which spilled head dim 256's forward with 4 warps.
#pragma unroll 1
        for (int k = 0; k < ITERS; ++k) {
            const int i = threadIdx.x + k * THREADS;
            if ((ROWS * CHUNKS) % THREADS == 0 || i < ROWS * CHUNKS) {
                const int r = i / CHUNKS, c = i % CHUNKS;
                const bool ok = row0 + r < rows_total && c * 8 < HEAD_DIM;
                const u32 at = dst + (ATOMS ? swz128(ROWS, r, c * 8) : swz<HEAD_DIM>(r, c * 8));
                const u16* src = base + (size_t)(row0 + r) * stride + c * 8;
                cp_async16(at, ok ? src : base, ok ? 16 : 0);
            }
        }
    }
}

// Copies `n` f32 values starting at index row0 (zeros past rows_total) into shared memory,
// spread over the CTA's threads or over `lanes` threads of which this is number `lane` (the
// wgmma backward's loading warp).
template <int N>
__device__ __forceinline__ void load_vec(u32 dst, const float* base, int row0, int rows_total,
                                         int lane = threadIdx.x, int lanes = blockDim.x) {
    for (int i = lane; i < N; i += lanes) {
        const bool ok = row0 + i < rows_total;
        cp_async4(dst + i * 4, base + (ok ? row0 + i : 0), ok ? 4 : 0);
    }
}

// Where an attention tensor's elements lie, viewed as [batch][heads][rows][HEAD_DIM] with the
// head dim contiguous: element (b, h, r, c) at b·batch + h·head + r·row + c, in elements. The
// block API's own tensors are head-major ({heads·rows·D, rows·D, D}); the model's and torch's
// [b, s, h, d] are sequence-major ({s·h·D, D, h·D}); any other view whose strides are multiples
// of 8 (16-byte vectors) reads the same way. Q, O, dO and dQ share one (the query side's), K, V,
// dK and dV another. The host's twin is src/backend/cuda/strides.rs.
struct Strides {
    long long batch, head, row;
};

// Which (batch·head, tile) a CTA works on. Grids are one-dimensional, `tiles` CTAs per
// (batch, query head): query tiles in the forward, key tiles in the backward. CUDA starts CTAs
// in index order, so the order decides which CTAs run side by side and share what they read in
// L2, which start last (the grid's tail), and which CTAs have started before a given one
// (DESCENDING, below).
// KEY_MAJOR (FWD_KEY_MAJOR, BWD_KEY_MAJOR from the host) takes the heads in groups, one tile
// index of each head in the group, then the next index; a group holds as many heads as their
// CTAs fill NUM_SMS (the device's SMs, from the host) at most, and at least one head:
// - From 16K tokens on, a head's tiles fill the device alone: CTAs go head by head, and a wave
//   streams one head's K and V (forward) or Q, dO and dQ (backward), not every head's at once
//   (bench/HISTORY.md, v15).
// - Shorter heads share a wave, their tiles interleaved, so that the causal grid's CTAs of
//   unequal lengths start longest first across the group and the last to start are short: head
//   by head, the last head's longest CTAs started near the end (at 4K the backward ran 0.91×
//   and the forward 0.92× this order's speed, bench/HISTORY.md, v20).
// Without KEY_MAJOR, one tile index of every head comes first (one group of every head).
// DESCENDING runs a head's tiles last first: the forward's heaviest query tiles (the most
// visible keys) then start first, so the tail of the grid is short; and the deterministic
// backward's turns (below), which make a key tile wait only for higher key tiles of its head
// and for lower heads, wait only for CTAs that have started before (both come earlier in a
// group, and earlier groups wholly before).
struct CtaWork {
    int bh, tile;
};
template <bool KEY_MAJOR, bool DESCENDING>
__device__ __forceinline__ CtaWork cta_work(int tiles) {
    const int i = blockIdx.x;
    const int n_bh = gridDim.x / tiles;
    const int group = KEY_MAJOR ? max(1, NUM_SMS / tiles) : n_bh;
    const int g = i / (group * tiles), r = i % (group * tiles);
    const int width = min(group, n_bh - g * group);  // the last group may hold fewer heads
    const int t = r / width;
    return {g * group + r % width, DESCENDING ? tiles - 1 - t : t};
}

// Where the rows of (batch, query head) bh = batch·heads + head start: its query-side rows
// (Q, O, dO, dQ under `qs`), its KV head's rows (K, V, dK, dV under `kvs`; query heads share
// KV heads in groups of heads/kv_heads: GQA, MQA) and its per-row statistics (LSE, D, the
// running state: always [batch·heads][q_len]). `q_row` and `kv_row` are the rows' strides
// (below 2^31: the host checks).
struct HeadRows {
    size_t q, kv, stat;
    int q_row, kv_row;
};
// The batch and KV head of bh.
__device__ __forceinline__ int bh_batch(int bh, int heads) { return bh / heads; }
__device__ __forceinline__ int bh_kv_head(int bh, int heads, int kv_heads) {
    return (bh % heads) / (heads / kv_heads);
}
__device__ __forceinline__ HeadRows head_rows(int bh, int heads, int kv_heads, int q_len,
                                              Strides qs, Strides kvs) {
    const int b = bh_batch(bh, heads), h = bh % heads;
    const int kvh = bh_kv_head(bh, heads, kv_heads);
    return {(size_t)(b * qs.batch + h * qs.head), (size_t)(b * kvs.batch + kvh * kvs.head),
            (size_t)bh * q_len, (int)qs.row, (int)kvs.row};
}

// Masks. Beyond causality a kernel may get a mask (packed documents, a sliding window, global
// prefix tokens) as `row_start`, one int per absolute query position of the sequence, and
// `global`: key k is visible to query q iff k <= q && (k >= row_start[q] || k < global), all
// positions absolute. row_start[q] never decreases with q (src/shape/mask.rs), so the first row
// of a query tile has its smallest start and the last row its largest. The backward also gets
// row_end[k], one past the last query whose row starts at or before key k (so the queries from
// k to row_end[k] - 1 see key k locally). A null row_start is plain causal attention (every row
// starts at 0, no global tokens): the tile ranges below are then exactly the causal ones and no
// tile is masked for the mask's sake.
//
// MASKED (0 or 1, defined by the host per module, `src/backend/cuda/kernels.rs`): a module
// compiled with 0 is the causal one: every helper below folds to its causal constant and the
// mask arguments go unread, so causal attention runs the code it ran before masks (with the mask
// read at run time, the causal backward ran 12-17% slower: bench/HISTORY.md, v11);
// a module compiled with 1 reads the mask.

// Where query position `pos` starts seeing local keys (0 without a mask).
__device__ __forceinline__ int row_start_at(const int* row_start, int pos) {
    return MASKED && row_start ? __ldg(row_start + pos) : 0;
}

// Backward: query rows [row0, row0 + N) of the block's row starts into shared memory at `dst`,
// in the same cp.async group as the tile's LSE and D (rows past q_len read as 0), where the
// tile's mask test reads them. Staging them alone did not speed the masked backward (the loads
// were not its cost: bench/HISTORY.md, v12); it keeps the test's reads out of
// global memory. Nothing is loaded in the causal module or without a mask.
template <int N>
__device__ __forceinline__ void load_row_starts(u32 dst, const int* row_start, int q_start,
                                                int row0, int q_len, int lane = threadIdx.x,
                                                int lanes = blockDim.x) {
    if (MASKED && row_start)
        load_vec<N>(dst, reinterpret_cast<const float*>(row_start + q_start), row0, q_len, lane,
                    lanes);
}

// Row i of a tile's row starts staged by load_row_starts (0 without a mask).
__device__ __forceinline__ int staged_row_start(const int* staged, const int* row_start, int i) {
    return MASKED && row_start ? staged[i] : 0;
}

// The global token count a kernel acts on (0 in the causal module).
__device__ __forceinline__ int mask_global(int global) { return MASKED ? global : 0; }

// The element predicate: key k hidden from query q (absolute positions; rs = row_start[q]).
__device__ __forceinline__ bool key_hidden(int k, int q, int rs, int global) {
    return k > q || (MASKED && k < rs && k >= global);
}

// Whether the tile of KV_ROWS keys from absolute position k0 holds a hidden pair for some query
// from q_first on, up to one whose row starts at rs_last (the last query row's start): then
// its scores go through key_hidden; otherwise every pair is visible and it takes the fast path.
template <int KV_ROWS>
__device__ __forceinline__ bool tile_partly_hidden(int k0, int q_first, int rs_last, int global) {
    return k0 + KV_ROWS - 1 > q_first || (MASKED && k0 < rs_last && k0 + KV_ROWS > global);
}

// Forward: the KV tiles of KV_ROWS a CTA's query rows visit, in order: the global prefix's
// tiles 0..n_glob-1, then n - n_glob local tiles from first_local on (tiles wholly hidden in
// between are skipped, never loaded). n = 0 when the block adds nothing to these rows.
struct KvTiles {
    int n, n_glob, first_local;
    // The i-th tile visited.
    __device__ __forceinline__ int at(int i) const {
        return i < n_glob ? i : first_local + (i - n_glob);
    }
};
// The tiles the query rows [r0, r0 + Q_ROWS) of the block see: keys from the first row's start
// to the last row (and the global prefix), clipped to the block's keys.
template <int Q_ROWS, int KV_ROWS>
__device__ __forceinline__ KvTiles visible_kv_tiles(int r0, int q_len, int kv_len, int q_start,
                                                    int kv_start, const int* row_start,
                                                    int global) {
    const int last_row = min(r0 + Q_ROWS, q_len) - 1;
    const int hi = min(kv_len, q_start + last_row + 1 - kv_start);  // keys [lo, hi) local
    const int lo = max(row_start_at(row_start, q_start + r0) - kv_start, 0);
    const int first = lo / KV_ROWS;
    const int local = hi > lo ? (hi + KV_ROWS - 1) / KV_ROWS - first : 0;
    const int g_hi = min(mask_global(global) - kv_start, hi);  // global keys [0, g_hi)
    int n_glob = g_hi > 0 ? (g_hi + KV_ROWS - 1) / KV_ROWS : 0;
    if (local > 0) n_glob = min(n_glob, first);  // a tile both global and local: visit it once
    return {n_glob + local, n_glob, first};
}

// Backward: every operand of the CTA's (batch, query head), offset to its rows (HeadRows). dK
// and dV are f32 accumulators, or with `kv_direct` 16-bit outputs the CTA writes once: where it
// computes every term of its keys' gradients (one query head per KV head and the whole
// sequence in one call), so the f32 buffers and their rounding pass are not needed. (One
// untyped pointer each and a flag, not two typed ones: the registers are counted at head dim
// 256, whose mma.sync backward spilled with four.)
struct BwdHead {
    const u16 *Q, *dO, *K, *V;
    const float *LSE, *D;
    float* dQ;
    void *dK, *dV;
    int kv_direct, q_row, kv_row;
};
__device__ __forceinline__ BwdHead bwd_head(const u16* Q, const u16* K, const u16* V,
                                            const u16* dO, const float* LSE, const float* Dl,
                                            float* dQ, void* dK, void* dV, int kv_direct,
                                            int bh, int heads, int kv_heads, int q_len,
                                            Strides qs, Strides kvs) {
    const HeadRows hr = head_rows(bh, heads, kv_heads, q_len, qs, kvs);
    const size_t kv_bytes = hr.kv * (kv_direct ? 2 : 4);
    return {Q + hr.q,
            dO + hr.q,
            K + hr.kv,
            V + hr.kv,
            LSE + hr.stat,
            Dl + hr.stat,
            dQ + hr.q,
            reinterpret_cast<unsigned char*>(dK) + kv_bytes,
            reinterpret_cast<unsigned char*>(dV) + kv_bytes,
            kv_direct,
            hr.q_row,
            hr.kv_row};
}

// Backward, at the end: the pair (x, y) of a key row's dK or dV at element `o` of the head's
// gradient `g`: added to the f32 accumulator, or with `direct` stored in 16 bits.
__device__ __forceinline__ void put_kv_grad(void* g, int direct, size_t o, float x, float y) {
    if (direct)
        *reinterpret_cast<u32*>(reinterpret_cast<u16*>(g) + o) = pack2(x, y);
    else
        red_add2(reinterpret_cast<float*>(g) + o, x, y);
}

// Backward: the query tiles [begin, end) of Q_ROWS rows that see some of the CTA's keys
// [c0, c1) of the block: from the tile of the first query at or after key c0 (causality) to the
// tile of the last query whose row starts at or before key c1 - 1 (row_end), or to the end when
// a key is global (every later query sees it). begin >= end when no query sees the keys.
template <int Q_ROWS>
__device__ __forceinline__ int2 seeing_query_tiles(int c0, int c1, int q_len, int q_start,
                                                   int kv_start, const int* row_start,
                                                   const int* row_end, int global) {
    const int begin = max(kv_start + c0 - q_start, 0) / Q_ROWS;
    const int n_qt = (q_len + Q_ROWS - 1) / Q_ROWS;
    if (!MASKED || !row_start || kv_start + c0 < global) return make_int2(begin, n_qt);
    const int rows = min(max(__ldg(row_end + kv_start + c1 - 1) - q_start, 0), q_len);
    return make_int2(begin, (rows + Q_ROWS - 1) / Q_ROWS);
}

// ---- The deterministic backward (DETERMINISTIC 1, `CudaBackend::with_deterministic`).
// Floating-point sums depend on their order, and two things add into one place from several
// CTAs in an order the scheduler picks: the key tiles of a head into each query tile's dQ, and
// the query heads of a GQA group into their KV head's dK and dV. Deterministic, each such place
// has a turn counter (int, zeroed before the launch): a CTA waits until the counter says it is
// its turn, adds, makes its additions visible and passes the turn on. dQ's turns go from the
// highest key tile to the lowest (the higher tile reaches a query tile first: it starts at a
// later one), dK/dV's from the group's first head to its last.

#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif

// Spins until *turn == want (read with acquire at GPU scope). A turn that never comes is a bug
// in the turn order; trapping after some seconds fails the launch with an error instead of
// hanging the GPU.
__device__ __forceinline__ void wait_add_turn(const int* turn, int want) {
    for (int spins = 0;; ++spins) {
        int now;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(turn) : "memory");
        if (now == want) return;
        if (spins > (1 << 25)) __trap();
        __nanosleep(128);
    }
}
// Passes the turn on, after the CTA's additions (each adding thread fenced them, then a CTA
// barrier): a release increment at GPU scope.
__device__ __forceinline__ void pass_add_turn(int* turn) {
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(turn) : "memory");
}
// The turn of key tile k (KV_ROWS keys) of the block at query tile qt (Q_ROWS rows): the key
// tiles adding to qt are those whose first seen query tile (`seeing_query_tiles`' begin) is at
// or before qt, i.e. tiles 0 .. last with last·KV_ROWS < (qt + 1)·Q_ROWS + q_start − kv_start,
// in descending order. Every such tile adds to qt under causality alone, and under a mask too:
// the last query tile a key tile sees (`seeing_query_tiles`' end, from row_end) never falls as
// the key tiles rise, since row_start never falls as the rows do (documents, windows), so the
// tiles above one that sees qt see it too. Global keys break that (they see every later query,
// the tiles above them need not): where the block holds any, each key tile also takes its turn
// at the query tiles after the last it sees, adding nothing (`pass_unseen_dq_turns`).
template <int Q_ROWS, int KV_ROWS>
__device__ __forceinline__ int dq_turn(int qt, int k, int n_kt, int q_start, int kv_start) {
    const int x = (qt + 1) * Q_ROWS + q_start - kv_start;  // > k·KV_ROWS when k adds to qt
    return min(n_kt - 1, (x - 1) / KV_ROWS) - k;
}
// Where the turn counters of one launch live: per (batch·head, query tile) for dQ, then per
// (batch·KV head, key tile) for dK and dV where a GQA group shares f32 accumulators. Computed
// where they are used rather than held: registers are what the kernels run short of.
__device__ __forceinline__ int* dq_turns(int* turns, int bh, int q_len, int q_rows) {
    return DETERMINISTIC ? turns + (size_t)bh * ((q_len + q_rows - 1) / q_rows) : nullptr;
}
__device__ __forceinline__ int* kv_turns(int* turns, int bh, int heads, int kv_heads, int q_len,
                                         int q_rows, int n_kt, int kv_direct) {
    if (!DETERMINISTIC || heads == kv_heads || kv_direct) return nullptr;
    const int batches = gridDim.x / (heads * n_kt);
    const int n_qt = (q_len + q_rows - 1) / q_rows;
    return turns + (size_t)batches * heads * n_qt +
           (size_t)(bh_batch(bh, heads) * kv_heads + bh_kv_head(bh, heads, kv_heads)) * n_kt;
}
// This head's place in its GQA group: its turn at the group's dK and dV.
__device__ __forceinline__ int kv_turn(int bh, int heads, int kv_heads) {
    return (bh % heads) % (heads / kv_heads);
}
// Thread ADDER (the one that adds, or that hands the CTA's additions on) waits for key tile
// k's turn at query tile qt's dQ; with several adding threads, a CTA barrier after this orders
// their additions after it.
template <int Q_ROWS, int KV_ROWS, int ADDER = 0>
__device__ __forceinline__ void wait_dq_turn(const int* dq, int qt, int k, int n_kt,
                                             int q_start, int kv_start) {
    if (DETERMINISTIC && threadIdx.x == ADDER)
        wait_add_turn(dq + qt, dq_turn<Q_ROWS, KV_ROWS>(qt, k, n_kt, q_start, kv_start));
}
// Thread ADDER takes and passes the CTA's turns at query tiles from..end that it does not see,
// adding nothing: needed only where the block holds global keys (see `dq_turn`), since these
// turns cost a masked backward most of its speed (a 32K sequence of 16 documents ran at 0.28×
// the default backward's rate with them, bench/results/determinism-2026-12-02/call2).
template <int Q_ROWS, int KV_ROWS, int ADDER = 0>
__device__ __forceinline__ void pass_unseen_dq_turns(int* dq, int from, int k, int n_kt,
                                                     int q_len, int q_start, int kv_start,
                                                     int global) {
    if (!DETERMINISTIC || !MASKED || kv_start >= global || threadIdx.x != ADDER) return;
    for (int qt = from; qt < (q_len + Q_ROWS - 1) / Q_ROWS; ++qt) {
        wait_add_turn(dq + qt, dq_turn<Q_ROWS, KV_ROWS>(qt, k, n_kt, q_start, kv_start));
        pass_add_turn(dq + qt);
    }
}
// After the CTA's additions to its last query tile (fenced by each adding thread, then a CTA
// barrier): thread 0 passes that turn on, then those of the tiles after it.
template <int Q_ROWS, int KV_ROWS>
__device__ __forceinline__ void pass_last_dq_turns(int* dq, int last, int k, int n_kt, int q_len,
                                                   int q_start, int kv_start, int global) {
    if (!DETERMINISTIC || threadIdx.x != 0) return;
    pass_add_turn(dq + last);
    pass_unseen_dq_turns<Q_ROWS, KV_ROWS>(dq, last + 1, k, n_kt, q_len, q_start, kv_start,
                                          global);
}
// The turns at dK and dV around the CTA's additions to them (GQA's shared f32 accumulators):
// every thread waits behind thread 0, and passes after fencing its own additions.
__device__ __forceinline__ void wait_kv_turn(const int* kv, int k, int place) {
    if (!DETERMINISTIC || !kv) return;
    if (threadIdx.x == 0) wait_add_turn(kv + k, place);
    __syncthreads();
}
__device__ __forceinline__ void pass_kv_turn(int* kv, int k) {
    if (!DETERMINISTIC || !kv) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) pass_add_turn(kv + k);
}
// A key tile that no query tile of the block sees (t_begin >= the seen end) still takes its
// turns: at the query tiles from t_begin on and at dK/dV, adding nothing. Thread 0 alone.
template <int Q_ROWS, int KV_ROWS>
__device__ __forceinline__ void skip_turns(int* dq, int* kv, int t_begin, int k, int n_kt,
                                           int q_len, int q_start, int kv_start, int global,
                                           int place) {
    if (!DETERMINISTIC || threadIdx.x != 0) return;
    pass_unseen_dq_turns<Q_ROWS, KV_ROWS>(dq, t_begin, k, n_kt, q_len, q_start, kv_start, global);
    if (kv) {
        wait_add_turn(kv + k, place);
        pass_add_turn(kv + k);
    }
}
