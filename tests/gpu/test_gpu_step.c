/*
 * test_gpu_step.c: the GPU training step against the CPU reference (ref_model.c), on the tiny
 * models and variants that reach every code path: GQA (with and without QK-norm, projection
 * biases, attention sinks) and MLA (with and without q compression), dense and MoE blocks, shared experts, tied embeddings, a sliding window, sigmoid group-limited
 * routing, the load-balance loss, selection biases, several sequences per micro-batch, gradient
 * accumulation over micro-batches and full recompute.
 *
 * Both sides start from the same weights, rounded to bf16 so that the GPU's bf16 copies equal
 * the reference's doubles; what differs is the GPU's bf16 activations at GEMM inputs, SwiGLU's
 * bf16 gate / up outputs and product gradient, the bf16 logits and their gradient, the expert
 * block's input gradient in bf16 from each GEMM (fp32 accumulation, fp32 residual and the other
 * gradients; QK-norm's saved input and its gradient in bf16). Tolerances (bf16 has an 8-bit
 * significand, 2^-9 relative rounding):
 *   loss                        within 2e-3 relative
 *   every parameter's gradient  ||g_gpu - g_ref|| <= 3e-2 ||g_ref|| + 1e-7 per tensor (a
 *                               tensor the routing leaves without gradient is 0 on both sides,
 *                               up to fp32 rounding noise)
 * The routing itself must agree (per-expert counts of every MoE layer equal); where bf16
 * rounding decides a near-tie the other way, the case is rerun with the next seed (at most 3).
 * Dropless edge cases (one expert takes every token, experts with none, top_k = experts) match
 * the same way; reruns are bit-identical; training on text follows the reference's loss curve.
 * Expert parallelism: 2, 4 and 8 virtual ranks on the one GPU (the local transport in device
 * memory), one sequence a rank, in every dedup mode, against the reference on the same sequences
 * with the same tolerances.
 * Exits 77 (skipped) where there is no GPU.
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "../unit/moe_test.h"

#include <cuda_runtime_api.h>
#include <math.h>

static int gpus(void)
{
    int n = 0;
    struct moe_error err;
    if (exec_device_count(&n, &err) != MOE_OK) return 0;
    return n;
}

/* How far tensor t's values in a are from those in b: the relative L2 of a - b over the tensor
 * (the absolute one where b is all zeros) */
static double tensor_rel_l2(const struct exec_tensor *t, const double *a, const double *b)
{
    double dd = 0, nn = 0;
    for (size_t j = t->offset; j < t->offset + t->size; j++)
        dd += (a[j] - b[j]) * (a[j] - b[j]), nn += b[j] * b[j];
    return nn > 0 ? sqrt(dd / nn) : sqrt(dd);
}

struct setup {
    double aux_coef;
    bool with_bias;   /* a random selection bias; or force[] below */
    int force_expert; /* >= 0: a bias that sends every token to this expert first */
    int starve;       /* experts 0 .. starve-1 get a large negative bias: no tokens */
    int mbs, micro;   /* sequences per micro-batch, micro-batches per step */
    bool recompute;
    unsigned rc; /* selective recompute: COST_RC_BIT of each module */
    int streams; /* expert GEMMs over this many streams */
    int ep;      /* > 1: that many virtual EP ranks on the GPU, one sequence each; or 1
                  * with ep_nccl: the EP path over NCCL with one rank (to itself) */
    enum cost_dispatcher ep_mode;
    bool ep_nccl;
    bool cudnn_attention; /* cuDNN's fused attention where it takes the shape */
    bool primed; /* one step first with no bias (every expert gets rows), so that the starved
                  * experts' gradient slices hold its values when the compared step begins */
};

/* The GPU side of an EP case: R virtual ranks on one GPU (the local transport, device memory),
 * each an exec_gpu of the whole model computing its experts, one sequence each (grad_scale 1/R),
 * gradients summed over the ranks. Out: the mean loss, rank 0's reduced gradients, the routing
 * counts summed over the ranks (layers x experts). */
struct ep_gpu_run {
    const struct mdl_model *m;
    const struct exec_ep_group *g;
    const double *params, *bias;
    const int *tok;
    int S;
    void *streams[8];
    double loss[8], aux[8], *grad;
    int64_t *counts; /* (ranks, layers, experts) */
    double step_ms;
    int syncs;
    struct cost_bytes sent[8];
    unsigned rc; /* selective recompute modules */
};

static enum moe_status ep_gpu_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct ep_gpu_run *a = arg;
    int r = t->rank, E = a->m->moe.experts;
    struct exec_gpu_cfg cfg = {.seq = a->S,
                               .mbs = 1,
                               .streams = 1,
                               .ep = t,
                               .ep_group = a->g,
                               .ep_groups = 1,
                               .recompute_modules = a->rc};
    struct exec_gpu *g;
    cudaSetDevice(0);
    enum moe_status st = exec_gpu_create(&g, a->m, &cfg, err);
    if (st != MOE_OK) return st;
    a->streams[r] = exec_gpu_stream(g);
    struct exec_gpu_step_stats ss;
    if ((st = exec_gpu_set_params(g, a->params, err)) ||
        (st = exec_gpu_set_bias(g, a->bias, err)) || (st = exec_gpu_step_begin(g, err)) ||
        (st = exec_gpu_micro_batch(g, a->tok + (size_t)r * (a->S + 1), 1.0 / t->ranks, &a->loss[r],
                                   &a->aux[r], err)) ||
        (st = exec_gpu_step_end(g, &ss, err)) || (st = exec_gpu_reduce_grads(g, t, err)))
        goto done;
    a->sent[r] = ss.dispatch;
    if (r == 0) {
        if ((st = exec_gpu_get_grads(g, a->grad, err))) goto done;
        a->step_ms = ss.phase_ms[COST_STEP];
        a->syncs = ss.host_syncs;
    }
    for (int l = 0; l < a->m->layers && st == MOE_OK; l++)
        if (mdl_layer_is_moe(a->m, l))
            st = exec_gpu_routing(g, l, a->counts + ((size_t)r * a->m->layers + l) * E, NULL, err);
done:
    exec_gpu_destroy(g);
    return st;
}

/* The reference model with test weights: init, larger perturbations (so that every path carries
 * signal and routing has clear margins), rounded to bf16. */
