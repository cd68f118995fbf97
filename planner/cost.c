/*
 * cost.c: one training step of a model on a cluster under a parallel layout: time per phase,
 * exposed communication, the pipeline bubble, memory per GPU.
 *
 * How the step is built (everything per GPU, per micro-batch, then scheduled):
 *   - Each block is costed by phase: GEMMs by shape through cost_gemm_us (roofline with wave
 *     quantization and small-M/K penalties, so small experts cost more per FLOP), core attention at
 *     a flash-attention efficiency, memory-bound kernels (norms, permute, router top-k, SwiGLU,
 *     optimizer) at HBM bandwidth, plus a launch overhead per kernel.
 *   - Expert GEMMs run on the hottest EP rank's rows: routing probabilities and the placement give
 *     every rank's load, and the step waits for the slowest.
 *   - Communication is alpha-beta per tier: NVLink inside a domain, the scale-out fabric across.
 *     Dispatch/combine bytes come from the routing, the placement and the dedup mode; TP
 *     all-gather/reduce-scatter are exposed; with overlap on, EP all-to-all hides behind another
 *     micro-batch's attention and shared expert up to overlap_max; the DP gradient reduce-scatter
 *     hides behind the last backward.
 *   - Stage times go to the event-driven pipeline simulator (1F1B or interleaved), which gives the
 *     makespan, the bubble and the in-flight micro-batches that set activation memory.
 * Tokens per GPU: each CP rank holds seq/cp of a sequence, and sequence parallelism comes with TP
 * (each TP rank holds 1/tp of those between its GEMMs): cost_layout_tokens.
 */
#include "cost_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const cost_phase_names[COST_NPHASES] = {
    "embed",         "attn_fwd",    "attn_bwd",    "router",  "permute",
    "dispatch",      "experts_fwd", "experts_bwd", "combine", "unpermute",
    "shared_expert", "dense_ffn",   "lm_head",     "loss",    "tp_comm",
    "dp_grad_sync",  "pp_p2p",      "optimizer",   "bubble",  "step"};
const char *const cost_mem_names[COST_NMEM] = {
    "weights", "grads", "optimizer", "activations", "dispatch_buffers", "reserved"};

/* ---------------------------------------------------------------------------------------------- */
/* Primitives                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

static double membound_us(const struct cost_ctx *c, double bytes, int kernels)
{
    return bytes / (c->cluster.gpu.hbm_bytes_per_s * c->cal.hbm_eff) * 1e6 +
           kernels * c->cal.launch_us;
}

/* A group of `n` ranks spaced `stride` GPUs apart: inside one NVLink domain or across. */
static void group_link(const struct cost_ctx *c, int n, int stride, double *bw, double *lat)
{
    const struct topo_cluster *t = &c->cluster;
    bool inside = (long)n * stride <= t->gpus_used_per_domain;
    if (inside) {
        *bw = t->nvlink_bytes_per_s * c->cal.nvlink_allreduce_eff;
        *lat = t->nvlink_latency_us;
    } else {
        *bw = t->scale_out_bytes_per_s * c->cal.scale_out_eff / t->oversubscription;
        *lat = t->scale_out_latency_us;
    }
    if (*bw <= 0) *bw = 1e9; /* a domain of one GPU: nothing crosses */
}

/* The same group's ring collectives (all-gather, reduce-scatter, all-reduce: data parallelism's
 * gradients and parameters). A ring over several domains crosses out of each once per ring, and
 * NCCL runs one ring per channel, each crossing through a different member's NIC: with m
 * members in a domain the crossings share m NICs, not one (nccl-tests' multi-node bus bandwidth
 * is about a node's NICs together, within its NVLink rate). One member a domain (DP ranks a node
 * apart): the one NIC, as before. */
static void collective_link(const struct cost_ctx *c, int n, int stride, double *bw, double *lat)
{
    group_link(c, n, stride, bw, lat);
    const struct topo_cluster *t = &c->cluster;
    if ((long)n * stride <= t->gpus_used_per_domain || stride >= t->gpus_used_per_domain) return;
    int m = t->gpus_used_per_domain / stride; /* the group's members in one domain */
    double nv = t->nvlink_bytes_per_s * c->cal.nvlink_allreduce_eff;
    *bw *= m < n ? m : n;
    if (nv > 0) *bw = fmin(*bw, nv);
}

/* ---------------------------------------------------------------------------------------------- */
/* Blocks                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

/* One block's cost for one micro-batch on one GPU: phase compute (fwd and bwd), communication,
 * and the overlap window. */
struct block_cost {
    double fwd[COST_NPHASES], bwd[COST_NPHASES]; /* compute */
    double comm_fwd[COST_NPHASES], comm_bwd[COST_NPHASES];
    double recompute[COST_NPHASES]; /* forward work redone in backward, by the phase it repeats */
    double whole[COST_NPHASES];     /* full recompute's redo (compute and communication), charged
                                 * to the backward of the blocks it recomputes */
    double expert_act_us;           /* the routed experts' activation pass on the hottest rank */
    double dispatch_bytes, nodedup_bytes, scale_bytes; /* per a2a, sent by this GPU */
    double hot_ratio;
    int local_experts; /* routed experts with rows on the hottest rank (MoE blocks) */
};

/* fp8 recipes quantize every GEMM input and every output gradient (cost_quantize_us); a GEMM's
 * time through gemm_q counts the elements it quantizes, and its time as a gradient GEMM (the
 * backward runs two of its shape: data and weight gradient). */
struct quant {
    double in, out; /* elements of the GEMMs' inputs and of their outputs' gradients */
    int n;          /* the GEMMs: as many inputs quantized, and as many output gradients */
    double grad;    /* the GEMMs' time as gradient GEMMs (cost_gemm_grad_us), us */
};

static double gemm_q(const struct cost_ctx *c, const struct cost_layout *l, struct quant *q,
                     double m, double n, double k)
{
    q->in += m * k;
    q->n++;
    q->out += m * n;
    double t = cost_gemm_us(&c->cal, &c->cluster.gpu, m, n, k, l->precision);
    /* (only per-tensor fp8 has a gradient rate of its own) */
    q->grad += l->precision == COST_FP8
                   ? cost_gemm_grad_us(&c->cal, &c->cluster.gpu, m, n, k, l->precision)
                   : t;
    return t;
}

static double quantize_us(const struct cost_ctx *c, const struct cost_layout *l, double elems,
                          int tensors)
{
    return cost_quantize_us(&c->cal, &c->cluster.gpu, l->precision, elems, tensors);
}

