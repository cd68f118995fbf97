/*
 * moe_common.h: the one public header of common/, the layer every other module stands on.
 *
 * What lives here: the status codes and error report every function returns and fills; the
 * check macros (MOE_CHECK, MOE_CUDA_GOTO, ...) that record where a library call failed; JSON input (load with file:line:col errors,
 * strict unpacking into C structs) and output (atomic writes, "schema" and "version" on every
 * file); logging; a progress bar that draws only on a terminal; size, count and bandwidth parsing;
 * a seeded RNG so that every random choice in moeplan is reproducible.
 *
 * Invariants: a function that fails returns a status other than MOE_OK, fills the optional error
 * report, and leaves its outputs untouched. No mutable globals: logging and randomness live in
 * explicit contexts that the caller owns.
 */
#ifndef MOE_COMMON_H
#define MOE_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Status and errors                                                                              */
/* ---------------------------------------------------------------------------------------------- */

enum moe_status {
    MOE_OK = 0,
    MOE_ERR_USAGE,       /* bad command line: exit 2 */
    MOE_ERR_INPUT,       /* invalid input file or value: exit 3 */
    MOE_ERR_INFEASIBLE,  /* no feasible plan or layout: exit 4 */
    MOE_ERR_VERIFY,      /* a check of results failed: exit 5 */
    MOE_ERR_RUNTIME,     /* anything else that went wrong at run time: exit 1 */
    MOE_ERR_IO,          /* a file could not be read or written: exit 1 */
    MOE_ERR_NOMEM,       /* host allocation failed: exit 1 */
    MOE_ERR_UNSUPPORTED, /* not built or not implemented in this build: exit 1 */
    MOE_ERR_CUDA,        /* CUDA runtime or driver: exit 1 */
    MOE_ERR_CUBLAS,      /* cuBLAS: exit 1 */
    MOE_ERR_NCCL,        /* NCCL: exit 1 */
    MOE_ERR_GLPK,        /* GLPK solver failure: exit 1 */
    MOE_ERR_NUMERICS,    /* training met NaN or Inf: exit 6 */
    MOE_ERR_GPU_NOMEM,   /* GPU memory ran out (or passed the set limit): exit 1 */
    MOE_ERR_INTERRUPTED, /* stopped by SIGINT or SIGTERM: exit 128 + the signal (130 here) */
};

#define MOE_MSG_MAX 1024
#define MOE_PATH_MAX 1024

/* An error report. `file`, `line`, `col` point into the user's input where they apply (line 0:
 * none); `src_file`, `src_line` name the place in moeplan's source that raised it. */
struct moe_error {
    enum moe_status status;
    char message[MOE_MSG_MAX];
    char file[MOE_PATH_MAX];
    int line, col;
    const char *src_file;
    int src_line;
};

const char *moe_status_name(enum moe_status st);
/* The process exit code for a status (the table below). */
int moe_status_exit_code(enum moe_status st);
/* Every exit code of moeplan with its meaning, for --help, the README and their test. */
struct moe_exit_code {
    const char *code, *meaning;
};
const struct moe_exit_code *moe_exit_codes(size_t *n);

