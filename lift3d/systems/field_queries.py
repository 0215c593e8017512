"""Surface queries of a system that holds a density ``field`` and a ``material``: what exporters and mesh
stages ask of a NeRF (dreamfusion, prolificdreamer, reconstruct-nerf)."""

from __future__ import annotations

import torch
from torch import Tensor


class FieldQueries:
    """``density_at`` and ``albedo_at`` for systems with ``self.field`` and ``self.material``."""

    @torch.no_grad()
    def density_at(self, points: Tensor) -> Tensor:
        """Activated density [N] at world points [N, 3] (chunked)."""
        return self.field.density(points)

    @torch.no_grad()
    def albedo_at(self, points: Tensor) -> Tensor:
        """View- and light-independent colour [N, 3] at world points [N, 3] (mesh textures, texture stages)."""
        return self.material.albedo(self.field.features(points))
