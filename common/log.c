/*
 * log.c: leveled messages to stderr and a progress bar that only draws on a terminal.
 *
 * Every message starts with "moeplan: " so that it stands out in a job log. The progress bar
 * rewrites one line with '\r' on a terminal; into a pipe or a file it prints nothing, or, where
 * the work asked for it (moe_progress_lines), a plain line every few seconds: batch logs stay
 * clean and still show that long work is alive.
 */
#include "moe_common.h"

#include <string.h>
#include <unistd.h>

void moe_log_init(struct moe_log *log, enum moe_log_level level)
{
    log->level = level;
    log->out = NULL;
}

void moe_log_msg(const struct moe_log *log, enum moe_log_level level, const char *fmt, ...)
{
    if (log && level > log->level) return;
    FILE *out = (log && log->out) ? log->out : stderr;
    static const char *const prefix[] = {"", "warning: ", "", "debug: "};
    fprintf(out, "moeplan: %s", prefix[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

/* The length of the well-formed UTF-8 sequence at p (1 to 4), or 0. */
static int utf8_len(const unsigned char *p)
{
    int n = p[0] < 0x80             ? 1
            : (p[0] & 0xe0) == 0xc0 ? 2
            : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4
                                    : 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (n == 2 && p[0] < 0xc2) return 0; /* overlong */
    return n;
}

void moe_text_safe(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < cap;) {
        int n = utf8_len(p);
        /* C0 and C1 controls, DEL, the bidirectional overrides and isolates (U+202A..U+202E,
         * U+2066..U+2069: text that reorders what follows it), and bytes that are not UTF-8 */
        bool control = n == 1 && ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f);
        bool c1 = n == 2 && p[0] == 0xc2 && p[1] < 0xa0;
        bool bidi = n == 3 && p[0] == 0xe2 &&
                    ((p[1] == 0x80 && p[2] >= 0xaa && p[2] <= 0xae) ||
                     (p[1] == 0x81 && p[2] >= 0xa6 && p[2] <= 0xa9));
        if (n == 0 || control || c1 || bidi) {
            int k = n ? n : 1;
            for (int i = 0; i < k && o + 5 < cap; i++)
                o += (size_t)snprintf(out + o, cap - o, "\\x%02x", p[i]);
            p += k;
            continue;
        }
        if (o + (size_t)n >= cap) break;
        memcpy(out + o, p, (size_t)n);
        o += (size_t)n;
        p += n;
    }
    out[o] = '\0';
}

void moe_log_error(const struct moe_log *log, const struct moe_error *err)
{
    char buf[MOE_MSG_MAX + MOE_PATH_MAX + 64], safe[4 * sizeof buf];
    moe_error_format(err, buf, sizeof buf);
    /* A message may quote the user's bytes (a file name, a value): shown safe, never raw. */
    moe_text_safe(buf, safe, sizeof safe);
    moe_log_msg(log, MOE_LOG_ERROR, "%s", safe);
}

void moe_progress_start(struct moe_progress *p, FILE *out, bool enabled, const char *label,
                        uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->out = out ? out : stderr;
    p->draw = enabled && isatty(fileno(p->out));
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->t0_s = moe_time_now_s();
    p->last_percent = -1;
}

void moe_progress_lines(struct moe_progress *p, double every_s)
{
    p->every_s = every_s;
    p->last_line_s = p->t0_s;
}

void moe_progress_update(struct moe_progress *p, uint64_t done)
{
    p->done = done > p->total ? p->total : done;
    if (!p->draw && p->every_s > 0 && p->total > 0) {
        double now = moe_time_now_s();
        if (now - p->last_line_s >= p->every_s) {
            p->last_line_s = now;
            fprintf(p->out, "moeplan: %s: %llu/%llu (%d%%), %.1f s\n", p->label,
                    (unsigned long long)p->done, (unsigned long long)p->total,
                    (int)(100.0 * (double)p->done / (double)p->total), now - p->t0_s);
            fflush(p->out);
        }
        return;
    }
    if (!p->draw || p->total == 0) return;
    int percent = (int)(100.0 * (double)p->done / (double)p->total);
    if (percent == p->last_percent && p->done != p->total) return;
    p->last_percent = percent;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int filled = percent * WIDTH / 100;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : ' ';
    bar[WIDTH] = '\0';
    fprintf(p->out, "\r%s [%s] %3d%% %llu/%llu %.1fs", p->label, bar, percent,
            (unsigned long long)p->done, (unsigned long long)p->total, moe_time_now_s() - p->t0_s);
    fflush(p->out);
}

void moe_progress_finish(struct moe_progress *p)
{
    if (!p->draw) return;
    moe_progress_update(p, p->total);
    fputs("\r\033[K", p->out); /* erase the bar: results follow on a clean line */
    fflush(p->out);
}

void moe_progress_clear(struct moe_progress *p)
{
    if (!p->draw) return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->last_percent = -1;
}
