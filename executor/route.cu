/*
 * route.cu: the router's top-k on the GPU: scores, selection bias, group-limited top-k, weights.
 *
 * One thread per token, the same rule as the CPU reference (ref_moe.c) in fp32, so that every
 * choice matches the reference and the weights match to fp32 rounding. A fused, warp-per-token
 * version comes with the executor's speed work; this one is the correct baseline.
 */
#include "exec_gpu.h"

#include <cuda_runtime.h>

#define ROUTE_MAX_EXPERTS 512

__global__ void exec_route_kernel(struct exec_router_cfg cfg, const float *logits,
                                  const float *bias, int tokens, const int *forced, int *choice,
                                  float *weight)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const int E = cfg.experts, k = cfg.top_k, G = cfg.n_group, per = E / G;
    const float *z = logits + (size_t)t * E;
    float s[ROUTE_MAX_EXPERTS], key[ROUTE_MAX_EXPERTS];
    unsigned char eligible[ROUTE_MAX_EXPERTS];
    if (cfg.scoring == MDL_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-z[e]));
    } else {
        float mx = z[0], sum = 0.0f;
        for (int e = 1; e < E; e++) mx = fmaxf(mx, z[e]);
        for (int e = 0; e < E; e++) sum += (s[e] = expf(z[e] - mx));
        for (int e = 0; e < E; e++) s[e] /= sum;
    }
    for (int e = 0; e < E; e++) {
        key[e] = s[e] + (bias ? bias[e] : 0.0f);
        eligible[e] = 1;
    }
    if (G > 1 && cfg.topk_group < G) {
        unsigned char keep[ROUTE_MAX_EXPERTS];
        float gkey[ROUTE_MAX_EXPERTS];
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (key[e] > a)
                    b = a, a = key[e];
                else if (key[e] > b)
                    b = key[e];
            }
            gkey[g] = per >= 2 ? a + b : a;
            keep[g] = 0;
        }
        for (int n = 0; n < cfg.topk_group; n++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gkey[g] > gkey[best])) best = g;
            keep[best] = 1;
        }
        for (int e = 0; e < E; e++) eligible[e] = keep[e / per];
    }
    int *ch = choice + (size_t)t * k;
    float *w = weight + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        if (forced) {
            best = forced[(size_t)t * k + j];
        } else {
            for (int e = 0; e < E; e++)
                if (eligible[e] && (best < 0 || key[e] > key[best])) best = e;
        }
        ch[j] = best;
        eligible[best] = 0;
    }
    if (cfg.softmax_after_topk) {
        float mx = z[ch[0]], sum = 0.0f;
        for (int j = 1; j < k; j++) mx = fmaxf(mx, z[ch[j]]);
        for (int j = 0; j < k; j++) sum += (w[j] = expf(z[ch[j]] - mx));
        for (int j = 0; j < k; j++) w[j] /= sum;
    } else {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += (w[j] = s[ch[j]]);
        if (cfg.norm_topk)
            for (int j = 0; j < k; j++) w[j] /= sum;
    }
    for (int j = 0; j < k; j++) w[j] *= (float)cfg.scaling;
}

extern "C" enum moe_status exec_route(const struct exec_router_cfg *cfg, const float *logits,
                                      const float *bias, int tokens, const int *forced, int *choice,
                                      float *weight, void *stream, struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    if (cfg->experts < 1 || cfg->experts > ROUTE_MAX_EXPERTS || cfg->top_k < 1 ||
        cfg->top_k > cfg->experts || cfg->n_group < 1 || cfg->experts % cfg->n_group)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "exec_route: %d experts top-%d (at most %d experts)", cfg->experts,
                             cfg->top_k, ROUTE_MAX_EXPERTS);
    if (tokens == 0) return MOE_OK;
    int threads = 128, blocks = (tokens + threads - 1) / threads;
    exec_route_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*cfg, logits, bias, tokens,
                                                                    forced, choice, weight);
    MOE_CUDA_GOTO(cudaGetLastError(), st, cleanup);
cleanup:
    return st;
}
