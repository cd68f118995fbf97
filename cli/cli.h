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
};

struct cli_opt {
    const char *name;
    int has_arg; /* no_argument, required_argument */
    int val;
    const char *arg; /* shown in help: "FILE" */
    const char *help;
};

struct cli_cmd {
    const char *name;
    const char *args;    /* "[options] FILE..." */
    const char *summary;
    const char *planned; /* non-NULL: not built yet; what brings it */
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
int cli_usage(const struct cli_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Log an error report; returns its exit code. */
int cli_fail(struct cli *cli, const struct moe_error *err);
/* An option's value as a whole number in [min, max] (accepts 64K and the like); on a bad value
 * prints the usage error and returns false. */
bool cli_count(const struct cli_cmd *cmd, const char *opt, const char *value, uint64_t min,
               uint64_t max, uint64_t *out);
/* A file of the shipped data: data_dir/rel. */
void cli_data_path(const struct cli *cli, const char *rel, char *buf, size_t cap);

/* The inputs of the planner commands. */
#include "plan.h"
struct cli_inputs {
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_calibration cal;
    struct cost_routing routing;
    bool have_routing;
    int gpus;
};
/* Load --model (with --layers/--experts), --cluster (--gpus of it), --calibration and --routing
 * (uniform, zipf:S, dirichlet:A or a file; --seed). Returns -1 when loaded, else the exit code. */
int cli_load_inputs(struct cli *cli, const struct cli_cmd *cmd, const char *model,
                    const char *cluster, uint64_t gpus, const char *cal_file, const char *routing,
                    uint64_t seed, const struct mdl_overrides *ov, struct cli_inputs *in);

int cmd_check(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_model(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_topo(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_predict(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
int cmd_plan(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv);
extern const struct cli_opt cmd_check_opts[], cmd_model_opts[], cmd_topo_opts[],
    cmd_predict_opts[], cmd_plan_opts[];

#endif
