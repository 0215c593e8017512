"""TripoSR benchmark with random weights of the released sizes (DINO ViT-B/16 at 512 px, 16 blocks of 1024-wide
triplane tokens, 3 x 40 x 64 x 64 planes, a 9-layer decoder): load through the released-layout path, one forward
pass, marching cubes at 256^3 and the textured .glb export; one JSON line with each stage's seconds and peak memory.

Random weights make an almost constant density, so the meshing stages run on a field of the same network whose
planes and decoder are set to a sphere of radius 0.5 (about the faces a real object gives at 256^3); the forward
pass runs the random weights. ``marching_cubes_parts_s`` splits the meshing time: density grid, marching cubes with its
clean-up and decimation, vertex colors.

    source benchmarks/device_env.sh && python benchmarks/bench_triposr.py            # fp16 on CUDA
    python benchmarks/bench_triposr.py --device cpu --dtype fp32 --resolution 64       # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lift3d.generators.triposr import DINO_VITB16, TripoSRGenerator, release_config, released_state_dict  # noqa: E402
from lift3d.generators.triposr_model import TripoSRArchitecture, TripoSRNetwork  # noqa: E402


def write_random_release(folder: Path, arch: TripoSRArchitecture | None = None, vit_sizes: dict | None = None) -> Path:
    """A TripoSR folder (config.yaml + model.safetensors, released names) with random weights of the real sizes
    (or of ``arch`` and the ViT's ``vit_sizes``: tiny models for CPU smoke runs)."""
    from safetensors.torch import save_file
    from transformers import ViTConfig

    torch.manual_seed(0)
    arch = arch or TripoSRArchitecture()
    vit = ViTConfig(**(vit_sizes or DINO_VITB16))
    vit.save_pretrained(folder / "dino-vitb16")
    network = TripoSRNetwork(arch, vit)
    (folder / "config.yaml").write_text(release_config(arch, folder / "dino-vitb16"))
    save_file({k: v.half().contiguous() for k, v in released_state_dict(network).items()}, str(folder / "model.safetensors"))
    return folder


@torch.no_grad()
def sculpt_sphere(field: torch.nn.Module, radius: float = 0.5, iso: float = 25.0) -> None:
    """Set the field's planes and decoder so its density crosses ``iso`` on a sphere of ``radius`` (same sizes, same cost):
    channel 0 of each plane holds -(u^2 + v^2), the decoder passes their sum through (SiLU is near identity above 4)."""
    planes, layers = field.triplane, [m for m in field.decoder.layers if isinstance(m, torch.nn.Linear)]
    c, r = planes.shape[1], planes.shape[-1]
    u = (torch.arange(r, device=planes.device) + 0.5) / r * 2 - 1
    planes.zero_()
    planes[:, 0] = -(u[None, :] ** 2 + u[:, None] ** 2)
    for i, layer in enumerate(layers):
        layer.weight.zero_()
        layer.bias.zero_()
        if i == 0:
            layer.weight[:, [0, c, 2 * c]] = 1.0
            layer.bias.fill_(10.0)
        elif i < len(layers) - 1:
            layer.weight.copy_(torch.eye(layer.weight.shape[0], device=planes.device))
    k, unit_r = 20.0, radius / field.cfg.radius  # raw density = k * (sum - s_iso) + log(iso) + 1 - bias
    s_iso = -2 * unit_r**2
    last = layers[-1]
    last.weight[0, 0] = k
    last.bias[0] = -k * (10.0 + s_iso) + math.log(iso) + 1 - field.cfg.density_bias
    last.bias[1:] = torch.tensor([1.0, 0.0, -1.0], device=planes.device)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="auto (fp16 on CUDA), fp32, fp16, bf16")
    parser.add_argument("--resolution", type=int, default=256, help="marching-cubes samples per side")
    parser.add_argument("--texture-sizes", default="0,1024", help="comma-separated: each a timed .glb export (0: vertex colors)")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward passes (median reported)")
    args = parser.parse_args()
    from lift3d.export import ExportConfig, ExportSources, export_formats, mesh_from_field
    from lift3d.saving import OutputSaver

    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    record: dict = {"bench": "triposr", "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
                    "torch": torch.__version__, "resolution": args.resolution}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_release(Path(tmp) / "triposr")
        start = time.perf_counter()
        generator = TripoSRGenerator({"pretrained_model_name_or_path": str(folder), "dtype": args.dtype}).load(device)
        sync()
        record["load_s"] = round(time.perf_counter() - start, 3)
    record["dtype"] = str(generator.dtype).removeprefix("torch.")
    ys, xs = torch.meshgrid(torch.arange(600), torch.arange(800), indexing="ij")
    disc = (((ys - 280) ** 2 + (xs - 430) ** 2) < 200**2).float()
    rgba = torch.stack([disc, 0.5 * disc, 0.2 * disc, disc], -1).to(device)
    start = time.perf_counter()
    images = generator.preprocess(rgba)[None]
    sync()
    record["preprocess_s"] = round(time.perf_counter() - start, 4)
    generator.triplanes(images)  # warm-up (kernel selection)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        generator.triplanes(images)
        sync()
        times.append(time.perf_counter() - start)
    record["forward_s"] = round(statistics.median(times), 4)
    if cuda:
        record["forward_peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    field = generator.generate(rgba).build().to(device)
    del generator
    sculpt_sphere(field)
    sizes = [int(size) for size in args.texture_sizes.split(",")]
    cfg = ExportConfig(resolution=args.resolution, threshold=25.0, texture_size=sizes[0], formats=["glb"])
    albedo = lambda p: torch.sigmoid(field.features(p))  # noqa: E731  (the emission material's color)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    clock, progress_log = StageClock(), logging.getLogger("lift3d.progress")
    progress_log.addHandler(clock)
    progress_log.setLevel(logging.INFO)
    with torch.no_grad():
        start = time.perf_counter()
        mesh = mesh_from_field(field.density, field.bbox, cfg, color_fn=albedo, device=device)
        sync()
        end = time.perf_counter()
        record["marching_cubes_s"] = round(end - start, 3)
        record["marching_cubes_parts_s"] = clock.split(end)
        progress_log.removeHandler(clock)
        record["faces"] = int(len(mesh.faces))
        for size in sizes:  # the same mesh exported with vertex colors and with a baked texture of each size
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                written = export_formats(OutputSaver(Path(out)), ["glb"], replace(cfg, texture_size=size),
                                         ExportSources(mesh=lambda: mesh, color_fn=albedo, device=device))
                sync()
                record[f"export_glb_texture{size}_s"] = round(time.perf_counter() - start, 3)
                record[f"glb_texture{size}_mb"] = round(written[0].stat().st_size / 2**20, 2)
    if cuda:
        record["mesh_export_peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    for size in sizes:
        total = record["forward_s"] + record["marching_cubes_s"] + record[f"export_glb_texture{size}_s"]
        record[f"forward_mesh_export_texture{size}_s"] = round(total, 3)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
