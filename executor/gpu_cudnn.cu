/*
 * gpu_cudnn.cu: attention through cuDNN 9's fused flash attention, built with the graph API's
 * backend descriptors (plain C calls; no frontend library). The graph is the one cuDNN's fused
 * attention engines recognise:
 *
 *   S = Q K^T (fp32) -> S x scale -> causal mask (row >= col, else -inf) -> sliding-window mask
 *   (col + window > row) -> max, exp(S - max), sum -> stats = max + log(sum) (kept for the
 *   backward), P = exp / sum -> O = P V (bf16)
 *
 * and, with attention sinks (gpt-oss's learned logit per head), the graph cuDNN's frontend builds
 * for them (cuDNN 9.13 and later; what Transformer Engine runs): the row's max also over its
 * sink, the sum also of exp(sink - max); the backward adds the sinks' gradient. The executor
 * folds the sinks in after a plain forward instead (gk_attn_sinks); calibrate times this graph,
 * the cost of sinks in the stacks the planner predicts.
 *
 * with the layouts of our own kernel (gpu_attention.cu): q (B*S, H, dqk), k (B*S, KV, dqk), v
 * (B*S, KV, dv) and o (B*S, H, dv) bf16, token-major, seen by cuDNN as (b, h, s, d) through
 * strides; K^T is K's strides swapped. cuDNN's stats are natural logs; ours (lse) are base 2, so
 * they are scaled on the way out. Execution plans are built once per shape and stream and kept
 * (a table per process; a cuDNN handle per stream). Without cuDNN at configure time
 * (MOEPLAN_HAVE_CUDNN undefined) every entry says so and the caller keeps our kernel.
 */
#include "gpu_kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef MOEPLAN_HAVE_CUDNN
#include <cudnn.h>

#define CUDNN_PLANS_MAX 256
#define CUDNN_HANDLES_MAX 64
#define CUDNN_OPS_MAX 48
#define CUDNN_DESCS_MAX 256

/* uids of the tensors the caller binds */
enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_SCALE,
    UID_NEG_INF,
    UID_WINDOW,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_ROWSUM,
    UID_DQ_ACC,
    UID_ONE,
    UID_SINK,
    UID_DSINK
};

/* Plans are kept per stream: each has its own workspace and buffers, and its handle (a plan is
 * bound to the handle it was built with) runs only on that stream, so threads driving their own
 * streams on one device never share either. A slot is free while its plan is NULL;
 * gk_cudnn_release frees a stream's slots when its exec_gpu goes. */
struct plan_key {
    cudaStream_t stream;
    int backward, device, B, S, H, KV, dqk, dv, window, deterministic, sinks;
};

/* A plan and what it runs with: its workspace, and for the backward the buffers the graph names
 * (natural-log statistics, rowsum(dO x O), dQ's fp32 accumulator). */
struct plan_entry {
    struct plan_key key;
    cudnnHandle_t handle;
    cudnnBackendDescriptor_t plan;
    void *workspace;
    int64_t workspace_bytes;
    float *stats, *rowsum, *dq_acc;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct plan_entry plans[CUDNN_PLANS_MAX];
static int nplans;
static struct {
    cudaStream_t stream;
    int device;
    cudnnHandle_t h;
} handles[CUDNN_HANDLES_MAX];
static int nhandles;

/* The handle of a stream (created on its first use, under the lock, bound to it). */
static cudnnHandle_t handle_of(const struct plan_key *k, char *why, size_t cap)
{
    for (int i = 0; i < nhandles; i++)
        if (handles[i].stream == k->stream && handles[i].device == k->device) return handles[i].h;
    if (nhandles == CUDNN_HANDLES_MAX) {
        snprintf(why, cap, "cuDNN attention: more than %d streams", CUDNN_HANDLES_MAX);
        return NULL;
    }
    cudnnHandle_t h;
    cudnnStatus_t st = cudnnCreate(&h);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(h, k->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, cap, "cuDNN: a handle for the stream: %s", cudnnGetErrorString(st));
        return NULL;
    }
    handles[nhandles].stream = k->stream, handles[nhandles].device = k->device;
    handles[nhandles++].h = h;
    return h;
}

/* A graph under construction: every descriptor it made (destroyed at the end but the plan), its
 * operations in order, the next virtual uid, and the first failure. */
struct graph {
    cudnnBackendDescriptor_t descs[CUDNN_DESCS_MAX];
    int ndescs;
    cudnnBackendDescriptor_t ops[CUDNN_OPS_MAX];
    int nops;
    int64_t next_uid;
    cudnnStatus_t status;
    char what[160];
};

