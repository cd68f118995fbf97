/*
 * svg.c: charts as standalone SVG 1.1 that GitHub renders: no script, no external font or
 * stylesheet, every attribute inline, numbers printed with fixed precision so that the same data
 * give the same bytes (golden tests). Two kinds:
 *   bars:  horizontal bars, one row per label, one bar per series (predicted and measured);
 *          negative values (errors) grow left of a zero line;
 *   lines: y against x, one polyline per series (the loss curve);
 *   scatter: predicted against published on log axes, a mark per point and series, the diagonal
 *            and a band of +-`band` around it.
 */
#include "rpt.h"

#include <math.h>
#include <string.h>

static const char *const palette[RPT_SVG_MAX_SERIES] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759"};

/* Text made safe for XML. */
static void put_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void header(FILE *f, double w, double h, const char *title)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
            "font-size=\"12\">\n",
            w, h, w, h);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", w, h);
    fprintf(f,
            "<text x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-size=\"14\" "
            "font-weight=\"bold\">",
            w / 2);
    put_text(f, title);
    fprintf(f, "</text>\n");
}

/* A "nice" axis end at or above x (1, 2 or 5 times a power of ten). */
static double nice_ceil(double x)
{
    if (x <= 0) return 1.0;
    double p = pow(10.0, floor(log10(x)));
    for (int i = 0; i < 3; i++) {
        double m = (double[]){1.0, 2.0, 5.0}[i] * p;
        if (m >= x * (1 - 1e-12)) return m;
    }
    return 10.0 * p;
}

static void legend(FILE *f, const char *const *series, int ns, double x, double y)
{
    for (int s = 0; s < ns; s++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", x,
                y - 10, palette[s]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + 16, y);
        put_text(f, series[s]);
        fprintf(f, "</text>\n");
        x += 24 + 7.0 * (double)strlen(series[s]);
    }
}

enum moe_status rpt_svg_bars(FILE *f, const char *title, const char *unit,
                             const char *const *labels, int n, const char *const *series, int ns,
                             const double *values, struct moe_error *err)
{
    if (n < 1 || ns < 1 || ns > RPT_SVG_MAX_SERIES)
        return moe_error_set(err, MOE_ERR_INPUT, "chart: %d rows, %d series (1 .. %d)", n, ns,
                             RPT_SVG_MAX_SERIES);
    double lo = 0, hi = 0;
    for (int i = 0; i < n * ns; i++) {
        if (!isfinite(values[i]))
            return moe_error_set(err, MOE_ERR_INPUT, "chart \"%s\": value %d is not a number",
                                 title, i);
        if (values[i] < lo) lo = values[i];
        if (values[i] > hi) hi = values[i];
    }
    /* ticks at multiples of a nice step, zero among them */
    double step = nice_ceil((hi - lo) / 4 > 0 ? (hi - lo) / 4 : 0.25);
    hi = ceil(hi / step - 1e-9) * step;
    lo = floor(lo / step + 1e-9) * step;
    if (hi - lo <= 0) hi = lo + step;
    int ticks = (int)((hi - lo) / step + 0.5);
    double left = 130, right = 30, top = 50, row = 8.0 + 12.0 * ns, plot_w = 460;
    double w = left + plot_w + right, h = top + row * n + 50;
    header(f, w, h, title);
    legend(f, series, ns, left, 40);
    double x0 = left + plot_w * (-lo) / (hi - lo);
    for (int k = 0; k <= ticks; k++) {
        double v = lo + step * k, x = left + plot_w * k / ticks;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n",
                x, top, x, top + row * n);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">%.4g</text>\n",
                x, top + row * n + 16, v);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">",
            left + plot_w / 2, top + row * n + 36);
    put_text(f, unit);
    fprintf(f, "</text>\n");
    for (int i = 0; i < n; i++) {
        double y = top + row * i + 4;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", left - 8, y + 6.0 * ns + 4);
        put_text(f, labels[i]);
        fprintf(f, "</text>\n");
        for (int s = 0; s < ns; s++) {
            double v = values[i * ns + s], x = left + plot_w * (v - lo) / (hi - lo);
            double a = v < 0 ? x : x0, b = v < 0 ? x0 : x;
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"11\" fill=\"%s\">"
                    "<title>%.4g %s</title></rect>\n",
                    a, y + 12.0 * s, b - a, palette[s], v, unit);
        }
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000000\"/>\n", x0,
            top, x0, top + row * n);
    fprintf(f, "</svg>\n");
    return ferror(f) ? moe_error_set(err, MOE_ERR_IO, "chart \"%s\": write failed", title) : MOE_OK;
}

/* The axis titles under and left of a plot area. */
static void axis_titles(FILE *f, double left, double top, double pw, double ph, const char *xlabel,
                        const char *ylabel)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">",
            left + pw / 2, top + ph + 36);
    put_text(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\" "
            "transform=\"rotate(-90 14 %.1f)\">",
            top + ph / 2, top + ph / 2);
    put_text(f, ylabel);
    fprintf(f, "</text>\n");
}

/* The plot area's frame, and the end of the SVG. */
static void frame_and_close(FILE *f, double left, double top, double pw, double ph)
{
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#000000\"/>\n</svg>\n",
            left, top, pw, ph);
}

