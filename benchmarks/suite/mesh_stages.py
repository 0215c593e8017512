"""Time training steps of the mesh stages at 512x512 with Stable Diffusion 2.1-base-shaped random weights.

Each case builds the recipe's system from its shipped config (``configs/<recipe>.yaml``) with the
guidance's UNet and VAE replaced by random-weight SD-2.1-base-shaped models (``stand_ins.random_sd``), so
nothing is downloaded and the compute is the real one. A step is what Lightning runs: DMTet marching
tets (or the fixed mesh), rasterization + texture field + material at 512x512, the guidance (VAE
encode + UNet; VSD adds its LoRA step), the mesh regularizers, backward and the Adam step. DMTet starts
from a sphere (as from a converted NeRF stage, the cost depends on the surface's size, not its shape).
Prints one JSON line per case: steps/s, median/p90 step time, the render-only share (forward +
backward of the mesh part alone), faces and peak GPU memory. The ``gaussian-sds-texture`` case starts
from a real conversion instead: a gaussian-sds system with ``--gaussians`` Gaussians in its init ball
(random colors) meshed into the frozen DMTet and its colors fitted, timed as ``convert_s``.

    python -m benchmarks mesh_stages                       # CUDA GPU, ~2 minutes (--budget-s 120)
    python -m benchmarks mesh_stages --cases magic3d-refine
    python -m benchmarks mesh_stages --cases gaussian-sds-texture --gaussians 100000
    python -m benchmarks mesh_stages --tiny                # CPU smoke test: tiny models, 64x64, small grids
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.records import emit, environment, over_budget, unknown_case
from benchmarks.stand_ins.random_sd import build_sd_models
from benchmarks.timing import Stopwatch, peak_memory_gib, reset_peak_memory, time_calls
from lift3d.config import load_config
from lift3d.data.random_views import RandomViewsConfig, sample_random_views
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.systems.optim import build_optimizer

REPO = Path(__file__).resolve().parents[2]
# name -> (recipe, overrides, guidance kind, rough cost in seconds for the budget); run in this order
CASES: dict[str, tuple[str, list[str], str, float]] = {
    "magic3d-refine": ("magic3d-refine", ["system.geometry.shape_init=sphere"], "sds", 25),
    "magic3d-refine-grid64": (
        "magic3d-refine", ["system.geometry.shape_init=sphere", "system.geometry.grid_resolution=64"], "sds", 15),
    "prolificdreamer-geometry": ("prolificdreamer-geometry", ["system.geometry.shape_init=sphere"], "sds", 20),
    "prolificdreamer-texture": ("prolificdreamer-texture", ["system.geometry.shape_init=sphere"], "vsd", 35),
    "texture-mesh-spot": ("texture-mesh", [], "sds", 15),  # geometry.path: --mesh
    "gaussian-sds-texture": ("gaussian-sds-texture", [], "sds", 25),  # converted from --gaussians synthetic Gaussians
}
TINY_CONVERT = ["system.inherit_texture_steps=10", "system.inherit_texture_points=4096"]
TINY = ["data.height=64", "data.width=64", "system.guidance.resolution=64", "system.geometry.texture.encoding.n_levels=4",
        "system.geometry.texture.encoding.log2_hashmap_size=12"]
TINY_GRID = ["system.geometry.grid_resolution=16"]


def find_mesh(given: str) -> str:
    """``given``, else Spot from the shared test data, else a bumpy sphere (~6k faces) written to a temp .obj."""
    import os
    import tempfile

    if given:
        return given
    roots = [Path(os.environ["LIFT3D_TEST_DATA"])] if "LIFT3D_TEST_DATA" in os.environ else []
    for root in roots + [REPO / "shared" / "data", REPO.parent / "shared" / "data", Path("/work/shared/data")]:
        if (root / "meshes" / "spot" / "spot.obj").is_file():
            return str(root / "meshes" / "spot" / "spot.obj")
    import trimesh

    from lift3d.meshes.primitives import sphere_with_faces

    mesh = sphere_with_faces(6000, bumps=0.1)
    path = Path(tempfile.mkdtemp(prefix="bench-mesh-")) / "sphere.obj"
    trimesh.Trimesh(mesh.vertices.numpy(), mesh.faces.numpy(), process=False).export(path)
    return str(path)


def build_system(recipe: str, overrides: list[str], kind: str, models: Any,
                 device: torch.device) -> tuple[Any, RandomViewsConfig]:
    """The recipe's system with random-weight guidance models, on ``device``, and its view sampler config."""
    from lift3d.guidance.sds import StableDiffusionGuidance
    from lift3d.guidance.vsd import VSDGuidance

    # no per-step host sync for the non-finite check (Lightning runs it every 100 steps; here every step is step 0)
    cfg = load_config(recipe_config(recipe), overrides=["system.nonfinite_check_every=0", *overrides])
    base = find(cfg.system_type)

    class Benchmarked(base):  # type: ignore[misc, valid-type]
        def build_guidance(self) -> Any:
            cls = VSDGuidance if kind == "vsd" else StableDiffusionGuidance
            options = {**dict(self.cfg.guidance), "prompt": "a DSLR photo of a hamburger", "prompt_cache_dir": "none"}
            return cls(options, models=models)

    torch.manual_seed(0)
    system = Benchmarked(cfg.system).to(device)
    system.guidance  # noqa: B018  (built now, on the system's device)
    return system, RandomViewsConfig(**{k: v for k, v in dict(cfg.data).items() if k in RandomViewsConfig.__dataclass_fields__})


