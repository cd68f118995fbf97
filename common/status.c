/*
 * status.c: status names, exit codes and the error report.
 *
 * An error report is filled once, where the failure is first seen; callers up the stack pass it
 * on untouched, so the message a user reads names the real cause (and, for input, where it is).
 */
#include "moe_common.h"

#include <string.h>

const char *moe_status_name(enum moe_status st)
{
    switch (st) {
    case MOE_OK: return "ok";
    case MOE_ERR_USAGE: return "usage error";
    case MOE_ERR_INPUT: return "invalid input";
    case MOE_ERR_INFEASIBLE: return "infeasible";
    case MOE_ERR_VERIFY: return "verification failed";
    case MOE_ERR_RUNTIME: return "runtime error";
    case MOE_ERR_IO: return "I/O error";
    case MOE_ERR_NOMEM: return "out of memory";
    case MOE_ERR_UNSUPPORTED: return "not supported";
    case MOE_ERR_CUDA: return "CUDA error";
    case MOE_ERR_CUBLAS: return "cuBLAS error";
    case MOE_ERR_NCCL: return "NCCL error";
    case MOE_ERR_GLPK: return "GLPK error";
    case MOE_ERR_NUMERICS: return "NaN or Inf in training";
    case MOE_ERR_GPU_NOMEM: return "out of GPU memory";
    case MOE_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown status";
}

/* The exit codes, in one place: `moeplan --help` prints this table, the README shows it, and
 * test_cli checks that both say the same as this. */
static const struct moe_exit_code exit_codes[] = {
    {"0", "success"},
    {"1", "runtime failure (CUDA, cuBLAS, NCCL, GLPK, a file, memory, GPU memory; a command this "
          "build lacks)"},
    {"2", "usage error (a `try 'moeplan CMD --help'` line follows)"},
    {"3", "invalid input (file:line:col where it applies)"},
    {"4", "infeasible: no layout fits, or the given one does not"},
    {"5", "verification failed (run --max-error)"},
    {"6", "NaN or Inf in training"},
    {"128+N", "stopped by signal N: 130 for SIGINT, 143 for SIGTERM (run, after a checkpoint)"},
};

const struct moe_exit_code *moe_exit_codes(size_t *n)
{
    *n = sizeof exit_codes / sizeof exit_codes[0];
    return exit_codes;
}

int moe_status_exit_code(enum moe_status st)
{
    switch (st) {
    case MOE_OK: return 0;
    case MOE_ERR_USAGE: return 2;
    case MOE_ERR_INPUT: return 3;
    case MOE_ERR_INFEASIBLE: return 4;
    case MOE_ERR_VERIFY: return 5;
    case MOE_ERR_NUMERICS: return 6;
    case MOE_ERR_INTERRUPTED: return 130;
    default: return 1;
    }
}

static void error_fill(struct moe_error *err, enum moe_status st, const char *fmt, va_list ap)
{
    err->status = st;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
}

void moe_error_clear(struct moe_error *err)
{
    if (err) memset(err, 0, sizeof *err);
}

enum moe_status moe_error_set(struct moe_error *err, enum moe_status st, const char *fmt, ...)
{
    if (!err) return st;
    moe_error_clear(err);
    va_list ap;
    va_start(ap, fmt);
    error_fill(err, st, fmt, ap);
    va_end(ap);
    return st;
}

enum moe_status moe_error_set_at(struct moe_error *err, enum moe_status st, const char *file,
                                 int line, int col, const char *fmt, ...)
{
    if (!err) return st;
    moe_error_clear(err);
    va_list ap;
    va_start(ap, fmt);
    error_fill(err, st, fmt, ap);
    va_end(ap);
    if (file) snprintf(err->file, sizeof err->file, "%s", file);
    err->line = line;
    err->col = col;
    return st;
}

enum moe_status moe_error_set_src(struct moe_error *err, enum moe_status st, const char *src_file,
                                  int src_line, const char *fmt, ...)
{
    if (!err) return st;
    moe_error_clear(err);
    va_list ap;
    va_start(ap, fmt);
    error_fill(err, st, fmt, ap);
    va_end(ap);
    err->src_file = src_file;
    err->src_line = src_line;
    return st;
}

void moe_error_format(const struct moe_error *err, char *buf, size_t cap)
{
    if (!cap) return;
    if (!err) {
        snprintf(buf, cap, "unknown error");
        return;
    }
    const char *msg = err->message[0] ? err->message : moe_status_name(err->status);
    if (err->file[0] && err->line > 0)
        snprintf(buf, cap, "%s:%d:%d: %s", err->file, err->line, err->col > 0 ? err->col : 1, msg);
    else if (err->file[0])
        snprintf(buf, cap, "%s: %s", err->file, msg);
    else if (err->src_file)
        snprintf(buf, cap, "%s (at %s:%d)", msg, err->src_file, err->src_line);
    else
        snprintf(buf, cap, "%s", msg);
}

const char *moe_glpk_strerror(int rc)
{
    /* Return codes of glp_simplex / glp_intopt, from the GLPK reference manual. */
    switch (rc) {
    case 0: return "success";
    case 0x01: return "invalid basis (GLP_EBADB)";
    case 0x02: return "singular matrix (GLP_ESING)";
    case 0x03: return "ill-conditioned matrix (GLP_ECOND)";
    case 0x04: return "invalid bounds (GLP_EBOUND)";
    case 0x05: return "solver failed (GLP_EFAIL)";
    case 0x06: return "objective lower limit reached (GLP_EOBJLL)";
    case 0x07: return "objective upper limit reached (GLP_EOBJUL)";
    case 0x08: return "iteration limit exceeded (GLP_EITLIM)";
    case 0x09: return "time limit exceeded (GLP_ETMLIM)";
    case 0x0A: return "no primal feasible solution (GLP_ENOPFS)";
    case 0x0B: return "no dual feasible solution (GLP_ENODFS)";
    case 0x0C: return "root LP optimum not provided (GLP_EROOT)";
    case 0x0D: return "search terminated by application (GLP_ESTOP)";
    case 0x0E: return "relative mip gap tolerance reached (GLP_EMIPGAP)";
    case 0x0F: return "no primal/dual feasible solution (GLP_ENOFEAS)";
    case 0x10: return "no convergence (GLP_ENOCVG)";
    case 0x11: return "numerical instability (GLP_EINSTAB)";
    case 0x12: return "invalid data (GLP_EDATA)";
    case 0x13: return "result out of range (GLP_ERANGE)";
    }
    return "unknown GLPK return code";
}