static void attention_cost(const struct cost_ctx *c, const struct cost_layout *l, int layer,
                           struct block_cost *b)
{
    const struct mdl_model *m = &c->model;
    const struct mdl_attention *a = &m->attn;
    const struct topo_gpu_spec *g = &c->cluster.gpu;
    const struct cost_calibration *cal = &c->cal;
    struct quant q = {0, 0, 0, 0};
    /* the CP rank's part of the sequence, whole after the TP all-gather */
    double M = (double)l->mbs * l->seq_len / l->cp;
    double h = m->hidden, H = (double)a->heads / l->tp, tp = l->tp;
    double kv_width; /* keys and values one GPU holds per token (what context parallelism sends) */
    double proj = 0.0, up = 0.0; /* up: MLA's up-projections, what mla_up_proj redoes */
    unsigned rc = cost_layout_rc(l);
    if (a->type == MDL_ATTN_GQA) {
        double kv = a->kv_heads >= l->tp ? (double)a->kv_heads / l->tp : 1.0;
        kv_width = 2.0 * kv * a->head_dim;
        proj += gemm_q(c, l, &q, M, (H + 2 * kv) * a->head_dim, h);
        proj += gemm_q(c, l, &q, M, h, H * a->head_dim);
    } else {
        double qk = a->qk_nope_head_dim + a->qk_rope_head_dim;
        kv_width = H * (qk + a->v_head_dim);
        if (a->q_lora_rank) {
            proj += gemm_q(c, l, &q, M / tp, a->q_lora_rank, h); /* on local tokens */
            up += gemm_q(c, l, &q, M, H * qk, a->q_lora_rank);
        } else { /* without a q LoRA, the q projection is the up-projection redone */
            up += gemm_q(c, l, &q, M, H * qk, h);
        }
        proj += gemm_q(c, l, &q, M / tp, a->kv_lora_rank + a->qk_rope_head_dim, h);
        up += gemm_q(c, l, &q, M, H * (a->qk_nope_head_dim + a->v_head_dim), a->kv_lora_rank);
        proj += up + gemm_q(c, l, &q, M, h, H * a->v_head_dim);
    }
    double flops[MDL_NCOMPONENTS];
    mdl_block_flops_fwd(m, layer, l->seq_len, flops);
    double core_flops = flops[MDL_ATTN_CORE] * M / tp;
    double core[2];
    double d = a->type == MDL_ATTN_GQA
                   ? a->head_dim
                   : (a->qk_nope_head_dim + a->qk_rope_head_dim + a->v_head_dim) / 2.0;
    double dqk = a->type == MDL_ATTN_GQA ? a->head_dim : a->qk_nope_head_dim + a->qk_rope_head_dim;
    int chunk = mdl_layer_chunk(m, layer); /* a chunked layer's sequences are its chunks */
    double span = chunk && chunk < l->seq_len ? chunk : l->seq_len;
    cost_attention_core_us(cal, g, core_flops, span / l->cp, d, dqk, core);
    double sink_f = a->sinks ? cal->attn_sink_fwd_eff * cal->attn_sink_eff : 1.0;
    double sink_b = a->sinks ? cal->attn_sink_bwd_eff * cal->attn_sink_eff : 1.0;
    bool sliding = mdl_layer_is_sliding(m, layer);
    double core_fwd = core[0] / (sink_f * (sliding ? cal->attn_window_eff : 1.0)), core_bwd;
    if (sliding && cal->attn_window_bwd_full) { /* the causal backward's work, at its rate */
        double causal[2],
            more = mdl_attended_keys(span, 0.0) / mdl_attended_keys(span, m->attn.sliding_window);
        cost_attention_core_us(cal, g, core_flops * more, span / l->cp, d, dqk, causal);
        core_bwd = causal[1] / (sink_b * cal->attn_window_bwd_eff);
    } else {
        core_bwd = core[1] / (sink_b * (sliding ? cal->attn_window_bwd_eff : 1.0));
    }
    /* Context parallelism (Megatron's p2p ring): cp - 1 steps, each passing the keys and values
     * of one chunk to the next CP rank while the attention of the chunk in hand runs; the
     * backward passes them again with their gradients. What the attention does not hide is
     * charged to the attention phases (the exchange runs inside TE's attention call). */
    if (l->cp > 1) {
        double bw, lat;
        group_link(c, l->cp, l->tp, &bw, &lat);
        double ring = (l->cp - 1) * (lat + M * kv_width * BF16 / bw * 1e6);
        double hide_f = fmin(cal->overlap_max * ring, core_fwd);
        double hide_b = fmin(cal->overlap_max * 2.0 * ring, core_bwd);
        b->comm_fwd[COST_ATTN_FWD] += ring - hide_f;
        b->comm_bwd[COST_ATTN_BWD] += 2.0 * ring - hide_b;
    }
    /* Norms, RoPE, residual adds: a few passes over the local tokens. */
    double T = M / tp;
    double elt = membound_us(c, 8.0 * T * h * BF16, 6);
    double elt_f = 0.0, elt_b = 0.0; /* the passes of QK-norm, biases and sinks (GQA) */
    if (a->type == MDL_ATTN_GQA) {
        double kvh = a->kv_heads >= l->tp ? (double)a->kv_heads / l->tp : 1.0;
        double qw = H * a->head_dim, kw = kvh * a->head_dim;
        /* q and k normed in bf16 (Llama 4's after RoPE, without weights); back: the norm's
         * backward and its weight's column sums (a bf16 implementation's passes: our executor
         * makes more, which validate's Qwen3 job shows) */
        if (a->qk_norm || a->qk_l2_norm) {
            elt_f += membound_us(c, 4.0 * T * (qw + kw), 2);
            elt_b += membound_us(c, 10.0 * T * (qw + kw), 4);
        }
        if (a->bias) { /* q, k (fp32) and v start as their biases and the GEMMs read them back;
                        * o's bias on the residual; back: each bias's column sums */
            elt_f += membound_us(c, T * (8.0 * (qw + kw) + 4.0 * kw + 8.0 * h), 4);
            elt_b += membound_us(c, T * (10.0 * (qw + 2.0 * kw) + 4.0 * h), 8);
        }
        if (a->sinks) { /* the outputs rescaled; back: each row's dot of o and its gradient */
            elt_f += membound_us(c, 4.0 * T * qw, 1);
            elt_b += membound_us(c, 4.0 * T * qw, 2);
        }
    }
    b->fwd[COST_ATTN_FWD] = proj + core_fwd + elt + elt_f + quantize_us(c, l, q.in, q.n);
    b->bwd[COST_ATTN_BWD] =
        2.0 * q.grad + core_bwd + 2.0 * elt + elt_b + quantize_us(c, l, q.out, q.n);
    /* selective recompute, module by module: what each redoes in the backward */
    if (rc & COST_RC_BIT(COST_RC_CORE_ATTN)) b->recompute[COST_ATTN_FWD] += core_fwd;
    if (rc & COST_RC_BIT(COST_RC_LAYERNORM)) /* both block norms */
        b->recompute[COST_ATTN_FWD] += membound_us(c, 2.0 * 2.0 * T * h * BF16, 2);
    if (rc & COST_RC_BIT(COST_RC_MLA_UP_PROJ)) /* the up-projections and RoPE */
        b->recompute[COST_ATTN_FWD] += up + membound_us(c, 2.0 * T * H * tp * 64 * BF16, 1);
    /* Sequence-parallel TP: all-gather in, reduce-scatter out, and the same in backward. */
    if (l->tp > 1) {
        double bw, lat;
        group_link(c, l->tp, 1, &bw, &lat);
        double ag = cost_allgather_us(M * h * BF16, l->tp, bw, lat);
        b->comm_fwd[COST_TP_COMM] += 2.0 * ag;
        b->comm_bwd[COST_TP_COMM] += 2.0 * ag;
    }
}

