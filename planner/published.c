/*
 * published.c: published training runs as the cost model sees them, and the fit of a stack
 * profile to them.
 *
 * A row is what ran (model, cluster, GPUs, layout, recipe settings) and how fast, as published;
 * plan_published_layout turns it into the layout `predict` takes. The fit is least squares of the
 * log of predicted over published step time, the calibration's efficiencies moved one at a time
 * in shrinking multiplicative steps within their bounds (physical: an efficiency is at most 1), a
 * prior pulling each towards a centre where few rows cannot pin it down.
 */
#include "plan.h"

#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define NCOLS PLAN_PUBLISHED_COLS

/* ---------------------------------------------------------------------------------------------- */
/* Rows                                                                                           */
/* ---------------------------------------------------------------------------------------------- */

static const char *const columns[NCOLS] = {"id",          "container", "model",
                                           "cluster",     "gpus",      "precision",
                                           "gbs",         "mbs",       "seq",
                                           "tp",          "pp",        "cp",
                                           "vpp",         "ep",        "recompute",
                                           "pp_layout",   "mtp",       "dispatcher",
                                           "grad_reduce", "moments",   "tokens_per_s_gpu",
                                           "tflops_gpu",  "conf",      "flags"};

#define PUBLISHED_MAX_BYTES (16u << 20) /* a published-runs file is a few hundred rows */

static bool text_col(char *dst, size_t cap, const char *v)
{
    if (strlen(v) >= cap) return false;
    snprintf(dst, cap, "%s", v);
    return true;
}

static bool int_col(int *dst, const char *v, int lo, int hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || v[0] == ' ' || v[0] == '+' || x < lo || x > hi) return false;
    *dst = (int)x;
    return true;
}

/* The container's generation: "26.04" of "26.04" and "26.04.01"; "" when it is not YY.MM[.*]. */
static void generation(const char *container, char gen[8])
{
    const char *c = container;
    bool ok = isdigit((unsigned char)c[0]) && isdigit((unsigned char)c[1]) && c[2] == '.' &&
              isdigit((unsigned char)c[3]) && isdigit((unsigned char)c[4]) &&
              (c[5] == '\0' || c[5] == '.');
    snprintf(gen, 8, "%.5s", ok ? c : "");
}

/* A recipe cell that goes into the row's layout text as key=value: one value of the grammar
 * (no ',' or '=' that would add keys), the one cost_layout_parse takes. */
static bool layout_col(const char *key, const char *v, char *why, size_t cap)
{
    if (strpbrk(v, ",=")) {
        snprintf(why, cap, "one value, without ',' or '='");
        return false;
    }
    if (!strcmp(key, "pp_layout") && !strcmp(v, "-")) return true;
    struct cost_layout t;
    cost_layout_defaults(&t, 4096);
    char kv[256];
    snprintf(kv, sizeof kv, "%s=%s", key, v);
    struct moe_error e;
    if (cost_layout_parse(&t, kv, &e) == MOE_OK) return true;
    size_t m = strlen(e.message) < cap ? strlen(e.message) : cap - 1;
    memcpy(why, e.message, m);
    why[m] = '\0';
    return false;
}

/* The flags cell: words (tokendrop, muon, recipe-mbs, ...) and the recipe's overhead settings as
 * key=value of the layout grammar (cuda_graphs, overlap, delay_wgrad, ep_sms: what the row's
 * recipe ran with), joined by ','. The settings go to r->recipe as layout text; *at is the
 * offset in the cell of a bad item. */
