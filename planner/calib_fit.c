/*
 * calib_fit.c: calibration on the CPU side: the jobs that calibrate and validate run, what a
 * calibration measured (struct plan_calib_data, kept in the profile's "measured" so that
 * `moeplan calibrate --refit` fits it again on any machine, GPU or not), and the fits that turn
 * it into a profile: the microbenchmarks into the cost model's efficiencies (cost_fit_gemm,
 * cost_fit_attention, cost_fit_experts), then each phase's correction over the jobs
 * (cost_fit_linear: measured = scale x model + fixed per occurrence; the experts' phases
 * where a host floor fits them better, cost_fit_floor: measured = max(scale x model, local experts
 * x floor)). The measuring is the
 * executor's (calib.cu and the jobs' runs, driven by `moeplan calibrate` on a GPU).
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The calibration jobs: large and small experts (Mixtral's; 64 and 128 of DeepSeek-V2-Lite's), a
 * dense block, both attentions, hidden 4096 to 7168, sequences 1024 to 4096, full recompute. */
const struct plan_calib_job plan_calib_jobs[] = {
    {"mixtral-8x7b", 2, 0, 1024, 2, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"mixtral-8x7b", 3, 0, 4096, 1, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v2-lite", 3, 0, 1024, 2, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v2-lite", 2, 128, 2048, 1, 2, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v2-lite", 3, 0, 4096, 1, 1, COST_RECOMPUTE_FULL, 0, COST_BF16},
    {"kimi-k2", 2, 32, 2048, 1, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
};
const int plan_calib_njobs = (int)(sizeof plan_calib_jobs / sizeof plan_calib_jobs[0]);

/* The validation jobs: other models (Qwen3's QK-norm and 128-wide head dim over hidden 2048;
 * gpt-oss's sliding window, sinks, biases and 64-wide heads among them), depths, sequences,
 * micro-batching, recompute and skew; Mixtral's proxy in both fp8 recipes. */
const struct plan_calib_job plan_valid_jobs[] = {
    {"deepseek-v2-lite", 4, 0, 2048, 4, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"mixtral-8x7b", 4, 0, 4096, 1, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v2-lite", 3, 96, 2048, 2, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v2-lite", 4, 0, 4096, 2, 1, COST_RECOMPUTE_FULL, 0, COST_BF16},
    {"mixtral-8x7b", 2, 0, 2048, 2, 2, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"deepseek-v3", 4, 16, 2048, 1, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"mixtral-8x7b", 2, 16, 4096, 1, 2, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"kimi-k2", 2, 16, 1024, 4, 1, COST_RECOMPUTE_FULL, 0, COST_BF16},
    {"deepseek-v2-lite", 3, 0, 2048, 2, 1, COST_RECOMPUTE_NONE, 1.0, COST_BF16},
    {"qwen3-30b-a3b", 2, 32, 2048, 2, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"gpt-oss-20b", 2, 0, 2048, 2, 1, COST_RECOMPUTE_NONE, 0, COST_BF16},
    {"mixtral-8x7b", 2, 0, 4096, 2, 1, COST_RECOMPUTE_NONE, 0, COST_FP8},
    {"mixtral-8x7b", 2, 0, 4096, 2, 1, COST_RECOMPUTE_NONE, 0, COST_FP8_BLOCK},
};
const int plan_valid_njobs = (int)(sizeof plan_valid_jobs / sizeof plan_valid_jobs[0]);

void plan_calib_job_name(const struct plan_calib_job *j, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s L%d%s%.0d seq %d mbs %d x %d%s", j->model, j->layers,
                     j->experts ? " E" : "", j->experts, j->seq, j->mbs, j->micro,
                     j->recompute == COST_RECOMPUTE_FULL ? " recompute" : "");
    if (j->skew > 0 && n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - n, " skew %g", j->skew);
    if (j->precision != COST_BF16 && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - n, " %s", cost_precision_names[j->precision]);
}

/* The job's plan as plan_load gives it, with the cost model's prediction under cal. */
enum moe_status plan_calib_job_plan(const struct plan_calib_job *j, const char *model_dir,
                                    const struct topo_cluster *cl,
                                    const struct cost_calibration *cal,
                                    const struct cost_routing *routing, struct plan_file *p,
                                    struct moe_error *err)
{
    memset(p, 0, sizeof *p);
    struct mdl_overrides ov = {j->layers, j->experts};
    enum moe_status st = mdl_model_resolve(&p->model, j->model, model_dir, err);
    if (st == MOE_OK) st = mdl_model_override(&p->model, &ov, err);
    if (st != MOE_OK) return st;
    const struct mdl_model *m = &p->model;
    struct cost_layout *l = &p->layout;
    cost_layout_defaults(l, j->seq);
    l->zero = 0;
    l->mbs = j->mbs;
    l->gbs = j->mbs * j->micro;
    l->recompute = j->recompute;
    l->precision = j->precision;
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, m, cl, cal, 1);
    ctx.routing = routing;
    struct cost_result r;
    if ((st = cost_evaluate(&ctx, l, &r, err))) return st;
    p->gpus = 1;
    p->micro_batches = j->micro;
    snprintf(p->gpu, sizeof p->gpu, "%s", cl->gpu.name);
    p->step_us = r.step_us;
    p->model_tflops_per_gpu = r.model_tflops_per_gpu;
    p->mfu = r.mfu;
    memcpy(p->phase_us, r.exposed_us, sizeof p->phase_us);
    p->buffer_factor = 2.0;
    p->rank = calloc(1, sizeof *p->rank);
    p->stage_layers = malloc(sizeof *p->stage_layers);
    p->placement = malloc(sizeof *p->placement * (size_t)m->layers * (m->moe.experts + 1));
    if (!p->rank || !p->stage_layers || !p->placement)
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    p->stage_layers[0] = m->layers;
    for (int b = 0; b < m->layers; b++)
        for (int e = 0; e < m->moe.experts; e++)
            p->placement[b * m->moe.experts + e] = mdl_layer_is_moe(m, b) ? 0 : -1;
    return MOE_OK;
}

