/*
 * exec_gpu.h: the GPU executor's interface (CUDA builds): the training step on one GPU
 * (exec_gpu_*), the router kernel, the microbenchmarks of calibration, versions and devices.
 * Plain C: no CUDA header, device pointers as void *, streams as cudaStream_t behind void *.
 * Part of executor/'s public interface (exec.h includes it).
 */
#ifndef EXEC_GPU_H
#define EXEC_GPU_H

#include "exec_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* GPU kernels (CUDA builds); device pointers; `stream` is a cudaStream_t (NULL: the default)      */
/* ---------------------------------------------------------------------------------------------- */

/* The router's top-k of exec_ref_route, fp32: logits (T, experts), bias (experts) or NULL ->
 * choice (T, top_k), weight (T, top_k). At most 512 experts. forced (T, top_k) or NULL: these
 * choices instead of the top-k, their weights by the same rule. */
enum moe_status exec_route(const struct exec_router_cfg *cfg, const float *logits,
                           const float *bias, int tokens, const int *forced, int *choice,
                           float *weight, void *stream, struct moe_error *err);

/* The training step on one GPU. A rank owns a slice of the model (layers [layer_lo, layer_hi),
 * experts [expert_lo, expert_hi)); with one GPU that is all of it, which is all this build runs.
 * Weights bf16 with fp32 masters, gradients and AdamW state fp32; the residual stream fp32;
 * GEMMs through cuBLAS (bf16 in, fp32 accumulate); the router in fp32. */
enum exec_mem {
    EXEC_MEM_WEIGHTS = 0,
    EXEC_MEM_MASTER,
    EXEC_MEM_GRADS,
    EXEC_MEM_OPTIMIZER,
    EXEC_MEM_ACTIVATIONS,
    EXEC_MEM_WORKSPACE,
    EXEC_MEM_N
};
extern const char *const exec_mem_names[EXEC_MEM_N];

#define EXEC_MAX_STREAMS 8
/* run's, validate's, calibrate's and bench moe's default: small experts' GEMMs fill the GPU only
 * side by side (the DeepSeek-V2-Lite proxy's experts 41 -> 31 ms a step on the H200); large ones
 * lose nothing (bench/README.md) */
#define EXEC_DEFAULT_STREAMS 4
#define EXEC_STR_(x) #x
#define EXEC_STR(x) EXEC_STR_(x)
#define EXEC_MAX_SKIPS 3 /* steps skipped for NaN or Inf in a row that stop a run */
struct exec_gpu_cfg {
    int seq, mbs;   /* one micro-batch: mbs sequences of seq tokens (each read as seq + 1) */
    bool recompute; /* recompute each block's forward in its backward (plan: recompute full) */
    /* Selective recompute (plan: recompute selective): COST_RC_BIT of each module whose tensors
     * one buffer holds for every block and the backward redoes (EXEC_RC_MODULES of them) */
    unsigned recompute_modules;
    double aux_coef; /* load-balance loss coefficient (0: none) */
    int device;
    int streams; /* expert GEMMs over this many streams (0 or 1: the main stream only) */
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
    /* attention through cuDNN's fused flash attention where this build has it and it takes the
     * shape (our own kernel otherwise; exec_run_cfg's attention chooses for a run) */
    bool cudnn_attention;
    /* AdamW's moments in bf16 (the plan's moments=bf16; exec_adamw's moments_bf16 must say the
     * same): 4 bytes a parameter less */
    bool moments_bf16;
    /* the tests' reference paths: fp8 without the fused quantization (exec_fp8_layout); the
     * weights' quantization on the main stream (f8.cast_overlap off) */
    bool fp8_unfused, fp8_cast_sync;
    /* the GEMMs' precision (the plan's): COST_BF16, COST_FP8 (per-tensor current scaling) or
     * COST_FP8_BLOCK (DeepSeek-V3's blockwise); fp8_e5m2_grads: the gradients in E5M2 (E4M3
     * otherwise, as the plan's Megatron flags say) */
    enum cost_precision precision;
    bool fp8_e5m2_grads;
};
struct exec_gpu;

