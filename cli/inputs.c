/*
 * inputs.c: what the planner commands (predict, plan) share: model, cluster, calibration and
 * routing from their options, loaded and validated once.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_load_inputs(struct cli *cli, const struct cli_cmd *cmd, const char *model,
                       const char *cluster, uint64_t gpus, const char *cal_file,
                       const char *routing, uint64_t seed, const struct mdl_overrides *ov,
                       struct cli_inputs *in)
{
    struct moe_error err;
    char dir[MOE_PATH_MAX];
    if (!model) return cli_usage(cmd, "--model is required");
    if (!cluster) return cli_usage(cmd, "--cluster is required");
    memset(in, 0, sizeof *in);
    cli_data_path(cli, "model", dir, sizeof dir);
    if (mdl_model_resolve(&in->model, model, dir, &err) != MOE_OK ||
        mdl_model_override(&in->model, ov, &err) != MOE_OK)
        return cli_fail(cli, &err);
    cli_data_path(cli, "topologies", dir, sizeof dir);
    if (topo_cluster_resolve(&in->cluster, cluster, dir, &err) != MOE_OK) return cli_fail(cli, &err);
    in->gpus = gpus ? (int)gpus : in->cluster.gpus_usable;
    if (in->gpus > in->cluster.gpus_usable) {
        moe_error_set(&err, MOE_ERR_INFEASIBLE, "--gpus %d: %s has %d usable GPUs", in->gpus,
                      in->cluster.name, in->cluster.gpus_usable);
        return cli_fail(cli, &err);
    }
    cost_calibration_defaults(&in->cal, &in->cluster.gpu);
    if (cal_file && cost_calibration_load(&in->cal, cal_file, &err) != MOE_OK)
        return cli_fail(cli, &err);
    const struct mdl_moe *e = &in->model.moe;
    enum moe_status st = MOE_OK;
    if (!routing || !strcmp(routing, "uniform")) {
        st = cost_routing_synthetic(&in->routing, COST_ROUTING_UNIFORM, 0, seed, e->experts,
                                    e->top_k, &err);
    } else if (!strncmp(routing, "zipf:", 5) || !strncmp(routing, "dirichlet:", 10)) {
        bool zipf = routing[0] == 'z';
        char *end;
        double v = strtod(strchr(routing, ':') + 1, &end);
        if (*end) return cli_usage(cmd, "--routing %s: a number after ':'", routing);
        st = cost_routing_synthetic(&in->routing, zipf ? COST_ROUTING_ZIPF : COST_ROUTING_DIRICHLET,
                                    v, seed, e->experts, e->top_k, &err);
    } else {
        st = cost_routing_load(&in->routing, routing, e->experts, e->top_k, &err);
    }
    if (st != MOE_OK) return cli_fail(cli, &err);
    in->have_routing = true;
    return -1;
}

