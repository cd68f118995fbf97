#!/usr/bin/env python3
"""PyTorch's GEMMs beside `moeplan bench gemm`: y = x w^T (x m x k, w n x k, bf16 out) on the
shapes moeplan timed (its --json), operands quantized beforehand as moeplan's are.

bf16: torch.mm. fp8: torch._scaled_mm, E4M3, per-tensor scales (each operand's amax), without
and with use_fast_accum (moeplan's "fp8" and "fp8 fast"); and blockwise (x in 1 x 128 tiles, w in
128 x 128 blocks) where this PyTorch's _scaled_mm takes those scales (else the reason it gave).
Medians of CUDA-event timings after warm-up.
"""
import argparse
import json

import torch

from timing import E4M3, FMAX, median_ms, quant_tensor, write_json


def quant_blocks(x, bh):
    """x (r x c, c a multiple of 128; r of bh) in E4M3 by bh x 128 blocks: (q, factors r/bh x c/128)."""
    r, c = x.shape
    b = x.float().reshape(r // bh, bh, c // 128, 128)
    amax = b.abs().amax(dim=(1, 3), keepdim=True)
    s = torch.where(amax > 0, FMAX / amax, torch.ones_like(amax))
    q = (b * s).clamp(-FMAX, FMAX).to(E4M3).reshape(r, c)
    return q, (1.0 / s).reshape(r // bh, c // 128)


def time_shape(m, n, k, warmup, iters):
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(1)
    x = torch.randn(m, k, device=dev, dtype=bf)
    w = torch.randn(n, k, device=dev, dtype=bf)
    out = {}
    out["bf16"], _ = median_ms(lambda: torch.mm(x, w.t()), warmup, iters)
    qx, sx = quant_tensor(x)
    qw, sw = quant_tensor(w)
    for name, fast in (("fp8", False), ("fp8 fast", True)):
        out[name], _ = median_ms(
            lambda: torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw, out_dtype=bf,
                                     use_fast_accum=fast), warmup, iters)
    why = None
    if k % 128 or n % 128:
        why = "k and n not multiples of 128"
    else:
        try:
            bx, fx = quant_blocks(x, 1)
            bw, fw = quant_blocks(w, 128)
            # the layouts cuBLASLt's block scaling reads: x's factors outer-dim major (m
            # innermost), w's as (k/128, n/128)
            fx = fx.t().contiguous().t()
            fwt = fw.t()
            run = lambda: torch._scaled_mm(bx, bw.t(), scale_a=fx, scale_b=fwt, out_dtype=bf)
            y = run().float()
            ref = (bx.float() * fx.repeat_interleave(128, 1)) @ (
                bw.float() * fw.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
            err = ((y - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                why = f"blockwise _scaled_mm off its dequantized product by {err:.3g} (relative L2)"
            else:
                out["fp8block"], _ = median_ms(run, warmup, iters)
        except (RuntimeError, TypeError, ValueError) as e:
            why = str(e).splitlines()[0][:160]
    return out, why


def main():
    ap = argparse.ArgumentParser(prog="gemm_peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moeplan", required=True, help="moeplan bench gemm --json: its shapes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    shapes = json.load(open(a.moeplan))["shapes"]
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "shapes": []}
    for s in shapes:
        ms, why = time_shape(s["m"], s["n"], s["k"], a.warmup, a.iters)
        row = {"what": s["what"], "m": s["m"], "n": s["n"], "k": s["k"],
               "gemm_us": {kd: v * 1e3 for kd, v in ms.items()}}
        if why:
            row["fp8block_not_run"] = why
        res["shapes"].append(row)
        print(f"torch {torch.__version__} {s['what']} {s['m']}x{s['n']}x{s['k']}: " +
              ", ".join(f"{kd} {v:.3f} ms" for kd, v in ms.items()) +
              (f"; fp8block: {why}" if why else ""))
    if a.json:
        write_json(a.json, res)


if __name__ == "__main__":
    main()