/* What exec_gpu_create allocates for model m under cfg, in bytes by category (as exec_gpu_memory
 * reports them after creation), on any machine: with EP over ep_ranks (0: none; ep_domain: per-
 * domain dedup, twice the rows) and ZeRO-1 over zero_ranks (0: none). The CUDA context, cuDNN's
 * workspace and the allocator's slack are not in it. */
#define EXEC_CONTEXT_BYTES (1024.0 * 1024 * 1024) /* the CUDA context's and cuDNN's, about */
void exec_gpu_bytes(const struct mdl_model *m, const struct exec_gpu_cfg *cfg, int ep_ranks,
                    bool ep_domain, int zero_ranks, double bytes[EXEC_MEM_N]);

/* FP8 training (cfg.precision COST_FP8 or COST_FP8_BLOCK). Every projection's weight but the
 * embedding's, the router's and the head's is kept quantized, a slice at a time (an expert's
 * part of an expert tensor): its row-major copy (K: its input) and its transpose (K: its output),
 * with their dequantization factors. A GEMM's activation or gradient operand is quantized when
 * the GEMM is called, into the scratch of the stream it runs on (three operands: the weight
 * gradient's two, and the data gradient's operand transposed for the weight gradient after
 * it). */
struct exec_fp8_slice {
    size_t off;      /* the slice's first parameter */
    int rows, cols;  /* out x in */
    int layer;       /* the block it is a weight of */
    bool expert;     /* a routed expert's (the block's MoE GEMMs), else its attention's or dense */
    size_t q, s, st; /* its copies' first byte among the quantized bytes; its factors' first
                      * float, its transpose's */
};
struct exec_fp8_layout {
    struct exec_fp8_slice *slice; /* (n), in the order of their parameters */
    int n;
    enum exec_fp8_scaling act, weight; /* the activations' and gradients' scaling, the weights' */
    size_t qbytes;  /* bytes of the slices' row-major copies (their transposes take as many) */
    size_t factors; /* floats of all their factors */
    size_t scratch_bytes, scratch_factors; /* a stream's scratch: each of its three operands' */
    size_t tail_floats; /* and its block-scaled GEMMs' last rows (gk_fp8_gemm's tail) */
    /* No EP, SwiGLU experts without biases: the experts' SwiGLU backward writes its two
     * gradients quantized, expert by expert (row-major and transposed), for their GEMMs, in place
     * of bf16 (fuse; per-tensor scaling after a pass that finds each expert's amax), and with
     * block scaling its forward the down GEMMs' input too. pre_bytes: each of the four copies'
     * buffer, pre_factors: each one's factors (bounds for any routing of the layer's `rows`
     * routed rows). */
    bool fuse;
    size_t pre_bytes, pre_factors;
    /* MoE layers, hidden and the experts' width multiples of 16: the experts' input and their
     * SwiGLU's output ([0] x, [1] hm) quantized both ways by the forward's GEMMs that take them,
     * the transposes kept (a MoE layer's activations, struct act) for the weight gradients, which
     * would quantize them again (keep_xt); xt_bytes[k], xt_factors[k]: each one's size and its
     * factors' (bounds as pre_bytes') */
    bool keep_xt;
    size_t xt_bytes[2], xt_factors[2];
    /* Per-tensor scaling, MoE layers: the kernels that write the experts' permuted matrices (the
     * gather, SwiGLU and its backward, the combine's backward) keep each expert's amax, five a
     * MoE layer (x, hm in the forward; dy, dg, du in the backward), so the quantization of those
     * rows for their GEMMs reads them once, not twice (amax_rows). */
    bool amax_rows;
    /* Per-tensor scaling with keep_xt and amax_rows: the experts' input quantized in the permute
     * (dispatch), each expert's amax found from its tokens first, its row-major copy into a
     * buffer of dispatch_bytes (dispatch_factors floats of factors) for the gate and up GEMMs,
     * its transpose into the kept one (xt_bytes[0]): no bf16 rows placed, none read again to
     * quantize them. Not with EP, nor where the rows change after the permute (Llama 4's
     * weights on the input). */
    bool dispatch;
    size_t dispatch_bytes, dispatch_factors;
    /* Per-tensor scaling, some slice quantized: AdamW keeps each slice's amax as it writes the
     * bf16 weights (without ZeRO, whose shards are gathered after), so their quantization reads
     * them once (amax_weights). */
    bool amax_weights;
    /* The weights' quantization after an update runs on a stream of its own, block by block,
     * while the forward's first blocks run (each block's GEMMs wait for its weights alone):
     * cast_overlap. */
    bool cast_overlap;
};
/* The layout for the model's tensor table, a GEMM's operands at most `rows` rows (the tokens,
 * or the routed pairs one GPU's experts may hold); unfused: no fused quantization (the tests'
 * reference path). */
