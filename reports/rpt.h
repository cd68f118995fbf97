/*
 * rpt.h: the one public header of reports/: tables for the terminal and reports for humans.
 *
 * A struct rpt_table collects rows of text cells and prints them aligned, with a header rule,
 * either for a terminal or as a Markdown table (the same table lands in reports and notes).
 * Charts (svg.c) are standalone SVG that renders on GitHub: no script, no external assets.
 */
#ifndef RPT_H
#define RPT_H

#include "moe_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RPT_MAX_COLS 32

struct rpt_table; /* opaque */

/* `align` has one letter per column: 'l' left, 'r' right. Returns NULL when out of memory. */
struct rpt_table *rpt_table_create(int ncols, const char *const *headers, const char *align);
void rpt_table_destroy(struct rpt_table *t);
/* Start a row, then add its cells left to right; a row left short prints empty cells. */
enum moe_status rpt_table_row(struct rpt_table *t, struct moe_error *err);
enum moe_status rpt_table_cell(struct rpt_table *t, struct moe_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Print aligned for a terminal ("  " between columns, a rule under the header). */
void rpt_table_print(const struct rpt_table *t, FILE *out);
/* Print as a GitHub Markdown table. */
void rpt_table_print_markdown(const struct rpt_table *t, FILE *out);

/* Charts. Same data, same bytes. Errors: MOE_ERR_INPUT for no data or a value that is not a
 * number, MOE_ERR_IO when writing failed. */
#define RPT_SVG_MAX_SERIES 4
/* Horizontal bars: n rows (labels), ns series each; values[i * ns + s]; negatives left of 0. */
enum moe_status rpt_svg_bars(FILE *f, const char *title, const char *unit,
                             const char *const *labels, int n, const char *const *series, int ns,
                             const double *values, struct moe_error *err);
/* Lines: n points x, ns series y[s * n + i]. */
enum moe_status rpt_svg_lines(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                              const double *x, int n, const char *const *series, int ns,
                              const double *y, struct moe_error *err);

/* Scatter on log axes: n points x, ns series y[s * n + i] (all > 0), the diagonal y = x and a
 * band of +-band (0.1: 10%) around it. */
enum moe_status rpt_svg_scatter(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                                const double *x, int n, const char *const *series, int ns,
                                const double *y, double band, struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* RPT_H */
