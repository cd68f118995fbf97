/*
 * gpu_kernels.h: the launchers of the CUDA kernels (gpu_kernels.cu, gpu_kernels_moe.cu,
 * gpu_attention.cu), for the GPU executor's files (internal to executor/; the module's public
 * header is exec.h). Every launcher returns cudaGetLastError() after its launches: a launch that was not accepted is
 * reported where it happened.
 */
#ifndef GPU_KERNELS_H
#define GPU_KERNELS_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "exec_gpu.h"

typedef __nv_bfloat16 bf16;

#define GK_CHUNK 1024       /* pairs per permutation chunk */
#define GK_COLSUM_ROWS 128  /* rows per column-sum partial (many blocks: T x 2048 is 1024) */
#define GK_NORM_BLOCKS 1024 /* partial sums of the gradient norm */
#define GK_MAX_EXPERTS 512  /* the router kernels keep a token's scores in registers */

/* Per-tensor fp8: the kernels that write the experts' permuted matrices (the gather, SwiGLU and
 * its backward, the combine's backward) can keep the amax of each expert's rows (E experts, rows
 * from off[e], a device array; the matrix `cols` wide) in amax[0][e] (the SwiGLU backward: its dg's
 * there, its du's in amax[1][e]), as gk_abs_bits, into what the caller zeroed; the quantization
 * of those rows then skips its own pass over them (gk_fp8_cast_known). Without off every "row"
 * of `cols` values is its own: AdamW keeps a weight's amax slice by slice so. A launcher given
 * NULL keeps none. */
struct gk_amax_rows {
    const int *off;
    int E, cols;
    unsigned *amax[2];
};

#ifdef __CUDACC__
/* What the kernels' files share: threads per block, blocks for n items, the alignment test, a
 * block's sum, vector loads and stores of bf16 and fp32. */
#define TPB 256
static inline unsigned blocks_for(size_t n, int per)
{
    return (unsigned)((n + per - 1) / per);
}
/* Whether p sits on an `align`-byte boundary: the launchers' test for their vector paths. */
static __host__ __device__ inline bool aligned(const void *p, size_t align)
{
    return (uintptr_t)p % align == 0;
}
/* The sum over the block of one value per thread, in a fixed order; all threads get it. `red`:
 * shared memory for a float per warp. */
static __device__ __forceinline__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}
/* |x| as ordered bits, what an fp8 amax keeps (a NaN sorts above every number, as ref_fp8.c
 * keeps it); the largest of 8 bf16 values in a 16-byte word. */
static __device__ __forceinline__ unsigned gk_abs_bits(float x)
{
    return __float_as_uint(x) & 0x7FFFFFFFu;
}
static __device__ __forceinline__ unsigned gk_abs_bits8(uint4 v)
{
    const __nv_bfloat162 *b = (const __nv_bfloat162 *)&v;
    unsigned m = 0;
    for (int k = 0; k < 4; k++)
        m = max(m, max(gk_abs_bits(__low2float(b[k])), gk_abs_bits(__high2float(b[k]))));
    return m;
}
/* The block's largest v; all threads get it. `red`: an unsigned a warp. */
static __device__ __forceinline__ unsigned gk_block_max(unsigned v, unsigned *red)
{
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    unsigned m = 0;
    for (int i = 0; i < nw; i++) m = max(m, red[i]);
    return m;
}
/* The expert whose rows hold row r of a permuted matrix (off: E + 1 row offsets): the last e
 * with off[e] <= r; without off, every row its own (r). (test_fp8_host checks it on the host.) */
