/*
 * test_ref_model.c: a whole training step of the reference (loss and every parameter's
 * gradient) against finite differences, on the tiny GQA model and variants of it (a dense first
 * block, tied embeddings, a sliding window, QK-norm, attention biases and sinks, shared experts).
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "moe_test.h"

#include <math.h>

/* Check a spread of entries of every tensor: central differences, 1e-5 relative + 1e-9 absolute
 * (the loss is a sum over many terms, so cancellation costs a digit or two). */
static void check_model_aux(const struct mdl_model *m, uint64_t seed, double aux_coef)
{
    struct exec_ref_model r;
    struct moe_error err;
    assert_int_equal(exec_ref_model_create(&r, m, seed, &err), MOE_OK);
    /* Larger weights than the 0.02 initialization, so that every path carries signal. */
    struct moe_rng rng;
    moe_rng_seed(&rng, seed + 1);
    for (size_t i = 0; i < r.nparams; i++) r.params[i] += 0.1 * moe_rng_normal(&rng);
    double *bias = NULL;
    if (aux_coef > 0) { /* the load-balance loss, and a selection bias that moves the routing */
        r.aux_coef = aux_coef;
        bias = calloc((size_t)m->layers * m->moe.experts, sizeof *bias);
        for (int i = 0; i < m->layers * m->moe.experts; i++) bias[i] = 0.05 * moe_rng_normal(&rng);
        r.bias = bias;
    }
    int tokens[9];
    for (int t = 0; t < 9; t++) tokens[t] = (int)moe_rng_below(&rng, (uint64_t)m->vocab);
    double loss, aux, *grad = malloc(sizeof *grad * r.nparams);
    assert_int_equal(exec_ref_model_step(&r, tokens, 9, &loss, &aux, grad, &err), MOE_OK);
    assert_true(isfinite(loss) && loss > 0);
    assert_true(aux_coef > 0 ? aux > 0 : aux == 0);
    int checked = 0;
    for (int i = 0; i < r.ntensors; i++) {
        const struct exec_tensor *t = &r.tensor[i];
        for (int s = 0; s < 6; s++) {
            size_t j = t->offset + moe_rng_below(&rng, t->size);
            /* rows of the embedding that no token uses have a zero gradient: probe used ones */
            if (!strcmp(t->name, "embed") && s < 3) j = t->offset + (size_t)tokens[s] * t->cols + s;
            double keep = r.params[j], e = 1e-5, lp, lm;
            r.params[j] = keep + e;
            assert_int_equal(exec_ref_model_step(&r, tokens, 9, &lp, NULL, NULL, &err), MOE_OK);
            r.params[j] = keep - e;
            assert_int_equal(exec_ref_model_step(&r, tokens, 9, &lm, NULL, NULL, &err), MOE_OK);
            r.params[j] = keep;
            double num = (lp - lm) / (2 * e);
            if (!(fabs(num - grad[j]) <= 1e-5 * fabs(num) + 1e-9))
                fail_msg("%s: %s[%zu]: analytic %.10g, numeric %.10g", m->name, t->name,
                         j - t->offset, grad[j], num);
            checked++;
        }
    }
    printf("%s: loss %.6f, %d gradient entries of %d tensors checked\n", m->name, loss, checked,
           r.ntensors);
    free(grad);
    free(bias);
    exec_ref_model_destroy(&r);
}

static void check_model(const struct mdl_model *m, uint64_t seed)
{
    check_model_aux(m, seed, 0.0);
}

static void test_tiny_gqa(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    check_model(&m, 1);
}

