/*
 * test_gpu_run.c: whole training runs of a plan (exec_run, what `moeplan run` calls) on the one
 * GPU, the multi-GPU layouts as virtual ranks (the local transport in device memory):
 *
 *   - equivalence: tiny-moe-gqa, the same seed, data and global batch (8 sequences of 32
 *     tokens), trained with DP 1 (8 micro-batches), DP 2, EP 2, 4 and 8 in every dispatch mode
 *     (alltoall, dedup-gpu, dedup-domain; EP 2 over two domains of one GPU, EP 4 two of 2, EP 8
 *     two of 4), EP 4 x 2 EP groups
 *     (dedup-gpu), DP 1 through NCCL (one rank sending to itself), PP 2 (1F1B), PP 2 x DP 2
 *     with ZeRO-1; and on a 4-block model PP 2 x 2 chunks (interleaved 1F1B) and PP 4 against
 *     that model's DP 1. After one step the per-expert token counts of every MoE layer equal
 *     DP 1's exactly; over 6 steps (lr 1e-3) each step's loss is within 2e-3 relative of DP 1's
 *     (bf16 activations, sums in another order: the single-GPU step's loss tolerance);
 *   - ZeRO-1 over DP 2 and EP 4 repeats the loss curve of the same layout without it bit for
 *     bit, with 1/dp of its optimizer state; so does the gradients' all-reduce after the backward
 *     instead of block by block inside it;
 *   - the dispatch payload the ranks report is nonzero with EP, zero without, and none over
 *     scale-out inside one domain;
 *   - a rank that stops in the middle of step 2 makes the run fail within the timeout, the
 *     message naming that rank.
 * Exits 77 (skipped) where there is no GPU.
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "../unit/moe_test.h"

#include <math.h>
#include <time.h>

enum { SEQ = 32, GBS = 8, STEPS = 6 };

struct run_case {
    const char *name;
    int dp, ep, domain; /* domain: GPUs per NVLink domain */
    enum cost_dispatcher mode;
    bool nccl;
    int zero;
    int same_as;         /* >= 0: the case whose loss curve this one repeats bit for bit */
    int pp, vpp, layers; /* pipeline stages, chunks a rank; blocks of the model (0: its 2) */
    int base;            /* the case it is compared with: its model's one-GPU run */
    bool no_overlap;     /* the gradients' all-reduce after the backward, not block by block */
};

struct collected {
    double loss[STEPS];
    int steps;
    struct cost_bytes sent;
};

static void collect(void *ctx, const struct exec_run_step *s)
{
    struct collected *c = ctx;
    c->loss[s->step - 1] = s->loss;
    c->steps = s->step;
    c->sent.nvlink += s->gpu.dispatch.nvlink;
    c->sent.scale_out += s->gpu.dispatch.scale_out;
}

