"""A binary occupancy grid over the field's box, kept current with an EMA of densities (Instant-NGP).

Each cell stores the opacity ``density * step_size`` seen at random points inside it, decayed by
``ema_decay`` at every update and raised to new evaluations; a cell is occupied when its value exceeds
``min(mean, threshold)``. Updates run every ``update_every`` steps on every cell during warm-up, then on
a random quarter of all cells plus as many occupied ones. All of it runs on the device without host syncs. Over a
contracted (unbounded) field the grid covers the contracted space, so its outer cells hold ever larger shells of the
world (``lift3d.fields.contraction``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import bounded, step_count
from lift3d.fields.contraction import check_contraction, from_unit_cube, to_unit_cube


@dataclass
class OccupancyGridConfig:
    """Empty-space skipping."""

    enabled: bool = True  # skip samples in empty cells (off: every step inside the box is evaluated)
    resolution: int = bounded(128, low=1, high=256)  # cells per axis
    update_every: int = step_count(16, low=1)  # training steps between updates
    warmup_steps: int = step_count(256)  # until this step every cell is re-evaluated at each update
    ema_decay: float = bounded(0.95, low=0, high=1)  # factor applied to a cell's stored opacity at each update
    # opacity (density * step size) above which a cell is occupied (or the mean, if lower)
    threshold: float = bounded(0.01, low=0)
    eval_chunk: int = bounded(262144, low=1)  # cells evaluated per field call during updates


def cell_coordinates(resolution: int, device: torch.device | None = None) -> Tensor:
    """Integer (i, j, k) [res^3, 3] of every cell, in the grid's flat order (i slowest)."""
    r = torch.arange(resolution, device=device)
    return torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)


class OccupancyGrid(nn.Module):
    """Which cells of the box (or of the contracted space around it) may hold density; ``occupied`` is a flat
    [res^3] bool buffer (i, j, k order)."""

    def __init__(self, cfg: OccupancyGridConfig, bbox: Tensor, contraction: str = "none") -> None:
        super().__init__()
        check_contraction(contraction)
        self.cfg, self.contraction = cfg, contraction
        n = cfg.resolution**3
        self.register_buffer("bbox", bbox.detach().clone().float())
        self.register_buffer("opacity", torch.zeros(n))
        self.register_buffer("occupied", torch.ones(n, dtype=torch.bool))  # conservative until the first update

    @property
    def resolution(self) -> int:
        return self.cfg.resolution

    def cell_index(self, points: Tensor) -> tuple[Tensor, Tensor]:
        """Flat cell index [N] of world ``points`` [N, 3] (clamped) and whether each point is inside the grid
        (always, when contracted)."""
        unit = to_unit_cube(points, self.bbox, self.contraction)
        inside = ((unit >= 0) & (unit <= 1)).all(dim=-1)
        r = self.cfg.resolution
        cell = (unit * r).long().clamp(0, r - 1)
        return (cell[..., 0] * r + cell[..., 1]) * r + cell[..., 2], inside

    def query(self, points: Tensor) -> Tensor:
        """True [N] where ``points`` [N, 3] lie inside the box in an occupied cell."""
        if not self.cfg.enabled:
            return self.cell_index(points)[1]
        index, inside = self.cell_index(points)
        return self.occupied[index] & inside

    def cell_points(self, index: Tensor, jitter: bool = True) -> Tensor:
        """World points [N, 3] inside cells ``index`` [N] (random in the cell, or at the center)."""
        r = self.cfg.resolution
        ijk = torch.stack([index // (r * r), (index // r) % r, index % r], dim=-1).float()
        offset = torch.rand_like(ijk) if jitter else torch.full_like(ijk, 0.5)
        return from_unit_cube((ijk + offset) / r, self.bbox, self.contraction)

    def should_update(self, step: int) -> bool:
        return self.cfg.enabled and step % max(self.cfg.update_every, 1) == 0

    @torch.no_grad()
    def update(self, density_fn: Callable[[Tensor], Tensor], step_size: float, step: int) -> None:
        """Re-evaluate cells with ``density_fn`` (world points [N, 3] -> density [N]) and re-threshold."""
        n = self.occupied.numel()
        device = self.occupied.device
        if step < self.cfg.warmup_steps:
            index = torch.arange(n, device=device)
        else:
            uniform = torch.randint(0, n, (n // 4,), device=device)
            # occupied cells, drawn without a host sync (the tiny floor keeps the distribution valid when none are)
            occupied = torch.multinomial(self.occupied.float() + 1e-6, n // 4, replacement=True)
            index = torch.cat([uniform, occupied])
        values = []
        for chunk in index.split(max(self.cfg.eval_chunk, 1)):
            values.append(density_fn(self.cell_points(chunk)).float() * step_size)
        new = torch.full((n,), -1.0, device=device).scatter_reduce_(0, index, torch.cat(values), reduce="amax")
        seen = new >= 0
        self.opacity.copy_(torch.where(seen, torch.maximum(self.opacity * self.cfg.ema_decay, new), self.opacity))
        threshold = torch.clamp(self.opacity.mean(), max=self.cfg.threshold)
        self.occupied.copy_(self.opacity > threshold)

    def mark_all(self, occupied: bool = True) -> None:
        """Set every cell occupied (or empty): a conservative grid for tests and for restarting."""
        self.occupied.fill_(occupied)

    def occupancy_fraction(self) -> Tensor:
        """Fraction of occupied cells (a device scalar)."""
        return self.occupied.float().mean()