static bool failed(struct graph *g, cudnnStatus_t st, const char *what)
{
    if (st == CUDNN_STATUS_SUCCESS) return false;
    if (g->status == CUDNN_STATUS_SUCCESS) {
        g->status = st;
        snprintf(g->what, sizeof g->what, "%s: %s", what, cudnnGetErrorString(st));
    }
    return true;
}

static cudnnBackendDescriptor_t make(struct graph *g, cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d = NULL;
    if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->ndescs == CUDNN_DESCS_MAX) {
        failed(g, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors");
        return NULL;
    }
    if (failed(g, cudnnBackendCreateDescriptor(type, &d), "create a descriptor")) return NULL;
    g->descs[g->ndescs++] = d;
    return d;
}

static void set(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *value, const char *what)
{
    if (g->status != CUDNN_STATUS_SUCCESS || !d) return;
    failed(g, cudnnBackendSetAttribute(d, name, type, n, value), what);
}

/* set() of one descriptor-valued attribute, the most common kind. */
static void set_desc(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t v, const char *what)
{
    set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

static void finish(struct graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->status != CUDNN_STATUS_SUCCESS || !d) return;
    failed(g, cudnnBackendFinalize(d), what);
}

/* A tensor: uid < 0 takes the next virtual uid. */
static cudnnBackendDescriptor_t tensor(struct graph *g, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4], bool virt,
                                       bool by_value)
{
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    bool v = virt, bv = by_value;
    if (uid < 0) uid = g->next_uid++;
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual");
    if (by_value)
        set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by value");
    finish(g, t, "tensor");
    return t;
}

static cudnnBackendDescriptor_t scalar(struct graph *g, int64_t uid, cudnnDataType_t type)
{
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, type, one, one, false, true);
}

static void add_op(struct graph *g, cudnnBackendDescriptor_t op)
{
    if (g->status != CUDNN_STATUS_SUCCESS || !op) return;
    if (g->nops == CUDNN_OPS_MAX) {
        failed(g, CUDNN_STATUS_INTERNAL_ERROR, "too many operations");
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b][, t]); axis >= 0 for GEN_INDEX. */
static void pointwise(struct graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                      int64_t axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
    if (axis >= 0)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finish(g, pw, "pointwise");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    finish(g, op, "pointwise op");
    add_op(g, op);
}

static void reduction(struct graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y)
{
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how,
        "reduction operator");
    set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction type");
    finish(g, r, "reduction");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    finish(g, op, "reduction op");
    add_op(g, op);
}

static void matmul(struct graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c)
{
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul type");
    finish(g, m, "matmul");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul op");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    finish(g, op, "matmul op");
    add_op(g, op);
}

static void reshape(struct graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    finish(g, op, "reshape op");
    add_op(g, op);
}

/* y = mode(x[, b]) in fp32 into a new virtual tensor of dims dim (strides stride): y. */
static cudnnBackendDescriptor_t pw(struct graph *g, cudnnPointwiseMode_t mode,
                                   cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                   const int64_t dim[4], const int64_t stride[4])
{
    cudnnBackendDescriptor_t y = tensor(g, -1, CUDNN_DATA_FLOAT, dim, stride, true, false);
    pointwise(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
    return y;
}

/* The causal mask (keep row >= col), then the sliding window's (keep col + window > row), on the
 * scores s (dims sd, strides ss): the masked scores. */
static cudnnBackendDescriptor_t mask(struct graph *g, cudnnBackendDescriptor_t s,
                                     const int64_t sd[4], const int64_t ss[4], int window,
                                     cudnnBackendDescriptor_t neg_inf)
{
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32, BOOL = CUDNN_DATA_BOOLEAN;
    cudnnBackendDescriptor_t row = tensor(g, -1, I, sd, ss, true, false);
    cudnnBackendDescriptor_t col = tensor(g, -1, I, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 2, s, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 3, s, NULL, NULL, col);
    cudnnBackendDescriptor_t keep = tensor(g, -1, BOOL, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, BOOL, -1, row, col, NULL, keep);
    cudnnBackendDescriptor_t out = tensor(g, -1, F, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, s, neg_inf, keep, out);
    if (window <= 0) return out;
    cudnnBackendDescriptor_t w = scalar(g, UID_WINDOW, F);
    cudnnBackendDescriptor_t row2 = tensor(g, -1, I, sd, ss, true, false);
    cudnnBackendDescriptor_t col2 = tensor(g, -1, I, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 2, out, NULL, NULL, row2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, 3, out, NULL, NULL, col2);
    cudnnBackendDescriptor_t colw = tensor(g, -1, F, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_ADD, F, -1, col2, w, NULL, colw);
    cudnnBackendDescriptor_t keep2 = tensor(g, -1, BOOL, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_CMP_GT, BOOL, -1, colw, row2, NULL, keep2);
    cudnnBackendDescriptor_t out2 = tensor(g, -1, F, sd, ss, true, false);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, out, neg_inf, keep2, out2);
    return out2;
}

