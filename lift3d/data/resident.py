"""Training data kept on the training device: the photos (or every pixel's ray), and the draws of each step made
ahead in blocks, so a step's batch is a few gathers there with no host-to-device copy per step.

``KeptPixels`` numbers the pixels a ray batch may draw (not padding, not ignored by a mask).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lift3d.data.scene import PosedScene
from lift3d.rng import step_generator


def fits_on_device(n_bytes: int, device: torch.device) -> bool:
    """Whether ``n_bytes`` of training data take at most a quarter of the device's memory (any size off CUDA)."""
    if device.type != "cuda":
        return True
    return n_bytes <= torch.cuda.get_device_properties(device).total_memory // 4


class DrawnAhead:
    """What the loader would draw for each step (``draw(step, generator)`` -> tensors, with the step's generator),
    drawn on the host for a block of steps at once and kept on the training device: the same draws as the host
    loader's, with one upload per block instead of a page-locked copy per step."""

    BLOCK = 512  # steps drawn and uploaded at once

    def __init__(self, draw: Any, seed: int, device: torch.device) -> None:
        self.draw, self.seed, self.device = draw, seed, device
        self._first = -1
        self._drawn: tuple[Tensor, ...] = ()

    def __call__(self, step: int) -> tuple[Tensor, ...]:
        """The draws of ``step`` on the device."""
        if not self._drawn or not self._first <= step < self._first + self.BLOCK:
            draws = [self.draw(s, step_generator(self.seed, s)) for s in range(step, step + self.BLOCK)]
            self._first = step
            self._drawn = tuple(torch.stack(parts).to(self.device) for parts in zip(*draws))
        return tuple(parts[step - self._first] for parts in self._drawn)


class ResidentImages:
    """The training photos and cameras on the training device, and the views of each step drawn ahead in blocks:
    a step's batch is then a few gathers on the device, with no host-to-device copy (or page-locking) per step,
    which on a GPU costs more host time than the step's kernels."""

    BLOCK = DrawnAhead.BLOCK

    COMPOSITE_BYTES = 1 << 30  # with a fixed background, photos up to this size as floats are composited once

    def __init__(self, scene: PosedScene, device: torch.device, pick: Any, seed: int,
                 composite: Any = None, background: Tensor | None = None) -> None:
        self.rgba = scene.rgba.to(device)
        self.keep = None if scene.keep is None else scene.keep.to(device)
        self.c2w = scene.cameras.c2w.to(device)
        self.intrinsics = scene.cameras.intrinsics.to(device)
        self.viewmats = scene.cameras.w2c_opencv().to(device)
        # (rgb, alpha) on the one training background, when it is fixed and they fit: no compositing per step
        self.composited: tuple[Tensor, Tensor] | None = None
        if composite is not None and background is not None and self.rgba.numel() * 4 <= self.COMPOSITE_BYTES:
            self.composited = composite(self.rgba, background.to(device))
        self.pick = DrawnAhead(pick, seed, device)


class ResidentRays:
    """Ray batches built on the training device: every training pixel's ray and color kept there, and the pixels
    of each step drawn ahead in blocks (``DrawnAhead``): a step's batch is a few gathers, with no host work or
    copy per step (on a GPU, the host's sampling, compositing and copying cost more than the NeRF step's kernels)."""

    def __init__(self, origins: Tensor, directions: Tensor, rgba: Tensor, device: torch.device, pick: Any,
                 seed: int) -> None:
        self.origins, self.directions = origins.to(device), directions.to(device)
        self.rgba = rgba.reshape(-1, 4).to(device)
        self.pick = DrawnAhead(pick, seed, device)

    BYTES_PER_PIXEL = 28  # a ray (origin and direction, float32) and its RGBA bytes


class KeptPixels:
    """The kept pixels of a padded or masked training set, numbered 0..len-1 in order, and ``flat(k)``: where the
    k-th lies among every stored pixel. Padding alone is arithmetic (each photo's own rows); ignore-masks need a
    table of the kept pixels (int32 where it fits: 4 bytes a kept pixel)."""

    def __init__(self, scene: PosedScene) -> None:
        assert scene.keep is not None
        n, self.height, self.width = scene.keep.shape
        sizes = scene.sizes if scene.sizes is not None else torch.tensor([[self.width, self.height]] * n)
        self.widths = sizes[:, 0].clone()
        counts = sizes[:, 0] * sizes[:, 1]
        padding_only = bool((scene.keep.reshape(n, -1).sum(1) == counts).all())  # every pixel of every photo kept
        self.ends = counts.cumsum(0)
        self.starts = self.ends - counts
        self.table: Tensor | None = None
        if not padding_only:
            table = scene.keep.reshape(-1).nonzero().squeeze(1)
            self.table = table.int() if scene.keep.numel() < 2**31 else table
        self.total = int(self.ends[-1]) if self.table is None else len(self.table)

    def __len__(self) -> int:
        return self.total

    def flat(self, k: Tensor) -> Tensor:
        """Flat indices into every stored pixel ([N * H * W]) of kept pixels ``k`` [R]."""
        if self.table is not None:
            return self.table[k].long()
        image = torch.searchsorted(self.ends, k, right=True)
        within = k - self.starts[image]
        width = self.widths[image]
        return (image * self.height + within // width) * self.width + within % width

