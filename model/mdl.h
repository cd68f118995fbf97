/*
 * mdl.h: the one public header of model/: what is trained.
 *
 * A struct mdl_model is a complete, validated description of a transformer with MoE layers: the
 * planner counts its parameters, FLOPs and bytes from it, and the executor builds its layers from
 * it. It is loaded from our own JSON schema ("moeplan.model", documented in model/README.md).
 *
 * Invariant: a struct mdl_model that a load function returned has passed mdl_model_validate, so
 * every later computation can rely on positive sizes and divisible shapes.
 */
#ifndef MDL_H
#define MDL_H

#include "moe_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MDL_NAME_MAX 64
/* The largest models moeplan takes (every model file, HF config and --layers/--experts override is
 * checked against these; the planner sizes its buffers by the model, within them). */
#define MDL_MAX_LAYERS 100000
#define MDL_MAX_EXPERTS 65536
#define MDL_MAX_TOP_K 64
#define MDL_MAX_MTP 64 /* multi-token prediction layers */
#define MDL_SCHEMA "moeplan.model"
#define MDL_SCHEMA_VERSION 1

enum mdl_attn_type { MDL_ATTN_GQA = 0, MDL_ATTN_MLA };
enum mdl_scoring { MDL_SCORE_SOFTMAX = 0, MDL_SCORE_SIGMOID };
enum mdl_rope_scaling { MDL_ROPE_PLAIN = 0, MDL_ROPE_YARN };
enum mdl_activation { MDL_ACT_SWIGLU = 0, MDL_ACT_CLAMPED_SWIGLU };

/* YaRN (gpt-oss): each RoPE frequency blends its interpolated (/ factor) and original value by
 * where its wavelength falls between beta_fast and beta_slow rotations over original_max
 * positions; cos and sin are multiplied by attention_factor (default 0.1 ln(factor) + 1). */
struct mdl_yarn {
    double factor, beta_fast, beta_slow, attention_factor;
    int original_max;
    bool truncate; /* round the blend's band to whole dimensions */
};

struct mdl_attention {
    enum mdl_attn_type type;
    int heads;    /* query heads */
    int kv_heads; /* GQA: key/value heads (== heads for MHA); MLA: == heads */
    int head_dim; /* GQA: per-head dim of q, k, v */
    /* MLA (DeepSeek): low-rank q (0: no q compression) and kv projections, decoupled RoPE key. */
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool qk_norm;       /* RMSNorm on q and k per head (Qwen3) */
    bool bias;          /* biases on the q/k/v/o projections (gpt-oss) */
    bool sinks;         /* a learned sink logit per head (gpt-oss) */
    int sliding_window; /* 0: all layers full attention */
    int sliding_every; /* with a window: layer i slides when i % sliding_every != sliding_every - 1 */
    /* Llama 4: layer i has no RoPE when i % nope_every == nope_every - 1 (0: every layer has it);
     * the layers with RoPE attend within chunks of chunk_size tokens (0: no chunks) */
    int nope_every, chunk_size;
    /* Llama 4: an RMSNorm without weights over each head's q and k after RoPE, on the blocks
     * with RoPE (qk_l2_norm); on the blocks without, q scaled by 1 + temp_scale x
     * ln(floor((position + 1) / temp_floor) + 1) (temp_floor 0: not) */
    bool qk_l2_norm;
    double temp_floor, temp_scale;
    double rope_theta;
    enum mdl_rope_scaling rope_scaling;
    struct mdl_yarn yarn; /* with MDL_ROPE_YARN */
};

struct mdl_moe {
    int experts;        /* routed experts */
    int shared_experts; /* always-on experts, each of width shared_intermediate */
    int top_k;
    int intermediate; /* per routed expert (moe_intermediate_size) */
    int shared_intermediate;
    enum mdl_scoring scoring;
    int n_group, topk_group; /* group-limited routing; 1 and 1: no limit */
    bool norm_topk;          /* renormalize the top-k weights to sum to 1 */
    double scaling;          /* routed_scaling_factor */
    bool expert_bias;        /* biases in the expert projections (gpt-oss) */
    bool probs_on_input;     /* the routing weight scales the expert's input, not its output
                              * (Llama 4: y = sum expert(w x)) */
    bool softmax_after_topk; /* scores = softmax over the chosen k only (gpt-oss, Mixtral style) */
    /* The routed experts' activation: SwiGLU silu(g) u, or gpt-oss's clamped form
     * (u' + 1) g' sigmoid(alpha g'), g' = min(g, limit), u' = clamp(u, -limit, limit). */
    enum mdl_activation activation;
    double swiglu_alpha, swiglu_limit;
};

