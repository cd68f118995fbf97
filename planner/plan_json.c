/*
 * plan_json.c: plan.json ("moeplan.plan", documented in planner/README.md): writing and checking.
 *
 * A plan is self-contained: the model it was made for (in our model schema), the layout, every
 * rank's coordinates and NVLink domain, the layer split, the expert placement per layer group,
 * the dispatch buffers, the prediction, and the alternatives with why each lost. The executor
 * reads it and never searches.
 */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *phases_json(const struct cost_result *r)
{
    json_t *o = json_object();
    for (int p = 0; p < COST_NPHASES; p++) {
        json_t *ph = json_object();
        json_object_set_new(ph, "compute_us", json_real(r->compute_us[p]));
        json_object_set_new(ph, "comm_us", json_real(r->comm_us[p]));
        json_object_set_new(ph, "exposed_us", json_real(r->exposed_us[p]));
        json_object_set_new(o, cost_phase_names[p], ph);
    }
    return o;
}

static json_t *mip_json(const struct plan_mip_report *m)
{
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(m->status));
    json_object_set_new(o, "optimal", json_boolean(m->optimal));
    json_object_set_new(o, "gap", isfinite(m->gap) ? json_real(m->gap) : json_null());
    json_object_set_new(o, "objective", json_real(m->objective));
    json_object_set_new(o, "seconds", json_real(m->seconds));
    json_object_set_new(o, "binaries", json_integer(m->binaries));
    return o;
}

/* Why an alternative lost: its step against the best's, and the phase that grew most. */
static void why_lost(const struct plan_result *r, const struct plan_candidate *c, char *buf,
                     size_t cap)
{
    double grow;
    int worst = plan_phase_grown(&r->best.result, &c->result, &grow);
    snprintf(buf, cap, "%+.1f%% score; %s %+.1f ms", 100.0 * (c->score / r->best.score - 1.0),
             cost_phase_names[worst], grow / 1e3);
}

