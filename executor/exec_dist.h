/*
 * exec_dist.h: the distributed runtime, plain C: expert parallelism's token exchange (which rows
 * go where, with dedup), the transports (their interface, the in-process local transport of
 * virtual ranks, NCCL), launching ranks, and the reference's EP layer, ZeRO-1 and pipeline
 * schedule. Part of executor/'s public interface (exec.h includes it).
 */
#ifndef EXEC_DIST_H
#define EXEC_DIST_H

#include "exec_ref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Expert parallelism: the token exchange (plain C; the reference and the GPU executor share it)  */
/* ---------------------------------------------------------------------------------------------- */

#define EXEC_EP_MAX_K 16

/* The EP group of a MoE layer. The ranks of an NVLink domain are contiguous, and domains have
 * the same number of ranks (the cluster's). */
struct exec_ep_group {
    int ranks, experts, top_k;
    const int *placement;      /* (experts): the rank that holds expert e */
    const int *domain;         /* (ranks): the NVLink domain of each rank */
    enum cost_dispatcher mode; /* alltoall (no dedup), per GPU, per domain */
};
/* MOE_ERR_INPUT unless the group is well formed (placement in range, domains contiguous and of
 * one size, top_k <= EXEC_EP_MAX_K). */
enum moe_status exec_ep_group_check(const struct exec_ep_group *g, struct moe_error *err);

/* What a row in flight carries besides its payload: the token it stands for, and per routing
 * slot the expert it is bound for on this row's way (-1: not this way) and the slot's weight. */
struct exec_ep_meta {
    int src_rank, src_token;
    int expert[EXEC_EP_MAX_K];
    double weight[EXEC_EP_MAX_K];
};

/* The rows one rank sends in one exchange, grouped by destination in rank order. */
struct exec_ep_rows {
    int ranks, n;
    int *count;                /* (ranks): rows to each destination */
    int *src_row;              /* (n): the sender's row it copies (a token, or a received row) */
    struct exec_ep_meta *meta; /* (n) */
};
void exec_ep_rows_free(struct exec_ep_rows *r);

/* The first hop from rank `me` for its tokens' routing, choice and weight (tokens, top_k).
 * Alltoall: a row per slot. Per GPU: a row per distinct destination rank, carrying every slot
 * bound there. Per domain: per GPU inside me's domain; and a row per remote domain, to the rank
 * of me's index in that domain (the landing rank), carrying all of the domain's slots. Rows to
 * me itself are rows too (the transport copies them), so every rank runs the same code. */
enum moe_status exec_ep_first_hop(const struct exec_ep_group *g, int me, const int *choice,
                                  const double *weight, int tokens, struct exec_ep_rows *out,
                                  struct moe_error *err);
/* The second hop at `me` (per-domain dedup; no rows otherwise): for each row me received in the
 * first hop, a row to every other rank of me's domain that holds some of its slots, with only
 * that rank's slots. */
enum moe_status exec_ep_second_hop(const struct exec_ep_group *g, int me,
                                   const struct exec_ep_meta *recv, int nrecv,
                                   struct exec_ep_rows *out, struct moe_error *err);
/* Slot j of a received row is computed at me. */
bool exec_ep_slot_here(const struct exec_ep_group *g, int me, const struct exec_ep_meta *m, int j);
/* Adds the payload bytes of rows (bytes_per_row each) that leave me: NVLink inside me's
 * domain, scale-out beyond it (the planner's cost_dispatch_bytes_exact counts the same). */
void exec_ep_rows_bytes(const struct exec_ep_group *g, int me, const struct exec_ep_rows *r,
                        double bytes_per_row, struct cost_bytes *acc);

/* A transport moves items between the ranks of a group. Every rank calls every operation, in
 * the same order (collectives); a failure anywhere fails the operation on every rank. */
