/*
 * placement.c: expert placement onto EP ranks: greedy, then a GLPK MILP warm-started from it.
 *
 * The MILP (per layer group):
 *   x[e,g] in {0,1}   expert e has a copy on rank g        s[e,g] in [0,1]  share of e's tokens
 *   sum_g x[e,g] >= 1 (every expert placed)                s[e,g] <= x[e,g]
 *   sum_e x[e,g] <= slots (memory per rank)                sum_g s[e,g] = 1
 *   sum_e pick[e] s[e,g] <= z (the hottest rank)
 *   w[p,d] <= sum_{g in d} x[e,g], w[p,d] <= sum_{g in d} x[f,g]  for the strongest pairs p=(e,f)
 *   minimize z + weight * sum_p coact[p] (1 - sum_d w[p,d])   (pairs split across domains)
 * With no spare slots, s = x and the shares disappear. The greedy answer (EPLB-like) is both the
 * warm start and the fallback: the MILP's answer replaces it only when its objective is lower.
 */
#include "mip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void plan_placement_free(struct plan_placement *pl)
{
    if (!pl) return;
    free(pl->share);
    pl->share = NULL;
}

int plan_placement_rank(const struct plan_placement *pl, int e)
{
    int best = 0;
    for (int g = 1; g < pl->ranks; g++)
        if (pl->share[(size_t)e * pl->ranks + g] > pl->share[(size_t)e * pl->ranks + best])
            best = g;
    return best;
}

static double load_of(const struct plan_placement_problem *pr, const double *share, int g)
{
    double l = 0.0;
    for (int e = 0; e < pr->experts; e++) l += pr->pick[e] * share[(size_t)e * pr->ranks + g];
    return l;
}

/* Co-activation of pairs split across domains: sum over pairs of c_ef (1 - overlap of their
 * domain presence). */
static double traffic_of(const struct plan_placement_problem *pr, const double *share)
{
    if (!pr->pair || pr->ranks_per_domain < 1 || pr->ranks_per_domain >= pr->ranks) return 0.0;
    int E = pr->experts, G = pr->ranks, D = (G + pr->ranks_per_domain - 1) / pr->ranks_per_domain;
    double t = 0.0;
    for (int e = 0; e < E; e++)
        for (int f = e + 1; f < E; f++) {
            double c = pr->pair[(size_t)e * E + f];
            if (c <= 0) continue;
            double together = 0.0;
            for (int d = 0; d < D; d++) {
                bool pe = false, pf = false;
                for (int g = d * pr->ranks_per_domain; g < (d + 1) * pr->ranks_per_domain && g < G;
                     g++) {
                    pe |= share[(size_t)e * G + g] > 0;
                    pf |= share[(size_t)f * G + g] > 0;
                }
                together += pe && pf;
            }
            t += c * (1.0 - (together > 1 ? 1 : together));
        }
    return t;
}

static enum moe_status check_problem(const struct plan_placement_problem *pr, struct moe_error *err)
{
    if (pr->experts < 1 || pr->ranks < 1 || pr->experts > 65536 || pr->ranks > 65536)
        return moe_error_set(err, MOE_ERR_INPUT, "placement: %d experts on %d ranks", pr->experts,
                             pr->ranks);
    if ((long)pr->slots_per_rank * pr->ranks < pr->experts)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "%d experts do not fit in %d ranks x %d slots: each rank must hold "
                             "at least %d experts",
                             pr->experts, pr->ranks, pr->slots_per_rank,
                             (pr->experts + pr->ranks - 1) / pr->ranks);
    for (int e = 0; e < pr->experts; e++)
        if (!(pr->pick[e] >= 0.0) || !isfinite(pr->pick[e]))
            return moe_error_set(err, MOE_ERR_INPUT, "placement: load of expert %d is %g", e,
                                 pr->pick[e]);
    return MOE_OK;
}

