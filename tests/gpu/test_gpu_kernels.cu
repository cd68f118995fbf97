/*
 * test_gpu_kernels.cu: the executor's kernels one by one against the CPU reference (the launchers
 * of executor/gpu_kernels.h; the whole step is test_gpu_step.c). Inputs are random, rounded to what
 * the kernel reads (bf16 where it reads bf16); tolerances, relative to the largest reference value:
 *   fp32 in and out (norm statistics, RoPE, the permutation, the combine,
 *   the embedding's gradient)                                                 1e-5
 *   bf16 outputs (normed activations, SwiGLU, attention output, dlogits)      8e-3 (2^-7)
 *   attention gradients (fp32 out; P and dS pass through bf16 on the way)     1e-2
 *   attention log-sum-exp (fp32)                                              1e-5
 * The permutation is exact. Exits 77 (skipped) where there is no GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" { /* cmocka's header has no C++ guards */
#include "../unit/moe_test.h"
}

#include "exec.h"
#include "gpu_kernels.h"

#include <string.h>
#include <math.h>
#include <thread>
#include <vector>

static int gpus(void)
{
    int n = 0;
    struct moe_error err;
    if (exec_device_count(&n, &err) != MOE_OK) return 0;
    return n;
}

template <typename T> static T *dev(const std::vector<T> &h)
{
    T *d;
    assert_int_equal(cudaMalloc((void **)&d, sizeof(T) * (h.size() ? h.size() : 1)), cudaSuccess);
    if (h.size()) cudaMemcpy(d, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice);
    return d;
}

template <typename T> static std::vector<T> host(const T *d, size_t n)
{
    std::vector<T> h(n);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost);
    return h;
}

static std::vector<double> to_d(const std::vector<float> &v)
{
    return std::vector<double>(v.begin(), v.end());
}
static std::vector<double> to_d(const std::vector<bf16> &v)
{
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = __bfloat162float(v[i]);
    return o;
}

static std::vector<bf16> to_bf16(const std::vector<float> &v)
{
    std::vector<bf16> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = __float2bfloat16(v[i]);
    return o;
}

static std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0)
{
    struct moe_rng rng;
    moe_rng_seed(&rng, seed);
    std::vector<float> v(n);
    for (auto &x : v) x = (float)(scale * moe_rng_normal(&rng));
    return v;
}

/* moe_expect_close on vectors: every |a - b| <= tol x max |b|, and no NaN. */
static void close(const char *what, const std::vector<double> &a, const std::vector<double> &b,
                  double tol)
{
    assert_int_equal(a.size(), b.size());
    moe_expect_close(what, a.data(), b.data(), b.size(), tol);
}

/* h 300: the 16-byte path; h 301: element by element. Besides the reference's outputs: x's copy
 * (exact), the backward's bf16 copy (8e-3) and its sum with a base (1e-5). */
static void test_rmsnorm(void **state)
{
    (void)state;
    const int T = 300; /* three column-sum partials of GK_COLSUM_ROWS, the last short */
    for (int h = 300; h <= 301; h++) {
        std::vector<float> x = randn((size_t)T * h, 1), w = randn(h, 2),
                           dy = randn((size_t)T * h, 3), base = randn((size_t)T * h, 4);
        for (auto &v : w) v = 1.0f + 0.1f * v;
        std::vector<double> yr((size_t)T * h), dxr((size_t)T * h), dwr(h, 0.0);
        exec_ref_rmsnorm(to_d(x).data(), to_d(w).data(), T, h, 1e-6, yr.data());
        exec_ref_rmsnorm_backward(to_d(x).data(), to_d(w).data(), to_d(dy).data(), T, h, 1e-6,
                                  dxr.data(), dwr.data());
        float *dx_ = dev(x), *dw_ = dev(w), *ddy = dev(dy), *dbase = dev(base),
              *y32 = dev(std::vector<float>((size_t)T * h)), *rstd = dev(std::vector<float>(T)),
              *xc = dev(std::vector<float>((size_t)T * h)),
              *gx = dev(std::vector<float>((size_t)T * h)),
              *part = dev(std::vector<float>((size_t)h * 4)), *gw = dev(std::vector<float>(h));
        bf16 *y16, *gx16;
        cudaMalloc((void **)&y16, sizeof(bf16) * T * h);
        cudaMalloc((void **)&gx16, sizeof(bf16) * T * h);
        gk_rmsnorm(dx_, h, dw_, T, h, 1e-6f, y16, h, y32, h, xc, h, rstd, 0);
        std::vector<double> y = to_d(host(y32, (size_t)T * h));
        close("rmsnorm (fp32 out)", y, yr, 1e-5);
        assert_true(host(xc, (size_t)T * h) == x);
        /* The check catches a poisoned element of the kernel's output; the helper it replaced,
         * max of fmax(worst, |a - b|) against the tolerance, did not (fmax drops the NaN). */
        y[(size_t)T * h / 2] = NAN;
        double worst = 0;
        for (size_t i = 0; i < y.size(); i++) worst = fmax(worst, fabs(y[i] - yr[i]));
        assert_false(worst > 1e-5 * moe_max_abs(yr.data(), yr.size())); /* the old check: passed */
        assert_int_equal(moe_count_wrong("rmsnorm, one NaN", y.data(), yr.data(), y.size(), 0,
                                         1e-5 * moe_max_abs(yr.data(), yr.size())),
                         1);
        close("rmsnorm (bf16 out)", to_d(host(y16, (size_t)T * h)), yr, 8e-3);
        gk_rmsnorm_backward(dx_, h, dw_, rstd, ddy, h, NULL, 0, gx, gx16, h, T, h, 0);
        gk_colsum(ddy, h, dx_, h, rstd, T, h, part, gw, false, 0);
        close("rmsnorm backward dx", to_d(host(gx, (size_t)T * h)), dxr, 1e-5);
        close("rmsnorm backward dx (bf16 copy)", to_d(host(gx16, (size_t)T * h)), dxr, 8e-3);
        close("rmsnorm backward dw", to_d(host(gw, h)), dwr, 1e-5);
        gk_rmsnorm_backward(dx_, h, dw_, rstd, ddy, h, dbase, h, gx, NULL, h, T, h, 0);
        for (size_t i = 0; i < dxr.size(); i++) dxr[i] += base[i];
        close("rmsnorm backward dx + base", to_d(host(gx, (size_t)T * h)), dxr, 1e-5);
        cudaFree(dx_), cudaFree(dw_), cudaFree(ddy), cudaFree(dbase), cudaFree(y32), cudaFree(rstd);
        cudaFree(xc), cudaFree(gx), cudaFree(part), cudaFree(gw), cudaFree(y16), cudaFree(gx16);
    }
}

/* The embedding forward (exact) and backward against sums in double (1e-5): text-like tokens, one
 * id at more than three units of GK_EMBED_SEG positions, some once, and the rows' base kept. */
static void test_embed(void **state)
{
    (void)state;
    const int B = 2, S = 300, V = 50, h = 300, T = B * S;
    std::vector<int> tok((size_t)B * (S + 1)), in(T), count(V, 0);
    struct moe_rng rng;
    moe_rng_seed(&rng, 9);
    for (int b = 0; b < B; b++)
        for (int t = 0; t <= S; t++) {
            double u = moe_rng_uniform(&rng);
            int v = u < 0.4 ? 7 : u < 0.6 ? 11 : (int)(moe_rng_uniform(&rng) * V) % V;
            tok[(size_t)b * (S + 1) + t] = v;
            if (t < S) in[(size_t)b * S + t] = v;
        }
    std::vector<float> emb = randn((size_t)V * h, 5), dx = randn((size_t)T * h, 6),
                       base = randn((size_t)V * h, 7);
    std::vector<int> plan(gk_embed_plan_ints(T));
    struct gk_embed_work w;
    gk_embed_plan(tok.data(), B, S, S + 1, count.data(), plan.data(), &w);
    for (int v = 0; v < V; v++) assert_int_equal(count[v], 0);
    assert_true(w.multi >= 2 && w.rows > 3 * w.multi); /* ids 7 and 11 split, 7 in > 3 units */
    std::vector<double> ref(base.begin(), base.end()), xr((size_t)T * h);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < h; c++) {
            ref[(size_t)in[t] * h + c] += dx[(size_t)t * h + c];
            xr[(size_t)t * h + c] = emb[(size_t)in[t] * h + c];
        }
    float *demb = dev(emb), *ddx = dev(dx), *dg = dev(base),
          *x = dev(std::vector<float>(dx.size())),
          *scratch = dev(std::vector<float>((size_t)T * h));
    int *dplan = dev(plan), *din = dev(in);
    assert_int_equal(gk_embed(demb, din, T, h, x, 0), cudaSuccess);
    close("embedding", to_d(host(x, (size_t)T * h)), xr, 0.0);
    assert_int_equal(gk_embed_backward(ddx, dplan, T, &w, h, scratch, dg, 0), cudaSuccess);
    close("embedding backward", to_d(host(dg, (size_t)V * h)), ref, 1e-5);
    cudaFree(demb), cudaFree(ddx), cudaFree(dg), cudaFree(x), cudaFree(scratch), cudaFree(dplan);
    cudaFree(din);
}

/* RoPE into bf16 from fp32 and from bf16 (in place): against the CPU reference rounded to bf16
 * (half an ulp of bf16 and fp32 rounding: 2^-8 of the largest value), and the two inputs the
 * same where the fp32 input holds bf16 values. */
