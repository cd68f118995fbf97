/*
 * mip.c: the planner's integer programs on GLPK (see mip.h).
 */
#include "mip.h"

#include <glpk.h>
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct mip {
    int cols, rows;
    enum mip_kind *kind;
    double *lo, *hi, *obj, *rlo, *rhi;
    int *ia, *ja; /* 1-based for GLPK, entry 0 unused */
    double *ar;
    int nz, cap;
    double *warm;
    double known_bound, gap_tol; /* the caller's lower bound on the objective, its gap */
    double bound;                /* the best lower bound seen (the caller's or GLPK's) */
    bool at_gap;                 /* the search was stopped: the incumbent within gap_tol */
};

struct mip *mip_create(int cols, int rows)
{
    if (cols < 1 || rows < 0) return NULL;
    struct mip *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cols = cols;
    p->rows = rows;
    p->kind = calloc((size_t)cols, sizeof *p->kind);
    p->lo = calloc((size_t)cols, sizeof(double));
    p->hi = calloc((size_t)cols, sizeof(double));
    p->obj = calloc((size_t)cols, sizeof(double));
    p->rlo = calloc((size_t)rows + 1, sizeof(double));
    p->rhi = calloc((size_t)rows + 1, sizeof(double));
    if (!p->kind || !p->lo || !p->hi || !p->obj || !p->rlo || !p->rhi) {
        mip_destroy(p);
        return NULL;
    }
    for (int i = 0; i < rows; i++) p->rlo[i] = -HUGE_VAL, p->rhi[i] = HUGE_VAL;
    p->known_bound = -HUGE_VAL;
    return p;
}

void mip_destroy(struct mip *p)
{
    if (!p) return;
    free(p->kind);
    free(p->lo);
    free(p->hi);
    free(p->obj);
    free(p->rlo);
    free(p->rhi);
    free(p->ia);
    free(p->ja);
    free(p->ar);
    free(p->warm);
    free(p);
}

void mip_col(struct mip *p, int j, enum mip_kind kind, double lo, double hi, double obj)
{
    if (j < 0 || j >= p->cols) return;
    p->kind[j] = kind;
    p->lo[j] = lo;
    p->hi[j] = hi;
    p->obj[j] = obj;
}

void mip_row(struct mip *p, int i, double lo, double hi)
{
    if (i < 0 || i >= p->rows) return;
    p->rlo[i] = lo;
    p->rhi[i] = hi;
}

enum moe_status mip_coef(struct mip *p, int i, int j, double a, struct moe_error *err)
{
    if (i < 0 || i >= p->rows || j < 0 || j >= p->cols || !isfinite(a))
        return moe_error_set(err, MOE_ERR_RUNTIME, "mip: bad coefficient (%d, %d)", i, j);
    if (p->nz + 2 > p->cap) {
        int cap = p->cap ? 2 * p->cap : 1024;
        int *ia = realloc(p->ia, sizeof *ia * (size_t)cap), *ja = NULL;
        if (ia) p->ia = ia;
        ja = realloc(p->ja, sizeof *ja * (size_t)cap);
        if (ja) p->ja = ja;
        double *ar = realloc(p->ar, sizeof *ar * (size_t)cap);
        if (ar) p->ar = ar;
        if (!ia || !ja || !ar) return moe_error_set(err, MOE_ERR_NOMEM, "mip: out of memory");
        p->cap = cap;
    }
    p->nz++;
    p->ia[p->nz] = i + 1;
    p->ja[p->nz] = j + 1;
    p->ar[p->nz] = a;
    return MOE_OK;
}

void mip_warm_start(struct mip *p, const double *x)
{
    free(p->warm);
    p->warm = NULL;
    if (!x) return;
    p->warm = malloc(sizeof(double) * ((size_t)p->cols + 1));
    if (!p->warm) return;
    p->warm[0] = 0.0;
    memcpy(p->warm + 1, x, sizeof(double) * (size_t)p->cols);
}

/* The incumbent's objective, or HUGE_VAL while there is none. */
static double incumbent(glp_tree *tree)
{
    glp_prob *lp = glp_ios_get_prob(tree);
    int st = glp_mip_status(lp);
    return st == GLP_FEAS || st == GLP_OPT ? glp_mip_obj_val(lp) : HUGE_VAL;
}

