/*
 * moeplan.c: the command line. The subcommand table, option parsing, usage, and exit codes.
 *
 * This is the only file that prints usage or calls exit: every module below returns an
 * enum moe_status with an error report, and main() turns it into the exit code of DESIGN.md
 * (usage 2, invalid input 3, infeasible 4, verification 5, any other failure 1).
 *
 * Each subcommand has its own option table; `--help` prints to stdout and exits 0, a usage error
 * prints the reason and a "try 'moeplan CMD --help'" line to stderr and exits 2. A subcommand
 * that this build does not have says so and exits 1: never a silent success.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "mdl.h"
#include "plan.h"
#include "rpt.h"
#include "topo.h"
#ifdef MOEPLAN_HAVE_EXECUTOR
#include "exec.h"
#endif

#ifndef MOEPLAN_VERSION
#define MOEPLAN_VERSION "0.0.0"
#endif
#ifndef MOEPLAN_CMOCKA_VERSION
#define MOEPLAN_CMOCKA_VERSION "unknown"
#endif

struct cli {
    struct moe_log log;
};

struct cli_opt {
    const char *name;
    int has_arg; /* no_argument, required_argument */
    int val;
    const char *arg;  /* shown in help: "FILE" */
    const char *help;
};

struct cli_cmd {
    const char *name;
    const char *args;    /* "[options] FILE..." */
    const char *summary;
    const char *planned; /* non-NULL: not built yet; the issue that brings it */
    const struct cli_opt *opts;
    int (*run)(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
};

/* ---------------------------------------------------------------------------------------------- */
/* Option parsing shared by all subcommands                                                       */
/* ---------------------------------------------------------------------------------------------- */

enum { OPT_HELP = 1000 };

static void cmd_help(const struct cli_cmd *cmd, FILE *out)
{
    fprintf(out, "usage: moeplan %s %s\n\n%s\n", cmd->name, cmd->args, cmd->summary);
    if (cmd->planned) fprintf(out, "\nNot built yet: %s.\n", cmd->planned);
    fprintf(out, "\noptions:\n");
    for (const struct cli_opt *o = cmd->opts; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(out, "  %-24s %s\n", left, o->help);
    }
    fprintf(out, "  %-24s %s\n", "--help", "show this help and exit");
}

static int usage_error(const struct cli_cmd *cmd, const char *fmt, const char *what)
{
    fprintf(stderr, "moeplan: %s: ", cmd ? cmd->name : "usage");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    if (cmd) fprintf(stderr, "moeplan: try 'moeplan %s --help'\n", cmd->name);
    else fprintf(stderr, "moeplan: try 'moeplan --help'\n");
    return moe_status_exit_code(MOE_ERR_USAGE);
}

/* One parsed option, in command-line order. */
struct cli_arg {
    int val;
    const char *value;
};

#define CLI_MAX_ARGS 64

/* Parse argv[1..] of a subcommand. Returns -1 when parsing succeeded (results in `out`, `nout`,
 * and optind at the first operand), else the exit code to return (0 for --help). */
static int cmd_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_arg *out,
                     int *nout)
{
    struct option longopts[CLI_MAX_ARGS + 2];
    int n = 0;
    for (const struct cli_opt *o = cmd->opts; o && o->name && n < CLI_MAX_ARGS; o++, n++)
        longopts[n] = (struct option){o->name, o->has_arg, NULL, o->val};
    longopts[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    *nout = 0;
    optind = 0; /* GNU getopt: 0 reinitializes */
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", longopts, NULL);
        if (c == -1) break;
        if (c == OPT_HELP) {
            cmd_help(cmd, stdout);
            return 0;
        }
        if (c == '?' || c == ':') {
            const char *bad = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
            bool missing = false;
            for (const struct cli_opt *o = cmd->opts; o && o->name; o++)
                if (o->has_arg && strncmp(bad, "--", 2) == 0 && strcmp(bad + 2, o->name) == 0)
                    missing = true;
            return usage_error(cmd, missing ? "option '%s' needs a value" : "unknown option '%s'",
                               bad);
        }
        if (*nout == CLI_MAX_ARGS) return usage_error(cmd, "%s", "too many options");
        out[(*nout)++] = (struct cli_arg){c, optarg};
    }
    return -1;
}

