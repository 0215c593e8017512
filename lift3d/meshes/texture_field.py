"""A texture field for mesh geometries: a hash grid and a small MLP from world points to material
features (Magic3D's and ProlificDreamer's mesh stages color the surface this way, not with a UV image).

Features are pre-activation, as a NeRF field's are: the material turns them into color (e.g.
``sigmoid(features[:, :3])``), so a mesh stage can share the materials of the NeRF stage before it.
``fit_texture`` regresses the field onto colors given at points (a previous stage's albedo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded
from lift3d.fields.encodings import HashGrid, HashGridConfig
from lift3d.fields.mlp import MLP
from lift3d.progress import Stage
from lift3d.registry import register


@dataclass
class HashGridTextureConfig:
    """Features over the cube [-radius, radius]^3."""

    radius: float = bounded(1.0, above=0)  # half side of the cube the hash grid covers, scene units (match the geometry's)
    n_output_dims: int = bounded(3, low=1)  # features handed to the material (3: albedo)
    encoding: HashGridConfig = field(default_factory=HashGridConfig)  # the multiresolution hash grid
    hidden_dim: int = bounded(64, low=1)  # width of the MLP
    n_hidden_layers: int = bounded(1, low=0)  # hidden layers of the MLP
    query_chunk: int = bounded(262144, low=1)  # points per chunk in ``features`` queries (bounds memory)


@register("hash-grid-texture")
class HashGridTexture(BaseModule):
    """Features [N, n_output_dims] at world points [N, 3] (the ``texture`` of dmtet and custom-mesh)."""

    Config = HashGridTextureConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.encoding = HashGrid(c.encoding)
        self.mlp = MLP(self.encoding.output_dim, c.n_output_dims, c.hidden_dim, c.n_hidden_layers)

    def update_step(self, epoch: int, global_step: int) -> None:
        self.encoding.set_step(global_step)

    def forward(self, points: Tensor) -> Tensor:
        """Features [N, C] at world ``points`` [N, 3] (points outside the cube read its border)."""
        unit = (points + self.cfg.radius) / (2.0 * self.cfg.radius)
        return self.mlp(self.encoding(unit))

    def features(self, points: Tensor) -> Tensor:
        """``forward`` in chunks of ``query_chunk`` points."""
        parts = [self(p) for p in points.split(max(self.cfg.query_chunk, 1))]
        return torch.cat(parts) if parts else points.new_zeros(0, self.cfg.n_output_dims)


def fit_texture(
    features_fn: Callable[[Tensor], Tensor],
    params: list[Tensor],
    points: Tensor,
    targets: Tensor,
    steps: int = 200,
    lr: float = 0.01,
    batch_size: int = 65536,
    seed: int = 0,
) -> float:
    """Regress ``features_fn(points)`` onto ``targets`` [N, C] by Adam on ``params`` (mean squared error,
    random mini-batches drawn from a seeded generator); returns the last batch's loss."""
    if points.shape[0] == 0 or points.shape[0] != targets.shape[0]:
        raise ValueError(f"fit_texture needs matching non-empty points and targets, got {points.shape[0]} and {targets.shape[0]}")
    optimizer = torch.optim.Adam(params, lr=lr)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    loss = torch.zeros(())
    with torch.enable_grad(), Stage(f"texture: fitting the texture field to {points.shape[0]} surface colors", steps,
                                    "steps") as stage:
        for _ in range(steps):
            index = torch.randint(0, points.shape[0], (min(batch_size, points.shape[0]),), generator=generator).to(points.device)
            loss = (features_fn(points[index]) - targets[index]).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stage.advance()
    return float(loss.detach())


def surface_samples(vertices: Tensor, faces: Tensor, n: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` draws uniform by area on the triangles ``faces`` [F, 3] of ``vertices`` [V, 3] (seeded): the face [n]
    and the weights (u, v) [n, 1] each of the triangle's second and third corner, so other per-corner values
    (UVs, colors) can be interpolated at the same points."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    tri = vertices.detach()[faces]  # [F, 3, 3]
    area = torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1).norm(dim=-1)
    if faces.shape[0] == 0 or float(area.sum()) <= 0:
        raise ValueError("sample_surface needs a mesh with non-zero area")
    face = torch.multinomial(area.cpu().double(), n, replacement=True, generator=generator).to(vertices.device)
    u, v = torch.rand(2, n, 1, generator=generator).to(vertices)
    flip = (u + v) > 1  # fold the unit square onto the triangle
    return face, torch.where(flip, 1 - u, u), torch.where(flip, 1 - v, v)


def interpolate_corners(values: Tensor, face: Tensor, u: Tensor, v: Tensor) -> Tensor:
    """Per-corner ``values`` [F, 3, C] at the ``surface_samples`` draws: [n, C]."""
    t = values[face]
    return t[:, 0] + u * (t[:, 1] - t[:, 0]) + v * (t[:, 2] - t[:, 0])


def sample_surface(vertices: Tensor, faces: Tensor, n: int, seed: int = 0) -> Tensor:
    """``n`` points [n, 3] drawn uniformly by area on the triangles ``faces`` [F, 3] of ``vertices`` [V, 3]
    (seeded, so a converted stage starts the same every time)."""
    return interpolate_corners(vertices.detach()[faces], *surface_samples(vertices, faces, n, seed))
