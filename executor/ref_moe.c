/*
 * ref_moe.c: the CPU reference of a dropless MoE layer, forward and backward, in double precision.
 *
 * Written to be read next to the math, not to be fast: every (token, expert) pair the router
 * chooses is computed, nothing is dropped or padded. The GPU kernels are checked against it, and
 * it is itself checked against finite differences (tests/unit/test_ref_moe.c).
 *
 * Routing (DeepSeek, Qwen, Mixtral, gpt-oss, Llama 4 conventions in one rule):
 *   s = softmax(logits) or sigmoid(logits)           scores
 *   key = s + bias                                   selection only (aux-loss-free balancing)
 *   group-limited: a group's key is the sum of its two best keys (one expert: its key); only
 *   the topk_group best groups stay eligible; then the top_k keys (ties: lower expert id)
 *   weight = softmax over the chosen logits (softmax_after_topk), else s of the chosen;
 *   normalized to sum 1 (norm_topk); times scaling
 * Expert e (SwiGLU): out = down_e (silu(gate_e x) * up_e x); gpt-oss adds biases to the logits and
 * to each projection and clamps its activation: out = down_e act(gate_e x + gb_e, up_e x + ub_e)
 * + db_e, act as in mdl.h.
 * Optional load-balance loss (Switch Transformer form), aux_coef a:
 *   aux = a * E * sum_e f_e * P_e,  f_e = (pairs routed to e) / (T * top_k),  P_e = mean_t s_te
 * f_e is piecewise constant, so d aux / d s_te = a * E * f_e / T, through the scores.
 */
#include "exec_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void exec_router_cfg_from_model(struct exec_router_cfg *cfg, const struct mdl_model *m)
{
    cfg->experts = m->moe.experts;
    cfg->top_k = m->moe.top_k;
    cfg->scoring = m->moe.scoring;
    cfg->n_group = m->moe.n_group;
    cfg->topk_group = m->moe.topk_group;
    cfg->norm_topk = m->moe.norm_topk;
    cfg->softmax_after_topk = m->moe.softmax_after_topk;
    cfg->scaling = m->moe.scaling;
    cfg->aux_coef = 0.0;
}

static double sigmoid(double z)
{
    return 1.0 / (1.0 + exp(-z));
}

/* Scores of one token: softmax over all experts, or sigmoid per expert. */
static void scores_of(const struct exec_router_cfg *cfg, const double *z, double *s)
{
    int E = cfg->experts;
    if (cfg->scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = sigmoid(z[e]);
        return;
    }
    double mx = z[0], sum = 0.0;
    for (int e = 1; e < E; e++) mx = fmax(mx, z[e]);
    for (int e = 0; e < E; e++) sum += (s[e] = exp(z[e] - mx));
    for (int e = 0; e < E; e++) s[e] /= sum;
}

/* The chosen experts of one token, in order of their keys. */
static void choose(const struct exec_router_cfg *cfg, const double *s, const double *bias,
                   int *chosen)
{
    int E = cfg->experts, G = cfg->n_group > 0 ? cfg->n_group : 1, per = E / G;
    double key[4096];
    bool eligible[4096];
    for (int e = 0; e < E; e++) {
        key[e] = s[e] + (bias ? bias[e] : 0.0);
        eligible[e] = true;
    }
    if (G > 1 && cfg->topk_group < G) {
        double gkey[4096];
        for (int g = 0; g < G; g++) {
            double a = -HUGE_VAL, b = -HUGE_VAL; /* best two */
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (key[e] > a)
                    b = a, a = key[e];
                else if (key[e] > b)
                    b = key[e];
            }
            gkey[g] = per >= 2 ? a + b : a;
        }
        bool keep[4096] = {false};
        for (int n = 0; n < cfg->topk_group; n++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gkey[g] > gkey[best])) best = g;
            keep[best] = true;
        }
        for (int e = 0; e < E; e++) eligible[e] = keep[e / per];
    }
    for (int j = 0; j < cfg->top_k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (eligible[e] && (best < 0 || key[e] > key[best])) best = e;
        chosen[j] = best;
        eligible[best] = false;
    }
}

