/*
 * runnable.c: what this build's executor runs, in one place: the model's features and sizes,
 * the layout, and the plan's expert placement. `moeplan run` refuses any other plan with the
 * reason given here, before it touches a GPU; `moeplan plan --runnable` checks the model first
 * and searches only the layouts accepted here, so that every plan it writes is one `run` takes
 * (test_cli checks that for a plan of every model family). It grows as the executor does.
 */
#include "exec_dist.h"
#include "exec_gpu.h"
#include "exec_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GPU router keeps a token's scores in registers (route.cu, gpu_kernels.h's GK_MAX_EXPERTS);
 * the EP exchange carries at most EXEC_EP_MAX_K choices a token. */
#define RUN_MAX_EXPERTS 512
#define RUN_MAX_TOP_K 16

bool exec_model_supported(const struct mdl_model *m, char *why, size_t cap)
{
    char none[1];
    if (!why || !cap) {
        why = none;
        cap = sizeof none;
    }
    const struct mdl_attention *a = &m->attn;
    const char *missing[3];
    int n = 0;
    if (a->qk_norm && a->type != MDL_ATTN_GQA) missing[n++] = "QK-norm with MLA";
    if (a->bias && a->type != MDL_ATTN_GQA) missing[n++] = "attention biases with MLA";
    if (a->sinks && a->type != MDL_ATTN_GQA) missing[n++] = "attention sinks with MLA";
    if (n == 0) return true;
    size_t used = (size_t)snprintf(why, cap, "%s uses", m->name);
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(why + used, cap - used, "%s %s",
                                 i == 0       ? ""
                                 : i == n - 1 ? " and"
                                              : ",",
                                 missing[i]);
    if (used < cap) snprintf(why + used, cap - used, ": not in the executor yet");
    return false;
}

bool exec_model_runnable(const struct mdl_model *m, char *why, size_t cap)
{
    if (!exec_model_supported(m, why, cap)) return false;
    if (m->moe.experts > RUN_MAX_EXPERTS || m->moe.top_k > RUN_MAX_TOP_K) {
        if (why && cap)
            snprintf(why, cap,
                     "%s: %d experts, top-%d: the GPU executor routes at most %d experts, top-%d "
                     "(a proxy with --experts runs)",
                     m->name, m->moe.experts, m->moe.top_k, RUN_MAX_EXPERTS, RUN_MAX_TOP_K);
        return false;
    }
    return true;
}

bool exec_plan_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                        const int *placement, char *why, size_t cap)
{
    if (!exec_model_runnable(m, why, cap) || !exec_layout_runnable(m, l, gpus, 0, why, cap))
        return false;
    for (int layer = 0; placement && layer < m->layers; layer++)
        for (int e = 0; e < m->moe.experts; e++)
            if (placement[(size_t)layer * m->moe.experts + e] == -2) {
                if (why && cap)
                    snprintf(why, cap,
                             "layer %d, expert %d is split over replicas: the executor serves "
                             "each expert from one rank (plan without --replicas)",
                             layer, e);
                return false;
            }
    return true;
}

bool exec_batch_runnable(const struct mdl_model *m, int mbs, int seq, char *why, size_t cap)
{
    double tokens = (double)mbs * seq, wide = m->hidden;
    int chunk = m->attn.chunk_size;
    if (chunk && seq > chunk && seq % chunk) {
        if (why && cap)
            snprintf(why, cap,
                     "seq %d with chunked attention (chunks of %d): the executor takes a sequence "
                     "of at most one chunk or a whole number of them",
                     seq, chunk);
        return false;
    }
    if (m->moe.intermediate > wide) wide = m->moe.intermediate;
    if (tokens * m->moe.top_k * wide <= 2e9 && tokens * m->vocab <= 2e9) return true;
    if (why && cap)
        snprintf(why, cap,
                 "a micro-batch of %.0f tokens (mbs=%d x seq %d) is too large for the executor's "
                 "32-bit GEMM offsets (the logits: %.3g elements, at most 2e9); lower %s",
                 tokens, mbs, seq, tokens * m->vocab, mbs > 1 ? "mbs or seq_len" : "seq_len");
    return false;
}

