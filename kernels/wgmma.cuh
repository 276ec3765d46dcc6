// Hopper (sm_90a) warpgroup MMA helpers shared by the wgmma forward and backward: aligned
// shared memory, descriptors, the wgmma instructions and the fences around them.
//
// Shared tiles are in the 128-byte swizzle (`swz128`, common.cuh). Each operand a wgmma reads
// here spans at most 64 elements along its contiguous dimension, so a descriptor only ever
// needs the 1024-byte step between groups of 8 rows.

#if FWD_WGMMA || BWD_WGMMA
// WG_DIM (set by the host with HEAD_DIM: src/backend/cuda/launch.rs, wgmma_tile_dim) is the
// width of the kernels' tiles and accumulators, whole column atoms of 64: head dims 80 and 96 run
// in tiles of 128 whose extra columns are zeros; 192 and 256 in tiles of their own width, with
// 64-key tiles (WIDE_HEADS: their accumulators and tiles are twice as large).
#if (WG_DIM != 64 && WG_DIM != 128 && WG_DIM != 192 && WG_DIM != 256) || HEAD_DIM > WG_DIM || \
    HEAD_DIM % 16 != 0
#error "the wgmma kernels take head dims up to 256 in tiles of 64, 128, 192 or 256 columns"
#endif
#define WIDE_HEADS (WG_DIM > 128)

typedef unsigned long long u64;

// A shared address rounded up to the 1024-byte boundary that the 128-byte swizzle's tiles need.
__device__ __forceinline__ u32 align1024(u32 a) { return (a + 1023u) & ~1023u; }
// The dynamic shared memory rounded up to a 1024-byte boundary (launches add 1 KiB of slack):
// returns its shared-space address and sets `generic` to the same byte as a generic pointer.
__device__ __forceinline__ u32 smem_base1024(unsigned char** generic) {
    const u32 raw = smem_addr(smem);
    const u32 base = align1024(raw);
    *generic = smem + (base - raw);
    return base;
}
// The same base, read again where it is called (volatile: never kept from an earlier read), for
// code after a kernel's main loop: a base held through the loop in a uniform register pushed
// the loop's wgmma descriptors out of theirs (d128 backward loop 778 -> 797 instructions).
__device__ __forceinline__ u32 smem_base1024_again() {
    u32 raw;
    asm volatile("mov.u32 %0, smem;" : "=r"(raw));
    return align1024(raw);
}

// Shared-memory matrix descriptor: start address, 1024-byte step between 8-row groups, 128B
// swizzle. `lbo`, the leading offset, matters only to an MN-major operand wider than 64
// elements (V in the forward's P·V with N = 128): the step between its column atoms.
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo = 1024) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(1024 >> 4) << 32) |
           (1ull << 62);
}
// The descriptor `desc` moved `bytes` (a multiple of 16) further into shared memory: the start
// address is its low 14 bits in units of 16 bytes and every shared address lies below 256 KiB,
// so the offset adds to the low word alone. The products of a tile step through their operands
// this way, one add each: built afresh per product (mask, shift, or, for both operands), ptxas
// spent eight instructions a product and kept the loop-invariant ones in registers across the
// backward's loop, where they spilled (bench/HISTORY.md, v24).
__device__ __forceinline__ u64 wg_desc_at(u64 desc, u32 bytes) {
    return (desc & ~0xFFFFFFFFull) | (u32)((u32)desc + (bytes >> 4));
}
// Byte offset of the k-th 16-column step of a K-major tile of `rows` rows: column atom k / 4
// (rows · 128 bytes each), 32 bytes a step within its 128-byte rows. Where the products that
// sum over the head dim (S, Sᵀ, dPᵀ) step through Q, K, V and dO.
__device__ __forceinline__ u32 kmajor_step(int k, u32 rows) {
    return (k / 4) * rows * 128 + (k % 4) * 32;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// This thread's warpgroup (threadIdx.x / 128) as a value the compiler knows to be the same in
// every lane of the warp: a shuffle from lane 0, as CUTLASS's canonical_warp_group_idx. The
// tiles' addresses and descriptors derived from it then live in uniform registers, where wgmma
// reads descriptors from; derived from threadIdx directly, ptxas kept them per thread and moved
// them across (two R2UR) before every product.
__device__ __forceinline__ int warpgroup_index() {
    return __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
}
// Ordinary shared stores (cp.async, st.shared) become visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Orders this thread's generic-proxy accesses to global memory (a turn's acquire or release)
// with its async-proxy ones (the TMA reductions): the deterministic backward's dQ.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}
// Tells the compiler the registers may change here: reads after a wgmma.wait stay after it.
template <int N>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(u32* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Ping-pong between a CTA's two warpgroups (FlashAttention-3's schedule): a warpgroup issues a
// batch of products only in its turn and hands the turn over right after issuing, so that the
// tensor cores work through one warpgroup's products while the other does its softmax instead
// of both doing softmax at once. Warpgroup w waits on named barrier 1 + w; the other arrives on
// it. `pingpong_start` gives warpgroup 0 the first turn and `pingpong_end` consumes the hand-over
// nobody waits for, so both barriers end balanced.
__device__ __forceinline__ void take_turn(int wg) {
    asm volatile("bar.sync %0, 256;" ::"r"(1 + wg) : "memory");
}
__device__ __forceinline__ void pass_turn(int wg) {
    asm volatile("bar.arrive %0, 256;" ::"r"(2 - wg) : "memory");
}
__device__ __forceinline__ void pingpong_start(int wg) {
    if (wg == 1) pass_turn(1);
}
__device__ __forceinline__ void pingpong_end(int wg) {
    if (wg == 0) take_turn(0);
}

#define WG_D32                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OUT(d)                                                                           \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),          \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (64×64 f32, accumulator layout) = d·[accumulate] + A·B, A and B from shared memory;
// TA / TB = 1 reads that operand MN-major (transposed).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss(float* d, u64 a, u64 b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_AB "." MMA_AB " " WG_D32
        ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : WG_D32_OUT(d)
        : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}