/* Weights of the chosen experts from the logits and scores. */
static void weights_of(const struct exec_router_cfg *cfg, const double *z, const double *s,
                       const int *chosen, double *w)
{
    int k = cfg->top_k;
    if (cfg->softmax_after_topk) {
        double mx = z[chosen[0]], sum = 0.0;
        for (int j = 1; j < k; j++) mx = fmax(mx, z[chosen[j]]);
        for (int j = 0; j < k; j++) sum += (w[j] = exp(z[chosen[j]] - mx));
        for (int j = 0; j < k; j++) w[j] /= sum;
    } else {
        for (int j = 0; j < k; j++) w[j] = s[chosen[j]];
        if (cfg->norm_topk) {
            double sum = 0.0;
            for (int j = 0; j < k; j++) sum += w[j];
            for (int j = 0; j < k; j++) w[j] /= sum;
        }
    }
    for (int j = 0; j < k; j++) w[j] *= cfg->scaling;
}

void exec_ref_route(const struct exec_router_cfg *cfg, const double *logits, const double *bias,
                    int tokens, int *choice, double *weight)
{
    int E = cfg->experts, k = cfg->top_k;
    double s[4096];
    for (int t = 0; t < tokens; t++) {
        const double *z = logits + (size_t)t * E;
        scores_of(cfg, z, s);
        choose(cfg, s, bias, choice + (size_t)t * k);
        weights_of(cfg, z, s, choice + (size_t)t * k, weight + (size_t)t * k);
    }
}

void exec_ref_permute(const int *choice, int tokens, int top_k, int experts, int *offsets,
                      int *row_src)
{
    for (int e = 0; e <= experts; e++) offsets[e] = 0;
    for (int i = 0; i < tokens * top_k; i++) offsets[choice[i] + 1]++;
    for (int e = 0; e < experts; e++) offsets[e + 1] += offsets[e];
    int *fill = malloc(sizeof *fill * (size_t)experts);
    if (!fill) return;
    for (int e = 0; e < experts; e++) fill[e] = offsets[e];
    for (int i = 0; i < tokens * top_k; i++) row_src[fill[choice[i]]++] = i;
    free(fill);
}

/* y = A x for A (rows, cols). */
static void matvec(const double *A, const double *x, int rows, int cols, double *y)
{
    for (int r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int c = 0; c < cols; c++) acc += A[(size_t)r * cols + c] * x[c];
        y[r] = acc;
    }
}

/* The router's logits of one row: router x (+ router_b). */
static void router_logits(const struct exec_ref_moe *w, const double *x, double *z)
{
    matvec(w->router, x, w->cfg.experts, w->hidden, z);
    if (w->router_b)
        for (int e = 0; e < w->cfg.experts; e++) z[e] += w->router_b[e];
}

/* One SwiGLU FFN: expert e's (e = -1: the shared experts, which have no biases and the plain
 * activation), its weights, biases (NULL: none), width and activation. */
struct ffn {
    const double *gate, *up, *down, *gb, *ub, *db;
    int f;
    bool clamped;
    double alpha, limit;
};

static struct ffn ffn_of(const struct exec_ref_moe *w, int e)
{
    size_t fh = (size_t)w->ffn * w->hidden;
    if (e < 0)
        return (struct ffn){w->sgate, w->sup,        w->sdown, NULL, NULL,
                            NULL,     w->shared_ffn, false,    1.0,  0.0};
    return (struct ffn){w->gate + e * fh,
                        w->up + e * fh,
                        w->down + e * fh,
                        w->gate_b ? w->gate_b + (size_t)e * w->ffn : NULL,
                        w->up_b ? w->up_b + (size_t)e * w->ffn : NULL,
                        w->down_b ? w->down_b + (size_t)e * w->hidden : NULL,
                        w->ffn,
                        w->act == MDL_ACT_CLAMPED_SWIGLU,
                        w->alpha,
                        w->limit};
}

/* The activation of gate g and up u, and its derivatives in g and u (when dg is not NULL):
 * silu(g) u, or the clamped form (u' + 1) g' sigmoid(alpha g'), g' = min(g, limit),
 * u' = clamp(u, -limit, limit), whose clamps pass no gradient outside their range (as
 * torch.clamp: the bounds themselves pass it). */
