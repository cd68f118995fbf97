/*
 * cmd_check.c: `moeplan check FILE...`: validate any moeplan file by its "schema".
 *
 * The file's own "schema" key decides which loader checks it, so one command covers every file
 * type, and the loaders' error reports (file:line:col) reach the user unchanged.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mdl.h"
#include "topo.h"
#include "plan.h"

enum { OPT_QUIET = 1 };

const struct cli_opt cmd_check_opts[] = {
    {"quiet", no_argument, OPT_QUIET, NULL, "print nothing on success", CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

/* A node XML: well-formed, accepted by hwloc, and what hwloc reads back from it. */
static enum moe_status check_xml(const char *file, char *summary, size_t cap, struct moe_error *err)
{
    struct topo_node n;
    enum moe_status st = topo_node_load_xml(&n, file, err);
    if (st != MOE_OK) return st;
    snprintf(summary, cap, "hwloc node: %d packages, %d cores, %d GPUs, %d NICs, %s", n.packages,
             n.cores, n.ngpus, n.nics,
             n.has_nvlink_matrix ? "NVLinkBandwidth matrix" : "no NVLink matrix");
    return MOE_OK;
}

/* A profile that keeps its measurements: what `calibrate --refit FILE` does with them (on its
 * default cluster), fitted and not written, so that check and refit accept the same files. */
static enum moe_status check_measurements(const struct cli *cli, const char *file,
                                          struct moe_error *err)
{
    struct plan_calib_data *d = calloc(1, sizeof *d);
    if (!d) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    struct topo_cluster cl;
    char mdir[MOE_PATH_MAX], *log_text = NULL;
    size_t log_len = 0;
    cli_data_path(cli, "model", mdir, sizeof mdir);
    FILE *log = open_memstream(&log_text, &log_len);
    enum moe_status st = log ? plan_calib_data_load(file, d, err)
                             : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) st = cli_cluster_load(cli, "h200-vm", NULL, NULL, &cl, NULL, err);
    if (st == MOE_OK) st = plan_calib_fit_save(d, &cl, mdir, "moeplan check", NULL, log, err);
    if (log) fclose(log);
    free(log_text);
    free(d);
    return st;
}

