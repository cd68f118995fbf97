/*
 * test_cli.c: runs the real moeplan binary and checks exit codes, stdout and stderr.
 */
#include "cli_run.h"

#include "cost.h"
#include "moe_common.h"

static void test_version(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "--version");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "moeplan 0.");
    const char *deps[] = {"CUDA runtime", "cuBLAS", "NCCL", "hwloc", "GLPK", "jansson", "cmocka"};
    for (size_t i = 0; i < sizeof deps / sizeof deps[0]; i++) expect_in(r.out, deps[i]);
    expect_in(r.out, "2.9");  /* hwloc */
    expect_in(r.out, "2.14"); /* jansson */
#ifdef MOEPLAN_HAVE_EXECUTOR
    expect_in(r.out, "built with 13.");
#else
    expect_in(r.out, "not in this build");
#endif
}

static void test_help(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "--help");
    assert_int_equal(r.code, 0);
    const char *cmds[] = {"topo",      "plan",   "predict", "run",
                          "calibrate", "report", "bench",   "check"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) expect_in(r.out, cmds[i]);
    RUN(&r, "check", "--help");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "usage: moeplan check");
    assert_string_equal(r.err, "");
    RUN(&r, "plan", "--help");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "--model M");
    RUN(&r, NULL);
    assert_int_equal(r.code, 2);
    expect_in(r.err, "usage: moeplan");
}

/* The exit codes: one table (common/status.c), printed by --help and shown in the README. */
static void test_exit_code_table(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "--help");
    assert_int_equal(r.code, 0);
    static char readme[1 << 16];
    slurp("README.md", readme, sizeof readme);
    size_t n;
    const struct moe_exit_code *codes = moe_exit_codes(&n);
    assert_true(n >= 8);
    for (size_t i = 0; i < n; i++) {
        char line[512];
        snprintf(line, sizeof line, "  %-6s %s\n", codes[i].code, codes[i].meaning);
        expect_in(r.out, line);
        snprintf(line, sizeof line, "| %s | %s |", codes[i].code, codes[i].meaning);
        expect_in(readme, line);
    }
    /* and the statuses map onto them */
    assert_int_equal(moe_status_exit_code(MOE_ERR_USAGE), 2);
    assert_int_equal(moe_status_exit_code(MOE_ERR_NUMERICS), 6);
    assert_int_equal(moe_status_exit_code(MOE_ERR_GPU_NOMEM), 1);
}

static void test_usage_errors(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "check", "--bogus", "model/deepseek-v3.json");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "moeplan: check: unknown option '--bogus'");
    expect_in(r.err, "try 'moeplan check --help'");
    RUN(&r, "plan", "--model");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "option '--model' needs a value");
    expect_in(r.err, "try 'moeplan plan --help'");
    RUN(&r, "frobnicate");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "unknown command 'frobnicate'");
    RUN(&r, "--frob");
    assert_int_equal(r.code, 2);
    RUN(&r, "check");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "no file to check");
}

static void test_check(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "check", "model/deepseek-v3.json", "model/tiny-moe-gqa.json");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "model/deepseek-v3.json: ok (moeplan.model v1: deepseek-v3, 61 layers "
                     "(58 MoE), 256 experts top-8, MLA attention)");
    expect_in(r.out, "model/tiny-moe-gqa.json: ok");
    RUN(&r, "check", "--quiet", "model/mixtral-8x7b.json");
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "");
}

