/*
 * test_ref_parallel.c: expert, data and pipeline parallelism on the CPU:
 *   - the exchange's rows and bytes on a routing counted by hand, and on 300 random ones;
 *   - the reference's EP layer on R virtual ranks (the local transport) against the one-rank
 *     layer on the same tokens, for R = 1, 2, 4, 8 and every dedup mode;
 *   - a whole model trained three steps on R ranks (EP in every mode, or DP alone), and in
 *     pipeline stages (1F1B), against one rank on the same global batch;
 *   - the transport's failure paths (a failing rank, a rank that never comes) ending in a
 *     message, not a hang;
 *   - the launcher: ranks from Open MPI's or Slurm's variables, the NCCL id through a file.
 */
#include "exec.h" /* before moe_test.h: its layer helper needs exec.h */

#include "moe_test.h"

#include <math.h>
#include <time.h>
#include <unistd.h>

/* 4 ranks in 2 NVLink domains, experts e on rank e / 2, top-3; rank 0's three tokens:
 *   t0 -> experts 0 1 2 (ranks 0 0 1)   t1 -> 4 5 6 (2 2 3)   t2 -> 2 6 7 (1 3 3)
 * rows per destination rank, counted by hand:
 *   alltoall   t0: 0 0 1, t1: 2 2 3, t2: 1 3 3              -> 2 2 2 3
 *   per GPU    t0: 0 1,   t1: 2 3,   t2: 1 3                -> 1 2 1 2
 *   per domain t0: 0 1, t1: landing 2, t2: 1 and landing 2  -> 1 2 2 0
 *              then rank 2 forwards t1 (expert 6) and t2 (6, 7) to rank 3: 2 rows */
static void test_rows_by_hand(void **state)
{
    (void)state;
    int placement[8] = {0, 0, 1, 1, 2, 2, 3, 3}, domain[4] = {0, 0, 1, 1};
    int choice[9] = {0, 1, 2, 4, 5, 6, 2, 6, 7}, src[3] = {0, 0, 0};
    double weight[9] = {0.5, 0.3, 0.2, 0.4, 0.4, 0.2, 0.6, 0.3, 0.1};
    int want[3][4] = {{2, 2, 2, 3}, {1, 2, 1, 2}, {1, 2, 2, 0}};
    enum cost_dispatcher modes[3] = {COST_DISPATCH_ALLTOALL, COST_DISPATCH_DEDUP_GPU,
                                     COST_DISPATCH_DEDUP_DOMAIN};
    double want_nvlink[3] = {2, 2, 4}, want_scale_out[3] = {5, 3, 2};
    struct moe_error err;
    for (int m = 0; m < 3; m++) {
        struct exec_ep_group g = {4, 8, 3, placement, domain, modes[m]};
        struct exec_ep_rows r1, r2;
        assert_int_equal(exec_ep_first_hop(&g, 0, choice, weight, 3, &r1, &err), MOE_OK);
        for (int d = 0; d < 4; d++) assert_int_equal(r1.count[d], want[m][d]);
        struct cost_bytes ours = {0, 0}, planner;
        exec_ep_rows_bytes(&g, 0, &r1, 1.0, &ours);
        /* the second hop at rank 2, from the rows rank 0 sent it */
        int at2 = r1.count[0] + r1.count[1];
        assert_int_equal(exec_ep_second_hop(&g, 2, r1.meta + at2, r1.count[2], &r2, &err), MOE_OK);
        assert_int_equal(r2.n, m == 2 ? 2 : 0);
        if (m == 2) {
            assert_int_equal(r2.count[3], 2);
            /* t1's row to rank 3 carries slot 2 (expert 6) only; t2's slots 1 and 2 (6, 7) */
            assert_int_equal(r2.meta[0].src_token, 1);
            assert_int_equal(r2.meta[0].expert[0], -1);
            assert_int_equal(r2.meta[0].expert[2], 6);
            assert_int_equal(r2.meta[1].expert[1], 6);
            assert_int_equal(r2.meta[1].expert[2], 7);
            assert_true(r2.meta[1].weight[2] == 0.1);
        }
        exec_ep_rows_bytes(&g, 2, &r2, 1.0, &ours);
        cost_dispatch_bytes_exact(choice, src, 3, 3, placement, domain, modes[m], 1.0, &planner);
        printf("%-9s rows nvlink %g scale-out %g (planner %g %g)\n", cost_dispatcher_names[m],
               ours.nvlink, ours.scale_out, planner.nvlink, planner.scale_out);
        assert_true(ours.nvlink == want_nvlink[m] && ours.scale_out == want_scale_out[m]);
        assert_true(planner.nvlink == want_nvlink[m] && planner.scale_out == want_scale_out[m]);
        exec_ep_rows_free(&r1);
        exec_ep_rows_free(&r2);
    }
    int bad_domain[4] = {0, 1, 0, 1};
    struct exec_ep_group g = {4, 8, 3, placement, bad_domain, COST_DISPATCH_DEDUP_DOMAIN};
    assert_int_equal(exec_ep_group_check(&g, &err), MOE_ERR_INPUT);
    printf("%s\n", err.message);
}

