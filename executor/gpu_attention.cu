/*
 * gpu_attention.cu: causal (optionally sliding-window) attention without a seq x seq matrix, on
 * the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), in the manner of FlashAttention-2.
 *
 * Forward: a block owns 64 queries of one head (a warp 16), walks the key tiles its queries see
 * (the next tile's load by cp.async overlapping this one's products),
 * keeps the running row maximum and sum (online softmax) and the output in registers; it writes O
 * (bf16) and each row's log-sum-exp (base 2, of the scaled scores) for the backward.
 * Backward: delta = rowsum(dO * O); one kernel per key tile (all query heads of its KV group, all
 * query tiles that see it) accumulates dK and dV in registers, another per query tile accumulates
 * dQ; both recompute P from the saved log-sum-exp. Every output element is written by exactly one
 * thread: no atomics, so the result is the same on every run.
 * Head dims are padded with zeros in shared memory to the kernel's compiled width (the smallest of
 * 32/32, 64/64, 128/128, 192/128, 256/256 that holds (dqk, dv)).
 */
#include "gpu_step.h"

#include <math.h>
#include <stdint.h>

#define FA_BM 64  /* queries per block (forward, dQ) */
#define FA_BN 64  /* keys per block (dK dV) */
#ifndef FA_BN_FWD
#define FA_BN_FWD 64 /* keys per tile (forward) */
#endif
#ifndef FA_BN_DQ
#define FA_BN_DQ 32  /* keys per tile (dQ) */
#endif
#define FA_BQ 32  /* queries per tile in the dK dV kernel */
#define FA_PAD 8  /* bf16 of padding per shared row: conflict-free ldmatrix */
#define FA_THREADS 128

/* ---- tensor-core fragments ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* A (16 x 16, row-major at p with row stride ld): a[0..3] in mma order. */
__device__ __forceinline__ void ld_a(uint32_t a[4], const bf16 *p, int ld, int lane)
{
    int mi = lane >> 3;
    const bf16 *r = p + ((lane & 7) + (mi & 1) * 8) * ld + (mi >> 1) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(smem_addr(r)));
}

/* B for two n-tiles (16 k x 16 n) stored n-major ([n][k] at p): b[0..1] tile 0, b[2..3] tile 1. */
__device__ __forceinline__ void ld_b_nk(uint32_t b[4], const bf16 *p, int ld, int lane)
{
    int mi = lane >> 3;
    const bf16 *r = p + ((lane & 7) + (mi >> 1) * 8) * ld + (mi & 1) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_addr(r)));
}

/* B for two n-tiles stored k-major ([k][n] at p), transposed by ldmatrix. */
__device__ __forceinline__ void ld_b_kn(uint32_t b[4], const bf16 *p, int ld, int lane)
{
    int mi = lane >> 3;
    const bf16 *r = p + ((lane & 7) + (mi & 1) * 8) * ld + (mi >> 1) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_addr(r)));
}

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The accumulators of n-tiles 2c and 2c+1 (16 x 16) as the A operand of the next product. */
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float x[4], const float y[4])
{
    a[0] = pack(x[0], x[1]);
    a[1] = pack(x[2], x[3]);
    a[2] = pack(y[0], y[1]);
    a[3] = pack(y[2], y[3]);
}

/* C (16 x 8n) += A (16 x K, row-major, shared) B, B stored [n][k] (shared); K multiple of 16. */
template <int N>
__device__ __forceinline__ void gemm_nk(float c[][4], const bf16 *A, int lda, const bf16 *B,
                                        int ldb, int K, int lane)
{
    for (int kk = 0; kk < K; kk += 16) {
        uint32_t a[4];
        ld_a(a, A + kk, lda, lane);
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            uint32_t b[4];
            ld_b_nk(b, B + n * 8 * ldb + kk, ldb, lane);
            mma(c[n], a, b[0], b[1]);
            mma(c[n + 1], a, b[2], b[3]);
        }
    }
}

