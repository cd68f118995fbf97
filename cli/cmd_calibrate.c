/*
 * cmd_calibrate.c: `moeplan calibrate`: on a GPU, the measurements (cmd_validate.c, CUDA builds)
 * fitted into a profile; anywhere, `--refit PROFILE` fits a profile's kept measurements again
 * (planner/calib_fit.c). One GPU cannot measure NVLink or the network: the profile names those
 * values as datasheet defaults. `--published FILE --stack NAME --cluster C` fits a stack profile
 * to published runs instead (planner/published.c): first every system of the stack's containers
 * together, then the cluster's own rows pulled towards that shared fit.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "cli.h"
#include "plan.h"
#include "rpt.h"

enum {
    OPT_QUICK = 1,
    OPT_CAL,
    OPT_CLUSTER,
    OPT_STEPS,
    OPT_REFIT,
    OPT_PUBLISHED,
    OPT_STACK,
    OPT_CV,
    OPT_SVG,
    OPT_MEASURED,
    OPT_OUT = 'o'
};

const struct cli_opt cmd_calibrate_opts[] = {
    {"output", required_argument, OPT_OUT, "FILE", "write the profile here (calibration.json)",
     CLI_OUT_FILE},
    {"quick", no_argument, OPT_QUICK, NULL, "fewer shapes and steps (about a minute)", CLI_PLAIN},
    {"cluster", required_argument, OPT_CLUSTER, "C",
     "the cluster this GPU belongs to (the GPU's own: H200 h200-vm, H100 hgx-h100-x128)",
     CLI_PLAIN},
    {"refit", required_argument, OPT_REFIT, "PROFILE",
     "no GPU needed: fit again the measurements a profile keeps (after a change of the model)",
     CLI_PLAIN},
    {"published", required_argument, OPT_PUBLISHED, "FILE",
     "no GPU needed: fit a stack profile for --cluster to published runs (their format: "
     "tests/data/published/mb-runs.tsv)",
     CLI_PLAIN},
    {"stack", required_argument, OPT_STACK, "NAME",
     "with --published: the software stack, exactly as named: megatron-26.04 is the rows of "
     "containers 26.04 and 26.04.xx",
     CLI_PLAIN},
    {"cross-validate", no_argument, OPT_CV, NULL,
     "with --published and --stack: leave one model out and one system out, each row predicted "
     "by the profile fitted without it (no profile written)",
     CLI_PLAIN},
    {"svg", required_argument, OPT_SVG, "FILE",
     "with --cross-validate: the chart of predicted against published tokens/s/GPU", CLI_OUT_FILE},
    {"measured", required_argument, OPT_MEASURED, "PROFILE",
     "with --published: the GPU profile whose measured compute (GEMMs, attention, HBM) every row "
     "keeps (default: each GPU's shipped one, " PLAN_MEASURED_DIR "/<gpu>.json, where there is "
     "one, else " PLAN_MEASURED_PROFILE ")",
     CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

static int calibrate(struct cli *cli, const struct cli_cmd *cmd, const char *out, bool quick,
                     const char *cluster, const char *refit)
{
    struct moe_error err;
    struct topo_cluster cl;
    struct plan_calib_data *d = calloc(1, sizeof *d);
    char mdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    enum moe_status st = d ? MOE_OK : moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK && refit) {
        printf("moeplan calibrate --refit %s: the measurements kept there, fitted again\n", refit);
        /* the profile whole, as check reads it: a value it refuses is not refitted past */
        struct cost_calibration whole;
        cost_calibration_defaults(&whole, NULL);
        st = cost_calibration_load(&whole, refit, &err);
        if (st == MOE_OK) st = plan_calib_data_load(refit, d, &err);
        if (st == MOE_OK) st = cli_gpu_cluster_load(cli, d->gpu, cluster, NULL, &cl, NULL, &err);
        if (st == MOE_OK)
            printf("  %s, on %s's datasheet (%s: %.0f bf16 TFLOPS, %.2f TB/s HBM)\n",
                   d->gpu[0] ? d->gpu : "(no GPU named)", cl.name, cl.gpu.name, cl.gpu.bf16_tflops,
                   cl.gpu.hbm_bytes_per_s / 1e12);
    } else if (st == MOE_OK) {
#ifdef MOEPLAN_HAVE_EXECUTOR
        if (!cli_output_ok(cmd, "-o", out)) { /* before minutes of measuring, and again after */
            free(d);
            return 2;
        }
        st = cli_calibrate_measure(cli, cluster, quick, &cl, d, &err);
#else
        (void)quick;
        int rc = cli_gpu_exec(cli); /* the measurements are the GPU part's */
        if (rc >= 0) {
            free(d);
            return rc;
        }
        st = moe_error_set(&err, MOE_ERR_UNSUPPORTED,
                           "calibrate needs a CUDA build to measure a GPU; --refit PROFILE fits "
                           "a profile's measurements again in this build");
#endif
    }
    if (st == MOE_OK && !cli_output_ok(cmd, "-o", out)) {
        free(d);
        return 2;
    }
    if (st == MOE_OK)
        st = plan_calib_fit_save(d, &cl, mdir,
                                 refit      ? "moeplan calibrate --refit"
                                 : d->quick ? "moeplan calibrate --quick"
                                            : "moeplan calibrate",
                                 out, stdout, &err);
    bool fp8 = d && d->nexpert8 > 0; /* else the fp8 rates stay the datasheet's too */
    free(d);
    if (st != MOE_OK) return cli_fail(cli, &err);
    printf("profile written to %s (%s: datasheet defaults)\n",
           strcmp(out, "-") ? out : "standard output",
           fp8 ? "NVLink and network values" : "NVLink, network and fp8 values");
    return 0;
}

