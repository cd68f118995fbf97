/*
 * ref_pp.c: the reference's pipeline-parallel step. Virtual stage v (of S ranks x vpp chunks)
 * holds blocks [first[v], first[v + 1]) and lives on rank v % S; the first also holds the
 * embedding, the last the head and the loss. M micro-batches go through in the 1F1B order (rank s
 * runs S - 1 - s forwards first, then alternates one forward and one backward, then drains its
 * backwards), or Megatron's interleaved 1F1B when vpp > 1, in rounds: in each,
 * every stage runs its next operation if its input has arrived, then one exchange carries the
 * activations forward and the gradients back. Every rank derives the same round table from
 * (S, M), so the exchanges match without asking. The backward of a slice recomputes its forward
 * from the stage's saved input (exec_ref_model_slice), so the result is the one-rank step's up to
 * the order of the sums over micro-batches.
 */
#include "exec_dist.h"

#include <stdlib.h>
#include <string.h>

#define PP_MAX_STAGES EXEC_PP_MAX_STAGES

/* Rank s's operations in order. vpp = 1: 1F1B (S - 1 - s forwards first). vpp > 1: Megatron's
 * interleaved 1F1B over the rank's chunks (virtual stages s, s + S, ...): forward k runs chunk
 * (k / S) % vpp of micro-batch (k / (S vpp)) S + k % S, backward k the chunks in reverse; the
 * warm-up is (S - s - 1) 2 + (vpp - 1) S forwards. */
static int pp_list(int S, int vpp, int M, int s, struct exec_pp_op *l)
{
    int n = 0, total = M * vpp;
    int w = vpp == 1 ? S - 1 - s : (S - s - 1) * 2 + (vpp - 1) * S;
    if (w > total) w = total;
    for (int i = 0; i < w; i++) {
        int c = (i / S) % vpp;
        l[n++] = (struct exec_pp_op){'F', (i / (S * vpp)) * S + i % S, c * S + s};
    }
    for (int j = 0; j < total; j++) {
        int i = w + j;
        if (i < total) {
            int c = (i / S) % vpp;
            l[n++] = (struct exec_pp_op){'F', (i / (S * vpp)) * S + i % S, c * S + s};
        }
        int c = vpp - 1 - (j / S) % vpp;
        l[n++] = (struct exec_pp_op){'B', (j / (S * vpp)) * S + j % S, c * S + s};
    }
    return n;
}