enum moe_status plan_place_greedy(const struct plan_placement_problem *pr,
                                  struct plan_placement *out, struct moe_error *err)
{
    enum moe_status st = check_problem(pr, err);
    if (st != MOE_OK) return st;
    int E = pr->experts, G = pr->ranks, slots = pr->slots_per_rank;
    int spare = slots * G - E;
    double *share = calloc((size_t)E * G, sizeof *share), *ld = calloc((size_t)G, sizeof *ld);
    int *copies = calloc((size_t)E, sizeof *copies), *order = malloc(sizeof *order * (size_t)E);
    int *used = calloc((size_t)G, sizeof *used);
    if (!share || !ld || !copies || !order || !used) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
        goto cleanup;
    }
    /* Replicas: give spare slots to the experts with the most load per copy (at most one copy
     * per rank). */
    for (int e = 0; e < E; e++) copies[e] = 1;
    for (int k = 0; k < spare; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (copies[e] < G &&
                (best < 0 || pr->pick[e] / copies[e] > pr->pick[best] / copies[best]))
                best = e;
        /* a replica only helps an expert heavier per copy than a balanced rank */
        if (best < 0 || pr->pick[best] / copies[best] <= 1e-12) break;
        copies[best]++;
    }
    for (int e = 0; e < E; e++) order[e] = e;
    for (int i = 1; i < E; i++) /* heaviest per copy first (insertion sort: stable) */
        for (int j = i; j > 0 && pr->pick[order[j]] / copies[order[j]] >
                                     pr->pick[order[j - 1]] / copies[order[j - 1]];
             j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < E; i++) {
        int e = order[i];
        double part = pr->pick[e] / copies[e];
        for (int c = 0; c < copies[e]; c++) {
            int best = -1;
            for (int g = 0; g < G; g++) {
                if (used[g] >= slots || share[(size_t)e * G + g] > 0) continue;
                if (best < 0 || ld[g] < ld[best] - 1e-15) best = g;
            }
            if (best < 0) break; /* cannot happen: enough slots were checked */
            share[(size_t)e * G + best] = 1.0 / copies[e];
            ld[best] += part;
            used[best]++;
        }
    }
    plan_placement_free(out);
    memset(out, 0, sizeof *out);
    out->experts = E;
    out->ranks = G;
    out->share = share;
    share = NULL;
    double total = 0.0;
    for (int e = 0; e < E; e++) total += pr->pick[e];
    out->balanced_load = total / G;
    for (int g = 0; g < G; g++) out->max_load = fmax(out->max_load, load_of(pr, out->share, g));
    out->traffic = traffic_of(pr, out->share);
    out->greedy_max_load = out->max_load;
    out->greedy_traffic = out->traffic;
    snprintf(out->mip.status, sizeof out->mip.status, "not run");
cleanup:
    free(share);
    free(ld);
    free(copies);
    free(order);
    free(used);
    return st;
}

/* Equal loads, no pairs, no spare slot: greedy's answer is round robin (expert e on rank e mod
 * G, each rank the next least loaded in turn), written here in O(experts) where greedy takes
 * O(experts x ranks), which is seconds at 65,536 experts. */
static enum moe_status place_round_robin(const struct plan_placement_problem *pr,
                                         struct plan_placement *out, struct moe_error *err)
{
    int E = pr->experts, G = pr->ranks;
    double *share = calloc((size_t)E * G, sizeof *share);
    if (!share) return moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
    plan_placement_free(out);
    memset(out, 0, sizeof *out);
    out->experts = E;
    out->ranks = G;
    out->share = share;
    double total = 0.0;
    for (int e = 0; e < E; e++) {
        share[(size_t)e * G + e % G] = 1.0;
        total += pr->pick[e];
    }
    out->balanced_load = total / G;
    for (int g = 0; g < G; g++) { /* load_of's sum, in its order */
        double l = 0.0;
        for (int e = g; e < E; e += G) l += pr->pick[e];
        out->max_load = fmax(out->max_load, l);
    }
    out->greedy_max_load = out->max_load;
    snprintf(out->mip.status, sizeof out->mip.status, "uniform load: greedy is optimal");
    out->mip.optimal = true;
    return MOE_OK;
}

