/*
 * gpu_moe.cu: SwiGLU (dense FFN, shared experts, each expert) and the dropless MoE layer on one
 * GPU: router GEMM, top-k (exec_route), a stable counting-sort permutation, one host sync for
 * the per-expert row counts, per-expert GEMMs on every routed (token, expert) pair (nothing
 * dropped or padded), the weighted unpermute (with per-tensor fp8 the permute writes the rows
 * quantized, gpu_fp8_dispatch, not in bf16). With expert parallelism the layer goes to
 * gpu_ep.cu instead.
 */
#include "gpu.h"

/* The hidden rows of a SwiGLU: g16, u16 (the gate and up GEMMs accumulate in fp32 and write bf16,
 * as Megatron's and PyTorch's do) and hm16 = silu(g) u; what selective recompute redoes. */
enum moe_status gpu_swiglu_hidden(struct exec_gpu *g, const bf16 *x, int T, int F, const bf16 *Wg,
                                  const bf16 *Wu, bf16 *g16, bf16 *u16, bf16 *hm16,
                                  struct moe_error *err)
{
    int h = g->hidden;
    MOE_CHECK(gpu_lin(g, x, h, Wg, T, h, F, g16, F, CUDA_R_16BF, 0, err));
    MOE_CHECK(gpu_lin(g, x, h, Wu, T, h, F, u16, F, CUDA_R_16BF, 0, err));
    MOE_CUDA_CHECK(gk_swiglu(g16, u16, hm16, (size_t)T * F, 1.0f, 0.0f, NULL, g->s));
    return MOE_OK;
}

/* y += down(silu(gate x) * up x) for T rows of width F (saving g16, u16, hm16). */
enum moe_status gpu_swiglu_forward(struct exec_gpu *g, const bf16 *x, int T, int F, const bf16 *Wg,
                                   const bf16 *Wu, const bf16 *Wd, bf16 *g16, bf16 *u16, bf16 *hm16,
                                   float *y, struct moe_error *err)
{
    int h = g->hidden;
    MOE_CHECK(gpu_swiglu_hidden(g, x, T, F, Wg, Wu, g16, u16, hm16, err));
    return gpu_lin(g, hm16, F, Wd, T, F, h, y, h, CUDA_R_32F, 1.0f, err);
}

/* Backward of swiglu_forward for dy16: dx (+)= (beta), the gradients of tensors tg, tu, td. */
enum moe_status gpu_swiglu_backward(struct exec_gpu *g, const bf16 *x, const bf16 *dy16, int T,
                                    int F, const bf16 *Wg, const bf16 *Wu, const bf16 *Wd,
                                    const bf16 *g16, const bf16 *u16, const bf16 *hm16, int tg,
                                    int tu, int td, float *dx, float beta, struct moe_error *err)
{
    int h = g->hidden;
    if (T == 0) return MOE_OK;
    MOE_CHECK(gpu_lin_dx(g, dy16, h, Wd, T, F, h, g->dhm16, F, CUDA_R_16BF, 0, err));
    MOE_CHECK(gpu_lin_dw(g, dy16, h, hm16, F, T, F, h, td, 0, err));
    MOE_CUDA_CHECK(gk_swiglu_backward(g16, u16, g->dhm16, g->dg16, g->du16, (size_t)T * F, 1.0f,
                                      0.0f, NULL, g->s));
    MOE_CHECK(gpu_lin_dx(g, g->dg16, F, Wg, T, h, F, dx, h, CUDA_R_32F, beta, err));
    MOE_CHECK(gpu_lin_dw(g, g->dg16, F, x, h, T, h, F, tg, 0, err));
    MOE_CHECK(gpu_lin_dx(g, g->du16, F, Wu, T, h, F, dx, h, CUDA_R_32F, 1.0f, err));
    return gpu_lin_dw(g, g->du16, F, x, h, T, h, F, tu, 0, err);
}

/* body(e, o, n) for every expert e of layer l with rows (n of them, from row o), on its side
 * stream between gpu_fork_experts and gpu_join_experts; an expert with no rows launches nothing. */
template <typename Body>
static enum moe_status each_expert(struct exec_gpu *g, int l, const int *off, Body body,
                                   struct moe_error *err)
{
    MOE_CHECK(gpu_fork_experts(g, l, err));
    for (int e = 0; e < g->experts; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        gpu_use_expert_stream(g, e);
        MOE_CHECK(body(e, (size_t)off[e], n));
    }
    return gpu_join_experts(g, err);
}

