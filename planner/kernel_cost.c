/*
 * kernel_cost.c: the cost model's primitives, what one kernel or collective takes on one GPU:
 * a GEMM by shape (a roofline with wave quantization and small-M/K penalties, so that small
 * experts cost more per FLOP, plus a fixed launch and setup time), the executor's expert block
 * forward and backward, the flash-attention core, and a ring collective. cost.c builds a step
 * from them; calibration.c fits their efficiencies to measurements.
 */
#include "cost_internal.h"

#include <math.h>
#include <stdlib.h>

double cost_precision_elem_bytes(enum cost_precision prec)
{
    switch (prec) {
    case COST_FP8: return 1.0;
    case COST_FP8_BLOCK: return 1.0 + 4.0 / 128.0;
    case COST_MXFP8: return 1.0 + 1.0 / 32.0;
    default: return BF16;
    }
}

double cost_quantize_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                        enum cost_precision prec, double elems, int tensors)
{
    if (prec == COST_BF16) return 0.0;
    double read = prec == COST_FP8 ? 2.0 * BF16 : BF16;
    double kernels = prec == COST_FP8 ? cal->quant_kernels_fp8 : cal->quant_kernels_block;
    return elems * (read + 2.0 * cost_precision_elem_bytes(prec)) /
               (gpu->hbm_bytes_per_s * cal->hbm_eff) * 1e6 +
           tensors * kernels * cal->launch_us;
}

/* The fraction of the fp8 peak a GEMM of recipe prec runs at; grad: a gradient GEMM (per-tensor
 * fp8's accumulate in split fp32 where the forward's have a fast mode) */
static double fp8_eff(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                      enum cost_precision prec, bool grad)
{
    if (prec == COST_FP8_BLOCK) return cal->gemm_eff_fp8_block;
    if (grad && prec == COST_FP8 && cost_fp8_fast_mode(gpu)) return cal->gemm_eff_fp8_grad;
    return cal->gemm_eff_fp8;
}

/* A GEMM's size-dependent time, rows at half efficiency m_half; *fixed receives its launch and
 * setup time. */

static double gemm_split(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                         double m, double n, double k, enum cost_precision prec, bool grad,
                         double m_half, double *fixed)
{
    *fixed = 0.0;
    if (m <= 0 || n <= 0 || k <= 0) return 0.0;
    *fixed = cal->launch_us + cal->gemm_fixed_us;
    bool fp8 = prec != COST_BF16 && gpu->fp8_tflops > 0;
    double eff8 = fp8_eff(cal, gpu, prec, grad);
    double peak = (fp8 ? gpu->fp8_tflops * eff8 : gpu->bf16_tflops * cal->gemm_eff) * 1e12;
    /* wave quantization of the output tiles; fewer tiles than SMs are split along k (cuBLAS's
     * split-K) to fill the machine, their cost left to the small-M term */
    double tiles = ceil(m / cal->gemm_tile_m) * ceil(n / cal->gemm_tile_n);
    double waves = ceil(tiles / gpu->sms);
    double wave_eff = tiles < gpu->sms ? 1.0 : tiles / (waves * gpu->sms);
    double m_eff = m / (m + m_half), k_eff = k / (k + cal->gemm_k_half);
    double t_flops = 2.0 * m * n * k / (peak * wave_eff * m_eff * k_eff);
    double bytes = (fp8 ? cost_precision_elem_bytes(prec) : BF16) * (m * k + k * n) + BF16 * m * n;
    double t_mem = bytes / (gpu->hbm_bytes_per_s * cal->hbm_eff);
    return (t_flops > t_mem ? t_flops : t_mem) * 1e6;
}

static double gemm_roofline_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                               double m, double n, double k, enum cost_precision prec, bool grad)
{
    double fixed, var = gemm_split(cal, gpu, m, n, k, prec, grad, cal->gemm_m_half, &fixed);
    return var + fixed;
}

static int gemm_sample_order(const void *a, const void *b)
{
    const double *x = a, *y = b; /* n, k, then m */
    if (x[1] != y[1]) return x[1] < y[1] ? -1 : 1;
    if (x[2] != y[2]) return x[2] < y[2] ? -1 : 1;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void cost_gemm_table_set(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                         const struct cost_gemm_sample *s, int n)
{
    cal->gemm_table_n = 0;
    for (int i = 0; i < n && cal->gemm_table_n < COST_GEMM_TABLE_MAX; i++) {
        double t = gemm_roofline_us(cal, gpu, s[i].m, s[i].n, s[i].k, COST_BF16, false);
        if (!(t > 0 && s[i].us > 0)) continue;
        double *e = cal->gemm_table[cal->gemm_table_n++];
        e[0] = s[i].m, e[1] = s[i].n, e[2] = s[i].k, e[3] = s[i].us / t;
    }
    qsort(cal->gemm_table, (size_t)cal->gemm_table_n, sizeof cal->gemm_table[0], gemm_sample_order);
    cost_gemm_table_logs(cal);
}

void cost_gemm_table_logs(struct cost_calibration *cal)
{
    for (int i = 0; i < cal->gemm_table_n; i++)
        for (int j = 0; j < 3; j++) cal->gemm_table_log[i][j] = log(cal->gemm_table[i][j]);
}

/* The measured-over-roofline ratio at (m, n, k): within each measured (n, k) shape linear in
 * log m between its samples (the end ones beyond them), then the shapes weighted by the inverse
 * fourth power of their log distance in n and k (a measured shape is met exactly; far from all
 * of them, their mean). */
static double gemm_table_ratio(const struct cost_calibration *cal, double m, double n, double k)
{
    double lm = log(m), ln = log(n), lk = log(k), num = 0.0, den = 0.0;
    const int cnt = cal->gemm_table_n;
    const double(*t)[4] = cal->gemm_table, (*lg)[3] = cal->gemm_table_log;
    for (int g = 0; g < cnt;) {
        int e = g;
        while (e < cnt && t[e][1] == t[g][1] && t[e][2] == t[g][2]) e++;
        double r = t[g][3];
        if (lm >= lg[e - 1][0]) r = t[e - 1][3];
        for (int i = g; i + 1 < e && lm > lg[g][0]; i++) {
            double a = lg[i][0], b = lg[i + 1][0];
            if (lm <= b) {
                double w = b > a ? (lm - a) / (b - a) : 1.0;
                r = t[i][3] + w * (t[i + 1][3] - t[i][3]);
                break;
            }
        }
        double d = fabs(ln - lg[g][1]) + fabs(lk - lg[g][2]);
        double w = 1.0 / (d * d * d * d + 1e-8);
        num += w * r, den += w;
        g = e;
    }
    return den > 0 ? num / den : 1.0;
}

static double gemm_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu, double m,
                      double n, double k, enum cost_precision prec, bool grad)
{
    double t = gemm_roofline_us(cal, gpu, m, n, k, prec, grad);
    if (cal->gemm_table_n > 0 && m > 0 && n > 0 && k > 0) t *= gemm_table_ratio(cal, m, n, k);
    return t;
}

