/*
 * test_ckpt.c: checkpoints (executor/ckpt.c) on the CPU reference's training, the CI twin of the
 * GPU kill-and-resume test:
 *   - a trainer (tiny-moe-gqa, AdamW, synthetic data) killed with SIGKILL at a random moment and
 *     resumed from the last checkpoint ends with the same parameters and the same losses, bit for
 *     bit, as an uninterrupted run;
 *   - a corrupt, truncated or foreign checkpoint is refused naming the file.
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "moe_test.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SEQ = 32, STEPS = 40, EVERY = 3 };

struct trainer {
    struct exec_ref_model r;
    struct exec_data d;
    double *m1, *m2, *grad;
    struct exec_adamw opt;
    int step;
};

static void trainer_init(struct trainer *t)
{
    struct mdl_model m;
    struct moe_error err;
    moe_test_model("tiny-moe-gqa", &m);
    assert_int_equal(exec_ref_model_create(&t->r, &m, 3, &err), MOE_OK);
    assert_int_equal(exec_data_open(&t->d, NULL, m.vocab, 9, &err), MOE_OK);
    size_t n = t->r.nparams;
    t->m1 = calloc(n, sizeof *t->m1);
    t->m2 = calloc(n, sizeof *t->m2);
    t->grad = calloc(n, sizeof *t->grad);
    assert_true(t->m1 && t->m2 && t->grad);
    exec_adamw_defaults(&t->opt);
    t->opt.lr_max = 1e-3;
    t->opt.lr_min = 1e-4;
    t->opt.warmup_steps = 2;
    t->opt.total_steps = STEPS;
    t->step = 0;
}

static void trainer_free(struct trainer *t)
{
    exec_ref_model_destroy(&t->r);
    exec_data_close(&t->d);
    free(t->m1), free(t->m2), free(t->grad);
}

static int parts_of(struct trainer *t, struct exec_ckpt_part *p)
{
    size_t n = sizeof(double) * t->r.nparams;
    p[0] = (struct exec_ckpt_part){"params", t->r.params, t->r.params, n};
    p[1] = (struct exec_ckpt_part){"adam_m1", t->m1, t->m1, n};
    p[2] = (struct exec_ckpt_part){"adam_m2", t->m2, t->m2, n};
    p[3] = (struct exec_ckpt_part){"data_pos", &t->d.pos, &t->d.pos, sizeof t->d.pos};
    p[4] = (struct exec_ckpt_part){"data_rng", &t->d.rng, &t->d.rng, sizeof t->d.rng};
    return 5;
}

static struct exec_ckpt_id id_of(const struct trainer *t)
{
    return (struct exec_ckpt_id){t->r.model.name, t->r.nparams, t->step, 0, 1};
}

/* Steps until STEPS, a checkpoint every EVERY; loss[s] for the steps it runs. */
static void train(struct trainer *t, const char *dir, double *loss)
{
    int tok[SEQ + 1];
    struct moe_error err;
    for (; t->step < STEPS;) {
        exec_data_next(&t->d, tok, SEQ + 1);
        double l;
        assert_int_equal(exec_ref_model_step(&t->r, tok, SEQ + 1, &l, NULL, t->grad, &err), MOE_OK);
        exec_ref_adamw_step(&t->r, t->grad, t->m1, t->m2, t->step, &t->opt);
        loss[t->step++] = l;
        if (dir && t->step % EVERY == 0) {
            struct exec_ckpt_part p[5];
            int np = parts_of(t, p);
            struct exec_ckpt_id id = id_of(t);
            if (exec_ckpt_save(dir, &id, p, np, &err) != MOE_OK ||
                exec_ckpt_commit(dir, t->step, &err) != MOE_OK)
                fail_msg("%s", err.message);
        }
    }
}