/* With gpt-oss's biases, expert e's n output rows (cols wide, from row o of y) start as row e
 * of bias tensor t and its GEMM adds: returns the GEMM's beta, 1; without them 0 (the GEMM
 * writes). The first launch error stays in *ce. */
static float expert_bias_rows(struct exec_gpu *g, int t, int e, size_t o, int n, int cols,
                              float *y32, bf16 *y16, cudaError_t *ce)
{
    if (!g->expert_bias) return 0.0f;
    const float *b = M(g, t) + (size_t)e * cols;
    cudaError_t r = gk_bias_rows(y32 ? y32 + o * cols : NULL, y16 ? y16 + o * cols : NULL, cols, b,
                                 n, cols, false, g->cur_side < 0 ? g->s : g->side[g->cur_side]);
    if (*ce == cudaSuccess) *ce = r;
    return 1.0f;
}

/* fp8 with f8.keep_xt: the kept transposes written or read (gpu_fp8_xt_begin) while it lives */
struct xt_scope {
    struct exec_gpu *g;
    xt_scope(struct exec_gpu *g_, int l, const struct act *A, const int *off, bool forward) : g(g_)
    {
        gpu_fp8_xt_begin(g, l, A, off, forward);
    }
    ~xt_scope() { gpu_fp8_xt_end(g); }
};

/* The expert block on the permuted rows xp16 (expert e: rows off[e] .. off[e+1]): gate and up
 * GEMMs (with their biases), the activation, down GEMM (with its bias) into yp32. With
 * per-tensor fp8 the gate and up GEMMs take the rows as the permute quantized them
 * (gpu_fp8_dispatch; else xp16's amax as the gather kept it), the down GEMMs hm's amax as SwiGLU
 * keeps it. */
enum moe_status gpu_experts_forward(struct exec_gpu *g, int l, struct act *A, const int *off,
                                    struct moe_error *err)
{
    const int *w = g->wi[l];
    int h = g->hidden, E = g->experts, f = g->ffn;
    if (!g->m.moe.probs_on_input) gpu_fp8_know(g, l, F8_X, A->xp16, h);
    xt_scope keep(g, l, A, off, true); /* x's and hm's transposes kept for the backward */
    MOE_CHECK(each_expert(
        g, l, off,
        [&](int e, size_t o, int n) {
            cudaError_t ce = cudaSuccess;
            float bg = expert_bias_rows(g, w[W_GATE_B], e, o, n, f, NULL, A->eg16, &ce);
            float bu = expert_bias_rows(g, w[W_UP_B], e, o, n, f, NULL, A->eu16, &ce);
            MOE_CUDA_CHECK(ce);
            MOE_CHECK(gpu_lin(g, A->xp16 + o * h, h, W16(g, w[W_GATE]) + (size_t)e * f * h, n, h, f,
                              A->eg16 + o * f, f, CUDA_R_16BF, bg, err));
            return gpu_lin(g, A->xp16 + o * h, h, W16(g, w[W_UP]) + (size_t)e * f * h, n, h, f,
                           A->eu16 + o * f, f, CUDA_R_16BF, bu, err);
        },
        err));
    if (g->f8.fuse && g->f8.act == EXEC_FP8_TILE_1X128 && gpu_fp8_fused_ok(g, l)) {
        /* blockwise: the down GEMMs' input quantized here too (per-tensor scaling waits for the
         * whole expert's amax: below, SwiGLU keeps it) */
        exec_fp8_regions(off, E, f, g->f8pre.qo, g->f8pre.so, g->f8pre.sto);
        MOE_CHECK(gpu_upload(g, g->f8pre.off_dev, off, sizeof(int) * (E + 1), err));
        MOE_CUDA_CHECK(gk_fp8_swiglu_forward(A->eg16, A->eu16, g->f8pre.off_dev, off, E, f,
                                             g->act_alpha, g->act_limit, 0, A->ehm16, g->f8pre.q[0],
                                             g->f8pre.s[0], g->s));
        g->f8pre.key[0] = A->ehm16, g->f8pre.off = off;
    } else {
        struct gk_amax_rows am;
        const struct gk_amax_rows *keep;
        MOE_CHECK(gpu_fp8_rows(g, l, F8_HM, 1, A->off, f, &am, &keep, err));
        MOE_CUDA_CHECK(gk_swiglu(A->eg16, A->eu16, A->ehm16, (size_t)off[E] * f, g->act_alpha,
                                 g->act_limit, keep, g->s));
        gpu_fp8_know(g, l, F8_HM, A->ehm16, f);
    }
    enum moe_status st = each_expert(
        g, l, off,
        [&](int e, size_t o, int n) {
            cudaError_t ce = cudaSuccess;
            float bd = expert_bias_rows(g, w[W_DOWN_B], e, o, n, h, A->yp32, NULL, &ce);
            MOE_CUDA_CHECK(ce);
            return gpu_lin(g, A->ehm16 + o * f, f, W16(g, w[W_DOWN]) + (size_t)e * h * f, n, f, h,
                           A->yp32 + o * h, h, CUDA_R_32F, bd, err);
        },
        err);
    g->f8pre.key[0] = NULL, g->nf8known = 0;
    return st;
}