static void test_check_bad_input(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "check", "tests/data/bad-syntax.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "moeplan: tests/data/bad-syntax.json:5:");
    RUN(&r, "check", "tests/data/bad-experts.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "moeplan: tests/data/bad-experts.json:9:22: moe.experts: must be in");
    RUN(&r, "check", "tests/data/bad-unknown-key.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "tests/data/bad-unknown-key.json:9:65: moe.topk: unknown key");
    RUN(&r, "check", "tests/data/bad-schema.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "bad-schema.json:1:12: schema: unknown schema \"something.else\"");
    RUN(&r, "check", "tests/data/no-such-file.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "no-such-file.json: cannot open");
    /* A good file and a bad one: both reported, the exit code is the bad one's. */
    RUN(&r, "check", "model/deepseek-v3.json", "tests/data/bad-experts.json");
    assert_int_equal(r.code, 3);
    expect_in(r.out, "deepseek-v3.json: ok");
}

/* Bad inputs, a row each: the file's text (written to the scratch folder), the command that reads it (FILE is
 * replaced by the file), the exit code and a piece of the message. None may crash or hang. */
struct bad_input {
    const char *text, *args[12];
    int code;
    const char *message;
};

#define M_HEAD "{\"schema\": \"moeplan.model\", \"version\": 1, \"name\": \"m\", "
#define C_HEAD "{\"schema\": \"moeplan.cluster\", \"version\": 1, \"name\": \"c\", "
static const struct bad_input bad_inputs[] = {
    /* syntax and encoding */
    {"", {"check", "FILE"}, 3, "FILE"},
    {"{\"schema\": \"moeplan.model\", \"version\": 1", {"check", "FILE"}, 3, "FILE:1:"},
    {"{\"schema\": \"moeplan.model\", \"na\xff\xfeme\": 1}",
     {"check", "FILE"},
     3,
     "decode byte 0xff"},
    {"{\"a\": 1, \"a\": 2}", {"check", "FILE"}, 3, "FILE:1:"},
    {"[1, 2, 3]", {"check", "FILE"}, 3, "FILE"},
    {"{\"version\": 1}", {"check", "FILE"}, 3, "schema"},
    /* models: wrong types, missing keys, absurd values */
    {M_HEAD "\"layers\": \"four\"}", {"check", "FILE"}, 3, "layers"},
    {M_HEAD "\"layers\": 0, \"hidden\": 64}", {"check", "FILE"}, 3, "layers"},
    {M_HEAD "\"layers\": -3, \"hidden\": 64}", {"check", "FILE"}, 3, "layers"},
    {M_HEAD "\"layers\": 1e999, \"hidden\": 64}", {"check", "FILE"}, 3, "FILE"},
    {M_HEAD "\"layers\": 2}", {"check", "FILE"}, 3, "FILE"},
    {M_HEAD "\"layers\": 2, \"hidden\": 64, \"vocab\": 256, \"flavour\": 1}",
     {"check", "FILE"},
     3,
     "FILE"},
    /* clusters */
    {C_HEAD "\"gpu\": \"H200\", \"nodes\": 1000000000000000000}",
     {"check", "FILE"},
     3,
     "node: required key is missing"},
    {C_HEAD "\"gpu\": \"H900\", \"nodes\": 1}", {"check", "FILE"}, 3, "FILE"},
    {C_HEAD "\"gpu\": 7, \"nodes\": 1}", {"check", "FILE"}, 3, "gpu"},
    /* the planner's inputs through the planner */
    {"not json", {"plan", "--model", "FILE", "--cluster", "hgx-h200-x8"}, 3, "FILE"},
    {"not json", {"plan", "--model", "tiny-moe-gqa", "--cluster", "FILE"}, 3, "FILE"},
    {"{\"schema\": \"moeplan.calibration\", \"version\": 1, \"gpu\": \"H200\", \"gemm_eff\": 7}",
     {"predict", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--calibration", "FILE",
      "--layout", "tp=1"},
     3,
     "gemm_eff"},
    {"{\"schema\": \"moeplan.calibration\", \"version\": 1, \"gpu\": \"H200\", \"phases\": "
     "{\"attn_fwd\": {\"scale\": -1, \"fixed_us\": 0}}}",
     {"predict", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--calibration", "FILE",
      "--layout", "tp=1"},
     3,
     "scale"},
    {"{\"schema\": \"moeplan.routing\", \"version\": 1, \"experts\": 8, \"top_k\": 2, \"layers\": "
     "[{\"counts\": [1, 2, 3]}]}",
     {"plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--routing", "FILE"},
     3,
     "FILE"},
    {"{\"schema\": \"moeplan.routing\", \"version\": 1, \"experts\": 64, \"top_k\": 2, \"layers\": "
     "[]}",
     {"plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--routing", "FILE"},
     3,
     "FILE"},
    /* plans: a layout that does not multiply to the GPUs, a truncated plan, a measured file */
    {"{\"schema\": \"moeplan.plan\", \"version\": 3, \"inputs\": {\"gpus\": 8}, \"layout\": "
     "{\"tp\": 2, \"pp\": 1, \"vpp\": 1, \"dp\": 2, \"ep\": 1, \"etp\": 1}, \"model\": {}}",
     {"check", "FILE"},
     3,
     "not the 8 GPUs"},
    {"{\"schema\": \"moeplan.plan\", \"version\": 1, \"inputs\": {\"gpus\": 8}",
     {"check", "FILE"},
     3,
     "FILE:1:"},
    {"{\"schema\": \"moeplan.measured\", \"version\": 1}",
     {"report", "tests/data/report/plan.json", "FILE", "-o", "OUTDIR"},
     3,
     "model"},
    /* node XML */
    {"<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Machine\"",
     {"check", "FILE"},
     3,
     "FILE"},
    {"<topology><object type=\"Machine\" cpuset=\"0x1\"/></topology>",
     {"check", "FILE"},
     3,
     "lacks complete_cpuset"},
};

static void test_bad_input_table(void **state)
{
    (void)state;
    static struct result r;
    int n = (int)(sizeof bad_inputs / sizeof bad_inputs[0]), bad = 0;
    for (int i = 0; i < n; i++) {
        const struct bad_input *b = &bad_inputs[i];
        bool xml = b->text[0] == '<';
        char path[128];
        snprintf(path, sizeof path, "%s/bad_%d.%s", cli_scratch, i, xml ? "xml" : "json");
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(b->text, f);
        fclose(f);
        const char *args[13];
        int k = 0;
        for (; b->args[k]; k++)
            args[k] = !strcmp(b->args[k], "FILE")     ? path
                      : !strcmp(b->args[k], "OUTDIR") ? cli_tmp("bad_report")
                                                      : b->args[k];
        args[k] = NULL;
        run(&r, args);
        char want[256];
        snprintf(want, sizeof want, "%s", b->message);
        char *at = strstr(want, "FILE");
        if (at)
            snprintf(at, sizeof want - (size_t)(at - want), "%s%s", path,
                     b->message + (at - want) + 4);
        if (r.code != b->code || !strstr(r.err, want)) {
            printf("bad input %d (%s): exit %d (want %d), message \"%s\" (want \"%s\")\n", i,
                   b->args[0], r.code, b->code, r.err, want);
            bad++;
        }
        unlink(path);
    }
    if (bad) fail_msg("%d bad inputs were not refused as expected", bad);
    /* absurd option values: usage errors */
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus",
        "1000000000000000000");
    assert_int_equal(r.code, 2);
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--seq-len", "nan");
    assert_int_equal(r.code, 2);
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--headroom", "-0.5");
    assert_int_equal(r.code, 2);
    /* a file over the size limit: refused before it is read */
    FILE *f = fopen(cli_tmp("huge.json"), "wb");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)(300u << 20), SEEK_SET), 0); /* sparse: 300 MiB */
    fputc('}', f);
    fclose(f);
    RUN(&r, "check", cli_tmp("huge.json"));
    assert_int_equal(r.code, 3);
    unlink(cli_tmp("huge.json"));
    printf("%d bad inputs and a 300 MiB file: each refused with its message and exit 3\n", n);
}

static void test_not_built(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "calibrate", "--bogus"); /* options are checked in every build */
    assert_int_equal(r.code, 2);
#ifndef MOEPLAN_HAVE_EXECUTOR
    RUN(&r, "run", "plan.json");
    assert_int_equal(r.code, 1);
    expect_in(r.err, "this build has no executor");
    RUN(&r, "calibrate");
    assert_int_equal(r.code, 1);
    expect_in(r.err, "calibrate needs a CUDA build to measure a GPU; --refit PROFILE");
    RUN(&r, "validate");
    assert_int_equal(r.code, 1);
    RUN(&r, "--help");
    expect_in(r.out, "(needs a CUDA build)");
    RUN(&r, "bench", "--help");
    expect_in(r.out, "Needs a CUDA build");
#endif
}

#ifdef MOEPLAN_HAVE_EXECUTOR
/* The cluster of the GPU this machine has, for plans that `run` trains here: `topo discover`'s
 * local.json where it finds an NVIDIA GPU (an H100's plans must fit 80 GB, not an H200's 141),
 * else h200-vm (run then stops at "no CUDA GPU"). */
static const char *here_cluster(void)
{
    static char path[600];
    if (path[0]) return path;
    static struct result r;
    char dir[512];
    snprintf(dir, sizeof dir, "%s", cli_tmp("here"));
    RUN(&r, "topo", "discover", "-o", dir);
    snprintf(path, sizeof path, "%s/local.json", dir);
    if (r.code != 0 || !strstr(r.out, "cluster: ") || access(path, R_OK) != 0)
        snprintf(path, sizeof path, "h200-vm");
    printf("plans for this machine's GPU: --cluster %s\n", path);
    return path;
}

/* Every plan `plan --runnable` writes is one `run` takes: for a proxy of every shipped model
 * (2 blocks, 16 experts), either the planner says the model is not runnable, or `run` gets past
 * its gate (exec_plan_runnable) and trains a step (on a GPU) or stops at "no CUDA GPU". */
