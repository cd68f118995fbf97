/*
 * gpu_create.cu: making and freeing a struct exec_gpu: shapes from the model, streams and
 * handles, every buffer (gpu_dalloc names and counts each by category, and honours
 * --gpu-memory-limit), parameters in and out (fp32 masters, bf16 copies), the optimizer state of
 * ZeRO-1's shard, the routers' selection biases.
 */
#include "gpu.h"

#include <vector>

/* `what` names the buffer in a failure (the code's name for it, "g->" left off). */
enum moe_status gpu_dalloc(struct exec_gpu *g, void **p, size_t bytes, enum exec_mem cat,
                           const char *what, struct moe_error *err)
{
    *p = NULL;
    if (bytes == 0) bytes = 16;
    if (strncmp(what, "g->", 3) == 0) what += 3;
    if (g->nallocs == MAX_ALLOCS)
        return moe_error_set(err, MOE_ERR_RUNTIME, "executor: more than %d allocations",
                             MAX_ALLOCS);
    double lim = g->cfg.mem_limit, have = allocated(g);
    if (lim > 0 && have + (double)bytes > lim)
        return moe_error_set(err, MOE_ERR_GPU_NOMEM,
                             "executor: out of GPU memory allocating %s (%s, %.3g GB): %.3g GB "
                             "allocated so far, the limit %.3g GB (--gpu-memory-limit)",
                             what, exec_mem_names[cat], bytes / 1e9, have / 1e9, lim / 1e9);
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError(); /* not sticky: clear it */
        cudaMemGetInfo(&fr, &tot);
        bool oom = e == cudaErrorMemoryAllocation;
        return moe_error_set(err, oom ? MOE_ERR_GPU_NOMEM : MOE_ERR_CUDA,
                             "executor: %scudaMalloc of %s (%s, %.3g GB): %s; %.3g GB allocated "
                             "so far, %.3g of %.3g GB free on the device",
                             oom ? "out of GPU memory: " : "", what, exec_mem_names[cat],
                             bytes / 1e9, cudaGetErrorString(e), have / 1e9, fr / 1e9, tot / 1e9);
    }
    g->allocs[g->nallocs++] = *p;
    g->mem[cat] += (double)bytes;
    MOE_CUDA_CHECK(cudaMemsetAsync(*p, 0, bytes, g->s));
    return MOE_OK;
}

enum moe_status gpu_fp8_check(int device, enum cost_precision p, struct moe_error *err)
{
    int major = 0, minor = 0; /* cuBLASLt: fp8 from sm_89, its block scaling sm_90 */
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    bool block = p == COST_FP8_BLOCK;
    if (block ? major != 9 : major * 10 + minor < 89)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: precision %s needs %s; this GPU is sm_%d%d",
                             cost_precision_names[p],
                             block ? "a Hopper GPU (sm_90: cuBLASLt's 1x128 and 128x128 block "
                                     "scaling; Blackwell scales in MX blocks: mxfp8)"
                                   : "fp8 tensor cores (sm_89 or later)",
                             major, minor);
    return MOE_OK;
}

/* Block l's activations. A module that selective recompute redoes keeps its tensors in one set
 * for every block (g->act_rc, allocated the first time a block asks): the backward redoes them
 * for the block in hand. */
static enum moe_status act_alloc(struct exec_gpu *g, struct act *A, int l, bool moe_any,
                                 bool dense_any, struct moe_error *err)
{
    int T = g->tokens, h = g->hidden, P = g->pairs, E = g->experts, H = g->heads, KV = g->kv_heads;
    enum exec_mem c = EXEC_MEM_ACTIVATIONS;
    int fw = g->dense_ffn > g->shared_ffn ? g->dense_ffn : g->shared_ffn;
    unsigned rc = g->cfg.recompute_modules;
    struct act *R = &g->act_rc;
    bool rc_norm = rc & COST_RC_BIT(COST_RC_LAYERNORM),
         rc_core = rc & COST_RC_BIT(COST_RC_CORE_ATTN);
    bool rc_act = rc & COST_RC_BIT(COST_RC_MOE_ACT);
    bool rc_ffn = rc & COST_RC_BIT(g->moe_index[l] >= 0 ? COST_RC_SHARED_EXPERTS : COST_RC_MLP);
#define OWN_OR_RC(field, count, redone)                                                            \
    do {                                                                                           \
        if (redone) {                                                                              \
            if (!R->field) ALLOC(R->field, count, c);                                              \
            A->field = R->field;                                                                   \
        } else {                                                                                   \
            ALLOC(A->field, count, c);                                                             \
        }                                                                                          \
    } while (0)
    OWN_OR_RC(a16, (size_t)T * h, rc_norm);
    ALLOC(A->rstd1, T, c);
    bool rc_up = g->mla && (rc & COST_RC_BIT(COST_RC_MLA_UP_PROJ));
    OWN_OR_RC(q16, (size_t)T * H * g->dqk, rc_up);
    OWN_OR_RC(k16, (size_t)T * KV * g->dqk, rc_up);
    if (g->qk_norm || g->m.attn.qk_l2_norm) { /* Qwen3's before the norm, Llama 4's after RoPE */
        ALLOC(A->qpre16, (size_t)T * H * g->dqk, c);
        ALLOC(A->kpre16, (size_t)T * KV * g->dqk, c);
        ALLOC(A->rstdqh, (size_t)T * H, c);
        ALLOC(A->rstdkh, (size_t)T * KV, c);
    }
    OWN_OR_RC(v16, (size_t)T * KV * g->dv, rc_up);
    OWN_OR_RC(o16, (size_t)T * H * g->dv, rc_core);
    OWN_OR_RC(lse, (size_t)T * H, rc_core);
    if (g->mla) {
        ALLOC(A->cq32, (size_t)T * g->q_lora, c);
        ALLOC(A->rstdq, T, c);
        ALLOC(A->cqn16, (size_t)T * g->q_lora, c);
        ALLOC(A->ckvf32, (size_t)T * (g->kv_lora + g->rope), c);
        ALLOC(A->rstdkv, T, c);
        ALLOC(A->ckvn16, (size_t)T * g->kv_lora, c);
    }
    ALLOC(A->h1, (size_t)T * h, c);
    OWN_OR_RC(b16, (size_t)T * h, rc_norm);
    ALLOC(A->rstd2, T, c);
    if (fw && (dense_any || g->shared_ffn)) {
        OWN_OR_RC(g16, (size_t)T * fw, rc_ffn);
        OWN_OR_RC(u16, (size_t)T * fw, rc_ffn);
        OWN_OR_RC(hm16, (size_t)T * fw, rc_ffn);
    }
    if (moe_any) {
        OWN_OR_RC(b32, (size_t)T * h, rc_norm);
        ALLOC(A->logits, (size_t)T * E, c);
        ALLOC(A->choice, (size_t)P, c);
        ALLOC(A->weight, (size_t)P, c);
        ALLOC(A->pos, (size_t)P, c);
        ALLOC(A->row_src, (size_t)P, c);
        ALLOC(A->off, E + 1, c);
        ALLOC(A->auxg, E, c);
        ALLOC(A->xp16, (size_t)g->Pe * h, c);
        ALLOC(A->eg16, (size_t)g->Pe * g->ffn, c);
        ALLOC(A->eu16, (size_t)g->Pe * g->ffn, c);
        OWN_OR_RC(ehm16, (size_t)g->Pe * g->ffn, rc_act);
        ALLOC(A->yp32, (size_t)g->Pe * h, c);
        for (int k = 0; g->f8.keep_xt && !g->cfg.ep && k < XT_N; k++) {
            ALLOC(A->xt8[k], g->f8.xt_bytes[k], c);
            ALLOC(A->xt8s[k], g->f8.xt_factors[k], c);
        }
    }
#undef OWN_OR_RC
    return MOE_OK;
}

