"""``lift3d edit`` on NeRF-synthetic lego (400x400): a reconstruct-gaussians run, then the edit-gaussians recipe with an
InstructPix2Pix of the real SD-1.5 shapes (random weights: the same compute as timbrooks/instruct-pix2pix).
Prints one JSON line: training steps/s with the edits, ms per plain step and per editing step, peak GPU memory,
and the projected wall time of the recipe's full edit (its trainer.max_steps).

    python -m benchmarks edit                          # lego from ../shared/data/lego, on the GPU
    python -m benchmarks edit --method nerf --source-steps 5000

A CPU smoke run with tiny random shapes on the built-in sample scene:

    python -m benchmarks edit --tiny --device cpu --data lift3d/assets/sample_scene --source-steps 20 --steps 4
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.records import device_name
from benchmarks.stand_ins.random_ip2p import write_random_instruct_pix2pix
from benchmarks.suite.lego_gaussians import default_data
from benchmarks.timing import on_cuda, peak_memory_gib, reset_peak_memory, sync


class StepTimer(Callback):
    """Wall time of every training step (the edit runs inside the step's start hook), synchronized on CUDA."""

    def __init__(self, edit_every: int) -> None:
        self.edit_every, self.plain, self.editing, self.started = edit_every, [], [], 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        sync(module.device)
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        sync(module.device)
        step = trainer.global_step - 1
        (self.editing if step % self.edit_every == 0 else self.plain).append(time.perf_counter() - self.started)


def reconstruct(data: Path, method: str, steps: int, output: Path, device: str, tiny: bool) -> Path:
    """A reconstruction to edit: ``lift3d reconstruct``'s recipe for the scene, ``steps`` steps, no video."""
    from lift3d.cli import main

    overrides = [f"trainer.max_steps={steps}", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
                 "trainer.enable_progress_bar=false", "use_timestamp=false", f"output_root={output}",
                 f"trainer.accelerator={'gpu' if device.startswith('cuda') else 'cpu'}"]
    if tiny:
        overrides += ["system.gaussians.init_points=1000"] if method == "gaussians" else []
    if main(["reconstruct", str(data), "--method", method, *overrides]) != 0:
        raise SystemExit("the reconstruction failed")
    return next(p for p in output.glob("*/*") if (p / "ckpts" / "last.ckpt").is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks edit",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=default_data(), help="the lego scene folder (transforms_*.json)")
    parser.add_argument("--method", choices=("gaussians", "nerf"), default="gaussians")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--source", type=Path, default=None, help="an existing reconstruct run to edit (skips reconstructing)")
    parser.add_argument("--source-steps", type=int, default=3000, help="steps of the reconstruction made first")
    parser.add_argument("--steps", type=int, default=300, help="editing steps timed (the recipe's full length is projected)")
    parser.add_argument("--tiny", action="store_true", help="tiny random InstructPix2Pix shapes (CPU smoke test)")
    parser.add_argument("--model", type=Path, default=None, help="InstructPix2Pix folder (default: random SD-1.5 shapes, "
                                                                  "written once to a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides of the edit run")
    args = parser.parse_args(argv)
    logging.getLogger("lift3d").setLevel(logging.WARNING)

    from lift3d.commands.edit import edit_overrides, source_layer, source_run
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.run_dirs import make_run_dir
    from lift3d.runs.runner import build_parts, build_trainer

    work = Path(tempfile.mkdtemp(prefix="lift3d-bench-edit-"))
    source = args.source or reconstruct(args.data, args.method, args.source_steps, work / "runs", args.device, args.tiny)
    model = args.model or write_random_instruct_pix2pix(work / ("tiny-ip2p" if args.tiny else "random-ip2p"), args.tiny)
    run_dir, parsed, checkpoint = source_run(str(source))
    layer, _, method = source_layer(parsed, work)
    recipe = recipe_config(f"edit-{method}")
    full_steps = load_config(layer, recipe).trainer.max_steps
    on_gpu = args.device.startswith("cuda")
    overrides = edit_overrides(run_dir, checkpoint, "make it look like bronze") + [
        f"system.editor.pretrained_model_name_or_path={model}", f"trainer.max_steps={args.steps}",
        "trainer.run_test_after_fit=false", "trainer.enable_progress_bar=false", "checkpoint.every_n_train_steps=0",
        "checkpoint.save_last=false", "system.save_edits_every=0", "system.export.formats=[]",
        f"trainer.accelerator={'gpu' if on_gpu else 'cpu'}", f"output_root={work / 'edits'}", *args.overrides]
    cfg = load_config(layer, recipe, overrides=overrides)
    run_dir = make_run_dir(cfg)
    trainer = build_trainer(cfg, run_dir, train=True)
    every = int(cfg.system["edit_every"])
    timer = StepTimer(every)
    trainer.callbacks.append(timer)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    reset_peak_memory(args.device)
    start = time.perf_counter()
    trainer.fit(system, datamodule=datamodule)
    total = time.perf_counter() - start
    plain, editing = timer.plain[1:] or timer.plain, timer.editing[1:] or timer.editing  # the first of each warms up
    plain_ms = 1000 * sum(plain) / max(len(plain), 1)
    edit_ms = 1000 * sum(editing) / max(len(editing), 1)
    step_ms = ((every - 1) * plain_ms + edit_ms) / every  # one editing step in every edit_every
    camera = datamodule.train.cameras
    print(json.dumps({
        "bench": "edit", "method": method, "editor": "instruct-pix2pix (random SD-1.5 shapes)" if not args.tiny else "tiny",
        "device": device_name(args.device), "resolution": f"{camera.width}x{camera.height}",
        "train_views": len(camera), "steps": trainer.global_step, "edits": len(timer.editing), "edit_every": every,
        "diffusion_steps": cfg.system["editor"].get("diffusion_steps", 20), "plain_step_ms": round(plain_ms, 2),
        "editing_step_ms": round(edit_ms, 1), "steps_per_s": round(1000 / step_ms, 2), "wall_seconds": round(total, 1),
        "peak_memory_gb": peak_memory_gib(args.device) if on_cuda(args.device) else None,
        "full_edit_steps": full_steps, "projected_full_edit_minutes": round(full_steps * step_ms / 60000, 1),
        "gaussians": len(system.gaussians) if hasattr(system, "gaussians") else None, "torch": torch.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
