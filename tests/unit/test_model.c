/*
 * test_model.c: loading and validating model files, shipped and broken.
 */

#include "mdl.h" /* before moe_test.h: its model helper needs it */

#include "moe_test.h"

static void test_load_shipped(void **state)
{
    (void)state;
    char path[1024];
    struct mdl_model m;
    struct moe_error err;
    assert_int_equal(
        mdl_model_load(&m, moe_test_src(path, sizeof path, "model/deepseek-v3.json"), &err),
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
    assert_int_equal(
        mdl_model_load(&m, moe_test_src(path, sizeof path, "model/tiny-moe-gqa.json"), &err),
        MOE_OK);
    assert_int_equal(m.attn.type, MDL_ATTN_GQA);
    assert_int_equal(m.attn.kv_heads, 2);
    assert_int_equal(m.moe.n_group, 1);
    assert_int_equal(m.moe.topk_group, 1);
    assert_int_equal(mdl_moe_layer_count(&m), 2);
    assert_int_equal(
        mdl_model_load(&m, moe_test_src(path, sizeof path, "model/tiny-moe-mla.json"), &err),
        MOE_OK);
    assert_int_equal(m.moe.shared_experts, 1);
    assert_int_equal(mdl_moe_layer_count(&m), 2);
    assert_int_equal(
        mdl_model_load(&m, moe_test_src(path, sizeof path, "model/mixtral-8x7b.json"), &err),
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
    /* the count in O(1) against a walk of the pattern, for every prefix of several patterns */
    for (int fd = 0; fd < 5; fd++)
        for (int every = 1; every < 5; every++) {
            struct mdl_model p = {.layers = 23, .first_dense = fd, .moe_every = every};
            int walked = 0;
            for (int i = 0; i <= p.layers; i++) {
                assert_int_equal(mdl_moe_layers_before(&p, i), walked);
                if (i < p.layers) walked += mdl_layer_is_moe(&p, i);
            }
            assert_int_equal(mdl_moe_layer_count(&p), walked);
        }
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
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32,\n"
                    "\"swiglu_limit\": 7}}",
               "moe.swiglu_limit: only the \"clamped_swiglu\" activation takes this key", 5);
    expect_bad(HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n" GQA
                    "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32,\n"
                    "\"activation\": \"geglu\"}}",
               "moe.activation", 5);
    expect_bad(
        HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n"
             "\"attention\": {\"type\": \"gqa\", \"heads\": 4, \"kv_heads\": 4, \"head_dim\": 16,\n"
             "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}},\n"
             "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
        "original_max_position: required key is missing", 4);
    expect_bad(
        HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256,\n"
             "\"attention\": {\"type\": \"gqa\", \"heads\": 4, \"kv_heads\": 4, \"head_dim\": 16,\n"
             "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
             "\"original_max_position\": 64, \"beta_fast\": 1, \"beta_slow\": 2}},\n"
             "\"moe\": {\"experts\": 8, \"top_k\": 2, \"intermediate\": 32}}",
        "beta_fast: must exceed beta_slow (2)", 4);
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

/* ------------------------------------------------------------------------------------------ */
/* Derived numbers                                                                            */
/* ------------------------------------------------------------------------------------------ */

static void load_shipped(const char *name, struct mdl_model *m)
{
    char dir[1024];
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    if (mdl_model_resolve(m, name, dir, &err) != MOE_OK) fail_msg("%s: %s", name, err.message);
}

/* Every number of tiny-moe-gqa, worked out by hand (h 64, V 256, 4 heads of 16, 2 kv heads,
 * 8 experts of ffn 32, top-2, 2 blocks). */
static void test_counts_by_hand_gqa(void **state)
{
    (void)state;
    struct mdl_model m;
    load_shipped("tiny-moe-gqa", &m);
    struct mdl_block_params b;
    mdl_block_params(&m, 0, &b);
    assert_true(b.params[MDL_ATTN_PROJ] == 64 * 64 + 2 * 64 * 32 + 64 * 64); /* 12288 */
    assert_true(b.params[MDL_NORMS] == 128);
    assert_true(b.params[MDL_ROUTER] == 64 * 8);
    assert_true(b.one_expert == 3 * 64 * 32);
    assert_true(b.params[MDL_ROUTED] == 8 * 6144);
    assert_true(b.active[MDL_ROUTED] == 2 * 6144);
    assert_true(b.params[MDL_DENSE_FFN] == 0 && b.params[MDL_SHARED] == 0);
    struct mdl_params p;
    mdl_params_count(&m, &p);
    /* 2 blocks of 62080, two 256x64 tables, the final norm. */
    assert_true(p.total == 2 * 62080 + 2 * 16384 + 64);
    assert_true(p.active == 2 * 25216 + 2 * 16384 + 64);
    assert_true(p.active_no_embed == p.active - 16384);
    assert_true(p.mtp == 0);
    struct mdl_flops f;
    mdl_flops_per_token(&m, 128, &f);
    assert_true(f.fwd[MDL_ATTN_PROJ] == 2 * 2 * 12288);
    assert_true(f.fwd[MDL_ATTN_CORE] == 2 * (2.0 * 4 * (16 + 16) * 64)); /* causal half: 64 keys */
    assert_true(f.fwd[MDL_ROUTER] == 2 * 2 * 64 * 8);
    assert_true(f.fwd[MDL_ROUTED] == 2 * 2 * 2 * 3 * 64 * 32);
    assert_true(f.fwd[MDL_LM_HEAD] == 2 * 64 * 256);
    assert_true(f.fwd[MDL_EMBED] == 0);
    assert_true(f.fwd_total == 165888);
    assert_true(f.train_total == 3 * 165888);
    struct mdl_activations a;
    mdl_block_activations(&m, 0, &a);
    assert_true(a.bytes[MDL_NORMS] == 2 * (2 * 64 + 4));
    assert_true(a.bytes[MDL_ATTN_PROJ] == 2 * 64 + 2 * (64 + 64) + 2 * 64);
    assert_true(a.bytes[MDL_ATTN_CORE] == 4 * 4);
    assert_true(a.bytes[MDL_ROUTER] == 2 * 64 + 4 * 8 + 2 * 8);
    assert_true(a.bytes[MDL_ROUTED] == 2 * (2 * 64 + 2 * 2 * 32 + 2 * 32 + 2 * 64));
    assert_true(a.total == 264 + 512 + 16 + 176 + 896);
}

/* tiny-moe-mla: MLA (q_lora 32, kv_lora 16, qk 16+8, v 16), a dense first block (ffn 128),
 * 1 shared + 8 routed experts, top-3. */
static void test_counts_by_hand_mla(void **state)
{
    (void)state;
    struct mdl_model m;
    load_shipped("tiny-moe-mla", &m);
    struct mdl_block_params d, e;
    mdl_block_params(&m, 0, &d);
    mdl_block_params(&m, 1, &e);
    double attn = 64 * 32 + 32 * 4 * 24 + 64 * (16 + 8) + 16 * 4 * (16 + 16) + 4 * 16 * 64;
    assert_true(d.params[MDL_ATTN_PROJ] == attn); /* 12800 */
    assert_true(d.params[MDL_NORMS] == 128 + 32 + 16);
    assert_true(d.params[MDL_DENSE_FFN] == 3 * 64 * 128);
    assert_true(d.params[MDL_ROUTED] == 0);
    assert_true(e.params[MDL_SHARED] == 3 * 64 * 32);
    assert_true(e.active[MDL_ROUTED] == 3 * 3 * 64 * 32);
    struct mdl_params p;
    mdl_params_count(&m, &p);
    assert_true(p.total == 37552 + 2 * 68784 + 2 * 16384 + 64);
    struct mdl_flops f;
    mdl_flops_per_token(&m, 64, &f);
    /* core attention: 4 heads x (24 + 16) x 2 FLOPs x 32 keys, 3 blocks */
    assert_true(f.fwd[MDL_ATTN_CORE] == 3 * 2.0 * 4 * 40 * 32);
    assert_true(f.fwd[MDL_SHARED] == 2 * 2.0 * 3 * 64 * 32);
    assert_true(f.fwd[MDL_DENSE_FFN] == 2.0 * 3 * 64 * 128);
    /* Activations of the MoE block: normed input 128 B; q_a out + normed 2 x 64; kv_a out
     * (16 + 8) x 2 and normed kv 16 x 2; q, k (24 each) and v (16) for 4 heads; attention output
     * 4 x 16 x 2. Router: input 128, fp32 logits 8 x 4, top-3 ids and weights 3 x 8. Routed:
     * 3 copies of (input 128 + gate/up 128 + SwiGLU 64 + output 128); shared: 3 x 2 x 32. */
    struct mdl_activations a;
    mdl_block_activations(&m, 1, &a);
    assert_true(a.bytes[MDL_ATTN_PROJ] == 128 + 128 + 48 + 32 + 2.0 * 4 * (2 * 24 + 16) + 128);
    assert_true(a.bytes[MDL_ROUTER] == 128 + 32 + 24);
    assert_true(a.bytes[MDL_ROUTED] == 3 * (128 + 128 + 64 + 128));
    assert_true(a.bytes[MDL_SHARED] == 3 * 2 * 32);
    assert_true(a.bytes[MDL_ATTN_CORE] == 16);
    mdl_block_activations(&m, 0, &a);
    assert_true(a.bytes[MDL_DENSE_FFN] == 128 + 3 * 2 * 128);
    assert_true(a.bytes[MDL_ROUTED] == 0);
}

/* YaRN's frequencies for gpt-oss (64 dims, theta 150000, factor 32 over 4096 positions, beta 32
 * and 1, no truncation) against Hugging Face's _compute_yarn_parameters transcribed in Python
 * (the values below, printed by that transcription): the band is dims 8.09 .. 17.40. */
static void test_yarn_freqs(void **state)
{
    (void)state;
    struct mdl_model m;
    load_shipped("gpt-oss-20b", &m);
    double fr[32], scale;
    mdl_rope_freqs(&m.attn, 64, fr, &scale);
    const int at[] = {0, 5, 8, 12, 20, 31};
    const double want[] = {1.0,
                           0.15532298948448497,
                           0.050813274815461475,
                           0.006794959489732219,
                           1.818833668168956e-05,
                           3.0235114281192144e-07};
    for (int i = 0; i < 6; i++)
        if (fabs(fr[at[i]] - want[i]) > 1e-12 * want[i])
            fail_msg("inv_freq[%d] = %.17g, want %.17g", at[i], fr[at[i]], want[i]);
    assert_true(fabs(scale - 1.3465735902799727) < 1e-15);
    /* plain RoPE: theta^(-2i/rot), scale 1 */
    m.attn.rope_scaling = MDL_ROPE_PLAIN;
    mdl_rope_freqs(&m.attn, 64, fr, &scale);
    assert_true(scale == 1.0 && fr[0] == 1.0 && fabs(fr[12] - pow(150000.0, -24.0 / 64)) < 1e-18);
}

static void test_sliding_window_flops(void **state)
{
    (void)state;
    struct mdl_model m;
    load_shipped("gpt-oss-20b", &m);
    assert_true(mdl_layer_is_sliding(&m, 0));
    assert_false(mdl_layer_is_sliding(&m, 1));
    double slide[MDL_NCOMPONENTS], full[MDL_NCOMPONENTS];
    mdl_block_flops_fwd(&m, 0, 4096, slide);
    mdl_block_flops_fwd(&m, 1, 4096, full);
    /* window 128 over 4096 positions: 128 - 128^2 / (2 * 4096) = 126 keys on average */
    assert_true(slide[MDL_ATTN_CORE] == 2.0 * 64 * 128 * 126);
    assert_true(full[MDL_ATTN_CORE] == 2.0 * 64 * 128 * 2048);
    /* a sequence shorter than the window is plain causal */
    mdl_block_flops_fwd(&m, 0, 100, slide);
    assert_true(slide[MDL_ATTN_CORE] == 2.0 * 64 * 128 * 50);
}

/* The publishers' figures (model cards and papers). Totals: within 1% except where the publisher
 * counts something that is not in the config's transformer (said per row). Active: publishers
 * use two conventions (with or without the input embedding table) and round to 2-3 digits, so
 * each row names its convention and the tolerance is 2.5%. */
static void test_published_totals(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        double total_b, active_b;
        bool active_without_input_embedding;
        double total_tol;
    } pub[] = {
        {"deepseek-v3", 671, 37, true, 0.01},
        /* 1.04T published; the config's transformer counts 1.026T (-1.3%): Moonshot's figure
         * includes parameters outside it, and their own card says "1T". */
        {"kimi-k2", 1040, 32.6, false, 0.015},
        {"deepseek-v2-lite", 15.7, 2.4, true, 0.01},
        {"qwen3-235b-a22b", 235, 22, false, 0.01},
        {"qwen3-30b-a3b", 30.5, 3.3, false, 0.01},
        {"mixtral-8x7b", 46.7, 12.9, false, 0.01},
        {"mixtral-8x22b", 141, 39, false, 0.01},
        {"dbrx", 132, 36, false, 0.01},
        {"gpt-oss-120b", 116.8, 5.1, true, 0.01},
        {"gpt-oss-20b", 20.9, 3.6, true, 0.01},
        {"llama4-maverick", 400, 17, false, 0.01},
        /* 109B published includes the vision encoder; the text model is 107.8B (-1.1%). */
        {"llama4-scout", 109, 17, false, 0.015},
    };
    for (size_t i = 0; i < sizeof pub / sizeof pub[0]; i++) {
        struct mdl_model m;
        struct mdl_params p;
        load_shipped(pub[i].name, &m);
        mdl_params_count(&m, &p);
        double total = p.total / 1e9;
        double active =
            (pub[i].active_without_input_embedding ? p.active_no_embed : p.active) / 1e9;
        double et = total / pub[i].total_b - 1.0, ea = active / pub[i].active_b - 1.0;
        printf("%-18s total %8.2f B (%+.2f%%)  active %6.2f B (%+.2f%%)\n", pub[i].name, total,
               100 * et, active, 100 * ea);
        if (et < -pub[i].total_tol || et > pub[i].total_tol)
            fail_msg("%s total %.2f B vs published %.1f B", pub[i].name, total, pub[i].total_b);
        if (ea < -0.025 || ea > 0.025)
            fail_msg("%s active %.2f B vs published %.1f B", pub[i].name, active, pub[i].active_b);
    }
}

static void test_deepseek_v3_flops(void **state)
{
    (void)state;
    struct mdl_model m;
    load_shipped("deepseek-v3", &m);
    struct mdl_flops f;
    mdl_flops_per_token(&m, 4096, &f);
    /* the published figure: about 260 GFLOP per token (fwd + bwd, MTP included there), routed
     * experts about 47%. Without MTP: 250 GFLOP and 49%. */
    assert_true(f.train_total > 240e9 && f.train_total < 265e9);
    double routed = f.fwd[MDL_ROUTED] / f.fwd_total;
    assert_true(routed > 0.45 && routed < 0.51);
    /* routed experts by hand: 58 MoE blocks x 8 experts x 2 x 3 x 7168 x 2048 */
    assert_true(f.fwd[MDL_ROUTED] == 58.0 * 8 * 2 * 3 * 7168 * 2048);
}

/* ------------------------------------------------------------------------------------------ */
/* Hugging Face import, name resolution, proxies                                              */
/* ------------------------------------------------------------------------------------------ */

static void test_hf_import(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"deepseek_v3", "deepseek-v3"}, {"deepseek_v2", "deepseek-v2-lite"}, {"kimi_k2", "kimi-k2"},
        {"qwen3_moe", "qwen3-30b-a3b"}, {"mixtral", "mixtral-8x7b"},         {"dbrx", "dbrx"},
        {"gpt_oss", "gpt-oss-20b"},     {"llama4", "llama4-scout"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char rel[256], path[1024], dir[1024];
        struct mdl_model hf, ours;
        struct moe_error err;
        snprintf(rel, sizeof rel, "tests/data/hf/%s.json", pairs[i][0]);
        moe_test_src(path, sizeof path, rel);
        moe_test_src(dir, sizeof dir, "model");
        if (mdl_model_resolve(&hf, path, dir, &err) != MOE_OK)
            fail_msg("%s: %s", pairs[i][0], err.message);
        load_shipped(pairs[i][1], &ours);
        /* The shapes must be the same struct as our file, field by field. */
        assert_memory_equal(&hf.attn, &ours.attn, sizeof hf.attn);
        assert_memory_equal(&hf.moe, &ours.moe, sizeof hf.moe);
        assert_int_equal(hf.layers, ours.layers);
        assert_int_equal(hf.first_dense, ours.first_dense);
        assert_int_equal(hf.moe_every, ours.moe_every);
        assert_int_equal(hf.hidden, ours.hidden);
        assert_int_equal(hf.vocab, ours.vocab);
        assert_int_equal(hf.dense_intermediate ? mdl_moe_layer_count(&hf) < hf.layers : 0,
                         ours.dense_intermediate ? 1 : 0);
        assert_int_equal(hf.mtp_layers, ours.mtp_layers);
        assert_int_equal(hf.tied_embeddings, ours.tied_embeddings);
        struct mdl_params a, b;
        mdl_params_count(&hf, &a);
        mdl_params_count(&ours, &b);
        assert_true(a.total == b.total);
    }
}

