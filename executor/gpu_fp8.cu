/*
 * gpu_fp8.cu: FP8 on the GPU: the quantize kernel, the experts' SwiGLU with its output or its
 * gradients quantized (block scaling), and the fp8 GEMM (cuBLASLt).
 *
 * Quantization is ref_fp8.c's bit for bit: the amax of the tensor, of a 1 x 128 tile or of a
 * 128 x 128 block, the scale fp8_max / amax (1 where amax is 0 or not finite; a tile's or a
 * block's rounded down to a power of two), each value times it converted with rounding to
 * nearest even, saturating (__NV_SATFINITE). The amax is a
 * maximum: exact in any order, so the kernels are deterministic. What the GEMM takes is the
 * dequantization factor 1 / scale, in the layouts cuBLASLt's Hopper block scaling reads
 * (exec_fp8_factor_at): the same values the reference divides by.
 *
 * One launch quantizes a bf16 matrix (rows x cols, any leading dimension) into its row-major copy
 * q (K = cols: the forward's x and w, the data gradient's dy) and, when asked, its transpose qt
 * (K = rows: the weight gradient's operands, and the data gradient's weight), each with its own
 * scales: 1 x 128 tiles along each one's K (a transposed copy has its own, column-wise tiles of
 * the original), 128 x 128 blocks (the transposed copy's are the same, transposed), or one scale.
 * A 128 x 128 tile of the input sits in shared memory, so both copies are written coalesced.
 * With per-tensor scaling the permutation's gather quantizes the experts' input the same way,
 * each expert's amax found from its tokens first (gk_fp8_expert_amax, gk_fp8_gather).
 */
#include "gpu_kernels.h"

#include <cuda_fp8.h>
#include <stdlib.h>

#include <vector>

