/*
 * plan.h: planner/'s public header: choosing a layout. The search enumerates the parallel
 * degrees and costs each layout with the cost model (cost.h, included here); GLPK places the
 * experts of the best one and splits its layers into stages; the plan file records the choice
 * for the executor.
 *
 * The planner is the only module that includes glpk.h. It builds and runs without CUDA.
 */
#ifndef PLAN_H
#define PLAN_H

#include "cost.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GLPK library version this binary runs with ("5.0"). */
const char *plan_glpk_version(void);

/* What a GLPK solve of the planner reports: never "optimal" unless GLPK proved it. */
struct plan_mip_report {
    char status[64]; /* "optimal" (GLPK's proof, or ": meets the lower bound"), "within G% of
                      * optimal", "feasible (time limit)", "infeasible", "no solution", and
                      * for the split, "...: warm start kept" where GLPK gave no split */
    bool optimal;
    double objective;
    double gap; /* relative optimality gap; 0 when optimal */
    double seconds;
    int rows, cols, binaries;
};

/* ---------------------------------------------------------------------------------------------- */
/* Expert placement (GLPK)                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Place experts (and replicas of hot ones) onto EP ranks for one layer group. */
struct plan_placement_problem {
    int experts, ranks;
    int slots_per_rank;    /* experts a rank can hold (memory); > experts / ranks allows
                            * replicas of hot experts */
    const double *pick;    /* experts: P(token picks e) or any load per expert */
    const double *pair;    /* experts x experts co-activation, or NULL */
    int ranks_per_domain;  /* NVLink domains of consecutive ranks (the traffic term) */
    double traffic_weight; /* objective weight of cross-domain co-activation traffic */
    double time_limit_s;
};

/* One copy of an expert: the EP rank holding it and the fraction of the expert's tokens it serves. */
struct plan_copy {
    int rank;
    double share;
};
/* Past this many (expert, rank) cells the placement MILP is not built: the greedy answer stands. */
#define PLAN_MIP_MAX_CELLS (1 << 17)

struct plan_placement {
    int experts, ranks;
    int *first;             /* experts + 1: expert e's copies are copy[first[e] .. first[e+1]) */
    struct plan_copy *copy; /* each expert's copies; their shares add up to 1 */
    double max_load;        /* hottest rank's load (sum of pick x share) */
    double balanced_load;   /* sum of picks / ranks */
    double traffic;         /* cross-domain co-activation of the placement */
    double greedy_max_load, greedy_traffic; /* the greedy answer it started from */
    bool used_mip; /* false: the greedy answer stands (uniform, or MIP no better) */
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
    double even_busiest_us; /* the even split, for comparison */
    struct plan_mip_report mip;
};
/* The split's MILP stops once its split is proven within 1% of the best one (its busiest rank at
 * most 1.01 x a lower bound on every split's): the layer times it balances are predictions, not
 * more precise than that, and closing the last 1% of a deep interleaved pipeline can take GLPK
 * longer than its time limit. */
