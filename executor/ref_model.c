/*
 * ref_model.c: a whole training step of the reference: embedding, blocks (RMSNorm, causal GQA
 * attention with RoPE, residual, RMSNorm, dense SwiGLU or the dropless MoE layer, residual), the
 * final norm, the LM head and the next-token cross-entropy; the loss and the gradient of every
 * parameter, in double precision.
 *
 * Attention is GQA (with RoPE) or DeepSeek's MLA. Backward recomputes each block from its saved input (one tensor per block is kept), which keeps
 * the code a straight transcription of the forward. It is checked against finite differences in
 * tests/unit/test_ref_model.c, and the GPU step will be checked against it.
 */
#include "exec_dist.h" /* the reference model runs its MoE layers over EP too */

#include <math.h>
#include <stdlib.h>
#include <string.h>

const struct exec_tensor *exec_ref_tensor(const struct exec_ref_model *r, const char *name)
{
    for (int i = 0; i < r->ntensors; i++)
        if (strcmp(r->tensor[i].name, name) == 0) return &r->tensor[i];
    return NULL;
}

static enum moe_status add(struct exec_ref_model *r, const char *name, int rows, int cols,
                           struct moe_error *err)
{
    if (r->ntensors == EXEC_MAX_TENSORS)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "reference: more than %d tensors",
                             EXEC_MAX_TENSORS);
    struct exec_tensor *t = &r->tensor[r->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->size = (size_t)rows * cols;
    t->offset = r->nparams;
    r->nparams += t->size;
    return MOE_OK;
}

void exec_ref_model_destroy(struct exec_ref_model *r)
{
    if (!r) return;
    free(r->params);
    r->params = NULL;
}

enum moe_status exec_model_table(struct exec_ref_model *r, const struct mdl_model *m,
                                 struct moe_error *err)
{
    const struct mdl_attention *a = &m->attn;
    char why[256];
    if (!exec_model_supported(m, why, sizeof why))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "%s", why);
    memset(r, 0, sizeof *r);
    r->model = *m;
    int h = m->hidden, H = a->heads, KV = a->kv_heads, hd = a->head_dim;
    int qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
    enum moe_status st = MOE_OK;
    char n[64];
#define ADD(rows, cols, ...)                                                                       \
    do {                                                                                           \
        snprintf(n, sizeof n, __VA_ARGS__);                                                        \
        if ((st = add(r, n, rows, cols, err))) return st;                                          \
    } while (0)
    ADD(m->vocab, h, "embed");
    for (int l = 0; l < m->layers; l++) {
        ADD(1, h, "blk%d.attn_norm", l);
        if (a->type == MDL_ATTN_GQA) {
            ADD(H * hd, h, "blk%d.wq", l);
            ADD(KV * hd, h, "blk%d.wk", l);
            ADD(KV * hd, h, "blk%d.wv", l);
            ADD(h, H * hd, "blk%d.wo", l);
            if (a->qk_norm) {
                ADD(1, hd, "blk%d.q_norm", l);
                ADD(1, hd, "blk%d.k_norm", l);
            }
            if (a->sinks) ADD(1, H, "blk%d.sinks", l);
            if (a->bias) {
                ADD(1, H * hd, "blk%d.q_bias", l);
                ADD(1, KV * hd, "blk%d.k_bias", l);
                ADD(1, KV * hd, "blk%d.v_bias", l);
                ADD(1, h, "blk%d.o_bias", l);
            }
        } else {
            if (a->q_lora_rank) {
                ADD(a->q_lora_rank, h, "blk%d.wqa", l);
                ADD(1, a->q_lora_rank, "blk%d.qa_norm", l);
                ADD(H * qk, a->q_lora_rank, "blk%d.wqb", l);
            } else {
                ADD(H * qk, h, "blk%d.wq", l);
            }
            ADD(a->kv_lora_rank + a->qk_rope_head_dim, h, "blk%d.wkva", l);
            ADD(1, a->kv_lora_rank, "blk%d.kva_norm", l);
            ADD(H * (a->qk_nope_head_dim + a->v_head_dim), a->kv_lora_rank, "blk%d.wkvb", l);
            ADD(h, H * a->v_head_dim, "blk%d.wo", l);
        }
        ADD(1, h, "blk%d.ffn_norm", l);
        if (mdl_layer_is_moe(m, l)) {
            const struct mdl_moe *e = &m->moe;
            int fs = e->shared_experts * e->shared_intermediate;
            ADD(e->experts, h, "blk%d.router", l);
            ADD(e->experts * e->intermediate, h, "blk%d.gate", l);
            ADD(e->experts * e->intermediate, h, "blk%d.up", l);
            ADD(e->experts * h, e->intermediate, "blk%d.down", l);
            if (e->expert_bias) { /* gpt-oss */
                ADD(1, e->experts, "blk%d.router_bias", l);
                ADD(e->experts, e->intermediate, "blk%d.gate_bias", l);
                ADD(e->experts, e->intermediate, "blk%d.up_bias", l);
                ADD(e->experts, h, "blk%d.down_bias", l);
            }
            if (fs) {
                ADD(fs, h, "blk%d.sgate", l);
                ADD(fs, h, "blk%d.sup", l);
                ADD(h, fs, "blk%d.sdown", l);
            }
        } else {
            ADD(m->dense_intermediate, h, "blk%d.gate", l);
            ADD(m->dense_intermediate, h, "blk%d.up", l);
            ADD(h, m->dense_intermediate, "blk%d.down", l);
        }
    }
    ADD(1, h, "final_norm");
    if (!m->tied_embeddings) ADD(m->vocab, h, "lm_head");
