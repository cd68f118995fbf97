/*
 * counts.c: parameters, model FLOPs and activation bytes, by component.
 *
 * Everything the planner knows about a model's size comes from here, so each formula is written
 * once, per block, and the whole-model numbers are sums over blocks. The conventions are the
 * usual ones (docs/DESIGN.md): FLOPs count matrix multiplies only (2 per multiply-add), backward is
 * twice forward, core attention counts the causal half; the input embedding is a lookup.
 */
#include "mdl.h"

#include <math.h>
#include <string.h>

const char *const mdl_component_names[MDL_NCOMPONENTS] = {
    "embedding",      "attn_proj",      "attn_core", "norms",  "router",
    "routed_experts", "shared_experts", "dense_ffn", "lm_head"};

/* Weights that take part in matrix multiplies of the attention projections. */
static double attn_proj_matmul_params(const struct mdl_model *m)
{
    const struct mdl_attention *a = &m->attn;
    double h = m->hidden, H = a->heads;
    if (a->type == MDL_ATTN_GQA) {
        double hd = a->head_dim, kv = a->kv_heads;
        return h * H * hd + 2.0 * h * kv * hd + H * hd * h;
    }
    double qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
    double p = 0.0;
    if (a->q_lora_rank)
        p += h * a->q_lora_rank + (double)a->q_lora_rank * H * qk;
    else
        p += h * H * qk;
    p += h * (a->kv_lora_rank + a->qk_rope_head_dim); /* kv_a (with rope key) */
    p += (double)a->kv_lora_rank * H * (a->qk_nope_head_dim + a->v_head_dim); /* kv_b */
    p += H * a->v_head_dim * h;                                               /* o */
    return p;
}

/* Biases and sinks: parameters of the attention that are not matrix weights. */
static double attn_proj_other_params(const struct mdl_model *m)
{
    const struct mdl_attention *a = &m->attn;
    double p = 0.0;
    if (a->bias && a->type == MDL_ATTN_GQA)
        p += (double)a->heads * a->head_dim + 2.0 * a->kv_heads * a->head_dim + m->hidden;
    if (a->sinks) p += a->heads;
    return p;
}

static double block_norm_params(const struct mdl_model *m)
{
    const struct mdl_attention *a = &m->attn;
    double p = 2.0 * m->hidden; /* before attention and before the FFN */
    if (a->qk_norm) p += 2.0 * (a->type == MDL_ATTN_GQA ? a->head_dim : a->qk_nope_head_dim);
    if (a->type == MDL_ATTN_MLA) p += a->q_lora_rank + a->kv_lora_rank;
    return p;
}

static double one_expert_params(const struct mdl_model *m)
{
    double h = m->hidden, f = m->moe.intermediate;
    return 3.0 * h * f + (m->moe.expert_bias ? 2.0 * f + h : 0.0);
}

void mdl_block_params(const struct mdl_model *m, int layer, struct mdl_block_params *out)
{
    memset(out, 0, sizeof *out);
    double h = m->hidden;
    out->params[MDL_ATTN_PROJ] = attn_proj_matmul_params(m) + attn_proj_other_params(m);
    out->params[MDL_NORMS] = block_norm_params(m);
    if (mdl_layer_is_moe(m, layer)) {
        const struct mdl_moe *e = &m->moe;
        out->one_expert = one_expert_params(m);
        out->params[MDL_ROUTER] = h * e->experts + (e->expert_bias ? e->experts : 0);
        out->params[MDL_ROUTED] = e->experts * out->one_expert;
        out->params[MDL_SHARED] = e->shared_experts * 3.0 * h * e->shared_intermediate;
    } else {
        out->params[MDL_DENSE_FFN] = 3.0 * h * m->dense_intermediate;
    }
    memcpy(out->active, out->params, sizeof out->active);
    out->active[MDL_ROUTED] = m->moe.top_k * out->one_expert; /* 0 in a dense block */
}

void mdl_params_count(const struct mdl_model *m, struct mdl_params *out)
{
    memset(out, 0, sizeof *out);
    double table = (double)m->vocab * m->hidden;
    double routed_inactive = 0.0;
    for (int l = 0; l < m->layers; l++) {
        struct mdl_block_params b;
        mdl_block_params(m, l, &b);
        for (int c = 0; c < MDL_NCOMPONENTS; c++) out->by_component[c] += b.params[c];
        routed_inactive += b.params[MDL_ROUTED] - b.active[MDL_ROUTED];
    }
    out->by_component[MDL_EMBED] = table;
    out->by_component[MDL_LM_HEAD] = m->tied_embeddings ? 0.0 : table;
    out->by_component[MDL_NORMS] += m->hidden; /* final norm */
    for (int c = 0; c < MDL_NCOMPONENTS; c++) out->total += out->by_component[c];
    out->active = out->total - routed_inactive;
    /* A tied table is still read by the LM head, so only an untied input table drops out. */
    out->active_no_embed = out->active - (m->tied_embeddings ? 0.0 : table);
    if (m->mtp_layers) {
        /* DeepSeek's MTP module: two norms, a (2h -> h) projection, one MoE block and a final
         * norm; it shares the embedding and the head with the main model. */
        struct mdl_block_params b;
        mdl_block_params(m, m->layers - 1, &b);
        double block = 0.0;
        for (int c = 0; c < MDL_NCOMPONENTS; c++) block += b.params[c];
        double h = m->hidden;
        out->mtp = m->mtp_layers * (block + 2.0 * h + 2.0 * h * h + h);
    }
}

double mdl_attended_keys(double seq, double window)
{
    if (window > 0 && seq > window) return window - window * window / (2.0 * seq);
    return seq / 2.0;
}

