/*
 * transport.c: the local transport: R virtual ranks in one process, one thread each, moving
 * host memory. It is how expert parallelism is tested without R GPUs (NCCL refuses two ranks on
 * one GPU); the NCCL transport runs the same callers on real ranks.
 *
 * Every collective is two meetings of all ranks: each posts its send buffer and counts, meets,
 * copies what the others posted for it, and meets again so no sender reuses a buffer early. A
 * meeting has a deadline: a rank that waits past it, or whose peer has failed, fails the meeting
 * for every rank with a message naming the operation and who was missing. So a dead or stuck
 * rank ends the run with an error, never a hang.
 *
 * A split makes child hubs (the plan's EP, DP, expert-DP groups) of the same threads. A failure
 * in a child fails its parent too; a wait in a child looks at its parents every few
 * milliseconds, so a rank failing anywhere ends every wait. Locks are taken child before parent
 * only, never the other way.
 */
#include "exec_dist.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct exec_local_hub {
    int ranks;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, generation;
    atomic_bool failed;
    char why[MOE_MSG_MAX];
    struct exec_local_hub *parent; /* a split's hub: the hub it came from (NULL: the root) */
    int *world;                    /* a split's hub: the root's rank of each of its ranks */
    int refs;                      /* a split's hub: its ranks that have not released it */
    struct exec_local_hub **child; /* (ranks) a split's new hub, at its lowest rank */
    bool *here;                    /* (ranks) arrived at the current meeting */
    const void **send;             /* (ranks) posted buffers */
    const int **send_count;        /* (ranks) posted counts */
    size_t *item_bytes;            /* (ranks) */
    struct exec_transport *t;      /* (ranks) */
    struct exec_local_mem mem;     /* where the buffers live: host memory unless set */
};

/* Host memory: the default. */
static void *host_alloc(void *ctx, int rank, size_t bytes)
{
    (void)ctx, (void)rank;
    return malloc(bytes ? bytes : 1);
}

static void host_free(void *ctx, int rank, void *p)
{
    (void)ctx, (void)rank;
    free(p);
}

static enum moe_status host_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes,
                                 struct moe_error *err)
{
    (void)ctx, (void)rank, (void)err;
    memcpy(dst, src, bytes);
    return MOE_OK;
}

static enum moe_status host_sum(void *ctx, int rank, double *dst, const double *const *src,
                                int ranks, size_t n, struct moe_error *err)
{
    (void)ctx, (void)rank, (void)err;
    for (size_t i = 0; i < n; i++) {
        double a = 0.0;
        for (int s = 0; s < ranks; s++) a += src[s][i];
        dst[i] = a;
    }
    return MOE_OK;
}

static enum moe_status host_sum_f32(void *ctx, int rank, float *dst, const float *const *src,
                                    int ranks, size_t n, struct moe_error *err)
{
    (void)ctx, (void)rank, (void)err;
    for (size_t i = 0; i < n; i++) {
        float a = 0.0f;
        for (int s = 0; s < ranks; s++) a += src[s][i];
        dst[i] = a;
    }
    return MOE_OK;
}

static enum moe_status host_ready(void *ctx, int rank, struct moe_error *err)
{
    (void)ctx, (void)rank, (void)err;
    return MOE_OK;
}

static const struct exec_local_mem host_mem = {host_alloc,   host_free,  host_copy, host_sum,
                                               host_sum_f32, host_ready, NULL};

void exec_local_hub_set_memory(struct exec_local_hub *h, const struct exec_local_mem *mem)
{
    h->mem = mem ? *mem : host_mem;
}

