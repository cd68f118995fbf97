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
 *
 * A placement is kept as each expert's copies (rank, share), not an experts x ranks table: at
 * 65,536 experts on 1,024 ranks the table was 512 MiB and the scans over it seconds. The MILP
 * has a variable per (expert, rank), so it runs only up to PLAN_MIP_MAX_CELLS of them (the time
 * limit would stop it far sooner anyway); above that the greedy answer is the placement.
 */
#include "mip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void plan_placement_free(struct plan_placement *pl)
{
    if (!pl) return;
    free(pl->first);
    free(pl->copy);
    pl->first = NULL;
    pl->copy = NULL;
}

int plan_placement_rank(const struct plan_placement *pl, int e)
{
    int best = -1;
    double most = -1.0;
    for (int c = pl->first[e]; c < pl->first[e + 1]; c++) {
        const struct plan_copy *k = &pl->copy[c];
        if (k->share > most || (k->share == most && k->rank < best))
            most = k->share, best = k->rank;
    }
    return best < 0 ? 0 : best;
}

/* Each rank's load (sum of pick x share), in ld[ranks]; summed in expert order. */
static void loads_of(const struct plan_placement_problem *pr, const struct plan_placement *pl,
                     double *ld)
{
    for (int g = 0; g < pl->ranks; g++) ld[g] = 0.0;
    for (int e = 0; e < pl->experts; e++)
        for (int c = pl->first[e]; c < pl->first[e + 1]; c++)
            ld[pl->copy[c].rank] += pr->pick[e] * pl->copy[c].share;
}

/* Whether experts e and f have a copy in one NVLink domain (ranks_per_domain consecutive). */
static bool share_a_domain(const struct plan_placement *pl, int e, int f, int rpd)
{
    for (int a = pl->first[e]; a < pl->first[e + 1]; a++)
        for (int b = pl->first[f]; b < pl->first[f + 1]; b++)
            if (pl->copy[a].share > 0 && pl->copy[b].share > 0 &&
                pl->copy[a].rank / rpd == pl->copy[b].rank / rpd)
                return true;
    return false;
}

/* Co-activation of pairs split across domains: sum over pairs of c_ef where e and f share no
 * domain. */
static double traffic_of(const struct plan_placement_problem *pr, const struct plan_placement *pl)
{
    if (!pr->pair || pr->ranks_per_domain < 1 || pr->ranks_per_domain >= pr->ranks) return 0.0;
    int E = pr->experts;
    double t = 0.0;
    for (int e = 0; e < E; e++)
        for (int f = e + 1; f < E; f++) {
            double c = pr->pair[(size_t)e * E + f];
            if (c > 0 && !share_a_domain(pl, e, f, pr->ranks_per_domain)) t += c;
        }
    return t;
}

/* The loads, the hottest and the traffic of a placement just built. */
static void placement_score(const struct plan_placement_problem *pr, struct plan_placement *pl,
                            double *ld)
{
    double total = 0.0;
    for (int e = 0; e < pr->experts; e++) total += pr->pick[e];
    pl->balanced_load = total / pl->ranks;
    loads_of(pr, pl, ld);
    pl->max_load = 0.0;
    for (int g = 0; g < pl->ranks; g++) pl->max_load = fmax(pl->max_load, ld[g]);
    pl->traffic = traffic_of(pr, pl);
}

