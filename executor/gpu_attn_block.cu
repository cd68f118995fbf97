/*
 * gpu_attn_block.cu: the attention half of a block, forward and backward: RMSNorm'd input ->
 * projections (GQA with RoPE, or MLA's low-rank q and kv with decoupled RoPE) -> the flash
 * attention core of gpu_attention.cu -> output projection. It follows ref_ops.c / ref_model.c
 * operation by operation, so that the gpu tests can compare every gradient.
 */
#include "gpu.h"

/* Layer l's attention core: its sequences (a chunked layer's are its chunks: the executor takes
 * a sequence that is a whole number of them, exec_batch_runnable) and its window (0: none). */
struct core_shape {
    int seqs, len, window;
};
static struct core_shape layer_core(const struct exec_gpu *g, int l)
{
    struct core_shape c = {g->mbs, g->seq,
                           mdl_layer_is_sliding(&g->m, l) ? g->m.attn.sliding_window : 0};
    int chunk = mdl_layer_chunk(&g->m, l);
    if (chunk && chunk < g->seq) {
        c.seqs = g->mbs * (g->seq / chunk);
        c.len = chunk;
    }
    return c;
}

/* ---- attention ----------------------------------------------------------------------------- */

/* cuDNN's fused attention while it takes the shapes (gpu_cudnn.cu); the first time it does not,
 * ours from then on, the reason kept in attn_why. Both keep the same base-2 lse, so a forward by
 * one and a backward by the other agree. */
static void cudnn_off(struct exec_gpu *g, const char *why)
{
    g->cudnn_attn = false;
    snprintf(g->attn_why, sizeof g->attn_why, "%s", why);
}

static enum moe_status attn_core_forward(struct exec_gpu *g, const struct act *A,
                                         struct core_shape c, struct moe_error *err)
{
    char why[256];
    if (g->cudnn_attn) {
        if (gk_cudnn_forward(A->q16, A->k16, A->v16, c.seqs, c.len, g->heads, g->kv_heads, g->dqk,
                             g->dv, c.window, NULL, A->o16, A->lse, g->s, why, sizeof why))
            return MOE_OK;
        cudnn_off(g, why);
    }
    MOE_CUDA_CHECK(gk_flash_forward(A->q16, A->k16, A->v16, c.seqs, c.len, g->heads, g->kv_heads,
                                    g->dqk, g->dv, c.window, A->o16, A->lse, g->s));
    return MOE_OK;
}

/* From do16 (T, H, dv): the gradients of q, k and v in the layouts of q, k, v, by cuDNN's
 * backward where the executor runs cuDNN's attention, except for a narrow sliding window
 * (gk_window_backward_ours: ours, from cuDNN's forward; both keep one base-2 lse). With in16 NULL in
 * fp32 (dq32, dk32, dv32); otherwise *in16 says where they are: in bf16 only (dq16, dk16, dv16:
 * cuDNN writes bf16, and a caller that rounds them to bf16 anyway skips the fp32 copies) or in
 * fp32 (our kernel). */
static enum moe_status attn_core_backward(struct exec_gpu *g, const struct act *A,
                                          struct core_shape c, bool *in16, struct moe_error *err)
{
    char why[256];
    if (in16) *in16 = false;
    if (g->cudnn_attn && !gk_window_backward_ours(c.len, c.window)) {
        /* the deterministic engine first; where its workspace (about 2 bytes a score: 17 GB at
         * 32 heads x 16384 tokens) does not fit, cuDNN's other one from then on, noted in
         * exec_gpu_attention */
        for (int det = !g->attn_nondet[0]; det >= 0; det--) {
            if (det == 0 && !g->attn_nondet[0]) {
                if (!strstr(why, "no device memory")) break;
                snprintf(g->attn_nondet, sizeof g->attn_nondet, "%s", why);
            }
            if (gk_cudnn_backward(A->q16, A->k16, A->v16, A->o16, g->do16, A->lse, c.seqs, c.len,
                                  g->heads, g->kv_heads, g->dqk, g->dv, c.window, NULL, NULL,
                                  det && GK_CUDNN_DETERMINISTIC, in16 ? NULL : g->dq32, g->dk32,
                                  g->dv32, g->dq16, g->dk16, g->dv16, g->s, why, sizeof why)) {
                if (in16) *in16 = true;
                return MOE_OK;
            }
        }
        cudnn_off(g, why);
    }
    MOE_CUDA_CHECK(gk_flash_backward(A->q16, A->k16, A->v16, A->o16, g->do16, A->lse, c.seqs, c.len,
                                     g->heads, g->kv_heads, g->dqk, g->dv, c.window, g->delta,
                                     g->dq32, g->dk32, g->dv32, g->s));
    return MOE_OK;
}

