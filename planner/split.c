/*
 * split.c: the layer-to-stage split of a pipeline, as a GLPK MILP.
 *
 *   b[l,s] in {0,1}: block l in virtual stage s;  sum_s b[l,s] = 1;  t_l = sum_s s b[l,s]
 *   t_0 = 0, t_{L-1} = S - 1, 0 <= t_{l+1} - t_l <= 1   (contiguous, every stage non-empty)
 *   rank r's time: sum over its stages s = r, r + pp, ... of sum_l w_l b[l,s] (+ the embedding on
 *   stage 0, the LM head and loss on stage S - 1) <= z;  minimize z
 * Interleaving puts stage s on pp rank s % pp, so the busiest rank, not the slowest stage, sets
 * the pace. Warm start: the even split improved by local search.
 *
 * The LP relaxation alone bounds z only by the mean rank (fractional blocks), which leaves
 * GLPK a gap it cannot close in time on deep pipelines; so the solve also knows what every
 * integer split must pay: of the k heaviest blocks some rank holds at least ceil(k / pp), so at
 * least the lightest ceil(k / pp) of them (for every k); rank 0 holds S / pp stages and the
 * embedding, the last stage's rank S / pp stages and the LM head. A warm start that meets this
 * bound is optimal without GLPK; otherwise GLPK stops once its split is within PLAN_SPLIT_GAP of
 * it. (The bound is the solve's, not a bound on z's column: as a column bound it left GLPK's
 * simplex numerically infeasible on blocks 10^5 apart.) Whatever GLPK does, a contiguous split
 * always exists: where it fails, the warm start stands.
 */
#include "mip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The busiest pp rank's time under `count` blocks a stage; *spread (may be NULL) gets the sum
 * of the squared rank times, local_search's tie-break that lets a move off the busiest rank
 * count. */
static double busiest_spread(const int *count, const double *w, int stages, int pp, double a,
                             double b, double *spread)
{
    double rank[COST_MAX_STAGES] = {0};
    int l = 0;
    for (int s = 0; s < stages; s++) {
        double t = 0;
        for (int i = 0; i < count[s]; i++) t += w[l++];
        if (s == 0) t += a;
        if (s == stages - 1) t += b;
        rank[s % pp] += t;
    }
    double m = 0, q = 0;
    for (int r = 0; r < pp; r++) m = fmax(m, rank[r]), q += rank[r] * rank[r];
    if (spread) *spread = q;
    return m;
}

static double busiest(const int *count, const double *w, int stages, int pp, double a, double b)
{
    return busiest_spread(count, w, stages, pp, a, b, NULL);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The lower bound above on the busiest rank; sorted: scratch of `layers` doubles. */
static double integer_bound(const double *w, int layers, int stages, int pp, double a, double b,
                            double *sorted)
{
    memcpy(sorted, w, sizeof *sorted * (size_t)layers);
    qsort(sorted, (size_t)layers, sizeof *sorted, by_value);
    /* of the k heaviest blocks some rank holds ceil(k / pp), at least the lightest that many */
    double bound = 0;
    for (int k = 1; k <= layers; k++) {
        double t = 0;
        for (int i = 0; i < (k + pp - 1) / pp; i++) t += sorted[layers - k + i];
        bound = fmax(bound, t);
    }
    /* the ends: rank 0 holds c0 blocks and the embedding, the last stage's rank cl blocks and the
     * head (one rank where pp = 1), each rank at least S / pp blocks, the other pp - 2 ranks the
     * rest, one of them at least its share; whatever c0 and cl, the busiest pays the most of these */
    for (int i = 1; i < layers; i++) sorted[i] += sorted[i - 1]; /* the lightest i + 1 */
#define light(n) ((n) ? sorted[(n)-1] : 0.0)
    int per = stages / pp;
    if (pp == 1) return fmax(bound, light(layers) + a + b);
    double ends = HUGE_VAL;
    for (int c0 = per; c0 <= layers; c0++)
        for (int cl = per; c0 + cl + (pp - 2) * per <= layers; cl++) {
            int rest = layers - c0 - cl;
            if (pp == 2 && rest) continue;
            double mid = pp > 2 ? light((rest + pp - 3) / (pp - 2)) : 0;
            ends = fmin(ends, fmax(fmax(a + light(c0), b + light(cl)), mid));
        }
#undef light
    return fmax(bound, ends);
}

/* The MILP's warm start: from the even split, move one block from a stage to another (the stages
 * between keep their counts and shift by one block) while that lowers the busiest rank (or, at
 * the same busiest rank, the spread), every stage kept non-empty. Moving the LM head's rank's
 * blocks to the others this way is what GLPK's branching finds slowly; where the result meets
 * the integer bound, no MILP is needed. */
static void local_search(int *count, const double *w, int stages, int pp, double a, double b)
{
    double q, best = busiest_spread(count, w, stages, pp, a, b, &q);
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < stages; s++)
            for (int t = 0; t < stages && count[s] > 1; t++) {
                if (t == s) continue;
                count[s]--, count[t]++;
                double sq, m = busiest_spread(count, w, stages, pp, a, b, &sq);
                if (m < best * (1 - 1e-12) || (m <= best * (1 + 1e-12) && sq < q * (1 - 1e-12)))
                    best = m, q = sq, moved = true;
                else
                    count[s]++, count[t]--;
            }
    }
}