/* How often the cost model counts phase p in a step of job p: the blocks that have it times the
 * micro-batches (a block's forward twice with full recompute); once a micro-batch for the
 * embedding, head and loss; once for the optimizer. */
static double occurrences(const struct plan_file *p, int ph)
{
    const struct mdl_model *m = &p->model;
    int moe = 0, dense = 0;
    for (int b = 0; b < m->layers; b++) mdl_layer_is_moe(m, b) ? moe++ : dense++;
    double mb = p->micro_batches;
    double fwd = p->layout.recompute == COST_RECOMPUTE_FULL ? 2.0 * mb : mb;
    switch (ph) {
    case COST_ATTN_FWD: return (moe + dense) * fwd;
    case COST_ATTN_BWD: return (moe + dense) * mb;
    case COST_EXPERTS_BWD: return moe * mb;
    case COST_ROUTER:
    case COST_PERMUTE:
    case COST_UNPERMUTE:
    case COST_EXPERTS_FWD: return moe * fwd;
    case COST_SHARED_EXPERT: return m->moe.shared_experts ? moe * fwd : 0.0;
    case COST_DENSE_FFN: return dense * fwd;
    case COST_EMBED:
    case COST_LM_HEAD:
    case COST_LOSS: return mb;
    case COST_OPTIMIZER: return 1.0;
    default: return 0.0;
    }
}

