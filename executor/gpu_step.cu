/*
 * gpu_step.cu: the training step on one GPU: forward and backward of the whole model for a
 * micro-batch, gradient accumulation, clipping and AdamW, phase timing and memory accounting.
 *
 * It follows the reference step (ref_model.c) operation by operation, so that the gpu tests can
 * compare every gradient:
 *   embedding -> blocks [RMSNorm, attention (GQA with RoPE, or MLA), residual, RMSNorm,
 *   dense SwiGLU or the dropless MoE layer, residual] -> final RMSNorm -> LM head -> loss.
 * Precision: bf16 weights (copies of fp32 masters) and GEMM inputs, fp32 accumulation, the
 * residual stream and every activation gradient in fp32, the router entirely in fp32.
 * MoE: router GEMM, top-k (exec_route), a stable counting-sort permutation on the GPU, one
 * host sync per MoE layer for the per-expert row counts, per-expert cuBLAS GEMMs (every routed
 * (token, expert) pair is a row: nothing dropped or padded), the weighted unpermute; shared
 * experts as one SwiGLU. Attention is gpu_attention.cu's tensor-core kernel (online softmax, no
 * seq x seq matrix); its backward recomputes the probabilities from the saved log-sum-exp.
 */
#include "gpu_step.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const exec_mem_names[EXEC_MEM_N] = {"weights", "master_weights", "grads",
                                                 "optimizer", "activations", "workspace"};

/* Functions here own no resources (the struct does), so a failed call returns its error. */
#define G_CUDA(call) MOE_LIB_RETURN(MOE_ERR_CUDA, call, cudaSuccess, moe_cuda_strerror_)
#define G_BLAS(call) MOE_LIB_RETURN(MOE_ERR_CUBLAS, call, CUBLAS_STATUS_SUCCESS, moe_cublas_strerror_)
#define G_TRY(expr)                                                                                \
    do {                                                                                           \
        enum moe_status s_ = (expr);                                                               \
        if (s_ != MOE_OK) return s_;                                                               \
    } while (0)
/* A kernel launch: check it was accepted. */
#define G_LAUNCH(call)                                                                             \
    do {                                                                                           \
        call;                                                                                      \
        G_CUDA(cudaGetLastError());                                                                \
    } while (0)

enum { W_ATTN_NORM, W_WQ, W_WK, W_WV, W_WO, W_WQA, W_QA_NORM, W_WQB, W_WKVA, W_KVA_NORM, W_WKVB,
       W_FFN_NORM, W_ROUTER, W_GATE, W_UP, W_DOWN, W_SGATE, W_SUP, W_SDOWN, W_N };
static const char *const w_names[W_N] = {"attn_norm", "wq", "wk", "wv", "wo", "wqa", "qa_norm",
                                         "wqb", "wkva", "kva_norm", "wkvb", "ffn_norm", "router",
                                         "gate", "up", "down", "sgate", "sup", "sdown"};

/* What one block keeps from its forward for its backward. */
struct act {
    bf16 *a16, *q16, *k16, *v16, *o16, *cqn16, *ckvn16, *b16, *hm16, *xp16, *ehm16;
    float *rstd1, *cq32, *rstdq, *ckvf32, *rstdkv, *h1, *b32, *rstd2, *g32, *u32;
    float *logits, *weight, *eg32, *eu32, *yp32, *auxg, *lse;
    int *choice, *pos, *row_src, *off;
};

/* An expert GEMM kind: its cuBLASLt operation and the algorithm chosen for it once. */
struct lt_kind {
    bool ta, tb, vary_k;
    int fixed, N, lda, ldb, ldc; /* fixed: K when the rows vary, M when K varies */
    cudaDataType ab, ct;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulAlgo_t algo;
    bool usable;
};
#define LT_KINDS 16

/* Expert parallelism: one MoE layer's exchange, kept from its forward for its backward. Rows
 * received are hop 1's [0, n1) then hop 2's [n1, n1 + n2); the local pairs (row, slot) are in
 * expert order for the GEMMs. */
struct ep_layer {
    struct exec_ep_rows h1, h2; /* host: the rows this rank sent */
    int *in1, *in2;             /* host (ranks): rows received from each rank */
    int n1, n2, npairs;
    int *off;                   /* host (E + 1): local pairs per expert */
    /* device: per pair (expert order) its received row, weight and (row * top_k + slot); per
     * received row its pairs (CSR, slot order) and their weights; per token the hop-1 rows it
     * sent (CSR, for the returns); per hop-1 row received the hop-2 rows forwarded (CSR) */
    int *pair_row, *pair_dst, *row_off, *row_pairs, *tok_off, *tok_rows, *fwd_off, *fwd_rows;
    float *pair_w, *row_w;
};

#define MAX_EVENTS 16384
#define MAX_ALLOCS 512

struct exec_gpu {
    struct exec_ref_model table;
    struct mdl_model m;
    struct exec_gpu_cfg cfg;
    struct exec_router_cfg rc;
    int T, S, B, P, L, h, V, E, k, f, fs, fd;
    /* attention shapes */
    bool mla;
    int H, KV, dqk, dv, nope, rope, ql, kvl;
    cudaStream_t s;
    cublasHandle_t blas;      /* on s */
    void *blas_ws;
    /* expert GEMMs spread over side streams (cfg.streams > 1), forked from and joined to s */
    int nside;
    cudaStream_t side[EXEC_MAX_STREAMS];
    cublasHandle_t side_blas[EXEC_MAX_STREAMS];
    cudaEvent_t fork_ev, join_ev[EXEC_MAX_STREAMS];
    cublasHandle_t cur;       /* the handle GEMMs go to now */
    int cur_side;             /* its side stream, -1: s */
    bool in_experts;          /* between fork_experts and join_experts: lin* go to mm_expert */
    void *side_ws[EXEC_MAX_STREAMS];
    size_t ws_bytes;
    cublasLtHandle_t lt;      /* the expert GEMMs, whose sizes follow the routing */
    /* expert parallelism (cfg.ep): Pe pairs and rows_cap rows a rank may hold */
    struct ep_layer *epl;     /* (nmoe) */
    int Pe, rows_cap;
    int *ep_idx;
    struct exec_ep_meta *ep_meta_send, *ep_meta_recv;
    bf16 *ep_send16, *ep_recv16;
    float *ep_send32, *ep_recv32, *ep_part, *ep_ret, *ep_dwrows, *ep_dwret, *dwp;
    double *ep_loads;         /* (nmoe, E): the step's loads, summed over the run's ranks */
    int *choice_host;         /* pinned (P) */
    float *weight_host;       /* pinned (P) */
    struct lt_kind lt_kinds[LT_KINDS];
    int nlt;
    const int *forced_choice; /* device (T, top_k): replaces the router's choice (benchmarks) */
    /* parameters */
    float *master, *grad, *m1, *m2;
    /* ZeRO-1 (cfg.zero): this rank's shard of the flat parameters, [shard_lo, shard_hi), of
     * shard_n each rank (the last one's padded); m1 and m2 hold the shard only, master all
     * ranks x shard_n (every rank's part arrives by all-gather after each update) */
    size_t shard_lo, shard_hi, shard_n;
    bf16 *w16;
    int (*wi)[W_N];           /* per layer: tensor index of each weight, -1: none */
    int embed, final_norm, head;
    bool *decay;              /* per tensor */
    /* MoE */
    int *moe_index;           /* per layer: its index among MoE layers, -1 dense */
    int nmoe;
    float *bias;              /* (layers, E) device, selection bias */
    double *bias_host;
    int64_t *counts;          /* (nmoe, E) since creation */
    int64_t *step_load;       /* (nmoe, E) this step */
    unsigned long long *coact;/* (nmoe, E, E) device */
    int **off_host;           /* per layer (or one with recompute): E + 1 */
    /* activations */
    float **xin;              /* per layer input of the block, and xin[L] the last output */
    struct act *act;          /* per layer, or all the same with recompute */
    /* workspace */
    int *tok, *tok_in, *tgt, *perm_cnt, *perm_base;
    int *emb_dev;             /* distinct ids, offsets, positions of the micro-batch's inputs */
    int *emb_host, *emb_count; /* pinned copy of emb_dev; per-vocabulary counts (host) */
    int emb_nids;
    float *q32, *k32, *kv32, *delta, *part, *dh, *dprev, *da32, *db32, *dq32, *dk32, *dv32;
    float *dqf32, *dkv32, *dckvn32, *dckvf32, *dcqn32, *dcq32, *dhm32, *dw, *dehm32, *dxp32, *dz;
    float *scores, *rstdf, *logits, *row_loss, *dfin32, *ytmp, *yscr;
    double grad_scale;        /* of the micro-batch running */
    bf16 *dy16, *do16, *dq16, *dk16, *dv16, *dkv16, *dckvf16, *dqf16, *dcq16, *dg16,
        *du16, *dyp16, *deg16, *deu16, *fin16, *dlog16, *dh16;
    double *norm_part;
    float2 *rope_tab;         /* (S, rotated dims / 2): cos, sin */
    float *host_rows;         /* pinned: row losses */
    /* timing and accounting */
    cudaEvent_t ev[MAX_EVENTS];
    int ev_phase[MAX_EVENTS];
    int nev, ev_created;
    bool ev_overflow;
    int syncs;
    struct cost_bytes sent;   /* expert parallelism: dispatch payload this step */
    bool record_stats;        /* false in a recompute forward */
    /* gradient buckets (cfg.dp): block l's parameters are [blk_off[l], blk_off[l + 1]); the
     * last micro-batch's backward starts their all-reduce block by block */
    size_t *blk_off;
    bool buckets_ok, bucketing, started;
    int mb_done;
    double mem[EXEC_MEM_N], peak_used, dev_total;
    void *allocs[MAX_ALLOCS];
    int nallocs;
};

/* ---- small helpers ----------------------------------------------------------------------- */

static double allocated(const struct exec_gpu *g)
{
    double sum = 0.0;
    for (int k = 0; k < EXEC_MEM_N; k++) sum += g->mem[k];
    return sum;
}

/* `what` names the buffer in a failure (the code's name for it, "g->" left off). */
static enum moe_status dalloc(struct exec_gpu *g, void **p, size_t bytes, enum exec_mem cat,
                              const char *what, struct moe_error *err)
{
    *p = NULL;
    if (bytes == 0) bytes = 16;
    if (strncmp(what, "g->", 3) == 0) what += 3;
    if (g->nallocs == MAX_ALLOCS)
        return moe_error_set(err, MOE_ERR_RUNTIME, "executor: more than %d allocations", MAX_ALLOCS);
    double lim = g->cfg.mem_limit, have = allocated(g);
    if (lim > 0 && have + (double)bytes > lim)
        return moe_error_set(err, MOE_ERR_GPU_NOMEM,
                             "executor: out of GPU memory allocating %s (%s, %.3g GB): %.3g GB "
                             "allocated so far, the limit %.3g GB (--gpu-memory-limit)",
                             what, exec_mem_names[cat], bytes / 1e9, have / 1e9, lim / 1e9);
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError(); /* not sticky: clear it */
        cudaMemGetInfo(&fr, &tot);
        bool oom = e == cudaErrorMemoryAllocation;
        return moe_error_set(err, oom ? MOE_ERR_GPU_NOMEM : MOE_ERR_CUDA,
                             "executor: %scudaMalloc of %s (%s, %.3g GB): %s; %.3g GB allocated "
                             "so far, %.3g of %.3g GB free on the device",
                             oom ? "out of GPU memory: " : "", what, exec_mem_names[cat],
                             bytes / 1e9, cudaGetErrorString(e), have / 1e9, fr / 1e9, tot / 1e9);
    }
    g->allocs[g->nallocs++] = *p;
    g->mem[cat] += (double)bytes;
    G_CUDA(cudaMemsetAsync(*p, 0, bytes, g->s));
    return MOE_OK;
}