static void ref_setup(struct exec_ref_model *r, const struct mdl_model *m, uint64_t seed,
                      const struct setup *s, double **bias)
{
    struct moe_error err;
    assert_int_equal(exec_ref_model_create(r, m, seed, &err), MOE_OK);
    struct moe_rng rng;
    moe_rng_seed(&rng, seed + 7);
    for (int i = 0; i < r->ntensors; i++) {
        const struct exec_tensor *t = &r->tensor[i];
        /* a large embedding keeps the residual stream dominated by exact fp32 values, so that
         * bf16 rounding inside the blocks rarely moves a router logit across a top-k boundary */
        double amp = !strcmp(t->name, "embed")   ? 0.5
                     : strstr(t->name, "router") ? 0.3
                     : strstr(t->name, "norm")   ? 0.1
                                                 : 0.03;
        for (size_t j = 0; j < t->size; j++)
            r->params[t->offset + j] =
                exec_ref_bf16(r->params[t->offset + j] + amp * moe_rng_normal(&rng));
    }
    int LE = m->layers * m->moe.experts;
    *bias = calloc((size_t)LE, sizeof **bias);
    for (int i = 0; i < LE; i++) {
        int e = i % m->moe.experts;
        double b = s->with_bias ? 0.05 * moe_rng_normal(&rng) : 0.0;
        if (e == s->force_expert) b = 10.0;
        if (e < s->starve) b = -10.0;
        (*bias)[i] = (double)(float)b;
    }
    r->bias = *bias;
    r->aux_coef = s->aux_coef;
}

/* Tensors whose GPU gradient differs from the reference's by more than 3% of its norm (1e-7 where
 * the reference is 0: no gradient reaches it, or only fp32 rounding noise does). NaN-proof: a
 * tensor holding a NaN or an infinity is always counted. `print`: the worst, and each mismatch. */
static double norm2(const double *a, size_t n);
static int gradient_mismatches(const struct exec_ref_model *r, const double *ggpu,
                               const double *gref, bool print)
{
    double worst = 0;
    const char *worst_name = "";
    int bad = 0;
    for (int i = 0; i < r->ntensors; i++) {
        const struct exec_tensor *t = &r->tensor[i];
        double *d = malloc(sizeof *d * t->size);
        for (size_t j = 0; j < t->size; j++) d[j] = ggpu[t->offset + j] - gref[t->offset + j];
        double ref = norm2(gref + t->offset, t->size), diff = norm2(d, t->size);
        free(d);
        double tol = ref == 0.0 ? 1e-7 : 3e-2 * ref + 1e-7;
        if (ref > 0 && diff / ref > worst) worst = diff / ref, worst_name = t->name;
        if (!(diff <= tol) || !isfinite(ref)) {
            if (print)
                printf("  %s: gradient error norm %.3g, reference norm %.4g (allowed %.3g)\n",
                       t->name, diff, ref, tol);
            bad++;
        }
    }
    if (print)
        printf("  %d tensors, worst gradient relative error %.3g (%s); #wrong %d\n", r->ntensors,
               worst, worst_name, bad);
    return bad;
}

static double norm2(const double *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * a[i];
    return sqrt(s);
}

/* One step of the setup's micro-batches on g with the selection bias `bias`: the mean loss and
 * aux loss into *loss / *aux, the gradients into grad, the routing counts so far into counts
 * (layers x experts; they add up from step to step), the step's stats into st. */
static void gpu_step(struct exec_gpu *g, const struct mdl_model *m, const struct setup *s,
                     const double *bias, const int *tok, int per, double *loss, double *aux,
                     double *grad, int64_t *counts, struct exec_gpu_step_stats *st)
{
    struct moe_error err;
    *loss = *aux = 0;
    assert_int_equal(exec_gpu_set_bias(g, bias, &err), MOE_OK);
    assert_int_equal(exec_gpu_step_begin(g, &err), MOE_OK);
    for (int mb = 0; mb < s->micro; mb++) {
        double l, a;
        if (exec_gpu_micro_batch(g, tok + mb * s->mbs * per, 1.0 / s->micro, &l, &a, &err) !=
            MOE_OK)
            fail_msg("%s", err.message);
        *loss += l / s->micro;
        *aux += a / s->micro;
    }
    assert_int_equal(exec_gpu_step_end(g, st, &err), MOE_OK);
    assert_int_equal(exec_gpu_get_grads(g, grad, &err), MOE_OK);
    for (int l = 0; l < m->layers; l++)
        if (mdl_layer_is_moe(m, l))
            assert_int_equal(
                exec_gpu_routing(g, l, counts + (size_t)l * m->moe.experts, NULL, &err), MOE_OK);
}

/* setup.primed: a step on the same tokens with no bias, then a check that it wrote the gradient
 * slices of the experts the compared step starves (its gate tensors' rows of experts 0 ..
 * starve-1 are not all zero): the compared step must then zero them itself. c0: its counts. */
static void prime(struct exec_gpu *g, const struct mdl_model *m, const struct setup *s,
                  const int *tok, int per, double *grad, int64_t *c0)
{
    struct moe_error err;
    int E = m->moe.experts;
    double *flat = calloc((size_t)m->layers * E, sizeof *flat), loss, aux;
    struct exec_gpu_step_stats st;
    gpu_step(g, m, s, flat, tok, per, &loss, &aux, grad, c0, &st);
    struct exec_ref_model r;
    assert_int_equal(exec_ref_model_create(&r, m, 1, &err), MOE_OK);
    int checked = 0;
    for (int i = 0; i < r.ntensors; i++) {
        const struct exec_tensor *t = &r.tensor[i];
        int l;
        char rest[16];
        if (sscanf(t->name, "blk%d.%15s", &l, rest) != 2 || strcmp(rest, "gate") ||
            !mdl_layer_is_moe(m, l))
            continue;
        size_t each = t->size / (size_t)E;
        assert_true(norm2(grad + t->offset, each * (size_t)s->starve) > 0);
        checked++;
    }
    assert_true(checked > 0);
    exec_ref_model_destroy(&r);
    free(flat);
}

/* One step on both sides: S tokens per sequence, the setup's micro-batching. Returns false when
 * the GPU's routing differs from the reference's (a near-tie decided the other way by bf16
 * rounding upstream: the per-expert counts differ), where gradients cannot be compared. */
