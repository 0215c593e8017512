"""Steps/s, peak GPU memory and projected full-run wall time of the text-to-3D recipes at their default configs.

Each case builds the recipe exactly as ``lift3d generate`` does (its YAML, Lightning trainer, mixed
precision, optimizer, densification) but hands the system a Stable Diffusion 2.1-base-shaped UNet and
VAE with random weights (``stand_ins.random_sd``: the same compute as the real model, nothing
downloaded); the ``dreamfusion-if`` cases get DeepFloyd IF-I-XL's UNet with random weights (``stand_ins.random_if``) and
their T5 prompt embeddings cached before the timed run, as on any run after a prompt's first (made by a random
1-layer T5 of T5-XXL's width 4096, not the 4.7B-parameter encoder: it runs once per prompt, before training).
It trains ``--warmup`` untimed steps, then times ``--steps`` steps as one window between two
GPU synchronizations (render + guidance + backward + optimizer + densification, the CPU free to run
ahead as in training); ms_per_step is the window over its steps, and the full run is projected as
full_run_steps / steps_per_s (validation, test video and export not included). One JSON line per case.

    python -m benchmarks recipes                               # one GPU: the default cases in a few minutes
    python -m benchmarks recipes --cases dreamfusion,gaussian-sds --budget-s 120
    python -m benchmarks recipes --tiny                        # seconds on a CPU: a smoke test of the benchmark
    python -m benchmarks recipes --cases dreamfusion --set trainer.precision=bf16-mixed --profile 6
    python -m benchmarks recipes --cases dreamfusion-if,dreamfusion-if-eager   # DeepFloyd IF stage I
    python -m benchmarks recipes --cases mvdream-64,mvdream-256,mvdream-gaussians --budget-s 500
    python -m benchmarks recipes --cases mvdream-64,mvdream-256 --field-start analytic:1500 --profile 3

``--set KEY=VALUE`` (repeatable) applies config overrides to every case; ``--profile N`` profiles N more
steps after the timed ones and adds a ``profile`` record: GPU busy time per step (union of kernel
intervals) against the wall time, host-device syncs per step with the Python lines that caused them
(``torch.cuda.set_sync_debug_mode``), and the top kernels and CPU ops; with ``--profile-stacks`` also the aten ops
behind the device time with their input shapes, and the costliest backward nodes.

``--field-start analytic:N`` (default ``fresh``) starts the late-stage cases (``mvdream-256``) from a converged
field instead of the blob: the case's own field, material, background, renderer and optimizer config is first
trained N steps with the recipe's offline twin (the analytic multi-view prior over the bundled sample scene, no
weights; ``stand_ins.field_start``), and the timed run starts from that state with its step counter at the
stage's first step (5000), so the timestep schedule and the occupancy updates are the stage's. NeRF records say
how the field started (``field_start``, ``start_step``, ``field_start_s``), the occupancy grid's occupied fraction
(after the pretraining, when the timed window opens and closes) and the renderer's rays and samples per step and
per ray in the timed steps (``first``: density-only evaluations in occupied cells; ``second``: samples through the
full field with gradients, after early termination; on CUDA the passes run on fixed budgets, ``budget_per_ray``:
``budget_margin`` times the most samples per ray of a chunk seen lately) and the fraction of rays that lost samples
to a full budget (``rays_over_budget``).

Caveats: random weights give random gradients, so the representation does not evolve as in a real run
(a NeRF's occupancy grid stays near its blob, or drifts from its pretrained object; densification grows
Gaussians differently).
``gaussian-sds-100k`` times the Gaussian recipe with 100k Gaussians to bound the rate late in a run.
``mvdream-64`` / ``mvdream-256`` time the mvdream recipe's two stages with an MVDream-shaped UNet (SD 2.1's with
the camera MLP, self-attention across each object's 4 views); ``mvdream-total`` adds their projections.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.profiling import ProfileWindow
from benchmarks.records import environment, over_budget, unknown_case
from benchmarks.stand_ins.architectures import MVDREAM_UNET
from benchmarks.stand_ins.field_start import StartAt, load_pretrained, parse_field_start, pretrain
from benchmarks.stand_ins.random_if import build_if_models
from benchmarks.stand_ins.random_sd import build_sd_models
from benchmarks.timing import peak_memory_gib, peak_reserved_gib, reset_peak_memory, sync
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.runs.runner import build_parts, build_trainer

PROMPT = ["system.guidance.prompt=a DSLR photo of a hamburger", "system.guidance.prompt_cache_dir=none"]
PD64 = ["data.height=64", "data.width=64", "data.batch_size=1", "data.resolution_milestones=[]"]
PD512 = ["data.height=512", "data.width=512", "data.batch_size=1", "data.resolution_milestones=[]"]
MV64 = ["data.height=64", "data.width=64", "data.batch_size=8", "data.resolution_milestones=[]"]  # mvdream: 2 objects x 4 views
MV256 = ["data.height=256", "data.width=256", "data.batch_size=4", "data.resolution_milestones=[]"]  # ... then 1 x 4 at 256
# name -> (recipe, overrides over its defaults, steps of the full run at this setting (None: trainer.max_steps),
#          rough cost in seconds on one data-center GPU for the --budget-s check); run in this order (VSD last: it adds adapters)
EAGER = ["system.guidance.compile=false"]  # the recipes compile the guidance by default (CUDA); this turns it off
CASES: dict[str, tuple[str, list[str], int | None, float]] = {
    "dreamfusion": ("dreamfusion-sd", [], None, 200),
    "dreamfusion-eager": ("dreamfusion-sd", EAGER, None, 35),
    "gaussian-sds": ("gaussian-sds", [], None, 240),
    "gaussian-sds-eager": ("gaussian-sds", EAGER, None, 35),
    "gaussian-sds-100k": ("gaussian-sds", [*EAGER, "system.gaussians.init_points=100000"], None, 40),
    "gaussian-sds-vae-slicing": ("gaussian-sds", [*EAGER, "system.guidance.vae_slicing=true"], None, 35),
    "prolificdreamer-64": ("prolificdreamer", PD64, 5000, 40),  # stage 1 before its 64 -> 512 milestone
    "prolificdreamer-512": ("prolificdreamer", PD512, 20000, 60),  # ... and after it
    "dreamfusion-if": ("dreamfusion-if", [], None, 240),  # DeepFloyd IF stage I (4.3B UNet), embeddings cached
    "dreamfusion-if-eager": ("dreamfusion-if", EAGER, None, 60),
    "mvdream-64": ("mvdream", MV64, 5000, 150),  # MVDream-shaped UNet (camera MLP, 4-view attention): steps 0-4999
    "mvdream-256": ("mvdream", MV256, 5000, 150),  # ... and 5000-9999
    "mvdream-gaussians": ("mvdream-gaussians", [], None, 150),
}
STAGE_START = {"mvdream-256": 5000}  # --field-start: these cases start at this step from a pretrained field
PRETRAIN_S_PER_STEP = 0.04  # rough GPU cost of one --field-start pretraining step, for the --budget-s check
DEFAULT_CASES = ["gaussian-sds", "dreamfusion", "dreamfusion-eager", "gaussian-sds-eager", "prolificdreamer-64",
                 "prolificdreamer-512", "gaussian-sds-100k", "dreamfusion-if", "dreamfusion-if-eager"]
TINY_NERF = [  # --tiny: tiny renders, fields and Gaussians for the tiny models
    "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
    "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0", "system.field.hidden_dim=16",
    "system.renderer.steps_per_diagonal=32", "system.renderer.occupancy.resolution=16",
]
TINY_GAUSSIANS = ["system.gaussians.init_points=500", "system.renderer.tile_size=8"]
TINY_SIZE = ["data.height=32", "data.width=32"]


class StepTimer(Callback):
    """Wall time of the timed steps between two GPU synchronizations (one after the warm-up and any profiled
    steps, one at the end): the steps in between run as in training, the CPU free to queue work ahead of
    the GPU, so a per-step sync in the benchmark cannot hide or add overlap. Stops the fit past a time cap."""

    def __init__(self, warmup: int, cap_s: float, end_step: int = 0, start_step: int = 0, renderer: Any = None) -> None:
        self.warmup, self.cap_s = warmup, cap_s
        self.end_step = end_step  # the window closes at this step (0: when training ends); a profiled window follows
        self.start_step = start_step  # the run's first step (a run resumed at a late stage)
        self.renderer = renderer  # a volume renderer: its samples and occupancy are read when the window opens and closes
        self.samples: dict[str, float] = {}  # its training samples of the timed steps
        self.budget_per_ray: dict[str, float] = {}  # budgets of the timed window's end, samples per ray of the densest chunk
        self.occupied: dict[str, float] = {}  # its occupied fraction of the occupancy grid
        self.started = time.perf_counter()
        self.warmup_s = 0.0
        self.t0: float | None = None
        self.first_step = 0
        self.timed_s = 0.0
        self.timed_steps = 0
        self.host_times: list[tuple[int, float]] = []  # (step, host seconds since the previous step end): outliers
        self._last = 0.0

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        done = trainer.global_step
        now = time.perf_counter()
        if self.t0 is None:
            # warm-up ends after --warmup steps, or early (but after 2 steps) when slow steps would eat the cap
            if done - self.start_step >= min(self.warmup, 2 if now - self.started > 0.4 * self.cap_s else self.warmup):
                sync()
                if self.renderer is not None:  # outside the window: these read the device
                    self.renderer.reset_sample_counts()
                    self.occupied["timed_start"] = round(float(self.renderer.occupancy.occupancy_fraction()), 4)
                self.t0 = time.perf_counter()
                self.warmup_s = self.t0 - self.started
                self.first_step = done
                self._last = self.t0
            return
        if self.timed_steps:
            return  # closed; profiled steps follow
        self.host_times.append((done, now - self._last))
        self._last = now
        if done == self.end_step:
            self._close(done)
        elif done - self.first_step >= 3 and now - self.started > self.cap_s:
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        if self.t0 is not None and not self.timed_steps:
            self._close(trainer.global_step)

    def _close(self, step: int) -> None:
        sync()
        self.timed_s = time.perf_counter() - self.t0
        self.timed_steps = step - self.first_step
        if self.renderer is not None:
            self.samples = self.renderer.sample_counts()
            self.budget_per_ray = {k: round(v, 2) for k, v in self.renderer.budget_per_ray().items()}
            self.occupied["timed_end"] = round(float(self.renderer.occupancy.occupancy_fraction()), 4)


def start_step(name: str, args: argparse.Namespace) -> int:
    """The step a case's run starts at: its stage's first step with --field-start, else 0."""
    return STAGE_START.get(name, 0) if parse_field_start(args.field_start) else 0


def case_overrides(name: str, args: argparse.Namespace) -> list[str]:
    recipe, overrides, _, _ = CASES[name]
    overrides = [*overrides, *args.set]
    steps = start_step(name, args) + args.warmup + args.profile + args.steps
    run = [f"trainer.max_steps={steps}", "trainer.val_check_interval=0", "checkpoint.every_n_train_steps=0",
           "checkpoint.save_last=false", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1000000"]
    tiny: list[str] = []
    if args.tiny:
        gaussians = recipe in ("gaussian-sds", "mvdream-gaussians")
        tiny = ["system.guidance.resolution=64", *(TINY_GAUSSIANS if gaussians else TINY_NERF)]
        tiny += TINY_SIZE if recipe != "prolificdreamer" else []
        overrides = [o.replace("=512", "=32").replace("=256", "=32").replace("=64", "=32")
                     .replace("init_points=100000", "init_points=800") for o in overrides]
    return [*PROMPT, *overrides, *tiny, *run]


def deepfloyd_models(cfg: Any, tiny: bool, device: torch.device, folder: Path) -> Any:
    """Random IF-I-XL-shaped models, with the recipe's prompt embeddings cached in ``folder`` first (the small
    stand-in T5 runs and is freed here, outside the measured run: a real run embeds once per prompt)."""
    models = build_if_models(tiny, device, folder)
    c = cfg.system
    primer = find(c["guidance_type"])(c["guidance"], models=models).to(device)  # embeds, caches on disk, frees the T5
    if primer.prompts.encoder_calls != 1:
        raise RuntimeError("the text embeddings were expected to be computed once here")
    del primer
    gc.collect()
    return models


def run_case(name: str, args: argparse.Namespace, device: torch.device, cap_s: float) -> dict[str, Any]:
    recipe, _, full_steps, _ = CASES[name]
    full_cfg = load_config(recipe_config(recipe))
    deepfloyd = full_cfg.system["guidance_type"] == "deepfloyd-if"
    with tempfile.TemporaryDirectory(prefix="lift3d-bench-recipes-") as folder:
        cached = [f"system.guidance.prompt_cache_dir={Path(folder) / 'text-embeddings'}"] if deepfloyd else []
        cfg = load_config(recipe_config(recipe), overrides=[*case_overrides(name, args), *cached])
        start = start_step(name, args)
        pretrained = pretrain(cfg, parse_field_start(args.field_start), args.tiny) if start else None
        # fresh per case: VSD adds LoRA adapters to its UNet; MVDream's has a camera MLP
        mvdream = MVDREAM_UNET if cfg.system["guidance_type"] == "mvdream" else None
        models = (deepfloyd_models(cfg, args.tiny, device, Path(folder)) if deepfloyd
                  else build_sd_models(args.tiny, device, mvdream))
        trainer = build_trainer(cfg, Path(folder), train=True)
        timer = StepTimer(args.warmup, cap_s, end_step=start + args.warmup + args.steps if args.profile else 0, start_step=start)
        trainer.callbacks.append(timer)
        # profiled steps come after the timed window (the profiler's hooks can slow the steps that follow it)
        window = None
        if args.profile and device.type == "cuda":
            window = ProfileWindow(start + args.warmup + args.steps, args.profile, args.profile_stacks)
            trainer.callbacks.append(window)
        L.seed_everything(cfg.seed, verbose=False)
        datamodule, system = build_parts(cfg)
        c = system.cfg
        system.build_guidance = functools.partial(find(c.guidance_type), c.guidance, models=models)
        system.set_save_dir(Path(folder) / "save")
        renderer = getattr(system, "renderer", None)
        timer.renderer = renderer if hasattr(renderer, "sample_counts") else None
        occupied = {}
        if pretrained is not None:
            load_pretrained(system, pretrained)  # field, material, background and occupancy grid
            trainer.callbacks.append(StartAt(start, pretrained.optimizer))
            occupied["pretrained"] = round(pretrained.occupied, 4)
        reset_peak_memory(device)
        trainer.fit(system, datamodule=datamodule)
    if not timer.timed_steps:
        raise RuntimeError(f"no timed steps (ran {trainer.global_step} steps)")
    ms_per_step = timer.timed_s * 1000 / timer.timed_steps
    steps_per_s = 1000.0 / ms_per_step
    full = full_steps or full_cfg.trainer.max_steps
    record: dict[str, Any] = {
        "bench": "recipes", "case": name, "recipe": recipe,
        "resolution": [cfg.data["height"], cfg.data["width"]], "batch": cfg.data["batch_size"],
        "steps_per_s": round(steps_per_s, 3), "ms_per_step": round(ms_per_step, 2), "timed_steps": timer.timed_steps,
        "warmup_steps": timer.first_step - start,
        "warmup_s": round(timer.warmup_s, 1), "full_run_steps": full,
        "projected_full_run_s": round(full / steps_per_s, 1), "projected_full_run_min": round(full / steps_per_s / 60, 2),
        "trainer_precision": trainer.precision,
    }
    if timer.renderer is not None:  # a NeRF: how it started, and what its renderer did in the timed steps
        record["field_start"] = f"analytic:{pretrained.steps}" if pretrained is not None else "fresh"
        record["start_step"] = start
        if pretrained is not None:
            record["field_start_s"] = round(pretrained.seconds, 1)
        record["occupied_fraction"] = {**occupied, **timer.occupied}
        record.update(sample_record(timer.samples, timer.timed_steps))
        if timer.budget_per_ray:
            record["budget_per_ray"] = timer.budget_per_ray
    slowest = sorted(timer.host_times, key=lambda st: -st[1])[:3]
    record["slowest_steps_ms"] = [[step, round(seconds * 1000, 1)] for step, seconds in slowest]  # host-side, unsynced
    if args.set:
        record["overrides"] = list(args.set)
    if window is not None and window.summary is not None:
        record["profile"] = window.summary
    if deepfloyd:  # 0: every embedding came from the disk cache, the encoder was never built in the measured run
        record["text_encoder_calls"] = system.guidance.prompts.encoder_calls
    if hasattr(system, "gaussians"):
        from lift3d.render.splats.renderer import choose_backend

        record["gaussians"] = len(system.gaussians)  # after the run's densification
        record["splat_backend"] = choose_backend(system.renderer.cfg.backend, device)
    if device.type == "cuda":
        record.update(peak_mem_gib=peak_memory_gib(device), peak_reserved_gib=peak_reserved_gib(device))
    del system, trainer, models
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def sample_record(samples: dict[str, float], steps: int) -> dict[str, Any]:
    """Rays and samples per step and samples per ray of the timed steps ("first": density-only evaluations in
    occupied cells; "second": samples through the full field with gradients, after early termination), and the
    fraction of rays that lost samples to a full budget."""
    rays = samples.get("rays", 0.0)
    passes = {k: v for k, v in samples.items() if k not in ("rays", "over_budget")}
    if not rays or not steps:
        return {}
    return {"rays_per_step": round(rays / steps), "samples_per_step": {k: round(v / steps) for k, v in passes.items()},
            "samples_per_ray": {k: round(v / rays, 2) for k, v in passes.items()},
            "rays_over_budget": round(samples.get("over_budget", 0.0) / rays, 6)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks recipes", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated cases, in order ({', '.join(CASES)})")
    parser.add_argument("--steps", type=int, default=25, help="timed steps per case (fewer if a case reaches its time cap)")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps first (cuDNN autotuning, text embeddings)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="skip cases whose rough cost would exceed this total")
    parser.add_argument("--tiny", action="store_true", help="tiny models and renders on the CPU: a smoke test of the benchmark")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every case (repeatable)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N more steps after the timed ones (CUDA)")
    parser.add_argument("--profile-stacks", action="store_true", help="with --profile: name the ops behind the device time "
                        "(input shapes and Python stacks; slower profiled steps)")
    parser.add_argument("--field-start", default="fresh", metavar="fresh|analytic:N",
                        help=f"analytic:N: the late-stage cases ({', '.join(STAGE_START)}) start at their stage's first step "
                             "from the field trained N steps by the recipe's analytic twin (stand_ins.field_start)")
    args = parser.parse_args(argv)
    try:
        parse_field_start(args.field_start)
    except ValueError as error:
        parser.error(str(error))
    if args.tiny:
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    return args


def run_cases(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """One record per case (measured, skipped for the budget, or failed), then the ProlificDreamer stage-1 total."""
    if args.tiny:
        torch.set_num_threads(1)  # tiny models are all overhead
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    env = environment(device)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for name in [n for n in args.cases.split(",") if n]:
        if name not in CASES:
            yield unknown_case("recipes", name, CASES)
            continue
        cost = 0.0 if args.tiny else CASES[name][3]
        if start_step(name, args):
            cost += parse_field_start(args.field_start) * PRETRAIN_S_PER_STEP
        elapsed = time.perf_counter() - started
        skipped = over_budget("recipes", name, cost, elapsed, args.budget_s)
        if skipped:
            yield skipped
            continue
        cap = max(10.0, min(cost, args.budget_s - elapsed)) if not args.tiny else 60.0
        try:
            record = run_case(name, args, device, cap)
        except Exception as error:  # noqa: BLE001  (one failing case must not hide the others)
            traceback.print_exc(file=sys.stderr)
            yield {"bench": "recipes", "case": name, "error": repr(error)[:500], **env}
            continue
        record["case_s"] = round(time.perf_counter() - started - elapsed, 1)
        results[name] = record
        yield {**record, **env}
    if "prolificdreamer-64" in results and "prolificdreamer-512" in results:
        total = results["prolificdreamer-64"]["projected_full_run_s"] + results["prolificdreamer-512"]["projected_full_run_s"]
        yield {"bench": "recipes", "case": "prolificdreamer-stage1-total", "projected_full_run_s": round(total, 1),
               "projected_full_run_min": round(total / 60, 2), **env}
    if "mvdream-64" in results and "mvdream-256" in results:  # the 10k-step mvdream recipe: 5000 steps of each
        total = results["mvdream-64"]["projected_full_run_s"] + results["mvdream-256"]["projected_full_run_s"]
        peak = max(results[name].get("peak_mem_gib", 0.0) for name in ("mvdream-64", "mvdream-256"))
        yield {"bench": "recipes", "case": "mvdream-total", "projected_full_run_s": round(total, 1),
               "projected_full_run_min": round(total / 60, 2), "peak_mem_gib": peak,
               "target": "10k steps under 15 min and under 16 GB on one GPU", **env}


def suite_records(budget_s: float, tiny: bool) -> Iterator[dict[str, Any]]:
    """The records of every case within ``budget_s`` (``python -m benchmarks step_floors`` takes its recipe cases here)."""
    for record in run_cases(parse_args(["--budget-s", str(budget_s), *(["--tiny"] if tiny else [])])):
        yield {k: v for k, v in record.items() if k != "bench"}  # the suite labels its own lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    failed = measured = 0
    for record in run_cases(args):
        print(json.dumps(record), flush=True)
        failed += "error" in record
        measured += "steps_per_s" in record
    print(json.dumps({"bench": "recipes", "total_s": round(time.perf_counter() - started, 1), "cases_run": measured,
                      "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
