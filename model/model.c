/*
 * model.c: loading and validating moeplan model files ("moeplan.model").
 *
 * The file mirrors the struct one to one (model/README.md documents each key), so that a reader
 * of a plan can see exactly what was modelled. Unknown keys are rejected: a misspelt key that was
 * silently ignored would change every number the planner prints.
 */
#include "mdl.h"

#include <math.h>
#include <string.h>

#define MAX_DIM (1 << 24)

static const char *const attn_names[] = {"gqa", "mla", NULL};
static const char *const scoring_names[] = {"softmax", "sigmoid", NULL};
static const char *const rope_names[] = {"plain", "yarn", NULL};
static const char *const act_names[] = {"swiglu", "clamped_swiglu", NULL};

/* attention.rope_scaling: {"type": "yarn", "factor", "original_max_position", "beta_fast",
 * "beta_slow", "truncate", "attention_factor"} (the Hugging Face rope_scaling's fields). */
static enum moe_status load_rope_scaling(const struct moe_jval *o, struct mdl_attention *a,
                                         struct moe_error *err)
{
    static const char *const keys[] = {
        "type",      "factor",   "original_max_position", "beta_fast",
        "beta_slow", "truncate", "attention_factor",      NULL};
    struct mdl_yarn *y = &a->yarn;
    enum moe_status st;
    int type;
    if ((st = moe_jval_keys(o, keys, err))) return st;
    if ((st = moe_jval_enum(o, "type", true, 0, rope_names, &type, err))) return st;
    a->rope_scaling = (enum mdl_rope_scaling)type;
    if (a->rope_scaling == MDL_ROPE_PLAIN) {
        if (moe_jval_has(o, "factor"))
            return moe_jval_error(o, "factor", err, "plain RoPE takes no scaling parameters");
        return MOE_OK;
    }
    if ((st = moe_jval_num(o, "factor", true, 0.0, 1.0, 1e6, &y->factor, err))) return st;
    if ((st = moe_jval_int32(o, "original_max_position", true, 0, 1, 1 << 30, &y->original_max,
                             err)))
        return st;
    if ((st = moe_jval_num(o, "beta_fast", false, 32.0, 1e-6, 1e6, &y->beta_fast, err))) return st;
    if ((st = moe_jval_num(o, "beta_slow", false, 1.0, 1e-6, 1e6, &y->beta_slow, err))) return st;
    if ((st = moe_jval_bool(o, "truncate", false, true, &y->truncate, err))) return st;
    if ((st = moe_jval_num(o, "attention_factor", false, mdl_yarn_attention_factor(y->factor), 1e-6,
                           1e6, &y->attention_factor, err)))
        return st;
    if (!(y->beta_fast > y->beta_slow))
        return moe_jval_error(o, "beta_fast", err, "must exceed beta_slow (%g)", y->beta_slow);
    return MOE_OK;
}

