/*
 * cmd_validate.c: the GPU side of calibration (CUDA builds): `moeplan calibrate`'s measurements
 * (executor/calib.cu's microbenchmarks: GEMMs over a grid with the skinny expert shapes, the
 * executor's expert block, flash attention, HBM copies, launches; then a few training steps of
 * the calibration jobs), and `moeplan validate`: plans a set of one-GPU jobs that differ from the
 * calibration jobs (models, sequence lengths, micro-batches, recompute, skew), runs each, and
 * writes one Markdown report of predicted against measured step and phase times. The fits are
 * the planner's (planner/calib_fit.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "exec.h"
#include "plan.h"
#include "rpt.h"

enum { OPT_QUICK = 1, OPT_CAL, OPT_CLUSTER, OPT_STEPS, OPT_REFIT, OPT_OUT = 'o' };

const struct cli_opt cmd_validate_opts[] = {
    {"output", required_argument, OPT_OUT, "DIR", "write the report here (validation)",
     CLI_OUT_DIR},
    {"calibration", required_argument, OPT_CAL, "FILE", "predict with this profile", CLI_PLAIN},
    {"cluster", required_argument, OPT_CLUSTER, "C",
     "the cluster this GPU belongs to (the GPU's own: H200 h200-vm, H100 hgx-h100-x128)",
     CLI_PLAIN},
    {"steps", required_argument, OPT_STEPS, "N", "training steps a job (10; the first is warm-up)",
     CLI_PLAIN},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer steps (6)", CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

#ifdef MOEPLAN_HAVE_EXECUTOR /* the command itself: a build without CUDA has its options only */

/* A training run holds the GPU at its power limit and its clocks fall as it warms (the H200
 * machine: 1980 MHz idle and cold; 1605 MHz two seconds into a run at 700 W, 1365-1440 MHz a few
 * seconds later, at 60 C). A short job started cold runs its GEMMs 10-15% faster than the same
 * job a minute into training. So calibrate starts after `seconds` of back-to-back large GEMMs,
 * and every job of calibrate and validate after a few more (the GPU cools in the gaps). */
static enum moe_status warm_up(double seconds, bool say, struct moe_error *err)
{
    if (say) {
        printf(
            "warming the GPU up for %.0f s (large GEMMs back to back: a training run's clocks)\n",
            seconds);
        fflush(stdout);
    }
    return exec_warm_up(seconds, err);
}

/* MOE_OK when this machine has a CUDA GPU; else an error that ends with `why`. */
static enum moe_status gpu_present(const char *why, struct moe_error *err)
{
    int ndev = 0;
    enum moe_status st = exec_device_count(&ndev, err);
    if (st == MOE_OK && ndev < 1)
        st = moe_error_set(err, MOE_ERR_RUNTIME, "no CUDA GPU on this machine: %s", why);
    return st;
}

/* Job j as this GPU (bytes of memory) holds it, and its plan (plan_calib_job_plan's, into p):
 * j, or j with fewer layers where the executor's own count of what it allocates
 * (exec_layout_runnable's) is more than the GPU has -- the jobs are sized for the H200's 141 GB,
 * an H100 has 80. Said on stdout; MOE_ERR_INFEASIBLE where even one layer is too much. Free p
 * with plan_file_free, also after a failure. */
static enum moe_status job_fit(const struct plan_calib_job *j, const char *mdir,
                               const struct topo_cluster *cl, const struct cost_calibration *cal,
                               double bytes, struct plan_calib_job *out, struct plan_file *p,
                               struct moe_error *err)
{
    *out = *j;
    char why[512] = "";
    for (;; out->layers--) {
        plan_file_free(p);
        enum moe_status st = plan_calib_job_plan(out, mdir, cl, cal, NULL, p, err);
        if (st != MOE_OK) return st;
        /* held back by its memory alone: what else the executor refuses, the run says */
        if (!exec_layout_runnable(&p->model, &p->layout, 1, 0, why, sizeof why) ||
            exec_layout_runnable(&p->model, &p->layout, 1, bytes, why, sizeof why))
            break;
        if (out->layers == 1) return moe_error_set(err, MOE_ERR_INFEASIBLE, "%s", why);
    }
    if (out->layers != j->layers) {
        char a[128], b[128];
        plan_calib_job_name(j, a, sizeof a);
        plan_calib_job_name(out, b, sizeof b);
        printf("  %s does not fit this GPU's %.1f GB (%s): %s instead\n", a, bytes / 1e9, why, b);
    }
    return MOE_OK;
}