struct exec_transport;
struct exec_transport_ops {
    /* send[r] to rank r -> recv[s] from rank s */
    enum moe_status (*counts)(struct exec_transport *t, const int *send, int *recv,
                              struct moe_error *err);
    /* items of item_bytes: send holds send_count[r] items for rank r, in rank order; recv gets
     * recv_count[s] items from rank s, in rank order */
    enum moe_status (*alltoallv)(struct exec_transport *t, const void *send, const int *send_count,
                                 void *recv, const int *recv_count, size_t item_bytes,
                                 struct moe_error *err);
    /* x (n doubles) becomes the sum over the ranks, the same on every rank (a fixed order) */
    enum moe_status (*allreduce_sum)(struct exec_transport *t, double *x, size_t n,
                                     struct moe_error *err);
    /* the same for floats (the GPU's gradients) */
    enum moe_status (*allreduce_sum_f32)(struct exec_transport *t, float *x, size_t n,
                                         struct moe_error *err);
    /* x holds ranks x n floats; rank r's part (x + r n) goes to every rank, in place (the
     * sharded optimizer's parameters) */
    enum moe_status (*allgather_f32)(struct exec_transport *t, float *x, size_t n,
                                     struct moe_error *err);
    /* The float all-reduce started after the work queued on `stream` (a cudaStreamT), not
     * waited for: several may be outstanding; `wait` finishes them all (with the deadline). The
     * local transport has no asynchrony: its start completes at once. */
    enum moe_status (*allreduce_f32_start)(struct exec_transport *t, float *x, size_t n,
                                           void *stream, struct moe_error *err);
    enum moe_status (*wait)(struct exec_transport *t, struct moe_error *err);
    /* A sub-group (the plan's EP, expert-DP, DP groups): the ranks passing the same color form
     * one, ordered by rank; *out is this rank's transport in it, released with `release`. */
    enum moe_status (*split)(struct exec_transport *t, int color, struct exec_transport *out,
                             struct moe_error *err);
    void (*release)(struct exec_transport *t); /* a split's transport only */
};
struct exec_transport {
    int rank, ranks;
    const struct exec_transport_ops *ops;
    void *impl;
};

/* The local transport: R virtual ranks of one process, one thread each, host memory. A rank
 * that waits longer than timeout_s in a collective, or whose peer failed, returns MOE_ERR_RUNTIME
 * naming the operation and the ranks that did not arrive: never a hang. */
struct exec_local_hub;
enum moe_status exec_local_hub_create(struct exec_local_hub **out, int ranks, double timeout_s,
                                      struct moe_error *err);
void exec_local_hub_destroy(struct exec_local_hub *h);
/* Where the local transport's buffers live and how it moves them: host memory by default;
 * device memory for virtual ranks on one GPU (exec_local_gpu_memory). `ready` makes a rank's
 * buffers complete before the others read them (a stream's work finished). */
struct exec_local_mem {
    void *(*alloc)(void *ctx, int rank, size_t bytes);
    void (*free)(void *ctx, int rank, void *p);
    enum moe_status (*copy)(void *ctx, int rank, void *dst, const void *src, size_t bytes,
                            struct moe_error *err);
    /* dst[i] = sum over s of src[s][i], in rank order */
    enum moe_status (*sum)(void *ctx, int rank, double *dst, const double *const *src, int ranks,
                           size_t n, struct moe_error *err);
    enum moe_status (*sum_f32)(void *ctx, int rank, float *dst, const float *const *src, int ranks,
                               size_t n, struct moe_error *err);
    enum moe_status (*ready)(void *ctx, int rank, struct moe_error *err);
    void *ctx;
};
/* mem NULL: host memory. Set before exec_local_run. */
void exec_local_hub_set_memory(struct exec_local_hub *h, const struct exec_local_mem *mem);
/* Runs fn on one thread per rank with that rank's transport and error report; the first
 * failure (by rank) is returned, and a failing rank makes the others' collectives fail. */
enum moe_status exec_local_run(struct exec_local_hub *h,
                               enum moe_status (*fn)(struct exec_transport *t, void *arg,
                                                     struct moe_error *err),
                               void *arg, struct moe_error *err);

/* Who this process is in a run of many (launch.c): Open MPI's OMPI_COMM_WORLD_{RANK,SIZE,
 * LOCAL_RANK,LOCAL_SIZE}, else Slurm's SLURM_{PROCID,NTASKS,LOCALID,NTASKS_PER_NODE}, else a
 * single process (`moeplan run --gpus N` then makes its ranks threads). `get` reads a variable
 * (NULL: getenv). Inconsistent values are MOE_ERR_INPUT naming the variable. */
