/*
 * test_hostile.c: moeplan against hostile input, as a new user or an attacker would try it: every
 * case of the reliability sweep (issue 20) with its exit code and the words of its message, and
 * the guarantee that no command changes the bytes of a file it read.
 *
 * Each case runs the real binary in a fresh folder of its own (mkdtemp). None may crash or hang
 * (cli_run.h fails the test on a signal and kills a run after 120 s).
 */
#include "cli_run.h"

#include "moe_common.h"
#include "plan.h"

#include <dirent.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define dir cli_scratch
#define at cli_tmp

static void put(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void copy(const char *from, const char *name)
{
    size_t n;
    char *b = slurp_all(from, &n);
    assert_non_null(b);
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
}

/* DIR/name: the file `from` with its one occurrence of `was` replaced by `now`. */
static void put_edited(const char *name, const char *from, const char *was, const char *now)
{
    size_t n;
    char *text = slurp_all(from, &n);
    assert_non_null(text);
    char *k = strstr(text, was);
    if (!k) fail_msg("%s has no '%s'", from, was);
    char *edited = malloc(n + strlen(now) + 1);
    assert_non_null(edited);
    size_t pre = (size_t)(k - text);
    memcpy(edited, text, pre);
    strcpy(edited + pre, now);
    strcat(edited, k + strlen(was));
    put(name, edited);
    free(edited);
    free(text);
}

static void expect(const struct result *r, int code, const char *words)
{
    if (r->code != code || (words && !strstr(r->err, words) && !strstr(r->out, words)))
        fail_msg("exit %d (want %d), expected '%s' in:\n%s%s", r->code, code, words ? words : "",
                 r->err, r->out);
}

#define TINY "--model", "tiny-moe-gqa", "--cluster", "h200-vm", "--seq-len", "128"

/* A stack fit keeps each GPU's own measured compute where one is shipped
 * (topologies/calibration/<gpu>.json, under MOEPLAN_DATA_DIR here): anything at that name that is
 * not the GPU's measured profile is refused at its path, never passed over for the H200's. */
static void test_measured_per_gpu(void **state)
{
    (void)state;
    static struct result r;
    char path[512], from[512];
    assert_int_equal(mkdir(at("data"), 0755), 0);
    assert_int_equal(mkdir(at("data/topologies"), 0755), 0);
    assert_int_equal(mkdir(at("data/topologies/calibration"), 0755), 0);
    snprintf(from, sizeof from, "%s/model", MOEPLAN_SOURCE_DIR);
    assert_int_equal(symlink(from, at("data/model")), 0);
    snprintf(from, sizeof from, "%s/topologies", MOEPLAN_SOURCE_DIR);
    DIR *d = opendir(from); /* the shipped topologies, all but the calibration folder */
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "calibration")) continue;
        snprintf(from, sizeof from, "%s/topologies/%s", MOEPLAN_SOURCE_DIR, e->d_name);
        snprintf(path, sizeof path, "%s/data/topologies/%s", dir, e->d_name);
        assert_int_equal(symlink(from, path), 0);
    }
    closedir(d);
    snprintf(from, sizeof from, "%s/topologies/calibration/h200.json", MOEPLAN_SOURCE_DIR);
    assert_int_equal(symlink(from, at("data/topologies/calibration/h200.json")), 0);
    char tsv[512], stack_profile[512];
    snprintf(tsv, sizeof tsv, "%s/tests/data/published/mb-runs.tsv", MOEPLAN_SOURCE_DIR);
    snprintf(stack_profile, sizeof stack_profile,
             "%s/topologies/calibration/stacks/megatron-26.04/h100.json", MOEPLAN_SOURCE_DIR);
    char h100[512], nowhere[512]; /* (at() hands back one buffer) */
    snprintf(h100, sizeof h100, "%s", at("data/topologies/calibration/h100.json"));
    snprintf(nowhere, sizeof nowhere, "%s", at("nowhere.json"));
    /* the data folder for the run alone: a failed check leaves no environment behind */
#define FIT_H100(res)                                                                              \
    do {                                                                                           \
        assert_int_equal(setenv("MOEPLAN_DATA_DIR", at("data"), 1), 0);                            \
        RUN(res, "calibrate", "--published", tsv, "--stack", "megatron-26.04", "--cluster",        \
            "hgx-h100-x128", "-o", at("fit.json"));                                                \
        assert_int_equal(unsetenv("MOEPLAN_DATA_DIR"), 0);                                         \
    } while (0)
    static const struct {
        const char *what, *words;
    } cases[] = {
        {"stack", "the H100's measured profile, whose compute its published rows keep, is not one"},
        {"h200", "measured on the NVIDIA H200, not the H100"},
        {"nameless", "names no GPU (\"gpu\"): the H100's measured profile must name it"},
        {"loop", "h100.json"},
        {"dangling", "h100.json"},
        {"folder", "h100.json"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *w = cases[c].what;
        if (!strcmp(w, "stack")) copy(stack_profile, "data/topologies/calibration/h100.json");
        if (!strcmp(w, "h200")) copy(from, "data/topologies/calibration/h100.json");
        if (!strcmp(w, "nameless"))
            put_edited("data/topologies/calibration/h100.json", from, "\"gpu\": \"NVIDIA H200\"",
                       "\"gpu\": \"\"");
        if (!strcmp(w, "loop")) assert_int_equal(symlink(h100, h100), 0);
        if (!strcmp(w, "dangling")) assert_int_equal(symlink(nowhere, h100), 0);
        if (!strcmp(w, "folder")) assert_int_equal(mkdir(h100, 0755), 0);
        FIT_H100(&r);
        expect(&r, 3, cases[c].words);
        struct stat sb;
        assert_int_not_equal(stat(at("fit.json"), &sb), 0); /* nothing written */
        assert_int_equal(!strcmp(w, "folder") ? rmdir(h100) : unlink(h100), 0);
    }
    /* the H100's own: its rows keep it, and the profile says so; none there: the H200's */
    put_edited("data/topologies/calibration/h100.json", from, "\"gpu\": \"NVIDIA H200\"",
               "\"gpu\": \"NVIDIA H100 80GB HBM3\"");
    FIT_H100(&r);
    expect(&r, 0, "as measured in topologies/calibration/h100.json");
    assert_int_equal(unlink(h100), 0);
    FIT_H100(&r);
    expect(&r, 0, "as measured in topologies/calibration/h200.json");
#undef FIT_H100
}

/* More routed experts than any fixed array held (4,096 before): no crash, and the bounds say so. */
static void test_expert_counts(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "predict", TINY, "--experts", "5000", "--layout", "tp=1");
    expect(&r, 0, "step");
    RUN(&r, "predict", TINY, "--experts", "65536", "--layout", "tp=1,ep=1");
    expect(&r, 0, "step");
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "hgx-h100-x128", "--experts", "16384",
        "--layers", "4", "--layout", "tp=1,pp=1,ep=64,dp=64", "--gpus", "64");
    expect(&r, 4, "does not fit"); /* costed whole: 256 experts a GPU do not fit an H100 */
    RUN(&r, "predict", TINY, "--experts", "65537", "--layout", "tp=1");
    expect(&r, 2, "must be in [1, 65536]");
    static const struct {
        int experts, top_k;
        const char *words;
    } files[] = {{70000, 2, "65536"}, {128, 100, "top_k"}, {8192, 2, NULL}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"schema\": \"moeplan.model\", \"version\": 1, \"name\": \"m\", \"layers\": 2, "
                 "\"hidden\": 64, \"vocab\": 256, \"attention\": {\"type\": \"gqa\", \"heads\": 4, "
                 "\"kv_heads\": 2, \"head_dim\": 16}, \"moe\": {\"experts\": %d, \"top_k\": %d, "
                 "\"intermediate\": 32}}",
                 files[i].experts, files[i].top_k);
        put("big-model.json", text);
        RUN(&r, "check", at("big-model.json"));
        expect(&r, files[i].words ? 3 : 0, files[i].words);
    }
    /* a model file past the old 4,096-expert arrays, through the cost model */
    RUN(&r, "predict", "--model", at("big-model.json"), "--cluster", "h200-vm", "--seq-len", "128",
        "--layout", "tp=1");
    expect(&r, 0, "step");
}

