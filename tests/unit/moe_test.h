/*
 * moe_test.h: what every cmocka test program of moeplan includes.
 *
 * cmocka needs these system headers before its own; keeping the order in one place avoids
 * a copy in every test file.
 */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one comparison of computed values against a reference, in every test. Element i is wrong
 * unless both values are finite and |got - ref| <= atol + rtol |ref_i|: written so that a NaN or
 * an infinity anywhere fails (`err > tol` alone is false for a NaN and lets it pass). Prints one
 * line (the worst error, #wrong out of n, as nccl-tests counts) and the first wrong elements with
 * their index. Returns the number wrong; moe_expect_near fails the test when it is not 0. */
static inline size_t moe_count_wrong(const char *what, const double *got, const double *ref,
                                     size_t n, double rtol, double atol)
{
    size_t wrong = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - ref[i]);
        bool ok = isfinite(got[i]) && isfinite(ref[i]) && err <= atol + rtol * fabs(ref[i]);
        if (isfinite(err) && err > worst) worst = err;
        if (ok) continue;
        if (wrong < 5)
            printf("  %s[%zu]: got %.10g, reference %.10g (error %.3g, allowed %.3g)\n", what, i,
                   got[i], ref[i], err, atol + rtol * fabs(ref[i]));
        wrong++;
    }
    printf("%-32s max error %.3g; #wrong %zu of %zu (rtol %.0e, atol %.3g)\n", what, worst, wrong,
           n, rtol, atol);
    return wrong;
}

static inline void moe_expect_near(const char *what, const double *got, const double *ref, size_t n,
                                   double rtol, double atol)
{
    size_t wrong = moe_count_wrong(what, got, ref, n, rtol, atol);
    if (wrong) fail_msg("%s: %zu of %zu elements wrong", what, wrong, n);
}

/* The largest |v_i| (NaN if any is NaN): tolerances "a share of the largest value" use it. */
static inline double moe_max_abs(const double *v, size_t n)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(v[i])) return NAN;
        if (fabs(v[i]) > mx) mx = fabs(v[i]);
    }
    return mx;
}

/* moe_expect_near with the tolerance a share of the reference's largest value: every element
 * within tol x max |ref| (for results whose small elements carry no meaning of their own). */
static inline void moe_expect_close(const char *what, const double *got, const double *ref,
                                    size_t n, double tol)
{
    moe_expect_near(what, got, ref, n, 0.0, tol * moe_max_abs(ref, n));
}

/* A path under the source tree, for shipped and test files. */
static inline const char *moe_test_src(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", MOEPLAN_SOURCE_DIR, rel);
    return buf;
}

#ifdef MDL_H
/* A shipped model by name (model/NAME.json); fails the test when it does not load. */
static inline void moe_test_model(const char *name, struct mdl_model *m)
{
    char dir[1024];
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    if (mdl_model_resolve(m, name, dir, &err) != MOE_OK) fail_msg("%s", err.message);
}

/* tiny-moe-gqa changed to reach the model's other code paths (the reference's and the GPU step's
 * tests share them): MOE_TEST_DENSE_TIED a dense SwiGLU block first and tied embeddings;
 * MOE_TEST_SLIDING_SIGMOID a sliding window of `window` on every other block, a shared expert,
 * sigmoid group-limited routing with scaling; MOE_TEST_MIXTRAL softmax after the top-k;
 * MOE_TEST_GPT_OSS gpt-oss's blocks: sliding window of `window` on every other block, attention
 * sinks and biases, YaRN RoPE (factor 4 over 4 positions, so that the short test sequences reach
 * its blend), expert and router biases, the clamped SwiGLU at gpt-oss's alpha and limit (7, which
 * the test models' small activations do not reach: the clamps' cut is checked where both sides
 * round alike, in test_ref_moe's finite differences and test_gpu_kernels' clamped SwiGLU; in a
 * whole step, bf16 against double moves values near the limit across it), softmax after the
 * top-k; MOE_TEST_LLAMA4 Llama 4's: block 0 dense with RoPE, the weightless QK norm after it and
 * chunked attention (chunks of `window`), block 1 MoE (top-1 sigmoid, a shared expert) without
 * RoPE, its queries' temperature tuned (floor 2, scale 0.5: from position 1 on, not 8192). */