/* Trains the job `steps` steps; med[p]: the median of each phase (ms) over steps 2..N; with
 * routing, the MoE layers' measured routing too (cost_routing_free it). */
static enum moe_status job_run(const struct plan_file *p, double skew, int steps, double *med,
                               double *loss0, double *loss1, struct cost_routing *routing,
                               struct moe_error *err)
{
    const struct mdl_model *m = &p->model;
    int E = m->moe.experts;
    enum moe_status st = warm_up(3.0, false, err);
    if (st != MOE_OK) return st;
    double *bias = skew > 0 ? calloc((size_t)m->layers * E, sizeof *bias) : NULL;
    if (skew > 0 && !bias) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
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
    c.streams = EXEC_DEFAULT_STREAMS;
    c.lr = 3e-4;
    c.bias_rate = skew > 0 ? 0.0 : 1e-3; /* a skewed job keeps its bias */
    c.bias0 = bias;
    c.timeout_s = 60;
    c.fail_rank = c.fail_step = -1;
    struct exec_run_result res;
    memset(&res, 0, sizeof res);
    st = exec_run(&c, &res, err);
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
    struct exec_run_summary sum;
    if (st == MOE_OK && (st = exec_run_summarize(p, &res, &sum, err)) == MOE_OK) {
        memcpy(med, sum.phase_ms, sizeof sum.phase_ms);
        *loss0 = sum.loss_first;
        *loss1 = sum.loss_last;
    }
    exec_run_result_free(&res);
    free(bias);
    return st;
}

/* GEMMs of the executor's shapes: the projections, the LM head, and expert GEMMs from a few rows
 * (skinny) to many; then the wide dense blocks of hidden 7168 (DeepSeek-V3's and Kimi-K2's
 * 18432-wide FFN, their 8192-wide attention output) and gpt-oss's 2880-wide projections, which
 * the table otherwise reaches only from afar. */