/* A FIFO named as any input is refused at once, never opened for a blocking read. */
static void test_fifo_inputs(void **state)
{
    (void)state;
    static struct result r;
    assert_int_equal(mkfifo(at("fifo.json"), 0600), 0);
    assert_int_equal(mkfifo(at("fifo.xml"), 0600), 0);
    RUN(&r, "check", at("fifo.json"));
    expect(&r, 3, "not a regular file");
    RUN(&r, "plan", "--model", at("fifo.json"), "--cluster", "h200-vm");
    expect(&r, 3, "not a regular file");
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--seq-len", "128", "--cluster", at("fifo.json"));
    expect(&r, 3, "not a regular file");
    RUN(&r, "report", at("fifo.json"), "tests/data/report/measured.json", "-o", at("rep"));
    expect(&r, 3, "not a regular file");
    RUN(&r, "predict", TINY, "--layout", "tp=1", "--calibration", at("fifo.json"));
    expect(&r, 3, "not a regular file");
#ifdef MOEPLAN_HAVE_EXECUTOR
    RUN(&r, "run", at("fifo.json"));
    expect(&r, 3, "not a regular file");
#endif
    RUN(&r, "plan", TINY, "--routing", at("fifo.json"));
    expect(&r, 3, "not a regular file");
    char text[1024];
    snprintf(text, sizeof text,
             "{\"schema\": \"moeplan.cluster\", \"version\": 1, \"name\": \"c\", \"gpu\": "
             "\"H200\", \"node\": {\"name\": \"n\", \"gpus\": 8, \"hwloc_xml\": \"%s\"}, "
             "\"nodes\": 1, \"nvlink_domain\": {\"nodes\": 1}, \"scale_out\": "
             "{\"bandwidth_per_gpu\": \"400Gbps\"}}",
             at("fifo.xml"));
    put("fifo-xml-cluster.json", text);
    RUN(&r, "check", at("fifo-xml-cluster.json"));
    expect(&r, 3, "not a readable regular file");
    RUN(&r, "check", at("fifo.xml"));
    expect(&r, 3, "not a regular file");
    RUN(&r, "check", "/dev/null");
    expect(&r, 3, "not a regular file");
}

/* Clusters: bounded at 2^20 GPUs; the largest plans in about a second into a small file. */
static void test_cluster_size(void **state)
{
    (void)state;
    static struct result r;
    const char *fmt =
        "{\"schema\": \"moeplan.cluster\", \"version\": 1, \"name\": \"big\", \"gpu\": "
        "\"H200\", \"node\": {\"name\": \"n\", \"gpus\": 8}, \"nodes\": %d, "
        "\"nvlink_domain\": {\"nodes\": 1}, \"scale_out\": {\"bandwidth_per_gpu\": "
        "\"400Gbps\"}}";
    char text[512];
    snprintf(text, sizeof text, fmt, 1 << 20);
    put("huge.json", text);
    RUN(&r, "check", at("huge.json"));
    expect(&r, 3, "at most 1048576 GPUs");
    snprintf(text, sizeof text, fmt, 1 << 17);
    put("big.json", text);
    double t0 = moe_time_now_s();
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", at("big.json"), "-o",
        at("big-plan.json"));
    double took = moe_time_now_s() - t0;
    expect(&r, 0, "plan written");
    struct stat sb;
    assert_int_equal(stat(at("big-plan.json"), &sb), 0);
    printf("plan of DeepSeek-V3 on 1,048,576 GPUs: %.1f s, %lld bytes\n", took,
           (long long)sb.st_size);
    assert_true(sb.st_size < 200000); /* proportional to placements, not to GPUs */
    RUN(&r, "check", at("big-plan.json"));
    expect(&r, 0, "1048576 GPUs");
}

