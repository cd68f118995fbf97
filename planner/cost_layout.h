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
 * (dedup-domain). DeepEP and HybridEP (Megatron's flex dispatcher) send as dedup-domain does,
 * with kernels of their own. cost_bytes: the token payload, by the link tier it crosses. */
enum cost_dispatcher {
    COST_DISPATCH_ALLTOALL = 0,
    COST_DISPATCH_DEDUP_GPU,
    COST_DISPATCH_DEDUP_DOMAIN,
    COST_DISPATCH_DEEPEP,
    COST_DISPATCH_HYBRIDEP
};
extern const char *const cost_dispatcher_names[];
/* The SMs the DeepEP and HybridEP kernels take when `ep_sms` is not given: DeepEP's own default
 * (its Buffer's num_sms) and what Megatron-Bridge's HybridEP recipes set. */
#define COST_DEEPEP_SMS 20
#define COST_HYBRIDEP_SMS 32
/* The copies a dispatcher sends: alltoall, dedup-gpu or dedup-domain. */
static inline enum cost_dispatcher cost_dispatch_copies(enum cost_dispatcher d)
{
    return d == COST_DISPATCH_DEEPEP || d == COST_DISPATCH_HYBRIDEP ? COST_DISPATCH_DEDUP_DOMAIN
                                                                    : d;
}
struct cost_bytes {
    double nvlink, scale_out; /* bytes (token payload only) */
};
/* ---------------------------------------------------------------------------------------------- */
/* Layouts                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Precision recipes: bf16; fp8 with per-tensor current scaling (Hopper and Blackwell); fp8
 * blockwise (1x128 activations, 128x128 weights); mxfp8 (1x32 blocks, Blackwell only). */
enum cost_precision { COST_BF16 = 0, COST_FP8, COST_MXFP8, COST_FP8_BLOCK };
/* Whether the recipe's gradients are E5M2 (Megatron's --fp8-format hybrid: E4M3 weights and
 * activations, E5M2 gradients), as Megatron-Bridge's tensorwise and blockwise recipes
 * (bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_subchannel_scaling_mixed) have them; its
 * MXFP8 recipe is E4M3 throughout. */
static inline int cost_precision_e5m2_grads(enum cost_precision p)
{
    return p == COST_FP8 || p == COST_FP8_BLOCK;
}
/* Recompute: none; selective (the modules in recompute_modules); full (whole blocks: the first
 * recompute_layers of each stage, 0: all of them, keep only their input). */
enum cost_recompute { COST_RECOMPUTE_NONE = 0, COST_RECOMPUTE_SELECTIVE, COST_RECOMPUTE_FULL };
extern const char *const cost_precision_names[];
extern const char *const cost_recompute_names[];
/* CUDA graphs: none; partial (Megatron's TE scopes attn, moe_router, moe_preprocess: attention,
 * the router and the permutation); full (the whole iteration). A graphed kernel costs
 * graph_launch_us instead of launch_us. */
enum cost_graphs { COST_GRAPHS_NONE = 0, COST_GRAPHS_PARTIAL, COST_GRAPHS_FULL };
extern const char *const cost_graphs_names[];
/* Selective recompute by module, as Megatron names them (--recompute-modules). */
enum cost_rc_module {
    COST_RC_CORE_ATTN = 0, /* the attention kernel: its output is not kept */
    COST_RC_MLA_UP_PROJ,   /* MLA's q and kv up-projections and RoPE: q, k, v not kept */
    COST_RC_LAYERNORM,     /* the two block norms: their outputs not kept */
    COST_RC_MOE_ACT,       /* the routed experts' activation function: its output not kept */
    COST_RC_MLP,           /* a dense block's whole FFN */
    COST_RC_MOE,           /* the whole MoE layer: only its input kept */
    COST_RC_SHARED_EXPERTS,
    COST_RC_NMODULES
};
extern const char *const cost_rc_module_names[COST_RC_NMODULES];
/* Fine-grained activation offloading by module, as Megatron names them (--offload-modules): each
 * module's saved input goes to host memory in the forward and comes back for the backward. */
enum cost_off_module {
    COST_OFF_ATTN_NORM = 0, /* the block's input (the attention norm's) */
    COST_OFF_QKV_LINEAR,    /* the attention norm's output, the q/k/v projection's input */
    COST_OFF_CORE_ATTN,     /* q, k and v after RoPE, the attention kernel's input */
    COST_OFF_ATTN_PROJ,     /* the attention's output, the output projection's input */
    COST_OFF_MLP_NORM,      /* the FFN norm's input */
    COST_OFF_EXPERT_FC1,    /* the routed experts' input rows */
    COST_OFF_MOE_ACT,       /* the experts' first GEMM's output, the activation's input */
    COST_OFF_NMODULES
};
extern const char *const cost_off_module_names[COST_OFF_NMODULES];
#define COST_RC_BIT(m) (1u << (m))
/* What `recompute=selective` means when no modules are named: the attention kernel (Megatron's
 * default), the norms and the experts' activation function: the cheapest to redo. */
#define COST_RC_DEFAULT                                                                            \
    (COST_RC_BIT(COST_RC_CORE_ATTN) | COST_RC_BIT(COST_RC_LAYERNORM) | COST_RC_BIT(COST_RC_MOE_ACT))

/* The sizes a layout may give, the same in the grammar's check, the plan file's reader and the
 * command line's options: a plan the planner writes, every reader takes. */
#define COST_MAX_SEQ (1 << 24)
#define COST_MAX_GBS (1 << 28)
#define COST_MAX_MBS (1 << 20)

#define COST_PP_LAYOUT_MAX 160
/* Room for cost_layout_format's text. */
#define COST_LAYOUT_TEXT_MAX 512

/* Degrees (Megatron's): the GPUs of a job are tp x cp x pp x dp; the expert layers regroup the
 * tp x cp x dp GPUs of a stage as etp x ep x edp. cp splits each sequence over cp GPUs (context
 * parallelism: attention exchanges keys and values around a ring); sequence parallelism always
 * comes with tp > 1 (each TP rank keeps 1/tp of the tokens between its GEMMs, as Megatron
 * requires for MoE with TP). */
struct cost_layout {
    int tp, cp, pp, vpp, ep, etp, dp, zero;
    int seq_len, mbs, gbs;
    enum cost_precision precision;
    enum cost_recompute recompute;
    unsigned recompute_modules; /* selective: COST_RC_BIT of each module (cost_layout_rc) */
    int recompute_layers;       /* full: blocks of each stage recomputed (0: all) */
    enum cost_dispatcher dispatcher;
    bool overlap;     /* EP all-to-all overlapped with compute */
    bool delay_wgrad; /* the experts' weight gradients wait: the backward all-to-all hides behind
                       * them too (with overlap) */
    enum cost_graphs graphs;
    int ep_sms; /* deepep, hybridep: SMs their kernels take while compute overlaps them (0: the
                 * dispatcher's default, COST_DEEPEP_SMS / COST_HYBRIDEP_SMS) */
    int mtp;    /* multi-token prediction layers trained (the CLI's default: the model's) */
    bool grad_reduce_bf16; /* gradients kept and reduced in bf16, not fp32 */
    bool moments_bf16;     /* Adam's moments in bf16 (precision-aware optimizer), not fp32 */
    bool fp8_params;       /* fp8 recipes: the GEMM weights kept and all-gathered in fp8 only
                            * (Megatron's --fp8-param-gather; needs the distributed optimizer) */
    double offload; /* share of the optimizer state (and its step) on the CPU, 0 .. 1 (Megatron's
                     * --optimizer-cpu-offload --optimizer-offload-fraction) */
    unsigned act_offload; /* COST_RC_BIT of each cost_off_module offloaded (0: none) */
    /* Megatron's --pipeline-model-parallel-layout ("Et*4|(t*4|)*14tmL"); "": moeplan splits */
    char pp_layout[COST_PP_LAYOUT_MAX];
};

/* A plain layout: every degree 1, ZeRO-1, mbs 1, gbs 8, bf16, no recompute, the all-to-all, no
 * overlap, the recipe keys at a plain Megatron run's defaults, sequence `seq_len`. */
void cost_layout_defaults(struct cost_layout *l, int seq_len);
/* Expert data parallelism: tp x cp x dp / (ep x etp). */
static inline int cost_layout_edp(const struct cost_layout *l)
{
    return l->tp * l->cp * l->dp / (l->ep * l->etp);
}
/* Tokens of one micro-batch on one GPU between its GEMMs: mbs x seq / (tp x cp). */
static inline double cost_layout_tokens(const struct cost_layout *l)
{
    return (double)l->mbs * l->seq_len / ((double)l->tp * l->cp);
}

/* The modules a layout recomputes (selective with none named: COST_RC_DEFAULT). */
static inline unsigned cost_layout_rc(const struct cost_layout *l)
{
    if (l->recompute != COST_RECOMPUTE_SELECTIVE) return 0;
    return l->recompute_modules ? l->recompute_modules : COST_RC_DEFAULT;
}

/* The module names of `mods` joined by `sep` ("mla_up_proj+moe_act"); "" for none. */
void cost_rc_modules_format(unsigned mods, const char *sep, char *buf, size_t cap);
/* The same for the offloaded modules (cost_off_module). */
void cost_off_modules_format(unsigned mods, const char *sep, char *buf, size_t cap);
/* The layout's recompute as its `recompute=` value: none, selective (Megatron's default modules),
 * full, or the modules joined by '+'. */
void cost_layout_recompute_text(const struct cost_layout *l, char *buf, size_t cap);

/* The keys of the layout grammar. Every place that takes a layout (`predict --layout`, `plan
 * --fix`, `plan --compare`, the published runs) honours each key or refuses it by name; the CLI
 * tests walk this table. */
enum cost_layout_key_id {
    COST_KEY_TP,
    COST_KEY_CP,
    COST_KEY_PP,
    COST_KEY_VPP,
    COST_KEY_EP,
    COST_KEY_ETP,
    COST_KEY_DP,
    COST_KEY_ZERO,
    COST_KEY_MBS,
    COST_KEY_GBS,
    COST_KEY_SEQ, /* also written seq_len */
    COST_KEY_PRECISION,
    COST_KEY_RECOMPUTE,
    COST_KEY_RECOMPUTE_LAYERS,
    COST_KEY_DISPATCHER,
    COST_KEY_OVERLAP,
    COST_KEY_DELAY_WGRAD,
    COST_KEY_CUDA_GRAPHS,
    COST_KEY_EP_SMS,
    COST_KEY_MTP,
    COST_KEY_GRAD_REDUCE,
    COST_KEY_MOMENTS,
    COST_KEY_FP8_PARAMS,
    COST_KEY_OFFLOAD,
    COST_KEY_PP_LAYOUT,
    COST_KEY_ACT_OFFLOAD,
    COST_NKEYS
};
#define COST_KEY_BIT(k) ((uint64_t)1 << (k))
struct cost_layout_key {
    const char *name;
    enum cost_layout_key_id key;
};
/* Every key name the grammar takes, NULL-terminated (two names may share a key). */
extern const struct cost_layout_key cost_layout_keys[];

/* "tp=1,pp=8,vpp=4,ep=64,dp=128,zero=1,mbs=1,gbs=8192,recompute=selective,dispatcher=dedup-gpu".
 * Keys left out keep the values already in `l`. The _keys form also says which keys the text
 * gave (COST_KEY_BIT of each, in *keys). */
enum moe_status cost_layout_parse(struct cost_layout *l, const char *text, struct moe_error *err);
enum moe_status cost_layout_parse_keys(struct cost_layout *l, const char *text, uint64_t *keys,
                                       struct moe_error *err);
void cost_layout_format(const struct cost_layout *l, char *buf, size_t cap);
/* Micro-batches per step: gbs / (dp * mbs). */
int cost_layout_micro_batches(const struct cost_layout *l);
/* What a virtual stage holds: decoder layers first .. first + count - 1, and whether the
 * embedding, the MTP layers or the loss (LM head) are on it. */
struct cost_stage {
    int first, count;
    bool embed, mtp, loss;
};
/* Megatron's pipeline layout string into stages[pp x vpp]: E (embedding), t (a decoder layer),
 * m (an MTP layer), L (the loss), | (next stage), X*N (N times), (...) a group. Every stage
 * listed, the decoder layers in order, E first, the MTP layers and L on the last stage. */
enum moe_status cost_pp_layout_parse(const char *text, int stages, int layers, int mtp,
                                     struct cost_stage *out, struct moe_error *err);
/* Structural validity for this model and GPU count (divisibility, degrees multiply to gpus). A
 * failure is MOE_ERR_INFEASIBLE with the reason. */
enum moe_status cost_layout_check(const struct cost_layout *l, const struct mdl_model *m, int gpus,
                                  struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* COST_LAYOUT_H */