/* The profile of a stack fit, and what it says about each of the cluster's rows. */
static enum moe_status
write_stack_profile(const struct plan_fit_row *rows, int n, const char *cluster, const char *stack,
                    const char *file, const char *measured, const char *te,
                    const struct cost_calibration *ds, const struct cost_calibration *fitted,
                    const double rms[2], const char *out, struct moe_error *err)
{
    json_t *meta = json_object(), *ids = json_array(), *fit = json_object();
    const char *gpu = "";
    int systems = 0;
    for (int i = 0; i < n; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = strcmp(rows[i].run->cluster, rows[j].run->cluster) != 0;
        systems += first;
    }
    printf("stack %s: %d trusted rows on %d systems fitted together (rms log error %.3f), then "
           "%s's own (rms %.3f)\n",
           stack, n, systems, rms[0], cluster, rms[1]);
    printf("compute (GEMMs, attention, HBM) as measured in %s", measured);
    if (te[0]) printf(" (Transformer Engine's window and sink rates: %s)", te);
    printf("; the rest fitted:\n");
    printf("%-16s %10s %10s\n", "parameter", "start", "fitted");
    for (int p = 0; p < plan_fit_nparams; p++)
        printf("%-16s %10.3f %10.3f\n", plan_fit_params[p].name,
               *(const double *)((const char *)ds + plan_fit_params[p].offset),
               *(const double *)((const char *)fitted + plan_fit_params[p].offset));
    printf("%-9s %-10s %-16s %10s %10s %7s\n", "run", "container", "model", "published",
           "predicted", "error");
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].run->cluster, cluster)) continue;
        struct cost_ctx ctx;
        plan_fit_row_ctx(&rows[i], fitted, &ctx);
        struct cost_result r;
        enum moe_status st = cost_evaluate(&ctx, &rows[i].layout, &r, err);
        if (st != MOE_OK) {
            json_decref(meta), json_decref(ids), json_decref(fit);
            return st;
        }
        double pub = rows[i].run->tokens_per_s_gpu, got = r.tokens_per_s_per_gpu;
        printf("%-9s %-10s %-16s %10.0f %10.0f %+6.1f%%\n", rows[i].run->id, rows[i].run->container,
               rows[i].run->model, pub, got, 100 * (got / pub - 1));
        json_array_append_new(ids, json_string(rows[i].run->id));
        gpu = rows[i].cluster.gpu.name;
    }
    json_object_set_new(meta, "gpu", json_string(gpu));
    json_object_set_new(meta, "stack", json_string(stack));
    json_object_set_new(fit, "method",
                        json_string("moeplan calibrate --published: the compute as measured "
                                    "(measured_compute), the rest by least squares of "
                                    "log(predicted / published step), bounded; every system's "
                                    "rows together, then this cluster's, pulled towards that fit"));
    json_object_set_new(fit, "published", json_string(file));
    json_object_set_new(fit, "measured_compute", json_string(measured));
    if (te[0]) json_object_set_new(fit, "te_attention", json_string(te));
    json_object_set_new(fit, "cluster", json_string(cluster));
    json_object_set_new(fit, "rows", ids);
    json_object_set_new(fit, "rms_log_error", json_real(rms[1]));
    json_object_set_new(fit, "shared_rows", json_integer(n));
    json_object_set_new(fit, "shared_rms_log_error", json_real(rms[0]));
    json_object_set_new(meta, "fit", fit);
    enum moe_status st = cost_calibration_write(fitted, meta, out, err);
    json_decref(meta);
    return st;
}