#define ALLOC(ptr, count, cat)                                                                     \
    G_TRY(dalloc(g, (void **)&(ptr), sizeof(*(ptr)) * (size_t)(count), cat, #ptr, err))

/* Mark the start of a phase (and the end of the one before); -1 ends the last. */
static enum moe_status phase(struct exec_gpu *g, int ph, struct moe_error *err)
{
    if (g->nev == MAX_EVENTS) {
        g->ev_overflow = true; /* the rest of the step counts to the last phase */
        return MOE_OK;
    }
    if (g->nev > 0 && g->ev_phase[g->nev - 1] == ph) return MOE_OK;
    if (g->nev == g->ev_created) {
        G_CUDA(cudaEventCreate(&g->ev[g->nev]));
        g->ev_created++;
    }
    G_CUDA(cudaEventRecord(g->ev[g->nev], g->s));
    g->ev_phase[g->nev++] = ph;
    return MOE_OK;
}
#define PH(p) G_TRY(phase(g, (p), err))

static float *M(const struct exec_gpu *g, int t) { return g->master + g->table.tensor[t].offset; }
static bf16 *W16(const struct exec_gpu *g, int t) { return g->w16 + g->table.tensor[t].offset; }
static float *GR(const struct exec_gpu *g, int t) { return g->grad + g->table.tensor[t].offset; }

/* Row-major C (M x N) = alpha op(A) op(B) + beta C, batched with strides; op(A) is M x K. cuBLAS
 * is column-major, so it computes C^T = op(B)^T op(A)^T with the operands swapped. */
static enum moe_status mm(struct exec_gpu *g, bool ta, bool tb, int M_, int N, int K, float alpha,
                          const void *A, int lda, long long sA, const void *B, int ldb,
                          long long sB, float beta, void *C, int ldc, long long sC, int batch,
                          cudaDataType ab, cudaDataType ct, struct moe_error *err)
{
    if (M_ == 0 || N == 0 || batch == 0) return MOE_OK;
    G_BLAS(cublasGemmStridedBatchedEx(g->cur, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M_, K, &alpha, B, ab, ldb,
                                      sB, A, ab, lda, sA, &beta, C, ct, ldc, sC, batch,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MOE_OK;
}

/* The expert GEMMs: one size (the rows M, or the reduction K of a weight gradient) changes with
 * the routing from call to call, and cuBLAS's heuristics, cached by size, then cost 100-300 us of
 * host time a call (measured on the H200 machine; 12 us for a size seen before), more than the
 * GEMM itself. So each kind of expert GEMM gets its cuBLASLt algorithm once, chosen at the mean
 * rows per expert, and reuses it for every size; a size it cannot run goes to mm(). The layouts
 * are column-major: C^T (N x M) = op(B)^T op(A)^T, as in mm(). */
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

static void lt_layouts_free(cublasLtMatrixLayout_t l[3])
{
    for (int i = 0; i < 3; i++)
        if (l[i]) cublasLtMatrixLayoutDestroy(l[i]);
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
    if (g->nlt == LT_KINDS) return MOE_OK; /* mm() for the rest */
    struct lt_kind *q = &g->lt_kinds[g->nlt++];
    *q = lt_kind{ta, tb, vary_k, fixed, N, lda, ldb, ldc, ab, ct, NULL, {}, false};
    cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    G_BLAS(cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    G_BLAS(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
    G_BLAS(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
    int mean = (g->P / (g->E > 0 ? g->E : 1) + 63) / 64 * 64;
    if (mean < 64) mean = 64;
    cublasLtMatrixLayout_t l[3];
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t r;
    int nr = 0;
    cublasStatus_t st = lt_layouts(l, ta, tb, vary_k ? M_ : mean, N, vary_k ? mean : K, lda, ldb,
                                   ldc, ab, ct);
    if (!st) st = cublasLtMatmulPreferenceCreate(&pref);
    if (!st)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &g->ws_bytes, sizeof g->ws_bytes);
    if (!st)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, q->op, l[0], l[1], l[2], l[2], pref, 1, &r, &nr);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    lt_layouts_free(l);
    if (!st && nr > 0) {
        q->algo = r.algo;
        q->usable = true;
    }
    *out = q;
    return MOE_OK;
}

/* mm() for one expert (batch 1), with M_ (or K, vary_k) the size that follows the routing. */
static enum moe_status mm_expert(struct exec_gpu *g, bool ta, bool tb, bool vary_k, int M_, int N,
                                 int K, const void *A, int lda, const void *B, int ldb, float beta,
                                 void *C, int ldc, cudaDataType ab, cudaDataType ct,
                                 struct moe_error *err)
{
    if (M_ == 0 || N == 0) return MOE_OK;
    struct lt_kind *q;
    G_TRY(lt_kind_find(g, ta, tb, vary_k, M_, N, K, lda, ldb, ldc, ab, ct, &q, err));
    if (q && q->usable) {
        cublasLtMatrixLayout_t l[3];
        float alpha = 1.0f;
        cudaStream_t st_ = g->cur_side < 0 ? g->s : g->side[g->cur_side];
        void *ws = g->cur_side < 0 ? g->blas_ws : g->side_ws[g->cur_side];
        cublasStatus_t st = lt_layouts(l, ta, tb, M_, N, K, lda, ldb, ldc, ab, ct);
        if (!st)
            st = cublasLtMatmul(g->lt, q->op, &alpha, B, l[0], A, l[1], &beta, C, l[2], C, l[2],
                                &q->algo, ws, g->ws_bytes, st_);
        lt_layouts_free(l);
        if (st == CUBLAS_STATUS_SUCCESS) return MOE_OK;
        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            return moe_error_set(err, MOE_ERR_CUBLAS, "executor: cublasLtMatmul: %s",
                                 cublasGetStatusString(st));
    }
    return mm(g, ta, tb, M_, N, K, 1.0f, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, ab, ct, err);
}

/* Y (T x out) = X (T x in) W^T, W (out x in), bf16 inputs; Y fp32 or bf16. */
static enum moe_status lin(struct exec_gpu *g, const bf16 *X, int ldx, const bf16 *Wt, int T,
                           int in, int out, void *Y, int ldy, cudaDataType yt, float beta,
                           struct moe_error *err)
{
    if (g->in_experts)
        return mm_expert(g, false, true, false, T, out, in, X, ldx, Wt, in, beta, Y, ldy,
                         CUDA_R_16BF, yt, err);
    return mm(g, false, true, T, out, in, 1.0f, X, ldx, 0, Wt, in, 0, beta, Y, ldy, 0, 1,
              CUDA_R_16BF, yt, err);
}
/* dX (T x in, fp32) (+)= dY (T x out) W. */
static enum moe_status lin_dx(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *Wt, int T,
                              int in, int out, float *dX, int lddx, float beta, struct moe_error *err)
{
    if (g->in_experts)
        return mm_expert(g, false, false, false, T, in, out, dY, lddy, Wt, in, beta, dX, lddx,
                         CUDA_R_16BF, CUDA_R_32F, err);
    return mm(g, false, false, T, in, out, 1.0f, dY, lddy, 0, Wt, in, 0, beta, dX, lddx, 0, 1,
              CUDA_R_16BF, CUDA_R_32F, err);
}
/* dW (out x in, fp32) += dY^T X. */
static enum moe_status lin_dw(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *X, int ldx,
                              int T, int in, int out, float *dW, struct moe_error *err)
{
    if (T == 0) return MOE_OK;
    if (g->in_experts)
        return mm_expert(g, true, false, true, out, in, T, dY, lddy, X, ldx, 1.0f, dW, in,
                         CUDA_R_16BF, CUDA_R_32F, err);
    return mm(g, true, false, out, in, T, 1.0f, dY, lddy, 0, X, ldx, 0, 1.0f, dW, in, 0, 1,
              CUDA_R_16BF, CUDA_R_32F, err);
}

static enum moe_status sync_host(struct exec_gpu *g, struct moe_error *err)
{
    G_CUDA(cudaStreamSynchronize(g->s));
    g->syncs++;
    return MOE_OK;
}

/* Expert e's GEMMs go to side stream e % nside between fork and join (one stream: no-ops). */
static enum moe_status fork_experts(struct exec_gpu *g, struct moe_error *err)
{
    g->in_experts = true;
    if (g->nside < 2) return MOE_OK;
    G_CUDA(cudaEventRecord(g->fork_ev, g->s));
    for (int i = 0; i < g->nside; i++) G_CUDA(cudaStreamWaitEvent(g->side[i], g->fork_ev, 0));
    return MOE_OK;
}

static void use_expert_stream(struct exec_gpu *g, int e)
{
    if (g->nside >= 2) {
        g->cur_side = e % g->nside;
        g->cur = g->side_blas[g->cur_side];
    }
}

static enum moe_status join_experts(struct exec_gpu *g, struct moe_error *err)
{
    g->cur = g->blas;
    g->cur_side = -1;
    g->in_experts = false;
    if (g->nside < 2) return MOE_OK;
    for (int i = 0; i < g->nside; i++) {
        G_CUDA(cudaEventRecord(g->join_ev[i], g->side[i]));
        G_CUDA(cudaStreamWaitEvent(g->s, g->join_ev[i], 0));
    }
    return MOE_OK;
}

static int layer_window(const struct exec_gpu *g, int l)
{
    return mdl_layer_is_sliding(&g->m, l) ? g->m.attn.sliding_window : 0;
}

/* ---- attention ----------------------------------------------------------------------------- */

static enum moe_status attn_core_forward(struct exec_gpu *g, struct act *A, int window,
                                         struct moe_error *err)
{
    G_CUDA(gk_flash_forward(A->q16, A->k16, A->v16, g->B, g->S, g->H, g->KV, g->dqk, g->dv, window,
                            A->o16, A->lse, g->s));
    return MOE_OK;
}

/* From do16 (T, H, dv): dq32 (T, H, dqk), dk32 (T, KV, dqk), dv32 (T, KV, dv). */
static enum moe_status attn_core_backward(struct exec_gpu *g, const struct act *A, int window,
                                          struct moe_error *err)
{
    G_CUDA(gk_flash_backward(A->q16, A->k16, A->v16, A->o16, g->do16, A->lse, g->B, g->S, g->H,
                             g->KV, g->dqk, g->dv, window, g->delta, g->dq32, g->dk32, g->dv32,
                             g->s));
    return MOE_OK;
}

/* Projections into q16, k16, v16 from the normed input a16, then the core. */
static enum moe_status attn_forward(struct exec_gpu *g, int l, struct act *A, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h, H = g->H, KV = g->KV, dqk = g->dqk, dv = g->dv;
    if (!g->mla) {
        G_TRY(lin(g, A->a16, h, W16(g, w[W_WQ]), T, h, H * dqk, g->q32, H * dqk, CUDA_R_32F, 0, err));
        G_TRY(lin(g, A->a16, h, W16(g, w[W_WK]), T, h, KV * dqk, g->k32, KV * dqk, CUDA_R_32F, 0, err));
        G_TRY(lin(g, A->a16, h, W16(g, w[W_WV]), T, h, KV * dv, A->v16, KV * dv, CUDA_R_16BF, 0, err));
        G_LAUNCH(gk_rope(g->q32, T, H, dqk, dqk, g->rope_tab, g->S, false, g->s));
        G_LAUNCH(gk_rope(g->k32, T, KV, dqk, dqk, g->rope_tab, g->S, false, g->s));
        G_LAUNCH(gk_to_bf16(g->q32, A->q16, (size_t)T * H * dqk, g->s));
        G_LAUNCH(gk_to_bf16(g->k32, A->k16, (size_t)T * KV * dqk, g->s));
    } else {
        int ql = g->ql, kvl = g->kvl, rope = g->rope, nope = g->nope;
        float eps = (float)g->m.norm_eps;
        if (ql) {
            G_TRY(lin(g, A->a16, h, W16(g, w[W_WQA]), T, h, ql, A->cq32, ql, CUDA_R_32F, 0, err));
            G_LAUNCH(gk_rmsnorm(A->cq32, ql, M(g, w[W_QA_NORM]), T, ql, eps, A->cqn16, ql, NULL, 0,
                                A->rstdq, g->s));
            G_TRY(lin(g, A->cqn16, ql, W16(g, w[W_WQB]), T, ql, H * dqk, g->q32, H * dqk,
                      CUDA_R_32F, 0, err));
        } else {
            G_TRY(lin(g, A->a16, h, W16(g, w[W_WQ]), T, h, H * dqk, g->q32, H * dqk, CUDA_R_32F, 0,
                      err));
        }
        G_TRY(lin(g, A->a16, h, W16(g, w[W_WKVA]), T, h, kvl + rope, A->ckvf32, kvl + rope,
                  CUDA_R_32F, 0, err));
        G_LAUNCH(gk_rmsnorm(A->ckvf32, kvl + rope, M(g, w[W_KVA_NORM]), T, kvl, eps, A->ckvn16, kvl,
                            NULL, 0, A->rstdkv, g->s));
        G_TRY(lin(g, A->ckvn16, kvl, W16(g, w[W_WKVB]), T, kvl, H * (nope + dv), g->kv32,
                  H * (nope + dv), CUDA_R_32F, 0, err));
        G_LAUNCH(gk_mla_assemble(g->q32, A->ckvf32, g->kv32, T, H, nope, rope, dv, kvl, g->rope_tab, g->S,
                                 A->q16, A->k16, A->v16, g->s));
    }
    return attn_core_forward(g, A, layer_window(g, l), err);
}

/* From do16: adds the input gradient to da32 (overwritten first) and the weight gradients. */
static enum moe_status attn_backward(struct exec_gpu *g, int l, const struct act *A,
                                     struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h, H = g->H, KV = g->KV, dqk = g->dqk, dv = g->dv;
    G_TRY(attn_core_backward(g, A, layer_window(g, l), err));
    if (!g->mla) {
        G_LAUNCH(gk_rope(g->dq32, T, H, dqk, dqk, g->rope_tab, g->S, true, g->s));
        G_LAUNCH(gk_rope(g->dk32, T, KV, dqk, dqk, g->rope_tab, g->S, true, g->s));
        G_LAUNCH(gk_to_bf16(g->dq32, g->dq16, (size_t)T * H * dqk, g->s));
        G_LAUNCH(gk_to_bf16(g->dk32, g->dk16, (size_t)T * KV * dqk, g->s));
        G_LAUNCH(gk_to_bf16(g->dv32, g->dv16, (size_t)T * KV * dv, g->s));
        G_TRY(lin_dx(g, g->dq16, H * dqk, W16(g, w[W_WQ]), T, h, H * dqk, g->da32, h, 0, err));
        G_TRY(lin_dx(g, g->dk16, KV * dqk, W16(g, w[W_WK]), T, h, KV * dqk, g->da32, h, 1, err));
        G_TRY(lin_dx(g, g->dv16, KV * dv, W16(g, w[W_WV]), T, h, KV * dv, g->da32, h, 1, err));
        G_TRY(lin_dw(g, g->dq16, H * dqk, A->a16, h, T, h, H * dqk, GR(g, w[W_WQ]), err));
        G_TRY(lin_dw(g, g->dk16, KV * dqk, A->a16, h, T, h, KV * dqk, GR(g, w[W_WK]), err));
        G_TRY(lin_dw(g, g->dv16, KV * dv, A->a16, h, T, h, KV * dv, GR(g, w[W_WV]), err));
        return MOE_OK;
    }
    int ql = g->ql, kvl = g->kvl, rope = g->rope, nope = g->nope;
    G_LAUNCH(gk_mla_disassemble(g->dq32, g->dk32, g->dv32, T, H, nope, rope, dv, kvl, g->rope_tab, g->S,
                                g->dqf32, g->dkv32, g->dckvf32, g->s));
    G_LAUNCH(gk_to_bf16(g->dkv32, g->dkv16, (size_t)T * H * (nope + dv), g->s));
    G_TRY(lin_dx(g, g->dkv16, H * (nope + dv), W16(g, w[W_WKVB]), T, kvl, H * (nope + dv),
                 g->dckvn32, kvl, 0, err));
    G_TRY(lin_dw(g, g->dkv16, H * (nope + dv), A->ckvn16, kvl, T, kvl, H * (nope + dv),
                 GR(g, w[W_WKVB]), err));
    G_LAUNCH(gk_rmsnorm_backward(A->ckvf32, kvl + rope, M(g, w[W_KVA_NORM]), A->rstdkv, g->dckvn32,
                                 kvl, NULL, 0, g->dckvf32, kvl + rope, T, kvl, g->s));
    G_LAUNCH(gk_colsum(g->dckvn32, kvl, A->ckvf32, kvl + rope, A->rstdkv, T, kvl, g->part,
                       GR(g, w[W_KVA_NORM]), true, g->s));
    G_LAUNCH(gk_to_bf16(g->dckvf32, g->dckvf16, (size_t)T * (kvl + rope), g->s));
    G_TRY(lin_dx(g, g->dckvf16, kvl + rope, W16(g, w[W_WKVA]), T, h, kvl + rope, g->da32, h, 0, err));
    G_TRY(lin_dw(g, g->dckvf16, kvl + rope, A->a16, h, T, h, kvl + rope, GR(g, w[W_WKVA]), err));
    G_LAUNCH(gk_to_bf16(g->dqf32, g->dqf16, (size_t)T * H * dqk, g->s));
    if (ql) {
        G_TRY(lin_dx(g, g->dqf16, H * dqk, W16(g, w[W_WQB]), T, ql, H * dqk, g->dcqn32, ql, 0, err));
        G_TRY(lin_dw(g, g->dqf16, H * dqk, A->cqn16, ql, T, ql, H * dqk, GR(g, w[W_WQB]), err));
        G_LAUNCH(gk_rmsnorm_backward(A->cq32, ql, M(g, w[W_QA_NORM]), A->rstdq, g->dcqn32, ql, NULL,
                                     0, g->dcq32, ql, T, ql, g->s));
        G_LAUNCH(gk_colsum(g->dcqn32, ql, A->cq32, ql, A->rstdq, T, ql, g->part,
                           GR(g, w[W_QA_NORM]), true, g->s));
        G_LAUNCH(gk_to_bf16(g->dcq32, g->dcq16, (size_t)T * ql, g->s));
        G_TRY(lin_dx(g, g->dcq16, ql, W16(g, w[W_WQA]), T, h, ql, g->da32, h, 1, err));
        G_TRY(lin_dw(g, g->dcq16, ql, A->a16, h, T, h, ql, GR(g, w[W_WQA]), err));
    } else {
        G_TRY(lin_dx(g, g->dqf16, H * dqk, W16(g, w[W_WQ]), T, h, H * dqk, g->da32, h, 1, err));
        G_TRY(lin_dw(g, g->dqf16, H * dqk, A->a16, h, T, h, H * dqk, GR(g, w[W_WQ]), err));
    }
    return MOE_OK;
}

/* ---- FFN: dense SwiGLU, MoE ------------------------------------------------------------------ */

/* y += down(silu(gate x) * up x) for T rows of width F (saving g32, u32, hm16). */
static enum moe_status swiglu_forward(struct exec_gpu *g, const bf16 *x, int T, int F,
                                      const bf16 *Wg, const bf16 *Wu, const bf16 *Wd, float *g32,
                                      float *u32, bf16 *hm16, float *y, struct moe_error *err)
{
    int h = g->h;
    G_TRY(lin(g, x, h, Wg, T, h, F, g32, F, CUDA_R_32F, 0, err));
    G_TRY(lin(g, x, h, Wu, T, h, F, u32, F, CUDA_R_32F, 0, err));
    G_LAUNCH(gk_swiglu(g32, u32, hm16, (size_t)T * F, g->s));
    return lin(g, hm16, F, Wd, T, F, h, y, h, CUDA_R_32F, 1.0f, err);
}

/* Backward of swiglu_forward for dy16: dx (+)= (beta), weight gradients +=. */
static enum moe_status swiglu_backward(struct exec_gpu *g, const bf16 *x, const bf16 *dy16, int T,
                                       int F, const bf16 *Wg, const bf16 *Wu, const bf16 *Wd,
                                       const float *g32, const float *u32, const bf16 *hm16,
                                       float *dWg, float *dWu, float *dWd, float *dx, float beta,
                                       struct moe_error *err)
{
    int h = g->h;
    if (T == 0) return MOE_OK;
    G_TRY(lin_dx(g, dy16, h, Wd, T, F, h, g->dhm32, F, 0, err));
    G_TRY(lin_dw(g, dy16, h, hm16, F, T, F, h, dWd, err));
    G_LAUNCH(gk_swiglu_backward(g32, u32, g->dhm32, g->dg16, g->du16, (size_t)T * F, g->s));
    G_TRY(lin_dx(g, g->dg16, F, Wg, T, h, F, dx, h, beta, err));
    G_TRY(lin_dx(g, g->du16, F, Wu, T, h, F, dx, h, 1.0f, err));
    G_TRY(lin_dw(g, g->dg16, F, x, h, T, h, F, dWg, err));
    return lin_dw(g, g->du16, F, x, h, T, h, F, dWu, err);
}

/* The expert block on the permuted rows xp16 (expert e: rows off[e] .. off[e+1]): gate and up
 * GEMMs, SwiGLU, down GEMM into yp32; an expert with no rows launches nothing. */
static enum moe_status experts_forward(struct exec_gpu *g, int l, struct act *A, const int *off,
                                       struct moe_error *err)
{
    const int *w = g->wi[l];
    int h = g->h, E = g->E, f = g->f;
    G_TRY(fork_experts(g, err));
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        use_expert_stream(g, e);
        G_TRY(lin(g, A->xp16 + (size_t)off[e] * h, h, W16(g, w[W_GATE]) + (size_t)e * f * h, n, h,
                  f, A->eg32 + (size_t)off[e] * f, f, CUDA_R_32F, 0, err));
        G_TRY(lin(g, A->xp16 + (size_t)off[e] * h, h, W16(g, w[W_UP]) + (size_t)e * f * h, n, h, f,
                  A->eu32 + (size_t)off[e] * f, f, CUDA_R_32F, 0, err));
    }
    G_TRY(join_experts(g, err));
    G_LAUNCH(gk_swiglu(A->eg32, A->eu32, A->ehm16, (size_t)off[E] * f, g->s));
    G_TRY(fork_experts(g, err));
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        use_expert_stream(g, e);
        G_TRY(lin(g, A->ehm16 + (size_t)off[e] * f, f, W16(g, w[W_DOWN]) + (size_t)e * h * f, n, f,
                  h, A->yp32 + (size_t)off[e] * h, h, CUDA_R_32F, 0, err));
    }
    return join_experts(g, err);
}

/* Its backward from dyp16: dxp32 and the expert weight gradients. */
static enum moe_status experts_backward(struct exec_gpu *g, int l, const struct act *A,
                                        const int *off, struct moe_error *err)
{
    const int *w = g->wi[l];
    int h = g->h, E = g->E, f = g->f;
    G_TRY(fork_experts(g, err));
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        size_t o = off[e];
        use_expert_stream(g, e);
        G_TRY(lin_dx(g, g->dyp16 + o * h, h, W16(g, w[W_DOWN]) + (size_t)e * h * f, n, f, h,
                     g->dehm32 + o * f, f, 0, err));
        G_TRY(lin_dw(g, g->dyp16 + o * h, h, A->ehm16 + o * f, f, n, f, h,
                     GR(g, w[W_DOWN]) + (size_t)e * h * f, err));
    }
    G_TRY(join_experts(g, err));
    G_LAUNCH(gk_swiglu_backward(A->eg32, A->eu32, g->dehm32, g->deg16, g->deu16, (size_t)off[E] * f,
                                g->s));
    G_TRY(fork_experts(g, err));
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        size_t o = off[e];
        use_expert_stream(g, e);
        G_TRY(lin_dx(g, g->deg16 + o * f, f, W16(g, w[W_GATE]) + (size_t)e * f * h, n, h, f,
                     g->dxp32 + o * h, h, 0, err));
        G_TRY(lin_dx(g, g->deu16 + o * f, f, W16(g, w[W_UP]) + (size_t)e * f * h, n, h, f,
                     g->dxp32 + o * h, h, 1, err));
        G_TRY(lin_dw(g, g->deg16 + o * f, f, A->xp16 + o * h, h, n, h, f,
                     GR(g, w[W_GATE]) + (size_t)e * f * h, err));
        G_TRY(lin_dw(g, g->deu16 + o * f, f, A->xp16 + o * h, h, n, h, f,
                     GR(g, w[W_UP]) + (size_t)e * f * h, err));
    }
    return join_experts(g, err);
}

/* ---- expert parallelism ------------------------------------------------------------------- */

/* A transport call on this rank's finished work; a dispatch larger than the buffers is refused
 * (never dropped). */
static enum moe_status ep_check_rows(const struct exec_gpu *g, int n, const char *what,
                                     struct moe_error *err)
{
    if (n <= g->rows_cap) return MOE_OK;
    return moe_error_set(err, MOE_ERR_RUNTIME,
                         "expert parallelism: rank %d would hold %d %s, its buffers %d; no row is "
                         "dropped: the step stops (a larger ep_buffer_factor, or fewer tokens per "
                         "micro-batch, fit)",
                         g->cfg.ep->rank, n, what, g->rows_cap);
}

/* Counts and metadata of `r` out; what arrives: in (ranks), *n_in rows, their metadata (host,
 * malloc'd into *meta). */
static enum moe_status ep_meta_out(struct exec_gpu *g, const struct exec_ep_rows *r, int *in,
                                   int *n_in, struct exec_ep_meta **meta, struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    G_TRY(ep_check_rows(g, r->n, "rows to send", err));
    G_TRY(t->ops->counts(t, r->count, in, err));
    int n = 0;
    for (int s = 0; s < t->ranks; s++) n += in[s];
    G_TRY(ep_check_rows(g, n, "received rows", err));
    if (r->n)
        G_CUDA(cudaMemcpyAsync(g->ep_meta_send, r->meta, sizeof *r->meta * (size_t)r->n,
                               cudaMemcpyHostToDevice, g->s));
    G_TRY(sync_host(g, err));
    G_TRY(t->ops->alltoallv(t, g->ep_meta_send, r->count, g->ep_meta_recv, in, sizeof *r->meta,
                            err));
    *meta = (struct exec_ep_meta *)malloc(sizeof **meta * (size_t)(n ? n : 1));
    if (!*meta) return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    if (n)
        G_CUDA(cudaMemcpy(*meta, g->ep_meta_recv, sizeof **meta * (size_t)n,
                          cudaMemcpyDeviceToHost));
    *n_in = n;
    return MOE_OK;
}

/* Rows of src (bf16 or fp32, width h) picked by r->src_row go out; they arrive in recv. */
static enum moe_status ep_rows_out(struct exec_gpu *g, const struct exec_ep_rows *r,
                                   const int *in, const void *src, bool f32, void *recv,
                                   struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    int h = g->h;
    if (r->n) {
        G_CUDA(cudaMemcpyAsync(g->ep_idx, r->src_row, sizeof(int) * (size_t)r->n,
                               cudaMemcpyHostToDevice, g->s));
        if (f32)
            G_LAUNCH(gk_rows_gather32((const float *)src, g->ep_idx, r->n, h, g->ep_send32, g->s));
        else
            G_LAUNCH(gk_gather((const bf16 *)src, g->ep_idx, 1, r->n, h, g->ep_send16, g->s));
    }
    G_TRY(sync_host(g, err));
    return t->ops->alltoallv(t, f32 ? (const void *)g->ep_send32 : (const void *)g->ep_send16,
                             r->count, recv, in, (f32 ? sizeof(float) : sizeof(bf16)) * (size_t)h,
                             err);
}

/* The way back: rows of back (width floats), in the order received, return to their senders and
 * arrive in got in the order sent. */
static enum moe_status ep_rows_back(struct exec_gpu *g, const struct exec_ep_rows *r,
                                    const int *in, const float *back, int width, float *got,
                                    struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    G_TRY(sync_host(g, err));
    return t->ops->alltoallv(t, back, in, got, r->count, sizeof(float) * (size_t)width, err);
}

static enum moe_status ep_upload(struct exec_gpu *g, void *dst, const void *src, size_t bytes,
                                 struct moe_error *err)
{
    if (bytes) G_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->s));
    return MOE_OK;
}