static void test_runnable_plans_run(void **state)
{
    (void)state;
    static struct result r;
    static const char *const models[] = {
        "dbrx",          "deepseek-v2-lite", "deepseek-v3",     "gpt-oss-120b",
        "gpt-oss-20b",   "kimi-k2",          "llama4-maverick", "llama4-scout",
        "mixtral-8x22b", "mixtral-8x7b",     "qwen3-235b-a22b", "qwen3-30b-a3b",
        "tiny-moe-gqa",  "tiny-moe-mla"};
    int ran = 0, refused = 0, big = 0;
    bool small_ran[4] = {false, false, false, false};
    static const char *const small[4] = {"tiny-moe-gqa", "tiny-moe-mla", "qwen3-30b-a3b",
                                         "deepseek-v2-lite"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        const char *experts = strncmp(models[i], "tiny", 4) ? "16" : "8";
        RUN(&r, "plan", "--model", models[i], "--cluster", here_cluster(), "--gpus", "1",
            "--layers", "2", "--experts", experts, "--seq-len", "256", "--gbs", "2", "--runnable",
            "-o", cli_tmp("runnable.json"));
        if (r.code == 4 && (strstr(r.err, "no layout fits") || /* not on one GPU at all */
                            strstr(r.err, "the executor needs"))) {
            big++;
            continue;
        }
        if (r.code == 4) {
            expect_in(r.err, "no layout this build runs: ");
            expect_in(r.err, "not in the executor yet");
            refused++;
            continue;
        }
        if (r.code != 0) fail_msg("plan --runnable %s: exit %d\n%s", models[i], r.code, r.err);
        RUN(&r, "run", cli_tmp("runnable.json"), "--steps", "1", "--out",
            cli_tmp("runnable-measured.json"));
        if (r.code != 0 && !strstr(r.err, "no CUDA GPU on this machine"))
            fail_msg("run refused the runnable plan of %s: exit %d\n%s", models[i], r.code, r.err);
        ran++;
        for (int k = 0; k < 4; k++) small_ran[k] |= !strcmp(models[i], small[k]);
    }
    printf("plan --runnable: %d models planned and taken by run, %d refused by name, %d fit no "
           "layout on one GPU\n",
           ran, refused, big);
    assert_int_equal(refused, 0);
    assert_int_equal(ran + big, (int)(sizeof models / sizeof models[0]));
    /* the proxies of a few billion parameters fit any GPU the executor runs on */
    for (int k = 0; k < 4; k++)
        if (!small_ran[k]) fail_msg("%s was not planned and run on one GPU", small[k]);
    /* h200-vm (141 GB): all but Mixtral-8x22B, whose 2 blocks of 16 experts fit no GPU; an 80 GB
     * GPU also leaves out the 2-block proxies of over 4 billion parameters (DBRX, Llama 4,
     * Mixtral-8x7B: weights, gradients and Adam's state are 16 bytes a parameter) */
    if (!strcmp(here_cluster(), "h200-vm")) assert_true(ran >= 13);
}

/* `run`: a missing plan, a plan this build does not run (refused, naming what), and a
 * one-GPU plan of the tiny model: trained where there is a GPU, a clear refusal where not. */
static void test_run(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "run", "/nonexistent/plan.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "/nonexistent/plan.json: cannot open: No such file or directory");
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--seq-len", "64",
        "--fix", "pp=2", "-o", cli_tmp("plan_pp2.json"));
    assert_int_equal(r.code, 0);
    RUN(&r, "run", cli_tmp("plan_pp2.json"));
    assert_int_equal(r.code, 1); /* refused by name before any GPU work */
    expect_in(r.err, "plan_pp2.json: pp=2 with ep=4: expert parallelism inside pipeline "
                     "stages is not in the GPU executor yet");
    unlink(cli_tmp("plan_pp2.json"));
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--seq-len", "64", "-o",
        cli_tmp("plan8.json"));
    assert_int_equal(r.code, 0);
    RUN(&r, "run", cli_tmp("plan8.json")); /* 8 ranks: a GPU each, or virtual ranks */
    if (r.code == 1)
        expect_in(r.err, "no CUDA GPU");
    else {
        assert_int_equal(r.code, 3);
        expect_in(r.err, "the plan has 8 ranks and this machine");
    }
    RUN(&r, "run", cli_tmp("plan8.json"), "--gpus", "2");
    assert_int_equal(r.code, 3);
    char want[600];
    snprintf(want, sizeof want, "--gpus 2, but %s is a plan for 8 GPUs", cli_tmp("plan8.json"));
    expect_in(r.err, want);
    RUN(&r, "run", cli_tmp("plan8.json"), "--resume");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "need --checkpoint-dir");
    RUN(&r, "run", cli_tmp("plan8.json"), "--inject-fault", "1");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "RANK:STEP");
    RUN(&r, "run", cli_tmp("plan8.json"), "--on-nonfinite", "ignore");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--on-nonfinite ignore: stop or skip");
    RUN(&r, "run", cli_tmp("plan8.json"), "--steps", "20", "--warmup", "21");
    assert_int_equal(r.code, 2); /* a warm-up past the run, refused (taken as given up to it) */
    expect_in(r.err, "--warmup 21: at most --steps (20)");
    RUN(&r, "run", cli_tmp("plan8.json"), "--out", cli_tmp("plan8.json"));
    assert_int_equal(r.code, 2); /* before any GPU is looked for, not after the training */
    expect_in(r.err, "is an input of this command: moeplan never overwrites its inputs");
    RUN(&r, "run", cli_tmp("plan8.json"), "--inject-nan", "0:blk0.wo");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "STEP:TENSOR[:weight]");
    RUN(&r, "bench", "moe", "--calibration", "/nonexistent-profile.json");
    assert_int_equal(r.code, 3); /* the profile is read before the GPU is looked for */
    expect_in(r.err, "/nonexistent-profile.json: cannot open");
    RUN(&r, "bench", "adamw", "--params", "0");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--params");
    RUN(&r, "bench", "adamw", "--moments", "fp16");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--moments fp16: fp32 or bf16");
    RUN(&r, "bench", "sgd");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "unknown benchmark 'sgd' (moe, adamw, attention or gemm)");
    RUN(&r, "bench", "adamw", "extra");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "unexpected operand 'extra'");
    RUN(&r, "bench", "gemm", "--json", "/tmp"); /* refused before the GPU is looked for */
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--json: the output /tmp is a folder");
    RUN(&r, "calibrate", "--quick", "-o", "/tmp"); /* refused before minutes of measuring */
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--output: the output /tmp is a folder");
    RUN(&r, "bench", "gemm", "--m", "4096");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--m, --n and --k: all three, or none");
    RUN(&r, "bench", "gemm", "--m", "5", "--n", "24", "--k", "64");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--n 24 and --k 64: multiples of 16 (fp8 GEMMs)");
    RUN(&r, "bench", "gemm", "--m", "1048576", "--n", "16", "--k", "1048576");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "at most 2^32 values each");
    RUN(&r, "bench", "moe", "--hidden", "8", "--precision", "fp8");
    assert_int_equal(r.code, 2); /* refused before the GPU is looked for */
    expect_in(r.err, "--precision fp8: --hidden 8 and --ffn 2048 must be multiples of 16");
    RUN(&r, "bench", "moe", "--ffn", "1000", "--precision", "fp8block");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--precision fp8block: --hidden 7168 and --ffn 1000 must be multiples of 16");
    RUN(&r, "bench", "attention", "--heads", "12", "--kv-heads", "5");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--heads 12 is not a multiple of --kv-heads 5");
    RUN(&r, "bench", "attention", "--seqs", "4096", "--seq", "8192");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--seqs x --seq: at most");
    RUN(&r, "run", cli_tmp("plan8.json"), "--attention", "flash");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--attention flash: auto, own or cudnn");
    RUN(&r, "run", cli_tmp("plan8.json"), "--gpu-memory-limit", "12");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--gpu-memory-limit 12: must be in");
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--seq-len", "64", "-o", cli_tmp("plan1.json"));
    assert_int_equal(r.code, 0);
    RUN(&r, "run", cli_tmp("plan1.json"), "--steps", "3", "--out", cli_tmp("measured.json"));
    if (r.code == 0) {
        expect_in(r.out, "step    3/3");
        expect_in(r.out, "measured.json written");
        /* the planner reads the measured routing back */
        RUN(&r, "predict", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
            "--seq-len", "64", "--routing", cli_tmp("measured.json"), "--layout", "mbs=1");
        assert_int_equal(r.code, 0);
        unlink(cli_tmp("measured.json"));
    } else {
        assert_int_equal(r.code, 1);
        expect_in(r.err, "no CUDA GPU");
        /* validate says so before it writes anything (its report folder not made) */
        RUN(&r, "validate", "-o", cli_tmp("validation"));
        assert_int_equal(r.code, 1);
        expect_in(r.err, "no CUDA GPU on this machine: validate trains its jobs on one");
        assert_int_equal(access(cli_tmp("validation"), F_OK), -1);
    }
    unlink(cli_tmp("plan8.json"));
    unlink(cli_tmp("plan1.json"));
}
#endif

