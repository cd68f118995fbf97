/*
 * cmd_calibrate.c: `moeplan calibrate` and `moeplan validate`, the two commands that close the
 * loop between the cost model and this GPU (issue 9).
 *
 * calibrate: microbenchmarks (executor/calib.cu: GEMMs over a grid with the skinny expert shapes,
 * flash attention, HBM copies, launches) fitted into the efficiencies of the cost model; then a
 * few training steps of calibration jobs (the executor's own kernels, router and permutation
 * included), whose per-phase times fit each phase's correction (scale and fixed time,
 * cost_fit_linear). One GPU cannot measure NVLink or the network: the profile names those values
 * as datasheet defaults.
 *
 * validate: plans a set of one-GPU jobs that differ from the calibration jobs (models, sequence
 * lengths, micro-batches, recompute), runs each, and writes one Markdown report of predicted
 * against measured step and phase times.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "exec.h"
#include "plan.h"
#include "rpt.h"

enum { OPT_QUICK = 1, OPT_CAL, OPT_CLUSTER, OPT_STEPS, OPT_OUT = 'o' };

const struct cli_opt cmd_calibrate_opts[] = {
    {"output", required_argument, OPT_OUT, "FILE", "write the profile here (calibration.json)"},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer shapes and steps (about a minute)"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "the cluster this GPU belongs to (h200-vm)"},
    {NULL, 0, 0, NULL, NULL},
};

const struct cli_opt cmd_validate_opts[] = {
    {"output", required_argument, OPT_OUT, "DIR", "write the report here (validation)"},
    {"calibration", required_argument, OPT_CAL, "FILE", "predict with this profile"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "the cluster this GPU belongs to (h200-vm)"},
    {"steps", required_argument, OPT_STEPS, "N", "training steps a job (10; the first is warm-up)"},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer steps (6)"},
    {NULL, 0, 0, NULL, NULL},
};

/* A one-GPU job: a proxy of a shipped model and its layout. */
struct job {
    const char *model;
    int layers, experts, seq, mbs, micro;
    enum cost_recompute recompute;
};

/* The job's plan as plan_load gives it, with the cost model's prediction under cal. */
static enum moe_status job_plan(struct cli *cli, const struct job *j, const struct topo_cluster *cl,
                                const struct cost_calibration *cal, struct plan_file *p,
                                struct moe_error *err)
{
    char dir[MOE_PATH_MAX];
    memset(p, 0, sizeof *p);
    cli_data_path(cli, "model", dir, sizeof dir);
    struct mdl_overrides ov = {j->layers, j->experts};
    enum moe_status st = mdl_model_resolve(&p->model, j->model, dir, err);
    if (st == MOE_OK) st = mdl_model_override(&p->model, &ov, err);
    if (st != MOE_OK) return st;
    const struct mdl_model *m = &p->model;
    struct cost_layout *l = &p->layout;
    *l = (struct cost_layout){1, 1, 1, 1, 1, 1, 0, j->seq, j->mbs, j->mbs * j->micro, COST_BF16,
                              j->recompute, COST_DISPATCH_ALLTOALL, false};
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, m, cl, cal, 1);
    struct cost_result r;
    if ((st = cost_evaluate(&ctx, l, &r, err))) return st;
    p->gpus = 1;
    p->micro_batches = j->micro;
    snprintf(p->gpu, sizeof p->gpu, "%s", cl->gpu.name);
    p->step_us = r.step_us;
    p->model_tflops_per_gpu = r.model_tflops_per_gpu;
    p->mfu = r.mfu;
    memcpy(p->phase_us, r.exposed_us, sizeof p->phase_us);
    p->buffer_factor = 2.0;
    p->rank = calloc(1, sizeof *p->rank);
    p->stage_layers = malloc(sizeof *p->stage_layers);
    p->placement = malloc(sizeof *p->placement * (size_t)m->layers * (m->moe.experts + 1));
    if (!p->rank || !p->stage_layers || !p->placement)
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    p->stage_layers[0] = m->layers;
    for (int b = 0; b < m->layers; b++)
        for (int e = 0; e < m->moe.experts; e++)
            p->placement[b * m->moe.experts + e] = mdl_layer_is_moe(m, b) ? 0 : -1;
    return MOE_OK;
}

