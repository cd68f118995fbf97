/*
 * cmd_run.c: `moeplan run PLAN`: train the planned model for real on this machine's GPU and
 * measure it: a line per step, the per-phase table against the plan's prediction, and
 * measured.json ("moeplan.measured", documented in executor/README.md).
 *
 * The ranks run in executor/run.c (exec_run): one GPU, a thread per GPU of this node, virtual
 * ranks on one GPU, or a process each under mpirun/srun; rank 0 prints and writes. A plan this
 * build cannot run is refused naming what it needs. Built only with the executor
 * (MOEPLAN_HAVE_EXECUTOR); a build without it has the option table, so that a GPU option is
 * answered "needs a CUDA build", not "unknown option".
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "exec.h"
#include "plan.h"
#include "rpt.h"

enum {
    OPT_STEPS = 1,
    OPT_DATA,
    OPT_OUT,
    OPT_GPUS,
    OPT_SEED,
    OPT_AUX,
    OPT_BIAS,
    OPT_LR,
    OPT_WARMUP,
    OPT_STREAMS,
    OPT_VIRTUAL,
    OPT_NCCL,
    OPT_RENDEZVOUS,
    OPT_TIMEOUT,
    OPT_FAULT,
    OPT_NO_OVERLAP,
    OPT_ATTENTION,
    OPT_MAX_ERROR,
    OPT_CKPT_DIR,
    OPT_CKPT_EVERY,
    OPT_RESUME,
    OPT_NONFINITE,
    OPT_NAN,
    OPT_MEM_LIMIT
};

const struct cli_opt cmd_run_opts[] = {
    {"steps", required_argument, OPT_STEPS, "N", "training steps (100)", CLI_PLAIN},
    {"data", required_argument, OPT_DATA, "FILE",
     "train on this file: bytes as tokens, or a MOETOKv1 token file (default: synthetic tokens)",
     CLI_PLAIN},
    {"out", required_argument, OPT_OUT, "FILE", "write measured.json here (measured.json)",
     CLI_OUT_FILE},
    {"gpus", required_argument, OPT_GPUS, "N",
     "GPUs of this node, a thread each (default: the plan's ranks; mpirun/srun: one a process)",
     CLI_PLAIN},
    {"virtual-ranks", no_argument, OPT_VIRTUAL, NULL,
     "every rank of the plan on GPU 0 (threads, in-process transport): checks a multi-GPU plan",
     CLI_PLAIN},
    {"nccl", no_argument, OPT_NCCL, NULL, "a one-GPU plan through NCCL all the same (one rank)",
     CLI_PLAIN},
    {"rendezvous", required_argument, OPT_RENDEZVOUS, "FILE",
     "mpirun/srun: a file every node sees, for the NCCL id (default: in /tmp, named by the job)",
     CLI_OUT_FILE},
    {"timeout", required_argument, OPT_TIMEOUT, "S",
     "a rank waiting longer than S seconds in a collective ends the run (60)", CLI_PLAIN},
    {"checkpoint-dir", required_argument, OPT_CKPT_DIR, "D", "keep checkpoints in this folder",
     CLI_OUT_DIR},
    {"checkpoint-every", required_argument, OPT_CKPT_EVERY, "N", "a checkpoint every N steps",
     CLI_PLAIN},
    {"resume", no_argument, OPT_RESUME, NULL, "continue from --checkpoint-dir's latest checkpoint",
     CLI_PLAIN},
    {"on-nonfinite", required_argument, OPT_NONFINITE, "stop|skip",
     "NaN or Inf in the gradients: stop naming the block and tensor (stop), or skip the step's "
     "update (skip; 3 in a row stop)",
     CLI_PLAIN},
    {"gpu-memory-limit", required_argument, OPT_MEM_LIMIT, "BYTES",
     "allocate at most this much GPU memory a rank (e.g. 40GB; default: the device's)", CLI_PLAIN},
    {"max-error", required_argument, OPT_MAX_ERROR, "PCT",
     "exit 5 when the measured step is further than PCT% from the plan's prediction", CLI_PLAIN},
    {"no-grad-overlap", no_argument, OPT_NO_OVERLAP, NULL,
     "all-reduce the gradients after the backward (default: block by block inside it)", CLI_PLAIN},
    {"attention", required_argument, OPT_ATTENTION, "auto|own|cudnn",
     "attention by cuDNN's fused attention where the build has cuDNN and it takes the shape, our "
     "flash kernel otherwise (auto, the default), or always ours (own), or cuDNN's (cudnn)",
     CLI_PLAIN},
    {"inject-fault", required_argument, OPT_FAULT, "RANK:STEP",
     "testing: that rank stops in the middle of that step; the others must exit with a message",
     CLI_PLAIN},
    {"inject-nan", required_argument, OPT_NAN, "STEP:TENSOR[:weight]",
     "testing: a NaN into that tensor's gradient (or, :weight, into it) at that step (3:blk1.wo)",
     CLI_PLAIN},
    {"seed", required_argument, OPT_SEED, "N", "initialization and synthetic-data seed (1)",
     CLI_PLAIN},
    {"aux-loss-coef", required_argument, OPT_AUX, "C", "load-balance loss coefficient (0: none)",
     CLI_PLAIN},
    {"bias-update-rate", required_argument, OPT_BIAS, "R",
     "aux-loss-free balancing: per-step bias update (0.001; 0: off)", CLI_PLAIN},
    {"lr", required_argument, OPT_LR, "LR", "peak learning rate (3e-4; cosine to a tenth)",
     CLI_PLAIN},
    {"warmup", required_argument, OPT_WARMUP, "N",
     "warm-up steps, at most --steps (default: 10, at most steps/10 + 1)", CLI_PLAIN},
    {"expert-streams", required_argument, OPT_STREAMS, "N",
     "CUDA streams for the expert GEMMs (1 .. 8; " EXEC_STR(EXEC_DEFAULT_STREAMS) ")", CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

#ifdef MOEPLAN_HAVE_EXECUTOR /* the command itself: a build without CUDA has its options only */