enum moe_status exec_fp8_layout(const struct exec_ref_model *table, enum cost_precision p, int rows,
                                bool unfused, struct exec_fp8_layout *out, struct moe_error *err);
/* Expert e's region among the fused copies of a permuted matrix (rows from off[e], E experts,
 * `cols` wide): its row-major copy (n_e x cols) and its transpose (cols x n_e rounded up to 16)
 * from byte q[e], their factors from s[e] and st[e] (arrays of E + 1: the last, the totals). */
void exec_fp8_regions(const int *off, int E, int cols, size_t *q, size_t *s, size_t *st);
void exec_fp8_layout_free(struct exec_fp8_layout *l);
/* Where the factor of value (r, c) of a rows x cols K-major matrix (K: cols) scaled `how` sits
 * among its factors, in the layouts cuBLASLt's fp8 block scaling reads on Hopper; and how many
 * floats they take (a multiple of 4: the next array starts 16-byte aligned).
 * - 1 x 128 tiles: the rows innermost, a K-tile after another. cuBLASLt's block-scaled GEMM takes
 *   rows in multiples of 4 only (cuBLASLt 13.1 on the H200, rows 296 to 328: every multiple of 4
 *   found an algorithm, no other row count did), so gk_fp8_gemm runs a matrix of other row
 *   counts as two: its first rows, a multiple of EXEC_FP8_PAD (16, which is also the weight
 *   gradient's K padding: one padding), and a tail of EXEC_FP8_PAD rows (past `rows`: padding),
 *   each a GEMM of its own that reads its factors as one matrix. The factors are laid out that
 *   way: the first rows' (R = rows rounded down) as a matrix of R rows, then the tail's as one
 *   of EXEC_FP8_PAD. Where rows is a multiple of EXEC_FP8_PAD that is the plain layout.
 * - 128 x 128 blocks: row-major over the block grid, a block row padded to a multiple of 4.
 * - the tensor: one. */
#ifdef __CUDACC__
#define EXEC_HD __host__ __device__
#else
#define EXEC_HD
#endif
/* The rows of an fp8 GEMM's token operands padded to what cuBLASLt's fp8 GEMM takes, a multiple
 * of EXEC_FP8_PAD: the weight gradient's K (the tokens, zeros past them), and with block scaling
 * the forward's and the data gradient's rows (exec_fp8_factor_at) */