static enum moe_status load_attention(const struct moe_jval *o, struct mdl_attention *a,
                                      struct moe_error *err)
{
    static const char *const keys[] = {"type",
                                       "heads",
                                       "kv_heads",
                                       "head_dim",
                                       "q_lora_rank",
                                       "kv_lora_rank",
                                       "qk_nope_head_dim",
                                       "qk_rope_head_dim",
                                       "v_head_dim",
                                       "qk_norm",
                                       "bias",
                                       "sinks",
                                       "sliding_window",
                                       "sliding_every",
                                       "nope_every",
                                       "chunk_size",
                                       "qk_l2_norm",
                                       "nope_temperature",
                                       "rope_theta",
                                       "rope_scaling",
                                       NULL};
    enum moe_status st;
    int type;
    if ((st = moe_jval_keys(o, keys, err)) != MOE_OK) return st;
    if ((st = moe_jval_enum(o, "type", true, 0, attn_names, &type, err)) != MOE_OK) return st;
    a->type = (enum mdl_attn_type)type;
    bool mla = a->type == MDL_ATTN_MLA;
    if ((st = moe_jval_int32(o, "heads", true, 0, 1, 65536, &a->heads, err))) return st;
    if ((st = moe_jval_int32(o, "kv_heads", !mla, a->heads, 1, 65536, &a->kv_heads, err)))
        return st;
    if ((st = moe_jval_int32(o, "head_dim", !mla, 0, 0, 65536, &a->head_dim, err))) return st;
    if ((st = moe_jval_int32(o, "q_lora_rank", false, 0, 0, MAX_DIM, &a->q_lora_rank, err)))
        return st;
    if ((st = moe_jval_int32(o, "kv_lora_rank", mla, 0, 0, MAX_DIM, &a->kv_lora_rank, err)))
        return st;
    if ((st = moe_jval_int32(o, "qk_nope_head_dim", mla, 0, 0, 65536, &a->qk_nope_head_dim, err)))
        return st;
    if ((st = moe_jval_int32(o, "qk_rope_head_dim", mla, 0, 0, 65536, &a->qk_rope_head_dim, err)))
        return st;
    if ((st = moe_jval_int32(o, "v_head_dim", mla, 0, 0, 65536, &a->v_head_dim, err))) return st;
    if ((st = moe_jval_bool(o, "qk_norm", false, false, &a->qk_norm, err))) return st;
    if ((st = moe_jval_bool(o, "bias", false, false, &a->bias, err))) return st;
    if ((st = moe_jval_bool(o, "sinks", false, false, &a->sinks, err))) return st;
    if ((st = moe_jval_int32(o, "sliding_window", false, 0, 0, MAX_DIM, &a->sliding_window, err)))
        return st;
    if ((st = moe_jval_int32(o, "sliding_every", false, a->sliding_window ? 2 : 0, 0, 1024,
                             &a->sliding_every, err)))
        return st;
    if ((st = moe_jval_int32(o, "nope_every", false, 0, 0, 1024, &a->nope_every, err)) ||
        (st = moe_jval_int32(o, "chunk_size", false, 0, 0, MAX_DIM, &a->chunk_size, err)) ||
        (st = moe_jval_bool(o, "qk_l2_norm", false, false, &a->qk_l2_norm, err)))
        return st;
    struct moe_jval tt;
    bool tuned = false;
    if ((st = moe_jval_object(o, "nope_temperature", false, &tt, &tuned, err))) return st;
    if (tuned) {
        static const char *const tkeys[] = {"floor_scale", "scale", NULL};
        if ((st = moe_jval_keys(&tt, tkeys, err)) ||
            (st = moe_jval_num(&tt, "floor_scale", true, 0, 1, 1e9, &a->temp_floor, err)) ||
            (st = moe_jval_num(&tt, "scale", true, 0, 0, 100, &a->temp_scale, err)))
            return st;
    }
    if ((st = moe_jval_num(o, "rope_theta", false, 10000.0, 1.0, 1e12, &a->rope_theta, err)))
        return st;
    struct moe_jval rs;
    bool scaled = false;
    if ((st = moe_jval_object(o, "rope_scaling", false, &rs, &scaled, err))) return st;
    if (scaled && (st = load_rope_scaling(&rs, a, err))) return st;
    if (mla) {
        if (moe_jval_has(o, "head_dim"))
            return moe_jval_error(o, "head_dim", err,
                                  "MLA has no head_dim: give qk_nope_head_dim, qk_rope_head_dim "
                                  "and v_head_dim");
        if (a->kv_heads != a->heads)
            return moe_jval_error(o, "kv_heads", err, "MLA has as many kv heads as heads (%d)",
                                  a->heads);
        if (a->kv_lora_rank < 1)
            return moe_jval_error(o, "kv_lora_rank", err, "MLA needs kv_lora_rank >= 1");
        if (a->qk_nope_head_dim < 1 || a->v_head_dim < 1)
            return moe_jval_error(o, NULL, err, "MLA needs qk_nope_head_dim and v_head_dim >= 1");
    } else {
        if (a->head_dim < 1) return moe_jval_error(o, "head_dim", err, "must be at least 1");
        if (a->heads % a->kv_heads != 0)
            return moe_jval_error(o, "kv_heads", err,
                                  "heads (%d) must be a multiple of kv_heads (%d)", a->heads,
                                  a->kv_heads);
        if (a->head_dim % 2 != 0)
            return moe_jval_error(o, "head_dim", err, "must be even (RoPE rotates pairs)");
        static const char *const mla_only[] = {"q_lora_rank",      "kv_lora_rank",
                                               "qk_nope_head_dim", "qk_rope_head_dim",
                                               "v_head_dim",       NULL};
        for (const char *const *k = mla_only; *k; k++)
            if (moe_jval_has(o, *k))
                return moe_jval_error(o, *k, err, "only MLA attention has this key");
    }
    if (a->sliding_window && a->sliding_every < 1)
        return moe_jval_error(o, "sliding_every", err, "must be >= 1 with a sliding window");
    if (mla && a->nope_every)
        return moe_jval_error(o, "nope_every", err,
                              "MLA keeps its RoPE dims on every layer (nope_every is Llama 4's, "
                              "GQA)");
    if (a->qk_l2_norm && (mla || a->qk_norm))
        return moe_jval_error(o, "qk_l2_norm", err,
                              "Llama 4's weightless norm after RoPE: GQA only, and not with "
                              "qk_norm (Qwen3's)");
    if (tuned && !a->nope_every)
        return moe_jval_error(o, "nope_temperature", err,
                              "scales the queries of the blocks without RoPE: needs nope_every");
    if (a->chunk_size && a->sliding_window)
        return moe_jval_error(o, "chunk_size", err,
                              "chunked attention and a sliding window together: not modeled");
    return MOE_OK;
}

