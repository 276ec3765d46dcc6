// Shared helpers for the attention kernels: 16-bit element conversion, tensor-core MMA,
// ldmatrix, cp.async and the shared-memory swizzle. Header-free on purpose: NVRTC compiles this
// without any include path, so a machine's CUDA installation layout cannot break the build.
//
// The host prepends `#define HEAD_DIM ...` and `#define DTYPE_BF16` or `#define DTYPE_F16`.
// 16-bit inputs are carried as raw `unsigned short`; f32 statistics and accumulators as float.

typedef unsigned short u16;
typedef unsigned int u32;

// Dynamic shared memory of every kernel (sized at launch).
extern __shared__ __align__(128) unsigned char smem[];

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF (__int_as_float(0x7f800000))

#if defined(DTYPE_BF16)
#define MMA_AB "bf16"
// Packs two f32 into one register of two 16-bit values, `lo` in the low half (round to nearest).
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float to_f32(u16 x) { return __uint_as_float(((u32)x) << 16); }
#elif defined(DTYPE_F16)
#define MMA_AB "f16"
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float to_f32(u16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
#else
#error "define DTYPE_BF16 or DTYPE_F16"
#endif

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

// Vector atomic add of two adjacent f32 (sm_90): the gradient accumulators.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// Byte offset of element (row, col) in a row-major tile of 16-bit values with ROW_ELEMS per
// row, its 16-byte chunks XOR-swizzled by row so that ldmatrix's 8 rows hit 8 different bank
// groups.
template <int ROW_ELEMS>
__device__ __forceinline__ u32 swz(int row, int col) {
    return (u32)(row * ROW_ELEMS * 2 + ((((col >> 3) ^ (row & 7))) << 4) + (col & 7) * 2);
}

// Copies rows [row0, row0 + ROWS) of a row-major [rows_total][HEAD_DIM] matrix into a swizzled
// shared tile with cp.async; rows past `rows_total` become zeros (never garbage: P·V with P = 0
// must stay finite).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(u32 dst, const u16* base, int row0, int rows_total) {
    constexpr int CHUNKS = HEAD_DIM / 8;
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool ok = row0 + r < rows_total;
        const u16* src = base + (size_t)(ok ? row0 + r : 0) * HEAD_DIM + c * 8;
        cp_async16(dst + swz<HEAD_DIM>(r, c * 8), src, ok ? 16 : 0);
    }
}

// Copies `n` f32 values starting at index row0 (zeros past rows_total) into shared memory.
template <int N>
__device__ __forceinline__ void load_vec(u32 dst, const float* base, int row0, int rows_total) {
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        const bool ok = row0 + i < rows_total;
        cp_async4(dst + i * 4, base + (ok ? row0 + i : 0), ok ? 4 : 0);
    }
}