def batch_at(views: RandomViewsConfig, step: int, device: torch.device) -> dict[str, Any]:
    batch = sample_random_views(views, step, torch.Generator().manual_seed(step))
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}


def convert_from_gaussians(system: Any, n: int, device: torch.device) -> dict[str, Any]:
    """Convert ``system`` (the gaussian-sds-texture stage) from a gaussian-sds system holding ``n`` Gaussians
    drawn in its init ball with random colors and opacity 0.5; the conversion's seconds and peak memory."""
    from types import SimpleNamespace

    torch.manual_seed(0)
    previous = find("gaussian-sds")({"gaussians": {"sh_degree": 0, "init": "random", "init_points": n, "init_radius": 0.5,
                                                   "init_opacity": 0.5, "init_color": []}})
    previous.initialize_gaussians()
    reset_peak_memory(device)
    with Stopwatch(device) as clock:
        system.convert_from(previous, SimpleNamespace(system_type="gaussian-sds"))
    record: dict[str, Any] = {"convert_s": round(clock.seconds, 2), "gaussians": n}
    if device.type == "cuda":
        record["convert_peak_mem_gib"] = peak_memory_gib(device)
    return record


def time_case(name: str, system: Any, views: RandomViewsConfig, args, device: torch.device) -> dict[str, Any]:
    optimizer = build_optimizer(system, system.cfg.optimizer)

    def train_step(i: int) -> None:
        for part in system.updateables():
            part.update_step(0, i)
        loss = system.training_step(batch_at(views, i, device), i)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def render_step(i: int) -> None:
        mesh = system.geometry()
        out = system.render_mesh(mesh, batch_at(views, i, device), color=system.cfg.guidance_input == "rgb")
        (out["rgb"].mean() + out["normal"].mean()).backward()
        optimizer.zero_grad(set_to_none=True)

    steps = itertools.count()  # the step index goes on from the warm-up into the timed steps
    timed = time_calls(lambda: train_step(next(steps)), device, args.steps, args.warmup, digits=2)  # peak: training's
    renders = itertools.count()
    render_ms = None
    if args.render_steps:
        render_ms = time_calls(lambda: render_step(next(renders)), device, args.render_steps, warmup=0, digits=2)["median_ms"]
    record = {
        "case": name, "steps_per_s": round(1000.0 / timed["median_ms"], 3), **timed, "render_fwd_bwd_ms": render_ms,
        "resolution": views.height, "faces": int(system.geometry().num_faces),
        "grid_resolution": getattr(system.geometry.cfg, "grid_resolution", None),
    }
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks mesh_stages", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names, in order")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--render-steps", type=int, default=5, help="timed render-only forward+backward passes per case")
    parser.add_argument("--budget-s", type=float, default=120.0, help="skip cases whose rough cost would exceed this total")
    parser.add_argument("--mesh", default="", help="mesh file of the texture-mesh case (default: Spot from the test data)")
    parser.add_argument("--gaussians", type=int, default=100000, help="Gaussians the gaussian-sds-texture case converts from")
    parser.add_argument("--tiny", action="store_true", help="tiny models, 64x64 renders, 16^3 grids: a CPU smoke test")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*self.trainer.*")  # systems log through Lightning; none here
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        torch.set_num_threads(1)
    started = time.perf_counter()
    env = environment(device)
    shared = build_sd_models(args.tiny, device)
    for name in args.cases.split(","):
        if name not in CASES:
            emit(unknown_case("mesh_stages", name, CASES))
            continue
        recipe, overrides, kind, cost = CASES[name]
        skipped = None if args.tiny else over_budget("mesh_stages", name, cost, time.perf_counter() - started, args.budget_s)
        if skipped:
            emit(skipped)
            continue
        if recipe == "texture-mesh":
            overrides = overrides + [f"system.geometry.path={find_mesh(args.mesh)}"]
        if args.tiny:
            overrides = overrides + TINY + (TINY_GRID if "grid" not in name and recipe != "texture-mesh" else [])
            overrides = [o for o in overrides if o != "system.geometry.grid_resolution=64"]
            overrides = overrides + (TINY_GRID if "grid64" in name else [])
            overrides = overrides + (TINY_CONVERT if recipe == "gaussian-sds-texture" else [])
        try:
            models = shared if kind == "sds" else build_sd_models(args.tiny, device)  # VSD adds adapters: fresh models
            system, views = build_system(recipe, overrides, kind, models, device)
            converted = {}
            if recipe == "gaussian-sds-texture":
                converted = convert_from_gaussians(system, min(args.gaussians, 2000) if args.tiny else args.gaussians, device)
            record = {**time_case(name, system, views, args, device), **converted}
            del system
        except Exception as error:  # noqa: BLE001  (one failing case must not hide the others)
            traceback.print_exc(file=sys.stderr)
            emit({"bench": "mesh_stages", "case": name, "error": repr(error)[:500], **env})
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        mesh = next((o.split("=", 1)[1] for o in overrides if o.startswith("system.geometry.path=")), None)
        emit({"bench": "mesh_stages", **record, "guidance": kind, **({"mesh": Path(mesh).name} if mesh else {}), **env})
    emit({"bench": "mesh_stages", "summary": True, "total_s": round(time.perf_counter() - started, 1), **env})
    return 0


if __name__ == "__main__":
    sys.exit(main())
