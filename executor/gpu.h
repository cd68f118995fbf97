/*
 * gpu.h: the GPU executor's state and what its files share (internal to executor/; the module's
 * public header is exec.h, the launchers of the kernels are in gpu_kernels.h).
 *
 * struct exec_gpu holds everything one GPU's training step owns: shapes, streams and cuBLAS
 * handles, parameters, activations, workspace, timing events. Its files, one room each:
 *   gpu_create.cu      creation, buffers (every allocation named, counted by category),
 *                      parameters, optimizer state, selection biases
 *   gpu_step.cu        the step: phase timing, a block forward and backward, micro-batches,
 *                      the loss, the optimizer, NaN/Inf checks, routing statistics
 *   gpu_gemm.cu        the GEMM wrappers and the expert side streams
 *   gpu_attn_block.cu  the attention half of a block
 *   gpu_moe.cu         SwiGLU, the experts and the dropless MoE layer
 *   gpu_ep.cu          expert parallelism: the MoE layer across ranks
 *   gpu_bench.cu       the MoE layer benchmark (moeplan bench moe, calibrate)
 *   calib.cu           calibrate's microbenchmarks and bench gemm's GEMMs (no struct exec_gpu)
 * Functions here own no resources (the struct does): a failed call returns its error, and
 * exec_gpu_destroy frees what was made. Tensor shapes are written (rows, columns).
 */
#ifndef GPU_H
#define GPU_H

#include "gpu_kernels.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A block's weights, by their names in the parameter table. */
/* clang-format off */
enum { W_ATTN_NORM, W_WQ, W_WK, W_WV, W_WO, W_Q_NORM, W_K_NORM, W_Q_BIAS, W_K_BIAS, W_V_BIAS,
       W_O_BIAS, W_SINKS, W_WQA, W_QA_NORM, W_WQB, W_WKVA, W_KVA_NORM, W_WKVB, W_FFN_NORM, W_ROUTER,
       W_ROUTER_B, W_GATE, W_UP, W_DOWN, W_GATE_B, W_UP_B, W_DOWN_B, W_SGATE, W_SUP, W_SDOWN, W_N };
static const char *const w_names[W_N] = {
    "attn_norm", "wq",       "wk",     "wv",       "wo",   "q_norm",   "k_norm",
    "q_bias",    "k_bias",   "v_bias", "o_bias",   "sinks", "wqa",  "qa_norm",  "wqb",
    "wkva",      "kva_norm", "wkvb",   "ffn_norm", "router", "router_bias", "gate",   "up",
    "down",      "gate_bias", "up_bias", "down_bias", "sgate",    "sup",    "sdown"};
/* clang-format on */

/* What one block keeps from its forward for its backward. Shapes (rows, columns): T = tokens of
 * the micro-batch, h = hidden, H / KV = heads / kv_heads, P = routed pairs (T x top_k), Pe = the
 * pairs a rank's experts may receive, fw = the wider of the dense and shared FFN. */
