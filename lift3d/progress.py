"""``progress.json`` in the run folder: step, loss, rate, ETA, latest image and status of a run; ``Stage``: log
lines for the long steps outside training (meshing, texture baking, video frames, texture fitting).

Front-ends (the web app, scripts) follow a run by reading this file; it is rewritten atomically at most
about once a second, so reading it never costs the training loop more than that. When the run ends,
``status`` is finished, interrupted or failed; ``checkpoint`` (and, when interrupted, ``checkpoint_step`` and
``signal``) say what was kept: null when no checkpoint was written.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from lift3d.interrupts import SIGNAL_NAMES, StopRequested
from lift3d.saving import atomic_write_bytes

PROGRESS_FILE = "progress.json"


def read_progress(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's last progress record, or None before the run wrote one."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def update_progress(run_dir: str | Path, /, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into the run's progress record and rewrite it atomically."""
    record = read_progress(run_dir) or {"run_dir": str(run_dir)}
    record.update(fields, updated=time.time())
    atomic_write_bytes(Path(run_dir) / PROGRESS_FILE, (json.dumps(record, indent=1) + "\n").encode())
    return record


def latest_image(save_dir: Path, pattern: str = "it*-val/*.png") -> Path | None:
    """The newest image matching ``pattern`` under ``save_dir``."""
    images = list(save_dir.glob(pattern)) if save_dir.is_dir() else []
    return max(images, key=lambda p: p.stat().st_mtime) if images else None


class ProgressFileCallback(Callback):
    """Writes ``progress.json`` during training (throttled) and at every change of status."""

    def __init__(self, run_dir: Path, min_interval_s: float = 1.0) -> None:
        self.run_dir = run_dir
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._start_time = 0.0
        self._start_step = 0

    def write(self, **fields: Any) -> None:
        update_progress(self.run_dir, **fields)
        self._last_write = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_time = time.monotonic()
        self._start_step = trainer.global_step
        if trainer.is_global_zero:
            self.write(status="running", step=trainer.global_step, max_steps=trainer.max_steps)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not trainer.is_global_zero or time.monotonic() - self._last_write < self.min_interval_s:
            return
        step = trainer.global_step
        elapsed = max(time.monotonic() - self._start_time, 1e-9)
        rate = (step - self._start_step) / elapsed
        loss = trainer.callback_metrics.get("train/loss")
        self.write(
            status="running",
            step=step,
            max_steps=trainer.max_steps,
            loss=float(loss) if loss is not None else None,
            steps_per_second=rate,
            eta_seconds=(trainer.max_steps - step) / rate if rate > 0 else None,
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            image = latest_image(self.run_dir / "save")
            self.write(latest_image=str(image) if image else None)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.write(status="trained", step=trainer.global_step, eta_seconds=0.0)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not trainer.is_global_zero:
            return
        if isinstance(exception, StopRequested):  # SIGINT / SIGTERM: stopped at a step boundary with a checkpoint
            self.write(status="interrupted", step=exception.step, checkpoint=str(exception.checkpoint),
                       checkpoint_step=exception.step, signal=SIGNAL_NAMES.get(exception.signum), error=None)
            return
        status = "interrupted" if isinstance(exception, (KeyboardInterrupt, SystemExit)) else "failed"
        # the step reached: training writes it at most once a second, a checkpoint may be newer
        self.write(status=status, step=trainer.global_step, error=f"{type(exception).__name__}: {exception}")


def duration_text(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 05 min``: a duration as a person reads it."""
    seconds = max(0, round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


class Stage:
    """One long step outside training as log lines: one when it starts (what and how many), one every ``every_s``
    seconds while it runs (count, elapsed, ETA) and one when it ends, if it took that long, so a step that takes
    minutes never runs silent and one that takes a moment costs a single line. Use as a context manager::

        with Stage("meshing: density on a 256 x 256 x 256 grid", total=64, unit="blocks") as stage:
            for block in blocks:
                ...
                stage.advance()
    """

    def __init__(self, what: str, total: int | None = None, unit: str = "", every_s: float = 10.0,
                 logger: logging.Logger | None = None) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.log = logger or logging.getLogger("lift3d.progress")
        self.done = 0
        self._start = self._last = time.monotonic()

    def __enter__(self) -> Stage:
        self._start = self._last = time.monotonic()
        count = f" ({self.total} {self.unit})".replace("  ", " ") if self.total is not None else ""
        self.log.info("%s%s", self.what, count)
        return self

    def _count(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.done}/{self.total}{unit}" if self.total is not None else f"{self.done}{unit}"

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; logs a progress line when ``every_s`` has passed since the last."""
        self.done += n
        now = time.monotonic()
        if now - self._last < self.every_s or (self.total is not None and self.done >= self.total):
            return  # the closing line reports the last count
        self._last = now
        elapsed = now - self._start
        eta = ""
        if self.total and 0 < self.done < self.total:
            eta = f", about {duration_text(elapsed * (self.total - self.done) / self.done)} left"
        self.log.info("%s: %s, %s%s", self.what, self._count(), duration_text(elapsed), eta)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        elapsed = time.monotonic() - self._start
        if kind is None and elapsed >= self.every_s:
            count = f"{self._count()} " if self.done or self.total is not None else ""
            self.log.info("%s: done, %sin %s", self.what, count, duration_text(elapsed))
