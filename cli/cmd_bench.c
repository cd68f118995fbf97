/*
 * cmd_bench.c: `moeplan bench moe`: the executor's MoE layer on this GPU, forward + backward,
 * next to the dense GEMM chain of the same FLOPs; bench/peers/ times PyTorch on the same shapes
 * and the same routing (--routing-out), and bench/run-moe prints them side by side. `moeplan
 * bench adamw`: the optimizer's update over --params parameters against the GPU's copy
 * bandwidth (bench/run-adamw: next to PyTorch's fused AdamW). `moeplan bench attention`: the
 * attention core (causal, optionally a sliding window) by our kernels and by cuDNN's, forward and
 * backward, as the executor and `calibrate` call them. `moeplan bench gemm`: one linear layer's
 * GEMM in bf16 and in each fp8 recipe as the executor runs them, operands quantized beforehand,
 * and each recipe's quantization of the activation apart (bench/run-gemm: next to PyTorch's).
 * Built only with the executor.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "exec.h"
#include "rpt.h"

enum {
    OPT_E = 1,
    OPT_T,
    OPT_K,
    OPT_H,
    OPT_F,
    OPT_SKEW,
    OPT_SEED,
    OPT_ITERS,
    OPT_WARM,
    OPT_STREAMS,
    OPT_JSON,
    OPT_ROUT,
    OPT_CAL,
    OPT_CLUSTER,
    OPT_PARAMS,
    OPT_MOMENTS,
    OPT_SEQS,
    OPT_SEQ,
    OPT_HEADS,
    OPT_KV,
    OPT_HD,
    OPT_WINDOW,
    OPT_PREC,
    OPT_GM,
    OPT_GN,
    OPT_GK
};

const struct cli_opt cmd_bench_opts[] = {
    {"experts", required_argument, OPT_E, "E", "routed experts (8)", CLI_PLAIN},
    {"tokens", required_argument, OPT_T, "T", "tokens; routed rows = T x topk (8192)", CLI_PLAIN},
    {"topk", required_argument, OPT_K, "K", "experts per token (8)", CLI_PLAIN},
    {"hidden", required_argument, OPT_H, "H", "hidden size (7168)", CLI_PLAIN},
    {"ffn", required_argument, OPT_F, "F", "expert FFN width (2048)", CLI_PLAIN},
    {"skew", required_argument, OPT_SKEW, "ALPHA",
     "Dirichlet alpha of the expert load (2; 0: uniform)", CLI_PLAIN},
    {"seed", required_argument, OPT_SEED, "N", "routing and data seed (1)", CLI_PLAIN},
    {"iters", required_argument, OPT_ITERS, "N", "timed runs, the median is reported (20)",
     CLI_PLAIN},
    {"warmup", required_argument, OPT_WARM, "N", "untimed runs first (3)", CLI_PLAIN},
    {"streams", required_argument, OPT_STREAMS, "N",
     "CUDA streams for the expert GEMMs (" EXEC_STR(EXEC_DEFAULT_STREAMS) ")", CLI_PLAIN},
    {"precision", required_argument, OPT_PREC, "bf16|fp8|fp8block",
     "moe: the GEMMs' precision; fp8 and fp8block run bf16 too, side by side (bf16)", CLI_PLAIN},
    {"json", required_argument, OPT_JSON, "FILE", "also write the results as JSON", CLI_OUT_FILE},
    {"params", required_argument, OPT_PARAMS, "N", "adamw: parameters updated (1000000000)",
     CLI_PLAIN},
    {"moments", required_argument, OPT_MOMENTS, "fp32|bf16", "adamw: the moments' precision (fp32)",
     CLI_PLAIN},
    {"calibration", required_argument, OPT_CAL, "FILE",
     "the cost model's expert block for this routing next to the measured (a profile)", CLI_PLAIN},
    {"cluster", required_argument, OPT_CLUSTER, "C",
     "with --calibration: the GPU's cluster (the profile's GPU's own: H200 h200-vm, H100 "
     "hgx-h100-x128)",
     CLI_PLAIN},
    {"routing-out", required_argument, OPT_ROUT, "FILE",
     "write the routing used (tokens x topk int32 expert ids) for the peers", CLI_OUT_FILE},
    {"seqs", required_argument, OPT_SEQS, "N", "attention: sequences (2)", CLI_PLAIN},
    {"seq", required_argument, OPT_SEQ, "S", "attention: tokens a sequence (4096)", CLI_PLAIN},
    {"heads", required_argument, OPT_HEADS, "H", "attention: query heads (64)", CLI_PLAIN},
    {"kv-heads", required_argument, OPT_KV, "KV", "attention: key/value heads (8)", CLI_PLAIN},
    {"head-dim", required_argument, OPT_HD, "D", "attention: head dim (128)", CLI_PLAIN},
    {"window", required_argument, OPT_WINDOW, "W", "attention: sliding window (0: none)",
     CLI_PLAIN},
    {"m", required_argument, OPT_GM, "M",
     "gemm: rows of x (the tokens); with --n and --k one shape, else the expert GEMMs of "
     "bench/run-fp8's shapes",
     CLI_PLAIN},
    {"n", required_argument, OPT_GN, "N", "gemm: rows of w (the layer's outputs)", CLI_PLAIN},
    {"k", required_argument, OPT_GK, "K", "gemm: the reduction (the layer's inputs)", CLI_PLAIN},
    {NULL, 0, 0, NULL, NULL, 0},
};

#ifdef MOEPLAN_HAVE_EXECUTOR /* the command itself: a build without CUDA has its options only */

