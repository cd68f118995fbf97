/*
 * moeplan.c: the command line. The subcommand table, option parsing, usage, and exit codes.
 *
 * This is the only file that prints usage or calls exit: every module below returns an
 * enum moe_status with an error report, and main() turns it into the exit code of common/status.c's table
 * (usage 2, invalid input 3, infeasible 4, verification 5, any other failure 1).
 *
 * Each subcommand has its own option table; `--help` prints to stdout and exits 0, a usage error
 * prints the reason and a "try 'moeplan CMD --help'" line to stderr and exits 2. A subcommand
 * that this build does not have says so and exits 1: never a silent success.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
#ifndef MOEPLAN_DATA_DIR
#define MOEPLAN_DATA_DIR "."
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Option parsing shared by all subcommands                                                       */
/* ---------------------------------------------------------------------------------------------- */

enum { OPT_HELP = 1000 };

static void cmd_help(const struct cli_cmd *cmd, FILE *out)
{
    fprintf(out, "usage: moeplan %s %s\n\n%s\n", cmd->name, cmd->args, cmd->summary);
    if (cmd->missing) fprintf(out, "\nNeeds a CUDA build: %s.\n", cmd->missing);
    fprintf(out, "\noptions:\n");
    for (const struct cli_opt *o = cmd->opts; o && o->name; o++) {
        char left[64];
        bool letter = (o->val >= 'a' && o->val <= 'z') || (o->val >= 'A' && o->val <= 'Z');
        char sh[8] = "";
        if (letter) snprintf(sh, sizeof sh, "-%c, ", o->val);
        snprintf(left, sizeof left, "%s--%s%s%s", sh, o->name, o->arg ? " " : "",
                 o->arg ? o->arg : "");
        fprintf(out, "  %-24s %s\n", left, o->help);
    }
    fprintf(out, "  %-24s %s\n", "--help", "show this help and exit");
}

int cli_usage(const struct cli_cmd *cmd, const char *fmt, ...)
{
    /* the message quotes what the user typed: shown safe (moe_text_safe), never raw */
    char msg[2 * MOE_MSG_MAX], safe[8 * MOE_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    moe_text_safe(msg, safe, sizeof safe);
    fprintf(stderr, "moeplan: %s: %s\n", cmd ? cmd->name : "usage", safe);
    if (cmd)
        fprintf(stderr, "moeplan: try 'moeplan %s --help'\n", cmd->name);
    else
        fprintf(stderr, "moeplan: try 'moeplan --help'\n");
    return moe_status_exit_code(MOE_ERR_USAGE);
}

bool cli_real(const struct cli_cmd *cmd, const char *opt, const char *value, double min, double max,
              double *out)
{
    char *end;
    double x = strtod(value, &end);
    /* decimal only, as every count: no "0x1p-4", no leading blanks */
    bool decimal = (value[0] >= '0' && value[0] <= '9') || value[0] == '.' || value[0] == '-';
    if (value[0] == '0' && (value[1] == 'x' || value[1] == 'X')) decimal = false;
    if (!*value || *end || !decimal || !(x >= min && x <= max)) {
        cli_usage(cmd, "--%s %s: a number in [%g, %g]", opt, value, min, max);
        return false;
    }
    *out = x;
    return true;
}

bool cli_count(const struct cli_cmd *cmd, const char *opt, const char *value, uint64_t min,
               uint64_t max, uint64_t *out)
{
    uint64_t v;
    struct moe_error err;
    if (moe_parse_count(value, &v, &err) != MOE_OK) {
        cli_usage(cmd, "--%s: %s", opt, err.message);
        return false;
    }
    if (v < min || v > max) {
        cli_usage(cmd, "--%s %s: must be in [%llu, %llu]", opt, value, (unsigned long long)min,
                  (unsigned long long)max);
        return false;
    }
    *out = v;
    return true;
}

int cli_list_json(const char *dir, const char *except, char **names, int cap, struct moe_error *err)
{
    DIR *d = opendir(dir);
    if (!d) {
        moe_error_set(err, MOE_ERR_IO, "cannot list %s (set MOEPLAN_DATA_DIR?)", dir);
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".json") == 0 &&
            !(except && strcmp(e->d_name, except) == 0)) {
            char *name = strdup(e->d_name);
            if (name) names[n++] = name;
        }
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a stable, readable order */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    return n;
}

void cli_data_path(const struct cli *cli, const char *rel, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/%s", cli->data_dir, rel);
    if (n < 0 || (size_t)n >= cap) buf[cap - 1] = '\0';
}

