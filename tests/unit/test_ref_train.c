/*
 * test_ref_train.c: the learning-rate schedule, AdamW, the data reader, and the CPU reference
 * training the tiny model on real text (tests/data/train-text.md, a frozen copy of an early
 * README, so that editing the README does not move the test): the loss must fall.
 */
#include "exec.h" /* before moe_test.h: its helpers need exec.h */

#include "moe_test.h"

#include <math.h>
#include <fcntl.h>
#include <unistd.h>

static void test_schedule(void **state)
{
    (void)state;
    struct exec_adamw o;
    exec_adamw_defaults(&o);
    o.lr_max = 1.0;
    o.lr_min = 0.1;
    o.warmup_steps = 4;
    o.total_steps = 14;
    assert_true(fabs(exec_lr_at(&o, 0) - 0.25) < 1e-15); /* linear warmup */
    assert_true(fabs(exec_lr_at(&o, 3) - 1.0) < 1e-15);
    assert_true(fabs(exec_lr_at(&o, 4) - 1.0) < 1e-15);  /* cosine starts at the peak */
    assert_true(fabs(exec_lr_at(&o, 9) - 0.55) < 1e-12); /* half way: the mean */
    assert_true(fabs(exec_lr_at(&o, 14) - 0.1) < 1e-15);
    assert_true(fabs(exec_lr_at(&o, 99) - 0.1) < 1e-15);
}

static void test_adamw(void **state)
{
    (void)state;
    char dir[1024];
    struct mdl_model m;
    struct exec_ref_model r;
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    assert_int_equal(mdl_model_resolve(&m, "tiny-moe-gqa", dir, &err), MOE_OK);
    assert_int_equal(exec_ref_model_create(&r, &m, 1, &err), MOE_OK);
    double *g = calloc(r.nparams, sizeof *g), *m1 = calloc(r.nparams, sizeof *m1),
           *m2 = calloc(r.nparams, sizeof *m2), *before = malloc(sizeof *before * r.nparams);
    memcpy(before, r.params, sizeof *before * r.nparams);
    for (size_t i = 0; i < r.nparams; i++) g[i] = (i % 3 == 0) ? 0.5 : -0.25;
    struct exec_adamw o;
    exec_adamw_defaults(&o);
    o.clip = 0.0;
    o.weight_decay = 0.0;
    double norm = exec_ref_adamw_step(&r, g, m1, m2, 0, &o);
    assert_true(norm > 0);
    /* The first bias-corrected step moves each weight by lr x sign(g) (|g| >> eps). */
    double lr = exec_lr_at(&o, 0);
    for (size_t i = 0; i < r.nparams; i += 97)
        assert_true(fabs(before[i] - r.params[i] - lr * (g[i] > 0 ? 1 : -1)) <
                    1e-6 * lr); /* eps over |g| */
    /* Clipping: a gradient of norm N > clip is scaled to clip before the moments. */
    memset(m1, 0, sizeof *m1 * r.nparams);
    memset(m2, 0, sizeof *m2 * r.nparams);
    o.clip = 1e-3;
    exec_ref_adamw_step(&r, g, m1, m2, 0, &o);
    assert_true(fabs(m1[0] - (1 - o.beta1) * 0.5 * 1e-3 / norm) < 1e-15);
    free(g), free(m1), free(m2), free(before);
    exec_ref_model_destroy(&r);
}

