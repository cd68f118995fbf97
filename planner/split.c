/*
 * split.c: the layer-to-stage split of a pipeline, as a GLPK MILP.
 *
 *   b[l,s] in {0,1}: block l in virtual stage s;  sum_s b[l,s] = 1;  t_l = sum_s s b[l,s]
 *   t_0 = 0, t_{L-1} = S - 1, 0 <= t_{l+1} - t_l <= 1   (contiguous, every stage non-empty)
 *   rank r's time: sum over its stages s = r, r + pp, ... of sum_l w_l b[l,s] (+ the embedding on
 *   stage 0, the LM head and loss on stage S - 1) <= z;  minimize z
 * Interleaving puts stage s on pp rank s % pp, so the busiest rank, not the slowest stage, sets
 * the pace. Warm start: the even split.
 */
#include "mip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double busiest(const int *count, const double *w, int stages, int pp, double a, double b)
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
    double m = 0;
    for (int r = 0; r < pp; r++) m = fmax(m, rank[r]);
    return m;
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
    for (int j = 0; j < nb; j++) mip_col(p, j, MIP_BINARY, 0, 1, 0);
    mip_col(p, iz, MIP_CONTINUOUS, 0, HUGE_VAL, 1.0);
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
        for (int i = 0; i < even[s]; i++) warm[(l++) * S + s] = 1.0;
    warm[iz] = r.even_busiest_us;
    mip_warm_start(p, warm);
    st = mip_solve(p, time_limit_s, &r.mip, x, err);
    if (st == MOE_ERR_GLPK) { /* nothing in time: the even split stands */
        memcpy(r.stage_layers, even, sizeof(int) * (size_t)S);
        r.busiest_us = r.even_busiest_us;
        snprintf(r.mip.status, sizeof r.mip.status, "no solution in time: even split kept");
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
    if (r.busiest_us > r.even_busiest_us) { /* keep the better of the two */
        memcpy(r.stage_layers, even, sizeof(int) * (size_t)S);
        r.busiest_us = r.even_busiest_us;
    }
    *out = r;
cleanup:
    mip_destroy(p);
    free(x);
    free(warm);
    return st;
}