static json_t *num_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* "mixtral-8x7b L2 E16 seq 1024 mbs 2 x 1 recompute" (job_name's form) back into a job. */
static bool job_parse(const char *name, struct plan_calib_job *j, char *model, size_t cap)
{
    char m[64];
    int n = 0;
    memset(j, 0, sizeof *j);
    if (sscanf(name, "%63s L%d%n", m, &j->layers, &n) != 2) return false;
    const char *r = name + n;
    if (sscanf(r, " E%d%n", &j->experts, &n) == 1) r += n;
    if (sscanf(r, " seq %d mbs %d x %d%n", &j->seq, &j->mbs, &j->micro, &n) != 3) return false;
    j->recompute = strstr(r + n, "recompute") ? COST_RECOMPUTE_FULL : COST_RECOMPUTE_NONE;
    const char *sk = strstr(r + n, " skew ");
    if (sk && sscanf(sk, " skew %lf", &j->skew) != 1) return false;
    const char *last = strrchr(name, ' ');
    for (int q = COST_FP8; last && cost_precision_names[q]; q++)
        if (!strcmp(last + 1, cost_precision_names[q])) j->precision = (enum cost_precision)q;
    snprintf(model, cap, "%s", m);
    j->model = model;
    return j->layers > 0 && j->seq > 0 && j->mbs > 0 && j->micro > 0;
}

/* Row i of arr: n positive finite numbers (column zero_col, >= 0: zero or positive). */
static enum moe_status number_row(const struct moe_jval *arr, size_t i, double *v, int n,
                                  int zero_col, struct moe_error *err)
{
    json_t *row = json_array_get(arr->json, i);
    if (!json_is_array(row) || (int)json_array_size(row) != n)
        return moe_jval_error(arr, NULL, err, "entry %zu: a list of %d numbers", i, n);
    for (int k = 0; k < n; k++) {
        json_t *x = json_array_get(row, (size_t)k);
        v[k] = json_is_number(x) ? json_number_value(x) : -1;
        if (k == zero_col ? !(v[k] >= 0 && v[k] < 1e12) : !(v[k] > 0 && v[k] < 1e12))
            return moe_jval_error(arr, NULL, err, "entry %zu, number %d: %s and finite", i, k,
                                  k == zero_col ? "zero or positive" : "positive");
    }
    return MOE_OK;
}

/* An array of measurements longer than this build keeps: refused, not cut short. */
static enum moe_status at_most(const struct moe_jval *arr, size_t max, struct moe_error *err)
{
    size_t n = moe_jval_len(arr);
    if (n <= max) return MOE_OK;
    return moe_jval_error(arr, NULL, err, "%zu entries: this build keeps at most %zu", n, max);
}

/* A profile's "measured" back into the data (--refit). */
enum moe_status plan_calib_data_load(const char *file, struct plan_calib_data *d,
                                     struct moe_error *err)
{
    struct moe_jdoc doc;
    struct moe_jval root, m, arr, lib;
    memset(d, 0, sizeof *d);
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    bool have_lib = false;
    if ((st = moe_jdoc_root(&doc, &root, err))) goto done;
    if (!moe_jval_has(&root, "measured") && moe_jval_has(&root, "stack")) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                              "a stack profile, fitted on published runs: it keeps no "
                              "measurements to fit again (calibrate --published fits it)");
        goto done;
    }
    if ((st = moe_jval_str(&root, "gpu", true, NULL, d->gpu, sizeof d->gpu, err)) ||
        (st = moe_jval_str(&root, "driver", false, "?", d->driver, sizeof d->driver, err)) ||
        (st = moe_jval_str(&root, "date", false, "?", d->date, sizeof d->date, err)) ||
        (st = moe_jval_object(&root, "libraries", false, &lib, &have_lib, err)) ||
        (st = moe_jval_object(&root, "measured", true, &m, NULL, err)) ||
        (st = moe_jval_num(&m, "launch_us", true, 0, 0, 1e4, &d->launch_us, err)) ||
        (st = moe_jval_num(&m, "copy_1gib_us", true, 0, 1, 1e9, &d->copy_us, err)))
        goto done;
    if (have_lib &&
        ((st = moe_jval_str(&lib, "cuda_runtime", false, "?", d->cuda, sizeof d->cuda, err)) ||
         (st = moe_jval_str(&lib, "cublas", false, "?", d->cublas, sizeof d->cublas, err)) ||
         (st = moe_jval_str(&lib, "nccl", false, "?", d->nccl, sizeof d->nccl, err)) ||
         (st = moe_jval_str(&lib, "attention", false, "own", d->attention, sizeof d->attention,
                            err))))
        goto done;
    if (!have_lib) snprintf(d->attention, sizeof d->attention, "own");
    d->copy_bytes = 1073741824.0;
    if ((st = moe_jval_array(&m, "gemm_m_n_k_us", true, &arr, NULL, err)) ||
        (st = at_most(&arr, PLAN_CALIB_MAX_GEMMS, err)))
        goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->ngemm < PLAN_CALIB_MAX_GEMMS; i++) {
        double v[4];
        if ((st = number_row(&arr, i, v, 4, -1, err))) goto done;
        d->gemm[d->ngemm++] = (struct cost_gemm_sample){v[0], v[1], v[2], v[3]};
    }
    /* profiles before sliding-window shapes were measured keep eight columns, no window */
    bool have_attn = false;
    if ((st = moe_jval_array(&m, PLAN_CALIB_ATTN_KEY, false, &arr, &have_attn, err))) goto done;
    if (!have_attn && (st = moe_jval_array(&m, "attention_seqs_seq_h_kv_dqk_dv_fwd_bwd_us", true,
                                           &arr, NULL, err)))
        goto done;
    if ((st = at_most(&arr, PLAN_CALIB_MAX_ATTN, err))) goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->nattn < PLAN_CALIB_MAX_ATTN; i++, d->nattn++) {
        double *r = d->attn[d->nattn], v[PLAN_CALIB_ATTN_COLS];
        if ((st = number_row(&arr, i, v, have_attn ? PLAN_CALIB_ATTN_COLS : 8, have_attn ? 6 : -1,
                             err)))
            goto done;
        memcpy(r, v, sizeof(double) * 6);
        r[6] = have_attn ? v[6] : 0.0;
        r[7] = v[have_attn ? 7 : 6];
        r[8] = v[have_attn ? 8 : 7];
    }
    bool have_sink = false; /* profiles before sinks were measured, or of a build without cuDNN */
    if ((st = moe_jval_array(&m, PLAN_CALIB_SINK_KEY, false, &arr, &have_sink, err)) ||
        (have_sink && (st = at_most(&arr, PLAN_CALIB_MAX_SINK, err))))
        goto done;
    for (size_t i = 0; have_sink && i < moe_jval_len(&arr) && d->nsink < PLAN_CALIB_MAX_SINK;
         i++, d->nsink++)
        if ((st = number_row(&arr, i, d->sink[d->nsink], PLAN_CALIB_SINK_COLS, 6, err))) goto done;
    bool have_ex = false; /* profiles before the expert benchmark have none */
    if ((st = moe_jval_array(&m, PLAN_CALIB_EXPERT_KEY, false, &arr, &have_ex, err)) ||
        (have_ex && (st = at_most(&arr, PLAN_CALIB_MAX_EXPERTS, err))))
        goto done;
    for (size_t i = 0; have_ex && i < moe_jval_len(&arr) && d->nexpert < PLAN_CALIB_MAX_EXPERTS;
         i++, d->nexpert++)
        if ((st = number_row(&arr, i, d->expert[d->nexpert], PLAN_CALIB_EXPERT_COLS, -1, err)))
            goto done;
    bool have8 = false; /* profiles of GPUs without fp8, or before fp8 training, have none */
    if ((st = moe_jval_array(&m, PLAN_CALIB_FP8_KEY, false, &arr, &have8, err)) ||
        (have8 && (st = at_most(&arr, PLAN_CALIB_MAX_EXPERTS, err))))
        goto done;
    for (size_t i = 0; have8 && i < moe_jval_len(&arr) && d->nexpert8 < PLAN_CALIB_MAX_EXPERTS;
         i++, d->nexpert8++) {
        double *v = d->expert8[d->nexpert8];
        if ((st = number_row(&arr, i, v, PLAN_CALIB_FP8_COLS, -1, err))) goto done;
        if (v[0] != COST_FP8 && v[0] != COST_FP8_BLOCK) {
            st = moe_jval_error(&arr, NULL, err,
                                "entry %zu: precision %g is not an fp8 recipe (%d: fp8, %d: "
                                "fp8block)",
                                i, v[0], (int)COST_FP8, (int)COST_FP8_BLOCK);
            goto done;
        }
    }
    /* the keys this build writes, and the phases' order the jobs' arrays follow: a profile with
     * another order (another build's) is refused, not read into the wrong phases */
    static const char *const measured_keys[] = {
        "launch_us",         "copy_1gib_us",
        "gemm_m_n_k_us",     "gemm_fit_rms",
        PLAN_CALIB_ATTN_KEY, "attention_seqs_seq_h_kv_dqk_dv_fwd_bwd_us",
        PLAN_CALIB_SINK_KEY, PLAN_CALIB_EXPERT_KEY,
        PLAN_CALIB_FP8_KEY,  "jobs",
        "phase_order",       NULL};
    if ((st = moe_jval_keys(&m, measured_keys, err))) goto done;
    bool have_order = false;
    if ((st = moe_jval_array(&m, "phase_order", false, &arr, &have_order, err))) goto done;
    for (int k = 0; have_order && k < COST_NPHASES; k++) {
        const char *name = (size_t)k < moe_jval_len(&arr)
                               ? json_string_value(json_array_get(arr.json, (size_t)k))
                               : NULL;
        if (moe_jval_len(&arr) != COST_NPHASES || !name || strcmp(name, cost_phase_names[k])) {
            st = moe_jval_error(&m, "phase_order", err,
                                "not this build's %d phases in order (%s, %s, ...): the jobs' "
                                "times would land in other phases",
                                COST_NPHASES, cost_phase_names[0], cost_phase_names[1]);
            goto done;
        }
    }
    if ((st = moe_jval_array(&m, "jobs", true, &arr, NULL, err)) ||
        (st = at_most(&arr, PLAN_CALIB_MAX_JOBS, err)))
        goto done;
    for (size_t i = 0; i < moe_jval_len(&arr) && d->njobs < PLAN_CALIB_MAX_JOBS; i++) {
        struct moe_jval jo, ph;
        char name[128];
        int n = d->njobs;
        if ((st = moe_jval_at_object(&arr, i, &jo, err)) ||
            (st = moe_jval_str(&jo, "job", true, NULL, name, sizeof name, err)) ||
            (st = moe_jval_array(&jo, "measured_phases_us", true, &ph, NULL, err)))
            goto done;
        if (!job_parse(name, &d->job[n], d->model[n], sizeof d->model[n]) ||
            (int)moe_jval_len(&ph) != COST_NPHASES) {
            st = moe_jval_error(&jo, "job", err, "\"%s\": not a calibration job of this build",
                                name);
            goto done;
        }
        for (int k = 0; k < COST_NPHASES; k++)
            if ((st = moe_jval_at_num(&ph, (size_t)k, 0, 1e12, &d->got[n][k], err))) goto done;
        d->njobs++;
    }