static inline __host__ __device__ int gk_expert_of(const int *off, int E, int r)
{
    if (!off) return r;
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (off[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}
/* Per-tensor fp8 (struct gk_amax_rows): the block's values into their experts' amax. Every thread
 * of the block calls it (m: the amax of its values, as gk_abs_bits; row: their row, or -1 for
 * none); the block's rows are lo..hi. Rows of one expert: one atomic for the block; else each
 * thread's own. A maximum is exact in any order, so the result is deterministic. */
static __device__ __forceinline__ void gk_rows_amax(const int *off, int E, unsigned *amax,
                                                    unsigned m, int row, int lo, int hi,
                                                    unsigned *red)
{
    int e = gk_expert_of(off, E, lo);
    if (e == gk_expert_of(off, E, hi)) { /* the same for every thread */
        m = gk_block_max(m, red);
        if (threadIdx.x == 0 && m) atomicMax(amax + e, m);
    } else if (row >= 0 && m) {
        atomicMax(amax + gk_expert_of(off, E, row), m);
    }
}
/* The same for an elementwise kernel whose thread i (of nv) holds the V values from element
 * base + i V (base: the launch's first), all in one row (the launcher sees to it) */
template <int V>
static __device__ __forceinline__ void gk_rows_amax_v(const struct gk_amax_rows &am, int which,
                                                      unsigned m, size_t i, size_t nv, size_t base,
                                                      unsigned *red)
{
    size_t c = (size_t)am.cols, first = blockIdx.x * (size_t)blockDim.x,
           last = (first + blockDim.x < nv ? first + blockDim.x : nv) - 1;
    gk_rows_amax(am.off, am.E, am.amax[which], m, i < nv ? (int)((base + i * V) / c) : -1,
                 (int)((base + first * V) / c), (int)((base + last * V + V - 1) / c), red);
}
/* V bf16 values to fp32 and back: one 16-byte (V 8) or 8-byte (V 4) access, the pointer aligned
 * to it; element by element otherwise. */
template <int V> struct bf16_vec; /* the access type of V bf16 values */
template <> struct bf16_vec<4> {
    typedef uint2 type;
};
template <> struct bf16_vec<8> {
    typedef uint4 type;
};

template <int V> __device__ inline void ld_bf16(const bf16 *p, float *f)
{
    if constexpr (V == 8 || V == 4) {
        typename bf16_vec<V>::type r = *(const typename bf16_vec<V>::type *)p;
        const __nv_bfloat162 *b = (const __nv_bfloat162 *)&r;
        for (int k = 0; k < V / 2; k++) {
            float2 t = __bfloat1622float2(b[k]);
            f[2 * k] = t.x;
            f[2 * k + 1] = t.y;
        }
    } else {
        for (int k = 0; k < V; k++) f[k] = __bfloat162float(p[k]);
    }
}

template <int V> __device__ inline void st_bf16(bf16 *p, const float *f)
{
    if constexpr (V == 8 || V == 4) {
        typename bf16_vec<V>::type r;
        __nv_bfloat162 *b = (__nv_bfloat162 *)&r;
        for (int k = 0; k < V / 2; k++) b[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
        *(typename bf16_vec<V>::type *)p = r;
    } else {
        for (int k = 0; k < V; k++) p[k] = __float2bfloat16(f[k]);
    }
}

/* V fp32 values: 16-byte accesses for V a multiple of 4 (the pointer aligned), else element by
 * element. */
template <int V> __device__ inline void ld_f32(const float *p, float *f)
{
    if constexpr (V % 4 == 0) {
        for (int k = 0; k < V; k += 4) {
            float4 q = *(const float4 *)(p + k);
            f[k] = q.x, f[k + 1] = q.y, f[k + 2] = q.z, f[k + 3] = q.w;
        }
    } else {
        for (int k = 0; k < V; k++) f[k] = p[k];
    }
}

/* The activation of (g, u) and, with d, its derivatives times dh: silu(g) u (limit 0), or
 * gpt-oss's clamped form (u' + 1) g' sigmoid(alpha g'), g' = min(g, limit),
 * u' = clamp(u, -limit, limit), the clamps passing no gradient outside their range. */
static __device__ __forceinline__ float act_fwd(float g, float u, float alpha, float limit)
{
    if (limit <= 0.0f) return g * (1.0f / (1.0f + expf(-g))) * u;
    float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
    return (uc + 1.0f) * gc * (1.0f / (1.0f + expf(-alpha * gc)));
}

static __device__ __forceinline__ void act_bwd(float g, float u, float dh, float alpha, float limit,
                                               float *dg, float *du)
{
    if (limit <= 0.0f) {
        float sg = 1.0f / (1.0f + expf(-g));
        *du = dh * g * sg;
        *dg = dh * u * sg * (1.0f + g * (1.0f - sg));
        return;
    }
    float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
    float sg = 1.0f / (1.0f + expf(-alpha * gc));
    *du = u >= -limit && u <= limit ? dh * gc * sg : 0.0f;
    *dg = g <= limit ? dh * (uc + 1.0f) * sg * (1.0f + alpha * gc * (1.0f - sg)) : 0.0f;
}

#define GK_FP8_TILE 128 /* the fp8 kernels' tiles: GK_FP8_TILE x GK_FP8_TILE values */
/* A tile's row in shared memory, in bf16: 130, 65 words, so that consecutive rows start one bank
 * apart; the tile kernels' threads, a block */
#define GK_FP8_TPAD (GK_FP8_TILE + 2)
#define GK_FP8_THREADS 256
/* The tile kernels' maps from a step i (a thread's index, then on by the block's threads) to the
 * values it moves, chosen so that each warp's shared-memory accesses fall in banks of their own
 * (test_fp8_host checks that every value is moved once, and the banks, on the host):
 * - gk_fp8_load_at: the i-th 16-byte load of the input (i < 128 x 16): row r, columns c .. c + 7;
 *   a warp the half of four rows (each row's eight loads 128 coalesced bytes);
 * - gk_fp8_row_at: the i-th run of 16 values along a row (i < 128 x 8): row r, columns c .. c + 15;
 *   a warp four runs (64 bytes of the copy) of eight rows (a warp's eight runs of four rows had
 *   put two runs 32 words apart, one bank);
 * - gk_fp8_col_at: the i-th run of 16 values down a column (i < 128 x 8): column c, rows r ..
 *   r + 15; a warp two runs (32 rows) of 16 columns, whose reads of a row fall in 16 banks
 *   (eight runs of one column, 16 rows apart, had fallen in two banks).
 * The tile scales' scan takes a thread a row (the first 128) or a column (the others). */
static inline __host__ __device__ void gk_fp8_load_at(int i, int *r, int *c)
{
    int task = i / 32, l = i % 32;
    *r = task / 2 * 4 + l / 8;
    *c = (task % 2 * 8 + l % 8) * 8;
}
static inline __host__ __device__ void gk_fp8_row_at(int i, int *r, int *c)
{
    int task = i / 32, l = i % 32;
    *r = task / 2 * 8 + l % 8;
    *c = (task % 2 * 4 + l / 8) * 16;
}
static inline __host__ __device__ void gk_fp8_col_at(int i, int *r, int *c)
{
    int task = i / 32, l = i % 32;
    *c = task % 8 * 16 + l / 2;
    *r = task / 8 * 32 + l % 2 * 16;
}
/* The per-tensor tile kernels' shared tile of fp8 bytes (the transposed copy's way through shared
 * memory): 128 rows of 32 words, word cw of row r at gk_fp8_t8_at(r, cw), the words of each
 * 16-row group apart (XOR), so that a warp's stores along a row and the transpose's reads (a
 * thread a patch, gk_fp8_patch_at: 16 rows from 16 rg, the word cg, one row a time) fall in
 * banks of their own (test_fp8_host). A warp's patches: 4 word columns' 128 rows. */
static inline __host__ __device__ int gk_fp8_t8_at(int r, int cw)
{
    return r * (GK_FP8_TILE / 4) + (cw ^ (((r >> 4) & 7) << 2));
}
static inline __host__ __device__ void gk_fp8_patch_at(int t, int *rg, int *cg)
{
    *rg = t % 32 % 8;
    *cg = t / 32 * 4 + t % 32 / 8;
}
/* Which expert's tile block b is, the experts' tiles in order (rows tiles of 128 a column tile of
 * 128, over `padded` rows: n_e, or n_e rounded up to 16 with the transposed copy), and the
 * expert's region (exec_fp8_regions). (A kernel's thread 0 works it out for its block; test_fp8_host checks it on the host.) */
static inline __host__ __device__ void gk_expert_tile(const int *off, int E, int cols, bool padded,
                                                      size_t b, int *e_, int *r0, int *c0,
                                                      size_t *q_, size_t *s_, size_t *st_)
{
    int ncb = (cols + GK_FP8_TILE - 1) / GK_FP8_TILE;
    size_t q = 0, s = 0, st = 0;
    *e_ = -1; /* past the last tile: none (the launch counts the tiles as this does) */
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e], span = padded ? exec_fp8_pad(n) : n;
        size_t tiles = (size_t)((span + GK_FP8_TILE - 1) / GK_FP8_TILE) * ncb;
        if (b < tiles) {
            *e_ = e, *r0 = (int)(b / ncb) * GK_FP8_TILE, *c0 = (int)(b % ncb) * GK_FP8_TILE;
            *q_ = q, *s_ = s, *st_ = st;
            return;
        }
        b -= tiles;
        exec_fp8_region_next(n, cols, &q, &s, &st);
    }
}

/* The experts' tiles over `padded` rows (gk_expert_tile's count) */
static inline __host__ __device__ size_t gk_expert_tiles(const int *off, int E, int cols,
                                                         bool padded)
{
    size_t tiles = 0, ncb = (size_t)(cols + GK_FP8_TILE - 1) / GK_FP8_TILE;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e], span = padded ? exec_fp8_pad(n) : n;
        tiles += (size_t)((span + GK_FP8_TILE - 1) / GK_FP8_TILE) * ncb;
    }
    return tiles;
}

