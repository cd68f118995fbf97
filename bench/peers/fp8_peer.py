#!/usr/bin/env python3
"""PyTorch's fp8 expert block beside its bf16 one: the peer of `moeplan bench moe --precision fp8`.

The same shape and routing (`moeplan bench moe --routing-out`), the block written out as its
GEMMs, expert by expert, as moeplan's executor runs it: forward gate, up (SwiGLU) and down;
backward the data and weight gradients of the three. bf16 with torch.mm, fp8 with
torch._scaled_mm and per-tensor current scaling (each operand's amax this call, E4M3, its
transpose quantized for the weight gradient; the weights quantized in the timing too, where
moeplan quantizes them once a step), fp32 accumulation, bf16 out (fp32 for the weight
gradients). Each expert's rows are padded with zero rows to a multiple of 16 in both precisions
(torch._scaled_mm wants the weight gradients' reduction, the tokens, in multiples of 16). Medians
of CUDA-event timings after warm-up; the ratio bf16 / fp8 is the speedup.
"""
import numpy as np
import torch
import torch.nn.functional as F

from timing import median_ms, moe_args, quant_tensor, write_json


def mm8(a, b_t, out=torch.bfloat16):
    """a (M x K) times b_t^T (b_t: N x K), both quantized here: (M x N)."""
    qa, sa = quant_tensor(a)
    qb, sb = quant_tensor(b_t)
    return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=out)


def mm16(a, b_t, out=torch.bfloat16):
    return (a @ b_t.t()).to(out)


def main():
    a, choice = moe_args("fp8_peer", __doc__)
    E, T, K, H, Fd = a.experts, a.tokens, a.topk, a.hidden, a.ffn
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(1)
    counts = np.bincount(choice, minlength=E)
    # each expert's rows padded with zero rows to a multiple of 16, in both precisions:
    # torch._scaled_mm wants the reduction (the tokens, in the weight gradients) in multiples of
    # 16, as Megatron pads them for fp8 (moeplan's quantizer pads the same way, without a copy)
    rows = (counts + 15) // 16 * 16
    offs = np.concatenate([[0], np.cumsum(rows)])
    R, Rp = T * K, int(offs[-1])
    wg = torch.randn(E, Fd, H, device=dev, dtype=bf) * 0.02
    wu = torch.randn(E, Fd, H, device=dev, dtype=bf) * 0.02
    wd = torch.randn(E, H, Fd, device=dev, dtype=bf) * 0.02
    real = torch.zeros(Rp, 1, device=dev, dtype=bf)
    for e in range(E):
        real[int(offs[e]):int(offs[e]) + int(counts[e])] = 1
    xp = torch.randn(Rp, H, device=dev, dtype=bf) * real
    dyp = torch.randn(Rp, H, device=dev, dtype=bf) * real

    def block(mm):
        # fp8 GEMMs take K-major operands (cuBLASLt's "TN"): a transposed operand is a copy, as
        # moeplan's quantizer writes one; bf16's take the views
        tr = (lambda t: t.t().contiguous()) if mm is mm8 else (lambda t: t.t())
        for e in range(E):
            o, n = int(offs[e]), int(rows[e])
            if n == 0:
                continue
            x, dy = xp[o:o + n], dyp[o:o + n]
            g, u = mm(x, wg[e]), mm(x, wu[e])
            gf, uf = g.float(), u.float()
            hm = (F.silu(gf) * uf).to(bf)
            mm(hm, wd[e])                                   # forward down
            dhm = mm(dy, tr(wd[e]))                         # data gradient of down
            mm(tr(dy), tr(hm), torch.float32)               # its weight gradient
            sg = torch.sigmoid(gf)
            dh = dhm.float()
            dg = (dh * uf * sg * (1 + gf * (1 - sg))).to(bf)
            du = (dh * gf * sg).to(bf)
            mm(dg, tr(wg[e]))                               # data gradients of gate and up
            mm(du, tr(wu[e]))
            xt = tr(x)
            mm(tr(dg), xt, torch.float32)                   # their weight gradients
            mm(tr(du), xt, torch.float32)

    ms16, _ = median_ms(lambda: block(mm16), a.warmup, a.iters)
    ms8, _ = median_ms(lambda: block(mm8), a.warmup, a.iters)
    fl = 18.0 * R * H * Fd
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "bf16_block_ms": ms16, "fp8_block_ms": ms8, "bf16_block_tflops": fl / ms16 / 1e9,
           "fp8_block_tflops": fl / ms8 / 1e9, "speedup": ms16 / ms8}
    print(f"torch {torch.__version__}: expert block bf16 {ms16:.3f} ms ({res['bf16_block_tflops']:.1f} TFLOPS), "
          f"fp8 per-tensor (torch._scaled_mm) {ms8:.3f} ms ({res['fp8_block_tflops']:.1f}): {ms16 / ms8:.2f}x")
    if a.json:
        write_json(a.json, res)


if __name__ == "__main__":
    main()
