"""DMTet geometry: a deformable tetrahedral grid with a signed distance per vertex, turned into a
triangle mesh by marching tetrahedra at every step (Shen et al. 2021; Magic3D's refinement stage).

The grid is made by ``tetgrid`` at ``grid_resolution`` cubes per axis. Color comes from an optional
texture field (any registered part whose ``forward(points [N, 3]) -> [N, C]``), queried at surface
points by the renderer's ``color_fn``. A previous NeRF stage converts in through
``initialize_from_density`` (the isosurface threshold carried over).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.meshes.marching_tets import marching_tets
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.regularizers import sdf_sign_flip
from lift3d.meshes.tetgrid import grid_edges, tet_grid
from lift3d.registry import find, register


@dataclass
class DMTetConfig:
    grid_resolution: int = bounded(64, low=1)  # cubes per grid axis: (N+1)^3 vertices, 6 N^3 tets (64: ~275k vertices, 1.6M tets)
    radius: float = bounded(1.0, above=0)  # the grid spans [-radius, radius]^3 (match the previous stage's bounding box)
    deformable: bool = True  # learn a per-vertex offset of the grid
    deformation_scale: float = bounded(0.5, low=0)  # largest offset, in grid cells (tanh-bounded; < 0.5 keeps tets from folding)
    # initial SDF: sphere (radius shape_init_radius) or none (all outside; set it later)
    shape_init: str = choice("sphere", "none")
    shape_init_radius: float = bounded(0.5, above=0)  # radius of the initial sphere
    fix_geometry: bool = False  # freeze SDF and deformation (texture-only stages); the mesh is then cached
    texture_type: str = ""  # registered texture field, forward(points [N, 3]) -> features [N, C]; empty: none
    texture: dict = field(default_factory=dict)  # the texture field's config


@register("dmtet")
class DMTetGeometry(BaseModule):
    """Per-vertex SDF [V] and deformation [V, 3] on a generated tet grid; ``forward()`` gives the mesh."""

    Config = DMTetConfig

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        vertices, tets = tet_grid(cfg.grid_resolution, cfg.radius)
        self.register_buffer("grid_vertices", vertices, persistent=False)  # regenerated from the config
        self.register_buffer("tets", tets, persistent=False)
        self.sdf = nn.Parameter(torch.full((vertices.shape[0],), 1.0))
        self.deformation = nn.Parameter(torch.zeros_like(vertices), requires_grad=cfg.deformable and not cfg.fix_geometry)
        if cfg.fix_geometry:
            self.sdf.requires_grad_(False)
        if cfg.shape_init == "sphere":
            self.initialize_from_sdf(lambda p: p.norm(dim=-1) - cfg.shape_init_radius)
        self.texture = find(cfg.texture_type)(cfg.texture) if cfg.texture_type else None
        self._edges: Tensor | None = None
        self._cached: Mesh | None = None

    @property
    def cell_size(self) -> float:
        return 2.0 * self.cfg.radius / self.cfg.grid_resolution

    def grid_edges(self) -> Tensor:
        """Unique edges [E, 2] of the tet grid (cached)."""
        if self._edges is None or self._edges.device != self.sdf.device:
            self._edges = grid_edges(self.cfg.grid_resolution, self.sdf.device)
        return self._edges

    def deformed_vertices(self) -> Tensor:
        """Grid vertex positions [V, 3] after the bounded learned offsets."""
        if not self.cfg.deformable:
            return self.grid_vertices
        return self.grid_vertices + self.cfg.deformation_scale * self.cell_size * torch.tanh(self.deformation)

    def isosurface(self) -> Mesh:
        """The triangle mesh of the SDF's zero level set (differentiable in SDF and deformation)."""
        if self.cfg.fix_geometry and self._cached is not None and self._cached.vertices.device == self.sdf.device:
            return self._cached
        vertices, faces = marching_tets(self.deformed_vertices(), self.sdf, self.tets)
        if faces.shape[0] == 0:
            raise RuntimeError(
                "dmtet: the SDF has no zero crossing on the grid, so the mesh is empty; initialize it "
                "(shape_init: sphere, or initialize_from_density from a NeRF stage) or lower the SDF regularizers"
            )
        mesh = Mesh(vertices, faces)
        if self.cfg.fix_geometry:
            self._cached = Mesh(vertices.detach(), faces)
            mesh = self._cached
        return mesh

    def forward(self) -> Mesh:
        return self.isosurface()

    def color(self, points: Tensor) -> Tensor:
        """Texture features [N, C] at surface ``points`` [N, 3] (the texture field hook)."""
        if self.texture is None:
            raise RuntimeError("dmtet has no texture field: set texture_type (a registered field) in its config")
        return self.texture(points)

    def sdf_regularizer(self) -> Tensor:
        """Sign-flip penalty on grid edges that cross the surface (a scalar)."""
        return sdf_sign_flip(self.sdf, self.grid_edges())

    @torch.no_grad()
    def sample_grid(self, fn: Callable[[Tensor], Tensor], chunk_size: int = 262144) -> Tensor:
        """``fn(points [N, 3]) -> [N]`` at the undeformed ``grid_vertices``, in chunks: [V] float32 on the grid's device."""
        points = self.grid_vertices
        return torch.cat([fn(p).reshape(-1).float().to(points.device) for p in points.split(chunk_size)])

    @torch.no_grad()
    def initialize_from_sdf(self, sdf_fn: Callable[[Tensor], Tensor], chunk_size: int = 262144) -> None:
        """Set the SDF from ``sdf_fn(points [N, 3]) -> [N]`` (negative inside) at the undeformed grid."""
        self.sdf.copy_(self.sample_grid(sdf_fn, chunk_size).to(self.sdf))
        self.deformation.zero_()
        self._cached = None

    @torch.no_grad()
    def initialize_from_density(self, density_fn: Callable[[Tensor], Tensor], threshold: float, chunk_size: int = 262144) -> None:
        """Convert a density field (e.g. a NeRF stage's ``density(points [N, 3]) -> [N]``): the surface is
        where the density equals ``threshold`` (see ``initialize_from_grid_density``)."""
        self.initialize_from_grid_density(self.sample_grid(density_fn, chunk_size), threshold)

    @property
    def grid_shape(self) -> tuple[int, int, int]:
        """(N+1, N+1, N+1): ``grid_vertices`` reshaped to this is a regular grid indexed [x, y, z]."""
        n = self.cfg.grid_resolution + 1
        return (n, n, n)

    @torch.no_grad()
    def initialize_from_grid_density(self, density: Tensor, threshold: float) -> None:
        """Set the SDF from a density sampled at ``grid_vertices`` ([V], or [N+1, N+1, N+1]): the surface is
        where it equals ``threshold``. The SDF is ``threshold - density`` divided by the median gradient
        magnitude at the surface, so it reads as a distance there; the zero crossings stay exact."""
        points = self.grid_vertices
        if density.numel() != points.shape[0]:
            raise ValueError(f"dmtet.initialize_from_grid_density: got {density.numel()} densities "
                             f"for {points.shape[0]} grid vertices")
        values = float(threshold) - density.reshape(-1).float().to(points)
        if not bool(torch.isfinite(values).all()):
            raise ValueError("dmtet.initialize_from_density: the density field returned non-finite values on the grid")
        edges = self.grid_edges()
        a, b = values[edges[:, 0]], values[edges[:, 1]]
        crossing = (a < 0) != (b < 0)
        if not bool(crossing.any()):
            raise ValueError(
                f"dmtet.initialize_from_density: the density never crosses the threshold {threshold} inside the grid "
                f"[-{self.cfg.radius}, {self.cfg.radius}]^3; check the threshold and the grid radius"
            )
        # gradient magnitude by central differences on the (undeformed, regular) grid, at the surface
        gradient = torch.gradient(values.view(self.grid_shape), spacing=self.cell_size)
        slope_at = torch.stack(gradient, dim=-1).reshape(-1, 3).norm(dim=-1)
        slope = slope_at[edges[crossing].reshape(-1)].median().clamp_min(1e-12)
        self.sdf.copy_(values / slope)
        self.deformation.zero_()
        self._cached = None