static void resume(struct trainer *t, const char *dir)
{
    struct moe_error err;
    int step;
    if (exec_ckpt_latest(dir, &step, &err) != MOE_OK) fail_msg("%s", err.message);
    t->step = step;
    struct exec_ckpt_part p[5];
    int np = parts_of(t, p);
    struct exec_ckpt_id id = id_of(t);
    if (exec_ckpt_load(dir, step, &id, p, np, &err) != MOE_OK) fail_msg("%s", err.message);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_kill_and_resume(void **state)
{
    (void)state;
    /* the uninterrupted run, timed */
    struct trainer full;
    double want[STEPS], got[STEPS];
    trainer_init(&full);
    double t0 = now_s();
    train(&full, NULL, want);
    double span = now_s() - t0;
    struct moe_rng rng;
    moe_rng_seed(&rng, 5);
    int resumed_from[3];
    for (int round = 0; round < 3; round++) {
        char dir[] = "/tmp/moe_test_ckpt_XXXXXX";
        assert_non_null(mkdtemp(dir));
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            struct trainer t;
            trainer_init(&t);
            train(&t, dir, got);
            _exit(0);
        }
        /* kill it at a random moment after its first checkpoint (a loaded machine may take a
         * while to get there: wait for it, up to a minute) */
        int first = 0;
        struct moe_error none;
        for (int i = 0; i < 60000 && exec_ckpt_latest(dir, &first, &none) != MOE_OK; i++) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        double at = span * 0.5 * (double)moe_rng_below(&rng, 1000) / 1000.0;
        struct timespec nap = {(time_t)at, (long)((at - (double)(time_t)at) * 1e9)};
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        /* a trainer that finished first is resumed from its last checkpoint all the same */
        assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
        struct trainer t;
        trainer_init(&t);
        resume(&t, dir);
        resumed_from[round] = t.step;
        int from = t.step;
        train(&t, dir, got);
        for (int s = from; s < STEPS; s++)
            if (memcmp(&got[s], &want[s], sizeof got[s]))
                fail_msg("round %d: step %d loss %.17g, uninterrupted %.17g", round, s + 1, got[s],
                         want[s]);
        assert_memory_equal(t.r.params, full.r.params, sizeof(double) * t.r.nparams);
        assert_memory_equal(t.m1, full.m1, sizeof(double) * t.r.nparams);
        trainer_free(&t);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
    }
    printf("killed 3 times at random (uninterrupted run %.0f ms), resumed from steps %d, %d, %d: "
           "the same losses and parameters, bit for bit\n",
           1e3 * span, resumed_from[0], resumed_from[1], resumed_from[2]);
    trainer_free(&full);
}

static void test_refusals(void **state)
{
    (void)state;
    char dir[] = "/tmp/moe_test_ckpt_XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    struct trainer t;
    double loss[STEPS];
    struct moe_error err;
    trainer_init(&t);
    t.opt.total_steps = EVERY;
    /* three steps: one checkpoint at step 3 */
    int tok[SEQ + 1];
    for (int s = 0; s < EVERY; s++) {
        exec_data_next(&t.d, tok, SEQ + 1);
        assert_int_equal(exec_ref_model_step(&t.r, tok, SEQ + 1, &loss[s], NULL, t.grad, &err),
                         MOE_OK);
        exec_ref_adamw_step(&t.r, t.grad, t.m1, t.m2, s, &t.opt);
    }
    t.step = EVERY;
    struct exec_ckpt_part p[5];
    int np = parts_of(&t, p);
    struct exec_ckpt_id id = id_of(&t);
    assert_int_equal(exec_ckpt_save(dir, &id, p, np, &err), MOE_OK);
    int step;
    assert_int_equal(exec_ckpt_latest(dir, &step, &err), MOE_ERR_INPUT); /* not committed yet */
    assert_int_equal(exec_ckpt_commit(dir, EVERY, &err), MOE_OK);
    assert_int_equal(exec_ckpt_latest(dir, &step, &err), MOE_OK);
    assert_int_equal(step, EVERY);
    assert_int_equal(exec_ckpt_load(dir, step, &id, p, np, &err), MOE_OK);
    /* another model's size */
    struct exec_ckpt_id other = id;
    other.nparams++;
    assert_int_equal(exec_ckpt_load(dir, step, &other, p, np, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "a checkpoint of tiny-moe-gqa"));
    /* a flipped byte */
    snprintf(path, sizeof path, "%s/step-%08d/rank0-adam_m1.bin", dir, EVERY);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 100, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_equal(exec_ckpt_load(dir, step, &id, p, np, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.file, "rank0-adam_m1.bin"));
    assert_non_null(strstr(err.message, "corrupt"));
    /* truncated */
    assert_int_equal(truncate(path, 1000), 0);
    assert_int_equal(exec_ckpt_load(dir, step, &id, p, np, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "truncated"));
    /* no checkpoint at all */
    char empty[] = "/tmp/moe_test_ckpt_XXXXXX";
    assert_non_null(mkdtemp(empty));
    assert_int_equal(exec_ckpt_latest(empty, &step, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "no checkpoint to resume from"));
    rmdir(empty);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    trainer_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_and_resume),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