#undef ADD
    return MOE_OK;
}

double exec_tensor_init_std(const char *name, bool *ones)
{
    *ones = strstr(name, "norm") != NULL;
    return strstr(name, "_bias") ? 0.0 : 0.02;
}

bool exec_tensor_decays(const char *name)
{
    return !strstr(name, "norm") && !strstr(name, "_bias");
}

enum moe_status exec_ref_model_create(struct exec_ref_model *r, const struct mdl_model *m,
                                      uint64_t seed, struct moe_error *err)
{
    enum moe_status st = exec_model_table(r, m, err);
    if (st != MOE_OK) return st;
    r->params = malloc(sizeof *r->params * r->nparams);
    if (!r->params) return moe_error_set(err, MOE_ERR_NOMEM, "reference: out of memory");
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    for (int i = 0; i < r->ntensors; i++) {
        const struct exec_tensor *t = &r->tensor[i];
        bool ones;
        double std = exec_tensor_init_std(t->name, &ones);
        for (size_t j = 0; j < t->size; j++)
            r->params[t->offset + j] = ones ? 1.0 : std * moe_rng_normal(&rng);
    }
    return MOE_OK;
}

/* y (T, out) = x (T, in) W^T, W (out, in). */
static void linear(const double *x, const double *W, int T, int in, int out, double *y)
{
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++) {
            double acc = 0.0;
            for (int i = 0; i < in; i++) acc += x[(size_t)t * in + i] * W[(size_t)o * in + i];
            y[(size_t)t * out + o] = acc;
        }
}

/* dx += dy W; dW += dy^T x. */
static void linear_backward(const double *x, const double *W, const double *dy, int T, int in,
                            int out, double *dx, double *dW)
{
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++) {
            double g = dy[(size_t)t * out + o];
            if (g == 0.0) continue;
            for (int i = 0; i < in; i++) {
                dx[(size_t)t * in + i] += g * W[(size_t)o * in + i];
                dW[(size_t)o * in + i] += g * x[(size_t)t * in + i];
            }
        }
}

/* y (T, n) += b on every row; db += the column sums of dy (T, n). */
static void add_bias(double *y, const double *b, int T, int n)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

static void bias_backward(const double *dy, int T, int n, double *db)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) db[i] += dy[(size_t)t * n + i];
}

struct ctx {
    const struct exec_ref_model *r;
    const struct exec_ref_ep *ep; /* NULL: the MoE layers on this rank alone */
    double *grad;                 /* NULL: forward only */
    int T;
    int *pos;
    double aux; /* the load-balance losses of the forward */
};

static const double *P(const struct ctx *c, const char *name, int l)
{
    char n[64];
    if (l >= 0)
        snprintf(n, sizeof n, "blk%d.%s", l, name);
    else
        snprintf(n, sizeof n, "%s", name);
    const struct exec_tensor *t = exec_ref_tensor(c->r, n);
    return t ? c->r->params + t->offset : NULL;
}

static double *G(const struct ctx *c, const char *name, int l)
{
    const double *p = P(c, name, l);
    return p ? c->grad + (p - c->r->params) : NULL;
}

