"""A real capture reconstructed as `lift3d reconstruct PATH` does it, timed: training seconds (GPU synced),
steps/s, val PSNR/SSIM on the held-out frames, peak GPU memory; one JSON line. Validation renders (render
beside photo) are copied to ``--renders DIR`` for looking at.

    python -m benchmarks capture ../shared/data/fox --steps 7000
    python -m benchmarks capture /path/to/photos --method nerf --steps 5000 --set data.downscale=4
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.profiling import StageTimer, build_gsplat_kernels
from benchmarks.records import environment
from benchmarks.timing import on_cuda, peak_memory_gib, reset_peak_memory


class TimeCap(Callback):
    """Stops training once ``seconds`` have passed since its first step."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.start = self.start or time.perf_counter()
        if time.perf_counter() - self.start > self.seconds:
            trainer.should_stop = True


def gaussian_count(save: Path) -> int | None:
    """The vertex count in the header of the run's exported 3DGS .ply (None when it wrote none)."""
    for path in sorted(save.glob("**/*.ply")):
        with path.open("rb") as f:
            for line in f:
                if line.startswith(b"element vertex"):
                    return int(line.split()[-1])
                if line.strip() == b"end_header":
                    break
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks capture", description=__doc__.splitlines()[0])
    parser.add_argument("scene", help="a posed scene folder (any layout lift3d reads), a photo folder or a video")
    parser.add_argument("--method", default="gaussians", choices=("gaussians", "nerf"))
    parser.add_argument("--steps", type=int, default=7000,
                        help="training steps (validation runs at the end, and every --val-every)")
    parser.add_argument("--val-every", type=int, default=0, help="also validate every this many steps (0: only at the end)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    parser.add_argument("--renders", default="", help="copy the validation renders into this folder")
    parser.add_argument("--output-root", default="outputs", help="where the run's folder goes")
    parser.add_argument("--recipe", default="", help="a recipe name instead of the one lift3d reconstruct picks")
    parser.add_argument("--time-cap", type=float, default=0.0, help="stop training after this many seconds (then validate)")
    args = parser.parse_args(argv)

    import lift3d.runs.runner as runner
    from lift3d.config import load_config
    from lift3d.data.scene import detect
    from lift3d.data.sfm import prepare_capture
    from lift3d.method_table import find_method, stage_recipes
    from lift3d.recipes import recipe_config

    scene = prepare_capture(Path(args.scene).expanduser().resolve())
    unbounded = not detect(scene).object_centric
    config = recipe_config(stage_recipes(find_method(args.method), on_cpu=not torch.cuda.is_available(), unbounded=unbounded)[0])
    if args.recipe:
        config = recipe_config(args.recipe)
    overrides = [f"data.root={scene}", f"tag={scene.name}", f"trainer.max_steps={args.steps}",
                 f"trainer.val_check_interval={args.val_every or args.steps}", "trainer.run_test_after_fit=false",
                 "trainer.enable_progress_bar=false", f"output_root={args.output_root}", *args.set]
    cfg = load_config(config, overrides=overrides)
    timer = StageTimer()
    build = runner.build_trainer

    def with_timer(*a, **k):
        trainer = build(*a, **k)
        if k.get("train"):
            trainer.callbacks.append(timer)
            if args.time_cap > 0:
                trainer.callbacks.append(TimeCap(args.time_cap))
        return trainer

    runner.build_trainer = with_timer
    gsplat_build_s = build_gsplat_kernels()  # outside the training clock
    reset_peak_memory()
    started = time.perf_counter()
    run_dir = runner.run_experiment("train", cfg, [config], overrides)
    wall = time.perf_counter() - started
    metrics = run_dir / "save" / "metrics.json"
    if not metrics.is_file() or json.loads(metrics.read_text()).get("val", {}).get("step") != timer.steps:
        cfg.resume = str(run_dir / "ckpts" / "last.ckpt")  # stopped by the time cap before its validation: validate now
        runner.run_experiment("validate", cfg, [config], overrides)
    record_json = json.loads(metrics.read_text())
    val = record_json["val"]
    history = [[entry["step"], round(entry["psnr"], 3)] for entry in record_json.get("history", []) if "psnr" in entry]
    record = {"bench": "capture", "scene": str(scene), "method": args.method, "config": config.name, "steps": timer.steps,
              "train_s": round(timer.seconds, 1), "steps_per_s": round(timer.steps / max(timer.seconds, 1e-9), 2),
              "wall_s": round(wall, 1), "val_psnr": round(val["psnr"], 3), "val_ssim": round(val["ssim"], 4),
              "val_views": val["views"], "val_history": history,
              "image_size": json.loads((run_dir / "configs" / "scene.json").read_text())["image_size"],
              "gsplat_build_s": gsplat_build_s,
              "environment": environment(torch.device("cuda" if torch.cuda.is_available() else "cpu"))}
    if args.method == "gaussians":
        record["gaussians"] = gaussian_count(run_dir / "save")
    if on_cuda():
        record["peak_mem_gib"] = peak_memory_gib()
    if args.renders:
        out = Path(args.renders)
        out.mkdir(parents=True, exist_ok=True)
        for path in sorted((run_dir / "save").glob(f"it{val['step']}-val/*.png"))[:4]:
            shutil.copy(path, out / f"{scene.name}-{path.name}")
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
