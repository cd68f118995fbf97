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

enum { OPT_QUICK = 1, OPT_CAL, OPT_CLUSTER, OPT_STEPS, OPT_REFIT, OPT_OUT = 'o' };

const struct cli_opt cmd_calibrate_opts[] = {
    {"output", required_argument, OPT_OUT, "FILE", "write the profile here (calibration.json)"},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer shapes and steps (about a minute)"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "the cluster this GPU belongs to (h200-vm)"},
    {"refit", required_argument, OPT_REFIT, "PROFILE",
     "no GPU needed: fit again the measurements a profile keeps (after a change of the model)"},
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

/* A one-GPU job: a proxy of a shipped model and its layout; skew > 0 skews its routing with a
 * fixed selection bias (expert e gets skew x (E - 1 - e) / (E - 1) / E added to its score),
 * and the job is predicted with the routing it measured, as `plan --routing` does. */
struct job {
    const char *model;
    int layers, experts, seq, mbs, micro;
    enum cost_recompute recompute;
    double skew;
};

/* The job's plan as plan_load gives it, with the cost model's prediction under cal. */
static enum moe_status job_plan(struct cli *cli, const struct job *j, const struct topo_cluster *cl,
                                const struct cost_calibration *cal,
                                const struct cost_routing *routing, struct plan_file *p,
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
    *l = (struct cost_layout){.tp = 1, .pp = 1, .vpp = 1, .ep = 1, .etp = 1, .dp = 1, .zero = 0,
                              .seq_len = j->seq, .mbs = j->mbs, .gbs = j->mbs * j->micro,
                              .precision = COST_BF16, .recompute = j->recompute,
                              .dispatcher = COST_DISPATCH_ALLTOALL, .overlap = false};
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, m, cl, cal, 1);
    ctx.routing = routing;
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
    if (s->step > 1 && r->n < r->steps)
        memcpy(r->phase[r->n++], s->gpu.phase_ms, sizeof r->phase[0]);
}

/* Trains the job `steps` steps; med[p]: the median of each phase (ms) over steps 2..N; with
 * routing, the MoE layers' measured routing too (cost_routing_free it). */
static enum moe_status job_run(const struct plan_file *p, double skew, int steps, double *med,
                               double *loss0, double *loss1, struct cost_routing *routing,
                               struct moe_error *err)
{
    const struct mdl_model *m = &p->model;
    int E = m->moe.experts;
    struct job_run jr = {steps, 0, calloc((size_t)steps, sizeof(double[COST_NPHASES])), 0, 0};
    double *bias = skew > 0 ? calloc((size_t)m->layers * E, sizeof *bias) : NULL;
    if (!jr.phase || (skew > 0 && !bias)) {
        free(jr.phase), free(bias);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; bias && b < m->layers; b++)
        for (int e = 0; e < E; e++)
            bias[(size_t)b * E + e] = E > 1 ? skew * (E - 1 - e) / (E - 1) / E : 0.0;
    struct exec_run_cfg c;
    memset(&c, 0, sizeof c);
    c.plan = p;
    c.mode = EXEC_RUN_THREADS;
    c.seed = 1;
    c.steps = steps;
    c.warmup = 1;
    c.streams = 1;
    c.lr = 3e-4;
    c.bias_rate = skew > 0 ? 0.0 : 1e-3; /* a skewed job keeps its bias */
    c.bias0 = bias;
    c.timeout_s = 60;
    c.fail_rank = c.fail_step = -1;
    c.on_step = job_step;
    c.ctx = &jr;
    struct exec_run_result res;
    memset(&res, 0, sizeof res);
    enum moe_status st = exec_run(&c, &res, err);
    if (st == MOE_OK && routing) { /* the MoE layers' rows of (layers, experts) */
        int64_t *moe = malloc(sizeof *moe * (size_t)m->layers * E);
        int n = 0;
        for (int b = 0; moe && b < m->layers; b++)
            if (mdl_layer_is_moe(m, b))
                memcpy(moe + (size_t)n++ * E, res.counts + (size_t)b * E, sizeof *moe * E);
        st = moe ? cost_routing_from_counts(routing, moe, n, E, m->moe.top_k, err)
                 : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        free(moe);
    }
    exec_run_result_free(&res);
    free(bias);
    if (st == MOE_OK) {
        double col[512];
        for (int ph = 0; ph < COST_NPHASES; ph++) {
            int n = jr.n < 512 ? jr.n : 512;
            for (int i = 0; i < n; i++) col[i] = jr.phase[i][ph];
            med[ph] = moe_median(col, (size_t)n);
        }
        *loss0 = jr.loss0;
        *loss1 = jr.loss1;
    }
    free(jr.phase);
    return st;
}