static enum moe_status load_moe(const struct moe_jval *o, struct mdl_moe *e, struct moe_error *err)
{
    static const char *const keys[] = {"experts",
                                       "shared_experts",
                                       "top_k",
                                       "intermediate",
                                       "shared_intermediate",
                                       "scoring",
                                       "n_group",
                                       "topk_group",
                                       "norm_topk",
                                       "scaling",
                                       "expert_bias",
                                       "probs_on_input",
                                       "softmax_after_topk",
                                       "activation",
                                       "swiglu_alpha",
                                       "swiglu_limit",
                                       NULL};
    enum moe_status st;
    int scoring;
    if ((st = moe_jval_keys(o, keys, err)) != MOE_OK) return st;
    if ((st = moe_jval_int32(o, "experts", true, 0, 1, MDL_MAX_EXPERTS, &e->experts, err)))
        return st;
    if ((st = moe_jval_int32(o, "shared_experts", false, 0, 0, 1024, &e->shared_experts, err)))
        return st;
    if ((st = moe_jval_int32(o, "top_k", true, 0, 1, MDL_MAX_TOP_K, &e->top_k, err))) return st;
    if ((st = moe_jval_int32(o, "intermediate", true, 0, 1, MAX_DIM, &e->intermediate, err)))
        return st;
    if ((st = moe_jval_int32(o, "shared_intermediate", false, e->intermediate, 1, MAX_DIM,
                             &e->shared_intermediate, err)))
        return st;
    if ((st = moe_jval_enum(o, "scoring", false, MDL_SCORE_SOFTMAX, scoring_names, &scoring, err)))
        return st;
    e->scoring = (enum mdl_scoring)scoring;
    if ((st = moe_jval_int32(o, "n_group", false, 1, 1, 1 << 16, &e->n_group, err))) return st;
    if ((st = moe_jval_int32(o, "topk_group", false, e->n_group, 1, 1 << 16, &e->topk_group, err)))
        return st;
    if ((st = moe_jval_bool(o, "norm_topk", false, false, &e->norm_topk, err))) return st;
    if ((st = moe_jval_num(o, "scaling", false, 1.0, 1e-6, 1e6, &e->scaling, err))) return st;
    if ((st = moe_jval_bool(o, "expert_bias", false, false, &e->expert_bias, err))) return st;
    if ((st = moe_jval_bool(o, "probs_on_input", false, false, &e->probs_on_input, err))) return st;
    if ((st = moe_jval_bool(o, "softmax_after_topk", false, false, &e->softmax_after_topk, err)))
        return st;
    int act;
    if ((st = moe_jval_enum(o, "activation", false, MDL_ACT_SWIGLU, act_names, &act, err)))
        return st;
    e->activation = (enum mdl_activation)act;
    if (e->activation == MDL_ACT_CLAMPED_SWIGLU) { /* gpt-oss's values by default */
        if ((st = moe_jval_num(o, "swiglu_alpha", false, 1.702, 1e-6, 1e6, &e->swiglu_alpha, err)))
            return st;
        if ((st = moe_jval_num(o, "swiglu_limit", false, 7.0, 1e-6, 1e6, &e->swiglu_limit, err)))
            return st;
    } else {
        for (const char *const *k = (const char *const[]){"swiglu_alpha", "swiglu_limit", NULL}; *k;
             k++)
            if (moe_jval_has(o, *k))
                return moe_jval_error(o, *k, err,
                                      "only the \"clamped_swiglu\" activation takes this key");
    }
    if (e->top_k > e->experts)
        return moe_jval_error(o, "top_k", err, "top_k (%d) exceeds the number of experts (%d)",
                              e->top_k, e->experts);
    if (e->experts % e->n_group != 0)
        return moe_jval_error(o, "n_group", err, "experts (%d) must be divisible by n_group (%d)",
                              e->experts, e->n_group);
    if (e->topk_group > e->n_group)
        return moe_jval_error(o, "topk_group", err, "topk_group (%d) exceeds n_group (%d)",
                              e->topk_group, e->n_group);
    if (e->top_k > e->topk_group * (e->experts / e->n_group))
        return moe_jval_error(o, "top_k", err,
                              "top_k (%d) exceeds the experts reachable in topk_group groups (%d)",
                              e->top_k, e->topk_group * (e->experts / e->n_group));
    return MOE_OK;
}

enum moe_status mdl_model_from_doc(struct mdl_model *m, const struct moe_jdoc *doc,
                                   struct moe_error *err)
{
    struct moe_jval root;
    char schema[64];
    int version;
    enum moe_status st;
    if ((st = moe_jdoc_schema(doc, schema, sizeof schema, &version, err))) return st;
    if ((st = moe_jdoc_root(doc, &root, err))) return st;
    if (strcmp(schema, MDL_SCHEMA) != 0)
        return moe_jval_error(&root, "schema", err, "expected \"%s\", got \"%s\"", MDL_SCHEMA,
                              schema);
    if (version != MDL_SCHEMA_VERSION)
        return moe_jval_error(&root, "version", err, "this moeplan reads version %d, not %d",
                              MDL_SCHEMA_VERSION, version);
    return mdl_model_from_jval(m, &root, err);
}