/* An empty placement with room for `ncopies` copies, copies[e] of expert e. */
static enum moe_status placement_alloc(struct plan_placement *pl, int E, int G, const int *copies,
                                       struct moe_error *err)
{
    memset(pl, 0, sizeof *pl);
    pl->experts = E;
    pl->ranks = G;
    pl->first = malloc(sizeof *pl->first * ((size_t)E + 1));
    size_t n = 0;
    for (int e = 0; e < E; e++) n += (size_t)copies[e];
    pl->copy = calloc(n ? n : 1, sizeof *pl->copy);
    if (!pl->first || !pl->copy) {
        plan_placement_free(pl);
        return moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
    }
    pl->first[0] = 0;
    for (int e = 0; e < E; e++) pl->first[e + 1] = pl->first[e] + copies[e];
    return MOE_OK;
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

/* The experts by load per copy, heaviest first; ties in expert order (a stable sort). */
struct by_load {
    double per_copy;
    int e;
};

static int by_load_cmp(const void *pa, const void *pb)
{
    const struct by_load *a = pa, *b = pb;
    if (a->per_copy != b->per_copy) return a->per_copy > b->per_copy ? -1 : 1;
    return (a->e > b->e) - (a->e < b->e);
}

/* The replicas' max-heap: the expert with the most load per copy on top (ties: the lower id). */
static bool heap_above(const struct by_load *a, const struct by_load *b)
{
    return a->per_copy > b->per_copy || (a->per_copy == b->per_copy && a->e < b->e);
}

static void heap_down(struct by_load *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && heap_above(&h[l], &h[top])) top = l;
        if (r < n && heap_above(&h[r], &h[top])) top = r;
        if (top == i) return;
        struct by_load t = h[i];
        h[i] = h[top], h[top] = t;
        i = top;
    }
}

enum moe_status plan_place_greedy(const struct plan_placement_problem *pr,
                                  struct plan_placement *out, struct moe_error *err)
{
    enum moe_status st = check_problem(pr, err);
    if (st != MOE_OK) return st;
    int E = pr->experts, G = pr->ranks, slots = pr->slots_per_rank;
    long spare = (long)slots * G - E;
    double *ld = calloc((size_t)G, sizeof *ld);
    int *copies = calloc((size_t)E, sizeof *copies), *used = calloc((size_t)G, sizeof *used);
    struct by_load *order = malloc(sizeof *order * (size_t)E);
    struct plan_placement pl;
    memset(&pl, 0, sizeof pl);
    if (!ld || !copies || !used || !order) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
        goto cleanup;
    }
    /* Replicas: give spare slots to the experts with the most load per copy (at most one copy
     * per rank): a heap, not a scan of every expert per slot. */
    for (int e = 0; e < E; e++) copies[e] = 1, order[e] = (struct by_load){pr->pick[e], e};
    for (int i = E / 2 - 1; i >= 0; i--) heap_down(order, E, i);
    int live = E;
    for (long k = 0; k < spare && live > 0;) {
        int e = order[0].e;
        if (copies[e] >= G) { /* on every rank already: out of the heap */
            order[0] = order[--live];
            heap_down(order, live, 0);
            continue;
        }
        /* a replica only helps an expert heavier per copy than a balanced rank */
        if (order[0].per_copy <= 1e-12) break;
        copies[e]++;
        order[0].per_copy = pr->pick[e] / copies[e];
        heap_down(order, live, 0);
        k++;
    }
    for (int e = 0; e < E; e++) order[e] = (struct by_load){pr->pick[e] / copies[e], e};
    qsort(order, (size_t)E, sizeof *order, by_load_cmp);
    if ((st = placement_alloc(&pl, E, G, copies, err))) goto cleanup;
    for (int i = 0; i < E; i++) {
        int e = order[i].e, at = pl.first[e];
        double part = pr->pick[e] / copies[e];
        for (int c = 0; c < copies[e]; c++) {
            int best = -1;
            for (int g = 0; g < G; g++) {
                if (used[g] >= slots) continue;
                bool has = false; /* a rank holds one copy of an expert at most */
                for (int q = pl.first[e]; q < at && !has; q++) has = pl.copy[q].rank == g;
                if (has) continue;
                if (best < 0 || ld[g] < ld[best] - 1e-15) best = g;
            }
            if (best < 0) break; /* cannot happen: enough slots were checked */
            pl.copy[at++] = (struct plan_copy){best, 1.0 / copies[e]};
            ld[best] += part;
            used[best]++;
        }
    }
    placement_score(pr, &pl, ld);
    pl.greedy_max_load = pl.max_load;
    pl.greedy_traffic = pl.traffic;
    snprintf(pl.mip.status, sizeof pl.mip.status, "not run");
    plan_placement_free(out);
    *out = pl;
    memset(&pl, 0, sizeof pl);