enum moe_status plan_place_experts(const struct plan_placement_problem *pr,
                                   struct plan_placement *out, struct moe_error *err)
{
    struct plan_placement greedy;
    memset(&greedy, 0, sizeof greedy);
    enum moe_status st = check_problem(pr, err);
    if (st != MOE_OK) return st;
    int E = pr->experts, G = pr->ranks;
    /* Equal loads and no pairs: every balanced placement is optimal; greedy finds one. */
    bool equal = true;
    for (int e = 1; e < E; e++) equal &= fabs(pr->pick[e] - pr->pick[0]) < 1e-12;
    if (equal && !pr->pair && G > 1 && E % G == 0 && (long)pr->slots_per_rank * G == E)
        return place_round_robin(pr, out, err);
    st = plan_place_greedy(pr, &greedy, err);
    if (st != MOE_OK) return st;
    if (G == 1 || (equal && !pr->pair && E % G == 0)) {
        snprintf(greedy.mip.status, sizeof greedy.mip.status, "%s",
                 G == 1 ? "one rank" : "uniform load: greedy is optimal");
        greedy.mip.optimal = true;
        plan_placement_free(out);
        *out = greedy;
        return MOE_OK;
    }
    bool replicas = pr->slots_per_rank * G > E;
    int D = pr->ranks_per_domain > 0 ? (G + pr->ranks_per_domain - 1) / pr->ranks_per_domain : 1;
    /* The strongest co-activated pairs only (at most 2E), when domains matter. */
    int npairs = 0, maxp = 2 * E;
    int *pe = malloc(sizeof(int) * (size_t)maxp), *pf = malloc(sizeof(int) * (size_t)maxp);
    double *pc = malloc(sizeof(double) * (size_t)maxp);
    if (!pe || !pf || !pc) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
        goto cleanup;
    }
    if (pr->pair && D > 1 && pr->traffic_weight > 0)
        for (int e = 0; e < E; e++)
            for (int f = e + 1; f < E; f++) {
                double c = pr->pair[(size_t)e * E + f];
                if (c <= 0) continue;
                /* keep the list sorted by strength, dropping the weakest */
                int pos;
                if (npairs < maxp) {
                    pos = npairs++;
                } else {
                    if (c <= pc[maxp - 1]) continue;
                    pos = maxp - 1;
                }
                while (pos > 0 && pc[pos - 1] < c) {
                    pe[pos] = pe[pos - 1], pf[pos] = pf[pos - 1], pc[pos] = pc[pos - 1];
                    pos--;
                }
                pe[pos] = e, pf[pos] = f, pc[pos] = c;
            }
    /* Columns: x[e,g], then s[e,g] (replicas only), z, w[p,d]. */
    int nx = E * G, ns = replicas ? E * G : 0, iz = nx + ns, iw = iz + 1;
    int cols = iw + npairs * D;
    int rows = E + G + G + (replicas ? E * G + E : 0) + 2 * npairs * D;
    struct mip *p = mip_create(cols, rows);
    double *x = calloc((size_t)cols, sizeof *x);
    if (!p || !x) {
        mip_destroy(p);
        free(x);
        st = moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
        goto cleanup;
    }
    double scale = greedy.balanced_load > 0 ? 1.0 / greedy.balanced_load : 1.0;
    for (int j = 0; j < nx; j++) mip_col(p, j, MIP_BINARY, 0, 1, 0);
    for (int j = nx; j < nx + ns; j++) mip_col(p, j, MIP_CONTINUOUS, 0, 1, 0);
    mip_col(p, iz, MIP_CONTINUOUS, 0, HUGE_VAL, 1.0);
    for (int q = 0; q < npairs * D; q++)
        mip_col(p, iw + q, MIP_CONTINUOUS, 0, 1, -pr->traffic_weight * pc[q / D] * scale);
    int r = 0;
    for (int e = 0; e < E; e++, r++) { /* every expert placed (exactly once without replicas) */
        mip_row(p, r, 1, replicas ? HUGE_VAL : 1);
        for (int g = 0; g < G && st == MOE_OK; g++) st = mip_coef(p, r, e * G + g, 1, err);
    }
    for (int g = 0; g < G; g++, r++) { /* slots */
        mip_row(p, r, -HUGE_VAL, pr->slots_per_rank);
        for (int e = 0; e < E && st == MOE_OK; e++) st = mip_coef(p, r, e * G + g, 1, err);
    }
    for (int g = 0; g < G; g++, r++) { /* the hottest rank, loads scaled to balanced = 1 */
        mip_row(p, r, -HUGE_VAL, 0);
        for (int e = 0; e < E && st == MOE_OK; e++)
            st = mip_coef(p, r, (replicas ? nx : 0) + e * G + g, pr->pick[e] * scale, err);
        if (st == MOE_OK) st = mip_coef(p, r, iz, -1, err);
    }
    if (replicas) {
        for (int j = 0; j < E * G && st == MOE_OK; j++, r++) { /* s <= x */
            mip_row(p, r, -HUGE_VAL, 0);
            st = mip_coef(p, r, nx + j, 1, err);
            if (st == MOE_OK) st = mip_coef(p, r, j, -1, err);
        }
        for (int e = 0; e < E && st == MOE_OK; e++, r++) { /* shares sum to 1 */
            mip_row(p, r, 1, 1);
            for (int g = 0; g < G && st == MOE_OK; g++) st = mip_coef(p, r, nx + e * G + g, 1, err);
        }
    }
    for (int q = 0; q < npairs && st == MOE_OK; q++)
        for (int d = 0; d < D && st == MOE_OK; d++)
            for (int side = 0; side < 2 && st == MOE_OK; side++, r++) {
                int e = side ? pf[q] : pe[q];
                mip_row(p, r, -HUGE_VAL, 0);
                st = mip_coef(p, r, iw + q * D + d, 1, err);
                for (int g = d * pr->ranks_per_domain;
                     g < (d + 1) * pr->ranks_per_domain && g < G && st == MOE_OK; g++)
                    st = mip_coef(p, r, e * G + g, -1, err);
            }
    if (st != MOE_OK) {
        mip_destroy(p);
        free(x);
        goto cleanup;
    }
    /* Warm start: the greedy placement. */
    double *warm = calloc((size_t)cols, sizeof *warm);
    if (warm) {
        for (int j = 0; j < E * G; j++) {
            warm[j] = greedy.share[j] > 0 ? 1.0 : 0.0;
            if (replicas) warm[nx + j] = greedy.share[j];
        }
        warm[iz] = greedy.max_load * scale;
        for (int q = 0; q < npairs; q++)
            for (int d = 0; d < D; d++) {
                bool a = false, b = false;
                for (int g = d * pr->ranks_per_domain; g < (d + 1) * pr->ranks_per_domain && g < G;
                     g++) {
                    a |= greedy.share[(size_t)pe[q] * G + g] > 0;
                    b |= greedy.share[(size_t)pf[q] * G + g] > 0;
                }
                warm[iw + q * D + d] = a && b ? 1.0 : 0.0;
            }
        mip_warm_start(p, warm);
        free(warm);
    }
    struct plan_mip_report rep;
    st = mip_solve(p, pr->time_limit_s, &rep, x, err);
    mip_destroy(p);
    if (st == MOE_OK) {
        double *share = calloc((size_t)E * G, sizeof *share);
        if (!share) {
            free(x);
            st = moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
            goto cleanup;
        }
        for (int j = 0; j < E * G; j++)
            share[j] = replicas ? (x[j] > 0.5 ? x[nx + j] : 0.0) : (x[j] > 0.5);
        double max_load = 0.0;
        for (int g = 0; g < G; g++) max_load = fmax(max_load, load_of(pr, share, g));
        double traffic = traffic_of(pr, share);
        double obj_mip = max_load + pr->traffic_weight * traffic;
        double obj_greedy = greedy.max_load + pr->traffic_weight * greedy.traffic;
        greedy.mip = rep;
        if (obj_mip < obj_greedy - 1e-12) {
            free(greedy.share);
            greedy.share = share;
            greedy.max_load = max_load;
            greedy.traffic = traffic;
            greedy.used_mip = true;
        } else {
            free(share);
        }
    } else if (st == MOE_ERR_GLPK) {
        /* No MILP answer in time: the greedy placement stands, and the report says so. */
        snprintf(greedy.mip.status, sizeof greedy.mip.status, "no solution in time: greedy kept");
        st = MOE_OK;
    }
    free(x);
cleanup:
    free(pe);
    free(pf);
    free(pc);
    if (st == MOE_OK) {
        plan_placement_free(out);
        *out = greedy;
    } else {
        plan_placement_free(&greedy);
    }
    return st;
}
