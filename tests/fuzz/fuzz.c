/*
 * fuzz.c: libFuzzer harnesses for every file moeplan reads, one binary per FUZZ_TARGET:
 *
 *   model        a model file (moeplan.model)              mdl_model_from_doc
 *   hf           a Hugging Face config.json                mdl_model_from_hf
 *   cluster      a cluster (moeplan.cluster)               topo_cluster_from_doc
 *   plan         a plan: the validator, then the loader    plan_check_doc, plan_load
 *   routing      a routing or measured.json                cost_routing_load
 *   calibration  a calibration profile                     cost_calibration_load
 *   xml          a node's hwloc XML                        topo_node_load_xml
 *   published    a published-runs file, then the stack     plan_published_load, plan_fit_rows,
 *                fit of its first rows                     plan_fit_stack
 *   predict      option values and model sizes, through   mdl_model_override, cost_layout_parse,
 *                the cost model (what `moeplan predict     cost_routing_synthetic, cost_evaluate
 *                --experts E --layers L --layout ...` runs)
 *
 * Every input must give MOE_OK or an error report; the sanitizers (ASan, UBSan) and libFuzzer
 * catch any crash, leak, overflow or hang. Loaders that read a path get the input through a file
 * in /dev/shm (one per process). Built by scripts/fuzz with clang; the seed corpora are
 * tests/fuzz/corpus/TARGET/.
 */
#include "mdl.h"
#include "plan.h"
#include "topo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static __attribute__((unused)) const char *gpus_file(void)
{
    static char path[1024];
    if (!path[0]) snprintf(path, sizeof path, "%s/topologies/gpus.json", MOEPLAN_SOURCE_DIR);
    return path;
}

/* The input as a file; NULL when it cannot be written. */
static __attribute__((unused)) const char *as_file(const uint8_t *data, size_t size,
                                                   const char *ext)
{
    static char path[128];
    snprintf(path, sizeof path, "/dev/shm/moeplan-fuzz-%d.%s", (int)getpid(), ext);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    size_t put = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || put != size) return NULL;
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct moe_error err;
    const char *text = (const char *)data;
#if defined(FUZZ_MODEL) || defined(FUZZ_HF) || defined(FUZZ_CLUSTER) || defined(FUZZ_PLAN)
    struct moe_jdoc doc;
    if (moe_jdoc_parse(&doc, "fuzz.json", text, size, &err) != MOE_OK) return 0;
#endif
#if defined(FUZZ_MODEL)
    struct mdl_model m;
    mdl_model_from_doc(&m, &doc, &err);
#elif defined(FUZZ_HF)
    struct mdl_model m;
    mdl_model_from_hf(&m, &doc, &err);
#elif defined(FUZZ_CLUSTER)
    static struct topo_cluster c;
    topo_cluster_from_doc(&c, &doc, gpus_file(), &err);
#elif defined(FUZZ_PLAN)
    char summary[256];
    enum moe_status st = plan_check_doc(&doc, summary, sizeof summary, &err);
    const char *path = st == MOE_OK ? as_file(data, size, "json") : NULL;
    if (path) {
        struct plan_file p;
        plan_load(path, &p, &err);
        plan_file_free(&p);
        unlink(path);
    }
#elif defined(FUZZ_ROUTING)
    const char *path = as_file(data, size, "json");
    if (path) {
        struct cost_routing r;
        if (cost_routing_load(&r, path, 8, 2, &err) == MOE_OK) cost_routing_free(&r);
        unlink(path);
    }
#elif defined(FUZZ_CALIBRATION)
    const char *path = as_file(data, size, "json");
    if (path) {
        struct cost_calibration cal;
        cost_calibration_defaults(&cal, NULL);
        cost_calibration_load(&cal, path, &err);
        unlink(path);
    }
