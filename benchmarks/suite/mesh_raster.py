"""Mesh rasterizer throughput: a bumpy sphere of ~10k / ~100k faces rendered at 512x512 with
interpolated vertex colors and silhouette antialiasing, forward and forward+backward.

    python -m benchmarks mesh_raster [--device cuda] [--resolution 512] [--faces 10000 100000]

Prints one JSON line per case: milliseconds per render (median), images/s, peak memory (CUDA).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from benchmarks.records import device_name
from benchmarks.timing import time_calls
from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.primitives import sphere_with_faces
from lift3d.meshes.topology import edge_topology
from lift3d.render.meshes.renderer import MeshRenderer


def bumpy_sphere(target_faces: int, device: torch.device) -> Mesh:
    """About ``target_faces`` faces with bumps, colored by position."""
    mesh = sphere_with_faces(target_faces, bumps=0.08, device=device)
    mesh.vertex_colors = (mesh.vertices + 0.5).clamp(0, 1)
    return mesh


def run_case(mesh: Mesh, cameras: Cameras, backward: bool, antialias: bool, repeats: int, warmup: int) -> dict:
    renderer = MeshRenderer({"antialias": antialias}).to(mesh.vertices.device)
    topology = edge_topology(mesh.faces)
    vertices = mesh.vertices.clone().requires_grad_(backward)
    colors = mesh.vertex_colors.clone().requires_grad_(backward)
    device = mesh.vertices.device
    last: dict = {}

    def render() -> None:
        with torch.set_grad_enabled(backward):
            last["out"] = out = renderer(Mesh(vertices, mesh.faces, vertex_colors=colors), cameras, topology=topology)
            if backward:
                (out["rgb"].mean() + out["alpha"].mean()).backward()

    timed = time_calls(render, device, repeats, warmup)
    ms = timed["median_ms"]
    result = {
        "ms": ms,
        "images_per_s": round(len(cameras) * 1000 / ms, 2),
        "megapixels_per_s": round(len(cameras) * cameras.width * cameras.height / ms / 1000, 2),
        "covered_fraction": round(last["out"]["mask"].float().mean().item(), 4),
    }
    if device.type == "cuda":
        result["peak_memory_mib"] = round(timed["peak_mem_gib"] * 1024, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks mesh_raster", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--faces", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--batch", type=int, default=1, help="views rendered per call")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    c2w = orbit_c2w(args.batch, elevation_deg=20.0, distance=1.8)
    intrinsics = intrinsics_from_fovy(torch.full((args.batch,), math.radians(45.0)), args.resolution, args.resolution)
    cameras = Cameras(c2w, intrinsics, args.resolution, args.resolution).to(device)
    info = {
        "device": device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    for target in args.faces:
        mesh = bumpy_sphere(target, device)
        for backward, antialias, mode in ((False, False, "fwd_noaa"), (False, True, "fwd"), (True, True, "fwd+bwd")):
            result = run_case(mesh, cameras, backward, antialias, args.repeats, args.warmup)
            record = {
                "name": f"mesh_raster_{mode}",
                "faces": mesh.num_faces,
                "resolution": args.resolution,
                "batch": args.batch,
                **result,
                **info,
            }
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
