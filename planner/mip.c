/*
 * mip.c: the planner's integer programs on GLPK (see mip.h).
 */
#include "mip.h"

#include <glpk.h>
#include <math.h>
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
    double best_gap;
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

static void callback(glp_tree *tree, void *info)
{
    struct mip *p = info;
    switch (glp_ios_reason(tree)) {
    case GLP_IHEUR:
        /* Offer the warm start once, at the root: GLPK keeps it if it is feasible. */
        if (p->warm && glp_ios_curr_node(tree) == 1) glp_ios_heur_sol(tree, p->warm);
        break;
    case GLP_IBINGO:
    case GLP_ISELECT: p->best_gap = glp_ios_mip_gap(tree); break;
    default: break;
    }
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

enum moe_status mip_solve(struct mip *p, double time_limit_s, double gap_tol,
                          struct plan_mip_report *rep, double *x, struct moe_error *err)
{
    memset(rep, 0, sizeof *rep);
    double t0 = moe_time_now_s();
    glp_term_out(GLP_OFF);
    glp_prob *lp = glp_create_prob();
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
        glp_delete_prob(lp);
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "the integer program has no feasible point");
    }
    if (lrc != 0 || glp_get_status(lp) != GLP_OPT) {
        snprintf(rep->status, sizeof rep->status, "no solution");
        glp_delete_prob(lp);
        return moe_error_set(err, MOE_ERR_GLPK, "the LP relaxation did not solve: %s",
                             lrc ? moe_glpk_strerror(lrc) : "not optimal");
    }
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_OFF;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = (int)(time_limit_s * 1000.0);
    parm.mip_gap = gap_tol; /* 0: prove optimality, or say the limit cut it short */
    parm.cb_func = callback;
    parm.cb_info = p;
    p->best_gap = HUGE_VAL;
    double left = time_limit_s - (moe_time_now_s() - t0);
    parm.tm_lim = (int)((left > 0.01 ? left : 0.01) * 1000.0);
    int rc = glp_intopt(lp, &parm);
    int status = glp_mip_status(lp);
    enum moe_status st = MOE_OK;
    rep->seconds = moe_time_now_s() - t0;
    if (rc != 0 && rc != GLP_ETMLIM && rc != GLP_EMIPGAP && rc != GLP_ENOPFS) {
        st = moe_error_set(err, MOE_ERR_GLPK, "glp_intopt failed: %s", moe_glpk_strerror(rc));
        goto cleanup;
    }
    if (rc == GLP_ENOPFS || status == GLP_NOFEAS) {
        snprintf(rep->status, sizeof rep->status, "infeasible");
        st = moe_error_set(err, MOE_ERR_INFEASIBLE, "the integer program has no feasible point");
        goto cleanup;
    }
    if (status != GLP_OPT && status != GLP_FEAS) {
        snprintf(rep->status, sizeof rep->status, "no solution");
        st = moe_error_set(err, MOE_ERR_GLPK, "GLPK found no solution within %.1f s", time_limit_s);
        goto cleanup;
    }
    rep->optimal = status == GLP_OPT && rc == 0;
    rep->objective = glp_mip_obj_val(lp);
    rep->gap = rep->optimal ? 0.0 : (isfinite(p->best_gap) ? p->best_gap : HUGE_VAL);
    if (rep->optimal)
        snprintf(rep->status, sizeof rep->status, "optimal");
    else if (rc == GLP_ETMLIM)
        snprintf(rep->status, sizeof rep->status, "feasible (time limit)");
    else if (rc == GLP_EMIPGAP)
        snprintf(rep->status, sizeof rep->status, "within %.4g%% of optimal", 100.0 * rep->gap);
    else
        snprintf(rep->status, sizeof rep->status, "feasible");
    for (int j = 0; j < p->cols; j++) x[j] = glp_mip_col_val(lp, j + 1);
cleanup:
    glp_delete_prob(lp);
    return st;
}
