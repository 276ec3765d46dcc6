// The tensor-core rate of the warpgroup products the wgmma attention kernels are built of,
// issued back to back with no softmax, no loads and no barriers: the ceiling each product shape
// and each mix of them allows, measured beside PyTorch's bf16 GEMM in the same device call
// (bench/peers/wgmma_rates.sh). Uses the kernels' own wrappers (kernels/wgmma.cuh), so the
// instructions and descriptors are the ones the kernels issue.
//
// One CTA per SM, two warpgroups of 128 threads, as the kernels' computing warpgroups. Shared
// memory holds random bf16 in [-1, 1) (power depends on the data: zeros run faster), laid out as
// the kernels' tiles are (128-byte swizzle, 1024-byte 8-row groups). Each warpgroup keeps two
// groups of products in flight (commit, then wait for all but the last), so the tensor cores
// never wait for an issue. FLOPs: 2·64·N·16 per m64nNk16.
//
// Build and run (GPU machine): nvcc -arch=sm_90a -O3 -std=c++17 -o wgmma_rates wgmma_rates.cu
// then ./wgmma_rates; prints one JSON line per case.

#define HEAD_DIM 128
#define WG_DIM 128
#define DTYPE_BF16
#define MASKED 0
#define NUM_SMS 132
#define FWD_WGMMA 1
#include <cstdio>
#include <cstdlib>

// clang-format off
#include "../../kernels/half.cuh"
#include "../../kernels/common.cuh"
#include "../../kernels/wgmma.cuh"
// clang-format on

// The cases: a product shape alone, or the d128 backward's five products per query tile (each
// 64×64 with K = 128: eight m64n64k16 steps) in the kernel's operand modes, and variants of that
// mix that a restructure would give.
enum Case {
    SS64,         // m64n64k16, A and B from shared memory, K-major (Sᵀ, dPᵀ)
    SS64_T,       // the same with A and B MN-major (dQ = dS·K)
    RS64,         // m64n64k16, A in registers, B MN-major (dV, dK)
    SS128,        // m64n128k16 (the forward's S)
    RS128,        // m64n128k16, A in registers (the forward's P·V)
    MIX,          // Sᵀ, dPᵀ (SS), dV (RS), dQ (SS, MN-major), dK (RS): the backward now
    MIX_NODQ,     // the same without dQ
    MIX_RS128,    // dV and dK as m64n128k16 (four each) in place of two m64n64k16 a step
    MIX_KV_REGS,  // Sᵀ and dPᵀ with K and V as register A operands (RS)
    CASES
};
static const char* NAMES[CASES] = {"ss64", "ss64_mn", "rs64", "ss128", "rs128",
                                   "mix", "mix_nodq", "mix_rs128", "mix_kv_regs"};
// m64n64k16-equivalents (2·64·64·16 FLOPs) a warpgroup issues per round of each case.
static const int UNITS[CASES] = {16, 16, 32, 32, 32, 40, 32, 40, 40};

constexpr u32 TILE = 128 * 128 * 2;  // 128 rows × 128 columns of 16-bit values: 32 KiB
constexpr u32 SMEM = 4 * TILE + 1024;

// Eight m64n64k16 steps over K = 128 from shared memory: K-major operands step 32 bytes within
// a column atom and 64·128 bytes between atoms; MN-major ones 16 rows (2048 bytes) a step.
template <int T>
__device__ __forceinline__ void ss_k128(float* acc, u32 a, u32 b) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const u32 step = T ? kk * 2048 : (kk / 4) * 64 * 128 + (kk % 4) * 32;
        wg_ss<T, T>(acc, wg_desc(a + step), wg_desc(b + step), kk > 0);
    }
}
// Eight m64n64k16 steps with A in registers and B MN-major.
__device__ __forceinline__ void rs_k128(float* acc, const u32 (*a)[4], u32 b) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wg_rs(acc, a[kk % 4], wg_desc(b + kk * 2048));
}