static int fail(struct cli *cli, const struct moe_error *err)
{
    moe_log_error(&cli->log, err);
    return moe_status_exit_code(err->status);
}

/* A subcommand that this build lacks: parse its options (so that a typo is still a usage error),
 * then say plainly that it is not built and exit 1. */
static int cmd_not_built(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cmd_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct moe_error err;
    moe_error_set(&err, MOE_ERR_UNSUPPORTED, "'%s' is not built yet: %s", cmd->name,
                  cmd->planned);
    return fail(cli, &err);
}

/* ---------------------------------------------------------------------------------------------- */
/* moeplan check                                                                                  */
/* ---------------------------------------------------------------------------------------------- */

enum { OPT_QUIET = 1 };

static const struct cli_opt check_opts[] = {
    {"quiet", no_argument, OPT_QUIET, NULL, "print nothing on success"},
    {NULL, 0, 0, NULL, NULL},
};

/* Schemas moeplan writes or reads, and whether this build can validate them yet. */
static const char *const known_schemas[] = {"moeplan.cluster", "moeplan.plan",
                                            "moeplan.measured", "moeplan.routing",
                                            "moeplan.calibration", NULL};

static enum moe_status check_file(const char *file, char *summary, size_t cap,
                                  struct moe_error *err)
{
    struct moe_jdoc doc;
    char schema[128];
    int version;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err)) != MOE_OK) goto cleanup;
    if (strcmp(schema, MDL_SCHEMA) == 0) {
        struct mdl_model m;
        if ((st = mdl_model_from_doc(&m, &doc, err)) != MOE_OK) goto cleanup;
        snprintf(summary, cap, "%s v%d: %s, %d layers (%d MoE), %d experts top-%d, %s attention",
                 schema, version, m.name, m.layers, mdl_moe_layer_count(&m), m.moe.experts,
                 m.moe.top_k, m.attn.type == MDL_ATTN_MLA ? "MLA" : "GQA");
        goto cleanup;
    }
    for (const char *const *k = known_schemas; *k; k++) {
        if (strcmp(schema, *k) == 0) {
            st = moe_error_set_at(err, MOE_ERR_UNSUPPORTED, file, 0, 0,
                                  "checking \"%s\" files is not built yet", schema);
            goto cleanup;
        }
    }
    struct moe_jval root;
    moe_jdoc_root(&doc, &root, NULL);
    st = moe_jval_error(&root, "schema", err, "unknown schema \"%s\" (known: %s, %s, ...)", schema,
                        MDL_SCHEMA, known_schemas[0]);
cleanup:
    moe_jdoc_free(&doc);
    return st;
}

static int cmd_check(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cmd_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    bool quiet = false;
    for (int i = 0; i < nargs; i++)
        if (args[i].val == OPT_QUIET) quiet = true;
    if (optind >= argc) return usage_error(cmd, "%s", "no file to check");
    int worst = 0;
    for (int i = optind; i < argc; i++) {
        struct moe_error err;
        char summary[512];
        moe_error_clear(&err);
        enum moe_status st = check_file(argv[i], summary, sizeof summary, &err);
        if (st != MOE_OK) {
            int code = fail(cli, &err);
            if (worst == 0 || code > worst) worst = code;
        } else if (!quiet) {
            printf("%s: ok (%s)\n", argv[i], summary);
        }
    }
    return worst;
}

/* ---------------------------------------------------------------------------------------------- */
/* moeplan run: not in a build without CUDA                                                       */
/* ---------------------------------------------------------------------------------------------- */

enum { OPT_STEPS = 1, OPT_DATA, OPT_OUT, OPT_GPUS };

static const struct cli_opt run_opts[] = {
    {"steps", required_argument, OPT_STEPS, "N", "training steps"},
    {"data", required_argument, OPT_DATA, "FILE", "train on this file (bytes as tokens)"},
    {"out", required_argument, OPT_OUT, "FILE", "write measured.json here"},
    {"gpus", required_argument, OPT_GPUS, "N", "GPUs on this node, one thread each"},
    {NULL, 0, 0, NULL, NULL},
};

