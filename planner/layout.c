/*
 * layout.c: parallel layouts: parsing "tp=1,pp=8,...", printing, and structural checks.
 *
 * Conventions (Megatron's): the GPUs of a job are tp x pp x dp; the expert layers regroup the same
 * tp x dp GPUs of a stage as etp x ep x edp (expert data parallel), so ep * etp must divide
 * tp * dp. Rank order is tp innermost, then ep, then the rest of dp, then pp, so a TP group and
 * the EP peers sit in as few NVLink domains as possible.
 */
#include "cost.h"

#include <stdlib.h>
#include <string.h>

const char *const cost_precision_names[] = {"bf16", "fp8", "mxfp8", NULL};
const char *const cost_recompute_names[] = {"none", "selective", "full", NULL};
const char *const cost_dispatcher_names[] = {"alltoall", "dedup-gpu", "dedup-domain", NULL};

static int name_index(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

enum moe_status cost_layout_parse(struct cost_layout *l, const char *text, struct moe_error *err)
{
    struct cost_layout t = *l;
    char buf[512];
    if (strlen(text) >= sizeof buf) return moe_error_set(err, MOE_ERR_USAGE, "layout is too long");
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return moe_error_set(err, MOE_ERR_USAGE, "layout: '%s' is not key=value", item);
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        int idx;
        if ((idx = name_index(cost_precision_names, val)) >= 0 && !strcmp(key, "precision")) {
            t.precision = (enum cost_precision)idx;
            continue;
        }
        if (!strcmp(key, "recompute")) {
            if ((idx = name_index(cost_recompute_names, val)) < 0)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "layout: recompute=%s (none, selective, full)", val);
            t.recompute = (enum cost_recompute)idx;
            continue;
        }
        if (!strcmp(key, "dispatcher")) {
            if ((idx = name_index(cost_dispatcher_names, val)) < 0)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "layout: dispatcher=%s (alltoall, dedup-gpu, dedup-domain)",
                                     val);
            t.dispatcher = (enum cost_dispatcher)idx;
            continue;
        }
        if (!strcmp(key, "overlap")) {
            if (strcmp(val, "on") && strcmp(val, "off"))
                return moe_error_set(err, MOE_ERR_USAGE, "layout: overlap=%s (on, off)", val);
            t.overlap = !strcmp(val, "on");
            continue;
        }
        if (!strcmp(key, "precision"))
            return moe_error_set(err, MOE_ERR_USAGE, "layout: precision=%s (bf16, fp8, mxfp8)",
                                 val);
        uint64_t v;
        struct moe_error perr;
        if (moe_parse_count(val, &v, &perr) != MOE_OK || v < (strcmp(key, "zero") ? 1u : 0u) ||
            v > (1u << 30))
            return moe_error_set(err, MOE_ERR_USAGE, "layout: %s=%s is not a valid count", key,
                                 val);
        int n = (int)v;
        if (!strcmp(key, "zero") && n > 3)
            return moe_error_set(err, MOE_ERR_USAGE, "layout: zero=%s (0, 1, 2 or 3)", val);
        if (!strcmp(key, "tp"))
            t.tp = n;
        else if (!strcmp(key, "pp"))
            t.pp = n;
        else if (!strcmp(key, "vpp"))
            t.vpp = n;
        else if (!strcmp(key, "ep"))
            t.ep = n;
        else if (!strcmp(key, "etp"))
            t.etp = n;
        else if (!strcmp(key, "dp"))
            t.dp = n;
        else if (!strcmp(key, "zero"))
            t.zero = n;
        else if (!strcmp(key, "mbs"))
            t.mbs = n;
        else if (!strcmp(key, "gbs"))
            t.gbs = n;
        else if (!strcmp(key, "seq") || !strcmp(key, "seq_len"))
            t.seq_len = n;
        else
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "layout: unknown key '%s' (tp, pp, vpp, ep, etp, dp, zero, mbs, "
                                 "gbs, recompute, dispatcher, precision, overlap)",
                                 key);
    }
    *l = t;
    return MOE_OK;
}