bool exec_layout_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                          double gpu_bytes, char *why, size_t cap)
{
    char none[1];
    if (!why || !cap) {
        why = none;
        cap = sizeof none;
    }
    if (!exec_batch_runnable(m, l->mbs, l->seq_len, why, cap)) return false;
    if (l->tp > 1 || l->etp > 1) {
        snprintf(why, cap, "tp=%d etp=%d: tensor parallelism is not in the executor yet (tp=1)",
                 l->tp, l->etp);
        return false;
    }
    if (l->cp > 1) {
        snprintf(why, cap, "cp=%d: context parallelism is not in the executor yet (cp=1)", l->cp);
        return false;
    }
    if (l->pp > 1 && l->ep > 1) {
        snprintf(why, cap,
                 "pp=%d with ep=%d: expert parallelism inside pipeline stages is not in the GPU "
                 "executor yet (pp=1 or ep=1)",
                 l->pp, l->ep);
        return false;
    }
    if (l->dp > 1 && l->zero > 1) {
        snprintf(why, cap,
                 "zero=%d with dp=%d: the GPU executor shards the optimizer state only (ZeRO-1), "
                 "not the gradients or parameters (zero=1 or 0)",
                 l->zero, l->dp);
        return false;
    }
    if (l->ep > 1 && m->moe.probs_on_input) {
        snprintf(why, cap,
                 "ep=%d with the routing weight on the expert's input (Llama 4): not in the "
                 "executor yet (ep=1)",
                 l->ep);
        return false;
    }
    if (l->ep > 1 && l->recompute == COST_RECOMPUTE_FULL) {
        snprintf(why, cap, "ep=%d with full recompute: not in the executor yet (recompute=none)",
                 l->ep);
        return false;
    }
    if (gpus != l->pp * l->dp) {
        snprintf(why, cap, "%d GPUs for pp=%d x dp=%d", gpus, l->pp, l->dp);
        return false;
    }
    if (l->precision == COST_MXFP8) {
        snprintf(why, cap,
                 "precision mxfp8: MX block-scaled FP8 needs Blackwell GPUs (B200, B300, GB200, "
                 "GB300), and the executor's fp8 is Hopper's (fp8: per-tensor current scaling, "
                 "fp8block: 1x128 and 128x128 blocks)");
        return false;
    }
    if (l->precision != COST_BF16 && l->ep > 1) {
        snprintf(why, cap,
                 "precision %s with ep=%d: the executor's exchange sends bf16 rows, and the plan "
                 "predicts fp8 ones (ep=1)",
                 cost_precision_names[l->precision], l->ep);
        return false;
    }
    if (l->fp8_params) {
        snprintf(why, cap,
                 "fp8_params: the executor keeps bf16 weights beside their fp8 copies "
                 "(fp8_params=off)");
        return false;
    }
    if (l->recompute == COST_RECOMPUTE_SELECTIVE) {
        unsigned missing = cost_layout_rc(l) & ~(unsigned)EXEC_RC_MODULES;
        if (missing) {
            char mods[128], have[128];
            cost_rc_modules_format(missing, ", ", mods, sizeof mods);
            cost_rc_modules_format(EXEC_RC_MODULES, ", ", have, sizeof have);
            snprintf(why, cap, "selective recompute of %s: not in the executor yet (%s are)", mods,
                     have);
            return false;
        }
        if (l->pp > 1) {
            snprintf(why, cap,
                     "selective recompute with pp=%d: not in the executor yet (its stages "
                     "recompute whole blocks)",
                     l->pp);
            return false;
        }
    }
    if (l->recompute == COST_RECOMPUTE_FULL && l->recompute_layers) {
        snprintf(why, cap, "full recompute of %d layers a stage: the executor recomputes all",
                 l->recompute_layers);
        return false;
    }
    if (l->dispatcher > COST_DISPATCH_DEDUP_DOMAIN) {
        snprintf(why, cap,
                 "dispatcher %s: not in the executor (its own are alltoall, dedup-gpu, "
                 "dedup-domain)",
                 cost_dispatcher_names[l->dispatcher]);
        return false;
    }
    if (l->mtp) {
        snprintf(why, cap, "mtp=%d: multi-token prediction is not in the executor yet (mtp=0)",
                 l->mtp);
        return false;
    }
    if (l->act_offload) {
        snprintf(why, cap, "act_offload: the executor keeps every activation on the GPU");
        return false;
    }
    if (l->offload > 0) {
        snprintf(why, cap, "offload=%g: the executor keeps the optimizer on the GPU (offload=0)",
                 l->offload);
        return false;
    }
    if (l->grad_reduce_bf16) {
        snprintf(why, cap, "grad_reduce=bf16: the executor reduces the gradients in fp32");
        return false;
    }
    if (l->graphs != COST_GRAPHS_NONE || l->delay_wgrad) {
        snprintf(why, cap, "%s: not in the executor yet",
                 l->delay_wgrad ? "delayed weight gradients" : "CUDA graphs");
        return false;
    }
    if (l->pp_layout[0]) {
        snprintf(why, cap, "pp_layout: the executor takes a plan's split in layer counts only");
        return false;
    }
    if (gpu_bytes > 0) { /* what the executor allocates: its own buffers, not Megatron's */
        struct mdl_model stage = *m; /* a pipeline rank: its share of the blocks (and, to be
                                      * safe, the embedding and the head) */
        stage.layers = (m->layers + l->pp - 1) / l->pp;
        struct exec_gpu_cfg c = {.seq = l->seq_len,
                                 .mbs = l->mbs,
                                 .recompute = l->recompute == COST_RECOMPUTE_FULL,
                                 .recompute_modules = cost_layout_rc(l),
                                 .streams = EXEC_DEFAULT_STREAMS,
                                 .moments_bf16 = l->moments_bf16,
                                 .precision = l->precision,
                                 /* the receive buffers' factor every plan writes (plan_json.c) */
                                 .ep_buffer_factor = 2.0};
        double b[EXEC_MEM_N], need = EXEC_CONTEXT_BYTES;
        exec_gpu_bytes(&stage, &c, l->ep > 1 ? l->ep : 0,
                       l->dispatcher == COST_DISPATCH_DEDUP_DOMAIN,
                       l->zero >= 1 && l->dp > 1 ? l->dp : 0, b);
        for (int i = 0; i < EXEC_MEM_N; i++) need += b[i];
        if (need > gpu_bytes) {
            snprintf(why, cap,
                     "the executor needs %.1f GB a GPU for this layout (its own buffers: "
                     "activations %.1f, workspace %.1f), more than the %.1f GB there are",
                     need / 1e9, b[EXEC_MEM_ACTIVATIONS] / 1e9, b[EXEC_MEM_WORKSPACE] / 1e9,
                     gpu_bytes / 1e9);
            return false;
        }
    }
    return true;
}

