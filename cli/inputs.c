/*
 * inputs.c: what the planner commands (predict, plan) share: model, cluster, calibration and
 * routing from their options, loaded and validated once.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The stack profile shipped for a GPU: topologies/calibration/stacks/STACK/GPU.json (the GPU's
 * name in lower case), STACK `prefer` when it has one, else the greatest name that has one; ""
 * when none does. */
static void stack_profile(const struct cli *cli, const char *gpu, const char *prefer, char *out,
                          size_t cap)
{
    char dir[MOE_PATH_MAX], name[64], best[256] = "";
    cli_gpu_file_name(gpu, name, sizeof name);
    out[0] = '\0';
    cli_data_path(cli, "topologies/calibration/stacks", dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        char path[2 * MOE_PATH_MAX];
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len >= sizeof best) continue;
        int k = snprintf(path, sizeof path, "%s/%s/%s.json", dir, e->d_name, name);
        if (k < 0 || (size_t)k >= cap || (size_t)k >= sizeof path) continue;
        if (!moe_file_is_regular(path)) continue;
        if (prefer && !strcmp(e->d_name, prefer)) {
            memcpy(out, path, (size_t)k + 1);
            break;
        }
        if (strcmp(e->d_name, best) > 0) {
            memcpy(best, e->d_name, len + 1);
            memcpy(out, path, (size_t)k + 1);
        }
    }
    closedir(d);
}

enum moe_status cli_cluster_load(const struct cli *cli, const char *name, const char *cal_file,
                                 const char *stack, struct topo_cluster *cl,
                                 struct cost_calibration *cal, struct moe_error *err)
{
    char dir[MOE_PATH_MAX];
    cli_data_path(cli, "topologies", dir, sizeof dir);
    enum moe_status st = topo_cluster_resolve(cl, name, dir, err);
    if (st != MOE_OK || !cal) return st;
    cost_calibration_defaults(cal, &cl->gpu);
    if (cal_file && !strcmp(cal_file, "datasheet")) return MOE_OK;
    if (cal_file) {
        st = cost_calibration_load(cal, cal_file, err);
        if (st == MOE_OK && !cost_calibration_gpu_is(cal->gpu, cl->gpu.name))
            st = moe_error_set_at(err, MOE_ERR_INPUT, cal_file, 0, 0,
                                  "a profile of the %s; %s's GPU is the %s: calibrate on that "
                                  "GPU, or name one of its profiles",
                                  cal->gpu, cl->name, cl->gpu.name);
        return st;
    }
    /* no profile named: the newest stack profile fitted on published runs of this GPU */
    char path[MOE_PATH_MAX];
    stack_profile(cli, cl->gpu.name, stack, path, sizeof path);
    if (!path[0]) return MOE_OK;
    st = cost_calibration_load(cal, path, err);
    /* a shipped profile is named as the README and the repository name it
     * (topologies/calibration/stacks/...), wherever moeplan's data folder is */
    size_t d = strlen(cli->data_dir);
    char *at = strstr(cal->source, cli->data_dir);
    if (st == MOE_OK && at && at[d] == '/') memmove(at, at + d + 1, strlen(at + d + 1) + 1);
    return st;
}

enum moe_status cli_gpu_cluster_load(const struct cli *cli, const char *gpu, const char *named,
                                     const char *cal_file, struct topo_cluster *cl,
                                     struct cost_calibration *cal, struct moe_error *err)
{
    static const struct {
        const char *gpu, *cluster;
    } shipped[] = {{"H200", "h200-vm"}, {"H100", "hgx-h100-x128"}};
    if (!gpu && cal && cal_file && strcmp(cal_file, "datasheet")) { /* the profile's own GPU */
        cost_calibration_defaults(cal, NULL);
        enum moe_status st = cost_calibration_load(cal, cal_file, err);
        if (st != MOE_OK) return st;
        gpu = cal->gpu;
    }
    if (!gpu) gpu = "";
    const char *name = named;
    for (size_t i = 0; !name && gpu[0] && i < sizeof shipped / sizeof shipped[0]; i++)
        if (cost_calibration_gpu_is(gpu, shipped[i].gpu)) name = shipped[i].cluster;
    if (!name && !gpu[0])
        return moe_error_set(err, MOE_ERR_USAGE,
                             "the profile names no GPU (\"gpu\": \"\"): --cluster names the "
                             "cluster it was measured on");
    if (!name)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "no shipped cluster has the %s: --cluster names the cluster (a "
                             "topology file with its GPU's spec) this GPU belongs to",
                             gpu);
    char measured[256]; /* a device's name, or cal->gpu, which is loaded again */
    snprintf(measured, sizeof measured, "%s", gpu);
    enum moe_status st = cli_cluster_load(cli, name, cal_file, NULL, cl, cal, err);
    gpu = measured;
    if (st == MOE_OK && !cost_calibration_gpu_is(gpu, cl->gpu.name))
        st = moe_error_set(err, MOE_ERR_INPUT,
                           "measured on the %s; %s's GPU is the %s, whose datasheet would scale "
                           "what is measured: --cluster names the cluster the %s belongs to",
                           gpu, cl->name, cl->gpu.name, gpu);
    return st;
}

void cli_input_opts_init(struct cli_input_opts *o)
{
    memset(o, 0, sizeof *o);
    o->seq = 4096;
    o->seed = 1;
}

