/*
 * gpu_ep.cu: expert parallelism. One MoE layer's routed rows leave for the ranks that hold
 * their experts (ep.c computes which rows go where, with the plan's dedup mode), run through the
 * per-expert GEMMs there, and come back weighted; the backward sends the gradients the same way.
 * Receive buffers are the plan's buffer_factor x the balanced load: an overflow stops the step
 * naming the rank and the count, never dropping a row.
 */
#include "gpu.h"

/* A transport call on this rank's finished work; a dispatch larger than the buffers is refused
 * (never dropped). */
static enum moe_status ep_check_rows(const struct exec_gpu *g, int n, const char *what,
                                     struct moe_error *err)
{
    if (n <= g->rows_cap) return MOE_OK;
    return moe_error_set(err, MOE_ERR_RUNTIME,
                         "expert parallelism: rank %d would hold %d %s, its buffers %d; no row is "
                         "dropped: the step stops (a larger ep_buffer_factor, or fewer tokens per "
                         "micro-batch, fit)",
                         g->cfg.ep->rank, n, what, g->rows_cap);
}

/* Counts and metadata of `r` out; what arrives: in (ranks), *n_in rows, their metadata (host,
 * malloc'd into *meta). */
static enum moe_status ep_meta_out(struct exec_gpu *g, const struct exec_ep_rows *r, int *in,
                                   int *n_in, struct exec_ep_meta **meta, struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    MOE_CHECK(ep_check_rows(g, r->n, "rows to send", err));
    MOE_CHECK(t->ops->counts(t, r->count, in, err));
    int n = 0;
    for (int s = 0; s < t->ranks; s++) n += in[s];
    MOE_CHECK(ep_check_rows(g, n, "received rows", err));
    if (r->n)
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->ep_meta_send, r->meta, sizeof *r->meta * (size_t)r->n,
                                       cudaMemcpyHostToDevice, g->s));
    MOE_CHECK(gpu_sync_host(g, err));
    MOE_CHECK(
        t->ops->alltoallv(t, g->ep_meta_send, r->count, g->ep_meta_recv, in, sizeof *r->meta, err));
    *meta = (struct exec_ep_meta *)malloc(sizeof **meta * (size_t)(n ? n : 1));
    if (!*meta) return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    if (n)
        MOE_CUDA_CHECK(
            cudaMemcpy(*meta, g->ep_meta_recv, sizeof **meta * (size_t)n, cudaMemcpyDeviceToHost));
    *n_in = n;
    return MOE_OK;
}

/* Rows of src (bf16 or fp32, width h) picked by r->src_row go out; they arrive in recv. */
static enum moe_status ep_rows_out(struct exec_gpu *g, const struct exec_ep_rows *r, const int *in,
                                   const void *src, bool f32, void *recv, struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    int h = g->hidden;
    if (r->n) {
        MOE_CUDA_CHECK(cudaMemcpyAsync(g->ep_idx, r->src_row, sizeof(int) * (size_t)r->n,
                                       cudaMemcpyHostToDevice, g->s));
        if (f32)
            MOE_CUDA_CHECK(
                gk_rows_gather32((const float *)src, g->ep_idx, r->n, h, g->ep_send32, g->s));
        else
            MOE_CUDA_CHECK(
                gk_gather((const bf16 *)src, g->ep_idx, 1, r->n, h, g->ep_send16, NULL, g->s));
    }
    MOE_CHECK(gpu_sync_host(g, err));
    return t->ops->alltoallv(t, f32 ? (const void *)g->ep_send32 : (const void *)g->ep_send16,
                             r->count, recv, in, (f32 ? sizeof(float) : sizeof(bf16)) * (size_t)h,
                             err);
}

/* The way back: rows of back (width floats), in the order received, return to their senders and
 * arrive in got in the order sent. */
static enum moe_status ep_rows_back(struct exec_gpu *g, const struct exec_ep_rows *r, const int *in,
                                    const float *back, int width, float *got, struct moe_error *err)
{
    struct exec_transport *t = g->cfg.ep;
    MOE_CHECK(gpu_sync_host(g, err));
    return t->ops->alltoallv(t, back, in, got, r->count, sizeof(float) * (size_t)width, err);
}

