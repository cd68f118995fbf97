/*
 * run.c: a plan's training run: every rank's loop, however the ranks were started (issue 8):
 * one GPU (no transport), a thread per GPU of this node (NCCL), virtual ranks on GPU 0 (the
 * local transport: a multi-GPU plan checked on one GPU), or one process of mpirun or srun
 * (NCCL, its id through a file).
 *
 * What runs is what exec_plan_runnable lets through: tp = 1; EP or PP, not both. The groups are
 * split from the run's communicator by the plan's "ranks": an EP group is the ranks of one
 * expert-DP index (in rank order, which is each one's ep), a PP group those of one DP index (in
 * rank order: each one's stage). Every rank holds the whole model and computes its part: its
 * experts, its stages (so memory is not yet the plan's per-stage or per-expert memory).
 * - Pipeline: the plan's stage split, the 1F1B or interleaved schedule of the reference
 *   (exec_pp_rounds), activations and their gradients over the PP group each round; a stage's
 *   backward recomputes its forward from the stage input kept per (chunk, micro-batch).
 * - Data: every rank reads the step's whole global batch from the same stream and trains on its
 *   sequences: micro-batch mb of DP rank d holds sequences (mb x dp + d) x mbs ... + mbs - 1, so
 *   any dp and micro-batching trains on the same tokens with the same mean loss.
 * - Gradients: one all-reduce over the run. A rank's gradient of an expert or a stage it does
 *   not hold is zero, so that sum gives each parameter its DP (or expert-DP) sum, and tied
 *   embeddings the sum of the first and the last stage.
 *   (Reducing experts over their own group only would move ep times fewer bytes: not yet.)
 * - Overlap: in the last micro-batch's backward each block's gradients start their all-reduce
 *   (a bucket a block) as soon as they are complete, on the transport's stream (pp = 1).
 * - ZeRO-1 (zero = 1): the optimizer state sharded over the run's ranks; each updates its
 *   shard after the all-reduce and all-gathers the parameters (exec_gpu_cfg.zero).
 * - Biases of aux-loss-free balancing: the loads of every rank, so they stay equal everywhere.
 */
#include "exec.h"
#include "topo.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_MAX_VIRTUAL 64

struct run_shared {
    const struct exec_run_cfg *c;
    struct exec_run_result *r;
    unsigned char id[EXEC_NCCL_ID_BYTES]; /* THREADS: the NCCL id, through memory */
    void *streams[RUN_MAX_VIRTUAL];       /* VIRTUAL: each rank's stream, for the local memory */
};

bool exec_attention_cudnn(enum exec_attention a)
{
#ifdef MOEPLAN_HAVE_CUDNN
    return a != EXEC_ATTN_OWN;
#else
    return a == EXEC_ATTN_CUDNN; /* asked for: the executor says why it runs ours */
#endif
}

/* x (n doubles, host) summed over t's ranks, through the device buffer d (n doubles). */
static enum moe_status sum_doubles(struct exec_transport *t, double *d, double *x, size_t n,
                                   struct moe_error *err)
{
    /* a pageable copy may return before it lands; the collective's stream would not wait */
    if (cudaMemcpy(d, x, sizeof *x * n, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        return moe_error_set(err, MOE_ERR_CUDA, "run: rank %d: copy to the GPU", t->rank);
    enum moe_status st = t->ops->allreduce_sum(t, d, n, err);
    if (st != MOE_OK) return st;
    if (cudaMemcpy(x, d, sizeof *x * n, cudaMemcpyDeviceToHost) != cudaSuccess)
        return moe_error_set(err, MOE_ERR_CUDA, "run: rank %d: copy from the GPU", t->rank);
    return MOE_OK;
}

/* The EP groups of rank me, one per MoE layer: the plan's placement, the members' domains. */
static enum moe_status ep_groups(const struct plan_file *p, int me, struct exec_ep_group **out,
                                 int **domain_out, struct moe_error *err)
{
    const struct mdl_model *m = &p->model;
    int ep = p->layout.ep, E = m->moe.experts, nmoe = 0, k = 0;
    for (int l = 0; l < m->layers; l++) nmoe += mdl_layer_is_moe(m, l);
    struct exec_ep_group *g = calloc((size_t)(nmoe ? nmoe : 1), sizeof *g);
    int *domain = malloc(sizeof *domain * (size_t)ep);
    *out = g;
    *domain_out = domain;
    if (!g || !domain) return moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory");
    for (int q = 0; q < p->gpus; q++) {
        if (p->rank[q].edp != p->rank[me].edp) continue;
        if (k >= ep || p->rank[q].ep != k)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "plan: rank %d has ep %d; the EP group of edp %d runs in rank "
                                 "order (ep %d expected)",
                                 q, p->rank[q].ep, p->rank[me].edp, k);
        domain[k++] = p->rank[q].domain;
    }
    if (k != ep)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "plan: the EP group of edp %d has %d ranks, ep = %d", p->rank[me].edp,
                             k, ep);
    for (int l = 0, i = 0; l < m->layers; l++) {
        if (!mdl_layer_is_moe(m, l)) continue;
        const int *pl = p->placement + (size_t)l * E; /* no replicas: exec_plan_runnable */
        g[i++] = (struct exec_ep_group){ep, E, m->moe.top_k, pl, domain, p->layout.dispatcher};
    }
    return MOE_OK;
}

