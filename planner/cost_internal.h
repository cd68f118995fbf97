/*
 * cost_internal.h: what the cost model's own files share (cost.c, the step's time; cost_memory.c,
 * its memory; routing.c, each EP rank's load and the dispatch's copies). Not a public header:
 * nothing outside planner/ includes it.
 */
#ifndef COST_INTERNAL_H
#define COST_INTERNAL_H

#include "cost.h"

#include <string.h>

/* Whether the GPU's fp8 tensor cores have a fast-accumulation mode (Hopper's): Transformer
 * Engine's per-tensor recipe takes it for the forward's GEMMs only, so its gradients' GEMMs run
 * at a rate of their own (gemm_eff_fp8_grad); elsewhere one rate. */
static inline bool cost_fp8_fast_mode(const struct topo_gpu_spec *gpu)
{
    return strcmp(gpu->arch, "hopper") == 0;
}

#define BF16 2.0

/* What a virtual stage holds: its parameters (whole, before TP/EP sharding) and the activation
 * bytes of one micro-batch. Cheap: no timing. */
struct cost_stage_memory {
    double dense_params, expert_params, act_bytes;
    double embed_params; /* of dense_params: the embedding and the head */
    int moe_layers;
};

/* Bytes a GEMM's input costs to keep for its weight gradient: bf16, or the fp8 copy (with its
 * scales) that fp8 recipes keep instead. */
double cost_act_elem_bytes(const struct cost_layout *l);
/* Fill cal->gemm_table_log from its gemm_table (the table's readers and writers call it). */
void cost_gemm_table_logs(struct cost_calibration *cal);
/* The blocks of virtual stage `sg` (its MTP layers included) by kind (n[0]: dense, n[1]: MoE),
 * each split into those that keep their activations ([0]) and those full recompute redoes whole
 * ([1]). */
void cost_stage_blocks(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, int n[2][2]);
/* What virtual stage `sg` holds (activations at the hottest EP rank's load `hot_ratio`). */
void cost_stage_memory(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, double hot_ratio, struct cost_stage_memory *s);
/* The bytes of one micro-batch of the block that act_offload sends to the host and back, on the
 * attention's side (attn_norm .. attn_proj) and on the FFN's (mlp_norm, expert_fc1, moe_act);
 * `full`: the block is recomputed whole. */
void cost_offload_bytes(const struct cost_ctx *c, const struct cost_layout *l, int layer,
                        double hot_ratio, bool full, double *attn_bytes, double *ffn_bytes);
/* Memory of each pp rank from its stages' `sm`; the fullest sets r's memory, fits and reason. */
void cost_memory_of(const struct cost_ctx *c, const struct cost_layout *l,
                    const struct cost_stage_memory *sm, struct cost_result *r);

/* The EP rank that holds expert e (the placement's, else contiguous). */
static inline int cost_expert_rank(const struct cost_ctx *c, int e, int ep)
{
    if (c->placement) return c->placement[e];
    return e / (c->model.moe.experts / ep);
}

/* What one MoE layer's routing does to the EP ranks under a layout (routing.c): the hottest rank's
 * load, and the dispatch's expected copies per source token by link tier. */
struct cost_moe_traffic {
    double hot_ratio;                   /* hottest rank's rows / balanced rows */
    double hot_rows_frac;               /* hottest rank's share of all routed rows (x tokens x k) */
    double nvlink_copies, scale_copies; /* per source token, expected */
    double nodedup_copies;              /* all-to-all copies per source token (any tier) */
    double recv_ratio;                  /* most loaded receiver / average */
    int hot_rank;
};
enum moe_status cost_moe_traffic(const struct cost_ctx *c, const struct cost_layout *l,
                                 int layer_idx, struct cost_moe_traffic *out,
                                 struct moe_error *err);

#endif /* COST_INTERNAL_H */
