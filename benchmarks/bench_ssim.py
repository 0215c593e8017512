"""SSIM forward + backward as the 3DGS loss runs it (replayed as a CUDA graph): the Triton blur against the grouped
convolution it replaced, at 400x400 and 800x800. One JSON line: median ms of each, and their ratio.

    python benchmarks/bench_ssim.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lift3d import metrics  # noqa: E402
from lift3d.metrics import ssim_triton as metrics_triton  # noqa: E402


def replayed_ms(size: int, repeats: int = 200) -> float:
    """Median ms of one replay of SSIM's forward and backward on a [1, size, size, 3] image."""
    prediction = torch.rand(1, size, size, 3, device="cuda", requires_grad=True)
    target = torch.rand(1, size, size, 3, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            metrics.ssim(prediction, target).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    prediction.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        metrics.ssim(prediction, target).sum().backward()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(torch.tensor(times).median())


def main() -> None:
    assert metrics_triton.available(torch.device("cuda")), "the Triton blur did not pass its check on this GPU"
    record: dict = {"bench": "ssim", "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for size in (400, 800):
        triton_ms = replayed_ms(size)
        with mock.patch.object(metrics_triton, "available", lambda device: False):
            conv_ms = replayed_ms(size)
        record[f"{size}"] = {"triton_ms": round(triton_ms, 4), "conv_ms": round(conv_ms, 4),
                             "speedup": round(conv_ms / triton_ms, 2)}
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