enum moe_status plan_save(const struct plan_request *q, const struct plan_result *r,
                          const char *file, struct moe_error *err)
{
    const struct cost_layout *l = &r->best.layout;
    const struct mdl_model *m = &q->model;
    const struct topo_cluster *c = &q->cluster;
    int gpus = r->best.gpus, edp = cost_layout_edp(l);
    json_t *root = json_object();
    char *model_text = mdl_model_to_json_text(m);
    json_t *model = model_text ? json_loads(model_text, 0, NULL) : NULL;
    free(model_text);
    if (!root || !model) {
        json_decref(root);
        json_decref(model);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory writing %s", file);
    }
    json_object_del(model, "schema");
    json_object_del(model, "version");

    json_t *in = json_object();
    json_object_set_new(in, "model", json_string(q->model_spec));
    json_object_set_new(in, "cluster", json_string(q->cluster_spec));
    json_object_set_new(in, "cluster_name", json_string(c->name));
    json_object_set_new(in, "gpu", json_string(c->gpu.name));
    json_object_set_new(in, "gpus", json_integer(gpus));
    json_object_set_new(in, "gbs", json_integer(l->gbs));
    json_object_set_new(in, "seq_len", json_integer(l->seq_len));
    json_object_set_new(in, "routing", json_string(q->routing_spec));
    json_object_set_new(in, "calibration", json_string(q->cal.source));
    json_object_set_new(in, "calibrated", json_boolean(q->cal.calibrated));
    json_object_set_new(in, "objective",
                        json_string(q->objective == PLAN_COST ? "cost" : "throughput"));
    json_object_set_new(root, "inputs", in);
    json_object_set_new(root, "model", model);

    json_t *lay = json_object();
    json_object_set_new(lay, "tp", json_integer(l->tp));
    json_object_set_new(lay, "cp", json_integer(l->cp));
    json_object_set_new(lay, "pp", json_integer(l->pp));
    json_object_set_new(lay, "vpp", json_integer(l->vpp));
    json_object_set_new(lay, "ep", json_integer(l->ep));
    json_object_set_new(lay, "etp", json_integer(l->etp));
    json_object_set_new(lay, "dp", json_integer(l->dp));
    json_object_set_new(lay, "edp", json_integer(edp));
    json_object_set_new(lay, "zero", json_integer(l->zero));
    json_object_set_new(lay, "mbs", json_integer(l->mbs));
    json_object_set_new(lay, "gbs", json_integer(l->gbs));
    json_object_set_new(lay, "micro_batches", json_integer(cost_layout_micro_batches(l)));
    json_object_set_new(lay, "seq_len", json_integer(l->seq_len));
    json_object_set_new(lay, "precision", json_string(cost_precision_names[l->precision]));
    json_object_set_new(lay, "recompute", json_string(cost_recompute_names[l->recompute]));
    json_object_set_new(lay, "dispatcher", json_string(cost_dispatcher_names[l->dispatcher]));
    json_object_set_new(lay, "overlap", json_boolean(l->overlap));
    char mods[160];
    cost_rc_modules_format(cost_layout_rc(l), "+", mods, sizeof mods);
    if (mods[0]) json_object_set_new(lay, "recompute_modules", json_string(mods));
    if (l->recompute == COST_RECOMPUTE_FULL)
        json_object_set_new(lay, "recompute_layers", json_integer(l->recompute_layers));
    json_object_set_new(lay, "mtp", json_integer(l->mtp));
    json_object_set_new(lay, "grad_reduce", json_string(l->grad_reduce_bf16 ? "bf16" : "fp32"));
    json_object_set_new(lay, "moments", json_string(l->moments_bf16 ? "bf16" : "fp32"));
    json_object_set_new(lay, "delay_wgrad", json_boolean(l->delay_wgrad));
    json_object_set_new(lay, "fp8_params", json_boolean(l->fp8_params));
    json_object_set_new(lay, "offload", json_real(l->offload));
    json_object_set_new(lay, "cuda_graphs", json_string(cost_graphs_names[l->graphs]));
    if (l->ep_sms) json_object_set_new(lay, "ep_sms", json_integer(l->ep_sms));
    if (l->act_offload) {
        char off[160];
        cost_off_modules_format(l->act_offload, "+", off, sizeof off);
        json_object_set_new(lay, "act_offload", json_string(off));
    }
    if (l->pp_layout[0]) json_object_set_new(lay, "pp_layout", json_string(l->pp_layout));
    json_object_set_new(root, "layout", lay);

    /* Ranks, as a rule rather than a list (a plan's size must not grow with the GPUs): see
     * plan_rank_of. */
    json_t *ranks = json_object();
    json_object_set_new(ranks, "order", json_string(PLAN_RANK_ORDER));
    json_object_set_new(ranks, "gpus_per_domain", json_integer(c->gpus_used_per_domain));
    json_object_set_new(ranks, "nodes_per_domain", json_integer(c->nodes_per_domain));
    json_object_set_new(ranks, "gpus_per_node", json_integer(c->gpus_per_node));
    json_object_set_new(root, "ranks", ranks);

    json_t *stages = json_object(), *counts = json_array(), *rank_of = json_array();
    int S = l->pp * l->vpp;
    for (int s = 0; s < S; s++) {
        json_array_append_new(counts, json_integer(r->split.stage_layers[s]));
        json_array_append_new(rank_of, json_integer(s % l->pp));
    }
    json_object_set_new(stages, "layers_per_virtual_stage", counts);
    json_object_set_new(stages, "pp_rank_of_virtual_stage", rank_of);
    json_object_set_new(stages, "busiest_rank_us", json_real(r->split.busiest_us));
    json_object_set_new(stages, "even_split_busiest_rank_us", json_real(r->split.even_busiest_us));
    json_object_set_new(stages, "mip", mip_json(&r->split.mip));
    json_object_set_new(root, "stages", stages);

    /* Experts: per group, the experts each EP rank holds, with their token shares. */
    json_t *experts = json_object(), *groups = json_array(), *layer_group = json_array();
    json_object_set_new(experts, "experts", json_integer(m->moe.experts));
    json_object_set_new(experts, "ep", json_integer(l->ep));
    for (int g = 0; g < r->groups; g++) {
        const struct plan_placement *pl = &r->placement[g];
        json_t *o = json_object(), *rk = json_array();
        for (int k = 0; k < pl->ranks; k++) json_array_append_new(rk, json_array());
        for (int e = 0; e < pl->experts; e++) /* each rank's list in expert order */
            for (int c = pl->first[e]; c < pl->first[e + 1]; c++) {
                double sh = pl->copy[c].share;
                json_t *list = json_array_get(rk, (size_t)pl->copy[c].rank);
                if (sh <= 0) continue;
                if (sh >= 1.0 - 1e-12) {
                    json_array_append_new(list, json_integer(e));
                } else {
                    json_t *rep = json_object();
                    json_object_set_new(rep, "expert", json_integer(e));
                    json_object_set_new(rep, "share", json_real(sh));
                    json_array_append_new(list, rep);
                }
            }
        json_object_set_new(o, "ranks", rk);
        json_object_set_new(
            o, "hottest_over_balanced",
            json_real(pl->balanced_load > 0 ? pl->max_load / pl->balanced_load : 1));
        json_object_set_new(
            o, "greedy_hottest_over_balanced",
            json_real(pl->balanced_load > 0 ? pl->greedy_max_load / pl->balanced_load : 1));
        json_object_set_new(o, "cross_domain_coactivation", json_real(pl->traffic));
        json_object_set_new(o, "milp_used", json_boolean(pl->used_mip));
        json_object_set_new(o, "mip", mip_json(&pl->mip));
        json_array_append_new(groups, o);
    }
    /* Consecutive MoE layers share a group: MoE layer i of n is in group i x groups / n. */
    int mi = 0, moe_layers = mdl_moe_layer_count(m);
    for (int i = 0; i < m->layers; i++)
        json_array_append_new(layer_group,
                              mdl_layer_is_moe(m, i) && r->groups
                                  ? json_integer((json_int_t)mi++ * r->groups / moe_layers)
                                  : json_integer(-1));
    json_object_set_new(experts, "groups", groups);
    json_object_set_new(experts, "group_of_layer", layer_group);
    json_object_set_new(root, "experts", experts);

    /* Dropless dispatch buffers: a factor of the balanced load, with a device overflow flag. */
    json_t *disp = json_object();
    double T = cost_layout_tokens(l);
    double balanced_rows = T * m->moe.top_k * l->etp;
    json_object_set_new(disp, "mode", json_string(cost_dispatcher_names[l->dispatcher]));
    json_object_set_new(disp, "buffer_factor", json_real(2.0));
    json_object_set_new(disp, "predicted_bytes_per_gpu_per_layer",
                        json_real(r->best.result.dispatch_bytes_per_gpu));
    json_object_set_new(disp, "predicted_scale_out_bytes_per_gpu_per_layer",
                        json_real(r->best.result.dispatch_scale_out_bytes));
    json_object_set_new(disp, "recv_capacity_rows_per_rank",
                        json_integer((json_int_t)ceil(2.0 * balanced_rows)));
    json_object_set_new(disp, "balanced_rows_per_rank", json_real(balanced_rows));
    json_object_set_new(
        disp, "on_overflow",
        json_string("stop: the step is not applied and the run exits naming the layer"));
    json_object_set_new(root, "dispatch", disp);

    const struct cost_result *res = &r->best.result;
    json_t *pred = json_object(), *mem = json_object();
    json_object_set_new(pred, "phases", phases_json(res));
    json_object_set_new(pred, "step_us", json_real(res->step_us));
    json_object_set_new(pred, "tokens_per_s_per_gpu", json_real(res->tokens_per_s_per_gpu));
    json_object_set_new(pred, "model_tflops_per_gpu", json_real(res->model_tflops_per_gpu));
    json_object_set_new(pred, "mfu", json_real(res->mfu));
    json_object_set_new(pred, "bubble_fraction", json_real(res->bubble_fraction));
    for (int k = 0; k < COST_NMEM; k++)
        json_object_set_new(mem, cost_mem_names[k], json_real(res->memory_bytes[k]));
    json_object_set_new(mem, "total", json_real(res->memory_total_bytes));
    json_object_set_new(mem, "capacity", json_real(res->memory_capacity_bytes));
    json_object_set_new(pred, "memory_bytes", mem);
    json_object_set_new(pred, "fits", json_boolean(res->fits));
    json_object_set_new(pred, "no_dedup_step_us", json_real(r->no_dedup.step_us));
    json_object_set_new(pred, "contiguous_placement_step_us",
                        json_real(r->groups ? r->contiguous.step_us : res->step_us));
    json_object_set_new(pred, "even_split_step_us", json_real(r->even_split.step_us));
    json_object_set_new(root, "prediction", pred);

    json_t *alts = json_array();
    for (int i = 0; i < r->nalt; i++) {
        char lay_s[COST_LAYOUT_TEXT_MAX], why[256];
        cost_layout_format(&r->alt[i].layout, lay_s, sizeof lay_s);
        why_lost(r, &r->alt[i], why, sizeof why);
        json_t *o = json_object();
        json_object_set_new(o, "layout", json_string(lay_s));
        json_object_set_new(o, "gpus", json_integer(r->alt[i].gpus));
        json_object_set_new(o, "step_us", json_real(r->alt[i].result.step_us));
        json_object_set_new(o, "why_it_lost", json_string(why));
        json_array_append_new(alts, o);
    }
    json_object_set_new(root, "alternatives", alts);
    json_t *search = json_object();
    json_object_set_new(search, "evaluated", json_integer(r->evaluated));
    json_object_set_new(search, "memory_rejected", json_integer(r->memory_rejected));
    json_object_set_new(search, "invalid", json_integer(r->invalid));
    json_object_set_new(search, "search_seconds", json_real(r->search_s));
    json_object_set_new(search, "total_seconds", json_real(r->total_s));
    json_object_set_new(search, "binding_constraint", json_string(r->binding));
    json_object_set_new(root, "search", search);
    enum moe_status st = moe_json_write_atomic(file, root, PLAN_SCHEMA, PLAN_SCHEMA_VERSION, err);
    json_decref(root);
    return st;
}