/* Rank 0's binding to its GPU's NUMA node (hwloc), described; not binding is not an error. */
static void bind_rank(const struct exec_device_info *dev, char *out, size_t cap)
{
    struct topo_binding b;
    struct moe_error e;
    if (topo_bind_near_pci(dev->pci_bus_id, &b, &e) != MOE_OK)
        snprintf(out, cap, "not bound (%.200s)", e.message);
    else if (b.numa_node < 0)
        snprintf(out, cap, "CPUs %.200s (hwloc names no NUMA node for %.31s)", b.cpus,
                 dev->pci_bus_id);
    else
        snprintf(out, cap, "NUMA node %d, CPUs %.200s%s", b.numa_node, b.cpus,
                 b.memory_bound ? ", memory too" : " (memory binding refused)");
}

/* The routing since the start, every rank's summed, into r (rank 0). */
static enum moe_status routing(struct exec_gpu *g, const struct mdl_model *m,
                               struct exec_transport *world, bool first, struct exec_run_result *r,
                               struct moe_error *err)
{
    int E = m->moe.experts, L = m->layers;
    size_t nc = (size_t)L * E, n = nc + nc * E;
    int64_t *c = calloc(n ? n : 1, sizeof *c);
    double *x = malloc(sizeof *x * (n ? n : 1)), *d = NULL;
    enum moe_status st = MOE_OK;
    if (!c || !x) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory");
        goto done;
    }
    for (int l = 0; l < L && st == MOE_OK; l++)
        if (mdl_layer_is_moe(m, l))
            st = exec_gpu_routing(g, l, c + (size_t)l * E, c + nc + (size_t)l * E * E, err);
    if (st != MOE_OK) goto done;
    if (world && n) {
        for (size_t i = 0; i < n; i++) x[i] = (double)c[i];
        if (cudaMalloc((void **)&d, sizeof *d * n) != cudaSuccess) {
            st = moe_error_set(err, MOE_ERR_GPU_NOMEM, "run: out of GPU memory for the routing");
            goto done;
        }
        if ((st = sum_doubles(world, d, x, n, err))) goto done;
        for (size_t i = 0; i < n; i++) c[i] = (int64_t)x[i];
    }
    if (first) {
        r->counts = malloc(sizeof *r->counts * (nc ? nc : 1));
        r->coact = malloc(sizeof *r->coact * (nc * E > 0 ? nc * E : 1));
        if (!r->counts || !r->coact) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory");
            goto done;
        }
        memcpy(r->counts, c, sizeof *c * nc);
        memcpy(r->coact, c + nc, sizeof *c * nc * E);
    }
done:
    free(c), free(x);
    if (d) cudaFree(d);
    return st;
}

/* A pipeline rank's state: its PP group, the round table, the stage split, and device buffers
 * for each (chunk, micro-batch) of this rank: its input, and the gradient of its output. */
struct pipe {
    struct exec_transport t;
    struct exec_pp_op *table;
    int rounds, S, vpp, V, M, first[EXEC_PP_MAX_STAGES * 8 + 1];
    size_t th; /* floats of one activation: tokens x hidden */
    float *act, *dgo, *out, *in;
};

