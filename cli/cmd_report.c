/*
 * cmd_report.c: `moeplan report PLAN MEASURED [-o DIR]`: the predicted-vs-measured report of one
 * run. DIR/README.md (GitHub Markdown) with four SVG charts next to it: predicted and measured
 * time per phase, the error per phase, the loss curve, and the expert load (a histogram of each
 * expert's tokens over the balanced share, measured against the plan's routing). The same table
 * prints to the terminal. With --compare, other runs of the same model and steps (another
 * precision, say) join the loss curve, and a table sets their last losses against this run's.
 * Every file is written whole or not at all (moe_file_write_atomic); the README last, so a report
 * folder with a README is complete.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan.h"
#include "rpt.h"

enum { OPT_OUT = 'o', OPT_COMPARE = 1 };

#define MAX_COMPARE (RPT_SVG_MAX_SERIES - 1)
const struct cli_opt cmd_report_opts[] = {
    {"output", required_argument, OPT_OUT, "DIR", "write the report here (report)", CLI_OUT_DIR},
    {"compare", required_argument, OPT_COMPARE, "MEASURED",
     "another run's measured.json (same model and steps) beside this one's loss; up to "
     "3",
     CLI_REPEATABLE},
    {NULL, 0, 0, NULL, NULL, 0},
};

/* A chart of the report's folder, drawn into memory, then written whole. */
static enum moe_status write_chart(const char *dir, const char *name, cli_draw_fn fn,
                                   const void *arg, struct moe_error *err)
{
    char path[MOE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return cli_write_drawn(path, fn, arg, err);
}

struct report {
    const struct plan_file *p;
    const struct plan_measured *m;
    int rows[COST_NPHASES], nrows; /* the phases shown: predicted or measured, not the step */
    const struct plan_measured *other[MAX_COMPARE]; /* --compare's runs */
    const char *name[MAX_COMPARE + 1];              /* this run's file, then theirs */
    int nother;
};

static enum moe_status chart_phases(FILE *f, const void *arg, struct moe_error *err)
{
    const struct report *r = arg;
    const char *labels[COST_NPHASES], *series[2] = {"predicted", "measured"};
    double v[2 * COST_NPHASES];
    for (int i = 0; i < r->nrows; i++) {
        int p = r->rows[i];
        labels[i] = cost_phase_names[p];
        v[2 * i] = r->p->phase_us[p] / 1e3;
        v[2 * i + 1] = r->m->phase_ms[p];
    }
    return rpt_svg_bars(f, "Time per phase, one step", "ms", labels, r->nrows, series, 2, v, err);
}

static enum moe_status chart_errors(FILE *f, const void *arg, struct moe_error *err)
{
    const struct report *r = arg;
    const char *labels[COST_NPHASES + 1], *series[1] = {"measured / predicted - 1"};
    double v[COST_NPHASES + 1];
    int n = 0;
    for (int i = 0; i < r->nrows; i++) {
        int p = r->rows[i];
        if (r->p->phase_us[p] <= 0) continue;
        labels[n] = cost_phase_names[p];
        v[n++] = 100.0 * (r->m->phase_ms[p] * 1e3 / r->p->phase_us[p] - 1.0);
    }
    labels[n] = "step";
    v[n++] = 100.0 * (r->m->phase_ms[COST_STEP] * 1e3 / r->p->step_us - 1.0);
    return rpt_svg_bars(f, "Error per phase", "%", labels, n, series, 1, v, err);
}

/* The loss of every step that updated (a skipped step has none). */
static int loss_points(const struct plan_measured *m, double *x, double *y)
{
    int n = 0;
    for (int i = 0; i < m->steps; i++)
        if (isfinite(m->loss[i])) {
            if (x) x[n] = m->first_step + i, y[n] = m->loss[i];
            n++;
        }
    return n;
}

/* The loss curve; with --compare, every run's at the steps all of them updated. */
static enum moe_status chart_loss(FILE *f, const void *arg, struct moe_error *err)
{
    const struct report *r = arg;
    const struct plan_measured *m = r->m;
    int ns = 1 + r->nother;
    double *x = malloc(sizeof *x * (size_t)m->steps * (1 + ns));
    if (!x) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    double *y = x + m->steps;
    int n = 0;
    if (!r->nother) {
        n = loss_points(m, x, y);
    } else {
        int kept = 0;
        for (int i = 0; i < m->steps; i++) {
            bool all = isfinite(m->loss[i]);
            for (int k = 0; k < r->nother; k++) all = all && isfinite(r->other[k]->loss[i]);
            if (all) x[kept++] = m->first_step + i;
        }
        n = kept;
        for (int s = 0, j = 0; s < ns; s++, j = 0) {
            const struct plan_measured *q = s ? r->other[s - 1] : m;
            for (int i = 0; i < m->steps; i++) {
                bool all = isfinite(m->loss[i]);
                for (int k = 0; k < r->nother; k++) all = all && isfinite(r->other[k]->loss[i]);
                if (all) y[(size_t)s * n + j++] = q->loss[i];
            }
        }
    }
    const char *one[1] = {"training loss"};
    enum moe_status st =
        rpt_svg_lines(f, "Loss curve", "step", "loss", x, n, r->nother ? r->name : one, ns, y, err);
    free(x);
    return st;
}

/* The mean loss of a run's last `n` updating steps (NaN: none) */
static double tail_loss(const struct plan_measured *m, int n)
{
    double sum = 0;
    int k = 0;
    for (int i = m->steps - 1; i >= 0 && k < n; i--)
        if (isfinite(m->loss[i])) sum += m->loss[i], k++;
    return k ? sum / k : NAN;
}

/* Experts by load over the balanced share (every MoE layer's experts): the plan's routing puts
 * them at 1.0x when it was uniform. */
#define NBINS 8
static const double bin_hi[NBINS] = {0.25, 0.5, 0.75, 0.9, 1.1, 1.25, 1.5, INFINITY};
static const char *const bin_name[NBINS] = {"< 0.25x",  "0.25-0.5x", "0.5-0.75x", "0.75-0.9x",
                                            "0.9-1.1x", "1.1-1.25x", "1.25-1.5x", ">= 1.5x"};

static void load_bins(const struct plan_measured *m, double *measured, double *balanced)
{
    const struct cost_routing *r = &m->routing;
    for (int b = 0; b < NBINS; b++) measured[b] = balanced[b] = 0;
    for (int l = 0; l < r->layers; l++) {
        double mean = (double)r->top_k / r->experts; /* the picks of a layer sum to top_k */
        for (int x = 0; x < r->experts; x++) {
            double q = r->pick[(size_t)l * r->experts + x] / mean;
            int b = 0;
            while (q >= bin_hi[b]) b++;
            measured[b]++;
        }
        balanced[4] += r->experts;
    }
}

static enum moe_status chart_experts(FILE *f, const void *arg, struct moe_error *err)
{
    const struct plan_measured *m = ((const struct report *)arg)->m;
    double meas[NBINS], bal[NBINS], v[2 * NBINS];
    load_bins(m, meas, bal);
    for (int b = 0; b < NBINS; b++) v[2 * b] = bal[b], v[2 * b + 1] = meas[b];
    const char *series[2] = {"predicted (uniform routing)", "measured"};
    return rpt_svg_bars(f, "Experts by tokens over the balanced share (all MoE layers)", "experts",
                        bin_name, NBINS, series, 2, v, err);
}

static int report(struct cli *cli, const char *plan_file, const char *measured_file,
                  const char *dir, const char *const *compare, int ncompare)
{
    struct moe_error err;
    struct plan_file p;
    struct plan_measured m, other[MAX_COMPARE];
    int nother = 0;
    enum moe_status st = plan_load(plan_file, &p, &err);
    if (st != MOE_OK) {
        plan_file_free(&p);
        return cli_fail(cli, &err);
    }
    int E = mdl_moe_layer_count(&p.model) ? p.model.moe.experts : 0;
    if ((st = plan_measured_load(measured_file, E, p.model.moe.top_k, &m, &err))) {
        plan_file_free(&p);
        return cli_fail(cli, &err);
    }
    if (strcmp(m.model, p.model.name) != 0) {
        moe_error_set(&err, MOE_ERR_INPUT, "%s measured %s, the plan %s is for %s", measured_file,
                      m.model, plan_file, p.model.name);
        goto fail;
    }
    for (; nother < ncompare; nother++) {
        struct plan_measured *q = &other[nother];
        if ((st = plan_measured_load(compare[nother], E, p.model.moe.top_k, q, &err))) goto fail;
        if (strcmp(q->model, m.model) || q->steps != m.steps || q->first_step != m.first_step) {
            moe_error_set(&err, MOE_ERR_INPUT,
                          "--compare %s: %s, steps %d-%d; %s is %s, steps %d-%d (a run of the "
                          "same model and steps)",
                          compare[nother], q->model, q->first_step, q->first_step + q->steps - 1,
                          measured_file, m.model, m.first_step, m.first_step + m.steps - 1);
            nother++;
            goto fail;
        }
    }
    struct report r = {&p, &m, {0}, 0, {NULL}, {measured_file}, nother};
    for (int k = 0; k < nother; k++) r.other[k] = &other[k], r.name[k + 1] = compare[k];
    for (int ph = 0; ph < COST_STEP; ph++)
        if (p.phase_us[ph] > 0 || m.phase_ms[ph] > 0) r.rows[r.nrows++] = ph;
    const char *h[] = {"phase", "predicted", "measured", "error"};
    struct rpt_table *t = rpt_table_create(4, h, "lrrr");
    if (!t) {
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i <= r.nrows; i++) {
        int ph = i < r.nrows ? r.rows[i] : COST_STEP;
        double pr = ph == COST_STEP ? p.step_us / 1e3 : p.phase_us[ph] / 1e3;
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", cost_phase_names[ph]);
        rpt_table_cell(t, NULL, "%.2f ms", pr);
        rpt_table_cell(t, NULL, "%.2f ms", m.phase_ms[ph]);
        if (pr > 0)
            rpt_table_cell(t, NULL, "%+.1f%%", 100.0 * (m.phase_ms[ph] / pr - 1.0));
        else
            rpt_table_cell(t, NULL, "-");
    }
    printf("%s on %s: predicted against measured (median step)\n", p.model.name, m.device);
    rpt_table_print(t, stdout);
    if ((st = moe_output_dir_make(dir, &err))) {
        rpt_table_destroy(t);
        goto fail;
    }
    /* every file of the report checked before the first is written: a refusal leaves the folder
     * as it was, not half a report */
    static const char *const names[] = {"phases.svg", "errors.svg", "loss.svg", "experts.svg",
                                        "README.md"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[MOE_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if ((st = moe_output_check(path, &err))) {
            rpt_table_destroy(t);
            goto fail;
        }
    }
    if ((st = write_chart(dir, "phases.svg", chart_phases, &r, &err)) ||
        (st = write_chart(dir, "errors.svg", chart_errors, &r, &err)) ||
        (loss_points(&m, NULL, NULL) > 1 &&
         (st = write_chart(dir, "loss.svg", chart_loss, &r, &err))) ||
        (m.have_routing && (st = write_chart(dir, "experts.svg", chart_experts, &r, &err)))) {
        rpt_table_destroy(t);
        goto fail;
    }
    char *text = NULL, path[MOE_PATH_MAX], lay[COST_LAYOUT_TEXT_MAX];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        rpt_table_destroy(t);
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    cost_layout_format(&p.layout, lay, sizeof lay);
    fprintf(f, "# %s on %s: predicted against measured\n\n", p.model.name, m.device);
    fprintf(f,
            "Plan `%s` (%d GPU%s, %s), measured `%s` (steps %d-%d; medians of %d steps "
            "after the first).\n\n",
            plan_file, p.gpus, p.gpus == 1 ? "" : "s", lay, measured_file, m.first_step,
            m.first_step + m.steps - 1, m.counted);
    rpt_table_print_markdown(t, f);
    fprintf(f, "\n![time per phase](phases.svg)\n\n![error per phase](errors.svg)\n");
    if (loss_points(&m, NULL, NULL) > 1) fprintf(f, "\n![loss curve](loss.svg)\n");
    if (nother) {
        double base = tail_loss(&m, 10);
        fprintf(f, "\n| run | loss, mean of the last 10 steps | against `%s` |\n|---|---:|---:|\n",
                measured_file);
        printf("\nloss, mean of the last 10 steps:\n");
        for (int k = 0; k <= nother; k++) {
            double v = tail_loss(k ? &other[k - 1] : &m, 10);
            fprintf(f, "| `%s` | %.4f | %+.2f%% |\n", r.name[k], v, 100.0 * (v / base - 1.0));
            printf("  %-40s %.4f  %+.2f%%\n", r.name[k], v, 100.0 * (v / base - 1.0));
        }
    }
    if (m.have_routing) {
        double meas[NBINS], bal[NBINS];
        load_bins(&m, meas, bal);
        fprintf(f,
                "\n![expert load](experts.svg)\n\nExpert load: %d experts in %d MoE layers; the "
                "plan predicted each at its balanced share (%.0f of %d in 0.9-1.1x measured).\n",
                m.routing.experts, m.routing.layers, meas[4], m.routing.experts * m.routing.layers);
    }
    fclose(f);
    rpt_table_destroy(t);
    snprintf(path, sizeof path, "%s/README.md", dir);
    st = moe_file_write_atomic(path, text, len, &err);
    free(text);
    if (st != MOE_OK) goto fail;
    printf("report written to %s\n", path);
    for (int k = 0; k < nother; k++) plan_measured_free(&other[k]);
    plan_measured_free(&m);
    plan_file_free(&p);
    return 0;
fail:
    for (int k = 0; k < nother; k++) plan_measured_free(&other[k]);
    plan_measured_free(&m);
    plan_file_free(&p);
    return cli_fail(cli, &err);
}

int cmd_report(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs, rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    const char *dir = "report", *compare[MAX_COMPARE];
    int ncompare = 0;
    for (int i = 0; i < nargs; i++) {
        if (args[i].val == OPT_OUT) dir = args[i].value;
        if (args[i].val == OPT_COMPARE) {
            if (ncompare == MAX_COMPARE)
                return cli_usage(cmd, "--compare: at most %d runs", MAX_COMPARE);
            compare[ncompare++] = args[i].value;
        }
    }
    if (optind != argc - 2) return cli_usage(cmd, "give a plan and a measured.json");
    return report(cli, argv[optind], argv[optind + 1], dir, compare, ncompare);
}