static double act(const struct ffn *F, double g, double u, double *dg, double *du)
{
    if (!F->clamped) {
        double sg = sigmoid(g);
        if (dg) *dg = u * sg * (1.0 + g * (1.0 - sg)), *du = g * sg;
        return g * sg * u;
    }
    double gc = fmin(g, F->limit), uc = fmin(fmax(u, -F->limit), F->limit);
    double sg = sigmoid(F->alpha * gc), glu = gc * sg;
    if (dg) {
        *dg = g <= F->limit ? (uc + 1.0) * sg * (1.0 + F->alpha * gc * (1.0 - sg)) : 0.0;
        *du = u >= -F->limit && u <= F->limit ? glu : 0.0;
    }
    return (uc + 1.0) * glu;
}

/* The FFN's hidden row of x: g, u (with their biases) and hm = act(g, u). */
static void ffn_hidden(const struct ffn *F, int h, const double *x, double *g, double *u,
                       double *hm)
{
    matvec(F->gate, x, F->f, h, g);
    matvec(F->up, x, F->f, h, u);
    for (int i = 0; i < F->f; i++) {
        if (F->gb) g[i] += F->gb[i], u[i] += F->ub[i];
        hm[i] = act(F, g[i], u[i], NULL, NULL);
    }
}

/* The FFN on one row x: g, u, hm kept for the caller, out = down hm (+ db). */
static void ffn_forward(const struct ffn *F, int h, const double *x, double *out, double *g,
                        double *u, double *hm)
{
    ffn_hidden(F, h, x, g, u, hm);
    matvec(F->down, hm, h, F->f, out);
    if (F->db)
        for (int r = 0; r < h; r++) out[r] += F->db[r];
}

/* Backward of one row for d_out: accumulates the gradients of expert e (g's slices) and dx. */
static void ffn_backward(const struct ffn *F, const struct exec_ref_moe *w, int e, int h,
                         const double *x, const double *d_out, struct exec_ref_moe_grad *gr,
                         double *dx, double *g, double *u, double *hm, double *dh)
{
    int f = F->f;
    size_t fh = (size_t)f * h;
    double *dgate = e < 0 ? gr->sgate : gr->gate + e * fh;
    double *dup = e < 0 ? gr->sup : gr->up + e * fh;
    double *ddown = e < 0 ? gr->sdown : gr->down + e * fh;
    ffn_hidden(F, h, x, g, u, hm);
    for (int r = 0; r < h; r++)
        for (int c = 0; c < f; c++) ddown[(size_t)r * f + c] += d_out[r] * hm[c];
    if (F->db)
        for (int r = 0; r < h; r++) gr->down_b[(size_t)e * w->hidden + r] += d_out[r];
    for (int c = 0; c < f; c++) {
        double acc = 0.0;
        for (int r = 0; r < h; r++) acc += F->down[(size_t)r * f + c] * d_out[r];
        dh[c] = acc;
    }
    for (int i = 0; i < f; i++) {
        double ag, au;
        act(F, g[i], u[i], &ag, &au);
        double dg = dh[i] * ag, du = dh[i] * au;
        if (F->gb) gr->gate_b[(size_t)e * w->ffn + i] += dg, gr->up_b[(size_t)e * w->ffn + i] += du;
        for (int c = 0; c < h; c++) {
            dgate[(size_t)i * h + c] += dg * x[c];
            dup[(size_t)i * h + c] += du * x[c];
            dx[c] += F->gate[(size_t)i * h + c] * dg + F->up[(size_t)i * h + c] * du;
        }
    }
}

/* Fractions f_e of the routed pairs per expert, for the load-balance loss. */
void exec_ref_moe_route_fractions(const struct exec_ref_moe *w, const double *x, int tokens,
                                  double *f)
{
    const struct exec_router_cfg *cfg = &w->cfg;
    int E = cfg->experts, k = cfg->top_k, ch[4096];
    double z[4096], s[4096];
    for (int e = 0; e < E; e++) f[e] = 0.0;
    for (int t = 0; t < tokens; t++) {
        router_logits(w, x + (size_t)t * w->hidden, z);
        scores_of(cfg, z, s);
        choose(cfg, s, w->bias, ch);
        for (int j = 0; j < k; j++) f[ch[j]] += 1.0 / ((double)tokens * k);
    }
}

double exec_ref_moe_aux_loss(const struct exec_ref_moe *w, const double *x, int tokens)
{
    const struct exec_router_cfg *cfg = &w->cfg;
    int E = cfg->experts;
    if (cfg->aux_coef == 0.0 || tokens == 0) return 0.0;
    double f[4096], z[4096], s[4096], sum = 0.0;
    exec_ref_moe_route_fractions(w, x, tokens, f);
    for (int t = 0; t < tokens; t++) {
        router_logits(w, x + (size_t)t * w->hidden, z);
        scores_of(cfg, z, s);
        for (int e = 0; e < E; e++) sum += f[e] * s[e];
    }
    return cfg->aux_coef * E * sum / tokens;
}

