"""VGGT's speed on a GPU: one forward pass of the released sizes (random weights) for 20, 50 and 100 photos at the
model's resolution, with peak memory, and the whole `lift3d poses --method vggt` beside `--method sfm` on a capture.

``forward`` cases: VGGT-1B's network with random weights on the device (the same compute as the release), photos of
518 x ``--height`` (392: a 4:3 photo cropped as VGGT takes it), bfloat16 autocast on CUDA; milliseconds per pass
(median of ``--reps``) and peak memory. ``poses`` cases: a copy of the capture's photos posed from scratch by each
method as a user runs it (`lift3d poses DIR --method M --force`, a subprocess, wall seconds), VGGT reading a
random release of the real sizes written in the released layout (``benchmarks.stand_ins.random_vggt``).

    python -m benchmarks vggt_speed --capture ../shared/data/fox          # on a CUDA machine
    python -m benchmarks vggt_speed --frames 20,50 --no-poses
    python -m benchmarks vggt_speed --tiny                               # a CPU smoke run of every case
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.records import emit, environment
from benchmarks.stand_ins.random_vggt import random_network, write_random_release
from benchmarks.timing import time_calls

TINY_SIZES = {"embed_dim": 32, "depth": 4, "num_heads": 2, "backbone_depth": 2, "camera_trunk_depth": 1,
              "dpt_features": 16, "dpt_channels": (8, 16, 32, 32)}


def forward_case(network, frames: int, height: int, width: int, reps: int, chunk: int, device: torch.device) -> dict:
    """Time one forward pass of ``frames`` photos of ``width`` x ``height`` (random pixels)."""
    from lift3d.generators.vggt import predict_prepared

    images = torch.rand(frames, 3, height, width, device=device)
    record = {"bench": "vggt_speed", "case": "forward", "frames": frames, "size": [width, height], "chunk": chunk}
    try:
        timing = time_calls(lambda: predict_prepared(network, images, chunk), device, steps=reps, warmup=1, min_steps=1)
    except torch.OutOfMemoryError as error:
        return {**record, "error": f"out of memory: {str(error).splitlines()[0]}"}
    return {**record, **timing, "ms_per_photo": round(timing["median_ms"] / frames, 2)}


def poses_case(method: str, photos: Path, work: Path, weights: Path | None, extra: list[str]) -> dict:
    """Wall seconds of `lift3d poses` on a fresh copy of ``photos`` with ``method``, and what it printed last."""
    scene = work / f"{method}-scene"
    shutil.rmtree(scene, ignore_errors=True)
    shutil.copytree(photos, scene / "images")
    command = [sys.executable, "-m", "lift3d", "poses", str(scene), "--method", method, "--force", *extra]
    if weights is not None:
        command += ["--vggt-weights", str(weights)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if line.startswith("lift3d:")]
    record = {"bench": "vggt_speed", "case": "poses", "method": method, "photos": len(list(photos.iterdir())),
              "wall_s": round(wall, 2), "exit": done.returncode, "said": lines[-1][:300] if lines else ""}
    model = scene / "sparse" / "0"
    if done.returncode == 0 and model.is_dir():
        from lift3d.data.colmap_model import read_model

        posed = read_model(model)
        record.update(registered=len(posed.images), points=len(posed.points))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks vggt_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", default="20,50,100", help="photo counts of the forward cases (default 20,50,100)")
    parser.add_argument("--height", type=int, default=392, help="photo height at the model (default 392; 518 wide)")
    parser.add_argument("--reps", type=int, default=3, help="timed passes per forward case (default 3)")
    parser.add_argument("--chunk", type=int, default=8, help="photos at a time through the per-photo stages (default 8)")
    parser.add_argument("--capture", default=str(Path(os.environ.get("LIFT3D_TEST_DATA", "../shared/data")) / "fox"),
                        help="folder whose images/ the poses cases pose (default: the shared data's fox)")
    parser.add_argument("--no-poses", action="store_true", help="skip the poses cases")
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run: a tiny network, 2 and 3 photos at 56 px")
    parser.add_argument("--work", default=None, help="folder for the random release and the scenes (default: temporary)")
    args = parser.parse_args(argv)
    from lift3d.generators.vggt_model import VggtArchitecture

    arch = VggtArchitecture(**TINY_SIZES) if args.tiny else VggtArchitecture()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    frames = [2, 3] if args.tiny else [int(f) for f in args.frames.split(",") if f]
    width, height = (56, 42) if args.tiny else (518, args.height)
    emit({"bench": "vggt_speed", "case": "environment", "tiny": args.tiny, **environment(device)})
    network = random_network(arch, device)
    for count in frames:
        emit(forward_case(network, count, height, width, 1 if args.tiny else args.reps, args.chunk, device))
    del network
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.no_poses:
        return 0
    photos = Path(args.capture) / "images"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vggt_speed_"))
    if args.tiny:  # three small photos of the toy instead of a real capture
        from tests.sfm_scene import write_photos

        photos = work / "photos"
        write_photos(photos, n_views=3, resolution=64)
    if not photos.is_dir():
        emit({"bench": "vggt_speed", "case": "poses", "error": f"no photos in {photos}: give --capture DIR"})
        return 1
    start = time.perf_counter()
    weights = write_random_release(work / "random-vggt", arch, device=device)
    emit({"bench": "vggt_speed", "case": "random_release", "write_s": round(time.perf_counter() - start, 1),
          "gb": round(weights.stat().st_size / 1e9, 2)})
    extra = ["--vggt-size", "56"] if args.tiny else []
    emit(poses_case("vggt", photos, work, weights, extra))
    if not args.tiny:  # SfM of 3 tiny photos fails by design: the smoke run times VGGT's path only
        emit(poses_case("sfm", photos, work, None, []))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0
