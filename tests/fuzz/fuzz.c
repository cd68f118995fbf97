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