enum moe_status exec_local_hub_create(struct exec_local_hub **out, int ranks, double timeout_s,
                                      struct moe_error *err)
{
    *out = NULL;
    if (ranks < 1 || timeout_s <= 0)
        return moe_error_set(err, MOE_ERR_INPUT, "local transport: %d ranks, timeout %g s", ranks,
                             timeout_s);
    struct exec_local_hub *h = calloc(1, sizeof *h);
    if (!h) return moe_error_set(err, MOE_ERR_NOMEM, "local transport: out of memory");
    h->ranks = ranks;
    h->timeout_s = timeout_s;
    h->mem = host_mem;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->here = calloc((size_t)ranks, sizeof *h->here);
    h->send = calloc((size_t)ranks, sizeof *h->send);
    h->send_count = calloc((size_t)ranks, sizeof *h->send_count);
    h->item_bytes = calloc((size_t)ranks, sizeof *h->item_bytes);
    h->t = calloc((size_t)ranks, sizeof *h->t);
    h->child = calloc((size_t)ranks, sizeof *h->child);
    if (!h->here || !h->send || !h->send_count || !h->item_bytes || !h->t || !h->child) {
        exec_local_hub_destroy(h);
        return moe_error_set(err, MOE_ERR_NOMEM, "local transport: out of memory");
    }
    *out = h;
    return MOE_OK;
}

void exec_local_hub_destroy(struct exec_local_hub *h)
{
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->here);
    free(h->send);
    free(h->send_count);
    free(h->item_bytes);
    free(h->t);
    free(h->child);
    free(h->world);
    free(h);
}

/* The root's rank of rank `me` of h: what the memory's callbacks and messages name. */
static int world_rank(const struct exec_local_hub *h, int me)
{
    return h->world ? h->world[me] : me;
}

/* Fail every rank's current and next meetings (h's lock held), and its parents'. */
static void hub_fail_locked(struct exec_local_hub *h, const char *why)
{
    if (!h->failed) snprintf(h->why, sizeof h->why, "%s", why);
    h->failed = true;
    pthread_cond_broadcast(&h->cv);
    if (h->parent) {
        pthread_mutex_lock(&h->parent->mu);
        hub_fail_locked(h->parent, why);
        pthread_mutex_unlock(&h->parent->mu);
    }
}

/* A parent of h failed: h fails too, with the parent's reason (h's lock held). */
static bool hub_parent_failed_locked(struct exec_local_hub *h)
{
    for (struct exec_local_hub *p = h->parent; p; p = p->parent)
        if (atomic_load(&p->failed)) {
            char why[MOE_MSG_MAX];
            pthread_mutex_lock(&p->mu);
            snprintf(why, sizeof why, "%s", p->why);
            pthread_mutex_unlock(&p->mu);
            if (!h->failed) snprintf(h->why, sizeof h->why, "%s", why);
            h->failed = true;
            pthread_cond_broadcast(&h->cv);
            return true;
        }
    return false;
}

static enum moe_status hub_meet(struct exec_local_hub *h, int rank, const char *op,
                                struct moe_error *err)
{
    pthread_mutex_lock(&h->mu);
    int who = world_rank(h, rank);
    if (h->failed || hub_parent_failed_locked(h)) {
        char why[MOE_MSG_MAX];
        snprintf(why, sizeof why, "%s", h->why);
        pthread_mutex_unlock(&h->mu);
        return moe_error_set(err, MOE_ERR_RUNTIME, "rank %d, %s: %s", who, op, why);
    }
    int gen = h->generation;
    h->here[rank] = true;
    if (++h->arrived == h->ranks) {
        h->arrived = 0;
        h->generation++;
        memset(h->here, 0, sizeof *h->here * (size_t)h->ranks);
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        return MOE_OK;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    double whole = (double)(time_t)h->timeout_s, frac = h->timeout_s - whole;
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)(frac * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    while (gen == h->generation && !h->failed && !hub_parent_failed_locked(h)) {
        struct timespec until = deadline;
        if (h->parent) { /* a child's wait looks at its parents every 10 ms */
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 10000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            if (until.tv_sec > deadline.tv_sec ||
                (until.tv_sec == deadline.tv_sec && until.tv_nsec > deadline.tv_nsec))
                until = deadline;
        }
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT && gen == h->generation &&
            until.tv_sec == deadline.tv_sec && until.tv_nsec == deadline.tv_nsec) {
            char why[MOE_MSG_MAX];
            int n =
                snprintf(why, sizeof why, "timed out after %g s waiting for rank", h->timeout_s);
            for (int r = 0, first = 1; r < h->ranks && n < (int)sizeof why; r++)
                if (!h->here[r]) {
                    n += snprintf(why + n, sizeof why - (size_t)n, "%s %d", first ? "" : ",",
                                  world_rank(h, r));
                    first = 0;
                }
            hub_fail_locked(h, why);
        }
    }
    bool failed = gen == h->generation;
    char why[MOE_MSG_MAX];
    snprintf(why, sizeof why, "%s", h->why);
    pthread_mutex_unlock(&h->mu);
    return failed ? moe_error_set(err, MOE_ERR_RUNTIME, "rank %d, %s: %s", who, op, why) : MOE_OK;
}