/* What the command line gives: the run's settings as the executor takes them, and the CLI's own. */
struct run_opts {
    struct exec_run_cfg c; /* all but the plan, the launch and the callbacks */
    const char *plan, *out, *rendezvous;
    uint64_t gpus;
    bool virtual_ranks;
    double max_error;
    char nan_buf[72];
};

/* SIGINT / SIGTERM during a run: the ranks finish the step, checkpoint, stop (a second one
 * ends the process at once: the handler is reset by the first). */
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

/* What rank 0 prints while the run goes. */
struct run_log {
    const struct run_opts *o;
    const struct plan_file *p;
    struct moe_progress bar;
    char attention[320]; /* which attention the run started with */
};

static void on_start(void *ctx, const struct exec_run_info *info)
{
    struct run_log *lg = ctx;
    const struct mdl_model *m = &lg->p->model;
    const struct cost_layout *l = &lg->p->layout;
    int micro = lg->p->micro_batches;
    printf("moeplan run: %s (%d layers, %d experts top-%d) on %s\n", m->name, m->layers,
           m->moe.experts, m->moe.top_k, info->dev.name);
    if (info->transport) {
        static const char *const how[] = {"threads of this process, NCCL",
                                          "virtual ranks on one GPU, in-process transport",
                                          "a process each, NCCL"};
        char lay[COST_LAYOUT_TEXT_MAX];
        cost_layout_format(l, lay, sizeof lay);
        printf("  %d rank%s (%s; %d GPU%s in this process): %s\n", info->ranks,
               info->ranks == 1 ? "" : "s", how[info->mode], info->devices,
               info->devices == 1 ? "" : "s", lay);
    }
    printf("  rank 0 %s\n", info->binding);
    printf("  attention: %s\n", info->attention);
    snprintf(lg->attention, sizeof lg->attention, "%s", info->attention);
    printf("  %d steps x %d micro-batch%s x %d sequences of %d tokens x dp %d; recompute %s; "
           "GEMMs %s; data: %s\n",
           lg->o->c.steps, micro, micro == 1 ? "" : "es", l->mbs, l->seq_len, l->dp,
           cost_recompute_names[l->recompute],
           l->precision == COST_FP8         ? "fp8 (per-tensor current scaling)"
           : l->precision == COST_FP8_BLOCK ? "fp8 (1x128 / 128x128 block scaling)"
                                            : "bf16",
           info->data);
    printf("  AdamW lr %.2g (warm-up %d, cosine), clip %.1f; aux loss %g; bias update %g; seed "
           "%llu\n",
           info->opt.lr_max, info->opt.warmup_steps, info->opt.clip, lg->o->c.aux,
           lg->o->c.bias_rate, (unsigned long long)lg->o->c.seed);
    fflush(stdout);
    moe_progress_start(&lg->bar, stderr, true, "training", (uint64_t)lg->o->c.steps);
}