done:
    moe_jdoc_free(&doc);
    return st;
}

/* Flash attention: efficiency x seq / (seq + attn_seq_half) of the bf16 peak
 * (cost_fit_attention). */
static void fit_attention(const struct topo_gpu_spec *g, const struct plan_calib_data *d,
                          struct cost_calibration *cal, FILE *log)
{
    struct cost_attn_sample s[PLAN_CALIB_MAX_ATTN];
    for (int i = 0; i < d->nattn; i++) {
        const double *a = d->attn[i];
        s[i] = (struct cost_attn_sample){a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]};
    }
    double e = cost_fit_attention(cal, g, s, d->nattn);
    fprintf(log,
            "  %d attention shapes: attn_fwd_eff %.3f, attn_bwd_eff %.3f at long sequences, x %.3f "
            "for heads wider than 128, x %.3f for a sliding window, half of it at %.0f tokens, "
            "exponentials' scale %.2f; rms error %.1f%%\n",
            d->nattn, cal->attn_fwd_eff, cal->attn_bwd_eff, cal->attn_wide_eff,
            cal->attn_window_eff, cal->attn_seq_half, cal->attn_exp_scale, 100 * e);
}

/* Transformer Engine's attention: cuDNN's graph on gpt-oss's shapes without and with sinks
 * (cost_fit_te_attention). */