enum moe_status mdl_model_from_jval(struct mdl_model *m, const struct moe_jval *rootp,
                                    struct moe_error *err)
{
    static const char *const keys[] = {"schema",    "version",
                                       "name",      "source",
                                       "layers",    "first_dense",
                                       "moe_every", "hidden",
                                       "vocab",     "tied_embeddings",
                                       "norm_eps",  "max_seq_len",
                                       "attention", "dense_intermediate",
                                       "moe",       "mtp_layers",
                                       NULL};
    struct mdl_model t;
    memset(&t, 0, sizeof t);
    struct moe_jval root = *rootp, o;
    enum moe_status st;
    if ((st = moe_jval_keys(&root, keys, err))) return st;
    if ((st = moe_jval_str(&root, "name", true, NULL, t.name, sizeof t.name, err))) return st;
    if (!t.name[0]) return moe_jval_error(&root, "name", err, "must not be empty");
    if ((st = moe_jval_int32(&root, "layers", true, 0, 1, MDL_MAX_LAYERS, &t.layers, err)))
        return st;
    if ((st = moe_jval_int32(&root, "first_dense", false, 0, 0, t.layers, &t.first_dense, err)))
        return st;
    if ((st = moe_jval_int32(&root, "moe_every", false, 1, 1, 1000, &t.moe_every, err))) return st;
    if ((st = moe_jval_int32(&root, "hidden", true, 0, 1, MAX_DIM, &t.hidden, err))) return st;
    if ((st = moe_jval_int32(&root, "vocab", true, 0, 1, 1 << 28, &t.vocab, err))) return st;
    if ((st = moe_jval_bool(&root, "tied_embeddings", false, false, &t.tied_embeddings, err)))
        return st;
    if ((st = moe_jval_num(&root, "norm_eps", false, 1e-6, 1e-12, 1.0, &t.norm_eps, err)))
        return st;
    if ((st = moe_jval_int32(&root, "max_seq_len", false, 4096, 1, 1 << 30, &t.max_seq_len, err)))
        return st;
    if ((st = moe_jval_object(&root, "attention", true, &o, NULL, err))) return st;
    if ((st = load_attention(&o, &t.attn, err))) return st;
    if ((st = moe_jval_int32(&root, "dense_intermediate", false, 0, 0, MAX_DIM,
                             &t.dense_intermediate, err)))
        return st;
    if ((st = moe_jval_object(&root, "moe", true, &o, NULL, err))) return st;
    if ((st = load_moe(&o, &t.moe, err))) return st;
    if ((st = moe_jval_int32(&root, "mtp_layers", false, 0, 0, MDL_MAX_MTP, &t.mtp_layers, err)))
        return st;
    bool has_dense = false;
    for (int i = 0; i < t.layers; i++) has_dense |= !mdl_layer_is_moe(&t, i);
    if (has_dense && t.dense_intermediate < 1)
        return moe_jval_error(&root, "dense_intermediate", err,
                              "the model has dense layers (first_dense %d, moe_every %d): give "
                              "their FFN width",
                              t.first_dense, t.moe_every);
    if ((st = mdl_model_validate(&t, root.doc->file, err))) return st;
    *m = t;
    return MOE_OK;
}

enum moe_status mdl_model_load(struct mdl_model *m, const char *file, struct moe_error *err)
{
    struct moe_jdoc doc;
    enum moe_status st = moe_jdoc_load(&doc, file, err);
    if (st != MOE_OK) return st;
    st = mdl_model_from_doc(m, &doc, err);
    moe_jdoc_free(&doc);
    return st;
}

bool mdl_layer_is_moe(const struct mdl_model *m, int layer)
{
    if (layer < m->first_dense) return false;
    int every = m->moe_every > 0 ? m->moe_every : 1;
    return (layer - m->first_dense) % every == every - 1;
}

int mdl_moe_layers_before(const struct mdl_model *m, int layer)
{
    if (layer <= m->first_dense) return 0;
    int every = m->moe_every > 0 ? m->moe_every : 1;
    return (layer - m->first_dense) / every; /* mdl_layer_is_moe's pattern, counted */
}

int mdl_moe_layer_count(const struct mdl_model *m)
{
    return mdl_moe_layers_before(m, m->layers);
}

bool mdl_layer_is_sliding(const struct mdl_model *m, int layer)
{
    int every = m->attn.sliding_every;
    return m->attn.sliding_window > 0 && every > 0 && layer % every != every - 1;
}