/* The EP group of MoE layer mi (the mi-th MoE layer). */
static const struct exec_ep_group *ep_group_of(const struct exec_gpu *g, int mi)
{
    return g->cfg.ep_group + (g->cfg.ep_groups > 1 ? mi : 0);
}

/* From the received metadata: the local pairs in expert order, and every CSR of the layer. */
static enum moe_status ep_index(struct exec_gpu *g, struct ep_layer *L,
                                const struct exec_ep_meta *m1, const struct exec_ep_meta *m2,
                                struct moe_error *err)
{
    const struct exec_ep_group *eg = ep_group_of(g, (int)(L - g->epl));
    int me = g->cfg.ep->rank, E = g->experts, k = g->top_k, T = g->tokens, rows = L->n1 + L->n2;
    int np = 0;
    for (int r = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        for (int j = 0; j < k; j++) np += exec_ep_slot_here(eg, me, m, j);
    }
    if (np > g->Pe)
        return moe_error_set(err, MOE_ERR_RUNTIME,
                             "expert parallelism: rank %d would compute %d pairs, its buffers %d",
                             me, np, g->Pe);
    size_t ni = (size_t)(np ? np : 1);
    int *pair_row = (int *)malloc(sizeof(int) * ni), *pair_dst = (int *)malloc(sizeof(int) * ni);
    int *row_pairs = (int *)malloc(sizeof(int) * ni);
    int *row_off = (int *)calloc((size_t)rows + 1, sizeof(int));
    int *tok_off = (int *)calloc((size_t)T + 1, sizeof(int));
    int *tok_rows = (int *)malloc(sizeof(int) * (size_t)(L->h1.n ? L->h1.n : 1));
    int *fwd_off = (int *)calloc((size_t)L->n1 + 1, sizeof(int));
    int *fwd_rows = (int *)malloc(sizeof(int) * (size_t)(L->h2.n ? L->h2.n : 1));
    float *pair_w = (float *)malloc(sizeof(float) * ni);
    float *row_w = (float *)malloc(sizeof(float) * ni);
    int *at = (int *)calloc((size_t)E + 1, sizeof(int));
    int *next = (int *)malloc(sizeof(int) * ((size_t)T + 1));
    int *nf = (int *)malloc(sizeof(int) * ((size_t)L->n1 + 1));
    enum moe_status st = MOE_OK;
    if (!pair_row || !pair_dst || !row_pairs || !row_off || !tok_off || !tok_rows || !fwd_off ||
        !fwd_rows || !pair_w || !row_w || !at || !next || !nf) {
        st = moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
        goto done;
    }
    /* expert order: a stable counting sort of the (row, slot) pairs */
    memset(L->off, 0, sizeof(int) * ((size_t)E + 1));
    for (int r = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        for (int j = 0; j < k; j++)
            if (exec_ep_slot_here(eg, me, m, j)) L->off[m->expert[j] + 1]++;
    }
    for (int e = 0; e < E; e++) L->off[e + 1] += L->off[e];
    memcpy(at, L->off, sizeof(int) * (size_t)E);
    for (int r = 0, q = 0; r < rows; r++) {
        const struct exec_ep_meta *m = r < L->n1 ? &m1[r] : &m2[r - L->n1];
        row_off[r] = q;
        for (int j = 0; j < k; j++) {
            if (!exec_ep_slot_here(eg, me, m, j)) continue;
            int p = at[m->expert[j]]++;
            pair_row[p] = r;
            pair_dst[p] = r * k + j;
            pair_w[p] = (float)m->weight[j];
            row_pairs[q] = p;
            row_w[q++] = (float)m->weight[j];
        }
        row_off[r + 1] = q;
    }
    /* the returns: a token's hop-1 rows, a hop-1 row's forwards, each in the order sent */
    for (int i = 0; i < L->h1.n; i++) tok_off[L->h1.src_row[i] + 1]++;
    for (int t = 0; t < T; t++) tok_off[t + 1] += tok_off[t];
    memcpy(next, tok_off, sizeof(int) * ((size_t)T + 1));
    for (int i = 0; i < L->h1.n; i++) tok_rows[next[L->h1.src_row[i]]++] = i;
    for (int i = 0; i < L->h2.n; i++) fwd_off[L->h2.src_row[i] + 1]++;
    for (int r = 0; r < L->n1; r++) fwd_off[r + 1] += fwd_off[r];
    memcpy(nf, fwd_off, sizeof(int) * ((size_t)L->n1 + 1));
    for (int i = 0; i < L->h2.n; i++) fwd_rows[nf[L->h2.src_row[i]]++] = i;
    L->npairs = np;
    if ((st = gpu_upload(g, L->pair_row, pair_row, sizeof(int) * (size_t)np, err)) ||
        (st = gpu_upload(g, L->pair_dst, pair_dst, sizeof(int) * (size_t)np, err)) ||
        (st = gpu_upload(g, L->pair_w, pair_w, sizeof(float) * (size_t)np, err)) ||
        (st = gpu_upload(g, L->row_pairs, row_pairs, sizeof(int) * (size_t)np, err)) ||
        (st = gpu_upload(g, L->row_w, row_w, sizeof(float) * (size_t)np, err)) ||
        (st = gpu_upload(g, L->row_off, row_off, sizeof(int) * ((size_t)rows + 1), err)) ||
        (st = gpu_upload(g, L->tok_off, tok_off, sizeof(int) * ((size_t)T + 1), err)) ||
        (st = gpu_upload(g, L->tok_rows, tok_rows, sizeof(int) * (size_t)L->h1.n, err)) ||
        (st = gpu_upload(g, L->fwd_off, fwd_off, sizeof(int) * ((size_t)L->n1 + 1), err)) ||
        (st = gpu_upload(g, L->fwd_rows, fwd_rows, sizeof(int) * (size_t)L->h2.n, err)))
        goto done;
    st = gpu_sync_host(g, err); /* the host arrays are freed next */
done:
    free(pair_row), free(pair_dst), free(row_pairs), free(row_off), free(tok_off), free(tok_rows);
    free(fwd_off), free(fwd_rows), free(pair_w), free(row_w), free(at), free(next), free(nf);
    return st;
}