/* Random exchanges, no transport: every rank's first hop delivered in rank order, every second
 * hop likewise; then each (rank, token, slot) must be computed exactly once, at the rank that
 * holds its expert, and the bytes must be the planner's. 300 cases: 1-8 ranks, domains of every
 * size dividing them, 1-16 experts anywhere, top-1 to top-4, 0-6 tokens a rank. */
static void test_exchange_random(void **state)
{
    (void)state;
    struct moe_rng rng;
    moe_rng_seed(&rng, 2026);
    struct moe_error err;
    for (int c = 0; c < 300; c++) {
        int R = 1 + (int)moe_rng_below(&rng, 8), dsz;
        do dsz = 1 + (int)moe_rng_below(&rng, (uint64_t)R);
        while (R % dsz);
        int E = R + (int)moe_rng_below(&rng, (uint64_t)(17 - R));
        int k = 1 + (int)moe_rng_below(&rng, 4);
        if (k > E) k = E;
        enum cost_dispatcher mode = (enum cost_dispatcher)moe_rng_below(&rng, 3);
        int placement[16], domain[8], T[8], first[9] = {0};
        for (int e = 0; e < E; e++) placement[e] = (int)moe_rng_below(&rng, (uint64_t)R);
        for (int r = 0; r < R; r++) {
            domain[r] = r / dsz;
            T[r] = (int)moe_rng_below(&rng, 7);
            first[r + 1] = first[r] + T[r];
        }
        int N = first[R];
        int *choice = calloc((size_t)(N ? N : 1) * k, sizeof(int));
        int *src = calloc((size_t)N + 1, sizeof(int));
        double *weight = calloc((size_t)(N ? N : 1) * k, sizeof(double));
        int *seen = calloc((size_t)(N ? N : 1) * k, sizeof(int));
        for (int t = 0; t < N; t++) {
            for (int j = 0; j < k; j++) {
                int e, dup;
                do {
                    e = (int)moe_rng_below(&rng, (uint64_t)E);
                    dup = 0;
                    for (int i = 0; i < j; i++) dup |= choice[t * k + i] == e;
                } while (dup);
                choice[t * k + j] = e;
                weight[t * k + j] = 1.0 / k;
            }
        }
        struct exec_ep_group g = {R, E, k, placement, domain, mode};
        struct exec_ep_rows h1[8], h2[8];
        struct cost_bytes ours = {0, 0}, planner;
        for (int r = 0; r < R; r++) {
            for (int t = first[r]; t < first[r + 1]; t++) src[t] = r;
            assert_int_equal(exec_ep_first_hop(&g, r, choice + (size_t)first[r] * k,
                                               weight + (size_t)first[r] * k, T[r], &h1[r], &err),
                             MOE_OK);
            exec_ep_rows_bytes(&g, r, &h1[r], 1.0, &ours);
        }
        for (int hop = 0; hop < 2; hop++) {
            struct exec_ep_rows *out = hop ? h2 : h1;
            for (int d = 0; d < R; d++) {
                /* what d receives, in rank order */
                struct exec_ep_meta recv[512];
                int n = 0;
                for (int s2 = 0; s2 < R; s2++) {
                    int at = 0;
                    for (int q = 0; q < d; q++) at += out[s2].count[q];
                    for (int i = 0; i < out[s2].count[d]; i++) recv[n++] = out[s2].meta[at + i];
                }
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < k; j++)
                        if (exec_ep_slot_here(&g, d, &recv[i], j))
                            seen[(first[recv[i].src_rank] + recv[i].src_token) * k + j]++;
                if (!hop) {
                    assert_int_equal(exec_ep_second_hop(&g, d, recv, n, &h2[d], &err), MOE_OK);
                    exec_ep_rows_bytes(&g, d, &h2[d], 1.0, &ours);
                }
            }
        }
        for (int i = 0; i < N * k; i++)
            if (seen[i] != 1)
                fail_msg("case %d (%d ranks, %s): pair %d computed %d times", c, R,
                         cost_dispatcher_names[mode], i, seen[i]);
        cost_dispatch_bytes_exact(choice, src, N, k, placement, domain, mode, 1.0, &planner);
        assert_true(ours.nvlink == planner.nvlink && ours.scale_out == planner.scale_out);
        for (int r = 0; r < R; r++) exec_ep_rows_free(&h1[r]), exec_ep_rows_free(&h2[r]);
        free(choice), free(src), free(weight), free(seen);
    }
    printf("300 random exchanges: every pair computed once, where its expert is; bytes as "
           "planned\n");
}