/* Per-phase medians of a job's steps after the first. */
struct job_run {
    int steps, n;
    double (*phase)[COST_NPHASES];
    double loss0, loss1;
};

static void job_step(void *ctx, const struct exec_run_step *s)
{
    struct job_run *r = ctx;
    if (s->step == 1) r->loss0 = s->loss;
    r->loss1 = s->loss;
    if (s->step > 1 && r->n < r->steps) memcpy(r->phase[r->n++], s->gpu.phase_ms, sizeof r->phase[0]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Trains the job `steps` steps; med[p]: the median of each phase (ms) over steps 2..N. */
static enum moe_status job_run(const struct plan_file *p, int steps, double *med, double *loss0,
                               double *loss1, struct moe_error *err)
{
    struct job_run jr = {steps, 0, calloc((size_t)steps, sizeof(double[COST_NPHASES])), 0, 0};
    if (!jr.phase) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    struct exec_run_cfg c;
    memset(&c, 0, sizeof c);
    c.plan = p;
    c.mode = EXEC_RUN_THREADS;
    c.seed = 1;
    c.steps = steps;
    c.warmup = 1;
    c.streams = 1;
    c.lr = 3e-4;
    c.bias_rate = 1e-3;
    c.timeout_s = 60;
    c.fail_rank = c.fail_step = -1;
    c.on_step = job_step;
    c.ctx = &jr;
    struct exec_run_result res;
    enum moe_status st = exec_run(&c, &res, err);
    exec_run_result_free(&res);
    if (st == MOE_OK) {
        double col[512];
        for (int ph = 0; ph < COST_NPHASES; ph++) {
            int n = jr.n < 512 ? jr.n : 512;
            for (int i = 0; i < n; i++) col[i] = jr.phase[i][ph];
            qsort(col, (size_t)n, sizeof col[0], cmp_double);
            med[ph] = n ? (n % 2 ? col[n / 2] : 0.5 * (col[n / 2 - 1] + col[n / 2])) : 0.0;
        }
        *loss0 = jr.loss0;
        *loss1 = jr.loss1;
    }
    free(jr.phase);
    return st;
}

/* How often the cost model counts phase p in a step of job p: the blocks that have it times the
 * micro-batches; once a micro-batch for the embedding, head and loss; once for the optimizer. */
static double occurrences(const struct plan_file *p, int ph)
{
    const struct mdl_model *m = &p->model;
    int moe = 0, dense = 0;
    for (int b = 0; b < m->layers; b++) mdl_layer_is_moe(m, b) ? moe++ : dense++;
    double mb = p->micro_batches;
    switch (ph) {
    case COST_ATTN_FWD: case COST_ATTN_BWD: return (moe + dense) * mb;
    case COST_ROUTER: case COST_PERMUTE: case COST_UNPERMUTE: case COST_EXPERTS_FWD:
    case COST_EXPERTS_BWD: return moe * mb;
    case COST_SHARED_EXPERT: return m->moe.shared_experts ? moe * mb : 0.0;
    case COST_DENSE_FFN: return dense * mb;
    case COST_EMBED: case COST_LM_HEAD: case COST_LOSS: return mb;
    case COST_OPTIMIZER: return 1.0;
    default: return 0.0;
    }
}

static enum moe_status load_cluster(struct cli *cli, const char *name, struct topo_cluster *cl,
                                    struct moe_error *err)
{
    char dir[MOE_PATH_MAX];
    cli_data_path(cli, "topologies", dir, sizeof dir);
    return topo_cluster_resolve(cl, name, dir, err);
}

/* The calibration jobs: large and small experts (Mixtral's; 64 and 128 of DeepSeek-V2-Lite's), a
 * dense block, both attentions, hidden 4096 to 7168, sequences 1024 to 4096, full recompute. */
static const struct job calib_jobs[] = {
    {"mixtral-8x7b", 2, 0, 1024, 2, 1, COST_RECOMPUTE_NONE},
    {"mixtral-8x7b", 3, 0, 4096, 1, 1, COST_RECOMPUTE_NONE},
    {"deepseek-v2-lite", 3, 0, 1024, 2, 1, COST_RECOMPUTE_NONE},
    {"deepseek-v2-lite", 2, 128, 2048, 1, 2, COST_RECOMPUTE_NONE},
    {"deepseek-v2-lite", 3, 0, 4096, 1, 1, COST_RECOMPUTE_FULL},
    {"kimi-k2", 2, 8, 2048, 1, 1, COST_RECOMPUTE_NONE},
};
#define NCALIB ((int)(sizeof calib_jobs / sizeof calib_jobs[0]))

/* The validation jobs: other models, depths, sequences, micro-batching and recompute. */
static const struct job valid_jobs[] = {
    {"deepseek-v2-lite", 4, 0, 2048, 4, 1, COST_RECOMPUTE_NONE},
    {"mixtral-8x7b", 4, 0, 4096, 1, 1, COST_RECOMPUTE_NONE},
    {"deepseek-v2-lite", 3, 96, 2048, 2, 1, COST_RECOMPUTE_NONE},
    {"deepseek-v2-lite", 4, 0, 4096, 2, 1, COST_RECOMPUTE_FULL},
    {"mixtral-8x7b", 2, 0, 2048, 2, 2, COST_RECOMPUTE_NONE},
    {"deepseek-v3", 4, 16, 2048, 1, 1, COST_RECOMPUTE_NONE},
    {"mixtral-8x7b", 2, 16, 4096, 1, 2, COST_RECOMPUTE_NONE},
    {"kimi-k2", 2, 16, 1024, 4, 1, COST_RECOMPUTE_FULL},
};
#define NVALID ((int)(sizeof valid_jobs / sizeof valid_jobs[0]))

static void job_name(const struct job *j, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s L%d%s%.0d seq %d mbs %d x %d%s", j->model, j->layers, j->experts ? " E" : "",
             j->experts, j->seq, j->mbs, j->micro,
             j->recompute == COST_RECOMPUTE_FULL ? " recompute" : "");
}

/* GEMMs of the executor's shapes: the projections, the LM head, and expert GEMMs from a few rows
 * (skinny) to many. */
static enum moe_status measure_gemms(bool quick, struct cost_gemm_sample *s, int *n,
                                     struct moe_error *err)
{
    static const int nk[][2] = {{2048, 7168}, {7168, 2048}, {4096, 14336}, {14336, 4096},
                                {2816, 2048}, {2048, 1408},  {1536, 2048},  {2048, 768},
                                {32000, 4096}, {6144, 4096}};
    static const int ms[] = {32, 128, 512, 2048, 8192, 16384};
    int nn = quick ? 5 : 10, nm = (int)(sizeof ms / sizeof ms[0]);
    *n = 0;
    for (int a = 0; a < nn; a++)
        for (int b = 0; b < nm; b++) {
            if (quick && b % 2) continue;
            struct cost_gemm_sample *x = &s[(*n)++];
            *x = (struct cost_gemm_sample){ms[b], nk[a][0], nk[a][1], 0};
            enum moe_status st = exec_time_gemm(ms[b], nk[a][0], nk[a][1], quick ? 5 : 15, &x->us, err);
            if (st != MOE_OK) return st;
        }
    return MOE_OK;
}

static json_t *num_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

static int calibrate(struct cli *cli, const char *out, bool quick, const char *cluster)
{
    struct moe_error err;
    enum moe_status st;
    struct topo_cluster cl;
    struct exec_device_info dev;
    int ndev = 0;
    if ((st = load_cluster(cli, cluster, &cl, &err))) return cli_fail(cli, &err);
    if ((st = exec_device_count(&ndev, &err))) return cli_fail(cli, &err);
    if (ndev < 1) {
        moe_error_set(&err, MOE_ERR_RUNTIME, "no CUDA GPU on this machine: calibration measures "
                                             "a GPU (plan and predict take a profile made there)");
        return cli_fail(cli, &err);
    }
    if ((st = exec_device_query(0, &dev, &err))) return cli_fail(cli, &err);
    const struct topo_gpu_spec *g = &cl.gpu;
    struct cost_calibration cal;
    cost_calibration_defaults(&cal, g);
    json_t *meas = json_object();
    printf("moeplan calibrate: %s (%s: %.0f bf16 TFLOPS, %.2f TB/s HBM in the datasheet)\n",
           dev.name, g->name, g->bf16_tflops, g->hbm_bytes_per_s / 1e12);
    /* launch and HBM */
    double launch = 0, copy = 0;
    size_t bytes = (size_t)1 << 30;
    if ((st = exec_time_launch(quick ? 5 : 20, &launch, &err)) ||
        (st = exec_time_copy(bytes, quick ? 5 : 20, &copy, &err)))
        goto fail;
    cal.launch_us = launch;
    cal.hbm_eff = fmin(1.0, 2.0 * bytes / (copy * 1e-6) / g->hbm_bytes_per_s);
    printf("  launch %.2f us a kernel; copy of 1 GiB %.0f us: %.2f TB/s read + write, hbm_eff %.3f\n",
           launch, copy, 2.0 * bytes / (copy * 1e-6) / 1e12, cal.hbm_eff);
    json_object_set_new(meas, "launch_us", json_real(launch));
    json_object_set_new(meas, "copy_1gib_us", json_real(copy));
    /* GEMMs */
    struct cost_gemm_sample gs[64];
    int ng = 0;
    if ((st = measure_gemms(quick, gs, &ng, &err))) goto fail;
    double rms = cost_fit_gemm(&cal, g, gs, ng);
    printf("  %d GEMMs: gemm_eff %.3f, m_half %.1f rows, k_half %.1f, fixed %.1f us; fit rms error "
           "%.1f%%\n", ng, cal.gemm_eff, cal.gemm_m_half, cal.gemm_k_half, cal.gemm_fixed_us,
           100 * rms);
    for (int i = 0; i < ng; i++)
        printf("    GEMM %6.0f x %6.0f x %6.0f: %9.1f us, %6.1f TFLOPS; the fit %9.1f us\n", gs[i].m,
               gs[i].n, gs[i].k, gs[i].us, 2e-6 * gs[i].m * gs[i].n * gs[i].k / gs[i].us,
               cost_gemm_us(&cal, g, gs[i].m, gs[i].n, gs[i].k, false));
    json_t *jg = json_array();
    for (int i = 0; i < ng; i++) {
        double v[4] = {gs[i].m, gs[i].n, gs[i].k, gs[i].us};
        json_array_append_new(jg, num_array(v, 4));
    }
    json_object_set_new(meas, "gemm_m_n_k_us", jg);
    json_object_set_new(meas, "gemm_fit_rms", json_real(rms));
    /* attention: GQA at the shipped widths, MLA's 192/128 */
    static const int at[][6] = {{4, 1024, 32, 8, 128, 128}, {1, 4096, 32, 8, 128, 128},
                                {2, 2048, 16, 16, 192, 128}, {1, 4096, 16, 16, 192, 128},
                                {2, 2048, 32, 4, 128, 128}};
    double fe[8], be[8];
    int na = quick ? 3 : 5;
    json_t *ja = json_array();
    for (int i = 0; i < na; i++) {
        double f, b;
        if ((st = exec_time_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5],
                                      quick ? 3 : 10, &f, &b, &err)))
            goto fail;
        /* the cost model's count: 2 heads (dqk + dv) per attended key, (S + 1) / 2 keys */
        double flops = (double)at[i][0] * at[i][1] * 2.0 * at[i][2] * (at[i][4] + at[i][5]) *
                       (at[i][1] + 1) / 2.0;
        fe[i] = flops / ((f - launch) * 1e-6) / (g->bf16_tflops * 1e12);
        be[i] = 2.5 * flops / ((b - launch) * 1e-6) / (g->bf16_tflops * 1e12);
        double v[8] = {at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5], f, b};
        json_array_append_new(ja, num_array(v, 8));
    }
    qsort(fe, (size_t)na, sizeof fe[0], cmp_double);
    qsort(be, (size_t)na, sizeof be[0], cmp_double);
    cal.attn_fwd_eff = fe[na / 2];
    cal.attn_bwd_eff = be[na / 2];
    printf("  %d attention shapes: attn_fwd_eff %.3f, attn_bwd_eff %.3f (medians)\n", na,
           cal.attn_fwd_eff, cal.attn_bwd_eff);
    json_object_set_new(meas, "attention_seqs_seq_h_kv_dqk_dv_fwd_bwd_us", ja);
    /* the calibration jobs: per-phase corrections */
    {
        int steps = quick ? 5 : 9;
        double model[NCALIB][COST_NPHASES], count[NCALIB][COST_NPHASES], got[NCALIB][COST_NPHASES];
        json_t *jj = json_array();
        for (int i = 0; i < NCALIB; i++) {
            struct plan_file p;
            char name[128];
            double l0, l1;
            job_name(&calib_jobs[i], name, sizeof name);
            st = job_plan(cli, &calib_jobs[i], &cl, &cal, &p, &err);
            if (st == MOE_OK) st = job_run(&p, steps, got[i], &l0, &l1, &err);
            for (int ph = 0; st == MOE_OK && ph < COST_NPHASES; ph++) {
                model[i][ph] = p.phase_us[ph];
                count[i][ph] = occurrences(&p, ph);
                got[i][ph] *= 1e3; /* us */
            }
            if (st == MOE_OK)
                printf("  job %d, %s: step %.1f ms, %.1f ms predicted before the phase fit\n",
                       i + 1, name, got[i][COST_STEP] / 1e3, p.step_us / 1e3);
            json_t *o = json_object();
            json_object_set_new(o, "job", json_string(name));
            if (st == MOE_OK) {
                json_object_set_new(o, "measured_phases_us", num_array(got[i], COST_NPHASES));
                json_object_set_new(o, "model_phases_us", num_array(model[i], COST_NPHASES));
            }
            json_array_append_new(jj, o);
            plan_file_free(&p);
            if (st != MOE_OK) goto fail;
        }
        json_object_set_new(meas, "jobs", jj);
        json_object_set_new(meas, "phase_order", json_null());
        json_t *jp = json_array();
        for (int ph = 0; ph < COST_NPHASES; ph++) json_array_append_new(jp, json_string(cost_phase_names[ph]));
        json_object_set(meas, "phase_order", jp);
        json_decref(jp);
        printf("  per-phase fit over the %d jobs (measured = scale x model + fixed per occurrence):\n",
               NCALIB);
        for (int ph = 0; ph < COST_NPHASES; ph++) {
            double m[NCALIB], c[NCALIB], y[NCALIB], any = 0;
            for (int i = 0; i < NCALIB; i++) {
                m[i] = model[i][ph];
                c[i] = count[i][ph];
                y[i] = got[i][ph];
                any += c[i] * y[i];
            }
            if (any <= 0) continue;
            double sc, fx, e = cost_fit_linear(m, c, y, NCALIB, &sc, &fx);
            cal.phase_scale[ph] = sc;
            cal.phase_fixed_us[ph] = fx;
            printf("    %-14s scale %6.3f  fixed %8.1f us  rms %5.1f%%\n", cost_phase_names[ph], sc,
                   fx, 100 * e);
        }
    }
    {
        json_t *meta = json_object(), *lib = json_object(), *dflt = json_array();
        struct exec_versions v;
        exec_versions_get(&v);
        char buf[64], date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
        json_object_set_new(meta, "gpu", json_string(dev.name));
        snprintf(buf, sizeof buf, "%d.%d", v.cuda_driver / 1000, (v.cuda_driver % 1000) / 10);
        json_object_set_new(meta, "driver", json_string(buf));
        json_object_set_new(meta, "date", json_string(date));
        snprintf(buf, sizeof buf, "%d.%d", v.cuda_runtime / 1000, (v.cuda_runtime % 1000) / 10);
        json_object_set_new(lib, "cuda_runtime", json_string(buf));
        snprintf(buf, sizeof buf, "%d.%d.%d", v.cublas_major, v.cublas_minor, v.cublas_patch);
        json_object_set_new(lib, "cublas", json_string(buf));
        snprintf(buf, sizeof buf, "%d.%d.%d", v.nccl_runtime / 10000, (v.nccl_runtime / 100) % 100,
                 v.nccl_runtime % 100);
        json_object_set_new(lib, "nccl", json_string(buf));
        json_object_set_new(meta, "libraries", lib);
        static const char *const defaults[] = {
            "gemm_eff_fp8 (no fp8 GEMM in the executor)", "nvlink_eff (one GPU: no NVLink)",
            "nvlink_allreduce_eff (one GPU)", "scale_out_eff (no network)",
            "a2a_latency_us (one GPU)", "overlap_max (one GPU)", "gemm_tile_m, gemm_tile_n"};
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            json_array_append_new(dflt, json_string(defaults[i]));
        json_object_set_new(meta, "defaults_used", dflt);
        json_object_set_new(meta, "measured", meas);
        meas = NULL;
        json_object_set_new(meta, "fit", json_string(quick ? "moeplan calibrate --quick" : "moeplan calibrate"));
        st = cost_calibration_write(&cal, meta, out, &err);
        json_decref(meta);
        if (st != MOE_OK) return cli_fail(cli, &err);
    }
    printf("profile written to %s (NVLink, network and fp8 values: datasheet defaults)\n", out);
    return 0;
