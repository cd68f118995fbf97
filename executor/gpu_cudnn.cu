/*
 * gpu_cudnn.cu: attention through cuDNN 9's fused flash attention, built with the graph API's
 * backend descriptors (plain C calls; no frontend library). The graph is the one cuDNN's fused
 * attention engines recognise:
 *
 *   S = Q K^T (fp32) -> S x scale -> causal mask (row >= col, else -inf) -> sliding-window mask
 *   (col + window > row) -> max, exp(S - max), sum -> stats = max + log(sum) (kept for the
 *   backward), P = exp / sum -> O = P V (bf16)
 *
 * with the layouts of our own kernel (gpu_attention.cu): q (B*S, H, dqk), k (B*S, KV, dqk), v
 * (B*S, KV, dv) and o (B*S, H, dv) bf16, token-major, seen by cuDNN as (b, h, s, d) through
 * strides; K^T is K's strides swapped. cuDNN's stats are natural logs; ours (lse) are base 2, so
 * they are scaled on the way out. Execution plans are built once per shape and kept (a small
 * table per process, one cuDNN handle per device). Without cuDNN at configure time
 * (MOEPLAN_HAVE_CUDNN undefined) every entry says so and the caller keeps our kernel.
 */
#include "gpu_kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef MOEPLAN_HAVE_CUDNN
#include <cudnn.h>

#define CUDNN_PLANS_MAX 32
#define CUDNN_OPS_MAX 48
#define CUDNN_DESCS_MAX 160

/* uids of the tensors the caller binds */
enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_WINDOW };

struct plan_key {
    int device, B, S, H, KV, dqk, dv, window;
};

struct plan_entry {
    struct plan_key key;
    cudnnBackendDescriptor_t plan;
    void *workspace;
    int64_t workspace_bytes;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct plan_entry plans[CUDNN_PLANS_MAX];
static int nplans;
static cudnnHandle_t handles[64];

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
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        "pointwise op");
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "pointwise x");
    if (b)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b,
            "pointwise b");
    if (t)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t,
            "pointwise t");
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "pointwise y");
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
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r,
        "reduction op");
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reduction x");
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reduction y");
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
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, "matmul op");
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    finish(g, op, "matmul op");
    add_op(g, op);
}

