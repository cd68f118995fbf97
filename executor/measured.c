/*
 * measured.c: what a finished run comes to, and measured.json, its one writer. The reader is the
 * planner's (plan_measured_load for `report`, cost_routing_load for `plan --routing`); both go
 * by COST_MEASURED_SCHEMA and the keys written here (their table: executor/README.md).
 *
 * Plain C: the run's record (struct exec_run_result) is a host structure, so the writer and its
 * agreement with the reader are tested where there is no GPU.
 */
#include "exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const exec_run_mode_names[] = {"threads", "virtual", "process"};
const char *const exec_mem_names[EXEC_MEM_N] = {"weights",   "master_weights", "grads",
                                                "optimizer", "activations",    "workspace"};

void exec_run_result_free(struct exec_run_result *r)
{
    free(r->counts), free(r->coact), free(r->steps);
    r->counts = r->coact = NULL;
    r->steps = NULL;
    r->nsteps = 0;
}

struct exec_run_rate exec_run_rate(const struct plan_file *p, double step_ms)
{
    const struct cost_layout *l = &p->layout;
    struct mdl_flops fl;
    mdl_flops_per_token(&p->model, l->seq_len, &fl);
    struct exec_run_rate r = {0};
    r.tokens_step = (double)p->micro_batches * l->mbs * l->seq_len * l->dp;
    r.flops_per_token = fl.train_total;
    r.peak_tflops = p->mfu > 0 ? p->model_tflops_per_gpu / p->mfu : 0.0; /* the plan GPU's */
    if (step_ms > 0) {
        r.tokens_per_s = r.tokens_step / (step_ms / 1e3);
        r.model_tflops = fl.train_total * r.tokens_per_s / 1e12 / p->gpus; /* as the plan's */
        r.mfu = r.peak_tflops > 0 ? r.model_tflops / r.peak_tflops : 0.0;
    }
    return r;
}

enum moe_status exec_run_summarize(const struct plan_file *p, const struct exec_run_result *r,
                                   struct exec_run_summary *s, struct moe_error *err)
{
    memset(s, 0, sizeof *s);
    int n = r->nsteps, skip = n > 1 ? 1 : 0; /* the first step: cuBLAS heuristics, allocations */
    double *col = malloc(sizeof *col * (size_t)(n > 0 ? n : 1));
    if (!col) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    s->first_step = r->info.first_step + 1 + skip;
    for (int ph = 0; ph < COST_NPHASES; ph++) {
        int kept = 0; /* skipped steps ran no optimizer: not in the medians */
        for (int i = skip; i < n; i++)
            if (!r->steps[i].skipped) col[kept++] = r->steps[i].gpu.phase_ms[ph];
        s->phase_ms[ph] = kept ? moe_median(col, (size_t)kept) : 0.0;
        s->counted = kept;
    }
    free(col);
    s->rate = exec_run_rate(p, s->phase_ms[COST_STEP]);
    s->loss_first = n ? r->steps[0].loss : NAN;
    s->loss_last = n ? r->steps[n - 1].loss : NAN;
    int nmoe = 0;
    for (int b = 0; b < p->model.layers; b++) nmoe += mdl_layer_is_moe(&p->model, b);
    double per = (double)p->gpus * nmoe * p->micro_batches * n;
    if (per > 0)
        s->dispatch_per_layer =
            (struct cost_bytes){r->dispatch.nvlink / per, r->dispatch.scale_out / per};
    return MOE_OK;
}

static json_t *phases_json(const double *ms, double scale)
{
    json_t *o = json_object();
    for (int p = 0; o && p < COST_NPHASES; p++)
        if (json_object_set_new(o, cost_phase_names[p], json_real(ms[p] * scale))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

static json_t *bytes_json(struct cost_bytes b)
{
    return json_pack("{s:f, s:f}", "nvlink", b.nvlink, "scale_out", b.scale_out);
}

static json_t *step_json(const struct plan_file *p, const struct exec_run_step *s)
{
    if (s->skipped) return json_pack("{s:i, s:s}", "step", s->step, "skipped", s->why);
    double ms = s->gpu.phase_ms[COST_STEP];
    struct exec_run_rate r = exec_run_rate(p, ms);
    json_t *js = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:o}", "step",
                           s->step, "loss", s->loss, "aux_loss", s->aux, "lr", s->lr, "grad_norm",
                           s->gnorm, "step_ms", ms, "wall_ms", s->wall_ms, "tokens_per_s",
                           r.tokens_per_s, "model_tflops", r.model_tflops, "host_syncs",
                           s->gpu.host_syncs, "phases_ms", phases_json(s->gpu.phase_ms, 1.0));
    if (js && p->layout.ep > 1 &&
        json_object_set_new(js, "dispatch_bytes", bytes_json(s->gpu.dispatch))) {
        json_decref(js);
        return NULL;
    }
    return js;
}

