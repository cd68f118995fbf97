/*
 * cli.h: what the files of cli/ share (internal to cli/, not a module header).
 *
 * moeplan.c holds the subcommand table, option parsing and main(); each cmd_*.c implements
 * subcommands on top of the module headers. Commands return an exit code; only main() exits.
 */
#ifndef CLI_H
#define CLI_H

#include <getopt.h>

#include "moe_common.h"

struct cli {
    struct moe_log log;
    char data_dir[MOE_PATH_MAX]; /* shipped models and topologies: MOEPLAN_DATA_DIR or built-in */
    const char *cmd;             /* the subcommand running (its name, for the try-help line) */
    char **argv;                 /* the whole command line (cli_gpu_exec runs it again) */
};

/* What an option's value names, where it names a path that moeplan writes. cli_parse checks every
 * such value before the command runs (moe_output_check, moe_output_dir_check), and a "-" value of
 * CLI_OUT_FILE claims standard output (moe_stdout_claim). `moeplan --list-options` prints them:
 * the hostile-path tests find every output option there. */
enum cli_role {
    CLI_PLAIN = 0,  /* a value, or an input (inputs are checked by the one reader as they load) */
    CLI_OUT_FILE,   /* a file written: regular, atomic, "-" is standard output */
    CLI_OUT_DIR,    /* a folder written into (made if absent, one level) */
    CLI_OUT_EITHER, /* a file or a folder by the action (topo: discover a folder, generate a file) */
    CLI_REPEATABLE, /* a value the option may be given several times (report --compare); any
                     * other option with a value given twice is a usage error, never the last
                     * one silently winning */
};

struct cli_opt {
    const char *name;
    int has_arg; /* no_argument, required_argument */
    int val;
    const char *arg; /* shown in help: "FILE" */
    const char *help;
    enum cli_role role;
};

