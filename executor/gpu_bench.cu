/*
 * gpu_bench.cu: the MoE layer benchmark (moeplan bench moe, calibrate's expert block): the
 * expert block alone, the whole layer and a dense ceiling of the same FLOPs, forward and
 * backward, with a seeded routing forced into the router's place.
 */
#include "gpu.h"

#include <nvtx3/nvToolsExt.h>

/* What bench_time times: the whole layer, the dense chain, the expert block's forward, its
 * backward (after an untimed forward), its forward again behind a busy GPU */
enum bench_what { B_LAYER, B_DENSE, B_FWD, B_BWD, B_FWD_BUSY };
/* Median time of `iters` runs of `what`, each bracketed by events on the main stream. The
 * block's forward (B_FWD) starts on an idle GPU, as a step's does after the router's
 * device-to-host wait: the host's launches (hundreds for many small experts) are part of its
 * time. Everything else is queued behind BENCH_HEAD_US of a busy GPU, as a step's backward is
 * queued behind the work before it: the GPU's time, not the host's. The forward so too
 * (B_FWD_BUSY) is shorter where the GPU waited for the host's launches, and where the spinning
 * head let a power-capped GPU's clocks recover: on an H100 (results/issue26/s13) 3-10% shorter
 * in bf16 and fp8 alike, at shapes of a few long GEMMs, the power cap active in 89% of the
 * samples. */
#define BENCH_HEAD_US 20000.0
/* Each timed run is an NVTX range named by what it times and the precision (no cost without a
 * profiler attached): `ncu --nvtx --nvtx-include "block forward fp8/" --nvtx-include "block
 * backward fp8/"` profiles the fp8 block alone. */
static const char *const bench_range[] = {"layer", "dense", "block forward", "block backward",
                                          "busy forward"};
static enum moe_status bench_time(struct exec_gpu *g, enum bench_what what, int *dense_off,
                                  int iters, double *ms, int *syncs, struct moe_error *err)
{
    struct act *A = &g->act[0];
    double *t = (double *)calloc((size_t)iters, sizeof(double));
    cudaEvent_t a, b;
    if (!t) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    MOE_CUDA_CHECK(cudaEventCreate(&a));
    MOE_CUDA_CHECK(cudaEventCreate(&b));
    enum moe_status st = MOE_OK;
    for (int i = 0; i < iters && st == MOE_OK; i++) {
        int s0 = g->syncs;
        g->nev = MAX_EVENTS; /* no phase events inside the benchmark */
        gpu_grads_fresh(g);  /* each iteration a step's first micro-batch: gradients written */
        if (what == B_BWD) st = gpu_experts_forward(g, 0, A, g->off_host[0], err);
        cudaError_t e = what == B_FWD ? cudaSuccess : gk_busy_wait(BENCH_HEAD_US, g->s);
        if (e == cudaSuccess) e = cudaEventRecord(a, g->s);
        if (e != cudaSuccess || st != MOE_OK) {
            if (st == MOE_OK)
                st = moe_error_set(err, MOE_ERR_CUDA, "benchmark: %s", cudaGetErrorString(e));
            break;
        }
        char range[64];
        snprintf(range, sizeof range, "%s %s", bench_range[what],
                 cost_precision_names[g->cfg.precision]);
        nvtxRangePushA(range);
        if (what == B_FWD || what == B_FWD_BUSY) {
            st = gpu_experts_forward(g, 0, A, g->off_host[0], err);
        } else if (what == B_BWD) {
            st = gpu_experts_backward(g, 0, A, g->off_host[0], err);
        } else if (what == B_LAYER) {
            st = gpu_moe_forward(g, 0, A, g->xin[1], err);
            if (st == MOE_OK) {
                e = gk_to_bf16(g->dh, g->dy16, (size_t)g->tokens * g->hidden, g->s);
                st = e == cudaSuccess
                         ? gpu_moe_backward(g, 0, A, err)
                         : moe_error_set(err, MOE_ERR_CUDA, "benchmark: %s", cudaGetErrorString(e));
            }
        } else {
            st = gpu_experts_forward(g, 0, A, dense_off, err);
            if (st == MOE_OK) st = gpu_experts_backward(g, 0, A, dense_off, err);
        }
        nvtxRangePop();
        e = cudaEventRecord(b, g->s);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        float f = 0.0f;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&f, a, b);
        if (e != cudaSuccess && st == MOE_OK)
            st = moe_error_set(err, MOE_ERR_CUDA, "benchmark: %s", cudaGetErrorString(e));
        t[i] = f;
        *syncs = g->syncs - s0;
    }
    *ms = moe_median(t, (size_t)iters);
    free(t);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return st;
}

