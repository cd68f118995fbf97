/*
 * layout.c: parallel layouts: parsing "tp=1,pp=8,...", printing, and structural checks.
 *
 * Conventions (Megatron's): the GPUs of a job are tp x cp x pp x dp; the expert layers regroup the
 * same tp x cp x dp GPUs of a stage as etp x ep x edp (expert data parallel), so ep * etp must
 * divide tp * cp * dp. Rank order is tp innermost, then cp, then dp, then pp (Megatron's
 * tp-cp-ep-dp-pp); the expert grid counts etp innermost, then ep, over the same GPUs, so a TP
 * group and the EP peers sit in as few NVLink domains as possible.
 */
#include "cost.h"

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *const cost_precision_names[] = {"bf16", "fp8", "mxfp8", "fp8block", NULL};
const char *const cost_recompute_names[] = {"none", "selective", "full", NULL};
const char *const cost_dispatcher_names[] = {"alltoall", "dedup-gpu", "dedup-domain",
                                             "deepep",   "hybridep",  NULL};
const char *const cost_graphs_names[] = {"none", "partial", "full", NULL};
const char *const cost_rc_module_names[COST_RC_NMODULES] = {
    "core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe", "shared_experts"};
const char *const cost_off_module_names[COST_OFF_NMODULES] = {
    "attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"};

static int name_index(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

/* "mla_up_proj+layernorm": module names of `names` (n of them) joined by '+', as Megatron's
 * --recompute-modules and --offload-modules take them. */
static enum moe_status parse_module_list(const char *key, const char *val, const char *const *names,
                                         int n, unsigned *out, struct moe_error *err)
{
    char buf[256], list[256];
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    snprintf(buf, sizeof buf, "%s", val);
    unsigned bits = 0;
    for (char *m = buf, *next; m; m = next) {
        next = strchr(m, '+');
        if (next) *next++ = '\0';
        if (!m[0])
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "layout: %s=%s: an empty module ('+' at an end, or '++')", key,
                                 val);
        int i = 0;
        while (i < n && strcmp(names[i], m)) i++;
        if (i == n)
            return moe_error_set(
                err, MOE_ERR_USAGE, "layout: %s=%s: '%s' is not a module (%s, joined by '+'%s)",
                key, val, m, list,
                strcmp(key, "recompute") ? "; or none" : "; or none, selective, full");
        bits |= COST_RC_BIT(i);
    }
    *out = bits;
    return MOE_OK;
}

const struct cost_layout_key cost_layout_keys[] = {
    {"tp", COST_KEY_TP},
    {"cp", COST_KEY_CP},
    {"pp", COST_KEY_PP},
    {"vpp", COST_KEY_VPP},
    {"ep", COST_KEY_EP},
    {"etp", COST_KEY_ETP},
    {"dp", COST_KEY_DP},
    {"zero", COST_KEY_ZERO},
    {"mbs", COST_KEY_MBS},
    {"gbs", COST_KEY_GBS},
    {"seq", COST_KEY_SEQ},
    {"seq_len", COST_KEY_SEQ},
    {"precision", COST_KEY_PRECISION},
    {"recompute", COST_KEY_RECOMPUTE},
    {"recompute_layers", COST_KEY_RECOMPUTE_LAYERS},
    {"dispatcher", COST_KEY_DISPATCHER},
    {"overlap", COST_KEY_OVERLAP},
    {"delay_wgrad", COST_KEY_DELAY_WGRAD},
    {"cuda_graphs", COST_KEY_CUDA_GRAPHS},
    {"ep_sms", COST_KEY_EP_SMS},
    {"mtp", COST_KEY_MTP},
    {"grad_reduce", COST_KEY_GRAD_REDUCE},
    {"moments", COST_KEY_MOMENTS},
    {"fp8_params", COST_KEY_FP8_PARAMS},
    {"offload", COST_KEY_OFFLOAD},
    {"pp_layout", COST_KEY_PP_LAYOUT},
    {"act_offload", COST_KEY_ACT_OFFLOAD},
    {NULL, 0},
};

enum moe_status cost_layout_parse(struct cost_layout *l, const char *text, struct moe_error *err)
{
    return cost_layout_parse_keys(l, text, NULL, err);
}