/* The stack's rows of a published-runs file: trusted, modelled (dropless, Adam: not flagged
 * tokendrop or muon), of the stack's containers,
 * resolved. A stack that no row has is a usage error naming the file's stacks. */
static enum moe_status stack_rows(struct cli *cli, const char *file, const char *stack,
                                  struct plan_published *runs, struct plan_fit_row *rows, int *n,
                                  struct moe_error *err)
{
    int all = 0, kept = 0, of_stack = 0;
    enum moe_status st = plan_published_load(file, runs, PLAN_PUBLISHED_MAX, &all, err);
    for (int i = 0; st == MOE_OK && i < all; i++)
        of_stack += plan_published_in_stack(&runs[i], stack);
    if (st == MOE_OK && of_stack == 0) {
        char list[512];
        plan_published_stacks(runs, all, list, sizeof list);
        st = moe_error_set(err, MOE_ERR_USAGE,
                           "--stack %s: %s has no row of that stack (its "
                           "stacks: %s)",
                           stack, file, list[0] ? list : "none");
    }
    for (int i = 0; st == MOE_OK && i < all; i++)
        if (plan_published_in_stack(&runs[i], stack) && runs[i].trusted && !runs[i].unmodelled)
            runs[kept++] = runs[i];
    if (st == MOE_OK && kept == 0)
        st = moe_error_set(err, MOE_ERR_INPUT,
                           "%s: no trusted row of stack %s that moeplan models (dropless, Adam)",
                           file, stack);
    char mdir[MOE_PATH_MAX], tdir[MOE_PATH_MAX];
    cli_data_path(cli, "model", mdir, sizeof mdir);
    cli_data_path(cli, "topologies", tdir, sizeof tdir);
    if (st == MOE_OK) st = plan_fit_rows(runs, kept, mdir, tdir, rows, err);
    *n = st == MOE_OK ? kept : 0;
    return st;
}

static double pct(double pred, double pub)
{
    return 100.0 * (pub / pred - 1.0); /* tokens/s: predicted over published */
}

/* Ranking: the pairs of rows of one model, cluster and GPU count that ran different layouts or
 * recipes, ordered by published tokens/s and by the prediction without the row's system. Kendall's
 * tau over them; every pair more than 5% apart as published, with the phase that sets the two
 * predictions apart, and named INVERTED where the prediction orders it the other way. */
