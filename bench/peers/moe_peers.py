#!/usr/bin/env python3
"""PyTorch peers of `moeplan bench moe`, on the same shape and the same routing.

Times, forward + backward with weight gradients, bf16, medians of CUDA-event timings after warm-up:
  grouped_mm block  the expert block with torch._grouped_mm (gate/up, SwiGLU, down)
  torch MoE layer   router GEMM, softmax, the given top-k routing, argsort permutation, the
                    grouped_mm block, weighted index_add_ combine
  torch dense       the same GEMM chain on all rows with one weight set (the ceiling)
FLOPs as moeplan counts them: 18 x rows x hidden x ffn for the block, plus 6 x tokens x hidden x
experts for the router. The routing is read from `moeplan bench moe --routing-out` (int32, tokens x
topk), so both sides compute the same rows per expert.
"""
import torch
import torch.nn.functional as F

from timing import median_ms, moe_args, write_json


def main():
    a, choice = moe_args("moe_peers", __doc__)
    E, T, K, H, Fd = a.experts, a.tokens, a.topk, a.hidden, a.ffn
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(1)
    choice = torch.from_numpy(choice.reshape(T, K)).to(dev).long()
    R = T * K
    counts = torch.bincount(choice.flatten(), minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    wg = (torch.randn(E, Fd, H, device=dev, dtype=bf) * 0.02).requires_grad_()
    wu = (torch.randn(E, Fd, H, device=dev, dtype=bf) * 0.02).requires_grad_()
    wd = (torch.randn(E, H, Fd, device=dev, dtype=bf) * 0.02).requires_grad_()
    wr = (torch.randn(E, H, device=dev, dtype=torch.float32) * 0.02).requires_grad_()

    def block(xp):
        g = torch._grouped_mm(xp, wg.transpose(-2, -1), offs=offs)
        u = torch._grouped_mm(xp, wu.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(F.silu(g) * u, wd.transpose(-2, -1), offs=offs)

    xp = torch.randn(R, H, device=dev, dtype=bf).requires_grad_()
    dyp = torch.randn(R, H, device=dev, dtype=bf)

    def run_block():
        block(xp).backward(dyp)

    x = torch.randn(T, H, device=dev, dtype=bf).requires_grad_()
    dy = torch.randn(T, H, device=dev, dtype=bf)
    flat = choice.flatten()

    def run_layer():
        logits = x.float() @ wr.t()
        probs = torch.softmax(logits, dim=-1)
        w = torch.gather(probs, 1, choice)
        w = w / w.sum(-1, keepdim=True)
        order = torch.argsort(flat, stable=True)
        src = order // K
        yp = block(x[src])
        out = torch.zeros(T, H, device=dev, dtype=torch.float32)
        out = out.index_add(0, src, yp.float() * w.flatten()[order, None])
        out.to(bf).backward(dy)

    xd = torch.randn(R, H, device=dev, dtype=bf).requires_grad_()
    w0g = wg[0].detach().clone().requires_grad_()
    w0u = wu[0].detach().clone().requires_grad_()
    w0d = wd[0].detach().clone().requires_grad_()

    def run_dense():
        (((F.silu(xd @ w0g.t()) * (xd @ w0u.t())) @ w0d.t())).backward(dyp)

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    layer_ms, _ = median_ms(run_layer, a.warmup, a.iters)
    layer_peak = torch.cuda.max_memory_allocated() - base
    block_ms, _ = median_ms(run_block, a.warmup, a.iters)
    dense_ms, _ = median_ms(run_dense, a.warmup, a.iters)
    bf_ = 18.0 * R * H * Fd
    lf = bf_ + 6.0 * T * H * E
    res = {
        "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "block_ms": block_ms, "layer_ms": layer_ms, "dense_ms": dense_ms,
        "block_tflops": bf_ / block_ms / 1e9, "layer_tflops": lf / layer_ms / 1e9,
        "dense_tflops": bf_ / dense_ms / 1e9, "layer_peak_bytes": layer_peak,
    }
    print(f"torch {torch.__version__}: grouped_mm block {block_ms:.3f} ms ({res['block_tflops']:.1f} TFLOPS), "
          f"MoE layer {layer_ms:.3f} ms ({res['layer_tflops']:.1f}), dense {dense_ms:.3f} ms "
          f"({res['dense_tflops']:.1f}); layer peak memory {layer_peak / 2**30:.2f} GiB")
    if a.json:
        write_json(a.json, res)


if __name__ == "__main__":
    main()