static enum moe_status check_file(const struct cli *cli, const char *file, char *summary,
                                  size_t cap, struct moe_error *err)
{
    size_t len = strlen(file);
    if (len > 4 && strcmp(file + len - 4, ".xml") == 0) return check_xml(file, summary, cap, err);
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
    if (strcmp(schema, TOPO_CLUSTER_SCHEMA) == 0) {
        char dir[MOE_PATH_MAX], gpus[MOE_PATH_MAX];
        cli_data_path(cli, "topologies", dir, sizeof dir);
        topo_gpus_file_for(file, dir, gpus, sizeof gpus);
        struct topo_cluster c;
        if ((st = topo_cluster_from_doc(&c, &doc, gpus, err)) != MOE_OK) goto cleanup;
        snprintf(summary, cap, "%s v%d: %s, %d x %s usable in %d NVLink domain%s", schema, version,
                 c.name, c.gpus_usable, c.gpu.name, c.domains, c.domains == 1 ? "" : "s");
        if (c.node_xml[0]) {
            struct topo_node n;
            if ((st = topo_node_load_xml(&n, c.node_xml, err)) != MOE_OK) goto cleanup;
            if (n.ngpus != c.gpus_per_node) {
                st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                      "the node XML %s has %d GPUs, the cluster says %d per node",
                                      c.node_xml, n.ngpus, c.gpus_per_node);
                goto cleanup;
            }
        }
        goto cleanup;
    }
    if (strcmp(schema, PLAN_SCHEMA) == 0) {
        st = plan_check_doc(&doc, summary, cap, err);
        goto cleanup;
    }
    if (strcmp(schema, TOPO_GPUS_SCHEMA) == 0) {
        struct topo_gpu_spec specs[64];
        int n = 0;
        if ((st = topo_gpus_load(file, specs, 64, &n, err)) != MOE_OK) goto cleanup;
        snprintf(summary, cap, "%s v%d: %d GPU specs", schema, version, n);
        goto cleanup;
    }
    if (strcmp(schema, COST_CALIBRATION_SCHEMA) == 0) {
        struct cost_calibration cal;
        cost_calibration_defaults(&cal, NULL);
        if ((st = cost_calibration_load(&cal, file, err)) != MOE_OK) goto cleanup;
        int fitted = 0;
        for (int p = 0; p < COST_NPHASES; p++)
            fitted += cal.phase_scale[p] != 1.0 || cal.phase_fixed_us[p] != 0.0 ||
                      cal.phase_floor_us[p] != 0.0;
        struct moe_jval root;
        if ((st = moe_jdoc_root(&doc, &root, err))) goto cleanup;
        if (moe_jval_has(&root, "measured") && (st = check_measurements(cli, file, err)) != MOE_OK)
            goto cleanup;
        snprintf(summary, cap,
                 "%s v%d: %s; gemm_eff %.3f, attention %.3f / %.3f, %d phase "
                 "corrections",
                 schema, version, cal.source, cal.gemm_eff, cal.attn_fwd_eff, cal.attn_bwd_eff,
                 fitted);
        goto cleanup;
    }
    if (!strcmp(schema, "moeplan.routing") || !strcmp(schema, COST_MEASURED_SCHEMA)) {
        /* read by the loaders that plan --routing and report use, for the experts and top-k the
         * file names (a routing's at its top, a run's under "routing") */
        struct moe_jval root, at;
        int64_t experts = 0, top_k = 0;
        bool measured = strcmp(schema, "moeplan.routing") != 0, have = true;
        if ((st = moe_jdoc_root(&doc, &root, err)) ||
            (measured && (st = moe_jval_object(&root, "routing", false, &at, &have, err))))
            goto cleanup;
        const struct moe_jval *r = measured ? &at : &root;
        if (have &&
            ((st = moe_jval_int(r, "experts", true, 0, 1, MDL_MAX_EXPERTS, &experts, err)) ||
             (st = moe_jval_int(r, "top_k", true, 0, 1, MDL_MAX_TOP_K, &top_k, err))))
            goto cleanup;
        if (measured) {
            struct plan_measured ms;
            if ((st = plan_measured_load(file, (int)experts, (int)top_k, &ms, err))) goto cleanup;
            snprintf(summary, cap, "%s v%d: a run of %s", schema, version, ms.model);
            plan_measured_free(&ms);
        } else {
            struct cost_routing rt;
            if ((st = cost_routing_load(&rt, file, (int)experts, (int)top_k, err))) goto cleanup;
            snprintf(summary, cap, "%s v%d: %lld experts, top-%lld, %d layer%s", schema, version,
                     (long long)experts, (long long)top_k, rt.layers, rt.layers == 1 ? "" : "s");
            cost_routing_free(&rt);
        }
        goto cleanup;
    }
    if (!strcmp(schema, PLAN_PREDICTION_SCHEMA)) { /* predict's output: no command reads it */
        snprintf(summary, cap,
                 "%s v%d: predict's output (JSON and schema checked; no moeplan "
                 "command reads it back)",
                 schema, version);
        goto cleanup;
    }
    struct moe_jval root;
    moe_jdoc_root(&doc, &root, NULL);
    st = moe_jval_error(&root, "schema", err, "unknown schema \"%s\" (known: %s, %s, %s, ...)",
                        schema, MDL_SCHEMA, TOPO_CLUSTER_SCHEMA, TOPO_GPUS_SCHEMA);
cleanup:
    moe_jdoc_free(&doc);
    return st;
}

int cmd_check(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    bool quiet = false;
    for (int i = 0; i < nargs; i++)
        if (args[i].val == OPT_QUIET) quiet = true;
    if (optind >= argc) return cli_usage(cmd, "no file to check");
    int worst = 0;
    for (int i = optind; i < argc; i++) {
        struct moe_error err;
        char summary[512];
        moe_error_clear(&err);
        enum moe_status st = check_file(cli, argv[i], summary, sizeof summary, &err);
        if (st != MOE_OK) {
            int code = cli_fail(cli, &err);
            if (worst == 0 || code > worst) worst = code;
        } else if (!quiet) {
            printf("%s: ok (%s)\n", argv[i], summary);
        }
    }
    return worst;
}
