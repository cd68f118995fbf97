/*
 * mip.h: a thin, safe layer over GLPK's branch and cut, shared by the planner's integer programs
 * (internal to planner/).
 *
 * GLPK aborts the process on bad arguments, so callers build a struct mip with indices we check
 * here, never raw glp_* calls. The solve has a time limit, takes a warm start (a feasible point
 * from a greedy heuristic, handed to GLPK through its heuristic callback), and reports the status
 * and the optimality gap honestly: a solve cut short by the limit is "feasible", not "optimal".
 */
#ifndef PLAN_MIP_H
#define PLAN_MIP_H

#include "plan.h"

struct mip;

enum mip_kind { MIP_BINARY, MIP_CONTINUOUS };

struct mip *mip_create(int cols, int rows);
void mip_destroy(struct mip *p);
/* Columns and rows are 0-based here. */
void mip_col(struct mip *p, int j, enum mip_kind kind, double lo, double hi, double obj);
/* Row bounds: lo <= a.x <= hi; use -HUGE_VAL / HUGE_VAL for no bound. */
void mip_row(struct mip *p, int i, double lo, double hi);
/* Add a_ij (entries accumulate; the matrix grows as needed). */
enum moe_status mip_coef(struct mip *p, int i, int j, double a, struct moe_error *err);
/* A feasible point to start from (cols values); NULL for none. */
void mip_warm_start(struct mip *p, const double *x);
/* A lower bound on the objective the caller knows (the solve stops, proven optimal, once its
 * best point meets it; it also measures gap_tol); default none. */
void mip_known_bound(struct mip *p, double bound);
/* Solve; x (cols) receives the best point found. gap_tol: stop once the best point is proven
 * within this relative gap of the optimum, objective / bound - 1 (0: prove optimality, or the
 * time limit cuts it short). GLPK's internal errors come back as MOE_ERR_GLPK. */
enum moe_status mip_solve(struct mip *p, double time_limit_s, double gap_tol,
                          struct plan_mip_report *rep, double *x, struct moe_error *err);

#endif