/* The GPU a benchmark runs on (device 0): -1 when there is one, else the exit code. */
static int bench_gpu(struct cli *cli, struct exec_device_info *dev)
{
    struct moe_error err;
    int ndev = 0;
    if (exec_device_count(&ndev, &err) != MOE_OK) return cli_fail(cli, &err);
    if (ndev < 1) {
        moe_error_set(&err, MOE_ERR_RUNTIME,
                      "no CUDA GPU on this machine: the benchmark runs on a GPU");
        return cli_fail(cli, &err);
    }
    if (exec_device_query(0, dev, &err) != MOE_OK) return cli_fail(cli, &err);
    return -1;
}

/* The AdamW update against the copy bandwidth: bytes moved over time, and what a device-to-device
 * copy reaches (its read and its write) on a 4 GiB buffer. */
static int bench_adamw(struct cli *cli, size_t n, bool m16, int iters, const char *json)
{
    struct moe_error err;
    struct exec_device_info dev;
    int rc = bench_gpu(cli, &dev);
    if (rc >= 0) return rc;
    double us, copy_us;
    const size_t copy = (size_t)4 << 30;
    /* read master, gradient, moments; write master, moments and the bf16 copy */
    const double per = m16 ? 22.0 : 30.0, bytes = per * (double)n;
    if (exec_time_copy(copy, iters, &copy_us, &err) != MOE_OK ||
        exec_time_adamw(n, m16, iters, &us, &err) != MOE_OK)
        return cli_fail(cli, &err);
    double bw = bytes / (us * 1e3), copy_bw = 2.0 * (double)copy / (copy_us * 1e3);
    printf("moeplan bench adamw on %s: %zu parameters (fp32 master and gradient, %s moments, the "
           "bf16 copy out: %.0f bytes a parameter); median of %d\n",
           dev.name, n, m16 ? "bf16" : "fp32", per, iters);
    printf("  update %.3f ms: %.2f ps a parameter, %.0f GB/s, %.1f%% of the copy bandwidth (%.0f "
           "GB/s: cudaMemcpy device to device, 4 GiB, read + write)\n",
           us / 1e3, us * 1e6 / (double)n, bw, 100.0 * bw / copy_bw, copy_bw);
    if (json) {
        json_t *o =
            json_pack("{s:s, s:I, s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "device", dev.name, "params",
                      (json_int_t)n, "moments", m16 ? "bf16" : "fp32", "bytes_per_param", per,
                      "iters", iters, "update_ms", us / 1e3, "ps_per_param", us * 1e6 / (double)n,
                      "gb_per_s", bw, "copy_gb_per_s", copy_bw);
        if (!o) {
            moe_error_set(&err, MOE_ERR_NOMEM, "%s: out of memory", json);
            return cli_fail(cli, &err);
        }
        enum moe_status st = moe_json_write_atomic(json, o, "moeplan.bench.adamw", 1, &err);
        json_decref(o);
        if (st != MOE_OK) return cli_fail(cli, &err);
    }
    return 0;
}

/* The attention core by each backend this build has: forward and backward time and the TFLOPS of
 * the products the mask keeps (a window's band, or the causal half). */