/* The projections fp8 training quantizes, by the name after "blkN.": not the router */
static const char *const fp8_names[] = {"wq",   "wk",   "wv", "wo",   "wqa",   "wqb", "wkva",
                                        "wkvb", "gate", "up", "down", "sgate", "sup", "sdown"};

void exec_fp8_regions(const int *off, int E, int cols, size_t *q, size_t *s, size_t *st)
{
    q[0] = s[0] = st[0] = 0;
    for (int e = 0; e < E; e++) {
        q[e + 1] = q[e], s[e + 1] = s[e], st[e + 1] = st[e];
        exec_fp8_region_next(off[e + 1] - off[e], cols, &q[e + 1], &s[e + 1], &st[e + 1]);
    }
}

/* Bounds for exec_fp8_regions' copies of a permuted matrix `cols` wide (a multiple of 16), any
 * split of `rows` rows over E experts: each region pads at most EXEC_FP8_PAD - 1 rows, so a copy
 * takes at most *bytes; its row-major factors *rf floats, its transpose's *tf (one 128-row tile
 * more an expert) */
static void region_bounds(int rows, int E, int cols, size_t *bytes, size_t *rf, size_t *tf)
{
    size_t R = (size_t)rows + (EXEC_FP8_PAD - 1) * (size_t)E;
    *bytes = R * (size_t)cols;
    *rf = (size_t)(cols + 127) / 128 * R;
    *tf = ((R + 127) / 128 + (size_t)E) * ((size_t)(cols + 3) / 4 * 4);
}