static void test_hf_errors(void **state)
{
    (void)state;
    char path[1024], dir[1024];
    struct mdl_model m;
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    moe_test_src(path, sizeof path, "tests/data/hf/unsupported.json");
    assert_int_equal(mdl_model_resolve(&m, path, dir, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "model type 'mamba' is not supported (supported: "
                                        "deepseek_v3, deepseek_v2, kimi_k2, qwen3_moe, mixtral, "
                                        "dbrx, gpt_oss, llama4)"));
    assert_int_equal(err.line, 2); /* at "model_type" */
    const char *text = "{\n  \"model_type\": \"mixtral\",\n  \"hidden_size\": 4096,\n"
                       "  \"num_hidden_layers\": \"32\"\n}\n";
    struct moe_jdoc doc;
    assert_int_equal(moe_jdoc_parse(&doc, "config.json", text, strlen(text), &err), MOE_OK);
    assert_int_equal(mdl_model_from_hf(&m, &doc, &err), MOE_ERR_INPUT);
    assert_int_equal(err.line, 4);
    assert_non_null(strstr(err.message, "num_hidden_layers: must be an integer"));
    moe_jdoc_free(&doc);
    const char *no_experts = "{\"model_type\": \"mixtral\", \"hidden_size\": 64, "
                             "\"num_hidden_layers\": 2, \"vocab_size\": 10, "
                             "\"num_attention_heads\": 4, \"intermediate_size\": 8}";
    assert_int_equal(moe_jdoc_parse(&doc, "c.json", no_experts, strlen(no_experts), &err), MOE_OK);
    assert_int_equal(mdl_model_from_hf(&m, &doc, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "num_local_experts: required key is missing"));
    moe_jdoc_free(&doc);
    const char *linear = "{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, "
                         "\"num_hidden_layers\": 2, \"vocab_size\": 10, "
                         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                         "\"head_dim\": 16, \"num_local_experts\": 4, "
                         "\"num_experts_per_tok\": 2, \"intermediate_size\": 8,\n"
                         "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}";
    assert_int_equal(moe_jdoc_parse(&doc, "c.json", linear, strlen(linear), &err), MOE_OK);
    assert_int_equal(mdl_model_from_hf(&m, &doc, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "only \"yarn\" RoPE scaling is supported, not \"linear\""));
    assert_int_equal(err.line, 2);
    moe_jdoc_free(&doc);
    /* Llama 4's no_rope_layers as Hugging Face writes it (1: RoPE): one interval's pattern is
     * taken, any other refused with the layer that breaks it */
#define L4_HEAD                                                                                    \
    "{\"model_type\": \"llama4\", \"hidden_size\": 64, \"num_hidden_layers\": 8, "                 \
    "\"vocab_size\": 10, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "                 \
    "\"head_dim\": 16, \"num_local_experts\": 4, \"num_experts_per_tok\": 1, "                     \
    "\"intermediate_size\": 8,\n"
    const char *l4 = L4_HEAD "\"no_rope_layers\": [1, 1, 1, 0, 1, 1, 1, 0]}";
    assert_int_equal(moe_jdoc_parse(&doc, "c.json", l4, strlen(l4), &err), MOE_OK);
    assert_int_equal(mdl_model_from_hf(&m, &doc, &err), MOE_OK);
    assert_int_equal(m.attn.nope_every, 4);
    assert_int_equal(m.attn.chunk_size, 8192);
    assert_true(!mdl_layer_has_rope(&m, 3) && mdl_layer_has_rope(&m, 4));
    assert_int_equal(mdl_layer_chunk(&m, 3), 0);
    assert_int_equal(mdl_layer_chunk(&m, 2), 8192);
    moe_jdoc_free(&doc);
    const char *l4bad = L4_HEAD "\"no_rope_layers\": [1, 1, 1, 0, 1, 0, 1, 0]}";
#undef L4_HEAD
    assert_int_equal(moe_jdoc_parse(&doc, "c.json", l4bad, strlen(l4bad), &err), MOE_OK);
    assert_int_equal(mdl_model_from_hf(&m, &doc, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "layer 5 breaks the pattern of every 4-th layer"));
    assert_int_equal(err.line, 2);
    moe_jdoc_free(&doc);
    assert_int_equal(mdl_model_resolve(&m, "no-such-model", dir, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "no model named 'no-such-model'"));
    assert_int_equal(mdl_model_resolve(&m, "../etc", dir, &err), MOE_ERR_INPUT);
    assert_int_equal(mdl_model_resolve(&m, "bad name!", dir, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "is not a model name or a path"));
}