static enum moe_status rank_pairs(const struct plan_fit_row *rows, int n, const double *pred,
                                  struct moe_error *err)
{
    int pairs = 0, concordant = 0, wide = 0, wide_right = 0, nfits = 0;
    static struct {
        const char *cluster;
        struct cost_calibration cal;
    } fits[PLAN_PUBLISHED_MAX]; /* the profile without each system, fitted once */
    struct moe_progress bar;
    moe_progress_start(&bar, stderr, true, "ranking", (uint64_t)n);
    moe_progress_lines(&bar, 2.0);
    printf("\nranking (predicted without the row's system): pairs of one model, cluster and GPU "
           "count with different layouts or recipes\n");
    for (int i = 0; i < n; i++, moe_progress_update(&bar, (uint64_t)i))
        for (int j = i + 1; j < n; j++) {
            const struct plan_published *a = rows[i].run, *b = rows[j].run;
            char la[COST_LAYOUT_TEXT_MAX], lb[COST_LAYOUT_TEXT_MAX];
            cost_layout_format(&rows[i].layout, la, sizeof la);
            cost_layout_format(&rows[j].layout, lb, sizeof lb);
            if (strcmp(a->model, b->model) || strcmp(a->cluster, b->cluster) ||
                a->gpus != b->gpus || !strcmp(la, lb))
                continue;
            double pa = a->tokens_per_s_gpu, pb = b->tokens_per_s_gpu;
            double qa = pa * rows[i].step_us / pred[i], qb = pb * rows[j].step_us / pred[j];
            bool same = (pa > pb) == (qa > qb);
            pairs++, concordant += same;
            if (fabs(pa / pb - 1.0) <= 0.05) continue;
            wide++, wide_right += same;
            printf("  %s %s: %s %.0f vs %s %.0f published, %.0f vs %.0f predicted%s\n", a->model,
                   a->cluster, a->id, pa, b->id, pb, qa, qb, same ? "" : "  INVERTED");
            /* what sets them apart: both costed with the profile that predicted them, fitted
             * without their system (once per system: a file of many rows has few systems) */
            int c = 0;
            while (c < nfits && strcmp(fits[c].cluster, a->cluster)) c++;
            enum moe_status st = MOE_OK;
            if (c == nfits) {
                struct plan_fit_row *train = malloc(sizeof *train * (size_t)n);
                if (!train) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
                int k = 0;
                for (int q = 0; q < n; q++)
                    if (strcmp(rows[q].run->cluster, a->cluster)) train[k++] = rows[q];
                struct cost_calibration ds;
                plan_fit_row_start(&rows[i], &ds);
                fits[c].cluster = a->cluster;
                st = plan_fit_stack(train, k, a->cluster, &ds, &fits[c].cal, NULL, NULL, err);
                free(train);
                if (st == MOE_OK) nfits++;
            }
            struct cost_result ra, rb;
            struct cost_ctx ctx; /* a and b: one cluster, one GPU */
            plan_fit_row_ctx(&rows[i], &fits[c].cal, &ctx);
            if (st == MOE_OK) st = cost_evaluate(&ctx, &rows[i].layout, &ra, err);
            if (st == MOE_OK) st = cost_evaluate(&ctx, &rows[j].layout, &rb, err);
            if (st != MOE_OK) return st;
            bool a_slower = ra.step_us > rb.step_us;
            double grow;
            int ph =
                a_slower ? plan_phase_grown(&rb, &ra, &grow) : plan_phase_grown(&ra, &rb, &grow);
            printf("    %s predicted slower: its %s takes %+.1f ms more per step\n",
                   a_slower ? a->id : b->id, cost_phase_names[ph], grow / 1e3);
        }
    moe_progress_finish(&bar);
    if (pairs)
        printf("  %d pairs, Kendall's tau %.2f; %d of the %d more than 5%% apart ordered as "
               "published\n",
               pairs, (2.0 * concordant - pairs) / pairs, wide_right, wide);
    else
        printf("  none in this stack\n");
    return MOE_OK;
}

/* Leave one model out and leave one system out: every row predicted by the profile fitted
 * without its fold; per row and per fold, the error of tokens/s/GPU. */
