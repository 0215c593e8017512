"""Whether the trainer's precision changes what a text-to-3D recipe learns: the dreamfusion recipe with the
analytic prior (the exact denoiser of the built-in sample scene) trained for ``--steps`` steps at its
default field and 64x64 renders under each ``--precisions`` value; prints the val PSNR on the scene's
8 held-out views and ms/step for each (one JSON line per precision). CUDA: 16-mixed, bf16-mixed, 32-true.

    python -m benchmarks precision --steps 1500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

from benchmarks.records import device_name
from lift3d.config import load_config
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config
from lift3d.runs.runner import run_experiment


def run(precision: str, steps: int, recipe: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lift3d-precision-") as folder:
        overrides = [f"data.reference_scene={sample_scene_path()}", f"output_root={folder}", f"trainer.precision={precision}",
                     f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.run_test_after_fit=false",
                     "checkpoint.every_n_train_steps=0", "trainer.enable_progress_bar=false", "use_timestamp=false",
                     f"system.guidance.max_step_percent=[0,0.98,0.3,{int(steps * 0.75)}]"]
        load_config(recipe_config(recipe), overrides=overrides)  # fail early on a bad override
        started = time.perf_counter()
        cfg = load_config(recipe_config(recipe), overrides=overrides)
        run_dir = run_experiment("train", cfg, [recipe_config(recipe)], overrides)
        seconds = time.perf_counter() - started
        final = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]
    device = device_name("cuda" if torch.cuda.is_available() else "cpu")
    return {"bench": "precision", "recipe": recipe, "precision": precision, "steps": steps, "val_psnr": round(final["psnr"], 2),
            "val_ssim": round(final["ssim"], 4), "run_s": round(seconds, 1), "device": device}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks precision", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--precisions", default="16-mixed,bf16-mixed,32-true")
    parser.add_argument("--recipe", default="dreamfusion-analytic")
    args = parser.parse_args(argv)
    for precision in args.precisions.split(","):
        print(json.dumps(run(precision, args.steps, args.recipe)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