struct act {
    /* attention half */
    bf16 *a16;     /* (T, h) the normed block input */
    float *rstd1;  /* (T) its RMSNorm's 1 / rms */
    bf16 *q16;     /* (T, H * dqk) */
    bf16 *k16;     /* (T, KV * dqk) */
    bf16 *qpre16;  /* QK-norm (T, H * dqk): q before its norm, rounded to bf16 */
    bf16 *kpre16;  /* QK-norm (T, KV * dqk) */
    float *rstdqh; /* QK-norm (T * H): each head's 1 / rms */
    float *rstdkh; /* QK-norm (T * KV) */
    bf16 *v16;     /* (T, KV * dv) */
    bf16 *o16;     /* (T, H * dv) attention output before the projection */
    float *lse;    /* (T, H) log-sum-exp of the scores (flash backward) */
    float *cq32;   /* MLA (T, q_lora) compressed q */
    float *rstdq;  /* MLA (T) */
    bf16 *cqn16;   /* MLA (T, q_lora) normed */
    float *ckvf32; /* MLA (T, kv_lora + rope) compressed kv and the shared RoPE key */
    float *rstdkv; /* MLA (T) */
    bf16 *ckvn16;  /* MLA (T, kv_lora) normed */
    float *h1;     /* (T, h) the residual stream after attention */
    /* FFN half */
    bf16 *b16;     /* (T, h) its normed input */
    float *rstd2;  /* (T) */
    float *b32;    /* (T, h) the normed input in fp32 (the router's) */
    bf16 *g16;     /* (T, fw) dense or shared SwiGLU gate (the GEMM's output rounded) */
    bf16 *u16;     /* (T, fw) its up projection */
    bf16 *hm16;    /* (T, fw) silu(gate) * up */
    float *logits; /* (T, experts) router logits */
    int *choice;   /* (P) expert of each routed pair, token-major */
    float *weight; /* (P) its routing weight */
    int *pos;      /* (P) the pair's row in expert order */
    int *row_src;  /* (P) the token of each row in expert order */
    int *off;      /* (experts + 1) rows of each expert, as offsets */
    float *auxg;   /* (experts) the load-balance loss's gradient factor */
    bf16 *xp16;    /* (Pe, h) the rows in expert order */
    bf16 *eg16;    /* (Pe, ffn) expert gate */
    bf16 *eu16;    /* (Pe, ffn) expert up */
    bf16 *ehm16;   /* (Pe, ffn) silu(gate) * up */
    float *yp32;   /* (Pe, h) expert outputs, unweighted */
    /* fp8 with f8.keep_xt, no EP: [XT_X] xp16's rows as the forward's gate GEMMs quantized them,
     * [XT_HM] ehm16's as the down GEMMs did, transposed, expert by expert (exec_fp8_regions), and
     * their factors (exec_gpu's xt) */
    unsigned char *xt8[2];
    float *xt8s[2];
};

/* fp8 with f8.keep_xt: the layer and the rows' offsets whose experts' matrices an act set's xt8
 * holds (layer -1: none), done[k E + e]: expert e's of matrix k written */
enum { XT_X, XT_HM, XT_N };
struct gpu_xt_set {
    int l;
    const int *off;
    unsigned char *done;
};

/* An expert GEMM kind: its cuBLASLt operation and the algorithm chosen for it once. */
struct lt_kind {
    bool ta, tb, vary_k;
    int fixed, N, lda, ldb, ldc; /* fixed: K when the rows vary, M when K varies */
    cudaDataType ab, ct;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulAlgo_t algo;
    bool usable;
};
#define LT_KINDS 16

/* Expert parallelism: one MoE layer's exchange, kept from its forward for its backward. Rows
 * received are hop 1's [0, n1) then hop 2's [n1, n1 + n2); the local pairs (row, slot) are in
 * expert order for the GEMMs. */
struct ep_layer {
    struct exec_ep_rows h1, h2; /* host: the rows this rank sent */
    int *in1, *in2;             /* host (ranks): rows received from each rank */
    int n1, n2, npairs;
    int *off; /* host (E + 1): local pairs per expert */
    /* device: per pair (expert order) its received row, weight and (row * top_k + slot); per
     * received row its pairs (CSR, slot order) and their weights; per token the hop-1 rows it
     * sent (CSR, for the returns); per hop-1 row received the hop-2 rows forwarded (CSR) */
    int *pair_row, *pair_dst, *row_off, *row_pairs, *tok_off, *tok_rows, *fwd_off, *fwd_rows;
    float *pair_w, *row_w;
};

/* fp8: a stream's scratch for the operands it quantizes as its GEMMs are called: a (the forward's
 * input, the data gradient's output gradient, the weight gradient's transposed output gradient),
 * b (the weight gradient's transposed input), c (the data gradient's output gradient transposed
 * as well, for the weight gradient that follows), their factors, the per-tensor scaling's amax.
 * `kept` says what a and c hold for the stream's next GEMM, which takes them instead of
 * quantizing its operand again when it is the same matrix: the gate and up GEMMs of one input,
 * a layer's data gradient and then its weight gradient. Only the next GEMM call, inside one
 * phase: any other GEMM call or a new phase forgets it. */
struct fp8_kept {
    const bf16 *src; /* NULL: nothing kept */
    int ld, rows, cols, e5m2;
    bool t; /* c holds its transpose too */
};
struct fp8_scratch {
    unsigned char *a, *b, *c;
    float *sa, *sb, *sc;
    unsigned *amax;
    float *tail; /* block scaling: gk_fp8_gemm's last rows, fp32 */
    struct fp8_kept kept;
    /* what b holds: the last weight gradient's input, transposed; the next weight gradient of
     * the same input (q, k and v of one norm's output; gate and up of one expert's rows) takes
     * it, whatever data gradients run between (they do not write b). Forgotten as kept is,
     * except by the data gradients. */
    struct fp8_kept kept_b;
};