static void fit_sinks(const struct plan_calib_data *d, struct cost_calibration *cal, json_t *meas,
                      FILE *log)
{
    if (!d->nsink) {
        fprintf(log, "  no attention with sinks measured (no cuDNN, a cuDNN before 9.13, --quick "
                     "or an older profile): Transformer Engine's window and sink rates not "
                     "measured\n");
        return;
    }
    json_t *js = json_array();
    struct cost_attn_sample plain[PLAN_CALIB_MAX_SINK], sinks[PLAN_CALIB_MAX_SINK];
    for (int i = 0; i < d->nsink; i++) {
        const double *r = d->sink[i];
        json_array_append_new(js, num_array(r, PLAN_CALIB_SINK_COLS));
        plain[i] = (struct cost_attn_sample){r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8]};
        sinks[i] = plain[i], sinks[i].fwd_us = r[9], sinks[i].bwd_us = r[10];
        fprintf(log,
                "    %.0f x %.0f tokens, %.0f / %.0f heads of %.0f, window %.0f: forward %.1f -> "
                "%.1f us, backward %.1f -> %.1f us with sinks\n",
                r[0], r[1], r[2], r[3], r[4], r[6], r[7], r[9], r[8], r[10]);
    }
    json_object_set_new(meas, PLAN_CALIB_SINK_KEY, js);
    cost_fit_te_attention(cal, plain, sinks, d->nsink);
    fprintf(log,
            "  %d attention shapes in cuDNN's graph both ways, as Transformer Engine runs them: "
            "with sinks forward %.3f and backward %.3f of the plain graph's rate "
            "(attn_sink_cudnn_fwd_eff, _bwd_eff); a sliding window's forward %.3f of causal "
            "attention's rate on the window's work (attn_window_cudnn_eff), its backward %.3f of "
            "the causal backward's (attn_window_bwd_cudnn_eff: it does the causal work)\n",
            d->nsink, cal->attn_sink_cudnn_fwd_eff, cal->attn_sink_cudnn_bwd_eff,
            cal->attn_window_cudnn_eff, cal->attn_window_bwd_cudnn_eff);
}

