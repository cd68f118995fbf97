/*
 * test_ref_ops.c: the reference's RMSNorm, RoPE, attention and cross-entropy against finite
 * differences (double precision; 1e-6 relative + 1e-9 absolute), plus exact cases by hand.
 */
#include "exec.h" /* before moe_test.h: its model helper needs mdl.h */

#include "moe_test.h"

#include <math.h>

enum { T = 5, H = 4, KV = 2, DQK = 6, DV = 4, HID = 7, VOCAB = 9 };

static void fill(double *v, int n, uint64_t seed)
{
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) v[i] = moe_rng_normal(&rng);
}

/* --- RMSNorm --- */
static double rms_loss(const double *x, const double *w, const double *dy)
{
    double y[T * HID], l = 0;
    exec_ref_rmsnorm(x, w, T, HID, 1e-6, y);
    for (int i = 0; i < T * HID; i++) l += dy[i] * y[i];
    return l;
}

static void test_rmsnorm(void **state)
{
    (void)state;
    double x[T * HID], w[HID], dy[T * HID], dx[T * HID], dw[HID] = {0}, nx[T * HID], nw[HID];
    fill(x, T * HID, 1);
    fill(w, HID, 2);
    fill(dy, T * HID, 3);
    exec_ref_rmsnorm_backward(x, w, dy, T, HID, 1e-6, dx, dw);
    const double e = 1e-6;
    for (int i = 0; i < T * HID; i++) {
        double k = x[i];
        x[i] = k + e;
        double a = rms_loss(x, w, dy);
        x[i] = k - e;
        double b = rms_loss(x, w, dy);
        x[i] = k;
        nx[i] = (a - b) / (2 * e);
    }
    for (int i = 0; i < HID; i++) {
        double k = w[i];
        w[i] = k + e;
        double a = rms_loss(x, w, dy);
        w[i] = k - e;
        double b = rms_loss(x, w, dy);
        w[i] = k;
        nw[i] = (a - b) / (2 * e);
    }
    moe_expect_near("rmsnorm dx", dx, nx, (size_t)(T * HID), 1e-6, 1e-9);
    moe_expect_near("rmsnorm dw", dw, nw, (size_t)(HID), 1e-6, 1e-9);
    /* by hand: x = (3, 4), w = 1, eps 0: rms = sqrt(12.5) */
    double x2[2] = {3, 4}, w2[2] = {1, 1}, y2[2];
    exec_ref_rmsnorm(x2, w2, 1, 2, 0.0, y2);
    assert_true(fabs(y2[0] - 3 / sqrt(12.5)) < 1e-15 && fabs(y2[1] - 4 / sqrt(12.5)) < 1e-15);
}

static void test_rope(void **state)
{
    (void)state;
    double x[T * H * DQK], back[T * H * DQK];
    int pos[T] = {0, 1, 2, 7, 100};
    fill(x, T * H * DQK, 4);
    memcpy(back, x, sizeof x);
    double fr[2] = {1.0, 0.01}; /* theta 10000 over 4 dims */
    exec_ref_rope(back, T, H, DQK, 4, fr, 1.0, pos, false);
    /* position 0 is the identity; the last two dims (not rotated) are untouched */
    for (int i = 0; i < H * DQK; i++) assert_true(back[i] == x[i]);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 4; d < DQK; d++)
                assert_true(back[(t * H + h) * DQK + d] == x[(t * H + h) * DQK + d]);
    /* rotations keep norms; the inverse (the backward) undoes them */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double a = 0, b = 0;
            for (int d = 0; d < 4; d++) {
                a += x[(t * H + h) * DQK + d] * x[(t * H + h) * DQK + d];
                b += back[(t * H + h) * DQK + d] * back[(t * H + h) * DQK + d];
            }
            assert_true(fabs(a - b) < 1e-12);
        }
    exec_ref_rope(back, T, H, DQK, 4, fr, 1.0, pos, true);
    for (int i = 0; i < T * H * DQK; i++) assert_true(fabs(back[i] - x[i]) < 1e-12);
    /* by hand: one pair, position 1, theta irrelevant for i = 0: rotate (1, 0) by 1 radian */
    double v[2] = {1, 0};
    int p1 = 1;
    exec_ref_rope(v, 1, 1, 2, 2, fr, 1.0, &p1, false);
    assert_true(fabs(v[0] - cos(1.0)) < 1e-15 && fabs(v[1] - sin(1.0)) < 1e-15);
    /* a scale multiplies; the transpose then gives scale^2 x the identity */
    double w[2] = {1, 0};
    exec_ref_rope(w, 1, 1, 2, 2, fr, 1.5, &p1, false);
    assert_true(fabs(w[0] - 1.5 * cos(1.0)) < 1e-15 && fabs(w[1] - 1.5 * sin(1.0)) < 1e-15);
    exec_ref_rope(w, 1, 1, 2, 2, fr, 1.5, &p1, true);
    assert_true(fabs(w[0] - 2.25) < 1e-14 && fabs(w[1]) < 1e-14);
}