static enum moe_status local_alltoallv(struct exec_transport *t, const void *send,
                                       const int *send_count, void *recv, const int *recv_count,
                                       size_t item_bytes, struct moe_error *err)
{
    struct exec_local_hub *h = t->impl;
    int me = t->rank;
    enum moe_status st = h->mem.ready(h->mem.ctx, world_rank(h, me), err);
    if (st != MOE_OK) return st;
    h->send[me] = send;
    h->send_count[me] = send_count;
    h->item_bytes[me] = item_bytes;
    if ((st = hub_meet(h, me, "alltoallv (post)", err)) != MOE_OK) return st;
    size_t at = 0;
    bool match = true;
    enum moe_status cst = MOE_OK;
    for (int s = 0; s < h->ranks; s++) {
        const int *sc = h->send_count[s];
        size_t off = 0;
        for (int d = 0; d < me; d++) off += (size_t)sc[d];
        match &= sc[me] == recv_count[s] && h->item_bytes[s] == item_bytes;
        if (match && sc[me] && cst == MOE_OK)
            cst = h->mem.copy(h->mem.ctx, world_rank(h, me), (char *)recv + at * item_bytes,
                              (const char *)h->send[s] + off * item_bytes,
                              (size_t)sc[me] * item_bytes, err);
        at += (size_t)recv_count[s];
    }
    st = hub_meet(h, me, "alltoallv (copy)", err);
    if (st != MOE_OK) return st;
    if (cst != MOE_OK) return cst;
    if (!match)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "rank %d, alltoallv: receive counts or item sizes disagree with the "
                             "senders'",
                             world_rank(h, me));
    return MOE_OK;
}

static enum moe_status local_counts(struct exec_transport *t, const int *send, int *recv,
                                    struct moe_error *err)
{
    struct exec_local_hub *h = t->impl;
    int me = t->rank;
    h->send_count[me] = send;
    enum moe_status st = hub_meet(h, me, "count exchange (post)", err);
    if (st != MOE_OK) return st;
    for (int s = 0; s < h->ranks; s++) recv[s] = h->send_count[s][me];
    return hub_meet(h, me, "count exchange (read)", err);
}

/* Every rank sums all ranks' buffers in rank order, so the sums agree bit for bit. */
static enum moe_status local_allreduce(struct exec_transport *t, void *x, size_t n, bool f32,
                                       struct moe_error *err)
{
    struct exec_local_hub *h = t->impl;
    int me = t->rank;
    size_t esz = f32 ? sizeof(float) : sizeof(double);
    enum moe_status st = h->mem.ready(h->mem.ctx, world_rank(h, me), err);
    if (st != MOE_OK) return st;
    int wr = world_rank(h, me);
    void *sum = h->mem.alloc(h->mem.ctx, wr, esz * n);
    const void **srcs = malloc(sizeof *srcs * (size_t)h->ranks);
    h->send[me] = x;
    h->item_bytes[me] = esz * n;
    if ((st = hub_meet(h, me, "all-reduce (post)", err)) != MOE_OK) goto done;
    bool match = sum && srcs;
    for (int s = 0; s < h->ranks; s++) {
        match &= h->item_bytes[s] == esz * n;
        if (srcs) srcs[s] = h->send[s];
    }
    enum moe_status sst = MOE_OK;
    if (match)
        sst =
            f32 ? h->mem.sum_f32(h->mem.ctx, wr, sum, (const float *const *)srcs, h->ranks, n, err)
                : h->mem.sum(h->mem.ctx, wr, sum, (const double *const *)srcs, h->ranks, n, err);
    if ((st = hub_meet(h, me, "all-reduce (sum)", err)) != MOE_OK) goto done;
    if ((st = sst) != MOE_OK) goto done;
    if (!match) {
        st = moe_error_set(err, sum && srcs ? MOE_ERR_RUNTIME : MOE_ERR_NOMEM,
                           "rank %d, all-reduce: %s", wr,
                           sum && srcs ? "the ranks' lengths disagree" : "out of memory");
        goto done;
    }
    st = h->mem.copy(h->mem.ctx, wr, x, sum, esz * n, err);
done:
    if (sum) h->mem.free(h->mem.ctx, wr, sum);
    free(srcs);
    return st;
}

