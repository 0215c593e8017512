"""2D Gaussian surfels (2DGS) as a Gaussian model: the same parameters and file layout, the third scale kept flat.

The surfel rasterizer reads only the first two scales (a disk's axes); the third is held at ``flat_ratio`` times the
smaller of them (set again every training step, as densification and the optimizer move the others), so files written
from a surfel run (3DGS .ply, .splat, ...) hold flat disks that splat viewers show as such. Surfels start with random
orientations (an identity rotation would turn every disk to face +z).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.config import bounded
from lift3d.gaussians.model import GaussianModel, GaussianModelConfig
from lift3d.registry import register
from lift3d.rotations import matrix_to_quaternion


@dataclass
class SurfelModelConfig(GaussianModelConfig):
    """The Gaussian model's options, and how flat the surfels' third scale is."""

    # the third scale as a share of the smaller of the other two (files written keep disks flat)
    flat_ratio: float = bounded(0.001, above=0, high=1)


def random_rotations(n: int, generator: torch.Generator | None = None) -> Tensor:
    """[n, 4] wxyz unit quaternions drawn uniformly over rotations (normalized 4D Gaussians)."""
    q = torch.randn(n, 4, generator=generator)
    return q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def rotations_facing(normals: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """[n, 4] wxyz unit quaternions whose rotation's third column (a surfel's normal) is ``normals`` [n, 3], turned
    at random about it."""
    n = torch.nn.functional.normalize(normals.float(), dim=-1)
    seed = torch.randn(len(n), 3, generator=generator)
    tangent = torch.linalg.cross(n, seed, dim=-1)
    fallback = torch.linalg.cross(n, torch.tensor([1.0, 0.0, 0.0]).expand_as(n), dim=-1)  # a draw along n
    tangent = torch.where(tangent.norm(dim=-1, keepdim=True) > 1e-6, tangent, fallback)
    tangent = torch.nn.functional.normalize(tangent, dim=-1)
    return matrix_to_quaternion(torch.stack([tangent, torch.linalg.cross(n, tangent, dim=-1), n], dim=-1))


@register("surfels")
class SurfelModel(GaussianModel):
    """N surfels: ``GaussianModel`` whose third scale is flat and whose rotations start random."""

    Config = SurfelModelConfig

    @torch.no_grad()
    def flatten_(self) -> None:
        """Set every third log-scale to log(flat_ratio x the smaller of the other two) (in place: no optimizer state
        changes; the rasterizer gives that scale no gradient)."""
        if len(self):
            self.log_scales[:, 2] = self.log_scales[:, :2].min(dim=-1).values + math.log(self.cfg.flat_ratio)

    def update_step(self, epoch: int, global_step: int) -> None:
        super().update_step(epoch, global_step)
        self.flatten_()

    @torch.no_grad()
    def initialize(self, points: Tensor, colors: Tensor | None = None, generator: torch.Generator | None = None,
                   normals: Tensor | None = None) -> None:
        """Surfels at ``points`` with nearest-neighbor sizes and the configured opacity, facing ``normals`` [N, 3]
        when given (points on a surface), else turned at random."""
        super().initialize(points, colors, generator)
        quats = random_rotations(len(self), generator) if normals is None else rotations_facing(normals, generator)
        self.quats.copy_(quats.to(self.quats))
        self.flatten_()

    def load_gaussian_file(self, path: Any) -> int:
        degree = super().load_gaussian_file(path)
        self.flatten_()
        return degree
