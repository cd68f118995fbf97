/*
 * cost.h: the cost model of planner/: predicting one training step of a model on a cluster for
 * one parallel layout: time per phase, what communication is exposed, the pipeline bubble from an
 * event-driven simulation of the schedule, and memory per GPU. Every efficiency it uses comes from
 * a calibration profile (struct cost_calibration): measured on a machine, or datasheet defaults
 * that the output calls uncalibrated. Evaluating a layout is a pure function of a prepared context
 * and the layout, cheap enough for a search to call hundreds of thousands of times.
 *
 * Its vocabulary (phase names, dispatchers, layouts: cost_layout.h, which it includes; routings)
 * is what the executor and the reports share with the planner. It needs no GLPK; plan.h (the
 * search, placement, the plan file) includes it.
 */
#ifndef COST_H
#define COST_H

#include "cost_layout.h"
#include "topo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Calibration                                                                                    */
/* ---------------------------------------------------------------------------------------------- */

#define COST_CALIBRATION_SCHEMA "moeplan.calibration"
#define COST_MEASURED_SCHEMA "moeplan.measured" /* what `moeplan run` writes (plan.h reads it) */

/* Every efficiency the cost model uses. Fractions are of the datasheet peak. */
#define COST_GEMM_TABLE_MAX 128 /* measured GEMM shapes a profile keeps */
struct cost_calibration {
    bool calibrated;           /* false: datasheet defaults (docs/DESIGN.md) */
    char source[256];          /* "datasheet defaults" or the profile's GPU, driver and date */
    char gpu[64];              /* the GPU a profile is of ("NVIDIA H200", "H100"); "": none */
    double gemm_eff;           /* large-GEMM fraction of peak (bf16) */
    double gemm_eff_fp8;       /* the same for fp8 (per-tensor scaling) / mxfp8 */
    double gemm_eff_fp8_block; /* the same for fp8 with 1x128 / 128x128 block scaling
                                   * (gemm_eff_fp8 where a profile has none) */
    /* per-tensor fp8's gradient GEMMs (data and weight gradients) on Hopper: Transformer
     * Engine's tensorwise recipe, and the executor after it, accumulates them in split fp32 where
     * the forward's accumulate fast, so they run at a rate of their own (gemm_eff_fp8 where a
     * profile has none; Blackwell's tensor cores have no fast mode: gemm_eff_fp8 there) */
    double gemm_eff_fp8_grad;
    double gemm_m_half;           /* rows at which a GEMM runs at half its large-M efficiency */
    double gemm_k_half;           /* the same for the reduction dimension */
    double gemm_fixed_us;         /* a GEMM's time beyond its launch at any size (setup, tail) */
    int gemm_tile_m, gemm_tile_n; /* output tile for wave quantization */
    double attn_fwd_eff, attn_bwd_eff; /* flash attention, fraction of bf16 peak */
    double attn_seq_half;              /* sequence at which attention runs at half that (0: none) */
    /* the softmax in the attention: per score, 4d FLOPs on the tensor cores and attn_exp_scale
     * exponentials on the GPU's exp units (exp_per_s): efficiency x d / (d + half), half =
     * attn_exp_scale x bf16 peak / (4 x exp_per_s); 0: not counted */
    double attn_exp_scale;
    /* attention with learned sinks (gpt-oss's learnable softmax): the kernels' rate with sinks
     * against without, forward and backward (1: free, as the executor's fold after a plain
     * kernel; the stack profiles: cuDNN's graph with sinks as measured, plan_fit_base); and
     * attn_sink_eff, what the stack fits put on both beyond that (fitted, only gpt-oss's rows
     * move it; 1: nothing) */
    double attn_sink_fwd_eff, attn_sink_bwd_eff, attn_sink_eff;
    /* Attention as Transformer Engine runs it, cuDNN's graph both ways, where the executor's
     * differs, as calibrate measured it (cost_fit_te_attention; 0: not measured): sinks inside
     * the graph against the plain graph on the same shapes, forward and backward; a sliding
     * window's forward against causal attention's rate on the window's work; and its backward,
     * which skips no masked tile, against the causal backward's time (t_causal / t_window). The
     * stack profiles take these (plan_fit_base). */
    double attn_sink_cudnn_fwd_eff, attn_sink_cudnn_bwd_eff;
    double attn_window_cudnn_eff, attn_window_bwd_cudnn_eff;
    /* attention whose query-key heads are wider than 128 (MLA's 192): the kernels' efficiency
     * against 128-wide heads (cuDNN's 192-wide tiles on the H200: about 0.85); 1: the same */
    double attn_wide_eff;
    /* sliding-window layers (gpt-oss's 128 keys): the kernels' efficiency on the window's band
     * against causal attention's (tiles the band only partly fills; the executor's backward is
     * ours there, gk_window_backward_ours); 1: the same */
    double attn_window_eff;
    double attn_window_bwd_eff; /* the same for the backward where it differs (a profile before
                                 * it: attn_window_eff's) */
    /* the backward's window kernel does the causal work (cuDNN's: it skips no masked tile): a
     * sliding layer's backward costs the causal one's at attn_window_bwd_eff of its rate */
    bool attn_window_bwd_full;
    double hbm_eff;   /* memory-bound kernels, fraction of HBM bandwidth */
    double launch_us; /* per kernel launch */
    /* Kernels each quantized tensor launches, charged at launch_us, each expert's tensors apart:
     * per-tensor current-scaling fp8 (quant_kernels_fp8) and the one-pass recipes, MXFP8 and
     * blockwise (quant_kernels_block). Transformer Engine's current scaling finds the amax,
     * computes the scale and casts, three kernels, and its GroupedLinear quantizes each expert's
     * split on its own (split_quantize; no grouped current-scaling quantize before mid-2026);
     * MXFP8 and blockwise quantize in one. Stack profiles: 3 and 1. Default 0: none charged (the
     * executor's one-GPU fits hold its own quantize launches, batched over experts). */
    double quant_kernels_fp8, quant_kernels_block;
    double graph_launch_us;      /* the same inside a CUDA graph (cuda_graphs=) */
    double nvlink_eff;           /* achieved fraction of NVLink bandwidth (all-to-all, p2p) */
    double nvlink_allreduce_eff; /* ring all-reduce bus bandwidth fraction over NVLink */
    double scale_out_eff;        /* achieved fraction of the NIC bandwidth */
    double a2a_latency_us;       /* fixed cost of one dispatch or combine */
    double overlap_max;          /* most of an overlappable communication that hides (0..1) */
    /* What the executor's own kernels add to the analytic time of each compute phase, fitted
     * from calibration steps (`moeplan calibrate`): time = scale x model + fixed_us for every
     * occurrence (a block's phase per micro-batch; embed, lm_head, loss per micro-batch; the
     * optimizer per step). Defaults 1 and 0. */
    double phase_scale[COST_NPHASES], phase_fixed_us[COST_NPHASES];
    /* The experts' phases (COST_EXPERTS_FWD, _BWD) of a training step take at least this per
     * local expert an occurrence: the host's time to issue each expert's kernels, which a small
     * expert's GPU time does not cover (fitted from the calibration jobs with the phase's scale:
     * time = max(scale x model, local experts x floor)). Default 0: none. A one-GPU measure of
     * the executor: stack profiles do not take it. */
    double phase_floor_us[COST_NPHASES];
    /* The executor's expert block (per-expert GEMMs on side streams), fitted from its own
     * benchmark: an expert's forward [0] and backward [1] = scale x the GEMMs' and SwiGLU's
     * size-dependent time + fixed_share x their fixed (launch and setup) time; the streams hide
     * part of the fixed time. Defaults 1 and 1. */
    double expert_scale[2], expert_fixed_share[2];
    double expert_m_half[2]; /* the expert GEMMs' own gemm_m_half (defaults: gemm_m_half) */
    /* The bf16 GEMMs `moeplan calibrate` measured (m, n, k, measured time over the roofline's
     * under this calibration), sorted by n, k, then m: cost_gemm_us takes a GEMM's time from
     * the roofline times the ratio interpolated from the nearest measured shapes (0: none, the
     * roofline alone). Ratios, not times, so a stack profile carries its measuring GPU's table to
     * other GPUs by their datasheets' peaks. */
    int gemm_table_n;
    double gemm_table[COST_GEMM_TABLE_MAX][4];
    double gemm_table_log[COST_GEMM_TABLE_MAX][3]; /* log m, n, k of each (cost_gemm_us's, ready) */
};