enum moe_status cost_layout_parse_keys(struct cost_layout *l, const char *text, uint64_t *keys,
                                       struct moe_error *err)
{
    uint64_t given = 0;
    struct cost_layout t = *l;
    char buf[512];
    if (strlen(text) >= sizeof buf) return moe_error_set(err, MOE_ERR_USAGE, "layout is too long");
    snprintf(buf, sizeof buf, "%s", text);
    for (const char *p = text; *p; p++)
        if (isspace((unsigned char)*p) || (unsigned char)*p < 0x20)
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "layout: a space or control character at %d: write "
                                 "key=value,key=value",
                                 (int)(p - text) + 1);
    for (char *item = buf, *next; item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = '\0';
        if (!item[0])
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "layout: an empty item (',' at an end, or ',,'): write "
                                 "key=value,key=value");
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return moe_error_set(err, MOE_ERR_USAGE, "layout: '%s' is not key=value", item);
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        int idx, k = 0;
        while (cost_layout_keys[k].name && strcmp(cost_layout_keys[k].name, key)) k++;
        if (!cost_layout_keys[k].name) {
            char list[512];
            size_t n = 0;
            for (int j = 0; cost_layout_keys[j].name && n < sizeof list; j++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", j ? ", " : "",
                                      cost_layout_keys[j].name);
            return moe_error_set(err, MOE_ERR_USAGE, "layout: unknown key '%s' (%s)", key, list);
        }
        if (given & COST_KEY_BIT(cost_layout_keys[k].key))
            return moe_error_set(err, MOE_ERR_USAGE, "layout: %s given twice%s: give each key once",
                                 key,
                                 cost_layout_keys[k].key == COST_KEY_SEQ ? " (seq and seq_len "
                                                                           "are one key)"
                                                                         : "");
        given |= COST_KEY_BIT(cost_layout_keys[k].key);
        if ((idx = name_index(cost_precision_names, val)) >= 0 && !strcmp(key, "precision")) {
            t.precision = (enum cost_precision)idx;
            continue;
        }
        if (!strcmp(key, "recompute")) {
            if ((idx = name_index(cost_recompute_names, val)) >= 0) {
                t.recompute = (enum cost_recompute)idx;
                t.recompute_modules = idx == COST_RECOMPUTE_SELECTIVE ? COST_RC_DEFAULT : 0;
                continue;
            }
            enum moe_status st = parse_module_list("recompute", val, cost_rc_module_names,
                                                   COST_RC_NMODULES, &t.recompute_modules, err);
            if (st != MOE_OK) return st;
            t.recompute = COST_RECOMPUTE_SELECTIVE;
            continue;
        }
        if (!strcmp(key, "act_offload")) {
            t.act_offload = 0;
            if (strcmp(val, "none")) {
                enum moe_status st = parse_module_list("act_offload", val, cost_off_module_names,
                                                       COST_OFF_NMODULES, &t.act_offload, err);
                if (st != MOE_OK) return st;
            }
            continue;
        }
        if (!strcmp(key, "dispatcher")) {
            if ((idx = name_index(cost_dispatcher_names, val)) < 0)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "layout: dispatcher=%s (alltoall, dedup-gpu, dedup-domain, "
                                     "deepep, hybridep)",
                                     val);
            t.dispatcher = (enum cost_dispatcher)idx;
            continue;
        }
        if (!strcmp(key, "overlap") || !strcmp(key, "delay_wgrad") || !strcmp(key, "fp8_params")) {
            if (strcmp(val, "on") && strcmp(val, "off"))
                return moe_error_set(err, MOE_ERR_USAGE, "layout: %s=%s (on, off)", key, val);
            *(key[0] == 'o'   ? &t.overlap
              : key[0] == 'd' ? &t.delay_wgrad
                              : &t.fp8_params) = !strcmp(val, "on");
            continue;
        }
        if (!strcmp(key, "offload")) {
            char *end;
            double f = strtod(val, &end);
            bool decimal = strspn(val, "0123456789.") == strlen(val); /* no 0x0.8, no 1e-1 */
            if (*end || !decimal || !(f >= 0.0 && f <= 1.0))
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "layout: offload=%s is not a share of the optimizer state "
                                     "(0 .. 1)",
                                     val);
            t.offload = f;
            continue;
        }
        if (!strcmp(key, "cuda_graphs")) {
            if ((idx = name_index(cost_graphs_names, val)) < 0)
                return moe_error_set(err, MOE_ERR_USAGE,
                                     "layout: cuda_graphs=%s (none, partial, full)", val);
            t.graphs = (enum cost_graphs)idx;
            continue;
        }
        if (!strcmp(key, "precision") && !strcmp(val, "fp8cs")) { /* Megatron's "tensorwise" */
            t.precision = COST_FP8;
            continue;
        }
        if (!strcmp(key, "precision"))
            return moe_error_set(err, MOE_ERR_USAGE,
                                 "layout: precision=%s (bf16, fp8 or fp8cs, fp8block, mxfp8)", val);
        if (!strcmp(key, "grad_reduce") || !strcmp(key, "moments")) {
            if (strcmp(val, "fp32") && strcmp(val, "bf16"))
                return moe_error_set(err, MOE_ERR_USAGE, "layout: %s=%s (fp32, bf16)", key, val);
            *(key[0] == 'g' ? &t.grad_reduce_bf16 : &t.moments_bf16) = !strcmp(val, "bf16");
            continue;
        }
        if (!strcmp(key, "pp_layout")) {
            if (strlen(val) >= sizeof t.pp_layout)
                return moe_error_set(err, MOE_ERR_USAGE, "layout: pp_layout is over %d characters",
                                     COST_PP_LAYOUT_MAX - 1);
            snprintf(t.pp_layout, sizeof t.pp_layout, "%s", val);
            continue;
        }
        uint64_t v;
        struct moe_error perr;
        bool zero_ok =
            !strcmp(key, "zero") || !strcmp(key, "mtp") || !strcmp(key, "recompute_layers");
        if (moe_parse_count(val, &v, &perr) != MOE_OK || v < (zero_ok ? 0u : 1u) || v > (1u << 30))
            return moe_error_set(err, MOE_ERR_USAGE, "layout: %s=%s is not a valid count", key,
                                 val);
        int n = (int)v;
        if (!strcmp(key, "mtp") && n > MDL_MAX_MTP)
            return moe_error_set(err, MOE_ERR_USAGE, "layout: mtp=%s (0 .. %d)", val, MDL_MAX_MTP);
        if (!strcmp(key, "zero") && n > 3)
            return moe_error_set(err, MOE_ERR_USAGE, "layout: zero=%s (0, 1, 2 or 3)", val);
        static const struct {
            const char *key;
            size_t at;
        } ints[] = {{"tp", offsetof(struct cost_layout, tp)},
                    {"cp", offsetof(struct cost_layout, cp)},
                    {"pp", offsetof(struct cost_layout, pp)},
                    {"vpp", offsetof(struct cost_layout, vpp)},
                    {"ep", offsetof(struct cost_layout, ep)},
                    {"etp", offsetof(struct cost_layout, etp)},
                    {"dp", offsetof(struct cost_layout, dp)},
                    {"zero", offsetof(struct cost_layout, zero)},
                    {"mbs", offsetof(struct cost_layout, mbs)},
                    {"gbs", offsetof(struct cost_layout, gbs)},
                    {"seq", offsetof(struct cost_layout, seq_len)},
                    {"seq_len", offsetof(struct cost_layout, seq_len)},
                    {"mtp", offsetof(struct cost_layout, mtp)},
                    {"recompute_layers", offsetof(struct cost_layout, recompute_layers)},
                    {"ep_sms", offsetof(struct cost_layout, ep_sms)}};
        size_t at = 0, nints = sizeof ints / sizeof ints[0];
        while (at + 1 < nints && strcmp(ints[at].key, key)) at++; /* the rest are these */
        *(int *)((char *)&t + ints[at].at) = n;
    }
    /* keys of one text that contradict each other: said here, for --layout, --fix and --compare
     * alike (a partial --fix is never given to cost_layout_check, which says the same of a whole
     * layout) */
    if ((given & COST_KEY_BIT(COST_KEY_RECOMPUTE)) && t.recompute_layers > 0 &&
        t.recompute != COST_RECOMPUTE_FULL)
        return moe_error_set(err, MOE_ERR_USAGE,
                             "layout: recompute_layers = %d counts blocks recomputed whole: it "
                             "goes with recompute=full, not recompute=%s",
                             t.recompute_layers, cost_recompute_names[t.recompute]);
    *l = t;
    if (keys) *keys = given;
    return MOE_OK;
}