template <int V> __device__ inline void st_f32(float *p, const float *f)
{
    if constexpr (V % 4 == 0)
        for (int k = 0; k < V; k += 4)
            *(float4 *)(p + k) = make_float4(f[k], f[k + 1], f[k + 2], f[k + 3]);
    else
        for (int k = 0; k < V; k++) p[k] = f[k];
}

#endif

struct gk_adamw {
    float lr, beta1, beta2, eps, wd, c1, c2, scale;
};

cudaError_t gk_init(float *p, size_t n, size_t base, uint64_t seed, float std, bool ones,
                    cudaStream_t s);
/* FP8 (gpu_fp8.cu). `how`: an exec_fp8_scaling. */
/* x (rows x cols bf16, leading dimension ldx) quantized as exec_fp8_quantize does bit for bit
 * (e5m2 1: E5M2, 0: E4M3) into q (rows x cols, row-major) with its dequantization factors
 * sq (1 / scale, laid out by exec_fp8_factor_at), and into qt, x's transpose (cols x ldt, ldt >=
 * rows, the columns beyond rows zero), with its own sqt: for tiles the 1 x 128 tiles of qt's
 * rows (128 x 1 of x), for blocks and the tensor the same scales. Either copy may be NULL.
 * The tensor's scaling takes work: one unsigned of device scratch. */
cudaError_t gk_fp8_cast(const bf16 *x, int ldx, int rows, int cols, int how, int e5m2,
                        unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                        unsigned *work, cudaStream_t s);