/* A plan as plan_load would give it, for the case's layout. */
static void make_plan(struct plan_file *p, const struct run_case *rc)
{
    memset(p, 0, sizeof *p);
    moe_test_model("tiny-moe-gqa", &p->model);
    if (rc->layers) p->model.layers = rc->layers;
    struct cost_layout *l = &p->layout;
    int pp = rc->pp ? rc->pp : 1, vpp = rc->vpp ? rc->vpp : 1, V = pp * vpp;
    *l = (struct cost_layout){.tp = 1,
                              .cp = 1,
                              .pp = pp,
                              .vpp = vpp,
                              .ep = rc->ep,
                              .etp = 1,
                              .dp = rc->dp,
                              .zero = rc->zero,
                              .seq_len = SEQ,
                              .mbs = 1,
                              .gbs = GBS,
                              .precision = COST_BF16,
                              .recompute = COST_RECOMPUTE_NONE,
                              .dispatcher = rc->mode,
                              .overlap = false};
    p->gpus = pp * rc->dp;
    p->micro_batches = GBS / rc->dp;
    p->stage_layers = malloc(sizeof *p->stage_layers * (size_t)V);
    assert_non_null(p->stage_layers);
    for (int v = 0; v < V; v++) /* the even split */
        p->stage_layers[v] = p->model.layers / V + (v < p->model.layers % V);
    p->buffer_factor = 0; /* room for every pair: the test's skewed tiny batches */
    p->rank = calloc((size_t)p->gpus, sizeof *p->rank);
    int E = p->model.moe.experts, L = p->model.layers;
    p->placement = malloc(sizeof *p->placement * (size_t)L * E);
    assert_non_null(p->rank);
    assert_non_null(p->placement);
    for (int q = 0; q < p->gpus; q++) /* stage-major, as the planner numbers them */
        p->rank[q] = (struct plan_rank){.domain = q / rc->domain,
                                        .node = q / rc->domain,
                                        .local_gpu = q % rc->domain,
                                        .dp = q % rc->dp,
                                        .pp = q / rc->dp,
                                        .ep = q % rc->dp % rc->ep,
                                        .edp = q % rc->dp / rc->ep};
    for (int b = 0; b < L; b++) /* a placement that is not contiguous */
        for (int e = 0; e < E; e++)
            p->placement[b * E + e] =
                mdl_layer_is_moe(&p->model, b) ? (e * 5 + 3) % E % rc->ep : -1;
}

static bool use_cudnn; /* every run's attention through cuDNN (test_equivalence_cudnn) */

static enum moe_status run_case(const struct run_case *rc, int steps, struct collected *out,
                                struct exec_run_result *res, int fail_rank, double timeout,
                                struct moe_error *err)
{
    struct plan_file p;
    make_plan(&p, rc);
    memset(out, 0, sizeof *out);
    struct exec_run_cfg c;
    memset(&c, 0, sizeof c);
    c.plan = &p;
    c.mode = p.gpus > 1 ? EXEC_RUN_VIRTUAL : EXEC_RUN_THREADS;
    c.nccl = rc->nccl;
    c.seed = 5;
    c.steps = steps;
    c.warmup = 1;
    c.streams = 1;
    c.lr = 1e-3;
    c.timeout_s = timeout;
    c.fail_rank = fail_rank;
    c.fail_step = 2;
    c.attention = use_cudnn ? EXEC_ATTN_CUDNN : EXEC_ATTN_OWN;
    c.no_grad_overlap = rc->no_overlap;
    c.on_step = collect;
    c.ctx = out;
    enum moe_status st = exec_run(&c, res, err);
    plan_file_free(&p);
    return st;
}