int exec_pp_rounds(int S, int vpp, int M, struct exec_pp_op **table)
{
    int V = S * vpp, per = 2 * M * vpp, cap = 4 * per * S + 4 * S;
    struct exec_pp_op *list = calloc((size_t)S * per, sizeof *list);
    struct exec_pp_op *t = calloc((size_t)cap * S, sizeof *t);
    int *next = calloc((size_t)S, sizeof(int));
    bool *act = calloc((size_t)V * M, sizeof(bool)), *grd = calloc((size_t)V * M, sizeof(bool));
    bool *fwd = calloc((size_t)V * M, sizeof(bool));
    int rounds = -1;
    if (!list || !t || !next || !act || !grd || !fwd) goto done;
    for (int s = 0; s < S; s++) pp_list(S, vpp, M, s, list + (size_t)s * per);
    for (rounds = 0;; rounds++) {
        bool left = false;
        for (int s = 0; s < S; s++) left |= next[s] < per;
        if (!left) break;
        if (rounds == cap) {
            rounds = -1;
            goto done;
        }
        struct exec_pp_op *row = t + (size_t)rounds * S;
        for (int s = 0; s < S; s++) {
            if (next[s] == per) continue;
            struct exec_pp_op op = list[(size_t)s * per + next[s]];
            size_t at = (size_t)op.v * M + op.mb;
            bool ready =
                op.kind == 'F' ? op.v == 0 || act[at] : (op.v == V - 1 ? fwd[at] : grd[at]);
            if (ready) row[s] = op;
        }
        for (int s = 0; s < S; s++) {
            struct exec_pp_op op = row[s];
            if (!op.kind) continue;
            next[s]++;
            if (op.kind == 'F') {
                fwd[(size_t)op.v * M + op.mb] = true;
                if (op.v + 1 < V) act[(size_t)(op.v + 1) * M + op.mb] = true;
            } else if (op.v > 0) {
                grd[(size_t)(op.v - 1) * M + op.mb] = true;
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

int exec_pp_round_io(const struct exec_pp_op *row, int S, int V, int me, int items, int *send,
                     int *recv, struct exec_pp_op *arriving)
{
    int nin = 0;
    for (int q = 0; q < S; q++) send[q] = recv[q] = 0;
    const struct exec_pp_op *op = &row[me];
    if (op->kind == 'F' && op->v + 1 < V) send[(op->v + 1) % S] = items;
    if (op->kind == 'B' && op->v > 0) send[(op->v - 1) % S] = items;
    for (int q = 0; q < S; q++) {
        const struct exec_pp_op *o = &row[q];
        if (!o->kind) continue;
        int to = o->kind == 'F' ? o->v + 1 : o->v - 1;
        if (to < 0 || to >= V || to % S != me) continue;
        recv[q] = items;
        arriving[nin++] = (struct exec_pp_op){o->kind, o->mb, to};
    }
    return nin;
}

enum moe_status exec_ref_pipeline_step(struct exec_transport *t, const struct exec_ref_model *r,
                                       const int *first, int vpp, const int *tokens, int M, int T,
                                       double *loss, double *grad, struct moe_error *err)
{
    int S = t->ranks, me = t->rank, h = r->model.hidden, n = T - 1, V = S * vpp;
    if (M < 1 || vpp < 1 || S > PP_MAX_STAGES || first[0] != 0 || first[V] != r->model.layers ||
        (vpp > 1 && M % S))
        return moe_error_set(
            err, MOE_ERR_INPUT,
            "pipeline: %d micro-batches (a multiple of the %d ranks when "
            "interleaved), %d x %d virtual stages (at most %d ranks) from block %d "
            "to %d of %d",
            M, S, S, vpp, PP_MAX_STAGES, first[0], first[V], r->model.layers);
    for (int v = 0; v < V; v++)
        if (first[v + 1] <= first[v])
            return moe_error_set(err, MOE_ERR_INPUT, "pipeline: virtual stage %d has no blocks", v);
    size_t th = (size_t)n * h;
    struct exec_pp_op *table = NULL;
    int rounds = exec_pp_rounds(S, vpp, M, &table);
    /* per (chunk, micro-batch) of this rank: its input, and the gradient of its output */
    double *act = calloc((size_t)vpp * M * th, sizeof *act);
    double *dgo = calloc((size_t)vpp * M * th, sizeof *dgo);
    double *out = calloc(th, sizeof *out), *in = calloc(2 * th, sizeof *in);
    double *tmp = calloc(r->nparams, sizeof *tmp);
    enum moe_status st = MOE_OK;
    if (rounds < 0 || !act || !dgo || !out || !in || !tmp) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "pipeline: out of memory");
        goto done;
    }
    memset(grad, 0, sizeof *grad * r->nparams);
    *loss = 0.0;
    for (int k = 0; k < rounds && st == MOE_OK; k++) {
        const struct exec_pp_op *row = table + (size_t)k * S, op = row[me];
        int send[PP_MAX_STAGES] = {0}, recv[PP_MAX_STAGES] = {0};
        if (op.kind) {
            const int *tok = tokens + (size_t)op.mb * T;
            int lo = first[op.v], hi = first[op.v + 1];
            size_t slot = ((size_t)(op.v / S) * M + op.mb) * th;
            const double *h_in = op.v > 0 ? act + slot : NULL;
            double l = 0.0;
            if (op.kind == 'F') {
                st = exec_ref_model_slice(r, NULL, tok, T, lo, hi, h_in, op.v + 1 < V ? out : NULL,
                                          NULL, NULL, &l, NULL, NULL, err);
                if (op.v + 1 == V) *loss += l / M;
            } else {
                st = exec_ref_model_slice(r, NULL, tok, T, lo, hi, h_in, NULL,
                                          op.v + 1 < V ? dgo + slot : NULL, op.v > 0 ? out : NULL,
                                          &l, NULL, tmp, err);
                for (size_t i = 0; st == MOE_OK && i < r->nparams; i++) grad[i] += tmp[i] / M;
            }
        }
        if (st != MOE_OK) break; /* the peers fail at this round's exchange */
        struct exec_pp_op arriving[2];
        int nin = exec_pp_round_io(row, S, V, me, (int)th, send, recv, arriving);
        st = t->ops->alltoallv(t, out, send, in, recv, sizeof(double), err);
        for (int i = 0; st == MOE_OK && i < nin; i++) { /* in rank order */
            const struct exec_pp_op *o = &arriving[i];
            size_t slot = ((size_t)(o->v / S) * M + o->mb) * th;
            memcpy((o->kind == 'F' ? act : dgo) + slot, in + (size_t)i * th, sizeof *in * th);
        }
    }
done:
    free(table), free(act), free(dgo), free(out), free(in), free(tmp);
    return st;
}
