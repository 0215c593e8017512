"""Backgrounds: the color seen where rays leave the scene, as a function of the ray direction.

Called as ``background(dirs [B, ..., 3]) -> [B, ..., 3]``. The leading dimension is the batch of views:
random-color augmentation draws one color per view (per call for a flat ray batch passed as [1, N, 3]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import ConfigError
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

    color: list = field(default_factory=lambda: [1.0, 1.0, 1.0])  # RGB in 0..1
    learned: bool = False  # optimize the color
    random_probability: float = 0.0  # training: chance per view of a random color instead (augmentation)
    random_group: int = 1  # consecutive views sharing one random draw (4 = data.n_views: one per object, as MVDream)


@register("solid-color")
class SolidColorBackground(BaseModule):
    """A fixed (or learned) color, optionally randomised per view while training."""

    Config = SolidColorConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if len(self.cfg.color) != 3:
            raise ValueError(f"solid-color color must be 3 values (RGB), got {self.cfg.color}")
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

    encoding: str = "spherical_harmonics"  # spherical_harmonics or frequency
    sh_degree: int = 2  # highest spherical-harmonic degree (0..4) when encoding is spherical_harmonics
    n_frequencies: int = 4  # frequencies when encoding is frequency
    hidden_dim: int = 32  # MLP width
    n_hidden_layers: int = 2  # MLP hidden layers
    random_probability: float = 0.5  # training: chance per view of a random solid color instead (augmentation)
    random_group: int = 1  # consecutive views sharing one random draw (4 = data.n_views: one per object, as MVDream)
    eval_color: list = field(default_factory=list)  # outside training: this RGB instead of the network ([]: the network)


@register("neural-environment")
class NeuralEnvironmentBackground(BaseModule):
    """rgb = sigmoid(MLP(encode(direction))), with random-color augmentation while training."""

    Config = NeuralEnvironmentConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.encoding == "spherical_harmonics":
            if not 0 <= c.sh_degree <= MAX_BASIS_DEGREE:
                raise ConfigError(f"system.background.sh_degree must be 0..{MAX_BASIS_DEGREE} (the highest spherical-harmonic "
                                  f"degree: 2 encodes 9 values), got {c.sh_degree}: e.g. system.background.sh_degree=2")
            input_dim = num_bases(c.sh_degree, MAX_BASIS_DEGREE)
        elif c.encoding == "frequency":
            input_dim = frequency_output_dim(3, c.n_frequencies)
        else:
            raise ValueError(f"neural-environment encoding must be spherical_harmonics or frequency, got '{c.encoding}'")
        if c.eval_color and len(c.eval_color) != 3:
            raise ValueError(f"neural-environment eval_color must be [] or 3 values, got {c.eval_color}")
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
