/*
 * hf_import.c: Hugging Face config.json -> struct mdl_model.
 *
 * Users hand us the config.json of the model they train; each model family names the same facts
 * differently (n_routed_experts, num_local_experts, num_experts, ffn_config.moe_num_experts...).
 * This file maps each supported model_type to our struct, once. HF configs carry many keys we do
 * not need, so unknown keys are ignored here (unlike our own files); a key we need that is
 * missing or of the wrong type is an error at its line and column. JSON null means "not used".
 */
#include "mdl.h"

#include <string.h>

const char *const mdl_hf_model_types[] = {"deepseek_v3", "deepseek_v2", "kimi_k2",
                                          "qwen3_moe",   "mixtral",     "dbrx",
                                          "gpt_oss",     "llama4",      NULL};

#define MAX_DIM (1 << 24)

/* An integer member where null or absence means `def`. */
static enum moe_status hf_int(const struct moe_jval *o, const char *key, bool required, int def,
                              int *out, struct moe_error *err)
{
    if (moe_jval_is_null(o, key)) {
        *out = def;
        return MOE_OK;
    }
    int64_t v;
    enum moe_status st = moe_jval_int(o, key, required, def, 0, MAX_DIM, &v, err);
    if (st == MOE_OK) *out = (int)v;
    return st;
}

static enum moe_status hf_num(const struct moe_jval *o, const char *key, double def, double *out,
                              struct moe_error *err)
{
    if (moe_jval_is_null(o, key)) {
        *out = def;
        return MOE_OK;
    }
    return moe_jval_num(o, key, false, def, 0.0, 1e15, out, err);
}

static enum moe_status hf_bool(const struct moe_jval *o, const char *key, bool def, bool *out,
                               struct moe_error *err)
{
    if (moe_jval_is_null(o, key)) {
        *out = def;
        return MOE_OK;
    }
    /* Some configs write 0/1 for flags (DBRX's moe_normalize_expert_weights). */
    if (moe_jval_has(o, key)) {
        int64_t v;
        if (moe_jval_int(o, key, false, 0, 0, 1000, &v, NULL) == MOE_OK) {
            *out = v != 0;
            return MOE_OK;
        }
    }
    return moe_jval_bool(o, key, false, def, out, err);
}

/* Keys every family shares (under these names or not at all). */
static enum moe_status hf_common(const struct moe_jval *o, struct mdl_model *m,
                                 struct moe_error *err)
{
    enum moe_status st;
    if ((st = hf_int(o, "num_hidden_layers", true, 0, &m->layers, err))) return st;
    if ((st = hf_int(o, "hidden_size", true, 0, &m->hidden, err))) return st;
    if ((st = hf_int(o, "vocab_size", true, 0, &m->vocab, err))) return st;
    if ((st = hf_bool(o, "tie_word_embeddings", false, &m->tied_embeddings, err))) return st;
    if ((st = hf_num(o, "rms_norm_eps", 1e-6, &m->norm_eps, err))) return st;
    if ((st = hf_int(o, "max_position_embeddings", false, 4096, &m->max_seq_len, err))) return st;
    if ((st = hf_num(o, "rope_theta", 10000.0, &m->attn.rope_theta, err))) return st;
    if ((st = hf_int(o, "num_attention_heads", true, 0, &m->attn.heads, err))) return st;
    if ((st = hf_int(o, "num_key_value_heads", false, m->attn.heads, &m->attn.kv_heads, err)))
        return st;
    return MOE_OK;
}

/* GQA head_dim: given, or hidden / heads. */
static enum moe_status hf_head_dim(const struct moe_jval *o, struct mdl_model *m,
                                   struct moe_error *err)
{
    int def = m->attn.heads ? m->hidden / m->attn.heads : 0;
    if (!moe_jval_has(o, "head_dim") && m->attn.heads && m->hidden % m->attn.heads)
        return moe_jval_error(o, "hidden_size", err,
                              "%d is not a multiple of num_attention_heads (%d), and no head_dim "
                              "is given",
                              m->hidden, m->attn.heads);
    return hf_int(o, "head_dim", false, def, &m->attn.head_dim, err);
}

