/*
 * fp8probe: what cuBLASLt's fp8 matmul takes on this GPU, apart from moeplan's code.
 *
 * Build (on the machine with nvcc): nvcc -O2 -arch=sm_90 -o fp8probe fp8probe.cu -lcublasLt -lcublas
 * Run: ./fp8probe            (CUBLASLT_LOG_MASK=13 ./fp8probe adds cuBLASLt's errors, hints, info)
 * Which row counts block scaling takes: FP8PROBE_MSWEEP=1 ./fp8probe (M 296..328).
 * Self-test, no GPU needed: FP8PROBE_EMULATE=3,2 ./fp8probe runs part 2 with the host playing
 * a cuBLASLt that reads layouts B3/V3 for A and V2 for B; the probe must name those.
 *
 * Part 1, per-tensor scales: the GEMM moeplan's gk_fp8_gemm calls (row-major y = x w^T, cuBLASLt
 * column-major: A = w transposed, B = x, TN) in the variants that could explain last session's
 * "not supported": no scale pointers, a scale pointer 4 bytes off, fp32 out, E5M2 x, fast
 * accumulation, operands 16 bytes off a 256-byte boundary (with and without telling the
 * heuristic), every algorithm the heuristic returns, a created stream. Each result is checked
 * against the product in double.
 *
 * Part 2, block scales: A 128x128 blocks with B 1x128 tiles (the forward and the data gradient)
 * and A and B both 1x128 tiles (the weight gradient), bf16 out, and fp32 out with beta 1; K 640,
 * and K 304 in the weight gradient's shape (its K the tokens, padded to 16, not to 128). The
 * scale arrays are filled with random powers of two in every slot, then the result is compared
 * with the product under each candidate layout of the arrays; the one that matches is the layout
 * cuBLASLt reads. moeplan assumes V1 for tiles (rows innermost, rows padded to 4) and B1 for
 * blocks (row-major, K blocks padded to 4): exec_fp8_factor_at.
 */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static unsigned rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 11);
}

