/*
 * gpu_local.cu: the local transport's memory on one GPU: R virtual ranks (threads) whose
 * buffers are device memory, each rank's work on its own stream. This is how the distributed
 * executor's EP, DP and PP paths are tested on the one-GPU machine (NCCL refuses two ranks on
 * one GPU). A copy is a device-to-device cudaMemcpyAsync on the receiving rank's stream, waited
 * for before the meeting that lets the sender reuse its buffer; the all-reduce's sum is a kernel
 * that adds the R buffers in rank order, so every rank gets the same bits.
 */
#include "exec_gpu.h"

#include <cuda_runtime.h>

#define GL_MAX_RANKS 64

template <typename T> struct gl_srcs_t {
    const T *p[GL_MAX_RANKS];
};

template <typename T> __global__ void k_sum_ranks(T *dst, gl_srcs_t<T> src, int ranks, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    T a = 0;
    for (int s = 0; s < ranks; s++) a += src.p[s][i];
    dst[i] = a;
}

static cudaStream_t gl_stream(void *ctx, int rank)
{
    return ((cudaStream_t *)ctx)[rank];
}

static enum moe_status gl_check(cudaError_t e, int rank, const char *what, struct moe_error *err)
{
    if (e == cudaSuccess) return MOE_OK;
    return moe_error_set(err, MOE_ERR_CUDA, "local GPU transport, rank %d: %s: %s", rank, what,
                         cudaGetErrorString(e));
}

static void *gl_alloc(void *ctx, int rank, size_t bytes)
{
    (void)ctx, (void)rank;
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 16) == cudaSuccess ? p : NULL;
}

static void gl_free(void *ctx, int rank, void *p)
{
    (void)ctx, (void)rank;
    cudaFree(p);
}

static enum moe_status gl_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes,
                               struct moe_error *err)
{
    cudaStream_t s = gl_stream(ctx, rank);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return gl_check(e, rank, "copy", err);
}

template <typename T>
static enum moe_status gl_sum_t(void *ctx, int rank, T *dst, const T *const *src, int ranks,
                                size_t n, struct moe_error *err)
{
    if (ranks > GL_MAX_RANKS)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "local GPU transport: %d ranks (at most %d)",
                             ranks, GL_MAX_RANKS);
    gl_srcs_t<T> p;
    for (int s = 0; s < ranks; s++) p.p[s] = src[s];
    cudaStream_t s = gl_stream(ctx, rank);
    if (n) k_sum_ranks<T><<<(unsigned)((n + 255) / 256), 256, 0, s>>>(dst, p, ranks, n);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return gl_check(e, rank, "sum", err);
}

static enum moe_status gl_sum(void *ctx, int rank, double *dst, const double *const *src, int ranks,
                              size_t n, struct moe_error *err)
{
    return gl_sum_t(ctx, rank, dst, src, ranks, n, err);
}

static enum moe_status gl_sum_f32(void *ctx, int rank, float *dst, const float *const *src,
                                  int ranks, size_t n, struct moe_error *err)
{
    return gl_sum_t(ctx, rank, dst, src, ranks, n, err);
}

static enum moe_status gl_ready(void *ctx, int rank, struct moe_error *err)
{
    return gl_check(cudaStreamSynchronize(gl_stream(ctx, rank)), rank, "stream", err);
}

void exec_local_gpu_memory(struct exec_local_mem *mem, void **streams)
{
    mem->alloc = gl_alloc;
    mem->free = gl_free;
    mem->copy = gl_copy;
    mem->sum = gl_sum;
    mem->sum_f32 = gl_sum_f32;
    mem->ready = gl_ready;
    mem->ctx = streams;
}
