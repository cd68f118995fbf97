/*
 * gpu_kernels_moe.cu: the CUDA kernels of the MoE path, one launcher each (gpu_kernels.h): the
 * dropless permutation (count, scan, place; gather, combine and their backward), the router's
 * scores and backward, co-activation counts, and expert parallelism's rows in flight. The same
 * rules as gpu_kernels.cu: deterministic, no floating-point atomics, each the plain form of its
 * reference operation (ref_moe.c, ref_ep.c).
 */
#include "gpu_kernels.h"

#include <math.h>

/* ---- dropless permutation ------------------------------------------------------------------- */

/* A stable counting sort of the n = T * top_k (token, slot) pairs by expert, in chunks of
 * GK_CHUNK pairs: counts per chunk, a scan over chunks per expert and over experts, then each
 * chunk places its pairs in order. row_src[p] = pair index of permuted row p; pos[i] = its row. */
__global__ void k_perm_count(const int *choice, int n, int E, int *cnt)
{
    extern __shared__ int hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    int i0 = blockIdx.x * GK_CHUNK, i1 = min(n, i0 + GK_CHUNK);
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) atomicAdd(&hist[choice[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[(size_t)blockIdx.x * E + e] = hist[e];
}

__global__ void k_perm_scan(const int *cnt, int chunks, int E, int *base, int *off)
{
    extern __shared__ int tot[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int c = 0; c < chunks; c++) {
            base[(size_t)c * E + e] = run;
            run += cnt[(size_t)c * E + e];
        }
        tot[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            off[e] = run;
            run += tot[e];
        }
        off[E] = run;
    }
}

__global__ void k_perm_place(const int *choice, int n, int E, const int *base, const int *off,
                             int *row_src, int *pos)
{
    extern __shared__ int fill[];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        fill[e] = off[e] + base[(size_t)blockIdx.x * E + e];
    __syncthreads();
    if (threadIdx.x != 0) return;
    int i0 = blockIdx.x * GK_CHUNK, i1 = min(n, i0 + GK_CHUNK);
    for (int i = i0; i < i1; i++) {
        int p = fill[choice[i]]++;
        row_src[p] = i;
        pos[i] = p;
    }
}

cudaError_t gk_permute_count(const int *choice, int n, int E, int *cnt, int *base, int *off,
                             cudaStream_t s)
{
    int chunks = (n + GK_CHUNK - 1) / GK_CHUNK;
    size_t sh = sizeof(int) * E;
    if (chunks) k_perm_count<<<chunks, TPB, sh, s>>>(choice, n, E, cnt);
    k_perm_scan<<<1, TPB, sh, s>>>(cnt, chunks, E, base, off);
    return cudaGetLastError();
}

cudaError_t gk_permute_place(const int *choice, int n, int E, const int *base, const int *off,
                             int *row_src, int *pos, cudaStream_t s)
{
    int chunks = (n + GK_CHUNK - 1) / GK_CHUNK;
    if (chunks)
        k_perm_place<<<chunks, 32, sizeof(int) * E, s>>>(choice, n, E, base, off, row_src, pos);
    return cudaGetLastError();
}

/* |v| as gk_abs_bits: one bf16, or the largest of 8 in a 16-byte word */
static __device__ __forceinline__ unsigned abs_bits_of(bf16 v)
{
    return gk_abs_bits(__bfloat162float(v));
}
static __device__ __forceinline__ unsigned abs_bits_of(uint4 v)
{
    return gk_abs_bits8(v);
}

/* xp[p] = x[row_src[p] / k], a row w units of W (a bf16, or 8 of them in 16 bytes when h % 8 ==
 * 0) wide; with am, each expert's amax of the values (struct gk_amax_rows) */
template <typename W>
__global__ void k_gather(const W *x, const int *row_src, int k, int P, int w, W *xp,
                         struct gk_amax_rows am)
{
    __shared__ unsigned red[TPB / 32];
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, n = (size_t)P * w;
    unsigned m = 0;
    if (i < n) {
        size_t p = i / w, c = i % w;
        W v = x[(size_t)(row_src[p] / k) * w + c];
        xp[i] = v;
        if (am.amax[0]) m = abs_bits_of(v);
    }
    if (am.amax[0]) gk_rows_amax_v<sizeof(W) / sizeof(bf16)>(am, 0, m, i, n, 0, red);
}

cudaError_t gk_gather(const bf16 *x, const int *row_src, int k, int P, int h, bf16 *xp,
                      const struct gk_amax_rows *am, cudaStream_t s)
{
    size_t n = (size_t)P * h;
    if (!n) return cudaGetLastError();
    struct gk_amax_rows a = am ? *am : gk_amax_rows{NULL, 0, h, {NULL, NULL}};
    a.cols = h;
    if (h % 8 == 0)
        k_gather<<<blocks_for(n / 8, TPB), TPB, 0, s>>>((const uint4 *)x, row_src, k, P, h / 8,
                                                        (uint4 *)xp, a);
    else
        k_gather<<<blocks_for(n, TPB), TPB, 0, s>>>(x, row_src, k, P, h, xp, a);
    return cudaGetLastError();
}

/* y[t] += sum_j w[t,j] * yp[pos[t,j]] (the weighted unpermute), slots in order. */
__global__ void k_combine(float *y, const float *yp, const float *w, const int *pos, int T, int k,
                          int h)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * h) return;
    size_t t = i / h, c = i % h;
    float acc = y[i];
    for (int j = 0; j < k; j++)
        acc += (w ? w[t * k + j] : 1.0f) * yp[(size_t)pos[t * k + j] * h + c];
    y[i] = acc;
}