enum moe_status exec_fp8_layout(const struct exec_ref_model *table, enum cost_precision p, int rows,
                                bool unfused, struct exec_fp8_layout *out, struct moe_error *err)
{
    memset(out, 0, sizeof *out);
    bool block = p == COST_FP8_BLOCK;
    out->act = block ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR;
    out->weight = block ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR;
    const struct mdl_model *m = &table->model;
    int cap = 0, wide = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        int n = 0;
        for (int i = 0; i < table->ntensors; i++) {
            const struct exec_tensor *t = &table->tensor[i];
            int l, at = 0;
            if (sscanf(t->name, "blk%d.%n", &l, &at) != 1 || !at) continue;
            bool fp8 = false;
            for (size_t k = 0; k < sizeof fp8_names / sizeof *fp8_names; k++)
                fp8 |= !strcmp(t->name + at, fp8_names[k]);
            const char *nm = t->name + at;
            bool routed = mdl_layer_is_moe(m, l) &&
                          (!strcmp(nm, "gate") || !strcmp(nm, "up") || !strcmp(nm, "down"));
            int slices = routed ? m->moe.experts : 1;
            int rows_s = t->rows / slices, cols = t->cols;
            if (!fp8 || rows_s % 16 || cols % 16) continue; /* cuBLASLt's fp8: multiples of 16 */
            for (int e = 0; e < slices; e++, n++) {
                if (!pass) continue;
                struct exec_fp8_slice *s = &out->slice[n];
                s->off = t->offset + (size_t)e * rows_s * cols;
                s->rows = rows_s;
                s->cols = cols;
                s->layer = l;
                s->expert = routed;
                s->q = out->qbytes;
                out->qbytes += ((size_t)rows_s * cols + 15) / 16 * 16;
                s->s = out->factors;
                out->factors += exec_fp8_factor_count(out->weight, rows_s, cols);
                s->st = out->factors;
                out->factors += exec_fp8_factor_count(out->weight, cols, rows_s);
                if (rows_s > wide) wide = rows_s;
                if (cols > wide) wide = cols;
            }
        }
        if (!pass) {
            cap = n;
            out->slice = calloc(cap ? (size_t)cap : 1, sizeof *out->slice);
            if (!out->slice) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        }
        out->n = n;
    }
    size_t rpad = (size_t)exec_fp8_pad(rows);
    out->scratch_bytes = rpad * (size_t)wide;
    size_t a = exec_fp8_factor_count(out->act, rows, wide),
           b = exec_fp8_factor_count(out->act, wide, (int)rpad);
    out->scratch_factors = a > b ? a : b;
    out->tail_floats = block ? (size_t)EXEC_FP8_PAD * (size_t)wide : 0;
    /* the fused SwiGLU backward: any split of `rows` over E experts pads at most
     * EXEC_FP8_PAD - 1 rows an expert, its factors as many (row-major) or one 128-row tile an
     * expert (transposed) */
    const struct mdl_moe *x = &m->moe;
    int E = x->experts, f = x->intermediate;
    out->amax_rows = !block && !unfused && mdl_moe_layer_count(m) > 0;
    out->amax_weights = !block && !unfused && out->n > 0;
    out->cast_overlap = !unfused && out->n > 0;
    out->fuse = !unfused && mdl_moe_layer_count(m) > 0 && !x->expert_bias &&
                x->activation != MDL_ACT_CLAMPED_SWIGLU && f % 16 == 0 && m->hidden % 16 == 0;
    if (out->fuse) {
        size_t rf, tf;
        region_bounds(rows, E, f, &out->pre_bytes, &rf, &tf);
        out->pre_factors = (rf > tf ? rf : tf) / 4 * 4 + 4;
    }
    out->keep_xt = !unfused && mdl_moe_layer_count(m) > 0 && m->hidden % 16 == 0 && f % 16 == 0;
    for (int k = 0; out->keep_xt && k < 2; k++) {
        size_t rf, tf;
        region_bounds(rows, E, k ? f : m->hidden, &out->xt_bytes[k], &rf, &tf);
        out->xt_factors[k] = tf / 4 * 4 + 4;
    }
    out->dispatch = out->keep_xt && out->amax_rows;
    if (out->dispatch) {
        size_t rf, tf;
        region_bounds(rows, E, m->hidden, &out->dispatch_bytes, &rf, &tf);
        out->dispatch_factors = rf / 4 * 4 + 4;
    }
    return MOE_OK;
}