static bool flags_col(struct plan_published *r, const char *v, int *at, char *why, size_t cap)
{
    static const char *const keys[] = {"cuda_graphs", "overlap", "delay_wgrad", "ep_sms"};
    static const char *const words[] = {"tokendrop", "muon", "recipe-mbs", "precision-not-stated"};
    size_t n = 0;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        *at = (int)(p - v);
        if (len == 0) {
            snprintf(why, cap, "an empty item");
            return false;
        }
        size_t name = eq ? (size_t)(eq - p) : len;
        for (const char *q = v; q < p; q += strcspn(q, ",") + 1) /* each item once */
            if (strcspn(q, ",=") == name && !strncmp(q, p, name)) {
                snprintf(why, cap, "'%.*s' again: give each flag once",
                         (int)(name < 40 ? name : 40), p);
                return false;
            }
        if (!eq) {
            bool known = false;
            for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
                known |= len == strlen(words[k]) && !strncmp(p, words[k], len);
            if (!known) {
                snprintf(why, cap,
                         "'%.*s': a flag is tokendrop, muon, recipe-mbs, precision-not-stated or a "
                         "recipe setting (cuda_graphs, overlap, delay_wgrad, ep_sms) with a value",
                         (int)(len < 40 ? len : 40), p);
                return false;
            }
            r->unmodelled |=
                (len == 9 && !strncmp(p, "tokendrop", 9)) || (len == 4 && !strncmp(p, "muon", 4));
        }
        if (eq) {
            char key[32], val[64];
            size_t kl = (size_t)(eq - p), vl = len - kl - 1;
            bool known = false;
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                known |= kl == strlen(keys[k]) && !strncmp(p, keys[k], kl);
            if (!known || vl == 0 || vl >= sizeof val) {
                snprintf(why, cap,
                         "'%.*s': a recipe setting is cuda_graphs, overlap, delay_wgrad or ep_sms "
                         "with a value",
                         (int)(len < 40 ? len : 40), p);
                return false;
            }
            snprintf(key, sizeof key, "%.*s", (int)kl, p);
            snprintf(val, sizeof val, "%.*s", (int)vl, eq + 1);
            if (!layout_col(key, val, why, cap)) return false;
            int w =
                snprintf(r->recipe + n, sizeof r->recipe - n, "%s%s=%s", n ? "," : "", key, val);
            if (w < 0 || (size_t)w >= sizeof r->recipe - n) {
                snprintf(why, cap, "too many recipe settings");
                return false;
            }
            n += (size_t)w;
        }
        p += len + (p[len] == ',');
        if (p[-1] == ',' && !*p) {
            *at = (int)(p - v);
            snprintf(why, cap, "an empty item");
            return false;
        }
    }
    return true;
}

/* Characters (UTF-8 sequences) from `from` up to `to`: the file's columns count characters. */
static int chars(const char *from, const char *to)
{
    int c = 0;
    for (const char *p = from; p < to; p++) c += ((unsigned char)*p & 0xc0) != 0x80;
    return c;
}

/* One data line, split in place at the tabs; col0[i]: the column (1-based character) where cell
 * i starts. */
static enum moe_status parse_row(char *line, const char *file, int lineno, struct plan_published *r,
                                 struct moe_error *err)
{
    char *col[NCOLS];
    int n = 0;
    for (char *p = line; p; n++) { /* every tab counted: a column past the last is an error */
        char *tab = strchr(p, '\t');
        if (n < NCOLS) col[n] = p;
        if (tab) *tab = '\0';
        p = tab ? tab + 1 : NULL;
    }
    if (n != NCOLS)
        return moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, 1, "%d columns, not %d", n,
                                NCOLS);
    memset(r, 0, sizeof *r);
    r->file = file;
    r->line = lineno;
    for (int i = 0; i < NCOLS; i++) r->col[i] = chars(line, col[i]) + 1;
    bool ok = true;
    int bad = -1;
    char why[160] = "";
#define TEXT(i, field)                                                                             \
    if (ok && !(ok = text_col(r->field, sizeof r->field, col[i])))                                 \
    bad = i, snprintf(why, sizeof why, "over %zu characters", sizeof r->field - 1)
#define INT(i, field, lo, hi)                                                                      \
    if (ok && !(ok = int_col(&r->field, col[i], lo, hi)))                                          \
    bad = i, snprintf(why, sizeof why, "a whole number in [%d, %d]", lo, hi)