static double attended_keys(const struct mdl_model *m, int layer, int seq_len)
{
    int chunk = mdl_layer_chunk(m, layer); /* a chunk's causal half, on every chunk */
    if (chunk && chunk < seq_len) return mdl_attended_keys(chunk, 0.0);
    return mdl_attended_keys(seq_len,
                             mdl_layer_is_sliding(m, layer) ? m->attn.sliding_window : 0.0);
}

void mdl_block_flops_fwd(const struct mdl_model *m, int layer, int seq_len,
                         double out[MDL_NCOMPONENTS])
{
    for (int c = 0; c < MDL_NCOMPONENTS; c++) out[c] = 0.0;
    const struct mdl_attention *a = &m->attn;
    double h = m->hidden;
    out[MDL_ATTN_PROJ] = 2.0 * attn_proj_matmul_params(m);
    double qk = a->type == MDL_ATTN_GQA ? a->head_dim : a->qk_nope_head_dim + a->qk_rope_head_dim;
    double v = a->type == MDL_ATTN_GQA ? a->head_dim : a->v_head_dim;
    out[MDL_ATTN_CORE] = 2.0 * a->heads * (qk + v) * attended_keys(m, layer, seq_len);
    if (mdl_layer_is_moe(m, layer)) {
        const struct mdl_moe *e = &m->moe;
        out[MDL_ROUTER] = 2.0 * h * e->experts;
        out[MDL_ROUTED] = e->top_k * 2.0 * 3.0 * h * e->intermediate;
        out[MDL_SHARED] = e->shared_experts * 2.0 * 3.0 * h * e->shared_intermediate;
    } else {
        out[MDL_DENSE_FFN] = 2.0 * 3.0 * h * m->dense_intermediate;
    }
}

void mdl_flops_per_token(const struct mdl_model *m, int seq_len, struct mdl_flops *out)
{
    memset(out, 0, sizeof *out);
    for (int l = 0; l < m->layers; l++) {
        double b[MDL_NCOMPONENTS];
        mdl_block_flops_fwd(m, l, seq_len, b);
        for (int c = 0; c < MDL_NCOMPONENTS; c++) out->fwd[c] += b[c];
    }
    out->fwd[MDL_LM_HEAD] = 2.0 * m->hidden * (double)m->vocab;
    for (int c = 0; c < MDL_NCOMPONENTS; c++) out->fwd_total += out->fwd[c];
    out->bwd_total = 2.0 * out->fwd_total;
    out->train_total = out->fwd_total + out->bwd_total;
}

double mdl_flops_megatron(const struct mdl_model *m, int seq_len, int mtp)
{
    double h = m->hidden, fwd = 0.0, b[MDL_NCOMPONENTS];
    for (int l = 0; l < m->layers + mtp; l++) {
        mdl_block_flops_fwd(m, l < m->layers ? l : m->layers - 1, seq_len, b);
        for (int c = 0; c < MDL_NCOMPONENTS; c++)
            if (c != MDL_ROUTER) fwd += b[c];
    }
    double vocab = ceil(m->vocab / 128.0) * 128.0;
    fwd += (1.0 + mtp) * 2.0 * h * vocab; /* the LM head, once more for each MTP layer */
    fwd += mtp * 2.0 * (2.0 * h) * h;     /* each MTP layer's projection */
    return 3.0 * fwd;
}

void mdl_block_activations(const struct mdl_model *m, int layer, struct mdl_activations *out)
{
    memset(out, 0, sizeof *out);
    const struct mdl_attention *a = &m->attn;
    double h = m->hidden, H = a->heads;
    const double bf16 = 2.0, fp32 = 4.0;
    /* Inputs of the two block norms, and their fp32 reciprocal RMS. */
    out->bytes[MDL_NORMS] = 2.0 * (bf16 * h + fp32);
    double proj = bf16 * h; /* the normed input of the first projection */
    if (a->type == MDL_ATTN_GQA) {
        double q = H * a->head_dim, kv = (double)a->kv_heads * a->head_dim;
        proj += bf16 * (q + 2.0 * kv) + bf16 * q; /* q, k, v after RoPE; attention output */
        if (a->qk_norm) proj += bf16 * (q + kv);  /* q and k before their norm */
    } else {
        double qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
        if (a->q_lora_rank) proj += 2.0 * bf16 * a->q_lora_rank; /* q_a out, normed */
        proj += bf16 * (a->kv_lora_rank + a->qk_rope_head_dim) + bf16 * a->kv_lora_rank;
        proj += bf16 * H * (2.0 * qk + a->v_head_dim); /* q, k, v */
        proj += bf16 * H * a->v_head_dim;              /* attention output */
    }
    out->bytes[MDL_ATTN_PROJ] = proj;
    out->bytes[MDL_ATTN_CORE] = fp32 * H; /* softmax log-sum-exp per head */
    if (mdl_layer_is_moe(m, layer)) {
        const struct mdl_moe *e = &m->moe;
        double f = e->intermediate;
        out->bytes[MDL_ROUTER] = bf16 * h + fp32 * e->experts + e->top_k * (4.0 + fp32);
        /* Per routed copy: permuted input, gate and up outputs, SwiGLU output, expert output
         * (kept for the gradient of the routing weight). */
        out->bytes[MDL_ROUTED] = e->top_k * (bf16 * h + 2.0 * bf16 * f + bf16 * f + bf16 * h);
        out->bytes[MDL_SHARED] = e->shared_experts * 3.0 * bf16 * e->shared_intermediate;
    } else {
        out->bytes[MDL_DENSE_FFN] = bf16 * h + 3.0 * bf16 * m->dense_intermediate;
    }
    for (int c = 0; c < MDL_NCOMPONENTS; c++) out->total += out->bytes[c];
}