static bool compare_once(const struct mdl_model *m, uint64_t seed, const struct setup *s)
{
    enum { S = 24 };
    struct exec_ref_model r;
    struct moe_error err;
    double *bias;
    ref_setup(&r, m, seed, s, &bias);
    int LE = m->layers * m->moe.experts, E = m->moe.experts;
    int64_t *cref = calloc((size_t)LE, sizeof *cref), *cgpu = calloc((size_t)LE, sizeof *cgpu),
            *c0 = calloc((size_t)LE, sizeof *c0);
    r.route_counts = cref;
    int nseq = s->ep >= 1 ? s->ep : s->mbs * s->micro, per = S + 1;
    int *tok = malloc(sizeof *tok * (size_t)nseq * per);
    struct moe_rng rng;
    moe_rng_seed(&rng, seed + 99);
    for (int i = 0; i < nseq * per; i++) tok[i] = (int)moe_rng_below(&rng, (uint64_t)m->vocab);
    /* reference: the mean over sequences of loss and gradient */
    size_t n = r.nparams;
    double *gref = calloc(n, sizeof *gref), *g1 = malloc(sizeof *g1 * n),
           *ggpu = malloc(sizeof *ggpu * n);
    double lref = 0, aref = 0;
    for (int q = 0; q < nseq; q++) {
        double l, a;
        if (exec_ref_model_step(&r, tok + q * per, per, &l, &a, g1, &err) != MOE_OK)
            fail_msg("%s", err.message);
        lref += l / nseq;
        aref += a / nseq;
        for (size_t i = 0; i < n; i++) gref[i] += g1[i] / nseq;
    }
    /* GPU */
    double lgpu = 0, agpu = 0, step_ms;
    int syncs;
    if (s->ep >= 1 && s->ep_nccl) { /* one rank, its exchange through NCCL to itself */
        int placement[64] = {0}, domain[1] = {0};
        struct exec_ep_group eg = {1, E, m->moe.top_k, placement, domain, s->ep_mode};
        unsigned char id[EXEC_NCCL_ID_BYTES];
        struct exec_nccl *nc;
        struct exec_transport t;
        if (exec_nccl_unique_id(id, &err) != MOE_OK ||
            exec_nccl_create(&nc, id, 0, 1, 0, 60.0, &err) != MOE_OK)
            fail_msg("%s", err.message);
        exec_nccl_transport(nc, &t);
        struct ep_gpu_run a = {m,   &eg,  r.params, bias, tok, S,        {0},  {0},
                               {0}, ggpu, cgpu,     0,    0,   {{0, 0}}, s->rc};
        if (ep_gpu_rank(&t, &a, &err) != MOE_OK) fail_msg("%s", err.message);
        exec_nccl_destroy(nc);
        lgpu = a.loss[0];
        agpu = a.aux[0];
        step_ms = a.step_ms;
        syncs = a.syncs;
    } else if (s->ep > 1) {
        int R = s->ep, placement[64], domain[8];
        for (int e = 0; e < E; e++) placement[e] = (e * 5 + 3) % E % R;
        for (int q = 0; q < R; q++) domain[q] = q / (R / 2);
        struct exec_ep_group eg = {R, E, m->moe.top_k, placement, domain, s->ep_mode};
        int64_t *per_rank = calloc((size_t)R * LE, sizeof *per_rank);
        struct ep_gpu_run a = {m,   &eg,  r.params, bias, tok, S,        {0},  {0},
                               {0}, ggpu, per_rank, 0,    0,   {{0, 0}}, s->rc};
        struct exec_local_hub *hub;
        struct exec_local_mem mem;
        assert_int_equal(exec_local_hub_create(&hub, R, 60.0, &err), MOE_OK);
        exec_local_gpu_memory(&mem, a.streams);
        exec_local_hub_set_memory(hub, &mem);
        if (exec_local_run(hub, ep_gpu_rank, &a, &err) != MOE_OK) fail_msg("%s", err.message);
        exec_local_hub_destroy(hub);
        for (int q = 0; q < R; q++) {
            lgpu += a.loss[q] / R;
            agpu += a.aux[q] / R;
            for (int i = 0; i < LE; i++) cgpu[i] += per_rank[(size_t)q * LE + i];
        }
        free(per_rank);
        step_ms = a.step_ms;
        syncs = a.syncs;
        double nv = 0, so = 0;
        for (int q = 0; q < R; q++) nv += a.sent[q].nvlink, so += a.sent[q].scale_out;
        printf("  EP %d dispatch payload: %.0f B over NVLink, %.0f B scale-out (all ranks)\n", R,
               nv, so);
    } else {
        struct exec_gpu_cfg cfg = {.seq = S,
                                   .mbs = s->mbs,
                                   .recompute = s->recompute,
                                   .recompute_modules = s->rc,
                                   .aux_coef = s->aux_coef,
                                   .streams = s->streams,
                                   .cudnn_attention = s->cudnn_attention};
        struct exec_gpu *g;
        if (exec_gpu_create(&g, m, &cfg, &err) != MOE_OK) fail_msg("%s", err.message);
        assert_int_equal(exec_gpu_set_params(g, r.params, &err), MOE_OK);
        if (s->primed) prime(g, m, s, tok, per, ggpu, c0);
        struct exec_gpu_step_stats st;
        gpu_step(g, m, s, bias, tok, per, &lgpu, &agpu, ggpu, cgpu, &st);
        for (int i = 0; i < LE; i++) cgpu[i] -= c0[i]; /* the counts add up from step to step */
        step_ms = st.phase_ms[COST_STEP];
        syncs = st.host_syncs;
        char att[320];
        printf("  attention: %s\n", exec_gpu_attention(g, att, sizeof att));
        exec_gpu_destroy(g);
    }
    char ep[64] = "";
    if (s->ep >= 1)
        snprintf(ep, sizeof ep, ", EP %d %s%s", s->ep, cost_dispatcher_names[s->ep_mode],
                 s->ep_nccl ? " over NCCL" : "");
    char rcm[160] = "";
    if (s->rc) {
        strcpy(rcm, ", recompute ");
        cost_rc_modules_format(s->rc, "+", rcm + strlen(rcm), sizeof rcm - strlen(rcm));
    }
    printf("%s (mbs %d x %d, aux %g%s%s%s): loss gpu %.6f ref %.6f (aux %.6f / %.6f); step %.2f "
           "ms, %d host syncs\n",
           m->name, s->mbs, s->micro, s->aux_coef, s->recompute ? ", recompute" : "", rcm, ep, lgpu,
           lref, agpu, aref, step_ms, syncs);
    bool same = true;
    for (int l = 0; l < m->layers; l++) {
        if (!mdl_layer_is_moe(m, l)) continue;
        if (memcmp(cgpu + (size_t)l * E, cref + (size_t)l * E, sizeof *cgpu * E)) {
            printf("  layer %d: the routing differs from the reference at a near-tie\n", l);
            same = false;
        }
    }
    if (!(fabs(lgpu - lref) <= 2e-3 * fabs(lref))) fail_msg("loss: gpu %.8f, ref %.8f", lgpu, lref);
    if (!same) {
        free(tok), free(gref), free(g1), free(ggpu), free(bias), free(cref), free(cgpu), free(c0);
        exec_ref_model_destroy(&r);
        return false;
    }
    if (s->aux_coef > 0 && !(fabs(agpu - aref) <= 1e-2 * fabs(aref)))
        fail_msg("aux loss: gpu %.8f, ref %.8f", agpu, aref);
    if (gradient_mismatches(&r, ggpu, gref, true)) fail_msg("%s: gradients differ", m->name);
    /* The check itself: one poisoned element of one tensor must fail it (a NaN slips past any
     * `error > tolerance` test; this one asks `!(error <= tolerance)`). */
    size_t at = r.tensor[r.ntensors / 2].offset + r.tensor[r.ntensors / 2].size / 2;
    double keep = ggpu[at];
    ggpu[at] = NAN;
    assert_int_equal(gradient_mismatches(&r, ggpu, gref, false), 1);
    ggpu[at] = keep;
    free(tok), free(gref), free(g1), free(ggpu), free(bias), free(cref), free(cgpu), free(c0);
    exec_ref_model_destroy(&r);
    return true;
}