/* How often the cost model counts phase p in a step of job p: the blocks that have it times the
 * micro-batches (a block's forward twice with full recompute); once a micro-batch for the
 * embedding, head and loss; once for the optimizer. */
static double occurrences(const struct plan_file *p, int ph)
{
    const struct mdl_model *m = &p->model;
    int moe = 0, dense = 0;
    for (int b = 0; b < m->layers; b++) mdl_layer_is_moe(m, b) ? moe++ : dense++;
    double mb = p->micro_batches;
    double fwd = p->layout.recompute == COST_RECOMPUTE_FULL ? 2.0 * mb : mb;
    switch (ph) {
    case COST_ATTN_FWD: return (moe + dense) * fwd;
    case COST_ATTN_BWD: return (moe + dense) * mb;
    case COST_EXPERTS_BWD: return moe * mb;
    case COST_ROUTER: case COST_PERMUTE: case COST_UNPERMUTE: case COST_EXPERTS_FWD:
        return moe * fwd;
    case COST_SHARED_EXPERT: return m->moe.shared_experts ? moe * fwd : 0.0;
    case COST_DENSE_FFN: return dense * fwd;
    case COST_EMBED: case COST_LM_HEAD: case COST_LOSS: return mb;
    case COST_OPTIMIZER: return 1.0;
    default: return 0.0;
    }
}

/* The calibration jobs: large and small experts (Mixtral's; 64 and 128 of DeepSeek-V2-Lite's), a
 * dense block, both attentions, hidden 4096 to 7168, sequences 1024 to 4096, full recompute. */
static const struct job calib_jobs[] = {
    {"mixtral-8x7b", 2, 0, 1024, 2, 1, COST_RECOMPUTE_NONE, 0},
    {"mixtral-8x7b", 3, 0, 4096, 1, 1, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v2-lite", 3, 0, 1024, 2, 1, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v2-lite", 2, 128, 2048, 1, 2, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v2-lite", 3, 0, 4096, 1, 1, COST_RECOMPUTE_FULL, 0},
    {"kimi-k2", 2, 32, 2048, 1, 1, COST_RECOMPUTE_NONE, 0},
};
#define NCALIB ((int)(sizeof calib_jobs / sizeof calib_jobs[0]))

/* The validation jobs: other models, depths, sequences, micro-batching, recompute and skew. */
static const struct job valid_jobs[] = {
    {"deepseek-v2-lite", 4, 0, 2048, 4, 1, COST_RECOMPUTE_NONE, 0},
    {"mixtral-8x7b", 4, 0, 4096, 1, 1, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v2-lite", 3, 96, 2048, 2, 1, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v2-lite", 4, 0, 4096, 2, 1, COST_RECOMPUTE_FULL, 0},
    {"mixtral-8x7b", 2, 0, 2048, 2, 2, COST_RECOMPUTE_NONE, 0},
    {"deepseek-v3", 4, 16, 2048, 1, 1, COST_RECOMPUTE_NONE, 0},
    {"mixtral-8x7b", 2, 16, 4096, 1, 2, COST_RECOMPUTE_NONE, 0},
    {"kimi-k2", 2, 16, 1024, 4, 1, COST_RECOMPUTE_FULL, 0},
    {"deepseek-v2-lite", 3, 0, 2048, 2, 1, COST_RECOMPUTE_NONE, 1.0},
};
#define NVALID ((int)(sizeof valid_jobs / sizeof valid_jobs[0]))

static void job_name(const struct job *j, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s L%d%s%.0d seq %d mbs %d x %d%s", j->model, j->layers,
                     j->experts ? " E" : "", j->experts, j->seq, j->mbs, j->micro,
                     j->recompute == COST_RECOMPUTE_FULL ? " recompute" : "");
    if (j->skew > 0 && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - n, " skew %g", j->skew);
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
            enum moe_status st =
                exec_time_gemm(ms[b], nk[a][0], nk[a][1], quick ? 5 : 15, &x->us, err);
            if (st != MOE_OK) return st;
        }
    return MOE_OK;
}