static int bench_attention(struct cli *cli, int seqs, int seq, int heads, int kv, int d, int window,
                           int iters)
{
    struct moe_error err;
    struct exec_device_info dev;
    int rc = bench_gpu(cli, &dev);
    if (rc >= 0) return rc;
    double pairs = 0.0; /* (query, key) pairs the mask keeps, a sequence */
    for (int i = 0; i < seq; i++) pairs += window > 0 && window < i + 1 ? window : i + 1;
    double flops = 4.0 * d * heads * pairs * seqs;
    printf("moeplan bench attention on %s: %d x %d tokens, %d / %d heads, head dim %d, %s; median "
           "of %d\n",
           dev.name, seqs, seq, heads, kv, d, window > 0 ? "sliding window" : "causal", iters);
    if (window > 0) printf("  window %d keys\n", window);
    const char *hd[] = {"backend", "forward", "TFLOPS", "backward", "TFLOPS"};
    struct rpt_table *t = rpt_table_create(5, hd, "lrrrr");
    /* ours; cuDNN's; cuDNN's graph with a sink a head (Transformer Engine's gpt-oss attention) */
    for (int b = 0; b < 3 && t; b++) {
        bool cudnn = b >= 1, sinks = b == 2;
        if (cudnn && !exec_attention_cudnn(EXEC_ATTN_AUTO)) continue;
        double f, bw;
        if (exec_time_attention(seqs, seq, heads, kv, d, d, window,
                                cudnn ? EXEC_ATTN_CUDNN : EXEC_ATTN_OWN, sinks, iters, &f, &bw,
                                &err) != MOE_OK) {
            if (sinks) { /* a cuDNN before 9.13 has no sinks: the table without that row */
                fprintf(stderr, "moeplan bench: attention with sinks: %s\n", err.message);
                break;
            }
            rpt_table_destroy(t);
            return cli_fail(cli, &err);
        }
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", sinks ? "cuDNN, sinks" : cudnn ? "cuDNN" : "ours");
        rpt_table_cell(t, NULL, "%.3f ms", f / 1e3);
        rpt_table_cell(t, NULL, "%.0f", flops / (f * 1e6));
        rpt_table_cell(t, NULL, "%.3f ms", bw / 1e3);
        rpt_table_cell(t, NULL, "%.0f", 2.5 * flops / (bw * 1e6));
    }
    if (!t) {
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        return cli_fail(cli, &err);
    }
    rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    return 0;
}

/* bench gemm's shapes without --m, --n, --k: the three GEMMs of an expert (its forward's gate,
 * its down projection, its gate's weight gradient; the rest repeat these) at the mean rows of
 * bench/run-fp8's block shapes (tokens x top-k / experts) */
static const struct gemm_shape {
    const char *what;
    int m, n, k;
} gemm_shapes[] = {
    {"mixtral gate/up", 4096, 14336, 4096},    {"mixtral down", 4096, 4096, 14336},
    {"mixtral gate wgrad", 14336, 4096, 4096}, {"deepseek-v3 gate/up", 8192, 2048, 7168},
    {"deepseek-v3 down", 8192, 7168, 2048},    {"deepseek-v3 gate wgrad", 2048, 7168, 8192},
};

/* Each shape's GEMM by kind (exec_time_gemm_kinds): time, TFLOPS and the speedup over bf16, and
 * the quantization of x each fp8 recipe adds (once per GEMM input in a training step; the
 * weight's once per update) */