static double experts_on_hot_rank_us(const struct cost_ctx *c, const struct cost_layout *l,
                                     const double *rows, int n, double *bwd_us)
{
    const struct topo_gpu_spec *g = &c->cluster.gpu;
    const struct mdl_moe *e = &c->model.moe;
    double h = c->model.hidden, f = (double)e->intermediate / l->etp, fwd = 0.0, bwd = 0.0;
    double us[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        /* the same rows cost the same: balanced experts (thousands of them) are costed once */
        if (i == 0 || rows[i] != rows[i - 1])
            cost_expert_us(&c->cal, g, rows[i], h, f, l->precision, us);
        fwd += us[0];
        bwd += us[1];
    }
    *bwd_us = bwd;
    return fwd;
}

static enum moe_status moe_cost(const struct cost_ctx *c, const struct cost_layout *l,
                                int moe_index, struct block_cost *b, struct moe_error *err)
{
    const struct mdl_model *m = &c->model;
    const struct mdl_moe *e = &m->moe;
    const struct topo_gpu_spec *g = &c->cluster.gpu;
    const struct topo_cluster *t = &c->cluster;
    double T = cost_layout_tokens(l), h = m->hidden, k = e->top_k;
    struct cost_moe_traffic tr;
    enum moe_status st = cost_moe_traffic(c, l, moe_index, &tr, err);
    if (st != MOE_OK) return st;
    b->hot_ratio = tr.hot_ratio;
    /* Router: GEMM, scores, top-k. */
    double router = cost_gemm_us(&c->cal, g, T, e->experts, h, COST_BF16) +
                    membound_us(c, 3.0 * T * e->experts * 4.0, 2);
    b->fwd[COST_ROUTER] = router;
    b->bwd[COST_ROUTER] = 2.0 * router;
    /* Permute and unpermute: one read and one write per copy. */
    double perm = membound_us(c, T * h * BF16 * (1.0 + k), 2);
    b->fwd[COST_PERMUTE] = b->bwd[COST_PERMUTE] = perm;
    b->fwd[COST_UNPERMUTE] = b->bwd[COST_UNPERMUTE] = perm;
    /* Experts on the hottest rank: its local experts' rows. */
    int ep = l->ep, local = 0;
    double *rows = malloc(sizeof *rows * (size_t)e->experts); /* (local experts of the hot rank) */
    if (!rows)
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory costing %d experts", e->experts);
    double pool = T * ep * l->etp; /* tokens whose choices reach one expert group */
    int rl = c->routing && c->routing->layers > 1 ? moe_index % c->routing->layers : 0;
    const double *pick = c->routing ? c->routing->pick + (size_t)rl * e->experts : NULL;
    int hot = tr.hot_rank;
    for (int x = 0; x < e->experts; x++)
        if (cost_expert_rank(c, x, ep) == hot)
            rows[local++] = (pick ? pick[x] : k / e->experts) * pool;
    double ebwd, hot_rows = 0.0, fe = (double)e->intermediate / l->etp;
    for (int i = 0; i < local; i++) {
        hot_rows += rows[i];
        b->local_experts += rows[i] > 0; /* an expert without rows runs (and writes) nothing */
    }
    /* (fp8: each expert's quantization is in its cost) */
    b->fwd[COST_EXPERTS_FWD] = experts_on_hot_rank_us(c, l, rows, local, &ebwd);
    b->bwd[COST_EXPERTS_BWD] = ebwd;
    /* The experts' fp32 weight gradients: a step's first micro-batch writes them (in the expert
     * cost), every later one reads them too, to add to them (a GEMM with beta 1). Per micro-batch
     * on average, (mb - 1) / mb of a read of each local expert's gradients: with few rows an
     * expert, as much traffic as the GEMMs' own. (Megatron's fused accumulation reads on the
     * first micro-batch as well; with its dozens of micro-batches the difference is 1 / mb.) */
    int mb = cost_layout_micro_batches(l), busy = b->local_experts;
    if (mb > 1)
        b->bwd[COST_EXPERTS_BWD] += (mb - 1.0) / mb * membound_us(c, busy * 3.0 * h * fe * 4.0, 0);
    if (e->expert_bias) { /* gpt-oss: each expert's outputs start as its biases (bf16 gate and up,
                           * fp32 down) and its GEMMs read them back; back: each bias's column
                           * sums, a pass over the outputs' gradients */
        b->fwd[COST_EXPERTS_FWD] += membound_us(c, hot_rows * (8.0 * fe + 8.0 * h), 3 * local);
        b->bwd[COST_EXPERTS_BWD] += membound_us(c, hot_rows * (4.0 * fe + 2.0 * h), 3 * local);
    }
    unsigned rc = cost_layout_rc(l);
    for (int i = 0; i < local; i++)
        b->expert_act_us += membound_us(c, rows[i] * 3.0 * e->intermediate / l->etp * BF16, 1);
    if (rc & (COST_RC_BIT(COST_RC_MOE_ACT) | COST_RC_BIT(COST_RC_MOE)))
        b->recompute[COST_EXPERTS_FWD] += b->expert_act_us;
    free(rows);
    /* Shared experts on the local tokens. */
    if (e->shared_experts) {
        double fs = (double)e->shared_experts * e->shared_intermediate;
        struct quant q = {0, 0, 0, 0};
        double act = membound_us(c, T * 3 * fs * BF16, 1);
        double sh = gemm_q(c, l, &q, T, 2 * fs, h) + gemm_q(c, l, &q, T, h, fs) + act;
        b->fwd[COST_SHARED_EXPERT] = sh + quantize_us(c, l, q.in, q.n);
        b->bwd[COST_SHARED_EXPERT] = 2.0 * (q.grad + act) + quantize_us(c, l, q.out, q.n);
        if (rc & COST_RC_BIT(COST_RC_SHARED_EXPERTS)) b->recompute[COST_SHARED_EXPERT] += sh;
    }
    /* Dispatch and combine, both in bf16 in every precision: Megatron-Core's dispatchers send the
     * hidden states as they are (alltoall and DeepEP take the bf16 tensor, HybridEP has no fp8
     * dispatch) and the experts' GEMMs quantize what arrives. */
    double bytes = h * BF16; /* a token's hidden state */
    double nv_bw = t->nvlink_bytes_per_s * c->cal.nvlink_eff;
    double so_bw = t->scale_out_bytes_per_s * c->cal.scale_out_eff / t->oversubscription;
    double tn = nv_bw > 0 ? tr.nvlink_copies * T * bytes / nv_bw : 0.0;
    double ts = tr.scale_copies * T * bytes / so_bw;
    double a2a = ep > 1 ? c->cal.a2a_latency_us + fmax(tn, ts) * 1e6 * tr.recv_ratio : 0.0;
    b->dispatch_bytes = (tr.nvlink_copies + tr.scale_copies) * T * bytes;
    b->nodedup_bytes = tr.nodedup_copies * T * bytes;
    b->scale_bytes = tr.scale_copies * T * bytes;
    /* forward: dispatch and combine; backward: the combine's gradient travels like a dispatch,
     * the dispatch's like a combine */
    b->comm_fwd[COST_DISPATCH] = b->comm_fwd[COST_COMBINE] = a2a;
    b->comm_bwd[COST_DISPATCH] = b->comm_bwd[COST_COMBINE] = a2a;
    /* recompute of the whole MoE layer: its forward again (the activation counted above),
     * dispatch and combine included */
    if (rc & COST_RC_BIT(COST_RC_MOE)) {
        static const int again[] = {COST_ROUTER, COST_PERMUTE, COST_EXPERTS_FWD, COST_UNPERMUTE};
        for (size_t i = 0; i < sizeof again / sizeof again[0]; i++)
            b->recompute[again[i]] += b->fwd[again[i]];
        b->comm_bwd[COST_DISPATCH] += a2a;
        b->comm_bwd[COST_COMBINE] += a2a;
    }
    return MOE_OK;
}