void cli_gpu_file_name(const char *gpu, char *buf, size_t cap)
{
    size_t n = 0;
    for (; gpu[n] && n + 1 < cap; n++) buf[n] = (char)tolower((unsigned char)gpu[n]);
    if (cap) buf[n] = '\0';
}

int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_arg *out, int *nout)
{
    struct option longopts[CLI_MAX_ARGS + 2];
    int n = 0;
    for (const struct cli_opt *o = cmd->opts; o && o->name && n < CLI_MAX_ARGS; o++, n++)
        longopts[n] = (struct option){o->name, o->has_arg, NULL, o->val};
    longopts[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    /* An option whose val is a letter is also that short option (-o FILE). */
    char shorts[2 * CLI_MAX_ARGS + 1];
    size_t ns = 0;
    for (const struct cli_opt *o = cmd->opts; o && o->name; o++)
        if ((o->val >= 'a' && o->val <= 'z') || (o->val >= 'A' && o->val <= 'Z')) {
            shorts[ns++] = (char)o->val;
            if (o->has_arg) shorts[ns++] = ':';
        }
    shorts[ns] = '\0';
    *nout = 0;
    optind = 0; /* GNU getopt: 0 reinitializes */
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, shorts, longopts, NULL);
        if (c == -1) break;
        if (c == OPT_HELP) {
            cmd_help(cmd, stdout);
            return 0;
        }
        if (c == '?' || c == ':') {
            const char *bad = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
            bool missing = false;
            for (const struct cli_opt *o = cmd->opts; o && o->name; o++)
                if (o->has_arg && ((strncmp(bad, "--", 2) == 0 && strcmp(bad + 2, o->name) == 0) ||
                                   (bad[0] == '-' && bad[1] == o->val && !bad[2])))
                    missing = true;
            return cli_usage(cmd, missing ? "option '%s' needs a value" : "unknown option '%s'",
                             bad);
        }
        if (*nout == CLI_MAX_ARGS) return cli_usage(cmd, "too many options");
        if (optarg && !optarg[0]) {
            const char *name = "?";
            for (const struct cli_opt *o = cmd->opts; o && o->name; o++)
                if (o->val == c) name = o->name;
            return cli_usage(cmd, "option '--%s' has an empty value", name);
        }
        out[(*nout)++] = (struct cli_arg){c, optarg};
    }
    /* An option with a value given twice would keep one of them silently: refused by name. */
    for (int i = 0; i < *nout; i++) {
        const struct cli_opt *o = cmd->opts;
        while (o && o->name && o->val != out[i].val) o++;
        if (!o || !o->name || !o->has_arg || o->role == CLI_REPEATABLE) continue;
        for (int j = i + 1; j < *nout; j++)
            if (out[j].val == out[i].val)
                return cli_usage(cmd, "option '--%s' given twice (%s, %s): give it once", o->name,
                                 out[i].value, out[j].value);
    }
    /* Every path this command will write, checked now, before any work: a device, a FIFO, a
     * folder for a file (and the other way round), a loop of links, a missing folder. "-" takes
     * standard output for the data and sends the rest to standard error. */
    for (int i = 0; i < *nout; i++) {
        const struct cli_opt *o = cmd->opts;
        while (o && o->name && o->val != out[i].val) o++;
        if (!o || !o->name ||
            (o->role != CLI_OUT_FILE && o->role != CLI_OUT_DIR && o->role != CLI_OUT_EITHER))
            continue;
        const char *v = out[i].value;
        struct moe_error err;
        enum moe_status st = MOE_OK;
        if (o->role == CLI_OUT_DIR)
            st = moe_output_dir_check(v, &err);
        else if (!strcmp(v, "-"))
            st = moe_stdout_claim(&err);
        else if (o->role == CLI_OUT_FILE || moe_output_dir_check(v, NULL) != MOE_OK)
            st = moe_output_check(v, &err); /* CLI_OUT_EITHER: a folder, or else a file */
        if (st != MOE_OK) return cli_usage(cmd, "--%s: %s", o->name, err.message);
    }
    return -1;
}

enum moe_status cli_write_drawn(const char *path, cli_draw_fn fn, const void *arg,
                                struct moe_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    enum moe_status st = fn(f, arg, err);
    if (fclose(f) != 0 && st == MOE_OK) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) st = moe_file_write_atomic(path, text, len, err);
    free(text);
    return st;
}

