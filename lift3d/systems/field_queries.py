"""Surface queries of a system that holds a density ``field``, a ``material`` and a volume ``renderer``: what
exporters and mesh stages ask of a NeRF (dreamfusion, prolificdreamer, reconstruct-nerf)."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.export import ExportSources, mesh_from_field
from lift3d.export.sources import field_content_points


class FieldQueries:
    """``density_at``, ``albedo_at`` and ``export_sources`` for systems with ``field``, ``material``, ``renderer``."""

    @torch.no_grad()
    def density_at(self, points: Tensor) -> Tensor:
        """Activated density [N] at world points [N, 3] (chunked)."""
        return self.field.density(points)

    @torch.no_grad()
    def albedo_at(self, points: Tensor) -> Tensor:
        """View- and light-independent color [N, 3] at world points [N, 3] (mesh textures, texture stages)."""
        return self.material.albedo(self.field.features(points))

    def export_sources(self) -> ExportSources:
        """A mesh of the density colored by the albedo (glb, obj, mesh-ply; the occupancy grid bounds it) and
        turntables of the renders (mp4, gif)."""
        cfg = self.cfg.export
        grid = self.renderer.occupancy
        occupancy = grid.occupied.reshape((grid.resolution,) * 3) if grid.cfg.enabled else None
        return ExportSources(
            mesh=lambda: mesh_from_field(self.density_at, self.field.bbox, cfg, color_fn=self.albedo_at,
                                         occupancy=occupancy, device=self.device),
            color_fn=self.albedo_at,
            render_fn=lambda cameras: self.render_views({"cameras": cameras}),
            content_points=field_content_points(self.density_at, self.field.bbox, cfg, occupancy, self.device),
            device=self.device,
        )