static enum moe_status measure_gemms(bool quick, struct cost_gemm_sample *s, int *n,
                                     struct moe_error *err)
{
    static const int nk[][2] = {{2048, 7168},  {7168, 2048}, {4096, 14336}, {14336, 4096},
                                {2816, 2048},  {2048, 1408}, {1536, 2048},  {2048, 768},
                                {32000, 4096}, {6144, 4096}, {36864, 7168}, {7168, 18432},
                                {7168, 8192},  {5120, 2880}, {2880, 4096}};
    static const int ms[] = {32, 128, 512, 2048, 8192, 16384};
    _Static_assert(sizeof nk / sizeof nk[0] * (sizeof ms / sizeof ms[0]) <= PLAN_CALIB_MAX_GEMMS,
                   "the GEMM grid outgrows what a profile keeps");
    int nn = quick ? 5 : (int)(sizeof nk / sizeof nk[0]), nm = (int)(sizeof ms / sizeof ms[0]);
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

/* One expert block (experts, top-k, hidden, intermediate of shape) on `tokens` tokens in
 * precision prec, as `moeplan bench moe` times it, uniform routing: v[0..6] = the shape, the
 * tokens, the forward and the backward in us. */
static enum moe_status time_block(const int shape[4], int tokens, enum cost_precision prec,
                                  bool quick, double *v, struct moe_error *err)
{
    struct exec_moe_bench_cfg c = {
        shape[0], tokens,        shape[1], shape[2], shape[3], EXEC_DEFAULT_STREAMS,
        2,        quick ? 3 : 7, 0.0,      17,       prec,     false};
    struct exec_moe_bench_result r;
    int *choice = malloc(sizeof(int) * (size_t)c.tokens * c.top_k);
    if (!choice) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    enum moe_status st = exec_moe_bench(&c, choice, &r, err);
    free(choice);
    if (st != MOE_OK) return st;
    for (int k = 0; k < 4; k++) v[k] = shape[k];
    v[4] = tokens;
    v[5] = r.block_fwd_ms * 1e3;
    v[6] = r.block_bwd_ms * 1e3;
    return MOE_OK;
}

/* The executor's expert block (`moeplan bench moe`'s): the expert shapes of the shipped models
 * and their proxies, few rows an expert to many. Each row: experts, top-k, hidden, intermediate,
 * tokens, then the forward and the backward, us. */
static enum moe_status measure_experts(bool quick, double (*x)[PLAN_CALIB_EXPERT_COLS], int *n,
                                       struct moe_error *err)
{
    static const int shape[][4] = {{8, 2, 4096, 14336},
                                   {64, 6, 2048, 1408},
                                   {128, 6, 2048, 1408},
                                   {16, 8, 7168, 2048},
                                   {32, 8, 7168, 2048}};
    static const int tokens[] = {1024, 4096, 8192};
    int ns = (int)(sizeof shape / sizeof shape[0]), nt = (int)(sizeof tokens / sizeof tokens[0]);
    *n = 0;
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < nt; b++) {
            if (quick && b == 1) continue;
            enum moe_status st = time_block(shape[a], tokens[b], COST_BF16, quick, x[*n], err);
            if (st != MOE_OK) return st;
            (*n)++;
        }
    return MOE_OK;
}

/* The same blocks in fp8 where the GPU has it, the large-expert shapes (where fp8 pays): per-tensor
 * scaling from sm_89, the 1x128 / 128x128 block scaling on Hopper (sm_90). Each row: the recipe,
 * then measure_experts' seven. A recipe whose GEMMs cuBLASLt refuses on this machine is left
 * out, said on stderr: its rate stays the datasheet's, the rest of the profile is measured. */
static enum moe_status measure_fp8_recipe(enum cost_precision prec, bool quick,
                                          double (*x)[PLAN_CALIB_FP8_COLS], int *n,
                                          struct moe_error *err)
{
    static const int shape[][4] = {{8, 2, 4096, 14336}, {16, 8, 7168, 2048}, {32, 8, 7168, 2048}};
    static const int tokens[] = {4096, 8192};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++) {
            if (quick && (a == 2 || b == 0)) continue;
            double *v = x[*n];
            v[0] = prec;
            enum moe_status st = time_block(shape[a], tokens[b], prec, quick, v + 1, err);
            if (st != MOE_OK) return st;
            (*n)++;
        }
    return MOE_OK;
}

static enum moe_status measure_fp8_experts(const struct exec_device_info *dev, bool quick,
                                           double (*x)[PLAN_CALIB_FP8_COLS], int *n,
                                           struct moe_error *err)
{
    int cc = dev->cc_major * 10 + dev->cc_minor;
    *n = 0;
    for (int r = 0; r < 2; r++) {
        enum cost_precision prec = r ? COST_FP8_BLOCK : COST_FP8;
        if (r ? dev->cc_major != 9 : cc < 89) continue;
        int first = *n;
        enum moe_status st = measure_fp8_recipe(prec, quick, x, n, err);
        if (st == MOE_ERR_CUBLAS) {
            fprintf(stderr,
                    "moeplan calibrate: %s expert blocks not measured (%s); the profile keeps "
                    "the datasheet's rate for them\n",
                    cost_precision_names[prec], err->message);
            *n = first;
        } else if (st != MOE_OK) {
            return st;
        }
    }
    return MOE_OK;
}