/* d loss / d logits (dz, experts) from dw (top_k), d loss / d weight of each chosen slot: back
 * through the scaling, the normalization or the top-k softmax, and the scores (ds: scratch).
 * dw is scaled in place. */
static void router_scores_backward(const struct exec_router_cfg *cfg, const double *s,
                                   const int *ch, const double *wt, double *dw, double *dz,
                                   double *ds)
{
    int E = cfg->experts, k = cfg->top_k;
    for (int j = 0; j < k; j++) dw[j] *= cfg->scaling;
    for (int e = 0; e < E; e++) dz[e] = ds[e] = 0.0;
    if (cfg->softmax_after_topk) {
        double dot = 0.0;
        for (int j = 0; j < k; j++) dot += wt[j] / cfg->scaling * dw[j];
        for (int j = 0; j < k; j++) dz[ch[j]] = wt[j] / cfg->scaling * (dw[j] - dot);
        return;
    }
    if (cfg->norm_topk) {
        double sum = 0.0, dot = 0.0;
        for (int j = 0; j < k; j++) sum += s[ch[j]];
        for (int j = 0; j < k; j++) dot += dw[j] * s[ch[j]] / sum;
        for (int j = 0; j < k; j++) ds[ch[j]] = (dw[j] - dot) / sum;
    } else {
        for (int j = 0; j < k; j++) ds[ch[j]] = dw[j];
    }
    if (cfg->scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) dz[e] = ds[e] * s[e] * (1.0 - s[e]);
    } else {
        double dot = 0.0;
        for (int e = 0; e < E; e++) dot += s[e] * ds[e];
        for (int e = 0; e < E; e++) dz[e] = s[e] * (ds[e] - dot);
    }
}

/* The load-balance loss of `tokens` tokens with pair fractions frac, through the scores s of one
 * token: d aux / d s_e = aux_coef * E * f_e / tokens, added into dz. */
static void aux_scores_backward(const struct exec_router_cfg *cfg, const double *s,
                                const double *frac, int tokens, double *dz)
{
    int E = cfg->experts;
    double da[4096], dot = 0.0;
    for (int e = 0; e < E; e++) da[e] = cfg->aux_coef * E * frac[e] / tokens;
    if (cfg->scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) dz[e] += da[e] * s[e] * (1.0 - s[e]);
    } else {
        for (int e = 0; e < E; e++) dot += s[e] * da[e];
        for (int e = 0; e < E; e++) dz[e] += s[e] * (da[e] - dot);
    }
}

/* Router gradient and dx of one token from dz (experts). */
static void router_logits_backward(const struct exec_ref_moe *w, const double *xt, const double *dz,
                                   double *dxt, struct exec_ref_moe_grad *g)
{
    double *grad_router = g->router;
    int h = w->hidden;
    for (int e = 0; e < w->cfg.experts; e++)
        if (w->router_b) g->router_b[e] += dz[e];
    for (int e = 0; e < w->cfg.experts; e++)
        for (int c = 0; c < h; c++) {
            grad_router[(size_t)e * h + c] += dz[e] * xt[c];
            dxt[c] += w->router[(size_t)e * h + c] * dz[e];
        }
}

void exec_ref_expert_forward(const struct exec_ref_moe *w, int e, const double *x, double *out)
{
    struct ffn F = ffn_of(w, e);
    double *tmp = malloc(sizeof *tmp * (size_t)(3 * F.f));
    if (!tmp) return;
    ffn_forward(&F, w->hidden, x, out, tmp, tmp + F.f, tmp + 2 * F.f);
    free(tmp);
}

void exec_ref_expert_backward(const struct exec_ref_moe *w, int e, const double *x,
                              const double *d_out, struct exec_ref_moe_grad *g, double *dx)
{
    struct ffn F = ffn_of(w, e);
    double *tmp = malloc(sizeof *tmp * (size_t)(4 * F.f));
    if (!tmp) return;
    ffn_backward(&F, w, e, w->hidden, x, d_out, g, dx, tmp, tmp + F.f, tmp + 2 * F.f,
                 tmp + 3 * F.f);
    free(tmp);
}