#define EXEC_FP8_PAD 16
static inline EXEC_HD int exec_fp8_pad(int n)
{
    return (n + EXEC_FP8_PAD - 1) / EXEC_FP8_PAD * EXEC_FP8_PAD;
}
static inline EXEC_HD size_t exec_fp8_factor_at(int how, int rows, int cols, int r, int c)
{
    if (how == EXEC_FP8_TENSOR) return 0;
    if (how == EXEC_FP8_TILE_1X128) {
        size_t R = (size_t)(rows / EXEC_FP8_PAD * EXEC_FP8_PAD), kt = (size_t)(c / 128);
        if ((size_t)r < R) return kt * R + (size_t)r;
        return R * (size_t)((cols + 127) / 128) + kt * EXEC_FP8_PAD + ((size_t)r - R);
    }
    return (size_t)(r / 128) * (size_t)(((cols + 127) / 128 + 3) / 4 * 4) + (size_t)(c / 128);
}
static inline EXEC_HD size_t exec_fp8_factor_count(int how, int rows, int cols)
{
    if (how == EXEC_FP8_TENSOR) return 4;
    if (how == EXEC_FP8_TILE_1X128) return (size_t)(cols + 127) / 128 * (size_t)exec_fp8_pad(rows);
    return (size_t)(rows + 127) / 128 * (size_t)(((cols + 127) / 128 + 3) / 4 * 4);
}
/* exec_fp8_regions' step: past an expert of n rows, `cols` wide */
static inline EXEC_HD void exec_fp8_region_next(int n, int cols, size_t *q, size_t *s, size_t *st)
{
    int np = exec_fp8_pad(n);
    *q += (size_t)np * cols;
    *s += exec_fp8_factor_count(EXEC_FP8_TILE_1X128, n, cols);
    *st += exec_fp8_factor_count(EXEC_FP8_TILE_1X128, cols, np);
}

enum moe_status exec_gpu_create(struct exec_gpu **out, const struct mdl_model *m,
                                const struct exec_gpu_cfg *cfg, struct moe_error *err);
void exec_gpu_destroy(struct exec_gpu *g);
/* Which attention the steps so far ran: "cuDNN 9.14.0 fused attention", or "moeplan's flash
 * kernel (why)". */
const char *exec_gpu_attention(const struct exec_gpu *g, char *buf, size_t cap);
/* The tensor table (params NULL): the reference's layout of the parameters. */
const struct exec_ref_model *exec_gpu_table(const struct exec_gpu *g);
/* Seeded initialization on the GPU (normal, std 0.02; norms 1), the same for a seed every run. */
enum moe_status exec_gpu_init(struct exec_gpu *g, uint64_t seed, struct moe_error *err);
/* Parameters, gradients (after a step's micro-batches) and the selection biases in the reference
 * layout, converted from / to double; bias is (layers, experts), rows of dense layers unused. */
enum moe_status exec_gpu_set_params(struct exec_gpu *g, const double *params,
                                    struct moe_error *err);
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
    double bytes[EXEC_MEM_N]; /* what the executor allocated, by category */
    double device_used_peak;  /* the device's used memory at its highest seen (all users) */
    double device_total;
};
void exec_gpu_memory(const struct exec_gpu *g, struct exec_gpu_memory *m);
/* Routing since creation for MoE layer `layer`: counts[experts] of (token, expert) pairs and
 * coact[experts x experts] of tokens choosing both (NULL: not wanted). */
enum moe_status exec_gpu_routing(struct exec_gpu *g, int layer, int64_t *counts, int64_t *coact,
                                 struct moe_error *err);
/* The last micro-batch's routing: each MoE layer's (tokens x top_k) expert choices, layer after
 * layer (not with full recompute, whose layers share them); and a routing that every later
 * micro-batch's MoE layers take in place of their routers' choices (the same layout, a token's
 * choices distinct experts, as a router's are; NULL: the routers' again). Runs of two precisions
 * compare on one routing so. */
enum moe_status exec_gpu_last_routing(struct exec_gpu *g, int *choice, struct moe_error *err);
enum moe_status exec_gpu_force_routing(struct exec_gpu *g, const int *choice,
                                       struct moe_error *err);

/* The MoE benchmark (`moeplan bench moe`): one MoE layer of `experts` SwiGLU experts on `tokens`
 * tokens with seeded skewed routing (Dirichlet(skew) expert probabilities; 0: uniform), forward
 * + backward with weight gradients; medians of `iters` runs after `warmup`, CUDA events.
 * `choice` (tokens x top_k) receives the routing used, for the peers to replay. */