/* The MoE layer of block l as the MoE reference sees it. */
static void moe_view(const struct ctx *c, int l, struct exec_ref_moe *w,
                     struct exec_ref_moe_grad *g)
{
    const struct mdl_model *m = &c->r->model;
    exec_router_cfg_from_model(&w->cfg, m);
    w->hidden = m->hidden;
    w->ffn = m->moe.intermediate;
    w->shared_ffn = m->moe.shared_experts * m->moe.shared_intermediate;
    w->router = (double *)P(c, "router", l);
    w->cfg.aux_coef = c->r->aux_coef;
    w->bias = c->r->bias ? c->r->bias + (size_t)l * m->moe.experts : NULL;
    w->gate = (double *)P(c, "gate", l);
    w->up = (double *)P(c, "up", l);
    w->down = (double *)P(c, "down", l);
    w->sgate = (double *)P(c, "sgate", l);
    w->sup = (double *)P(c, "sup", l);
    w->sdown = (double *)P(c, "sdown", l);
    w->router_b = (double *)P(c, "router_bias", l);
    w->gate_b = (double *)P(c, "gate_bias", l);
    w->up_b = (double *)P(c, "up_bias", l);
    w->down_b = (double *)P(c, "down_bias", l);
    w->act = m->moe.activation;
    w->probs_on_input = m->moe.probs_on_input;
    w->alpha = m->moe.swiglu_alpha;
    w->limit = m->moe.swiglu_limit;
    if (g) {
        g->router = G(c, "router", l);
        g->gate = G(c, "gate", l);
        g->up = G(c, "up", l);
        g->down = G(c, "down", l);
        g->sgate = G(c, "sgate", l);
        g->sup = G(c, "sup", l);
        g->sdown = G(c, "sdown", l);
        g->router_b = G(c, "router_bias", l);
        g->gate_b = G(c, "gate_bias", l);
        g->up_b = G(c, "up_bias", l);
        g->down_b = G(c, "down_bias", l);
    }
}

/* Intermediates of one block, all (T, width) row-major. */
struct blk {
    double *a, *h1, *b, *g, *u, *hm, *f;
};

static enum moe_status blk_alloc(struct blk *s, const struct mdl_model *m, int T)
{
    int h = m->hidden;
    int fd = m->dense_intermediate > 0 ? m->dense_intermediate : 1;
    s->a = calloc((size_t)T * h, sizeof(double));
    s->h1 = calloc((size_t)T * h, sizeof(double));
    s->b = calloc((size_t)T * h, sizeof(double));
    s->g = calloc((size_t)T * fd, sizeof(double));
    s->u = calloc((size_t)T * fd, sizeof(double));
    s->hm = calloc((size_t)T * fd, sizeof(double));
    s->f = calloc((size_t)T * h, sizeof(double));
    if (!s->a || !s->h1 || !s->b || !s->g || !s->u || !s->hm || !s->f) return MOE_ERR_NOMEM;
    return MOE_OK;
}

static void blk_free(struct blk *s)
{
    free(s->a), free(s->h1), free(s->b);
    free(s->g), free(s->u), free(s->hm), free(s->f);
}

static double silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* The attention sub-block of block l on its normed input a (T, h). Forward (out != NULL): out =
 * the output projection (T, h). Backward (dout != NULL): recomputes the forward, then adds the
 * input gradient to da and the parameter gradients to the gradient buffer.
 * GQA: q, k, v projections (with biases q_bias, k_bias, v_bias and o_bias on the output, as
 * gpt-oss), with QK-norm an RMSNorm over each head's q and k (weights q_norm, k_norm of head_dim,
 * as Qwen3), RoPE on all of q and k (none on Llama 4's NoPE layers; its other layers attend
 * within chunks). MLA (DeepSeek): q through the optional low
 * rank (wqa, its norm, wqb), the compressed kv (wkva -> c_kv and the shared RoPE key, the norm,
 * wkvb -> k_nope and v); heads attend over [rope | nope] dims (the order is free: q and k agree). */