/* One EP run: every rank's tokens, outputs and gradients in the test's buffers. */
struct ep_run {
    const struct exec_ep_group *g;
    const struct exec_ref_moe *w;
    const double *x, *dy;
    const int *first; /* (ranks + 1) token offsets */
    double *y, *dx;
    struct exec_ref_moe_grad *grad; /* per rank */
    struct cost_bytes *sent;        /* per rank */
};

static enum moe_status ep_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct ep_run *a = arg;
    int r = t->rank, h = a->w->hidden, T = a->first[r + 1] - a->first[r];
    size_t o = (size_t)a->first[r] * h;
    enum moe_status st =
        exec_ref_ep_moe_forward(t, a->g, a->w, a->x + o, T, a->y + o, &a->sent[r], err);
    if (st != MOE_OK) return st;
    return exec_ref_ep_moe_backward(t, a->g, a->w, a->x + o, T, a->dy + o, a->dx + o, &a->grad[r],
                                    err);
}

static double *zeros(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

static void grad_alloc(struct exec_ref_moe_grad *g, const struct moe_test_layer *L)
{
    double **slot[7] = {&g->router, &g->gate, &g->up, &g->down, &g->sgate, &g->sup, &g->sdown};
    for (int i = 0; i < 7; i++) *slot[i] = zeros(L->sizes[i]);
}

static void grad_free(struct exec_ref_moe_grad *g)
{
    double *p[7] = {g->router, g->gate, g->up, g->down, g->sgate, g->sup, g->sdown};
    for (int i = 0; i < 7; i++) free(p[i]);
}

/* Tolerance: 1e-12 of the largest value (double precision; only the order of sums differs). */
static void ep_case(int R, int per_domain, enum cost_dispatcher mode)
{
    struct exec_router_cfg cfg = {8, 3, MDL_SCORE_SOFTMAX, 1, 1, true, false, 1.0, 0.0};
    const int h = 12, f = 8, fs = 6, E = cfg.experts, k = cfg.top_k;
    struct moe_test_layer L;
    moe_test_layer_init(&L, cfg, h, f, fs, 100 + R);
    int placement[8], domain[8], first[9] = {0};
    for (int e = 0; e < E; e++) placement[e] = (e * 5 + 3) % E % R;
    for (int r = 0; r < R; r++) {
        domain[r] = r / per_domain;
        first[r + 1] = first[r] + (r == 1 && R > 2 ? 0 : 4 + 2 * r); /* rank 1: no tokens */
    }
    int T = first[R];
    struct moe_rng rng;
    moe_rng_seed(&rng, 7 + R);
    double *x = zeros((size_t)T * h), *dy = zeros((size_t)T * h);
    for (int i = 0; i < T * h; i++) {
        x[i] = moe_rng_normal(&rng);
        dy[i] = moe_rng_normal(&rng);
    }
    /* one rank */
    double *yr = zeros((size_t)T * h), *dxr = zeros((size_t)T * h);
    int *choice = calloc((size_t)T * k, sizeof(int)), *src = calloc((size_t)T + 1, sizeof(int));
    struct exec_ref_moe_grad gr;
    grad_alloc(&gr, &L);
    struct moe_error err;
    assert_int_equal(exec_ref_moe_forward(&L.w, x, T, yr, choice, NULL, &err), MOE_OK);
    assert_int_equal(exec_ref_moe_backward(&L.w, x, T, dy, dxr, &gr, &err), MOE_OK);
    /* R virtual ranks */
    struct exec_ep_group g = {R, E, k, placement, domain, mode};
    struct exec_ref_moe_grad grads[8];
    struct cost_bytes sent[8] = {{0, 0}};
    for (int r = 0; r < R; r++) grad_alloc(&grads[r], &L);
    double *y = zeros((size_t)T * h), *dx = zeros((size_t)T * h);
    struct ep_run run = {&g, &L.w, x, dy, first, y, dx, grads, sent};
    struct exec_local_hub *hub;
    assert_int_equal(exec_local_hub_create(&hub, R, 10.0, &err), MOE_OK);
    if (exec_local_run(hub, ep_rank, &run, &err) != MOE_OK) fail_msg("%s", err.message);
    exec_local_hub_destroy(hub);
    moe_expect_close("y", y, yr, (size_t)T * h, 1e-12);
    moe_expect_close("dx", dx, dxr, (size_t)T * h, 1e-12);
    const double *want[7] = {gr.router, gr.gate, gr.up, gr.down, gr.sgate, gr.sup, gr.sdown};
    const char *names[7] = {"router", "gate", "up", "down", "sgate", "sup", "sdown"};
    for (int i = 0; i < 7; i++) {
        double *sum = zeros(L.sizes[i]);
        for (int r = 0; r < R; r++) {
            const double *p[7] = {grads[r].router, grads[r].gate, grads[r].up,   grads[r].down,
                                  grads[r].sgate,  grads[r].sup,  grads[r].sdown};
            for (size_t j = 0; j < L.sizes[i]; j++) sum[j] += p[i][j];
        }
        moe_expect_close(names[i], sum, want[i], L.sizes[i], 1e-12);
        free(sum);
    }
    /* the bytes it moved are the planner's exact count for the same routing */
    struct cost_bytes total = {0, 0}, planner;
    for (int r = 0; r < R; r++) {
        total.nvlink += sent[r].nvlink;
        total.scale_out += sent[r].scale_out;
        for (int t = first[r]; t < first[r + 1]; t++) src[t] = r;
    }
    cost_dispatch_bytes_exact(choice, src, T, k, placement, domain, mode, h * sizeof(double),
                              &planner);
    printf("EP %d (%d a domain) %-9s: %d tokens, dispatch %6.0f B NVLink %6.0f B scale-out, as "
           "the planner counts\n",
           R, per_domain, cost_dispatcher_names[mode], T, total.nvlink, total.scale_out);
    assert_true(total.nvlink == planner.nvlink && total.scale_out == planner.scale_out);
    for (int r = 0; r < R; r++) grad_free(&grads[r]);
    grad_free(&gr);
    free(x), free(dy), free(yr), free(dxr), free(y), free(dx), free(choice), free(src);
    moe_test_layer_free(&L);
}

static void test_ep_equals_one_rank(void **state)
{
    (void)state;
    enum cost_dispatcher modes[3] = {COST_DISPATCH_ALLTOALL, COST_DISPATCH_DEDUP_GPU,
                                     COST_DISPATCH_DEDUP_DOMAIN};
    int ranks[4] = {1, 2, 4, 8}, per_domain[4] = {1, 1, 2, 4};
    for (int i = 0; i < 4; i++)
        for (int m = 0; m < 3; m++) ep_case(ranks[i], per_domain[i], modes[m]);
    ep_case(8, 2, COST_DISPATCH_DEDUP_DOMAIN); /* four domains */
}

/* Training twins: a whole model trained TW_STEPS AdamW steps on R ranks, each computing its
 * share of the step's mean gradient and loss (grad_step), summed over the ranks by the transport;
 * against one rank stepping on the mean gradient of the same sequences. Losses and parameters
 * within 1e-10 relative. */
#define TW_STEPS 3
#define TW_T 17
struct trainer {
    const struct mdl_model *m;
    const int *tokens; /* (steps, per_step, TW_T) */
    int per_step;
    enum moe_status (*grad_step)(struct exec_transport *t, const struct exec_ref_model *r,
                                 const int *tokens, double *loss, double *grad, const void *ctx,
                                 struct moe_error *err);
    const void *ctx;
    bool zero1;            /* ZeRO-1 (reduce-scatter, shard update, all-gather), else all-reduce */
    double aux_coef;       /* the model's load-balance loss */
    double loss[TW_STEPS]; /* rank 0's */
    double *params;        /* rank 0's after the last step */
};

static void adamw_for_twins(struct exec_adamw *o)
{
    exec_adamw_defaults(o);
    o->total_steps = TW_STEPS;
    o->warmup_steps = 1;
}

static enum moe_status train_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct trainer *a = arg;
    struct exec_ref_model r;
    enum moe_status st = exec_ref_model_create(&r, a->m, 5, err);
    if (st != MOE_OK) return st;
    r.aux_coef = a->aux_coef;
    struct exec_adamw o;
    adamw_for_twins(&o);
    double *grad = calloc(r.nparams, sizeof *grad), *m1 = calloc(r.nparams, sizeof *m1),
           *m2 = calloc(r.nparams, sizeof *m2);
    for (int s = 0; s < TW_STEPS && st == MOE_OK; s++) {
        double loss[1];
        st = a->grad_step(t, &r, a->tokens + (size_t)s * a->per_step * TW_T, loss, grad, a->ctx,
                          err);
        double norm;
        if (st == MOE_OK && a->zero1)
            st = exec_ref_zero1_step(t, &r, grad, m1, m2, s + 1, &o, &norm, err);
        else if (st == MOE_OK)
            st = t->ops->allreduce_sum(t, grad, r.nparams, err);
        if (st == MOE_OK) st = t->ops->allreduce_sum(t, loss, 1, err);
        if (st != MOE_OK) break;
        if (!a->zero1) exec_ref_adamw_step(&r, grad, m1, m2, s + 1, &o);
        if (t->rank == 0) a->loss[s] = loss[0];
    }
    if (st == MOE_OK && t->rank == 0) memcpy(a->params, r.params, sizeof *r.params * r.nparams);
    free(grad), free(m1), free(m2);
    exec_ref_model_destroy(&r);
    return st;
}