/* The gradient of bias tensor t: the column sums of dy16 (T rows of n), through fp32 scratch. */
enum moe_status gpu_bias_grad(struct exec_gpu *g, const bf16 *dy16, float *scratch, int T, int n,
                              int t, struct moe_error *err)
{
    MOE_CUDA_CHECK(gk_to_f32(dy16, scratch, (size_t)T * n, g->s));
    MOE_CUDA_CHECK(gk_colsum(scratch, n, NULL, 0, NULL, T, n, g->part, GR(g, t),
                             !gpu_grad_first(g, t, 0), g->s));
    return MOE_OK;
}

/* QK-norm's forward on rows of dqk (each head of each token; x32 the projection's fp32 output):
 * pre16 keeps x rounded to bf16 for the backward, y16 the normed rows, rstd their 1 / rms. */
static enum moe_status qk_norm_forward(struct exec_gpu *g, const float *x32, int wn, const int *w,
                                       int rows, bf16 *pre16, bf16 *y16, float *rstd,
                                       struct moe_error *err)
{
    int d = g->dqk;
    MOE_CUDA_CHECK(gk_to_bf16(x32, pre16, (size_t)rows * d, g->s));
    MOE_CUDA_CHECK(gk_rmsnorm(x32, d, M(g, w[wn]), rows, d, (float)g->m.norm_eps, y16, d, NULL, 0,
                              NULL, 0, rstd, g->s));
    return MOE_OK;
}

/* Its backward: dy16 (the normed rows' gradient, after RoPE's backward) becomes the gradient of
 * the projection's output, in place; the norm's weight gradient from the same rows. x32 and dy32
 * are fp32 scratch of rows x dqk. */
static enum moe_status qk_norm_backward(struct exec_gpu *g, const bf16 *pre16, const float *rstd,
                                        int wn, const int *w, int rows, bf16 *dy16, float *x32,
                                        float *dy32, struct moe_error *err)
{
    int d = g->dqk;
    size_t n = (size_t)rows * d;
    MOE_CUDA_CHECK(gk_to_f32(pre16, x32, n, g->s));
    MOE_CUDA_CHECK(gk_to_f32(dy16, dy32, n, g->s));
    MOE_CUDA_CHECK(gk_colsum(dy32, d, x32, d, rstd, rows, d, g->part, GR(g, w[wn]),
                             !gpu_grad_first(g, w[wn], 0), g->s));
    MOE_CUDA_CHECK(gk_rmsnorm_backward(x32, d, M(g, w[wn]), rstd, dy32, d, NULL, 0, dy32, dy16, d,
                                       rows, d, g->s));
    return MOE_OK;
}

/* Llama 4's norm of each head's q or k after RoPE, without weights (ones32): pre16 (rows x dqk,
 * kept for the backward) through fp32 scratch x32 into y16, and the rows' 1 / rms. */
static enum moe_status l2_norm_forward(struct exec_gpu *g, const bf16 *pre16, int rows, float *x32,
                                       bf16 *y16, float *rstd, struct moe_error *err)
{
    int d = g->dqk;
    MOE_CUDA_CHECK(gk_to_f32(pre16, x32, (size_t)rows * d, g->s));
    MOE_CUDA_CHECK(gk_rmsnorm(x32, d, g->ones32, rows, d, (float)g->m.norm_eps, y16, d, NULL, 0,
                              NULL, 0, rstd, g->s));
    return MOE_OK;
}

