/*
 * test_planner.c: the GLPK this binary runs with.
 */
#include "moe_test.h"

#include "plan.h"

static void test_glpk_version(void **state)
{
    (void)state;
    const char *v = plan_glpk_version();
    assert_non_null(v);
    int major = 0, minor = -1;
    assert_int_equal(sscanf(v, "%d.%d", &major, &minor), 2);
    assert_true(major >= 4 && minor >= 0); /* glp_intopt's time limit and gap reporting */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_glpk_version)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