/* The forward graph of one shape, its plan finalized on the first engine config that takes it. */
static cudnnBackendDescriptor_t build_forward(cudnnHandle_t h, const struct plan_key *k,
                                              int64_t *workspace, char *why, size_t cap)
{
    static struct graph g; /* under the lock */
    memset(&g, 0, sizeof g);
    g.next_uid = 100;
    const int64_t B = k->B, S = k->S, H = k->H, KV = k->KV, dq = k->dqk, dv = k->dv;
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16, I = CUDNN_DATA_INT32,
                          BOOL = CUDNN_DATA_BOOLEAN;
    int64_t qd[4] = {B, H, S, dq}, qs[4] = {S * H * dq, dq, H * dq, 1};
    int64_t kd[4] = {B, KV, dq, S}, ks[4] = {S * KV * dq, dq, 1, KV * dq}; /* K^T */
    int64_t vd[4] = {B, KV, S, dv}, vs[4] = {S * KV * dv, dv, KV * dv, 1};
    int64_t od[4] = {B, H, S, dv}, os[4] = {S * H * dv, dv, H * dv, 1};
    int64_t sd[4] = {B, H, S, S}, ss[4] = {H * S * S, S * S, S, 1};
    int64_t rd[4] = {B, H, S, 1}, rs[4] = {H * S, S, 1, 1};
    cudnnBackendDescriptor_t q = tensor(&g, UID_Q, BF, qd, qs, false, false);
    cudnnBackendDescriptor_t kt = tensor(&g, UID_K, BF, kd, ks, false, false);
    cudnnBackendDescriptor_t v = tensor(&g, UID_V, BF, vd, vs, false, false);
    cudnnBackendDescriptor_t o = tensor(&g, UID_O, BF, od, os, false, false);
    cudnnBackendDescriptor_t stats = tensor(&g, UID_STATS, F, rd, rs, false, false);
    cudnnBackendDescriptor_t scale = scalar(&g, UID_SCALE, F);
    cudnnBackendDescriptor_t neg_inf = scalar(&g, UID_NEG_INF, F);

    cudnnBackendDescriptor_t s0 = tensor(&g, -1, F, sd, ss, true, false);
    matmul(&g, q, kt, s0);
    cudnnBackendDescriptor_t s1 = tensor(&g, -1, F, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_MUL, F, -1, s0, scale, NULL, s1);
    /* causal: keep row >= col */
    cudnnBackendDescriptor_t row = tensor(&g, -1, I, sd, ss, true, false);
    cudnnBackendDescriptor_t col = tensor(&g, -1, I, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, 2, s1, NULL, NULL, row);
    pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, 3, s1, NULL, NULL, col);
    cudnnBackendDescriptor_t keep = tensor(&g, -1, BOOL, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_CMP_GE, BOOL, -1, row, col, NULL, keep);
    cudnnBackendDescriptor_t s2 = tensor(&g, -1, F, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, s1, neg_inf, keep, s2);
    if (k->window > 0) { /* keep col + window > row */
        cudnnBackendDescriptor_t w = scalar(&g, UID_WINDOW, F);
        cudnnBackendDescriptor_t row2 = tensor(&g, -1, I, sd, ss, true, false);
        cudnnBackendDescriptor_t col2 = tensor(&g, -1, I, sd, ss, true, false);
        pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, 2, s2, NULL, NULL, row2);
        pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, 3, s2, NULL, NULL, col2);
        cudnnBackendDescriptor_t colw = tensor(&g, -1, F, sd, ss, true, false);
        pointwise(&g, CUDNN_POINTWISE_ADD, F, -1, col2, w, NULL, colw);
        cudnnBackendDescriptor_t keep2 = tensor(&g, -1, BOOL, sd, ss, true, false);
        pointwise(&g, CUDNN_POINTWISE_CMP_GT, BOOL, -1, colw, row2, NULL, keep2);
        cudnnBackendDescriptor_t s3 = tensor(&g, -1, F, sd, ss, true, false);
        pointwise(&g, CUDNN_POINTWISE_BINARY_SELECT, F, -1, s2, neg_inf, keep2, s3);
        s2 = s3;
    }
    /* softmax, its statistics kept */
    cudnnBackendDescriptor_t mx = tensor(&g, -1, F, rd, rs, true, false);
    reduction(&g, CUDNN_REDUCE_TENSOR_MAX, s2, mx);
    cudnnBackendDescriptor_t sub = tensor(&g, -1, F, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_SUB, F, -1, s2, mx, NULL, sub);
    cudnnBackendDescriptor_t e = tensor(&g, -1, F, sd, ss, true, false);
    pointwise(&g, CUDNN_POINTWISE_EXP, F, -1, sub, NULL, NULL, e);
    cudnnBackendDescriptor_t sum = tensor(&g, -1, F, rd, rs, true, false);
    reduction(&g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t lg = tensor(&g, -1, F, rd, rs, true, false);
    pointwise(&g, CUDNN_POINTWISE_LOG, F, -1, sum, NULL, NULL, lg);
    pointwise(&g, CUDNN_POINTWISE_ADD, F, -1, mx, lg, NULL, stats);
    cudnnBackendDescriptor_t p = tensor(&g, -1, BF, sd, ss, true, false); /* V's type */
    pointwise(&g, CUDNN_POINTWISE_DIV, F, -1, e, sum, NULL, p);
    matmul(&g, p, v, o);

    cudnnBackendDescriptor_t graph = make(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops,
        "graph ops");
    set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "graph handle");
    finish(&g, graph, "the operation graph");

    cudnnBackendDescriptor_t plan = NULL;
    static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !plan && g.status == CUDNN_STATUS_SUCCESS; mi++) {
        cudnnBackendDescriptor_t heur = make(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &graph, "heuristics graph");
        set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi],
            "heuristics mode");
        finish(&g, heur, "heuristics");
        int64_t count = 0;
        if (g.status != CUDNN_STATUS_SUCCESS) break;
        if (failed(&g,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
                   "heuristics results"))
            break;
        cudnnBackendDescriptor_t cfg[8];
        if (count > 8) count = 8;
        for (int64_t i = 0; i < count; i++) cfg[i] = make(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        int64_t got = 0;
        if (g.status != CUDNN_STATUS_SUCCESS ||
            failed(&g,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg),
                   "heuristics configs"))
            break;
        for (int64_t i = 0; i < got && !plan; i++) {
            cudnnBackendDescriptor_t pl;
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
                                         CUDNN_TYPE_INT64, 1, &got,
                                         workspace) == CUDNN_STATUS_SUCCESS)
                plan = pl;
            else
                cudnnBackendDestroyDescriptor(pl);
        }
    }
    if (!plan && g.status == CUDNN_STATUS_SUCCESS)
        snprintf(g.what, sizeof g.what, "no cuDNN engine takes this attention");
    if (!plan)
        snprintf(why, cap, "cuDNN attention (B %lld, S %lld, H %lld/%lld, d %lld/%lld): %s",
                 (long long)B, (long long)S, (long long)H, (long long)KV, (long long)dq,
                 (long long)dv, g.what);
    for (int i = 0; i < g.ndescs; i++) cudnnBackendDestroyDescriptor(g.descs[i]);
    return plan;
}