static void dense_ffn_cost(const struct cost_ctx *c, const struct cost_layout *l,
                           struct block_cost *b)
{
    double M = (double)l->mbs * l->seq_len / l->cp, h = c->model.hidden;
    double f = (double)c->model.dense_intermediate / l->tp;
    struct quant q = {0, 0, 0, 0};
    double act = membound_us(c, M * 3 * f * BF16, 1);
    double ffn = gemm_q(c, l, &q, M, 2 * f, h) + gemm_q(c, l, &q, M, h, f) + act;
    b->fwd[COST_DENSE_FFN] = ffn + quantize_us(c, l, q.in, q.n);
    b->bwd[COST_DENSE_FFN] = 2.0 * (q.grad + act) + quantize_us(c, l, q.out, q.n);
    if (cost_layout_rc(l) & COST_RC_BIT(COST_RC_MLP)) b->recompute[COST_DENSE_FFN] += ffn;
    if (l->tp > 1) {
        double bw, lat;
        group_link(c, l->tp, 1, &bw, &lat);
        double ag = cost_allgather_us(M * h * BF16, l->tp, bw, lat);
        b->comm_fwd[COST_TP_COMM] += 2.0 * ag;
        b->comm_bwd[COST_TP_COMM] += 2.0 * ag;
    }
}

/* The calibration's per-phase correction of the compute of one occurrence (fwd and bwd parts):
 * both scaled, the fixed time added to the forward part. */
static void phase_correct(const struct cost_calibration *cal, int p, double *fwd, double *bwd)
{
    if (*fwd + *bwd <= 0.0) return;
    *fwd = *fwd * cal->phase_scale[p] + cal->phase_fixed_us[p];
    *bwd *= cal->phase_scale[p];
}

/* Full recompute runs the block's forward again before its backward, its communication
 * included (Megatron checkpoints the whole layer: the all-to-alls and the TP collectives run
 * again). With act_offload under full recompute the named tensors come back from the host
 * instead (MaxText's custom remat policy; the framework drops the work only they needed): the
 * experts' first GEMM output (`moe_act`) leaves only the activation to redo, neither expert GEMM
 * nor the combine (the layer's output is not needed: the next block's input is kept); their
 * input rows (`expert_fc1`) spare the router, the permutation and the dispatch. */
static void full_redo(const struct cost_layout *l, struct block_cost *b)
{
    for (int p = 0; p < COST_NPHASES; p++) b->whole[p] = b->fwd[p] + b->comm_fwd[p];
    bool act = l->act_offload & COST_RC_BIT(COST_OFF_MOE_ACT);
    bool rows = l->act_offload & COST_RC_BIT(COST_OFF_EXPERT_FC1);
    if (act) {
        b->whole[COST_EXPERTS_FWD] = b->expert_act_us;
        b->whole[COST_COMBINE] = b->whole[COST_UNPERMUTE] = 0.0;
    }
    if (rows) b->whole[COST_ROUTER] = b->whole[COST_PERMUTE] = b->whole[COST_DISPATCH] = 0.0;
}

static enum moe_status block_cost(const struct cost_ctx *c, const struct cost_layout *l, int layer,
                                  int moe_index, struct block_cost *b, struct moe_error *err)
{
    memset(b, 0, sizeof *b);
    b->hot_ratio = 1.0;
    /* partial CUDA graphs: attention, the router and the permutation replay from a graph (a
     * full graph is the whole context's: evaluate) */
    struct cost_ctx *g = NULL;
    if (l->graphs == COST_GRAPHS_PARTIAL) {
        g = malloc(sizeof *g);
        if (!g) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        *g = *c;
        g->cal.launch_us = c->cal.graph_launch_us;
    }
    attention_cost(g ? g : c, l, layer, b);
    if (mdl_layer_is_moe(&c->model, layer)) {
        enum moe_status st = moe_cost(c, l, moe_index, b, err);
        struct block_cost gb;
        if (st == MOE_OK && g) {
            memset(&gb, 0, sizeof gb);
            st = moe_cost(g, l, moe_index, &gb, err);
            static const int graphed[] = {COST_ROUTER, COST_PERMUTE, COST_UNPERMUTE};
            for (size_t i = 0; i < sizeof graphed / sizeof graphed[0]; i++) {
                int p = graphed[i];
                b->fwd[p] = gb.fwd[p], b->bwd[p] = gb.bwd[p], b->recompute[p] = gb.recompute[p];
            }
        }
        free(g);
        if (st != MOE_OK) return st;
    } else {
        free(g);
        dense_ffn_cost(c, l, b);
    }
    /* attention's forward and backward are two phases: each gets its own correction */
    phase_correct(&c->cal, COST_ATTN_FWD, &b->fwd[COST_ATTN_FWD], &b->bwd[COST_ATTN_FWD]);
    phase_correct(&c->cal, COST_ATTN_BWD, &b->bwd[COST_ATTN_BWD], &b->fwd[COST_ATTN_BWD]);
    phase_correct(&c->cal, COST_EXPERTS_FWD, &b->fwd[COST_EXPERTS_FWD], &b->bwd[COST_EXPERTS_FWD]);
    phase_correct(&c->cal, COST_EXPERTS_BWD, &b->bwd[COST_EXPERTS_BWD], &b->fwd[COST_EXPERTS_BWD]);
    /* the host's floor under the experts' phases: issuing each local expert's kernels */
    b->fwd[COST_EXPERTS_FWD] =
        fmax(b->fwd[COST_EXPERTS_FWD], b->local_experts * c->cal.phase_floor_us[COST_EXPERTS_FWD]);
    b->bwd[COST_EXPERTS_BWD] =
        fmax(b->bwd[COST_EXPERTS_BWD], b->local_experts * c->cal.phase_floor_us[COST_EXPERTS_BWD]);
    static const int both[] = {COST_ROUTER, COST_PERMUTE, COST_UNPERMUTE, COST_SHARED_EXPERT,
                               COST_DENSE_FFN};
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++)
        phase_correct(&c->cal, both[i], &b->fwd[both[i]], &b->bwd[both[i]]);
    if (l->recompute == COST_RECOMPUTE_FULL) full_redo(l, b);
    /* Activation offloading: the offloaded modules' inputs go to the host during the forward and
     * come back during the backward, on a copy stream beside the block's compute, at the host
     * link's or the host memory's pace (the slower). The compute hides up to overlap_max of it;
     * the rest shows on the side that offloaded it (attention, or the FFN). */
    if (l->act_offload) {
        double ab, fb, fwd = 0.0, bwd = 0.0;
        cost_offload_bytes(c, l, layer, b->hot_ratio, l->recompute == COST_RECOMPUTE_FULL, &ab,
                           &fb);
        const struct topo_gpu_spec *g = &c->cluster.gpu;
        double bw = fmin(g->host_link_bytes_per_s, g->host_memory_bytes_per_s);
        for (int p = 0; p < COST_NPHASES; p++) {
            fwd += b->fwd[p];
            bwd += b->bwd[p] + b->recompute[p] + b->whole[p];
        }
        double t = (ab + fb) / bw * 1e6, share = ab + fb > 0 ? ab / (ab + fb) : 0.0;
        double ef = fmax(0.0, t - c->cal.overlap_max * fwd);
        double eb = fmax(0.0, t - c->cal.overlap_max * bwd);
        bool moe = mdl_layer_is_moe(&c->model, layer);
        b->fwd[COST_ATTN_FWD] += ef * share;
        b->bwd[COST_ATTN_BWD] += eb * share;
        b->fwd[moe ? COST_EXPERTS_FWD : COST_DENSE_FFN] += ef * (1.0 - share);
        b->bwd[moe ? COST_EXPERTS_BWD : COST_DENSE_FFN] += eb * (1.0 - share);
    }
    return MOE_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The step                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

