/*
 * plan_calib.h: the planner's calibration: the one-GPU jobs `moeplan calibrate` and `validate`
 * run, what they measure and how it is fitted (calib_fit.c), and the published training runs a
 * stack profile is fitted on (published.c). Part of plan.h, which includes it; include plan.h.
 */
#ifndef PLAN_CALIB_H
#define PLAN_CALIB_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Calibration: the jobs, the measurements, the fits (calib_fit.c)                                */
/* ---------------------------------------------------------------------------------------------- */

/* A one-GPU job of calibrate or validate: a proxy of a shipped model (layers, experts: 0 keeps
 * the model's), a sequence, a micro-batch and their count, recompute, a selection-bias skew. */
struct plan_calib_job {
    const char *model;
    int layers, experts, seq, mbs, micro;
    enum cost_recompute recompute;
    double skew;
    enum cost_precision precision;
};

extern const struct plan_calib_job plan_calib_jobs[], plan_valid_jobs[];
extern const int plan_calib_njobs, plan_valid_njobs;
/* "mixtral-8x7b L2 E16 seq 1024 mbs 2 x 1 recompute": the name a profile keeps a job under. */
void plan_calib_job_name(const struct plan_calib_job *j, char *buf, size_t cap);
/* The job's one-GPU plan as plan_load gives it, with the cost model's prediction under cal
 * (routing: NULL for uniform). Free with plan_file_free, also after a failure. */
enum moe_status plan_calib_job_plan(const struct plan_calib_job *j, const char *model_dir,
                                    const struct topo_cluster *cl,
                                    const struct cost_calibration *cal,
                                    const struct cost_routing *routing, struct plan_file *p,
                                    struct moe_error *err);
/* Everything calibrate measures: what the fit reads, what the profile keeps ("measured"), and
 * what --refit reads back from a profile to fit again without a GPU. */
#define PLAN_CALIB_MAX_GEMMS 128
#define PLAN_CALIB_MAX_ATTN 16
#define PLAN_CALIB_ATTN_COLS 9
#define PLAN_CALIB_ATTN_KEY "attention_seqs_seq_h_kv_dqk_dv_window_fwd_bwd_us"
/* attention with sinks: seqs, seq, heads, kv heads, dqk, dv, window, then cuDNN's plain graph's
 * forward and backward us and its graph with sinks' (calibrate's 64-wide shapes) */
#define PLAN_CALIB_MAX_SINK 4
#define PLAN_CALIB_SINK_COLS 11
#define PLAN_CALIB_SINK_KEY                                                                        \
    "attention_sinks_seqs_seq_h_kv_dqk_dv_window_plain_fwd_bwd_sinks_fwd_bwd_us"
#define PLAN_CALIB_MAX_JOBS 16
#define PLAN_CALIB_MAX_EXPERTS 32
#define PLAN_CALIB_EXPERT_COLS 7 /* experts, top-k, hidden, intermediate, tokens, fwd us, bwd us */
#define PLAN_CALIB_EXPERT_KEY "experts_e_k_h_f_tokens_fwd_bwd_us"
/* the same in fp8: the recipe (its enum cost_precision value) first, then the seven */
#define PLAN_CALIB_FP8_COLS 8
#define PLAN_CALIB_FP8_KEY "experts_fp8_precision_e_k_h_f_tokens_fwd_bwd_us"
struct plan_calib_data {
    char gpu[256], driver[32], date[32], cuda[32], cublas[32], nccl[32];
    char attention[64]; /* whose attention was measured: "cudnn 9.14.0" or "own" */
    double launch_us, copy_us, copy_bytes;
    struct cost_gemm_sample gemm[PLAN_CALIB_MAX_GEMMS];
    int ngemm;
    /* seqs, seq, heads, kv heads, dqk, dv, window (0: causal), forward us, backward us */
    double attn[PLAN_CALIB_MAX_ATTN][PLAN_CALIB_ATTN_COLS];
    int nattn;
    double sink[PLAN_CALIB_MAX_SINK][PLAN_CALIB_SINK_COLS]; /* none: not measured */
    int nsink;
    double expert[PLAN_CALIB_MAX_EXPERTS][PLAN_CALIB_EXPERT_COLS]; /* measure_experts' rows */
    int nexpert;
    double expert8[PLAN_CALIB_MAX_EXPERTS][PLAN_CALIB_FP8_COLS]; /* its fp8 rows (none: no fp8) */
    int nexpert8;
    struct plan_calib_job job[PLAN_CALIB_MAX_JOBS];
    char model[PLAN_CALIB_MAX_JOBS][64];
    double got[PLAN_CALIB_MAX_JOBS][COST_NPHASES]; /* each job's median phases, us */
    int njobs;
    bool quick;
};