/* --- attention --- */
static double attn_loss(const double *q, const double *k, const double *v, const double *dout,
                        int window, const double *sink)
{
    double out[T * H * DV], l = 0;
    exec_ref_attention(q, k, v, T, H, KV, DQK, DV, window, 0.4, sink, out);
    for (int i = 0; i < T * H * DV; i++) l += dout[i] * out[i];
    return l;
}

static void numeric(double *p, int n, double *grad, const double *q, const double *k,
                    const double *v, const double *dout, int window, const double *sink)
{
    const double e = 1e-6;
    for (int i = 0; i < n; i++) {
        double keep = p[i];
        p[i] = keep + e;
        double a = attn_loss(q, k, v, dout, window, sink);
        p[i] = keep - e;
        double b = attn_loss(q, k, v, dout, window, sink);
        p[i] = keep;
        grad[i] = (a - b) / (2 * e);
    }
}

static void test_attention(void **state)
{
    (void)state;
    for (int c = 0; c < 4; c++) { /* no window / a window of 2, without and with sinks */
        int window = c % 2 ? 2 : 0;
        double q[T * H * DQK], k[T * KV * DQK], v[T * KV * DV], dout[T * H * DV], sk[H];
        double dq[T * H * DQK], dk[T * KV * DQK], dv[T * KV * DV], ds[H] = {0};
        double nq[T * H * DQK], nk[T * KV * DQK], nv[T * KV * DV], ns[H];
        fill(q, T * H * DQK, 5);
        fill(k, T * KV * DQK, 6);
        fill(v, T * KV * DV, 7);
        fill(dout, T * H * DV, 8);
        fill(sk, H, 9);
        const double *sink = c >= 2 ? sk : NULL;
        exec_ref_attention_backward(q, k, v, dout, T, H, KV, DQK, DV, window, 0.4, sink, dq, dk, dv,
                                    c >= 2 ? ds : NULL);
        numeric(q, T * H * DQK, nq, q, k, v, dout, window, sink);
        numeric(k, T * KV * DQK, nk, q, k, v, dout, window, sink);
        numeric(v, T * KV * DV, nv, q, k, v, dout, window, sink);
        moe_expect_near("attention dq", dq, nq, (size_t)(T * H * DQK), 1e-6, 1e-9);
        moe_expect_near("attention dk", dk, nk, (size_t)(T * KV * DQK), 1e-6, 1e-9);
        moe_expect_near("attention dv", dv, nv, (size_t)(T * KV * DV), 1e-6, 1e-9);
        if (sink) {
            numeric(sk, H, ns, q, k, v, dout, window, sink);
            moe_expect_near("attention dsink", ds, ns, (size_t)H, 1e-6, 1e-9);
        }
    }
    /* Causality by hand: token 0 sees only itself, so its output is v[0] of its kv head. */
    double q[T * H * DQK], k[T * KV * DQK], v[T * KV * DV], out[T * H * DV];
    fill(q, T * H * DQK, 9);
    fill(k, T * KV * DQK, 10);
    fill(v, T * KV * DV, 11);
    exec_ref_attention(q, k, v, T, H, KV, DQK, DV, 0, 0.4, NULL, out);
    for (int h = 0; h < H; h++)
        for (int d = 0; d < DV; d++)
            assert_true(fabs(out[h * DV + d] - v[(h / (H / KV)) * DV + d]) < 1e-15);
    /* A window of 1: every token sees only itself. */
    exec_ref_attention(q, k, v, T, H, KV, DQK, DV, 1, 0.4, NULL, out);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < DV; d++)
                assert_true(fabs(out[(t * H + h) * DV + d] - v[(t * KV + h / 2) * DV + d]) < 1e-15);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    double z[T * VOCAB], dz[T * VOCAB], nz[T * VOCAB];
    int tgt[T] = {0, 3, 8, 3, 5};
    fill(z, T * VOCAB, 12);
    exec_ref_cross_entropy(z, tgt, T, VOCAB, dz);
    const double e = 1e-6;
    for (int i = 0; i < T * VOCAB; i++) {
        double keep = z[i];
        z[i] = keep + e;
        double a = exec_ref_cross_entropy(z, tgt, T, VOCAB, NULL);
        z[i] = keep - e;
        double b = exec_ref_cross_entropy(z, tgt, T, VOCAB, NULL);
        z[i] = keep;
        nz[i] = (a - b) / (2 * e);
    }
    moe_expect_near("cross-entropy dlogits", dz, nz, (size_t)(T * VOCAB), 1e-6, 1e-9);
    /* uniform logits: log(vocab) */
    double u[VOCAB] = {0};
    int t0 = 4;
    assert_true(fabs(exec_ref_cross_entropy(u, &t0, 1, VOCAB, NULL) - log(VOCAB)) < 1e-15);
}