/* The experts' SwiGLU (E experts, rows from off[e] (off_dev its device copy), `cols` wide): hm
 * in bf16 as gk_swiglu writes it, and quantized from it in 1 x 128 tiles into each expert's
 * region (exec_fp8_regions) of q, factors sq, as gk_fp8_cast quantizes each expert's rows. */
cudaError_t gk_fp8_swiglu_forward(const bf16 *g, const bf16 *u, const int *off_dev, const int *off,
                                  int E, int cols, float alpha, float limit, int e5m2, bf16 *hm,
                                  unsigned char *q, float *sq, cudaStream_t s);
/* The experts' SwiGLU backward (E experts, rows from off[e] (off_dev its device copy), `cols`
 * wide, a multiple of 4) with its gradients dg and du quantized for their GEMMs instead of written
 * in bf16: each expert's rows into its region (exec_fp8_regions) of qg / qu (row-major, factors
 * sg / su) and qgt / qut (transposed, the rows padded with zeros, exec_fp8_pad; sgt / sut); in
 * 1 x 128 tiles, or with amax per tensor: the expert's amax of dg in amax[e], of du in
 * amax[E + e] (gk_swiglu_backward's, struct gk_amax_rows), its factor the region's first. The
 * same bits as gk_swiglu_backward then gk_fp8_cast on each expert's rows. */
cudaError_t gk_fp8_swiglu_backward(const bf16 *g, const bf16 *u, const bf16 *dhm,
                                   const int *off_dev, const int *off, int E, int cols, float alpha,
                                   float limit, int e5m2, const unsigned *amax, unsigned char *qg,
                                   unsigned char *qgt, float *sg, float *sgt, unsigned char *qu,
                                   unsigned char *qut, float *su, float *sut, cudaStream_t s);
/* gk_fp8_cast on `batch` matrices of the same shape at once: matrix z's input xs elements after
 * x, its copies qs bytes after q and qt, their factors ss floats after sq and sqt, and with the
 * tensor's scaling its amax found into work[z] (batch unsigneds of device scratch), or, with
 * known, known[z] taken as it is (as gk_abs_bits: struct gk_amax_rows), no pass over x for it. */
cudaError_t gk_fp8_cast_batch(const bf16 *x, int ldx, int rows, int cols, int how, int e5m2,
                              unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                              unsigned *work, const unsigned *known, int batch, size_t xs,
                              size_t qs, size_t ss, cudaStream_t s);
/* gk_fp8_cast with per-tensor scaling whose amax is known (*amax, as gk_abs_bits; struct
 * gk_amax_rows): no pass of its own over x. */
cudaError_t gk_fp8_cast_known(const bf16 *x, int ldx, int rows, int cols, int e5m2,
                              unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                              const unsigned *amax, cudaStream_t s);
/* Per-tensor fp8, the experts' input quantized in the permute: each expert's amax over the rows
 * of x (T x h) routed to it (choice: T x k experts) into amax[e] (E of them, as gk_abs_bits),
 * what gk_gather keeps of the permuted rows (struct gk_amax_rows); then gk_fp8_gather places
 * and quantizes the rows with those scales: permuted row p is x's row row_src[p] / k (as
 * gk_gather), expert e's rows from off[e] (off_dev its device copy; cols a multiple of 16) into
 * its region (exec_fp8_regions) of q (row-major) and qt (transposed, the rows padded with zeros,
 * exec_fp8_pad), each region's factor its first (sq, sqt): the same bits as gk_gather then
 * gk_fp8_cast_known on each expert's rows, no bf16 rows written. */
cudaError_t gk_fp8_expert_amax(const bf16 *x, int T, int h, const int *choice, int k, int E,
                               unsigned *amax, cudaStream_t s);
cudaError_t gk_fp8_gather(const bf16 *x, const int *row_src, int k, const int *off_dev,
                          const int *off, int E, int cols, const unsigned *amax, unsigned char *q,
                          float *sq, unsigned char *qt, float *sqt, cudaStream_t s);
/* One operand of an fp8 GEMM: a K-major matrix (row-major, `ld` bytes a row) in E4M3 or E5M2,
 * with its dequantization factors as gk_fp8_cast writes them. */
struct gk_fp8_mat {
    const unsigned char *q;
    const float *sinv;
    int ld, how, e5m2;
};
/* The three layouts of a cuBLASLt matmul (A, B, C = D) destroyed, the NULL ones left */
static inline void gk_lt_layouts_free(cublasLtMatrixLayout_t l[3])
{
    for (int i = 0; i < 3; i++)
        if (l[i]) cublasLtMatrixLayoutDestroy(l[i]);
}
/* The heuristic's first `max` algorithms for op on layouts l within ws_bytes (*n of them into r):
 * without split-K, or with any reduction scheme (split) */
cublasStatus_t gk_lt_heuristics(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                                cublasLtMatrixLayout_t const l[3], size_t ws_bytes, bool split,
                                int max, cublasLtMatmulHeuristicResult_t *r, int *n);