enum moe_status plan_split_stages(const double *layer_us, int layers, int stages, int pp,
                                  double first_extra_us, double last_extra_us, double time_limit_s,
                                  struct plan_split *out, struct moe_error *err)
{
    if (stages < 1 || stages > COST_MAX_STAGES || pp < 1 || stages % pp != 0 || layers < stages)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "%d layers cannot be split into %d stages over pp %d", layers, stages,
                             pp);
    struct plan_split r;
    memset(&r, 0, sizeof r);
    int even[COST_MAX_STAGES];
    cost_even_split(layers, stages, even);
    r.even_busiest_us = busiest(even, layer_us, stages, pp, first_extra_us, last_extra_us);
    if (stages == 1) {
        r.stage_layers[0] = layers;
        r.busiest_us = r.even_busiest_us;
        snprintf(r.mip.status, sizeof r.mip.status, "one stage");
        r.mip.optimal = true;
        *out = r;
        return MOE_OK;
    }
    int L = layers, S = stages, nb = L * S, iz = nb;
    int rows = L + (L - 1) + 2 + pp;
    struct mip *p = mip_create(nb + 1, rows);
    double *x = calloc((size_t)nb + 1, sizeof *x), *warm = calloc((size_t)nb + 1, sizeof *warm);
    enum moe_status st = MOE_OK;
    if (!p || !x || !warm) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "split: out of memory");
        goto cleanup;
    }
    /* the warm start first: where it meets the bound, no MILP is built (x: the sort's scratch
     * before the solve fills it) */
    double bound = integer_bound(layer_us, L, S, pp, first_extra_us, last_extra_us, x);
    int start[COST_MAX_STAGES];
    memcpy(start, even, sizeof(int) * (size_t)S);
    local_search(start, layer_us, S, pp, first_extra_us, last_extra_us);
    memcpy(r.stage_layers, start, sizeof(int) * (size_t)S);
    r.busiest_us = busiest(start, layer_us, S, pp, first_extra_us, last_extra_us);
    if (r.busiest_us <= bound * (1.0 + 1e-6)) { /* proven without GLPK */
        snprintf(r.mip.status, sizeof r.mip.status, "optimal: meets the lower bound");
        r.mip.optimal = true;
        r.mip.objective = r.busiest_us;
        *out = r;
        goto cleanup;
    }
    for (int j = 0; j < nb; j++) mip_col(p, j, MIP_BINARY, 0, 1, 0);
    mip_col(p, iz, MIP_CONTINUOUS, 0, HUGE_VAL, 1.0);
    mip_known_bound(p, bound);
    int row = 0;
    for (int l = 0; l < L; l++, row++) {
        mip_row(p, row, 1, 1);
        for (int s = 0; s < S && st == MOE_OK; s++) st = mip_coef(p, row, l * S + s, 1, err);
    }
    for (int l = 0; l + 1 < L; l++, row++) { /* 0 <= t_{l+1} - t_l <= 1 */
        mip_row(p, row, 0, 1);
        for (int s = 1; s < S && st == MOE_OK; s++) {
            st = mip_coef(p, row, (l + 1) * S + s, s, err);
            if (st == MOE_OK) st = mip_coef(p, row, l * S + s, -s, err);
        }
    }
    mip_row(p, row, 1, 1); /* the first block opens stage 0 */
    if (st == MOE_OK) st = mip_coef(p, row++, 0 * S + 0, 1, err);
    mip_row(p, row, 1, 1); /* the last block closes the last stage */
    if (st == MOE_OK) st = mip_coef(p, row++, (L - 1) * S + (S - 1), 1, err);
    for (int rk = 0; rk < pp; rk++, row++) {
        double extra = (rk == 0 ? first_extra_us : 0) + ((S - 1) % pp == rk ? last_extra_us : 0);
        mip_row(p, row, -HUGE_VAL, -extra);
        for (int s = rk; s < S && st == MOE_OK; s += pp)
            for (int l = 0; l < L && st == MOE_OK; l++)
                st = mip_coef(p, row, l * S + s, layer_us[l], err);
        if (st == MOE_OK) st = mip_coef(p, row, iz, -1, err);
    }
    if (st != MOE_OK) goto cleanup;
    for (int s = 0, l = 0; s < S; s++)
        for (int i = 0; i < start[s]; i++) warm[(l++) * S + s] = 1.0;
    warm[iz] = r.busiest_us;
    mip_warm_start(p, warm);
    st = mip_solve(p, time_limit_s, PLAN_SPLIT_GAP, &r.mip, x, err);
    if (st != MOE_OK && st != MOE_ERR_NOMEM) { /* nothing in time, or GLPK failed: the warm
                                                * start stands */
        /* (a contiguous split always exists: GLPK's "infeasible" here is numerical trouble) */
        snprintf(r.mip.status, sizeof r.mip.status, "%s: warm start kept",
                 strcmp(r.mip.status, "no solution") ? "GLPK failed" : "no solution in time");
        r.mip.optimal = false;
        r.mip.gap = bound > 0 ? warm[iz] / bound - 1.0 : HUGE_VAL;
        st = MOE_OK;
        *out = r;
        goto cleanup;
    }
    if (st != MOE_OK) goto cleanup;
    for (int s = 0; s < S; s++) {
        r.stage_layers[s] = 0;
        for (int l = 0; l < L; l++) r.stage_layers[s] += x[l * S + s] > 0.5;
    }
    r.busiest_us = busiest(r.stage_layers, layer_us, S, pp, first_extra_us, last_extra_us);
    if (r.busiest_us > warm[iz]) { /* keep the better of the two */
        memcpy(r.stage_layers, start, sizeof(int) * (size_t)S);
        r.busiest_us = warm[iz];
    }
    *out = r;
cleanup:
    mip_destroy(p);
    free(x);
    free(warm);
    return st;
}
