/*
 * ref_ep.c: the reference's expert-parallel MoE layer: the dispatch, the experts where they
 * live, the combine, and the backward of all of it, over any transport.
 *
 * The rows and their order come from ep.c (the GPU executor uses the same), so this is the twin
 * the GPU path is checked against, and it is itself checked against exec_ref_moe_forward and
 * _backward on the same tokens (tests/unit/test_ref_parallel.c) for every dedup mode and rank count.
 *
 * Forward on each rank: route its tokens; hop 1 (and for per-domain dedup hop 2 from the
 * landing rank) carries x to the ranks of the experts; each row comes back as the weighted sum
 * of the slots computed where it went (a landing rank adds what its forwards returned); y sums
 * the returned rows, then the shared experts. Backward: the same rows carry [x, dy] out and
 * [dx, dw of its slots] back; the router's backward runs at the token's own rank from dw.
 */
#include "exec_dist.h"

#include <stdlib.h>
#include <string.h>

/* The rows of one exchange: metadata and payload (width doubles a row) out and in. */
struct hop {
    struct exec_ep_rows out; /* what this rank sends */
    int *in_count;           /* (ranks) what it receives from each */
    int n_in;
    struct exec_ep_meta *meta; /* (n_in) received */
    double *payload;           /* (n_in, width) received */
};

static void hop_free(struct hop *h)
{
    exec_ep_rows_free(&h->out);
    free(h->in_count);
    free(h->meta);
    free(h->payload);
}

static void *alloc0(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* Send h->out with its payload (rows of `from`, width doubles, picked by out.src_row). */
static enum moe_status hop_send(struct exec_transport *t, struct hop *h, const double *from,
                                int width, struct moe_error *err)
{
    int R = t->ranks, n = h->out.n;
    enum moe_status st;
    h->in_count = alloc0((size_t)R, sizeof(int));
    double *buf = alloc0((size_t)n * width, sizeof(double));
    if (!h->in_count || !buf) {
        free(buf);
        return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    }
    if ((st = t->ops->counts(t, h->out.count, h->in_count, err)) != MOE_OK) goto done;
    h->n_in = 0;
    for (int s = 0; s < R; s++) h->n_in += h->in_count[s];
    h->meta = alloc0((size_t)h->n_in, sizeof *h->meta);
    h->payload = alloc0((size_t)h->n_in * width, sizeof(double));
    if (!h->meta || !h->payload) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done; /* the peers fail at the next collective */
    }
    for (int i = 0; i < n; i++)
        memcpy(buf + (size_t)i * width, from + (size_t)h->out.src_row[i] * width,
               sizeof(double) * (size_t)width);
    if ((st = t->ops->alltoallv(t, h->out.meta, h->out.count, h->meta, h->in_count, sizeof *h->meta,
                                err)) != MOE_OK)
        goto done;
    st = t->ops->alltoallv(t, buf, h->out.count, h->payload, h->in_count,
                           sizeof(double) * (size_t)width, err);
done:
    free(buf);
    return st;
}

/* The way back: each received row's result (back, n_in x width) returns to its sender, and
 * arrives in the order of h->out; it is added into into[out.src_row[i]] (width doubles). */
static enum moe_status hop_return(struct exec_transport *t, const struct hop *h, const double *back,
                                  int width, double *into, struct moe_error *err)
{
    double *got = alloc0((size_t)h->out.n * width, sizeof(double));
    if (!got) return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    enum moe_status st = t->ops->alltoallv(t, back, h->in_count, got, h->out.count,
                                           sizeof(double) * (size_t)width, err);
    if (st == MOE_OK)
        for (int i = 0; i < h->out.n; i++) {
            double *d = into + (size_t)h->out.src_row[i] * width;
            for (int c = 0; c < width; c++) d[c] += got[(size_t)i * width + c];
        }
    free(got);
    return st;
}

