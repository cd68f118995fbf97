/*
 * gpu_kernels.cu: the CUDA kernels of the training step's dense parts, one launcher each
 * (declared in gpu_kernels.h, internal to executor/): initialisation and conversions, tokens and
 * the embedding, RMSNorm, RoPE and MLA's head assembly, SwiGLU, the loss and the optimizer. The
 * MoE path's kernels are in gpu_kernels_moe.cu, attention's in gpu_attention.cu.
 *
 * Every kernel is deterministic: reductions run in a fixed order inside one block, or in fixed
 * chunks summed in chunk order; no floating-point atomics are used anywhere, so a seed gives the
 * same loss bit for bit on a rerun. Integer atomics (histograms, co-activation counts) are exact.
 * Layouts are row-major; "ld" is a row's stride in elements. Each kernel is the plain form of
 * its reference operation in ref_ops.c / ref_moe.c / ref_model.c; the speed work replaces them
 * one by one, measured.
 */
#include "gpu_kernels.h"

#include <math.h>

/* Whether rows of width h at p with stride ld take V = 4 accesses (p NULL: no constraint). */
static bool rows_by4(const void *p, int ld, size_t align)
{
    return !p || (aligned(p, align) && ld % 4 == 0);
}

/* ---- initialization and conversions ------------------------------------------------------- */

__device__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* N(0, std) from a counter-based hash of (seed, index): Box-Muller on two 53-bit uniforms. */
__global__ void k_init(float *p, size_t n, size_t base, uint64_t seed, float std, int ones)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (ones) {
        p[i] = 1.0f;
        return;
    }
    uint64_t a = mix64(seed ^ mix64(2 * (base + i))), b = mix64(seed ^ mix64(2 * (base + i) + 1));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0, u2 = (b >> 11) / 9007199254740992.0;
    p[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

cudaError_t gk_init(float *p, size_t n, size_t base, uint64_t seed, float std, bool ones,
                    cudaStream_t s)
{
    if (n) k_init<<<blocks_for(n, TPB), TPB, 0, s>>>(p, n, base, seed, std, ones);
    return cudaGetLastError();
}

__global__ void k_to_bf16(const float *x, bf16 *y, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}

/* Four a thread by 16-byte loads; n4 = n / 4. */
__global__ void k_to_bf16x4(const float4 *x, __nv_bfloat162 *y, size_t n4)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = x[i];
    y[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    y[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
}

/* splitmix64's finalizer: every input bit moves about half the output's */
static __device__ __forceinline__ unsigned long long mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void k_fingerprint(const void *y, int rows, int cols, int ld, int bytes,
                              unsigned long long *out)
{
    unsigned long long sum = 0;
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t at = i / cols * ld + i % cols;
        unsigned long long b =
            bytes == 4 ? ((const unsigned *)y)[at] : ((const unsigned short *)y)[at];
        sum += mix64(i << 32 ^ b);
    }
    atomicAdd(out, sum);
}

cudaError_t gk_fingerprint(const void *y, int rows, int cols, int ld, int bytes,
                           unsigned long long *out, cudaStream_t s)
{
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof *out, s);
    size_t n = (size_t)rows * cols, b = blocks_for(n, TPB);
    if (e == cudaSuccess && n)
        k_fingerprint<<<(unsigned)(b < 1024 ? b : 1024), TPB, 0, s>>>(y, rows, cols, ld, bytes,
                                                                      out);
    return e == cudaSuccess ? cudaGetLastError() : e;
}

__global__ void k_busy_wait(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

cudaError_t gk_busy_wait(double us, cudaStream_t s)
{
    k_busy_wait<<<1, 1, 0, s>>>((unsigned long long)(us * 1e3));
    return cudaGetLastError();
}

cudaError_t gk_to_bf16(const float *x, bf16 *y, size_t n, cudaStream_t s)
{
    size_t n4 = aligned(x, 16) && aligned(y, 8) ? n / 4 : 0;
    if (n4)
        k_to_bf16x4<<<blocks_for(n4, TPB), TPB, 0, s>>>((const float4 *)x, (__nv_bfloat162 *)y, n4);
    size_t r = n - 4 * n4;
    if (r) k_to_bf16<<<blocks_for(r, TPB), TPB, 0, s>>>(x + 4 * n4, y + 4 * n4, r);
    return cudaGetLastError();
}

__global__ void k_to_f32(const bf16 *x, float *y, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat162float(x[i]);
}

cudaError_t gk_to_f32(const bf16 *x, float *y, size_t n, cudaStream_t s)
{
    if (n) k_to_f32<<<blocks_for(n, TPB), TPB, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

/* y (T rows of n, stride ld) = b on every row, or += b (add), in fp32 or bf16. */
template <typename Ty>
__global__ void k_bias_rows(Ty *y, int ld, const float *b, int T, int n, int add)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x; /* a column a thread, rows strided by y */
    if (c >= n) return;
    float v = b[c];
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        Ty *p = y + (size_t)t * ld + c;
        *p = (Ty)(add ? v + (float)*p : v);
    }
}

cudaError_t gk_bias_rows(float *y32, bf16 *y16, int ld, const float *b, int T, int n, bool add,
                         cudaStream_t s)
{
    if (!T || !n) return cudaGetLastError();
    dim3 grid((unsigned)blocks_for((size_t)n, TPB), (unsigned)(T < 2048 ? T : 2048));
    if (y32) k_bias_rows<float><<<grid, TPB, 0, s>>>(y32, ld, b, T, n, add);
    if (y16) k_bias_rows<bf16><<<grid, TPB, 0, s>>>(y16, ld, b, T, n, add);
    return cudaGetLastError();
}

/* Attention sinks (gpt-oss): one more term of each softmax's sum, exp(sink[h]), with no value.
 * After the attention without them: lse (B, H, S; base 2) takes the term in and each row of o
 * (B*S, H, dv) shrinks by 2^(lse - lse'). One thread per row. */
__global__ void k_attn_sinks(bf16 *o, float *lse, const float *sink, int B, int S, int H, int dv)
{
    /* a warp a row of o, (b * S + s, h); its lse at (b, h, s) */
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (i >= (size_t)B * S * H) return;
    int h = (int)(i % H);
    size_t t = i / H;
    size_t li = ((t / S) * H + h) * S + t % S;
    float l = lse[li], k = sink[h] * 1.4426950408889634f, m = fmaxf(l, k);
    float ln = m + log2f(exp2f(l - m) + exp2f(k - m)), f = exp2f(l - ln);
    bf16 *row = o + i * dv;
    for (int d = lane; d < dv; d += 32) row[d] = __float2bfloat16(__bfloat162float(row[d]) * f);
    __syncwarp();
    if (lane == 0) lse[li] = ln;
}