/* C (16 x 8N) += P B, P (16 x 16 KC) in accumulators p, B stored [k][n] (shared). */
template <int N, int KC>
__device__ __forceinline__ void gemm_pk(float c[][4], const float p[][4], const bf16 *B, int ldb,
                                        int lane)
{
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4];
        acc_to_a(a, p[2 * kc], p[2 * kc + 1]);
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            uint32_t b[4];
            ld_b_kn(b, B + kc * 16 * ldb + n * 8, ldb, lane);
            mma(c[n], a, b[0], b[1]);
            mma(c[n + 1], a, b[2], b[3]);
        }
    }
}

/* rows x d (global, row stride ld) into shared rows x DP (stride DP + FA_PAD), zero beyond, by
 * cp.async where rows are 16-byte aligned (the caller commits and waits), else plainly. */
template <int DP>
__device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, size_t ld, int rows,
                                          int nrows, int d)
{
    constexpr int LD = DP + FA_PAD, CH = DP / 8;
    bool vec = (d % 8 == 0) && (ld % 8 == 0) && ((uintptr_t)src % 16 == 0);
    for (int i = threadIdx.x; i < rows * CH; i += blockDim.x) {
        int r = i / CH, c = (i % CH) * 8;
        bool in = r < nrows && c < d;
        bf16 *to = dst + r * LD + c;
        if (vec) {
            const bf16 *from = in ? src + r * ld + c : src; /* 0 bytes read: zero fill */
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(to)),
                         "l"(from), "r"(in ? 16 : 0));
        } else {
            bf16 tmp[8];
            for (int e = 0; e < 8; e++)
                tmp[e] = in && c + e < d ? src[r * ld + c + e] : __float2bfloat16(0.0f);
            *(uint4 *)to = *(uint4 *)tmp;
        }
    }
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;"); }
/* Wait until at most n of this thread's committed groups are pending, then for the block. */
template <int N> __device__ __forceinline__ void async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
    __syncthreads();
}

__device__ __forceinline__ bool visible(int i, int j, int S, int window)
{
    return j <= i && i < S && (window <= 0 || j > i - window);
}

/* ---- forward -------------------------------------------------------------------------------- */

struct fa_args {
    const bf16 *q, *k, *v, *o_in, *dout;
    bf16 *o;
    float *lse, *delta, *dq, *dk, *dv;
    int S, H, KV, dqk, dvd, window;
    float scale, scale_log2; /* scale, scale * log2(e) */
};

