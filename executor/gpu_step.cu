/*
 * gpu_step.cu: the training step on one GPU: forward and backward of the whole model for a
 * micro-batch, gradient accumulation, clipping and AdamW, phase timing and memory accounting.
 *
 * It follows the reference step (ref_model.c) operation by operation, so that the gpu tests can
 * compare every gradient:
 *   embedding -> blocks [RMSNorm, attention (GQA with RoPE, or MLA), residual, RMSNorm,
 *   dense SwiGLU or the dropless MoE layer, residual] -> final RMSNorm -> LM head -> loss.
 * Precision: bf16 weights (copies of fp32 masters) and GEMM inputs, fp32 accumulation, the
 * residual stream and the activation gradients in fp32 (SwiGLU's gate / up outputs and the gradient
 * of its product, the logits and theirs, the expert block's input gradient from each of its two
 * GEMMs are bf16), the router entirely in fp32.
 */
#include "gpu.h"

/* Mark the start of a phase (and the end of the one before); -1 ends the last. */
enum moe_status gpu_phase(struct exec_gpu *g, int ph, struct moe_error *err)
{
    gpu_fp8_forget(g); /* what the fp8 GEMMs kept is not reused across a phase mark */
    if (g->nev == MAX_EVENTS) {
        g->ev_overflow = true; /* the rest of the step counts to the last phase */
        return MOE_OK;
    }
    if (g->nev > 0 && g->ev_phase[g->nev - 1] == ph) return MOE_OK;
    if (g->nev == g->ev_created) {
        MOE_CUDA_CHECK(cudaEventCreate(&g->ev[g->nev]));
        g->ev_created++;
    }
    MOE_CUDA_CHECK(cudaEventRecord(g->ev[g->nev], g->s));
    g->ev_phase[g->nev++] = ph;
    return MOE_OK;
}

void gpu_grads_fresh(struct exec_gpu *g)
{
    memset(g->gfresh, 1, (size_t)g->gslice[g->table.ntensors]);
}

bool gpu_grad_first(struct exec_gpu *g, int t, int s)
{
    unsigned char *f = &g->gfresh[g->gslice[t] + s];
    bool first = *f;
    *f = 0;
    return first;
}

enum moe_status gpu_grads_settle(struct exec_gpu *g, size_t lo, size_t hi, struct moe_error *err)
{
    for (int t = 0; t < g->table.ntensors; t++) {
        const struct exec_tensor *x = &g->table.tensor[t];
        if (x->offset < lo || x->offset >= hi) continue;
        int n = g->gslice[t + 1] - g->gslice[t];
        size_t each = x->size / (size_t)n;
        for (int s = 0; s < n; s++)
            if (gpu_grad_first(g, t, s))
                MOE_CUDA_CHECK(
                    cudaMemsetAsync(GR(g, t) + (size_t)s * each, 0, sizeof(float) * each, g->s));
    }
    return MOE_OK;
}

static enum moe_status block_forward(struct exec_gpu *g, int l, const float *x, float *y,
                                     struct act *A, double *aux, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden;
    float eps = (float)g->m.norm_eps;
    bool moe = g->moe_index[l] >= 0;
    PH(COST_ATTN_FWD);
    MOE_CUDA_CHECK(gk_rmsnorm(x, h, M(g, w[W_ATTN_NORM]), T, h, eps, A->a16, h, NULL, 0, A->h1, h,
                              A->rstd1, g->s)); /* h1 starts as x: the projection adds */
    MOE_CHECK(gpu_attn_forward(g, l, A, err));
    if (g->attn_bias)
        MOE_CUDA_CHECK(gk_bias_rows(A->h1, NULL, h, M(g, w[W_O_BIAS]), T, h, true, g->s));
    MOE_CHECK(gpu_lin(g, A->o16, g->heads * g->dv, W16(g, w[W_WO]), T, g->heads * g->dv, h, A->h1,
                      h, CUDA_R_32F, 1.0f, err));
    PH(moe ? COST_ROUTER : COST_DENSE_FFN);
    MOE_CUDA_CHECK(gk_rmsnorm(A->h1, h, M(g, w[W_FFN_NORM]), T, h, eps, A->b16, h,
                              moe ? A->b32 : NULL, h, y, h, A->rstd2, g->s)); /* y starts as h1 */
    if (moe) {
        MOE_CHECK(gpu_moe_forward(g, l, A, y, err));
        if (aux && g->rc.aux_coef != 0.0) MOE_CHECK(gpu_moe_aux_loss(g, l, A, aux, err));
        return MOE_OK;
    }
    return gpu_swiglu_forward(g, A->b16, T, g->dense_ffn, W16(g, w[W_GATE]), W16(g, w[W_UP]),
                              W16(g, w[W_DOWN]), A->g16, A->u16, A->hm16, y, err);
}