/* Datasheet defaults for a GPU (fractions others report; docs/DESIGN.md). */
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
/* The measured GEMMs as cal's table (gemm_table): each sample's time over the roofline's under
 * cal's fitted scalars (call after cost_fit_gemm; a change of those scalars clears it). At most
 * COST_GEMM_TABLE_MAX are kept. */
void cost_gemm_table_set(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                         const struct cost_gemm_sample *s, int n);
/* scale > 0 and fixed >= 0 with measured_j ~= scale x model_j + fixed x count_j (least squares
 * on the relative error); returns the rms relative error. */
double cost_fit_linear(const double *model, const double *count, const double *measured, int n,
                       double *scale, double *fixed);
/* scale (0.05 to 20) and floor >= 0 (up to 1000 us a unit of x) with measured_j ~= max(scale x
 * model_j, floor x x_j) (least squares on the relative error, over grids); *edge: the fit lies on a
 * grid's edge. Returns the rms relative error. */
double cost_fit_floor(const double *model, const double *x, const double *measured, int n,
                      double *scale, double *floor, bool *edge);
/* Flash attention over `seqs` causal sequences of `seq` tokens, `heads` query heads (kv_heads
 * the keys'), head sizes dqk and dv: its forward and backward, us. */
struct cost_attn_sample {
    double seqs, seq, heads, kv_heads, dqk, dv, window, fwd_us, bwd_us; /* window 0: causal */
};
/* attn_fwd_eff, attn_bwd_eff, attn_seq_half, attn_wide_eff, attn_window_eff and (where heads
 * narrower than 128 were measured) attn_exp_scale that fit the samples best (rms of the log of
 * predicted over measured, forward and backward together); returns that rms. */
