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
    if (gpus > 1 || l->tp > 1 || l->pp > 1 || l->ep > 1 || l->dp > 1 || l->etp > 1) {
        snprintf(why, cap,
                 "%d GPUs (tp=%d pp=%d ep=%d dp=%d): the executor runs one GPU; multi-GPU runs "
                 "come with the distributed executor (issue 8)",
                 gpus, l->tp, l->pp, l->ep, l->dp);
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
