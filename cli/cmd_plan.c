/*
 * cmd_plan.c: `moeplan plan`: search the layouts, place the experts, split the stages, write
 * plan.json; --explain says why, --emit prints the flags for Megatron-LM or MaxText.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "exec.h"

enum {
    OPT_GBS = 1,
    OPT_FIX,
    OPT_MAX_TP,
    OPT_HEADROOM,
    OPT_OBJECTIVE,
    OPT_TOP,
    OPT_EXPLAIN,
    OPT_EMIT,
    OPT_REPLICAS,
    OPT_TIME,
    OPT_RUNNABLE,
    OPT_COMPARE,
    OPT_PUBLISHED,
    OPT_RUN,
    OPT_OUT = 'o'
};

const struct cli_opt cmd_plan_opts[] = {
    CLI_INPUT_OPTIONS,
    {"gbs", required_argument, OPT_GBS, "B", "global batch in sequences (default 8 x GPUs)",
     CLI_PLAIN},
    {"fix", required_argument, OPT_FIX, "K=V,...", "fix degrees or choices: ep=64,pp=4,...",
     CLI_PLAIN},
    {"max-tp", required_argument, OPT_MAX_TP, "N", "largest TP to consider (8)", CLI_PLAIN},
    {"headroom", required_argument, OPT_HEADROOM, "F", "fraction of HBM kept free (0.05)",
     CLI_PLAIN},
    {"objective", required_argument, OPT_OBJECTIVE, "O",
     "throughput (default) or cost (GPU-hours per 1e12 tokens; tries fewer GPUs)", CLI_PLAIN},
    {"top", required_argument, OPT_TOP, "K", "alternatives kept (5)", CLI_PLAIN},
    {"replicas", required_argument, OPT_REPLICAS, "N", "extra expert slots per EP rank (0)",
     CLI_PLAIN},
    {"time-limit", required_argument, OPT_TIME, "S", "seconds per integer program (0.5)",
     CLI_PLAIN},
    {"runnable", no_argument, OPT_RUNNABLE, NULL,
     "only layouts this build's executor runs (moeplan run; no MTP layers)", CLI_PLAIN},
    {"explain", no_argument, OPT_EXPLAIN, NULL, "say why this layout", CLI_PLAIN},
    {"compare", required_argument, OPT_COMPARE, "K=V,...",
     "with --explain: a layout (a published recipe's) set beside the plan: where it ranks among "
     "the layouts costed and why the plan beats it",
     CLI_PLAIN},
    {"published", required_argument, OPT_PUBLISHED, "FILE",
     "published training runs (tests/data/published/mb-runs.tsv), with --run", CLI_PLAIN},
    {"run", required_argument, OPT_RUN, "ID",
     "plan that run's model, cluster, GPUs, global batch, sequence and precision, with its "
     "dispatcher and recipe settings fixed and its stack's profile, and --explain --compare its "
     "layout: what the planner picks where the published run chose",
     CLI_PLAIN},
    {"emit", required_argument, OPT_EMIT, "T",
     "print launch flags: megatron or maxtext (maxtext: only layouts MaxText runs, ep dividing "
     "dp, its plain all-to-all)",
     CLI_PLAIN},
    {"output", required_argument, OPT_OUT, "FILE", "write plan.json here", CLI_OUT_FILE},
    {NULL, 0, 0, NULL, NULL, 0},
};

/* --published FILE --run ID: the row's model, cluster, GPUs, global batch, sequence and
 * precision as the inputs (none of them given as well), its recipe settings that are not searched
 * (dispatcher, no EP overlap, gradient-reduce and moment precision, MTP) fixed ahead of the user's --fix, its
 * layout to compare, and its container's stack profile (megatron-YY.MM) unless --calibration
 * names one. Returns -1 when set, else the exit code. */