/* The executor's expert block (`moeplan bench moe`'s): the expert shapes of the shipped models
 * and their proxies, few rows an expert to many. Each row: experts, top-k, hidden, intermediate,
 * tokens, then the forward and the backward, us. */
#define EXPERT_COLS 7
#define EXPERT_KEY "experts_e_k_h_f_tokens_fwd_bwd_us"
static enum moe_status measure_experts(bool quick, double (*x)[EXPERT_COLS], int *n,
                                       struct moe_error *err)
{
    static const int shape[][4] = {{8, 2, 4096, 14336}, {64, 6, 2048, 1408}, {128, 6, 2048, 1408},
                                   {16, 8, 7168, 2048}, {32, 8, 7168, 2048}};
    static const int tokens[] = {1024, 4096, 8192};
    int ns = (int)(sizeof shape / sizeof shape[0]), nt = (int)(sizeof tokens / sizeof tokens[0]);
    *n = 0;
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < nt; b++) {
            if (quick && b == 1) continue;
            struct exec_moe_bench_cfg c = {shape[a][0], tokens[b], shape[a][1], shape[a][2],
                                           shape[a][3], 0, 2, quick ? 3 : 7, 0.0, 17};
            struct exec_moe_bench_result r;
            int *choice = malloc(sizeof(int) * (size_t)c.tokens * c.top_k);
            if (!choice) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
            enum moe_status st = exec_moe_bench(&c, choice, &r, err);
            free(choice);
            if (st != MOE_OK) return st;
            double *v = x[(*n)++];
            for (int k = 0; k < 4; k++) v[k] = shape[a][k];
            v[4] = tokens[b];
            v[5] = r.block_fwd_ms * 1e3;
            v[6] = (r.block_ms - r.block_fwd_ms) * 1e3;
        }
    return MOE_OK;
}

static json_t *num_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* Everything calibrate measures: what the fit reads, what the profile keeps ("measured"), and
 * what --refit reads back from a profile to fit again without a GPU. */
#define MAX_GEMMS 128
#define MAX_ATTN 16
#define MAX_JOBS 16
#define MAX_EXPERT_SHAPES 32
struct calib_data {
    char gpu[256], driver[32], date[32], cuda[32], cublas[32], nccl[32];
    double launch_us, copy_us, copy_bytes;
    struct cost_gemm_sample gemm[MAX_GEMMS];
    int ngemm;
    double attn[MAX_ATTN][8]; /* seqs, seq, heads, kv heads, dqk, dv, forward us, backward us */
    int nattn;
    double expert[MAX_EXPERT_SHAPES][EXPERT_COLS]; /* measure_experts' rows */
    int nexpert;
    struct job job[MAX_JOBS];
    char model[MAX_JOBS][64];
    double got[MAX_JOBS][COST_NPHASES]; /* each job's median phases, us */
    int njobs;
    bool quick;
};

/* "mixtral-8x7b L2 E16 seq 1024 mbs 2 x 1 recompute" (job_name's form) back into a job. */
static bool job_parse(const char *name, struct job *j, char *model, size_t cap)
{
    char m[64];
    int n = 0;
    memset(j, 0, sizeof *j);
    if (sscanf(name, "%63s L%d%n", m, &j->layers, &n) != 2) return false;
    const char *r = name + n;
    if (sscanf(r, " E%d%n", &j->experts, &n) == 1) r += n;
    if (sscanf(r, " seq %d mbs %d x %d%n", &j->seq, &j->mbs, &j->micro, &n) != 3) return false;
    j->recompute = strstr(r + n, "recompute") ? COST_RECOMPUTE_FULL : COST_RECOMPUTE_NONE;
    const char *sk = strstr(r + n, " skew ");
    if (sk && sscanf(sk, " skew %lf", &j->skew) != 1) return false;
    snprintf(model, cap, "%s", m);
    j->model = model;
    return j->layers > 0 && j->seq > 0 && j->mbs > 0 && j->micro > 0;
}