#define RECIPE(i, key)                                                                             \
    if (ok && !(ok = layout_col(key, col[i], why, sizeof why))) bad = i
    TEXT(0, id);
    TEXT(1, container);
    char gen[8];
    generation(r->container, gen);
    if (ok && !gen[0])
        ok = false, bad = 1, snprintf(why, sizeof why, "a container tag YY.MM or YY.MM.xx");
    TEXT(2, model);
    TEXT(3, cluster);
    INT(4, gpus, 1, PLAN_MAX_GPUS);
    RECIPE(5, "precision");
    TEXT(5, precision);
    INT(6, gbs, 1, COST_MAX_GBS);
    INT(7, mbs, 1, COST_MAX_MBS);
    INT(8, seq, 2, COST_MAX_SEQ);
    INT(9, tp, 1, PLAN_MAX_GPUS);
    INT(10, pp, 1, COST_MAX_PP);
    INT(11, cp, 1, PLAN_MAX_GPUS);
    INT(12, vpp, 1, COST_MAX_STAGES);
    INT(13, ep, 1, MDL_MAX_EXPERTS);
    RECIPE(14, "recompute");
    TEXT(14, recompute);
    RECIPE(15, "pp_layout");
    TEXT(15, pp_layout);
    r->mtp = -1;
    if (ok && strcmp(col[16], "-")) INT(16, mtp, 0, MDL_MAX_MTP);
    RECIPE(17, "dispatcher");
    TEXT(17, dispatcher);
    RECIPE(18, "grad_reduce");
    TEXT(18, grad_reduce);
    RECIPE(19, "moments");
    TEXT(19, moments);
    if (ok && strcmp(col[22], "A") && strcmp(col[22], "B"))
        ok = false, bad = 22, snprintf(why, sizeof why, "A (trusted) or B (flagged)");
    r->trusted = ok && !strcmp(col[22], "A");
    TEXT(23, flags);
    int at = 0;
    if (ok && strcmp(col[23], "-") && !(ok = flags_col(r, col[23], &at, why, sizeof why))) bad = 23;
#undef TEXT
#undef INT
#undef RECIPE
    for (int i = 20; ok && i < 22; i++) {
        char *end;
        double v = strtod(col[i], &end);
        bool decimal = col[i][0] && strspn(col[i], "0123456789.") == strlen(col[i]);
        if (end == col[i] || *end || !decimal || !(v > 0 && v < 1e9))
            ok = false, bad = i, snprintf(why, sizeof why, "a decimal number in (0, 1e9)");
        *(i == 20 ? &r->tokens_per_s_gpu : &r->tflops_gpu) = v;
    }
    if (!ok)
        return moe_error_set_at(err, MOE_ERR_INPUT, file, lineno,
                                r->col[bad] + (bad == 23 ? chars(col[23], col[23] + at) : 0),
                                "column %d (%s): '%s': %s", bad + 1, columns[bad], col[bad], why);
    if (!strcmp(r->pp_layout, "-")) r->pp_layout[0] = '\0';
    /* the parallel degrees in 64 bits: each is at most 2^20, their product is not */
    int64_t model_gpus = (int64_t)r->tp * r->pp * r->cp;
    if (r->gpus % model_gpus != 0)
        return moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, r->col[9],
                                "tp x pp x cp = %d x %d x %d = %lld does not divide the %d GPUs",
                                r->tp, r->pp, r->cp, (long long)model_gpus, r->gpus);
    char text[COST_LAYOUT_TEXT_MAX];
    if (!plan_published_layout(r, text, sizeof text))
        return moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, 1,
                                "%s: its layout (columns 5-20 and the flags' settings) is over %d "
                                "characters",
                                r->id, COST_LAYOUT_TEXT_MAX - 1);
    return MOE_OK;
}

/* The first byte of `text` that a published-runs file may not hold, with its line and column:
 * NUL, a carriage return that does not end a line, another control character than a tab. */
static enum moe_status text_check(const char *file, const char *text, size_t len,
                                  struct moe_error *err)
{
    int line = 1, col = 1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            line++, col = 1;
            continue;
        }
        if (c == '\r' && i + 1 < len && text[i + 1] != '\n')
            return moe_error_set_at(err, MOE_ERR_INPUT, file, line, col,
                                    "a carriage return alone ends a line (classic Mac line ends): "
                                    "save the file with LF or CRLF line ends");
        if (c == '\0')
            return moe_error_set_at(err, MOE_ERR_INPUT, file, line, col,
                                    "a NUL byte: a published-runs file is text");
        if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f)
            return moe_error_set_at(err, MOE_ERR_INPUT, file, line, col,
                                    "control character 0x%02x: a published-runs file is text", c);
        if ((c & 0xc0) != 0x80) col++; /* columns count characters, not UTF-8 bytes */
    }
    return MOE_OK;
}