static int published_run(struct cli *cli, const struct cli_cmd *cmd, const char *file,
                         const char *id, struct cli_input_opts *io, uint64_t *gbs,
                         const char *user_fix, const char *user_compare, char *fix, size_t fix_cap,
                         char compare[COST_LAYOUT_TEXT_MAX], char stack[32])
{
    struct cost_layout scratch;
    uint64_t keys = 0;
    plan_fix_none(&scratch, 4096);
    if (user_fix && cost_layout_parse_keys(&scratch, user_fix, &keys, NULL) == MOE_OK &&
        (keys & (COST_KEY_BIT(COST_KEY_SEQ) | COST_KEY_BIT(COST_KEY_GBS) |
                 COST_KEY_BIT(COST_KEY_PRECISION))))
        return cli_usage(cmd, "--run sets the sequence, global batch and precision: --fix may "
                              "not give seq, gbs or precision with it");
    if (io->model || io->cluster || io->gpus || io->precision || *gbs || io->seq_given ||
        user_compare)
        return cli_usage(cmd, "--run sets the model, cluster, GPUs, precision, sequence, global "
                              "batch and the layout compared: give none of them with it");
    static struct plan_published rows[PLAN_PUBLISHED_MAX];
    int n;
    struct moe_error err;
    if (plan_published_load(file, rows, PLAN_PUBLISHED_MAX, &n, &err) != MOE_OK)
        return cli_fail(cli, &err);
    const struct plan_published *r = NULL;
    for (int i = 0; i < n && !r; i++)
        if (!strcmp(rows[i].id, id)) r = &rows[i];
    if (!r) return cli_usage(cmd, "--run %s: no run of that id in %s", id, file);
    static struct plan_published row; /* outlives this call: io points into it */
    row = *r;
    /* the row's model, cluster and layout resolved as a fit resolves them: a bad cell is named at
     * the file's line and column, not as an option of this command */
    static struct plan_fit_row fit; /* large: not on the stack */
    char mdir[MOE_PATH_MAX], tdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    cli_data_path(cli, "topologies", tdir, sizeof tdir);
    if (plan_fit_rows(&row, 1, mdir, tdir, &fit, &err) != MOE_OK) return cli_fail(cli, &err);
    io->model = row.model, io->cluster = row.cluster, io->precision = row.precision;
    io->gpus = (uint64_t)row.gpus, io->seq = (uint64_t)row.seq, *gbs = (uint64_t)row.gbs;
    plan_published_stack_of(&row, stack, 32);
    io->stack = stack;
    char mtp[16] = "";
    if (row.mtp >= 0) snprintf(mtp, sizeof mtp, ",mtp=%d", row.mtp);
    /* the recipe's settings the search does not choose: the dispatcher, the gradient and moment
     * precisions, MTP, and the flags' overhead settings (EP overlap off where they say none) */
    bool overlap = strstr(row.recipe, "overlap=") != NULL;
    int k = snprintf(fix, fix_cap, "dispatcher=%s,grad_reduce=%s,moments=%s%s%s%s%s%s%s",
                     row.dispatcher, row.grad_reduce, row.moments, mtp,
                     overlap ? "" : ",overlap=off", row.recipe[0] ? "," : "", row.recipe,
                     user_fix ? "," : "", user_fix ? user_fix : "");
    if (k < 0 || (size_t)k >= fix_cap) return cli_usage(cmd, "--fix: too long");
    plan_published_layout(&row, compare, COST_LAYOUT_TEXT_MAX);
    return -1;
}

