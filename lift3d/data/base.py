"""Shared data-module pieces: a configurable LightningDataModule, per-step sampling, view collation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lift3d.base import Configurable
from lift3d.cameras import Cameras
from lift3d.data.summary import SceneSummary
from lift3d.rng import step_generator


class BaseDataModule(L.LightningDataModule, Configurable):
    """A LightningDataModule built from a ``Config`` dataclass; ``scene_summary()`` says what systems may know of it."""

    def __init__(self, cfg: Any = None) -> None:
        L.LightningDataModule.__init__(self)
        Configurable.__init__(self, cfg)

    def scene_summary(self) -> SceneSummary:
        """The facts of the training data a system reads (``lift3d.data.summary``); the runner hands them to the
        system before training. This base knows none."""
        return SceneSummary()

    @property
    def base_seed(self) -> int:
        """The run's seed for this rank (set by the runner through seed_everything)."""
        return torch.initial_seed() % (2**31)

    def start_step(self) -> int:
        """The global step training (re)starts from: sampling continues from there on resume."""
        trainer = self.trainer
        return int(trainer.global_step) if trainer is not None else 0

    def max_steps(self) -> int:
        trainer = self.trainer
        return int(trainer.max_steps) if trainer is not None and trainer.max_steps > 0 else 10**9


EPOCH_STEPS: int | None = None  # steps per Lightning epoch (None: the whole run is one epoch); tests make epochs short


class StepSampler(IterableDataset):
    """Yields ``sample(step, generator)`` for steps start..end-1; each batch depends only on its step.

    That makes sampling resumable (a resumed run sees the same batches) without saving sampler state. The
    steps form one stream across Lightning epochs: each new iterator continues where the last one stopped,
    so an epoch rollover never replays a step. ``len`` is the epoch length counted from step 0, which is
    what Lightning assumes when it restores a run mid-epoch (it counts the epoch's batches already done)."""

    def __init__(self, sample: Callable[[int, torch.Generator], dict[str, Any]], seed: int, start: int, end: int,
                 epoch_steps: int | None = None) -> None:
        self.sample, self.seed, self.start, self.end = sample, seed, start, end
        self.epoch_steps = epoch_steps if epoch_steps and epoch_steps > 0 else end
        self._next = start

    def __len__(self) -> int:
        return max(min(self.epoch_steps, self.end), 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self._next < self.end:
            step = self._next
            self._next += 1  # counted when handed out: a batch Lightning never asks for is never skipped
            yield self.sample(step, step_generator(self.seed, step))


def step_loader(sample: Callable[[int, torch.Generator], dict[str, Any]], seed: int, start: int, end: int,
                epoch_steps: int | None = None) -> DataLoader:
    """A loader over ``StepSampler`` that passes each (already batched) sample through unchanged; with CUDA
    its batches are pinned, so moving them to the GPU does not wait for the previous step to finish. It draws
    its iterator seeds from its own generator: starting an epoch never moves the run's global RNG, so a run
    resumed from a checkpoint at an epoch's end continues the same random stream."""
    sampler = StepSampler(sample, seed, start, end, epoch_steps if epoch_steps is not None else EPOCH_STEPS)
    return StepLoader(sampler, batch_size=None, num_workers=0, pin_memory=torch.cuda.is_available(),
                      generator=_own_generator(seed))


class StepLoader(DataLoader):
    """The training loader: resumable by construction (it starts at the restored global step), which it tells
    Lightning through ``state_dict`` / ``load_state_dict`` (else every resume warns of unreliable results)."""

    def state_dict(self) -> dict[str, int]:
        return {"next_step": int(self.dataset._next)}  # type: ignore[attr-defined]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass  # the data module built this loader from the restored global step already


def _own_generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def collate_views(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch single-view dicts: tensors stacked (their leading dim of 1 joined), Cameras concatenated."""
    batch: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], Cameras):
            batch[key] = Cameras.cat(values)
        elif torch.is_tensor(values[0]):
            batch[key] = torch.cat([v if v.ndim and v.shape[0] == 1 else v[None] for v in values])
        else:
            batch[key] = values[0] if all(v == values[0] for v in values) else values
    return batch


class ViewList(Dataset):
    """A map-style dataset of precomputed single-view dicts (evaluation views)."""

    def __init__(self, views: list[dict[str, Any]]) -> None:
        self.views = views

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.views[index]


def view_loader(views: list[dict[str, Any]], batch_size: int = 1) -> DataLoader:
    # its own generator: evaluation between training steps leaves the run's global RNG where it was
    return DataLoader(ViewList(views), batch_size=batch_size, shuffle=False, num_workers=0, collate_fn=collate_views,
                      generator=_own_generator(0))