/* The EP group of MoE layer mi (the mi-th MoE layer). */
static const struct exec_ep_group *ep_group_of(const struct exec_gpu *g, int mi)
{
    return g->cfg.ep_group + (g->cfg.ep_groups > 1 ? mi : 0);
}

/* From the received metadata: the local pairs in expert order, and every CSR of the layer. */
static enum moe_status ep_index(struct exec_gpu *g, struct ep_layer *L,
                                const struct exec_ep_meta *m1, const struct exec_ep_meta *m2,
                                struct moe_error *err)
{
    const struct exec_ep_group *eg = ep_group_of(g, (int)(L - g->epl));
    int me = g->cfg.ep->rank, E = g->E, k = g->k, T = g->T, rows = L->n1 + L->n2;
    int np = 0;
    for (int r = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        for (int j = 0; j < k; j++) np += exec_ep_slot_here(eg, me, m, j);
    }
    if (np > g->Pe)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "expert parallelism: rank %d would compute %d pairs, its buffers %d",
                             me, np, g->Pe);
    size_t ni = (size_t)(np ? np : 1);
    int *pair_row = (int *)malloc(sizeof(int) * ni), *pair_dst = (int *)malloc(sizeof(int) * ni);
    int *row_pairs = (int *)malloc(sizeof(int) * ni);
    int *row_off = (int *)calloc((size_t)rows + 1, sizeof(int));
    int *tok_off = (int *)calloc((size_t)T + 1, sizeof(int));
    int *tok_rows = (int *)malloc(sizeof(int) * (size_t)(L->h1.n ? L->h1.n : 1));
    int *fwd_off = (int *)calloc((size_t)L->n1 + 1, sizeof(int));
    int *fwd_rows = (int *)malloc(sizeof(int) * (size_t)(L->h2.n ? L->h2.n : 1));
    float *pair_w = (float *)malloc(sizeof(float) * ni);
    float *row_w = (float *)malloc(sizeof(float) * ni);
    int *at = (int *)calloc((size_t)E + 1, sizeof(int));
    int *next = (int *)malloc(sizeof(int) * ((size_t)T + 1));
    int *nf = (int *)malloc(sizeof(int) * ((size_t)L->n1 + 1));
    enum moe_status st = MOE_OK;
    if (!pair_row || !pair_dst || !row_pairs || !row_off || !tok_off || !tok_rows || !fwd_off ||
        !fwd_rows || !pair_w || !row_w || !at || !next || !nf) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done;
    }
    /* expert order: a stable counting sort of the (row, slot) pairs */
    memset(L->off, 0, sizeof(int) * ((size_t)E + 1));
    for (int r = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        for (int j = 0; j < k; j++)
            if (exec_ep_slot_here(eg, me, m, j)) L->off[m->expert[j] + 1]++;
    }
    for (int e = 0; e < E; e++) L->off[e + 1] += L->off[e];
    memcpy(at, L->off, sizeof(int) * (size_t)E);
    for (int r = 0, q = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        row_off[r] = q;
        for (int j = 0; j < k; j++) {
            if (!exec_ep_slot_here(eg, me, m, j)) continue;
            int p = at[m->expert[j]]++;
            pair_row[p] = r;
            pair_dst[p] = r * k + j;
            pair_w[p] = (float)m->weight[j];
            row_pairs[q] = p;
            row_w[q++] = (float)m->weight[j];
        }
        row_off[r + 1] = q;
    }
    /* the returns: a token's hop-1 rows, a hop-1 row's forwards, each in the order sent */
    for (int i = 0; i < L->h1.n; i++) tok_off[L->h1.src_row[i] + 1]++;
    for (int t = 0; t < T; t++) tok_off[t + 1] += tok_off[t];
    memcpy(next, tok_off, sizeof(int) * ((size_t)T + 1));
    for (int i = 0; i < L->h1.n; i++) tok_rows[next[L->h1.src_row[i]]++] = i;
    for (int i = 0; i < L->h2.n; i++) fwd_off[L->h2.src_row[i] + 1]++;
    for (int r = 0; r < L->n1; r++) fwd_off[r + 1] += fwd_off[r];
    memcpy(nf, fwd_off, sizeof(int) * ((size_t)L->n1 + 1));
    for (int i = 0; i < L->h2.n; i++) fwd_rows[nf[L->h2.src_row[i]]++] = i;
    L->npairs = np;
    if ((st = ep_upload(g, L->pair_row, pair_row, sizeof(int) * (size_t)np, err)) ||
        (st = ep_upload(g, L->pair_dst, pair_dst, sizeof(int) * (size_t)np, err)) ||
        (st = ep_upload(g, L->pair_w, pair_w, sizeof(float) * (size_t)np, err)) ||
        (st = ep_upload(g, L->row_pairs, row_pairs, sizeof(int) * (size_t)np, err)) ||
        (st = ep_upload(g, L->row_w, row_w, sizeof(float) * (size_t)np, err)) ||
        (st = ep_upload(g, L->row_off, row_off, sizeof(int) * ((size_t)rows + 1), err)) ||
        (st = ep_upload(g, L->tok_off, tok_off, sizeof(int) * ((size_t)T + 1), err)) ||
        (st = ep_upload(g, L->tok_rows, tok_rows, sizeof(int) * (size_t)L->h1.n, err)) ||
        (st = ep_upload(g, L->fwd_off, fwd_off, sizeof(int) * ((size_t)L->n1 + 1), err)) ||
        (st = ep_upload(g, L->fwd_rows, fwd_rows, sizeof(int) * (size_t)L->h2.n, err)))
        goto done;
    st = sync_host(g, err); /* the host arrays are freed next */