static void modules_format(unsigned mods, const char *const *names, int count, const char *sep,
                           char *buf, size_t cap)
{
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < count && n < cap; i++)
        if (mods & COST_RC_BIT(i))
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? sep : "", names[i]);
}

void cost_rc_modules_format(unsigned mods, const char *sep, char *buf, size_t cap)
{
    modules_format(mods, cost_rc_module_names, COST_RC_NMODULES, sep, buf, cap);
}

void cost_off_modules_format(unsigned mods, const char *sep, char *buf, size_t cap)
{
    modules_format(mods, cost_off_module_names, COST_OFF_NMODULES, sep, buf, cap);
}

void cost_layout_recompute_text(const struct cost_layout *l, char *buf, size_t cap)
{
    unsigned mods = cost_layout_rc(l);
    if (l->recompute == COST_RECOMPUTE_SELECTIVE && mods != COST_RC_DEFAULT)
        cost_rc_modules_format(mods, "+", buf, cap);
    else
        snprintf(buf, cap, "%s", cost_recompute_names[l->recompute]);
}

void cost_layout_format(const struct cost_layout *l, char *buf, size_t cap)
{
    char rc[160];
    cost_layout_recompute_text(l, rc, sizeof rc);
    char cp[16] = ""; /* after tp, where the layout uses it */
    if (l->cp > 1) snprintf(cp, sizeof cp, ",cp=%d", l->cp);
    int k = snprintf(buf, cap,
                     "tp=%d%s,pp=%d,vpp=%d,ep=%d,etp=%d,dp=%d,zero=%d,mbs=%d,gbs=%d,seq=%d,"
                     "precision=%s,recompute=%s,dispatcher=%s,overlap=%s",
                     l->tp, cp, l->pp, l->vpp, l->ep, l->etp, l->dp, l->zero, l->mbs, l->gbs,
                     l->seq_len, cost_precision_names[l->precision], rc,
                     cost_dispatcher_names[l->dispatcher], l->overlap ? "on" : "off");
    /* the keys a plain Megatron run leaves at their defaults, only when set */
    if (k >= 0 && (size_t)k < cap && l->recompute == COST_RECOMPUTE_FULL && l->recompute_layers)
        k += snprintf(buf + k, cap - (size_t)k, ",recompute_layers=%d", l->recompute_layers);
    if (k >= 0 && (size_t)k < cap && l->mtp)
        k += snprintf(buf + k, cap - (size_t)k, ",mtp=%d", l->mtp);
    if (k >= 0 && (size_t)k < cap && l->grad_reduce_bf16)
        k += snprintf(buf + k, cap - (size_t)k, ",grad_reduce=bf16");
    if (k >= 0 && (size_t)k < cap && l->delay_wgrad)
        k += snprintf(buf + k, cap - (size_t)k, ",delay_wgrad=on");
    if (k >= 0 && (size_t)k < cap && l->graphs)
        k += snprintf(buf + k, cap - (size_t)k, ",cuda_graphs=%s", cost_graphs_names[l->graphs]);
    if (k >= 0 && (size_t)k < cap && l->ep_sms)
        k += snprintf(buf + k, cap - (size_t)k, ",ep_sms=%d", l->ep_sms);
    if (k >= 0 && (size_t)k < cap && l->moments_bf16)
        k += snprintf(buf + k, cap - (size_t)k, ",moments=bf16");
    if (k >= 0 && (size_t)k < cap && l->fp8_params)
        k += snprintf(buf + k, cap - (size_t)k, ",fp8_params=on");
    if (k >= 0 && (size_t)k < cap && l->offload > 0)
        k += snprintf(buf + k, cap - (size_t)k, ",offload=%.17g", l->offload);
    if (k >= 0 && (size_t)k < cap && l->act_offload) {
        char mods[160];
        cost_off_modules_format(l->act_offload, "+", mods, sizeof mods);
        k += snprintf(buf + k, cap - (size_t)k, ",act_offload=%s", mods);
    }
    if (k >= 0 && (size_t)k < cap && l->pp_layout[0])
        snprintf(buf + k, cap - (size_t)k, ",pp_layout=%s", l->pp_layout);
}