static void callback(glp_tree *tree, void *info)
{
    struct mip *p = info;
    int reason = glp_ios_reason(tree);
    /* Offer the warm start once, at the root: GLPK keeps it if it is feasible. */
    if (reason == GLP_IHEUR && p->warm && glp_ios_curr_node(tree) == 1)
        glp_ios_heur_sol(tree, p->warm);
    if (reason != GLP_IHEUR && reason != GLP_ISELECT && reason != GLP_IBINGO) return;
    /* the bound: the caller's, or the best active node's (minimizing) */
    int best = glp_ios_best_node(tree);
    double b = best ? glp_ios_node_bound(tree, best) : -HUGE_VAL;
    p->bound = fmax(p->known_bound, fmax(p->bound, b));
    double inc = incumbent(tree);
    /* relative to the bound, so "within G" is what the incumbent may exceed the optimum by */
    if (p->gap_tol > 0 && p->bound > 0 && inc <= p->bound * (1.0 + p->gap_tol)) {
        p->at_gap = true;
        glp_ios_terminate(tree);
    }
}

/* GLPK stops on an internal error (a failed assertion, numerical trouble) by calling this hook
 * and then abort(): back to mip_solve instead, whose GLPK state is then freed whole. */
static void on_glpk_error(void *info)
{
    longjmp(*(jmp_buf *)info, 1);
}

static void set_bounds_col(glp_prob *lp, int j, double lo, double hi)
{
    if (isinf(lo) && isinf(hi))
        glp_set_col_bnds(lp, j, GLP_FR, 0, 0);
    else if (isinf(hi))
        glp_set_col_bnds(lp, j, GLP_LO, lo, 0);
    else if (isinf(lo))
        glp_set_col_bnds(lp, j, GLP_UP, 0, hi);
    else if (lo == hi)
        glp_set_col_bnds(lp, j, GLP_FX, lo, hi);
    else
        glp_set_col_bnds(lp, j, GLP_DB, lo, hi);
}

void mip_known_bound(struct mip *p, double bound)
{
    p->known_bound = bound;
}

