/*
 * calibration.c: the efficiencies the cost model uses, from datasheet defaults or a profile.
 *
 * Every published step-time model under ~8% error calibrates its efficiencies from measurements
 * (reference/prior-art.md). The defaults here are the achieved fractions others report
 * (reference/hardware.md); `moeplan calibrate` will measure them. A prediction always says which
 * it used.
 */
#include "plan.h"

#include <string.h>

void cost_calibration_defaults(struct cost_calibration *cal, const struct topo_gpu_spec *gpu)
{
    memset(cal, 0, sizeof *cal);
    cal->calibrated = false;
    snprintf(cal->source, sizeof cal->source, "datasheet defaults (uncalibrated)");
    bool hopper = gpu && strcmp(gpu->arch, "hopper") == 0;
    cal->gemm_eff = 0.80;      /* large bf16 GEMM: ~780-800 of 989 on Hopper */
    cal->gemm_eff_fp8 = 0.78;  /* ~1550 of 1979 */
    cal->gemm_m_half = 48.0;
    cal->gemm_k_half = 96.0;
    cal->gemm_tile_m = 128;
    cal->gemm_tile_n = hopper ? 256 : 256;
    cal->attn_fwd_eff = 0.55;
    cal->attn_bwd_eff = 0.45;
    cal->hbm_eff = 0.88;       /* ~4.3 of 4.8 TB/s device-to-device on H200 */
    cal->launch_us = 4.0;
    cal->nvlink_eff = 0.82;    /* ~370 of 450 GB/s all-to-all inside an HGX node */
    cal->nvlink_allreduce_eff = 0.82;
    cal->scale_out_eff = 0.86; /* ~43 of 50 GB/s across nodes */
    cal->a2a_latency_us = 15.0;
    cal->overlap_max = 0.8;
}

enum moe_status cost_calibration_load(struct cost_calibration *cal, const char *file,
                                      struct moe_error *err)
{
    static const char *const keys[] = {
        "schema", "version", "gpu", "driver", "date", "libraries", "measured", "defaults_used",
        "gemm_eff", "gemm_eff_fp8", "gemm_m_half", "gemm_k_half", "gemm_tile_m", "gemm_tile_n",
        "attn_fwd_eff", "attn_bwd_eff", "hbm_eff", "launch_us", "nvlink_eff",
        "nvlink_allreduce_eff", "scale_out_eff", "a2a_latency_us", "overlap_max", NULL};
    struct moe_jdoc doc;
    struct moe_jval root;
    char schema[64], gpu[64], date[64];
    int version;
    int64_t tile;
    struct cost_calibration t = *cal;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    if ((st = moe_jdoc_schema(&doc, schema, sizeof schema, &version, err))) goto cleanup;
    if ((st = moe_jdoc_root(&doc, &root, err))) goto cleanup;
    if (strcmp(schema, COST_CALIBRATION_SCHEMA) != 0 || version != 1) {
        st = moe_jval_error(&root, "schema", err, "expected \"%s\" version 1",
                            COST_CALIBRATION_SCHEMA);
        goto cleanup;
    }
    if ((st = moe_jval_keys(&root, keys, err))) goto cleanup;
    if ((st = moe_jval_str(&root, "gpu", true, NULL, gpu, sizeof gpu, err))) goto cleanup;
    if ((st = moe_jval_str(&root, "date", false, "", date, sizeof date, err))) goto cleanup;
#define FRACTION(key) \
    if ((st = moe_jval_num(&root, #key, false, t.key, 1e-3, 1.0, &t.key, err))) goto cleanup
    FRACTION(gemm_eff);
    FRACTION(gemm_eff_fp8);
    FRACTION(attn_fwd_eff);
    FRACTION(attn_bwd_eff);
    FRACTION(hbm_eff);
    FRACTION(nvlink_eff);
    FRACTION(nvlink_allreduce_eff);
    FRACTION(scale_out_eff);
#undef FRACTION
    if ((st = moe_jval_num(&root, "overlap_max", false, t.overlap_max, 0, 1, &t.overlap_max, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "gemm_m_half", false, t.gemm_m_half, 0, 1e6, &t.gemm_m_half, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "gemm_k_half", false, t.gemm_k_half, 0, 1e6, &t.gemm_k_half, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "launch_us", false, t.launch_us, 0, 1e4, &t.launch_us, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "a2a_latency_us", false, t.a2a_latency_us, 0, 1e5,
                           &t.a2a_latency_us, err)))
        goto cleanup;
    if ((st = moe_jval_int(&root, "gemm_tile_m", false, t.gemm_tile_m, 8, 1024, &tile, err)))
        goto cleanup;
    t.gemm_tile_m = (int)tile;
    if ((st = moe_jval_int(&root, "gemm_tile_n", false, t.gemm_tile_n, 8, 1024, &tile, err)))
        goto cleanup;
    t.gemm_tile_n = (int)tile;
    t.calibrated = true;
    snprintf(t.source, sizeof t.source, "calibrated: %s (%s, %s)", file, gpu,
             date[0] ? date : "undated");
    *cal = t;
cleanup:
    moe_jdoc_free(&doc);
    return st;
}
