"""Stopping a run without losing work: SIGINT and SIGTERM end training at the next step boundary with a checkpoint of
that step, and training also checkpoints every few minutes (``checkpoint.every_n_minutes``).

Lightning turns Ctrl-C into ``sys.exit(1)`` from wherever the step was and SIGTERM into a clean exit 0; the runner
installs ``StopSignals`` around the trainer instead, and ``StopAndSaveCallback`` acts on the request after the
optimizer step, where a checkpoint is the same as a periodic one (resume continues exactly). Under DDP the ranks
agree on stopping (and on timed checkpoints) every ``trainer.sigterm_check_every`` steps, so every rank stops at
the same step and rank 0 writes the checkpoint.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class StopRequested(Exception):
    """Raised inside ``trainer.fit`` at a step boundary after a stop signal, once the checkpoint is written."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"{SIGNAL_NAMES.get(signum, signum)} at step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class Interrupted(KeyboardInterrupt):
    """The run stopped on SIGINT / SIGTERM: the command exits ``128 + signum`` (130, 143) with ``str(self)`` as its one
    line (empty on DDP ranks other than 0, which say nothing)."""

    def __init__(self, signum: int, step: int | None, checkpoint: Path | None, run_dir: Path | None,
                 quiet: bool = False) -> None:
        self.signum, self.step, self.checkpoint, self.run_dir, self.quiet = signum, step, checkpoint, run_dir, quiet
        super().__init__(self.line())

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)

    def line(self) -> str:
        if self.quiet:
            return ""
        name = SIGNAL_NAMES.get(self.signum, f"signal {self.signum}")
        if self.checkpoint is None:
            return f"interrupted by {name}; no checkpoint was written"
        where = f" at step {self.step}" if self.step is not None else ""
        resume = ""
        if self.run_dir is not None and (self.run_dir / "configs" / "parsed.yaml").is_file():
            resume = f" (continue: lift3d train {self.run_dir / 'configs' / 'parsed.yaml'} --resume {self.checkpoint})"
        return f"interrupted by {name}; checkpoint{where} kept in {self.checkpoint}{resume}"

    def __str__(self) -> str:
        return self.line()


def newest_checkpoint(folder: Path) -> Path | None:
    """The most recently written ``*.ckpt`` in ``folder``, last.ckpt on a tie (None when there is none)."""
    found = list(folder.glob("*.ckpt")) if folder.is_dir() else []
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt")) if found else None


def checkpoint_step(path: Path | None) -> int | None:
    """The ``global_step`` a checkpoint holds, read without copying its tensors (None if unreadable)."""
    if path is None:
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step"))
    except Exception:  # noqa: BLE001  (only a label for the user: an unreadable file has no step to show)
        return None


class StopSignals:
    """Handlers for SIGINT and SIGTERM while a run is inside the trainer (a context manager).

    Armed (the training loop runs and the callback can act): the first signal only records itself and training
    stops at the end of the step. Otherwise (setting up, evaluating, exporting), or on a second signal, it raises
    ``KeyboardInterrupt`` at once. ``signum`` remembers the first signal either way."""

    def __init__(self) -> None:
        self.signum = 0
        self.armed = False
        self.active = False  # inside the ``with`` block: only then are the handlers in place
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """(Re)install the handlers: Lightning puts its own SIGTERM handler in place when ``fit`` starts."""
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread; embedded callers keep Python's defaults
        for signum in SIGNAL_NAMES:
            current = signal.getsignal(signum)
            if current != self._handle:
                self._previous.setdefault(signum, current)
                signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        self.active = True
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = self.armed = False
        self.restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = not self.signum
        self.signum = self.signum or signum
        if self.armed and first:
            return  # StopAndSaveCallback stops at the end of this step
        raise KeyboardInterrupt


class StopAndSaveCallback(Callback):
    """At each step's end: on a stop request write the checkpoint and raise ``StopRequested``; every
    ``every_n_minutes`` refresh ``last.ckpt`` (the time since the newest checkpoint of any kind counts)."""

    def __init__(self, signals: StopSignals, ckpt_dir: Path, save_last: bool, every_n_minutes: float, periodic_steps: int,
                 check_every: int) -> None:
        self.signals = signals
        self.ckpt_dir = ckpt_dir
        self.save_last = save_last
        self.interval_s = max(every_n_minutes, 0.0) * 60.0
        self.periodic_steps = periodic_steps
        self.check_every = check_every  # DDP: agree every N steps (0: never, and a signal stops at once)
        self._last_save = time.monotonic()
        self._saved_step = -1  # the step of the newest checkpoint written

    def checkpoint_path(self, step: int) -> Path:
        return self.ckpt_dir / ("last.ckpt" if self.save_last else f"step{step:07d}.ckpt")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        if self.signals.active:  # a trainer built outside run_experiment keeps Python's and Lightning's handlers
            self.signals.install()  # replaces the SIGTERM handler Lightning installed in fit (it would exit 0)
            self.signals.armed = trainer.world_size == 1 or self.check_every > 0

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A signal during the last step or the final validation: training is complete, so stop before the exports
        and test renders (its end-of-training checkpoint is the one kept). Otherwise make sure last.ckpt holds the
        final step."""
        if self.signals.armed:
            signum = self.signals.signum
            if trainer.world_size > 1:
                signum, _ = self._agree(trainer, signum, False)
            self.signals.armed = False
            if signum:
                self.signals.signum = self.signals.signum or signum
                self._stop(trainer)
        # Lightning writes last.ckpt at the end only when a periodic checkpoint falls on the last step
        if self.save_last and self._saved_step != trainer.global_step:
            trainer.save_checkpoint(self.checkpoint_path(trainer.global_step), weights_only=False)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._last_save = time.monotonic()
        self._saved_step = int(checkpoint.get("global_step", -1))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        stop = self.signals.signum
        due = self.save_last and self.interval_s > 0 and time.monotonic() - self._last_save >= self.interval_s
        if trainer.world_size > 1:
            if self.check_every <= 0 or step % self.check_every:
                return
            stop, due = self._agree(trainer, stop, due)
        if stop:
            self.signals.signum = self.signals.signum or stop  # another rank was signalled: stop as it does
            self._stop(trainer)
        if due and not (self.periodic_steps > 0 and step % self.periodic_steps == 0):  # else ModelCheckpoint saves now
            trainer.save_checkpoint(self.checkpoint_path(step), weights_only=False)

    def _agree(self, trainer: L.Trainer, signum: int, due: bool) -> tuple[int, bool]:
        """The signal any rank got (0: none) and whether any rank is due, the same on every rank (one all-reduce)."""
        flags = torch.tensor([float(signum), float(due)], device=trainer.strategy.root_device)
        flags = trainer.strategy.reduce(flags, reduce_op="max")
        return int(flags[0]), bool(flags[1] > 0)

    def _stop(self, trainer: L.Trainer) -> None:
        step = trainer.global_step
        path = self.checkpoint_path(step)
        if not (self.save_last and self._saved_step == step):  # else last.ckpt already holds this step
            # every rank takes part; rank 0 writes (atomically, AtomicCheckpointIO)
            trainer.save_checkpoint(path, weights_only=False)
        raise StopRequested(self.signals.signum, step, path)