/* The EP forward of MoE layer l from this rank's routing (choice_host, weight_host): dispatch,
 * the local experts, the weighted sums per row, the way back; y += the routed experts' output. */
enum moe_status gpu_ep_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                               struct moe_error *err)
{
    const struct exec_ep_group *eg = ep_group_of(g, g->moe_index[l]);
    struct ep_layer *L = &g->epl[g->moe_index[l]];
    int me = g->cfg.ep->rank, T = g->tokens, h = g->hidden, P = g->pairs;
    double *wd = (double *)malloc(sizeof(double) * (size_t)P);
    if (!wd) return moe_error_set(err, MOE_ERR_NOMEM, "expert parallelism: out of memory");
    for (int i = 0; i < P; i++) wd[i] = g->weight_host[i];
    exec_ep_rows_free(&L->h1);
    exec_ep_rows_free(&L->h2);
    enum moe_status st = exec_ep_first_hop(eg, me, g->choice_host, wd, T, &L->h1, err);
    free(wd);
    if (st != MOE_OK) return st;
    struct exec_ep_meta *m1 = NULL, *m2 = NULL;
    PH(COST_DISPATCH);
    if ((st = ep_meta_out(g, &L->h1, L->in1, &L->n1, &m1, err))) goto done;
    if ((st = ep_rows_out(g, &L->h1, L->in1, A->b16, false, g->ep_recv16, err))) goto done;
    if ((st = exec_ep_second_hop(eg, me, m1, L->n1, &L->h2, err))) goto done;
    if ((st = ep_meta_out(g, &L->h2, L->in2, &L->n2, &m2, err))) goto done;
    if ((st = ep_check_rows(g, L->n1 + L->n2, "received rows", err))) goto done;
    if ((st = ep_rows_out(g, &L->h2, L->in2, g->ep_recv16, false, g->ep_recv16 + (size_t)L->n1 * h,
                          err)))
        goto done;
    if ((st = ep_index(g, L, m1, m2, err))) goto done;
    if (g->record_stats) { /* not the recompute forward's */
        exec_ep_rows_bytes(eg, me, &L->h1, sizeof(bf16) * (double)h, &g->sent);
        exec_ep_rows_bytes(eg, me, &L->h2, sizeof(bf16) * (double)h, &g->sent);
    }
    PH(COST_EXPERTS_FWD);
    if (L->npairs) {
        MOE_CUDA_CHECK(gk_gather(g->ep_recv16, L->pair_row, 1, L->npairs, h, A->xp16, NULL, g->s));
        if ((st = gpu_experts_forward(g, l, A, L->off, err))) goto done;
    }
    PH(COST_COMBINE);
    MOE_CUDA_CHECK(gk_rows_csr(g->ep_part, A->yp32, L->row_pairs, L->row_w, L->row_off,
                               L->n1 + L->n2, h, false, g->s));
    if ((st = ep_rows_back(g, &L->h2, L->in2, g->ep_part + (size_t)L->n1 * h, h, g->ep_ret, err)))
        goto done;
    MOE_CUDA_CHECK(
        gk_rows_csr(g->ep_part, g->ep_ret, L->fwd_rows, NULL, L->fwd_off, L->n1, h, true, g->s));
    if ((st = ep_rows_back(g, &L->h1, L->in1, g->ep_part, h, g->ep_ret, err))) goto done;
    MOE_CUDA_CHECK(gk_rows_csr(y, g->ep_ret, L->tok_rows, NULL, L->tok_off, T, h, true, g->s));
done:
    free(m1);
    free(m2);
    return st;
}

