/*
 * test_ref_moe.c: the CPU reference MoE layer against finite differences (double precision), and
 * its routing and dropless permutation on cases counted by hand.
 */
#include "exec.h" /* before moe_test.h: its layer helper needs exec.h */

#include "moe_test.h"

#include <math.h>

static double loss(const struct moe_test_layer *L, const double *x, int T, const double *dy,
                   int *choice)
{
    double *y = calloc((size_t)T * L->w.hidden, sizeof *y);
    struct moe_error err;
    assert_int_equal(exec_ref_moe_forward(&L->w, x, T, y, choice, NULL, &err), MOE_OK);
    double l = 0;
    for (int i = 0; i < T * L->w.hidden; i++) l += dy[i] * y[i];
    free(y);
    return l + exec_ref_moe_aux_loss(&L->w, x, T);
}

/* Central differences for every parameter and input element; entries whose perturbation flips
 * the top-k choice (a kink) are skipped and counted. Tolerance: 1e-6 relative + 1e-8 absolute. */
static void check_gradients_as(struct exec_router_cfg cfg, int fs, uint64_t seed, double limit)
{
    int h = 6, f = 4, T = 5;
    enum { NP = MOE_TEST_LAYER_PARAMS };
    struct moe_test_layer L;
    moe_test_layer_init(&L, cfg, h, f, fs, seed);
    if (limit > 0) moe_test_layer_gpt_oss(&L, limit, seed + 50);
    struct moe_rng rng;
    moe_rng_seed(&rng, seed + 100);
    double x[30], dy[30], dx[30];
    for (int i = 0; i < T * h; i++) x[i] = moe_rng_normal(&rng), dy[i] = moe_rng_normal(&rng);
    struct exec_ref_moe_grad g;
    double *gp[NP];
    for (int i = 0; i < NP; i++) gp[i] = calloc(L.sizes[i] ? L.sizes[i] : 1, sizeof(double));
    g.router = gp[0], g.gate = gp[1], g.up = gp[2], g.down = gp[3], g.sgate = gp[4], g.sup = gp[5],
    g.sdown = gp[6], g.router_b = gp[7], g.gate_b = gp[8], g.up_b = gp[9], g.down_b = gp[10];
    struct moe_error err;
    assert_int_equal(exec_ref_moe_backward(&L.w, x, T, dy, dx, &g, &err), MOE_OK);
    if (limit > 0) { /* both sides of both clamps are reached */
        int over_g = 0, over_u = 0, n = 0;
        for (int t = 0; t < T; t++)
            for (int e = 0; e < cfg.experts; e++)
                for (int i = 0; i < f; i++, n++) {
                    double gv = L.w.gate_b[e * f + i], uv = L.w.up_b[e * f + i];
                    for (int c = 0; c < h; c++) {
                        gv += L.w.gate[((size_t)e * f + i) * h + c] * x[t * h + c];
                        uv += L.w.up[((size_t)e * f + i) * h + c] * x[t * h + c];
                    }
                    over_g += gv > limit;
                    over_u += fabs(uv) > limit;
                }
        printf("clamped: gate %d, up %d of %d\n", over_g, over_u, n);
        assert_true(over_g > n / 10 && over_g < n - n / 10 && over_u > n / 10 &&
                    over_u < n - n / 10);
    }
    int base_choice[64], c1[64], c2[64];
    loss(&L, x, T, dy, base_choice);
    const double eps = 1e-6;
    int checked = 0, skipped = 0;
    for (int p = 0; p <= NP; p++) {
        double *v = p < NP ? L.params[p] : x;
        size_t n = p < NP ? L.sizes[p] : (size_t)T * h;
        const double *an = p < NP ? gp[p] : dx;
        for (size_t j = 0; j < n; j++) {
            double keep = v[j];
            v[j] = keep + eps;
            double lp = loss(&L, x, T, dy, c1);
            v[j] = keep - eps;
            double lm = loss(&L, x, T, dy, c2);
            v[j] = keep;
            if (memcmp(c1, base_choice, sizeof(int) * (size_t)(T * cfg.top_k)) ||
                memcmp(c2, base_choice, sizeof(int) * (size_t)(T * cfg.top_k))) {
                skipped++;
                continue;
            }
            double num = (lp - lm) / (2 * eps);
            if (!(fabs(num - an[j]) <= 1e-6 * fabs(num) + 1e-8))
                fail_msg("param block %d entry %zu: analytic %.10g, numeric %.10g", p, j, an[j],
                         num);
            checked++;
        }
    }
    printf("routing k=%d of %d%s: %d gradient entries checked, %d skipped at a top-k kink\n",
           cfg.top_k, cfg.experts, limit > 0 ? " (gpt-oss biases, clamped SwiGLU)" : "", checked,
           skipped);
    assert_true(checked > 300);
    assert_true(skipped < checked / 50);
    for (int i = 0; i < NP; i++) free(gp[i]);
    moe_test_layer_free(&L);
}