static float fp8_val(unsigned char b, int e5m2)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw(b, e5m2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}
/* an fp8 byte of a finite value of magnitude below 8 (no NaN), and its value */
static unsigned char rnd_fp8(int e5m2)
{
    for (;;) {
        unsigned char b = (unsigned char)rnd();
        float f = fp8_val(b, e5m2);
        if (isfinite(f) && fabsf(f) < 8.0f) return b;
    }
}
static float bf16_val(unsigned short b)
{
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct gemm {
    int M, N, K;
    int ea, eb;         /* E5M2 operands */
    int ha, hb;         /* scale modes: 0 scalar, 1 VEC128, 2 BLK128x128 */
    int scales;         /* set the scale pointers */
    int out32;          /* fp32 out, else bf16 */
    float beta;         /* with fp32 out */
    int fast;           /* fast accumulation */
    size_t off;         /* bytes x, w and y sit past a 256-byte boundary */
    int tell_alignment; /* tell the heuristic the alignment (16 bytes) */
    int all_algos;      /* run every algorithm returned */
    int stream;         /* a created stream, else the legacy default one */
};

/* the device buffers */
static unsigned char *dx, *dw;
static void *dy;
static float *dsa, *dsb; /* scale arrays (each its own allocation, 256-byte aligned) */
static void *dws;
static const size_t WS = 32u << 20;
static const size_t HALF = 1u << 20; /* each buffer: two copies, 1 MiB apart (each fits in one) */
static cublasLtHandle_t lt;

static cublasLtMatmulMatrixScale_t mode(int h)
{
    return h == 1   ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
           : h == 2 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                    : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

/* Runs g; y copied back as float into out (M x N row-major). Returns how many algorithms ran
 * (the status of the last in *last), -1 when the heuristic found none. */
static int run(const struct gemm *g, const float *sa_host, size_t na, const float *sb_host,
               size_t nb, float *out, cublasStatus_t *last, cublasStatus_t *heur, int *found_out)
{
    int M = g->M, N = g->N, K = g->K;
    CK(cudaMemcpy(dsa, sa_host, na * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsb, sb_host, nb * 4, cudaMemcpyHostToDevice));
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (g->ha) {
        cublasLtMatmulMatrixScale_t m = mode(g->ha);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &m, sizeof m);
    }
    if (g->hb) {
        cublasLtMatmulMatrixScale_t m = mode(g->hb);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &m, sizeof m);
    }
    if (g->fast) {
        int8_t f = 1;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof f);
    }
    const float *pa = dsa, *pb = dsb;
    if (g->scales == 2) pb = dsb + 1; /* 4 bytes off */
    if (g->scales) {
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb);
    }
    cudaDataType yt = g->out32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayoutCreate(&a, g->ea ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, K, N, K);
    cublasLtMatrixLayoutCreate(&b, g->eb ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, K, M, K);
    cublasLtMatrixLayoutCreate(&c, yt, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = WS;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    if (g->tell_alignment) {
        uint32_t al = 16;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                             sizeof al);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                             sizeof al);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                             sizeof al);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                             sizeof al);
    }
    cublasLtMatmulHeuristicResult_t h[16];
    int found = 0;
    *heur = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 16, h, &found);
    *found_out = found;
    int ran = -1;
    /* an offset copy sits in the buffers' second half, apart from the first (they overlapped in
     * the run of 2026-12-05, which corrupted the unshifted variants of part 1) */
    size_t sx = g->off ? HALF + g->off : 0;
    unsigned char *x = dx + sx, *w = dw + sx;
    char *y = (char *)dy + sx;
    size_t ybytes = (size_t)M * N * (g->out32 ? 4 : 2);
    if (g->out32 && g->beta != 0.0f) { /* y = 1 before: beta y adds beta */
        float *ones = (float *)malloc(ybytes);
        for (size_t i = 0; i < (size_t)M * N; i++) ones[i] = 1.0f;
        CK(cudaMemcpy(y, ones, ybytes, cudaMemcpyHostToDevice));
        free(ones);
    } else {
        CK(cudaMemset(y, 0, ybytes));
    }
    cudaStream_t s = 0;
    if (g->stream) CK(cudaStreamCreate(&s));
    if (*heur == CUBLAS_STATUS_SUCCESS && found > 0) {
        int n = g->all_algos ? found : 1, ok = 0;
        float one = 1.0f, beta = g->beta;
        for (int i = 0; i < n; i++) {
            *last =
                cublasLtMatmul(lt, op, &one, w, a, x, b, &beta, y, c, y, c, &h[i].algo, dws, WS, s);
            cudaError_t ce = cudaStreamSynchronize(s);
            if (ce != cudaSuccess) printf("    algorithm %d: CUDA %s\n", i, cudaGetErrorString(ce));
            if (*last == CUBLAS_STATUS_SUCCESS) ok++;
            if (g->all_algos)
                printf("    algorithm %d of %d: %s (workspace %zu)\n", i, n,
                       cublasGetStatusString(*last), h[i].workspaceSize);
        }
        ran = g->all_algos ? ok : 1;
    }
    if (g->stream) cudaStreamDestroy(s);
    if (out) {
        void *hy = malloc(ybytes);
        CK(cudaMemcpy(hy, y, ybytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)M * N; i++)
            out[i] = g->out32 ? ((float *)hy)[i] : bf16_val(((unsigned short *)hy)[i]);
        free(hy);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    return ran;
}

static int r4(int n)
{
    return (n + 3) / 4 * 4;
}

/* The slot of row r's K block kb in a tile (1 x 128) scale array of `rows` rows, nkb K blocks */
static size_t vec_at(int hyp, int rows, int nkb, int r, int kb)
{
    switch (hyp) {
    case 1: return (size_t)kb * r4(rows) + r; /* rows innermost, padded to 4 (moeplan) */
    case 2: return (size_t)kb * rows + r;     /* rows innermost, not padded */
    case 3: return (size_t)r * nkb + kb;      /* K innermost */
    default: return (size_t)r * r4(nkb) + kb; /* K innermost, padded to 4 */
    }
}
/* The slot of row block rb's K block kb in a 128 x 128 block scale array */
static size_t blk_at(int hyp, int nrb, int nkb, int rb, int kb)
{
    switch (hyp) {
    case 1: return (size_t)rb * r4(nkb) + kb; /* row-major, K blocks padded to 4 (moeplan) */
    case 2: return (size_t)rb * nkb + kb;     /* row-major */
    case 3: return (size_t)kb * r4(nrb) + rb; /* column-major, padded */
    default: return (size_t)kb * nrb + rb;    /* column-major */
    }
}