enum exec_launcher {
    EXEC_LAUNCH_SINGLE = 0,
    EXEC_LAUNCH_THREADS,
    EXEC_LAUNCH_MPI,
    EXEC_LAUNCH_SLURM
};
extern const char *const exec_launcher_names[];
struct exec_launch {
    enum exec_launcher who;
    int rank, ranks, local_rank, local_ranks;
};
enum moe_status exec_launch_detect(struct exec_launch *l, const char *(*get)(const char *),
                                   struct moe_error *err);
/* The NCCL id (n bytes) from rank 0 to the others through a file all of them see: rank 0 writes
 * it atomically, the others wait for it up to timeout_s. The path must be unique to the run (a
 * stale file of the same name would be read as the id): include the job id. */
enum moe_status exec_launch_share_id(const char *path, int rank, unsigned char *id, size_t n,
                                     double timeout_s, struct moe_error *err);

/* The reference's expert-parallel MoE layer on rank t->rank: its tokens x (tokens, hidden) go
 * through the exchange to the ranks holding their experts and come back weighted; y (tokens,
 * hidden) equals exec_ref_moe_forward's on those tokens up to the order of the sums. Every rank
 * holds the whole layer but uses the router, the shared experts and its own experts only. The
 * load-balance loss (cfg.aux_coef) is each rank's over its own tokens, as the routing is (its
 * value: exec_ref_moe_aux_loss on this rank's x). `sent` (may be NULL) adds the dispatch payload
 * bytes (hidden doubles a row) by link tier. */
enum moe_status exec_ref_ep_moe_forward(struct exec_transport *t, const struct exec_ep_group *g,
                                        const struct exec_ref_moe *w, const double *x, int tokens,
                                        double *y, struct cost_bytes *sent, struct moe_error *err);
/* Its backward for dy: dx (tokens, hidden); gradients accumulate into gr (the router's and the
 * shared experts' of this rank's tokens, the experts' of this rank's experts). */
enum moe_status exec_ref_ep_moe_backward(struct exec_transport *t, const struct exec_ep_group *g,
                                         const struct exec_ref_moe *w, const double *x, int tokens,
                                         const double *dy, double *dx, struct exec_ref_moe_grad *gr,
                                         struct moe_error *err);

/* exec_ref_model_step with the MoE layers expert-parallel over ep's transport (ep NULL: this
 * rank alone; the group serves every MoE layer): every rank of the group calls it on its own
 * tokens (data-parallel elsewhere), and the gradient holds this rank's share: its tokens' for the
 * replicated parameters, all tokens' for its own experts (zero for the others'), so the sum over
 * the ranks is the global batch's. `route_counts` counts the one-rank step only. */
struct exec_ref_ep {
    struct exec_transport *t;
    const struct exec_ep_group *g;
};
enum moe_status exec_ref_model_step_ep(const struct exec_ref_model *r, const struct exec_ref_ep *ep,
                                       const int *tokens, int T, double *loss, double *aux,
                                       double *grad, struct moe_error *err);

/* A slice of that step, for pipeline stages: blocks [lo, hi) on T - 1 positions. The first
 * stage (lo 0) starts from the embedding of tokens, a later one from h_in (T - 1, hidden); the
 * last (hi = layers) ends in the head and *loss, an earlier one in h_out (may be NULL) with *loss
 * (may be NULL) its load-balance losses. With grad, the backward too, the slice's forward
 * recomputed: from the loss, or from dh_out (the next stage's dh_in), into the embedding's
 * gradient or dh_in. */
enum moe_status exec_ref_model_slice(const struct exec_ref_model *r, const struct exec_ref_ep *ep,
                                     const int *tokens, int T, int lo, int hi, const double *h_in,
                                     double *h_out, const double *dh_out, double *dh_in,
                                     double *loss, double *aux, double *grad,
                                     struct moe_error *err);

/* The reference's ZeRO-1 step on data-parallel rank t->rank (ref_zero.c): grad is this rank's
 * unreduced share (the ranks' sum is the step's gradient); m1, m2 (nparams) are used on this
 * rank's shard only; every rank ends with the same parameters, and *norm the global gradient
 * norm before clipping. */
