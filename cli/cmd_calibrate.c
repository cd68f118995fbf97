/*
 * cmd_calibrate.c: `moeplan calibrate`: on a GPU, the measurements (cmd_validate.c, CUDA builds)
 * fitted into a profile; anywhere, `--refit PROFILE` fits a profile's kept measurements again
 * (planner/calib_fit.c). One GPU cannot measure NVLink or the network: the profile names those
 * values as datasheet defaults. `--published FILE --stack NAME --cluster C` fits a stack profile
 * to published runs instead (planner/published.c): first every system of the stack's containers
 * together, then the cluster's own rows pulled towards that shared fit.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan.h"

enum {
    OPT_QUICK = 1,
    OPT_CAL,
    OPT_CLUSTER,
    OPT_STEPS,
    OPT_REFIT,
    OPT_PUBLISHED,
    OPT_STACK,
    OPT_OUT = 'o'
};

const struct cli_opt cmd_calibrate_opts[] = {
    {"output", required_argument, OPT_OUT, "FILE", "write the profile here (calibration.json)"},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer shapes and steps (about a minute)"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "the cluster this GPU belongs to (h200-vm)"},
    {"refit", required_argument, OPT_REFIT, "PROFILE",
     "no GPU needed: fit again the measurements a profile keeps (after a change of the model)"},
    {"published", required_argument, OPT_PUBLISHED, "FILE",
     "no GPU needed: fit a stack profile for --cluster to published runs (their format: "
     "tests/data/published/mb-runs.tsv)"},
    {"stack", required_argument, OPT_STACK, "NAME",
     "with --published: the software stack, e.g. megatron-26.04 (rows of containers 26.04*)"},
    {NULL, 0, 0, NULL, NULL},
};

static int calibrate(struct cli *cli, const struct cli_cmd *cmd, const char *out, bool quick,
                     const char *cluster, const char *refit)
{
    struct moe_error err;
    struct topo_cluster cl;
    struct plan_calib_data *d = calloc(1, sizeof *d);
    char mdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    enum moe_status st = d ? cli_cluster_load(cli, cluster, NULL, &cl, NULL, &err)
                           : moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK && refit) {
        printf("moeplan calibrate --refit %s: the measurements kept there, fitted again\n", refit);
        st = plan_calib_data_load(refit, d, &err);
    } else if (st == MOE_OK) {
#ifdef MOEPLAN_HAVE_EXECUTOR
        st = cli_calibrate_measure(cli, &cl, quick, d, &err);
#else
        (void)quick;
        st = moe_error_set(&err, MOE_ERR_UNSUPPORTED,
                           "calibrate needs a CUDA build to measure a GPU; --refit PROFILE fits "
                           "a profile's measurements again in this build");
#endif
    }
    if (st == MOE_OK && !cli_output_ok(cmd, "-o", out)) {
        free(d);
        return 2;
    }
    if (st == MOE_OK)
        st = plan_calib_fit_save(d, &cl, mdir,
                                 refit      ? "moeplan calibrate --refit"
                                 : d->quick ? "moeplan calibrate --quick"
                                            : "moeplan calibrate",
                                 out, stdout, &err);
    free(d);
    if (st != MOE_OK) return cli_fail(cli, &err);
    printf("profile written to %s (NVLink, network and fp8 values: datasheet defaults)\n", out);
    return 0;
}

/* A stack profile from published runs: the trusted rows of the stack's containers, fitted over
 * every system (pulled lightly towards the datasheet), then the cluster's own rows (pulled
 * towards that shared fit, since a system has a handful of rows). */