enum moe_status plan_published_load(const char *file, struct plan_published *rows, int cap, int *n,
                                    struct moe_error *err)
{
    char *text;
    size_t len;
    enum moe_status st = moe_file_read(file, MOE_READ_INPUT, PUBLISHED_MAX_BYTES, &text, &len, err);
    if (st != MOE_OK) return st;
    size_t skip = len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a UTF-8 BOM */
    if (skip) memmove(text, text + 3, len - 2), len -= 3;
    if ((st = text_check(file, text, len, err))) {
        free(text);
        return st;
    }
    int lineno = 0, count = 0;
    bool header = false;
    for (char *line = text, *next; st == MOE_OK && line < text + len; line = next) {
        lineno++;
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : text + len;
        if (nl) *nl = '\0';
        size_t n_line = strlen(line);
        if (n_line && line[n_line - 1] == '\r') line[--n_line] = '\0';
        if (!n_line || line[0] == '#') continue;
        if (!header) { /* the column names, in this order */
            char want[512];
            size_t k = 0;
            for (int i = 0; i < NCOLS; i++)
                k += (size_t)snprintf(want + k, sizeof want - k, "%s%s", i ? "\t" : "", columns[i]);
            if (strcmp(line, want))
                st = moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, 1,
                                      "the header is not the %d columns id, container, model, ... "
                                      "flags (tab-separated)",
                                      NCOLS);
            header = true;
            continue;
        }
        if (count == cap) {
            st = moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, 1, "more than %d rows", cap);
            break;
        }
        st = parse_row(line, file, lineno, &rows[count], err);
        for (int j = 0; st == MOE_OK && j < count; j++)
            if (!strcmp(rows[j].id, rows[count].id))
                st = moe_error_set_at(err, MOE_ERR_INPUT, file, lineno, 1,
                                      "id %s again (first on line %d): ids name one run each",
                                      rows[count].id, rows[j].line);
        if (st == MOE_OK) count++;
    }
    free(text);
    if (st == MOE_OK && !header)
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0, "no header line and no rows");
    *n = st == MOE_OK ? count : 0;
    return st;
}

bool plan_published_in_stack(const struct plan_published *r, const char *stack)
{
    char gen[8];
    generation(r->container, gen);
    return gen[0] && !strncmp(stack, "megatron-", 9) && !strcmp(stack + 9, gen);
}

void plan_published_stack_of(const struct plan_published *r, char *buf, size_t cap)
{
    char gen[8];
    generation(r->container, gen);
    snprintf(buf, cap, "%s%s", gen[0] ? "megatron-" : "", gen);
}

void plan_published_stacks(const struct plan_published *rows, int n, char *buf, size_t cap)
{
    size_t used = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++) {
        char name[32];
        plan_published_stack_of(&rows[i], name, sizeof name);
        bool first = name[0] != '\0';
        for (int j = 0; j < i && first; j++) first = !plan_published_in_stack(&rows[j], name);
        if (first) used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", name);
    }
}

bool plan_published_layout(const struct plan_published *r, char *buf, size_t cap)
{
    int dp = r->gpus / (r->tp * r->pp * r->cp); /* the loader checked that it divides */
    int k = snprintf(buf, cap,
                     "tp=%d,cp=%d,pp=%d,vpp=%d,ep=%d,dp=%d,zero=1,mbs=%d,gbs=%d,precision=%s,"
                     "recompute=%s,dispatcher=%s,grad_reduce=%s,moments=%s",
                     r->tp, r->cp, r->pp, r->vpp, r->ep, dp > 0 ? dp : 1, r->mbs, r->gbs,
                     r->precision, r->recompute, r->dispatcher, r->grad_reduce, r->moments);
    if (k >= 0 && (size_t)k < cap && r->mtp >= 0)
        k += snprintf(buf + k, cap - (size_t)k, ",mtp=%d", r->mtp);
    if (k >= 0 && (size_t)k < cap && r->pp_layout[0])
        k += snprintf(buf + k, cap - (size_t)k, ",pp_layout=%s", r->pp_layout);
    if (k >= 0 && (size_t)k < cap && r->recipe[0])
        k += snprintf(buf + k, cap - (size_t)k, ",%s", r->recipe);
    return k >= 0 && (size_t)k < cap;
}

