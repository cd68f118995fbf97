"""PyTorch's fused AdamW over N fp32 parameters with fp32 gradients (its update reads the
parameter, gradient and both moments and writes the parameter and the moments: 28 bytes a
parameter), and its tensor copy's bandwidth, on this GPU; the median of CUDA-event timings.

    python3 bench/peers/adamw_peer.py --params N [--iters 20] [--json FILE]
"""
import argparse

import torch

from timing import median_ms, write_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=1_000_000_000)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    # eight tensors, as a model's parameters come in several (the fused kernel walks a list)
    sizes = [a.params // 8] * 7 + [a.params - 7 * (a.params // 8)]
    params = [torch.nn.Parameter(torch.randn(s, device=dev) * 0.02) for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 0.01
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    ms, _ = median_ms(opt.step, 3, a.iters)
    src = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms, _ = median_ms(lambda: dst.copy_(src), 3, a.iters)
    bw = 28.0 * a.params / (ms * 1e6)
    copy_bw = 2.0 * src.numel() / (copy_ms * 1e6)
    r = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "params": a.params,
         "update_ms": ms, "ps_per_param": ms * 1e9 / a.params, "gb_per_s": bw,
         "copy_gb_per_s": copy_bw}
    print(f"torch {r['torch']} fused AdamW: {a.params} parameters, {ms:.3f} ms, "
          f"{r['ps_per_param']:.2f} ps a parameter, {bw:.0f} GB/s, "
          f"{100 * bw / copy_bw:.1f}% of the copy bandwidth ({copy_bw:.0f} GB/s)")
    if a.json:
        write_json(a.json, r)


if __name__ == "__main__":
    main()