static void test_variants(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_variant(&m, MOE_TEST_DENSE_TIED, 0);
    check_model(&m, 2);
    moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 3); /* block 0 slides, block 1 is full */
    check_model(&m, 3);
    moe_test_model("tiny-moe-gqa", &m); /* Qwen3's QK-norm: q_norm, k_norm per head */
    m.attn.qk_norm = true;
    check_model(&m, 8);
    m.attn.bias = true; /* gpt-oss's projection biases (with QK-norm: the bias comes first) */
    check_model(&m, 9);
    m.attn.qk_norm = false;
    check_model(&m, 10);
    m.attn.sinks = true; /* and gpt-oss's attention sinks, with a sliding window in block 0 */
    check_model(&m, 11);
    moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 3);
    m.attn.sinks = true;
    check_model(&m, 12);
    moe_test_variant(&m, MOE_TEST_GPT_OSS, 3); /* gpt-oss's whole block, YaRN and expert biases */
    check_model(&m, 13);
    moe_test_variant(&m, MOE_TEST_LLAMA4, 3); /* chunks of 3 (the last one shorter), NoPE */
    check_model(&m, 14);
}

/* Chunked attention is attention over each chunk as a sequence of its own: with every block
 * chunked (chunks of 4 of 8 tokens), the loss is the mean of the two halves' losses, each half an
 * unchunked sequence of 4 (RoPE sees only position differences inside a chunk); 1e-9 relative.
 * And the chunks change the loss against attention over all 8. */
static void test_chunked(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    m.attn.chunk_size = 4;
    struct exec_ref_model r;
    struct moe_error err;
    assert_int_equal(exec_ref_model_create(&r, &m, 21, &err), MOE_OK);
    struct moe_rng rng;
    moe_rng_seed(&rng, 22);
    for (size_t i = 0; i < r.nparams; i++) r.params[i] += 0.1 * moe_rng_normal(&rng);
    int tok[9];
    for (int t = 0; t < 9; t++) tok[t] = (int)moe_rng_below(&rng, (uint64_t)m.vocab);
    double whole, a, b, full;
    assert_int_equal(exec_ref_model_step(&r, tok, 9, &whole, NULL, NULL, &err), MOE_OK);
    r.model.attn.chunk_size = 0;
    assert_int_equal(exec_ref_model_step(&r, tok, 5, &a, NULL, NULL, &err), MOE_OK);
    assert_int_equal(exec_ref_model_step(&r, tok + 4, 5, &b, NULL, NULL, &err), MOE_OK);
    assert_int_equal(exec_ref_model_step(&r, tok, 9, &full, NULL, NULL, &err), MOE_OK);
    printf("chunks of 4: loss %.12f, the halves alone %.12f; unchunked %.12f\n", whole, (a + b) / 2,
           full);
    assert_true(fabs(whole - (a + b) / 2) <= 1e-9 * fabs(whole));
    assert_true(fabs(whole - full) > 1e-6);
    exec_ref_model_destroy(&r);
}

/* MLA with q compression, a dense first block and a shared expert (tiny-moe-mla), and MLA
 * without q compression (DeepSeek-V2-Lite's form). */
static void test_tiny_mla(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-mla", &m);
    check_model(&m, 4);
    m.attn.q_lora_rank = 0;
    check_model(&m, 5);
}

/* The load-balance loss (softmax and sigmoid scoring) with a selection bias. */
static void test_aux_loss(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    check_model_aux(&m, 6, 0.01);
    moe_test_model("tiny-moe-mla", &m);
    check_model_aux(&m, 7, 0.01);
}

static void test_refusals(void **state)
{
    (void)state;
    struct mdl_model m;
    struct exec_ref_model r;
    struct moe_error err;
    moe_test_model("tiny-moe-mla", &m);
    m.attn.qk_norm = true;
    assert_int_equal(exec_ref_model_create(&r, &m, 1, &err), MOE_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.message, "QK-norm with MLA"));
    moe_test_model("tiny-moe-gqa", &m);
    assert_int_equal(exec_ref_model_create(&r, &m, 1, &err), MOE_OK);
    int bad[3] = {1, 999, 2};
    double loss;
    assert_int_equal(exec_ref_model_step(&r, bad, 3, &loss, NULL, NULL, &err), MOE_ERR_INPUT);
    assert_int_equal(exec_ref_model_step(&r, bad, 1, &loss, NULL, NULL, &err), MOE_ERR_INPUT);
    exec_ref_model_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_gqa), cmocka_unit_test(test_variants),
        cmocka_unit_test(test_chunked),  cmocka_unit_test(test_aux_loss),
        cmocka_unit_test(test_tiny_mla), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