static void test_overrides(void **state)
{
    (void)state;
    struct mdl_model m;
    struct moe_error err;
    load_shipped("deepseek-v2-lite", &m);
    struct mdl_overrides o = {.layers = 4, .experts = 16};
    assert_int_equal(mdl_model_override(&m, &o, &err), MOE_OK);
    assert_int_equal(m.layers, 4);
    assert_int_equal(m.first_dense, 1);
    assert_int_equal(m.moe.experts, 16);
    assert_int_equal(m.moe.intermediate, 1408); /* per-expert shape kept */
    assert_string_equal(m.name, "deepseek-v2-lite-L4-E16");
    struct mdl_model before = m;
    struct mdl_overrides bad = {.experts = 3}; /* fewer than top-6 */
    assert_int_equal(mdl_model_override(&m, &bad, &err), MOE_ERR_INPUT);
    assert_memory_equal(&m, &before, sizeof m);
    load_shipped("deepseek-v3", &m);
    struct mdl_overrides groups = {.experts = 12}; /* 8 groups */
    assert_int_equal(mdl_model_override(&m, &groups, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "not divisible by n_group (8)"));
    struct mdl_overrides two = {.layers = 2};
    assert_int_equal(mdl_model_override(&m, &two, &err), MOE_OK);
    assert_int_equal(m.first_dense, 1);
    assert_int_equal(mdl_moe_layer_count(&m), 1);
}