static void pipe_free(struct pipe *p)
{
    if (p->t.ops) p->t.ops->release(&p->t);
    free(p->table);
    if (p->act) cudaFree(p->act);
    if (p->dgo) cudaFree(p->dgo);
    if (p->out) cudaFree(p->out);
    if (p->in) cudaFree(p->in);
}

/* The PP group of rank me (the ranks of its DP index, in rank order: its pp coordinate), the
 * schedule and the buffers. */
static enum moe_status pipe_init(struct pipe *pp, const struct plan_file *p, int me,
                                 struct exec_transport *world, struct moe_error *err)
{
    const struct cost_layout *l = &p->layout;
    memset(pp, 0, sizeof *pp);
    pp->S = l->pp;
    pp->vpp = l->vpp;
    pp->V = l->pp * l->vpp;
    pp->M = p->micro_batches;
    if (pp->V > (int)(sizeof pp->first / sizeof pp->first[0]) - 1 || pp->S > EXEC_PP_MAX_STAGES ||
        (pp->vpp > 1 && pp->M % pp->S))
        return moe_error_set(err, MOE_ERR_INPUT,
                             "plan: %d x %d virtual stages (at most %d ranks), %d micro-batches (a "
                             "multiple of pp when interleaved)",
                             pp->S, pp->vpp, EXEC_PP_MAX_STAGES, pp->M);
    for (int v = 0; v < pp->V; v++) pp->first[v + 1] = pp->first[v] + p->stage_layers[v];
    for (int q = 0, k = 0; q < p->gpus; q++)
        if (p->rank[q].dp == p->rank[me].dp && p->rank[q].pp != k++)
            return moe_error_set(err, MOE_ERR_INPUT,
                                 "plan: rank %d has pp %d; the stages of dp %d run in rank order",
                                 q, p->rank[q].pp, p->rank[me].dp);
    enum moe_status st = world->ops->split(world, p->rank[me].dp, &pp->t, err);
    if (st != MOE_OK) return st;
    if ((pp->rounds = exec_pp_rounds(pp->S, pp->vpp, pp->M, &pp->table)) < 0)
        return moe_error_set(err, MOE_ERR_NOMEM, "pipeline: out of memory");
    pp->th = (size_t)l->mbs * l->seq_len * p->model.hidden;
    size_t slots = (size_t)pp->vpp * pp->M * pp->th * sizeof(float);
    if (cudaMalloc((void **)&pp->act, slots) != cudaSuccess ||
        cudaMalloc((void **)&pp->dgo, slots) != cudaSuccess ||
        cudaMalloc((void **)&pp->out, pp->th * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&pp->in, 2 * pp->th * sizeof(float)) != cudaSuccess)
        return moe_error_set(err, MOE_ERR_GPU_NOMEM,
                             "pipeline: rank %d: out of GPU memory for %d x %d stage activations",
                             me, pp->vpp, pp->M);
    return MOE_OK;
}

/* One step's micro-batches through this rank's stages, in the schedule's rounds: *loss and *aux
 * are this rank's share (the last stage's cross-entropy, every stage's load-balance losses),
 * means over the micro-batches. */
