"""Texture bake benchmark: ``bake_texture`` on a sphere mesh whose UV atlas is made once beforehand (so the timing is
the bake itself: texel rasterization, color queries, seam filling), and the xatlas atlas on its own.

Prints one JSON line per case (median of ``--repeats`` runs):
    python benchmarks/bench_bake_texture.py --device cpu --faces 20000 --size 512 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np
import torch

from lift3d.export import bake_texture, extract_mesh
from lift3d.export.texture import unwrap_uv


def sphere_density(points: torch.Tensor) -> torch.Tensor:
    return 50.0 * torch.sigmoid((0.6 - points.norm(dim=-1)) / 0.01)


def stand_in_color(points: torch.Tensor) -> torch.Tensor:
    """A cheap color field: what the bake costs around the field's own queries."""
    return (0.5 + 0.5 * points).clamp(0, 1)


def _timed(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--faces", type=int, default=20000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--resolution", type=int, default=128, help="marching cubes grid of the sphere")
    args = parser.parse_args()
    mesh = extract_mesh(sphere_density, torch.tensor([[-1.0, -1, -1], [1, 1, 1]]), args.resolution,
                        color_fn=stand_in_color, target_faces=args.faces)
    atlas_start = time.perf_counter()
    unwrapped = unwrap_uv(mesh, args.size)
    atlas_s = time.perf_counter() - atlas_start
    times = [_timed(lambda: bake_texture(unwrapped, stand_in_color, args.size, device=args.device), args.device)
             for _ in range(args.repeats)]
    print(json.dumps({"name": "bake-texture", "faces": len(unwrapped.faces), "texture_size": args.size,
                      "device": args.device, "repeats": args.repeats, "bake_median_s": round(statistics.median(times), 4),
                      "bake_all_s": [round(t, 4) for t in times], "xatlas_s": round(atlas_s, 3),
                      "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version()}))


if __name__ == "__main__":
    main()
