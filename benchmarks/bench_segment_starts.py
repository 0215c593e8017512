"""segment_starts (first sample of each sample's ray) against the cummax formulation it replaced, on CUDA.

    python benchmarks/bench_segment_starts.py      # one JSON line: microseconds per call at 300k and 2M samples
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lift3d.render.volume.compositing import segment_starts  # noqa: E402


def cummax_segment_starts(ray_indices: torch.Tensor) -> torch.Tensor:
    """The previous formulation: a running max of segment-start positions (a scan that also computes indices)."""
    n = ray_indices.shape[0]
    positions = torch.arange(n, device=ray_indices.device)
    is_first = torch.ones(n, dtype=torch.bool, device=ray_indices.device)
    is_first[1:] = ray_indices[1:] != ray_indices[:-1]
    return torch.cummax(torch.where(is_first, positions, torch.zeros_like(positions)), dim=0).values


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record: dict[str, object] = {"bench": "segment_starts", "device": device}
    for n in (300_000, 2_000_000):
        rays = torch.sort(torch.randint(0, 4096, (n,), device=device)).values
        assert torch.equal(cummax_segment_starts(rays), segment_starts(rays))
        for name, fn in (("cummax", cummax_segment_starts), ("table", segment_starts)):
            for _ in range(3):
                fn(rays)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(50):
                fn(rays)
            if device == "cuda":
                torch.cuda.synchronize()
            record[f"{name}_{n}_us"] = round((time.perf_counter() - start) / 50 * 1e6, 1)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
