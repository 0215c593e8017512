"""Hash-grid Triton kernels alone: forward and table-gradient times over launch settings.

Points are laid out as a renderer makes them (``--rays`` rays of ``--samples`` points each, in order along the
ray) or uniformly at random; the layout is mvdream's (16 levels x 2 features, 2^19 rows, 16 -> 4096 cells).
One JSON line per setting (median ms of ``--reps`` after warm-up, lookups per second), then a summary line
comparing the fastest settings with the shipped ones (``hash_triton.LAUNCH``).

    python -m benchmarks hash_grid --rays 262144 --samples 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

from benchmarks.timing import event_median_ms

SETTINGS = [(64, 2), (128, 4), (128, 8), (256, 4), (256, 8), (512, 8)]


def ray_points(rays: int, samples: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """[rays * samples, 3] points in [0, 1]^3, each ray's samples contiguous and in order (a chord of 0.6)."""
    origins = 0.2 + 0.6 * torch.rand(rays, 1, 3, generator=generator, device=device)
    directions = torch.nn.functional.normalize(torch.randn(rays, 1, 3, generator=generator, device=device), dim=-1)
    t = torch.linspace(-0.3, 0.3, samples, device=device)[None, :, None]
    return (origins + t * directions).clamp(0, 1).reshape(-1, 3).contiguous()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks hash_grid", description=__doc__.splitlines()[0])
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
    shipped = dict(ht.LAUNCH)
    n = args.rays * args.samples
    cases = {"along_rays": ray_points(args.rays, args.samples, generator, device),
             "uniform": torch.rand(n, 3, generator=generator, device=device)}
    records = []
    for (name, points), (block, warps) in itertools.product(cases.items(), SETTINGS):
        ht.LAUNCH = {"forward": (block, warps), "backward": (block, warps)}
        grad = torch.randn(n, layout.output_dim, generator=generator, device=device)

        def forward(points=points) -> None:
            with torch.no_grad():
                ht.hash_grid_encode_triton(points, table, layout)

        def forward_backward(points=points, grad=grad) -> None:
            table.grad = None
            (ht.hash_grid_encode_triton(points, table, layout) * grad).sum().backward()

        fwd, both = event_median_ms(forward, args.reps), event_median_ms(forward_backward, args.reps)
        record = {"bench": "hash_grid", "points": name, "n": n, "block": block, "warps": warps,
                  "forward_ms": round(fwd, 3), "backward_ms": round(both - fwd, 3),
                  "forward_G_lookups_per_s": round(n * layout.n_levels / fwd / 1e6, 2)}
        records.append(record)
        print(json.dumps(record), flush=True)
    ht.LAUNCH = shipped
    for name in cases:
        rows = [r for r in records if r["points"] == name]
        best_forward = min(rows, key=lambda r: r["forward_ms"])
        best_backward = min(rows, key=lambda r: r["backward_ms"])
        forward = next(r for r in rows if [r["block"], r["warps"]] == list(shipped["forward"]))
        backward = next(r for r in rows if [r["block"], r["warps"]] == list(shipped["backward"]))
        print(json.dumps({"bench": "hash_grid", "summary": name, "shipped": shipped,
                          "shipped_forward_ms": forward["forward_ms"], "shipped_backward_ms": backward["backward_ms"],
                          "fastest_forward": best_forward, "fastest_backward": best_backward}), flush=True)
    print(json.dumps({"bench": "hash_grid", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