done:
    free(pair_row), free(pair_dst), free(row_pairs), free(row_off), free(tok_off), free(tok_rows);
    free(fwd_off), free(fwd_rows), free(pair_w), free(row_w), free(at), free(next), free(nf);
    return st;
}

/* The EP forward of MoE layer l from this rank's routing (choice_host, weight_host): dispatch,
 * the local experts, the weighted sums per row, the way back; y += the routed experts' output. */
static enum moe_status ep_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                                  struct moe_error *err)
{
    const struct exec_ep_group *eg = ep_group_of(g, g->moe_index[l]);
    struct ep_layer *L = &g->epl[g->moe_index[l]];
    int me = g->cfg.ep->rank, T = g->T, h = g->h, P = g->P;
    double *wd = (double *)malloc(sizeof(double) * (size_t)P);
    if (!wd) return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    for (int i = 0; i < P; i++) wd[i] = g->weight_host[i];
    exec_ep_rows_free(&L->h1);
    exec_ep_rows_free(&L->h2);
    enum moe_status st = exec_ep_first_hop(eg, me, g->choice_host, wd, T, &L->h1, err);
    free(wd);
    if (st != MOE_OK) return st;
    struct exec_ep_meta *m1 = NULL, *m2 = NULL;
    PH(COST_DISPATCH);
    if ((st = ep_meta_out(g, &L->h1, L->in1, &L->n1, &m1, err))) goto done;
    if ((st = ep_rows_out(g, &L->h1, L->in1, A->b16, false, g->ep_recv16, err))) goto done;
    if ((st = exec_ep_second_hop(eg, me, m1, L->n1, &L->h2, err))) goto done;
    if ((st = ep_meta_out(g, &L->h2, L->in2, &L->n2, &m2, err))) goto done;
    if ((st = ep_check_rows(g, L->n1 + L->n2, "received rows", err))) goto done;
    if ((st = ep_rows_out(g, &L->h2, L->in2, g->ep_recv16, false,
                          g->ep_recv16 + (size_t)L->n1 * h, err)))
        goto done;
    if ((st = ep_index(g, L, m1, m2, err))) goto done;
    if (g->record_stats) { /* not the recompute forward's */
        exec_ep_rows_bytes(eg, me, &L->h1, sizeof(bf16) * (double)h, &g->sent);
        exec_ep_rows_bytes(eg, me, &L->h2, sizeof(bf16) * (double)h, &g->sent);
    }
    PH(COST_EXPERTS_FWD);
    if (L->npairs) {
        G_LAUNCH(gk_gather(g->ep_recv16, L->pair_row, 1, L->npairs, h, A->xp16, g->s));
        if ((st = experts_forward(g, l, A, L->off, err))) goto done;
    }
    PH(COST_COMBINE);
    G_LAUNCH(gk_rows_csr(g->ep_part, A->yp32, L->row_pairs, L->row_w, L->row_off, L->n1 + L->n2,
                         h, false, g->s));
    if ((st = ep_rows_back(g, &L->h2, L->in2, g->ep_part + (size_t)L->n1 * h, h, g->ep_ret, err)))
        goto done;
    G_LAUNCH(gk_rows_csr(g->ep_part, g->ep_ret, L->fwd_rows, NULL, L->fwd_off, L->n1, h, true,
                         g->s));
    if ((st = ep_rows_back(g, &L->h1, L->in1, g->ep_part, h, g->ep_ret, err))) goto done;
    G_LAUNCH(gk_rows_csr(y, g->ep_ret, L->tok_rows, NULL, L->tok_off, T, h, true, g->s));
done:
    free(m1);
    free(m2);
    return st;
}

/* Its backward from dh (the layer output's gradient, fp32): dy rows out along the same rows, at
 * the experts d expert_out and dw per pair, the experts' backward, [dx, dw] back per row; db32
 * (+)= dx, and g->dw (T, top_k) for the router. */
static enum moe_status ep_backward(struct exec_gpu *g, int l, const struct act *A,
                                   struct moe_error *err)
{
    struct ep_layer *L = &g->epl[g->moe_index[l]];
    int T = g->T, h = g->h, k = g->k, rows = L->n1 + L->n2;
    PH(COST_COMBINE);
    G_TRY(ep_rows_out(g, &L->h1, L->in1, g->dh, true, g->ep_recv32, err));
    G_TRY(ep_rows_out(g, &L->h2, L->in2, g->ep_recv32, true, g->ep_recv32 + (size_t)L->n1 * h,
                      err));
    PH(COST_EXPERTS_BWD);
    if (L->npairs) {
        G_LAUNCH(gk_pairs_backward(g->ep_recv32, L->pair_row, L->pair_w, A->yp32, L->npairs, h,
                                   g->dyp16, g->dwp, g->s));
        G_TRY(experts_backward(g, l, A, L->off, err));
    }
    PH(COST_DISPATCH);
    G_LAUNCH(gk_rows_csr(g->ep_part, g->dxp32, L->row_pairs, NULL, L->row_off, rows, h, false,
                         g->s));
    if (rows) G_CUDA(cudaMemsetAsync(g->ep_dwrows, 0, sizeof(float) * (size_t)rows * k, g->s));
    G_LAUNCH(gk_scatter(g->dwp, L->pair_dst, L->npairs, g->ep_dwrows, g->s));
    G_TRY(ep_rows_back(g, &L->h2, L->in2, g->ep_part + (size_t)L->n1 * h, h, g->ep_ret, err));
    G_LAUNCH(gk_rows_csr(g->ep_part, g->ep_ret, L->fwd_rows, NULL, L->fwd_off, L->n1, h, true,
                         g->s));
    G_TRY(ep_rows_back(g, &L->h2, L->in2, g->ep_dwrows + (size_t)L->n1 * k, k, g->ep_dwret, err));
    G_LAUNCH(gk_rows_csr(g->ep_dwrows, g->ep_dwret, L->fwd_rows, NULL, L->fwd_off, L->n1, k, true,
                         g->s));
    G_TRY(ep_rows_back(g, &L->h1, L->in1, g->ep_part, h, g->ep_ret, err));
    G_LAUNCH(gk_rows_csr(g->db32, g->ep_ret, L->tok_rows, NULL, L->tok_off, T, h, g->fs > 0,
                         g->s));
    G_TRY(ep_rows_back(g, &L->h1, L->in1, g->ep_dwrows, k, g->ep_dwret, err));
    G_LAUNCH(gk_rows_csr(g->dw, g->ep_dwret, L->tok_rows, NULL, L->tok_off, T, k, false, g->s));
    return MOE_OK;
}

/* The dropless MoE layer on b16 / b32 (T rows), adding into y. */
static enum moe_status moe_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                                   struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h, E = g->E, k = g->k, P = g->P, mi = g->moe_index[l];
    int *off = g->off_host[l];
    PH(COST_ROUTER);
    G_TRY(mm(g, false, true, T, E, h, 1.0f, A->b32, h, 0, M(g, w[W_ROUTER]), h, 0, 0.0f, A->logits,
             E, 0, 1, CUDA_R_32F, CUDA_R_32F, err));
    G_TRY(exec_route(&g->rc, A->logits, g->bias + (size_t)l * E, T, A->choice, A->weight, g->s, err));
    if (g->forced_choice)
        G_CUDA(cudaMemcpyAsync(A->choice, g->forced_choice, sizeof(int) * (size_t)P,
                               cudaMemcpyDeviceToDevice, g->s));
    if (g->record_stats)
        G_LAUNCH(gk_coactivation(A->choice, T, k, E, g->coact + (size_t)mi * E * E, g->s));
    PH(COST_PERMUTE);
    G_LAUNCH(gk_permute_count(A->choice, P, E, g->perm_cnt, g->perm_base, A->off, g->s));
    G_CUDA(cudaMemcpyAsync(off, A->off, sizeof(int) * (E + 1), cudaMemcpyDeviceToHost, g->s));
    if (!g->cfg.ep) { /* with EP the exchange places the rows (ep_forward) */
        G_LAUNCH(gk_permute_place(A->choice, P, E, g->perm_base, A->off, A->row_src, A->pos, g->s));
        G_LAUNCH(gk_gather(A->b16, A->row_src, k, P, h, A->xp16, g->s));
    } else { /* the counts stay: the load statistics and the load-balance loss read them */
        G_CUDA(cudaMemcpyAsync(g->choice_host, A->choice, sizeof(int) * (size_t)P,
                               cudaMemcpyDeviceToHost, g->s));
        G_CUDA(cudaMemcpyAsync(g->weight_host, A->weight, sizeof(float) * (size_t)P,
                               cudaMemcpyDeviceToHost, g->s));
    }
    G_TRY(sync_host(g, err)); /* the per-expert row counts decide the GEMM shapes */
    if (off[E] != P)
        return moe_error_set(err, MOE_ERR_RUNTIME, "executor: layer %d permuted %d of %d rows", l,
                             off[E], P);
    if (g->record_stats)
        for (int e = 0; e < E; e++) {
            g->counts[(size_t)mi * E + e] += off[e + 1] - off[e];
            g->step_load[(size_t)mi * E + e] += off[e + 1] - off[e];
        }
    if (g->rc.aux_coef != 0.0) {
        /* d aux / d s_te = coef * E * f_e / T, f_e the fraction of pairs on e; aux itself needs
         * the mean scores, summed on the GPU in a fixed order */
        float auxg[GK_MAX_EXPERTS];
        for (int e = 0; e < E; e++)
            auxg[e] = (float)(g->grad_scale * g->rc.aux_coef * E * ((double)(off[e + 1] - off[e]) / P) / T);
        G_CUDA(cudaMemcpyAsync(A->auxg, auxg, sizeof(float) * E, cudaMemcpyHostToDevice, g->s));
        G_CUDA(cudaStreamSynchronize(g->s));
    }
    if (g->cfg.ep) {
        G_TRY(ep_forward(g, l, A, y, err));
    } else {
        PH(COST_EXPERTS_FWD);
        G_TRY(experts_forward(g, l, A, off, err));
        PH(COST_UNPERMUTE);
        G_LAUNCH(gk_combine(y, A->yp32, A->weight, A->pos, T, k, h, g->s));
    }
    if (g->fs) {
        PH(COST_SHARED_EXPERT);
        G_TRY(swiglu_forward(g, A->b16, T, g->fs, W16(g, w[W_SGATE]), W16(g, w[W_SUP]),
                             W16(g, w[W_SDOWN]), A->g32, A->u32, A->hm16, y, err));
    }
    return MOE_OK;
}

/* The load-balance loss of MoE layer l from its saved routing (one host sync). */
static enum moe_status moe_aux_loss(struct exec_gpu *g, int l, const struct act *A, double *aux,
                                    struct moe_error *err)
{
    int T = g->T, E = g->E, P = g->P;
    const int *off = g->off_host[l];
    G_LAUNCH(gk_scores(&g->rc, A->logits, T, g->scores, g->s));
    G_LAUNCH(gk_colsum(g->scores, E, NULL, 0, NULL, T, E, g->part, g->ytmp, false, g->s));
    float sums[GK_MAX_EXPERTS];
    G_CUDA(cudaMemcpyAsync(sums, g->ytmp, sizeof(float) * E, cudaMemcpyDeviceToHost, g->s));
    G_TRY(sync_host(g, err));
    double a = 0.0;
    for (int e = 0; e < E; e++) a += (double)(off[e + 1] - off[e]) / P * sums[e] / T;
    *aux += g->rc.aux_coef * E * a;
    return MOE_OK;
}

/* Backward of the MoE layer for dy16 / dy (fp32): db32 = d input, weight gradients +=. */
static enum moe_status moe_backward(struct exec_gpu *g, int l, const struct act *A,
                                    struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h, E = g->E, k = g->k;
    const int *off = g->off_host[l];
    if (g->fs) {
        PH(COST_SHARED_EXPERT);
        G_TRY(swiglu_backward(g, A->b16, g->dy16, T, g->fs, W16(g, w[W_SGATE]), W16(g, w[W_SUP]),
                              W16(g, w[W_SDOWN]), A->g32, A->u32, A->hm16, GR(g, w[W_SGATE]),
                              GR(g, w[W_SUP]), GR(g, w[W_SDOWN]), g->db32, 0.0f, err));
    }
    if (g->cfg.ep) {
        G_TRY(ep_backward(g, l, A, err));
    } else {
        PH(COST_UNPERMUTE);
        G_LAUNCH(gk_combine_backward(g->dh, A->yp32, A->weight, A->pos, T, k, h, g->dyp16, g->dw,
                                     g->s));
        PH(COST_EXPERTS_BWD);
        G_TRY(experts_backward(g, l, A, off, err));
        PH(COST_PERMUTE);
        G_LAUNCH(gk_gather_sum(g->dxp32, A->pos, T, k, h, g->db32, g->fs > 0, g->s));
    }
    PH(COST_ROUTER);
    G_LAUNCH(gk_router_backward(&g->rc, A->logits, A->choice, A->weight, g->dw,
                                g->rc.aux_coef != 0.0 ? A->auxg : NULL, T, g->dz, g->s));
    G_TRY(mm(g, true, false, E, h, T, 1.0f, g->dz, E, 0, A->b32, h, 0, 1.0f, GR(g, w[W_ROUTER]), h,
             0, 1, CUDA_R_32F, CUDA_R_32F, err));
    return mm(g, false, false, T, h, E, 1.0f, g->dz, E, 0, M(g, w[W_ROUTER]), h, 0, 1.0f, g->db32,
              h, 0, 1, CUDA_R_32F, CUDA_R_32F, err);
}

/* ---- blocks ------------------------------------------------------------------------------- */

static enum moe_status block_forward(struct exec_gpu *g, int l, const float *x, float *y,
                                     struct act *A, double *aux, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h;
    size_t th = (size_t)T * h;
    float eps = (float)g->m.norm_eps;
    bool moe = g->moe_index[l] >= 0;
    PH(COST_ATTN_FWD);
    G_LAUNCH(gk_rmsnorm(x, h, M(g, w[W_ATTN_NORM]), T, h, eps, A->a16, h, NULL, 0, A->rstd1, g->s));
    G_TRY(attn_forward(g, l, A, err));
    G_CUDA(cudaMemcpyAsync(A->h1, x, th * sizeof(float), cudaMemcpyDeviceToDevice, g->s));
    G_TRY(lin(g, A->o16, g->H * g->dv, W16(g, w[W_WO]), T, g->H * g->dv, h, A->h1, h, CUDA_R_32F,
              1.0f, err));
    PH(moe ? COST_ROUTER : COST_DENSE_FFN);
    G_LAUNCH(gk_rmsnorm(A->h1, h, M(g, w[W_FFN_NORM]), T, h, eps, A->b16, h, moe ? A->b32 : NULL, h,
                        A->rstd2, g->s));
    G_CUDA(cudaMemcpyAsync(y, A->h1, th * sizeof(float), cudaMemcpyDeviceToDevice, g->s));
    if (moe) {
        G_TRY(moe_forward(g, l, A, y, err));
        if (aux && g->rc.aux_coef != 0.0) G_TRY(moe_aux_loss(g, l, A, aux, err));
        return MOE_OK;
    }
    return swiglu_forward(g, A->b16, T, g->fd, W16(g, w[W_GATE]), W16(g, w[W_UP]),
                          W16(g, w[W_DOWN]), A->g32, A->u32, A->hm16, y, err);
}