void exec_fp8_layout_free(struct exec_fp8_layout *l)
{
    free(l->slice);
    memset(l, 0, sizeof *l);
}

/* The sizes gpu_create.cu allocates, buffer by buffer in its order (a gpu test holds the two
 * equal); elements of 4 bytes unless named (B2: bf16, B8: double, float2). */
void exec_gpu_bytes(const struct mdl_model *m, const struct exec_gpu_cfg *cfg, int ep_ranks,
                    bool ep_domain, int zero_ranks, double bytes[EXEC_MEM_N])
{
    const struct mdl_attention *at = &m->attn;
    const double B2 = 2, B4 = 4, B8 = 8;
    for (int c = 0; c < EXEC_MEM_N; c++) bytes[c] = 0;
    bool mla = at->type == MDL_ATTN_MLA;
    double T = (double)cfg->seq * cfg->mbs, h = m->hidden, E = m->moe.experts;
    double P = T * m->moe.top_k, Pe = P, cap = P, F = m->moe.intermediate;
    if (ep_ranks > 0) {
        double f = cfg->ep_buffer_factor > 0 ? cfg->ep_buffer_factor : ep_ranks;
        if (f > ep_ranks) f = ep_ranks;
        Pe = cap = ceil(f * P);
        if (ep_domain) cap *= 2;
    }
    double H = at->heads, KV = mla ? at->heads : at->kv_heads;
    double nope = mla ? at->qk_nope_head_dim : 0, rope = mla ? at->qk_rope_head_dim : at->head_dim;
    double dqk = nope + rope, dv = mla ? at->v_head_dim : at->head_dim;
    double ql = mla ? at->q_lora_rank : 0, kvl = mla ? at->kv_lora_rank : 0;
    double shared = (double)m->moe.shared_experts * m->moe.shared_intermediate;
    double fw = m->dense_intermediate > shared ? m->dense_intermediate : shared;
    int nmoe = mdl_moe_layer_count(m);
    bool moe_any = nmoe > 0, dense_any = nmoe < m->layers;
    int streams =
        cfg->streams > 1 ? (cfg->streams < EXEC_MAX_STREAMS ? cfg->streams : EXEC_MAX_STREAMS) : 0;
    double ws = 64.0 * (1 << 20), *W = &bytes[EXEC_MEM_WORKSPACE];
    *W += ws * (1 + streams); /* cuBLAS's workspaces: the main stream's, each side stream's */
    /* parameters and optimizer state */
    struct exec_ref_model table;
    struct moe_error err;
    double n = 0;
    struct exec_fp8_layout f8 = {0};
    if (exec_model_table(&table, m, &err) == MOE_OK) {
        n = (double)table.nparams;
        if (cfg->precision != COST_BF16 &&
            exec_fp8_layout(&table, cfg->precision, (int)(T > Pe ? T : Pe), cfg->fp8_unfused, &f8,
                            &err) != MOE_OK)
            memset(&f8, 0, sizeof f8);
        exec_ref_model_destroy(&table);
    }
    /* keep_xt without EP: the experts' input and SwiGLU's output quantized and transposed,
     * activations of each set */
    double xt = 0;
    for (int k = 0; f8.keep_xt && ep_ranks <= 0 && k < 2; k++)
        xt += f8.xt_bytes[k] + B4 * f8.xt_factors[k];
    double shard = n, master = n;
    if (zero_ranks > 0) {
        shard = ceil(n / (4.0 * zero_ranks)) * 4;
        master = shard * zero_ranks;
    }
    bytes[EXEC_MEM_MASTER] += B4 * master + B4 * m->layers * E; /* and the selection biases */
    bytes[EXEC_MEM_WEIGHTS] += B2 * n;
    if (cfg->precision != COST_BF16) { /* fp8: the copies, their factors; each stream's scratch */
        bytes[EXEC_MEM_WEIGHTS] += 2.0 * f8.qbytes + B4 * f8.factors +
                                   B4 * (E > 4 ? ceil(E / 4.0) * 4 : 4); /* amax, by slice */
        *W += (1 + streams) *
              (3.0 * f8.scratch_bytes + 3 * B4 * f8.scratch_factors + 16 + B4 * f8.tail_floats);
        if (f8.fuse) /* the fused SwiGLU's copies (dg's and du's, each both ways), the offsets */
            *W += 4.0 * f8.pre_bytes + 4 * B4 * f8.pre_factors + B4 * (E + 1);
        if (f8.dispatch && ep_ranks <= 0) /* the experts' input as the permute quantized it */
            *W += (double)f8.dispatch_bytes + B4 * f8.dispatch_factors;
        if (f8.amax_rows) /* the experts' amax kept by the kernels that write their rows */
            *W += B4 * 5.0 * mdl_moe_layer_count(m) * E;
        if (f8.amax_weights && zero_ranks <= 0) /* the slices' amax kept by AdamW */
            bytes[EXEC_MEM_WEIGHTS] += B4 * f8.n;
        exec_fp8_layout_free(&f8);
    }
    bytes[EXEC_MEM_GRADS] += B4 * n;
    bytes[EXEC_MEM_OPTIMIZER] += 2.0 * (cfg->moments_bf16 ? B2 : B4) * shard;
    *W += B8 * (nmoe ? nmoe : 1) * E * E; /* co-activation counts */
    /* activations: each block's input, then act_alloc's per block (a module selective recompute
     * redoes: one set for every block) */
    double *A = &bytes[EXEC_MEM_ACTIVATIONS];
    *A += B4 * (m->layers + 1) * T * h;
    unsigned rc = cfg->recompute_modules;
    int nact = cfg->recompute ? 1 : m->layers;
    /* the redone modules' sets, allocated by the first block that asks */
    enum { G_A16, G_B16, G_B32, G_UP, G_CORE, G_FFN, G_ACT, G_N };
    bool have[G_N] = {false};
#define KEEP(g, count, redone)                                                                     \
    (*A += (redone) ? (have[g] ? 0.0 : (have[g] = true, (count))) : (count))
    bool rc_norm = rc & COST_RC_BIT(COST_RC_LAYERNORM);
    bool rc_core = rc & COST_RC_BIT(COST_RC_CORE_ATTN), rc_act = rc & COST_RC_BIT(COST_RC_MOE_ACT);
    bool rc_up = mla && (rc & COST_RC_BIT(COST_RC_MLA_UP_PROJ));
    for (int l = 0; l < nact; l++) {
        bool rc_ffn =
            rc & COST_RC_BIT(mdl_layer_is_moe(m, l) ? COST_RC_SHARED_EXPERTS : COST_RC_MLP);
        KEEP(G_A16, B2 * T * h, rc_norm);
        *A += B4 * T;                                           /* rstd1 */
        KEEP(G_UP, B2 * T * ((H + KV) * dqk + KV * dv), rc_up); /* q16, k16, v16 */
        if (at->qk_norm || at->qk_l2_norm) *A += B2 * T * (H + KV) * dqk + B4 * T * (H + KV);
        KEEP(G_CORE, B2 * T * H * dv + B4 * T * H, rc_core); /* o16, lse */
        if (mla)
            *A +=
                B4 * T * ql + B4 * T + B2 * T * ql + B4 * T * (kvl + rope) + B4 * T + B2 * T * kvl;
        *A += B4 * T * h; /* h1 */
        KEEP(G_B16, B2 * T * h, rc_norm);
        *A += B4 * T; /* rstd2 */
        if (fw && (dense_any || shared)) KEEP(G_FFN, 3 * B2 * T * fw, rc_ffn);
        if (moe_any) {
            KEEP(G_B32, B4 * T * h, rc_norm);
            *A += B4 * T * E + 4 * B4 * P + B4 * (E + 1) + B4 * E; /* logits .. auxg */
            *A += B2 * Pe * h + 2 * B2 * Pe * F;                   /* xp16, eg16, eu16 */
            KEEP(G_ACT, B2 * Pe * F, rc_act);                      /* ehm16 */
            *A += B4 * Pe * h + xt;                                /* yp32, xt8 and their factors */
        }
    }
#undef KEEP
    /* workspace: the tokens, the embedding's plan, the permutation's counts, attention's scratch
     * and every gradient buffer of one block's backward, the head's */
    *W += B4 * cfg->mbs * (cfg->seq + 1) + 2 * B4 * T + B4 * (7 * T + 2);
    double chunks = ceil(P / 1024.0), rchunks = ceil(T / 128.0); /* GK_CHUNK, GK_COLSUM_ROWS */
    *W += 2 * B4 * (chunks * E + 1);
    *W += B4 * T * (H + KV) * dqk + B4 * T * H + 8.0 * cfg->seq * floor(rope / 2);
    double widest = h > E ? h : E;
    if (mla && kvl + rope > widest) widest = kvl + rope;
    if (ql > widest) widest = ql;
    if ((at->qk_norm || at->bias) && H * dqk > widest) widest = H * dqk;
    *W += B4 * rchunks * widest + B4 * widest;
    *W += B4 * T * h * (cfg->recompute ? 5 : 4) + 2 * B2 * T * h; /* dh .. db32, dy16, dh16 */
    *W += B2 * T * H * dv + (B4 + B2) * T * ((H + KV) * dqk + KV * dv);
    if (mla)
        *W += B4 * T * H * (nope + dv) + B2 * T * H * dqk + B2 * T * H * (nope + dv) +
              B4 * T * kvl + (B4 + B2) * T * (kvl + rope) + (2 * B4 + B2) * T * ql;
    if (fw) *W += 3 * B2 * T * fw;
    if (moe_any) {
        *W += B4 * P + B2 * Pe * h + 3 * B2 * Pe * F + 2 * B2 * Pe * h + B4 * T * E;
        *W += B8 * nmoe * E; /* the loads */
        if (ep_ranks > 0)    /* the exchange's buffers */
            *W += B4 * cap + 2.0 * sizeof(struct exec_ep_meta) * cap + B2 * 2 * cap * h +
                  B4 * 4 * cap * h + B4 * 2 * cap * m->moe.top_k + B4 * Pe +
                  nmoe * (B4 * (3 * Pe + 2 * (cap + 1) + T + 1 + P + cap) + B4 * 2 * Pe);
        *W += B4 * T * E; /* scores */
        if (m->moe.expert_bias) *W += B2 * Pe;
    }
    if (at->qk_l2_norm) *W += B4 * dqk;
    *W += B2 * T * h + B4 * T + B2 * T * m->vocab + B4 * T + B4 * T * h + B8 * 1024;
}
