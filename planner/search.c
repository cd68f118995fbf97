/*
 * search.c: `moeplan plan`: every valid layout, the best by the objective, then the integer
 * programs for it (stage split, expert placement) and the comparisons that explain it.
 *
 * The space: TP (inside one NVLink domain, dividing the heads), CP (where each CP rank keeps at
 * least PLAN_CP_MIN_TOKENS of a sequence: context parallelism is for long sequences), PP, VPP,
 * DP = GPUs / (TP x CP x PP), EP (dividing the experts and the stage's GPUs), ETP (1 or TP),
 * micro-batch size, and for each of those the cheapest memory rung that fits: recompute none ->
 * selective -> full crossed with ZeRO 1 -> 2 -> 3, tried in the order of their expected cost,
 * memory first (it is cheaper to check); a rung that shards gradients (ZeRO-2, 3) competes with
 * the next ones that fit, since its collectives in every micro-batch may cost more than
 * recomputing. Dominated choices are not tried: the plain all-to-all never beats per-GPU dedup
 * (fewer bytes on every link), per-domain dedup is tried only where EP spans domains, and A2A
 * overlap is always on (it only hides time). The objective "cost" also tries fewer GPUs.
 */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void plan_result_free(struct plan_result *r)
{
    if (!r) return;
    for (int g = 0; g < PLAN_MAX_GROUPS; g++) plan_placement_free(&r->placement[g]);
    free(r->primary);
    r->primary = NULL;
}

static bool fixed_ok(int fix, int v)
{
    return fix < 0 || fix == v;
}

/* Count a refused layout under its reason's words (digits left out, so "tp = 2 does not divide
 * the 8 heads" and "tp = 4 ..." are one reason). */
static void refused(struct plan_result *r, const struct cost_layout *l, const char *why)
{
    char key[sizeof r->refusal[0].key];
    size_t n = 0;
    for (const char *p = why; *p && n + 1 < sizeof key && p - why < 200; p++)
        if (!(*p >= '0' && *p <= '9')) key[n++] = *p;
    key[n] = '\0';
    int i = 0;
    while (i < r->nrefusal && strcmp(r->refusal[i].key, key)) i++;
    if (i == r->nrefusal) {
        if (i == (int)(sizeof r->refusal / sizeof r->refusal[0])) return;
        r->nrefusal++;
        snprintf(r->refusal[i].key, sizeof r->refusal[i].key, "%s", key);
        snprintf(r->refusal[i].example, sizeof r->refusal[i].example, "%.200s", why);
        cost_layout_format(l, r->refusal[i].layout, sizeof r->refusal[i].layout);
    }
    r->refusal[i].count++;
}

/* Keep the top K (plus the best) in order of score. */
static void keep(struct plan_result *r, int k, const struct plan_candidate *c)
{
    int n = r->nalt;
    if (n == k + 1 && c->score >= r->alt[n - 1].score) return;
    int pos = n < k + 1 ? n++ : k;
    while (pos > 0 && r->alt[pos - 1].score > c->score) {
        r->alt[pos] = r->alt[pos - 1];
        pos--;
    }
    r->alt[pos] = *c;
    r->nalt = n;
}

static double score_of(const struct plan_request *q, const struct cost_layout *l,
                       const struct cost_result *res, int gpus)
{
    if (q->objective == PLAN_THROUGHPUT) return res->step_us;
    /* GPU-hours per trillion tokens */
    double tokens = (double)l->gbs * l->seq_len;
    return gpus * res->step_us / 3.6e9 / (tokens / 1e12);
}

/* Every layout on `gpus` GPUs into r's ranking. An error of the cost model (out of memory) ends
 * the search: a layout silently skipped would change the answer. */
