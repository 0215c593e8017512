"""3D Gaussians as learnable parameters with the standard activations and progressive SH degree.

Stored (pre-activation) parameters, the names the optimizer config and the PLY file use:
``means`` [N, 3], ``log_scales`` [N, 3] (scale = exp), ``quats`` [N, 4] (wxyz, normalized when
rendering), ``opacity_logits`` [N] (opacity = sigmoid), ``sh0`` [N, 1, 3] (DC) and ``shN`` [N, K-1, 3].
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice, step_count
from lift3d.gaussians.init import knn_scales
from lift3d.meshes.io import AXES
from lift3d.registry import register
from lift3d.sh import MAX_DEGREE, degree_of, num_bases, rgb_to_sh

log = logging.getLogger("lift3d.gaussians")

PARAMETER_NAMES = ("means", "log_scales", "quats", "opacity_logits", "sh0", "shN")


@dataclass
class GaussianModelConfig:
    """The Gaussian representation and how it starts.

    ``init=auto`` takes the scene's SfM points if any, else the visual hull when there are masks (its volume for 3D
    Gaussians, its surface for surfels), else random points.
    ``init_path`` is a PLY point cloud (init: points), a mesh file (init: mesh) or a Gaussian file (3DGS .ply, .splat,
    .spz, .sog, KHR_gaussian_splatting .glb; init: ply) whose Gaussians start the run.
    """

    sh_degree: int = bounded(3, low=0, high=MAX_DEGREE)  # highest spherical-harmonics degree (0..3)
    sh_degree_interval: int = step_count(1000)  # raise the active SH degree by one every N steps (0: highest from the start)
    # auto (SfM points, else the hull's volume (3DGS) or surface (surfels), else random), random, hull (inside the
    # masks' visual hull), hull_surface (on it, facing out), sfm, points, mesh, ply
    init: str = choice("auto", "random", "hull", "hull_surface", "sfm", "points", "mesh", "ply")
    init_points: int = bounded(100000, low=1)  # how many Gaussians to start with (random, hull, mesh)
    init_radius: float = bounded(0.0, low=0)  # radius of the ball random/hull points are drawn from (0: what all cameras see)
    init_path: str = ""  # the point cloud (init: points), mesh (init: mesh) or Gaussian file (init: ply) to start from
    # init: mesh: the file's up axis (+y for glTF and most OBJ exports), turned to world +z
    init_up_axis: str = choice("+y", among=AXES)
    init_opacity: float = bounded(0.1, above=0, below=1)  # starting opacity of every Gaussian
    init_scale: float = bounded(1.0, above=0)  # multiplier on the nearest-neighbor starting size
    init_color: list = bounded([], low=0, high=1, lengths=(0, 3))  # RGB in 0..1 for points without color (empty: random)


@register("gaussians")
class GaussianModel(BaseModule):
    """N anisotropic 3D Gaussians with SH colors; ``means``, ``quats``, ``scales``, ``opacities``, ``sh``
    are what the rasterizer reads (``lift3d.render.splats.renderer.SplatSource``)."""

    Config = GaussianModelConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.active_sh_degree = 0 if self.cfg.sh_degree_interval > 0 else self.cfg.sh_degree
        self.set_parameters(self.empty_parameters(0))

    # ----------------------------------------------------------------------------------- parameters
    def empty_parameters(self, n: int) -> dict[str, Tensor]:
        """Zero-filled parameters for ``n`` Gaussians (shapes only; used before loading a checkpoint)."""
        k = num_bases(self.cfg.sh_degree)
        return {"means": torch.zeros(n, 3), "log_scales": torch.zeros(n, 3), "quats": torch.zeros(n, 4),
                "opacity_logits": torch.zeros(n), "sh0": torch.zeros(n, 1, 3), "shN": torch.zeros(n, k - 1, 3)}

    def set_parameters(self, values: dict[str, Tensor]) -> None:
        """Replace every parameter (as new ``nn.Parameter``s; optimizers must be rebuilt or updated)."""
        missing = set(PARAMETER_NAMES) - set(values)
        if missing:
            raise KeyError(f"Gaussian parameters missing: {sorted(missing)}")
        counts = {len(values[name]) for name in PARAMETER_NAMES}
        if len(counts) != 1:
            raise ValueError(f"Gaussian parameters disagree on the number of Gaussians: {counts}")
        for name in PARAMETER_NAMES:
            setattr(self, name, nn.Parameter(values[name].detach().clone().float()))

    def parameters_dict(self) -> dict[str, nn.Parameter]:
        return {name: getattr(self, name) for name in PARAMETER_NAMES}

    def resize_to_state_dict(self, state_dict: dict[str, Tensor], prefix: str = "") -> None:
        """Give every parameter the shape it has in ``state_dict`` so ``load_state_dict`` fits (resume
        after densification changed the count)."""
        shapes = {name: state_dict[prefix + name].shape for name in PARAMETER_NAMES if prefix + name in state_dict}
        if not shapes:
            return
        device = self.means.device
        self.set_parameters({name: torch.zeros(shapes.get(name, getattr(self, name).shape), device=device)
                             for name in PARAMETER_NAMES})

    def __len__(self) -> int:
        return self.means.shape[0]

    # ----------------------------------------------------------------------------------- activations
    @property
    def scales(self) -> Tensor:
        return torch.exp(self.log_scales)

    @property
    def opacities(self) -> Tensor:
        return torch.sigmoid(self.opacity_logits)

    @property
    def sh(self) -> Tensor:
        """[N, (degree+1)^2, 3] SH coefficients, DC first."""
        return torch.cat([self.sh0, self.shN], dim=1)

    def update_step(self, epoch: int, global_step: int) -> None:
        interval = self.cfg.sh_degree_interval
        scheduled = self.cfg.sh_degree if interval <= 0 else min(self.cfg.sh_degree, global_step // interval)
        self.active_sh_degree = max(scheduled, self.loaded_sh_degree)

    loaded_sh_degree = 0  # Gaussians read from a trained file keep their bands from the first step

    @torch.no_grad()
    def load_gaussian_file(self, path: str | Path) -> int:
        """Every attribute of a Gaussian file (3DGS .ply as Inria / gsplat / nerfstudio write it, .splat, .spz, .sog,
        KHR_gaussian_splatting .glb) as this model's Gaussians, SH bands padded with zeros or cut to ``sh_degree``;
        returns the file's own SH degree."""
        from lift3d.gaussians.formats.files import load_gaussian_file
        from lift3d.gaussians.formats.ply import with_sh_degree

        params = load_gaussian_file(path)
        file_degree = degree_of(params["shN"].shape[1] + 1)
        self.set_parameters(with_sh_degree(params, self.cfg.sh_degree))
        self.loaded_sh_degree = min(file_degree, self.cfg.sh_degree)
        self.active_sh_degree = max(self.active_sh_degree, self.loaded_sh_degree)
        log.info("started from the %d Gaussians of %s (SH degree %d)", len(self), path, file_degree)
        return file_degree

    # ----------------------------------------------------------------------------------- initialization
    @torch.no_grad()
    def initialize(self, points: Tensor, colors: Tensor | None = None, generator: torch.Generator | None = None,
                   normals: Tensor | None = None) -> None:
        """Gaussians at ``points`` [N, 3] with ``colors`` [N, 3] (0..1), nearest-neighbor sizes, identity
        rotations and the configured opacity (``normals``, of surface points, are for flat models: round Gaussians
        have no facing)."""
        n = len(points)
        if colors is None:
            if self.cfg.init_color:
                colors = torch.tensor(self.cfg.init_color, dtype=torch.float32).expand(n, 3)
            else:
                colors = torch.rand(n, 3, generator=generator)
        values = self.empty_parameters(n)
        values["means"] = points.float()
        values["log_scales"] = torch.log(knn_scales(points) * self.cfg.init_scale)[:, None].expand(n, 3)
        values["quats"][:, 0] = 1.0
        opacity = self.cfg.init_opacity
        values["opacity_logits"] = torch.full((n,), math.log(opacity / (1 - opacity)))
        values["sh0"] = rgb_to_sh(colors.float())[:, None, :]
        self.set_parameters({k: v.to(self.means.device) for k, v in values.items()})