static void test_model_json_roundtrip(void **state)
{
    (void)state;
    const char *names[] = {"deepseek-v3", "gpt-oss-20b", "llama4-maverick", "tiny-moe-mla"};
    for (size_t i = 0; i < 4; i++) {
        struct mdl_model m, back;
        struct moe_error err;
        load_shipped(names[i], &m);
        char *text = mdl_model_to_json_text(&m);
        assert_non_null(text);
        struct moe_jdoc doc;
        assert_int_equal(moe_jdoc_parse(&doc, "embedded", text, strlen(text), &err), MOE_OK);
        if (mdl_model_from_doc(&back, &doc, &err) != MOE_OK)
            fail_msg("%s: %s", names[i], err.message);
        moe_jdoc_free(&doc);
        free(text);
        assert_memory_equal(&back.attn, &m.attn, sizeof m.attn);
        assert_memory_equal(&back.moe, &m.moe, sizeof m.moe);
        assert_int_equal(back.layers, m.layers);
        assert_int_equal(back.first_dense, m.first_dense);
        assert_int_equal(back.moe_every, m.moe_every);
        assert_int_equal(back.mtp_layers, m.mtp_layers);
        assert_string_equal(back.name, m.name);
    }
}

/* Megatron-Bridge's FLOP count against what its tables imply: TFLOPS / tokens/s per GPU is the
 * FLOPs per token the table counted (rows of tests/data/published/mb-runs.tsv, sequence 4096).
 * Each model family within 1%. */