static int bench_gemm(struct cli *cli, const struct gemm_shape *sh, int nsh, int iters,
                      const char *json)
{
    struct moe_error err;
    struct exec_device_info dev;
    int rc = bench_gpu(cli, &dev);
    if (rc >= 0) return rc;
    if (exec_warm_up(2.0, &err) != MOE_OK) return cli_fail(cli, &err); /* the clocks up first */
    printf("moeplan bench gemm on %s: y = x w^T, x m x k, w n x k, bf16 out; operands quantized "
           "beforehand, x's quantization apart; median of %d after 2 s of GEMMs\n",
           dev.name, iters);
    const char *hd[] = {"GEMM",     "m x n x k", "bf16 TFLOPS", "fp8 TFLOPS",     "fp8",
                        "fp8 fast", "fp8block",  "cast x fp8",  "cast x fp8block"};
    const char *ha[] = {"GEMM", "bf16", "fp8", "fp8 fast", "fp8block"};
    struct rpt_table *t = rpt_table_create(9, hd, "llrrrrrrr"),
                     *ta = rpt_table_create(5, ha, "lrrrr");
    json_t *rows = json ? json_array() : NULL;
    for (int i = 0; i < nsh && t && ta && (!json || rows); i++) {
        struct exec_gemm_times g;
        if (exec_time_gemm_kinds(sh[i].m, sh[i].n, sh[i].k, iters, &g, &err) != MOE_OK) {
            rpt_table_destroy(t);
            rpt_table_destroy(ta);
            json_decref(rows);
            return cli_fail(cli, &err);
        }
        rpt_table_row(ta, NULL);
        rpt_table_cell(ta, NULL, "%s", sh[i].what);
        for (int kd = 0; kd < EXEC_GEMM_KINDS; kd++)
            if (g.algos[kd] && g.first_us[kd] > 0)
                rpt_table_cell(ta, NULL, "%.0f / %.0f (#%d of %d; %d alike)",
                               2.0 * sh[i].m * sh[i].n * sh[i].k / (g.first_us[kd] * 1e6),
                               2.0 * sh[i].m * sh[i].n * sh[i].k / (g.fastest_us[kd] * 1e6),
                               g.fastest_at[kd] + 1, g.algos[kd], g.alike[kd]);
            else
                rpt_table_cell(ta, NULL, "no");
        double fl = 2.0 * sh[i].m * sh[i].n * sh[i].k, *u = g.gemm_us;
        rpt_table_row(t, NULL);
        rpt_table_cell(t, NULL, "%s", sh[i].what);
        rpt_table_cell(t, NULL, "%d x %d x %d", sh[i].m, sh[i].n, sh[i].k);
        rpt_table_cell(t, NULL, "%.0f", fl / (u[EXEC_GEMM_BF16] * 1e6));
        rpt_table_cell(t, NULL, "%.0f", fl / (u[EXEC_GEMM_FP8] * 1e6));
        for (int kd = EXEC_GEMM_FP8; kd < EXEC_GEMM_KINDS; kd++)
            if (u[kd] > 0)
                rpt_table_cell(t, NULL, "%.2fx", u[EXEC_GEMM_BF16] / u[kd]);
            else
                rpt_table_cell(t, NULL, "no");
        rpt_table_cell(t, NULL, "%.3f ms", g.cast_us[EXEC_GEMM_FP8] / 1e3);
        if (g.cast_us[EXEC_GEMM_FP8_BLOCK] > 0)
            rpt_table_cell(t, NULL, "%.3f ms", g.cast_us[EXEC_GEMM_FP8_BLOCK] / 1e3);
        else
            rpt_table_cell(t, NULL, "no");
        if (rows) {
            json_t *us = json_object(), *cast = json_object();
            for (int kd = 0; kd < EXEC_GEMM_KINDS; kd++) {
                json_object_set_new(us, exec_gemm_kind_names[kd],
                                    u[kd] > 0 ? json_real(u[kd]) : json_null());
                if (kd != EXEC_GEMM_BF16)
                    json_object_set_new(cast, exec_gemm_kind_names[kd],
                                        g.cast_us[kd] > 0 ? json_real(g.cast_us[kd]) : json_null());
            }
            json_t *al = json_object();
            for (int kd = 0; kd < EXEC_GEMM_KINDS; kd++)
                if (g.algos[kd])
                    json_object_set_new(al, exec_gemm_kind_names[kd],
                                        json_pack("{s:i, s:f, s:f, s:i, s:i}", "timed", g.algos[kd],
                                                  "first_us", g.first_us[kd], "fastest_us",
                                                  g.fastest_us[kd], "fastest_at", g.fastest_at[kd],
                                                  "alike", g.alike[kd]));
            json_array_append_new(rows,
                                  json_pack("{s:s, s:i, s:i, s:i, s:o, s:o, s:o}", "what",
                                            sh[i].what, "m", sh[i].m, "n", sh[i].n, "k", sh[i].k,
                                            "gemm_us", us, "cast_x_us", cast, "lt_algorithms", al));
        }
    }
    if (!t || !ta || (json && !rows)) {
        rpt_table_destroy(t);
        rpt_table_destroy(ta);
        json_decref(rows);
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        return cli_fail(cli, &err);
    }
    rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    printf(
        "fp8: per tensor, fp32 accumulation promoted (the backward's GEMMs); fp8 fast: per "
        "tensor accumulating fast (the forward's); fp8block: x in 1 x 128 tiles, w in 128 x 128 "
        "blocks; speedups over bf16\n\n"
        "cuBLASLt's heuristic (bf16 through cuBLASLt too): TFLOPS of its first algorithm / of the "
        "fastest of its first %d, that one's place\n",
        EXEC_GEMM_ALGOS);
    rpt_table_print(ta, stdout);
    rpt_table_destroy(ta);
    if (!json) return 0;
    json_t *o = json_pack("{s:s, s:i, s:o}", "device", dev.name, "iters", iters, "shapes", rows);
    enum moe_status st = o ? moe_json_write_atomic(json, o, "moeplan.bench.gemm", 1, &err)
                           : moe_error_set(&err, MOE_ERR_NOMEM, "%s: out of memory", json);
    json_decref(o);
    return st == MOE_OK ? 0 : cli_fail(cli, &err);
}