/* dh (fp32, the gradient of the block output; dy16 its bf16 copy) -> dprev (the block input's,
 * and dy16 again its copy, for the block below). */
static enum moe_status block_backward(struct exec_gpu *g, int l, const float *x,
                                      const struct act *A, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, Hd = g->heads * g->dv;
    float eps = (float)g->m.norm_eps;
    bool moe = g->moe_index[l] >= 0;
    unsigned rc = g->cfg.recompute_modules;
    /* Selective recompute is timed as the forward phase it repeats, as the planner counts it:
     * the norms, MLA's up-projections and the attention core in attn_fwd, the experts' activation in experts_fwd, a
     * dense FFN and the shared experts in their own phases. */
    if (rc & COST_RC_BIT(COST_RC_LAYERNORM)) { /* the FFN norm's outputs */
        PH(COST_ATTN_FWD);
        MOE_CUDA_CHECK(gk_rmsnorm(A->h1, h, M(g, w[W_FFN_NORM]), T, h, eps, A->b16, h,
                                  moe ? A->b32 : NULL, h, NULL, 0, A->rstd2, g->s));
    }
    if (moe) {
        MOE_CHECK(gpu_moe_backward(g, l, A, err));
    } else {
        PH(COST_DENSE_FFN);
        if (rc & COST_RC_BIT(COST_RC_MLP))
            MOE_CHECK(gpu_swiglu_hidden(g, A->b16, T, g->dense_ffn, W16(g, w[W_GATE]),
                                        W16(g, w[W_UP]), A->g16, A->u16, A->hm16, err));
        MOE_CHECK(gpu_swiglu_backward(g, A->b16, g->dy16, T, g->dense_ffn, W16(g, w[W_GATE]),
                                      W16(g, w[W_UP]), W16(g, w[W_DOWN]), A->g16, A->u16, A->hm16,
                                      w[W_GATE], w[W_UP], w[W_DOWN], g->db32, 0.0f, err));
    }
    /* h1 = x + attn: dh1 = dy + norm backward of the FFN input (in place in dh) */
    MOE_CUDA_CHECK(gk_rmsnorm_backward(A->h1, h, M(g, w[W_FFN_NORM]), A->rstd2, g->db32, h, g->dh,
                                       h, g->dh, g->dh16, h, T, h, g->s));
    MOE_CUDA_CHECK(gk_colsum(g->db32, h, A->h1, h, A->rstd2, T, h, g->part, GR(g, w[W_FFN_NORM]),
                             !gpu_grad_first(g, w[W_FFN_NORM], 0), g->s));
    /* in the order the forward made them: the norm's output, MLA's q, k and v, the core's */
    bool rc_up = g->mla && (rc & COST_RC_BIT(COST_RC_MLA_UP_PROJ));
    if (rc_up || (rc & (COST_RC_BIT(COST_RC_CORE_ATTN) | COST_RC_BIT(COST_RC_LAYERNORM))))
        PH(COST_ATTN_FWD);
    if (rc & COST_RC_BIT(COST_RC_LAYERNORM)) /* the attention norm's output */
        MOE_CUDA_CHECK(gk_rmsnorm(x, h, M(g, w[W_ATTN_NORM]), T, h, eps, A->a16, h, NULL, 0, NULL,
                                  0, A->rstd1, g->s));
    if (rc_up) MOE_CHECK(gpu_mla_up_proj(g, l, A, err));
    if (rc & COST_RC_BIT(COST_RC_CORE_ATTN)) /* the attention's output and lse */
        MOE_CHECK(gpu_attn_core(g, l, A, err));
    PH(COST_ATTN_BWD);
    MOE_CHECK(
        gpu_lin_dx(g, g->dh16, h, W16(g, w[W_WO]), T, Hd, h, g->do16, Hd, CUDA_R_16BF, 0.0f, err));
    MOE_CHECK(gpu_lin_dw(g, g->dh16, h, A->o16, Hd, T, Hd, h, w[W_WO], 0, err));
    if (g->attn_bias)
        MOE_CUDA_CHECK(gk_colsum(g->dh, h, NULL, 0, NULL, T, h, g->part, GR(g, w[W_O_BIAS]),
                                 !gpu_grad_first(g, w[W_O_BIAS], 0), g->s));
    MOE_CHECK(gpu_attn_backward(g, l, A, err));
    MOE_CUDA_CHECK(gk_rmsnorm_backward(x, h, M(g, w[W_ATTN_NORM]), A->rstd1, g->da32, h, g->dh, h,
                                       g->dprev, g->dy16, h, T, h, g->s));
    MOE_CUDA_CHECK(gk_colsum(g->da32, h, x, h, A->rstd1, T, h, g->part, GR(g, w[W_ATTN_NORM]),
                             !gpu_grad_first(g, w[W_ATTN_NORM], 0), g->s));
    return MOE_OK;
}

