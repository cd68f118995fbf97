/*
 * test_gpu_nccl.c: the NCCL transport with one rank (the GPU machine has one GPU): counts, an
 * all-to-all-v and an all-reduce to itself, exactly. More ranks need more GPUs (issue 11).
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

int main(void)
{
    int n = 0;
    struct moe_error err;
    if (exec_device_count(&n, &err) != MOE_OK || n == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_rank)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