static enum moe_status attn(const struct ctx *c, int l, const double *a, double *out,
                            const double *dout, double *da, struct moe_error *err)
{
    const struct mdl_model *m = &c->r->model;
    const struct mdl_attention *at = &m->attn;
    int T = c->T, h = m->hidden, H = at->heads,
        window = mdl_layer_is_sliding(m, l) ? at->sliding_window : 0;
    bool has_rope = mdl_layer_has_rope(m, l); /* Llama 4's NoPE layers: none (GQA only) */
    bool l2 = at->qk_l2_norm && has_rope;
    int chunk = mdl_layer_chunk(m, l); /* attention within each chunk of this many */
    if (!chunk || chunk > T) chunk = T;
    bool mla = at->type == MDL_ATTN_MLA;
    int KV = mla ? H : at->kv_heads;
    int nope = mla ? at->qk_nope_head_dim : 0, rope = mla ? at->qk_rope_head_dim : at->head_dim;
    int dqk = nope + rope, dv = mla ? at->v_head_dim : at->head_dim;
    int ql = mla ? at->q_lora_rank : 0, kvl = mla ? at->kv_lora_rank : 0;
    double scale = 1.0 / sqrt(dqk);
    size_t nq = (size_t)T * H * dqk, nk = (size_t)T * KV * dqk, nv = (size_t)T * KV * dv;
    size_t no = (size_t)T * H * dv;
    /* buffers: q k v o and their gradients, q and k before QK-norm; MLA: cq, cqn, qfull, ckvfull,
     * ckv, ckvn, kv, kr */
    size_t nqf = (size_t)T * H * dqk, nkv = (size_t)T * H * (nope + dv);
    size_t total = 3 * (nq + nk) + 2 * (nv + no) +
                   2 * ((size_t)T * ql * 2 + nqf + (size_t)T * (kvl + rope) + (size_t)T * kvl * 2 +
                        nkv + (size_t)T * rope) +
                   (size_t)rope / 2;
    double *buf = calloc(total + 1, sizeof *buf);
    if (!buf) return moe_error_set(err, MOE_ERR_NOMEM, "reference: out of memory");
    double *p = buf;
#define TAKE(n) (p += (n), p - (n))
    double *q = TAKE(nq), *k = TAKE(nk), *v = TAKE(nv), *o = TAKE(no);
    double *dq = TAKE(nq), *dk = TAKE(nk), *dvv = TAKE(nv), *doo = TAKE(no);
    double *qpre = TAKE(nq), *kpre = TAKE(nk); /* QK-norm: q and k before their norms */
    double *cq = TAKE((size_t)T * ql), *cqn = TAKE((size_t)T * ql), *qf = TAKE(nqf);
    double *ckvf = TAKE((size_t)T * (kvl + rope)), *ckv = TAKE((size_t)T * kvl);
    double *ckvn = TAKE((size_t)T * kvl), *kv = TAKE(nkv), *kr = TAKE((size_t)T * rope);
    double *dcq = TAKE((size_t)T * ql), *dcqn = TAKE((size_t)T * ql), *dqf = TAKE(nqf);
    double *dckvf = TAKE((size_t)T * (kvl + rope)), *dckv = TAKE((size_t)T * kvl);
    double *dckvn = TAKE((size_t)T * kvl), *dkv = TAKE(nkv), *dkr = TAKE((size_t)T * rope);
    double *fr = TAKE((size_t)rope / 2), fscale; /* RoPE's frequencies (plain or YaRN) */
#undef TAKE
    mdl_rope_freqs(at, rope, fr, &fscale);
    if (!mla) {
        linear(a, P(c, "wq", l), T, h, H * dqk, q);
        linear(a, P(c, "wk", l), T, h, KV * dqk, k);
        linear(a, P(c, "wv", l), T, h, KV * dv, v);
        if (at->bias) { /* gpt-oss: biases on the projections, before QK-norm and RoPE */
            add_bias(q, P(c, "q_bias", l), T, H * dqk);
            add_bias(k, P(c, "k_bias", l), T, KV * dqk);
            add_bias(v, P(c, "v_bias", l), T, KV * dv);
        }
        if (at->qk_norm) { /* each head's row of dqk is one RMSNorm row */
            memcpy(qpre, q, sizeof(double) * nq);
            memcpy(kpre, k, sizeof(double) * nk);
            exec_ref_rmsnorm(qpre, P(c, "q_norm", l), T * H, dqk, m->norm_eps, q);
            exec_ref_rmsnorm(kpre, P(c, "k_norm", l), T * KV, dqk, m->norm_eps, k);
        }
        if (has_rope) {
            exec_ref_rope(q, T, H, dqk, rope, fr, fscale, c->pos, false);
            exec_ref_rope(k, T, KV, dqk, rope, fr, fscale, c->pos, false);
        }
        if (l2) { /* Llama 4: q and k after RoPE normed, no weights */
            memcpy(qpre, q, sizeof(double) * nq);
            memcpy(kpre, k, sizeof(double) * nk);
            exec_ref_rmsnorm(qpre, NULL, T * H, dqk, m->norm_eps, q);
            exec_ref_rmsnorm(kpre, NULL, T * KV, dqk, m->norm_eps, k);
        }
        for (int t = 0; t < T; t++) { /* Llama 4's query temperature (1 but on NoPE blocks) */
            double tq = mdl_query_temperature(m, l, c->pos[t]);
            for (size_t i = 0; tq != 1.0 && i < (size_t)H * dqk; i++)
                q[(size_t)t * H * dqk + i] *= tq;
        }
    } else {
        if (ql) {
            linear(a, P(c, "wqa", l), T, h, ql, cq);
            exec_ref_rmsnorm(cq, P(c, "qa_norm", l), T, ql, m->norm_eps, cqn);
            linear(cqn, P(c, "wqb", l), T, ql, H * dqk, qf);
        } else {
            linear(a, P(c, "wq", l), T, h, H * dqk, qf);
        }
        linear(a, P(c, "wkva", l), T, h, kvl + rope, ckvf);
        for (int t = 0; t < T; t++) {
            memcpy(ckv + (size_t)t * kvl, ckvf + (size_t)t * (kvl + rope), sizeof(double) * kvl);
            memcpy(kr + (size_t)t * rope, ckvf + (size_t)t * (kvl + rope) + kvl,
                   sizeof(double) * rope);
        }
        exec_ref_rmsnorm(ckv, P(c, "kva_norm", l), T, kvl, m->norm_eps, ckvn);
        linear(ckvn, P(c, "wkvb", l), T, kvl, H * (nope + dv), kv);
        exec_ref_rope(kr, T, 1, rope, rope, fr, fscale, c->pos, false);
        /* q, k as [rope | nope]; qf holds [nope | rope] per head as DeepSeek lays it out */
        for (int t = 0; t < T; t++)
            for (int hh = 0; hh < H; hh++) {
                const double *src = qf + ((size_t)t * H + hh) * dqk;
                double *qd = q + ((size_t)t * H + hh) * dqk, *kd = k + ((size_t)t * H + hh) * dqk;
                const double *kvs = kv + ((size_t)t * H + hh) * (nope + dv);
                memcpy(qd, src + nope, sizeof(double) * rope);
                memcpy(qd + rope, src, sizeof(double) * nope);
                memcpy(kd, kr + (size_t)t * rope, sizeof(double) * rope);
                memcpy(kd + rope, kvs, sizeof(double) * nope);
                memcpy(v + ((size_t)t * H + hh) * dv, kvs + nope, sizeof(double) * dv);
            }
        exec_ref_rope(q, T, H, dqk, rope, fr, fscale, c->pos, false);
    }
    const double *sink = at->sinks ? P(c, "sinks", l) : NULL;
    for (int t0 = 0; t0 < T; t0 += chunk) /* a chunk's tokens attend within it */
        exec_ref_attention(q + (size_t)t0 * H * dqk, k + (size_t)t0 * KV * dqk,
                           v + (size_t)t0 * KV * dv, T - t0 < chunk ? T - t0 : chunk, H, KV, dqk,
                           dv, window, scale, sink, o + (size_t)t0 * H * dv);
    if (out) {
        linear(o, P(c, "wo", l), T, H * dv, h, out);
        if (at->bias) add_bias(out, P(c, "o_bias", l), T, h);
        free(buf);
        return MOE_OK;
    }
    linear_backward(o, P(c, "wo", l), dout, T, H * dv, h, doo, G(c, "wo", l));
    if (at->bias) bias_backward(dout, T, h, G(c, "o_bias", l));
    for (int t0 = 0; t0 < T; t0 += chunk) {
        size_t qo = (size_t)t0 * H * dqk, ko = (size_t)t0 * KV * dqk, vo = (size_t)t0 * KV * dv;
        exec_ref_attention_backward(q + qo, k + ko, v + vo, doo + (size_t)t0 * H * dv,
                                    T - t0 < chunk ? T - t0 : chunk, H, KV, dqk, dv, window, scale,
                                    sink, dq + qo, dk + ko, dvv + vo,
                                    sink ? G(c, "sinks", l) : NULL);
    }
    if (!mla) {
        for (int t = 0; t < T; t++) {
            double tq = mdl_query_temperature(m, l, c->pos[t]);
            for (size_t i = 0; tq != 1.0 && i < (size_t)H * dqk; i++)
                dq[(size_t)t * H * dqk + i] *= tq;
        }
        if (l2) { /* through the weightless norms, in place (q, k are spent) */
            memcpy(q, dq, sizeof(double) * nq);
            memcpy(k, dk, sizeof(double) * nk);
            exec_ref_rmsnorm_backward(qpre, NULL, q, T * H, dqk, m->norm_eps, dq, NULL);
            exec_ref_rmsnorm_backward(kpre, NULL, k, T * KV, dqk, m->norm_eps, dk, NULL);
        }
    }
    if (has_rope) exec_ref_rope(dq, T, H, dqk, rope, fr, fscale, c->pos, true);
    if (!mla) {
        if (has_rope) exec_ref_rope(dk, T, KV, dqk, rope, fr, fscale, c->pos, true);
        if (at->qk_norm) { /* through the norms, in place (q, k hold the normed values) */
            memcpy(q, dq, sizeof(double) * nq);
            memcpy(k, dk, sizeof(double) * nk);
            exec_ref_rmsnorm_backward(qpre, P(c, "q_norm", l), q, T * H, dqk, m->norm_eps, dq,
                                      G(c, "q_norm", l));
            exec_ref_rmsnorm_backward(kpre, P(c, "k_norm", l), k, T * KV, dqk, m->norm_eps, dk,
                                      G(c, "k_norm", l));
        }
        if (at->bias) {
            bias_backward(dq, T, H * dqk, G(c, "q_bias", l));
            bias_backward(dk, T, KV * dqk, G(c, "k_bias", l));
            bias_backward(dvv, T, KV * dv, G(c, "v_bias", l));
        }
        linear_backward(a, P(c, "wq", l), dq, T, h, H * dqk, da, G(c, "wq", l));
        linear_backward(a, P(c, "wk", l), dk, T, h, KV * dqk, da, G(c, "wk", l));
        linear_backward(a, P(c, "wv", l), dvv, T, h, KV * dv, da, G(c, "wv", l));
        free(buf);
        return MOE_OK;
    }
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < H; hh++) {
            const double *gq = dq + ((size_t)t * H + hh) * dqk,
                         *gk = dk + ((size_t)t * H + hh) * dqk;
            double *gqf = dqf + ((size_t)t * H + hh) * dqk;
            double *gkv = dkv + ((size_t)t * H + hh) * (nope + dv);
            memcpy(gqf + nope, gq, sizeof(double) * rope);
            memcpy(gqf, gq + rope, sizeof(double) * nope);
            for (int i = 0; i < rope; i++) dkr[(size_t)t * rope + i] += gk[i]; /* shared key */
            memcpy(gkv, gk + rope, sizeof(double) * nope);
            memcpy(gkv + nope, dvv + ((size_t)t * H + hh) * dv, sizeof(double) * dv);
        }
    exec_ref_rope(dkr, T, 1, rope, rope, fr, fscale, c->pos, true);
    linear_backward(ckvn, P(c, "wkvb", l), dkv, T, kvl, H * (nope + dv), dckvn, G(c, "wkvb", l));
    exec_ref_rmsnorm_backward(ckv, P(c, "kva_norm", l), dckvn, T, kvl, m->norm_eps, dckv,
                              G(c, "kva_norm", l));
    for (int t = 0; t < T; t++) {
        memcpy(dckvf + (size_t)t * (kvl + rope), dckv + (size_t)t * kvl, sizeof(double) * kvl);
        memcpy(dckvf + (size_t)t * (kvl + rope) + kvl, dkr + (size_t)t * rope,
               sizeof(double) * rope);
    }
    linear_backward(a, P(c, "wkva", l), dckvf, T, h, kvl + rope, da, G(c, "wkva", l));
    if (ql) {
        linear_backward(cqn, P(c, "wqb", l), dqf, T, ql, H * dqk, dcqn, G(c, "wqb", l));
        exec_ref_rmsnorm_backward(cq, P(c, "qa_norm", l), dcqn, T, ql, m->norm_eps, dcq,
                                  G(c, "qa_norm", l));
        linear_backward(a, P(c, "wqa", l), dcq, T, h, ql, da, G(c, "wqa", l));
    } else {
        linear_backward(a, P(c, "wq", l), dqf, T, h, H * dqk, da, G(c, "wq", l));
    }
    free(buf);
    return MOE_OK;
}