/* cuBLASLt's first algorithm for op on layouts l (A, B, C = D) within ws_bytes of workspace,
 * without split-K (whose results depend on nothing but the algorithm either way, but the bf16
 * expert GEMMs were measured bit-identical across streams without it); with split_if_needed, the
 * heuristic's choice where no algorithm does without it. NOT_SUPPORTED where there is none. */
cublasStatus_t gk_lt_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                          cublasLtMatrixLayout_t const l[3], size_t ws_bytes, bool split_if_needed,
                          cublasLtMatmulAlgo_t *algo);
/* Each of the heuristic's first `max` algorithms without split-K (*n of them into r) run on a, b
 * into c (alpha 1, beta 0; c rows x cols of ybytes-byte elements, ld a row) on stream s: once,
 * the fingerprint of what it wrote into f[i] (gk_fingerprint; fp a device word), once more, then
 * `runs` times each timed by CUDA events, their median into us[i] (microseconds; -1 where the
 * algorithm does not run here). What bench gemm reports and what the fp8 GEMMs pick by. */
cublasStatus_t gk_lt_time_algos(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                                cublasLtMatrixLayout_t const l[3], const void *a, const void *b,
                                void *c, int rows, int cols, int ld, int ybytes, void *ws,
                                size_t ws_bytes, cudaStream_t s, int max, int runs,
                                unsigned long long *fp, cublasLtMatmulHeuristicResult_t *r,
                                double *us, unsigned long long *f, int *n);
/* The algorithms the fp8 GEMMs chose, for a cuBLASLt handle and a workspace size. */
struct gk_fp8_lt;
struct gk_fp8_lt *gk_fp8_lt_create(cublasLtHandle_t lt, size_t ws_bytes);
void gk_fp8_lt_destroy(struct gk_fp8_lt *c);
/* Whether a kind met for the first time picks its algorithm by timing (on from creation); off,
 * it takes the heuristic's first. The executor turns it off after its first update, so that a
 * kind first met later (an expert's rows in a power of two not met before) times nothing inside
 * a measured step. */
void gk_fp8_lt_picks(struct gk_fp8_lt *c, bool on);
/* y (M x N, row-major, ldy; fp32 or bf16, yt) = x w^T + beta y through cuBLASLt's fp8 matmul:
 * x M x K, w N x K, each product dequantized by its operands' factors, fp32 accumulation (fast:
 * Hopper's fp8 accumulator promoted less often, cuBLASLt's FAST_ACCUM, as Transformer Engine's
 * per-tensor recipe runs its forward GEMMs). K, N and the leading dimensions multiples of 16; ws:
 * the handle's workspace. x in 1 x 128 tiles at M not a multiple of EXEC_FP8_PAD: x holds
 * exec_fp8_pad(M) rows (what is past M any bytes: their products are dropped), and tail is
 * EXEC_FP8_PAD x N floats, the caller's scratch (one a stream), for the last rows' GEMM
 * (exec_fp8_factor_at says why); NULL otherwise. Each kind of GEMM (its shape, M and K by power
 * of two, its layouts and scalings) keeps one algorithm: on its first call with beta 0 while
 * picks are on (gk_fp8_lt_picks), the fastest of cuBLASLt's first few that write its first's
 * bits, each timed there (a host sync); else the heuristic's first. */
cublasStatus_t gk_fp8_gemm(struct gk_fp8_lt *c, const struct gk_fp8_mat *w,
                           const struct gk_fp8_mat *x, int M, int N, int K, void *y, int ldy,
                           cudaDataType yt, float beta, bool fast, void *tail, void *ws,
                           cudaStream_t s);
/* gk_fp8_gemm's cuBLASLt matmul for y = x w^T (M a multiple of EXEC_FP8_PAD with block
 * scaling): *op (its scale modes and pointers set) and l (A = w->q, B = x->q, C = D = y), for a
 * benchmark to run by other algorithms (bench gemm); the caller destroys them */
cublasStatus_t gk_fp8_matmul(const struct gk_fp8_mat *w, const struct gk_fp8_mat *x, int M, int N,
                             int K, int ldy, cudaDataType yt, bool fast, cublasLtMatmulDesc_t *op,
                             cublasLtMatrixLayout_t l[3]);
/* One thread that holds the stream for `us` microseconds of the GPU's clock: a benchmark queues
 * its kernels behind it, so that what it times is the GPU's work, not the host's launches (one
 * spinning thread draws little power: a power-capped GPU starts the kernels after it at higher
 * clocks). */
cudaError_t gk_busy_wait(double us, cudaStream_t s);
cudaError_t gk_to_bf16(const float *x, bf16 *y, size_t n, cudaStream_t s);
/* *out = a 64-bit fingerprint of a rows x cols matrix (ld elements a row) of 2- or 4-byte
 * elements (bytes): the sum of a mix of each element's bits and place, so that two matrices that
 * differ in any bit differ in it but for a chance of 2^-64; to tell whether two GEMM algorithms
 * wrote the same bits */
cudaError_t gk_fingerprint(const void *y, int rows, int cols, int ld, int bytes,
                           unsigned long long *out, cudaStream_t s);