struct exec_moe_bench_cfg {
    int experts, tokens, top_k, hidden, ffn, streams, warmup, iters;
    double skew;
    uint64_t seed;
    enum cost_precision precision; /* the GEMMs' (COST_BF16, COST_FP8, COST_FP8_BLOCK) */
    bool fwd_busy; /* the forward timed again behind a busy GPU (block_fwd_busy_ms; else 0) */
};
#define EXEC_BENCH_SAMPLE 1024
enum { EXEC_BENCH_Y, EXEC_BENCH_DX, EXEC_BENCH_DGATE, EXEC_BENCH_DDOWN, EXEC_BENCH_SAMPLES };
extern const char *const exec_bench_sample_names[EXEC_BENCH_SAMPLES];
struct exec_moe_bench_result {
    double block_ms;          /* expert block: gate/up GEMMs, SwiGLU, down GEMM, fwd + bwd */
    double block_fwd_ms;      /* its forward alone, from an idle GPU (the host's launches in it) */
    double block_fwd_busy_ms; /* with fwd_busy: the forward behind 20 ms of a busy GPU */
    double block_bwd_ms;      /* its backward alone, the host ahead of the GPU */
    double layer_ms;          /* the whole layer: router, top-k, permutation, experts, combine */
    double dense_ms;          /* the same GEMM chain with every row on one expert: the ceiling */
    double block_flops, layer_flops;
    int host_syncs;       /* device-to-host waits in one layer fwd + bwd */
    double max_over_mean; /* the busiest expert's rows over the mean */
    double layer_bytes;   /* activations one layer keeps for its backward */
    /* after the whole layer's last timed run, EXEC_BENCH_SAMPLE values spread evenly over each of:
     * (or all of a smaller one) the experts' outputs (fp32, permuted rows), the layer's input gradient, the gate's and the
     * down projection's weight gradients: runs of two precisions on the same seed and routing
     * (the same weights and inputs) compare by them */
    float sample[EXEC_BENCH_SAMPLES][EXEC_BENCH_SAMPLE];
    int nsample[EXEC_BENCH_SAMPLES]; /* EXEC_BENCH_SAMPLE, or every value of a smaller one */
};
enum moe_status exec_moe_bench(const struct exec_moe_bench_cfg *c, int *choice,
                               struct exec_moe_bench_result *r, struct moe_error *err);

/* Microbenchmarks for `moeplan calibrate` (calib.cu), on the current GPU, each the median of
 * `iters` CUDA-event timings after a warm-up: a row-major bf16 GEMM (m x k) (k x n) through
 * cuBLAS with fp32 accumulation; the flash attention kernels over seqs causal sequences of seq
 * tokens (forward, and backward with dq, dk, dv); a device-to-device copy of `bytes`; one empty
 * kernel's launch. Microseconds. */
enum moe_status exec_time_gemm(int m, int n, int k, int iters, double *us, struct moe_error *err);
/* `moeplan bench gemm`: y (m x n, bf16) = x (m x k) w^T (w n x k), as a linear layer's forward
 * runs it, each kind the median of `iters` CUDA-event timings: bf16 through cuBLAS (fp32
 * accumulation; its heuristic's choice at this very shape), and fp8 through the executor's own
 * gk_fp8_gemm on operands quantized beforehand (its algorithm chosen as the executor's, for the
 * rows' power of two): per tensor with fp32 accumulation promoted (the backward's GEMMs), per
 * tensor accumulating fast (the forward's), blockwise (x in 1 x 128 tiles, w in 128 x 128
 * blocks; Hopper only, else < 0). cast_us: the quantization of x alone for that kind (its
 * row-major copy, as the forward quantizes; per tensor with its amax pass). And each kind's
 * matmul by every algorithm of the heuristic's first few: what choosing among them would give.
 * k and n multiples of 16; an fp8 GPU (sm_89 or later). Microseconds. */
