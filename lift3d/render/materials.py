"""Materials: how a field's features become color at a sample.

Every material is called as ``material(features [N, C], view_dirs [N, 3], normals [N, 3] | None,
positions [N, 3], light_positions [N, 3] | None, shading=None) -> rgb [N, 3]`` and offers
``albedo(features) -> [N, 3]`` (view- and light-independent color, for mesh textures).
``requires_normals`` tells the renderer whether it must compute normals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import ConfigError, bounded, choice, step_count
from lift3d.fields.mlp import ACTIVATIONS, MLP, activation
from lift3d.registry import register
from lift3d.rng import step_generator
from lift3d.sh import MAX_BASIS_DEGREE, num_bases, sh_bases

SHADING_MODES = ("albedo", "lambertian", "textureless")


def lambertian(albedo: Tensor, normals: Tensor, light_dirs: Tensor, ambient: Tensor, diffuse: Tensor) -> Tensor:
    """albedo * (ambient + diffuse * max(0, n . l)) with unit ``normals`` and ``light_dirs`` [N, 3]."""
    cosine = (normals * light_dirs).sum(-1, keepdim=True).clamp_min(0.0)
    return albedo * (ambient + diffuse * cosine)


@dataclass
class EmissionConfig:
    """Color is the features themselves."""

    n_input_dims: int = bounded(3, low=3)  # features used (the first three are the color)
    color_activation: str = choice("sigmoid", among=ACTIVATIONS)  # applied to the features: sigmoid or none


@register("emission")
class EmissionMaterial(BaseModule):
    """Unlit color: rgb = activation(features[:, :3])."""

    Config = EmissionConfig
    requires_normals = False

    def albedo(self, features: Tensor, view_dirs: Tensor | None = None) -> Tensor:
        return activation(self.cfg.color_activation, features[..., :3])

    def forward(self, features: Tensor, view_dirs: Tensor, normals: Tensor | None = None, positions: Tensor | None = None,
                light_positions: Tensor | None = None, shading: str | None = None) -> Tensor:
        return self.albedo(features)


@dataclass
class DiffuseConfig:
    """Albedo from features, lit by a point (or directional) light plus ambient; DreamFusion's random shading."""

    ambient_light_color: list = bounded([0.1, 0.1, 0.1], low=0, lengths=(3,))  # ambient RGB
    diffuse_light_color: list = bounded([0.9, 0.9, 0.9], low=0, lengths=(3,))  # light RGB
    # point (direction towards light_positions) or directional (light_positions is a direction)
    light_type: str = choice("point", "directional")
    albedo_probability: float = bounded(0.2, low=0, high=1)  # training: chance a step renders plain albedo
    # training: chance a step renders white albedo, lit (the rest: lambertian)
    textureless_probability: float = bounded(0.4, low=0, high=1)
    ambient_only_steps: int = step_count(0)  # training steps that render plain albedo before random shading starts
    # shading used outside training: albedo, lambertian or textureless
    eval_shading: str = choice("lambertian", among=SHADING_MODES)
    color_activation: str = choice("sigmoid", among=ACTIVATIONS)  # applied to features[:, :3] to give albedo
    default_light_position: list = bounded([10.0, 10.0, 10.0], lengths=(3,))  # used when a batch gives no light