static void on_step(void *ctx, const struct exec_run_step *s)
{
    struct run_log *lg = ctx;
    moe_progress_clear(&lg->bar);
    if (s->skipped) {
        printf("step %4d/%d  skipped (no update): %s\n", s->step, lg->o->c.steps, s->why);
    } else {
        double ms = s->gpu.phase_ms[COST_STEP];
        struct exec_run_rate r = exec_run_rate(lg->p, ms);
        printf("step %4d/%d  loss %8.4f  lr %.2e  gnorm %7.3f  %9.1f ms  %9.0f tok/s  %7.1f "
               "TFLOPS  MFU %5.1f%%\n",
               s->step, lg->o->c.steps, s->loss, s->lr, s->gnorm, ms, r.tokens_per_s,
               r.model_tflops, 100.0 * r.mfu);
    }
    fflush(stdout);
    moe_progress_update(&lg->bar, (uint64_t)s->step);
}

/* A default rendezvous file unique to the job: Open MPI's (PMIx) namespace or Slurm's job and
 * step; NULL when neither names the job. */
static const char *default_rendezvous(char *buf, size_t cap)
{
    const char *ns = getenv("PMIX_NAMESPACE"), *jid = getenv("OMPI_MCA_ess_base_jobid");
    const char *sj = getenv("SLURM_JOB_ID"), *ss = getenv("SLURM_STEP_ID");
    if (ns || jid)
        snprintf(buf, cap, "/tmp/moeplan-nccl-id-%s", ns ? ns : jid);
    else if (sj)
        snprintf(buf, cap, "/tmp/moeplan-nccl-id-%s.%s", sj, ss ? ss : "0");
    else
        return NULL;
    for (char *c = buf + 5; *c; c++)
        if (*c == '/') *c = '_';
    return buf;
}

/* What a failed run's message adds: the plan a build lacks; next to GPU memory running out, the
 * plan's prediction; after NaN or Inf, the checkpoint that stays. */
static void explain_failure(const struct run_opts *o, const struct plan_file *p, enum moe_status st,
                            struct moe_error *err)
{
    struct moe_error what = *err;
    if (st == MOE_ERR_UNSUPPORTED) moe_error_set(err, st, "%s: %s", o->plan, what.message);
    if (st == MOE_ERR_GPU_NOMEM) {
        const double *b = p->memory_bytes;
        moe_error_set(err, st,
                      "%s\n  the plan predicts %.3g GB a GPU: weights %.3g, gradients %.3g, "
                      "optimizer %.3g, activations %.3g, dispatch buffers %.3g, reserved %.3g",
                      what.message, p->memory_total_bytes / 1e9, b[COST_MEM_WEIGHTS] / 1e9,
                      b[COST_MEM_GRADS] / 1e9, b[COST_MEM_OPTIMIZER] / 1e9,
                      b[COST_MEM_ACTIVATIONS] / 1e9, b[COST_MEM_DISPATCH] / 1e9,
                      b[COST_MEM_RESERVED] / 1e9);
    }
    if (st == MOE_ERR_NUMERICS) {
        int last = 0;
        struct moe_error ignore;
        if (o->c.ckpt_dir && exec_ckpt_latest(o->c.ckpt_dir, &last, &ignore) == MOE_OK)
            moe_error_set(err, st,
                          "%s\n  the last checkpoint, step %d in %s, is untouched "
                          "(--resume continues from it)",
                          what.message, last, o->c.ckpt_dir);
        else
            moe_error_set(err, st, "%s\n  no checkpoint to go back to", what.message);
    }
}

