/*
 * cost_memory.c: what one GPU holds for a layout: weights, gradients and optimizer state as the
 * parallel degrees and the ZeRO stage shard them, the activations of the micro-batches a pipeline
 * rank holds for its backward (module by module, less what the layout recomputes), the dispatch
 * buffers, and what CUDA, NCCL and cuBLAS reserve.
 */
#include "cost_internal.h"

#include <string.h>

#define RESERVED_BYTES (2.5 * 1073741824.0) /* CUDA context, NCCL, cuBLAS workspace */

double cost_act_elem_bytes(const struct cost_layout *l)
{
    return cost_precision_elem_bytes(l->precision);
}

/* Activation bytes one GPU keeps for one micro-batch of this block, module by module as
 * Megatron-Core keeps them (TE layers, flash attention, sequence parallelism with TP: every
 * tensor split over tp), less what the layout recomputes. Per token:
 *   norms: each block norm's input (bf16) and 1/rms; its output, the next GEMM's input, unless
 *     `layernorm` is recomputed;
 *   attention: the projections' inputs; flash attention's q, k, v, output and log-sum-exp; MLA
 *     also its compressed q and kv and their norms (`mla_up_proj` drops q, k, v: recomputed from
 *     the compressed ones; `core_attn` drops the output);
 *   MoE: the router's logits and scores, and per routed copy the first GEMM's input, its output
 *     (the activation's input) and the activation's output (`moe_act` drops the last; `moe` keeps
 *     only the layer's input); shared experts and dense FFNs alike (`shared_experts`, `mlp`).
 * Full recompute keeps only the block's input, and on the host what act_offload names. The
 * inputs of the modules Megatron can offload
 * (--offload-modules) are counted apart, in off[]: what act_offload names goes to the host (per
 * token, in bytes). Returns the bytes per token the GPU keeps. */