template <int DQ, int DV, int BN>
__global__ void __launch_bounds__(FA_THREADS) k_flash_forward(fa_args a)
{
    constexpr int LQ = DQ + FA_PAD, LV = DV + FA_PAD, NS = BN / 8, NO = DV / 8;
    constexpr int TILE = BN * (LQ + LV); /* one K and V buffer */
    extern __shared__ uint4 fa_smem[];
    bf16 *Qs = (bf16 *)fa_smem, *KV = Qs + FA_BM * LQ;
    int S = a.S, H = a.H, KVh = a.KV;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM, hh = blockIdx.y, b = blockIdx.z;
    int kvh = hh / (H / KVh), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t t0 = (size_t)b * S;
    int r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8, cq = 2 * (lane & 3);
    int kend = min(S, q0 + FA_BM);
    int first = (a.window > 0 ? max(0, q0 - a.window + 1) : 0) / BN * BN;
    int ntiles = (kend - first + BN - 1) / BN;
    auto load_kv = [&](int it) {
        int k0 = first + it * BN;
        bf16 *Ks = KV + (it & 1) * TILE;
        load_tile<DQ>(Ks, a.k + (t0 + k0) * KVh * a.dqk + (size_t)kvh * a.dqk,
                      (size_t)KVh * a.dqk, BN, S - k0, a.dqk);
        load_tile<DV>(Ks + BN * LQ, a.v + (t0 + k0) * KVh * a.dvd + (size_t)kvh * a.dvd,
                      (size_t)KVh * a.dvd, BN, S - k0, a.dvd);
    };
    load_tile<DQ>(Qs, a.q + (t0 + q0) * H * a.dqk + (size_t)hh * a.dqk, (size_t)H * a.dqk, FA_BM,
                  S - q0, a.dqk);
    load_kv(0);
    async_commit();
    float o[NO][4] = {}, m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            load_kv(it + 1);
            async_commit();
            async_wait<1>();
        } else {
            async_wait<0>();
        }
        int k0 = first + it * BN;
        const bf16 *Ks = KV + (it & 1) * TILE, *Vs = Ks + BN * LQ;
        float s[NS][4] = {};
        gemm_nk<NS>(s, Qs + warp * 16 * LQ, LQ, Ks, LQ, DQ, lane);
        float t0max = -INFINITY, t1max = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = e < 2 ? r0 : r1, j = k0 + n * 8 + cq + (e & 1);
                float x = visible(i, j, S, a.window) ? s[n][e] * a.scale_log2 : -INFINITY;
                s[n][e] = x;
                if (e < 2) t0max = fmaxf(t0max, x);
                else t1max = fmaxf(t1max, x);
            }
        for (int off = 1; off < 4; off <<= 1) {
            t0max = fmaxf(t0max, __shfl_xor_sync(0xffffffffu, t0max, off));
            t1max = fmaxf(t1max, __shfl_xor_sync(0xffffffffu, t1max, off));
        }
        float n0 = fmaxf(m0, t0max), n1 = fmaxf(m1, t1max);
        float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
        float al0 = exp2f(m0 - b0), al1 = exp2f(m1 - b1);
        m0 = n0;
        m1 = n1;
        l0 *= al0;
        l1 *= al1;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            s[n][0] = exp2f(s[n][0] - b0);
            s[n][1] = exp2f(s[n][1] - b0);
            s[n][2] = exp2f(s[n][2] - b1);
            s[n][3] = exp2f(s[n][3] - b1);
            l0 += s[n][0] + s[n][1];
            l1 += s[n][2] + s[n][3];
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[n][0] *= al0;
            o[n][1] *= al0;
            o[n][2] *= al1;
            o[n][3] *= al1;
        }
        gemm_pk<NO, BN / 16>(o, s, Vs, LV, lane);
        __syncthreads(); /* this buffer is refilled by the next iteration's prefetch */
    }
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = e < 2 ? r0 : r1, c = n * 8 + cq + (e & 1);
            if (i < S && c < a.dvd)
                a.o[((t0 + i) * H + hh) * a.dvd + c] = __float2bfloat16(o[n][e] * (e < 2 ? i0 : i1));
        }
    if ((lane & 3) == 0) {
        float *lse = a.lse + ((size_t)b * H + hh) * S;
        if (r0 < S) lse[r0] = m0 + log2f(l0);
        if (r1 < S) lse[r1] = m1 + log2f(l1);
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

/* delta[b, h, i] = sum_d dO[i, h, d] O[i, h, d]: one warp per row. */
__global__ void k_flash_delta(fa_args a, int rows)
{
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (row >= rows) return;
    int H = a.H, S = a.S, hh = row % H;
    size_t tok = (size_t)row / H;
    const bf16 *o = a.o_in + tok * a.dvd * H + (size_t)hh * a.dvd;
    const bf16 *g = a.dout + tok * a.dvd * H + (size_t)hh * a.dvd;
    float acc = 0.0f;
    for (int d = lane; d < a.dvd; d += 32) acc += __bfloat162float(o[d]) * __bfloat162float(g[d]);
    for (int off = 16; off; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) a.delta[((tok / S) * H + hh) * S + tok % S] = acc;
}

/* dK and dV of 64 keys of KV head blockIdx.y, over the query heads of its group. */
template <int DQ, int DV>
__global__ void __launch_bounds__(FA_THREADS) k_flash_dkdv(fa_args a)
{
    constexpr int LQ = DQ + FA_PAD, LV = DV + FA_PAD, NS = FA_BQ / 8;
    constexpr int TILE = FA_BQ * (LQ + LV) + 4 * FA_BQ; /* Q, dO, then lse and delta (floats) */
    extern __shared__ uint4 fa_smem[];
    bf16 *Ks = (bf16 *)fa_smem, *Vs = Ks + FA_BN * LQ, *QD = Vs + FA_BN * LV;
    int S = a.S, H = a.H, KVh = a.KV, rep = H / KVh;
    int k0 = blockIdx.x * FA_BN, kvh = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t t0 = (size_t)b * S;
    int j0 = k0 + warp * 16 + (lane >> 2), j1 = j0 + 8, cq = 2 * (lane & 3);
    int iend = a.window > 0 ? min(S, k0 + FA_BN - 1 + a.window) : S;
    int first = k0 / FA_BQ * FA_BQ, per = (iend - first + FA_BQ - 1) / FA_BQ, ntiles = rep * per;
    auto load_q = [&](int it) {
        int hh = kvh * rep + it / per, i0 = first + it % per * FA_BQ;
        bf16 *Qs = QD + (it & 1) * TILE, *Ds = Qs + FA_BQ * LQ;
        float *Ls = (float *)(Ds + FA_BQ * LV), *Dl = Ls + FA_BQ;
        load_tile<DQ>(Qs, a.q + (t0 + i0) * H * a.dqk + (size_t)hh * a.dqk, (size_t)H * a.dqk,
                      FA_BQ, S - i0, a.dqk);
        load_tile<DV>(Ds, a.dout + (t0 + i0) * H * a.dvd + (size_t)hh * a.dvd, (size_t)H * a.dvd,
                      FA_BQ, S - i0, a.dvd);
        const float *lse = a.lse + ((size_t)b * H + hh) * S, *del = a.delta + ((size_t)b * H + hh) * S;
        for (int t = threadIdx.x; t < FA_BQ; t += blockDim.x) {
            Ls[t] = i0 + t < S ? lse[i0 + t] : 0.0f;
            Dl[t] = i0 + t < S ? del[i0 + t] : 0.0f;
        }
    };
    load_tile<DQ>(Ks, a.k + (t0 + k0) * KVh * a.dqk + (size_t)kvh * a.dqk, (size_t)KVh * a.dqk,
                  FA_BN, S - k0, a.dqk);
    load_tile<DV>(Vs, a.v + (t0 + k0) * KVh * a.dvd + (size_t)kvh * a.dvd, (size_t)KVh * a.dvd,
                  FA_BN, S - k0, a.dvd);
    load_q(0);
    async_commit();
    float dk[DQ / 8][4] = {}, dv[DV / 8][4] = {};
    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            load_q(it + 1);
            async_commit();
            async_wait<1>();
        } else {
            async_wait<0>();
        }
        int i0 = first + it % per * FA_BQ;
        const bf16 *Qs = QD + (it & 1) * TILE, *Ds = Qs + FA_BQ * LQ;
        const float *Ls = (const float *)(Ds + FA_BQ * LV), *Dl = Ls + FA_BQ;
        /* S^T = K Q^T and dP^T = V dO^T: rows keys, columns queries */
        float p[NS][4] = {}, dp[NS][4] = {};
        gemm_nk<NS>(p, Ks + warp * 16 * LQ, LQ, Qs, LQ, DQ, lane);
        gemm_nk<NS>(dp, Vs + warp * 16 * LV, LV, Ds, LV, DV, lane);
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = n * 8 + cq + (e & 1), i = i0 + c, j = e < 2 ? j0 : j1;
                float pv = visible(i, j, S, a.window) ? exp2f(p[n][e] * a.scale_log2 - Ls[c]) : 0.0f;
                p[n][e] = pv;
                dp[n][e] = pv * (dp[n][e] - Dl[c]);
            }
        gemm_pk<DV / 8, FA_BQ / 16>(dv, p, Ds, LV, lane);
        gemm_pk<DQ / 8, FA_BQ / 16>(dk, dp, Qs, LQ, lane);
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < DQ / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = e < 2 ? j0 : j1, c = n * 8 + cq + (e & 1);
            if (j < S && c < a.dqk) a.dk[((t0 + j) * KVh + kvh) * a.dqk + c] = dk[n][e] * a.scale;
        }