static enum moe_status create(struct exec_gpu *g, const struct mdl_model *m,
                              const struct exec_gpu_cfg *cfg, struct moe_error *err)
{
    const struct mdl_attention *at = &m->attn;
    MOE_CHECK(exec_model_table(&g->table, m, err));
    g->m = *m;
    g->cfg = *cfg;
    g->seq = cfg->seq;
    g->mbs = cfg->mbs;
    g->tokens = cfg->seq * cfg->mbs;
    g->layers = m->layers;
    g->hidden = m->hidden;
    g->vocab = m->vocab;
    g->experts = m->moe.experts;
    g->top_k = m->moe.top_k;
    g->ffn = m->moe.intermediate;
    g->shared_ffn = m->moe.shared_experts * m->moe.shared_intermediate;
    g->dense_ffn = m->dense_intermediate;
    g->pairs = g->tokens * g->top_k;
    if (cfg->ep) {
        double f = cfg->ep_buffer_factor > 0 ? cfg->ep_buffer_factor : cfg->ep->ranks;
        if (f > cfg->ep->ranks) f = cfg->ep->ranks;
        g->Pe = g->rows_cap = (int)ceil(f * g->pairs);
        /* per-domain dedup: a landing rank holds rows for its whole domain before it forwards
         * them, and the forwarded rows besides: twice the rows for the same pairs */
        if (cfg->ep_group && cfg->ep_group->mode == COST_DISPATCH_DEDUP_DOMAIN) g->rows_cap *= 2;
    } else {
        g->Pe = g->rows_cap = g->pairs;
    }
    g->mla = at->type == MDL_ATTN_MLA;
    g->qk_norm = at->qk_norm;
    g->attn_bias = at->bias;
    g->expert_bias = m->moe.expert_bias;
    if (m->moe.activation == MDL_ACT_CLAMPED_SWIGLU) {
        g->act_alpha = (float)m->moe.swiglu_alpha;
        g->act_limit = (float)m->moe.swiglu_limit;
    }
    g->sinks = at->sinks;
    g->heads = at->heads;
    g->kv_heads = g->mla ? at->heads : at->kv_heads;
    g->nope = g->mla ? at->qk_nope_head_dim : 0;
    g->rope = g->mla ? at->qk_rope_head_dim : at->head_dim;
    g->dqk = g->nope + g->rope;
    g->dv = g->mla ? at->v_head_dim : at->head_dim;
    g->q_lora = g->mla ? at->q_lora_rank : 0;
    g->kv_lora = g->mla ? at->kv_lora_rank : 0;
    exec_router_cfg_from_model(&g->rc, m);
    g->rc.aux_coef = cfg->aux_coef;
    if (cfg->seq < 1 || cfg->mbs < 1 || cfg->seq > m->max_seq_len)
        return moe_error_set(err, MOE_ERR_INPUT, "executor: sequence %d (1 .. %d), mbs %d",
                             cfg->seq, m->max_seq_len, cfg->mbs);
    if (cfg->ep) {
        int nmoe = 0;
        for (int l = 0; l < m->layers; l++) nmoe += mdl_layer_is_moe(m, l);
        if (cfg->ep_groups > 1 && cfg->ep_groups != nmoe)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "executor: %d EP groups for %d MoE layers (one, or one a layer)",
                                 cfg->ep_groups, nmoe);
        for (int i = 0; i < (cfg->ep_groups > 1 ? cfg->ep_groups : 1); i++) {
            const struct exec_ep_group *eg = cfg->ep_group ? cfg->ep_group + i : NULL;
            if (!eg || eg->ranks != cfg->ep->ranks || eg->experts != g->experts ||
                eg->top_k != g->top_k)
                return moe_error_set(err, MOE_ERR_INPUT,
                                     "executor: expert parallelism needs a group of the "
                                     "transport's %d ranks for %d experts, top_k %d",
                                     cfg->ep->ranks, g->experts, g->top_k);
            MOE_CHECK(exec_ep_group_check(eg, err));
        }
        if (cfg->recompute)
            return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                 "executor: expert parallelism with full recompute is not in the "
                                 "executor yet");
        if (m->moe.probs_on_input)
            return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                 "executor: expert parallelism with the routing weight on the "
                                 "expert's input (Llama 4) is not in the executor yet");
    }
    if (cfg->recompute_modules & ~(unsigned)EXEC_RC_MODULES) {
        char mods[128];
        cost_rc_modules_format(cfg->recompute_modules & ~(unsigned)EXEC_RC_MODULES, ", ", mods,
                               sizeof mods);
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: selective recompute of %s is not in the executor yet",
                             mods);
    }
    if (cfg->recompute && cfg->recompute_modules)
        return moe_error_set(err, MOE_ERR_INPUT, "executor: full and selective recompute at once");
    if (g->mla && g->rope > GK_MAX_ROPE)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: %d RoPE dims in MLA; this build supports at most %d",
                             g->rope, GK_MAX_ROPE);
    if (!gk_flash_supported(g->dqk, g->dv))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: attention head dims %d (q, k) and %d (v); this build "
                             "supports at most %d",
                             g->dqk, g->dv, GK_FLASH_MAX_DIM);
    if (g->experts > GK_MAX_EXPERTS)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: %d experts; this build routes at most %d per layer",
                             g->experts, GK_MAX_EXPERTS);
    char why[256];
    if (!exec_batch_runnable(&g->m, g->mbs, g->seq, why, sizeof why))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "executor: %s", why);
    MOE_CUDA_CHECK(cudaSetDevice(cfg->device));
    if (cfg->precision == COST_MXFP8 || (cfg->precision != COST_BF16 && cfg->ep))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "executor: precision %s%s is not in the executor (bf16, fp8, "
                             "fp8block; with ep=1)",
                             cost_precision_names[cfg->precision], cfg->ep ? " with EP" : "");
    if (cfg->precision != COST_BF16) MOE_CHECK(gpu_fp8_check(cfg->device, cfg->precision, err));
    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking));
    MOE_CUBLAS_CHECK(cublasCreate(&g->blas));
    MOE_CUBLAS_CHECK(cublasSetStream(g->blas, g->s));
    /* a fixed workspace keeps cuBLAS's choice of algorithm, and so its results, the same */
    size_t ws = 64u << 20;
    MOE_CHECK(gpu_dalloc(g, &g->blas_ws, ws, EXEC_MEM_WORKSPACE, "the cuBLAS workspace", err));
    MOE_CUBLAS_CHECK(cublasSetWorkspace(g->blas, g->blas_ws, ws));
    MOE_CUBLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    MOE_CUBLAS_CHECK(cublasLtCreate(&g->lt));
    g->ws_bytes = ws;
    g->cur = g->blas;
    g->cur_side = -1;
    g->nside =
        cfg->streams > 1 ? (cfg->streams < EXEC_MAX_STREAMS ? cfg->streams : EXEC_MAX_STREAMS) : 0;
    if (g->nside) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&g->fork_ev, cudaEventDisableTiming));
    for (int i = 0; i < g->nside; i++) {
        void *sws;
        MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&g->side[i], cudaStreamNonBlocking));
        MOE_CUDA_CHECK(cudaEventCreateWithFlags(&g->join_ev[i], cudaEventDisableTiming));
        MOE_CUBLAS_CHECK(cublasCreate(&g->side_blas[i]));
        MOE_CUBLAS_CHECK(cublasSetStream(g->side_blas[i], g->side[i]));
        MOE_CHECK(
            gpu_dalloc(g, &sws, ws, EXEC_MEM_WORKSPACE, "a side stream's cuBLAS workspace", err));
        MOE_CUBLAS_CHECK(cublasSetWorkspace(g->side_blas[i], sws, ws));
        g->side_ws[i] = sws;
    }
    /* tensor indices */
    size_t n = g->table.nparams;
    g->wi = (int(*)[W_N])calloc((size_t)g->layers, sizeof *g->wi);
    g->moe_index = (int *)calloc((size_t)g->layers, sizeof(int));
    g->decay = (bool *)calloc((size_t)g->table.ntensors, sizeof(bool));
    g->off_host = (int **)calloc((size_t)g->layers, sizeof(int *));
    g->xin = (float **)calloc((size_t)g->layers + 1, sizeof(float *));
    g->blk_off = (size_t *)calloc((size_t)g->layers + 1, sizeof(size_t));
    g->act = (struct act *)calloc((size_t)g->layers, sizeof(struct act));
    if (!g->wi || !g->moe_index || !g->decay || !g->off_host || !g->xin || !g->act || !g->blk_off)
        return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < g->table.ntensors; i++)
        g->decay[i] = exec_tensor_decays(g->table.tensor[i].name);
    for (int l = 0; l < g->layers; l++) {
        g->moe_index[l] = mdl_layer_is_moe(m, l) ? g->nmoe++ : -1;
        for (int j = 0; j < W_N; j++) {
            char name[64];
            snprintf(name, sizeof name, "blk%d.%s", l, w_names[j]);
            const struct exec_tensor *t = exec_ref_tensor(&g->table, name);
            g->wi[l][j] = t ? (int)(t - g->table.tensor) : -1;
        }
    }
    /* gradient slices: an expert tensor one per expert (each expert's GEMM writes its own) */
    int nt = g->table.ntensors;
    g->gslice = (int *)calloc((size_t)nt + 1, sizeof(int));
    if (!g->gslice) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (int l = 0; l < g->layers; l++)
        for (int j = W_GATE; j <= W_DOWN_B && g->moe_index[l] >= 0; j++)
            if (g->wi[l][j] >= 0) g->gslice[g->wi[l][j] + 1] = g->experts - 1;
    for (int t = 0; t < nt; t++) g->gslice[t + 1] += g->gslice[t] + 1;
    g->gfresh = (unsigned char *)malloc((size_t)g->gslice[nt]);
    if (!g->gfresh) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    gpu_grads_fresh(g);
    g->embed = (int)(exec_ref_tensor(&g->table, "embed") - g->table.tensor);
    g->final_norm = (int)(exec_ref_tensor(&g->table, "final_norm") - g->table.tensor);
    const struct exec_tensor *head =
        exec_ref_tensor(&g->table, m->tied_embeddings ? "embed" : "lm_head");
    g->head = (int)(head - g->table.tensor);
    /* gradient buckets: each block's tensors one contiguous range, blocks in order */
    g->buckets_ok = true;
    for (int l = 0; l < g->layers; l++) {
        size_t lo = (size_t)-1, hi = 0;
        char pre[16];
        int np = snprintf(pre, sizeof pre, "blk%d.", l);
        for (int i = 0; i < g->table.ntensors; i++) {
            const struct exec_tensor *t = &g->table.tensor[i];
            if (strncmp(t->name, pre, (size_t)np)) continue;
            if (t->offset < lo) lo = t->offset;
            if (t->offset + t->size > hi) hi = t->offset + t->size;
        }
        if (l > 0 && lo != g->blk_off[l]) g->buckets_ok = false;
        g->blk_off[l] = lo;
        g->blk_off[l + 1] = hi;
    }
    /* parameters and optimizer state */
    g->shard_lo = 0;
    g->shard_hi = g->shard_n = n;
    size_t nmaster = n;
    if (cfg->zero) { /* shards of a multiple of 4 floats: the 16-byte AdamW kernel */
        int R = cfg->zero->ranks;
        g->shard_n = (n + 4 * (size_t)R - 1) / (4 * (size_t)R) * 4;
        g->shard_lo = g->shard_n * (size_t)cfg->zero->rank;
        g->shard_hi = g->shard_lo + g->shard_n < n ? g->shard_lo + g->shard_n : n;
        if (g->shard_hi < g->shard_lo) g->shard_hi = g->shard_lo;
        nmaster = g->shard_n * (size_t)R;
    }
    ALLOC(g->master, nmaster, EXEC_MEM_MASTER);
    ALLOC(g->w16, n, EXEC_MEM_WEIGHTS);
    if (cfg->precision != COST_BF16) { /* the quantized weights; each stream's scratch */
        int rows = g->tokens > g->pairs ? g->tokens : g->pairs;
        MOE_CHECK(exec_fp8_layout(&g->table, cfg->precision, rows, cfg->fp8_unfused, &g->f8, err));
        for (int i = 1; i < g->f8.n; i++) /* block by block, as their quantization goes */
            if (g->f8.slice[i].layer < g->f8.slice[i - 1].layer)
                return moe_error_set(err, MOE_ERR_RUNTIME,
                                     "executor: the fp8 slices are not in block order");
        ALLOC(g->w8, g->f8.qbytes, EXEC_MEM_WEIGHTS);
        ALLOC(g->w8t, g->f8.qbytes, EXEC_MEM_WEIGHTS);
        ALLOC(g->w8s, g->f8.factors, EXEC_MEM_WEIGHTS);
        ALLOC(g->w8amax, g->experts > 4 ? (g->experts + 3) / 4 * 4 : 4, EXEC_MEM_WEIGHTS);
        for (int i = 0; i <= g->nside; i++) {
            struct fp8_scratch *x = &g->f8x[i];
            ALLOC(x->a, g->f8.scratch_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(x->b, g->f8.scratch_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(x->c, g->f8.scratch_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(x->sa, g->f8.scratch_factors, EXEC_MEM_WORKSPACE);
            ALLOC(x->sb, g->f8.scratch_factors, EXEC_MEM_WORKSPACE);
            ALLOC(x->sc, g->f8.scratch_factors, EXEC_MEM_WORKSPACE);
            ALLOC(x->amax, 4, EXEC_MEM_WORKSPACE);
            if (g->f8.tail_floats) ALLOC(x->tail, g->f8.tail_floats, EXEC_MEM_WORKSPACE);
        }
        for (int k = 0; g->f8.fuse && k < 2; k++) {
            ALLOC(g->f8pre.q[k], g->f8.pre_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(g->f8pre.qt[k], g->f8.pre_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(g->f8pre.s[k], g->f8.pre_factors, EXEC_MEM_WORKSPACE);
            ALLOC(g->f8pre.st[k], g->f8.pre_factors, EXEC_MEM_WORKSPACE);
        }
        if (g->f8.fuse) {
            ALLOC(g->f8pre.off_dev, g->experts + 1, EXEC_MEM_WORKSPACE);
            size_t *r = (size_t *)calloc(3 * ((size_t)g->experts + 1), sizeof(size_t));
            if (!r) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
            g->f8pre.qo = r, g->f8pre.so = r + g->experts + 1,
            g->f8pre.sto = r + 2 * (g->experts + 1);
        }
        if (g->f8.dispatch && !cfg->ep) {
            ALLOC(g->f8xd.q, g->f8.dispatch_bytes, EXEC_MEM_WORKSPACE);
            ALLOC(g->f8xd.s, g->f8.dispatch_factors, EXEC_MEM_WORKSPACE);
            size_t *r = (size_t *)calloc(3 * ((size_t)g->experts + 1), sizeof(size_t));
            if (!r) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
            g->f8xd.qo = r, g->f8xd.so = r + g->experts + 1, g->f8xd.sto = r + 2 * (g->experts + 1);
        }
        if (g->f8.amax_rows)
            ALLOC(g->f8rows, (size_t)g->nmoe * F8_ROWS * g->experts, EXEC_MEM_WORKSPACE);
        if (g->f8.keep_xt && !cfg->ep) { /* host: each act set's record; the regions */
            size_t sets = cfg->recompute ? 1 : (size_t)g->layers, E = (size_t)g->experts;
            g->xt_set = (struct gpu_xt_set *)calloc(1, sets * (sizeof *g->xt_set + XT_N * E));
            size_t *r = (size_t *)calloc(XT_N * 3 * (E + 1), sizeof(size_t));
            g->xt.m[0].qo = r;
            if (!g->xt_set || !r)
                return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
            unsigned char *done = (unsigned char *)(g->xt_set + sets);
            for (size_t i = 0; i < sets; i++)
                g->xt_set[i] = gpu_xt_set{-1, NULL, done + i * XT_N * E};
            for (int k = 0; k < XT_N; k++, r += 3 * (E + 1))
                g->xt.m[k].qo = r, g->xt.m[k].so = r + E + 1, g->xt.m[k].sto = r + 2 * (E + 1);
        }
        if (g->f8.amax_weights && !cfg->zero) ALLOC(g->w8kept, g->f8.n, EXEC_MEM_WEIGHTS);
        g->f8lt = gk_fp8_lt_create(g->lt, g->ws_bytes);
        if (!g->f8lt) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        if (cfg->fp8_cast_sync) g->f8.cast_overlap = false;
        if (g->f8.cast_overlap) { /* the quantization's stream and two events a block */
            g->cast_ev = (cudaEvent_t *)calloc(2 * (size_t)g->layers, sizeof(cudaEvent_t));
            g->cast_waited = (unsigned char *)calloc(2 * (size_t)g->layers, 1);
            if (!g->cast_ev || !g->cast_waited)
                return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
            MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&g->cast_s, cudaStreamNonBlocking));
            MOE_CUDA_CHECK(cudaEventCreateWithFlags(&g->cast_in, cudaEventDisableTiming));
            for (int p = 0; p < 2 * g->layers; p++)
                MOE_CUDA_CHECK(cudaEventCreateWithFlags(&g->cast_ev[p], cudaEventDisableTiming));
        }
        g->fp8 = g->w8_stale = true;
    }
    ALLOC(g->grad, n, EXEC_MEM_GRADS);
    g->mom_bytes = cfg->moments_bf16 ? sizeof(bf16) : sizeof(float);
    MOE_CHECK(gpu_dalloc(g, &g->m1, g->mom_bytes * g->shard_n, EXEC_MEM_OPTIMIZER,
                         "the first AdamW moments", err));
    MOE_CHECK(gpu_dalloc(g, &g->m2, g->mom_bytes * g->shard_n, EXEC_MEM_OPTIMIZER,
                         "the second AdamW moments", err));
    int E = g->experts, T = g->tokens, P = g->pairs, h = g->hidden, H = g->heads, KV = g->kv_heads;
    ALLOC(g->bias, (size_t)g->layers * E, EXEC_MEM_MASTER);
    g->bias_host = (double *)calloc((size_t)g->layers * E, sizeof(double));
    g->counts = (int64_t *)calloc((size_t)(g->nmoe ? g->nmoe : 1) * E, sizeof(int64_t));
    g->step_load = (int64_t *)calloc((size_t)(g->nmoe ? g->nmoe : 1) * E, sizeof(int64_t));
    if (!g->bias_host || !g->counts || !g->step_load)
        return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    ALLOC(g->coact, (size_t)(g->nmoe ? g->nmoe : 1) * E * E, EXEC_MEM_WORKSPACE);
    /* activations */
    bool moe_any = g->nmoe > 0, dense_any = g->nmoe < g->layers;
    for (int l = 0; l <= g->layers; l++) ALLOC(g->xin[l], (size_t)T * h, EXEC_MEM_ACTIVATIONS);
    int nact = cfg->recompute ? 1 : g->layers;
    for (int l = 0; l < nact; l++) {
        MOE_CHECK(act_alloc(g, &g->act[l], l, moe_any, dense_any, err));
        MOE_CUDA_CHECK(cudaMallocHost((void **)&g->off_host[l], sizeof(int) * (E + 1)));
    }
    for (int l = nact; l < g->layers; l++) {
        g->act[l] = g->act[0];
        g->off_host[l] = g->off_host[0];
    }
    /* workspace */
    enum exec_mem c = EXEC_MEM_WORKSPACE;
    int dqk = g->dqk, dv = g->dv, S = g->seq,
        fw = g->dense_ffn > g->shared_ffn ? g->dense_ffn : g->shared_ffn;
    ALLOC(g->tok, (size_t)g->mbs * (S + 1), c);
    ALLOC(g->tok_in, T, c);
    ALLOC(g->emb_dev, gk_embed_plan_ints(T), c);
    MOE_CUDA_CHECK(cudaMallocHost((void **)&g->emb_host, sizeof(int) * gk_embed_plan_ints(T)));
    g->emb_count = (int *)calloc((size_t)g->vocab, sizeof(int));
    if (!g->emb_count) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    ALLOC(g->tgt, T, c);
    int chunks = (P + GK_CHUNK - 1) / GK_CHUNK, rchunks = (T + GK_COLSUM_ROWS - 1) / GK_COLSUM_ROWS;
    ALLOC(g->perm_cnt, (size_t)chunks * E + 1, c);
    ALLOC(g->perm_base, (size_t)chunks * E + 1, c);
    ALLOC(g->q32, (size_t)T * H * dqk, c);
    ALLOC(g->k32, (size_t)T * KV * dqk, c);
    ALLOC(g->delta, (size_t)T * H, c);
    ALLOC(g->rope_tab, (size_t)S * (g->rope / 2), c);
    {
        double *fr = (double *)malloc(sizeof(double) * (size_t)(g->rope / 2 + 1)), scale;
        if (!fr) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        mdl_rope_freqs(&g->m.attn, g->rope, fr, &scale);
        cudaError_t e = gk_rope_table(g->rope_tab, S, g->rope, fr, scale, g->s);
        free(fr);
        MOE_CUDA_CHECK(e);
    }
    MOE_CUDA_CHECK(gk_flash_prepare(g->dqk, g->dv));
    g->cudnn_attn = cfg->cudnn_attention;
    if (!cfg->cudnn_attention)
        snprintf(g->attn_why, sizeof g->attn_why, "%s",
#ifdef MOEPLAN_HAVE_CUDNN
                 "asked for"
#else
                 "this build has no cuDNN"
#endif
        );
    int widest = h > E ? h : E;
    if (g->mla) widest = widest > g->kv_lora + g->rope ? widest : g->kv_lora + g->rope;
    if (g->q_lora > widest) widest = g->q_lora;
    /* QK-norm's column sums over T * H rows of dqk, the q bias's over T rows of H * dqk */
    if ((g->qk_norm || g->attn_bias) && H * dqk > widest) widest = H * dqk;
    ALLOC(g->part, (size_t)rchunks * widest, c);
    ALLOC(g->ytmp, widest, c);
    ALLOC(g->dh, (size_t)T * h, c);
    ALLOC(g->dprev, (size_t)T * h, c);
    if (cfg->recompute) ALLOC(g->yscr, (size_t)T * h, c);
    ALLOC(g->da32, (size_t)T * h, c);
    ALLOC(g->db32, (size_t)T * h, c);
    ALLOC(g->dy16, (size_t)T * h, c);
    ALLOC(g->dh16, (size_t)T * h, c);
    ALLOC(g->do16, (size_t)T * H * dv, c);
    ALLOC(g->dq32, (size_t)T * H * dqk, c);
    ALLOC(g->dk32, (size_t)T * KV * dqk, c);
    ALLOC(g->dv32, (size_t)T * KV * dv, c);
    ALLOC(g->dq16, (size_t)T * H * dqk, c);
    ALLOC(g->dk16, (size_t)T * KV * dqk, c);
    ALLOC(g->dv16, (size_t)T * KV * dv, c);
    if (g->mla) {
        ALLOC(g->kv32, (size_t)T * H * (g->nope + dv), c);
        ALLOC(g->dqf16, (size_t)T * H * dqk, c);
        ALLOC(g->dkv16, (size_t)T * H * (g->nope + dv), c);
        ALLOC(g->dckvn32, (size_t)T * g->kv_lora, c);
        ALLOC(g->dckvf32, (size_t)T * (g->kv_lora + g->rope), c);
        ALLOC(g->dckvf16, (size_t)T * (g->kv_lora + g->rope), c);
        ALLOC(g->dcqn32, (size_t)T * g->q_lora, c);
        ALLOC(g->dcq32, (size_t)T * g->q_lora, c);
        ALLOC(g->dcq16, (size_t)T * g->q_lora, c);
    }
    if (fw) {
        ALLOC(g->dhm16, (size_t)T * fw, c);
        ALLOC(g->dg16, (size_t)T * fw, c);
        ALLOC(g->du16, (size_t)T * fw, c);
    }
    if (moe_any) {
        ALLOC(g->dw, P, c);
        ALLOC(g->dyp16, (size_t)g->Pe * h, c);
        ALLOC(g->dehm16, (size_t)g->Pe * g->ffn, c);
        ALLOC(g->deg16, (size_t)g->Pe * g->ffn, c);
        ALLOC(g->deu16, (size_t)g->Pe * g->ffn, c);
        ALLOC(g->dxg16, (size_t)g->Pe * h, c);
        ALLOC(g->dxu16, (size_t)g->Pe * h, c);
        ALLOC(g->dz, (size_t)T * E, c);
        ALLOC(g->ep_loads, (size_t)g->nmoe * E, c);
        if (cfg->ep) MOE_CHECK(gpu_ep_alloc(g, err));
        ALLOC(g->scores, (size_t)T * E, c);
        if (g->expert_bias) {
            ALLOC(g->ones16, g->Pe, c);
            bf16 *one = (bf16 *)malloc(sizeof(bf16) * (size_t)g->Pe);
            if (!one) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
            for (int i = 0; i < g->Pe; i++) one[i] = __float2bfloat16(1.0f);
            enum moe_status st = gpu_upload(g, g->ones16, one, sizeof(bf16) * (size_t)g->Pe, err);
            free(one);
            if (st != MOE_OK) return st;
        }
    }
    if (g->m.attn.qk_l2_norm) { /* Llama 4's QK norm has no weights: ones */
        ALLOC(g->ones32, dqk, c);
        float *one = (float *)malloc(sizeof(float) * (size_t)dqk);
        if (!one) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        for (int i = 0; i < dqk; i++) one[i] = 1.0f;
        enum moe_status st = gpu_upload(g, g->ones32, one, sizeof(float) * (size_t)dqk, err);
        free(one);
        if (st != MOE_OK) return st;
    }
    ALLOC(g->fin16, (size_t)T * h, c);
    ALLOC(g->rstdf, T, c);
    ALLOC(g->logits, (size_t)T * g->vocab, c);
    g->dlog16 = g->logits;
    ALLOC(g->row_loss, T, c);
    ALLOC(g->dfin32, (size_t)T * h, c);
    ALLOC(g->norm_part, GK_NORM_BLOCKS, c);
    MOE_CUDA_CHECK(cudaMallocHost((void **)&g->host_rows, sizeof(float) * (size_t)T));
    size_t fr, tot;
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    MOE_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    g->dev_total = (double)tot;
    g->peak_used = (double)(tot - fr);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_create(struct exec_gpu **out, const struct mdl_model *m,
                                           const struct exec_gpu_cfg *cfg, struct moe_error *err)
{
    *out = NULL;
    struct exec_gpu *g = (struct exec_gpu *)calloc(1, sizeof *g);
    if (!g) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    enum moe_status st = create(g, m, cfg, err);
    if (st != MOE_OK) {
        exec_gpu_destroy(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

extern "C" void exec_gpu_destroy(struct exec_gpu *g)
{
    if (!g) return;
    if (g->s) cudaStreamSynchronize(g->s);
    if (g->cast_s) cudaStreamSynchronize(g->cast_s);
    for (int i = 0; i < g->nallocs; i++) cudaFree(g->allocs[i]);
    for (int i = 0; i < g->ev_created; i++) cudaEventDestroy(g->ev[i]);
    if (g->off_host)
        for (int l = 0; l < (g->cfg.recompute ? 1 : g->layers); l++)
            if (g->off_host[l]) cudaFreeHost(g->off_host[l]);
    if (g->host_rows) cudaFreeHost(g->host_rows);
    if (g->choice_host) cudaFreeHost(g->choice_host);
    if (g->weight_host) cudaFreeHost(g->weight_host);
    for (int i = 0; g->epl && i < g->nmoe; i++) {
        exec_ep_rows_free(&g->epl[i].h1);
        exec_ep_rows_free(&g->epl[i].h2);
        free(g->epl[i].in1), free(g->epl[i].in2), free(g->epl[i].off);
    }
    free(g->epl);
    if (g->emb_host) cudaFreeHost(g->emb_host);
    free(g->emb_count);
    if (g->blas) cublasDestroy(g->blas);
    for (int i = 0; i < g->nlt; i++)
        if (g->lt_kinds[i].op) cublasLtMatmulDescDestroy(g->lt_kinds[i].op);
    gk_fp8_lt_destroy(g->f8lt);
    free(g->f8pre.qo);
    free(g->f8xd.qo);
    free(g->xt_set), free(g->xt.m[0].qo);
    exec_fp8_layout_free(&g->f8);
    if (g->lt) cublasLtDestroy(g->lt);
    for (int i = 0; i < g->nside; i++) {
        if (g->side_blas[i]) cublasDestroy(g->side_blas[i]);
        if (g->join_ev[i]) cudaEventDestroy(g->join_ev[i]);
        if (g->side[i]) cudaStreamDestroy(g->side[i]);
    }
    if (g->fork_ev) cudaEventDestroy(g->fork_ev);
    for (int p = 0; g->cast_ev && p < 2 * g->layers; p++)
        if (g->cast_ev[p]) cudaEventDestroy(g->cast_ev[p]);
    free(g->cast_ev), free(g->cast_waited);
    if (g->cast_in) cudaEventDestroy(g->cast_in);
    if (g->cast_s) cudaStreamDestroy(g->cast_s);
    if (g->s) {
        gk_cudnn_release(g->s); /* its plans, their buffers and its cuDNN handle */
        cudaStreamDestroy(g->s);
    }
    free(g->wi), free(g->moe_index), free(g->decay), free(g->off_host), free(g->xin), free(g->act);
    free(g->blk_off), free(g->gslice), free(g->gfresh);
    free(g->bias_host), free(g->counts), free(g->step_load);
    free(g);
}

extern "C" const struct exec_ref_model *exec_gpu_table(const struct exec_gpu *g)
{
    return &g->table;
}

/* ---- parameters ---------------------------------------------------------------------------- */

static enum moe_status refresh_bf16(struct exec_gpu *g, struct moe_error *err)
{
    MOE_CHECK(gpu_fp8_settle(g, err));
    MOE_CUDA_CHECK(gk_to_bf16(g->master, g->w16, g->table.nparams, g->s));
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    gpu_w16_changed(g, false);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_init(struct exec_gpu *g, uint64_t seed, struct moe_error *err)
{
    for (int i = 0; i < g->table.ntensors; i++) {
        const struct exec_tensor *t = &g->table.tensor[i];
        bool ones;
        float std = (float)exec_tensor_init_std(t->name, &ones);
        MOE_CUDA_CHECK(gk_init(g->master + t->offset, t->size, t->offset, seed, std, ones, g->s));
    }
    MOE_CUDA_CHECK(cudaMemsetAsync(g->m1, 0, g->mom_bytes * g->shard_n, g->s));
    MOE_CUDA_CHECK(cudaMemsetAsync(g->m2, 0, g->mom_bytes * g->shard_n, g->s));
    return refresh_bf16(g, err);
}

/* Host copies in pieces through one float buffer, on the executor's stream: it is a non-blocking
 * stream, which the legacy default stream of a plain cudaMemcpy does not order against (a
 * pageable host-to-device cudaMemcpy may return before its data lands). */
static enum moe_status copy_params(struct exec_gpu *g, float *dev, double *host, bool to_dev,
                                   struct moe_error *err)
{
    size_t n = g->table.nparams, piece = 1u << 24;
    float *buf = (float *)malloc(sizeof(float) * (n < piece ? n : piece));
    if (!buf) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    enum moe_status st = MOE_OK;
    for (size_t o = 0; o < n && st == MOE_OK; o += piece) {
        size_t c = n - o < piece ? n - o : piece;
        cudaError_t e;
        if (to_dev) {
            for (size_t i = 0; i < c; i++) buf[i] = (float)host[o + i];
            e = cudaMemcpyAsync(dev + o, buf, sizeof(float) * c, cudaMemcpyHostToDevice, g->s);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->s); /* buf is reused */
        } else {
            e = cudaMemcpyAsync(buf, dev + o, sizeof(float) * c, cudaMemcpyDeviceToHost, g->s);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->s);
            for (size_t i = 0; i < c; i++) host[o + i] = buf[i];
        }
        if (e != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_CUDA, "executor: copy of parameters: %s",
                               cudaGetErrorString(e));
    }
    free(buf);
    return st;
}

extern "C" enum moe_status exec_gpu_set_params(struct exec_gpu *g, const double *params,
                                               struct moe_error *err)
{
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    MOE_CHECK(copy_params(g, g->master, (double *)params, true, err));
    return refresh_bf16(g, err);
}

extern "C" enum moe_status exec_gpu_get_params(struct exec_gpu *g, double *params,
                                               struct moe_error *err)
{
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    return copy_params(g, g->master, params, false, err);
}

extern "C" enum moe_status exec_gpu_reduce_grads(struct exec_gpu *g, struct exec_transport *t,
                                                 struct moe_error *err)
{
    PH(COST_DP_GRAD_SYNC);
    size_t n = g->table.nparams, lo = g->blk_off[0], hi = g->blk_off[g->layers];
    MOE_CHECK(gpu_grads_settle(g, 0, n, err)); /* the blocks under way are settled */
    if (g->started && t == g->cfg.dp) { /* the blocks are under way: the rest, then the wait */
        MOE_CHECK(t->ops->allreduce_f32_start(t, g->grad, lo, g->s, err));
        MOE_CHECK(t->ops->allreduce_f32_start(t, g->grad + hi, n - hi, g->s, err));
        g->started = false;
        return t->ops->wait(t, err);
    }
    MOE_CHECK(gpu_sync_host(g, err));
    return t->ops->allreduce_sum_f32(t, g->grad, n, err);
}

extern "C" void *exec_gpu_stream(const struct exec_gpu *g)
{
    return g->s;
}

extern "C" size_t exec_gpu_state_floats(const struct exec_gpu *g)
{
    return g->shard_n;
}

extern "C" enum moe_status exec_gpu_get_state(struct exec_gpu *g, float *m1, float *m2,
                                              double *bias, struct moe_error *err)
{
    if (g->mom_bytes == sizeof(float)) {
        size_t n = sizeof(float) * g->shard_n;
        MOE_CUDA_CHECK(cudaMemcpyAsync(m1, g->m1, n, cudaMemcpyDeviceToHost, g->s));
        MOE_CUDA_CHECK(cudaMemcpyAsync(m2, g->m2, n, cudaMemcpyDeviceToHost, g->s));
        MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    } else { /* bf16 moments, widened exactly for the checkpoint */
        std::vector<bf16> h(g->shard_n);
        MOE_CUDA_CHECK(cudaStreamSynchronize(g->s)); /* the optimizer's last writes */
        for (int k = 0; k < 2; k++) {
            MOE_CUDA_CHECK(cudaMemcpy(h.data(), k ? g->m2 : g->m1, sizeof(bf16) * g->shard_n,
                                      cudaMemcpyDeviceToHost));
            float *o = k ? m2 : m1;
            for (size_t i = 0; i < g->shard_n; i++) o[i] = __bfloat162float(h[i]);
        }
    }
    memcpy(bias, g->bias_host, sizeof(double) * (size_t)g->layers * g->experts);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_set_state(struct exec_gpu *g, const float *m1, const float *m2,
                                              const double *bias, struct moe_error *err)
{
    if (g->mom_bytes == sizeof(float)) {
        size_t n = sizeof(float) * g->shard_n;
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->m1, m1, n, cudaMemcpyHostToDevice, g->s));
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->m2, m2, n, cudaMemcpyHostToDevice, g->s));
        MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    } else { /* a checkpoint's moments rounded to bf16 (exact for one written by bf16 moments) */
        std::vector<bf16> h(g->shard_n);
        MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
        for (int k = 0; k < 2; k++) {
            const float *in = k ? m2 : m1;
            for (size_t i = 0; i < g->shard_n; i++) h[i] = __float2bfloat16(in[i]);
            MOE_CHECK(gpu_upload(g, k ? g->m2 : g->m1, h.data(), sizeof(bf16) * g->shard_n, err));
        }
    }
    return exec_gpu_set_bias(g, bias, err);
}

extern "C" enum moe_status exec_gpu_get_grads(struct exec_gpu *g, double *grad,
                                              struct moe_error *err)
{
    MOE_CHECK(gpu_grads_settle(g, 0, g->table.nparams, err));
    MOE_CUDA_CHECK(cudaStreamSynchronize(g->s));
    return copy_params(g, g->grad, grad, false, err);
}

enum moe_status gpu_upload_bias(struct exec_gpu *g, struct moe_error *err)
{
    size_t n = (size_t)g->layers * g->experts;
    float *b = (float *)malloc(sizeof(float) * n);
    if (!b) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    for (size_t i = 0; i < n; i++) b[i] = (float)g->bias_host[i];
    cudaError_t e = cudaMemcpyAsync(g->bias, b, sizeof(float) * n, cudaMemcpyHostToDevice, g->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->s);
    free(b);
    MOE_CUDA_CHECK(e);
    return MOE_OK;
}

extern "C" enum moe_status exec_gpu_set_bias(struct exec_gpu *g, const double *bias,
                                             struct moe_error *err)
{
    memcpy(g->bias_host, bias, sizeof(double) * (size_t)g->layers * g->experts);
    return gpu_upload_bias(g, err);
}

/* ---- the step ------------------------------------------------------------------------------ */

extern "C" const char *exec_gpu_attention(const struct exec_gpu *g, char *buf, size_t cap)
{
    char v[64];
    if (g->cudnn_attn)
        snprintf(buf, cap, "cuDNN %s fused attention%s%s%s", gk_cudnn_version(v, sizeof v),
                 g->attn_nondet[0] ? " (its non-deterministic backward where " : "", g->attn_nondet,
                 g->attn_nondet[0] ? ")" : "");
    else
        snprintf(buf, cap, "moeplan's flash kernel (%s)", g->attn_why);
    return buf;
}
