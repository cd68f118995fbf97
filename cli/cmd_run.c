/*
 * cmd_run.c: `moeplan run PLAN`: train the planned model for real on this machine's GPU and
 * measure it: a line per step, the per-phase table against the plan's prediction, and
 * measured.json ("moeplan.measured", documented in executor/README.md).
 *
 * This build runs plans for one GPU (the single-GPU executor); a plan for more GPUs is refused
 * naming what it needs. Built only with the executor (MOEPLAN_HAVE_EXECUTOR).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "exec.h"
#include "plan.h"
#include "rpt.h"

enum { OPT_STEPS = 1, OPT_DATA, OPT_OUT, OPT_GPUS, OPT_SEED, OPT_AUX, OPT_BIAS, OPT_LR, OPT_WARMUP,
       OPT_STREAMS };

const struct cli_opt cmd_run_opts[] = {
    {"steps", required_argument, OPT_STEPS, "N", "training steps (100)"},
    {"data", required_argument, OPT_DATA, "FILE",
     "train on this file: bytes as tokens, or a MOETOKv1 token file (default: synthetic tokens)"},
    {"out", required_argument, OPT_OUT, "FILE", "write measured.json here (measured.json)"},
    {"gpus", required_argument, OPT_GPUS, "N", "GPUs on this node (1; more with the distributed executor)"},
    {"seed", required_argument, OPT_SEED, "N", "initialization and synthetic-data seed (1)"},
    {"aux-loss-coef", required_argument, OPT_AUX, "C", "load-balance loss coefficient (0: none)"},
    {"bias-update-rate", required_argument, OPT_BIAS, "R",
     "aux-loss-free balancing: per-step bias update (0.001; 0: off)"},
    {"lr", required_argument, OPT_LR, "LR", "peak learning rate (3e-4; cosine to a tenth)"},
    {"warmup", required_argument, OPT_WARMUP, "N", "warm-up steps (10, at most steps/10 + 1)"},
    {"expert-streams", required_argument, OPT_STREAMS, "N", "CUDA streams for the expert GEMMs (1 .. 8; 1)"},
    {NULL, 0, 0, NULL, NULL},
};

struct run_opts {
    const char *plan, *data, *out;
    uint64_t steps, seed, gpus, warmup, streams;
    double aux, bias_rate, lr;
};

static double median(double *v, int n)
{
    if (n <= 0) return 0.0;
    for (int i = 1; i < n; i++) /* insertion sort: n is the step count */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* What the run refuses: everything this build's executor does not do yet (runnable.c). */
static enum moe_status check_runnable(const struct plan_file *p, const char *file,
                                      struct moe_error *err)
{
    char why[256];
    if (!exec_layout_runnable(&p->layout, p->gpus, why, sizeof why))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "%s: %s; `moeplan plan --runnable` plans only what this build runs",
                             file, why);
    return MOE_OK;
}

static json_t *phases_json(const double *ms)
{
    json_t *o = json_object();
    for (int p = 0; p < COST_NPHASES; p++) json_object_set_new(o, cost_phase_names[p], json_real(ms[p]));
    return o;
}

