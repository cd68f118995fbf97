/*
 * gpus.c: the GPU spec file (topologies/gpus.json, "moeplan.gpus").
 *
 * Every hardware number the cost model uses is a field of this file, never a constant in code:
 * secondary sources disagree by up to ~10% on some cells, and a user must be able to correct
 * one without rebuilding.
 */
#include "topo.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static enum moe_status load_spec(const struct moe_jval *o, struct topo_gpu_spec *g,
                                 struct moe_error *err)
{
    static const char *const keys[] = {"name",
                                       "arch",
                                       "bf16_tflops",
                                       "fp8_tflops",
                                       "fp4_tflops",
                                       "hbm",
                                       "hbm_bandwidth",
                                       "sms",
                                       "exp_tera_per_s",
                                       "nvlink_version",
                                       "nvlink_links",
                                       "nvlink_bandwidth",
                                       "nvlink_domain_gpus",
                                       "nic_bandwidth",
                                       "power_w",
                                       "host_link",
                                       "host_link_bandwidth",
                                       "host_memory_bandwidth",
                                       "pci_device_id",
                                       NULL};
    enum moe_status st;
    int64_t v;
    memset(g, 0, sizeof *g);
    if ((st = moe_jval_keys(o, keys, err))) return st;
    if ((st = moe_jval_str(o, "name", true, NULL, g->name, sizeof g->name, err))) return st;
    if (!g->name[0]) return moe_jval_error(o, "name", err, "must not be empty");
    if ((st = moe_jval_str(o, "arch", true, NULL, g->arch, sizeof g->arch, err))) return st;
    if ((st = moe_jval_num(o, "bf16_tflops", true, 0, 1, 1e6, &g->bf16_tflops, err))) return st;
    if ((st = moe_jval_num(o, "fp8_tflops", false, 0, 0, 1e6, &g->fp8_tflops, err))) return st;
    if ((st = moe_jval_num(o, "fp4_tflops", false, 0, 0, 1e6, &g->fp4_tflops, err))) return st;
    if ((st = moe_jval_size(o, "hbm", true, 0, 1e9, 1e15, &g->hbm_bytes, err))) return st;
    if ((st = moe_jval_bandwidth(o, "hbm_bandwidth", true, 0, 1e9, 1e15, &g->hbm_bytes_per_s, err)))
        return st;
    if ((st = moe_jval_int(o, "sms", true, 0, 1, 100000, &v, err))) return st;
    g->sms = (int)v;
    if ((st = moe_jval_num(o, "exp_tera_per_s", false, 0, 0, 1e6, &g->exp_per_s, err))) return st;
    g->exp_per_s *= 1e12;
    if ((st = moe_jval_int(o, "nvlink_version", false, 0, 0, 100, &v, err))) return st;
    g->nvlink_version = (int)v;
    if ((st = moe_jval_int(o, "nvlink_links", false, 0, 0, 1000, &v, err))) return st;
    g->nvlink_links = (int)v;
    if ((st = moe_jval_bandwidth(o, "nvlink_bandwidth", true, 0, 0, 1e15, &g->nvlink_bytes_per_s,
                                 err)))
        return st;
    if ((st = moe_jval_int(o, "nvlink_domain_gpus", true, 0, 1, 1 << 20, &v, err))) return st;
    g->nvlink_domain_gpus = (int)v;
    if ((st = moe_jval_bandwidth(o, "nic_bandwidth", true, 0, 1e6, 1e15, &g->nic_bytes_per_s, err)))
        return st;
    if ((st = moe_jval_num(o, "power_w", false, 0, 0, 1e6, &g->power_w, err))) return st;
    if ((st = moe_jval_str(o, "host_link", false, "", g->host_link, sizeof g->host_link, err)) ||
        (st = moe_jval_bandwidth(o, "host_link_bandwidth", false, 0, 0, 1e15,
                                 &g->host_link_bytes_per_s, err)) ||
        (st = moe_jval_bandwidth(o, "host_memory_bandwidth", false, 0, 0, 1e15,
                                 &g->host_memory_bytes_per_s, err)))
        return st;
    char id[16];
    if ((st = moe_jval_str(o, "pci_device_id", false, "0", id, sizeof id, err))) return st;
    char *end;
    unsigned long pid = strtoul(id, &end, 16);
    if (*end || pid > 0xffff)
        return moe_jval_error(o, "pci_device_id", err, "must be a 16-bit hex number like 0x2335");
    g->pci_device_id = (unsigned)pid;
    return MOE_OK;
}

enum moe_status topo_gpus_load(const char *file, struct topo_gpu_spec *specs, int cap, int *n,
                               struct moe_error *err)
{
    struct moe_jdoc doc;
    struct moe_jval root, arr, o;
    char schema[64];
    int version, count = 0;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    static const char *const keys[] = {"schema", "version", "source", "gpus", NULL};
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err))) goto cleanup;
    if ((st = moe_jdoc_root(&doc, &root, err))) goto cleanup;
    if (strcmp(schema, TOPO_GPUS_SCHEMA) != 0 || version != TOPO_SCHEMA_VERSION) {
        st = moe_jval_error(&root, "schema", err, "expected \"%s\" version %d", TOPO_GPUS_SCHEMA,
                            TOPO_SCHEMA_VERSION);
        goto cleanup;
    }
    if ((st = moe_jval_keys(&root, keys, err))) goto cleanup;
    if ((st = moe_jval_array(&root, "gpus", true, &arr, NULL, err))) goto cleanup;
    for (size_t i = 0; i < moe_jval_len(&arr); i++) {
        if (count == cap) {
            st = moe_jval_error(&arr, NULL, err, "more than %d GPU specs", cap);
            goto cleanup;
        }
        if ((st = moe_jval_at_object(&arr, i, &o, err))) goto cleanup;
        if ((st = load_spec(&o, &specs[count], err))) goto cleanup;
        for (int j = 0; j < count; j++)
            if (strcasecmp(specs[j].name, specs[count].name) == 0) {
                st = moe_jval_error(&o, "name", err, "GPU '%s' is listed twice", specs[count].name);
                goto cleanup;
            }
        count++;
    }
    *n = count;
cleanup:
    moe_jdoc_free(&doc);
    return st;
}

const struct topo_gpu_spec *topo_gpu_find(const struct topo_gpu_spec *specs, int n,
                                          const char *name)
{
    /* Exact names first, then names as drivers report them ("NVIDIA H200", "NVIDIA H100 80GB
     * HBM3"): the spec name as a whole word of the reported one. Longest match wins, so
     * "GB200" is not taken for "B200". */
    const struct topo_gpu_spec *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < n; i++) {
        if (strcasecmp(specs[i].name, name) == 0) return &specs[i];
        size_t len = strlen(specs[i].name);
        for (const char *p = name; *p; p++) {
            if (strncasecmp(p, specs[i].name, len) != 0) continue;
            bool starts_word = p == name || !isalnum((unsigned char)p[-1]);
            bool ends_word = !isalnum((unsigned char)p[len]);
            if (starts_word && ends_word && len > best_len) {
                best = &specs[i];
                best_len = len;
            }
        }
    }
    return best;
}
