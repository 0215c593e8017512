"""The interface of a densification strategy: the hooks a Gaussian system calls while it trains.

A strategy decides when Gaussians are added, moved and removed (the policy); the changes themselves go through
``lift3d.gaussians.ops``, which keeps the optimizer's state in step. As gsplat's ``strategy`` objects, a strategy
holds its running statistics and is called at fixed points of the training step:

1. when the system is built: ``needs_absgrad`` (the rasterizer then also sums absolute image-space gradients);
2. after each backward pass, the gradients already averaged over the DDP ranks: ``after_backward(out, model,
   optimizer, step, extent)``, which reads the step's render, refines on schedule (``step``) and returns what changed;
3. in a training step replayed as one CUDA graph (``lift3d.systems.graphed_splats``): ``edits_gradients`` (then
   the optimizer's update cannot be captured with the step), and where ``captures_statistics(step)``,
   ``prepare_stats`` before the capture and ``update`` inside it accumulate the statistics in place;
4. with every checkpoint: ``checkpoint_state`` / ``load_checkpoint_state`` (the system keeps a strategy out of its
   state dict and saves this instead).

Under DDP every rank holds the same Gaussians and must make the same decisions: a strategy sums its statistics over
the ranks before it reads them and draws from generators that depend only on the step (``lift3d.rng``). With sharded
Gaussians (``sharded``) each rank decides for its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lift3d.base import Configurable
from lift3d.gaussians.model import GaussianModel


class Strategy(Configurable):
    """Base of the densification strategies (``system.densify_type``); subclasses implement ``after_backward`` and
    ``step``, and override the other hooks where they differ from these defaults."""

    # each DDP rank holds a shard of the Gaussians (system.shard_gaussians): its statistics are its own Gaussians' (never
    # summed over the ranks), and draws over the Gaussians of all ranks are sliced to this rank's
    sharded = False

    @property
    def needs_absgrad(self) -> bool:
        """Whether the statistics read the absolute image-space gradients (AbsGS): the system turns on the
        rasterizer's ``absgrad`` then."""
        return False

    @property
    def edits_gradients(self) -> bool:
        """Whether ``after_backward`` adds to the parameters' gradients (e.g. regularizers): the optimizer must then
        step after it, not inside a captured training step."""
        return False

    def active(self, step: int) -> bool:
        """Whether ``after_backward`` at ``step`` reads the step's render (a system may skip keeping it otherwise)."""
        return True

    def after_backward(self, out: dict[str, Tensor] | None, model: GaussianModel, optimizer: torch.optim.Optimizer | None,
                       step: int, extent: float) -> dict[str, int]:
        """One training step after its backward pass: ``out`` is the step's render (``means2d``, ``radii``, ``rgb``, its
        loss backpropagated; None: nothing rendered), ``extent`` the scene's size. Returns what changed, by kind
        (e.g. ``{"cloned": 3, "pruned": 1}``; empty: nothing)."""
        raise NotImplementedError

    def step(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, step: int, extent: float) -> dict[str, int]:
        """The refinement of ``step`` (grow, prune, relocate, ... on the strategy's schedule) from the statistics
        gathered so far; returns what changed."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------- captured steps
    def captures_statistics(self, step: int) -> bool:
        """Whether a captured training step at ``step`` accumulates this strategy's statistics inside the graph
        (``prepare_stats`` then ``update``) instead of handing the render's gradient to ``after_backward``."""
        return False

    def prepare_stats(self, n: int, device: torch.device) -> tuple[Tensor, ...]:
        """Allocate the statistics for ``n`` Gaussians unless they exist and return them: a captured ``update`` writes
        into these tensors in place, so the graph is captured again when they change."""
        return ()

    def update(self, out: dict[str, Tensor]) -> None:
        """Accumulate the statistics of a render whose loss has been backpropagated, without a host sync
        (``means2d_grad`` beside the render: its gradient, where the render carries none)."""

    # ----------------------------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """What a resumed run needs to go on as if uninterrupted (none by default)."""
        return {}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore ``checkpoint_state``'s result."""