/* g's operations as a graph, and a plan from the first engine config that takes it (heuristics
 * mode A, then the fallback list); NULL with g's reason. */
static cudnnBackendDescriptor_t plan_of(struct graph *g, cudnnHandle_t h, int64_t *workspace)
{
    cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
        "graph ops");
    set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "graph handle");
    finish(g, graph, "the operation graph");
    cudnnBackendDescriptor_t plan = NULL;
    static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !plan && g->status == CUDNN_STATUS_SUCCESS; mi++) {
        cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set_desc(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi],
            "heuristics mode");
        finish(g, heur, "heuristics");
        int64_t count = 0, got = 0;
        if (g->status != CUDNN_STATUS_SUCCESS ||
            failed(g,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
                   "heuristics results"))
            break;
        cudnnBackendDescriptor_t cfg[8];
        if (count > 8) count = 8;
        for (int64_t i = 0; i < count; i++) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g->status != CUDNN_STATUS_SUCCESS ||
            failed(g,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg),
                   "heuristics configs"))
            break;
        for (int64_t i = 0; i < got && !plan; i++) {
            cudnnBackendDescriptor_t pl;
            int64_t one;
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &pl) !=
                CUDNN_STATUS_SUCCESS)
                continue;
            if (cudnnBackendSetAttribute(pl, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                         &h) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendSetAttribute(pl, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                         &cfg[i]) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendFinalize(pl) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendGetAttribute(pl, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &one,
                                         workspace) == CUDNN_STATUS_SUCCESS)
                plan = pl;
            else
                cudnnBackendDestroyDescriptor(pl);
        }
    }
    if (!plan && g->status == CUDNN_STATUS_SUCCESS)
        snprintf(g->what, sizeof g->what, "no cuDNN engine takes this attention");
    return plan;
}

/* The layouts, (b, h, s, d) over our token-major buffers. */
struct dims {
    int64_t q[4], qs[4]; /* Q, dQ, and O, dO with dv (o, os) */
    int64_t o[4], os[4];
    int64_t kt[4], kts[4]; /* K^T: K's strides, the last two swapped */
    int64_t k[4], ks[4];   /* K, dK */
    int64_t vt[4], vts[4]; /* V^T */
    int64_t v[4], vs[4];   /* V, dV */
    int64_t s[4], ss[4];   /* scores (b, h, s_q, s_kv) */
    int64_t r[4], rs[4];   /* one per query row */
    int64_t h[4], hs[4];   /* one per head (the sinks) */
};

static void layouts(const struct plan_key *k, struct dims *d)
{
    const int64_t B = k->B, S = k->S, H = k->H, KV = k->KV, dq = k->dqk, dv = k->dv;
    const int64_t q[4] = {B, H, S, dq}, qs[4] = {S * H * dq, dq, H * dq, 1};
    const int64_t o[4] = {B, H, S, dv}, os[4] = {S * H * dv, dv, H * dv, 1};
    const int64_t kk[4] = {B, KV, S, dq}, ks[4] = {S * KV * dq, dq, KV * dq, 1};
    const int64_t v[4] = {B, KV, S, dv}, vs[4] = {S * KV * dv, dv, KV * dv, 1};
    const int64_t s[4] = {B, H, S, S}, ss[4] = {H * S * S, S * S, S, 1};
    const int64_t r[4] = {B, H, S, 1}, rs[4] = {H * S, S, 1, 1};
    const int64_t hh[4] = {1, H, 1, 1}, hs[4] = {H, 1, 1, 1};
    for (int i = 0; i < 4; i++) {
        d->q[i] = q[i], d->qs[i] = qs[i], d->o[i] = o[i], d->os[i] = os[i];
        d->k[i] = kk[i], d->ks[i] = ks[i], d->v[i] = v[i], d->vs[i] = vs[i];
        d->kt[i] = kk[i], d->kts[i] = ks[i], d->vt[i] = v[i], d->vts[i] = vs[i];
        d->s[i] = s[i], d->ss[i] = ss[i], d->r[i] = r[i], d->rs[i] = rs[i];
        d->h[i] = hh[i], d->hs[i] = hs[i];
    }
    int64_t t;
    t = d->kt[2], d->kt[2] = d->kt[3], d->kt[3] = t, t = d->kts[2], d->kts[2] = d->kts[3];
    d->kts[3] = t;
    t = d->vt[2], d->vt[2] = d->vt[3], d->vt[3] = t, t = d->vts[2], d->vts[2] = d->vts[3];
    d->vts[3] = t;
}

