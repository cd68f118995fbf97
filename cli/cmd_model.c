/*
 * cmd_model.c: `moeplan model list` and `moeplan model show MODEL`: the derived numbers of a
 * model (parameters, FLOPs per token, bytes per layer, activations) as tables with units.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mdl.h"
#include "rpt.h"

enum { OPT_LAYERS = 1, OPT_EXPERTS, OPT_SEQ };

const struct cli_opt cmd_model_opts[] = {
    {"layers", required_argument, OPT_LAYERS, "N", "proxy: keep N blocks", CLI_PLAIN},
    {"experts", required_argument, OPT_EXPERTS, "E", "proxy: E routed experts, same shapes",
     CLI_PLAIN},
    {"seq-len", required_argument, OPT_SEQ, "S", "sequence length for attention FLOPs (4096)",
     CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

/* "671.03 B", "44.04 M", "7.17 K", "512". */
static void fmt_count(double v, char *buf, size_t cap)
{
    if (v >= 1e12)
        snprintf(buf, cap, "%.3f T", v / 1e12);
    else if (v >= 1e9)
        snprintf(buf, cap, "%.2f B", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, cap, "%.2f M", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, cap, "%.2f K", v / 1e3);
    else
        snprintf(buf, cap, "%.0f", v);
}

static int model_list(struct cli *cli)
{
    char dir[MOE_PATH_MAX];
    cli_data_path(cli, "model", dir, sizeof dir);
    struct moe_error err;
    char *names[256];
    int n = cli_list_json(dir, NULL, names, 256, &err);
    if (n < 0) return cli_fail(cli, &err);
    const char *headers[] = {"model", "layers", "experts", "top-k", "attention", "total", "active"};
    struct rpt_table *t = rpt_table_create(7, headers, "lrrrlrr");
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char path[MOE_PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct mdl_model m;
        if (mdl_model_load(&m, path, &err) != MOE_OK) {
            rc = cli_fail(cli, &err);
            continue;
        }
        struct mdl_params p;
        mdl_params_count(&m, &p);
        char tot[32], act[32];
        fmt_count(p.total, tot, sizeof tot);
        fmt_count(p.active, act, sizeof act);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", m.name);
        rpt_table_cell(t, NULL, "%d", m.layers);
        rpt_table_cell(t, NULL, "%d+%d", m.moe.experts, m.moe.shared_experts);
        rpt_table_cell(t, NULL, "%d", m.moe.top_k);
        rpt_table_cell(t, NULL, "%s", m.attn.type == MDL_ATTN_MLA ? "MLA" : "GQA");
        rpt_table_cell(t, NULL, "%s", tot);
        rpt_table_cell(t, NULL, "%s", act);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    return rc;
}

static void print_model_header(const struct mdl_model *m)
{
    const struct mdl_attention *a = &m->attn;
    const struct mdl_moe *e = &m->moe;
    int moe_layers = mdl_moe_layer_count(m);
    printf("%s: %d blocks (%d dense, %d MoE), hidden %d, vocab %d%s\n", m->name, m->layers,
           m->layers - moe_layers, moe_layers, m->hidden, m->vocab,
           m->tied_embeddings ? ", tied embeddings" : "");
    if (a->type == MDL_ATTN_MLA)
        printf("attention: MLA, %d heads, q_lora %d, kv_lora %d, qk %d+%d, v %d\n", a->heads,
               a->q_lora_rank, a->kv_lora_rank, a->qk_nope_head_dim, a->qk_rope_head_dim,
               a->v_head_dim);
    else
        printf("attention: GQA, %d heads, %d kv heads, head dim %d%s%s%s%s\n", a->heads,
               a->kv_heads, a->head_dim, a->qk_norm ? ", QK-norm" : "", a->bias ? ", biases" : "",
               a->sinks ? ", sinks" : "", a->sliding_window ? ", sliding window" : "");
    if (a->rope_scaling == MDL_ROPE_YARN)
        printf("RoPE: theta %g, YaRN x%g over %d positions (beta %g..%g, attention factor %.4g)\n",
               a->rope_theta, a->yarn.factor, a->yarn.original_max, a->yarn.beta_slow,
               a->yarn.beta_fast, a->yarn.attention_factor);
    if (a->sliding_window)
        printf("sliding window %d on %d of every %d blocks\n", a->sliding_window,
               a->sliding_every - 1 > 0 ? a->sliding_every - 1 : 1, a->sliding_every);
    if (a->nope_every)
        printf("no RoPE on every %d-th block%s\n", a->nope_every,
               a->temp_floor > 0 ? ", its queries' temperature tuned" : "");
    if (a->qk_l2_norm) printf("q and k normed without weights after RoPE (the RoPE blocks)\n");
    if (a->chunk_size)
        printf("the blocks with RoPE attend within chunks of %d tokens\n", a->chunk_size);
    printf("MoE: %d routed experts (ffn %d) + %d shared, top-%d, %s", e->experts, e->intermediate,
           e->shared_experts, e->top_k, e->scoring == MDL_SCORE_SIGMOID ? "sigmoid" : "softmax");
    if (e->n_group > 1) printf(", %d groups top-%d", e->n_group, e->topk_group);
    if (e->norm_topk) printf(", normalized");
    if (e->softmax_after_topk) printf(", softmax over the top-k");
    if (e->scaling != 1.0) printf(", scale %g", e->scaling);
    if (e->expert_bias) printf(", router and expert biases");
    if (e->activation == MDL_ACT_CLAMPED_SWIGLU)
        printf(", clamped SwiGLU (alpha %g, limit %g)", e->swiglu_alpha, e->swiglu_limit);
    printf("\n");
}

static int model_show(struct cli *cli, const char *spec, const struct mdl_overrides *ov,
                      int seq_len)
{
    struct mdl_model m;
    struct moe_error err;
    char dir[MOE_PATH_MAX];
    cli_data_path(cli, "model", dir, sizeof dir);
    if (mdl_model_resolve(&m, spec, dir, &err) != MOE_OK ||
        mdl_model_override(&m, ov, &err) != MOE_OK)
        return cli_fail(cli, &err);
    print_model_header(&m);

    struct mdl_params p;
    struct mdl_flops f;
    mdl_params_count(&m, &p);
    mdl_flops_per_token(&m, seq_len, &f);
    char a[32], b[32], c[32];
    fmt_count(p.total, a, sizeof a);
    fmt_count(p.active, b, sizeof b);
    fmt_count(p.active_no_embed, c, sizeof c);
    printf("parameters: %s total, %s active per token (%s without the input embedding)", a, b, c);
    if (p.mtp > 0) {
        fmt_count(p.mtp, a, sizeof a);
        printf(", MTP %s more", a);
    }
    char bytes[32];
    moe_format_bytes(2.0 * p.total, bytes, sizeof bytes);
    printf("\nweights in bf16: %s\n", bytes);
    printf("model FLOPs per token at sequence %d: %.2f GFLOP forward, %.2f GFLOP forward + "
           "backward\n\n",
           seq_len, f.fwd_total / 1e9, f.train_total / 1e9);

    int dense = -1, moe = -1;
    for (int l = m.layers - 1; l >= 0; l--) {
        if (mdl_layer_is_moe(&m, l))
            moe = l;
        else
            dense = l;
    }
    const char *h1[] = {"component", "params", "share", "fwd GFLOP/token", "share of FLOPs"};
    struct rpt_table *t = rpt_table_create(5, h1, "lrrrr");
    for (int k = 0; t && k < MDL_NCOMPONENTS; k++) {
        fmt_count(p.by_component[k], a, sizeof a);
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", mdl_component_names[k]);
        rpt_table_cell(t, NULL, "%s", k == MDL_ATTN_CORE ? "-" : a);
        rpt_table_cell(t, NULL, "%.1f%%", 100.0 * p.by_component[k] / p.total);
        rpt_table_cell(t, NULL, "%.3f", f.fwd[k] / 1e9);
        rpt_table_cell(t, NULL, "%.1f%%", 100.0 * f.fwd[k] / f.fwd_total);
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);

    /* One dense and one MoE block: bytes of weights (bf16) and of activations per token. */
    printf("\nper block (bf16 weights; activations kept for backward, per token, no recompute):\n");
    const char *h2[] = {"component", "dense block", "dense act/token", "MoE block",
                        "MoE act/token"};
    t = rpt_table_create(5, h2, "lrrrr");
    struct mdl_block_params bp[2];
    struct mdl_activations ba[2];
    memset(bp, 0, sizeof bp);
    memset(ba, 0, sizeof ba);
    int blocks[2] = {dense, moe};
    for (int i = 0; i < 2; i++)
        if (blocks[i] >= 0) {
            mdl_block_params(&m, blocks[i], &bp[i]);
            mdl_block_activations(&m, blocks[i], &ba[i]);
        }
    for (int k = MDL_ATTN_PROJ; t && k < MDL_LM_HEAD; k++) {
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", mdl_component_names[k]);
        for (int i = 0; i < 2; i++) {
            if (blocks[i] < 0) {
                rpt_table_cell(t, NULL, "-");
                rpt_table_cell(t, NULL, "-");
                continue;
            }
            moe_format_bytes(2.0 * bp[i].params[k], a, sizeof a);
            moe_format_bytes(ba[i].bytes[k], b, sizeof b);
            rpt_table_cell(t, NULL, "%s", a);
            rpt_table_cell(t, NULL, "%s", b);
        }
    }
    rpt_table_row(t, NULL);
    rpt_table_cell(t, NULL, "total");
    for (int i = 0; i < 2; i++) {
        double w = 0;
        for (int k = 0; k < MDL_NCOMPONENTS; k++) w += bp[i].params[k];
        moe_format_bytes(2.0 * w, a, sizeof a);
        moe_format_bytes(ba[i].total, b, sizeof b);
        rpt_table_cell(t, NULL, "%s", blocks[i] < 0 ? "-" : a);
        rpt_table_cell(t, NULL, "%s", blocks[i] < 0 ? "-" : b);
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    return 0;
}

int cmd_model(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct mdl_overrides ov = {0, 0};
    uint64_t v, seq = 4096;
    for (int i = 0; i < nargs; i++) {
        switch (args[i].val) {
        case OPT_LAYERS:
            if (!cli_count(cmd, "layers", args[i].value, 1, 100000, &v)) return 2;
            ov.layers = (int)v;
            break;
        case OPT_EXPERTS:
            if (!cli_count(cmd, "experts", args[i].value, 1, 65536, &v)) return 2;
            ov.experts = (int)v;
            break;
        case OPT_SEQ:
            if (!cli_count(cmd, "seq-len", args[i].value, 2, COST_MAX_SEQ, &seq)) return 2;
            break;
        }
    }
    if (optind >= argc) return cli_usage(cmd, "which action? list or show MODEL");
    const char *action = argv[optind];
    if (strcmp(action, "list") == 0) {
        if (optind + 1 != argc) return cli_usage(cmd, "'list' takes no operand");
        return model_list(cli);
    }
    if (strcmp(action, "show") == 0) {
        if (optind + 2 != argc) return cli_usage(cmd, "'show' takes one model");
        return model_show(cli, argv[optind + 1], &ov, (int)seq);
    }
    return cli_usage(cmd, "unknown action '%s' (list, show)", action);
}