/* The same, 4 columns per thread, for h % 4 == 0 (the same additions in the same order). */
__global__ void k_combine4(float4 *y, const float4 *yp, const float *w, const int *pos, int T,
                           int k, int h4)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * h4) return;
    size_t t = i / h4, c = i % h4;
    float4 acc = y[i];
    for (int j = 0; j < k; j++) {
        float wt = w ? w[t * k + j] : 1.0f;
        float4 v = yp[(size_t)pos[t * k + j] * h4 + c];
        acc.x += wt * v.x, acc.y += wt * v.y, acc.z += wt * v.z, acc.w += wt * v.w;
    }
    y[i] = acc;
}

cudaError_t gk_combine(float *y, const float *yp, const float *w, const int *pos, int T, int k,
                       int h, cudaStream_t s)
{
    size_t n = (size_t)T * h;
    if (!n) return cudaGetLastError();
    if (h % 4 == 0)
        k_combine4<<<blocks_for(n / 4, TPB), TPB, 0, s>>>((float4 *)y, (const float4 *)yp, w, pos,
                                                          T, k, h / 4);
    else
        k_combine<<<blocks_for(n, TPB), TPB, 0, s>>>(y, yp, w, pos, T, k, h);
    return cudaGetLastError();
}

/* Backward of the combine: dyp[pos[t,j]] = w[t,j] * dy[t] (bf16), dw[t,j] = dy[t] . yp[pos]; with
 * am, each expert's amax of dyp (struct gk_amax_rows). */
__global__ void k_combine_backward(const float *dy, const float *yp, const float *w, const int *pos,
                                   int k, int h, bf16 *dyp, float *dw, struct gk_amax_rows am)
{
    __shared__ float red[TPB / 32];
    __shared__ unsigned redm[TPB / 32];
    size_t t = blockIdx.x;
    const float *g = dy + t * h;
    for (int j = 0; j < k; j++) {
        size_t p = pos[t * k + j];
        float wt = w ? w[t * k + j] : 1.0f, dot = 0.0f;
        unsigned m = 0;
        for (int c = threadIdx.x; c < h; c += blockDim.x) {
            dot += g[c] * yp[p * h + c];
            bf16 v = __float2bfloat16(wt * g[c]);
            dyp[p * h + c] = v;
            if (am.amax[0]) m = max(m, gk_abs_bits(__bfloat162float(v)));
        }
        dot = block_sum(dot, red);
        if (w && threadIdx.x == 0) dw[t * k + j] = dot;
        if (am.amax[0]) gk_rows_amax(am.off, am.E, am.amax[0], m, (int)p, (int)p, (int)p, redm);
    }
}