#pragma unroll
    for (int n = 0; n < DV / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = e < 2 ? j0 : j1, c = n * 8 + cq + (e & 1);
            if (j < S && c < a.dvd) a.dv[((t0 + j) * KVh + kvh) * a.dvd + c] = dv[n][e];
        }
}

/* dQ of 64 queries of head blockIdx.y. */
template <int DQ, int DV, int BN>
__global__ void __launch_bounds__(FA_THREADS) k_flash_dq(fa_args a)
{
    constexpr int LQ = DQ + FA_PAD, LV = DV + FA_PAD, NS = BN / 8, TILE = BN * (LQ + LV);
    extern __shared__ uint4 fa_smem[];
    bf16 *Qs = (bf16 *)fa_smem, *Ds = Qs + FA_BM * LQ, *KV = Ds + FA_BM * LV;
    int S = a.S, H = a.H, KVh = a.KV;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM, hh = blockIdx.y, b = blockIdx.z;
    int kvh = hh / (H / KVh), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t t0 = (size_t)b * S;
    int r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8, cq = 2 * (lane & 3);
    const float *lse = a.lse + ((size_t)b * H + hh) * S, *del = a.delta + ((size_t)b * H + hh) * S;
    float L0 = r0 < S ? lse[r0] : 0.0f, L1 = r1 < S ? lse[r1] : 0.0f;
    float D0 = r0 < S ? del[r0] : 0.0f, D1 = r1 < S ? del[r1] : 0.0f;
    int kend = min(S, q0 + FA_BM);
    int first = (a.window > 0 ? max(0, q0 - a.window + 1) : 0) / BN * BN;
    int ntiles = (kend - first + BN - 1) / BN;
    auto load_kv = [&](int it) {
        int k0 = first + it * BN;
        bf16 *Ks = KV + (it & 1) * TILE;
        load_tile<DQ>(Ks, a.k + (t0 + k0) * KVh * a.dqk + (size_t)kvh * a.dqk,
                      (size_t)KVh * a.dqk, BN, S - k0, a.dqk);
        load_tile<DV>(Ks + BN * LQ, a.v + (t0 + k0) * KVh * a.dvd + (size_t)kvh * a.dvd,
                      (size_t)KVh * a.dvd, BN, S - k0, a.dvd);
    };
    load_tile<DQ>(Qs, a.q + (t0 + q0) * H * a.dqk + (size_t)hh * a.dqk, (size_t)H * a.dqk, FA_BM,
                  S - q0, a.dqk);
    load_tile<DV>(Ds, a.dout + (t0 + q0) * H * a.dvd + (size_t)hh * a.dvd, (size_t)H * a.dvd,
                  FA_BM, S - q0, a.dvd);
    load_kv(0);
    async_commit();
    float dq[DQ / 8][4] = {};
    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            load_kv(it + 1);
            async_commit();
            async_wait<1>();
        } else {
            async_wait<0>();
        }
        int k0 = first + it * BN;
        const bf16 *Ks = KV + (it & 1) * TILE, *Vs = Ks + BN * LQ;
        float p[NS][4] = {}, dp[NS][4] = {};
        gemm_nk<NS>(p, Qs + warp * 16 * LQ, LQ, Ks, LQ, DQ, lane);
        gemm_nk<NS>(dp, Ds + warp * 16 * LV, LV, Vs, LV, DV, lane);
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = e < 2 ? r0 : r1, j = k0 + n * 8 + cq + (e & 1);
                float pv = visible(i, j, S, a.window)
                               ? exp2f(p[n][e] * a.scale_log2 - (e < 2 ? L0 : L1)) : 0.0f;
                p[n][e] = pv * (dp[n][e] - (e < 2 ? D0 : D1));
            }
        gemm_pk<DQ / 8, BN / 16>(dq, p, Ks, LQ, lane);
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < DQ / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = e < 2 ? r0 : r1, c = n * 8 + cq + (e & 1);
            if (i < S && c < a.dqk) a.dq[((t0 + i) * H + hh) * a.dqk + c] = dq[n][e] * a.scale;
        }
}