enum moe_status rpt_svg_lines(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                              const double *x, int n, const char *const *series, int ns,
                              const double *y, struct moe_error *err)
{
    if (n < 2 || ns < 1 || ns > RPT_SVG_MAX_SERIES)
        return moe_error_set(err, MOE_ERR_INPUT, "chart: %d points, %d series (2+, 1 .. %d)", n, ns,
                             RPT_SVG_MAX_SERIES);
    double xl = x[0], xh = x[0], yl = INFINITY, yh = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return moe_error_set(err, MOE_ERR_INPUT, "chart \"%s\": x %d is not a number", title,
                                 i);
        xl = fmin(xl, x[i]);
        xh = fmax(xh, x[i]);
        for (int s = 0; s < ns; s++) {
            double v = y[s * n + i];
            if (!isfinite(v))
                return moe_error_set(err, MOE_ERR_INPUT, "chart \"%s\": y %d is not a number",
                                     title, i);
            yl = fmin(yl, v);
            yh = fmax(yh, v);
        }
    }
    if (xh <= xl) xh = xl + 1;
    double pad = (yh - yl) * 0.05 + 1e-12;
    yl -= pad, yh += pad;
    double left = 70, right = 30, top = 50, pw = 500, ph = 260, w = left + pw + right;
    double h = top + ph + 50;
    header(f, w, h, title);
    legend(f, series, ns, left, 40);
    for (int k = 0; k <= 4; k++) {
        double vy = yl + (yh - yl) * k / 4, py = top + ph - ph * k / 4;
        double vx = xl + (xh - xl) * k / 4, px = left + pw * k / 4;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n",
                left, py, left + pw, py);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555555\">%.4g</text>\n",
                left - 6, py + 4, vy);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">%.4g</text>\n",
                px, top + ph + 16, vx);
    }
    axis_titles(f, left, top, pw, ph, xlabel, ylabel);
    for (int s = 0; s < ns; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                palette[s]);
        for (int i = 0; i < n; i++)
            fprintf(f, "%s%.1f,%.1f", i ? " " : "", left + pw * (x[i] - xl) / (xh - xl),
                    top + ph - ph * (y[s * n + i] - yl) / (yh - yl));
        fprintf(f, "\"/>\n");
    }
    frame_and_close(f, left, top, pw, ph);
    return ferror(f) ? moe_error_set(err, MOE_ERR_IO, "chart \"%s\": write failed", title) : MOE_OK;
}

/* Log-axis tick values from lo to hi: 1, 2 and 5 times the powers of ten. */
static int log_ticks(double lo, double hi, double *t, int cap)
{
    int n = 0;
    for (double p = pow(10.0, floor(log10(lo))); p <= hi && n < cap; p *= 10.0)
        for (int k = 0; k < 3 && n < cap; k++) {
            double v = (double[]){1.0, 2.0, 5.0}[k] * p;
            if (v >= lo * (1 - 1e-12) && v <= hi * (1 + 1e-12)) t[n++] = v;
        }
    return n;
}

enum moe_status rpt_svg_scatter(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                                const double *x, int n, const char *const *series, int ns,
                                const double *y, double band, struct moe_error *err)
{
    if (n < 1 || ns < 1 || ns > RPT_SVG_MAX_SERIES)
        return moe_error_set(err, MOE_ERR_INPUT, "chart: %d points, %d series (1+, 1 .. %d)", n, ns,
                             RPT_SVG_MAX_SERIES);
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < n; i++)
        for (int s = -1; s < ns; s++) {
            double v = s < 0 ? x[i] : y[s * n + i];
            if (!isfinite(v) || v <= 0)
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "chart \"%s\": point %d is not a positive number", title, i);
            lo = fmin(lo, v), hi = fmax(hi, v);
        }
    lo = lo / (1.0 + band) / 1.1, hi = nice_ceil(hi * (1.0 + band) * 1.1);
    double left = 70, top = 50, pw = 420, w = left + pw + 30, h = top + pw + 50;
    double l0 = log(lo), span = log(hi) - l0;
#define PX(v) (left + pw * (log(v) - l0) / span)
#define PY(v) (top + pw - pw * (log(v) - l0) / span)
    header(f, w, h, title);
    legend(f, series, ns, left, 40);
    double t[64];
    int nt = log_ticks(lo, hi, t, 64);
    for (int k = 0; k < nt; k++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n",
                left, PY(t[k]), left + pw, PY(t[k]));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n",
                PX(t[k]), top, PX(t[k]), top + pw);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555555\">%.6g</text>\n",
                left - 6, PY(t[k]) + 4, t[k]);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">%.6g</text>\n",
                PX(t[k]), top + pw + 16, t[k]);
    }
    /* the band: between y = x (1 - band) and y = x (1 + band), then the diagonal */
    fprintf(f,
            "<polygon fill=\"#e8e8e8\" fill-opacity=\"0.7\" points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f "
            "%.1f,%.1f\"/>\n",
            PX(lo), PY(lo * (1 + band)), PX(hi / (1 + band)), PY(hi), PX(hi), PY(hi * (1 - band)),
            PX(lo / (1 - band)), PY(lo));
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888888\"/>\n",
            PX(lo), PY(lo), PX(hi), PY(hi));
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < n; i++)
            fprintf(
                f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" fill-opacity=\"0.8\"/>\n",
                PX(x[i]), PY(y[s * n + i]), palette[s]);
#undef PX
#undef PY
    axis_titles(f, left, top, pw, pw, xlabel, ylabel);
    frame_and_close(f, left, top, pw, pw);
    return ferror(f) ? moe_error_set(err, MOE_ERR_IO, "chart \"%s\": write failed", title) : MOE_OK;
}
