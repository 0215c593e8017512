"""A triplane NeRF field: three axis-aligned feature planes, sampled bilinearly and decoded by a small MLP.

This is the representation LRM-style feed-forward models (TripoSR) predict: a point (x, y, z) in the cube
[-radius, radius]^3 reads plane 0 at (x, y), plane 1 at (x, z) and plane 2 at (y, z); the three feature
vectors are concatenated and the MLP gives one raw density and three color features. Density is
``activation(raw + density_bias) * density_scale``; a material (``emission``: sigmoid) turns the features into
color. The planes are a parameter, so the field can also be refined by score distillation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.fields.common import central_difference_normal
from lift3d.fields.mlp import ACTIVATIONS, activation
from lift3d.registry import register

DECODER_ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU}


@dataclass
class TriplaneFieldConfig:
    """A triplane of ``plane_channels`` x ``plane_size``^2 per plane and its decoder MLP (TripoSR's sizes by default)."""

    radius: float = bounded(0.87, above=0)  # half side of the cube the planes span, scene units (TripoSR: 0.87)
    plane_channels: int = bounded(40, low=1)  # feature channels per plane
    plane_size: int = bounded(64, low=1)  # plane resolution (pixels per side)
    n_neurons: int = bounded(64, low=1)  # width of the decoder MLP
    n_hidden_layers: int = bounded(9, low=1)  # hidden layers of the decoder MLP
    decoder_activation: str = choice("silu", among=tuple(DECODER_ACTIVATIONS))  # silu or relu
    density_activation: str = choice("trunc_exp", among=ACTIVATIONS)  # exp with bounded gradients (TripoSR: exp; same values)
    density_bias: float = -1.0  # added to the raw density before the activation
    # multiplies the activated density (TripoSR's densities read per scene unit at 1)
    density_scale: float = bounded(1.0, above=0)
    normal_type: str = choice("finite_difference")  # normals from central differences of the density
    finite_difference_eps: float = bounded(0.01, above=0)  # half step of the central differences, scene units
    query_chunk: int = bounded(262144, low=1)  # points per chunk in density()/features() queries (bounds memory)
    # while training (refinement), recompute the decoder's activations in the backward pass instead of keeping them:
    # a sample then keeps its plane features, not every layer's input (most of a refinement step's memory)
    checkpoint_decoder: bool = True


class TriplaneDecoder(nn.Module):
    """The decoder MLP, as ``layers`` (a Sequential of Linear and activation) so its weights keep TripoSR's names."""

    def __init__(self, in_channels: int, n_neurons: int, n_hidden_layers: int, activation_name: str) -> None:
        super().__init__()
        act = DECODER_ACTIVATIONS[activation_name]
        layers: list[nn.Module] = [nn.Linear(in_channels, n_neurons), act()]
        for _ in range(n_hidden_layers - 1):
            layers += [nn.Linear(n_neurons, n_neurons), act()]
        layers.append(nn.Linear(n_neurons, 4))  # raw density + 3 color features
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Plane features [N, in_channels] -> [N, 4]."""
        return self.layers(x)


def sample_triplane(planes: Tensor, unit: Tensor) -> Tensor:
    """Concatenated plane features [N, 3 * C] of ``planes`` [3, C, R, R] at points ``unit`` [N, 3] in [-1, 1]^3.

    Plane 0 is indexed by (x, y), plane 1 by (x, z), plane 2 by (y, z); the first coordinate runs along the
    plane's width (grid_sample's convention), outside the planes reads zeros."""
    coords = torch.stack((unit[:, [0, 1]], unit[:, [0, 2]], unit[:, [1, 2]]), dim=0)  # [3, N, 2]
    sampled = F.grid_sample(planes, coords[:, None].to(planes.dtype), mode="bilinear", align_corners=False)  # [3, C, 1, N]
    return sampled[:, :, 0].permute(2, 0, 1).reshape(unit.shape[0], 3 * planes.shape[1])  # (no -1: N may be 0)


@register("triplane-nerf")
class TriplaneField(BaseModule):
    """Density [N] and features [N, 3] at world points [N, 3] from a triplane and its decoder."""

    Config = TriplaneFieldConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.triplane = nn.Parameter(torch.zeros(3, c.plane_channels, c.plane_size, c.plane_size))
        self.decoder = TriplaneDecoder(3 * c.plane_channels, c.n_neurons, c.n_hidden_layers, c.decoder_activation)
        self.register_buffer("bbox", torch.tensor([[-c.radius] * 3, [c.radius] * 3]), persistent=False)

    @property
    def contraction(self) -> str:
        """Nothing outside the cube (the planes cover it only)."""
        return "none"

    def raw(self, points: Tensor) -> tuple[Tensor, Tensor]:
        """Pre-activation density [N] (bias included) and features [N, 3] at world ``points`` [N, 3]."""
        unit = points / self.cfg.radius
        features = sample_triplane(self.triplane, unit).to(self.triplane.dtype)
        if self.cfg.checkpoint_decoder and torch.is_grad_enabled() and features.requires_grad:
            h = checkpoint(self.decoder, features, use_reentrant=False)
        else:
            h = self.decoder(features)
        return h[:, 0].float() + self.cfg.density_bias, h[:, 1:].float()

    def _density(self, raw_density: Tensor) -> Tensor:
        return activation(self.cfg.density_activation, raw_density) * self.cfg.density_scale

    def forward(self, points: Tensor, with_normal: bool = False, encoding: Tensor | None = None) -> dict[str, Tensor]:
        """{"density": [N], "features": [N, 3], "normal": [N, 3] if with_normal} at world ``points`` [N, 3]."""
        raw_density, features = self.raw(points)
        out = {"density": self._density(raw_density), "features": features}
        if with_normal:
            out["normal"] = self.finite_difference_normal(points)
        return out

    def finite_difference_normal(self, points: Tensor) -> Tensor:
        """Unit normals [N, 3] = -grad(raw density) by central differences."""
        return central_difference_normal(lambda p: self.raw(p)[0], points, self.cfg.finite_difference_eps)

    def _in_chunks(self, points: Tensor, query: Any) -> Tensor:
        chunk = max(self.cfg.query_chunk, 1)
        if points.shape[0] <= chunk:
            return query(points)
        return torch.cat([query(points[start:start + chunk]) for start in range(0, points.shape[0], chunk)])

    def density(self, points: Tensor) -> Tensor:
        """Activated density [N] at world ``points`` [N, 3], in chunks (marching, isosurfaces, occupancy)."""
        return self._in_chunks(points, lambda p: self._density(self.raw(p)[0]))

    def features(self, points: Tensor) -> Tensor:
        """Color features [N, 3] at world ``points`` [N, 3], in chunks (the material's ``albedo`` makes color)."""
        return self._in_chunks(points, lambda p: self.raw(p)[1])