static void test_megatron_flops(void **state)
{
    (void)state;
    static const struct {
        const char *model, *row;
        int mtp;
        double tflops, tokens;
    } rows[] = {
        {"deepseek-v3", "MB-2 (with MTP)", 1, 1276, 4912},
        {"deepseek-v3", "MB-110 (w/o MTP)", 0, 961, 3848},
        {"qwen3-235b-a22b", "MB-10", 0, 1077, 7280},
        {"qwen3-30b-a3b", "MB-8", 0, 923, 39936},
        {"gpt-oss-120b", "MB-6", 0, 934, 28672},
        {"kimi-k2", "MB-32", 0, 1099, 5372},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct mdl_model m;
        moe_test_model(rows[i].model, &m);
        double ours = mdl_flops_megatron(&m, 4096, rows[i].mtp);
        double theirs = rows[i].tflops * 1e12 / rows[i].tokens;
        printf("%-16s %-17s %.2f GFLOP/token, the table's %.2f (%+.2f%%)\n", rows[i].model,
               rows[i].row, ours / 1e9, theirs / 1e9, 100.0 * (ours / theirs - 1.0));
        if (!(fabs(ours / theirs - 1.0) <= 0.01))
            fail_msg("%s %s: %.4g FLOPs per token, the table implies %.4g", rows[i].model,
                     rows[i].row, ours, theirs);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_shipped),       cmocka_unit_test(test_moe_every),
        cmocka_unit_test(test_bad_models),         cmocka_unit_test(test_counts_by_hand_gqa),
        cmocka_unit_test(test_counts_by_hand_mla), cmocka_unit_test(test_sliding_window_flops),
        cmocka_unit_test(test_published_totals),   cmocka_unit_test(test_deepseek_v3_flops),
        cmocka_unit_test(test_megatron_flops),     cmocka_unit_test(test_hf_import),
        cmocka_unit_test(test_yarn_freqs),         cmocka_unit_test(test_hf_errors),
        cmocka_unit_test(test_overrides),          cmocka_unit_test(test_model_json_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