static double block_bytes_per_token(const struct cost_ctx *c, const struct cost_layout *l,
                                    int layer, double hot_ratio, bool full,
                                    double off[COST_OFF_NMODULES])
{
    const struct mdl_model *m = &c->model;
    const struct mdl_attention *a = &m->attn;
    double h = m->hidden, H = a->heads, lin = cost_act_elem_bytes(l);
    unsigned rc = cost_layout_rc(l);
    bool rc_norm = rc & COST_RC_BIT(COST_RC_LAYERNORM);
    for (int i = 0; i < COST_OFF_NMODULES; i++) off[i] = 0.0;
    /* the two norms: input and 1/rms kept; output kept as a GEMM input unless recomputed */
    double norms = 2.0 * 4.0;
    off[COST_OFF_ATTN_NORM] = off[COST_OFF_MLP_NORM] = BF16 * h;
    off[COST_OFF_QKV_LINEAR] = rc_norm ? 0.0 : lin * h;
    norms += rc_norm ? 0.0 : lin * h; /* the FFN norm's output: the router's and experts' input */
    double attn = 0.0;
    if (a->type == MDL_ATTN_GQA) {
        double q = H * a->head_dim, kv = (double)a->kv_heads * a->head_dim;
        off[COST_OFF_CORE_ATTN] = BF16 * (q + 2.0 * kv);          /* q, k, v after RoPE (flash) */
        if (a->qk_norm || a->qk_l2_norm) attn += BF16 * (q + kv); /* q, k before their norms */
        if (!(rc & COST_RC_BIT(COST_RC_CORE_ATTN))) /* the output, and the projection's input */
            off[COST_OFF_ATTN_PROJ] = BF16 * q + (lin < BF16 ? lin * q : 0.0);
    } else {
        double qk = a->qk_nope_head_dim + a->qk_rope_head_dim, dv = a->v_head_dim;
        if (a->q_lora_rank) attn += a->q_lora_rank * (BF16 + 4.0 / a->q_lora_rank + lin);
        attn += a->kv_lora_rank * (BF16 + lin) + BF16 * a->qk_rope_head_dim;
        if (!(rc & COST_RC_BIT(COST_RC_MLA_UP_PROJ)))
            off[COST_OFF_CORE_ATTN] = BF16 * H * (2.0 * qk + dv);
        if (!(rc & COST_RC_BIT(COST_RC_CORE_ATTN)))
            off[COST_OFF_ATTN_PROJ] = BF16 * H * dv + (lin < BF16 ? lin * H * dv : 0.0);
    }
    attn += 4.0 * H; /* log-sum-exp per head */
    double ffn = 0.0;
    if (mdl_layer_is_moe(m, layer)) {
        const struct mdl_moe *e = &m->moe;
        double f = (double)e->intermediate / l->etp, k = e->top_k * hot_ratio * l->etp;
        if (!(rc & COST_RC_BIT(COST_RC_MOE))) { /* else only the layer's input, counted above */
            ffn += 8.0 * e->experts + 8.0 * e->top_k;   /* logits, scores, choices */
            off[COST_OFF_EXPERT_FC1] = k * lin * h;     /* GEMM 1 input */
            off[COST_OFF_MOE_ACT] = k * BF16 * 2.0 * f; /* GEMM 1 output */
            if (!(rc & COST_RC_BIT(COST_RC_MOE_ACT))) ffn += k * lin * f; /* activation output */
        }
        if (e->shared_experts && !(rc & COST_RC_BIT(COST_RC_SHARED_EXPERTS))) {
            double fs = (double)e->shared_experts * e->shared_intermediate;
            ffn += BF16 * 2.0 * fs + lin * fs;
        }
    } else if (!(rc & COST_RC_BIT(COST_RC_MLP))) {
        double f = m->dense_intermediate;
        ffn += BF16 * 2.0 * f + lin * f;
    }
    double kept = norms + attn + ffn;
    for (int i = 0; i < COST_OFF_NMODULES; i++)
        if (!(l->act_offload & COST_RC_BIT(i))) kept += off[i];
    if (!full) return kept;
    /* Full recompute keeps the block's input alone (the attention norm's) on the GPU; what
     * act_offload names besides it is kept on the host (MaxText's custom remat policy: 'device'
     * for the layer's input, 'offload' for the named tensors, 'remat' for the rest), and only
     * that travels. */
    for (int i = COST_OFF_QKV_LINEAR; i < COST_OFF_NMODULES; i++)
        if (!(l->act_offload & COST_RC_BIT(i))) off[i] = 0.0;
    return l->act_offload & COST_RC_BIT(COST_OFF_ATTN_NORM) ? 0.0 : BF16 * h;
}

static double block_activation_bytes(const struct cost_ctx *c, const struct cost_layout *l,
                                     int layer, double hot_ratio, bool full)
{
    double off[COST_OFF_NMODULES];
    return cost_layout_tokens(l) * block_bytes_per_token(c, l, layer, hot_ratio, full, off);
}

void cost_offload_bytes(const struct cost_ctx *c, const struct cost_layout *l, int layer,
                        double hot_ratio, bool full, double *attn_bytes, double *ffn_bytes)
{
    double off[COST_OFF_NMODULES], T = cost_layout_tokens(l);
    block_bytes_per_token(c, l, layer, hot_ratio, full, off);
    *attn_bytes = *ffn_bytes = 0.0;
    for (int i = 0; i < COST_OFF_NMODULES; i++)
        if (l->act_offload & COST_RC_BIT(i))
            *(i < COST_OFF_MLP_NORM ? attn_bytes : ffn_bytes) += T * off[i];
}