int cmd_plan(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *fix = NULL, *out = NULL, *emit = NULL, *objective = NULL, *compare = NULL;
    const char *published = NULL, *run = NULL;
    uint64_t gbs = 0, max_tp = 8, top = 5, replicas = 0;
    double headroom = 0.05, time_limit = 0.5;
    bool explain = false, runnable = false;
    struct cli_input_opts io;
    cli_input_opts_init(&io);
    for (int i = 0; i < nargs; i++) {
        const char *val = args[i].value;
        int shared = cli_input_arg(cmd, &args[i], &io);
        if (shared < 0) return 2;
        if (shared) continue;
        switch (args[i].val) {
        case OPT_FIX: fix = val; break;
        case OPT_COMPARE: compare = val; break;
        case OPT_PUBLISHED: published = val; break;
        case OPT_RUN: run = val; break;
        case OPT_OUT: out = val; break;
        case OPT_EMIT: emit = val; break;
        case OPT_OBJECTIVE: objective = val; break;
        case OPT_EXPLAIN: explain = true; break;
        case OPT_RUNNABLE: runnable = true; break;
        case OPT_GBS:
            if (!cli_count(cmd, "gbs", val, 1, COST_MAX_GBS, &gbs)) return 2;
            break;
        case OPT_MAX_TP:
            if (!cli_count(cmd, "max-tp", val, 1, 1024, &max_tp)) return 2;
            break;
        case OPT_TOP:
            if (!cli_count(cmd, "top", val, 0, PLAN_MAX_ALT - 1, &top)) return 2;
            break;
        case OPT_REPLICAS:
            if (!cli_count(cmd, "replicas", val, 0, 64, &replicas)) return 2;
            break;
        case OPT_HEADROOM:
            if (!cli_real(cmd, "headroom", val, 0, 0.89, &headroom)) return 2;
            break;
        case OPT_TIME:
            if (!cli_real(cmd, "time-limit", val, 1e-3, 3600, &time_limit)) return 2;
            break;
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected operand '%s'", argv[optind]);
    if (emit && strcmp(emit, "megatron") && strcmp(emit, "maxtext"))
        return cli_usage(cmd, "--emit %s: megatron or maxtext", emit);
    static char run_fix[512], run_compare[COST_LAYOUT_TEXT_MAX], run_stack[32];
    if (!published != !run) return cli_usage(cmd, "--published and --run go together");
    if (run) {
        rc = published_run(cli, cmd, published, run, &io, &gbs, fix, compare, run_fix,
                           sizeof run_fix, run_compare, run_stack);
        if (rc >= 0) return rc;
        fix = run_fix, compare = run_compare, explain = true;
    }
    enum plan_objective obj = PLAN_THROUGHPUT;
    if (objective && !strcmp(objective, "cost"))
        obj = PLAN_COST;
    else if (objective && strcmp(objective, "throughput"))
        return cli_usage(cmd, "--objective %s: throughput or cost", objective);
    /* --fix first: its seq, gbs and precision are the inputs' (and must agree with the options
     * that also give them) */
    struct moe_error err;
    struct cost_layout f;
    uint64_t fixed = 0;
    plan_fix_none(&f, (int)io.seq);
    if (fix && cost_layout_parse_keys(&f, fix, &fixed, &err) != MOE_OK)
        return cli_usage(cmd, "--fix: %s", err.message);
    rc = cli_layout_agrees(cmd, "--fix", &f, fixed, &io, &gbs);
    if (rc >= 0) return rc;
    struct cli_inputs in;
    rc = cli_load_inputs(cli, cmd, &io, &in);
    if (rc >= 0) return rc;
    if (out && !cli_output_ok(cmd, "-o", out)) {
        cost_routing_free(&in.routing);
        return 2;
    }
    static struct plan_request q; /* large: not on the stack */
    memset(&q, 0, sizeof q);
    q.model = in.model;
    q.cluster = in.cluster;
    q.cal = in.cal;
    q.routing = in.have_routing && in.routing.kind != COST_ROUTING_UNIFORM ? &in.routing : NULL;
    snprintf(q.model_spec, sizeof q.model_spec, "%s", io.model);
    snprintf(q.cluster_spec, sizeof q.cluster_spec, "%s", io.cluster);
    snprintf(q.routing_spec, sizeof q.routing_spec, "%s", io.routing ? io.routing : "uniform");
    q.gpus = in.gpus;
    q.gbs = gbs ? (int)gbs : 8 * in.gpus;
    q.seq_len = (int)io.seq;
    q.max_tp = (int)max_tp;
    q.headroom = headroom;
    q.objective = obj;
    q.top_k = (int)top;
    q.replica_slots = (int)replicas;
    q.mip_time_limit_s = time_limit;
    if (runnable && f.mtp < 0) f.mtp = 0; /* the executor does not train MTP layers yet */
    /* MaxText: experts inside data parallelism (the search's maxtext_mesh), and its dispatch a
     * plain all-to-all (its ragged one), so its plans are costed with that */
    q.maxtext_mesh = emit && !strcmp(emit, "maxtext");
    if (q.maxtext_mesh && (int)f.dispatcher < 0) f.dispatcher = COST_DISPATCH_ALLTOALL;
    if (q.maxtext_mesh && f.dispatcher != COST_DISPATCH_ALLTOALL) {
        cost_routing_free(&in.routing);
        return cli_usage(cmd, "--emit maxtext: MaxText dispatches with a plain all-to-all, not %s",
                         cost_dispatcher_names[f.dispatcher]);
    }
    q.fix = f;
    snprintf(q.fix_text, sizeof q.fix_text, "%s", fix ? fix : "");
    if (runnable) {
        char why[256];
        if (replicas > 0) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd, "--runnable plans without --replicas: the executor serves each "
                                  "expert from one rank");
        }
        if (!exec_model_runnable(&in.model, why, sizeof why)) {
            cost_routing_free(&in.routing);
            moe_error_set(&err, MOE_ERR_INFEASIBLE, "no layout this build runs: %s", why);
            return cli_fail(cli, &err);
        }
        q.accept = exec_layout_runnable;
    }
    q.precision = COST_BF16;
    if (io.precision) {
        struct cost_layout p = f;
        char buf[64];
        snprintf(buf, sizeof buf, "precision=%s", io.precision);
        if (cost_layout_parse(&p, buf, &err) != MOE_OK) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd, "%s", err.message);
        }
        q.precision = p.precision;
    }
    if (compare) { /* a whole layout: what it leaves out is a plain run's, dp from the GPUs */
        if (!explain) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd, "--compare goes with --explain");
        }
        cost_layout_defaults(&q.compare, q.seq_len);
        q.compare.dp = 0;
        q.compare.gbs = q.gbs;
        q.compare.precision = q.precision;
        q.compare.mtp = in.model.mtp_layers;
        uint64_t keys = 0;
        if (cost_layout_parse_keys(&q.compare, compare, &keys, &err) != MOE_OK) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd, "--compare: %s", err.message);
        }
        /* a layout of the same workload: another sequence or batch would not compare */
        if (q.compare.seq_len != q.seq_len || q.compare.gbs != q.gbs) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd,
                             "--compare: seq=%d, gbs=%d: the plan's workload is seq %d, gbs %d; "
                             "compare layouts of one workload (set them with --seq-len, --gbs)",
                             q.compare.seq_len, q.compare.gbs, q.seq_len, q.gbs);
        }
        if (q.compare.dp == 0) {
            long rest = (long)q.gpus / q.compare.tp / q.compare.cp / q.compare.pp;
            q.compare.dp = rest > 0 ? (int)rest : 1;
        }
        q.have_compare = true;
    }
    struct moe_progress bar; /* a long search (thousands of layers, 65,536 experts) says so */
    moe_progress_start(&bar, stderr, true, "plan", 1);
    moe_progress_lines(&bar, 2.0);
    q.bar = &bar;
    static struct plan_result r;
    enum moe_status st = plan_search(&q, &r, &err);
    if (st != MOE_OK) {
        cost_routing_free(&in.routing);
        return cli_fail(cli, &err);
    }
    /* With -o -, the plan goes to standard output and the text to standard error. */
    FILE *txt = out && !strcmp(out, "-") ? stderr : stdout;
    plan_print_summary(&q, &r, txt);
    if (explain) plan_print_explain(&q, &r, txt);
    if (emit) {
        fprintf(txt, "\n");
        if (plan_print_emit(&q, &r, emit, txt, &err) != MOE_OK) rc = cli_fail(cli, &err);
    }
    if (out) {
        if (plan_save(&q, &r, out, &err) != MOE_OK)
            rc = cli_fail(cli, &err);
        else if (strcmp(out, "-"))
            fprintf(txt, "\nplan written to %s\n", out);
    } else {
        fprintf(txt,
                "\nno plan file written: add -o plan.json to keep it (moeplan run takes it)\n");
    }
    plan_result_free(&r);
    cost_routing_free(&in.routing);
    return rc < 0 ? 0 : rc;
}