static int run(struct cli *cli, const struct run_opts *o)
{
    struct moe_error err;
    enum moe_status st = MOE_OK;
    struct plan_file p;
    struct exec_run_result res;
    memset(&res, 0, sizeof res);
    struct run_log lg;
    memset(&lg, 0, sizeof lg);
    char idbuf[MOE_PATH_MAX];
    if ((st = plan_load(o->plan, &p, &err))) goto cleanup;
    if (o->c.data) { /* the text read as an input now, so that the check below knows it */
        FILE *f;
        if ((st = moe_file_open_input(o->c.data, &f, &err))) goto cleanup;
        fclose(f);
    }
    /* --out before the GPU is looked for, not after minutes of training: neither the plan nor
     * the text, a place a file can be written */
    if ((st = moe_output_check(o->out, &err))) goto cleanup;
    struct exec_run_cfg c = o->c;
    c.plan = &p;
    c.mode = o->virtual_ranks ? EXEC_RUN_VIRTUAL : EXEC_RUN_THREADS;
    if ((st = exec_launch_detect(&c.launch, NULL, &err))) goto cleanup;
    if (c.launch.who != EXEC_LAUNCH_SINGLE && !o->virtual_ranks) {
        c.mode = EXEC_RUN_PROCESS;
        c.id_file = o->rendezvous ? o->rendezvous : default_rendezvous(idbuf, sizeof idbuf);
        if (!c.id_file) {
            st = moe_error_set(&err, MOE_ERR_INPUT,
                               "started by %s, but no job id names the NCCL id's file: give "
                               "--rendezvous FILE (a path every node sees)",
                               exec_launcher_names[c.launch.who]);
            goto cleanup;
        }
        if (o->gpus > 1) {
            st = moe_error_set(&err, MOE_ERR_INPUT, "--gpus %llu under %s: one GPU a process",
                               (unsigned long long)o->gpus, exec_launcher_names[c.launch.who]);
            goto cleanup;
        }
    } else if (o->gpus && !o->virtual_ranks && (int)o->gpus != p.gpus) {
        st = moe_error_set(&err, MOE_ERR_INPUT,
                           "--gpus %llu, but %s is a plan for %d GPU%s (plan for this node with "
                           "`moeplan plan --gpus %llu`)",
                           (unsigned long long)o->gpus, o->plan, p.gpus, p.gpus == 1 ? "" : "s",
                           (unsigned long long)o->gpus);
        goto cleanup;
    }
    c.stop = &stop_signal;
    c.on_start = on_start;
    c.on_step = on_step;
    c.ctx = &lg;
    lg.o = o;
    lg.p = &p;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    st = exec_run(&c, &res, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (lg.bar.out) moe_progress_finish(&lg.bar);
    if (st != MOE_OK) explain_failure(o, &p, st, &err);
    if (st != MOE_OK) goto cleanup;
    if (!res.filled) goto cleanup; /* a rank other than 0 of mpirun/srun: rank 0 reports */
    struct exec_run_summary sum;
    if ((st = exec_run_summarize(&p, &res, &sum, &err))) goto cleanup;
    /* the table: measured medians against the plan's prediction */
    printf("\nper-phase time, median of steps %d-%d (CUDA events, rank 0), against the plan:\n",
           sum.first_step, c.steps);
    const char *h[] = {"phase", "measured", "predicted", "error"};
    struct rpt_table *t = rpt_table_create(4, h, "lrrr");
    for (int ph = 0; t && ph < COST_NPHASES; ph++) {
        if (sum.phase_ms[ph] == 0.0 && p.phase_us[ph] == 0.0) continue;
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", cost_phase_names[ph]);
        rpt_table_cell(t, NULL, "%.2f ms", sum.phase_ms[ph]);
        rpt_table_cell(t, NULL, "%.2f ms", p.phase_us[ph] / 1e3);
        if (p.phase_us[ph] > 0)
            rpt_table_cell(t, NULL, "%+.0f%%",
                           100.0 * (sum.phase_ms[ph] * 1e3 / p.phase_us[ph] - 1.0));
        else
            rpt_table_cell(t, NULL, "-");
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    if (p.layout.ep > 1)
        printf("\ndispatch payload per GPU, MoE layer and micro-batch: NVLink %.0f B (plan %.0f), "
               "scale-out %.0f B (plan %.0f)\n",
               sum.dispatch_per_layer.nvlink, p.dispatch_bytes.nvlink,
               sum.dispatch_per_layer.scale_out, p.dispatch_bytes.scale_out);
    double mstep = sum.phase_ms[COST_STEP];
    if (strcmp(lg.attention, res.info.attention))
        printf("\nattention at the end: %s (at the start: %s)\n", res.info.attention, lg.attention);
    printf("\nmedian step %.1f ms: %.0f tokens/s, %.1f model TFLOPS per GPU, MFU %.1f%% (of %.0f "
           "bf16 TFLOPS); loss %.4f -> %.4f\n",
           mstep, sum.rate.tokens_per_s, sum.rate.model_tflops, 100.0 * sum.rate.mfu,
           sum.rate.peak_tflops, sum.loss_first, sum.loss_last);
    if ((st = exec_measured_save(o->out, o->plan, &c, &res, &err))) goto cleanup;
    printf("measured.json written to %s\n", o->out);
    double step_err = p.step_us > 0 ? 100.0 * (mstep * 1e3 / p.step_us - 1.0) : 0.0;
    if (o->max_error > 0 && fabs(step_err) > o->max_error)
        st = moe_error_set(&err, MOE_ERR_VERIFY,
                           "the measured step (%.2f ms) is %+.1f%% from the plan's %.2f ms, more "
                           "than --max-error %g%%",
                           mstep, step_err, p.step_us / 1e3, o->max_error);
cleanup:
    exec_run_result_free(&res);
    plan_file_free(&p);
    if (st == MOE_ERR_INTERRUPTED && stop_signal) {
        cli_fail(cli, &err);
        return 128 + stop_signal;
    }
    return st == MOE_OK ? 0 : cli_fail(cli, &err);
}

/* A decimal int in [min, max] at *p, which moves past it; false if there is none (sscanf's %d
 * has undefined behaviour on overflow). */
static bool take_int(const char **p, long min, long max, int *out)
{
    char *end;
    errno = 0;
    if (!(**p >= '0' && **p <= '9')) return false;
    long x = strtol(*p, &end, 10);
    if (errno || x < min || x > max) return false;
    *out = (int)x;
    *p = end;
    return true;
}

/* A count option into an int field of the run's settings. */
static bool count_int(const struct cli_cmd *cmd, const char *opt, const char *v, int min, int max,
                      int *out)
{
    uint64_t x;
    if (!cli_count(cmd, opt, v, (uint64_t)min, (uint64_t)max, &x)) return false;
    *out = (int)x;
    return true;
}

/* RANK:STEP of --inject-fault. */
static bool parse_fault(const struct cli_cmd *cmd, const char *v, int *rank, int *step)
{
    const char *p = v;
    if (!take_int(&p, 0, 1 << 24, rank) || *p++ != ':' || !take_int(&p, 1, INT32_MAX, step) || *p) {
        cli_usage(cmd, "--inject-fault '%s': RANK:STEP (rank >= 0, step >= 1)", v);
        return false;
    }
    return true;
}

int cmd_run(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct run_opts o = {.c = {.seed = 1,
                               .steps = 100,
                               .warmup = -1, /* the default: below */
                               .streams = EXEC_DEFAULT_STREAMS,
                               .lr = 3e-4,
                               .bias_rate = 1e-3,
                               .timeout_s = 60.0,
                               .fail_rank = -1,
                               .fail_step = -1},
                         .out = "measured.json"};
    for (int i = 0; i < nargs; i++) {
        const char *v = args[i].value;
        switch (args[i].val) {
        case OPT_STEPS:
            if (!count_int(cmd, "steps", v, 1, 10000000, &o.c.steps)) return 2;
            break;
        case OPT_DATA: o.c.data = v; break;
        case OPT_OUT: o.out = v; break;
        case OPT_GPUS:
            if (!cli_count(cmd, "gpus", v, 1, 1 << 20, &o.gpus)) return 2;
            break;
        case OPT_SEED:
            if (!cli_count(cmd, "seed", v, 0, UINT32_MAX, &o.c.seed)) return 2;
            break;
        case OPT_WARMUP:
            if (!count_int(cmd, "warmup", v, 0, 10000000, &o.c.warmup)) return 2;
            break;
        case OPT_STREAMS:
            if (!count_int(cmd, "expert-streams", v, 1, EXEC_MAX_STREAMS, &o.c.streams)) return 2;
            break;
        case OPT_AUX:
            if (!cli_real(cmd, "aux-loss-coef", v, 0, 10, &o.c.aux)) return 2;
            break;
        case OPT_BIAS:
            if (!cli_real(cmd, "bias-update-rate", v, 0, 1, &o.c.bias_rate)) return 2;
            break;
        case OPT_LR:
            if (!cli_real(cmd, "lr", v, 1e-9, 1, &o.c.lr)) return 2;
            break;
        case OPT_VIRTUAL: o.virtual_ranks = true; break;
        case OPT_NCCL: o.c.nccl = true; break;
        case OPT_NO_OVERLAP: o.c.no_grad_overlap = true; break;
        case OPT_ATTENTION:
            if (!strcmp(v, "auto"))
                o.c.attention = EXEC_ATTN_AUTO;
            else if (!strcmp(v, "own"))
                o.c.attention = EXEC_ATTN_OWN;
            else if (!strcmp(v, "cudnn"))
                o.c.attention = EXEC_ATTN_CUDNN;
            else
                return cli_usage(cmd, "--attention %s: auto, own or cudnn", v);
            break;
        case OPT_CKPT_DIR: o.c.ckpt_dir = v; break;
        case OPT_RESUME: o.c.resume = true; break;
        case OPT_CKPT_EVERY:
            if (!count_int(cmd, "checkpoint-every", v, 1, 10000000, &o.c.ckpt_every)) return 2;
            break;
        case OPT_MAX_ERROR:
            if (!cli_real(cmd, "max-error", v, 0.01, 1e6, &o.max_error)) return 2;
            break;
        case OPT_RENDEZVOUS:
            if (!strcmp(v, "-")) /* the other ranks read it: a file every node sees */
                return cli_usage(cmd,
                                 "--rendezvous -: a file every node sees, not standard output");
            o.rendezvous = v;
            break;
        case OPT_TIMEOUT:
            if (!cli_real(cmd, "timeout", v, 0.01, 86400, &o.c.timeout_s)) return 2;
            break;
        case OPT_FAULT:
            if (!parse_fault(cmd, v, &o.c.fail_rank, &o.c.fail_step)) return 2;
            break;
        case OPT_NONFINITE:
            if (strcmp(v, "stop") && strcmp(v, "skip"))
                return cli_usage(cmd, "--on-nonfinite %s: stop or skip", v);
            o.c.skip_nonfinite = strcmp(v, "skip") == 0;
            break;
        case OPT_NAN: {
            const char *p = v;
            bool ok = take_int(&p, 1, INT32_MAX, &o.c.nan_step) && *p++ == ':' && *p;
            size_t n = (size_t)(p - v), len = strlen(v);
            if (!ok || n + 64 <= len)
                return cli_usage(cmd, "--inject-nan '%s': STEP:TENSOR[:weight] (step >= 1)", v);
            snprintf(o.nan_buf, sizeof o.nan_buf, "%s", p);
            char *w = strstr(o.nan_buf, ":weight");
            if (w && !w[7]) *w = '\0', o.c.nan_weight = true;
            o.c.nan_tensor = o.nan_buf;
            break;
        }
        case OPT_MEM_LIMIT: {
            uint64_t bytes;
            if (!cli_count(cmd, "gpu-memory-limit", v, 1 << 20, (uint64_t)1 << 50, &bytes))
                return 2;
            o.c.gpu_mem_limit = (double)bytes;
            break;
        }
        }
    }
    if (optind != argc - 1) return cli_usage(cmd, "give one plan file");
    if (o.c.warmup > o.c.steps)
        return cli_usage(cmd, "--warmup %d: at most --steps (%d)", o.c.warmup, o.c.steps);
    if (o.c.warmup < 0) /* 10 steps, a tenth of a short run */
        o.c.warmup = o.c.steps / 10 + 1 < 10 ? o.c.steps / 10 + 1 : 10;
    if ((o.c.resume || o.c.ckpt_every) && !o.c.ckpt_dir)
        return cli_usage(cmd, "--resume and --checkpoint-every need --checkpoint-dir");
    o.plan = argv[optind];
    return run(cli, &o);
}

#endif /* MOEPLAN_HAVE_EXECUTOR */
