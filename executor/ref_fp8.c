/*
 * ref_fp8.c: FP8 as the GPU quantizes it, written plainly: float to E4M3 (the "fn" format: no
 * infinities, largest 448) and E5M2 (largest finite 57344) with rounding to nearest even and
 * saturation to the largest finite value (CUDA's __NV_SATFINITE), and back; and the two scaling
 * recipes: per-tensor current scaling (one scale from the tensor's amax this step) and
 * DeepSeek-V3's blockwise scaling (a scale per 1 x 128 tile of a row, or per 128 x 128 block).
 * A scale multiplies before the conversion: q = fp8(x * s), s = fp8_max / amax in float (1 where
 * amax is 0 or not finite), so x is about q / s; block scaling rounds s down to a power of two,
 * as Transformer Engine's Float8BlockScaling does by default (the largest value then lands
 * between half the format's largest and it, and q / s is exact in float). The GPU's kernels are
 * checked bit for bit against these.
 */
#include "exec_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct fp8_format {
    int mbits, bias;
    unsigned max_code; /* the largest finite magnitude's code (sign bit clear) */
    unsigned nan_code;
};
static const struct fp8_format fmt_e4m3 = {3, 7, 0x7E, 0x7F}, fmt_e5m2 = {2, 15, 0x7B, 0x7F};

static const struct fp8_format *format_of(enum exec_fp8 f)
{
    return f == EXEC_FP8_E4M3 ? &fmt_e4m3 : &fmt_e5m2;
}

float exec_fp8_max(enum exec_fp8 f)
{
    return f == EXEC_FP8_E4M3 ? 448.0f : 57344.0f;
}

unsigned char exec_fp8_from_float(float x, enum exec_fp8 f)
{
    const struct fp8_format *F = format_of(f);
    if (isnan(x)) return (unsigned char)F->nan_code;
    unsigned sign = signbit(x) ? 0x80u : 0u;
    if (isinf(x)) return (unsigned char)(sign | F->max_code); /* saturated, as finite values */
    double a = fabs((double)x);
    int emin = 1 - F->bias; /* the smallest normal exponent */
    double step = ldexp(1.0, emin - F->mbits);
    unsigned code;
    if (a < ldexp(1.0, emin)) { /* subnormal: multiples of step, ties to even */
        code = (unsigned)nearbyint(a / step);
    } else {
        int e;
        frexp(a, &e);
        e -= 1; /* a = m 2^e, m in [1, 2) */
        double m = ldexp(a, -e) - 1.0;
        double q = nearbyint(ldexp(m, F->mbits));
        if (q >= ldexp(1.0, F->mbits)) q = 0, e += 1;
        double c = (double)(e + F->bias) * ldexp(1.0, F->mbits) + q;
        code = c > F->max_code ? F->max_code : (unsigned)c;
    }
    return (unsigned char)(sign | code);
}

float exec_fp8_to_float(unsigned char q, enum exec_fp8 f)
{
    const struct fp8_format *F = format_of(f);
    unsigned mag = q & 0x7Fu;
    if (f == EXEC_FP8_E4M3 ? mag == 0x7F : mag > 0x7C) return NAN;
    double s = q & 0x80u ? -1.0 : 1.0;
    if (f == EXEC_FP8_E5M2 && mag == 0x7C) return (float)(s * INFINITY);
    unsigned e = mag >> F->mbits, m = mag & ((1u << F->mbits) - 1);
    if (!e) return (float)(s * ldexp((double)m, 1 - F->bias - F->mbits));
    return (float)(s * ldexp(1.0 + ldexp((double)m, -F->mbits), (int)e - F->bias));
}

float exec_fp8_scale(float amax, enum exec_fp8 f, enum exec_fp8_scaling how)
{
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    float s = exec_fp8_max(f) / amax;
    if (!isfinite(s)) return 1.0f;
    if (how == EXEC_FP8_TENSOR) return s;
    uint32_t b; /* block scaling: the power of two at or below, its mantissa bits dropped */
    memcpy(&b, &s, sizeof b);
    b &= 0xFF800000u;
    memcpy(&s, &b, sizeof s);
    return s;
}

