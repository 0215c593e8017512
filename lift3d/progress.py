"""``progress.json`` in the trial folder: step, loss, rate, ETA, latest image and status of a run.

Front-ends (the web app, scripts) follow a run by reading this file; it is rewritten atomically at most
about once a second, so reading it never costs the training loop more than that. When the run ends,
``status`` is finished, interrupted or failed; ``checkpoint`` (and, when interrupted, ``checkpoint_step`` and
``signal``) say what was kept: null when no checkpoint was written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from lift3d.interrupts import SIGNAL_NAMES, StopRequested
from lift3d.saving import atomic_write_bytes

PROGRESS_FILE = "progress.json"


def read_progress(trial_dir: str | Path) -> dict[str, Any] | None:
    """The run's last progress record, or None before the run wrote one."""
    path = Path(trial_dir) / PROGRESS_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def update_progress(trial_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into the run's progress record and rewrite it atomically."""
    record = read_progress(trial_dir) or {"trial_dir": str(trial_dir)}
    record.update(fields, updated=time.time())
    atomic_write_bytes(Path(trial_dir) / PROGRESS_FILE, (json.dumps(record, indent=1) + "\n").encode())
    return record


def latest_image(save_dir: Path, pattern: str = "it*-val/*.png") -> Path | None:
    """The newest image matching ``pattern`` under ``save_dir``."""
    images = list(save_dir.glob(pattern)) if save_dir.is_dir() else []
    return max(images, key=lambda p: p.stat().st_mtime) if images else None


class ProgressFileCallback(Callback):
    """Writes ``progress.json`` during training (throttled) and at every change of status."""

    def __init__(self, trial_dir: Path, min_interval_s: float = 1.0) -> None:
        self.trial_dir = trial_dir
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._start_time = 0.0
        self._start_step = 0

    def write(self, **fields: Any) -> None:
        update_progress(self.trial_dir, **fields)
        self._last_write = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_time = time.monotonic()
        self._start_step = trainer.global_step
        if trainer.is_global_zero:
            self.write(status="running", step=trainer.global_step, max_steps=trainer.max_steps)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
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
            image = latest_image(self.trial_dir / "save")
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
