/*
 * calibration.c: the efficiencies the cost model uses, from datasheet defaults or a profile.
 *
 * Step-time models under about 8% error calibrate their efficiencies from measurements. The
 * defaults here are the achieved fractions published measurements report (docs/DESIGN.md,
 * "Calibration defaults"); `moeplan calibrate` measures them on a GPU. A prediction always says
 * which it used.
 */
#include "cost_internal.h"

#include <ctype.h>
#include <strings.h>

#include <math.h>
#include <string.h>

void cost_calibration_defaults(struct cost_calibration *cal, const struct topo_gpu_spec *gpu)
{
    memset(cal, 0, sizeof *cal);
    cal->calibrated = false;
    snprintf(cal->source, sizeof cal->source, "datasheet defaults (uncalibrated)");
    bool hopper = gpu && strcmp(gpu->arch, "hopper") == 0;
    cal->gemm_eff = 0.80;     /* large bf16 GEMM: ~780-800 of 989 on Hopper */
    cal->gemm_eff_fp8 = 0.78; /* ~1550 of 1979 */
    cal->gemm_eff_fp8_block = cal->gemm_eff_fp8;
    cal->gemm_eff_fp8_grad = cal->gemm_eff_fp8;
    cal->gemm_m_half = 48.0;
    cal->gemm_k_half = 96.0;
    cal->gemm_tile_m = 128;
    cal->gemm_tile_n = hopper ? 256 : 256;
    cal->attn_fwd_eff = 0.55;
    cal->attn_bwd_eff = 0.45;
    cal->attn_sink_eff = cal->attn_sink_fwd_eff = cal->attn_sink_bwd_eff = 1.0;
    cal->attn_sink_cudnn_fwd_eff = cal->attn_sink_cudnn_bwd_eff = 0.0; /* not measured */
    cal->attn_window_cudnn_eff = cal->attn_window_bwd_cudnn_eff = 0.0;
    cal->attn_window_bwd_full = false;
    cal->attn_wide_eff = 1.0;
    cal->attn_window_eff = 1.0;
    cal->attn_window_bwd_eff = 1.0;
    cal->hbm_eff = 0.88; /* ~4.3 of 4.8 TB/s device-to-device on H200 */
    cal->launch_us = 4.0;
    cal->graph_launch_us = 1.0; /* a graph replays its kernels back to back: no host launch */
    cal->nvlink_eff = 0.82;     /* ~370 of 450 GB/s all-to-all inside an HGX node */
    cal->nvlink_allreduce_eff = 0.82;
    cal->scale_out_eff = 0.86; /* ~43 of 50 GB/s across nodes */
    cal->a2a_latency_us = 15.0;
    cal->overlap_max = 0.8;
    for (int p = 0; p < COST_NPHASES; p++) {
        cal->phase_scale[p] = 1.0;
        cal->phase_fixed_us[p] = 0.0;
        cal->phase_floor_us[p] = 0.0;
    }
    for (int i = 0; i < 2; i++) {
        cal->expert_scale[i] = cal->expert_fixed_share[i] = 1.0;
        cal->expert_m_half[i] = cal->gemm_m_half;
    }
}

/* "gemm_table": [[m, n, k, measured over roofline], ...] (cost_gemm_table_set), sorted by n, k
 * and m as written; absent: none. */
static enum moe_status gemm_table_load(const struct moe_jval *root, struct cost_calibration *t,
                                       struct moe_error *err)
{
    struct moe_jval arr;
    bool have = false;
    enum moe_status st = moe_jval_array(root, "gemm_table", false, &arr, &have, err);
    t->gemm_table_n = 0;
    if (st || !have) return st;
    size_t n = moe_jval_len(&arr);
    if (n > COST_GEMM_TABLE_MAX)
        return moe_jval_error(&arr, NULL, err, "gemm_table: %zu shapes, at most %d", n,
                              COST_GEMM_TABLE_MAX);
    static const double lo[4] = {1, 1, 1, 0.05}, hi[4] = {1e7, 1e7, 1e7, 20.0};
    for (size_t i = 0; i < n; i++) {
        struct moe_jval row;
        double *c = t->gemm_table[i];
        enum moe_status rs = moe_jval_at_array(&arr, i, &row, err);
        if (rs) return rs;
        if (moe_jval_len(&row) != 4)
            return moe_jval_error(&row, NULL, err, "[m, n, k, measured over roofline]: 4 numbers");
        for (size_t j = 0; j < 4; j++)
            if ((rs = moe_jval_at_num(&row, j, lo[j], hi[j], &c[j], err))) return rs;
        const double *p = i ? t->gemm_table[i - 1] : NULL;
        if (p && (p[1] > c[1] || (p[1] == c[1] && (p[2] > c[2] || (p[2] == c[2] && p[0] >= c[0])))))
            return moe_jval_error(&row, NULL, err,
                                  "not after the entry before it: the table is sorted by n, k, "
                                  "then m, each shape once");
    }
    t->gemm_table_n = (int)n;
    cost_gemm_table_logs(t);
    return MOE_OK;
}