/* The cost model's numbers do not move unless a change means them to: six layouts (every model
 * family's attention, EP with each dispatcher, PP with VPP, recompute, fp8, a calibration profile,
 * a skewed routing) predicted and compared with the golden numbers made before the house-keeping
 * of issues 20 and 21, to a relative 1e-9. */
static void test_golden_predictions(void **state)
{
    (void)state;
    static struct result r;
    struct moe_jdoc gold;
    struct moe_error err;
    if (moe_jdoc_load(&gold, "tests/data/golden/predictions.json", &err) != MOE_OK)
        fail_msg("%s", err.message);
    json_t *cases = json_object_get(gold.root, "cases");
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *args[24];
        size_t n = 0, k;
        json_t *a;
        json_array_foreach(json_object_get(c, "args"), k, a) args[n++] = json_string_value(a);
        args[n++] = "--json";
        args[n++] = cli_tmp("golden.json");
        args[n] = NULL;
        run(&r, args);
        bool fits = json_is_true(json_object_get(c, "fits"));
        assert_int_equal(r.code, fits ? 0 : 4);
        struct moe_jdoc got;
        if (moe_jdoc_load(&got, cli_tmp("golden.json"), &err) != MOE_OK)
            fail_msg("%s", err.message);
        double want[COST_NPHASES + 2], have[COST_NPHASES + 2];
        json_t *wp = json_object_get(c, "exposed_us"), *hp = json_object_get(got.root, "phases");
        for (int p = 0; p < COST_NPHASES; p++) {
            want[p] = json_number_value(json_object_get(wp, cost_phase_names[p]));
            have[p] = json_number_value(
                json_object_get(json_object_get(hp, cost_phase_names[p]), "exposed_us"));
        }
        want[COST_NPHASES] = json_number_value(json_object_get(c, "step_us"));
        have[COST_NPHASES] = json_number_value(json_object_get(got.root, "step_us"));
        want[COST_NPHASES + 1] = json_number_value(json_object_get(c, "memory_total_bytes"));
        have[COST_NPHASES + 1] =
            json_number_value(json_object_get(json_object_get(got.root, "memory_bytes"), "total"));
        char what[128];
        snprintf(what, sizeof what, "golden prediction %zu (%s)", i + 1, args[2]);
        moe_expect_near(what, have, want, COST_NPHASES + 2, 1e-9, 1e-9);
        moe_jdoc_free(&got);
    }
    moe_jdoc_free(&gold);
}

/* `calibrate --refit` in every build (the CUDA-off one too): the committed H200 profile fitted
 * again from the measurements it keeps. */
static void test_calibrate_refit(void **state)
{
    (void)state;
    static struct result r;
    /* the committed H200 profile fitted again from the measurements it keeps (no GPU needed) */
    RUN(&r, "calibrate", "--refit", "topologies/calibration/h200.json", "-o",
        cli_tmp("refit.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "60 GEMMs: gemm_eff");
    expect_in(r.out, "15 expert blocks");
    expect_in(r.out, "per-phase fit over the 6 jobs");
    RUN(&r, "check", cli_tmp("refit.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "13 phase corrections");
    unlink(cli_tmp("refit.json"));
    RUN(&r, "calibrate", "--refit", "tests/data/calibration-test.json", "-o",
        cli_tmp("refit.json"));
    assert_int_equal(r.code, 3); /* no measurements in it: refused by name, nothing written */
    expect_in(r.err, "measured");
    assert_int_equal(access(cli_tmp("refit.json"), F_OK), -1);
}

/* `plan --explain --compare LAYOUT`: a given layout set beside the plan, ranked among the layouts
 * costed, with the phase that separates them; refused without --explain or when invalid. */
static void test_plan_compare(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--explain", "--compare", "tp=1,pp=1,ep=8,mbs=1,recompute=full");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "the layout compared: tp=1 pp=1 vpp=1 ep=8 etp=1 dp=64");
    expect_in(r.out, "layouts costed score better");
    expect_in(r.out, "slower than the plan: its");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--compare", "tp=1,pp=1,ep=8");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--compare goes with --explain");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--explain", "--compare", "tp=3");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "--compare: ");
}

/* `plan --published F --run ID`: the run's inputs, its recipe settings fixed, its container's
 * stack profile, and its layout compared; MB-8 (Qwen3-30B-A3B on 8 GB200) is the plan's own pick,
 * MB-33 (DeepSeek-V3, 256 GB300, PP 2 x VPP 8) is not. Refused with inputs of its own or an
 * unknown run. */
static void test_plan_published_run(void **state)
{
    (void)state;
    static struct result r;
    const char *f = "tests/data/published/mb-runs.tsv";
    RUN(&r, "plan", "--published", f, "--run", "MB-8");
    assert_int_equal(r.code, 0);
    expect_in(r.out,
              "plan: qwen3-30b-a3b on 8 x GB200 (gb200-nvl72-x16), gbs 512 x seq 4096, mxfp8");
    expect_in(r.out, "stack profile megatron-26.08 for GB200");
    expect_in(r.out, "the layout compared: tp=1 pp=1 vpp=1 ep=8 etp=1 dp=8 zero=1 mbs=4");
    expect_in(r.out, "0 of the");
    expect_in(r.out, "the plan's step: the planner picks this layout");
    RUN(&r, "plan", "--published", f, "--run", "MB-33");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "stack profile megatron-26.04 for GB300");
    expect_in(r.out, "the layout compared: tp=1 pp=2 vpp=8 ep=32");
    expect_in(r.out, "dispatcher=hybridep");
    expect_in(r.out, "slower than the plan: its");
    /* GPT-OSS-120B on 64 B300: the stage split's integer program lightens the busiest rank but
     * the schedule runs the even split faster; the plan keeps the faster one */
    RUN(&r, "plan", "--published", f, "--run", "MB-25");
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.out, "slower than the even split"));
    RUN(&r, "plan", "--published", f, "--run", "MB-33", "--model", "deepseek-v3");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--run sets the model");
    RUN(&r, "plan", "--published", f, "--run", "MB-9999");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--run MB-9999: no run of that id in");
    RUN(&r, "plan", "--run", "MB-8", "--model", "deepseek-v3", "--cluster", "gb300-nvl72-x16");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--published and --run go together");
}