/* ---- creation ------------------------------------------------------------------------------ */

extern "C" enum moe_status exec_gpu_step_begin(struct exec_gpu *g, struct moe_error *err)
{
    g->nev = 0;
    g->ev_overflow = false;
    g->syncs = 0;
    g->sent.nvlink = g->sent.scale_out = 0.0;
    g->mb_done = 0;
    g->started = g->bucketing = false;
    memset(g->step_load, 0, sizeof(int64_t) * (size_t)(g->nmoe ? g->nmoe : 1) * g->experts);
    gpu_grads_fresh(g); /* no zeroing pass: each gradient's first writer overwrites it */
    PH(COST_EMBED);     /* the host's share of loading the tokens counts to it */
    return MOE_OK;
}

/* The embedding backward's plan (gk_embed_plan, on the host, where the tokens are), to the GPU. */
static enum moe_status embed_plan(struct exec_gpu *g, const int *tokens, struct moe_error *err)
{
    gk_embed_plan(tokens, g->mbs, g->seq, g->seq + 1, g->emb_count, g->emb_host, &g->emb_work);
    MOE_CUDA_CHECK(cudaMemcpyAsync(g->emb_dev, g->emb_host,
                                   sizeof(int) * gk_embed_plan_ints(g->tokens),
                                   cudaMemcpyHostToDevice, g->s));
    return MOE_OK;
}

/* The tokens of a micro-batch to the GPU (inputs and targets); MOE_ERR_INPUT for a token outside
 * the vocabulary. The embedding's backward plan (embed_plan) is made later, by the host while the
 * GPU runs the forward. */
static enum moe_status load_tokens(struct exec_gpu *g, const int *tokens, struct moe_error *err)
{
    for (int i = 0; i < g->mbs * (g->seq + 1); i++)
        if (tokens[i] < 0 || tokens[i] >= g->vocab)
            return moe_error_set(err, MOE_ERR_INPUT, "executor: token %d is %d, vocab %d", i,
                                 tokens[i], g->vocab);
    PH(COST_EMBED);
    MOE_CUDA_CHECK(cudaMemcpyAsync(g->tok, tokens, sizeof(int) * (size_t)g->mbs * (g->seq + 1),
                                   cudaMemcpyHostToDevice, g->s));
    MOE_CUDA_CHECK(gk_split(g->tok, g->mbs, g->seq, g->tok_in, g->tgt, g->s));
    return MOE_OK;
}

/* Blocks [lo, hi) forward from xin[lo] (lo 0: the embedding of the tokens), and, when hi is the
 * last, the head and the loss with its gradient (grad_scale / T a row) into dlog16. */