cudaError_t gk_attn_sinks(bf16 *o, float *lse, const float *sink, int B, int S, int H, int dv,
                          cudaStream_t s)
{
    size_t n = (size_t)B * H * S * 32;
    if (n) k_attn_sinks<<<blocks_for(n, TPB), TPB, 0, s>>>(o, lse, sink, B, S, H, dv);
    return cudaGetLastError();
}

/* The sinks' gradient, row by row: r (B*S, H) = -p_sink * sum_d do * o, p_sink = 2^(sink log2 e
 * - lse) the sink's probability (the column sums of r over the rows are d loss / d sink). A warp
 * a row; the lanes' partial sums are added in a fixed order. */
__global__ void k_attn_sink_rows(const bf16 *o, const bf16 *dout, const float *lse,
                                 const float *sink, int B, int S, int H, int dv, float *r)
{
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; /* (b * S + s, h) as r */
    int lane = threadIdx.x % 32;
    if (i >= (size_t)B * S * H) return;
    int h = (int)(i % H);
    size_t t = i / H;
    const bf16 *orow = o + i * dv, *drow = dout + i * dv;
    float dot = 0.0f;
    for (int d = lane; d < dv; d += 32)
        dot += __bfloat162float(orow[d]) * __bfloat162float(drow[d]);
    for (int w = 16; w > 0; w /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, w);
    if (lane) return;
    float p = exp2f(sink[h] * 1.4426950408889634f - lse[((t / S) * H + h) * S + t % S]);
    r[i] = -p * dot;
}

cudaError_t gk_attn_sink_rows(const bf16 *o, const bf16 *dout, const float *lse, const float *sink,
                              int B, int S, int H, int dv, float *r, cudaStream_t s)
{
    size_t n = (size_t)B * S * H * 32;
    if (n) k_attn_sink_rows<<<blocks_for(n, TPB), TPB, 0, s>>>(o, dout, lse, sink, B, S, H, dv, r);
    return cudaGetLastError();
}

/* ---- tokens, embedding --------------------------------------------------------------------- */

/* tokens (B, S + 1) -> inputs (B * S) and targets (B * S). */
__global__ void k_split(const int *tok, int B, int S, int *in, int *tgt)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * S) return;
    int b = i / S, t = i % S;
    in[i] = tok[b * (S + 1) + t];
    tgt[i] = tok[b * (S + 1) + t + 1];
}

cudaError_t gk_split(const int *tok, int B, int S, int *in, int *tgt, cudaStream_t s)
{
    k_split<<<blocks_for((size_t)B * S, TPB), TPB, 0, s>>>(tok, B, S, in, tgt);
    return cudaGetLastError();
}

/* One block a token row: x[t] = emb[tok[t]]. */
__global__ void k_embed(const float *emb, const int *tok, int h, float *x)
{
    const float *src = emb + (size_t)tok[blockIdx.x] * h;
    float *dst = x + (size_t)blockIdx.x * h;
    for (int c = threadIdx.x; c < h; c += blockDim.x) dst[c] = src[c];
}

cudaError_t gk_embed(const float *emb, const int *tok, int T, int h, float *x, cudaStream_t s)
{
    if (T) k_embed<<<T, TPB, 0, s>>>(emb, tok, h, x);
    return cudaGetLastError();
}

size_t gk_embed_plan_ints(int T)
{
    return (size_t)7 * T + 2;
}

void gk_embed_plan(const int *tok, int B, int S, int ld, int *count, int *plan,
                   struct gk_embed_work *w)
{
    int T = B * S, nids = 0, nu = 0, nm = 0, rows = 0;
    int *pos = plan, *uoff = plan + T, *udst = plan + 3 * T + 1, *mid = plan + 5 * T + 1,
        *mfirst = plan + 6 * T + 1;
    /* a counting sort: udst holds the distinct ids in first-sight order, uoff their offsets
     * into pos (both rewritten below, from their ends, as units) */
    int *ids = udst + T, *off = uoff + T;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) count[tok[b * ld + t]]++;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            int v = tok[b * ld + t];
            if (count[v] > 0) { /* first sight of v: its slot; counts become fill positions */
                ids[nids] = v;
                off[nids + 1] = count[v];
                count[v] = -(nids + 1);
                nids++;
            }
        }
    off[0] = 0;
    for (int u = 0; u < nids; u++) off[u + 1] += off[u];
    for (int u = 0; u < nids; u++) mid[u] = off[u]; /* the fill cursors, for now */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            int u = -count[tok[b * ld + t]] - 1;
            pos[mid[u]++] = b * S + t;
        }
    for (int u = 0; u < nids; u++) count[ids[u]] = 0;
    /* units of at most GK_EMBED_SEG positions: an id with one unit writes its row, the units of
     * a longer one write scratch rows that a second pass sums in order. Units never outnumber
     * nids + T / GK_EMBED_SEG <= 2 T, so the writes below stay behind the reads of ids and off
     * (at T + u and T + u + 1 past where units start). */
    for (int u = 0; u < nids; u++) {
        int a = off[u], n = off[u + 1] - a, id = ids[u];
        if (n <= GK_EMBED_SEG) {
            uoff[nu] = a;
            udst[nu++] = -(id + 1);
            continue;
        }
        mid[nm] = id;
        mfirst[nm++] = rows;
        for (int k = 0; k < n; k += GK_EMBED_SEG) {
            uoff[nu] = a + k;
            udst[nu++] = rows++;
        }
    }
    uoff[nu] = T;
    mfirst[nm] = rows;
    w->units = nu;
    w->multi = nm;
    w->rows = rows;
}

/* Block (u, column tile): the sum of unit u's dx rows, in order, into its embedding row or its
 * scratch row. */
__global__ void k_embed_units(const float *dx, const int *plan, int T, int h, float *scratch,
                              float *demb)
{
    const int *pos = plan, *uoff = plan + T, *udst = plan + 3 * T + 1;
    int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= h) return;
    float acc = 0.0f;
    for (int i = uoff[u]; i < uoff[u + 1]; i++) acc += dx[(size_t)pos[i] * h + c];
    int d = udst[u];
    if (d < 0)
        demb[(size_t)(-d - 1) * h + c] += acc;
    else
        scratch[(size_t)d * h + c] = acc;
}

