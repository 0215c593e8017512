"""The training progress display: steps done of the run's total, rate, time left and the progress-bar losses.

In a terminal it is one status line redrawn in place (at most ``refresh_s`` apart); anything else written meanwhile
(log lines, warnings, prints) goes above it instead of being glued onto it. Piped or redirected it is plain lines, one
every ``every_s`` seconds at most, with no escape codes, and one closing line. A resumed run counts from its
checkpoint's step to the same total, so its rate and time left are those of the steps still to run. Each
validation ends with one line of its held-out scores; test renders show as a ``Stage``.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import lightning as L
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

from lift3d.progress import Stage, duration_text


class StatusLine:
    """One line at the bottom of a terminal, redrawn in place; ``clear`` takes it away before other output."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.text = ""
        self.shown = False

    def show(self, text: str) -> None:
        self.text = text
        width = max(shutil.get_terminal_size((100, 20)).columns - 1, 20)
        self.stream.write("\r" + text[:width] + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class AboveStatus(io.TextIOBase):
    """A text stream that writes above the status line: it clears the line first and draws it again once the
    written text ends a line (``print`` writes its text and its newline in two calls)."""

    def __init__(self, inner: TextIO, status: StatusLine) -> None:
        self.inner, self.status = inner, status
        self._hidden = False

    def write(self, text: str) -> int:
        if self.status.shown:
            self.status.clear()
            self._hidden = True
        written = self.inner.write(text)
        if self._hidden and text.endswith("\n"):
            self._hidden = False
            self.inner.flush()
            self.status.show(self.status.text)
        return written

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer, ...
        return getattr(self.inner, name)


def interactive(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that takes carriage returns and ANSI erase (not a pipe, file or dumb term)."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def metric_text(metrics: dict[str, Any]) -> str:
    """``loss 0.0868, psnr 24.13`` from the progress-bar metrics (``train/`` prefixes dropped)."""
    parts = []
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        parts.append(f"{name.removeprefix('train/')} {number:.4g}")
    return ", ".join(parts)


def step_text(step: int, total: int, start: int, elapsed: float, metrics: dict[str, Any]) -> str:
    """``step 120/1000 (12%), 8.31 steps/s, 1 min 46 s left, loss 0.0868``: where a run is, as a person reads it.
    The rate and the time left count the steps run since ``start`` (a resumed run's checkpoint step)."""
    done = step - start
    rate = done / elapsed if elapsed > 0 and done > 0 else 0.0
    parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)" if total > 0 else f"step {step}"]
    if rate > 0:
        parts.append(f"{rate:.3g} steps/s" if rate >= 1 else f"{1 / rate:.3g} s/step")
        if total > step:
            parts.append(f"{duration_text((total - step) / rate)} left")
    losses = metric_text(metrics)
    return ", ".join(parts + ([losses] if losses else []))


def bar(step: int, total: int, width: int = 20) -> str:
    filled = round(width * min(max(step / total, 0.0), 1.0)) if total > 0 else 0
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _fitting(trainer: L.Trainer) -> bool:
    """Whether the trainer is inside ``fit`` (validation between training steps), not a validate or test run."""
    return getattr(trainer.state, "fn", None) == "fit"  # TrainerFn is a str enum


class TrainingProgress(ProgressBar):
    """lift3d's progress display for training, validation and test runs (see the module's docstring)."""

    def __init__(self, every_s: float = 10.0, refresh_s: float = 0.1, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.refresh_s = every_s, refresh_s
        self._clock = clock
        self._stream = stream
        self._enabled = True
        self._status: StatusLine | None = None
        self._saved: tuple[TextIO, TextIO] | None = None
        self._start_step = 0
        self._start_time = self._last = 0.0
        self._stage: Stage | None = None

    # ----------------------------------------------------------------------------------- Lightning's interface
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)  # through the wrapped streams: above the status line

    @property
    def stream(self) -> TextIO:
        return self._stream or (self._saved[1] if self._saved else sys.stderr)

    def _say(self, text: str) -> None:
        """A line of its own (above the status line in a terminal)."""
        if self._status is not None:
            self._status.clear()
        self.stream.write(f"lift3d: {text}\n")
        self.stream.flush()
        if self._status is not None and self._status.text:
            self._status.show(self._status.text)

    def _draw(self, text: str, force: bool = False) -> None:
        now = self._clock()
        if self._status is not None:
            if force or now - self._last >= self.refresh_s:
                self._status.show(text)
                self._last = now
        elif force or now - self._last >= self.every_s:
            self._say(text)
            self._last = now

    def _attach(self) -> None:
        """In a terminal: the status line, with stdout and stderr writing above it."""
        stream = self._stream or sys.stderr
        if self._status is not None or not interactive(stream):
            return
        self._status = StatusLine(stream)
        self._saved = (sys.stdout, sys.stderr)
        if interactive(sys.stdout):
            sys.stdout = AboveStatus(sys.stdout, self._status)  # type: ignore[assignment]
        sys.stderr = AboveStatus(sys.stderr, self._status)  # type: ignore[assignment]

    def _detach(self) -> None:
        if self._status is None:
            return
        self._status.clear()
        if self._saved is not None:
            if isinstance(sys.stdout, AboveStatus):
                sys.stdout = self._saved[0]
            if isinstance(sys.stderr, AboveStatus):
                sys.stderr = self._saved[1]
        self._status, self._saved = None, None

    # ----------------------------------------------------------------------------------- training
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled:
            return
        self._attach()
        self._start_step = trainer.global_step
        self._start_time = self._clock()
        self._last = self._start_time  # the first plain line comes after every_s, not at step 0

    def _text(self, trainer: L.Trainer) -> str:
        text = step_text(trainer.global_step, trainer.max_steps, self._start_step, self._clock() - self._start_time,
                         trainer.progress_bar_metrics)
        return f"{bar(trainer.global_step, trainer.max_steps)} {text}" if self._status is not None else text

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        last = 0 < trainer.max_steps <= trainer.global_step
        if self._enabled and (self._status is not None or not last):  # piped, the closing line tells the last step
            self._draw(self._text(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled:
            return
        steps, elapsed = trainer.global_step - self._start_step, self._clock() - self._start_time
        losses = metric_text(trainer.progress_bar_metrics)
        rate = f" ({steps / elapsed:.3g} steps/s)" if elapsed > 0 and steps > 0 else ""
        resumed = f" from step {self._start_step}" if self._start_step else ""
        self._detach()
        self._say(f"trained to step {trainer.global_step}{resumed} in {duration_text(elapsed)}{rate}"
                  + (f"; {losses}" if losses else ""))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._detach()
        if self._stage is not None:
            self._stage = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._detach()

    # ----------------------------------------------------------------------------------- validation and test
    @staticmethod
    def _count(done: int, total: Any) -> str:
        finite = isinstance(total, (int, float)) and 0 < total < float("inf")
        return f"{done}/{int(total)}" if finite else str(done)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._enabled and self._status is not None and not trainer.sanity_checking:
            self.has_dataloader_changed(dataloader_idx)
            views = f"validating {self._count(batch_idx + 1, self.total_val_batches_current_dataloader)}"
            self._draw(f"{self._text(trainer)} | {views}" if _fitting(trainer) else views)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reset_dataloader_idx_tracker()
        if not self._enabled or trainer.sanity_checking:
            return
        if self._status is not None and _fitting(trainer):
            self._status.text = self._text(trainer)  # drawn again under the scores' line
        metrics = trainer.callback_metrics
        if "val/psnr" in metrics:
            step = getattr(pl_module, "true_global_step", trainer.global_step)
            ssim = f", SSIM {float(metrics['val/ssim']):.4f}" if "val/ssim" in metrics else ""
            self._say(f"step {step}: held-out views: PSNR {float(metrics['val/psnr']):.2f} dB{ssim}")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled:
            return
        self._attach()
        total = trainer.num_test_batches[0] if trainer.num_test_batches else None
        if self._status is None:  # plain lines: the count at the start, progress while it runs, the end if slow
            self._stage = Stage("rendering the test views", total=int(total) if total else None, unit="batches",
                                every_s=self.every_s).__enter__()

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._enabled:
            return
        if self._stage is not None:
            self._stage.advance()
        else:
            self.has_dataloader_changed(dataloader_idx)
            self._draw(f"rendering the test views: {self._count(batch_idx + 1, self.total_test_batches_current_dataloader)}")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reset_dataloader_idx_tracker()
        if self._stage is not None:
            self._stage.__exit__(None, None, None)
            self._stage = None
        self._detach()