/* On the GPU: the microbenchmarks and the calibration jobs. */
enum moe_status cli_calibrate_measure(struct cli *cli, const char *cluster, bool quick,
                                      struct topo_cluster *cl, struct plan_calib_data *d,
                                      struct moe_error *err)
{
    struct exec_device_info dev;
    struct exec_versions v;
    enum moe_status st = gpu_present("calibration measures a GPU (plan and predict take a profile "
                                     "made there; --refit fits one again here)",
                                     err);
    if (st != MOE_OK || (st = exec_device_query(0, &dev, err)) ||
        (st = cli_gpu_cluster_load(cli, dev.name, cluster, NULL, cl, NULL, err)))
        return st;
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
    if (exec_attention_cudnn(EXEC_ATTN_AUTO))
        snprintf(d->attention, sizeof d->attention, "cudnn %d.%d.%d", v.cudnn_runtime / 10000,
                 v.cudnn_runtime / 100 % 100, v.cudnn_runtime % 100);
    else
        snprintf(d->attention, sizeof d->attention, "own");
    printf("moeplan calibrate: %s (%s: %.0f bf16 TFLOPS, %.2f TB/s HBM in the datasheet)\n",
           dev.name, cl->gpu.name, cl->gpu.bf16_tflops, cl->gpu.hbm_bytes_per_s / 1e12);
    size_t bytes = (size_t)1 << 30;
    d->copy_bytes = (double)bytes;
    /* minutes of measuring: a bar on a terminal, a line every few seconds into a pipe (a stage,
     * an attention shape, a job, each a step) */
    struct moe_progress bar;
    moe_progress_start(&bar, stderr, true, "calibrate", 6 + 12 + 4 + (uint64_t)plan_calib_njobs);
    moe_progress_lines(&bar, 2.0);
    uint64_t done = 0;
#define STEP(call) ((st = (call)) == MOE_OK && (moe_progress_update(&bar, ++done), true))
    if (!STEP(warm_up(quick ? 5.0 : 20.0, true, err)) ||
        !STEP(exec_time_launch(quick ? 5 : 20, &d->launch_us, err)) ||
        !STEP(exec_time_copy(bytes, quick ? 5 : 20, &d->copy_us, err)) ||
        !STEP(measure_gemms(quick, d->gemm, &d->ngemm, err)) ||
        !STEP(measure_experts(quick, d->expert, &d->nexpert, err)) ||
        !STEP(measure_fp8_experts(&dev, quick, d->expert8, &d->nexpert8, err))) {
        moe_progress_finish(&bar);
        return st;
    }
    /* seqs, seq, heads, kv heads, dqk, dv, window: GQA 128, MLA 192 / 128, gpt-oss's 64-wide
     * heads causal and with its window of 128 */
    static const int at[][7] = {{4, 1024, 32, 8, 128, 128, 0},  {1, 4096, 32, 8, 128, 128, 0},
                                {2, 2048, 16, 16, 192, 128, 0}, {1, 4096, 16, 16, 192, 128, 0},
                                {2, 2048, 32, 4, 128, 128, 0},  {4, 1024, 16, 16, 192, 128, 0},
                                {8, 512, 32, 8, 128, 128, 0},   {2, 2048, 32, 8, 128, 128, 0},
                                {2, 4096, 64, 8, 64, 64, 0},    {4, 2048, 64, 8, 64, 64, 0},
                                {2, 4096, 64, 8, 64, 64, 128},  {4, 2048, 64, 8, 64, 64, 128}};
    d->nattn = quick ? 3 : (int)(sizeof at / sizeof at[0]);
    for (int i = 0; i < d->nattn; i++) {
        for (int k = 0; k < 7; k++) d->attn[i][k] = at[i][k];
        if (!STEP(exec_time_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5],
                                      at[i][6], EXEC_ATTN_AUTO, false, quick ? 3 : 10,
                                      &d->attn[i][7], &d->attn[i][8], err))) {
            moe_progress_finish(&bar);
            return st;
        }
    }
    /* attention with sinks as Transformer Engine runs gpt-oss's (inside cuDNN's graph), against
     * cuDNN's plain graph on the same 64-wide shapes, causal and windowed: what the stack profiles
     * charge for windows and sinks (cost_fit_te_attention); not with --quick, not without cuDNN,
     * and none where cuDNN has no sinks (before 9.13), said and left out */
    d->nsink = 0;
    for (int i = 0; !quick && exec_attention_cudnn(EXEC_ATTN_AUTO) &&
                    i < (int)(sizeof at / sizeof at[0]) && d->nsink < PLAN_CALIB_MAX_SINK;
         i++) {
        if (at[i][4] != 64) continue;
        double *r = d->sink[d->nsink];
        for (int k = 0; k < 7; k++) r[k] = at[i][k];
        struct moe_error why;
        bool ok =
            exec_time_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5],
                                at[i][6], EXEC_ATTN_CUDNN, false, 10, &r[7], &r[8],
                                &why) == MOE_OK &&
            exec_time_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], at[i][5],
                                at[i][6], EXEC_ATTN_CUDNN, true, 10, &r[9], &r[10], &why) == MOE_OK;
        moe_progress_update(&bar, ++done);
        if (!ok) { /* optional: said, and the profile goes without them */
            moe_progress_clear(&bar);
            fprintf(stderr,
                    "moeplan calibrate: Transformer Engine's attention (cuDNN's graph with a "
                    "window and sinks) not measured: %s\n",
                    why.message);
            d->nsink = 0;
            break;
        }
        d->nsink++;
    }
    done = 6 + 12 + 4;
    struct cost_calibration base;
    cost_calibration_defaults(&base, &cl->gpu);
    char dir[MOE_PATH_MAX];
    cli_data_path(cli, "model", dir, sizeof dir);
    for (int i = 0; i < plan_calib_njobs; i++) {
        struct plan_file p;
        memset(&p, 0, sizeof p);
        double l0, l1;
        int n = d->njobs;
        st = job_fit(&plan_calib_jobs[i], dir, cl, &base, dev.memory_bytes, &d->job[n], &p, err);
        if (st == MOE_ERR_INFEASIBLE) { /* the fit takes the jobs that ran */
            moe_progress_clear(&bar);
            fprintf(stderr, "moeplan calibrate: job %d not run: %s\n", i + 1, err->message);
            plan_file_free(&p);
            moe_progress_update(&bar, ++done);
            continue;
        }
        if (st == MOE_OK) st = job_run(&p, 0.0, quick ? 5 : 9, d->got[n], &l0, &l1, NULL, err);
        plan_file_free(&p);
        moe_progress_update(&bar, ++done);
        if (st != MOE_OK) {
            moe_progress_finish(&bar);
            return st;
        }
        for (int ph = 0; ph < COST_NPHASES; ph++) d->got[n][ph] *= 1e3; /* us */
        d->njobs++;
    }