static void test_rope(void **state)
{
    (void)state;
    const int T = 50, H = 3, D = 24, seq = 20;
    std::vector<float> x = randn((size_t)T * H * D, 4);
    for (auto &v : x) v = __bfloat162float(__float2bfloat16(v)); /* bf16 values: both inputs */
    std::vector<int> pos(T);
    for (int t = 0; t < T; t++) pos[t] = t % seq;
    float2 *tab;
    assert_int_equal(cudaMalloc((void **)&tab, sizeof(float2) * seq * 8), cudaSuccess);
    /* plain RoPE, then YaRN (its frequencies and a scale of 1.35 on cos and sin) */
    struct mdl_attention at = {};
    at.rope_theta = 10000.0;
    at.yarn = {8.0, 32.0, 1.0, mdl_yarn_attention_factor(8.0), 16, false};
    for (int yarn = 0; yarn < 2; yarn++) {
        at.rope_scaling = yarn ? MDL_ROPE_YARN : MDL_ROPE_PLAIN;
        double fr[8], scale;
        mdl_rope_freqs(&at, 16, fr, &scale);
        assert_int_equal(gk_rope_table(tab, seq, 16, fr, scale, 0), cudaSuccess);
        for (int inv = 0; inv < 2; inv++) {
            std::vector<double> r = to_d(x);
            exec_ref_rope(r.data(), T, H, D, 16, fr, scale, pos.data(), inv);
            float *d = dev(x);
            bf16 *y, *x16;
            size_t n = x.size();
            assert_int_equal(cudaMalloc((void **)&y, sizeof(bf16) * n), cudaSuccess);
            assert_int_equal(cudaMalloc((void **)&x16, sizeof(bf16) * n), cudaSuccess);
            assert_int_equal(gk_to_bf16(d, x16, n, 0), cudaSuccess);
            assert_int_equal(gk_rope_bf16(d, NULL, y, T, H, D, 16, tab, seq, inv, 0), cudaSuccess);
            assert_int_equal(gk_rope_bf16(NULL, x16, x16, T, H, D, 16, tab, seq, inv, 0),
                             cudaSuccess);
            std::vector<bf16> a(n), b(n);
            assert_int_equal(cudaMemcpy(a.data(), y, sizeof(bf16) * n, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            assert_int_equal(cudaMemcpy(b.data(), x16, sizeof(bf16) * n, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            std::vector<double> ad(n);
            for (size_t i = 0; i < n; i++) {
                ad[i] = __bfloat162float(a[i]);
                assert_true(memcmp(&a[i], &b[i], sizeof(bf16)) == 0);
            }
            close(inv ? (yarn ? "yarn inverse (bf16 out)" : "rope inverse (bf16 out)")
                      : (yarn ? "yarn (bf16 out)" : "rope (bf16 out)"),
                  ad, r, 1.0 / 256);
            cudaFree(d), cudaFree(y), cudaFree(x16);
        }
    }
    cudaFree(tab);
}

/* SwiGLU on bf16 gate / up (the GEMMs' rounded outputs) and bf16 dhm: n not a multiple of 8 (the
 * eight-at-a-time path and its tail), then the same from pointers one element in (the one-at-a-time
 * path); plain, then gpt-oss's clamped form with alpha 1.702 and a limit of 1.5 (gate of std 2
 * and up of std 1 cross it on both sides). The reference computes from the same bf16 inputs in
 * double. */
static void test_swiglu(void **state)
{
    (void)state;
    const size_t n = 5003;
    std::vector<bf16> g = to_bf16(randn(n + 1, 5, 2.0)), u = to_bf16(randn(n + 1, 6)),
                      dh = to_bf16(randn(n + 1, 7));
    bf16 *dg = dev(g), *du = dev(u), *ddh = dev(dh), *hm, *og, *ou;
    cudaMalloc((void **)&hm, sizeof(bf16) * (n + 1));
    cudaMalloc((void **)&og, sizeof(bf16) * (n + 1));
    cudaMalloc((void **)&ou, sizeof(bf16) * (n + 1));
    for (int clamped = 0; clamped < 2; clamped++)
        for (size_t o = 0; o < 2; o++) {
            const double a = clamped ? 1.702 : 1.0, lim = clamped ? 1.5 : 0.0;
            std::vector<double> hr(n), dgr(n), dur(n);
            for (size_t i = 0; i < n; i++) {
                double x = __bfloat162float(g[o + i]), up = __bfloat162float(u[o + i]),
                       d = __bfloat162float(dh[o + i]);
                if (!clamped) {
                    double s = 1.0 / (1.0 + exp(-x));
                    hr[i] = x * s * up;
                    dur[i] = d * x * s;
                    dgr[i] = d * up * s * (1.0 + x * (1.0 - s));
                    continue;
                }
                double xc = x < lim ? x : lim, uc = up < -lim ? -lim : up > lim ? lim : up;
                double s = 1.0 / (1.0 + exp(-a * xc));
                hr[i] = (uc + 1.0) * xc * s;
                dur[i] = up >= -lim && up <= lim ? d * xc * s : 0.0;
                dgr[i] = x <= lim ? d * (uc + 1.0) * s * (1.0 + a * xc * (1.0 - s)) : 0.0;
            }
            assert_int_equal(gk_swiglu(dg + o, du + o, hm + o, n, (float)a, (float)lim, NULL, 0),
                             cudaSuccess);
            assert_int_equal(gk_swiglu_backward(dg + o, du + o, ddh + o, og + o, ou + o, n,
                                                (float)a, (float)lim, NULL, 0),
                             cudaSuccess);
            close(clamped ? "clamped swiglu" : "swiglu", to_d(host(hm + o, n)), hr, 8e-3);
            close(clamped ? "clamped swiglu d gate" : "swiglu backward d gate",
                  to_d(host(og + o, n)), dgr, 8e-3);
            close(clamped ? "clamped swiglu d up" : "swiglu backward d up", to_d(host(ou + o, n)),
                  dur, 8e-3);
        }
    cudaFree(dg), cudaFree(du), cudaFree(ddh), cudaFree(hm), cudaFree(og), cudaFree(ou);
}

/* The permutation (exact, against exec_ref_permute), with one expert taking most pairs and some
 * none, over several chunks; then the gather, the weighted combine and its backward, and the
 * rows' gradient summed back to the tokens (gather-sum). */
static void test_permute_combine(void **state)
{
    (void)state;
    const int T = 1500, k = 3, E = 16, h = 40, P = T * k;
    struct moe_rng rng;
    moe_rng_seed(&rng, 8);
    std::vector<int> choice(P);
    for (int t = 0; t < T; t++) /* distinct experts per token, 3 .. 5 get none */
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do {
                e = moe_rng_below(&rng, 4) ? 0 + (int)moe_rng_below(&rng, 3)
                                           : 6 + (int)moe_rng_below(&rng, 10);
                dup = false;
                for (int q = 0; q < j; q++) dup |= choice[t * k + q] == e;
            } while (dup);
            choice[t * k + j] = e;
        }
    std::vector<int> off(E + 1), src(P);
    exec_ref_permute(choice.data(), T, k, E, off.data(), src.data());
    int chunks = (P + GK_CHUNK - 1) / GK_CHUNK;
    int *dc = dev(choice), *cnt = dev(std::vector<int>((size_t)chunks * E)),
        *base = dev(std::vector<int>((size_t)chunks * E)), *doff = dev(std::vector<int>(E + 1)),
        *dsrc = dev(std::vector<int>(P)), *dpos = dev(std::vector<int>(P));
    gk_permute_count(dc, P, E, cnt, base, doff, 0);
    gk_permute_place(dc, P, E, base, doff, dsrc, dpos, 0);
    assert_true(host(doff, E + 1) == off);
    assert_true(host(dsrc, P) == src);
    std::vector<int> pos = host(dpos, P);
    for (int p = 0; p < P; p++) assert_int_equal(pos[src[p]], p);
    printf("permutation: %d pairs in %d chunks, offsets and rows equal to the reference (experts "
           "3-5 empty)\n",
           P, chunks);
    /* gather, combine, combine backward */
    std::vector<float> xf = randn((size_t)T * h, 9), yp = randn((size_t)P * h, 10),
                       w = randn(P, 11), dy = randn((size_t)T * h, 12),
                       y0 = randn((size_t)T * h, 13);
    std::vector<bf16> x16(xf.size());
    for (size_t i = 0; i < xf.size(); i++) x16[i] = __float2bfloat16(xf[i]);
    bf16 *dx16 = dev(x16), *xp, *dyp;
    cudaMalloc((void **)&xp, sizeof(bf16) * P * h);
    cudaMalloc((void **)&dyp, sizeof(bf16) * P * h);
    gk_gather(dx16, dsrc, k, P, h, xp, NULL, 0);
    std::vector<bf16> xph = host(xp, (size_t)P * h);
    for (int p = 0; p < P; p++)
        assert_memory_equal(&xph[(size_t)p * h], &x16[(size_t)(src[p] / k) * h], sizeof(bf16) * h);
    float *dyp32 = dev(yp), *dw = dev(w), *ddy = dev(dy), *y = dev(y0),
          *dwo = dev(std::vector<float>(P));
    gk_combine(y, dyp32, dw, dpos, T, k, h, 0);
    gk_combine_backward(ddy, dyp32, dw, dpos, T, k, h, dyp, dwo, NULL, 0);
    std::vector<double> yr((size_t)T * h), dypr((size_t)P * h), dwr(P);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < h; c++) {
            double a = y0[(size_t)t * h + c];
            for (int j = 0; j < k; j++) a += w[t * k + j] * yp[(size_t)pos[t * k + j] * h + c];
            yr[(size_t)t * h + c] = a;
        }
    for (int i = 0; i < P; i++) {
        int t = i / k;
        double d = 0;
        for (int c = 0; c < h; c++) {
            d += dy[(size_t)t * h + c] * yp[(size_t)pos[i] * h + c];
            dypr[(size_t)pos[i] * h + c] = w[i] * dy[(size_t)t * h + c];
        }
        dwr[i] = d;
    }
    close("combine", to_d(host(y, (size_t)T * h)), yr, 1e-5);
    close("combine backward d rows", to_d(host(dyp, (size_t)P * h)), dypr, 8e-3);
    close("combine backward d weight", to_d(host(dwo, P)), dwr, 1e-5);
    /* the rows' gradient back to the tokens: two bf16 rows a pair (gate, up), added to dx; width
     * 40: 16-byte loads, 41: element by element */
    for (int hh = 40; hh <= 41; hh++) {
        std::vector<bf16> g16 = to_bf16(randn((size_t)P * hh, 14)),
                          u16 = to_bf16(randn((size_t)P * hh, 15));
        std::vector<float> dx0 = randn((size_t)T * hh, 16);
        std::vector<double> dxr((size_t)T * hh), gd = to_d(g16), ud = to_d(u16);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < hh; c++) {
                double a = dx0[(size_t)t * hh + c];
                for (int j = 0; j < k; j++) {
                    size_t r = (size_t)pos[t * k + j] * hh + c;
                    a += gd[r] + ud[r];
                }
                dxr[(size_t)t * hh + c] = a;
            }
        bf16 *dg = dev(g16), *du = dev(u16);
        float *ddx = dev(dx0);
        assert_int_equal(gk_gather_sum(dg, du, dpos, T, k, hh, ddx, true, 0), cudaSuccess);
        close(hh == 40 ? "gather-sum (16-byte loads)" : "gather-sum",
              to_d(host(ddx, (size_t)T * hh)), dxr, 1e-5);
        cudaFree(dg), cudaFree(du), cudaFree(ddx);
    }
    cudaFree(dc), cudaFree(cnt), cudaFree(base), cudaFree(doff), cudaFree(dsrc), cudaFree(dpos);
    cudaFree(dx16), cudaFree(xp), cudaFree(dyp), cudaFree(dyp32), cudaFree(dw), cudaFree(ddy);
    cudaFree(y), cudaFree(dwo);
}

/* One attention shape: the tensor-core kernels (forward: o, log-sum-exp; backward: dq, dk, dv)
 * against exec_ref_attention{,_backward} per sequence, on bf16-rounded inputs; the backward run
 * twice must agree bit for bit. */
static void flash_case(int B, int S, int H, int KV, int dqk, int dv, int window, uint64_t seed)
{
    printf("attention B %d S %d heads %d/%d dims %d/%d window %d\n", B, S, H, KV, dqk, dv, window);
    size_t T = (size_t)B * S, nq = T * H * dqk, nk = T * KV * dqk, nv = T * KV * dv,
           no = T * H * dv;
    std::vector<bf16> q = to_bf16(randn(nq, seed)), k = to_bf16(randn(nk, seed + 1)),
                      v = to_bf16(randn(nv, seed + 2)), dout = to_bf16(randn(no, seed + 3));
    std::vector<double> qd = to_d(q), kd = to_d(k), vd = to_d(v), dod = to_d(dout);
    std::vector<double> or_(no), dqr(nq), dkr(nk), dvr(nv), lr_(T * H);
    double scale = 1.0 / sqrt((double)dqk);
    for (int b = 0; b < B; b++) {
        size_t t0 = (size_t)b * S;
        exec_ref_attention(&qd[t0 * H * dqk], &kd[t0 * KV * dqk], &vd[t0 * KV * dv], S, H, KV, dqk,
                           dv, window, scale, NULL, &or_[t0 * H * dv]);
        exec_ref_attention_backward(&qd[t0 * H * dqk], &kd[t0 * KV * dqk], &vd[t0 * KV * dv],
                                    &dod[t0 * H * dv], S, H, KV, dqk, dv, window, scale, NULL,
                                    &dqr[t0 * H * dqk], &dkr[t0 * KV * dqk], &dvr[t0 * KV * dv],
                                    NULL);
        for (int hh = 0; hh < H; hh++)
            for (int i = 0; i < S; i++) { /* base-2 log-sum-exp of the scaled scores */
                double mx = -HUGE_VAL, sum = 0;
                std::vector<double> z(S, -HUGE_VAL);
                for (int j = 0; j <= i; j++) {
                    if (window > 0 && j <= i - window) continue;
                    double d = 0;
                    for (int c = 0; c < dqk; c++)
                        d += qd[((t0 + i) * H + hh) * dqk + c] *
                             kd[((t0 + j) * KV + hh / (H / KV)) * dqk + c];
                    z[j] = d * scale;
                    mx = fmax(mx, z[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(z[j] - mx);
                lr_[((size_t)b * H + hh) * S + i] = (mx + log(sum)) / log(2.0);
            }
    }
    bf16 *dq16 = dev(q), *dk16 = dev(k), *dv16 = dev(v), *ddo = dev(dout);
    bf16 *o = dev(std::vector<bf16>(no));
    float *lse = dev(std::vector<float>(T * H)), *delta = dev(std::vector<float>(T * H));
    float *gq = dev(std::vector<float>(nq)), *gk = dev(std::vector<float>(nk)),
          *gv = dev(std::vector<float>(nv));
    assert_true(gk_flash_supported(dqk, dv));
    assert_int_equal(gk_flash_prepare(dqk, dv), cudaSuccess);
    assert_int_equal(gk_flash_forward(dq16, dk16, dv16, B, S, H, KV, dqk, dv, window, o, lse, 0),
                     cudaSuccess);
    assert_int_equal(gk_flash_backward(dq16, dk16, dv16, o, ddo, lse, B, S, H, KV, dqk, dv, window,
                                       delta, gq, gk, gv, 0),
                     cudaSuccess);
    close("attention out", to_d(host(o, no)), or_, 8e-3);
    close("attention log-sum-exp", to_d(host(lse, T * H)), lr_, 1e-5);
    /* cuDNN's fused attention, where the build has it: the same references, the same tolerances;
     * head dims that are multiples of 8 up to 128 (and MLA's 192/128) must be taken */
    char why[256];
    bf16 *o2 = dev(std::vector<bf16>(no));
    float *lse2 = dev(std::vector<float>(T * H));
    bool must =
        dqk % 8 == 0 && dv % 8 == 0 && ((dqk <= 128 && dv <= 128) || (dqk == 192 && dv == 128));
    if (gk_cudnn_forward(dq16, dk16, dv16, B, S, H, KV, dqk, dv, window, NULL, o2, lse2, 0, why,
                         sizeof why)) {
        close("cuDNN attention out", to_d(host(o2, no)), or_, 8e-3);
        close("cuDNN attention log-sum-exp", to_d(host(lse2, T * H)), lr_, 1e-5);
        float *cq = dev(std::vector<float>(nq)), *ck = dev(std::vector<float>(nk)),
              *cv = dev(std::vector<float>(nv));
        bf16 *scratch = dev(std::vector<bf16>(nq)), *sk = dev(std::vector<bf16>(nk)),
             *sv = dev(std::vector<bf16>(nv));
        /* both engines (dQ summed atomically, and the deterministic one) against the reference;
         * the deterministic one twice: the same bits */
        std::vector<float> c1, c2, c3;
        for (int det = 0; det < 2; det++) {
            if (!gk_cudnn_backward(dq16, dk16, dv16, o2, ddo, lse2, B, S, H, KV, dqk, dv, window,
                                   NULL, NULL, det, cq, ck, cv, scratch, sk, sv, 0, why,
                                   sizeof why))
                fail_msg("%s", why);
            close(det ? "cuDNN attention dq (deterministic)" : "cuDNN attention dq",
                  to_d(host(cq, nq)), dqr, 1e-2);
            close("cuDNN attention dk", to_d(host(ck, nk)), dkr, 1e-2);
            close("cuDNN attention dv", to_d(host(cv, nv)), dvr, 1e-2);
        }
        c1 = host(cq, nq), c2 = host(ck, nk), c3 = host(cv, nv);
        if (!gk_cudnn_backward(dq16, dk16, dv16, o2, ddo, lse2, B, S, H, KV, dqk, dv, window, NULL,
                               NULL, true, cq, ck, cv, scratch, sk, sv, 0, why, sizeof why))
            fail_msg("%s", why);
        bool same = host(cq, nq) == c1 && host(ck, nk) == c2 && host(cv, nv) == c3;
        printf("  cuDNN deterministic backward twice: %s\n",
               same ? "bit-identical" : "DIFFERENT bits");
        assert_true(same);
        cudaFree(cq), cudaFree(ck), cudaFree(cv), cudaFree(scratch), cudaFree(sk), cudaFree(sv);
    } else {
        printf("  cuDNN: %s\n", why);
#ifdef MOEPLAN_HAVE_CUDNN
        assert_false(must);
#endif
    }
    cudaFree(o2), cudaFree(lse2);
    std::vector<float> q1 = host(gq, nq), k1 = host(gk, nk), v1 = host(gv, nv);
    close("attention dq", to_d(q1), dqr, 1e-2);
    close("attention dk", to_d(k1), dkr, 1e-2);
    close("attention dv", to_d(v1), dvr, 1e-2);
    assert_int_equal(gk_flash_backward(dq16, dk16, dv16, o, ddo, lse, B, S, H, KV, dqk, dv, window,
                                       delta, gq, gk, gv, 0),
                     cudaSuccess);
    assert_true(host(gq, nq) == q1 && host(gk, nk) == k1 && host(gv, nv) == v1);
    cudaFree(dq16), cudaFree(dk16), cudaFree(dv16), cudaFree(ddo), cudaFree(o), cudaFree(lse);
    cudaFree(delta), cudaFree(gq), cudaFree(gk), cudaFree(gv);
}

/* Every compiled width, partial tiles (S not a multiple of 64), GQA, a sliding window, head dims
 * that are not multiples of 8 (the unvectorized loads). */
static void test_flash_attention(void **state)
{
    (void)state;
    flash_case(2, 200, 4, 2, 64, 64, 0, 20);
    flash_case(1, 130, 2, 2, 192, 128, 0, 30);
    flash_case(2, 150, 3, 1, 16, 16, 37, 40);
    flash_case(1, 97, 2, 1, 20, 12, 0, 50);
    flash_case(1, 70, 2, 2, 128, 128, 64, 60);
    flash_case(1, 66, 1, 1, 256, 200, 0, 70);
    assert_false(gk_flash_supported(320, 128));
}

/* The proxies' attention at sequence 4096 (GQA 128, MLA 192/128, 64-wide heads with a window):
 * cuDNN's forward and backward against our kernels (o, dq, dk, dv within 1% of their largest
 * value, lse within 1e-4), and the time of each (printed, not judged: bench/ compares speeds).
 * Skipped where the build has no cuDNN. */
static void test_cudnn_attention(void **state)
{
    (void)state;
#ifndef MOEPLAN_HAVE_CUDNN
    skip();
#else
    char ver[64];
    printf("cuDNN %s\n", gk_cudnn_version(ver, sizeof ver));
    struct shape {
        int B, S, H, KV, dqk, dv, window;
    } shapes[] = {{2, 4096, 16, 4, 128, 128, 0},
                  {1, 4096, 16, 16, 192, 128, 0},
                  {2, 4096, 16, 2, 64, 64, 128}};
    for (const struct shape &c : shapes) {
        size_t T = (size_t)c.B * c.S, no = T * c.H * c.dv;
        std::vector<bf16> q = to_bf16(randn(T * c.H * c.dqk, 81)),
                          k = to_bf16(randn(T * c.KV * c.dqk, 82)),
                          v = to_bf16(randn(T * c.KV * c.dv, 83));
        bf16 *dq16 = dev(q), *dk16 = dev(k), *dv16 = dev(v);
        bf16 *o1 = dev(std::vector<bf16>(no)), *o2 = dev(std::vector<bf16>(no));
        float *l1 = dev(std::vector<float>(T * c.H)), *l2 = dev(std::vector<float>(T * c.H));
        char why[256];
        assert_int_equal(gk_flash_prepare(c.dqk, c.dv), cudaSuccess);
        cudaEvent_t e0, e1, e2;
        cudaEventCreate(&e0), cudaEventCreate(&e1), cudaEventCreate(&e2);
        const int reps = 10;
        bool ok = gk_cudnn_forward(dq16, dk16, dv16, c.B, c.S, c.H, c.KV, c.dqk, c.dv, c.window,
                                   NULL, o2, l2, 0, why, sizeof why); /* builds the plan */
        if (!ok) fail_msg("%s", why);
        cudaEventRecord(e0);
        for (int r = 0; r < reps; r++)
            assert_int_equal(gk_flash_forward(dq16, dk16, dv16, c.B, c.S, c.H, c.KV, c.dqk, c.dv,
                                              c.window, o1, l1, 0),
                             cudaSuccess);
        cudaEventRecord(e1);
        for (int r = 0; r < reps && ok; r++)
            ok = gk_cudnn_forward(dq16, dk16, dv16, c.B, c.S, c.H, c.KV, c.dqk, c.dv, c.window,
                                  NULL, o2, l2, 0, why, sizeof why);
        cudaEventRecord(e2);
        cudaEventSynchronize(e2);
        if (!ok) fail_msg("%s", why);
        float ours, theirs;
        cudaEventElapsedTime(&ours, e0, e1), cudaEventElapsedTime(&theirs, e1, e2);
        double keys = c.window > 0 ? c.window : (c.S + 1) / 2.0; /* keys a query sees */
        double flops = 2.0 * T * c.H * keys * (c.dqk + c.dv);
        printf("attention forward B %d S %d heads %d/%d dims %d/%d window %d: ours %.3f ms (%.0f "
               "TFLOPS), cuDNN %.3f ms (%.0f TFLOPS)\n",
               c.B, c.S, c.H, c.KV, c.dqk, c.dv, c.window, ours / reps,
               flops / (ours / reps * 1e-3) / 1e12, theirs / reps,
               flops / (theirs / reps * 1e-3) / 1e12);
        close("cuDNN against ours: out", to_d(host(o2, no)), to_d(host(o1, no)), 1e-2);
        std::vector<double> a = to_d(host(l1, T * c.H)), b = to_d(host(l2, T * c.H));
        moe_expect_near("cuDNN against ours: lse", b.data(), a.data(), a.size(), 0.0, 1e-4);
        /* the backward: ours against cuDNN's (both fp32 gradients), from our forward */
        size_t nq = T * c.H * c.dqk, nk = T * c.KV * c.dqk, nv = T * c.KV * c.dv;
        bf16 *ddo = dev(to_bf16(randn(no, 84)));
        float *delta = dev(std::vector<float>(T * c.H)), *gq = dev(std::vector<float>(nq)),
              *gk = dev(std::vector<float>(nk)), *gv = dev(std::vector<float>(nv));
        float *hq = dev(std::vector<float>(nq)), *hk = dev(std::vector<float>(nk)),
              *hv = dev(std::vector<float>(nv));
        bf16 *scratch = dev(std::vector<bf16>(nq)), *sk = dev(std::vector<bf16>(nk)),
             *sv = dev(std::vector<bf16>(nv));
        float det_ms = 0;
        for (int det = 1; det >= 0; det--) { /* the last: atomic dQ, compared below */
            ok = gk_cudnn_backward(dq16, dk16, dv16, o1, ddo, l1, c.B, c.S, c.H, c.KV, c.dqk, c.dv,
                                   c.window, NULL, NULL, det, hq, hk, hv, scratch, sk, sv, 0, why,
                                   sizeof why);
            if (!ok) fail_msg("%s", why);
            cudaEventRecord(e0);
            for (int r = 0; r < reps; r++)
                assert_int_equal(gk_flash_backward(dq16, dk16, dv16, o1, ddo, l1, c.B, c.S, c.H,
                                                   c.KV, c.dqk, c.dv, c.window, delta, gq, gk, gv,
                                                   0),
                                 cudaSuccess);
            cudaEventRecord(e1);
            for (int r = 0; r < reps && ok; r++)
                ok = gk_cudnn_backward(dq16, dk16, dv16, o1, ddo, l1, c.B, c.S, c.H, c.KV, c.dqk,
                                       c.dv, c.window, NULL, NULL, det, hq, hk, hv, scratch, sk, sv,
                                       0, why, sizeof why);
            cudaEventRecord(e2);
            cudaEventSynchronize(e2);
            if (!ok) fail_msg("%s", why);
            cudaEventElapsedTime(&ours, e0, e1), cudaEventElapsedTime(&theirs, e1, e2);
            if (det) det_ms = theirs / reps;
        }
        printf("attention backward: ours %.3f ms (%.0f TFLOPS), cuDNN %.3f ms (%.0f TFLOPS), cuDNN "
               "deterministic %.3f ms (%.0f TFLOPS)\n",
               ours / reps, 2.5 * flops / (ours / reps * 1e-3) / 1e12, theirs / reps,
               2.5 * flops / (theirs / reps * 1e-3) / 1e12, det_ms,
               2.5 * flops / (det_ms * 1e-3) / 1e12);
        close("cuDNN against ours: dq", to_d(host(hq, nq)), to_d(host(gq, nq)), 1e-2);
        close("cuDNN against ours: dk", to_d(host(hk, nk)), to_d(host(gk, nk)), 1e-2);
        close("cuDNN against ours: dv", to_d(host(hv, nv)), to_d(host(gv, nv)), 1e-2);
        cudaFree(ddo), cudaFree(delta), cudaFree(gq), cudaFree(gk), cudaFree(gv);
        cudaFree(hq), cudaFree(hk), cudaFree(hv), cudaFree(scratch), cudaFree(sk), cudaFree(sv);
        cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2);
        cudaFree(dq16), cudaFree(dk16), cudaFree(dv16), cudaFree(o1), cudaFree(o2);
        cudaFree(l1), cudaFree(l2);
    }
#endif
}

/* Attention sinks inside cuDNN's graph (gk_cudnn_forward / _backward with sink, what
 * Transformer Engine runs and calibrate times) against exec_ref_attention{,_backward} with the
 * same sinks: o within 8e-3, lse within 1e-5, dq / dk / dv within 1e-2 of their largest reference
 * value (the tolerances of the plain kernels), the sinks' gradient within 1e-2 of its largest;
 * GQA with and without a sliding window, 64-wide heads as gpt-oss's. Skipped where the build has
 * no cuDNN; a cuDNN older than 9.13 (no sinks) says so and passes only if it refuses. */
static void test_cudnn_sinks(void **state)
{
    (void)state;
#ifndef MOEPLAN_HAVE_CUDNN
    skip();
#else
    struct shape {
        int B, S, H, KV, dqk, dv, window;
    } shapes[] = {{2, 160, 4, 2, 64, 64, 0}, {1, 200, 4, 1, 64, 64, 48}};
    for (const struct shape &c : shapes) {
        printf("cuDNN attention with sinks: B %d S %d heads %d/%d dims %d/%d window %d\n", c.B, c.S,
               c.H, c.KV, c.dqk, c.dv, c.window);
        size_t T = (size_t)c.B * c.S, nq = T * c.H * c.dqk, nk = T * c.KV * c.dqk,
               nv = T * c.KV * c.dv, no = T * c.H * c.dv;
        std::vector<bf16> q = to_bf16(randn(nq, 101)), k = to_bf16(randn(nk, 102)),
                          v = to_bf16(randn(nv, 103)), dout = to_bf16(randn(no, 104));
        std::vector<float> sinkf = randn(c.H, 105);
        std::vector<double> qd = to_d(q), kd = to_d(k), vd = to_d(v), dod = to_d(dout);
        std::vector<double> sink(c.H), or_(no), dqr(nq), dkr(nk), dvr(nv), lr_(T * c.H),
            dsr(c.H, 0.0);
        for (int h = 0; h < c.H; h++) sink[h] = 2.0 * sinkf[h]; /* comparable to the scores */
        for (int h = 0; h < c.H; h++) sinkf[h] = (float)sink[h];
        double scale = 1.0 / sqrt((double)c.dqk);
        for (int b = 0; b < c.B; b++) {
            size_t t0 = (size_t)b * c.S;
            const double *qb = &qd[t0 * c.H * c.dqk], *kb = &kd[t0 * c.KV * c.dqk],
                         *vb = &vd[t0 * c.KV * c.dv];
            exec_ref_attention(qb, kb, vb, c.S, c.H, c.KV, c.dqk, c.dv, c.window, scale,
                               sink.data(), &or_[t0 * c.H * c.dv]);
            exec_ref_attention_backward(qb, kb, vb, &dod[t0 * c.H * c.dv], c.S, c.H, c.KV, c.dqk,
                                        c.dv, c.window, scale, sink.data(), &dqr[t0 * c.H * c.dqk],
                                        &dkr[t0 * c.KV * c.dqk], &dvr[t0 * c.KV * c.dv],
                                        dsr.data());
            for (int hh = 0; hh < c.H; hh++)
                for (int i = 0; i < c.S; i++) { /* base 2, the sink one more term */
                    std::vector<double> z;
                    double mx = sink[hh], sum = 0;
                    for (int j = 0; j <= i; j++) {
                        if (c.window > 0 && j <= i - c.window) continue;
                        double d = 0;
                        for (int e = 0; e < c.dqk; e++)
                            d += qb[((size_t)i * c.H + hh) * c.dqk + e] *
                                 kb[((size_t)j * c.KV + hh / (c.H / c.KV)) * c.dqk + e];
                        z.push_back(d * scale);
                        mx = fmax(mx, d * scale);
                    }
                    for (double x : z) sum += exp(x - mx);
                    sum += exp(sink[hh] - mx);
                    lr_[((size_t)b * c.H + hh) * c.S + i] = (mx + log(sum)) / log(2.0);
                }
        }
        bf16 *dq16 = dev(q), *dk16 = dev(k), *dv16 = dev(v), *ddo = dev(dout);
        bf16 *o = dev(std::vector<bf16>(no));
        float *lse = dev(std::vector<float>(T * c.H)), *sink_d = dev(sinkf), *dsink_d = dev(sinkf);
        float *gq = dev(std::vector<float>(nq)), *gk = dev(std::vector<float>(nk)),
              *gv = dev(std::vector<float>(nv));
        bf16 *s1 = dev(std::vector<bf16>(nq)), *s2 = dev(std::vector<bf16>(nk)),
             *s3 = dev(std::vector<bf16>(nv));
        char why[256];
        if (!gk_cudnn_forward(dq16, dk16, dv16, c.B, c.S, c.H, c.KV, c.dqk, c.dv, c.window, sink_d,
                              o, lse, 0, why, sizeof why)) {
            char ver[64];
            int major = 0, minor = 0;
            printf("  cuDNN %s: %s\n", gk_cudnn_version(ver, sizeof ver), why);
            assert_int_equal(sscanf(ver, "%d.%d", &major, &minor), 2);
            assert_true(major * 100 + minor < 913);
        } else {
            close("cuDNN sinks: out", to_d(host(o, no)), or_, 8e-3);
            close("cuDNN sinks: log-sum-exp", to_d(host(lse, T * c.H)), lr_, 1e-5);
            if (!gk_cudnn_backward(dq16, dk16, dv16, o, ddo, lse, c.B, c.S, c.H, c.KV, c.dqk, c.dv,
                                   c.window, sink_d, dsink_d, GK_CUDNN_DETERMINISTIC, gq, gk, gv,
                                   s1, s2, s3, 0, why, sizeof why))
                fail_msg("%s", why);
            close("cuDNN sinks: dq", to_d(host(gq, nq)), dqr, 1e-2);
            close("cuDNN sinks: dk", to_d(host(gk, nk)), dkr, 1e-2);
            close("cuDNN sinks: dv", to_d(host(gv, nv)), dvr, 1e-2);
            close("cuDNN sinks: dsink", to_d(host(dsink_d, (size_t)c.H)), dsr, 1e-2);
        }
        cudaFree(dq16), cudaFree(dk16), cudaFree(dv16), cudaFree(ddo), cudaFree(o), cudaFree(lse);
        cudaFree(sink_d), cudaFree(dsink_d), cudaFree(gq), cudaFree(gk), cudaFree(gv);
        cudaFree(s1), cudaFree(s2), cudaFree(s3);
    }
    gk_cudnn_release(0);
#endif
}

/* cuDNN's deterministic backward from two threads on their own streams at once, against its bits
 * alone (the other engine sums dQ atomically: its bits may change from run to run anyway; it is
 * checked against the deterministic one's values first). */
static void test_cudnn_threads(void **state)
{
    (void)state;
#ifndef MOEPLAN_HAVE_CUDNN
    skip();
#else
    const int B = 2, S = 1024, H = 8, KV = 2, dqk = 64, dv = 64;
    size_t T = (size_t)B * S, nq = T * H * dqk, nk = T * KV * dqk, nv = T * KV * dv,
           no = T * H * dv;
    bf16 *q = dev(to_bf16(randn(nq, 91))), *k = dev(to_bf16(randn(nk, 92))),
         *v = dev(to_bf16(randn(nv, 93))), *dout = dev(to_bf16(randn(no, 94)));
    bf16 *o = dev(std::vector<bf16>(no));
    float *lse = dev(std::vector<float>(T * H));
    char why[256];
    if (!gk_cudnn_forward(q, k, v, B, S, H, KV, dqk, dv, 0, NULL, o, lse, 0, why, sizeof why))
        fail_msg("%s", why);
    struct out {
        float *dq, *dk, *dv;
        bf16 *s1, *s2, *s3;
        cudaStream_t st;
        int differ;
    } w[3];
    for (auto &x : w) {
        x.dq = dev(std::vector<float>(nq)), x.dk = dev(std::vector<float>(nk));
        x.dv = dev(std::vector<float>(nv));
        x.s1 = dev(std::vector<bf16>(nq)), x.s2 = dev(std::vector<bf16>(nk));
        x.s3 = dev(std::vector<bf16>(nv));
        cudaStreamCreate(&x.st);
        x.differ = 0;
    }
    if (!gk_cudnn_backward(q, k, v, o, dout, lse, B, S, H, KV, dqk, dv, 0, NULL, NULL, true,
                           w[0].dq, w[0].dk, w[0].dv, w[0].s1, w[0].s2, w[0].s3, w[0].st, why,
                           sizeof why))
        fail_msg("%s", why);
    cudaStreamSynchronize(w[0].st);
    std::vector<float> r1 = host(w[0].dq, nq), r2 = host(w[0].dk, nk), r3 = host(w[0].dv, nv);
    /* the other engine (the executor's where the deterministic one's workspace does not fit):
     * the same gradients but for the order of dQ's sums, within 1% of each one's largest */
    if (!gk_cudnn_backward(q, k, v, o, dout, lse, B, S, H, KV, dqk, dv, 0, NULL, NULL, false,
                           w[1].dq, w[1].dk, w[1].dv, w[1].s1, w[1].s2, w[1].s3, w[1].st, why,
                           sizeof why))
        fail_msg("%s", why);
    cudaStreamSynchronize(w[1].st);
    const std::vector<float> *ref[3] = {&r1, &r2, &r3};
    std::vector<float> nd[3] = {host(w[1].dq, nq), host(w[1].dk, nk), host(w[1].dv, nv)};
    for (int t = 0; t < 3; t++) {
        double big = 0, diff = 0;
        for (size_t i = 0; i < ref[t]->size(); i++) {
            big = fmax(big, fabs((*ref[t])[i]));
            diff = fmax(diff, fabs((*ref[t])[i] - nd[t][i]));
        }
        printf("cuDNN's non-deterministic backward: d%s within %.2e of the deterministic (largest "
               "%.3g)\n",
               t == 0   ? "q"
               : t == 1 ? "k"
                        : "v",
               diff, big);
        assert_true(diff <= 0.01 * big);
    }
    auto work = [&](int i) {
        cudaSetDevice(0);
        for (int rep = 0; rep < 20; rep++) {
            char e[256];
            if (!gk_cudnn_backward(q, k, v, o, dout, lse, B, S, H, KV, dqk, dv, 0, NULL, NULL, true,
                                   w[i].dq, w[i].dk, w[i].dv, w[i].s1, w[i].s2, w[i].s3, w[i].st, e,
                                   sizeof e))
                w[i].differ = -1000;
            cudaStreamSynchronize(w[i].st);
            std::vector<float> a(nq), b(nk), c(nv);
            cudaMemcpy(a.data(), w[i].dq, nq * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(b.data(), w[i].dk, nk * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(c.data(), w[i].dv, nv * 4, cudaMemcpyDeviceToHost);
            w[i].differ += !(a == r1 && b == r2 && c == r3);
        }
    };
    std::thread t1(work, 1), t2(work, 2);
    t1.join(), t2.join();
    printf("cuDNN backward from two threads at once, 20 runs each: %d and %d differ from the "
           "single-thread bits\n",
           w[1].differ, w[2].differ);
    assert_int_equal(w[1].differ, 0);
    assert_int_equal(w[2].differ, 0);
    for (auto &x : w) {
        cudaFree(x.dq), cudaFree(x.dk), cudaFree(x.dv), cudaFree(x.s1), cudaFree(x.s2);
        cudaFree(x.s3), cudaStreamDestroy(x.st);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(o), cudaFree(lse);
#endif
}

/* x (R x C) transposed (C x R) */
static std::vector<float> transposed(const std::vector<float> &x, int R, int C)
{
    std::vector<float> t((size_t)R * C);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) t[(size_t)c * R + r] = x[(size_t)r * C + c];
    return t;
}

/* gk_fp8_cast's copy q (rows x cols, row-major) and its factors against exec_fp8_quantize of the
 * same values, bit for bit (the factor is the reference's 1 / scale, in float); `what` names
 * the case in a failure. */
static void expect_quantized(const char *what, const std::vector<float> &x, int rows, int cols,
                             int how, int e5m2, const unsigned char *dq, int ldq,
                             const float *dsinv)
{
    std::vector<unsigned char> q((size_t)rows * cols);
    std::vector<float> sc(exec_fp8_scale_count(rows, cols, (enum exec_fp8_scaling)how));
    exec_fp8_quantize(x.data(), rows, cols, (enum exec_fp8_scaling)how, (enum exec_fp8)e5m2,
                      q.data(), sc.data());
    std::vector<unsigned char> gq = host(dq, (size_t)rows * ldq);
    std::vector<float> gs = host(dsinv, exec_fp8_factor_count(how, rows, cols));
    int nbc = (cols + 127) / 128;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            if (gq[(size_t)r * ldq + c] != q[i])
                fail_msg("%s: value (%d, %d) (%a) 0x%02x, the reference's 0x%02x", what, r, c,
                         (double)x[i], gq[(size_t)r * ldq + c], q[i]);
            size_t at = how == EXEC_FP8_TENSOR       ? 0
                        : how == EXEC_FP8_TILE_1X128 ? (size_t)r * nbc + c / 128
                                                     : (size_t)(r / 128) * nbc + c / 128;
            float want = 1.0f / sc[at], got = gs[exec_fp8_factor_at(how, rows, cols, r, c)];
            if (memcmp(&want, &got, sizeof got))
                fail_msg("%s: the factor of (%d, %d) %a, the reference's 1 / %a = %a", what, r, c,
                         (double)got, (double)sc[at], (double)want);
        }
}

/* FP8 quantization against ref_fp8.c, bit for bit (whose conversion test_fp8_host holds to
 * CUDA's own): per-tensor, 1 x 128 and 128 x 128 scaling, E4M3 and E5M2, the row-major copy and
 * the transposed one (against the reference quantizing the transpose; its columns beyond the
 * rows zero), from a strided bf16 input; shapes with partial tiles, rows of magnitudes
 * 2^-12 .. 2^7, a zero tile and a row with an infinity. */
static void test_fp8_quantize(void **state)
{
    (void)state;
    if (!gpus()) skip();
    /* 128 x 256 and 200 x 384 take the 16-byte path (the latter with partial tiles of rows) */
    static const int shapes[][2] = {{300, 1000}, {128, 256}, {1, 5}, {257, 129}, {200, 384}};
    unsigned *work = dev(std::vector<unsigned>(1));
    int checked = 0;
    for (auto &sh : shapes) {
        int R = sh[0], C = sh[1], ldx = C + 8, ldt = (R + 15) / 16 * 16;
        std::vector<float> x = randn((size_t)R * C, 700 + R);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) x[(size_t)r * C + c] *= ldexpf(1.0f, r % 20 - 12);
        if (R > 1 && C > 128)
            for (int c = 0; c < 128; c++) x[C + c] = 0.0f; /* row 1's first tile: zeros */
        if (R > 2) x[2 * (size_t)C + 3] = INFINITY;
        std::vector<bf16> x16((size_t)R * ldx, __float2bfloat16(1e30f)); /* beyond C: unread */
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                x16[(size_t)r * ldx + c] = __float2bfloat16(x[(size_t)r * C + c]);
                x[(size_t)r * C + c] = __bfloat162float(x16[(size_t)r * ldx + c]);
            }
        std::vector<float> xt = transposed(x, R, C);
        bf16 *d16 = dev(x16);
        unsigned char *dq = dev(std::vector<unsigned char>((size_t)R * C)),
                      *dqt = dev(std::vector<unsigned char>((size_t)C * ldt, 0xFF));
        float *ds = dev(std::vector<float>(exec_fp8_factor_count(EXEC_FP8_TILE_1X128, R, C) + 64)),
              *dst =
                  dev(std::vector<float>(exec_fp8_factor_count(EXEC_FP8_TILE_1X128, C, ldt) + 64));
        for (int how = 0; how < 3; how++)
            for (int f = 0; f < 2; f++) {
                char what[96];
                assert_int_equal(
                    gk_fp8_cast(d16, ldx, R, C, how, f, dq, ds, dqt, ldt, dst, work, 0),
                    cudaSuccess);
                snprintf(what, sizeof what, "%d x %d, scaling %d, %s", R, C, how,
                         f ? "e5m2" : "e4m3");
                expect_quantized(what, x, R, C, how, f, dq, C, ds);
                snprintf(what, sizeof what, "%d x %d transposed, scaling %d, %s", R, C, how,
                         f ? "e5m2" : "e4m3");
                std::vector<unsigned char> gt = host(dqt, (size_t)C * ldt);
                for (int c = 0; c < C; c++)
                    for (int r = R; r < ldt; r++)
                        if (gt[(size_t)c * ldt + r])
                            fail_msg("%s: padding (%d, %d) 0x%02x, not zero", what, c, r,
                                     gt[(size_t)c * ldt + r]);
                /* the transposed copy's factors: its own tiles (x's columns), else x's */
                expect_quantized(what, xt, C, R, how, f, dqt, ldt, dst);
                checked += 2;
            }
        cudaFree(d16), cudaFree(dq), cudaFree(dqt), cudaFree(ds), cudaFree(dst);
    }
    /* a batch of three matrices (a weight's experts), each its own scales, as one by one */
    {
        const int R = 144, C = 272, B = 3;
        size_t n = (size_t)R * C;
        std::vector<float> x = randn(n * B, 731);
        for (size_t i = 0; i < x.size(); i++) x[i] *= ldexpf(1.0f, (int)(i / n) * 3 - 3);
        std::vector<bf16> x16 = to_bf16(x);
        for (size_t i = 0; i < x.size(); i++) x[i] = __bfloat162float(x16[i]);
        bf16 *d16 = dev(x16);
        unsigned *works = dev(std::vector<unsigned>(B));
        unsigned char *dq = dev(std::vector<unsigned char>(n * B)),
                      *dqt = dev(std::vector<unsigned char>(n * B));
        size_t ss = exec_fp8_factor_count(EXEC_FP8_TILE_1X128, R, C) +
                    exec_fp8_factor_count(EXEC_FP8_TILE_1X128, C, R);
        float *dsc = dev(std::vector<float>(ss * B));
        for (int how = 0; how < 3; how++) {
            size_t fs = exec_fp8_factor_count(how, R, C), ft = exec_fp8_factor_count(how, C, R);
            assert_int_equal(gk_fp8_cast_batch(d16, C, R, C, how, 0, dq, dsc, dqt, R, dsc + fs,
                                               works, NULL, B, n, n, fs + ft, 0),
                             cudaSuccess);
            for (int z = 0; z < B; z++) {
                std::vector<float> xz(x.begin() + z * n, x.begin() + (z + 1) * n);
                char what[96];
                snprintf(what, sizeof what, "batch matrix %d, scaling %d", z, how);
                expect_quantized(what, xz, R, C, how, 0, dq + z * n, C, dsc + z * (fs + ft));
                snprintf(what, sizeof what, "batch matrix %d transposed, scaling %d", z, how);
                expect_quantized(what, transposed(xz, R, C), C, R, how, 0, dqt + z * n, R,
                                 dsc + z * (fs + ft) + fs);
                checked += 2;
            }
        }
        cudaFree(d16), cudaFree(works), cudaFree(dq), cudaFree(dqt), cudaFree(dsc);
    }
    cudaFree(work);
    printf("fp8 quantize: %d shape x scaling x format x copy cases, every byte and factor equal "
           "to the reference's\n",
           checked);
}

/* The experts' SwiGLU with its output (forward) or its gradients (backward) quantized in 1 x 128
 * tiles into each expert's region, against the unfused pair it replaces (gk_swiglu or
 * gk_swiglu_backward, then gk_fp8_cast on each expert's rows), bit for bit: the bf16 output, each
 * region's bytes and factors, the transposed copies with their zero padding. Four experts of 0,
 * 37, 130 and 3 rows (the tail split, exec_fp8_factor_at, in three of them), widths of 2 tiles
 * and a partial one (272) and of 3 tiles (384); E4M3, and E5M2 gradients; the backward both in
 * 1 x 128 tiles and per tensor (each expert's scale from the amax gk_swiglu_backward keeps). */
static void test_fp8_swiglu_fused(void **state)
{
    (void)state;
    if (!gpus()) skip();
    const int E = 4, off[E + 1] = {0, 0, 37, 167, 170}, R = off[E];
    int *doff = dev(std::vector<int>(off, off + E + 1));
    unsigned *work = dev(std::vector<unsigned>(1));
    int checked = 0;
    for (int cols : {272, 384}) {
        size_t n = (size_t)R * cols, qo[E + 1], so[E + 1], sto[E + 1];
        exec_fp8_regions(off, E, cols, qo, so, sto);
        std::vector<bf16> g = to_bf16(randn(n, 901, 2.0)), u = to_bf16(randn(n, 902, 2.0)),
                          dh = to_bf16(randn(n, 903, 1e-3));
        bf16 *dg = dev(g), *du = dev(u), *ddh = dev(dh), *hm = dev(std::vector<bf16>(n)),
             *hr = dev(std::vector<bf16>(n)), *gr = dev(std::vector<bf16>(n)),
             *ur = dev(std::vector<bf16>(n));
        size_t fmax_ = so[E] > sto[E] ? so[E] : sto[E];
        unsigned char *q[4],
            *qr[4]; /* fused and reference: row-major g/hm, its transpose, u, u^T */
        float *sf[4], *sr[4];
        for (int i = 0; i < 4; i++) {
            q[i] = dev(std::vector<unsigned char>(qo[E] + 16, 0x5A));
            qr[i] = dev(std::vector<unsigned char>(qo[E] + 16, 0x5A));
            sf[i] = dev(std::vector<float>(fmax_ + 4, -1.0f));
            sr[i] = dev(std::vector<float>(fmax_ + 4, -1.0f));
        }
        /* compares expert e's copy i (rows x K, as exec_fp8_factor_at lays out its factors,
         * scaled `how`) */
        auto same = [&](const char *what, int how, int i, int e, bool t, int rows, int K) {
            size_t at = qo[e], f0 = t ? sto[e] : so[e];
            std::vector<unsigned char> a = host(q[i] + at, (size_t)rows * K),
                                       b = host(qr[i] + at, (size_t)rows * K);
            size_t nf = exec_fp8_factor_count(how, rows, K);
            std::vector<float> fa = host(sf[i] + f0, nf), fb = host(sr[i] + f0, nf);
            if (a != b) fail_msg("%s, width %d, expert %d: the bytes differ", what, cols, e);
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < K; c += 128) {
                    size_t x = exec_fp8_factor_at(how, rows, K, r, c);
                    if (memcmp(&fa[x], &fb[x], sizeof(float)))
                        fail_msg("%s, width %d, expert %d: the factor of (%d, %d) %a, unfused %a",
                                 what, cols, e, r, c, (double)fa[x], (double)fb[x]);
                }
            checked++;
        };
        /* the forward: hm, quantized for the down GEMM */
        assert_int_equal(
            gk_fp8_swiglu_forward(dg, du, doff, off, E, cols, 1.0f, 0.0f, 0, hm, q[0], sf[0], 0),
            cudaSuccess);
        assert_int_equal(gk_swiglu(dg, du, hr, n, 1.0f, 0.0f, NULL, 0), cudaSuccess);
        for (int e = 0; e < E; e++)
            assert_int_equal(gk_fp8_cast(hr + (size_t)off[e] * cols, cols, off[e + 1] - off[e],
                                         cols, EXEC_FP8_TILE_1X128, 0, qr[0] + qo[e], sr[0] + so[e],
                                         NULL, 0, NULL, work, 0),
                             cudaSuccess);
        if (host(hm, n) != host(hr, n)) fail_msg("fused SwiGLU forward: hm differs");
        for (int e = 0; e < E; e++)
            same("fused SwiGLU forward", EXEC_FP8_TILE_1X128, 0, e, false, off[e + 1] - off[e],
                 cols);
        /* the backward: dg and du, each both ways; 1 x 128 tiles, and per tensor from the
         * experts' amax that a pass of gk_swiglu_backward writing nothing else keeps */
        unsigned *amax = dev(std::vector<unsigned>(2 * E));
        struct gk_amax_rows am = {doff, E, cols, {amax, amax + E}};
        for (int pt = 0; pt < 2; pt++)
            for (int e5 = 0; e5 < 2; e5++) {
                int how = pt ? EXEC_FP8_TENSOR : EXEC_FP8_TILE_1X128;
                if (pt) {
                    assert_int_equal(cudaMemset(amax, 0, sizeof(unsigned) * 2 * E), cudaSuccess);
                    assert_int_equal(
                        gk_swiglu_backward(dg, du, ddh, NULL, NULL, n, 1.0f, 0.0f, &am, 0),
                        cudaSuccess);
                }
                assert_int_equal(gk_fp8_swiglu_backward(dg, du, ddh, doff, off, E, cols, 1.0f, 0.0f,
                                                        e5, pt ? amax : NULL, q[0], q[1], sf[0],
                                                        sf[1], q[2], q[3], sf[2], sf[3], 0),
                                 cudaSuccess);
                assert_int_equal(gk_swiglu_backward(dg, du, ddh, gr, ur, n, 1.0f, 0.0f, NULL, 0),
                                 cudaSuccess);
                for (int e = 0; e < E; e++) {
                    int rows = off[e + 1] - off[e], np = exec_fp8_pad(rows);
                    for (int k = 0; k < 2; k++)
                        assert_int_equal(gk_fp8_cast((k ? ur : gr) + (size_t)off[e] * cols, cols,
                                                     rows, cols, how, e5, qr[2 * k] + qo[e],
                                                     sr[2 * k] + so[e], qr[2 * k + 1] + qo[e], np,
                                                     sr[2 * k + 1] + sto[e], work, 0),
                                         cudaSuccess);
                    char nm[2][80];
                    for (int k = 0; k < 2; k++)
                        snprintf(nm[k], sizeof nm[k], "fused SwiGLU backward d%s (%s, %s)",
                                 k ? "u" : "g", pt ? "per tensor" : "1 x 128",
                                 e5 ? "E5M2" : "E4M3");
                    for (int k = 0; k < 2 && rows; k++) {
                        same(nm[k], how, 2 * k, e, false, rows, cols);
                        same(nm[k], how, 2 * k + 1, e, true, cols, np); /* zeros past rows */
                    }
                }
            }
        cudaFree(amax);
        cudaFree(dg), cudaFree(du), cudaFree(ddh), cudaFree(hm), cudaFree(hr), cudaFree(gr),
            cudaFree(ur);
        for (int i = 0; i < 4; i++)
            cudaFree(q[i]), cudaFree(qr[i]), cudaFree(sf[i]), cudaFree(sr[i]);
    }
    printf("fused SwiGLU and fp8 quantization: %d expert copies, every byte and factor equal to "
           "the unfused kernels'\n",
           checked);
    cudaFree(doff), cudaFree(work);
}

/* Per-tensor fp8: the amax each expert's rows get from the kernels that write them (struct
 * gk_amax_rows: the gather, SwiGLU and its backward, the combine's backward) against the largest
 * |value| of those rows as written (read back), bit for bit. Five experts of 0, 37, 130, 3 and
 * 19 rows: blocks that straddle experts, an empty expert; widths 272 and 384 (and the gather's
 * element path at 20), SwiGLU's element path from a start off 16 bytes too; SwiGLU's backward
 * also keeping the amax alone (SwiGLU and that pass by kernels of their own where aligned: a
 * block of 16384 values, rows of one expert or of several). Then gk_fp8_cast_known with an
 * expert's kept amax gives gk_fp8_cast's bytes and factor, both copies. */
static void test_fp8_amax_rows(void **state)
{
    (void)state;
    if (!gpus()) skip();
    const int E = 5, off[E + 1] = {0, 0, 37, 167, 170, 189}, P = off[E];
    int *doff = dev(std::vector<int>(off, off + E + 1));
    unsigned *amax = dev(std::vector<unsigned>(2 * E)), *work = dev(std::vector<unsigned>(1));
    int checked = 0;
    struct moe_rng rng;
    moe_rng_seed(&rng, 77);
    /* amax[which] against expert e's largest |value| among the rows of d (P x cols) */
    auto check = [&](const char *what, int cols, const bf16 *d, int which) {
        std::vector<bf16> v = host(d, (size_t)P * cols);
        std::vector<unsigned> got = host(amax + which * E, E);
        for (int e = 0; e < E; e++) {
            unsigned want = 0;
            for (size_t i = (size_t)off[e] * cols; i < (size_t)off[e + 1] * cols; i++) {
                float f = __bfloat162float(v[i]);
                unsigned b;
                memcpy(&b, &f, sizeof b);
                if ((b & 0x7FFFFFFFu) > want) want = b & 0x7FFFFFFFu;
            }
            if (got[e] != want)
                fail_msg("%s, width %d, expert %d: kept amax bits %08x, its rows' %08x", what, cols,
                         e, got[e], want);
        }
        checked++;
    };
    auto zero = [&]() {
        assert_int_equal(cudaMemset(amax, 0, sizeof(unsigned) * 2 * E), cudaSuccess);
    };
    for (int cols : {20, 272, 384}) {
        struct gk_amax_rows am = {doff, E, cols, {amax, amax + E}};
        { /* the gather: 64 tokens, top-3 */
            const int T = 64, k = 3;
            std::vector<int> src(P);
            for (auto &r : src) r = (int)moe_rng_below(&rng, (uint64_t)T * k);
            bf16 *x = dev(to_bf16(randn((size_t)T * cols, 911 + cols, 3.0))),
                 *xp = dev(std::vector<bf16>((size_t)P * cols));
            int *dsrc = dev(src);
            zero();
            assert_int_equal(gk_gather(x, dsrc, k, P, cols, xp, &am, 0), cudaSuccess);
            check("gather", cols, xp, 0);
            cudaFree(x), cudaFree(xp), cudaFree(dsrc);
        }
        { /* the combine's backward: 63 tokens, top-3, each pair its own row */
            const int k = 3, T = P / k;
            std::vector<int> pos(P);
            for (int i = 0; i < P; i++) pos[i] = i;
            for (int i = P - 1; i > 0; i--) std::swap(pos[i], pos[moe_rng_below(&rng, i + 1)]);
            float *ddy = dev(randn((size_t)T * cols, 931, 1e-2)),
                  *yp = dev(randn((size_t)P * cols, 932)), *w = dev(randn((size_t)P, 933)),
                  *dwo = dev(std::vector<float>(P));
            int *dpos = dev(pos);
            bf16 *dyp = dev(std::vector<bf16>((size_t)P * cols));
            zero();
            assert_int_equal(gk_combine_backward(ddy, yp, w, dpos, T, k, cols, dyp, dwo, &am, 0),
                             cudaSuccess);
            check("combine backward", cols, dyp, 0);
            cudaFree(ddy), cudaFree(yp), cudaFree(w), cudaFree(dwo), cudaFree(dpos), cudaFree(dyp);
        }
        if (cols % 16) continue;  /* SwiGLU: the experts' widths fp8 takes */
        for (int skew : {0, 1}) { /* 1: the matrices start 2 bytes past 16, element by element */
            size_t n = (size_t)P * cols;
            bf16 *g = dev(to_bf16(randn(n + 1, 921, 2.0))),
                 *u = dev(to_bf16(randn(n + 1, 922, 2.0))),
                 *dh = dev(to_bf16(randn(n + 1, 923, 1e-3))), *hm = dev(std::vector<bf16>(n + 1)),
                 *dg = dev(std::vector<bf16>(n + 1)), *du = dev(std::vector<bf16>(n + 1));
            zero();
            assert_int_equal(gk_swiglu(g + skew, u + skew, hm + skew, n, 1.0f, 0.0f, &am, 0),
                             cudaSuccess);
            check(skew ? "SwiGLU (unaligned)" : "SwiGLU", cols, hm + skew, 0);
            if (!skew) { /* the quantization with the kept amax, each expert's rows both ways */
                std::vector<unsigned> kept = host(amax, E);
                for (int e = 0; e < E; e++) {
                    int rows = off[e + 1] - off[e], np = exec_fp8_pad(rows);
                    if (!rows) continue;
                    size_t nq = (size_t)rows * cols, nt = (size_t)cols * np;
                    unsigned char *q[2], *qt[2];
                    float *sq[2], *st[2];
                    for (int i = 0; i < 2; i++) {
                        q[i] = dev(std::vector<unsigned char>(nq, 0x5A));
                        qt[i] = dev(std::vector<unsigned char>(nt, 0x5A));
                        sq[i] = dev(std::vector<float>(4, -1.0f));
                        st[i] = dev(std::vector<float>(4, -1.0f));
                    }
                    const bf16 *x = hm + (size_t)off[e] * cols;
                    assert_int_equal(gk_fp8_cast(x, cols, rows, cols, EXEC_FP8_TENSOR, 0, q[0],
                                                 sq[0], qt[0], np, st[0], work, 0),
                                     cudaSuccess);
                    assert_int_equal(gk_fp8_cast_known(x, cols, rows, cols, 0, q[1], sq[1], qt[1],
                                                       np, st[1], amax + e, 0),
                                     cudaSuccess);
                    if (host(q[0], nq) != host(q[1], nq) || host(qt[0], nt) != host(qt[1], nt) ||
                        host(sq[0], 1) != host(sq[1], 1) || host(st[0], 1) != host(st[1], 1))
                        fail_msg("fp8 cast with the kept amax, width %d, expert %d (amax %08x): "
                                 "not gk_fp8_cast's bytes",
                                 cols, e, kept[e]);
                    checked++;
                    for (int i = 0; i < 2; i++)
                        cudaFree(q[i]), cudaFree(qt[i]), cudaFree(sq[i]), cudaFree(st[i]);
                }
            }
            zero();
            assert_int_equal(gk_swiglu_backward(g + skew, u + skew, dh + skew, dg + skew, du + skew,
                                                n, 1.0f, 0.0f, &am, 0),
                             cudaSuccess);
            check("SwiGLU backward dg", cols, dg + skew, 0);
            check("SwiGLU backward du", cols, du + skew, 1);
            zero(); /* the amax alone (the fused kernel's per-tensor scales): a block of its own
                     * kernel spans 16384 values, rows of one expert (one atomic) or of several */
            assert_int_equal(gk_swiglu_backward(g + skew, u + skew, dh + skew, NULL, NULL, n, 1.0f,
                                                0.0f, &am, 0),
                             cudaSuccess);
            check("SwiGLU backward's amax alone, dg", cols, dg + skew, 0);
            check("SwiGLU backward's amax alone, du", cols, du + skew, 1);
            cudaFree(g), cudaFree(u), cudaFree(dh), cudaFree(hm), cudaFree(dg), cudaFree(du);
        }
    }
    printf("per-tensor fp8, the amax kept by the kernels that write the experts' rows: %d checks, "
           "every amax and every quantized byte equal\n",
           checked);
    cudaFree(doff), cudaFree(amax), cudaFree(work);
}

/* Per-tensor fp8, the experts' input quantized in the permute: gk_fp8_expert_amax against each
 * expert's largest |value| over its tokens' rows (bits), then gk_fp8_gather's copies against
 * exec_fp8_quantize of each expert's gathered rows and of their transpose (the rows padded with
 * zeros to exec_fp8_pad; bytes outside the regions untouched), bit for bit, factors included.
 * 160 tokens, top-3 of six experts drawn unevenly: one expert with no token, one with three, one
 * with more than 128 rows; token magnitudes 2^-6 .. 2^5, so the experts' scales differ; widths
 * 272 (a partial tile) and 384, and 8 (refused: not a multiple of 16). */
static void test_fp8_gather(void **state)
{
    (void)state;
    if (!gpus()) skip();
    const int T = 160, k = 3, E = 6, P = T * k;
    std::vector<int> choice((size_t)P);
    struct moe_rng rng;
    moe_rng_seed(&rng, 4242);
    for (int t = 0; t < T; t++) { /* expert 1 none; expert 5 only tokens 0..2's */
        static const int pick[] = {0, 0, 0, 2, 2, 3, 4, 4, 4, 4};
        for (int j = 0; j < k; j++) {
            int e;
            bool again;
            do {
                e = t < 3 && j == k - 1 ? 5 : pick[moe_rng_below(&rng, 10)];
                again = false;
                for (int i = 0; i < j; i++) again |= choice[(size_t)t * k + i] == e;
            } while (again);
            choice[(size_t)t * k + j] = e;
        }
    }
    int off[E + 1] = {0};
    std::vector<int> src; /* a stable counting sort, as gk_permute_place's */
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < P; i++)
            if (choice[i] == e) src.push_back(i);
        off[e + 1] = (int)src.size();
    }
    assert_int_equal(off[2] - off[1], 0);
    assert_int_equal(off[6] - off[5], 3);
    assert_true(off[5] - off[4] > 128); /* expert 4: two tiles of rows */
    int *dchoice = dev(choice), *dsrc = dev(src), *doff = dev(std::vector<int>(off, off + E + 1));
    unsigned *amax = dev(std::vector<unsigned>(E, 0xFFFFFFFFu)); /* zeroed by the kernel */
    int checked = 0;
    for (int cols : {272, 384, 8}) {
        std::vector<float> x = randn((size_t)T * cols, 4300 + cols);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < cols; c++) x[(size_t)t * cols + c] *= ldexpf(1.0f, t % 12 - 6);
        std::vector<bf16> x16 = to_bf16(x);
        for (size_t i = 0; i < x.size(); i++) x[i] = __bfloat162float(x16[i]);
        bf16 *dx = dev(x16);
        assert_int_equal(gk_fp8_expert_amax(dx, T, cols, dchoice, k, E, amax, 0), cudaSuccess);
        std::vector<unsigned> got = host(amax, E);
        for (int e = 0; e < E; e++) {
            unsigned want = 0;
            for (int p = off[e]; p < off[e + 1]; p++)
                for (int c = 0; c < cols; c++) {
                    float f = fabsf(x[(size_t)(src[p] / k) * cols + c]);
                    unsigned b;
                    memcpy(&b, &f, sizeof b);
                    if (b > want) want = b;
                }
            if (got[e] != want)
                fail_msg("expert amax, width %d, expert %d: bits %08x, its tokens' %08x", cols, e,
                         got[e], want);
            checked++;
        }
        size_t qo[E + 1], so[E + 1], sto[E + 1];
        exec_fp8_regions(off, E, cols, qo, so, sto);
        unsigned char *q = dev(std::vector<unsigned char>(qo[E] + 32, 0x5A)),
                      *qt = dev(std::vector<unsigned char>(qo[E] + 32, 0x5A));
        float *sq = dev(std::vector<float>(so[E] + 8, -1.0f)),
              *sqt = dev(std::vector<float>(sto[E] + 8, -1.0f));
        cudaError_t r = gk_fp8_gather(dx, dsrc, k, doff, off, E, cols, amax, q, sq, qt, sqt, 0);
        if (cols % 16) { /* refused, nothing written */
            assert_int_equal(r, cudaErrorInvalidValue);
            cudaFree(dx), cudaFree(q), cudaFree(qt), cudaFree(sq), cudaFree(sqt);
            continue;
        }
        assert_int_equal(r, cudaSuccess);
        for (int e = 0; e < E; e++) {
            int n = off[e + 1] - off[e], np = exec_fp8_pad(n);
            if (!n) continue;
            std::vector<float> rows((size_t)n * cols), tr((size_t)cols * np, 0.0f);
            for (int i = 0; i < n; i++)
                for (int c = 0; c < cols; c++)
                    tr[(size_t)c * np + i] = rows[(size_t)i * cols + c] =
                        x[(size_t)(src[off[e] + i] / k) * cols + c];
            char what[96];
            snprintf(what, sizeof what, "gathered rows, width %d, expert %d", cols, e);
            expect_quantized(what, rows, n, cols, EXEC_FP8_TENSOR, 0, q + qo[e], cols, sq + so[e]);
            snprintf(what, sizeof what, "gathered rows transposed, width %d, expert %d", cols, e);
            expect_quantized(what, tr, cols, np, EXEC_FP8_TENSOR, 0, qt + qo[e], np, sqt + sto[e]);
            checked += 2;
        }
        std::vector<unsigned char> tail = host(q + qo[E], 32), tailt = host(qt + qo[E], 32);
        for (int i = 0; i < 32; i++)
            if (tail[i] != 0x5A || tailt[i] != 0x5A)
                fail_msg("gathered rows, width %d: byte %d past the regions written", cols, i);
        cudaFree(dx), cudaFree(q), cudaFree(qt), cudaFree(sq), cudaFree(sqt);
    }
    printf("fp8 experts' input quantized in the permute: %d checks (each expert's amax, both "
           "copies), every amax, byte and factor equal to the reference's\n",
           checked);
    cudaFree(dchoice), cudaFree(dsrc), cudaFree(doff), cudaFree(amax);
}

