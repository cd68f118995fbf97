/*
 * units.c: parsing of sizes, counts and bandwidths as users write them, human formats, and the
 * median every timing table reports.
 *
 * The convention (documented in the README): K, M, G, T, P alone or with "i"/"iB" are powers of
 * 1024 (sequence lengths and memory: "64K" = 65536); KB, MB, GB, TB, PB are powers of 1000.
 * Bandwidths follow the network convention, decimal, with "b" meaning bits and "B" bytes.
 */
#include "moe_common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int prefix_power(char c)
{
    switch (toupper((unsigned char)c)) {
    case 'K': return 1;
    case 'M': return 2;
    case 'G': return 3;
    case 'T': return 4;
    case 'P': return 5;
    }
    return 0;
}

/* Parse the leading number; *end points past it. */
static enum moe_status parse_number(const char *text, double *out, const char **end,
                                    struct moe_error *err)
{
    if (!text || !*text) return moe_error_set(err, MOE_ERR_INPUT, "empty number");
    while (isspace((unsigned char)*text)) text++;
    if (*text == '-' || *text == '+' || !(isdigit((unsigned char)*text) || *text == '.'))
        return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a non-negative number", text);
    /* Decimal only: strtod would also take hexadecimal ("0x10" is 16, "0x1p4" too), which no
     * user writing a GPU count means. */
    if (text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
        return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a decimal number", text);
    errno = 0;
    char *e;
    double v = strtod(text, &e);
    if (e == text || errno == ERANGE || !isfinite(v))
        return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a finite number", text);
    *out = v;
    *end = e;
    return MOE_OK;
}

enum moe_status moe_parse_size(const char *text, double *out, struct moe_error *err)
{
    double v;
    const char *s;
    enum moe_status st = parse_number(text, &v, &s, err);
    if (st != MOE_OK) return st;
    double mult = 1.0;
    int p = prefix_power(*s);
    if (p) {
        s++;
        if (*s == 'i') {
            s++;
            if (*s == 'B') s++;
            mult = pow(1024.0, p);
        } else if (*s == 'B') {
            s++;
            mult = pow(1000.0, p);
        } else {
            mult = pow(1024.0, p);
        }
    } else if (*s == 'B') {
        s++;
    }
    if (*s)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "'%s': unknown unit '%s' (use K, M, G, T, Ki, KB, ...)", text, s);
    v *= mult;
    if (!isfinite(v)) return moe_error_set(err, MOE_ERR_INPUT, "'%s' is too large", text);
    *out = v;
    return MOE_OK;
}

enum moe_status moe_parse_count(const char *text, uint64_t *out, struct moe_error *err)
{
    double v;
    enum moe_status st = moe_parse_size(text, &v, err);
    if (st != MOE_OK) return st;
    if (v != floor(v)) return moe_error_set(err, MOE_ERR_INPUT, "'%s' is not a whole number", text);
    if (v > 9007199254740992.0)
        return moe_error_set(err, MOE_ERR_INPUT, "'%s' is too large (at most 2^53)", text);
    *out = (uint64_t)v;
    return MOE_OK;
}

enum moe_status moe_parse_bandwidth(const char *text, double *bytes_per_s, struct moe_error *err)
{
    double v;
    const char *s;
    enum moe_status st = parse_number(text, &v, &s, err);
    if (st != MOE_OK) return st;
    int p = prefix_power(*s);
    if (p) s++;
    double unit;
    if (*s == 'b')
        unit = 0.125;
    else if (*s == 'B')
        unit = 1.0;
    else
        return moe_error_set(err, MOE_ERR_INPUT,
                             "'%s': a bandwidth needs a unit such as Gbps, Gb/s, GB/s", text);
    s++;
    if (strcasecmp(s, "ps") != 0 && strcmp(s, "/s") != 0)
        return moe_error_set(err, MOE_ERR_INPUT,
                             "'%s': a bandwidth needs a unit such as Gbps, Gb/s, GB/s", text);
    v *= unit * pow(1000.0, p);
    if (!isfinite(v)) return moe_error_set(err, MOE_ERR_INPUT, "'%s' is too large", text);
    *bytes_per_s = v;
    return MOE_OK;
}

void moe_format_bytes(double bytes, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    double v = bytes;
    while (fabs(v) >= 1024.0 && i < 5) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, cap, "%.0f B", v);
    else
        snprintf(buf, cap, "%.2f %s", v, unit[i]);
}

void moe_format_time_us(double us, char *buf, size_t cap)
{
    if (fabs(us) < 1000.0)
        snprintf(buf, cap, "%.1f us", us);
    else if (fabs(us) < 1e6)
        snprintf(buf, cap, "%.3f ms", us / 1e3);
    else
        snprintf(buf, cap, "%.3f s", us / 1e6);
}

double moe_time_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double moe_median(double *v, size_t n)
{
    if (n == 0) return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
