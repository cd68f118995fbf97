/*
 * test_gpu_device.c: the executor sees the GPUs of this machine and the libraries it links.
 * Exits 77 (skipped) where there is no GPU.
 */
#include "../unit/moe_test.h"

#include "exec.h"

static void test_devices(void **state)
{
    (void)state;
    int n = 0;
    struct moe_error err;
    assert_int_equal(exec_device_count(&n, &err), MOE_OK);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        struct exec_device_info d;
        assert_int_equal(exec_device_query(i, &d, &err), MOE_OK);
        assert_true(d.sm_count > 0);
        assert_true(d.cc_major >= 7);
        assert_true(d.memory_bytes > 1e9);
        assert_true(d.memory_bandwidth_bytes_per_s > 1e11);
        assert_true(strlen(d.name) > 0);
        printf("GPU %d: %s, cc %d.%d, %d SMs, %.1f GB, %.0f GB/s, %s\n", i, d.name, d.cc_major,
               d.cc_minor, d.sm_count, d.memory_bytes / 1e9, d.memory_bandwidth_bytes_per_s / 1e9,
               d.pci_bus_id);
    }
    assert_int_equal(exec_device_query(n, &(struct exec_device_info){0}, &err), MOE_ERR_CUDA);
    assert_non_null(strstr(err.message, "cudaGetDeviceProperties"));
}

static void test_versions(void **state)
{
    (void)state;
    struct exec_versions v;
    exec_versions_get(&v);
    assert_true(v.cuda_runtime >= 12000);
    assert_true(v.cuda_driver >= v.cuda_runtime / 1000 * 1000); /* a driver new enough */
    assert_true(v.cublas_major >= 12);
    /* Same NCCL major.minor as the headers: only API both have is used. */
    assert_int_equal(v.nccl_runtime / 100, v.nccl_compiled / 100);
}

int main(void)
{
    int n = 0;
    if (exec_device_count(&n, NULL) != MOE_OK || n == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_devices),
                                       cmocka_unit_test(test_versions)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