/* Forward: S = Q K^T x scale, masked; stats = max + log(sum exp); O = softmax(S) V. With sinks,
 * the max and the sum take each head's sink as one more score (a column with no value). */
static void graph_forward(struct graph *g, const struct plan_key *k)
{
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;
    struct dims d;
    layouts(k, &d);
    cudnnBackendDescriptor_t q = tensor(g, UID_Q, BF, d.q, d.qs, false, false);
    cudnnBackendDescriptor_t kt = tensor(g, UID_K, BF, d.kt, d.kts, false, false);
    cudnnBackendDescriptor_t v = tensor(g, UID_V, BF, d.v, d.vs, false, false);
    cudnnBackendDescriptor_t o = tensor(g, UID_O, BF, d.o, d.os, false, false);
    cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, F, d.r, d.rs, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, UID_SCALE, F);
    cudnnBackendDescriptor_t neg_inf = scalar(g, UID_NEG_INF, F);
    cudnnBackendDescriptor_t s0 = tensor(g, -1, F, d.s, d.ss, true, false);
    matmul(g, q, kt, s0);
    cudnnBackendDescriptor_t s1 = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s0, scale, NULL, s1);
    cudnnBackendDescriptor_t s2 = mask(g, s1, d.s, d.ss, k->window, neg_inf);
    cudnnBackendDescriptor_t sink =
        k->sinks ? tensor(g, UID_SINK, F, d.h, d.hs, false, false) : NULL;
    cudnnBackendDescriptor_t mx = tensor(g, -1, F, d.r, d.rs, true, false);
    if (sink) {
        cudnnBackendDescriptor_t mx0 = tensor(g, -1, F, d.r, d.rs, true, false);
        reduction(g, CUDNN_REDUCE_TENSOR_MAX, s2, mx0);
        pointwise(g, CUDNN_POINTWISE_MAX, F, -1, mx0, sink, NULL, mx);
    } else {
        reduction(g, CUDNN_REDUCE_TENSOR_MAX, s2, mx);
    }
    cudnnBackendDescriptor_t sub = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s2, mx, NULL, sub);
    cudnnBackendDescriptor_t e = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_EXP, F, -1, sub, NULL, NULL, e);
    cudnnBackendDescriptor_t sum = tensor(g, -1, F, d.r, d.rs, true, false);
    if (sink) {
        cudnnBackendDescriptor_t sexp =
            pw(g, CUDNN_POINTWISE_EXP, pw(g, CUDNN_POINTWISE_SUB, sink, mx, d.r, d.rs), NULL, d.r,
               d.rs); /* exp(sink - max) */
        cudnnBackendDescriptor_t sum0 = tensor(g, -1, F, d.r, d.rs, true, false);
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum0);
        pointwise(g, CUDNN_POINTWISE_ADD, F, -1, sum0, sexp, NULL, sum);
    } else {
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    }
    cudnnBackendDescriptor_t lg = tensor(g, -1, F, d.r, d.rs, true, false);
    pointwise(g, CUDNN_POINTWISE_LOG, F, -1, sum, NULL, NULL, lg);
    pointwise(g, CUDNN_POINTWISE_ADD, F, -1, mx, lg, NULL, stats);
    cudnnBackendDescriptor_t p = tensor(g, -1, BF, d.s, d.ss, true, false); /* V's type */
    pointwise(g, CUDNN_POINTWISE_DIV, F, -1, e, sum, NULL, p);
    matmul(g, p, v, o);
}

/* dX of the heads of a KV group summed into its KV head: a matmul over the query heads into a
 * virtual (b, H, s, d) tensor, then a sum over the group; or straight into x without GQA. */