/* Block (m, column tile): the scratch rows of the m-th long id, in order, into its row. */
__global__ void k_embed_multi(const int *plan, int T, int h, const float *scratch, float *demb)
{
    const int *mid = plan + 5 * T + 1, *mfirst = plan + 6 * T + 1;
    int m = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= h) return;
    float acc = 0.0f;
    for (int r = mfirst[m]; r < mfirst[m + 1]; r++) acc += scratch[(size_t)r * h + c];
    demb[(size_t)mid[m] * h + c] += acc;
}

cudaError_t gk_embed_backward(const float *dx, const int *plan, int T,
                              const struct gk_embed_work *w, int h, float *scratch, float *demb,
                              cudaStream_t s)
{
    unsigned cols = blocks_for((size_t)h, TPB);
    if (w->units) k_embed_units<<<dim3(w->units, cols), TPB, 0, s>>>(dx, plan, T, h, scratch, demb);
    if (w->multi) k_embed_multi<<<dim3(w->multi, cols), TPB, 0, s>>>(plan, T, h, scratch, demb);
    return cudaGetLastError();
}

/* ---- RMSNorm ----------------------------------------------------------------------------- */

/* y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), in bf16 (y16) and fp32 (y32, optional);
 * xc (optional) a copy of x. One block per row, V elements a thread at a time. */
template <int V>
__global__ void k_rmsnorm(const float *x, int ldx, const float *w, int h, float eps, bf16 *y16,
                          int ld16, float *y32, int ld32, float *xc, int ldc, float *rstd)
{
    __shared__ float red[TPB / 32];
    size_t t = blockIdx.x;
    const float *xr = x + t * ldx;
    int nv = h / V;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float a[V];
        ld_f32<V>(xr + c * V, a);
        for (int j = 0; j < V; j++) ss += a[j] * a[j];
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / h + eps);
    if (threadIdx.x == 0) rstd[t] = r;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float a[V], wv[V], v[V];
        ld_f32<V>(xr + c * V, a);
        ld_f32<V>(w + c * V, wv);
        for (int j = 0; j < V; j++) v[j] = a[j] * r * wv[j];
        st_bf16<V>(y16 + t * ld16 + c * V, v);
        if (y32) st_f32<V>(y32 + t * ld32 + c * V, v);
        if (xc) st_f32<V>(xc + t * ldc + c * V, a);
    }
}

cudaError_t gk_rmsnorm(const float *x, int ldx, const float *w, int T, int h, float eps, bf16 *y16,
                       int ld16, float *y32, int ld32, float *xc, int ldc, float *rstd,
                       cudaStream_t s)
{
    if (!T) return cudaGetLastError();
    if (h % 4 == 0 && rows_by4(x, ldx, 16) && rows_by4(w, 0, 16) && rows_by4(y16, ld16, 8) &&
        rows_by4(y32, ld32, 16) && rows_by4(xc, ldc, 16))
        k_rmsnorm<4><<<T, TPB, 0, s>>>(x, ldx, w, h, eps, y16, ld16, y32, ld32, xc, ldc, rstd);
    else
        k_rmsnorm<1><<<T, TPB, 0, s>>>(x, ldx, w, h, eps, y16, ld16, y32, ld32, xc, ldc, rstd);
    return cudaGetLastError();
}

/* dx = base + rstd * (w * dy) - x * rstd^3 / h * sum(w * dy * x); base may be NULL or dx; dx16
 * (optional, stride lddx) its bf16 copy. One block per row, V elements a thread at a time. */
template <int V>
__global__ void k_rmsnorm_backward(const float *x, int ldx, const float *w, const float *rstd,
                                   const float *dy, int lddy, const float *base, int ldb, float *dx,
                                   bf16 *dx16, int lddx, int h)
{
    __shared__ float red[TPB / 32];
    size_t t = blockIdx.x;
    const float *xr = x + t * ldx, *gr = dy + t * lddy;
    int nv = h / V;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float a[V], wv[V], gv[V];
        ld_f32<V>(xr + c * V, a);
        ld_f32<V>(w + c * V, wv);
        ld_f32<V>(gr + c * V, gv);
        for (int j = 0; j < V; j++) dot += wv[j] * gv[j] * a[j];
    }
    dot = block_sum(dot, red);
    float r = rstd[t], k = dot * r * r * r / h;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float a[V], wv[V], gv[V], v[V];
        ld_f32<V>(xr + c * V, a);
        ld_f32<V>(w + c * V, wv);
        ld_f32<V>(gr + c * V, gv);
        for (int j = 0; j < V; j++) v[j] = r * wv[j] * gv[j] - a[j] * k;
        if (base) {
            float b[V];
            ld_f32<V>(base + t * ldb + c * V, b);
            for (int j = 0; j < V; j++) v[j] += b[j];
        }
        st_f32<V>(dx + t * lddx + c * V, v);
        if (dx16) st_bf16<V>(dx16 + t * lddx + c * V, v);
    }
}

cudaError_t gk_rmsnorm_backward(const float *x, int ldx, const float *w, const float *rstd,
                                const float *dy, int lddy, const float *base, int ldb, float *dx,
                                bf16 *dx16, int lddx, int T, int h, cudaStream_t s)
{
    if (!T) return cudaGetLastError();
    if (h % 4 == 0 && rows_by4(x, ldx, 16) && rows_by4(w, 0, 16) && rows_by4(dy, lddy, 16) &&
        rows_by4(base, ldb, 16) && rows_by4(dx, lddx, 16) && rows_by4(dx16, lddx, 8))
        k_rmsnorm_backward<4>
            <<<T, TPB, 0, s>>>(x, ldx, w, rstd, dy, lddy, base, ldb, dx, dx16, lddx, h);
    else
        k_rmsnorm_backward<1>
            <<<T, TPB, 0, s>>>(x, ldx, w, rstd, dy, lddy, base, ldb, dx, dx16, lddx, h);
    return cudaGetLastError();
}

/* Column sums out[c] += sum_t a[t,c] * b[t,c] * r[t] (b, r may be NULL), in two fixed stages:
 * chunks of GK_COLSUM_ROWS rows into part (chunks, n), then the chunks in order. */