/* Outputs: never an input, through links, into devices, '-' is standard output. */
static void test_outputs(void **state)
{
    (void)state;
    static struct result r;
    copy("model/tiny-moe-gqa.json", "m.json");
    copy("topologies/h200-vm.json", "c.json");
    RUN(&r, "plan", "--model", at("m.json"), "--cluster", "h200-vm", "--seq-len", "128", "-o",
        at("m.json"));
    expect(&r, 2, "never overwrites its inputs");
    RUN(&r, "predict", "--model", at("m.json"), "--cluster", "h200-vm", "--seq-len", "128",
        "--layout", "tp=1", "--json", at("m.json"));
    expect(&r, 2, "never overwrites its inputs");
    /* the node XML a shipped cluster names is an input too (found inside the loader) */
    RUN(&r, "plan", TINY, "-o", "topologies/xml/h200-vm-node.xml");
    expect(&r, 2, "never overwrites its inputs");
    RUN(&r, "plan", TINY, "-o", "");
    expect(&r, 2, "empty value");
    RUN(&r, "plan", TINY, "-o", dir);
    expect(&r, 2, "a folder");
    /* a device is refused, never replaced (every output option: test_writer_table) */
    RUN(&r, "plan", TINY, "-o", "/dev/null");
    expect(&r, 2, "a character device, not a file");
    struct stat sb;
    assert_int_equal(stat("/dev/null", &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
    /* a link is written through: the link stays, its target gets the plan */
    put("target.json", "old");
    assert_int_equal(symlink(at("target.json"), at("link.json")), 0);
    RUN(&r, "plan", TINY, "-o", at("link.json"));
    expect(&r, 0, "plan written");
    assert_int_equal(lstat(at("link.json"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    size_t n;
    char *b = slurp_all(at("target.json"), &n);
    assert_non_null(strstr(b, "\"moeplan.plan\""));
    free(b);
    /* '-' is standard output; the table goes to standard error */
    RUN(&r, "plan", TINY, "-o", "-");
    expect(&r, 0, NULL);
    assert_int_equal(r.out[0], '{');
    assert_non_null(strstr(r.out, "\"moeplan.plan\""));
    assert_non_null(strstr(r.err, "layouts tried"));
    RUN(&r, "predict", TINY, "--layout", "tp=1", "--json", "-");
    expect(&r, 0, NULL);
    assert_int_equal(r.out[0], '{');
    struct stat dash;
    assert_true(stat("-", &dash) != 0); /* no file named '-' */
    /* plan without -o says where the plan went */
    RUN(&r, "plan", TINY);
    expect(&r, 0, "no plan file written");
    /* a model path longer than the limit is refused, not cut to another file */
    char longpath[1400];
    memset(longpath, 0, sizeof longpath);
    strcpy(longpath, "model/tiny-moe-gqa.json");
    for (size_t i = strlen(longpath); i < 1200; i += 2) memcpy(longpath + i, "/.", 2);
    RUN(&r, "check", longpath);
    expect(&r, 3, "more than");
    memset(longpath, 0, sizeof longpath);
    for (size_t i = 0; i < 1100; i += 2) memcpy(longpath + i, "./", 2);
    strcat(longpath, "model/tiny-moe-gqa.json");
    RUN(&r, "plan", "--model", longpath, "--cluster", "h200-vm", "--seq-len", "128");
    expect(&r, 3, "more than");
}

/* SIGINT while a plan is written never leaves a temp file behind. */
static void test_interrupted_write(void **state)
{
    (void)state;
    char out[256], cmd[512];
    snprintf(out, sizeof out, "%s/sig-plan.json", dir);
    int left = 0;
    for (int i = 0; i < 20; i++) {
        pid_t pid;
        const char *argv[] = {MOEPLAN_BINARY,    "plan", "--model", "deepseek-v3", "--cluster",
                              "gb300-nvl72-x16", "-o",   out,       NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        assert_int_equal(chdir(MOEPLAN_SOURCE_DIR), 0);
        assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
        usleep((useconds_t)(i * 25000)); /* 0 .. 0.5 s: before, during and after the write */
        kill(pid, SIGINT);
        int status;
        waitpid(pid, &status, 0);
        snprintf(cmd, sizeof cmd, "ls %s | grep -q '\\.tmp\\.'", dir);
        if (system(cmd) == 0) left++;
    }
    assert_int_equal(left, 0);
}

/* What check accepts, every reader accepts: one validator. */
static void test_plan_validator(void **state)
{
    (void)state;
    static struct result r;
    struct {
        const char *from, *to, *words;
    } edits[] = {
        {"\"mbs\": 2", "\"mbs\": -2", "mbs"},
        {"\"layers_per_virtual_stage\": [\n      2\n    ]",
         "\"layers_per_virtual_stage\": [\n      7\n    ]", "layers_per_virtual_stage"},
        {"\"tp\": 1", "\"tp\": 1048576", "not the"},
        {"\"dp\": 8", "\"dp\": 1048576", "not the"},
        {"\"tp\": 1", "\"tp\": 1, \"cp\": 2", "tp x cp x pp x dp"},
        {"\"tp\": 1", "\"tp\": 1, \"cp\": 0", "cp"},
        {"\"tp\": 1", "\"tp\": 1048576, \"cp\": 1048576", "not the"},
        {"\"version\": 3", "\"version\": 2", "plan again"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        put_edited("bad-plan.json", "tests/data/report/plan.json", edits[i].from, edits[i].to);
        RUN(&r, "check", at("bad-plan.json"));
        expect(&r, 3, edits[i].words);
        RUN(&r, "report", at("bad-plan.json"), "tests/data/report/measured.json", "-o", at("rep"));
        expect(&r, 3, edits[i].words);
    }
}

/* Values that were taken wrongly, messages that were unclear. */
static void test_values_and_messages(void **state)
{
    (void)state;
    static struct result r;
    static const struct {
        const char *args[12];
        int code;
        const char *words;
    } cases[] = {
        {{"plan", TINY, "--routing", "zipf:"}, 2, "a non-negative number after ':'"},
        {{"plan", TINY, "--gpus", "9"}, 2, "has 1 usable GPU"},
        {{"plan", TINY, "--gpus", "0x10"}, 2, "not a decimal number"},
        {{"predict", TINY, "--layout", "tp=1,zero=4"}, 2, "zero=4 (0, 1, 2 or 3)"},
        {{"plan", TINY, "--headroom", "0x0.1p0"}, 2, "a number in [0, 0.89]"},
        {{"plan", TINY, "--precision", "mxfp8"}, 4, "mxfp8 needs Blackwell"},
        /* degrees whose products overflow 64 bits: refused by name, no arithmetic wraps */
        {{"predict", TINY, "--layout", "tp=1073741824,cp=1073741824,dp=1073741824"}, 2, "give gbs"},
        {{"predict", TINY, "--layout", "tp=1073741824,cp=1073741824,dp=1073741824,gbs=8"},
         4,
         "none may exceed the GPU count (1)"},
        {{"predict", TINY, "--layout", "offload=2"}, 2, "not a share of the optimizer state"},
        {{"predict", TINY, "--layout", "fp8_params=on"}, 4, "fp8_params: fp8 weights need"},
        {{"report", "tests/data/report/plan.json", "tests/data/report/measured.json", "--compare",
          "a", "--compare", "b", "--compare", "c", "--compare", "d"},
         2,
         "--compare: at most 3 runs"},
        {{"report", "tests/data/report/plan.json", "tests/data/report/measured.json", "--compare",
          "/nonexistent/m.json"},
         3,
         "/nonexistent/m.json"},
        /* -o naming an input: refused, the input untouched */
        {{"report", "tests/data/report/plan.json", "tests/data/report/measured.json", "-o",
          "tests/data/report/measured.json"},
         2,
         "is a file, not a folder"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run(&r, cases[i].args);
        expect(&r, cases[i].code, cases[i].words);
    }
#ifdef MOEPLAN_HAVE_EXECUTOR /* bench's options are a CUDA build's */
    RUN(&r, "bench", "moe", "--precision", "fp16");
    expect(&r, 2, "bf16, fp8 or fp8block");
    RUN(&r, "bench", "moe", "--precision", "mxfp8");
    expect(&r, 2, "mxfp8 needs Blackwell");
#endif
    /* every layout invalid: the commonest reason and an example */
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "h200-vm");
    expect(&r, 4, "commonest reason");
    expect(&r, 4, "seq = 4096 exceeds the model's 256 (e.g. tp=1,");
    /* the search line counts what was tried */
    RUN(&r, "plan", TINY);
    expect(&r, 0, "layouts tried");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--explain");
    expect(&r, 0, "the same step time as contiguous experts");
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72-x16", "--explain");
    expect(&r, 0, "more bytes in all, fewer of them over the slower scale-out");
    RUN(&r, "plan", "--model", "kimi-k2", "--cluster", "gb300-nvl72-x16", "--fix", "pp=4",
        "--explain");
    expect(&r, 0, "faster than the even split"); /* its LM head's rank sheds two blocks */
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--fix", "pp=2",
        "--explain");
    expect(&r, 0, "what the stage split bought: nothing; the even split is as good");
    /* a published-runs file with a bad cell or header: file:line and the column, no profile */
    put_edited("bad.tsv", "tests/data/published/mb-runs.tsv",
               "MB-1\t26.08\tdeepseek-v3\tgb300-nvl72-x16\t256",
               "MB-1\t26.08\tdeepseek-v3\tgb300-nvl72-x16\tmany");
    RUN(&r, "calibrate", "--published", at("bad.tsv"), "--stack", "megatron-26.08", "--cluster",
        "gb300-nvl72-x16", "-o", at("stack.json"));
    expect(&r, 3, "column 5 (gpus): 'many'");
    put_edited("bad.tsv", "tests/data/published/mb-runs.tsv", "\tmoments\ttokens_per_s_gpu",
               "\tmoments\ttokens");
    RUN(&r, "calibrate", "--published", at("bad.tsv"), "--stack", "megatron-26.08", "--cluster",
        "gb300-nvl72-x16", "-o", at("stack.json"));
    expect(&r, 3, "the header is not the 24 columns");
    put_edited("ok.tsv", "tests/data/published/mb-runs.tsv", "MB-1\t", "MB-1\t"); /* a copy */
    RUN(&r, "calibrate", "--published", at("ok.tsv"), "--stack", "megatron-26.08", "--cluster",
        "gb300-nvl72-x16", "-o", at("ok.tsv"));
    expect(&r, 2, "is an input of this command");
    assert_int_equal(access(at("stack.json"), F_OK), -1);
    /* measured step times that no run has */
    const char *keys[] = {"\"step_ms\": 8.97116805892", "\"step_ms\": 196.000893457"};
    const char *vals[] = {"\"step_ms\": -5", "\"step_ms\": 1e308"};
    for (int i = 0; i < 2; i++) {
        put_edited("bad-measured.json", "tests/data/report/measured.json", keys[i], vals[i]);
        RUN(&r, "report", "tests/data/report/plan.json", at("bad-measured.json"), "-o", at("rep"));
        expect(&r, 3, "step_ms");
    }
    /* control characters: refused in names, never printed raw */
    put("ctl.json", "{\"schema\": \"moeplan.model\", \"version\": 1, \"name\": \"m\\u001b[31m\", "
                    "\"layers\": 2, \"hidden\": 64, \"vocab\": 256}");
    RUN(&r, "check", at("ctl.json"));
    expect(&r, 3, "control character");
    assert_null(strchr(r.err, '\033'));
    /* a Hugging Face config: its own key names in messages; a UTF-8 BOM is ignored */
    size_t n;
    char *hf = slurp_all("tests/data/hf/qwen3_moe.json", &n);
    assert_non_null(hf);
    char *bom = malloc(n + 4);
    memcpy(bom, "\xEF\xBB\xBF", 3);
    memcpy(bom + 3, hf, n);
    bom[n + 3] = '\0';
    put("bom.json", bom);
    free(bom);
    RUN(&r, "model", "show", at("bom.json"));
    expect(&r, 0, "MoE");
    free(hf);
    put_edited("hf-bad.json", "tests/data/hf/qwen3_moe.json", "\"decoder_sparse_step\": 1",
               "\"decoder_sparse_step\": 0");
    RUN(&r, "model", "show", at("hf-bad.json"));
    expect(&r, 3, "decoder_sparse_step");
    assert_null(strstr(r.err, "moe_every"));
}

/* No command changes the bytes of a file it read, whatever its output option names. */
static void test_inputs_unchanged(void **state)
{
    (void)state;
    static struct result r;
    copy("model/tiny-moe-gqa.json", "in-model.json");
    copy("topologies/h200-vm.json", "in-cluster.json");
    copy("tests/data/report/plan.json", "in-plan.json");
    copy("tests/data/report/measured.json", "README.md"); /* a measured file report would clobber */
    copy("topologies/calibration/h200.json", "in-cal.json");
    copy("tests/data/routing-small.json", "in-routing.json");
    /* in-cluster.json names its node XML relative to itself */
    char xmldir[300];
    snprintf(xmldir, sizeof xmldir, "%s/xml", dir);
    mkdir(xmldir, 0755);
    copy("topologies/xml/h200-vm-node.xml", "xml/h200-vm-node.xml");
    const char *inputs[] = {"in-model.json", "in-cluster.json", "in-plan.json",        "README.md",
                            "in-cal.json",   "in-routing.json", "xml/h200-vm-node.xml"};
    enum { NIN = sizeof inputs / sizeof inputs[0] };
    char *before[NIN];
    size_t len[NIN];
    for (int i = 0; i < NIN; i++) before[i] = slurp_all(at(inputs[i]), &len[i]);
    int runs = 0;
    const char *outs[] = {"in-model.json", "in-cluster.json", "xml/h200-vm-node.xml",
                          "in-cal.json"};
    for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
        RUN(&r, "plan", "--model", at("in-model.json"), "--cluster", at("in-cluster.json"),
            "--seq-len", "128", "--calibration", at("in-cal.json"), "-o", at(outs[o]));
        expect(&r, 2, "never overwrites its inputs");
        RUN(&r, "predict", "--model", at("in-model.json"), "--cluster", at("in-cluster.json"),
            "--seq-len", "128", "--calibration", at("in-cal.json"), "--layout", "tp=1", "--json",
            at(outs[o]));
        expect(&r, 2, "never overwrites its inputs");
        runs += 2;
    }
    RUN(&r, "plan", "--model", "tiny-moe-mla", "--cluster", "hgx-h200-x8", "--seq-len", "128",
        "--routing", at("in-routing.json"), "-o", at("in-routing.json"));
    expect(&r, 3, NULL); /* the routing's experts do not match: refused before any write */
    RUN(&r, "report", at("in-plan.json"), at("README.md"), "-o", dir);
    expect(&r, 2, "never overwrites its inputs");
    RUN(&r, "topo", "generate", "hgx-h200", "-o", at("in-cluster.json"));
    /* topo generate reads no input: it may replace the file (that is what -o means) */
    copy("topologies/h200-vm.json", "in-cluster.json");
    runs += 3;
#ifdef MOEPLAN_HAVE_EXECUTOR
    RUN(&r, "calibrate", "--refit", at("in-cal.json"), "-o", at("in-cal.json"));
    expect(&r, 2, "never overwrites its inputs");
    runs++;
#endif
    for (int i = 0; i < NIN; i++) {
        size_t n;
        char *now = slurp_all(at(inputs[i]), &n);
        if (!now || n != len[i] || memcmp(now, before[i], n)) fail_msg("%s changed", inputs[i]);
        free(now);
        free(before[i]);
    }
    printf("%d commands aimed their output at their inputs: every input byte unchanged\n", runs);
}

/* ---------------------------------------------------------------------------------------------- */
/* Every output option against the hostile paths (issue 53's class 2)                            */
/* ---------------------------------------------------------------------------------------------- */

#define TSV "tests/data/published/mb-runs.tsv"

/* A hostile path and what each role of option must say of it (NULL: not hostile for that role). */
struct hostile_path {
    const char *name; /* under the scratch folder, or absolute */
    const char *file_words, *dir_words, *either_words;
};

/* What a path is now: its lstat type and, for a regular file, its bytes. */
static void path_state(const char *path, char *buf, size_t cap)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        snprintf(buf, cap, "absent");
        return;
    }
    size_t n = 0;
    char *text = S_ISREG(sb.st_mode) ? slurp_all(path, &n) : NULL;
    snprintf(buf, cap, "mode %o, %zu bytes: %.200s", (unsigned)(sb.st_mode & S_IFMT), n,
             text ? text : "");
    free(text);
}

/* Base invocations of the output options that run to their write on this machine: PATH stands
 * for the output. */
struct base_run {
    const char *cmd, *opt;
    const char *args[16];
    char first; /* the output's first byte: '{' (JSON), '<' (SVG, XML); 0: a folder */
};
static const struct base_run base_runs[] = {
    {"plan", "--output", {"plan", TINY, "-o", "PATH"}, '{'},
    {"predict", "--json", {"predict", TINY, "--layout", "tp=1", "--json", "PATH"}, '{'},
    {"calibrate",
     "--output",
     {"calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cluster", "gb300-nvl72-x16",
      "-o", "PATH"},
     '{'},
    {"calibrate",
     "--svg",
     {"calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate", "--svg",
      "PATH"},
     '<'},
    {"topo", "--output", {"topo", "generate", "hgx-h200", "-o", "PATH"}, '<'},
    {"report",
     "--output",
     {"report", "tests/data/report/plan.json", "tests/data/report/measured.json", "-o", "PATH"},
     0},
};

static void base_args(const struct base_run *b, const char *path, const char **argv)
{
    int n = 0;
    for (int i = 0; b->args[i]; i++) argv[n++] = strcmp(b->args[i], "PATH") ? b->args[i] : path;
    argv[n] = NULL;
}

/* The writes a base invocation must make: through a link (the link stays), to the end of a
 * dangling chain of two links, and to standard output alone. */
/* A folder output: through a link to a folder (written inside it), and through a dangling
 * link (the folder made where it points). */
static void writes_into(const struct base_run *b)
{
    static struct result r;
    const char *argv[20];
    char link[300], dangling[300];
    snprintf(link, sizeof link, "%s", at("wi-link"));
    snprintf(dangling, sizeof dangling, "%s", at("wi-dangling"));
    mkdir(at("wi-dir"), 0755);
    unlink(link), unlink(dangling);
    assert_int_equal(symlink("wi-dir", link), 0);
    assert_int_equal(symlink("wi-new", dangling), 0);
    const char *paths[2] = {link, dangling}, *made[2] = {"wi-dir/README.md", "wi-new/README.md"};
    for (int i = 0; i < 2; i++) {
        base_args(b, paths[i], argv);
        run(&r, argv);
        if (r.code != 0) fail_msg("%s %s %s: exit %d\n%s", b->cmd, b->opt, paths[i], r.code, r.err);
        struct stat sb;
        assert_true(lstat(paths[i], &sb) == 0 && S_ISLNK(sb.st_mode));
        if (access(at(made[i]), F_OK) != 0) fail_msg("%s %s: no %s", b->cmd, b->opt, made[i]);
    }
}

static void writes_through(const struct base_run *b)
{
    static struct result r;
    const char *argv[20];
    char target[300], link[300], chain1[300], chain2[300], end[300];
    snprintf(target, sizeof target, "%s", at("wt-target"));
    snprintf(link, sizeof link, "%s", at("wt-link"));
    snprintf(chain1, sizeof chain1, "%s", at("wt-chain1"));
    snprintf(chain2, sizeof chain2, "%s", at("wt-chain2"));
    snprintf(end, sizeof end, "%s", at("wt-end"));
    unlink(target), unlink(link), unlink(chain1), unlink(chain2), unlink(end);
    put("wt-target", "old");
    assert_int_equal(symlink("wt-target", link), 0);
    base_args(b, link, argv);
    run(&r, argv);
    if (r.code != 0) fail_msg("%s %s through a link: exit %d\n%s", b->cmd, b->opt, r.code, r.err);
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    if (!S_ISLNK(sb.st_mode)) fail_msg("%s %s replaced the link with a file", b->cmd, b->opt);
    size_t n;
    char *text = slurp_all(target, &n);
    if (!text || text[0] != b->first)
        fail_msg("%s %s: the link's target not written", b->cmd, b->opt);
    free(text);
    /* wt-chain1 -> wt-chain2 -> wt-end (missing): the end is written, both links stay */
    assert_int_equal(symlink("wt-chain2", chain1), 0);
    assert_int_equal(symlink("wt-end", chain2), 0);
    base_args(b, chain1, argv);
    run(&r, argv);
    if (r.code != 0)
        fail_msg("%s %s through a dangling chain: exit %d\n%s", b->cmd, b->opt, r.code, r.err);
    assert_true(lstat(chain1, &sb) == 0 && S_ISLNK(sb.st_mode));
    assert_true(lstat(chain2, &sb) == 0 && S_ISLNK(sb.st_mode));
    text = slurp_all(end, &n);
    if (!text || text[0] != b->first)
        fail_msg("%s %s: the end of the dangling chain not written", b->cmd, b->opt);
    free(text);
    /* '-': the data alone on standard output, the rest on standard error, no file named '-' */
    base_args(b, "-", argv);
    run(&r, argv);
    if (r.code != 0) fail_msg("%s %s -: exit %d\n%s", b->cmd, b->opt, r.code, r.err);
    if (r.out[0] != b->first)
        fail_msg("%s %s -: standard output does not start with the data:\n%.300s", b->cmd, b->opt,
                 r.out);
    if (b->first == '{') {
        json_error_t jerr;
        json_t *j = json_loads(r.out, 0, &jerr);
        if (!j)
            fail_msg("%s %s -: standard output is not one JSON document (%s at %d:%d)", b->cmd,
                     b->opt, jerr.text, jerr.line, jerr.column);
        json_decref(j);
    }
    assert_true(access("-", F_OK) != 0);
}

static void test_writer_table(void **state)
{
    (void)state;
    static struct result r, list;
    RUN(&list, "--list-options");
    expect(&list, 0, NULL);
    /* the hostile paths */
    assert_int_equal(mkfifo(at("w-fifo"), 0600), 0);
    assert_int_equal(symlink("w-loop-b", at("w-loop-a")), 0);
    assert_int_equal(symlink("w-loop-a", at("w-loop-b")), 0);
    assert_int_equal(symlink("w-self", at("w-self")), 0);
    put("w-file", "keep");
    assert_int_equal(mkdir(at("w-dir"), 0755), 0);
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", at("w-sock"));
    assert_true(sock >= 0 && bind(sock, (struct sockaddr *)&sa, sizeof sa) == 0);
    static const struct hostile_path paths[] = {
        {"/dev/full", "a character device", "a character device", "a character device"},
        {"w-fifo", "a FIFO", "a FIFO", "a FIFO"},
        {"w-sock", "a socket", "a socket", "a socket"},
        {"w-loop-a", "loop of symbolic links", "loop of symbolic links", "loop of symbolic links"},
        {"w-self", "loop of symbolic links", "loop of symbolic links", "loop of symbolic links"},
        {"w-loop-a/x", "loop of symbolic links", "loop of symbolic links",
         "loop of symbolic links"},
        {"w-none/x", "does not exist", "does not exist", "does not exist"},
        {"w-file/x", "not a folder", "not a folder", "not a folder"},
        {"w-dir", "a folder, not a file", NULL, NULL},
        {"w-file", NULL, "a file, not a folder", NULL},
        {"-", NULL, "standard output cannot hold", NULL},
    };
    int options = 0, refusals = 0, written = 0;
    char only_refused[2048] = "";
    for (char *line = list.out, *next; *line; line = next) {
        next = strchr(line, '\n');
        if (!next) break;
        *next++ = '\0';
        char cmd[32], opt[64], arg[32], role[32];
        if (sscanf(line, "%31[^\t]\t%63[^\t]\t%31[^\t]\t%31s", cmd, opt, arg, role) != 4)
            fail_msg("--list-options: '%s' is not command, option, argument, role", line);
        int kind = !strcmp(role, "out-file")     ? 0
                   : !strcmp(role, "out-dir")    ? 1
                   : !strcmp(role, "out-either") ? 2
                                                 : -1;
        if (kind < 0) {
            if (strcmp(role, "-") && strcmp(role, "repeatable"))
                fail_msg("--list-options: unknown role '%s'", role);
            continue;
        }
        options++;
        for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
            const char *words = kind == 0   ? paths[k].file_words
                                : kind == 1 ? paths[k].dir_words
                                            : paths[k].either_words;
            if (!words) continue;
            char path[300], before[512], after[512];
            if (paths[k].name[0] == '/' || !strcmp(paths[k].name, "-"))
                snprintf(path, sizeof path, "%s", paths[k].name);
            else
                snprintf(path, sizeof path, "%s", at(paths[k].name));
            path_state(path, before, sizeof before);
            RUN(&r, cmd, opt, path);
            if (r.code != 2 || !strstr(r.err, words))
                fail_msg("moeplan %s %s %s: exit %d (want 2), expected '%s' in:\n%s", cmd, opt,
                         path, r.code, words, r.err);
            path_state(path, after, sizeof after);
            if (strcmp(before, after))
                fail_msg("moeplan %s %s %s changed it: %s -> %s", cmd, opt, path, before, after);
            refusals++;
        }
        bool ran = false;
        for (size_t b = 0; b < sizeof base_runs / sizeof base_runs[0]; b++)
            if (!strcmp(base_runs[b].cmd, cmd) && !strcmp(base_runs[b].opt, opt)) {
                if (base_runs[b].first)
                    writes_through(&base_runs[b]);
                else
                    writes_into(&base_runs[b]);
                written++;
                ran = true;
            }
        if (!ran)
            snprintf(only_refused + strlen(only_refused),
                     sizeof only_refused - strlen(only_refused), "%s%s %s",
                     only_refused[0] ? ", " : "", cmd, opt);
    }
    close(sock);
    printf("%d output options: %d hostile paths refused, each left as it was; %d written through "
           "links, dangling chains and '-' (folders: into links); refusals only (their writes need "
           "a GPU or a run): "
           "%s\n",
           options, refusals, written, only_refused[0] ? only_refused : "none");
    assert_true(options >= 12);
    assert_true(written >= 6);
    /* calibrate --cross-validate writes no profile: -o is refused, not ignored */
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate", "-o",
        at("cv.json"));
    expect(&r, 2, "--cross-validate writes no profile, so no -o");
    /* two outputs cannot both be standard output */
    RUN(&r, "bench", "moe", "--json", "-", "--routing-out", "-");
    expect(&r, 2, "only one output can be standard output");
    /* an option with a value given twice: refused, never the last one silently kept */
    RUN(&r, "plan", TINY, "--fix", "tp=2", "--fix", "ep=4");
    expect(&r, 2, "option '--fix' given twice (tp=2, ep=4)");
    RUN(&r, "predict", TINY, "--layout", "tp=2,tp=1");
    expect(&r, 2, "layout: tp given twice");
    /* what leads to /proc (a descriptor of this process) is not a file: '-' is */
    RUN(&r, "plan", TINY, "-o", "/dev/stdout");
    expect(&r, 2, "a process's descriptor or a kernel setting, not a file");
    RUN(&r, "plan", TINY, "-o", "/proc/self/comm");
    expect(&r, 2, "not files moeplan writes");
    RUN(&r, "plan", TINY, "-o", at("no-such-folder/"));
    expect(&r, 2, "ends in '/'");
    /* a 250-byte file name is written (the temp file's name does not grow with it) */
    char longname[300];
    memset(longname, 'a', 250);
    longname[250] = '\0';
    RUN(&r, "plan", TINY, "-o", at(longname));
    expect(&r, 0, "plan written");
    /* a replaced file keeps its mode; one with other names (hard links) is refused */
    put("mode.json", "old");
    chmod(at("mode.json"), 0640);
    RUN(&r, "plan", TINY, "-o", at("mode.json"));
    expect(&r, 0, "plan written");
    struct stat sb;
    assert_int_equal(stat(at("mode.json"), &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    assert_int_equal(link(at("mode.json"), at("mode-link.json")), 0);
    RUN(&r, "plan", TINY, "-o", at("mode.json"));
    expect(&r, 2, "has 2 names (hard links)");
    /* topo show and list write nothing: --output is refused, not ignored */
    RUN(&r, "topo", "list", "-o", at("list.txt"));
    expect(&r, 2, "'list' writes no file");
    /* a report's files are all checked before the first is written */
    assert_int_equal(mkdir(at("rep-fifo"), 0755), 0);
    assert_int_equal(mkfifo(at("rep-fifo/README.md"), 0600), 0);
    RUN(&r, "report", "tests/data/report/plan.json", "tests/data/report/measured.json", "-o",
        at("rep-fifo"));
    expect(&r, 2, "a FIFO");
    assert_int_equal(access(at("rep-fifo/phases.svg"), F_OK), -1);
}

/* ---------------------------------------------------------------------------------------------- */
/* Every layout key, honoured or refused by name wherever a layout is taken (class 3)            */
/* ---------------------------------------------------------------------------------------------- */

/* A value for each key that is not its default, and the keys it needs beside it. A key of the
 * grammar missing here fails the test: a new key must say how it is honoured. */
static const struct {
    const char *key, *value, *with;
} key_cases[] = {
    {"tp", "2", NULL},
    {"cp", "2", NULL},
    {"pp", "2", NULL},
    {"vpp", "2", "pp=2"},
    {"ep", "2", NULL},
    {"etp", "2", "tp=2,ep=2"},
    {"dp", "4", NULL},
    {"zero", "2", NULL},
    {"mbs", "2", NULL},
    {"gbs", "32", NULL},
    {"seq", "64", NULL},
    {"seq_len", "64", NULL},
    {"precision", "fp8", NULL},
    {"recompute", "full", NULL},
    {"recompute_layers", "1", "recompute=full"},
    {"dispatcher", "deepep", "ep=2"},
    {"overlap", "on", "ep=2"},
    {"delay_wgrad", "on", "ep=2,overlap=on"},
    {"cuda_graphs", "full", NULL},
    {"ep_sms", "16", "ep=2,dispatcher=deepep"},
    {"mtp", "1", NULL},
    {"grad_reduce", "bf16", NULL},
    {"moments", "bf16", NULL},
    {"fp8_params", "on", "precision=fp8"},
    {"offload", "0.5", NULL},
    {"pp_layout", "Et*2|t*2L", "pp=2"},
    {"act_offload", "expert_fc1+moe_act", NULL},
};
/* The model the key table runs on: four blocks, so that pp x vpp = 4 stages have a layer each. */
#define KEYS_MODEL "--model", "mixtral-8x7b", "--layers", "4", "--experts", "8"

/* The layout text a surface reports, as key=value ("seq" for either name of the sequence). */
static bool text_has(const char *text, const char *key, const char *value)
{
    char want[96];
    snprintf(want, sizeof want, "%s=%s,", strcmp(key, "seq_len") ? key : "seq", value);
    char padded[1200];
    snprintf(padded, sizeof padded, ",%s,", text);
    char lead[100];
    snprintf(lead, sizeof lead, ",%s", want);
    return strstr(padded, lead) != NULL;
}

/* The plan file's layout object's value of `key`, as the grammar writes it. */
static void plan_value(const char *file, const char *key, char *buf, size_t cap)
{
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    assert_non_null(root);
    json_t *v = json_object_get(json_object_get(root, "layout"),
                                strcmp(key, "seq") && strcmp(key, "seq_len") ? key : "seq_len");
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(buf, cap, "%s", json_is_true(v) ? "on" : "off");
    else if (json_is_string(v))
        snprintf(buf, cap, "%s", json_string_value(v));
    else
        snprintf(buf, cap, "(none)");
    json_decref(root);
}

/* One surface's verdict on one key: honoured (exit 0 and `shown` holds the value), or refused
 * with exit 2 or 4 by a message that names the key; anything else fails the test. */
struct key_tally {
    const char *surface;
    int honoured, refused;
    char names[512]; /* the keys refused */
};

static void key_verdict(struct key_tally *t, const struct result *r, bool shown, const char *args,
                        const char *key, const char *name)
{
    if (r->code == 0 && shown) {
        t->honoured++;
    } else if (r->code == 0) {
        fail_msg("%s %s: exit 0, but the result does not show %s", t->surface, args, key);
    } else if ((r->code == 2 || r->code == 4) && strstr(r->err, name)) {
        t->refused++;
        snprintf(t->names + strlen(t->names), sizeof t->names - strlen(t->names), " %s", key);
    } else {
        fail_msg("%s %s: exit %d without naming %s:\n%s", t->surface, args, r->code, key, r->err);
    }
}

static void test_layout_keys(void **state)
{
    (void)state;
    static struct result r;
    struct key_tally tally[3] = {{"predict --layout", 0, 0, ""},
                                 {"plan --fix", 0, 0, ""},
                                 {"plan --explain --compare", 0, 0, ""}};
    int n = 0;
    for (const struct cost_layout_key *k = cost_layout_keys; k->name; k++, n++) {
        size_t c = 0;
        while (c < sizeof key_cases / sizeof key_cases[0] && strcmp(key_cases[c].key, k->name)) c++;
        if (c == sizeof key_cases / sizeof key_cases[0])
            fail_msg("layout key '%s' has no case here: say how --fix, --layout and --compare "
                     "honour it",
                     k->name);
        const char *with = key_cases[c].with, *value = key_cases[c].value;
        bool is_seq = !strcmp(k->name, "seq") || !strcmp(k->name, "seq_len");
        const char *name = is_seq ? "seq" : k->name; /* what a refusal calls it */
        char kv[200], lay[300];
        snprintf(kv, sizeof kv, "%s%s%s=%s", with ? with : "", with ? "," : "", k->name, value);
        snprintf(lay, sizeof lay, "%s%s", is_seq ? "" : "seq=128,", kv);
        /* predict --layout: the prediction's layout text */
        RUN(&r, "predict", KEYS_MODEL, "--cluster", "hgx-h200-x8", "--layout", lay, "--json",
            at("key-pred.json"));
        bool shown = false;
        if (r.code == 0) {
            json_t *root = json_load_file(at("key-pred.json"), 0, NULL);
            const char *got = json_string_value(json_object_get(root, "layout"));
            shown = got && text_has(got, k->name, value);
            json_decref(root);
        }
        key_verdict(&tally[0], &r, shown, lay, k->name, name);
        /* plan --fix: the plan file's layout */
        RUN(&r, "plan", KEYS_MODEL, "--cluster", "hgx-h200-x8", "--fix", lay, "-o",
            at("key-plan.json"));
        char got[200] = "";
        if (r.code == 0) plan_value(at("key-plan.json"), k->name, got, sizeof got);
        key_verdict(&tally[1], &r, !strcmp(got, value), lay, k->name, name);
        /* plan --explain --compare: the compared layout as --layout takes it */
        RUN(&r, "plan", KEYS_MODEL, "--cluster", "hgx-h200-x8", "--seq-len", "128", "--explain",
            "--compare", kv);
        char line[800] = "";
        char *as = r.code == 0 ? strstr(r.out, "as --layout: ") : NULL;
        if (as) sscanf(as + strlen("as --layout: "), "%799[^\n]", line);
        key_verdict(&tally[2], &r, text_has(line, k->name, value), kv, k->name, name);
    }
    for (int i = 0; i < 3; i++)
        printf("%d layout keys: %s honours %d, refuses %d by name (%s)\n", n, tally[i].surface,
               tally[i].honoured, tally[i].refused, tally[i].names[0] ? tally[i].names + 1 : "");
    /* what a workload's surface cannot take is refused; the rest is honoured */
    assert_true(tally[0].honoured >= n - 1 && tally[1].honoured == n);
    /* an option and the layout giving one value differently: refused, never one silently */
    RUN(&r, "plan", TINY, "--fix", "seq=64");
    expect(&r, 2, "--fix seq=64 and --seq-len 128 disagree");
    RUN(&r, "plan", TINY, "--gbs", "16", "--fix", "gbs=32");
    expect(&r, 2, "--fix gbs=32 and --gbs 16 disagree");
    RUN(&r, "plan", TINY, "--precision", "fp8", "--fix", "precision=bf16");
    expect(&r, 2, "--fix precision=bf16 and --precision fp8 disagree");
    RUN(&r, "predict", TINY, "--precision", "fp8", "--layout", "precision=fp8block");
    expect(&r, 2, "--layout precision=fp8block and --precision fp8 disagree");
    RUN(&r, "plan", TINY, "--explain", "--compare", "gbs=16");
    expect(&r, 2, "compare layouts of one workload");
    RUN(&r, "plan", "--published", TSV, "--run", "MB-8", "--fix", "seq=2048");
    expect(&r, 2, "--fix may not give seq, gbs or precision with it");
    /* MaxText's pipeline: even stages only (DeepSeek-V3's 61 layers: no pp > 1) */
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "hgx-h100-x128", "--emit", "maxtext",
        "--fix", "pp=4");
    expect(&r, 4, "61 layers do not split evenly into pp x vpp = 4 stages");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--emit", "maxtext",
        "--fix", "pp=4,vpp=2");
    expect(&r, 0, "num_layers_per_pipeline_stage: 4");
    expect(&r, 0, "layers per virtual stage [4,4,4,4,4,4,4,4]");
}

/* ---------------------------------------------------------------------------------------------- */
/* Published-runs files, stacks and Hugging Face configs (classes 1, 4 and 5)                     */
/* ---------------------------------------------------------------------------------------------- */

static void test_published_hostile(void **state)
{
    (void)state;
    static struct result r;
    const char *row = "MB-1\t26.08\tdeepseek-v3\tgb300-nvl72-x16\t256";
    /* tp, pp and cp whose int product wrapped to 0 (SIGFPE): refused at the row, in 64 bits */
    size_t n;
    char *text = slurp_all(TSV, &n);
    char *at_row = strstr(text, row);
    assert_non_null(at_row);
    char *line_end = strchr(at_row, '\n');
    char orig[2048];
    snprintf(orig, sizeof orig, "%.*s", (int)(line_end - at_row), at_row);
    char *cols[24];
    int nc = 0;
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s", orig);
    for (char *p = tmp, *save = NULL; nc < 24 && (p = strtok_r(nc ? NULL : p, "\t", &save));)
        cols[nc++] = p;
    assert_int_equal(nc, 24);
    static const struct {
        int col;
        const char *value, *words;
        int code;
    } edits[] = {
        {9, "1048576", "tp x pp x cp = 1048576 x", 3}, /* with cp 1048576 below */
        {5, "bf16,tp=8", "column 6 (precision): 'bf16,tp=8': one value, without ',' or '='", 3},
        {17, "nccl", "column 18 (dispatcher): 'nccl'", 3},
        {14, "everything", "column 15 (recompute): 'everything'", 3},
        {0, "MB-1\x1b[31m", "control character 0x1b", 3},
        {2, "no-such-model", "MB-1: model: no model named 'no-such-model'", 3},
        /* the flags' recipe settings: layout keys of the overhead kind only, each value checked */
        {23, "tokendrop,tp=8", "column 24 (flags): 'tokendrop,tp=8': 'tp=8': a recipe setting", 3},
        {23, "cuda_graphs=sometimes", "column 24 (flags): 'cuda_graphs=sometimes': ", 3},
        {23, "overlap=on,,tokendrop", "an empty item", 3},
        {23, "notokendrop", "'notokendrop': a flag is tokendrop, muon, recipe-mbs", 3},
        {23, "tokendrop,tokendrop", "column 24 (flags): 'tokendrop,tokendrop': 'tokendrop' again",
         3},
        {23, "cuda_graphs=full,cuda_graphs=none", "'cuda_graphs' again: give each flag once", 3},
        {23, "ep_sms=1000", ":129: MB-1: flags: ep_sms = 1000: the GB300 has 160 SMs", 3},
    };
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        char edited[2048] = "";
        for (int i = 0; i < 24; i++) {
            const char *v = i == edits[e].col ? edits[e].value : cols[i];
            if (e == 0 && i == 11) v = "1048576";
            snprintf(edited + strlen(edited), sizeof edited - strlen(edited), "%s%s", i ? "\t" : "",
                     v);
        }
        put_edited("hostile.tsv", TSV, orig, edited);
        RUN(&r, "calibrate", "--published", at("hostile.tsv"), "--stack", "megatron-26.08",
            "--cross-validate");
        expect(&r, edits[e].code, edits[e].words);
        if (edits[e].words[0] == ':') { /* at the row's own line */
            int line = 1;
            for (const char *c = text; c < at_row; c++) line += *c == '\n';
            char where[64];
            snprintf(where, sizeof where, "hostile.tsv:%d%s", line, ":129:");
            expect(&r, edits[e].code, where);
        }
        assert_null(strchr(r.err, '\033')); /* never a control character raw to the terminal */
        if (e == 0 || e == 5) { /* the row's own run too: file:line:column, no option's name */
            RUN(&r, "plan", "--published", at("hostile.tsv"), "--run", "MB-1");
            expect(&r, 3, edits[e].words);
            expect(&r, 3, "hostile.tsv:");
            assert_null(strstr(r.err, "--fix"));
            assert_null(strstr(r.err, "--compare"));
        }
    }
    free(text);
    /* bytes a text file does not hold: named at their line and column */
    put("nul.tsv", "# a comment\nid\tcontainer\tmodel\n");
    FILE *f = fopen(at("nul.tsv"), "ab");
    fwrite("MB\0x\n", 1, 5, f);
    fclose(f);
    RUN(&r, "calibrate", "--published", at("nul.tsv"), "--stack", "megatron-26.08",
        "--cross-validate");
    expect(&r, 3, "nul.tsv:3:3: a NUL byte");
    put("cr.tsv", "# a comment\rid\tcontainer\r");
    RUN(&r, "calibrate", "--published", at("cr.tsv"), "--stack", "megatron-26.08",
        "--cross-validate");
    expect(&r, 3, "cr.tsv:1:12: a carriage return alone ends a line");
    put_edited("dup.tsv", TSV, "MB-5\t", "MB-1\t");
    RUN(&r, "calibrate", "--published", at("dup.tsv"), "--stack", "megatron-26.08",
        "--cross-validate");
    expect(&r, 3, "id MB-1 again (first on line");
    /* a row that ran what moeplan does not model (Muon: MB-90; dropped tokens) is in no fit,
     * nor predicted in the cross-validation, while the rows beside it are */
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.02", "--cross-validate");
    expect(&r, 0, "MB-91 ");
    if (strstr(r.out, "MB-90 ")) fail_msg("MB-90 (flagged muon) in the 26.02 fit:\n%s", r.out);
    /* --stack names a stack exactly: a prefix pulled in every container before */
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-2", "--cross-validate");
    expect(&r, 2, "--stack megatron-2: " TSV " has no row of that stack (its stacks: ");
    expect(&r, 2, "megatron-26.04");
    RUN(&r, "calibrate", "--published", TSV, "--stack", "26.04", "--cross-validate");
    expect(&r, 2, "has no row of that stack");
    /* --measured: a profile measured on a GPU, not a fitted stack profile; only with --published */
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate",
        "--measured", "topologies/calibration/stacks/megatron-26.08/gb300.json");
    expect(&r, 3, "--measured takes a profile `moeplan calibrate` measured on a GPU");
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate",
        "--measured", at("no-such-profile.json"));
    expect(&r, 3, "no-such-profile.json");
    RUN(&r, "calibrate", "--refit", "topologies/calibration/h200.json", "--measured",
        "topologies/calibration/h200.json");
    expect(&r, 2, "--measured goes with --published");
    /* --measured is an input like any: a FIFO refused at once, and never the -o it writes */
    put_edited("m.json", "topologies/calibration/h200.json", "\"gemm_eff\"", "\"gemm_eff\"");
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cluster",
        "gb300-nvl72-x16", "--measured", at("m.json"), "-o", at("m.json"));
    expect(&r, 2, "is an input of this command");
    assert_int_equal(mkfifo(at("m.fifo"), 0600), 0);
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate",
        "--measured", at("m.fifo"));
    expect(&r, 3, "not a regular file (a FIFO)");
    put_edited("no-grid.json", "topologies/calibration/h200.json",
               "\"gemm_m_n_k_us\":", "\"gemm_grid_renamed\":");
    RUN(&r, "calibrate", "--published", TSV, "--stack", "megatron-26.08", "--cross-validate",
        "--measured", at("no-grid.json"));
    expect(&r, 3, "measured on a GPU (its \"measured\" data with the GEMM grid); this is not one");
    /* act_offload under full recompute: only what is not redone from the block's input */
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "gb300-nvl72-x16", "--gpus", "128",
        "--layout", "tp=1,ep=8,dp=128,zero=3,mbs=6,gbs=768,recompute=full,act_offload=qkv_linear");
    expect(&r, 4, "act_offload=qkv_linear under recompute=full");
    /* --fix keys that contradict each other: said as such; a MaxText refusal whole, its example
     * layout as --fix pinned it */
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72-x16", "--gpus", "128",
        "--gbs", "768", "--fix",
        "tp=1,ep=8,dp=128,zero=3,mbs=6,recompute=selective,recompute_layers=5");
    expect(&r, 2,
           "recompute_layers = 5 counts blocks recomputed whole: it goes with recompute=full");
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72-x16", "--gpus", "128",
        "--gbs", "768", "--fix",
        "tp=1,ep=8,pp=4,vpp=2,dp=32,zero=1,mbs=1,recompute=full,recompute_layers=7,mtp=0", "--emit",
        "maxtext");
    expect(&r, 4, "do not split evenly into pp x vpp = 8 stages (e.g. ");
    expect(&r, 4, "recompute=full");
    /* a topology XML's declaration after a tab or across lines: its encoding still checked, at
     * the value's own line and column */
    put("tab.xml", "<?xml\tversion=\"1.0\" encoding=\"latin1\"?>\n<topology/>\n");
    RUN(&r, "check", at("tab.xml"));
    expect(&r, 3, "tab.xml:1:31: encoding 'latin1'");
    put("wrap.xml", "<?xml version=\"1.0\"\n      encoding=\"latin1\"?>\n<topology/>\n");
    RUN(&r, "check", at("wrap.xml"));
    expect(&r, 3, "wrap.xml:2:17: encoding 'latin1'");
    /* and a malformed declaration is named where it goes wrong, not left to hwloc */
    put("quote.xml", "<?xml version=\"1.0\" encoding=\"UTF-8?>\n<topology/>\n");
    RUN(&r, "check", at("quote.xml"));
    expect(&r, 3, "quote.xml:1:30: the value of encoding has no closing quote");
    put("twice.xml",
        "<?xml version=\"1.0\" encoding=\"UTF-8\" encoding=\"UTF-8\"?>\n<topology/>\n");
    RUN(&r, "check", at("twice.xml"));
    expect(&r, 3, "twice.xml:1:38: encoding given twice in the XML declaration");
}