static enum moe_status cross_validate(const struct plan_fit_row *rows, int n, const double *pred[2],
                                      struct moe_error *err)
{
    static const char *const name[2] = {"model", "system"};
    printf("%-9s %-16s %-16s %10s %10s %7s %10s %7s\n", "run", "model", "cluster", "published",
           "w/o model", "error", "w/o system", "error");
    for (int i = 0; i < n; i++) {
        double pub = rows[i].run->tokens_per_s_gpu, t0 = pub * rows[i].step_us / pred[0][i],
               t1 = pub * rows[i].step_us / pred[1][i];
        printf("%-9s %-16s %-16s %10.0f %10.0f %+6.1f%% %10.0f %+6.1f%%\n", rows[i].run->id,
               rows[i].run->model, rows[i].run->cluster, pub, t0, 100 * (t0 / pub - 1), t1,
               100 * (t1 / pub - 1));
    }
    for (int f = 0; f < 2; f++) {
        printf("\nleave one %s out:\n", name[f]);
        double all_sum = 0, all_worst = 0;
        for (int i = 0; i < n; i++) {
            const char *key = f == 0 ? rows[i].run->model : rows[i].run->cluster;
            bool first = true;
            for (int j = 0; j < i && first; j++)
                first = strcmp(key, f == 0 ? rows[j].run->model : rows[j].run->cluster) != 0;
            double e = fabs(pct(pred[f][i], rows[i].step_us));
            all_sum += e;
            if (e > all_worst) all_worst = e;
            if (!first) continue;
            int k = 0;
            double sum = 0, worst = 0;
            for (int j = i; j < n; j++) {
                if (strcmp(key, f == 0 ? rows[j].run->model : rows[j].run->cluster)) continue;
                double ej = fabs(pct(pred[f][j], rows[j].step_us));
                sum += ej, k++;
                if (ej > worst) worst = ej;
            }
            printf("  %-18s %2d rows: mean |error| %5.1f%%, worst %5.1f%%\n", key, k, sum / k,
                   worst);
        }
        printf("  all %d rows: mean |error| %.1f%%, worst %.1f%%\n", n, all_sum / n, all_worst);
    }
    return rank_pairs(rows, n, pred[1], err);
}

/* The chart: predicted against published tokens/s/GPU, one mark per row and fold. */
struct cv_chart {
    const struct plan_fit_row *rows;
    int n;
    const double *const *pred;
    const char *stack;
};

static enum moe_status draw_cv_chart(FILE *f, const void *arg, struct moe_error *err)
{
    const struct cv_chart *c = arg;
    int n = c->n;
    double *x = malloc(sizeof *x * (size_t)n * 3), *y = x ? x + n : NULL;
    if (!x) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        x[i] = c->rows[i].run->tokens_per_s_gpu;
        for (int fold = 0; fold < 2; fold++)
            y[fold * n + i] = x[i] * c->rows[i].step_us / c->pred[fold][i];
    }
    char title[128];
    snprintf(title, sizeof title, "%s: held-out predictions (%d runs; band: 10%%)", c->stack, n);
    static const char *const series[] = {"without its model", "without its system"};
    enum moe_status st = rpt_svg_scatter(f, title, "published tokens/s/GPU",
                                         "predicted tokens/s/GPU", x, n, series, 2, y, 0.10, err);
    free(x);
    return st;
}

/* What `calibrate --published` was given. */
struct published_args {
    const char *file, *stack, *cluster, *out, *svg, *measured; /* measured: NULL for the shipped */
    bool cv;
};

/* The measured profiles whose compute a stack fit keeps: one per GPU at most, each row's named. */
#define MEASURED_MAX 8
struct measured_set {
    int n;
    char te[MOE_PATH_MAX]; /* where a profile without TE's attention rates took them, or "" */
    struct cost_calibration cal[MEASURED_MAX];
    char name[MEASURED_MAX][MOE_PATH_MAX]; /* as the profile records it */
};

/* A profile `moeplan calibrate` measured on a GPU (its "measured" data with the GEMM grid), not a
 * stack profile (fitted): `gpu` NULL for --measured (taken for every row as it is), else the GPU
 * whose shipped profile it is, which it must name. */