/* At most three seeds: a case whose routing meets a near-tie three times in a row fails. */
static void compare(const struct mdl_model *m, uint64_t seed, const struct setup *s)
{
    for (int i = 0; i < 3; i++)
        if (compare_once(m, seed + 1000 * (uint64_t)i, s)) return;
    fail_msg("%s: the routing differed from the reference in three seeds", m->name);
}

static const struct setup plain = {
    .force_expert = -1, .mbs = 1, .micro = 1, .streams = 1, .ep_mode = COST_DISPATCH_ALLTOALL};

/* Expert parallelism on virtual ranks of the one GPU: EP 2, 4 and 8 in every dedup mode, one
 * sequence a rank, against the reference on the same sequences; and EP 1 over NCCL. */
static void test_expert_parallel(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    enum cost_dispatcher modes[3] = {COST_DISPATCH_ALLTOALL, COST_DISPATCH_DEDUP_GPU,
                                     COST_DISPATCH_DEDUP_DOMAIN};
    for (int R = 2; R <= 8; R *= 2)
        for (int i = 0; i < 3; i++) {
            struct setup s = plain;
            s.ep = R;
            s.ep_mode = modes[i];
            compare(&m, 20 + (uint64_t)R, &s);
        }
    struct setup s = plain; /* the same path over NCCL, one rank sending to itself */
    s.ep = 1;
    s.ep_mode = COST_DISPATCH_DEDUP_GPU;
    s.ep_nccl = true;
    compare(&m, 30, &s);
}

static void test_gqa(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    compare(&m, 1, &plain);
    struct setup s = plain;
    s.mbs = 2; /* two sequences in one micro-batch */
    compare(&m, 2, &s);
    s.mbs = 1;
    s.micro = 2; /* gradient accumulation */
    compare(&m, 3, &s);
    s = plain;
    s.streams = 3; /* expert GEMMs on three streams */
    compare(&m, 1, &s);
    s = plain;
    s.cudnn_attention = true; /* cuDNN's fused attention */
    compare(&m, 1, &s);
}

static void test_variants(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_variant(&m, MOE_TEST_DENSE_TIED, 0);
    compare(&m, 4, &plain);
    moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 5);
    struct setup s = plain;
    s.with_bias = true;
    compare(&m, 5, &s);
    moe_test_variant(&m, MOE_TEST_MIXTRAL, 0); /* Mixtral's weights */
    s = plain;
    s.aux_coef = 0.01;
    compare(&m, 6, &s);
    moe_test_model("tiny-moe-gqa", &m); /* Qwen3's QK-norm, with our attention and cuDNN's, */
    m.attn.qk_norm = true;              /* two sequences, and recomputed in the backward */
    s = plain;
    s.mbs = 2;
    compare(&m, 7, &s);
    s.cudnn_attention = true;
    compare(&m, 7, &s);
    s.recompute = true;
    compare(&m, 8, &s);
    m.attn.qk_norm = false; /* gpt-oss's projection biases, with our attention and cuDNN's */
    m.attn.bias = true;
    s = plain;
    s.mbs = 2;
    compare(&m, 9, &s);
    s.cudnn_attention = true;
    compare(&m, 9, &s);
    m.attn.sinks = true; /* and its attention sinks */
    compare(&m, 10, &s);
    s.cudnn_attention = false;
    compare(&m, 10, &s);
    moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 5); /* sinks with a sliding window */
    m.attn.sinks = true;
    compare(&m, 11, &s);
    s.cudnn_attention = true;
    s.recompute = true;
    compare(&m, 11, &s);
    /* Llama 4's blocks: chunked attention (three chunks of 8) with RoPE, a NoPE block; ours and
     * cuDNN's attention, two sequences */
    moe_test_variant(&m, MOE_TEST_LLAMA4, 8);
    s = plain;
    s.mbs = 2;
    compare(&m, 16, &s);
    s.cudnn_attention = true;
    compare(&m, 16, &s);
    /* gpt-oss's whole block (sliding window every other block, sinks, projection biases, YaRN,
     * router and expert biases, the clamped SwiGLU with its alpha and the +1 on up): two
     * sequences; cuDNN's attention with the experts over four streams and gradient accumulation;
     * starved experts after a primed step (their bias slices keep the first step's values); two
     * virtual EP ranks */
    moe_test_variant(&m, MOE_TEST_GPT_OSS, 5);
    s = plain;
    s.mbs = 2;
    compare(&m, 12, &s);
    s.cudnn_attention = true;
    s.streams = 4;
    s.micro = 2;
    compare(&m, 13, &s);
    s = plain;
    s.starve = 5;
    s.mbs = 2;
    s.primed = true;
    compare(&m, 14, &s);
    s = plain;
    s.ep = 2;
    compare(&m, 15, &s);
}