void plan_rank_of(const struct cost_layout *l, const struct plan_rank_map *map, int g,
                  struct plan_rank *r)
{
    int in_stage = g % (l->tp * l->cp * l->dp), dom = g / map->gpus_per_domain;
    int in_dom = g % map->gpus_per_domain;
    r->domain = dom;
    r->node = dom * map->nodes_per_domain + in_dom / map->gpus_per_node;
    r->local_gpu = in_dom % map->gpus_per_node;
    r->tp = g % l->tp;
    r->cp = in_stage / l->tp % l->cp;
    r->dp = in_stage / (l->tp * l->cp);
    r->pp = g / (l->tp * l->cp * l->dp);
    r->ep = (in_stage / l->etp) % l->ep;
    r->edp = in_stage / (l->etp * l->ep);
}

/* The plan's "ranks": the rule that gives each GPU its domain, node and coordinates. */
static enum moe_status load_ranks(const struct moe_jval *root, struct plan_file *p,
                                  struct moe_error *err)
{
    struct moe_jval ranks;
    char order[128];
    struct plan_rank_map *map = &p->rank_map;
    enum moe_status st;
    if ((st = moe_jval_object(root, "ranks", true, &ranks, NULL, err)) ||
        (st = moe_jval_str(&ranks, "order", true, NULL, order, sizeof order, err)) ||
        (st = moe_jval_int32(&ranks, "gpus_per_domain", true, 0, 1, PLAN_MAX_GPUS,
                             &map->gpus_per_domain, err)) ||
        (st = moe_jval_int32(&ranks, "nodes_per_domain", true, 0, 1, PLAN_MAX_GPUS,
                             &map->nodes_per_domain, err)) ||
        (st = moe_jval_int32(&ranks, "gpus_per_node", true, 0, 1, PLAN_MAX_GPUS,
                             &map->gpus_per_node, err)))
        return st;
    if (strcmp(order, PLAN_RANK_ORDER))
        return moe_jval_error(&ranks, "order", err, "must be \"%s\"", PLAN_RANK_ORDER);
    if ((int64_t)map->nodes_per_domain * map->gpus_per_node < map->gpus_per_domain)
        return moe_jval_error(&ranks, "gpus_per_domain", err,
                              "%d GPUs used per domain, but a domain of %d nodes has %lld",
                              map->gpus_per_domain, map->nodes_per_domain,
                              (long long)map->nodes_per_domain * map->gpus_per_node);
    p->rank = calloc((size_t)p->gpus, sizeof *p->rank);
    if (!p->rank) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int g = 0; g < p->gpus; g++) plan_rank_of(&p->layout, map, g, &p->rank[g]);
    return MOE_OK;
}