struct mdl_model {
    char name[MDL_NAME_MAX];
    int layers;      /* transformer blocks, MTP excluded */
    int first_dense; /* the first k blocks have a dense FFN */
    int moe_every; /* after those, block i is MoE when (i - first_dense) % moe_every == moe_every - 1; 1: all */
    int hidden;
    int vocab;
    bool tied_embeddings;
    double norm_eps;
    int max_seq_len;
    struct mdl_attention attn;
    int dense_intermediate; /* 0 when the model has no dense FFN layers */
    struct mdl_moe moe;
    int mtp_layers;
};

/* Load and validate one of our model files. Errors name file:line:col. */
enum moe_status mdl_model_load(struct mdl_model *m, const char *file, struct moe_error *err);
/* Unpack from a loaded document (used by `moeplan check`, which has the document already). */
enum moe_status mdl_model_from_doc(struct mdl_model *m, const struct moe_jdoc *doc,
                                   struct moe_error *err);
/* The same from an object inside a document (a plan embeds its model); no schema check. */
enum moe_status mdl_model_from_jval(struct mdl_model *m, const struct moe_jval *root,
                                    struct moe_error *err);
/* Import a Hugging Face config.json (model types: see mdl_hf_model_types). */
enum moe_status mdl_model_from_hf(struct mdl_model *m, const struct moe_jdoc *doc,
                                  struct moe_error *err);
extern const char *const mdl_hf_model_types[];
/* Check every invariant of a model; `where` names the source in messages. */
enum moe_status mdl_model_validate(const struct mdl_model *m, const char *where,
                                   struct moe_error *err);
/* The same, naming keys as the source does: `names` holds pairs {our key, theirs, ..., NULL}
 * (a Hugging Face config's decoder_sparse_step for our moe_every). */
enum moe_status mdl_model_validate_as(const struct mdl_model *m, const char *where,
                                      const char *const *names, struct moe_error *err);

/* What `--model` accepts: a shipped name ("deepseek-v3", looked up as model_dir/NAME.json), a
 * path to one of our files, or a path to a Hugging Face config.json. */
enum moe_status mdl_model_resolve(struct mdl_model *m, const char *spec, const char *model_dir,
                                  struct moe_error *err);

/* Overrides for proxies: 0 leaves a field as it is. `experts` keeps every per-expert shape. */
struct mdl_overrides {
    int layers;
    int experts;
};
enum moe_status mdl_model_override(struct mdl_model *m, const struct mdl_overrides *o,
                                   struct moe_error *err);

/* The model as JSON text of our schema ("moeplan.model"), malloc'd; NULL when out of memory.
 * A plan embeds it, so that the executor builds exactly the model that was planned. */
char *mdl_model_to_json_text(const struct mdl_model *m);

/* Is block `layer` (0-based) an MoE block? */
bool mdl_layer_is_moe(const struct mdl_model *m, int layer);
/* The MoE layers among layers 0 .. layer - 1 (O(1): the pattern counted, not walked). */
int mdl_moe_layers_before(const struct mdl_model *m, int layer);
int mdl_moe_layer_count(const struct mdl_model *m);
/* Is block `layer` a sliding-window attention block? */
bool mdl_layer_is_sliding(const struct mdl_model *m, int layer);
/* Does block `layer` rotate q and k (RoPE)? Its attention's chunk (0: the whole sequence). */
bool mdl_layer_has_rope(const struct mdl_model *m, int layer);
int mdl_layer_chunk(const struct mdl_model *m, int layer);
/* Llama 4's query temperature at `position` (0-based) on block `layer`: 1 where none. */
double mdl_query_temperature(const struct mdl_model *m, int layer, int position);
/* Keys a query attends to on average over seq tokens: the causal half, or the band of a sliding
 * window of `window` keys (window <= 0: none). */