/* On the GPU: the microbenchmarks and the calibration jobs. */
static enum moe_status measure(struct cli *cli, const struct topo_cluster *cl, bool quick,
                               struct calib_data *d, struct moe_error *err)
{
    struct exec_device_info dev;
    struct exec_versions v;
    int ndev = 0;
    enum moe_status st = exec_device_count(&ndev, err);
    if (st != MOE_OK) return st;
    if (ndev < 1)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "no CUDA GPU on this machine: calibration measures a GPU (plan and "
                             "predict take a profile made there; --refit fits one again here)");
    if ((st = exec_device_query(0, &dev, err))) return st;
    exec_versions_get(&v);
    memset(d, 0, sizeof *d);
    d->quick = quick;
    time_t now = time(NULL);
    strftime(d->date, sizeof d->date, "%Y-%m-%d", gmtime(&now));
    snprintf(d->gpu, sizeof d->gpu, "%s", dev.name);
    snprintf(d->driver, sizeof d->driver, "%d.%d", v.cuda_driver / 1000,
             (v.cuda_driver % 1000) / 10);
    snprintf(d->cuda, sizeof d->cuda, "%d.%d", v.cuda_runtime / 1000, (v.cuda_runtime % 1000) / 10);
    snprintf(d->cublas, sizeof d->cublas, "%d.%d.%d", v.cublas_major, v.cublas_minor,
             v.cublas_patch);
    snprintf(d->nccl, sizeof d->nccl, "%d.%d.%d", v.nccl_runtime / 10000,
             (v.nccl_runtime / 100) % 100, v.nccl_runtime % 100);
    printf("moeplan calibrate: %s (%s: %.0f bf16 TFLOPS, %.2f TB/s HBM in the datasheet)\n",
           dev.name, cl->gpu.name, cl->gpu.bf16_tflops, cl->gpu.hbm_bytes_per_s / 1e12);
    size_t bytes = (size_t)1 << 30;
    d->copy_bytes = (double)bytes;
    if ((st = exec_time_launch(quick ? 5 : 20, &d->launch_us, err)) ||
        (st = exec_time_copy(bytes, quick ? 5 : 20, &d->copy_us, err)) ||
        (st = measure_gemms(quick, d->gemm, &d->ngemm, err)) ||
        (st = measure_experts(quick, d->expert, &d->nexpert, err)))
        return st;
    static const int at[][6] = {{4, 1024, 32, 8, 128, 128}, {1, 4096, 32, 8, 128, 128},
                                {2, 2048, 16, 16, 192, 128}, {1, 4096, 16, 16, 192, 128},
                                {2, 2048, 32, 4, 128, 128},  {4, 1024, 16, 16, 192, 128},
                                {8, 512, 32, 8, 128, 128},   {2, 2048, 32, 8, 128, 128}};
    d->nattn = quick ? 3 : 8;
    for (int i = 0; i < d->nattn; i++) {
        for (int k = 0; k < 6; k++) d->attn[i][k] = at[i][k];
        if ((st = exec_time_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5],
                                      quick ? 3 : 10, &d->attn[i][6], &d->attn[i][7], err)))
            return st;
    }
    struct cost_calibration base;
    cost_calibration_defaults(&base, &cl->gpu);
    for (int i = 0; i < NCALIB; i++) {
        struct plan_file p;
        double l0, l1;
        d->job[i] = calib_jobs[i];
        st = job_plan(cli, &calib_jobs[i], cl, &base, NULL, &p, err);
        if (st == MOE_OK) st = job_run(&p, 0.0, quick ? 5 : 9, d->got[i], &l0, &l1, NULL, err);
        plan_file_free(&p);
        if (st != MOE_OK) return st;
        for (int ph = 0; ph < COST_NPHASES; ph++) d->got[i][ph] *= 1e3; /* us */
        d->njobs++;
    }
    return MOE_OK;
}

/* Row i of arr: n positive finite numbers. */
static enum moe_status number_row(const struct moe_jval *arr, size_t i, double *v, int n,
                                  struct moe_error *err)
{
    json_t *row = json_array_get(arr->json, i);
    if (!json_is_array(row) || (int)json_array_size(row) != n)
        return moe_jval_error(arr, NULL, err, "entry %zu: a list of %d numbers", i, n);
    for (int k = 0; k < n; k++) {
        json_t *x = json_array_get(row, (size_t)k);
        v[k] = json_is_number(x) ? json_number_value(x) : -1;
        if (!(v[k] > 0 && v[k] < 1e12))
            return moe_jval_error(arr, NULL, err, "entry %zu, number %d: positive and finite", i,
                                  k);
    }
    return MOE_OK;
}