const char *const exec_bench_sample_names[EXEC_BENCH_SAMPLES] = {
    "experts' outputs", "input gradient", "gate weight gradient", "down weight gradient"};

/* *n values spread evenly over the `total` floats at d (every total / *n-th; all of them where
 * there are fewer than EXEC_BENCH_SAMPLE) into h */
static enum moe_status bench_sample(const float *d, size_t total, float *h, int *n,
                                    struct moe_error *err)
{
    size_t m = total < EXEC_BENCH_SAMPLE ? total : EXEC_BENCH_SAMPLE;
    *n = (int)m;
    if (!m) return MOE_OK;
    MOE_CUDA_CHECK(cudaMemcpy2D(h, sizeof(float), d, total / m * sizeof(float), sizeof(float), m,
                                cudaMemcpyDeviceToHost));
    return MOE_OK;
}

/* The benchmark's inputs on the GPU: the forced routing, seeded activations and gradients. */
static enum moe_status bench_inputs(struct exec_gpu *g, const int *choice, size_t th, uint64_t seed,
                                    struct moe_error *err)
{
    struct act *A = &g->act[0];
    MOE_CHECK(exec_gpu_force_routing(g, choice, err));
    g->record_stats = true;
    g->grad_scale = 1.0;
    MOE_CUDA_CHECK(gk_init(A->b32, th, 0, seed + 1, 1.0f, false, g->s));
    MOE_CUDA_CHECK(gk_to_bf16(A->b32, A->b16, th, g->s));
    MOE_CUDA_CHECK(gk_init(g->dh, th, 0, seed + 2, 1.0f, false, g->s));
    return MOE_OK;
}