cudaError_t gk_combine_backward(const float *dy, const float *yp, const float *w, const int *pos,
                                int T, int k, int h, bf16 *dyp, float *dw,
                                const struct gk_amax_rows *am, cudaStream_t s)
{
    struct gk_amax_rows a = am ? *am : gk_amax_rows{NULL, 0, h, {NULL, NULL}};
    if (T) k_combine_backward<<<T, TPB, 0, s>>>(dy, yp, w, pos, k, h, dyp, dw, a);
    return cudaGetLastError();
}

__global__ void k_scale_rows(bf16 *xp, const float *w, const int *pos, int h)
{
    size_t p = blockIdx.x;
    bf16 *row = xp + (size_t)pos[p] * h;
    float wt = w[p];
    for (int c = threadIdx.x; c < h; c += blockDim.x)
        row[c] = __float2bfloat16(wt * __bfloat162float(row[c]));
}

cudaError_t gk_scale_rows(bf16 *xp, const float *w, const int *pos, int P, int h, cudaStream_t s)
{
    if (P) k_scale_rows<<<P, TPB, 0, s>>>(xp, w, pos, h);
    return cudaGetLastError();
}

__global__ void k_gather_sum_scaled(const bf16 *dg, const bf16 *du, const int *pos, const float *w,
                                    const bf16 *x, int k, int h, float *dx, int accumulate,
                                    float *dw)
{
    __shared__ float red[TPB / 32];
    size_t t = blockIdx.x;
    const bf16 *xt = x + t * h;
    float *o = dx + t * h;
    for (int j = 0; j < k; j++) {
        size_t r = (size_t)pos[t * k + j] * h;
        float wt = w[t * k + j], dot = 0.0f;
        for (int c = threadIdx.x; c < h; c += blockDim.x) {
            float d = __bfloat162float(dg[r + c]) + __bfloat162float(du[r + c]);
            dot += d * __bfloat162float(xt[c]);
            float prev = j || accumulate ? o[c] : 0.0f;
            o[c] = prev + wt * d;
        }
        dot = block_sum(dot, red);
        if (threadIdx.x == 0) dw[t * k + j] = dot;
    }
}

cudaError_t gk_gather_sum_scaled(const bf16 *dg, const bf16 *du, const int *pos, const float *w,
                                 const bf16 *x, int T, int k, int h, float *dx, bool accumulate,
                                 float *dw, cudaStream_t s)
{
    if (T) k_gather_sum_scaled<<<T, TPB, 0, s>>>(dg, du, pos, w, x, k, h, dx, accumulate, dw);
    return cudaGetLastError();
}

/* dx[t] (+)= sum_j dg[pos[t,j]] + du[pos[t,j]], V columns a thread (8: 16-byte loads). */
template <int V>
__global__ void k_gather_sum(const bf16 *dg, const bf16 *du, const int *pos, int T, int k, int hv,
                             float *dx, int accumulate)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * hv) return;
    size_t t = i / hv, c = i % hv, h = (size_t)hv * V;
    float acc[V], a[V], b[V], *o = dx + t * h + c * V;
    if (accumulate)
        ld_f32<V>(o, acc);
    else
        for (int q = 0; q < V; q++) acc[q] = 0.0f;
    for (int j = 0; j < k; j++) {
        size_t r = (size_t)pos[t * k + j] * h + c * V;
        ld_bf16<V>(dg + r, a);
        ld_bf16<V>(du + r, b);
        for (int q = 0; q < V; q++) acc[q] += a[q] + b[q];
    }
    st_f32<V>(o, acc);
}

cudaError_t gk_gather_sum(const bf16 *dg, const bf16 *du, const int *pos, int T, int k, int h,
                          float *dx, bool accumulate, cudaStream_t s)
{
    size_t n = (size_t)T * h;
    if (!n) return cudaGetLastError();
    if (h % 8 == 0 && aligned(dg, 16) && aligned(du, 16) && aligned(dx, 16))
        k_gather_sum<8>
            <<<blocks_for(n / 8, TPB), TPB, 0, s>>>(dg, du, pos, T, k, h / 8, dx, accumulate);
    else
        k_gather_sum<1><<<blocks_for(n, TPB), TPB, 0, s>>>(dg, du, pos, T, k, h, dx, accumulate);
    return cudaGetLastError();
}

