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
#define MDL_SCHEMA "moeplan.model"
#define MDL_SCHEMA_VERSION 1

enum mdl_attn_type { MDL_ATTN_GQA = 0, MDL_ATTN_MLA };
enum mdl_scoring { MDL_SCORE_SOFTMAX = 0, MDL_SCORE_SIGMOID };

struct mdl_attention {
    enum mdl_attn_type type;
    int heads;    /* query heads */
    int kv_heads; /* GQA: key/value heads (== heads for MHA); MLA: == heads */
    int head_dim; /* GQA: per-head dim of q, k, v */
    /* MLA (DeepSeek): low-rank q (0: no q compression) and kv projections, decoupled RoPE key. */
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool qk_norm;           /* RMSNorm on q and k per head (Qwen3) */
    bool bias;              /* biases on the q/k/v/o projections (gpt-oss) */
    bool sinks;             /* a learned sink logit per head (gpt-oss) */
    int sliding_window;     /* 0: all layers full attention */
    int sliding_every;      /* with a window: layer i slides when i % sliding_every != sliding_every - 1 */
    double rope_theta;
};

struct mdl_moe {
    int experts;            /* routed experts */
    int shared_experts;     /* always-on experts, each of width shared_intermediate */
    int top_k;
    int intermediate;       /* per routed expert (moe_intermediate_size) */
    int shared_intermediate;
    enum mdl_scoring scoring;
    int n_group, topk_group;/* group-limited routing; 1 and 1: no limit */
    bool norm_topk;         /* renormalize the top-k weights to sum to 1 */
    double scaling;         /* routed_scaling_factor */
    bool expert_bias;       /* biases in the expert projections (gpt-oss) */
    bool softmax_after_topk;/* scores = softmax over the chosen k only (gpt-oss, Mixtral style) */
};

struct mdl_model {
    char name[MDL_NAME_MAX];
    int layers;             /* transformer blocks, MTP excluded */
    int first_dense;        /* the first k blocks have a dense FFN */
    int moe_every;          /* after those, block i is MoE when (i - first_dense) % moe_every == moe_every - 1; 1: all */
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
/* Check every invariant of a model; `where` names the source in messages. */
enum moe_status mdl_model_validate(const struct mdl_model *m, const char *where,
                                   struct moe_error *err);
/* Is block `layer` (0-based) an MoE block? */
bool mdl_layer_is_moe(const struct mdl_model *m, int layer);
int mdl_moe_layer_count(const struct mdl_model *m);

#ifdef __cplusplus
}
#endif

#endif /* MDL_H */