static enum moe_status forward_part(struct exec_gpu *g, int lo, int hi, double *aux_sum,
                                    struct moe_error *err)
{
    int T = g->tokens, h = g->hidden, V = g->vocab, L = g->layers;
    if (lo == 0) MOE_CUDA_CHECK(gk_embed(M(g, g->embed), g->tok_in, T, h, g->xin[0], g->s));
    for (int l = lo; l < hi; l++)
        MOE_CHECK(block_forward(g, l, g->xin[l], g->xin[l + 1], &g->act[l], aux_sum, err));
    if (hi < L) return MOE_OK;
    PH(COST_LM_HEAD);
    MOE_CUDA_CHECK(gk_rmsnorm(g->xin[L], h, M(g, g->final_norm), T, h, (float)g->m.norm_eps,
                              g->fin16, h, NULL, 0, NULL, 0, g->rstdf, g->s));
    MOE_CHECK(gpu_lin(g, g->fin16, h, W16(g, g->head), T, h, V, g->logits, V, CUDA_R_16BF, 0, err));
    PH(COST_LOSS);
    MOE_CUDA_CHECK(
        gk_cross_entropy(g->logits, g->tgt, T, V, (float)(g->grad_scale / T), g->row_loss, g->s));
    MOE_CUDA_CHECK(cudaMemcpyAsync(g->host_rows, g->row_loss, sizeof(float) * T,
                                   cudaMemcpyDeviceToHost, g->s));
    return MOE_OK;
}

/* Blocks [lo, hi) backward, from the loss (hi the last) or from g->dh (the gradient of
 * xin[hi]); ends with g->dh the gradient of xin[lo], or in the embedding's gradient (lo 0). */
static enum moe_status backward_part(struct exec_gpu *g, int lo, int hi, struct moe_error *err)
{
    int T = g->tokens, h = g->hidden, V = g->vocab, L = g->layers;
    if (hi == L) {
        PH(COST_LM_HEAD);
        MOE_CHECK(gpu_lin_dx(g, g->dlog16, V, W16(g, g->head), T, h, V, g->dfin32, h, CUDA_R_32F, 0,
                             err));
        MOE_CHECK(gpu_lin_dw(g, g->dlog16, V, g->fin16, h, T, h, V, g->head, 0, err));
        MOE_CUDA_CHECK(gk_rmsnorm_backward(g->xin[L], h, M(g, g->final_norm), g->rstdf, g->dfin32,
                                           h, NULL, 0, g->dh, g->dy16, h, T, h, g->s));
        MOE_CUDA_CHECK(gk_colsum(g->dfin32, h, g->xin[L], h, g->rstdf, T, h, g->part,
                                 GR(g, g->final_norm), !gpu_grad_first(g, g->final_norm, 0), g->s));
    } else { /* the gradient of xin[hi] came in dh */
        MOE_CUDA_CHECK(gk_to_bf16(g->dh, g->dy16, (size_t)T * h, g->s));
    }
    for (int l = hi - 1; l >= lo; l--) {
        if (g->cfg.recompute) {
            g->record_stats = false;
            MOE_CHECK(block_forward(g, l, g->xin[l], g->yscr, &g->act[l], NULL, err));
        }
        MOE_CHECK(block_backward(g, l, g->xin[l], &g->act[l], err));
        if (g->bucketing) { /* block l's gradients are complete: its all-reduce starts */
            struct exec_transport *dp = g->cfg.dp;
            size_t a = g->blk_off[l], b = g->blk_off[l + 1];
            MOE_CHECK(gpu_grads_settle(g, a, b, err));
            MOE_CHECK(dp->ops->allreduce_f32_start(dp, g->grad + a, b - a, g->s, err));
            g->started = true;
        }
        float *t = g->dh;
        g->dh = g->dprev;
        g->dprev = t;
    }
    if (lo > 0) return MOE_OK;
    PH(COST_EMBED);
    if (gpu_grad_first(g, g->embed, 0)) /* it adds at the rows of the tokens seen */
        MOE_CUDA_CHECK(cudaMemsetAsync(GR(g, g->embed), 0,
                                       sizeof(float) * g->table.tensor[g->embed].size, g->s));
    /* dprev, the gradient of block lo + 1's input, is spent: the scratch rows */
    MOE_CUDA_CHECK(
        gk_embed_backward(g->dh, g->emb_dev, T, &g->emb_work, h, g->dprev, GR(g, g->embed), g->s));
    return MOE_OK;
}

/* The loss after the work queued so far: the mean cross-entropy when the head ran, plus aux. */
static enum moe_status finish_loss(struct exec_gpu *g, bool head, double aux_sum, double *loss,
                                   double *aux, struct moe_error *err)
{
    MOE_CHECK(gpu_sync_host(g, err));
    double sum = 0.0;
    for (int t = 0; head && t < g->tokens; t++) sum += g->host_rows[t];
    *loss = (head ? sum / g->tokens : 0.0) + aux_sum;
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
    MOE_CHECK(load_tokens(g, tokens, err));
    MOE_CHECK(forward_part(g, 0, g->layers, &aux_sum, err));
    MOE_CHECK(embed_plan(g, tokens, err)); /* the GPU has the head and the loss to run */
    MOE_CHECK(backward_part(g, 0, g->layers, err));
    g->bucketing = false;
    g->mb_done++;
    return finish_loss(g, true, aux_sum, loss, aux, err);
}