/* Run the trainer on R ranks and compare it with one rank on the same tokens. */
static void check_twin(const char *label, struct trainer *tr, int R)
{
    struct moe_error err;
    struct exec_ref_model r;
    assert_int_equal(exec_ref_model_create(&r, tr->m, 5, &err), MOE_OK);
    r.aux_coef = tr->aux_coef;
    struct exec_adamw o;
    adamw_for_twins(&o);
    double *g = calloc(r.nparams, sizeof *g), *sum = calloc(r.nparams, sizeof *sum),
           *m1 = calloc(r.nparams, sizeof *m1), *m2 = calloc(r.nparams, sizeof *m2);
    double want[TW_STEPS];
    for (int s = 0; s < TW_STEPS; s++) {
        memset(sum, 0, sizeof *sum * r.nparams);
        want[s] = 0;
        for (int q = 0; q < tr->per_step; q++) {
            double l;
            assert_int_equal(exec_ref_model_step(&r,
                                                 tr->tokens + ((size_t)s * tr->per_step + q) * TW_T,
                                                 TW_T, &l, NULL, g, &err),
                             MOE_OK);
            want[s] += l / tr->per_step;
            for (size_t i = 0; i < r.nparams; i++) sum[i] += g[i] / tr->per_step;
        }
        exec_ref_adamw_step(&r, sum, m1, m2, s + 1, &o);
    }
    tr->params = calloc(r.nparams, sizeof(double));
    struct exec_local_hub *hub;
    assert_int_equal(exec_local_hub_create(&hub, R, 30.0, &err), MOE_OK);
    if (exec_local_run(hub, train_rank, tr, &err) != MOE_OK) fail_msg("%s", err.message);
    exec_local_hub_destroy(hub);
    printf("%s: loss", label);
    for (int s = 0; s < TW_STEPS; s++) printf(" %.12f/%.12f", tr->loss[s], want[s]);
    printf("\n");
    moe_expect_near("losses", tr->loss, want, TW_STEPS, 1e-10, 0.0);
    moe_expect_close("parameters after the steps", tr->params, r.params, r.nparams, 1e-10);
    free(g), free(sum), free(m1), free(m2), free(tr->params);
    exec_ref_model_destroy(&r);
}