cudaError_t gk_to_f32(const bf16 *x, float *y, size_t n, cudaStream_t s);
/* y (T rows of n, stride ld; fp32 y32 or bf16 y16) = b on every row, or y += b (add). */
cudaError_t gk_bias_rows(float *y32, bf16 *y16, int ld, const float *b, int T, int n, bool add,
                         cudaStream_t s);
cudaError_t gk_split(const int *tok, int B, int S, int *in, int *tgt, cudaStream_t s);
cudaError_t gk_embed(const float *emb, const int *tok, int T, int h, float *x, cudaStream_t s);
/* The embedding backward, deterministic and free of atomics: the micro-batch's input positions
 * grouped by token id (a counting sort on the host) in units of at most GK_EMBED_SEG positions, so
 * that a token id seen thousands of times (text read as bytes) is summed by many blocks at once.
 * gk_embed_plan reads the tokens (B rows of S, stride ld) into plan (gk_embed_plan_ints(T) ints,
 * for the GPU as they are); count is vocab zeros of the host's, left zero. gk_embed_backward adds
 * d x (T x h, fp32) into demb's rows; scratch holds w->rows rows of h floats (at most T). */
#define GK_EMBED_SEG 32
struct gk_embed_work {
    int units, multi, rows; /* units of positions; ids with more than one unit; scratch rows */
};
size_t gk_embed_plan_ints(int T);
void gk_embed_plan(const int *tok, int B, int S, int ld, int *count, int *plan,
                   struct gk_embed_work *w);
cudaError_t gk_embed_backward(const float *dx, const int *plan, int T,
                              const struct gk_embed_work *w, int h, float *scratch, float *demb,
                              cudaStream_t s);
/* RMSNorm of T rows of width h into bf16 y16 and (optional) fp32 y32; xc (optional) gets a copy of
 * x (the residual stream's next value starts from it), rstd the rows' 1 / rms. */
cudaError_t gk_rmsnorm(const float *x, int ldx, const float *w, int T, int h, float eps, bf16 *y16,
                       int ld16, float *y32, int ld32, float *xc, int ldc, float *rstd,
                       cudaStream_t s);
/* Its input gradient dx (plus base, optional; may be dx) and, when dx16 is given, its bf16 copy
 * (stride lddx), what the next GEMMs read. */
cudaError_t gk_rmsnorm_backward(const float *x, int ldx, const float *w, const float *rstd,
                                const float *dy, int lddy, const float *base, int ldb, float *dx,
                                bf16 *dx16, int lddx, int T, int h, cudaStream_t s);
/* out[c] (+)= sum_t a[t,c] * b[t,c] * r[t]; part holds ceil(T / GK_COLSUM_ROWS) x n floats. */
cudaError_t gk_colsum(const float *a, int lda, const float *b, int ldb, const float *r, int T,
                      int n, float *part, float *out, bool accumulate, cudaStream_t s);
/* RoPE's (cos, sin) x scale for positions 0 .. seq-1 and pairs 0 .. rot/2-1, (seq, rot/2), from
 * the host's inv_freq (rot/2; mdl_rope_freqs): computed once on the host, copied in stream s;
 * the rope kernels read it. */
cudaError_t gk_rope_table(float2 *tab, int seq, int rot, const double *inv_freq, double scale,
                          cudaStream_t s);
/* RoPE (HF rotate-half) on the first rot of each head's dim values, written as bf16 to y, from
 * fp32 x32 or (x32 NULL) bf16 x16; y may be x16. inverse: the transpose (for the backward). */
/* Llama 4's query temperature: row t of x (T rows of n; fp32 x32 or bf16 x16, the other NULL)
 * times 1 + scale x ln(floor((t % seq + 1) / floor_scale) + 1), in place. */
cudaError_t gk_query_temperature(float *x32, bf16 *x16, int T, int n, int seq, float floor_scale,
                                 float scale, cudaStream_t s);
cudaError_t gk_rope_bf16(const float *x32, const bf16 *x16, bf16 *y, int T, int heads, int dim,
                         int rot, const float2 *tab, int seq, bool inverse, cudaStream_t s);
cudaError_t gk_mla_assemble(const float *qf, const float *ckvf, const float *kv, int T, int H,
                            int nope, int rope, int dv, int kvl, const float2 *tab, int seq,
                            bf16 *q, bf16 *k, bf16 *v, cudaStream_t s);
#define GK_MAX_ROPE 512 /* MLA's decoupled RoPE dims, at most */
/* MLA's backward of the assembly, from fp32 (dq32, dk32, dv32) or bf16 (dq16, ...; the others
 * NULL) gradients: dqf and dkv in bf16, the shared key's gradient into dckvf's last rope columns. */
cudaError_t gk_mla_disassemble(const float *dq32, const float *dk32, const float *dv32,
                               const bf16 *dq16, const bf16 *dk16, const bf16 *dv16, int T, int H,
                               int nope, int rope, int dvd, int kvl, const float2 *tab, int seq,
                               bf16 *dqf, bf16 *dkv, float *dckvf, cudaStream_t s);
