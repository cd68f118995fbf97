/*
 * output.c: what `moeplan plan` prints: the summary, the explanation (--explain), and the launch
 * flags of the chosen layout for Megatron-LM and MaxText (--emit), so a user can run the plan on
 * the stack they already have.
 */
#include "plan.h"

#include <math.h>
#include <string.h>

static void fmt_layout(const struct cost_layout *l, char *buf, size_t cap)
{
    char cp[16] = "", rc[160];
    if (l->cp > 1) snprintf(cp, sizeof cp, " cp=%d", l->cp);
    cost_layout_recompute_text(l, rc, sizeof rc);
    snprintf(buf, cap,
             "tp=%d%s pp=%d vpp=%d ep=%d etp=%d dp=%d zero=%d mbs=%d recompute=%s dispatcher=%s",
             l->tp, cp, l->pp, l->vpp, l->ep, l->etp, l->dp, l->zero, l->mbs, rc,
             cost_dispatcher_names[l->dispatcher]);
}

static void fmt_split(const struct plan_result *r, char *buf, size_t cap)
{
    int S = r->best.layout.pp * r->best.layout.vpp;
    size_t n = 0;
    buf[0] = '\0';
    for (int s = 0; s < S && n + 8 < cap; s++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", s ? "," : "[", r->split.stage_layers[s]);
    if (n + 2 < cap) snprintf(buf + n, cap - n, "]");
}

void plan_print_summary(const struct plan_request *q, const struct plan_result *r, FILE *out)
{
    const struct cost_result *res = &r->best.result;
    char lay[COST_LAYOUT_TEXT_MAX], split[1024], a[32], b[32];
    fmt_layout(&r->best.layout, lay, sizeof lay);
    fmt_split(r, split, sizeof split);
    fprintf(out, "plan: %s on %d x %s (%s), gbs %d x seq %d, %s\n", q->model.name, r->best.gpus,
            q->cluster.gpu.name, q->cluster.name, r->best.layout.gbs, r->best.layout.seq_len,
            cost_precision_names[r->best.layout.precision]);
    fprintf(out, "layout: %s, overlap %s\n", lay, r->best.layout.overlap ? "on" : "off");
    moe_format_bytes(res->memory_total_bytes, a, sizeof a);
    moe_format_bytes(res->memory_capacity_bytes, b, sizeof b);
    fprintf(out,
            "predicted: step %.3f s, %.0f tokens/s/GPU, %.0f model TFLOPS/GPU, MFU %.1f%%, "
            "bubble %.1f%%; memory %s of %s per GPU\n",
            res->step_us / 1e6, res->tokens_per_s_per_gpu, res->model_tflops_per_gpu,
            100 * res->mfu, 100 * res->bubble_fraction, a, b);
    fprintf(out, "stages: layers per virtual stage %s (%s)\n", split, r->split.mip.status);
    if (r->groups)
        fprintf(out,
                "experts: %d placement group%s on %d EP ranks, hottest rank %.2fx balanced (%s)\n",
                r->groups, r->groups == 1 ? "" : "s", r->best.layout.ep,
                r->placement[0].balanced_load > 0
                    ? r->placement[0].max_load / r->placement[0].balanced_load
                    : 1,
                r->placement[0].mip.status);
    fprintf(out,
            "search: %ld layouts tried in %.2f s (%.2f s with placement and split): %ld fit and "
            "were costed, %ld did not fit in memory, %ld are not valid for this model and "
            "cluster; calibration: %s\n",
            r->evaluated + r->memory_rejected + r->invalid, r->search_s, r->total_s, r->evaluated,
            r->memory_rejected, r->invalid, q->cal.source);
    if (r->nalt) {
        fprintf(out, "\n%-4s %-88s %10s %8s\n", "#", "alternative", "step", "vs plan");
        for (int i = 0; i < r->nalt; i++) {
            fmt_layout(&r->alt[i].layout, lay, sizeof lay);
            fprintf(out, "%-4d %-88s %8.3f s %+7.1f%%\n", i + 2, lay,
                    r->alt[i].result.step_us / 1e6,
                    100.0 * (r->alt[i].score / r->best.score - 1.0));
        }
    }
}

/* "step 1.234 s, 5.0% faster than WHAT (1.299 s)", or "the same step time as WHAT (1.234 s)"
 * when the two agree to printing precision. */
static const char *compare_steps(double us, double other_us, const char *what, char *buf,
                                 size_t cap)
{
    double rel = other_us > 0 ? us / other_us - 1.0 : 0.0;
    if (fabs(rel) < 5e-4)
        snprintf(buf, cap, "the same step time as %s (%.3f s)", what, us / 1e6);
    else
        snprintf(buf, cap, "step %.3f s, %.1f%% %s than %s (%.3f s)", us / 1e6, 100 * fabs(rel),
                 rel < 0 ? "faster" : "slower", what, other_us / 1e6);
    return buf;
}

int plan_phase_grown(const struct cost_result *a, const struct cost_result *b, double *grow_us)
{
    int worst = 0;
    double grow = -HUGE_VAL;
    for (int p = 0; p < COST_STEP; p++) {
        double d = b->exposed_us[p] - a->exposed_us[p];
        if (d > grow) grow = d, worst = p;
    }
    *grow_us = grow;
    return worst;
}

void plan_print_explain(const struct plan_request *q, const struct plan_result *r, FILE *out)
{
    char gap_buf[256];
    const struct cost_result *res = &r->best.result;
    const struct cost_layout *l = &r->best.layout;
    char lay[COST_LAYOUT_TEXT_MAX], a[32], b[32];
    fprintf(out, "\nwhy this layout:\n");
    fprintf(out, "  binding constraint: %s\n", r->binding);
    int top = 0;
    for (int p = 0; p < COST_STEP; p++)
        if (res->exposed_us[p] > res->exposed_us[top]) top = p;
    fprintf(
        out,
        "  the step's largest part is %s (%.1f%%); exposed communication %.1f%%, bubble %.1f%%\n",
        cost_phase_names[top], 100 * res->exposed_us[top] / res->step_us,
        100 *
            (res->exposed_us[COST_DISPATCH] + res->exposed_us[COST_COMBINE] +
             res->exposed_us[COST_TP_COMM] + res->exposed_us[COST_DP_GRAD_SYNC]) /
            res->step_us,
        100 * res->bubble_fraction);
    if (r->nalt) {
        const struct plan_candidate *c = &r->alt[0];
        double grow;
        int worst = plan_phase_grown(res, &c->result, &grow);
        fmt_layout(&c->layout, lay, sizeof lay);
        fprintf(out, "  runner-up: %s\n    %+.1f%% slower: its %s takes %+.1f ms more per step\n",
                lay, 100.0 * (c->score / r->best.score - 1.0), cost_phase_names[worst], grow / 1e3);
    }
    if (q->have_compare) { /* the layout given with --compare, against the plan */
        const struct cost_result *c = &r->compare;
        double gain = r->compare_score / r->best.score - 1.0, grow;
        int worst = gain >= 0 ? plan_phase_grown(res, c, &grow) : plan_phase_grown(c, res, &grow);
        fmt_layout(&q->compare, lay, sizeof lay);
        fprintf(out,
                "  the layout compared: %s\n    step %.3f s%s; %ld of the %ld layouts costed "
                "score better\n",
                lay, c->step_us / 1e6, c->fits ? "" : " (does not fit)", r->compare_beaten_by,
                r->evaluated);
        char whole[COST_LAYOUT_TEXT_MAX]; /* every key it gives, as --layout takes them */
        cost_layout_format(&q->compare, whole, sizeof whole);
        fprintf(out, "    as --layout: %s\n", whole);
        if (fabs(gain) < 1e-9)
            fprintf(out, "    the plan's step: the planner picks this layout\n");
        else if (gain > 0)
            fprintf(out, "    %.1f%% slower than the plan: its %s takes %+.1f ms more per step\n",
                    100.0 * gain, cost_phase_names[worst], grow / 1e3);
        else
            fprintf(out,
                    "    it beats the plan by %.1f%% (its %s takes %.1f ms less): the "
                    "search does not try what sets it apart\n",
                    -100.0 * gain, cost_phase_names[worst], grow / 1e3);
    }
    if (l->ep > 1 && l->dispatcher == COST_DISPATCH_ALLTOALL) {
        fprintf(out,
                "  dedup: none chosen: per-GPU dedup would send the same bytes here (each "
                "token's experts sit on distinct GPUs), so the plan keeps the plain all-to-all\n");
    }
    if (l->ep > 1 && l->dispatcher != COST_DISPATCH_ALLTOALL) {
        char c[32], d[32];
        moe_format_bytes(res->dispatch_bytes_per_gpu, a, sizeof a);
        moe_format_bytes(r->no_dedup.dispatch_bytes_per_gpu, b, sizeof b);
        moe_format_bytes(res->dispatch_scale_out_bytes, c, sizeof c);
        moe_format_bytes(r->no_dedup.dispatch_scale_out_bytes, d, sizeof d);
        double total = res->dispatch_bytes_per_gpu, plain = r->no_dedup.dispatch_bytes_per_gpu;
        fprintf(out,
                "  what dedup bought (%s): per GPU, MoE layer and micro-batch the dispatch "
                "sends %s (%s of it over scale-out); the plain all-to-all sends %s (%s over "
                "scale-out)%s; %s\n",
                cost_dispatcher_names[l->dispatcher], a, c, b, d,
                total > plain ? ": more bytes in all, fewer of them over the slower scale-out" : "",
                compare_steps(res->step_us, r->no_dedup.step_us, "the plain all-to-all", gap_buf,
                              sizeof gap_buf));
    }
    if (l->ep > 1) {
        const struct plan_placement *pl = &r->placement[0];
        char gap[32];
        if (pl->mip.optimal)
            snprintf(gap, sizeof gap, "0");
        else if (isfinite(pl->mip.gap))
            snprintf(gap, sizeof gap, "%.2f%%", 100 * pl->mip.gap);
        else
            snprintf(gap, sizeof gap, "not known");
        fprintf(out,
                "  what placement bought: hottest EP rank %.3fx balanced (greedy %.3fx; MILP "
                "%s, gap %s%s); %s\n",
                pl->max_load / pl->balanced_load, pl->greedy_max_load / pl->balanced_load,
                pl->mip.status, gap, pl->used_mip ? ", its answer used" : ", greedy kept",
                compare_steps(res->step_us, r->contiguous.step_us, "contiguous experts", gap_buf,
                              sizeof gap_buf));
    } else {
        fprintf(out, "  no expert parallelism: every GPU holds every expert (ep = 1)\n");
    }
    if (l->pp_layout[0])
        fprintf(out, "  stage split: the pipeline layout given, %s\n", l->pp_layout);
    else if (l->pp * l->vpp > 1 &&
             fabs(r->split.busiest_us - r->split.even_busiest_us) < 5e-4 * r->split.even_busiest_us)
        fprintf(out,
                "  what the stage split bought: nothing; the even split is as good (busiest "
                "pipeline rank %.1f ms per micro-batch)\n",
                r->split.busiest_us / 1e3);
    else if (l->pp * l->vpp > 1)
        fprintf(out,
                "  what the stage split bought: busiest pipeline rank %.1f ms per micro-batch, "
                "%.1f ms with an even split; %s\n",
                r->split.busiest_us / 1e3, r->split.even_busiest_us / 1e3,
                compare_steps(res->step_us, r->even_split.step_us, "the even split", gap_buf,
                              sizeof gap_buf));
    fprintf(out, "  predictions use %s\n", q->cal.source);
}

/* Megatron's --pipeline-model-parallel-layout: the plan's own string, or its split written as
 * one: E embedding, t a block, m an MTP layer, L loss, | between stages (stage s on pp rank
 * s % pp, as ours). The number of stages sets the virtual pipeline degree, so no VPP flag. */
static void megatron_layout(const struct plan_result *r, char *buf, size_t cap)
{
    const struct cost_layout *l = &r->best.layout;
    if (l->pp_layout[0]) {
        snprintf(buf, cap, "%s", l->pp_layout);
        return;
    }
    int S = l->pp * l->vpp;
    size_t n = 0;
    for (int s = 0; s < S && n + 40 < cap; s++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", s ? "|" : "", s == 0 ? "E" : "");
        int k = r->split.stage_layers[s];
        if (k == 1)
            n += (size_t)snprintf(buf + n, cap - n, "t");
        else if (k > 1)
            n += (size_t)snprintf(buf + n, cap - n, "t*%d", k);
        if (s == S - 1) {
            for (int i = 0; i < l->mtp; i++) n += (size_t)snprintf(buf + n, cap - n, "m");
            n += (size_t)snprintf(buf + n, cap - n, "L");
        }
    }
}

/* What of the model Megatron-LM's flags cannot say at this sequence length, as comment lines
 * (none: nothing printed). Megatron-Bridge's own Llama 4 provider has the first three. */
static void megatron_model_gaps(const struct mdl_model *m, int seq_len, FILE *out)
{
    const struct mdl_attention *a = &m->attn;
    const char *gap[4];
    char chunk[160], temp[160];
    int n = 0;
    if (a->chunk_size && seq_len > a->chunk_size && a->nope_every != 1) { /* RoPE blocks */
        snprintf(chunk, sizeof chunk,
                 "chunked attention (%d-token chunks on the RoPE blocks): Megatron-LM attends "
                 "over the whole %d tokens",
                 a->chunk_size, seq_len);
        gap[n++] = chunk;
    }
    if (a->temp_floor > 0 && seq_len >= a->temp_floor) {
        snprintf(temp, sizeof temp,
                 "the NoPE blocks' query temperature (from position %.0f on): Megatron-LM has none",
                 a->temp_floor - 1);
        gap[n++] = temp;
    }
    if (a->qk_l2_norm && a->nope_every >= 1 && m->layers >= a->nope_every)
        gap[n++] = "q and k normalized on the RoPE blocks only: Megatron-LM's --qk-l2-norm "
                   "normalizes them on every block";
    if (!n) return;
    fprintf(out, "# not expressible in Megatron-LM's flags, so they train a different %s:\n",
            m->name);
    for (int i = 0; i < n; i++) fprintf(out, "#   - %s\n", gap[i]);
}

/* The model's architecture as Megatron-LM's flags (pretrain_gpt.py, Megatron-Core models): what
 * `--emit megatron` needs besides the layout for a complete command line. */
static void megatron_model_flags(const struct mdl_model *m, FILE *out)
{
    const struct mdl_attention *a = &m->attn;
    const struct mdl_moe *e = &m->moe;
    fprintf(out, "--num-layers %d \\\n--hidden-size %d \\\n--num-attention-heads %d \\\n",
            m->layers, m->hidden, a->heads);
    fprintf(out, "--ffn-hidden-size %d \\\n",
            m->dense_intermediate ? m->dense_intermediate : e->intermediate);
    fprintf(out, "--max-position-embeddings %d \\\n--position-embedding-type %s \\\n",
            m->max_seq_len, a->rope_scaling == MDL_ROPE_YARN ? "yarn" : "rope");
    fprintf(out, "--rotary-base %.0f \\\n", a->rope_theta);
    if (a->rope_scaling == MDL_ROPE_YARN) { /* Megatron's concentration 0.1 mscale ln(f) + 1 */
        double lnf = log(a->yarn.factor), mscale = (a->yarn.attention_factor - 1.0) / (0.1 * lnf);
        if (lnf > 0 && fabs(mscale - 1.0) > 1e-9) fprintf(out, "--mscale %.17g \\\n", mscale);
        fprintf(out,
                "--rotary-scaling-factor %g \\\n--yarn-original-max-position-embeddings %d "
                "\\\n--yarn-beta-fast %g \\\n--yarn-beta-slow %g \\\n%s",
                a->yarn.factor, a->yarn.original_max, a->yarn.beta_fast, a->yarn.beta_slow,
                a->yarn.truncate ? "--yarn-correction-range-round-to-int \\\n"
                                 : "--no-yarn-correction-range-round-to-int \\\n");
    }
    if (a->nope_every >= 1 && m->layers >= a->nope_every) { /* each nope_every-th: no RoPE */
        if (m->layers % a->nope_every == 0) {
            fprintf(out, "--no-rope-freq %d \\\n", a->nope_every);
        } else {
            fprintf(out, "--no-rope-freq \"([0]*%d+[1])*%d+[0]*%d\" \\\n", a->nope_every - 1,
                    m->layers / a->nope_every, m->layers % a->nope_every);
        }
    }
    if (a->qk_l2_norm) fprintf(out, "--qk-l2-norm \\\n");
    fprintf(out, "--normalization RMSNorm \\\n--norm-epsilon %g \\\n", m->norm_eps);
    if (e->activation == MDL_ACT_CLAMPED_SWIGLU) /* (u' + 1) g' sigmoid(1.702 g'), clamped */
        fprintf(out,
                "--quick-geglu \\\n--glu-linear-offset 1.0 \\\n--activation-func-clamp-value "
                "%g \\\n",
                e->swiglu_limit);
    else
        fprintf(out, "--swiglu \\\n");
    if (!m->tied_embeddings) fprintf(out, "--untie-embeddings-and-output-weights \\\n");
    fprintf(out, "--tokenizer-type NullTokenizer \\\n--vocab-size %d \\\n", m->vocab);
    /* gpt-oss: every projection has its bias, Megatron-LM's default (it has no flag that turns
     * them on: `--add-bias-linear` is refused by its parser, only `--disable-bias-linear` exists) */
    if (!(a->bias && e->expert_bias))
        fprintf(out, "--disable-bias-linear \\\n%s", a->bias ? "--add-qkv-bias \\\n" : "");
    if (a->type == MDL_ATTN_GQA) {
        if (a->kv_heads != a->heads)
            fprintf(out, "--group-query-attention \\\n--num-query-groups %d \\\n", a->kv_heads);
        fprintf(out, "--kv-channels %d \\\n", a->head_dim);
    } else {
        fprintf(out, "--multi-latent-attention \\\n");
        if (a->q_lora_rank) fprintf(out, "--q-lora-rank %d \\\n", a->q_lora_rank);
        fprintf(out,
                "--kv-lora-rank %d \\\n--qk-head-dim %d \\\n--qk-pos-emb-head-dim %d \\\n"
                "--v-head-dim %d \\\n",
                a->kv_lora_rank, a->qk_nope_head_dim, a->qk_rope_head_dim, a->v_head_dim);
    }
    if (a->qk_norm) fprintf(out, "--qk-layernorm \\\n");
    if (a->sinks) fprintf(out, "--softmax-type learnable \\\n");
    if (a->sliding_window) /* sliding on every layer but each sliding_every-th */
        fprintf(out, "--window-size \"(%d,0)\" \\\n--window-attn-skip-freq %d \\\n",
                a->sliding_window, a->sliding_every);
    fprintf(out, "--moe-ffn-hidden-size %d \\\n", e->intermediate);
    if (e->shared_experts)
        fprintf(out, "--moe-shared-expert-intermediate-size %d \\\n",
                e->shared_experts * e->shared_intermediate);
    if (m->first_dense || m->moe_every > 1) { /* 0: dense block, 1: MoE block */
        fprintf(out, "--moe-layer-freq \"[");
        for (int i = 0; i < m->layers; i++)
            fprintf(out, "%s%d", i ? "," : "", mdl_layer_is_moe(m, i) ? 1 : 0);
        fprintf(out, "]\" \\\n");
    }
    fprintf(out, "--moe-router-score-function %s \\\n",
            e->scoring == MDL_SCORE_SIGMOID ? "sigmoid" : "softmax");
    if (e->scoring == MDL_SCORE_SIGMOID) fprintf(out, "--moe-router-enable-expert-bias \\\n");
    if (e->n_group > 1)
        fprintf(out, "--moe-router-num-groups %d \\\n--moe-router-group-topk %d \\\n", e->n_group,
                e->topk_group);
    if (e->scaling != 1.0 && e->scaling > 0)
        fprintf(out, "--moe-router-topk-scaling-factor %g \\\n", e->scaling);
    if (e->scoring != MDL_SCORE_SIGMOID && !e->softmax_after_topk && !e->norm_topk)
        fprintf(out, "--moe-router-pre-softmax \\\n");
    if (e->probs_on_input) fprintf(out, "--moe-apply-probs-on-input \\\n");
}

bool plan_maxtext_layout_ok(const struct cost_layout *l, const struct mdl_model *m, char *why,
                            size_t cap)
{
    if (l->ep < 1 || l->dp % l->ep != 0) {
        snprintf(why, cap,
                 "MaxText's expert axis is a part of data parallelism (--emit maxtext): "
                 "ep must divide dp");
        return false;
    }
    int stages = l->pp * l->vpp;
    if (l->pp > 1 && (l->pp_layout[0] || m->layers % stages != 0)) {
        snprintf(why, cap,
                 "MaxText gives every pipeline stage the same layers (num_layers_per_pipeline_"
                 "stage): %d layers do not split evenly into pp x vpp = %d stages%s",
                 m->layers, stages, l->pp_layout[0] ? ", and it takes no pp_layout" : "");
        return false;
    }
    return true;
}

/* The MaxText model config of each shipped model (src/maxtext/configs/models/NAME.yml), matched
 * by our name and its shape; a proxy (fewer blocks or experts) overrides the model's counts. */
static void maxtext_model(const struct mdl_model *m, FILE *out)
{
    static const struct {
        const char *ours, *maxtext;
        int hidden, ffn, layers, experts;
    } known[] = {
        {"mixtral-8x7b", "mixtral-8x7b", 4096, 14336, 32, 8},
        {"mixtral-8x22b", "mixtral-8x22b", 6144, 16384, 56, 8},
        {"deepseek-v3", "deepseek3-671b", 7168, 2048, 61, 256},
        {"deepseek-v2-lite", "deepseek2-16b", 2048, 1408, 27, 64},
        {"kimi-k2", "kimi-k2-1t", 7168, 2048, 61, 384},
        {"qwen3-30b-a3b", "qwen3-30b-a3b", 2048, 768, 48, 128},
        {"qwen3-235b-a22b", "qwen3-235b-a22b", 4096, 1536, 94, 128},
        {"gpt-oss-20b", "gpt-oss-20b", 2880, 2880, 24, 32},
        {"gpt-oss-120b", "gpt-oss-120b", 2880, 2880, 36, 128},
        {"llama4-scout", "llama4-17b-16e", 5120, 8192, 48, 16},
        {"llama4-maverick", "llama4-17b-128e", 5120, 8192, 48, 128},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        size_t n = strlen(known[i].ours); /* a proxy's name: "mixtral-8x7b-L2-E8" */
        if (strncmp(m->name, known[i].ours, n) || (m->name[n] && strncmp(m->name + n, "-L", 2)) ||
            m->hidden != known[i].hidden || m->moe.intermediate != known[i].ffn)
            continue;
        fprintf(out, "model_name: %s\n", known[i].maxtext);
        if (m->layers != known[i].layers || m->moe.experts != known[i].experts)
            fprintf(out, "override_model_config: True\nbase_num_decoder_layers: %d\n", m->layers);
        return;
    }
    fprintf(out,
            "# model_name: MaxText ships no config of %s; give its architecture (base_emb_dim, "
            "base_num_decoder_layers, base_num_query_heads, base_moe_mlp_dim, ...) yourself\n",
            m->name);
}

enum moe_status plan_print_emit(const struct plan_request *q, const struct plan_result *r,
                                const char *target, FILE *out, struct moe_error *err)
{
    const struct cost_layout *l = &r->best.layout;
    const struct mdl_model *m = &q->model;
    int mb = cost_layout_micro_batches(l);
    if (strcmp(target, "megatron") == 0) {
        char layout[4096];
        megatron_layout(r, layout, sizeof layout);
        fprintf(out, "# Megatron-LM flags for the plan (moeplan %s on %d GPUs)\n", m->name,
                r->best.gpus);
        megatron_model_gaps(m, l->seq_len, out);
        if (l->act_offload && l->recompute == COST_RECOMPUTE_FULL)
            fprintf(out, "# act_offload with recompute=full is costed as MaxText's custom remat "
                         "policy (the offloaded tensors are not recomputed); Megatron-LM's full "
                         "recompute reruns the whole layer\n");
        megatron_model_flags(m, out);
        fprintf(out, "--tensor-model-parallel-size %d \\\n--pipeline-model-parallel-size %d \\\n",
                l->tp, l->pp);
        if (l->cp > 1)
            fprintf(out, "--context-parallel-size %d \\\n--cp-comm-type p2p \\\n", l->cp);
        if (l->pp > 1) fprintf(out, "--pipeline-model-parallel-layout \"%s\" \\\n", layout);
        if (l->mtp) fprintf(out, "--mtp-num-layers %d \\\n", l->mtp);
        fprintf(out, "--expert-model-parallel-size %d \\\n--expert-tensor-parallel-size %d \\\n",
                l->ep, l->etp);
        if (l->tp > 1) fprintf(out, "--sequence-parallel \\\n");
        fprintf(out, "--micro-batch-size %d \\\n--global-batch-size %d \\\n--seq-length %d \\\n",
                l->mbs, l->gbs, l->seq_len);
        fprintf(out, "--num-experts %d \\\n--moe-router-topk %d \\\n--moe-grouped-gemm \\\n",
                m->moe.experts, m->moe.top_k);
        /* Megatron has no per-GPU or per-domain dedup of its own: its flex dispatcher (DeepEP,
         * HybridEP) sends each token once per node or domain */
        if (l->dispatcher == COST_DISPATCH_ALLTOALL)
            fprintf(out, "--moe-token-dispatcher-type alltoall \\\n");
        else
            fprintf(out,
                    "--moe-token-dispatcher-type flex \\\n--moe-flex-dispatcher-backend %s \\\n",
                    l->dispatcher == COST_DISPATCH_HYBRIDEP ? "hybridep" : "deepep");
        if (l->dispatcher >= COST_DISPATCH_DEEPEP && l->ep_sms)
            fprintf(out, "--moe-flex-dispatcher-num-sms %d \\\n", l->ep_sms);
        if (l->overlap && l->ep > 1) fprintf(out, "--overlap-moe-expert-parallel-comm \\\n");
        if (l->overlap && l->ep > 1 && l->delay_wgrad) fprintf(out, "--delay-wgrad-compute \\\n");
        if (l->graphs == COST_GRAPHS_PARTIAL)
            fprintf(out, "--cuda-graph-impl transformer_engine \\\n--cuda-graph-modules attn "
                         "moe_router moe_preprocess \\\n");
        if (l->graphs == COST_GRAPHS_FULL) /* a graphed iteration cannot stop to look for NaN */
            fprintf(out, "--cuda-graph-impl full_iteration \\\n"
                         "--no-check-for-nan-in-loss-and-grad \\\n");
        if (!strcmp(q->routing_spec, "balanced"))
            fprintf(out, "--moe-router-force-load-balancing \\\n");
        unsigned rc = cost_layout_rc(l);
        if (rc) {
            char mods[160];
            cost_rc_modules_format(rc, " ", mods, sizeof mods);
            fprintf(out, "--recompute-granularity selective \\\n--recompute-modules %s \\\n", mods);
        }
        if (l->recompute == COST_RECOMPUTE_FULL && !l->recompute_layers)
            fprintf(out, "--recompute-granularity full \\\n--recompute-method uniform "
                         "\\\n--recompute-num-layers 1 \\\n");
        if (l->recompute == COST_RECOMPUTE_FULL && l->recompute_layers)
            fprintf(out,
                    "--recompute-granularity full \\\n--recompute-method block "
                    "\\\n--recompute-num-layers %d \\\n",
                    l->recompute_layers);
        if (l->zero == 1) fprintf(out, "--use-distributed-optimizer \\\n");
        if (l->zero >= 2)
            fprintf(out,
                    "--use-megatron-fsdp \\\n--ckpt-format fsdp_dtensor \\\n"
                    "--data-parallel-sharding-strategy %s \\\n",
                    l->zero == 2 ? "optim_grads" : "optim_grads_params");
        fprintf(out, "--overlap-grad-reduce \\\n--overlap-param-gather \\\n");
        if (l->grad_reduce_bf16) fprintf(out, "--grad-reduce-in-bf16 \\\n");
        if (l->moments_bf16 || l->offload > 0) fprintf(out, "--use-precision-aware-optimizer \\\n");
        if (l->moments_bf16) fprintf(out, "--exp-avg-dtype bf16 \\\n--exp-avg-sq-dtype bf16 \\\n");
        if (l->offload > 0)
            fprintf(out,
                    "--optimizer-cpu-offload \\\n--optimizer-offload-fraction %.17g \\\n"
                    "--overlap-cpu-optimizer-d2h-h2d \\\n",
                    l->offload);
        if (l->fp8_params) fprintf(out, "--fp8-param-gather \\\n");
        if (l->act_offload) {
            char mods[160];
            cost_off_modules_format(l->act_offload, " ", mods, sizeof mods);
            fprintf(out, "--fine-grained-activation-offloading \\\n--offload-modules %s \\\n",
                    mods);
        }
        static const char *const recipe[] = {"", "tensorwise", "mxfp8", "blockwise"};
        if (l->precision == COST_BF16)
            fprintf(out, "--bf16\n");
        else
            fprintf(out, "--bf16 \\\n--fp8-format %s \\\n--fp8-recipe %s\n",
                    cost_precision_e5m2_grads(l->precision) ? "hybrid" : "e4m3",
                    recipe[l->precision]);
        fprintf(out, "# %d micro-batches per step; data parallel %d (expert data parallel %d)\n",
                mb, l->dp, cost_layout_edp(l));
        return MOE_OK;
    }
    if (strcmp(target, "maxtext") == 0) {
        /* MaxText's mesh: pipeline x data x fsdp x expert x context x tensor, ICI inside an
         * NVLink domain and DCN across, inner axes first. */
        int domain = q->cluster.gpus_used_per_domain;
        /* a plan searched for MaxText (plan_request.maxtext_mesh) is always one; another may not */
        char why[200];
        bool even = true;
        for (int v = 0; v < l->pp * l->vpp; v++)
            even &= r->split.stage_layers[v] == m->layers / (l->pp * l->vpp);
        if (!plan_maxtext_layout_ok(l, m, why, sizeof why) || !even)
            return moe_error_set(err, MOE_ERR_UNSUPPORTED, "--emit maxtext: %s",
                                 even ? why
                                      : "the plan's stages hold different numbers of layers, "
                                        "which MaxText cannot say");
        int data = l->dp / l->ep; /* the expert axis takes ep of the data-parallel ranks */
        int fsdp = l->zero >= 3 ? data : 1;
        if (fsdp > 1) data = 1;
        int axes[6] = {l->tp, l->cp, l->ep, fsdp, data, l->pp}, ici[6], dcn[6];
        int room = domain;
        for (int i = 0; i < 6; i++) {
            int in = 1;
            while (in * 2 <= axes[i] && axes[i] % (in * 2) == 0 && room % (in * 2) == 0) in *= 2;
            if (axes[i] <= room && room % axes[i] == 0) in = axes[i];
            ici[i] = in;
            dcn[i] = axes[i] / in;
            room /= in;
        }
        fprintf(out, "# MaxText config for the plan (moeplan %s on %d GPUs)\n", m->name,
                r->best.gpus);
        maxtext_model(m, out);
        static const char *const axis[6] = {"tensor", "context", "expert",
                                            "fsdp",   "data",    "pipeline"};
        for (int i = 0; i < 6; i++) fprintf(out, "ici_%s_parallelism: %d\n", axis[i], ici[i]);
        for (int i = 0; i < 6; i++) fprintf(out, "dcn_%s_parallelism: %d\n", axis[i], dcn[i]);
        if (l->pp > 1)
            fprintf(out, "num_layers_per_pipeline_stage: %d\nnum_pipeline_microbatches: %d\n",
                    m->layers / (l->pp * l->vpp), mb);
        /* without a pipeline the micro-batches are MaxText's gradient accumulation steps (the
         * per-device batch is then one micro-batch's) */
        if (l->pp == 1 && mb > 1)
            fprintf(out, "gradient_accumulation_steps: %d\nper_device_batch_size: %g\n", mb,
                    (double)l->gbs / r->best.gpus / mb);
        else
            fprintf(out, "per_device_batch_size: %g\n", (double)l->gbs / r->best.gpus);
        fprintf(out, "max_target_length: %d\n", l->seq_len);
        fprintf(out,
                "num_experts: %d\nnum_experts_per_tok: %d\nsparse_matmul: True\nmegablox: True\n"
                "capacity_factor: -1.0\n",
                m->moe.experts, m->moe.top_k);
        /* full recompute with tensors on the host is MaxText's custom policy: the layer's input
         * on the device, the experts' first GEMM outputs offloaded, every other name remat */
        bool custom =
            l->recompute == COST_RECOMPUTE_FULL && (l->act_offload & COST_RC_BIT(COST_OFF_MOE_ACT));
        fprintf(out, "remat_policy: %s\ndtype: bfloat16\n",
                custom                                     ? "custom"
                : l->recompute == COST_RECOMPUTE_NONE      ? "minimal"
                : l->recompute == COST_RECOMPUTE_SELECTIVE ? "save_qkv_proj"
                                                           : "full");
        if (custom)
            fprintf(out, "decoder_layer_input: %s\nmoe_mlpwi_0: offload\nmoe_mlpwi_1: offload\n",
                    l->act_offload & COST_RC_BIT(COST_OFF_ATTN_NORM) ? "offload" : "device");
        /* Transformer Engine's recipes in MaxText's QuantizationType; it has no blockwise one */
        if (l->precision == COST_MXFP8) fprintf(out, "quantization: te_mxfp8\n");
        if (l->precision == COST_FP8) fprintf(out, "quantization: te_fp8_currentscaling\n");
        if (l->precision == COST_FP8_BLOCK)
            fprintf(out, "# fp8block: MaxText has no blockwise recipe; current scaling is the "
                         "nearest\nquantization: te_fp8_currentscaling\n");
        /* the plan's settings this config does not carry: said, never dropped silently */
        char left[512] = "";
        size_t n = 0;
#define LEFT(cond, ...)                                                                            \
    if ((cond) && n < sizeof left) n += (size_t)snprintf(left + n, sizeof left - n, __VA_ARGS__)
        LEFT(l->mtp, " mtp=%d", l->mtp);
        LEFT(l->zero == 2, " zero=2 (MaxText shards all or none: fsdp)");
        LEFT(l->zero == 0 && data > 1, " zero=0");
        LEFT(l->offload > 0, " offload=%g", l->offload);
        LEFT(l->moments_bf16, " moments=bf16");
        LEFT(l->grad_reduce_bf16, " grad_reduce=bf16");
        LEFT(l->graphs, " cuda_graphs=%s", cost_graphs_names[l->graphs]);
        LEFT(l->delay_wgrad, " delay_wgrad=on");
        char offm[160];
        unsigned said =
            custom ? COST_RC_BIT(COST_OFF_MOE_ACT) | COST_RC_BIT(COST_OFF_ATTN_NORM) : 0;
        cost_off_modules_format(l->act_offload & ~said, "+", offm, sizeof offm);
        LEFT(l->act_offload & ~said, " act_offload=%s (MaxText: a custom remat_policy's 'offload')",
             offm);
        LEFT(l->recompute_layers, " recompute_layers=%d (remat_policy is every layer's)",
             l->recompute_layers);
        LEFT(l->recompute == COST_RECOMPUTE_SELECTIVE && cost_layout_rc(l) != COST_RC_DEFAULT,
             " recompute modules (remat_policy is the nearest)");
#undef LEFT
        if (left[0])
            fprintf(out,
                    "# the plan's settings this config does not carry (set them by hand where "
                    "MaxText has them):%s\n",
                    left);
        return MOE_OK;
    }
    return moe_error_set(err, MOE_ERR_USAGE, "--emit %s: megatron or maxtext", target);
}