bool cli_output_ok(const struct cli_cmd *cmd, const char *opt, const char *path)
{
    struct moe_error err;
    if (moe_output_check(path, &err) == MOE_OK) return true;
    cli_usage(cmd, "%s %s: %s", opt, path, err.message);
    return false;
}

int cli_fail(struct cli *cli, const struct moe_error *err)
{
    moe_log_error(&cli->log, err);
    if (err->status == MOE_ERR_USAGE)
        fprintf(stderr, "moeplan: try 'moeplan %s%s--help'\n", cli->cmd ? cli->cmd : "",
                cli->cmd ? " " : "");
    return moe_status_exit_code(err->status);
}

int cli_gpu_exec(struct cli *cli)
{
#ifdef MOEPLAN_GPU_HELPER
    /* the GPU part, moeplan-gpu, sits beside this binary: the same program with the executor
     * linked in (cuBLAS alone costs 150 MB of memory at start, which the planner's commands
     * should not pay); it runs this very command line in this process */
    char self[PATH_MAX], path[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "moeplan: cannot find this program's folder: %s\n", strerror(errno));
        return 1;
    }
    self[n] = '\0';
    snprintf(path, sizeof path, "%s/moeplan-gpu", dirname(self));
    fflush(stdout);
    fflush(stderr);
    moe_stdout_release(); /* a '-' output is the GPU part's to claim again */
    execv(path, cli->argv);
    fprintf(stderr, "moeplan: the GPU commands run in %s, which could not be started: %s\n", path,
            strerror(errno));
    return 1;
#else
    (void)cli;
    return -1;
#endif
}

#if !defined(MOEPLAN_HAVE_EXECUTOR) && defined(MOEPLAN_GPU_HELPER)
/* A GPU command in the planner's binary: the GPU part runs it (cli_gpu_exec). */
static int cmd_gpu(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    (void)cmd, (void)argc, (void)argv;
    return cli_gpu_exec(cli);
}
#define cmd_run cmd_gpu
#define cmd_bench cmd_gpu
#define cmd_validate cmd_gpu
#define GPU_COMMANDS_HERE 1
#elif defined(MOEPLAN_HAVE_EXECUTOR)
#define GPU_COMMANDS_HERE 1
#endif

#ifndef GPU_COMMANDS_HERE
/* A subcommand that this build lacks: parse its options with its real table (so that a typo is
 * still a usage error and a documented option is not "unknown"), then say plainly that it is
 * not built and exit 1. */
static int cmd_not_built(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct moe_error err;
    moe_error_set(&err, MOE_ERR_UNSUPPORTED, "'%s' needs a CUDA build: %s", cmd->name,
                  cmd->missing);
    return cli_fail(cli, &err);
}
#define cmd_run cmd_not_built
#define cmd_bench cmd_not_built
#define cmd_validate cmd_not_built
#endif

static const struct cli_cmd commands[] = {
    {"topo", "discover|show|list|generate [options] [CLUSTER|KIND]",
     "Discover this machine (hwloc, NVML), show or list clusters.", NULL, cmd_topo_opts, cmd_topo},
    {"plan", "--model M --cluster C [options]",
     "Choose layout and expert placement; write plan.json.", NULL, cmd_plan_opts, cmd_plan},
    {"predict", "--model M --cluster C --layout K=V,... [options]",
     "Predict step time, phases and memory of a given layout.", NULL, cmd_predict_opts,
     cmd_predict},
    {"run", "PLAN [options]", "Train a plan for real on GPUs and measure each phase.",
#ifdef GPU_COMMANDS_HERE
     NULL,
#else
     "training runs on GPUs: this build has no executor (it was configured with "
     "MOEPLAN_CUDA=OFF or without the CUDA Toolkit; rebuild with CUDA to run plans)",
#endif
     cmd_run_opts, cmd_run},
    {"calibrate", "[options]",
     "Microbenchmark this GPU machine; fit a profile (--refit: again, on any machine).", NULL,
     cmd_calibrate_opts, cmd_calibrate},
    {"validate", "[options]", "Plan, run and compare a set of one-GPU jobs; write the report.",
#ifdef GPU_COMMANDS_HERE
     NULL,
#else
     "validation runs jobs on a GPU: this build has no executor",
#endif
     cmd_validate_opts, cmd_validate},
    {"report", "PLAN MEASURED [options]", "Predicted-vs-measured report (Markdown + SVG).", NULL,
     cmd_report_opts, cmd_report},
    {"bench", "moe|adamw|attention|gemm [options]",
     "Benchmark the MoE layer, the AdamW update, attention or a GEMM in bf16 and fp8 on this GPU "
     "(bench/run-moe, bench/run-adamw, bench/run-gemm: next to PyTorch).",
#ifdef GPU_COMMANDS_HERE
     NULL,
#else
     "the benchmarks run on a GPU: this build has no executor",
#endif
     cmd_bench_opts, cmd_bench},
    {"model", "list | show MODEL [options]",
     "Show a model's parameters, FLOPs per token, bytes per block and activations.", NULL,
     cmd_model_opts, cmd_model},
    {"check", "[options] FILE...", "Validate moeplan JSON files (file:line:col errors).", NULL,
     cmd_check_opts, cmd_check},
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
    if (v.cuda_driver)
        snprintf(driver, sizeof driver, "%d.%d", v.cuda_driver / 1000, (v.cuda_driver % 1000) / 10);
    else
        snprintf(driver, sizeof driver, "none found");
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
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "cuDNN");
    if (v.cudnn_compiled)
        rpt_table_cell(t, NULL, "%d.%d.%d (built with %d.%d.%d; run's attention by default)",
                       v.cudnn_runtime / 10000, (v.cudnn_runtime % 10000) / 100,
                       v.cudnn_runtime % 100, v.cudnn_compiled / 10000,
                       (v.cudnn_compiled % 10000) / 100, v.cudnn_compiled % 100);
    else
        rpt_table_cell(t, NULL,
                       "not in this build (MOEPLAN_CUDNN=OFF or none found): attention "
                       "by moeplan's own kernel");