static void test_mla(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_model("tiny-moe-mla", &m);
    compare(&m, 7, &plain);
    struct setup s = plain;
    s.recompute = true;
    compare(&m, 7, &s);
    s = plain;
    s.aux_coef = 0.01;
    compare(&m, 8, &s);
    s = plain;
    s.with_bias = true;
    compare(&m, 8, &s);
    s = plain;
    s.cudnn_attention = true;
    compare(&m, 7, &s);
    s.recompute = true;
    compare(&m, 7, &s);
    m.attn.q_lora_rank = 0; /* DeepSeek-V2-Lite's form */
    m.moe.scoring = MDL_SCORE_SOFTMAX;
    m.moe.n_group = m.moe.topk_group = 1;
    m.moe.norm_topk = false;
    m.moe.scaling = 1.0;
    m.moe.shared_experts = 2;
    compare(&m, 9, &plain);
}

/* What exec_gpu_create allocates for m under cfg, by category (the executor made and freed). */
static void allocated(const struct mdl_model *m, const struct exec_gpu_cfg *cfg,
                      double bytes[EXEC_MEM_N])
{
    struct exec_gpu *g;
    struct moe_error err;
    if (exec_gpu_create(&g, m, cfg, &err) != MOE_OK) fail_msg("%s", err.message);
    struct exec_gpu_memory mem;
    exec_gpu_memory(g, &mem);
    exec_gpu_destroy(g);
    memcpy(bytes, mem.bytes, sizeof mem.bytes);
}

/* Selective recompute by module (every module the executor redoes): one set of each module's
 * tensors for every block, redone in the backward; the gradients match the reference as without
 * it, on a dense block (mlp), shared experts with a window and two micro-batches, gpt-oss's block
 * (sinks and expert biases) with cuDNN's attention and four expert streams, MLA, and two virtual
 * EP ranks. Then the activation memory: smaller by exactly the copies the blocks after the first
 * no longer keep (every module on tiny-moe-gqa; mla_up_proj alone on tiny-moe-mla). */
static void test_selective_recompute(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    struct setup s = plain;
    s.rc = EXEC_RC_MODULES;
    moe_test_variant(&m, MOE_TEST_DENSE_TIED, 0);
    compare(&m, 40, &s);
    moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 5);
    s.mbs = 2;
    s.micro = 2;
    compare(&m, 41, &s);
    moe_test_variant(&m, MOE_TEST_GPT_OSS, 5);
    s = plain;
    s.rc = EXEC_RC_MODULES;
    s.mbs = 2;
    s.cudnn_attention = true;
    s.streams = 4;
    compare(&m, 42, &s);
    moe_test_model("tiny-moe-mla", &m);
    s = plain;
    s.rc = EXEC_RC_MODULES;
    compare(&m, 43, &s);
    moe_test_model("tiny-moe-gqa", &m);
    s = plain;
    s.rc = COST_RC_BIT(COST_RC_CORE_ATTN) | COST_RC_BIT(COST_RC_MOE_ACT);
    s.ep = 2;
    compare(&m, 44, &s);
    /* memory: tiny-moe-gqa (every block MoE, no shared experts), 2 x 32 tokens */
    double act[2], b[EXEC_MEM_N];
    for (int i = 0; i < 2; i++) {
        struct exec_gpu_cfg cfg = {
            .seq = 32, .mbs = 2, .streams = 1, .recompute_modules = i ? EXEC_RC_MODULES : 0};
        allocated(&m, &cfg, b);
        act[i] = b[EXEC_MEM_ACTIVATIONS];
    }
    double T = 64, h = m.hidden, H = m.attn.heads, dv = m.attn.head_dim;
    double pairs = T * m.moe.top_k, f = m.moe.intermediate;
    double per_block = T * h * (2 + 2 + 4) /* a16, b16, b32 */ + T * H * (2 * dv + 4) /* o, lse */ +
                       pairs * f * 2 /* the experts' activation */;
    printf("activations: %.0f B kept, %.0f B with every module recomputed (%d blocks: %.0f B a "
           "block saved)\n",
           act[0], act[1], m.layers, per_block);
    assert_true(act[0] - act[1] == (m.layers - 1) * per_block);
    /* MLA's q, k and v alone (mla_up_proj): tiny-moe-mla, the same tokens */
    moe_test_model("tiny-moe-mla", &m);
    for (int i = 0; i < 2; i++) {
        struct exec_gpu_cfg cfg = {.seq = 32,
                                   .mbs = 2,
                                   .streams = 1,
                                   .recompute_modules = i ? COST_RC_BIT(COST_RC_MLA_UP_PROJ) : 0};
        allocated(&m, &cfg, b);
        act[i] = b[EXEC_MEM_ACTIVATIONS];
    }
    double qk = m.attn.qk_nope_head_dim + m.attn.qk_rope_head_dim;
    per_block = T * m.attn.heads * (2.0 * qk + m.attn.v_head_dim) * 2 /* q, k, v in bf16 */;
    printf("MLA activations: %.0f B kept, %.0f B with mla_up_proj recomputed (%.0f B a block)\n",
           act[0], act[1], per_block);
    assert_true(act[0] - act[1] == (m.layers - 1) * per_block);
}

/* exec_gpu_bytes, what plan --runnable's memory check rests on, against what exec_gpu_create
 * allocated, category by category, to the byte: the tiny models and their variants, plain, under
 * every selective module, under full recompute, with expert streams and bf16 moments, in fp8 per
 * tensor (with expert streams) and blockwise. (Its EP and ZeRO terms are not held to it here.) */