double plan_published_step_us(const struct plan_published *r)
{
    return (double)r->gbs * r->seq / (r->tokens_per_s_gpu * r->gpus) * 1e6;
}

/* A row that its model, cluster or layout refuses: the row's file, line and the cell's column
 * (cell -1: the layout its cells make together, named at the row's start). */
static enum moe_status row_error(const struct plan_published *r, int cell, enum moe_status st,
                                 const struct moe_error *why, struct moe_error *err)
{
    if (st != MOE_ERR_INPUT && st != MOE_ERR_INFEASIBLE && st != MOE_ERR_USAGE) {
        if (err) *err = *why;
        return st;
    }
    if (cell < 0) /* the layout the row's cells make together: no one cell to blame */
        return moe_error_set_at(err, MOE_ERR_INPUT, r->file, r->line, 1,
                                "%s: the layout of its columns 5-20 and 24: %s", r->id,
                                why->message);
    return moe_error_set_at(err, MOE_ERR_INPUT, r->file, r->line, r->col[cell], "%s: %s: %s", r->id,
                            columns[cell], why->message);
}

enum moe_status plan_fit_rows(const struct plan_published *runs, int n, const char *model_dir,
                              const char *topo_dir, struct plan_fit_row *out, struct moe_error *err)
{
    for (int i = 0; i < n; i++) {
        const struct plan_published *r = &runs[i];
        struct plan_fit_row *f = &out[i];
        memset(f, 0, sizeof *f);
        f->run = r;
        f->step_us = plan_published_step_us(r);
        enum moe_status st;
        struct moe_error why;
        /* a model or cluster already resolved for an earlier row is copied, not read again */
        int j = 0;
        while (j < i && strcmp(runs[j].model, r->model)) j++;
        if (j < i)
            f->model = out[j].model;
        else if ((st = mdl_model_resolve(&f->model, r->model, model_dir, &why)))
            return row_error(r, 2, st, &why, err);
        for (j = 0; j < i && strcmp(runs[j].cluster, r->cluster); j++) {
        }
        if (j < i)
            f->cluster = out[j].cluster;
        else if ((st = topo_cluster_resolve(&f->cluster, r->cluster, topo_dir, &why)))
            return row_error(r, 3, st, &why, err);
        char text[COST_LAYOUT_TEXT_MAX];
        plan_published_layout(r, text, sizeof text);
        cost_layout_defaults(&f->layout, r->seq);
        f->layout.mtp = f->model.mtp_layers;
        if ((st = cost_layout_parse(&f->layout, text, &why)) ||
            (st = cost_layout_check(&f->layout, &f->model, r->gpus, &why)))
            return row_error(r, -1, MOE_ERR_INPUT, &why, err);
        if (f->layout.ep_sms >= f->cluster.gpu.sms) {
            moe_error_set(&why, MOE_ERR_INPUT, "ep_sms = %d: the %s has %d SMs", f->layout.ep_sms,
                          f->cluster.gpu.name, f->cluster.gpu.sms);
            return row_error(r, 23, MOE_ERR_INPUT, &why, err);
        }
    }
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The fit                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

#define P(field, lo, hi)                                                                           \
    {                                                                                              \
#field, offsetof(struct cost_calibration, field), lo, hi                                   \
    }
const struct plan_fit_param plan_fit_params[] = {
    P(nvlink_eff, 0.1, 1.0),  P(scale_out_eff, 0.1, 1.0),     P(overlap_max, 0.05, 1.0),
    P(launch_us, 0.5, 100.0), P(a2a_latency_us, 1.0, 1000.0), P(attn_sink_eff, 0.05, 1.0)};
#undef P
const int plan_fit_nparams = (int)(sizeof plan_fit_params / sizeof plan_fit_params[0]);

static double *field(struct cost_calibration *c, int i)
{
    return (double *)((char *)c + plan_fit_params[i].offset);
}

/* Sum of squared log errors (plus the prior); every prediction in pred. < 0: an error in err.
 * Step times cannot tell NVLink's all-to-all from its all-reduce: both efficiencies are one. */
static double objective(const struct plan_fit_row *rows, int n, struct cost_calibration *cal,
                        unsigned mask, const struct cost_calibration *center, double prior,
                        double *pred, struct moe_error *err)
{
    double sum = 0.0;
    cal->nvlink_allreduce_eff = cal->nvlink_eff;
    for (int i = 0; i < n; i++) {
        struct cost_ctx ctx;
        plan_fit_row_ctx(&rows[i], cal, &ctx);
        struct cost_result r;
        if (cost_evaluate(&ctx, &rows[i].layout, &r, err) != MOE_OK) return -1.0;
        pred[i] = r.step_us;
        double e = log(r.step_us / rows[i].step_us);
        sum += e * e;
    }
    if (center && prior > 0)
        for (int k = 0; k < plan_fit_nparams; k++)
            if (mask & (1u << k)) {
                double d = log(*field(cal, k) / *field((struct cost_calibration *)center, k));
                sum += prior * d * d;
            }
    return sum;
}

double plan_fit_published(const struct plan_fit_row *rows, int n,
                          const struct cost_calibration *start, unsigned free_mask,
                          const struct cost_calibration *center, double prior,
                          struct cost_calibration *out, double *pred_us, struct moe_error *err)
{
    if (n < 1) {
        moe_error_set(err, MOE_ERR_USAGE, "no rows to fit");
        return -1.0;
    }
    double *pred = malloc(sizeof *pred * (size_t)n);
    if (!pred) {
        moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        return -1.0;
    }
    struct cost_calibration cur = *start, t;
    for (int k = 0; k < plan_fit_nparams; k++) { /* start inside the bounds */
        double *v = field(&cur, k);
        *v = fmin(fmax(*v, plan_fit_params[k].lo), plan_fit_params[k].hi);
    }
    double best = objective(rows, n, &cur, free_mask, center, prior, pred, err);
    /* coordinate steps in log space: x1.5, then smaller, until 1% moves no longer help */
    for (double step = log(1.5); best >= 0 && step > log(1.00005); step *= 0.5) {
        bool moved = true;
        for (int round = 0; moved && round < 200 && best >= 0; round++) {
            moved = false;
            struct cost_calibration before = cur;
            for (int k = 0; k < plan_fit_nparams && best >= 0; k++) {
                if (!(free_mask & (1u << k))) continue;
                for (int dir = -1; dir <= 1; dir += 2) {
                    t = cur;
                    double *v = field(&t, k), old = *v;
                    *v = fmin(fmax(old * exp(dir * step), plan_fit_params[k].lo),
                              plan_fit_params[k].hi);
                    if (*v == old) continue;
                    double o = objective(rows, n, &t, free_mask, center, prior, pred, err);
                    if (o < 0) {
                        best = -1.0;
                        break;
                    }
                    if (o < best * (1.0 - 1e-9)) {
                        best = o, cur = t, moved = true;
                        /* down a valley: keep going that way, twice as far each time */
                        for (double g = 2.0; best >= 0; g *= 2.0) {
                            t = cur;
                            v = field(&t, k), old = *v;
                            *v = fmin(fmax(old * exp(dir * step * g), plan_fit_params[k].lo),
                                      plan_fit_params[k].hi);
                            if (*v == old) break;
                            o = objective(rows, n, &t, free_mask, center, prior, pred, err);
                            if (o < 0) best = -1.0;
                            if (o < 0 || o >= best * (1.0 - 1e-9)) break;
                            best = o, cur = t;
                        }
                        break;
                    }
                }
            }
            /* Hooke and Jeeves's pattern move: the round's whole change again, while it helps
             * (parameters that trade against each other move together) */
            for (int g = 0; moved && best >= 0 && g < 50; g++) {
                t = cur;
                bool any = false;
                for (int k = 0; k < plan_fit_nparams; k++) {
                    if (!(free_mask & (1u << k))) continue;
                    double *v = field(&t, k), a = *field(&before, k);
                    double nv =
                        fmin(fmax(*v * (*v / a), plan_fit_params[k].lo), plan_fit_params[k].hi);
                    any |= nv != *v;
                    *v = nv;
                }
                if (!any) break;
                double o = objective(rows, n, &t, free_mask, center, prior, pred, err);
                if (o < 0) best = -1.0;
                if (o < 0 || o >= best * (1.0 - 1e-9)) break;
                before = cur, best = o, cur = t;
            }
        }
    }
    double rms = -1.0;
    if (best >= 0 && objective(rows, n, &cur, free_mask, NULL, 0, pred, err) >= 0) {
        double s = 0.0;
        for (int i = 0; i < n; i++) {
            double e = log(pred[i] / rows[i].step_us);
            s += e * e;
            if (pred_us) pred_us[i] = pred[i];
        }
        rms = sqrt(s / n);
        *out = cur;
        out->calibrated = true;
    }
    free(pred);
    return rms;
}

/* ---------------------------------------------------------------------------------------------- */
/* Stack profiles and their cross-validation                                                      */
/* ---------------------------------------------------------------------------------------------- */

void plan_fit_base(struct cost_calibration *cal, const struct cost_calibration *measured)
{
    const struct cost_calibration *m = measured;
    cal->gemm_eff = m->gemm_eff, cal->gemm_eff_fp8 = m->gemm_eff_fp8;
    cal->gemm_eff_fp8_block = m->gemm_eff_fp8_block;
    cal->gemm_eff_fp8_grad = m->gemm_eff_fp8_grad;
    cal->gemm_m_half = m->gemm_m_half, cal->gemm_k_half = m->gemm_k_half;
    cal->gemm_fixed_us = m->gemm_fixed_us;
    cal->gemm_tile_m = m->gemm_tile_m, cal->gemm_tile_n = m->gemm_tile_n;
    memcpy(cal->expert_m_half, m->expert_m_half, sizeof cal->expert_m_half);
    cal->attn_fwd_eff = m->attn_fwd_eff, cal->attn_bwd_eff = m->attn_bwd_eff;
    cal->attn_seq_half = m->attn_seq_half, cal->attn_exp_scale = m->attn_exp_scale;
    cal->attn_wide_eff = m->attn_wide_eff;
    /* a sliding window and sinks as Transformer Engine runs them where the profile measured that
     * (cuDNN's graph both ways: its windowed backward does the causal work; sinks inside the
     * graph), else as the executor does */
    bool te = m->attn_window_cudnn_eff > 0;
    cal->attn_window_eff = te ? m->attn_window_cudnn_eff : m->attn_window_eff;
    cal->attn_window_bwd_eff = te ? m->attn_window_bwd_cudnn_eff : m->attn_window_bwd_eff;
    cal->attn_window_bwd_full = te || m->attn_window_bwd_full;
    bool sinks = m->attn_sink_cudnn_fwd_eff > 0;
    cal->attn_sink_fwd_eff = sinks ? m->attn_sink_cudnn_fwd_eff : m->attn_sink_fwd_eff;
    cal->attn_sink_bwd_eff = sinks ? m->attn_sink_cudnn_bwd_eff : m->attn_sink_bwd_eff;
    cal->hbm_eff = m->hbm_eff;
    cal->gemm_table_n = m->gemm_table_n;
    memcpy(cal->gemm_table, m->gemm_table, sizeof cal->gemm_table);
    memcpy(cal->gemm_table_log, m->gemm_table_log, sizeof cal->gemm_table_log);
}

void plan_fit_row_ctx(const struct plan_fit_row *row, const struct cost_calibration *cal,
                      struct cost_ctx *ctx)
{
    cost_ctx_init(ctx, &row->model, &row->cluster, cal, row->run->gpus);
    if (row->measured) plan_fit_base(&ctx->cal, row->measured);
}

void plan_fit_row_start(const struct plan_fit_row *row, struct cost_calibration *out)
{
    cost_calibration_defaults(out, &row->cluster.gpu);
    if (row->measured) plan_fit_base(out, row->measured);
    /* Megatron-Core quantizes through Transformer Engine (cost.h's quant_kernels_*) */
    out->quant_kernels_fp8 = 3.0, out->quant_kernels_block = 1.0;
}

/* The second stage: the cluster's own rows, pulled towards the shared fit (*out = shared when
 * it has none); *own gets their count, *rms the fit's (< 0: an error in err). */
static enum moe_status fit_system(const struct plan_fit_row *rows, int n, const char *cluster,
                                  const struct cost_calibration *shared,
                                  struct cost_calibration *out, int *own, double *rms,
                                  struct moe_error *err)
{
    struct plan_fit_row *mine = malloc(sizeof *mine * (size_t)n);
    if (!mine) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].run->cluster, cluster)) mine[k++] = rows[i];
    *out = *shared;
    double r = 0.0;
    if (k)
        r = plan_fit_published(mine, k, shared, (1u << plan_fit_nparams) - 1, shared,
                               PLAN_FIT_SYSTEM_PRIOR, out, NULL, err);
    free(mine);
    if (r < 0) return err ? err->status : MOE_ERR_RUNTIME;
    *own = k;
    *rms = r;
    return MOE_OK;
}