static void test_data(void **state)
{
    (void)state;
    struct exec_data d;
    struct moe_error err;
    char tmp[] = "/tmp/moe_data_XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(write(fd, "abcab", 5) == 5);
    close(fd);
    assert_int_equal(exec_data_open(&d, tmp, 256, 1, &err), MOE_OK);
    int out[7];
    exec_data_next(&d, out, 7);
    const int want[7] = {'a', 'b', 'c', 'a', 'b', 'a', 'b'}; /* wraps around */
    assert_memory_equal(out, want, sizeof want);
    exec_data_close(&d);
    assert_int_equal(exec_data_open(&d, tmp, 128, 1, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "at least 256"));
    /* A token file: magic, vocab 10, count 3, tokens 7 2 9. */
    unsigned char tok[32] = "MOETOKv1";
    tok[8] = 10;
    tok[12] = 3;
    tok[20] = 7, tok[24] = 2, tok[28] = 9;
    fd = open(tmp, O_WRONLY | O_TRUNC);
    assert_true(write(fd, tok, 32) == 32);
    close(fd);
    assert_int_equal(exec_data_open(&d, tmp, 16, 1, &err), MOE_OK);
    exec_data_next(&d, out, 4);
    assert_true(out[0] == 7 && out[1] == 2 && out[2] == 9 && out[3] == 7);
    exec_data_close(&d);
    tok[28] = 12; /* outside the file's vocabulary */
    fd = open(tmp, O_WRONLY | O_TRUNC);
    assert_true(write(fd, tok, 32) == 32);
    close(fd);
    assert_int_equal(exec_data_open(&d, tmp, 16, 1, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "token 2 is 12, outside the vocabulary 10"));
    fd = open(tmp, O_WRONLY | O_TRUNC);
    assert_true(write(fd, tok, 24) == 24); /* truncated */
    close(fd);
    assert_int_equal(exec_data_open(&d, tmp, 16, 1, &err), MOE_ERR_INPUT);
    unlink(tmp);
    assert_int_equal(exec_data_open(&d, "/nonexistent", 256, 1, &err), MOE_ERR_INPUT);
    /* Synthetic tokens: the same seed, the same stream. */
    struct exec_data a, b;
    int x[50], y[50];
    assert_int_equal(exec_data_open(&a, NULL, 256, 5, &err), MOE_OK);
    assert_int_equal(exec_data_open(&b, NULL, 256, 5, &err), MOE_OK);
    exec_data_next(&a, x, 50);
    exec_data_next(&b, y, 50);
    assert_memory_equal(x, y, sizeof x);
    exec_data_close(&a);
    exec_data_close(&b);
}

/* The CPU twin of the GPU training run: the tiny model learns bytes of real text. */
static void test_loss_falls_on_text(void **state)
{
    (void)state;
    char dir[1024], text[1024];
    struct mdl_model m;
    struct exec_ref_model r;
    struct exec_data d;
    struct moe_error err;
    moe_test_src(dir, sizeof dir, "model");
    assert_int_equal(mdl_model_resolve(&m, "tiny-moe-gqa", dir, &err), MOE_OK);
    assert_int_equal(exec_ref_model_create(&r, &m, 42, &err), MOE_OK);
    assert_int_equal(exec_data_open(&d, moe_test_src(text, sizeof text, "tests/data/train-text.md"),
                                    m.vocab, 1, &err),
                     MOE_OK);
    double *g = calloc(r.nparams, sizeof *g), *m1 = calloc(r.nparams, sizeof *m1),
           *m2 = calloc(r.nparams, sizeof *m2);
    struct exec_adamw o;
    moe_test_adamw(&o, 60);
    enum { SEQ = 33 };
    int tokens[SEQ];
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        exec_data_next(&d, tokens, SEQ);
        double loss;
        assert_int_equal(exec_ref_model_step(&r, tokens, SEQ, &loss, NULL, g, &err), MOE_OK);
        exec_ref_adamw_step(&r, g, m1, m2, step, &o);
        if (step < 5) first += loss / 5;
        if (step >= 55) last += loss / 5;
    }
    printf("tiny-moe-gqa on tests/data/train-text.md: loss %.3f (first 5 steps) -> %.3f (last 5)\n",
           first, last);
    assert_true(first > 5.0);        /* ~ln(256) at the start */
    assert_true(last < first - 1.0); /* it learns the byte statistics of English text */
    free(g), free(m1), free(m2);
    exec_data_close(&d);
    exec_ref_model_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_data),
        cmocka_unit_test(test_loss_falls_on_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
