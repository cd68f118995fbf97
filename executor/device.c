/*
 * device.c: what the CUDA runtime, cuBLAS, NCCL and cuDNN of this machine are, and which GPUs it
 * has.
 *
 * The GPU machine's libnccl (2.28.3) is older than our headers (2.28.9): the runtime version is
 * what counts for which NCCL calls are safe, so both are reported.
 */
#include "exec_gpu.h"

#include <string.h>

#include <cublas_api.h>
#include <cuda_runtime.h>
#include <library_types.h>
#include <nccl.h>
#ifdef MOEPLAN_HAVE_CUDNN
#include <cudnn.h>
#endif

void exec_versions_get(struct exec_versions *v)
{
    memset(v, 0, sizeof *v);
    /* Every query checked: a failure leaves its 0, which --version prints as not found. */
    if (cudaRuntimeGetVersion(&v->cuda_runtime) != cudaSuccess) v->cuda_runtime = 0;
    if (cudaDriverGetVersion(&v->cuda_driver) != cudaSuccess) v->cuda_driver = 0;
    v->cuda_compiled = CUDART_VERSION;
    if (cublasGetProperty(MAJOR_VERSION, &v->cublas_major) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(MINOR_VERSION, &v->cublas_minor) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(PATCH_LEVEL, &v->cublas_patch) != CUBLAS_STATUS_SUCCESS)
        v->cublas_major = v->cublas_minor = v->cublas_patch = 0;
    if (ncclGetVersion(&v->nccl_runtime) != ncclSuccess) v->nccl_runtime = 0;
    v->nccl_compiled = NCCL_VERSION_CODE;
#ifdef MOEPLAN_HAVE_CUDNN
    v->cudnn_runtime = (int)cudnnGetVersion();
    v->cudnn_compiled = CUDNN_VERSION;
#endif
}

enum moe_status exec_device_count(int *count, struct moe_error *err)
{
    (void)err;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
        cudaGetLastError(); /* clear the sticky error: "no GPU" is an answer, not a failure */
        n = 0;
    } else if (rc != cudaSuccess) {
        return moe_error_set(err, MOE_ERR_CUDA, "cudaGetDeviceCount failed: %s",
                             cudaGetErrorString(rc));
    }
    *count = n;
    return MOE_OK;
}

enum moe_status exec_device_query(int index, struct exec_device_info *info, struct moe_error *err)
{
    enum moe_status st = MOE_OK;
    struct cudaDeviceProp p;
    int clock_khz = 0, bus_bits = 0;
    MOE_CUDA_GOTO(cudaGetDeviceProperties(&p, index), st, cleanup);
    MOE_CUDA_GOTO(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index), st,
                  cleanup);
    MOE_CUDA_GOTO(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index), st,
                  cleanup);
    memset(info, 0, sizeof *info);
    info->index = index;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->memory_bytes = (double)p.totalGlobalMem;
    /* DDR: two transfers per clock. */
    info->memory_bandwidth_bytes_per_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
    MOE_CUDA_GOTO(cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id, index), st,
                  cleanup);
cleanup:
    return st;
}