static enum moe_status pipe_step(struct pipe *pp, struct exec_gpu *g, const int *tok, int per,
                                 int mbs, int dp, int dpi, double *loss, double *aux,
                                 struct moe_error *err)
{
    int S = pp->S, V = pp->V, M = pp->M, me = pp->t.rank;
    double scale = 1.0 / ((double)M * dp);
    enum moe_status st = MOE_OK;
    *loss = *aux = 0.0;
    for (int k = 0; k < pp->rounds && st == MOE_OK; k++) {
        const struct exec_pp_op *row = pp->table + (size_t)k * S, op = row[me];
        if (op.kind) {
            const int *mine = tok + (size_t)(op.mb * dp + dpi) * mbs * per;
            int lo = pp->first[op.v], hi = pp->first[op.v + 1];
            float *slot = pp->act + ((size_t)(op.v / S) * M + op.mb) * pp->th;
            float *dslot = pp->dgo + ((size_t)(op.v / S) * M + op.mb) * pp->th;
            double l, a;
            bool bw = op.kind == 'B', last = op.v + 1 == V;
            st = exec_gpu_slice(g, mine, lo, hi, op.v > 0 ? slot : NULL,
                                !bw && !last ? pp->out : NULL, bw && !last ? dslot : NULL,
                                bw && op.v > 0 ? pp->out : NULL, bw, scale, &l, &a, err);
            if (!bw) *loss += l / M, *aux += a / M;
        }
        if (st != MOE_OK) break; /* the others fail in this round's exchange */
        int send[EXEC_PP_MAX_STAGES], recv[EXEC_PP_MAX_STAGES];
        struct exec_pp_op arriving[2];
        int nin = exec_pp_round_io(row, S, V, me, (int)pp->th, send, recv, arriving);
        st = pp->t.ops->alltoallv(&pp->t, pp->out, send, pp->in, recv, sizeof(float), err);
        for (int i = 0; st == MOE_OK && i < nin; i++) { /* in rank order */
            const struct exec_pp_op *o = &arriving[i];
            size_t at = ((size_t)(o->v / S) * M + o->mb) * pp->th;
            float *dst = (o->kind == 'F' ? pp->act : pp->dgo) + at;
            if (cudaMemcpyAsync(dst, pp->in + (size_t)i * pp->th, pp->th * sizeof(float),
                                cudaMemcpyDeviceToDevice, exec_gpu_stream(g)) != cudaSuccess)
                st = moe_error_set(err, MOE_ERR_CUDA, "pipeline: rank %d: a copy", me);
        }
    }
    return st;
}

/* A rank's checkpoint in host memory: the parameters, the optimizer's shard, the biases, and
 * where the data stream stands. */
struct ckpt {
    double *params, *bias;
    float *m1, *m2;
    struct exec_ckpt_part part[6];
};

static enum moe_status ckpt_init(struct ckpt *k, struct exec_gpu *g, struct exec_data *d,
                                 struct moe_error *err)
{
    const struct exec_ref_model *t = exec_gpu_table(g);
    size_t n = t->nparams, sn = exec_gpu_state_floats(g);
    size_t nb = (size_t)t->model.layers * (t->model.moe.experts ? t->model.moe.experts : 1);
    k->params = malloc(sizeof *k->params * n);
    k->bias = calloc(nb, sizeof *k->bias);
    k->m1 = malloc(sizeof *k->m1 * sn);
    k->m2 = malloc(sizeof *k->m2 * sn);
    if (!k->params || !k->bias || !k->m1 || !k->m2)
        return moe_error_set(err, MOE_ERR_NOMEM, "checkpoint: out of memory");
    k->part[0] = (struct exec_ckpt_part){"params", k->params, k->params, sizeof *k->params * n};
    k->part[1] = (struct exec_ckpt_part){"adam_m1", k->m1, k->m1, sizeof *k->m1 * sn};
    k->part[2] = (struct exec_ckpt_part){"adam_m2", k->m2, k->m2, sizeof *k->m2 * sn};
    k->part[3] = (struct exec_ckpt_part){"bias", k->bias, k->bias, sizeof *k->bias * nb};
    k->part[4] = (struct exec_ckpt_part){"data_pos", &d->pos, &d->pos, sizeof d->pos};
    k->part[5] = (struct exec_ckpt_part){"data_rng", &d->rng, &d->rng, sizeof d->rng};
    return MOE_OK;
}

static void ckpt_free(struct ckpt *k)
{
    free(k->params), free(k->bias), free(k->m1), free(k->m2);
}

/* One rank's run: its GPU, its EP group, `steps` steps of the plan. world: the run's transport
 * (NULL: one rank alone). */
