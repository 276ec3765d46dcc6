// Layout changes at the model's edge: the model hands attention sequence-major tensors
// [rows, heads, HEAD_DIM] (a linear layer's output as is); the attention kernels read and write
// head-major [heads, rows, HEAD_DIM]. Both layouts are made of the same HEAD_DIM-element vectors
// (one per (row, head)), so a change of layout moves whole vectors: each thread moves 8 elements
// (16 bytes of 16-bit output), reads and writes stay contiguous within a vector.
//
// `source_vector` is the index arithmetic; the tests of src/backend/cuda/layout.rs carry the same
// function in Rust and check it against the host layout code: keep the two identical.

// Index of the vector read for output vector `out` of a [rows, heads] ↔ [heads, rows] change.
__device__ __forceinline__ long source_vector(long out, long rows, long heads, int to_head_major) {
    if (to_head_major) {
        const long h = out / rows, r = out % rows;  // output [heads, rows]
        return r * heads + h;                       // input  [rows, heads]
    }
    const long r = out / heads, h = out % heads;    // output [rows, heads]
    return h * rows + r;                            // input  [heads, rows]
}

#define LAYOUT_CHUNKS (HEAD_DIM / 8)

// Eight elements from chunk `chunk` (of 8) of the source as 16-bit values: 16-bit input is moved
// as is, f32 input rounded to nearest.
__device__ __forceinline__ uint4 load8(const u16* src, long chunk) {
    return reinterpret_cast<const uint4*>(src)[chunk];
}
__device__ __forceinline__ uint4 load8(const float* src, long chunk) {
    const float4* s = reinterpret_cast<const float4*>(src) + chunk * 2;
    const float4 a = s[0], b = s[1];
    return make_uint4(pack2(a.x, a.y), pack2(a.z, a.w), pack2(b.x, b.y), pack2(b.z, b.w));
}

template <typename T>
__device__ __forceinline__ void relayout_body(const T* __restrict__ src, u16* __restrict__ dst,
                                              long rows, long heads, int to_head_major) {
    const long n = rows * heads * LAYOUT_CHUNKS;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long out = i / LAYOUT_CHUNKS, c = i % LAYOUT_CHUNKS;
        const long in = source_vector(out, rows, heads, to_head_major);
        reinterpret_cast<uint4*>(dst)[out * LAYOUT_CHUNKS + c] = load8(src, in * LAYOUT_CHUNKS + c);
    }
}

// 16-bit in (Q, K, V, dO, O): a plain move.
extern "C" __global__ void relayout_half(const u16* src, u16* dst, long rows, long heads,
                                         int to_head_major) {
    relayout_body(src, dst, rows, heads, to_head_major);
}

// f32 in (dQ, dK, dV from the backward; an f32 dO): the cast fused into the move.
extern "C" __global__ void relayout_f32_half(const float* src, u16* dst, long rows, long heads,
                                             int to_head_major) {
    relayout_body(src, dst, rows, heads, to_head_major);
}