#define A2A COST_DISPATCH_ALLTOALL
#define DGPU COST_DISPATCH_DEDUP_GPU
#define DDOM COST_DISPATCH_DEDUP_DOMAIN
static const struct run_case cases[] = {
    {.name = "DP 1", .dp = 1, .ep = 1, .domain = 1, .mode = A2A, .same_as = -1},
    {.name = "DP 2", .dp = 2, .ep = 1, .domain = 2, .mode = A2A, .same_as = -1},
    {.name = "EP 4 dedup-gpu, 2 domains",
     .dp = 4,
     .ep = 4,
     .domain = 2,
     .mode = DGPU,
     .same_as = -1},
    {.name = "EP 2 alltoall", .dp = 2, .ep = 2, .domain = 1, .mode = A2A, .same_as = -1},
    {.name = "EP 2 dedup-gpu", .dp = 2, .ep = 2, .domain = 1, .mode = DGPU, .same_as = -1},
    {.name = "EP 2 dedup-domain, 2 domains",
     .dp = 2,
     .ep = 2,
     .domain = 1,
     .mode = DDOM,
     .same_as = -1},
    {.name = "EP 4 alltoall", .dp = 4, .ep = 4, .domain = 2, .mode = A2A, .same_as = -1},
    {.name = "EP 4 dedup-domain, 2 domains",
     .dp = 4,
     .ep = 4,
     .domain = 2,
     .mode = DDOM,
     .same_as = -1},
    {.name = "EP 8 alltoall", .dp = 8, .ep = 8, .domain = 4, .mode = A2A, .same_as = -1},
    {.name = "EP 8 dedup-gpu", .dp = 8, .ep = 8, .domain = 4, .mode = DGPU, .same_as = -1},
    {.name = "EP 8 dedup-domain, 2 domains",
     .dp = 8,
     .ep = 8,
     .domain = 4,
     .mode = DDOM,
     .same_as = -1},
    {.name = "EP 4 x 2 groups dedup-gpu",
     .dp = 8,
     .ep = 4,
     .domain = 4,
     .mode = DGPU,
     .same_as = -1},
    {.name = "DP 1 over NCCL",
     .dp = 1,
     .ep = 1,
     .domain = 1,
     .mode = A2A,
     .nccl = true,
     .same_as = -1},
    {.name = "DP 2 ZeRO-1", .dp = 2, .ep = 1, .domain = 2, .mode = A2A, .zero = 1, .same_as = 1},
    {.name = "EP 4 dedup-gpu ZeRO-1",
     .dp = 4,
     .ep = 4,
     .domain = 2,
     .mode = DGPU,
     .zero = 1,
     .same_as = 2},
    {.name = "PP 2", .dp = 1, .ep = 1, .domain = 2, .mode = A2A, .same_as = -1, .pp = 2, .vpp = 1},
    {.name = "PP 2 x DP 2, ZeRO-1",
     .dp = 2,
     .ep = 1,
     .domain = 4,
     .mode = A2A,
     .zero = 1,
     .same_as = -1,
     .pp = 2,
     .vpp = 1},
    {.name = "DP 1, 4 blocks",
     .dp = 1,
     .ep = 1,
     .domain = 1,
     .mode = A2A,
     .same_as = -1,
     .layers = 4,
     .base = 17},
    {.name = "PP 2 x 2 chunks (interleaved)",
     .dp = 1,
     .ep = 1,
     .domain = 2,
     .mode = A2A,
     .same_as = -1,
     .pp = 2,
     .vpp = 2,
     .layers = 4,
     .base = 17},
    {.name = "PP 4, 4 blocks",
     .dp = 1,
     .ep = 1,
     .domain = 4,
     .mode = A2A,
     .same_as = -1,
     .pp = 4,
     .vpp = 1,
     .layers = 4,
     .base = 17},
    {.name = "DP 2, all-reduce after",
     .dp = 2,
     .ep = 1,
     .domain = 2,
     .mode = A2A,
     .same_as = 1,
     .no_overlap = true},
    {.name = "EP 4 dedup-gpu, all-reduce after",
     .dp = 4,
     .ep = 4,
     .domain = 2,
     .mode = DGPU,
     .same_as = 2,
     .no_overlap = true},
};