double cost_fit_attention(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          const struct cost_attn_sample *s, int n);
/* Transformer Engine's attention from cuDNN's graph on the same shapes without (plain) and with
 * sinks: attn_sink_cudnn_fwd_eff and _bwd_eff, the plain time over the time with sinks, each
 * direction; attn_window_cudnn_eff, a windowed plain sample's forward rate on the window's work
 * against the causal plain sample of the same sequences and heads, and attn_window_bwd_cudnn_eff,
 * the causal backward's time over the windowed one's (geometric means; 0 without such a pair).
 * Each within (1e-3, 1]. */
void cost_fit_te_attention(struct cost_calibration *cal, const struct cost_attn_sample *plain,
                           const struct cost_attn_sample *sinks, int n);
/* The executor's expert block: `experts` SwiGLU experts, top_k, hidden, ffn, on `tokens` tokens
 * routed uniformly (tokens x top_k / experts rows each); forward and backward, us. */
struct cost_expert_sample {
    double experts, top_k, hidden, ffn, tokens, fwd_us, bwd_us;
};
/* expert_scale, expert_fixed_share and expert_m_half of each direction that fit the samples
 * best (cost_fit_linear for each m_half); rms[d] receives direction d's rms relative error. */
void cost_fit_experts(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                      const struct cost_expert_sample *s, int n, double rms[2]);
/* The fp8 GEMM rate of recipe prec (gemm_eff_fp8 for COST_FP8, gemm_eff_fp8_block for
 * COST_FP8_BLOCK) that fits expert blocks measured in that recipe best, the expert correction
 * (cost_fit_experts, on bf16 blocks) kept: each block's model is its experts' cost_expert_us
 * (their quantization included). COST_FP8 fits its forward's rate on the forward times and
 * gemm_eff_fp8_grad on the backward's; COST_FP8_BLOCK one rate on both. Returns the rms relative
 * error over forward and backward; the rates stay where there are no samples. */