static enum moe_status measured_profile(const char *path, const char *gpu,
                                        struct cost_calibration *m, struct moe_error *err)
{
    struct moe_jdoc doc;
    enum moe_status st = moe_jdoc_load(&doc, path, err);
    if (st != MOE_OK) return st;
    json_t *meas = json_object_get(doc.root, "measured");
    const char *named = json_string_value(json_object_get(doc.root, "gpu"));
    char measured_gpu[64];
    snprintf(measured_gpu, sizeof measured_gpu, "%s", named ? named : "");
    bool ok = json_is_object(doc.root) && !json_object_get(doc.root, "stack") &&
              json_is_object(meas) && json_array_size(json_object_get(meas, "gemm_m_n_k_us")) > 0;
    moe_jdoc_free(&doc);
    if (!ok && !gpu)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "%s: --measured takes a profile `moeplan calibrate` measured on a "
                             "GPU (its \"measured\" data with the GEMM grid); this is not one",
                             path);
    if (!ok)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "%s: the %s's measured profile, whose compute its published rows "
                             "keep, is not one `moeplan calibrate` measured (its \"measured\" data "
                             "with the GEMM grid)",
                             path, gpu);
    if (gpu && !measured_gpu[0])
        return moe_error_set(err, MOE_ERR_INPUT,
                             "%s: names no GPU (\"gpu\"): the %s's measured profile must name it",
                             path, gpu);
    if (gpu && !cost_calibration_gpu_is(measured_gpu, gpu))
        return moe_error_set(err, MOE_ERR_INPUT,
                             "%s: measured on the %s, not the %s whose measured profile it is "
                             "named as",
                             path, measured_gpu, gpu);
    cost_calibration_defaults(m, NULL); /* what an older profile lacks */
    return cost_calibration_load(m, path, err);
}

static int json_entry(const struct dirent *e)
{
    size_t n = strlen(e->d_name);
    return n > 5 && !strcmp(e->d_name + n - 5, ".json");
}

/* Transformer Engine's attention rates (cuDNN's windowed and sink graphs against its plain one:
 * ratios of one Hopper GPU's kernels, as the Hopper tables anchor Blackwell) for a measured
 * profile that has none, from the first shipped measured profile (by name) that has them. */
static void te_attention_shared(struct cli *cli, struct measured_set *set)
{
    static struct cost_calibration donor;
    bool have = false;
    for (int s = 0; s < set->n && !have; s++)
        if (set->cal[s].attn_window_cudnn_eff > 0 && set->cal[s].attn_sink_cudnn_fwd_eff > 0) {
            donor = set->cal[s], have = true;
            snprintf(set->te, sizeof set->te, "%s", set->name[s]);
        }
    char dir[MOE_PATH_MAX], path[MOE_PATH_MAX];
    cli_data_path(cli, PLAN_MEASURED_DIR, dir, sizeof dir);
    struct dirent **list = NULL;
    int k = have ? 0 : scandir(dir, &list, json_entry, alphasort);
    for (int i = 0; i < k; i++) {
        struct moe_error why;
        int len = snprintf(path, sizeof path, "%s/%s", dir, list[i]->d_name);
        if (!have && len > 0 && (size_t)len < sizeof path) {
            if (measured_profile(path, NULL, &donor, &why) != MOE_OK)
                fprintf(stderr, "moeplan: %s\n", why.message); /* said, and passed over */
            else if (donor.attn_window_cudnn_eff > 0 && donor.attn_sink_cudnn_fwd_eff > 0) {
                have = true;
                snprintf(set->te, sizeof set->te, "%s/%s", PLAN_MEASURED_DIR, list[i]->d_name);
            }
        }
        free(list[i]);
    }
    free(list);
    bool took = false;
    for (int s = 0; have && s < set->n; s++) { /* each field where it was not measured */
        struct cost_calibration *c = &set->cal[s];
        took = took || c->attn_window_cudnn_eff <= 0 || c->attn_sink_cudnn_fwd_eff <= 0;
        if (c->attn_window_cudnn_eff <= 0) {
            c->attn_window_cudnn_eff = donor.attn_window_cudnn_eff;
            c->attn_window_bwd_cudnn_eff = donor.attn_window_bwd_cudnn_eff;
        }
        if (c->attn_sink_cudnn_fwd_eff <= 0) {
            c->attn_sink_cudnn_fwd_eff = donor.attn_sink_cudnn_fwd_eff;
            c->attn_sink_cudnn_bwd_eff = donor.attn_sink_cudnn_bwd_eff;
        }
    }
    if (!took) set->te[0] = '\0'; /* every profile had its own */
    if (!have)
        fprintf(stderr, "moeplan: no shipped measured profile has Transformer Engine's attention "
                        "rates: sliding windows and sinks as the executor runs them\n");
}

