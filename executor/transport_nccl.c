/*
 * transport_nccl.c: the NCCL transport: the same collectives as the local transport, on real
 * ranks (threads of one process, MPI or Slurm processes), buffers in the rank's GPU memory.
 *
 * NCCL has no all-to-all-v: it is a group of ncclSend / ncclRecv, one pair per peer with items
 * to move (a rank sends to itself too). Counts travel the same way through a small device
 * buffer. Every operation is enqueued on the transport's stream and then waited for with a
 * deadline, watching NCCL's asynchronous error: a peer that died, a failed link or a deadline
 * passing aborts the communicator (ncclCommAbort) and returns an error naming the rank and the
 * operation, so a broken job ends with a message instead of hanging. Only NCCL API present in
 * 2.28.3 (the GPU machine's library) is used.
 */
#include "exec_dist.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == EXEC_NCCL_ID_BYTES, "NCCL's unique id size");

struct exec_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, ranks, device;
    double timeout_s;
    int *dcounts;      /* device: 2 x ranks ints for the count exchange */
    cudaEvent_t after; /* the caller's work a started all-reduce waits for (one, reused) */
};

static enum moe_status nccl_fail(struct exec_nccl *c, const char *op, const char *what,
                                 struct moe_error *err)
{
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    return moe_error_set(err, MOE_ERR_NCCL, "rank %d of %d, %s: %s; the communicator was aborted",
                         c->rank, c->ranks, op, what);
}

/* Until the stream has finished the operation, NCCL reports an error, or the deadline passes. */
static enum moe_status nccl_wait(struct exec_nccl *c, const char *op, struct moe_error *err)
{
    double t0 = moe_time_now_s();
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return MOE_OK;
        if (e != cudaErrorNotReady) return nccl_fail(c, op, cudaGetErrorString(e), err);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &async) != ncclSuccess ||
            (async != ncclSuccess && async != ncclInProgress))
            return nccl_fail(c, op, ncclGetErrorString(async), err);
        if (moe_time_now_s() - t0 > c->timeout_s) {
            char what[128];
            snprintf(what, sizeof what, "not complete after %g s (a peer gone or stuck)",
                     c->timeout_s);
            return nccl_fail(c, op, what, err);
        }
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

static enum moe_status aborted(const struct exec_nccl *c, const char *op, struct moe_error *err)
{
    return moe_error_set(err, MOE_ERR_RUNTIME, "rank %d, %s: the communicator was aborted before",
                         c->rank, op);
}

/* An NCCL call's result: in progress is fine (non-blocking communicators); any error aborts the
 * communicator and names the rank and the operation. Used as MOE_CHECK(nccl_result(...)). */
static enum moe_status nccl_result(struct exec_nccl *c, const char *op, ncclResult_t r,
                                   struct moe_error *err)
{
    if (r == ncclSuccess || r == ncclInProgress) return MOE_OK;
    return nccl_fail(c, op, ncclGetErrorString(r), err);
}

static enum moe_status nccl_alltoallv(struct exec_transport *t, const void *send,
                                      const int *send_count, void *recv, const int *recv_count,
                                      size_t item_bytes, struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    const char *op = "alltoallv";
    if (!c->comm) return aborted(c, op, err);
    size_t so = 0, ro = 0;
    MOE_CHECK(nccl_result(c, op, ncclGroupStart(), err));
    for (int p = 0; p < c->ranks; p++) {
        if (send_count[p])
            MOE_CHECK(nccl_result(c, op,
                                  ncclSend((const char *)send + so * item_bytes,
                                           (size_t)send_count[p] * item_bytes, ncclUint8, p,
                                           c->comm, c->stream),
                                  err));
        if (recv_count[p])
            MOE_CHECK(nccl_result(c, op,
                                  ncclRecv((char *)recv + ro * item_bytes,
                                           (size_t)recv_count[p] * item_bytes, ncclUint8, p,
                                           c->comm, c->stream),
                                  err));
        so += (size_t)send_count[p];
        ro += (size_t)recv_count[p];
    }
    MOE_CHECK(nccl_result(c, op, ncclGroupEnd(), err));
    return nccl_wait(c, op, err);
}

