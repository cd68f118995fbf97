/*
 * test_common.c: status codes, error formats, units, the RNG, JSON loading with positions,
 * strict unpacking, and atomic writes.
 */
#include "moe_test.h"

#include "moe_common.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void test_exit_codes(void **state)
{
    (void)state;
    assert_int_equal(moe_status_exit_code(MOE_OK), 0);
    assert_int_equal(moe_status_exit_code(MOE_ERR_USAGE), 2);
    assert_int_equal(moe_status_exit_code(MOE_ERR_INPUT), 3);
    assert_int_equal(moe_status_exit_code(MOE_ERR_INFEASIBLE), 4);
    assert_int_equal(moe_status_exit_code(MOE_ERR_VERIFY), 5);
    assert_int_equal(moe_status_exit_code(MOE_ERR_CUDA), 1);
    assert_int_equal(moe_status_exit_code(MOE_ERR_UNSUPPORTED), 1);
}

static void test_error_format(void **state)
{
    (void)state;
    struct moe_error err;
    char buf[2048];
    moe_error_set_at(&err, MOE_ERR_INPUT, "m.json", 4, 7, "bad %s", "value");
    moe_error_format(&err, buf, sizeof buf);
    assert_string_equal(buf, "m.json:4:7: bad value");
    moe_error_set_at(&err, MOE_ERR_INPUT, "m.json", 0, 0, "cannot open");
    moe_error_format(&err, buf, sizeof buf);
    assert_string_equal(buf, "m.json: cannot open");
    moe_error_set(&err, MOE_ERR_RUNTIME, "plain");
    moe_error_format(&err, buf, sizeof buf);
    assert_string_equal(buf, "plain");
    assert_int_equal(moe_error_set(NULL, MOE_ERR_IO, "x"), MOE_ERR_IO);
    assert_string_equal(moe_glpk_strerror(0x09), "time limit exceeded (GLP_ETMLIM)");
}

/* A function in the house style, to check that MOE_GLPK_GOTO records the call and jumps. */
static enum moe_status fails_with_glpk_code(struct moe_error *err, int *cleaned)
{
    enum moe_status st = MOE_OK;
    MOE_GLPK_GOTO(0, st, cleanup);
    MOE_GLPK_GOTO(0x0A, st, cleanup);
    st = MOE_ERR_RUNTIME; /* not reached */
cleanup:
    *cleaned = 1;
    return st;
}

static void test_try_macros(void **state)
{
    (void)state;
    struct moe_error err;
    int cleaned = 0;
    assert_int_equal(fails_with_glpk_code(&err, &cleaned), MOE_ERR_GLPK);
    assert_int_equal(cleaned, 1);
    assert_non_null(strstr(err.message, "0x0A failed: no primal feasible solution"));
    assert_non_null(err.src_file);
    assert_true(err.src_line > 0);
}