extern "C" enum moe_status exec_gpu_slice(struct exec_gpu *g, const int *tokens, int lo, int hi,
                                          const float *h_in, float *h_out, const float *dh_out,
                                          float *dh_in, bool backward, double grad_scale,
                                          double *loss, double *aux, struct moe_error *err)
{
    int L = g->layers;
    size_t th = sizeof(float) * (size_t)g->tokens * g->hidden;
    if (lo < 0 || hi > L || lo >= hi || (lo > 0 && !h_in) || (hi < L && !backward && !h_out) ||
        (hi < L && backward && !dh_out) || (lo > 0 && backward && !dh_in) || g->cfg.ep)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "executor: a slice of blocks [%d, %d) of %d needs its input, output "
                             "and gradients (and no expert parallelism)",
                             lo, hi, L);
    double aux_sum = 0.0;
    g->record_stats = !backward; /* the backward's forward is a recomputation */
    g->grad_scale = grad_scale;
    MOE_CHECK(load_tokens(g, tokens, err));
    if (lo > 0)
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->xin[lo], h_in, th, cudaMemcpyDeviceToDevice, g->s));
    MOE_CHECK(forward_part(g, lo, hi, &aux_sum, err));
    if (!backward) {
        if (hi < L)
            MOE_CUDA_CHECK(cudaMemcpyAsync(h_out, g->xin[hi], th, cudaMemcpyDeviceToDevice, g->s));
        return finish_loss(g, hi == L, aux_sum, loss, aux, err);
    }
    if (hi < L) MOE_CUDA_CHECK(cudaMemcpyAsync(g->dh, dh_out, th, cudaMemcpyDeviceToDevice, g->s));
    if (lo == 0) MOE_CHECK(embed_plan(g, tokens, err));
    MOE_CHECK(backward_part(g, lo, hi, err));
    if (lo > 0) MOE_CUDA_CHECK(cudaMemcpyAsync(dh_in, g->dh, th, cudaMemcpyDeviceToDevice, g->s));
    return finish_loss(g, hi == L, aux_sum, loss, aux, err);
}

