/*
 * exec.h: the one public header of executor/: running a plan on GPUs.
 *
 * Two parts: the CPU reference (exec_ref_*, plain C in double precision), built everywhere, that
 * every GPU kernel and backward pass is checked against; and the CUDA executor (exec_gpu_*: the
 * training step on one GPU), built where the CUDA Toolkit is found (MOEPLAN_HAVE_EXECUTOR).
 * The header includes no CUDA header, so the CLI and tests stay plain C11.
 */
#ifndef EXEC_H
#define EXEC_H

#include <signal.h>

#include "mdl.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* The CPU reference (plain C, double precision; built without CUDA too)                          */
/* ---------------------------------------------------------------------------------------------- */

/* The routing rule of a model's MoE layers (from struct mdl_moe). */
struct exec_router_cfg {
    int experts, top_k;
    enum mdl_scoring scoring;
    int n_group, topk_group;
    bool norm_topk, softmax_after_topk;
    double scaling;
    double aux_coef; /* load-balance loss coefficient (0: none); see ref_moe.c */
};
void exec_router_cfg_from_model(struct exec_router_cfg *cfg, const struct mdl_model *m);

/* One MoE layer's weights, row-major:
 *   router (experts, hidden); bias (experts): added to the scores for selection only
 *   (aux-loss-free balancing), never to the weights;
 *   gate, up (experts, ffn, hidden); down (experts, hidden, ffn);
 *   shared experts fused into one SwiGLU of width shared_ffn (0: none):
 *   sgate, sup (shared_ffn, hidden); sdown (hidden, shared_ffn). */
struct exec_ref_moe {
    struct exec_router_cfg cfg;
    int hidden, ffn, shared_ffn;
    double *router, *bias, *gate, *up, *down, *sgate, *sup, *sdown;
};

/* Gradients of the same shapes (bias has none). */
struct exec_ref_moe_grad {
    double *router, *gate, *up, *down, *sgate, *sup, *sdown;
};

/* Routing of T tokens: choice (T, top_k) expert ids in order of selection, weight (T, top_k). */
void exec_ref_route(const struct exec_router_cfg *cfg, const double *logits, const double *bias,
                    int tokens, int *choice, double *weight);

/* Dropless permutation by a stable counting sort: offsets (experts + 1) and, for each position
 * of the permuted rows, the (token * top_k + slot) it comes from; tokens keep their order within
 * an expert. Every (token, expert) pair is a row: no capacity, no drop. */
void exec_ref_permute(const int *choice, int tokens, int top_k, int experts, int *offsets,
                      int *row_src);

/* y (T, hidden) = shared(x) + sum_j weight_j * expert_{choice_j}(x), with choice and weight
 * returned (T, top_k) when not NULL. */
enum moe_status exec_ref_moe_forward(const struct exec_ref_moe *w, const double *x, int tokens,
                                     double *y, int *choice, double *weight,
                                     struct moe_error *err);
/* Backward: dx (T, hidden) and the weight gradients (accumulated into g) for upstream dy. The
 * routing is recomputed; the top-k choice itself is piecewise constant and passes no gradient. */
enum moe_status exec_ref_moe_backward(const struct exec_ref_moe *w, const double *x, int tokens,
                                      const double *dy, double *dx, struct exec_ref_moe_grad *g,
                                      struct moe_error *err);

/* The load-balance loss of the layer on x (0 when cfg.aux_coef is 0); its gradient is part of
 * exec_ref_moe_backward. */
double exec_ref_moe_aux_loss(const struct exec_ref_moe *w, const double *x, int tokens);

/* The pieces of the layer for those who move its rows elsewhere (the expert-parallel layer):
 * expert e (e = -1: the shared experts) on one row x (hidden) -> out (hidden); its backward for
 * d_out accumulates the weight gradients into g and adds d x into dx. */
void exec_ref_expert_forward(const struct exec_ref_moe *w, int e, const double *x, double *out);
void exec_ref_expert_backward(const struct exec_ref_moe *w, int e, const double *x,
                              const double *d_out, struct exec_ref_moe_grad *g, double *dx);