/* Forward of block l from x (T, h) to y (T, h), keeping intermediates in s. */
static enum moe_status block_forward(const struct ctx *c, int l, const double *x, double *y,
                                     struct blk *s, struct moe_error *err)
{
    const struct mdl_model *m = &c->r->model;
    int T = c->T, h = m->hidden;
    enum moe_status st;
    exec_ref_rmsnorm(x, P(c, "attn_norm", l), T, h, m->norm_eps, s->a);
    if ((st = attn(c, l, s->a, s->h1, NULL, NULL, err))) return st;
    for (size_t i = 0; i < (size_t)T * h; i++) s->h1[i] += x[i];
    exec_ref_rmsnorm(s->h1, P(c, "ffn_norm", l), T, h, m->norm_eps, s->b);
    if (mdl_layer_is_moe(m, l)) {
        struct exec_ref_moe w;
        moe_view(c, l, &w, NULL);
        bool count = !c->grad && c->r->route_counts && !c->ep;
        int *choice = count ? malloc(sizeof *choice * (size_t)T * m->moe.top_k) : NULL;
        if (count && !choice) return moe_error_set(err, MOE_ERR_NOMEM, "reference: out of memory");
        st = c->ep ? exec_ref_ep_moe_forward(c->ep->t, c->ep->g, &w, s->b, T, s->f, NULL, err)
                   : exec_ref_moe_forward(&w, s->b, T, s->f, choice, NULL, err);
        for (int i = 0; count && st == MOE_OK && i < T * m->moe.top_k; i++)
            c->r->route_counts[(size_t)l * m->moe.experts + choice[i]]++;
        free(choice);
        if (st != MOE_OK) return st;
        if (!c->grad) ((struct ctx *)c)->aux += exec_ref_moe_aux_loss(&w, s->b, T);
    } else {
        int fd = m->dense_intermediate;
        linear(s->b, P(c, "gate", l), T, h, fd, s->g);
        linear(s->b, P(c, "up", l), T, h, fd, s->u);
        for (size_t i = 0; i < (size_t)T * fd; i++) s->hm[i] = silu(s->g[i]) * s->u[i];
        linear(s->hm, P(c, "down", l), T, fd, h, s->f);
    }
    for (size_t i = 0; i < (size_t)T * h; i++) y[i] = s->h1[i] + s->f[i];
    return MOE_OK;
}

