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

#define MAX_ROWS 256
#define NCOLS 24

enum {
    C_ID,
    C_CONTAINER,
    C_MODEL,
    C_CLUSTER,
    C_GPUS,
    C_PRECISION,
    C_GBS,
    C_MBS,
    C_SEQ,
    C_TP,
    C_PP,
    C_CP,
    C_VPP,
    C_EP,
    C_RECOMPUTE,
    C_PP_LAYOUT,
    C_MTP,
    C_DISPATCHER,
    C_GRAD_REDUCE,
    C_MOMENTS,
    C_TOKENS,
    C_TFLOPS,
    C_CONF,
    C_FLAGS
};

struct row {
    char *col[NCOLS];
};

struct outcome {
    int code;
    bool fits;
    double tokens, tflops, mem[8], capacity;
    char err[256];
};

static char *text;

static int load_rows(struct row *rows)
{
    char path[1024];
    size_t n;
    text = slurp_all(moe_test_src(path, sizeof path, "tests/data/published/mb-runs.tsv"), &n);
    assert_non_null(text);
    int nrows = 0;
    bool header = true;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        if (header) { /* the column names, checked against the order above */
            assert_true(strncmp(line, "id\tcontainer\tmodel\tcluster\tgpus", 31) == 0);
            header = false;
            continue;
        }
        assert_true(nrows < MAX_ROWS);
        struct row *r = &rows[nrows++];
        int c = 0;
        for (char *p = line; c < NCOLS; c++) {
            r->col[c] = p;
            char *tab = strchr(p, '\t');
            if (!tab) break;
            *tab = '\0';
            p = tab + 1;
        }
        if (c != NCOLS - 1) fail_msg("%s: %d columns, not %d", r->col[0], c + 1, NCOLS);
    }
    return nrows;
}

/* The row's prediction: `moeplan predict` with its layout, recipe and balanced routing. */
static void predict(const struct row *r, struct outcome *o)
{
    static struct result res;
    char **c = (char **)r->col, layout[768], json_path[1100];
    int gpus = atoi(c[C_GPUS]), tp = atoi(c[C_TP]), pp = atoi(c[C_PP]), cp = atoi(c[C_CP]);
    int n = snprintf(layout, sizeof layout,
                     "tp=%s,cp=%s,pp=%s,vpp=%s,ep=%s,dp=%d,zero=1,mbs=%s,gbs=%s,precision=%s,"
                     "recompute=%s,dispatcher=%s,grad_reduce=%s,moments=%s",
                     c[C_TP], c[C_CP], c[C_PP], c[C_VPP], c[C_EP], gpus / (tp * pp * cp), c[C_MBS],
                     c[C_GBS], c[C_PRECISION], c[C_RECOMPUTE], c[C_DISPATCHER], c[C_GRAD_REDUCE],
                     c[C_MOMENTS]);
    if (strcmp(c[C_MTP], "-")) n += snprintf(layout + n, sizeof layout - n, ",mtp=%s", c[C_MTP]);
    if (strcmp(c[C_PP_LAYOUT], "-"))
        snprintf(layout + n, sizeof layout - n, ",pp_layout=%s", c[C_PP_LAYOUT]);
    snprintf(json_path, sizeof json_path, "%s", cli_tmp("published.json"));
    const char *args[] = {"predict", "--model",   c[C_MODEL], "--cluster", c[C_CLUSTER], "--gpus",
                          c[C_GPUS], "--seq-len", c[C_SEQ],   "--routing", "balanced",   "--layout",
                          layout,    "--json",    json_path,  NULL};
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
    static struct row rows[MAX_ROWS];
    int n = load_rows(rows), bad = 0;
    assert_true(n >= 100);
    for (int i = 0; i < n; i++) {
        struct outcome o;
        predict(&rows[i], &o);
        if (o.code == 0 && o.fits) continue;
        bad++;
        fprintf(stderr, "%s (%s, %s, %s GPUs): exit %d, %s; %s\n", rows[i].col[C_ID],
                rows[i].col[C_MODEL], rows[i].col[C_CLUSTER], rows[i].col[C_GPUS], o.code,
                o.fits ? "fits" : "does not fit", o.err);
    }
    printf("%d published runs predicted: %d accepted and fitting, %d refused or not fitting\n", n,
           n - bad, bad);
    free(text);
    if (bad) fail_msg("%d of %d published runs refused or not fitting", bad, n);
}

static int write_table(const char *file)
{
    static struct row rows[MAX_ROWS];
    int n = load_rows(rows);
    FILE *f = fopen(file, "w");
    if (!f) return 1;
    fprintf(f, "| run | container | model | cluster | GPUs | precision | tp/pp/vpp/ep | mbs/gbs | "
               "recompute | published tok/s/GPU | predicted | predicted / published | published "
               "TFLOPS/GPU | predicted (Megatron's count) | memory GiB (W/G/O/A) | of GiB |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        char **c = rows[i].col;
        struct outcome o;
        predict(&rows[i], &o);
        double pub = atof(c[C_TOKENS]), G = 1024.0 * 1024 * 1024;
        fprintf(f, "| %s%s | %s | %s | %s | %s | %s | %s/%s/%s/%s | %s/%s | %s | %.0f | ", c[C_ID],
                strcmp(c[C_CONF], "A") ? " (B)" : "", c[C_CONTAINER], c[C_MODEL], c[C_CLUSTER],
                c[C_GPUS], c[C_PRECISION], c[C_TP], c[C_PP], c[C_VPP], c[C_EP], c[C_MBS], c[C_GBS],
                c[C_RECOMPUTE], pub);
        if (o.code != 0 && o.code != 4) {
            fprintf(f, "refused (exit %d) | | %s | | | |\n", o.code, c[C_TFLOPS]);
            continue;
        }
        fprintf(f, "%.0f | %.2f | %s | %.0f | %.1f%s (%.1f/%.1f/%.1f/%.1f) | %.1f |\n", o.tokens,
                pub > 0 ? o.tokens / pub : 0.0, c[C_TFLOPS], o.tflops, o.mem[6] / G,
                o.fits ? "" : " **over**", o.mem[0] / G, o.mem[1] / G, o.mem[2] / G, o.mem[3] / G,
                o.capacity / G);
    }
    free(text);
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