__global__ void k_colsum_part(const float *a, int lda, const float *b, int ldb, const float *r,
                              int T, int n, float *part)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= n) return;
    int t0 = ch * GK_COLSUM_ROWS, t1 = min(T, t0 + GK_COLSUM_ROWS);
    float acc = 0.0f;
    for (int t = t0; t < t1; t++) {
        float v = a[(size_t)t * lda + c];
        if (b) v *= b[(size_t)t * ldb + c];
        if (r) v *= r[t];
        acc += v;
    }
    part[(size_t)ch * n + c] = acc;
}

__global__ void k_colsum_final(const float *part, int chunks, int n, float *out, int accumulate)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float acc = 0.0f;
    for (int i = 0; i < chunks; i++) acc += part[(size_t)i * n + c];
    out[c] = accumulate ? out[c] + acc : acc;
}

cudaError_t gk_colsum(const float *a, int lda, const float *b, int ldb, const float *r, int T,
                      int n, float *part, float *out, bool accumulate, cudaStream_t s)
{
    int chunks = (T + GK_COLSUM_ROWS - 1) / GK_COLSUM_ROWS;
    if (chunks == 0) return cudaGetLastError();
    k_colsum_part<<<dim3(blocks_for(n, TPB), chunks), TPB, 0, s>>>(a, lda, b, ldb, r, T, n, part);
    k_colsum_final<<<blocks_for(n, TPB), TPB, 0, s>>>(part, chunks, n, out, accumulate);
    return cudaGetLastError();
}

/* ---- RoPE, MLA assembly --------------------------------------------------------------------- */

/* The table is computed on the host in double precision (cos and sin of position x inv_freq,
 * times scale) and copied once, in stream s, the stream that reads it (a plain cudaMemcpy from
 * pageable memory may return before its copy lands, and a non-blocking stream does not wait for
 * it; the pageable source is staged before the call returns, so it is freed at once): the
 * executor builds it when it starts. */
cudaError_t gk_rope_table(float2 *tab, int seq, int rot, const double *inv_freq, double scale,
                          cudaStream_t s)
{
    int half = rot / 2;
    size_t n = (size_t)seq * half;
    if (!n) return cudaSuccess;
    float2 *h = (float2 *)malloc(sizeof(float2) * n);
    if (!h) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n; i++) {
        double angle = (double)(i / half) * inv_freq[i % half];
        h[i] = make_float2((float)(scale * cos(angle)), (float)(scale * sin(angle)));
    }
    cudaError_t e = cudaMemcpyAsync(tab, h, sizeof(float2) * n, cudaMemcpyHostToDevice, s);
    free(h);
    return e;
}

/* The rotation of the pair (a, b) = (x[p], x[p + half]) at table entry cs; inverse: the transpose. */
__device__ __forceinline__ float2 rotate(float a, float b, float2 cs, bool inverse)
{
    float sn = inverse ? -cs.y : cs.y;
    return make_float2(a * cs.x - b * sn, a * sn + b * cs.x);
}

/* RoPE into bf16: y (T, heads, dim) = RoPE(x) rounded once, x fp32 (x32) or bf16 (x16, which y
 * may be: each thread reads and writes its own pair). One thread per rotated pair or copied
 * element (dim - rot/2 a head); the values are those of gk_rope then gk_to_bf16. */
template <typename Tin>
__global__ void k_rope_bf16(const Tin *x, bf16 *y, int T, int heads, int dim, int rot,
                            const float2 *tab, int seq, int inverse)
{
    int half = rot / 2, per = dim - half;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * heads * per) return;
    int p = i % per;
    size_t th = i / per;
    int t = (int)(th / heads);
    const Tin *v = x + th * dim;
    bf16 *o = y + th * dim;
    if (p < half) {
        float2 r =
            rotate((float)v[p], (float)v[p + half], tab[(size_t)(t % seq) * half + p], inverse);
        o[p] = __float2bfloat16(r.x);
        o[p + half] = __float2bfloat16(r.y);
    } else {
        o[p + half] = __float2bfloat16((float)v[p + half]);
    }
}

template <typename X>
__global__ void k_query_temperature(X *x, int n, int seq, float floor_scale, float scale)
{
    int t = blockIdx.x;
    float f = 1.0f + scale * logf(floorf((float)(t % seq + 1) / floor_scale) + 1.0f);
    X *row = x + (size_t)t * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = (X)((float)row[i] * f);
}

cudaError_t gk_query_temperature(float *x32, bf16 *x16, int T, int n, int seq, float floor_scale,
                                 float scale, cudaStream_t s)
{
    if (!T) return cudaGetLastError();
    if (x32)
        k_query_temperature<float><<<T, TPB, 0, s>>>(x32, n, seq, floor_scale, scale);
    else
        k_query_temperature<bf16><<<T, TPB, 0, s>>>(x16, n, seq, floor_scale, scale);
    return cudaGetLastError();
}

cudaError_t gk_rope_bf16(const float *x32, const bf16 *x16, bf16 *y, int T, int heads, int dim,
                         int rot, const float2 *tab, int seq, bool inverse, cudaStream_t s)
{
    size_t n = (size_t)T * heads * (dim - rot / 2);
    if (!n) return cudaGetLastError();
    if (x32)
        k_rope_bf16<float>
            <<<blocks_for(n, TPB), TPB, 0, s>>>(x32, y, T, heads, dim, rot, tab, seq, inverse);
    else
        k_rope_bf16<bf16>
            <<<blocks_for(n, TPB), TPB, 0, s>>>(x16, y, T, heads, dim, rot, tab, seq, inverse);
    return cudaGetLastError();
}

/* MLA: q (T, H, rope + nope) = [RoPE(qf rope part) | qf nope part] where qf holds [nope | rope]
 * per head; k = [RoPE(shared key from ckvf[kvl..]) | kv nope part]; v = kv v part. One block per
 * token, consecutive threads on consecutive elements. */