/* The expert block's correction over the benchmark's shapes (cost_fit_experts). */
static void fit_experts(const struct topo_gpu_spec *g, const struct plan_calib_data *d,
                        struct cost_calibration *cal, json_t *meas, FILE *log)
{
    if (!d->nexpert) {
        fprintf(log,
                "  no expert-block measurements (an older profile): the expert correction stays "
                "1 and 1\n");
        return;
    }
    struct cost_expert_sample s[PLAN_CALIB_MAX_EXPERTS];
    json_t *je = json_array();
    for (int i = 0; i < d->nexpert; i++) {
        const double *x = d->expert[i];
        s[i] = (struct cost_expert_sample){x[0], x[1], x[2], x[3], x[4], x[5], x[6]};
        json_array_append_new(je, num_array(x, PLAN_CALIB_EXPERT_COLS));
    }
    json_object_set_new(meas, PLAN_CALIB_EXPERT_KEY, je);
    double rms[2];
    cost_fit_experts(cal, g, s, d->nexpert, rms);
    fprintf(log,
            "  %d expert blocks (the executor's, uniform routing), measured = scale x model + "
            "fixed_share x its fixed time:\n",
            d->nexpert);
    for (int b = 0; b < 2; b++)
        fprintf(log, "    %-8s scale %.3f  fixed_share %.3f  m_half %.0f rows  rms %.1f%%\n",
                b ? "backward" : "forward", cal->expert_scale[b], cal->expert_fixed_share[b],
                cal->expert_m_half[b], 100 * rms[b]);
    for (int i = 0; i < d->nexpert; i++) {
        const double *x = d->expert[i];
        double us[2];
        cost_expert_us(cal, g, x[4] * x[1] / x[0], x[2], x[3], false, us);
        fprintf(log,
                "    E %3.0f top-%.0f h %5.0f f %5.0f, %5.0f tokens: fwd %8.1f us (fit %8.1f), "
                "bwd %8.1f us (fit %8.1f)\n",
                x[0], x[1], x[2], x[3], x[4], x[5], x[0] * us[0], x[6], x[0] * us[1]);
    }
}

/* The fp8 GEMM rates over the fp8 expert blocks, recipe by recipe (cost_fit_fp8), after the
 * bf16 expert correction; true when any recipe was fitted. */
static bool fit_fp8(const struct topo_gpu_spec *g, const struct plan_calib_data *d,
                    struct cost_calibration *cal, json_t *meas, FILE *log)
{
    if (!d->nexpert8) {
        fprintf(log,
                "  no fp8 expert blocks (a GPU without fp8, or an older profile): "
                "gemm_eff_fp8, gemm_eff_fp8_grad and gemm_eff_fp8_block stay the datasheet's\n");
        return false;
    }
    json_t *j8 = json_array();
    for (int i = 0; i < d->nexpert8; i++)
        json_array_append_new(j8, num_array(d->expert8[i], PLAN_CALIB_FP8_COLS));
    json_object_set_new(meas, PLAN_CALIB_FP8_KEY, j8);
    static const enum cost_precision recipes[] = {COST_FP8, COST_FP8_BLOCK};
    bool fitted = false;
    for (int r = 0; r < 2; r++) {
        struct cost_expert_sample s[PLAN_CALIB_MAX_EXPERTS];
        int n = 0;
        for (int i = 0; i < d->nexpert8; i++) {
            const double *x = d->expert8[i];
            if (x[0] == recipes[r])
                s[n++] = (struct cost_expert_sample){x[1], x[2], x[3], x[4], x[5], x[6], x[7]};
        }
        if (!n) continue;
        double rms = cost_fit_fp8(cal, g, recipes[r], s, n);
        fitted = true;
        if (recipes[r] == COST_FP8)
            fprintf(log,
                    "  %d fp8 expert blocks (%s): gemm_eff_fp8 %.3f of the fp8 peak (forward, fast "
                    "accumulation), gemm_eff_fp8_grad %.3f (gradients, split); rms %.1f%%%s\n",
                    n, cost_precision_names[recipes[r]], cal->gemm_eff_fp8, cal->gemm_eff_fp8_grad,
                    100 * rms,
                    cal->gemm_eff_fp8 > 0.999 || cal->gemm_eff_fp8_grad > 0.999
                        ? "; at the bound of the peak: the block's other terms are charged above "
                          "what ran"
                        : "");
        else
            fprintf(log,
                    "  %d fp8 expert blocks (%s): gemm_eff_fp8_block %.3f of the fp8 peak; rms "
                    "%.1f%%\n",
                    n, cost_precision_names[recipes[r]], cal->gemm_eff_fp8_block, 100 * rms);
        for (int i = 0; i < n; i++) {
            double us[2];
            cost_expert_block_us(cal, g, recipes[r], &s[i], us);
            fprintf(log,
                    "    E %3.0f top-%.0f h %5.0f f %5.0f, %5.0f tokens: fwd %8.1f us (fit %8.1f), "
                    "bwd %8.1f us (fit %8.1f)\n",
                    s[i].experts, s[i].top_k, s[i].hidden, s[i].ffn, s[i].tokens, s[i].fwd_us,
                    us[0], s[i].bwd_us, us[1]);
        }
    }
    /* a profile with per-tensor blocks only: the block recipe at per-tensor's gradient rate
     * (its GEMMs have no fast mode either) */
    bool block = false;
    for (int i = 0; i < d->nexpert8; i++) block |= d->expert8[i][0] == COST_FP8_BLOCK;
    if (!block) cal->gemm_eff_fp8_block = cal->gemm_eff_fp8_grad;
    return fitted;
}