/* `calibrate --published`: a stack profile fitted on published runs, written, read back by
 * check and used by predict, which names it; its rows are the cluster's of that stack. */
static void test_calibrate_published(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "calibrate", "--published", "tests/data/published/mb-runs.tsv", "--stack",
        "megatron-26.08", "--cluster", "gb300-nvl72-x16", "-o", cli_tmp("stack.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "stack megatron-26.08: 8 trusted rows on 2 systems fitted together");
    expect_in(r.out, "MB-1 ");
    RUN(&r, "check", cli_tmp("stack.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "stack profile megatron-26.08 for GB300");
    RUN(&r, "predict", "--model", "qwen3-30b-a3b", "--cluster", "gb300-nvl72-x16", "--gpus", "8",
        "--calibration", cli_tmp("stack.json"), "--layout", "ep=8,mbs=8,gbs=512,precision=mxfp8");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "calibration: stack profile megatron-26.08 for GB300");
    json_t *j = json_load_file(cli_tmp("stack.json"), 0, NULL);
    assert_non_null(j);
    json_t *rows = json_object_get(json_object_get(j, "fit"), "rows");
    assert_int_equal(json_array_size(rows), 4); /* MB-1, 5, 7, 9: GB300's 26.08 rows */
    /* the shipped profile is this fit: a cost-model change that moves it must remake them all */
    json_t *shipped =
        json_load_file("topologies/calibration/stacks/megatron-26.08/gb300.json", 0, NULL);
    assert_non_null(shipped);
    if (!json_equal(j, shipped))
        fail_msg("topologies/calibration/stacks/megatron-26.08/gb300.json is not what calibrate "
                 "--published fits now: run scripts/published-profiles");
    json_decref(shipped);
    json_decref(j);
    RUN(&r, "calibrate", "--published", "tests/data/published/mb-runs.tsv", "--stack",
        "megatron-26.08", "--cross-validate");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "leave one model out:");
    expect_in(r.out, "leave one system out:");
}

/* `report`: a plan and a run's measured.json into a folder of Markdown and SVG; bad input named. */
static void test_report(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "report", "tests/data/report/plan.json", "tests/data/report/measured.json", "-o",
        cli_tmp("report"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "predicted against measured");
    expect_in(r.out, "dispatch");
    static const char *const files[] = {"README.md", "phases.svg", "errors.svg", "loss.svg",
                                        "experts.svg"};
    /* the README and a chart byte for byte as the golden ones (looked at when they were made) */
    static const char *const golden[][2] = {{"README.md", "tests/data/golden/report-README.md"},
                                            {"phases.svg", "tests/data/golden/report-phases.svg"}};
    for (size_t i = 0; i < 2; i++) {
        char made[256], cmd[600];
        snprintf(made, sizeof made, "%s/%s", cli_tmp("report"), golden[i][0]);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s/%s", made, MOEPLAN_SOURCE_DIR, golden[i][1]);
        if (system(cmd) != 0) fail_msg("%s differs from %s", made, golden[i][1]);
    }
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", cli_tmp("report"), files[i]);
        assert_int_equal(access(path, F_OK), 0);
        unlink(path);
    }
    rmdir(cli_tmp("report"));
    RUN(&r, "report", "tests/data/report/plan.json", "tests/data/report/plan.json", "-o",
        cli_tmp("report"));
    assert_int_equal(r.code, 3);
    expect_in(r.err, "expected \"moeplan.measured\"");
    assert_int_equal(access(cli_tmp("report/README.md"), F_OK), -1);
    RUN(&r, "report", "tests/data/report/plan.json");
    assert_int_equal(r.code, 2);
    /* --compare: another run's loss beside this one's (its losses 1% higher), and a run of other
     * steps refused by name, nothing written */
    RUN(&r, "report", "tests/data/report/plan.json", "tests/data/report/measured.json", "--compare",
        "tests/data/report/measured-other.json", "-o", cli_tmp("report-cmp"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "tests/data/report/measured-other.json    5.6138  +1.00%");
    size_t len;
    char *readme = slurp_all(cli_tmp("report-cmp/README.md"), &len);
    expect_in(readme, "| `tests/data/report/measured-other.json` | 5.6138 | +1.00% |");
    free(readme);
    char *svg = slurp_all(cli_tmp("report-cmp/loss.svg"), &len);
    expect_in(svg, "measured-other.json");
    free(svg);
    RUN(&r, "report", "tests/data/report/plan.json", "tests/data/report/measured.json", "--compare",
        "tests/data/report/measured-short.json", "-o", cli_tmp("report-short"));
    assert_int_equal(r.code, 3);
    expect_in(r.err, "steps 1-10; tests/data/report/measured.json is tiny-moe-gqa, steps 1-20");
    assert_int_equal(access(cli_tmp("report-short/README.md"), F_OK), -1);
}

static void test_model_commands(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "model", "list");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "deepseek-v3");
    expect_in(r.out, "671.03 B");
    expect_in(r.out, "llama4-scout");
    RUN(&r, "model", "show", "deepseek-v3");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "parameters: 671.03 B total, 37.55 B active per token");
    expect_in(r.out, "250.45 GFLOP forward + backward");
    expect_in(r.out, "routed_experts");
    RUN(&r, "model", "show", "tests/data/hf/gpt_oss.json"); /* gpt-oss's RoPE and experts */
    assert_int_equal(r.code, 0);
    expect_in(r.out, "RoPE: theta 150000, YaRN x32 over 4096 positions (beta 1..32, attention "
                     "factor 1.347)");
    expect_in(r.out, "router and expert biases, clamped SwiGLU (alpha 1.702, limit 7)");
    RUN(&r, "model", "show", "tests/data/hf/mixtral.json");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "46.70 B total");
    RUN(&r, "model", "show", "deepseek-v2-lite", "--layers", "4", "--experts", "16");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "deepseek-v2-lite-L4-E16: 4 blocks (1 dense, 3 MoE)");
    RUN(&r, "model", "show", "deepseek-v3", "--experts", "12");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "not divisible by n_group (8)");
    RUN(&r, "model", "show", "deepseek-v3", "--layers", "abc");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--layers");
    RUN(&r, "model", "show", "no-such-model");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "no model named 'no-such-model'");
    RUN(&r, "model", "show", "tests/data/hf/unsupported.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "unsupported.json:2:17: model_type: model type 'mamba' is not supported");
    RUN(&r, "model", "frob");
    assert_int_equal(r.code, 2);
}