static void test_memory_estimate(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    int checked = 0;
    for (int v = 0; v < 7; v++) {
        if (v == 0) moe_test_model("tiny-moe-gqa", &m);
        if (v == 1) moe_test_model("tiny-moe-mla", &m);
        if (v == 2) moe_test_variant(&m, MOE_TEST_DENSE_TIED, 0);
        if (v == 3) moe_test_variant(&m, MOE_TEST_SLIDING_SIGMOID, 5);
        if (v == 4) moe_test_variant(&m, MOE_TEST_GPT_OSS, 5);
        if (v == 5) moe_test_variant(&m, MOE_TEST_LLAMA4, 8);
        if (v == 6) {
            moe_test_model("tiny-moe-gqa", &m);
            m.attn.qk_norm = true;
        }
        for (int c = 0; c < 6; c++) {
            struct exec_gpu_cfg cfg = {.seq = 24, .mbs = 2, .streams = c == 2 || c == 4 ? 4 : 1};
            if (c == 1) cfg.recompute_modules = EXEC_RC_MODULES;
            if (c == 2) cfg.moments_bf16 = true;
            if (c == 3) cfg.recompute = true;
            if (c == 4) cfg.precision = COST_FP8; /* with expert streams: a scratch each */
            if (c == 5) cfg.precision = COST_FP8_BLOCK;
            double est[EXEC_MEM_N], got[EXEC_MEM_N];
            exec_gpu_bytes(&m, &cfg, 0, false, 0, est);
            allocated(&m, &cfg, got);
            for (int k = 0; k < EXEC_MEM_N; k++)
                if (est[k] != got[k])
                    fail_msg("model %d, setup %d: %s %.0f B estimated, %.0f B allocated", v, c,
                             exec_mem_names[k], est[k], got[k]);
            checked++;
        }
    }
    printf("exec_gpu_bytes: %d models x setups, every category equal to the allocation\n", checked);
}

/* Dropless, directly: every token to one expert (top-1), experts with no token, top_k = E. */
static void test_dropless(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    m.moe.top_k = 1;
    struct setup s = plain;
    s.force_expert = 3;
    compare(&m, 10, &s);
    moe_test_model("tiny-moe-gqa", &m);
    s = plain;
    s.starve = 5; /* top-2 of the last three experts only: five have no rows */
    s.mbs = 2;
    compare(&m, 11, &s);
    s.primed = true; /* ... after a step in which they had rows */
    compare(&m, 11, &s);
    moe_test_model("tiny-moe-gqa", &m);
    m.moe.top_k = 8; /* every expert for every token */
    compare(&m, 12, &plain);
}

/* Reruns are bit-identical: loss and every gradient, three optimizer steps from a GPU init. */
static void run_steps(const struct mdl_model *m, int streams, double *losses, double *params)
{
    enum { S = 32, STEPS = 3 };
    struct exec_gpu_cfg cfg = {.seq = S, .mbs = 2, .aux_coef = 0.01, .streams = streams};
    struct exec_gpu *g;
    struct moe_error err;
    if (exec_gpu_create(&g, m, &cfg, &err) != MOE_OK) fail_msg("%s", err.message);
    assert_int_equal(exec_gpu_init(g, 1234, &err), MOE_OK);
    struct exec_data d;
    assert_int_equal(exec_data_open(&d, NULL, m->vocab, 5, &err), MOE_OK);
    struct exec_adamw o;
    exec_adamw_defaults(&o);
    int tok[2 * (S + 1)];
    for (int step = 0; step < STEPS; step++) {
        double gn, a;
        assert_int_equal(exec_gpu_step_begin(g, &err), MOE_OK);
        for (int mb = 0; mb < 2; mb++) {
            exec_data_next(&d, tok, 2 * (S + 1));
            assert_int_equal(exec_gpu_micro_batch(g, tok, 0.5, &losses[step * 2 + mb], &a, &err),
                             MOE_OK);
        }
        assert_int_equal(exec_gpu_optimizer(g, &o, step, &gn, &err), MOE_OK);
        assert_int_equal(exec_gpu_update_bias(g, 1e-3, NULL, &err), MOE_OK);
        struct exec_gpu_step_stats st;
        assert_int_equal(exec_gpu_step_end(g, &st, &err), MOE_OK);
    }
    assert_int_equal(exec_gpu_get_params(g, params, &err), MOE_OK);
    exec_data_close(&d);
    exec_gpu_destroy(g);
}

static void test_deterministic(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_model("tiny-moe-mla", &m);
    struct exec_ref_model t;
    struct moe_error err;
    assert_int_equal(exec_model_table(&t, &m, &err), MOE_OK);
    double la[6], lb[6], *pa = malloc(sizeof *pa * t.nparams), *pb = malloc(sizeof *pb * t.nparams);
    run_steps(&m, 1, la, pa);
    run_steps(&m, 1, lb, pb);
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(pa, pb, sizeof *pa * t.nparams);
    run_steps(&m, 4, lb, pb); /* expert GEMMs on four streams: the same bits */
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(pa, pb, sizeof *pa * t.nparams);
    printf("tiny-moe-mla: 3 steps twice and once on 4 expert streams, losses and %zu parameters "
           "bit-identical (last loss %.9f)\n",
           t.nparams, la[5]);
    free(pa), free(pb);
}

/* The GPU twin of test_ref_train's run: 60 steps on tests/data/train-text.md next to the reference's
 * AdamW, from the same bf16-rounded weights; the losses agree within 2e-3 relative for ten
 * steps, and the GPU's loss falls by more than 1 nat. */
