/*
 * gpu_fp8.cu: FP8 quantization on the GPU, as ref_fp8.c does it bit for bit: the amax of a tensor,
 * a 1 x 128 tile or a 128 x 128 block, the scale fp8_max / amax (1 where amax is 0 or not
 * finite), and each value times it converted with rounding to nearest even, saturating
 * (__NV_SATFINITE). The amax is a maximum: exact in any order, so the kernels are deterministic.
 */
#include "gpu_kernels.h"

#include <cuda_fp8.h>

static __device__ __forceinline__ unsigned char to_fp8(float v, int e5m2)
{
    return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

static __device__ __forceinline__ float scale_of(float amax, int e5m2)
{
    if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
    float s = (e5m2 ? 57344.0f : 448.0f) / amax;
    return isinf(s) ? 1.0f : s;
}

/* |x| as ordered bits: a NaN sorts above every number, as the reference keeps it */
static __device__ __forceinline__ unsigned abs_bits(float x)
{
    return __float_as_uint(x) & 0x7FFFFFFFu;
}

/* The block's largest abs_bits; all threads get it. `red`: an unsigned a warp. */
static __device__ __forceinline__ unsigned block_max(unsigned v, unsigned *red)
{
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    unsigned m = 0;
    for (int i = 0; i < nw; i++) m = max(m, red[i]);
    return m;
}

template <typename X> static __device__ __forceinline__ float val(const X *x, size_t i)
{
    return (float)x[i];
}

/* The whole tensor's amax (as bits) into *amax, zeroed before. */
template <typename X> __global__ void k_fp8_amax(const X *x, size_t n, unsigned *amax)
{
    __shared__ unsigned red[TPB / 32];
    unsigned m = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        m = max(m, abs_bits(val(x, i)));
    m = block_max(m, red);
    if (threadIdx.x == 0) atomicMax(amax, m);
}

template <typename X>
__global__ void k_fp8_quantize_tensor(const X *x, size_t n, const unsigned *amax, int e5m2,
                                      unsigned char *q, float *scale)
{
    float s = scale_of(__uint_as_float(*amax), e5m2);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        q[i] = to_fp8(val(x, i) * s, e5m2);
}

/* One block a tile of bh x 128 (bh 1 or 128) of a rows x cols array. */
template <typename X>
__global__ void k_fp8_quantize_tiles(const X *x, int rows, int cols, int bh, int e5m2,
                                     unsigned char *q, float *scales)
{
    __shared__ unsigned red[TPB / 32];
    int nbc = (cols + 127) / 128, bi = blockIdx.x / nbc, bj = blockIdx.x % nbc;
    int r0 = bi * bh, c0 = bj * 128;
    int h = min(bh, rows - r0), w = min(128, cols - c0), n = h * w;
    unsigned m = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        m = max(m, abs_bits(val(x, (size_t)(r0 + i / w) * cols + c0 + i % w)));
    float s = scale_of(__uint_as_float(block_max(m, red)), e5m2);
    if (threadIdx.x == 0) scales[blockIdx.x] = s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        size_t at = (size_t)(r0 + i / w) * cols + c0 + i % w;
        q[at] = to_fp8(val(x, at) * s, e5m2);
    }
}

template <typename X>
static cudaError_t quantize(const X *x, int rows, int cols, int how, int e5m2, unsigned char *q,
                            float *scales, unsigned *work, cudaStream_t s)
{
    size_t n = (size_t)rows * cols;
    if (!n) return cudaGetLastError();
    if (how == 0) {
        cudaError_t e = cudaMemsetAsync(work, 0, sizeof(unsigned), s);
        if (e != cudaSuccess) return e;
        unsigned g = blocks_for(n, TPB) < 1024 ? blocks_for(n, TPB) : 1024;
        k_fp8_amax<X><<<g, TPB, 0, s>>>(x, n, work);
        k_fp8_quantize_tensor<X><<<g, TPB, 0, s>>>(x, n, work, e5m2, q, scales);
    } else {
        int bh = how == 1 ? 1 : 128;
        unsigned g = (unsigned)((rows + bh - 1) / bh) * (unsigned)((cols + 127) / 128);
        k_fp8_quantize_tiles<X>
            <<<g, how == 1 ? 128 : TPB, 0, s>>>(x, rows, cols, bh, e5m2, q, scales);
    }
    return cudaGetLastError();
}

cudaError_t gk_fp8_quantize(const float *x32, const bf16 *x16, int rows, int cols, int how,
                            int e5m2, unsigned char *q, float *scales, unsigned *work,
                            cudaStream_t s)
{
    return x32 ? quantize(x32, rows, cols, how, e5m2, q, scales, work, s)
               : quantize(x16, rows, cols, how, e5m2, q, scales, work, s);
}
