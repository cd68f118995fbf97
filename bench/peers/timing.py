"""What the peer scripts share: the median of CUDA-event timings after warm-up."""
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