static enum moe_status local_allreduce_sum(struct exec_transport *t, double *x, size_t n,
                                           struct moe_error *err)
{
    return local_allreduce(t, x, n, false, err);
}

static enum moe_status local_allreduce_sum_f32(struct exec_transport *t, float *x, size_t n,
                                               struct moe_error *err)
{
    return local_allreduce(t, x, n, true, err);
}

/* Every rank copies the others' parts out of their posted buffers. */
static enum moe_status local_allgather_f32(struct exec_transport *t, float *x, size_t n,
                                           struct moe_error *err)
{
    struct exec_local_hub *h = t->impl;
    int me = t->rank, wr = world_rank(h, me);
    enum moe_status st = h->mem.ready(h->mem.ctx, wr, err);
    if (st != MOE_OK) return st;
    h->send[me] = x;
    h->item_bytes[me] = n;
    if ((st = hub_meet(h, me, "all-gather (post)", err)) != MOE_OK) return st;
    enum moe_status cst = MOE_OK;
    bool match = true;
    for (int s = 0; s < h->ranks; s++) match &= h->item_bytes[s] == n;
    for (int s = 0; s < h->ranks && match && cst == MOE_OK && n; s++)
        if (s != me)
            cst = h->mem.copy(h->mem.ctx, wr, x + (size_t)s * n,
                              (const float *)h->send[s] + (size_t)s * n, sizeof *x * n, err);
    if ((st = hub_meet(h, me, "all-gather (copy)", err)) != MOE_OK) return st;
    if (cst != MOE_OK) return cst;
    if (!match)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "rank %d, all-gather: the ranks' lengths "
                             "disagree",
                             wr);
    return MOE_OK;
}

/* No asynchrony here: the all-reduce runs at once (the memory's `ready` waits for the rank's
 * queued work), and there is nothing left to wait for. */
static enum moe_status local_allreduce_f32_start(struct exec_transport *t, float *x, size_t n,
                                                 void *stream, struct moe_error *err)
{
    (void)stream;
    return local_allreduce(t, x, n, true, err);
}

static enum moe_status local_wait(struct exec_transport *t, struct moe_error *err)
{
    (void)t, (void)err;
    return MOE_OK;
}

static enum moe_status local_split(struct exec_transport *t, int color, struct exec_transport *out,
                                   struct moe_error *err);
static void local_release(struct exec_transport *t);

static const struct exec_transport_ops local_ops = {
    local_counts,        local_alltoallv,           local_allreduce_sum, local_allreduce_sum_f32,
    local_allgather_f32, local_allreduce_f32_start, local_wait,          local_split,
    local_release};

/* Two meetings: every rank posts its color; the lowest rank of each color makes the group's hub
 * (a failure there fails the second meeting for all); then each takes its group's hub. */
