/*
 * test_measured.c: a run's record (executor/measured.c) in CI: the summary's medians, and
 * measured.json written by its one writer (exec_measured_save) and read back by the planner's
 * readers (plan_measured_load for `report`, cost_routing_load for `plan --routing`), a skipped
 * step included. The record is made by hand here; the GPU run that fills it is test_gpu_run's.
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "moe_test.h"

#include <unistd.h>

enum { STEPS = 5 };

struct fixture {
    struct plan_file p;
    struct exec_run_result r;
    struct exec_run_cfg c;
    char dir[64], file[96];
};

/* A 2-GPU EP plan of tiny-moe-gqa and a finished run's record of STEPS steps (step 3 skipped). */
static void make(struct fixture *f)
{
    memset(f, 0, sizeof *f);
    moe_test_model("tiny-moe-gqa", &f->p.model);
    const struct mdl_model *m = &f->p.model;
    f->p.gpus = 2;
    f->p.micro_batches = 2;
    f->p.layout = (struct cost_layout){.tp = 1,
                                       .cp = 1,
                                       .pp = 1,
                                       .vpp = 1,
                                       .ep = 2,
                                       .etp = 1,
                                       .dp = 2,
                                       .seq_len = 64,
                                       .mbs = 1,
                                       .gbs = 4,
                                       .precision = COST_BF16};
    f->p.step_us = 12e3;
    f->p.mfu = 0.25;
    f->p.model_tflops_per_gpu = 100.0;
    for (int ph = 0; ph < COST_NPHASES; ph++) f->p.phase_us[ph] = 1e3 * (ph + 1);
    struct exec_run_result *r = &f->r;
    r->filled = true;
    snprintf(r->info.dev.name, sizeof r->info.dev.name, "NVIDIA H200");
    r->info.opt.lr_max = 3e-4;
    r->nsteps = STEPS;
    r->steps = calloc(STEPS, sizeof *r->steps);
    int E = m->moe.experts;
    r->counts = calloc((size_t)m->layers * E, sizeof *r->counts);
    r->coact = calloc((size_t)m->layers * E * E, sizeof *r->coact);
    assert_true(r->steps && r->counts && r->coact);
    static const double step_ms[STEPS] = {50.0, 10.0, 99.0, 12.0, 11.0};
    for (int i = 0; i < STEPS; i++) {
        struct exec_run_step *s = &r->steps[i];
        s->step = i + 1;
        s->loss = 5.0 - 0.1 * i;
        for (int ph = 0; ph < COST_NPHASES; ph++) s->gpu.phase_ms[ph] = step_ms[i] / (ph + 1);
        s->gpu.phase_ms[COST_STEP] = step_ms[i];
    }
    r->steps[2].skipped = true;
    snprintf(r->steps[2].why, sizeof r->steps[2].why, "NaN in a gradient");
    /* every token of every MoE layer on experts (e, e + 1 mod E), 100 tokens each */
    for (int b = 0; b < m->layers; b++)
        for (int e = 0; e < E; e++) {
            r->counts[(size_t)b * E + e] = 200;
            r->coact[((size_t)b * E + e) * E + (e + 1) % E] = 100;
            r->coact[((size_t)b * E + (e + 1) % E) * E + e] = 100;
        }
    r->dispatch = (struct cost_bytes){4e6, 0};
    f->c.plan = &f->p;
    f->c.steps = STEPS;
    f->c.seed = 7;
    snprintf(f->dir, sizeof f->dir, "/tmp/moe_test_measured_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->file, sizeof f->file, "%s/measured.json", f->dir);
}

static void drop(struct fixture *f)
{
    exec_run_result_free(&f->r);
    unlink(f->file);
    rmdir(f->dir);
}

/* Medians over steps 2..5 without the skipped step 3: 10, 12, 11 -> 11. */
static void test_summary_medians(void **state)
{
    (void)state;
    struct fixture f;
    make(&f);
    struct exec_run_summary s;
    struct moe_error err;
    assert_int_equal(exec_run_summarize(&f.p, &f.r, &s, &err), MOE_OK);
    assert_int_equal(s.first_step, 2);
    assert_int_equal(s.counted, 3);
    assert_true(s.phase_ms[COST_STEP] == 11.0);
    assert_true(s.loss_first == 5.0 && fabs(s.loss_last - 4.6) < 1e-12);
    /* 2 micro-batches x 1 sequence x 64 tokens x dp 2 a step, in 11 ms */
    assert_true(fabs(s.rate.tokens_per_s - 256.0 / 0.011) < 1e-6);
    assert_true(fabs(s.rate.peak_tflops - 400.0) < 1e-9);
    int nmoe = 0;
    for (int b = 0; b < f.p.model.layers; b++) nmoe += mdl_layer_is_moe(&f.p.model, b);
    assert_true(fabs(s.dispatch_per_layer.nvlink - 4e6 / (2.0 * nmoe * 2 * STEPS)) < 1e-6);
    drop(&f);
}

/* What the writer writes, both readers read: the medians, the loss curve (the skipped step as
 * null), the routing (every expert as often: each picked by a share top_k/E of the tokens). */
static void test_writer_reader_agree(void **state)
{
    (void)state;
    struct fixture f;
    make(&f);
    struct moe_error err;
    const struct mdl_model *m = &f.p.model;
    int E = m->moe.experts, K = m->moe.top_k;
    assert_int_equal(exec_measured_save(f.file, "plan.json", &f.c, &f.r, &err), MOE_OK);
    struct plan_measured ms;
    enum moe_status st = plan_measured_load(f.file, E, K, &ms, &err);
    if (st != MOE_OK) fail_msg("%s", err.message);
    assert_string_equal(ms.model, m->name);
    assert_string_equal(ms.device, "NVIDIA H200");
    assert_true(ms.phase_ms[COST_STEP] == 11.0);
    for (int ph = 0; ph < COST_NPHASES; ph++)
        if (ph != COST_STEP) /* 12 significant digits in the file */
            assert_true(fabs(ms.phase_ms[ph] - 11.0 / (ph + 1)) < 1e-11);
    assert_int_equal(ms.steps, STEPS);
    assert_int_equal(ms.first_step, 1);
    assert_int_equal(ms.counted, 3);
    assert_true(ms.loss[0] == 5.0 && isnan(ms.loss[2]));
    assert_true(ms.have_routing);
    int nmoe = 0;
    for (int b = 0; b < m->layers; b++) nmoe += mdl_layer_is_moe(m, b);
    assert_int_equal(ms.routing.layers, nmoe);
    double want[64]; /* the reader counts tokens as picks / top_k: each expert K / E of them */
    assert_true(E <= 64);
    for (int e = 0; e < E; e++) want[e] = (double)K / E;
    for (int b = 0; b < nmoe; b++)
        moe_expect_near("pick", ms.routing.pick + (size_t)b * E, want, (size_t)E, 1e-11, 0.0);
    plan_measured_free(&ms);
    drop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary_medians),
        cmocka_unit_test(test_writer_reader_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
