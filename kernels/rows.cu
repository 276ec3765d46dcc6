// Per-row and elementwise helpers of the block API: all memory-bound, one warp per row where a
// row-wide value (l, LSE, D) is involved.

extern "C" __global__ void fill_f32(float* x, float value, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = value;
}

extern "C" __global__ void add_f32(float* dst, const float* src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

// O = acc / l, LSE = m + ln l; rows with l = 0 (no visible key) get O = 0, LSE = −∞.
extern "C" __global__ void finalize_rows(const float* m, const float* l, const float* acc,
                                         float* out, float* lse, long rows) {
    const long row = blockIdx.x * (long)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float lr = l[row];
    const float inv = lr > 0.f ? 1.f / lr : 0.f;
    for (int c = lane; c < HEAD_DIM; c += 32) out[row * HEAD_DIM + c] = acc[row * HEAD_DIM + c] * inv;
    if (lane == 0) lse[row] = lr > 0.f ? m[row] + logf(lr) : NEG_INF;
}

// Stable merge of partial b into a over disjoint keys, written around the larger LSE; −∞ is the
// identity, so rows no side saw stay exactly as they are.
extern "C" __global__ void merge_rows(float* out_a, float* lse_a, const float* out_b,
                                      const float* lse_b, long rows) {
    const long row = blockIdx.x * (long)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float la = lse_a[row], lb = lse_b[row];
    const float hi = fmaxf(la, lb);
    if (hi == NEG_INF) return;
    const float wa = expf(la - hi), wb = expf(lb - hi);
    const float sum = wa + wb;
    const float ca = wa / sum, cb = wb / sum;
    for (int c = lane; c < HEAD_DIM; c += 32)
        out_a[row * HEAD_DIM + c] = ca * out_a[row * HEAD_DIM + c] + cb * out_b[row * HEAD_DIM + c];
    __syncwarp();
    if (lane == 0) lse_a[row] = hi + logf(sum);
}

__device__ __forceinline__ float load_elem(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float load_elem(const u16* p, long i) { return to_f32(p[i]); }

// Where row `row` of the statistics order ([batch·heads][q_len]) starts in a tensor under `s`.
__device__ __forceinline__ long long row_at(Strides s, long row, long q_len, int heads) {
    const long bh = row / q_len, r = row % q_len;
    return (bh / heads) * s.batch + (bh % heads) * s.head + r * s.row;
}

// D = rowsum(dO ∘ O), O in f32 (block API partials) or the input dtype (fast path), each under
// its strides.
template <typename OT>
__device__ __forceinline__ void delta_body(const OT* out, Strides os, const u16* dout, Strides ds,
                                           float* delta, long rows, long q_len, int heads) {
    const long row = blockIdx.x * (long)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const OT* o = out + row_at(os, row, q_len, heads);
    const u16* d = dout + row_at(ds, row, q_len, heads);
    float acc = 0.f;
    for (int c = lane; c < HEAD_DIM; c += 32) acc += load_elem(o, c) * to_f32(d[c]);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, k);
    if (lane == 0) delta[row] = acc;
}

extern "C" __global__ void delta_f32(const float* out, Strides os, const u16* dout, Strides ds,
                                     float* delta, long rows, long q_len, int heads) {
    delta_body(out, os, dout, ds, delta, rows, q_len, heads);
}

extern "C" __global__ void delta_half(const u16* out, Strides os, const u16* dout, Strides ds,
                                      float* delta, long rows, long q_len, int heads) {
    delta_body(out, os, dout, ds, delta, rows, q_len, heads);
}