bool mdl_layer_has_rope(const struct mdl_model *m, int layer)
{
    int every = m->attn.nope_every;
    return !(every > 0 && layer % every == every - 1);
}

int mdl_layer_chunk(const struct mdl_model *m, int layer)
{
    return mdl_layer_has_rope(m, layer) ? m->attn.chunk_size : 0;
}

double mdl_query_temperature(const struct mdl_model *m, int layer, int position)
{
    const struct mdl_attention *a = &m->attn;
    if (a->temp_floor <= 0 || mdl_layer_has_rope(m, layer)) return 1.0;
    return 1.0 + a->temp_scale * log(floor((position + 1.0) / a->temp_floor) + 1.0);
}

double mdl_yarn_attention_factor(double factor)
{
    return 0.1 * log(factor) + 1.0;
}

/* YaRN's dimension at which a frequency turns `turns` times over the original context. */
static double yarn_dim(double turns, int rot, double theta, int original_max)
{
    return rot * log(original_max / (turns * 6.283185307179586)) / (2.0 * log(theta));
}

void mdl_rope_freqs(const struct mdl_attention *a, int rot, double *inv_freq, double *scale)
{
    int half = rot / 2;
    *scale = 1.0;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(a->rope_theta, -2.0 * i / rot);
    if (a->rope_scaling != MDL_ROPE_YARN) return;
    const struct mdl_yarn *y = &a->yarn;
    double lo = yarn_dim(y->beta_fast, rot, a->rope_theta, y->original_max);
    double hi = yarn_dim(y->beta_slow, rot, a->rope_theta, y->original_max);
    if (y->truncate) lo = floor(lo), hi = ceil(hi);
    lo = fmax(lo, 0.0);
    hi = fmin(hi, rot - 1.0);
    if (hi == lo) hi += 0.001;
    for (int i = 0; i < half; i++) {
        /* ramp 0 below lo (keep the original frequency), 1 above hi (interpolate fully) */
        double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0);
        inv_freq[i] = inv_freq[i] / y->factor * ramp + inv_freq[i] * (1.0 - ramp);
    }
    *scale = y->attention_factor;
}

/* The user's name of one of our keys: `names` holds pairs {ours, theirs, ..., NULL} (a Hugging
 * Face config calls moe_every decoder_sparse_step); a key it does not list keeps our name. */
static const char *key_name(const char *const *names, const char *ours)
{
    for (int i = 0; names && names[i]; i += 2)
        if (!strcmp(names[i], ours)) return names[i + 1];
    return ours;
}

