"""Texture bake: ``bake_texture`` on a sphere mesh whose UV atlas is made once beforehand (so the timing is the bake
itself: texel rasterization, color queries, seam filling), and the xatlas atlas on its own.

Prints one JSON line (median of ``--repeats`` runs):
    python -m benchmarks bake_texture --device cpu --faces 20000 --size 512 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch

from benchmarks.timing import time_calls
from lift3d.export import bake_texture, extract_mesh
from lift3d.export.texture import unwrap_uv


def sphere_density(points: torch.Tensor) -> torch.Tensor:
    return 50.0 * torch.sigmoid((0.6 - points.norm(dim=-1)) / 0.01)


def stand_in_color(points: torch.Tensor) -> torch.Tensor:
    """A cheap color field: what the bake costs around the field's own queries."""
    return (0.5 + 0.5 * points).clamp(0, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks bake_texture", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--faces", type=int, default=20000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--resolution", type=int, default=128, help="marching cubes grid of the sphere")
    args = parser.parse_args(argv)
    mesh = extract_mesh(sphere_density, torch.tensor([[-1.0, -1, -1], [1, 1, 1]]), args.resolution,
                        color_fn=stand_in_color, target_faces=args.faces)
    atlas_start = time.perf_counter()
    unwrapped = unwrap_uv(mesh, args.size)
    atlas_s = time.perf_counter() - atlas_start
    timed = time_calls(lambda: bake_texture(unwrapped, stand_in_color, args.size, device=args.device),
                       torch.device(args.device), args.repeats, warmup=1)
    print(json.dumps({"name": "bake_texture", "faces": len(unwrapped.faces), "texture_size": args.size,
                      "device": args.device, "xatlas_s": round(atlas_s, 3), **timed, "torch": torch.__version__,
                      "numpy": np.__version__, "python": platform.python_version()}))
    return 0
