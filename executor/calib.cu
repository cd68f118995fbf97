/*
 * calib.cu: the microbenchmarks `moeplan calibrate` fits the cost model to, each timed the way
 * the executor runs it: a bf16 GEMM through cuBLAS (fp32 accumulate, the executor's call), the
 * flash attention kernels forward and backward, a device-to-device copy (HBM bandwidth) and an
 * empty kernel (launch cost); and `moeplan bench gemm`'s GEMM in bf16 and in each fp8 recipe.
 * Each time is the median of `iters` CUDA-event timings after two warm-up runs; inputs are seeded
 * normal numbers (gk_init), never uninitialized memory.
 */
#include "gpu.h"

#include <algorithm>
#include <time.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <vector>

namespace
{

enum moe_status cuda_fail(cudaError_t e, const char *what, struct moe_error *err)
{
    return moe_error_set(err, MOE_ERR_CUDA, "calibrate: %s: %s", what, cudaGetErrorString(e));
}

/* Device buffers freed on scope exit. */
struct dbufs {
    std::vector<void *> p;
    ~dbufs()
    {
        for (void *x : p) cudaFree(x);
    }
    template <typename T> T *get(size_t n, cudaError_t *e)
    {
        void *x = nullptr;
        if (*e == cudaSuccess) *e = cudaMalloc(&x, sizeof(T) * (n ? n : 1));
        if (*e == cudaSuccess) p.push_back(x);
        return (T *)x;
    }
};

__global__ void k_empty() {}

/* Seeded bf16 values: fp32 normal numbers through a scratch buffer. */
cudaError_t fill_bf16(bf16 *y, size_t n, uint64_t seed, float *scratch, size_t cap)
{
    for (size_t at = 0; at < n; at += cap) {
        size_t m = std::min(cap, n - at);
        cudaError_t e = gk_init(scratch, m, at, seed, 0.5f, false, 0);
        if (e != cudaSuccess) return e;
        e = gk_to_bf16(scratch, y + at, m, 0); /* each launch checked, not only the last */
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* The median of iters timings of fn(), after two warm-up calls. */
template <typename F> cudaError_t time_median(int iters, F fn, double *us)
{
    cudaEvent_t a, b;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess) e = cudaEventCreate(&b);
    std::vector<double> t;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = fn();
    for (int i = 0; i < iters && e == cudaSuccess; i++) {
        e = cudaEventRecord(a, 0);
        if (e == cudaSuccess) e = fn();
        if (e == cudaSuccess) e = cudaEventRecord(b, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        t.push_back(1e3 * ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (e != cudaSuccess) return e;
    *us = moe_median(t.data(), t.size());
    return cudaSuccess;
}

/* A row-major bf16 GEMM C (m, n) = A (m, k) B (k, n) on seeded operands, through cuBLAS as the
 * executor calls it (column-major C^T = B^T A^T, fp32 accumulation). */
struct gemm_bench {
    dbufs d;
    cublasHandle_t h = nullptr;
    int m, n, k;
    bf16 *a = nullptr, *b = nullptr, *c = nullptr;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    gemm_bench(int m_, int n_, int k_) : m(m_), n(n_), k(k_) {}
    ~gemm_bench()
    {
        if (h) cublasDestroy(h);
    }
    enum moe_status init(struct moe_error *err)
    {
        cudaError_t e = cudaSuccess;
        size_t cap = 1u << 22;
        float *scratch = d.get<float>(cap, &e);
        a = d.get<bf16>((size_t)m * k, &e), b = d.get<bf16>((size_t)k * n, &e);
        c = d.get<bf16>((size_t)m * n, &e);
        if (e == cudaSuccess) e = fill_bf16(a, (size_t)m * k, 1, scratch, cap);
        if (e == cudaSuccess) e = fill_bf16(b, (size_t)k * n, 2, scratch, cap);
        if (e != cudaSuccess) return cuda_fail(e, "GEMM buffers", err);
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
            h = nullptr;
            return moe_error_set(err, MOE_ERR_CUDA, "calibrate: cublasCreate failed");
        }
        return MOE_OK;
    }
    cudaError_t run()
    {
        float one = 1.0f, zero = 0.0f;
        bs = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, n, a,
                          CUDA_R_16BF, k, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
        return bs == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
    }
    enum moe_status fail(cudaError_t e, struct moe_error *err)
    {
        if (bs != CUBLAS_STATUS_SUCCESS)
            return moe_error_set(err, MOE_ERR_CUDA,
                                 "calibrate: cublasGemmEx %d x %d x %d: status %d", m, n, k,
                                 (int)bs);
        return e == cudaSuccess ? MOE_OK : cuda_fail(e, "GEMM", err);
    }
};

} // namespace

extern "C" enum moe_status exec_time_gemm(int m, int n, int k, int iters, double *us,
                                          struct moe_error *err)
{
    if (m < 1 || n < 1 || k < 1 || iters < 1)
        return moe_error_set(err, MOE_ERR_INPUT, "calibrate: GEMM %d x %d x %d", m, n, k);
    gemm_bench g(m, n, k);
    MOE_CHECK(g.init(err));
    auto run = [&]() { return g.run(); };
    return g.fail(time_median(iters, run, us), err);
}

const char *const exec_gemm_kind_names[EXEC_GEMM_KINDS] = {"bf16", "fp8", "fp8 fast", "fp8block"};

/* Kind `kind`'s matmul by each of cuBLASLt's heuristic's first algorithms (gk_lt_time_algos: no
 * split-K, as gk_lt_algo asks; iters timings each), into t (exec_gemm_times): an algorithm that
 * does not run here is left out; alike, those whose output (c: m x n bf16) has the first's
 * fingerprint (fp a device word). */
static cublasStatus_t time_algos(cublasLtHandle_t lt, cublasLtMatmulDesc_t op,
                                 cublasLtMatrixLayout_t const l[3], const void *a, const void *b,
                                 bf16 *c, int m, int n_, unsigned long long *fp, void *ws,
                                 size_t ws_bytes, int iters, struct exec_gemm_times *t, int kind)
{
    cublasLtMatmulHeuristicResult_t r[EXEC_GEMM_ALGOS];
    double us[EXEC_GEMM_ALGOS];
    unsigned long long f[EXEC_GEMM_ALGOS], first = 0;
    int n = 0;
    cublasStatus_t st = gk_lt_time_algos(lt, op, l, a, b, c, m, n_, n_, sizeof(bf16), ws, ws_bytes,
                                         0, EXEC_GEMM_ALGOS, iters, fp, r, us, f, &n);
    t->algos[kind] = t->alike[kind] = 0;
    for (int i = 0; !st && i < n; i++) {
        if (us[i] < 0) continue;
        if (!t->algos[kind]) first = f[i];
        t->alike[kind] += f[i] == first;
        if (!t->algos[kind]++ || us[i] < t->fastest_us[kind])
            t->fastest_us[kind] = us[i], t->fastest_at[kind] = i;
        if (i == 0) t->first_us[kind] = us[i];
    }
    return st;
}

extern "C" enum moe_status exec_time_gemm_kinds(int m, int n, int k, int iters,
                                                struct exec_gemm_times *t, struct moe_error *err)
{
    memset(t, 0, sizeof *t);
    if (m < 1 || n < 1 || k < 1 || n % 16 || k % 16 || iters < 1)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "bench gemm: %d x %d x %d (n and k multiples of 16: fp8 GEMMs), "
                             "%d iterations",
                             m, n, k, iters);
    int dev = 0;
    MOE_CUDA_CHECK(cudaGetDevice(&dev));
    MOE_CHECK(gpu_fp8_check(dev, COST_FP8, err));
    struct moe_error no;
    bool block = gpu_fp8_check(dev, COST_FP8_BLOCK, &no) == MOE_OK;
    int mp = exec_fp8_pad(m); /* block scaling's tail reads x's rows up to there */
    size_t cap = 1u << 22, fx = exec_fp8_factor_count(EXEC_FP8_TILE_1X128, m, k),
           fw = exec_fp8_factor_count(EXEC_FP8_BLOCK_128X128, n, k);
    dbufs d;
    cudaError_t e = cudaSuccess;
    float *scratch = d.get<float>(cap, &e);
    bf16 *x = d.get<bf16>((size_t)mp * k, &e), *w = d.get<bf16>((size_t)n * k, &e);
    bf16 *y = d.get<bf16>((size_t)m * n, &e);
    unsigned char *qx = d.get<unsigned char>((size_t)mp * k, &e);
    unsigned char *qw = d.get<unsigned char>((size_t)n * k, &e);
    float *sx = d.get<float>(fx > 4 ? fx : 4, &e), *sw = d.get<float>(fw > 4 ? fw : 4, &e);
    float *tail = d.get<float>((size_t)EXEC_FP8_PAD * n, &e);
    unsigned *work = d.get<unsigned>(4, &e);
    unsigned long long *fp = d.get<unsigned long long>(1, &e);
    size_t ws_bytes = 64u << 20;
    void *ws = d.get<char>(ws_bytes, &e);
    if (e == cudaSuccess) e = cudaMemset(x, 0, sizeof(bf16) * (size_t)mp * k);
    if (e == cudaSuccess) e = cudaMemset(qx, 0, (size_t)mp * k); /* the tail's padding rows */
    if (e == cudaSuccess) e = fill_bf16(x, (size_t)m * k, 1, scratch, cap);
    if (e == cudaSuccess) e = fill_bf16(w, (size_t)n * k, 2, scratch, cap);
    if (e != cudaSuccess) return cuda_fail(e, "GEMM buffers", err);
    cublasHandle_t h = nullptr;
    cublasLtHandle_t lt = nullptr;
    struct gk_fp8_lt *c = nullptr;
    enum moe_status st = MOE_OK;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS ||
        !(c = gk_fp8_lt_create(lt, ws_bytes)))
        st = moe_error_set(err, MOE_ERR_CUDA, "bench gemm: cuBLAS and cuBLASLt handles");
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    float one = 1.0f, zero = 0.0f;
    auto bf16_gemm =
        [&]() { /* row-major y = x w^T: column-major y^T = w x^T, as gpu_lin calls */
                bs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, k, x,
                                  CUDA_R_16BF, k, &zero, y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT);
                return bs == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
        };
    if (st == MOE_OK) e = time_median(iters, bf16_gemm, &t->gemm_us[EXEC_GEMM_BF16]);
    if (st == MOE_OK && e == cudaSuccess) { /* the same matmul through cuBLASLt, by algorithm */
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t l[3] = {nullptr, nullptr, nullptr};
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasStatus_t ls = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        if (!ls)
            ls = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        if (!ls)
            ls = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (!ls) ls = cublasLtMatrixLayoutCreate(&l[0], CUDA_R_16BF, k, n, k);
        if (!ls) ls = cublasLtMatrixLayoutCreate(&l[1], CUDA_R_16BF, k, m, k);
        if (!ls) ls = cublasLtMatrixLayoutCreate(&l[2], CUDA_R_16BF, n, m, n);
        if (!ls)
            ls = time_algos(lt, op, l, w, x, y, m, n, fp, ws, ws_bytes, iters, t, EXEC_GEMM_BF16);
        gk_lt_layouts_free(l);
        if (op) cublasLtMatmulDescDestroy(op);
        if (ls)
            st = moe_error_set(err, MOE_ERR_CUBLAS, "bench gemm: bf16 %d x %d x %d: cuBLASLt: %s",
                               m, n, k, cublasGetStatusString(ls));
    }
    for (int kind = EXEC_GEMM_FP8; st == MOE_OK && e == cudaSuccess && kind < EXEC_GEMM_KINDS;
         kind++) {
        if (kind == EXEC_GEMM_FP8_BLOCK && !block) { /* not on this GPU */
            t->gemm_us[kind] = t->cast_us[kind] = -1.0;
            continue;
        }
        int hx = kind == EXEC_GEMM_FP8_BLOCK ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR;
        int hw = kind == EXEC_GEMM_FP8_BLOCK ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR;
        auto cast = [&]() {
            return gk_fp8_cast(x, k, m, k, hx, 0, qx, sx, NULL, 0, NULL, work, 0);
        };
        e = gk_fp8_cast(w, k, n, k, hw, 0, qw, sw, NULL, 0, NULL, work, 0);
        if (e == cudaSuccess) e = time_median(iters, cast, &t->cast_us[kind]);
        struct gk_fp8_mat W = {qw, sw, k, hw, 0}, X = {qx, sx, k, hx, 0};
        bool fast = kind == EXEC_GEMM_FP8_FAST;
        auto gemm = [&]() {
            bs = gk_fp8_gemm(c, &W, &X, m, n, k, y, n, CUDA_R_16BF, 0.0f, fast,
                             hx == EXEC_FP8_TILE_1X128 ? tail : NULL, ws, 0);
            return bs == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
        };
        if (e == cudaSuccess) e = time_median(iters, gemm, &t->gemm_us[kind]);
        if (e == cudaSuccess && (hx != EXEC_FP8_TILE_1X128 || m % EXEC_FP8_PAD == 0)) {
            cublasLtMatmulDesc_t op = nullptr;
            cublasLtMatrixLayout_t l[3];
            bs = gk_fp8_matmul(&W, &X, m, n, k, n, CUDA_R_16BF, fast, &op, l);
            if (!bs) bs = time_algos(lt, op, l, qw, qx, y, m, n, fp, ws, ws_bytes, iters, t, kind);
            gk_lt_layouts_free(l);
            if (op) cublasLtMatmulDescDestroy(op);
            if (bs) e = cudaErrorUnknown;
        }
        if (e != cudaSuccess && bs != CUBLAS_STATUS_SUCCESS)
            st = moe_error_set(err, MOE_ERR_CUBLAS, "bench gemm: %s %d x %d x %d: cuBLASLt: %s",
                               exec_gemm_kind_names[kind], m, n, k, cublasGetStatusString(bs));
    }
    if (st == MOE_OK && e != cudaSuccess)
        st = bs != CUBLAS_STATUS_SUCCESS
                 ? moe_error_set(err, MOE_ERR_CUBLAS, "bench gemm: bf16 %d x %d x %d: cuBLAS: %s",
                                 m, n, k, cublasGetStatusString(bs))
                 : cuda_fail(e, "bench gemm", err);
    gk_fp8_lt_destroy(c);
    if (lt) cublasLtDestroy(lt);
    if (h) cublasDestroy(h);
    return st;
}