/* The layer's routing of x (tokens, hidden): choice, weight (tokens, top_k). */
void exec_ref_moe_route(const struct exec_ref_moe *w, const double *x, int tokens, int *choice,
                        double *weight);
/* The fractions f_e (experts) of the layer's routed pairs on x (tokens, hidden). */
void exec_ref_moe_route_fractions(const struct exec_ref_moe *w, const double *x, int tokens,
                                  double *frac);
/* The router's part of one token's backward: from dw (top_k), d loss / d routing weight of each
 * chosen slot, and the load-balance loss of `tokens` tokens with fractions frac (NULL: none),
 * adds into dx (hidden) and g->router. */
void exec_ref_router_backward(const struct exec_ref_moe *w, const double *x, const double *dw,
                              const double *frac, int tokens, double *dx,
                              struct exec_ref_moe_grad *g);

/* Dense building blocks of the reference, rows of T tokens, row-major. */

/* RMSNorm: y = x / rms(x) * w over `h`; backward accumulates dw. */
void exec_ref_rmsnorm(const double *x, const double *w, int tokens, int h, double eps, double *y);
void exec_ref_rmsnorm_backward(const double *x, const double *w, const double *dy, int tokens,
                               int h, double eps, double *dx, double *dw);
/* RoPE in place on (tokens, heads, dim), rotating the first `rot` dims as pairs (i, i + rot/2)
 * by position x theta^(-2i/rot) (the Hugging Face rotate-half convention); `inverse` rotates
 * back, which is also the backward. */
void exec_ref_rope(double *x, int tokens, int heads, int dim, int rot, double theta,
                   const int *position, bool inverse);
/* Causal attention with GQA (heads a multiple of kv_heads) and an optional sliding window
 * (0: none): q (T, heads, dqk), k (T, kv, dqk), v (T, kv, dv) -> out (T, heads, dv), scores
 * scaled by `scale`. Backward gives dq, dk, dv (overwritten). */
void exec_ref_attention(const double *q, const double *k, const double *v, int tokens,
                        int heads, int kv_heads, int dqk, int dv, int window, double scale,
                        double *out);
void exec_ref_attention_backward(const double *q, const double *k, const double *v,
                                 const double *dout, int tokens, int heads, int kv_heads, int dqk,
                                 int dv, int window, double scale, double *dq, double *dk,
                                 double *dv_out);
/* Mean cross-entropy of logits (tokens, vocab) against targets; dlogits (may be NULL) is the
 * gradient of that mean. */
double exec_ref_cross_entropy(const double *logits, const int *targets, int tokens, int vocab,
                              double *dlogits);

/* A whole model in the reference: every parameter in one flat buffer, named tensors at offsets
 * (the layout checkpoints and the GPU executor share). */
#define EXEC_MAX_TENSORS 4096
struct exec_tensor {
    char name[64];
    size_t offset, size;
    int rows, cols;
};
struct exec_ref_model {
    struct mdl_model model;
    double *params;
    size_t nparams;
    struct exec_tensor tensor[EXEC_MAX_TENSORS];
    int ntensors;
    double *bias;    /* (layers, experts) selection bias of the MoE layers, or NULL: none */
    double aux_coef; /* load-balance loss coefficient of every MoE layer (0: none) */
    int64_t *route_counts; /* (layers, experts) or NULL: each step adds its (token, expert) pairs */
};
/* The tensor table alone (params NULL): names, shapes and offsets, which the GPU executor shares.
 * A few per-model features (QK-norm, attention biases, sinks, expert biases) are not in the
 * executor yet: those models are refused with MOE_ERR_UNSUPPORTED naming the feature. */
enum moe_status exec_model_table(struct exec_ref_model *r, const struct mdl_model *m,
                                 struct moe_error *err);
/* The table and a seeded initialization (normal, std 0.02; norms at 1). */
enum moe_status exec_ref_model_create(struct exec_ref_model *r, const struct mdl_model *m,
                                      uint64_t seed, struct moe_error *err);