/* The comparison every test uses fails on a poisoned element: a NaN or an infinity in one place
 * of a kernel's output. The helpers it replaced (`worst = fmax(worst, err); if (worst > tol)`
 * and `if (err > tol) fail`) let a NaN through: fmax drops it and the comparison is false. */
static void test_check_catches_nan(void **state)
{
    (void)state;
    double x[T * HID], w[HID], y[T * HID], ref[T * HID];
    fill(x, T * HID, 1);
    fill(w, HID, 2);
    exec_ref_rmsnorm(x, w, T, HID, 1e-6, ref);
    const double poison[] = {NAN, INFINITY, -INFINITY, 1.0};
    for (int p = 0; p < 4; p++) {
        memcpy(y, ref, sizeof y);
        y[T * HID / 3] += p == 3 ? 1.0 : 0.0; /* the last: a plain wrong value */
        if (p < 3) y[T * HID / 3] = poison[p];
        double worst = 0, mx = moe_max_abs(ref, T * HID);
        for (int i = 0; i < T * HID; i++) worst = fmax(worst, fabs(y[i] - ref[i]));
        bool old_passed = !(worst > 1e-6 * mx) && !(fabs(y[T * HID / 3] - ref[T * HID / 3]) > 1e-6);
        if (p == 0) assert_true(old_passed); /* a NaN went through the old helpers */
        assert_int_equal(moe_count_wrong("poisoned rmsnorm", y, ref, T * HID, 1e-6, 1e-9), 1);
    }
    assert_int_equal(moe_count_wrong("clean rmsnorm", ref, ref, T * HID, 0, 0), 0);
}

/* FP8 conversion (round to nearest even, saturating) at known codes; every code back and forth;
 * the scaling recipes' scales and their counts. */