#define SHARED_PRIOR 0.02
#define SYSTEM_PRIOR 0.2
static int calibrate_published(struct cli *cli, const struct cli_cmd *cmd, const char *file,
                               const char *stack, const char *cluster, const char *out)
{
    struct moe_error err;
    const char *dash = strrchr(stack, '-'), *gen = dash ? dash + 1 : stack;
    if (!gen[0])
        return cli_usage(cmd, "--stack %s: name a container generation (megatron-26.04)", stack);
    if (!cli_output_ok(cmd, "-o", out)) return 2;
    struct plan_published *runs = calloc(PLAN_PUBLISHED_MAX, sizeof *runs);
    struct plan_fit_row *rows = calloc(PLAN_PUBLISHED_MAX, sizeof *rows);
    double *pred = calloc(PLAN_PUBLISHED_MAX, sizeof *pred);
    int n = 0, kept = 0, own = 0;
    enum moe_status st = runs && rows && pred
                             ? plan_published_load(file, runs, PLAN_PUBLISHED_MAX, &n, &err)
                             : moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; st == MOE_OK && i < n; i++) /* the stack's trusted, dropless rows */
        if (!strncmp(runs[i].container, gen, strlen(gen)) && runs[i].trusted &&
            !strstr(runs[i].flags, "tokendrop"))
            runs[kept++] = runs[i];
    char mdir[MOE_PATH_MAX], tdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    cli_data_path(cli, "topologies", tdir, sizeof tdir);
    if (st == MOE_OK && kept == 0)
        st = moe_error_set(&err, MOE_ERR_INPUT, "%s: no trusted row of containers %s*", file, gen);
    if (st == MOE_OK) st = plan_fit_rows(runs, kept, mdir, tdir, rows, &err);
    /* the cluster's rows first: they are the second fit's */
    for (int i = 0; st == MOE_OK && i < kept; i++)
        if (!strcmp(runs[i].cluster, cluster)) {
            struct plan_fit_row t = rows[own];
            rows[own] = rows[i], rows[i] = t;
            own++;
        }
    if (st == MOE_OK && own == 0)
        st = moe_error_set(&err, MOE_ERR_INPUT, "%s: no trusted row of %s in containers %s*", file,
                           cluster, gen);
    struct cost_calibration datasheet, shared, fitted;
    if (st == MOE_OK) cost_calibration_defaults(&datasheet, &rows[0].cluster.gpu);
    unsigned all = (1u << plan_fit_nparams) - 1;
    double rms_shared = st == MOE_OK ? plan_fit_published(rows, kept, &datasheet, all, &datasheet,
                                                          SHARED_PRIOR, &shared, pred, &err)
                                     : -1.0;
    double rms = rms_shared >= 0 ? plan_fit_published(rows, own, &shared, all, &shared,
                                                      SYSTEM_PRIOR, &fitted, pred, &err)
                                 : -1.0;
    if (st == MOE_OK && rms < 0) st = err.status;
    if (st == MOE_OK) {
        printf("stack %s: %d trusted rows of containers %s* (%d systems' runs), %d of them on %s\n",
               stack, kept, gen, kept, own, cluster);
        printf("shared fit over every system: rms log error %.3f\n", rms_shared);
        printf("%s's fit: rms log error %.3f\n", cluster, rms);
        printf("%-10s %-10s %-18s %12s %12s %8s\n", "run", "container", "model", "published_ms",
               "predicted_ms", "error");
        for (int i = 0; i < own; i++)
            printf("%-10s %-10s %-18s %12.1f %12.1f %+7.1f%%\n", rows[i].run->id,
                   rows[i].run->container, rows[i].run->model, rows[i].step_us / 1e3, pred[i] / 1e3,
                   100.0 * (pred[i] / rows[i].step_us - 1.0));
        json_t *meta = json_object(), *ids = json_array(), *fit = json_object();
        for (int i = 0; i < own; i++) json_array_append_new(ids, json_string(rows[i].run->id));
        json_object_set_new(meta, "gpu", json_string(rows[0].cluster.gpu.name));
        json_object_set_new(meta, "stack", json_string(stack));
        json_object_set_new(
            fit, "method",
            json_string("moeplan calibrate --published: least squares of log(predicted / published "
                        "step), bounded; every system's rows first, then this cluster's, pulled "
                        "towards that shared fit"));
        json_object_set_new(fit, "published", json_string(file));
        json_object_set_new(fit, "cluster", json_string(cluster));
        json_object_set_new(fit, "rows", ids);
        json_object_set_new(fit, "rms_log_error", json_real(rms));
        json_object_set_new(fit, "shared_rows", json_integer(kept));
        json_object_set_new(fit, "shared_rms_log_error", json_real(rms_shared));
        json_object_set_new(meta, "fit", fit);
        st = cost_calibration_write(&fitted, meta, out, &err);
        json_decref(meta);
    }
    free(runs);
    free(rows);
    free(pred);
    if (st != MOE_OK) return cli_fail(cli, &err);
    printf("profile written to %s\n", out);
    return 0;
}

int cmd_calibrate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *out = "calibration.json", *cluster = NULL, *refit = NULL, *published = NULL,
               *stack = NULL;
    bool quick = false;
    for (int i = 0; i < nargs; i++) {
        if (args[i].val == OPT_OUT) out = args[i].value;
        if (args[i].val == OPT_QUICK) quick = true;
        if (args[i].val == OPT_CLUSTER) cluster = args[i].value;
        if (args[i].val == OPT_REFIT) refit = args[i].value;
        if (args[i].val == OPT_PUBLISHED) published = args[i].value;
        if (args[i].val == OPT_STACK) stack = args[i].value;
    }
    if (optind != argc) return cli_usage(cmd, "no operands");
    if (published && (!stack || !cluster || refit || quick))
        return cli_usage(cmd, "--published needs --stack and --cluster (and no --refit, --quick)");
    if (stack && !published) return cli_usage(cmd, "--stack goes with --published");
    if (published) return calibrate_published(cli, cmd, published, stack, cluster, out);
    return calibrate(cli, cmd, out, quick, cluster ? cluster : "h200-vm", refit);
}