/* A profile's "measured" back into the data (--refit). */
static enum moe_status load_data(const char *file, struct calib_data *d, struct moe_error *err)
{
    struct moe_jdoc doc;
    struct moe_jval root, m, arr, lib;
    memset(d, 0, sizeof *d);
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    bool have_lib = false;
    if ((st = moe_jdoc_root(&doc, &root, err)) ||
        (st = moe_jval_str(&root, "gpu", true, NULL, d->gpu, sizeof d->gpu, err)) ||
        (st = moe_jval_str(&root, "driver", false, "?", d->driver, sizeof d->driver, err)) ||
        (st = moe_jval_str(&root, "date", false, "?", d->date, sizeof d->date, err)) ||
        (st = moe_jval_object(&root, "libraries", false, &lib, &have_lib, err)) ||
        (st = moe_jval_object(&root, "measured", true, &m, NULL, err)) ||
        (st = moe_jval_num(&m, "launch_us", true, 0, 0, 1e4, &d->launch_us, err)) ||
        (st = moe_jval_num(&m, "copy_1gib_us", true, 0, 1, 1e9, &d->copy_us, err)))
        goto done;
    if (have_lib &&
        ((st = moe_jval_str(&lib, "cuda_runtime", false, "?", d->cuda, sizeof d->cuda, err)) ||
         (st = moe_jval_str(&lib, "cublas", false, "?", d->cublas, sizeof d->cublas, err)) ||
         (st = moe_jval_str(&lib, "nccl", false, "?", d->nccl, sizeof d->nccl, err))))
        goto done;
    d->copy_bytes = 1073741824.0;
    if ((st = moe_jval_array(&m, "gemm_m_n_k_us", true, &arr, NULL, err))) goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->ngemm < MAX_GEMMS; i++) {
        double v[4];
        if ((st = number_row(&arr, i, v, 4, err))) goto done;
        d->gemm[d->ngemm++] = (struct cost_gemm_sample){v[0], v[1], v[2], v[3]};
    }
    if ((st = moe_jval_array(&m, "attention_seqs_seq_h_kv_dqk_dv_fwd_bwd_us", true, &arr, NULL,
                             err)))
        goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->nattn < MAX_ATTN; i++, d->nattn++)
        if ((st = number_row(&arr, i, d->attn[d->nattn], 8, err))) goto done;
    bool have_ex = false; /* profiles before the expert benchmark have none */
    if ((st = moe_jval_array(&m, EXPERT_KEY, false, &arr, &have_ex, err))) goto done;
    for (size_t i = 0; have_ex && i < moe_jval_len(&arr) && d->nexpert < MAX_EXPERT_SHAPES;
         i++, d->nexpert++)
        if ((st = number_row(&arr, i, d->expert[d->nexpert], EXPERT_COLS, err))) goto done;
    if ((st = moe_jval_array(&m, "jobs", true, &arr, NULL, err))) goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->njobs < MAX_JOBS; i++) {
        struct moe_jval jo, ph;
        char name[128];
        int n = d->njobs;
        if ((st = moe_jval_at_object(&arr, i, &jo, err)) ||
            (st = moe_jval_str(&jo, "job", true, NULL, name, sizeof name, err)) ||
            (st = moe_jval_array(&jo, "measured_phases_us", true, &ph, NULL, err)))
            goto done;
        if (!job_parse(name, &d->job[n], d->model[n], sizeof d->model[n]) ||
            (int)moe_jval_len(&ph) != COST_NPHASES) {
            st = moe_jval_error(&jo, "job", err, "\"%s\": not a calibration job of this build",
                                name);
            goto done;
        }
        for (int k = 0; k < COST_NPHASES; k++)
            if ((st = moe_jval_at_num(&ph, (size_t)k, 0, 1e12, &d->got[n][k], err))) goto done;
        d->njobs++;
    }
done:
    moe_jdoc_free(&doc);
    return st;
}

/* Flash attention: efficiency x seq / (seq + attn_seq_half) of the bf16 peak
 * (cost_fit_attention). */
