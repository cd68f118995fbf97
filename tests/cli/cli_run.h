/*
 * cli_run.h: what the CLI tests share: run the real moeplan binary with arguments, from the source
 * folder, and keep its exit code, stdout and stderr. A crash fails the test (never a signal), a
 * hang too (killed after 120 s), and under MOEPLAN_CLI_VALGRIND=1 every run is a valgrind run.
 */
#ifndef CLI_RUN_H
#define CLI_RUN_H

#include "../unit/moe_test.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

struct result {
    int code;
    char out[65536];
    char err[16384];
};

static inline void slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
}

/* A whole file, NUL-terminated, in memory (free it); NULL when it cannot be read. */
static inline char *slurp_all(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Run moeplan with the given arguments (NULL-terminated) from the source folder. */
static inline void run(struct result *r, const char *const *args)
{
    char out_path[] = "/tmp/moe_cli_out_XXXXXX", err_path[] = "/tmp/moe_cli_err_XXXXXX";
    int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
    assert_true(out_fd >= 0 && err_fd >= 0);
    /* MOEPLAN_CLI_VALGRIND=1 (make memcheck): every run under valgrind's memcheck; an error or a
     * definite leak makes it exit 99 and the test fail with valgrind's report */
    bool vg = getenv("MOEPLAN_CLI_VALGRIND") && strcmp(getenv("MOEPLAN_CLI_VALGRIND"), "0");
    char vg_log[64], vg_log_opt[96], vg_supp[1100];
    snprintf(vg_log, sizeof vg_log, "/tmp/moe_cli_vg_%d.log", (int)getpid());
    snprintf(vg_log_opt, sizeof vg_log_opt, "--log-file=%s", vg_log);
    snprintf(vg_supp, sizeof vg_supp, "--suppressions=%s/tests/valgrind.supp", MOEPLAN_SOURCE_DIR);
    const char *argv[48];
    int n = 0;
    if (vg) {
        /* the child that reads a node XML with hwloc first leaves by _exit (topologies/node.c,
         * hwloc_trial): its memory is not ours to free, so valgrind leaves it unreported */
        const char *pre[] = {"valgrind",
                             "--quiet",
                             "--error-exitcode=99",
                             "--leak-check=full",
                             "--show-leak-kinds=definite",
                             "--errors-for-leak-kinds=definite",
                             "--child-silent-after-fork=yes",
                             vg_supp,
                             vg_log_opt};
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) argv[n++] = pre[i];
    }
    argv[n++] = MOEPLAN_BINARY;
    for (int i = 0; args[i] && n < 47; i++) argv[n++] = args[i];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(MOEPLAN_SOURCE_DIR), 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rc, 0);
    /* A hang is a failure, not a stuck suite: kill moeplan after 120 s (valgrind: 600 s). */
    int status, waited_ms = 0, limit_ms = vg ? 600000 : 120000;
    pid_t w;
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && waited_ms < limit_ms) {
        usleep(10000);
        waited_ms += 10;
    }
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("moeplan %s ... hung: killed after %d s", args[0], limit_ms / 1000);
    }
    assert_int_equal(w, pid);
    posix_spawn_file_actions_destroy(&fa);
    close(out_fd);
    close(err_fd);
    assert_true(WIFEXITED(status)); /* never a crash */
    r->code = WEXITSTATUS(status);
    if (vg && r->code == 99) {
        static char report[8192];
        slurp(vg_log, report, sizeof report);
        fail_msg("valgrind: moeplan %s ...:\n%s", args[0], report);
    }
    if (vg) unlink(vg_log);
    slurp(out_path, r->out, sizeof r->out);
    slurp(err_path, r->err, sizeof r->err);
    unlink(out_path);
    unlink(err_path);
}

/* This test program's scratch folder (mkdtemp, removed at the end): cli_scratch_setup and
 * cli_scratch_teardown are the cmocka group setup and teardown. */
static char cli_scratch[64];

static inline int cli_scratch_setup(void **state)
{
    (void)state;
    snprintf(cli_scratch, sizeof cli_scratch, "/tmp/moe_cli_XXXXXX");
    /* the shipped files are named relative to the source folder, as moeplan's runs see them */
    return mkdtemp(cli_scratch) && chdir(MOEPLAN_SOURCE_DIR) == 0 ? 0 : -1;
}

static inline int cli_scratch_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cli_scratch);
    return system(cmd) == 0 ? 0 : -1;
}

/* "SCRATCH/name", in one of a few rotating buffers (several in one call's arguments). */
static inline const char *cli_tmp(const char *name)
{
    static char buf[8][512];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", cli_scratch, name);
    return buf[i];
}

#define RUN(r, ...) run(r, (const char *const[]){__VA_ARGS__, NULL})

static inline void expect_in(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("expected '%s' in:\n%s", needle, haystack);
}

#endif
