"""Image-to-3D recipes end to end on a GPU, as `lift3d generate --image` runs them: wall time of each stage
(model loading and compilation included, as a user waits for them), its training steps/s, and peak GPU memory,
with Stable-Zero123-shaped (and SD-2.1-shaped, for magic123's text prior) random weights.

    python -m benchmarks image_to_3d                               # dreamgaussian-image + its mesh stage, magic123 coarse
    python -m benchmarks image_to_3d --cases zero123-nerf --steps-cap 200
    python -m benchmarks image_to_3d --cases dreamgaussian-image,triposr-refine   # time to the final .glb, both
    python -m benchmarks image_to_3d --cases dreamgaussian-image,triposr-refine --tiny --steps-cap 2   # CPU smoke

Each stage prints one JSON line (training only: the test orbit and exports are not timed, unless --to-glb). Targets
(one GPU): dreamgaussian-image stage 1 (500 steps) < 40 s and its mesh stage < 40 s, peak < 8 GB; magic123 coarse
stage < 12 GB.

``triposr-refine`` is `lift3d generate --image --method triposr --refine`: a random TripoSR of the released sizes (its
generated field set to a sphere, as the triposr benchmark does, so meshing and occupancy see a surface), then the Zero123
refinement from its checkpoint; its stages run as the command runs them (validation, test orbit and .glb export
included) and a ``time_to_glb`` line adds them up. With it (or ``--to-glb``) every case runs so, and when
dreamgaussian-image ran too the last line sets the two totals side by side. ``--tiny`` runs tiny random models
(CPU smoke runs; triposr-refine and dreamgaussian-image only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.profiling import ProfileWindow, StageTimer
from benchmarks.records import environment
from benchmarks.stand_ins.random_sd import write_random_sd21
from benchmarks.stand_ins.random_triposr import sculpt_sphere, write_random_release
from benchmarks.stand_ins.random_zero123 import write_random_zero123
from benchmarks.timing import on_cuda, peak_memory_gib, peak_reserved_gib, process_peak_rss_gib, reset_peak_memory, sync
from lift3d.api.generate import without_mesh_exports
from lift3d.recipes import recipe_config

# case -> (first stage, mesh stage or "", extra overrides)
CASES = {
    "dreamgaussian-image": ("dreamgaussian-image", "dreamgaussian-image-texture", []),
    "magic123": ("magic123", "", []),
    "zero123-nerf": ("zero123-nerf", "", []),
    "triposr-refine": ("triposr", "triposr-refine", []),
}
TO_GLB = ("triposr-refine",)  # cases always timed as the user waits for the .glb (validation, test orbit, export)
FEED_FORWARD = ("triposr",)  # stages without guidance: a random TripoSR instead of Zero123, never step-capped
# --tiny: random models small enough for the CPU (the released architectures, narrow and shallow) and small renders
TINY_TRIPOSR = dict(cond_image_size=32, plane_size=4, num_channels=32, num_attention_heads=2, attention_head_dim=8,
                    num_layers=1, cross_attention_dim=16, norm_num_groups=4, out_channels=4, n_neurons=8, n_hidden_layers=2)
TINY_VIT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32, patch_size=16)
TINY_DATA = ["data.height=32", "data.width=32", "data.resolution_milestones=[]", "data.batch_size=1", "data.reference_size=32",
             "data.eval_height=32", "data.eval_width=32", "data.n_val_views=1", "data.n_test_views=2",
             "system.export.resolution=32"]
TINY_STAGES = {
    "triposr": ["system.renderer.occupancy.enabled=false", "system.renderer.steps_per_diagonal=32"],
    "triposr-refine": ["system.guidance.resolution=64", "system.renderer.occupancy.enabled=false",
                       "system.renderer.steps_per_diagonal=32"],
    "dreamgaussian-image": ["system.guidance.resolution=64", "system.gaussians.init_points=300", "system.renderer.tile_size=8",
                            "system.export.texture_size=64"],
    "dreamgaussian-image-texture": [
        "system.guidance.resolution=64", "system.geometry.grid_resolution=16", "system.geometry.radius=0.8",
        "system.geometry.texture.radius=0.8", "system.geometry.texture.encoding.n_levels=4",
        "system.geometry.texture.encoding.log2_hashmap_size=10", "system.geometry.texture.encoding.base_resolution=4",
        "system.inherit_texture_steps=10", "system.inherit_texture_points=2048", "system.export.texture_size=64",
        "system.isosurface_threshold=0.5"],
}


class SculptSphere(Callback):
    """Set the generated field to a sphere before its one step (random TripoSR weights give an almost constant
    density: no surface to mesh or skip empty space around)."""

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        sculpt_sphere(module.field)


class WindowTimer(Callback):
    """Milliseconds a step over each window of ``every`` steps (GPU synced at the window ends), with the
    model's Gaussian count at the window's end: where in a stage the time goes."""

    def __init__(self, every: int = 50) -> None:
        self.every, self.mark, self.windows = every, None, []

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every:
            return
        sync()
        now = time.perf_counter()
        if self.mark is not None:
            count = len(module.gaussians) if hasattr(module, "gaussians") else None
            self.windows.append([step, round((now - self.mark) * 1000 / self.every, 1), count])
        self.mark = now


def write_photo(path: Path) -> Path:
    """An RGBA cut-out of a two-colored ball, 512x512."""
    yy, xx = np.mgrid[0:512, 0:512]
    inside = (xx - 256) ** 2 + (yy - 256) ** 2 < 180**2
    rgba = np.zeros((512, 512, 4), np.uint8)
    rgba[..., 0], rgba[..., 2], rgba[..., 3] = np.where(xx < 256, 220, 40), np.where(xx < 256, 30, 200), inside * 255
    from PIL import Image

    Image.fromarray(rgba, "RGBA").save(path)
    return path


def _peak_memory() -> tuple[float, str]:
    """GiB: the GPU's peak allocation since the stage began, else the process's peak resident size so far."""
    if on_cuda():
        return peak_memory_gib(), "cuda_allocated"
    return process_peak_rss_gib(), "process_max_rss"


def run_stage(recipe: str, overrides: list[str], folder: Path, profile: int = 0, profile_start: int = 20,
              callbacks: list[Callback] = ()) -> tuple[dict[str, Any], Path]:
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    cfg = load_config(recipe_config(recipe), overrides=overrides)
    timer = StageTimer()
    window = ProfileWindow(profile_start, profile)  # after the warm-up steps
    windows = WindowTimer()
    import lift3d.runs.runner as runner

    build = runner.build_trainer

    def with_timer(*args: Any, **kwargs: Any) -> L.Trainer:
        trainer = build(*args, **kwargs)
        if kwargs.get("train", args[2] if len(args) > 2 else False):
            trainer.callbacks += [timer, windows, *callbacks]
            if profile:
                trainer.callbacks.append(window)
        return trainer

    runner.build_trainer = with_timer
    reset_peak_memory()
    started = time.perf_counter()
    try:
        run_dir = run_experiment("train", cfg, [recipe_config(recipe)], overrides)
    finally:
        runner.build_trainer = build
    wall = time.perf_counter() - started
    peak, kind = _peak_memory()
    record = {"bench": "image_to_3d", "stage": recipe, "steps": timer.steps, "train_s": round(timer.seconds, 2),
              "steps_per_s": round(timer.steps / max(timer.seconds, 1e-9), 2), "wall_s_with_test_and_export": round(wall, 1),
              "wall_s": round(wall, 3), "before_first_step_s": round((timer.start or started) - started, 3),
              "peak_mem_gib": round(peak, 3), "peak_mem_kind": kind, "ms_per_step_windows": windows.windows}
    if on_cuda():
        record["peak_reserved_gib"] = peak_reserved_gib()
    glbs = sorted((run_dir / "save").glob("*.glb"), key=lambda path: path.stat().st_mtime)
    if glbs:
        record["glb_mb"] = round(glbs[-1].stat().st_size / 2**20, 3)
    if profile and window.summary is not None:
        record["profile"] = window.summary
    return record, run_dir


def write_models(folder: Path, tiny: bool, with_triposr: bool) -> tuple[Path, Path]:
    """The random Zero123 and TripoSR folders (released sizes, or tiny ones), written once under ``folder``
    (TripoSR's only ``with_triposr``)."""
    if not tiny:
        triposr = folder / "triposr"
        if with_triposr and not (triposr / "model.safetensors").exists():
            write_random_release(triposr)
        return write_random_zero123(folder / "zero123"), triposr
    from lift3d.generators.triposr_model import TripoSRArchitecture
    from tests.tiny_zero123 import build_tiny_zero123

    zero123, triposr = folder / "zero123-tiny", folder / "triposr-tiny"
    if not (zero123 / "model_index.json").exists():
        build_tiny_zero123(zero123)
    if with_triposr and not (triposr / "model.safetensors").exists():
        write_random_release(triposr, TripoSRArchitecture(**TINY_TRIPOSR), TINY_VIT)
    return zero123, triposr


def stage_overrides(stage: str, common: list[str], zero123: Path, triposr: Path, args: argparse.Namespace,
                    to_glb: bool) -> list[str]:
    """A stage's overrides: the photo and output, its model (Zero123, or TripoSR for a feed-forward stage), the
    step cap; ``to_glb``: validation, test orbit and export as the recipe has them, else training only."""
    overrides = list(common)
    if not to_glb:
        overrides += ["trainer.run_test_after_fit=false", "trainer.val_check_interval=0"]
    if stage in FEED_FORWARD:
        overrides.append(f"system.generator.pretrained_model_name_or_path={triposr}")
    else:
        overrides.append(f"system.guidance.pretrained_model_name_or_path={zero123}")
        if args.steps_cap:
            overrides += [f"trainer.max_steps={args.steps_cap}", *(["trainer.val_check_interval=0"] if to_glb else [])]
    if args.tiny:
        overrides += [*TINY_DATA, *TINY_STAGES[stage]]
        if stage.startswith("triposr"):  # the field of the tiny TripoSR's sizes, in both stages
            t = TINY_TRIPOSR
            overrides += [f"system.field.plane_channels={t['out_channels']}", f"system.field.plane_size={2 * t['plane_size']}",
                          f"system.field.n_neurons={t['n_neurons']}", f"system.field.n_hidden_layers={t['n_hidden_layers']}"]
    return [*overrides, *args.set]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks image_to_3d", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="dreamgaussian-image,magic123", help=f"comma-separated ({', '.join(CASES)})")
    parser.add_argument("--models", default="/tmp/lift3d-random-models", help="where the random model folders are written")
    parser.add_argument("--steps-cap", type=int, default=0, help="cap every stage at this many steps (0: the recipes' own)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every stage")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile N steps of the first stage (of the refinement after a feed-forward start)")
    parser.add_argument("--first-stage-only", action="store_true", help="skip the mesh stages")
    parser.add_argument("--profile-start", type=int, default=20, metavar="STEP", help="the first profiled step")
    parser.add_argument("--to-glb", action="store_true",
                        help="time every stage as `lift3d generate` runs it, to its .glb (on with triposr-refine)")
    parser.add_argument("--tiny", action="store_true", help="tiny random models and renders: a CPU smoke run")
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES or (args.tiny and CASES[n][0] not in TINY_STAGES)]
    if unknown:
        print(json.dumps({"bench": "image_to_3d", "error": f"unknown case (or none with --tiny): {', '.join(unknown)}"}))
        return 1
    if not torch.cuda.is_available() and not args.tiny:
        print(json.dumps({"bench": "image_to_3d", "error": "needs a CUDA GPU (or --tiny for a CPU smoke run)"}))
        return 1
    to_glb = args.to_glb or any(n in TO_GLB for n in names)
    models = Path(args.models)
    zero123, triposr = write_models(models, args.tiny, any(CASES[n][0] in FEED_FORWARD for n in names))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps({"bench": "image_to_3d", "environment": environment(device), "tiny": args.tiny, "to_glb": to_glb}),
          flush=True)
    totals: dict[str, float] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lift3d-bench-image-") as tmp:
        folder = Path(tmp)
        photo = write_photo(folder / "ball.png")
        for name in names:
            try:
                first, mesh, extra = CASES[name]
                common = [f"data.image={photo}", f"output_root={folder / 'out'}", "use_timestamp=false",
                          "trainer.enable_progress_bar=false", *extra]
                if name == "magic123":
                    sd = write_random_sd21(models / "sd21")
                    common += [f"system.text_guidance.pretrained_model_name_or_path={sd}", "system.text_guidance.prompt=a ball",
                               "system.text_guidance.prompt_cache_dir=none"]
                sculpt = [SculptSphere()] if first in FEED_FORWARD else []
                # the profile goes to the first stage that trains: a feed-forward start takes one step
                profile, none = (args.profile, args.profile_start), (0, 0)
                first_profile, mesh_profile = (none, profile) if first in FEED_FORWARD else (profile, none)
                # as lift3d generate runs it: a first stage followed by a mesh stage writes no mesh of its own
                trimmed = (without_mesh_exports(recipe_config(first))
                           if mesh and not args.first_stage_only and first not in FEED_FORWARD else [])
                record, run_dir = run_stage(first, [*stage_overrides(first, [*trimmed, *common], zero123, triposr, args, to_glb),
                                                  f"tag={name}"], folder, *first_profile, sculpt)
                print(json.dumps({**record, "case": name}), flush=True)
                stages = [record]
                if mesh and not args.first_stage_only:
                    later = [*stage_overrides(mesh, common, zero123, triposr, args, to_glb), f"tag={name}-mesh",
                             f"system.geometry_convert_from={run_dir / 'ckpts' / 'last.ckpt'}"]
                    record, _ = run_stage(mesh, later, folder, *mesh_profile)
                    print(json.dumps({**record, "case": name}), flush=True)
                    stages.append(record)
                if to_glb:
                    total = round(sum(stage["wall_s"] for stage in stages), 3)
                    ends = "glb_mb" in stages[-1]
                    print(json.dumps({"bench": "image_to_3d", "case": name, "time_to_glb_s": total, "glb_written": ends,
                                      "stages": [stage["stage"] for stage in stages],
                                      "steps": [stage["steps"] for stage in stages]}), flush=True)
                    if ends and len(stages) == 2:
                        totals[name] = total
            except Exception as error:  # one case failing (a NaN, out of memory) still lets the others run
                failed.append(name)
                traceback.print_exc()
                print(json.dumps({"bench": "image_to_3d", "case": name, "error": f"{type(error).__name__}: {error}"}),
                      flush=True)
    if {"triposr-refine", "dreamgaussian-image"} <= totals.keys():
        refine, gaussians = totals["triposr-refine"], totals["dreamgaussian-image"]
        print(json.dumps({"bench": "image_to_3d", "compare": "time_to_glb", "triposr-refine_s": refine,
                          "dreamgaussian-image_s": gaussians, "ratio_triposr_refine_to_dreamgaussian": round(
                              refine / max(gaussians, 1e-9), 3)}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
