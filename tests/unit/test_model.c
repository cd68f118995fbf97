/*
 * test_model.c: loading and validating model files, shipped and broken.
 */
#include "moe_test.h"

#include "mdl.h"

static void test_load_shipped(void **state)
{
    (void)state;
    char path[1024];
    struct mdl_model m;
    struct moe_error err;
    assert_int_equal(mdl_model_load(&m, moe_test_src(path, sizeof path, "model/deepseek-v3.json"),
                                    &err),
                     MOE_OK);
    assert_string_equal(m.name, "deepseek-v3");
    assert_int_equal(m.layers, 61);
    assert_int_equal(m.first_dense, 3);
    assert_int_equal(mdl_moe_layer_count(&m), 58);
    assert_false(mdl_layer_is_moe(&m, 2));
    assert_true(mdl_layer_is_moe(&m, 3));
    assert_int_equal(m.attn.type, MDL_ATTN_MLA);
    assert_int_equal(m.attn.kv_heads, 128);
    assert_int_equal(m.moe.experts, 256);
    assert_int_equal(m.moe.n_group, 8);
    assert_int_equal(m.moe.scoring, MDL_SCORE_SIGMOID);
    assert_true(m.moe.scaling == 2.5);
    assert_int_equal(m.moe.shared_intermediate, 2048);
    assert_int_equal(mdl_model_load(&m, moe_test_src(path, sizeof path, "model/tiny-moe-gqa.json"),
                                    &err),
                     MOE_OK);
    assert_int_equal(m.attn.type, MDL_ATTN_GQA);
    assert_int_equal(m.attn.kv_heads, 2);
    assert_int_equal(m.moe.n_group, 1);
    assert_int_equal(m.moe.topk_group, 1);
    assert_int_equal(mdl_moe_layer_count(&m), 2);
    assert_int_equal(mdl_model_load(&m, moe_test_src(path, sizeof path, "model/tiny-moe-mla.json"),
                                    &err),
                     MOE_OK);
    assert_int_equal(m.moe.shared_experts, 1);
    assert_int_equal(mdl_moe_layer_count(&m), 2);
    assert_int_equal(mdl_model_load(&m, moe_test_src(path, sizeof path, "model/mixtral-8x7b.json"),
                                    &err),
                     MOE_OK);
    assert_true(m.moe.softmax_after_topk);
}

static void test_moe_every(void **state)
{
    (void)state;
    struct mdl_model m = {.layers = 48, .first_dense = 0, .moe_every = 2};
    /* Llama 4 Maverick: every second block is MoE, starting with block 1. */
    assert_false(mdl_layer_is_moe(&m, 0));
    assert_true(mdl_layer_is_moe(&m, 1));
    assert_int_equal(mdl_moe_layer_count(&m), 24);
}

/* Load a model from text and expect an input error whose message holds `needle` at `line`. */
static void expect_bad(const char *text, const char *needle, int line)
{
    struct moe_jdoc doc;
    struct moe_error err;
    struct mdl_model m;
    memset(&m, 0x5a, sizeof m);
    struct mdl_model before = m;
    assert_int_equal(moe_jdoc_parse(&doc, "bad.json", text, strlen(text), &err), MOE_OK);
    assert_int_equal(mdl_model_from_doc(&m, &doc, &err), MOE_ERR_INPUT);
    moe_jdoc_free(&doc);
    if (!strstr(err.message, needle)) fail_msg("'%s' not in '%s'", needle, err.message);
    assert_int_equal(err.line, line);
    assert_memory_equal(&m, &before, sizeof m); /* outputs untouched on failure */
}

#define HEAD "{\"schema\": \"moeplan.model\", \"version\": 1, \"name\": \"t\",\n"
#define GQA "\"attention\": {\"type\": \"gqa\", \"heads\": 4, \"kv_heads\": 2, \"head_dim\": 16},\n"

static void test_bad_models(void **state)
{
    (void)state;
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 0, \"top_k\": 2, \"intermediate\": 32}}",
               "moe.experts: must be in [1, 65536], got 0", 4);
    expect_bad(HEAD "\"layers\": -2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "layers: must be in [1, 100000], got -2", 2);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": \"64\", \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "hidden: must be an integer, not a string", 2);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 9, \"intermediate\": 32}}",
               "top_k (9) exceeds the number of experts (8)", 4);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32,\n"
                    "\"n_group\": 3}}",
               "experts (8) must be divisible by n_group (3)", 5);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n"
                    "\"attention\": {\"type\": \"gqa\", \"heads\": 4, \"kv_heads\": 3, "
                    "\"head_dim\": 16},\n"
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "heads (4) must be a multiple of kv_heads (3)", 3);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n"
                    "\"attention\": {\"type\": \"mla\", \"heads\": 4, \"head_dim\": 16, "
                    "\"kv_lora_rank\": 8, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, "
                    "\"v_head_dim\": 8},\n"
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "MLA has no head_dim", 3);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n"
                    "\"attention\": {\"type\": \"linear\", \"heads\": 4},\n"
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "attention.type: 'linear' is not one of: gqa, mla", 3);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256, \"hiden\": 3,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "hiden: unknown key", 2);
    expect_bad(HEAD "\"layers\": 2, \"first_dense\": 1, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "dense_intermediate: the model has dense layers", 1);
    expect_bad(HEAD "\"layers\": 2, \"first_dense\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"dense_intermediate\": 64,\n"
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
               "no MoE layer", 0);
    expect_bad("{\"schema\": \"moeplan.plan\", \"version\": 1}", "expected \"moeplan.model\"", 1);
    expect_bad("{\"schema\": \"moeplan.model\", \"version\": 2}", "reads version 1, not 2", 1);
    expect_bad("{\"schema\": \"moeplan.model\"}", "version: required key is missing", 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_shipped),
        cmocka_unit_test(test_moe_every),
        cmocka_unit_test(test_bad_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