static enum moe_status rank_main(struct run_shared *sh, int me, struct exec_transport *world,
                                 int device, struct moe_error *err)
{
    const struct exec_run_cfg *c = sh->c;
    const struct plan_file *p = c->plan;
    const struct mdl_model *m = &p->model;
    const struct cost_layout *l = &p->layout;
    const struct plan_rank *pr = &p->rank[me];
    int dp = l->dp, micro = p->micro_batches, per = l->seq_len + 1;
    int seqs = micro * dp * l->mbs, nmoe = 0;
    for (int b = 0; b < m->layers; b++) nmoe += mdl_layer_is_moe(m, b);
    struct exec_transport ept = {0, 1, NULL, NULL};
    struct pipe pipe;
    memset(&pipe, 0, sizeof pipe);
    struct ckpt ck;
    memset(&ck, 0, sizeof ck);
    int s0 = 0;
    struct exec_ep_group *groups = NULL;
    int *domain = NULL, *tok = NULL;
    double *scratch = NULL;
    struct exec_gpu *g = NULL;
    struct exec_data data;
    memset(&data, 0, sizeof data);
    struct exec_run_info info;
    memset(&info, 0, sizeof info);
    enum moe_status st = MOE_OK;
    if (cudaSetDevice(device) != cudaSuccess) {
        st = moe_error_set(err, MOE_ERR_CUDA, "run: rank %d: no GPU %d", me, device);
        goto done;
    }
    if ((st = exec_device_query(device, &info.dev, err))) goto done;
    if (c->mode == EXEC_RUN_VIRTUAL)
        snprintf(info.binding, sizeof info.binding, "not bound (virtual ranks share one GPU)");
    else
        bind_rank(&info.dev, info.binding, sizeof info.binding);
    if (l->ep > 1) {
        if ((st = ep_groups(p, me, &groups, &domain, err))) goto done;
        if ((st = world->ops->split(world, pr->edp, &ept, err))) goto done;
    }
    if (l->pp > 1 && (st = pipe_init(&pipe, p, me, world, err))) goto done;
    struct exec_gpu_cfg cfg = {.seq = l->seq_len,
                               .mbs = l->mbs,
                               .recompute = l->recompute == COST_RECOMPUTE_FULL,
                               .recompute_modules = cost_layout_rc(l),
                               .aux_coef = c->aux,
                               .device = device,
                               .streams = c->streams,
                               .ep = ept.ops ? &ept : NULL,
                               .ep_group = groups,
                               .ep_buffer_factor = p->buffer_factor,
                               .ep_groups = nmoe,
                               .zero = l->zero >= 1 && dp > 1 ? world : NULL,
                               .dp = l->pp == 1 && !c->no_grad_overlap ? world : NULL,
                               .micro_batches = micro,
                               .mem_limit = c->gpu_mem_limit,
                               .cudnn_attention = exec_attention_cudnn(c->attention),
                               .moments_bf16 = l->moments_bf16,
                               .precision = l->precision,
                               .fp8_e5m2_grads = cost_precision_e5m2_grads(l->precision)};
    if ((st = exec_gpu_create(&g, m, &cfg, err))) goto done;
    if (c->mode == EXEC_RUN_VIRTUAL) sh->streams[me] = exec_gpu_stream(g);
    if ((st = exec_gpu_init(g, c->seed, err))) goto done;
    if (c->bias0 && (st = exec_gpu_set_bias(g, c->bias0, err))) goto done;
    if ((st = exec_data_open(&data, c->data, m->vocab, c->seed, err))) goto done;
    exec_adamw_defaults(&info.opt);
    info.opt.lr_max = c->lr;
    info.opt.lr_min = c->lr / 10;
    info.opt.total_steps = c->steps;
    info.opt.warmup_steps = c->warmup;
    info.opt.moments_bf16 = l->moments_bf16;
    tok = malloc(sizeof *tok * (size_t)seqs * per);
    if (!tok) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory");
        goto done;
    }
    if (world && cudaMalloc((void **)&scratch, sizeof *scratch * 5) != cudaSuccess) {
        st = moe_error_set(err, MOE_ERR_GPU_NOMEM, "run: rank %d: out of GPU memory", me);
        goto done;
    }
    info.mode = c->mode;
    info.transport = world != NULL;
    info.ranks = p->gpus;
    info.devices = c->mode == EXEC_RUN_THREADS ? p->gpus : 1;
    snprintf(info.data, sizeof info.data, "%s", data.source);
    exec_gpu_attention(g, info.attention, sizeof info.attention);
    bool ckpt = c->ckpt_dir != NULL;
    int skips = 0; /* steps skipped for NaN or Inf in a row */
    struct exec_ckpt_id cid = {m->name, exec_gpu_table(g)->nparams, 0, me, p->gpus};
    if (ckpt && (st = ckpt_init(&ck, g, &data, err))) goto done;
    if (ckpt && c->resume) { /* the state of the latest checkpoint, then its step */
        if ((st = exec_ckpt_latest(c->ckpt_dir, &s0, err))) goto done;
        cid.step = s0;
        if ((st = exec_ckpt_load(c->ckpt_dir, s0, &cid, ck.part, 6, err)) ||
            (st = exec_gpu_set_params(g, ck.params, err)) ||
            (st = exec_gpu_set_state(g, ck.m1, ck.m2, ck.bias, err)))
            goto done;
        if (s0 >= c->steps) {
            st = moe_error_set(err, MOE_ERR_INPUT,
                               "%s: the checkpoint is at step %d, the run has %d steps: nothing "
                               "left to run",
                               c->ckpt_dir, s0, c->steps);
            goto done;
        }
    }
    info.first_step = s0;
    if (me == 0) {
        sh->r->info = info;
        sh->r->steps = calloc((size_t)(c->steps - s0), sizeof *sh->r->steps);
        if (!sh->r->steps) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory for %d steps' records",
                               c->steps - s0);
            goto done;
        }
        if (c->on_start) c->on_start(c->ctx, &info);
    }
    for (int s = s0; s < c->steps; s++) {
        double t0 = moe_time_now_s(), v[5] = {0, 0, 0, 0, 0}, gnorm = 0.0;
        char why[MOE_MSG_MAX] = "";
        struct exec_gpu_step_stats ss;
        /* testing (--inject-nan): rank 0 poisons a weight before the step, a gradient after it */
        bool poison = me == 0 && c->nan_tensor && s + 1 == c->nan_step;
        if ((st = exec_gpu_step_begin(g, err))) goto done;
        if (poison && c->nan_weight && (st = exec_gpu_poison(g, c->nan_tensor, true, err)))
            goto done;
        exec_data_next(&data, tok, seqs * per);
        if (l->pp > 1 &&
            (st = pipe_step(&pipe, g, tok, per, l->mbs, dp, pr->dp, &v[0], &v[1], err)))
            goto done;
        for (int mb = 0; mb < micro && l->pp == 1; mb++) {
            double lm, am;
            const int *mine = tok + (size_t)(mb * dp + pr->dp) * l->mbs * per;
            if ((st = exec_gpu_micro_batch(g, mine, 1.0 / (micro * dp), &lm, &am, err))) goto done;
            v[0] += lm / micro;
            v[1] += am / micro;
        }
        if (me == c->fail_rank && s + 1 == c->fail_step) {
            if (c->mode == EXEC_RUN_PROCESS) { /* a process that dies, as a crashed rank does */
                fprintf(stderr, "moeplan: rank %d exits in the middle of step %d (fault test)\n",
                        me, s + 1);
                _exit(3);
            }
            st = moe_error_set(err, MOE_ERR_RUNTIME,
                               "rank %d stopped in the middle of step %d (fault test)", me, s + 1);
            goto done;
        }
        if (poison && !c->nan_weight && (st = exec_gpu_poison(g, c->nan_tensor, false, err)))
            goto done;
        if (world && (st = exec_gpu_reduce_grads(g, world, err))) goto done;
        /* the norm is of the summed gradients: every rank decides the same */
        st = exec_gpu_optimizer(g, &info.opt, s, &gnorm, err);
        bool skipped = false;
        if (st == MOE_ERR_NUMERICS && c->skip_nonfinite) {
            struct moe_error first = *err;
            if (++skips < EXEC_MAX_SKIPS) {
                snprintf(why, sizeof why, "%s", first.message);
                skipped = true;
                st = MOE_OK;
            } else {
                moe_error_set(err, st, "%s (%d steps in a row skipped: the run stops)",
                              first.message, EXEC_MAX_SKIPS);
            }
        }
        if (st != MOE_OK) goto done;
        if (!skipped) {
            skips = 0;
            if ((st = exec_gpu_update_bias(g, c->bias_rate, world, err))) goto done;
        }
        if ((st = exec_gpu_step_end(g, &ss, err))) goto done;
        v[2] = ss.dispatch.nvlink;
        v[3] = ss.dispatch.scale_out;
        v[4] = c->stop && *c->stop ? 1.0 : 0.0;
        if (world && (st = sum_doubles(world, scratch, v, 5, err))) goto done;
        bool stop = v[4] > 0 && s + 1 < c->steps; /* agreed: some rank was asked to stop */
        bool due = c->ckpt_every > 0 && (s + 1) % c->ckpt_every == 0;
        if (ckpt && (due || stop)) {
            double one = 1.0; /* every rank's files are down before rank 0 commits */
            cid.step = s + 1;
            if ((st = exec_gpu_get_params(g, ck.params, err)) ||
                (st = exec_gpu_get_state(g, ck.m1, ck.m2, ck.bias, err)) ||
                (st = exec_ckpt_save(c->ckpt_dir, &cid, ck.part, 6, err)) ||
                (world && (st = sum_doubles(world, scratch, &one, 1, err))) ||
                (me == 0 && (st = exec_ckpt_commit(c->ckpt_dir, s + 1, err))))
                goto done;
        }
        if (me == 0) {
            struct exec_run_step rs = {s + 1,     skipped,
                                       "",        v[0] / dp,
                                       v[1] / dp, exec_lr_at(&info.opt, s),
                                       gnorm,     1e3 * (moe_time_now_s() - t0),
                                       ss};
            snprintf(rs.why, sizeof rs.why, "%s", why);
            rs.gpu.dispatch = (struct cost_bytes){v[2], v[3]};
            sh->r->dispatch.nvlink += v[2];
            sh->r->dispatch.scale_out += v[3];
            sh->r->steps[sh->r->nsteps++] = rs;
            if (c->on_step) c->on_step(c->ctx, &rs);
        }
        if (stop) {
            if (ckpt)
                st = moe_error_set(err, MOE_ERR_INTERRUPTED,
                                   "stopped by a signal after step %d of %d; checkpoint of step %d "
                                   "in %s: continue with --resume",
                                   s + 1, c->steps, s + 1, c->ckpt_dir);
            else
                st = moe_error_set(err, MOE_ERR_INTERRUPTED,
                                   "stopped by a signal after step %d of %d; no --checkpoint-dir, "
                                   "nothing saved",
                                   s + 1, c->steps);
            goto done;
        }
    }
    if ((st = routing(g, m, world, me == 0, sh->r, err))) goto done;
    if (me == 0) {
        /* what ran at the end: cuDNN's attention may have given up on a shape mid-run */
        exec_gpu_attention(g, sh->r->info.attention, sizeof sh->r->info.attention);
        exec_gpu_memory(g, &sh->r->memory);
        sh->r->filled = true;
    }