static void test_fp8(void **state)
{
    (void)state;
    const enum exec_fp8 E4 = EXEC_FP8_E4M3, E5 = EXEC_FP8_E5M2;
    static const struct {
        float x;
        enum exec_fp8 f;
        unsigned code;
    } k[] = {
        {1.0f, EXEC_FP8_E4M3, 0x38},      {-1.0f, EXEC_FP8_E4M3, 0xB8},
        {448.0f, EXEC_FP8_E4M3, 0x7E},    {464.0f, EXEC_FP8_E4M3, 0x7E},  /* saturated */
        {1e9f, EXEC_FP8_E4M3, 0x7E},      {0x1p-9f, EXEC_FP8_E4M3, 0x01}, /* smallest */
        {0x1p-10f, EXEC_FP8_E4M3, 0x00},                                  /* a tie: to even, 0 */
        {0x3p-10f, EXEC_FP8_E4M3, 0x02},  /* a tie: to even, 2 steps */
        {1.0625f, EXEC_FP8_E4M3, 0x38},   /* halfway 1 .. 1.125: even */
        {1.1875f, EXEC_FP8_E4M3, 0x3A},   /* halfway 1.125 .. 1.25: even */
        {0x1.fp-7f, EXEC_FP8_E4M3, 0x08}, /* a subnormal rounding up to the smallest normal */
        {57344.0f, EXEC_FP8_E5M2, 0x7B},  {1e9f, EXEC_FP8_E5M2, 0x7B},
        {1.0f, EXEC_FP8_E5M2, 0x3C},      {0x1p-16f, EXEC_FP8_E5M2, 0x01},
        {-INFINITY, EXEC_FP8_E5M2, 0xFB}, {INFINITY, EXEC_FP8_E4M3, 0x7E},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (exec_fp8_from_float(k[i].x, k[i].f) != k[i].code)
            fail_msg("%a (%s): 0x%02x, expected 0x%02x", (double)k[i].x,
                     k[i].f == E4 ? "e4m3" : "e5m2", exec_fp8_from_float(k[i].x, k[i].f),
                     k[i].code);
    assert_true(isnan(exec_fp8_to_float(exec_fp8_from_float(NAN, E4), E4)));
    assert_true(isnan(exec_fp8_to_float(exec_fp8_from_float(NAN, E5), E5)));
    int codes = 0;
    for (int f = 0; f < 2; f++)
        for (unsigned c = 0; c < 256; c++) {
            float v = exec_fp8_to_float((unsigned char)c, (enum exec_fp8)f);
            if (isnan(v) || isinf(v)) continue;
            assert_int_equal(exec_fp8_from_float(v, (enum exec_fp8)f), c);
            codes++;
        }
    assert_int_equal(codes, 254 + 248); /* E4M3: all but 2 NaNs; E5M2: but 6 NaNs, 2 infinities */
    assert_true(exec_fp8_to_float(0x7E, E4) == 448.0f && exec_fp8_to_float(0x7B, E5) == 57344.0f);
    /* the recipes: 3 x 130 values, one of them large in the first tile of row 1 */
    float x[3 * 130], sc[8];
    unsigned char q[3 * 130];
    for (int i = 0; i < 3 * 130; i++) x[i] = (float)((i % 17) - 8) / 8.0f;
    x[130 + 5] = 100.0f;
    assert_int_equal(exec_fp8_scale_count(3, 130, EXEC_FP8_TENSOR), 1);
    assert_int_equal(exec_fp8_scale_count(3, 130, EXEC_FP8_TILE_1X128), 6);
    assert_int_equal(exec_fp8_scale_count(3, 130, EXEC_FP8_BLOCK_128X128), 2);
    exec_fp8_quantize(x, 3, 130, EXEC_FP8_TENSOR, E4, q, sc);
    assert_true(sc[0] == 448.0f / 100.0f);
    assert_int_equal(q[130 + 5], 0x7E); /* the amax lands on the largest value */
    /* block scaling: the power of two at or below fp8_max / amax (Transformer Engine's
     * Float8BlockScaling): 4.48 -> 4, 448 -> 256, 448 / 0.25 = 1792 -> 1024 */
    exec_fp8_quantize(x, 3, 130, EXEC_FP8_TILE_1X128, E4, q, sc);
    assert_true(sc[2] == 4.0f && sc[0] == 256.0f);
    assert_true(fmaxf(fabsf(x[128]), fabsf(x[129])) == 0.25f && sc[1] == 1024.0f);
    assert_int_equal(q[130 + 5], exec_fp8_from_float(400.0f, E4)); /* 100 x 4: under 448 */
    exec_fp8_quantize(x, 3, 130, EXEC_FP8_BLOCK_128X128, E4, q, sc);
    assert_true(sc[0] == 4.0f);
    for (int k = -3; k <= 3;
         k++) { /* every scale a power of two at most fp8_max / amax, above half */
        float a = ldexpf(1.3f, 3 * k), s4 = exec_fp8_scale(a, E4, EXEC_FP8_TILE_1X128);
        float s5 = exec_fp8_scale(a, E5, EXEC_FP8_BLOCK_128X128);
        assert_true(s4 == ldexpf(1.0f, ilogbf(s4)) && s4 <= 448.0f / a && 2 * s4 > 448.0f / a);
        assert_true(s5 == ldexpf(1.0f, ilogbf(s5)) && s5 <= 57344.0f / a && 2 * s5 > 57344.0f / a);
        assert_true(exec_fp8_scale(a, E4, EXEC_FP8_TENSOR) == 448.0f / a);
    }
    assert_true(exec_fp8_scale(0.0f, E4, EXEC_FP8_TILE_1X128) == 1.0f);
    assert_true(exec_fp8_scale(INFINITY, E4, EXEC_FP8_BLOCK_128X128) == 1.0f);
    assert_true(exec_fp8_scale(0x1p-140f, E4, EXEC_FP8_TILE_1X128) == 1.0f); /* 448 / amax: inf */
    float zero[4] = {0, 0, 0, 0};
    exec_fp8_quantize(zero, 1, 4, EXEC_FP8_TENSOR, E4, q, sc);
    assert_true(sc[0] == 1.0f && q[0] == 0);
}

/* The fp8 linear reference. Exact where the quantization is: each 1 x 128 tile of x and 128 x 128
 * block of w made of E4M3 values of 1/4 and up times a power of two (0 to -2), one of them 448
 * times it (so the scale is the inverse power of two, and a tensor's scale leaves every value
 * normal): y equals the product in double bit for bit, per tensor and blockwise. Otherwise within fp8's rounding: |y - xw| <= 0.15 (E4M3 x) or 0.21 (E5M2 x) of
 * sum |x||w| (two roundings of at most 2^-4 or 2^-3 each). */
/* x w^T (M x N; x M x K, w N x K) in double, and each entry's sum of |x_k w_k| */
static void product(const float *x, const float *w, int M, int N, int K, double *y, double *mag)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0, m = 0;
            for (int k = 0; k < K; k++) {
                acc += (double)x[i * K + k] * w[j * K + k];
                m += fabs((double)x[i * K + k] * w[j * K + k]);
            }
            y[i * N + j] = acc;
            mag[i * N + j] = m;
        }
}