/* The fits, on any machine: the microbenchmarks into the efficiencies, then each phase's
 * correction over the jobs; meas receives the numbers the profile keeps. */
static enum moe_status fit(const char *model_dir, const struct topo_cluster *cl,
                           const struct plan_calib_data *d, struct cost_calibration *cal,
                           json_t *meas, FILE *log, struct moe_error *err)
{
    const struct topo_gpu_spec *g = &cl->gpu;
    cost_calibration_defaults(cal, g);
    cal->launch_us = d->launch_us;
    cal->hbm_eff = fmin(1.0, 2.0 * d->copy_bytes / (d->copy_us * 1e-6) / g->hbm_bytes_per_s);
    fprintf(
        log,
        "  launch %.2f us a kernel; copy of 1 GiB %.0f us: %.2f TB/s read + write, hbm_eff %.3f\n",
        d->launch_us, d->copy_us, 2.0 * d->copy_bytes / (d->copy_us * 1e-6) / 1e12, cal->hbm_eff);
    json_object_set_new(meas, "launch_us", json_real(d->launch_us));
    json_object_set_new(meas, "copy_1gib_us", json_real(d->copy_us));
    double rms = cost_fit_gemm(cal, g, d->gemm, d->ngemm);
    cal->expert_m_half[0] = cal->expert_m_half[1] = cal->gemm_m_half; /* until fit_experts */
    struct cost_calibration roof = *cal;            /* the roofline alone, for the log */
    cost_gemm_table_set(cal, g, d->gemm, d->ngemm); /* what every later fit costs GEMMs with */
    fprintf(
        log,
        "  %d GEMMs: gemm_eff %.3f, m_half %.1f rows, k_half %.1f, fixed %.1f us; fit rms error "
        "%.1f%%\n",
        d->ngemm, cal->gemm_eff, cal->gemm_m_half, cal->gemm_k_half, cal->gemm_fixed_us, 100 * rms);
    json_t *jg = json_array();
    for (int i = 0; i < d->ngemm; i++) {
        const struct cost_gemm_sample *x = &d->gemm[i];
        double v[4] = {x->m, x->n, x->k, x->us};
        json_array_append_new(jg, num_array(v, 4));
        fprintf(log,
                "    GEMM %6.0f x %6.0f x %6.0f: %9.1f us, %6.1f TFLOPS; the roofline %9.1f us\n",
                x->m, x->n, x->k, x->us, 2e-6 * x->m * x->n * x->k / x->us,
                cost_gemm_us(&roof, g, x->m, x->n, x->k, COST_BF16));
    }
    json_object_set_new(meas, "gemm_m_n_k_us", jg);
    json_object_set_new(meas, "gemm_fit_rms", json_real(rms));
    json_t *ja = json_array();
    for (int i = 0; i < d->nattn; i++)
        json_array_append_new(ja, num_array(d->attn[i], PLAN_CALIB_ATTN_COLS));
    fit_attention(g, d, cal, log);
    json_object_set_new(meas, PLAN_CALIB_ATTN_KEY, ja);
    fit_sinks(d, cal, meas, log);
    fit_experts(g, d, cal, meas, log);
    fit_fp8(g, d, cal, meas, log);
    /* the jobs: their predictions under the fitted efficiencies, then each phase's correction */
    double model[PLAN_CALIB_MAX_JOBS][COST_NPHASES], count[PLAN_CALIB_MAX_JOBS][COST_NPHASES];
    double experts[PLAN_CALIB_MAX_JOBS]; /* each job's routed experts (one GPU: all local) */
    json_t *jj = json_array();
    for (int i = 0; i < d->njobs; i++) {
        struct plan_file p;
        char name[128];
        plan_calib_job_name(&d->job[i], name, sizeof name);
        enum moe_status st = plan_calib_job_plan(&d->job[i], model_dir, cl, cal, NULL, &p, err);
        experts[i] = p.model.moe.experts;
        for (int ph = 0; st == MOE_OK && ph < COST_NPHASES; ph++) {
            model[i][ph] = p.phase_us[ph];
            count[i][ph] = occurrences(&p, ph);
        }
        if (st == MOE_OK)
            fprintf(log, "  job %d, %s: step %.1f ms, %.1f ms predicted before the phase fit\n",
                    i + 1, name, d->got[i][COST_STEP] / 1e3, p.step_us / 1e3);
        plan_file_free(&p);
        if (st != MOE_OK) {
            json_decref(jj);
            return st;
        }
        json_t *o = json_object();
        json_object_set_new(o, "job", json_string(name));
        json_object_set_new(o, "measured_phases_us", num_array(d->got[i], COST_NPHASES));
        json_object_set_new(o, "model_phases_us", num_array(model[i], COST_NPHASES));
        json_array_append_new(jj, o);
    }
    json_object_set_new(meas, "jobs", jj);
    json_t *jp = json_array();
    for (int ph = 0; ph < COST_NPHASES; ph++)
        json_array_append_new(jp, json_string(cost_phase_names[ph]));
    json_object_set_new(meas, "phase_order", jp);
    fprintf(
        log,
        "  per-phase fit over the %d jobs (measured = scale x model + fixed per occurrence; the "
        "experts' that or max(scale x model, local experts x floor), whichever fits better):\n",
        d->njobs);
    for (int ph = 0; ph < COST_NPHASES; ph++) {
        double m[PLAN_CALIB_MAX_JOBS], c[PLAN_CALIB_MAX_JOBS], y[PLAN_CALIB_MAX_JOBS], any = 0;
        for (int i = 0; i < d->njobs; i++) {
            m[i] = model[i][ph];
            c[i] = count[i][ph];
            y[i] = d->got[i][ph];
            any += c[i] * y[i];
        }
        if (any <= 0) continue;
        double sc, fx, e = cost_fit_linear(m, c, y, d->njobs, &sc, &fx);
        if (ph == COST_EXPERTS_FWD || ph == COST_EXPERTS_BWD) { /* or a host floor, no fixed time */
            double x[PLAN_CALIB_MAX_JOBS], fs, fl;
            for (int i = 0; i < d->njobs; i++) x[i] = c[i] * experts[i];
            bool edge = false;
            double ef = cost_fit_floor(m, x, y, d->njobs, &fs, &fl, &edge);
            fprintf(log,
                    "    %-14s scale %6.3f  floor %8.1f us an expert  rms %5.1f%%%s (fixed time "
                    "instead: rms %.1f%%)%s\n",
                    cost_phase_names[ph], fs, fl, 100 * ef, edge ? " at the search's edge" : "",
                    100 * e, ef < e ? "" : ": the fixed time kept");
            if (ef < e) {
                cal->phase_scale[ph] = fs;
                cal->phase_floor_us[ph] = fl;
                continue;
            }
        }
        cal->phase_scale[ph] = sc;
        cal->phase_fixed_us[ph] = fx;
        fprintf(log, "    %-14s scale %6.3f  fixed %8.1f us  rms %5.1f%%\n", cost_phase_names[ph],
                sc, fx, 100 * e);
    }
    return MOE_OK;
}