static void test_topo_commands(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "topo", "list");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "gb300-nvl72-x16");
    expect_in(r.out, "hgx-h100-x128");
    RUN(&r, "topo", "show", "gb300-nvl72-x16");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "GPUs: 1024 usable of 1152 (288 nodes x 4 GB300); 16 NVLink domains");
    expect_in(r.out, "NVLink     64 GPUs per domain");
    expect_in(r.out, "900 GB/s to each");
    static const char *const shipped[] = {"gb200-nvl72",     "gb300-nvl72",   "gb200-nvl72-x16",
                                          "gb300-nvl72-x16", "hgx-h100-x128", "hgx-h200-x8",
                                          "dgx-b200-x32",    "dgx-b300-x32"};
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        RUN(&r, "topo", "show", shipped[i]);
        assert_int_equal(r.code, 0);
        expect_in(r.out, "GB/s to each"); /* the NVLink matrix read back */
    }
    RUN(&r, "topo", "show", "no-such-cluster");
    assert_int_equal(r.code, 3);
    RUN(&r, "topo", "show", "tests/data/topo/bad-gpu.json");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "bad-gpu.json:5:10: gpu: unknown GPU model 'A100'");
    RUN(&r, "check", "tests/data/topo/bad-nesting.xml");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "bad-nesting.xml:4:3: </objekt> does not close <object>");
    /* well formed, but declared in an encoding other than UTF-8: refused by our reader at the
     * name, the same with hwloc's libxml2 backend (which refuses names it does not know) and its
     * own parser (which reads any as UTF-8: the GPU machine, without the libxml2 plugin) */
    RUN(&r, "check", "tests/data/topo/unknown-encoding.xml");
    assert_int_equal(r.code, 3);
    expect_in(r.err, "unknown-encoding.xml:1:31: encoding 'UTG-8': a topology XML is UTF-8");
    RUN(&r, "check", "topologies/hgx-h200-x8.json", "topologies/xml/gb200-tray.xml",
        "topologies/gpus.json");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "8 x H200 usable in 1 NVLink domain");
    expect_in(r.out, "4 GPUs, 4 NICs, NVLinkBandwidth matrix");
    RUN(&r, "topo", "discover", "-o", cli_scratch);
    assert_int_equal(r.code, 0);
    char want[300];
    snprintf(want, sizeof want, "hwloc: %s written", cli_tmp("local-node.xml"));
    expect_in(r.out, want);
    snprintf(want, sizeof want, "cluster: %s written", cli_tmp("local.json"));
    if (!strstr(r.out, "no NVIDIA GPU found")) expect_in(r.out, want);
    RUN(&r, "topo", "discover", "-o");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "option '-o' needs a value");
    /* a folder whose parent is missing (not /nonexistent: an image may have it, and root may
     * make it) */
    RUN(&r, "topo", "discover", "-o", cli_tmp("no/such"));
    assert_int_equal(r.code, 2);
    expect_in(r.err, "does not exist");
}

static void test_predict(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "predict", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--layout",
        "tp=2,pp=4,ep=8,dp=128,zero=1,mbs=1,gbs=1024,dispatcher=dedup-gpu,overlap=on", "--json",
        cli_tmp("pred.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "mixtral-8x7b on 1024 x H100 of hgx-h100-x128");
    /* no --calibration: the newest stack profile shipped for the H100 (fitted on published runs) */
    expect_in(r.out, "calibration: stack profile megatron-");
    expect_in(r.out, "for H100:");
    expect_in(r.out, "experts_bwd");
    expect_in(r.out, "tokens/s/GPU");
    expect_in(r.out, "headroom left");
    FILE *f = fopen(cli_tmp("pred.json"), "r");
    char head[64] = {0};
    assert_non_null(f);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    expect_in(head, "\"schema\": \"moeplan.prediction\"");
    unlink(cli_tmp("pred.json"));
    RUN(&r, "predict", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--calibration",
        "datasheet", "--layout", "tp=2,pp=4,ep=8,dp=128,gbs=1024");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "calibration: datasheet defaults (uncalibrated)");
    RUN(&r, "predict", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--layout",
        "ep=8,dp=8,gbs=64,recompute=full");
    assert_int_equal(r.code, 0); /* no stack profile for the H200: the datasheet */
    expect_in(r.out, "calibration: datasheet defaults (uncalibrated)");
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72-x16", "--layout",
        "tp=1,pp=1,ep=8,dp=1024,gbs=1024");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "the layout does not fit: needs");
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72-x16", "--layout",
        "tp=1,pp=8,ep=48,gbs=1024");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "ep x etp = 48 x 1 must divide tp x dp = 128");
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72-x16", "--layout",
        "tp=1,foo=2");
    assert_int_equal(r.code, 2);
    RUN(&r, "predict", "--model", "deepseek-v3", "--cluster", "gb200-nvl72-x16", "--gpus", "2048",
        "--layout", "tp=1");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "has 1024 usable GPUs");
    RUN(&r, "predict", "--cluster", "gb200-nvl72-x16", "--layout", "tp=1");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--model is required");
}