static __device__ __forceinline__ unsigned char to_fp8(float v, int e5m2)
{
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* exec_fp8_scale's: fp8_max / amax, with block scaling (how not EXEC_FP8_TENSOR) rounded down to a
 * power of two (its mantissa bits dropped, as Transformer Engine's Float8BlockScaling does) */
static __device__ __forceinline__ float scale_of(float amax, int e5m2, int how)
{
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float s = (e5m2 ? 57344.0f : 448.0f) / amax;
    if (isinf(s)) return 1.0f;
    return how == EXEC_FP8_TENSOR ? s : __uint_as_float(__float_as_uint(s) & 0xFF800000u);
}

/* The whole matrix's amax (as bits) into *amax, zeroed before; `vec`: 8 values (16 bytes) a load
 * (rows starting on 16 bytes, cols a multiple of 8). blockIdx.y: the matrix of a batch (xs
 * elements apart), its amax amax[blockIdx.y]. */
__global__ void k_fp8_amax(const bf16 *x, int ldx, int rows, int cols, bool vec, size_t xs,
                           unsigned *amax)
{
    __shared__ unsigned red[TPB / 32];
    x += blockIdx.y * xs;
    amax += blockIdx.y;
    unsigned m = 0;
    int per = vec ? 8 : 1, w = cols / per;
    size_t n = (size_t)rows * w;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const bf16 *p = x + (i / w) * ldx + (i % w) * per;
        if (vec) {
            m = max(m, gk_abs_bits8(*(const uint4 *)p));
        } else {
            m = max(m, gk_abs_bits(__bfloat162float(*p)));
        }
    }
    m = gk_block_max(m, red);
    if (threadIdx.x == 0) atomicMax(amax, m);
}

#define FT GK_FP8_TILE     /* the tile: FT x FT values of the input */
#define FT_PAD GK_FP8_TPAD /* a shared-memory row, padded against bank conflicts */
#define FT_THREADS GK_FP8_THREADS
static_assert(FT_THREADS == 2 * FT,
              "the tile scales' scan takes a thread a row and a thread a column");

/* 16 values of the tile (a row's run, or a column's when `down`) to fp8, times s; a row's two at
 * a time (c even: a 4-byte word of shared memory) */
static __device__ __forceinline__ uint4 pack16(const bf16 (*tile)[FT_PAD], int r, int c, bool down,
                                               float s, int e5m2)
{
    unsigned w[4] = {0, 0, 0, 0};
    for (int k = 0; k < 16; k += 2) {
        float2 v;
        if (down)
            v = make_float2(__bfloat162float(tile[r + k][c]), __bfloat162float(tile[r + k + 1][c]));
        else
            v = __bfloat1622float2(*(const __nv_bfloat162 *)&tile[r][c + k]);
        w[k / 4] |= ((unsigned)to_fp8(v.x * s, e5m2) | (unsigned)to_fp8(v.y * s, e5m2) << 8)
                    << (8 * (k % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* A tile's dequantization factors into those of a copy (rows x cols, K along cols), the tile's
 * lines (rows of the copy) from lr0 and its K from kc0: with tiles each line's 1 / ls[line], with
 * blocks the block's 1 / S, with the tensor's scale 1 / S once (the grid's first block: first). */
static __device__ __forceinline__ void put_factors(float *sq, int how, int rows, int cols, int lr0,
                                                   int kc0, const float *ls, float S, bool first)
{
    int t = threadIdx.x;
    if (how == EXEC_FP8_TILE_1X128) {
        if (t < FT && lr0 + t < rows)
            sq[exec_fp8_factor_at(how, rows, cols, lr0 + t, kc0)] = 1.0f / ls[t];
    } else if (t == 0 && (how == EXEC_FP8_BLOCK_128X128 || first)) {
        sq[exec_fp8_factor_at(how, rows, cols, lr0, kc0)] = 1.0f / S;
    }
}

/* Per-tensor scaling needs no tile of values: each value is quantized as it is loaded (one scale
 * for all), its row-major copy written from registers, and only the transposed copy goes through
 * shared memory, as the tile's fp8 bytes (gk_fp8_t8_at). put_t8: the tile's transpose from t8
 * (the tile's rows from r0, its columns from c0) into qt (cols x ldt, ldt a multiple of 16, rows
 * of qt on 16 bytes): a thread a patch of 16 rows by 4 columns,
 * its 16 words into four 16-byte runs (byte permutes); a warp four columns' 128 rows, each
 * column's run of 128 bytes coalesced. */
static __device__ __forceinline__ void put_t8(const unsigned *t8, unsigned char *qt, int ldt,
                                              int cols, int c0, int r0)
{
    int rg, cg;
    gk_fp8_patch_at(threadIdx.x, &rg, &cg);
    static_assert(FT_THREADS == (FT / 16) * (FT / 4), "a thread a patch of 16 rows by 4 columns");
    if (r0 + 16 * rg >= ldt) return;
    unsigned v[16];
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = t8[gk_fp8_t8_at(16 * rg + i, cg)];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int gc = c0 + 4 * cg + j;
        if (gc >= cols) break;
        unsigned w[4], sel = (unsigned)j | (unsigned)(j + 4) << 4;
#pragma unroll
        for (int a = 0; a < 4; a++)
            w[a] = __byte_perm(__byte_perm(v[4 * a], v[4 * a + 1], sel),
                               __byte_perm(v[4 * a + 2], v[4 * a + 3], sel), 0x5410);
        *(uint4 *)(qt + (size_t)gc * ldt + r0 + 16 * rg) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* Four values' fp8 bytes in a word, the first in the lowest byte */
static __device__ __forceinline__ unsigned fp8x4(const float *v, float s, int e5m2)
{
    unsigned w = 0;
    for (int k = 0; k < 4; k++) w |= (unsigned)to_fp8(v[k] * s, e5m2) << (8 * k);
    return w;
}

/* Eight bf16 values (a 16-byte load) to fp8 times s, their bytes in order */
static __device__ __forceinline__ uint2 fp8x8(uint4 in, float s, int e5m2)
{
    float v[8];
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&in;
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(p[k]);
        v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
    return make_uint2(fp8x4(v, s, e5m2), fp8x4(v + 4, s, e5m2));
}

/* k_fp8_cast with per-tensor scaling where every access can be a vector (its `vec`): a thread's 8
 * loads of 8 values issued first, each quantized from registers into q (8 bytes a store) and
 * into the shared tile of bytes for qt (put_t8). The same bits as k_fp8_cast. */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_cast_t(const bf16 *x, int ldx, int rows, int cols, int e5m2, const unsigned *amax,
                 unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt, size_t xs,
                 size_t qs, size_t ss)
{
    {
        size_t z = blockIdx.z;
        x += z * xs, amax += z;
        if (q) q += z * qs, sq += z * ss;
        if (qt) qt += z * qs, sqt += z * ss;
    }
    __shared__ unsigned t8[FT * FT / 4];
    int r0 = blockIdx.y * FT, c0 = blockIdx.x * FT, t = threadIdx.x;
    float S = scale_of(__uint_as_float(*amax), e5m2, EXEC_FP8_TENSOR);
    constexpr int steps = FT * FT / 8 / FT_THREADS; /* a warp two rows of 128 a step */
    uint4 in[steps];
#pragma unroll
    for (int j = 0; j < steps; j++) {
        int i = t + j * FT_THREADS, gr = r0 + i / (FT / 8), gc = c0 + i % (FT / 8) * 8;
        in[j] = gr < rows && gc < cols ? *(const uint4 *)(x + (size_t)gr * ldx + gc)
                                       : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < steps; j++) {
        int i = t + j * FT_THREADS, r = i / (FT / 8), c = i % (FT / 8) * 8, gr = r0 + r,
            gc = c0 + c;
        uint2 w = fp8x8(in[j], S, e5m2);
        if (q && gr < rows && gc < cols) *(uint2 *)(q + (size_t)gr * cols + gc) = w;
        if (qt) *(uint2 *)&t8[gk_fp8_t8_at(r, c / 4)] = w; /* c / 4 even: the pair stays adjacent */
    }
    bool first = blockIdx.x == 0 && blockIdx.y == 0;
    if (q) put_factors(sq, EXEC_FP8_TENSOR, rows, cols, r0, c0, NULL, S, first);
    if (!qt) return;
    __syncthreads();
    put_t8(t8, qt, ldt, cols, c0, r0);
    put_factors(sqt, EXEC_FP8_TENSOR, cols, ldt, c0, r0, NULL, S, first);
}

/* One block one FT x FT tile (blockIdx.x along cols, blockIdx.y along rows). Rows beyond `rows`
 * up to qt's ldt read as zeros (the weight gradient's K padded, exec_fp8_pad). `vec`: the
 * input's rows and both copies' rows start on 16 bytes and cols is a multiple of 16, so the tile
 * moves in 16-byte accesses (8 bf16 in, 16 fp8 out; the partial tiles at the edges element by
 * element). The values are the same either way. blockIdx.z: the matrix of a batch (its input xs
 * elements on, its copies qs bytes on, their factors ss floats on, its amax amax[z]). */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_cast(const bf16 *x, int ldx, int rows, int cols, int how, int e5m2, const unsigned *amax,
               unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt, bool vec,
               size_t xs, size_t qs, size_t ss)
{
    {
        size_t z = blockIdx.z;
        x += z * xs, amax += z;
        if (q) q += z * qs, sq += z * ss;
        if (qt) qt += z * qs, sqt += z * ss;
    }
    __shared__ __align__(16) bf16 tile[FT][FT_PAD];
    __shared__ float rs[FT], cs[FT]; /* 1 x 128 tiles: each row's scale, each column's */
    __shared__ unsigned red[FT_THREADS / 32];
    int r0 = blockIdx.y * FT, c0 = blockIdx.x * FT, t = threadIdx.x;
    unsigned m = 0;
    for (int i = t; i < FT * FT / 8; i += FT_THREADS) { /* 8 values a step */
        int r, c;
        gk_fp8_load_at(i, &r, &c);
        int gr = r0 + r, gc = c0 + c;
        if (vec && gr < rows && gc + 8 <= cols) {
            uint4 v = *(const uint4 *)(x + (size_t)gr * ldx + gc);
            const unsigned *u = (const unsigned *)&v;
            for (int k = 0; k < 4; k++) {
                *(unsigned *)&tile[r][c + 2 * k] = u[k];
                __nv_bfloat162 p = *(const __nv_bfloat162 *)&u[k];
                m = max(m, max(gk_abs_bits(__low2float(p)), gk_abs_bits(__high2float(p))));
            }
        } else {
            for (int k = 0; k < 8; k++) {
                bf16 v = gr < rows && gc + k < cols ? x[(size_t)gr * ldx + gc + k]
                                                    : __float2bfloat16(0.0f);
                tile[r][c + k] = v;
                m = max(m, gk_abs_bits(__bfloat162float(v)));
            }
        }
    }
    __syncthreads();
    float S = 1.0f; /* the tensor's or the block's scale */
    if (how == EXEC_FP8_TENSOR) {
        S = scale_of(__uint_as_float(*amax), e5m2, how);
    } else if (how == EXEC_FP8_BLOCK_128X128) {
        S = scale_of(__uint_as_float(gk_block_max(m, red)), e5m2, how);
    } else { /* a thread a line: the first FT threads a row each, the others a column each */
        int line = t % FT;
        bool col = t >= FT; /* the same across a warp */
        unsigned ml = 0;
        for (int k = 0; k < FT; k++)
            ml = max(ml, gk_abs_bits(__bfloat162float(col ? tile[k][line] : tile[line][k])));
        (col ? cs : rs)[line] = scale_of(__uint_as_float(ml), e5m2, how);
        __syncthreads();
    }
    bool tiles = how == EXEC_FP8_TILE_1X128, first = blockIdx.x == 0 && blockIdx.y == 0;
    if (q) { /* 16 values of a row a step */
        for (int i = t; i < FT * FT / 16; i += FT_THREADS) {
            int r, c;
            gk_fp8_row_at(i, &r, &c);
            int gr = r0 + r, gc = c0 + c;
            if (gr >= rows) continue;
            const float *s = tiles ? &rs[r] : &S;
            if (vec && gc + 16 <= cols) {
                *(uint4 *)(q + (size_t)gr * cols + gc) = pack16(tile, r, c, false, *s, e5m2);
            } else {
                for (int k = 0; k < 16 && gc + k < cols; k++)
                    q[(size_t)gr * cols + gc + k] =
                        to_fp8(__bfloat162float(tile[r][c + k]) * s[0], e5m2);
            }
        }
        put_factors(sq, how, rows, cols, r0, c0, rs, S, first);
    }
    if (qt) { /* qt (cols x ldt): row c of qt is column c of x; 16 of its values a step */
        for (int i = t; i < FT * FT / 16; i += FT_THREADS) {
            int r, c;
            gk_fp8_col_at(i, &r, &c);
            int gr = r0 + r, gc = c0 + c;
            if (gc >= cols || gr >= ldt) continue;
            const float *s = tiles ? &cs[c] : &S;
            if (vec && gr + 16 <= ldt) {
                *(uint4 *)(qt + (size_t)gc * ldt + gr) = pack16(tile, r, c, true, *s, e5m2);
            } else {
                for (int k = 0; k < 16 && gr + k < ldt; k++)
                    qt[(size_t)gc * ldt + gr + k] =
                        to_fp8(__bfloat162float(tile[r + k][c]) * s[0], e5m2);
            }
        }
        put_factors(sqt, how, cols, ldt, c0, r0, cs, S, first);
    }
}

cudaError_t gk_fp8_cast_batch(const bf16 *x, int ldx, int rows, int cols, int how, int e5m2,
                              unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                              unsigned *work, const unsigned *known, int batch, size_t xs,
                              size_t qs, size_t ss, cudaStream_t s)
{
    if (!rows || !cols || batch < 1) return cudaGetLastError();
    /* every matrix's rows on 16 bytes when the first's are */
    bool strides = xs % 8 == 0 && qs % 16 == 0;
    if (how == EXEC_FP8_TENSOR && !known) {
        cudaError_t e = cudaMemsetAsync(work, 0, sizeof(unsigned) * batch, s);
        if (e != cudaSuccess) return e;
        bool v8 = ldx % 8 == 0 && aligned(x, 16) && cols % 8 == 0 && (batch == 1 || strides);
        size_t n = (size_t)rows * cols / (v8 ? 8 : 1);
        unsigned g = blocks_for(n, TPB) < 1024 ? blocks_for(n, TPB) : 1024;
        k_fp8_amax<<<dim3(g, (unsigned)batch), TPB, 0, s>>>(x, ldx, rows, cols, v8, xs, work);
    }
    bool vec = ldx % 8 == 0 && aligned(x, 16) && cols % 16 == 0 && (!q || aligned(q, 16)) &&
               (!qt || (ldt % 16 == 0 && aligned(qt, 16))) && (batch == 1 || strides);
    int span = qt && ldt > rows ? ldt : rows; /* the rows the tiles cover */
    dim3 grid((unsigned)((cols + FT - 1) / FT), (unsigned)((span + FT - 1) / FT), (unsigned)batch);
    if (how == EXEC_FP8_TENSOR && vec) {
        k_fp8_cast_t<<<grid, FT_THREADS, 0, s>>>(x, ldx, rows, cols, e5m2, known ? known : work, q,
                                                 sq, qt, ldt, sqt, xs, qs, ss);
        return cudaGetLastError();
    }
    k_fp8_cast<<<grid, FT_THREADS, 0, s>>>(x, ldx, rows, cols, how, e5m2, known ? known : work, q,
                                           sq, qt, ldt, sqt, vec, xs, qs, ss);
    return cudaGetLastError();
}

cudaError_t gk_fp8_cast(const bf16 *x, int ldx, int rows, int cols, int how, int e5m2,
                        unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                        unsigned *work, cudaStream_t s)
{
    return gk_fp8_cast_batch(x, ldx, rows, cols, how, e5m2, q, sq, qt, ldt, sqt, work, NULL, 1, 0,
                             0, 0, s);
}

cudaError_t gk_fp8_cast_known(const bf16 *x, int ldx, int rows, int cols, int e5m2,
                              unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt,
                              const unsigned *amax, cudaStream_t s)
{
    return gk_fp8_cast_batch(x, ldx, rows, cols, EXEC_FP8_TENSOR, e5m2, q, sq, qt, ldt, sqt, NULL,
                             amax, 1, 0, 0, 0, s);
}

/* ---- the experts' input quantized in the permute (per-tensor scaling) ------------------------ */

/* The expert's tile this block takes (gk_expert_tile, worked out by thread 0): false past the
 * last tile. o and n: the expert's first row and its rows; q, s, st: its region. */
struct expert_tile {
    int e, r0, c0, o, n;
    size_t q, s, st;
};
static __device__ __forceinline__ bool block_tile(const int *off, int E, int cols, bool padded,
                                                  struct expert_tile *a)
{
    __shared__ struct expert_tile at;
    if (threadIdx.x == 0) {
        gk_expert_tile(off, E, cols, padded, blockIdx.x, &at.e, &at.r0, &at.c0, &at.q, &at.s,
                       &at.st);
        if (at.e >= 0) at.o = off[at.e], at.n = off[at.e + 1] - at.o;
    }
    __syncthreads();
    *a = at;
    return a->e >= 0;
}

/* Each expert's amax over the tokens routed to it (choice: T x k experts) of x (T x h): a warp a
 * token, its row's largest |value| (gk_abs_bits) into its experts' maxima in shared memory, the
 * block's into amax[e] (zeroed before). The amax gk_gather keeps of the permuted rows, found
 * before any row is placed. `vec`: 16-byte loads (rows on 16 bytes, h a multiple of 8). */
__global__ void k_fp8_expert_amax(const bf16 *x, int T, int h, bool vec, const int *choice, int k,
                                  int E, unsigned *amax)
{
    extern __shared__ unsigned sm[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) sm[e] = 0;
    __syncthreads();
    int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int t = blockIdx.x * warps + threadIdx.x / 32; t < T; t += gridDim.x * warps) {
        const bf16 *row = x + (size_t)t * h;
        unsigned m = 0;
        if (vec) {
#pragma unroll 4
            for (int c = lane * 8; c < h; c += 32 * 8)
                m = max(m, gk_abs_bits8(*(const uint4 *)(row + c)));
        } else {
            for (int c = lane; c < h; c += 32) m = max(m, gk_abs_bits(__bfloat162float(row[c])));
        }
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        for (int j = lane; j < k && m; j += 32) atomicMax(&sm[choice[(size_t)t * k + j]], m);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (sm[e]) atomicMax(amax + e, sm[e]);
}

cudaError_t gk_fp8_expert_amax(const bf16 *x, int T, int h, const int *choice, int k, int E,
                               unsigned *amax, cudaStream_t s)
{
    if (E < 1 || E > GK_MAX_EXPERTS || k < 1) return cudaErrorInvalidValue;
    cudaError_t r = cudaMemsetAsync(amax, 0, sizeof(unsigned) * E, s);
    if (r != cudaSuccess || T < 1 || h < 1) return r;
    const int warps = TPB / 32;
    unsigned blocks = (unsigned)((T + warps - 1) / warps);
    if (blocks > 2048) blocks = 2048; /* a grid-stride loop: E atomics a block at the end */
    bool vec = h % 8 == 0 && aligned(x, 16);
    k_fp8_expert_amax<<<blocks, TPB, sizeof(unsigned) * E, s>>>(x, T, h, vec, choice, k, E, amax);
    return cudaGetLastError();
}

/* One block one FT x FT tile of one expert's permuted rows (permuted row p is x's row
 * row_src[p] / k, as gk_gather places it): quantized with the expert's scale (amax[e] known)
 * into its region of q (row-major) and of qt (transposed, the rows padded with zeros to
 * exec_fp8_pad), each region's factor its first: what gk_gather then gk_fp8_cast_known write
 * for the expert's rows, bit for bit, without the bf16 rows between them. As k_fp8_cast_t: a
 * thread's 8 loads of 8 values first, the transpose through shared memory as bytes (put_t8). */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_gather_t(const bf16 *x, const int *row_src, int k, const int *off, int E, int cols,
                   const unsigned *amax, unsigned char *q, float *sq, unsigned char *qt, float *sqt)
{
    __shared__ unsigned t8[FT * FT / 4];
    struct expert_tile T;
    if (!block_tile(off, E, cols, true, &T)) return;
    int r0 = T.r0, c0 = T.c0, n = T.n, np = exec_fp8_pad(n), t = threadIdx.x;
    float S = scale_of(__uint_as_float(amax[T.e]), 0, EXEC_FP8_TENSOR);
    constexpr int steps = FT * FT / 8 / FT_THREADS; /* a warp two rows of 128 a step */
    uint4 in[steps];
#pragma unroll
    for (int j = 0; j < steps; j++) {
        int i = t + j * FT_THREADS, lr = r0 + i / (FT / 8), gc = c0 + i % (FT / 8) * 8;
        in[j] = lr < n && gc < cols
                    ? *(const uint4 *)(x + (size_t)(row_src[T.o + lr] / k) * cols + gc)
                    : make_uint4(0, 0, 0, 0);
    }
    q += T.q, qt += T.q;
#pragma unroll
    for (int j = 0; j < steps; j++) {
        int i = t + j * FT_THREADS, r = i / (FT / 8), c = i % (FT / 8) * 8, lr = r0 + r,
            gc = c0 + c;
        uint2 w = fp8x8(in[j], S, 0);
        if (lr < n && gc < cols) *(uint2 *)(q + (size_t)lr * cols + gc) = w;
        *(uint2 *)&t8[gk_fp8_t8_at(r, c / 4)] = w;
    }
    bool first = r0 == 0 && c0 == 0; /* the expert's first tile writes its factors */
    put_factors(sq + T.s, EXEC_FP8_TENSOR, n, cols, r0, c0, NULL, S, first);
    __syncthreads();
    put_t8(t8, qt, np, cols, c0, r0);
    put_factors(sqt + T.st, EXEC_FP8_TENSOR, cols, np, c0, r0, NULL, S, first);
}

cudaError_t gk_fp8_gather(const bf16 *x, const int *row_src, int k, const int *off_dev,
                          const int *off, int E, int cols, const unsigned *amax, unsigned char *q,
                          float *sq, unsigned char *qt, float *sqt, cudaStream_t s)
{
    /* 16-byte loads of x's rows, 8-byte stores of q's, 16-byte runs of qt's */
    if (cols % 16 || !aligned(x, 16) || !aligned(q, 16) || !aligned(qt, 16))
        return cudaErrorInvalidValue;
    size_t tiles = gk_expert_tiles(off, E, cols, true);
    if (tiles)
        k_fp8_gather_t<<<(unsigned)tiles, FT_THREADS, 0, s>>>(x, row_src, k, off_dev, E, cols, amax,
                                                              q, sq, qt, sqt);
    return cudaGetLastError();
}

/* ---- the experts' SwiGLU, its output and its gradients quantized ------------------------------ */

/* One block one FT x FT tile of one expert's rows: hm = SwiGLU(g, u) written in bf16 (as gk_swiglu
 * writes it) and quantized from that in 1 x 128 tiles into the expert's row-major region, as
 * gk_fp8_cast quantizes the expert's rows. A warp a row at a time, four values a lane (8-byte
 * loads and stores; cols a multiple of 4). */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_swiglu_fwd(const bf16 *g, const bf16 *u, const int *off, int E, int cols, float alpha,
                     float limit, int e5m2, bf16 *hm, unsigned char *q, float *sq)
{
    struct expert_tile T;
    if (!block_tile(off, E, cols, false, &T)) return;
    int r0 = T.r0, c0 = T.c0, o = T.o, n = T.n;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int c = c0 + lane * 4; /* the lane's four columns, all in (cols % 4 == 0) or all out */
    for (int r = warp; r < FT && r0 + r < n; r += FT_THREADS / 32) {
        int lr = r0 + r;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        unsigned m = 0;
        if (c < cols) { /* 8-byte loads and store of bf16 */
            size_t at = (size_t)(o + lr) * cols + c;
            float gv[4], uv[4];
            ld_bf16<4>(g + at, gv);
            ld_bf16<4>(u + at, uv);
            for (int k = 0; k < 4; k++) {
                v[k] = __bfloat162float(__float2bfloat16(act_fwd(gv[k], uv[k], alpha, limit)));
                m = max(m, gk_abs_bits(v[k]));
            }
            st_bf16<4>(hm + at, v); /* already bf16 values: stored as they are */
        }
        for (int x = 16; x > 0; x >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, x));
        float s = scale_of(__uint_as_float(m), e5m2, EXEC_FP8_TILE_1X128);
        if (c < cols) /* the four fp8 values in one 4-byte store */
            *(unsigned *)(q + T.q + (size_t)lr * cols + c) = fp8x4(v, s, e5m2);
        if (lane == 0)
            sq[T.s + exec_fp8_factor_at(EXEC_FP8_TILE_1X128, n, cols, lr, c0)] = 1.0f / s;
    }
}

cudaError_t gk_fp8_swiglu_forward(const bf16 *g, const bf16 *u, const int *off_dev, const int *off,
                                  int E, int cols, float alpha, float limit, int e5m2, bf16 *hm,
                                  unsigned char *q, float *sq, cudaStream_t s)
{
    if (cols % 4) return cudaErrorInvalidValue; /* a lane's four values in or out together */
    size_t tiles = gk_expert_tiles(off, E, cols, false);
    if (tiles)
        k_fp8_swiglu_fwd<<<(unsigned)tiles, FT_THREADS, 0, s>>>(g, u, off_dev, E, cols, alpha,
                                                                limit, e5m2, hm, q, sq);
    return cudaGetLastError();
}

/* SwiGLU's backward over the block's tile of one expert's rows (T; E experts, rows from off[e],
 * `cols` wide): dg, du of (g, u) for dhm, each rounded to bf16 as gk_swiglu_backward writes them,
 * handed to put(r, c, in, dg, du) four values at a time (tile row r, columns c .. c + 3; zeros
 * where `in` is false, past the expert's rows). 8-byte loads, a warp a row's 128 values a step,
 * a thread's `ahead` steps' loads all issued before the first is used (ncu: with one step's
 * three in flight the kernel moved about 1.8 TB/s of the H100's 3.35, results/issue26/s8/). */
template <class Put>
static __device__ __forceinline__ void swiglu_bwd_tile(const bf16 *g, const bf16 *u,
                                                       const bf16 *dhm, const struct expert_tile &T,
                                                       int cols, float alpha, float limit, Put put)
{
    constexpr int steps = FT * FT / 4 / FT_THREADS, ahead = 4;
    static_assert(steps % ahead == 0, "a thread's steps in whole batches");
    int t = threadIdx.x;
    for (int s0 = 0; s0 < steps; s0 += ahead) {
        float x[ahead][4], y[ahead][4], d[ahead][4];
        bool in[ahead];
#pragma unroll
        for (int j = 0; j < ahead; j++) {
            int i = t + (s0 + j) * FT_THREADS, lr = T.r0 + i / (FT / 4),
                gc = T.c0 + i % (FT / 4) * 4;
            in[j] = lr < T.n && gc < cols; /* cols % 4 == 0: the four in or out together */
            if (in[j]) {
                size_t at = (size_t)(T.o + lr) * cols + gc;
                ld_bf16<4>(g + at, x[j]);
                ld_bf16<4>(u + at, y[j]);
                ld_bf16<4>(dhm + at, d[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < ahead; j++) {
            int i = t + (s0 + j) * FT_THREADS;
            float gv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, uv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (in[j])
                for (int k = 0; k < 4; k++) {
                    act_bwd(x[j][k], y[j][k], d[j][k], alpha, limit, &gv[k], &uv[k]);
                    gv[k] = __bfloat162float(__float2bfloat16(gv[k]));
                    uv[k] = __bfloat162float(__float2bfloat16(uv[k]));
                }
            put(i / (FT / 4), i % (FT / 4) * 4, in[j], gv, uv);
        }
    }
}

/* One block one FT x FT tile of one expert's rows: SwiGLU's backward (swiglu_bwd_tile), dg and du
 * quantized as gk_fp8_cast quantizes expert e's rows in 1 x 128 tiles (its row-major copy, and
 * its transpose with the rows padded with zeros, exec_fp8_pad) into expert e's region
 * (exec_fp8_regions): the tile's bf16 values in shared memory first, for each row's and each
 * column's scale. The same bits as that pair of kernels; bf16 never written. */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_swiglu_bwd(const bf16 *g, const bf16 *u, const bf16 *dhm, const int *off, int E, int cols,
                     float alpha, float limit, int e5m2, unsigned char *qg, unsigned char *qgt,
                     float *sg, float *sgt, unsigned char *qu, unsigned char *qut, float *su,
                     float *sut)
{
    extern __shared__ __align__(16) unsigned char smem[];
    bf16(*tl[2])[FT_PAD] = {(bf16(*)[FT_PAD])smem,
                            (bf16(*)[FT_PAD])(smem + sizeof(bf16) * FT * FT_PAD)};
    __shared__ float rs[2][FT], cs[2][FT];
    struct expert_tile T;
    if (!block_tile(off, E, cols, true, &T)) return;
    int t = threadIdx.x, r0 = T.r0, c0 = T.c0, n = T.n, np = exec_fp8_pad(n);
    swiglu_bwd_tile(g, u, dhm, T, cols, alpha, limit,
                    [&](int r, int c, bool, const float *gv, const float *uv) {
                        for (int k = 0; k < 4; k++) {
                            tl[0][r][c + k] = __float2bfloat16(gv[k]);
                            tl[1][r][c + k] = __float2bfloat16(uv[k]);
                        }
                    });
    __syncthreads();
    { /* each row's and each column's scale, both gradients: a thread a line (the first FT
       * threads the rows, the others the columns, as k_fp8_cast) */
        int line = t % FT;
        bool col = t >= FT;
        for (int k = 0; k < 2; k++) {
            unsigned ml = 0;
            for (int j = 0; j < FT; j++)
                ml = max(ml, gk_abs_bits(__bfloat162float(col ? tl[k][j][line] : tl[k][line][j])));
            (col ? cs[k] : rs[k])[line] = scale_of(__uint_as_float(ml), e5m2, EXEC_FP8_TILE_1X128);
        }
    }
    __syncthreads();
    unsigned char *q[2] = {qg + T.q, qu + T.q}, *qt[2] = {qgt + T.q, qut + T.q};
    float *sq[2] = {sg + T.s, su + T.s}, *sqt[2] = {sgt + T.st, sut + T.st};
    for (int k = 0; k < 2; k++) {
        for (int i = t; i < FT * FT / 16; i += FT_THREADS) { /* row-major: rows < n */
            int r, c;
            gk_fp8_row_at(i, &r, &c);
            int lr = r0 + r, gc = c0 + c;
            if (lr < n && gc < cols)
                *(uint4 *)(q[k] + (size_t)lr * cols + gc) =
                    pack16(tl[k], r, c, false, rs[k][r], e5m2);
        }
        for (int i = t; i < FT * FT / 16; i += FT_THREADS) { /* transposed: rows < np */
            int r, c;
            gk_fp8_col_at(i, &r, &c);
            int lr = r0 + r, gc = c0 + c;
            if (gc < cols && lr < np)
                *(uint4 *)(qt[k] + (size_t)gc * np + lr) =
                    pack16(tl[k], r, c, true, cs[k][c], e5m2);
        }
        put_factors(sq[k], EXEC_FP8_TILE_1X128, n, cols, r0, c0, rs[k], 0.0f, false);
        put_factors(sqt[k], EXEC_FP8_TILE_1X128, cols, np, c0, r0, cs[k], 0.0f, false);
    }
}

/* The same with per-tensor scaling (the expert's amax of dg, amax[e], and of du, amax[E + e],
 * known): each value quantized in registers as it is computed, the row-major copies written from
 * there, the transposed ones through shared memory as bytes (put_t8): 32 KB of it, where the
 * tile of bf16 values takes 66. */
__global__ void __launch_bounds__(FT_THREADS)
    k_fp8_swiglu_bwd_t(const bf16 *g, const bf16 *u, const bf16 *dhm, const int *off, int E,
                       int cols, float alpha, float limit, int e5m2, const unsigned *amax,
                       unsigned char *qg, unsigned char *qgt, float *sg, float *sgt,
                       unsigned char *qu, unsigned char *qut, float *su, float *sut)
{
    __shared__ unsigned t8[2][FT * FT / 4];
    struct expert_tile T;
    if (!block_tile(off, E, cols, true, &T)) return;
    int r0 = T.r0, c0 = T.c0, n = T.n, np = exec_fp8_pad(n);
    float S[2];
    for (int k = 0; k < 2; k++)
        S[k] = scale_of(__uint_as_float(amax[k * E + T.e]), e5m2, EXEC_FP8_TENSOR);
    unsigned char *q[2] = {qg + T.q, qu + T.q}, *qt[2] = {qgt + T.q, qut + T.q};
    swiglu_bwd_tile(g, u, dhm, T, cols, alpha, limit,
                    [&](int r, int c, bool in, const float *gv, const float *uv) {
                        unsigned w[2] = {fp8x4(gv, S[0], e5m2), fp8x4(uv, S[1], e5m2)};
                        for (int k = 0; k < 2; k++) {
                            if (in) *(unsigned *)(q[k] + (size_t)(r0 + r) * cols + c0 + c) = w[k];
                            t8[k][gk_fp8_t8_at(r, c / 4)] = w[k];
                        }
                    });
    __syncthreads();
    float *sq[2] = {sg + T.s, su + T.s}, *sqt[2] = {sgt + T.st, sut + T.st};
    bool first = r0 == 0 && c0 == 0; /* the expert's first tile writes its factors */
    for (int k = 0; k < 2; k++) {
        put_t8(t8[k], qt[k], np, cols, c0, r0);
        put_factors(sq[k], EXEC_FP8_TENSOR, n, cols, r0, c0, NULL, S[k], first);
        put_factors(sqt[k], EXEC_FP8_TENSOR, cols, np, c0, r0, NULL, S[k], first);
    }
}

cudaError_t gk_fp8_swiglu_backward(const bf16 *g, const bf16 *u, const bf16 *dhm,
                                   const int *off_dev, const int *off, int E, int cols, float alpha,
                                   float limit, int e5m2, const unsigned *amax, unsigned char *qg,
                                   unsigned char *qgt, float *sg, float *sgt, unsigned char *qu,
                                   unsigned char *qut, float *su, float *sut, cudaStream_t s)
{
    /* 16-byte runs of the copies: rows of 16 bytes, regions on 16 */
    if (cols % 16 || !aligned(qg, 16) || !aligned(qgt, 16) || !aligned(qu, 16) || !aligned(qut, 16))
        return cudaErrorInvalidValue;
    size_t tiles = gk_expert_tiles(off, E, cols, true);
    if (!tiles) return cudaGetLastError();
    if (amax) {
        k_fp8_swiglu_bwd_t<<<(unsigned)tiles, FT_THREADS, 0, s>>>(g, u, dhm, off_dev, E, cols,
                                                                  alpha, limit, e5m2, amax, qg, qgt,
                                                                  sg, sgt, qu, qut, su, sut);
        return cudaGetLastError();
    }
    const size_t smem = 2 * sizeof(bf16) * FT * FT_PAD;
    /* the dynamic shared memory above 48 KB (asked at every launch: the device may differ) */
    cudaError_t r = cudaFuncSetAttribute(k_fp8_swiglu_bwd,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (r != cudaSuccess) return r;
    k_fp8_swiglu_bwd<<<(unsigned)tiles, FT_THREADS, smem, s>>>(
        g, u, dhm, off_dev, E, cols, alpha, limit, e5m2, qg, qgt, sg, sgt, qu, qut, su, sut);
    return cudaGetLastError();
}

/* ---- the fp8 GEMM ------------------------------------------------------------------------ */

/* The algorithm of each kind of GEMM, chosen once: cuBLASLt's heuristics cost 100-300 us of host
 * time a call. The rows M (an expert's, which follow the routing) count by the power of two at
 * or above them, and so does K, which is an expert's rows in its weight gradients (the operands
 * there transposed copies as long as K: their leading dimensions count as "K", 0); K is the one
 * the kind was first met at, its algorithm chosen there. */
struct fp8_kind {
    int mb, kb, N, K, lda, ldb, ldc, ha, hb, ea, eb, fast;
    cudaDataType yt;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulAlgo_t algo;
    bool usable;
};
#define FP8_KINDS 128

struct gk_fp8_lt {
    cublasLtHandle_t lt;
    size_t ws_bytes;
    struct fp8_kind kind[FP8_KINDS];
    int n;
    unsigned long long *fp; /* kind_pick's: a device word for the fingerprints */
    bool no_pick;           /* gk_fp8_lt_picks(c, false) */
};

struct gk_fp8_lt *gk_fp8_lt_create(cublasLtHandle_t lt, size_t ws_bytes)
{
    struct gk_fp8_lt *c = (struct gk_fp8_lt *)calloc(1, sizeof *c);
    if (c) c->lt = lt, c->ws_bytes = ws_bytes;
    return c;
}

void gk_fp8_lt_picks(struct gk_fp8_lt *c, bool on)
{
    if (c) c->no_pick = !on;
}

void gk_fp8_lt_destroy(struct gk_fp8_lt *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++)
        if (c->kind[i].op) cublasLtMatmulDescDestroy(c->kind[i].op);
    if (c->fp) cudaFree(c->fp);
    free(c);
}

static cublasLtMatmulMatrixScale_t scale_mode(int how)
{
    return how == EXEC_FP8_TILE_1X128      ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
           : how == EXEC_FP8_BLOCK_128X128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                           : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

/* column-major: A = w (K x N, ld w->ld, transposed), B = x (K x M), C = D = y^T (N x M) */
static cublasStatus_t layouts(cublasLtMatrixLayout_t l[3], const struct gk_fp8_mat *w,
                              const struct gk_fp8_mat *x, int M, int N, int K, int ldy,
                              cudaDataType yt)
{
    cublasStatus_t st;
    l[0] = l[1] = l[2] = NULL;
    if ((st = cublasLtMatrixLayoutCreate(&l[0], w->e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, K, N,
                                         w->ld)) ||
        (st = cublasLtMatrixLayoutCreate(&l[1], x->e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, K, M,
                                         x->ld)) ||
        (st = cublasLtMatrixLayoutCreate(&l[2], yt, N, M, ldy)))
        return st;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t kind_desc(struct fp8_kind *q)
{
    cublasStatus_t st;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulMatrixScale_t ma = scale_mode(q->ha), mb = scale_mode(q->hb);
    if ((st = cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        (st = cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        (st = cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)))
        return st;
    if (q->ha != EXEC_FP8_TENSOR && (st = cublasLtMatmulDescSetAttribute(
                                         q->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma)))
        return st;
    int8_t fast = (int8_t)q->fast;
    if (fast && (st = cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                     sizeof fast)))
        return st;
    if (q->hb != EXEC_FP8_TENSOR && (st = cublasLtMatmulDescSetAttribute(
                                         q->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb)))
        return st;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gk_fp8_matmul(const struct gk_fp8_mat *w, const struct gk_fp8_mat *x, int M, int N,
                             int K, int ldy, cudaDataType yt, bool fast, cublasLtMatmulDesc_t *op,
                             cublasLtMatrixLayout_t l[3])
{
    struct fp8_kind q = {M,      K,       N,       K,    w->ld, x->ld, ldy, w->how,
                         x->how, w->e5m2, x->e5m2, fast, yt,    NULL,  {},  false};
    l[0] = l[1] = l[2] = NULL;
    cublasStatus_t st = kind_desc(&q);
    if (!st)
        st = cublasLtMatmulDescSetAttribute(q.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w->sinv,
                                            sizeof w->sinv);
    if (!st)
        st = cublasLtMatmulDescSetAttribute(q.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x->sinv,
                                            sizeof x->sinv);
    if (!st) st = layouts(l, w, x, M, N, K, ldy, yt);
    if (st) {
        if (q.op) cublasLtMatmulDescDestroy(q.op);
        gk_lt_layouts_free(l);
        q.op = NULL;
    }
    *op = q.op;
    return st;
}

cublasStatus_t gk_lt_heuristics(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                                cublasLtMatrixLayout_t const l[3], size_t ws_bytes, bool split,
                                int max, cublasLtMatmulHeuristicResult_t *r, int *n)
{
    cublasLtMatmulPreference_t pref = NULL;
    uint32_t scheme = split ? CUBLASLT_REDUCTION_SCHEME_MASK : CUBLASLT_REDUCTION_SCHEME_NONE;
    *n = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
    if (!st)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes);
    if (!st)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &scheme, sizeof scheme);
    if (!st) st = cublasLtMatmulAlgoGetHeuristic(lt, op, l[0], l[1], l[2], l[2], pref, max, r, n);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

cublasStatus_t gk_lt_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                          cublasLtMatrixLayout_t const l[3], size_t ws_bytes, bool split_if_needed,
                          cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulHeuristicResult_t r;
    int nr = 0;
    cublasStatus_t st = gk_lt_heuristics(lt, op, l, ws_bytes, false, 1, &r, &nr);
    if (split_if_needed && (st == CUBLAS_STATUS_NOT_SUPPORTED || (!st && nr < 1)))
        st = gk_lt_heuristics(lt, op, l, ws_bytes, true, 1, &r, &nr);
    if (!st && nr < 1) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (!st) *algo = r.algo;
    return st;
}

cublasStatus_t gk_lt_time_algos(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                                cublasLtMatrixLayout_t const l[3], const void *a, const void *b,
                                void *c, int rows, int cols, int ld, int ybytes, void *ws,
                                size_t ws_bytes, cudaStream_t s, int max, int runs,
                                unsigned long long *fp, cublasLtMatmulHeuristicResult_t *r,
                                double *us, unsigned long long *f, int *n)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    float one = 1.0f, zero = 0.0f;
    std::vector<double> t(runs > 0 ? runs : 1);
    cublasStatus_t st = runs > 0 ? gk_lt_heuristics(lt, op, l, ws_bytes, false, max, r, n)
                                 : CUBLAS_STATUS_INVALID_VALUE;
    if (!st && (cudaEventCreate(&e0) || cudaEventCreate(&e1))) st = CUBLAS_STATUS_EXECUTION_FAILED;
    for (int i = 0; !st && i < *n; i++) {
        auto run = [&]() {
            return cublasLtMatmul(lt, op, &one, a, l[0], b, l[1], &zero, c, l[2], c, l[2],
                                  &r[i].algo, ws, ws_bytes, s);
        };
        us[i] = -1.0;
        if (run()) continue; /* not on this machine */
        if (gk_fingerprint(c, rows, cols, ld, ybytes, fp, s) ||
            cudaMemcpyAsync(&f[i], fp, sizeof *f, cudaMemcpyDeviceToHost, s) ||
            cudaStreamSynchronize(s) || run())
            st = CUBLAS_STATUS_EXECUTION_FAILED;
        for (int k = 0; !st && k < runs; k++) {
            float ms = 0.0f;
            if (cudaEventRecord(e0, s) || run() || cudaEventRecord(e1, s) ||
                cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1))
                st = CUBLAS_STATUS_EXECUTION_FAILED;
            t[k] = 1e3 * ms;
        }
        if (!st) us[i] = moe_median(t.data(), (size_t)runs);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return st;
}

/* The kind's algorithm at `M` rows: without split-K where there is one (as the bf16 expert GEMMs:
 * the same bits whichever stream or order the experts run in), else the heuristic's own choice,
 * still one fixed algorithm a kind; NOT_SUPPORTED where there is none. */
static cublasStatus_t kind_algo(struct gk_fp8_lt *c, struct fp8_kind *q, const struct gk_fp8_mat *w,
                                const struct gk_fp8_mat *x, int M)
{
    cublasLtMatrixLayout_t l[3];
    cublasStatus_t st = layouts(l, w, x, M, q->N, q->K, q->ldc, q->yt);
    if (!st) st = gk_lt_algo(c->lt, q->op, l, c->ws_bytes, true, &q->algo);
    gk_lt_layouts_free(l);
    q->usable = !st;
    return st;
}

/* A fresh kind's algorithm, picked on its first call (M rows into y, beta 0: y is written
 * anyway) while picks are on (gk_fp8_lt_picks; the kinds counted by M's and K's power of two,
 * a few dozen a run: when the weight gradients' were keyed by their exact K, a new kind almost
 * every call, a pick each made validate's fp8 steps 4x slower on an H100, and only the forward's
 * fast-accumulating GEMMs picked; the promoted ones gained 0-3% by it in bench gemm): of the
 * heuristic's first FP8_PICK
 * algorithms without split-K, the fastest of those that write the first one's bits
 * (gk_lt_time_algos on stream s, FP8_PICK_RUNS timings each). cuBLASLt's first is often not its
 * fastest (bench gemm: the forward's fast fp8 GEMMs 3-19% slower on the H100), and the algorithms
 * it offers have written the same bits at every shape measured (results/issue26/s7/run-gemm.txt);
 * where one does not, it is not taken, so a run's results stay those of the heuristic's first,
 * whichever is picked here or in another process. Anything failing leaves the kind's algorithm
 * as it was. */
#define FP8_PICK 8
#define FP8_PICK_RUNS 3
static void kind_pick(struct gk_fp8_lt *c, struct fp8_kind *q, const struct gk_fp8_mat *w,
                      const struct gk_fp8_mat *x, int M, void *y, void *ws, cudaStream_t s)
{
    cublasLtMatrixLayout_t l[3] = {NULL, NULL, NULL};
    cublasLtMatmulHeuristicResult_t r[FP8_PICK];
    double us[FP8_PICK];
    unsigned long long f[FP8_PICK];
    int n = 0;
    if ((c->fp || cudaMalloc((void **)&c->fp, sizeof *c->fp) == cudaSuccess) &&
        !layouts(l, w, x, M, q->N, q->K, q->ldc, q->yt) &&
        !gk_lt_time_algos(c->lt, q->op, l, w->q, x->q, y, M, q->N, q->ldc,
                          q->yt == CUDA_R_32F ? 4 : 2, ws, c->ws_bytes, s, FP8_PICK, FP8_PICK_RUNS,
                          c->fp, r, us, f, &n) &&
        n > 0 && us[0] >= 0) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (us[i] >= 0 && f[i] == f[0] && us[i] < us[best]) best = i;
        q->algo = r[best].algo;
    }
    cudaGetLastError(); /* what failed above is no error of the call's */
    gk_lt_layouts_free(l);
}

/* One cuBLASLt matmul of the kind (M x N x K), its algorithm kept by kind */
static cublasStatus_t fp8_gemm_once(struct gk_fp8_lt *c, const struct gk_fp8_mat *w,
                                    const struct gk_fp8_mat *x, int M, int N, int K, void *y,
                                    int ldy, cudaDataType yt, float beta, bool fast, void *ws,
                                    cudaStream_t s)
{
    if (!M || !N) return CUBLAS_STATUS_SUCCESS;
    int mb = EXEC_FP8_PAD, kb = EXEC_FP8_PAD; /* from 16: the block-scaled tails' own kind */
    while (mb < M && mb < (1 << 30)) mb *= 2;
    while (kb < K && kb < (1 << 30)) kb *= 2;
    int lda = w->ld == K ? 0 : w->ld, ldb = x->ld == K ? 0 : x->ld; /* 0: K's */
    struct fp8_kind key = {mb,     kb,      N,       K,    lda, ldb,  ldy, w->how,
                           x->how, w->e5m2, x->e5m2, fast, yt,  NULL, {},  false};
    struct fp8_kind *q = NULL, scratch;
    for (int i = 0; i < c->n && !q; i++) {
        struct fp8_kind *k = &c->kind[i];
        if (k->mb == mb && k->kb == kb && k->N == N && k->lda == lda && k->ldb == ldb &&
            k->ldc == ldy && k->ha == w->how && k->hb == x->how && k->ea == w->e5m2 &&
            k->eb == x->e5m2 && k->fast == (int)fast && k->yt == yt)
            q = k;
    }
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    bool fresh = !q;
    if (fresh) { /* a new kind: kept while there is room, else chosen for this call alone */
        q = c->n < FP8_KINDS ? &c->kind[c->n++] : &scratch;
        *q = key;
        if ((st = kind_desc(q))) q->usable = false;
    } else if (!q->usable) {
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* the scale pointers before the heuristic: block scaling's wants them set (cuBLASLt: "The
     * scaling mode for A scale (BLK128x128_32F) requires a custom pointer for A scale") */
    if (!st)
        st = cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w->sinv,
                                            sizeof w->sinv);
    if (!st)
        st = cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x->sinv,
                                            sizeof x->sinv);
    if (!st && fresh && (st = kind_algo(c, q, w, x, mb))) q->usable = false;
    if (!st && fresh && q != &scratch && beta == 0.0f && !c->no_pick)
        kind_pick(c, q, w, x, M, y, ws, s);
    float one = 1.0f;
    cublasLtMatrixLayout_t l[3] = {NULL, NULL, NULL};
    if (!st) st = layouts(l, w, x, M, N, K, ldy, yt);
    if (!st)
        st = cublasLtMatmul(c->lt, q->op, &one, w->q, l[0], x->q, l[1], &beta, y, l[2], y, l[2],
                            &q->algo, ws, c->ws_bytes, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && (mb != M || q->K != K)) { /* not at M rows, K */
        struct fp8_kind once = *q;
        once.K = K;
        if (!(st = kind_algo(c, &once, w, x, M)))
            st = cublasLtMatmul(c->lt, once.op, &one, w->q, l[0], x->q, l[1], &beta, y, l[2], y,
                                l[2], &once.algo, ws, c->ws_bytes, s);
    }
    gk_lt_layouts_free(l);
    if (q == &scratch && q->op) cublasLtMatmulDescDestroy(q->op);
    return st;
}

/* y (rows x n, ldy; fp32 or bf16) = t (rows x n, dense, fp32) + beta y, rounded once as
 * cuBLASLt rounds its own output; beta 0 reads no y */
template <typename Y>
__global__ void k_tail_add(const float *t, Y *y, int ldy, int rows, int n, float beta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * n; i += gridDim.x * blockDim.x) {
        int r = i / n, c = i % n;
        float v = t[i];
        if (beta != 0.0f) v += beta * (float)y[(size_t)r * ldy + c];
        y[(size_t)r * ldy + c] = (Y)v;
    }
}

cublasStatus_t gk_fp8_gemm(struct gk_fp8_lt *c, const struct gk_fp8_mat *w,
                           const struct gk_fp8_mat *x, int M, int N, int K, void *y, int ldy,
                           cudaDataType yt, float beta, bool fast, void *tail, void *ws,
                           cudaStream_t s)
{
    int R = M / EXEC_FP8_PAD * EXEC_FP8_PAD, rest = M - R;
    if (x->how != EXEC_FP8_TILE_1X128 || !rest)
        return fp8_gemm_once(c, w, x, M, N, K, y, ldy, yt, beta, fast, ws, s);
    /* block scaling at rows not a multiple of EXEC_FP8_PAD: the first R rows straight into y,
     * then EXEC_FP8_PAD rows from R (x's padding past M) into tail in fp32, their first `rest`
     * added into y; x's factors laid out for that split (exec_fp8_factor_at) */
    if (!tail || (yt != CUDA_R_32F && yt != CUDA_R_16BF)) return CUBLAS_STATUS_INVALID_VALUE;
    size_t ysz = yt == CUDA_R_32F ? 4 : 2;
    cublasStatus_t st = fp8_gemm_once(c, w, x, R, N, K, y, ldy, yt, beta, fast, ws, s);
    struct gk_fp8_mat xt = *x;
    xt.q += (size_t)R * x->ld;
    xt.sinv += (size_t)R * ((K + 127) / 128);
    if (!st)
        st = fp8_gemm_once(c, w, &xt, EXEC_FP8_PAD, N, K, tail, N, CUDA_R_32F, 0.0f, fast, ws, s);
    if (st) return st;
    char *yr = (char *)y + (size_t)R * ldy * ysz;
    int n = rest * N, blocks = (n + TPB - 1) / TPB;
    if (yt == CUDA_R_32F)
        k_tail_add<<<blocks, TPB, 0, s>>>((const float *)tail, (float *)yr, ldy, rest, N, beta);
    else
        k_tail_add<<<blocks, TPB, 0, s>>>((const float *)tail, (bf16 *)yr, ldy, rest, N, beta);
    return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                             : CUBLAS_STATUS_EXECUTION_FAILED;
}