enum moe_status plan_calib_fit_save(const struct plan_calib_data *d, const struct topo_cluster *cl,
                                    const char *model_dir, const char *how, const char *file,
                                    FILE *log, struct moe_error *err)
{
    struct cost_calibration cal;
    json_t *meas = json_object(), *meta = NULL;
    if (!meas) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    enum moe_status st = fit(model_dir, cl, d, &cal, meas, log, err);
    if (st == MOE_OK) {
        static const char *const defaults[] = {
            "nvlink_eff (one GPU: no NVLink)", "nvlink_allreduce_eff (one GPU)",
            "scale_out_eff (no network)",      "a2a_latency_us (one GPU)",
            "overlap_max (one GPU)",           "gemm_tile_m, gemm_tile_n"};
        json_t *dflt = json_array();
        if (!d->nexpert8)
            json_array_append_new(dflt, json_string("gemm_eff_fp8, gemm_eff_fp8_grad, "
                                                    "gemm_eff_fp8_block (no fp8 "
                                                    "expert blocks measured)"));
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            json_array_append_new(dflt, json_string(defaults[i]));
        meta = json_pack("{s:s, s:s, s:s, s:{s:s, s:s, s:s, s:s}, s:o, s:o, s:s}", "gpu", d->gpu,
                         "driver", d->driver, "date", d->date, "libraries", "cuda_runtime", d->cuda,
                         "cublas", d->cublas, "nccl", d->nccl, "attention",
                         d->attention[0] ? d->attention : "own", "defaults_used", dflt, "measured",
                         meas, "fit", how);
        meas = NULL; /* json_pack's "o" took it, and dflt */
        st = !meta  ? moe_error_set(err, MOE_ERR_NOMEM, "out of memory")
             : file ? cost_calibration_write(&cal, meta, file, err)
                    : MOE_OK; /* a check: fitted, not written */
    }
    json_decref(meas);
    json_decref(meta);
    return st;
}
