"""A converged NeRF for the recipes benchmark to time a late stage from (``--field-start analytic:N``).

Random guidance weights cannot train a field, so a case that times the steps of a late stage (mvdream's 256x256
stage, steps 5000-9999) would otherwise start from the blob-initialized field, whose occupancy grid is still
in warm-up: every ray marches the whole box, a worst case a real run never sees there. Here the same field,
material, background, renderer and optimizer config as the timed case is first trained for N steps by the
recipe's offline twin (``mvdream-analytic``: the analytic multi-view prior, no weights) against the bundled
sample scene, a toy that fits mvdream's radius-1 box, so the field converges to a real object with empty space
around it. The timed run then starts from that state (field, material, background, occupancy grid; the
optimizer's moments) with its step counter at the stage's first step, so step-dependent schedules (timestep
range, occupancy updates past warm-up) are those of the real stage.
"""

from __future__ import annotations

import copy
import gc
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lift3d.config import ExperimentConfig, load_config
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts, build_trainer

TWIN = "mvdream-analytic"  # the offline twin of the mvdream recipe: same NeRF and 4-view loop, analytic prior
SHARED = ("field_type", "field", "material_type", "material", "background_type", "background",
          "renderer_type", "renderer", "optimizer")  # system config the pretraining takes from the timed case
RUN = ["trainer.val_check_interval=0", "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false",
       "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1000000"]


def parse_field_start(spec: str) -> int:
    """Pretraining steps of ``--field-start`` ("fresh" or "" -> 0, "analytic:N" -> N)."""
    if spec in ("", "fresh"):
        return 0
    kind, _, steps = spec.partition(":")
    if kind != "analytic" or not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"--field-start must be fresh or analytic:N (N >= 1 pretraining steps), got '{spec}'")
    return int(steps)


def pretrain_config(timed: ExperimentConfig, steps: int, tiny: bool) -> ExperimentConfig:
    """The offline twin's config over the sample scene, with the timed case's field, material, background,
    renderer, optimizer and precision, so their state dicts match; the background never draws random colors
    (the references are composited on white: a random color behind the object would teach the field a fog)."""
    size = ["data.height=32", "data.width=32"] if tiny else []
    anneal = f"system.guidance.max_step_percent=[0,0.98,0.3,{max(steps // 2, 1)}]"  # the twin's: over the first half
    cfg = load_config(recipe_config(TWIN), overrides=[f"data.reference_scene={sample_scene_path()}",
                                                       f"trainer.max_steps={steps}", anneal, *RUN, *size])
    for key in SHARED:
        cfg.system[key] = copy.deepcopy(timed.system[key])
    cfg.system["background"]["random_probability"] = 0.0  # an option of every background; no state
    cfg.trainer.precision = timed.trainer.precision
    return cfg


@dataclass
class Pretrained:
    """What the timed run starts from, on the CPU."""

    steps: int  # pretraining steps
    seconds: float  # their wall time (building included)
    state: dict[str, torch.Tensor]  # the system's state dict (field, material, background, occupancy grid)
    optimizer: dict[str, Any]  # the optimizer's state dict (AdamW moments)
    occupied: float  # occupied fraction of the occupancy grid at the end


def pretrain(timed: ExperimentConfig, steps: int, tiny: bool) -> Pretrained:
    """Train the timed case's field with the analytic multi-view prior for ``steps`` steps; everything on the
    device is freed before returning."""
    started = time.perf_counter()
    cfg = pretrain_config(timed, steps, tiny)
    with tempfile.TemporaryDirectory(prefix="lift3d-bench-pretrain-") as folder:
        trainer = build_trainer(cfg, Path(folder), train=True)
        L.seed_everything(cfg.seed, verbose=False)
        datamodule, system = build_parts(cfg)
        system.set_save_dir(Path(folder) / "save")
        trainer.fit(system, datamodule=datamodule)
        if trainer.global_step != steps:
            raise RuntimeError(f"the pretraining stopped at step {trainer.global_step} of {steps}")
        result = Pretrained(
            steps=steps, seconds=0.0,
            state={k: v.detach().cpu().clone() for k, v in system.state_dict().items()},
            optimizer=_to_cpu(trainer.optimizers[0].state_dict()),
            occupied=float(system.renderer.occupancy.occupancy_fraction()),
        )
    del system, trainer, datamodule
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    result.seconds = time.perf_counter() - started
    return result


def _to_cpu(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def load_pretrained(system: Any, pretrained: Pretrained) -> None:
    """Put the pretrained state into the timed system; its keys and shapes must match exactly."""
    target = system.state_dict()
    if target.keys() != pretrained.state.keys():
        differing = sorted(target.keys() ^ pretrained.state.keys())
        raise RuntimeError(f"the pretrained state does not match the timed system: {differing}")
    wrong = [k for k, v in pretrained.state.items() if v.shape != target[k].shape]
    if wrong:
        raise RuntimeError(f"the pretrained state has other shapes than the timed system: {wrong}")
    system.load_state_dict(pretrained.state, strict=True)


class StartAt(Callback):
    """Starts the timed run at global step ``step`` (as a run resumed there) with the pretrained optimizer state."""

    def __init__(self, step: int, optimizer: dict[str, Any] | None) -> None:
        self.step, self.optimizer = step, optimizer

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        # before the fit loop builds the loader (which samples from trainer.global_step on) and runs a step
        loop = trainer.fit_loop.epoch_loop
        loop.automatic_optimization.optim_progress.optimizer.step.total.completed = self.step
        loop._batches_that_stepped = self.step

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.global_step != self.step:
            raise RuntimeError(f"the timed run was to start at step {self.step}, not {trainer.global_step}")
        if self.optimizer is not None:
            trainer.optimizers[0].load_state_dict(self.optimizer)