static void test_hf_and_check_hostile(void **state)
{
    (void)state;
    static struct result r;
    put_edited("hf-floor.json", "tests/data/hf/llama4.json", "\"floor_scale\": 8192",
               "\"floor_scale\": 0");
    RUN(&r, "model", "show", at("hf-floor.json"));
    expect(&r, 3, "floor_scale");
    put_edited("hf-mtp.json", "tests/data/hf/deepseek_v3.json", "\"num_nextn_predict_layers\": 1",
               "\"num_nextn_predict_layers\": 1000");
    RUN(&r, "model", "show", at("hf-mtp.json"));
    expect(&r, 3, "num_nextn_predict_layers = 1000: moeplan takes 0 to 64");
    put_edited("hf-types.json", "tests/data/hf/gpt_oss.json", "\"sliding_attention\",", "");
    RUN(&r, "model", "show", at("hf-types.json"));
    expect(&r, 3, "layer_types");
    expect(&r, 3, "not one for each of the");
    /* check refuses what --refit refuses, and plans whose parts disagree with their totals */
    put_edited("cal-bad.json", "topologies/calibration/h200.json",
               "\"launch_us\":", "\"launch_us_renamed\":");
    RUN(&r, "check", at("cal-bad.json"));
    expect(&r, 3, "launch_us");
    RUN(&r, "calibrate", "--refit", at("cal-bad.json"), "-o", at("cal-out.json"));
    expect(&r, 3, "launch_us");
    /* a table of measurements longer than this build keeps is refused, not cut short */
    put_edited("cal-long.json", "topologies/calibration/h100.json",
               "\"attention_sinks_seqs_seq_h_kv_dqk_dv_window_plain_fwd_bwd_sinks_fwd_bwd_us\": [",
               "\"attention_sinks_seqs_seq_h_kv_dqk_dv_window_plain_fwd_bwd_sinks_fwd_bwd_us\": "
               "[[1, 64, 8, 8, 64, 64, 0, 10, 20, 11, 22],");
    RUN(&r, "calibrate", "--refit", at("cal-long.json"), "-o", at("cal-out.json"));
    expect(&r, 3, "5 entries: this build keeps at most 4");
    assert_int_equal(access(at("cal-out.json"), F_OK), -1);
    /* a profile whose jobs' phases follow another order is refused, not read into others */
    put_edited("cal-order.json", "topologies/calibration/h200.json",
               "\"phase_order\": [\n      \"embed\",\n      \"attn_fwd\"",
               "\"phase_order\": [\n      \"attn_fwd\",\n      \"embed\"");
    RUN(&r, "check", at("cal-order.json"));
    expect(&r, 3, "phase_order: not this build's");
    RUN(&r, "calibrate", "--refit", at("cal-order.json"), "-o", at("cal-out.json"));
    expect(&r, 3, "phase_order: not this build's");
    /* the measured GEMM table: each entry [m, n, k, ratio] in range, sorted by n, k, then m; a
     * message names the file's line (counted from where the table starts in the profile) */
    size_t len;
    char *prof = slurp_all("topologies/calibration/h200.json", &len);
    assert_non_null(prof);
    char *at_table = strstr(prof, "\"gemm_table\": [");
    assert_non_null(at_table);
    int table_line = 1;
    for (const char *c = prof; c < at_table; c++) table_line += *c == '\n';
    free(prof);
    static const struct {
        const char *to, *words;
        int below; /* the line of the message, below the table's first (-1: none named) */
    } table_edits[] = {
        {"\"gemm_table\": [\n    [\n      32.0,\n      1536.0,\n      2048.0,\n      99",
         "gemm_table[0][3]: must be in [0.05, 20], got 99", 5},
        {"\"gemm_table\": [\n    [\n      4096.0,\n      1536.0,\n      2048.0,\n      "
         "1.0828476769",
         "gemm_table[1]: not after the entry before it", -1},
        {"\"gemm_table\": [\n    [\n      32.0,\n      1536.0,\n      \"2048\",\n      "
         "1.0828476769",
         "gemm_table[0][2]: must be a number, not a string", 4},
    };
    for (size_t e = 0; e < sizeof table_edits / sizeof table_edits[0]; e++) {
        char words[160];
        if (table_edits[e].below < 0)
            snprintf(words, sizeof words, "%s", table_edits[e].words);
        else
            snprintf(words, sizeof words, "cal-table.json:%d:7: %s",
                     table_line + table_edits[e].below, table_edits[e].words);
        put_edited("cal-table.json", "topologies/calibration/h200.json",
                   "\"gemm_table\": [\n    [\n      32.0,\n      1536.0,\n      2048.0,\n      "
                   "1.0828476769",
                   table_edits[e].to);
        RUN(&r, "check", at("cal-table.json"));
        expect(&r, 3, words);
        RUN(&r, "predict", "--model", "mixtral-8x7b", "--cluster", "h200-vm", "--layout",
            "ep=8,gbs=8", "--calibration", at("cal-table.json"));
        expect(&r, 3, words);
    }
    /* the phase corrections' keys: the host floor only in the experts' phases, spelt as the
     * loader knows it, in range; a stack profile takes no phase correction; the gradients' fp8
     * rate a fraction */
    static const struct {
        const char *file, *was, *now, *words;
    } phase_edits[] = {
        {"topologies/calibration/h200.json", "\"floor_us_per_expert\": 21.75",
         "\"floor_us_per_experts\": 21.75", "floor_us_per_experts: unknown key"},
        {"topologies/calibration/h200.json", "\"floor_us_per_expert\": 21.75",
         "\"floor_us_per_expert\": -5", "floor_us_per_expert: must be in [0, 100000], got -5"},
        {"topologies/calibration/h200.json", "\"embed\": {",
         "\"embed\": {\"floor_us_per_expert\": 3, ", "embed.floor_us_per_expert: unknown key"},
        {"topologies/calibration/h200.json", "\"gemm_eff_fp8_grad\": 0.",
         "\"gemm_eff_fp8_grad\": 2.", "gemm_eff_fp8_grad: must be in [0.001, 1]"},
        {"topologies/calibration/stacks/megatron-26.06/h100.json", "\"phases\": {}",
         "\"phases\": {\"experts_fwd\": {\"scale\": 1, \"fixed_us\": 0, \"floor_us_per_expert\": "
         "50}}",
         "a stack profile takes no phase corrections"},
    };
    for (size_t e = 0; e < sizeof phase_edits / sizeof phase_edits[0]; e++) {
        put_edited("cal-phase.json", phase_edits[e].file, phase_edits[e].was, phase_edits[e].now);
        RUN(&r, "check", at("cal-phase.json"));
        expect(&r, 3, phase_edits[e].words);
        if (!strstr(r.err, "cal-phase.json:")) fail_msg("no file:line:col in '%s'", r.err);
        if (e + 1 < sizeof phase_edits / sizeof phase_edits[0]) { /* (a stack keeps no jobs) */
            RUN(&r, "calibrate", "--refit", at("cal-phase.json"), "-o", at("cal-refit.json"));
            expect(&r, 3, phase_edits[e].words); /* refused as check refuses it, nothing written */
            assert_int_equal(access(at("cal-refit.json"), F_OK), -1);
        }
    }
    static const struct {
        const char *from, *to, *words;
    } plan_edits[] = {
        {"\"total\": 2686371456", "\"total\": 2686471456", "categories add up to"},
        {"\"step_us\": 545.000882412", "\"step_us\": 600", "the phases' exposed times add up to"},
        {"\"gbs\": 16,\n    \"seq_len\"", "\"gbs\": 32,\n    \"seq_len\"", "but the layout has"},
        {"\"pp_rank_of_virtual_stage\": [\n      0", "\"pp_rank_of_virtual_stage\": [\n      3",
         "pp_rank_of_virtual_stage"},
        {"\"compute_us\": 12.0232727273", "\"compute_us\": -12", "compute_us"},
    };
    for (size_t i = 0; i < sizeof plan_edits / sizeof plan_edits[0]; i++) {
        put_edited("plan-bad.json", "tests/data/report/plan.json", plan_edits[i].from,
                   plan_edits[i].to);
        RUN(&r, "check", at("plan-bad.json"));
        expect(&r, 3, plan_edits[i].words);
    }
    /* bounds the model file has hold for Hugging Face configs too */
    put_edited("hf-eps.json", "tests/data/hf/deepseek_v3.json", "\"rms_norm_eps\": 1e-06",
               "\"rms_norm_eps\": 0");
    RUN(&r, "model", "show", at("hf-eps.json"));
    expect(&r, 3, "rms_norm_eps = 0: must be in [1e-12, 1]");
    /* a plan reader takes only the layout keys it knows: a misspelt one is not a default */
    put_edited("plan-key.json", "tests/data/report/plan.json", "\"overlap\": true",
               "\"Overlap\": false");
    RUN(&r, "check", at("plan-key.json"));
    expect(&r, 3, "Overlap: unknown key");
    /* a profile of another GPU is refused, not applied to this one's peaks */
    RUN(&r, "predict", "--model", "mixtral-8x7b", "--cluster", "gb300-nvl72", "--calibration",
        "topologies/calibration/h200.json", "--layout", "tp=1,ep=8");
    expect(&r, 3, "a profile of the NVIDIA H200; gb300-nvl72's GPU is the GB300");
    RUN(&r, "calibrate", "--refit", "topologies/calibration/h200.json", "--cluster",
        "gb300-nvl72-x16", "-o", at("refit.json"));
    expect(&r, 3, "measured on the NVIDIA H200");
    /* without --cluster, the cluster of the GPU the profile was measured on, not the H200's
     * (whose datasheet would scale an H100's measurements); a GPU no shipped cluster has: named */
    RUN(&r, "calibrate", "--refit", "topologies/calibration/h100.json", "--cluster", "h200-vm",
        "-o", at("refit.json"));
    expect(&r, 3, "measured on the NVIDIA H100 80GB HBM3; h200-vm's GPU is the H200");
    RUN(&r, "calibrate", "--refit", "topologies/calibration/h100.json", "-o", at("refit.json"));
    expect(&r, 0, "on hgx-h100-x128's datasheet (H100: 989 bf16 TFLOPS, 3.35 TB/s HBM)");
    put_edited("a100.json", "topologies/calibration/h100.json", "\"NVIDIA H100 80GB HBM3\"",
               "\"NVIDIA A100-SXM4-80GB\"");
    RUN(&r, "calibrate", "--refit", at("a100.json"), "-o", at("refit-a100.json"));
    expect(&r, 2, "no shipped cluster has the NVIDIA A100-SXM4-80GB: --cluster names the cluster");
    put_edited("nogpu.json", "topologies/calibration/h100.json", "\"NVIDIA H100 80GB HBM3\"",
               "\"\"");
    RUN(&r, "calibrate", "--refit", at("nogpu.json"), "-o", at("refit-nogpu.json"));
    expect(&r, 2, "the profile names no GPU (\"gpu\": \"\"): --cluster names the cluster");
    /* a PCIe card is not the SXM part the H100's datasheet describes */
    put_edited("pcie.json", "topologies/calibration/h100.json", "\"NVIDIA H100 80GB HBM3\"",
               "\"NVIDIA H100 PCIe\"");
    RUN(&r, "calibrate", "--refit", at("pcie.json"), "-o", at("refit-pcie.json"));
    expect(&r, 2, "no shipped cluster has the NVIDIA H100 PCIe");
    RUN(&r, "calibrate", "--refit", at("pcie.json"), "--cluster", "hgx-h100-x128", "-o",
        at("refit-pcie.json"));
    expect(&r, 3, "measured on the NVIDIA H100 PCIe; hgx-h100-x128's GPU is the H100");
    RUN(&r, "calibrate", "--refit", "topologies/calibration/stacks/megatron-26.08/gb300.json", "-o",
        at("refit.json"));
    expect(&r, 3, "a stack profile, fitted on published runs: it keeps no measurements");
    /* MaxText: micro-batches without a pipeline are gradient accumulation; what the config
     * cannot carry is said */
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--seq-len", "128",
        "--fix", "mbs=1,moments=bf16", "--emit", "maxtext");
    expect(&r, 0, "gradient_accumulation_steps: 8");
    expect(&r, 0,
           "this config does not carry (set them by hand where MaxText has them): "
           "moments=bf16");
    /* the documented 65,536-expert limit plans in well under 2 s where it fits, skewed too */
    double t0 = moe_time_now_s();
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h100-x128", "--seq-len", "128",
        "--experts", "65536", "--routing", "zipf:1.2");
    double took = moe_time_now_s() - t0;
    expect(&r, 0, "plan:");
    printf("plan of the tiny model with 65,536 Zipf-loaded experts on 1,024 H100: %.2f s\n", took);
    const char *vg = getenv("MOEPLAN_CLI_VALGRIND");
    bool timed = !(vg && strcmp(vg, "0")); /* not under valgrind or the sanitizers */
