/*
 * routing.c: which experts tokens choose, and what that means for dispatch bytes.
 *
 * A routing is, per MoE layer, the probability that a token picks expert e (summing to top_k) and,
 * when measured, how often two experts are picked together. Synthetic skew (Zipf, Dirichlet) is
 * seeded and its hot experts are shuffled over the expert ids, as in a trained model, so that a
 * contiguous placement is not made worse than it is by construction.
 *
 * Dispatch bytes: a token crosses to a GPU once per (token, expert) with the plain all-to-all,
 * once per distinct destination GPU with per-GPU dedup, and once per distinct destination domain
 * over the scale-out fabric with per-domain dedup (then it fans out over NVLink). The exact count
 * from explicit choices is in cost_dispatch_bytes_exact; the cost model's expectation, with each
 * EP rank's load, is cost_moe_traffic (at the end).
 */
#include "cost_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void cost_routing_free(struct cost_routing *r)
{
    if (!r) return;
    free(r->pick);
    free(r->pair);
    r->pick = r->pair = NULL;
}

/* Scale w (sum 1) to picks summing to k with none above 1 (a token picks an expert at most once):
 * water-filling of the excess over the experts below 1. */
static void picks_from_weights(const double *w, int n, int k, double *pick)
{
    for (int i = 0; i < n; i++) pick[i] = w[i] * k;
    for (int iter = 0; iter < n; iter++) {
        double excess = 0.0, free_mass = 0.0;
        for (int i = 0; i < n; i++) {
            if (pick[i] > 1.0) {
                excess += pick[i] - 1.0;
                pick[i] = 1.0;
            } else if (pick[i] < 1.0) {
                free_mass += pick[i];
            }
        }
        if (excess <= 1e-15 || free_mass <= 0.0) break;
        for (int i = 0; i < n; i++)
            if (pick[i] < 1.0) pick[i] += excess * pick[i] / free_mass;
    }
}

/* A routing that owns pick (and pair, NULL: none). */
static void routing_fill(struct cost_routing *r, enum cost_routing_kind kind, int experts,
                         int top_k, int layers, double *pick, double *pair)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->experts = experts;
    r->top_k = top_k;
    r->layers = layers;
    r->pick = pick;
    r->pair = pair;
}