static void test_units(void **state)
{
    (void)state;
    double v;
    uint64_t n;
    struct moe_error err;
    assert_int_equal(moe_parse_size("4096", &v, &err), MOE_OK);
    assert_true(v == 4096.0);
    assert_int_equal(moe_parse_size("64K", &v, &err), MOE_OK);
    assert_true(v == 65536.0);
    assert_int_equal(moe_parse_size("1.5G", &v, &err), MOE_OK);
    assert_true(v == 1.5 * 1073741824.0);
    assert_int_equal(moe_parse_size("2Mi", &v, &err), MOE_OK);
    assert_true(v == 2097152.0);
    assert_int_equal(moe_parse_size("3GiB", &v, &err), MOE_OK);
    assert_true(v == 3.0 * 1073741824.0);
    assert_int_equal(moe_parse_size("10KB", &v, &err), MOE_OK);
    assert_true(v == 10000.0);
    assert_int_equal(moe_parse_size("141GB", &v, &err), MOE_OK);
    assert_true(v == 141e9);
    assert_int_equal(moe_parse_size("1e6", &v, &err), MOE_OK);
    assert_true(v == 1e6);
    assert_int_equal(moe_parse_count("8K", &n, &err), MOE_OK);
    assert_int_equal(n, 8192);
    assert_int_equal(moe_parse_count("1.5", &n, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_count("1e300", &n, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_size("-1", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_size("12X", &v, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "unknown unit"));
    assert_int_equal(moe_parse_size("", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_size("abc", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_size("nan", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_size("1e999", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_bandwidth("400Gbps", &v, &err), MOE_OK);
    assert_true(v == 50e9);
    assert_int_equal(moe_parse_bandwidth("400Gb/s", &v, &err), MOE_OK);
    assert_true(v == 50e9);
    assert_int_equal(moe_parse_bandwidth("450GB/s", &v, &err), MOE_OK);
    assert_true(v == 450e9);
    assert_int_equal(moe_parse_bandwidth("900GBps", &v, &err), MOE_OK);
    assert_true(v == 900e9);
    assert_int_equal(moe_parse_bandwidth("400G", &v, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_parse_bandwidth("400Gbpx", &v, &err), MOE_ERR_INPUT);
    char buf[64];
    moe_format_bytes(1.5 * 1073741824.0, buf, sizeof buf);
    assert_string_equal(buf, "1.50 GiB");
    moe_format_bytes(512, buf, sizeof buf);
    assert_string_equal(buf, "512 B");
    moe_format_time_us(812.34, buf, sizeof buf);
    assert_string_equal(buf, "812.3 us");
    moe_format_time_us(1234.0, buf, sizeof buf);
    assert_string_equal(buf, "1.234 ms");
    moe_format_time_us(2.5e6, buf, sizeof buf);
    assert_string_equal(buf, "2.500 s");
}

static void test_rng(void **state)
{
    (void)state;
    struct moe_rng a, b;
    moe_rng_seed(&a, 42);
    moe_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) assert_true(moe_rng_u64(&a) == moe_rng_u64(&b));
    moe_rng_seed(&b, 43);
    int same = 0;
    for (int i = 0; i < 100; i++) same += moe_rng_u64(&a) == moe_rng_u64(&b);
    assert_true(same == 0);
    /* The first output for seed 0 is fixed forever: runs must reproduce across versions. */
    moe_rng_seed(&a, 0);
    uint64_t first = moe_rng_u64(&a);
    moe_rng_seed(&b, 0);
    assert_true(moe_rng_u64(&b) == first);
    double sum = 0, sum2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = moe_rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
        uint64_t k = moe_rng_below(&a, 7);
        assert_true(k < 7);
        double z = moe_rng_normal(&a);
        sum += z;
        sum2 += z * z;
    }
    /* Mean 0 and variance 1 within ~5 standard errors. */
    assert_true(fabs(sum / n) < 5.0 / sqrt(n));
    assert_true(fabs(sum2 / n - 1.0) < 5.0 * sqrt(2.0 / n));
    double gsum = 0;
    for (int i = 0; i < n; i++) gsum += moe_rng_gamma(&a, 2.0);
    assert_true(fabs(gsum / n - 2.0) < 5.0 * sqrt(2.0 / n)); /* Gamma(2): mean 2, var 2 */
    double gsmall = 0;
    for (int i = 0; i < n; i++) gsmall += moe_rng_gamma(&a, 0.5);
    assert_true(fabs(gsmall / n - 0.5) < 5.0 * sqrt(0.5 / n));
    double p[16];
    moe_rng_dirichlet(&a, 2.0, p, 16);
    double ps = 0;
    for (int i = 0; i < 16; i++) {
        assert_true(p[i] > 0.0);
        ps += p[i];
    }
    assert_true(fabs(ps - 1.0) < 1e-12);
}

static const char doc_text[] = "{\n"
                               "  \"schema\": \"moeplan.test\",\n"
                               "  \"version\": 1,\n"
                               "  \"moe\": {\"experts\": 0, \"name\": \"x\",\n"
                               "          \"list\": [1, {\"a\": true}, 2.5]},\n"
                               "  \"s\": \"caf\xc3\xa9\", \"k\": 3\n"
                               "}\n";

static void test_json_locate(void **state)
{
    (void)state;
    int line = 0, col = 0;
    size_t len = strlen(doc_text);
    assert_true(moe_json_locate(doc_text, len, "moe.experts", &line, &col));
    assert_int_equal(line, 4);
    assert_int_equal(col, 22);
    assert_true(moe_json_locate(doc_text, len, "moe.list[1].a", &line, &col));
    assert_int_equal(line, 5);
    assert_int_equal(col, 29);
    assert_true(moe_json_locate(doc_text, len, "moe.list[2]", &line, &col));
    assert_int_equal(col, 36);
    /* Columns count characters: the é before "k" is one column. */
    assert_true(moe_json_locate(doc_text, len, "k", &line, &col));
    assert_int_equal(line, 6);
    assert_int_equal(col, 21);
    assert_true(moe_json_locate(doc_text, len, "", &line, &col));
    assert_int_equal(line, 1);
    line = -1;
    assert_false(moe_json_locate(doc_text, len, "moe.missing", &line, &col));
    assert_int_equal(line, -1);
    assert_false(moe_json_locate(doc_text, len, "moe.list[7]", &line, &col));
}

static void test_json_unpack(void **state)
{
    (void)state;
    struct moe_jdoc doc;
    struct moe_error err;
    assert_int_equal(moe_jdoc_parse(&doc, "t.json", doc_text, strlen(doc_text), &err), MOE_OK);
    char schema[64];
    int version;
    assert_int_equal(moe_jdoc_schema(&doc, schema, sizeof schema, &version, &err), MOE_OK);
    assert_string_equal(schema, "moeplan.test");
    assert_int_equal(version, 1);
    struct moe_jval root, moe, list, el;
    assert_int_equal(moe_jdoc_root(&doc, &root, &err), MOE_OK);
    assert_int_equal(moe_jval_object(&root, "moe", true, &moe, NULL, &err), MOE_OK);
    int64_t v;
    assert_int_equal(moe_jval_int(&moe, "experts", true, 0, 1, 100, &v, &err), MOE_ERR_INPUT);
    assert_string_equal(err.file, "t.json");
    assert_int_equal(err.line, 4);
    assert_int_equal(err.col, 22);
    assert_non_null(strstr(err.message, "moe.experts: must be in [1, 100], got 0"));
    assert_int_equal(moe_jval_int(&moe, "experts", true, 0, 0, 100, &v, &err), MOE_OK);
    assert_int_equal(v, 0);
    assert_int_equal(moe_jval_int(&moe, "absent", false, 7, 0, 100, &v, &err), MOE_OK);
    assert_int_equal(v, 7);
    assert_int_equal(moe_jval_int(&moe, "absent", true, 7, 0, 100, &v, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "moe.absent: required key is missing"));
    assert_int_equal(err.line, 4); /* at the object that lacks it */
    assert_int_equal(moe_jval_int(&moe, "name", true, 0, 0, 100, &v, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "must be an integer, not a string"));
    static const char *const allowed[] = {"experts", "name", NULL};
    assert_int_equal(moe_jval_keys(&moe, allowed, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "moe.list: unknown key (allowed: experts, name)"));
    assert_int_equal(err.line, 5);
    static const char *const names[] = {"y", "x", NULL};
    int idx;
    assert_int_equal(moe_jval_enum(&moe, "name", true, 0, names, &idx, &err), MOE_OK);
    assert_int_equal(idx, 1);
    static const char *const other[] = {"p", "q", NULL};
    assert_int_equal(moe_jval_enum(&moe, "name", true, 0, other, &idx, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "'x' is not one of: p, q"));
    assert_int_equal(moe_jval_array(&moe, "list", true, &list, NULL, &err), MOE_OK);
    assert_int_equal(moe_jval_len(&list), 3);
    int64_t i0;
    double d2;
    assert_int_equal(moe_jval_at_int(&list, 0, 0, 10, &i0, &err), MOE_OK);
    assert_int_equal(i0, 1);
    assert_int_equal(moe_jval_at_num(&list, 2, 0, 10, &d2, &err), MOE_OK);
    assert_true(d2 == 2.5);
    assert_int_equal(moe_jval_at_int(&list, 2, 0, 10, &i0, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_jval_at_object(&list, 1, &el, &err), MOE_OK);
    bool b;
    assert_int_equal(moe_jval_bool(&el, "a", true, false, &b, &err), MOE_OK);
    assert_true(b);
    assert_int_equal(moe_jval_num(&el, "a", true, 0, 0, 1, &d2, &err), MOE_ERR_INPUT);
    assert_int_equal(err.line, 5);
    assert_int_equal(err.col, 29);
    assert_non_null(strstr(err.message, "moe.list[1].a: must be a number, not a boolean"));
    char s[8];
    assert_int_equal(moe_jval_str(&root, "s", true, NULL, s, sizeof s, &err), MOE_OK);
    assert_string_equal(s, "caf\xc3\xa9");
    char tiny[3];
    assert_int_equal(moe_jval_str(&root, "s", true, NULL, tiny, sizeof tiny, &err), MOE_ERR_INPUT);
    moe_jdoc_free(&doc);
    moe_jdoc_free(NULL);
}

static void test_json_syntax_errors(void **state)
{
    (void)state;
    struct moe_jdoc doc;
    struct moe_error err;
    const char *bad = "{\n  \"a\": 1,\n  \"b\" 2\n}\n";
    assert_int_equal(moe_jdoc_parse(&doc, "bad.json", bad, strlen(bad), &err), MOE_ERR_INPUT);
    assert_string_equal(err.file, "bad.json");
    assert_int_equal(err.line, 3);
    assert_true(err.col >= 6 && err.col <= 7);
    const char *dup = "{\"a\": 1, \"a\": 2}";
    assert_int_equal(moe_jdoc_parse(&doc, "dup.json", dup, strlen(dup), &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "duplicate"));
    const char *utf = "{\"a\": \"\xff\xfe\"}";
    assert_int_equal(moe_jdoc_parse(&doc, "utf.json", utf, strlen(utf), &err), MOE_ERR_INPUT);
    const char nul[] = "{\"a\": 1}\0junk";
    assert_int_equal(moe_jdoc_parse(&doc, "nul.json", nul, sizeof nul - 1, &err), MOE_ERR_INPUT);
    assert_int_equal(moe_jdoc_parse(&doc, "empty.json", "", 0, &err), MOE_ERR_INPUT);
    const char *arr = "[1, 2]";
    assert_int_equal(moe_jdoc_parse(&doc, "arr.json", arr, strlen(arr), &err), MOE_OK);
    struct moe_jval root;
    assert_int_equal(moe_jdoc_root(&doc, &root, &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "top level must be a JSON object"));
    moe_jdoc_free(&doc);
    assert_int_equal(moe_jdoc_load(&doc, "/nonexistent/x.json", &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "cannot open"));
    assert_int_equal(moe_jdoc_load(&doc, "/tmp", &err), MOE_ERR_INPUT);
    assert_non_null(strstr(err.message, "not a regular file"));
}

static void test_json_write_atomic(void **state)
{
    (void)state;
    char dir[] = "/tmp/moe_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/out.json", dir);
    json_t *o = json_object();
    json_object_set_new(o, "answer", json_integer(42));
    json_object_set_new(o, "schema", json_string("ignored"));
    struct moe_error err;
    assert_int_equal(moe_json_write_atomic(path, o, "moeplan.test", 3, &err), MOE_OK);
    json_decref(o);
    struct moe_jdoc doc;
    assert_int_equal(moe_jdoc_load(&doc, path, &err), MOE_OK);
    char schema[64];
    int version;
    assert_int_equal(moe_jdoc_schema(&doc, schema, sizeof schema, &version, &err), MOE_OK);
    assert_string_equal(schema, "moeplan.test");
    assert_int_equal(version, 3);
    /* "schema" comes first in the written text, then "version". */
    assert_true(strstr(doc.text, "\"schema\"") < strstr(doc.text, "\"version\""));
    assert_true(strstr(doc.text, "\"version\"") < strstr(doc.text, "\"answer\""));
    moe_jdoc_free(&doc);
    /* A write that fails leaves the old file and no temp file behind. */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.json", dir);
    assert_int_equal(moe_file_write_atomic(bad, "x", 1, &err), MOE_ERR_USAGE);
    assert_non_null(strstr(err.message, "does not exist"));
    /* `path` was read as an input above (moe_jdoc_load): it is never overwritten. */
    assert_int_equal(moe_file_write_atomic(path, "new\n", 4, &err), MOE_ERR_USAGE);
    assert_non_null(strstr(err.message, "never overwrites its inputs"));
    snprintf(path, sizeof path, "%s/other.json", dir);
    assert_int_equal(moe_file_write_atomic(path, "old\n", 4, &err), MOE_OK);
    assert_int_equal(moe_file_write_atomic(path, "new\n", 4, &err), MOE_OK);
    FILE *f = fopen(path, "r");
    char buf[16] = {0};
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_string_equal(buf, "new\n");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 2", dir); /* no temp file */
    assert_int_equal(system(cmd), 0);
    unlink(path);
    snprintf(path, sizeof path, "%s/out.json", dir);
    unlink(path);
    rmdir(dir);
}

static void test_progress_not_a_terminal(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    struct moe_progress p;
    moe_progress_start(&p, f, true, "steps", 10);
    for (int i = 0; i <= 10; i++) moe_progress_update(&p, (uint64_t)i);
    moe_progress_finish(&p);
    assert_false(p.draw);
    assert_int_equal(ftell(f), 0);
    fclose(f);
}

static void test_log_levels(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    struct moe_log log;
    moe_log_init(&log, MOE_LOG_WARN);
    log.out = f;
    moe_log_msg(&log, MOE_LOG_INFO, "hidden");
    moe_log_msg(&log, MOE_LOG_WARN, "shown %d", 1);
    struct moe_error err;
    moe_error_set_at(&err, MOE_ERR_INPUT, "a.json", 2, 3, "boom");
    moe_log_error(&log, &err);
    rewind(f);
    char buf[256];
    assert_non_null(fgets(buf, sizeof buf, f));
    assert_string_equal(buf, "moeplan: warning: shown 1\n");
    assert_non_null(fgets(buf, sizeof buf, f));
    assert_string_equal(buf, "moeplan: a.json:2:3: boom\n");
    assert_null(fgets(buf, sizeof buf, f));
    fclose(f);
}

/* A writer killed with SIGKILL at random moments, 60 times: the file is always absent (before
 * the first write landed), or the old content, or the new one, whole; never torn. */
static void test_atomic_write_killed(void **state)
{
    (void)state;
    char dir[] = "/tmp/moe_test_kill_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/out.json", dir);
    size_t na = 3u << 20, nb = 5u << 20;
    char *a = malloc(na), *b = malloc(nb), *got = malloc(nb + 1);
    assert_true(a && b && got);
    memset(a, 'a', na);
    memset(b, 'b', nb);
    memcpy(a + na - 5, "A-END", 5);
    memcpy(b + nb - 5, "B-END", 5);
    struct moe_rng rng;
    moe_rng_seed(&rng, 77);
    int absent = 0, old_or_new = 0, leftovers = 0;
    for (int round = 0; round < 60; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* the writer: A, B, A, ... as fast as it can */
            for (int i = 0;; i++) {
                struct moe_error e;
                if (moe_file_write_atomic(path, i % 2 ? b : a, i % 2 ? nb : na, &e) != MOE_OK)
                    _exit(3);
            }
        }
        struct timespec nap = {0, (long)moe_rng_below(&rng, 30000000)}; /* up to 30 ms */
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); /* killed, not failed */
        FILE *f = fopen(path, "rb");
        if (!f) {
            absent++;
            continue;
        }
        size_t n = fread(got, 1, nb + 1, f);
        fclose(f);
        bool is_a = n == na && !memcmp(got, a, na), is_b = n == nb && !memcmp(got, b, nb);
        if (!is_a && !is_b) fail_msg("round %d: a torn file of %zu bytes", round, n);
        old_or_new++;
        DIR *d = opendir(dir); /* what a kill left behind: temp files, never the target torn */
        for (struct dirent *e; d && (e = readdir(d));)
            if (strstr(e->d_name, ".tmp.")) {
                char tmp[512];
                snprintf(tmp, sizeof tmp, "%s/%s", dir, e->d_name);
                unlink(tmp);
                leftovers++;
            }
        if (d) closedir(d);
    }
    printf("60 kills: %d before the first write, %d a whole file (old or new), %d killed mid-write "
           "(their temp files removed)\n",
           absent, old_or_new, leftovers);
    assert_true(old_or_new > 0 && leftovers > 0); /* the kills did land inside writes */
    unlink(path);
    rmdir(dir);
    free(a), free(b), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_codes),
        cmocka_unit_test(test_error_format),
        cmocka_unit_test(test_try_macros),
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_json_locate),
        cmocka_unit_test(test_json_unpack),
        cmocka_unit_test(test_json_syntax_errors),
        cmocka_unit_test(test_json_write_atomic),
        cmocka_unit_test(test_progress_not_a_terminal),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_atomic_write_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