static void train_on_text(bool cudnn_attention, bool moments_bf16, double tol)
{
    enum { SEQ = 33, STEPS = 60 };
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    struct exec_ref_model r;
    struct moe_error err;
    assert_int_equal(exec_ref_model_create(&r, &m, 42, &err), MOE_OK);
    for (size_t i = 0; i < r.nparams; i++) r.params[i] = exec_ref_bf16(r.params[i]);
    struct exec_gpu_cfg cfg = {.seq = SEQ - 1,
                               .mbs = 1,
                               .streams = 1,
                               .cudnn_attention = cudnn_attention,
                               .moments_bf16 = moments_bf16};
    struct exec_gpu *g;
    if (exec_gpu_create(&g, &m, &cfg, &err) != MOE_OK) fail_msg("%s", err.message);
    assert_int_equal(exec_gpu_set_params(g, r.params, &err), MOE_OK);
    char text[1024];
    struct exec_data d;
    assert_int_equal(exec_data_open(&d, moe_test_src(text, sizeof text, "tests/data/train-text.md"),
                                    m.vocab, 1, &err),
                     MOE_OK);
    double *gr = calloc(r.nparams, sizeof *gr), *m1 = calloc(r.nparams, sizeof *m1),
           *m2 = calloc(r.nparams, sizeof *m2);
    struct exec_adamw o;
    moe_test_adamw(&o, STEPS);
    o.moments_bf16 = moments_bf16;
    int tok[SEQ];
    double first = 0, last = 0, worst = 0;
    for (int step = 0; step < STEPS; step++) {
        exec_data_next(&d, tok, SEQ);
        double lr_, lg, a, gn;
        assert_int_equal(exec_ref_model_step(&r, tok, SEQ, &lr_, NULL, gr, &err), MOE_OK);
        double gnr = exec_ref_adamw_step(&r, gr, m1, m2, step, &o);
        assert_int_equal(exec_gpu_step_begin(g, &err), MOE_OK);
        assert_int_equal(exec_gpu_micro_batch(g, tok, 1.0, &lg, &a, &err), MOE_OK);
        assert_int_equal(exec_gpu_optimizer(g, &o, step, &gn, &err), MOE_OK);
        struct exec_gpu_step_stats st;
        assert_int_equal(exec_gpu_step_end(g, &st, &err), MOE_OK);
        double rel = fabs(lg - lr_) / lr_;
        if (step < 10 && rel > worst) worst = rel;
        if (getenv("MOEPLAN_TEST_VERBOSE")) {
            double *pg = malloc(sizeof *pg * r.nparams), wd = 0;
            const char *wn = "";
            assert_int_equal(exec_gpu_get_params(g, pg, &err), MOE_OK);
            for (int i = 0; i < r.ntensors; i++) {
                const struct exec_tensor *t = &r.tensor[i];
                double rel = tensor_rel_l2(t, pg, r.params);
                if (rel > wd) wd = rel, wn = t->name;
            }
            printf("step %d: loss gpu %.5f ref %.5f gnorm %.4f / %.4f; params worst %.3g (%s)\n",
                   step, lg, lr_, gn, gnr, wd, wn);
            free(pg);
        }
        /* bf16 rounding differences grow through Adam's normalized updates (and a loss spike
         * amplifies them): the curves are compared step by step over the first ten steps */
        if (step < 10 && !(rel <= tol)) fail_msg("step %d: loss gpu %.5f, ref %.5f", step, lg, lr_);
        if (step < 5) first += lg / 5;
        if (step >= STEPS - 5) last += lg / 5;
    }
    char att[320];
    printf("tiny-moe-gqa on tests/data/train-text.md, GPU (%s; %s moments): loss %.3f -> %.3f; "
           "worst difference from the reference %.2g relative (first 10 steps, at most %g)\n",
           exec_gpu_attention(g, att, sizeof att), moments_bf16 ? "bf16" : "fp32", first, last,
           worst, tol);
    assert_true(last < first - 1.0);
    free(gr), free(m1), free(m2);
    exec_data_close(&d);
    exec_gpu_destroy(g);
    exec_ref_model_destroy(&r);
}

/* The GPU twin of test_ref_train's run, with our attention kernel (within 2e-3 of the reference
 * over the first ten steps), with cuDNN's (within 5e-3: its dQ, dK and dV are bf16), and with
 * bf16 Adam moments on both sides (our kernel, 2e-3). */
static void test_train_on_text(void **state)
{
    (void)state;
    if (!gpus()) skip();
    train_on_text(false, false, 2e-3);
    train_on_text(true, false, 5e-3);
    train_on_text(false, true, 2e-3);
}

/* fp8 training against bf16 on the same GPU from the same weights, per recipe (per-tensor
 * current scaling, blockwise) and gradient format (E4M3, E5M2). On bf16's routing (the fp8 run's
 * first step takes bf16's choices: a token whose scores nearly tie may pick another expert in
 * fp8, which moves its gradients wholesale; how many do is printed): one micro-batch's loss
 * within 1% of bf16's, and every gradient within 10% of bf16's (15% with E5M2 gradients;
 * relative L2 over the tensor: the fp8 GEMMs round each operand to 3 mantissa bits, the E5M2
 * gradients to 2, about 1.8% and 3.6% rms a value). The routers' gradients are held apart,
 * within FP8_ROUTER_GRAD (1.5 times that with E5M2): each is a difference of dot products of the
 * experts' outputs with the output's gradient (over the hidden width, and among the token's
 * experts), sums that cancel, so the fp8 outputs' rounding shows in it most (bf16's gradients
 * too are furthest from the double reference's there, test_variants). Then 40 steps on text,
 * each recipe routing by its own routers, whose mean loss over the last five is within 2% of
 * bf16's. The tiny models' widths are multiples of 16: every projection runs in fp8. The experts'
 * SwiGLU backward quantizes its gradients itself (blockwise its forward its output too);
 * per-tensor, the kernels that write the experts' rows keep their amax for the quantization; the
 * weights' quantization overlaps the forward: each the same bits as the unfused path
 * (fp8_unfused) and as the weights quantized in line (fp8_cast_sync), loss, gradients and 40
 * steps. */
#define FP8_ROUTER_GRAD 0.40
enum fp8_path {
    FP8_FUSED,
    FP8_UNFUSED,
    FP8_CAST_SYNC
}; /* the last: fused, the weights'
                                                          * quantization on the main stream */
