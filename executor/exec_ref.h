/*
 * exec_ref.h: the CPU reference of the executor (plain C, double precision, built everywhere):
 * every operation of the model, a whole training step (loss and every gradient), the optimizer,
 * training data and checkpoints. Every GPU kernel and backward pass is checked against it.
 * Part of executor/'s public interface (exec.h includes it).
 */
#ifndef EXEC_REF_H
#define EXEC_REF_H

#include "mdl.h"
#include "cost.h" /* the layouts, phases and routings it shares with the planner; no GLPK */

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
 *   sgate, sup (shared_ffn, hidden); sdown (hidden, shared_ffn);
 *   gpt-oss's learned biases (all NULL: none): router_b (experts) on the logits, gate_b, up_b
 *   (experts, ffn) and down_b (experts, hidden) on the routed experts' projections;
 *   the routed experts' activation act (with alpha and limit for the clamped form; see mdl.h). */
struct exec_ref_moe {
    struct exec_router_cfg cfg;
    int hidden, ffn, shared_ffn;
    double *router, *bias, *gate, *up, *down, *sgate, *sup, *sdown;
    double *router_b, *gate_b, *up_b, *down_b;
    enum mdl_activation act;
    double alpha, limit;
    bool probs_on_input; /* Llama 4: the weight scales each expert's input, not its output */
};

/* Gradients of the same shapes (bias has none). */
struct exec_ref_moe_grad {
    double *router, *gate, *up, *down, *sgate, *sup, *sdown;
    double *router_b, *gate_b, *up_b, *down_b;
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
                                     double *y, int *choice, double *weight, struct moe_error *err);
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

/* FP8 (ref_fp8.c): the formats, and the scaling recipes the executor's fp8 GEMMs take, as plain
 * C for the GPU's quantize kernels to be checked against bit for bit. */
enum exec_fp8 { EXEC_FP8_E4M3 = 0, EXEC_FP8_E5M2 };
enum exec_fp8_scaling {
    EXEC_FP8_TENSOR = 0,   /* one scale for the tensor (current scaling: this step's amax) */
    EXEC_FP8_TILE_1X128,   /* a scale per 1 x 128 tile of each row (activations, gradients) */
    EXEC_FP8_BLOCK_128X128 /* a scale per 128 x 128 block (weights) */
};
float exec_fp8_max(enum exec_fp8 f);
/* Round to nearest even, saturating to the largest finite value; NaN stays NaN. */
unsigned char exec_fp8_from_float(float x, enum exec_fp8 f);
float exec_fp8_to_float(unsigned char q, enum exec_fp8 f);
/* The multiplier before the conversion: fp8_max / amax in float; 1 where amax is 0 or not
 * finite. With block scaling (tiles or blocks) the power of two at or below it, as Transformer
 * Engine's Float8BlockScaling keeps its scales by default (and so Megatron-Bridge's blockwise
 * recipe trains); per-tensor current scaling keeps it whole, as Float8CurrentScaling does. */
float exec_fp8_scale(float amax, enum exec_fp8 f, enum exec_fp8_scaling how);
/* x (rows x cols, row-major) into q and its scales, row-major over the tiles or blocks (partial
 * ones at the ends count); exec_fp8_scale_count of them. */
void exec_fp8_quantize(const float *x, int rows, int cols, enum exec_fp8_scaling how,
                       enum exec_fp8 f, unsigned char *q, float *scales);
size_t exec_fp8_scale_count(int rows, int cols, enum exec_fp8_scaling how);
/* How one operand of an fp8 GEMM is quantized: its scaling and its format. */
struct exec_fp8_how {
    enum exec_fp8_scaling scaling;
    enum exec_fp8 format;
};
/* The fp8 linear layer the GPU's fp8 GEMMs are to be checked against: y (M x N, double) =
 * dequant(q(x)) dequant(q(w))^T, x (M x K) and w (N x K) each quantized as its `how` says (the
 * forward: x in 1 x 128 tiles, w in 128 x 128 blocks, or both per tensor; the weight gradient:
 * both operands in tiles along K), each product dequantized by its own scales, summed in
 * double. */
void exec_ref_fp8_linear(const float *x, struct exec_fp8_how hx, const float *w,
                         struct exec_fp8_how hw, int M, int N, int K, double *y);

/* RMSNorm: y = x / rms(x) * w over `h` (w NULL: no weight, Llama 4's QK norm); backward
 * accumulates dw (NULL: none). */
void exec_ref_rmsnorm(const double *x, const double *w, int tokens, int h, double eps, double *y);
void exec_ref_rmsnorm_backward(const double *x, const double *w, const double *dy, int tokens,
                               int h, double eps, double *dx, double *dw);
/* RoPE in place on (tokens, heads, dim), rotating the first `rot` dims as pairs (i, i + rot/2)
 * by position x inv_freq[i] (the Hugging Face rotate-half convention; mdl_rope_freqs gives the
 * frequencies) and scaling by `scale` (YaRN's attention factor, else 1); `inverse` applies the
 * transpose, which is the backward. */
void exec_ref_rope(double *x, int tokens, int heads, int dim, int rot, const double *inv_freq,
                   double scale, const int *position, bool inverse);
/* Causal attention with GQA (heads a multiple of kv_heads) and an optional sliding window
 * (0: none): q (T, heads, dqk), k (T, kv, dqk), v (T, kv, dv) -> out (T, heads, dv), scores
 * scaled by `scale`; sink (heads, or NULL): gpt-oss's learned sink logit per head, one more term
 * of each softmax's sum with no value. Backward gives dq, dk, dv (overwritten) and adds the
 * sinks' gradient to dsink (heads; NULL without sinks). */