static enum moe_status search_gpus(const struct plan_request *q, int gpus, struct cost_ctx *ctx,
                                   struct plan_result *r, struct moe_error *err)
{
    enum moe_status st;
    const struct mdl_model *m = &q->model;
    const struct cost_layout *fx = &q->fix;
    ctx->gpus = gpus;
    int domain = q->cluster.gpus_used_per_domain;
    static const struct {
        enum cost_recompute rc;
        int zero;
    } rungs[] = {{COST_RECOMPUTE_NONE, 1},
                 {COST_RECOMPUTE_NONE, 2},
                 {COST_RECOMPUTE_SELECTIVE, 1},
                 {COST_RECOMPUTE_SELECTIVE, 2},
                 {COST_RECOMPUTE_NONE, 3},
                 {COST_RECOMPUTE_SELECTIVE, 3},
                 {COST_RECOMPUTE_FULL, 1},
                 {COST_RECOMPUTE_FULL, 2},
                 {COST_RECOMPUTE_FULL, 3},
                 /* no sharding costs memory and saves no time: only when zero=0 is fixed, or the
                  * sharded rungs were not accepted (--runnable) */
                 {COST_RECOMPUTE_NONE, 0},
                 {COST_RECOMPUTE_SELECTIVE, 0},
                 {COST_RECOMPUTE_FULL, 0}};
    for (int tp = 1; tp <= gpus && tp <= q->max_tp; tp *= 2) {
        if (q->bar) moe_progress_update(q->bar, q->bar->done + 1);
        if (gpus % tp || tp > domain || m->attn.heads % tp || q->seq_len % tp ||
            !fixed_ok(fx->tp, tp))
            continue;
        for (int cp = 1; cp <= gpus / tp; cp *= 2) {
            if ((gpus / tp) % cp || !fixed_ok(fx->cp, cp) ||
                (cp > 1 && (q->seq_len % (2 * cp * tp) ||
                            (fx->cp < 0 && q->seq_len / cp < PLAN_CP_MIN_TOKENS))))
                continue;
            for (int pp = 1; pp <= gpus / (tp * cp) && pp <= m->layers; pp++) {
                if ((gpus / (tp * cp)) % pp || !fixed_ok(fx->pp, pp)) continue;
                int dp = gpus / (tp * cp * pp);
                if (!fixed_ok(fx->dp, dp)) continue;
                /* VPP and the micro-batch size in powers of two to 8, or the one --fix names */
                int vpp0 = fx->vpp > 0 ? fx->vpp : 1, vpp1 = fx->vpp > 0 ? fx->vpp : 8;
                int mbs0 = fx->mbs > 0 ? fx->mbs : 1, mbs1 = fx->mbs > 0 ? fx->mbs : 8;
                /* a stage per layer at most (a pipeline layout string may give the embedding and
             * the loss stages of their own) */
                int most = m->layers + (fx->pp_layout[0] ? 2 : 0);
                for (int vpp = vpp0; vpp <= vpp1 && pp * vpp <= most; vpp *= 2) {
                    if ((vpp > 1 && pp == 1) || !fixed_ok(fx->vpp, vpp)) continue;
                    for (int mbs = mbs0; mbs <= mbs1; mbs *= 2) {
                        if (q->gbs % (dp * mbs) || !fixed_ok(fx->mbs, mbs)) continue;
                        int mb = q->gbs / (dp * mbs);
                        if (vpp > 1 && mb % pp) continue;
                        for (int ep = 1; ep <= m->moe.experts; ep++) {
                            if (m->moe.experts % ep || !fixed_ok(fx->ep, ep)) continue;
                            for (int etp = 1; etp <= tp; etp = etp == 1 && tp > 1 ? tp : tp + 1) {
                                if (((long)tp * cp * dp) % ((long)ep * etp) ||
                                    !fixed_ok(fx->etp, etp) || m->moe.intermediate % etp)
                                    continue;
                                bool spans = (long)ep * etp > domain;
                                enum cost_dispatcher cands[3];
                                int nd = 0;
                                if ((int)fx->dispatcher >= 0)
                                    cands[nd++] = fx->dispatcher;
                                else if (ep == 1)
                                    cands[nd++] = COST_DISPATCH_ALLTOALL;
                                else {
                                    cands[nd++] = COST_DISPATCH_DEDUP_GPU;
                                    if (spans) cands[nd++] = COST_DISPATCH_DEDUP_DOMAIN;
                                }
                                for (int d = 0; d < nd; d++) {
                                    enum cost_dispatcher disp = cands[d];
                                    struct cost_layout l = {
                                        .tp = tp,
                                        .cp = cp,
                                        .pp = pp,
                                        .vpp = vpp,
                                        .ep = ep,
                                        .etp = etp,
                                        .dp = dp,
                                        .zero = 1,
                                        .seq_len = q->seq_len,
                                        .mbs = mbs,
                                        .gbs = q->gbs,
                                        .precision = q->precision,
                                        .recompute = COST_RECOMPUTE_NONE,
                                        .dispatcher = disp,
                                        .overlap = fx->overlap,
                                        .mtp = fx->mtp >= 0 ? fx->mtp : m->mtp_layers,
                                        .grad_reduce_bf16 = fx->grad_reduce_bf16,
                                        .moments_bf16 = fx->moments_bf16,
                                        .delay_wgrad = fx->delay_wgrad,
                                        .fp8_params = fx->fp8_params,
                                        .offload = fx->offload,
                                        .graphs = fx->graphs,
                                        .ep_sms = fx->ep_sms,
                                        .act_offload = fx->act_offload};
                                    memcpy(l.pp_layout, fx->pp_layout, sizeof l.pp_layout);
                                    struct moe_error why;
                                    if (cost_layout_check(&l, m, gpus, &why) != MOE_OK) {
                                        r->invalid++;
                                        refused(r, &l, why.message);
                                        continue;
                                    }
                                    char mt_why[256];
                                    if (q->maxtext_mesh &&
                                        !plan_maxtext_layout_ok(&l, m, mt_why, sizeof mt_why)) {
                                        r->invalid++;
                                        struct cost_layout shown = l; /* as --fix pinned it */
                                        if ((int)fx->recompute >= 0) {
                                            shown.recompute = fx->recompute;
                                            shown.recompute_modules = fx->recompute_modules;
                                            shown.recompute_layers = fx->recompute_layers;
                                        }
                                        if (fx->zero >= 0) shown.zero = fx->zero;
                                        refused(r, &shown, mt_why);
                                        continue;
                                    }
                                    int fitted = 0;
                                    for (size_t k = 0; k < sizeof rungs / sizeof rungs[0]; k++) {
                                        l.recompute = rungs[k].rc;
                                        l.recompute_modules = fx->recompute_modules;
                                        /* recompute_layers: blocks recomputed whole, so only
                                         * the full rungs */
                                        if (fx->recompute_layers > 0 &&
                                            l.recompute != COST_RECOMPUTE_FULL)
                                            continue;
                                        l.recompute_layers = fx->recompute_layers;
                                        l.zero = rungs[k].zero;
                                        if (!fixed_ok(fx->zero, l.zero) ||
                                            ((int)fx->recompute >= 0 &&
                                             (int)l.recompute != (int)fx->recompute))
                                            continue;
                                        if (q->accept &&
                                            !q->accept(
                                                &q->model, &l, gpus,
                                                q->cluster.gpu.hbm_bytes * (1.0 - q->headroom),
                                                r->not_accepted_why,
                                                r->not_accepted ? 0 : sizeof r->not_accepted_why)) {
                                            r->not_accepted++;
                                            continue;
                                        }
                                        struct cost_result res;
                                        struct moe_error why;
                                        st = cost_memory(ctx, &l, &res, &why);
                                        if (st == MOE_ERR_INFEASIBLE) { /* mxfp8 on Hopper, ... */
                                            r->invalid++;
                                            refused(r, &l, why.message);
                                            break;
                                        }
                                        if (st != MOE_OK) {
                                            if (err) *err = why;
                                            return st;
                                        }
                                        if (!res.fits) {
                                            if (!r->memory_rejected++) {
                                                snprintf(r->oom_example, sizeof r->oom_example,
                                                         "%s", res.reason);
                                                cost_layout_format(&l, r->oom_layout,
                                                                   sizeof r->oom_layout);
                                            }
                                            continue;
                                        }
                                        if ((st = cost_evaluate(ctx, &l, &res, err))) return st;
                                        r->evaluated++;
                                        struct plan_candidate c = {l, res, gpus,
                                                                   score_of(q, &l, &res, gpus)};
                                        keep(r, q->top_k, &c);
                                        if (q->have_compare && c.score < r->compare_score)
                                            r->compare_beaten_by++;
                                        /* the first rung that fits is the cheapest unless it
                                         * shards gradients (ZeRO-2, 3: collectives in every
                                         * micro-batch): then the next rungs up to one with
                                         * ZeRO-1 or 0 compete with it */
                                        if (l.zero <= 1 || ++fitted == 3) break;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return MOE_OK;
}

/* Expert placement per layer group and the stage split, for the best layout. */
static enum moe_status refine(const struct plan_request *q, struct cost_ctx *ctx,
                              struct plan_result *r, struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    struct cost_layout l = r->best.layout;
    const struct mdl_model *m = &q->model;
    ctx->gpus = r->best.gpus;
    r->even_split = r->best.result;
    /* Placement: one group per routing layer, at most PLAN_MAX_GROUPS (consecutive MoE layers
     * share a group's averaged loads). */
    int moe_layers = mdl_moe_layer_count(m), E = m->moe.experts;
    if (l.ep > 1) {
        int rl = q->routing ? q->routing->layers : 1;
        r->groups = rl < PLAN_MAX_GROUPS ? rl : PLAN_MAX_GROUPS;
        if (r->groups > moe_layers) r->groups = moe_layers;
        double *pick = malloc(sizeof *pick * (size_t)E);
        if (!pick) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        for (int g = 0; g < r->groups; g++) {
            for (int e = 0; e < E; e++) pick[e] = 0.0;
            int n = 0;
            for (int i = 0; i < rl; i++) {
                if (i * r->groups / rl != g) continue;
                for (int e = 0; e < E; e++)
                    pick[e] +=
                        q->routing ? q->routing->pick[(size_t)i * E + e] : (double)m->moe.top_k / E;
                n++;
            }
            for (int e = 0; e < E; e++) pick[e] /= n ? n : 1;
            int rpd = q->cluster.gpus_used_per_domain / l.etp;
            struct plan_placement_problem pr = {
                E,
                l.ep,
                E / l.ep + q->replica_slots,
                pick,
                q->routing && q->routing->pair && rl == 1 ? q->routing->pair : NULL,
                rpd < 1 ? 1 : rpd,
                0.1,
                q->mip_time_limit_s};
            if ((st = plan_place_experts(&pr, &r->placement[g], err))) {
                free(pick);
                return st;
            }
        }
        free(pick);
        r->primary = malloc(sizeof *r->primary * (size_t)E);
        if (!r->primary) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        for (int e = 0; e < E; e++) r->primary[e] = plan_placement_rank(&r->placement[0], e);
        /* Contiguous placement of the same layout, for what placement bought. */
        if ((st = cost_evaluate(ctx, &l, &r->contiguous, err))) return st;
        ctx->placement = r->primary;
    }
    /* Stage split. */
    int stages = l.pp * l.vpp;
    double *w = malloc(sizeof *w * (size_t)m->layers), a = 0, b = 0;
    if (!w) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if ((st = cost_block_times(ctx, &l, w, &a, &b, err))) {
        free(w);
        return st;
    }
    if (l.pp_layout[0]) { /* the layout given is the split */
        struct cost_stage map[COST_MAX_STAGES];
        st = cost_pp_layout_parse(l.pp_layout, stages, m->layers, l.mtp, map, err);
        for (int v = 0; st == MOE_OK && v < stages; v++) r->split.stage_layers[v] = map[v].count;
        double even = 0.0;
        for (int i = 0; i < m->layers; i++) even += w[i];
        r->split.busiest_us = r->split.even_busiest_us = even; /* no comparison made */
        snprintf(r->split.mip.status, sizeof r->split.mip.status,
                 "the pipeline layout given (pp_layout)");
    } else if (q->maxtext_mesh && stages > 1) { /* MaxText: the same layers on every stage */
        cost_even_split(m->layers, stages, r->split.stage_layers);
        double even = 0.0;
        for (int i = 0; i < m->layers; i++) even += w[i];
        r->split.busiest_us = r->split.even_busiest_us = even; /* no comparison made */
        snprintf(r->split.mip.status, sizeof r->split.mip.status,
                 "MaxText splits the layers evenly (--emit maxtext)");
    } else {
        st = plan_split_stages(w, m->layers, stages, l.pp, a, b, q->mip_time_limit_s, &r->split,
                               err);
    }
    free(w);
    if (st != MOE_OK) return st;
    ctx->stage_layers = r->split.stage_layers;
    struct cost_result res;
    if ((st = cost_evaluate(ctx, &l, &res, err))) return st;
    /* A split that moves activations onto the first stage may not fit: keep the even one. */
    if (!res.fits && !l.pp_layout[0]) {
        ctx->stage_layers = NULL;
        cost_even_split(m->layers, stages, r->split.stage_layers);
        if ((st = cost_evaluate(ctx, &l, &res, err))) return st;
        snprintf(r->split.mip.status, sizeof r->split.mip.status,
                 "split did not fit in memory: even split kept");
    } else if (!l.pp_layout[0] && !q->maxtext_mesh && stages > 1) {
        /* The integer program balances the busiest rank's work; the schedule can still run the
         * even split faster (a lighter stage idles where the 1F1B order makes it wait): the step
         * through the schedule decides. */
        const int *split = ctx->stage_layers;
        struct cost_result even;
        ctx->stage_layers = NULL;
        if ((st = cost_evaluate(ctx, &l, &even, err))) return st;
        if (even.fits && even.step_us < res.step_us) {
            cost_even_split(m->layers, stages, r->split.stage_layers);
            r->split.busiest_us = r->split.even_busiest_us;
            res = even;
            snprintf(r->split.mip.status, sizeof r->split.mip.status,
                     "the even split is faster through the schedule: kept");
        } else {
            ctx->stage_layers = split;
        }
    }
    r->best.result = res;
    r->best.score = score_of(q, &l, &res, r->best.gpus);
    /* What dedup bought: the same plan with the plain all-to-all. */
    struct cost_layout plain = l;
    plain.dispatcher = COST_DISPATCH_ALLTOALL;
    plain.ep_sms = 0; /* the all-to-all runs no kernels of its own */
    if ((st = cost_evaluate(ctx, &plain, &r->no_dedup, err))) return st;
    /* Where dedup saves nothing (each token's experts on distinct GPUs), the plain all-to-all is
     * the simpler plan. */
    if (l.dispatcher != COST_DISPATCH_ALLTOALL && r->no_dedup.step_us <= res.step_us &&
        r->no_dedup.fits && (int)q->fix.dispatcher < 0) { /* unless --fix names the dispatcher */
        r->best.layout = plain;
        r->best.result = r->no_dedup;
        r->best.score = score_of(q, &plain, &r->no_dedup, r->best.gpus);
    }
    return MOE_OK;
}

static void binding_constraint(const struct plan_request *q, struct plan_result *r)
{
    const struct cost_layout *l = &r->best.layout;
    const struct cost_result *res = &r->best.result;
    /* memory binds where the search itself chose recompute or ZeRO (not where --fix did) */
    bool rc = l->recompute != COST_RECOMPUTE_NONE && (int)q->fix.recompute < 0;
    bool zero = l->zero > 1 && q->fix.zero < 0;
    if (rc || zero) {
        snprintf(r->binding, sizeof r->binding,
                 "memory: no layout fits without %s%s%s (%.0f%% of HBM used)",
                 rc ? cost_recompute_names[l->recompute] : "",
                 rc && zero ? " recompute and "
                 : rc       ? " recompute"
                            : "",
                 zero ? (l->zero == 2 ? "ZeRO-2" : "ZeRO-3") : "",
                 100 * res->memory_total_bytes / q->cluster.gpu.hbm_bytes);
        return;
    }
    int worst = COST_BUBBLE;
    for (int p = COST_DISPATCH; p < COST_STEP; p++) {
        bool comm = p == COST_DISPATCH || p == COST_COMBINE || p == COST_TP_COMM ||
                    p == COST_DP_GRAD_SYNC || p == COST_BUBBLE;
        if (comm && res->exposed_us[p] > res->exposed_us[worst]) worst = p;
    }
    double share = res->exposed_us[worst] / res->step_us;
    if (share > 0.1)
        snprintf(r->binding, sizeof r->binding, "%s: %.0f%% of the step is exposed %s",
                 worst == COST_BUBBLE ? "pipeline" : "communication", 100 * share,
                 cost_phase_names[worst]);
    else
        snprintf(r->binding, sizeof r->binding,
                 "compute: exposed communication and bubble are under 10%% of the step");
}

void plan_fix_none(struct cost_layout *fix, int seq_len)
{
    *fix = (struct cost_layout){.tp = -1,
                                .cp = -1,
                                .pp = -1,
                                .vpp = -1,
                                .ep = -1,
                                .etp = -1,
                                .dp = -1,
                                .zero = -1,
                                .seq_len = seq_len,
                                .mbs = -1,
                                .gbs = -1,
                                .precision = COST_BF16,
                                .recompute = (enum cost_recompute) - 1,
                                .dispatcher = (enum cost_dispatcher) - 1,
                                .overlap = true,
                                .mtp = -1};
}

/* plan_search's body, into r: the search over GPU counts, then the placement and split of the
 * best layout. */
static enum moe_status search_all(const struct plan_request *q, struct cost_ctx *ctx,
                                  struct plan_result *r, double t0, struct moe_error *err)
{
    if (q->have_compare) { /* the layout to set beside the plan, costed first */
        struct moe_error why;
        if (cost_evaluate(ctx, &q->compare, &r->compare, &why) != MOE_OK)
            return moe_error_set(err, why.status, "--compare: %s", why.message);
        r->compare_score = score_of(q, &q->compare, &r->compare, q->gpus);
    }
    if (q->bar) { /* one step per tensor-parallel degree of each GPU count searched */
        uint64_t steps = 0;
        for (int n = q->gpus; n >= 1; n /= 2) {
            for (int tp = 1; tp <= n && tp <= q->max_tp; tp *= 2) steps++;
            if (q->objective != PLAN_COST || n / 2 < q->cluster.gpus_used_per_domain / 8) break;
        }
        q->bar->total = steps;
    }
    enum moe_status st = search_gpus(q, q->gpus, ctx, r, err);
    if (q->objective == PLAN_COST)
        for (int n = q->gpus / 2;
             st == MOE_OK && n >= 1 && n >= q->cluster.gpus_used_per_domain / 8; n /= 2)
            st = search_gpus(q, n, ctx, r, err);
    if (q->bar) moe_progress_finish(q->bar);
    if (st != MOE_OK) return st;
    r->search_s = moe_time_now_s() - t0;
    if (r->nalt == 0 && r->not_accepted > 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "no layout this build runs: %ld layouts were left out (%s), %ld "
                             "were out of memory",
                             r->not_accepted, r->not_accepted_why, r->memory_rejected);
    if (r->nalt == 0 && r->memory_rejected == 0 && r->invalid == 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "no layout to try: no tp, pp, vpp, ep and micro-batch size fit %d "
                             "GPUs, %d layers, a global batch of %d and the --fix choices%s%s",
                             q->gpus, q->model.layers, q->gbs, q->fix_text[0] ? ": " : "",
                             q->fix_text);
    if (r->nalt == 0 && r->memory_rejected == 0) {
        int top = 0;
        for (int i = 1; i < r->nrefusal; i++)
            if (r->refusal[i].count > r->refusal[top].count) top = i;
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "no layout fits: all %ld layouts tried are invalid; the commonest "
                             "reason (%ld of them): %s (e.g. %s)",
                             r->invalid, r->refusal[top].count, r->refusal[top].example,
                             r->refusal[top].layout);
    }
    if (r->nalt == 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "no layout fits: %ld valid layout%s out of memory (e.g. %s: %s), %ld "
                             "invalid; more GPUs, a shorter sequence, a smaller global batch or "
                             "--fix choices that allow sharding may help",
                             r->memory_rejected, r->memory_rejected == 1 ? " is" : "s are",
                             r->oom_layout, r->oom_example, r->invalid);
    r->best = r->alt[0];
    memmove(r->alt, r->alt + 1, sizeof r->alt[0] * (size_t)(r->nalt - 1));
    r->nalt--;
    st = refine(q, ctx, r, err);
    if (st != MOE_OK) {
        plan_result_free(r);
        return st;
    }
    binding_constraint(q, r);
    return MOE_OK;
}

enum moe_status plan_search(const struct plan_request *q, struct plan_result *out,
                            struct moe_error *err)
{
    double t0 = moe_time_now_s();
    struct plan_result r;
    memset(&r, 0, sizeof r);
    if (q->gpus < 1 || q->gpus > q->cluster.gpus_usable)
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "%d GPUs requested, %s has %d usable",
                             q->gpus, q->cluster.name, q->cluster.gpus_usable);
    if (q->top_k < 0 || q->top_k >= PLAN_MAX_ALT)
        return moe_error_set(err, MOE_ERR_USAGE, "--top must be in [0, %d]", PLAN_MAX_ALT - 1);
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, &q->model, &q->cluster, &q->cal, q->gpus);
    ctx.routing = q->routing;
    ctx.memory_headroom = q->headroom;
    ctx.memo = cost_traffic_memo_create(); /* NULL (no memory): every layout costed afresh */
    enum moe_status st = search_all(q, &ctx, &r, t0, err);
    cost_traffic_memo_destroy(ctx.memo);
    if (st != MOE_OK) return st;
    r.total_s = moe_time_now_s() - t0;
    *out = r;
    return MOE_OK;
}
