/*
 * ref_zero.c: the reference's ZeRO-1 optimizer step. Each of R data-parallel ranks keeps the
 * AdamW moments of one contiguous shard of the parameters (parameters [n r / R, n (r + 1) / R)):
 * the gradients are reduce-scattered (each rank sums its shard over the ranks, in rank order, as
 * the all-reduce does), the global norm for clipping is the all-reduced sum of the shards'
 * squares, each rank updates its shard, and the shards are all-gathered into every rank's
 * parameters. The result is the all-reduce + full AdamW step's up to the order of the norm's sum.
 */
#include "exec_dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t shard_lo(size_t n, int r, int R)
{
    return n * (size_t)r / (size_t)R;
}

enum moe_status exec_ref_zero1_step(struct exec_transport *t, struct exec_ref_model *r,
                                    const double *grad, double *m1, double *m2, int step,
                                    const struct exec_adamw *o, double *norm, struct moe_error *err)
{
    int R = t->ranks, me = t->rank;
    size_t n = r->nparams, lo = shard_lo(n, me, R), hi = shard_lo(n, me + 1, R), len = hi - lo;
    int *sc = calloc((size_t)R, sizeof(int)), *rc = calloc((size_t)R, sizeof(int));
    double *parts = calloc(len * (size_t)R + 1, sizeof(double));
    double *full = calloc(n, sizeof(double)), *copies = calloc(len * (size_t)R + 1, sizeof(double));
    enum moe_status st = MOE_OK;
    if (n / (size_t)R + 1 > 0x7fffffff) {
        st = moe_error_set(err, MOE_ERR_UNSUPPORTED,
                           "ZeRO-1: shards of %zu parameters exceed a "
                           "count's range",
                           n / (size_t)R + 1);
        goto done;
    }
    if (!sc || !rc || !parts || !full || !copies) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "ZeRO-1: out of memory");
        goto done;
    }
    for (int d = 0; d < R; d++) {
        sc[d] = (int)(shard_lo(n, d + 1, R) - shard_lo(n, d, R));
        rc[d] = (int)len;
    }
    /* reduce-scatter: every rank's slice of my shard, summed in rank order */
    if ((st = t->ops->alltoallv(t, grad, sc, parts, rc, sizeof(double), err)) != MOE_OK) goto done;
    double sq[1] = {0.0};
    for (size_t i = 0; i < len; i++) {
        double g = 0.0;
        for (int s = 0; s < R; s++) g += parts[(size_t)s * len + i];
        full[lo + i] = g;
        sq[0] += g * g;
    }
    if ((st = t->ops->allreduce_sum(t, sq, 1, err)) != MOE_OK) goto done;
    *norm = sqrt(sq[0]);
    exec_ref_adamw_range(r, full, m1, m2, lo, hi, step, o, *norm);
    /* all-gather: my shard to every rank, every shard into my parameters */
    for (int d = 0; d < R; d++) {
        memcpy(copies + (size_t)d * len, r->params + lo, sizeof(double) * len);
        sc[d] = (int)len;
        rc[d] = (int)(shard_lo(n, d + 1, R) - shard_lo(n, d, R));
    }
    st = t->ops->alltoallv(t, copies, sc, r->params, rc, sizeof(double), err);
done:
    free(sc), free(rc), free(parts), free(full), free(copies);
    return st;
}
