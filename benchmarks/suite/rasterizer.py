"""Gaussian rasterizer speed: forward and forward+backward, torch and gsplat backends.

Prints one JSON line per case. On a GPU (the default cases: 100k and 1M Gaussians at 512^2 and 800^2):

    python -m benchmarks rasterizer

On a CPU, to compare the torch backend's compositing modes (hand-derived backward vs plain autograd),
each case in a fresh process so its peak memory is its own:

    python -m benchmarks rasterizer --device cpu --backends torch --modes custom,autograd \
        --gaussians 10000,100000 --resolutions 128,512 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.records import device_name, environment
from benchmarks.timing import process_peak_rss_gib, time_calls
from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.splats import renderer as splat
from lift3d.render.splats.renderer import Splats, rasterize

REPO = Path(__file__).resolve().parents[2]


def scene(n: int, device: torch.device, seed: int = 0) -> Splats:
    """A ball of radius 1 filled with n Gaussians sized so they overlap a few times (like a trained scene)."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    means = direction * torch.rand(n, 1, generator=g) ** (1 / 3)
    spacing = (4 / 3 * math.pi / n) ** (1 / 3)
    scales = spacing * torch.exp(0.5 * torch.randn(n, 3, generator=g)) * 0.6
    opacities = torch.sigmoid(torch.randn(n, generator=g) + 1.0)
    sh = 0.3 * torch.randn(n, 16, 3, generator=g)
    return Splats(*(t.to(device) for t in (means, torch.randn(n, 4, generator=g), scales, opacities, sh)))


def cameras(resolution: int, device: torch.device) -> Cameras:
    c2w = look_at(torch.tensor([[0.0, -3.2, 1.2]]), torch.zeros(1, 3), torch.tensor([0.0, 0.0, 1.0]))
    return Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.8]), resolution, resolution), resolution, resolution).to(device)


def run_case(backend: str, n: int, resolution: int, mode: str, device: torch.device, repeats: int, tile_size: int) -> dict:
    """Median milliseconds of forward and of forward+backward for one configuration, plus peak memory."""
    splats, cams = scene(n, device), cameras(resolution, device)
    params = [t.requires_grad_() for t in (splats.means, splats.quats, splats.scales, splats.opacities, splats.sh)]
    original = splat.rasterize_torch
    if mode != "custom":
        splat.rasterize_torch = lambda *a, **k: original(*a, **{**k, "mode": mode})
    options = {"backend": backend, "sh_degree": 3, "tile_size": tile_size}
    if device.type == "cuda":
        options["chunk_elements"] = 1 << 25

    def forward() -> dict:
        with torch.no_grad():
            return rasterize(splats, cams, **options)

    def forward_backward() -> None:
        out = rasterize(splats, cams, **options)
        (out["rgb"].sum() + out["alpha"].sum()).backward()
        for p in params:
            p.grad = None

    result = {}
    try:
        for name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):  # the warm-up call builds gsplat's kernels
            timed = time_calls(fn, device, repeats, warmup=1, digits=2)
            result[f"{name}_ms"] = timed["median_ms"]
            if device.type == "cuda":
                result[f"{name}_peak_gib"] = timed["peak_mem_gib"]
        with torch.no_grad():
            out = rasterize(splats, cams, **options)
        result["visible"] = int((out["radii"] > 0).all(-1).sum())
        result["coverage"] = round(float(out["alpha"].mean()), 3)
    finally:
        splat.rasterize_torch = original
    if device.type == "cpu":
        result["peak_rss_gib"] = process_peak_rss_gib()
        result["threads"] = torch.get_num_threads()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks rasterizer",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backends", default="gsplat,torch", help="comma-separated: gsplat, torch")
    parser.add_argument("--gaussians", default="100000,1000000", help="comma-separated Gaussian counts")
    parser.add_argument("--resolutions", default="512,800", help="comma-separated square image sizes")
    parser.add_argument("--modes", default="custom", help="torch backend compositing: custom and/or autograd")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tile-size", type=int, default=16, help="torch backend tile size")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, in this process
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.case:
        backend, n, resolution, mode = args.case.split(":")
        print(json.dumps(run_case(backend, int(n), int(resolution), mode, device, args.repeats, args.tile_size)))
        return 0
    info = {**environment(device), "device": device_name(device)}
    for backend in args.backends.split(","):
        for n in (int(v) for v in args.gaussians.split(",")):
            for resolution in (int(v) for v in args.resolutions.split(",")):
                for mode in args.modes.split(",") if backend == "torch" else ["-"]:
                    case = {"bench": "rasterizer", "backend": backend, "gaussians": n, "resolution": resolution,
                            "mode": mode, **info}
                    try:
                        if device.type == "cpu":  # a fresh process per case: peak RSS is the case's own
                            command = [sys.executable, "-m", "benchmarks", "rasterizer", "--device", "cpu", "--repeats",
                                       str(args.repeats), "--tile-size", str(args.tile_size),
                                       "--case", f"{backend}:{n}:{resolution}:{mode}"]
                            done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO)
                            case.update(json.loads(done.stdout.strip().splitlines()[-1]))
                        else:
                            case.update(run_case(backend, n, resolution, mode, device, args.repeats, args.tile_size))
                    except Exception as error:  # report and go on: one failing case must not hide the others
                        message = getattr(error, "stderr", None) or str(error)
                        case["error"] = str(message).strip().splitlines()[-1][:300]
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    print(json.dumps(case), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
