/*
 * test_gpu_transport.c: the transports on the GPU, exactly:
 *   - NCCL with one rank (the GPU machine has one GPU): counts, an all-to-all-v and an all-reduce
 *     to itself (more ranks need more GPUs: issue 11);
 *   - the local transport with 4 virtual ranks on one GPU (device buffers, a stream each): an
 *     all-to-all-v of uneven counts and an all-reduce, against the same moves done on the host.
 * Exits 77 (skipped) where there is no GPU.
 */
#include "../unit/moe_test.h"

#include "exec.h"

#include <cuda_runtime_api.h>

static void test_one_rank(void **state)
{
    (void)state;
    unsigned char id[EXEC_NCCL_ID_BYTES];
    struct moe_error err;
    struct exec_nccl *c;
    struct exec_transport t;
    if (exec_nccl_unique_id(id, &err) != MOE_OK) fail_msg("%s", err.message);
    if (exec_nccl_create(&c, id, 0, 1, 0, 30.0, &err) != MOE_OK) fail_msg("%s", err.message);
    exec_nccl_transport(c, &t);
    int send[1] = {5}, recv[1] = {-1};
    assert_int_equal(t.ops->counts(&t, send, recv, &err), MOE_OK);
    assert_int_equal(recv[0], 5);
    double host[5] = {1.5, -2, 3.25, 1e-300, 7}, back[5] = {0};
    double *a, *b;
    assert_int_equal(cudaMalloc((void **)&a, sizeof host), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&b, sizeof host), cudaSuccess);
    assert_int_equal(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(t.ops->alltoallv(&t, a, send, b, recv, sizeof(double), &err), MOE_OK);
    assert_int_equal(cudaMemcpy(back, b, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(back, host, sizeof host);
    assert_int_equal(t.ops->allreduce_sum(&t, b, 5, &err), MOE_OK);
    assert_int_equal(cudaMemcpy(back, b, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(back, host, sizeof host);
    printf("NCCL transport, 1 rank: counts, alltoallv and all-reduce exact\n");
    cudaFree(a), cudaFree(b);
    exec_nccl_destroy(c);
}

/* Rank r sends (r + d) % 3 + 1 items to rank d; item k of rank r to d holds 1000 r + 10 d + k. */
#define VR 4
struct vr_run {
    void *streams[VR];
    double got[VR][64];
    double sums[VR][5];
};

static int vr_count(int from, int to)
{
    return (from + to) % 3 + 1;
}

static enum moe_status vr_rank(struct exec_transport *t, void *arg, struct moe_error *err)
{
    struct vr_run *a = arg;
    int me = t->rank, send[VR], recv[VR], ns = 0, nr = 0;
    cudaSetDevice(0);
    cudaStream_t s = (cudaStream_t)a->streams[me];
    double host[64], x[5];
    for (int d = 0; d < VR; d++) {
        send[d] = vr_count(me, d);
        for (int k = 0; k < send[d]; k++) host[ns++] = 1000.0 * me + 10.0 * d + k;
    }
    enum moe_status st = t->ops->counts(t, send, recv, err);
    if (st != MOE_OK) return st;
    for (int q = 0; q < VR; q++) nr += recv[q];
    double *dsend, *drecv, *dx;
    if (cudaMalloc((void **)&dsend, sizeof host) || cudaMalloc((void **)&drecv, sizeof host) ||
        cudaMalloc((void **)&dx, sizeof x))
        return moe_error_set(err, MOE_ERR_CUDA, "cudaMalloc");
    cudaMemcpyAsync(dsend, host, sizeof(double) * (size_t)ns, cudaMemcpyHostToDevice, s);
    for (int i = 0; i < 5; i++) x[i] = 0.5 * me + i;
    cudaMemcpyAsync(dx, x, sizeof x, cudaMemcpyHostToDevice, s);
    st = t->ops->alltoallv(t, dsend, send, drecv, recv, sizeof(double), err);
    if (st == MOE_OK) st = t->ops->allreduce_sum(t, dx, 5, err);
    cudaMemcpy(a->got[me], drecv, sizeof(double) * (size_t)nr, cudaMemcpyDeviceToHost);
    cudaMemcpy(a->sums[me], dx, sizeof x, cudaMemcpyDeviceToHost);
    cudaFree(dsend), cudaFree(drecv), cudaFree(dx);
    return st;
}

static void test_virtual_ranks(void **state)
{
    (void)state;
    struct vr_run a;
    memset(&a, 0, sizeof a);
    for (int r = 0; r < VR; r++)
        assert_int_equal(
            cudaStreamCreateWithFlags((cudaStream_t *)&a.streams[r], cudaStreamNonBlocking),
            cudaSuccess);
    struct exec_local_hub *hub;
    struct moe_error err;
    struct exec_local_mem mem;
    assert_int_equal(exec_local_hub_create(&hub, VR, 30.0, &err), MOE_OK);
    exec_local_gpu_memory(&mem, a.streams);
    exec_local_hub_set_memory(hub, &mem);
    if (exec_local_run(hub, vr_rank, &a, &err) != MOE_OK) fail_msg("%s", err.message);
    exec_local_hub_destroy(hub);
    for (int me = 0; me < VR; me++) {
        int at = 0;
        for (int src = 0; src < VR; src++)
            for (int k = 0; k < vr_count(src, me); k++)
                assert_true(a.got[me][at++] == 1000.0 * src + 10.0 * me + k);
        for (int i = 0; i < 5; i++) {
            double want = 0.0;
            for (int r = 0; r < VR; r++) want += 0.5 * r + i;
            assert_true(a.sums[me][i] == want);
        }
    }
    for (int r = 0; r < VR; r++) cudaStreamDestroy((cudaStream_t)a.streams[r]);
    printf("local transport, %d virtual ranks on one GPU: all-to-all-v and all-reduce exact\n", VR);
}

int main(void)
{
    int n = 0;
    struct moe_error err;
    if (exec_device_count(&n, &err) != MOE_OK || n == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_rank),
                                       cmocka_unit_test(test_virtual_ranks)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