/* The layout grammar expanded into E, t, m, L and '|', at out[*n]; false on a syntax error (what
 * and where in *why). */
struct pp_expand {
    const char *text, *p;
    char *out;
    size_t n, cap;
    char why[160];
};

static bool pp_seq(struct pp_expand *x, int depth);

static bool pp_item(struct pp_expand *x, int depth)
{
    size_t start = x->n;
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (!pp_seq(x, depth + 1)) return false;
        if (*x->p != ')') {
            snprintf(x->why, sizeof x->why, "a '(' at %d is not closed", (int)(x->p - x->text) + 1);
            return false;
        }
        x->p++;
    } else if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
        if (x->n + 1 >= x->cap) goto too_long;
        x->out[x->n++] = c;
        x->p++;
    } else {
        snprintf(x->why, sizeof x->why, "'%c' at %d is not E, t, m, L, |, *N or a group", c,
                 (int)(x->p - x->text) + 1);
        return false;
    }
    if (*x->p == '*') {
        x->p++;
        char *end;
        long times = strtol(x->p, &end, 10);
        if (end == x->p || times < 1 || times > MDL_MAX_LAYERS) {
            snprintf(x->why, sizeof x->why, "'*' at %d needs a count (1 .. %d)",
                     (int)(x->p - x->text), MDL_MAX_LAYERS);
            return false;
        }
        x->p = end;
        size_t len = x->n - start;
        for (long i = 1; i < times; i++) {
            if (x->n + len >= x->cap) goto too_long;
            memcpy(x->out + x->n, x->out + start, len);
            x->n += len;
        }
    }
    return true;