done:
    ckpt_free(&ck);
    pipe_free(&pipe);
    exec_gpu_destroy(g);
    if (ept.ops) ept.ops->release(&ept);
    if (scratch) cudaFree(scratch);
    exec_data_close(&data);
    free(groups), free(domain), free(tok);
    return st;
}

static enum moe_status virtual_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    return rank_main(arg, t->rank, t, 0, err);
}

/* THREADS: a rank on GPU `rank`, its own NCCL communicator. */
struct thread_rank {
    struct run_shared *sh;
    int rank;
    enum moe_status st;
    struct moe_error err;
};

static enum moe_status nccl_rank(struct run_shared *sh, const unsigned char *id, int rank,
                                 int ranks, int device, struct moe_error *err)
{
    struct exec_nccl *nc;
    struct exec_transport t;
    enum moe_status st = exec_nccl_create(&nc, id, rank, ranks, device, sh->c->timeout_s, err);
    if (st != MOE_OK) return st;
    exec_nccl_transport(nc, &t);
    st = rank_main(sh, rank, &t, device, err);
    exec_nccl_destroy(nc);
    return st;
}

static void *thread_main(void *arg)
{
    struct thread_rank *a = arg;
    a->err.status = MOE_OK;
    a->st = nccl_rank(a->sh, a->sh->id, a->rank, a->sh->c->plan->gpus, a->rank, &a->err);
    return NULL;
}

