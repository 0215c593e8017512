"""The system base: one training recipe as a LightningModule that builds its parts from config.

A system wires parts (data -> representation -> renderer -> objective) and owns nothing else. The base
gives every recipe the same optimizer set-up, weighted and logged loss terms, per-step updates,
non-finite-loss policy, validation grids with metrics, test videos and checkpointed RNG state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from lift3d.aftercare import attempt
from lift3d.base import Configurable, Updateable
from lift3d.config import bounded, choice, step_count
from lift3d.data.summary import SceneSummary
from lift3d.distributed import finite_on_every_rank
from lift3d.export import ExportConfig, ExportSources, export_formats
from lift3d.registry import find
from lift3d.rng import capture_rng_state, restore_rng_state
from lift3d.saving import OutputSaver
from lift3d.schedule import scheduled_value
from lift3d.systems.evaluation import grid_panels, labeled_panels, record_metrics, view_indices, view_scores
from lift3d.systems.optim import (
    OptimizerConfig,
    SchedulerConfig,
    apply_lr_schedules,
    build_optimizer,
    build_scheduler,
    plain_param_groups,
)

log = logging.getLogger(__name__)
MATMUL_PRECISIONS = ("", "highest", "high", "medium")  # torch.set_float32_matmul_precision's ("": leave torch's)


class NonFiniteLossError(RuntimeError):
    """Training produced NaN or Inf; the run stops and its last good checkpoint stays."""


@dataclass
class LossConfig:
    """Loss weights: each recipe subclasses this with ``lambda_<term>`` fields (numbers or schedules)."""


@dataclass
class SystemConfig:
    """Options every system has."""

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # optimizer and per-group options
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # optional torch LR scheduler
    loss: LossConfig = field(default_factory=LossConfig)  # weights lambda_<term> of the loss terms
    nonfinite_loss: str = choice("stop", "skip")  # on NaN/Inf loss: stop (keep last good checkpoint) or skip the step
    # check the loss every N steps (each check is one host sync; 0: never)
    nonfinite_check_every: int = step_count(1, kind="kept")
    video_fps: int = bounded(30, low=1)  # frame rate of the test orbit video
    export: ExportConfig = field(default_factory=ExportConfig)  # exported asset (formats, mesh options; lift3d export)
    # torch.set_float32_matmul_precision on CUDA when training starts ("": leave torch's)
    matmul_precision: str = choice("", among=MATMUL_PRECISIONS)


class BaseSystem(L.LightningModule, Configurable, Updateable):
    """Base for recipes: subclasses build parts in ``__init__`` and implement ``training_step`` and
    ``render_views`` (cameras batch -> dict of [B, H, W, C] images: rgb, alpha, depth, normal, ...).

    Render entry points, one signature each in every family: ``render_views(batch)`` is the evaluation render
    of every system (grids, videos, exporters, viewer); reconstruction recipes implement it directly,
    text-to-3D recipes implement ``render(batch)`` under it (``TextTo3DSystem``); a Gaussian system's
    rasterization of cameras is ``render_gaussians(cameras, background, **options)``."""

    Config = SystemConfig

    def __init__(self, cfg: Any = None) -> None:
        L.LightningModule.__init__(self)
        Configurable.__init__(self, cfg)
        self._save_dir: Path | None = None
        self._loaded_step = 0
        self._eval_rng: dict[str, Any] | None = None
        self._val_scores: list[Tensor] = []
        self._test_frames: dict[int, Any] = {}
        self._unsaved: dict[str, Any] = {}
        self.skipped_steps = 0
        self.scene: SceneSummary | None = None  # the training data's facts (set_scene); None: loaded without data
        self._fit_device: torch.device | None = None  # where training ran (the export at its end runs there too)

    def set_scene(self, scene: SceneSummary | None) -> None:
        """Hand the system what it may know of its training data (the data module's ``scene_summary()``); the runner
        calls this before training or evaluation, and ``setup`` reads ``self.scene``."""
        self.scene = scene

    @classmethod
    def ddp_strategy(cls) -> Any:
        """The Lightning strategy for several devices, or None for the runner's default DDP."""
        return None

    # ----------------------------------------------------------------------------------- building parts
    @staticmethod
    def build_part(type_name: str, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """The part registered as ``type_name``, built from ``cfg``. A part refuses bad values of its config with a
        ValueError; that is the user's config, so it surfaces as a ConfigError naming the part (not an internal error)."""
        from lift3d.config import ConfigError

        try:
            return find(type_name)(cfg, *args, **kwargs)
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(f"{type_name}: {error}") from error

    def add_unsaved_part(self, name: str, part: Any) -> None:
        """A part kept out of the state dict (e.g. frozen diffusion weights); moved to the system's device.

        If it has ``checkpoint_state()`` / ``load_checkpoint_state(state)``, that state is checkpointed."""
        self._unsaved[name] = part

    def unsaved_part(self, name: str) -> Any:
        return self._unsaved[name]

    def lazy_unsaved_part(self, name: str, type_name: str, cfg: Any, update_step: bool = False) -> Any:
        """The unsaved part ``name``, built from ``type_name`` and ``cfg`` on first use (loading weights only when
        needed) and placed on the system's device; ``update_step``: brought to the current step when built."""
        if name not in self._unsaved:
            part = self.build_part(type_name, cfg)
            self.add_unsaved_part(name, part)
            part.to(self.device)
            if update_step:
                part.update_step(self.current_epoch if self._trainer is not None else 0, self.true_global_step)
        return self._unsaved[name]

    def _move_unsaved_parts(self) -> None:
        for part in self._unsaved.values():
            if hasattr(part, "to"):
                part.to(self.device)

    # ----------------------------------------------------------------------------------- outputs
    def set_save_dir(self, path: str | Path) -> None:
        """Where validation grids, test videos and exports go (the run's ``save/``)."""
        self._save_dir = Path(path)

    @property
    def saver(self) -> OutputSaver:
        if self._save_dir is None:
            raise RuntimeError("the system has no save folder; the runner sets it with set_save_dir()")
        return OutputSaver(self._save_dir)

    @property
    def true_global_step(self) -> int:
        """The training step, also when only evaluating a loaded checkpoint."""
        step = self.trainer.global_step if self._trainer is not None else 0
        return max(step, self._loaded_step)

    # ----------------------------------------------------------------------------------- optimization
    def configure_optimizers(self) -> Any:
        clips = self._trainer is not None and bool(self.trainer.gradient_clip_val)
        optimizer = build_optimizer(self, self.cfg.optimizer, self.true_global_step, clips_gradients=clips)
        scheduler = build_scheduler(optimizer, self.cfg.scheduler)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def updateables(self) -> list[Updateable]:
        """Parts that get ``update_step`` each training step: sub-modules and unsaved parts."""
        found = [m for m in self.modules() if isinstance(m, Updateable) and m is not self]
        return found + [p for p in self._unsaved.values() if isinstance(p, Updateable)]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        step = self.true_global_step
        for optimizer in self._all_optimizers():
            apply_lr_schedules(optimizer, step)
        self.update_step(self.current_epoch, step)
        for part in self.updateables():
            part.update_step(self.current_epoch, step)

    def _all_optimizers(self) -> list[torch.optim.Optimizer]:
        if self._trainer is None:
            return []
        return [getattr(o, "optimizer", o) for o in self.trainer.optimizers]

    def loss_weight(self, term: str) -> float:
        """The current weight ``lambda_<term>`` (scheduled values evaluated at this step)."""
        name = f"lambda_{term}"
        if not hasattr(self.cfg.loss, name):
            raise KeyError(f"loss term '{term}' has no weight: add '{name}' to {type(self.cfg.loss).__name__}")
        return float(scheduled_value(getattr(self.cfg.loss, name), self.true_global_step))

    def log_step(self, name: str, value: Tensor | float, prog_bar: bool = False) -> None:
        """``self.log`` of a per-step training scalar, only on the steps the loggers write (every
        ``trainer.log_every_n_steps``, and the first): each call costs Lightning bookkeeping and a
        host-to-device copy that waits for the GPU, for values that would otherwise never be written.

        Progress-bar values are copied to the CPU here, on the logging step: Lightning turns the cached
        progress-bar values into numbers after every step, and ``.item()`` of a GPU tensor waits for the
        GPU each time (one host sync per step, which stops the CPU queueing the next step ahead)."""
        if self._is_logging_step():
            if prog_bar and torch.is_tensor(value):
                value = value.detach().cpu()
            self.log(name, value, on_step=True, prog_bar=prog_bar, logger=True)

    def _is_logging_step(self) -> bool:
        if self._trainer is None or self.true_global_step == 0:
            return True
        connector = getattr(self.trainer, "_logger_connector", None)  # Lightning's own "write logs now?" test
        return connector is None or bool(connector.should_update_logs)

    def weighted_sum(self, terms: dict[str, Tensor]) -> Tensor:
        """The loss: the sum of the terms, each times its current weight (terms of weight 0 left out)."""
        total: Tensor | None = None
        for name, value in terms.items():
            weight = self.loss_weight(name)
            if weight != 0.0:
                total = weight * value if total is None else total + weight * value
        if total is None:
            raise ValueError(f"every loss term has weight 0 at step {self.true_global_step}: {list(terms)}")
        return total

    def total_loss(self, terms: dict[str, Tensor]) -> Tensor | None:
        """Weighted sum of loss terms; logs each term and the total; applies the non-finite policy.

        Returns None when the step is to be skipped (Lightning then skips the optimizer step)."""
        for name, value in terms.items():
            self.log_step(f"train/loss_{name}", value.detach())
        total = self.weighted_sum(terms)
        self.log_step("train/loss", total.detach(), prog_bar=True)
        every = self.cfg.nonfinite_check_every
        if every and self.true_global_step % every == 0 and not finite_on_every_rank(total):
            bad = [name for name, value in terms.items() if not bool(torch.isfinite(value).all())]
            where = ", ".join(bad) or ("the sum" if not bool(torch.isfinite(total)) else "none here: on another DDP rank")
            message = f"the loss is not finite at step {self.true_global_step} (non-finite terms: {where})"
            if self.cfg.nonfinite_loss == "skip":
                self.skipped_steps += 1
                log.warning("%s; skipping this step (system.nonfinite_loss=skip)", message)
                return None
            raise NonFiniteLossError(
                f"{message}. The run stops; the last good checkpoint in ckpts/ is kept. Lower the learning "
                "rate or a loss weight, or set system.nonfinite_loss=skip to skip such steps."
            )
        return total

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.cfg.nonfinite_loss != "skip":
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads and not all(bool(torch.isfinite(g).all()) for g in grads):
            self.skipped_steps += 1
            log.warning("non-finite gradients at step %d; skipping this update", self.true_global_step)
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    # ----------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lift3d"] = {"system_type": self.registered_name}  # which recipe wrote it (checked on load)
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = [plain_param_groups(state) for state in checkpoint["optimizer_states"]]
        for name, part in self._unsaved.items():
            if hasattr(part, "checkpoint_state"):
                checkpoint[f"part:{name}"] = part.checkpoint_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._loaded_step = int(checkpoint.get("global_step", 0))
        for name, part in self._unsaved.items():
            if hasattr(part, "load_checkpoint_state") and f"part:{name}" in checkpoint:
                part.load_checkpoint_state(checkpoint[f"part:{name}"])

    # ----------------------------------------------------------------------------------- evaluation
    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Render the batch's cameras: {"rgb": [B,H,W,3], "alpha": [B,H,W,1], "depth", "normal", ...}."""
        raise NotImplementedError(f"{type(self).__name__} must implement render_views")

    def grid_panels(self, out: dict[str, Tensor], batch: dict[str, Any], i: int) -> list[tuple[str, Tensor, str]]:
        """Panels (kind, image, label) of view ``i`` for the validation grid (override to add e.g. the guidance's
        estimate)."""
        return grid_panels(out, batch, i)

    def _fork_rng(self) -> None:
        # evaluation must not change the training random stream, so resumed runs match exactly
        self._eval_rng = capture_rng_state()

    def _join_rng(self) -> None:
        if self._eval_rng is not None:
            restore_rng_state(self._eval_rng)
            self._eval_rng = None

    def on_fit_start(self) -> None:
        self._fit_device = self.device
        self._move_unsaved_parts()
        self.apply_matmul_precision(self.device)

    def apply_matmul_precision(self, device: torch.device) -> None:
        """``torch.set_float32_matmul_precision(cfg.matmul_precision)`` when running on CUDA (it is global: set it
        before any work of the run, so a stage conversion in ``setup`` and training use the same)."""
        if self.cfg.matmul_precision and device.type == "cuda":
            torch.set_float32_matmul_precision(self.cfg.matmul_precision)

    def on_fit_end(self) -> None:
        self._loaded_step = self.trainer.global_step  # later test/export runs name files by this step

    def export_at_fit_end(self) -> None:
        """Write ``export.formats`` when training ends (rank 0) on the training device (Lightning has moved the model
        to the CPU by ``on_fit_end``: an export there would take the CPU's sizes and time)."""
        device = self._fit_device or self.device
        if self.trainer.is_global_zero and self.cfg.export.formats:
            self.to(device)
            attempt("the export", self.export, self.saver, list(self.cfg.export.formats))
            self.cpu()
            torch.cuda.empty_cache()  # a no-op without CUDA

    def on_validation_start(self) -> None:
        self._move_unsaved_parts()
        self._fork_rng()
        self._val_scores = []

    def on_validation_end(self) -> None:
        self._join_rng()

    def on_test_start(self) -> None:
        self._move_unsaved_parts()
        self._fork_rng()
        self._test_frames = {}
        self._val_scores = []

    def on_test_end(self) -> None:
        self._join_rng()

    def _score(self, out: dict[str, Tensor], batch: dict[str, Any]) -> None:
        scores = view_scores(out, batch)
        if scores is not None:
            self._val_scores.append(scores.detach())

    def _evaluate(self, batch: dict[str, Any], batch_idx: int, split: str) -> dict[int, Tensor]:
        """Render, score against ground truth if any, save one grid per view; rgb by view index.

        Under DDP only rank 0 evaluates (every view: the runner turns off distributed sampling), so one
        process writes the images; the other ranks meet it in the metric all-gather with no scores."""
        if self._trainer is not None and self.trainer.world_size > 1 and not self.trainer.is_global_zero:
            return {}
        out = self.render_views(batch)
        self._score(out, batch)
        n = next(iter(out.values())).shape[0]
        rgb = {}
        for i, index in enumerate(view_indices(batch, batch_idx, n)):
            self.saver.grid(f"it{self.true_global_step}-{split}/{index:04d}.png", labeled_panels(self.grid_panels(out, batch, i)))
            rgb[index] = out["rgb"][i]
        return rgb

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def _gather_scores(self) -> dict[str, float] | None:
        local = torch.cat(self._val_scores) if self._val_scores else torch.zeros(0, 2, device=self.device)
        counts = self.all_gather(torch.tensor([local.shape[0]], device=self.device)).reshape(-1)
        sums = self.all_gather(local.sum(dim=0)).reshape(-1, 2).sum(dim=0)
        total = int(counts.sum())
        if total == 0:
            return None
        return {"psnr": float(sums[0] / total), "ssim": float(sums[1] / total), "views": total}

    def _record_metrics(self, split: str) -> None:
        scores = self._gather_scores()
        if scores is None:
            return
        self.log(f"{split}/psnr", scores["psnr"], sync_dist=False, rank_zero_only=True)
        self.log(f"{split}/ssim", scores["ssim"], sync_dist=False, rank_zero_only=True)
        if self.trainer.is_global_zero:
            record_metrics(self.saver, split, self.true_global_step, scores)

    def on_validation_epoch_end(self) -> None:
        self._record_metrics("val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        for index, rgb in self._evaluate(batch, batch_idx, "test").items():
            self._test_frames[index] = rgb.detach().clamp(0, 1).cpu()

    def on_test_epoch_end(self) -> None:
        self._record_metrics("test")
        if self._test_frames and self.trainer.is_global_zero:
            frames = [self._test_frames[k] for k in sorted(self._test_frames)]
            attempt("the test video", self.saver.video, f"it{self.true_global_step}-test.mp4", frames, fps=self.cfg.video_fps)
        self._test_frames = {}

    # ----------------------------------------------------------------------------------- export
    def export_sources(self) -> ExportSources:
        """What this recipe's representation can hand to the exporters (see ``lift3d.export``)."""
        raise ValueError(f"{self.registered_name} runs have nothing to export")

    def export(self, saver: OutputSaver, formats: list[str] | None) -> list[Path]:
        """Write the asset in ``formats`` (None: ``export.formats``) through the one export table; each format
        succeeds or warns on its own (``lift3d.aftercare``)."""
        cfg = self.cfg.export
        with saver.exporting():  # never over a file lift3d did not write (lift3d.saving)
            return export_formats(saver, formats or cfg.formats, cfg, self.export_sources(), stem=f"it{self.true_global_step}")
