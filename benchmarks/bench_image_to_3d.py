"""Image-to-3D recipes end to end on a GPU, as `lift3d generate --image` runs them: wall time of each stage
(model loading and compilation included, as a user waits for them), its training steps/s, and peak GPU memory,
with Stable-Zero123-shaped (and SD-2.1-shaped, for magic123's text prior) random weights.

    python benchmarks/bench_image_to_3d.py                               # dreamgaussian-image + its mesh stage, magic123 coarse
    python benchmarks/bench_image_to_3d.py --cases zero123-nerf --steps-cap 200

Each stage prints one JSON line (training only: the test orbit and exports are not timed). Targets (one H100):
dreamgaussian-image stage 1 (500 steps) < 40 s and its mesh stage < 40 s, peak < 8 GB; magic123 coarse stage < 12 GB.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from benchmarks.bench_guidance import environment  # noqa: E402
from benchmarks.random_sd import write_random_sd21  # noqa: E402
from benchmarks.random_zero123 import write_random_zero123  # noqa: E402

# case -> (first stage, mesh stage or "", extra overrides)
CASES = {
    "dreamgaussian-image": ("dreamgaussian-image", "dreamgaussian-image-texture", []),
    "magic123": ("magic123", "", []),
    "zero123-nerf": ("zero123-nerf", "", []),
}


class StageTimer(Callback):
    """Seconds from the first training step's start to the last's end (GPU synced), and the step count."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.seconds, self.steps = 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        if self.start is None:
            _sync()
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        _sync()
        self.seconds, self.steps = time.perf_counter() - (self.start or time.perf_counter()), trainer.global_step


class WindowTimer(Callback):
    """Milliseconds a step over each window of ``every`` steps (GPU synced at the window ends), with the
    model's Gaussian count at the window's end: where in a stage the time goes."""

    def __init__(self, every: int = 50) -> None:
        self.every, self.mark, self.windows = every, None, []

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every:
            return
        _sync()
        now = time.perf_counter()
        if self.mark is not None:
            count = len(module.gaussians) if hasattr(module, "gaussians") else None
            self.windows.append([step, round((now - self.mark) * 1000 / self.every, 1), count])
        self.mark = now


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def write_photo(path: Path) -> Path:
    """An RGBA cut-out of a two-coloured ball, 512x512."""
    yy, xx = np.mgrid[0:512, 0:512]
    inside = (xx - 256) ** 2 + (yy - 256) ** 2 < 180**2
    rgba = np.zeros((512, 512, 4), np.uint8)
    rgba[..., 0], rgba[..., 2], rgba[..., 3] = np.where(xx < 256, 220, 40), np.where(xx < 256, 30, 200), inside * 255
    from PIL import Image

    Image.fromarray(rgba, "RGBA").save(path)
    return path


def run_stage(recipe: str, overrides: list[str], folder: Path, profile: int = 0,
              profile_start: int = 20) -> tuple[dict[str, Any], Path]:
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    cfg = load_config(recipe_config(recipe), overrides=overrides)
    timer = StageTimer()
    from benchmarks.bench_recipes import ProfileWindow

    window = ProfileWindow(profile_start, profile)  # after the warm-up steps
    windows = WindowTimer()
    import lift3d.runs.runner as runner

    build = runner.build_trainer

    def with_timer(*args: Any, **kwargs: Any) -> L.Trainer:
        trainer = build(*args, **kwargs)
        if kwargs.get("train", args[2] if len(args) > 2 else False):
            trainer.callbacks += [timer, windows]
            if profile:
                trainer.callbacks.append(window)
        return trainer

    runner.build_trainer = with_timer
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        trial = run_experiment("train", cfg, [recipe_config(recipe)], overrides)
    finally:
        runner.build_trainer = build
    wall = time.perf_counter() - started
    record = {"bench": "image_to_3d", "stage": recipe, "steps": timer.steps, "train_s": round(timer.seconds, 2),
              "steps_per_s": round(timer.steps / max(timer.seconds, 1e-9), 2), "wall_s_with_test_and_export": round(wall, 1),
              "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
              "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
              "ms_per_step_windows": windows.windows}
    if profile and window.summary is not None:
        record["profile"] = window.summary
    return record, trial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="dreamgaussian-image,magic123", help=f"comma-separated ({', '.join(CASES)})")
    parser.add_argument("--models", default="/tmp/lift3d-random-models", help="where the random model folders are written")
    parser.add_argument("--steps-cap", type=int, default=0, help="cap every stage at this many steps (0: the recipes' own)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every stage")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N steps of the first stage")
    parser.add_argument("--first-stage-only", action="store_true", help="skip the mesh stages")
    parser.add_argument("--profile-start", type=int, default=20, metavar="STEP", help="the first profiled step")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "image_to_3d", "error": "needs a CUDA GPU"}))
        return 1
    models = Path(args.models)
    zero123 = write_random_zero123(models / "zero123")
    print(json.dumps({"bench": "image_to_3d", "environment": environment(torch.device("cuda"))}), flush=True)
    with tempfile.TemporaryDirectory(prefix="lift3d-bench-image-") as tmp:
        folder = Path(tmp)
        photo = write_photo(folder / "ball.png")
        for name in [n for n in args.cases.split(",") if n]:
            first, mesh, extra = CASES[name]
            common = [f"data.image={photo}", f"output_root={folder / 'out'}", "use_timestamp=false",
                      "trainer.run_test_after_fit=false", "trainer.val_check_interval=0",  # training time only
                      f"system.guidance.pretrained_model_name_or_path={zero123}", "trainer.enable_progress_bar=false", *extra]
            if name == "magic123":
                sd = write_random_sd21(models / "sd21")
                common += [f"system.text_guidance.pretrained_model_name_or_path={sd}", "system.text_guidance.prompt=a ball",
                           "system.text_guidance.prompt_cache_dir=none"]
            cap = [f"trainer.max_steps={args.steps_cap}"] if args.steps_cap else []
            record, trial = run_stage(first, [*common, *cap, *args.set, f"tag={name}"], folder, args.profile, args.profile_start)
            print(json.dumps({**record, "case": name}), flush=True)
            if mesh and not args.first_stage_only:
                record, _ = run_stage(mesh, [*common, *cap, *args.set, f"tag={name}-mesh",
                                             f"system.geometry_convert_from={trial / 'ckpts' / 'last.ckpt'}"], folder)
                print(json.dumps({**record, "case": name}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