/* Its backward from dh (the layer output's gradient, fp32): dy rows out along the same rows, at
 * the experts d expert_out and dw per pair, the experts' backward, [dx, dw] back per row; db32
 * (+)= dx, and g->dw (T, top_k) for the router. */
enum moe_status gpu_ep_backward(struct exec_gpu *g, int l, const struct act *A,
                                struct moe_error *err)
{
    struct ep_layer *L = &g->epl[g->moe_index[l]];
    int T = g->tokens, h = g->hidden, k = g->top_k, rows = L->n1 + L->n2;
    PH(COST_COMBINE);
    MOE_CHECK(ep_rows_out(g, &L->h1, L->in1, g->dh, true, g->ep_recv32, err));
    MOE_CHECK(
        ep_rows_out(g, &L->h2, L->in2, g->ep_recv32, true, g->ep_recv32 + (size_t)L->n1 * h, err));
    PH(COST_EXPERTS_BWD);
    if (L->npairs) {
        MOE_CUDA_CHECK(gk_pairs_backward(g->ep_recv32, L->pair_row, L->pair_w, A->yp32, L->npairs,
                                         h, g->dyp16, g->dwp, g->s));
        MOE_CHECK(gpu_experts_backward(g, l, A, L->off, err));
    }
    PH(COST_DISPATCH);
    MOE_CUDA_CHECK(gk_rows_csr_bf16x2(g->ep_part, g->dxg16, g->dxu16, L->row_pairs, NULL,
                                      L->row_off, rows, h, false, g->s));
    if (rows)
        MOE_CUDA_CHECK(cudaMemsetAsync(g->ep_dwrows, 0, sizeof(float) * (size_t)rows * k, g->s));
    MOE_CUDA_CHECK(gk_scatter(g->dwp, L->pair_dst, L->npairs, g->ep_dwrows, g->s));
    MOE_CHECK(ep_rows_back(g, &L->h2, L->in2, g->ep_part + (size_t)L->n1 * h, h, g->ep_ret, err));
    MOE_CUDA_CHECK(
        gk_rows_csr(g->ep_part, g->ep_ret, L->fwd_rows, NULL, L->fwd_off, L->n1, h, true, g->s));
    MOE_CHECK(
        ep_rows_back(g, &L->h2, L->in2, g->ep_dwrows + (size_t)L->n1 * k, k, g->ep_dwret, err));
    MOE_CUDA_CHECK(gk_rows_csr(g->ep_dwrows, g->ep_dwret, L->fwd_rows, NULL, L->fwd_off, L->n1, k,
                               true, g->s));
    MOE_CHECK(ep_rows_back(g, &L->h1, L->in1, g->ep_part, h, g->ep_ret, err));
    MOE_CUDA_CHECK(gk_rows_csr(g->db32, g->ep_ret, L->tok_rows, NULL, L->tok_off, T, h,
                               g->shared_ffn > 0, g->s));
    MOE_CHECK(ep_rows_back(g, &L->h1, L->in1, g->ep_dwrows, k, g->ep_dwret, err));
    MOE_CUDA_CHECK(
        gk_rows_csr(g->dw, g->ep_dwret, L->tok_rows, NULL, L->tok_off, T, k, false, g->s));
    return MOE_OK;
}