too_long:
    snprintf(x->why, sizeof x->why, "it expands to more items than the model has");
    return false;
}

static bool pp_seq(struct pp_expand *x, int depth)
{
    if (depth > 16) {
        snprintf(x->why, sizeof x->why, "groups nested deeper than 16");
        return false;
    }
    while (*x->p && *x->p != ')')
        if (isspace((unsigned char)*x->p) || *x->p == ',') /* Megatron: commas are cosmetic */
            x->p++;
        else if (!pp_item(x, depth))
            return false;
    return true;
}

enum moe_status cost_pp_layout_parse(const char *text, int stages, int layers, int mtp,
                                     struct cost_stage *out, struct moe_error *err)
{
#define BAD(...) return moe_error_set(err, MOE_ERR_INFEASIBLE, "pp_layout '%s': " __VA_ARGS__)
    struct pp_expand x = {
        text, text, NULL, 0, (size_t)layers + (size_t)mtp + 4 * (size_t)stages + 8, ""};
    x.out = malloc(x.cap);
    if (!x.out) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    bool ok = pp_seq(&x, 0);
    if (ok && *x.p == ')') {
        snprintf(x.why, sizeof x.why, "a ')' at %d opens no group", (int)(x.p - text) + 1);
        ok = false;
    }
    if (!ok) { /* a syntax error is the user's text, not the model's: a usage error */
        free(x.out);
        return moe_error_set(err, MOE_ERR_USAGE, "pp_layout '%s': %s", text, x.why);
    }
    int s = 0, t = 0, m = 0, e = 0, loss = 0;
    memset(out, 0, sizeof *out * (size_t)stages);
    const char *bad = NULL;
    for (size_t i = 0; i < x.n && !bad; i++) {
        char c = x.out[i];
        if (c == '|') {
            if (++s >= stages)
                bad = "more stages than pp x vpp";
            else
                out[s].first = t;
            continue;
        }
        if (c == 't') {
            if (out[s].mtp || out[s].loss) bad = "a decoder layer after m or L";
            out[s].count++, t++;
        } else if (c == 'E') {
            if (s != 0 || out[s].count || e++) bad = "E must come first, once";
            out[s].embed = true;
        } else if (c == 'm') {
            if (out[s].loss) bad = "m after L";
            out[s].mtp = true, m++;
        } else if (c == 'L') {
            if (loss++) bad = "L twice";
            out[s].loss = true;
        }
    }
    free(x.out);
    if (bad) BAD("%s", text, bad);
    if (s + 1 != stages) BAD("%d stages, the layout has pp x vpp = %d", text, s + 1, stages);
    if (t != layers) BAD("%d decoder layers (t), the model has %d", text, t, layers);
    if (m != mtp) BAD("%d MTP layers (m), the layout trains %d", text, m, mtp);
    if (!e || !loss) BAD("it needs E and L", text);
    if (!out[stages - 1].loss || (mtp && !out[stages - 1].mtp))
        BAD("the MTP layers and L belong on the last stage", text);
#undef BAD
    return MOE_OK;
}

