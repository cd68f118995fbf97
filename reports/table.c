/*
 * table.c: aligned text tables and Markdown tables.
 *
 * Cells are stored as strings, so a table can be printed for a terminal and as Markdown from one
 * build; widths are measured in characters (UTF-8 continuation bytes do not count).
 */
#include "rpt.h"

#include <stdlib.h>
#include <string.h>

struct rpt_table {
    int ncols;
    char *header[RPT_MAX_COLS];
    char align[RPT_MAX_COLS];
    char **cells; /* nrows * ncols, NULL for an empty cell */
    size_t nrows, cap_rows;
    int next_col;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; s && *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

struct rpt_table *rpt_table_create(int ncols, const char *const *headers, const char *align)
{
    if (ncols < 1 || ncols > RPT_MAX_COLS) return NULL;
    struct rpt_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ncols = ncols;
    for (int c = 0; c < ncols; c++) {
        t->header[c] = dup_str(headers[c]);
        t->align[c] = (align && c < (int)strlen(align)) ? align[c] : 'l';
        if (!t->header[c]) {
            rpt_table_destroy(t);
            return NULL;
        }
    }
    t->next_col = ncols; /* no row started */
    return t;
}

void rpt_table_destroy(struct rpt_table *t)
{
    if (!t) return;
    for (int c = 0; c < t->ncols; c++) free(t->header[c]);
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++) free(t->cells[i]);
    free(t->cells);
    free(t);
}

enum moe_status rpt_table_row(struct rpt_table *t, struct moe_error *err)
{
    if (t->nrows == t->cap_rows) {
        size_t cap = t->cap_rows ? 2 * t->cap_rows : 16;
        char **cells = realloc(t->cells, cap * (size_t)t->ncols * sizeof *cells);
        if (!cells) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory building a table");
        t->cells = cells;
        t->cap_rows = cap;
    }
    memset(&t->cells[t->nrows * (size_t)t->ncols], 0, (size_t)t->ncols * sizeof *t->cells);
    t->nrows++;
    t->next_col = 0;
    return MOE_OK;
}

enum moe_status rpt_table_cell(struct rpt_table *t, struct moe_error *err, const char *fmt, ...)
{
    if (t->nrows == 0 || t->next_col >= t->ncols)
        return moe_error_set(err, MOE_ERR_RUNTIME, "table: cell outside a row");
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = dup_str(buf);
    if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory building a table");
    t->cells[(t->nrows - 1) * (size_t)t->ncols + (size_t)t->next_col++] = s;
    return MOE_OK;
}

static const char *cell_at(const struct rpt_table *t, size_t row, int col)
{
    const char *s = t->cells[row * (size_t)t->ncols + (size_t)col];
    return s ? s : "";
}

static void print_padded(FILE *out, const char *s, size_t width, char align)
{
    size_t pad = width - text_width(s);
    if (align == 'r')
        fprintf(out, "%*s%s", (int)pad, "", s);
    else
        fprintf(out, "%s%*s", s, (int)pad, "");
}

static void column_widths(const struct rpt_table *t, size_t *w)
{
    for (int c = 0; c < t->ncols; c++) {
        w[c] = text_width(t->header[c]);
        for (size_t r = 0; r < t->nrows; r++) {
            size_t n = text_width(cell_at(t, r, c));
            if (n > w[c]) w[c] = n;
        }
    }
}

void rpt_table_print(const struct rpt_table *t, FILE *out)
{
    size_t w[RPT_MAX_COLS];
    column_widths(t, w);
    size_t total = 0;
    for (int c = 0; c < t->ncols; c++) {
        if (c) fputs("  ", out);
        /* The last left-aligned column is not padded: no trailing blanks. */
        if (c == t->ncols - 1 && t->align[c] != 'r')
            fputs(t->header[c], out);
        else
            print_padded(out, t->header[c], w[c], t->align[c]);
        total += w[c] + (c ? 2 : 0);
    }
    fputc('\n', out);
    for (size_t i = 0; i < total; i++) fputc('-', out);
    fputc('\n', out);
    for (size_t r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            if (c) fputs("  ", out);
            if (c == t->ncols - 1 && t->align[c] != 'r')
                fputs(cell_at(t, r, c), out);
            else
                print_padded(out, cell_at(t, r, c), w[c], t->align[c]);
        }
        fputc('\n', out);
    }
}

void rpt_table_print_markdown(const struct rpt_table *t, FILE *out)
{
    fputc('|', out);
    for (int c = 0; c < t->ncols; c++) fprintf(out, " %s |", t->header[c]);
    fputs("\n|", out);
    for (int c = 0; c < t->ncols; c++) fputs(t->align[c] == 'r' ? "---:|" : "---|", out);
    fputc('\n', out);
    for (size_t r = 0; r < t->nrows; r++) {
        fputc('|', out);
        for (int c = 0; c < t->ncols; c++) fprintf(out, " %s |", cell_at(t, r, c));
        fputc('\n', out);
    }
}