/* dh (fp32, the gradient of the block output) -> dprev (the block input's). */
static enum moe_status block_backward(struct exec_gpu *g, int l, const float *x,
                                      const struct act *A, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->T, h = g->h, Hd = g->H * g->dv;
    bool moe = g->moe_index[l] >= 0;
    G_LAUNCH(gk_to_bf16(g->dh, g->dy16, (size_t)T * h, g->s));
    if (moe) {
        G_TRY(moe_backward(g, l, A, err));
    } else {
        PH(COST_DENSE_FFN);
        G_TRY(swiglu_backward(g, A->b16, g->dy16, T, g->fd, W16(g, w[W_GATE]), W16(g, w[W_UP]),
                              W16(g, w[W_DOWN]), A->g32, A->u32, A->hm16, GR(g, w[W_GATE]),
                              GR(g, w[W_UP]), GR(g, w[W_DOWN]), g->db32, 0.0f, err));
    }
    /* h1 = x + attn: dh1 = dy + norm backward of the FFN input (in place in dh) */
    G_LAUNCH(gk_rmsnorm_backward(A->h1, h, M(g, w[W_FFN_NORM]), A->rstd2, g->db32, h, g->dh, h,
                                 g->dh, h, T, h, g->s));
    G_LAUNCH(gk_colsum(g->db32, h, A->h1, h, A->rstd2, T, h, g->part, GR(g, w[W_FFN_NORM]), true,
                       g->s));
    PH(COST_ATTN_BWD);
    G_LAUNCH(gk_to_bf16(g->dh, g->dh16, (size_t)T * h, g->s));
    G_TRY(mm(g, false, false, T, Hd, h, 1.0f, g->dh16, h, 0, W16(g, w[W_WO]), Hd, 0, 0.0f, g->do16,
             Hd, 0, 1, CUDA_R_16BF, CUDA_R_16BF, err));
    G_TRY(lin_dw(g, g->dh16, h, A->o16, Hd, T, Hd, h, GR(g, w[W_WO]), err));
    G_TRY(attn_backward(g, l, A, err));
    G_LAUNCH(gk_rmsnorm_backward(x, h, M(g, w[W_ATTN_NORM]), A->rstd1, g->da32, h, g->dh, h,
                                 g->dprev, h, T, h, g->s));
    G_LAUNCH(gk_colsum(g->da32, h, x, h, A->rstd1, T, h, g->part, GR(g, w[W_ATTN_NORM]), true, g->s));
    return MOE_OK;
}

/* ---- creation ------------------------------------------------------------------------------ */

static enum moe_status act_alloc(struct exec_gpu *g, struct act *A, bool moe_any, bool dense_any,
                                 struct moe_error *err)
{
    int T = g->T, h = g->h, P = g->P, E = g->E, H = g->H, KV = g->KV;
    enum exec_mem c = EXEC_MEM_ACTIVATIONS;
    int fw = g->fd > g->fs ? g->fd : g->fs;
    ALLOC(A->a16, (size_t)T * h, c);
    ALLOC(A->rstd1, T, c);
    ALLOC(A->q16, (size_t)T * H * g->dqk, c);
    ALLOC(A->k16, (size_t)T * KV * g->dqk, c);
    ALLOC(A->v16, (size_t)T * KV * g->dv, c);
    ALLOC(A->o16, (size_t)T * H * g->dv, c);
    ALLOC(A->lse, (size_t)T * H, c);
    if (g->mla) {
        ALLOC(A->cq32, (size_t)T * g->ql, c);
        ALLOC(A->rstdq, T, c);
        ALLOC(A->cqn16, (size_t)T * g->ql, c);
        ALLOC(A->ckvf32, (size_t)T * (g->kvl + g->rope), c);
        ALLOC(A->rstdkv, T, c);
        ALLOC(A->ckvn16, (size_t)T * g->kvl, c);
    }
    ALLOC(A->h1, (size_t)T * h, c);
    ALLOC(A->b16, (size_t)T * h, c);
    ALLOC(A->rstd2, T, c);
    if (fw && (dense_any || g->fs)) {
        ALLOC(A->g32, (size_t)T * fw, c);
        ALLOC(A->u32, (size_t)T * fw, c);
        ALLOC(A->hm16, (size_t)T * fw, c);
    }
    if (moe_any) {
        ALLOC(A->b32, (size_t)T * h, c);
        ALLOC(A->logits, (size_t)T * E, c);
        ALLOC(A->choice, (size_t)P, c);
        ALLOC(A->weight, (size_t)P, c);
        ALLOC(A->pos, (size_t)P, c);
        ALLOC(A->row_src, (size_t)P, c);
        ALLOC(A->off, E + 1, c);
        ALLOC(A->auxg, E, c);
        ALLOC(A->xp16, (size_t)g->Pe * h, c);
        ALLOC(A->eg32, (size_t)g->Pe * g->f, c);
        ALLOC(A->eu32, (size_t)g->Pe * g->f, c);
        ALLOC(A->ehm16, (size_t)g->Pe * g->f, c);
        ALLOC(A->yp32, (size_t)g->Pe * h, c);
    }
    return MOE_OK;
}

/* The exchange's buffers: rows_cap rows and Pe pairs a rank may hold, and per MoE layer its
 * indices (two allocations a layer). */
static enum moe_status ep_alloc(struct exec_gpu *g, struct moe_error *err)
{
    enum exec_mem c = EXEC_MEM_WORKSPACE;
    int R = g->cfg.ep->ranks, h = g->h, k = g->k, cap = g->rows_cap, E = g->E, T = g->T;
    size_t Pe = (size_t)g->Pe;
    ALLOC(g->ep_idx, cap, c);
    ALLOC(g->ep_meta_send, cap, c);
    ALLOC(g->ep_meta_recv, cap, c);
    ALLOC(g->ep_send16, (size_t)cap * h, c);
    ALLOC(g->ep_recv16, (size_t)cap * h, c);
    ALLOC(g->ep_send32, (size_t)cap * h, c);
    ALLOC(g->ep_recv32, (size_t)cap * h, c);
    ALLOC(g->ep_part, (size_t)cap * h, c);
    ALLOC(g->ep_ret, (size_t)cap * h, c);
    ALLOC(g->ep_dwrows, (size_t)cap * k, c);
    ALLOC(g->ep_dwret, (size_t)cap * k, c);
    ALLOC(g->dwp, Pe, c);
    G_CUDA(cudaMallocHost((void **)&g->choice_host, sizeof(int) * (size_t)g->P));
    G_CUDA(cudaMallocHost((void **)&g->weight_host, sizeof(float) * (size_t)g->P));
    g->epl = (struct ep_layer *)calloc((size_t)g->nmoe, sizeof *g->epl);
    if (!g->epl) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    size_t ni = 3 * Pe + 2 * ((size_t)cap + 1) + (size_t)T + 1 + (size_t)g->P + (size_t)cap;
    for (int i = 0; i < g->nmoe; i++) {
        struct ep_layer *L = &g->epl[i];
        L->in1 = (int *)calloc((size_t)R, sizeof(int));
        L->in2 = (int *)calloc((size_t)R, sizeof(int));
        L->off = (int *)calloc((size_t)E + 1, sizeof(int));
        if (!L->in1 || !L->in2 || !L->off)
            return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        int *iv;
        float *fv;
        ALLOC(iv, ni, c);
        ALLOC(fv, 2 * Pe, c);
        L->pair_row = iv;
        L->pair_dst = L->pair_row + Pe;
        L->row_pairs = L->pair_dst + Pe;
        L->row_off = L->row_pairs + Pe;
        L->fwd_off = L->row_off + cap + 1;
        L->tok_off = L->fwd_off + cap + 1;
        L->tok_rows = L->tok_off + T + 1;
        L->fwd_rows = L->tok_rows + g->P;
        L->pair_w = fv;
        L->row_w = fv + Pe;
    }
    return MOE_OK;
}

