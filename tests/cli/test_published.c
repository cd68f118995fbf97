/*
 * test_published.c: every published Megatron-Bridge run of a model in model/
 * (tests/data/published/mb-runs.tsv) through `moeplan predict`, with its published layout and
 * recipe settings and forced-balanced routing: each must be accepted and predicted to fit, since
 * each ran. The speed is not judged here (the stack profiles that fit it come next).
 *
 *   test_published                 the test
 *   test_published --table FILE    writes the predicted-against-published table (Markdown), the
 *                                  one in reports/published/README.md (scripts/published-table)
 */
#include "cli_run.h"

#include <jansson.h>

#include "plan.h"

static struct plan_published rows[PLAN_PUBLISHED_MAX];

/* Every row of the data file, through the library's loader (plan_published_load). */
static int load_rows(void)
{
    char path[1024];
    struct moe_error err;
    int n;
    if (plan_published_load(moe_test_src(path, sizeof path, "tests/data/published/mb-runs.tsv"),
                            rows, PLAN_PUBLISHED_MAX, &n, &err) != MOE_OK)
        fail_msg("%s", err.message);
    return n;
}

struct outcome {
    int code;
    bool fits;
    double tokens, tflops, mem[8], capacity;
    char err[256];
};

/* The row's prediction: `moeplan predict` with its layout, recipe and balanced routing. */
static void predict(const struct plan_published *r, struct outcome *o)
{
    static struct result res;
    char layout[COST_LAYOUT_TEXT_MAX], json_path[1100], gpus[16], seq[16];
    plan_published_layout(r, layout, sizeof layout);
    snprintf(gpus, sizeof gpus, "%d", r->gpus);
    snprintf(seq, sizeof seq, "%d", r->seq);
    snprintf(json_path, sizeof json_path, "%s", cli_tmp("published.json"));
    /* the datasheet's efficiencies: what the table shows is the cost model before any profile */
    const char *args[] = {"predict",       "--model",   r->model,    "--cluster", r->cluster,
                          "--gpus",        gpus,        "--seq-len", seq,         "--routing",
                          "balanced",      "--layout",  layout,      "--json",    json_path,
                          "--calibration", "datasheet", NULL};
    run(&res, args);
    memset(o, 0, sizeof *o);
    o->code = res.code;
    snprintf(o->err, sizeof o->err, "%.255s", res.err);
    json_t *j = res.code == 0 || res.code == 4 ? json_load_file(json_path, 0, NULL) : NULL;
    if (!j) return;
    o->fits = json_is_true(json_object_get(j, "fits"));
    o->tokens = json_number_value(json_object_get(j, "tokens_per_s_per_gpu"));
    o->tflops = json_number_value(json_object_get(j, "megatron_tflops_per_gpu"));
    static const char *const mem[] = {"weights",          "grads",    "optimizer", "activations",
                                      "dispatch_buffers", "reserved", "total"};
    json_t *m = json_object_get(j, "memory_bytes");
    for (int k = 0; k < 7; k++) o->mem[k] = json_number_value(json_object_get(m, mem[k]));
    o->capacity = json_number_value(json_object_get(m, "capacity"));
    json_decref(j);
    unlink(json_path);
}

static void test_every_published_run_fits(void **state)
{
    (void)state;
    int n = load_rows(), bad = 0;
    assert_true(n >= 100);
    for (int i = 0; i < n; i++) {
        struct outcome o;
        predict(&rows[i], &o);
        if (o.code == 0 && o.fits) continue;
        bad++;
        fprintf(stderr, "%s (%s, %s, %d GPUs): exit %d, %s; %s\n", rows[i].id, rows[i].model,
                rows[i].cluster, rows[i].gpus, o.code, o.fits ? "fits" : "does not fit", o.err);
    }
    printf("%d published runs predicted: %d accepted and fitting, %d refused or not fitting\n", n,
           n - bad, bad);
    if (bad) fail_msg("%d of %d published runs refused or not fitting", bad, n);
}

/* NVIDIA's published JAX + Transformer Engine DeepSeek-V3 run on 128 GB300 (MaxText: FSDP 16 x
 * EP 8, per-device batch 6, MXFP8, the experts' first GEMM outputs offloaded to the host, the rest
 * of each layer rematerialized from its input; 1,068 TFLOPS/GPU published) in our keys: ZeRO-3
 * over the 128 GPUs with EP 8 (expert data parallelism 16), full recompute with moe_act offloaded
 * (MaxText's custom remat policy), gradients reduced in bf16 (XLA reduces the bf16 weight
 * gradients where they are made), no MTP. It must be accepted and fit; the speed is printed
 * beside the published figure, not judged (a held-out run: nothing is fitted on it). Its
 * `--emit maxtext` gives back the run's mesh and policy. */