#elif defined(FUZZ_PREDICT)
    /* The first 16 bytes are option values (--experts, --layers, the layout's degrees, seq,
     * routing), the rest a --layout text; the model is a shipped one picked by a byte. The
     * values reach past every documented limit, so a buffer sized by a guess (the 4,096-expert
     * array this harness was written for) overflows here. */
    static const char *const models[] = {"tiny-moe-gqa", "tiny-moe-mla",  "deepseek-v3",
                                         "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b"};
    static struct topo_cluster cl;
    static bool have_cluster;
    if (size < 16) return 0;
    if (!have_cluster) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/topologies", MOEPLAN_SOURCE_DIR);
        if (topo_cluster_resolve(&cl, "hgx-h100-x128", dir, &err) != MOE_OK) abort();
        have_cluster = true;
    }
    char mdir[1024];
    snprintf(mdir, sizeof mdir, "%s/model", MOEPLAN_SOURCE_DIR);
    static struct mdl_model m;
    if (mdl_model_resolve(&m, models[data[0] % 6], mdir, &err) != MOE_OK) abort();
    uint32_t experts = (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)(data[3] & 1) << 16;
    struct mdl_overrides ov = {(int)(data[4] % 8), (int)experts};
    if (mdl_model_override(&m, &ov, &err) != MOE_OK) return 0;
    int ep = 1 << (data[5] % 18), dp = 1 << (data[6] % 11), pp = 1 + data[7] % 9;
    struct cost_layout l = {.tp = 1 << (data[8] % 4),
                            .cp = 1 << (data[13] / 3 % 4),
                            .pp = pp,
                            .vpp = 1 + data[9] % 4,
                            .ep = ep,
                            .etp = 1,
                            .dp = dp,
                            .zero = data[10] % 4,
                            .seq_len = 128 << (data[11] % 8),
                            .mbs = 1 << (data[12] % 4),
                            .gbs = 0,
                            .precision = COST_BF16,
                            .recompute = (enum cost_recompute)(data[13] % 3),
                            .dispatcher = (enum cost_dispatcher)(data[14] % 3),
                            .overlap = (data[15] & 1) != 0};
    l.gbs = l.dp * l.mbs * (1 + data[15] % 16);
    char lay[256];
    size_t n = size - 16 < sizeof lay - 1 ? size - 16 : sizeof lay - 1;
    memcpy(lay, data + 16, n);
    lay[n] = '\0';
    if (n && cost_layout_parse(&l, lay, &err) != MOE_OK) return 0;
    double g = (double)l.tp * l.cp * l.pp * l.dp; /* parsed degrees reach 2^30 each */
    if (g < 1 || g > cl.gpus_usable) return 0;
    int gpus = (int)g;
    struct cost_routing r;
    if (cost_routing_synthetic(&r, data[15] & 2 ? COST_ROUTING_ZIPF : COST_ROUTING_UNIFORM,
                               (data[15] >> 2) / 8.0, 1, m.moe.experts, m.moe.top_k,
                               &err) != MOE_OK)
        return 0;
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, &m, &cl, NULL, gpus);
    ctx.routing = &r;
    struct cost_result res;
    if (cost_layout_check(&l, &m, gpus, &err) == MOE_OK) cost_evaluate(&ctx, &l, &res, &err);
    cost_routing_free(&r);
#elif defined(FUZZ_PUBLISHED)
    /* The loader over the whole file; where it takes the file, the first rows (at most 3: a fit
     * costs each row hundreds of times) resolved and fitted as `calibrate --published` fits a
     * stack. */
    const char *path = as_file(data, size, "tsv");
    if (path) {
        static struct plan_published runs[PLAN_PUBLISHED_MAX];
        static struct plan_fit_row rows[3];
        int n = 0;
        if (plan_published_load(path, runs, PLAN_PUBLISHED_MAX, &n, &err) == MOE_OK && n > 0) {
            char mdir[1024], tdir[1024];
            snprintf(mdir, sizeof mdir, "%s/model", MOEPLAN_SOURCE_DIR);
            snprintf(tdir, sizeof tdir, "%s/topologies", MOEPLAN_SOURCE_DIR);
            int k = n < 3 ? n : 3;
            if (plan_fit_rows(runs, k, mdir, tdir, rows, &err) == MOE_OK) {
                struct cost_calibration ds, fitted;
                double rms[2];
                int own;
                plan_fit_row_start(&rows[0], &ds);
                plan_fit_stack(rows, k, runs[0].cluster, &ds, &fitted, &own, rms, &err);
            }
        }
        unlink(path);
    }
#elif defined(FUZZ_XML)
    const char *path = as_file(data, size, "xml");
    if (path) {
        static struct topo_node node;
        topo_node_load_xml(&node, path, &err);
        unlink(path);
    }
#else
#error "define one FUZZ_ target"
#endif
#if defined(FUZZ_MODEL) || defined(FUZZ_HF) || defined(FUZZ_CLUSTER) || defined(FUZZ_PLAN)
    moe_jdoc_free(&doc);
#endif
    (void)text;
    return 0;
}