/* Fill `err` (may be NULL) and return `st`. The `_at` form names a place in an input file. */
enum moe_status moe_error_set(struct moe_error *err, enum moe_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
enum moe_status moe_error_set_at(struct moe_error *err, enum moe_status st, const char *file,
                                 int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
enum moe_status moe_error_set_src(struct moe_error *err, enum moe_status st, const char *src_file,
                                  int src_line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void moe_error_clear(struct moe_error *err);
/* "FILE:LINE:COL: message", "FILE: message" or "message". */
void moe_error_format(const struct moe_error *err, char *buf, size_t cap);

/* The name of a GLPK return code (glp_simplex, glp_intopt): GLPK's documented codes, so that
 * common needs no glpk.h. */
const char *moe_glpk_strerror(int rc);

/* Checks: one family, for our calls and for the libraries'. Each expects an error report pointer
 * `err` (may be NULL) in scope. A library form records the failing call, the library's message
 * and code, and the source line (moe_error_set_src). The library forms expand to the library's
 * own error-string function, so they are used only where its header is included.
 *
 *   MOE_CHECK_GOTO(expr, st, label)       st = expr (a moe_status); on failure goto label
 *   MOE_CUDA_GOTO(call, st, label)        the same for a CUDA runtime call (cuBLAS, NCCL, GLPK:
 *   MOE_CUBLAS_GOTO, MOE_NCCL_GOTO,       their own forms); st gets the error status
 *   MOE_GLPK_GOTO
 *   MOE_CHECK(expr), MOE_CUDA_CHECK(call), in a function that owns nothing to clean up: return
 *   MOE_CUBLAS_CHECK(call)                the error status instead of jumping
 * Kernel launchers return cudaError_t (cudaGetLastError() after their launches): check them
 * with MOE_CUDA_CHECK like any CUDA call.
 */
#define MOE_CHECK_GOTO(expr, st, label)                                                            \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != MOE_OK) goto label;                                                            \
    } while (0)

#define MOE_CHECK(expr)                                                                            \
    do {                                                                                           \
        enum moe_status moe_st_ = (expr);                                                          \
        if (moe_st_ != MOE_OK) return moe_st_;                                                     \
    } while (0)

#define MOE_LIB_GOTO(status_, call, ok_value, strerror_fn, st, label)                              \
    do {                                                                                           \
        int moe_rc_ = (int)(call);                                                                 \
        if (moe_rc_ != (int)(ok_value)) {                                                          \
            (st) = moe_error_set_src(err, (status_), __FILE__, __LINE__, "%s failed: %s (%d)",     \
                                     #call, strerror_fn(moe_rc_), moe_rc_);                        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define MOE_LIB_CHECK(status_, call, ok_value, strerror_fn)                                        \
    do {                                                                                           \
        int moe_rc_ = (int)(call);                                                                 \
        if (moe_rc_ != (int)(ok_value))                                                            \
            return moe_error_set_src(err, (status_), __FILE__, __LINE__, "%s failed: %s (%d)",     \
                                     #call, strerror_fn(moe_rc_), moe_rc_);                        \
    } while (0)

#define moe_cuda_strerror_(rc) cudaGetErrorString((cudaError_t)(rc))
#define moe_cublas_strerror_(rc) cublasGetStatusString((cublasStatus_t)(rc))
#define moe_nccl_strerror_(rc) ncclGetErrorString((ncclResult_t)(rc))
#define MOE_CUDA_GOTO(call, st, label)                                                             \
    MOE_LIB_GOTO(MOE_ERR_CUDA, call, cudaSuccess, moe_cuda_strerror_, st, label)
#define MOE_CUBLAS_GOTO(call, st, label)                                                           \
    MOE_LIB_GOTO(MOE_ERR_CUBLAS, call, CUBLAS_STATUS_SUCCESS, moe_cublas_strerror_, st, label)
#define MOE_NCCL_GOTO(call, st, label)                                                             \
    MOE_LIB_GOTO(MOE_ERR_NCCL, call, ncclSuccess, moe_nccl_strerror_, st, label)
#define MOE_GLPK_GOTO(call, st, label)                                                             \
    MOE_LIB_GOTO(MOE_ERR_GLPK, call, 0, moe_glpk_strerror, st, label)
#define MOE_CUDA_CHECK(call) MOE_LIB_CHECK(MOE_ERR_CUDA, call, cudaSuccess, moe_cuda_strerror_)
#define MOE_CUBLAS_CHECK(call)                                                                     \
    MOE_LIB_CHECK(MOE_ERR_CUBLAS, call, CUBLAS_STATUS_SUCCESS, moe_cublas_strerror_)

/* ---------------------------------------------------------------------------------------------- */
/* Logging                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum moe_log_level { MOE_LOG_ERROR = 0, MOE_LOG_WARN, MOE_LOG_INFO, MOE_LOG_DEBUG };

/* A logging context: where messages go and how many. Messages start with "moeplan: ". */
struct moe_log {
    enum moe_log_level level;
    FILE *out; /* NULL: stderr */
};

void moe_log_init(struct moe_log *log, enum moe_log_level level);
void moe_log_msg(const struct moe_log *log, enum moe_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void moe_log_error(const struct moe_log *log, const struct moe_error *err);
/* `in` as it may reach a terminal: control characters (C0, C1, DEL), the bidirectional
 * overrides and isolates, and bytes that are not UTF-8 written as \xNN; newlines and tabs kept. */
void moe_text_safe(const char *in, char *out, size_t cap);

/* ---------------------------------------------------------------------------------------------- */
/* Progress bar                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* Draws "label [#####     ] 40% 2/5 1.2s" in place, only when `out` is a terminal and enabled.
 * Into a pipe or a file it prints nothing, unless moe_progress_lines asked for a plain line every
 * so many seconds ("moeplan: label: 2/5 (40%), 4.1 s"): for work that runs long enough that a
 * job log should show it is alive. */
struct moe_progress {
    FILE *out;
    bool draw;
    char label[32];
    uint64_t total, done;
    double t0_s;
    int last_percent;
    double every_s, last_line_s; /* lines into a pipe: every_s apart (0: none) */
};

void moe_progress_start(struct moe_progress *p, FILE *out, bool enabled, const char *label,
                        uint64_t total);
/* Where the bar cannot draw (no terminal), a line every `every_s` seconds, the first after that
 * long (so short work prints none). */
void moe_progress_lines(struct moe_progress *p, double every_s);
void moe_progress_update(struct moe_progress *p, uint64_t done);
void moe_progress_finish(struct moe_progress *p);
/* Erase the bar so that a line of output can be printed; the next update draws it again. */
void moe_progress_clear(struct moe_progress *p);

/* ---------------------------------------------------------------------------------------------- */
/* Units                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

/* Counts and sizes: "4096", "64K" (65536), "1.5G", "2Mi", "10KB" (10000), "1e6".
 * K, M, G, T, P alone or with "i" are powers of 1024; KB, MB, GB, TB, PB are powers of 1000;
 * a trailing "B" alone is bytes. The result must be a finite, non-negative number. */
enum moe_status moe_parse_size(const char *text, double *out, struct moe_error *err);
/* The same, whole numbers only, at most 2^53. */
enum moe_status moe_parse_count(const char *text, uint64_t *out, struct moe_error *err);
/* Bandwidth to bytes per second: "400Gbps", "400Gb/s" (bits), "450GB/s", "450GBps" (bytes),
 * decimal prefixes (network convention). */
enum moe_status moe_parse_bandwidth(const char *text, double *bytes_per_s, struct moe_error *err);
/* Human formats: "1.50 GiB", "812.3 us" / "1.234 ms" / "2.500 s". */
void moe_format_bytes(double bytes, char *buf, size_t cap);
/* The median of v[0..n) (sorted in place; the mean of the middle two when n is even; 0 for n 0). */
double moe_median(double *v, size_t n);
void moe_format_time_us(double us, char *buf, size_t cap);

/* Monotonic wall clock in seconds. */
double moe_time_now_s(void);

/* ---------------------------------------------------------------------------------------------- */
/* Random numbers                                                                                 */
/* ---------------------------------------------------------------------------------------------- */

/* xoshiro256** seeded through splitmix64: the same seed gives the same stream on every machine. */
struct moe_rng {
    uint64_t s[4];
};

void moe_rng_seed(struct moe_rng *rng, uint64_t seed);
uint64_t moe_rng_u64(struct moe_rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double moe_rng_uniform(struct moe_rng *rng);
/* Uniform integer in [0, n), unbiased; n > 0. */
uint64_t moe_rng_below(struct moe_rng *rng, uint64_t n);
/* Standard normal (Box-Muller, no cached spare so the stream position is explicit). */
double moe_rng_normal(struct moe_rng *rng);
/* Gamma(shape, 1), shape > 0 (Marsaglia-Tsang). */
double moe_rng_gamma(struct moe_rng *rng, double shape);
/* Fill p[0..n) with a Dirichlet(alpha, ..., alpha) draw (sums to 1). */
void moe_rng_dirichlet(struct moe_rng *rng, double alpha, double *p, size_t n);

#ifdef __cplusplus
}
#endif

#include "moe_json.h" /* JSON and files: the rest of common/'s interface */

#endif /* MOE_COMMON_H */