void exec_ref_model_destroy(struct exec_ref_model *r);
const struct exec_tensor *exec_ref_tensor(const struct exec_ref_model *r, const char *name);
/* Mean next-token cross-entropy of tokens[0..T) predicting tokens[1..T], one sequence, plus the
 * load-balance losses when aux_coef > 0 (their sum in *aux when aux is not NULL); `grad`
 * (nparams, may be NULL) receives d loss / d params (overwritten). */
enum moe_status exec_ref_model_step(const struct exec_ref_model *r, const int *tokens, int T,
                                    double *loss, double *aux, double *grad,
                                    struct moe_error *err);

/* Training: warmup + cosine learning rate, and AdamW with global-norm gradient clipping (fp64
 * master weights here; the GPU keeps fp32 masters for its bf16 weights). Norm weights get no
 * weight decay. Returns the gradient norm before clipping. */
struct exec_adamw {
    double lr_max, lr_min, beta1, beta2, eps, weight_decay, clip;
    int warmup_steps, total_steps;
};
void exec_adamw_defaults(struct exec_adamw *o);
double exec_lr_at(const struct exec_adamw *o, int step);
double exec_ref_adamw_step(struct exec_ref_model *r, const double *grad, double *m1, double *m2,
                           int step, const struct exec_adamw *o);
/* The update of parameters [lo, hi) only, clipped by a gradient norm computed elsewhere (the
 * sharded optimizer's: every rank knows the global norm, updates its shard). */
void exec_ref_adamw_range(struct exec_ref_model *r, const double *grad, double *m1, double *m2,
                          size_t lo, size_t hi, int step, const struct exec_adamw *o, double norm);

/* Training data: a file of bytes (byte-level tokens, vocab >= 256) or a token file ("MOETOKv1",
 * uint32 vocab, uint64 count, then count uint32 token ids, little-endian); or, with no file,
 * seeded synthetic tokens. Windows of seq + 1 tokens are read in order, wrapping around. */
struct exec_data {
    int *tokens;
    size_t count, pos;
    int vocab;
    bool synthetic;
    struct moe_rng rng;
    char source[MOE_PATH_MAX];
};
enum moe_status exec_data_open(struct exec_data *d, const char *file, int vocab, uint64_t seed,
                               struct moe_error *err);
void exec_data_next(struct exec_data *d, int *out, int n);
void exec_data_close(struct exec_data *d);

/* Whether this build's executor runs a layout on `gpus` GPUs; when not, why (may be NULL) says
 * what it lacks. `moeplan run` refuses other plans, `moeplan plan --runnable` searches these. */
bool exec_layout_runnable(const struct cost_layout *l, int gpus, char *why, size_t cap);

/* Checkpoints (ckpt.c): DIR/step-NNNNNNNN/ with a file per (rank, part) and a manifest per rank
 * (sizes, FNV-1a checksums) written after the files; DIR/latest names the newest complete one:
 * exec_ckpt_commit, once every rank's save returned. Every file is written atomically, so a kill
 * at any moment leaves the previous checkpoint whole. Loading refuses, naming the file, a
 * missing, truncated or corrupt part and a checkpoint of another model, size, step or ranks. */
struct exec_ckpt_id {
    const char *model;
    size_t nparams;
    int step, rank, ranks;
};
struct exec_ckpt_part {
    const char *name;  /* "params", "m1", ... */
    const void *data;  /* save: what to write */
    void *out;         /* load: where to read it */
    size_t bytes;
};
enum moe_status exec_ckpt_save(const char *dir, const struct exec_ckpt_id *id,
                               const struct exec_ckpt_part *parts, int nparts,
                               struct moe_error *err);