/* The plan's "stages": blocks per virtual stage, at least one each, all of the model's. */
static enum moe_status load_stages(const struct moe_jval *root, struct plan_file *p,
                                   struct moe_error *err)
{
    struct moe_jval stages, counts;
    enum moe_status st;
    if ((st = moe_jval_object(root, "stages", true, &stages, NULL, err)) ||
        (st = moe_jval_array(&stages, "layers_per_virtual_stage", true, &counts, NULL, err)))
        return st;
    int V = p->layout.pp * p->layout.vpp, sum = 0;
    if ((int)moe_jval_len(&counts) != V)
        return moe_jval_error(&stages, "layers_per_virtual_stage", err,
                              "%zu virtual stages, the layout has pp x vpp = %d",
                              moe_jval_len(&counts), V);
    p->stage_layers = malloc(sizeof *p->stage_layers * (size_t)V);
    if (!p->stage_layers) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int v = 0; v < V; v++) {
        int64_t n;
        if ((st = moe_jval_at_int(&counts, (size_t)v, 1, p->model.layers, &n, err))) return st;
        p->stage_layers[v] = (int)n;
        sum += (int)n;
    }
    if (sum != p->model.layers)
        return moe_jval_error(&stages, "layers_per_virtual_stage", err,
                              "the stages hold %d blocks, the model %d", sum, p->model.layers);
    /* the pp rank of each virtual stage: Megatron's interleaving, v mod pp, where it is given */
    struct moe_jval rank_of;
    bool have = false;
    if ((st = moe_jval_array(&stages, "pp_rank_of_virtual_stage", false, &rank_of, &have, err)))
        return st;
    if (have && (int)moe_jval_len(&rank_of) != V)
        return moe_jval_error(&stages, "pp_rank_of_virtual_stage", err,
                              "%zu entries, the layout has pp x vpp = %d", moe_jval_len(&rank_of),
                              V);
    for (int v = 0; have && v < V; v++) {
        int64_t r;
        if ((st = moe_jval_at_int(&rank_of, (size_t)v, 0, p->layout.pp - 1, &r, err))) return st;
        if (r != v % p->layout.pp)
            return moe_jval_error(&stages, "pp_rank_of_virtual_stage", err,
                                  "virtual stage %d on pp rank %lld: it runs on rank %d", v,
                                  (long long)r, v % p->layout.pp);
    }
    return MOE_OK;
}

/* Each placement group: ep lists of expert entries (an id, or {"expert", "share"} for a replica),
 * every expert's shares adding up to 1. */