enum moe_status cost_calibration_load(struct cost_calibration *cal, const char *file,
                                      struct moe_error *err)
{
    static const char *const keys[] = {"schema",
                                       "version",
                                       "gpu",
                                       "driver",
                                       "date",
                                       "libraries",
                                       "measured",
                                       "defaults_used",
                                       "gemm_eff",
                                       "gemm_eff_fp8",
                                       "gemm_eff_fp8_block",
                                       "gemm_eff_fp8_grad",
                                       "gemm_m_half",
                                       "gemm_k_half",
                                       "gemm_fixed_us",
                                       "gemm_tile_m",
                                       "gemm_tile_n",
                                       "attn_fwd_eff",
                                       "attn_bwd_eff",
                                       "attn_seq_half",
                                       "attn_exp_scale",
                                       "attn_sink_eff",
                                       "attn_sink_fwd_eff",
                                       "attn_sink_bwd_eff",
                                       "attn_sink_cudnn_fwd_eff",
                                       "attn_sink_cudnn_bwd_eff",
                                       "attn_window_cudnn_eff",
                                       "attn_window_bwd_cudnn_eff",
                                       "attn_window_bwd_full",
                                       "attn_wide_eff",
                                       "attn_window_eff",
                                       "attn_window_bwd_eff",
                                       "hbm_eff",
                                       "launch_us",
                                       "graph_launch_us",
                                       "quant_kernels_fp8",
                                       "quant_kernels_block",
                                       "nvlink_eff",
                                       "nvlink_allreduce_eff",
                                       "scale_out_eff",
                                       "a2a_latency_us",
                                       "overlap_max",
                                       "phases",
                                       "experts",
                                       "fit",
                                       "stack",
                                       "gemm_table",
                                       NULL};
    struct moe_jdoc doc;
    struct moe_jval root;
    char schema[64], gpu[64], date[64], stack[64];
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
    if ((st = moe_jval_str(&root, "date", false, "", date, sizeof date, err)) ||
        (st = moe_jval_str(&root, "stack", false, "", stack, sizeof stack, err)))
        goto cleanup;
#define FRACTION(key)                                                                              \
    if ((st = moe_jval_num(&root, #key, false, t.key, 1e-3, 1.0, &t.key, err))) goto cleanup
    FRACTION(gemm_eff);
    FRACTION(gemm_eff_fp8);
    t.gemm_eff_fp8_block = t.gemm_eff_fp8; /* a profile without its own */
    FRACTION(gemm_eff_fp8_block);
    t.gemm_eff_fp8_grad = t.gemm_eff_fp8; /* the same */
    FRACTION(gemm_eff_fp8_grad);
    FRACTION(attn_fwd_eff);
    FRACTION(attn_bwd_eff);
    FRACTION(attn_sink_eff);
    FRACTION(attn_sink_fwd_eff);
    FRACTION(attn_sink_bwd_eff);
    FRACTION(attn_sink_cudnn_fwd_eff); /* absent: 0, not measured */
    FRACTION(attn_sink_cudnn_bwd_eff);
    FRACTION(attn_window_cudnn_eff);
    FRACTION(attn_window_bwd_cudnn_eff);
    if ((st = moe_jval_bool(&root, "attn_window_bwd_full", false, t.attn_window_bwd_full,
                            &t.attn_window_bwd_full, err)))
        goto cleanup;
    FRACTION(attn_wide_eff);
    FRACTION(attn_window_eff);
    t.attn_window_bwd_eff = t.attn_window_eff; /* a profile without its own */
    FRACTION(attn_window_bwd_eff);
    FRACTION(hbm_eff);
    FRACTION(nvlink_eff);
    FRACTION(nvlink_allreduce_eff);
    FRACTION(scale_out_eff);
#undef FRACTION
    if ((st = moe_jval_num(&root, "overlap_max", false, t.overlap_max, 0, 1, &t.overlap_max, err)))
        goto cleanup;
    if ((st =
             moe_jval_num(&root, "gemm_m_half", false, t.gemm_m_half, 0, 1e6, &t.gemm_m_half, err)))
        goto cleanup;
    if ((st =
             moe_jval_num(&root, "gemm_k_half", false, t.gemm_k_half, 0, 1e6, &t.gemm_k_half, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "attn_seq_half", false, t.attn_seq_half, 0, 1e6, &t.attn_seq_half,
                           err)) ||
        (st = moe_jval_num(&root, "attn_exp_scale", false, t.attn_exp_scale, 0, 100,
                           &t.attn_exp_scale, err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "launch_us", false, t.launch_us, 0, 1e4, &t.launch_us, err)) ||
        (st = moe_jval_num(&root, "graph_launch_us", false, t.graph_launch_us, 0, 1e4,
                           &t.graph_launch_us, err)) ||
        (st = moe_jval_num(&root, "gemm_fixed_us", false, t.gemm_fixed_us, 0, 1e4, &t.gemm_fixed_us,
                           err)))
        goto cleanup;
    if ((st = moe_jval_num(&root, "a2a_latency_us", false, t.a2a_latency_us, 0, 1e5,
                           &t.a2a_latency_us, err)) ||
        (st = moe_jval_num(&root, "quant_kernels_fp8", false, t.quant_kernels_fp8, 0, 100,
                           &t.quant_kernels_fp8, err)) ||
        (st = moe_jval_num(&root, "quant_kernels_block", false, t.quant_kernels_block, 0, 100,
                           &t.quant_kernels_block, err)))
        goto cleanup;
    if ((st = moe_jval_int(&root, "gemm_tile_m", false, t.gemm_tile_m, 8, 1024, &tile, err)))
        goto cleanup;
    t.gemm_tile_m = (int)tile;
    if ((st = moe_jval_int(&root, "gemm_tile_n", false, t.gemm_tile_n, 8, 1024, &tile, err)))
        goto cleanup;
    t.gemm_tile_n = (int)tile;
    struct moe_jval phases, ph;
    bool have = false;
    if ((st = moe_jval_object(&root, "phases", false, &phases, &have, err))) goto cleanup;
    for (int p = 0; have && p < COST_NPHASES; p++) {
        bool one = false;
        if ((st = moe_jval_object(&phases, cost_phase_names[p], false, &ph, &one, err)))
            goto cleanup;
        if (!one) continue;
        if (stack[0]) { /* the executor's corrections: one GPU's, never a stack's */
            st = moe_jval_error(&ph, NULL, err,
                                "a stack profile takes no phase corrections (they are the "
                                "executor's on one GPU)");
            goto cleanup;
        }
        /* a floor only where there are experts to count */
        bool experts = p == COST_EXPERTS_FWD || p == COST_EXPERTS_BWD;
        static const char *const with_floor[] = {"scale", "fixed_us", "floor_us_per_expert", NULL};
        static const char *const without[] = {"scale", "fixed_us", NULL};
        if ((st = moe_jval_keys(&ph, experts ? with_floor : without, err))) goto cleanup;
        if ((st = moe_jval_num(&ph, "scale", true, 1.0, 0.01, 100.0, &t.phase_scale[p], err)) ||
            (st = moe_jval_num(&ph, "fixed_us", true, 0.0, 0.0, 1e7, &t.phase_fixed_us[p], err)) ||
            (st = moe_jval_num(&ph, "floor_us_per_expert", false, 0.0, 0.0, 1e5,
                               &t.phase_floor_us[p], err)))
            goto cleanup;
    }
    struct moe_jval ex, dir;
    if ((st = moe_jval_object(&root, "experts", false, &ex, &have, err))) goto cleanup;
    for (int i = 0; i < 2; i++) {
        t.expert_m_half[i] = t.gemm_m_half;
        if (have &&
            ((st = moe_jval_object(&ex, i ? "backward" : "forward", true, &dir, NULL, err)) ||
             (st = moe_jval_num(&dir, "scale", true, 1.0, 0.01, 100.0, &t.expert_scale[i], err)) ||
             (st = moe_jval_num(&dir, "fixed_share", true, 1.0, 0.0, 100.0,
                                &t.expert_fixed_share[i], err)) ||
             (st = moe_jval_num(&dir, "m_half", false, t.gemm_m_half, 0.0, 1e6, &t.expert_m_half[i],
                                err))))
            goto cleanup;
    }
    if ((st = gemm_table_load(&root, &t, err))) goto cleanup;
    t.calibrated = true;
    snprintf(t.gpu, sizeof t.gpu, "%s", gpu);
    if (stack[0]) /* fitted on published runs of a software stack */
        snprintf(t.source, sizeof t.source, "stack profile %s for %s: %s", stack, gpu, file);
    else
        snprintf(t.source, sizeof t.source, "calibrated: %s (%s, %s)", file, gpu,
                 date[0] ? date : "undated");
    *cal = t;
cleanup:
    moe_jdoc_free(&doc);
    return st;
}

enum moe_status cost_calibration_write(const struct cost_calibration *cal, json_t *meta,
                                       const char *file, struct moe_error *err)
{
    json_t *root = json_object(), *phases = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) json_object_set(root, k, v);
#define PUT(key) json_object_set_new(root, #key, json_real(cal->key))
    PUT(gemm_eff);
    PUT(gemm_eff_fp8);
    PUT(gemm_eff_fp8_block);
    PUT(gemm_eff_fp8_grad);
    PUT(gemm_m_half);
    PUT(gemm_k_half);
    PUT(gemm_fixed_us);
    PUT(attn_fwd_eff);
    PUT(attn_bwd_eff);
    PUT(attn_seq_half);
    PUT(attn_exp_scale);
    PUT(attn_sink_eff);
    PUT(attn_sink_fwd_eff);
    PUT(attn_sink_bwd_eff);
    if (cal->attn_sink_cudnn_fwd_eff > 0) { /* measured (a profile calibrate wrote) */
        PUT(attn_sink_cudnn_fwd_eff);
        PUT(attn_sink_cudnn_bwd_eff);
    }
    if (cal->attn_window_cudnn_eff > 0) {
        PUT(attn_window_cudnn_eff);
        PUT(attn_window_bwd_cudnn_eff);
    }
    json_object_set_new(root, "attn_window_bwd_full", json_boolean(cal->attn_window_bwd_full));
    PUT(attn_wide_eff);
    PUT(attn_window_eff);
    PUT(attn_window_bwd_eff);
    PUT(hbm_eff);
    PUT(launch_us);
    PUT(graph_launch_us);
    PUT(quant_kernels_fp8);
    PUT(quant_kernels_block);
    PUT(nvlink_eff);
    PUT(nvlink_allreduce_eff);
    PUT(scale_out_eff);
    PUT(a2a_latency_us);
    PUT(overlap_max);
#undef PUT
    json_object_set_new(root, "gemm_tile_m", json_integer(cal->gemm_tile_m));
    json_object_set_new(root, "gemm_tile_n", json_integer(cal->gemm_tile_n));
    for (int p = 0; p < COST_NPHASES; p++) {
        if (cal->phase_scale[p] == 1.0 && cal->phase_fixed_us[p] == 0.0 &&
            cal->phase_floor_us[p] == 0.0)
            continue;
        json_t *o = json_object();
        json_object_set_new(o, "scale", json_real(cal->phase_scale[p]));
        json_object_set_new(o, "fixed_us", json_real(cal->phase_fixed_us[p]));
        if (cal->phase_floor_us[p] > 0.0)
            json_object_set_new(o, "floor_us_per_expert", json_real(cal->phase_floor_us[p]));
        json_object_set_new(phases, cost_phase_names[p], o);
    }
    json_object_set_new(root, "phases", phases);
    json_t *ex = json_object();
    for (int i = 0; i < 2; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "scale", json_real(cal->expert_scale[i]));
        json_object_set_new(o, "fixed_share", json_real(cal->expert_fixed_share[i]));
        json_object_set_new(o, "m_half", json_real(cal->expert_m_half[i]));
        json_object_set_new(ex, i ? "backward" : "forward", o);
    }
    json_object_set_new(root, "experts", ex);
    if (cal->gemm_table_n > 0) {
        json_t *tab = json_array();
        for (int i = 0; i < cal->gemm_table_n; i++) {
            json_t *row = json_array();
            for (int j = 0; j < 4; j++)
                json_array_append_new(row, json_real(cal->gemm_table[i][j]));
            json_array_append_new(tab, row);
        }
        json_object_set_new(root, "gemm_table", tab);
    }
    enum moe_status st = moe_json_write_atomic(file, root, COST_CALIBRATION_SCHEMA, 1, err);
    json_decref(root);
    return st;
}

/* The rms of log(predicted / measured) for the GEMM samples under cal. */
static double gemm_misfit(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          const struct cost_gemm_sample *s, int n)
{
    double e = 0.0;
    for (int i = 0; i < n; i++) {
        double r = log(cost_gemm_us(cal, gpu, s[i].m, s[i].n, s[i].k, COST_BF16) / s[i].us);
        e += r * r;
    }
    return sqrt(e / n);
}

double cost_fit_gemm(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                     const struct cost_gemm_sample *s, int n)
{
    cal->gemm_table_n = 0; /* measured against other scalars: cost_gemm_table_set again */
    if (n < 1) return 0.0;
    /* a grid over the half-efficiency sizes, then coordinate steps that shrink */
    struct cost_calibration best = *cal, t = *cal;
    double best_e = INFINITY;
    static const double eff[] = {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
    static const double fixed[] = {0.0, 2.0, 5.0, 10.0, 20.0};
    for (int a = 0; a < 13; a++)
        for (int b = 0; b < 13; b++)
            for (size_t c = 0; c < sizeof eff / sizeof eff[0]; c++)
                for (size_t d = 0; d < sizeof fixed / sizeof fixed[0]; d++) {
                    t.gemm_m_half = a ? pow(2.0, a - 1) : 0.0;
                    t.gemm_k_half = b ? pow(2.0, b - 1) : 0.0;
                    t.gemm_eff = eff[c];
                    t.gemm_fixed_us = fixed[d];
                    double e = gemm_misfit(&t, gpu, s, n);
                    if (e < best_e) best_e = e, best = t;
                }
    for (double step = 0.25; step > 1e-4; step /= 2) {
        bool moved = true;
        while (moved) {
            moved = false;
            for (int which = 0; which < 4; which++)
                for (int dir = -1; dir <= 1; dir += 2) {
                    t = best;
                    double *x = which == 0   ? &t.gemm_eff
                                : which == 1 ? &t.gemm_m_half
                                : which == 2 ? &t.gemm_k_half
                                             : &t.gemm_fixed_us;
                    *x = which > 0 && *x < 1.0 && dir > 0 ? 1.0 : *x * (1.0 + dir * step);
                    if (t.gemm_eff > 1.0 || t.gemm_eff < 0.01) continue;
                    double e = gemm_misfit(&t, gpu, s, n);
                    if (e < best_e - 1e-12) best_e = e, best = t, moved = true;
                }
        }
    }
    cal->gemm_eff = best.gemm_eff;
    cal->gemm_m_half = best.gemm_m_half;
    cal->gemm_k_half = best.gemm_k_half;
    cal->gemm_fixed_us = best.gemm_fixed_us;
    double rel = 0.0;
    for (int i = 0; i < n; i++) {
        double r = cost_gemm_us(cal, gpu, s[i].m, s[i].n, s[i].k, COST_BF16) / s[i].us - 1.0;
        rel += r * r;
    }
    return sqrt(rel / n);
}

double cost_fit_floor(const double *model, const double *x, const double *measured, int n,
                      double *scale, double *floor, bool *edge)
{
    /* the floor over a grid of 0.25 us steps, each with its best scale on a grid of 0.1% steps
     * (relative error, as cost_fit_linear's) */
    const double f_max = 1000.0, s_min = 0.05, s_max = 20.0;
    double best = INFINITY;
    *scale = 1.0, *floor = 0.0;
    for (double f = 0.0; f <= f_max; f += 0.25)
        for (double ls = log(s_min); ls <= log(s_max); ls += 0.001) {
            double s = exp(ls), sum = 0.0;
            for (int i = 0; i < n && sum < best; i++) {
                if (!(measured[i] > 0)) continue;
                double r = fmax(s * model[i], f * x[i]) / measured[i] - 1.0;
                sum += r * r;
            }
            if (sum < best) best = sum, *scale = s, *floor = f;
        }
    *edge = *floor >= f_max - 0.25 || *scale <= s_min * 1.001 || *scale >= s_max * 0.999;
    int used = 0;
    for (int i = 0; i < n; i++) used += measured[i] > 0;
    return used && isfinite(best) ? sqrt(best / used) : 0.0;
}

double cost_fit_linear(const double *model, const double *count, const double *measured, int n,
                       double *scale, double *fixed)
{
    /* minimize sum ((s m_j + f c_j - y_j) / y_j)^2: 2 x 2 normal equations, weights 1 / y^2 */
    double smm = 0, smc = 0, scc = 0, smy = 0, scy = 0;
    for (int j = 0; j < n; j++) {
        if (measured[j] <= 0) continue;
        double w = 1.0 / (measured[j] * measured[j]);
        smm += w * model[j] * model[j];
        smc += w * model[j] * count[j];
        scc += w * count[j] * count[j];
        smy += w * model[j] * measured[j];
        scy += w * count[j] * measured[j];
    }
    double det = smm * scc - smc * smc, s = smm > 0 ? smy / smm : 1.0, f = 0.0;
    if (smm > 0 && scc > 0 && det > 1e-9 * smm * scc) { /* else the scale alone */
        double s2 = (smy * scc - scy * smc) / det, f2 = (scy * smm - smy * smc) / det;
        if (f2 >= 0 && s2 >= 1e-3)
            s = s2, f = f2;
        else if (f2 >= 0)
            s = 1e-3, f = (scy - s * smc) / scc; /* the fixed time dominates */
    }
    *scale = s > 1e-3 ? s : 1e-3;
    *fixed = f > 0 ? f : 0.0;
    double e = 0.0;
    int used = 0;
    for (int j = 0; j < n; j++) {
        if (measured[j] <= 0) continue;
        double r = (*scale * model[j] + *fixed * count[j]) / measured[j] - 1.0;
        e += r * r;
        used++;
    }
    return used ? sqrt(e / used) : 0.0;
}

/* A one-parameter search for x >= 0: a grid of x0 x 2^(i/4) (and 0), then multiplicative steps
 * that shrink; misfit(x, ctx) is what it minimizes. */
static double search_half(double (*misfit)(double, void *), void *ctx, double x0, int steps,
                          double *best_x)
{
    double best = INFINITY;
    for (int i = 0; i <= steps; i++) {
        double x = i ? x0 * pow(2.0, (i - 1) / 4.0) : 0.0, e = misfit(x, ctx);
        if (e < best) best = e, *best_x = x;
    }
    for (double f = pow(2.0, 0.125); f > 1.0 + 1e-6 && *best_x > 0; f = sqrt(f)) {
        bool moved = true;
        while (moved) {
            moved = false;
            for (int dir = -1; dir <= 1; dir += 2) {
                double x = dir < 0 ? *best_x / f : *best_x * f, e = misfit(x, ctx);
                if (e < best - 1e-15) best = e, *best_x = x, moved = true;
            }
        }
    }
    return best;
}

/* Attention: for a half-point (and the exp scale in cal), each sample's implied efficiencies,
 * their medians, and the rms log error of the samples around them. */
struct attn_fit {
    struct cost_calibration *cal;
    const struct topo_gpu_spec *gpu;
    const struct cost_attn_sample *s;
    int n;
};

static double attn_flops(const struct cost_attn_sample *a)
{
    /* the cost model's count: 2 heads (dqk + dv) per attended key, (S + 1) / 2 keys causal (the
     * count the causal samples were always fitted with), the window's band otherwise */
    double S = a->seq, keys = a->window > 0 ? mdl_attended_keys(S, a->window) : (S + 1) / 2.0;
    return a->seqs * S * 2.0 * a->heads * (a->dqk + a->dv) * keys;
}

/* The peak a sample's kernels are held to: the sequence's term and the exponentials' (as
 * cost_attention_core_us counts them). */
static double attn_peak(const struct attn_fit *f, const struct cost_attn_sample *a, double half)
{
    double d = (a->dqk + a->dv) / 2.0, ex = f->cal->attn_exp_scale, e = f->gpu->exp_per_s;
    double xh = ex > 0 && e > 0 ? ex * f->gpu->bf16_tflops * 1e12 / (4.0 * e) : 0.0;
    return f->gpu->bf16_tflops * 1e12 * a->seq / (a->seq + half) * d / (d + xh);
}

/* The efficiencies are the medians over the causal samples with query-key heads of at most 128
 * (all causal samples when none is), attn_wide_eff the geometric mean of the wider ones' against
 * them (at most 1), attn_window_eff the sliding-window samples' (at most 1). */
static double attn_misfit(double half, void *ctx)
{
    struct attn_fit *f = ctx;
    double fe[64], be[64], nf[64], nb[64], cf[64], cb[64], err = 0.0, wlog = 0.0, vlog = 0.0;
    int n = f->n < 64 ? f->n : 64, nn = 0, nw = 0, nc = 0, nv = 0;
    for (int i = 0; i < n; i++) {
        const struct cost_attn_sample *a = &f->s[i];
        double peak = attn_peak(f, a, half);
        fe[i] = attn_flops(a) / ((a->fwd_us - f->cal->launch_us) * 1e-6) / peak;
        be[i] = 2.5 * attn_flops(a) / ((a->bwd_us - f->cal->launch_us) * 1e-6) / peak;
        if (a->window > 0) continue;
        if (a->dqk <= 128) nf[nn] = fe[i], nb[nn++] = be[i];
        cf[nc] = fe[i], cb[nc++] = be[i];
    }
    if (!nc) return INFINITY;
    double ef = moe_median(nn ? nf : cf, (size_t)(nn ? nn : nc)),
           eb = moe_median(nn ? nb : cb, (size_t)(nn ? nn : nc));
    if (!(ef > 0 && ef <= 1.0 && eb > 0 && eb <= 1.0)) return INFINITY;
    for (int i = 0; nn && i < n; i++)
        if (f->s[i].window <= 0 && f->s[i].dqk > 128)
            wlog += 0.5 * (log(fe[i] / ef) + log(be[i] / eb)), nw++;
    double w = nw ? fmin(1.0, exp(wlog / nw)) : 1.0;
    for (int i = 0; i < n; i++)
        if (f->s[i].window > 0) vlog += 0.5 * (log(fe[i] / ef) + log(be[i] / eb)), nv++;
    double v = nv ? fmin(1.0, exp(vlog / nv)) : 1.0;
    for (int i = 0; i < n; i++) {
        double wi = f->s[i].window > 0 ? v : f->s[i].dqk > 128 ? w : 1.0;
        err += pow(log(fe[i] / (ef * wi)), 2) + pow(log(be[i] / (eb * wi)), 2);
    }
    f->cal->attn_fwd_eff = ef;
    f->cal->attn_bwd_eff = eb;
    f->cal->attn_wide_eff = w;
    f->cal->attn_window_eff = f->cal->attn_window_bwd_eff = v;
    return sqrt(err / (2 * n));
}

double cost_fit_attention(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          const struct cost_attn_sample *s, int n)
{
    if (n < 1) return 0.0;
    /* the exponentials' share is fitted where heads narrower than 128 were measured (without
     * them it cannot be told from the efficiencies): a grid of scales, each with its half-point */
    bool narrow = false;
    for (int i = 0; i < n; i++) narrow = narrow || (s[i].window <= 0 && s[i].dqk < 128);
    static const double scales[] = {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0};
    int nscales = narrow && gpu->exp_per_s > 0 ? (int)(sizeof scales / sizeof scales[0]) : 1;
    double best = INFINITY;
    struct cost_calibration out = *cal;
    for (int k = 0; k < nscales; k++) {
        struct cost_calibration t = *cal;
        t.attn_exp_scale = nscales > 1 ? scales[k] : cal->attn_exp_scale;
        struct attn_fit f = {&t, gpu, s, n};
        double half = 0.0;
        search_half(attn_misfit, &f, 16.0, 40, &half); /* 16 to 16384 tokens */
        double e = attn_misfit(half, &f);              /* t's efficiencies at the chosen point */
        if (e < best) best = e, out = t, out.attn_seq_half = half;
    }
    cal->attn_fwd_eff = out.attn_fwd_eff;
    cal->attn_bwd_eff = out.attn_bwd_eff;
    cal->attn_seq_half = out.attn_seq_half;
    cal->attn_wide_eff = out.attn_wide_eff;
    cal->attn_window_eff = out.attn_window_eff;
    cal->attn_window_bwd_eff = out.attn_window_bwd_eff;
    cal->attn_exp_scale = out.attn_exp_scale;
    return best;
}

void cost_fit_te_attention(struct cost_calibration *cal, const struct cost_attn_sample *plain,
                           const struct cost_attn_sample *sinks, int n)
{
    double pf = 0.0, pb = 0.0, sf = 0.0, sb = 0.0, lf = 0.0, lb = 0.0;
    int pairs = 0;
    for (int i = 0; i < n; i++) {
        pf += plain[i].fwd_us, pb += plain[i].bwd_us, sf += sinks[i].fwd_us, sb += sinks[i].bwd_us;
        const struct cost_attn_sample *w = &plain[i];
        for (int j = 0; w->window > 0 && j < n; j++) {
            const struct cost_attn_sample *c = &plain[j];
            if (c->window > 0 || c->seqs != w->seqs || c->seq != w->seq || c->heads != w->heads ||
                c->kv_heads != w->kv_heads || c->dqk != w->dqk || c->dv != w->dv)
                continue;
            /* the forward on the window's work against causal's; the backward's time against
             * the causal backward's (it does the causal work) */
            double r = attn_flops(w) / attn_flops(c);
            lf += log(r * c->fwd_us / w->fwd_us), lb += log(c->bwd_us / w->bwd_us), pairs++;
            break;
        }
    }
    /* each within (1e-3, 1]: what a profile may hold */
#define RATE(x) fmin(1.0, fmax(1e-3, (x)))
    cal->attn_sink_cudnn_fwd_eff = n > 0 && sf > 0 ? RATE(pf / sf) : 0.0;
    cal->attn_sink_cudnn_bwd_eff = n > 0 && sb > 0 ? RATE(pb / sb) : 0.0;
    cal->attn_window_cudnn_eff = pairs ? RATE(exp(lf / pairs)) : 0.0;
    cal->attn_window_bwd_cudnn_eff = pairs ? RATE(exp(lb / pairs)) : 0.0;
#undef RATE
}

/* Experts: for direction d and an m_half, the least-squares scale and fixed share. */
struct expert_fit {
    struct cost_calibration *cal;
    const struct topo_gpu_spec *gpu;
    const struct cost_expert_sample *s;
    int n, d;
};

static double expert_misfit(double half, void *ctx)
{
    struct expert_fit *f = ctx;
    double var[64], fixed[64], y[64];
    int n = f->n < 64 ? f->n : 64;
    f->cal->expert_m_half[f->d] = half;
    for (int i = 0; i < n; i++) {
        const struct cost_expert_sample *x = &f->s[i];
        double v[2], fx[2];
        cost_expert_parts(f->cal, f->gpu, x->tokens * x->top_k / x->experts, x->hidden, x->ffn,
                          COST_BF16, v, fx);
        var[i] = x->experts * v[f->d];
        fixed[i] = x->experts * fx[f->d];
        y[i] = f->d ? x->bwd_us : x->fwd_us;
    }
    return cost_fit_linear(var, fixed, y, n, &f->cal->expert_scale[f->d],
                           &f->cal->expert_fixed_share[f->d]);
}

void cost_fit_experts(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                      const struct cost_expert_sample *s, int n, double rms[2])
{
    rms[0] = rms[1] = 0.0;
    if (n < 1) return;
    for (int d = 0; d < 2; d++) {
        struct cost_calibration t = *cal;
        struct expert_fit f = {&t, gpu, s, n, d};
        double half = 0.0;
        search_half(expert_misfit, &f, 4.0, 48, &half); /* 4 to 16384 rows */
        rms[d] = expert_misfit(half, &f);
        cal->expert_m_half[d] = half;
        cal->expert_scale[d] = t.expert_scale[d];
        cal->expert_fixed_share[d] = t.expert_fixed_share[d];
    }
}

void cost_expert_block_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          enum cost_precision prec, const struct cost_expert_sample *s,
                          double us[2])
{
    cost_expert_us(cal, gpu, s->tokens * s->top_k / s->experts, s->hidden, s->ffn, prec, us);
    us[0] *= s->experts;
    us[1] *= s->experts;
}

/* rms relative error of the fp8 samples at rate `eff` of *rate, over the directions in dirs
 * (bit 0: forward, bit 1: backward) */
struct fp8_fit {
    struct cost_calibration *cal;
    const struct topo_gpu_spec *gpu;
    enum cost_precision prec;
    const struct cost_expert_sample *s;
    int n;
    double *rate; /* the field of cal being fitted */
    unsigned dirs;
};

static double fp8_misfit(double eff, const struct fp8_fit *f)
{
    *f->rate = eff;
    double sum = 0.0;
    int terms = 0;
    for (int i = 0; i < f->n; i++) {
        double us[2];
        cost_expert_block_us(f->cal, f->gpu, f->prec, &f->s[i], us);
        double a = us[0] / f->s[i].fwd_us - 1.0, b = us[1] / f->s[i].bwd_us - 1.0;
        if (f->dirs & 1u) sum += a * a, terms++;
        if (f->dirs & 2u) sum += b * b, terms++;
    }
    return sqrt(sum / terms);
}

/* The rate of f->rate that fits best: a scan of the fraction of the fp8 peak, then golden-section
 * refinement around the best; *f->rate left at it. */
static double fp8_fit_rate(const struct fp8_fit *f)
{
    double best = 0.05, err = fp8_misfit(best, f);
    for (double e = 0.05; e <= 1.0 + 1e-9; e += 0.01) {
        double x = fp8_misfit(e, f);
        if (x < err) err = x, best = e;
    }
    double lo = fmax(0.02, best - 0.01), hi = fmin(1.0, best + 0.01);
    const double gr = 0.5 * (sqrt(5.0) - 1.0);
    for (int it = 0; it < 40; it++) {
        double a = hi - gr * (hi - lo), b = lo + gr * (hi - lo);
        if (fp8_misfit(a, f) < fp8_misfit(b, f))
            hi = b;
        else
            lo = a;
    }
    best = 0.5 * (lo + hi);
    fp8_misfit(best, f);
    return best;
}

double cost_fit_fp8(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    enum cost_precision prec, const struct cost_expert_sample *s, int n)
{
    if (n < 1 || prec == COST_BF16) return 0.0;
    struct cost_calibration t = *cal;
    if (prec == COST_FP8_BLOCK) {
        struct fp8_fit f = {&t, gpu, prec, s, n, &t.gemm_eff_fp8_block, 3u};
        cal->gemm_eff_fp8_block = fp8_fit_rate(&f);
    } else { /* the forward's rate on the forward times, then the gradients' on the backward's */
        bool hopper = cost_fp8_fast_mode(gpu); /* elsewhere one rate */
        t.gemm_eff_fp8_grad = t.gemm_eff_fp8;
        struct fp8_fit f = {&t, gpu, prec, s, n, &t.gemm_eff_fp8, hopper ? 1u : 3u};
        cal->gemm_eff_fp8 = fp8_fit_rate(&f);
        cal->gemm_eff_fp8_grad = cal->gemm_eff_fp8;
        if (hopper) {
            struct fp8_fit g = {&t, gpu, prec, s, n, &t.gemm_eff_fp8_grad, 2u};
            cal->gemm_eff_fp8_grad = fp8_fit_rate(&g);
        }
    }
    t = *cal;
    struct fp8_fit all = {
        &t, gpu, prec, s, n, prec == COST_FP8_BLOCK ? &t.gemm_eff_fp8_block : &t.gemm_eff_fp8, 3u};
    return fp8_misfit(*all.rate, &all);
}

/* Whether the word w[0..len) is one of text's words (runs of letters and digits), case aside. */
/* The next word (a run of letters and digits) at or after *p: its start, *len its length (0 at
 * the end), *p moved past it. */
static const char *next_word(const char **p, size_t *len)
{
    const char *s = *p;
    while (*s && !isalnum((unsigned char)*s)) s++;
    const char *w = s;
    while (*s && isalnum((unsigned char)*s)) s++;
    *p = s;
    *len = (size_t)(s - w);
    return w;
}

static bool has_word(const char *text, const char *w, size_t len)
{
    size_t n;
    for (const char *p = text, *t; (t = next_word(&p, &n)), n;)
        if (n == len && !strncasecmp(t, w, len)) return true;
    return false;
}

bool cost_calibration_gpu_is(const char *profile_gpu, const char *spec_name)
{
    if (!profile_gpu[0]) return true;
    bool named = false;
    size_t n; /* each word of the spec's name is the device's */
    for (const char *p = spec_name, *w; (w = next_word(&p, &n)), n; named = true)
        if (!has_word(profile_gpu, w, n)) return false;
    /* the PCIe and NVL cards have their own clocks, power and HBM: a spec names them */
    static const char *const forms[] = {"PCIe", "NVL"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (has_word(profile_gpu, forms[i], strlen(forms[i])) &&
            !has_word(spec_name, forms[i], strlen(forms[i])))
            return false;
    return named;
}
