"""TripoSR with random weights of the released sizes (``stand_ins.random_triposr``): load through the released-layout
path, one forward pass, marching cubes at 256^3 and the .glb export; one JSON line with each stage's seconds and peak
memory.

Random weights make an almost constant density, so the meshing stages run on a field of the same network whose
planes and decoder are set to a sphere of radius 0.5 (about the faces a real object gives at 256^3); the forward
pass runs the random weights. ``marching_cubes_parts_s`` splits the meshing time: density grid, marching cubes with its
clean-up and decimation, vertex colors.

    python -m benchmarks triposr                                                     # fp16 on CUDA
    python -m benchmarks triposr --device cpu --dtype fp32 --resolution 64           # a CPU smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.records import device_name
from benchmarks.stand_ins.random_triposr import sculpt_sphere, write_random_release
from benchmarks.timing import Stopwatch, peak_memory_gib, reset_peak_memory, time_calls
from lift3d.generators.triposr import TripoSRGenerator


class StageClock(logging.Handler):
    """Times when the meshing's progress stages start (density grid, marching cubes and clean-up, vertex colors), from
    the lines lift3d.progress logs as each begins, so the meshing time splits into its parts without a second run."""

    PARTS = {"meshing: density": "density_grid", "meshing: marching": "clean_up_decimation", "meshing: vertex": "vertex_colors"}

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.starts: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for prefix, part in self.PARTS.items():
            if message.startswith(prefix) and part not in self.starts:
                self.starts[part] = time.perf_counter()

    def split(self, end: float) -> dict[str, float]:
        """Seconds of each part that started, each up to the next one's start (the last up to ``end``)."""
        marks = sorted((t, part) for part, t in self.starts.items()) + [(end, "")]
        return {part: round(marks[i + 1][0] - t, 3) for i, (t, part) in enumerate(marks[:-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks triposr", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="auto (fp16 on CUDA), fp32, fp16, bf16")
    parser.add_argument("--resolution", type=int, default=256, help="marching-cubes samples per side")
    parser.add_argument("--texture-sizes", default="0,1024", help="comma-separated: each a timed .glb export (0: vertex colors)")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward passes (median reported)")
    args = parser.parse_args(argv)
    from lift3d.export import ExportConfig, ExportSources, export_formats, mesh_from_field
    from lift3d.saving import OutputSaver

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    record: dict = {"bench": "triposr", "device": device_name(device), "torch": torch.__version__,
                    "resolution": args.resolution}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_release(Path(tmp) / "triposr")
        with Stopwatch(device) as clock:
            generator = TripoSRGenerator({"pretrained_model_name_or_path": str(folder), "dtype": args.dtype}).load(device)
        record["load_s"] = round(clock.seconds, 3)
    record["dtype"] = str(generator.dtype).removeprefix("torch.")
    ys, xs = torch.meshgrid(torch.arange(600), torch.arange(800), indexing="ij")
    disc = (((ys - 280) ** 2 + (xs - 430) ** 2) < 200**2).float()
    rgba = torch.stack([disc, 0.5 * disc, 0.2 * disc, disc], -1).to(device)
    with Stopwatch(device) as clock:
        images = generator.preprocess(rgba)[None]
    record["preprocess_s"] = round(clock.seconds, 4)
    forward = time_calls(functools.partial(generator.triplanes, images), device, args.repeats, warmup=1)  # warm-up: kernels
    record["forward_s"] = round(forward["median_ms"] / 1000, 4)
    if cuda:
        record["forward_peak_mem_gb"] = forward["peak_mem_gib"]
    field = generator.generate(rgba).build().to(device)
    del generator
    sculpt_sphere(field)
    sizes = [int(size) for size in args.texture_sizes.split(",")]
    cfg = ExportConfig(resolution=args.resolution, threshold=25.0, texture_size=sizes[0], formats=["glb"])
    albedo = lambda p: torch.sigmoid(field.features(p))  # noqa: E731  (the emission material's color)
    reset_peak_memory(device)
    clock, progress_log = StageClock(), logging.getLogger("lift3d.progress")
    progress_log.addHandler(clock)
    progress_log.setLevel(logging.INFO)
    with torch.no_grad():
        with Stopwatch(device) as meshing:
            mesh = mesh_from_field(field.density, field.bbox, cfg, color_fn=albedo, device=device)
        record["marching_cubes_s"] = round(meshing.seconds, 3)
        record["marching_cubes_parts_s"] = clock.split(time.perf_counter())
        progress_log.removeHandler(clock)
        record["faces"] = int(len(mesh.faces))
        for size in sizes:  # the same mesh exported with vertex colors and with a baked texture of each size
            with tempfile.TemporaryDirectory() as out, Stopwatch(device) as export:
                written = export_formats(OutputSaver(Path(out)), ["glb"], replace(cfg, texture_size=size),
                                         ExportSources(mesh=lambda: mesh, color_fn=albedo, device=device))
                glb_mb = round(written[0].stat().st_size / 2**20, 2)
            record[f"export_glb_texture{size}_s"] = round(export.seconds, 3)
            record[f"glb_texture{size}_mb"] = glb_mb
    if cuda:
        record["mesh_export_peak_mem_gb"] = peak_memory_gib(device)
    for size in sizes:
        total = record["forward_s"] + record["marching_cubes_s"] + record[f"export_glb_texture{size}_s"]
        record[f"forward_mesh_export_texture{size}_s"] = round(total, 3)
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