static void twin_tokens(const struct mdl_model *m, int *tokens, size_t n, uint64_t seed)
{
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) tokens[i] = (int)moe_rng_below(&rng, (uint64_t)m->vocab);
}

/* EP (or DP alone: no group) on one sequence a rank: this rank's share is 1/R of its gradient. */
static enum moe_status ep_grad_step(struct exec_transport *t, const struct exec_ref_model *r,
                                    const int *tokens, double *loss, double *grad, const void *ctx,
                                    struct moe_error *err)
{
    const struct exec_ep_group *g = ctx;
    struct exec_ref_ep ep = {t, g};
    enum moe_status st = exec_ref_model_step_ep(r, g ? &ep : NULL, tokens + (size_t)t->rank * TW_T,
                                                TW_T, loss, NULL, grad, err);
    for (size_t i = 0; st == MOE_OK && i < r->nparams; i++) grad[i] /= t->ranks;
    *loss /= t->ranks;
    return st;
}

static void test_model_twin(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    int tokens[TW_STEPS * 8 * TW_T];
    twin_tokens(&m, tokens, sizeof tokens / sizeof *tokens, 11);
    int cases[][2] = {{2, -1}, {2, 0}, {2, 1}, {2, 2}, {4, 0},
                      {4, 1},  {4, 2}, {8, 0}, {8, 1}, {8, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int R = cases[c][0], mode = cases[c][1], placement[8], domain[8];
        for (int e = 0; e < m.moe.experts; e++) placement[e] = e / (m.moe.experts / R);
        for (int q = 0; q < R; q++) domain[q] = q / (R / 2);
        struct exec_ep_group g = {R,           m.moe.experts,
                                  m.moe.top_k, placement,
                                  domain,      (enum cost_dispatcher)(mode < 0 ? 0 : mode)};
        for (int aux = 0; aux < (R == 4 && mode == 1 ? 2 : 1); aux++) {
            struct trainer tr = {&m,    tokens,           R,   ep_grad_step, mode < 0 ? NULL : &g,
                                 false, aux ? 0.01 : 0.0, {0}, NULL};
            char label[128];
            snprintf(label, sizeof label, "%s %d ranks (%d a domain) %s%s", mode < 0 ? "DP" : "EP",
                     R, R / 2, mode < 0 ? "" : cost_dispatcher_names[mode],
                     aux ? ", load-balance loss 0.01 (each rank's own tokens)" : "");
            check_twin(label, &tr, R);
        }
    }
}

/* ZeRO-1 over 2, 3 and 4 data-parallel ranks (3: shards of unequal size), and with EP. */
static void test_zero1_twin(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    int tokens[TW_STEPS * 4 * TW_T];
    twin_tokens(&m, tokens, sizeof tokens / sizeof *tokens, 17);
    for (int R = 2; R <= 4; R++) {
        struct trainer tr = {&m, tokens, R, ep_grad_step, NULL, true, 0.0, {0}, NULL};
        char label[64];
        snprintf(label, sizeof label, "DP %d ranks, ZeRO-1", R);
        check_twin(label, &tr, R);
    }
    int placement[8], domain[4] = {0, 0, 1, 1};
    for (int e = 0; e < 8; e++) placement[e] = e / 2;
    struct exec_ep_group g = {4, 8, m.moe.top_k, placement, domain, COST_DISPATCH_DEDUP_DOMAIN};
    struct trainer tr = {&m, tokens, 4, ep_grad_step, &g, true, 0.0, {0}, NULL};
    check_twin("EP 4 ranks dedup-domain, ZeRO-1", &tr, 4);
}

/* PP: stages of blocks, PP_M micro-batches a step in 1F1B (interleaved with vpp > 1); the
 * pipeline gives each rank's share. */
#define PP_M 4
struct pp_case {
    const char *model;
    int layers, ranks, vpp, first[9];
};
static enum moe_status pp_grad_step(struct exec_transport *t, const struct exec_ref_model *r,
                                    const int *tokens, double *loss, double *grad, const void *ctx,
                                    struct moe_error *err)
{
    const struct pp_case *pc = ctx;
    return exec_ref_pipeline_step(t, r, pc->first, pc->vpp, tokens, PP_M, TW_T, loss, grad, err);
}

static void test_pipeline_twin(void **state)
{
    (void)state;
    static const struct pp_case cases[] = {
        {"tiny-moe-mla", 0, 2, 1, {0, 2, 3}},
        {"tiny-moe-mla", 0, 3, 1, {0, 1, 2, 3}},
        {"tiny-moe-gqa", 0, 2, 1, {0, 1, 2}},
        {"tiny-moe-gqa", 4, 2, 2, {0, 1, 2, 3, 4}}, /* interleaved: 2 ranks x 2 chunks */
        {"tiny-moe-gqa", 9, 2, 4, {0, 1, 2, 3, 4, 5, 6, 7, 9}}, /* 2 x 4, uneven chunks */
        {"tiny-moe-gqa", 6, 3, 2, {0, 1, 2, 3, 4, 5, 6}}};      /* 3 x 2 (PP_M not a multiple) */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct mdl_model m;
        moe_test_model(cases[c].model, &m);
        if (cases[c].layers) m.layers = cases[c].layers;
        int tokens[TW_STEPS * PP_M * TW_T];
        twin_tokens(&m, tokens, sizeof tokens / sizeof *tokens, 13);
        char label[128];
        snprintf(label, sizeof label, "PP %d ranks x %d chunks of %s (%d layers), %d micro-batches",
                 cases[c].ranks, cases[c].vpp, cases[c].model, m.layers, PP_M);
        if (cases[c].vpp > 1 && PP_M % cases[c].ranks) { /* refused, by name */
            struct moe_error err;
            struct exec_ref_model r;
            assert_int_equal(exec_ref_model_create(&r, &m, 5, &err), MOE_OK);
            double *g = calloc(r.nparams, sizeof *g), l;
            struct exec_transport t1 = {0, cases[c].ranks, NULL, NULL};
            assert_int_equal(exec_ref_pipeline_step(&t1, &r, cases[c].first, cases[c].vpp, tokens,
                                                    PP_M, TW_T, &l, g, &err),
                             MOE_ERR_INPUT);
            printf("%s: %s\n", label, err.message);
            free(g);
            exec_ref_model_destroy(&r);
            continue;
        }
        struct trainer tr = {&m, tokens, PP_M, pp_grad_step, &cases[c], false, 0.0, {0}, NULL};
        check_twin(label, &tr, cases[c].ranks);
    }
}

