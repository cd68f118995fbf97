"""What the peer scripts share: the median of CUDA-event timings after warm-up, writing their
results as JSON, the MoE peers' arguments with moeplan's routing, and fp8's per-tensor
quantization."""
import argparse
import json
import os
import sys

import numpy as np

import torch


def median_ms(fn, warmup, iters):
    """Median milliseconds of fn() over iters runs after warmup runs, and fn's last result."""
    out = None
    for _ in range(warmup):
        out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], out


def write_json(path, obj):
    """obj as JSON at path, whole or not at all (written beside it, then renamed)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def moe_args(name, doc):
    """The MoE peers' command line (shape, moeplan's routing, iterations) parsed, and the routing
    read: (args, expert ids as an int32 array of tokens x topk)."""
    ap = argparse.ArgumentParser(prog=name, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("experts", "tokens", "topk", "hidden", "ffn"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--routing", required=True, help="the routing moeplan used (--routing-out)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    choice = np.fromfile(a.routing, dtype=np.int32)
    if choice.size != a.tokens * a.topk or choice.min() < 0 or choice.max() >= a.experts:
        sys.exit(f"{name}: {a.routing}: expected {a.tokens}x{a.topk} expert ids below {a.experts}")
    return a, choice


E4M3 = torch.float8_e4m3fn
FMAX = torch.finfo(E4M3).max


def quant_tensor(x):
    """x in E4M3 with one scale from its amax: (q, dequantization factor, a 0-d float32 tensor)."""
    amax = x.abs().amax().float()
    s = torch.where(amax > 0, FMAX / amax, torch.ones_like(amax))
    return (x.float() * s).clamp(-FMAX, FMAX).to(E4M3), (1.0 / s)
