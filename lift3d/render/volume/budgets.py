"""The volume renderer's sample budgets and sample counters.

While training on CUDA the two marching passes ("first": density only, "second": the full field) compact their
samples into fixed budgets, so a step has no host sync and can be captured as a CUDA graph. The budgets are sized
from the samples per ray of earlier steps, read back asynchronously; the same counts, summed on the device, are what
benchmarks read to explain the renderer's cost.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

BUDGET_PASSES = ("first", "second")  # the passes that have budgets (other counts, e.g. "over_budget", are only summed)


class SampleBudgets:
    """Samples per ray seen by each pass, the budgets sized from them, and the training sample counters.

    ``cfg`` holds ``sample_budget`` (auto, always, never), ``budget_margin`` and ``max_train_samples``."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.per_ray: dict[str, float] = {}  # recent samples per ray of each pass, sizes the budgets
        self._readback: tuple[Tensor, Any] | None = None  # pinned host buffer and its event (CUDA)
        self._pending = False
        self._pending_names: list[str] = []
        self.sample_sums: tuple[list[str], Tensor] | None = None  # training samples of each pass since the last reset
        self.sample_rays = 0
        self._graph_counts: list[tuple[dict[str, Tensor], int]] | None = None  # counts of a step being captured
        self._replay_counts: list[tuple[dict[str, Tensor], int]] = []  # those of the last capture, rewritten by replays

    def active(self, device: torch.device, training: bool) -> bool:
        """Whether this render uses fixed budgets: training, and ``sample_budget`` always (or auto on CUDA)."""
        mode = self.cfg.sample_budget
        return training and (mode == "always" or (mode == "auto" and device.type == "cuda"))

    def budget_per_ray(self) -> dict[str, float]:
        """Samples a ray that each pass's budget allows: ``budget_margin`` times the most a ray of any chunk needed
        lately (a chunk's budget is this times its rays, rounded up to 4096, capped by ``max_train_samples``)."""
        return {name: per_ray * self.cfg.budget_margin for name, per_ray in self.per_ray.items()}

    def budget(self, name: str, n_rays: int, full_field_pass: str) -> int | None:
        """Slots for pass ``name`` over ``n_rays`` rays (None: no counts yet); ``max_train_samples`` caps the pass
        that evaluates the full field, ``full_field_pass``."""
        per_ray = self.budget_per_ray().get(name)
        if per_ray is None:
            return None
        budget = max(4096, math.ceil(per_ray * n_rays / 4096) * 4096)
        if name == full_field_pass and self.cfg.max_train_samples > 0:
            budget = min(budget, self.cfg.max_train_samples)
        return budget

    def observe(self, name: str, per_ray: float) -> None:
        """Take a pass's samples per ray: a rise at once, a fall only once it is below the margin's reach."""
        if name not in BUDGET_PASSES:
            return
        old = self.per_ray.get(name)
        if old is None or per_ray > old or per_ray * self.cfg.budget_margin < old:
            self.per_ray[name] = per_ray

    @property
    def capturing(self) -> bool:
        return self._graph_counts is not None

    def record(self, counts: dict[str, Tensor], n_rays: int) -> None:
        """Remember samples per ray: synchronously on CPU, through a pinned buffer and an event on CUDA (while a
        step is captured, kept for ``record_captured``: a graph cannot copy to the host)."""
        if self._graph_counts is not None:
            self._graph_counts.append((counts, n_rays))
            return
        names = sorted(counts)
        raw = torch.stack([counts[k].float() for k in names])
        if self.sample_sums is None or self.sample_sums[0] != names or self.sample_sums[1].device != raw.device:
            self.sample_sums = (names, torch.zeros_like(raw))
        self.sample_sums[1].add_(raw)  # on the device: counting costs no host sync
        self.sample_rays += n_rays
        values = raw / max(n_rays, 1)
        if values.device.type != "cuda":
            for name, value in zip(names, values.tolist(), strict=True):
                self.observe(name, value)
            return
        if self._readback is None or self._readback[0].numel() != len(names):
            self._readback = (torch.zeros(len(names), pin_memory=True), torch.cuda.Event())
        host, event = self._readback
        host.copy_(values, non_blocking=True)
        event.record()
        self._pending_names = names
        self._pending = True

    def refresh(self) -> None:
        """Take the counts of an earlier step whose asynchronous copy has finished."""
        if self._pending and self._readback is not None and self._readback[1].query():
            for name, value in zip(self._pending_names, self._readback[0].tolist(), strict=True):
                self.observe(name, value)
            self._pending = False

    def begin_capture(self) -> None:
        self._graph_counts = []

    def end_capture(self) -> list[tuple[dict[str, Tensor], int]]:
        self._replay_counts, self._graph_counts = self._graph_counts or [], None
        return self._replay_counts

    def record_captured(self) -> None:
        """Record the counts a replayed step wrote (the tensors of the last ``end_capture``)."""
        for values, n_rays in self._replay_counts:
            self.record(values, n_rays)

    def sample_counts(self) -> dict[str, float]:
        """Training rays and the samples of each pass since ``reset_sample_counts`` (reading them waits for the
        device)."""
        counts = {"rays": float(self.sample_rays)}
        if self.sample_sums is not None:
            counts.update(zip(self.sample_sums[0], self.sample_sums[1].tolist(), strict=True))
        return counts

    def reset_sample_counts(self) -> None:
        self.sample_sums, self.sample_rays = None, 0