static void into_kv_heads(struct graph *g, const struct plan_key *k, cudnnBackendDescriptor_t a,
                          cudnnBackendDescriptor_t b, int64_t dim, cudnnBackendDescriptor_t x)
{
    if (k->H == k->KV) {
        matmul(g, a, b, x);
        return;
    }
    const int64_t S = k->S, H = k->H;
    const int64_t fd[4] = {k->B, H, S, dim}, fs[4] = {H * S * dim, S * dim, dim, 1};
    cudnnBackendDescriptor_t full = tensor(g, -1, CUDNN_DATA_BFLOAT16, fd, fs, true, false);
    matmul(g, a, b, full);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, x);
}

/* Backward: rowsum = sum(dO x O); P = exp(S x scale - stats) masked; dV = P^T dO; dS = P x (dO
 * V^T - rowsum) x scale; dK = dS^T Q; dQ = dS K, accumulated in fp32 (the engine's buffer: its
 * blocks add into it atomically, in whatever order they finish, so the bits of dQ can change from
 * run to run), or, deterministic, written by the matmul itself (what cuDNN's frontend builds for
 * its deterministic backward, the dP-workspace engine: the same bits every run, checked by the
 * tests). The engines write dQ, dK and dV in bf16 (their head-group sums must be 16-bit). With
 * sinks the statistics already hold them, so P and dS are unchanged; the sinks' gradient is
 * added as cuDNN's frontend describes it (a sum over rows of exp(sink - stats) x rowsum(dO x
 * O)); the engine that takes the pattern writes the gradient with its sign, -sum p_sink (dO . O)
 * (measured: test_cudnn_sinks holds it to the reference's). */
static void graph_backward(struct graph *g, const struct plan_key *k)
{
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;
    const int64_t B = k->B, S = k->S, H = k->H, dq = k->dqk, dv = k->dv;
    struct dims d;
    layouts(k, &d);
    cudnnBackendDescriptor_t q = tensor(g, UID_Q, BF, d.q, d.qs, false, false);
    cudnnBackendDescriptor_t kt = tensor(g, UID_K, BF, d.kt, d.kts, false, false);
    cudnnBackendDescriptor_t vt = tensor(g, UID_V, BF, d.vt, d.vts, false, false);
    cudnnBackendDescriptor_t o = tensor(g, UID_O, BF, d.o, d.os, false, false);
    cudnnBackendDescriptor_t dout = tensor(g, UID_DO, BF, d.o, d.os, false, false);
    cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, F, d.r, d.rs, false, false);
    cudnnBackendDescriptor_t dqo = tensor(g, UID_DQ, BF, d.q, d.qs, false, false);
    cudnnBackendDescriptor_t dko = tensor(g, UID_DK, BF, d.k, d.ks, false, false);
    cudnnBackendDescriptor_t dvo = tensor(g, UID_DV, BF, d.v, d.vs, false, false);
    cudnnBackendDescriptor_t rowsum = tensor(g, UID_ROWSUM, F, d.r, d.rs, false, false);
    /* dQ's fp32 accumulator, (b, h, s, d) contiguous as the engines want it */
    const int64_t ad[4] = {B, H, S, dq}, as[4] = {H * S * dq, S * dq, dq, 1};
    cudnnBackendDescriptor_t acc = tensor(g, UID_DQ_ACC, F, ad, as, false, false);
    cudnnBackendDescriptor_t scale = scalar(g, UID_SCALE, F);
    cudnnBackendDescriptor_t neg_inf = scalar(g, UID_NEG_INF, F);
    cudnnBackendDescriptor_t one = scalar(g, UID_ONE, F);
    /* rowsum(dO x O) */
    const int64_t md[4] = {B, H, S, dv}, ms[4] = {H * S * dv, S * dv, H * dv, 1};
    cudnnBackendDescriptor_t prod = tensor(g, -1, F, md, ms, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, dout, o, NULL, prod);
    cudnnBackendDescriptor_t red = tensor(g, -1, F, d.r, d.rs, true, false);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, prod, red);
    if (k->sinks) {
        cudnnBackendDescriptor_t sink = tensor(g, UID_SINK, F, d.h, d.hs, false, false);
        cudnnBackendDescriptor_t dsink = tensor(g, UID_DSINK, F, d.h, d.hs, false, false);
        cudnnBackendDescriptor_t p_sink =
            pw(g, CUDNN_POINTWISE_EXP, pw(g, CUDNN_POINTWISE_SUB, sink, stats, d.r, d.rs), NULL,
               d.r, d.rs); /* exp(sink - stats) */
        reduction(g, CUDNN_REDUCE_TENSOR_ADD, pw(g, CUDNN_POINTWISE_MUL, p_sink, red, d.r, d.rs),
                  dsink);
    }
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, red, one, NULL, rowsum);
    /* P again, from the statistics */
    cudnnBackendDescriptor_t s0 = tensor(g, -1, F, d.s, d.ss, true, false);
    matmul(g, q, kt, s0);
    cudnnBackendDescriptor_t s1 = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, s0, scale, NULL, s1);
    cudnnBackendDescriptor_t s2 = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, s1, stats, NULL, s2);
    cudnnBackendDescriptor_t s3 = mask(g, s2, d.s, d.ss, k->window, neg_inf);
    cudnnBackendDescriptor_t p = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_EXP, F, -1, s3, NULL, NULL, p);
    /* dV = P^T dO */
    const int64_t td[4] = {B, H, S, S}, ts[4] = {H * S * S, S * S, 1, S};
    cudnnBackendDescriptor_t pt = tensor(g, -1, BF, td, ts, true, false);
    reshape(g, p, pt);
    into_kv_heads(g, k, pt, dout, dv, dvo);
    /* dS = P x (dO V^T - rowsum) x scale */
    cudnnBackendDescriptor_t dp = tensor(g, -1, F, d.s, d.ss, true, false);
    matmul(g, dout, vt, dp);
    cudnnBackendDescriptor_t dp2 = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_SUB, F, -1, dp, rowsum, NULL, dp2);
    cudnnBackendDescriptor_t ds0 = tensor(g, -1, F, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, dp2, p, NULL, ds0);
    cudnnBackendDescriptor_t ds = tensor(g, -1, BF, d.s, d.ss, true, false);
    pointwise(g, CUDNN_POINTWISE_MUL, F, -1, ds0, scale, NULL, ds);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = tensor(g, -1, BF, td, ts, true, false);
    reshape(g, ds, dst);
    into_kv_heads(g, k, dst, q, dq, dko);
    /* dQ = dS K */
    cudnnBackendDescriptor_t kk = tensor(g, -1, BF, d.k, d.ks, true, false);
    reshape(g, kt, kk);
    if (k->deterministic) {
        matmul(g, ds, kk, dqo);
        return;
    }
    matmul(g, ds, kk, acc);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, F, -1, acc, NULL, NULL, dqo);
}