#if defined(__SANITIZE_ADDRESS__)
    timed = false;
#endif
    if (timed) assert_true(took < 2.0);
#ifndef MOEPLAN_HAVE_EXECUTOR
    /* the GPU commands' own options: "needs a CUDA build", never "unknown option" */
    RUN(&r, "bench", "moe", "--experts", "8", "--precision", "fp8");
    expect(&r, 1, "needs a CUDA build");
    RUN(&r, "run", "plan.json", "--steps", "3", "--virtual-ranks");
    expect(&r, 1, "needs a CUDA build");
    RUN(&r, "validate", "--quick", "--steps", "4");
    expect(&r, 1, "needs a CUDA build");
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expert_counts),        cmocka_unit_test(test_fifo_inputs),
        cmocka_unit_test(test_cluster_size),         cmocka_unit_test(test_outputs),
        cmocka_unit_test(test_interrupted_write),    cmocka_unit_test(test_plan_validator),
        cmocka_unit_test(test_values_and_messages),  cmocka_unit_test(test_inputs_unchanged),
        cmocka_unit_test(test_writer_table),         cmocka_unit_test(test_layout_keys),
        cmocka_unit_test(test_published_hostile),    cmocka_unit_test(test_measured_per_gpu),
        cmocka_unit_test(test_hf_and_check_hostile),
    };
    return cmocka_run_group_tests(tests, cli_scratch_setup, cli_scratch_teardown);
}