/* ---- launchers ------------------------------------------------------------------------------ */

/* Dynamic shared memory above 48 KB needs the kernel's consent. */
template <typename K> static cudaError_t launch_smem(K kernel, size_t bytes)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int DQ, int DV>
static cudaError_t flash_launch(const fa_args &a, int B, bool backward, cudaStream_t s)
{
    constexpr size_t LQ = DQ + FA_PAD, LV = DV + FA_PAD;
    constexpr int BNF = FA_BN_FWD, BNQ = FA_BN_DQ;
    int nq = (a.S + FA_BM - 1) / FA_BM, nk = (a.S + FA_BN - 1) / FA_BN;
    cudaError_t e;
    if (!backward) {
        size_t sm = (FA_BM * LQ + 2 * BNF * (LQ + LV)) * sizeof(bf16);
        if ((e = launch_smem(k_flash_forward<DQ, DV, BNF>, sm)) != cudaSuccess) return e;
        k_flash_forward<DQ, DV, BNF><<<dim3(nq, a.H, B), FA_THREADS, sm, s>>>(a);
        return cudaGetLastError();
    }
    int rows = B * a.S * a.H;
    k_flash_delta<<<(rows + 7) / 8, 256, 0, s>>>(a, rows);
    size_t sm_kv = (FA_BN * (LQ + LV) + 2 * (FA_BQ * (LQ + LV) + 4 * FA_BQ)) * sizeof(bf16);
    if ((e = launch_smem(k_flash_dkdv<DQ, DV>, sm_kv)) != cudaSuccess) return e;
    k_flash_dkdv<DQ, DV><<<dim3(nk, a.KV, B), FA_THREADS, sm_kv, s>>>(a);
    size_t sm_q = (FA_BM * (LQ + LV) + 2 * BNQ * (LQ + LV)) * sizeof(bf16);
    if ((e = launch_smem(k_flash_dq<DQ, DV, BNQ>, sm_q)) != cudaSuccess) return e;
    k_flash_dq<DQ, DV, BNQ><<<dim3(nq, a.H, B), FA_THREADS, sm_q, s>>>(a);
    return cudaGetLastError();
}