enum {
    MOE_TEST_DENSE_TIED,
    MOE_TEST_SLIDING_SIGMOID,
    MOE_TEST_MIXTRAL,
    MOE_TEST_GPT_OSS,
    MOE_TEST_LLAMA4
};
static inline void moe_test_variant(struct mdl_model *m, int which, int window)
{
    moe_test_model("tiny-moe-gqa", m);
    if (which == MOE_TEST_DENSE_TIED) {
        m->first_dense = 1;
        m->dense_intermediate = 48;
        m->tied_embeddings = true;
    } else if (which == MOE_TEST_SLIDING_SIGMOID) {
        m->attn.sliding_window = window;
        m->attn.sliding_every = 2;
        m->moe.shared_experts = 1;
        m->moe.shared_intermediate = 16;
        m->moe.scoring = MDL_SCORE_SIGMOID;
        m->moe.n_group = 4;
        m->moe.topk_group = 2;
        m->moe.scaling = 2.5;
    } else if (which == MOE_TEST_MIXTRAL) {
        m->moe.softmax_after_topk = true;
        m->moe.norm_topk = false;
    } else if (which == MOE_TEST_LLAMA4) {
        m->attn.nope_every = 2;      /* block 1 without RoPE, attending over the whole sequence */
        m->attn.chunk_size = window; /* block 0 with RoPE, within chunks of `window` tokens */
        m->attn.qk_l2_norm = true;   /* its q and k normed after RoPE */
        m->attn.temp_floor = 2;      /* block 1's queries scaled from position 1 on */
        m->attn.temp_scale = 0.5;
        m->moe_every = 2; /* block 0 dense, block 1 MoE */
        m->dense_intermediate = 48;
        m->moe.shared_experts = 1;
        m->moe.shared_intermediate = 16;
        m->moe.scoring = MDL_SCORE_SIGMOID;
        m->moe.top_k = 1;
        m->moe.norm_topk = false;
        m->moe.probs_on_input = true; /* the score scales the expert's input */
    } else {
        m->attn.sliding_window = window;
        m->attn.sliding_every = 2;
        m->attn.sinks = true;
        m->attn.bias = true;
        m->attn.rope_scaling = MDL_ROPE_YARN;
        m->attn.yarn = (struct mdl_yarn){4.0, 32.0, 1.0, mdl_yarn_attention_factor(4.0), 4, false};
        m->moe.expert_bias = true;
        m->moe.activation = MDL_ACT_CLAMPED_SWIGLU;
        m->moe.swiglu_alpha = 1.702;
        m->moe.swiglu_limit = 7.0;
        m->moe.softmax_after_topk = true;
        m->moe.norm_topk = false;
    }
}
#endif

#ifdef EXEC_H
/* The optimizer of the tests that train the tiny models on text: a high learning rate (1e-2 down
 * to 1e-3), 5 warm-up steps, for `steps` steps. */
static inline void moe_test_adamw(struct exec_adamw *o, int steps)
{
    exec_adamw_defaults(o);
    o->lr_max = 1e-2;
    o->lr_min = 1e-3;
    o->warmup_steps = 5;
    o->total_steps = steps;
}

/* A reference MoE layer with seeded weights (normal, std 0.5) and selection biases (std 0.05);
 * with moe_test_layer_gpt_oss, gpt-oss's router and expert biases (std 0.5) and its clamped
 * SwiGLU (limit `limit`). params: router, gate, up, down, sgate, sup, sdown, router_b, gate_b,
 * up_b, down_b (sizes 0 where absent). */
#define MOE_TEST_LAYER_PARAMS 11
struct moe_test_layer {
    struct exec_ref_moe w;
    double *params[MOE_TEST_LAYER_PARAMS];
    size_t sizes[MOE_TEST_LAYER_PARAMS];
};

static inline void moe_test_layer_init(struct moe_test_layer *L, struct exec_router_cfg cfg, int h,
                                       int f, int fs, uint64_t seed)
{
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    memset(L, 0, sizeof *L);
    L->w.cfg = cfg;
    L->w.hidden = h;
    L->w.ffn = f;
    L->w.shared_ffn = fs;
    int E = cfg.experts;
    size_t sizes[7] = {(size_t)E * h,  (size_t)E * f * h, (size_t)E * f * h, (size_t)E * h * f,
                       (size_t)fs * h, (size_t)fs * h,    (size_t)h * fs};
    double **slot[7] = {&L->w.router, &L->w.gate, &L->w.up,   &L->w.down,
                        &L->w.sgate,  &L->w.sup,  &L->w.sdown};
    for (int i = 0; i < 7; i++) {
        L->sizes[i] = sizes[i];
        L->params[i] = calloc(sizes[i] ? sizes[i] : 1, sizeof(double));
        for (size_t j = 0; j < sizes[i]; j++) L->params[i][j] = 0.5 * moe_rng_normal(&rng);
        *slot[i] = L->params[i];
    }
    L->w.bias = calloc((size_t)E, sizeof(double));
    for (int e = 0; e < E; e++) L->w.bias[e] = 0.05 * moe_rng_normal(&rng);
    for (int i = 7; i < MOE_TEST_LAYER_PARAMS; i++) L->params[i] = calloc(1, sizeof(double));
}

static inline void moe_test_layer_gpt_oss(struct moe_test_layer *L, double limit, uint64_t seed)
{
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    int E = L->w.cfg.experts, h = L->w.hidden, f = L->w.ffn;
    size_t sizes[4] = {(size_t)E, (size_t)E * f, (size_t)E * f, (size_t)E * h};
    double **slot[4] = {&L->w.router_b, &L->w.gate_b, &L->w.up_b, &L->w.down_b};
    for (int i = 0; i < 4; i++) {
        free(L->params[7 + i]);
        L->sizes[7 + i] = sizes[i];
        L->params[7 + i] = calloc(sizes[i], sizeof(double));
        for (size_t j = 0; j < sizes[i]; j++) L->params[7 + i][j] = 0.5 * moe_rng_normal(&rng);
        *slot[i] = L->params[7 + i];
    }
    L->w.act = MDL_ACT_CLAMPED_SWIGLU;
    L->w.alpha = 1.702;
    L->w.limit = limit;
}

static inline void moe_test_layer_free(struct moe_test_layer *L)
{
    for (int i = 0; i < MOE_TEST_LAYER_PARAMS; i++) free(L->params[i]);
    free(L->w.bias);
}
#endif

#endif