#define MAX_EVENTS 16384
#define MAX_ALLOCS 512

struct exec_gpu {
    struct exec_ref_model table;
    struct mdl_model m;
    struct exec_gpu_cfg cfg;
    struct exec_router_cfg rc;
    /* shapes: a micro-batch of mbs sequences of seq tokens is `tokens` rows; `pairs` routed
     * (token, expert) pairs = tokens x top_k */
    int tokens, seq, mbs, pairs, layers, hidden, vocab;
    int experts, top_k, ffn, shared_ffn, dense_ffn; /* ffn: an expert's width */
    /* attention shapes: heads, kv_heads; per head dqk (q and k) and dv wide; MLA splits dqk into
     * nope + rope and compresses q and kv to q_lora and kv_lora */
    bool mla, qk_norm; /* qk_norm: RMSNorm over each head's q and k (GQA) */
    bool attn_bias;    /* biases on the q, k, v and output projections (GQA) */
    bool sinks;        /* a learned sink logit per head in every softmax (GQA) */
    /* gpt-oss's MoE: biases on the router and the routed experts' projections, with ones16 (Pe
     * ones) for their gradients as GEMMs; the routed experts' activation (act_limit 0: SwiGLU) */
    bool expert_bias;
    bf16 *ones16;
    float *ones32; /* (dqk) Llama 4's weightless QK norm */
    float act_alpha, act_limit;
    int heads, kv_heads, dqk, dv, nope, rope, q_lora, kv_lora;
    cudaStream_t s;
    cublasHandle_t blas; /* on s */
    void *blas_ws;
    /* expert GEMMs spread over side streams (cfg.streams > 1), forked from and joined to s */
    int nside;
    cudaStream_t side[EXEC_MAX_STREAMS];
    cublasHandle_t side_blas[EXEC_MAX_STREAMS];
    cudaEvent_t fork_ev, join_ev[EXEC_MAX_STREAMS];
    cublasHandle_t cur; /* the handle GEMMs go to now */
    int cur_side;       /* its side stream, -1: s */
    bool in_experts;    /* between fork_experts and join_experts: lin* go to mm_expert */
    void *side_ws[EXEC_MAX_STREAMS];
    size_t ws_bytes;
    cublasLtHandle_t lt; /* the expert GEMMs, whose sizes follow the routing */
    /* expert parallelism (cfg.ep): Pe pairs and rows_cap rows a rank may hold */
    struct ep_layer *epl; /* (nmoe) */
    int Pe, rows_cap;
    int *ep_idx;                                      /* (rows_cap) rows to gather */
    struct exec_ep_meta *ep_meta_send, *ep_meta_recv; /* (rows_cap) each row's token and slots */
    bf16 *ep_send16, *ep_recv16;  /* (rows_cap, h) rows out and in, bf16 (forward) */
    float *ep_send32, *ep_recv32; /* (rows_cap, h) the same in fp32 (backward) */
    float *ep_part, *ep_ret;      /* (rows_cap, h) weighted partial sums, returned rows */
    float *ep_dwrows, *ep_dwret;  /* (rows_cap, top_k) routing weights' gradients, out and back */
    float *dwp;                   /* (Pe) a pair's weight gradient */
    double *ep_loads;             /* (nmoe, E): the step's loads, summed over the run's ranks */
    int *choice_host;             /* pinned (P) */
    float *weight_host;           /* pinned (P) */
    struct lt_kind lt_kinds[LT_KINDS];
    int nlt;
    /* fp8 (cfg.precision; exec_gpu.h's exec_fp8_layout): the quantized weights, w8 row-major and
     * w8t transposed at the slices' q, their factors in w8s; redone by the first GEMM after the
     * weights change (w8_stale); each stream's scratch (f8x[0] the main stream's) */
    bool fp8, w8_stale;
    struct exec_fp8_layout f8;
    unsigned char *w8, *w8t;
    float *w8s;
    unsigned *w8amax; /* (experts, at least 4) the per-tensor scaling's amax of a weight's slices */
    /* (f8.n) with f8.amax_weights and no ZeRO: each slice's amax as AdamW kept it writing w16;
     * w8kept_ok: the bf16 weights are what it wrote then (gpu_w16_changed) */
    unsigned *w8kept;
    bool w8kept_ok;
    /* f8.cast_overlap: the quantization on stream cast_s, after cast_in (the bf16 weights
     * written), block l's attention and dense slices then cast_ev[2 l], its routed experts' then
     * cast_ev[2 l + 1]; cast_pend: some part's wait not yet made by the main stream
     * (cast_waited[p]) */
    cudaStream_t cast_s;
    cudaEvent_t cast_in, *cast_ev;
    unsigned char *cast_waited;
    bool cast_pend;
    struct fp8_scratch f8x[1 + EXEC_MAX_STREAMS];
    /* fp8 with f8.fuse: the experts' gate and up output gradients as the fused SwiGLU backward
     * quantized them (gk_fp8_swiglu_backward), [0] the gate's, [1] the up's: row-major q,
     * transposed qt, their factors; their GEMMs take them for key[k] (deg16, deu16; NULL: none
     * now), expert e's at its region (qo, so, sto: host, E + 1; off: the layer's rows) */
    struct {
        const bf16 *key[2];
        unsigned char *q[2], *qt[2];
        float *s[2], *st[2];
        size_t *qo, *so, *sto;
        const int *off;
        int *off_dev; /* (E + 1) a copy of the rows' offsets the fused kernels read */
    } f8pre;
    /* fp8 with f8.dispatch (gpu_fp8_dispatch): the experts' input as the permute quantized it,
     * its row-major copy q with factors s, expert e's region from qo[e], so[e] (host, E + 1);
     * the gate and up GEMMs take it for the rows of key (the act set's xp16, NULL: none) at
     * offsets off (the layer's off_host). Its transpose went into that set's xt8[XT_X]. */
    struct {
        const bf16 *key;
        const int *off;
        unsigned char *q;
        float *s;
        size_t *qo, *so, *sto;
    } f8xd;
    /* fp8 with f8.keep_xt: xt_set[i], act set i's (i: the layer, or 0 with full recompute);
     * xt: the set the experts' GEMMs write (forward) or read (backward) now (NULL: none), matrix
     * k the rows of m[k].base (ld wide), expert e's region from m[k].qo[e] and m[k].sto[e] */
    struct gpu_xt_set *xt_set;
    struct {
        struct gpu_xt_set *set;
        bool forward;
        struct {
            const bf16 *base;
            int ld;
            unsigned char *q;
            float *s;
            size_t *qo, *so, *sto;
        } m[XT_N];
    } xt;
    /* fp8 with f8.amax_rows: (nmoe, 5, E) each expert's amax of a MoE layer's x, hm, dy, dg, du
     * as the kernels that wrote them kept it (F8_X .. F8_DU); the matrices whose amax the GEMMs
     * may take now (known[0 .. nknown): base its first row, ld its width, off the layer's rows,
     * host) */
    unsigned *f8rows;
    struct {
        const bf16 *base;
        int ld;
        const int *off;
        const unsigned *amax;
    } f8known[5];
    int nf8known;
    struct gk_fp8_lt *f8lt;
    /* device (nmoe, T, top_k), exec_gpu_force_routing's: replaces the routers' choices while
     * forced_choice points to it (forced_own keeps it for the next time) */
    const int *forced_choice;
    int *forced_own;
    /* parameters, flat in the reference's table order (table.nparams of them) */
    float *master; /* (nparams) fp32 masters (ZeRO-1: ranks x shard_n) */
    float *grad;   /* (nparams) accumulated gradients */
    /* which gradients this step has written, per slice (one expert's part of an expert tensor,
     * else the whole tensor): the first writer of a slice overwrites it (beta 0, no zeroing pass
     * before the step), later ones add, and gpu_grads_settle zeroes the slices none reached
     * before anything reads the gradients */
    unsigned char *gfresh;
    int *gslice;      /* (ntensors + 1): tensor t's slices are gfresh[gslice[t] .. gslice[t + 1]) */
    void *m1, *m2;    /* (shard_n) AdamW moments: fp32, or bf16 with cfg.moments_bf16 */
    size_t mom_bytes; /* 4 or 2: an element of m1, m2 */
    /* ZeRO-1 (cfg.zero): this rank's shard of the flat parameters, [shard_lo, shard_hi), of
     * shard_n each rank (the last one's padded); m1 and m2 hold the shard only, master all
     * ranks x shard_n (every rank's part arrives by all-gather after each update) */
    size_t shard_lo, shard_hi, shard_n;
    bf16 *w16;      /* (nparams) bf16 copies of the masters, what the GEMMs read */
    int (*wi)[W_N]; /* per layer: tensor index of each weight, -1: none */
    int embed, final_norm, head;
    bool *decay; /* per tensor */
    /* MoE */
    int *moe_index; /* per layer: its index among MoE layers, -1 dense */
    int nmoe;
    float *bias; /* (layers, E) device, selection bias */
    double *bias_host;
    int64_t *counts;           /* (nmoe, E) since creation */
    int64_t *step_load;        /* (nmoe, E) this step */
    unsigned long long *coact; /* (nmoe, E, E) device */
    int **off_host;            /* per layer (or one with recompute): E + 1 */
    /* activations */
    float **xin;       /* (layers + 1) x (T, h): each block's input, xin[layers] the last
                      * block's output */
    struct act *act;   /* per layer, or all the same with recompute */
    struct act act_rc; /* selective recompute: the modules' tensors, one set for every block */
    /* workspace: shapes as struct act's; the d* buffers are gradients */
    int *tok;                  /* (mbs, seq + 1) the micro-batch's token ids */
    int *tok_in, *tgt;         /* (T) inputs and next-token targets */
    int *perm_cnt, *perm_base; /* (P / GK_CHUNK + 1, experts) the permutation's counting sort */
    int *emb_dev;              /* the embedding backward's plan (gk_embed_plan) */
    int *emb_host, *emb_count; /* pinned copy of emb_dev; (vocab) counts per id (host) */
    struct gk_embed_work emb_work;
    float *q32, *k32; /* (T, H * dqk), (T, KV * dqk) fp32 before RoPE */
    float *kv32;      /* MLA (T, H * (nope + dv)) the decompressed keys and values */
    float *delta;     /* (T, H) flash backward's row sums */
    /* attention through cuDNN (gpu_cudnn.cu) until a shape or call fails; then ours, and why */
    bool cudnn_attn;
    char attn_why[256];
    /* why cuDNN's backward ran its non-deterministic engine for a shape ("": it never did) */
    char attn_nondet[256];
    float *part;               /* (T / GK_CHUNK + 1, widest row) column-sum partials */
    float *ytmp;               /* (widest row) */
    float *dh, *dprev;         /* (T, h) the residual stream's gradient, in and out of a block */
    float *yscr;               /* (T, h) recompute's scratch output */
    float *da32, *db32;        /* (T, h) the normed inputs' gradients */
    bf16 *dy16, *dh16;         /* (T, h) bf16 copies of gradients for the GEMMs */
    bf16 *do16;                /* (T, H * dv) */
    float *dq32, *dk32, *dv32; /* (T, H * dqk), (T, KV * dqk), (T, KV * dv) */
    bf16 *dq16, *dk16, *dv16;  /* the same in bf16 */
    bf16 *dqf16;               /* MLA (T, H * dqk) */
    bf16 *dkv16;               /* MLA (T, H * (nope + dv)) */
    float *dckvn32;            /* MLA (T, kv_lora) */
    float *dckvf32;            /* MLA (T, kv_lora + rope) */
    bf16 *dckvf16;
    float *dcqn32, *dcq32; /* MLA (T, q_lora) */
    bf16 *dcq16;
    bf16 *dhm16;         /* (T, fw) */
    bf16 *dg16, *du16;   /* (T, fw) */
    float *dw;           /* (P) routing weights' gradients */
    bf16 *dyp16;         /* (Pe, h) */
    bf16 *dehm16;        /* (Pe, ffn) */
    bf16 *deg16, *deu16; /* (Pe, ffn) */
    bf16 *dxg16, *dxu16; /* (Pe, h) the rows' gradient through the gate and the up GEMM */
    float *dz;           /* (T, experts) router logits' gradient */
    float *scores;       /* (T, experts) */
    bf16 *fin16;         /* (T, h) the final norm's output */
    float *rstdf;        /* (T) */
    bf16 *logits;        /* (T, vocab) LM head output (bf16, fp32 accumulation) */
    bf16 *dlog16;        /* (T, vocab) its gradient, written over the logits by the loss */
    float *row_loss;     /* (T) */
    float *dfin32;       /* (T, h) */
    double grad_scale;   /* of the micro-batch running */
    double *norm_part;   /* (GK_NORM_BLOCKS) the gradient norm's partial sums */
    float2 *rope_tab;    /* (S, rotated dims / 2): cos, sin */
    float *host_rows;    /* pinned: row losses */
    /* timing and accounting */
    cudaEvent_t ev[MAX_EVENTS];
    int ev_phase[MAX_EVENTS];
    int nev, ev_created;
    bool ev_overflow;
    int syncs;
    struct cost_bytes sent; /* expert parallelism: dispatch payload this step */
    bool record_stats;      /* false in a recompute forward */
    /* gradient buckets (cfg.dp): block l's parameters are [blk_off[l], blk_off[l + 1]); the
     * last micro-batch's backward starts their all-reduce block by block */
    size_t *blk_off;
    bool buckets_ok, bucketing, started;
    int mb_done;
    double mem[EXEC_MEM_N], peak_used, dev_total;
    void *allocs[MAX_ALLOCS];
    int nallocs;
};