fail:
    json_decref(meas);
    return cli_fail(cli, &err);
}

int cmd_calibrate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *out = "calibration.json", *cluster = "h200-vm";
    bool quick = false;
    for (int i = 0; i < nargs; i++) {
        if (args[i].val == OPT_OUT) out = args[i].value;
        if (args[i].val == OPT_QUICK) quick = true;
        if (args[i].val == OPT_CLUSTER) cluster = args[i].value;
    }
    if (optind != argc) return cli_usage(cmd, "no operands");
    return calibrate(cli, out, quick, cluster);
}

/* validate ------------------------------------------------------------------------------------- */

static int validate(struct cli *cli, const char *dir, const char *cal_file, const char *cluster,
                    int steps)
{
    struct moe_error err;
    struct topo_cluster cl;
    struct cost_calibration cal;
    if (load_cluster(cli, cluster, &cl, &err)) return cli_fail(cli, &err);
    cost_calibration_defaults(&cal, &cl.gpu);
    if (cal_file && cost_calibration_load(&cal, cal_file, &err)) return cli_fail(cli, &err);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        moe_error_set_at(&err, MOE_ERR_IO, dir, 0, 0, "cannot create the folder: %s", strerror(errno));
        return cli_fail(cli, &err);
    }
    printf("moeplan validate: %d one-GPU jobs, %d steps each, predicted with %s\n", NVALID, steps,
           cal.source);
    const char *h[] = {"job", "predicted", "measured", "error", "worst phase > 5% of the step"};
    struct rpt_table *t = rpt_table_create(5, h, "lrrrl");
    /* per-phase errors of the phases that matter (blank: under 5% of the measured step) */
    static const int cols[] = {COST_EMBED, COST_ATTN_FWD, COST_ATTN_BWD, COST_ROUTER,
                               COST_EXPERTS_FWD, COST_EXPERTS_BWD, COST_SHARED_EXPERT,
                               COST_DENSE_FFN, COST_LM_HEAD, COST_LOSS, COST_OPTIMIZER};
    enum { NCOLS = (int)(sizeof cols / sizeof cols[0]) };
    const char *h2[NCOLS + 1] = {"job"};
    char align[NCOLS + 2] = "l";
    for (int c = 0; c < NCOLS; c++) h2[c + 1] = cost_phase_names[cols[c]], strcat(align, "r");
    struct rpt_table *t2 = rpt_table_create(NCOLS + 1, h2, align);
    double sum = 0, worst = 0;
    int done = 0;
    for (int i = 0; i < NVALID && t && t2; i++) {
        struct plan_file p;
        char name[128];
        double med[COST_NPHASES], l0, l1;
        job_name(&valid_jobs[i], name, sizeof name);
        enum moe_status st = job_plan(cli, &valid_jobs[i], &cl, &cal, &p, &err);
        if (st == MOE_OK) st = job_run(&p, steps, med, &l0, &l1, &err);
        double pstep = p.step_us, pph[COST_NPHASES];
        memcpy(pph, p.phase_us, sizeof pph);
        plan_file_free(&p);
        if (st == MOE_ERR_UNSUPPORTED || st == MOE_ERR_INFEASIBLE) { /* reported, not counted */
            printf("  %d/%d %s: not run: %s\n", i + 1, NVALID, name, err.message);
            rpt_table_row(t, NULL);
            rpt_table_cell(t, NULL, "%s", name);
            rpt_table_cell(t, NULL, "-");
            rpt_table_cell(t, NULL, "-");
            rpt_table_cell(t, NULL, "-");
            rpt_table_cell(t, NULL, "not run: %.120s", err.message);
            continue;
        }
        if (st != MOE_OK) {
            rpt_table_destroy(t);
            rpt_table_destroy(t2);
            return cli_fail(cli, &err);
        }
        double pred = pstep / 1e3, e = med[COST_STEP] / pred - 1.0;
        done++;
        sum += fabs(e);
        if (fabs(e) > worst) worst = fabs(e);
        char wp[96] = "-";
        double we = 0;
        for (int ph = 0; ph < COST_STEP; ph++) {
            if (med[ph] < 0.05 * med[COST_STEP] || pph[ph] <= 0) continue;
            double pe = med[ph] / (pph[ph] / 1e3) - 1.0;
            if (fabs(pe) > fabs(we)) {
                we = pe;
                snprintf(wp, sizeof wp, "%s %+.0f%%", cost_phase_names[ph], 100 * pe);
            }
        }
        rpt_table_row(t2, NULL);
        rpt_table_cell(t2, NULL, "%s", name);
        for (int c = 0; c < NCOLS; c++) {
            int ph = cols[c];
            if (med[ph] < 0.05 * med[COST_STEP] || pph[ph] <= 0) rpt_table_cell(t2, NULL, " ");
            else rpt_table_cell(t2, NULL, "%+.0f%%", 100 * (med[ph] / (pph[ph] / 1e3) - 1.0));
        }
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", name);
        rpt_table_cell(t, NULL, "%.1f ms", pred);
        rpt_table_cell(t, NULL, "%.1f ms", med[COST_STEP]);
        rpt_table_cell(t, NULL, "%+.1f%%", 100 * e);
        rpt_table_cell(t, NULL, "%s", wp);
        printf("  %d/%d %s: measured %.1f ms, predicted %.1f ms (%+.1f%%), loss %.3f -> %.3f\n",
               i + 1, NVALID, name, med[COST_STEP], pred, 100 * e, l0, l1);
        fflush(stdout);
    }
    if (!t || !t2 || done == 0) {
        rpt_table_destroy(t);
        rpt_table_destroy(t2);
        moe_error_set(&err, t && t2 ? MOE_ERR_RUNTIME : MOE_ERR_NOMEM,
                      t && t2 ? "no validation job ran" : "out of memory");
        return cli_fail(cli, &err);
    }
    printf("\n");
    rpt_table_print(t, stdout);
    printf("\nerror of each phase of 5%% of the step or more:\n");
    rpt_table_print(t2, stdout);
    printf("\nstep error: mean |error| %.1f%%, worst %.1f%% (targets with a profile: each within 5%%, "
           "mean under 3%%)\n", 100 * sum / done, 100 * worst);
    char path[MOE_PATH_MAX], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/README.md", dir);
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        rpt_table_destroy(t);
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        return cli_fail(cli, &err);
    }
    fprintf(f, "# Validation: predicted against measured step time\n\n");
    fprintf(f, "`moeplan validate%s%s --steps %d`: %d one-GPU jobs, each trained %d steps (medians "
               "of steps 2-%d, CUDA events), predicted with %s.\n\n",
            cal_file ? " --calibration " : "", cal_file ? cal_file : "", steps, NVALID, steps, steps,
            cal.source);
    rpt_table_print_markdown(t, f);
    fprintf(f, "\nMean |error| %.1f%% of the step, worst %.1f%%, over %d jobs.\n\n", 100 * sum / done,
            100 * worst, done);
    fprintf(f, "Error of each phase that takes 5%% of the step or more (measured / predicted - 1):\n\n");
    rpt_table_print_markdown(t2, f);
    fclose(f);
    rpt_table_destroy(t);
    rpt_table_destroy(t2);
    enum moe_status st = moe_file_write_atomic(path, text, len, &err);
    free(text);
    if (st != MOE_OK) return cli_fail(cli, &err);
    printf("report written to %s\n", path);
    return 0;
}

int cmd_validate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *dir = "validation", *cal = NULL, *cluster = "h200-vm";
    uint64_t steps = 10;
    for (int i = 0; i < nargs; i++) {
        switch (args[i].val) {
        case OPT_OUT: dir = args[i].value; break;
        case OPT_CAL: cal = args[i].value; break;
        case OPT_CLUSTER: cluster = args[i].value; break;
        case OPT_QUICK: steps = 6; break;
        case OPT_STEPS:
            if (!cli_count(cmd, "steps", args[i].value, 3, 10000, &steps)) return 2;
            break;
        }
    }
    if (optind != argc) return cli_usage(cmd, "no operands");
    return validate(cli, dir, cal, cluster, (int)steps);
}