/* Its backward, dy32 (fp32, rows x dqk) in place; x32 fp32 scratch. */
static enum moe_status l2_norm_backward(struct exec_gpu *g, const bf16 *pre16, const float *rstd,
                                        int rows, float *x32, float *dy32, struct moe_error *err)
{
    int d = g->dqk;
    MOE_CUDA_CHECK(gk_to_f32(pre16, x32, (size_t)rows * d, g->s));
    MOE_CUDA_CHECK(gk_rmsnorm_backward(x32, d, g->ones32, rstd, dy32, d, NULL, 0, dy32, NULL, d,
                                       rows, d, g->s));
    return MOE_OK;
}

/* The attention core from q16, k16, v16 into o16 and lse, the sinks folded in: in the forward,
 * and again in the backward under selective recompute of core_attn (the same kernel: the same
 * values). */
enum moe_status gpu_attn_core(struct exec_gpu *g, int l, const struct act *A, struct moe_error *err)
{
    struct core_shape c = layer_core(g, l);
    MOE_CHECK(attn_core_forward(g, A, c, err));
    if (g->sinks)
        MOE_CUDA_CHECK(gk_attn_sinks(A->o16, A->lse, M(g, g->wi[l][W_SINKS]), c.seqs, c.len,
                                     g->heads, g->dv, g->s));
    return MOE_OK;
}

/* Projections into q16, k16, v16 from the normed input a16, then the core. */
enum moe_status gpu_attn_forward(struct exec_gpu *g, int l, struct act *A, struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, H = g->heads, KV = g->kv_heads, dqk = g->dqk, dv = g->dv;
    if (!g->mla) {
        float beta = 0.0f;
        if (g->attn_bias) { /* the outputs start as the biases; the GEMMs add (one rounding) */
            MOE_CUDA_CHECK(
                gk_bias_rows(g->q32, NULL, H * dqk, M(g, w[W_Q_BIAS]), T, H * dqk, false, g->s));
            MOE_CUDA_CHECK(
                gk_bias_rows(g->k32, NULL, KV * dqk, M(g, w[W_K_BIAS]), T, KV * dqk, false, g->s));
            MOE_CUDA_CHECK(
                gk_bias_rows(NULL, A->v16, KV * dv, M(g, w[W_V_BIAS]), T, KV * dv, false, g->s));
            beta = 1.0f;
        }
        MOE_CHECK(gpu_lin(g, A->a16, h, W16(g, w[W_WQ]), T, h, H * dqk, g->q32, H * dqk, CUDA_R_32F,
                          beta, err));
        MOE_CHECK(gpu_lin(g, A->a16, h, W16(g, w[W_WK]), T, h, KV * dqk, g->k32, KV * dqk,
                          CUDA_R_32F, beta, err));
        MOE_CHECK(gpu_lin(g, A->a16, h, W16(g, w[W_WV]), T, h, KV * dv, A->v16, KV * dv,
                          CUDA_R_16BF, beta, err));
        if (g->qk_norm) { /* each head's row normed into bf16, RoPE on that in place */
            MOE_CHECK(
                qk_norm_forward(g, g->q32, W_Q_NORM, w, T * H, A->qpre16, A->q16, A->rstdqh, err));
            MOE_CHECK(
                qk_norm_forward(g, g->k32, W_K_NORM, w, T * KV, A->kpre16, A->k16, A->rstdkh, err));
        }
        const float *q32 = g->qk_norm ? NULL : g->q32, *k32 = g->qk_norm ? NULL : g->k32;
        int rot = mdl_layer_has_rope(&g->m, l) ? dqk : 0; /* 0: a copy to bf16 (Llama 4's NoPE) */
        if (rot && g->m.attn.qk_l2_norm) { /* Llama 4: RoPE into qpre16, kpre16, then the norms */
            MOE_CUDA_CHECK(gk_rope_bf16(q32, NULL, A->qpre16, T, H, dqk, rot, g->rope_tab, g->seq,
                                        false, g->s));
            MOE_CUDA_CHECK(gk_rope_bf16(k32, NULL, A->kpre16, T, KV, dqk, rot, g->rope_tab, g->seq,
                                        false, g->s));
            MOE_CHECK(l2_norm_forward(g, A->qpre16, T * H, g->q32, A->q16, A->rstdqh, err));
            MOE_CHECK(l2_norm_forward(g, A->kpre16, T * KV, g->k32, A->k16, A->rstdkh, err));
        } else {
            MOE_CUDA_CHECK(gk_rope_bf16(q32, A->q16, A->q16, T, H, dqk, rot, g->rope_tab, g->seq,
                                        false, g->s));
            MOE_CUDA_CHECK(gk_rope_bf16(k32, A->k16, A->k16, T, KV, dqk, rot, g->rope_tab, g->seq,
                                        false, g->s));
        }
        if (!rot && g->m.attn.temp_floor > 0) /* Llama 4: the queries' temperature */
            MOE_CUDA_CHECK(gk_query_temperature(NULL, A->q16, T, H * dqk, g->seq,
                                                (float)g->m.attn.temp_floor,
                                                (float)g->m.attn.temp_scale, g->s));
    } else {
        int ql = g->q_lora, kvl = g->kv_lora, rope = g->rope;
        float eps = (float)g->m.norm_eps;
        if (ql) {
            MOE_CHECK(
                gpu_lin(g, A->a16, h, W16(g, w[W_WQA]), T, h, ql, A->cq32, ql, CUDA_R_32F, 0, err));
            MOE_CUDA_CHECK(gk_rmsnorm(A->cq32, ql, M(g, w[W_QA_NORM]), T, ql, eps, A->cqn16, ql,
                                      NULL, 0, NULL, 0, A->rstdq, g->s));
        }
        MOE_CHECK(gpu_lin(g, A->a16, h, W16(g, w[W_WKVA]), T, h, kvl + rope, A->ckvf32, kvl + rope,
                          CUDA_R_32F, 0, err));
        MOE_CUDA_CHECK(gk_rmsnorm(A->ckvf32, kvl + rope, M(g, w[W_KVA_NORM]), T, kvl, eps,
                                  A->ckvn16, kvl, NULL, 0, NULL, 0, A->rstdkv, g->s));
        MOE_CHECK(gpu_mla_up_proj(g, l, A, err));
    }
    return gpu_attn_core(g, l, A, err);
}

