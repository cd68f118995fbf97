/*
 * test_gpu_route.c: the GPU router against the CPU reference on the same fp32 inputs: every
 * choice equal, weights within 1e-5 relative (fp32 against double). Exits 77 without a GPU.
 */
#include "../unit/moe_test.h"

#include "exec.h"

#include <cuda_runtime.h>
#include <math.h>

/* The weights of choices ch (k) for logits z (E), in double, by the rule the router weighs its
 * own choices with */
static void weights_of(const struct exec_router_cfg *c, const double *z, const int *ch, double *w)
{
    int E = c->experts, k = c->top_k;
    double mx = -HUGE_VAL, sum = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, z[e]);
    for (int e = 0; e < E; e++) sum += exp(z[e] - mx);
    double wsum = 0;
    for (int j = 0; j < k; j++) {
        double v = z[ch[j]];
        w[j] = c->softmax_after_topk             ? v
               : c->scoring == MDL_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-v))
                                                 : exp(v - mx) / sum;
    }
    if (c->softmax_after_topk) {
        double m2 = -HUGE_VAL;
        for (int j = 0; j < k; j++) m2 = fmax(m2, w[j]);
        for (int j = 0; j < k; j++) wsum += (w[j] = exp(w[j] - m2));
        for (int j = 0; j < k; j++) w[j] /= wsum;
    } else if (c->norm_topk) {
        for (int j = 0; j < k; j++) wsum += w[j];
        for (int j = 0; j < k; j++) w[j] /= wsum;
    }
    for (int j = 0; j < k; j++) w[j] *= c->scaling;
}