/* Causal attention (sliding window when window > 0) over B sequences of S tokens, tensor cores,
 * no seq x seq matrix: q (B*S, H, dqk), k (B*S, KV, dqk), v (B*S, KV, dv) bf16, query head hh
 * reads KV head hh / (H / KV), scale 1/sqrt(dqk). Forward writes o (B*S, H, dv) and lse (B, H, S,
 * base-2 log-sum-exp of the scaled scores); backward, from dout and the forward's o and lse, writes
 * dq, dk, dv (fp32, the layouts of q, k, v), delta (B, H, S) is its workspace. */
#define GK_FLASH_MAX_DIM 256
bool gk_flash_supported(int dqk, int dv);
/* Whether a sliding-window layer's backward runs faster by our kernel than by cuDNN's (whose
 * graph masks the window pointwise, computing every causal tile): where the window's band of
 * tiles is under a sixth of the causal half. */
bool gk_window_backward_ours(int seq, int window);
/* Once per device and head widths, before the first launch (the kernels' shared memory). */
cudaError_t gk_flash_prepare(int dqk, int dv);
cudaError_t gk_flash_forward(const bf16 *q, const bf16 *k, const bf16 *v, int B, int S, int H,
                             int KV, int dqk, int dv, int window, bf16 *o, float *lse,
                             cudaStream_t s);
cudaError_t gk_flash_backward(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *o,
                              const bf16 *dout, const float *lse, int B, int S, int H, int KV,
                              int dqk, int dv, int window, float *delta, float *dq, float *dk,
                              float *dvo, cudaStream_t s);
/* Attention sinks (gpt-oss; sink (H) the per-head logits, natural units of the scaled scores):
 * after either forward, gk_attn_sinks folds them into lse and o (the backward then runs on that
 * lse and o unchanged); after either backward, gk_attn_sink_rows writes r (B*S, H), whose column
 * sums are the sinks' gradient. */
cudaError_t gk_attn_sinks(bf16 *o, float *lse, const float *sink, int B, int S, int H, int dv,
                          cudaStream_t s);
cudaError_t gk_attn_sink_rows(const bf16 *o, const bf16 *dout, const float *lse, const float *sink,
                              int B, int S, int H, int dv, float *r, cudaStream_t s);
/* The same forward through cuDNN's fused flash attention (gpu_cudnn.cu), with the same layouts
 * and the same base-2 lse. false when this build has no cuDNN, or cuDNN takes no such shape or
 * fails: why says which, and the caller keeps gk_flash_forward. sink (H, device; NULL for none):
 * the sinks inside cuDNN's graph, as Transformer Engine runs them (o and lse then as
 * gk_attn_sinks leaves them). */
bool gk_cudnn_forward(const bf16 *q, const bf16 *k, const bf16 *v, int B, int S, int H, int KV,
                      int dqk, int dv, int window, const float *sink, bf16 *o, float *lse,
                      cudaStream_t s, char *why, size_t cap);
/* What the executor (and calibrate, which times what it runs) asks of gk_cudnn_backward. */
#define GK_CUDNN_DETERMINISTIC true
/* The backward through cuDNN, from the forward's lse (either kernel's: base 2): cuDNN writes dq,
 * dk, dv in bf16 into scratch_q, scratch_k, scratch_v (the layouts of q, k, v); with dq, dk, dvo
 * given they are widened to fp32 there (as gk_flash_backward's), with dq NULL they stay in the
 * scratch only. deterministic: the engine that gives the same bits every run (dQ not summed by
 * atomics). sink and dsink (H, device; both or neither): the sinks' gradient computed in the
 * graph (a forward with the same sinks wrote o and lse). false as gk_cudnn_forward. */
bool gk_cudnn_backward(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *o, const bf16 *dout,
                       const float *lse, int B, int S, int H, int KV, int dqk, int dv, int window,
                       const float *sink, float *dsink, bool deterministic, float *dq, float *dk,
                       float *dvo, bf16 *scratch_q, bf16 *scratch_k, bf16 *scratch_v,
                       cudaStream_t s, char *why, size_t cap);
/* Free what gk_cudnn_forward / backward keep for stream s (its plans, their workspaces and its
 * handle), before the stream is destroyed. */
void gk_cudnn_release(cudaStream_t s);
/* cuDNN's version at run time ("9.19.0"), or that the build has none. */
const char *gk_cudnn_version(char *buf, size_t cap);
/* SwiGLU on bf16 gate / up (fp32 inside): hm = silu(g) u (limit 0), or gpt-oss's clamped form
 * with alpha and limit (mdl.h); its backward from dhm. With am (struct gk_amax_rows), each
 * expert's amax of what they write; the backward with dg and du NULL writes the amax alone. */
cudaError_t gk_swiglu(const bf16 *g, const bf16 *u, bf16 *hm, size_t n, float alpha, float limit,
                      const struct gk_amax_rows *am, cudaStream_t s);
cudaError_t gk_swiglu_backward(const bf16 *g, const bf16 *u, const bf16 *dhm, bf16 *dg, bf16 *du,
                               size_t n, float alpha, float limit, const struct gk_amax_rows *am,
                               cudaStream_t s);
