/*
 * pipeline.c: event-driven simulation of 1F1B and interleaved 1F1B pipeline schedules.
 *
 * Each pipeline rank runs its fixed list of forward and backward operations in Megatron's order
 * (warm-up forwards, one-forward-one-backward, cool-down backwards; with vpp > 1 the model chunks
 * interleave). An operation starts when its rank is free and its input has arrived: the previous
 * virtual stage's forward (or the next one's backward) plus the point-to-point time. Uneven stages
 * (embedding on the first, LM head and loss on the last) come in as uneven times. The closed form
 * (p-1)/(m+p-1) is what this yields for equal stages; the simulation also gives the in-flight
 * micro-batches each rank holds, which sets activation memory.
 */
#include "cost.h"

#include <stdlib.h>
#include <string.h>

struct op {
    bool backward;
    int chunk, mb;
};

/* The k-th forward (or backward) of a rank: which chunk and micro-batch (Megatron's mapping). */
static struct op op_of(int k, bool backward, int pp, int vpp)
{
    struct op o;
    o.backward = backward;
    int group = pp * vpp;
    o.chunk = (k / pp) % vpp;
    if (backward) o.chunk = vpp - 1 - o.chunk;
    o.mb = (k / group) * pp + k % pp;
    return o;
}

enum moe_status cost_pipeline_simulate(int pp, int vpp, int micro_batches, const double *fwd_us,
                                       const double *bwd_us, double p2p_us,
                                       struct cost_pipe_result *out, struct moe_error *err)
{
    if (pp < 1 || pp > COST_MAX_PP || vpp < 1 || micro_batches < 1)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "pipeline: pp %d (1..64), vpp %d, %d micro-batches", pp, vpp,
                             micro_batches);
    if (vpp > 1 && micro_batches % pp != 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "interleaved pipeline: %d micro-batches are not a multiple of pp %d",
                             micro_batches, pp);
    int m = micro_batches, nvs = pp * vpp, per_rank = m * vpp;
    size_t cells = (size_t)nvs * (size_t)m;
    double *fin_f = malloc(cells * sizeof *fin_f), *fin_b = malloc(cells * sizeof *fin_b);
    if (!fin_f || !fin_b) {
        free(fin_f);
        free(fin_b);
        return moe_error_set(err, MOE_ERR_NOMEM, "pipeline: out of memory");
    }
    for (size_t i = 0; i < cells; i++) fin_f[i] = fin_b[i] = -1.0;
    int next[COST_MAX_PP], nf[COST_MAX_PP], nb[COST_MAX_PP], in_flight[COST_MAX_PP];
    double free_at[COST_MAX_PP];
    struct cost_pipe_result r;
    memset(&r, 0, sizeof r);
    for (int s = 0; s < pp; s++) next[s] = nf[s] = nb[s] = in_flight[s] = 0, free_at[s] = 0.0;
    int total_ops = 2 * per_rank, done = 0;
    while (done < pp * total_ops) {
        bool progress = false;
        for (int s = 0; s < pp; s++) {
            for (;;) {
                if (next[s] >= total_ops) break;
                int warm = vpp == 1 ? pp - s - 1 : (pp - s - 1) * 2 + (vpp - 1) * pp;
                if (warm > per_rank) warm = per_rank;
                /* The position in the list decides forward or backward. */
                int i = next[s];
                bool backward;
                if (i < warm)
                    backward = false;
                else if (i >= warm + 2 * (per_rank - warm))
                    backward = true;
                else
                    backward = ((i - warm) % 2) == 1;
                struct op o = op_of(backward ? nb[s] : nf[s], backward, pp, vpp);
                int vs = o.chunk * pp + s;
                double ready = 0.0;
                if (!backward && vs > 0) {
                    double d = fin_f[(size_t)(vs - 1) * m + o.mb];
                    if (d < 0) break;
                    ready = d + p2p_us;
                } else if (backward) {
                    if (fin_f[(size_t)vs * m + o.mb] < 0) break;
                    ready = fin_f[(size_t)vs * m + o.mb];
                    if (vs < nvs - 1) {
                        double d = fin_b[(size_t)(vs + 1) * m + o.mb];
                        if (d < 0) break;
                        ready = d + p2p_us;
                    }
                }
                double start = free_at[s] > ready ? free_at[s] : ready;
                double dur = backward ? bwd_us[vs] : fwd_us[vs];
                free_at[s] = start + dur;
                r.busy_us[s] += dur;
                if (backward) {
                    fin_b[(size_t)vs * m + o.mb] = free_at[s];
                    nb[s]++;
                    in_flight[s]--;
                } else {
                    fin_f[(size_t)vs * m + o.mb] = free_at[s];
                    nf[s]++;
                    if (++in_flight[s] > r.max_in_flight[s]) r.max_in_flight[s] = in_flight[s];
                }
                next[s]++;
                done++;
                progress = true;
            }
        }
        if (!progress) {
            free(fin_f);
            free(fin_b);
            return moe_error_set(err, MOE_ERR_RUNTIME,
                                 "pipeline schedule deadlocked (pp %d, vpp %d, m %d)", pp, vpp, m);
        }
    }
    double busiest = 0.0;
    for (int s = 0; s < pp; s++) {
        if (free_at[s] > r.makespan_us) r.makespan_us = free_at[s];
        if (r.busy_us[s] > busiest) busiest = r.busy_us[s];
    }
    r.bubble_fraction = r.makespan_us > 0 ? 1.0 - busiest / r.makespan_us : 0.0;
    free(fin_f);
    free(fin_b);
    *out = r;
    return MOE_OK;
}