/* Counts are host arrays for every transport: through the device buffer and back. */
static enum moe_status nccl_counts(struct exec_transport *t, const int *send, int *recv,
                                   struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    const char *op = "count exchange";
    if (!c->comm) return aborted(c, op, err);
    int R = c->ranks;
    if (cudaMemcpyAsync(c->dcounts, send, sizeof(int) * (size_t)R, cudaMemcpyHostToDevice,
                        c->stream) != cudaSuccess)
        return nccl_fail(c, op, "cudaMemcpyAsync", err);
    MOE_CHECK(nccl_result(c, op, ncclGroupStart(), err));
    for (int p = 0; p < R; p++) {
        MOE_CHECK(
            nccl_result(c, op, ncclSend(c->dcounts + p, 1, ncclInt32, p, c->comm, c->stream), err));
        MOE_CHECK(nccl_result(
            c, op, ncclRecv(c->dcounts + R + p, 1, ncclInt32, p, c->comm, c->stream), err));
    }
    MOE_CHECK(nccl_result(c, op, ncclGroupEnd(), err));
    if (cudaMemcpyAsync(recv, c->dcounts + R, sizeof(int) * (size_t)R, cudaMemcpyDeviceToHost,
                        c->stream) != cudaSuccess)
        return nccl_fail(c, op, "cudaMemcpyAsync", err);
    return nccl_wait(c, op, err);
}

static enum moe_status nccl_allreduce(struct exec_transport *t, void *x, size_t n,
                                      ncclDataType_t type, struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    const char *op = "all-reduce";
    if (!c->comm) return aborted(c, op, err);
    if (n)
        MOE_CHECK(
            nccl_result(c, op, ncclAllReduce(x, x, n, type, ncclSum, c->comm, c->stream), err));
    return nccl_wait(c, op, err);
}

static enum moe_status nccl_allreduce_sum(struct exec_transport *t, double *x, size_t n,
                                          struct moe_error *err)
{
    return nccl_allreduce(t, x, n, ncclFloat64, err);
}

static enum moe_status nccl_allreduce_sum_f32(struct exec_transport *t, float *x, size_t n,
                                              struct moe_error *err)
{
    return nccl_allreduce(t, x, n, ncclFloat32, err);
}

static enum moe_status nccl_allgather_f32(struct exec_transport *t, float *x, size_t n,
                                          struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    const char *op = "all-gather";
    if (!c->comm) return aborted(c, op, err);
    if (n)
        MOE_CHECK(nccl_result(
            c, op, ncclAllGather(x + (size_t)c->rank * n, x, n, ncclFloat32, c->comm, c->stream),
            err));
    return nccl_wait(c, op, err);
}

/* After the caller's queued work (an event on its stream), on the transport's stream. */
static enum moe_status nccl_allreduce_f32_start(struct exec_transport *t, float *x, size_t n,
                                                void *stream, struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    const char *op = "all-reduce (bucket)";
    if (!c->comm) return aborted(c, op, err);
    cudaError_t e = cudaEventRecord(c->after, (cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream, c->after, 0);
    if (e != cudaSuccess) return nccl_fail(c, op, cudaGetErrorString(e), err);
    if (n)
        MOE_CHECK(nccl_result(
            c, op, ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c->comm, c->stream), err));
    return MOE_OK;
}

static enum moe_status nccl_wait_all(struct exec_transport *t, struct moe_error *err)
{
    struct exec_nccl *c = t->impl;
    if (!c->comm) return aborted(c, "all-reduce (buckets)", err);
    return nccl_wait(c, "all-reduce (buckets)", err);
}

static enum moe_status nccl_split(struct exec_transport *t, int color, struct exec_transport *out,
                                  struct moe_error *err);

static void nccl_release(struct exec_transport *t)
{
    exec_nccl_destroy(t->impl);
    t->impl = NULL;
}

