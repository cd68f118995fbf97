/*
 * cmd_predict.c: `moeplan predict`: one layout's step time by phase, throughput and memory.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan.h"
#include "rpt.h"

enum { OPT_LAYOUT = 1, OPT_JSON };

const struct cli_opt cmd_predict_opts[] = {
    CLI_INPUT_OPTIONS,
    {"layout", required_argument, OPT_LAYOUT, "K=V,...",
     "tp, cp, pp, vpp, ep, etp, dp, zero, mbs, gbs, recompute, dispatcher, overlap", CLI_PLAIN},
    {"json", required_argument, OPT_JSON, "FILE", "also write the prediction as JSON",
     CLI_OUT_FILE},
    {NULL, 0, 0, NULL, NULL, 0},
};

static void fmt_us(double us, char *buf, size_t cap)
{
    if (us == 0.0)
        snprintf(buf, cap, "-");
    else
        moe_format_time_us(us, buf, cap);
}

static void print_prediction(const struct cli_inputs *in, const struct cost_layout *l,
                             const struct cost_result *r, FILE *out)
{
    char lay[COST_LAYOUT_TEXT_MAX];
    cost_layout_format(l, lay, sizeof lay);
    fprintf(out, "%s on %d x %s of %s\nlayout: %s\nmicro-batches: %d; calibration: %s\n\n",
            in->model.name, in->gpus, in->cluster.gpu.name, in->cluster.name, lay, r->micro_batches,
            in->cal.source);
    const char *h[] = {"phase", "compute", "communication", "exposed", "share"};
    struct rpt_table *t = rpt_table_create(5, h, "lrrrr");
    char a[32], b[32], c[32];
    for (int p = 0; t && p < COST_NPHASES; p++) {
        if (p == COST_STEP) continue;
        if (r->compute_us[p] == 0 && r->comm_us[p] == 0 && r->exposed_us[p] == 0) continue;
        fmt_us(r->compute_us[p], a, sizeof a);
        fmt_us(r->comm_us[p], b, sizeof b);
        fmt_us(r->exposed_us[p], c, sizeof c);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", cost_phase_names[p]);
        rpt_table_cell(t, NULL, "%s", a);
        rpt_table_cell(t, NULL, "%s", b);
        rpt_table_cell(t, NULL, "%s", c);
        rpt_table_cell(t, NULL, "%.1f%%", 100.0 * r->exposed_us[p] / r->step_us);
    }
    fmt_us(r->step_us, c, sizeof c);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "step");
    rpt_table_cell(t, NULL, "%s", "");
    rpt_table_cell(t, NULL, "%s", "");
    rpt_table_cell(t, NULL, "%s", c);
    rpt_table_cell(t, NULL, "100.0%%");
    if (t) rpt_table_print(t, out);
    rpt_table_destroy(t);
    fprintf(out,
            "\nthroughput: %.0f tokens/s/GPU, %.1f model TFLOPS/GPU, MFU %.1f%% (of %.0f bf16 "
            "TFLOPS); bubble %.1f%%\n",
            r->tokens_per_s_per_gpu, r->model_tflops_per_gpu, 100 * r->mfu,
            in->cluster.gpu.bf16_tflops, 100 * r->bubble_fraction);
    fprintf(out,
            "  counted as Megatron-Bridge's tables count (no router; MTP layers and the padded "
            "vocabulary in): %.1f TFLOPS/GPU\n",
            r->megatron_tflops_per_gpu);
    if (l->ep > 1) {
        moe_format_bytes(r->dispatch_bytes_per_gpu, a, sizeof a);
        moe_format_bytes(r->dispatch_bytes_nodedup, b, sizeof b);
        fprintf(out,
                "experts: hottest EP rank has %.2fx the balanced load; dispatch sends %s per GPU "
                "per MoE layer and micro-batch (%s without dedup)\n",
                r->hottest_rank_load, a, b);
    }
    fprintf(out, "\nmemory per GPU (fullest pipeline rank):\n");
    const char *hm[] = {"category", "bytes"};
    t = rpt_table_create(2, hm, "lr");
    for (int k = 0; t && k < COST_NMEM; k++) {
        moe_format_bytes(r->memory_bytes[k], a, sizeof a);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", cost_mem_names[k]);
        rpt_table_cell(t, NULL, "%s", a);
    }
    moe_format_bytes(r->memory_total_bytes, a, sizeof a);
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "total");
    rpt_table_cell(t, NULL, "%s", a);
    if (t) rpt_table_print(t, out);
    rpt_table_destroy(t);
    moe_format_bytes(r->memory_capacity_bytes, b, sizeof b);
    moe_format_bytes(fabs(r->memory_capacity_bytes - r->memory_total_bytes), c, sizeof c);
    fprintf(out, "capacity %s after headroom; %s %s\n", b, r->fits ? "headroom left" : "short by",
            c);
}

int cmd_predict(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *layout = NULL, *json = NULL;
    struct cli_input_opts io;
    cli_input_opts_init(&io);
    for (int i = 0; i < nargs; i++) {
        int shared = cli_input_arg(cmd, &args[i], &io);
        if (shared < 0) return 2;
        if (args[i].val == OPT_LAYOUT) layout = args[i].value;
        if (args[i].val == OPT_JSON) json = args[i].value;
    }
    if (optind < argc) return cli_usage(cmd, "unexpected operand '%s'", argv[optind]);
    if (!layout) return cli_usage(cmd, "--layout is required (e.g. tp=1,pp=8,ep=64)");
    struct cli_inputs in;
    rc = cli_load_inputs(cli, cmd, &io, &in);
    if (rc >= 0) return rc;
    if (json && !cli_output_ok(cmd, "--json", json)) {
        cost_routing_free(&in.routing);
        return 2;
    }
    struct moe_error err;
    /* dp = 0 and gbs = 0: filled below from the GPUs unless the layout names them */
    struct cost_layout l;
    cost_layout_defaults(&l, (int)io.seq);
    l.dp = l.gbs = 0;
    l.mtp = in.model.mtp_layers;
    if (io.precision) {
        char buf[64];
        snprintf(buf, sizeof buf, "precision=%s", io.precision);
        if (cost_layout_parse(&l, buf, &err) != MOE_OK) return cli_usage(cmd, "%s", err.message);
    }
    uint64_t keys = 0;
    if (cost_layout_parse_keys(&l, layout, &keys, &err) != MOE_OK) {
        cost_routing_free(&in.routing);
        return cli_usage(cmd, "%s", err.message);
    }
    if ((rc = cli_layout_agrees(cmd, "--layout", &l, keys, &io, NULL)) >= 0) {
        cost_routing_free(&in.routing);
        return rc;
    }
    if (l.dp == 0) { /* divided one degree at a time: no product of huge degrees */
        long rest = (long)in.gpus / l.tp / l.cp / l.pp;
        l.dp = rest > 0 ? (int)rest : 1;
    }
    if (l.gbs == 0) {
        double g = (double)l.dp * l.mbs * 8;
        if (g > (double)(1 << 30)) {
            cost_routing_free(&in.routing);
            return cli_usage(cmd,
                             "--layout: dp x mbs x 8 = %.0f is too large a default global "
                             "batch: give gbs",
                             g);
        }
        l.gbs = (int)g;
    }
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, &in.model, &in.cluster, &in.cal, in.gpus);
    ctx.routing = &in.routing;
    struct cost_result r;
    enum moe_status st = cost_evaluate(&ctx, &l, &r, &err);
    cost_routing_free(&in.routing);
    if (st != MOE_OK) return cli_fail(cli, &err);
    print_prediction(&in, &l, &r, json && !strcmp(json, "-") ? stderr : stdout);
    if (json && plan_prediction_save(json, &in.model, &in.cluster, in.gpus, &in.cal, &l, &r,
                                     &err) != MOE_OK)
        return cli_fail(cli, &err);
    if (!r.fits) {
        moe_error_set(&err, MOE_ERR_INFEASIBLE, "the layout does not fit: %s", r.reason);
        return cli_fail(cli, &err);
    }
    return 0;
}