static enum moe_status hf_deepseek(const struct moe_jval *o, struct mdl_model *m,
                                   struct moe_error *err)
{
    enum moe_status st;
    char scoring[32];
    struct mdl_attention *a = &m->attn;
    struct mdl_moe *e = &m->moe;
    if ((st = hf_common(o, m, err))) return st;
    a->type = MDL_ATTN_MLA;
    a->kv_heads = a->heads;
    if ((st = hf_int(o, "q_lora_rank", false, 0, &a->q_lora_rank, err))) return st;
    if ((st = hf_int(o, "kv_lora_rank", true, 0, &a->kv_lora_rank, err))) return st;
    if ((st = hf_int(o, "qk_nope_head_dim", true, 0, &a->qk_nope_head_dim, err))) return st;
    if ((st = hf_int(o, "qk_rope_head_dim", true, 0, &a->qk_rope_head_dim, err))) return st;
    if ((st = hf_int(o, "v_head_dim", true, 0, &a->v_head_dim, err))) return st;
    if ((st = hf_int(o, "first_k_dense_replace", false, 0, &m->first_dense, err))) return st;
    if ((st = hf_int(o, "moe_layer_freq", false, 1, &m->moe_every, err))) return st;
    if ((st = hf_int(o, "intermediate_size", false, 0, &m->dense_intermediate, err))) return st;
    if ((st = hf_int(o, "n_routed_experts", true, 0, &e->experts, err))) return st;
    if ((st = hf_int(o, "n_shared_experts", false, 0, &e->shared_experts, err))) return st;
    if ((st = hf_int(o, "num_experts_per_tok", true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(o, "moe_intermediate_size", true, 0, &e->intermediate, err))) return st;
    e->shared_intermediate = e->intermediate;
    if ((st = hf_int(o, "n_group", false, 1, &e->n_group, err))) return st;
    if ((st = hf_int(o, "topk_group", false, e->n_group, &e->topk_group, err))) return st;
    if ((st = hf_bool(o, "norm_topk_prob", false, &e->norm_topk, err))) return st;
    if ((st = hf_num(o, "routed_scaling_factor", 1.0, &e->scaling, err))) return st;
    if ((st = hf_int(o, "num_nextn_predict_layers", false, 0, &m->mtp_layers, err))) return st;
    if ((st = moe_jval_str(o, "scoring_func", false, "softmax", scoring, sizeof scoring, err)))
        return st;
    if (strcmp(scoring, "sigmoid") == 0)
        e->scoring = MDL_SCORE_SIGMOID;
    else if (strcmp(scoring, "softmax") == 0)
        e->scoring = MDL_SCORE_SOFTMAX;
    else
        return moe_jval_error(o, "scoring_func", err, "'%s' is not supported (softmax, sigmoid)",
                              scoring);
    return MOE_OK;
}

static enum moe_status hf_qwen3_moe(const struct moe_jval *o, struct mdl_model *m,
                                    struct moe_error *err)
{
    enum moe_status st;
    struct mdl_moe *e = &m->moe;
    if ((st = hf_common(o, m, err))) return st;
    if ((st = hf_head_dim(o, m, err))) return st;
    m->attn.qk_norm = true; /* every Qwen3 block norms q and k per head */
    bool window = false;
    if ((st = hf_bool(o, "use_sliding_window", false, &window, err))) return st;
    if (window)
        return moe_jval_error(o, "use_sliding_window", err,
                              "Qwen3's sliding window (max_window_layers) is not modeled: "
                              "moeplan plans full attention only for this family");
    if ((st = hf_bool(o, "attention_bias", false, &m->attn.bias, err))) return st;
    if ((st = hf_int(o, "num_experts", true, 0, &e->experts, err))) return st;
    if ((st = hf_int(o, "num_experts_per_tok", true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(o, "moe_intermediate_size", true, 0, &e->intermediate, err))) return st;
    e->shared_intermediate = e->intermediate;
    if ((st = hf_bool(o, "norm_topk_prob", false, &e->norm_topk, err))) return st;
    if ((st = hf_int(o, "decoder_sparse_step", false, 1, &m->moe_every, err))) return st;
    if ((st = hf_int(o, "intermediate_size", false, 0, &m->dense_intermediate, err))) return st;
    struct moe_jval only;
    bool present = false;
    if (!moe_jval_is_null(o, "mlp_only_layers") &&
        (st = moe_jval_array(o, "mlp_only_layers", false, &only, &present, err)))
        return st;
    if (present && moe_jval_len(&only) > 0)
        return moe_jval_error(o, "mlp_only_layers", err,
                              "dense layers at arbitrary positions are not supported");
    e->scoring = MDL_SCORE_SOFTMAX;
    return MOE_OK;
}

static enum moe_status hf_mixtral(const struct moe_jval *o, struct mdl_model *m,
                                  struct moe_error *err)
{
    enum moe_status st;
    struct mdl_moe *e = &m->moe;
    if ((st = hf_common(o, m, err))) return st;
    if ((st = hf_head_dim(o, m, err))) return st;
    if ((st = hf_int(o, "sliding_window", false, 0, &m->attn.sliding_window, err))) return st;
    if (m->attn.sliding_window) m->attn.sliding_every = 1; /* every layer slides */
    if ((st = hf_int(o, "num_local_experts", true, 0, &e->experts, err))) return st;
    if ((st = hf_int(o, "num_experts_per_tok", true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(o, "intermediate_size", true, 0, &e->intermediate, err))) return st;
    e->shared_intermediate = e->intermediate;
    /* softmax over all experts, top-k, renormalize == softmax over the k chosen logits */
    e->softmax_after_topk = true;
    e->scoring = MDL_SCORE_SOFTMAX;
    return MOE_OK;
}

static enum moe_status hf_dbrx(const struct moe_jval *o, struct mdl_model *m, struct moe_error *err)
{
    enum moe_status st;
    struct moe_jval attn, ffn;
    struct mdl_moe *e = &m->moe;
    if ((st = hf_int(o, "n_layers", true, 0, &m->layers, err))) return st;
    if ((st = hf_int(o, "d_model", true, 0, &m->hidden, err))) return st;
    if ((st = hf_int(o, "vocab_size", true, 0, &m->vocab, err))) return st;
    if ((st = hf_int(o, "n_heads", true, 0, &m->attn.heads, err))) return st;
    if ((st = hf_int(o, "max_seq_len", false, 4096, &m->max_seq_len, err))) return st;
    if ((st = hf_bool(o, "tie_word_embeddings", false, &m->tied_embeddings, err))) return st;
    if ((st = moe_jval_object(o, "attn_config", true, &attn, NULL, err))) return st;
    if ((st = hf_int(&attn, "kv_n_heads", false, m->attn.heads, &m->attn.kv_heads, err))) return st;
    if ((st = hf_num(&attn, "rope_theta", 10000.0, &m->attn.rope_theta, err))) return st;
    if ((st = moe_jval_object(o, "ffn_config", true, &ffn, NULL, err))) return st;
    if ((st = hf_int(&ffn, "moe_num_experts", true, 0, &e->experts, err))) return st;
    if ((st = hf_int(&ffn, "moe_top_k", true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(&ffn, "ffn_hidden_size", true, 0, &e->intermediate, err))) return st;
    if ((st = hf_bool(&ffn, "moe_normalize_expert_weights", false, &e->norm_topk, err))) return st;
    e->shared_intermediate = e->intermediate;
    if (m->attn.heads && m->hidden % m->attn.heads)
        return moe_jval_error(o, "d_model", err, "%d is not a multiple of n_heads (%d)", m->hidden,
                              m->attn.heads);
    m->attn.head_dim = m->attn.heads ? m->hidden / m->attn.heads : 0;
    m->norm_eps = 1e-5;
    e->scoring = MDL_SCORE_SOFTMAX;
    return MOE_OK;
}

/* rope_scaling {"rope_type": "yarn", ...} as gpt-oss writes it; other types are refused. */
static enum moe_status hf_yarn(const struct moe_jval *o, struct mdl_attention *a,
                               struct moe_error *err)
{
    struct moe_jval rs;
    bool present = false;
    enum moe_status st;
    if (moe_jval_is_null(o, "rope_scaling")) return MOE_OK;
    if ((st = moe_jval_object(o, "rope_scaling", false, &rs, &present, err)) || !present) return st;
    char type[32] = "";
    const char *tk = moe_jval_has(&rs, "rope_type") ? "rope_type" : "type";
    if ((st = moe_jval_str(&rs, tk, true, NULL, type, sizeof type, err))) return st;
    if (strcmp(type, "yarn") != 0)
        return moe_jval_error(&rs, tk, err, "only \"yarn\" RoPE scaling is supported, not \"%s\"",
                              type);
    struct mdl_yarn *y = &a->yarn;
    a->rope_scaling = MDL_ROPE_YARN;
    if ((st = hf_num(&rs, "factor", 1.0, &y->factor, err)) ||
        (st = hf_int(&rs, "original_max_position_embeddings", true, 0, &y->original_max, err)) ||
        (st = hf_num(&rs, "beta_fast", 32.0, &y->beta_fast, err)) ||
        (st = hf_num(&rs, "beta_slow", 1.0, &y->beta_slow, err)) ||
        (st = hf_bool(&rs, "truncate", true, &y->truncate, err)))
        return st;
    return hf_num(&rs, "attention_factor", mdl_yarn_attention_factor(y->factor),
                  &y->attention_factor, err);
}

static enum moe_status hf_gpt_oss(const struct moe_jval *o, struct mdl_model *m,
                                  struct moe_error *err)
{
    enum moe_status st;
    struct mdl_moe *e = &m->moe;
    if ((st = hf_common(o, m, err))) return st;
    if ((st = hf_head_dim(o, m, err))) return st;
    if ((st = hf_int(o, "num_local_experts", true, 0, &e->experts, err))) return st;
    const char *k =
        moe_jval_has(o, "num_experts_per_tok") ? "num_experts_per_tok" : "experts_per_token";
    if ((st = hf_int(o, k, true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(o, "intermediate_size", true, 0, &e->intermediate, err))) return st;
    e->shared_intermediate = e->intermediate;
    if ((st = hf_int(o, "sliding_window", false, 0, &m->attn.sliding_window, err))) return st;
    struct moe_jval types;
    bool present = false;
    if ((st = moe_jval_array(o, "layer_types", false, &types, &present, err))) return st;
    for (size_t i = 0; present && !m->attn.sliding_window && i < moe_jval_len(&types); i++) {
        const char *t = json_string_value(json_array_get(types.json, i));
        if (t && !strcmp(t, "sliding_attention"))
            return moe_jval_error(o, "layer_types", err,
                                  "layer %zu slides, but sliding_window is 0: give the window", i);
    }
    if (m->attn.sliding_window) {
        /* layer_types alternates sliding and full attention; check that it does. */
        m->attn.sliding_every = 2;
        if (present && moe_jval_len(&types) != (size_t)m->layers)
            return moe_jval_error(o, "layer_types", err,
                                  "%zu entries, not one for each of the %d layers "
                                  "(num_hidden_layers)",
                                  moe_jval_len(&types), m->layers);
        for (size_t i = 0; present && i < moe_jval_len(&types); i++) {
            const char *t = json_string_value(json_array_get(types.json, i));
            bool sliding = t && strcmp(t, "sliding_attention") == 0;
            if (sliding != (i % 2 == 0))
                return moe_jval_error(o, "layer_types", err,
                                      "only alternating sliding/full attention is supported");
        }
    }
    if ((st = hf_yarn(o, &m->attn, err))) return st;
    m->attn.bias = true;
    m->attn.sinks = true;
    e->expert_bias = true;
    e->activation = MDL_ACT_CLAMPED_SWIGLU;
    e->swiglu_alpha = 1.702; /* fixed in the reference implementation, not in config.json */
    if ((st = hf_num(o, "swiglu_limit", 7.0, &e->swiglu_limit, err))) return st;
    e->softmax_after_topk = true;
    e->scoring = MDL_SCORE_SOFTMAX;
    return MOE_OK;
}

static enum moe_status hf_llama4(const struct moe_jval *o, struct mdl_model *m,
                                 struct moe_error *err)
{
    enum moe_status st;
    struct moe_jval text;
    struct mdl_moe *e = &m->moe;
    bool nested = false;
    if ((st = moe_jval_object(o, "text_config", false, &text, &nested, err))) return st;
    const struct moe_jval *t = nested ? &text : o;
    if ((st = hf_common(t, m, err))) return st;
    if ((st = hf_head_dim(t, m, err))) return st;
    if ((st = hf_int(t, "num_local_experts", true, 0, &e->experts, err))) return st;
    if ((st = hf_int(t, "num_experts_per_tok", true, 0, &e->top_k, err))) return st;
    if ((st = hf_int(t, "intermediate_size", true, 0, &e->intermediate, err))) return st;
    if ((st = hf_int(t, "intermediate_size_mlp", false, 0, &m->dense_intermediate, err))) return st;
    if ((st = hf_int(t, "interleave_moe_layer_step", false, 1, &m->moe_every, err))) return st;
    /* RoPE on three layers of four, the fourth global without it; the RoPE layers attend within
     * chunks (Hugging Face's defaults where the config leaves them out) */
    if ((st = hf_int(t, "no_rope_layer_interval", false, 4, &m->attn.nope_every, err)) ||
        (st = hf_int(t, "attention_chunk_size", false, 8192, &m->attn.chunk_size, err)))
        return st;
    /* Hugging Face writes the pattern out as no_rope_layers, a flag a layer (1: RoPE): it must
     * be one interval's */
    struct moe_jval list;
    bool listed = false;
    if (!moe_jval_is_null(t, "no_rope_layers") &&
        (st = moe_jval_array(t, "no_rope_layers", false, &list, &listed, err)))
        return st;
    size_t n = listed ? moe_jval_len(&list) : 0;
    if (n) {
        int every = 0;
        int64_t f;
        if (n != (size_t)m->layers)
            return moe_jval_error(t, "no_rope_layers", err, "%zu flags for %d layers", n,
                                  m->layers);
        for (size_t i = 0; i < n && !every; i++) { /* the first layer without RoPE */
            if ((st = moe_jval_at_int(&list, i, 0, 1, &f, err))) return st;
            if (!f) every = (int)i + 1;
        }
        for (size_t i = 0; i < n; i++)
            if ((st = moe_jval_at_int(&list, i, 0, 1, &f, err)) != MOE_OK)
                return st;
            else if (f != (every == 0 || (int)(i + 1) % every != 0))
                return moe_jval_error(t, "no_rope_layers", err,
                                      "layer %zu breaks the pattern of every %d-th layer without "
                                      "RoPE: moeplan takes such a pattern only",
                                      i, every);
        m->attn.nope_every = every;
    }
    /* the weightless norm of q and k after RoPE (Scout's; Maverick's config turns it off) and the
     * temperature of the queries on the blocks without RoPE, Hugging Face's defaults */
    bool qk_norm = true, tuning = true;
    double floor_scale = 8192, attn_scale = 0.1;
    if ((!moe_jval_is_null(t, "use_qk_norm") &&
         (st = moe_jval_bool(t, "use_qk_norm", false, true, &qk_norm, err))) ||
        (!moe_jval_is_null(t, "attn_temperature_tuning") &&
         (st = moe_jval_bool(t, "attn_temperature_tuning", false, true, &tuning, err))) ||
        (st = hf_num(t, "floor_scale", 8192, &floor_scale, err)) ||
        (st = hf_num(t, "attn_scale", 0.1, &attn_scale, err)))
        return st;
    m->attn.qk_l2_norm = qk_norm;
    if (tuning && m->attn.nope_every && floor_scale < 1)
        return moe_jval_error(t, "floor_scale", err,
                              "%g: the positions one step of the query temperature spans, at "
                              "least 1",
                              floor_scale);
    if (tuning && m->attn.nope_every) {
        m->attn.temp_floor = floor_scale;
        m->attn.temp_scale = attn_scale;
    }
    e->shared_experts = 1;    /* every Llama 4 MoE block has one shared expert */
    e->probs_on_input = true; /* its sigmoid score scales the routed expert's input */
    e->shared_intermediate = e->intermediate;
    e->scoring = MDL_SCORE_SIGMOID;
    return MOE_OK;
}

/* Our keys under each family's names, so that a value the model check refuses is named as the
 * user wrote it (pairs, NULL-terminated; what a family does not list keeps our name). */
#define HF_COMMON_NAMES                                                                            \
    "norm_eps", "rms_norm_eps", "rope_theta", "rope_theta", "max_seq_len",                         \
        "max_position_embeddings", "layers", "num_hidden_layers", "hidden", "hidden_size",         \
        "vocab", "vocab_size", "heads", "num_attention_heads", "kv_heads", "num_key_value_heads",  \
        "head_dim",                                                                                \
        "head_dim (or "                                                                            \
        "hidden_size / num_attention_heads)",                                                      \
        "dense_intermediate", "intermediate_size"
static const char *const hf_names_deepseek[] = {HF_COMMON_NAMES,
                                                "mtp_layers",
                                                "num_nextn_predict_layers",
                                                "first_dense",
                                                "first_k_dense_replace",
                                                "moe_every",
                                                "moe_layer_freq",
                                                "experts",
                                                "n_routed_experts",
                                                "shared_experts",
                                                "n_shared_experts",
                                                "top_k",
                                                "num_experts_per_tok",
                                                "intermediate",
                                                "moe_intermediate_size",
                                                "shared_intermediate",
                                                "moe_intermediate_size",
                                                "n_group",
                                                "n_group",
                                                "topk_group",
                                                "topk_group",
                                                "scaling",
                                                "routed_scaling_factor",
                                                NULL};
static const char *const hf_names_qwen3[] = {
    HF_COMMON_NAMES,         "moe_every", "decoder_sparse_step", "experts",
    "num_experts",           "top_k",     "num_experts_per_tok", "intermediate",
    "moe_intermediate_size", NULL};
static const char *const hf_names_mixtral[] = {HF_COMMON_NAMES,       "experts",
                                               "num_local_experts",   "top_k",
                                               "num_experts_per_tok", "intermediate",
                                               "intermediate_size",   "sliding_window",
                                               "sliding_window",      NULL};
static const char *const hf_names_dbrx[] = {"layers",
                                            "n_layers",
                                            "hidden",
                                            "d_model",
                                            "vocab",
                                            "vocab_size",
                                            "heads",
                                            "n_heads",
                                            "kv_heads",
                                            "attn_config.kv_n_heads",
                                            "head_dim",
                                            "d_model / n_heads",
                                            "experts",
                                            "ffn_config.moe_num_experts",
                                            "top_k",
                                            "ffn_config.moe_top_k",
                                            "intermediate",
                                            "ffn_config.ffn_hidden_size",
                                            NULL};
static const char *const hf_names_gpt_oss[] = {
    HF_COMMON_NAMES,       "experts",      "num_local_experts", "top_k",
    "num_experts_per_tok", "intermediate", "intermediate_size", NULL};
static const char *const hf_names_llama4[] = {HF_COMMON_NAMES,
                                              "moe_every",
                                              "interleave_moe_layer_step",
                                              "nope_every",
                                              "no_rope_layer_interval",
                                              "chunk_size",
                                              "attention_chunk_size",
                                              "qk_l2_norm",
                                              "use_qk_norm",
                                              "nope_temperature",
                                              "floor_scale and attn_scale",
                                              "experts",
                                              "num_local_experts",
                                              "top_k",
                                              "num_experts_per_tok",
                                              "intermediate",
                                              "intermediate_size",
                                              "dense_intermediate",
                                              "intermediate_size_mlp",
                                              NULL};

enum moe_status mdl_model_from_hf(struct mdl_model *m, const struct moe_jdoc *doc,
                                  struct moe_error *err)
{
    struct moe_jval root;
    enum moe_status st = moe_jdoc_root(doc, &root, err);
    if (st != MOE_OK) return st;
    char type[64];
    if ((st = moe_jval_str(&root, "model_type", true, NULL, type, sizeof type, err))) return st;
    struct mdl_model t;
    memset(&t, 0, sizeof t);
    t.moe_every = 1;
    t.moe.n_group = t.moe.topk_group = 1;
    t.moe.scaling = 1.0;
    t.norm_eps = 1e-6;
    t.attn.rope_theta = 10000.0;
    const char *const *names = NULL;
    if (!strcmp(type, "deepseek_v3") || !strcmp(type, "deepseek_v2") || !strcmp(type, "kimi_k2")) {
        st = hf_deepseek(&root, &t, err);
        names = hf_names_deepseek;
    } else if (!strcmp(type, "qwen3_moe")) {
        st = hf_qwen3_moe(&root, &t, err);
        names = hf_names_qwen3;
    } else if (!strcmp(type, "mixtral")) {
        st = hf_mixtral(&root, &t, err);
        names = hf_names_mixtral;
    } else if (!strcmp(type, "dbrx")) {
        st = hf_dbrx(&root, &t, err);
        names = hf_names_dbrx;
    } else if (!strcmp(type, "gpt_oss")) {
        st = hf_gpt_oss(&root, &t, err);
        names = hf_names_gpt_oss;
    } else if (!strcmp(type, "llama4")) {
        st = hf_llama4(&root, &t, err);
        names = hf_names_llama4;
    } else {
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; mdl_hf_model_types[i]; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     mdl_hf_model_types[i]);
        return moe_jval_error(&root, "model_type", err,
                              "model type '%s' is not supported (supported: %s)", type, list);
    }
    if (st != MOE_OK) return st;
    if (t.moe.top_k == 0 || t.moe.experts == 0)
        return moe_jval_error(&root, NULL, err, "the config has no MoE experts");
    char name[MDL_NAME_MAX];
    if (moe_jval_str(&root, "_name_or_path", false, "", name, sizeof name, NULL) != MOE_OK ||
        !name[0]) {
        int n = snprintf(name, sizeof name, "%s-hf", type);
        if (n < 0 || (size_t)n >= sizeof name) name[sizeof name - 1] = '\0';
    }
    /* "org/model" -> "model": our names are short and path-free. */
    const char *slash = strrchr(name, '/');
    snprintf(t.name, sizeof t.name, "%s", slash ? slash + 1 : name);
    if ((st = mdl_model_validate_as(&t, doc->file, names, err))) return st;
    *m = t;
    return MOE_OK;
}