// d += A·B with A (64×16) in registers (four 16-bit pairs per thread, mma.sync's A layout per
// warp) and B from shared memory, MN-major.
__device__ __forceinline__ void wg_rs(float* d, const u32* a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_AB "." MMA_AB " " WG_D32
        ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : WG_D32_OUT(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#define WG_D64                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
    "%56, %57, %58, %59, %60, %61, %62, %63}"

// Register lists of the narrower and in-between products (wg_rs_n).
#define WG_R8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_R40                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
    "%38, %39}"
#define WG_R48                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define WG_R96 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define WG_R128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, " \
    "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_D8_OUT(d)                                                                        \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
        "+f"(d[7])

// The same products with N = 128 (d: 64×128 f32, the two 64-column halves of wg_ss/wg_rs's
// layout one after the other). One instruction reads A once for 128 columns instead of twice.
template <int TA, int TB>
__device__ __forceinline__ void wg_ss128(float* d, u64 a, u64 b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." MMA_AB "." MMA_AB " " WG_D64
        ", %64, %65, p, 1, 1, %67, %68;\n}\n"
        : WG_D32_OUT(d), WG_D32_OUT((d + 32))
        : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}
__device__ __forceinline__ void wg_rs128(float* d, const u32* a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." MMA_AB "." MMA_AB " " WG_D64
        ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : WG_D32_OUT(d), WG_D32_OUT((d + 32))
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// 32 accumulators of a product 64 wide (P or Pᵀ, dSᵀ) as the register A fragments of four
// 16-column steps of the next product (the accumulator layout is the fragment layout): x[kk]
// holds accumulator tiles 2kk and 2kk+1, rounded to 16 bits.
__device__ __forceinline__ void pack_fragments(u32 (*x)[4], const float* v) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const int n0 = 8 * kk, n1 = 8 * kk + 4;
        x[kk][0] = pack2(v[n0], v[n0 + 1]);
        x[kk][1] = pack2(v[n0 + 2], v[n0 + 3]);
        x[kk][2] = pack2(v[n1], v[n1 + 1]);
        x[kk][3] = pack2(v[n1 + 2], v[n1 + 3]);
    }
}

// Stores a u32 (two packed 16-bit values) at shared address `at`.
__device__ __forceinline__ void st_shared_u32(u32 at, u32 x) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(x) : "memory");
}
// Stores one or two f32 at shared address `at` (a u32 address, for arithmetic the generic
// pointer would hide from the compiler, and one register where a generic pointer takes two).
__device__ __forceinline__ void st_shared_f32(u32 at, float x) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(at), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(u32 at, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(x), "f"(y) : "memory");
}
// Loads a u32, an f32, two f32 and 16 bytes from shared address `at`.
__device__ __forceinline__ u32 ld_shared_u32(u32 at) {
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(at) : "memory");
    return x;
}
__device__ __forceinline__ float ld_shared_f32(u32 at) {
    float x;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(x) : "r"(at) : "memory");
    return x;
}
__device__ __forceinline__ float2 ld_shared_f32x2(u32 at) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(at) : "memory");
    return v;
}
__device__ __forceinline__ uint4 ld_shared_u32x4(u32 at) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at)
                 : "memory");
    return v;
}
// Writes a tile staged in shared memory out along whole rows: rows [0, rows) of ROWS rows of
// CHUNKS 16-byte chunks, one chunk a thread and pass, consecutive threads along a row, so that a
// warp's stores cover whole rows (cache lines) where each thread's own accumulator pairs would
// spread a warp's stores over 8 rows. `at(row, chunk)` is a chunk's shared address (the staging's
// swizzle) and `put(row, chunk, v)` stores or adds it. The backward's dK and dV leave this way
// (THREADS: both computing warpgroups), 16-bit or added into f32.
template <int ROWS, int CHUNKS, int THREADS, class At, class Put>
__device__ __forceinline__ void staged_rows_out(int thread, int rows, At at, Put put) {
    static_assert(ROWS * CHUNKS % THREADS == 0, "whole passes");
#pragma unroll
    for (int pass = 0; pass < ROWS * CHUNKS / THREADS; ++pass) {
        const int i = pass * THREADS + thread;
        const int row = i / CHUNKS, chunk = i % CHUNKS;
        if (row >= rows) break;
        put(row, chunk, ld_shared_u32x4(at(row, chunk)));
    }
}
// This thread's bulk groups have read their shared source (they may still be writing).
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// This thread's bulk groups are complete.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// ---- Tensor memory accelerator (TMA) loads, completed on shared-memory barriers (mbarrier).
//
// A tile of rows × WG_DIM 16-bit values is WG_DIM/64 boxes of 64 columns × rows, each
// landing as one column atom in the 128-byte swizzle that wg_desc describes (the host encodes
// the tensor maps with that swizzle: src/backend/cuda/tma.rs). One thread issues the copies of a
// whole tile, where cp.async took 16 per thread per tile and the address arithmetic with them.