static int cmd_run(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
#ifdef MOEPLAN_HAVE_EXECUTOR
    return cmd_not_built(cli, cmd, argc, argv);
#else
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cmd_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct moe_error err;
    moe_error_set(&err, MOE_ERR_UNSUPPORTED,
                  "this build has no executor: it was configured with MOEPLAN_CUDA=OFF or "
                  "without the CUDA Toolkit; rebuild with CUDA to run plans");
    return fail(cli, &err);
#endif
}

/* ---------------------------------------------------------------------------------------------- */
/* Option tables of the subcommands that later work fills in                                      */
/* ---------------------------------------------------------------------------------------------- */

enum { OPT_MODEL = 1, OPT_CLUSTER, OPT_LAYOUT, OPT_SEQ, OPT_GBS, OPT_JSON, OPT_O, OPT_CAL };

static const struct cli_opt topo_opts[] = {
    {"output", required_argument, OPT_O, "DIR", "where discovery writes the node XML and cluster"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct cli_opt plan_opts[] = {
    {"model", required_argument, OPT_MODEL, "M", "model name, model file or HF config.json"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "cluster name or file"},
    {"gpus", required_argument, OPT_GPUS, "N", "use the first N GPUs of the cluster"},
    {"seq-len", required_argument, OPT_SEQ, "S", "sequence length"},
    {"gbs", required_argument, OPT_GBS, "B", "global batch in sequences"},
    {"output", required_argument, OPT_O, "FILE", "write the plan here"},
    {"calibration", required_argument, OPT_CAL, "FILE", "calibration profile"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct cli_opt predict_opts[] = {
    {"model", required_argument, OPT_MODEL, "M", "model name, model file or HF config.json"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "cluster name or file"},
    {"gpus", required_argument, OPT_GPUS, "N", "use the first N GPUs of the cluster"},
    {"layout", required_argument, OPT_LAYOUT, "K=V,...", "tp, pp, vpp, ep, etp, dp, zero, mbs, gbs"},
    {"seq-len", required_argument, OPT_SEQ, "S", "sequence length"},
    {"json", required_argument, OPT_JSON, "FILE", "write the prediction as JSON"},
    {"calibration", required_argument, OPT_CAL, "FILE", "calibration profile"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct cli_opt calibrate_opts[] = {
    {"output", required_argument, OPT_O, "FILE", "write the profile here"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct cli_opt report_opts[] = {
    {"output", required_argument, OPT_O, "DIR", "write the report here"},
    {NULL, 0, 0, NULL, NULL},
};
static const struct cli_opt bench_opts[] = {
    {"json", required_argument, OPT_JSON, "FILE", "write the results as JSON"},
    {NULL, 0, 0, NULL, NULL},
};

static const struct cli_cmd commands[] = {
    {"topo", "discover|show|check [options] [CLUSTER]",
     "Discover this machine (hwloc), show or check a cluster.",
     "cluster descriptions and hwloc discovery come with the models-and-clusters work (issue 3)",
     topo_opts, cmd_not_built},
    {"plan", "[options]",
     "Choose layout and expert placement; write plan.json.",
     "the layout search and GLPK placement come with the planner work (issue 5)", plan_opts,
     cmd_not_built},
    {"predict", "[options]",
     "Predict step time, phases and memory of a given layout.",
     "the cost model comes with the cost-model work (issue 4)", predict_opts, cmd_not_built},
    {"run", "PLAN [options]",
     "Train a plan for real on GPUs and measure each phase.",
#ifdef MOEPLAN_HAVE_EXECUTOR
     "the executor comes with the single-GPU executor work (issue 6)",
#else
     NULL,
#endif
     run_opts, cmd_run},
    {"calibrate", "[options]",
     "Microbenchmark this GPU machine; fit a profile.",
     "calibration comes with the calibration work (issue 9)", calibrate_opts, cmd_not_built},
    {"report", "PLAN MEASURED [options]",
     "Predicted-vs-measured report (Markdown + SVG).",
     "reports come with the calibration work (issue 9)", report_opts, cmd_not_built},
    {"bench", "moe|eval [options]",
     "Benchmarks: MoE layer vs peers, planner speed.",
     "benchmarks come with the cost-model and executor-speed work (issues 4 and 7)", bench_opts,
     cmd_not_built},
    {"check", "[options] FILE...",
     "Validate moeplan JSON files (file:line:col errors).",
     NULL, check_opts, cmd_check},
};
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

/* ---------------------------------------------------------------------------------------------- */
/* moeplan --version, --help                                                                      */
/* ---------------------------------------------------------------------------------------------- */

static void print_version(void)
{
    printf("moeplan %s\n", MOEPLAN_VERSION);
    const char *headers[] = {"dependency", "version"};
    struct rpt_table *t = rpt_table_create(2, headers, "ll");
    if (!t) return;
    char buf[256];
#ifdef MOEPLAN_HAVE_EXECUTOR
    struct exec_versions v;
    exec_versions_get(&v);
    char driver[32];
    if (v.cuda_driver) snprintf(driver, sizeof driver, "%d.%d", v.cuda_driver / 1000,
                                (v.cuda_driver % 1000) / 10);
    else snprintf(driver, sizeof driver, "none found");
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "CUDA runtime");
    rpt_table_cell(t, NULL, "%d.%d (built with %d.%d; driver %s)", v.cuda_runtime / 1000,
                   (v.cuda_runtime % 1000) / 10, v.cuda_compiled / 1000,
                   (v.cuda_compiled % 1000) / 10, driver);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "cuBLAS");
    rpt_table_cell(t, NULL, "%d.%d.%d", v.cublas_major, v.cublas_minor, v.cublas_patch);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "NCCL");
    rpt_table_cell(t, NULL, "%d.%d.%d (built with %d.%d.%d)", v.nccl_runtime / 10000,
                   (v.nccl_runtime % 10000) / 100, v.nccl_runtime % 100, v.nccl_compiled / 10000,
                   (v.nccl_compiled % 10000) / 100, v.nccl_compiled % 100);
#else
    static const char *const gpu_libs[] = {"CUDA runtime", "cuBLAS", "NCCL"};
    for (int i = 0; i < 3; i++) {
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", gpu_libs[i]);
        rpt_table_cell(t, NULL, "not in this build (MOEPLAN_CUDA=OFF or no CUDA Toolkit)");
    }
#endif
    topo_hwloc_version(buf, sizeof buf);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "hwloc");
    rpt_table_cell(t, NULL, "%s", buf);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "GLPK");
    rpt_table_cell(t, NULL, "%s", plan_glpk_version());
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "jansson");
    rpt_table_cell(t, NULL, "%s", moe_jansson_version());
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "cmocka");
    rpt_table_cell(t, NULL, "%s (tests only)", MOEPLAN_CMOCKA_VERSION);
    rpt_table_print(t, stdout);
    rpt_table_destroy(t);
}

static void print_help(FILE *out)
{
    fprintf(out,
            "usage: moeplan [--quiet|--verbose] <command> [options]\n"
            "       moeplan --version | --help\n\n"
            "Plan and run dropless Mixture-of-Experts training on NVIDIA GPU clusters.\n\n"
            "commands:\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s%s\n", commands[i].name, commands[i].summary,
                commands[i].planned ? " (not built yet)" : "");
    fprintf(out, "\n'moeplan <command> --help' shows a command's options.\n"
                 "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 invalid input, 4 infeasible,\n"
                 "5 verification failed.\n");
}

int main(int argc, char **argv)
{
    struct cli cli;
    moe_log_init(&cli.log, MOE_LOG_INFO);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            print_version();
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0)
            cli.log.level = MOE_LOG_ERROR;
        else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0)
            cli.log.level = MOE_LOG_DEBUG;
        else return usage_error(NULL, "unknown option '%s'", argv[i]);
    }
    if (i >= argc) {
        print_help(stderr);
        return moe_status_exit_code(MOE_ERR_USAGE);
    }
    if (!topo_hwloc_abi_ok()) {
        fprintf(stderr, "moeplan: the hwloc library loaded at run time does not match the one "
                        "moeplan was built with\n");
        return 1;
    }
    for (int c = 0; c < NCOMMANDS; c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            return commands[c].run(&cli, &commands[c], argc - i, argv + i);
    return usage_error(NULL, "unknown command '%s'", argv[i]);
}