int cmd_bench(struct cli *cli, const struct cli_cmd *cmd, int argc, char **argv)
{
    struct cli_arg args[CLI_MAX_ARGS];
    int nargs;
    int rc = cli_parse(cmd, argc, argv, args, &nargs);
    if (rc >= 0) return rc;
    struct moe_error err;
    if (optind >= argc) return cli_usage(cmd, "which benchmark: moe, adamw, attention or gemm");
    bool adamw = !strcmp(argv[optind], "adamw"), attn = !strcmp(argv[optind], "attention");
    bool gemm = !strcmp(argv[optind], "gemm");
    if (strcmp(argv[optind], "moe") != 0 && !adamw && !attn && !gemm) {
        if (strcmp(argv[optind], "eval") == 0) {
            moe_error_set(&err, MOE_ERR_UNSUPPORTED,
                          "the planner's evaluation rate is its own program: build/bench/eval_rate "
                          "(bench/README.md)");
            return cli_fail(cli, &err);
        }
        return cli_usage(cmd, "unknown benchmark '%s' (moe, adamw, attention or gemm)",
                         argv[optind]);
    }
    if (optind + 1 < argc) return cli_usage(cmd, "unexpected operand '%s'", argv[optind + 1]);
    uint64_t E = 8, T = 8192, K = 8, H = 7168, F = 2048, seed = 1, iters = 20, warm = 3,
             streams = EXEC_DEFAULT_STREAMS, params = 1000000000, seqs = 2, seq = 4096, heads = 64,
             kv = 8, hdim = 128, window = 0, gm = 0, gn = 0, gk = 0;
    double skew = 2.0;
    const char *json = NULL, *rout = NULL, *cal_file = NULL, *cluster = NULL;
    bool m16 = false;
    enum cost_precision prec = COST_BF16;
    for (int i = 0; i < nargs; i++) {
        const char *v = args[i].value;
        bool ok = true;
        switch (args[i].val) {
        case OPT_E: ok = cli_count(cmd, "experts", v, 1, 512, &E); break;
        case OPT_T: ok = cli_count(cmd, "tokens", v, 1, 1u << 24, &T); break;
        case OPT_K: ok = cli_count(cmd, "topk", v, 1, 512, &K); break;
        case OPT_H: ok = cli_count(cmd, "hidden", v, 1, 65536, &H); break;
        case OPT_F: ok = cli_count(cmd, "ffn", v, 1, 262144, &F); break;
        case OPT_SEED: ok = cli_count(cmd, "seed", v, 0, UINT32_MAX, &seed); break;
        case OPT_ITERS: ok = cli_count(cmd, "iters", v, 1, 100000, &iters); break;
        case OPT_WARM: ok = cli_count(cmd, "warmup", v, 0, 100000, &warm); break;
        case OPT_STREAMS: ok = cli_count(cmd, "streams", v, 1, EXEC_MAX_STREAMS, &streams); break;
        case OPT_SKEW: ok = cli_real(cmd, "skew", v, 0, 1e6, &skew); break;
        case OPT_JSON: json = v; break;
        case OPT_ROUT: rout = v; break;
        case OPT_CAL: cal_file = v; break;
        case OPT_CLUSTER: cluster = v; break;
        case OPT_PARAMS: ok = cli_count(cmd, "params", v, 1, (uint64_t)1 << 36, &params); break;
        case OPT_SEQS: ok = cli_count(cmd, "seqs", v, 1, 4096, &seqs); break;
        case OPT_SEQ: ok = cli_count(cmd, "seq", v, 1, 1u << 20, &seq); break;
        case OPT_HEADS: ok = cli_count(cmd, "heads", v, 1, 1024, &heads); break;
        case OPT_KV: ok = cli_count(cmd, "kv-heads", v, 1, 1024, &kv); break;
        case OPT_HD: ok = cli_count(cmd, "head-dim", v, 1, 1024, &hdim); break;
        case OPT_WINDOW: ok = cli_count(cmd, "window", v, 0, 1u << 20, &window); break;
        case OPT_GM: ok = cli_count(cmd, "m", v, 1, 1u << 20, &gm); break;
        case OPT_GN: ok = cli_count(cmd, "n", v, 16, 1u << 20, &gn); break;
        case OPT_GK: ok = cli_count(cmd, "k", v, 16, 1u << 20, &gk); break;
        case OPT_PREC:
            if (strcmp(v, "bf16") && strcmp(v, "fp8") && strcmp(v, "fp8block"))
                return cli_usage(cmd,
                                 "--precision %s: bf16, fp8 or fp8block (mxfp8 needs Blackwell "
                                 "and is not in the executor)",
                                 v);
            prec = !strcmp(v, "fp8")        ? COST_FP8
                   : !strcmp(v, "fp8block") ? COST_FP8_BLOCK
                                            : COST_BF16;
            break;
        case OPT_MOMENTS:
            if (strcmp(v, "fp32") && strcmp(v, "bf16"))
                return cli_usage(cmd, "--moments %s: fp32 or bf16", v);
            m16 = !strcmp(v, "bf16");
            break;
        }
        if (!ok) return 2;
    }
    /* the outputs checked before any GPU work: a benchmark's minutes not lost to a bad path */
    if ((json && !cli_output_ok(cmd, "--json", json)) ||
        (rout && !cli_output_ok(cmd, "--routing-out", rout)))
        return 2;
    if (adamw) return bench_adamw(cli, (size_t)params, m16, (int)iters, json);
    if (gemm) {
        if ((gm || gn || gk) && !(gm && gn && gk))
            return cli_usage(cmd, "--m, --n and --k: all three, or none (the default shapes)");
        if (gn % 16 || gk % 16)
            return cli_usage(cmd, "--n %llu and --k %llu: multiples of 16 (fp8 GEMMs)",
                             (unsigned long long)gn, (unsigned long long)gk);
        if (gm * gk > (1ull << 32) || gn * gk > (1ull << 32) || gm * gn > (1ull << 32))
            return cli_usage(cmd, "--m x --k, --n x --k and --m x --n: at most 2^32 values each");
        struct gemm_shape one = {"given", (int)gm, (int)gn, (int)gk};
        return gm ? bench_gemm(cli, &one, 1, (int)iters, json)
                  : bench_gemm(cli, gemm_shapes, (int)(sizeof gemm_shapes / sizeof *gemm_shapes),
                               (int)iters, json);
    }
    if (attn) {
        if (heads % kv)
            return cli_usage(cmd, "--heads %llu is not a multiple of --kv-heads %llu",
                             (unsigned long long)heads, (unsigned long long)kv);
        if (seqs * seq > (1u << 24))
            return cli_usage(cmd, "--seqs x --seq: at most %u tokens", 1u << 24);
        return bench_attention(cli, (int)seqs, (int)seq, (int)heads, (int)kv, (int)hdim,
                               (int)window, (int)iters);
    }
    if (K > E)
        return cli_usage(cmd, "--topk %llu exceeds --experts %llu", (unsigned long long)K,
                         (unsigned long long)E);
    /* the executor keeps a width cuBLASLt's fp8 cannot take in bf16: the "fp8" block would be
     * bf16's timed twice */
    if (prec != COST_BF16 && (H % 16 || F % 16))
        return cli_usage(cmd,
                         "--precision %s: --hidden %llu and --ffn %llu must be multiples of 16 "
                         "(fp8 GEMMs; the executor runs other widths in bf16)",
                         cost_precision_names[prec], (unsigned long long)H, (unsigned long long)F);
    struct topo_cluster cl;
    struct cost_calibration cal;
    /* a bad profile is said before the GPU is looked for; then the GPU measured must be the
     * cluster's and the profile's */
    if (cal_file && strcmp(cal_file, "datasheet") &&
        cli_gpu_cluster_load(cli, NULL, cluster, cal_file, &cl, &cal, &err))
        return cli_fail(cli, &err);
    struct exec_device_info dev;
    rc = bench_gpu(cli, &dev);
    if (rc >= 0) return rc;
    if (cal_file && cli_gpu_cluster_load(cli, dev.name, cluster, cal_file, &cl, &cal, &err))
        return cli_fail(cli, &err);
    /* bf16, and with --precision fp8 or fp8block that one too, on the same routing */
    int nrun = prec == COST_BF16 ? 1 : 2;
    struct exec_moe_bench_result rr[2];
    int *choice = malloc(sizeof *choice * (size_t)T * K);
    if (!choice) {
        moe_error_set(&err, MOE_ERR_NOMEM, "out of memory");
        return cli_fail(cli, &err);
    }
    for (int i = 0; i < nrun; i++) {
        struct exec_moe_bench_cfg c = {(int)E,
                                       (int)T,
                                       (int)K,
                                       (int)H,
                                       (int)F,
                                       (int)streams,
                                       (int)warm,
                                       (int)iters,
                                       skew,
                                       seed,
                                       i ? prec : COST_BF16,
                                       true};
        if (exec_moe_bench(&c, choice, &rr[i], &err) != MOE_OK) {
            free(choice);
            return cli_fail(cli, &err);
        }
    }
    const struct exec_moe_bench_result *r0 = &rr[0];
    double dt = r0->block_flops / (r0->dense_ms * 1e9);
    printf(
        "moeplan bench moe on %s: %llu experts x %llu tokens top-%llu (%llu routed rows), hidden "
        "%llu, ffn %llu; Dirichlet %g load (busiest expert %.2fx the mean); %llu expert streams; "
        "median of %llu\n",
        dev.name, (unsigned long long)E, (unsigned long long)T, (unsigned long long)K,
        (unsigned long long)(T * K), (unsigned long long)H, (unsigned long long)F, skew,
        r0->max_over_mean, (unsigned long long)streams, (unsigned long long)iters);
    const char *hd[] = {"fwd + bwd", "ms", "TFLOPS", "of bf16 dense"};
    struct rpt_table *t = rpt_table_create(4, hd, "lrrr");
    for (int i = 0; t && i < nrun; i++) {
        const struct exec_moe_bench_result *r = &rr[i];
        const char *names[] = {"expert block", "MoE layer", "dense ceiling"};
        double ms[] = {r->block_ms, r->layer_ms, r->dense_ms};
        double fl[] = {r->block_flops, r->layer_flops, r->block_flops};
        for (int j = 0; j < 3; j++) {
            rpt_table_row(t, NULL);
            rpt_table_cell(t, NULL, "%s%s%s", names[j], nrun > 1 ? ", " : "",
                           nrun > 1 ? cost_precision_names[i ? prec : COST_BF16] : "");
            rpt_table_cell(t, NULL, "%.3f", ms[j]);
            rpt_table_cell(t, NULL, "%.1f", fl[j] / (ms[j] * 1e9));
            rpt_table_cell(t, NULL, "%.2f", fl[j] / (ms[j] * 1e9) / dt);
        }
    }
    if (t) rpt_table_print(t, stdout);
    rpt_table_destroy(t);
    double off[EXEC_BENCH_SAMPLES] = {0}; /* the recipe's results against bf16's */
    if (nrun > 1) {
        printf("%s over bf16: expert block %.2fx (forward %.2fx, backward %.2fx), MoE layer "
               "%.2fx\n",
               cost_precision_names[prec], rr[0].block_ms / rr[1].block_ms,
               rr[0].block_fwd_ms / rr[1].block_fwd_ms, rr[0].block_bwd_ms / rr[1].block_bwd_ms,
               rr[0].layer_ms / rr[1].layer_ms);
        printf("%s against bf16 (the same weights, inputs and routing; relative L2 over up to %d "
               "values of each):",
               cost_precision_names[prec], EXEC_BENCH_SAMPLE);
        for (int s = 0; s < EXEC_BENCH_SAMPLES; s++) {
            double dd = 0, nn = 0;
            for (int j = 0; j < rr[0].nsample[s] && j < rr[1].nsample[s]; j++) {
                double a = rr[1].sample[s][j], b = rr[0].sample[s][j];
                dd += (a - b) * (a - b), nn += b * b;
            }
            off[s] = nn > 0 ? sqrt(dd / nn) : sqrt(dd);
            printf("%s %s %.2f%%", s ? "," : "", exec_bench_sample_names[s], 100 * off[s]);
        }
        printf("\n");
    }
    printf("expert block forward from an idle GPU and behind 20 ms of a busy one:");
    for (int i = 0; i < nrun; i++)
        printf("%s %s %.3f and %.3f ms", i ? "," : "", cost_precision_names[i ? prec : COST_BF16],
               rr[i].block_fwd_ms, rr[i].block_fwd_busy_ms);
    printf("\n");
    char b[32];
    moe_format_bytes(r0->layer_bytes, b, sizeof b);
    printf("host syncs per layer (fwd + bwd): %d; activations kept per layer: %s\n", r0->host_syncs,
           b);
    for (int i = 0; cal_file && i < nrun; i++) { /* the cost model on this routing's rows */
        double *rows = calloc(E, sizeof *rows), us[2], pred[2] = {0, 0};
        for (uint64_t j = 0; rows && j < T * K; j++) rows[choice[j]] += 1.0;
        for (uint64_t e = 0; rows && e < E; e++) {
            cost_expert_us(&cal, &cl.gpu, rows[e], (double)H, (double)F, i ? prec : COST_BF16, us);
            pred[0] += us[0] / 1e3, pred[1] += us[1] / 1e3;
        }
        free(rows);
        double mf = rr[i].block_fwd_ms, mb = rr[i].block_bwd_ms;
        printf("expert block (%s) against the cost model (%s, this routing's rows): forward %.3f "
               "ms, model %.3f (%+.1f%%); backward %.3f ms, model %.3f (%+.1f%%)\n",
               cost_precision_names[i ? prec : COST_BF16], cal.source, mf, pred[0],
               100 * (mf / pred[0] - 1), mb, pred[1], 100 * (mb / pred[1] - 1));
    }
    enum moe_status st = MOE_OK;
    if (rout) st = moe_file_write_atomic(rout, choice, sizeof *choice * (size_t)T * K, &err);
    free(choice);
    if (st != MOE_OK) return cli_fail(cli, &err);
    if (json) {
        double bt = r0->block_flops / (r0->block_ms * 1e9),
               lt = r0->layer_flops / (r0->layer_ms * 1e9);
        json_t *o = json_pack(
            "{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:f}",
            "device", dev.name, "experts", (json_int_t)E, "tokens", (json_int_t)T, "top_k",
            (json_int_t)K, "hidden", (json_int_t)H, "ffn", (json_int_t)F, "skew", skew, "seed",
            (json_int_t)seed, "streams", (json_int_t)streams, "iters", (json_int_t)iters,
            "max_over_mean", r0->max_over_mean, "block_ms", r0->block_ms, "layer_ms", r0->layer_ms,
            "dense_ms", r0->dense_ms, "block_tflops", bt, "layer_tflops", lt, "dense_tflops", dt,
            "block_flops", r0->block_flops, "layer_flops", r0->layer_flops, "host_syncs_per_layer",
            r0->host_syncs, "layer_activation_bytes", r0->layer_bytes, "block_fwd_ms",
            r0->block_fwd_ms, "block_fwd_busy_ms", r0->block_fwd_busy_ms, "block_bwd_ms",
            r0->block_bwd_ms);
        if (o && nrun > 1)
            json_object_set_new(
                o, cost_precision_names[prec],
                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:{s:f, s:f, s:f, s:f}}", "block_ms",
                          rr[1].block_ms, "block_fwd_ms", rr[1].block_fwd_ms, "block_fwd_busy_ms",
                          rr[1].block_fwd_busy_ms, "block_bwd_ms", rr[1].block_bwd_ms, "layer_ms",
                          rr[1].layer_ms, "dense_ms", rr[1].dense_ms, "relative_l2_to_bf16", "y",
                          off[EXEC_BENCH_Y], "dx", off[EXEC_BENCH_DX], "dgate",
                          off[EXEC_BENCH_DGATE], "ddown", off[EXEC_BENCH_DDOWN]));
        if (!o) {
            moe_error_set(&err, MOE_ERR_NOMEM, "%s: out of memory", json);
            return cli_fail(cli, &err);
        }
        st = moe_json_write_atomic(json, o, "moeplan.bench.moe", 1, &err);
        json_decref(o);
        if (st != MOE_OK) return cli_fail(cli, &err);
    }
    return 0;
}

#endif /* MOEPLAN_HAVE_EXECUTOR */
