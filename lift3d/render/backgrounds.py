"""Backgrounds: the color seen where rays leave the scene, as a function of the ray direction.

Called as ``background(dirs [B, ..., 3]) -> [B, ..., 3]``. The leading dimension is the batch of views:
random-color augmentation draws one color per view (per call for a flat ray batch passed as [1, N, 3]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.fields.encodings import frequency_encode, frequency_output_dim
from lift3d.fields.mlp import MLP
from lift3d.registry import register
from lift3d.sh import MAX_BASIS_DEGREE, num_bases, sh_bases


def random_color_augment(colors: Tensor, probability: float, group: int = 1) -> Tensor:
    """With ``probability`` per view (leading dim), replace the view's background by one random color;
    ``group`` consecutive views share the draw (the views of one object for multi-view guidance)."""
    if probability <= 0:
        return colors
    batch = colors.shape[0]
    group = group if group > 1 and batch % group == 0 else 1
    shape = (batch // group,) + (1,) * (colors.ndim - 2) + (3,)
    replace = torch.rand(shape[:1] + (1,) * (colors.ndim - 1), device=colors.device) < probability
    random = torch.rand(shape, device=colors.device, dtype=colors.dtype)
    replace, random = replace.repeat_interleave(group, dim=0), random.repeat_interleave(group, dim=0)
    return torch.where(replace, random.expand_as(colors), colors)


@dataclass
class SolidColorConfig:
    """One color everywhere."""

    color: list = bounded([1.0, 1.0, 1.0], low=0, high=1, lengths=(3,))  # RGB in 0..1
    learned: bool = False  # optimize the color
    random_probability: float = bounded(0.0, low=0, high=1)  # training: chance per view of a random color instead (augmentation)
    # consecutive views sharing one random draw (4 = data.n_views: one per object, as MVDream)
    random_group: int = bounded(1, low=1)


@register("solid-color")
class SolidColorBackground(BaseModule):
    """A fixed (or learned) color, optionally randomised per view while training."""

    Config = SolidColorConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        color = torch.tensor([float(v) for v in self.cfg.color])
        if self.cfg.learned:
            self.color = nn.Parameter(color)
        else:
            self.register_buffer("color", color, persistent=False)

    def forward(self, dirs: Tensor) -> Tensor:
        colors = self.color.to(dirs.dtype).expand(dirs.shape)
        if self.training:
            colors = random_color_augment(colors, self.cfg.random_probability, self.cfg.random_group)
        return colors


@dataclass
class NeuralEnvironmentConfig:
    """A small MLP from view direction to color (an environment map learned with the scene)."""

    encoding: str = choice("spherical_harmonics", "frequency")  # of the view direction
    sh_degree: int = bounded(2, low=0, high=4)  # highest spherical-harmonic degree when encoding is spherical_harmonics
    n_frequencies: int = bounded(4, low=1)  # frequencies when encoding is frequency
    hidden_dim: int = bounded(32, low=1)  # MLP width
    n_hidden_layers: int = bounded(2, low=0)  # MLP hidden layers
    # training: chance per view of a random solid color instead (augmentation)
    random_probability: float = bounded(0.5, low=0, high=1)
    # consecutive views sharing one random draw (4 = data.n_views: one per object, as MVDream)
    random_group: int = bounded(1, low=1)
    # outside training: this RGB instead of the network ([]: the network)
    eval_color: list = bounded([], low=0, high=1, lengths=(0, 3))


@register("neural-environment")
class NeuralEnvironmentBackground(BaseModule):
    """rgb = sigmoid(MLP(encode(direction))), with random-color augmentation while training."""

    Config = NeuralEnvironmentConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.encoding == "spherical_harmonics":
            input_dim = num_bases(c.sh_degree, MAX_BASIS_DEGREE)
        else:
            input_dim = frequency_output_dim(3, c.n_frequencies)
        self.mlp = MLP(input_dim, 3, c.hidden_dim, c.n_hidden_layers)

    def encode(self, dirs: Tensor) -> Tensor:
        dirs = torch.nn.functional.normalize(dirs, dim=-1)
        if self.cfg.encoding == "spherical_harmonics":
            return sh_bases(self.cfg.sh_degree, dirs)
        return frequency_encode(dirs, self.cfg.n_frequencies)

    def forward(self, dirs: Tensor) -> Tensor:
        if not self.training and self.cfg.eval_color:
            return torch.tensor(self.cfg.eval_color, device=dirs.device, dtype=dirs.dtype).expand(dirs.shape)
        flat = self.encode(dirs.reshape(-1, 3))
        colors = torch.sigmoid(self.mlp(flat)).reshape(dirs.shape)
        if self.training:
            colors = random_color_augment(colors, self.cfg.random_probability, self.cfg.random_group)
        return colors