void cost_ctx_init(struct cost_ctx *ctx, const struct mdl_model *m, const struct topo_cluster *c,
                   const struct cost_calibration *cal, int gpus)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->model = *m;
    ctx->cluster = *c;
    if (cal)
        ctx->cal = *cal;
    else
        cost_calibration_defaults(&ctx->cal, &c->gpu);
    ctx->gpus = gpus;
    ctx->memory_headroom = 0.05;
    ctx->dispatch_buffer_factor = 2.0;
}

/* What each virtual stage holds: the plan's pp_layout when it gives one; else the split in
 * ctx->stage_layers; else an even split. An even split that does not come out whole counts the
 * embedding and the loss as a layer each where that makes it whole (Megatron's
 * account-for-embedding/loss-in-pipeline-split), else gives the remainder to the middle stages.
 * The embedding is on the first stage, the MTP layers and the loss on the last. */
static enum moe_status stage_map(const struct cost_ctx *c, const struct cost_layout *l,
                                 struct cost_stage *map, struct moe_error *err)
{
    int L = c->model.layers, stages = l->pp * l->vpp;
    if (l->pp_layout[0]) return cost_pp_layout_parse(l->pp_layout, stages, L, l->mtp, map, err);
    int counts[COST_MAX_STAGES + 2];
    bool units = !c->stage_layers && (L % stages != 0 || L < stages) && (L + 2) % stages == 0;
    if (c->stage_layers)
        memcpy(counts, c->stage_layers, sizeof *counts * (size_t)stages);
    else
        cost_even_split(units ? L + 2 : L, stages, counts);
    if (units) counts[0]--, counts[stages - 1]--; /* the embedding's and the loss's shares */
    int first = 0;
    for (int v = 0; v < stages; v++) {
        map[v] = (struct cost_stage){.first = first,
                                     .count = counts[v],
                                     .embed = v == 0,
                                     .mtp = v == stages - 1 && l->mtp > 0,
                                     .loss = v == stages - 1};
        first += counts[v];
    }
    return MOE_OK;
}

void cost_even_split(int layers, int stages, int *counts)
{
    int base = layers / stages, extra = layers % stages;
    /* The remainder goes to the middle stages first (1 .. stages-2), then the last, then the
     * first: the ends also carry the embedding and the LM head. */
    for (int s = 0; s < stages; s++) {
        int pos = stages == 1 ? 0 : s == 0 ? stages - 1 : s - 1;
        counts[s] = base + (pos < extra ? 1 : 0);
    }
}

struct stage_cost {
    double fwd_us, bwd_us;       /* per micro-batch: compute + exposed comm */
    double phases[COST_NPHASES]; /* per micro-batch exposed time by phase (fwd + bwd) */
    double comm[COST_NPHASES];   /* per micro-batch communication by phase */
    double dispatch_bytes, nodedup_bytes, scale_bytes, hot_ratio;
    int moe_layers;
};

/* Add n blocks like b (MoE or dense) to the stage. */
static void stage_add_blocks(const struct cost_ctx *c, const struct cost_layout *l,
                             const struct block_cost *b, bool moe, int n, bool whole,
                             struct stage_cost *s)
{
    struct stage_cost one; /* one block's share, then n of them */
    memset(&one, 0, sizeof one);
    /* Overlap: EP all-to-all hides behind the attention and shared expert of another
     * micro-batch, up to overlap_max of it. */
    double a2a_f = b->comm_fwd[COST_DISPATCH] + b->comm_fwd[COST_COMBINE];
    double a2a_b = b->comm_bwd[COST_DISPATCH] + b->comm_bwd[COST_COMBINE];
    double hide_f = 0.0, hide_b = 0.0;
    if (l->overlap && a2a_f > 0) {
        double win_f = b->fwd[COST_ATTN_FWD] + b->fwd[COST_SHARED_EXPERT];
        double win_b = b->bwd[COST_ATTN_BWD] + b->bwd[COST_SHARED_EXPERT];
        if (l->delay_wgrad) win_b += 0.5 * b->bwd[COST_EXPERTS_BWD]; /* the wgrad half */
        hide_f = fmin(c->cal.overlap_max * a2a_f, win_f) / a2a_f;
        hide_b = fmin(c->cal.overlap_max * a2a_b, win_b) / a2a_b;
        /* DeepEP and HybridEP kernels hold SMs while the compute they hide behind runs:
         * that compute runs on the rest, as long as the hidden communication lasts */
        int k = l->ep_sms, sms = c->cluster.gpu.sms;
        if (!k && l->dispatcher == COST_DISPATCH_DEEPEP) k = COST_DEEPEP_SMS;
        if (!k && l->dispatcher == COST_DISPATCH_HYBRIDEP) k = COST_HYBRIDEP_SMS;
        if (l->dispatcher < COST_DISPATCH_DEEPEP) k = 0;
        if (k > 0 && k < sms) {
            double slow = (double)k / (sms - k);
            one.fwd_us += hide_f * a2a_f * slow;
            one.bwd_us += hide_b * a2a_b * slow;
            one.phases[COST_DISPATCH] += (hide_f * a2a_f + hide_b * a2a_b) * slow;
        }
    }
    for (int p = 0; p < COST_NPHASES; p++) {
        double comm_f = b->comm_fwd[p], comm_b = b->comm_bwd[p];
        bool a2a = p == COST_DISPATCH || p == COST_COMBINE;
        double ef = a2a ? comm_f * (1.0 - hide_f) : comm_f;
        double eb = a2a ? comm_b * (1.0 - hide_b) : comm_b;
        one.fwd_us += b->fwd[p] + ef;
        one.bwd_us += b->bwd[p] + eb;
        one.phases[p] += b->fwd[p] + b->bwd[p] + ef + eb;
        one.comm[p] += comm_f + comm_b;
    }
    /* recomputed forward work runs in the backward, charged to the phases it repeats */
    for (int p = 0; p < COST_NPHASES; p++) {
        double redo = b->recompute[p] + (whole ? b->whole[p] : 0.0);
        one.bwd_us += redo;
        one.phases[p] += redo;
    }
    s->fwd_us += n * one.fwd_us;
    s->bwd_us += n * one.bwd_us;
    for (int p = 0; p < COST_NPHASES; p++) {
        s->phases[p] += n * one.phases[p];
        s->comm[p] += n * one.comm[p];
    }
    if (moe) {
        s->moe_layers += n;
        s->dispatch_bytes = b->dispatch_bytes;
        s->nodedup_bytes = b->nodedup_bytes;
        s->scale_bytes = b->scale_bytes;
        if (b->hot_ratio > s->hot_ratio) s->hot_ratio = b->hot_ratio;
    }
}