double mdl_attended_keys(double seq, double window);
/* RoPE over `rot` dims: the rot / 2 inverse frequencies (pair i turns by position x inv_freq[i])
 * and the factor on cos and sin (1 without scaling), for plain and YaRN RoPE alike. */
void mdl_rope_freqs(const struct mdl_attention *a, int rot, double *inv_freq, double *scale);
/* YaRN's default attention factor for a scaling factor: 0.1 ln(factor) + 1 (Hugging Face's). */
double mdl_yarn_attention_factor(double factor);

/* ---------------------------------------------------------------------------------------------- */
/* Derived numbers                                                                                */
/* ---------------------------------------------------------------------------------------------- */

/* The parts of a model that numbers are broken down by. */
enum mdl_component {
    MDL_EMBED = 0, /* input embedding table (a lookup: no FLOPs) */
    MDL_ATTN_PROJ, /* q, k, v, o projections (MLA: the low-rank ones), their biases */
    MDL_ATTN_CORE, /* QK^T and AV: FLOPs only */
    MDL_NORMS,     /* RMSNorm weights (block norms, q/kv-lora norms, QK-norm, final norm) */
    MDL_ROUTER,    /* router GEMM (and its bias) */
    MDL_ROUTED,    /* routed experts */
    MDL_SHARED,    /* shared experts */
    MDL_DENSE_FFN, /* dense SwiGLU FFN blocks */
    MDL_LM_HEAD,   /* output projection (shares the embedding table when tied) */
    MDL_NCOMPONENTS
};
extern const char *const mdl_component_names[MDL_NCOMPONENTS];

/* Parameters of one block by component (MDL_EMBED and MDL_LM_HEAD are 0 here). For the routed
 * experts, `params` counts all of them and `active` the top_k a token uses. */
struct mdl_block_params {
    double params[MDL_NCOMPONENTS];
    double active[MDL_NCOMPONENTS];
    double one_expert; /* parameters of one routed expert */
};
void mdl_block_params(const struct mdl_model *m, int layer, struct mdl_block_params *out);

/* Whole-model parameter counts (MTP layers are counted apart, as publishers do). */
struct mdl_params {
    double by_component[MDL_NCOMPONENTS];
    double total;           /* every parameter of the main model */
    double active;          /* what one token touches, both embedding tables included */
    double active_no_embed; /* the same without the input embedding table */
    double mtp;             /* the MTP modules, not in total */
};
void mdl_params_count(const struct mdl_model *m, struct mdl_params *out);

/* Model FLOPs per token at sequence length `seq_len`, counted the usual way: matrix multiplies
 * only, 2 FLOPs per multiply-add, core attention with the causal half (a sliding window counts
 * the keys inside the window), backward = 2 x forward. MTP layers are not counted. */
struct mdl_flops {
    double fwd[MDL_NCOMPONENTS];
    double fwd_total;
    double bwd_total;
    double train_total; /* fwd + bwd */
};
void mdl_flops_per_token(const struct mdl_model *m, int seq_len, struct mdl_flops *out);
/* Model FLOPs per token as Megatron-Bridge's tables count them (flop_utils'
 * num_floating_point_operations): every GEMM but the router's, 3 x the forward, causal attention
 * halved (a sliding window counting its keys), `mtp` MTP layers each costed as the last layer
 * plus its [embedding, hidden] projection and its own LM head, the vocabulary padded to a multiple
 * of 128. Returns FLOPs per token of a training step. */
double mdl_flops_megatron(const struct mdl_model *m, int seq_len, int mtp);
/* The same for one block (layer), forward only, by component. */
void mdl_block_flops_fwd(const struct mdl_model *m, int layer, int seq_len,
                         double out[MDL_NCOMPONENTS]);

/* Activation bytes one token keeps for the backward pass in one block, bf16 tensors and fp32
 * softmax/router statistics, with no recompute: by component, and their sum. Flash-style
 * attention is assumed (no seq x seq matrix is kept). */
struct mdl_activations {
    double bytes[MDL_NCOMPONENTS];
    double total;
};
void mdl_block_activations(const struct mdl_model *m, int layer, struct mdl_activations *out);

#ifdef __cplusplus
}
#endif

#endif /* MDL_H */