static int run(struct cli *cli, const struct run_opts *o)
{
    struct moe_error err;
    enum moe_status st = MOE_OK;
    struct plan_file p;
    struct exec_gpu *g = NULL;
    struct exec_data data;
    memset(&data, 0, sizeof data);
    int *tokens = NULL, steps = (int)o->steps, ndev = 0;
    double *loss = NULL, (*phase)[COST_NPHASES] = NULL;
    json_t *root = NULL, *jsteps = NULL;
    int64_t *counts = NULL, *coact = NULL;
    if ((st = plan_load(o->plan, &p, &err))) goto cleanup;
    if (o->gpus > 1) {
        st = moe_error_set(&err, MOE_ERR_UNSUPPORTED,
                           "--gpus %llu: this build's executor runs one GPU; multi-GPU runs come "
                           "with the distributed executor (issue 8)",
                           (unsigned long long)o->gpus);
        goto cleanup;
    }
    if ((st = check_runnable(&p, o->plan, &err))) goto cleanup;
    if ((st = exec_device_count(&ndev, &err))) goto cleanup;
    if (ndev < 1) {
        st = moe_error_set(&err, MOE_ERR_RUNTIME, "no CUDA GPU on this machine: `moeplan run` "
                                                  "trains on a GPU (plan and predict run anywhere)");
        goto cleanup;
    }
    struct exec_device_info dev;
    if ((st = exec_device_query(0, &dev, &err))) goto cleanup;
    const struct mdl_model *m = &p.model;
    const struct cost_layout *l = &p.layout;
    struct exec_gpu_cfg cfg = {l->seq_len, l->mbs, l->recompute == COST_RECOMPUTE_FULL, o->aux, 0,
                              (int)o->streams, NULL, NULL, 0.0};
    if ((st = exec_gpu_create(&g, m, &cfg, &err))) goto cleanup;
    if ((st = exec_gpu_init(g, o->seed, &err))) goto cleanup;
    if ((st = exec_data_open(&data, o->data, m->vocab, o->seed, &err))) goto cleanup;
    int per_mb = l->mbs * (l->seq_len + 1), micro = p.micro_batches;
    double tokens_step = (double)micro * l->mbs * l->seq_len;
    struct mdl_flops fl;
    mdl_flops_per_token(m, l->seq_len, &fl);
    double peak = p.mfu > 0 ? p.model_tflops_per_gpu / p.mfu : 0.0; /* the plan GPU's bf16 peak */
    struct exec_adamw opt;
    exec_adamw_defaults(&opt);
    opt.lr_max = o->lr;
    opt.lr_min = o->lr / 10;
    opt.total_steps = steps;
    opt.warmup_steps = (int)(o->warmup < o->steps / 10 + 1 ? o->warmup : o->steps / 10 + 1);
    tokens = malloc(sizeof *tokens * (size_t)per_mb);
    loss = calloc((size_t)steps, sizeof *loss);
    phase = calloc((size_t)steps, sizeof *phase);
    jsteps = json_array();
    if (!tokens || !loss || !phase || !jsteps) {
        st = moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    printf("moeplan run: %s (%d layers, %d experts top-%d) on %s\n", m->name, m->layers,
           m->moe.experts, m->moe.top_k, dev.name);
    printf("  %d steps x %d micro-batch%s x %d sequences of %d tokens; recompute %s; data: %s\n",
           steps, micro, micro == 1 ? "" : "es", l->mbs, l->seq_len,
           cost_recompute_names[l->recompute], data.source);
    printf("  AdamW lr %.2g (warm-up %d, cosine), clip %.1f; aux loss %g; bias update %g; seed "
           "%llu\n",
           opt.lr_max, opt.warmup_steps, opt.clip, o->aux, o->bias_rate,
           (unsigned long long)o->seed);
    fflush(stdout);
    struct moe_progress bar;
    moe_progress_start(&bar, stderr, true, "training", (uint64_t)steps);
    for (int s = 0; s < steps; s++) {
        double t0 = moe_time_now_s(), aux_step = 0.0, gnorm = 0.0;
        struct exec_gpu_step_stats ss;
        if ((st = exec_gpu_step_begin(g, &err))) goto cleanup;
        for (int mb = 0; mb < micro; mb++) {
            double lm, am;
            exec_data_next(&data, tokens, per_mb);
            if ((st = exec_gpu_micro_batch(g, tokens, 1.0 / micro, &lm, &am, &err))) goto cleanup;
            loss[s] += lm / micro;
            aux_step += am / micro;
        }
        if ((st = exec_gpu_optimizer(g, &opt, s, &gnorm, &err))) goto cleanup;
        if ((st = exec_gpu_update_bias(g, o->bias_rate, &err))) goto cleanup;
        if ((st = exec_gpu_step_end(g, &ss, &err))) goto cleanup;
        double wall_ms = 1e3 * (moe_time_now_s() - t0), ms = ss.phase_ms[COST_STEP];
        double tps = tokens_step / (ms / 1e3), tflops = fl.train_total * tps / 1e12;
        memcpy(phase[s], ss.phase_ms, sizeof phase[s]);
        moe_progress_clear(&bar);
        printf("step %4d/%d  loss %8.4f  lr %.2e  gnorm %7.3f  %9.1f ms  %9.0f tok/s  %7.1f TFLOPS"
               "  MFU %5.1f%%\n",
               s + 1, steps, loss[s], exec_lr_at(&opt, s), gnorm, ms, tps, tflops,
               peak > 0 ? 100.0 * tflops / peak : 0.0);
        fflush(stdout);
        moe_progress_update(&bar, (uint64_t)s + 1);
        json_t *js = json_object();
        json_object_set_new(js, "step", json_integer(s + 1));
        json_object_set_new(js, "loss", json_real(loss[s]));
        json_object_set_new(js, "aux_loss", json_real(aux_step));
        json_object_set_new(js, "lr", json_real(exec_lr_at(&opt, s)));
        json_object_set_new(js, "grad_norm", json_real(gnorm));
        json_object_set_new(js, "step_ms", json_real(ms));
        json_object_set_new(js, "wall_ms", json_real(wall_ms));
        json_object_set_new(js, "tokens_per_s", json_real(tps));
        json_object_set_new(js, "model_tflops", json_real(tflops));
        json_object_set_new(js, "host_syncs", json_integer(ss.host_syncs));
        json_object_set_new(js, "phases_ms", phases_json(ss.phase_ms));
        json_array_append_new(jsteps, js);
    }
    moe_progress_finish(&bar);
    /* medians over the steps after the first (warm-up: cuBLAS heuristics, allocations) */
    int first = steps > 1 ? 1 : 0, n = steps - first;
    double med[COST_NPHASES], *col = malloc(sizeof *col * (size_t)(n ? n : 1));
    if (!col) {
        st = moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int ph = 0; ph < COST_NPHASES; ph++) {
        for (int i = 0; i < n; i++) col[i] = phase[first + i][ph];
        med[ph] = median(col, n);
    }
    free(col);
    double mstep = med[COST_STEP], mtps = tokens_step / (mstep / 1e3);
    double mtflops = fl.train_total * mtps / 1e12;
    /* the table: measured medians against the plan's prediction */
    printf("\nper-phase time, median of steps %d-%d (CUDA events), against the plan:\n",
           first + 1, steps);
    const char *h[] = {"phase", "measured", "predicted", "error"};
    struct rpt_table *t = rpt_table_create(4, h, "lrrr");
    for (int ph = 0; t && ph < COST_NPHASES; ph++) {
        if (med[ph] == 0.0 && p.phase_us[ph] == 0.0) continue;
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", cost_phase_names[ph]);
        rpt_table_cell(t, NULL, "%.2f ms", med[ph]);
        rpt_table_cell(t, NULL, "%.2f ms", p.phase_us[ph] / 1e3);
        if (p.phase_us[ph] > 0) rpt_table_cell(t, NULL, "%+.0f%%", 100.0 * (med[ph] * 1e3 / p.phase_us[ph] - 1.0));
        else rpt_table_cell(t, NULL, "-");
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    printf("\nmedian step %.1f ms: %.0f tokens/s, %.1f model TFLOPS, MFU %.1f%% (of %.0f bf16 TFLOPS); "
           "loss %.4f -> %.4f\n",
           mstep, mtps, mtflops, peak > 0 ? 100.0 * mtflops / peak : 0.0, peak, loss[0],
           loss[steps - 1]);
    /* measured.json */
    root = json_object();
    json_object_set_new(root, "plan", json_string(o->plan));
    json_object_set_new(root, "model", json_string(m->name));
    json_t *jd = json_object();
    json_object_set_new(jd, "name", json_string(dev.name));
    json_object_set_new(jd, "sms", json_integer(dev.sm_count));
    json_object_set_new(jd, "memory_bytes", json_real(dev.memory_bytes));
    json_object_set_new(jd, "peak_bf16_tflops", json_real(peak));
    json_object_set_new(root, "device", jd);
    json_t *jr = json_object();
    json_object_set_new(jr, "steps", json_integer(steps));
    json_object_set_new(jr, "seq_len", json_integer(l->seq_len));
    json_object_set_new(jr, "mbs", json_integer(l->mbs));
    json_object_set_new(jr, "micro_batches", json_integer(micro));
    json_object_set_new(jr, "tokens_per_step", json_real(tokens_step));
    json_object_set_new(jr, "recompute", json_string(cost_recompute_names[l->recompute]));
    json_object_set_new(jr, "data", json_string(data.source));
    json_object_set_new(jr, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(jr, "lr_max", json_real(opt.lr_max));
    json_object_set_new(jr, "warmup_steps", json_integer(opt.warmup_steps));
    json_object_set_new(jr, "aux_loss_coef", json_real(o->aux));
    json_object_set_new(jr, "bias_update_rate", json_real(o->bias_rate));
    json_object_set_new(jr, "model_flops_per_token", json_real(fl.train_total));
    json_object_set_new(root, "run", jr);
    json_t *jm = json_object();
    json_object_set_new(jm, "steps_counted", json_integer(n));
    json_object_set_new(jm, "step_ms", json_real(mstep));
    json_object_set_new(jm, "tokens_per_s", json_real(mtps));
    json_object_set_new(jm, "model_tflops", json_real(mtflops));
    json_object_set_new(jm, "mfu", json_real(peak > 0 ? mtflops / peak : 0.0));
    json_object_set_new(jm, "phases_ms", phases_json(med));
    json_object_set_new(root, "median", jm);
    json_t *jp = json_object();
    json_object_set_new(jp, "step_ms", json_real(p.step_us / 1e3));
    double pms[COST_NPHASES];
    for (int ph = 0; ph < COST_NPHASES; ph++) pms[ph] = p.phase_us[ph] / 1e3;
    json_object_set_new(jp, "phases_ms", phases_json(pms));
    json_object_set_new(root, "prediction", jp);
    struct exec_gpu_memory mem;
    exec_gpu_memory(g, &mem);
    json_t *jmem = json_object();
    double alloc = 0;
    for (int c = 0; c < EXEC_MEM_N; c++) {
        json_object_set_new(jmem, exec_mem_names[c], json_real(mem.bytes[c]));
        alloc += mem.bytes[c];
    }
    json_object_set_new(jmem, "allocated_total", json_real(alloc));
    json_object_set_new(jmem, "device_used_peak", json_real(mem.device_used_peak));
    json_object_set_new(jmem, "device_total", json_real(mem.device_total));
    json_object_set_new(root, "memory_bytes", jmem);
    json_t *jl = json_array();
    for (int s = 0; s < steps; s++) json_array_append_new(jl, json_real(loss[s]));
    json_object_set_new(root, "loss_curve", jl);
    json_object_set_new(root, "steps", jsteps);
    jsteps = NULL;
    /* routing in the planner's routing-input form (cost_routing_load reads measured.json) */
    int E = m->moe.experts;
    json_t *jrt = json_object(), *jlay = json_array();
    counts = malloc(sizeof *counts * (size_t)E);
    coact = malloc(sizeof *coact * (size_t)E * E);
    if (!counts || !coact) {
        st = moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        json_decref(jrt), json_decref(jlay);
        goto cleanup;
    }
    json_object_set_new(jrt, "experts", json_integer(E));
    json_object_set_new(jrt, "top_k", json_integer(m->moe.top_k));
    json_object_set_new(jrt, "tokens", json_real(tokens_step * steps));
    for (int b = 0; b < m->layers && st == MOE_OK; b++) {
        if (!mdl_layer_is_moe(m, b)) continue;
        if ((st = exec_gpu_routing(g, b, counts, coact, &err))) break;
        json_t *jo = json_object(), *jc = json_array(), *jco = json_array();
        for (int e = 0; e < E; e++) {
            json_array_append_new(jc, json_integer(counts[e]));
            json_t *row = json_array();
            for (int f = 0; f < E; f++) json_array_append_new(row, json_integer(coact[(size_t)e * E + f]));
            json_array_append_new(jco, row);
        }
        json_object_set_new(jo, "layer", json_integer(b));
        json_object_set_new(jo, "counts", jc);
        json_object_set_new(jo, "coactivation", jco);
        json_array_append_new(jlay, jo);
    }
    json_object_set_new(jrt, "layers", jlay);
    json_object_set_new(root, "routing", jrt);
    if (st != MOE_OK) goto cleanup;
    if ((st = moe_json_write_atomic(o->out, root, "moeplan.measured", 1, &err))) goto cleanup;
    printf("measured.json written to %s\n", o->out);
cleanup:
    json_decref(root);
    json_decref(jsteps);
    free(tokens), free(loss), free(phase), free(counts), free(coact);
    exec_data_close(&data);
    exec_gpu_destroy(g);
    return st == MOE_OK ? 0 : cli_fail(cli, &err);
}

int cmd_run(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct run_opts o = {NULL, NULL, "measured.json", 100, 1, 1, 10, 1, 0.0, 1e-3, 3e-4};
    for (int i = 0; i < nargs; i++) {
        const char *v = args[i].value;
        switch (args[i].val) {
        case OPT_STEPS:
            if (!cli_count(cmd, "steps", v, 1, 10000000, &o.steps)) return 2;
            break;
        case OPT_DATA: o.data = v; break;
        case OPT_OUT: o.out = v; break;
        case OPT_GPUS:
            if (!cli_count(cmd, "gpus", v, 1, 1 << 20, &o.gpus)) return 2;
            break;
        case OPT_SEED:
            if (!cli_count(cmd, "seed", v, 0, UINT32_MAX, &o.seed)) return 2;
            break;
        case OPT_WARMUP:
            if (!cli_count(cmd, "warmup", v, 0, 10000000, &o.warmup)) return 2;
            break;
        case OPT_STREAMS:
            if (!cli_count(cmd, "expert-streams", v, 1, EXEC_MAX_STREAMS, &o.streams)) return 2;
            break;
        case OPT_AUX:
            if (!cli_real(cmd, "aux-loss-coef", v, 0, 10, &o.aux)) return 2;
            break;
        case OPT_BIAS:
            if (!cli_real(cmd, "bias-update-rate", v, 0, 1, &o.bias_rate)) return 2;
            break;
        case OPT_LR:
            if (!cli_real(cmd, "lr", v, 1e-9, 1, &o.lr)) return 2;
            break;
        }
    }
    if (optind != argc - 1) return cli_usage(cmd, "give one plan file");
    o.plan = argv[optind];
    return run(cli, &o);
}