double cost_fit_fp8(struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    enum cost_precision prec, const struct cost_expert_sample *s, int n);
/* A sample's model under cal in recipe prec: us[0] forward, us[1] backward. */
void cost_expert_block_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                          enum cost_precision prec, const struct cost_expert_sample *s,
                          double us[2]);

/* ---------------------------------------------------------------------------------------------- */
/* Routing                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

enum cost_routing_kind {
    COST_ROUTING_UNIFORM = 0,
    COST_ROUTING_ZIPF,
    COST_ROUTING_DIRICHLET,
    COST_ROUTING_MEASURED
};

/* Which experts tokens choose: the probability that a token picks expert e (sums to top_k), per
 * MoE layer, and optionally how often pairs are picked together. */
struct cost_routing {
    enum cost_routing_kind kind;
    double param; /* Zipf exponent or Dirichlet alpha */
    uint64_t seed;
    int experts, top_k, layers; /* layers: MoE layers described (1: one for all) */
    double *pick;               /* layers x experts: P(a token picks e), sum_e = top_k */
    double *pair;               /* layers x experts x experts: P(picks both e and f), or NULL */
};

/* A synthetic routing: uniform, Zipf(s) over experts, or Dirichlet(alpha), seeded. */
enum moe_status cost_routing_synthetic(struct cost_routing *r, enum cost_routing_kind kind,
                                       double param, uint64_t seed, int experts, int top_k,
                                       struct moe_error *err);
/* A measured routing ("moeplan.routing": per-layer expert counts, optional co-activation). */
enum moe_status cost_routing_load(struct cost_routing *r, const char *file, int experts, int top_k,
                                  struct moe_error *err);
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
void cost_dispatch_bytes_exact(const int *choice, const int *src_rank, int tokens, int top_k,
                               const int *placement, const int *gpu_domain,
                               enum cost_dispatcher mode, double bytes_per_token,
                               struct cost_bytes *out);

/* ---------------------------------------------------------------------------------------------- */
/* Pipeline simulation                                                                            */
/* ---------------------------------------------------------------------------------------------- */

/* Per (virtual) stage: forward and backward time of one micro-batch, and the p2p time to pass
 * activations to the next stage. Stage index = chunk * pp + rank (Megatron's interleaving). */
struct cost_pipe_result {
    double makespan_us;
    double busy_us[COST_MAX_PP];    /* per pp rank: compute time in the step */
    int max_in_flight[COST_MAX_PP]; /* per pp rank: most micro-batch chunks held for backward */
    double bubble_fraction;         /* of the busiest rank: 1 - busy / makespan */
};
/* Event-driven 1F1B (vpp = 1) or interleaved 1F1B (vpp > 1, micro_batches % pp == 0). */
enum moe_status cost_pipeline_simulate(int pp, int vpp, int micro_batches, const double *fwd_us,
                                       const double *bwd_us, double p2p_us,
                                       struct cost_pipe_result *out, struct moe_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Evaluation                                                                                     */
/* ---------------------------------------------------------------------------------------------- */

enum cost_mem {
    COST_MEM_WEIGHTS = 0,
    COST_MEM_GRADS,
    COST_MEM_OPTIMIZER,
    COST_MEM_ACTIVATIONS,
    COST_MEM_DISPATCH,
    COST_MEM_RESERVED,
    COST_NMEM
};
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
    /* NULL, or where a search keeps each MoE layer's routing traffic by (ep, etp, dispatch
     * mode, routing layer) while the model, cluster and routing stay: a layout's traffic costs
     * O(experts), and a search costs thousands of layouts of a few EP degrees. Used only with
     * contiguous placement. cost_traffic_memo_create / _destroy. */
    struct cost_traffic_memo *memo;
};
/* Whether a profile's GPU (its "gpu": a device name "NVIDIA H100 80GB HBM3" or a spec name
 * "GB300") is the GPU `spec_name` names: every word of the spec's name is one of its words, case
 * aside ("GB200" is not "B200"), and a PCIe or NVL card only where the spec's name says so
 * ("NVIDIA H100 PCIe" is not the SXM part "H100"; it is "H100 PCIe"). A profile without a GPU
 * matches every one. */
