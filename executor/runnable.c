/*
 * runnable.c: what this build's executor runs, in one place: `moeplan run` refuses any other
 * plan with this reason, and `moeplan plan --runnable` searches only these layouts. It grows
 * as the executor does (issue 8: expert, data and pipeline parallelism).
 */
#include "exec.h"

#include <stdio.h>

bool exec_layout_runnable(const struct cost_layout *l, int gpus, char *why, size_t cap)
{
    char none[1];
    if (!why || !cap) {
        why = none;
        cap = sizeof none;
    }
    if (l->tp > 1 || l->etp > 1) {
        snprintf(why, cap, "tp=%d etp=%d: tensor parallelism is not in the executor yet (tp=1)",
                 l->tp, l->etp);
        return false;
    }
    if (l->pp > 1 && l->ep > 1) {
        snprintf(why, cap,
                 "pp=%d with ep=%d: expert parallelism inside pipeline stages is not in the GPU "
                 "executor yet (pp=1 or ep=1)",
                 l->pp, l->ep);
        return false;
    }
    if (l->dp > 1 && l->zero > 1) {
        snprintf(why, cap,
                 "zero=%d with dp=%d: the GPU executor shards the optimizer state only (ZeRO-1), "
                 "not the gradients or parameters (zero=1 or 0)",
                 l->zero, l->dp);
        return false;
    }
    if (l->ep > 1 && l->recompute == COST_RECOMPUTE_FULL) {
        snprintf(why, cap, "ep=%d with full recompute: not in the executor yet (recompute=none)",
                 l->ep);
        return false;
    }
    if (gpus != l->pp * l->dp) {
        snprintf(why, cap, "%d GPUs for pp=%d x dp=%d", gpus, l->pp, l->dp);
        return false;
    }
    if (l->precision != COST_BF16) {
        snprintf(why, cap, "precision %s: the executor trains in bf16 only",
                 cost_precision_names[l->precision]);
        return false;
    }
    if (l->recompute == COST_RECOMPUTE_SELECTIVE) {
        snprintf(why, cap, "selective recompute: not in the executor yet (none or full are)");
        return false;
    }
    return true;
}
