/*
 * glpk_info.c: which GLPK this binary uses.
 */
#include "plan.h"

#include <glpk.h>

const char *plan_glpk_version(void)
{
    return glp_version();
}
