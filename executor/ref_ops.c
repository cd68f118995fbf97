/*
 * ref_ops.c: the dense building blocks of the CPU reference: RMSNorm, RoPE, causal GQA attention
 * (with a sliding window), cross-entropy; forward and backward, double precision, written as the
 * formulas read. Checked against finite differences in tests/unit/test_ref_ops.c.
 */
#include "exec_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void exec_ref_rmsnorm(const double *x, const double *w, int tokens, int h, double eps, double *y)
{
    for (int t = 0; t < tokens; t++) {
        const double *xt = x + (size_t)t * h;
        double ms = 0.0;
        for (int i = 0; i < h; i++) ms += xt[i] * xt[i];
        double r = 1.0 / sqrt(ms / h + eps);
        for (int i = 0; i < h; i++) y[(size_t)t * h + i] = xt[i] * r * (w ? w[i] : 1.0);
    }
}

void exec_ref_rmsnorm_backward(const double *x, const double *w, const double *dy, int tokens,
                               int h, double eps, double *dx, double *dw)
{
    for (int t = 0; t < tokens; t++) {
        const double *xt = x + (size_t)t * h, *dyt = dy + (size_t)t * h;
        double ms = 0.0, dot = 0.0;
        for (int i = 0; i < h; i++) ms += xt[i] * xt[i];
        double r = 1.0 / sqrt(ms / h + eps);
        for (int i = 0; i < h; i++) {
            if (dw) dw[i] += dyt[i] * xt[i] * r;
            dot += dyt[i] * (w ? w[i] : 1.0) * xt[i];
        }
        /* d/dx (x r): r I - x x^T r^3 / h */
        for (int i = 0; i < h; i++)
            dx[(size_t)t * h + i] = r * dyt[i] * (w ? w[i] : 1.0) - xt[i] * r * r * r * dot / h;
    }
}

void exec_ref_rope(double *x, int tokens, int heads, int dim, int rot, const double *inv_freq,
                   double scale, const int *position, bool inverse)
{
    int half = rot / 2;
    for (int t = 0; t < tokens; t++)
        for (int hd = 0; hd < heads; hd++) {
            double *v = x + ((size_t)t * heads + hd) * dim;
            for (int i = 0; i < half; i++) {
                double angle = position[t] * inv_freq[i];
                double c = scale * cos(angle), s = scale * (inverse ? -sin(angle) : sin(angle));
                double a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = a * s + b * c;
            }
        }
}

static bool attends(int i, int j, int window)
{
    return j <= i && (window <= 0 || i - j < window);
}

/* Softmax probabilities of query i, head hd, over keys 0..i (row p of length T). */
static void attention_probs(const double *q, const double *k, int T, int H, int KV, int dqk,
                            int window, double scale, const double *sink, int i, int hd, double *p,
                            double *psink)
{
    int kvh = hd / (H / KV);
    const double *qi = q + ((size_t)i * H + hd) * dqk;
    double mx = sink ? sink[hd] : -HUGE_VAL, sum = 0.0;
    for (int j = 0; j < T; j++) {
        if (!attends(i, j, window)) {
            p[j] = 0.0;
            continue;
        }
        const double *kj = k + ((size_t)j * KV + kvh) * dqk;
        double s = 0.0;
        for (int d = 0; d < dqk; d++) s += qi[d] * kj[d];
        p[j] = s * scale;
        mx = fmax(mx, p[j]);
    }
    for (int j = 0; j < T; j++)
        if (attends(i, j, window)) sum += (p[j] = exp(p[j] - mx));
    double es = sink ? exp(sink[hd] - mx) : 0.0; /* the sink: a logit with no value */
    sum += es;
    for (int j = 0; j < T; j++) p[j] /= sum;
    *psink = es / sum;
}

