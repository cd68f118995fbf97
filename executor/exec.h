/*
 * exec.h: the one public header of executor/: running a plan on GPUs.
 *
 * Built only where the CUDA Toolkit is found (MOEPLAN_HAVE_EXECUTOR). The header itself includes
 * no CUDA header, so the CLI and tests stay plain C11; CUDA types stay inside executor/.
 */
#ifndef EXEC_H
#define EXEC_H

#include "moe_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Versions as integers the way each library reports them (CUDA 13000 = 13.0, NCCL 22803 = 2.28.3). */
struct exec_versions {
    int cuda_runtime;      /* cudaRuntimeGetVersion */
    int cuda_driver;       /* cudaDriverGetVersion; 0: no driver on this machine */
    int cuda_compiled;     /* CUDART_VERSION of the headers */
    int cublas_major, cublas_minor, cublas_patch;
    int nccl_runtime;      /* ncclGetVersion */
    int nccl_compiled;     /* NCCL_VERSION_CODE of the headers */
};

void exec_versions_get(struct exec_versions *v);

struct exec_device_info {
    int index;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    double memory_bytes;
    double memory_bandwidth_bytes_per_s; /* from the memory clock and bus width */
    char pci_bus_id[32];
};

/* Number of CUDA devices; 0 (and MOE_OK) where there is no GPU or no driver. */
enum moe_status exec_device_count(int *count, struct moe_error *err);
enum moe_status exec_device_query(int index, struct exec_device_info *info, struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* EXEC_H */