enum moe_status mdl_model_validate_as(const struct mdl_model *m, const char *where,
                                      const char *const *names, struct moe_error *err)
{
    const char *w = where ? where : m->name;
    const struct mdl_attention *a = &m->attn;
    const struct mdl_moe *e = &m->moe;
#define INVALID(...) return moe_error_set_at(err, MOE_ERR_INPUT, w, 0, 0, __VA_ARGS__)
#define K(key) key_name(names, key)
    if (m->layers < 1 || m->hidden < 1 || m->vocab < 1)
        INVALID("%s (%d), %s (%d) and %s (%d) must be positive", K("layers"), m->layers,
                K("hidden"), m->hidden, K("vocab"), m->vocab);
    if (!(m->norm_eps >= 1e-12 && m->norm_eps <= 1.0))
        INVALID("%s = %g: must be in [1e-12, 1]", K("norm_eps"), m->norm_eps);
    if (!(a->rope_theta >= 1.0 && a->rope_theta <= 1e12))
        INVALID("%s = %g: must be in [1, 1e12]", K("rope_theta"), a->rope_theta);
    if (m->max_seq_len < 2)
        INVALID("%s = %d: a sequence of 2 tokens at least", K("max_seq_len"), m->max_seq_len);
    if (m->layers > MDL_MAX_LAYERS)
        INVALID("%s = %d: moeplan takes at most %d", K("layers"), m->layers, MDL_MAX_LAYERS);
    if (m->first_dense < 0 || m->first_dense > m->layers)
        INVALID("%s (%d) must be in [0, %s (%d)]", K("first_dense"), m->first_dense, K("layers"),
                m->layers);
    if (m->moe_every < 1) INVALID("%s (%d) must be at least 1", K("moe_every"), m->moe_every);
    if (a->heads < 1) INVALID("%s (%d) must be at least 1", K("heads"), a->heads);
    if (a->type == MDL_ATTN_GQA) {
        if (a->kv_heads < 1 || a->heads % a->kv_heads != 0)
            INVALID("%s (%d) must be a multiple of %s (%d)", K("heads"), a->heads, K("kv_heads"),
                    a->kv_heads);
        if (a->head_dim < 2 || a->head_dim % 2 != 0)
            INVALID("%s (%d) must be even and positive (RoPE rotates pairs)", K("head_dim"),
                    a->head_dim);
    } else {
        if (a->kv_lora_rank < 1 || a->qk_nope_head_dim < 1 || a->v_head_dim < 1)
            INVALID("MLA needs %s, %s and %s >= 1", K("kv_lora_rank"), K("qk_nope_head_dim"),
                    K("v_head_dim"));
        if (a->qk_rope_head_dim % 2 != 0)
            INVALID("%s (%d) must be even (RoPE rotates pairs)", K("qk_rope_head_dim"),
                    a->qk_rope_head_dim);
    }
    if (a->sliding_window < 0 || (a->sliding_window > 0 && a->sliding_every < 1))
        INVALID("a sliding window (%s) needs %s >= 1", K("sliding_window"), K("sliding_every"));
    if (a->nope_every < 0 || a->chunk_size < 0)
        INVALID("%s and %s must be >= 0", K("nope_every"), K("chunk_size"));
    if (a->type == MDL_ATTN_MLA && a->nope_every)
        INVALID("%s: MLA keeps its RoPE dims on every layer", K("nope_every"));
    if (a->qk_l2_norm && (a->type == MDL_ATTN_MLA || a->qk_norm))
        INVALID("%s: GQA only, and not with %s", K("qk_l2_norm"), K("qk_norm"));
    if (a->temp_floor < 0 || (a->temp_floor > 0 && a->temp_floor < 1))
        INVALID("%s: floor_scale %g must be at least 1 (0: no temperature)", K("nope_temperature"),
                a->temp_floor);
    if (a->temp_floor < 0 || (a->temp_floor > 0 && !a->nope_every))
        INVALID("%s: scales the queries of the blocks without RoPE, needs %s",
                K("nope_temperature"), K("nope_every"));
    if (a->chunk_size && a->sliding_window)
        INVALID("%s with %s: chunked attention and a sliding window together are not modeled",
                K("chunk_size"), K("sliding_window"));
    if (e->experts < 1 || e->top_k < 1 || e->top_k > e->experts)
        INVALID("%s must be in [1, %s]: %d and %d", K("top_k"), K("experts"), e->top_k, e->experts);
    if (e->experts > MDL_MAX_EXPERTS)
        INVALID("%s = %d: moeplan takes at most %d routed experts", K("experts"), e->experts,
                MDL_MAX_EXPERTS);
    if (e->top_k > MDL_MAX_TOP_K)
        INVALID("%s = %d: moeplan routes a token to at most %d experts", K("top_k"), e->top_k,
                MDL_MAX_TOP_K);
    if (e->intermediate < 1)
        INVALID("%s (%d) must be positive", K("intermediate"), e->intermediate);
    if (e->shared_experts < 0 || (e->shared_experts > 0 && e->shared_intermediate < 1))
        INVALID("shared experts (%s) need a positive %s", K("shared_experts"),
                K("shared_intermediate"));
    if (e->n_group < 1 || e->experts % e->n_group != 0)
        INVALID("%s (%d) must be divisible by %s (%d)", K("experts"), e->experts, K("n_group"),
                e->n_group);
    if (e->topk_group < 1 || e->topk_group > e->n_group)
        INVALID("%s (%d) must be in [1, %s (%d)]", K("topk_group"), e->topk_group, K("n_group"),
                e->n_group);
    if (e->top_k > e->topk_group * (e->experts / e->n_group))
        INVALID("%s (%d) exceeds the experts reachable in %s groups (%d)", K("top_k"), e->top_k,
                K("topk_group"), e->topk_group * (e->experts / e->n_group));
    if (!(e->scaling > 0.0)) INVALID("%s must be positive", K("scaling"));
    if (e->activation == MDL_ACT_CLAMPED_SWIGLU &&
        !(e->swiglu_alpha > 0.0 && e->swiglu_limit > 0.0))
        INVALID("the clamped SwiGLU needs positive %s and %s", K("swiglu_alpha"),
                K("swiglu_limit"));
    if (a->rope_scaling == MDL_ROPE_YARN &&
        !(a->yarn.factor >= 1.0 && a->yarn.original_max >= 1 &&
          a->yarn.beta_fast > a->yarn.beta_slow && a->yarn.beta_slow > 0.0 &&
          a->yarn.attention_factor > 0.0))
        INVALID("YaRN RoPE (%s) needs factor >= 1, original_max_position >= 1, beta_fast > "
                "beta_slow > 0 and a positive attention_factor",
                K("rope_scaling"));
    if (m->mtp_layers < 0 || m->mtp_layers > MDL_MAX_MTP)
        INVALID("%s = %d: moeplan takes 0 to %d multi-token prediction layers", K("mtp_layers"),
                m->mtp_layers, MDL_MAX_MTP);
    if (mdl_moe_layer_count(m) == 0)
        INVALID("the model has no MoE layer: moeplan plans MoE models");
    if (mdl_moe_layer_count(m) < m->layers && m->dense_intermediate < 1)
        INVALID("the model has dense layers: %s must be positive", K("dense_intermediate"));
#undef K
#undef INVALID
    return MOE_OK;
}