/* A rank that fails at once, and one that never arrives: the others stop with a message. */
static enum moe_status faulty(struct exec_transport *t, void *arg, struct moe_error *err)
{
    int mode = *(int *)arg, send[4] = {1, 1, 1, 1}, recv[4];
    if (t->rank == 1 && mode == 0)
        return moe_error_set(err, MOE_ERR_RUNTIME, "rank 1 gave up on purpose");
    if (t->rank == 1 && mode == 1) usleep(600000); /* past the 0.2 s deadline */
    for (int i = 0; i < 3; i++) {
        enum moe_status st = t->ops->counts(t, send, recv, err);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

static void test_transport_faults(void **state)
{
    (void)state;
    struct exec_local_hub *hub;
    struct moe_error err;
    assert_int_equal(exec_local_hub_create(&hub, 4, 0.2, &err), MOE_OK);
    for (int mode = 0; mode < 2; mode++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        assert_int_equal(exec_local_run(hub, faulty, &mode, &err), MOE_ERR_RUNTIME);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        printf("%s (%.2f s)\n", err.message, s);
        assert_non_null(strstr(err.message, mode == 0 ? "gave up on purpose" : "timed out"));
        if (mode == 1) assert_non_null(strstr(err.message, "waiting for rank 1"));
        assert_true(s < 2.0);
    }
    int ok = 2;
    assert_int_equal(exec_local_run(hub, faulty, &ok, &err), MOE_OK); /* the hub is reusable */
    exec_local_hub_destroy(hub);
}

/* Splits: 6 ranks into the plan's kind of groups (EP: 0-2 and 3-5; expert-DP: r % 3), each
 * group's all-reduce and all-gather its own; a rank that fails while the others wait in a group
 * ends them. */
struct split_arg {
    int fail; /* -1: none; else this rank fails after the splits */
    double sum_ep[6], sum_edp[6];
    int rank_ep[6], size_ep[6], rank_edp[6];
    bool gathered_ok[6];
};

static enum moe_status split_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct split_arg *a = arg;
    int me = t->rank;
    struct exec_transport ep, edp;
    enum moe_status st = t->ops->split(t, me / 3, &ep, err);
    if (st != MOE_OK) return st;
    if ((st = t->ops->split(t, me % 3, &edp, err)) != MOE_OK) {
        ep.ops->release(&ep);
        return st;
    }
    a->rank_ep[me] = ep.rank;
    a->size_ep[me] = ep.ranks;
    a->rank_edp[me] = edp.rank;
    double x = 1 << me, y = 100.0 * (me + 1);
    if (me == a->fail) {
        st = moe_error_set(err, MOE_ERR_RUNTIME, "rank %d gave up inside its groups", me);
    } else {
        if ((st = ep.ops->allreduce_sum(&ep, &x, 1, err)) == MOE_OK)
            st = edp.ops->allreduce_sum(&edp, &y, 1, err);
        float parts[6] = {0}; /* the EP group's all-gather: two floats a rank, in place */
        parts[2 * ep.rank] = (float)me;
        parts[2 * ep.rank + 1] = -(float)me;
        if (st == MOE_OK) st = ep.ops->allgather_f32(&ep, parts, 2, err);
        for (int q = 0; q < 3 && st == MOE_OK; q++)
            a->gathered_ok[me] &= parts[2 * q] == (float)(me / 3 * 3 + q) &&
                                  parts[2 * q + 1] == -(float)(me / 3 * 3 + q);
    }
    a->sum_ep[me] = x;
    a->sum_edp[me] = y;
    ep.ops->release(&ep);
    edp.ops->release(&edp);
    return st;
}

static void test_transport_split(void **state)
{
    (void)state;
    struct exec_local_hub *hub;
    struct moe_error err;
    assert_int_equal(exec_local_hub_create(&hub, 6, 5.0, &err), MOE_OK);
    struct split_arg a = {.fail = -1, .gathered_ok = {1, 1, 1, 1, 1, 1}};
    if (exec_local_run(hub, split_rank, &a, &err) != MOE_OK) fail_msg("%s", err.message);
    for (int r = 0; r < 6; r++) {
        assert_int_equal(a.rank_ep[r], r % 3); /* ordered by the parent's rank */
        assert_int_equal(a.size_ep[r], 3);
        assert_int_equal(a.rank_edp[r], r / 3);
        assert_true(a.sum_ep[r] == (r < 3 ? 1 + 2 + 4 : 8 + 16 + 32));
        assert_true(a.sum_edp[r] == 100.0 * (r % 3 + 1) + 100.0 * (r % 3 + 4));
        assert_true(a.gathered_ok[r]);
    }
    /* rank 4 fails; its EP partners (3, 5) wait in their group: they fail at once with the
     * reason, long before the 5 s deadline */
    a.fail = 4;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(exec_local_run(hub, split_rank, &a, &err), MOE_ERR_RUNTIME);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("split groups, rank 4 failing: %s (%.2f s)\n", err.message, s);
    assert_non_null(strstr(err.message, "gave up inside its groups"));
    assert_true(s < 1.0);
    exec_local_hub_destroy(hub);
}

/* The launcher's view of the environment, from a fake one. */
static const char *const *fake_env;
static const char *fake_get(const char *name)
{
    for (const char *const *e = fake_env; e && *e; e += 2)
        if (!strcmp(e[0], name)) return e[1];
    return NULL;
}

static void test_launch_detect(void **state)
{
    (void)state;
    struct exec_launch l;
    struct moe_error err;
    const char *none[] = {NULL};
    fake_env = none;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_OK);
    assert_true(l.who == EXEC_LAUNCH_SINGLE && l.rank == 0 && l.ranks == 1);
    const char *mpi[] = {"OMPI_COMM_WORLD_RANK",
                         "5",
                         "OMPI_COMM_WORLD_SIZE",
                         "16",
                         "OMPI_COMM_WORLD_LOCAL_RANK",
                         "5",
                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                         "8",
                         "SLURM_PROCID",
                         "0",
                         "SLURM_NTASKS",
                         "1",
                         NULL};
    fake_env = mpi;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_OK);
    assert_true(l.who == EXEC_LAUNCH_MPI && l.rank == 5 && l.ranks == 16 && l.local_rank == 5 &&
                l.local_ranks == 8);
    const char *slurm[] = {"SLURM_PROCID", "9", "SLURM_NTASKS", "16", "SLURM_LOCALID", "1", NULL};
    fake_env = slurm;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_OK);
    assert_true(l.who == EXEC_LAUNCH_SLURM && l.rank == 9 && l.local_rank == 1 &&
                l.local_ranks == 16);
    const char *bad[] = {"SLURM_PROCID", "16", "SLURM_NTASKS", "16", NULL};
    fake_env = bad;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_ERR_INPUT);
    printf("%s\n", err.message);
    const char *junk[] = {"OMPI_COMM_WORLD_RANK", "x1", "OMPI_COMM_WORLD_SIZE", "2", NULL};
    fake_env = junk;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "OMPI_COMM_WORLD_RANK='x1'"));
    const char *half[] = {"SLURM_NTASKS", "4", NULL};
    fake_env = half;
    assert_int_equal(exec_launch_detect(&l, fake_get, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "unset"));
}