void cost_layout_format(const struct cost_layout *l, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "tp=%d,pp=%d,vpp=%d,ep=%d,etp=%d,dp=%d,zero=%d,mbs=%d,gbs=%d,seq=%d,precision=%s,"
             "recompute=%s,dispatcher=%s,overlap=%s",
             l->tp, l->pp, l->vpp, l->ep, l->etp, l->dp, l->zero, l->mbs, l->gbs, l->seq_len,
             cost_precision_names[l->precision], cost_recompute_names[l->recompute],
             cost_dispatcher_names[l->dispatcher], l->overlap ? "on" : "off");
}

int cost_layout_micro_batches(const struct cost_layout *l)
{
    long denom = (long)l->dp * l->mbs;
    return denom > 0 ? (int)(l->gbs / denom) : 0;
}

enum moe_status cost_layout_check(const struct cost_layout *l, const struct mdl_model *m, int gpus,
                                  struct moe_error *err)
{
#define NO(...) return moe_error_set(err, MOE_ERR_INFEASIBLE, __VA_ARGS__)
    if (l->tp < 1 || l->pp < 1 || l->vpp < 1 || l->ep < 1 || l->etp < 1 || l->dp < 1 ||
        l->mbs < 1 || l->gbs < 1 || l->seq_len < 1)
        NO("every degree, mbs, gbs and the sequence length must be at least 1");
    if (l->zero < 0 || l->zero > 3) NO("zero must be 0, 1, 2 or 3, not %d", l->zero);
    if (l->pp > COST_MAX_PP || (long)l->pp * l->vpp > COST_MAX_STAGES)
        NO("pp = %d, vpp = %d: moeplan simulates at most %d pipeline ranks and %d virtual stages",
           l->pp, l->vpp, COST_MAX_PP, COST_MAX_STAGES);
    if ((long)l->tp * l->pp * l->dp != gpus)
        NO("tp x pp x dp = %d x %d x %d = %ld, not the %d GPUs", l->tp, l->pp, l->dp,
           (long)l->tp * l->pp * l->dp, gpus);
    if (((long)l->tp * l->dp) % ((long)l->ep * l->etp) != 0)
        NO("ep x etp = %d x %d must divide tp x dp = %ld (the GPUs of a stage)", l->ep, l->etp,
           (long)l->tp * l->dp);
    if (m->moe.experts % l->ep != 0)
        NO("ep = %d does not divide the %d experts", l->ep, m->moe.experts);
    if (m->attn.heads % l->tp != 0)
        NO("tp = %d does not divide the %d heads", l->tp, m->attn.heads);
    if (m->attn.type == MDL_ATTN_GQA && m->attn.kv_heads % l->tp != 0 &&
        l->tp % m->attn.kv_heads != 0)
        NO("tp = %d and the %d kv heads do not divide one another", l->tp, m->attn.kv_heads);
    if (m->moe.intermediate % l->etp != 0)
        NO("etp = %d does not divide the expert width %d", l->etp, m->moe.intermediate);
    if (m->layers < l->pp * l->vpp)
        NO("%d layers cannot fill pp x vpp = %d stages", m->layers, l->pp * l->vpp);
    if (l->gbs % ((long)l->dp * l->mbs) != 0)
        NO("gbs = %d is not a multiple of dp x mbs = %ld", l->gbs, (long)l->dp * l->mbs);
    int mb = cost_layout_micro_batches(l);
    if (l->vpp > 1 && (l->pp == 1 || mb % l->pp != 0))
        NO("interleaving (vpp = %d) needs pp > 1 and micro-batches (%d) a multiple of pp (%d)",
           l->vpp, mb, l->pp);
    if (l->seq_len % l->tp != 0) NO("seq = %d is not a multiple of tp = %d", l->seq_len, l->tp);
    if (l->seq_len > m->max_seq_len)
        NO("seq = %d exceeds the model's %d", l->seq_len, m->max_seq_len);
    if (l->dispatcher != COST_DISPATCH_ALLTOALL && l->ep == 1) NO("dedup dispatch needs ep > 1");
#undef NO
    return MOE_OK;
}