enum moe_status mdl_model_validate(const struct mdl_model *m, const char *where,
                                   struct moe_error *err)
{
    return mdl_model_validate_as(m, where, NULL, err);
}

enum moe_status mdl_model_resolve(struct mdl_model *m, const char *spec, const char *model_dir,
                                  struct moe_error *err)
{
    char path[MOE_PATH_MAX];
    bool is_path = strchr(spec, '/') || strstr(spec, ".json");
    if (is_path) {
        if ((size_t)snprintf(path, sizeof path, "%s", spec) >= sizeof path)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "the model path has %zu characters, more "
                                 "than the %zu allowed",
                                 strlen(spec), sizeof path - 1);
    } else {
        for (const char *c = spec; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' ||
                  *c == '_'))
                return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a model name or a path",
                                     spec);
        if ((size_t)snprintf(path, sizeof path, "%s/%s.json", model_dir, spec) >= sizeof path)
            return moe_error_set(err, MOE_ERR_INPUT, "model directory path is too long");
        if (!moe_file_is_regular(path))
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "no model named '%s' (looked for %s; `moeplan model list` shows "
                                 "the shipped ones)",
                                 spec, path);
    }
    struct moe_jdoc doc;
    enum moe_status st = moe_jdoc_load(&doc, path, err);
    if (st != MOE_OK) return st;
    struct moe_jval root;
    if ((st = moe_jdoc_root(&doc, &root, err)) == MOE_OK) {
        if (moe_jval_has(&root, "schema"))
            st = mdl_model_from_doc(m, &doc, err);
        else if (moe_jval_has(&root, "model_type"))
            st = mdl_model_from_hf(m, &doc, err);
        else
            st = moe_jval_error(&root, NULL, err,
                                "neither a moeplan model (no \"schema\") nor a Hugging Face "
                                "config.json (no \"model_type\")");
    }
    moe_jdoc_free(&doc);
    return st;
}

enum moe_status mdl_model_override(struct mdl_model *m, const struct mdl_overrides *o,
                                   struct moe_error *err)
{
    struct mdl_model t = *m;
    if (o->layers < 0 || o->experts < 0)
        return moe_error_set(err, MOE_ERR_INPUT, "--layers and --experts must be positive");
    if (o->layers) {
        t.layers = o->layers;
        /* Keep the dense prefix only as long as at least one MoE block remains. */
        if (t.first_dense >= t.layers) t.first_dense = t.layers - 1;
        if (o->layers > MDL_MAX_LAYERS)
            return moe_error_set(err, MOE_ERR_INPUT, "--layers %d: at most %d", o->layers,
                                 MDL_MAX_LAYERS);
    }
    if (o->experts) {
        if (o->experts > MDL_MAX_EXPERTS)
            return moe_error_set(err, MOE_ERR_INPUT, "--experts %d: at most %d", o->experts,
                                 MDL_MAX_EXPERTS);
        if (o->experts < t.moe.top_k)
            return moe_error_set(err, MOE_ERR_INPUT, "--experts %d is fewer than top_k (%d) of %s",
                                 o->experts, t.moe.top_k, t.name);
        if (o->experts % t.moe.n_group != 0)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "--experts %d is not divisible by n_group (%d) of %s", o->experts,
                                 t.moe.n_group, t.name);
        t.moe.experts = o->experts;
    }
    if (o->layers || o->experts) {
        char name[MDL_NAME_MAX];
        snprintf(name, sizeof name, "%s", t.name);
        int n = snprintf(t.name, sizeof t.name, "%s-L%d-E%d", name, t.layers, t.moe.experts);
        if (n < 0 || (size_t)n >= sizeof t.name) t.name[sizeof t.name - 1] = '\0';
    }
    enum moe_status st = mdl_model_validate(&t, t.name, err);
    if (st == MOE_OK) *m = t;
    return st;
}