/* The plan of this shape and direction on this device, built the first time (under the lock). */
static struct plan_entry *plan_for(const struct plan_key *key, char *why, size_t cap)
{
    int slot = nplans;
    for (int i = 0; i < nplans; i++) {
        if (plans[i].plan && !memcmp(&plans[i].key, key, sizeof *key)) return &plans[i];
        if (!plans[i].plan && slot == nplans) slot = i;
    }
    if (slot == CUDNN_PLANS_MAX) {
        snprintf(why, cap, "cuDNN attention: more than %d shapes and streams", CUDNN_PLANS_MAX);
        return NULL;
    }
    static struct graph g;
    memset(&g, 0, sizeof g);
    g.next_uid = 100;
    if (key->backward)
        graph_backward(&g, key);
    else
        graph_forward(&g, key);
    struct plan_entry *e = &plans[slot];
    memset(e, 0, sizeof *e);
    e->key = *key;
    e->handle = handle_of(key, why, cap);
    if (!e->handle) return NULL;
    e->plan = plan_of(&g, e->handle, &e->workspace_bytes);
    for (int i = 0; i < g.ndescs; i++) cudnnBackendDestroyDescriptor(g.descs[i]);
    if (!e->plan) {
        snprintf(why, cap, "cuDNN attention %s (B %d, S %d, H %d/%d, d %d/%d, window %d%s): %s",
                 key->backward ? "backward" : "forward", key->B, key->S, key->H, key->KV, key->dqk,
                 key->dv, key->window, key->sinks ? ", sinks (cuDNN 9.13 and later)" : "", g.what);
        return NULL;
    }
    size_t rows = (size_t)key->B * key->H * key->S;
    bool ok = e->workspace_bytes <= 0 || !cudaMalloc(&e->workspace, (size_t)e->workspace_bytes);
    if (ok && key->backward)
        ok = !cudaMalloc((void **)&e->stats, rows * sizeof(float)) &&
             !cudaMalloc((void **)&e->rowsum, rows * sizeof(float)) &&
             (key->deterministic ||
              !cudaMalloc((void **)&e->dq_acc, rows * key->dqk * sizeof(float)));
    if (!ok) {
        (void)cudaGetLastError(); /* the failed allocation's error is not the next kernel's */
        cudaFree(e->workspace), cudaFree(e->stats), cudaFree(e->rowsum), cudaFree(e->dq_acc);
        cudnnBackendDestroyDescriptor(e->plan);
        snprintf(why, cap, "cuDNN attention: no device memory for its workspace (%lld bytes)",
                 (long long)e->workspace_bytes);
        memset(e, 0, sizeof *e); /* the slot stays free */
        return NULL;
    }
    if (slot == nplans) nplans++;
    return e;
}