/* MLA's up-projections from the compressed q (or, without a q LoRA, the q projection from the
 * normed input) and kv, and RoPE: q16, k16, v16. In the forward, and again in the backward under
 * selective recompute of mla_up_proj (the same GEMMs: the same values). */
enum moe_status gpu_mla_up_proj(struct exec_gpu *g, int l, const struct act *A,
                                struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, H = g->heads, dqk = g->dqk, dv = g->dv;
    int ql = g->q_lora, kvl = g->kv_lora, rope = g->rope, nope = g->nope;
    if (ql)
        MOE_CHECK(gpu_lin(g, A->cqn16, ql, W16(g, w[W_WQB]), T, ql, H * dqk, g->q32, H * dqk,
                          CUDA_R_32F, 0, err));
    else
        MOE_CHECK(gpu_lin(g, A->a16, h, W16(g, w[W_WQ]), T, h, H * dqk, g->q32, H * dqk, CUDA_R_32F,
                          0, err));
    MOE_CHECK(gpu_lin(g, A->ckvn16, kvl, W16(g, w[W_WKVB]), T, kvl, H * (nope + dv), g->kv32,
                      H * (nope + dv), CUDA_R_32F, 0, err));
    MOE_CUDA_CHECK(gk_mla_assemble(g->q32, A->ckvf32, g->kv32, T, H, nope, rope, dv, kvl,
                                   g->rope_tab, g->seq, A->q16, A->k16, A->v16, g->s));
    return MOE_OK;
}

