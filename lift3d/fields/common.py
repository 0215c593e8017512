"""What the NeRF fields (``ImplicitVolume``, ``TriplaneField``) share: their config checks and finite-difference
normals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.fields.mlp import ACTIVATIONS


def check_field_config(c: Any, normal_types: tuple[str, ...]) -> None:
    """Raise ValueError unless ``c.radius`` is positive, ``c.density_activation`` is known and ``c.normal_type`` is
    one of ``normal_types``."""
    if c.radius <= 0:
        raise ValueError(f"field radius must be positive, got {c.radius}")
    if c.density_activation not in ACTIVATIONS:
        raise ValueError(f"density_activation '{c.density_activation}' is not one of {', '.join(ACTIVATIONS)}")
    if c.normal_type not in normal_types:
        raise ValueError(f"normal_type must be {' or '.join(normal_types)}, got '{c.normal_type}'")


def central_difference_normal(raw_density: Callable[[Tensor], Tensor], points: Tensor, eps: float) -> Tensor:
    """Unit normals [N, 3] = -grad(raw density) at ``points`` [N, 3] by central differences of half step ``eps``."""
    offsets = torch.eye(3, device=points.device, dtype=points.dtype) * eps
    shifted = torch.cat([points[:, None] + offsets, points[:, None] - offsets], dim=1)  # [N, 6, 3]
    values = raw_density(shifted.reshape(-1, 3)).reshape(-1, 6)
    gradient = (values[:, :3] - values[:, 3:]) / (2 * eps)
    return F.normalize(-gradient, dim=-1)
