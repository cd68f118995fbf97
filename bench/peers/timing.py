"""What the peer scripts share: the median of CUDA-event timings after warm-up, and writing their
results as JSON."""
import json
import os

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