static void test_jax_deepseek_v3_gb300(void **state)
{
    (void)state;
    static struct result res;
    const char *lay = "tp=1,ep=8,dp=128,zero=3,mbs=6,gbs=768,precision=mxfp8,recompute=full,"
                      "act_offload=moe_act,mtp=0,grad_reduce=bf16";
    char json_path[1100];
    snprintf(json_path, sizeof json_path, "%s", cli_tmp("jax.json"));
    const char *args[] = {"predict",  "--model",  "deepseek-v3", "--cluster", "gb300-nvl72-x16",
                          "--gpus",   "128",      "--seq-len",   "4096",      "--routing",
                          "balanced", "--layout", lay,           "--json",    json_path,
                          NULL};
    run(&res, args);
    if (res.code != 0) fail_msg("exit %d: %s", res.code, res.err);
    json_t *j = json_load_file(json_path, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "fits")));
    double tflops = json_number_value(json_object_get(j, "megatron_tflops_per_gpu"));
    double total = json_number_value(json_object_get(json_object_get(j, "memory_bytes"), "total"));
    json_decref(j);
    unlink(json_path);
    printf("JAX DeepSeek-V3 on 128 GB300: predicted %.0f TFLOPS/GPU (published 1068), "
           "%.1f GiB a GPU\n",
           tflops, total / 1073741824.0);
    assert_true(tflops > 0);
    const char *plan[] = {"plan",
                          "--model",
                          "deepseek-v3",
                          "--cluster",
                          "gb300-nvl72-x16",
                          "--gpus",
                          "128",
                          "--seq-len",
                          "4096",
                          "--gbs",
                          "768",
                          "--precision",
                          "mxfp8",
                          "--fix",
                          "tp=1,pp=1,ep=8,zero=3,mbs=6,recompute=full,act_offload=moe_act,mtp=0",
                          "--emit",
                          "maxtext",
                          NULL};
    run(&res, plan);
    if (res.code != 0) fail_msg("exit %d: %s", res.code, res.err);
    static const char *const want[] = {
        "ici_expert_parallelism: 8\n", "ici_fsdp_parallelism: 8\n", "dcn_fsdp_parallelism: 2\n",
        "per_device_batch_size: 6\n",  "remat_policy: custom\n",    "decoder_layer_input: device\n",
        "moe_mlpwi_0: offload\n",      "moe_mlpwi_1: offload\n",    "quantization: te_mxfp8\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(res.out, want[i])) fail_msg("--emit maxtext lacks %s:\n%s", want[i], res.out);
}

static int write_table(const char *file)
{
    int n = load_rows();
    FILE *f = fopen(file, "w");
    if (!f) return 1;
    fprintf(f, "| run | container | model | cluster | GPUs | precision | tp/pp/vpp/ep | mbs/gbs | "
               "recompute | published tok/s/GPU | predicted | predicted / published | published "
               "TFLOPS/GPU | predicted (Megatron's count) | memory GiB (W/G/O/A) | of GiB |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const struct plan_published *r = &rows[i];
        struct outcome o;
        predict(r, &o);
        double pub = r->tokens_per_s_gpu, G = 1024.0 * 1024 * 1024;
        fprintf(f, "| %s%s%s | %s | %s | %s | %d | %s | %d/%d/%d/%d | %d/%d | %s | %.0f | ", r->id,
                r->trusted ? "" : " (B)", r->unmodelled ? " (not fitted)" : "", r->container,
                r->model, r->cluster, r->gpus, r->precision, r->tp, r->pp, r->vpp, r->ep, r->mbs,
                r->gbs, r->recompute, pub);
        if (o.code != 0 && o.code != 4) {
            fprintf(f, "refused (exit %d) | | %.0f | | | |\n", o.code, r->tflops_gpu);
            continue;
        }
        fprintf(f, "%.0f | %.2f | %.0f | %.0f | %.1f%s (%.1f/%.1f/%.1f/%.1f) | %.1f |\n", o.tokens,
                o.tokens / pub, r->tflops_gpu, o.tflops, o.mem[6] / G, o.fits ? "" : " **over**",
                o.mem[0] / G, o.mem[1] / G, o.mem[2] / G, o.mem[3] / G, o.capacity / G);
    }
    return fclose(f) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--table")) {
        if (cli_scratch_setup(NULL)) return 1;
        int rc = write_table(argv[2]);
        cli_scratch_teardown(NULL);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_published_run_fits),
        cmocka_unit_test(test_jax_deepseek_v3_gb300),
    };
    return cmocka_run_group_tests(tests, cli_scratch_setup, cli_scratch_teardown);
}