/* The compiled widths, smallest first. */
static cudaError_t flash_dispatch(const fa_args &a, int B, bool backward, cudaStream_t s)
{
    int q = a.dqk, v = a.dvd;
    if (q <= 32 && v <= 32) return flash_launch<32, 32>(a, B, backward, s);
    if (q <= 64 && v <= 64) return flash_launch<64, 64>(a, B, backward, s);
    if (q <= 128 && v <= 128) return flash_launch<128, 128>(a, B, backward, s);
    if (q <= 192 && v <= 128) return flash_launch<192, 128>(a, B, backward, s);
    return flash_launch<256, 256>(a, B, backward, s);
}

bool gk_flash_supported(int dqk, int dv)
{
    return dqk >= 1 && dv >= 1 && dqk <= GK_FLASH_MAX_DIM && dv <= GK_FLASH_MAX_DIM;
}

static fa_args flash_args(const bf16 *q, const bf16 *k, const bf16 *v, int S, int H, int KV,
                          int dqk, int dv, int window)
{
    fa_args a = {};
    a.q = q;
    a.k = k;
    a.v = v;
    a.S = S;
    a.H = H;
    a.KV = KV;
    a.dqk = dqk;
    a.dvd = dv;
    a.window = window;
    a.scale = 1.0f / sqrtf((float)dqk);
    a.scale_log2 = a.scale * 1.4426950408889634f;
    return a;
}

cudaError_t gk_flash_forward(const bf16 *q, const bf16 *k, const bf16 *v, int B, int S, int H,
                             int KV, int dqk, int dv, int window, bf16 *o, float *lse,
                             cudaStream_t s)
{
    if (B == 0 || S == 0) return cudaSuccess;
    fa_args a = flash_args(q, k, v, S, H, KV, dqk, dv, window);
    a.o = o;
    a.lse = lse;
    return flash_dispatch(a, B, false, s);
}

cudaError_t gk_flash_backward(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *o,
                              const bf16 *dout, const float *lse, int B, int S, int H, int KV,
                              int dqk, int dv, int window, float *delta, float *dq, float *dk,
                              float *dvo, cudaStream_t s)
{
    if (B == 0 || S == 0) return cudaSuccess;
    fa_args a = flash_args(q, k, v, S, H, KV, dqk, dv, window);
    a.o_in = o;
    a.dout = dout;
    a.lse = (float *)lse;
    a.delta = delta;
    a.dq = dq;
    a.dk = dk;
    a.dv = dvo;
    return flash_dispatch(a, B, true, s);
}