/* The plan of this shape on this device, built the first time. */
static struct plan_entry *forward_plan(const struct plan_key *key, char *why, size_t cap)
{
    for (int i = 0; i < nplans; i++)
        if (!memcmp(&plans[i].key, key, sizeof *key)) return &plans[i];
    if (nplans == CUDNN_PLANS_MAX) {
        snprintf(why, cap, "cuDNN attention: more than %d shapes", CUDNN_PLANS_MAX);
        return NULL;
    }
    if (key->device < 0 || key->device >= 64) {
        snprintf(why, cap, "cuDNN attention: device %d", key->device);
        return NULL;
    }
    if (!handles[key->device]) {
        cudnnStatus_t st = cudnnCreate(&handles[key->device]);
        if (st != CUDNN_STATUS_SUCCESS) {
            handles[key->device] = NULL;
            snprintf(why, cap, "cuDNN: cudnnCreate: %s", cudnnGetErrorString(st));
            return NULL;
        }
    }
    struct plan_entry *e = &plans[nplans];
    memset(e, 0, sizeof *e);
    e->key = *key;
    e->plan = build_forward(handles[key->device], key, &e->workspace_bytes, why, cap);
    if (!e->plan) return NULL;
    if (e->workspace_bytes > 0 && cudaMalloc(&e->workspace, (size_t)e->workspace_bytes)) {
        cudnnBackendDestroyDescriptor(e->plan);
        snprintf(why, cap, "cuDNN attention: no memory for a %lld-byte workspace",
                 (long long)e->workspace_bytes);
        return NULL;
    }
    nplans++;
    return e;
}

__global__ void k_scale(float *x, size_t n, float f)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

bool gk_cudnn_forward(const bf16 *q, const bf16 *k, const bf16 *v, int B, int S, int H, int KV,
                      int dqk, int dv, int window, bf16 *o, float *lse, cudaStream_t s, char *why,
                      size_t cap)
{
    struct plan_key key;
    memset(&key, 0, sizeof key);
    if (cudaGetDevice(&key.device)) {
        snprintf(why, cap, "cuDNN attention: no current device");
        return false;
    }
    key.B = B, key.S = S, key.H = H, key.KV = KV, key.dqk = dqk, key.dv = dv;
    key.window = window > 0 ? window : 0;
    pthread_mutex_lock(&lock);
    struct plan_entry *e = forward_plan(&key, why, cap);
    cudnnHandle_t h = handles[key.device];
    pthread_mutex_unlock(&lock);
    if (!e) return false;
    float scale = 1.0f / sqrtf((float)dqk), neg_inf = -INFINITY, win = (float)key.window;
    int64_t uids[8] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_WINDOW};
    void *ptrs[8] = {(void *)q, (void *)k, (void *)v, o, lse, &scale, &neg_inf, &win};
    int64_t n = key.window > 0 ? 8 : 7;
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
            (st = cudnnBackendFinalize(pack)) == CUDNN_STATUS_SUCCESS &&
            (st = cudnnSetStream(h, s)) == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendExecute(h, e->plan, pack);
        cudnnBackendDestroyDescriptor(pack);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, cap, "cuDNN attention: execute: %s", cudnnGetErrorString(st));
        return false;
    }
    size_t rows = (size_t)B * H * S; /* natural log -> base 2, as our backward reads it */
    k_scale<<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(lse, rows, (float)M_LOG2E);
    if (cudaGetLastError()) {
        snprintf(why, cap, "cuDNN attention: the statistics' rescale did not launch");
        return false;
    }
    return true;
}

const char *gk_cudnn_version(char *buf, size_t cap)
{
    size_t v = cudnnGetVersion();
    snprintf(buf, cap, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    return buf;
}

#else /* no cuDNN at configure time */

bool gk_cudnn_forward(const bf16 *, const bf16 *, const bf16 *, int, int, int, int, int, int, int,
                      bf16 *, float *, cudaStream_t, char *why, size_t cap)
{
    snprintf(why, cap,
             "this build has no cuDNN (MOEPLAN_CUDNN=OFF or none found at configure "
             "time)");
    return false;
}

const char *gk_cudnn_version(char *buf, size_t cap)
{
    snprintf(buf, cap, "none (not built with cuDNN)");
    return buf;
}

#endif