/* The first stage: every row together, lightly towards the base (the datasheet's network, the
 * measured compute). */
static double fit_shared(const struct plan_fit_row *rows, int n,
                         const struct cost_calibration *base, struct cost_calibration *out,
                         struct moe_error *err)
{
    return plan_fit_published(rows, n, base, (1u << plan_fit_nparams) - 1, base,
                              PLAN_FIT_SHARED_PRIOR, out, NULL, err);
}

enum moe_status plan_fit_stack(const struct plan_fit_row *rows, int n, const char *cluster,
                               const struct cost_calibration *base, struct cost_calibration *out,
                               int *own, double rms[2], struct moe_error *err)
{
    struct cost_calibration shared;
    double r0 = fit_shared(rows, n, base, &shared, err), r1;
    if (r0 < 0) return err ? err->status : MOE_ERR_RUNTIME;
    int k;
    enum moe_status st = fit_system(rows, n, cluster, &shared, out, &k, &r1, err);
    if (st != MOE_OK) return st;
    if (own) *own = k;
    if (rms) rms[0] = r0, rms[1] = k ? r1 : r0;
    return MOE_OK;
}

static const char *fold_key(const struct plan_fit_row *r, enum plan_fold fold)
{
    return fold == PLAN_FOLD_MODEL ? r->run->model : r->run->cluster;
}