#undef STEP
    moe_progress_finish(&bar);
    return d->njobs ? MOE_OK
                    : moe_error_set(err, MOE_ERR_INFEASIBLE,
                                    "calibrate: none of its jobs fits this GPU's %.1f GB",
                                    dev.memory_bytes / 1e9);
}

/* validate ------------------------------------------------------------------------------------- */

static int validate(struct cli *cli, const char *dir, const char *cal_file, const char *cluster,
                    int steps)
{
    char mdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    struct moe_error err;
    struct topo_cluster cl;
    struct cost_calibration cal;
    struct exec_device_info dev;
    if (gpu_present("validate trains its jobs on one", &err) || exec_device_query(0, &dev, &err) ||
        cli_gpu_cluster_load(cli, dev.name, cluster, cal_file, &cl, &cal, &err))
        return cli_fail(cli, &err);
    if (moe_output_dir_make(dir, &err)) return cli_fail(cli, &err);
    printf("moeplan validate: %d one-GPU jobs, %d steps each, predicted with %s\n",
           plan_valid_njobs, steps, cal.source);
    const char *h[] = {"job", "predicted", "measured", "error", "worst phase > 5% of the step"};
    struct rpt_table *t = rpt_table_create(5, h, "lrrrl");
    /* per-phase errors of the phases that matter (blank: under 5% of the measured step) */
    static const int cols[] = {COST_EMBED,         COST_ATTN_FWD,    COST_ATTN_BWD,
                               COST_ROUTER,        COST_EXPERTS_FWD, COST_EXPERTS_BWD,
                               COST_SHARED_EXPERT, COST_DENSE_FFN,   COST_LM_HEAD,
                               COST_LOSS,          COST_OPTIMIZER};
    enum { NCOLS = (int)(sizeof cols / sizeof cols[0]) };
    const char *h2[NCOLS + 1] = {"job"};
    char align[NCOLS + 2] = "l";
    for (int c = 0; c < NCOLS; c++) h2[c + 1] = cost_phase_names[cols[c]], strcat(align, "r");
    struct rpt_table *t2 = rpt_table_create(NCOLS + 1, h2, align);
    double sum = 0, worst = 0;
    int done = 0;
    for (int i = 0; i < plan_valid_njobs && t && t2; i++) {
        struct plan_file p;
        memset(&p, 0, sizeof p);
        char name[128];
        double med[COST_NPHASES], l0, l1;
        struct plan_calib_job fit, *j = &fit;
        struct cost_routing rt;
        memset(&rt, 0, sizeof rt);
        enum moe_status st =
            job_fit(&plan_valid_jobs[i], mdir, &cl, &cal, dev.memory_bytes, &fit, &p, &err);
        plan_calib_job_name(st == MOE_OK ? &fit : &plan_valid_jobs[i], name, sizeof name);
        if (st == MOE_OK)
            st = job_run(&p, j->skew, steps, med, &l0, &l1, j->skew > 0 ? &rt : NULL, &err);
        if (st == MOE_OK && j->skew > 0) { /* predicted again with the routing it measured */
            plan_file_free(&p);
            st = plan_calib_job_plan(j, mdir, &cl, &cal, &rt, &p, &err);
            double mx = 0;
            for (int e = 0; e < rt.experts; e++) mx = fmax(mx, rt.pick[e] * rt.experts / rt.top_k);
            if (st == MOE_OK)
                printf("  %s: its routing's busiest expert has %.1f x the mean load (first MoE "
                       "layer); predicted with that routing\n",
                       name, mx);
        }
        cost_routing_free(&rt);
        double pstep = p.step_us, pph[COST_NPHASES];
        memcpy(pph, p.phase_us, sizeof pph);
        plan_file_free(&p);
        /* reported, not counted: what this build or machine cannot run (cuBLASLt refusing an fp8
         * recipe's GEMMs among it), or what does not fit */
        if (st == MOE_ERR_UNSUPPORTED || st == MOE_ERR_INFEASIBLE ||
            (st == MOE_ERR_CUBLAS && j->precision != COST_BF16)) {
            printf("  %d/%d %s: not run: %s\n", i + 1, plan_valid_njobs, name, err.message);
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
            if (med[ph] < 0.05 * med[COST_STEP] || pph[ph] <= 0)
                rpt_table_cell(t2, NULL, " ");
            else
                rpt_table_cell(t2, NULL, "%+.0f%%", 100 * (med[ph] / (pph[ph] / 1e3) - 1.0));
        }
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", name);
        rpt_table_cell(t, NULL, "%.1f ms", pred);
        rpt_table_cell(t, NULL, "%.1f ms", med[COST_STEP]);
        rpt_table_cell(t, NULL, "%+.1f%%", 100 * e);
        rpt_table_cell(t, NULL, "%s", wp);
        printf("  %d/%d %s: measured %.1f ms, predicted %.1f ms (%+.1f%%), loss %.3f -> %.3f\n",
               i + 1, plan_valid_njobs, name, med[COST_STEP], pred, 100 * e, l0, l1);
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
            cal_file ? " --calibration " : "", cal_file ? cal_file : "", steps, plan_valid_njobs,
            steps, steps, cal.source);
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
    const char *dir = "validation", *cal = NULL, *cluster = NULL;
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

#endif /* MOEPLAN_HAVE_EXECUTOR */