#define PLAN_SPLIT_GAP 0.01
enum moe_status plan_split_stages(const double *layer_us, int layers, int stages, int pp,
                                  double first_extra_us, double last_extra_us, double time_limit_s,
                                  struct plan_split *out, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* The search and the plan                                                                        */
/* ---------------------------------------------------------------------------------------------- */

#define PLAN_SCHEMA "moeplan.plan"
/* 2: "ranks" is a rule, not a list of every GPU; 3: context parallelism (layout "cp", and the
 * ranks' order counts cp) */
#define PLAN_SCHEMA_VERSION 3
#define PLAN_MAX_GPUS TOPO_MAX_GPUS  /* the largest cluster or plan moeplan takes */
#define PLAN_MAX_PLACEMENT (1 << 26) /* layers x experts of a plan (the executor's table) */
#define PLAN_MAX_ALT 16
#define PLAN_MAX_GROUPS 8
/* The search tries context parallelism only where each CP rank keeps at least this many tokens
 * of a sequence (--fix cp=N overrides): below it, the ring's exchanges cost more than the
 * activations it saves. */
#define PLAN_CP_MIN_TOKENS 8192

enum plan_objective { PLAN_THROUGHPUT = 0, PLAN_COST };

struct plan_request {
    struct mdl_model model;
    struct topo_cluster cluster;
    struct cost_calibration cal;
    const struct cost_routing *routing; /* borrowed; NULL: uniform */
    char model_spec[MOE_PATH_MAX], cluster_spec[MOE_PATH_MAX], routing_spec[MOE_PATH_MAX];
    int gpus, gbs, seq_len;
    enum cost_precision precision;
    struct cost_layout fix; /* -1 in a field: free; else that degree is fixed (plan_fix_none) */
    char fix_text[COST_LAYOUT_TEXT_MAX]; /* the --fix text as given, for messages */
    int max_tp;
    double headroom; /* fraction of HBM kept free */
    enum plan_objective objective;
    int top_k;               /* alternatives kept */
    int replica_slots;       /* extra expert slots per EP rank for replicas of hot experts */
    double mip_time_limit_s; /* per integer program */
    /* NULL: every layout; else only those it accepts (moeplan plan --runnable: what this
     * build's executor runs, in the bytes a GPU offers after the headroom), `why` filled once
     * for the refusal message */
    bool (*accept)(const struct mdl_model *m, const struct cost_layout *l, int gpus,
                   double gpu_bytes, char *why, size_t cap);
    /* only layouts MaxText's mesh can say (moeplan plan --emit maxtext): expert parallelism
     * within data parallelism, not over tensor-parallel ranks as Megatron allows */
    bool maxtext_mesh;
    /* a layout to set beside the plan (moeplan plan --compare: a published recipe's): where it
     * lands among the layouts the search costs, and why the plan beats it or not */
    bool have_compare;
    struct cost_layout compare;
    /* NULL, or a progress bar the search advances by one per tensor-parallel degree of each GPU
     * count it tries (the CLI's: a line every few seconds into a pipe on a long search) */
    struct moe_progress *bar;
};

struct plan_candidate {
    struct cost_layout layout;
    struct cost_result result;
    int gpus;
    double score; /* lower is better: step time, or GPU-hours per 1e12 tokens */
};

struct plan_result {
    struct plan_candidate best;
    struct plan_candidate alt[PLAN_MAX_ALT];
    int nalt;
    long evaluated, memory_rejected, invalid, not_accepted;
    char not_accepted_why[256]; /* the accept filter's reason, for the first one it refused */
    /* Why layouts were refused, for a message when none fits: the commonest reason (by its
     * words, numbers aside) with one example, and one out-of-memory example. */
    struct plan_refusal {
        char key[96];                      /* the reason without its digits */
        char example[256];                 /* one whole reason */
        char layout[COST_LAYOUT_TEXT_MAX]; /* the layout it was given for */
        long count;
    } refusal[8];
    int nrefusal;
    char oom_example[256], oom_layout[COST_LAYOUT_TEXT_MAX];
    double search_s, total_s;
    struct plan_split split;       /* of the best layout */
    struct cost_result even_split; /* the best layout before the split */
    int groups;                    /* expert placement groups (0: ep = 1) */
    struct plan_placement placement[PLAN_MAX_GROUPS];
    struct cost_result contiguous; /* the best layout with contiguous placement */
    struct cost_result no_dedup;   /* the best layout with the plain all-to-all */
    int *primary;                  /* expert -> EP rank of group 0, the cost model's placement */
    char binding[256];             /* why this layout: the constraint that decided */
    struct cost_result compare;    /* the request's compare layout, when it has one */
    double compare_score;
    long compare_beaten_by; /* layouts costed that score better than it */
};
/* The phase whose exposed time grew most from `a` to `b` (*grow_us: by how much). */
int plan_phase_grown(const struct cost_result *a, const struct cost_result *b, double *grow_us);

/* A `fix` that fixes nothing (every degree, mbs, gbs, recompute, dispatcher and mtp -1; the
 * sequence as given); cost_layout_parse then fixes the keys it is given. */
void plan_fix_none(struct cost_layout *fix, int seq_len);
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
    int tp, cp, dp, pp, ep, edp; /* coordinates: the rank's index in each group */
};
/* The rule that numbers the GPUs (plan.json "ranks"): GPU g is the g-th used GPU, domain
 * g / gpus_per_domain; tp varies fastest, then cp, then dp, then pp; inside a stage's
 * tp x cp x dp GPUs the expert layers count etp fastest, then ep, then edp. */
