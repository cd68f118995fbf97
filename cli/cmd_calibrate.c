/*
 * cmd_calibrate.c: `moeplan calibrate`: on a GPU, the measurements (cmd_validate.c, CUDA builds)
 * fitted into a profile; anywhere, `--refit PROFILE` fits a profile's kept measurements again
 * (planner/calib_fit.c). One GPU cannot measure NVLink or the network: the profile names those
 * values as datasheet defaults.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan.h"

enum { OPT_QUICK = 1, OPT_CAL, OPT_CLUSTER, OPT_STEPS, OPT_REFIT, OPT_OUT = 'o' };

const struct cli_opt cmd_calibrate_opts[] = {
    {"output", required_argument, OPT_OUT, "FILE", "write the profile here (calibration.json)"},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer shapes and steps (about a minute)"},
    {"cluster", required_argument, OPT_CLUSTER, "C", "the cluster this GPU belongs to (h200-vm)"},
    {"refit", required_argument, OPT_REFIT, "PROFILE",
     "no GPU needed: fit again the measurements a profile keeps (after a change of the model)"},
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
    return calibrate(cli, cmd, out, quick, cluster, refit);
}
