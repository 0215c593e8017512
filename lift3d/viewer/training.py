"""The live viewer of a training run (``--viewer``): a Lightning callback that serves the viser page, renders the
current model between steps within a share of the training time, shows step, loss and Gaussian count, and holds the
training loop while the page's pause button is down. Not added at all when the viewer is off (no cost)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lift3d.config import ViewerConfig
from lift3d.rng import capture_rng_state, restore_rng_state

log = logging.getLogger("lift3d.viewer")
STATS_EVERY_SECONDS = 0.5  # how often the page's step / loss line is updated (each reads the loss: one host sync)


class RenderBudget:
    """Allows a render only while the time spent rendering is at most ``share`` of the training time so far
    (paused time excluded), so the viewer takes at most that share plus one render's overshoot."""

    def __init__(self, share: float, start: float) -> None:
        self.share, self.start, self.spent, self.paused = share, start, 0.0, 0.0

    def allows(self, now: float) -> bool:
        return self.share > 0 and self.spent <= self.share * (now - self.start - self.paused)

    def spend(self, seconds: float) -> None:
        self.spent += seconds

    def exclude(self, seconds: float) -> None:
        """Time the training did not run (paused): neither training time nor render time."""
        self.paused += seconds


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _float(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("loss")
    return float(value.detach()) if torch.is_tensor(value) else None


class ViewerCallback(Callback):
    """Serves the viewer on global rank 0 while ``fit`` runs."""

    def __init__(self, cfg: ViewerConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.server: Any = None
        self.budget: RenderBudget | None = None
        self.renders = 0  # renders shown so far (for tests and the benchmark)
        self.longest_render = 0.0  # seconds of the slowest render (the most the budget can overshoot by)
        self._loss: Any = None
        self._next_stats = 0.0

    # ----------------------------------------------------------------------------------- life cycle
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        from lift3d.viewer.models import home_camera, training_views_of
        from lift3d.viewer.server import ViewerServer

        views = training_views_of(getattr(trainer, "datamodule", None))
        self.server = ViewerServer(self.cfg, f"training {self.run_dir.name}", self.run_dir, training=True,
                                   home=home_camera(views))
        if views is not None:
            self.server.show_training_views(views)
        self.budget = RenderBudget(self.cfg.max_share, time.perf_counter())
        print(f"lift3d: live viewer at {self.server.url} (renders take at most {self.cfg.max_share:.0%} of the training time)",
              flush=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    # ----------------------------------------------------------------------------------- between steps
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        server = self.server
        if server is None:
            return
        self._loss = outputs  # read (a host sync) only when the stats line is updated
        now = time.perf_counter()
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_SECONDS
            server.set_stats(self.stats_line(trainer, pl_module))
        if server.paused:
            self._hold(trainer, pl_module)
        elif self.budget is not None and self.budget.allows(now):
            job = server.next_job(self.cfg.refresh_seconds)
            if job is not None:
                self.budget.spend(self._render(pl_module, job))

    def stats_line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        loss = _float(self._loss)
        parts = [f"step **{trainer.global_step}** / {trainer.max_steps}"]
        if loss is not None:
            parts.append(f"loss **{loss:.4g}**")
        gaussians = getattr(pl_module, "gaussians", None)
        if gaussians is not None and hasattr(gaussians, "__len__"):
            parts.append(f"Gaussians **{len(gaussians):,}**")
        if self.server is not None and self.server.paused:
            parts.append("**paused**")
        return " · ".join(parts)

    def _hold(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Block the training loop while paused, still answering the page (renders cost nothing then)."""
        start = time.perf_counter()
        log.info("training paused at step %d (resume on the viewer page)", trainer.global_step)
        self.server.set_stats(self.stats_line(trainer, pl_module))
        while self.server is not None and self.server.paused:
            job = self.server.next_job()
            if job is None:
                time.sleep(0.03)
            else:
                self._render(pl_module, job)
        if self.budget is not None:
            self.budget.exclude(time.perf_counter() - start)
        if self.server is not None:
            self.server.set_stats(self.stats_line(trainer, pl_module))
        log.info("training resumed at step %d", trainer.global_step)

    def _render(self, pl_module: L.LightningModule, job: Any) -> float:
        """Render one view from the model as it is now, in eval mode and without touching the training's random
        streams; returns the seconds it took (the GPU finished)."""
        from lift3d.viewer.models import render_mode_image

        device = pl_module.device
        _synchronize(device)
        start = time.perf_counter()
        rng, was_training = capture_rng_state(), pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad():
                out = pl_module.render_views({"cameras": job.cameras.to(device)})
                picture = render_mode_image(out, job.mode, job.cameras)
        finally:
            pl_module.train(was_training)
            restore_rng_state(rng)
        _synchronize(device)
        self.server.show(job, picture)
        self.renders += 1
        seconds = time.perf_counter() - start
        self.longest_render = max(self.longest_render, seconds)
        return seconds