// The driver's CUtensorMap (opaque, 128 bytes, 128-byte aligned since CUDA 13), passed by value
// as a __grid_constant__ kernel parameter so that its address is the parameter's own.
struct __align__(128) TensorMap {
    u64 opaque[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes barrier initialisations visible to the async proxy (the TMA unit); a CTA barrier must
// still follow before other threads use them.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives on `bar` and tells it to expect `bytes` more of async copies before its phase ends.
__device__ __forceinline__ void mbar_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Hands registers between warpgroups (all of a warpgroup's warps execute it): a kernel launched
// with 384 threads may use only 168 registers per thread, so the warpgroup that only loads drops
// to 24 and the two that compute take 240. A claim waits until released registers cover it, and
// only the CTA's own count: (168 − 24)·128 = (240 − 168)·256 exactly, so these numbers go
// together (a backward that released only to 32 hung: bench/HISTORY.md, v8).
template <int REGS>
__device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}

// Arrives on `bar` (a consumer releasing the stage the barrier guards).
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// A ring of STAGES buffers with one barrier each (8 bytes apart from `bars`): tile n uses stage
// n % STAGES, and is that stage's (n / STAGES)-th use, i.e. the phase of that parity.
template <int STAGES>
__device__ __forceinline__ u32 stage_bar(u32 bars, int n) {
    return bars + 8 * (n % STAGES);
}
// Waits until tile n's phase of its stage's barrier in the ring at `bars` has completed.
template <int STAGES>
__device__ __forceinline__ void stage_wait(u32 bars, int n) {
    mbar_wait(stage_bar<STAGES>(bars, n), (n / STAGES) & 1);
}
// Adds the box of `map` (f32) at (column, row, head, batch) from shared memory at src into global
// memory: the TMA unit reads it and does the reduction in L2, asynchronously, one instruction
// instead of a vector atomic per thread and pair. It joins this thread's open bulk group
// (bulk_commit closes it). src must have been written before a fence_async_smem (and a barrier,
// where other threads wrote it) and must not change until bulk_wait_read says it has been read.
__device__ __forceinline__ void tma_reduce_add(u32 src, const TensorMap* map, int col, int row,
                                               int head, int batch) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group "
        "[%0, {%1, %2, %3, %4}], [%5];" ::"l"(reinterpret_cast<u64>(map)),
        "r"(col), "r"(row), "r"(head), "r"(batch), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// A barrier of the first `threads` threads (whole warps) only, on hardware barrier `id` (0 is
// __syncthreads').
__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on hardware barrier `id` without waiting: the other side of a named_sync of
// `threads` threads, for a producer handing work to a consumer.
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Copies the box at (column, row, head, batch) of `map` to shared memory at dst; completes on
// bar. The map is four-dimensional ([batch][heads][rows][HEAD_DIM] under the tensor's strides,
// src/backend/cuda/tma.rs), so one kernel reads head-major and sequence-major tensors alike.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, int col, int row,
                                         int head, int batch, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(bar)
        : "memory");
}
// Loads rows row0.. of (batch, head) (ROWS × WG_DIM; rows past the end and columns past
// HEAD_DIM as zeros, the map's out-of-bounds fill) into the swizzled tile at dst, all column
// atoms on barrier bar, which this call arms for the bytes (a box's bytes count in full, filled
// or not).
template <int ROWS>
__device__ __forceinline__ void tma_tile(u32 dst, const TensorMap* map, int row0, int head,
                                         int batch, u32 bar) {
    mbar_expect_bytes(bar, ROWS * WG_DIM * 2);
#pragma unroll
    for (int a = 0; a < WG_DIM / 64; ++a)
        tma_load(dst + a * ROWS * 128, map, a * 64, row0, head, batch, bar);
}

