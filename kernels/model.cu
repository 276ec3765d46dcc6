// The LLaMA model's elementwise and row-wise kernels (`model::cuda`); the matrix products run in
// cuBLAS. Header-free like the attention kernels: 16-bit values travel as raw `unsigned short`
// and are converted by half.cuh's helpers (prepended by the host, with NEG_INF); all arithmetic
// is f32 (f64 for the gradient-norm sum and the rotary angles).
//
// The host prepends `#define DTYPE_BF16` or `#define DTYPE_F16` (the backend's 16-bit format).
// A tensor argument that may be either 16-bit or f32 comes as `(const void* p, int p_half)`:
// `ld`/`st` pick the representation at run time (a warp-uniform branch, free next to the memory
// traffic), so one kernel serves every combination the model passes.

__device__ __forceinline__ float ld(const void* p, int half, long i) {
    return half ? to_f32(((const u16*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ void st(void* p, int half, long i, float v) {
    if (half)
        ((u16*)p)[i] = to_half(v);
    else
        ((float*)p)[i] = v;
}

#define GRID_STRIDE(i, n) \
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
    __shared__ T part[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_sum(v);
    __syncthreads();  // an earlier call may still be reading `part`
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? part[lane] : (T)0;
    return warp_sum(v);
}

// Larger value wins; among equal values the smaller index (the first maximum, as on the CPU).
__device__ __forceinline__ void take_max(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

__device__ void block_argmax(float& v, int& i) {
    __shared__ float pv[32];
    __shared__ int pi[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_max(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    __syncthreads();
    if (lane == 0) {
        pv[warp] = v;
        pi[warp] = i;
    }
    __syncthreads();
    const bool has = lane < (int)(blockDim.x / 32);
    v = has ? pv[lane] : NEG_INF;
    i = has ? pi[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_max(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// ---- elementwise ----

// The elementwise kernels move 8 consecutive elements a thread, one 16-byte access per 16-bit
// tensor and two per f32 one, where every pointer they touch is 16-byte aligned, then whatever
// is left one element at a time. One element a thread (2-byte accesses) reached about half the
// memory bandwidth: swiglu moved 1.6 TB/s of an H100's 3.35 at 32K tokens.

__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15ull) == 0; }

// v[0..N) = elements i..i+N of a 16-bit or f32 tensor, as f32 (N = 8: i a multiple of 8).
template <int N>
__device__ __forceinline__ void ldn(const void* p, int half, long i, float* v) {
    if (N == 8 && half) {
        const uint4 raw = *(const uint4*)((const u16*)p + i);
        const u16* h = (const u16*)&raw;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = to_f32(h[k]);
    } else if (N == 8) {
        const float4 a = *(const float4*)((const float*)p + i);
        const float4 b = *(const float4*)((const float*)p + i + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) v[k] = ld(p, half, i + k);
    }
}

// Elements i..i+N of a 16-bit or f32 tensor = v[0..N) (rounded where 16-bit).
template <int N>
__device__ __forceinline__ void stn(void* p, int half, long i, const float* v) {
    if (N == 8 && half) {
        uint4 raw;
        u16* h = (u16*)&raw;
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = to_half(v[k]);
        *(uint4*)((u16*)p + i) = raw;
    } else if (N == 8) {
        *(float4*)((float*)p + i) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4*)((float*)p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) st(p, half, i + k, v[k]);
    }
}

// Runs AT(N, i), which does elements i..i+N, over n elements: N = 8 while `vec` (every pointer
// aligned) and whole groups of 8 remain, then N = 1. Launched with a thread per 8 elements
// (`shapes::vector`).
#define ELEMENTWISE(n, vec, AT)                                                      \
    do {                                                                             \
        const long first_ = blockIdx.x * (long)blockDim.x + threadIdx.x;             \
        const long stride_ = (long)gridDim.x * blockDim.x;                           \
        const long groups_ = (vec) ? (n) / 8 : 0;                                    \
        for (long j_ = first_; j_ < groups_; j_ += stride_) AT(8, j_ * 8);           \
        for (long i_ = groups_ * 8 + first_; i_ < (n); i_ += stride_) AT(1, i_);     \
    } while (0)

// A 16-bit copy of any tensor: the scratch operand cuBLAS needs when a GEMM input is f32.
template <int N>
__device__ __forceinline__ void cast_at(const void* src, int src_half, u16* dst, long i) {
    float v[N];
    ldn<N>(src, src_half, i, v);
    stn<N>(dst, 1, i, v);
}

extern "C" __global__ void cast_to_half(const void* src, int src_half, u16* dst, long n) {
#define AT(N, i) cast_at<N>(src, src_half, dst, i)
    ELEMENTWISE(n, aligned16(src) && aligned16(dst), AT);
#undef AT
}

template <int N>
__device__ __forceinline__ void add_at(void* dst, int dst_half, const void* src, int src_half, long i) {
    float a[N], b[N];
    ldn<N>(dst, dst_half, i, a);
    ldn<N>(src, src_half, i, b);
#pragma unroll
    for (int k = 0; k < N; k++) a[k] += b[k];
    stn<N>(dst, dst_half, i, a);
}

extern "C" __global__ void add_assign(void* dst, int dst_half, const void* src, int src_half, long n) {
#define AT(N, i) add_at<N>(dst, dst_half, src, src_half, i)
    ELEMENTWISE(n, aligned16(dst) && aligned16(src), AT);
#undef AT
}

// SplitMix64's output function (model::init::mix).
__device__ __forceinline__ unsigned long long splitmix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random weights drawn on the device: elements offset..offset + n of the counter-based stream
// `key`, bit for bit as model::init::uniform draws them on the CPU (an exact int-to-float
// conversion and one rounded multiplication), then rounded to 16 bits as an upload rounds.
extern "C" __global__ void uniform(u16* dst, long n, unsigned long long key, unsigned long long offset,
                                   float step) {
    GRID_STRIDE(i, n) {
        unsigned long long h = splitmix(key + (offset + (unsigned long long)i + 1ull) * 0x9e3779b97f4a7c15ull);
        int k = (int)(h >> 41);
        dst[i] = to_half(__fmul_rn((float)(2 * k + 1 - (1 << 23)), step));
    }
}

// acc += Σ x² over elements i..i+N, squared and added in acc's precision (f32 for a norm's
// row, f64 for the gradient norm).
template <int N, typename A>
__device__ __forceinline__ void squares_at(const void* x, int x_half, long i, A& acc) {
    float v[N];
    ldn<N>(x, x_half, i, v);
#pragma unroll
    for (int k = 0; k < N; k++) acc += (A)v[k] * v[k];
}

// One f64 partial sum of squares per block (8 elements a thread where aligned); the host adds
// the partials of every tensor of the norm after one copy.
extern "C" __global__ void sum_squares(const void* x, int x_half, long n, double* partial) {
    double acc = 0.0;
#define AT(N, i) squares_at<N>(x, x_half, i, acc)
    ELEMENTWISE(n, aligned16(x), AT);
#undef AT
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

// m = silu(g) ∘ u.
template <int N>
__device__ __forceinline__ void swiglu_at(const void* g, int g_half, const void* u, int u_half, u16* m,
                                          long i) {
    float gv[N], uv[N];
    ldn<N>(g, g_half, i, gv);
    ldn<N>(u, u_half, i, uv);
#pragma unroll
    for (int k = 0; k < N; k++) gv[k] = gv[k] * sigmoid(gv[k]) * uv[k];
    stn<N>(m, 1, i, gv);
}

extern "C" __global__ void swiglu(const void* g, int g_half, const void* u, int u_half, u16* m, long n) {
#define AT(N, i) swiglu_at<N>(g, g_half, u, u_half, m, i)
    ELEMENTWISE(n, aligned16(g) && aligned16(u) && aligned16(m), AT);
#undef AT
}

// dg = dm∘u∘σ(g)(1 + g(1 − σ(g))), du = dm∘silu(g).
template <int N>
__device__ __forceinline__ void swiglu_backward_at(const void* g, int g_half, const void* u, int u_half,
                                                   const void* dm, int dm_half, u16* dg, u16* du,
                                                   long i) {
    float gv[N], uv[N], d[N], dgv[N], duv[N];
    ldn<N>(g, g_half, i, gv);
    ldn<N>(u, u_half, i, uv);
    ldn<N>(dm, dm_half, i, d);
#pragma unroll
    for (int k = 0; k < N; k++) {
        const float s = sigmoid(gv[k]);
        dgv[k] = d[k] * uv[k] * s * (1.f + gv[k] * (1.f - s));
        duv[k] = d[k] * gv[k] * s;
    }
    stn<N>(dg, 1, i, dgv);
    stn<N>(du, 1, i, duv);
}

extern "C" __global__ void swiglu_backward(const void* g, int g_half, const void* u, int u_half,
                                           const void* dm, int dm_half, u16* dg, u16* du, long n) {
#define AT(N, i) swiglu_backward_at<N>(g, g_half, u, u_half, dm, dm_half, dg, du, i)
    const bool vec = aligned16(g) && aligned16(u) && aligned16(dm) && aligned16(dg) && aligned16(du);
    ELEMENTWISE(n, vec, AT);
#undef AT
}

// AdamW's hyperparameters for one step: moments' decays, their bias corrections, the rate,
// epsilon, the decoupled weight decay and the factor on the gradient (the global-norm clip's).
struct Adam {
    float b1, b2, c1, c2, lr, eps, wd, gs;
};

// Elements i..i+N of a 16-bit tensor as raw bits (N = 8: one 16-byte access).
template <int N>
__device__ __forceinline__ void ld_bits(const u16* p, long i, u16* b) {
    if (N == 8) {
        const uint4 raw = *(const uint4*)(p + i);
#pragma unroll
        for (int k = 0; k < 8; k++) b[k] = ((const u16*)&raw)[k];
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) b[k] = p[i + k];
    }
}

template <int N>
__device__ __forceinline__ void st_bits(u16* p, long i, const u16* b) {
    if (N == 8) {
        uint4 raw;
#pragma unroll
        for (int k = 0; k < 8; k++) ((u16*)&raw)[k] = b[k];
        *(uint4*)(p + i) = raw;
    } else {
#pragma unroll
        for (int k = 0; k < N; k++) p[i + k] = b[k];
    }
}

// A bf16 weight's f32 master kept as its low half: the weight holds the upper 16 bits of the
// master's bits rounded to nearest (ties away from zero), the low half the lower 16 bits, so
// the two give the f32 back exactly (`backend::cuda::master_split`/`master_join` on the host,
// which the tests hold these to). bf16 has f32's exponent, so the upper half is the weight.
__device__ __forceinline__ float master_joined(u16 hi, u16 lo) {
    return __uint_as_float(((u32)hi << 16) + (u32)(int)(short)lo);
}

__device__ __forceinline__ void master_split(float x, u16& hi, u16& lo) {
    const u32 b = __float_as_uint(x);
    // A NaN's rounded bits could carry into the sign; it stays a NaN (the finite check sees it).
    hi = isnan(x) ? (u16)0x7fc0 : (u16)((b + 0x8000u) >> 16);
    lo = (u16)b;
}

// One AdamW step (bias-corrected moments, decoupled decay); m and v are f32, the parameter is
// either representation. With a master (non-null) the master is updated and the parameter
// becomes its rounding, so updates below half a 16-bit step accumulate; the master is either
// an f32 copy or, `master_lo` set (bf16 parameters), the low halves above. With none, the
// parameter is updated in place (exact only where it is f32).
template <int N>
__device__ __forceinline__ void adamw_at(void* p, int p_half, const void* g, int g_half, float* m,
                                         float* v, void* master, int master_lo, const Adam& a, long i) {
    float gi[N], mi[N], vi[N], pi[N];
    u16 hi[N], lo[N];
    ldn<N>(g, g_half, i, gi);
#pragma unroll
    for (int k = 0; k < N; k++) gi[k] *= a.gs;
    ldn<N>(m, 0, i, mi);
    ldn<N>(v, 0, i, vi);
    if (master_lo) {
        ld_bits<N>((const u16*)p, i, hi);
        ld_bits<N>((const u16*)master, i, lo);
#pragma unroll
        for (int k = 0; k < N; k++) pi[k] = master_joined(hi[k], lo[k]);
    } else if (master) {
        ldn<N>(master, 0, i, pi);
    } else {
        ldn<N>(p, p_half, i, pi);
    }
#pragma unroll
    for (int k = 0; k < N; k++) {
        mi[k] = a.b1 * mi[k] + (1.f - a.b1) * gi[k];
        vi[k] = a.b2 * vi[k] + (1.f - a.b2) * gi[k] * gi[k];
        const float update = (mi[k] / a.c1) / (sqrtf(vi[k] / a.c2) + a.eps);
        pi[k] = pi[k] - a.lr * (update + a.wd * pi[k]);
    }
    stn<N>(m, 0, i, mi);
    stn<N>(v, 0, i, vi);
    if (master_lo) {
#pragma unroll
        for (int k = 0; k < N; k++) master_split(pi[k], hi[k], lo[k]);
        st_bits<N>((u16*)p, i, hi);
        st_bits<N>((u16*)master, i, lo);
        return;
    }
    if (master) stn<N>(master, 0, i, pi);
    stn<N>(p, p_half, i, pi);
}

extern "C" __global__ void adamw(void* p, int p_half, const void* g, int g_half, float* m, float* v,
                                 void* master, int master_lo, long n, float b1, float b2, float c1,
                                 float c2, float lr, float eps, float wd, float gs) {
    const Adam a = {b1, b2, c1, c2, lr, eps, wd, gs};
    const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && aligned16(master);
#define AT(N, i) adamw_at<N>(p, p_half, g, g_half, m, v, master, master_lo, a, i)
    ELEMENTWISE(n, vec, AT);
#undef AT
}

// The exact f32 value of bf16 weights whose masters are their low halves.
extern "C" __global__ void master_join(const u16* p, const u16* lo, float* out, long n) {
    GRID_STRIDE(i, n) out[i] = master_joined(p[i], lo[i]);
}

// ---- embedding ----

// out[r] = table[tokens[r]] (tokens checked against the vocabulary on the host).
extern "C" __global__ void embed(const void* table, int table_half, const u32* tokens, u16* out,
                                 long rows, int dim) {
    GRID_STRIDE(i, rows * dim) {
        const long r = i / dim;
        out[i] = to_half(ld(table, table_half, (long)tokens[r] * dim + i % dim));
    }
}

// dtable[tokens[r]] += dy[r]; repeated tokens meet in atomics.
extern "C" __global__ void embed_backward(float* dtable, const u32* tokens, const void* dy, int dy_half,
                                          long rows, int dim) {
    GRID_STRIDE(i, rows * dim) {
        const long r = i / dim;
        atomicAdd(dtable + (long)tokens[r] * dim + i % dim, ld(dy, dy_half, i));
    }
}

// ---- RMS norm: one block per row ----
// A row's elements go 8 to a thread (16-byte accesses) where the width is a multiple of 8 and
// every pointer is aligned, else one at a time. The one-at-a-time loop reached about a third of
// the memory bandwidth (the forward 0.22 ms, the backward 0.8 ms for 16384 x 4096 on an H100).

// Runs AT(N, c), which does columns c..c+N of the block's row, over `dim` columns.
#define ROW_EACH(dim, vec, AT)                                                                    \
    do {                                                                                          \
        if (vec)                                                                                  \
            for (int c_ = 8 * threadIdx.x; c_ < (dim); c_ += 8 * blockDim.x) AT(8, c_);           \
        else                                                                                      \
            for (int c_ = threadIdx.x; c_ < (dim); c_ += blockDim.x) AT(1, c_);                   \
    } while (0)

// Whether a row kernel can take its rows 8 columns at a time: rows of a multiple of 8 columns
// start 16-byte aligned in a 16-byte aligned tensor of 16-bit or f32 values.
__device__ __forceinline__ bool rows_of_8(int dim, const void* a, const void* b, const void* c,
                                          const void* d) {
    return dim % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

template <int N>
__device__ __forceinline__ void norm_at(const void* x, int x_half, const void* w, int w_half, u16* y,
                                        long base, int c, float s) {
    float v[N], g[N];
    ldn<N>(x, x_half, base + c, v);
    ldn<N>(w, w_half, c, g);
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = v[k] * s * g[k];
    stn<N>(y, 1, base + c, v);
}

// y = x · rstd · w, rstd = 1/√(mean(x²) + eps): the sum of squares reduced over the block, then
// the scaled row (read again from L1).
extern "C" __global__ void rmsnorm(const void* x, int x_half, const void* w, int w_half, u16* y,
                                   float* rstd, long rows, int dim, float eps) {
    const long row = blockIdx.x;
    if (row >= rows) return;
    const long base = row * dim;
    const bool vec = rows_of_8(dim, x, w, y, y);
    float ss = 0.f;
#define AT(N, c) squares_at<N>(x, x_half, base + c, ss)
    ROW_EACH(dim, vec, AT);
#undef AT
    const float s = 1.f / sqrtf(block_sum(ss) / dim + eps);
#define AT(N, c) norm_at<N>(x, x_half, w, w_half, y, base, c, s)
    ROW_EACH(dim, vec, AT);
#undef AT
    if (threadIdx.x == 0) rstd[row] = s;
}

// Columns c..c+8 of the row at element `base` of a row-major tensor of `dim` columns: 8 at a
// time where `vec` (then dim is a multiple of 8), else one by one, the columns past the row's
// end read as 0 and left unwritten.
__device__ __forceinline__ void ld_row8(const void* p, int half, long base, int c, int dim, bool vec,
                                        float* v) {
    if (vec) {
        ldn<8>(p, half, base + c, v);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = c + k < dim ? ld(p, half, base + c + k) : 0.f;
}

__device__ __forceinline__ void st_row8(void* p, int half, long base, int c, int dim, bool vec,
                                        const float* v) {
    if (vec) {
        stn<8>(p, half, base + c, v);
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (c + k < dim) st(p, half, base + c + k, v[k]);
}

// Runs of 8 columns one thread of the norm's backward holds, 8·blockDim apart:
// `shapes::norm_backward` sizes the block so that they cover a row (`MAX_HIDDEN_SIZE`).
#define NORM_RUNS 4

// dx += rstd·(g − x·rstd²·mean(g∘x)), g = dy∘w, and dw += Σ_rows dy∘x·rstd, in one pass: each
// block takes every gridDim.x-th row and each thread the same columns of every row, so the
// gain's gradient sums in registers and leaves by one atomic a column a block. (A separate
// column-sum kernel read x and dy a second time.)
extern "C" __global__ void rmsnorm_backward(const void* x, int x_half, const void* w, int w_half,
                                            const float* rstd, const void* dy, int dy_half, void* dx,
                                            int dx_half, float* dw, long rows, int dim) {
    const bool vec = rows_of_8(dim, x, w, dy, dx);
    const int first = 8 * threadIdx.x, stride = 8 * blockDim.x;
    float acc[NORM_RUNS][8] = {};
    for (long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long base = row * dim;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < NORM_RUNS; j++) {
            const int c = first + j * stride;
            if (c >= dim) continue;
            float xv[8], wv[8], dv[8];
            ld_row8(x, x_half, base, c, dim, vec, xv);
            ld_row8(w, w_half, 0, c, dim, vec, wv);
            ld_row8(dy, dy_half, base, c, dim, vec, dv);
#pragma unroll
            for (int k = 0; k < 8; k++) dot += dv[k] * wv[k] * xv[k];
        }
        const float s = rstd[row];
        const float kk = s * s * block_sum(dot) / dim;
#pragma unroll
        for (int j = 0; j < NORM_RUNS; j++) {
            const int c = first + j * stride;
            if (c >= dim) continue;
            float xv[8], wv[8], dv[8], out[8];
            ld_row8(x, x_half, base, c, dim, vec, xv);
            ld_row8(w, w_half, 0, c, dim, vec, wv);
            ld_row8(dy, dy_half, base, c, dim, vec, dv);
            ld_row8(dx, dx_half, base, c, dim, vec, out);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                out[k] += s * (dv[k] * wv[k] - xv[k] * kk);
                acc[j][k] += dv[k] * xv[k] * s;
            }
            st_row8(dx, dx_half, base, c, dim, vec, out);
        }
    }
#pragma unroll
    for (int j = 0; j < NORM_RUNS; j++)
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int c = first + j * stride + k;
            if (c < dim) atomicAdd(dw + c, acc[j][k]);
        }
}

// ---- projection biases ----

// y[r, c] += b[c] on [rows, width], in place in y's representation.
extern "C" __global__ void bias_add(void* y, int y_half, const void* b, int b_half, long rows, int width) {
    GRID_STRIDE(i, rows * width) st(y, y_half, i, ld(y, y_half, i) + ld(b, b_half, i % width));
}

// db += Σ_rows dy: a thread per column sums every gridDim.y-th row in f32, then one atomic.
extern "C" __global__ void bias_dw(const void* dy, int dy_half, float* db, long rows, int width) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float acc = 0.f;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) acc += ld(dy, dy_half, r * width + c);
    atomicAdd(db + c, acc);
}

// ---- rotary embedding ----

// Rotary embeddings in place on [rows, heads, head_dim], Hugging Face's rotate-half pairing
// (j, j + head_dim/2). The angle is formed in f32 from the host's f32 inverse frequencies (as
// Hugging Face and the CPU ops do), its sine and cosine taken in f64 (fast-math single-precision
// sines are far off at the angles of long sequences). sign = −1 rotates back. cos and sin are
// multiplied by `scale` (YaRN's attention factor, else 1), as transformers does.
//
// Rotates pairs j..j+N of every head of row r at position `pos`, each angle's sine and cosine
// taken once for all heads.
template <int N>
__device__ __forceinline__ void rope_at(void* x, int x_half, const float* inv_freq, long r, int j,
                                        int heads, int head_dim, long pos, float sign, float scale) {
    const int pairs = head_dim / 2;
    float cs[N], sn[N];
#pragma unroll
    for (int k = 0; k < N; k++) {
        const float angle = (float)pos * inv_freq[j + k];
        double sd, cd;
        sincos((double)angle, &sd, &cd);
        cs[k] = (float)cd * scale;
        sn[k] = sign * ((float)sd * scale);
    }
    for (int h = 0; h < heads; ++h) {
        const long o = (r * heads + h) * head_dim + j;
        float a[N], b[N], ra[N], rb[N];
        ldn<N>(x, x_half, o, a);
        ldn<N>(x, x_half, o + pairs, b);
#pragma unroll
        for (int k = 0; k < N; k++) {
            ra[k] = a[k] * cs[k] - b[k] * sn[k];
            rb[k] = b[k] * cs[k] + a[k] * sn[k];
        }
        stn<N>(x, x_half, o, ra);
        stn<N>(x, x_half, o + pairs, rb);
    }
}

// x `[rows, heads, head_dim]` rotated in place; rows before `split` sit at start0 + r, the rest
// at start1 + (r − split). A thread per row and 8 pairs (16-byte accesses) where head_dim / 2 is
// a multiple of 8 and x is aligned, else per row and pair (`shapes::vector(rows * pairs)` either
// way, the loop striding over what is left).
extern "C" __global__ void rope(void* x, int x_half, const float* inv_freq, long rows, int heads,
                                int head_dim, long split, long start0, long start1, float sign,
                                float scale) {
    const int pairs = head_dim / 2;
    const bool vec = pairs % 8 == 0 && aligned16(x);
    const int per = vec ? 8 : 1, groups = pairs / per;
    GRID_STRIDE(i, rows * groups) {
        const long r = i / groups;
        const int j = (int)(i % groups) * per;
        const long pos = r < split ? start0 + r : start1 + (r - split);
        if (vec)
            rope_at<8>(x, x_half, inv_freq, r, j, heads, head_dim, pos, sign, scale);
        else
            rope_at<1>(x, x_half, inv_freq, r, j, heads, head_dim, pos, sign, scale);
    }
}

// ---- cross-entropy: one block per row of a chunk of logits ----

// From f32 logits z (one row per block): loss = lse − z[t], the first argmax, and
// dlogits = softmax(z) − onehot(t) in 16 bits for the two gradient GEMMs (which apply the loss
// scale as their alpha).
extern "C" __global__ void xent_rows(const float* logits, const u32* targets, u16* dlogits, float* loss,
                                     u32* argmax, int vocab) {
    const long row = blockIdx.x;
    const float* z = logits + row * vocab;
    float best = NEG_INF;
    int at = 0x7fffffff;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) take_max(best, at, z[c], c);
    block_argmax(best, at);
    float sum = 0.f;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) sum += expf(z[c] - best);
    const float lse = best + logf(block_sum(sum));
    const int t = (int)targets[row];
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        float d = expf(z[c] - lse);
        if (c == t) d -= 1.f;
        dlogits[row * vocab + c] = to_half(d);
    }
    if (threadIdx.x == 0) {
        loss[row] = lse - z[t];
        argmax[row] = (u32)at;
    }
}