/* The exchange's buffers: rows_cap rows and Pe pairs a rank may hold, and per MoE layer its
 * indices (two allocations a layer). */
enum moe_status gpu_ep_alloc(struct exec_gpu *g, struct moe_error *err)
{
    enum exec_mem c = EXEC_MEM_WORKSPACE;
    int R = g->cfg.ep->ranks, h = g->hidden, k = g->top_k, cap = g->rows_cap, E = g->experts,
        T = g->tokens;
    size_t Pe = (size_t)g->Pe;
    ALLOC(g->ep_idx, cap, c);
    ALLOC(g->ep_meta_send, cap, c);
    ALLOC(g->ep_meta_recv, cap, c);
    ALLOC(g->ep_send16, (size_t)cap * h, c);
    ALLOC(g->ep_recv16, (size_t)cap * h, c);
    ALLOC(g->ep_send32, (size_t)cap * h, c);
    ALLOC(g->ep_recv32, (size_t)cap * h, c);
    ALLOC(g->ep_part, (size_t)cap * h, c);
    ALLOC(g->ep_ret, (size_t)cap * h, c);
    ALLOC(g->ep_dwrows, (size_t)cap * k, c);
    ALLOC(g->ep_dwret, (size_t)cap * k, c);
    ALLOC(g->dwp, Pe, c);
    MOE_CUDA_CHECK(cudaMallocHost((void **)&g->choice_host, sizeof(int) * (size_t)g->pairs));
    MOE_CUDA_CHECK(cudaMallocHost((void **)&g->weight_host, sizeof(float) * (size_t)g->pairs));
    g->epl = (struct ep_layer *)calloc((size_t)g->nmoe, sizeof *g->epl);
    if (!g->epl) return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
    size_t ni = 3 * Pe + 2 * ((size_t)cap + 1) + (size_t)T + 1 + (size_t)g->pairs + (size_t)cap;
    for (int i = 0; i < g->nmoe; i++) {
        struct ep_layer *L = &g->epl[i];
        L->in1 = (int *)calloc((size_t)R, sizeof(int));
        L->in2 = (int *)calloc((size_t)R, sizeof(int));
        L->off = (int *)calloc((size_t)E + 1, sizeof(int));
        if (!L->in1 || !L->in2 || !L->off)
            return moe_error_set(err, MOE_ERR_NOMEM, "executor: out of memory");
        int *iv;
        float *fv;
        ALLOC(iv, ni, c);
        ALLOC(fv, 2 * Pe, c);
        L->pair_row = iv;
        L->pair_dst = L->pair_row + Pe;
        L->row_pairs = L->pair_dst + Pe;
        L->row_off = L->row_pairs + Pe;
        L->fwd_off = L->row_off + cap + 1;
        L->tok_off = L->fwd_off + cap + 1;
        L->tok_rows = L->tok_off + T + 1;
        L->fwd_rows = L->tok_rows + g->pairs;
        L->pair_w = fv;
        L->row_w = fv + Pe;
    }
    return MOE_OK;
}