static enum moe_status local_split(struct exec_transport *t, int color, struct exec_transport *out,
                                   struct moe_error *err)
{
    struct exec_local_hub *h = t->impl;
    int me = t->rank;
    h->send[me] = &color;
    enum moe_status st = hub_meet(h, me, "split (post)", err);
    if (st != MOE_OK) return st;
    int n = 0, leader = -1, mine = -1;
    for (int s = 0; s < h->ranks; s++)
        if (*(const int *)h->send[s] == color) {
            if (leader < 0) leader = s;
            if (s == me) mine = n;
            n++;
        }
    if (leader == me) {
        struct exec_local_hub *c = NULL;
        if (exec_local_hub_create(&c, n, h->timeout_s, NULL) == MOE_OK &&
            (c->world = malloc(sizeof *c->world * (size_t)n))) {
            for (int s = 0, i = 0; s < h->ranks; s++)
                if (*(const int *)h->send[s] == color) c->world[i++] = world_rank(h, s);
            c->mem = h->mem;
            c->parent = h;
            c->refs = n;
        } else {
            exec_local_hub_destroy(c);
            c = NULL;
            pthread_mutex_lock(&h->mu);
            hub_fail_locked(h, "split: out of memory");
            pthread_mutex_unlock(&h->mu);
        }
        h->child[me] = c;
    }
    if ((st = hub_meet(h, me, "split (make)", err)) != MOE_OK) return st;
    *out = (struct exec_transport){mine, n, &local_ops, h->child[leader]};
    return MOE_OK;
}

static void local_release(struct exec_transport *t)
{
    struct exec_local_hub *c = t->impl;
    if (!c || !c->parent) return;
    pthread_mutex_lock(&c->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last) exec_local_hub_destroy(c);
    t->impl = NULL;
}

struct run_arg {
    struct exec_local_hub *h;
    int rank;
    enum moe_status (*fn)(struct exec_transport *t, void *arg, struct moe_error *err);
    void *arg;
    enum moe_status st;
    struct moe_error err;
};

static void *run_rank(void *p)
{
    struct run_arg *a = p;
    struct exec_transport *t = &a->h->t[a->rank];
    a->st = a->fn(t, a->arg, &a->err);
    if (a->st != MOE_OK) {
        /* the others' collectives fail from here on, instead of waiting for this rank */
        char why[MOE_MSG_MAX];
        snprintf(why, sizeof why, "rank %d failed: %.900s", a->rank, a->err.message);
        pthread_mutex_lock(&a->h->mu);
        hub_fail_locked(a->h, why);
        pthread_mutex_unlock(&a->h->mu);
    }
    return NULL;
}

enum moe_status exec_local_run(struct exec_local_hub *h,
                               enum moe_status (*fn)(struct exec_transport *t, void *arg,
                                                     struct moe_error *err),
                               void *arg, struct moe_error *err)
{
    int R = h->ranks;
    struct run_arg *a = calloc((size_t)R, sizeof *a);
    pthread_t *th = calloc((size_t)R, sizeof *th);
    bool *started = calloc((size_t)R, sizeof *started);
    if (!a || !th || !started) {
        free(a), free(th), free(started);
        return moe_error_set(err, MOE_ERR_NOMEM, "local transport: out of memory");
    }
    h->failed = false;
    h->arrived = 0;
    memset(h->here, 0, sizeof *h->here * (size_t)R);
    for (int r = 0; r < R; r++) h->t[r] = (struct exec_transport){r, R, &local_ops, h};
    enum moe_status st = MOE_OK;
    for (int r = 0; r < R; r++) {
        a[r] = (struct run_arg){h, r, fn, arg, MOE_OK, {0}};
        a[r].err.status = MOE_OK;
        if (pthread_create(&th[r], NULL, run_rank, &a[r]) != 0) {
            pthread_mutex_lock(&h->mu);
            hub_fail_locked(h, "a rank's thread could not start");
            pthread_mutex_unlock(&h->mu);
            st = moe_error_set(err, MOE_ERR_RUNTIME, "local transport: rank %d: no thread", r);
            break;
        }
        started[r] = true;
    }
    for (int r = 0; r < R; r++)
        if (started[r]) pthread_join(th[r], NULL);
    for (int r = 0; r < R && st == MOE_OK; r++)
        if (a[r].st != MOE_OK) {
            st = a[r].st;
            if (err) *err = a[r].err;
        }
    free(a), free(th), free(started);
    return st;
}