extern "C" enum moe_status exec_warm_up(double seconds, struct moe_error *err)
{
    gemm_bench g(8192, 8192, 8192);
    MOE_CHECK(g.init(err));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cudaError_t e = cudaSuccess;
    do /* 16 GEMMs (about 25 ms on an H200) queued between looks at the clock */
        for (int i = 0; i < 16 && e == cudaSuccess; i++) e = g.run();
    while (e == cudaSuccess && (e = cudaDeviceSynchronize()) == cudaSuccess &&
           since(&t0) < seconds);
    return g.fail(e, err);
}

extern "C" enum moe_status exec_time_attention(int seqs, int seq, int heads, int kv_heads, int dqk,
                                               int dv, int window, enum exec_attention backend,
                                               bool sinks, int iters, double *fwd_us,
                                               double *bwd_us, struct moe_error *err)
{
    if (seqs < 1 || seq < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads ||
        !gk_flash_supported(dqk, dv) || iters < 1 || window < 0 ||
        (sinks && backend != EXEC_ATTN_CUDNN))
        return moe_error_set(err, MOE_ERR_INPUT,
                             "calibrate: attention %d x %d tokens, %d / %d heads, dims %d / %d, "
                             "window %d%s",
                             seqs, seq, heads, kv_heads, dqk, dv, window,
                             sinks ? ", sinks (cuDNN's only)" : "");
    /* as the executor runs it (AUTO): cuDNN's where the build has it, but our backward for a
     * narrow window */
    bool cudnn = backend == EXEC_ATTN_CUDNN ||
                 (backend == EXEC_ATTN_AUTO && exec_attention_cudnn(EXEC_ATTN_AUTO));
    bool bwd_cudnn = cudnn && !(backend == EXEC_ATTN_AUTO && gk_window_backward_ours(seq, window));
    size_t T = (size_t)seqs * seq, nq = T * heads * dqk, nk = T * kv_heads * dqk;
    size_t nv = T * kv_heads * dv, no = T * heads * dv, cap = 1u << 22;
    dbufs d;
    cudaError_t e = gk_flash_prepare(dqk, dv);
    float *scratch = d.get<float>(cap, &e);
    bf16 *q = d.get<bf16>(nq, &e), *k = d.get<bf16>(nk, &e), *v = d.get<bf16>(nv, &e);
    bf16 *o = d.get<bf16>(no, &e), *dout = d.get<bf16>(no, &e);
    float *lse = d.get<float>(T * heads, &e), *delta = d.get<float>(T * heads, &e);
    float *dq = d.get<float>(nq, &e), *dk = d.get<float>(nk, &e), *dvv = d.get<float>(nv, &e);
    bf16 *dq16 = d.get<bf16>(nq, &e), *dk16 = d.get<bf16>(nk, &e), *dv16 = d.get<bf16>(nv, &e);
    float *sink = sinks ? d.get<float>(heads, &e) : NULL,
          *dsink = sinks ? d.get<float>(heads, &e) : NULL;
    if (e == cudaSuccess && sinks) e = cudaMemset(sink, 0, sizeof(float) * heads);
    if (e == cudaSuccess) e = fill_bf16(q, nq, 3, scratch, cap);
    if (e == cudaSuccess) e = fill_bf16(k, nk, 4, scratch, cap);
    if (e == cudaSuccess) e = fill_bf16(v, nv, 5, scratch, cap);
    if (e == cudaSuccess) e = fill_bf16(dout, no, 6, scratch, cap);
    if (e != cudaSuccess) return cuda_fail(e, "attention buffers", err);
    char why[256] = "";
    bool ok = true;
    e = time_median(
        iters,
        [&]() {
            if (!cudnn)
                return gk_flash_forward(q, k, v, seqs, seq, heads, kv_heads, dqk, dv, window, o,
                                        lse, 0);
            ok = ok && gk_cudnn_forward(q, k, v, seqs, seq, heads, kv_heads, dqk, dv, window, sink,
                                        o, lse, 0, why, sizeof why);
            return ok ? cudaGetLastError() : cudaErrorUnknown;
        },
        fwd_us);
    if (e == cudaSuccess)
        e = time_median(
            iters,
            [&]() {
                if (!bwd_cudnn) /* the gradients in fp32 (ours) */
                    return gk_flash_backward(q, k, v, o, dout, lse, seqs, seq, heads, kv_heads, dqk,
                                             dv, window, delta, dq, dk, dvv, 0);
                /* as the executor calls it: the gradients stay bf16 (GQA's rope reads them) */
                ok = ok && gk_cudnn_backward(q, k, v, o, dout, lse, seqs, seq, heads, kv_heads, dqk,
                                             dv, window, sink, dsink, GK_CUDNN_DETERMINISTIC, NULL,
                                             NULL, NULL, dq16, dk16, dv16, 0, why, sizeof why);
                return ok ? cudaGetLastError() : cudaErrorUnknown;
            },
            bwd_us);
    if (cudnn) gk_cudnn_release(0);
    if (!ok) return moe_error_set(err, MOE_ERR_RUNTIME, "calibrate: %s", why);
    return e == cudaSuccess ? MOE_OK : cuda_fail(e, "attention", err);
}