static const struct exec_transport_ops nccl_ops = {
    nccl_counts,        nccl_alltoallv,           nccl_allreduce_sum, nccl_allreduce_sum_f32,
    nccl_allgather_f32, nccl_allreduce_f32_start, nccl_wait_all,      nccl_split,
    nccl_release};

/* A communicator, its stream and count buffer on the parent's GPU; comm set by the caller. */
static enum moe_status nccl_alloc(struct exec_nccl **out, int rank, int ranks, int device,
                                  double timeout_s, struct moe_error *err)
{
    *out = NULL;
    struct exec_nccl *c = calloc(1, sizeof *c);
    if (!c) return moe_error_set(err, MOE_ERR_NOMEM, "NCCL transport: out of memory");
    c->rank = rank;
    c->ranks = ranks;
    c->device = device;
    c->timeout_s = timeout_s;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->dcounts, sizeof(int) * 2 * (size_t)ranks);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->after, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        exec_nccl_destroy(c);
        return moe_error_set(err, MOE_ERR_CUDA, "NCCL transport, rank %d, GPU %d: %s", rank, device,
                             cudaGetErrorString(e));
    }
    *out = c;
    return MOE_OK;
}

/* ncclCommSplit, keyed by the parent's rank (the group keeps the parent's order). */
static enum moe_status nccl_split(struct exec_transport *t, int color, struct exec_transport *out,
                                  struct moe_error *err)
{
    struct exec_nccl *c = t->impl, *n = NULL;
    const char *op = "split";
    if (!c->comm) return aborted(c, op, err);
    ncclComm_t comm = NULL;
    MOE_CHECK(nccl_result(c, op, ncclCommSplit(c->comm, color, c->rank, &comm, NULL), err));
    int rank = 0, ranks = 0;
    if (ncclCommUserRank(comm, &rank) != ncclSuccess ||
        ncclCommCount(comm, &ranks) != ncclSuccess) {
        ncclCommDestroy(comm);
        return nccl_fail(c, op, "the new communicator's rank and size", err);
    }
    enum moe_status st = nccl_alloc(&n, rank, ranks, c->device, c->timeout_s, err);
    if (st != MOE_OK) {
        ncclCommDestroy(comm);
        return st;
    }
    n->comm = comm;
    exec_nccl_transport(n, out);
    return MOE_OK;
}

enum moe_status exec_nccl_unique_id(unsigned char id[EXEC_NCCL_ID_BYTES], struct moe_error *err)
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return moe_error_set(err, MOE_ERR_NCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return MOE_OK;
}

enum moe_status exec_nccl_create(struct exec_nccl **out, const unsigned char id[EXEC_NCCL_ID_BYTES],
                                 int rank, int ranks, int device, double timeout_s,
                                 struct moe_error *err)
{
    *out = NULL;
    if (ranks < 1 || rank < 0 || rank >= ranks || timeout_s <= 0)
        return moe_error_set(err, MOE_ERR_INPUT, "NCCL transport: rank %d of %d, timeout %g s",
                             rank, ranks, timeout_s);
    struct exec_nccl *c;
    enum moe_status st = nccl_alloc(&c, rank, ranks, device, timeout_s, err);
    if (st != MOE_OK) return st;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&c->comm, ranks, u, rank);
    if (r != ncclSuccess) {
        c->comm = NULL;
        exec_nccl_destroy(c);
        return moe_error_set(err, MOE_ERR_NCCL,
                             "NCCL transport: ncclCommInitRank (rank %d of %d, GPU %d): %s", rank,
                             ranks, device, ncclGetErrorString(r));
    }
    *out = c;
    return MOE_OK;
}

void exec_nccl_destroy(struct exec_nccl *c)
{
    if (!c) return;
    if (c->comm) ncclCommDestroy(c->comm);
    if (c->dcounts) cudaFree(c->dcounts);
    if (c->after) cudaEventDestroy(c->after);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

void exec_nccl_transport(struct exec_nccl *c, struct exec_transport *t)
{
    t->rank = c->rank;
    t->ranks = c->ranks;
    t->ops = &nccl_ops;
    t->impl = c;
}