/* The stage's embedding and LM head, added to its blocks' cost. */
static void stage_ends(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, struct stage_cost *s)
{
    const struct mdl_model *m = &c->model;
    int mtp = sg->mtp ? l->mtp : 0;
    const struct topo_gpu_spec *g = &c->cluster.gpu;
    double T = cost_layout_tokens(l), M = T * l->tp;
    double h = m->hidden, V = (double)m->vocab / l->tp;
    if (sg->embed) { /* embedding */
        double emb = membound_us(c, T * h * BF16 * 2.0, 1), ef = emb, eb = 2.0 * emb;
        phase_correct(&c->cal, COST_EMBED, &ef, &eb);
        s->fwd_us += ef;
        s->bwd_us += eb;
        s->phases[COST_EMBED] += ef + eb;
    }
    if (sg->loss) { /* LM head and loss, vocab-parallel; once more for each MTP layer */
        double heads = 1.0 + mtp;
        double head = heads * cost_gemm_us(&c->cal, g, M, V, h, COST_BF16);
        /* the bf16 logits read twice (maximum and sum, then the gradient), the gradient written */
        double loss = heads * membound_us(c, M * V * BF16 * 3.0, 1);
        if (mtp) { /* each MTP layer's projection of [embedding, hidden] back to hidden */
            double eh = mtp * cost_gemm_us(&c->cal, g, T, h, 2.0 * h, COST_BF16);
            s->fwd_us += eh;
            s->bwd_us += 2.0 * eh;
            s->phases[COST_LM_HEAD] += 3.0 * eh;
        }
        double hf = head, hb = 2.0 * head, lf = loss, lb = loss;
        phase_correct(&c->cal, COST_LM_HEAD, &hf, &hb);
        phase_correct(&c->cal, COST_LOSS, &lf, &lb);
        s->fwd_us += hf + lf;
        s->bwd_us += hb + lb;
        s->phases[COST_LM_HEAD] += hf + hb;
        s->phases[COST_LOSS] += lf + lb;
    }
}

/* stage_cost's blocks that were not cached: costed one by one (per-layer routing). */
static enum moe_status stage_uncached(const struct cost_ctx *c, const struct cost_layout *l,
                                      const struct cost_stage *sg,
                                      const struct block_cost *cached[2], int moe_before,
                                      struct stage_cost *s, struct moe_error *err)
{
    const struct mdl_model *m = &c->model;
    int first = sg->first, count = sg->count, mtp = sg->mtp ? l->mtp : 0;
    int nb[2][2];
    cost_stage_blocks(c, l, sg, nb);
    int whole = nb[0][1] + nb[1][1];                    /* the first blocks of the stage */
    for (int j = first; j < first + count + mtp; j++) { /* the blocks costed one by one */
        int i = j < first + count ? j : m->layers - 1;
        bool moe = mdl_layer_is_moe(m, i);
        if (cached[moe ? 1 : 0]) {
            if (moe && j < first + count) moe_before++;
            continue;
        }
        struct block_cost bl;
        enum moe_status st = block_cost(c, l, i, moe_before, &bl, err);
        if (st != MOE_OK) return st;
        if (moe && j < first + count) moe_before++;
        stage_add_blocks(c, l, &bl, moe, 1, j - first < whole, s);
    }
    stage_ends(c, l, sg, s);
    return MOE_OK;
}

/* `cached`: the dense [0] and MoE [1] block costs, computed once per layout (NULL entries when
 * the routing differs per layer and each block is costed on its own). Cached blocks are added
 * once per kind with their count: a stage of a thousand layers costs two additions. */
static enum moe_status stage_cost(const struct cost_ctx *c, const struct cost_layout *l,
                                  const struct cost_stage *sg, const struct block_cost *cached[2],
                                  struct stage_cost *s, struct moe_error *err)
{
    memset(s, 0, sizeof *s);
    int moe_before = mdl_moe_layers_before(&c->model, sg->first);
    /* the stage's decoder layers, then its MTP layers (each a block like the last layer), each
     * kind's blocks that keep their activations and those recomputed whole */
    int n[2][2];
    cost_stage_blocks(c, l, sg, n);
    for (int kind = 0; kind < 2; kind++)
        for (int w = 0; w < 2; w++)
            if (cached[kind] && n[kind][w])
                stage_add_blocks(c, l, cached[kind], kind, n[kind][w], w, s);
    if (!(cached[0] && cached[1])) return stage_uncached(c, l, sg, cached, moe_before, s, err);
    stage_ends(c, l, sg, s);
    return MOE_OK;
}