static enum moe_status run_threads(struct run_shared *sh, int ndev, struct moe_error *err)
{
    int R = sh->c->plan->gpus;
    if (R == 1 && !sh->c->nccl) return rank_main(sh, 0, NULL, 0, err);
    if (R > ndev)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "the plan has %d ranks and this machine %d GPU%s: start a rank per "
                             "GPU with mpirun or srun, or check the plan on one GPU with "
                             "--virtual-ranks",
                             R, ndev, ndev == 1 ? "" : "s");
    enum moe_status st = exec_nccl_unique_id(sh->id, err);
    if (st != MOE_OK) return st;
    struct thread_rank *a = calloc((size_t)R, sizeof *a);
    pthread_t *th = calloc((size_t)R, sizeof *th);
    if (!a || !th) {
        free(a), free(th);
        return moe_error_set(err, MOE_ERR_NOMEM, "run: out of memory");
    }
    int started = 0;
    for (; started < R; started++) {
        a[started] = (struct thread_rank){sh, started, MOE_OK, {0}};
        if (pthread_create(&th[started], NULL, thread_main, &a[started]) != 0) break;
    }
    /* a rank that never starts leaves the others to time out in their first collective */
    if (started < R)
        st = moe_error_set(err, MOE_ERR_RUNTIME, "run: rank %d's thread did not start", started);
    for (int q = 0; q < started; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < started && st == MOE_OK; q++)
        if (a[q].st != MOE_OK) {
            st = a[q].st;
            *err = a[q].err;
        }
    free(a), free(th);
    return st;
}