static double fp8_run(const struct mdl_model *m, const double *p0, enum cost_precision prec,
                      bool e5m2, enum fp8_path path, const int *force, int *routing, double *grads,
                      double *last)
{
    enum { SEQ = 33, STEPS = 40 };
    struct exec_gpu_cfg cfg = {.seq = SEQ - 1,
                               .mbs = 1,
                               .streams = 1,
                               .precision = prec,
                               .fp8_e5m2_grads = e5m2,
                               .fp8_unfused = path == FP8_UNFUSED,
                               .fp8_cast_sync = path == FP8_CAST_SYNC};
    struct exec_gpu *g;
    struct moe_error err;
    if (exec_gpu_create(&g, m, &cfg, &err) != MOE_OK) fail_msg("%s", err.message);
    assert_int_equal(exec_gpu_set_params(g, p0, &err), MOE_OK);
    char text[1024];
    struct exec_data d;
    assert_int_equal(exec_data_open(&d, moe_test_src(text, sizeof text, "tests/data/train-text.md"),
                                    m->vocab, 1, &err),
                     MOE_OK);
    struct exec_adamw o;
    moe_test_adamw(&o, STEPS);
    int tok[SEQ];
    double first = 0;
    *last = 0;
    for (int step = 0; step < STEPS; step++) {
        exec_data_next(&d, tok, SEQ);
        double loss, a, gn;
        struct exec_gpu_step_stats st;
        assert_int_equal(exec_gpu_step_begin(g, &err), MOE_OK);
        if (step == 0 && force) { /* refused: an expert past the last, one chosen twice */
            size_t np = (size_t)mdl_moe_layer_count(m) * (SEQ - 1) * m->moe.top_k;
            int *bad = malloc(sizeof *bad * np);
            memcpy(bad, force, sizeof *bad * np);
            bad[0] = m->moe.experts;
            assert_int_equal(exec_gpu_force_routing(g, bad, &err), MOE_ERR_INPUT);
            bad[0] = bad[1];
            assert_int_equal(exec_gpu_force_routing(g, bad, &err), MOE_ERR_INPUT);
            free(bad);
            assert_int_equal(exec_gpu_force_routing(g, force, &err), MOE_OK);
        }
        if (exec_gpu_micro_batch(g, tok, 1.0, &loss, &a, &err) != MOE_OK)
            fail_msg("%s: %s", cost_precision_names[prec], err.message);
        if (step == 0) {
            first = loss;
            assert_int_equal(exec_gpu_get_grads(g, grads, &err), MOE_OK);
            if (routing) assert_int_equal(exec_gpu_last_routing(g, routing, &err), MOE_OK);
            assert_int_equal(exec_gpu_force_routing(g, NULL, &err), MOE_OK);
        }
        assert_int_equal(exec_gpu_optimizer(g, &o, step, &gn, &err), MOE_OK);
        assert_int_equal(exec_gpu_step_end(g, &st, &err), MOE_OK);
        if (step >= STEPS - 5) *last += loss / 5;
    }
    exec_data_close(&d);
    exec_gpu_destroy(g);
    return first;
}

static void test_fp8_training(void **state)
{
    (void)state;
    if (!gpus()) skip();
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    struct exec_ref_model r;
    struct moe_error err;
    assert_int_equal(exec_ref_model_create(&r, &m, 42, &err), MOE_OK);
    double *g16 = calloc(r.nparams, sizeof *g16), *g8 = calloc(r.nparams, sizeof *g8);
    double last16, last8;
    int k = m.moe.top_k, P = 32 * k; /* 32 tokens a micro-batch (fp8_run's SEQ - 1) */
    size_t nr = (size_t)mdl_moe_layer_count(&m) * P;
    int *route16 = calloc(nr, sizeof *route16), *route8 = calloc(nr, sizeof *route8);
    double loss16 = fp8_run(&m, r.params, COST_BF16, false, FP8_FUSED, NULL, route16, g16, &last16);
    /* the fp8 routers' own first choices: a token whose top-k scores nearly tie may pick another
     * expert, which moves its gradients wholesale; so the comparisons below run on bf16's */
    fp8_run(&m, r.params, COST_FP8, false, FP8_FUSED, NULL, route8, g8, &last8);
    int moved = 0;
    for (size_t t = 0; t < nr; t += k)
        for (int j = 0; j < k; j++) {
            bool in = false;
            for (int i = 0; i < k; i++) in |= route8[t + j] == route16[t + i];
            moved += !in;
        }
    printf("fp8's routers (per-tensor) choose %d of %zu (token, expert) pairs otherwise than "
           "bf16's in the first step\n",
           moved, nr);
    bool ok = true;               /* every recipe measured and printed, then the verdict */
    for (int c = 0; c < 4; c++) { /* each recipe with E4M3 and with E5M2 gradients */
        enum cost_precision prec = c >= 2 ? COST_FP8_BLOCK : COST_FP8;
        bool e5 = c % 2;
        double loss8 = fp8_run(&m, r.params, prec, e5, FP8_FUSED, route16, NULL, g8, &last8),
               worst = 0, router = 0;
        const char *wn = "";
        for (int i = 0; i < r.ntensors; i++) {
            const struct exec_tensor *t = &r.tensor[i];
            double rel = tensor_rel_l2(t, g8, g16);
            const char *dot = strrchr(t->name, '.');
            if (dot && !strcmp(dot, ".router")) {
                if (rel > router) router = rel;
            } else if (rel > worst) {
                worst = rel, wn = t->name;
            }
        }
        printf("%s (gradients %s): loss %.5f (bf16 %.5f), worst gradient %.3g relative (%s), the "
               "routers' %.3g; after 40 steps %.4f (bf16 %.4f)\n",
               cost_precision_names[prec], e5 ? "e5m2" : "e4m3", loss8, loss16, worst, wn, router,
               last8, last16);
        ok &= fabs(loss8 - loss16) <= 0.01 * loss16;
        ok &= worst <= (e5 ? 0.15 : 0.10);
        ok &= router <= FP8_ROUTER_GRAD * (e5 ? 1.5 : 1.0);
        ok &= fabs(last8 - last16) <= 0.02 * last16;
        /* fused against unfused (blockwise, the SwiGLU kernels that quantize; per-tensor, its
         * backward and the amax kept by the kernels that write the experts' rows and by AdamW;
         * both, the weights' quantization overlapped), and against the fused path with the
         * weights quantized on the main stream: the same bits */
        for (int v = FP8_UNFUSED; v <= FP8_CAST_SYNC; v++) {
            double *gu = calloc(r.nparams, sizeof *gu), lastu;
            double lossu =
                fp8_run(&m, r.params, prec, e5, (enum fp8_path)v, route16, NULL, gu, &lastu);
            size_t differ = 0;
            for (size_t j = 0; j < r.nparams; j++) differ += gu[j] != g8[j];
            printf("%s (%s gradients), fused and %s: loss %.17g and %.17g, %zu of %zu gradients "
                   "differ; after 40 steps %.17g and %.17g\n",
                   cost_precision_names[prec], e5 ? "e5m2" : "e4m3",
                   v == FP8_UNFUSED ? "unfused" : "fused with the weights quantized in line", loss8,
                   lossu, differ, r.nparams, last8, lastu);
            ok &= lossu == loss8 && differ == 0 && lastu == last8;
            free(gu);
        }
    }
    assert_true(ok);
    free(g16), free(g8), free(route16), free(route8);
    exec_ref_model_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gqa),           cmocka_unit_test(test_variants),
        cmocka_unit_test(test_mla),           cmocka_unit_test(test_selective_recompute),
        cmocka_unit_test(test_dropless),      cmocka_unit_test(test_memory_estimate),
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_train_on_text),
        cmocka_unit_test(test_fp8_training),  cmocka_unit_test(test_expert_parallel),
    };
    if (!gpus()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