enum moe_status exec_ckpt_commit(const char *dir, int step, struct moe_error *err);
/* The step of DIR/latest; MOE_ERR_INPUT when there is none. */
enum moe_status exec_ckpt_latest(const char *dir, int *step, struct moe_error *err);
enum moe_status exec_ckpt_load(const char *dir, int step, const struct exec_ckpt_id *id,
                               struct exec_ckpt_part *parts, int nparts, struct moe_error *err);

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
    enum moe_status (*alltoallv)(struct exec_transport *t, const void *send,
                                 const int *send_count, void *recv, const int *recv_count,
                                 size_t item_bytes, struct moe_error *err);
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
    enum moe_status (*sum_f32)(void *ctx, int rank, float *dst, const float *const *src,
                               int ranks, size_t n, struct moe_error *err);
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
enum exec_launcher { EXEC_LAUNCH_SINGLE = 0, EXEC_LAUNCH_THREADS, EXEC_LAUNCH_MPI,
                     EXEC_LAUNCH_SLURM };
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
                                        const struct exec_ref_moe *w, const double *x,
                                        int tokens, double *y, struct cost_bytes *sent,
                                        struct moe_error *err);
/* Its backward for dy: dx (tokens, hidden); gradients accumulate into gr (the router's and the
 * shared experts' of this rank's tokens, the experts' of this rank's experts). */
enum moe_status exec_ref_ep_moe_backward(struct exec_transport *t, const struct exec_ep_group *g,
                                         const struct exec_ref_moe *w, const double *x,
                                         int tokens, const double *dy, double *dx,
                                         struct exec_ref_moe_grad *gr, struct moe_error *err);

/* exec_ref_model_step with the MoE layers expert-parallel over ep's transport (ep NULL: this
 * rank alone; the group serves every MoE layer): every rank of the group calls it on its own
 * tokens (data-parallel elsewhere), and the gradient holds this rank's share: its tokens' for the
 * replicated parameters, all tokens' for its own experts (zero for the others'), so the sum over
 * the ranks is the global batch's. `route_counts` counts the one-rank step only. */
struct exec_ref_ep {
    struct exec_transport *t;
    const struct exec_ep_group *g;
};
enum moe_status exec_ref_model_step_ep(const struct exec_ref_model *r,
                                       const struct exec_ref_ep *ep, const int *tokens, int T,
                                       double *loss, double *aux, double *grad,
                                       struct moe_error *err);

/* A slice of that step, for pipeline stages: blocks [lo, hi) on T - 1 positions. The first
 * stage (lo 0) starts from the embedding of tokens, a later one from h_in (T - 1, hidden); the
 * last (hi = layers) ends in the head and *loss, an earlier one in h_out (may be NULL) with *loss
 * (may be NULL) its load-balance losses. With grad, the backward too, the slice's forward
 * recomputed: from the loss, or from dh_out (the next stage's dh_in), into the embedding's
 * gradient or dh_in. */