__global__ void k_mla_assemble(const float *qf, const float *ckvf, const float *kv, int H, int nope,
                               int rope, int dv, int kvl, const float2 *tab, int seq, bf16 *q,
                               bf16 *k, bf16 *v)
{
    int dqk = nope + rope, half = rope / 2, t = blockIdx.x;
    const float2 *cs = tab + (size_t)(t % seq) * half;
    const float *qt = qf + (size_t)t * H * dqk, *kvt = kv + (size_t)t * H * (nope + dv);
    const float *kr = ckvf + (size_t)t * (kvl + rope) + kvl;
    bf16 *qd = q + (size_t)t * H * dqk, *kd = k + (size_t)t * H * dqk, *vd = v + (size_t)t * H * dv;
    for (int e = threadIdx.x; e < H * dqk; e += blockDim.x) {
        int hh = e / dqk, c = e % dqk;
        const float *src = qt + (size_t)hh * dqk;
        float xq, xk;
        if (c < rope) {
            int p = c % half;
            float2 rq = rotate(src[nope + p], src[nope + p + half], cs[p], false);
            float2 rk = rotate(kr[p], kr[p + half], cs[p], false);
            xq = c < half ? rq.x : rq.y;
            xk = c < half ? rk.x : rk.y;
        } else {
            xq = src[c - rope];
            xk = kvt[(size_t)hh * (nope + dv) + c - rope];
        }
        qd[e] = __float2bfloat16(xq);
        kd[e] = __float2bfloat16(xk);
    }
    for (int e = threadIdx.x; e < H * dv; e += blockDim.x)
        vd[e] = __float2bfloat16(kvt[(size_t)(e / dv) * (nope + dv) + nope + e % dv]);
}

cudaError_t gk_mla_assemble(const float *qf, const float *ckvf, const float *kv, int T, int H,
                            int nope, int rope, int dv, int kvl, const float2 *tab, int seq,
                            bf16 *q, bf16 *k, bf16 *v, cudaStream_t s)
{
    if (T && H)
        k_mla_assemble<<<T, TPB, 0, s>>>(qf, ckvf, kv, H, nope, rope, dv, kvl, tab, seq, q, k, v);
    return cudaGetLastError();
}

/* The MLA backward of the assembly from the attention's gradients dq, dk, dv (fp32 or bf16, Tin):
 * dqf [nope | inverse RoPE of the rope part] and dkv [dk nope | dv], rounded once to bf16 (what
 * their GEMMs read), and the shared key's gradient (summed over heads in head order, fp32) into
 * dckvf[kvl..]. One block per token. */
template <typename Tin>
__global__ void k_mla_disassemble(const Tin *dq, const Tin *dk, const Tin *dv_, int H, int nope,
                                  int rope, int dv, int kvl, const float2 *tab, int seq, bf16 *dqf,
                                  bf16 *dkv, float *dckvf)
{
    __shared__ float sum[GK_MAX_ROPE];
    int dqk = nope + rope, half = rope / 2, t = blockIdx.x;
    const float2 *cs = tab + (size_t)(t % seq) * half;
    const Tin *gq = dq + (size_t)t * H * dqk, *gk = dk + (size_t)t * H * dqk;
    const Tin *gv = dv_ + (size_t)t * H * dv;
    bf16 *oq = dqf + (size_t)t * H * dqk, *okv = dkv + (size_t)t * H * (nope + dv);
    for (int e = threadIdx.x; e < H * dqk; e += blockDim.x) {
        int hh = e / dqk, c = e % dqk;
        const Tin *g = gq + (size_t)hh * dqk;
        float x;
        if (c < nope) {
            x = (float)g[rope + c];
        } else {
            int p = (c - nope) % half;
            float2 r = rotate((float)g[p], (float)g[p + half], cs[p], true);
            x = c - nope < half ? r.x : r.y;
        }
        oq[e] = __float2bfloat16(x);
    }
    for (int e = threadIdx.x; e < H * (nope + dv); e += blockDim.x) {
        int hh = e / (nope + dv), c = e % (nope + dv);
        okv[e] = __float2bfloat16(c < nope ? (float)gk[(size_t)hh * dqk + rope + c]
                                           : (float)gv[(size_t)hh * dv + c - nope]);
    }
    for (int c = threadIdx.x; c < rope; c += blockDim.x) {
        float a = 0.0f;
        for (int hh = 0; hh < H; hh++) a += (float)gk[(size_t)hh * dqk + c];
        sum[c] = a;
    }
    __syncthreads();
    float *kr = dckvf + (size_t)t * (kvl + rope) + kvl;
    for (int p = threadIdx.x; p < half; p += blockDim.x) {
        float2 r = rotate(sum[p], sum[p + half], cs[p], true);
        kr[p] = r.x;
        kr[p + half] = r.y;
    }
}

cudaError_t gk_mla_disassemble(const float *dq32, const float *dk32, const float *dv32,
                               const bf16 *dq16, const bf16 *dk16, const bf16 *dv16, int T, int H,
                               int nope, int rope, int dvd, int kvl, const float2 *tab, int seq,
                               bf16 *dqf, bf16 *dkv, float *dckvf, cudaStream_t s)
{
    if (!T || !H) return cudaGetLastError();
    if (dq32)
        k_mla_disassemble<float><<<T, TPB, 0, s>>>(dq32, dk32, dv32, H, nope, rope, dvd, kvl, tab,
                                                   seq, dqf, dkv, dckvf);
    else
        k_mla_disassemble<bf16><<<T, TPB, 0, s>>>(dq16, dk16, dv16, H, nope, rope, dvd, kvl, tab,
                                                  seq, dqf, dkv, dckvf);
    return cudaGetLastError();
}

/* ---- SwiGLU -------------------------------------------------------------------------------- */

/* V elements a thread, nv threads' worth; computed in fp32 from the bf16 GEMM outputs. With am
 * (amax[0] not NULL), each expert's amax of the bf16 values written (base: the element this
 * launch starts at). */
template <int V>
__global__ void k_swiglu(const bf16 *g, const bf16 *u, bf16 *hm, size_t nv, float alpha,
                         float limit, struct gk_amax_rows am, size_t base)
{
    __shared__ unsigned red[TPB / 32];
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned m = 0;
    if (i < nv) {
        float x[V], y[V];
        ld_bf16<V>(g + i * V, x);
        ld_bf16<V>(u + i * V, y);
        for (int k = 0; k < V; k++) {
            x[k] = act_fwd(x[k], y[k], alpha, limit);
            if (am.amax[0]) m = max(m, gk_abs_bits(__bfloat162float(__float2bfloat16(x[k]))));
        }
        st_bf16<V>(hm + i * V, x);
    }
    if (am.amax[0]) gk_rows_amax_v<V>(am, 0, m, i, nv, base, red);
}