/* The three fp8 GEMMs of a linear layer, per recipe, against exec_ref_fp8_linear (the same
 * quantization in plain C, the products summed in double): the forward y = x w^T (x in tiles,
 * w in blocks, or both per tensor), the data gradient dx = dy w (dy's tiles, w's transposed
 * copy) and the weight gradient dw = dy^T x (both transposed copies, tiles along the tokens,
 * their count padded to 16 with zeros), with the gradient in E4M3 and in E5M2. The products of
 * fp8 values are exact, but Hopper's fp8 tensor cores add them in an accumulator narrower than
 * fp32 before cuBLASLt promotes the partial sums (DeepSeek-V3 measured about 14 bits), so: out in
 * fp32 within 1e-3 of the largest |y|, in bf16 (the forward) within 8e-3, and with fast
 * accumulation (promoted less often: the per-tensor recipe's forward) within 5e-3. At 301 tokens
 * and at 5 (block scaling runs rows not a multiple of 16 as a GEMM of the first ones and one of a
 * 16-row tail, added into y: the data gradient once more with beta 1 checks that addition).
 * cuBLASLt's refusal of a configuration fails the test, named. */
static void test_fp8_gemm(void **state)
{
    (void)state;
    if (!gpus()) skip();
    int cases = 0;
    /* 301 rows: block scaling's GEMMs run 288 rows and a tail of 16 (gk_fp8_gemm); 5: the tail
     * alone */
    for (int T : {301, 5}) {
        const int IN = 384, OUT = 256, TP = exec_fp8_pad(T); /* the weight gradient's K */
        std::vector<float> x = randn((size_t)T * IN, 801, 3.0),
                           w = randn((size_t)OUT * IN, 802, 0.05),
                           dy = randn((size_t)T * OUT, 803, 1e-3);
        for (int r = 0; r < T; r++) /* rows of different magnitudes: the tiles' scales differ */
            for (int c = 0; c < IN; c++) x[(size_t)r * IN + c] *= ldexpf(1.0f, r % 7 - 3);
        std::vector<bf16> x16 = to_bf16(x), w16 = to_bf16(w), dy16 = to_bf16(dy);
        for (size_t i = 0; i < x.size(); i++) x[i] = __bfloat162float(x16[i]);
        for (size_t i = 0; i < w.size(); i++) w[i] = __bfloat162float(w16[i]);
        for (size_t i = 0; i < dy.size(); i++) dy[i] = __bfloat162float(dy16[i]);
        cublasLtHandle_t lt;
        assert_int_equal(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
        size_t wsb = 32u << 20;
        void *ws;
        assert_int_equal(cudaMalloc(&ws, wsb), cudaSuccess);
        struct gk_fp8_lt *c8 = gk_fp8_lt_create(lt, wsb);
        assert_non_null(c8);
        bf16 *dx16 = dev(x16), *dw16 = dev(w16), *ddy16 = dev(dy16);
        size_t big = (size_t)(TP > IN ? TP : IN) * (OUT > IN ? OUT : IN);
        unsigned char *qa = dev(std::vector<unsigned char>(big)),
                      *qb = dev(std::vector<unsigned char>(big)),
                      *qw = dev(std::vector<unsigned char>(big)),
                      *qwt = dev(std::vector<unsigned char>(big));
        size_t ns =
            exec_fp8_factor_count(EXEC_FP8_TILE_1X128, TP > IN ? TP : IN, OUT > IN ? OUT : IN) * 2 +
            64;
        float *sa = dev(std::vector<float>(ns)), *sb = dev(std::vector<float>(ns)),
              *sw = dev(std::vector<float>(ns)), *swt = dev(std::vector<float>(ns));
        unsigned *work = dev(std::vector<unsigned>(1));
        float *y32 = dev(std::vector<float>(big));
        bf16 *y16 = dev(std::vector<bf16>(big));
        float *tail = dev(std::vector<float>((size_t)EXEC_FP8_PAD * (OUT > IN ? OUT : IN)));
        std::vector<float> wt = transposed(w, OUT, IN), dyt = transposed(dy, T, OUT),
                           xt = transposed(x, T, IN);
        std::vector<double> ref;
        /* y = x w^T (M x N) against ref: cuBLASLt's refusal fails the test, named; then within tol
     * of the largest |ref|; with `twice`, once more with beta 1, against 2 ref */
        auto check = [&](const char *what, const struct gk_fp8_mat *w_, const struct gk_fp8_mat *x_,
                         int M, int N, int K, bool o16, bool fast, double tol, bool twice = false) {
            for (int b = 0; b <= (int)twice; b++) {
                cublasStatus_t st =
                    gk_fp8_gemm(c8, w_, x_, M, N, K, o16 ? (void *)y16 : (void *)y32, N,
                                o16 ? CUDA_R_16BF : CUDA_R_32F, (float)b, fast, tail, ws, 0);
                if (st) fail_msg("%s (T %d): cuBLASLt: %s", what, T, cublasGetStatusString(st));
            }
            std::vector<double> want = ref;
            for (double &v : want) v *= twice ? 2.0 : 1.0;
            char named[160];
            snprintf(named, sizeof named, "%s, T %d%s", what, T,
                     twice ? ", beta 1 after beta 0" : "");
            close(named, o16 ? to_d(host(y16, ref.size())) : to_d(host(y32, ref.size())), want,
                  tol);
            cases++;
        };
        for (int blockwise = 0; blockwise < 2; blockwise++)
            for (int ge5 = 0; ge5 < 2; ge5++) {
                int ht = blockwise ? EXEC_FP8_TILE_1X128 : EXEC_FP8_TENSOR,
                    hw = blockwise ? EXEC_FP8_BLOCK_128X128 : EXEC_FP8_TENSOR;
                enum exec_fp8_scaling rt = (enum exec_fp8_scaling)ht,
                                      rw = (enum exec_fp8_scaling)hw;
                enum exec_fp8 gf = (enum exec_fp8)ge5;
                const char *recipe = blockwise ? "blockwise" : "per-tensor",
                           *dyf = ge5 ? "e5m2" : "e4m3";
                char what[128];
                assert_int_equal(
                    gk_fp8_cast(dw16, IN, OUT, IN, hw, 0, qw, sw, qwt, OUT, swt, work, 0),
                    cudaSuccess);
                struct gk_fp8_mat W = {qw, sw, IN, hw, 0}, WT = {qwt, swt, OUT, hw, 0};
                /* the forward, x in E4M3 (the gradient's format does not enter it) */
                if (!ge5) {
                    assert_int_equal(
                        gk_fp8_cast(dx16, IN, T, IN, ht, 0, qa, sa, NULL, 0, NULL, work, 0),
                        cudaSuccess);
                    struct gk_fp8_mat X = {qa, sa, IN, ht, 0};
                    ref.assign((size_t)T * OUT, 0.0);
                    exec_ref_fp8_linear(x.data(), {rt, EXEC_FP8_E4M3}, w.data(),
                                        {rw, EXEC_FP8_E4M3}, T, OUT, IN, ref.data());
                    for (int o16 = 0; o16 < 2; o16++) {
                        snprintf(what, sizeof what, "fp8 forward, %s, out %s", recipe,
                                 o16 ? "bf16" : "fp32");
                        check(what, &W, &X, T, OUT, IN, o16, false, o16 ? 8e-3 : 1e-3);
                    }
                    if (!blockwise) /* fast accumulation (the per-tensor recipe's forward): 5e-3 */
                        check("fp8 forward, per-tensor, fast accumulation, out fp32", &W, &X, T,
                              OUT, IN, false, true, 5e-3);
                }
                /* the data gradient: dy (T x OUT) by w's transposed copy (IN x OUT) */
                assert_int_equal(
                    gk_fp8_cast(ddy16, OUT, T, OUT, ht, ge5, qa, sa, NULL, 0, NULL, work, 0),
                    cudaSuccess);
                struct gk_fp8_mat DY = {qa, sa, OUT, ht, ge5};
                ref.assign((size_t)T * IN, 0.0);
                exec_ref_fp8_linear(dy.data(), {rt, gf}, wt.data(), {rw, EXEC_FP8_E4M3}, T, IN, OUT,
                                    ref.data());
                snprintf(what, sizeof what, "fp8 data gradient, %s, dy %s", recipe, dyf);
                check(what, &WT, &DY, T, IN, OUT, false, false, 1e-3, true);
                /* the weight gradient: dy^T (OUT x TP) by x^T (IN x TP), tiles along the tokens */
                assert_int_equal(
                    gk_fp8_cast(ddy16, OUT, T, OUT, ht, ge5, NULL, NULL, qa, TP, sa, work, 0),
                    cudaSuccess);
                assert_int_equal(
                    gk_fp8_cast(dx16, IN, T, IN, ht, 0, NULL, NULL, qb, TP, sb, work, 0),
                    cudaSuccess);
                struct gk_fp8_mat DYT = {qa, sa, TP, ht, ge5}, XT = {qb, sb, TP, ht, 0};
                ref.assign((size_t)OUT * IN, 0.0);
                exec_ref_fp8_linear(dyt.data(), {rt, gf}, xt.data(), {rt, EXEC_FP8_E4M3}, OUT, IN,
                                    T, ref.data());
                snprintf(what, sizeof what, "fp8 weight gradient, %s, dy %s", recipe, dyf);
                check(what, &XT, &DYT, OUT, IN, TP, false, false, 1e-3);
            }
        gk_fp8_lt_destroy(c8);
        cublasLtDestroy(lt);
        cudaFree(ws), cudaFree(dx16), cudaFree(dw16), cudaFree(ddy16), cudaFree(qa), cudaFree(qb);
        cudaFree(qw), cudaFree(qwt), cudaFree(sa), cudaFree(sb), cudaFree(sw), cudaFree(swt);
        cudaFree(work), cudaFree(y32), cudaFree(y16), cudaFree(tail);
    }
    printf("fp8 GEMMs: %d cases (cuBLASLt %zu), each within its tolerance of the reference\n",
           cases, cublasLtGetVersion());
}

/* V 1000: the 16-byte path (targets on all eight lanes of a load); V 1001: element by element.
 * The logits are bf16 (the reference takes the same rounded values); the loss within 1e-5
 * relative, the gradient (bf16, written over the logits) within 8e-3 of the largest. */
static void test_cross_entropy(void **state)
{
    (void)state;
    const int T = 33;
    for (int V = 1000; V <= 1001; V++) {
        std::vector<bf16> z = to_bf16(randn((size_t)T * V, 16, 2.0));
        std::vector<int> tgt(T);
        for (int t = 0; t < T; t++) tgt[t] = (t * 37) % V;
        std::vector<double> dr((size_t)T * V);
        double lr_ = exec_ref_cross_entropy(to_d(z).data(), tgt.data(), T, V, dr.data());
        float *rows = dev(std::vector<float>(T));
        bf16 *dz = dev(z);
        int *dt = dev(tgt);
        assert_int_equal(gk_cross_entropy(dz, dt, T, V, 1.0f / T, rows, 0), cudaSuccess);
        std::vector<float> rh = host(rows, T);
        double l = 0;
        for (float v : rh) l += v / T;
        printf("cross-entropy V %d: loss gpu %.7f ref %.7f\n", V, l, lr_);
        assert_true(fabs(l - lr_) < 1e-5 * lr_);
        close("cross-entropy dlogits", to_d(host(dz, (size_t)T * V)), dr, 8e-3);
        cudaFree(dz), cudaFree(rows), cudaFree(dt);
    }
}

/* AdamW over n parameters (16-byte path and the tail), three steps from seeded moments, against
 * exec_ref_adamw_range in double: parameters within 1e-5 of their largest (fp32 arithmetic); the
 * moments within 1e-5 of their largest with fp32 moments, within one bf16 ulp (2^-8 of their
 * largest) with bf16 ones, where the GPU rounds fp32 and the reference double values. The amax
 * it keeps for per-tensor fp8 (struct gk_amax_rows), exact. */
static void test_adamw(void **state)
{
    (void)state;
    const size_t n = 4099;
    for (int m16 = 0; m16 < 2; m16++) {
        std::vector<float> p = randn(n, 31), m1 = randn(n, 32, 0.01), m2 = randn(n, 33, 1e-4);
        for (auto &v : m2) v = v * v; /* second moments are not negative */
        if (m16)
            for (size_t i = 0; i < n; i++)
                m1[i] = __bfloat162float(__float2bfloat16(m1[i])),
                m2[i] = __bfloat162float(__float2bfloat16(m2[i]));
        struct exec_ref_model r;
        memset(&r, 0, sizeof r);
        std::vector<double> rp = to_d(p), rm1 = to_d(m1), rm2 = to_d(m2);
        r.params = rp.data();
        r.nparams = n;
        r.ntensors = 1;
        snprintf(r.tensor[0].name, sizeof r.tensor[0].name, "w");
        r.tensor[0].size = n;
        struct exec_adamw o;
        exec_adamw_defaults(&o);
        o.lr_max = 1e-3;
        o.moments_bf16 = m16;
        float *dp = dev(p), *dg = dev(std::vector<float>(n));
        void *dm1, *dm2;
        size_t mb = m16 ? 2 : 4;
        assert_int_equal(cudaMalloc(&dm1, mb * n), cudaSuccess);
        assert_int_equal(cudaMalloc(&dm2, mb * n), cudaSuccess);
        std::vector<bf16> h16(n);
        for (int k = 0; k < 2; k++) {
            const std::vector<float> &src = k ? m2 : m1;
            if (m16) {
                for (size_t i = 0; i < n; i++) h16[i] = __float2bfloat16(src[i]);
                cudaMemcpy(k ? dm2 : dm1, h16.data(), 2 * n, cudaMemcpyHostToDevice);
            } else {
                cudaMemcpy(k ? dm2 : dm1, src.data(), 4 * n, cudaMemcpyHostToDevice);
            }
        }
        bf16 *w16;
        assert_int_equal(cudaMalloc((void **)&w16, sizeof(bf16) * n), cudaSuccess);
        for (int step = 0; step < 3; step++) {
            std::vector<float> gr = randn(n, 40 + step, 0.1);
            cudaMemcpy(dg, gr.data(), 4 * n, cudaMemcpyHostToDevice);
            std::vector<double> grd = to_d(gr);
            exec_ref_adamw_range(&r, grd.data(), rm1.data(), rm2.data(), 0, n, step, &o, 0.5);
            struct gk_adamw a = {(float)exec_lr_at(&o, step),
                                 (float)o.beta1,
                                 (float)o.beta2,
                                 (float)o.eps,
                                 (float)o.weight_decay,
                                 (float)(1.0 - pow(o.beta1, step + 1)),
                                 (float)(1.0 - pow(o.beta2, step + 1)),
                                 1.0f};
            /* steps 1 and 2 keep the bf16 copy's amax, slices of 100 and of 1024 values (the
             * last slice a part), each the largest |value| of its slice, bit for bit */
            int size = step == 1 ? 100 : 1024, ns = (int)((n + size - 1) / size);
            unsigned *amax = dev(std::vector<unsigned>(ns));
            struct gk_amax_rows am = {NULL, ns, size, {amax, NULL}};
            assert_int_equal(gk_adamw(dp, dg, dm1, dm2, m16, w16, n, &a, step ? &am : NULL, 0),
                             cudaSuccess);
            if (step) {
                std::vector<bf16> w = host(w16, n);
                std::vector<unsigned> got = host(amax, ns);
                for (int j = 0; j < ns; j++) {
                    unsigned want = 0;
                    for (size_t i = (size_t)j * size; i < n && i < (size_t)(j + 1) * size; i++) {
                        float f = fabsf(__bfloat162float(w[i]));
                        unsigned b;
                        memcpy(&b, &f, sizeof b);
                        want = b > want ? b : want;
                    }
                    if (got[j] != want)
                        fail_msg(
                            "adamw's kept amax, slices of %d, slice %d: %08x, its values' %08x",
                            size, j, got[j], want);
                }
            }
            cudaFree(amax);
        }
        close(m16 ? "adamw parameters (bf16 moments)" : "adamw parameters", to_d(host(dp, n)), rp,
              1e-5);
        for (int k = 0; k < 2; k++) {
            std::vector<double> got(n);
            if (m16) {
                cudaMemcpy(h16.data(), k ? dm2 : dm1, 2 * n, cudaMemcpyDeviceToHost);
                for (size_t i = 0; i < n; i++) got[i] = __bfloat162float(h16[i]);
            } else {
                std::vector<float> f(n);
                cudaMemcpy(f.data(), k ? dm2 : dm1, 4 * n, cudaMemcpyDeviceToHost);
                got = to_d(f);
            }
            close(k ? "adamw second moments" : "adamw first moments", got, k ? rm2 : rm1,
                  m16 ? 1.0 / 256 : 1e-5);
        }
        cudaFree(dp), cudaFree(dg), cudaFree(dm1), cudaFree(dm2), cudaFree(w16);
    }
}

int main(void)
{
    if (!gpus()) {
        printf("no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_permute_combine),
        cmocka_unit_test(test_flash_attention),
        cmocka_unit_test(test_cudnn_attention),
        cmocka_unit_test(test_cudnn_threads),
        cmocka_unit_test(test_cudnn_sinks),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_fp8_quantize),
        cmocka_unit_test(test_fp8_gemm),
        cmocka_unit_test(test_fp8_swiglu_fused),
        cmocka_unit_test(test_fp8_amax_rows),
        cmocka_unit_test(test_fp8_gather),
        cmocka_unit_test(test_adamw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