// One m64n{N}k16 product with A in registers (a) and B from shared memory (b): `regs` lists the
// N/2 accumulator operands, `tail` numbers A's four registers and B after them, and the
// variadic part binds the accumulators.
#define WG_RS_N_ASM(N, regs, tail, ...)                                                      \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." MMA_AB "." MMA_AB " " regs \
                 ", " tail ", 1, 1, 1, 1;\n"                                                 \
                 : __VA_ARGS__                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

// d += A·B over N columns of B (MN-major, column atoms `lbo` bytes apart in b), A in registers
// as for wg_rs: d holds N/2 accumulators per thread, column 8·nt + 2t + (e & 1) at 4·nt + e, the
// layout of wg_rs's and wg_rs128's. N = head dim (forward P·V) or what a head dim leaves past its
// first column atom (16 or 32 of 80 or 96: the backward's dK and dV), so products whose output
// spans the head dim compute none of the zero columns a tile of 128 pads it with.
template <int N>
__device__ __forceinline__ void wg_rs_n(float* d, const u32* a, u64 b) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 80 || N == 96 || N == 128 || N == 192 ||
                      N == 256,
                  "no wgmma product written for this width");
    if constexpr (N == 64)
        wg_rs(d, a, b);
    else if constexpr (N == 128)
        wg_rs128(d, a, b);
    else if constexpr (N == 16)
        WG_RS_N_ASM(16, WG_R8, "{%8, %9, %10, %11}, %12", WG_D8_OUT(d));
    else if constexpr (N == 32)
        WG_RS_N_ASM(32, WG_R16, "{%16, %17, %18, %19}, %20", WG_D8_OUT(d), WG_D8_OUT((d + 8)));
    else if constexpr (N == 80)
        WG_RS_N_ASM(80, WG_R40, "{%40, %41, %42, %43}, %44", WG_D32_OUT(d), WG_D8_OUT((d + 32)));
    else if constexpr (N == 96)
        WG_RS_N_ASM(96, WG_R48, "{%48, %49, %50, %51}, %52", WG_D32_OUT(d), WG_D8_OUT((d + 32)),
                    WG_D8_OUT((d + 40)));
    else if constexpr (N == 192)
        WG_RS_N_ASM(192, WG_R96, "{%96, %97, %98, %99}, %100", WG_D32_OUT(d),
                    WG_D32_OUT((d + 32)), WG_D32_OUT((d + 64)));
    else
        WG_RS_N_ASM(256, WG_R128, "{%128, %129, %130, %131}, %132", WG_D32_OUT(d),
                    WG_D32_OUT((d + 32)), WG_D32_OUT((d + 64)), WG_D32_OUT((d + 96)));
}

// d (N/2 accumulators, wg_rs_n's layout) = d·[accumulate] + A·B over N columns of B, A and B
// from shared memory as for wg_ss (the B operand's column atoms `lbo` bytes apart where N spans
// two): the forward's S over 64 or 128 keys, and the wide backward's dQ over a warpgroup's
// columns of the head dim (backward_wgmma_wide.cu).
template <int N, int TA, int TB>
__device__ __forceinline__ void wg_ss_n(float* d, u64 a, u64 b, int accumulate) {
    static_assert(N == 32 || N == 64 || N == 128, "no wgmma product written for this width");
    if constexpr (N == 64)
        wg_ss<TA, TB>(d, a, b, accumulate);
    else if constexpr (N == 128)
        wg_ss128<TA, TB>(d, a, b, accumulate);
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32." MMA_AB "." MMA_AB " " WG_R16
            ", %16, %17, p, 1, 1, %19, %20;\n}\n"
            : WG_D8_OUT(d), WG_D8_OUT((d + 8))
            : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
}

#endif  // FWD_WGMMA || BWD_WGMMA
