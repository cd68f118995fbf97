/*
 * test_reports.c: tables for the terminal and Markdown, against golden text.
 */
#include "moe_test.h"

#include "rpt.h"

static char *print_to_string(const struct rpt_table *t, bool markdown)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (markdown) rpt_table_print_markdown(t, f);
    else rpt_table_print(t, f);
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