static enum moe_status evaluate(const struct cost_ctx *c, const struct cost_layout *l,
                                bool memory_only, struct cost_result *out, struct moe_error *err)
{
    enum moe_status st = cost_layout_check(l, &c->model, c->gpus, err);
    if (st != MOE_OK) return st;
    struct cost_result r;
    memset(&r, 0, sizeof r);
    const struct mdl_model *m = &c->model;
    const struct topo_cluster *t = &c->cluster;
    if (l->precision == COST_MXFP8 && strcmp(t->gpu.arch, "blackwell") != 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "mxfp8 needs Blackwell; %s is %s (use fp8)",
                             t->gpu.name, t->gpu.arch);
    if (l->precision != COST_BF16 && t->gpu.fp8_tflops <= 0)
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "%s has no fp8", t->gpu.name);
    if (l->offload > 0 &&
        (t->gpu.host_link_bytes_per_s <= 0 || t->gpu.host_memory_bytes_per_s <= 0))
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "offload: the %s's host link and host memory bandwidth are not "
                             "known (gpus.json: host_link_bandwidth, host_memory_bandwidth)",
                             t->gpu.name);
    if (l->act_offload &&
        (t->gpu.host_link_bytes_per_s <= 0 || t->gpu.host_memory_bytes_per_s <= 0))
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "act_offload: the %s's host link and host memory bandwidth are not "
                             "known (gpus.json: host_link_bandwidth, host_memory_bandwidth)",
                             t->gpu.name);
    if (l->ep_sms >= t->gpu.sms)
        return moe_error_set(err, MOE_ERR_INFEASIBLE,
                             "ep_sms = %d: the %s has %d SMs, the dispatch must leave compute some",
                             l->ep_sms, t->gpu.name, t->gpu.sms);
    int pp = l->pp, vpp = l->vpp, stages = pp * vpp, mb = cost_layout_micro_batches(l);
    if (pp > COST_MAX_PP || stages > COST_MAX_STAGES)
        return moe_error_set(err, MOE_ERR_INFEASIBLE, "more than %d pipeline ranks or %d stages",
                             COST_MAX_PP, COST_MAX_STAGES);
    r.micro_batches = mb;
    double hot = 1.0;
    if (mdl_moe_layer_count(m) > 0) {
        struct cost_moe_traffic tr;
        if ((st = cost_moe_traffic(c, l, 0, &tr, err))) return st;
        hot = tr.hot_ratio;
    }
    struct cost_stage map[COST_MAX_STAGES];
    if ((st = stage_map(c, l, map, err))) return st;
    struct cost_stage_memory sm[COST_MAX_STAGES];
    for (int v = 0; v < stages; v++) cost_stage_memory(c, l, &map[v], hot, &sm[v]);
    cost_memory_of(c, l, sm, &r);
    if (memory_only) {
        *out = r;
        return MOE_OK;
    }
    /* Identical blocks cost the same: a dense and an MoE block once, unless the routing differs
     * per layer. */
    struct block_cost dense_b, moe_b;
    const struct block_cost *cached[2] = {NULL, NULL};
    int first_dense = -1, first_moe = -1;
    for (int i = m->layers - 1; i >= 0; i--) {
        if (mdl_layer_is_moe(m, i))
            first_moe = i;
        else
            first_dense = i;
    }
    if (first_dense >= 0) {
        if ((st = block_cost(c, l, first_dense, 0, &dense_b, err))) return st;
        cached[0] = &dense_b;
    }
    if (first_moe >= 0 && !(c->routing && c->routing->layers > 1)) {
        if ((st = block_cost(c, l, first_moe, 0, &moe_b, err))) return st;
        cached[1] = &moe_b;
    }
    struct stage_cost sc[COST_MAX_STAGES];
    for (int v = 0; v < stages; v++)
        if ((st = stage_cost(c, l, &map[v], cached, &sc[v], err))) return st;

    /* Pipeline: simulate (capped micro-batches, then the steady state adds the bottleneck). */
    double fwd[COST_MAX_STAGES], bwd[COST_MAX_STAGES];
    double h = m->hidden, T = cost_layout_tokens(l);
    double p2p = 0.0;
    if (pp > 1) {
        double bw, lat;
        group_link(c, 2, l->tp * l->cp * l->dp, &bw, &lat);
        p2p = lat + T * h * BF16 / bw * 1e6;
    }
    for (int v = 0; v < stages; v++) {
        fwd[v] = sc[v].fwd_us;
        bwd[v] = sc[v].bwd_us;
    }
    int cap = 4 * pp > 16 ? 4 * pp : 16;
    int sim_mb = mb;
    if (mb > cap) sim_mb = vpp > 1 ? cap - cap % pp : cap;
    struct cost_pipe_result pr;
    if ((st = cost_pipeline_simulate(pp, vpp, sim_mb, fwd, bwd, p2p, &pr, err))) return st;
    double per_rank[COST_MAX_PP] = {0};
    int busiest = 0;
    for (int v = 0; v < stages; v++) per_rank[v % pp] += fwd[v] + bwd[v];
    for (int s = 0; s < pp; s++)
        if (per_rank[s] > per_rank[busiest]) busiest = s;
    double makespan = pr.makespan_us + (mb - sim_mb) * per_rank[busiest];

    /* Data parallelism, on the busiest rank. Gradients are reduce-scattered (ZeRO >= 1) or
     * all-reduced (ZeRO-0) in their reduce precision, the dense ones over dp x cp (every CP rank
     * saw part of each sequence), the experts' over edp; parameters are all-gathered in bf16, the
     * GEMM weights in fp8 with fp8_params.
     *   ZeRO-0 and 1 (the distributed optimizer): once per step; the reduce-scatter hides behind
     *     the last micro-batch's backward, the all-gather behind the next step's first forward
     *     (Megatron's --overlap-grad-reduce --overlap-param-gather).
     *   ZeRO-2 and 3 (FSDP: Megatron FSDP's optim_grads and optim_grads_params, PyTorch FSDP2,
     *     MaxText's fsdp axis): each micro-batch's gradients reduce-scattered block by block as
     *     its backward makes them and, under ZeRO-3, each block's parameters gathered before its
     *     forward and again before its backward. The collectives run on a stream of their own,
     *     prefetched one block ahead, so each runs beside its neighbour block's compute: per
     *     micro-batch only the first block's gather (nothing runs before it) and the last block's
     *     reduce-scatter (nothing after it) show, plus whatever the collectives take beyond the
     *     compute beside them. ZeRO-2 gathers once after the step. */
    int edp = cost_layout_edp(l), ddp = l->dp * l->cp;
    double dense = 0, expert = 0, embed = 0;
    for (int v = busiest; v < stages; v += pp) {
        dense += sm[v].dense_params / l->tp;
        embed += sm[v].embed_params / l->tp;
        expert += sm[v].expert_params / (l->ep * l->etp);
    }
    double bw, lat, ebw, elat;
    collective_link(c, ddp, l->tp, &bw, &lat);
    collective_link(c, edp, l->ep * l->etp, &ebw, &elat);
    double gb = l->grad_reduce_bf16 ? BF16 : 4.0,
           pb = l->fp8_params ? cost_act_elem_bytes(l) : BF16;
    double rs = cost_allgather_us(dense * gb, ddp, bw, lat) +
                cost_allgather_us(expert * gb, edp, ebw, elat);
    double ag = cost_allgather_us((dense - embed) * pb + embed * BF16, ddp, bw, lat) +
                cost_allgather_us(expert * pb, edp, ebw, elat);
    double first_fwd = 0, last_bwd = 0;
    int blocks = 0;
    for (int v = busiest; v < stages; v += pp) {
        first_fwd += fwd[v], last_bwd += bwd[v];
        blocks += map[v].count + (map[v].mtp ? l->mtp : 0);
    }
    double om = c->cal.overlap_max, dp_comm, dp_exposed, per_mb = 0.0;
    if (l->zero <= 1) {
        double reduce = l->zero == 0 ? 2.0 * rs : rs, gather = l->zero == 0 ? 0.0 : ag;
        dp_comm = reduce + gather;
        dp_exposed = reduce - fmin(om * reduce, last_bwd) + gather - fmin(om * gather, first_fwd);
    } else {
        double ag_f = l->zero >= 3 ? ag : 0.0, bw_c = rs + ag_f, n = blocks > 0 ? blocks : 1;
        per_mb = ag_f + bw_c;
        double once = l->zero == 2 ? ag : 0.0;
        dp_comm = once + mb * per_mb;
        double exp_f = ag_f / n + fmax(0.0, ag_f * (1.0 - 1.0 / n) - first_fwd);
        double exp_b = bw_c / n + fmax(0.0, bw_c * (1.0 - 1.0 / n) - last_bwd);
        dp_exposed = once - fmin(om * once, first_fwd) + mb * (exp_f + exp_b);
    }
    /* The optimizer: the gradients read on the GPU for their norm (clipping), then fp32 master
     * weights, gradients and moments read and written and the bf16 copy written (30 bytes a
     * parameter, 22 with bf16 moments; no pass zeroes the gradients, their first writer
     * overwrites them); the share `offload` of the update runs on the CPU at the host's memory
     * bandwidth, its gradients going down and its updated weights coming back over the host
     * link, the three pipelined (Megatron's --overlap-cpu-optimizer-d2h-h2d): the slowest sets
     * its time. */
    double owned = dense / (l->zero >= 1 ? ddp : 1) + expert / (l->zero >= 1 ? edp : 1);
    double per_param = l->moments_bf16 ? 22.0 : 30.0;
    double optim = membound_us(c, owned * (4.0 + (1.0 - l->offload) * per_param), 4), optim_b = 0.0;
    /* fp8 recipes cast every GEMM weight of the GPU once a step (the first micro-batch's; TE
     * caches it for the rest): bf16 read, the fp8 copy and its transpose written. With
     * fp8_params the optimizer writes the fp8 weights itself, in place of the bf16 ones. It counts
     * in the first forward's attention, where the executor measures it: it quantizes on a stream
     * of its own from the update on, and the first block's forward waits for it (Transformer
     * Engine casts each module's weights in that module's first forward; the step is the same). */
    double cast =
        l->precision != COST_BF16 && !l->fp8_params
            ? membound_us(c, (dense - embed + expert) * (BF16 + 2.0 * cost_act_elem_bytes(l)), 1)
            : 0.0;
    if (l->offload > 0) {
        const struct topo_gpu_spec *g = &t->gpu;
        double n = owned * l->offload;
        double cpu = n * per_param / g->host_memory_bytes_per_s * 1e6;
        double link = n * (gb + BF16) / g->host_link_bytes_per_s * 1e6;
        optim += fmax(cpu, link);
    }
    phase_correct(&c->cal, COST_OPTIMIZER, &optim, &optim_b);

    r.step_us = makespan + dp_exposed + optim + cast;
    for (int v = busiest; v < stages; v += pp)
        for (int p = 0; p < COST_NPHASES; p++) {
            r.exposed_us[p] += sc[v].phases[p] * mb;
            r.comm_us[p] += sc[v].comm[p] * mb;
        }
    double busy = 0.0;
    for (int p = 0; p < COST_NPHASES; p++) busy += r.exposed_us[p];
    /* p2p sits on the pipeline's critical path: it shows up in the bubble, not as a phase. */
    r.comm_us[COST_PP_P2P] = pp > 1 ? 2.0 * p2p * mb * vpp : 0.0;
    r.exposed_us[COST_BUBBLE] = makespan - busy > 0 ? makespan - busy : 0.0; /* rounding */
    r.comm_us[COST_DP_GRAD_SYNC] = dp_comm;
    r.exposed_us[COST_DP_GRAD_SYNC] = dp_exposed;
    r.exposed_us[COST_OPTIMIZER] = optim;
    r.exposed_us[COST_ATTN_FWD] += cast; /* after the bubble: not a stage's compute */
    r.exposed_us[COST_STEP] = r.step_us;
    for (int p = 0; p < COST_NPHASES; p++) {
        bool comm = p == COST_DISPATCH || p == COST_COMBINE || p == COST_TP_COMM ||
                    p == COST_DP_GRAD_SYNC || p == COST_PP_P2P;
        r.compute_us[p] = comm ? 0.0 : r.exposed_us[p];
    }
    r.compute_us[COST_BUBBLE] = r.compute_us[COST_STEP] = 0.0;
    r.bubble_fraction = r.exposed_us[COST_BUBBLE] / r.step_us;
    double tokens = (double)l->gbs * l->seq_len;
    struct mdl_flops f;
    mdl_flops_per_token(m, l->seq_len, &f);
    double step_s = r.step_us / 1e6;
    r.tokens_per_s_per_gpu = tokens / step_s / c->gpus;
    r.model_tflops_per_gpu = f.train_total * tokens / step_s / c->gpus / 1e12;
    r.megatron_tflops_per_gpu =
        mdl_flops_megatron(m, l->seq_len, l->mtp) * tokens / step_s / c->gpus / 1e12;
    r.mfu = r.model_tflops_per_gpu / t->gpu.bf16_tflops;
    for (int v = 0; v < stages; v++) {
        if (!sc[v].moe_layers) continue;
        r.dispatch_bytes_per_gpu = sc[v].dispatch_bytes;
        r.dispatch_bytes_nodedup = sc[v].nodedup_bytes;
        r.dispatch_scale_out_bytes = sc[v].scale_bytes;
        if (sc[v].hot_ratio > r.hottest_rank_load) r.hottest_rank_load = sc[v].hot_ratio;
    }
    *out = r;
    return MOE_OK;
}