extern "C" enum moe_status exec_time_copy(size_t bytes, int iters, double *us,
                                          struct moe_error *err)
{
    dbufs d;
    cudaError_t e = cudaSuccess;
    char *a = d.get<char>(bytes, &e), *b = d.get<char>(bytes, &e);
    if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess)
        e = time_median(
            iters, [&]() { return cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0); }, us);
    return e == cudaSuccess ? MOE_OK : cuda_fail(e, "copy", err);
}

extern "C" enum moe_status exec_time_adamw(size_t n, bool m16, int iters, double *us,
                                           struct moe_error *err)
{
    dbufs d;
    cudaError_t e = cudaSuccess;
    size_t mn = m16 ? (n + 1) / 2 : n; /* the moments in floats' room */
    float *p = d.get<float>(n, &e), *g = d.get<float>(n, &e), *m1 = d.get<float>(mn, &e),
          *m2 = d.get<float>(mn, &e);
    bf16 *w = d.get<bf16>(n, &e);
    if (e == cudaSuccess) e = gk_init(p, n, 0, 1, 0.02f, false, 0);
    if (e == cudaSuccess) e = gk_init(g, n, 0, 2, 0.01f, false, 0);
    if (e == cudaSuccess) e = cudaMemset(m1, 0, sizeof(float) * mn);
    if (e == cudaSuccess) e = cudaMemset(m2, 0, sizeof(float) * mn);
    struct gk_adamw a = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f};
    if (e == cudaSuccess)
        e = time_median(
            iters, [&]() { return gk_adamw(p, g, m1, m2, m16, w, n, &a, NULL, 0); }, us);
    return e == cudaSuccess ? MOE_OK : cuda_fail(e, "AdamW", err);
}

extern "C" enum moe_status exec_time_launch(int iters, double *us, struct moe_error *err)
{
    /* 100 empty kernels back to back: the cost of one on the stream */
    double t = 0;
    cudaError_t e = time_median(
        iters,
        [&]() {
            for (int i = 0; i < 100; i++) k_empty<<<1, 32>>>();
            return cudaGetLastError();
        },
        &t);
    *us = t / 100;
    return e == cudaSuccess ? MOE_OK : cuda_fail(e, "launch", err);
}