static void fit_attention(const struct topo_gpu_spec *g, const struct calib_data *d,
                          struct cost_calibration *cal)
{
    struct cost_attn_sample s[MAX_ATTN];
    for (int i = 0; i < d->nattn; i++) {
        const double *a = d->attn[i];
        s[i] = (struct cost_attn_sample){a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]};
    }
    double e = cost_fit_attention(cal, g, s, d->nattn);
    printf("  %d attention shapes: attn_fwd_eff %.3f, attn_bwd_eff %.3f at long sequences, half "
           "of it at %.0f tokens; rms error %.1f%%\n", d->nattn, cal->attn_fwd_eff,
           cal->attn_bwd_eff, cal->attn_seq_half, 100 * e);
}

/* The expert block's correction over the benchmark's shapes (cost_fit_experts). */
static void fit_experts(const struct topo_gpu_spec *g, const struct calib_data *d,
                        struct cost_calibration *cal, json_t *meas)
{
    if (!d->nexpert) {
        printf("  no expert-block measurements (an older profile): the expert correction stays "
               "1 and 1\n");
        return;
    }
    struct cost_expert_sample s[MAX_EXPERT_SHAPES];
    json_t *je = json_array();
    for (int i = 0; i < d->nexpert; i++) {
        const double *x = d->expert[i];
        s[i] = (struct cost_expert_sample){x[0], x[1], x[2], x[3], x[4], x[5], x[6]};
        json_array_append_new(je, num_array(x, EXPERT_COLS));
    }
    json_object_set_new(meas, EXPERT_KEY, je);
    double rms[2];
    cost_fit_experts(cal, g, s, d->nexpert, rms);
    printf("  %d expert blocks (the executor's, uniform routing), measured = scale x model + "
           "fixed_share x its fixed time:\n", d->nexpert);
    for (int b = 0; b < 2; b++)
        printf("    %-8s scale %.3f  fixed_share %.3f  m_half %.0f rows  rms %.1f%%\n",
               b ? "backward" : "forward", cal->expert_scale[b], cal->expert_fixed_share[b],
               cal->expert_m_half[b], 100 * rms[b]);
    for (int i = 0; i < d->nexpert; i++) {
        const double *x = d->expert[i];
        double us[2];
        cost_expert_us(cal, g, x[4] * x[1] / x[0], x[2], x[3], false, us);
        printf("    E %3.0f top-%.0f h %5.0f f %5.0f, %5.0f tokens: fwd %8.1f us (fit %8.1f), "
               "bwd %8.1f us (fit %8.1f)\n", x[0], x[1], x[2], x[3], x[4], x[5], x[0] * us[0],
               x[6], x[0] * us[1]);
    }
}

/* The fits, on any machine: the microbenchmarks into the efficiencies, then each phase's
 * correction over the jobs; meas receives the numbers the profile keeps. */