/* Its backward from dyp16: the rows' gradient (dxg16 + dxu16, each GEMM's own bf16 output, summed
 * in fp32 by their consumer) and the expert weight gradients; a bias's gradient is its rows'
 * column sums, a GEMM with the ones vector. With per-tensor fp8 the GEMMs take the amax the
 * forward's kernels kept (xp16's, hm's: the same values, redone or not), dyp16's as the
 * combine's backward kept it, dg's and du's as SwiGLU's backward keeps them. */
enum moe_status gpu_experts_backward(struct exec_gpu *g, int l, const struct act *A, const int *off,
                                     struct moe_error *err)
{
    const int *w = g->wi[l];
    int h = g->hidden, E = g->experts, f = g->ffn;
    if (g->cfg.recompute_modules & COST_RC_BIT(COST_RC_MOE_ACT)) { /* the activation, redone */
        PH(COST_EXPERTS_FWD);
        MOE_CUDA_CHECK(gk_swiglu(A->eg16, A->eu16, A->ehm16, (size_t)off[E] * f, g->act_alpha,
                                 g->act_limit, NULL, g->s));
        PH(COST_EXPERTS_BWD);
    }
    if (!g->m.moe.probs_on_input) gpu_fp8_know(g, l, F8_X, A->xp16, h);
    gpu_fp8_know(g, l, F8_HM, A->ehm16, f);
    gpu_fp8_know(g, l, F8_DY, g->dyp16, h);
    xt_scope kept(g, l, A, off, false); /* x's and hm's transposes as the forward kept them */
    if (!g->xt.set && gpu_fp8_dispatch_ok(g, l, A)) /* xp16 unwritten: nothing to quantize */
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "executor: layer %d's backward finds no kept transpose of the "
                             "experts' input its forward quantized in the permute",
                             l);
    MOE_CHECK(each_expert(
        g, l, off,
        [&](int e, size_t o, int n) {
            MOE_CHECK(gpu_lin_dx(g, g->dyp16 + o * h, h, W16(g, w[W_DOWN]) + (size_t)e * h * f, n,
                                 f, h, g->dehm16 + o * f, f, CUDA_R_16BF, 0, err));
            MOE_CHECK(gpu_lin_dw(g, g->dyp16 + o * h, h, A->ehm16 + o * f, f, n, f, h, w[W_DOWN], e,
                                 err));
            if (g->expert_bias)
                MOE_CHECK(
                    gpu_lin_dw(g, g->dyp16 + o * h, h, g->ones16, 1, n, 1, h, w[W_DOWN_B], e, err));
            return MOE_OK;
        },
        err));
    bool fused = g->f8.fuse && gpu_fp8_fused_ok(g, l);
    if (fused) { /* the gradients quantized for the GEMMs below, never in bf16 */
        exec_fp8_regions(off, E, f, g->f8pre.qo, g->f8pre.so, g->f8pre.sto);
        MOE_CHECK(gpu_upload(g, g->f8pre.off_dev, off, sizeof(int) * (E + 1), err));
        const unsigned *amax = NULL; /* per-tensor: each expert's scales first, a pass of SwiGLU's
                                      * backward that writes its amax alone */
        if (g->f8.act == EXEC_FP8_TENSOR) {
            struct gk_amax_rows am;
            const struct gk_amax_rows *keep;
            MOE_CHECK(gpu_fp8_rows(g, l, F8_DG, 2, g->f8pre.off_dev, f, &am, &keep, err));
            if (!keep)
                return moe_error_set(err, MOE_ERR_RUNTIME,
                                     "executor: layer %d keeps no amax for its fused SwiGLU", l);
            MOE_CUDA_CHECK(gk_swiglu_backward(A->eg16, A->eu16, g->dehm16, NULL, NULL,
                                              (size_t)off[E] * f, g->act_alpha, g->act_limit, keep,
                                              g->s));
            amax = keep->amax[0]; /* dg's, then du's: F8_DG, F8_DU */
        }
        MOE_CUDA_CHECK(gk_fp8_swiglu_backward(
            A->eg16, A->eu16, g->dehm16, g->f8pre.off_dev, off, E, f, g->act_alpha, g->act_limit,
            g->cfg.fp8_e5m2_grads, amax, g->f8pre.q[0], g->f8pre.qt[0], g->f8pre.s[0],
            g->f8pre.st[0], g->f8pre.q[1], g->f8pre.qt[1], g->f8pre.s[1], g->f8pre.st[1], g->s));
        g->f8pre.key[0] = g->deg16, g->f8pre.key[1] = g->deu16, g->f8pre.off = off;
    } else {
        struct gk_amax_rows am;
        const struct gk_amax_rows *keep;
        MOE_CHECK(gpu_fp8_rows(g, l, F8_DG, 2, A->off, f, &am, &keep, err));
        MOE_CUDA_CHECK(gk_swiglu_backward(A->eg16, A->eu16, g->dehm16, g->deg16, g->deu16,
                                          (size_t)off[E] * f, g->act_alpha, g->act_limit, keep,
                                          g->s));
        gpu_fp8_know(g, l, F8_DG, g->deg16, f);
        gpu_fp8_know(g, l, F8_DU, g->deu16, f);
    }
    enum moe_status st = each_expert(
        g, l, off,
        [&](int e, size_t o, int n) {
            MOE_CHECK(gpu_lin_dx(g, g->deg16 + o * f, f, W16(g, w[W_GATE]) + (size_t)e * f * h, n,
                                 h, f, g->dxg16 + o * h, h, CUDA_R_16BF, 0, err));
            MOE_CHECK(
                gpu_lin_dw(g, g->deg16 + o * f, f, A->xp16 + o * h, h, n, h, f, w[W_GATE], e, err));
            MOE_CHECK(gpu_lin_dx(g, g->deu16 + o * f, f, W16(g, w[W_UP]) + (size_t)e * f * h, n, h,
                                 f, g->dxu16 + o * h, h, CUDA_R_16BF, 0, err));
            MOE_CHECK(
                gpu_lin_dw(g, g->deu16 + o * f, f, A->xp16 + o * h, h, n, h, f, w[W_UP], e, err));
            if (g->expert_bias) {
                MOE_CHECK(
                    gpu_lin_dw(g, g->deg16 + o * f, f, g->ones16, 1, n, 1, f, w[W_GATE_B], e, err));
                MOE_CHECK(
                    gpu_lin_dw(g, g->deu16 + o * f, f, g->ones16, 1, n, 1, f, w[W_UP_B], e, err));
            }
            return MOE_OK;
        },
        err);
    g->f8pre.key[0] = g->f8pre.key[1] = NULL; /* the bf16 buffers' keys no more */
    g->nf8known = 0;
    return st;
}

