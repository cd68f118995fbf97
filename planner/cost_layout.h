/*
 * cost_layout.h: the cost model's vocabulary, which the executor, the reports and the plan file
 * share with it: the phases of a step, the dispatchers, and a parallel layout with its text form
 * ("tp=1,pp=4,..."), its micro-batches and its structural check. Part of the moe_cost library
 * (layout.c); cost.h includes it.
 */
#ifndef COST_LAYOUT_H
#define COST_LAYOUT_H

#include "mdl.h"

/* The pipeline the cost model simulates: at most COST_MAX_PP ranks and COST_MAX_STAGES virtual
 * stages (cost_layout_check refuses more). */
#define COST_MAX_PP 64
#define COST_MAX_STAGES 256

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Phases: the names predictions and measurements share (docs/DESIGN.md)                          */
/* ---------------------------------------------------------------------------------------------- */

/* the phases in rows, as cost_phase_names lists them */
/* clang-format off */
enum cost_phase {
    COST_EMBED = 0, COST_ATTN_FWD, COST_ATTN_BWD, COST_ROUTER, COST_PERMUTE, COST_DISPATCH,
    COST_EXPERTS_FWD, COST_EXPERTS_BWD, COST_COMBINE, COST_UNPERMUTE, COST_SHARED_EXPERT,
    COST_DENSE_FFN, COST_LM_HEAD, COST_LOSS, COST_TP_COMM, COST_DP_GRAD_SYNC, COST_PP_P2P,
    COST_OPTIMIZER, COST_BUBBLE, COST_STEP, COST_NPHASES
};
/* clang-format on */
extern const char *const cost_phase_names[COST_NPHASES];

/* ---------------------------------------------------------------------------------------------- */
/* Dispatchers                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

/* How EP sends tokens to their experts: one copy per (token, expert) pair (all-to-all), one per
 * destination GPU (dedup-gpu), or one per destination NVLink domain, fanned out inside it
 * (dedup-domain). cost_bytes: the token payload, by the link tier it crosses. */
enum cost_dispatcher {
    COST_DISPATCH_ALLTOALL = 0,
    COST_DISPATCH_DEDUP_GPU,
    COST_DISPATCH_DEDUP_DOMAIN
};
extern const char *const cost_dispatcher_names[];
struct cost_bytes {
    double nvlink, scale_out; /* bytes (token payload only) */
};
/* ---------------------------------------------------------------------------------------------- */
/* Layouts                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum cost_precision { COST_BF16 = 0, COST_FP8, COST_MXFP8 };
enum cost_recompute { COST_RECOMPUTE_NONE = 0, COST_RECOMPUTE_SELECTIVE, COST_RECOMPUTE_FULL };
extern const char *const cost_precision_names[];
extern const char *const cost_recompute_names[];

struct cost_layout {
    int tp, pp, vpp, ep, etp, dp, zero;
    int seq_len, mbs, gbs;
    enum cost_precision precision;
    enum cost_recompute recompute;
    enum cost_dispatcher dispatcher;
    bool overlap; /* EP all-to-all overlapped with compute */
};

/* "tp=1,pp=8,vpp=4,ep=64,dp=128,zero=1,mbs=1,gbs=8192,recompute=selective,dispatcher=dedup-gpu".
 * Keys left out keep the values already in `l`. */
enum moe_status cost_layout_parse(struct cost_layout *l, const char *text, struct moe_error *err);
void cost_layout_format(const struct cost_layout *l, char *buf, size_t cap);
/* Micro-batches per step: gbs / (dp * mbs). */
int cost_layout_micro_batches(const struct cost_layout *l);
/* Structural validity for this model and GPU count (divisibility, degrees multiply to gpus). A
 * failure is MOE_ERR_INFEASIBLE with the reason. */
enum moe_status cost_layout_check(const struct cost_layout *l, const struct mdl_model *m, int gpus,
                                  struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* COST_LAYOUT_H */