/* ---- router backward, scores, routing statistics ------------------------------------------- */

__device__ void scores_of(const struct exec_router_cfg *cfg, const float *z, float *s)
{
    int E = cfg->experts;
    if (cfg->scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-z[e]));
        return;
    }
    float mx = z[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = fmaxf(mx, z[e]);
    for (int e = 0; e < E; e++) sum += (s[e] = expf(z[e] - mx));
    for (int e = 0; e < E; e++) s[e] /= sum;
}

__global__ void k_scores(struct exec_router_cfg cfg, const float *logits, int T, float *scores)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    scores_of(&cfg, logits + (size_t)t * cfg.experts, scores + (size_t)t * cfg.experts);
}

cudaError_t gk_scores(const struct exec_router_cfg *cfg, const float *logits, int T, float *scores,
                      cudaStream_t s)
{
    if (T) k_scores<<<blocks_for(T, 128), 128, 0, s>>>(*cfg, logits, T, scores);
    return cudaGetLastError();
}

/* d logits of one token from d weight (and the load-balance term d aux / d s = auxg), the rule
 * of exec_ref_moe_backward. */
__global__ void k_router_backward(struct exec_router_cfg cfg, const float *logits,
                                  const int *choice, const float *weight, const float *dw,
                                  const float *auxg, int T, float *dz)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int E = cfg.experts, k = cfg.top_k;
    float s[GK_MAX_EXPERTS], ds[GK_MAX_EXPERTS];
    const float *z = logits + (size_t)t * E;
    const int *ch = choice + (size_t)t * k;
    const float *wt = weight + (size_t)t * k, *g = dw + (size_t)t * k;
    float *o = dz + (size_t)t * E;
    scores_of(&cfg, z, s);
    for (int e = 0; e < E; e++) ds[e] = auxg ? auxg[e] : 0.0f, o[e] = 0.0f;
    float sc = (float)cfg.scaling;
    if (cfg.softmax_after_topk) {
        float dot = 0.0f;
        for (int j = 0; j < k; j++) dot += wt[j] / sc * g[j] * sc;
        for (int j = 0; j < k; j++) o[ch[j]] = wt[j] / sc * (g[j] * sc - dot);
    } else if (cfg.norm_topk) {
        float sum = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) sum += s[ch[j]];
        for (int j = 0; j < k; j++) dot += g[j] * sc * s[ch[j]] / sum;
        for (int j = 0; j < k; j++) ds[ch[j]] += (g[j] * sc - dot) / sum;
    } else {
        for (int j = 0; j < k; j++) ds[ch[j]] += g[j] * sc;
    }
    if (cfg.scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) o[e] += ds[e] * s[e] * (1.0f - s[e]);
    } else {
        float dot = 0.0f;
        for (int e = 0; e < E; e++) dot += s[e] * ds[e];
        for (int e = 0; e < E; e++) o[e] += s[e] * (ds[e] - dot);
    }
}

cudaError_t gk_router_backward(const struct exec_router_cfg *cfg, const float *logits,
                               const int *choice, const float *weight, const float *dw,
                               const float *auxg, int T, float *dz, cudaStream_t s)
{
    if (T)
        k_router_backward<<<blocks_for(T, 64), 64, 0, s>>>(*cfg, logits, choice, weight, dw, auxg,
                                                           T, dz);
    return cudaGetLastError();
}

/* co[a][b] += 1 for every pair of distinct experts one token chose (symmetric). */
__global__ void k_coactivation(const int *choice, int T, int k, int E, unsigned long long *co)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int *c = choice + (size_t)t * k;
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < k; b++) {
            atomicAdd(&co[(size_t)c[a] * E + c[b]], 1ull);
            atomicAdd(&co[(size_t)c[b] * E + c[a]], 1ull);
        }
}

cudaError_t gk_coactivation(const int *choice, int T, int k, int E, unsigned long long *co,
                            cudaStream_t s)
{
    if (T) k_coactivation<<<blocks_for(T, TPB), TPB, 0, s>>>(choice, T, k, E, co);
    return cudaGetLastError();
}

/* ---- expert parallelism: rows in flight ------------------------------------------------------ */