/* Backward of block l: dy (T, h) -> dx (T, h), accumulating parameter gradients. */
static enum moe_status block_backward(const struct ctx *c, int l, const double *x, const double *dy,
                                      double *dx, struct blk *s, struct moe_error *err)
{
    const struct mdl_model *m = &c->r->model;
    int T = c->T, h = m->hidden;
    enum moe_status st = MOE_OK;
    size_t th = (size_t)T * h;
    double *y = malloc(sizeof *y * th), *dh1 = calloc(th, sizeof *dh1),
           *db = calloc(th, sizeof *db);
    double *tmp = calloc(th, sizeof *tmp), *da = calloc(th, sizeof *da);
    int fd = m->dense_intermediate > 0 ? m->dense_intermediate : 1;
    double *dhm = calloc((size_t)T * fd, sizeof *dhm), *dg = calloc((size_t)T * fd, sizeof *dg),
           *du = calloc((size_t)T * fd, sizeof *du);
    if (!y || !dh1 || !db || !tmp || !da || !dhm || !dg || !du) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "reference: out of memory");
        goto cleanup;
    }
    if ((st = block_forward(c, l, x, y, s, err))) goto cleanup;
    /* y = h1 + f(b): the residual passes dy to h1; the FFN's input gradient goes through its norm. */
    memcpy(dh1, dy, sizeof *dh1 * th);
    if (mdl_layer_is_moe(m, l)) {
        struct exec_ref_moe w;
        struct exec_ref_moe_grad g;
        moe_view(c, l, &w, &g);
        st = c->ep ? exec_ref_ep_moe_backward(c->ep->t, c->ep->g, &w, s->b, T, dy, db, &g, err)
                   : exec_ref_moe_backward(&w, s->b, T, dy, db, &g, err);
        if (st) goto cleanup;
    } else {
        linear_backward(s->hm, P(c, "down", l), dy, T, fd, h, dhm, G(c, "down", l));
        for (size_t i = 0; i < (size_t)T * fd; i++) {
            double sg = 1.0 / (1.0 + exp(-s->g[i]));
            du[i] = dhm[i] * s->g[i] * sg;
            dg[i] = dhm[i] * s->u[i] * sg * (1.0 + s->g[i] * (1.0 - sg));
        }
        linear_backward(s->b, P(c, "gate", l), dg, T, h, fd, db, G(c, "gate", l));
        linear_backward(s->b, P(c, "up", l), du, T, h, fd, db, G(c, "up", l));
    }
    exec_ref_rmsnorm_backward(s->h1, P(c, "ffn_norm", l), db, T, h, m->norm_eps, tmp,
                              G(c, "ffn_norm", l));
    for (size_t i = 0; i < th; i++) dh1[i] += tmp[i];
    /* h1 = x + o Wo^T */
    memcpy(dx, dh1, sizeof *dx * th);
    if ((st = attn(c, l, s->a, NULL, dh1, da, err))) goto cleanup;
    exec_ref_rmsnorm_backward(x, P(c, "attn_norm", l), da, T, h, m->norm_eps, tmp,
                              G(c, "attn_norm", l));
    for (size_t i = 0; i < th; i++) dx[i] += tmp[i];