/* amax of x[r0..r1) x [c0..c1) of a rows x cols array (stride ld) */
static float amax_of(const float *x, int ld, int r0, int r1, int c0, int c1)
{
    float m = 0.0f;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) {
            float a = fabsf(x[(size_t)r * ld + c]);
            if (a > m || isnan(a)) m = a;
        }
    return m;
}

static void quantize_block(const float *x, int ld, int r0, int r1, int c0, int c1, float s,
                           enum exec_fp8 f, unsigned char *q)
{
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++)
            q[(size_t)r * ld + c] = exec_fp8_from_float(x[(size_t)r * ld + c] * s, f);
}

void exec_fp8_quantize(const float *x, int rows, int cols, enum exec_fp8_scaling how,
                       enum exec_fp8 f, unsigned char *q, float *scales)
{
    int bh = how == EXEC_FP8_TENSOR ? rows : how == EXEC_FP8_BLOCK_128X128 ? 128 : 1;
    int bw = how == EXEC_FP8_TENSOR ? cols : 128;
    int nbr = (rows + bh - 1) / bh, nbc = (cols + bw - 1) / bw;
    for (int i = 0; i < nbr; i++)
        for (int j = 0; j < nbc; j++) {
            int r0 = i * bh, r1 = r0 + bh < rows ? r0 + bh : rows;
            int c0 = j * bw, c1 = c0 + bw < cols ? c0 + bw : cols;
            float s = exec_fp8_scale(amax_of(x, cols, r0, r1, c0, c1), f, how);
            scales[(size_t)i * nbc + j] = s;
            quantize_block(x, cols, r0, r1, c0, c1, s, f, q);
        }
}

size_t exec_fp8_scale_count(int rows, int cols, enum exec_fp8_scaling how)
{
    if (how == EXEC_FP8_TENSOR) return 1;
    size_t nbc = (size_t)(cols + 127) / 128;
    return how == EXEC_FP8_BLOCK_128X128 ? (size_t)(rows + 127) / 128 * nbc : (size_t)rows * nbc;
}

/* q (rows x K) back to double: each value over its tile's, block's or tensor's scale */
static void dequantize(const unsigned char *q, const float *s, int rows, int K,
                       struct exec_fp8_how how, double *out)
{
    int kt = (K + 127) / 128; /* tiles or blocks a row */
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < K; k++) {
            size_t at = how.scaling == EXEC_FP8_TENSOR       ? 0
                        : how.scaling == EXEC_FP8_TILE_1X128 ? (size_t)i * kt + k / 128
                                                             : (size_t)(i / 128) * kt + k / 128;
            out[(size_t)i * K + k] =
                exec_fp8_to_float(q[(size_t)i * K + k], how.format) / (double)s[at];
        }
}

void exec_ref_fp8_linear(const float *x, struct exec_fp8_how hx, const float *w,
                         struct exec_fp8_how hw, int M, int N, int K, double *y)
{
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    unsigned char *qx = malloc(nx ? nx : 1), *qw = malloc(nw ? nw : 1);
    float *sx = malloc(sizeof(float) * exec_fp8_scale_count(M, K, hx.scaling));
    float *sw = malloc(sizeof(float) * exec_fp8_scale_count(N, K, hw.scaling));
    double *dx = malloc(sizeof(double) * (nx ? nx : 1)),
           *dw = malloc(sizeof(double) * (nw ? nw : 1));
    if (!qx || !qw || !sx || !sw || !dx || !dw) {
        for (size_t i = 0; i < (size_t)M * N; i++) y[i] = NAN; /* out of memory: loudly wrong */
        goto done;
    }
    exec_fp8_quantize(x, M, K, hx.scaling, hx.format, qx, sx);
    exec_fp8_quantize(w, N, K, hw.scaling, hw.format, qw, sw);
    dequantize(qx, sx, M, K, hx, dx);
    dequantize(qw, sw, N, K, hw, dw);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += dx[(size_t)i * K + k] * dw[(size_t)j * K + k];
            y[(size_t)i * N + j] = acc;
        }
done:
    free(qx), free(qw), free(sx), free(sw), free(dx), free(dw);
}