static void check_gradients(struct exec_router_cfg cfg, int fs, uint64_t seed)
{
    check_gradients_as(cfg, fs, seed, 0.0);
}

/* gpt-oss's layer: router and expert biases, the clamped SwiGLU with a limit of 0.8 (the layer's
 * gate and up values, of std about 1.3, fall on both sides of it: counted in check_gradients_as),
 * softmax after the top-2 of 8. */
static void test_gpt_oss_layer(void **state)
{
    (void)state;
    struct exec_router_cfg cfg = {8, 2, MDL_SCORE_SOFTMAX, 1, 1, false, true, 1.0, 0.0};
    check_gradients_as(cfg, 0, 11, 0.8);
}

static void test_gradients(void **state)
{
    (void)state;
    /* Qwen3-like: softmax, normalized top-2 of 8 */
    check_gradients((struct exec_router_cfg){8, 2, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0},
                    0, 1);
    /* DeepSeek-V3-like: sigmoid, 4 groups of 2, top-2 groups, normalized top-3, scale 2.5,
     * selection bias, a shared expert */
    check_gradients((struct exec_router_cfg){8, 3, MDL_SCORE_SIGMOID, 4, 2, true, false, 2.5, 0.0},
                    5, 2);
    /* Mixtral / gpt-oss: softmax over the chosen two logits */
    check_gradients((struct exec_router_cfg){8, 2, MDL_SCORE_SOFTMAX, 1, 1, false, true, 1.0, 0.0},
                    0, 3);
    /* DeepSeek-V2-Lite: softmax, not normalized, shared experts */
    check_gradients((struct exec_router_cfg){8, 3, MDL_SCORE_SOFTMAX, 1, 1, false, false, 1.0, 0.0},
                    7, 4);
    /* Llama 4: sigmoid top-1 and a shared expert */
    check_gradients((struct exec_router_cfg){8, 1, MDL_SCORE_SIGMOID, 1, 1, false, false, 1.0, 0.0},
                    4, 5);
    /* top_k equal to the number of experts */
    check_gradients((struct exec_router_cfg){4, 4, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0},
                    0, 6);
    /* the load-balance loss, softmax after top-k (Mixtral) and sigmoid groups (DeepSeek-V3) */
    check_gradients((struct exec_router_cfg){8, 2, MDL_SCORE_SOFTMAX, 1, 1, false, true, 1.0, 0.05},
                    0, 7);
    check_gradients((struct exec_router_cfg){8, 3, MDL_SCORE_SIGMOID, 4, 2, true, false, 2.5, 0.05},
                    5, 8);
}

