/*
 * eval_rate.c: how many layouts per second the cost model evaluates on one core.
 *
 * The search of the planner calls cost_evaluate in a tight loop over every valid layout; this
 * runs the same loop over a grid of layouts of DeepSeek-V3 on 1024 GB300 and Mixtral-8x7B on
 * 1024 H100, for at least two seconds each, and prints the rate.
 *
 *   build/bench/eval_rate [DATA_DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

static int run(const char *data, const char *model, const char *cluster, int gpus)
{
    char dir[1024];
    struct mdl_model m;
    struct topo_cluster c;
    struct moe_error err;
    snprintf(dir, sizeof dir, "%s/model", data);
    if (mdl_model_resolve(&m, model, dir, &err) != MOE_OK) goto fail;
    snprintf(dir, sizeof dir, "%s/topologies", data);
    if (topo_cluster_resolve(&c, cluster, dir, &err) != MOE_OK) goto fail;
    struct cost_ctx ctx;
    cost_ctx_init(&ctx, &m, &c, NULL, gpus);
    enum { MAXL = 20000 };
    static struct cost_layout grid[MAXL];
    int n = 0;
    static const int tps[] = {1, 2, 4, 8}, pps[] = {1, 2, 4, 8, 16},
                     eps[] = {1, 8, 16, 32, 64, 128, 256};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t e = 0; e < 7; e++)
                for (int mbs = 1; mbs <= 2; mbs++)
                    for (int rc = 0; rc < 3; rc++)
                        for (int d = 0; d < 3; d++) {
                            struct cost_layout l;
                            cost_layout_defaults(&l, 4096);
                            l.tp = tps[a], l.pp = pps[b], l.ep = eps[e], l.mbs = mbs;
                            l.recompute = (enum cost_recompute)rc;
                            l.dispatcher = (enum cost_dispatcher)d;
                            l.overlap = true;
                            l.dp = gpus / (l.tp * l.pp);
                            l.gbs = l.dp * mbs * 16;
                            if (cost_layout_check(&l, &m, gpus, NULL) != MOE_OK) continue;
                            if (n < MAXL) grid[n++] = l;
                        }
    if (n == 0) {
        fprintf(stderr, "eval_rate: no valid layout\n");
        return 1;
    }
    long evals = 0;
    double t0 = moe_time_now_s(), t;
    do {
        for (int i = 0; i < n; i++) {
            struct cost_result r;
            if (cost_evaluate(&ctx, &grid[i], &r, &err) != MOE_OK) goto fail;
        }
        evals += n;
        t = moe_time_now_s() - t0;
    } while (t < 2.0);
    printf("| %s | %s | %d | %d | %ld | %.2f | %.0f | %.1f |\n", model, cluster, gpus, n, evals, t,
           evals / t, 1e6 * t / evals);
    return 0;
fail:
    fprintf(stderr, "eval_rate: %s\n", err.message);
    return 1;
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : MOEPLAN_DATA_DIR;
    printf("| model | cluster | GPUs | layouts in grid | evaluations | seconds | layouts/s | "
           "us/layout |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    int rc = run(data, "deepseek-v3", "gb300-nvl72-x16", 1024);
    rc |= run(data, "mixtral-8x7b", "hgx-h100-x128", 1024);
    return rc;
}