static const int KB = 128;
static int emulate[2]; /* FP8PROBE_EMULATE=a,b: part 2 only, on the host, layouts A a and B b */

/* Part 2: one block-scaled GEMM; the result against every pair of layout hypotheses */
static void block_case(int M, int N, int K, int ha, int out32, float beta, const float *xv,
                       const float *wv)
{
    int nkb = (K + KB - 1) / KB, nnb = (N + KB - 1) / KB;
    size_t cap = 8192;
    float *sa = (float *)malloc(cap * 4), *sb = (float *)malloc(cap * 4);
    static const float pow2[5] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f};
    for (size_t i = 0; i < cap; i++) sa[i] = pow2[rnd() % 5], sb[i] = pow2[rnd() % 5];
    /* partial products of each K block, in double */
    double *P = (double *)calloc((size_t)M * N * nkb, sizeof(double));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                P[((size_t)m * N + n) * nkb + k / KB] +=
                    (double)xv[(size_t)m * K + k] * wv[(size_t)n * K + k];
    struct gemm g = {M, N, K, 0, 0, ha, 1, 1, out32, beta, 0, 0, 0, 0, 0};
    float *y = (float *)malloc((size_t)M * N * 4);
    cublasStatus_t last = CUBLAS_STATUS_SUCCESS, heur;
    int found;
    int ran;
    if (emulate[0]) { /* the self-test: y from the host, as if cuBLASLt read layouts emulate */
        heur = CUBLAS_STATUS_SUCCESS, found = 1, ran = 1;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = beta;
                for (int kb = 0; kb < nkb; kb++)
                    acc += (ha == 2 ? sa[blk_at(emulate[0], nnb, nkb, n / KB, kb)]
                                    : sa[vec_at(emulate[0], N, nkb, n, kb)]) *
                           (double)sb[vec_at(emulate[1], M, nkb, m, kb)] *
                           P[((size_t)m * N + n) * nkb + kb];
                y[(size_t)m * N + n] = (float)acc;
            }
    } else {
        ran = run(&g, sa, cap, sb, cap, y, &last, &heur, &found);
    }
    printf("A %s, B 1x128 tiles, %d x %d x %d, out %s%s: heuristic %s (%d found), matmul %s\n",
           ha == 2 ? "128x128 blocks" : "1x128 tiles", M, N, K, out32 ? "fp32" : "bf16",
           beta != 0.0f ? " beta 1" : "", cublasGetStatusString(heur), found,
           ran > 0 ? cublasGetStatusString(last) : "not run");
    if (ran > 0 && last == CUBLAS_STATUS_SUCCESS) {
        double best = 1e300;
        int bha = 0, bhb = 0;
        for (int hA = 1; hA <= 4; hA++)
            for (int hB = 1; hB <= 4; hB++) {
                double worst = 0, big = 0;
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        double acc = 0;
                        for (int kb = 0; kb < nkb; kb++) {
                            double fa = ha == 2 ? sa[blk_at(hA, nnb, nkb, n / KB, kb)]
                                                : sa[vec_at(hA, N, nkb, n, kb)];
                            double fb = sb[vec_at(hB, M, nkb, m, kb)];
                            acc += fa * fb * P[((size_t)m * N + n) * nkb + kb];
                        }
                        acc += beta;
                        big = fmax(big, fabs(acc));
                        worst = fmax(worst, fabs(acc - y[(size_t)m * N + n]));
                    }
                double rel = worst / (big > 0 ? big : 1);
                if (hA == 1 && hB == 1)
                    printf("    moeplan's layouts (A %s1, B V1): %.3g\n", ha == 2 ? "B" : "V", rel);
                if (rel < best) best = rel, bha = hA, bhb = hB;
            }
        printf("    closest: A %s%d, B V%d, worst error %.3g of the largest |y|%s\n",
               ha == 2 ? "B" : "V", bha, bhb, best,
               bha == 1 && bhb == 1 ? " (moeplan's)" : "  <-- NOT moeplan's layout");
    }
    free(sa), free(sb), free(P), free(y);
}