#define PLAN_RANK_ORDER "tp, cp, dp, pp (fastest first); experts: etp, ep, edp within a stage"
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
    double phase_us[COST_NPHASES];                      /* predicted exposed time per phase */
    double memory_bytes[COST_NMEM], memory_total_bytes; /* predicted, the fullest GPU */
    struct plan_rank *rank;                             /* (gpus) */
    /* (layers x experts): the EP rank that serves expert e of MoE layer l; -1 for dense layers;
     * -2 where the plan splits an expert's tokens over replicas */
    int *placement;
    int *stage_layers;    /* (pp x vpp) blocks of each virtual stage, in stage order */
    double buffer_factor; /* dispatch receive buffers x the balanced load */
    /* predicted token payload one GPU sends per MoE layer and micro-batch (dispatch), by tier */
    struct cost_bytes dispatch_bytes;
};
/* Read and check a plan.json (plan_check_doc's rules); errors name file:line:col. Free with
 * plan_file_free (also after a failure). */
enum moe_status plan_load(const char *file, struct plan_file *p, struct moe_error *err);
void plan_file_free(struct plan_file *p);
/* measured.json, what `moeplan run` writes (its keys: executor/README.md): the median phases,
 * the loss curve, the device, and the routing as the planner reads it (cost_routing_load, the
 * reader of `plan --routing measured.json`, for a model of `experts`, top_k; experts 0: none).
 * Step times must be positive and under a day. Free with plan_measured_free (also after a
 * failure). */
struct plan_measured {
    double phase_ms[COST_NPHASES];
    double *loss;                /* [steps]: NaN where a step was skipped (no update) */
    int steps, first_step;       /* steps run, from first_step (1-based; > 1: a resumed run) */
    int counted;                 /* steps in the medians */
    struct cost_routing routing; /* its "routing", as the planner reads it (cost_routing_load) */
    bool have_routing;
    char device[128], model[64];
};
enum moe_status plan_measured_load(const char *file, int experts, int top_k,
                                   struct plan_measured *ms, struct moe_error *err);
void plan_measured_free(struct plan_measured *m);

/* The prediction of one layout as `moeplan predict --json` writes it ("moeplan.prediction"). */
#define PLAN_PREDICTION_SCHEMA "moeplan.prediction"
enum moe_status plan_prediction_save(const char *file, const struct mdl_model *model,
                                     const struct topo_cluster *cluster, int gpus,
                                     const struct cost_calibration *cal,
                                     const struct cost_layout *l, const struct cost_result *r,
                                     struct moe_error *err);
/* The human summary (--explain) and the launcher flags (--emit megatron|maxtext). */
void plan_print_summary(const struct plan_request *req, const struct plan_result *r, FILE *out);
void plan_print_explain(const struct plan_request *req, const struct plan_result *r, FILE *out);
/* Whether MaxText can say the layout (false: why): its expert axis is a part of data
 * parallelism, so ep must divide dp (Megatron's experts may take tensor-parallel ranks too); its
 * pipeline gives every stage the same layers (num_layers_per_pipeline_stage), so pp x vpp must
 * divide the layers and no pp_layout is given. */
bool plan_maxtext_layout_ok(const struct cost_layout *l, const struct mdl_model *m, char *why,
                            size_t cap);
enum moe_status plan_print_emit(const struct plan_request *req, const struct plan_result *r,
                                const char *target, FILE *out, struct moe_error *err);

/* Calibration: the jobs, the measurements and the fits, and published runs (plan_calib.h). */
#include "plan_calib.h"

#ifdef __cplusplus
}
#endif

#endif /* PLAN_H */