struct cli_cmd {
    const char *name;
    const char *args; /* "[options] FILE..." */
    const char *summary;
    const char *missing; /* non-NULL: not in this build (no CUDA); why */
    const struct cli_opt *opts;
    int (*run)(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
};

/* One parsed option, in command-line order. */
struct cli_arg {
    int val;
    const char *value;
};

#define CLI_MAX_ARGS 64

/* Parse a subcommand's argv. Returns -1 when parsing succeeded (options in `out`, operands from
 * argv[optind]), else the exit code to return (0 after --help, 2 after a usage error). */
int cli_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_arg *out, int *nout);
/* Print "moeplan: CMD: <message>" and the try-help line; returns exit code 2. */
int cli_usage(const struct cli_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Whether `path` may be written as the output of option `opt` (moe_output_check: not an input of
 * this command, a regular file; "-" is standard output); prints the usage error if not. cli_parse
 * checked it already; call it again after the inputs are loaded and before long work, to refuse
 * an output that is one of them. */
bool cli_output_ok(const struct cli_cmd *cmd, const char *opt, const char *path);
/* Draw into memory, then write the whole as one file (moe_file_write_atomic). */
typedef enum moe_status (*cli_draw_fn)(FILE *f, const void *arg, struct moe_error *err);
enum moe_status cli_write_drawn(const char *path, cli_draw_fn fn, const void *arg,
                                struct moe_error *err);
/* Where the GPU commands are a separate binary (moeplan-gpu, built beside moeplan with the
 * executor linked in, MOEPLAN_GPU_HELPER): run this command line there, in this process. Returns
 * only on failure (1, said), or -1 where this build has no such part. */
int cli_gpu_exec(struct cli *cli);
/* Log an error report; returns its exit code. A usage error (exit 2) is followed by the
 * try-help line, wherever it is found. */
int cli_fail(struct cli *cli, const struct moe_error *err);
/* An option's value as a whole number in [min, max] (accepts 64K and the like); on a bad value
 * prints the usage error and returns false. */
bool cli_count(const struct cli_cmd *cmd, const char *opt, const char *value, uint64_t min,
               uint64_t max, uint64_t *out);
/* A real number option in [min, max]; a usage error (and false) otherwise. */
bool cli_real(const struct cli_cmd *cmd, const char *opt, const char *value, double min, double max,
              double *out);
/* The *.json files of a folder (less `except`), sorted by name, strdup'd into names (cap of them;
 * the caller frees each). Returns their count, or -1 with err filled. */
int cli_list_json(const char *dir, const char *except, char **names, int cap,
                  struct moe_error *err);
/* A file of the shipped data: data_dir/rel. */
void cli_data_path(const struct cli *cli, const char *rel, char *buf, size_t cap);
/* A GPU's name as the shipped profiles name their files: in lower case (H100 -> h100) */
void cli_gpu_file_name(const char *gpu, char *buf, size_t cap);

/* The inputs of the planner commands. */
#include "plan.h"
/* A cluster by name or file, and with cal (not NULL) its GPU's calibration: the profile
 * cal_file ("datasheet": the datasheet defaults), else the stack profile shipped for the GPU
 * (`stack`'s when not NULL and shipped, else the newest). */
enum moe_status cli_cluster_load(const struct cli *cli, const char *name, const char *cal_file,
                                 const char *stack, struct topo_cluster *cl,
                                 struct cost_calibration *cal, struct moe_error *err);
/* The cluster of a GPU that calibrate, validate and bench measure (or a profile measured there,
 * for --refit): `named` when given, else the shipped cluster of that GPU (H200: h200-vm, H100:
 * hgx-h100-x128); refused where the cluster's GPU is another, whose datasheet would scale what
 * was measured. gpu NULL: the GPU the profile cal_file names. cal and cal_file as
 * cli_cluster_load's. */
enum moe_status cli_gpu_cluster_load(const struct cli *cli, const char *gpu, const char *named,
                                     const char *cal_file, struct topo_cluster *cl,
                                     struct cost_calibration *cal, struct moe_error *err);
struct cli_inputs {
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_calibration cal;
    struct cost_routing routing;
    bool have_routing;
    int gpus;
};
/* The options the planner commands share: their rows for an option table, their values, and
 * the parser of one of them. */
enum {
    CLI_IN_MODEL = 200,
    CLI_IN_CLUSTER,
    CLI_IN_GPUS,
    CLI_IN_SEQ,
    CLI_IN_PRECISION,
    CLI_IN_ROUTING,
    CLI_IN_SEED,
    CLI_IN_CAL,
    CLI_IN_LAYERS,
    CLI_IN_EXPERTS
};
#define CLI_INPUT_OPTIONS                                                                            \
    {"model",  required_argument, CLI_IN_MODEL, "M", "model name, model file or HF config.json",     \
     CLI_PLAIN},                                                                                     \
        {"cluster", required_argument, CLI_IN_CLUSTER, "C", "cluster name or file", CLI_PLAIN},      \
        {"gpus",                                                                                     \
         required_argument,                                                                          \
         CLI_IN_GPUS,                                                                                \
         "N",                                                                                        \
         "use the first N GPUs (default: all usable)",                                               \
         CLI_PLAIN},                                                                                 \
        {"seq-len", required_argument, CLI_IN_SEQ, "S", "sequence length (4096)", CLI_PLAIN},        \
        {"precision",                                                                                \
         required_argument,                                                                          \
         CLI_IN_PRECISION,                                                                           \
         "P",                                                                                        \
         "bf16 (default), fp8 (fp8cs), fp8block, mxfp8",                                             \
         CLI_PLAIN},                                                                                 \
        {"routing",                                                                                  \
         required_argument,                                                                          \
         CLI_IN_ROUTING,                                                                             \
         "R",                                                                                        \
         "uniform (default), balanced, zipf:S, dirichlet:ALPHA, or a routing/measured JSON "         \
         "file",                                                                                     \
         CLI_PLAIN},                                                                                 \
        {"seed", required_argument, CLI_IN_SEED, "N", "seed of a synthetic routing (1)", CLI_PLAIN}, \
        {"calibration",                                                                              \
         required_argument,                                                                          \
         CLI_IN_CAL,                                                                                 \
         "FILE",                                                                                     \
         "calibration profile; `datasheet` for none (default: the newest stack profile "             \
         "shipped for the GPU, else the datasheet)",                                                 \
         CLI_PLAIN},                                                                                 \
        {"layers", required_argument, CLI_IN_LAYERS, "N", "proxy: keep N blocks", CLI_PLAIN},        \
    {                                                                                                \
        "experts", required_argument, CLI_IN_EXPERTS, "E", "proxy: E routed experts, same shapes",   \
            CLI_PLAIN                                                                                \
    }

struct cli_input_opts {
    const char *model, *cluster, *cal, *routing, *precision;
    const char *stack; /* without --calibration: this stack's profile when one is shipped */
    uint64_t gpus, seq, seed;
    bool seq_given; /* --seq-len was on the command line (a layout's seq must agree with it) */
    struct mdl_overrides ov;
};
void cli_input_opts_init(struct cli_input_opts *o);
/* 1: `a` was a shared option (stored); 0: it is not one; -1: its value is bad (usage printed). */
int cli_input_arg(const struct cli_cmd *cmd, const struct cli_arg *a, struct cli_input_opts *o);
/* A layout's keys that the shared options also set (seq and --seq-len, precision and
 * --precision; with `gbs` not NULL, gbs and --gbs, where 0 is not given) must agree; where the
 * layout gives one, it becomes the option's value. `opt` names the layout's option in messages.
 * Returns -1 when they agree, else the exit code (a usage error printed). */
int cli_layout_agrees(const struct cli_cmd *cmd, const char *opt, const struct cost_layout *l,
                      uint64_t keys, struct cli_input_opts *o, uint64_t *gbs);
/* Load them: returns -1 when loaded, else the exit code. */
int cli_load_inputs(struct cli *cli, const struct cli_cmd *cmd, const struct cli_input_opts *o,
                    struct cli_inputs *in);

int cmd_check(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_model(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_topo(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_predict(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_plan(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_report(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_calibrate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
#ifdef MOEPLAN_HAVE_EXECUTOR
int cmd_run(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_bench(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_validate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
/* calibrate's measurements on this machine's GPU (cmd_validate.c), its cluster (cl) as
 * cli_gpu_cluster_load finds it */
struct plan_calib_data;
enum moe_status cli_calibrate_measure(struct cli *cli, const char *cluster, bool quick,
                                      struct topo_cluster *cl, struct plan_calib_data *d,
                                      struct moe_error *err);
#endif
/* every build has every command's options (cmd_run.c, cmd_bench.c and cmd_validate.c hold only
 * theirs without CUDA) */
extern const struct cli_opt cmd_check_opts[], cmd_model_opts[], cmd_topo_opts[], cmd_predict_opts[],
    cmd_plan_opts[], cmd_report_opts[], cmd_calibrate_opts[], cmd_run_opts[], cmd_bench_opts[],
    cmd_validate_opts[];

#endif
