/*
 * ep.c: the token exchange of expert parallelism, as rows and their metadata (no payload).
 *
 * A rank's tokens reach the ranks holding their experts in one or two hops, by the plan's dedup
 * mode (planner: cost_dispatcher):
 *   alltoall    a row per (token, slot): a token bound for two experts of one rank goes twice;
 *   per GPU     a row per (token, destination rank), carrying every slot bound there;
 *   per domain  per GPU inside the sender's NVLink domain; a row per (token, remote domain) to
 *               the rank of the sender's index there (the landing rank), which forwards it over
 *               NVLink to the other ranks of its domain that hold some of its slots (hop 2).
 * The combine walks the same rows backwards, each rank summing what its slots made before it
 * sends a row back, so a row crosses each link once each way. Rows are grouped by destination
 * in rank order and, inside that, by the sender's row order: the exchange is deterministic, and
 * the bytes it moves are exactly what the planner's cost_dispatch_bytes_exact predicts.
 * Everything here is host code on routing decisions only, shared by the reference (ref_ep.c)
 * and the GPU executor.
 */
#include "exec_dist.h"

#include <stdlib.h>
#include <string.h>

enum moe_status exec_ep_group_check(const struct exec_ep_group *g, struct moe_error *err)
{
    if (g->ranks < 1 || g->experts < 1 || g->top_k < 1 || g->top_k > EXEC_EP_MAX_K ||
        g->top_k > g->experts)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "expert parallelism: %d ranks, %d experts, top_k %d (at most %d)",
                             g->ranks, g->experts, g->top_k, EXEC_EP_MAX_K);
    for (int e = 0; e < g->experts; e++)
        if (g->placement[e] < 0 || g->placement[e] >= g->ranks)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "expert parallelism: expert %d placed on rank %d of %d", e,
                                 g->placement[e], g->ranks);
    int size = 0;
    for (int r = 0; r < g->ranks; r++) {
        bool starts = r == 0 || g->domain[r] != g->domain[r - 1];
        for (int q = 0; starts && q < r; q++)
            if (g->domain[q] == g->domain[r])
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "expert parallelism: the ranks of NVLink domain %d are not "
                                     "contiguous (rank %d)",
                                     g->domain[r], r);
        if (starts && r > 0 && size == 0) size = r;
        if (starts && r > 0 && r % size)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "expert parallelism: NVLink domains of unequal size (rank %d)", r);
    }
    if (size && g->ranks % size)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "expert parallelism: NVLink domains of unequal size (%d ranks, %d a "
                             "domain)",
                             g->ranks, size);
    return MOE_OK;
}

void exec_ep_rows_free(struct exec_ep_rows *r)
{
    if (!r) return;
    free(r->count);
    free(r->src_row);
    free(r->meta);
    memset(r, 0, sizeof *r);
}

bool exec_ep_slot_here(const struct exec_ep_group *g, int me, const struct exec_ep_meta *m, int j)
{
    return m->expert[j] >= 0 && g->placement[m->expert[j]] == me;
}

/* Rows collected in the sender's order, with their destinations; then grouped by destination. */
struct pending {
    int n, cap;
    int *dst, *src_row;
    struct exec_ep_meta *meta;
};

static bool pending_add(struct pending *p, int dst, int src_row, const struct exec_ep_meta *m)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        int *d = realloc(p->dst, sizeof *d * (size_t)cap);
        if (d) p->dst = d;
        int *s = realloc(p->src_row, sizeof *s * (size_t)cap);
        if (s) p->src_row = s;
        struct exec_ep_meta *mm = realloc(p->meta, sizeof *mm * (size_t)cap);
        if (mm) p->meta = mm;
        if (!d || !s || !mm) return false;
        p->cap = cap;
    }
    p->dst[p->n] = dst;
    p->src_row[p->n] = src_row;
    p->meta[p->n] = *m;
    p->n++;
    return true;
}

static void pending_free(struct pending *p)
{
    free(p->dst);
    free(p->src_row);
    free(p->meta);
}

/* A stable counting sort of the pending rows by destination into out (which it owns then). */
static enum moe_status pending_group(struct pending *p, int ranks, struct exec_ep_rows *out,
                                     struct moe_error *err)
{
    struct exec_ep_rows r = {ranks, p->n, calloc((size_t)ranks, sizeof(int)),
                             malloc(sizeof(int) * (size_t)(p->n ? p->n : 1)),
                             malloc(sizeof(struct exec_ep_meta) * (size_t)(p->n ? p->n : 1))};
    int *at = calloc((size_t)ranks + 1, sizeof(int));
    if (!r.count || !r.src_row || !r.meta || !at) {
        exec_ep_rows_free(&r);
        free(at);
        return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    }
    for (int i = 0; i < p->n; i++) r.count[p->dst[i]]++;
    for (int d = 0; d < ranks; d++) at[d + 1] = at[d] + r.count[d];
    for (int i = 0; i < p->n; i++) {
        int o = at[p->dst[i]]++;
        r.src_row[o] = p->src_row[i];
        r.meta[o] = p->meta[i];
    }
    free(at);
    *out = r;
    return MOE_OK;
}