void exec_ref_moe_route(const struct exec_ref_moe *w, const double *x, int tokens, int *choice,
                        double *weight)
{
    int E = w->cfg.experts, k = w->cfg.top_k;
    double z[4096] = {0};
    if (E < 1 || E > 4096) return;
    for (int t = 0; t < tokens; t++) {
        router_logits(w, x + (size_t)t * w->hidden, z);
        exec_ref_route(&w->cfg, z, w->bias, 1, choice + (size_t)t * k, weight + (size_t)t * k);
    }
}

void exec_ref_router_backward(const struct exec_ref_moe *w, const double *x, const double *dw,
                              const double *frac, int tokens, double *dx,
                              struct exec_ref_moe_grad *g)
{
    const struct exec_router_cfg *cfg = &w->cfg;
    int E = cfg->experts, k = cfg->top_k;
    double z[4096] = {0}, s[4096], ds[4096], dz[4096], wt[64], d[64];
    int ch[64];
    if (E < 1 || E > 4096 || k > 64) return;
    router_logits(w, x, z);
    scores_of(cfg, z, s);
    choose(cfg, s, w->bias, ch);
    weights_of(cfg, z, s, ch, wt);
    for (int j = 0; j < k; j++) d[j] = dw[j];
    router_scores_backward(cfg, s, ch, wt, d, dz, ds);
    if (frac && cfg->aux_coef != 0.0) aux_scores_backward(cfg, s, frac, tokens, dz);
    router_logits_backward(w, x, dz, dx, g);
}

static enum moe_status check_layer(const struct exec_ref_moe *w, int tokens, struct moe_error *err)
{
    const struct exec_router_cfg *c = &w->cfg;
    if (tokens < 0 || w->hidden < 1 || w->ffn < 1 || c->experts < 1 || c->experts > 4096 ||
        c->top_k < 1 || c->top_k > 64 || c->top_k > c->experts || c->n_group < 1 ||
        c->experts % c->n_group || c->topk_group < 1 || c->topk_group > c->n_group ||
        c->top_k > c->topk_group * (c->experts / c->n_group))
        return moe_error_set(err, MOE_ERR_INPUT, "reference MoE: inconsistent shapes or routing");
    return MOE_OK;
}

enum moe_status exec_ref_moe_forward(const struct exec_ref_moe *w, const double *x, int tokens,
                                     double *y, int *choice, double *weight, struct moe_error *err)
{
    enum moe_status st = check_layer(w, tokens, err);
    if (st != MOE_OK) return st;
    int h = w->hidden, f = w->ffn, E = w->cfg.experts, k = w->cfg.top_k;
    int fs = w->shared_ffn > f ? w->shared_ffn : f;
    double *z = malloc(sizeof *z * (size_t)E),
           *tmp = malloc(sizeof *tmp * (size_t)(3 * fs + 2 * h));
    int *ch = malloc(sizeof *ch * (size_t)k);
    double *wt = malloc(sizeof *wt * (size_t)k);
    if (!z || !tmp || !ch || !wt) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "reference MoE: out of memory");
        goto cleanup;
    }
    double *g = tmp, *u = tmp + fs, *hm = tmp + 2 * fs, *out = tmp + 3 * fs, *xs = out + h;
    for (int t = 0; t < tokens; t++) {
        const double *xt = x + (size_t)t * h;
        double *yt = y + (size_t)t * h;
        router_logits(w, xt, z);
        exec_ref_route(&w->cfg, z, w->bias, 1, ch, wt);
        for (int c = 0; c < h; c++) yt[c] = 0.0;
        for (int j = 0; j < k; j++) {
            int e = ch[j];
            struct ffn F = ffn_of(w, e);
            if (w->probs_on_input) { /* Llama 4: expert(w x) */
                for (int c = 0; c < h; c++) xs[c] = wt[j] * xt[c];
                ffn_forward(&F, h, xs, out, g, u, hm);
                for (int c = 0; c < h; c++) yt[c] += out[c];
                continue;
            }
            ffn_forward(&F, h, xt, out, g, u, hm);
            for (int c = 0; c < h; c++) yt[c] += wt[j] * out[c];
        }
        if (w->shared_ffn) {
            struct ffn F = ffn_of(w, -1);
            ffn_forward(&F, h, xt, out, g, u, hm);
            for (int c = 0; c < h; c++) yt[c] += out[c];
        }
        if (choice) memcpy(choice + (size_t)t * k, ch, sizeof *ch * (size_t)k);
        if (weight) memcpy(weight + (size_t)t * k, wt, sizeof *wt * (size_t)k);
    }