void cost_stage_blocks(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, int n[2][2])
{
    const struct mdl_model *m = &c->model;
    int first = sg->first, count = sg->count, mtp = sg->mtp ? l->mtp : 0;
    int before = mdl_moe_layers_before(m, first);
    int moe = mdl_moe_layers_before(m, first + count) - before;
    int last = mdl_layer_is_moe(m, m->layers - 1);
    int kind_n[2] = {count - moe, moe};
    kind_n[last] += mtp;
    /* the blocks recomputed whole: all of them under full recompute, or the first
     * recompute_layers of the stage (Megatron's --recompute-method block), its MTP layers last */
    int whole = l->recompute != COST_RECOMPUTE_FULL                            ? 0
                : l->recompute_layers > 0 && l->recompute_layers < count + mtp ? l->recompute_layers
                                                                               : count + mtp;
    int w[2] = {0, 0};
    if (whole <= count) {
        w[1] = mdl_moe_layers_before(m, first + whole) - before;
        w[0] = whole - w[1];
    } else {
        w[1] = moe, w[0] = count - moe;
        w[last] += whole - count;
    }
    for (int k = 0; k < 2; k++) {
        n[k][1] = w[k];
        n[k][0] = kind_n[k] - w[k];
    }
}

void cost_stage_memory(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, double hot_ratio, struct cost_stage_memory *s)
{
    const struct mdl_model *m = &c->model;
    int first = sg->first, count = sg->count, mtp = sg->mtp ? l->mtp : 0;
    memset(s, 0, sizeof *s);
    /* A block's parameters and activations depend on its layer only through whether it is MoE:
     * the stage is so many MoE and dense blocks (its MTP layers blocks like the last layer), each
     * kind costed once (a stage of a thousand layers costs two blocks, not a thousand). */
    int nb[2][2];
    cost_stage_blocks(c, l, sg, nb);
    int moe = nb[1][0] + nb[1][1];
    int n[2] = {nb[0][0] + nb[0][1], moe};
    for (int kind = 0; kind < 2; kind++) {
        if (!n[kind]) continue;
        int i = first; /* a layer of the kind (the pattern repeats within moe_every layers) */
        while (i < first + count && (int)mdl_layer_is_moe(m, i) != kind) i++;
        if (i == first + count) i = m->layers - 1; /* only its MTP layers are of the kind */
        struct mdl_block_params bp;
        mdl_block_params(m, i, &bp);
        double dense = 0.0;
        for (int k = 0; k < MDL_NCOMPONENTS; k++)
            if (k != MDL_ROUTED) dense += bp.params[k];
        s->expert_params += n[kind] * bp.params[MDL_ROUTED];
        s->dense_params += n[kind] * dense;
        double hr = kind ? hot_ratio : 1.0;
        for (int w = 0; w < 2; w++)
            if (nb[kind][w]) s->act_bytes += nb[kind][w] * block_activation_bytes(c, l, i, hr, w);
    }
    s->moe_layers = moe;
    double T = cost_layout_tokens(l), M = T * l->tp, V = (double)m->vocab / l->tp;
    double h = m->hidden;
    if (sg->embed) s->embed_params += (double)m->vocab * h;
    if (sg->loss && (!m->tied_embeddings || !sg->embed)) s->embed_params += (double)m->vocab * h;
    s->dense_params += s->embed_params;
    if (sg->loss) {
        s->dense_params += h;                       /* final norm */
        s->act_bytes += (1.0 + mtp) * M * V * BF16; /* logits kept for the loss backward */
        s->act_bytes +=
            T * h * cost_act_elem_bytes(l); /* the final norm's output, the head's input */
    }
    /* each MTP layer: its projection of [embedding, hidden] (2h -> h) and two norms, and that
     * projection's input */
    s->dense_params += mtp * (2.0 * h * h + 2.0 * h);
    s->act_bytes += mtp * T * 2.0 * h * (BF16 + cost_act_elem_bytes(l));
}

/* Micro-batch chunks a pipeline rank holds for backward at most: its warm-up forwards plus the
 * one in flight (what the simulation counts; tests check the two agree). */
static int in_flight(int pp, int vpp, int mb, int rank)
{
    int warm = vpp == 1 ? pp - rank - 1 : (pp - rank - 1) * 2 + (vpp - 1) * pp;
    long long n = warm + 1, total = (long long)mb * vpp; /* mb reaches 2^28 */
    return (int)(n < total ? n : total);
}

