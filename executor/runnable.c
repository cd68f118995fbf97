/*
 * runnable.c: what this build's executor runs, in one place: the model's features and sizes,
 * the layout, and the plan's expert placement. `moeplan run` refuses any other plan with the
 * reason given here, before it touches a GPU; `moeplan plan --runnable` checks the model first
 * and searches only the layouts accepted here, so that every plan it writes is one `run` takes
 * (test_cli checks that for a plan of every model family). It grows as the executor does.
 */
#include "exec_ref.h"

#include <stdio.h>

/* The GPU router keeps a token's scores in registers (route.cu, gpu_kernels.h's GK_MAX_EXPERTS);
 * the EP exchange carries at most EXEC_EP_MAX_K choices a token. */
#define RUN_MAX_EXPERTS 512
#define RUN_MAX_TOP_K 16

bool exec_model_supported(const struct mdl_model *m, char *why, size_t cap)
{
    char none[1];
    if (!why || !cap) {
        why = none;
        cap = sizeof none;
    }
    const struct mdl_attention *a = &m->attn;
    const char *missing[3];
    int n = 0;
    if (a->qk_norm && a->type != MDL_ATTN_GQA) missing[n++] = "QK-norm with MLA";
    if (a->bias && a->type != MDL_ATTN_GQA) missing[n++] = "attention biases with MLA";
    if (a->sinks && a->type != MDL_ATTN_GQA) missing[n++] = "attention sinks with MLA";
    if (n == 0) return true;
    size_t used = (size_t)snprintf(why, cap, "%s uses", m->name);
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(why + used, cap - used, "%s %s",
                                 i == 0       ? ""
                                 : i == n - 1 ? " and"
                                              : ",",
                                 missing[i]);
    if (used < cap) snprintf(why + used, cap - used, ": not in the executor yet");
    return false;
}

bool exec_model_runnable(const struct mdl_model *m, char *why, size_t cap)
{
    if (!exec_model_supported(m, why, cap)) return false;
    if (m->moe.experts > RUN_MAX_EXPERTS || m->moe.top_k > RUN_MAX_TOP_K) {
        if (why && cap)
            snprintf(why, cap,
                     "%s: %d experts, top-%d: the GPU executor routes at most %d experts, top-%d "
                     "(a proxy with --experts runs)",
                     m->name, m->moe.experts, m->moe.top_k, RUN_MAX_EXPERTS, RUN_MAX_TOP_K);
        return false;
    }
    return true;
}

bool exec_plan_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                        const int *placement, char *why, size_t cap)
{
    if (!exec_model_runnable(m, why, cap) || !exec_layout_runnable(m, l, gpus, why, cap))
        return false;
    for (int layer = 0; placement && layer < m->layers; layer++)
        for (int e = 0; e < m->moe.experts; e++)
            if (placement[(size_t)layer * m->moe.experts + e] == -2) {
                if (why && cap)
                    snprintf(why, cap,
                             "layer %d, expert %d is split over replicas: the executor serves "
                             "each expert from one rank (plan without --replicas)",
                             layer, e);
                return false;
            }
    return true;
}

bool exec_batch_runnable(const struct mdl_model *m, int mbs, int seq, char *why, size_t cap)
{
    double tokens = (double)mbs * seq, wide = m->hidden;
    int chunk = m->attn.chunk_size;
    if (chunk && seq > chunk && seq % chunk) {
        if (why && cap)
            snprintf(why, cap,
                     "seq %d with chunked attention (chunks of %d): the executor takes a sequence "
                     "of at most one chunk or a whole number of them",
                     seq, chunk);
        return false;
    }
    if (m->moe.intermediate > wide) wide = m->moe.intermediate;
    if (tokens * m->moe.top_k * wide <= 2e9 && tokens * m->vocab <= 2e9) return true;
    if (why && cap)
        snprintf(why, cap,
                 "a micro-batch of %.0f tokens (mbs=%d x seq %d) is too large for the executor's "
                 "32-bit GEMM offsets (the logits: %.3g elements, at most 2e9); lower %s",
                 tokens, mbs, seq, tokens * m->vocab, mbs > 1 ? "mbs or seq_len" : "seq_len");
    return false;
}

bool exec_layout_runnable(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                          char *why, size_t cap)
{
    char none[1];
    if (!why || !cap) {
        why = none;
        cap = sizeof none;
    }
    if (!exec_batch_runnable(m, l->mbs, l->seq_len, why, cap)) return false;
    if (l->tp > 1 || l->etp > 1) {
        snprintf(why, cap, "tp=%d etp=%d: tensor parallelism is not in the executor yet (tp=1)",
                 l->tp, l->etp);
        return false;
    }
    if (l->cp > 1) {
        snprintf(why, cap, "cp=%d: context parallelism is not in the executor yet (cp=1)", l->cp);
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
        unsigned missing = cost_layout_rc(l) & ~(unsigned)EXEC_RC_MODULES;
        if (missing) {
            char mods[128], have[128];
            cost_rc_modules_format(missing, ", ", mods, sizeof mods);
            cost_rc_modules_format(EXEC_RC_MODULES, ", ", have, sizeof have);
            snprintf(why, cap, "selective recompute of %s: not in the executor yet (%s are)", mods,
                     have);
            return false;
        }
        if (l->pp > 1) {
            snprintf(why, cap,
                     "selective recompute with pp=%d: not in the executor yet (its stages "
                     "recompute whole blocks)",
                     l->pp);
            return false;
        }
    }
    if (l->recompute == COST_RECOMPUTE_FULL && l->recompute_layers) {
        snprintf(why, cap, "full recompute of %d layers a stage: the executor recomputes all",
                 l->recompute_layers);
        return false;
    }
    if (l->dispatcher > COST_DISPATCH_DEDUP_DOMAIN) {
        snprintf(why, cap,
                 "dispatcher %s: not in the executor (its own are alltoall, dedup-gpu, "
                 "dedup-domain)",
                 cost_dispatcher_names[l->dispatcher]);
        return false;
    }
    if (l->mtp) {
        snprintf(why, cap, "mtp=%d: multi-token prediction is not in the executor yet (mtp=0)",
                 l->mtp);
        return false;
    }
    if (l->offload > 0) {
        snprintf(why, cap, "offload=%g: the executor keeps the optimizer on the GPU (offload=0)",
                 l->offload);
        return false;
    }
    if (l->grad_reduce_bf16) {
        snprintf(why, cap, "grad_reduce=bf16: the executor reduces the gradients in fp32");
        return false;
    }
    if (l->graphs != COST_GRAPHS_NONE || l->delay_wgrad) {
        snprintf(why, cap, "%s: not in the executor yet",
                 l->delay_wgrad ? "delayed weight gradients" : "CUDA graphs");
        return false;
    }
    if (l->pp_layout[0]) {
        snprintf(why, cap, "pp_layout: the executor takes a plan's split in layer counts only");
        return false;
    }
    return true;
}