static void equivalence(void)
{
    struct moe_error err;
    int n = (int)(sizeof cases / sizeof cases[0]), E = 8;
    int64_t counts[24][32];
    double curves[24][STEPS], optimizer_bytes[24];
    for (int i = 0; i < n; i++) {
        struct collected one, curve;
        struct exec_run_result res;
        if (run_case(&cases[i], 1, &one, &res, -1, 60.0, &err) != MOE_OK)
            fail_msg("%s: %s", cases[i].name, err.message);
        assert_true(res.filled);
        int L = cases[i].layers ? cases[i].layers : 2, b = cases[i].base;
        assert_true(E * L <= 32);
        memcpy(counts[i], res.counts, sizeof(int64_t) * (size_t)E * L);
        for (int j = 0; j < E * L; j++)
            if (counts[i][j] != counts[b][j])
                fail_msg("%s: layer %d expert %d has %lld tokens after one step, %s %lld",
                         cases[i].name, j / E, j % E, (long long)counts[i][j], cases[b].name,
                         (long long)counts[b][j]);
        exec_run_result_free(&res);
        if (run_case(&cases[i], STEPS, &curve, &res, -1, 60.0, &err) != MOE_OK)
            fail_msg("%s: %s", cases[i].name, err.message);
        optimizer_bytes[i] = res.memory.bytes[EXEC_MEM_OPTIMIZER];
        exec_run_result_free(&res);
        memcpy(curves[i], curve.loss, sizeof curves[i]);
        int same = cases[i].same_as;
        if (same >= 0) { /* ZeRO-1: the same sums, the same updates: the same bits */
            if (memcmp(curves[same], curve.loss, sizeof curve.loss))
                fail_msg("%s: the loss curve differs from %s's", cases[i].name, cases[same].name);
            double f = optimizer_bytes[i] / optimizer_bytes[same];
            printf("%s: loss curve bit-identical to %s's; optimizer state %.0f of %.0f bytes "
                   "(%.3f)\n",
                   cases[i].name, cases[same].name, optimizer_bytes[i], optimizer_bytes[same], f);
            if (cases[i].zero) assert_true(f < 1.0 / cases[i].dp + 0.01);
        }
        assert_int_equal(curve.steps, STEPS);
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            double rel = fabs(curve.loss[s] - curves[b][s]) / fabs(curves[b][s]);
            if (rel > worst) worst = rel;
            if (!(rel <= 2e-3))
                fail_msg("%s: step %d loss %.6f, %s %.6f", cases[i].name, s + 1, curve.loss[s],
                         cases[b].name, curves[b][s]);
        }
        printf("%-30s loss %.5f -> %.5f, worst step difference from %s %.2e; dispatch %.0f B "
               "NVLink, %.0f B scale-out\n",
               cases[i].name, curve.loss[0], curve.loss[STEPS - 1], cases[b].name, worst,
               curve.sent.nvlink, curve.sent.scale_out);
        if (cases[i].ep > 1) assert_true(curve.sent.nvlink + curve.sent.scale_out > 0);
        if (cases[i].ep > 1 && cases[i].ep <= cases[i].domain)
            assert_true(curve.sent.scale_out == 0);
        if (cases[i].ep == 1) assert_true(curve.sent.nvlink + curve.sent.scale_out == 0);
    }
}

static void test_equivalence(void **state)
{
    (void)state;
    use_cudnn = false;
    equivalence();
}

/* The same with cuDNN's fused attention (where the build has it): the same bits where the
 * layouts must give them, the same tolerances elsewhere. */
static void test_equivalence_cudnn(void **state)
{
    (void)state;
#ifndef MOEPLAN_HAVE_CUDNN
    skip();
#else
    use_cudnn = true;
    equivalence();
    use_cudnn = false;
#endif
}

/* Rank 2 of EP 4 stops in the middle of step 2: the run fails, naming it, within the timeout. */
static void test_rank_stops(void **state)
{
    (void)state;
    struct moe_error err;
    struct collected c;
    struct exec_run_result res;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    enum moe_status st = run_case(&cases[2], 4, &c, &res, 2, 5.0, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    exec_run_result_free(&res);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    printf("EP 4, rank 2 stopping in step 2: %s (run ended after %.2f s, %d step(s) reported)\n",
           err.message, s, c.steps);
    assert_int_equal(st, MOE_ERR_RUNTIME);
    assert_non_null(strstr(err.message, "rank 2"));
    assert_int_equal(c.steps, 1);
    assert_true(s < 5.0 + 10.0); /* the timeout, plus creating the four ranks */
}

int main(void)
{
    int n = 0;
    struct moe_error err;
    if (exec_device_count(&n, &err) != MOE_OK || n < 1) {
        printf("no CUDA GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equivalence),
        cmocka_unit_test(test_equivalence_cudnn),
        cmocka_unit_test(test_rank_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