static enum moe_status fit(struct cli *cli, const struct topo_cluster *cl,
                           const struct calib_data *d, struct cost_calibration *cal, json_t *meas,
                           struct moe_error *err)
{
    const struct topo_gpu_spec *g = &cl->gpu;
    cost_calibration_defaults(cal, g);
    cal->launch_us = d->launch_us;
    cal->hbm_eff = fmin(1.0, 2.0 * d->copy_bytes / (d->copy_us * 1e-6) / g->hbm_bytes_per_s);
    printf(
        "  launch %.2f us a kernel; copy of 1 GiB %.0f us: %.2f TB/s read + write, hbm_eff %.3f\n",
        d->launch_us, d->copy_us, 2.0 * d->copy_bytes / (d->copy_us * 1e-6) / 1e12, cal->hbm_eff);
    json_object_set_new(meas, "launch_us", json_real(d->launch_us));
    json_object_set_new(meas, "copy_1gib_us", json_real(d->copy_us));
    double rms = cost_fit_gemm(cal, g, d->gemm, d->ngemm);
    cal->expert_m_half[0] = cal->expert_m_half[1] = cal->gemm_m_half; /* until fit_experts */
    printf("  %d GEMMs: gemm_eff %.3f, m_half %.1f rows, k_half %.1f, fixed %.1f us; fit rms error "
           "%.1f%%\n", d->ngemm, cal->gemm_eff, cal->gemm_m_half, cal->gemm_k_half,
           cal->gemm_fixed_us, 100 * rms);
    json_t *jg = json_array();
    for (int i = 0; i < d->ngemm; i++) {
        const struct cost_gemm_sample *x = &d->gemm[i];
        double v[4] = {x->m, x->n, x->k, x->us};
        json_array_append_new(jg, num_array(v, 4));
        printf("    GEMM %6.0f x %6.0f x %6.0f: %9.1f us, %6.1f TFLOPS; the fit %9.1f us\n", x->m,
               x->n, x->k, x->us, 2e-6 * x->m * x->n * x->k / x->us,
               cost_gemm_us(cal, g, x->m, x->n, x->k, false));
    }
    json_object_set_new(meas, "gemm_m_n_k_us", jg);
    json_object_set_new(meas, "gemm_fit_rms", json_real(rms));
    json_t *ja = json_array();
    for (int i = 0; i < d->nattn; i++) json_array_append_new(ja, num_array(d->attn[i], 8));
    fit_attention(g, d, cal);
    json_object_set_new(meas, "attention_seqs_seq_h_kv_dqk_dv_fwd_bwd_us", ja);
    fit_experts(g, d, cal, meas);
    /* the jobs: their predictions under the fitted efficiencies, then each phase's correction */
    double model[MAX_JOBS][COST_NPHASES], count[MAX_JOBS][COST_NPHASES];
    json_t *jj = json_array();
    for (int i = 0; i < d->njobs; i++) {
        struct plan_file p;
        char name[128];
        job_name(&d->job[i], name, sizeof name);
        enum moe_status st = job_plan(cli, &d->job[i], cl, cal, NULL, &p, err);
        for (int ph = 0; st == MOE_OK && ph < COST_NPHASES; ph++) {
            model[i][ph] = p.phase_us[ph];
            count[i][ph] = occurrences(&p, ph);
        }
        if (st == MOE_OK)
            printf("  job %d, %s: step %.1f ms, %.1f ms predicted before the phase fit\n", i + 1,
                   name, d->got[i][COST_STEP] / 1e3, p.step_us / 1e3);
        plan_file_free(&p);
        if (st != MOE_OK) {
            json_decref(jj);
            return st;
        }
        json_t *o = json_object();
        json_object_set_new(o, "job", json_string(name));
        json_object_set_new(o, "measured_phases_us", num_array(d->got[i], COST_NPHASES));
        json_object_set_new(o, "model_phases_us", num_array(model[i], COST_NPHASES));
        json_array_append_new(jj, o);
    }
    json_object_set_new(meas, "jobs", jj);
    json_t *jp = json_array();
    for (int ph = 0; ph < COST_NPHASES; ph++)
        json_array_append_new(jp, json_string(cost_phase_names[ph]));
    json_object_set_new(meas, "phase_order", jp);
    printf("  per-phase fit over the %d jobs (measured = scale x model + fixed per occurrence):\n",
           d->njobs);
    for (int ph = 0; ph < COST_NPHASES; ph++) {
        double m[MAX_JOBS], c[MAX_JOBS], y[MAX_JOBS], any = 0;
        for (int i = 0; i < d->njobs; i++) {
            m[i] = model[i][ph];
            c[i] = count[i][ph];
            y[i] = d->got[i][ph];
            any += c[i] * y[i];
        }
        if (any <= 0) continue;
        double sc, fx, e = cost_fit_linear(m, c, y, d->njobs, &sc, &fx);
        cal->phase_scale[ph] = sc;
        cal->phase_fixed_us[ph] = fx;
        printf("    %-14s scale %6.3f  fixed %8.1f us  rms %5.1f%%\n", cost_phase_names[ph], sc, fx,
               100 * e);
    }
    return MOE_OK;
}