template <int V>
__global__ void k_swiglu_backward(const bf16 *g, const bf16 *u, const bf16 *dhm, bf16 *dg, bf16 *du,
                                  size_t nv, float alpha, float limit, struct gk_amax_rows am,
                                  size_t base)
{
    __shared__ unsigned red[TPB / 32];
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned mg = 0, mu = 0;
    if (i < nv) {
        float x[V], y[V], d[V];
        ld_bf16<V>(g + i * V, x);
        ld_bf16<V>(u + i * V, y);
        ld_bf16<V>(dhm + i * V, d);
        for (int k = 0; k < V; k++) {
            act_bwd(x[k], y[k], d[k], alpha, limit, &x[k], &d[k]);
            if (!am.amax[0]) continue;
            mg = max(mg, gk_abs_bits(__bfloat162float(__float2bfloat16(x[k]))));
            mu = max(mu, gk_abs_bits(__bfloat162float(__float2bfloat16(d[k]))));
        }
        if (dg) { /* NULL: the amax alone (gk_fp8_swiglu_backward's per-tensor scales) */
            st_bf16<V>(du + i * V, d);
            st_bf16<V>(dg + i * V, x);
        }
    }
    if (am.amax[0]) {
        gk_rows_amax_v<V>(am, 0, mg, i, nv, base, red);
        gk_rows_amax_v<V>(am, 1, mu, i, nv, base, red);
    }
}

/* The experts' amax (struct gk_amax_rows) kept by a kernel whose block takes R x blockDim
 * contiguous chunks of V values (chunks c0 .. c1 of nv; a chunk's values in one row, cols % V ==
 * 0), R a thread: a block reduces once where k_swiglu and k_swiglu_backward reduce every blockDim
 * chunks (ncu: SwiGLU's backward's amax pass read the H100's HBM at half the rate of the pass
 * that writes dg and du). A block whose rows are all one expert's (`one`, the same for its every
 * thread) keeps a thread's chunks in acc and makes one atomic an amax at its end; else each chunk
 * its own. A maximum is exact in any order: the same amax either way. */
struct chunk_rows {
    int e;    /* the expert of the block's first row */
    bool one; /* every row of the block that expert's */
};
template <int V>
static __device__ __forceinline__ chunk_rows chunk_rows_of(const struct gk_amax_rows &am, size_t c0,
                                                           size_t c1)
{
    size_t cols = (size_t)am.cols;
    int e = gk_expert_of(am.off, am.E, (int)(c0 * V / cols));
    return chunk_rows{e, e == gk_expert_of(am.off, am.E, (int)((c1 * V - 1) / cols))};
}
template <int V>
static __device__ __forceinline__ void chunk_amax(const struct gk_amax_rows &am, chunk_rows b,
                                                  int which, size_t i, unsigned m, unsigned *acc)
{
    if (b.one)
        *acc = max(*acc, m);
    else if (m)
        atomicMax(am.amax[which] + gk_expert_of(am.off, am.E, (int)(i * V / (size_t)am.cols)), m);
}
static __device__ __forceinline__ void chunk_amax_end(const struct gk_amax_rows &am, chunk_rows b,
                                                      int which, unsigned acc, unsigned *red)
{
    if (!b.one) return;
    acc = gk_block_max(acc, red);
    if (threadIdx.x == 0 && acc) atomicMax(am.amax[which] + b.e, acc);
}

/* k_swiglu with the experts' amax of hm kept, R chunks of V a thread (chunk_rows_of) */
template <int V, int R>
__global__ void k_swiglu_amax(const bf16 *g, const bf16 *u, bf16 *hm, size_t nv, float alpha,
                              float limit, struct gk_amax_rows am)
{
    __shared__ unsigned red[TPB / 32];
    size_t c0 = (size_t)blockIdx.x * R * blockDim.x, c1 = c0 + (size_t)R * blockDim.x;
    if (c1 > nv) c1 = nv;
    chunk_rows b = chunk_rows_of<V>(am, c0, c1);
    unsigned acc = 0;
    for (int r = 0; r < R; r++) {
        size_t i = c0 + (size_t)r * blockDim.x + threadIdx.x;
        if (i >= nv) break;
        float x[V], y[V];
        ld_bf16<V>(g + i * V, x);
        ld_bf16<V>(u + i * V, y);
        unsigned m = 0;
        for (int k = 0; k < V; k++) {
            x[k] = act_fwd(x[k], y[k], alpha, limit);
            m = max(m, gk_abs_bits(__bfloat162float(__float2bfloat16(x[k]))));
        }
        st_bf16<V>(hm + i * V, x);
        chunk_amax<V>(am, b, 0, i, m, &acc);
    }
    chunk_amax_end(am, b, 0, acc, red);
}

/* SwiGLU's backward's amax alone (dg and du not written: gk_fp8_swiglu_backward's per-tensor
 * scales), R chunks of V a thread (chunk_rows_of) */
template <int V, int R>
__global__ void k_swiglu_backward_amax(const bf16 *g, const bf16 *u, const bf16 *dhm, size_t nv,
                                       float alpha, float limit, struct gk_amax_rows am)
{
    __shared__ unsigned red[TPB / 32];
    size_t c0 = (size_t)blockIdx.x * R * blockDim.x, c1 = c0 + (size_t)R * blockDim.x;
    if (c1 > nv) c1 = nv;
    chunk_rows b = chunk_rows_of<V>(am, c0, c1);
    unsigned ag = 0, au = 0;
    for (int r = 0; r < R; r++) {
        size_t i = c0 + (size_t)r * blockDim.x + threadIdx.x;
        if (i >= nv) break;
        float x[V], y[V], d[V];
        ld_bf16<V>(g + i * V, x);
        ld_bf16<V>(u + i * V, y);
        ld_bf16<V>(dhm + i * V, d);
        unsigned mg = 0, mu = 0;
        for (int k = 0; k < V; k++) {
            act_bwd(x[k], y[k], d[k], alpha, limit, &x[k], &d[k]);
            mg = max(mg, gk_abs_bits(__bfloat162float(__float2bfloat16(x[k]))));
            mu = max(mu, gk_abs_bits(__bfloat162float(__float2bfloat16(d[k]))));
        }
        chunk_amax<V>(am, b, 0, i, mg, &ag);
        chunk_amax<V>(am, b, 1, i, mu, &au);
    }
    chunk_amax_end(am, b, 0, ag, red);
    chunk_amax_end(am, b, 1, au, red);
}
#define SWIGLU_AMAX_R 8

/* How many of n elements go eight at a time: all but the tail when every pointer is 16-byte
 * aligned (and with amax kept, the rows a multiple of 8 wide: a thread's values in one row),
 * none otherwise. */
