// The 16-bit formats, shared by the attention kernels (common.cuh) and the model's kernels
// (model.cu): values travel as raw `unsigned short` and are converted here. Header-free on
// purpose: NVRTC compiles this without any include path, so a machine's CUDA installation
// layout cannot break the build. The host prepends `#define DTYPE_BF16` or `#define DTYPE_F16`.

typedef unsigned short u16;
typedef unsigned int u32;

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
// One value, round to nearest, ties to even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 to_half(float f) {
    u32 b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}
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
__device__ __forceinline__ u16 to_half(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
#error "define DTYPE_BF16 or DTYPE_F16"
#endif