void cost_layout_defaults(struct cost_layout *l, int seq_len)
{
    *l = (struct cost_layout){.tp = 1,
                              .cp = 1,
                              .pp = 1,
                              .vpp = 1,
                              .ep = 1,
                              .etp = 1,
                              .dp = 1,
                              .zero = 1,
                              .seq_len = seq_len,
                              .mbs = 1,
                              .gbs = 8,
                              .precision = COST_BF16,
                              .recompute = COST_RECOMPUTE_NONE,
                              .dispatcher = COST_DISPATCH_ALLTOALL,
                              .overlap = false};
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
    if (l->tp < 1 || l->cp < 1 || l->pp < 1 || l->vpp < 1 || l->ep < 1 || l->etp < 1 || l->dp < 1 ||
        l->mbs < 1 || l->gbs < 1 || l->seq_len < 1)
        NO("every degree, mbs, gbs and the sequence length must be at least 1");
    if (l->seq_len < 2 || l->seq_len > COST_MAX_SEQ || l->gbs > COST_MAX_GBS ||
        l->mbs > COST_MAX_MBS)
        NO("seq = %d, gbs = %d, mbs = %d: moeplan takes seq 2 .. %d, gbs up to %d, mbs up to %d",
           l->seq_len, l->gbs, l->mbs, COST_MAX_SEQ, COST_MAX_GBS, COST_MAX_MBS);
    if (l->zero < 0 || l->zero > 3) NO("zero must be 0, 1, 2 or 3, not %d", l->zero);
    if (l->pp > COST_MAX_PP || (long)l->pp * l->vpp > COST_MAX_STAGES)
        NO("pp = %d, vpp = %d: moeplan simulates at most %d pipeline ranks and %d virtual stages",
           l->pp, l->vpp, COST_MAX_PP, COST_MAX_STAGES);
    if (l->tp > gpus || l->cp > gpus || l->pp > gpus || l->dp > gpus || l->etp > gpus)
        NO("tp = %d, cp = %d, pp = %d, dp = %d, etp = %d: none may exceed the GPU count (%d)",
           l->tp, l->cp, l->pp, l->dp, l->etp, gpus);
    /* cp named in the messages only where the layout uses it */
    long stage_gpus = (long)l->tp * l->cp * l->dp;
    char degrees[96];
    if (l->cp > 1)
        snprintf(degrees, sizeof degrees, "tp x cp x pp x dp = %d x %d x %d x %d", l->tp, l->cp,
                 l->pp, l->dp);
    else
        snprintf(degrees, sizeof degrees, "tp x pp x dp = %d x %d x %d", l->tp, l->pp, l->dp);
    if (stage_gpus > gpus || stage_gpus * l->pp != gpus) /* stage_gpus <= 2^60, pp <= 64 */
        NO("%s = %.0f, not the %d GPUs", degrees, (double)stage_gpus * l->pp, gpus);
    if (stage_gpus % ((long)l->ep * l->etp) != 0)
        NO("ep x etp = %d x %d must divide %s = %ld (the GPUs of a stage)", l->ep, l->etp,
           l->cp > 1 ? "tp x cp x dp" : "tp x dp", stage_gpus);
    if (m->moe.experts % l->ep != 0)
        NO("ep = %d does not divide the %d experts", l->ep, m->moe.experts);
    if (m->attn.heads % l->tp != 0)
        NO("tp = %d does not divide the %d heads", l->tp, m->attn.heads);
    if (m->attn.type == MDL_ATTN_GQA && m->attn.kv_heads % l->tp != 0 &&
        l->tp % m->attn.kv_heads != 0)
        NO("tp = %d and the %d kv heads do not divide one another", l->tp, m->attn.kv_heads);
    if (m->moe.intermediate % l->etp != 0)
        NO("etp = %d does not divide the expert width %d", l->etp, m->moe.intermediate);
    int stages = l->pp * l->vpp;
    if (l->pp_layout[0]) {
        struct cost_stage *st = malloc(sizeof *st * (size_t)stages);
        if (!st) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        enum moe_status r = cost_pp_layout_parse(l->pp_layout, stages, m->layers, l->mtp, st, err);
        free(st);
        if (r != MOE_OK) return r;
    } else if (m->layers + 2 < stages) {
        NO("%d layers cannot fill pp x vpp = %d stages (the embedding and the loss may take one "
           "each)",
           m->layers, stages);
    }
    if (l->mtp < 0 || l->mtp > MDL_MAX_MTP) NO("mtp = %d (0 .. %d)", l->mtp, MDL_MAX_MTP);
    if (l->recompute_layers < 0) NO("recompute_layers = %d", l->recompute_layers);
    if (l->recompute_layers > m->layers)
        NO("recompute_layers = %d: the model has %d layers", l->recompute_layers, m->layers);
    if (l->recompute_layers > 0 && l->recompute != COST_RECOMPUTE_FULL)
        NO("recompute_layers = %d counts blocks recomputed whole: it goes with recompute=full",
           l->recompute_layers);
    unsigned kept = COST_RC_BIT(COST_OFF_ATTN_NORM) | COST_RC_BIT(COST_OFF_EXPERT_FC1) |
                    COST_RC_BIT(COST_OFF_MOE_ACT);
    if (l->recompute == COST_RECOMPUTE_FULL && (l->act_offload & ~kept)) {
        char mods[160];
        cost_off_modules_format(l->act_offload & ~kept, "+", mods, sizeof mods);
        NO("act_offload=%s under recompute=full: full recompute redoes those from the block's "
           "input; it keeps on the host only attn_norm (the input), expert_fc1 and moe_act",
           mods);
    }
    if (l->act_offload && l->recompute_layers > 0)
        NO("act_offload with recompute_layers = %d: offloading is costed for blocks all kept or "
           "all recomputed (recompute_layers = 0)",
           l->recompute_layers);
    if (l->ep_sms > 0 && l->dispatcher < COST_DISPATCH_DEEPEP)
        NO("ep_sms = %d: only the deepep and hybridep dispatchers run kernels of their own "
           "(dispatcher=%s)",
           l->ep_sms, cost_dispatcher_names[l->dispatcher]);
    if ((cost_layout_rc(l) & COST_RC_BIT(COST_RC_MLA_UP_PROJ)) && m->attn.type != MDL_ATTN_MLA)
        NO("recompute mla_up_proj: %s has no MLA", m->name);
    if (l->gbs % ((long)l->dp * l->mbs) != 0)
        NO("gbs = %d is not a multiple of dp x mbs = %ld", l->gbs, (long)l->dp * l->mbs);
    int mb = cost_layout_micro_batches(l);
    if (l->vpp > 1 && (l->pp == 1 || mb % l->pp != 0))
        NO("interleaving (vpp = %d) needs pp > 1 and micro-batches (%d) a multiple of pp (%d)",
           l->vpp, mb, l->pp);
    if (l->seq_len % l->tp != 0) NO("seq = %d is not a multiple of tp = %d", l->seq_len, l->tp);
    /* context parallelism splits each sequence into 2 x cp chunks, rank i taking chunks i and
     * 2cp-1-i (causal attention's work balanced), each split again over tp */
    if (l->cp > 1 && l->seq_len % (2 * l->cp * l->tp) != 0)
        NO("seq = %d is not a multiple of 2 x cp x tp = %d (context parallelism's chunks)",
           l->seq_len, 2 * l->cp * l->tp);
    if (l->seq_len > m->max_seq_len)
        NO("seq = %d exceeds the model's %d", l->seq_len, m->max_seq_len);
    if (l->dispatcher != COST_DISPATCH_ALLTOALL && l->ep == 1)
        NO("dispatcher=%s needs ep > 1 (with one EP rank every token stays home)",
           cost_dispatcher_names[l->dispatcher]);
    if (l->fp8_params && (l->precision == COST_BF16 || l->zero < 1))
        NO("fp8_params: fp8 weights need an fp8 recipe and a sharded optimizer (zero >= 1)");
    if (!(l->offload >= 0.0 && l->offload <= 1.0)) NO("offload = %g (0 .. 1)", l->offload);
    if (l->offload > 0 && (l->zero < 1 || l->fp8_params))
        NO("offload: the optimizer goes to the CPU from a sharded optimizer (zero >= 1), and not "
           "with fp8_params (Megatron allows that only with the delayed fp8 recipe)");
#undef NO
    return MOE_OK;
}