/* The id through a file: rank 0 writes, three others read it; rank 0 missing: a deadline. */
struct id_run {
    char path[256];
    bool rank0;
    unsigned char got[4][EXEC_NCCL_ID_BYTES];
};

static enum moe_status id_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct id_run *a = arg;
    unsigned char *id = a->got[t->rank];
    if (t->rank == 0) {
        if (!a->rank0) return MOE_OK;
        for (int i = 0; i < EXEC_NCCL_ID_BYTES; i++) id[i] = (unsigned char)(i * 7 + 3);
        struct timespec nap = {0, 50000000}; /* the others are already waiting */
        nanosleep(&nap, NULL);
    }
    return exec_launch_share_id(a->path, t->rank, id, EXEC_NCCL_ID_BYTES, 2.0, err);
}

static void test_launch_share_id(void **state)
{
    (void)state;
    struct id_run a;
    memset(&a, 0, sizeof a);
    snprintf(a.path, sizeof a.path, "/tmp/moeplan-test-id-%d", (int)getpid());
    unlink(a.path);
    a.rank0 = true;
    struct exec_local_hub *hub;
    struct moe_error err;
    assert_int_equal(exec_local_hub_create(&hub, 4, 5.0, &err), MOE_OK);
    if (exec_local_run(hub, id_rank, &a, &err) != MOE_OK) fail_msg("%s", err.message);
    for (int r = 1; r < 4; r++) assert_memory_equal(a.got[r], a.got[0], EXEC_NCCL_ID_BYTES);
    unlink(a.path);
    a.rank0 = false;
    assert_int_equal(exec_local_run(hub, id_rank, &a, &err), MOE_ERR_RUNTIME);
    printf("%s\n", err.message);
    assert_non_null(strstr(err.message, "waited 2 s for rank 0"));
    FILE *f = fopen(a.path, "wb");
    fputs("short", f);
    fclose(f);
    unsigned char id[EXEC_NCCL_ID_BYTES];
    assert_int_equal(exec_launch_share_id(a.path, 1, id, sizeof id, 1.0, &err), MOE_ERR_INPUT);
    printf("%s\n", err.message);
    unlink(a.path);
    exec_local_hub_destroy(hub);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_by_hand),       cmocka_unit_test(test_exchange_random),
        cmocka_unit_test(test_ep_equals_one_rank), cmocka_unit_test(test_model_twin),
        cmocka_unit_test(test_pipeline_twin),      cmocka_unit_test(test_zero1_twin),
        cmocka_unit_test(test_transport_faults),   cmocka_unit_test(test_transport_split),
        cmocka_unit_test(test_launch_detect),      cmocka_unit_test(test_launch_share_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