cleanup:
    plan_placement_free(&pl);
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
    int *ones = calloc((size_t)E, sizeof *ones);
    double *ld = malloc(sizeof *ld * (size_t)G);
    struct plan_placement pl;
    enum moe_status st = ones && ld ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int e = 0; st == MOE_OK && e < E; e++) ones[e] = 1;
    if (st == MOE_OK && (st = placement_alloc(&pl, E, G, ones, err)) == MOE_OK) {
        for (int e = 0; e < E; e++) pl.copy[e] = (struct plan_copy){e % G, 1.0};
        placement_score(pr, &pl, ld);
        pl.greedy_max_load = pl.max_load;
        snprintf(pl.mip.status, sizeof pl.mip.status, "uniform load: greedy is optimal");
        pl.mip.optimal = true;
        plan_placement_free(out);
        *out = pl;
    }
    free(ones);
    free(ld);
    return st;
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
    if ((long)E * G > PLAN_MIP_MAX_CELLS) { /* a variable per (expert, rank): too many */
        snprintf(greedy.mip.status, sizeof greedy.mip.status,
                 "%d experts x %d ranks: past the MILP's %d cells, greedy kept", E, G,
                 PLAN_MIP_MAX_CELLS);
        plan_placement_free(out);
        *out = greedy;
        return MOE_OK;
    }
    bool replicas = (long)pr->slots_per_rank * G > E;
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
        for (int e = 0; e < E; e++)
            for (int c = greedy.first[e]; c < greedy.first[e + 1]; c++) {
                int j = e * G + greedy.copy[c].rank;
                warm[j] = greedy.copy[c].share > 0 ? 1.0 : 0.0;
                if (replicas) warm[nx + j] = greedy.copy[c].share;
            }
        warm[iz] = greedy.max_load * scale;
        for (int q = 0; q < npairs; q++)
            for (int d = 0; d < D; d++) {
                bool a = false, b = false;
                for (int c = greedy.first[pe[q]]; c < greedy.first[pe[q] + 1]; c++)
                    a |=
                        greedy.copy[c].share > 0 && greedy.copy[c].rank / pr->ranks_per_domain == d;
                for (int c = greedy.first[pf[q]]; c < greedy.first[pf[q] + 1]; c++)
                    b |=
                        greedy.copy[c].share > 0 && greedy.copy[c].rank / pr->ranks_per_domain == d;
                warm[iw + q * D + d] = a && b ? 1.0 : 0.0;
            }
        mip_warm_start(p, warm);
        free(warm);
    }
    struct plan_mip_report rep;
    st = mip_solve(p, pr->time_limit_s, 0.0, &rep, x, err);
    mip_destroy(p);
    if (st == MOE_OK) { /* the MILP's x (and s) as each expert's copies */
        int *ncopy = calloc((size_t)E, sizeof *ncopy);
        double *ld = malloc(sizeof *ld * (size_t)G);
        struct plan_placement mp;
        memset(&mp, 0, sizeof mp);
        for (int j = 0; ncopy && j < E * G; j++) ncopy[j / G] += x[j] > 0.5;
        st = ncopy && ld ? placement_alloc(&mp, E, G, ncopy, err)
                         : moe_error_set(err, MOE_ERR_NOMEM, "placement: out of memory");
        for (int e = 0, at = 0; st == MOE_OK && e < E; e++)
            for (int g = 0; g < G; g++)
                if (x[e * G + g] > 0.5)
                    mp.copy[at++] = (struct plan_copy){g, replicas ? x[nx + e * G + g] : 1.0};
        if (st == MOE_OK) {
            placement_score(pr, &mp, ld);
            double obj_mip = mp.max_load + pr->traffic_weight * mp.traffic;
            double obj_greedy = greedy.max_load + pr->traffic_weight * greedy.traffic;
            greedy.mip = rep;
            if (obj_mip < obj_greedy - 1e-12) { /* the greedy answer's figures stay beside it */
                mp.greedy_max_load = greedy.greedy_max_load;
                mp.greedy_traffic = greedy.greedy_traffic;
                mp.mip = rep;
                mp.used_mip = true;
                plan_placement_free(&greedy);
                greedy = mp;
            } else {
                plan_placement_free(&mp);
            }
        }
        free(ncopy);
        free(ld);
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