static int calibrate(struct cli *cli, const char *out, bool quick, const char *cluster,
                     const char *refit)
{
    struct moe_error err;
    struct topo_cluster cl;
    struct calib_data *d = calloc(1, sizeof *d);
    json_t *meas = json_object(), *meta = NULL;
    struct cost_calibration cal;
    enum moe_status st = d ? cli_cluster_load(cli, cluster, NULL, &cl, NULL, &err)
                           : moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK && refit) {
        printf("moeplan calibrate --refit %s: the measurements kept there, fitted again\n", refit);
        st = load_data(refit, d, &err);
    } else if (st == MOE_OK) {
        st = measure(cli, &cl, quick, d, &err);
    }
    if (st == MOE_OK) st = fit(cli, &cl, d, &cal, meas, &err);
    if (st == MOE_OK) {
        meta = json_object();
        json_t *lib = json_object(), *dflt = json_array();
        json_object_set_new(meta, "gpu", json_string(d->gpu));
        json_object_set_new(meta, "driver", json_string(d->driver));
        json_object_set_new(meta, "date", json_string(d->date));
        json_object_set_new(lib, "cuda_runtime", json_string(d->cuda));
        json_object_set_new(lib, "cublas", json_string(d->cublas));
        json_object_set_new(lib, "nccl", json_string(d->nccl));
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
        json_object_set_new(meta, "fit", json_string(refit ? "moeplan calibrate --refit"
                                                     : d->quick ? "moeplan calibrate --quick"
                                                                : "moeplan calibrate"));
        st = cost_calibration_write(&cal, meta, out, &err);
    }
    json_decref(meas);
    json_decref(meta);
    free(d);
    if (st != MOE_OK) return cli_fail(cli, &err);
    printf("profile written to %s (NVLink, network and fp8 values: datasheet defaults)\n", out);
    return 0;
}

int cmd_calibrate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *out = "calibration.json", *cluster = "h200-vm", *refit = NULL;
    bool quick = false;
    for (int i = 0; i < nargs; i++) {
        if (args[i].val == OPT_OUT) out = args[i].value;
        if (args[i].val == OPT_QUICK) quick = true;
        if (args[i].val == OPT_CLUSTER) cluster = args[i].value;
        if (args[i].val == OPT_REFIT) refit = args[i].value;
    }
    if (optind != argc) return cli_usage(cmd, "no operands");
    return calibrate(cli, out, quick, cluster, refit);
}

/* validate ------------------------------------------------------------------------------------- */

static int validate(struct cli *cli, const char *dir, const char *cal_file, const char *cluster,
                    int steps)
{
    struct moe_error err;
    struct topo_cluster cl;
    struct cost_calibration cal;
    if (cli_cluster_load(cli, cluster, cal_file, &cl, &cal, &err)) return cli_fail(cli, &err);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        moe_error_set_at(&err, MOE_ERR_IO, dir, 0, 0, "cannot create the folder: %s",
                         strerror(errno));
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
        const struct job *j = &valid_jobs[i];
        struct cost_routing rt;
        memset(&rt, 0, sizeof rt);
        enum moe_status st = job_plan(cli, j, &cl, &cal, NULL, &p, &err);
        if (st == MOE_OK)
            st = job_run(&p, j->skew, steps, med, &l0, &l1, j->skew > 0 ? &rt : NULL, &err);
        if (st == MOE_OK && j->skew > 0) { /* predicted again with the routing it measured */
            plan_file_free(&p);
            st = job_plan(cli, j, &cl, &cal, &rt, &p, &err);
            double mx = 0;
            for (int e = 0; e < rt.experts; e++) mx = fmax(mx, rt.pick[e] * rt.experts / rt.top_k);
            if (st == MOE_OK)
                printf("  %s: its routing's busiest expert has %.1f x the mean load (first MoE "
                       "layer); predicted with that routing\n", name, mx);
        }
        cost_routing_free(&rt);
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
    printf(
        "\nstep error: mean |error| %.1f%%, worst %.1f%% (targets with a profile: each within 5%%, "
        "mean under 3%%)\n",
        100 * sum / done, 100 * worst);
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
    fprintf(f,
            "`moeplan validate%s%s --steps %d`: %d one-GPU jobs, each trained %d steps (medians "
            "of steps 2-%d, CUDA events), predicted with %s.\n\n",
            cal_file ? " --calibration " : "", cal_file ? cal_file : "", steps, NVALID, steps,
            steps, cal.source);
    rpt_table_print_markdown(t, f);
    fprintf(f, "\nMean |error| %.1f%% of the step, worst %.1f%%, over %d jobs.\n\n",
            100 * sum / done, 100 * worst, done);
    fprintf(
        f,
        "Error of each phase that takes 5%% of the step or more (measured / predicted - 1):\n\n");
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