static void part2(void);

int main(void)
{
    const char *em = getenv("FP8PROBE_EMULATE");
    if (em && sscanf(em, "%d,%d", &emulate[0], &emulate[1]) == 2) {
        printf("self-test: part 2 on the host, as if cuBLASLt read A%d and B V%d\n", emulate[0],
               emulate[1]);
        part2();
        return 0;
    }
    int dev = 0, rt = 0, drv = 0;
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    cudaRuntimeGetVersion(&rt), cudaDriverGetVersion(&drv);
    printf("GPU %s (sm_%d%d), driver %d, runtime %d; cuBLASLt loaded %zu, headers %d\n", p.name,
           p.major, p.minor, drv, rt, cublasLtGetVersion(), CUBLAS_VERSION);
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return printf("cublasLtCreate failed\n"), 1;
    CK(cudaMalloc((void **)&dx, 2 * HALF));
    CK(cudaMalloc((void **)&dw, 2 * HALF));
    CK(cudaMalloc(&dy, 2 * HALF));
    CK(cudaMalloc((void **)&dsa, 8192 * 4));
    CK(cudaMalloc((void **)&dsb, 8192 * 4));
    CK(cudaMalloc(&dws, WS));
    if (getenv("FP8PROBE_MSWEEP")) { /* which row counts block scaling takes (N 384, K 640) */
        static float ones[8192];
        for (int i = 0; i < 8192; i++) ones[i] = 1.0f;
        for (int M = 296; M <= 328; M++)
            for (int ha = 1; ha <= 2; ha++) {
                struct gemm g = {M, 384, 640, 0, 0, ha, 1, 1, 0, 0, 0, 0, 0, 0, 0};
                cublasStatus_t last = CUBLAS_STATUS_SUCCESS, heur;
                int found, ran = run(&g, ones, 8192, ones, 8192, NULL, &last, &heur, &found);
                printf("M %d, A %s: heuristic %d found, matmul %s\n", M,
                       ha == 2 ? "blocks" : "tiles", found,
                       ran > 0 ? cublasGetStatusString(last) : "not run");
            }
        return 0;
    }

    /* ---- part 1: per-tensor scales, M 256, N 384, K 512 ---- */
    int M = 256, N = 384, K = 512;
    for (int e5 = 0; e5 < 2; e5++) {
        /* x in E4M3 (and E5M2 for the variant that asks), w in E4M3 */
        unsigned char *hx = (unsigned char *)malloc((size_t)M * K),
                      *hw = (unsigned char *)malloc((size_t)N * K);
        for (size_t i = 0; i < (size_t)M * K; i++) hx[i] = rnd_fp8(e5);
        for (size_t i = 0; i < (size_t)N * K; i++) hw[i] = rnd_fp8(0);
        for (int off = 0; off <= 16; off += 16) {
            size_t at = off ? HALF + off : 0;
            CK(cudaMemcpy(dx + at, hx, (size_t)M * K, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dw + at, hw, (size_t)N * K, cudaMemcpyHostToDevice));
        }
        double *ref = (double *)malloc(sizeof(double) * M * N), big = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += (double)fp8_val(hx[(size_t)m * K + k], e5) *
                           fp8_val(hw[(size_t)n * K + k], 0);
                ref[(size_t)m * N + n] = acc;
                big = fmax(big, fabs(acc));
            }
        struct {
            const char *name;
            struct gemm g;
        } v[] = {
            {"scales 0.5 and 4 (product 2), bf16 out", {M, N, K, 0, e5, 0, 0, 1, 0, 0, 0, 0, 0}},
            {"no scale pointers (product 1)", {M, N, K, 0, e5, 0, 0, 0, 0, 0, 0, 0, 0}},
            {"B's scale pointer 4 bytes off", {M, N, K, 0, e5, 0, 0, 2, 0, 0, 0, 0, 0}},
            {"fp32 out", {M, N, K, 0, e5, 0, 0, 1, 1, 0, 0, 0, 0}},
            {"fp32 out, beta 1 (y = 1 before)", {M, N, K, 0, e5, 0, 0, 1, 1, 1.0f, 0, 0, 0}},
            {"fast accumulation", {M, N, K, 0, e5, 0, 0, 1, 0, 0, 1, 0, 0}},
            {"x, w, y 16 bytes past 256", {M, N, K, 0, e5, 0, 0, 1, 0, 0, 0, 16, 0}},
            {"x, w, y 16 bytes past 256, heuristic told 16",
             {M, N, K, 0, e5, 0, 0, 1, 0, 0, 0, 16, 1}},
            {"a created stream", {M, N, K, 0, e5, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1}},
            {"every algorithm the heuristic returns", {M, N, K, 0, e5, 0, 0, 1, 0, 0, 0, 0, 0, 1}},
        };
        float *y = (float *)malloc(sizeof(float) * M * N);
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            if (e5 && i > 0) break; /* E5M2 x: the first variant only */
            float sa[4] = {0.5f, 0.5f, 0.5f, 0.5f}, sb[4] = {4.0f, 4.0f, 4.0f, 4.0f};
            cublasStatus_t last = CUBLAS_STATUS_SUCCESS, heur;
            int found;
            int ran = run(&v[i].g, sa, 4, sb, 4, y, &last, &heur, &found);
            double f = v[i].g.scales == 1 ? 2.0 : v[i].g.scales == 2 ? 2.0 : 1.0, worst = 0;
            for (size_t j = 0; j < (size_t)M * N; j++)
                worst = fmax(worst, fabs(f * ref[j] + v[i].g.beta - y[j]));
            printf("per-tensor, x %s, %-48s heuristic %s (%d), matmul %s", e5 ? "E5M2" : "E4M3",
                   v[i].name, cublasGetStatusString(heur), found,
                   ran < 0 ? "not run" : cublasGetStatusString(last));
            if (v[i].g.all_algos) printf(" (%d of %d ran)", ran, found);
            if (ran > 0 && last == CUBLAS_STATUS_SUCCESS)
                printf(", worst error %.3g of %.3g", worst, f * big);
            printf("\n");
        }
        free(y), free(ref), free(hx), free(hw);
    }

    part2();
    cublasLtDestroy(lt);
    return 0;
}

