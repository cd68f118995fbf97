/*
 * test_reports.c: tables for the terminal and Markdown, and the SVG charts, against golden text
 * (the .svg files of tests/data/golden/: looked at as PNG, rendered by rsvg-convert, when they were
 * made; to remake one after a deliberate change, delete it and run the test once).
 */
#include "moe_test.h"

#include "rpt.h"

#include <math.h>

static char *print_to_string(const struct rpt_table *t, bool markdown)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (markdown)
        rpt_table_print_markdown(t, f);
    else
        rpt_table_print(t, f);
    fclose(f);
    return buf;
}

static void test_table(void **state)
{
    (void)state;
    const char *headers[] = {"phase", "time", "share"};
    struct rpt_table *t = rpt_table_create(3, headers, "lrr");
    assert_non_null(t);
    struct moe_error err;
    assert_int_equal(rpt_table_row(t, &err), MOE_OK);
    assert_int_equal(rpt_table_cell(t, &err, "%s", "experts_fwd"), MOE_OK);
    assert_int_equal(rpt_table_cell(t, &err, "%.1f us", 812.25), MOE_OK);
    assert_int_equal(rpt_table_cell(t, &err, "%d%%", 47), MOE_OK);
    assert_int_equal(rpt_table_cell(t, &err, "extra"), MOE_ERR_RUNTIME);
    assert_int_equal(rpt_table_row(t, &err), MOE_OK);
    assert_int_equal(rpt_table_cell(t, &err, "r\xc3\xa9seau"), MOE_OK); /* 6 characters */
    assert_int_equal(rpt_table_cell(t, &err, "5.0 us"), MOE_OK);
    for (int i = 0; i < 40; i++) { /* grows past the first allocation */
        assert_int_equal(rpt_table_row(t, &err), MOE_OK);
        assert_int_equal(rpt_table_cell(t, &err, "p%d", i), MOE_OK);
    }
    char *text = print_to_string(t, false);
    const char *golden = "phase            time  share\n"
                         "----------------------------\n"
                         "experts_fwd  812.2 us    47%\n"
                         "r\xc3\xa9seau         5.0 us       \n"
                         "p0                          \n";
    assert_memory_equal(text, golden, strlen(golden));
    free(text);
    text = print_to_string(t, true);
    const char *md = "| phase | time | share |\n"
                     "|---|---:|---:|\n"
                     "| experts_fwd | 812.2 us | 47% |\n";
    assert_memory_equal(text, md, strlen(md));
    free(text);
    rpt_table_destroy(t);
    rpt_table_destroy(NULL);
    assert_null(rpt_table_create(0, headers, "l"));
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[4096];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = 2 * (len + n + 1);
            char *b = realloc(buf, cap);
            if (!b) break;
            buf = b;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    return buf;
}

/* The chart's bytes equal the golden file's (written when missing, so a new chart is looked at). */
static void check_golden(const char *text, const char *name)
{
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "tests/data/golden/%s", name);
    moe_test_src(path, sizeof path, rel);
    char *golden = read_all(path);
    if (!golden) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        fail_msg("%s was missing: written; look at it and run again", path);
    }
    if (strcmp(text, golden)) fail_msg("%s: the chart differs from the golden file", name);
    free(golden);
}

static void test_svg(void **state)
{
    (void)state;
    struct moe_error err;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    const char *labels[] = {"attn_fwd", "experts<bwd>", "optimizer"},
               *series[] = {"predicted", "measured"};
    const double v[] = {4.5, 9.9, 21.6, 20.5, 16.0, 20.4};
    assert_int_equal(rpt_svg_bars(f, "Time & phase", "ms", labels, 3, series, 2, v, &err), MOE_OK);
    fclose(f);
    assert_non_null(strstr(buf, "Time &amp; phase")); /* text is escaped */
    assert_non_null(strstr(buf, "experts&lt;bwd&gt;"));
    assert_null(strstr(buf, "<script"));
    check_golden(buf, "bars.svg");
    free(buf);
    /* errors: negative values left of the zero line */
    f = open_memstream(&buf, &len);
    const double e[] = {-12.5, 30.0, 4.0};
    const char *one[] = {"error"};
    assert_int_equal(rpt_svg_bars(f, "Error per phase", "%", labels, 3, one, 1, e, &err), MOE_OK);
    fclose(f);
    check_golden(buf, "errors.svg");
    free(buf);
    f = open_memstream(&buf, &len);
    const double x[] = {1, 2, 3, 4, 5}, y[] = {11.6, 9.1, 7.3, 6.0, 5.2, 11.6, 9.0, 7.4, 6.1, 5.1};
    const char *two[] = {"moeplan", "reference"};
    assert_int_equal(rpt_svg_lines(f, "Loss curve", "step", "loss", x, 5, two, 2, y, &err), MOE_OK);
    fclose(f);
    check_golden(buf, "lines.svg");
    free(buf);
    /* scatter on log axes with the 10% band: a point on the diagonal, one above, one below */
    f = open_memstream(&buf, &len);
    const double px[] = {1000, 5000, 30000}, py[] = {1000, 6500, 21000, 1100, 5000, 33000};
    assert_int_equal(
        rpt_svg_scatter(f, "Held out", "published", "predicted", px, 3, two, 2, py, 0.10, &err),
        MOE_OK);
    fclose(f);
    check_golden(buf, "scatter.svg");
    free(buf);
    /* bad input: a clear error, nothing assumed */
    f = open_memstream(&buf, &len);
    const double bad[] = {1.0, NAN};
    assert_int_equal(rpt_svg_bars(f, "t", "ms", labels, 2, one, 1, bad, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "not a number"));
    assert_int_equal(rpt_svg_lines(f, "t", "x", "y", x, 1, one, 1, y, &err), MOE_ERR_INPUT);
    const double zero[] = {0.0};
    assert_int_equal(rpt_svg_scatter(f, "t", "x", "y", px, 1, one, 1, zero, 0.1, &err),
                     MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "not a positive number"));
    fclose(f);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_svg)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
