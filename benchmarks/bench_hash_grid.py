"""Hash-grid Triton kernels alone: forward and table-gradient times over launch settings and index widths.

Points are laid out as a renderer makes them (``--rays`` rays of ``--samples`` points each, in order along the
ray) or uniformly at random; the layout is mvdream's (16 levels x 2 features, 2^19 rows, 16 -> 4096 cells).
One JSON line per setting (median ms of ``--reps`` after warm-up, lookups per second), then a summary line
comparing the fastest setting with the shipped one (``hash_triton.LAUNCH``, int32 rows where they fit).

    python benchmarks/bench_hash_grid.py --rays 262144 --samples 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETTINGS = [(64, 2), (128, 4), (128, 8), (256, 4), (256, 8), (512, 8)]


def ray_points(rays: int, samples: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """[rays * samples, 3] points in [0, 1]^3, each ray's samples contiguous and in order (a chord of 0.6)."""
    origins = 0.2 + 0.6 * torch.rand(rays, 1, 3, generator=generator, device=device)
    directions = torch.nn.functional.normalize(torch.randn(rays, 1, 3, generator=generator, device=device), dim=-1)
    t = torch.linspace(-0.3, 0.3, samples, device=device)[None, :, None]
    return (origins + t * directions).clamp(0, 1).reshape(-1, 3).contiguous()


def median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rays", type=int, default=262144)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    import lift3d.fields.hash_triton as ht
    from lift3d.fields.encodings import hash_grid_layout

    device = torch.device("cuda")
    layout = hash_grid_layout(16, 2, 19, 16, 1.4472692374)
    generator = torch.Generator(device=device).manual_seed(0)
    table = (torch.rand(layout.n_rows, 2, generator=generator, device=device) * 2e-4 - 1e-4).requires_grad_(True)
    shipped = (dict(ht.LAUNCH), ht._wide_rows)
    n = args.rays * args.samples
    cases = {"along_rays": ray_points(args.rays, args.samples, generator, device),
             "uniform": torch.rand(n, 3, generator=generator, device=device)}
    records = []
    for (name, points), (block, warps), wide in itertools.product(cases.items(), SETTINGS, (False, True)):
        ht.LAUNCH = {"forward": (block, warps), "backward": (block, warps)}
        ht._wide_rows = lambda _layout, wide=wide: wide
        grad = torch.randn(n, layout.output_dim, generator=generator, device=device)

        def forward(points=points) -> None:
            with torch.no_grad():
                ht.hash_grid_encode_triton(points, table, layout)

        def forward_backward(points=points, grad=grad) -> None:
            table.grad = None
            (ht.hash_grid_encode_triton(points, table, layout) * grad).sum().backward()

        fwd, both = median_ms(forward, args.reps), median_ms(forward_backward, args.reps)
        record = {"bench": "hash_grid", "points": name, "n": n, "block": block, "warps": warps, "int64_rows": wide,
                  "forward_ms": round(fwd, 3), "forward_backward_ms": round(both, 3),
                  "forward_G_lookups_per_s": round(n * layout.n_levels / fwd / 1e6, 2)}
        records.append(record)
        print(json.dumps(record), flush=True)
    ht.LAUNCH, ht._wide_rows = shipped
    for name in cases:
        rows = [r for r in records if r["points"] == name]
        reference = next(r for r in rows if (r["block"], r["warps"]) == (128, 4) and r["int64_rows"])
        current = next(r for r in rows if [r["block"], r["warps"]] == list(shipped[0]["forward"]) and not r["int64_rows"])
        best_fwd = min(rows, key=lambda r: r["forward_ms"])
        best_both = min(rows, key=lambda r: r["forward_backward_ms"])
        print(json.dumps({"bench": "hash_grid", "summary": name, "before_int64_128x4": reference, "shipped": current,
                          "fastest_forward": best_fwd, "fastest_forward_backward": best_both,
                          "forward_speedup_shipped": round(reference["forward_ms"] / current["forward_ms"], 3),
                          "forward_speedup_best": round(reference["forward_ms"] / best_fwd["forward_ms"], 3)}), flush=True)
    print(json.dumps({"bench": "hash_grid", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