char *mdl_model_to_json_text(const struct mdl_model *m)
{
    const struct mdl_attention *a = &m->attn;
    const struct mdl_moe *e = &m->moe;
    json_t *root = json_object(), *at = json_object(), *mo = json_object();
    if (!root || !at || !mo) {
        json_decref(root);
        json_decref(at);
        json_decref(mo);
        return NULL;
    }
    json_object_set_new(root, "schema", json_string(MDL_SCHEMA));
    json_object_set_new(root, "version", json_integer(MDL_SCHEMA_VERSION));
    json_object_set_new(root, "name", json_string(m->name));
    json_object_set_new(root, "layers", json_integer(m->layers));
    json_object_set_new(root, "first_dense", json_integer(m->first_dense));
    json_object_set_new(root, "moe_every", json_integer(m->moe_every));
    json_object_set_new(root, "hidden", json_integer(m->hidden));
    json_object_set_new(root, "vocab", json_integer(m->vocab));
    json_object_set_new(root, "tied_embeddings", json_boolean(m->tied_embeddings));
    json_object_set_new(root, "norm_eps", json_real(m->norm_eps));
    json_object_set_new(root, "max_seq_len", json_integer(m->max_seq_len));
    json_object_set_new(at, "type", json_string(attn_names[a->type]));
    json_object_set_new(at, "heads", json_integer(a->heads));
    json_object_set_new(at, "kv_heads", json_integer(a->kv_heads));
    if (a->type == MDL_ATTN_GQA) {
        json_object_set_new(at, "head_dim", json_integer(a->head_dim));
    } else {
        json_object_set_new(at, "q_lora_rank", json_integer(a->q_lora_rank));
        json_object_set_new(at, "kv_lora_rank", json_integer(a->kv_lora_rank));
        json_object_set_new(at, "qk_nope_head_dim", json_integer(a->qk_nope_head_dim));
        json_object_set_new(at, "qk_rope_head_dim", json_integer(a->qk_rope_head_dim));
        json_object_set_new(at, "v_head_dim", json_integer(a->v_head_dim));
    }
    json_object_set_new(at, "qk_norm", json_boolean(a->qk_norm));
    json_object_set_new(at, "bias", json_boolean(a->bias));
    json_object_set_new(at, "sinks", json_boolean(a->sinks));
    json_object_set_new(at, "sliding_window", json_integer(a->sliding_window));
    json_object_set_new(at, "sliding_every", json_integer(a->sliding_every));
    if (a->nope_every) json_object_set_new(at, "nope_every", json_integer(a->nope_every));
    if (a->chunk_size) json_object_set_new(at, "chunk_size", json_integer(a->chunk_size));
    if (a->qk_l2_norm) json_object_set_new(at, "qk_l2_norm", json_true());
    if (a->temp_floor > 0)
        json_object_set_new(
            at, "nope_temperature",
            json_pack("{s:f, s:f}", "floor_scale", a->temp_floor, "scale", a->temp_scale));
    json_object_set_new(at, "rope_theta", json_real(a->rope_theta));
    if (a->rope_scaling == MDL_ROPE_YARN) {
        const struct mdl_yarn *y = &a->yarn;
        json_t *rs = json_object();
        json_object_set_new(rs, "type", json_string(rope_names[a->rope_scaling]));
        json_object_set_new(rs, "factor", json_real(y->factor));
        json_object_set_new(rs, "original_max_position", json_integer(y->original_max));
        json_object_set_new(rs, "beta_fast", json_real(y->beta_fast));
        json_object_set_new(rs, "beta_slow", json_real(y->beta_slow));
        json_object_set_new(rs, "truncate", json_boolean(y->truncate));
        if (y->attention_factor !=
            mdl_yarn_attention_factor(y->factor)) /* the default stays exact */
            json_object_set_new(rs, "attention_factor", json_real(y->attention_factor));
        json_object_set_new(at, "rope_scaling", rs);
    }
    json_object_set_new(root, "attention", at);
    json_object_set_new(root, "dense_intermediate", json_integer(m->dense_intermediate));
    json_object_set_new(mo, "experts", json_integer(e->experts));
    json_object_set_new(mo, "shared_experts", json_integer(e->shared_experts));
    json_object_set_new(mo, "top_k", json_integer(e->top_k));
    json_object_set_new(mo, "intermediate", json_integer(e->intermediate));
    json_object_set_new(mo, "shared_intermediate", json_integer(e->shared_intermediate));
    json_object_set_new(mo, "scoring", json_string(scoring_names[e->scoring]));
    json_object_set_new(mo, "n_group", json_integer(e->n_group));
    json_object_set_new(mo, "topk_group", json_integer(e->topk_group));
    json_object_set_new(mo, "norm_topk", json_boolean(e->norm_topk));
    json_object_set_new(mo, "scaling", json_real(e->scaling));
    json_object_set_new(mo, "expert_bias", json_boolean(e->expert_bias));
    if (e->probs_on_input) json_object_set_new(mo, "probs_on_input", json_true());
    json_object_set_new(mo, "softmax_after_topk", json_boolean(e->softmax_after_topk));
    if (e->activation == MDL_ACT_CLAMPED_SWIGLU) {
        json_object_set_new(mo, "activation", json_string(act_names[e->activation]));
        json_object_set_new(mo, "swiglu_alpha", json_real(e->swiglu_alpha));
        json_object_set_new(mo, "swiglu_limit", json_real(e->swiglu_limit));
    }
    json_object_set_new(root, "moe", mo);
    json_object_set_new(root, "mtp_layers", json_integer(m->mtp_layers));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
    json_decref(root);
    return text;
}