extern "C" enum moe_status exec_moe_bench(const struct exec_moe_bench_cfg *c, int *choice,
                                          struct exec_moe_bench_result *r, struct moe_error *err)
{
    memset(r, 0, sizeof *r);
    if (c->experts < 1 || c->top_k < 1 || c->top_k > c->experts || c->tokens < 1 || c->hidden < 1 ||
        c->ffn < 1 || c->iters < 1 || c->warmup < 0)
        return moe_error_set(err, MOE_ERR_INPUT, "bench moe: inconsistent shape");
    struct mdl_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "bench-moe");
    m.layers = 1;
    m.moe_every = 1;
    m.hidden = c->hidden;
    m.vocab = 256;
    m.norm_eps = 1e-6;
    m.max_seq_len = 1;
    m.attn.type = MDL_ATTN_GQA;
    m.attn.heads = m.attn.kv_heads = 1;
    m.attn.head_dim = 16;
    m.attn.rope_theta = 10000;
    m.moe.experts = c->experts;
    m.moe.top_k = c->top_k;
    m.moe.intermediate = c->ffn;
    m.moe.scoring = MDL_SCORE_SOFTMAX;
    m.moe.n_group = m.moe.topk_group = 1;
    m.moe.norm_topk = true;
    m.moe.scaling = 1.0;
    /* seeded skewed routing: expert probabilities from Dirichlet(skew), then each token draws
     * top_k distinct experts in proportion to them */
    int E = c->experts, k = c->top_k, T = c->tokens;
    double *p = (double *)malloc(sizeof(double) * E), *q = (double *)malloc(sizeof(double) * E);
    if (!p || !q) {
        free(p), free(q);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    struct moe_rng rng;
    moe_rng_seed(&rng, c->seed);
    if (c->skew > 0)
        moe_rng_dirichlet(&rng, c->skew, p, (size_t)E);
    else
        for (int e = 0; e < E; e++) p[e] = 1.0 / E;
    for (int t = 0; t < T; t++) {
        memcpy(q, p, sizeof(double) * E);
        for (int j = 0; j < k; j++) {
            double sum = 0.0, u;
            for (int e = 0; e < E; e++) sum += q[e];
            u = moe_rng_uniform(&rng) * sum;
            int e = 0;
            while (e < E - 1 && (u -= q[e]) >= 0) e++;
            while (q[e] == 0.0) e = (e + 1) % E; /* rounding at the end of the range */
            choice[(size_t)t * k + j] = e;
            q[e] = 0.0;
        }
    }
    free(p), free(q);
    /* T sequences of one token: the layer sees T tokens, attention's workspace stays tiny */
    struct exec_gpu_cfg cfg; /* by name (C++17 has no designated initializers) */
    memset(&cfg, 0, sizeof cfg);
    cfg.seq = 1;
    cfg.mbs = T;
    cfg.streams = c->streams;
    cfg.precision = c->precision;
    cfg.fp8_e5m2_grads = cost_precision_e5m2_grads(c->precision); /* as `run` trains the recipe */
    struct exec_gpu *g = NULL;
    int dense_off[GK_MAX_EXPERTS + 1];
    enum moe_status st = exec_gpu_create(&g, &m, &cfg, err);
    if (st == MOE_OK) st = exec_gpu_init(g, c->seed, err);
    size_t th = (size_t)T * c->hidden;
    if (st == MOE_OK) st = bench_inputs(g, choice, th, c->seed, err);
    if (st == MOE_OK) {
        dense_off[0] = 0;
        for (int e = 1; e <= E; e++) dense_off[e] = T * k;
        int syncs = 0;
        double ms;
        /* warm-up (allocations, cuBLAS heuristics), then the measurements: the forward from an
         * idle GPU, behind a busy one where asked, the backward, the layer */
        for (int i = 0; i < (c->warmup > 1 ? c->warmup : 1) && st == MOE_OK; i++)
            st = bench_time(g, B_LAYER, dense_off, 1, &ms, &syncs, err);
        if (st == MOE_OK)
            st = bench_time(g, B_FWD, dense_off, c->iters, &r->block_fwd_ms, &syncs, err);
        if (st == MOE_OK && c->fwd_busy)
            st = bench_time(g, B_FWD_BUSY, dense_off, c->iters, &r->block_fwd_busy_ms, &syncs, err);
        if (st == MOE_OK)
            st = bench_time(g, B_BWD, dense_off, c->iters, &r->block_bwd_ms, &syncs, err);
        r->block_ms = r->block_fwd_ms + r->block_bwd_ms;
        if (st == MOE_OK)
            st = bench_time(g, B_LAYER, dense_off, c->iters, &r->layer_ms, &r->host_syncs, err);
        size_t R = (size_t)T * k, ef = (size_t)E * c->ffn * c->hidden;
        const int *w = g->wi[0];
        const float *from[EXEC_BENCH_SAMPLES] = {g->act[0].yp32, g->db32, GR(g, w[W_GATE]),
                                                 GR(g, w[W_DOWN])};
        size_t len[EXEC_BENCH_SAMPLES] = {R * c->hidden, th, ef, ef};
        for (int i = 0; i < EXEC_BENCH_SAMPLES && st == MOE_OK; i++)
            st = bench_sample(from[i], len[i], r->sample[i], &r->nsample[i], err);
        /* the dense chain takes the permuted rows in bf16, which a permute that quantized them
         * (gpu_fp8_dispatch) did not write */
        if (st == MOE_OK && gpu_fp8_dispatch_ok(g, 0, &g->act[0])) {
            cudaError_t e = gk_gather(g->act[0].b16, g->act[0].row_src, k, T * k, c->hidden,
                                      g->act[0].xp16, NULL, g->s);
            if (e != cudaSuccess)
                st = moe_error_set(err, MOE_ERR_CUDA, "benchmark: %s", cudaGetErrorString(e));
        }
        for (int i = 0; i < c->warmup && st == MOE_OK; i++)
            st = bench_time(g, B_DENSE, dense_off, 1, &ms, &syncs, err);
        if (st == MOE_OK)
            st = bench_time(g, B_DENSE, dense_off, c->iters, &r->dense_ms, &syncs, err);
        const int *off = g->off_host[0];
        double mx = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, (double)(off[e + 1] - off[e]));
        r->max_over_mean = mx / ((double)T * k / E);
        double Rd = (double)R, h = c->hidden, f = c->ffn;
        r->block_flops = 18.0 * Rd * h * f;
        r->layer_flops = r->block_flops + 6.0 * T * h * E;
        /* what one MoE layer keeps for its backward: router input and logits, routing, permuted
         * rows, gate/up outputs, SwiGLU output, expert outputs */
        r->layer_bytes = th * (4.0 + 2.0) + (double)T * E * 4 + Rd * 4 * 4 + Rd * h * 2 +
                         Rd * f * 2 * 2 + Rd * f * 2 + Rd * h * 4;
    }
    exec_gpu_destroy(g);
    return st;
}