cleanup:
    free(y), free(dh1), free(db), free(tmp), free(da);
    free(dhm), free(dg), free(du);
    return st;
}

enum moe_status exec_ref_model_step(const struct exec_ref_model *r, const int *tokens, int T,
                                    double *loss, double *aux, double *grad, struct moe_error *err)
{
    return exec_ref_model_step_ep(r, NULL, tokens, T, loss, aux, grad, err);
}

enum moe_status exec_ref_model_step_ep(const struct exec_ref_model *r, const struct exec_ref_ep *ep,
                                       const int *tokens, int T, double *loss, double *aux,
                                       double *grad, struct moe_error *err)
{
    return exec_ref_model_slice(r, ep, tokens, T, 0, r->model.layers, NULL, NULL, NULL, NULL, loss,
                                aux, grad, err);
}

enum moe_status exec_ref_model_slice(const struct exec_ref_model *r, const struct exec_ref_ep *ep,
                                     const int *tokens, int T, int lo, int hi, const double *h_in,
                                     double *h_out, const double *dh_out, double *dh_in,
                                     double *loss, double *aux, double *grad, struct moe_error *err)
{
    const struct mdl_model *m = &r->model;
    int h = m->hidden, V = m->vocab, L = m->layers, n = T - 1;
    bool first = lo == 0, last = hi == L;
    if (T < 2 || T > m->max_seq_len)
        return moe_error_set(err, MOE_ERR_INPUT, "reference step: %d tokens (2 .. %d)", T,
                             m->max_seq_len);
    if (lo < 0 || hi > L || lo >= hi || (!first && !h_in) || (!last && !h_out && !grad) ||
        (!last && grad && !dh_out) || (!first && grad && !dh_in))
        return moe_error_set(err, MOE_ERR_INPUT,
                             "reference step: blocks [%d, %d) of %d, or a slice's input or output "
                             "missing",
                             lo, hi, L);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return moe_error_set(err, MOE_ERR_INPUT, "reference step: token %d is %d, vocab %d", t,
                                 tokens[t], V);
    enum moe_status st = MOE_OK;
    struct ctx c = {r, ep, NULL, n, NULL, 0.0};
    size_t th = (size_t)n * h;
    int nb = hi - lo;
    double *hs = calloc((size_t)(nb + 1) * th, sizeof *hs); /* block inputs, and the last output */
    double *fin = calloc(th, sizeof *fin),
           *logits = calloc(last ? (size_t)n * V : 1, sizeof *logits);
    double *dlog = calloc(last ? (size_t)n * V : 1, sizeof *dlog), *dfin = calloc(th, sizeof *dfin);
    double *dh = calloc(th, sizeof *dh), *dprev = calloc(th, sizeof *dprev);
    c.pos = malloc(sizeof *c.pos * (size_t)n);
    struct blk s;
    memset(&s, 0, sizeof s);
    if (!hs || !fin || !logits || !dlog || !dfin || !dh || !dprev || !c.pos ||
        blk_alloc(&s, m, n) != MOE_OK) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "reference: out of memory");
        goto cleanup;
    }
    for (int t = 0; t < n; t++) c.pos[t] = t;
    const double *emb = P(&c, "embed", -1);
    const double *head = m->tied_embeddings ? emb : P(&c, "lm_head", -1);
    if (first)
        for (int t = 0; t < n; t++)
            memcpy(hs + (size_t)t * h, emb + (size_t)tokens[t] * h, sizeof(double) * h);
    else
        memcpy(hs, h_in, sizeof *hs * th);
    for (int l = lo; l < hi; l++)
        if ((st = block_forward(&c, l, hs + (size_t)(l - lo) * th, hs + (size_t)(l - lo + 1) * th,
                                &s, err)))
            goto cleanup;
    if (aux) *aux = c.aux;
    if (last) {
        exec_ref_rmsnorm(hs + (size_t)nb * th, P(&c, "final_norm", -1), n, h, m->norm_eps, fin);
        linear(fin, head, n, h, V, logits);
        *loss = exec_ref_cross_entropy(logits, tokens + 1, n, V, grad ? dlog : NULL) + c.aux;
    } else {
        if (loss) *loss = c.aux;
        if (h_out) memcpy(h_out, hs + (size_t)nb * th, sizeof *h_out * th);
    }
    if (!grad) goto cleanup;
    c.grad = grad;
    memset(grad, 0, sizeof *grad * r->nparams);
    if (last) {
        double *dhead = m->tied_embeddings ? G(&c, "embed", -1) : G(&c, "lm_head", -1);
        linear_backward(fin, head, dlog, n, h, V, dfin, dhead);
        exec_ref_rmsnorm_backward(hs + (size_t)nb * th, P(&c, "final_norm", -1), dfin, n, h,
                                  m->norm_eps, dh, G(&c, "final_norm", -1));
    } else {
        memcpy(dh, dh_out, sizeof *dh * th);
    }
    for (int l = hi - 1; l >= lo; l--) {
        if ((st = block_backward(&c, l, hs + (size_t)(l - lo) * th, dh, dprev, &s, err)))
            goto cleanup;
        memcpy(dh, dprev, sizeof *dh * th);
    }
    if (first) {
        double *demb = G(&c, "embed", -1);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < h; i++) demb[(size_t)tokens[t] * h + i] += dh[(size_t)t * h + i];
    } else {
        memcpy(dh_in, dh, sizeof *dh_in * th);
    }
cleanup:
    free(hs), free(fin), free(logits), free(dlog), free(dfin), free(dh), free(dprev), free(c.pos);
    blk_free(&s);
    return st;
}