/* ---- expert parallelism ------------------------------------------------------------------- */

/* The dropless MoE layer on b16 / b32 (T rows), adding into y. */
enum moe_status gpu_moe_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                                struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, E = g->experts, k = g->top_k, P = g->pairs,
        mi = g->moe_index[l];
    int *off = g->off_host[l];
    bool dispatch = gpu_fp8_dispatch_ok(g, l, A); /* fp8: x quantized in the permute */
    PH(COST_ROUTER);
    if (g->expert_bias) /* gpt-oss: the logits start as the router's bias */
        MOE_CUDA_CHECK(gk_bias_rows(A->logits, NULL, E, M(g, w[W_ROUTER_B]), T, E, false, g->s));
    MOE_CHECK(gpu_mm(g, false, true, T, E, h, 1.0f, A->b32, h, 0, M(g, w[W_ROUTER]), h, 0,
                     g->expert_bias ? 1.0f : 0.0f, A->logits, E, 0, 1, CUDA_R_32F, CUDA_R_32F,
                     err));
    MOE_CHECK(exec_route(&g->rc, A->logits, g->bias + (size_t)l * E, T,
                         g->forced_choice ? g->forced_choice + (size_t)mi * P : NULL, A->choice,
                         A->weight, g->s, err));
    if (g->record_stats)
        MOE_CUDA_CHECK(gk_coactivation(A->choice, T, k, E, g->coact + (size_t)mi * E * E, g->s));
    PH(COST_PERMUTE);
    MOE_CUDA_CHECK(gk_permute_count(A->choice, P, E, g->perm_cnt, g->perm_base, A->off, g->s));
    MOE_CUDA_CHECK(
        cudaMemcpyAsync(off, A->off, sizeof(int) * (E + 1), cudaMemcpyDeviceToHost, g->s));
    if (!g->cfg.ep) { /* with EP the exchange places the rows (ep_forward) */
        MOE_CUDA_CHECK(
            gk_permute_place(A->choice, P, E, g->perm_base, A->off, A->row_src, A->pos, g->s));
        if (dispatch) { /* the experts' scales now, their rows quantized once off is known */
            MOE_CHECK(gpu_fp8_dispatch_amax(g, l, A, err));
        } else {
            struct gk_amax_rows am; /* per-tensor fp8: the rows' amax for the experts' GEMMs */
            const struct gk_amax_rows *keep = NULL;
            if (!g->m.moe.probs_on_input) /* Llama 4's rows change below */
                MOE_CHECK(gpu_fp8_rows(g, l, F8_X, 1, A->off, h, &am, &keep, err));
            MOE_CUDA_CHECK(gk_gather(A->b16, A->row_src, k, P, h, A->xp16, keep, g->s));
            if (g->m.moe.probs_on_input) /* Llama 4: each row times its routing weight */
                MOE_CUDA_CHECK(gk_scale_rows(A->xp16, A->weight, A->pos, P, h, g->s));
        }
    } else { /* the counts stay: the load statistics and the load-balance loss read them */
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->choice_host, A->choice, sizeof(int) * (size_t)P,
                                       cudaMemcpyDeviceToHost, g->s));
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->weight_host, A->weight, sizeof(float) * (size_t)P,
                                       cudaMemcpyDeviceToHost, g->s));
    }
    MOE_CHECK(gpu_sync_host(g, err)); /* the per-expert row counts decide the GEMM shapes */
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
            auxg[e] = (float)(g->grad_scale * g->rc.aux_coef * E *
                              ((double)(off[e + 1] - off[e]) / P) / T);
        MOE_CUDA_CHECK(
            cudaMemcpyAsync(A->auxg, auxg, sizeof(float) * E, cudaMemcpyHostToDevice, g->s));
        MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    }
    if (g->cfg.ep) {
        MOE_CHECK(gpu_ep_forward(g, l, A, y, err));
    } else {
        if (dispatch) MOE_CHECK(gpu_fp8_dispatch(g, l, A, off, err));
        PH(COST_EXPERTS_FWD);
        MOE_CHECK(gpu_experts_forward(g, l, A, off, err));
        PH(COST_UNPERMUTE);
        MOE_CUDA_CHECK(gk_combine(y, A->yp32, g->m.moe.probs_on_input ? NULL : A->weight, A->pos, T,
                                  k, h, g->s));
    }
    if (g->shared_ffn) {
        PH(COST_SHARED_EXPERT);
        MOE_CHECK(gpu_swiglu_forward(g, A->b16, T, g->shared_ffn, W16(g, w[W_SGATE]),
                                     W16(g, w[W_SUP]), W16(g, w[W_SDOWN]), A->g16, A->u16, A->hm16,
                                     y, err));
    }
    return MOE_OK;
}