template <int C>
__global__ void __launch_bounds__(256, 1) rates(int rounds, float* sink) {
    unsigned char* gen;
    const u32 base = smem_base1024(&gen);
    // Random bf16 in [-1, 1) from a hash of the index: the same on every SM.
    for (u32 i = threadIdx.x; i < 4 * TILE / 4; i += blockDim.x) {
        u32 h = i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float lo = (float)(h & 0xffff) / 32768.f - 1.f;
        const float hi = (float)(h >> 16) / 32768.f - 1.f;
        reinterpret_cast<u32*>(gen)[i] = pack2(lo, hi);
    }
    fence_async_smem();
    __syncthreads();
    const int wg = threadIdx.x / 128;
    // Each warpgroup reads its own 64 rows of A-side tiles (as a warpgroup's keys) and every
    // warpgroup the same B-side tiles (as a query tile).
    const u32 a0 = base + wg * 64 * 128, a1 = base + TILE + wg * 64 * 128;
    const u32 b0 = base + 2 * TILE, b1 = base + 3 * TILE;
    u32 frag[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            frag[k][j] = pack2((threadIdx.x % 7) * 0.1f - 0.3f, (k * 4 + j) * 0.05f - 0.4f);

    float x[64], y[64], z[64];  // accumulators: two groups in flight, and the mix's dK and dV
#pragma unroll
    for (int i = 0; i < 64; ++i) x[i] = y[i] = z[i] = 0.f;

    for (int r = 0; r < rounds; ++r) {
        wg_fence();
        if constexpr (C == SS64 || C == SS64_T) {
            ss_k128<C == SS64_T>(x, a0, b0);
            wg_commit();
            ss_k128<C == SS64_T>(y, a1, b1);
            wg_commit();
        } else if constexpr (C == RS64) {
            rs_k128(x, frag, b0);
            rs_k128(x + 32, frag, b0 + 64 * 128);
            wg_commit();
            rs_k128(y, frag, b1);
            rs_k128(y + 32, frag, b1 + 64 * 128);
            wg_commit();
        } else if constexpr (C == SS128) {
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                const u32 step = (kk / 4) * 128 * 128 + (kk % 4) * 32;
                wg_ss128<0, 0>(x, wg_desc(a0 + step), wg_desc(b0 + step), kk > 0);
            }
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                const u32 step = (kk / 4) * 128 * 128 + (kk % 4) * 32;
                wg_ss128<0, 0>(y, wg_desc(a1 + step), wg_desc(b1 + step), kk > 0);
            }
            wg_commit();
        } else if constexpr (C == RS128) {
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)
                wg_rs128(x, frag[kk % 4], wg_desc(b0 + kk * 2048, 64 * 128));
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 8; ++kk)
                wg_rs128(y, frag[kk % 4], wg_desc(b1 + kk * 2048, 64 * 128));
            wg_commit();
        } else {
            // One query tile of the d128 backward: turn 1 (Sᵀ into x, dPᵀ into x + 32), turn 2
            // (dV into z, dQ into y, dK into y + 32 and z + 32 share: accumulators only need to
            // exist, their sums are not used).
            if constexpr (C == MIX_KV_REGS) {
                rs_k128(x, frag, b0);
                rs_k128(x + 32, frag, b1);
            } else {
                ss_k128<0>(x, a0, b0);
                ss_k128<0>(x + 32, a1, b1);
            }
            wg_commit();
            if constexpr (C == MIX_RS128) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_rs128(z, frag[kk], wg_desc(b1 + kk * 2048, 64 * 128));
            } else {
                rs_k128(z, frag, b1);
            }
            if constexpr (C != MIX_NODQ) ss_k128<1>(y, a1, b0);
            if constexpr (C == MIX_RS128) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wg_rs128(y, frag[kk], wg_desc(b0 + kk * 2048, 64 * 128));
            } else {
                rs_k128(y + 32, frag, b0);
            }
            wg_commit();
        }
        wg_wait<1>();
    }
    wg_wait<0>();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += x[i] + y[i] + z[i];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <int C>
static double time_case(int sms, int rounds, float* sink) {
    cudaFuncSetAttribute(rates<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    rates<C><<<sms, 256, SMEM>>>(rounds / 4, sink);  // warm-up
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(t0);
        rates<C><<<sms, 256, SMEM>>>(rounds, sink);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        float ms;
        cudaEventElapsedTime(&ms, t0, t1);
        if (ms < best) best = ms;
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", NAMES[C], cudaGetErrorString(err));
        exit(1);
    }
    const double flops = (double)sms * 2 * rounds * UNITS[C] * 2.0 * 64 * 64 * 16;
    const double tflops = flops / (best * 1e-3) / 1e12;
    printf("{\"case\": \"%s\", \"ms\": %.3f, \"tflops\": %.1f}\n", NAMES[C], best, tflops);
    return tflops;
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float* sink;
    cudaMalloc(&sink, sms * 256 * sizeof(float));
    const int rounds = 20000;
    time_case<SS64>(sms, rounds, sink);
    time_case<SS64_T>(sms, rounds, sink);
    time_case<RS64>(sms, rounds, sink);
    time_case<SS128>(sms, rounds / 2, sink);
    time_case<RS128>(sms, rounds / 2, sink);
    time_case<MIX>(sms, rounds / 2, sink);
    time_case<MIX_NODQ>(sms, rounds / 2, sink);
    time_case<MIX_RS128>(sms, rounds / 2, sink);
    time_case<MIX_KV_REGS>(sms, rounds / 2, sink);
    return 0;
}