enum moe_status exec_ref_zero1_step(struct exec_transport *t, struct exec_ref_model *r,
                                    const double *grad, double *m1, double *m2, int step,
                                    const struct exec_adamw *o, double *norm,
                                    struct moe_error *err);

/* The pipeline schedule (ref_pp.c), shared by the reference and the GPU run: rank s of S runs
 * 1F1B (S - 1 - s forwards first, then one forward and one backward, then the backwards left),
 * or Megatron's interleaved 1F1B over its vpp chunks (virtual stages s, s + S, ...), in rounds:
 * in each, every rank runs its next operation if its input has arrived, then one exchange
 * carries the activations forward and the gradients back. */
#define EXEC_PP_MAX_STAGES 64
struct exec_pp_op {
    char kind; /* 'F', 'B', or 0: idle this round */
    int mb, v; /* micro-batch, virtual stage */
};
/* The round table (rounds x S) for M micro-batches; returns the rounds (-1: out of memory, or a
 * schedule that cannot finish). free() the table. */
int exec_pp_rounds(int S, int vpp, int M, struct exec_pp_op **table);
/* Round `row`'s exchange at rank me of S (V virtual stages): send[q] / recv[q] items (`items`
 * each way that moves); returns how many arrive, in rank order, each in arriving[] (at most 2) as
 * (kind, micro-batch, the virtual stage here it is for). */
int exec_pp_round_io(const struct exec_pp_op *row, int S, int V, int me, int items, int *send,
                     int *recv, struct exec_pp_op *arriving);

/* The reference's pipeline-parallel step on rank t->rank of t->ranks, with vpp chunks a rank:
 * blocks [first[v], first[v + 1]) on virtual stage v, which lives on rank v % ranks (first[0] =
 * 0, first[ranks * vpp] = layers), M micro-batches of T tokens (tokens (M, T)) in the 1F1B order
 * (interleaved when vpp > 1: M a multiple of the ranks), activations and their gradients over
 * the transport. grad (nparams): this rank's share of the mean gradient over the micro-batches
 * (zero outside its blocks), so the sum over the ranks is the one-rank step's; loss: the mean
 * loss on the last virtual stage's rank, 0 elsewhere. At most 64 ranks. */
enum moe_status exec_ref_pipeline_step(struct exec_transport *t, const struct exec_ref_model *r,
                                       const int *first, int vpp, const int *tokens, int M, int T,
                                       double *loss, double *grad, struct moe_error *err);

/* The transports over GPUs (CUDA builds: gpu_local.cu, transport_nccl.c). */
/* The local transport's memory for virtual ranks on one GPU (gpu_local.cu): device buffers,
 * rank r's work on streams[r] (cudaStream_t, owned by the caller for the run); at most 64 ranks.
 * Each rank's thread sets its device itself. */
void exec_local_gpu_memory(struct exec_local_mem *mem, void **streams);

/* The NCCL transport (struct exec_transport over one communicator): alltoallv and all-reduce
 * buffers in the rank's GPU memory, counts in host memory (as every transport's). Each operation
 * runs on the transport's own stream and is waited for with a deadline; NCCL's
 * asynchronous errors and a passed deadline abort the communicator and fail with the rank and
 * the operation named. The unique id comes from one rank (exec_nccl_unique_id) and reaches the
 * others by the launcher's means: shared memory (threads), MPI, or a file (Slurm). */
#define EXEC_NCCL_ID_BYTES 128
struct exec_nccl;
enum moe_status exec_nccl_unique_id(unsigned char id[EXEC_NCCL_ID_BYTES], struct moe_error *err);
enum moe_status exec_nccl_create(struct exec_nccl **out, const unsigned char id[EXEC_NCCL_ID_BYTES],
                                 int rank, int ranks, int device, double timeout_s,
                                 struct moe_error *err);
void exec_nccl_destroy(struct exec_nccl *c);
void exec_nccl_transport(struct exec_nccl *c, struct exec_transport *t);

#ifdef __cplusplus
}
#endif

#endif /* EXEC_DIST_H */