enum moe_status cost_block_times(const struct cost_ctx *c, const struct cost_layout *l,
                                 double *layer_us, double *first_extra_us, double *last_extra_us,
                                 struct moe_error *err)
{
    enum moe_status st = cost_layout_check(l, &c->model, c->gpus, err);
    if (st != MOE_OK) return st;
    const struct mdl_model *m = &c->model;
    const struct block_cost *cached[2] = {NULL, NULL};
    /* The ends alone: an empty first stage (embedding) and an empty last stage (head, loss and
     * the MTP layers). */
    struct stage_cost sc;
    struct cost_stage first = {.embed = true}, last = {.mtp = l->mtp > 0, .loss = true};
    if ((st = stage_cost(c, l, &first, cached, &sc, err))) return st;
    *first_extra_us = sc.fwd_us + sc.bwd_us;
    if ((st = stage_cost(c, l, &last, cached, &sc, err))) return st;
    *last_extra_us = sc.fwd_us + sc.bwd_us;
    /* Each block alone. */
    for (int i = 0; i < m->layers; i++) {
        struct cost_stage one = {.first = i, .count = 1};
        if ((st = stage_cost(c, l, &one, cached, &sc, err))) return st;
        layer_us[i] = sc.fwd_us + sc.bwd_us;
    }
    return MOE_OK;
}

enum moe_status cost_evaluate(const struct cost_ctx *ctx, const struct cost_layout *l,
                              struct cost_result *out, struct moe_error *err)
{
    if (l->graphs != COST_GRAPHS_FULL) return evaluate(ctx, l, false, out, err);
    /* the whole iteration in one CUDA graph: every kernel launched from it */
    struct cost_ctx *g = malloc(sizeof *g);
    if (!g) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    *g = *ctx;
    g->cal.launch_us = ctx->cal.graph_launch_us;
    enum moe_status st = evaluate(g, l, false, out, err);
    free(g);
    return st;
}

enum moe_status cost_memory(const struct cost_ctx *ctx, const struct cost_layout *l,
                            struct cost_result *out, struct moe_error *err)
{
    return evaluate(ctx, l, true, out, err);
}