/* ---- part 2: block scales ---- */

/* Random E4M3 x (M x K) and w (N x K) on the device; then the block cases asked: `all`, the
 * three (A blocks; A tiles in bf16; A tiles in fp32 with beta 1), else the last alone */
static void shape(int M, int N, int K, bool all)
{
    float *xv = (float *)malloc(sizeof(float) * M * K),
          *wv = (float *)malloc(sizeof(float) * N * K);
    unsigned char *hx = (unsigned char *)malloc((size_t)M * K),
                  *hw = (unsigned char *)malloc((size_t)N * K);
    for (size_t i = 0; i < (size_t)M * K; i++) hx[i] = rnd_fp8(0), xv[i] = fp8_val(hx[i], 0);
    for (size_t i = 0; i < (size_t)N * K; i++) hw[i] = rnd_fp8(0), wv[i] = fp8_val(hw[i], 0);
    if (!emulate[0]) {
        CK(cudaMemcpy(dx, hx, (size_t)M * K, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw, (size_t)N * K, cudaMemcpyHostToDevice));
    }
    if (all) {
        block_case(M, N, K, 2, 0, 0.0f, xv, wv);
        block_case(M, N, K, 1, 0, 0.0f, xv, wv);
    }
    block_case(M, N, K, 1, 1, 1.0f, xv, wv);
    free(xv), free(wv), free(hx), free(hw);
}

static void part2(void)
{
    shape(256, 384, 640, true);
    shape(301, 384, 640, true);
    /* the weight gradient's shape: K the tokens, padded to 16 only (304: not a multiple of 128) */
    shape(384, 256, 304, false);
}
