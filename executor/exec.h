/*
 * exec.h: executor/'s public header: running a plan on GPUs (run.c), and through its includes the
 * rest of the module's interface:
 *   exec_ref.h   the CPU reference (exec_ref_*, plain C in double precision, built everywhere) that
 *                every GPU kernel and backward pass is checked against
 *   exec_dist.h  the distributed runtime: expert parallelism's exchange, transports, launch
 *   exec_gpu.h   the CUDA executor (exec_gpu_*: the training step on one GPU), built where the
 *                CUDA Toolkit is found (MOEPLAN_HAVE_EXECUTOR)
 * No header includes a CUDA header, so the CLI and tests stay plain C11.
 */
#ifndef EXEC_H
#define EXEC_H

#include <signal.h>

#include "exec_gpu.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Running a plan (run.c): every rank's training loop, however its ranks were started             */
/* ---------------------------------------------------------------------------------------------- */

/* How the plan's ranks run. One GPU and no --nccl: a single rank, no transport at all. */
enum exec_run_mode {
    EXEC_RUN_THREADS = 0, /* one process, a thread per GPU of this node (--gpus N), NCCL */
    EXEC_RUN_VIRTUAL,     /* every rank a thread on GPU 0, the local transport (--virtual-ranks) */
    EXEC_RUN_PROCESS,     /* this process is one rank of mpirun or srun (launch), NCCL */
};
extern const char *const exec_run_mode_names[];

struct exec_run_step {
    int step;     /* 1-based */
    bool skipped; /* NaN or Inf: no update (skip_nonfinite); why: the reason */
    char why[256];
    double loss, aux, lr, gnorm;    /* loss and aux: the mean over the global batch */
    double wall_ms;                 /* rank 0's host time of the step */
    struct exec_gpu_step_stats gpu; /* rank 0's phases and host syncs; dispatch: every rank's */
};
struct exec_run_info { /* what the run found before its first step (rank 0's) */
    enum exec_run_mode mode;
    bool transport; /* the ranks talk (NCCL or the local transport) */
    struct exec_device_info dev;
    int ranks, devices; /* ranks of the run; GPUs this process uses */
    int first_step;     /* 0, or the step a resumed run starts from */
    struct exec_adamw opt;
    char data[MOE_PATH_MAX + 64]; /* the data source */
    char binding[320];            /* rank 0's CPU binding, or why there is none */
    char attention[320];          /* which attention rank 0 runs (exec_gpu_attention) */
};
/* The attention core: AUTO (the default) is cuDNN's fused attention where this build has cuDNN
 * and our flash kernel otherwise; OWN and CUDNN ask for one (cuDNN still falls back to ours, with
 * the reason, for a shape it does not take). */