/* cnt, base: ceil(n / GK_CHUNK) x E ints; off: E + 1 ints. */
cudaError_t gk_permute_count(const int *choice, int n, int E, int *cnt, int *base, int *off,
                             cudaStream_t s);
cudaError_t gk_permute_place(const int *choice, int n, int E, const int *base, const int *off,
                             int *row_src, int *pos, cudaStream_t s);
cudaError_t gk_gather(const bf16 *x, const int *row_src, int k, int P, int h, bf16 *xp,
                      const struct gk_amax_rows *am, cudaStream_t s);
/* y[t] += sum_j w[t, j] yp[pos[t, j]] (w NULL: weights 1); backward: dyp = w dy and, with w,
 * dw = dy . yp. */
cudaError_t gk_combine(float *y, const float *yp, const float *w, const int *pos, int T, int k,
                       int h, cudaStream_t s);
cudaError_t gk_combine_backward(const float *dy, const float *yp, const float *w, const int *pos,
                                int T, int k, int h, bf16 *dyp, float *dw,
                                const struct gk_amax_rows *am, cudaStream_t s);
/* Llama 4 (the routing weight on the expert's input): row pos[p] of xp times w[p], for the P
 * pairs, in place. */
cudaError_t gk_scale_rows(bf16 *xp, const float *w, const int *pos, int P, int h, cudaStream_t s);
/* Its backward: with r = pos[t, j] and d = dg[r] + du[r] (the scaled input's gradient), dx[t]
 * (+)= sum_j w[t, j] d and dw[t, j] = d . x[t]; one block a token, fixed order. */
cudaError_t gk_gather_sum_scaled(const bf16 *dg, const bf16 *du, const int *pos, const float *w,
                                 const bf16 *x, int T, int k, int h, float *dx, bool accumulate,
                                 float *dw, cudaStream_t s);
/* dx[t] (+)= sum over the token's k rows r = pos[t, j] of dg[r] + du[r] (the expert block's input
 * gradient as its gate and up GEMMs wrote it, bf16 each), summed in fp32 in j order. */
cudaError_t gk_gather_sum(const bf16 *dg, const bf16 *du, const int *pos, int T, int k, int h,
                          float *dx, bool accumulate, cudaStream_t s);
cudaError_t gk_scores(const struct exec_router_cfg *cfg, const float *logits, int T, float *scores,
                      cudaStream_t s);
cudaError_t gk_router_backward(const struct exec_router_cfg *cfg, const float *logits,
                               const int *choice, const float *weight, const float *dw,
                               const float *auxg, int T, float *dz, cudaStream_t s);
cudaError_t gk_coactivation(const int *choice, int T, int k, int E, unsigned long long *co,
                            cudaStream_t s);
/* Per row the loss (row_loss) and, over the bf16 logits in place, their gradient times scale. */
cudaError_t gk_cross_entropy(bf16 *logits, const int *tgt, int T, int V, float scale,
                             float *row_loss, cudaStream_t s);
cudaError_t gk_sumsq(const float *g, size_t n, double *part, cudaStream_t s);
/* AdamW on n fp32 masters p from gradients g; the moments m1, m2 fp32, or bf16 when m16 (the
 * update uses them unrounded, stores them rounded to nearest); writes the bf16 copy w16, and
 * with am (no offsets: slices of am->cols values from p) each slice's amax of it. */
cudaError_t gk_adamw(float *p, const float *g, void *m1, void *m2, bool m16, bf16 *w16, size_t n,
                     const struct gk_adamw *a, const struct gk_amax_rows *am, cudaStream_t s);

/* Expert parallelism's rows in flight (gpu_ep.cu):
 * out[r] (+)= sum over e in [row_off[r], row_off[r+1]) of (w ? w[e] : 1) src[idx[e]] (rows of h);
 * dst[i] = src[idx[i]] (fp32 rows of h);
 * per local pair p: dyp[p] = w[p] dy[pair_row[p]] (bf16), dwp[p] = dy[pair_row[p]] . yp[p];
 * dst[dst_idx[i]] = src[i]. */
cudaError_t gk_rows_csr(float *out, const float *src, const int *idx, const float *w,
                        const int *row_off, int nrows, int h, bool accumulate, cudaStream_t s);
/* The same with src[i] = a[i] + b[i], two bf16 rows (the expert block's input gradient). */
cudaError_t gk_rows_csr_bf16x2(float *out, const bf16 *a, const bf16 *b, const int *idx,
                               const float *w, const int *row_off, int nrows, int h,
                               bool accumulate, cudaStream_t s);
cudaError_t gk_rows_gather32(const float *src, const int *idx, int n, int h, float *dst,
                             cudaStream_t s);
cudaError_t gk_pairs_backward(const float *dy, const int *pair_row, const float *pair_w,
                              const float *yp, int npairs, int h, bf16 *dyp, float *dwp,
                              cudaStream_t s);
cudaError_t gk_scatter(const float *src, const int *dst_idx, int n, float *dst, cudaStream_t s);

#endif
