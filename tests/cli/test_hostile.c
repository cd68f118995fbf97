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

#include <stdarg.h>
#include <sys/stat.h>

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
    RUN(&r, "plan", TINY, "--cluster", at("fifo.json"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expert_counts),       cmocka_unit_test(test_fifo_inputs),
        cmocka_unit_test(test_cluster_size),        cmocka_unit_test(test_outputs),
        cmocka_unit_test(test_interrupted_write),   cmocka_unit_test(test_plan_validator),
        cmocka_unit_test(test_values_and_messages), cmocka_unit_test(test_inputs_unchanged),
    };
    return cmocka_run_group_tests(tests, cli_scratch_setup, cli_scratch_teardown);
}