/* The load-balance loss of MoE layer l from its saved routing (one host sync). */
enum moe_status gpu_moe_aux_loss(struct exec_gpu *g, int l, const struct act *A, double *aux,
                                 struct moe_error *err)
{
    int T = g->tokens, E = g->experts, P = g->pairs;
    const int *off = g->off_host[l];
    MOE_CUDA_CHECK(gk_scores(&g->rc, A->logits, T, g->scores, g->s));
    MOE_CUDA_CHECK(gk_colsum(g->scores, E, NULL, 0, NULL, T, E, g->part, g->ytmp, false, g->s));
    float sums[GK_MAX_EXPERTS];
    MOE_CUDA_CHECK(cudaMemcpyAsync(sums, g->ytmp, sizeof(float) * E, cudaMemcpyDeviceToHost, g->s));
    MOE_CHECK(gpu_sync_host(g, err));
    double a = 0.0;
    for (int e = 0; e < E; e++) a += (double)(off[e + 1] - off[e]) / P * sums[e] / T;
    *aux += g->rc.aux_coef * E * a;
    return MOE_OK;
}

/* Backward of the MoE layer for dy16 / dy (fp32): db32 = d input, weight gradients +=. */
enum moe_status gpu_moe_backward(struct exec_gpu *g, int l, const struct act *A,
                                 struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, E = g->experts, k = g->top_k;
    const int *off = g->off_host[l];
    if (g->shared_ffn) {
        PH(COST_SHARED_EXPERT);
        if (g->cfg.recompute_modules & COST_RC_BIT(COST_RC_SHARED_EXPERTS))
            MOE_CHECK(gpu_swiglu_hidden(g, A->b16, T, g->shared_ffn, W16(g, w[W_SGATE]),
                                        W16(g, w[W_SUP]), A->g16, A->u16, A->hm16, err));
        MOE_CHECK(gpu_swiglu_backward(g, A->b16, g->dy16, T, g->shared_ffn, W16(g, w[W_SGATE]),
                                      W16(g, w[W_SUP]), W16(g, w[W_SDOWN]), A->g16, A->u16, A->hm16,
                                      w[W_SGATE], w[W_SUP], w[W_SDOWN], g->db32, 0.0f, err));
    }
    if (g->cfg.ep) {
        MOE_CHECK(gpu_ep_backward(g, l, A, err));
    } else {
        PH(COST_UNPERMUTE);
        bool in = g->m.moe.probs_on_input; /* Llama 4: the weights' gradient from the input */
        struct gk_amax_rows am; /* per-tensor fp8: the rows' amax for the experts' GEMMs */
        const struct gk_amax_rows *keep;
        MOE_CHECK(gpu_fp8_rows(g, l, F8_DY, 1, A->off, h, &am, &keep, err));
        MOE_CUDA_CHECK(gk_combine_backward(g->dh, A->yp32, in ? NULL : A->weight, A->pos, T, k, h,
                                           g->dyp16, g->dw, keep, g->s));
        PH(COST_EXPERTS_BWD);
        MOE_CHECK(gpu_experts_backward(g, l, A, off, err));
        PH(COST_PERMUTE);
        if (in)
            MOE_CUDA_CHECK(gk_gather_sum_scaled(g->dxg16, g->dxu16, A->pos, A->weight, A->b16, T, k,
                                                h, g->db32, g->shared_ffn > 0, g->dw, g->s));
        else
            MOE_CUDA_CHECK(gk_gather_sum(g->dxg16, g->dxu16, A->pos, T, k, h, g->db32,
                                         g->shared_ffn > 0, g->s));
    }
    PH(COST_ROUTER);
    MOE_CUDA_CHECK(gk_router_backward(&g->rc, A->logits, A->choice, A->weight, g->dw,
                                      g->rc.aux_coef != 0.0 ? A->auxg : NULL, T, g->dz, g->s));
    if (g->expert_bias)
        MOE_CUDA_CHECK(gk_colsum(g->dz, E, NULL, 0, NULL, T, E, g->part, GR(g, w[W_ROUTER_B]),
                                 !gpu_grad_first(g, w[W_ROUTER_B], 0), g->s));
    bool first = gpu_grad_first(g, w[W_ROUTER], 0);
    MOE_CHECK(gpu_mm(g, true, false, E, h, T, 1.0f, g->dz, E, 0, A->b32, h, 0, first ? 0.0f : 1.0f,
                     GR(g, w[W_ROUTER]), h, 0, 1, CUDA_R_32F, CUDA_R_32F, err));
    return gpu_mm(g, false, false, T, h, E, 1.0f, g->dz, E, 0, M(g, w[W_ROUTER]), h, 0, 1.0f,
                  g->db32, h, 0, 1, CUDA_R_32F, CUDA_R_32F, err);
}

/* ---- blocks ------------------------------------------------------------------------------- */
