/*
 * plan.h: the one public header of planner/: choosing a layout and writing the plan.
 *
 * The planner is the only module that includes glpk.h. It builds and runs without CUDA.
 */
#ifndef PLAN_H
#define PLAN_H

#include "mdl.h"
#include "topo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GLPK library version this binary runs with ("5.0"). */
const char *plan_glpk_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PLAN_H */