static inline double allocated(const struct exec_gpu *g)
{
    double sum = 0.0;
    for (int k = 0; k < EXEC_MEM_N; k++) sum += g->mem[k];
    return sum;
}
#define ALLOC(ptr, count, cat)                                                                     \
    MOE_CHECK(gpu_dalloc(g, (void **)&(ptr), sizeof(*(ptr)) * (size_t)(count), cat, #ptr, err))
#define PH(p) MOE_CHECK(gpu_phase(g, (p), err))
static inline float *M(const struct exec_gpu *g, int t)
{
    return g->master + g->table.tensor[t].offset;
}
static inline bf16 *W16(const struct exec_gpu *g, int t)
{
    return g->w16 + g->table.tensor[t].offset;
}
static inline float *GR(const struct exec_gpu *g, int t)
{
    return g->grad + g->table.tensor[t].offset;
}

/* gpu_create.cu: creation, buffers, parameters, optimizer state and selection biases */
enum moe_status gpu_dalloc(struct exec_gpu *g, void **p, size_t bytes, enum exec_mem cat,
                           const char *what, struct moe_error *err);
enum moe_status gpu_upload_bias(struct exec_gpu *g, struct moe_error *err);

/* gpu_step.cu: the step: phases, blocks, micro-batches, loss, optimizer, checks */
enum moe_status gpu_phase(struct exec_gpu *g, int ph, struct moe_error *err);
/* Every gradient slice unwritten (a new step). */
void gpu_grads_fresh(struct exec_gpu *g);
/* True when slice s of tensor t's gradient is unwritten this step (its writer overwrites it);
 * it counts as written from now on. */
bool gpu_grad_first(struct exec_gpu *g, int t, int s);
/* Zero the unwritten slices of the tensors whose parameters start in [lo, hi). */
enum moe_status gpu_grads_settle(struct exec_gpu *g, size_t lo, size_t hi, struct moe_error *err);

/* gpu_gemm.cu: GEMMs (cuBLAS, cuBLASLt for the expert GEMMs) and the expert streams */
enum moe_status gpu_mm(struct exec_gpu *g, bool ta, bool tb, int M_, int N, int K, float alpha,
                       const void *A, int lda, long long sA, const void *B, int ldb, long long sB,
                       float beta, void *C, int ldc, long long sC, int batch, cudaDataType ab,
                       cudaDataType ct, struct moe_error *err);
enum moe_status gpu_lin(struct exec_gpu *g, const bf16 *X, int ldx, const bf16 *Wt, int T, int in,
                        int out, void *Y, int ldy, cudaDataType yt, float beta,
                        struct moe_error *err);
enum moe_status gpu_lin_dx(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *Wt, int T,
                           int in, int out, void *dX, int lddx, cudaDataType xt, float beta,
                           struct moe_error *err);
enum moe_status gpu_lin_dw(struct exec_gpu *g, const bf16 *dY, int lddy, const bf16 *X, int ldx,
                           int T, int in, int out, int t, int slice, struct moe_error *err);
enum moe_status gpu_sync_host(struct exec_gpu *g, struct moe_error *err);
/* Whether device's GPU runs precision p's fp8 GEMMs (cuBLASLt: fp8 from sm_89, its block scaling
 * on sm_90 only); MOE_ERR_UNSUPPORTED naming what it needs where not */
enum moe_status gpu_fp8_check(int device, enum cost_precision p, struct moe_error *err);
/* fp8: block l's quantized weights fresh for the main stream's next GEMMs, its routed experts' or
 * its other projections' (l < 0: every block's): the stale ones redone (the first GEMM of a
 * forward after an update), on the quantization's own stream with f8.cast_overlap, the main
 * stream waiting for that part's */
enum moe_status gpu_fp8_fresh(struct exec_gpu *g, int l, bool experts, struct moe_error *err);
/* fp8 with f8.cast_overlap: the stale weights' quantization started on its own stream, nothing
 * waiting for it yet (gpu_fp8_fresh waits): after an update, so that it runs while the host
 * prepares the next step rather than at the next forward's first GEMM */
enum moe_status gpu_fp8_start(struct exec_gpu *g, struct moe_error *err);
/* The bf16 weights are about to be written (the optimizer, a reload): the main stream waits for
 * any quantization still reading them */
enum moe_status gpu_fp8_settle(struct exec_gpu *g, struct moe_error *err);
/* The bf16 weights were written: their fp8 copies are stale; amax_kept: by AdamW, which kept each
 * quantized slice's amax (gpu_fp8_weight_rows) */
static inline void gpu_w16_changed(struct exec_gpu *g, bool amax_kept)
{
    g->w8_stale = g->fp8;
    g->w8kept_ok = g->fp8 && amax_kept;
}
/* *am for AdamW on tensor t (all of it, no ZeRO) to keep its quantized slices' amax into
 * w8kept; NULL where none is kept (bf16, block scaling, ZeRO, a tensor not quantized) */
const struct gk_amax_rows *gpu_fp8_weight_rows(const struct exec_gpu *g, int t,
                                               struct gk_amax_rows *am);
/* fp8 with f8.amax_rows (struct gk_amax_rows): the kinds of a MoE layer's kept amax */
enum { F8_X, F8_HM, F8_DY, F8_DG, F8_DU, F8_ROWS };
/* For a kernel about to write layer l's rows (off_dev their offsets, `cols` wide) and keep their
 * amax of n kinds from `kind` (amax[0], amax[1]): *out = am, those zeroed on the main stream; or
 * NULL where none is kept (bf16, block scaling, EP, a dense layer, the unfused path) */
enum moe_status gpu_fp8_rows(struct exec_gpu *g, int l, int kind, int n, const int *off_dev,
                             int cols, struct gk_amax_rows *am, const struct gk_amax_rows **out,
                             struct moe_error *err);
/* The GEMMs may take layer l's kept amax of `kind` for the rows of the permuted matrix at base
 * (ld wide; the layer's rows, off_host[l]) until g->nf8known = 0: what a kernel given
 * gpu_fp8_rows kept since that matrix was last written */
void gpu_fp8_know(struct exec_gpu *g, int l, int kind, const bf16 *base, int ld);
/* fp8 with f8.keep_xt: layer l's experts' GEMMs on A's rows `off` write (forward) or read
 * (backward: what that layer's forward on those rows wrote last) the kept transposes of their
 * input and their SwiGLU's output until gpu_fp8_xt_end */
void gpu_fp8_xt_begin(struct exec_gpu *g, int l, const struct act *A, const int *off, bool forward);
void gpu_fp8_xt_end(struct exec_gpu *g);
/* fp8 with f8.dispatch: whether layer l's experts take their input quantized in the permute
 * (A's set keeps transposes, no EP, the rows unchanged after the permute); then
 * gpu_fp8_dispatch_amax, before the rows' offsets reach the host, finds each expert's amax
 * from A's tokens (b16) and routing, and gpu_fp8_dispatch, after, writes the quantized rows
 * (struct f8xd, A->xt8[XT_X]) in place of gk_gather's bf16 ones: A->xp16 is not written. */
bool gpu_fp8_dispatch_ok(const struct exec_gpu *g, int l, const struct act *A);
enum moe_status gpu_fp8_dispatch_amax(struct exec_gpu *g, int l, const struct act *A,
                                      struct moe_error *err);
enum moe_status gpu_fp8_dispatch(struct exec_gpu *g, int l, const struct act *A, const int *off,
                                 struct moe_error *err);
/* fp8: every stream's kept operands forgotten (struct fp8_kept) */
void gpu_fp8_forget(struct exec_gpu *g);
/* fp8: whether layer l's experts' gate and up GEMMs run in fp8 (the fused SwiGLU backward's
 * consumers) */
bool gpu_fp8_fused_ok(const struct exec_gpu *g, int l);
/* Host to device in s, the stream that reads it (s is non-blocking: it does not wait for a plain
 * cudaMemcpy, which may return before a pageable copy lands). A pageable source is staged before
 * the call returns: the caller may free or refill it at once. */
enum moe_status gpu_upload(struct exec_gpu *g, void *dst, const void *src, size_t bytes,
                           struct moe_error *err);
/* Layer l's experts: their weights fresh (gpu_fp8_fresh), then the side streams after the main */
enum moe_status gpu_fork_experts(struct exec_gpu *g, int l, struct moe_error *err);
void gpu_use_expert_stream(struct exec_gpu *g, int e);
enum moe_status gpu_join_experts(struct exec_gpu *g, struct moe_error *err);

/* gpu_attn_block.cu: the attention half of a block (GQA or MLA), forward and backward; a bias's
 * gradient from a bf16 output gradient */
enum moe_status gpu_bias_grad(struct exec_gpu *g, const bf16 *dy16, float *scratch, int T, int n,
                              int t, struct moe_error *err);
enum moe_status gpu_attn_forward(struct exec_gpu *g, int l, struct act *A, struct moe_error *err);
enum moe_status gpu_attn_core(struct exec_gpu *g, int l, const struct act *A,
                              struct moe_error *err);
enum moe_status gpu_mla_up_proj(struct exec_gpu *g, int l, const struct act *A,
                                struct moe_error *err);
enum moe_status gpu_attn_backward(struct exec_gpu *g, int l, const struct act *A,
                                  struct moe_error *err);

/* gpu_moe.cu: SwiGLU, the experts and the dropless MoE layer on one GPU */
enum moe_status gpu_swiglu_hidden(struct exec_gpu *g, const bf16 *x, int T, int F, const bf16 *Wg,
                                  const bf16 *Wu, bf16 *g16, bf16 *u16, bf16 *hm16,
                                  struct moe_error *err);
enum moe_status gpu_swiglu_forward(struct exec_gpu *g, const bf16 *x, int T, int F, const bf16 *Wg,
                                   const bf16 *Wu, const bf16 *Wd, bf16 *g16, bf16 *u16, bf16 *hm16,
                                   float *y, struct moe_error *err);
enum moe_status gpu_swiglu_backward(struct exec_gpu *g, const bf16 *x, const bf16 *dy16, int T,
                                    int F, const bf16 *Wg, const bf16 *Wu, const bf16 *Wd,
                                    const bf16 *g16, const bf16 *u16, const bf16 *hm16, int tg,
                                    int tu, int td, float *dx, float beta, struct moe_error *err);
enum moe_status gpu_experts_forward(struct exec_gpu *g, int l, struct act *A, const int *off,
                                    struct moe_error *err);
enum moe_status gpu_experts_backward(struct exec_gpu *g, int l, const struct act *A, const int *off,
                                     struct moe_error *err);
enum moe_status gpu_moe_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                                struct moe_error *err);
enum moe_status gpu_moe_aux_loss(struct exec_gpu *g, int l, const struct act *A, double *aux,
                                 struct moe_error *err);
enum moe_status gpu_moe_backward(struct exec_gpu *g, int l, const struct act *A,
                                 struct moe_error *err);

/* gpu_ep.cu: expert parallelism: the MoE layer with its tokens exchanged between ranks */
enum moe_status gpu_ep_forward(struct exec_gpu *g, int l, struct act *A, float *y,
                               struct moe_error *err);
enum moe_status gpu_ep_backward(struct exec_gpu *g, int l, const struct act *A,
                                struct moe_error *err);
enum moe_status gpu_ep_alloc(struct exec_gpu *g, struct moe_error *err);

#endif
