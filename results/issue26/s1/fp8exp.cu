#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
int main()
{
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    int M = 256, N = 384, K = 512;
    void *x, *w, *y, *ws;
    float *sc;
    cudaMalloc(&x, M * K);
    cudaMalloc(&w, N * K);
    cudaMalloc(&y, M * N * 4);
    cudaMalloc(&ws, 32 << 20);
    cudaMalloc(&sc, 32);
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    cudaMemcpy(sc, ones, 32, cudaMemcpyHostToDevice);
    size_t wsb = 32 << 20;
    printf("cublasLt version %zu, cudart %d\n", cublasLtGetVersion(), CUDART_VERSION);
    for (int variant = 0; variant < 7; variant++) {
        cublasLtMatmulDesc_t op;
        cublasLtMatrixLayout_t a, b, c;
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        float *pa = sc, *pb = variant == 6 ? sc + 4 : sc + 1; /* 6: both 16-byte aligned */
        if (variant != 1) {
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa,
                                           sizeof pa);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb,
                                           sizeof pb);
        }
        cudaDataType yt = variant == 3 ? CUDA_R_32F : CUDA_R_16BF;
        cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, K, N, K);
        cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, K, M, K);
        cublasLtMatrixLayoutCreate(&c, yt, N, M, N);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                             sizeof wsb);
        cublasLtMatmulHeuristicResult_t h[8];
        int found = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 8, h, &found);
        float one = 1, zero = 0;
        cudaStream_t s = 0;
        if (variant == 4) cudaStreamCreate(&s);
        int tried = variant == 5 ? found : (found ? 1 : 0);
        for (int i = 0; i < tried; i++) {
            cublasStatus_t st =
                cublasLtMatmul(lt, op, &one, w, a, x, b, &zero, y, c, y, c, &h[i].algo, ws, wsb, s);
            cudaError_t ce = cudaDeviceSynchronize();
            printf("variant %d: heuristic %d found %d state %d ws %zu; algo %d: matmul %d (%s), "
                   "cuda %s\n",
                   variant, hs, found, h[i].state, h[i].workspaceSize, i, st,
                   cublasGetStatusString(st), cudaGetErrorString(ce));
        }
        if (!tried) printf("variant %d: heuristic %d found %d\n", variant, hs, found);
    }
    return 0;
}