static void test_routing_by_hand(void **state)
{
    (void)state;
    /* 8 experts in 4 groups of 2, sigmoid, top-2 groups, top-3, normalized, scale 2. Logits of 0
     * give scores 0.5; the bias decides: group keys (sum of both) are g0 1.0+0.1, g1 1.0+0.9,
     * g2 1.0+0.5, g3 1.0: groups 1 and 2 stay; best keys there: e3 (0.5+0.8), e4 (0.5+0.4),
     * e2 (0.5+0.1) -- e5's bias 0.1 ties e2 and loses on the higher id. */
    struct exec_router_cfg cfg = {8, 3, MDL_SCORE_SIGMOID, 4, 2, true, false, 2.0, 0.0};
    double z[8] = {0}, bias[8] = {0.1, 0.0, 0.1, 0.8, 0.4, 0.1, 0.0, 0.0};
    int choice[3];
    double w[3];
    exec_ref_route(&cfg, z, bias, 1, choice, w);
    assert_int_equal(choice[0], 3);
    assert_int_equal(choice[1], 4);
    assert_int_equal(choice[2], 2);
    /* weights come from the scores, not the bias: 0.5 each, normalized to 1/3, times 2 */
    for (int j = 0; j < 3; j++) assert_true(fabs(w[j] - 2.0 / 3.0) < 1e-15);
    /* softmax over the chosen: logits 2 and 1 chosen of 8 -> e^1/(e^1+1), 1/(e+1) */
    struct exec_router_cfg mx = {8, 2, MDL_SCORE_SOFTMAX, 1, 1, false, true, 1.0, 0.0};
    double z2[8] = {0, 2, 0, 1, -1, 0, 0, 0};
    exec_ref_route(&mx, z2, NULL, 1, choice, w);
    assert_int_equal(choice[0], 1);
    assert_int_equal(choice[1], 3);
    assert_true(fabs(w[0] - exp(1.0) / (exp(1.0) + 1.0)) < 1e-15);
}

/* Dropless: one expert gets every token, others none; the permutation keeps every pair. */
static void test_dropless(void **state)
{
    (void)state;
    struct exec_router_cfg cfg = {8, 2, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0};
    struct moe_test_layer L;
    moe_test_layer_init(&L, cfg, 6, 4, 0, 9);
    for (int e = 0; e < 8; e++) L.w.bias[e] = e == 3 ? 100.0 : e == 6 ? 50.0 : 0.0;
    int T = 7, choice[14], offsets[9], rows[14];
    double x[42], y[42], w[14];
    struct moe_rng rng;
    moe_rng_seed(&rng, 1);
    for (int i = 0; i < 42; i++) x[i] = moe_rng_normal(&rng);
    struct moe_error err;
    assert_int_equal(exec_ref_moe_forward(&L.w, x, T, y, choice, w, &err), MOE_OK);
    exec_ref_permute(choice, T, 2, 8, offsets, rows);
    assert_int_equal(offsets[3], 0);
    assert_int_equal(offsets[4] - offsets[3], 7); /* expert 3: every token */
    assert_int_equal(offsets[7] - offsets[6], 7); /* expert 6: every token */
    assert_int_equal(offsets[8], 14);
    for (int e = 0; e < 8; e++)
        if (e != 3 && e != 6) assert_int_equal(offsets[e + 1] - offsets[e], 0);
    /* tokens keep their order within an expert */
    for (int i = offsets[3]; i + 1 < offsets[4]; i++) assert_true(rows[i] / 2 < rows[i + 1] / 2);
    /* every (token, slot) appears once */
    int seen[14] = {0};
    for (int i = 0; i < 14; i++) seen[rows[i]]++;
    for (int i = 0; i < 14; i++) assert_int_equal(seen[i], 1);
    /* the weights are still the scores' (bias only selects): they sum to 1 per token */
    for (int t = 0; t < T; t++) assert_true(fabs(w[2 * t] + w[2 * t + 1] - 1.0) < 1e-12);
    moe_test_layer_free(&L);
    struct exec_ref_moe bad = L.w;
    bad.cfg.top_k = 9;
    assert_int_equal(exec_ref_moe_forward(&bad, x, T, y, NULL, NULL, &err), MOE_ERR_INPUT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_gpt_oss_layer),
        cmocka_unit_test(test_routing_by_hand),
        cmocka_unit_test(test_dropless),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