enum { EXEC_GEMM_BF16, EXEC_GEMM_FP8, EXEC_GEMM_FP8_FAST, EXEC_GEMM_FP8_BLOCK, EXEC_GEMM_KINDS };
extern const char *const exec_gemm_kind_names[EXEC_GEMM_KINDS];
#define EXEC_GEMM_ALGOS 8
struct exec_gemm_times {
    double gemm_us[EXEC_GEMM_KINDS];
    double cast_us[EXEC_GEMM_KINDS]; /* 0 for bf16 */
    /* cuBLASLt's heuristic's first EXEC_GEMM_ALGOS algorithms for the same matmul (bf16 through
     * cuBLASLt too), each timed: algos of them, the first's time, the fastest's and its place in
     * the heuristic's order (0: the first); algos 0 where not timed (block scaling at rows not a
     * multiple of 16, whose matmul is two); alike: how many of them wrote the same bits as the
     * first that ran (all of them: picking the fastest would not change a run's results) */
    int algos[EXEC_GEMM_KINDS], fastest_at[EXEC_GEMM_KINDS], alike[EXEC_GEMM_KINDS];
    double first_us[EXEC_GEMM_KINDS], fastest_us[EXEC_GEMM_KINDS];
};
enum moe_status exec_time_gemm_kinds(int m, int n, int k, int iters, struct exec_gemm_times *t,
                                     struct moe_error *err);
/* Large GEMMs back to back for `seconds` (one allocation, one cuBLAS handle): the GPU's clocks
 * and temperature as a training run holds them, before a measurement. */
enum moe_status exec_warm_up(double seconds, struct moe_error *err);
/* Whose attention kernels: cuDNN's where the build has it and it takes the shape (AUTO), ours, or
 * cuDNN's. */
enum exec_attention { EXEC_ATTN_AUTO = 0, EXEC_ATTN_OWN, EXEC_ATTN_CUDNN };
bool exec_attention_cudnn(enum exec_attention a);
/* Attention by cuDNN's fused kernels (EXEC_ATTN_CUDNN: an error when cuDNN does not take the
 * shape), by ours (EXEC_ATTN_OWN) or as the executor runs it (EXEC_ATTN_AUTO: cuDNN's where the
 * build has it, our backward for a narrow sliding window); window > 0: a sliding window of that
 * many keys; sinks (EXEC_ATTN_CUDNN only): a learned sink a head inside cuDNN's graph, forward
 * and backward (its gradient too), as Transformer Engine runs gpt-oss's attention. */
enum moe_status exec_time_attention(int seqs, int seq, int heads, int kv_heads, int dqk, int dv,
                                    int window, enum exec_attention backend, bool sinks, int iters,
                                    double *fwd_us, double *bwd_us, struct moe_error *err);
enum moe_status exec_time_copy(size_t bytes, int iters, double *us, struct moe_error *err);
/* The executor's AdamW update over n parameters (fp32 master and gradient, fp32 moments or bf16
 * ones with m16, the bf16 copy out: 30 or 22 bytes a parameter moved), median of iters, us. */
enum moe_status exec_time_adamw(size_t n, bool m16, int iters, double *us, struct moe_error *err);
enum moe_status exec_time_launch(int iters, double *us, struct moe_error *err);

/* Versions as integers the way each library reports them (CUDA 13000 = 13.0, NCCL 22803 = 2.28.3). */
struct exec_versions {
    int cuda_runtime;  /* cudaRuntimeGetVersion */
    int cuda_driver;   /* cudaDriverGetVersion; 0: no driver on this machine */
    int cuda_compiled; /* CUDART_VERSION of the headers */
    int cublas_major, cublas_minor, cublas_patch;
    int nccl_runtime;   /* ncclGetVersion */
    int nccl_compiled;  /* NCCL_VERSION_CODE of the headers */
    int cudnn_runtime;  /* cudnnGetVersion (91400 = 9.14.0); 0: not in this build */
    int cudnn_compiled; /* CUDNN_VERSION of the headers; 0: built without cuDNN */
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

#ifdef __cplusplus
}
#endif

#endif /* EXEC_GPU_H */