static bool key_of(int backward, int B, int S, int H, int KV, int dqk, int dv, int window,
                   bool sinks, bool deterministic, cudaStream_t s, struct plan_key *key, char *why,
                   size_t cap)
{
    memset(key, 0, sizeof *key);
    key->stream = s;
    if (cudaGetDevice(&key->device)) {
        snprintf(why, cap, "cuDNN attention: no current device");
        return false;
    }
    key->backward = backward, key->B = B, key->S = S, key->H = H, key->KV = KV;
    key->dqk = dqk, key->dv = dv, key->window = window > 0 ? window : 0;
    key->deterministic = backward && deterministic;
    key->sinks = sinks;
    return true;
}

/* Bind the variant pack (uids[i] -> ptrs[i]) and run the plan on stream s. */
static bool execute(struct plan_entry *e, int n, const int64_t *uids, void **ptrs, char *why,
                    size_t cap)
{
    cudnnHandle_t h = e->handle;
    cudnnBackendDescriptor_t pack;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st == CUDNN_STATUS_SUCCESS) {
        void *ws = e->workspace;
        if ((st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                           CUDNN_TYPE_INT64, n, uids)) == CUDNN_STATUS_SUCCESS &&
            (st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                           CUDNN_TYPE_VOID_PTR, n, ptrs)) == CUDNN_STATUS_SUCCESS &&
            (st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                           CUDNN_TYPE_VOID_PTR, 1, &ws)) == CUDNN_STATUS_SUCCESS &&
            (st = cudnnBackendFinalize(pack)) == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendExecute(h, e->plan, pack);
        cudnnBackendDestroyDescriptor(pack);
    }
    if (st != CUDNN_STATUS_SUCCESS)
        snprintf(why, cap, "cuDNN attention: execute: %s", cudnnGetErrorString(st));
    return st == CUDNN_STATUS_SUCCESS;
}

__global__ void k_scale(const float *x, float *y, size_t n, float f)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * f;
}

static bool rescale(const float *x, float *y, size_t n, float f, cudaStream_t s, char *why,
                    size_t cap)
{
    k_scale<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, y, n, f);
    if (cudaGetLastError() == cudaSuccess) return true;
    snprintf(why, cap, "cuDNN attention: the statistics' rescale did not launch");
    return false;
}

bool gk_cudnn_forward(const bf16 *q, const bf16 *k, const bf16 *v, int B, int S, int H, int KV,
                      int dqk, int dv, int window, const float *sink, bf16 *o, float *lse,
                      cudaStream_t s, char *why, size_t cap)
{
    struct plan_key key;
    if (!key_of(0, B, S, H, KV, dqk, dv, window, sink != NULL, false, s, &key, why, cap))
        return false;
    pthread_mutex_lock(&lock);
    struct plan_entry *e = plan_for(&key, why, cap);
    pthread_mutex_unlock(&lock);
    if (!e) return false;
    float scale = 1.0f / sqrtf((float)dqk), neg_inf = -INFINITY, win = (float)key.window;
    int64_t uids[9] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[9] = {(void *)q, (void *)k, (void *)v, o, lse, &scale, &neg_inf};
    int n = 7;
    if (key.window > 0) uids[n] = UID_WINDOW, ptrs[n++] = &win;
    if (sink) uids[n] = UID_SINK, ptrs[n++] = (void *)sink;
    if (!execute(e, n, uids, ptrs, why, cap)) return false;
    /* natural log -> base 2, as our backward reads it */
    return rescale(lse, lse, (size_t)B * H * S, (float)M_LOG2E, s, why, cap);
}

/* bf16 -> fp32 */
__global__ void k_widen(const bf16 *x, float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat162float(x[i]);
}