/* The first rank of rank r's domain. */
static int domain_base(const struct exec_ep_group *g, int r)
{
    while (r > 0 && g->domain[r - 1] == g->domain[r]) r--;
    return r;
}

enum moe_status exec_ep_first_hop(const struct exec_ep_group *g, int me, const int *choice,
                                  const double *weight, int tokens, struct exec_ep_rows *out,
                                  struct moe_error *err)
{
    enum moe_status st = exec_ep_group_check(g, err);
    if (st != MOE_OK) return st;
    int k = g->top_k, mine = domain_base(g, me);
    struct pending p = {0};
    bool ok = true;
    for (int t = 0; t < tokens && ok; t++) {
        const int *ch = choice + (size_t)t * k;
        struct exec_ep_meta base = {me, t, {0}, {0}};
        for (int j = 0; j < k; j++) {
            base.expert[j] = -1;
            base.weight[j] = weight[(size_t)t * k + j];
        }
        for (int j = 0; j < k && ok; j++) {
            if (ch[j] < 0 || ch[j] >= g->experts) {
                pending_free(&p);
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "expert parallelism: token %d routed to expert %d of %d", t,
                                     ch[j], g->experts);
            }
            int d = g->placement[ch[j]];
            bool remote = g->mode == COST_DISPATCH_DEDUP_DOMAIN && g->domain[d] != g->domain[me];
            int to = remote ? domain_base(g, d) + (me - mine) : d;
            bool first = true; /* the first slot bound for this row's destination */
            for (int i = 0; i < j && g->mode != COST_DISPATCH_ALLTOALL; i++) {
                int di = g->placement[ch[i]];
                first &= remote ? g->domain[di] != g->domain[d] : di != d;
            }
            if (!first) continue;
            struct exec_ep_meta m = base;
            for (int i = j; i < k; i++) {
                int di = g->placement[ch[i]];
                bool same = g->mode == COST_DISPATCH_ALLTOALL ? i == j
                            : remote                          ? g->domain[di] == g->domain[d]
                                                              : di == d;
                if (same) m.expert[i] = ch[i];
            }
            ok = pending_add(&p, to, t, &m);
        }
    }
    st = ok ? pending_group(&p, g->ranks, out, err)
            : moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    pending_free(&p);
    return st;
}

enum moe_status exec_ep_second_hop(const struct exec_ep_group *g, int me,
                                   const struct exec_ep_meta *recv, int nrecv,
                                   struct exec_ep_rows *out, struct moe_error *err)
{
    enum moe_status st = exec_ep_group_check(g, err);
    if (st != MOE_OK) return st;
    int k = g->top_k;
    struct pending p = {0};
    bool ok = true;
    for (int i = 0; i < nrecv && ok && g->mode == COST_DISPATCH_DEDUP_DOMAIN; i++) {
        const struct exec_ep_meta *m = &recv[i];
        for (int j = 0; j < k && ok; j++) {
            if (m->expert[j] < 0) continue;
            int d = g->placement[m->expert[j]];
            bool first = d != me;
            for (int q = 0; q < j && first; q++)
                first = m->expert[q] < 0 || g->placement[m->expert[q]] != d;
            if (!first) continue;
            struct exec_ep_meta f = *m;
            for (int q = 0; q < k; q++)
                if (f.expert[q] >= 0 && g->placement[f.expert[q]] != d) f.expert[q] = -1;
            ok = pending_add(&p, d, i, &f);
        }
    }
    st = ok ? pending_group(&p, g->ranks, out, err)
            : moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    pending_free(&p);
    return st;
}

void exec_ep_rows_bytes(const struct exec_ep_group *g, int me, const struct exec_ep_rows *r,
                        double bytes_per_row, struct cost_bytes *acc)
{
    for (int d = 0; d < r->ranks; d++) {
        if (d == me) continue;
        if (g->domain[d] == g->domain[me])
            acc->nvlink += r->count[d] * bytes_per_row;
        else
            acc->scale_out += r->count[d] * bytes_per_row;
    }
}