/* From do16: adds the input gradient to da32 (overwritten first) and the weight gradients. */
enum moe_status gpu_attn_backward(struct exec_gpu *g, int l, const struct act *A,
                                  struct moe_error *err)
{
    const int *w = g->wi[l];
    int T = g->tokens, h = g->hidden, H = g->heads, KV = g->kv_heads, dqk = g->dqk, dv = g->dv;
    struct core_shape c = layer_core(g, l);
    if (!g->mla) {
        bool in16;
        MOE_CHECK(attn_core_backward(g, A, c, &in16, err));
        if (g->sinks) { /* the sinks' gradient: column sums of per-row terms (delta as scratch) */
            MOE_CUDA_CHECK(gk_attn_sink_rows(A->o16, g->do16, A->lse, M(g, w[W_SINKS]), c.seqs,
                                             c.len, H, dv, g->delta, g->s));
            MOE_CUDA_CHECK(gk_colsum(g->delta, H, NULL, 0, NULL, T, H, g->part, GR(g, w[W_SINKS]),
                                     !gpu_grad_first(g, w[W_SINKS], 0), g->s));
        }
        const float *dq32 = in16 ? NULL : g->dq32, *dk32 = in16 ? NULL : g->dk32;
        int rot = mdl_layer_has_rope(&g->m, l) ? dqk : 0;
        if (!rot && g->m.attn.temp_floor > 0) /* Llama 4: the queries' temperature, again */
            MOE_CUDA_CHECK(gk_query_temperature(in16 ? NULL : g->dq32, in16 ? g->dq16 : NULL, T,
                                                H * dqk, g->seq, (float)g->m.attn.temp_floor,
                                                (float)g->m.attn.temp_scale, g->s));
        if (rot && g->m.attn.qk_l2_norm) { /* Llama 4: the norms' backward, in fp32 */
            if (in16) {
                MOE_CUDA_CHECK(gk_to_f32(g->dq16, g->dq32, (size_t)T * H * dqk, g->s));
                MOE_CUDA_CHECK(gk_to_f32(g->dk16, g->dk32, (size_t)T * KV * dqk, g->s));
            }
            MOE_CHECK(l2_norm_backward(g, A->qpre16, A->rstdqh, T * H, g->q32, g->dq32, err));
            MOE_CHECK(l2_norm_backward(g, A->kpre16, A->rstdkh, T * KV, g->k32, g->dk32, err));
            dq32 = g->dq32;
            dk32 = g->dk32;
        }
        MOE_CUDA_CHECK(
            gk_rope_bf16(dq32, g->dq16, g->dq16, T, H, dqk, rot, g->rope_tab, g->seq, true, g->s));
        MOE_CUDA_CHECK(
            gk_rope_bf16(dk32, g->dk16, g->dk16, T, KV, dqk, rot, g->rope_tab, g->seq, true, g->s));
        if (!in16) MOE_CUDA_CHECK(gk_to_bf16(g->dv32, g->dv16, (size_t)T * KV * dv, g->s));
        if (g->qk_norm) { /* the fp32 scratch of the forward's projections serves as x */
            MOE_CHECK(qk_norm_backward(g, A->qpre16, A->rstdqh, W_Q_NORM, w, T * H, g->dq16, g->q32,
                                       g->dq32, err));
            MOE_CHECK(qk_norm_backward(g, A->kpre16, A->rstdkh, W_K_NORM, w, T * KV, g->dk16,
                                       g->k32, g->dk32, err));
        }
        if (g->attn_bias) {
            MOE_CHECK(gpu_bias_grad(g, g->dq16, g->dq32, T, H * dqk, w[W_Q_BIAS], err));
            MOE_CHECK(gpu_bias_grad(g, g->dk16, g->dk32, T, KV * dqk, w[W_K_BIAS], err));
            MOE_CHECK(gpu_bias_grad(g, g->dv16, g->dv32, T, KV * dv, w[W_V_BIAS], err));
        }
        /* each projection's data gradient, then its weight gradient (fp8: one quantization of
         * the output gradient serves both) */
        MOE_CHECK(gpu_lin_dx(g, g->dq16, H * dqk, W16(g, w[W_WQ]), T, h, H * dqk, g->da32, h,
                             CUDA_R_32F, 0, err));
        MOE_CHECK(gpu_lin_dw(g, g->dq16, H * dqk, A->a16, h, T, h, H * dqk, w[W_WQ], 0, err));
        MOE_CHECK(gpu_lin_dx(g, g->dk16, KV * dqk, W16(g, w[W_WK]), T, h, KV * dqk, g->da32, h,
                             CUDA_R_32F, 1, err));
        MOE_CHECK(gpu_lin_dw(g, g->dk16, KV * dqk, A->a16, h, T, h, KV * dqk, w[W_WK], 0, err));
        MOE_CHECK(gpu_lin_dx(g, g->dv16, KV * dv, W16(g, w[W_WV]), T, h, KV * dv, g->da32, h,
                             CUDA_R_32F, 1, err));
        MOE_CHECK(gpu_lin_dw(g, g->dv16, KV * dv, A->a16, h, T, h, KV * dv, w[W_WV], 0, err));
        return MOE_OK;
    }
    bool in16;
    MOE_CHECK(attn_core_backward(g, A, c, &in16, err));
    int ql = g->q_lora, kvl = g->kv_lora, rope = g->rope, nope = g->nope;
    MOE_CUDA_CHECK(gk_mla_disassemble(in16 ? NULL : g->dq32, in16 ? NULL : g->dk32,
                                      in16 ? NULL : g->dv32, g->dq16, g->dk16, g->dv16, T, H, nope,
                                      rope, dv, kvl, g->rope_tab, g->seq, g->dqf16, g->dkv16,
                                      g->dckvf32, g->s));
    MOE_CHECK(gpu_lin_dx(g, g->dkv16, H * (nope + dv), W16(g, w[W_WKVB]), T, kvl, H * (nope + dv),
                         g->dckvn32, kvl, CUDA_R_32F, 0, err));
    MOE_CHECK(gpu_lin_dw(g, g->dkv16, H * (nope + dv), A->ckvn16, kvl, T, kvl, H * (nope + dv),
                         w[W_WKVB], 0, err));
    MOE_CUDA_CHECK(gk_rmsnorm_backward(A->ckvf32, kvl + rope, M(g, w[W_KVA_NORM]), A->rstdkv,
                                       g->dckvn32, kvl, NULL, 0, g->dckvf32, NULL, kvl + rope, T,
                                       kvl, g->s));
    MOE_CUDA_CHECK(gk_colsum(g->dckvn32, kvl, A->ckvf32, kvl + rope, A->rstdkv, T, kvl, g->part,
                             GR(g, w[W_KVA_NORM]), !gpu_grad_first(g, w[W_KVA_NORM], 0), g->s));
    MOE_CUDA_CHECK(gk_to_bf16(g->dckvf32, g->dckvf16, (size_t)T * (kvl + rope), g->s));
    MOE_CHECK(gpu_lin_dx(g, g->dckvf16, kvl + rope, W16(g, w[W_WKVA]), T, h, kvl + rope, g->da32, h,
                         CUDA_R_32F, 0, err));
    MOE_CHECK(
        gpu_lin_dw(g, g->dckvf16, kvl + rope, A->a16, h, T, h, kvl + rope, w[W_WKVA], 0, err));
    if (ql) {
        MOE_CHECK(gpu_lin_dx(g, g->dqf16, H * dqk, W16(g, w[W_WQB]), T, ql, H * dqk, g->dcqn32, ql,
                             CUDA_R_32F, 0, err));
        MOE_CHECK(gpu_lin_dw(g, g->dqf16, H * dqk, A->cqn16, ql, T, ql, H * dqk, w[W_WQB], 0, err));
        MOE_CUDA_CHECK(gk_rmsnorm_backward(A->cq32, ql, M(g, w[W_QA_NORM]), A->rstdq, g->dcqn32, ql,
                                           NULL, 0, g->dcq32, g->dcq16, ql, T, ql, g->s));
        MOE_CUDA_CHECK(gk_colsum(g->dcqn32, ql, A->cq32, ql, A->rstdq, T, ql, g->part,
                                 GR(g, w[W_QA_NORM]), !gpu_grad_first(g, w[W_QA_NORM], 0), g->s));
        MOE_CHECK(gpu_lin_dx(g, g->dcq16, ql, W16(g, w[W_WQA]), T, h, ql, g->da32, h, CUDA_R_32F, 1,
                             err));
        MOE_CHECK(gpu_lin_dw(g, g->dcq16, ql, A->a16, h, T, h, ql, w[W_WQA], 0, err));
    } else {
        MOE_CHECK(gpu_lin_dx(g, g->dqf16, H * dqk, W16(g, w[W_WQ]), T, h, H * dqk, g->da32, h,
                             CUDA_R_32F, 1, err));
        MOE_CHECK(gpu_lin_dw(g, g->dqf16, H * dqk, A->a16, h, T, h, H * dqk, w[W_WQ], 0, err));
    }
    return MOE_OK;
}

/* ---- FFN: dense SwiGLU, MoE ------------------------------------------------------------------ */