double cost_gemm_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu, double m,
                    double n, double k, enum cost_precision prec)
{
    return gemm_us(cal, gpu, m, n, k, prec, false);
}

double cost_gemm_grad_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                         double m, double n, double k, enum cost_precision prec)
{
    return gemm_us(cal, gpu, m, n, k, prec, true);
}

void cost_expert_parts(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                       double rows, double h, double f, enum cost_precision prec, double var[2],
                       double fixed[2])
{
    var[0] = var[1] = fixed[0] = fixed[1] = 0.0;
    if (rows <= 0) return;
    double hbm = gpu->hbm_bytes_per_s * cal->hbm_eff, fx[6];
    double act = rows * 3 * f * BF16 / hbm * 1e6;
    double mh = cal->expert_m_half[0];
    var[0] = gemm_split(cal, gpu, rows, 2 * f, h, prec, false, mh, &fx[0]) +  /* gate and up */
             gemm_split(cal, gpu, rows, h, f, prec, false, mh, &fx[1]) + act; /* down */
    fixed[0] = fx[0] + fx[1] + cal->launch_us;
    /* dgrad (rows x input), wgrad (weights over the rows, the reduction) of both into fp32
     * weight gradients, written whatever the rows (a step's first micro-batch overwrites them;
     * the later ones also read them: moe_cost counts that read); SwiGLU's backward moves twice
     * its forward's bytes */
    mh = cal->expert_m_half[1];
    var[1] = gemm_split(cal, gpu, rows, f, h, prec, true, mh, &fx[2]) +
             gemm_split(cal, gpu, rows, h, 2 * f, prec, true, mh, &fx[3]) +
             gemm_split(cal, gpu, h, f, rows, prec, true, mh, &fx[4]) +
             gemm_split(cal, gpu, 2 * f, h, rows, prec, true, mh, &fx[5]) +
             3 * h * f * 4.0 / hbm * 1e6 + 2.0 * act;
    fixed[1] = fx[2] + fx[3] + fx[4] + fx[5] + cal->launch_us;
}

void cost_expert_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    double rows, double h, double f, enum cost_precision prec, double us[2])
{
    double var[2], fixed[2];
    cost_expert_parts(cal, gpu, rows, h, f, prec, var, fixed);
    for (int i = 0; i < 2; i++)
        us[i] = cal->expert_scale[i] * var[i] + cal->expert_fixed_share[i] * fixed[i];
    /* fp8: its two GEMM inputs quantized, and the gradients of its two outputs */
    us[0] += cost_quantize_us(cal, gpu, prec, rows * (h + f), 2);
    us[1] += cost_quantize_us(cal, gpu, prec, rows * (2.0 * f + h), 2);
}

void cost_attention_core_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                            double flops, double seq, double d, double dqk, double us[2])
{
    /* short sequences run the flash kernels below their long-sequence efficiency; the softmax's
     * exponentials, one per score against 4d FLOPs, hold the tensor cores back where the GPU's
     * exp units are slow against them (small heads most) */
    double half = cal->attn_exp_scale > 0 && gpu->exp_per_s > 0
                      ? cal->attn_exp_scale * gpu->bf16_tflops * 1e12 / (4.0 * gpu->exp_per_s)
                      : 0.0;
    double heads = d > 0 ? d / (d + half) : 1.0;
    double peak = gpu->bf16_tflops * 1e12 * seq / (seq + cal->attn_seq_half) * heads *
                  (dqk > 128 ? cal->attn_wide_eff : 1.0);
    us[0] = flops / (peak * cal->attn_fwd_eff) * 1e6 + cal->launch_us;
    us[1] = 2.5 * flops / (peak * cal->attn_bwd_eff) * 1e6 + cal->launch_us;
}

double cost_allgather_us(double bytes, int n, double bytes_per_s, double latency_us)
{
    if (n <= 1 || bytes <= 0) return 0.0;
    return (double)(n - 1) / n * bytes / bytes_per_s * 1e6 + (n - 1) * latency_us;
}