bool cost_calibration_gpu_is(const char *profile_gpu, const char *spec_name);
struct cost_traffic_memo *cost_traffic_memo_create(void);
void cost_traffic_memo_destroy(struct cost_traffic_memo *m);

struct cost_result {
    bool fits;
    double compute_us[COST_NPHASES]; /* busiest pp rank, whole step */
    double comm_us[COST_NPHASES];    /* communication time of the phase */
    double exposed_us[COST_NPHASES]; /* what the step pays: compute + exposed communication */
    double step_us;
    double tokens_per_s_per_gpu;
    double model_tflops_per_gpu;
    double megatron_tflops_per_gpu; /* the same with Megatron-Bridge's count (mdl_flops_megatron) */
    double mfu;
    double memory_bytes[COST_NMEM]; /* the fullest GPU */
    double memory_total_bytes, memory_capacity_bytes;
    double bubble_fraction;
    double hottest_rank_load;        /* expert rows on the hottest EP rank / balanced rows */
    double dispatch_bytes_per_gpu;   /* per MoE layer per micro-batch, sent */
    double dispatch_bytes_nodedup;   /* the same with no dedup, for comparison */
    double dispatch_scale_out_bytes; /* the part of dispatch_bytes_per_gpu over scale-out */
    int micro_batches;
    char reason[256]; /* why it does not fit, when !fits */
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

/* Time of one GEMM (M x K) @ (K x N) at the GPU's peak under the calibration: roofline with tile
 * and wave quantization and small-M / small-K penalties. */
double cost_gemm_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu, double m,
                    double n, double k, enum cost_precision prec);
/* The same GEMM's shape as a gradient GEMM of the backward: per-tensor fp8 on Hopper at
 * gemm_eff_fp8_grad; otherwise cost_gemm_us. */
double cost_gemm_grad_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                         double m, double n, double k, enum cost_precision prec);
/* Bytes of an activation element kept or sent in the precision: 2 (bf16), 1 (fp8), with its
 * share of the scales for the block-scaled ones. */
double cost_precision_elem_bytes(enum cost_precision prec);
/* fp8 recipes quantize every GEMM input in the forward and every output gradient in the
 * backward: `elems` bf16 values read (twice with per-tensor current scaling: their amax first),
 * their fp8 copy and, for the weight gradient, a transposed one written with their scales.
 * Its bytes at HBM speed, and `tensors` quantized tensors' kernels (the calibration's
 * quant_kernels_fp8 or _block each, at launch_us: Transformer Engine's in stack profiles, none in
 * the executor's). 0 in bf16. */
double cost_quantize_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                        enum cost_precision prec, double elems, int tensors);
/* One SwiGLU expert on `rows` rows (hidden h, intermediate f), before the expert correction:
 * the size-dependent time var[0] and the fixed time fixed[0] of its forward (up and down GEMMs,
 * SwiGLU), var[1] and fixed[1] of its backward (dgrad and wgrad of both, the wgrad added into
 * fp32 gradients), its GEMMs at expert_m_half. */
void cost_expert_parts(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                       double rows, double h, double f, enum cost_precision prec, double var[2],
                       double fixed[2]);
/* The same corrected (expert_scale, expert_fixed_share), with fp8's quantization of its GEMM
 * inputs and output gradients (cost_quantize_us): us[0] forward, us[1] backward. */
void cost_expert_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                    double rows, double h, double f, enum cost_precision prec, double us[2]);
/* Core attention (the flash kernels) of `flops` (the model's count) at sequence `seq`, head size
 * `d` (the mean of the query-key and value sizes) and query-key head size dqk (attn_wide_eff
 * above 128): us[0] forward, us[1] backward (2.5 x the FLOPs). */
void cost_attention_core_us(const struct cost_calibration *cal, const struct topo_gpu_spec *gpu,
                            double flops, double seq, double d, double dqk, double us[2]);
/* Ring reduce-scatter or all-gather of `bytes` over `n` ranks at `bytes_per_s` bus bandwidth,
 * `latency_us` a hop (an all-reduce is one of each). */
double cost_allgather_us(double bytes, int n, double bytes_per_s, double latency_us);

#ifdef __cplusplus
}
#endif

#endif /* COST_H */
