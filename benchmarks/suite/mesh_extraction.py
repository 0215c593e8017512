"""Mesh extraction from a field and from Gaussians, UV unwrap + texture bake, and .glb / .splat writing: seconds per
stage on a sphere of known radius (and how far the mesh is from it).

Prints one JSON line per case: name, sizes, seconds per stage, device, versions.

    python -m benchmarks mesh_extraction                 # CPU-sized cases
    python -m benchmarks mesh_extraction --device cuda   # adds the GPU-sized cases
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.records import device_name
from benchmarks.timing import Stopwatch
from lift3d.export import GaussianField, GaussianTensors, bake_texture, extract_mesh, gaussian_bbox, write_glb, write_splat


def _versions() -> dict[str, str]:
    import mcubes  # noqa: F401
    import trimesh
    import xatlas  # noqa: F401

    return {"torch": torch.__version__, "trimesh": trimesh.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def sphere_density(points: torch.Tensor) -> torch.Tensor:
    return 50.0 * torch.sigmoid((0.6 - points.norm(dim=-1)) / 0.01)


def color(points: torch.Tensor) -> torch.Tensor:
    return (0.5 + 0.5 * points).clamp(0, 1)


def skin_gaussians(n: int, device: str) -> GaussianTensors:
    """``n`` Gaussians tiling a sphere of radius 0.5 (as in the tests), on ``device``."""
    i = torch.arange(n, dtype=torch.float64) + 0.5
    polar, azimuth = torch.acos(1 - 2 * i / n), math.pi * (1 + 5**0.5) * i
    normal = torch.stack([torch.cos(azimuth) * torch.sin(polar), torch.sin(azimuth) * torch.sin(polar), torch.cos(polar)], -1)
    normal = normal.float()
    spacing = math.sqrt(4 * math.pi * 0.25 / n)
    z = torch.tensor([0.0, 0.0, 1.0]).expand_as(normal)
    half = torch.nn.functional.normalize(z + normal, dim=-1)
    quats = torch.cat([(z * half).sum(-1, keepdim=True), torch.cross(z, half, dim=-1)], -1)
    scales = torch.tensor([0.7 * spacing, 0.7 * spacing, max(0.3 * spacing, 0.004)]).expand(n, 3).clone()
    g = GaussianTensors(0.5 * normal, scales, quats, torch.full((n,), 0.9), color(0.5 * normal))
    return GaussianTensors(*(t.to(device) for t in (g.means, g.scales, g.quats, g.opacities, g.colors)))


def field_case(device: str, resolution: int, target_faces: int, texture_size: int) -> dict:
    bbox = torch.tensor([[-1.0, -1, -1], [1, 1, 1]], device=device)
    with Stopwatch(device) as extract:
        mesh = extract_mesh(sphere_density, bbox, resolution, color_fn=color, target_faces=target_faces)
    with Stopwatch(device) as bake:
        textured = bake_texture(mesh, color, texture_size, device=device)
    with tempfile.TemporaryDirectory() as tmp, Stopwatch(device) as write:
        write_glb(textured, Path(tmp) / "m.glb")
    radius_error = float(np.abs(np.linalg.norm(mesh.vertices, axis=1) - 0.6).max() / (2 / (resolution - 1)))
    return {"name": f"field-sphere-r{resolution}", "resolution": resolution, "faces": len(mesh.faces),
            "texture_size": texture_size, "extract_s": extract.seconds, "unwrap_bake_s": bake.seconds,
            "write_glb_s": write.seconds,
            "max_radius_error_voxels": radius_error}


def gaussian_case(device: str, n: int, resolution: int) -> dict:
    g = skin_gaussians(n, device)
    with Stopwatch(device) as build:
        field = GaussianField(g)
    with Stopwatch(device) as extract:
        mesh = extract_mesh(field.density, gaussian_bbox(g), resolution, color_fn=field.color, fill_holes=True,
                            opacity_scale=1.0, device=device)
    with tempfile.TemporaryDirectory() as tmp, Stopwatch(device) as write:
        write_splat(Path(tmp) / "g.splat", g)
    r = np.linalg.norm(mesh.vertices, axis=1)
    return {"name": f"gaussians-{n}-r{resolution}", "gaussians": n, "resolution": resolution, "faces": len(mesh.faces),
            "table_entries": int(field._table.numel()), "build_s": build.seconds,
            "extract_s": extract.seconds, "write_splat_s": write.seconds,
            "radius_min": float(r.min()), "radius_max": float(r.max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks mesh_extraction", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = args.device
    cases = [lambda: field_case(device, 128, 20000, 512), lambda: gaussian_case(device, 20000, 96)]
    if device.startswith("cuda"):
        cases += [lambda: field_case(device, 256, 100000, 1024), lambda: field_case(device, 512, 100000, 1024),
                  lambda: gaussian_case(device, 300000, 256), lambda: gaussian_case(device, 1000000, 256)]
    for case in cases:
        result = case()
        result.update(bench="mesh_extraction", device=device_name(device), versions=_versions())
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