static void check(struct exec_router_cfg cfg, int tokens, uint64_t seed, bool with_bias)
{
    int E = cfg.experts, k = cfg.top_k;
    size_t nz = (size_t)tokens * E, nk = (size_t)tokens * k;
    float *z = malloc(nz * sizeof *z), *bias = malloc((size_t)E * sizeof *bias);
    double *zd = malloc(nz * sizeof *zd), *bd = malloc((size_t)E * sizeof *bd);
    double *wref = malloc(nk * sizeof *wref);
    int *cref = malloc(nk * sizeof *cref), *cgpu = malloc(nk * sizeof *cgpu);
    float *wgpu = malloc(nk * sizeof *wgpu);
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    for (size_t i = 0; i < nz; i++) zd[i] = z[i] = (float)(2.0 * moe_rng_normal(&rng));
    for (int e = 0; e < E; e++) bd[e] = bias[e] = (float)(0.1 * moe_rng_normal(&rng));
    exec_ref_route(&cfg, zd, with_bias ? bd : NULL, tokens, cref, wref);
    float *dz, *db, *dw;
    int *dc;
    assert_int_equal(cudaMalloc((void **)&dz, nz * sizeof *dz), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&db, (size_t)E * sizeof *db), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dw, nk * sizeof *dw), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dc, nk * sizeof *dc), cudaSuccess);
    cudaMemcpy(dz, z, nz * sizeof *z, cudaMemcpyHostToDevice);
    cudaMemcpy(db, bias, (size_t)E * sizeof *bias, cudaMemcpyHostToDevice);
    struct moe_error err;
    assert_int_equal(exec_route(&cfg, dz, with_bias ? db : NULL, tokens, NULL, dc, dw, NULL, &err),
                     MOE_OK);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(cgpu, dc, nk * sizeof *cgpu, cudaMemcpyDeviceToHost);
    cudaMemcpy(wgpu, dw, nk * sizeof *wgpu, cudaMemcpyDeviceToHost);
    /* A token may differ only at a near-tie: every expert the GPU chose has a reference selection
     * key within 1e-5 of the reference's k-th key (fp32 against double rounding). */
    int near_ties = 0;
    double worst = 0.0;
    for (int t = 0; t < tokens; t++) {
        if (memcmp(cgpu + (size_t)t * k, cref + (size_t)t * k, sizeof(int) * (size_t)k) != 0) {
            double key[512], mx = -HUGE_VAL, sum = 0;
            const double *zt = zd + (size_t)t * E;
            for (int e = 0; e < E; e++) mx = fmax(mx, zt[e]);
            for (int e = 0; e < E; e++) sum += exp(zt[e] - mx);
            for (int e = 0; e < E; e++)
                key[e] = (cfg.scoring == MDL_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-zt[e]))
                                                           : exp(zt[e] - mx) / sum) +
                         (with_bias ? bd[e] : 0.0);
            double kth = key[cref[(size_t)t * k + k - 1]];
            for (int j = 0; j < k; j++)
                if (key[cgpu[(size_t)t * k + j]] < kth - 1e-5)
                    fail_msg("token %d: GPU chose expert %d, not a near-tie", t,
                             cgpu[(size_t)t * k + j]);
            near_ties++;
            continue;
        }
        for (int j = 0; j < k; j++) {
            size_t i = (size_t)t * k + j;
            double e = fabs(wgpu[i] - wref[i]) / fmax(fabs(wref[i]), 1e-30);
            worst = isnan(e) ? INFINITY : fmax(worst, e); /* fmax drops a NaN: keep it */
        }
    }
    printf("route E=%d k=%d groups=%d/%d tokens=%d: choices equal but %d near-tie tokens, worst "
           "weight error %.2e\n",
           E, k, cfg.topk_group, cfg.n_group, tokens, near_ties, worst);
    assert_true(near_ties <= tokens / 1000);
    assert_true(worst < 1e-5);
    /* forced choices (the reference's, each moved to the next expert): taken as they are, and
     * weighed by the same rule, within 1e-5 relative of the double weights */
    for (size_t i = 0; i < nk; i++) cref[i] = (cref[i] + 1) % E;
    int *df;
    assert_int_equal(cudaMalloc((void **)&df, nk * sizeof *df), cudaSuccess);
    cudaMemcpy(df, cref, nk * sizeof *cref, cudaMemcpyHostToDevice);
    assert_int_equal(exec_route(&cfg, dz, with_bias ? db : NULL, tokens, df, dc, dw, NULL, &err),
                     MOE_OK);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(cgpu, dc, nk * sizeof *cgpu, cudaMemcpyDeviceToHost);
    cudaMemcpy(wgpu, dw, nk * sizeof *wgpu, cudaMemcpyDeviceToHost);
    assert_memory_equal(cgpu, cref, nk * sizeof *cgpu);
    double fworst = 0.0, wt[512];
    for (int t = 0; t < tokens; t++) {
        weights_of(&cfg, zd + (size_t)t * E, cref + (size_t)t * k, wt);
        for (int j = 0; j < k; j++) {
            double e = fabs(wgpu[(size_t)t * k + j] - wt[j]) / fmax(fabs(wt[j]), 1e-30);
            fworst = isnan(e) ? INFINITY : fmax(fworst, e);
        }
    }
    printf("  forced choices: taken, worst weight error %.2e\n", fworst);
    assert_true(fworst < 1e-5);
    cudaFree(df);
    cudaFree(dz);
    cudaFree(db);
    cudaFree(dw);
    cudaFree(dc);
    free(z), free(bias), free(zd), free(bd), free(wref), free(cref), free(cgpu), free(wgpu);
}

static void test_route(void **state)
{
    (void)state;
    check((struct exec_router_cfg){256, 8, MDL_SCORE_SIGMOID, 8, 4, true, false, 2.5, 0.0}, 4096, 1,
          true);
    check((struct exec_router_cfg){128, 8, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0}, 4096, 2,
          false);
    check((struct exec_router_cfg){8, 2, MDL_SCORE_SOFTMAX, 1, 1, false, true, 1.0, 0.0}, 4096, 3,
          false);
    check((struct exec_router_cfg){64, 6, MDL_SCORE_SOFTMAX, 1, 1, false, false, 1.0, 0.0}, 4096, 4,
          false);
    check((struct exec_router_cfg){16, 16, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0}, 1024, 5,
          false);
    struct exec_router_cfg bad = {1024, 8, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0};
    struct moe_error err;
    assert_int_equal(exec_route(&bad, NULL, NULL, 1, NULL, NULL, NULL, NULL, &err), MOE_ERR_INPUT);
}

int main(void)
{
    int n = 0;
    if (exec_device_count(&n, NULL) != MOE_OK || n == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_route)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