static enum moe_status run_virtual(struct run_shared *sh, struct moe_error *err)
{
    int R = sh->c->plan->gpus;
    if (R > RUN_MAX_VIRTUAL)
        return moe_error_set(err, MOE_ERR_INPUT, "--virtual-ranks: %d ranks (at most %d)", R,
                             RUN_MAX_VIRTUAL);
    struct exec_local_hub *hub;
    struct exec_local_mem mem;
    enum moe_status st = exec_local_hub_create(&hub, R, sh->c->timeout_s, err);
    if (st != MOE_OK) return st;
    exec_local_gpu_memory(&mem, sh->streams);
    exec_local_hub_set_memory(hub, &mem);
    st = exec_local_run(hub, virtual_rank, sh, err);
    exec_local_hub_destroy(hub);
    return st;
}

static enum moe_status run_process(struct run_shared *sh, int ndev, struct moe_error *err)
{
    const struct exec_run_cfg *c = sh->c;
    const struct exec_launch *la = &c->launch;
    int R = c->plan->gpus;
    if (la->ranks != R)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "the plan has %d ranks; %s started %d (mpirun -np %d / srun -n %d)", R,
                             exec_launcher_names[la->who], la->ranks, R, R);
    if (la->local_rank >= ndev)
        return moe_error_set(err, MOE_ERR_INPUT, "rank %d is local rank %d on a node with %d GPU%s",
                             la->rank, la->local_rank, ndev, ndev == 1 ? "" : "s");
    if (!c->id_file)
        return moe_error_set(err, MOE_ERR_INPUT, "run: no file to pass the NCCL id through");
    unsigned char id[EXEC_NCCL_ID_BYTES];
    enum moe_status st = la->rank == 0 ? exec_nccl_unique_id(id, err) : MOE_OK;
    if (st == MOE_OK)
        st = exec_launch_share_id(c->id_file, la->rank, id, sizeof id, c->timeout_s, err);
    if (st != MOE_OK) return st;
    st = nccl_rank(sh, id, la->rank, R, la->local_rank, err);
    if (la->rank == 0) unlink(c->id_file); /* every rank has joined: the id is spent */
    return st;
}

enum moe_status exec_run(const struct exec_run_cfg *c, struct exec_run_result *r,
                         struct moe_error *err)
{
    memset(r, 0, sizeof *r);
    const struct plan_file *p = c->plan;
    char why[256];
    if (!exec_plan_runnable(&p->model, &p->layout, p->gpus, p->placement, why, sizeof why))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "%s; `moeplan plan --runnable` plans only what this build runs", why);
    if (c->steps < 1 || c->timeout_s <= 0)
        return moe_error_set(err, MOE_ERR_INPUT, "run: %d steps, timeout %g s", c->steps,
                             c->timeout_s);
    int ndev = 0;
    enum moe_status st = exec_device_count(&ndev, err);
    if (st != MOE_OK) return st;
    if (ndev < 1)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "no CUDA GPU on this machine: `moeplan run` trains on a GPU (plan "
                             "and predict run anywhere)");
    struct run_shared sh;
    memset(&sh, 0, sizeof sh);
    sh.c = c;
    sh.r = r;
    switch (c->mode) {
    case EXEC_RUN_VIRTUAL: return run_virtual(&sh, err);
    case EXEC_RUN_PROCESS: return run_process(&sh, ndev, err);
    default: return run_threads(&sh, ndev, err);
    }
}