static void test_plan(void **state)
{
    (void)state;
    static struct result r;
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "256", "--explain", "--emit", "megatron", "-o", cli_tmp("plan.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "plan: mixtral-8x7b on 64 x H100 (hgx-h100-x128), gbs 256 x seq 4096");
    expect_in(r.out, "why this layout:");
    expect_in(r.out, "binding constraint:");
    expect_in(r.out, "--tensor-model-parallel-size");
    expect_in(r.out, "--expert-model-parallel-size");
    expect_in(r.out, "plan written to ");
    expect_in(r.out, cli_tmp("plan.json"));
    RUN(&r, "check", cli_tmp("plan.json"));
    assert_int_equal(r.code, 0);
    expect_in(r.out, "ok (moeplan.plan: mixtral-8x7b on 64 GPUs");
    unlink(cli_tmp("plan.json"));
    /* a published recipe's layout, as Megatron's flags: the layout string sets the virtual
     * stages (no VPP flag beside it), the MTP layer, the recompute modules, HybridEP */
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "gb200-nvl72-x16", "--gpus", "256",
        "--gbs", "4096", "--precision", "mxfp8", "--routing", "balanced", "--fix",
        "tp=1,pp=4,vpp=4,ep=64,mbs=1,recompute=mla_up_proj,grad_reduce=bf16,dispatcher=hybridep,"
        "pp_layout=Et*4|(t*4|)*14tmL",
        "--emit", "megatron");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "--pipeline-model-parallel-layout \"Et*4|(t*4|)*14tmL\"");
    expect_in(r.out, "--mtp-num-layers 1");
    expect_in(r.out, "--recompute-modules mla_up_proj \\");
    expect_in(r.out, "--moe-flex-dispatcher-backend hybridep");
    expect_in(r.out, "--moe-router-force-load-balancing");
    expect_in(r.out, "--grad-reduce-in-bf16");
    expect_in(r.out, "--fp8-recipe mxfp8");
    assert_null(strstr(r.out, "--virtual-pipeline"));
    assert_null(strstr(r.out, "--num-virtual-stages"));
    /* Llama 4: what Megatron-LM's flags have, and above them what they lack, at 16384 tokens
     * (beyond the 8192-token chunk and the temperature's floor) and at 4096 (neither) */
    RUN(&r, "plan", "--model", "llama4-scout", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "512", "--seq-len", "16384", "--fix", "ep=16", "--emit", "megatron");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "# not expressible in Megatron-LM's flags, so they train a different "
                     "llama4-scout:\n#   - chunked attention (8192-token chunks on the RoPE "
                     "blocks): Megatron-LM attends over the whole 16384 tokens\n");
    expect_in(r.out, "query temperature (from position 8191 on)");
    expect_in(r.out, "q and k normalized on the RoPE blocks only");
    expect_in(r.out, "--no-rope-freq 4 \\\n--qk-l2-norm \\\n");
    expect_in(r.out, "--moe-apply-probs-on-input \\\n");
    RUN(&r, "plan", "--model", "llama4-scout", "--cluster", "hgx-h100-x128", "--gpus", "8", "--gbs",
        "64", "--layers", "6", "--fix", "ep=8", "--emit", "megatron");
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.out, "chunked attention"));
    assert_null(strstr(r.out, "temperature"));
    expect_in(r.out, "q and k normalized on the RoPE blocks only");
    expect_in(r.out, "--no-rope-freq \"([0]*3+[1])*1+[0]*2\""); /* 6 blocks: the 4th has none */
    /* a model with no RoPE block at all: every block NoPE, no chunk to speak of */
    RUN(&r, "plan", "--model", "tests/data/llama4-nope.json", "--cluster", "hgx-h100-x128",
        "--gpus", "8", "--gbs", "64", "--seq-len", "16384", "--fix", "ep=8", "--emit", "megatron");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "--no-rope-freq 1 \\\n");
    assert_null(strstr(r.out, "chunked attention"));
    /* gpt-oss: YaRN, the clamped activation (quick GeGLU, offset 1, clamp 7) and the biases */
    RUN(&r, "plan", "--model", "gpt-oss-20b", "--cluster", "hgx-h100-x128", "--gpus", "8", "--gbs",
        "64", "--fix", "ep=8", "--emit", "megatron");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "--position-embedding-type yarn \\\n--rotary-base 150000 \\\n"
                     "--rotary-scaling-factor 32 \\\n--yarn-original-max-position-embeddings 4096 "
                     "\\\n--yarn-beta-fast 32 \\\n--yarn-beta-slow 1 \\\n"
                     "--no-yarn-correction-range-round-to-int \\\n");
    expect_in(r.out, "--quick-geglu \\\n--glu-linear-offset 1.0 \\\n"
                     "--activation-func-clamp-value 7 \\\n");
    /* its biases are Megatron-LM's default: no flag (there is no --add-bias-linear) */
    assert_null(strstr(r.out, "bias-linear"));
    assert_null(strstr(r.out, "--swiglu"));
    assert_null(strstr(r.out, "--mscale"));
    assert_null(strstr(r.out, "not expressible"));
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "256", "--emit", "maxtext", "--fix", "ep=8,tp=1");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "ici_expert_parallelism: 8");
    expect_in(r.out, "sparse_matmul: True");
    expect_in(r.out, "tp=1 ");
    expect_in(r.out, "# MaxText config for the plan (moeplan mixtral-8x7b on 64 GPUs)\n"
                     "model_name: mixtral-8x7b\nici_tensor_parallelism: 1\n");
    expect_in(r.out, "dispatcher=alltoall"); /* MaxText's own dispatch: costed as it runs */
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "256", "--emit", "maxtext", "--fix", "dispatcher=dedup-gpu");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--emit maxtext: MaxText dispatches with a plain all-to-all, not dedup-gpu");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h100-x128", "--gpus", "8", "--gbs",
        "64", "--layers", "2", "--emit", "maxtext");
    assert_int_equal(r.code, 0); /* a proxy: the model's config, its block count overridden */
    expect_in(r.out, "model_name: mixtral-8x7b\noverride_model_config: True\n"
                     "base_num_decoder_layers: 2\n");
    RUN(&r, "plan", "--model", "dbrx", "--cluster", "hgx-h100-x128", "--gpus", "64", "--gbs", "512",
        "--fix", "tp=1", "--emit", "maxtext");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "# model_name: MaxText ships no config of dbrx;");
    /* experts over tensor-parallel ranks too (ep 8 > dp 4): no MaxText mesh says it, so --emit
     * maxtext plans without such layouts (the default plan here has one), and refuses them fixed */
    RUN(&r, "plan", "--model", "mixtral-8x22b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "1024", "--emit", "maxtext");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "ici_expert_parallelism: ");
    RUN(&r, "plan", "--model", "mixtral-8x22b", "--cluster", "hgx-h100-x128", "--gpus", "64",
        "--gbs", "1024", "--fix", "tp=2,pp=8,ep=8,etp=1", "--emit", "maxtext");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "MaxText's expert axis is a part of data parallelism (--emit maxtext): ep "
                     "must divide dp");
    RUN(&r, "plan", "--model", "deepseek-v3", "--cluster", "hgx-h200-x8");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "no layout fits");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--fix", "ep=3");
    assert_int_equal(r.code, 4);
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--emit", "deepspeed");
    assert_int_equal(r.code, 2);
    expect_in(r.err, "--emit deepspeed: megatron or maxtext");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--fix", "bogus=1");
    assert_int_equal(r.code, 2);
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--headroom", "");
    assert_int_equal(r.code, 2); /* an empty number once read as 0 */
    expect_in(r.err, "option '--headroom' has an empty value");
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--cluster", "hgx-h200-x8", "--objective", "cost");
    assert_int_equal(r.code, 0);
    /* --runnable: only what this build's executor runs, or a refusal, no file */
    unlink(cli_tmp("runnable.json"));
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--runnable",
        "--seq-len", "64", "--fix", "tp=2", "-o", cli_tmp("runnable.json"));
    assert_int_equal(r.code, 4);
    expect_in(r.err, "no layout this build runs");
    expect_in(r.err, "tensor parallelism is not in the executor yet");
    assert_int_equal(access(cli_tmp("runnable.json"), F_OK), -1);
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--runnable",
        "--seq-len", "64"); /* 8 GPUs: data and expert parallel, the optimizer state whole */
    assert_int_equal(r.code, 0);
    expect_in(r.out, "tp=1 pp=1 vpp=1");
    expect_in(r.out, "dp=8 zero=1");
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--runnable", "--seq-len", "64", "--fix", "recompute=selective"); /* Megatron's default */
    assert_int_equal(r.code, 0);
    expect_in(r.out, "recompute=selective");
    RUN(&r, "plan", "--model", "tiny-moe-mla", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--runnable", "--seq-len", "64", "--fix", "recompute=mla_up_proj+moe_act", "-o",
        cli_tmp("mla-rc.json"));
    assert_int_equal(r.code, 0);
    size_t len;
    char *plan = slurp_all(cli_tmp("mla-rc.json"), &len);
    expect_in(plan, "\"recompute_modules\": \"mla_up_proj+moe_act\"");
    free(plan);