/* A profile's "measured" back into the data (calibrate --refit). */
enum moe_status plan_calib_data_load(const char *file, struct plan_calib_data *d,
                                     struct moe_error *err);
/* Fit the data into a profile and write it to `file` ("moeplan.calibration", the measurements
 * kept; NULL: fit only, as `moeplan check` does); `how` names the command in it; the fits'
 * numbers are printed to `log`. */
enum moe_status plan_calib_fit_save(const struct plan_calib_data *d, const struct topo_cluster *cl,
                                    const char *model_dir, const char *how, const char *file,
                                    FILE *log, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Published runs (published.c)                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* One published training run (tests/data/published/mb-runs.tsv's columns): what ran, its recipe
 * settings, and its speed as published. */
#define PLAN_PUBLISHED_MAX 512
#define PLAN_PUBLISHED_COLS 24
struct plan_published {
    char id[16], container[16], model[64], cluster[64], precision[16], recompute[96];
    char pp_layout[COST_PP_LAYOUT_MAX], dispatcher[16], grad_reduce[8], moments[8], flags[128];
    char recipe[128]; /* the recipe's overhead settings among the flags, as layout text */
    bool unmodelled;  /* ran what moeplan does not model (flagged tokendrop: dropped tokens at a
                       * capacity factor; muon: the Muon optimizer, not Adam): fitted on by none */
    int gpus, gbs, mbs, seq, tp, pp, cp, vpp, ep, mtp; /* mtp -1: the model's */
    double tokens_per_s_gpu, tflops_gpu;
    bool trusted;     /* conf A */
    const char *file; /* the file it was read from (the loader's argument: it must outlive rows) */
    int line;         /* in the file */
    int col[PLAN_PUBLISHED_COLS]; /* where each cell starts on its line (1-based characters) */
};
/* Every row of a published-runs file (tab-separated, '#' comments, a header line); a bad row is
 * an error naming file:line and the column. */
enum moe_status plan_published_load(const char *file, struct plan_published *rows, int cap, int *n,
                                    struct moe_error *err);
/* Stacks: a row of container 26.04 or 26.04.01 belongs to the stack "megatron-26.04", exactly
 * (no prefix matches); _stack_of names a row's stack ("" for a container not of the YY.MM form);
 * _stacks lists the stacks of rows, comma-separated, in first-seen order. */
bool plan_published_in_stack(const struct plan_published *r, const char *stack);
void plan_published_stack_of(const struct plan_published *r, char *buf, size_t cap);
void plan_published_stacks(const struct plan_published *rows, int n, char *buf, size_t cap);
/* The row's layout as `--layout` text (cost_layout_parse), ZeRO-1 and dp from the GPUs; false
 * when it does not fit in cap (the loader refuses such a row: COST_LAYOUT_TEXT_MAX always
 * holds a loaded row's). */
bool plan_published_layout(const struct plan_published *r, char *buf, size_t cap);
/* The step time the row's tokens/s/GPU imply: gbs x seq / (tokens/s/GPU x GPUs), us. */
double plan_published_step_us(const struct plan_published *r);

/* A row ready to predict: its model, cluster and layout resolved once. */
struct plan_fit_row {
    const struct plan_published *run;
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_layout layout;
    double step_us; /* published */
    /* the compute as measured on this row's GPU (plan_fit_base), over whatever the calibration it
     * is predicted with says; NULL: that calibration's own */
    const struct cost_calibration *measured;
};
enum moe_status plan_fit_rows(const struct plan_published *runs, int n, const char *model_dir,
                              const char *topo_dir, struct plan_fit_row *out,
                              struct moe_error *err);
/* The calibration fields a stack profile fits, with their bounds (efficiencies <= 1): what one GPU
 * cannot measure (NVLink, the network, overlap, the per-kernel host overhead, the all-to-all's
 * latency, and attention with sinks, which no measured kernel runs); NVLink's all-reduce
 * efficiency follows its all-to-all one (step times cannot tell them apart). */
struct plan_fit_param {
    const char *name;
    size_t offset; /* in struct cost_calibration */
    double lo, hi;
};
extern const struct plan_fit_param plan_fit_params[];
extern const int plan_fit_nparams;
/* Least squares of log(predicted / published step) over the rows, from `start`, each free
 * parameter (bit i of `free_mask` for plan_fit_params[i]) within its bounds, plus `prior` x the
 * squared log distance of each from `center` (0: none). The fitted calibration in *out, every
 * row's predicted step in pred_us (n), the rms of the log errors returned (< 0: an error). */
double plan_fit_published(const struct plan_fit_row *rows, int n,
                          const struct cost_calibration *start, unsigned free_mask,
                          const struct cost_calibration *center, double prior,
                          struct cost_calibration *out, double *pred_us, struct moe_error *err);

/* A stack profile for `cluster`: every row fitted together (towards `base`, lightly), then the
 * cluster's own rows (towards that shared fit: a system has a handful of rows). Without rows of
 * the cluster the shared fit is the profile. *own gets the cluster's row count; the rms log
 * errors of the two fits in rms[0], rms[1] (rms[1] = rms[0] without own rows). */
#define PLAN_FIT_SHARED_PRIOR 0.02
/* Where a stack fit starts: a datasheet calibration (`cal`) with the compute a GPU measured in
 * `measured` (a `moeplan calibrate` profile): GEMM efficiencies by precision and their size
 * terms, the attention kernels', HBM's. They are fractions of each GPU's datasheet peak, so a
 * Hopper measurement anchors Blackwell by the datasheets' ratios; the fit never moves them. */
void plan_fit_base(struct cost_calibration *cal, const struct cost_calibration *measured);
/* The cost context a row is predicted in under `cal`: its model, cluster and GPUs, `cal` with the
 * row's own measured compute (its `measured`) */
void plan_fit_row_ctx(const struct plan_fit_row *row, const struct cost_calibration *cal,
                      struct cost_ctx *ctx);
/* Where a fit for the row's system starts: the datasheet's calibration of its GPU with the row's
 * measured compute */
void plan_fit_row_start(const struct plan_fit_row *row, struct cost_calibration *out);
/* The measured profiles stack fits keep the compute of (under the data folder), unless
 * `calibrate --measured` names one for every row: each GPU's own where one is shipped
 * (PLAN_MEASURED_DIR/<gpu>.json, e.g. h100.json), else the H200's. */
#define PLAN_MEASURED_DIR "topologies/calibration"
#define PLAN_MEASURED_PROFILE PLAN_MEASURED_DIR "/h200.json"
#define PLAN_MEASURED_GPU "H200" /* the GPU that one must name */
#define PLAN_FIT_SYSTEM_PRIOR 0.2
enum moe_status plan_fit_stack(const struct plan_fit_row *rows, int n, const char *cluster,
                               const struct cost_calibration *base, struct cost_calibration *out,
                               int *own, double rms[2], struct moe_error *err);
/* Cross-validation: each row predicted by the stack profile fitted without the rows of its fold,
 * folds by model or by system (leave one model out, leave one system out), every row's compute
 * its own measured one (plan_fit_row_ctx). `bar` (may be NULL) advances by one per row
 * predicted. */
enum plan_fold { PLAN_FOLD_MODEL = 0, PLAN_FOLD_SYSTEM };
enum moe_status plan_fit_crossval(const struct plan_fit_row *rows, int n, enum plan_fold fold,
                                  double *pred_us, struct moe_progress *bar, struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* PLAN_CALIB_H */
