/*
 * cost_internal.h: what the cost model's own files share (cost.c, the step's time; cost_memory.c,
 * its memory). Not a public header: nothing outside planner/ includes it.
 */
#ifndef COST_INTERNAL_H
#define COST_INTERNAL_H

#include "cost.h"

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
/* What virtual stage `sg` holds (activations at the hottest EP rank's load `hot_ratio`). */
void cost_stage_memory(const struct cost_ctx *c, const struct cost_layout *l,
                       const struct cost_stage *sg, double hot_ratio, struct cost_stage_memory *s);
/* Memory of each pp rank from its stages' `sm`; the fullest sets r's memory, fits and reason. */
void cost_memory_of(const struct cost_ctx *c, const struct cost_layout *l,
                    const struct cost_stage_memory *sm, struct cost_result *r);

#endif /* COST_INTERNAL_H */
