/*
 * gpu_gemm.cu: the GEMMs of the step. Dense GEMMs go to cuBLAS (one strided-batched call);
 * the expert GEMMs, whose row counts change with the routing every call, go to cuBLASLt with
 * the algorithm chosen once per shape kind (cuBLAS's own heuristics cost 100-300 us of host
 * time a call at a new size). Expert e's GEMMs run on side stream e % nside between
 * gpu_fork_experts and gpu_join_experts.
 */
#include "gpu.h"

/* Row-major C (M x N) = alpha op(A) op(B) + beta C, batched with strides; op(A) is M x K. cuBLAS
 * is column-major, so it computes C^T = op(B)^T op(A)^T with the operands swapped. */
enum moe_status gpu_mm(struct exec_gpu *g, bool ta, bool tb, int M_, int N, int K, float alpha,
                       const void *A, int lda, long long sA, const void *B, int ldb, long long sB,
                       float beta, void *C, int ldc, long long sC, int batch, cudaDataType ab,
                       cudaDataType ct, struct moe_error *err)
{
    if (M_ == 0 || N == 0 || batch == 0) return MOE_OK;
    MOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(g->cur, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M_, K, &alpha, B,
                                                ab, ldb, sB, A, ab, lda, sA, &beta, C, ct, ldc, sC,
                                                batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MOE_OK;
}

/* The expert GEMMs: one size (the rows M, or the reduction K of a weight gradient) changes with
 * the routing from call to call, and cuBLAS's heuristics, cached by size, then cost 100-300 us of
 * host time a call (measured on the H200 machine; 12 us for a size seen before), more than the
 * GEMM itself. So each kind of expert GEMM gets its cuBLASLt algorithm once, chosen at the mean
 * rows per expert, and reuses it for every size; a size it cannot run goes to gpu_mm(). The layouts
 * are column-major: C^T (N x M) = op(B)^T op(A)^T, as in gpu_mm(). */
static cublasStatus_t lt_layouts(cublasLtMatrixLayout_t l[3], bool ta, bool tb, int M_, int N,
                                 int K, int lda, int ldb, int ldc, cudaDataType ab, cudaDataType ct)
{
    cublasStatus_t st;
    l[0] = l[1] = l[2] = NULL;
    if ((st = cublasLtMatrixLayoutCreate(&l[0], ab, tb ? K : N, tb ? N : K, ldb)) ||
        (st = cublasLtMatrixLayoutCreate(&l[1], ab, ta ? M_ : K, ta ? K : M_, lda)) ||
        (st = cublasLtMatrixLayoutCreate(&l[2], ct, N, M_, ldc)))
        return st;
    return CUBLAS_STATUS_SUCCESS;
}

static enum moe_status lt_kind_find(struct exec_gpu *g, bool ta, bool tb, bool vary_k, int M_,
                                    int N, int K, int lda, int ldb, int ldc, cudaDataType ab,
                                    cudaDataType ct, struct lt_kind **out, struct moe_error *err)
{
    int fixed = vary_k ? M_ : K;
    for (int i = 0; i < g->nlt; i++) {
        struct lt_kind *q = &g->lt_kinds[i];
        if (q->ta == ta && q->tb == tb && q->vary_k == vary_k && q->fixed == fixed && q->N == N &&
            q->lda == lda && q->ldb == ldb && q->ldc == ldc && q->ab == ab && q->ct == ct) {
            *out = q;
            return MOE_OK;
        }
    }
    *out = NULL;
    if (g->nlt == LT_KINDS) return MOE_OK; /* gpu_mm() for the rest */
    struct lt_kind *q = &g->lt_kinds[g->nlt++];
    *q = lt_kind{ta, tb, vary_k, fixed, N, lda, ldb, ldc, ab, ct, NULL, {}, false};
    cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    MOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    MOE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    MOE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    int mean = (g->pairs / (g->experts > 0 ? g->experts : 1) + 63) / 64 * 64;
    if (mean < 64) mean = 64;
    cublasLtMatrixLayout_t l[3];
    cublasStatus_t st =
        lt_layouts(l, ta, tb, vary_k ? M_ : mean, N, vary_k ? mean : K, lda, ldb, ldc, ab, ct);
    /* no split-K: with it left out, the experts on one stream or four gave the same bits on the
     * H200 (results/issue24/streams/; with it allowed, that pairing was not measured) */
    if (!st) st = gk_lt_algo(g->lt, q->op, l, g->ws_bytes, false, &q->algo);
    gk_lt_layouts_free(l);
    q->usable = !st; /* else gpu_mm() for this kind */
    *out = q;
    return MOE_OK;
}

/* gpu_mm() for one expert (batch 1), with M_ (or K, vary_k) the size that follows the routing. */
static enum moe_status mm_expert(struct exec_gpu *g, bool ta, bool tb, bool vary_k, int M_, int N,
                                 int K, const void *A, int lda, const void *B, int ldb, float beta,
                                 void *C, int ldc, cudaDataType ab, cudaDataType ct,
                                 struct moe_error *err)
{
    if (M_ == 0 || N == 0) return MOE_OK;
    struct lt_kind *q;
    MOE_CHECK(lt_kind_find(g, ta, tb, vary_k, M_, N, K, lda, ldb, ldc, ab, ct, &q, err));
    if (q && q->usable) {
        cublasLtMatrixLayout_t l[3];
        float alpha = 1.0f;
        cudaStream_t st_ = g->cur_side < 0 ? g->s : g->side[g->cur_side];
        void *ws = g->cur_side < 0 ? g->blas_ws : g->side_ws[g->cur_side];
        cublasStatus_t st = lt_layouts(l, ta, tb, M_, N, K, lda, ldb, ldc, ab, ct);
        if (!st)
            st = cublasLtMatmul(g->lt, q->op, &alpha, B, l[0], A, l[1], &beta, C, l[2], C, l[2],
                                &q->algo, ws, g->ws_bytes, st_);
        gk_lt_layouts_free(l);
        if (st == CUBLAS_STATUS_SUCCESS) return MOE_OK;
        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            return moe_error_set(err, MOE_ERR_CUBLAS, "executor: cublasLtMatmul: %s",
                                 cublasGetStatusString(st));
    }
    return gpu_mm(g, ta, tb, M_, N, K, 1.0f, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, ab, ct, err);
}

/* ---- fp8 (cfg.precision fp8 or fp8block) ---------------------------------------------------
 * A weight with a quantized slice (exec_fp8_layout) goes through the fp8 GEMM: its row-major copy
 * in the forward, its transpose in the data gradient; the activation or gradient it meets is
 * quantized first, into the scratch of the stream the GEMM runs on. The weight gradient
 * quantizes both of its operands transposed (K: the rows, padded to EXEC_FP8_PAD with zeros).
 * A stream's next GEMM reuses what its last one quantized when it is the same matrix (struct
 * fp8_kept): the data gradient quantizes its output gradient both ways, for the weight gradient
 * after it. Everything else (the router, the head, the biases' gradients, a width not a multiple of 16)
 * stays bf16. */

/* The index of the quantized slice whose first parameter is `off`, or -1 */
static int fp8_slice_at(const struct exec_gpu *g, size_t off)
{
    int lo = 0, hi = g->f8.n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const struct exec_fp8_slice *s = &g->f8.slice[mid];
        if (s->off == off) return mid;
        if (s->off < off)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* The quantized slice that starts at W (rows x cols), or NULL */
static const struct exec_fp8_slice *fp8_slice(const struct exec_gpu *g, const bf16 *W, int rows,
                                              int cols)
{
    if (!g->fp8 || W < g->w16 || W >= g->w16 + g->table.nparams) return NULL;
    int i = fp8_slice_at(g, (size_t)(W - g->w16));
    if (i < 0) return NULL;
    const struct exec_fp8_slice *s = &g->f8.slice[i];
    return s->rows == rows && s->cols == cols ? s : NULL;
}

const struct gk_amax_rows *gpu_fp8_weight_rows(const struct exec_gpu *g, int t,
                                               struct gk_amax_rows *am)
{
    const struct exec_tensor *x = &g->table.tensor[t];
    int i = g->w8kept ? fp8_slice_at(g, x->offset) : -1;
    if (i < 0) return NULL;
    size_t size = (size_t)g->f8.slice[i].rows * g->f8.slice[i].cols;
    if (x->size % size || i + x->size / size > (size_t)g->f8.n) return NULL;
    *am = gk_amax_rows{NULL, (int)(x->size / size), (int)size, {g->w8kept + i, NULL}};
    return am;
}

/* The slice of tensor t's gradient slice `slice` (an expert's, else the tensor), or NULL */
static const struct exec_fp8_slice *fp8_grad_slice(const struct exec_gpu *g, int t, int slice,
                                                   int rows, int cols)
{
    if (!g->fp8) return NULL;
    return fp8_slice(g, g->w16 + g->table.tensor[t].offset + (size_t)slice * rows * cols, rows,
                     cols);
}

/* Slices i0 .. i1 quantized on stream s, a tensor's slices (its experts) at once: consecutive
 * slices of one shape, their parameters, copies and factors equally spaced, up to the experts'
 * count (w8amax's room); with per-tensor scaling their amax as AdamW kept them where it did
 * (w8kept_ok), else a pass of their own */
static cudaError_t fp8_cast_slices(struct exec_gpu *g, int i0, int i1, cudaStream_t st)
{
    int how = g->f8.weight, most = g->experts > 1 ? g->experts : 1;
    bool known = g->w8kept_ok;
    for (int i = i0, n; i < i1; i += n) {
        const struct exec_fp8_slice *s = &g->f8.slice[i];
        size_t size = (size_t)s->rows * s->cols, ss = i + 1 < g->f8.n ? s[1].s - s->s : 0;
        for (n = 1; i + n < i1 && n < most; n++) {
            const struct exec_fp8_slice *x = &s[n];
            if (x->rows != s->rows || x->cols != s->cols || x->off != s->off + n * size ||
                x->q != s->q + n * size || x->s != s->s + n * ss || x->st != s->st + n * ss)
                break;
        }
        cudaError_t e =
            gk_fp8_cast_batch(g->w16 + s->off, s->cols, s->rows, s->cols, how, 0, g->w8 + s->q,
                              g->w8s + s->s, g->w8t + s->q, s->rows, g->w8s + s->st, g->w8amax,
                              known ? g->w8kept + i : NULL, n, size, size, ss, st);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* A quantized slice's part of the quantization on cast_s: block l's attention and dense
 * projections (2 l), then its routed experts' (2 l + 1), each with its event */
static int cast_part(int l, bool experts)
{
    return 2 * l + (experts ? 1 : 0);
}

/* The main stream after part p's quantization on cast_s (p < 0: every part's), each part's wait
 * made once */
static enum moe_status cast_wait(struct exec_gpu *g, int p, struct moe_error *err)
{
    if (!g->cast_pend || (p >= 0 && g->cast_waited[p])) return MOE_OK;
    bool all = true;
    for (int b = 0; b < 2 * g->layers; b++) {
        if (!g->cast_waited[b] && (p < 0 || b == p)) {
            MOE_CUDA_CHECK(cudaStreamWaitEvent(g->s, g->cast_ev[b], 0));
            g->cast_waited[b] = 1;
        }
        all &= g->cast_waited[b] != 0;
    }
    g->cast_pend = !all;
    return MOE_OK;
}

/* The stale weights quantized again: on their own stream part by part (cast_overlap; a block's
 * attention first, so that its forward starts while its experts' weights are quantized), each
 * part's event after it, or in line on the main stream */
static enum moe_status fp8_requantize(struct exec_gpu *g, struct moe_error *err)
{
    if (g->in_experts)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "executor: the fp8 weights are stale inside the experts' streams");
    if (g->cast_s) {
        MOE_CUDA_CHECK(cudaEventRecord(g->cast_in, g->s));
        MOE_CUDA_CHECK(cudaStreamWaitEvent(g->cast_s, g->cast_in, 0));
        const struct exec_fp8_slice *s = g->f8.slice;
        for (int i0 = 0, i1 = 0, b = 0; b < g->layers; b++, i0 = i1) { /* in block order (create) */
            while (i1 < g->f8.n && s[i1].layer == b) i1++;
            for (int part = 0; part < 2; part++) { /* runs of the part's slices among the block's */
                for (int i = i0, j; i < i1; i = j) {
                    for (j = i; j < i1 && s[j].expert == s[i].expert; j++) {
                    }
                    if (s[i].expert == (part == 1))
                        MOE_CUDA_CHECK(fp8_cast_slices(g, i, j, g->cast_s));
                }
                MOE_CUDA_CHECK(cudaEventRecord(g->cast_ev[cast_part(b, part == 1)], g->cast_s));
            }
        }
        memset(g->cast_waited, 0, 2 * (size_t)g->layers);
        g->cast_pend = true;
    } else {
        MOE_CUDA_CHECK(fp8_cast_slices(g, 0, g->f8.n, g->s));
    }
    g->w8_stale = g->w8kept_ok = false;
    return MOE_OK;
}

enum moe_status gpu_fp8_fresh(struct exec_gpu *g, int l, bool experts, struct moe_error *err)
{
    if (!g->fp8) return MOE_OK;
    if (g->w8_stale) MOE_CHECK(fp8_requantize(g, err));
    return cast_wait(g, l < 0 ? -1 : cast_part(l, experts), err);
}

enum moe_status gpu_fp8_start(struct exec_gpu *g, struct moe_error *err)
{
    return g->fp8 && g->cast_s && g->w8_stale ? fp8_requantize(g, err) : MOE_OK;
}

enum moe_status gpu_fp8_settle(struct exec_gpu *g, struct moe_error *err)
{
    return cast_wait(g, -1, err);
}

static struct fp8_scratch *fp8_scratch_now(struct exec_gpu *g)
{
    return &g->f8x[g->cur_side + 1];
}

void gpu_fp8_forget(struct exec_gpu *g)
{
    for (int i = 0; g->fp8 && i <= g->nside; i++) g->f8x[i].kept.src = g->f8x[i].kept_b.src = NULL;
}

bool gpu_fp8_fused_ok(const struct exec_gpu *g, int l)
{
    const int *w = g->wi[l];
    int h = g->hidden, f = g->ffn;
    return g->fp8 && w[W_GATE] >= 0 && w[W_UP] >= 0 && w[W_DOWN] >= 0 &&
           fp8_slice(g, W16(g, w[W_GATE]), f, h) && fp8_slice(g, W16(g, w[W_UP]), f, h) &&
           fp8_slice(g, W16(g, w[W_DOWN]), h, f);
}

/* Which expert's rows X (T rows of a permuted matrix from base, ld wide, its experts' rows from
 * off[e]) is: the expert whose rows start at X's first and number T; -1 where X is none. */
static int expert_at(const struct exec_gpu *g, const bf16 *base, const int *off, int ld,
                     const bf16 *X, int T)
{
    int E = g->experts;
    if (!base || X < base || X >= base + (size_t)off[E] * ld || (size_t)(X - base) % ld) return -1;
    int o = (int)((size_t)(X - base) / ld), lo = 0, hi = E - 1;
    while (lo <= hi) { /* empty experts start where the next one does: T > 0 tells them apart */
        int e = (lo + hi) / 2;
        if (off[e] < o || (off[e] == o && off[e + 1] - off[e] < T))
            lo = e + 1;
        else if (off[e] > o)
            hi = e - 1;
        else
            return off[e + 1] - off[e] == T ? e : -1;
    }
    return -1;
}

void gpu_fp8_xt_begin(struct exec_gpu *g, int l, const struct act *A, const int *off, bool forward)
{
    g->xt.set = NULL;
    if (!g->fp8 || !A->xt8[0]) return;
    struct gpu_xt_set *set = &g->xt_set[g->cfg.recompute ? 0 : l];
    if (forward) {
        set->l = l, set->off = off;
        memset(set->done, 0, XT_N * (size_t)g->experts);
        if (g->f8xd.key == A->xp16 && g->f8xd.off == off) /* the permute wrote x's (dispatch) */
            memset(set->done + (size_t)XT_X * g->experts, 1, (size_t)g->experts);
    } else if (set->l != l || set->off != off) {
        return;
    }
    const bf16 *base[XT_N] = {A->xp16, A->ehm16};
    const int ld[XT_N] = {g->hidden, g->ffn};
    for (int k = 0; k < XT_N; k++) {
        exec_fp8_regions(off, g->experts, ld[k], g->xt.m[k].qo, g->xt.m[k].so, g->xt.m[k].sto);
        g->xt.m[k].base = base[k], g->xt.m[k].ld = ld[k];
        g->xt.m[k].q = A->xt8[k], g->xt.m[k].s = A->xt8s[k];
    }
    g->xt.set = set, g->xt.forward = forward;
}

void gpu_fp8_xt_end(struct exec_gpu *g)
{
    g->xt.set = NULL;
}

/* An expert's region of a kept transpose: its bytes (ld: the rows padded, exec_fp8_pad), its
 * factors, whether it is written */
struct fp8_xt {
    unsigned char *q;
    float *s;
    unsigned char *done;
};

/* Where X (T rows, ld wide) is one expert's rows of a kept matrix: *t, that expert's region of
 * its transpose; false where it is none */
static bool fp8_xt_of(const struct exec_gpu *g, const bf16 *X, int ld, int T, struct fp8_xt *t)
{
    for (int k = 0; g->xt.set && k < XT_N; k++) {
        const auto &m = g->xt.m[k];
        int e = ld == m.ld ? expert_at(g, m.base, g->xt.set->off, ld, X, T) : -1;
        if (e < 0) continue;
        *t = fp8_xt{m.q + m.qo[e], m.s + m.sto[e], g->xt.set->done + (size_t)k * g->experts + e};
        return true;
    }
    return false;
}

/* The fused SwiGLU backward's copies of dY (T x out, ld), if it is one expert's rows of its
 * gradients: *row the row-major operand, *tr the transposed one; false otherwise. */
static bool fp8_pre_of(const struct exec_gpu *g, const bf16 *dY, int ld, int T, int out, int e5m2,
                       struct gk_fp8_mat *row, struct gk_fp8_mat *tr)
{
    for (int k = 0; k < 2; k++) {
        if (ld != out || ld != g->ffn) continue;
        int e = expert_at(g, g->f8pre.key[k], g->f8pre.off, ld, dY, T);
        if (e < 0) continue;
        int how = g->f8.act; /* per-tensor: the region's first factor */
        *row = gk_fp8_mat{g->f8pre.q[k] + g->f8pre.qo[e], g->f8pre.s[k] + g->f8pre.so[e], out, how,
                          e5m2};
        *tr = gk_fp8_mat{g->f8pre.qt[k] + g->f8pre.qo[e], g->f8pre.st[k] + g->f8pre.sto[e],
                         exec_fp8_pad(T), how, e5m2};
        return true;
    }
    return false;
}

/* ---- the experts' amax kept by the kernels that write their rows (f8.amax_rows) ---- */

/* Layer l's kept amax of `kind` (expert e's at [e]), NULL where none is kept */
static unsigned *fp8_rows_at(const struct exec_gpu *g, int l, int kind)
{
    if (!g->f8rows || g->cfg.ep || g->moe_index[l] < 0) return NULL;
    return g->f8rows + ((size_t)g->moe_index[l] * F8_ROWS + kind) * g->experts;
}

enum moe_status gpu_fp8_rows(struct exec_gpu *g, int l, int kind, int n, const int *off_dev,
                             int cols, struct gk_amax_rows *am, const struct gk_amax_rows **out,
                             struct moe_error *err)
{
    unsigned *a = fp8_rows_at(g, l, kind);
    *out = NULL;
    if (!a) return MOE_OK;
    MOE_CUDA_CHECK(cudaMemsetAsync(a, 0, sizeof(unsigned) * (size_t)n * g->experts, g->s));
    *am = gk_amax_rows{off_dev, g->experts, cols, {a, n > 1 ? a + g->experts : NULL}};
    *out = am;
    return MOE_OK;
}

void gpu_fp8_know(struct exec_gpu *g, int l, int kind, const bf16 *base, int ld)
{
    const unsigned *a = fp8_rows_at(g, l, kind);
    if (a && g->nf8known < (int)(sizeof g->f8known / sizeof *g->f8known))
        g->f8known[g->nf8known++] = {base, ld, g->off_host[l], a};
}

bool gpu_fp8_dispatch_ok(const struct exec_gpu *g, int l, const struct act *A)
{
    return g->fp8 && g->f8xd.q && g->f8.act == EXEC_FP8_TENSOR && A->xt8[XT_X] && !g->cfg.ep &&
           !g->m.moe.probs_on_input && fp8_rows_at(g, l, F8_X) && gpu_fp8_fused_ok(g, l);
}

enum moe_status gpu_fp8_dispatch_amax(struct exec_gpu *g, int l, const struct act *A,
                                      struct moe_error *err)
{
    MOE_CUDA_CHECK(gk_fp8_expert_amax(A->b16, g->tokens, g->hidden, A->choice, g->top_k, g->experts,
                                      fp8_rows_at(g, l, F8_X), g->s));
    return MOE_OK;
}

enum moe_status gpu_fp8_dispatch(struct exec_gpu *g, int l, const struct act *A, const int *off,
                                 struct moe_error *err)
{
    int E = g->experts, h = g->hidden;
    g->f8xd.key = NULL; /* until the rows below are written */
    exec_fp8_regions(off, E, h, g->f8xd.qo, g->f8xd.so, g->f8xd.sto);
    MOE_CUDA_CHECK(gk_fp8_gather(A->b16, A->row_src, g->top_k, A->off, off, E, h,
                                 fp8_rows_at(g, l, F8_X), g->f8xd.q, g->f8xd.s, A->xt8[XT_X],
                                 A->xt8s[XT_X], g->s));
    g->f8xd.key = A->xp16, g->f8xd.off = off;
    return MOE_OK;
}

/* The permute's quantized rows (gpu_fp8_dispatch) of X (T rows, ld wide) if X is one expert's
 * rows of them: *x, its row-major operand; false otherwise */
static bool fp8_dispatched(const struct exec_gpu *g, const bf16 *X, int ld, int T, int in,
                           struct gk_fp8_mat *x)
{
    int e = g->f8xd.key && ld == g->hidden && in == ld
                ? expert_at(g, g->f8xd.key, g->f8xd.off, ld, X, T)
                : -1;
    if (e < 0) return false;
    *x = gk_fp8_mat{g->f8xd.q + g->f8xd.qo[e], g->f8xd.s + g->f8xd.so[e], in, g->f8.act, 0};
    return true;
}

/* The amax kept for X (T rows, ld wide) if it is one expert's rows of a known matrix */
static const unsigned *fp8_known(const struct exec_gpu *g, const bf16 *X, int ld, int T)
{
    for (int k = 0; k < g->nf8known; k++) {
        int e = expert_at(g, g->f8known[k].base, g->f8known[k].off, g->f8known[k].ld, X, T);
        if (e >= 0 && ld == g->f8known[k].ld) return g->f8known[k].amax + e;
    }
    return NULL;
}

/* Whether x8 keeps src (rows x cols, ld) in format e5m2 (and its transpose, t) */
static bool fp8_kept_is(const struct fp8_scratch *x8, const bf16 *src, int ld, int rows, int cols,
                        int e5m2, bool t)
{
    const struct fp8_kept *k = &x8->kept;
    return k->src == src && k->ld == ld && k->rows == rows && k->cols == cols && k->e5m2 == e5m2 &&
           (k->t || !t);
}

static void fp8_keep(struct fp8_scratch *x8, const bf16 *src, int ld, int rows, int cols, int e5m2,
                     bool t)
{
    x8->kept = fp8_kept{src, ld, rows, cols, e5m2, t};
}

static cudaStream_t stream_now(const struct exec_gpu *g)
{
    return g->cur_side < 0 ? g->s : g->side[g->cur_side];
}

static void *ws_now(const struct exec_gpu *g)
{
    return g->cur_side < 0 ? g->blas_ws : g->side_ws[g->cur_side];
}

/* gk_fp8_cast of X (rows x cols, ld) with the activations' scaling on the stream now: with
 * per-tensor scaling the amax a kernel kept for those rows where there is one (fp8_known) */
static cudaError_t fp8_cast(struct exec_gpu *g, const bf16 *X, int ld, int rows, int cols, int e5m2,
                            unsigned char *q, float *sq, unsigned char *qt, int ldt, float *sqt)
{
    const unsigned *kn = g->f8.act == EXEC_FP8_TENSOR ? fp8_known(g, X, ld, rows) : NULL;
    if (kn)
        return gk_fp8_cast_known(X, ld, rows, cols, e5m2, q, sq, qt, ldt, sqt, kn, stream_now(g));
    return gk_fp8_cast(X, ld, rows, cols, g->f8.act, e5m2, q, sq, qt, ldt, sqt,
                       fp8_scratch_now(g)->amax, stream_now(g));
}

/* fast: the forward with per-tensor scaling (Transformer Engine's and so Megatron's tensorwise
 * recipe: its forward GEMMs accumulate fast, its gradients' in split fp32) */
static enum moe_status fp8_mm(struct exec_gpu *g, const struct gk_fp8_mat *w,
                              const struct gk_fp8_mat *x, int M, int N, int K, void *y, int ldy,
                              cudaDataType yt, float beta, bool fast, struct moe_error *err)
{
    cublasStatus_t st = gk_fp8_gemm(g->f8lt, w, x, M, N, K, y, ldy, yt, beta, fast,
                                    fp8_scratch_now(g)->tail, ws_now(g), stream_now(g));
    if (st != CUBLAS_STATUS_SUCCESS)
        return moe_error_set(err, MOE_ERR_CUBLAS,
                             "executor: the fp8 GEMM %d x %d x %d (%s scaling): cuBLASLt: %s", M, N,
                             K, g->f8.act == EXEC_FP8_TENSOR ? "per-tensor" : "block",
                             cublasGetStatusString(st));
    return MOE_OK;
}

/* Y (T x out) = X (T x in) W^T, W (out x in), bf16 inputs; Y fp32 or bf16. */
enum moe_status gpu_lin(struct exec_gpu *g, const bf16 *X, int ldx, const bf16 *Wt, int T, int in,
                        int out, void *Y, int ldy, cudaDataType yt, float beta,
                        struct moe_error *err)
{
    const struct exec_fp8_slice *f = fp8_slice(g, Wt, out, in);
    if (f && T > 0) {
        MOE_CHECK(gpu_fp8_fresh(g, f->layer, f->expert, err));
        struct fp8_scratch *x8 = fp8_scratch_now(g);
        int ha = g->f8.act, hw = g->f8.weight;
        struct gk_fp8_mat w = {g->w8 + f->q, g->w8s + f->s, in, hw, 0}, x, tr;
        if (fp8_pre_of(g, X, ldx, T, in, 0, &x, &tr) || /* the fused SwiGLU's output */
            fp8_dispatched(g, X, ldx, T, in, &x)) {     /* the permute's */
            x8->kept.src = NULL;
            return fp8_mm(g, &w, &x, T, out, in, Y, ldy, yt, beta, ha == EXEC_FP8_TENSOR, err);
        }
        /* a kept matrix's expert, the first time in this forward: its transpose too, kept */
        struct fp8_xt kt;
        bool xt = g->xt.forward && fp8_xt_of(g, X, ldx, T, &kt) && !*kt.done;
        if (xt)
            MOE_CUDA_CHECK(
                fp8_cast(g, X, ldx, T, in, 0, x8->a, x8->sa, kt.q, exec_fp8_pad(T), kt.s));
        else if (!fp8_kept_is(x8, X, ldx, T, in, 0, false)) /* the gate's input is the up's */
            MOE_CUDA_CHECK(fp8_cast(g, X, ldx, T, in, 0, x8->a, x8->sa, NULL, 0, NULL));
        if (xt) *kt.done = 1;
        fp8_keep(x8, X, ldx, T, in, 0, false);
        x = gk_fp8_mat{x8->a, x8->sa, in, ha, 0};
        return fp8_mm(g, &w, &x, T, out, in, Y, ldy, yt, beta, ha == EXEC_FP8_TENSOR, err);
    }
    if (g->fp8) fp8_scratch_now(g)->kept.src = fp8_scratch_now(g)->kept_b.src = NULL;
    if (g->in_experts)
        return mm_expert(g, false, true, false, T, out, in, X, ldx, Wt, in, beta, Y, ldy,
                         CUDA_R_16BF, yt, err);
    return gpu_mm(g, false, true, T, out, in, 1.0f, X, ldx, 0, Wt, in, 0, beta, Y, ldy, 0, 1,
                  CUDA_R_16BF, yt, err);
}

/* dX (T x in, fp32 or bf16) (+)= dY (T x out) W. */
enum moe_status gpu_lin_dx(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *Wt, int T,
                           int in, int out, void *dX, int lddx, cudaDataType xt, float beta,
                           struct moe_error *err)
{
    const struct exec_fp8_slice *f = fp8_slice(g, Wt, out, in);
    if (f && T > 0) {
        MOE_CHECK(gpu_fp8_fresh(g, f->layer, f->expert, err));
        struct fp8_scratch *x8 = fp8_scratch_now(g);
        int ha = g->f8.act, hw = g->f8.weight, e5 = g->cfg.fp8_e5m2_grads, Tp = exec_fp8_pad(T);
        struct gk_fp8_mat w = {g->w8t + f->q, g->w8s + f->st, out, hw, 0},
                          x = {x8->a, x8->sa, out, ha, e5}, tr;
        if (fp8_pre_of(g, dY, lddy, T, out, e5, &x, &tr)) { /* the fused SwiGLU backward's */
            x8->kept.src = NULL;
            return fp8_mm(g, &w, &x, T, in, out, dX, lddx, xt, beta, false, err);
        }
        /* both ways at once: the weight gradient that follows takes the transpose */
        if (!fp8_kept_is(x8, dY, lddy, T, out, e5, true))
            MOE_CUDA_CHECK(fp8_cast(g, dY, lddy, T, out, e5, x8->a, x8->sa, x8->c, Tp, x8->sc));
        fp8_keep(x8, dY, lddy, T, out, e5, true);
        return fp8_mm(g, &w, &x, T, in, out, dX, lddx, xt, beta, false, err);
    }
    if (g->fp8) fp8_scratch_now(g)->kept.src = fp8_scratch_now(g)->kept_b.src = NULL;
    if (g->in_experts)
        return mm_expert(g, false, false, false, T, in, out, dY, lddy, Wt, in, beta, dX, lddx,
                         CUDA_R_16BF, xt, err);
    return gpu_mm(g, false, false, T, in, out, 1.0f, dY, lddy, 0, Wt, in, 0, beta, dX, lddx, 0, 1,
                  CUDA_R_16BF, xt, err);
}

/* dW (out x in, fp32) (+)= dY^T X: slice `slice` of tensor t's gradient (slice e: expert e of an
 * expert tensor, dW at e x out x in), overwritten by its first writer of the step, else added. */
enum moe_status gpu_lin_dw(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *X, int ldx,
                           int T, int in, int out, int t, int slice, struct moe_error *err)
{
    if (T == 0) return MOE_OK; /* nothing written: the slice stays unwritten */
    float *dW = GR(g, t) + (size_t)slice * out * in,
          beta = gpu_grad_first(g, t, slice) ? 0.0f : 1.0f;
    if (fp8_grad_slice(g, t, slice, out, in)) {
        struct fp8_scratch *x8 = fp8_scratch_now(g);
        int ha = g->f8.act, e5 = g->cfg.fp8_e5m2_grads, Tp = exec_fp8_pad(T);
        struct gk_fp8_mat row, x = {x8->a, x8->sa, Tp, ha, e5};
        bool pre = fp8_pre_of(g, dY, lddy, T, out, e5, &row, &x);        /* the fused SwiGLU's */
        bool kept = !pre && fp8_kept_is(x8, dY, lddy, T, out, e5, true); /* the data gradient's */
        if (kept) x.q = x8->c, x.sinv = x8->sc;
        if (!pre && !kept)
            MOE_CUDA_CHECK(fp8_cast(g, dY, lddy, T, out, e5, NULL, NULL, x8->a, Tp, x8->sa));
        x8->kept.src = NULL; /* a may be written over */
        struct fp8_xt kt;
        if (!g->xt.forward && fp8_xt_of(g, X, ldx, T, &kt) && *kt.done) { /* the forward's */
            struct gk_fp8_mat w = {kt.q, kt.s, Tp, ha, 0};
            return fp8_mm(g, &w, &x, out, in, Tp, dW, in, CUDA_R_32F, beta, false, err);
        }
        const struct fp8_kept *kb = &x8->kept_b;
        if (!(kb->src == X && kb->ld == ldx && kb->rows == T && kb->cols == in))
            MOE_CUDA_CHECK(fp8_cast(g, X, ldx, T, in, 0, NULL, NULL, x8->b, Tp, x8->sb));
        x8->kept_b = fp8_kept{X, ldx, T, in, 0, true};
        struct gk_fp8_mat w = {x8->b, x8->sb, Tp, ha, 0};
        return fp8_mm(g, &w, &x, out, in, Tp, dW, in, CUDA_R_32F, beta, false, err);
    }
    if (g->fp8) fp8_scratch_now(g)->kept.src = fp8_scratch_now(g)->kept_b.src = NULL;
    if (g->in_experts)
        return mm_expert(g, true, false, true, out, in, T, dY, lddy, X, ldx, beta, dW, in,
                         CUDA_R_16BF, CUDA_R_32F, err);
    return gpu_mm(g, true, false, out, in, T, 1.0f, dY, lddy, 0, X, ldx, 0, beta, dW, in, 0, 1,
                  CUDA_R_16BF, CUDA_R_32F, err);
}

enum moe_status gpu_upload(struct exec_gpu *g, void *dst, const void *src, size_t bytes,
                           struct moe_error *err)
{
    if (bytes) MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->s));
    return MOE_OK;
}

enum moe_status gpu_sync_host(struct exec_gpu *g, struct moe_error *err)
{
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    g->syncs++;
    return MOE_OK;
}

/* Expert e's GEMMs go to side stream e % nside between fork and join (one stream: no-ops). */
enum moe_status gpu_fork_experts(struct exec_gpu *g, int l, struct moe_error *err)
{
    MOE_CHECK(gpu_fp8_fresh(g, l, true, err)); /* before the streams part */
    gpu_fp8_forget(g);
    g->in_experts = true;
    if (g->nside < 2) return MOE_OK;
    MOE_CUDA_CHECK(cudaEventRecord(g->fork_ev, g->s));
    for (int i = 0; i < g->nside; i++)
        MOE_CUDA_CHECK(cudaStreamWaitEvent(g->side[i], g->fork_ev, 0));
    return MOE_OK;
}

void gpu_use_expert_stream(struct exec_gpu *g, int e)
{
    if (g->nside >= 2) {
        g->cur_side = e % g->nside;
        g->cur = g->side_blas[g->cur_side];
    }
}

enum moe_status gpu_join_experts(struct exec_gpu *g, struct moe_error *err)
{
    gpu_fp8_forget(g);
    g->cur = g->blas;
    g->cur_side = -1;
    g->in_experts = false;
    if (g->nside < 2) return MOE_OK;
    for (int i = 0; i < g->nside; i++) {
        MOE_CUDA_CHECK(cudaEventRecord(g->join_ev[i], g->side[i]));
        MOE_CUDA_CHECK(cudaStreamWaitEvent(g->s, g->join_ev[i], 0));
    }
    return MOE_OK;
}