/* Both hops out: hop 1 of this rank's tokens (rows of `from`), then hop 2 of what arrived. */
static enum moe_status dispatch(struct exec_transport *t, const struct exec_ep_group *g,
                                const struct exec_ref_moe *w, const double *x, int tokens,
                                const double *from, int width, struct hop *h1, struct hop *h2,
                                struct moe_error *err)
{
    int k = g->top_k;
    int *ch = alloc0((size_t)tokens * k, sizeof(int));
    double *wt = alloc0((size_t)tokens * k, sizeof(double));
    enum moe_status st = MOE_OK;
    if (!ch || !wt) st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    if (st == MOE_OK) {
        exec_ref_moe_route(w, x, tokens, ch, wt);
        st = exec_ep_first_hop(g, t->rank, ch, wt, tokens, &h1->out, err);
    }
    free(ch);
    free(wt);
    if (st == MOE_OK) st = hop_send(t, h1, from, width, err);
    if (st == MOE_OK) st = exec_ep_second_hop(g, t->rank, h1->meta, h1->n_in, &h2->out, err);
    if (st == MOE_OK) st = hop_send(t, h2, h1->payload, width, err);
    return st;
}

static enum moe_status check(const struct exec_transport *t, const struct exec_ep_group *g,
                             const struct exec_ref_moe *w, struct moe_error *err)
{
    if (g->ranks != t->ranks || g->experts != w->cfg.experts || g->top_k != w->cfg.top_k)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "expert parallelism: the group (%d ranks, %d experts, top_k %d) does "
                             "not match the transport (%d ranks) or the layer (%d, top_k %d)",
                             g->ranks, g->experts, g->top_k, t->ranks, w->cfg.experts,
                             w->cfg.top_k);
    if (w->probs_on_input)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "expert parallelism with the routing weight on the expert's input "
                             "(Llama 4): not in the executor yet");
    return exec_ep_group_check(g, err);
}

/* The weighted sum of the slots of m computed here, on x (hidden), into y (hidden). */
static void slots_forward(const struct exec_ep_group *g, int me, const struct exec_ref_moe *w,
                          const struct exec_ep_meta *m, const double *x, double *y, double *out)
{
    for (int j = 0; j < g->top_k; j++) {
        if (!exec_ep_slot_here(g, me, m, j)) continue;
        exec_ref_expert_forward(w, m->expert[j], x, out);
        for (int c = 0; c < w->hidden; c++) y[c] += m->weight[j] * out[c];
    }
}

enum moe_status exec_ref_ep_moe_forward(struct exec_transport *t, const struct exec_ep_group *g,
                                        const struct exec_ref_moe *w, const double *x, int tokens,
                                        double *y, struct cost_bytes *sent, struct moe_error *err)
{
    enum moe_status st = check(t, g, w, err);
    if (st != MOE_OK) return st;
    int h = w->hidden, me = t->rank;
    struct hop h1 = {0}, h2 = {0};
    double *p1 = NULL, *p2 = NULL, *out = alloc0((size_t)h, sizeof(double));
    st = dispatch(t, g, w, x, tokens, x, h, &h1, &h2, err);
    if (st != MOE_OK) goto done;
    if (sent) {
        exec_ep_rows_bytes(g, me, &h1.out, sizeof(double) * (size_t)h, sent);
        exec_ep_rows_bytes(g, me, &h2.out, sizeof(double) * (size_t)h, sent);
    }
    p1 = alloc0((size_t)h1.n_in * h, sizeof(double));
    p2 = alloc0((size_t)h2.n_in * h, sizeof(double));
    if (!p1 || !p2 || !out) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done;
    }
    for (int i = 0; i < h1.n_in; i++)
        slots_forward(g, me, w, &h1.meta[i], h1.payload + (size_t)i * h, p1 + (size_t)i * h, out);
    for (int i = 0; i < h2.n_in; i++)
        slots_forward(g, me, w, &h2.meta[i], h2.payload + (size_t)i * h, p2 + (size_t)i * h, out);
    memset(y, 0, sizeof *y * (size_t)tokens * h);
    if ((st = hop_return(t, &h2, p2, h, p1, err)) != MOE_OK) goto done;
    if ((st = hop_return(t, &h1, p1, h, y, err)) != MOE_OK) goto done;
    for (int i = 0; i < tokens && w->shared_ffn; i++) {
        exec_ref_expert_forward(w, -1, x + (size_t)i * h, out);
        for (int c = 0; c < h; c++) y[(size_t)i * h + c] += out[c];
    }
done:
    hop_free(&h1);
    hop_free(&h2);
    free(p1);
    free(p2);
    free(out);
    return st;
}