static size_t by_eight(size_t n, const void *const *ptrs, int np, const struct gk_amax_rows *am)
{
    for (int i = 0; i < np; i++)
        if (!aligned(ptrs[i], 16)) return 0;
    return am && am->cols % 8 ? 0 : n / 8;
}

static const struct gk_amax_rows no_amax = {NULL, 0, 1, {NULL, NULL}};

cudaError_t gk_swiglu(const bf16 *g, const bf16 *u, bf16 *hm, size_t n, float alpha, float limit,
                      const struct gk_amax_rows *am, cudaStream_t s)
{
    const void *p[] = {g, u, hm};
    size_t n8 = by_eight(n, p, 3, am), o = 8 * n8;
    const struct gk_amax_rows a = am ? *am : no_amax;
    if (n8 && a.amax[0])
        k_swiglu_amax<8, SWIGLU_AMAX_R>
            <<<blocks_for(n8, TPB * SWIGLU_AMAX_R), TPB, 0, s>>>(g, u, hm, n8, alpha, limit, a);
    else if (n8)
        k_swiglu<8><<<blocks_for(n8, TPB), TPB, 0, s>>>(g, u, hm, n8, alpha, limit, a, 0);
    if (n > o)
        k_swiglu<1><<<blocks_for(n - o, TPB), TPB, 0, s>>>(g + o, u + o, hm + o, n - o, alpha,
                                                           limit, a, o);
    return cudaGetLastError();
}

cudaError_t gk_swiglu_backward(const bf16 *g, const bf16 *u, const bf16 *dhm, bf16 *dg, bf16 *du,
                               size_t n, float alpha, float limit, const struct gk_amax_rows *am,
                               cudaStream_t s)
{
    const void *p[] = {g, u, dhm, dg, du};
    size_t n8 = by_eight(n, p, 5, am), o = 8 * n8;
    const struct gk_amax_rows a = am ? *am : no_amax;
    if (n8 && !dg && a.amax[0] && a.amax[1])
        k_swiglu_backward_amax<8, SWIGLU_AMAX_R>
            <<<blocks_for(n8, TPB * SWIGLU_AMAX_R), TPB, 0, s>>>(g, u, dhm, n8, alpha, limit, a);
    else if (n8)
        k_swiglu_backward<8>
            <<<blocks_for(n8, TPB), TPB, 0, s>>>(g, u, dhm, dg, du, n8, alpha, limit, a, 0);
    if (n > o)
        k_swiglu_backward<1>
            <<<blocks_for(n - o, TPB), TPB, 0, s>>>(g + o, u + o, dhm + o, dg ? dg + o : NULL,
                                                    du ? du + o : NULL, n - o, alpha, limit, a, o);
    return cudaGetLastError();
}

/* ---- loss, optimizer ------------------------------------------------------------------------ */

/* (m, s) += exp(x - m) with m the running maximum: the online softmax denominator. */
__device__ __forceinline__ void lse_add(float &m, float &s, float x)
{
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

/* Merge two (maximum, sum) pairs. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return;
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

/* Per row: loss = logsumexp(z) - z[target]; dlogits = (softmax(z) - onehot) * scale, over the
 * bf16 logits in place (the GEMM wrote them bf16 with fp32 accumulation, as PyTorch's autocast and
 * Megatron's do; the arithmetic here is fp32). Two passes over the row: the maximum and the sum
 * together (online), then the gradient. VEC elements a load (8: 16-byte loads where the rows
 * allow; 1 otherwise); the row is read twice, the second time mostly from L2. */
template <int VEC>
__global__ void k_cross_entropy(bf16 *logits, const int *tgt, int V, float scale, float *row_loss)
{
    __shared__ float rm[TPB / 32], rs[TPB / 32];
    size_t t = blockIdx.x;
    bf16 *z = logits + t * V;
    int nv = V / VEC, y = tgt[t];
    float zy = __bfloat162float(z[y]); /* read before any thread writes the row */
    float mx = -INFINITY, sum = 0.0f;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float x[VEC];
        ld_bf16<VEC>(z + (size_t)c * VEC, x);
        float m4 = x[0];
        for (int j = 1; j < VEC; j++) m4 = fmaxf(m4, x[j]);
        if (m4 > mx) {
            sum *= expf(mx - m4);
            mx = m4;
        }
        for (int j = 0; j < VEC; j++) sum += expf(x[j] - mx);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, mx, o), s2 = __shfl_xor_sync(0xffffffffu, sum, o);
        lse_merge(mx, sum, m2, s2);
    }
    int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        rm[w] = mx;
        rs[w] = sum;
    }
    __syncthreads();
    mx = rm[0];
    sum = rs[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) lse_merge(mx, sum, rm[i], rs[i]);
    float lse = mx + logf(sum);
    if (threadIdx.x == 0) row_loss[t] = lse - zy;
    for (int c = threadIdx.x; c < nv; c += blockDim.x) {
        float x[VEC];
        ld_bf16<VEC>(z + (size_t)c * VEC, x);
        for (int j = 0; j < VEC; j++)
            x[j] = (expf(x[j] - lse) - (c * VEC + j == y ? 1.0f : 0.0f)) * scale;
        st_bf16<VEC>(z + (size_t)c * VEC, x);
    }
}

cudaError_t gk_cross_entropy(bf16 *logits, const int *tgt, int T, int V, float scale,
                             float *row_loss, cudaStream_t s)
{
    if (!T) return cudaGetLastError();
    if (V % 8 == 0 && aligned(logits, 16))
        k_cross_entropy<8><<<T, TPB, 0, s>>>(logits, tgt, V, scale, row_loss);
    else
        k_cross_entropy<1><<<T, TPB, 0, s>>>(logits, tgt, V, scale, row_loss);
    return cudaGetLastError();
}

/* Sum of squares in GK_NORM_BLOCKS fixed partial sums (double), summed in order by the host. */
__global__ void k_sumsq(const float *g, size_t n, double *part)
{
    __shared__ double red[TPB];
    double acc = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (aligned(g, 16)) { /* by 16-byte loads, then the tail */
        const float4 *g4 = (const float4 *)g;
        for (size_t i = i0; i < n / 4; i += stride) {
            float4 v = g4[i];
            acc += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        for (size_t i = n / 4 * 4 + i0; i < n; i += stride) acc += (double)g[i] * g[i];
    } else {
        for (size_t i = i0; i < n; i += stride) acc += (double)g[i] * g[i];
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < blockDim.x; i++) s += red[i];
        part[blockIdx.x] = s;
    }
}