@register("diffuse")
class DiffuseMaterial(BaseModule):
    """rgb = albedo * (ambient + diffuse * max(0, n . l)); shading mode drawn per training step."""

    Config = DiffuseConfig
    requires_normals = True

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.albedo_probability + c.textureless_probability > 1:
            raise ConfigError(f"system.material.albedo_probability + textureless_probability must be at most 1, got "
                              f"{c.albedo_probability} + {c.textureless_probability}: e.g. "
                              "system.material.albedo_probability=0.2 system.material.textureless_probability=0.4")
        self.register_buffer("ambient", torch.tensor(list(c.ambient_light_color), dtype=torch.float32), persistent=False)
        self.register_buffer("diffuse", torch.tensor(list(c.diffuse_light_color), dtype=torch.float32), persistent=False)
        self.register_buffer("default_light", torch.tensor(list(c.default_light_position), dtype=torch.float32), persistent=False)
        self.training_shading = "albedo"

    def update_step(self, epoch: int, global_step: int) -> None:
        """Draw this step's shading mode from (seed, step), so a resumed run draws the same ones."""
        self.training_shading = self.shading_for_step(global_step, torch.initial_seed() % (2**31))

    def shading_for_step(self, step: int, seed: int) -> str:
        c = self.cfg
        if step < c.ambient_only_steps:
            return "albedo"
        u = float(torch.rand((), generator=step_generator(seed, step, stream=17)))
        if u < c.albedo_probability:
            return "albedo"
        if u < c.albedo_probability + c.textureless_probability:
            return "textureless"
        return "lambertian"

    def albedo(self, features: Tensor, view_dirs: Tensor | None = None) -> Tensor:
        return activation(self.cfg.color_activation, features[..., :3])

    def forward(self, features: Tensor, view_dirs: Tensor, normals: Tensor | None = None, positions: Tensor | None = None,
                light_positions: Tensor | None = None, shading: str | None = None) -> Tensor:
        shading = shading or (self.training_shading if self.training else self.cfg.eval_shading)
        if shading not in SHADING_MODES:
            raise ValueError(f"unknown shading '{shading}'; use one of {', '.join(SHADING_MODES)}")
        albedo = self.albedo(features)
        if shading == "albedo":
            return albedo
        if normals is None or positions is None:
            raise ValueError("diffuse shading needs normals and positions (the renderer computes them when requires_normals)")
        light = self.default_light.expand_as(positions) if light_positions is None else light_positions
        light_dirs = F.normalize(light - positions if self.cfg.light_type == "point" else light, dim=-1)
        if shading == "textureless":
            albedo = torch.ones_like(albedo)
        return lambertian(albedo, normals, light_dirs, self.ambient, self.diffuse).clamp(0.0, 1.0)


@dataclass
class NormalShadingConfig:
    """Color shows the normal."""

    space: str = choice("world")  # world normals mapped (n + 1) / 2


@register("normal-shading")
class NormalShadingMaterial(BaseModule):
    """rgb = (n + 1) / 2: for inspecting geometry (and the textureless look of normal maps)."""

    Config = NormalShadingConfig
    requires_normals = True

    def albedo(self, features: Tensor, view_dirs: Tensor | None = None) -> Tensor:
        return torch.full_like(features[..., :3], 0.5)

    def forward(self, features: Tensor, view_dirs: Tensor, normals: Tensor | None = None, positions: Tensor | None = None,
                light_positions: Tensor | None = None, shading: str | None = None) -> Tensor:
        if normals is None:
            raise ValueError("normal-shading needs normals")
        return (normals + 1.0) * 0.5


@dataclass
class NeuralRadianceConfig:
    """View-dependent color: an MLP on features + spherical harmonics of the view direction (Instant-NGP)."""

    n_input_dims: int = bounded(15, low=0)  # feature dims taken from the field (the field's n_feature_dims)
    # highest spherical-harmonic degree of the view-direction encoding ((degree+1)**2 values)
    sh_degree: int = bounded(3, low=0, high=4)
    hidden_dim: int = bounded(64, low=1)  # MLP width
    n_hidden_layers: int = bounded(2, low=0)  # MLP hidden layers
    color_activation: str = choice("sigmoid", among=ACTIVATIONS)  # output activation


@register("neural-radiance")
class NeuralRadianceMaterial(BaseModule):
    """rgb = sigmoid(MLP([features, SH(ray direction)])): reconstruction's view-dependent color."""

    Config = NeuralRadianceConfig
    requires_normals = False

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        n_sh = num_bases(self.cfg.sh_degree, MAX_BASIS_DEGREE)
        self.mlp = MLP(self.cfg.n_input_dims + n_sh, 3, self.cfg.hidden_dim, self.cfg.n_hidden_layers)

    def forward(self, features: Tensor, view_dirs: Tensor, normals: Tensor | None = None, positions: Tensor | None = None,
                light_positions: Tensor | None = None, shading: str | None = None) -> Tensor:
        if features.shape[-1] < self.cfg.n_input_dims:
            raise ValueError(f"neural-radiance expects {self.cfg.n_input_dims} feature dims, got {features.shape[-1]}: "
                             "set the field's n_feature_dims to the material's n_input_dims")
        encoded = sh_bases(self.cfg.sh_degree, view_dirs).to(features.dtype)
        h = self.mlp(torch.cat([features[..., : self.cfg.n_input_dims], encoded], dim=-1))
        return activation(self.cfg.color_activation, h)

    def albedo(self, features: Tensor, view_dirs: Tensor | None = None) -> Tensor:
        """Color seen along ``view_dirs``; without them, the mean over the six axis directions (a diffuse estimate)."""
        if view_dirs is not None:
            return self.forward(features, view_dirs)
        axes = torch.cat([torch.eye(3), -torch.eye(3)]).to(features)
        colors = [self.forward(features, axis.expand(features.shape[0], 3)) for axis in axes]
        return torch.stack(colors).mean(0)
