/*
 * rng.c: xoshiro256** seeded by splitmix64, and the distributions moeplan draws from.
 *
 * Everything random in moeplan (synthetic routing, skew, initialization, data order) draws from
 * a struct moe_rng that the caller seeds, so a run is reproducible bit for bit from its seed on
 * any machine: no libc rand(), no hidden state.
 */
#include "moe_common.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void moe_rng_seed(struct moe_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

uint64_t moe_rng_u64(struct moe_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double moe_rng_uniform(struct moe_rng *rng)
{
    return (double)(moe_rng_u64(rng) >> 11) * 0x1.0p-53;
}

uint64_t moe_rng_below(struct moe_rng *rng, uint64_t n)
{
    /* Rejection of the short last bucket keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = moe_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

double moe_rng_normal(struct moe_rng *rng)
{
    double u1 = 1.0 - moe_rng_uniform(rng); /* (0, 1]: log() stays finite */
    double u2 = moe_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double moe_rng_gamma(struct moe_rng *rng, double shape)
{
    if (shape < 1.0) {
        /* Boost: Gamma(a) = Gamma(a + 1) * U^(1/a). */
        double u = 1.0 - moe_rng_uniform(rng);
        return moe_rng_gamma(rng, shape + 1.0) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = moe_rng_normal(rng);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = 1.0 - moe_rng_uniform(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

void moe_rng_dirichlet(struct moe_rng *rng, double alpha, double *p, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (p[i] = moe_rng_gamma(rng, alpha));
    for (size_t i = 0; i < n; i++) p[i] = sum > 0.0 ? p[i] / sum : 1.0 / (double)n;
}