enum moe_status exec_ref_model_slice(const struct exec_ref_model *r, const struct exec_ref_ep *ep,
                                     const int *tokens, int T, int lo, int hi,
                                     const double *h_in, double *h_out, const double *dh_out,
                                     double *dh_in, double *loss, double *aux, double *grad,
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

/* ---------------------------------------------------------------------------------------------- */
/* GPU kernels (CUDA builds); device pointers; `stream` is a cudaStream_t (NULL: the default)      */
/* ---------------------------------------------------------------------------------------------- */

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
enum moe_status exec_nccl_create(struct exec_nccl **out,
                                 const unsigned char id[EXEC_NCCL_ID_BYTES], int rank, int ranks,
                                 int device, double timeout_s, struct moe_error *err);
void exec_nccl_destroy(struct exec_nccl *c);
void exec_nccl_transport(struct exec_nccl *c, struct exec_transport *t);

/* The router's top-k of exec_ref_route, fp32: logits (T, experts), bias (experts) or NULL ->
 * choice (T, top_k), weight (T, top_k). At most 512 experts. */
enum moe_status exec_route(const struct exec_router_cfg *cfg, const float *logits,
                           const float *bias, int tokens, int *choice, float *weight,
                           void *stream, struct moe_error *err);

/* The training step on one GPU. A rank owns a slice of the model (layers [layer_lo, layer_hi),
 * experts [expert_lo, expert_hi)); with one GPU that is all of it, which is all this build runs.
 * Weights bf16 with fp32 masters, gradients and AdamW state fp32; the residual stream fp32;
 * GEMMs through cuBLAS (bf16 in, fp32 accumulate); the router in fp32. */
enum exec_mem { EXEC_MEM_WEIGHTS = 0, EXEC_MEM_MASTER, EXEC_MEM_GRADS, EXEC_MEM_OPTIMIZER,
                EXEC_MEM_ACTIVATIONS, EXEC_MEM_WORKSPACE, EXEC_MEM_N };
extern const char *const exec_mem_names[EXEC_MEM_N];

#define EXEC_MAX_STREAMS 8
#define EXEC_MAX_SKIPS 3 /* steps skipped for NaN or Inf in a row that stop a run */
struct exec_gpu_cfg {
    int seq, mbs;      /* one micro-batch: mbs sequences of seq tokens (each read as seq + 1) */
    bool recompute;    /* recompute each block's forward in its backward (plan: recompute full) */
    double aux_coef;   /* load-balance loss coefficient (0: none) */
    int device;
    int streams;       /* expert GEMMs over this many streams (0 or 1: the main stream only) */
    /* Expert parallelism (NULL: none): this rank's transport (device memory: the local GPU
     * transport or NCCL) and the group of every MoE layer. Each rank's exec_gpu holds the whole
     * model but computes only its own experts; the others' gradients stay zero, so summing the
     * gradients over the ranks (exec_gpu_reduce_grads) gives every parameter's. */
    struct exec_transport *ep;
    const struct exec_ep_group *ep_group; /* one for every MoE layer, or ep_groups of them */
    /* rows and pairs a rank may receive, x its own tokens' pairs (the plan's dispatch buffer
     * factor, 2 by default there); 0: the ranks' count, room for every pair of every rank. More
     * than that stops the step with a message: no row is ever dropped. */
    double ep_buffer_factor;
    int ep_groups; /* 0 or 1: ep_group serves every MoE layer; else one per MoE layer, in order */
    /* ZeRO-1 (NULL: none): the optimizer state sharded over this transport's ranks (the DP
     * group; device memory): each rank updates its shard of the parameters after the gradients
     * were summed (exec_gpu_reduce_grads), and exec_gpu_optimizer all-gathers them */
    struct exec_transport *zero;
    /* Data parallelism (NULL: none): the gradients' all-reduce group. With micro_batches (a
     * step's, > 0) known, the last micro-batch's backward starts each block's all-reduce (a
     * bucket: the block's parameters) as soon as its gradients are complete, overlapping the
     * blocks still to go; exec_gpu_reduce_grads(g, dp) reduces the rest and waits. */
    struct exec_transport *dp;
    int micro_batches;
    /* GPU memory this exec_gpu may allocate, bytes (0: what the device has); more fails the
     * allocation as a full device would, naming it (MOE_ERR_GPU_NOMEM) */
    double mem_limit;
};
struct exec_gpu;

enum moe_status exec_gpu_create(struct exec_gpu **out, const struct mdl_model *m,
                                const struct exec_gpu_cfg *cfg, struct moe_error *err);
void exec_gpu_destroy(struct exec_gpu *g);
/* The tensor table (params NULL): the reference's layout of the parameters. */
const struct exec_ref_model *exec_gpu_table(const struct exec_gpu *g);
/* Seeded initialization on the GPU (normal, std 0.02; norms 1), the same for a seed every run. */
enum moe_status exec_gpu_init(struct exec_gpu *g, uint64_t seed, struct moe_error *err);
/* Parameters, gradients (after a step's micro-batches) and the selection biases in the reference
 * layout, converted from / to double; bias is (layers, experts), rows of dense layers unused. */
enum moe_status exec_gpu_set_params(struct exec_gpu *g, const double *params, struct moe_error *err);
enum moe_status exec_gpu_get_params(struct exec_gpu *g, double *params, struct moe_error *err);
enum moe_status exec_gpu_get_grads(struct exec_gpu *g, double *grad, struct moe_error *err);
/* Data parallelism: sum the step's gradients over the transport's ranks (each rank passed its
 * share, grad_scale / ranks, to exec_gpu_micro_batch), before exec_gpu_optimizer; with t the
 * cfg's dp, only what the backward has not started already, then the wait for all. */
enum moe_status exec_gpu_reduce_grads(struct exec_gpu *g, struct exec_transport *t,
                                      struct moe_error *err);
/* The state a checkpoint keeps besides the parameters: the AdamW moments of this rank's shard
 * (exec_gpu_state_floats floats each: all of them without ZeRO) and the selection biases
 * (layers x experts), to or from host memory. */
size_t exec_gpu_state_floats(const struct exec_gpu *g);
enum moe_status exec_gpu_get_state(struct exec_gpu *g, float *m1, float *m2, double *bias,
                                   struct moe_error *err);
enum moe_status exec_gpu_set_state(struct exec_gpu *g, const float *m1, const float *m2,
                                   const double *bias, struct moe_error *err);
/* The stream the step runs on (a cudaStream_t): the local GPU transport's per-rank stream. */
void *exec_gpu_stream(const struct exec_gpu *g);
enum moe_status exec_gpu_set_bias(struct exec_gpu *g, const double *bias, struct moe_error *err);

/* One step: begin (zero the gradients), micro-batches, the optimizer, end (timings). */
enum moe_status exec_gpu_step_begin(struct exec_gpu *g, struct moe_error *err);
/* Forward and backward of one micro-batch of tokens (mbs, seq + 1) from the host. Gradients of
 * grad_scale x (mean cross-entropy + load-balance losses) accumulate; *loss is that mean
 * cross-entropy plus the load-balance losses, *aux the latter alone. */
enum moe_status exec_gpu_micro_batch(struct exec_gpu *g, const int *tokens, double grad_scale,
                                     double *loss, double *aux, struct moe_error *err);
/* Pipeline stages: one micro-batch through blocks [lo, hi) only. The first stage (lo 0) starts
 * from the tokens' embedding, a later one from h_in (device, T x hidden fp32); the last (hi the
 * layers) ends in the head and the loss, an earlier one in h_out (device) when forward only.
 * With `backward`, the slice's forward is recomputed (its statistics not counted again) and its
 * backward runs from the loss or from dh_out (device: the gradient of the slice's output) into
 * the embedding's gradient or dh_in (device); gradients of grad_scale x the loss accumulate.
 * *loss: the mean cross-entropy (last stage) plus the slice's load-balance losses, *aux these.
 * Not with expert parallelism. */
enum moe_status exec_gpu_slice(struct exec_gpu *g, const int *tokens, int lo, int hi,
                               const float *h_in, float *h_out, const float *dh_out, float *dh_in,
                               bool backward, double grad_scale, double *loss, double *aux,
                               struct moe_error *err);
/* Clip to the global norm and apply AdamW; *gnorm is the norm before clipping. A norm that is
 * NaN or Inf applies nothing and returns MOE_ERR_NUMERICS naming the step (0-based `step` + 1)
 * and where the first non-finite value is (exec_gpu_nonfinite). */
enum moe_status exec_gpu_optimizer(struct exec_gpu *g, const struct exec_adamw *o, int step,
                                   double *gnorm, struct moe_error *err);
/* Where NaN or Inf is, in words, after a micro-batch: the first block whose output holds one
 * (its input finite), else the parameter gradient nearest the output that does; "" if none. */
enum moe_status exec_gpu_nonfinite(struct exec_gpu *g, char *where, size_t cap,
                                   struct moe_error *err);
/* Testing: a NaN into one element of the named tensor's gradient (after a backward) or, with
 * `weight`, of the tensor itself (its fp32 master and bf16 copy). */
enum moe_status exec_gpu_poison(struct exec_gpu *g, const char *tensor, bool weight,
                                struct moe_error *err);
/* Aux-loss-free balancing: bias_e += rate * sign(mean load - load_e) from this step's loads,
 * summed over t's ranks (every rank of the run, so the biases stay equal on all; NULL: this
 * rank's alone). */
enum moe_status exec_gpu_update_bias(struct exec_gpu *g, double rate, struct exec_transport *t,
                                     struct moe_error *err);
struct exec_gpu_step_stats {
    double phase_ms[COST_NPHASES]; /* CUDA-event time of each phase this step (COST_STEP: all) */
    int host_syncs;                /* device-to-host waits this step */
    struct cost_bytes dispatch;    /* expert parallelism: token payload this rank sent this step
                                    * (both hops, forward), by link tier, as the planner counts */
};
enum moe_status exec_gpu_step_end(struct exec_gpu *g, struct exec_gpu_step_stats *s,
                                  struct moe_error *err);

struct exec_gpu_memory {
    double bytes[EXEC_MEM_N];      /* what the executor allocated, by category */
    double device_used_peak;       /* the device's used memory at its highest seen (all users) */
    double device_total;
};
void exec_gpu_memory(const struct exec_gpu *g, struct exec_gpu_memory *m);
/* Routing since creation for MoE layer `layer`: counts[experts] of (token, expert) pairs and
 * coact[experts x experts] of tokens choosing both (NULL: not wanted). */
enum moe_status exec_gpu_routing(struct exec_gpu *g, int layer, int64_t *counts, int64_t *coact,
                                 struct moe_error *err);

/* The MoE benchmark (`moeplan bench moe`): one MoE layer of `experts` SwiGLU experts on `tokens`
 * tokens with seeded skewed routing (Dirichlet(skew) expert probabilities; 0: uniform), forward
 * + backward with weight gradients; medians of `iters` runs after `warmup`, CUDA events.
 * `choice` (tokens x top_k) receives the routing used, for the peers to replay. */
struct exec_moe_bench_cfg {
    int experts, tokens, top_k, hidden, ffn, streams, warmup, iters;
    double skew;
    uint64_t seed;
};
struct exec_moe_bench_result {
    double block_ms;      /* expert block: gate/up GEMMs, SwiGLU, down GEMM, fwd + bwd */
    double block_fwd_ms;  /* its forward alone */
    double layer_ms;      /* the whole layer: router, top-k, permutation, experts, combine */
    double dense_ms;      /* the same GEMM chain with every row on one expert: the ceiling */
    double block_flops, layer_flops;
    int host_syncs;       /* device-to-host waits in one layer fwd + bwd */
    double max_over_mean; /* the busiest expert's rows over the mean */
    double layer_bytes;   /* activations one layer keeps for its backward */
};
enum moe_status exec_moe_bench(const struct exec_moe_bench_cfg *c, int *choice,
                               struct exec_moe_bench_result *r, struct moe_error *err);

/* Microbenchmarks for `moeplan calibrate` (calib.cu), on the current GPU, each the median of
 * `iters` CUDA-event timings after a warm-up: a row-major bf16 GEMM (m x k) (k x n) through
 * cuBLAS with fp32 accumulation; the flash attention kernels over seqs causal sequences of seq
 * tokens (forward, and backward with dq, dk, dv); a device-to-device copy of `bytes`; one empty
 * kernel's launch. Microseconds. */
enum moe_status exec_time_gemm(int m, int n, int k, int iters, double *us, struct moe_error *err);
enum moe_status exec_time_attention(int seqs, int seq, int heads, int kv_heads, int dqk, int dv,
                                    int iters, double *fwd_us, double *bwd_us,
                                    struct moe_error *err);
enum moe_status exec_time_copy(size_t bytes, int iters, double *us, struct moe_error *err);
enum moe_status exec_time_launch(int iters, double *us, struct moe_error *err);

/* Versions as integers the way each library reports them (CUDA 13000 = 13.0, NCCL 22803 = 2.28.3). */
struct exec_versions {
    int cuda_runtime;      /* cudaRuntimeGetVersion */
    int cuda_driver;       /* cudaDriverGetVersion; 0: no driver on this machine */
    int cuda_compiled;     /* CUDART_VERSION of the headers */
    int cublas_major, cublas_minor, cublas_patch;
    int nccl_runtime;      /* ncclGetVersion */
    int nccl_compiled;     /* NCCL_VERSION_CODE of the headers */
};

void exec_versions_get(struct exec_versions *v);

struct exec_device_info {
    int index;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    double memory_bytes;
    double memory_bandwidth_bytes_per_s; /* from the memory clock and bus width */
    char pci_bus_id[32];
};

/* Number of CUDA devices; 0 (and MOE_OK) where there is no GPU or no driver. */
enum moe_status exec_device_count(int *count, struct moe_error *err);
enum moe_status exec_device_query(int index, struct exec_device_info *info, struct moe_error *err);

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
    int step;                       /* 1-based */
    bool skipped;                   /* NaN or Inf: no update (skip_nonfinite); why: the reason */
    char why[MOE_MSG_MAX];
    double loss, aux, lr, gnorm;    /* loss and aux: the mean over the global batch */
    double wall_ms;                 /* rank 0's host time of the step */
    struct exec_gpu_step_stats gpu; /* rank 0's phases and host syncs; dispatch: every rank's */
};
struct exec_run_info {             /* what the run found before its first step (rank 0's) */
    enum exec_run_mode mode;
    bool transport;                /* the ranks talk (NCCL or the local transport) */
    struct exec_device_info dev;
    int ranks, devices;            /* ranks of the run; GPUs this process uses */
    int first_step;                /* 0, or the step a resumed run starts from */
    struct exec_adamw opt;
    char data[MOE_PATH_MAX + 64];  /* the data source */
    char binding[320];             /* rank 0's CPU binding, or why there is none */
};
struct exec_run_cfg {
    const struct plan_file *plan;
    enum exec_run_mode mode;
    bool nccl;                     /* one GPU, THREADS: its one rank through NCCL all the same */
    struct exec_launch launch;     /* PROCESS: who this process is (exec_launch_detect) */
    const char *id_file;           /* PROCESS: where rank 0 leaves the NCCL id for the others */
    const char *data;              /* training data (NULL: synthetic tokens) */
    uint64_t seed;
    int steps, warmup, streams;
    double lr, aux, bias_rate;
    double timeout_s;              /* a collective waited for longer fails the run (60) */
    bool no_grad_overlap;          /* all-reduce the gradients after the backward, not in it */
    const char *ckpt_dir;          /* checkpoints here (NULL: none) ... */
    int ckpt_every;                /* ... every this many steps (0: none) */
    bool resume;                   /* start from ckpt_dir's latest checkpoint */
    int fail_rank, fail_step;      /* a test of fault handling: that rank stops in the middle of
                                    * that step (1-based), the others must fail (-1: none) */
    /* NaN or Inf in the gradients (or the loss): stop the run with MOE_ERR_NUMERICS naming the
     * step, the block and the tensor (false), or skip the step's update (true) and stop after
     * EXEC_MAX_SKIPS skipped in a row. The last checkpoint is from before, untouched. */
    bool skip_nonfinite;
    const char *nan_tensor;        /* testing: rank 0 poisons this gradient (or weight) ... */
    int nan_step;                  /* ... at this step (1-based; 0: never) */
    bool nan_weight;               /* the weight, at the step's start: the forward meets it */
    /* set asynchronously (a signal handler: nonzero): the ranks agree to stop after the step
     * they are in, write a checkpoint when ckpt_dir is set, and return MOE_ERR_INTERRUPTED */
    const volatile sig_atomic_t *stop;
    double gpu_mem_limit;          /* bytes a rank may allocate (0: the device's) */
    const double *bias0;           /* (layers, experts) selection biases to start from (NULL:
                                    * zeros; a resumed run has its checkpoint's) */
    /* called on rank 0 (its thread, or the rank-0 process) */
    void (*on_start)(void *ctx, const struct exec_run_info *info);
    void (*on_step)(void *ctx, const struct exec_run_step *s);
    void *ctx;
};
struct exec_run_result {           /* filled on rank 0 (the rank-0 process) */
    bool filled;
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

#ifdef __cplusplus
}
#endif

#endif /* EXEC_H */