void exec_ref_attention(const double *q, const double *k, const double *v, int tokens, int heads,
                        int kv_heads, int dqk, int dv, int window, double scale, const double *sink,
                        double *out)
{
    int T = tokens, H = heads, KV = kv_heads;
    double *p = malloc(sizeof *p * (size_t)T);
    if (!p) return;
    for (int i = 0; i < T; i++)
        for (int hd = 0; hd < H; hd++) {
            double ps;
            attention_probs(q, k, T, H, KV, dqk, window, scale, sink, i, hd, p, &ps);
            double *o = out + ((size_t)i * H + hd) * dv;
            for (int d = 0; d < dv; d++) o[d] = 0.0;
            for (int j = 0; j < T; j++) {
                if (p[j] == 0.0) continue;
                const double *vj = v + ((size_t)j * KV + hd / (H / KV)) * dv;
                for (int d = 0; d < dv; d++) o[d] += p[j] * vj[d];
            }
        }
    free(p);
}

void exec_ref_attention_backward(const double *q, const double *k, const double *v,
                                 const double *dout, int tokens, int heads, int kv_heads, int dqk,
                                 int dv, int window, double scale, const double *sink, double *dq,
                                 double *dk, double *dv_out, double *dsink)
{
    int T = tokens, H = heads, KV = kv_heads;
    memset(dq, 0, sizeof *dq * (size_t)T * H * dqk);
    memset(dk, 0, sizeof *dk * (size_t)T * KV * dqk);
    memset(dv_out, 0, sizeof *dv_out * (size_t)T * KV * dv);
    double *p = malloc(sizeof *p * (size_t)T), *dp = malloc(sizeof *dp * (size_t)T);
    if (!p || !dp) {
        free(p);
        free(dp);
        return;
    }
    for (int i = 0; i < T; i++)
        for (int hd = 0; hd < H; hd++) {
            int kvh = hd / (H / KV);
            double ps;
            attention_probs(q, k, T, H, KV, dqk, window, scale, sink, i, hd, p, &ps);
            const double *doi = dout + ((size_t)i * H + hd) * dv;
            double dot = 0.0;
            for (int j = 0; j < T; j++) {
                dp[j] = 0.0;
                if (p[j] == 0.0) continue;
                const double *vj = v + ((size_t)j * KV + kvh) * dv;
                double *dvj = dv_out + ((size_t)j * KV + kvh) * dv;
                for (int d = 0; d < dv; d++) {
                    dp[j] += doi[d] * vj[d];
                    dvj[d] += p[j] * doi[d];
                }
                dot += p[j] * dp[j];
            }
            if (dsink) dsink[hd] -= ps * dot; /* its value is 0: d/dsink = ps (0 - dot) */
            const double *qi = q + ((size_t)i * H + hd) * dqk;
            double *dqi = dq + ((size_t)i * H + hd) * dqk;
            for (int j = 0; j < T; j++) {
                if (p[j] == 0.0) continue;
                double ds = p[j] * (dp[j] - dot) * scale; /* softmax, then the scale */
                const double *kj = k + ((size_t)j * KV + kvh) * dqk;
                double *dkj = dk + ((size_t)j * KV + kvh) * dqk;
                for (int d = 0; d < dqk; d++) {
                    dqi[d] += ds * kj[d];
                    dkj[d] += ds * qi[d];
                }
            }
        }
    free(p);
    free(dp);
}

double exec_ref_cross_entropy(const double *logits, const int *targets, int tokens, int vocab,
                              double *dlogits)
{
    double total = 0.0;
    for (int t = 0; t < tokens; t++) {
        const double *z = logits + (size_t)t * vocab;
        double mx = z[0], sum = 0.0;
        for (int c = 1; c < vocab; c++) mx = fmax(mx, z[c]);
        for (int c = 0; c < vocab; c++) sum += exp(z[c] - mx);
        double lse = mx + log(sum);
        total += lse - z[targets[t]];
        if (dlogits)
            for (int c = 0; c < vocab; c++)
                dlogits[(size_t)t * vocab + c] =
                    (exp(z[c] - lse) - (c == targets[t] ? 1.0 : 0.0)) / tokens;
    }
    return total / tokens;
}