static enum moe_status create(struct exec_gpu *g, const struct mdl_model *m,
                              const struct exec_gpu_cfg *cfg, struct moe_error *err)
{
    const struct mdl_attention *at = &m->attn;
    G_TRY(exec_model_table(&g->table, m, err));
    g->m = *m;
    g->cfg = *cfg;
    g->S = cfg->seq;
    g->B = cfg->mbs;
    g->T = cfg->seq * cfg->mbs;
    g->L = m->layers;
    g->h = m->hidden;
    g->V = m->vocab;
    g->E = m->moe.experts;
    g->k = m->moe.top_k;
    g->f = m->moe.intermediate;
    g->fs = m->moe.shared_experts * m->moe.shared_intermediate;
    g->fd = m->dense_intermediate;
    g->P = g->T * g->k;
    if (cfg->ep) {
        double f = cfg->ep_buffer_factor > 0 ? cfg->ep_buffer_factor : cfg->ep->ranks;
        if (f > cfg->ep->ranks) f = cfg->ep->ranks;
        g->Pe = g->rows_cap = (int)ceil(f * g->P);
        /* per-domain dedup: a landing rank holds rows for its whole domain before it forwards
         * them, and the forwarded rows besides: twice the rows for the same pairs */
        if (cfg->ep_group && cfg->ep_group->mode == COST_DISPATCH_DEDUP_DOMAIN) g->rows_cap *= 2;
    } else {
        g->Pe = g->rows_cap = g->P;
    }
    g->mla = at->type == MDL_ATTN_MLA;
    g->H = at->heads;
    g->KV = g->mla ? at->heads : at->kv_heads;
    g->nope = g->mla ? at->qk_nope_head_dim : 0;
    g->rope = g->mla ? at->qk_rope_head_dim : at->head_dim;
    g->dqk = g->nope + g->rope;
    g->dv = g->mla ? at->v_head_dim : at->head_dim;
    g->ql = g->mla ? at->q_lora_rank : 0;
    g->kvl = g->mla ? at->kv_lora_rank : 0;
    exec_router_cfg_from_model(&g->rc, m);
    g->rc.aux_coef = cfg->aux_coef;
    if (cfg->seq < 1 || cfg->mbs < 1 || cfg->seq > m->max_seq_len)
        return moe_error_set(err, MOE_ERR_INPUT, "executor: sequence %d (1 .. %d), mbs %d",
                             cfg->seq, m->max_seq_len, cfg->mbs);
    if (cfg->ep) {
        int nmoe = 0;
        for (int l = 0; l < m->layers; l++) nmoe += mdl_layer_is_moe(m, l);
        if (cfg->ep_groups > 1 && cfg->ep_groups != nmoe)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "executor: %d EP groups for %d MoE layers (one, or one a layer)",
                                 cfg->ep_groups, nmoe);
        for (int i = 0; i < (cfg->ep_groups > 1 ? cfg->ep_groups : 1); i++) {
            const struct exec_ep_group *eg = cfg->ep_group ? cfg->ep_group + i : NULL;
            if (!eg || eg->ranks != cfg->ep->ranks || eg->experts != g->E || eg->top_k != g->k)
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "executor: expert parallelism needs a group of the "
                                     "transport's %d ranks for %d experts, top_k %d",
                                     cfg->ep->ranks, g->E, g->k);
            G_TRY(exec_ep_group_check(eg, err));
        }
        if (cfg->recompute)
            return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                 "executor: expert parallelism with full recompute is not in the "
                                 "executor yet");
    }
    if (g->mla && g->rope > GK_MAX_ROPE)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: %d RoPE dims in MLA; this build supports at most %d",
                             g->rope, GK_MAX_ROPE);
    if (!gk_flash_supported(g->dqk, g->dv))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: attention head dims %d (q, k) and %d (v); this build "
                             "supports at most %d", g->dqk, g->dv, GK_FLASH_MAX_DIM);
    if (g->E > GK_MAX_EXPERTS)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: %d experts; this build routes at most %d per layer", g->E,
                             GK_MAX_EXPERTS);
    if ((double)g->P * (g->h > g->f ? g->h : g->f) > 2e9 || (double)g->T * g->V > 2e9)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: a micro-batch of %d tokens is too large for 32-bit GEMM "
                             "offsets; lower mbs or seq_len",
                             g->T);
    G_CUDA(cudaSetDevice(cfg->device));
    G_CUDA(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking));
    G_BLAS(cublasCreate(&g->blas));
    G_BLAS(cublasSetStream(g->blas, g->s));
    /* a fixed workspace keeps cuBLAS's choice of algorithm, and so its results, the same */
    size_t ws = 64u << 20;
    G_TRY(dalloc(g, &g->blas_ws, ws, EXEC_MEM_WORKSPACE, "the cuBLAS workspace", err));
    G_BLAS(cublasSetWorkspace(g->blas, g->blas_ws, ws));
    G_BLAS(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    G_BLAS(cublasLtCreate(&g->lt));
    g->ws_bytes = ws;
    g->cur = g->blas;
    g->cur_side = -1;
    g->nside = cfg->streams > 1 ? (cfg->streams < EXEC_MAX_STREAMS ? cfg->streams : EXEC_MAX_STREAMS) : 0;
    if (g->nside) G_CUDA(cudaEventCreateWithFlags(&g->fork_ev, cudaEventDisableTiming));
    for (int i = 0; i < g->nside; i++) {
        void *sws;
        G_CUDA(cudaStreamCreateWithFlags(&g->side[i], cudaStreamNonBlocking));
        G_CUDA(cudaEventCreateWithFlags(&g->join_ev[i], cudaEventDisableTiming));
        G_BLAS(cublasCreate(&g->side_blas[i]));
        G_BLAS(cublasSetStream(g->side_blas[i], g->side[i]));
        G_TRY(dalloc(g, &sws, ws, EXEC_MEM_WORKSPACE, "a side stream's cuBLAS workspace", err));
        G_BLAS(cublasSetWorkspace(g->side_blas[i], sws, ws));
        g->side_ws[i] = sws;
    }
    /* tensor indices */
    size_t n = g->table.nparams;
    g->wi = (int(*)[W_N])calloc((size_t)g->L, sizeof *g->wi);
    g->moe_index = (int *)calloc((size_t)g->L, sizeof(int));
    g->decay = (bool *)calloc((size_t)g->table.ntensors, sizeof(bool));
    g->off_host = (int **)calloc((size_t)g->L, sizeof(int *));
    g->xin = (float **)calloc((size_t)g->L + 1, sizeof(float *));
    g->blk_off = (size_t *)calloc((size_t)g->L + 1, sizeof(size_t));
    g->act = (struct act *)calloc((size_t)g->L, sizeof(struct act));
    if (!g->wi || !g->moe_index || !g->decay || !g->off_host || !g->xin || !g->act || !g->blk_off)
        return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < g->table.ntensors; i++)
        g->decay[i] = strstr(g->table.tensor[i].name, "norm") == NULL;
    for (int l = 0; l < g->L; l++) {
        g->moe_index[l] = mdl_layer_is_moe(m, l) ? g->nmoe++ : -1;
        for (int j = 0; j < W_N; j++) {
            char name[64];
            snprintf(name, sizeof name, "blk%d.%s", l, w_names[j]);
            const struct exec_tensor *t = exec_ref_tensor(&g->table, name);
            g->wi[l][j] = t ? (int)(t - g->table.tensor) : -1;
        }
    }
    g->embed = (int)(exec_ref_tensor(&g->table, "embed") - g->table.tensor);
    g->final_norm = (int)(exec_ref_tensor(&g->table, "final_norm") - g->table.tensor);
    const struct exec_tensor *head = exec_ref_tensor(&g->table, m->tied_embeddings ? "embed" : "lm_head");
    g->head = (int)(head - g->table.tensor);
    /* gradient buckets: each block's tensors one contiguous range, blocks in order */
    g->buckets_ok = true;
    for (int l = 0; l < g->L; l++) {
        size_t lo = (size_t)-1, hi = 0;
        char pre[16];
        int np = snprintf(pre, sizeof pre, "blk%d.", l);
        for (int i = 0; i < g->table.ntensors; i++) {
            const struct exec_tensor *t = &g->table.tensor[i];
            if (strncmp(t->name, pre, (size_t)np)) continue;
            if (t->offset < lo) lo = t->offset;
            if (t->offset + t->size > hi) hi = t->offset + t->size;
        }
        if (l > 0 && lo != g->blk_off[l]) g->buckets_ok = false;
        g->blk_off[l] = lo;
        g->blk_off[l + 1] = hi;
    }
    /* parameters and optimizer state */
    g->shard_lo = 0;
    g->shard_hi = g->shard_n = n;
    size_t nmaster = n;
    if (cfg->zero) { /* shards of a multiple of 4 floats: the 16-byte AdamW kernel */
        int R = cfg->zero->ranks;
        g->shard_n = (n + 4 * (size_t)R - 1) / (4 * (size_t)R) * 4;
        g->shard_lo = g->shard_n * (size_t)cfg->zero->rank;
        g->shard_hi = g->shard_lo + g->shard_n < n ? g->shard_lo + g->shard_n : n;
        if (g->shard_hi < g->shard_lo) g->shard_hi = g->shard_lo;
        nmaster = g->shard_n * (size_t)R;
    }
    ALLOC(g->master, nmaster, EXEC_MEM_MASTER);
    ALLOC(g->w16, n, EXEC_MEM_WEIGHTS);
    ALLOC(g->grad, n, EXEC_MEM_GRADS);
    ALLOC(g->m1, g->shard_n, EXEC_MEM_OPTIMIZER);
    ALLOC(g->m2, g->shard_n, EXEC_MEM_OPTIMIZER);
    int E = g->E, T = g->T, P = g->P, h = g->h, H = g->H, KV = g->KV;
    ALLOC(g->bias, (size_t)g->L * E, EXEC_MEM_MASTER);
    g->bias_host = (double *)calloc((size_t)g->L * E, sizeof(double));
    g->counts = (int64_t *)calloc((size_t)(g->nmoe ? g->nmoe : 1) * E, sizeof(int64_t));
    g->step_load = (int64_t *)calloc((size_t)(g->nmoe ? g->nmoe : 1) * E, sizeof(int64_t));
    if (!g->bias_host || !g->counts || !g->step_load)
        return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    ALLOC(g->coact, (size_t)(g->nmoe ? g->nmoe : 1) * E * E, EXEC_MEM_WORKSPACE);
    /* activations */
    bool moe_any = g->nmoe > 0, dense_any = g->nmoe < g->L;
    for (int l = 0; l <= g->L; l++) ALLOC(g->xin[l], (size_t)T * h, EXEC_MEM_ACTIVATIONS);
    int nact = cfg->recompute ? 1 : g->L;
    for (int l = 0; l < nact; l++) {
        G_TRY(act_alloc(g, &g->act[l], moe_any, dense_any, err));
        G_CUDA(cudaMallocHost((void **)&g->off_host[l], sizeof(int) * (E + 1)));
    }
    for (int l = nact; l < g->L; l++) {
        g->act[l] = g->act[0];
        g->off_host[l] = g->off_host[0];
    }
    /* workspace */
    enum exec_mem c = EXEC_MEM_WORKSPACE;
    int dqk = g->dqk, dv = g->dv, S = g->S, fw = g->fd > g->fs ? g->fd : g->fs;
    ALLOC(g->tok, (size_t)g->B * (S + 1), c);
    ALLOC(g->tok_in, T, c);
    ALLOC(g->emb_dev, (size_t)3 * T + 1, c);
    G_CUDA(cudaMallocHost((void **)&g->emb_host, sizeof(int) * ((size_t)3 * T + 1)));
    g->emb_count = (int *)calloc((size_t)g->V, sizeof(int));
    if (!g->emb_count) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    ALLOC(g->tgt, T, c);
    int chunks = (P + GK_CHUNK - 1) / GK_CHUNK, rchunks = (T + GK_CHUNK - 1) / GK_CHUNK;
    ALLOC(g->perm_cnt, (size_t)chunks * E + 1, c);
    ALLOC(g->perm_base, (size_t)chunks * E + 1, c);
    ALLOC(g->q32, (size_t)T * H * dqk, c);
    ALLOC(g->k32, (size_t)T * KV * dqk, c);
    ALLOC(g->delta, (size_t)T * H, c);
    ALLOC(g->rope_tab, (size_t)S * (g->rope / 2), c);
    G_LAUNCH(gk_rope_table(g->rope_tab, S, g->rope, (float)g->m.attn.rope_theta, g->s));
    G_CUDA(gk_flash_prepare(g->dqk, g->dv));
    int widest = h > E ? h : E;
    if (g->mla) widest = widest > g->kvl + g->rope ? widest : g->kvl + g->rope;
    if (g->ql > widest) widest = g->ql;
    ALLOC(g->part, (size_t)rchunks * widest, c);
    ALLOC(g->ytmp, widest, c);
    ALLOC(g->dh, (size_t)T * h, c);
    ALLOC(g->dprev, (size_t)T * h, c);
    if (cfg->recompute) ALLOC(g->yscr, (size_t)T * h, c);
    ALLOC(g->da32, (size_t)T * h, c);
    ALLOC(g->db32, (size_t)T * h, c);
    ALLOC(g->dy16, (size_t)T * h, c);
    ALLOC(g->dh16, (size_t)T * h, c);
    ALLOC(g->do16, (size_t)T * H * dv, c);
    ALLOC(g->dq32, (size_t)T * H * dqk, c);
    ALLOC(g->dk32, (size_t)T * KV * dqk, c);
    ALLOC(g->dv32, (size_t)T * KV * dv, c);
    ALLOC(g->dq16, (size_t)T * H * dqk, c);
    ALLOC(g->dk16, (size_t)T * KV * dqk, c);
    ALLOC(g->dv16, (size_t)T * KV * dv, c);
    if (g->mla) {
        ALLOC(g->kv32, (size_t)T * H * (g->nope + dv), c);
        ALLOC(g->dqf32, (size_t)T * H * dqk, c);
        ALLOC(g->dqf16, (size_t)T * H * dqk, c);
        ALLOC(g->dkv32, (size_t)T * H * (g->nope + dv), c);
        ALLOC(g->dkv16, (size_t)T * H * (g->nope + dv), c);
        ALLOC(g->dckvn32, (size_t)T * g->kvl, c);
        ALLOC(g->dckvf32, (size_t)T * (g->kvl + g->rope), c);
        ALLOC(g->dckvf16, (size_t)T * (g->kvl + g->rope), c);
        ALLOC(g->dcqn32, (size_t)T * g->ql, c);
        ALLOC(g->dcq32, (size_t)T * g->ql, c);
        ALLOC(g->dcq16, (size_t)T * g->ql, c);
    }
    if (fw) {
        ALLOC(g->dhm32, (size_t)T * fw, c);
        ALLOC(g->dg16, (size_t)T * fw, c);
        ALLOC(g->du16, (size_t)T * fw, c);
    }
    if (moe_any) {
        ALLOC(g->dw, P, c);
        ALLOC(g->dyp16, (size_t)g->Pe * h, c);
        ALLOC(g->dehm32, (size_t)g->Pe * g->f, c);
        ALLOC(g->deg16, (size_t)g->Pe * g->f, c);
        ALLOC(g->deu16, (size_t)g->Pe * g->f, c);
        ALLOC(g->dxp32, (size_t)g->Pe * h, c);
        ALLOC(g->dz, (size_t)T * E, c);
        ALLOC(g->ep_loads, (size_t)g->nmoe * E, c);
        if (cfg->ep) G_TRY(ep_alloc(g, err));
        ALLOC(g->scores, (size_t)T * E, c);
    }
    ALLOC(g->fin16, (size_t)T * h, c);
    ALLOC(g->rstdf, T, c);
    ALLOC(g->logits, (size_t)T * g->V, c);
    ALLOC(g->dlog16, (size_t)T * g->V, c);
    ALLOC(g->row_loss, T, c);
    ALLOC(g->dfin32, (size_t)T * h, c);
    ALLOC(g->norm_part, GK_NORM_BLOCKS, c);
    G_CUDA(cudaMallocHost((void **)&g->host_rows, sizeof(float) * (size_t)T));
    size_t fr, tot;
    G_CUDA(cudaStreamSynchronize(g->s));
    G_CUDA(cudaMemGetInfo(&fr, &tot));
    g->dev_total = (double)tot;
    g->peak_used = (double)(tot - fr);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_create(struct exec_gpu **out, const struct mdl_model *m,
                                           const struct exec_gpu_cfg *cfg, struct moe_error *err)
{
    *out = NULL;
    struct exec_gpu *g = (struct exec_gpu *)calloc(1, sizeof *g);
    if (!g) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    enum moe_status st = create(g, m, cfg, err);
    if (st != MOE_OK) {
        exec_gpu_destroy(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

extern "C" void exec_gpu_destroy(struct exec_gpu *g)
{
    if (!g) return;
    if (g->s) cudaStreamSynchronize(g->s);
    for (int i = 0; i < g->nallocs; i++) cudaFree(g->allocs[i]);
    for (int i = 0; i < g->ev_created; i++) cudaEventDestroy(g->ev[i]);
    if (g->off_host)
        for (int l = 0; l < (g->cfg.recompute ? 1 : g->L); l++)
            if (g->off_host[l]) cudaFreeHost(g->off_host[l]);
    if (g->host_rows) cudaFreeHost(g->host_rows);
    if (g->choice_host) cudaFreeHost(g->choice_host);
    if (g->weight_host) cudaFreeHost(g->weight_host);
    for (int i = 0; g->epl && i < g->nmoe; i++) {
        exec_ep_rows_free(&g->epl[i].h1);
        exec_ep_rows_free(&g->epl[i].h2);
        free(g->epl[i].in1), free(g->epl[i].in2), free(g->epl[i].off);
    }
    free(g->epl);
    if (g->emb_host) cudaFreeHost(g->emb_host);
    free(g->emb_count);
    if (g->blas) cublasDestroy(g->blas);
    for (int i = 0; i < g->nlt; i++)
        if (g->lt_kinds[i].op) cublasLtMatmulDescDestroy(g->lt_kinds[i].op);
    if (g->lt) cublasLtDestroy(g->lt);
    for (int i = 0; i < g->nside; i++) {
        if (g->side_blas[i]) cublasDestroy(g->side_blas[i]);
        if (g->join_ev[i]) cudaEventDestroy(g->join_ev[i]);
        if (g->side[i]) cudaStreamDestroy(g->side[i]);
    }
    if (g->fork_ev) cudaEventDestroy(g->fork_ev);
    if (g->s) cudaStreamDestroy(g->s);
    free(g->wi), free(g->moe_index), free(g->decay), free(g->off_host), free(g->xin), free(g->act);
    free(g->blk_off);
    free(g->bias_host), free(g->counts), free(g->step_load);
    free(g);
}

extern "C" const struct exec_ref_model *exec_gpu_table(const struct exec_gpu *g) { return &g->table; }

/* ---- parameters ---------------------------------------------------------------------------- */

static enum moe_status refresh_bf16(struct exec_gpu *g, struct moe_error *err)
{
    G_LAUNCH(gk_to_bf16(g->master, g->w16, g->table.nparams, g->s));
    G_CUDA(cudaStreamSynchronize(g->s));
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_init(struct exec_gpu *g, uint64_t seed, struct moe_error *err)
{
    for (int i = 0; i < g->table.ntensors; i++) {
        const struct exec_tensor *t = &g->table.tensor[i];
        G_LAUNCH(gk_init(g->master + t->offset, t->size, t->offset, seed, 0.02f,
                         strstr(t->name, "norm") != NULL, g->s));
    }
    G_CUDA(cudaMemsetAsync(g->m1, 0, sizeof(float) * g->shard_n, g->s));
    G_CUDA(cudaMemsetAsync(g->m2, 0, sizeof(float) * g->shard_n, g->s));
    return refresh_bf16(g, err);
}

/* Host copies in pieces through one float buffer, on the executor's stream: it is a non-blocking
 * stream, which the legacy default stream of a plain cudaMemcpy does not order against (a
 * pageable host-to-device cudaMemcpy may return before its data lands). */
static enum moe_status copy_params(struct exec_gpu *g, float *dev, double *host, bool to_dev,
                                   struct moe_error *err)
{
    size_t n = g->table.nparams, piece = 1u << 24;
    float *buf = (float *)malloc(sizeof(float) * (n < piece ? n : piece));
    if (!buf) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    enum moe_status st = MOE_OK;
    for (size_t o = 0; o < n && st == MOE_OK; o += piece) {
        size_t c = n - o < piece ? n - o : piece;
        cudaError_t e;
        if (to_dev) {
            for (size_t i = 0; i < c; i++) buf[i] = (float)host[o + i];
            e = cudaMemcpyAsync(dev + o, buf, sizeof(float) * c, cudaMemcpyHostToDevice, g->s);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->s); /* buf is reused */
        } else {
            e = cudaMemcpyAsync(buf, dev + o, sizeof(float) * c, cudaMemcpyDeviceToHost, g->s);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->s);
            for (size_t i = 0; i < c; i++) host[o + i] = buf[i];
        }
        if (e != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_CUDA, "executor: copy of parameters: %s",
                               cudaGetErrorString(e));
    }
    free(buf);
    return st;
}

extern "C" enum moe_status exec_gpu_set_params(struct exec_gpu *g, const double *params,
                                               struct moe_error *err)
{
    G_CUDA(cudaStreamSynchronize(g->s));
    G_TRY(copy_params(g, g->master, (double *)params, true, err));
    return refresh_bf16(g, err);
}

extern "C" enum moe_status exec_gpu_get_params(struct exec_gpu *g, double *params,
                                               struct moe_error *err)
{
    G_CUDA(cudaStreamSynchronize(g->s));
    return copy_params(g, g->master, params, false, err);
}

extern "C" enum moe_status exec_gpu_reduce_grads(struct exec_gpu *g, struct exec_transport *t,
                                                 struct moe_error *err)
{
    PH(COST_DP_GRAD_SYNC);
    size_t n = g->table.nparams, lo = g->blk_off[0], hi = g->blk_off[g->L];
    if (g->started && t == g->cfg.dp) { /* the blocks are under way: the rest, then the wait */
        G_TRY(t->ops->allreduce_f32_start(t, g->grad, lo, g->s, err));
        G_TRY(t->ops->allreduce_f32_start(t, g->grad + hi, n - hi, g->s, err));
        g->started = false;
        return t->ops->wait(t, err);
    }
    G_TRY(sync_host(g, err));
    return t->ops->allreduce_sum_f32(t, g->grad, n, err);
}

extern "C" void *exec_gpu_stream(const struct exec_gpu *g) { return g->s; }

extern "C" size_t exec_gpu_state_floats(const struct exec_gpu *g) { return g->shard_n; }

extern "C" enum moe_status exec_gpu_get_state(struct exec_gpu *g, float *m1, float *m2,
                                              double *bias, struct moe_error *err)
{
    size_t n = sizeof(float) * g->shard_n;
    G_CUDA(cudaMemcpyAsync(m1, g->m1, n, cudaMemcpyDeviceToHost, g->s));
    G_CUDA(cudaMemcpyAsync(m2, g->m2, n, cudaMemcpyDeviceToHost, g->s));
    G_CUDA(cudaStreamSynchronize(g->s));
    memcpy(bias, g->bias_host, sizeof(double) * (size_t)g->L * g->E);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_set_state(struct exec_gpu *g, const float *m1,
                                              const float *m2, const double *bias,
                                              struct moe_error *err)
{
    size_t n = sizeof(float) * g->shard_n;
    G_CUDA(cudaMemcpyAsync(g->m1, m1, n, cudaMemcpyHostToDevice, g->s));
    G_CUDA(cudaMemcpyAsync(g->m2, m2, n, cudaMemcpyHostToDevice, g->s));
    G_CUDA(cudaStreamSynchronize(g->s));
    return exec_gpu_set_bias(g, bias, err);
}

extern "C" enum moe_status exec_gpu_get_grads(struct exec_gpu *g, double *grad, struct moe_error *err)
{
    G_CUDA(cudaStreamSynchronize(g->s));
    return copy_params(g, g->grad, grad, false, err);
}

static enum moe_status upload_bias(struct exec_gpu *g, struct moe_error *err)
{
    size_t n = (size_t)g->L * g->E;
    float *b = (float *)malloc(sizeof(float) * n);
    if (!b) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (size_t i = 0; i < n; i++) b[i] = (float)g->bias_host[i];
    cudaError_t e = cudaMemcpyAsync(g->bias, b, sizeof(float) * n, cudaMemcpyHostToDevice, g->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->s);
    free(b);
    G_CUDA(e);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_set_bias(struct exec_gpu *g, const double *bias,
                                             struct moe_error *err)
{
    memcpy(g->bias_host, bias, sizeof(double) * (size_t)g->L * g->E);
    return upload_bias(g, err);
}

/* ---- the step ------------------------------------------------------------------------------ */

extern "C" enum moe_status exec_gpu_step_begin(struct exec_gpu *g, struct moe_error *err)
{
    g->nev = 0;
    g->ev_overflow = false;
    g->syncs = 0;
    g->sent.nvlink = g->sent.scale_out = 0.0;
    g->mb_done = 0;
    g->started = g->bucketing = false;
    memset(g->step_load, 0, sizeof(int64_t) * (size_t)(g->nmoe ? g->nmoe : 1) * g->E);
    PH(COST_OPTIMIZER);
    G_CUDA(cudaMemsetAsync(g->grad, 0, sizeof(float) * g->table.nparams, g->s));
    return MOE_OK;
}

/* The embedding backward's plan: the input positions of each distinct token id, in order (a
 * counting sort on the host, where the tokens are); emb_host = ids (T) | pos (T) | off. */
static enum moe_status embed_plan(struct exec_gpu *g, const int *tokens, struct moe_error *err)
{
    int T = g->T;
    int *ids = g->emb_host, *pos = g->emb_host + T, *off = g->emb_host + 2 * T, n = 0;
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < g->S; t++) g->emb_count[tokens[b * (g->S + 1) + t]]++;
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < g->S; t++) {
            int v = tokens[b * (g->S + 1) + t];
            if (g->emb_count[v] > 0) { /* first sight of v: its slot, counts become fill */
                ids[n] = v;
                off[n + 1] = g->emb_count[v];
                g->emb_count[v] = -(n + 1);
                n++;
            }
        }
    off[0] = 0;
    for (int u = 0; u < n; u++) off[u + 1] += off[u];
    int *cur = (int *)malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!cur) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (int u = 0; u < n; u++) cur[u] = off[u];
    for (int b = 0; b < g->B; b++)
        for (int t = 0; t < g->S; t++) {
            int v = tokens[b * (g->S + 1) + t], u = -g->emb_count[v] - 1;
            pos[cur[u]++] = b * g->S + t;
        }
    free(cur);
    for (int u = 0; u < n; u++) g->emb_count[ids[u]] = 0;
    g->emb_nids = n;
    G_CUDA(cudaMemcpyAsync(g->emb_dev, g->emb_host, sizeof(int) * ((size_t)3 * T + 1),
                           cudaMemcpyHostToDevice, g->s));
    return MOE_OK;
}

/* The tokens of a micro-batch to the GPU (inputs and targets), and the embedding's backward
 * plan; MOE_ERR_INPUT for a token outside the vocabulary. */
static enum moe_status load_tokens(struct exec_gpu *g, const int *tokens, struct moe_error *err)
{
    for (int i = 0; i < g->B * (g->S + 1); i++)
        if (tokens[i] < 0 || tokens[i] >= g->V)
            return moe_error_set(err, MOE_ERR_INPUT, "executor: token %d is %d, vocab %d", i,
                                 tokens[i], g->V);
    G_TRY(embed_plan(g, tokens, err));
    PH(COST_EMBED);
    G_CUDA(cudaMemcpyAsync(g->tok, tokens, sizeof(int) * (size_t)g->B * (g->S + 1),
                           cudaMemcpyHostToDevice, g->s));
    G_LAUNCH(gk_split(g->tok, g->B, g->S, g->tok_in, g->tgt, g->s));
    return MOE_OK;
}

/* Blocks [lo, hi) forward from xin[lo] (lo 0: the embedding of the tokens), and, when hi is the
 * last, the head and the loss with its gradient (grad_scale / T a row) into dlog16. */
static enum moe_status forward_part(struct exec_gpu *g, int lo, int hi, double *aux_sum,
                                    struct moe_error *err)
{
    int T = g->T, h = g->h, V = g->V, L = g->L;
    if (lo == 0) G_LAUNCH(gk_embed(M(g, g->embed), g->tok_in, T, h, g->xin[0], g->s));
    for (int l = lo; l < hi; l++)
        G_TRY(block_forward(g, l, g->xin[l], g->xin[l + 1], &g->act[l], aux_sum, err));
    if (hi < L) return MOE_OK;
    PH(COST_LM_HEAD);
    G_LAUNCH(gk_rmsnorm(g->xin[L], h, M(g, g->final_norm), T, h, (float)g->m.norm_eps, g->fin16,
                        h, NULL, 0, g->rstdf, g->s));
    G_TRY(lin(g, g->fin16, h, W16(g, g->head), T, h, V, g->logits, V, CUDA_R_32F, 0, err));
    PH(COST_LOSS);
    G_LAUNCH(gk_cross_entropy(g->logits, g->tgt, T, V, (float)(g->grad_scale / T), g->row_loss,
                              g->dlog16, g->s));
    G_CUDA(cudaMemcpyAsync(g->host_rows, g->row_loss, sizeof(float) * T, cudaMemcpyDeviceToHost, g->s));
    return MOE_OK;
}

/* Blocks [lo, hi) backward, from the loss (hi the last) or from g->dh (the gradient of
 * xin[hi]); ends with g->dh the gradient of xin[lo], or in the embedding's gradient (lo 0). */
static enum moe_status backward_part(struct exec_gpu *g, int lo, int hi, struct moe_error *err)
{
    int T = g->T, h = g->h, V = g->V, L = g->L;
    if (hi == L) {
        PH(COST_LM_HEAD);
        G_TRY(lin_dx(g, g->dlog16, V, W16(g, g->head), T, h, V, g->dfin32, h, 0, err));
        G_TRY(lin_dw(g, g->dlog16, V, g->fin16, h, T, h, V, GR(g, g->head), err));
        G_LAUNCH(gk_rmsnorm_backward(g->xin[L], h, M(g, g->final_norm), g->rstdf, g->dfin32, h,
                                     NULL, 0, g->dh, h, T, h, g->s));
        G_LAUNCH(gk_colsum(g->dfin32, h, g->xin[L], h, g->rstdf, T, h, g->part,
                           GR(g, g->final_norm), true, g->s));
    }
    for (int l = hi - 1; l >= lo; l--) {
        if (g->cfg.recompute) {
            g->record_stats = false;
            G_TRY(block_forward(g, l, g->xin[l], g->yscr, &g->act[l], NULL, err));
        }
        G_TRY(block_backward(g, l, g->xin[l], &g->act[l], err));
        if (g->bucketing) { /* block l's gradients are complete: its all-reduce starts */
            struct exec_transport *dp = g->cfg.dp;
            size_t a = g->blk_off[l], b = g->blk_off[l + 1];
            G_TRY(dp->ops->allreduce_f32_start(dp, g->grad + a, b - a, g->s, err));
            g->started = true;
        }
        float *t = g->dh;
        g->dh = g->dprev;
        g->dprev = t;
    }
    if (lo > 0) return MOE_OK;
    PH(COST_EMBED);
    G_LAUNCH(gk_embed_backward(g->dh, g->emb_dev, g->emb_dev + 2 * T, g->emb_dev + T, g->emb_nids, h,
                               GR(g, g->embed), g->s));
    return MOE_OK;
}

/* The loss after the work queued so far: the mean cross-entropy when the head ran, plus aux. */
static enum moe_status finish_loss(struct exec_gpu *g, bool head, double aux_sum, double *loss,
                                   double *aux, struct moe_error *err)
{
    G_TRY(sync_host(g, err));
    double sum = 0.0;
    for (int t = 0; head && t < g->T; t++) sum += g->host_rows[t];
    *loss = (head ? sum / g->T : 0.0) + aux_sum;
    if (aux) *aux = aux_sum;
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_micro_batch(struct exec_gpu *g, const int *tokens,
                                                double grad_scale, double *loss, double *aux,
                                                struct moe_error *err)
{
    double aux_sum = 0.0;
    g->record_stats = true;
    g->grad_scale = grad_scale;
    g->bucketing = g->cfg.dp && g->buckets_ok && g->cfg.micro_batches > 0 &&
                   g->mb_done + 1 == g->cfg.micro_batches;
    G_TRY(load_tokens(g, tokens, err));
    G_TRY(forward_part(g, 0, g->L, &aux_sum, err));
    G_TRY(backward_part(g, 0, g->L, err));
    g->bucketing = false;
    g->mb_done++;
    return finish_loss(g, true, aux_sum, loss, aux, err);
}

extern "C" enum moe_status exec_gpu_slice(struct exec_gpu *g, const int *tokens, int lo, int hi,
                                          const float *h_in, float *h_out, const float *dh_out,
                                          float *dh_in, bool backward, double grad_scale,
                                          double *loss, double *aux, struct moe_error *err)
{
    int L = g->L;
    size_t th = sizeof(float) * (size_t)g->T * g->h;
    if (lo < 0 || hi > L || lo >= hi || (lo > 0 && !h_in) || (hi < L && !backward && !h_out) ||
        (hi < L && backward && !dh_out) || (lo > 0 && backward && !dh_in) || g->cfg.ep)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "executor: a slice of blocks [%d, %d) of %d needs its input, output "
                             "and gradients (and no expert parallelism)",
                             lo, hi, L);
    double aux_sum = 0.0;
    g->record_stats = !backward; /* the backward's forward is a recomputation */
    g->grad_scale = grad_scale;
    G_TRY(load_tokens(g, tokens, err));
    if (lo > 0) G_CUDA(cudaMemcpyAsync(g->xin[lo], h_in, th, cudaMemcpyDeviceToDevice, g->s));
    G_TRY(forward_part(g, lo, hi, &aux_sum, err));
    if (!backward) {
        if (hi < L) G_CUDA(cudaMemcpyAsync(h_out, g->xin[hi], th, cudaMemcpyDeviceToDevice, g->s));
        return finish_loss(g, hi == L, aux_sum, loss, aux, err);
    }
    if (hi < L) G_CUDA(cudaMemcpyAsync(g->dh, dh_out, th, cudaMemcpyDeviceToDevice, g->s));
    G_TRY(backward_part(g, lo, hi, err));
    if (lo > 0) G_CUDA(cudaMemcpyAsync(dh_in, g->dh, th, cudaMemcpyDeviceToDevice, g->s));
    return finish_loss(g, hi == L, aux_sum, loss, aux, err);
}

extern "C" enum moe_status exec_gpu_optimizer(struct exec_gpu *g, const struct exec_adamw *o,
                                              int step, double *gnorm, struct moe_error *err)
{
    PH(COST_OPTIMIZER);
    double part[GK_NORM_BLOCKS], norm = 0.0;
    G_LAUNCH(gk_sumsq(g->grad, g->table.nparams, g->norm_part, g->s));
    G_CUDA(cudaMemcpyAsync(part, g->norm_part, sizeof part, cudaMemcpyDeviceToHost, g->s));
    G_TRY(sync_host(g, err));
    for (int i = 0; i < GK_NORM_BLOCKS; i++) norm += part[i];
    norm = sqrt(norm);
    *gnorm = norm;
    if (!isfinite(norm)) {
        char where[384];
        G_TRY(exec_gpu_nonfinite(g, where, sizeof where, err));
        return moe_error_set(err, MOE_ERR_NUMERICS, "step %d: the gradient norm is %g: %s", step + 1,
                             norm, where[0] ? where : "no tensor holds it now");
    }
    struct gk_adamw a;
    a.lr = (float)exec_lr_at(o, step);
    a.beta1 = (float)o->beta1;
    a.beta2 = (float)o->beta2;
    a.eps = (float)o->eps;
    a.c1 = (float)(1.0 - pow(o->beta1, step + 1));
    a.c2 = (float)(1.0 - pow(o->beta2, step + 1));
    a.scale = (float)(o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0);
    size_t lo = g->shard_lo, hi = g->shard_hi; /* everything, unless ZeRO-1 */
    for (int i = 0; i < g->table.ntensors; i++) {
        const struct exec_tensor *t = &g->table.tensor[i];
        size_t a0 = t->offset > lo ? t->offset : lo;
        size_t b0 = t->offset + t->size < hi ? t->offset + t->size : hi;
        if (a0 >= b0) continue;
        a.wd = g->decay[i] ? (float)o->weight_decay : 0.0f;
        G_LAUNCH(gk_adamw(g->master + a0, g->grad + a0, g->m1 + (a0 - lo), g->m2 + (a0 - lo),
                          g->w16 + a0, b0 - a0, &a, g->s));
    }
    if (g->cfg.zero) { /* every rank's updated shard to every rank, then their bf16 copies */
        G_TRY(sync_host(g, err));
        G_TRY(g->cfg.zero->ops->allgather_f32(g->cfg.zero, g->master, g->shard_n, err));
        G_LAUNCH(gk_to_bf16(g->master, g->w16, g->table.nparams, g->s));
    }
    return MOE_OK;
}

/* True when n floats at d hold NaN or Inf (their sum of squares is not finite). */
static enum moe_status nonfinite(struct exec_gpu *g, const float *d, size_t n, bool *bad,
                                 struct moe_error *err)
{
    double part[GK_NORM_BLOCKS], sum = 0.0;
    G_LAUNCH(gk_sumsq(d, n, g->norm_part, g->s));
    G_CUDA(cudaMemcpyAsync(part, g->norm_part, sizeof part, cudaMemcpyDeviceToHost, g->s));
    G_TRY(sync_host(g, err));
    for (int i = 0; i < GK_NORM_BLOCKS; i++) sum += part[i];
    *bad = !isfinite(sum);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_nonfinite(struct exec_gpu *g, char *where, size_t cap,
                                              struct moe_error *err)
{
    size_t th = (size_t)g->T * g->h;
    bool bad = false;
    where[0] = '\0';
    for (int l = 0; l <= g->L; l++) { /* xin[0]: the embedding; xin[l + 1]: block l's output */
        G_TRY(nonfinite(g, g->xin[l], th, &bad, err));
        if (!bad) continue;
        if (l == 0) snprintf(where, cap, "the embedding's output holds NaN or Inf");
        else
            snprintf(where, cap, "block %d's forward output holds NaN or Inf (its input is "
                     "finite); the loss and every gradient after it follow", l - 1);
        return MOE_OK;
    }
    for (int i = g->table.ntensors - 1; i >= 0; i--) { /* from the head back, as the backward */
        const struct exec_tensor *t = &g->table.tensor[i];
        G_TRY(nonfinite(g, g->grad + t->offset, t->size, &bad, err));
        if (!bad) continue;
        snprintf(where, cap, "the gradient of %s (%d x %d) holds NaN or Inf, the tensors after "
                 "it in the backward none (every block's forward output is finite)",
                 t->name, t->rows, t->cols);
        return MOE_OK;
    }
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_poison(struct exec_gpu *g, const char *tensor, bool weight,
                                           struct moe_error *err)
{
    const struct exec_tensor *t = exec_ref_tensor(&g->table, tensor);
    if (!t)
        return moe_error_set(err, MOE_ERR_INPUT, "no tensor named '%s' in this model (e.g. %s)",
                             tensor, g->table.tensor[g->table.ntensors - 1].name);
    size_t at = t->offset + t->size / 2;
    float nan = NAN;
    bf16 nan16 = __float2bfloat16(nan);
    if (weight) {
        G_CUDA(cudaMemcpyAsync(g->master + at, &nan, sizeof nan, cudaMemcpyHostToDevice, g->s));
        G_CUDA(cudaMemcpyAsync(g->w16 + at, &nan16, sizeof nan16, cudaMemcpyHostToDevice, g->s));
    } else {
        G_CUDA(cudaMemcpyAsync(g->grad + at, &nan, sizeof nan, cudaMemcpyHostToDevice, g->s));
    }
    return sync_host(g, err);
}

extern "C" enum moe_status exec_gpu_update_bias(struct exec_gpu *g, double rate,
                                                struct exec_transport *t, struct moe_error *err)
{
    if (rate == 0.0 || g->nmoe == 0) return MOE_OK;
    int E = g->E;
    size_t n = (size_t)g->nmoe * E;
    double *load_all = (double *)malloc(sizeof(double) * n);
    if (!load_all) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (size_t i = 0; i < n; i++) load_all[i] = (double)g->step_load[i];
    if (t) { /* every rank's loads: the biases stay the same on every rank */
        enum moe_status st = MOE_OK;
        cudaError_t e = cudaMemcpy(g->ep_loads, load_all, sizeof(double) * n,
                                   cudaMemcpyHostToDevice);
        if (e == cudaSuccess) st = t->ops->allreduce_sum(t, g->ep_loads, n, err);
        if (e == cudaSuccess && st == MOE_OK)
            e = cudaMemcpy(load_all, g->ep_loads, sizeof(double) * n, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_CUDA, "executor: the expert loads: %s",
                               cudaGetErrorString(e));
        if (st != MOE_OK) {
            free(load_all);
            return st;
        }
    }
    for (int l = 0; l < g->L; l++) {
        int mi = g->moe_index[l];
        if (mi < 0) continue;
        const double *load = load_all + (size_t)mi * E;
        double mean = 0.0;
        for (int e = 0; e < E; e++) mean += load[e] / E;
        for (int e = 0; e < E; e++) {
            double d = mean - load[e];
            g->bias_host[(size_t)l * E + e] += rate * (d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0);
        }
    }
    free(load_all);
    return upload_bias(g, err);
}

extern "C" enum moe_status exec_gpu_step_end(struct exec_gpu *g, struct exec_gpu_step_stats *st,
                                             struct moe_error *err)
{
    PH(-1);
    G_CUDA(cudaStreamSynchronize(g->s));
    memset(st, 0, sizeof *st);
    for (int i = 0; i + 1 < g->nev; i++) {
        float ms = 0.0f;
        G_CUDA(cudaEventElapsedTime(&ms, g->ev[i], g->ev[i + 1]));
        if (g->ev_phase[i] >= 0) st->phase_ms[g->ev_phase[i]] += ms;
        st->phase_ms[COST_STEP] += ms;
    }
    st->host_syncs = g->syncs;
    st->dispatch = g->sent;
    size_t fr, tot;
    G_CUDA(cudaMemGetInfo(&fr, &tot));
    if ((double)(tot - fr) > g->peak_used) g->peak_used = (double)(tot - fr);
    return MOE_OK;
}

extern "C" void exec_gpu_memory(const struct exec_gpu *g, struct exec_gpu_memory *m)
{
    memcpy(m->bytes, g->mem, sizeof m->bytes);
    m->device_used_peak = g->peak_used;
    m->device_total = g->dev_total;
}

extern "C" enum moe_status exec_gpu_routing(struct exec_gpu *g, int layer, int64_t *counts,
                                            int64_t *coact, struct moe_error *err)
{
    if (layer < 0 || layer >= g->L || g->moe_index[layer] < 0)
        return moe_error_set(err, MOE_ERR_INPUT, "executor: layer %d is not a MoE layer", layer);
    int mi = g->moe_index[layer], E = g->E;
    memcpy(counts, g->counts + (size_t)mi * E, sizeof(int64_t) * E);
    if (!coact) return MOE_OK;
    size_t n = (size_t)E * E;
    unsigned long long *buf = (unsigned long long *)malloc(sizeof *buf * n);
    if (!buf) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    cudaError_t e = cudaMemcpyAsync(buf, g->coact + (size_t)mi * n, sizeof *buf * n,
                                    cudaMemcpyDeviceToHost, g->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->s);
    for (size_t i = 0; i < n && e == cudaSuccess; i++) coact[i] = (int64_t)buf[i];
    free(buf);
    G_CUDA(e);
    return MOE_OK;
}

/* ---- the MoE benchmark --------------------------------------------------------------------- */

/* Median time of `iters` runs of what `what` selects (0: expert block, 1: whole layer, 2: dense
 * chain, 3: the expert block's forward), each bracketed by events on the main stream. */
static enum moe_status bench_time(struct exec_gpu *g, int what, int *dense_off, int iters,
                                  double *ms, int *syncs, struct moe_error *err)
{
    struct act *A = &g->act[0];
    double *t = (double *)calloc((size_t)iters, sizeof(double));
    cudaEvent_t a, b;
    if (!t) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    G_CUDA(cudaEventCreate(&a));
    G_CUDA(cudaEventCreate(&b));
    enum moe_status st = MOE_OK;
    for (int i = 0; i < iters && st == MOE_OK; i++) {
        int s0 = g->syncs;
        g->nev = MAX_EVENTS; /* no phase events inside the benchmark */
        cudaEventRecord(a, g->s);
        if (what == 0 || what == 3) {
            st = experts_forward(g, 0, A, g->off_host[0], err);
            if (st == MOE_OK && what == 0) st = experts_backward(g, 0, A, g->off_host[0], err);
        } else if (what == 1) {
            st = moe_forward(g, 0, A, g->xin[1], err);
            if (st == MOE_OK) {
                gk_to_bf16(g->dh, g->dy16, (size_t)g->T * g->h, g->s);
                st = moe_backward(g, 0, A, err);
            }
        } else {
            st = experts_forward(g, 0, A, dense_off, err);
            if (st == MOE_OK) st = experts_backward(g, 0, A, dense_off, err);
        }
        cudaEventRecord(b, g->s);
        cudaError_t e = cudaEventSynchronize(b);
        float f = 0.0f;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&f, a, b);
        if (e != cudaSuccess && st == MOE_OK)
            st = moe_error_set(err, MOE_ERR_CUDA, "benchmark: %s", cudaGetErrorString(e));
        t[i] = f;
        *syncs = g->syncs - s0;
    }
    *ms = moe_median(t, (size_t)iters);
    free(t);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return st;
}

extern "C" enum moe_status exec_moe_bench(const struct exec_moe_bench_cfg *c, int *choice,
                                          struct exec_moe_bench_result *r, struct moe_error *err)
{
    memset(r, 0, sizeof *r);
    if (c->experts < 1 || c->top_k < 1 || c->top_k > c->experts || c->tokens < 1 || c->hidden < 1 ||
        c->ffn < 1 || c->iters < 1 || c->warmup < 0)
        return moe_error_set(err, MOE_ERR_INPUT, "bench moe: inconsistent shape");
    struct mdl_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "bench-moe");
    m.layers = 1;
    m.moe_every = 1;
    m.hidden = c->hidden;
    m.vocab = 256;
    m.norm_eps = 1e-6;
    m.max_seq_len = 1;
    m.attn.type = MDL_ATTN_GQA;
    m.attn.heads = m.attn.kv_heads = 1;
    m.attn.head_dim = 16;
    m.attn.rope_theta = 10000;
    m.moe.experts = c->experts;
    m.moe.top_k = c->top_k;
    m.moe.intermediate = c->ffn;
    m.moe.scoring = MDL_SCORE_SOFTMAX;
    m.moe.n_group = m.moe.topk_group = 1;
    m.moe.norm_topk = true;
    m.moe.scaling = 1.0;
    /* seeded skewed routing: expert probabilities from Dirichlet(skew), then each token draws
     * top_k distinct experts in proportion to them */
    int E = c->experts, k = c->top_k, T = c->tokens;
    double *p = (double *)malloc(sizeof(double) * E), *q = (double *)malloc(sizeof(double) * E);
    if (!p || !q) {
        free(p), free(q);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    struct moe_rng rng;
    moe_rng_seed(&rng, c->seed);
    if (c->skew > 0) moe_rng_dirichlet(&rng, c->skew, p, (size_t)E);
    else
        for (int e = 0; e < E; e++) p[e] = 1.0 / E;
    for (int t = 0; t < T; t++) {
        memcpy(q, p, sizeof(double) * E);
        for (int j = 0; j < k; j++) {
            double sum = 0.0, u;
            for (int e = 0; e < E; e++) sum += q[e];
            u = moe_rng_uniform(&rng) * sum;
            int e = 0;
            while (e < E - 1 && (u -= q[e]) >= 0) e++;
            while (q[e] == 0.0) e = (e + 1) % E; /* rounding at the end of the range */
            choice[(size_t)t * k + j] = e;
            q[e] = 0.0;
        }
    }
    free(p), free(q);
    /* T sequences of one token: the layer sees T tokens, attention's workspace stays tiny */
    struct exec_gpu_cfg cfg = {1, T, false, 0.0, 0, c->streams, NULL, NULL, 0.0, 0, NULL, NULL, 0, 0.0};
    struct exec_gpu *g = NULL;
    int *dchoice = NULL, dense_off[GK_MAX_EXPERTS + 1];
    enum moe_status st = exec_gpu_create(&g, &m, &cfg, err);
    if (st == MOE_OK) st = exec_gpu_init(g, c->seed, err);
    if (st == MOE_OK && cudaMalloc((void **)&dchoice, sizeof(int) * (size_t)T * k) != cudaSuccess)
        st = moe_error_set(err, MOE_ERR_GPU_NOMEM, "bench moe: out of GPU memory");
    if (st == MOE_OK) {
        struct act *A = &g->act[0];
        size_t th = (size_t)T * c->hidden;
        cudaMemcpyAsync(dchoice, choice, sizeof(int) * (size_t)T * k, cudaMemcpyHostToDevice, g->s);
        g->forced_choice = dchoice;
        g->record_stats = true;
        g->grad_scale = 1.0;
        gk_init(A->b32, th, 0, c->seed + 1, 1.0f, false, g->s);
        gk_to_bf16(A->b32, A->b16, th, g->s);
        gk_init(g->dh, th, 0, c->seed + 2, 1.0f, false, g->s);
        dense_off[0] = 0;
        for (int e = 1; e <= E; e++) dense_off[e] = T * k;
        int syncs = 0;
        double ms;
        /* warm-up (allocations, cuBLAS heuristics), then the three measurements */
        for (int i = 0; i < (c->warmup > 1 ? c->warmup : 1) && st == MOE_OK; i++)
            st = bench_time(g, 1, dense_off, 1, &ms, &syncs, err);
        if (st == MOE_OK) st = bench_time(g, 0, dense_off, c->iters, &r->block_ms, &syncs, err);
        if (st == MOE_OK) st = bench_time(g, 3, dense_off, c->iters, &r->block_fwd_ms, &syncs, err);
        if (st == MOE_OK) st = bench_time(g, 1, dense_off, c->iters, &r->layer_ms, &r->host_syncs, err);
        for (int i = 0; i < c->warmup && st == MOE_OK; i++)
            st = bench_time(g, 2, dense_off, 1, &ms, &syncs, err);
        if (st == MOE_OK) st = bench_time(g, 2, dense_off, c->iters, &r->dense_ms, &syncs, err);
        const int *off = g->off_host[0];
        double mx = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, (double)(off[e + 1] - off[e]));
        r->max_over_mean = mx / ((double)T * k / E);
        double R = (double)T * k, h = c->hidden, f = c->ffn;
        r->block_flops = 18.0 * R * h * f;
        r->layer_flops = r->block_flops + 6.0 * T * h * E;
        /* what one MoE layer keeps for its backward: router input and logits, routing, permuted
         * rows, gate/up outputs, SwiGLU output, expert outputs */
        r->layer_bytes = th * (4.0 + 2.0) + (double)T * E * 4 + R * 4 * 4 + R * h * 2 + R * f * 4 * 2 +
                         R * f * 2 + R * h * 4;
    }
    cudaFree(dchoice);
    exec_gpu_destroy(g);
    return st;
}