cudaError_t gk_sumsq(const float *g, size_t n, double *part, cudaStream_t s)
{
    k_sumsq<<<GK_NORM_BLOCKS, TPB, 0, s>>>(g, n, part);
    return cudaGetLastError();
}

/* AdamW (decoupled decay) on fp32 masters; writes the bf16 copy. */
__device__ __forceinline__ float adamw_one(float p, float gr, float *m, float *v,
                                           const struct gk_adamw &a)
{
    gr *= a.scale;
    *m = a.beta1 * *m + (1.0f - a.beta1) * gr;
    *v = a.beta2 * *v + (1.0f - a.beta2) * gr * gr;
    float upd = (*m / a.c1) / (sqrtf(*v / a.c2) + a.eps);
    return p - a.lr * (upd + a.wd * p);
}

/* The moments' four elements i*4 .. i*4+3, fp32 (16 bytes) or bf16 (8 bytes, M16). */
template <bool M16> __device__ __forceinline__ float4 mom_load(const void *b, size_t i)
{
    if (!M16) return ((const float4 *)b)[i];
    float f[4];
    ld_bf16<4>((const bf16 *)b + 4 * i, f);
    return make_float4(f[0], f[1], f[2], f[3]);
}

template <bool M16> __device__ __forceinline__ void mom_store(void *b, size_t i, float4 v)
{
    if (!M16) {
        ((float4 *)b)[i] = v;
        return;
    }
    float f[4] = {v.x, v.y, v.z, v.w};
    st_bf16<4>((bf16 *)b + 4 * i, f);
}

/* |v| of a value as its bf16 copy holds it, as gk_abs_bits */
static __device__ __forceinline__ unsigned bf16_abs_bits(float v)
{
    return gk_abs_bits(__bfloat162float(__float2bfloat16(v)));
}

/* Four elements a thread by 16-byte loads (memory bound: 30 bytes an element with fp32 moments,
 * 22 with bf16 ones); n4 = n / 4. The update uses the moments unrounded; bf16 ones are stored
 * rounded to nearest. With am, each slice's amax of the bf16 copy (struct gk_amax_rows). */
template <bool M16>
__global__ void k_adamw4(float4 *p, const float4 *g, void *m1, void *m2, __nv_bfloat162 *w16,
                         size_t n4, struct gk_adamw a, struct gk_amax_rows am)
{
    __shared__ unsigned red[TPB / 32];
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned mx = 0;
    if (i < n4) {
        float4 x = p[i], gr = g[i], m = mom_load<M16>(m1, i), v = mom_load<M16>(m2, i);
        x.x = adamw_one(x.x, gr.x, &m.x, &v.x, a);
        x.y = adamw_one(x.y, gr.y, &m.y, &v.y, a);
        x.z = adamw_one(x.z, gr.z, &m.z, &v.z, a);
        x.w = adamw_one(x.w, gr.w, &m.w, &v.w, a);
        p[i] = x;
        mom_store<M16>(m1, i, m);
        mom_store<M16>(m2, i, v);
        w16[2 * i] = __floats2bfloat162_rn(x.x, x.y);
        w16[2 * i + 1] = __floats2bfloat162_rn(x.z, x.w);
        if (am.amax[0])
            mx = max(max(bf16_abs_bits(x.x), bf16_abs_bits(x.y)),
                     max(bf16_abs_bits(x.z), bf16_abs_bits(x.w)));
    }
    if (am.amax[0]) gk_rows_amax_v<4>(am, 0, mx, i, n4, 0, red);
}

template <bool M16>
__global__ void k_adamw(float *p, const float *g, void *m1, void *m2, bf16 *w16, size_t n,
                        struct gk_adamw a, struct gk_amax_rows am, size_t base)
{
    __shared__ unsigned red[TPB / 32];
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned mx = 0;
    if (i < n) {
        float m = M16 ? __bfloat162float(((bf16 *)m1)[i]) : ((float *)m1)[i];
        float v = M16 ? __bfloat162float(((bf16 *)m2)[i]) : ((float *)m2)[i];
        float x = adamw_one(p[i], g[i], &m, &v, a);
        if (M16) {
            ((bf16 *)m1)[i] = __float2bfloat16(m);
            ((bf16 *)m2)[i] = __float2bfloat16(v);
        } else {
            ((float *)m1)[i] = m;
            ((float *)m2)[i] = v;
        }
        p[i] = x;
        w16[i] = __float2bfloat16(x);
        if (am.amax[0]) mx = bf16_abs_bits(x);
    }
    if (am.amax[0]) gk_rows_amax_v<1>(am, 0, mx, i, n, base, red);
}

template <bool M16>
static void adamw_launch(float *p, const float *g, void *m1, void *m2, bf16 *w16, size_t n,
                         const struct gk_adamw *a, const struct gk_amax_rows &am, cudaStream_t s)
{
    size_t n4 = 0, mb = M16 ? 2 : 4;
    if (aligned(p, 16) && aligned(g, 16) && aligned(m1, 4 * mb) && aligned(m2, 4 * mb) &&
        aligned(w16, 8) && am.cols % 4 == 0) /* with am: a thread's four in one slice */
        n4 = n / 4;
    if (n4)
        k_adamw4<M16><<<blocks_for(n4, TPB), TPB, 0, s>>>((float4 *)p, (const float4 *)g, m1, m2,
                                                          (__nv_bfloat162 *)w16, n4, *a, am);
    size_t r = n - 4 * n4;
    if (r)
        k_adamw<M16><<<blocks_for(r, TPB), TPB, 0, s>>>(
            p + 4 * n4, g + 4 * n4, (char *)m1 + 4 * n4 * mb, (char *)m2 + 4 * n4 * mb,
            w16 + 4 * n4, r, *a, am, 4 * n4);
}

cudaError_t gk_adamw(float *p, const float *g, void *m1, void *m2, bool m16, bf16 *w16, size_t n,
                     const struct gk_adamw *a, const struct gk_amax_rows *am, cudaStream_t s)
{
    const struct gk_amax_rows k = am ? *am : gk_amax_rows{NULL, 0, 4, {NULL, NULL}};
    if (m16)
        adamw_launch<true>(p, g, m1, m2, w16, n, a, k, s);
    else
        adamw_launch<false>(p, g, m1, m2, w16, n, a, k, s);
    return cudaGetLastError();
}