void exec_ref_attention(const double *q, const double *k, const double *v, int tokens, int heads,
                        int kv_heads, int dqk, int dv, int window, double scale, const double *sink,
                        double *out);
void exec_ref_attention_backward(const double *q, const double *k, const double *v,
                                 const double *dout, int tokens, int heads, int kv_heads, int dqk,
                                 int dv, int window, double scale, const double *sink, double *dq,
                                 double *dk, double *dv_out, double *dsink);
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
    double *bias;          /* (layers, experts) selection bias of the MoE layers, or NULL: none */
    double aux_coef;       /* load-balance loss coefficient of every MoE layer (0: none) */
    int64_t *route_counts; /* (layers, experts) or NULL: each step adds its (token, expert) pairs */
};
/* The tensor table alone (params NULL): names, shapes and offsets, which the GPU executor shares.
 * A few per-model features (attention biases, sinks, expert biases; QK-norm with MLA) are not in
 * the executor yet: those models are refused with MOE_ERR_UNSUPPORTED naming the feature. */
enum moe_status exec_model_table(struct exec_ref_model *r, const struct mdl_model *m,
                                 struct moe_error *err);
/* How a tensor starts, by its name: norms at 1 (*ones), biases at 0 (std 0), the rest normal
 * with the std returned (0.02); and whether AdamW's weight decay applies (not to norms and
 * biases, as Megatron's defaults). */
double exec_tensor_init_std(const char *name, bool *ones);
bool exec_tensor_decays(const char *name);
/* The table and a seeded initialization (exec_tensor_init_std). */
enum moe_status exec_ref_model_create(struct exec_ref_model *r, const struct mdl_model *m,
                                      uint64_t seed, struct moe_error *err);
void exec_ref_model_destroy(struct exec_ref_model *r);
const struct exec_tensor *exec_ref_tensor(const struct exec_ref_model *r, const char *name);
/* Mean next-token cross-entropy of tokens[0..T) predicting tokens[1..T], one sequence, plus the
 * load-balance losses when aux_coef > 0 (their sum in *aux when aux is not NULL); `grad`
 * (nparams, may be NULL) receives d loss / d params (overwritten). */
enum moe_status exec_ref_model_step(const struct exec_ref_model *r, const int *tokens, int T,
                                    double *loss, double *aux, double *grad, struct moe_error *err);

/* Training: warmup + cosine learning rate, and AdamW with global-norm gradient clipping (fp64
 * master weights here; the GPU keeps fp32 masters for its bf16 weights). Norm weights get no
 * weight decay. Returns the gradient norm before clipping. */
struct exec_adamw {
    double lr_max, lr_min, beta1, beta2, eps, weight_decay, clip;
    int warmup_steps, total_steps;
    /* the moments kept in bf16 (a plan's moments=bf16, Megatron's precision-aware optimizer):
     * each step's update uses them unrounded, then they are stored rounded to nearest */
    bool moments_bf16;
};
/* x rounded to the nearest bf16 (through fp32, ties to even), as the GPU's __float2bfloat16. */
double exec_ref_bf16(double x);
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

/* The selective-recompute modules the GPU executor redoes: the block norms' outputs, the
 * attention core's output and log-sum-exp, MLA's q, k and v (its up-projections and RoPE), the
 * routed experts' activation, a dense FFN's and the shared experts' gate, up and activation. */
#define EXEC_RC_MODULES                                                                            \
    (COST_RC_BIT(COST_RC_CORE_ATTN) | COST_RC_BIT(COST_RC_MLA_UP_PROJ) |                           \
     COST_RC_BIT(COST_RC_LAYERNORM) | COST_RC_BIT(COST_RC_MOE_ACT) | COST_RC_BIT(COST_RC_MLP) |    \
     COST_RC_BIT(COST_RC_SHARED_EXPERTS))
/* What this build's executor runs (runnable.c); when not, why (may be NULL) says what it lacks.
 * exec_model_supported: the model's features (the CPU reference's too); exec_model_runnable:
 * and its sizes on the GPU; exec_batch_runnable: a micro-batch of mbs x seq tokens of the model
 * (the GPU's GEMMs index with 32-bit offsets); exec_layout_runnable: a layout of the model on
 * `gpus` GPUs, its micro-batch included, in gpu_bytes a GPU (0: not checked; else what the
 * executor allocates, exec_gpu_bytes, and 1 GiB for the CUDA context and cuDNN) -- the filter
 * of `plan --runnable`'s search;
 * exec_plan_runnable: all of them and the plan's placement (`placement`: layers x experts as
 * plan_file holds it, or NULL) -- the one gate of `run`. */
bool exec_model_supported(const struct mdl_model *m, char *why, size_t cap);
bool exec_model_runnable(const struct mdl_model *m, char *why, size_t cap);
bool exec_batch_runnable(const struct mdl_model *m, int mbs, int seq, char *why, size_t cap);
bool exec_layout_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                          double gpu_bytes, char *why, size_t cap);
bool exec_plan_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                        const int *placement, char *why, size_t cap);

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
    const char *name; /* "params", "m1", ... */
    const void *data; /* save: what to write */
    void *out;        /* load: where to read it */
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

#ifdef __cplusplus
}
#endif

#endif /* EXEC_REF_H */