static struct exec_fp8_how fp8_how(enum exec_fp8_scaling s, enum exec_fp8 f)
{
    struct exec_fp8_how h = {s, f};
    return h;
}

static void test_fp8_linear(void **state)
{
    (void)state;
    enum { M = 3, N = 130, K = 200 };
    static float x[M * K], w[N * K];
    static double y[M * N], exact[M * N], bound[M * N];
    struct moe_rng rng;
    moe_rng_seed(&rng, 9);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            int tile = i * 2 + k / 128;
            float e = exec_fp8_to_float((unsigned char)(0x28 + moe_rng_below(&rng, 0x56)), 0);
            x[i * K + k] = ldexpf(k % 128 == 7 ? 448.0f : e, -(tile % 3));
        }
    for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++) {
            int blk = (j / 128) * 2 + k / 128;
            float e = exec_fp8_to_float((unsigned char)(0xA8 + moe_rng_below(&rng, 0x56)), 0);
            w[j * K + k] = ldexpf((j % 128 == 0 && k % 128 == 3) ? 448.0f : e, -(blk % 3) - 4);
        }
    product(x, w, M, N, K, exact, bound);
    for (int b = 0; b < 2; b++) {
        exec_ref_fp8_linear(x, fp8_how(b ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR, EXEC_FP8_E4M3), w,
                            fp8_how(b ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR, EXEC_FP8_E4M3), M,
                            N, K, y);
        for (int i = 0; i < M * N; i++)
            if (y[i] != exact[i])
                fail_msg("%s: y[%d] %.17g, the exact product %.17g", b ? "blockwise" : "tensor", i,
                         y[i], exact[i]);
    }
    /* random values: within the roundings */
    for (int i = 0; i < M * K; i++) x[i] = (float)moe_rng_normal(&rng);
    for (int i = 0; i < N * K; i++) w[i] = (float)(0.02 * moe_rng_normal(&rng));
    product(x, w, M, N, K, exact, bound);
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < 2; b++) {
            exec_ref_fp8_linear(
                x, fp8_how(b ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR, (enum exec_fp8)f), w,
                fp8_how(b ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR, EXEC_FP8_E4M3), M, N, K, y);
            double worst = 0;
            for (int i = 0; i < M * N; i++) worst = fmax(worst, fabs(y[i] - exact[i]) / bound[i]);
            printf("fp8 linear, x %s, %s scaling: worst |error| %.4f of sum |x||w|\n",
                   f ? "e5m2" : "e4m3", b ? "blockwise" : "per-tensor", worst);
            assert_true(worst <= (f ? 0.21 : 0.15));
        }
}