int cli_input_arg(const struct cli_cmd *cmd, const struct cli_arg *a, struct cli_input_opts *o)
{
    uint64_t v;
    switch (a->val) {
    case CLI_IN_MODEL: o->model = a->value; return 1;
    case CLI_IN_CLUSTER: o->cluster = a->value; return 1;
    case CLI_IN_CAL: o->cal = a->value; return 1;
    case CLI_IN_ROUTING: o->routing = a->value; return 1;
    case CLI_IN_PRECISION: o->precision = a->value; return 1;
    case CLI_IN_GPUS: return cli_count(cmd, "gpus", a->value, 1, TOPO_MAX_GPUS, &o->gpus) ? 1 : -1;
    case CLI_IN_SEQ:
        o->seq_given = true;
        return cli_count(cmd, "seq-len", a->value, 2, COST_MAX_SEQ, &o->seq) ? 1 : -1;
    case CLI_IN_SEED: return cli_count(cmd, "seed", a->value, 0, UINT32_MAX, &o->seed) ? 1 : -1;
    case CLI_IN_LAYERS:
        if (!cli_count(cmd, "layers", a->value, 1, 100000, &v)) return -1;
        o->ov.layers = (int)v;
        return 1;
    case CLI_IN_EXPERTS:
        if (!cli_count(cmd, "experts", a->value, 1, 65536, &v)) return -1;
        o->ov.experts = (int)v;
        return 1;
    }
    return 0;
}

int cli_layout_agrees(const struct cli_cmd *cmd, const char *opt, const struct cost_layout *l,
                      uint64_t keys, struct cli_input_opts *o, uint64_t *gbs)
{
    if (keys & COST_KEY_BIT(COST_KEY_SEQ)) {
        if (o->seq_given && o->seq != (uint64_t)l->seq_len)
            return cli_usage(cmd, "%s seq=%d and --seq-len %llu disagree: give one of them", opt,
                             l->seq_len, (unsigned long long)o->seq);
        o->seq = (uint64_t)l->seq_len;
    }
    if (gbs && (keys & COST_KEY_BIT(COST_KEY_GBS))) {
        if (*gbs && *gbs != (uint64_t)l->gbs)
            return cli_usage(cmd, "%s gbs=%d and --gbs %llu disagree: give one of them", opt,
                             l->gbs, (unsigned long long)*gbs);
        *gbs = (uint64_t)l->gbs;
    }
    if (keys & COST_KEY_BIT(COST_KEY_PRECISION)) {
        if (o->precision) {
            struct cost_layout p = *l;
            char buf[64];
            snprintf(buf, sizeof buf, "precision=%s", o->precision);
            struct moe_error err;
            if (cost_layout_parse(&p, buf, &err) != MOE_OK)
                return cli_usage(cmd, "%s", err.message);
            if (p.precision != l->precision)
                return cli_usage(cmd,
                                 "%s precision=%s and --precision %s disagree: give one of them",
                                 opt, cost_precision_names[l->precision], o->precision);
        }
        o->precision = cost_precision_names[l->precision];
    }
    return -1;
}

int cli_load_inputs(struct cli *cli, const struct cli_cmd *cmd, const struct cli_input_opts *o,
                    struct cli_inputs *in)
{
    const char *model = o->model, *cluster = o->cluster, *cal_file = o->cal, *routing = o->routing;
    uint64_t gpus = o->gpus, seed = o->seed;
    const struct mdl_overrides *ov = &o->ov;
    struct moe_error err;
    char dir[MOE_PATH_MAX];
    if (!model) return cli_usage(cmd, "--model is required");
    if (!cluster) return cli_usage(cmd, "--cluster is required");
    memset(in, 0, sizeof *in);
    cli_data_path(cli, "model", dir, sizeof dir);
    if (mdl_model_resolve(&in->model, model, dir, &err) != MOE_OK ||
        mdl_model_override(&in->model, ov, &err) != MOE_OK)
        return cli_fail(cli, &err);
    if (cli_cluster_load(cli, cluster, cal_file, o->stack, &in->cluster, &in->cal, &err) != MOE_OK)
        return cli_fail(cli, &err);
    in->gpus = gpus ? (int)gpus : in->cluster.gpus_usable;
    if (in->gpus > in->cluster.gpus_usable)
        return cli_usage(cmd, "--gpus %d: %s has %d usable GPU%s", in->gpus, in->cluster.name,
                         in->cluster.gpus_usable, in->cluster.gpus_usable == 1 ? "" : "s");
    const struct mdl_moe *e = &in->model.moe;
    enum moe_status st = MOE_OK;
    /* balanced: Megatron's forced load balancing, every expert exactly top_k / experts of the
     * tokens; the cost model's uniform routing is that exact expectation already */
    if (!routing || !strcmp(routing, "uniform") || !strcmp(routing, "balanced")) {
        st = cost_routing_synthetic(&in->routing, COST_ROUTING_UNIFORM, 0, seed, e->experts,
                                    e->top_k, &err);
    } else if (!strncmp(routing, "zipf:", 5) || !strncmp(routing, "dirichlet:", 10)) {
        bool zipf = routing[0] == 'z';
        const char *num = strchr(routing, ':') + 1;
        double v;
        struct moe_error perr;
        if (moe_parse_size(num, &v, &perr) != MOE_OK)
            return cli_usage(cmd,
                             "--routing %s: a non-negative number after ':' (zipf:1.2, "
                             "dirichlet:0.5)",
                             routing);
        st = cost_routing_synthetic(&in->routing, zipf ? COST_ROUTING_ZIPF : COST_ROUTING_DIRICHLET,
                                    v, seed, e->experts, e->top_k, &err);
        if (st == MOE_ERR_INPUT) /* the option's value, not a file's */
            return cli_usage(cmd, "--routing %s: %s", routing, err.message);
    } else {
        st = cost_routing_load(&in->routing, routing, e->experts, e->top_k, &err);
    }
    if (st != MOE_OK) return cli_fail(cli, &err);
    in->have_routing = true;
    return -1;
}
