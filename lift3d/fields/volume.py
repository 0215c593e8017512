"""The implicit volume field: hash grid + tiny MLP -> density and a feature vector at 3D points.

Density is ``activation(raw + density_bias + blob(x))`` (the optional "density blob" puts mass at the
center at the start of text-to-3D, as DreamFusion and Magic3D do). Features are raw MLP outputs that
a material turns into color. Normals point away from increasing density, from finite differences or
from the analytic gradient. ``density(points)`` is the chunked query mesh extraction uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.fields.common import central_difference_normal
from lift3d.fields.contraction import CONTRACTIONS, to_unit_cube
from lift3d.fields.encodings import HashGrid, HashGridConfig
from lift3d.fields.mlp import ACTIVATIONS, MLP, activation
from lift3d.registry import register


@dataclass
class ImplicitVolumeConfig:
    """Field over the cube [-radius, radius]^3 (and, contracted, the space around it)."""

    radius: float = bounded(1.0, above=0)  # half side of the cube the field (and its occupancy grid) covers, scene units
    # none (nothing outside the cube), cube or sphere: all space beyond it squeezed in (unbounded scenes)
    contraction: str = choice("none", among=CONTRACTIONS)
    encoding: HashGridConfig = field(default_factory=HashGridConfig)  # the multiresolution hash grid
    hidden_dim: int = bounded(64, low=1)  # width of the density MLP
    n_hidden_layers: int = bounded(1, low=0)  # hidden layers of the density MLP
    n_feature_dims: int = bounded(3, low=0)  # features handed to the material (3: albedo; 15: inputs of a radiance MLP)
    density_activation: str = choice("trunc_exp", among=ACTIVATIONS)  # softplus, exp, trunc_exp (exp with bounded gradient), relu
    density_bias: float = 0.0  # added to the raw density before the activation (e.g. -1 starts thinner)
    # none, gaussian (DreamFusion: blob_density * exp(-|x|^2 / (2 r^2))), linear (Magic3D)
    density_blob: str = choice("none", "gaussian", "linear")
    blob_density: float = 10.0  # peak raw-density bias of the blob at the center
    blob_radius: float = bounded(0.5, above=0)  # blob size r, scene units
    # finite_difference or analytic (autograd; finite differences in inference mode)
    normal_type: str = choice("finite_difference", "analytic")
    finite_difference_eps: float = bounded(0.01, above=0)  # half step of the central differences, scene units
    # points per chunk in density()/features() queries, bounds memory (-1: 262144 on CPU, 4194304 on CUDA, where
    # each piece costs kernel launches)
    query_chunk: int = bounded(-1, low=1, allowed=(-1,), example=262144)


@register("implicit-volume")
class ImplicitVolume(BaseModule):
    """Density [N] and features [N, n_feature_dims] at world points [N, 3]."""

    Config = ImplicitVolumeConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.encoding = HashGrid(c.encoding)
        self.mlp = MLP(self.encoding.output_dim, 1 + c.n_feature_dims, c.hidden_dim, c.n_hidden_layers)
        self.register_buffer("bbox", torch.tensor([[-c.radius] * 3, [c.radius] * 3]), persistent=False)

    def update_step(self, epoch: int, global_step: int) -> None:
        self.encoding.set_step(global_step)

    # ------------------------------------------------------------------------------------ evaluation
    @property
    def contraction(self) -> str:
        """How space outside the cube is represented: none, cube or sphere (see ``lift3d.fields.contraction``)."""
        return self.cfg.contraction

    def normalize(self, points: Tensor) -> Tensor:
        """World points [N, 3] -> unit-cube coordinates [N, 3] (contracted when the field is unbounded)."""
        return to_unit_cube(points, self.bbox, self.cfg.contraction)

    def _blob(self, points: Tensor) -> Tensor:
        c = self.cfg
        if c.density_blob == "none":
            return torch.zeros_like(points[..., 0])
        squared = (points * points).sum(-1)
        if c.density_blob == "gaussian":
            return c.blob_density * torch.exp(-squared / (2 * c.blob_radius**2))
        return c.blob_density * (1 - squared.sqrt() / c.blob_radius)

    def raw(self, points: Tensor, encoding: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Pre-activation density [N] (bias and blob included) and features [N, C] at world points (``encoding``:
        see ``forward``)."""
        raw_density, features, _ = self._evaluate(points, encoding)
        return raw_density, features

    def _evaluate(self, points: Tensor, encoding: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``raw`` and the hash-grid features it came from, before level masking (what ``encoding`` reuses)."""
        unmasked, encoded = self.encoding.lookup(self.normalize(points), encoding)
        h = self.mlp(encoded)
        raw_density = h[:, 0] + self.cfg.density_bias
        if self.cfg.density_blob != "none":
            raw_density = raw_density + self._blob(points)
        return raw_density, h[:, 1:], unmasked

    def forward(self, points: Tensor, with_normal: bool = False, encoding: Tensor | None = None) -> dict[str, Tensor]:
        """{"density": [N], "features": [N, C], "normal": [N, 3] if with_normal} at world ``points`` [N, 3].

        ``encoding``: ``density_and_encoding``'s second output at these points, since when the field has not
        changed; the hash grid reuses it where that gives the same values and gradients (see ``HashGrid.lookup``)."""
        if with_normal and self.cfg.normal_type == "analytic" and not torch.is_inference_mode_enabled():
            return self._forward_analytic(points)
        # a subclass may override raw(points) alone (the test fields do): it gets the old call without an encoding
        raw_density, features = self.raw(points) if encoding is None else self.raw(points, encoding)
        out = {"density": activation(self.cfg.density_activation, raw_density), "features": features}
        if with_normal:
            out["normal"] = self.finite_difference_normal(points)
        return out

    def _forward_analytic(self, points: Tensor) -> dict[str, Tensor]:
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            probe = points if points.requires_grad else points.detach().requires_grad_(True)
            raw_density, features = self.raw(probe)
            (gradient,) = torch.autograd.grad(raw_density.sum(), probe, create_graph=create_graph)
        out = {"density": activation(self.cfg.density_activation, raw_density), "features": features,
               "normal": F.normalize(-gradient, dim=-1)}
        return out if create_graph else {k: v.detach() for k, v in out.items()}

    def finite_difference_normal(self, points: Tensor) -> Tensor:
        """Unit normals [N, 3] = -grad(raw density) by central differences."""
        return central_difference_normal(lambda p: self.raw(p)[0], points, self.cfg.finite_difference_eps)

    # ------------------------------------------------------------------------------------ queries
    def _query_chunk(self, points: Tensor) -> int:
        """Points per piece of a query: ``query_chunk``, or by device when -1."""
        chunk = self.cfg.query_chunk
        if chunk < 0:
            chunk = 4194304 if points.device.type == "cuda" else 262144
        return max(chunk, 1)

    def _in_chunks(self, points: Tensor, query: Callable[[Tensor], Any]) -> Any:
        """``query`` (a tensor or a tuple of tensors, rows per point) over ``points`` in pieces of ``query_chunk`` (by
        device when -1), each piece written into outputs allocated after the first (one piece: as is), so the
        pieces are never held alongside their join (a large render keeps tens of millions of samples' features)."""
        chunk = self._query_chunk(points)
        if points.shape[0] <= chunk:
            return query(points)
        joined: list[Tensor] = []
        for start in range(0, points.shape[0], chunk):
            result = query(points[start:start + chunk])
            parts = result if isinstance(result, tuple) else (result,)
            if not joined:
                joined = [part.new_empty((points.shape[0],) + part.shape[1:]) for part in parts]
            for out, part in zip(joined, parts, strict=False):
                out[start:start + chunk] = part
        return tuple(joined) if isinstance(result, tuple) else joined[0]

    def density_and_encoding(self, points: Tensor) -> tuple[Tensor, Tensor]:
        """Activated density [N] and the hash-grid features [N, L * F] it came from, in chunks: the renderer's
        density-only pass keeps the features of the samples it keeps for ``forward(..., encoding=)``, which then
        skips the lookup."""

        def query(piece: Tensor) -> tuple[Tensor, Tensor]:
            raw_density, _, unmasked = self._evaluate(piece)
            return activation(self.cfg.density_activation, raw_density), unmasked

        return self._in_chunks(points, query)

    def density(self, points: Tensor) -> Tensor:
        """Activated density [N] at world ``points`` [N, 3], in chunks (marching, isosurfaces and occupancy)."""
        return self._in_chunks(points, lambda p: activation(self.cfg.density_activation, self.raw(p)[0]))

    def features(self, points: Tensor) -> Tensor:
        """Features [N, C] at world ``points`` [N, 3], in chunks (a material's ``albedo`` turns them into color)."""
        return self._in_chunks(points, lambda p: self.raw(p)[1])