extern "C" enum moe_status exec_gpu_optimizer(struct exec_gpu *g, const struct exec_adamw *o,
                                              int step, double *gnorm, struct moe_error *err)
{
    PH(COST_OPTIMIZER);
    double part[GK_NORM_BLOCKS], norm = 0.0;
    MOE_CHECK(gpu_grads_settle(g, 0, g->table.nparams, err));
    MOE_CUDA_CHECK(gk_sumsq(g->grad, g->table.nparams, g->norm_part, g->s));
    MOE_CUDA_CHECK(cudaMemcpyAsync(part, g->norm_part, sizeof part, cudaMemcpyDeviceToHost, g->s));
    MOE_CHECK(gpu_sync_host(g, err));
    for (int i = 0; i < GK_NORM_BLOCKS; i++) norm += part[i];
    norm = sqrt(norm);
    *gnorm = norm;
    if (!isfinite(norm)) {
        char where[384];
        MOE_CHECK(exec_gpu_nonfinite(g, where, sizeof where, err));
        return moe_error_set(err, MOE_ERR_NUMERICS, "step %d: the gradient norm is %g: %s",
                             step + 1, norm, where[0] ? where : "no tensor holds it now");
    }
    if (o->moments_bf16 != (g->mom_bytes == 2))
        return moe_error_set(
            err, MOE_ERR_INPUT, "executor: the optimizer asks for %s moments, this GPU keeps %s",
            o->moments_bf16 ? "bf16" : "fp32", g->mom_bytes == 2 ? "bf16" : "fp32");
    struct gk_adamw a;
    a.lr = (float)exec_lr_at(o, step);
    a.beta1 = (float)o->beta1;
    a.beta2 = (float)o->beta2;
    a.eps = (float)o->eps;
    a.c1 = (float)(1.0 - pow(o->beta1, step + 1));
    a.c2 = (float)(1.0 - pow(o->beta2, step + 1));
    a.scale = (float)(o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0);
    size_t lo = g->shard_lo, hi = g->shard_hi; /* everything, unless ZeRO-1 */
    MOE_CHECK(gpu_fp8_settle(g, err));         /* no quantization still reading the bf16 weights */
    /* per-tensor fp8 (no ZeRO): the quantized slices' amax kept as the bf16 copies are written */
    bool keep = g->w8kept && !g->cfg.zero;
    if (keep) MOE_CUDA_CHECK(cudaMemsetAsync(g->w8kept, 0, sizeof(unsigned) * g->f8.n, g->s));
    for (int i = 0; i < g->table.ntensors; i++) {
        const struct exec_tensor *t = &g->table.tensor[i];
        size_t a0 = t->offset > lo ? t->offset : lo;
        size_t b0 = t->offset + t->size < hi ? t->offset + t->size : hi;
        if (a0 >= b0) continue;
        a.wd = g->decay[i] ? (float)o->weight_decay : 0.0f;
        size_t mo = (a0 - lo) * g->mom_bytes;
        struct gk_amax_rows am;
        MOE_CUDA_CHECK(gk_adamw(g->master + a0, g->grad + a0, (char *)g->m1 + mo,
                                (char *)g->m2 + mo, g->mom_bytes == 2, g->w16 + a0, b0 - a0, &a,
                                keep ? gpu_fp8_weight_rows(g, i, &am) : NULL, g->s));
    }
    if (g->cfg.zero) { /* every rank's updated shard to every rank, then their bf16 copies */
        MOE_CHECK(gpu_sync_host(g, err));
        MOE_CHECK(g->cfg.zero->ops->allgather_f32(g->cfg.zero, g->master, g->shard_n, err));
        MOE_CUDA_CHECK(gk_to_bf16(g->master, g->w16, g->table.nparams, g->s));
    }
    gpu_w16_changed(g, keep);
    gk_fp8_lt_picks(g->f8lt, false); /* most kinds a run meets met: none timed after */
    return gpu_fp8_start(g, err);    /* the fp8 copies redone from here, beside what follows */
}