#else
    static const char *const gpu_libs[] = {"CUDA runtime", "cuBLAS", "NCCL", "cuDNN"};
    for (int i = 0; i < 4; i++) {
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
#ifdef MOEPLAN_CMOCKA_VERSION /* a build with its tests */
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "cmocka");
    rpt_table_cell(t, NULL, "%s (tests only)", MOEPLAN_CMOCKA_VERSION);
#endif
    rpt_table_print(t, stdout);
    rpt_table_destroy(t);
}

/* Every option of every command, one a line: command, option, its value's name, and what it
 * names (cli_role): "out-file", "out-dir", "out-either", or "-". For scripts and tests (the
 * hostile-path tests take every output option from here). */
static void print_options(void)
{
    static const char *const role[] = {"-", "out-file", "out-dir", "out-either", "repeatable"};
    for (int c = 0; c < NCOMMANDS; c++)
        for (const struct cli_opt *o = commands[c].opts; o && o->name; o++)
            printf("%s\t--%s\t%s\t%s\n", commands[c].name, o->name, o->arg ? o->arg : "-",
                   role[o->role]);
}

static void print_help(FILE *out)
{
    fprintf(out, "usage: moeplan [--quiet|--verbose] <command> [options]\n"
                 "       moeplan --version | --help | --list-options\n\n"
                 "Plan and run dropless Mixture-of-Experts training on NVIDIA GPU clusters.\n\n"
                 "commands:\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s%s\n", commands[i].name, commands[i].summary,
                commands[i].missing ? " (needs a CUDA build)" : "");
    fprintf(out, "\n'moeplan <command> --help' shows a command's options.\n\nexit codes:\n");
    size_t n;
    const struct moe_exit_code *codes = moe_exit_codes(&n);
    for (size_t i = 0; i < n; i++) fprintf(out, "  %-6s %s\n", codes[i].code, codes[i].meaning);
}

int main(int argc, char **argv)
{
    struct cli cli = {.cmd = NULL, .argv = argv};
    moe_log_init(&cli.log, MOE_LOG_INFO);
    const char *data = getenv("MOEPLAN_DATA_DIR");
    snprintf(cli.data_dir, sizeof cli.data_dir, "%s", data && *data ? data : MOEPLAN_DATA_DIR);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            int rc = cli_gpu_exec(&cli); /* the CUDA libraries' versions are the GPU part's */
            if (rc >= 0) return rc;
            print_version();
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--list-options") == 0) {
            print_options();
            return 0;
        }
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0)
            cli.log.level = MOE_LOG_ERROR;
        else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0)
            cli.log.level = MOE_LOG_DEBUG;
        else
            return cli_usage(NULL, "unknown option '%s'", argv[i]);
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
        if (strcmp(argv[i], commands[c].name) == 0) {
            cli.cmd = commands[c].name;
            return commands[c].run(&cli, &commands[c], argc - i, argv + i);
        }
    return cli_usage(NULL, "unknown command '%s'", argv[i]);
}
