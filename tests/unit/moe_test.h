/*
 * moe_test.h: what every cmocka test program of moeplan includes.
 *
 * cmocka needs these system headers before its own; keeping the order in one place avoids
 * a copy in every test file.
 */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A path under the source tree, for shipped and test files. */
static inline const char *moe_test_src(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", MOEPLAN_SOURCE_DIR, rel);
    return buf;
}

#ifdef MDL_H
/* A shipped model by name (model/NAME.json); fails the test when it does not load. */
static inline void moe_test_model(const char *name, struct mdl_model *m)
{
    char dir[1024];
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    if (mdl_model_resolve(m, name, dir, &err) != MOE_OK) fail_msg("%s", err.message);
}
#endif

#endif