bool gk_cudnn_backward(const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *o, const bf16 *dout,
                       const float *lse, int B, int S, int H, int KV, int dqk, int dv, int window,
                       const float *sink, float *dsink, bool deterministic, float *dq, float *dk,
                       float *dvo, bf16 *scratch_q, bf16 *scratch_k, bf16 *scratch_v,
                       cudaStream_t s, char *why, size_t cap)
{
    struct plan_key key;
    if (!sink != !dsink) {
        snprintf(why, cap, "cuDNN attention: sinks and their gradient go together");
        return false;
    }
    if (!key_of(1, B, S, H, KV, dqk, dv, window, sink != NULL, deterministic, s, &key, why, cap))
        return false;
    pthread_mutex_lock(&lock);
    struct plan_entry *e = plan_for(&key, why, cap);
    pthread_mutex_unlock(&lock);
    if (!e) return false;
    size_t rows = (size_t)B * H * S, nq = rows * dqk, nk = (size_t)B * S * KV * dqk,
           nv = (size_t)B * S * KV * dv;
    if (!rescale(lse, e->stats, rows, (float)M_LN2, s, why, cap)) return false;
    if (!deterministic && cudaMemsetAsync(e->dq_acc, 0, nq * sizeof(float), s)) {
        snprintf(why, cap, "cuDNN attention: clearing dQ's accumulator failed");
        return false;
    }
    float scale = 1.0f / sqrtf((float)dqk), neg_inf = -INFINITY, one = 1.0f,
          win = (float)key.window;
    int64_t uids[17] = {UID_Q,  UID_K,  UID_V,      UID_O,     UID_DO,      UID_STATS, UID_DQ,
                        UID_DK, UID_DV, UID_ROWSUM, UID_SCALE, UID_NEG_INF, UID_ONE};
    void *ptrs[17] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, e->stats, scratch_q,
                      scratch_k, scratch_v, e->rowsum, &scale,    &neg_inf,     &one};
    int n = 13;
    if (!deterministic) uids[n] = UID_DQ_ACC, ptrs[n++] = e->dq_acc;
    if (key.window > 0) uids[n] = UID_WINDOW, ptrs[n++] = &win;
    if (sink) uids[n] = UID_SINK, ptrs[n++] = (void *)sink, uids[n] = UID_DSINK, ptrs[n++] = dsink;
    if (!execute(e, n, uids, ptrs, why, cap)) return false;
    if (dq) {
        k_widen<<<(unsigned)((nq + 255) / 256), 256, 0, s>>>(scratch_q, dq, nq);
        k_widen<<<(unsigned)((nk + 255) / 256), 256, 0, s>>>(scratch_k, dk, nk);
        k_widen<<<(unsigned)((nv + 255) / 256), 256, 0, s>>>(scratch_v, dvo, nv);
    }
    if (cudaGetLastError() == cudaSuccess) return true;
    snprintf(why, cap, "cuDNN attention: the gradients' copies did not launch");
    return false;
}

void gk_cudnn_release(cudaStream_t s)
{
    pthread_mutex_lock(&lock);
    /* the slots are emptied in place, not compacted: other threads hold pointers to their own */
    for (int i = 0; i < nplans; i++) {
        struct plan_entry *e = &plans[i];
        if (!e->plan || e->key.stream != s) continue;
        cudnnBackendDestroyDescriptor(e->plan);
        cudaFree(e->workspace), cudaFree(e->stats), cudaFree(e->rowsum), cudaFree(e->dq_acc);
        memset(e, 0, sizeof *e);
    }
    int k = 0;
    for (int i = 0; i < nhandles; i++) {
        if (handles[i].stream != s) {
            handles[k++] = handles[i];
            continue;
        }
        cudnnDestroy(handles[i].h);
    }
    nhandles = k;
    pthread_mutex_unlock(&lock);
}

const char *gk_cudnn_version(char *buf, size_t cap)
{
    size_t v = cudnnGetVersion();
    snprintf(buf, cap, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    return buf;
}

#else /* no cuDNN at configure time */

static bool none(char *why, size_t cap)
{
    snprintf(why, cap,
             "this build has no cuDNN (MOEPLAN_CUDNN=OFF or none found at configure "
             "time)");
    return false;
}

bool gk_cudnn_forward(const bf16 *, const bf16 *, const bf16 *, int, int, int, int, int, int, int,
                      const float *, bf16 *, float *, cudaStream_t, char *why, size_t cap)
{
    return none(why, cap);
}

bool gk_cudnn_backward(const bf16 *, const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                       const float *, int, int, int, int, int, int, int, const float *, float *,
                       bool, float *, float *, float *, bf16 *, bf16 *, bf16 *, cudaStream_t,
                       char *why, size_t cap)
{
    return none(why, cap);
}

void gk_cudnn_release(cudaStream_t) {}

const char *gk_cudnn_version(char *buf, size_t cap)
{
    snprintf(buf, cap, "none (not built with cuDNN)");
    return buf;
}

#endif
