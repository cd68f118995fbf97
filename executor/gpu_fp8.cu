/*
 * gpu_fp8.cu: FP8 quantization on the GPU, as ref_fp8.c does it bit for bit: the amax of a tensor,
 * a 1 x 128 tile or a 128 x 128 block, the scale fp8_max / amax (1 where amax is 0 or not
 * finite), and each value times it converted with rounding to nearest even, saturating
 * (__NV_SATFINITE). The amax is a maximum: exact in any order, so the kernels are deterministic.
 */
#include "gpu_kernels.h"

#include <cuda_fp8.h>
#include <stdio.h>

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

__global__ void k_fp8_inverse(const float *a, const float *b, float *inv)
{
    if (threadIdx.x == 0) inv[0] = 1.0f / a[0], inv[1] = 1.0f / b[0];
}

#define LT(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            snprintf(why, cap, "%s: %s", #call, cublasGetStatusString(st_));                       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

bool gk_fp8_gemm(cublasLtHandle_t lt, const unsigned char *x, const float *sx, int x_e5m2,
                 const unsigned char *w, const float *sw, int M, int N, int K, float *y32,
                 bf16 *y16, float *inv, void *ws, size_t ws_bytes, cudaStream_t s, char *why,
                 size_t cap)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    bool ok = false;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int8_t fast = 0; /* accumulate in full fp32 (Hopper's fp8 products promoted, not kept in its
                      * narrower accumulator) */
    float one = 1.0f, zero = 0.0f;
    float *inv_w = inv, *inv_x = inv + 1;
    cudaDataType yt = y32 ? CUDA_R_32F : CUDA_R_16BF;
    void *y = y32 ? (void *)y32 : (void *)y16;
    k_fp8_inverse<<<1, 32, 0, s>>>(sw, sx, inv);
    if (cudaGetLastError() != cudaSuccess) {
        snprintf(why, cap, "fp8 GEMM: the scales' inverse did not launch");
        return false;
    }
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &inv_w,
                                      sizeof inv_w));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &inv_x,
                                      sizeof inv_x));
    /* row-major y (M x N) = x (M x K) w (N x K)^T: column-major y^T = w^T' x^T, K leading */
    LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, K, N, K));
    LT(cublasLtMatrixLayoutCreate(&b, x_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, K, M, K));
    LT(cublasLtMatrixLayoutCreate(&c, yt, N, M, N));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    LT(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &h, &found));
    if (!found) {
        snprintf(why, cap, "fp8 GEMM %d x %d x %d: cuBLASLt has no algorithm", M, N, K);
        goto done;
    }
    LT(cublasLtMatmul(lt, op, &one, w, a, x, b, &zero, y, c, y, c, &h.algo, ws, ws_bytes, s));
    ok = true;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
    return ok;
}