/* The backward of the slots of m computed here, from row [x, dy]: into back [dx, dw (top_k)]. */
static void slots_backward(const struct exec_ep_group *g, int me, const struct exec_ref_moe *w,
                           const struct exec_ep_meta *m, const double *xdy, double *back,
                           struct exec_ref_moe_grad *gr, double *out, double *dout)
{
    int h = w->hidden;
    const double *x = xdy, *dy = xdy + h;
    for (int j = 0; j < g->top_k; j++) {
        if (!exec_ep_slot_here(g, me, m, j)) continue;
        exec_ref_expert_forward(w, m->expert[j], x, out);
        double dw = 0.0;
        for (int c = 0; c < h; c++) {
            dw += dy[c] * out[c];
            dout[c] = m->weight[j] * dy[c];
        }
        back[h + j] += dw;
        exec_ref_expert_backward(w, m->expert[j], x, dout, gr, back);
    }
}

enum moe_status exec_ref_ep_moe_backward(struct exec_transport *t, const struct exec_ep_group *g,
                                         const struct exec_ref_moe *w, const double *x, int tokens,
                                         const double *dy, double *dx, struct exec_ref_moe_grad *gr,
                                         struct moe_error *err)
{
    enum moe_status st = check(t, g, w, err);
    if (st != MOE_OK) return st;
    int h = w->hidden, k = g->top_k, me = t->rank, wide = h + k;
    struct hop h1 = {0}, h2 = {0};
    double *xdy = alloc0((size_t)tokens * 2 * h, sizeof(double));
    double *tmp = alloc0((size_t)2 * h, sizeof(double)), *res = NULL, *b1 = NULL, *b2 = NULL;
    double *frac = NULL;
    if (!xdy || !tmp) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done;
    }
    for (int i = 0; i < tokens; i++) {
        memcpy(xdy + (size_t)i * 2 * h, x + (size_t)i * h, sizeof(double) * (size_t)h);
        memcpy(xdy + (size_t)i * 2 * h + h, dy + (size_t)i * h, sizeof(double) * (size_t)h);
    }
    st = dispatch(t, g, w, x, tokens, xdy, 2 * h, &h1, &h2, err);
    if (st != MOE_OK) goto done;
    b1 = alloc0((size_t)h1.n_in * wide, sizeof(double));
    b2 = alloc0((size_t)h2.n_in * wide, sizeof(double));
    res = alloc0((size_t)tokens * wide, sizeof(double)); /* per token: [dx, dw] */
    frac = w->cfg.aux_coef != 0.0 ? alloc0((size_t)w->cfg.experts, sizeof(double)) : NULL;
    if (!b1 || !b2 || !res || (w->cfg.aux_coef != 0.0 && !frac)) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done;
    }
    for (int i = 0; i < h1.n_in; i++)
        slots_backward(g, me, w, &h1.meta[i], h1.payload + (size_t)i * 2 * h, b1 + (size_t)i * wide,
                       gr, tmp, tmp + h);
    for (int i = 0; i < h2.n_in; i++)
        slots_backward(g, me, w, &h2.meta[i], h2.payload + (size_t)i * 2 * h, b2 + (size_t)i * wide,
                       gr, tmp, tmp + h);
    if ((st = hop_return(t, &h2, b2, wide, b1, err)) != MOE_OK) goto done;
    if ((st = hop_return(t, &h1, b1, wide, res, err)) != MOE_OK) goto done;
    if (frac) exec_ref_moe_route_fractions(w, x, tokens, frac);
    for (int i = 0; i < tokens; i++) {
        const double *xt = x + (size_t)i * h;
        double *dxt = dx + (size_t)i * h, *r = res + (size_t)i * wide;
        memcpy(dxt, r, sizeof(double) * (size_t)h);
        if (w->shared_ffn) exec_ref_expert_backward(w, -1, xt, dy + (size_t)i * h, gr, dxt);
        exec_ref_router_backward(w, xt, r + h, frac, tokens, dxt, gr);
    }
done:
    hop_free(&h1);
    hop_free(&h2);
    free(xdy);
    free(tmp);
    free(res);
    free(b1);
    free(b2);
    free(frac);
    return st;
}