/* Each row's measured compute: --measured for every row; else its GPU's shipped profile
 * (PLAN_MEASURED_DIR/<gpu>.json, the H200's among them) where there is one, the H200's where
 * not. */
static enum moe_status measured_compute(struct cli *cli, const char *given,
                                        struct plan_fit_row *rows, int n, struct measured_set *set,
                                        struct moe_error *err)
{
    char path[MOE_PATH_MAX];
    if (given)
        snprintf(path, sizeof path, "%s", given);
    else
        cli_data_path(cli, PLAN_MEASURED_PROFILE, path, sizeof path);
    set->n = 1;
    snprintf(set->name[0], sizeof set->name[0], "%s", given ? given : PLAN_MEASURED_PROFILE);
    enum moe_status st =
        measured_profile(path, given ? NULL : PLAN_MEASURED_GPU, &set->cal[0], err);
    for (int i = 0; st == MOE_OK && i < n; i++) {
        rows[i].measured = &set->cal[0];
        if (given) continue;
        char rel[MOE_PATH_MAX], lower[64];
        const char *gpu = rows[i].cluster.gpu.name;
        cli_gpu_file_name(gpu, lower, sizeof lower);
        snprintf(rel, sizeof rel, "%s/%s.json", PLAN_MEASURED_DIR, lower);
        int s = 0;
        while (s < set->n && strcmp(set->name[s], rel)) s++;
        if (s == set->n) {
            cli_data_path(cli, rel, path, sizeof path);
            struct stat sb; /* none shipped: the H200's; anything else there is read, and said */
            if (lstat(path, &sb) != 0 && errno == ENOENT) continue;
            if (set->n == MEASURED_MAX)
                return moe_error_set(err, MOE_ERR_INPUT, "more than %d measured GPUs",
                                     MEASURED_MAX);
            st = measured_profile(path, gpu, &set->cal[s], err);
            snprintf(set->name[s], sizeof set->name[s], "%s", rel);
            set->n += st == MOE_OK;
        }
        rows[i].measured = &set->cal[s];
    }
    if (st == MOE_OK && !given) te_attention_shared(cli, set);
    return st;
}

/* The name of the measured profile whose compute the cluster's rows keep. */
static const char *measured_name(const struct measured_set *set, const struct plan_fit_row *rows,
                                 int n, const char *cluster)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].run->cluster, cluster))
            for (int s = 0; s < set->n; s++)
                if (rows[i].measured == &set->cal[s]) return set->name[s];
    return set->name[0];
}

