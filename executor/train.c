/*
 * train.c: what a training loop needs around the step, shared by the CPU reference and the GPU
 * executor: the learning-rate schedule, AdamW with gradient clipping, and the training data.
 *
 * AdamW is the decoupled form (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) +
 * wd * p), after clipping the gradient to a global norm. Data are read in order so that a run is
 * reproducible and resumable from a position; synthetic tokens come from the seeded RNG.
 */
#include "exec_ref.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void exec_adamw_defaults(struct exec_adamw *o)
{
    o->lr_max = 3e-4;
    o->lr_min = 3e-5;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->clip = 1.0;
    o->warmup_steps = 10;
    o->total_steps = 1000;
    o->moments_bf16 = false;
}

double exec_lr_at(const struct exec_adamw *o, int step)
{
    if (step < o->warmup_steps) return o->lr_max * (step + 1) / o->warmup_steps;
    int span = o->total_steps - o->warmup_steps;
    double f = span > 0 ? (double)(step - o->warmup_steps) / span : 1.0;
    if (f > 1.0) f = 1.0;
    return o->lr_min + 0.5 * (o->lr_max - o->lr_min) * (1.0 + cos(3.141592653589793 * f));
}

double exec_ref_bf16(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) /* Inf and NaN stay */
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

double exec_ref_adamw_step(struct exec_ref_model *r, const double *grad, double *m1, double *m2,
                           int step, const struct exec_adamw *o)
{
    double norm = 0.0;
    for (size_t i = 0; i < r->nparams; i++) norm += grad[i] * grad[i];
    norm = sqrt(norm);
    exec_ref_adamw_range(r, grad, m1, m2, 0, r->nparams, step, o, norm);
    return norm;
}

void exec_ref_adamw_range(struct exec_ref_model *r, const double *grad, double *m1, double *m2,
                          size_t lo, size_t hi, int step, const struct exec_adamw *o, double norm)
{
    double scale = o->clip > 0 && norm > o->clip ? o->clip / norm : 1.0;
    double lr = exec_lr_at(o, step);
    double c1 = 1.0 - pow(o->beta1, step + 1), c2 = 1.0 - pow(o->beta2, step + 1);
    for (int t = 0; t < r->ntensors; t++) {
        const struct exec_tensor *tn = &r->tensor[t];
        double wd = exec_tensor_decays(tn->name) ? o->weight_decay : 0.0;
        size_t a = tn->offset > lo ? tn->offset : lo, b = tn->offset + tn->size;
        if (b > hi) b = hi;
        for (size_t j = a; j < b; j++) {
            double g = grad[j] * scale;
            m1[j] = o->beta1 * m1[j] + (1.0 - o->beta1) * g;
            m2[j] = o->beta2 * m2[j] + (1.0 - o->beta2) * g * g;
            double upd = (m1[j] / c1) / (sqrt(m2[j] / c2) + o->eps);
            r->params[j] -= lr * (upd + wd * r->params[j]);
            if (o->moments_bf16) m1[j] = exec_ref_bf16(m1[j]), m2[j] = exec_ref_bf16(m2[j]);
        }
    }
}

static uint64_t le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

enum moe_status exec_data_open(struct exec_data *d, const char *file, int vocab, uint64_t seed,
                               struct moe_error *err)
{
    memset(d, 0, sizeof *d);
    d->vocab = vocab;
    moe_rng_seed(&d->rng, seed);
    if (!file) {
        d->synthetic = true;
        snprintf(d->source, sizeof d->source, "synthetic tokens, seed %llu",
                 (unsigned long long)seed);
        return MOE_OK;
    }
    char *text = NULL;
    size_t len = 0;
    enum moe_status st = moe_file_read(file, MOE_READ_INPUT, (size_t)1 << 34, &text, &len, err);
    if (st != MOE_OK) return st;
    const unsigned char *buf = (const unsigned char *)text;
    if (len < 2) {
        st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                              "training data must hold 2 bytes at least (up to 16 GiB)");
        goto cleanup;
    }
    if (len >= 20 && memcmp(buf, "MOETOKv1", 8) == 0) {
        uint32_t fv = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                      (uint32_t)buf[11] << 24;
        uint64_t count = le64(buf + 12);
        if (count < 2 || count > (len - 20) / 4 || (len - 20) != count * 4) {
            st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                  "token file header says %llu tokens, the file holds %zu",
                                  (unsigned long long)count, (len - 20) / 4);
            goto cleanup;
        }
        if ((int)fv > vocab) {
            st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                  "token file vocabulary %u exceeds the model's %d", fv, vocab);
            goto cleanup;
        }
        d->tokens = malloc(sizeof *d->tokens * count);
        if (!d->tokens) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory reading %s", file);
            goto cleanup;
        }
        for (uint64_t i = 0; i < count; i++) {
            const unsigned char *p = buf + 20 + 4 * i;
            uint32_t t =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            if (t >= fv) {
                free(d->tokens);
                d->tokens = NULL;
                st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                      "token %llu is %u, outside the vocabulary %u",
                                      (unsigned long long)i, t, fv);
                goto cleanup;
            }
            d->tokens[i] = (int)t;
        }
        d->count = count;
        snprintf(d->source, sizeof d->source, "%s (%llu tokens)", file, (unsigned long long)count);
    } else {
        if (vocab < 256) {
            st = moe_error_set_at(err, MOE_ERR_INPUT, file, 0, 0,
                                  "byte-level training needs a vocabulary of at least 256, the "
                                  "model has %d",
                                  vocab);
            goto cleanup;
        }
        d->tokens = malloc(sizeof *d->tokens * len);
        if (!d->tokens) {
            st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory reading %s", file);
            goto cleanup;
        }
        for (size_t i = 0; i < len; i++) d->tokens[i] = buf[i];
        d->count = len;
        snprintf(d->source, sizeof d->source, "%s (%zu bytes as tokens)", file, len);
    }
cleanup:
    free(text);
    return st;
}

void exec_data_next(struct exec_data *d, int *out, int n)
{
    for (int i = 0; i < n; i++) {
        if (d->synthetic) {
            out[i] = (int)moe_rng_below(&d->rng, (uint64_t)d->vocab);
            continue;
        }
        out[i] = d->tokens[d->pos];
        d->pos = (d->pos + 1) % d->count;
    }
}

void exec_data_close(struct exec_data *d)
{
    if (!d) return;
    free(d->tokens);
    d->tokens = NULL;
}