enum moe_status cost_routing_synthetic(struct cost_routing *r, enum cost_routing_kind kind,
                                       double param, uint64_t seed, int experts, int top_k,
                                       struct moe_error *err)
{
    if (experts < 1 || top_k < 1 || top_k > experts)
        return moe_error_set(err, MOE_ERR_INPUT, "routing: top_k %d of %d experts", top_k, experts);
    if ((kind == COST_ROUTING_ZIPF && !(param >= 0.0 && param <= 10.0)) ||
        (kind == COST_ROUTING_DIRICHLET && !(param > 0.0 && param <= 1e6)))
        return moe_error_set(err, MOE_ERR_INPUT,
                             "routing: Zipf exponent in [0, 10], Dirichlet alpha in (0, 1e6]");
    double *w = malloc(sizeof *w * (size_t)experts);
    double *pick = malloc(sizeof *pick * (size_t)experts);
    int *perm = malloc(sizeof *perm * (size_t)experts);
    if (!w || !pick || !perm) {
        free(w);
        free(pick);
        free(perm);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory building a routing");
    }
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    for (int i = 0; i < experts; i++) perm[i] = i;
    for (int i = experts - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)moe_rng_below(&rng, (uint64_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    double sum = 0.0;
    if (kind == COST_ROUTING_DIRICHLET) {
        moe_rng_dirichlet(&rng, param, w, (size_t)experts);
        sum = 1.0;
    } else {
        for (int i = 0; i < experts; i++) {
            double v = kind == COST_ROUTING_ZIPF ? pow((double)i + 1.0, -param) : 1.0;
            w[perm[i]] = v;
            sum += v;
        }
        for (int i = 0; i < experts; i++) w[i] /= sum;
    }
    picks_from_weights(w, experts, top_k, pick);
    free(w);
    free(perm);
    routing_fill(r, kind, experts, top_k, 1, pick, NULL);
    r->param = param;
    r->seed = seed;
    return MOE_OK;
}

enum moe_status cost_routing_from_choices(struct cost_routing *r, const int *choice, int tokens,
                                          int experts, int top_k, struct moe_error *err)
{
    if (tokens < 1 || experts < 1 || top_k < 1)
        return moe_error_set(err, MOE_ERR_INPUT, "routing: no tokens");
    double *pick = calloc((size_t)experts, sizeof *pick);
    double *pair = calloc((size_t)experts * (size_t)experts, sizeof *pair);
    if (!pick || !pair) {
        free(pick);
        free(pair);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory building a routing");
    }
    for (int t = 0; t < tokens; t++)
        for (int a = 0; a < top_k; a++) {
            int e = choice[t * top_k + a];
            if (e < 0 || e >= experts) {
                free(pick);
                free(pair);
                return moe_error_set(err, MOE_ERR_INPUT, "routing: expert %d of %d", e, experts);
            }
            pick[e] += 1.0 / tokens;
            for (int b = 0; b < top_k; b++)
                if (b != a) pair[(size_t)e * experts + choice[t * top_k + b]] += 1.0 / tokens;
        }
    routing_fill(r, COST_ROUTING_MEASURED, experts, top_k, 1, pick, pair);
    return MOE_OK;
}

enum moe_status cost_routing_from_counts(struct cost_routing *r, const int64_t *counts, int layers,
                                         int experts, int top_k, struct moe_error *err)
{
    if (layers < 1 || experts < 1 || top_k < 1)
        return moe_error_set(err, MOE_ERR_INPUT, "routing: no layers or experts");
    double *pick = calloc((size_t)layers * experts, sizeof *pick);
    if (!pick) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory building a routing");
    for (int l = 0; l < layers; l++) {
        double total = 0.0;
        for (int e = 0; e < experts; e++) total += (double)counts[(size_t)l * experts + e];
        if (total <= 0.0) {
            free(pick);
            return moe_error_set(err, MOE_ERR_INPUT, "routing: layer %d routed no token", l);
        }
        for (int e = 0; e < experts; e++) /* P(a token picks e): counts over tokens */
            pick[(size_t)l * experts + e] = (double)counts[(size_t)l * experts + e] * top_k / total;
    }
    routing_fill(r, COST_ROUTING_MEASURED, experts, top_k, layers, pick, NULL);
    return MOE_OK;
}

enum moe_status cost_routing_load(struct cost_routing *r, const char *file, int experts, int top_k,
                                  struct moe_error *err)
{
    static const char *const keys[] = {"schema", "version", "model",  "experts",
                                       "top_k",  "tokens",  "layers", NULL};
    static const char *const layer_keys[] = {"layer", "counts", "coactivation", NULL};
    struct moe_jdoc doc;
    struct moe_jval root, layers, lay, counts, co, row;
    char schema[64];
    int version;
    int64_t e64, k64;
    double *pick = NULL, *pair = NULL;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err))) goto cleanup;
    if ((st = moe_jdoc_root(&doc, &root, err))) goto cleanup;
    if (strcmp(schema, "moeplan.routing") != 0 && strcmp(schema, COST_MEASURED_SCHEMA) != 0) {
        st = moe_jval_error(&root, "schema", err, "expected \"moeplan.routing\"");
        goto cleanup;
    }
    if (strcmp(schema, COST_MEASURED_SCHEMA) == 0) {
        /* measured.json carries the routing under "routing". */
        if ((st = moe_jval_object(&root, "routing", true, &root, NULL, err))) goto cleanup;
    } else if ((st = moe_jval_keys(&root, keys, err))) {
        goto cleanup;
    }
    if ((st = moe_jval_int(&root, "experts", true, 0, 1, 1 << 16, &e64, err))) goto cleanup;
    if ((st = moe_jval_int(&root, "top_k", true, 0, 1, 1 << 16, &k64, err))) goto cleanup;
    if (e64 != experts || k64 != top_k) {
        st = moe_jval_error(&root, "experts", err,
                            "routing of %lld experts top-%lld, the model has %d top-%d",
                            (long long)e64, (long long)k64, experts, top_k);
        goto cleanup;
    }
    if ((st = moe_jval_array(&root, "layers", true, &layers, NULL, err))) goto cleanup;
    size_t nl = moe_jval_len(&layers), ne = (size_t)experts;
    if (nl < 1 || nl > 4096) {
        st = moe_jval_error(&root, "layers", err, "needs 1 to 4096 layers");
        goto cleanup;
    }
    pick = calloc(nl * ne, sizeof *pick);
    bool have_pairs = true;
    if (!pick) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory reading %s", file);
        goto cleanup;
    }
    for (size_t l = 0; l < nl; l++) {
        if ((st = moe_jval_at_object(&layers, l, &lay, err))) goto cleanup;
        if ((st = moe_jval_keys(&lay, layer_keys, err))) goto cleanup;
        if ((st = moe_jval_array(&lay, "counts", true, &counts, NULL, err))) goto cleanup;
        if (moe_jval_len(&counts) != ne) {
            st = moe_jval_error(&lay, "counts", err, "needs %d counts", experts);
            goto cleanup;
        }
        double total = 0.0, c;
        for (size_t e = 0; e < ne; e++) {
            if ((st = moe_jval_at_num(&counts, e, 0, 1e18, &c, err))) goto cleanup;
            pick[l * ne + e] = c;
            total += c;
        }
        if (total <= 0.0) {
            st = moe_jval_error(&lay, "counts", err, "no token was routed");
            goto cleanup;
        }
        double tokens = total / top_k;
        for (size_t e = 0; e < ne; e++) pick[l * ne + e] /= tokens;
        bool has_co = false;
        if ((st = moe_jval_array(&lay, "coactivation", false, &co, &has_co, err))) goto cleanup;
        if (!has_co) {
            have_pairs = false;
            continue;
        }
        if (moe_jval_len(&co) != ne) {
            st = moe_jval_error(&lay, "coactivation", err, "needs %d rows", experts);
            goto cleanup;
        }
        if (!pair && !(pair = calloc(nl * ne * ne, sizeof *pair))) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory reading %s", file);
            goto cleanup;
        }
        for (size_t a = 0; a < ne; a++) {
            json_t *rj = json_array_get(co.json, a);
            if (!json_is_array(rj) || json_array_size(rj) != ne) {
                st = moe_jval_error(&co, NULL, err, "row %zu must be an array of %d counts", a,
                                    experts);
                goto cleanup;
            }
            row.doc = co.doc;
            row.json = rj;
            int pn = snprintf(row.path, sizeof row.path, "%s[%zu]", co.path, a);
            if (pn < 0 || (size_t)pn >= sizeof row.path) row.path[sizeof row.path - 1] = '\0';
            for (size_t b = 0; b < ne; b++) {
                double v;
                if ((st = moe_jval_at_num(&row, b, 0, 1e18, &v, err))) goto cleanup;
                pair[(l * ne + a) * ne + b] = a == b ? 0.0 : v / tokens;
            }
        }
    }
    routing_fill(r, COST_ROUTING_MEASURED, experts, top_k, (int)nl, pick, have_pairs ? pair : NULL);
    if (!have_pairs) free(pair);
    pick = pair = NULL;