/* A stack profile from published runs (plan_fit_stack), or its cross-validation. */
static int calibrate_published(struct cli *cli, const struct cli_cmd *cmd,
                               const struct published_args *a)
{
    const char *file = a->file, *stack = a->stack, *cluster = a->cluster, *out = a->out,
               *svg = a->svg;
    bool cv = a->cv;
    struct moe_error err;
    struct measured_set *measured = calloc(1, sizeof *measured);
    struct plan_published *runs = calloc(PLAN_PUBLISHED_MAX, sizeof *runs);
    struct plan_fit_row *rows = calloc(PLAN_PUBLISHED_MAX, sizeof *rows);
    double *pred = calloc(2 * PLAN_PUBLISHED_MAX, sizeof *pred);
    int n = 0, own = 0;
    enum moe_status st = runs && rows && pred && measured
                             ? stack_rows(cli, file, stack, runs, rows, &n, &err)
                             : moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
    if (st == MOE_OK) st = measured_compute(cli, a->measured, rows, n, measured, &err);
    /* the outputs checked once the input is open, so one that is the input is refused before
     * any fitting */
    if (st == MOE_OK &&
        ((!cv && !cli_output_ok(cmd, "-o", out)) || (svg && !cli_output_ok(cmd, "--svg", svg)))) {
        free(runs), free(rows), free(pred), free(measured);
        return 2;
    }
    if (st == MOE_OK && cv) {
        const double *p[2] = {pred, pred + PLAN_PUBLISHED_MAX};
        printf("stack %s: %d trusted rows; tokens/s/GPU predicted by the profile fitted without "
               "the row's model, and without its system\n",
               stack, n);
        struct moe_progress bar; /* seconds to minutes: a line every 2 s into a pipe */
        moe_progress_start(&bar, stderr, true, "cross-validation", 2 * (uint64_t)n);
        moe_progress_lines(&bar, 2.0);
        st = plan_fit_crossval(rows, n, PLAN_FOLD_MODEL, pred, &bar, &err);
        if (st == MOE_OK)
            st =
                plan_fit_crossval(rows, n, PLAN_FOLD_SYSTEM, pred + PLAN_PUBLISHED_MAX, &bar, &err);
        moe_progress_finish(&bar);
        if (st == MOE_OK) st = cross_validate(rows, n, p, &err);
        struct cv_chart chart = {rows, n, p, stack};
        if (st == MOE_OK && svg) st = cli_write_drawn(svg, draw_cv_chart, &chart, &err);
    } else if (st == MOE_OK) {
        struct cost_calibration base, fitted;
        double rms[2];
        const struct plan_fit_row *mine = &rows[0]; /* a row of the cluster, if it has one */
        for (int i = n - 1; i >= 0; i--)
            if (!strcmp(rows[i].run->cluster, cluster)) mine = &rows[i];
        plan_fit_row_start(mine, &base); /* what the fit starts from */
        st = plan_fit_stack(rows, n, cluster, &base, &fitted, &own, rms, &err);
        if (st == MOE_OK && own == 0)
            st = moe_error_set(&err, MOE_ERR_INPUT, "%s: no trusted row of %s in stack %s", file,
                               cluster, stack);
        if (st == MOE_OK)
            st = write_stack_profile(rows, n, cluster, stack, file,
                                     measured_name(measured, rows, n, cluster), measured->te, &base,
                                     &fitted, rms, out, &err);
    }
    free(runs);
    free(rows);
    free(pred);
    free(measured);
    if (st != MOE_OK) return cli_fail(cli, &err);
    if (!cv) printf("profile written to %s\n", strcmp(out, "-") ? out : "standard output");
    return 0;
}

int cmd_calibrate(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *out = "calibration.json", *cluster = NULL, *refit = NULL, *published = NULL,
               *stack = NULL, *svg = NULL, *measured = NULL;
    bool quick = false, cv = false, out_given = false;
    for (int i = 0; i < nargs; i++) {
        if (args[i].val == OPT_OUT) out = args[i].value, out_given = true;
        if (args[i].val == OPT_QUICK) quick = true;
        if (args[i].val == OPT_CLUSTER) cluster = args[i].value;
        if (args[i].val == OPT_REFIT) refit = args[i].value;
        if (args[i].val == OPT_PUBLISHED) published = args[i].value;
        if (args[i].val == OPT_STACK) stack = args[i].value;
        if (args[i].val == OPT_CV) cv = true;
        if (args[i].val == OPT_SVG) svg = args[i].value;
        if (args[i].val == OPT_MEASURED) measured = args[i].value;
    }
    if (optind != argc) return cli_usage(cmd, "no operands");
    if (published && (!stack || !(cluster || cv) || refit || quick))
        return cli_usage(cmd, "--published needs --stack and --cluster, or --stack and "
                              "--cross-validate (and no --refit, --quick)");
    if ((stack || cv) && !published)
        return cli_usage(cmd, "--stack and --cross-validate go with --published");
    if (svg && !cv) return cli_usage(cmd, "--svg goes with --cross-validate");
    if (measured && !published) return cli_usage(cmd, "--measured goes with --published");
    if (refit && quick)
        return cli_usage(cmd, "--quick measures fewer shapes; --refit measures none");
    if (cv && out_given)
        return cli_usage(cmd, "--cross-validate writes no profile, so no -o: its table is the "
                              "result (--svg FILE for the chart)");
    if (published) {
        struct published_args pa = {published, stack, cluster, out, svg, measured, cv};
        return calibrate_published(cli, cmd, &pa);
    }
    return calibrate(cli, cmd, out, quick, cluster, refit);
}