/* True when n floats at d hold NaN or Inf (their sum of squares is not finite). */
static enum moe_status nonfinite(struct exec_gpu *g, const float *d, size_t n, bool *bad,
                                 struct moe_error *err)
{
    double part[GK_NORM_BLOCKS], sum = 0.0;
    MOE_CUDA_CHECK(gk_sumsq(d, n, g->norm_part, g->s));
    MOE_CUDA_CHECK(cudaMemcpyAsync(part, g->norm_part, sizeof part, cudaMemcpyDeviceToHost, g->s));
    MOE_CHECK(gpu_sync_host(g, err));
    for (int i = 0; i < GK_NORM_BLOCKS; i++) sum += part[i];
    *bad = !isfinite(sum);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_nonfinite(struct exec_gpu *g, char *where, size_t cap,
                                              struct moe_error *err)
{
    size_t th = (size_t)g->tokens * g->hidden;
    bool bad = false;
    where[0] = '\0';
    MOE_CHECK(gpu_grads_settle(g, 0, g->table.nparams, err));
    for (int l = 0; l <= g->layers; l++) { /* xin[0]: the embedding; xin[l + 1]: block l's output */
        MOE_CHECK(nonfinite(g, g->xin[l], th, &bad, err));
        if (!bad) continue;
        if (l == 0)
            snprintf(where, cap, "the embedding's output holds NaN or Inf");
        else
            snprintf(where, cap,
                     "block %d's forward output holds NaN or Inf (its input is "
                     "finite); the loss and every gradient after it follow",
                     l - 1);
        return MOE_OK;
    }
    for (int i = g->table.ntensors - 1; i >= 0; i--) { /* from the head back, as the backward */
        const struct exec_tensor *t = &g->table.tensor[i];
        MOE_CHECK(nonfinite(g, g->grad + t->offset, t->size, &bad, err));
        if (!bad) continue;
        snprintf(where, cap,
                 "the gradient of %s (%d x %d) holds NaN or Inf, the tensors after "
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
        MOE_CHECK(gpu_fp8_settle(g, err));
        MOE_CUDA_CHECK(
            cudaMemcpyAsync(g->master + at, &nan, sizeof nan, cudaMemcpyHostToDevice, g->s));
        MOE_CUDA_CHECK(
            cudaMemcpyAsync(g->w16 + at, &nan16, sizeof nan16, cudaMemcpyHostToDevice, g->s));
        gpu_w16_changed(g, false);
    } else {
        MOE_CHECK(gpu_grads_settle(g, 0, g->table.nparams, err)); /* not to be overwritten */
        MOE_CUDA_CHECK(
            cudaMemcpyAsync(g->grad + at, &nan, sizeof nan, cudaMemcpyHostToDevice, g->s));
    }
    return gpu_sync_host(g, err);
}

extern "C" enum moe_status exec_gpu_update_bias(struct exec_gpu *g, double rate,
                                                struct exec_transport *t, struct moe_error *err)
{
    if (rate == 0.0 || g->nmoe == 0) return MOE_OK;
    int E = g->experts;
    size_t n = (size_t)g->nmoe * E;
    double *load_all = (double *)malloc(sizeof(double) * n);
    if (!load_all) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (size_t i = 0; i < n; i++) load_all[i] = (double)g->step_load[i];
    if (t) { /* every rank's loads: the biases stay the same on every rank */
        enum moe_status st = MOE_OK;
        /* the collective runs in the transport's stream: the copy must have landed */
        cudaError_t e =
            cudaMemcpy(g->ep_loads, load_all, sizeof(double) * n, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
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
    for (int l = 0; l < g->layers; l++) {
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
    return gpu_upload_bias(g, err);
}

extern "C" enum moe_status exec_gpu_step_end(struct exec_gpu *g, struct exec_gpu_step_stats *st,
                                             struct moe_error *err)
{
    PH(-1);
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    memset(st, 0, sizeof *st);
    for (int i = 0; i + 1 < g->nev; i++) {
        float ms = 0.0f;
        MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, g->ev[i], g->ev[i + 1]));
        if (g->ev_phase[i] >= 0) st->phase_ms[g->ev_phase[i]] += ms;
        st->phase_ms[COST_STEP] += ms;
    }
    st->host_syncs = g->syncs;
    st->dispatch = g->sent;
    size_t fr, tot;
    MOE_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
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
    if (layer < 0 || layer >= g->layers || g->moe_index[layer] < 0)
        return moe_error_set(err, MOE_ERR_INPUT, "executor: layer %d is not a MoE layer", layer);
    int mi = g->moe_index[layer], E = g->experts;
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
    MOE_CUDA_CHECK(e);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_last_routing(struct exec_gpu *g, int *choice,
                                                 struct moe_error *err)
{
    if (g->cfg.recompute)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: the last routing is not kept with full recompute");
    for (int l = 0; l < g->layers; l++)
        if (g->moe_index[l] >= 0)
            MOE_CUDA_CHECK(cudaMemcpyAsync(choice + (size_t)g->moe_index[l] * g->pairs,
                                           g->act[l].choice, sizeof(int) * (size_t)g->pairs,
                                           cudaMemcpyDeviceToHost, g->s));
    return gpu_sync_host(g, err);
}

extern "C" enum moe_status exec_gpu_force_routing(struct exec_gpu *g, const int *choice,
                                                  struct moe_error *err)
{
    size_t n = (size_t)g->nmoe * g->pairs;
    if (!choice) {
        g->forced_choice = NULL;
        return MOE_OK;
    }
    int k = g->top_k;
    for (size_t i = 0; i < n; i++) {
        if (choice[i] < 0 || choice[i] >= g->experts)
            return moe_error_set(err, MOE_ERR_INPUT, "executor: a forced choice of expert %d of %d",
                                 choice[i], g->experts);
        for (size_t j = i - i % k; j < i; j++) /* a token's choices, as the router's: distinct */
            if (choice[j] == choice[i])
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "executor: forced pair %zu chooses expert %d twice for one "
                                     "token",
                                     i, choice[i]);
    }
    if (!g->forced_own) ALLOC(g->forced_own, n, EXEC_MEM_WORKSPACE);
    MOE_CHECK(gpu_upload(g, g->forced_own, choice, sizeof(int) * n, err));
    g->forced_choice = g->forced_own;
    return MOE_OK;
}

/* ---- the MoE benchmark --------------------------------------------------------------------- */
