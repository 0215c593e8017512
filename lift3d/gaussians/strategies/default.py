"""Adaptive density control of 3DGS (``densify-3dgs``, gsplat's ``DefaultStrategy``): clone, split, prune, opacity reset.

Use: after each backward pass call ``update(render_out)`` (accumulates the image-space gradient of ``means2d``),
then ``step(model, optimizer, step, extent)``; ``after_backward`` does both. Gradients are measured as gsplat's
DefaultStrategy does: the pixel gradient times (width / 2, height / 2) times the number of views, averaged over the
steps a Gaussian was visible. The parameter surgery (and the optimizer state with it) is ``lift3d.gaussians.ops``.

Under DDP (several processes, each rendering its own views) every rank must make the same decisions on
the same parameters: the statistics are summed over the ranks before each refine step, and splits draw
their offsets from a generator that depends only on the step, never from a rank's global RNG.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from lift3d.config import ConfigError, bounded, step_count
from lift3d.distributed import all_reduce_sum_, exclusive_offset, kth_largest, world_size
from lift3d.gaussians.model import GaussianModel
from lift3d.gaussians.ops import duplicate, remove, reset_opacities, split_gaussians
from lift3d.gaussians.strategies.base import Strategy
from lift3d.registry import register
from lift3d.rng import step_generator

log = logging.getLogger("lift3d.gaussians.strategies.default")
SPLIT_STREAM = 41  # the random stream of split offsets: the same on every DDP rank at a given step


@dataclass
class DefaultConfig:
    """When and how Gaussians are added and removed; defaults are those of 3DGS."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"prune_opacity": "min_opacity"}

    refine_start: int = step_count(500)  # first step (exclusive) at which Gaussians are grown and pruned
    refine_stop: int = step_count(15000)  # no growing, pruning or opacity reset from this step on
    refine_every: int = step_count(100, low=1)  # grow and prune every N steps
    grow_grad2d: float = bounded(0.0002, low=0)  # grow Gaussians whose mean normalized image-space gradient exceeds this
    # ... by cloning when their largest scale is <= this x scene extent, else splitting
    grow_scale3d: float = bounded(0.01, low=0)
    split_into: int = bounded(2, low=2)  # a split Gaussian becomes this many, sampled from itself
    split_shrink: float = bounded(1.6, above=0)  # ... with scales divided by this
    min_opacity: float = bounded(0.005, low=0, high=1)  # remove Gaussians less opaque than this
    prune_scale3d: float = bounded(0.1, above=0)  # after the first opacity reset, remove Gaussians larger than this x extent
    reset_every: int = step_count(3000)  # set every opacity to at most reset_opacity every N steps (0: never)
    reset_opacity: float = bounded(0.01, above=0, high=1)  # the opacity cap of a reset (3DGS: 2 x min_opacity)
    max_gaussians: int = bounded(0, low=0)  # stop growing at this many Gaussians (0: no cap)
    absgrad: bool = False  # grow by the absolute image-space gradient (AbsGS, gsplat's absgrad; turns on renderer.absgrad)
    grow_grad2d_abs: float = bounded(0.0008, low=0)  # ... whose threshold replaces grow_grad2d (gsplat's examples)