/* out[r] (+)= sum over e in [row_off[r], row_off[r + 1]) of (w ? w[e] : 1) src[idx[e]], rows of
 * h values, in e order: a fixed order, so every run sums the same way. The source: fp32 rows, or
 * the sum of two bf16 rows. */
struct rows_f32 {
    const float *p;
    __device__ float at(size_t i) const { return p[i]; }
};
struct rows_bf16x2 {
    const bf16 *a, *b;
    __device__ float at(size_t i) const { return __bfloat162float(a[i]) + __bfloat162float(b[i]); }
};

template <typename Src>
__global__ void k_rows_csr(float *out, Src src, const int *idx, const float *w, const int *row_off,
                           int h, int accumulate)
{
    int r = blockIdx.x;
    int lo = row_off[r], hi = row_off[r + 1];
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
        float acc = accumulate ? out[(size_t)r * h + c] : 0.0f;
        for (int e = lo; e < hi; e++) acc += (w ? w[e] : 1.0f) * src.at((size_t)idx[e] * h + c);
        out[(size_t)r * h + c] = acc;
    }
}

template <typename Src>
static cudaError_t rows_csr(float *out, Src src, const int *idx, const float *w, const int *row_off,
                            int nrows, int h, bool accumulate, cudaStream_t s)
{
    if (nrows && h) {
        unsigned threads = h < TPB ? 32 * ((h + 31) / 32) : TPB;
        k_rows_csr<Src><<<nrows, threads, 0, s>>>(out, src, idx, w, row_off, h, accumulate);
    }
    return cudaGetLastError();
}

cudaError_t gk_rows_csr(float *out, const float *src, const int *idx, const float *w,
                        const int *row_off, int nrows, int h, bool accumulate, cudaStream_t s)
{
    return rows_csr(out, rows_f32{src}, idx, w, row_off, nrows, h, accumulate, s);
}

cudaError_t gk_rows_csr_bf16x2(float *out, const bf16 *a, const bf16 *b, const int *idx,
                               const float *w, const int *row_off, int nrows, int h,
                               bool accumulate, cudaStream_t s)
{
    return rows_csr(out, rows_bf16x2{a, b}, idx, w, row_off, nrows, h, accumulate, s);
}

__global__ void k_rows_gather32(const float *src, const int *idx, int n, int h, float *dst)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * h) return;
    dst[i] = src[(size_t)idx[i / h] * h + i % h];
}

cudaError_t gk_rows_gather32(const float *src, const int *idx, int n, int h, float *dst,
                             cudaStream_t s)
{
    size_t m = (size_t)n * h;
    if (m) k_rows_gather32<<<blocks_for(m, TPB), TPB, 0, s>>>(src, idx, n, h, dst);
    return cudaGetLastError();
}

/* Per local pair p of a received row: d expert_out = w dy (bf16) and dw = dy . expert_out. */
__global__ void k_pairs_backward(const float *dy, const int *pair_row, const float *pair_w,
                                 const float *yp, int h, bf16 *dyp, float *dwp)
{
    __shared__ float red[TPB / 32];
    size_t p = blockIdx.x;
    const float *d = dy + (size_t)pair_row[p] * h, *y = yp + p * h;
    float w = pair_w[p], dot = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
        dot += d[c] * y[c];
        dyp[p * h + c] = __float2bfloat16(w * d[c]);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dwp[p] = dot;
}

cudaError_t gk_pairs_backward(const float *dy, const int *pair_row, const float *pair_w,
                              const float *yp, int npairs, int h, bf16 *dyp, float *dwp,
                              cudaStream_t s)
{
    if (npairs) k_pairs_backward<<<npairs, TPB, 0, s>>>(dy, pair_row, pair_w, yp, h, dyp, dwp);
    return cudaGetLastError();
}

__global__ void k_scatter(const float *src, const int *dst_idx, int n, float *dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[dst_idx[i]] = src[i];
}

cudaError_t gk_scatter(const float *src, const int *dst_idx, int n, float *dst, cudaStream_t s)
{
    if (n) k_scatter<<<blocks_for((size_t)n, TPB), TPB, 0, s>>>(src, dst_idx, n, dst);
    return cudaGetLastError();
}
