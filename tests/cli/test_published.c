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
        fprintf(f, "| %s%s | %s | %s | %s | %d | %s | %d/%d/%d/%d | %d/%d | %s | %.0f | ", r->id,
                r->trusted ? "" : " (B)", r->container, r->model, r->cluster, r->gpus, r->precision,
                r->tp, r->pp, r->vpp, r->ep, r->mbs, r->gbs, r->recompute, pub);
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
    };
    return cmocka_run_group_tests(tests, cli_scratch_setup, cli_scratch_teardown);
}