/* The routing in the planner's routing-input form (what cost_routing_load reads). */
static json_t *routing_json(const struct plan_file *p, const struct exec_run_result *r,
                            double tokens)
{
    const struct mdl_model *m = &p->model;
    int E = m->moe.experts;
    json_t *layers = json_array();
    for (int b = 0; layers && b < m->layers; b++) {
        if (!mdl_layer_is_moe(m, b)) continue;
        json_t *jc = json_array(), *jco = json_array();
        const int64_t *counts = r->counts + (size_t)b * E, *coact = r->coact + (size_t)b * E * E;
        for (int e = 0; jc && jco && e < E; e++) {
            json_t *row = json_array();
            for (int f = 0; row && f < E; f++)
                if (json_array_append_new(row, json_integer(coact[(size_t)e * E + f])))
                    json_decref(row), row = NULL;
            if (json_array_append_new(jc, json_integer(counts[e])) ||
                json_array_append_new(jco, row))
                json_decref(jc), json_decref(jco), jc = jco = NULL;
        }
        if (json_array_append_new(layers, json_pack("{s:i, s:o, s:o}", "layer", b, "counts", jc,
                                                    "coactivation", jco)))
            json_decref(layers), layers = NULL;
    }
    return json_pack("{s:i, s:i, s:f, s:o}", "experts", E, "top_k", m->moe.top_k, "tokens", tokens,
                     "layers", layers);
}

enum moe_status exec_measured_save(const char *file, const char *plan_path,
                                   const struct exec_run_cfg *c, const struct exec_run_result *r,
                                   struct moe_error *err)
{
    const struct plan_file *p = c->plan;
    const struct cost_layout *l = &p->layout;
    const struct exec_run_info *in = &r->info;
    struct exec_run_summary s;
    enum moe_status st = exec_run_summarize(p, r, &s, err);
    if (st != MOE_OK) return st;
    json_t *steps = json_array(), *loss = json_array(), *mem = json_object();
    for (int i = 0; steps && loss && i < r->nsteps; i++) {
        const struct exec_run_step *x = &r->steps[i];
        if (json_array_append_new(steps, step_json(p, x)) ||
            json_array_append_new(loss, x->skipped ? json_null() : json_real(x->loss)))
            json_decref(steps), steps = NULL;
    }
    double alloc = 0;
    for (int k = 0; k < EXEC_MEM_N; k++) alloc += r->memory.bytes[k];
    const char *const more[] = {"allocated_total", "device_used_peak", "device_total"};
    const double more_v[] = {alloc, r->memory.device_used_peak, r->memory.device_total};
    for (int k = 0; mem && k < EXEC_MEM_N + 3; k++)
        if (json_object_set_new(
                mem, k < EXEC_MEM_N ? exec_mem_names[k] : more[k - EXEC_MEM_N],
                json_real(k < EXEC_MEM_N ? r->memory.bytes[k] : more_v[k - EXEC_MEM_N])))
            json_decref(mem), mem = NULL;
    json_t *root = json_pack(
        "{s:s, s:s,"
        " s:{s:s, s:i, s:f, s:f},"
        " s:{s:i, s:i, s:i, s:s, s:s, s:i, s:i, s:i, s:f, s:s, s:s, s:I, s:f, s:i, s:f, s:f, s:f},"
        " s:{s:i, s:f, s:f, s:f, s:f, s:o},"
        " s:{s:f, s:o},"
        " s:o, s:o, s:o, s:o}",
        "plan", plan_path, "model", p->model.name, "device", "name", in->dev.name, "sms",
        in->dev.sm_count, "memory_bytes", in->dev.memory_bytes, "peak_bf16_tflops",
        s.rate.peak_tflops, "run", "steps", c->steps, "first_step", in->first_step + 1, "ranks",
        p->gpus, "launch", in->transport ? exec_run_mode_names[in->mode] : "single",
        "binding_rank0", in->binding, "seq_len", l->seq_len, "mbs", l->mbs, "micro_batches",
        p->micro_batches, "tokens_per_step", s.rate.tokens_step, "recompute",
        cost_recompute_names[l->recompute], "data", in->data, "seed", (json_int_t)c->seed, "lr_max",
        in->opt.lr_max, "warmup_steps", in->opt.warmup_steps, "aux_loss_coef", c->aux,
        "bias_update_rate", c->bias_rate, "model_flops_per_token", s.rate.flops_per_token, "median",
        "steps_counted", s.counted, "step_ms", s.phase_ms[COST_STEP], "tokens_per_s",
        s.rate.tokens_per_s, "model_tflops", s.rate.model_tflops, "mfu", s.rate.mfu, "phases_ms",
        phases_json(s.phase_ms, 1.0), "prediction", "step_ms", p->step_us / 1e3, "phases_ms",
        phases_json(p->phase_us, 1e-3), "memory_bytes", mem, "loss_curve", loss, "steps", steps,
        "routing", routing_json(p, r, s.rate.tokens_step * r->nsteps));
    if (root && l->ep > 1 &&
        json_object_set_new(
            root, "dispatch",
            json_pack("{s:s, s:o, s:o, s:o}", "mode", cost_dispatcher_names[l->dispatcher],
                      "measured_bytes_per_gpu_per_layer", bytes_json(s.dispatch_per_layer),
                      "predicted_bytes_per_gpu_per_layer", bytes_json(p->dispatch_bytes),
                      "measured_bytes_total", bytes_json(r->dispatch))))
        json_decref(root), root = NULL;
    if (root && json_object_set_new(json_object_get(root, "run"), "precision",
                                    json_string(cost_precision_names[l->precision])))
        json_decref(root), root = NULL;
    if (!root) return moe_error_set(err, MOE_ERR_NOMEM, "%s: out of memory", file);
    st = moe_json_write_atomic(file, root, COST_MEASURED_SCHEMA, 1, err);
    json_decref(root);
    return st;
}