enum moe_status plan_fit_crossval(const struct plan_fit_row *rows, int n, enum plan_fold fold,
                                  double *pred_us, struct moe_progress *bar, struct moe_error *err)
{
    uint64_t base = bar ? bar->done : 0, held = 0;
    struct plan_fit_row *train = malloc(sizeof *train * (size_t)n);
    bool *done = calloc((size_t)n, sizeof *done);
    enum moe_status st =
        train && done ? MOE_OK : moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    for (int i = 0; st == MOE_OK && i < n; i++) {
        if (done[i]) continue;
        const char *key = fold_key(&rows[i], fold);
        int k = 0;
        for (int j = 0; j < n; j++)
            if (strcmp(fold_key(&rows[j], fold), key)) train[k++] = rows[j];
        if (k == 0) {
            st = moe_error_set(err, MOE_ERR_INPUT, "every row is %s: nothing to fit without it",
                               key);
            break;
        }
        /* the fold's shared fit once; each held-out row under its own cluster's second stage
         * (one per cluster) */
        struct cost_calibration ds, shared;
        plan_fit_row_start(&rows[i], &ds);
        if (fit_shared(train, k, &ds, &shared, err) < 0) {
            st = err ? err->status : MOE_ERR_RUNTIME;
            break;
        }
        for (int j = i; st == MOE_OK && j < n; j++) {
            if (done[j] || strcmp(fold_key(&rows[j], fold), key)) continue;
            struct cost_calibration cal;
            int own;
            double rms;
            st = fit_system(train, k, rows[j].run->cluster, &shared, &cal, &own, &rms, err);
            for (int q = j; st == MOE_OK && q < n; q++) {
                if (done[q] || strcmp(fold_key(&rows[q], fold), key) ||
                    strcmp(rows[q].run->cluster, rows[j].run->cluster))
                    continue;
                struct cost_ctx ctx;
                plan_fit_row_ctx(&rows[q], &cal, &ctx);
                struct cost_result r;
                st = cost_evaluate(&ctx, &rows[q].layout, &r, err);
                pred_us[q] = r.step_us;
                done[q] = true;
                if (bar) moe_progress_update(bar, base + ++held);
            }
        }
    }
    free(train);
    free(done);
    return st;
}