cleanup:
    free(z);
    free(tmp);
    free(ch);
    free(wt);
    return st;
}

enum moe_status exec_ref_moe_backward(const struct exec_ref_moe *w, const double *x, int tokens,
                                      const double *dy, double *dx, struct exec_ref_moe_grad *gr,
                                      struct moe_error *err)
{
    enum moe_status st = check_layer(w, tokens, err);
    if (st != MOE_OK) return st;
    const struct exec_router_cfg *cfg = &w->cfg;
    int h = w->hidden, f = w->ffn, E = cfg->experts, k = cfg->top_k;
    int fs = w->shared_ffn > f ? w->shared_ffn : f;
    double *z = malloc(sizeof *z * (size_t)E), *s = malloc(sizeof *s * (size_t)E);
    double *ds = malloc(sizeof *ds * (size_t)E), *dz = malloc(sizeof *dz * (size_t)E);
    double *tmp = malloc(sizeof *tmp * (size_t)(4 * fs + 4 * h));
    int *ch = malloc(sizeof *ch * (size_t)k);
    double *wt = malloc(sizeof *wt * (size_t)k), *dw = malloc(sizeof *dw * (size_t)k);
    if (!z || !s || !ds || !dz || !tmp || !ch || !wt || !dw) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "reference MoE: out of memory");
        goto cleanup;
    }
    double *g = tmp, *u = tmp + fs, *hm = tmp + 2 * fs, *dh = tmp + 3 * fs, *out = tmp + 4 * fs,
           *dout = out + h, *xs = dout + h, *dxs = xs + h;
    double frac[4096];
    if (cfg->aux_coef != 0.0) exec_ref_moe_route_fractions(w, x, tokens, frac);
    for (int t = 0; t < tokens; t++) {
        const double *xt = x + (size_t)t * h, *dyt = dy + (size_t)t * h;
        double *dxt = dx + (size_t)t * h;
        for (int c = 0; c < h; c++) dxt[c] = 0.0;
        router_logits(w, xt, z);
        scores_of(cfg, z, s);
        choose(cfg, s, w->bias, ch);
        weights_of(cfg, z, s, ch, wt);
        /* Experts: d_out = weight x dy; the weight's gradient is dy . out. */
        for (int j = 0; j < k; j++) {
            int e = ch[j];
            struct ffn F = ffn_of(w, e);
            if (w->probs_on_input) { /* y += expert(w x): dxs its input's gradient, then
                                      * dw = dxs . x and dx += w dxs */
                for (int c = 0; c < h; c++) xs[c] = wt[j] * xt[c], dxs[c] = 0.0;
                ffn_forward(&F, h, xs, out, g, u, hm);
                ffn_backward(&F, w, e, h, xs, dyt, gr, dxs, g, u, hm, dh);
                double acc = 0.0;
                for (int c = 0; c < h; c++) acc += dxs[c] * xt[c], dxt[c] += wt[j] * dxs[c];
                dw[j] = acc;
                continue;
            }
            ffn_forward(&F, h, xt, out, g, u, hm);
            double acc = 0.0;
            for (int c = 0; c < h; c++) acc += dyt[c] * out[c];
            dw[j] = acc;
            for (int c = 0; c < h; c++) dout[c] = wt[j] * dyt[c];
            ffn_backward(&F, w, e, h, xt, dout, gr, dxt, g, u, hm, dh);
        }
        if (w->shared_ffn) {
            struct ffn F = ffn_of(w, -1);
            ffn_backward(&F, w, -1, h, xt, dyt, gr, dxt, g, u, hm, dh);
        }
        router_scores_backward(cfg, s, ch, wt, dw, dz, ds);
        if (cfg->aux_coef != 0.0) aux_scores_backward(cfg, s, frac, tokens, dz);
        router_logits_backward(w, xt, dz, dxt, gr);
    }
cleanup:
    free(z);
    free(s);
    free(ds);
    free(dz);
    free(tmp);
    free(ch);
    free(wt);
    free(dw);
    return st;
}