#ifdef MOEPLAN_HAVE_EXECUTOR
    RUN(&r, "run", cli_tmp("mla-rc.json"), "--steps", "1", "--out", cli_tmp("mla-rc-run.json"));
    if (r.code != 0 && !strstr(r.err, "no CUDA GPU on this machine"))
        fail_msg("run refused the mla_up_proj plan: exit %d\n%s", r.code, r.err);
#endif
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--runnable", "--seq-len", "64", "--precision", "mxfp8");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "MX block-scaled FP8 needs Blackwell GPUs (B200, B300, GB200, GB300)");
    /* Hopper's fp8 recipes are the executor's: a plan of each that run takes (no GPU here: it
     * says so), and fp8 with EP refused (the exchange sends bf16 rows) */
    for (int b = 0; b < 2; b++) {
        const char *prec = b ? "fp8block" : "fp8";
        RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
            "--runnable", "--seq-len", "64", "--precision", prec, "-o", cli_tmp("fp8.json"));
        if (r.code != 0)
            fail_msg("plan --runnable --precision %s: exit %d\n%s", prec, r.code, r.err);
        char *fp8plan = slurp_all(cli_tmp("fp8.json"), &len);
        char want[64];
        snprintf(want, sizeof want, "\"precision\": \"%s\"", prec);
        expect_in(fp8plan, want);
        free(fp8plan);
#ifdef MOEPLAN_HAVE_EXECUTOR
        RUN(&r, "run", cli_tmp("fp8.json"), "--steps", "1", "--out", cli_tmp("fp8-run.json"));
        if (r.code != 0 && !strstr(r.err, "no CUDA GPU on this machine"))
            fail_msg("run refused the %s plan: exit %d\n%s", prec, r.code, r.err);
#endif
    }
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "2",
        "--runnable", "--seq-len", "64", "--precision", "fp8", "--fix", "ep=2");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "the executor's exchange sends bf16 rows");
    RUN(&r, "plan", "--model", "tiny-moe-mla", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--runnable", "--seq-len", "64", "--fix", "recompute=moe");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "selective recompute of moe: not in the executor yet (core_attn, "
                     "mla_up_proj, layernorm, moe_act, mlp, shared_experts are)");
    /* the executor's own buffers: Mixtral's proxy at 2 x 16384 tokens with selective recompute
     * fits Megatron's memory model (138 GB) but not the executor (which ran out at 148 GB) */
    RUN(&r, "plan", "--model", "mixtral-8x7b", "--layers", "4", "--gbs", "2", "--cluster",
        "h200-vm", "--gpus", "1", "--runnable", "--seq-len", "16384", "--fix",
        "mbs=2,recompute=selective");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "the executor needs 156.8 GB a GPU for this layout");
    RUN(&r, "plan", "--model", "tiny-moe-gqa", "--cluster", "hgx-h200-x8", "--gpus", "1",
        "--runnable", "--seq-len", "64");
    assert_int_equal(r.code, 0);
    expect_in(r.out, "tp=1 pp=1 vpp=1 ep=1 etp=1 dp=1");
    /* the micro-batch too: 4 x 4096 tokens of Qwen3's 151936-token vocabulary is 2.5e9 logits,
     * past the executor's 32-bit GEMM offsets; --runnable picks a smaller mbs that run takes */
    RUN(&r, "plan", "--model", "qwen3-30b-a3b", "--layers", "2", "--experts", "16", "--cluster",
        "h200-vm", "--gpus", "1", "--runnable", "--seq-len", "4096", "--gbs", "4", "--fix",
        "mbs=4");
    assert_int_equal(r.code, 4);
    expect_in(r.err, "too large for the executor's 32-bit GEMM offsets");
    RUN(&r, "plan", "--model", "qwen3-30b-a3b", "--layers", "2", "--experts", "16", "--cluster",
        "h200-vm", "--gpus", "1", "--runnable", "--seq-len", "4096", "--gbs", "4", "-o",
        cli_tmp("runnable.json"));
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.out, "mbs=4 "));
#ifdef MOEPLAN_HAVE_EXECUTOR /* and run takes it (a build without one refuses every plan) */
    RUN(&r, "plan", "--model", "qwen3-30b-a3b", "--layers", "2", "--experts", "16", "--cluster",
        here_cluster(), "--gpus", "1", "--runnable", "--seq-len", "4096", "--gbs", "4", "-o",
        cli_tmp("runnable.json"));
    assert_int_equal(r.code, 0);
    RUN(&r, "run", cli_tmp("runnable.json"), "--steps", "1", "--out",
        cli_tmp("runnable-measured.json"));
    if (r.code != 0 && !strstr(r.err, "no CUDA GPU on this machine"))
        fail_msg("run refused the runnable Qwen3 plan: exit %d\n%s", r.code, r.err);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_exit_code_table),
        cmocka_unit_test(test_calibrate_refit),
        cmocka_unit_test(test_golden_predictions),
        cmocka_unit_test(test_calibrate_published),
        cmocka_unit_test(test_plan_compare),
        cmocka_unit_test(test_plan_published_run),
#ifdef MOEPLAN_HAVE_EXECUTOR
        cmocka_unit_test(test_runnable_plans_run),
#endif
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_check_bad_input),
        cmocka_unit_test(test_not_built),
        cmocka_unit_test(test_model_commands),
        cmocka_unit_test(test_topo_commands),
        cmocka_unit_test(test_predict),
        cmocka_unit_test(test_plan),
#ifdef MOEPLAN_HAVE_EXECUTOR
        cmocka_unit_test(test_run),
#endif
        cmocka_unit_test(test_report),
        cmocka_unit_test(test_bad_input_table),
    };
    return cmocka_run_group_tests(tests, cli_scratch_setup, cli_scratch_teardown);
}