@register("densify-3dgs")
class DefaultStrategy(Strategy):
    """The 3DGS densification schedule with its running statistics (saved in checkpoints)."""

    Config = DefaultConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.grad2d: Tensor | None = None  # [N] sum of normalized gradient norms while visible
        self.count: Tensor | None = None  # [N] number of views each Gaussian was visible in

    # ----------------------------------------------------------------------------------- statistics
    @property
    def needs_absgrad(self) -> bool:
        return self.cfg.absgrad

    def active(self, step: int) -> bool:
        """Until ``refine_stop``: no statistics, growing, pruning or resets after it."""
        return step < self.cfg.refine_stop

    def captures_statistics(self, step: int) -> bool:
        """While active, from the render's own gradient (absolute gradients are not captured)."""
        return not self.cfg.absgrad and self.active(step)

    def prepare_stats(self, n: int, device: torch.device) -> tuple[Tensor, ...]:
        """Allocate the statistics for ``n`` Gaussians now (zeros) unless they exist: a CUDA graph that accumulates
        them in place needs their memory before it is captured. Returns (grad2d, count)."""
        if self.grad2d is None or len(self.grad2d) != n or self.grad2d.device != device:
            self.grad2d = torch.zeros(n, device=device)
            self.count = torch.zeros(n, device=device)
        return self.grad2d, self.count

    @torch.no_grad()
    def update(self, out: dict[str, Tensor]) -> None:
        """Accumulate statistics from a render whose loss has been backpropagated (no host sync)."""
        means2d = out["means2d"]
        if self.cfg.absgrad:  # set by the rasterizer's backward when renderer.absgrad is on
            grad = out.get("means2d_absgrad", getattr(means2d, "absgrad", None))
            if grad is None and means2d.grad is not None:
                raise ConfigError("system.densify.absgrad needs the rasterizer's absolute gradients: "
                                  "set system.renderer.absgrad=true")
        else:
            grad = out.get("means2d_grad", means2d.grad)  # a replayed step hands its gradient beside the render
        if grad is None:
            return
        B, H, W = out["rgb"].shape[:3]
        gx, gy = grad.unbind(-1)
        norm = torch.hypot(gx * (W / 2.0 * B), gy * (H / 2.0 * B))  # python scalars: no host-device copy
        visible = (out["radii"] > 0).all(dim=-1)  # [B, N]
        n = means2d.shape[1]
        if self.grad2d is None or len(self.grad2d) != n or self.grad2d.device != means2d.device:
            self.grad2d = torch.zeros(n, device=means2d.device)
            self.count = torch.zeros(n, device=means2d.device)
        self.grad2d += (norm * visible).sum(0)
        self.count += visible.sum(0)

    # ----------------------------------------------------------------------------------- schedule
    def after_backward(self, out: dict[str, Tensor] | None, model: GaussianModel, optimizer: torch.optim.Optimizer | None,
                       step: int, extent: float) -> dict[str, int]:
        """One training step's densification: accumulate the statistics of ``out`` (the step's render, its loss
        backpropagated; None: nothing rendered) while refining is on, then grow/prune/reset on schedule."""
        if out is None or not self.active(step):
            return {}
        self.update(out)
        return self.step(model, optimizer, step, extent)

    @torch.no_grad()
    def step(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, step: int, extent: float) -> dict[str, int]:
        """Grow/prune on refine steps, reset opacities on reset steps; returns what changed."""
        c, report = self.cfg, {}
        if step >= c.refine_stop:
            return report
        if step > c.refine_start and step % c.refine_every == 0 and world_size() > 1:
            if self.sharded:  # its own Gaussians' statistics (zeros if none rendered): every rank refines together
                self.prepare_stats(len(model), model.means.device)
            else:
                self.sum_across_ranks(len(model), model.means.device)
        if step > c.refine_start and step % c.refine_every == 0 and self.grad2d is not None:
            report.update(self.grow(model, optimizer, extent, step))
            report["pruned"] = self.prune(model, optimizer, step, extent)
            self.grad2d = self.count = None
            log.debug("step %d: %s, now %d Gaussians", step, report, len(model))
        if c.reset_every > 0 and step > 0 and step % c.reset_every == 0:
            reset_opacities(model, optimizer, c.reset_opacity)
            report["reset"] = 1
        return report

    def sum_across_ranks(self, n: int, device: torch.device) -> None:
        """DDP: replace this rank's statistics by their sums over all ranks (a rank that saw no render this
        round contributes zeros), so every rank grows and prunes the same Gaussians."""
        if self.grad2d is None or len(self.grad2d) != n:
            self.grad2d, self.count = torch.zeros(n, device=device), torch.zeros(n, device=device)
        all_reduce_sum_([self.grad2d, self.count])

    def grow(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, extent: float,
             step: int = 0) -> dict[str, int]:
        """Clone the small Gaussians whose mean gradient is high and split the large ones (up to ``max_gaussians``)."""
        c = self.cfg
        grads = self.grad2d / self.count.clamp_min(1)
        high = grads > (c.grow_grad2d_abs if c.absgrad else c.grow_grad2d)
        if c.max_gaussians > 0:  # grow only the strongest gradients when the cap is near
            total = exclusive_offset(len(model))[1] if self.sharded else len(model)
            room = max(c.max_gaussians - total, 0) // max(c.split_into - 1, 1)
            if self.sharded:  # the strongest of every shard's: at least the room-th largest gradient of all ranks
                high &= grads >= kth_largest(grads[high], room)
            elif int(high.sum()) > room:
                keep = torch.topk(grads, room).indices
                high = torch.zeros_like(high)
                high[keep] = True
        small = model.scales.max(dim=-1).values <= c.grow_scale3d * extent
        cloned, split = high & small, high & ~small
        n_clone = int(cloned.sum())
        if n_clone:
            duplicate(model, optimizer, cloned)
            split = torch.cat([split, split.new_zeros(n_clone)])  # clones are not split this round
        n_split = int(split.sum())
        draws = exclusive_offset(n_split) if self.sharded else None  # this shard's place among all ranks' splits
        if n_split:
            split_gaussians(model, optimizer, split, c.split_into, c.split_shrink, step_generator(0, step, SPLIT_STREAM),
                            draws)
        return {"cloned": n_clone, "split": n_split}

    def prune(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, step: int, extent: float) -> int:
        """Remove the nearly transparent Gaussians and, after the first opacity reset, the very large ones."""
        c = self.cfg
        remove_mask = model.opacities < c.min_opacity
        if c.reset_every > 0 and step > c.reset_every:
            remove_mask |= model.scales.max(dim=-1).values > c.prune_scale3d * extent
        n = int(remove_mask.sum())
        if n:
            remove(model, optimizer, remove_mask)
        return n

    # ----------------------------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """The statistics since the last refine step; under DDP their sums over the ranks (every rank builds
        the checkpoint, rank 0 writes it)."""
        grad2d, count = self.grad2d, self.count
        if world_size() > 1 and grad2d is not None and not self.sharded:
            grad2d, count = grad2d.clone(), count.clone()
            all_reduce_sum_([grad2d, count])
        return {"grad2d": grad2d, "count": count}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Under DDP rank 0 resumes with the saved sums and the other ranks with zeros, so the next refine step's
        sum over the ranks is what it would have been without the interruption."""
        self.grad2d, self.count = state.get("grad2d"), state.get("count")
        if world_size() > 1 and self.grad2d is not None and torch.distributed.get_rank() > 0 and not self.sharded:
            self.grad2d, self.count = torch.zeros_like(self.grad2d), torch.zeros_like(self.count)
