/*
 * test_topo.c: the hwloc this binary runs with.
 */
#include "moe_test.h"

#include "topo.h"

static void test_hwloc_version(void **state)
{
    (void)state;
    char buf[128];
    topo_hwloc_version(buf, sizeof buf);
    /* hwloc 2.x, with the runtime API reported next to the built version. */
    assert_true(buf[0] == '2' && buf[1] == '.');
    assert_non_null(strstr(buf, "(API 0x2"));
    assert_true(topo_hwloc_abi_ok());
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_hwloc_version)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