cleanup:
    free(pick);
    free(pair);
    moe_jdoc_free(&doc);
    return st;
}

void cost_dispatch_bytes_exact(const int *choice, const int *src_rank, int tokens, int top_k,
                               const int *placement, const int *gpu_domain,
                               enum cost_dispatcher mode, double bytes_per_token,
                               struct cost_bytes *out)
{
    out->nvlink = out->scale_out = 0.0;
    enum { MAXK = MDL_MAX_TOP_K }; /* the model's bound on top_k */
    for (int t = 0; t < tokens; t++) {
        int src = src_rank[t], dst[MAXK], n = 0;
        for (int a = 0; a < top_k && a < MAXK; a++) dst[n++] = placement[choice[t * top_k + a]];
        if (mode == COST_DISPATCH_ALLTOALL) {
            for (int i = 0; i < n; i++) {
                if (dst[i] == src) continue;
                if (gpu_domain[dst[i]] == gpu_domain[src])
                    out->nvlink += bytes_per_token;
                else
                    out->scale_out += bytes_per_token;
            }
            continue;
        }
        /* Distinct destination GPUs (and, for per-domain dedup, domains). */
        int gpus[MAXK], ng = 0, doms[MAXK], nd = 0;
        for (int i = 0; i < n; i++) {
            bool seen = false;
            for (int j = 0; j < ng; j++) seen |= gpus[j] == dst[i];
            if (!seen) gpus[ng++] = dst[i];
        }
        for (int i = 0; i < ng; i++) {
            if (gpus[i] == src) continue;
            int d = gpu_domain[gpus[i]];
            if (mode == COST_DISPATCH_DEDUP_GPU || d == gpu_domain[src]) {
                if (d == gpu_domain[src])
                    out->nvlink += bytes_per_token;
                else
                    out->scale_out += bytes_per_token;
                continue;
            }
            bool seen = false;
            for (int j = 0; j < nd; j++) seen |= doms[j] == d;
            if (!seen) doms[nd++] = d;
        }
        if (mode != COST_DISPATCH_DEDUP_DOMAIN) continue;
        /* Once per remote domain, to the GPU of the same local index; then NVLink fan-out to
         * the other destination GPUs of that domain. Local index: position among that domain's
         * ranks (ranks of a domain are contiguous). */
        for (int j = 0; j < nd; j++) {
            out->scale_out += bytes_per_token;
            int first_src = src, first_dst = -1;
            while (first_src > 0 && gpu_domain[first_src - 1] == gpu_domain[src]) first_src--;
            for (int i = 0; i < ng; i++)
                if (gpu_domain[gpus[i]] == doms[j] && (first_dst < 0 || gpus[i] < first_dst))
                    first_dst = gpus[i];
            int base = first_dst;
            while (base > 0 && gpu_domain[base - 1] == doms[j]) base--;
            int landing = base + (src - first_src);
            for (int i = 0; i < ng; i++)
                if (gpu_domain[gpus[i]] == doms[j] && gpus[i] != landing)
                    out->nvlink += bytes_per_token;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Routing: load per EP rank and the dispatch's expected copies per token                         */
/* ---------------------------------------------------------------------------------------------- */

/* C(N - t, k) / C(N, k): none of t given experts among k drawn uniformly from N. */
static double none_of(double N, double t, int k)
{
    double none = 1.0;
    for (int i = 0; i < k; i++) none *= (N - t - i) / (N - i);
    return none > 0 ? none : 0.0;
}

/* Group-limited routing (DeepSeek-V3: 8 groups of 32 experts, each token in the best 4): under
 * uniform (or forced-balanced) scores a token's groups are a uniform topk_group-subset of the
 * n_group, its top_k experts uniform among those groups' experts. The probability that it
 * reaches one of `members`: over the subsets, by how many members they hold (groups drawn one
 * by one without replacement; those without members change nothing). Where each node holds a
 * group, a token reaches at most topk_group nodes, fewer than the ungrouped draw's. */
static double hit_prob_grouped(const struct mdl_moe *e, const int *members, int n)
{
    int G = e->n_group, g = e->topk_group, per = e->experts / G;
    /* members per group, the groups that hold some: (group, count) pairs, members sorted or not */
    int *grp = malloc(sizeof *grp * 2 * (size_t)n);
    double *f = calloc((size_t)(g + 1) * (size_t)(n + 1), sizeof *f);
    if (!grp || !f) { /* out of memory: the ungrouped draw, an upper bound on the traffic */
        free(grp);
        free(f);
        return 1.0 - none_of(e->experts, n, e->top_k);
    }
    int ng = 0;
    for (int i = 0; i < n; i++) {
        int q = members[i] / per, j = 0;
        while (j < ng && grp[2 * j] != q) j++;
        if (j == ng) grp[2 * ng] = q, grp[2 * ng + 1] = 0, ng++;
        grp[2 * j + 1]++;
    }
    /* f[c][t]: probability that c of the groups seen so far are chosen, holding t members */
    f[0] = 1.0;
    for (int j = 0; j < ng; j++) {
        int s = grp[2 * j + 1];
        for (int c = (j < g ? j : g - 1); c >= 0; c--) {
            double in = (double)(g - c) / (G - j); /* the next group drawn into the g */
            for (int t = n - s; t >= 0; t--) {
                double v = f[c * (n + 1) + t];
                if (v == 0) continue;
                f[(c + 1) * (n + 1) + t + s] += v * in;
                f[c * (n + 1) + t] = v * (1.0 - in);
            }
        }
    }
    double none = 0.0;
    for (int c = 0; c <= g; c++)
        for (int t = 0; t <= n; t++)
            if (f[c * (n + 1) + t] > 0)
                none += f[c * (n + 1) + t] * none_of((double)g * per, t, e->top_k);
    free(grp);
    free(f);
    return 1.0 - none;
}

/* P(a token picks at least one expert of the set `members` (n of them)). */
static double hit_prob(const struct cost_ctx *c, const double *pick, const double *pair,
                       const int *members, int n)
{
    const struct mdl_moe *e = &c->model.moe;
    if (!c->routing || c->routing->kind == COST_ROUTING_UNIFORM) {
        if (e->n_group > 1 && e->topk_group < e->n_group) return hit_prob_grouped(e, members, n);
        /* Exact for k distinct experts drawn uniformly: 1 - C(E - n, k) / C(E, k). */
        return 1.0 - none_of(e->experts, n, e->top_k);
    }
    double sum = 0.0, most = 0.0, prod = 1.0;
    for (int i = 0; i < n; i++) {
        double p = pick[members[i]];
        sum += p;
        if (p > most) most = p;
        prod *= 1.0 - (p < 1.0 ? p : 1.0);
    }
    double h;
    if (pair) {
        /* Second-order inclusion-exclusion with the measured co-activation, within its bounds. */
        double both = 0.0;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                both += pair[(size_t)members[i] * e->experts + members[j]];
        h = sum - both;
        double hi = sum < 1.0 ? sum : 1.0;
        if (h < most) h = most;
        if (h > hi) h = hi;
    } else {
        h = 1.0 - prod; /* independent picks */
    }
    return h;
}

#define MEMO_SLOTS 256
struct cost_traffic_memo {
    int n;
    struct {
        int ep, etp, mode, layer;
        struct cost_moe_traffic t;
    } at[MEMO_SLOTS];
};

struct cost_traffic_memo *cost_traffic_memo_create(void)
{
    return calloc(1, sizeof(struct cost_traffic_memo));
}

void cost_traffic_memo_destroy(struct cost_traffic_memo *m)
{
    free(m);
}

static enum moe_status traffic(const struct cost_ctx *c, const struct cost_layout *l, int layer_idx,
                               struct cost_moe_traffic *out, struct moe_error *err);

enum moe_status cost_moe_traffic(const struct cost_ctx *c, const struct cost_layout *l,
                                 int layer_idx, struct cost_moe_traffic *out, struct moe_error *err)
{
    struct cost_traffic_memo *m = c->placement ? NULL : c->memo;
    int rl = c->routing && c->routing->layers > 1 ? layer_idx % c->routing->layers : 0;
    int mode = (int)cost_dispatch_copies(l->dispatcher);
    for (int i = 0; m && i < m->n; i++)
        if (m->at[i].ep == l->ep && m->at[i].etp == l->etp && m->at[i].mode == mode &&
            m->at[i].layer == rl) {
            *out = m->at[i].t;
            return MOE_OK;
        }
    enum moe_status st = traffic(c, l, layer_idx, out, err);
    if (st == MOE_OK && m && m->n < MEMO_SLOTS) {
        int i = m->n++;
        m->at[i].ep = l->ep, m->at[i].etp = l->etp, m->at[i].mode = mode, m->at[i].layer = rl;
        m->at[i].t = *out;
    }
    return st;
}

static enum moe_status traffic(const struct cost_ctx *c, const struct cost_layout *l, int layer_idx,
                               struct cost_moe_traffic *out, struct moe_error *err)
{
    const struct mdl_moe *me = &c->model.moe;
    int E = me->experts, ep = l->ep, k = me->top_k;
    int rl = 0;
    if (c->routing && c->routing->layers > 1) rl = layer_idx % c->routing->layers;
    const double *pick = c->routing ? c->routing->pick + (size_t)rl * E : NULL;
    const double *pair =
        c->routing && c->routing->pair ? c->routing->pair + (size_t)rl * E * E : NULL;
    double uniform = (double)k / E;
    /* Sized by the model and the layout (up to MDL_MAX_EXPERTS experts and EP ranks): the heap,
     * not fixed arrays. */
    double *load = malloc(sizeof *load * 2 * (size_t)ep);
    int *members = malloc(sizeof *members * ((size_t)E + 2 * (size_t)ep + 1));
    if (!load || !members) {
        free(load);
        free(members);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory costing %d experts on %d EP ranks",
                             E, ep);
    }
    double *hit = load + ep;
    int *start = members + E, *fill = start + ep + 1;
    memset(out, 0, sizeof *out);
    /* EP ranks per NVLink domain: EP peers sit etp GPUs apart. */
    int rpd = c->cluster.gpus_used_per_domain / l->etp;
    if (rpd < 1) rpd = 1;
    if (rpd > ep) rpd = ep;
    double max_load = 0.0, sum_load = 0.0, max_hit = 0.0, sum_hit = 0.0;
    /* Experts grouped by rank in one pass (a counting sort): members[start[r] .. start[r+1]). */
    memset(start, 0, sizeof(int) * (size_t)(ep + 1));
    for (int e = 0; e < E; e++) start[cost_expert_rank(c, e, ep) + 1]++;
    for (int r = 0; r < ep; r++) start[r + 1] += start[r];
    for (int r = 0; r < ep; r++) fill[r] = start[r];
    for (int e = 0; e < E; e++) members[fill[cost_expert_rank(c, e, ep)]++] = e;
    out->hot_rank = 0;
    for (int r = 0; r < ep; r++) {
        int n = start[r + 1] - start[r];
        double ld = 0.0;
        for (int i = start[r]; i < start[r + 1]; i++) ld += pick ? pick[members[i]] : uniform;
        load[r] = ld;
        hit[r] = n ? hit_prob(c, pick, pair, members + start[r], n) : 0.0;
        if (ld > max_load) {
            max_load = ld;
            out->hot_rank = r;
        }
        if (hit[r] > max_hit) max_hit = hit[r];
        sum_load += ld;
        sum_hit += hit[r];
    }
    out->hot_ratio = sum_load > 0 ? max_load / (sum_load / ep) : 1.0;
    out->hot_rows_frac = sum_load > 0 ? max_load / sum_load : 1.0;
    int ndom = (ep + rpd - 1) / rpd;
    double nv = 0.0, so = 0.0;
    for (int d = 0; d < ndom; d++) {
        int r0 = d * rpd, r1 = r0 + rpd < ep ? r0 + rpd : ep, size = r1 - r0;
        double L = 0.0, H = 0.0;
        for (int r = r0; r < r1; r++) {
            L += load[r];
            H += hit[r];
        }
        if (cost_dispatch_copies(l->dispatcher) == COST_DISPATCH_ALLTOALL) {
            nv += (size - 1) * L; /* sum over s in d of (L_d - load_s) */
            so += size * (sum_load - L);
        } else {
            nv += (size - 1) * H;
            if (cost_dispatch_copies(l->dispatcher) == COST_DISPATCH_DEDUP_GPU) {
                so += size * (sum_hit - H);
            } else {
                /* Once per remote domain, then fan-out inside it. */
                for (int d2 = 0; d2 < ndom; d2++) {
                    if (d2 == d) continue;
                    int q0 = d2 * rpd, q1 = q0 + rpd < ep ? q0 + rpd : ep;
                    int qn = start[q1] - start[q0];
                    double H2 = 0.0;
                    for (int r = q0; r < q1; r++) H2 += hit[r];
                    /* With contiguous ranks per domain, the domain's experts are contiguous. */
                    so += size * hit_prob(c, pick, pair, members + start[q0], qn);
                    nv += size * H2 * (1.0 - 1.0 / (q1 - q0));
                }
            }
        }
    }
    out->nvlink_copies = nv / ep;
    out->scale_copies = so / ep;
    out->nodedup_copies = (k * ep - sum_load) / ep; /* k copies less those staying home */
    out->recv_ratio = cost_dispatch_copies(l->dispatcher) == COST_DISPATCH_ALLTOALL
                          ? out->hot_ratio
                          : (sum_hit > 0 ? max_hit / (sum_hit / ep) : 1.0);
    free(load);
    free(members);
    return MOE_OK;
}