/* The solve proper; GLPK's internal errors longjmp out of it (mip_solve). */
static enum moe_status solve(struct mip *p, glp_prob *lp, double time_limit_s, double t0,
                             struct plan_mip_report *rep, double *x, struct moe_error *err)
{
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, p->cols);
    if (p->rows) glp_add_rows(lp, p->rows);
    for (int j = 0; j < p->cols; j++) {
        glp_set_col_kind(lp, j + 1, p->kind[j] == MIP_BINARY ? GLP_BV : GLP_CV);
        if (p->kind[j] != MIP_BINARY) set_bounds_col(lp, j + 1, p->lo[j], p->hi[j]);
        glp_set_obj_coef(lp, j + 1, p->obj[j]);
        rep->binaries += p->kind[j] == MIP_BINARY;
    }
    for (int i = 0; i < p->rows; i++) {
        double lo = p->rlo[i], hi = p->rhi[i];
        if (isinf(lo) && isinf(hi))
            glp_set_row_bnds(lp, i + 1, GLP_FR, 0, 0);
        else if (isinf(hi))
            glp_set_row_bnds(lp, i + 1, GLP_LO, lo, 0);
        else if (isinf(lo))
            glp_set_row_bnds(lp, i + 1, GLP_UP, 0, hi);
        else if (lo == hi)
            glp_set_row_bnds(lp, i + 1, GLP_FX, lo, hi);
        else
            glp_set_row_bnds(lp, i + 1, GLP_DB, lo, hi);
    }
    if (p->nz) glp_load_matrix(lp, p->nz, p->ia, p->ja, p->ar);
    rep->rows = p->rows;
    rep->cols = p->cols;
    /* No presolve: the warm start names the columns of this problem, and GLPK's presolver would
     * hand the callback a transformed one. The LP relaxation is then solved first, as
     * glp_intopt requires. */
    glp_smcp sm;
    glp_init_smcp(&sm);
    sm.msg_lev = GLP_MSG_OFF;
    sm.tm_lim = (int)(time_limit_s * 1000.0);
    int lrc = glp_simplex(lp, &sm);
    if (lrc == 0 && glp_get_status(lp) == GLP_NOFEAS) {
        snprintf(rep->status, sizeof rep->status, "infeasible");
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "the integer program has no feasible point");
    }
    if (lrc != 0 || glp_get_status(lp) != GLP_OPT) {
        snprintf(rep->status, sizeof rep->status, "no solution");
        return moe_error_set(err, MOE_ERR_GLPK, "the LP relaxation did not solve: %s",
                             lrc ? moe_glpk_strerror(lrc) : "not optimal");
    }
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_OFF;
    parm.msg_lev = GLP_MSG_OFF;
    parm.mip_gap = 0.0; /* the callback stops at the caller's gap, measured from the bound */
    parm.cb_func = callback;
    parm.cb_info = p;
    double left = time_limit_s - (moe_time_now_s() - t0);
    parm.tm_lim = (int)((left > 0.01 ? left : 0.01) * 1000.0);
    int rc = glp_intopt(lp, &parm);
    int status = glp_mip_status(lp);
    rep->seconds = moe_time_now_s() - t0;
    if (rc != 0 && rc != GLP_ETMLIM && rc != GLP_ESTOP && rc != GLP_ENOPFS)
        return moe_error_set(err, MOE_ERR_GLPK, "glp_intopt failed: %s", moe_glpk_strerror(rc));
    if (rc == GLP_ENOPFS || status == GLP_NOFEAS) {
        snprintf(rep->status, sizeof rep->status, "infeasible");
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "the integer program has no feasible point");
    }
    if (status != GLP_OPT && status != GLP_FEAS) {
        snprintf(rep->status, sizeof rep->status, "no solution");
        return moe_error_set(err, MOE_ERR_GLPK, "GLPK found no solution within %.1f s",
                             time_limit_s);
    }
    rep->objective = glp_mip_obj_val(lp);
    /* proven optimal by GLPK's search, or by meeting the bound */
    rep->optimal = (status == GLP_OPT && rc == 0) ||
                   (p->bound > 0 && rep->objective <= p->bound * (1.0 + 1e-6));
    rep->gap = rep->optimal ? 0.0 : p->bound > 0 ? rep->objective / p->bound - 1.0 : HUGE_VAL;
    if (rep->optimal)
        snprintf(rep->status, sizeof rep->status, "optimal");
    else if (p->at_gap)
        snprintf(rep->status, sizeof rep->status, "within %.3g%% of optimal", 100.0 * rep->gap);
    else if (rc == GLP_ETMLIM)
        snprintf(rep->status, sizeof rep->status, "feasible (time limit)");
    else
        snprintf(rep->status, sizeof rep->status, "feasible");
    for (int j = 0; j < p->cols; j++) x[j] = glp_mip_col_val(lp, j + 1);
    return MOE_OK;
}

enum moe_status mip_solve(struct mip *p, double time_limit_s, double gap_tol,
                          struct plan_mip_report *rep, double *x, struct moe_error *err)
{
    memset(rep, 0, sizeof *rep);
    p->gap_tol = gap_tol;
    p->bound = p->known_bound;
    p->at_gap = false;
    double t0 = moe_time_now_s();
    glp_term_out(GLP_OFF);
    jmp_buf jump;
    glp_prob *volatile lp = NULL;
    if (setjmp(jump)) { /* GLPK's state is undefined now: all of it freed, none of it used */
        glp_error_hook(NULL, NULL);
        glp_free_env();
        rep->seconds = moe_time_now_s() - t0;
        snprintf(rep->status, sizeof rep->status, "no solution (GLPK internal error)");
        return moe_error_set(err, MOE_ERR_GLPK,
                             "GLPK stopped on an internal error (numerical trouble)");
    }
    glp_error_hook(on_glpk_error, &jump);
    lp = glp_create_prob();
    enum moe_status st = solve(p, lp, time_limit_s, t0, rep, x, err);
    glp_delete_prob(lp);
    glp_error_hook(NULL, NULL);
    return st;
}