/* Memory of each pp rank; the fullest sets the answer. */
void cost_memory_of(const struct cost_ctx *c, const struct cost_layout *l,
                    const struct cost_stage_memory *sm, struct cost_result *r)
{
    const struct mdl_model *m = &c->model;
    int pp = l->pp, vpp = l->vpp, stages = pp * vpp, mb = cost_layout_micro_batches(l);
    int edp = cost_layout_edp(l), ddp = l->dp * l->cp; /* dense state sharded over dp x cp */
    double T = cost_layout_tokens(l), h = m->hidden, worst = -1.0;
    for (int s = 0; s < pp; s++) {
        double dense = 0, expert = 0, act = 0, disp = 0, embed = 0;
        int held = in_flight(pp, vpp, mb, s);
        for (int v = s; v < stages; v += pp) {
            dense += sm[v].dense_params;
            embed += sm[v].embed_params / l->tp;
            expert += sm[v].expert_params / (l->ep * l->etp);
            /* the chunks in flight, spread over this rank's chunks */
            act += sm[v].act_bytes * (double)held / vpp;
            if (sm[v].moe_layers) {
                double rows = T * m->moe.top_k * l->etp;
                disp = (c->dispatch_buffer_factor + 1.0) * rows * h * BF16 * 2.0;
            }
        }
        double mem[COST_NMEM] = {0};
        double dense_gpu = dense / l->tp; /* TP splits the dense parameters */
        double w_d = l->zero >= 3 ? ddp : 1, w_e = l->zero >= 3 ? edp : 1;
        double g_d = l->zero >= 2 ? ddp : 1, g_e = l->zero >= 2 ? edp : 1;
        double o_d = l->zero >= 1 ? ddp : 1, o_e = l->zero >= 1 ? edp : 1;
        /* bf16 weights, and with fp8 recipes the fp8 copy of each GEMM weight (the embedding
         * and the head stay bf16) that the GEMMs read, the only copy with fp8_params; gradients
         * in fp32 or bf16; the optimizer's fp32 master weights and two moments (fp32, or bf16
         * with moments=bf16) */
        double fp8_copy = l->precision == COST_BF16 ? 0.0 : cost_act_elem_bytes(l);
        double gemm_b = l->fp8_params ? fp8_copy : BF16 + fp8_copy; /* a GEMM weight's bytes */
        double grad_b = l->grad_reduce_bf16 ? BF16 : 4.0, opt_b = l->moments_bf16 ? 8.0 : 12.0;
        mem[COST_MEM_WEIGHTS] =
            gemm_b * (dense_gpu / w_d + expert / w_e) + (BF16 - gemm_b) * embed / w_d;
        mem[COST_MEM_GRADS] = grad_b * (dense_gpu / g_d + expert / g_e);
        /* the share `offload` of the optimizer state lives in host memory */
        mem[COST_MEM_OPTIMIZER] = opt_b * (dense_gpu / o_d + expert / o_e) * (1.0 - l->offload);
        mem[COST_MEM_ACTIVATIONS] = act;
        mem[COST_MEM_DISPATCH] = disp;
        mem[COST_MEM_RESERVED] = RESERVED_BYTES;
        double total = 0;
        for (int k = 0; k < COST_NMEM; k++) total += mem[k];
        if (total > worst) {
            worst = total;
            memcpy(r->memory_bytes, mem, sizeof mem);
        }
    }
    r->memory_total_bytes = worst;
    r->memory_capacity_bytes = c->cluster.gpu.hbm_bytes * (1.0 - c->memory_headroom);
    r->fits = r->memory_total_bytes <= r->memory_capacity_bytes;
    if (!r->fits) {
        char need[32], have[32];
        moe_format_bytes(r->memory_total_bytes, need, sizeof need);
        moe_format_bytes(r->memory_capacity_bytes, have, sizeof have);
        snprintf(r->reason, sizeof r->reason, "needs %s per GPU, %s available (%.0f%% headroom)",
                 need, have, 100 * c->memory_headroom);
    }
}