struct exec_run_cfg {
    const struct plan_file *plan;
    enum exec_run_mode mode;
    bool nccl;                 /* one GPU, THREADS: its one rank through NCCL all the same */
    struct exec_launch launch; /* PROCESS: who this process is (exec_launch_detect) */
    const char *id_file;       /* PROCESS: where rank 0 leaves the NCCL id for the others */
    const char *data;          /* training data (NULL: synthetic tokens) */
    uint64_t seed;
    int steps, warmup, streams; /* warmup: the learning rate's warm-up steps, as they are */
    double lr, aux, bias_rate;
    double timeout_s;         /* a collective waited for longer fails the run (60) */
    bool no_grad_overlap;     /* all-reduce the gradients after the backward, not in it */
    const char *ckpt_dir;     /* checkpoints here (NULL: none) ... */
    int ckpt_every;           /* ... every this many steps (0: none) */
    bool resume;              /* start from ckpt_dir's latest checkpoint */
    int fail_rank, fail_step; /* a test of fault handling: that rank stops in the middle of
                               * that step (1-based), the others must fail (-1: none) */
    /* NaN or Inf in the gradients (or the loss): stop the run with MOE_ERR_NUMERICS naming the
     * step, the block and the tensor (false), or skip the step's update (true) and stop after
     * EXEC_MAX_SKIPS skipped in a row. The last checkpoint is from before, untouched. */
    bool skip_nonfinite;
    const char *nan_tensor; /* testing: rank 0 poisons this gradient (or weight) ... */
    int nan_step;           /* ... at this step (1-based; 0: never) */
    bool nan_weight;        /* the weight, at the step's start: the forward meets it */
    /* set asynchronously (a signal handler: nonzero): the ranks agree to stop after the step
     * they are in, write a checkpoint when ckpt_dir is set, and return MOE_ERR_INTERRUPTED */
    const volatile sig_atomic_t *stop;
    double gpu_mem_limit;          /* bytes a rank may allocate (0: the device's) */
    enum exec_attention attention; /* whose attention kernels (exec_attention_cudnn) */
    const double *bias0;           /* (layers, experts) selection biases to start from (NULL:
                           * zeros; a resumed run has its checkpoint's) */
    /* called on rank 0 (its thread, or the rank-0 process) */
    void (*on_start)(void *ctx, const struct exec_run_info *info);
    void (*on_step)(void *ctx, const struct exec_run_step *s);
    void *ctx;
};
struct exec_run_result {         /* filled on rank 0 (the rank-0 process) */
    bool filled;                 /* the run finished: everything below is there */
    struct exec_run_info info;   /* what on_start was given */
    struct exec_run_step *steps; /* the steps run, in order: info.first_step + 1 ... */
    int nsteps;
    int64_t *counts, *coact;       /* (layers, experts), (layers, experts, experts): every rank's */
    struct exec_gpu_memory memory; /* rank 0's */
    struct cost_bytes dispatch;    /* token payload sent in all steps, every rank */
};
/* Trains the plan: checks that this build runs it (exec_layout_runnable), starts the ranks,
 * builds their groups (EP, DP), and runs `steps` steps. A rank that fails or stops makes the
 * others fail within timeout_s; the first failure (by rank) is returned. */
enum moe_status exec_run(const struct exec_run_cfg *c, struct exec_run_result *r,
                         struct moe_error *err);
void exec_run_result_free(struct exec_run_result *r);

/* ---------------------------------------------------------------------------------------------- */
/* What a run comes to, and measured.json (measured.c, plain C)                                   */
/* ---------------------------------------------------------------------------------------------- */

/* A step time's rates, as the plan counts them: tokens of the global batch a second, model
 * TFLOPS per GPU (training FLOPs, recomputation not counted) and their share of the plan GPU's
 * bf16 peak (0: the plan names none). */
struct exec_run_rate {
    double tokens_step, flops_per_token, peak_tflops;
    double tokens_per_s, model_tflops, mfu;
};
struct exec_run_rate exec_run_rate(const struct plan_file *p, double step_ms);

/* A finished run's medians over its steps after the first (cuBLAS's heuristics and the first
 * allocations), skipped steps left out. */
struct exec_run_summary {
    int first_step, counted;              /* the first step in the medians (1-based); how many */
    double phase_ms[COST_NPHASES];        /* COST_STEP: the step */
    struct exec_run_rate rate;            /* of the median step */
    double loss_first, loss_last;         /* the first and the last step run (NaN: skipped) */
    struct cost_bytes dispatch_per_layer; /* sent per GPU, MoE layer and micro-batch */
};
enum moe_status exec_run_summarize(const struct plan_file *p, const struct exec_run_result *r,
                                   struct exec_run_summary *s, struct moe_error *err);
/* measured.json (COST_MEASURED_SCHEMA; read by plan_measured_load and cost_routing_load): the
 * run's settings, device, medians against the plan's prediction, memory, every step, the loss
 * curve and the routing. Written atomically (moe_json_write_atomic). */
enum moe_status exec_measured_save(const char *file, const char *plan_path,
                                   const struct exec_run_cfg *c, const struct exec_run_result *r,
                                   struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* EXEC_H */
