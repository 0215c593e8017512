"""NeRF-synthetic lego (400x400) with the reconstruct-gaussians recipe: val PSNR/SSIM and training wall time.

Prints one JSON line per evaluation step (default 7000 and 30000). Training time excludes evaluation.
On the GPU (gsplat backend, the 3DGS schedule; the data must be inside the repository copy there):

    python -m benchmarks lego_gaussians --data PATH/TO/lego

Side by side with the reference, a plain loop over gsplat from the same Gaussians and photos (``reference.plain_gsplat``),
in the same process, and a profile of 10 recipe steps from step 2000 (``benchmarks.profiling``):

    python -m benchmarks lego_gaussians --data PATH/TO/lego --steps 7000 --eval-at 7000 --reference plain --profile 10

On two GPUs (DDP: each rank trains on its own photo per step) against one GPU that sees as many views (two
photos per step, the same densification schedule in steps), lego val PSNR at 7k steps (target: within 0.2 dB):

    python -m benchmarks lego_gaussians --data PATH/TO/lego --steps 7000 --eval-at 7000 --gpus 0,1
    python -m benchmarks lego_gaussians --data PATH/TO/lego --steps 7000 --eval-at 7000 data.batch_size=2

A short CPU run of the same recipe (pure-PyTorch rasterizer):

    python -m benchmarks lego_gaussians --device cpu --steps 100 --eval-at 100 --val-views 10
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.profiling import HostProfileWindow, ProfileWindow, StepTimes, build_gsplat_kernels
from benchmarks.records import device_name, version
from benchmarks.reference.plain_gsplat import score_views, train_plain
from benchmarks.timing import peak_memory_gib, peak_reserved_gib, reset_peak_memory, sync
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.runs.run_dirs import make_run_dir
from lift3d.runs.runner import build_parts, build_trainer

REPO = Path(__file__).resolve().parents[2]


def default_data() -> Path:
    """NeRF-synthetic lego from the shared data folder beside (or inside) the checkout."""
    shared = (REPO.parent / "shared", REPO / "shared", Path("/work/shared"))
    for candidate in (root / "data" / "lego" for root in shared):
        if (candidate / "transforms_train.json").is_file():
            return candidate
    return REPO.parent / "shared" / "data" / "lego"


class Evaluate(Callback):
    """At the given steps: stop the clock, score the val views, print a JSON line, restart the clock."""

    def __init__(self, steps: list[int], info: dict, max_minutes: float) -> None:
        self.steps, self.info, self.max_seconds = set(steps), info, max_minutes * 60
        self.train_seconds, self.started = 0.0, None
        self.results: list[dict] = []

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero:  # DDP: rank 0 scores; the other ranks wait for it at the next step's all-reduce
            return
        # no GPU sync on other steps: one per step would stop the host queueing ahead, and time the loop slower
        # than it runs (the time cap is checked on the host's clock, at most a few queued steps early)
        out_of_time = self.max_seconds > 0 and self.train_seconds + time.perf_counter() - self.started > self.max_seconds
        if step not in self.steps and not out_of_time:
            return
        sync(module.device)
        self.train_seconds += time.perf_counter() - self.started
        self.results.append(self.evaluate(trainer, module, step))
        print(json.dumps(self.results[-1]), flush=True)
        if out_of_time:
            trainer.should_stop = True
        sync(module.device)
        self.started = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start_gaussians = copy.deepcopy(module.gaussians).cpu()  # the plain reference starts from these
        sync(module.device)
        self.started = time.perf_counter()

    @torch.no_grad()
    def evaluate(self, trainer: L.Trainer, module: L.LightningModule, step: int) -> dict:
        scene = trainer.datamodule.val_scene()
        background = trainer.datamodule.background.to(module.device)
        scores = score_views(lambda cameras, bg: module.render_views({"cameras": cameras, "background": bg})["rgb"],
                             scene, background, module.device)
        return {"bench": "lego_gaussians", "step": step, **scores, "train_seconds": round(self.train_seconds, 1),
                "gaussians": len(module.gaussians), **self.info}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks lego_gaussians",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=default_data(), help="the lego scene folder (transforms_*.json)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--eval-at", default="7000,30000", help="comma-separated steps at which to score the val views")
    parser.add_argument("--val-views", type=int, default=-1, help="score this many val views, evenly spaced (-1: all 100)")
    parser.add_argument("--max-minutes", type=float, default=0, help="stop (and score) after this much training time")
    parser.add_argument("--output", type=Path, default=None, help="where the run folder goes (default: a temporary one)")
    parser.add_argument("--reference", choices=["none", "plain"], default="none",
                        help="plain: then train the plain gsplat loop (reference.plain_gsplat) from the same start, same steps, "
                             "same process")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N recipe steps (benchmarks.profiling)")
    parser.add_argument("--profile-start", default="2000", metavar="STEPS",
                        help="the first profiled step (comma-separated: a window of --profile steps at each)")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="cProfile N recipe steps from step 3000 (and N steps of the plain loop): host time per function")
    parser.add_argument("--step-times", action="store_true",
                        help="time every step, synchronizing the device at each (a diagnostic: see profiling.StepTimes)")
    parser.add_argument("--gpus", default="", metavar="IDS",
                        help="train on these GPUs with DDP, e.g. 0,1 (rank 0 scores; --device cpu: as many gloo processes)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides, e.g. system.renderer.backend=torch")
    args = parser.parse_args(argv)
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    if gpus and (args.reference != "none" or args.profile or args.max_minutes):
        parser.error("--gpus runs without --reference, --profile and --max-minutes")
    logging.getLogger("lift3d").setLevel(logging.INFO)
    logging.getLogger("lift3d").addHandler(logging.StreamHandler(sys.stderr))

    on_gpu = args.device.startswith("cuda")
    overrides = [
        f"data.root={args.data}", f"data.max_val_views={args.val_views}", f"trainer.max_steps={args.steps}",
        "trainer.val_check_interval=0", "trainer.run_test_after_fit=false", "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=500", f"trainer.accelerator={'gpu' if on_gpu else 'cpu'}", "checkpoint.every_n_train_steps=0",
        "checkpoint.save_last=false", "system.nonfinite_check_every=0", "tag=bench", *args.overrides,
    ]
    output = args.output or Path(tempfile.mkdtemp(prefix="lift3d-bench-"))
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=[f"output_root={output}", *overrides])

    info = {"device": device_name(args.device),
            "backend": cfg.system.get("renderer", {}).get("backend", "auto"), "resolution": "400x400",
            "torch": torch.__version__, "gsplat": version("gsplat"), "threads": torch.get_num_threads(),
            "gsplat_build_s": build_gsplat_kernels() if on_gpu else 0.0}  # outside the training clock
    run_dir = make_run_dir(cfg)
    trainer = build_trainer(cfg, run_dir, train=True, devices=(gpus if on_gpu else len(gpus)) if gpus else None)
    info["world_size"] = trainer.world_size
    evaluate = Evaluate([int(s) for s in args.eval_at.split(",")], info, args.max_minutes)
    trainer.callbacks.append(evaluate)
    windows = [ProfileWindow(int(start), args.profile) for start in args.profile_start.split(",")] if args.profile else []
    trainer.callbacks.extend(windows)
    host_window = HostProfileWindow(3000, args.host_profile) if args.host_profile else None
    if host_window is not None:
        trainer.callbacks.append(host_window)
    step_times = StepTimes() if args.step_times else None
    if step_times is not None:
        trainer.callbacks.append(step_times)
    L.seed_everything(cfg.seed + trainer.global_rank, workers=True, verbose=False)  # as the runner seeds DDP ranks
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    start = time.perf_counter()
    trainer.fit(system, datamodule=datamodule)
    if not trainer.is_global_zero:
        return 0
    print(json.dumps({"bench": "lego_gaussians", "summary": True, "total_seconds": round(time.perf_counter() - start, 1),
                      "train_seconds": round(evaluate.train_seconds, 1), "steps": trainer.global_step,
                      "results": [{k: r[k] for k in ("step", "val_psnr", "val_ssim", "train_seconds", "gaussians")}
                                  for r in evaluate.results], **peak_memory(), **graph_record(system), **info}), flush=True)
    for window in windows:
        if window.summary is not None:
            print(json.dumps({"bench": "lego_gaussians", "profile_start": window.start, "profile": window.summary}), flush=True)
    if host_window is not None and host_window.summary is not None:
        print(json.dumps({"bench": "lego_gaussians", "host_profile": host_window.summary}), flush=True)
    if step_times is not None:
        print(json.dumps({"bench": "lego_gaussians", "step_times": step_times.summary()}), flush=True)
    if args.reference == "plain":
        held = 0
        if torch.cuda.is_available():  # the plain loop's own peak: above what the recipe still holds
            reset_peak_memory()
            held = torch.cuda.memory_allocated()
        device = torch.device(args.device)
        val = datamodule.val_scene()
        background = datamodule.background.to(device)
        plain = train_plain(evaluate.start_gaussians, datamodule, trainer.global_step, {r["step"] for r in evaluate.results},
                            lambda render_fn, step: {"step": step, **score_views(render_fn, val, background, device)}, device,
                            host_profile=(3000, args.host_profile) if args.host_profile else None)
        recipe_rate = trainer.global_step / max(evaluate.train_seconds, 1e-9)
        plain_rate = trainer.global_step / max(plain["train_seconds"], 1e-9)
        plain = {**plain, **peak_memory(held)}
        print(json.dumps({"bench": "lego_gaussians", "reference": "plain gsplat loop", **plain,
                          "recipe_steps_per_s": round(recipe_rate, 2), "plain_steps_per_s": round(plain_rate, 2),
                          "speedup_vs_plain": round(recipe_rate / plain_rate, 3), **info}), flush=True)
    return 0


def graph_record(system: L.LightningModule) -> dict:
    """How the recipe's step ran: replayed as a CUDA graph (captures, replays, intersection slots) or not."""
    graphs = getattr(system, "_graphs", None)
    if graphs is None or graphs.step is None:
        return {"cuda_graph": None}
    return {"cuda_graph": {"captures": graphs.captures, "replays": graphs.step.replays, "isect_slots": graphs.capacity,
                           "resized_after_overflow": graphs.resized_after_overflow,
                           "optimizer_captured": getattr(graphs, "optimizer_captured", None)}}


def peak_memory(held: int = 0) -> dict:
    """Peak GPU memory allocated (above ``held`` bytes) and reserved since the last reset (GiB; empty on the CPU)."""
    if not torch.cuda.is_available():
        return {}
    return {"peak_allocated_gib": peak_memory_gib(held_bytes=held), "peak_reserved_gib": peak_reserved_gib()}


if __name__ == "__main__":
    sys.exit(main())