static enum moe_status check_groups(const struct moe_jval *groups, int E, int ep,
                                    struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    for (size_t g = 0; g < moe_jval_len(groups); g++) {
        struct moe_jval grp, rk;
        if ((st = moe_jval_at_object(groups, g, &grp, err))) return st;
        if ((st = moe_jval_array(&grp, "ranks", true, &rk, NULL, err))) return st;
        if ((int64_t)moe_jval_len(&rk) != ep)
            return moe_jval_error(&grp, "ranks", err, "%zu EP ranks, the layout has %d",
                                  moe_jval_len(&rk), ep);
        double *served = calloc((size_t)E, sizeof *served);
        if (!served) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        for (size_t k = 0; k < moe_jval_len(&rk) && st == MOE_OK; k++) {
            json_t *list = json_array_get(rk.json, k);
            if (!json_is_array(list)) {
                st = moe_jval_error(&rk, NULL, err, "rank %zu: a list of experts", k);
                break;
            }
            for (size_t i = 0; i < json_array_size(list); i++) {
                json_t *it = json_array_get(list, i);
                json_t *ej = json_is_object(it) ? json_object_get(it, "expert") : it;
                json_t *sj = json_is_object(it) ? json_object_get(it, "share") : NULL;
                double share = sj ? (json_is_number(sj) ? json_number_value(sj) : -1.0) : 1.0;
                json_int_t e = json_is_integer(ej) ? json_integer_value(ej) : -1;
                if (e < 0 || e >= E || !(share > 0 && share <= 1)) {
                    st = moe_jval_error(&rk, NULL, err,
                                        "rank %zu: entry %zu is not an expert in [0, %d) with a "
                                        "share in (0, 1]",
                                        k, i, E);
                    break;
                }
                served[e] += share;
            }
        }
        for (int e = 0; e < E && st == MOE_OK; e++)
            if (fabs(served[e] - 1.0) > 1e-6)
                st = moe_jval_error(&grp, "ranks", err,
                                    "expert %d is placed with total share %g, not 1", e, served[e]);
        free(served);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* The plan's "experts" and "dispatch": the EP rank of each expert of each MoE layer. */
static enum moe_status load_placement(const struct moe_jval *root, struct plan_file *p,
                                      struct moe_error *err)
{
    struct moe_jval experts, groups, of_layer, disp;
    const struct mdl_model *m = &p->model;
    int E = m->moe.experts, L = m->layers;
    enum moe_status st;
    if ((st = moe_jval_object(root, "experts", true, &experts, NULL, err)) ||
        (st = moe_jval_array(&experts, "groups", true, &groups, NULL, err)) ||
        (st = moe_jval_object(root, "dispatch", true, &disp, NULL, err)) ||
        (st = moe_jval_num(&disp, "buffer_factor", true, 2.0, 1.0, 1e6, &p->buffer_factor, err)) ||
        (st = moe_jval_num(&disp, "predicted_bytes_per_gpu_per_layer", false, 0.0, 0.0, 1e18,
                           &p->dispatch_bytes.nvlink, err)) ||
        (st = moe_jval_num(&disp, "predicted_scale_out_bytes_per_gpu_per_layer", false, 0.0, 0.0,
                           1e18, &p->dispatch_bytes.scale_out, err)))
        return st;
    p->dispatch_bytes.nvlink -= p->dispatch_bytes.scale_out; /* the total, less scale-out */
    if (p->dispatch_bytes.nvlink < 0) p->dispatch_bytes.nvlink = 0;
    if ((int64_t)L * E > PLAN_MAX_PLACEMENT)
        return moe_jval_error(root, "model", err,
                              "%d layers x %d experts: more placements (one per layer and expert) "
                              "than the %d a plan may hold",
                              L, E, PLAN_MAX_PLACEMENT);
    p->placement = malloc(sizeof *p->placement * (size_t)L * (size_t)(E > 0 ? E : 1));
    if (!p->placement) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    int ng = (int)moe_jval_len(&groups);
    if (ng == 0 && p->layout.ep > 1)
        return moe_jval_error(&experts, "groups", err, "ep = %d but no expert placement",
                              p->layout.ep);
    if ((st = check_groups(&groups, E, p->layout.ep, err))) return st;
    if (ng == 0 || E == 0) { /* one EP rank: every expert there */
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++) p->placement[l * E + e] = mdl_layer_is_moe(m, l) ? 0 : -1;
        return MOE_OK;
    }
    int64_t pe, pep;
    if ((st = moe_jval_int(&experts, "ep", false, p->layout.ep, 1, MDL_MAX_EXPERTS, &pep, err)))
        return st;
    if (pep != p->layout.ep)
        return moe_jval_error(&experts, "ep", err, "%lld, but the layout's ep is %d",
                              (long long)pep, p->layout.ep);
    if ((st = moe_jval_int(&experts, "experts", true, 0, 1, 1 << 16, &pe, err))) return st;
    if (pe != E) /* the placement's expert ids index the model's experts (found by fuzz_plan) */
        return moe_jval_error(&experts, "experts", err, "%lld experts placed, the model has %d",
                              (long long)pe, E);
    if ((st = moe_jval_array(&experts, "group_of_layer", true, &of_layer, NULL, err))) return st;
    if ((int)moe_jval_len(&of_layer) != L)
        return moe_jval_error(&experts, "group_of_layer", err, "%zu entries for %d layers",
                              moe_jval_len(&of_layer), L);
    for (int l = 0; l < L; l++) {
        int64_t g;
        if ((st = moe_jval_at_int(&of_layer, (size_t)l, -1, ng - 1, &g, err))) return st;
        if ((g < 0) != !mdl_layer_is_moe(m, l))
            return moe_jval_error(&experts, "group_of_layer", err,
                                  "layer %d: group %lld, but the layer is %s", l, (long long)g,
                                  mdl_layer_is_moe(m, l) ? "MoE" : "dense");
        for (int e = 0; e < E; e++) p->placement[l * E + e] = -1;
        if (g < 0) continue;
        struct moe_jval grp, rk;
        if ((st = moe_jval_at_object(&groups, (size_t)g, &grp, err)) ||
            (st = moe_jval_array(&grp, "ranks", true, &rk, NULL, err)))
            return st;
        /* check_groups checked the entries: each expert's shares add up to 1 */
        for (size_t k = 0; k < moe_jval_len(&rk); k++) {
            json_t *list = json_array_get(rk.json, k);
            for (size_t i = 0; i < json_array_size(list); i++) {
                json_t *it = json_array_get(list, i);
                json_t *ej = json_is_object(it) ? json_object_get(it, "expert") : it;
                double share =
                    json_is_object(it) ? json_number_value(json_object_get(it, "share")) : 1.0;
                int e = (int)json_integer_value(ej);
                p->placement[l * E + e] = share >= 1.0 - 1e-9 ? (int)k : -2;
            }
        }
    }
    return MOE_OK;
}

/* Every check of a plan, in one place: `moeplan check`, `run`, `report` and `calibrate` read
 * plans through it, so that a plan one of them accepts, all of them do. */
static enum moe_status plan_from_doc(const struct moe_jdoc *doc, struct plan_file *p,
                                     struct moe_error *err)
{
    struct moe_jval root, in, lay, model, pred, phases, ph, mem;
    char schema[64];
    int version, v;
    enum moe_status st;
    if ((st = moe_jdoc_schema(doc, schema, sizeof schema, &version, err)) ||
        (st = moe_jdoc_root(doc, &root, err)))
        return st;
    if (strcmp(schema, PLAN_SCHEMA) != 0)
        return moe_jval_error(&root, "schema", err, "expected \"%s\", got \"%s\"", PLAN_SCHEMA,
                              schema);
    if (version != PLAN_SCHEMA_VERSION)
        return moe_jval_error(&root, "version", err,
                              "plan version %d; this moeplan reads version %d (plan again)",
                              version, PLAN_SCHEMA_VERSION);
    if ((st = moe_jval_object(&root, "inputs", true, &in, NULL, err)) ||
        (st = moe_jval_object(&root, "layout", true, &lay, NULL, err)))
        return st;
    /* every key of the layout is one this reader knows: a misspelt one ("Overlap") would
     * otherwise leave its default silently in force */
    static const char *const layout_keys[] = {"tp",
                                              "cp",
                                              "pp",
                                              "vpp",
                                              "ep",
                                              "etp",
                                              "dp",
                                              "edp",
                                              "zero",
                                              "mbs",
                                              "gbs",
                                              "micro_batches",
                                              "seq_len",
                                              "precision",
                                              "recompute",
                                              "dispatcher",
                                              "overlap",
                                              "recompute_modules",
                                              "recompute_layers",
                                              "mtp",
                                              "grad_reduce",
                                              "moments",
                                              "delay_wgrad",
                                              "fp8_params",
                                              "offload",
                                              "cuda_graphs",
                                              "ep_sms",
                                              "pp_layout",
                                              "act_offload",
                                              NULL};
    if ((st = moe_jval_keys(&lay, layout_keys, err))) return st;
    struct cost_layout *l = &p->layout;
    if ((st = moe_jval_int32(&in, "gpus", true, 0, 1, PLAN_MAX_GPUS, &p->gpus, err)) ||
        (st = moe_jval_str(&in, "gpu", false, "?", p->gpu, sizeof p->gpu, err)) ||
        (st = moe_jval_int32(&lay, "tp", true, 0, 1, PLAN_MAX_GPUS, &l->tp, err)) ||
        (st = moe_jval_int32(&lay, "pp", true, 0, 1, COST_MAX_PP, &l->pp, err)) ||
        (st = moe_jval_int32(&lay, "vpp", true, 0, 1, COST_MAX_STAGES, &l->vpp, err)) ||
        (st = moe_jval_int32(&lay, "ep", true, 0, 1, MDL_MAX_EXPERTS, &l->ep, err)) ||
        (st = moe_jval_int32(&lay, "etp", true, 0, 1, PLAN_MAX_GPUS, &l->etp, err)) ||
        (st = moe_jval_int32(&lay, "cp", false, 1, 1, PLAN_MAX_GPUS, &l->cp, err)) ||
        (st = moe_jval_int32(&lay, "dp", true, 0, 1, PLAN_MAX_GPUS, &l->dp, err)))
        return st;
    /* in double: four degrees of up to 2^20 overflow 64 bits; equal to gpus only when exact */
    double degrees = (double)l->tp * l->cp * l->pp * l->dp;
    if (degrees != p->gpus)
        return moe_jval_error(&lay, NULL, err,
                              "tp x cp x pp x dp = %.0f, not the %d GPUs of the plan", degrees,
                              p->gpus);
    if ((st = moe_jval_int32(&lay, "zero", true, 0, 0, 3, &l->zero, err)) ||
        (st = moe_jval_int32(&lay, "mbs", true, 0, 1, COST_MAX_MBS, &l->mbs, err)) ||
        (st = moe_jval_int32(&lay, "gbs", true, 0, 1, COST_MAX_GBS, &l->gbs, err)) ||
        (st = moe_jval_int32(&lay, "seq_len", true, 0, 2, COST_MAX_SEQ, &l->seq_len, err)) ||
        (st = moe_jval_int32(&lay, "micro_batches", true, 0, 1, 1 << 24, &p->micro_batches, err)))
        return st;
    if ((st = moe_jval_enum(&lay, "precision", true, 0, cost_precision_names, &v, err))) return st;
    l->precision = (enum cost_precision)v;
    if ((st = moe_jval_enum(&lay, "recompute", true, 0, cost_recompute_names, &v, err))) return st;
    l->recompute = (enum cost_recompute)v;
    if ((st = moe_jval_enum(&lay, "dispatcher", true, 0, cost_dispatcher_names, &v, err)))
        return st;
    l->dispatcher = (enum cost_dispatcher)v;
    if ((st = moe_jval_bool(&lay, "overlap", false, true, &l->overlap, err))) return st;
    /* the recipe keys (optional: a plan without them keeps the defaults) */
    static const char *const fp_names[] = {"fp32", "bf16", NULL};
    char text[COST_PP_LAYOUT_MAX];
    int g = 0, mo = 0, gr = 0;
    if ((st = moe_jval_str(&lay, "recompute_modules", false, "", text, sizeof text, err)) ||
        (st = moe_jval_int32(&lay, "recompute_layers", false, 0, 0, MDL_MAX_LAYERS,
                             &l->recompute_layers, err)) ||
        (st = moe_jval_int32(&lay, "mtp", false, 0, 0, MDL_MAX_MTP, &l->mtp, err)) ||
        (st = moe_jval_enum(&lay, "grad_reduce", false, 0, fp_names, &g, err)) ||
        (st = moe_jval_enum(&lay, "moments", false, 0, fp_names, &mo, err)) ||
        (st = moe_jval_bool(&lay, "delay_wgrad", false, false, &l->delay_wgrad, err)) ||
        (st = moe_jval_bool(&lay, "fp8_params", false, false, &l->fp8_params, err)) ||
        (st = moe_jval_num(&lay, "offload", false, 0, 0, 1, &l->offload, err)) ||
        (st = moe_jval_enum(&lay, "cuda_graphs", false, 0, cost_graphs_names, &gr, err)) ||
        (st = moe_jval_int32(&lay, "ep_sms", false, 0, 0, 1 << 16, &l->ep_sms, err)) ||
        (st = moe_jval_str(&lay, "pp_layout", false, "", l->pp_layout, sizeof l->pp_layout, err)))
        return st;
    char off[COST_PP_LAYOUT_MAX];
    if ((st = moe_jval_str(&lay, "act_offload", false, "", off, sizeof off, err))) return st;
    if (off[0]) {
        struct cost_layout t = *l;
        char kv[COST_PP_LAYOUT_MAX + 16];
        snprintf(kv, sizeof kv, "act_offload=%s", off);
        struct moe_error why;
        if (cost_layout_parse(&t, kv, &why) != MOE_OK)
            return moe_jval_error(&lay, "act_offload", err, "'%s': %s", off, why.message);
        l->act_offload = t.act_offload;
    }
    l->grad_reduce_bf16 = g == 1;
    l->moments_bf16 = mo == 1;
    l->graphs = (enum cost_graphs)gr;
    if (text[0]) {
        struct cost_layout t = *l;
        char kv[COST_PP_LAYOUT_MAX + 16];
        snprintf(kv, sizeof kv, "recompute=%s", text);
        struct moe_error why;
        if (l->recompute != COST_RECOMPUTE_SELECTIVE || cost_layout_parse(&t, kv, &why) != MOE_OK)
            return moe_jval_error(&lay, "recompute_modules", err, "'%s': %s", text,
                                  l->recompute != COST_RECOMPUTE_SELECTIVE
                                      ? "only with recompute \"selective\""
                                      : why.message);
        l->recompute_modules = t.recompute_modules;
    }
    if ((st = moe_jval_object(&root, "model", true, &model, NULL, err)) ||
        (st = moe_jval_object(&root, "prediction", true, &pred, NULL, err)) ||
        (st = mdl_model_from_jval(&p->model, &model, err)))
        return st;
    /* The planner's own rules for a layout (every product in 64 bits: no overflow). */
    struct moe_error why;
    if (cost_layout_check(l, &p->model, p->gpus, &why) != MOE_OK)
        return moe_jval_error(&lay, NULL, err, "%s", why.message);
    if ((int64_t)p->micro_batches * l->mbs * l->dp != l->gbs)
        return moe_jval_error(&lay, "micro_batches", err, "micro_batches x mbs x dp is not gbs");
    int64_t edp;
    if ((st = moe_jval_int(&lay, "edp", false, cost_layout_edp(l), 1, PLAN_MAX_GPUS, &edp, err)))
        return st;
    if (edp != cost_layout_edp(l))
        return moe_jval_error(&lay, "edp", err, "%lld, but tp x cp x dp / (ep x etp) is %d",
                              (long long)edp, cost_layout_edp(l));
    if ((st = moe_jval_num(&pred, "step_us", true, 0, 0, 1e18, &p->step_us, err)) ||
        (st = moe_jval_num(&pred, "model_tflops_per_gpu", true, 0, 0, 1e9, &p->model_tflops_per_gpu,
                           err)) ||
        (st = moe_jval_num(&pred, "mfu", true, 0, 0, 1, &p->mfu, err)) ||
        (st = moe_jval_object(&pred, "phases", true, &phases, NULL, err)))
        return st;
    for (int i = 0; i < COST_NPHASES; i++) {
        double unused;
        if ((st = moe_jval_object(&phases, cost_phase_names[i], true, &ph, NULL, err)) ||
            (st = moe_jval_num(&ph, "exposed_us", true, 0, 0, 1e18, &p->phase_us[i], err)) ||
            (st = moe_jval_num(&ph, "compute_us", false, 0, 0, 1e18, &unused, err)) ||
            (st = moe_jval_num(&ph, "comm_us", false, 0, 0, 1e18, &unused, err)))
            return st;
    }
    double capacity;
    if ((st = moe_jval_object(&pred, "memory_bytes", true, &mem, NULL, err)) ||
        (st = moe_jval_num(&mem, "total", true, 0, 0, 1e18, &p->memory_total_bytes, err)) ||
        (st = moe_jval_num(&mem, "capacity", true, 0, 0, 1e18, &capacity, err)))
        return st;
    if (p->memory_total_bytes > capacity)
        return moe_jval_error(&mem, "total", err, "memory %.3g bytes exceeds the capacity %.3g",
                              p->memory_total_bytes, capacity);
    for (int k = 0; k < COST_NMEM; k++)
        if ((st =
                 moe_jval_num(&mem, cost_mem_names[k], true, 0, 0, 1e18, &p->memory_bytes[k], err)))
            return st;
    /* The parts agree with their whole: a plan edited by hand (or by a tool) in one place only is
     * refused here, by every reader. */
    double mem_sum = 0.0, phase_sum = 0.0;
    for (int k = 0; k < COST_NMEM; k++) mem_sum += p->memory_bytes[k];
    if (fabs(mem_sum - p->memory_total_bytes) > 1e-6 * p->memory_total_bytes + 1.0)
        return moe_jval_error(&mem, "total", err, "%.17g bytes, but its categories add up to %.17g",
                              p->memory_total_bytes, mem_sum);
    for (int i = 0; i < COST_NPHASES; i++)
        if (i != COST_STEP) phase_sum += p->phase_us[i];
    if (fabs(phase_sum - p->step_us) > 1e-6 * p->step_us + 1e-3 ||
        fabs(p->phase_us[COST_STEP] - p->step_us) > 1e-6 * p->step_us + 1e-3)
        return moe_jval_error(&pred, "step_us", err,
                              "%.17g us, but the phases' exposed times add up to %.17g and the "
                              "step phase says %.17g",
                              p->step_us, phase_sum, p->phase_us[COST_STEP]);
    int64_t in_gbs, in_seq;
    if ((st = moe_jval_int(&in, "gbs", false, l->gbs, 1, COST_MAX_GBS, &in_gbs, err)) ||
        (st = moe_jval_int(&in, "seq_len", false, l->seq_len, 1, COST_MAX_SEQ, &in_seq, err)))
        return st;
    if (in_gbs != l->gbs || in_seq != l->seq_len)
        return moe_jval_error(&in, in_gbs != l->gbs ? "gbs" : "seq_len", err,
                              "gbs %lld and seq_len %lld, but the layout has %d and %d",
                              (long long)in_gbs, (long long)in_seq, l->gbs, l->seq_len);
    if ((st = load_ranks(&root, p, err)) || (st = load_stages(&root, p, err))) return st;
    return load_placement(&root, p, err);
}

enum moe_status plan_load(const char *file, struct plan_file *p, struct moe_error *err)
{
    struct moe_jdoc doc;
    memset(p, 0, sizeof *p);
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    st = plan_from_doc(&doc, p, err);
    moe_jdoc_free(&doc);
    return st;
}

enum moe_status plan_check_doc(const struct moe_jdoc *doc, char *summary, size_t cap,
                               struct moe_error *err)
{
    struct plan_file p;
    memset(&p, 0, sizeof p);
    enum moe_status st = plan_from_doc(doc, &p, err);
    if (st == MOE_OK) {
        const struct cost_layout *l = &p.layout;
        snprintf(summary, cap,
                 "moeplan.plan: %s on %d GPUs, tp=%d pp=%d vpp=%d ep=%d dp=%d, step %.1f ms "
                 "predicted",
                 p.model.name, p.gpus, l->tp, l->pp, l->vpp, l->ep, l->dp, p.step_us / 1e3);
    }
    plan_file_free(&p);
    return st;
}

void plan_file_free(struct plan_file *p)
{
    free(p->rank);
    free(p->placement);
    free(p->stage_layers);
    p->rank = NULL;
    p->placement = NULL;
    p->stage_layers = NULL;
}

/* One layout's prediction (moeplan predict --json): "moeplan.prediction". */
enum moe_status plan_prediction_save(const char *file, const struct mdl_model *model,
                                     const struct topo_cluster *cluster, int gpus,
                                     const struct cost_calibration *cal,
                                     const struct cost_layout *l, const struct cost_result *r,
                                     struct moe_error *err)
{
    json_t *root = json_object(), *phases = json_object(), *mem = json_object();
    char lay[COST_LAYOUT_TEXT_MAX];
    cost_layout_format(l, lay, sizeof lay);
    json_object_set_new(root, "model", json_string(model->name));
    json_object_set_new(root, "cluster", json_string(cluster->name));
    json_object_set_new(root, "gpus", json_integer(gpus));
    json_object_set_new(root, "layout", json_string(lay));
    json_object_set_new(root, "calibration", json_string(cal->source));
    json_object_set_new(root, "calibrated", json_boolean(cal->calibrated));
    for (int p = 0; p < COST_NPHASES; p++) {
        json_t *ph = json_object();
        json_object_set_new(ph, "compute_us", json_real(r->compute_us[p]));
        json_object_set_new(ph, "comm_us", json_real(r->comm_us[p]));
        json_object_set_new(ph, "exposed_us", json_real(r->exposed_us[p]));
        json_object_set_new(phases, cost_phase_names[p], ph);
    }
    json_object_set_new(root, "phases", phases);
    json_object_set_new(root, "step_us", json_real(r->step_us));
    json_object_set_new(root, "tokens_per_s_per_gpu", json_real(r->tokens_per_s_per_gpu));
    json_object_set_new(root, "model_tflops_per_gpu", json_real(r->model_tflops_per_gpu));
    json_object_set_new(root, "megatron_tflops_per_gpu", json_real(r->megatron_tflops_per_gpu));
    json_object_set_new(root, "mfu", json_real(r->mfu));
    json_object_set_new(root, "bubble_fraction", json_real(r->bubble_fraction));
    for (int k = 0; k < COST_NMEM; k++)
        json_object_set_new(mem, cost_mem_names[k], json_real(r->memory_bytes[k]));
    json_object_set_new(mem, "total", json_real(r->memory_total_bytes));
    json_object_set_new(mem, "capacity", json_real(r->memory_capacity_bytes));
    json_object_set_new(root, "memory_bytes", mem);
    json_object_set_new(root, "fits", json_boolean(r->fits));
    enum moe_status st = moe_json_write_atomic(file, root, PLAN_PREDICTION_SCHEMA, 1, err);
    json_decref(root);
    return st;
}

/* measured.json ("moeplan.measured", written by `moeplan run`): what a report reads of it. */

void plan_measured_free(struct plan_measured *m)
{
    free(m->loss);
    if (m->have_routing) cost_routing_free(&m->routing);
}

/* The run's numbers; its routing for a model of `experts` experts, top_k (none: no MoE). */
enum moe_status plan_measured_load(const char *file, int experts, int top_k,
                                   struct plan_measured *ms, struct moe_error *err)
{
    struct moe_jdoc doc;
    struct moe_jval root, med, ph, curve, dev;
    char schema[64];
    int version;
    memset(ms, 0, sizeof *ms);
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err)) ||
        (st = moe_jdoc_root(&doc, &root, err)))
        goto done;
    if (strcmp(schema, COST_MEASURED_SCHEMA) != 0) {
        st = moe_jval_error(&root, "schema", err, "expected \"%s\", got \"%s\"",
                            COST_MEASURED_SCHEMA, schema);
        goto done;
    }
    if ((st = moe_jval_str(&root, "model", true, NULL, ms->model, sizeof ms->model, err)) ||
        (st = moe_jval_object(&root, "device", true, &dev, NULL, err)) ||
        (st = moe_jval_str(&dev, "name", true, NULL, ms->device, sizeof ms->device, err)) ||
        (st = moe_jval_object(&root, "median", true, &med, NULL, err)) ||
        (st = moe_jval_object(&med, "phases_ms", true, &ph, NULL, err)) ||
        (st = moe_jval_array(&root, "loss_curve", true, &curve, NULL, err)))
        goto done;
    for (int p = 0; p < COST_NPHASES; p++)
        if ((st = moe_jval_num(&ph, cost_phase_names[p], true, 0, 0, 1e9, &ms->phase_ms[p], err)))
            goto done;
    ms->steps = (int)moe_jval_len(&curve);
    if (ms->steps < 1) {
        st = moe_jval_error(&root, "loss_curve", err, "no steps");
        goto done;
    }
    ms->loss = malloc(sizeof *ms->loss * (size_t)ms->steps);
    if (!ms->loss) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < ms->steps; i++) { /* null: a skipped step */
        ms->loss[i] = NAN;
        if (json_is_null(json_array_get(curve.json, (size_t)i))) continue;
        if ((st = moe_jval_at_num(&curve, (size_t)i, -1e9, 1e9, &ms->loss[i], err))) goto done;
    }
    /* Step times: positive and below a day (1e308 ms or -5 ms are not a run's). */
    double step_ms;
    struct moe_jval run;
    bool have_run = false;
    ms->first_step = 1;
    if ((st = moe_jval_num(&med, "step_ms", true, 0, 1e-6, 864e5, &step_ms, err)) ||
        (st = moe_jval_int32(&med, "steps_counted", false, ms->steps, 0, ms->steps, &ms->counted,
                             err)) ||
        (st = moe_jval_object(&root, "run", false, &run, &have_run, err)) ||
        (have_run &&
         (st = moe_jval_int32(&run, "first_step", false, 1, 1, INT32_MAX, &ms->first_step, err))))
        goto done;
    if (!(ms->phase_ms[COST_STEP] > 0))
        st = moe_jval_error(&ph, "step", err, "the median step must be positive");
    struct moe_jval steps, one;
    bool have_steps = false;
    if (st == MOE_OK) st = moe_jval_array(&root, "steps", false, &steps, &have_steps, err);
    for (size_t i = 0; st == MOE_OK && have_steps && i < moe_jval_len(&steps); i++) {
        double v;
        if ((st = moe_jval_at_object(&steps, i, &one, err)) == MOE_OK &&
            !moe_jval_has(&one, "skipped"))
            st = moe_jval_num(&one, "step_ms", true, 0, 1e-6, 864e5, &v, err);
    }
    if (st != MOE_OK) goto done;
    if (experts > 0) { /* the same reader as `plan --routing measured.json` */
        if ((st = cost_routing_load(&ms->routing, file, experts, top_k, err))) goto done;
        ms->have_routing = true;
    }
done:
    moe_jdoc_free(&doc);
    if (st != MOE_OK) plan_measured_free(ms);
    return st;
}
