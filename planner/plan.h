/*
 * plan.h: the one public header of planner/: predicting a training step and choosing a layout.
 *
 * The cost model (cost_*) predicts one training step of a model on a cluster for one parallel
 * layout: time per phase, what communication is exposed, the pipeline bubble from an
 * event-driven simulation of the schedule, and memory per GPU. Every efficiency it uses comes from
 * a calibration profile (struct cost_calibration): measured on a machine, or datasheet defaults
 * that the output calls uncalibrated. Evaluating a layout is a pure function of a prepared context
 * and the layout, cheap enough for a search to call hundreds of thousands of times.
 *
 * The planner is the only module that includes glpk.h. It builds and runs without CUDA.
 */
#ifndef PLAN_H
#define PLAN_H

#include "mdl.h"
#include "topo.h"

/* The pipeline the cost model simulates: at most COST_MAX_PP ranks and COST_MAX_STAGES virtual
 * stages (cost_layout_check refuses more). */
#define COST_MAX_PP 64
#define COST_MAX_STAGES 256

#ifdef __cplusplus
extern "C" {
#endif

/* The GLPK library version this binary runs with ("5.0"). */
const char *plan_glpk_version(void);

/* What a GLPK solve of the planner reports: never "optimal" unless GLPK proved it. */
struct plan_mip_report {
    char status[64];     /* "optimal", "feasible (time limit)", "infeasible", "no solution" */
    bool optimal;
    double objective;
    double gap;          /* relative optimality gap; 0 when optimal */
    double seconds;
    int rows, cols, binaries;
};

/* ---------------------------------------------------------------------------------------------- */
/* Expert placement (GLPK)                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Place experts (and replicas of hot ones) onto EP ranks for one layer group. */
struct plan_placement_problem {
    int experts, ranks;
    int slots_per_rank;          /* experts a rank can hold (memory); > experts / ranks allows
                                  * replicas of hot experts */
    const double *pick;          /* experts: P(token picks e) or any load per expert */
    const double *pair;          /* experts x experts co-activation, or NULL */
    int ranks_per_domain;        /* NVLink domains of consecutive ranks (the traffic term) */
    double traffic_weight;       /* objective weight of cross-domain co-activation traffic */
    double time_limit_s;
};

struct plan_placement {
    int experts, ranks;
    double *share;               /* experts x ranks: fraction of e's tokens served by rank g */
    double max_load;             /* hottest rank's load (sum of pick x share) */
    double balanced_load;        /* sum of picks / ranks */
    double traffic;              /* cross-domain co-activation of the placement */
    double greedy_max_load, greedy_traffic; /* the greedy answer it started from */
    bool used_mip;               /* false: the greedy answer stands (uniform, or MIP no better) */
    struct plan_mip_report mip;
};

/* Greedy (EPLB-like: replicate the hottest, then heaviest first onto the least loaded rank),
 * then the MILP warm-started from it; the greedy answer is kept when the MILP does not improve
 * it. Infeasible (more experts than slots): MOE_ERR_INFEASIBLE with the reason. */
enum moe_status plan_place_experts(const struct plan_placement_problem *pr,
                                   struct plan_placement *out, struct moe_error *err);
enum moe_status plan_place_greedy(const struct plan_placement_problem *pr,
                                  struct plan_placement *out, struct moe_error *err);
void plan_placement_free(struct plan_placement *pl);
/* The rank that serves most of expert e's tokens. */
int plan_placement_rank(const struct plan_placement *pl, int e);

/* Split `layers` blocks into `stages` contiguous virtual stages (stage s on pp rank s % pp),
 * minimizing the busiest rank's time: layer_us[i] per block, plus first/last extras. */
struct plan_split {
    int stage_layers[COST_MAX_STAGES];
    double busiest_us;
    double even_busiest_us;      /* the even split, for comparison */
    struct plan_mip_report mip;
};
enum moe_status plan_split_stages(const double *layer_us, int layers, int stages, int pp,
                                  double first_extra_us, double last_extra_us, double time_limit_s,
                                  struct plan_split *out, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Phases: the names predictions and measurements share (DESIGN.md)                               */
/* ---------------------------------------------------------------------------------------------- */

enum cost_phase {
    COST_EMBED = 0, COST_ATTN_FWD, COST_ATTN_BWD, COST_ROUTER, COST_PERMUTE, COST_DISPATCH,
    COST_EXPERTS_FWD, COST_EXPERTS_BWD, COST_COMBINE, COST_UNPERMUTE, COST_SHARED_EXPERT,
    COST_DENSE_FFN, COST_LM_HEAD, COST_LOSS, COST_TP_COMM, COST_DP_GRAD_SYNC, COST_PP_P2P,
    COST_OPTIMIZER, COST_BUBBLE, COST_STEP, COST_NPHASES
};
extern const char *const cost_phase_names[COST_NPHASES];

/* ---------------------------------------------------------------------------------------------- */
/* Calibration                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

#define COST_CALIBRATION_SCHEMA "moeplan.calibration"

/* Every efficiency the cost model uses. Fractions are of the datasheet peak. */
struct cost_calibration {
    bool calibrated;            /* false: datasheet defaults (reference/hardware.md) */
    char source[256];           /* "datasheet defaults" or the profile's GPU, driver and date */
    double gemm_eff;            /* large-GEMM fraction of peak (bf16) */
    double gemm_eff_fp8;        /* the same for fp8 / mxfp8 */
    double gemm_m_half;         /* rows at which a GEMM runs at half its large-M efficiency */
    double gemm_k_half;         /* the same for the reduction dimension */
    double gemm_fixed_us;       /* a GEMM's time beyond its launch at any size (setup, tail) */
    int gemm_tile_m, gemm_tile_n; /* output tile for wave quantization */
    double attn_fwd_eff, attn_bwd_eff; /* flash attention, fraction of bf16 peak */
    double attn_seq_half;       /* sequence at which attention runs at half that (0: none) */
    double hbm_eff;             /* memory-bound kernels, fraction of HBM bandwidth */
    double launch_us;           /* per kernel launch */
    double nvlink_eff;          /* achieved fraction of NVLink bandwidth (all-to-all, p2p) */
    double nvlink_allreduce_eff;/* ring all-reduce bus bandwidth fraction over NVLink */
    double scale_out_eff;       /* achieved fraction of the NIC bandwidth */
    double a2a_latency_us;      /* fixed cost of one dispatch or combine */
    double overlap_max;         /* most of an overlappable communication that hides (0..1) */
    /* What the executor's own kernels add to the analytic time of each compute phase, fitted
     * from calibration steps (`moeplan calibrate`): time = scale x model + fixed_us for every
     * occurrence (a block's phase per micro-batch; embed, lm_head, loss per micro-batch; the
     * optimizer per step). Defaults 1 and 0. */
    double phase_scale[COST_NPHASES], phase_fixed_us[COST_NPHASES];
    /* The executor's expert block (per-expert GEMMs on side streams), fitted from its own
     * benchmark: an expert's forward [0] and backward [1] = scale x the GEMMs' and SwiGLU's
     * size-dependent time + fixed_share x their fixed (launch and setup) time; the streams hide
     * part of the fixed time. Defaults 1 and 1. */
    double expert_scale[2], expert_fixed_share[2];
    double expert_m_half[2];    /* the expert GEMMs' own gemm_m_half (defaults: gemm_m_half) */
};

/* Datasheet defaults for a GPU (fractions others report; see reference/hardware.md). */
void cost_calibration_defaults(struct cost_calibration *cal, const struct topo_gpu_spec *gpu);
/* Load a profile ("moeplan.calibration"); keys it does not name keep the defaults. */
enum moe_status cost_calibration_load(struct cost_calibration *cal, const char *file,
                                      struct moe_error *err);
/* Write a profile (atomically): the calibration's values, and meta's keys (gpu, driver, date,
 * libraries, measured, defaults_used, fit: what `moeplan calibrate` measured and how). */
enum moe_status cost_calibration_write(const struct cost_calibration *cal, json_t *meta,
                                       const char *file, struct moe_error *err);

/* Fitting the calibration to measurements (`moeplan calibrate`; the tests recover known values
 * from synthetic ones). */
struct cost_gemm_sample {
    double m, n, k, us;
};
/* gemm_eff, gemm_m_half, gemm_k_half and gemm_fixed_us that fit the samples best (least squares
 * of the log of predicted over measured time; tiles, launch and HBM efficiency as cal has them).
 * Returns the rms relative error of the fit. */
double cost_fit_gemm(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                     const struct cost_gemm_sample *s, int n);
/* scale > 0 and fixed >= 0 with measured_j ~= scale x model_j + fixed x count_j (least squares
 * on the relative error); returns the rms relative error. */
double cost_fit_linear(const double *model, const double *count, const double *measured, int n,
                       double *scale, double *fixed);
/* Flash attention over `seqs` causal sequences of `seq` tokens, `heads` query heads (kv_heads
 * the keys'), head sizes dqk and dv: its forward and backward, us. */
struct cost_attn_sample {
    double seqs, seq, heads, kv_heads, dqk, dv, fwd_us, bwd_us;
};
/* attn_fwd_eff, attn_bwd_eff and attn_seq_half that fit the samples best (rms of the log of
 * predicted over measured, forward and backward together); returns that rms. */
double cost_fit_attention(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          const struct cost_attn_sample *s, int n);
/* The executor's expert block: `experts` SwiGLU experts, top_k, hidden, ffn, on `tokens` tokens
 * routed uniformly (tokens x top_k / experts rows each); forward and backward, us. */
struct cost_expert_sample {
    double experts, top_k, hidden, ffn, tokens, fwd_us, bwd_us;
};
/* expert_scale, expert_fixed_share and expert_m_half of each direction that fit the samples
 * best (cost_fit_linear for each m_half); rms[d] receives direction d's rms relative error. */
void cost_fit_experts(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                      const struct cost_expert_sample *s, int n, double rms[2]);

/* ---------------------------------------------------------------------------------------------- */
/* Routing                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum cost_routing_kind { COST_ROUTING_UNIFORM = 0, COST_ROUTING_ZIPF, COST_ROUTING_DIRICHLET,
                         COST_ROUTING_MEASURED };

/* Which experts tokens choose: the probability that a token picks expert e (sums to top_k), per
 * MoE layer, and optionally how often pairs are picked together. */
struct cost_routing {
    enum cost_routing_kind kind;
    double param;            /* Zipf exponent or Dirichlet alpha */
    uint64_t seed;
    int experts, top_k, layers; /* layers: MoE layers described (1: one for all) */
    double *pick;            /* layers x experts: P(a token picks e), sum_e = top_k */
    double *pair;            /* layers x experts x experts: P(picks both e and f), or NULL */
};

/* A synthetic routing: uniform, Zipf(s) over experts, or Dirichlet(alpha), seeded. */
enum moe_status cost_routing_synthetic(struct cost_routing *r, enum cost_routing_kind kind,
                                       double param, uint64_t seed, int experts, int top_k,
                                       struct moe_error *err);
/* A measured routing ("moeplan.routing": per-layer expert counts, optional co-activation). */
enum moe_status cost_routing_load(struct cost_routing *r, const char *file, int experts,
                                  int top_k, struct moe_error *err);
/* From explicit token choices: `choice` is tokens x top_k expert ids (exact counts). */
enum moe_status cost_routing_from_choices(struct cost_routing *r, const int *choice, int tokens,
                                          int experts, int top_k, struct moe_error *err);
/* From counts (layers x experts) of (token, expert) pairs, each layer over its own total. */
enum moe_status cost_routing_from_counts(struct cost_routing *r, const int64_t *counts, int layers,
                                         int experts, int top_k, struct moe_error *err);
void cost_routing_free(struct cost_routing *r);

/* Which EP rank holds each expert: placement[e] in [0, ep). NULL in the API means contiguous
 * (expert e on rank e / (experts / ep)). */

/* Dispatch bytes of one token-exchange, counted exactly from explicit choices: tokens on rank
 * src_rank[t] with choice[t*k..] go to the ranks holding those experts. `gpu_domain[r]` names the
 * NVLink domain of EP rank r. Totals over all ranks, for what crosses NVLink and scale-out. */
enum cost_dispatcher { COST_DISPATCH_ALLTOALL = 0, COST_DISPATCH_DEDUP_GPU,
                       COST_DISPATCH_DEDUP_DOMAIN };
extern const char *const cost_dispatcher_names[];
struct cost_bytes {
    double nvlink, scale_out; /* bytes (token payload only) */
};
void cost_dispatch_bytes_exact(const int *choice, const int *src_rank, int tokens, int top_k,
                               const int *placement, const int *gpu_domain,
                               enum cost_dispatcher mode, double bytes_per_token,
                               struct cost_bytes *out);

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
    bool overlap;             /* EP all-to-all overlapped with compute */
};

/* "tp=1,pp=8,vpp=4,ep=64,dp=128,zero=1,mbs=1,gbs=8192,recompute=selective,dispatcher=dedup-gpu".
 * Keys left out keep the values already in `l`. */
enum moe_status cost_layout_parse(struct cost_layout *l, const char *text, struct moe_error *err);
void cost_layout_format(const struct cost_layout *l, char *buf, size_t cap);
/* Micro-batches per step: gbs / (dp * mbs). */
int cost_layout_micro_batches(const struct cost_layout *l);
/* Structural validity for this model and GPU count (divisibility, degrees multiply to gpus). A
 * failure is MOE_ERR_INFEASIBLE with the reason. */
enum moe_status cost_layout_check(const struct cost_layout *l, const struct mdl_model *m,
                                  int gpus, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Pipeline simulation                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* Per (virtual) stage: forward and backward time of one micro-batch, and the p2p time to pass
 * activations to the next stage. Stage index = chunk * pp + rank (Megatron's interleaving). */
struct cost_pipe_result {
    double makespan_us;
    double busy_us[COST_MAX_PP];         /* per pp rank: compute time in the step */
    int max_in_flight[COST_MAX_PP];      /* per pp rank: most micro-batch chunks held for backward */
    double bubble_fraction;     /* of the busiest rank: 1 - busy / makespan */
};
/* Event-driven 1F1B (vpp = 1) or interleaved 1F1B (vpp > 1, micro_batches % pp == 0). */
enum moe_status cost_pipeline_simulate(int pp, int vpp, int micro_batches, const double *fwd_us,
                                       const double *bwd_us, double p2p_us,
                                       struct cost_pipe_result *out, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Evaluation                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

enum cost_mem { COST_MEM_WEIGHTS = 0, COST_MEM_GRADS, COST_MEM_OPTIMIZER, COST_MEM_ACTIVATIONS,
                COST_MEM_DISPATCH, COST_MEM_RESERVED, COST_NMEM };
extern const char *const cost_mem_names[COST_NMEM];

/* Everything the evaluation needs that does not depend on the layout. */
struct cost_ctx {
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_calibration cal;
    const struct cost_routing *routing; /* NULL: uniform */
    const int *placement;               /* NULL: contiguous */
    int gpus;                           /* GPUs the layout uses */
    const int *stage_layers;            /* layers per virtual stage (pp x vpp of them, in stage
                                         * order); NULL: an even split */
    double memory_headroom;             /* fraction of HBM kept free, default 0.05 */
    double dispatch_buffer_factor;      /* receive buffers x the balanced load, default 2.0 */
};

struct cost_result {
    bool fits;
    double compute_us[COST_NPHASES]; /* busiest pp rank, whole step */
    double comm_us[COST_NPHASES];    /* communication time of the phase */
    double exposed_us[COST_NPHASES]; /* what the step pays: compute + exposed communication */
    double step_us;
    double tokens_per_s_per_gpu;
    double model_tflops_per_gpu;
    double mfu;
    double memory_bytes[COST_NMEM];  /* the fullest GPU */
    double memory_total_bytes, memory_capacity_bytes;
    double bubble_fraction;
    double hottest_rank_load;        /* expert rows on the hottest EP rank / balanced rows */
    double dispatch_bytes_per_gpu;   /* per MoE layer per micro-batch, sent */
    double dispatch_bytes_nodedup;   /* the same with no dedup, for comparison */
    double dispatch_scale_out_bytes; /* the part of dispatch_bytes_per_gpu over scale-out */
    int micro_batches;
    char reason[256];                /* why it does not fit, when !fits */
};

/* Prepare a context: copies the model and cluster; routing and placement are borrowed. */
void cost_ctx_init(struct cost_ctx *ctx, const struct mdl_model *m, const struct topo_cluster *c,
                   const struct cost_calibration *cal, int gpus);
/* Predict one step. MOE_ERR_INFEASIBLE (reason in err) when the layout is invalid; a valid
 * layout that does not fit in memory returns MOE_OK with fits = false and the reason. */
enum moe_status cost_evaluate(const struct cost_ctx *ctx, const struct cost_layout *l,
                              struct cost_result *out, struct moe_error *err);
/* The even split: layers per virtual stage, the remainder to the middle stages first. */
void cost_even_split(int layers, int stages, int *counts);
/* What the stage split needs: forward + backward time of one micro-batch of each block (layer),
 * and what the first and last stages add (embedding; LM head and loss), for `l`. */
enum moe_status cost_block_times(const struct cost_ctx *ctx, const struct cost_layout *l,
                                 double *layer_us, double *first_extra_us, double *last_extra_us,
                                 struct moe_error *err);
/* Memory only (the cheap first filter of a search). */
enum moe_status cost_memory(const struct cost_ctx *ctx, const struct cost_layout *l,
                            struct cost_result *out, struct moe_error *err);

/* Time of one GEMM (M x K) @ (K x N) at `tflops` peak under the calibration: roofline with tile
 * and wave quantization and small-M / small-K penalties. */
double cost_gemm_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    double m, double n, double k, bool fp8);
/* One SwiGLU expert on `rows` rows (hidden h, intermediate f), before the expert correction:
 * the size-dependent time var[0] and the fixed time fixed[0] of its forward (up and down GEMMs,
 * SwiGLU), var[1] and fixed[1] of its backward (dgrad and wgrad of both, the wgrad added into
 * fp32 gradients), its GEMMs at expert_m_half. */
void cost_expert_parts(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                       double rows, double h, double f, bool fp8, double var[2], double fixed[2]);
/* The same corrected (expert_scale, expert_fixed_share): us[0] forward, us[1] backward. */
void cost_expert_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    double rows, double h, double f, bool fp8, double us[2]);
/* Core attention (the flash kernels) of `flops` (the model's count) at sequence `seq`:
 * us[0] forward, us[1] backward (2.5 x the FLOPs). */
void cost_attention_core_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                            double flops, double seq, double us[2]);
/* Ring reduce-scatter or all-gather of `bytes` over `n` ranks at `bytes_per_s` bus bandwidth,
 * `latency_us` a hop (an all-reduce is one of each). */
double cost_allgather_us(double bytes, int n, double bytes_per_s, double latency_us);

/* ---------------------------------------------------------------------------------------------- */
/* The search and the plan                                                                        */
/* ---------------------------------------------------------------------------------------------- */

#define PLAN_SCHEMA "moeplan.plan"
#define PLAN_SCHEMA_VERSION 2 /* 2: "ranks" is a rule, not a list of every GPU */
#define PLAN_MAX_GPUS TOPO_MAX_GPUS  /* the largest cluster or plan moeplan takes */
#define PLAN_MAX_PLACEMENT (1 << 26)  /* layers x experts of a plan (the executor's table) */
#define PLAN_MAX_ALT 16
#define PLAN_MAX_GROUPS 8

enum plan_objective { PLAN_THROUGHPUT = 0, PLAN_COST };

struct plan_request {
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_calibration cal;
    const struct cost_routing *routing; /* borrowed; NULL: uniform */
    char model_spec[MOE_PATH_MAX], cluster_spec[MOE_PATH_MAX], routing_spec[MOE_PATH_MAX];
    int gpus, gbs, seq_len;
    enum cost_precision precision;
    struct cost_layout fix;      /* -1 in a field: free; else that degree is fixed */
    int max_tp;
    double headroom;             /* fraction of HBM kept free */
    enum plan_objective objective;
    int top_k;                   /* alternatives kept */
    int replica_slots;           /* extra expert slots per EP rank for replicas of hot experts */
    double mip_time_limit_s;     /* per integer program */
    /* NULL: every layout; else only those it accepts (moeplan plan --runnable: what this
     * build's executor runs), `why` filled once for the refusal message */
    bool (*accept)(const struct cost_layout *l, int gpus, char *why, size_t cap);
};

struct plan_candidate {
    struct cost_layout layout;
    struct cost_result result;
    int gpus;
    double score;                /* lower is better: step time, or GPU-hours per 1e12 tokens */
};

struct plan_result {
    struct plan_candidate best;
    struct plan_candidate alt[PLAN_MAX_ALT];
    int nalt;
    long evaluated, memory_rejected, invalid, not_accepted;
    char not_accepted_why[256];  /* the accept filter's reason, for the first one it refused */
    /* Why layouts were refused, for a message when none fits: the commonest reason (by its
     * words, numbers aside) with one example, and one out-of-memory example. */
    struct plan_refusal {
        char key[96];            /* the reason without its digits */
        char example[256];       /* one whole reason */
        char layout[160];        /* the layout it was given for */
        long count;
    } refusal[8];
    int nrefusal;
    char oom_example[256], oom_layout[160];
    double search_s, total_s;
    struct plan_split split;     /* of the best layout */
    struct cost_result even_split; /* the best layout before the split */
    int groups;                  /* expert placement groups (0: ep = 1) */
    struct plan_placement placement[PLAN_MAX_GROUPS];
    struct cost_result contiguous; /* the best layout with contiguous placement */
    struct cost_result no_dedup;   /* the best layout with the plain all-to-all */
    int *primary;                /* expert -> EP rank of group 0, the cost model's placement */
    char binding[256];           /* why this layout: the constraint that decided */
};

/* Search every valid layout for the request; place experts and split stages for the best. */
enum moe_status plan_search(const struct plan_request *req, struct plan_result *out,
                            struct moe_error *err);
void plan_result_free(struct plan_result *r);
/* Write plan.json (atomically). */
enum moe_status plan_save(const struct plan_request *req, const struct plan_result *r,
                          const char *file, struct moe_error *err);
/* Validate a plan file with every rule plan_load applies (the same function: what `check`
 * accepts, `run` and `report` accept): the layout is valid for the model and the GPUs, every
 * stage and expert placed, memory fits. `summary` gets a line about it. */
enum moe_status plan_check_doc(const struct moe_jdoc *doc, char *summary, size_t cap,
                               struct moe_error *err);
/* A plan as the executor runs it: the model, the layout and the prediction it checks against. */
struct plan_rank {
    int domain, node, local_gpu; /* NVLink domain, node, GPU index on the node */
    int tp, dp, pp, ep, edp;     /* coordinates: the rank's index in each group */
};
/* The rule that numbers the GPUs (plan.json "ranks"): GPU g is the g-th used GPU, domain
 * g / gpus_per_domain; tp varies fastest, then dp, then pp; inside a stage's tp x dp GPUs the
 * expert layers count etp fastest, then ep, then edp. */
#define PLAN_RANK_ORDER "tp, dp, pp (fastest first); experts: etp, ep, edp within a stage"
struct plan_rank_map {
    int gpus_per_domain, nodes_per_domain, gpus_per_node;
};
void plan_rank_of(const struct cost_layout *l, const struct plan_rank_map *map, int g,
                  struct plan_rank *r);
struct plan_file {
    struct plan_rank_map rank_map;
    struct mdl_model model;
    struct cost_layout layout;
    int gpus, micro_batches;
    char gpu[64];
    double step_us, model_tflops_per_gpu, mfu;
    double phase_us[COST_NPHASES]; /* predicted exposed time per phase */
    double memory_bytes[COST_NMEM], memory_total_bytes; /* predicted, the fullest GPU */
    struct plan_rank *rank;        /* (gpus) */
    /* (layers x experts): the EP rank that serves expert e of MoE layer l; -1 for dense layers;
     * -2 where the plan splits an expert's tokens over replicas */
    int *placement;
    int *stage_layers;             /* (pp x vpp) blocks of each virtual stage, in stage order */
    double buffer_factor;          /* dispatch receive buffers x the balanced load */
    /* predicted token payload one GPU sends per MoE layer and micro-batch (dispatch), by tier */
    struct cost_bytes dispatch_bytes;
};
/* Read and check a plan.json (plan_check_doc's rules); errors name file:line:col. Free with
 * plan_file_free (also after a failure). */
enum moe_status plan_load(const char *file, struct plan_file *p, struct moe_error *err);
void plan_file_free(struct plan_file *p);
/* The human summary (--explain) and the launcher flags (--emit megatron|maxtext). */
void plan_print_summary(const struct plan_request *req, const struct plan_result *r, FILE *out);
void plan_print_explain(const struct plan_request *req, const struct plan_result *r, FILE *out);
enum moe_status plan_print_emit(const struct plan_request *req, const struct plan_result *r,
                                const char *target, FILE *out, struct moe_error *err);

#ifdef __cplusplus
}
#endif

#endif /* PLAN_H */