/* What fp8 training quantizes (exec_fp8_layout): tiny-moe-gqa's projections, an expert's slice
 * each (2 layers x (q, k, v, o + 8 experts x gate, up, down) = 56 slices, in parameter order,
 * the experts' marked as such, none of the router, the norms, the embedding or the head), their
 * bytes and factors by recipe, and the scratch that holds any GEMM operand of `rows` rows; a
 * width not a multiple of 16 stays bf16. */
static void test_fp8_layout(void **state)
{
    (void)state;
    struct mdl_model m;
    moe_test_model("tiny-moe-gqa", &m);
    struct exec_ref_model t;
    struct moe_error err;
    assert_int_equal(exec_model_table(&t, &m, &err), MOE_OK);
    for (int b = 0; b < 2; b++) {
        struct exec_fp8_layout l;
        assert_int_equal(exec_fp8_layout(&t, b ? COST_FP8_BLOCK : COST_FP8, 100, false, &l, &err),
                         MOE_OK);
        assert_int_equal(l.n, 2 * (4 + 3 * 8));
        size_t params = 0;
        for (int i = 0; i < l.n; i++) {
            const struct exec_fp8_slice *s = &l.slice[i];
            params += (size_t)s->rows * s->cols;
            assert_true(i == 0 || s->off > l.slice[i - 1].off);
            assert_true(s->layer == (i < l.n / 2 ? 0 : 1));  /* two blocks of equal slices */
            assert_int_equal(s->expert, i % (l.n / 2) >= 4); /* attention's four, then experts' */
            assert_true(s->q % 16 == 0 && s->s % 4 == 0 && s->st % 4 == 0);
        }
        /* q, k, v (64 x 64, 32 x 64, 32 x 64), o (64 x 64); gate, up (32 x 64), down (64 x 32) */
        assert_int_equal(params, 2 * (4096 + 2048 + 2048 + 4096 + 8 * 3 * 2048));
        assert_int_equal(l.qbytes, params);
        assert_int_equal(l.act, b ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR);
        assert_int_equal(l.weight, b ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR);
        /* one factor a slice and its transpose (padded to 4), or a block each way */
        assert_int_equal(l.factors, (size_t)l.n * 2 * 4);
        assert_int_equal(l.scratch_bytes, 112 * 64); /* 100 rows padded to 16 x the widest */
        assert_true(l.scratch_factors >= exec_fp8_factor_count(l.act, 100, 64) &&
                    l.scratch_factors >= exec_fp8_factor_count(l.act, 64, 112));
        /* the SwiGLU backward quantizes, into room for any split of the 100 rows; per-tensor
         * scaling keeps the experts' amax and the weights' */
        assert_true(l.fuse);
        assert_int_equal(l.amax_rows, !b);
        assert_int_equal(l.amax_weights, !b);
        assert_true(l.cast_overlap);
        assert_int_equal(l.pre_bytes, (100 + 15 * 8) * 32);
        int off[9] = {0, 0, 1, 17, 40, 41, 99, 99, 100}; /* an uneven split */
        size_t q[9], s[9], st[9];
        exec_fp8_regions(off, 8, 32, q, s, st);
        assert_true(q[8] <= l.pre_bytes && s[8] <= l.pre_factors && st[8] <= l.pre_factors);
        /* one row: 16 rows of data and factors (the tail GEMM reads 16), 32 columns of one
         * transposed tile */
        assert_true(q[3] == (0 + 16 + 16) * 32 && s[2] == 16 && st[2] == 32);
        exec_fp8_layout_free(&l);
        /* the tests' reference path: nothing fused, nothing kept */
        assert_int_equal(exec_fp8_layout(&t, b ? COST_FP8_BLOCK : COST_FP8, 100, true, &l, &err),
                         MOE_OK);
        assert_true(!l.fuse && !l.amax_rows && !l.amax_weights && !l.cast_overlap);
        exec_fp8_layout_free(&l);
    }
    m.attn.head_dim = 10; /* q, k, v and o 40 or 20 wide: bf16 */
    assert_int_equal(exec_model_table(&t, &m, &err), MOE_OK);
    struct exec_fp8_layout l;
    assert_int_equal(exec_fp8_layout(&t, COST_FP8, 100, false, &l, &err), MOE_OK);
    assert_int_equal(l.n, 2 * 3 * 8);
    exec_fp8_layout_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_catches_nan),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_fp8_linear),
        cmocka_unit_test(test_fp8_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
