/*
 * ref_pp.c: the reference's pipeline-parallel step. Stage s (rank s of the transport) holds
 * blocks [first[s], first[s + 1]); the first stage also the embedding, the last the head and the
 * loss. M micro-batches go through in the 1F1B order (stage s runs S - 1 - s forwards first,
 * then alternates one forward and one backward, then drains its backwards), in rounds: in each,
 * every stage runs its next operation if its input has arrived, then one exchange carries the
 * activations forward and the gradients back. Every rank derives the same round table from
 * (S, M), so the exchanges match without asking. The backward of a slice recomputes its forward
 * from the stage's saved input (exec_ref_model_slice), so the result is the one-rank step's up to
 * the order of the sums over micro-batches.
 */
#include "exec.h"

#include <stdlib.h>
#include <string.h>

#define PP_MAX_STAGES 64

struct pp_op {
    char kind; /* 'F', 'B', or 0: idle this round */
    int mb;
};

/* The round table (rounds x S) of 1F1B for S stages and M micro-batches; returns the rounds. */
static int pp_schedule(int S, int M, struct pp_op **table)
{
    int per = 2 * M, cap = 4 * M * S + 4 * S;
    struct pp_op *list = calloc((size_t)S * per, sizeof *list);
    struct pp_op *t = calloc((size_t)cap * S, sizeof *t);
    int *next = calloc((size_t)S, sizeof(int));
    bool *act = calloc((size_t)S * M, sizeof(bool)), *grd = calloc((size_t)S * M, sizeof(bool));
    bool *fwd = calloc((size_t)S * M, sizeof(bool));
    int rounds = -1;
    if (!list || !t || !next || !act || !grd || !fwd) goto done;
    for (int s = 0; s < S; s++) {
        struct pp_op *l = list + (size_t)s * per;
        int w = S - 1 - s < M ? S - 1 - s : M, n = 0;
        for (int i = 0; i < w; i++) l[n++] = (struct pp_op){'F', i};
        for (int j = 0; j < M; j++) {
            if (w + j < M) l[n++] = (struct pp_op){'F', w + j};
            l[n++] = (struct pp_op){'B', j};
        }
    }
    for (rounds = 0;; rounds++) {
        bool left = false;
        for (int s = 0; s < S; s++) left |= next[s] < per;
        if (!left) break;
        if (rounds == cap) { /* cannot happen for 1F1B; never loop forever */
            rounds = -1;
            goto done;
        }
        struct pp_op *row = t + (size_t)rounds * S;
        for (int s = 0; s < S; s++) {
            if (next[s] == per) continue;
            struct pp_op op = list[(size_t)s * per + next[s]];
            bool ready = op.kind == 'F' ? s == 0 || act[(size_t)s * M + op.mb]
                                        : (s == S - 1 ? fwd[(size_t)s * M + op.mb]
                                                      : grd[(size_t)s * M + op.mb]);
            if (ready) row[s] = op;
        }
        for (int s = 0; s < S; s++) {
            struct pp_op op = row[s];
            if (!op.kind) continue;
            next[s]++;
            if (op.kind == 'F') {
                fwd[(size_t)s * M + op.mb] = true;
                if (s + 1 < S) act[(size_t)(s + 1) * M + op.mb] = true;
            } else if (s > 0) {
                grd[(size_t)(s - 1) * M + op.mb] = true;
            }
        }
    }
done:
    free(list), free(next), free(act), free(grd), free(fwd);
    if (rounds < 0) {
        free(t);
        t = NULL;
    }
    *table = t;
    return rounds;
}

enum moe_status exec_ref_pipeline_step(struct exec_transport *t, const struct exec_ref_model *r,
                                       const int *first, const int *tokens, int M, int T,
                                       double *loss, double *grad, struct moe_error *err)
{
    int S = t->ranks, me = t->rank, h = r->model.hidden, n = T - 1;
    if (M < 1 || S > PP_MAX_STAGES || first[0] != 0 || first[S] != r->model.layers)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "pipeline: %d micro-batches, %d stages (at most %d) from block %d to "
                             "%d of %d", M, S, PP_MAX_STAGES, first[0], first[S],
                             r->model.layers);
    for (int s = 0; s < S; s++)
        if (first[s + 1] <= first[s])
            return moe_error_set(err, MOE_ERR_INPUT, "pipeline: stage %d has no blocks", s);
    size_t th = (size_t)n * h;
    struct pp_op *table = NULL;
    int rounds = pp_schedule(S, M, &table);
    double *act = calloc((size_t)M * th, sizeof *act);   /* this stage's input, per micro-batch */
    double *dgo = calloc((size_t)M * th, sizeof *dgo);   /* the gradient of its output */
    double *out = calloc(th, sizeof *out), *in = calloc(2 * th, sizeof *in);
    double *tmp = calloc(r->nparams, sizeof *tmp);
    enum moe_status st = MOE_OK;
    if (rounds < 0 || !act || !dgo || !out || !in || !tmp) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "pipeline: out of memory");
        goto done;
    }
    memset(grad, 0, sizeof *grad * r->nparams);
    *loss = 0.0;
    int lo = first[me], hi = first[me + 1];
    for (int k = 0; k < rounds && st == MOE_OK; k++) {
        const struct pp_op *row = table + (size_t)k * S, op = row[me];
        const int *tok = tokens + (size_t)op.mb * T;
        int send[PP_MAX_STAGES] = {0}, recv[PP_MAX_STAGES] = {0};
        const double *h_in = me > 0 ? act + (size_t)op.mb * th : NULL;
        if (op.kind == 'F') {
            double l = 0.0;
            st = exec_ref_model_slice(r, NULL, tok, T, lo, hi, h_in, me + 1 < S ? out : NULL, NULL,
                                      NULL, &l, NULL, NULL, err);
            if (me + 1 == S) *loss += l / M;
            if (me + 1 < S) send[me + 1] = (int)th;
        } else if (op.kind == 'B') {
            double l;
            st = exec_ref_model_slice(r, NULL, tok, T, lo, hi, h_in, NULL,
                                      me + 1 < S ? dgo + (size_t)op.mb * th : NULL,
                                      me > 0 ? out : NULL, &l, NULL, tmp, err);
            for (size_t i = 0; st == MOE_OK && i < r->nparams; i++) grad[i] += tmp[i] / M;
            if (me > 0) send[me - 1] = (int)th;
        }
        if (st != MOE_OK) break; /* the peers fail at this round's exchange */
        if (me > 0 && row[me - 1].kind == 'F') recv[me - 1] = (int)th;
        if (me + 1 < S && row[me + 1].kind == 'B') recv[me + 1] = (int)th;
        st = t->ops->alltoallv(t, out, send, in, recv, sizeof(double), err);
        /* what came: from below an activation (first in rank order), from above a gradient */
        size_t at = 0;
        if (st == MOE_OK && me > 0 && recv[me - 1]) {
            memcpy(act + (size_t)row[me - 1].mb * th, in, sizeof *in * th);
            at = th;
        }
        if (st == MOE_OK && me + 1 < S && recv[me + 1])
            memcpy(dgo + (size_t)row[me + 1].mb * th, in + at, sizeof *in * th);
    }
done:
    free(table), free(act), free(dgo), free(out), free(in), free(tmp);
    return st;
}
